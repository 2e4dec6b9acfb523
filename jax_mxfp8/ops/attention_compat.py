"""jax.nn.dot_product_attention parity pieces of `jax_mxfp8.dot_product_attention`: `local_window_size`
and `return_residual`.

local_window_size=(left, right) (an int w means (w, w)): query t attends key s when t - left <= s <= t +
right, combined with every other mask (causal, lengths, `mask`), as jax.nn does. It becomes a boolean
(1, 1, T, S) mask, so it runs on the XLA reference (the Hopper kernel takes no mask); masked tiles are
computed and then masked, not skipped.

return_residual: True gives jax.nn's residual: the log-sum-exp of the scaled, masked logits (natural
log), shaped like the output without its last axis ((B, T, N), or (T, N) unbatched), in the output's dtype,
with its gradient stopped (jax.nn applies lax.stop_gradient). "lse" gives this library's own LSE: float32
(B, N, T) (or (N, T)) that carries a gradient (the custom VJP takes its cotangent; ring attention combines
partial results with it).

Fully masked query rows (no valid key): the output is 0 here and the LSE -inf; jax.nn's XLA path gives the
mean of V (its softmax over equal large-negative logits is uniform) and a finite large-negative LSE
(-0.7 * float32 max + log S), and cuDNN gives 0. Rows past query_seq_lengths are 0 in both.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

RESIDUALS = (False, True, "lse")
KERNEL_NO_WINDOW = "the kernel has no sliding-window masking (local_window_size runs in the XLA reference)"


def check_window(local_window_size) -> tuple[int, int] | None:
    """(left, right) from an int or a pair of non-negative ints; ValueError naming the argument."""
    if local_window_size is None:
        return None
    pair = (local_window_size, local_window_size) if isinstance(local_window_size, int) else local_window_size
    try:
        left, right = pair
    except (TypeError, ValueError):
        raise ValueError(f"local_window_size={local_window_size!r}: pass an int or (left, right) ints") from None
    for v in (left, right):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise ValueError(f"local_window_size={local_window_size!r}: window sizes are non-negative ints")
    return int(left), int(right)


def with_window(mask: jax.Array | None, window: tuple[int, int], t: int, s: int) -> jax.Array:
    """`mask` (None or bool broadcastable to (B, N, T, S)) AND the (1, 1, T, S) window mask."""
    left, right = window
    rows = jnp.arange(t, dtype=jnp.int32)[:, None]
    cols = jnp.arange(s, dtype=jnp.int32)[None, :]
    win = ((cols >= rows - left) & (cols <= rows + right))[None, None]
    return win if mask is None else jnp.logical_and(mask, win)


def check_return_residual(return_residual) -> None:
    if not any(return_residual is r or (isinstance(r, str) and return_residual == r) for r in RESIDUALS):
        raise ValueError(f"return_residual={return_residual!r} is not one of {RESIDUALS}")


def jax_nn_residual(lse: jax.Array, dtype) -> jax.Array:
    """jax.nn's residual from our LSE (..., N, T) float32: (..., T, N) in `dtype`, gradient stopped."""
    return jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(dtype))
