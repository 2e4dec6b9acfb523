"""The first-use self-tests of the Blackwell attention forward (family "attention_fwd_sm100") and of its operand
producer (family "attention_operands_sm100": data, square, "hd" and "seq" bytes bit-exact vs the emulation),
primitives/self_test.py, registered on import.

The problem is built so that every operation of the kernel is exact, whatever the hardware's order and internal
precision, and every misplaced byte shows:
  - operands are made directly as MX bytes: E4M3 small integers with square-block E8M0 scales that differ from
    block to block, head to head and batch to batch (q, k: 2^0 or 2^1; v: 2^-2 .. 2^2), laid out by
    attention_sm100_operands.sm100_operand; a query row has one nonzero element (1) at a column that moves
    with the row and the head, keys are in {-1, 0, 1}: every logit is an integer in [-4, 4];
  - tau = ln 2, so fl(tau log2 e) = 1 and the logits are the integers themselves: P~ = 2^(t - m) with
    t - m in [-8, 0] (the hardware's ex2 and XLA's exp2 are exact there), P is exact in E4M3 under both
    p_scale rules, the row sum and the O accumulation fit float32's 24 bits, O / l is one IEEE division;
  - the LSE takes the hardware's log2 (lg2.approx, about 2^-22 relative): it is held to 2^-16 of the
    emulation's, not to its bits; -inf rows exactly.
Runs: dense H 128 (lengths < T, S; const), dense H 64 causal p_scale "block", broadcast query H 64, and a jagged
batch of three packed sequences (lengths 100, 37, 200: partial blocks and chunks) H 128 causal, both p_scales.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import self_test
from jax_mxfp8.primitives.attention_fwd_sm100 import FAMILY, attention_fwd_sm100, attention_fwd_sm100_packed
from jax_mxfp8.primitives.attention_operands_sm100 import FAMILY as OPERANDS_FAMILY
from jax_mxfp8.primitives.attention_operands_sm100 import attention_operands_sm100, emulate_attention_operands
from jax_mxfp8.primitives.attention_sm100_emulation import emulate_fwd_sm100
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand, orientation_scales, sm100_operand
from jax_mxfp8.primitives.attention_sm100_packed import emulate_packed_fwd_sm100, packed_tables

TAU = float(np.log(2.0))
"""tau with fl(tau log2 e) = 1: the kernel's logits are the integer Q K^T products themselves."""
LSE_TOLERANCE = 2.0**-16
SEQS = (100, 37, 200)
"""The packed sequences (query and key lengths)."""
DENSE_RUNS = (  # (head_dim, batch, T, S, causal, p_scale, broadcast_q)
    (128, 2, 160, 224, False, "const", False),
    (64, 2, 192, 160, True, "block", False),
    (64, 3, 96, 160, False, "const", True),
)
PACKED_RUNS = ((128, True, "const"), (128, False, "block"))  # (head_dim, causal, p_scale)


