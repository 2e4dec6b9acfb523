"""The shared attention cases (the tokamax habit: one test base, one subclass per implementation).

`AttentionImplementationCases` holds the cases; tests/attention/test_attention_implementations.py subclasses
it per `implementation` of jax_mxfp8.dot_product_attention / varlen_attention / broadcast_query_attention /
dot_product_attention_vjp ("xla", "emulated", "cuda"), and
tests/attention/test_attention_sm100_dispatch.py runs it on the Blackwell dispatch.
Every check compares against something the implementation under test did not produce: float64 unquantized
attention (tests/attention/attention_oracle.exact_attention), a float64 one-hot oracle at huge logits, the
reference's own quantize, the op's definition through another op, and, for the kernel paths, the "xla"
reference (each path with its own forward; output and LSE cotangents).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.ops import attention_bwd_kernel as kbwd
from jax_mxfp8.ops.attention_grads import dot_product_attention_vjp
from jax_mxfp8.primitives import implementation as impl
from tests.attention.attention_oracle import exact_attention, sqnr_db
from tests.attention.attention_testutil import check_mx_gradient, fresh_rng
from tests.attention.broadcast_testutil import broadcast_fwd_bwd, broadcast_inputs, tiled_query_fwd_bwd

# (b, t, s, n, n_kv, h, causal, lengths, dtype): small, but with GQA, MQA, causal, padding, T and S not
# multiples of 128, bfloat16 and float32 inputs (the kernel path quantizes float32 from float32)
CASES = {
    "gqa": (2, 128, 160, 4, 2, 64, False, True, jnp.bfloat16),
    "mqa-causal-f32": (1, 160, 160, 2, 1, 128, True, False, jnp.float32),
    "mha-causal-lengths": (2, 96, 128, 2, 2, 64, True, True, jnp.bfloat16),
}
# (case, AttentionConfig.p_scale): p_scale="block" on the GQA and the causal-with-lengths cases
PATH_CASES = [(name, "const") for name in CASES] + [("gqa", "block"), ("mha-causal-lengths", "block")]


def _inputs(case, seed):
    b, t, s, n, n_kv, h, causal, lengths, dtype = case
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), dtype)
    k = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), dtype)
    v = jnp.asarray(rng.standard_normal((b, s, n_kv, h)), dtype)
    do = jnp.asarray(rng.standard_normal((b, t, n, h)), dtype)
    dlse = jnp.asarray(rng.standard_normal((b, n, t)), jnp.float32)
    q_len = jnp.asarray([t - 17 * i for i in range(b)], jnp.int32) if lengths else None
    kv_len = jnp.asarray([s - 29 * i for i in range(b)], jnp.int32) if lengths else None
    return q, k, v, do, dlse, q_len, kv_len


@functools.cache
def _fwd_bwd(implementation, causal, p_scale="const"):
    """(jit: (q, k, v, do, dlse, q_len, kv_len) -> (o, dq, dk, dv) under the output and LSE cotangents, the
    list of the implementation decisions its trace made)."""
    config = mx.AttentionConfig(p_scale=p_scale)
    decisions = []

    def run(q, k, v, do, dlse, q_len, kv_len):
        def f(q, k, v):
            return mx.dot_product_attention(
                q, k, v, is_causal=causal, query_seq_lengths=q_len, key_value_seq_lengths=kv_len,
                implementation=implementation, config=config, return_residual="lse",
            )  # fmt: skip

        with impl.record() as traced:  # at trace time: the paths every call of this program takes
            (o, _), vjp = jax.vjp(f, q, k, v)
            grads = vjp((do, dlse))
        decisions[:] = traced
        return (o, *grads)

    return jax.jit(run), decisions


def _backward_path(decisions) -> set[str]:
    return {d.path for d in decisions if d.op == kbwd.OP}


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


# ----------------------------------------------------------------------------- large but finite logits
# At |S| from ~1e7 to ~1e30 softmax is one-hot at each row's largest logit, so the answer is known exactly:
# O is the V row of that key, LSE is the largest logit, dV is the sum of the (quantized) output cotangents of
# the rows that pick each key. What it catches: a running max and an exponent that see differently rounded S
# (XLA contracting the scale multiply into exp's subtraction as an FMA; the kernel's FFMA) give the reference
# NaN rows (P~ > 1, an unsaturated cast of 256 P~ to E4M3) and, past ~1e9, rows of zeros with LSE -inf; the
# emulation and the kernel (which saturate P) rows of zeros or rows scaled down. The oracle is float64 NumPy
# on the dequantized square-block operands Q^, K^, V^ (what every implementation starts from); the kernel
# path (emulated, cuda) re-encodes them to one exponent per sub-tile first (docs/numerics.md "Hopper
# attention kernel"), which moves V by up to 2^-4 of its tile's largest element and can flip a near-tied
# argmax: those paths are held to that tolerance on all but a few rows.
LARGE_B, LARGE_N = 1, 2
# (p_scale, sequence length): one 128-key tile (XLA unrolls the scan and fuses differently) and two (the
# running max moves between tiles)
LARGE_CASES = [("const", 128), ("const", 256), ("block", 128)]
H_KERNEL, H_REFERENCE = 64, 32  # the reference at H = 32 (the kernel covers 64 and 128)
LOGIT_SCALES = (3e3, 1e5, 1e10, 1e15)  # logits ~ SCALE^2 (tau = H^-1/2): 1e7 .. 1e30


def _large_inputs(rng, scale, dtype, t, h):
    shape = (LARGE_B, t, LARGE_N, h)
    q = jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    k = jnp.asarray(rng.standard_normal(shape) * scale, dtype)
    v = jnp.asarray(rng.standard_normal(shape), dtype)
    do = jnp.asarray(rng.standard_normal(shape), dtype)
    return q, k, v, do


def _dequant(x):
    """Square-block Q^ / K^ / V^ / dO^ over (sequence, head_dim) of a (B, L, N, H) array, float64.

    The oracle's quantization is the reference's by choice (implementation="xla"): the kernels do not cover
    blocks over axes (-3, -1), and implementation=None would warn about that on the GPU."""
    q = mx.quantize(x, axis=(-3, -1), block="square", implementation="xla")
    return np.asarray(mx.dequantize(q, jnp.float32, implementation="xla"), np.float64)


def _one_hot_oracle(q, k, v, do):
    """float64: whether each row's argmax is decisive, the expected O, LSE and dV, and the keys whose dV
    an undecided row can touch (its top two)."""
    qd, kd, vd, dod = (_dequant(x) for x in (q, k, v, do))
    s = np.einsum("btnh,bsnh->bnts", qd, kd) * q.shape[-1] ** -0.5
    order = np.argsort(s, axis=-1)[..., -2:]
    top2 = np.take_along_axis(s, order, axis=-1)
    arg = order[..., 1]  # (B, N, T)
    # decisive: the runner-up is >= 100 below (exp(-100) vanishes) and float32 rounding cannot swap them
    decisive = top2[..., 1] - top2[..., 0] > np.maximum(100.0, 1e-5 * np.abs(top2[..., 1]))
    o = np.take_along_axis(vd.transpose(0, 2, 1, 3), arg[..., None], axis=2).transpose(0, 2, 1, 3)  # BTNH
    dv = np.zeros_like(vd)
    touched = np.zeros(vd.shape[:3], bool)  # (B, S, N)
    for bi, ni, ti in np.ndindex(*arg.shape):
        dv[bi, arg[bi, ni, ti], ni] += dod[bi, ti, ni]
        if not decisive[bi, ni, ti]:
            touched[bi, order[bi, ni, ti], ni] = True
    return decisive, o, top2[..., 1], dv, touched


@functools.cache
def _large_fns(implementation: str, p_scale: str):
    config = mx.AttentionConfig(p_scale=p_scale)

    def fwd(q, k, v):
        return mx.dot_product_attention(q, k, v, implementation=implementation, config=config, return_residual="lse")

    def loss(q, k, v, do):
        o = mx.dot_product_attention(q, k, v, implementation=implementation, config=config)
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


# --------------------------------------------------------------------------------------- the shared base
class AttentionImplementationCases:
    """The cases; subclasses set IMPLEMENTATION (and the gates of a kernel path against the reference)."""

    IMPLEMENTATION: str = "xla"
    CASES = CASES
    O_VS_REFERENCE_DB = 40.0  # the contract's kernel-vs-reference gate on O
    GRADS_VS_REFERENCE_DB = 30.0  # gradients: each path quantizes its own forward's O for dO . O and dS
    BROADCAST_CAUSAL = (False, True)
    BROADCAST_GRADS_EXACT = True  # dk, dv bit for bit against the tiled query (else >= 40 dB)
    MX_GRADS_DTYPE = jnp.bfloat16

    def check_backward_path(self, decisions):
        """The backward ran where the implementation says (a kernel path, not the reference's fallback)."""
        if self.IMPLEMENTATION != "xla":
            assert _backward_path(decisions) == {self.IMPLEMENTATION}, decisions

    @pytest.mark.parametrize("name,p_scale", PATH_CASES, ids=[f"{n}-{p}" for n, p in PATH_CASES])
    def test_forward_and_gradients_against_float64_and_reference(self, name, p_scale):
        """O, dQ, dK, dV against float64 attention (output cotangent only) and, on a kernel path, against the
        reference with random output and LSE cotangents; query rows past the lengths exactly 0."""
        case = self.CASES[name]
        q, k, v, do, dlse, q_len, kv_len = _inputs(case, seed=sum(map(ord, name + p_scale)))
        run, decisions = _fwd_bwd(self.IMPLEMENTATION, case[6], p_scale)
        got = run(q, k, v, do, jnp.zeros_like(dlse), q_len, kv_len)
        self.check_backward_path(decisions)
        exact = exact_attention(*(_f64(x) for x in (q, k, v)), _f64(do), causal=case[6], q_len=q_len, kv_len=kv_len)
        o_exact = exact[0]
        rows = np.ones(q.shape[:2], bool) if q_len is None else np.arange(q.shape[1])[None] < np.asarray(q_len)[:, None]
        for what, g, e in zip(("o", "dq", "dk", "dv"), got, (o_exact, *exact[2:]), strict=True):
            g = _f64(g)
            assert np.isfinite(g).all(), what
            floor = 20.0 if what == "o" else 14.0  # MXFP8 forward ~25-30 dB; gradients carry dO and dS quantization
            assert sqnr_db(g, e) >= floor, (what, sqnr_db(g, e))
        assert (_f64(got[0])[~rows] == 0).all(), "query rows past the lengths must be 0"
        if self.IMPLEMENTATION == "xla":
            return
        reference = _fwd_bwd("xla", case[6], p_scale)[0]
        ref = reference(q, k, v, do, jnp.zeros_like(dlse), q_len, kv_len)
        # within 0.5 dB of the reference's distance to float64 (forward: the contract's gate)
        assert abs(sqnr_db(_f64(got[0]), o_exact) - sqnr_db(_f64(ref[0]), o_exact)) <= 0.5
        got = run(q, k, v, do, dlse, q_len, kv_len)  # with an LSE cotangent (the same compiled program)
        ref = reference(q, k, v, do, dlse, q_len, kv_len)
        gates = (self.O_VS_REFERENCE_DB,) + (self.GRADS_VS_REFERENCE_DB,) * 3
        for what, g, r, gate in zip(("o", "dq", "dk", "dv"), got, ref, gates, strict=True):
            assert sqnr_db(_f64(g), _f64(r)) >= gate, (what, sqnr_db(_f64(g), _f64(r)))

    def test_nan_stays_in_its_batch_row(self):
        case = CASES["gqa"]
        q, k, v, do, dlse, q_len, kv_len = _inputs(case, seed=5)
        run = _fwd_bwd(self.IMPLEMENTATION, case[6])[0]
        k_bad = k.at[1, 3].set(jnp.nan)
        o = _f64(run(q, k_bad, v, do, dlse, q_len, kv_len)[0])
        o_clean = _f64(run(q, k, v, do, dlse, q_len, kv_len)[0])
        np.testing.assert_array_equal(o[0], o_clean[0])  # batch row 0 never sees the NaN key
        assert np.isnan(o[1, : int(q_len[1])]).any()  # the row holding it: NaN, not a silent number

    def test_varlen(self):
        lens = (77, 200, 32)
        rng = np.random.default_rng(3)
        total = sum(lens)
        q = jnp.asarray(rng.standard_normal((total, 2, 64)), jnp.bfloat16)
        k = jnp.asarray(rng.standard_normal((total, 1, 64)), jnp.bfloat16)
        v = jnp.asarray(rng.standard_normal((total, 1, 64)), jnp.bfloat16)
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        kw = dict(max_seqlen_q=max(lens), max_seqlen_k=max(lens), is_causal=True)
        # one program (eager dispatch: hundreds of small ones on CI's CPU); cu closed over stays concrete
        varlen = jax.jit(lambda q, k, v: mx.varlen_attention(q, k, v, cu, cu, implementation=self.IMPLEMENTATION, **kw))
        got = _f64(varlen(q, k, v))
        for lo, hi in zip(np.asarray(cu)[:-1], np.asarray(cu)[1:], strict=True):
            e = exact_attention(*(_f64(x[lo:hi][None]) for x in (q, k, v)), causal=True)[0][0]
            assert sqnr_db(got[lo:hi], e) >= 20.0

    @pytest.mark.parametrize("p_scale,t", LARGE_CASES)
    def test_large_logits(self, p_scale, t):
        """|S| from ~1e7 to ~1e30: finite O and LSE on the one-hot answer; finite gradients (const P), dV the
        oracle's on the reference."""
        fwd, grad = _large_fns(self.IMPLEMENTATION, p_scale)
        kernel_path = self.IMPLEMENTATION != "xla"
        with_grad = p_scale == "const"
        for scale in LOGIT_SCALES:
            # the kernel path takes bfloat16 (its output dtype); the reference also float32
            dtype, h = (jnp.bfloat16, H_KERNEL) if kernel_path else (jnp.float32, H_REFERENCE)
            q, k, v, do = _large_inputs(fresh_rng(), scale, dtype, t, h)
            decisive, o_x, lse_x, dv_x, touched = _one_hot_oracle(q, k, v, do)
            assert decisive.mean() > 0.9, "test inputs: too many near-tied rows"
            o, lse = (np.asarray(x, np.float64) for x in fwd(q, k, v))
            where = f"{self.IMPLEMENTATION} {p_scale} at |S| ~ {scale**2:.0e}"
            assert np.isfinite(o).all() and np.isfinite(lse).all(), f"{where}: non-finite output or LSE"
            assert (np.abs(o).max(-1) > 0).all(), f"{where}: rows of zeros"
            rows = decisive.transpose(0, 2, 1)  # (B, T, N) like o's rows
            err = np.abs(o - o_x).max(-1)[rows]
            lse_err = (np.abs(lse - lse_x) / np.abs(lse_x))[decisive]
            if kernel_path:
                bound = 2.0**-4 * np.abs(_dequant(v)).max()
                assert np.mean(err <= bound) >= 0.95, f"{where}: O off the one-hot answer ({np.mean(err <= bound):.3f})"
                assert np.quantile(lse_err, 0.95) <= 0.05, f"{where}: LSE off the largest logit"
            else:
                np.testing.assert_allclose(err, 0.0, atol=2e-6, err_msg=where)
                np.testing.assert_allclose(lse_err, 0.0, atol=1e-6, err_msg=where)
            if with_grad:
                dq, dk, dv = (np.asarray(x, np.float64) for x in grad(q, k, v, do))
                for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
                    assert np.isfinite(g).all(), f"{where}: non-finite {name}"
                if not kernel_path:
                    # dV = quant(P)^T dO^ with one-hot P: a sum of dO^ rows (float32 output)
                    np.testing.assert_allclose(dv[~touched], dv_x[~touched], rtol=1e-5, atol=1e-5, err_msg=where)

    def test_mx_gradients_equal_quantized_gradients(self):
        """dot_product_attention_vjp: O and dQ those of dot_product_attention bit for bit; dK, dV as MXArrays
        equal to the reference quantize of the ordinary path's dK, dV (ops/attention_grads.py)."""
        b, t, s, n, nk, h = 2, 64, 96, 2, 1, 64
        rng, dtype = fresh_rng(), self.MX_GRADS_DTYPE
        shapes = [(b, t, n, h), (b, s, nk, h), (b, s, nk, h), (b, t, n, h)]
        q, k, v, do = (jnp.asarray(rng.standard_normal(sh), dtype) for sh in shapes)

        @jax.jit
        def run(q, k, v, do):
            out, vjp = dot_product_attention_vjp(q, k, v, is_causal=True, implementation=self.IMPLEMENTATION)
            f = lambda *a: mx.dot_product_attention(*a, is_causal=True, implementation=self.IMPLEMENTATION)  # noqa: E731
            o_ref, vjp_ref = jax.vjp(f, q, k, v)
            return out, vjp(do), o_ref, vjp_ref(do)

        out, (dq, dk_mx, dv_mx), o_ref, (dq_ref, dk, dv) = run(q, k, v, do)
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(o_ref, np.float32))
        np.testing.assert_array_equal(np.asarray(dq, np.float32), np.asarray(dq_ref, np.float32))
        assert dq.dtype == dtype and dk_mx.row.dtype == jnp.float8_e4m3fn
        check_mx_gradient(dk_mx, dk, b * s)
        check_mx_gradient(dv_mx, dv, b * s)

    def test_broadcast_query_equals_tiled_query(self):
        """broadcast_query_attention = varlen_attention on the query tiled once per key/value sequence: O and
        dK, dV bit for bit (the kernels: dK, dV >= 40 dB, the tiled query's production backward runs FP8
        S^T and dP^T while the broadcast_q variants keep the BF16 schedule), dQ the float32 sum of the copies'
        (float32 inputs, so that each copy's dq is float32 too)."""
        for causal in self.BROADCAST_CAUSAL:
            q, k, v, do, cu_k = broadcast_inputs(fresh_rng())
            o, dq, dk, dv = broadcast_fwd_bwd(self.IMPLEMENTATION, causal)(q, k, v, do, cu_k)
            o_t, dq_t, dk_t, dv_t = tiled_query_fwd_bwd(self.IMPLEMENTATION, causal)(q, k, v, do, cu_k)
            assert o.shape == o_t.shape and dq.shape == q.shape
            np.testing.assert_array_equal(np.asarray(o), np.asarray(o_t))
            want = np.asarray(dq_t, np.float64).sum(0)
            assert np.all(np.isfinite(np.asarray(o))) and np.all(np.isfinite(np.asarray(dq)))
            if self.BROADCAST_GRADS_EXACT:
                np.testing.assert_array_equal(np.asarray(dk), np.asarray(dk_t))
                np.testing.assert_array_equal(np.asarray(dv), np.asarray(dv_t))
                # dq: the float32 sum of the copies' float32 gradients (order of 3 addends: within a few ulps)
                np.testing.assert_allclose(np.asarray(dq, np.float64), want, rtol=0, atol=4e-6 * np.abs(want).max())
            else:
                assert sqnr_db(np.asarray(dk_t, np.float64), np.asarray(dk, np.float64)) > 40.0
                assert sqnr_db(np.asarray(dv_t, np.float64), np.asarray(dv, np.float64)) > 40.0
                assert sqnr_db(dq, want) > 40.0
