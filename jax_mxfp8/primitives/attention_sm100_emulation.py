"""The Blackwell (sm_100a / sm_100f) attention forward's arithmetic in XLA (layer 5): the oracle the kernel
will be held to, and the "emulated" implementation's body on the Blackwell dispatch.

  emulate_fwd_sm100(q, k, v, lens, *, causal, scale, p_scale="const", domain="log2")
      -> (o (B, T, N, H) float32, lse (B, N, T) float32)

Operands (attention_sm100_operands.py): q (B | 1, T, N, H), k and v (B, S, K, H) Sm100Operands, E4M3 data as
quantized (square 32x32 blocks over (sequence, head_dim)) with q's and k's "hd" scales (S = Q K^T contracts
head_dim) and v's "seq" scales (O = P V contracts the keys). lens: (2, B) int32 query / key lengths, or None
(= T, S). q of batch 1 with k, v of batch B is broadcast_query_attention's one query for every batch row.
Head n reads KV head n // (N / K) (GQA / MQA).

What the kernel computes, per (128-query tile, 128-key tile), keys in ascending order (the reference's order;
docs/perf/blackwell-attention.md "Forward"):
  acc = Q K^T by the block-scaled MMA (E4M3 x E4M3 x 2^(sQ + sK), float32 accumulation in TMEM);
  t = round(acc * c) once (c = fl(tau log2 e)), -inf where masked (causal: key > query; key >= kv_len);
  m = running row max of t (exact: no rescale lag), alpha = 2^(m_old - m);
  P~ = 2^(t - m) <= 1 (t - m <= 0 exactly: the max reads the same rounded t), l = alpha l + sum(P~);
  P = E4M3(2^8 P~) with scale byte 0x77 ("const"), or per 32 keys E4M3(P~ 2^(127 - b)) with b the "up" byte
    of the 32 keys' amax ("block": the contract's block scale itself, applied by the MMA);
  O = alpha O + P V (block-scaled MMA; the correction warps multiply by alpha);
  epilogue: O / l (IEEE division), LSE = (m + log2 l) ln 2; rows with no valid key: O = 0, LSE = -inf.
domain="natural" runs the same steps with the reference's exponent, S = round(acc * tau) and e^(S - m): then
every operation is the XLA reference's (reference/attention_fwd.py) and the results are equal to it bit for
bit, which pins the operand decoding, masking, tile order, P quantization and rescaling to the contract.
domain="log2" (the kernel) differs from it only in the exponent: t = round(acc * c) carries one float32
rounding of the product with c (relative 2^-24 of |t|), so P~ moves by up to (|t| + |m|) 2^-24 ln 2 relative
(plus the hardware ex2.approx's 2^-22, which XLA's exp2 does not model) and a P element can move by one E4M3
step where that crosses a rounding boundary; tests/attention/test_attention_sm100_emulation.py bounds O elementwise.
Float32 summation orders (inside the MMA, the row sum's tree) are XLA's, not the hardware's: last-bit level.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_mxfp8.config.attention import P_SCALES
from jax_mxfp8.primitives.attention_sm100_operands import Sm100Operand, operand_values
from jax_mxfp8.primitives.attention_sm100_quant import quantize_p_const, quantize_rows
from jax_mxfp8.reference.attention_tiling import Masking, mm, tile_logits

DOMAINS = ("log2", "natural")
KV_TILE = 128
LOG2E = float(np.log2(np.e))


def check_options(p_scale: str, domain: str) -> None:
    if p_scale not in P_SCALES:
        raise ValueError(f"p_scale={p_scale!r} is not one of {P_SCALES}")
    if domain not in DOMAINS:
        raise ValueError(f"domain={domain!r} is not one of {DOMAINS}")


def exponent(domain: str, scale: float):
    """(the logits' factor, the exponential, the LSE from (m, l)) of a domain: the kernel's base 2 with
    fl(tau log2 e), or the reference's base e with tau."""
    if domain == "natural":
        return np.float32(scale), jnp.exp, lambda m, lsum: m + jnp.log(lsum)
    ln2 = np.float32(np.log(2.0))
    return np.float32(scale * LOG2E), jnp.exp2, lambda m, lsum: (m + jnp.log2(lsum)) * ln2


def quantize_p(p: jax.Array, p_scale: str, axis: int) -> jax.Array:
    """The P operand's MX values: "const" E4M3(2^8 P~) 2^-8, "block" 1x32 blocks along `axis` (the GEMM's
    contracting axis: keys for P V, queries for the backward's P^T dO)."""
    return quantize_p_const(p) if p_scale == "const" else quantize_rows(p, axis)[1]


def head_major(x: jax.Array, groups: int) -> jax.Array:
    """(B, L, N, H) -> (B, K, G, L, H) with N = K * G (query heads grouped under their KV head); G = 1 gives
    (B, K, 1, L, H), which callers squeeze for keys and values."""
    b, length, n, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, n // groups, groups, length, h)


def lengths(lens: jax.Array | None, b: int, t: int, s: int) -> tuple[jax.Array, jax.Array]:
    """(q_len, kv_len) (B,) int32 from lens (2, B) or None (= T, S)."""
    if lens is None:
        return jnp.full((b,), t, jnp.int32), jnp.full((b,), s, jnp.int32)
    lens = jnp.asarray(lens, jnp.int32)
    if lens.shape != (2, b):
        raise ValueError(f"lens must be (2, B) = (2, {b}) int32 (query, key lengths); got {lens.shape}")
    return lens[0], lens[1]


def emulate_fwd_sm100(
    q: Sm100Operand,
    k: Sm100Operand,
    v: Sm100Operand,
    lens: jax.Array | None,
    *,
    causal: bool,
    scale: float,
    p_scale: str = "const",
    domain: str = "log2",
) -> tuple[jax.Array, jax.Array]:
    """The sm100 forward kernel's arithmetic (module docstring). Returns o (B, T, N, H) float32 (0 on rows
    with no valid key, rows >= q_len included) and lse (B, N, T) float32 (natural log; -inf there)."""
    check_options(p_scale, domain)
    bq, t, n, h = q.data.shape
    b, s, n_kv, _ = k.data.shape
    if bq not in (1, b) or v.data.shape != k.data.shape or n % n_kv:
        raise ValueError(f"q {q.data.shape} / k {k.data.shape} / v {v.data.shape}: not an attention problem")
    g = n // n_kv
    qv = operand_values(q, "hd")[:, :t]  # the kernel's rows past T are never stored: compute only T rows
    qv = jnp.broadcast_to(qv, (b,) + qv.shape[1:])
    q5 = head_major(qv, g)  # (B, K, G, T, H)
    k4 = head_major(operand_values(k, "hd"), 1)[:, :, 0]  # (B, K, Sp, H), rows past S zero
    v4 = head_major(operand_values(v, "seq"), 1)[:, :, 0]
    sp = k4.shape[2]
    q_len, kv_len = lengths(lens, b, t, s)
    masking = Masking(is_causal=causal, s_real=sp, q_len=q_len, kv_len=kv_len, mask=None, bias=None)
    factor, ex, lse_of = exponent(domain, scale)

    def tiles(x):
        return jnp.moveaxis(x.reshape(b, n_kv, sp // KV_TILE, KV_TILE, h), 2, 0)

    def step(carry, xs):
        m, lsum, acc = carry
        k_t, v_t, j = xs
        logits = tile_logits(q5, k_t, j, masking, None, None, scale=float(factor))  # round(acc * c), -inf masked
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # no valid key yet: exponentiate against 0
        p = ex(logits - m_use[..., None])
        alpha = ex(m - m_use)
        lsum = alpha * lsum + jnp.sum(p, axis=-1)
        acc = alpha[..., None] * acc + mm("bkgts,bksh->bkgth", quantize_p(p, p_scale, -1), v_t)
        return (m_new, lsum, acc), None

    init = (
        jnp.full(q5.shape[:-1], -jnp.inf, jnp.float32),
        jnp.zeros(q5.shape[:-1], jnp.float32),
        jnp.zeros(q5.shape, jnp.float32),
    )
    xs = (tiles(k4), tiles(v4), jnp.arange(sp // KV_TILE, dtype=jnp.int32))
    (m, lsum, acc), _ = lax.scan(step, init, xs)
    has = lsum != 0  # NaN (a NaN operand) is not 0: it propagates to O and LSE
    o = jnp.where(has[..., None], acc / jnp.where(has, lsum, 1.0)[..., None], 0.0)
    lse = jnp.where(has, lse_of(m, jnp.where(has, lsum, 1.0)), -jnp.inf)
    return o.reshape(b, n, t, h).transpose(0, 2, 1, 3), lse.reshape(b, n, t)