def _bytes(b: int, length: int, heads: int, h: int, lo: int, hi: int, salt: int) -> np.ndarray:
    """(b, L/32, heads, H/32) square-block E8M0 bytes 127 + e, e in [lo, hi], differing between neighbouring
    blocks along both axes, heads and batches."""
    bi, ri, ni, ci = np.meshgrid(*(np.arange(x) for x in (b, -(-length // 32), heads, h // 32)), indexing="ij")
    return (127 + lo + (bi * 5 + ri * 3 + ni * 7 + ci * 11 + salt) % (hi - lo + 1)).astype(np.uint8)


def _mx(data: np.ndarray, scale: np.ndarray) -> MXArray:
    return MXArray(jnp.asarray(data, jnp.float8_e4m3fn), jnp.asarray(scale), (-3, -1), "square")


def _operands(rng, b: int, bq: int, t: int, s: int, n: int, n_kv: int, h: int, salt: int) -> tuple:
    """(q, k, v) square-block MXArrays: q one 1 per row, k in {-1, 0, 1}, v in {-1, 0, 1}."""
    q = np.zeros((bq, t, n, h), np.float32)
    ti, ni = np.meshgrid(np.arange(t), np.arange(n), indexing="ij")
    q[:, ti, ni, (ti * 5 + ni * 3 + salt) % h] = 1.0
    k = rng.integers(-1, 2, size=(b, s, n_kv, h)).astype(np.float32)
    v = rng.integers(-1, 2, size=(b, s, n_kv, h)).astype(np.float32)
    return (
        _mx(q, _bytes(bq, t, n, h, 0, 1, salt)),
        _mx(k, _bytes(b, s, n_kv, h, 0, 1, salt + 1)),
        _mx(v, _bytes(b, s, n_kv, h, -2, 2, salt + 2)),
    )


def _inputs() -> tuple:
    rng = np.random.default_rng(20263)
    dense = []
    for i, (h, b, t, s, _, _, bcast) in enumerate(DENSE_RUNS):
        q, k, v = _operands(rng, b, 1 if bcast else b, t, s, 4, 2, h, salt=i)
        lens = np.stack([np.arange(b) * -29 + t, np.arange(b) * -41 + s]).astype(np.int32)
        dense.append((q, k, v, jnp.asarray(lens)))
    total = sum(SEQS)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(SEQS)]), jnp.int32)
    packed = []
    for i, (h, _, _) in enumerate(PACKED_RUNS):
        # one packed batch row; blocks restart at every sequence start: each sequence quantized alone
        parts = [_operands(rng, 1, 1, -(-n // 32) * 32, -(-n // 32) * 32, 2, 1, h, salt=7 + i) for n in SEQS]
        packed.append((parts, cu, total))
    return dense, packed


def _packed_operand(parts, which: int, orientation: str) -> tuple:
    """The packed operand of the per-sequence MXArrays: data compact (each sequence's first L rows), scales per
    sequence in whole 128-row chunks (its square bytes repeated over their rows)."""
    data, scales = [], []
    for p, n in zip(parts, SEQS, strict=True):
        x = p[which]
        data.append(x.data[:, :n])
        scales.append(orientation_scales(x.scale.transpose(0, 2, 1, 3), orientation))
    return jnp.concatenate(data, axis=1), jnp.concatenate(scales, axis=2 if orientation == "hd" else 3)


def _packed_ops(parts, cu):
    (qd, qs), (kd, ks), (vd, vs) = (_packed_operand(parts, i, o) for i, o in ((0, "hd"), (1, "hd"), (2, "seq")))
    return Sm100Operand(qd, sf_hd=qs), Sm100Operand(kd, sf_hd=ks), Sm100Operand(vd, sf_seq=vs)


def _tables(cu, causal: bool, q_op, k_op):
    return packed_tables(cu, cu, causal=causal, n_chunks_q=q_op.sf_hd.shape[2], n_chunks_k=k_op.sf_hd.shape[2])


def _dense_ops(q, k, v):
    return sm100_operand(q, ("hd",)), sm100_operand(k, ("hd",)), sm100_operand(v, ("seq",))


@functools.partial(jax.jit, static_argnums=(1,))
def _kernel(ops: tuple, path: str) -> tuple:
    """Every run on `path` ("cuda": the kernels; "emulated": their FFI calls' emulation), one program."""
    dense, packed = ops
    out = []
    for (*_, causal, p_scale, bcast), (q, k, v, lens) in zip(DENSE_RUNS, dense, strict=True):
        out += attention_fwd_sm100(*_dense_ops(q, k, v), lens, causal=causal, scale=TAU, p_scale=p_scale,
                                   broadcast_q=bcast, path=path)  # fmt: skip
    for (_, causal, p_scale), (parts, cu, _) in zip(PACKED_RUNS, packed, strict=True):
        q, k, v = _packed_ops(parts, cu)
        out += attention_fwd_sm100_packed(
            q, k, v, _tables(cu, causal, q, k), causal=causal, scale=TAU, max_len_q=max(SEQS), max_len_k=max(SEQS),
            p_scale=p_scale, path=path,
        )  # fmt: skip
    return tuple(out)


@jax.jit
def _emulated(ops: tuple) -> list:
    """The emulation of every run (one compiled program: op by op, the scans would take minutes on a CPU)."""
    dense, packed = ops
    out = []
    for (*_, causal, p_scale, _), (q, k, v, lens) in zip(DENSE_RUNS, dense, strict=True):
        o, lse = emulate_fwd_sm100(*_dense_ops(q, k, v), lens, causal=causal, scale=TAU, p_scale=p_scale)
        out += [o.astype(jnp.bfloat16), lse]
    for (_, causal, p_scale), (parts, cu, _) in zip(PACKED_RUNS, packed, strict=True):
        q, k, v = _packed_ops(parts, cu)
        chunk = jnp.asarray(np.concatenate([[0], np.cumsum([-(-n // 128) for n in SEQS])]), jnp.int32)
        o, lse = emulate_packed_fwd_sm100(q, k, v, cu, cu, chunk, chunk, max_len_q=max(SEQS), max_len_k=max(SEQS),
                                          causal=causal, scale=TAU, p_scale=p_scale)  # fmt: skip
        out += [o.astype(jnp.bfloat16), lse]
    return out


def _expected(ops: tuple, got: tuple) -> tuple:
    """The emulation's outputs: O bit for bit; an LSE within LSE_TOLERANCE of the emulation's (and -inf exactly
    where it is) is taken as the kernel gave it (the hardware's log2), any other is the emulation's."""
    want = [np.asarray(x) for x in _emulated(ops)]
    for i in range(1, len(want), 2):
        g, w = np.asarray(got[i]), want[i]
        same_inf = np.array_equal(np.isneginf(g), np.isneginf(w)) if g.shape == w.shape else False
        finite = np.isfinite(w)
        diff = np.abs(np.where(finite, g, 0.0) - np.where(finite, w, 0.0)) if same_inf else np.inf
        close = np.all(diff <= LSE_TOLERANCE)
        if close and np.isfinite(g[finite]).all():
            want[i] = g
    return tuple(want)


self_test.register(
    self_test.SelfTestFamily(
        name=FAMILY,
        archs=registry.AttentionFwdSm100Config.archs,
        problem=(
            "dense H128 (lengths), dense H64 causal p_scale block, broadcast query H64, packed jagged batch "
            f"{SEQS} H128 causal const and non-causal block; integer logits, per-block power-of-two scales: O "
            "bit-exact vs the emulation, LSE within 2^-16"
        ),
        inputs=_inputs,
        kernel=_kernel,
        expected=_expected,
    )
)


def _producer_inputs() -> tuple:
    """x (2, 96, 3, 64) bfloat16 and (1, 288, 2, 128) float32: small integers times per-block powers of two
    2^-6 .. 2^6 (every block's byte differs from its neighbours'), one zero block, one NaN block."""
    rng = np.random.default_rng(20264)
    out = []
    for shape, dtype in (((2, 96, 3, 64), jnp.bfloat16), ((1, 288, 2, 128), jnp.float32)):
        b, length, heads, h = shape
        x = rng.integers(-3, 4, size=shape).astype(np.float32)
        e = _bytes(b, length, heads, h, -6, 6, 3).astype(np.float32) - 127
        x *= np.exp2(np.repeat(np.repeat(e, 32, axis=1), 32, axis=3))
        x[0, :32, 0, :32] = 0.0
        x[-1, -32:, -1, -32:] = np.nan
        out.append(jnp.asarray(x, dtype))
    return tuple(out)


def _producer_kernel(ops: tuple, path: str) -> tuple:
    out = []
    for x, rounding in zip(ops, ("up", "floor"), strict=True):
        mx, op = attention_operands_sm100(x, scale_rounding=rounding, path=path)
        out += [mx.data, mx.scale, op.sf_hd, op.sf_seq]
    return tuple(out)


def _producer_expected(ops: tuple, got: tuple) -> tuple:
    return tuple(y for x, r in zip(ops, ("up", "floor"), strict=True) for y in emulate_attention_operands(x, r))


self_test.register(
    self_test.SelfTestFamily(
        name=OPERANDS_FAMILY,
        archs=registry.AttentionOperandsSm100Config.archs,
        problem="x (2, 96, 3, 64) bf16 'up', (1, 288, 2, 128) f32 'floor'; per-block powers of two, a zero and a "
        "NaN block: data, square, 'hd' and 'seq' bytes (padding included) bit-exact vs the emulation",
        inputs=_producer_inputs,
        kernel=_producer_kernel,
        expected=_producer_expected,
    )
)
