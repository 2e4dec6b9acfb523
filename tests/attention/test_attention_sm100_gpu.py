"""The Blackwell attention forward on a Blackwell GPU (compute capability 10.0 / 10.3): marked gpu and blackwell,
skipped on anything else. NONE OF THESE HAS RUN YET: no machine of this project has such a GPU; they are written
for the first run on a B200 / GB300.

  self-test   the family's first-use self-test passes (primitives/attention_fwd_sm100_self_test.py: integer
              logits, per-block power-of-two scales, O bit-exact vs the emulation)
  random      on random operands every variant kind (dense, causal, block P scale, broadcast query, packed
              jagged) is within float32 rounding of its emulation: SQNR >= 60 dB on O, LSE within 1e-4
  written     every element of O and LSE is written (NaN-poisoned _into buffers): dense rows past the lengths
              included; packed, every row of every sequence
  producer    the operand producer (data, square, "hd", "seq" bytes) equals its emulation bit for bit and
              writes every byte, padding included
  ops         dot_product_attention, varlen_attention and broadcast_query_attention take the sm100 path with
              implementation=None and match the XLA reference
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.kernels import registry
from jax_mxfp8.metrics import sqnr_db
from jax_mxfp8.primitives import attention_fwd_sm100 as sm100
from jax_mxfp8.primitives import implementation as impl
from jax_mxfp8.primitives import library, self_test
from jax_mxfp8.primitives.attention_sm100_operands import quantize_square, sm100_operand
from jax_mxfp8.primitives.attention_sm100_packed import chunk_starts, pack_operand, packed_tables

pytestmark = [pytest.mark.gpu, pytest.mark.blackwell]

SCALE = 0.125


@pytest.fixture(scope="module", autouse=True)
def _blackwell():
    ok, why = library.kernels_runnable(registry.AttentionFwdSm100Config.archs)
    if not ok:
        pytest.skip(why)


def _dense(rng, b, bq, t, s, n, n_kv, h):
    x = [rng.standard_normal(shape).astype(np.float32) for shape in ((bq, t, n, h), (b, s, n_kv, h), (b, s, n_kv, h))]
    q, k, v = (quantize_square(jnp.asarray(a)) for a in x)
    return sm100_operand(q, ("hd",)), sm100_operand(k, ("hd",)), sm100_operand(v, ("seq",))


def _cpu(f, *args):
    with jax.default_device(jax.devices("cpu")[0]):
        return f(*jax.device_put(args, jax.devices("cpu")[0]))


def _close(got, want):
    (o, lse), (o_e, lse_e) = got, want
    o, o_e = np.asarray(o, np.float64), np.asarray(o_e, np.float64)
    assert np.isfinite(o).all()
    assert sqnr_db(o, o_e) >= 60.0
    lse, lse_e = np.asarray(lse), np.asarray(lse_e)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_e))
    fin = np.isfinite(lse_e)
    np.testing.assert_allclose(lse[fin], lse_e[fin], atol=1e-4, rtol=0)


def test_self_test_passes():
    self_test.reset()
    assert self_test.verdict(sm100.FAMILY) is None, self_test.status(sm100.FAMILY)
    print(self_test.status(sm100.FAMILY))


KINDS = [(False, "const", False), (True, "block", False), (True, "const", True)]  # (causal, p_scale, broadcast_q)


@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("causal,p_scale,bcast", KINDS)
def test_dense_variants_match_emulation_and_write_everything(h, causal, p_scale, bcast):
    rng = np.random.default_rng(h + 2 * causal)
    b, t, s = 3, 300, 520
    ops = _dense(rng, b, 1 if bcast else b, t, s, 4, 2, h)
    lens = jnp.asarray([[300, 211, 1], [520, 129, 77]], jnp.int32)
    kw = dict(causal=causal, scale=SCALE, p_scale=p_scale, broadcast_q=bcast)
    got = sm100.attention_fwd_sm100(*ops, lens, path="cuda", **kw)
    want = _cpu(lambda *a: sm100.attention_fwd_sm100(*a[:3], a[3], path="emulated", **kw), *ops, lens)
    _close(got, want)
    poison = (jnp.full(got[0].shape, jnp.nan, jnp.bfloat16), jnp.full(got[1].shape, jnp.nan, jnp.float32))
    into = sm100.attention_fwd_sm100(*ops, lens, path="cuda", out=poison, **kw)
    for a, w in zip(into, got, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w))


@pytest.mark.parametrize("causal,p_scale", [(False, "const"), (True, "block")])
def test_packed_jagged_matches_emulation_and_writes_every_sequence_row(causal, p_scale):
    rng = np.random.default_rng(7)
    lens = np.asarray([1, 300, 37, 1000, 128], np.int32)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    total, nch = int(lens.sum()), int(sum(-(-lens // 128)))
    x = [jnp.asarray(rng.standard_normal((1, total, heads, 128)), jnp.float32) for heads in (4, 2, 2)]
    chunk = chunk_starts(jnp.asarray(lens))
    q, k, v = (pack_operand(a, cu, chunk, max_len=1000, n_chunks=nch, orientations=(o,))
               for a, o in zip(x, ("hd", "hd", "seq"), strict=True))  # fmt: skip
    tables = packed_tables(cu, cu, causal=causal, n_chunks_q=nch, n_chunks_k=nch)
    kw = dict(causal=causal, scale=SCALE, p_scale=p_scale, max_len_q=1000, max_len_k=1000)
    got = sm100.attention_fwd_sm100_packed(q, k, v, tables, path="cuda", **kw)
    want = _cpu(lambda q, k, v, t: sm100.attention_fwd_sm100_packed(q, k, v, t, path="emulated", **kw), q, k, v,
                tables)  # fmt: skip
    _close(got, want)
    poison = (jnp.full(got[0].shape, jnp.nan, jnp.bfloat16), jnp.full(got[1].shape, jnp.nan, jnp.float32))
    into = sm100.attention_fwd_sm100_packed(q, k, v, tables, path="cuda", out=poison, **kw)
    np.testing.assert_array_equal(np.asarray(into[0]), np.asarray(got[0]))  # every row lies in a sequence


def test_public_ops_take_the_sm100_path():
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((2, 256, 4, 128)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((2, 384, 2, 128)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((2, 384, 2, 128)), jnp.bfloat16)
    cu = jnp.asarray([0, 100, 256], jnp.int32)
    runs = {
        "dot_product_attention": lambda i: mx.dot_product_attention(q, k, v, is_causal=True, implementation=i),
        "varlen_attention": lambda i: mx.varlen_attention(q[0], k[0, :256], v[0, :256], cu, cu, max_seqlen_q=156,
                                                          max_seqlen_k=156, implementation=i),
        "broadcast_query_attention": lambda i: mx.broadcast_query_attention(q[0], k, v, implementation=i),
    }  # fmt: skip
    for op, run in runs.items():
        with impl.record() as decisions:
            got = np.asarray(run(None), np.float64)
        assert [d.path for d in decisions if d.op == op] == ["cuda"], (op, decisions)
        want = np.asarray(run("xla"), np.float64)
        assert sqnr_db(got, want) >= 35.0, op


PRODUCER_CASES = [((2, 96, 3, 64), jnp.bfloat16, "up"), ((1, 992, 4, 128), jnp.float32, "floor")]


@pytest.mark.parametrize("shape,dtype,rounding", PRODUCER_CASES)
def test_operand_producer_equals_its_emulation_and_writes_every_byte(shape, dtype, rounding):
    """The producer kernel's data, square, "hd" and "seq" bytes (padding included) equal the emulation's bit for
    bit, and it writes every byte (NaN-poisoned _into buffers: 0xFF bytes stay only where the emulation has
    them)."""
    from jax_mxfp8.primitives import attention_operands_sm100 as producer

    x = jnp.asarray(np.random.default_rng(5).standard_normal(shape), dtype)
    mx_, op = producer.attention_operands_sm100(x, scale_rounding=rounding, path="cuda")
    got = (mx_.data, mx_.scale, op.sf_hd, op.sf_seq)
    want = _cpu(lambda x: producer.emulate_attention_operands(x, rounding), x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
    poison = tuple(jax.lax.bitcast_convert_type(jnp.full(w.shape, 0xFF, jnp.uint8), w.dtype) for w in want)
    _, op2 = producer.attention_operands_sm100(x, scale_rounding=rounding, path="cuda", out=poison)
    np.testing.assert_array_equal(np.asarray(op2.sf_hd), np.asarray(want[2]))
    np.testing.assert_array_equal(np.asarray(op2.sf_seq), np.asarray(want[3]))
