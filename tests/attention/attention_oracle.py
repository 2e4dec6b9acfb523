"""Independent float64 NumPy models of attention, for the attention tests and benchmarks.

* `exact_attention`: unquantized softmax attention and its analytic gradients (the SQNR yardstick).
* `mx_attention`: an emulation of the MXFP8 numerics contract (docs/numerics.md "The contract"
  and "Attention") written from the contract, not from the library: its own E8M0/E4M3 quantizer
  (np.frexp exponents, np.round half-even on an explicit grid spacing), a Python loop over (batch, head)
  and KV tiles, float64 GEMMs. It imports neither jax nor jax_mxfp8.

Layouts follow jax.nn: q (B, T, N, H), k and v (B, S, K, H); masks (B, N, T, S) bool.
"""

from __future__ import annotations

import dataclasses

import numpy as np

E4M3_MAX, E4M3_EMAX, E4M3_EMIN, E4M3_MBITS = 448.0, 8, -6, 3


# ---------------------------------------------------------------------------------------------------------
# MX quantization (float64)
# ---------------------------------------------------------------------------------------------------------


def _round_e4m3(y: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even onto the E4M3 grid (|y| <= 448 assumed), subnormals included."""
    mag = np.abs(y)
    _, e = np.frexp(mag)  # mag = m * 2^e, m in [0.5, 1): binade exponent is e - 1
    e = np.maximum(e - 1, E4M3_EMIN)
    spacing = np.ldexp(1.0, e - E4M3_MBITS)
    return np.sign(y) * np.round(mag / spacing) * spacing


def _scale_exp(amax: np.ndarray, rounding: str) -> np.ndarray:
    """Unbiased scale exponent per block: 'up' = ceil(log2(fp32(amax / 448))), 'floor' = floor(log2 amax) - 8."""
    amax32 = amax.astype(np.float32)
    if rounding == "up":
        with np.errstate(under="ignore"):
            v = (amax32 / np.float32(E4M3_MAX)).astype(np.float64)  # the contract's float32 quotient
        m, e = np.frexp(v)
        e = np.where(m == 0.5, e - 1, e)  # exact powers of two keep their exponent, others round up
        e = np.where(v == 0, -127, e)
    else:
        _, e = np.frexp(amax32.astype(np.float64))
        e = np.where(amax32 == 0, -127, e - 1 - E4M3_EMAX)
    return np.clip(e, -127, 127)


def mx_fake_quant(x: np.ndarray, axes: tuple[int, ...], rounding: str = "up") -> np.ndarray:
    """Fake-quantizes x with blocks of 32 along each axis in `axes` (one axis: row blocks; two: square)."""
    x = np.asarray(x, np.float64)
    shape = x.shape
    axes = tuple(sorted(a % x.ndim for a in axes))
    split, inner = [], []
    for i, d in enumerate(shape):
        if i in axes:
            assert d % 32 == 0, (shape, axes)
            split += [d // 32, 32]
            inner.append(len(split) - 1)
        else:
            split.append(d)
    xb = x.astype(np.float32).astype(np.float64).reshape(split)
    amax = np.max(np.abs(xb), axis=tuple(inner), keepdims=True)
    e = _scale_exp(amax, rounding)
    y = np.clip(xb / np.ldexp(1.0, e), -E4M3_MAX, E4M3_MAX)
    return (_round_e4m3(y) * np.ldexp(1.0, e)).reshape(shape)


def quant_p_const(p: np.ndarray) -> np.ndarray:
    return _round_e4m3(p * 256.0) / 256.0


# ---------------------------------------------------------------------------------------------------------
# Exact attention (float64)
# ---------------------------------------------------------------------------------------------------------


def _valid(b, n, t, s, causal, mask, q_len, kv_len):
    ok = np.ones((b, n, t, s), bool)
    if causal:
        ok &= np.tril(np.ones((t, s), bool))[None, None]
    if mask is not None:
        ok &= np.broadcast_to(mask, ok.shape)
    if q_len is not None:
        ok &= (np.arange(t)[None, :] < np.asarray(q_len)[:, None])[:, None, :, None]
    if kv_len is not None:
        ok &= (np.arange(s)[None, :] < np.asarray(kv_len)[:, None])[:, None, None, :]
    return ok


def _heads(k, group):
    return np.repeat(np.asarray(k, np.float64), group, axis=2)


def exact_attention(q, k, v, do=None, *, scale=None, causal=False, mask=None, bias=None, q_len=None, kv_len=None):
    """float64 attention; returns (o, lse) or, with do, (o, lse, dq, dk, dv). Fully masked rows: o = 0."""
    q = np.asarray(q, np.float64)
    b, t, n, h = q.shape
    s, n_kv = k.shape[1], k.shape[2]
    g = n // n_kv
    scale = 1.0 / np.sqrt(h) if scale is None else scale
    kk, vv = _heads(k, g), _heads(v, g)
    logits = scale * np.einsum("btnh,bsnh->bnts", q, kk)
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    ok = _valid(b, n, t, s, causal, mask, q_len, kv_len)
    logits = np.where(ok, logits, -np.inf)
    m = np.max(logits, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(logits - m)
    lsum = e.sum(-1, keepdims=True)
    p = np.where(lsum > 0, e / np.where(lsum > 0, lsum, 1), 0.0)
    o = np.einsum("bnts,bsnh->btnh", p, vv)
    lse = np.where(lsum[..., 0] > 0, (m + np.log(np.where(lsum > 0, lsum, 1)))[..., 0], -np.inf)
    if do is None:
        return o, lse
    do = np.asarray(do, np.float64)
    dv = np.einsum("bnts,btnh->bsnh", p, do)
    dp = np.einsum("btnh,bsnh->bnts", do, vv)
    delta = np.einsum("btnh,btnh->bnt", do, o)[..., None]
    ds = p * (dp - delta)
    dq = scale * np.einsum("bnts,bsnh->btnh", ds, kk)
    dk = scale * np.einsum("bnts,btnh->bsnh", ds, q)
    fold = (b, s, n_kv, g, h)
    return o, lse, dq, dk.reshape(fold).sum(3), dv.reshape(fold).sum(3)


# ---------------------------------------------------------------------------------------------------------
# MXFP8 emulation (float64)
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EmuConfig:
    """Mirror of the library's AttentionConfig fields (kept separate: this module imports nothing of it)."""

    qkv_blocks: str = "square"
    p_scale: str = "const"
    dq_accum: str = "fp32"
    scale_rounding: str = "up"
    kv_tile: int = 128
    causal_safe: bool = False


def _layouts(cfg: EmuConfig) -> dict[str, tuple[int, ...]]:
    """Quantization axes of a (L, H) operand tile per GEMM use: (0, 1) square, (1,) head_dim, (0,) sequence."""
    sq, hd, seq = (0, 1), (1,), (0,)
    if cfg.qkv_blocks == "square":
        lay = dict(q_s=sq, k_s=sq, v_o=sq, v_dp=sq, q_dk=sq, k_dq=sq)
    else:
        lay = dict(q_s=hd, k_s=hd, v_o=seq, v_dp=hd, q_dk=seq, k_dq=seq)
    if cfg.causal_safe:
        lay.update(q_s=hd, k_s=hd, v_o=hd, v_dp=hd)
    return lay


def _fq_seq(x: np.ndarray, axes, length: int, rounding: str) -> np.ndarray:
    """Fake-quantizes a (L, H) operand of which only the first `length` rows are valid (zeros after)."""
    y = np.zeros_like(x, dtype=np.float64)
    pad = -(-max(length, 1) // 32) * 32
    buf = np.zeros((pad, x.shape[1]))
    buf[:length] = x[:length]
    y[: min(pad, x.shape[0])] = mx_fake_quant(buf, axes, rounding)[: x.shape[0]]
    y[length:] = 0.0
    return y


def _p_quant(p: np.ndarray, axis: int, cfg: EmuConfig) -> np.ndarray:
    return quant_p_const(p) if cfg.p_scale == "const" else mx_fake_quant(p, (axis,), cfg.scale_rounding)


def mx_attention(
    q,
    k,
    v,
    do=None,
    *,
    cfg: EmuConfig = EmuConfig(),
    scale=None,
    causal=False,
    mask=None,
    q_len=None,
    kv_len=None,
):
    """float64 emulation of the MXFP8 attention contract, one (batch, head) at a time.

    Returns (o, lse) or, with do, (o, lse, dq, dk, dv). Positions past q_len / kv_len are padding (zeroed
    before quantization); fully masked rows give o = 0 and lse = -inf.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, n, h = q.shape
    s, n_kv = k.shape[1], k.shape[2]
    g = n // n_kv
    scale = 1.0 / np.sqrt(h) if scale is None else scale
    kt = cfg.kv_tile
    s_pad = -(-s // kt) * kt
    lay = _layouts(cfg)
    ok_all = _valid(b, n, t, s, causal, mask, q_len, kv_len)
    ql = [t if q_len is None else int(q_len[i]) for i in range(b)]
    kl = [s if kv_len is None else int(kv_len[i]) for i in range(b)]
    o = np.zeros((b, t, n, h))
    lse = np.full((b, n, t), -np.inf)
    grads = do is not None
    if grads:
        do = np.asarray(do, np.float64)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for bi in range(b):
        for hi in range(n):
            kvh = hi // g
            fq = {u: _fq_seq(q[bi, :, hi], ax, ql[bi], cfg.scale_rounding) for u, ax in lay.items() if u[0] == "q"}
            fk = {u: _fq_seq(k[bi, :, kvh], ax, kl[bi], cfg.scale_rounding) for u, ax in lay.items() if u[0] == "k"}
            fv = {u: _fq_seq(v[bi, :, kvh], ax, kl[bi], cfg.scale_rounding) for u, ax in lay.items() if u[0] == "v"}
            ok = np.zeros((t, s_pad), bool)
            ok[:, :s] = ok_all[bi, hi]
            kpad = {u: np.pad(a, ((0, s_pad - s), (0, 0))) for u, a in {**fk, **fv}.items()}
            # forward: online softmax over KV tiles
            m = np.full(t, -np.inf)
            lsum = np.zeros(t)
            acc = np.zeros((t, h))
            for j0 in range(0, s_pad, kt):
                sl = slice(j0, j0 + kt)
                st = np.where(ok[:, sl], scale * fq["q_s"] @ kpad["k_s"][sl].T, -np.inf)
                m_new = np.maximum(m, st.max(1))
                base = np.where(np.isfinite(m_new), m_new, 0.0)
                pt = np.exp(st - base[:, None])
                alpha = np.exp(m - base)
                lsum = alpha * lsum + pt.sum(1)
                acc = alpha[:, None] * acc + _p_quant(pt, 1, cfg) @ kpad["v_o"][sl]
                m = m_new
            has = lsum > 0
            o[bi, :, hi] = np.where(has[:, None], acc / np.where(has, lsum, 1)[:, None], 0.0)
            lse[bi, hi] = np.where(has, m + np.log(np.where(has, lsum, 1)), -np.inf)
            if not grads:
                continue
            dob = do[bi, :, hi].copy()
            dob[ql[bi] :] = 0.0
            doq = mx_fake_quant(dob, (0, 1), cfg.scale_rounding)
            delta = np.sum(dob * o[bi, :, hi], axis=1)
            base = np.where(np.isfinite(lse[bi, hi]), lse[bi, hi], 0.0)
            dq_acc = np.zeros((t, h))
            for j0 in range(0, s_pad, kt):
                sl = slice(j0, j0 + kt)
                st = np.where(ok[:, sl], scale * fq["q_s"] @ kpad["k_s"][sl].T, -np.inf)
                p = np.exp(st - base[:, None])
                dv_t = _p_quant(p, 0, cfg).T @ doq
                dp = doq @ kpad["v_dp"][sl].T
                ds = p * (dp - delta[:, None])
                dsq = mx_fake_quant(ds, (0, 1), "up")
                part = scale * (dsq @ kpad["k_dq"][sl])
                if cfg.dq_accum == "fp16":
                    dq_acc = (dq_acc + part * 4096.0).astype(np.float16).astype(np.float64)
                else:
                    dq_acc = dq_acc + part
                n_valid = min(kt, s - j0)
                dk[bi, j0 : j0 + n_valid, kvh] += (scale * dsq.T @ fq["q_dk"])[:n_valid]
                dv[bi, j0 : j0 + n_valid, kvh] += dv_t[:n_valid]
            dq[bi, :, hi] = dq_acc / 4096.0 if cfg.dq_accum == "fp16" else dq_acc
    if not grads:
        return o, lse
    return o, lse, dq, dk, dv


def sqnr_db(x, ref) -> float:
    """10 log10(|ref|^2 / |x - ref|^2) in float64; NaN if x holds a NaN (so a floor check fails)."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan")
    err = np.sum((x - ref) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref**2) / err))
