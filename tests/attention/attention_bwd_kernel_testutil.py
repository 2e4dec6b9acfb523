"""Helpers of the Hopper attention backward kernel's GPU tests: cases built the way the pre-pass builds its
operands, the float64 and XLA references, and the kernel's `_into` call (NaN-poisoned outputs aliased).

`make_case` draws inputs (float64, head-major: q, do (B, K, G, T, H); k, v (B, K, S, H)) with lengths;
`mx_operands` gives the contract's MX values (32x32 square blocks) as float32; `forward_f32` the forward's
O and LSE on them (the kernel forward's role); `exact_bwd` float64 gradients of the unquantized inputs;
`reference_bwd` the XLA reference backward on the MX operands; `kernel_bwd` the kernel's gradients (and its
raw padded outputs, which `check_written` inspects), from `kernel_variant`, `kernel_inputs` (the call's
operands by name) and `call_kernel`. Gates: MIN_DB against the reference, F64_SLACK_DB
between the kernel's and the reference's SQNR against float64, SAME_MATH_DQ_DB between schedules of the same
GEMM precision.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_mxfp8.config.attention import AttentionConfig
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.ops.attention_core import square_sequence_major
from jax_mxfp8.primitives import library
from jax_mxfp8.primitives.attention_operands import aligned_rows, do_float16, do_shift
from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_quant import fake_quant_square
from jax_mxfp8.reference.attention_tiling import Masking

MIN_DB = 35.0
F64_SLACK_DB = 0.5
SAME_MATH_DQ_DB = 110.0  # float32 sums of <= 8 identical partials in another order: ~140 dB


def _round_up(x: int, m: int = 128) -> int:
    return (x + m - 1) // m * m


def _pad(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


def make_case(rng, b, t, s, n, n_kv, h, causal, lengths=False, logit_scale=1.0):
    """Inputs (float64, head-major: q, do (B, K, G, T, H); k, v (B, K, S, H)), lengths, and the forward's
    O and LSE computed in float32 on the MX operands (the kernel forward's role)."""
    g = n // n_kv
    q = rng.standard_normal((b, n_kv, g, t, h)) * logit_scale
    k = rng.standard_normal((b, n_kv, s, h)) * logit_scale
    v = rng.standard_normal((b, n_kv, s, h))
    do = rng.standard_normal((b, n_kv, g, t, h))
    if lengths:
        q_len = rng.integers(t // 2, t + 1, size=b).astype(np.int32)
        kv_len = rng.integers(s // 2, s + 1, size=b).astype(np.int32)
        q_len[0], kv_len[-1] = t, s
    else:
        q_len = np.full(b, t, np.int32)
        kv_len = np.full(b, s, np.int32)
    rows = np.arange(t)[None, :] < q_len[:, None]  # (B, T)
    keys = np.arange(s)[None, :] < kv_len[:, None]  # (B, S)
    q = q * rows[:, None, None, :, None]
    k = k * keys[:, None, :, None]
    v = v * keys[:, None, :, None]
    do = do * rows[:, None, None, :, None]
    return dict(q=q, k=k, v=v, do=do, q_len=q_len, kv_len=kv_len, causal=causal, tau=1.0 / math.sqrt(h))


def _valid(case) -> np.ndarray:
    """(B, 1, 1, T, S) True where query t may see key s."""
    t, s = case["q"].shape[3], case["k"].shape[2]
    rows = np.arange(t)[None, :, None] < case["q_len"][:, None, None]
    cols = np.arange(s)[None, None, :] < case["kv_len"][:, None, None]
    ok = rows & cols
    if case["causal"]:
        ok = ok & (np.arange(s)[None, None, :] <= np.arange(t)[None, :, None])
    return ok[:, None, None]


def mx_operands(case):
    """The contract's MX values (32x32 square blocks over (sequence, H)) as float32 jax arrays."""
    return {name: fake_quant_square(jnp.asarray(case[name], jnp.float32)) for name in ("q", "k", "v")}


def forward_f32(case, ops):
    """O and LSE of the MX operands in float32 (natural-log LSE, -inf where a row sees no key)."""
    valid = jnp.asarray(_valid(case))
    s = jnp.einsum("bkgth,bksh->bkgts", ops["q"], ops["k"]) * jnp.float32(case["tau"])
    s = jnp.where(valid, s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.where(valid, jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    o = jnp.einsum("bkgts,bksh->bkgth", p, ops["v"])
    return o, lse


def exact_bwd(case):
    """float64 attention backward on the unquantized inputs: dq (B, K, G, T, H), dk, dv (B, K, S, H)."""
    q, k, v, do, tau = case["q"], case["k"], case["v"], case["do"], case["tau"]
    valid = _valid(case)
    s = np.einsum("bkgth,bksh->bkgts", q, k) * tau
    s = np.where(valid, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(valid, np.exp(s - m), 0.0)
    den = np.sum(e, axis=-1, keepdims=True)
    p = e / np.where(den > 0, den, 1.0)
    o = np.einsum("bkgts,bksh->bkgth", p, v)
    dv = np.einsum("bkgts,bkgth->bksh", p, do)
    dp = np.einsum("bkgth,bksh->bkgts", do, v)
    delta = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - delta)
    dq = np.einsum("bkgts,bksh->bkgth", ds, k) * tau
    dk = np.einsum("bkgts,bkgth->bksh", ds, q) * tau
    return dq, dk, dv


def reference_bwd(case, ops, o, lse, config=None):
    masking = Masking(
        is_causal=case["causal"],
        s_real=case["k"].shape[2],
        q_len=jnp.asarray(case["q_len"]),
        kv_len=jnp.asarray(case["kv_len"]),
        mask=None,
        bias=None,
    )
    do = jnp.asarray(case["do"], jnp.float32)
    fn = jax.jit(
        lambda q, k, v, o, lse, do: attention_bwd(
            q, k, v, q, k, o, lse, do, None, masking, scale=case["tau"], config=config or AttentionConfig()
        )[:3]
    )
    return tuple(np.asarray(x, np.float64) for x in fn(ops["q"], ops["k"], ops["v"], o, lse, do))


def kernel_variant(case, *, tune=0, mode=None):
    """The registry variant of the case's head_dim and causality at `tune` with the dQ mode's fields `mode`;
    skips the test when there is none or the library lacks it."""
    h, causal = case["q"].shape[-1], case["causal"]
    mode = mode or {}
    variant = registry.find(registry.AttentionBwdConfig, head_dim=h, causal=causal, tune=tune, **mode)
    if variant is None:
        pytest.skip(f"no attention_bwd variant for head_dim={h} causal={causal} tune={tune} {mode}")
    if not library.has_kernel(variant.name):
        pytest.skip(f"{variant.name} is not in the library (comparison schedules: build_library.py --with-tunes)")
    return variant


def kernel_inputs(case, ops, o, lse, variant, *, poison=True) -> tuple[dict, dict, jax.Array | None]:
    """The `_into` call's operands for `variant`, by name in call order (head-major, padded: qh, doh (B, N, Tp,
    H), kh, vh (B, K, Sp, H), lse, delta (B, N, Tp), lens (2, B); sdp_fp8: v8 in vh's place, then q8, k8, do8
    and their row factors qs, ks, vs, dos (B, heads, Lp / 32)), the aliased outputs by name (dq (B, N, Tp, H),
    dk, dv (B, K, Sp, H), dq_sem (B, N, Tp / 32); NaN-poisoned unless poison=False) and dv_f16's dO shift
    (B, K) (None without dv_f16)."""
    b, n_kv, g, t, h = case["q"].shape
    s = case["k"].shape[2]
    tp, sp = _round_up(t), _round_up(s)
    n = n_kv * g
    do = jnp.asarray(case["do"], jnp.float32)
    do_q = fake_quant_square(do)
    delta = jnp.sum(do * o, axis=-1)  # from the unquantized dO (rows >= q_len are 0)

    def head_major(x, groups, length):  # (B, K, G, L, H) or (B, K, L, H) -> (B, heads, Lp, H)
        x = np.asarray(x, np.float32).reshape(b, groups, x.shape[-2], h)
        return jnp.asarray(_pad(x, 2, length), jnp.bfloat16)

    lse_p = np.full((b, n, tp), -np.inf, np.float32)
    lse_p[:, :, :t] = np.asarray(lse, np.float32).reshape(b, n, t)
    delta_p = np.zeros((b, n, tp), np.float32)
    delta_p[:, :, :t] = np.asarray(delta, np.float32).reshape(b, n, t)
    args = dict(
        qh=head_major(ops["q"], n, tp),
        kh=head_major(ops["k"], n_kv, sp),
        vh=head_major(ops["v"], n_kv, sp),
        doh=head_major(do_q, n, tp),
        lse=jnp.asarray(lse_p),
        delta=jnp.asarray(delta_p),
        lens=jnp.asarray(np.stack([case["q_len"], case["kv_len"]]).astype(np.int32)),
    )
    fill = np.nan if poison else 0.0
    outs = dict(
        dq=jnp.full((b, n, tp, h), fill, jnp.float16 if variant.dq_accum == "fp16" else jnp.float32),
        dk=jnp.full((b, n_kv, sp, h), fill, jnp.float32),
        dv=jnp.full((b, n_kv, sp, h), fill, jnp.float32),
        dq_sem=jnp.full((b, n, tp // 32), -1, jnp.int32),  # zero-filled by the handler when used
    )
    shift = None
    if variant.sdp_fp8:  # v8 in v's place, then q8, k8, do8, qs, ks, vs, dos
        q8, k8, v8, do8, qs, ks, vs, dos = fp8_copies(case, do, tp, sp)
        if variant.dv_f16:  # float16 dO^ 2^-shift (the library's pre-pass helpers); dv comes back times 2^-shift
            shift = do_shift(dos, g)
            args["doh"] = do_float16(args["doh"], dos, shift)
        args = {("v8" if k == "vh" else k): (v8 if k == "vh" else x) for k, x in args.items()}
        args.update(q8=q8, k8=k8, do8=do8, qs=qs, ks=ks, vs=vs, dos=dos)
    return args, outs, shift


def call_kernel(variant, tau: float, args: dict, outs: dict, dq_scale_log2: int = 0) -> tuple[jax.Array, ...]:
    """The `_into` call of `variant` on kernel_inputs' operands and outputs: (dq, dk, dv, dq_sem) as the
    kernel left them (dq float16 dQ * 2^e for dq_accum "fp16", dv times 2^-shift for dv_f16)."""
    specs = tuple((x.shape, str(x.dtype)) for x in outs.values())
    fn = _into_fn(variant.name, float(tau), int(dq_scale_log2), specs, variant.sdp_fp8)
    return fn(*args.values(), *outs.values())


def kernel_bwd(case, ops, o, lse, *, tune=0, poison=True, mode=None, dq_scale_log2=0):
    """The kernel's dq (B, K, G, T, H), dk, dv (B, K, S, H) float64, and the raw padded outputs (dq as the
    kernel left it: float16 dQ * 2^e for dq_accum "fp16"; dq_sem). mode: the dQ mode's registry fields
    (dq_accum, deterministic; tests/attention/test_attention_bwd_dq_modes_gpu.py), dq_scale_log2 its e."""
    b, n_kv, g, t, h = case["q"].shape
    s = case["k"].shape[2]
    tp, sp = _round_up(t), _round_up(s)
    variant = kernel_variant(case, tune=tune, mode=mode)
    args, outs, shift = kernel_inputs(case, ops, o, lse, variant, poison=poison)
    dq, dk, dv, sem = call_kernel(variant, case["tau"], args, outs, dq_scale_log2)
    raw_dq = np.asarray(dq)
    dq, dk, dv = (np.asarray(x, np.float64) for x in (dq, dk, dv))
    if shift is not None:
        dv = dv * 2.0 ** np.asarray(shift, np.float64)[:, :, None, None]
    if variant.dq_accum == "fp16":
        dq = dq * 2.0**-dq_scale_log2
    raw = dict(dq=dq, dk=dk, dv=dv, tp=tp, sp=sp, dq_raw=raw_dq, dq_sem=np.asarray(sem))
    dq = dq[:, :, :t].reshape(b, n_kv, g, t, h)
    return (dq, dk[:, :, :s], dv[:, :, :s]), raw


def fp8_copies(case, do, tp: int, sp: int) -> tuple[jax.Array, ...]:
    """The sdp_fp8 operands (q8, k8, v8, do8, qs, ks, vs, dos) of the case's q, k, v and dO, from the library's
    square quantization (the contract's blocks, as fake_quant_square) and the producer's realign."""
    b, n_kv, g, t, h = case["q"].shape

    def rows(x, length, padded, mult=1.0):  # (B, heads, L, H) -> (B, heads, Lp, H) FP8 and (B, heads, Lp/32)
        seq_major = jnp.swapaxes(jnp.asarray(x, jnp.float32).reshape(b, -1, length, h), 1, 2)
        return aligned_rows(square_sequence_major(seq_major, None, "up"), padded, "cuda", mult)

    q8, qs = rows(case["q"], t, tp, float(np.float32(case["tau"] * math.log2(math.e))))
    k8, ks = rows(case["k"], case["k"].shape[2], sp)
    v8, vs = rows(case["v"], case["k"].shape[2], sp)
    do8, dos = rows(do, t, tp)
    return q8, k8, v8, do8, qs, ks, vs, dos


@functools.cache
def _into_fn(kernel: str, tau: float, dq_scale_log2: int, specs: tuple, sdp_fp8: bool = False):
    """jit of the `_into` call (outputs aliased to the last four operands), compiled once per variant, tau,
    e and output shapes (the 20-run determinism test calls it repeatedly)."""
    n_in = 14 if sdp_fp8 else 7
    call = jax.ffi.ffi_call(
        "jax_mxfp8_attention_bwd_fp8_into" if sdp_fp8 else "jax_mxfp8_attention_bwd_into",
        tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs),
        input_output_aliases={n_in + i: i for i in range(4)},
    )
    attrs = dict(kernel=kernel, scale=np.float32(tau), dq_scale_log2=np.int32(dq_scale_log2))
    return jax.jit(lambda *a: call(*a, **attrs))


def check_written(case, raw):
    """Every element finite (NaN-poisoned buffers), rows >= q_len / kv_len (and padding) exactly 0."""
    for name in ("dq", "dk", "dv"):
        assert np.all(np.isfinite(raw[name])), f"{name}: not every element was written (or NaN/Inf)"
    rows = np.arange(raw["tp"])[None, None, :, None] >= case["q_len"][:, None, None, None]
    keys = np.arange(raw["sp"])[None, None, :, None] >= case["kv_len"][:, None, None, None]
    assert np.all(raw["dq"][np.broadcast_to(rows, raw["dq"].shape)] == 0), "dq: rows >= q_len are not 0"
    for name in ("dk", "dv"):
        x = raw[name]
        assert np.all(x[np.broadcast_to(keys, x.shape)] == 0), f"{name}: rows >= kv_len are not 0"


def check_same_math(tune, got, base, base_tune: int = 0):
    """Tune `tune`'s (dq, dk, dv) against tune `base_tune`'s (the same GEMM precision) on the same inputs: dk,
    dv bit-exact, dq up to the float32 reduction order across KV tiles."""
    dq, dk, dv = got
    dq0, dk0, dv0 = base
    b = f"tune {base_tune}"
    assert np.array_equal(dk, dk0), f"tune {tune} dk differs from {b} (max {np.max(np.abs(dk - dk0)):.3g})"
    assert np.array_equal(dv, dv0), f"tune {tune} dv differs from {b} (max {np.max(np.abs(dv - dv0)):.3g})"
    db = sqnr_db(dq0, dq)
    assert db >= SAME_MATH_DQ_DB, f"tune {tune} dq: {db:.1f} dB vs {b} < {SAME_MATH_DQ_DB}"
