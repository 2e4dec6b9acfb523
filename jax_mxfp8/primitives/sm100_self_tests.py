"""The first-use self-tests of the Blackwell kernel families (primitives/self_test.py), registered on import.

  "mx_gemm_sm100"             the MX GEMM (primitives/mx_gemm_sm100.py): plain 2-CTA f32, plain 1-CTA bf16 + bias,
                              row + bias and rowcol + bias epilogues (identity activation)
  "blocked_operands"          its operand producer (primitives/gemm_operands.py, layout "blocked"): "both" from
                              bfloat16, "row" and "col" from float32
  "rms_norm_quantize_blocked" RMSNorm + quantize with blocked scales (primitives/rms_norm_quantize.py)

Every problem is built to expose layout bugs: ragged shapes (M, N, K, R, C not multiples of 128, K tiles
partly past K, a pair's second CTA partly past M), two batches, and per-block power-of-two scales that differ
between neighbouring rows, row groups (r, r + 32), K blocks and batches, so that a permuted, shifted or
misplaced scale byte changes the output. Elements are small integers, so every block product and every
partial sum is exact in float32 whatever the tensor core's internal order and precision: the kernel's
outputs must equal the emulation's bit for bit. The GELU epilogues are not part of it (the kernel's tanh is
tanh.approx.f32, the emulation's XLA's: docs/numerics.md "Quantize epilogues").
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats import quantize as ref_quantize
from jax_mxfp8.formats import to_blocked_scales
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import self_test
from jax_mxfp8.primitives.gemm_operands import gemm_operands
from jax_mxfp8.primitives.gemm_operands import reference as operands_reference
from jax_mxfp8.primitives.mx_gemm_sm100 import FAMILY, mx_gemm_sm100
from jax_mxfp8.primitives.mx_gemm_sm100_emulation import emulate_mx_gemm_sm100
from jax_mxfp8.primitives.rms_norm_quantize import RMS_NORM_QUANTIZE_BLOCKED, RmsNormQuantizeCall
from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd

G, M, N, K = 2, 224, 160, 224
"""The GEMM problem: 7 K blocks in 2 K tiles (the second half past K), M one 256-row pair tile (its second
CTA holds rows 128..223 of 128), N one full and one partial 128-column tile."""
GEMM_RUNS = (  # (cta_group, epilogue, out_dtype, bias)
    (2, "plain", "float32", False),
    (1, "plain", "bfloat16", True),
    (2, "row", "bfloat16", True),
    (2, "rowcol", "bfloat16", True),
)


def _exponents(g: int, rows: int, blocks: int, salt: int) -> np.ndarray:
    """(g, rows, blocks) E8M0 bytes 127 + e, e in [-3, 3], differing between neighbouring rows, rows r and
    r + 32, r + 128, neighbouring blocks and batches."""
    gi, ri, bi = np.meshgrid(np.arange(g), np.arange(rows), np.arange(blocks), indexing="ij")
    return (127 + (ri * 37 + bi * 11 + gi * 17 + salt) % 7 - 3).astype(np.uint8)


def _small_ints(rng, shape) -> np.ndarray:
    return rng.integers(-2, 3, size=shape).astype(np.float32)


def _gemm_inputs() -> tuple:
    rng = np.random.default_rng(20260)
    a = jnp.asarray(_small_ints(rng, (G, M, K)), jnp.float8_e4m3fn)
    b = jnp.asarray(_small_ints(rng, (G, N, K)), jnp.float8_e4m3fn)
    sa = to_blocked_scales(jnp.asarray(_exponents(G, M, K // 32, 1)))
    sb = to_blocked_scales(jnp.asarray(_exponents(G, N, K // 32, 4)))
    bias = jnp.asarray(_small_ints(rng, (N,)))
    return a, b, sa, sb, bias


def _gemm_kernel(ops: tuple, path: str) -> tuple:
    a, b, sa, sb, bias = ops
    out = []
    for cta_group, epilogue, out_dtype, has_bias in GEMM_RUNS:
        out += mx_gemm_sm100(
            a, b, sa, sb, bias if has_bias else None, out_dtype=out_dtype, epilogue=epilogue, path=path,
            cta_group=cta_group,
        )  # fmt: skip
    return tuple(out)


def _gemm_expected(ops: tuple) -> tuple:
    a, b, sa, sb, bias = ops
    out = []
    for cta_group, epilogue, out_dtype, has_bias in GEMM_RUNS:
        cfg = registry.find(
            registry.MXGemmSm100Config, cta_group=cta_group, epilogue=epilogue, out_dtype=out_dtype,
            has_bias=has_bias, store_pre=epilogue != "plain",
        )  # fmt: skip
        res = emulate_mx_gemm_sm100(a, b, sa, sb, bias if has_bias else None, cfg)
        out += [res[name] for name in cfg.outputs]
    return tuple(out)


def _operand_inputs() -> tuple:
    """x (2, 96, 160): small integers times per-(row, 32-column block) powers of two, so both orientations'
    block scales vary from block to block."""
    rng = np.random.default_rng(20261)
    e = _exponents(2, 96, 160 // 32, 2).astype(np.int32) - 127
    x = _small_ints(rng, (2, 96, 160)) * np.exp2(np.repeat(e, 32, axis=-1)).astype(np.float32)
    return (jnp.asarray(x, jnp.bfloat16), jnp.asarray(x))


_OPERAND_RUNS = ((0, ("row", "col")), (1, ("row",)), (1, ("col",)))  # (input: 0 bf16 / 1 f32, orientations)


def _operand_kernel(ops: tuple, path: str) -> tuple:
    out = []
    for i, orientations in _OPERAND_RUNS:
        res = gemm_operands(ops[i], orientations=orientations, path=path, layout="blocked")
        out += [x for o in orientations for x in res[o]]
    return tuple(out)


def _operand_expected(ops: tuple) -> tuple:
    e4m3 = jnp.dtype(jnp.float8_e4m3fn)
    return tuple(
        x for i, orientations in _OPERAND_RUNS for o in orientations
        for x in operands_reference(ops[i], e4m3, "up", o, "blocked")
    )  # fmt: skip


def _rms_inputs() -> tuple:
    """x (2, 160, 96) bfloat16 small integers (exact sums of squares), weight powers of two."""
    rng = np.random.default_rng(20262)
    x = _small_ints(rng, (2, 160, 96))
    x[:, :, 0] = 3.0  # no all-zero row
    w = np.exp2((np.arange(96) % 5) - 2).astype(np.float32)
    return (jnp.asarray(x, jnp.bfloat16), jnp.asarray(w))


def _rms_kernel(ops: tuple, path: str) -> tuple:
    x, w = ops
    variant = registry.find(registry.RMSNormQuantizeBlockedConfig, in_dtype="bfloat16")
    return RMS_NORM_QUANTIZE_BLOCKED.call(RmsNormQuantizeCall(variant, 1e-6), path, x, w)


def _rms_expected_from(ops: tuple, got: tuple) -> tuple:
    """The kernel's contract: its y within one bfloat16 ulp of the reference's (rsqrt.approx vs XLA's rsqrt,
    the sums of squares are exact), and (data, scale) exactly quantize(its own y) with blocked scales."""
    y_ref, q_ref = rms_norm_quantize_fwd(*ops, np.float32(1e-6), dtype=jnp.float8_e4m3fn, scale_rounding="up")
    y_ref = np.asarray(y_ref, np.float32)
    y = np.asarray(jnp.asarray(got[0]).astype(jnp.float32))
    if not np.all(np.abs(y - y_ref) <= np.abs(y_ref) * 2.0**-7 + 2.0**-126):
        return (y_ref.astype(np.asarray(got[0]).dtype), q_ref.data, to_blocked_scales(q_ref.scale))
    q = ref_quantize(jnp.asarray(got[0]), axis=-1, scale_layout="blocked")
    return (got[0], q.data, q.scale)


self_test.register(
    self_test.SelfTestFamily(
        name=FAMILY,
        archs=registry.MXGemmSm100Config.archs,
        problem=(
            f"G, M, N, K = {G}, {M}, {N}, {K}: 2-CTA plain f32, 1-CTA plain bf16 + bias, 2-CTA row and rowcol "
            "epilogues + bias; integer elements, per-block power-of-two scales: bit-exact vs the emulation"
        ),
        inputs=_gemm_inputs,
        kernel=_gemm_kernel,
        expected=lambda ops, got: _gemm_expected(ops),
    )
)
self_test.register(
    self_test.SelfTestFamily(
        name=registry.BlockedOperandsConfig.op,
        archs=registry.BlockedOperandsConfig.archs,
        problem="x (2, 96, 160): bf16 'both', f32 'row' and 'col'; power-of-two block scales: bit-exact",
        inputs=_operand_inputs,
        kernel=_operand_kernel,
        expected=lambda ops, got: _operand_expected(ops),
    )
)
self_test.register(
    self_test.SelfTestFamily(
        name="rms_norm_quantize_blocked",
        archs=registry.RMSNormQuantizeBlockedConfig.archs,
        problem="x (2, 160, 96) bf16 integers: y within 1 ulp, (data, blocked scale) = quantize(y) bit-exact",
        inputs=_rms_inputs,
        kernel=_rms_kernel,
        expected=_rms_expected_from,
    )
)
