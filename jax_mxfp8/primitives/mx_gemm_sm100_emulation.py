"""The Blackwell MX GEMM's arithmetic in XLA (kernels/sm100/mx_gemm.py), for the "emulated" implementation.

  emulate_mx_gemm_sm100(a, b, sa, sb, bias, config) -> {name: output}    every output of the variant
  block_scaled_accumulate(a, b, sa, sb) -> acc (G, M, N) float32        the mainloop
  epilogue_outputs(y, config) -> {name: output}                         the epilogue, from y = acc (+ bias)
  quantize_blocks_kernel_rule(z) -> (q, s)                              the epilogue's quantize formula

Operands (the kernel's): a (G, M, K), b (G, N, K) float8_e4m3fn, K-major, K a multiple of 32; sa, sb their
E8M0 scales in the 128x4 blocked layout (formats/blocked_scales.py): sa (G, ceil(M/128), ceil(K/128), 512),
sb (G, ceil(N/128), ceil(K/128), 512); bias (N,) float32 or None.

Mainloop model: one tcgen05.mma ... block_scale per 32-block of K adds
  v = fp32( 2^(sa[m, kb] - 127) * 2^(sb[n, kb] - 127) * sum_{k in kb} a[m, k] b[n, k] )
to the float32 accumulator, blocks in ascending order. The block's dot product is exact here (its terms are
multiples of 2^-18 below 2^23 in magnitude: computed as exact integer limbs, then rounded to float32 once),
then scaled by a power of two (exact while v is a normal float32; v below 2^-126 may flush to zero, as on
FTZ hardware). A NaN element or a 0xFF scale makes v NaN. What the tensor core does inside one instruction
(its internal precision and the order of the 32 products) is not documented; on operands whose block
products and partial sums are exact in float32 (small integers, the first-use self-test's inputs) every
order and precision gives these bits.

Epilogue model (the kernel's formula, written independently of formats.quantize; tests compare the two bit
for bit): y = acc (+ bias); z = y or jax.nn.gelu(y, approximate=True) (the kernel's tanh is tanh.approx.f32,
so with GELU elements may differ by one FP8 step where the ~2^-11 tanh difference crosses a rounding
boundary); per block of 32 along the blocked axis, amax = the unsigned max of the |x| float32 bit patterns
(the kernel: a thread's own 32 values for row blocks, and for column blocks the same after its warp
transposes the 32 x 32 block through shared memory; the comparison schedule column_amax "redux" takes
REDUX.MAX.U32 over the warp's 32 lanes: the same maximum). NaN patterns (0x7F800001..) order above
+Inf above every finite value, so a block holding NaN or Inf gets scale 0xFF and NaN elements, as
docs/numerics.md requires; the float reduction redux.sync.max.abs.f32 (CREDUX) without .NaN ignores NaN
and would give a NaN block a finite scale.
Scale byte: scale_rounding "up" from the bits (E - 8 + (mantissa > 0x600000) for E4M3, 0/1 below the
normal range); element = RNE_satfinite(z * 2^(127 - b)).

Outputs (variant.outputs): c (G, M, N) out_dtype; q (G, M, N) E4M3 and s (G, ceil(M/128), ceil(N/128), 512)
blocked (blocks along N); qc (G, N, M) E4M3 (z transposed, blocks along M) and sc (G, ceil(N/128),
ceil(M/128), 512) blocked. No Blackwell GPU has run the kernel this models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.formats.blocked_scales import from_blocked_scales, to_blocked_scales
from jax_mxfp8.formats.elements import E4M3
from jax_mxfp8.formats.scales import pow2
from jax_mxfp8.kernels.registry.gemm_sm100 import BLOCK, MXGemmSm100Config

_ELEM_SCALE = 2**9  # E4M3 elements are multiples of 2^-9 below 2^9: times 2^9 they are integers below 2^18
_LIMB = 2**9


def _integer_limbs(x: jax.Array) -> jax.Array:
    """E4M3 x (..., K) -> (..., 2, K) float32 integers (hi, lo) with x * 2^9 = hi * 2^9 + lo, |hi|, |lo| < 2^9
    (NaN elements as 0: the caller marks their blocks)."""
    xi = jnp.where(jnp.isnan(x.astype(jnp.float32)), 0.0, x.astype(jnp.float32) * _ELEM_SCALE).astype(jnp.int32)
    hi = lax.div(xi, jnp.int32(_LIMB))  # truncates toward zero: lo keeps x's sign
    return jnp.stack([hi, xi - hi * _LIMB], axis=-2).astype(jnp.float32)


def _exact_block_dot(al: jax.Array, bl: jax.Array) -> jax.Array:
    """float32 of the exact sum_k a[m, k] b[n, k] over one 32-block, rounded once.

    al (G, M, 2, 32), bl (G, N, 2, 32): limbs of _integer_limbs. Every limb product sum below is an integer
    < 2^24 (exact in float32 whatever the summation order): hh, hl, lh, ll. With S = a.b * 2^18 =
    hh 2^18 + (hl + lh) 2^9 + ll, S is split in int32 into mid * 2^18 + low, 0 <= low < 2^18, and
    a.b = mid + low * 2^-18: one IEEE add of two exact float32 values, i.e. a.b rounded once."""
    p = jnp.einsum("gmpk,gnqk->gpqmn", al, bl, precision=lax.Precision.HIGHEST).astype(jnp.int32)
    hh, cross, ll = p[:, 0, 0], p[:, 0, 1] + p[:, 1, 0], p[:, 1, 1]
    low = ll + ((cross & (_LIMB - 1)) << 9)
    mid = hh + (cross >> 9) + (low >> 18)
    return mid.astype(jnp.float32) + (low & ((1 << 18) - 1)).astype(jnp.float32) * jnp.float32(2.0**-18)


def _mul_pow2_wide(x: jax.Array, e: jax.Array) -> jax.Array:
    """x * 2^e for integer e in [-254, 254]: three normal power-of-two factors of e's sign, so the running
    product moves monotonically toward the result (exact whenever the result is a normal float32)."""
    e1 = jnp.clip(e, -126, 126)
    e2 = jnp.clip(e - e1, -126, 126)
    return x * pow2(e1) * pow2(e2) * pow2(e - e1 - e2)


def block_scaled_accumulate(a: jax.Array, b: jax.Array, sa: jax.Array, sb: jax.Array) -> jax.Array:
    """acc (G, M, N) float32 of the mainloop model (module docstring); sa, sb blocked."""
    g, m, k = a.shape
    n = b.shape[1]
    kb = k // BLOCK
    sa_mk = from_blocked_scales(sa, m, kb).astype(jnp.int32)  # (G, M, KB)
    sb_nk = from_blocked_scales(sb, n, kb).astype(jnp.int32)
    nan_a = jnp.isnan(a.astype(jnp.float32)).reshape(g, m, kb, BLOCK).any(-1) | (sa_mk == 0xFF)
    nan_b = jnp.isnan(b.astype(jnp.float32)).reshape(g, n, kb, BLOCK).any(-1) | (sb_nk == 0xFF)
    al = jnp.moveaxis(_integer_limbs(a.reshape(g, m, kb, BLOCK)), 2, 0)  # (KB, G, M, 2, 32)
    bl = jnp.moveaxis(_integer_limbs(b.reshape(g, n, kb, BLOCK)), 2, 0)
    xs = (al, bl, *(jnp.moveaxis(t, 2, 0) for t in (sa_mk, sb_nk, nan_a, nan_b)))

    def step(acc, blk):
        alk, blk_b, ea, eb, na, nb = blk
        dot = _exact_block_dot(alk, blk_b)
        v = _mul_pow2_wide(dot, (ea - 127)[:, :, None] + (eb - 127)[:, None, :])
        v = jnp.where(na[:, :, None] | nb[:, None, :], jnp.float32(jnp.nan), v)
        return acc + v, None

    acc, _ = lax.scan(step, jnp.zeros((g, m, n), jnp.float32), xs)
    return acc


def quantize_blocks_kernel_rule(z: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(q E4M3, s uint8) of float32 z (..., R, C) in blocks of 32 along the last axis, by the kernel's
    formula (module docstring): s (..., R, C / 32)."""
    *lead, r, c = z.shape
    zb = z.astype(jnp.float32).reshape(*lead, r, c // BLOCK, BLOCK)
    mag = lax.bitcast_convert_type(zb, jnp.uint32) & jnp.uint32(0x7FFFFFFF)
    amax = jnp.max(mag, axis=-1, keepdims=True)  # unsigned: NaN > Inf > finite
    expo = (amax >> 23).astype(jnp.int32)
    normal_b = expo - E4M3.emax + (amax & jnp.uint32(0x7FFFFF) > 0x600000).astype(jnp.int32)
    up_bits = int(np.float32(E4M3.up_threshold).view(np.uint32))
    smallest_normal = int(np.float32(E4M3.max * 2.0**-126).view(np.uint32))
    b = jnp.where(amax >= smallest_normal, normal_b, (amax >= up_bits).astype(jnp.int32))
    nan_block = amax >= 0x7F800000
    b = jnp.where(nan_block, 0xFF, b)
    factor = lax.bitcast_convert_type(((254 - jnp.minimum(b, 254)) << 23).astype(jnp.uint32), jnp.float32)
    y = jnp.clip(zb * factor, -E4M3.max, E4M3.max)
    q = jnp.where(nan_block, jnp.float32(jnp.nan), y).astype(E4M3.dtype).reshape(z.shape)
    return q, b[..., 0].astype(jnp.uint8)


def epilogue_outputs(y: jax.Array, config: MXGemmSm100Config) -> dict[str, jax.Array]:
    """The variant's outputs (module docstring) from y = acc (+ bias), float32 (G, M, N)."""
    out = {}
    if config.writes_c:
        out["c"] = y.astype(config.out_dtype)
    z = jax.nn.gelu(y, approximate=True) if config.activation == "gelu" else y
    if config.epilogue in ("row", "rowcol"):
        out["q"], s = quantize_blocks_kernel_rule(z)
        out["s"] = to_blocked_scales(s)
    if config.epilogue in ("col", "rowcol"):
        out["qc"], sc = quantize_blocks_kernel_rule(jnp.swapaxes(z, -1, -2))
        out["sc"] = to_blocked_scales(sc)
    return out


def emulate_mx_gemm_sm100(
    a: jax.Array,
    b: jax.Array,
    sa: jax.Array,
    sb: jax.Array,
    bias: jax.Array | None,
    config: MXGemmSm100Config,
) -> dict[str, jax.Array]:
    """Every output of the variant `config` (module docstring) for the kernel's operands.

    Raises ValueError naming the argument when shapes or dtypes do not fit the variant."""
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"a (G, M, K) and b (G, N, K) must agree on G and K, got {a.shape} and {b.shape}")
    for name, x, want in (("a", a, config.a_dtype), ("b", b, config.b_dtype)):
        if x.dtype != jnp.dtype(want):
            raise ValueError(f"{name} has dtype {x.dtype}; the variant takes {want}")
    g, m, k = a.shape
    n = b.shape[1]
    why = config.unsupported(g, m, n, k)
    if why:
        raise ValueError(why)
    for name, x, rows in (("sa", sa, m), ("sb", sb, n)):
        want = (g, -(-rows // 128), -(-k // 128), 512)
        if tuple(x.shape) != want or x.dtype != jnp.uint8:
            raise ValueError(f"{name} must be uint8 {want} (blocked scales), got {x.dtype} {tuple(x.shape)}")
    if (bias is not None) != config.has_bias:
        given = "given" if bias is not None else "missing"
        raise ValueError(f"bias {given}; the variant has has_bias={config.has_bias}")
    acc = block_scaled_accumulate(a, b, sa, sb)
    y = acc if bias is None else acc + bias.astype(jnp.float32)
    return epilogue_outputs(y, config)
