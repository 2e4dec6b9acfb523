"""Layout constants and element-level helpers of the Hopper attention kernels' operands (layer 5).

Shared by the producer pass (attention_operands.py), the realign call (attention_realign.py), the kernel
calls and their emulations (attention_fwd.py, attention_emulation.py, attention_packed.py), and the backward
kernel's pre-pass (attention_bwd.py): tile sizes, the exponent clamp, the E4M3 re-encoding of MX elements at
a coarser exponent and the P V key permutation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.scales import pow2
from jax_mxfp8.kernels import registry

TILE_M = 128  # query rows per CTA
TILE_N = 128  # keys per KV tile (AttentionConfig.kv_tile must equal it)
LOG2E = float(np.log2(np.e))
E_MIN, E_MAX = -126, 126
V_SPREAD = 64
"""V tile exponents are raised to at least (the largest of the sequence's column group) - V_SPREAD, so that
acc_O, kept in the current tile's units, stays far from float32 overflow (|acc| <= 2^off * S * 448 *
2^spread, off = 8 for p_scale "const", <= registry.P_OFFSET_MAX = 24 for "block"); elements of such raised
tiles lose only what lies 2^-70 below the sequence's largest V."""


def pv_permutation() -> np.ndarray:
    """Key (within a 32-key chunk) in 8-bit A-fragment k-slot a (registry.pv_permutation)."""
    return np.asarray(registry.pv_permutation())


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def realign_elements(data: jax.Array, shift: jax.Array) -> jax.Array:
    """RNE_E4M3(data * 2^shift), shift <= 0 per element (broadcast); shifts below -126 give 0."""
    x = decode_elements(data)
    f = jnp.where(shift >= E_MIN, pow2(jnp.maximum(shift, E_MIN)), 0.0)
    return (x * f).astype(jnp.float8_e4m3fn)


def permute_keys_transposed(v: jax.Array) -> jax.Array:
    """(..., Sp, H) -> (..., H, Sp) with the keys of every 32 in pv_permutation order."""
    *lead, s, h = v.shape
    v = v.reshape(*lead, s // 32, 2, 2, 4, 2, h)
    # key 16h + 8ib + 2q + i0 goes to slot 16h + 4q + 2ib + i0
    nd = len(lead)
    perm = (*range(nd), nd + 5, nd, nd + 1, nd + 3, nd + 2, nd + 4)
    return v.transpose(perm).reshape(*lead, h, s)
