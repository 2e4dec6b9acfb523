"""Bad-input cases of the attention ops: dot_product_attention, varlen_attention, broadcast_query_attention,
the MX-gradient vjps and ring_attention: the RAISES / RESULTS tables of tests/bad_inputs/bad_inputs_testutil.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_mxfp8 as mx
from jax_mxfp8.ops.attention_grads import dot_product_attention_vjp, varlen_attention_vjp
from jax_mxfp8.parallel import ring_attention
from tests.bad_inputs.bad_inputs_testutil import CU, KV, P, Q, assert_same, grads_like, rand, shapes

IMPLS = ("xla", "emulated")
BQ = rand((2, 64, 2, 64), 1)  # (B, T, N, H)
BKV = rand((2, 64, 1, 64), 2)  # (B, S, K, H)


def _dpa(q=Q, k=KV, v=KV, **kw):
    return mx.dot_product_attention(q, k, v, implementation=kw.pop("implementation", "xla"), **kw)


def _var(q=P, k=P[:, :1], v=P[:, :1], cu_q=CU, cu_k=CU, **kw):
    kw = dict(max_seqlen_q=22, max_seqlen_k=22, implementation="xla") | kw
    return mx.varlen_attention(q, k, v, cu_q, cu_k, **kw)


def _bqa(q=BQ[0], k=BKV, v=BKV, cu=None, **kw):
    return mx.broadcast_query_attention(q, k, v, cu, implementation=kw.pop("implementation", "xla"), **kw)


def _dpa_vjp(q=BQ, k=BKV, d_out=None, **kw):
    out, vjp = dot_product_attention_vjp(q, k, k, implementation=kw.pop("implementation", "xla"), **kw)
    return out, vjp(out if d_out is None else d_out)


def _var_vjp(q=P, k=P[:, :1], cu_q=CU, cu_k=CU, **kw):
    kw = dict(max_seqlen_q=22, max_seqlen_k=22, implementation="xla") | kw
    out, vjp = varlen_attention_vjp(q, k, k, cu_q, cu_k, **kw)
    return out, vjp(out)


def _ring(q=BQ, k=BKV, **kw):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
    return ring_attention(q, k, k, mesh=mesh, **(dict(axis_name="seq") | kw))


def _mx_scale_sliced(x, axes=(-3, -1), block="square"):
    """x's MXArray with tree_map cutting the scale's head axis (-2) to 1 (data keeps its 2 heads)."""
    a = mx.quantize(x, axis=axes, block=block) if block == "square" else mx.quantize(x, axis=axes[0])
    return jax.tree_util.tree_map(lambda v: v[..., :1, :] if v.dtype == jnp.uint8 else v, a)


# ------------------------------------------------------------------------ item: fully masked rows, bias -inf
def minus_inf_bias_is_a_mask():
    """A bias of -inf masks its logit exactly as a False mask entry does (output, LSE and gradients bit for
    bit); a row of them is fully masked: O = 0, LSE = -inf, zero gradients, no NaN (docs/numerics.md)."""
    masked = np.zeros((2, 2, 64, 64), bool)
    masked[:, :, 3, :] = True  # query row 3: every key
    masked[0, 1, 10, ::3] = True  # some keys of one row
    bias_fin = rand((2, 2, 64, 64), 3)
    bias = jnp.where(masked, -jnp.inf, bias_fin)

    def run(b, m):
        def f(q, k, v, b):
            out, lse = mx.dot_product_attention(q, k, v, bias=b, mask=m, return_residual="lse", implementation="xla")
            return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

        return jax.grad(f, (0, 1, 2, 3), has_aux=True)(BQ, BKV, BKV, b)

    (dq, dk, dv, db), (o, lse) = run(bias, None)
    (dq_m, dk_m, dv_m, db_m), (o_m, lse_m) = run(bias_fin, jnp.asarray(~masked))
    assert_same((o, lse, dq, dk, dv), (o_m, lse_m, dq_m, dk_m, dv_m))
    np.testing.assert_array_equal(np.asarray(db)[~masked], np.asarray(db_m)[~masked])
    assert not np.any(np.asarray(db)[masked])
    assert not np.any(np.asarray(o)[:, 3]) and np.all(np.asarray(lse)[:, :, 3] == -np.inf)
    assert not np.isnan(np.asarray(o)).any() and not np.isnan(np.asarray(dq)).any()


def plus_inf_or_nan_bias_gives_a_nan_row():
    for value in (jnp.inf, jnp.nan):
        out = np.asarray(_dpa(BQ, BKV, BKV, bias=jnp.zeros((64, 64)).at[5, 7].set(value)))
        assert np.all(np.isnan(out[:, 5])) and not np.isnan(np.delete(out, 5, axis=1)).any()


# ------------------------------------------------------------------------------------------- zero-size
def _zero_size_dpa():
    for impl in IMPLS:
        f = lambda q, k, v, impl=impl: _dpa(q, k, v, implementation=impl)
        assert shapes(f(BQ[:0], BKV[:0], BKV[:0])) == [((0, 64, 2, 64), "float32")]
        grads_like(f, BQ[:0], BKV[:0], BKV[:0])
        o, res = _dpa(BQ[:0], BKV[:0], BKV[:0], implementation=impl, return_residual=True)
        assert shapes((o, res)) == [((0, 64, 2, 64), "float32"), ((0, 64, 2), "float32")]
        o, lse = _dpa(BQ[:0], BKV[:0], BKV[:0], implementation=impl, return_residual="lse")
        assert shapes(lse) == [((0, 2, 64), "float32")]


def _zero_size_varlen():
    e, z3 = jnp.zeros((0, 2, 64)), jnp.zeros(3, jnp.int32)
    q = BQ[0]
    for impl in IMPLS:
        f = lambda q, k, v, cq, impl=impl: _var(q, k, v, cq, z3, max_seqlen_q=64, max_seqlen_k=1, implementation=impl)
        out = f(q, e[:, :1], e[:, :1], jnp.asarray([0, 10, 64]))  # no key in any sequence: O = 0
        assert shapes(out) == [((64, 2, 64), "float32")] and not np.any(np.asarray(out))
        grads_like(lambda q, k, v, f=f: f(q, k, v, jnp.asarray([0, 10, 64])), q, e[:, :1], e[:, :1])
        assert shapes(f(e, e[:, :1], e[:, :1], z3)) == [((0, 2, 64), "float32")]


def _zero_size_bqa():
    z3 = jnp.asarray([0, 0, 0])
    for impl in IMPLS:
        f = lambda q, k, v, cu=None, impl=impl, **kw: _bqa(q, k, v, cu, implementation=impl, **kw)
        assert shapes(f(BQ[0], BKV[:0], BKV[:0])) == [((0, 64, 2, 64), "float32")]  # no sequence
        assert shapes(f(BQ[0, :0], BKV, BKV)) == [((2, 0, 2, 64), "float32")]  # no query row
        out = f(BQ[0], BKV[0, :0], BKV[0, :0], z3, max_seqlen_k=1)  # packed, no key row: every sequence empty
        assert shapes(out) == [((2, 64, 2, 64), "float32")] and not np.any(np.asarray(out))
        grads_like(f, BQ[0], BKV[:0], BKV[:0])
        grads_like(f, BQ[0, :0], BKV, BKV)
        grads_like(lambda q, k, v, f=f: f(q, k, v, z3, max_seqlen_k=1), BQ[0], BKV[0, :0], BKV[0, :0])


def _zero_size_vjps():
    for impl in IMPLS:
        out, (dq, dk, dv) = _dpa_vjp(BQ[:0], BKV[:0], implementation=impl)
        assert shapes(dq) == [((0, 64, 2, 64), "float32")]
        for g in (dk, dv):
            assert shapes(g) == [
                ((0, 64), "float8_e4m3fn"),
                ((0, 2), "uint8"),
                ((0, 64), "float8_e4m3fn"),
                ((0, 64), "uint8"),
            ]
        e = jnp.zeros((0, 1, 64))
        out, (dq, dk, dv) = _var_vjp(
            BQ[0],
            e,
            jnp.asarray([0, 10, 64]),
            jnp.zeros(3, jnp.int32),
            max_seqlen_q=64,
            max_seqlen_k=1,
            implementation=impl,
        )
        assert shapes(dq) == [((64, 2, 64), "float32")] and not np.any(np.asarray(dq))
        assert shapes(dk) == [
            ((0, 64), "float8_e4m3fn"),
            ((0, 2), "uint8"),
            ((0, 64), "float8_e4m3fn"),
            ((0, 64), "uint8"),
        ]


def _zero_size_ring():
    out, lse = _ring(BQ[:0], BKV[:0], return_residual=True)
    assert shapes((out, lse)) == [((0, 64, 2, 64), "float32"), ((0, 2, 64), "float32")]


# ------------------------------------------------------------------------------------------------ traced
def _traced_lengths():
    """Traced sequence lengths cannot be checked: out of range, they act as the nearest valid length (< 0 as
    0, > the sequence length as it), on every path (concrete ones raise: the shape cases). The kernel path
    pads S = 64 to 128 keys: a length of 100 must not make the padding attend."""
    q, kv = BQ.astype(jnp.bfloat16), BKV.astype(jnp.bfloat16)
    for impl in IMPLS:
        f = jax.jit(
            lambda ql, kl, impl=impl: _dpa(
                q, kv, kv, query_seq_lengths=ql, key_value_seq_lengths=kl, implementation=impl
            )
        )
        for (ql, kl), (ql_want, kl_want) in (
            (([70, -3], [100, 65]), ([64, 0], [64, 64])),
            (([64, 64], [-5, 65]), ([64, 64], [0, 64])),
            (([64, 64], [10**6, 40]), ([64, 64], [64, 40])),
        ):
            got, want = f(jnp.asarray(ql), jnp.asarray(kl)), f(jnp.asarray(ql_want), jnp.asarray(kl_want))
            assert (
                np.any(np.asarray(want.astype(jnp.float32))) and not np.isnan(np.asarray(got.astype(jnp.float32))).any()
            )
            assert_same(got, want)
        g = jax.jit(lambda kl, impl=impl: _bqa(q[0], kv, kv, key_value_seq_lengths=kl, implementation=impl))
        assert_same(g(jnp.asarray([10**6, -1])), g(jnp.asarray([64, 0])))
        assert_same(g(jnp.asarray([65, 100])), g(jnp.asarray([64, 64])))


def _traced_offsets():
    f = lambda cq, ck: _var(cu_q=cq, cu_k=ck)
    assert_same(jax.jit(f)(CU, CU), f(CU, CU))


def _traced_vjp():
    out, (dq, dk, dv) = jax.jit(lambda q, k: _dpa_vjp(q, k))(BQ, BKV)
    assert_same((out, dq, dk, dv), _dpa_vjp(BQ, BKV))


def _traced_ring():
    assert_same(jax.jit(lambda q, k: _ring(q, k))(BQ, BKV), _ring(BQ, BKV))


# ---------------------------------------------------------------------------------------------- special
def _special_varlen():
    # a NaN in one packed sequence stays in it; huge values give finite outputs elsewhere
    q = P.at[3, 0, 0].set(jnp.nan).at[15].multiply(1e4)
    out = np.asarray(_var(q=q))
    assert np.all(np.isnan(out[3, 0])) and not np.isnan(out[10:]).any() and np.all(np.isfinite(out[10:]))


def _special_bqa():
    # a NaN key in sequence 1 makes only row 1 of the output NaN
    k = BKV.at[1, 5, 0, 0].set(jnp.nan)
    out = np.asarray(_bqa(k=k))
    assert np.all(np.isnan(out[1])) and not np.isnan(out[0]).any()


BIG = [100, 10**6]
RAISES = {
    # dot_product_attention
    ("dot_product_attention", "rank", "2"): (lambda: _dpa(q=Q[0, 0]), "query must have rank"),
    ("dot_product_attention", "dtype", "int"): (lambda: _dpa(q=Q.astype(jnp.int32)), "query has dtype"),
    ("dot_product_attention", "dtype", "mixed"): (
        lambda: _dpa(k=KV.astype(jnp.bfloat16), v=KV.astype(jnp.bfloat16)),
        "dtype",
    ),
    ("dot_product_attention", "dtype", "mask"): (lambda: _dpa(mask=jnp.ones((32, 32))), "mask must be boolean"),
    ("dot_product_attention", "dtype", "float lengths"): (
        lambda: _dpa(key_value_seq_lengths=jnp.asarray([1.0])),
        "key_value_seq_lengths",
    ),
    ("dot_product_attention", "shape", "head_dim 48"): (
        lambda: _dpa(q=jnp.ones((1, 32, 2, 48)), k=jnp.ones((1, 32, 1, 48)), v=jnp.ones((1, 32, 1, 48))),
        "head_dim",
    ),
    ("dot_product_attention", "shape", "T 40"): (lambda: _dpa(q=jnp.ones((1, 40, 2, 32))), "T=40"),
    ("dot_product_attention", "shape", "heads"): (lambda: _dpa(q=jnp.ones((1, 32, 3, 32)), k=Q, v=Q), "not a multiple"),
    ("dot_product_attention", "shape", "value"): (lambda: _dpa(v=Q), "value must have"),
    ("dot_product_attention", "shape", "bias"): (lambda: _dpa(bias=jnp.ones((3, 32))), "bias"),
    ("dot_product_attention", "shape", "lengths shape"): (
        lambda: _dpa(query_seq_lengths=jnp.asarray([1, 2])),
        "query_seq_lengths",
    ),
    ("dot_product_attention", "shape", "negative lengths"): (
        lambda: _dpa(query_seq_lengths=jnp.asarray([-1])),
        "query_seq_lengths",
    ),
    ("dot_product_attention", "shape", "kv lengths beyond S"): (
        lambda: _dpa(BQ, BKV, BKV, key_value_seq_lengths=jnp.asarray(BIG)),
        r"key_value_seq_lengths=\[100, 1000000\] exceeds the sequence length 64",
    ),
    ("dot_product_attention", "shape", "kv lengths beyond S emulated"): (
        lambda: _dpa(BQ, BKV, BKV, key_value_seq_lengths=jnp.asarray(BIG), implementation="emulated"),
        "key_value_seq_lengths=.* exceeds",
    ),
    ("dot_product_attention", "shape", "q lengths beyond T"): (
        lambda: _dpa(BQ, BKV, BKV, query_seq_lengths=jnp.asarray([64, 65])),
        "query_seq_lengths=.* exceeds the sequence length 64",
    ),
    ("dot_product_attention", "shape", "tree_map MXArray query"): (
        lambda: _dpa(q=_mx_scale_sliced(Q)),
        "query scale has shape",
    ),
    ("dot_product_attention", "zero-size", "T 0"): (lambda: _dpa(q=Q[:, :0]), "T=0"),
    ("dot_product_attention", "zero-size", "S 0"): (lambda: _dpa(k=KV[:, :0], v=KV[:, :0]), "S=0"),
    ("dot_product_attention", "zero-size", "kv heads 0"): (
        lambda: _dpa(k=Q[:, :, :0], v=Q[:, :, :0]),
        "at least one head",
    ),
    ("dot_product_attention", "zero-size", "q heads 0"): (lambda: _dpa(q=Q[:, :, :0]), "at least one head"),
    ("dot_product_attention", "zero-size", "head_dim 0"): (
        lambda: _dpa(q=Q[..., :0], k=KV[..., :0], v=KV[..., :0]),
        "head_dim 0",
    ),
    ("dot_product_attention", "option", "scale str"): (lambda: _dpa(scale="abc"), "scale='abc'"),
    ("dot_product_attention", "option", "is_causal"): (lambda: _dpa(is_causal="yes"), "is_causal"),
    ("dot_product_attention", "option", "implementation"): (lambda: _dpa(implementation="bogus"), "implementation"),
    ("dot_product_attention", "option", "config"): (lambda: _dpa(config="fast"), "config"),
    ("dot_product_attention", "option", "bias on the kernel path"): (
        lambda: _dpa(bias=jnp.zeros((32, 32)), implementation="emulated"),
        "no bias",
    ),
    ("dot_product_attention", "special", "scale inf"): (lambda: _dpa(scale=float("inf")), "scale="),
    ("dot_product_attention", "traced", "scale"): (
        lambda: jax.jit(lambda t: _dpa(scale=t))(0.5),
        "scale=.* must be a concrete Python number",
    ),
    # varlen_attention
    ("varlen_attention", "rank", "4"): (lambda: _var(q=Q), "q must have rank 3"),
    ("varlen_attention", "dtype", "int"): (lambda: _var(q=P.astype(jnp.int32)), "q has dtype"),
    ("varlen_attention", "dtype", "cu float"): (lambda: _var(cu_k=jnp.asarray([0.0, 32.0])), "cu_seqlens_k"),
    ("varlen_attention", "shape", "cu"): (lambda: _var(cu_q=jnp.asarray([0])), "cu_seqlens_q"),
    ("varlen_attention", "shape", "cu decreasing"): (lambda: _var(cu_q=jnp.asarray([0, 20, 10])), "cu_seqlens_q"),
    ("varlen_attention", "shape", "cu beyond"): (lambda: _var(cu_q=jnp.asarray([0, 10, 40])), "cu_seqlens_q"),
    ("varlen_attention", "shape", "max small"): (lambda: _var(max_seqlen_q=5), "max_seqlen_q"),
    ("varlen_attention", "shape", "head_dim"): (
        lambda: _var(k=jnp.ones((32, 1, 64)), v=jnp.ones((32, 1, 64))),
        "head_dim",
    ),
    ("varlen_attention", "shape", "tree_map MXArray q"): (
        lambda: _var(q=_mx_scale_sliced(P, (-1,), "row")),
        "q scale has shape",
    ),
    ("varlen_attention", "zero-size", "heads 0"): (lambda: _var(k=P[:, :0], v=P[:, :0]), "at least one head"),
    ("varlen_attention", "zero-size", "head_dim 0"): (
        lambda: _var(q=P[..., :0], k=P[:, :1, :0], v=P[:, :1, :0]),
        "head_dim 0",
    ),
    ("varlen_attention", "option", "max float"): (lambda: _var(max_seqlen_k=22.0), "max_seqlen_k"),
    ("varlen_attention", "option", "scale"): (lambda: _var(scale="abc"), "scale="),
    ("varlen_attention", "special", "float64 beyond float32"): (
        lambda: _var(q=np.asarray(P, np.float64) * 1e300),
        "q holds",
    ),
    ("varlen_attention", "traced", "max_seqlen"): (
        lambda: jax.jit(lambda m: _var(max_seqlen_q=m))(22),
        "max_seqlen_q=",
    ),
    # broadcast_query_attention
    ("broadcast_query_attention", "rank", "4-D query"): (lambda: _bqa(q=BQ), "query must have rank 3"),
    ("broadcast_query_attention", "dtype", "int"): (lambda: _bqa(q=BQ[0].astype(jnp.int32)), "query has dtype"),
    ("broadcast_query_attention", "dtype", "MXArray"): (lambda: _bqa(q=mx.quantize(BQ[0])), "takes no MXArrays"),
    ("broadcast_query_attention", "shape", "kv lengths beyond S"): (
        lambda: _bqa(key_value_seq_lengths=jnp.asarray(BIG)),
        r"key_value_seq_lengths=\[100, 1000000\] exceeds the sequence length 64",
    ),
    ("broadcast_query_attention", "shape", "kv lengths beyond S emulated"): (
        lambda: _bqa(key_value_seq_lengths=jnp.asarray(BIG), implementation="emulated"),
        "key_value_seq_lengths=.* exceeds",
    ),
    ("broadcast_query_attention", "shape", "head_dim"): (lambda: _bqa(q=BQ[0, :, :, :32]), "head_dim"),
    ("broadcast_query_attention", "shape", "S 40"): (lambda: _bqa(k=BKV[:, :40], v=BKV[:, :40]), "S=40"),
    ("broadcast_query_attention", "zero-size", "S 0"): (lambda: _bqa(k=BKV[:, :0], v=BKV[:, :0]), "S=0"),
    ("broadcast_query_attention", "zero-size", "head_dim 0"): (
        lambda: _bqa(q=BQ[0, ..., :0], k=BKV[..., :0], v=BKV[..., :0]),
        "head_dim 0",
    ),
    ("broadcast_query_attention", "option", "max_seqlen_k padded"): (
        lambda: _bqa(max_seqlen_k=64),
        "max_seqlen_k is for packed",
    ),
    ("broadcast_query_attention", "option", "packed without max"): (
        lambda: _bqa(k=BKV[0], v=BKV[0], cu=jnp.asarray([0, 64])),
        "need max_seqlen_k",
    ),
    ("broadcast_query_attention", "option", "is_causal"): (lambda: _bqa(is_causal="yes"), "is_causal"),
    ("broadcast_query_attention", "special", "float64 beyond float32"): (
        lambda: _bqa(q=np.asarray(BQ[0], np.float64) * 1e300),
        "query holds",
    ),
    ("broadcast_query_attention", "traced", "scale"): (
        lambda: jax.jit(lambda t: _bqa(scale=t))(0.5),
        "scale=.* must be a concrete",
    ),
    # MX-gradient vjps
    ("attention_grads.dot_product_attention_vjp", "dtype", "MXArray key"): (
        lambda: _dpa_vjp(k=mx.quantize(BKV, axis=(-3, -1), block="square")),
        "MX gradients need float key",
    ),
    ("attention_grads.dot_product_attention_vjp", "rank", "2"): (lambda: _dpa_vjp(q=BQ[0, 0]), "query must have rank"),
    ("attention_grads.dot_product_attention_vjp", "shape", "d_out"): (
        lambda: _dpa_vjp(d_out=BQ[:1]),
        "d_out must have",
    ),
    ("attention_grads.dot_product_attention_vjp", "option", "grad_scale_rounding"): (
        lambda: _dpa_vjp(grad_scale_rounding="x"),
        "scale_rounding='x'",
    ),
    ("attention_grads.dot_product_attention_vjp", "option", "bias"): (
        lambda: _dpa_vjp(bias=jnp.zeros((64, 64))),
        "bias is not supported",
    ),
    ("attention_grads.dot_product_attention_vjp", "special", "float64 beyond float32"): (
        lambda: _dpa_vjp(q=np.asarray(BQ, np.float64) * 1e300),
        "query holds",
    ),
    ("attention_grads.dot_product_attention_vjp", "zero-size", "S 0"): (lambda: _dpa_vjp(k=BKV[:, :0]), "S=0"),
    ("attention_grads.dot_product_attention_vjp", "traced", "scale"): (
        lambda: jax.jit(lambda t: _dpa_vjp(scale=t))(0.5),
        "scale=.* must be a concrete",
    ),
    ("attention_grads.varlen_attention_vjp", "dtype", "MXArray k"): (
        lambda: _var_vjp(k=mx.quantize(P[:, :1])),
        "MX gradients need float key",
    ),
    ("attention_grads.varlen_attention_vjp", "rank", "4"): (lambda: _var_vjp(q=Q), "q must have rank 3"),
    ("attention_grads.varlen_attention_vjp", "shape", "k rows 48"): (
        lambda: _var_vjp(k=BQ[0, :48, :1], cu_k=jnp.asarray([0, 10, 48])),
        "k has 48 packed rows",
    ),
    ("attention_grads.varlen_attention_vjp", "option", "grad_scale_rounding"): (
        lambda: _var_vjp(grad_scale_rounding="x"),
        "scale_rounding='x'",
    ),
    ("attention_grads.varlen_attention_vjp", "special", "float64 beyond float32"): (
        lambda: _var_vjp(q=np.asarray(P, np.float64) * 1e300),
        "q holds",
    ),
    ("attention_grads.varlen_attention_vjp", "zero-size", "head_dim 0"): (
        lambda: _var_vjp(q=P[..., :0], k=P[:, :1, :0]),
        "head_dim 0",
    ),
    ("attention_grads.varlen_attention_vjp", "traced", "max_seqlen"): (
        lambda: jax.jit(lambda m: _var_vjp(max_seqlen_k=m))(22),
        "max_seqlen_k=",
    ),
    # ring_attention (a mesh of one device: the argument checks and the ring of one)
    ("parallel.ring_attention", "dtype", "int"): (lambda: _ring(q=BQ.astype(jnp.int32)), "query has dtype"),
    ("parallel.ring_attention", "rank", "3"): (lambda: _ring(q=BQ[0]), "rank 4"),
    ("parallel.ring_attention", "shape", "T 40"): (lambda: _ring(q=BQ[:, :40]), "query sequence length 40"),
    ("parallel.ring_attention", "zero-size", "T 0"): (lambda: _ring(q=BQ[:, :0]), "query sequence length 0"),
    ("parallel.ring_attention", "option", "axis_name"): (lambda: _ring(axis_name="model"), "axis_name="),
    ("parallel.ring_attention", "option", "config"): (lambda: _ring(config="fast"), "config"),
    ("parallel.ring_attention", "traced", "scale"): (
        lambda: jax.jit(lambda t: _ring(scale=t))(0.5),
        "scale=.* must be a concrete",
    ),
}

RESULTS = {
    ("dot_product_attention", "special", "bias -inf is a mask; a row of it is fully masked"): minus_inf_bias_is_a_mask,
    ("dot_product_attention", "special", "bias +inf or NaN: a NaN row"): plus_inf_or_nan_bias_gives_a_nan_row,
    ("dot_product_attention", "zero-size", "B 0, every path and residual"): _zero_size_dpa,
    ("dot_product_attention", "traced", "lengths out of range act as the nearest"): _traced_lengths,
    ("varlen_attention", "zero-size", "no rows, no keys"): _zero_size_varlen,
    ("varlen_attention", "special", "NaN stays in its sequence"): _special_varlen,
    ("varlen_attention", "traced", "offsets"): _traced_offsets,
    ("broadcast_query_attention", "zero-size", "B 0, Tq 0, packed without keys"): _zero_size_bqa,
    ("broadcast_query_attention", "special", "NaN key stays in its row"): _special_bqa,
    ("broadcast_query_attention", "traced", "lengths out of range act as the nearest"): _traced_lengths,
    ("attention_grads.dot_product_attention_vjp", "zero-size", "B 0"): _zero_size_vjps,
    ("attention_grads.dot_product_attention_vjp", "traced", "jit equals eager"): _traced_vjp,
    ("attention_grads.varlen_attention_vjp", "zero-size", "no keys"): _zero_size_vjps,
    ("parallel.ring_attention", "zero-size", "B 0"): _zero_size_ring,
    ("parallel.ring_attention", "traced", "jit equals eager"): _traced_ring,
}
