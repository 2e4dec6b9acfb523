"""XLA reference of the MX GEMM: forward and the two backward GEMMs with exact MX numerics.

Every GEMM is computed in a normalised 3-D layout (batch, rows, contracted): each operand is transposed
to (B, M, K), quantized in row blocks along K (the flattened contracted axes, in the order the
dimension numbers pair them), dequantized and multiplied with float32 accumulation.
This is the numerics of jax.nn.scaled_dot_general with configs=[mxfp8]*3.

Operand dtype (`operands=`): "bfloat16" (default) or "float32" (the test oracle).
An MX value v = element * 2^(b-127) has at most 4 significant bits (E4M3; E5M2: 3), so it is exactly
a bfloat16 (8 significant bits, float32's exponent range) unless |v| < 2^-126 and v is not a multiple
of 2^-133 (bfloat16's smallest subnormal). Every element of a block is exact when its scale byte
b >= 3 (E4M3: smallest element step 2^-9) or b >= 10 (E5M2: 2^-16); only blocks whose amax is below
about 2^-116 (E4M3) / 2^-102 (E5M2) can hold an inexact value, and a value under 2^-126 comes only
from a quantize input under 2^-126 (2^-126 lies on every such block's grid and rounding is monotone),
which the contract (docs/numerics.md) allows to be flushed. The bfloat16 cast rounds those values (error below
2^-134 at most); FTZ backends (XLA:CPU) flush them, as they flush the float32 path's subnormals too.
Overflow, NaN and Inf are identical: both types share float32's exponent range. Products of two
bfloat16 values are exact in float32 (unless below 2^-126, where either GEMM may flush), so both
paths sum the same products and differ only by the summation order the backend's GEMM picks
("bfloat16": cuBLAS / YNNPACK bf16 GEMMs at tensor-core speed; "float32": HIGHEST-precision float32
GEMMs, ~14x slower on an H200).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.formats import BLOCK_SIZE, MXArray, quantize, random_hadamard
from jax_mxfp8.formats.quantize import check_blockable, dequantize_products, quantize_dequantize

HIGHEST = lax.Precision.HIGHEST
OPERAND_DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
DEFAULT_OPERANDS = "bfloat16"

# Purposes of the three GEMMs; each gets an independent Hadamard sign pattern and rounding key.
FWD, DGRAD, WGRAD = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class OperandLayout:
    """How one dot_general operand maps to the normalised (B, M, K) layout."""

    batch: tuple[int, ...]
    free: tuple[int, ...]
    contract: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def perm(self) -> tuple[int, ...]:
        return self.batch + self.free + self.contract

    def dims(self, axes: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in axes)

    def to_3d(self, x: jax.Array) -> jax.Array:  # (B, M, K)
        b, m, k = (int(np.prod(self.dims(a), dtype=np.int64)) for a in (self.batch, self.free, self.contract))
        return jnp.transpose(x, self.perm).reshape(b, m, k)

    def from_3d(self, x3: jax.Array) -> jax.Array:
        x = x3.reshape(self.dims(self.batch) + self.dims(self.free) + self.dims(self.contract))
        return jnp.transpose(x, np.argsort(self.perm))


def operand_layouts(
    lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers
) -> tuple[OperandLayout, OperandLayout]:
    """Validates dot_general dimension numbers and returns both operands' layouts.

    Raises:
      ValueError: naming `dimension_numbers` on mismatched or repeated axes, or the operand whose
        flattened contracted axis is not a multiple of 32.
    """
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        lc, rc, lb, rb = (tuple(operator.index(a) for a in t) for t in (lc, rc, lb, rb))
    except (TypeError, ValueError) as e:
        raise ValueError(f"dimension_numbers={dimension_numbers!r} is not ((lc, rc), (lb, rb))") from e
    lhs_shape, rhs_shape = tuple(lhs_shape), tuple(rhs_shape)
    for name, t, s in (("lhs", lc + lb, lhs_shape), ("rhs", rc + rb, rhs_shape)):
        if any(not 0 <= a < len(s) for a in t):  # as lax.dot_general: no negative or wrapped axes
            raise ValueError(
                f"dimension_numbers={dimension_numbers!r}: {name} axes {t} must be in [0, {len(s)}) for {name} "
                f"of shape {s} (non-negative, as in lax.dot_general)"
            )
    if len(lc) != len(rc) or len(lb) != len(rb) or not lc:
        raise ValueError(f"dimension_numbers={dimension_numbers!r}: need one or more paired contracting axes")
    for name, c, b in (("lhs", lc, lb), ("rhs", rc, rb)):
        if len(set(c + b)) != len(c + b):
            raise ValueError(f"dimension_numbers={dimension_numbers!r} repeats an axis of {name}")
    for a, b in zip(lc, rc):
        if lhs_shape[a] != rhs_shape[b]:
            raise ValueError(f"contracting axes lhs {a} ({lhs_shape[a]}) and rhs {b} ({rhs_shape[b]}) differ in size")
    for a, b in zip(lb, rb):
        if lhs_shape[a] != rhs_shape[b]:
            raise ValueError(f"batch axes lhs {a} ({lhs_shape[a]}) and rhs {b} ({rhs_shape[b]}) differ in size")
    lhs = OperandLayout(lb, tuple(a for a in range(len(lhs_shape)) if a not in lc + lb), lc, lhs_shape)
    rhs = OperandLayout(rb, tuple(a for a in range(len(rhs_shape)) if a not in rc + rb), rc, rhs_shape)
    k = int(np.prod(lhs.dims(lc)))
    check_blockable((k,), (0,), name=f"the contracted axes {lc} of lhs (flattened)")
    return lhs, rhs


def _hadamard_key(config: MXDotConfig, purpose: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(config.hadamard_seed), purpose)


def operand_dtype(operands: str):
    """The jnp dtype of the GEMM operands for `operands` ("bfloat16" or "float32"); ValueError otherwise."""
    if operands not in OPERAND_DTYPES:
        raise ValueError(f"operands={operands!r} is not one of {tuple(OPERAND_DTYPES)}")
    return OPERAND_DTYPES[operands]


def quantized_3d(
    x3: jax.Array,
    config: MXDotConfig,
    purpose: int,
    *,
    grad: bool = False,
    rng: jax.Array | None = None,
    operands: str = DEFAULT_OPERANDS,
) -> jax.Array:
    """Fake-quantizes a (B, M, K) operand (any float dtype) along K for one GEMM: optional Hadamard, MX
    round trip.

    Returns the MX operand the GEMM multiplies as `operands` dtype values, (B, M, K') with K' rounded up
    to a multiple of 32 (and of the Hadamard block) by zero padding: exact in float32; exact in bfloat16
    except values below 2^-126 (module docstring).
    """
    x3 = x3.astype(jnp.float32)
    multiple = BLOCK_SIZE if config.hadamard_seed is None else max(BLOCK_SIZE, config.hadamard_block)
    if x3.shape[-1] % multiple:
        # Only the backward GEMMs contract over M or N, which need not be multiples of 32 (a batch of 8
        # tokens, say). Zero padding makes the last block partial: its scale comes from its valid
        # elements only, and the padded products are exact zeros.
        x3 = jnp.pad(x3, [(0, 0)] * (x3.ndim - 1) + [(0, -x3.shape[-1] % multiple)])  # any rank (gemm_dims)
    if config.hadamard_seed is not None:
        x3 = random_hadamard(x3, _hadamard_key(config, purpose), axis=-1, block_size=config.hadamard_block)
    stochastic = grad and config.grad_rounding == "stochastic"
    dtype = config.grad_dtype if grad else config.dtype
    if not stochastic:  # the same bits as the round trip below, in a quarter of its elementwise ops
        return quantize_dequantize(
            x3, axis=-1, dtype=dtype, scale_rounding=config.scale_rounding, out_dtype=operand_dtype(operands)
        )
    q = quantize(
        x3,
        axis=-1,
        dtype=dtype,
        scale_rounding=config.scale_rounding,
        rounding="stochastic",
        rng=jax.random.fold_in(rng, purpose),
    )
    return dequantize_products(q, operand_dtype(operands))


def quantized_in_place(
    x: jax.Array, layout: OperandLayout, config: MXDotConfig, *, operands: str = DEFAULT_OPERANDS
) -> jax.Array | None:
    """The forward's MX operand quantized in x's own layout, along its single contracting axis: the values
    of quantized_3d(layout.to_3d(x), config, FWD), still in x's layout (move the axes afterwards).

    Why: a weight w (K, N) contracted on axis 0 becomes (N, K) in the normalised layout; quantizing that
    transpose made XLA fuse it into the block reduction and read w with strided loads (the H200 measured
    436 GB/s for w against 1.8 TB/s for the (M, K) operand). Blocks along axis 0 of w in place are the same
    blocks (a column reduction that reads rows whole), and the transpose left for the GEMM is a layout XLA
    folds into the dot. None where it does not apply: several contracting axes (their merge into K is a
    reshape of the transposed array) or a Hadamard transform (applied along the last axis of the 3-D
    operand; quantized_3d handles it).
    """
    if config.hadamard_seed is not None or len(layout.contract) != 1:
        return None
    (axis,) = layout.contract
    if x.shape[axis] % BLOCK_SIZE:  # the forward's K is a multiple of 32 (operand_layouts checks it)
        return None
    return quantize_dequantize(
        x, axis=axis, dtype=config.dtype, scale_rounding=config.scale_rounding, out_dtype=operand_dtype(operands)
    )


def matmul_3d(a3: jax.Array, b3: jax.Array) -> jax.Array:
    """(B, M, K) x (B, N, K) -> (B, M, N) float32, float32 accumulation; operands both bfloat16 or float32.

    float32 operands run at HIGHEST precision (no reduced-precision passes); bfloat16 products are exact.
    """
    if a3.dtype != b3.dtype:
        raise ValueError(f"matmul_3d takes operands of one dtype, got {a3.dtype} and {b3.dtype}")
    precision = HIGHEST if a3.dtype == jnp.float32 else None
    return jnp.einsum("bmk,bnk->bmn", a3, b3, precision=precision, preferred_element_type=jnp.float32)


def prequantized_3d(a: MXArray, layout: OperandLayout, *, operands: str = DEFAULT_OPERANDS) -> jax.Array:
    """A caller's pre-quantized operand as `operands` dtype values (see quantized_3d) in the (B, M, K) layout."""
    return layout.to_3d(dequantize_products(a, operand_dtype(operands)))


def mx_dot_forward(
    lhs3: jax.Array,
    rhs3: jax.Array,
    config: MXDotConfig,
    *,
    lhs_q3: jax.Array | None,
    rhs_q3: jax.Array | None,
    operands: str = DEFAULT_OPERANDS,
) -> jax.Array:
    """C3 = Q(lhs3 along K) @ Q(rhs3 along K)^T in float32, (B, M, N), from lhs3 (B, M, K), rhs3 (B, N, K).

    *_q3 (from prequantized_3d, same `operands`) replace quantization; `operands`: see the module docstring.
    """
    dt = operand_dtype(operands)
    a = lhs_q3 if lhs_q3 is not None else quantized_3d(lhs3, config, FWD, operands=operands)
    b = rhs_q3 if rhs_q3 is not None else quantized_3d(rhs3, config, FWD, operands=operands)
    return matmul_3d(a.astype(dt), b.astype(dt))


def mx_dot_backward(
    lhs3: jax.Array,
    rhs3: jax.Array,
    g3: jax.Array,
    config: MXDotConfig,
    rng: jax.Array | None,
    *,
    operands: str = DEFAULT_OPERANDS,
) -> tuple[jax.Array, jax.Array]:
    """Gradients (dA3 (B, M, K), dB3 (B, N, K)) in float32 for C3 = A3 @ B3^T with incoming G3 (B, M, N).

    dA = Q(G along N) @ Q(B along N); dB = Q(G along M)^T @ Q(A along M) (MX, `operands` dtype), or
    plain BF16 operands with FP32 accumulation for dB when config.weight_grad == "bf16" (under either
    `operands`). M and N need not be multiples of 32: a partial last block takes its scale from its
    valid elements only.
    """
    gt = jnp.swapaxes(g3, 1, 2)  # (B, N, M)
    d_lhs = matmul_3d(
        quantized_3d(g3, config, DGRAD, grad=True, rng=rng, operands=operands),
        quantized_3d(jnp.swapaxes(rhs3, 1, 2), config, DGRAD, operands=operands),
    )
    if config.weight_grad == "bf16":
        d_rhs = matmul_3d(gt.astype(jnp.bfloat16), jnp.swapaxes(lhs3, 1, 2).astype(jnp.bfloat16))
    else:
        d_rhs = matmul_3d(
            quantized_3d(gt, config, WGRAD, grad=True, rng=rng, operands=operands),
            quantized_3d(jnp.swapaxes(lhs3, 1, 2), config, WGRAD, operands=operands),
        )
    return d_lhs, d_rhs
