"""Context parallelism: MXFP8 ring attention over one mesh axis, forward and backward.

The sequence axis of Q, K and V is split over the devices of `axis_name`. Each device keeps its Q chunk
and passes its K/V chunk around the ring with `lax.ppermute` (as the MXFP8 bytes and E8M0 scales, not as
float); every step attends the local queries to the visiting keys and merges the partial result through the
log-sum-exp: O = sum_i exp(LSE_i - LSE) O_i with LSE = log sum_i exp(LSE_i).

Backward (the flash-attention / ring-attention standard): with the final O and LSE, every step recomputes
P = exp(S - LSE) for its chunk pair and produces dQ (accumulated where Q lives) and dK/dV contributions for
the visiting chunk; those travel with the K/V around the ring and arrive at their owner after the last step.

Causal attention with `load_balance=True` uses the zigzag layout: the sequence is cut into 2n chunks and
device i holds chunks i and 2n-1-i, so every device does the same work at every ring step (the diagonal
step is local causal attention; every other step is one half of the pairs: all local queries against the
visiting first chunk, or the second local chunk against both visiting chunks). Chunk pairs that are fully
masked are skipped.

Numerics. Q, K and V are quantized on their own device in the config's block layout (32x32 square blocks
over (sequence, head_dim) by default); with every chunk a multiple of 32 long, no block spans two chunks, so
Q^, K^ and V^ are bit-identical to the single-device ones. Each step calls the reference forward and
backward (`reference/attention_fwd.py`, `attention_bwd.py`) on its chunk pair. The forward's P~ = exp(S - m)
is quantized against each step's own running max m (not the one over the KV tiles seen so far on one
device), so O differs from the single-device result by a rounding of P~ (ring and single device are equally
close to float64 attention); given the same O and LSE the backward is the single-device math up to float32
summation order. docs/distributed.md gives the measured agreement.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from jax_mxfp8.config.attention import AttentionConfig, operand_layouts
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.quantize import dequantize
from jax_mxfp8.ops.attention_checks import check_config, check_qkv_shapes, check_scale
from jax_mxfp8.ops.cotangents import remat_safe
from jax_mxfp8.parallel.fsdp import pack_bytes, unpack_bytes
from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_fwd import attention_fwd
from jax_mxfp8.reference.attention_quant import quantize_operand
from jax_mxfp8.reference.attention_tiling import Masking

# What one ring step computes for its (local Q, visiting KV) chunk pair.
FULL = "full"  # every query sees every key
DIAG = "diag"  # the device's own K/V: causal within the local (position-ordered) chunks
LOWER = "lower"  # zigzag, visiting device before this one: all local queries vs the visiting first chunk
UPPER = "upper"  # zigzag, visiting device after this one: the local second chunk vs both visiting chunks
SKIP = "skip"  # contiguous causal, visiting device after this one: fully masked


def _shard_map(f, mesh, in_specs, out_specs):
    """jax.shard_map without replication checks (jax >= 0.8), or the experimental one on older jax."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover (old jax)

    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


@dataclasses.dataclass(frozen=True)
class _Static:
    """Hashable trace-time facts of one call (the custom_vjp's non-differentiable argument)."""

    config: AttentionConfig
    scale: float
    is_causal: bool
    zigzag: bool
    axis_name: str
    n: int  # devices on axis_name
    group: int  # G = N // K query heads per KV head
    out_dtype: np.dtype


# ---------------------------------------------------------------------------------------------------------
# Layout helpers (local shards): BTNH / BSKH <-> head-major (B, K, G, T, H) / (B, K, S, H)
# ---------------------------------------------------------------------------------------------------------


def _q_to_hm(x, group):
    b, t, n, h = x.shape
    return x.reshape(b, t, n // group, group, h).transpose(0, 2, 3, 1, 4)


def _q_from_hm(x):
    b, k, g, t, h = x.shape
    return x.transpose(0, 3, 1, 2, 4).reshape(b, t, k * g, h)


def _kv_to_hm(x):
    return x.transpose(0, 2, 1, 3)


def _halves(x, axis):
    c = x.shape[axis] // 2
    return lax.slice_in_dim(x, 0, c, axis=axis), lax.slice_in_dim(x, c, 2 * c, axis=axis)


def _zigzag_perms(n: int):
    """ppermute pairs moving the natural chunks (2d, 2d+1) of device d to their zigzag devices.

    Zigzag device j holds chunks j and 2n-1-j; chunk c lives on device c if c < n, else on 2n-1-c. Both
    maps d -> home(2d) and d -> home(2d+1) are permutations of the devices.
    """

    def home(c):
        return c if c < n else 2 * n - 1 - c

    return [(d, home(2 * d)) for d in range(n)], [(d, home(2 * d + 1)) for d in range(n)]


def _to_zigzag(x, axis, st: _Static):
    """Local natural-order shard (chunks 2d, 2d+1) -> local zigzag shard (chunks j, 2n-1-j) along `axis`."""
    perm_a, perm_b = _zigzag_perms(st.n)
    first, second = _halves(x, axis)
    even = lax.axis_index(st.axis_name) % 2 == 0
    got_a = lax.ppermute(first, st.axis_name, perm_a)  # an even chunk
    got_b = lax.ppermute(second, st.axis_name, perm_b)  # an odd chunk
    # Chunk j has j's parity and chunk 2n-1-j the other one.
    return jnp.concatenate([jnp.where(even, got_a, got_b), jnp.where(even, got_b, got_a)], axis=axis)


def _from_zigzag(x, axis, st: _Static):
    """Inverse of _to_zigzag."""
    perm_a, perm_b = _zigzag_perms(st.n)
    inv_a = [(dst, src) for src, dst in perm_a]
    inv_b = [(dst, src) for src, dst in perm_b]
    slot0, slot1 = _halves(x, axis)
    even = lax.axis_index(st.axis_name) % 2 == 0
    first = lax.ppermute(jnp.where(even, slot0, slot1), st.axis_name, inv_a)
    second = lax.ppermute(jnp.where(even, slot1, slot0), st.axis_name, inv_b)
    return jnp.concatenate([first, second], axis=axis)


# ---------------------------------------------------------------------------------------------------------
# Quantized operands and their trip around the ring
# ---------------------------------------------------------------------------------------------------------


def _operand_keys(config: AttentionConfig) -> dict[str, str]:
    """GEMM use (q_s, k_s, v_o, v_dp, q_dk, k_dq) -> "operand:layout" of the quantization it reads."""
    return {use: f"{use[0]}:{layout}" for use, layout in dataclasses.asdict(operand_layouts(config)).items()}


def _quantize_local(st: _Static, q_hm, k_hm, v_hm) -> dict[str, MXArray]:
    raw = {"q": q_hm, "k": k_hm, "v": v_hm}
    out = {}
    for key in sorted(set(_operand_keys(st.config).values())):
        name, layout = key.split(":")
        out[key] = quantize_operand(raw[name], layout, st.config.scale_rounding)
    return out


def _ring_perm(n: int):
    return [(i, (i + 1) % n) for i in range(n)]


def _rotate(tree, st: _Static):
    """Sends every array of `tree` to the next device of the ring; MXArrays travel as their FP8 bytes."""

    def send(x):
        return lax.ppermute(x, st.axis_name, _ring_perm(st.n))

    def one(x):
        if isinstance(x, MXArray):
            data = unpack_bytes(send(pack_bytes(x.data)), x.data.dtype)
            return dataclasses.replace(x, data=data, scale=send(x.scale))
        return send(x)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, MXArray))


def _deq(x: MXArray) -> jax.Array:
    return dequantize(x, jnp.float32)


# ---------------------------------------------------------------------------------------------------------
# One ring step: forward and backward on a chunk pair, through the reference implementation
# ---------------------------------------------------------------------------------------------------------


def _masking(is_causal: bool, s_len: int) -> Masking:
    return Masking(is_causal=is_causal, s_real=s_len, q_len=None, kv_len=None, mask=None, bias=None)


def _fwd_pair(st: _Static, kind: str, q, k, v):
    """Partial (O, LSE) of local queries q (B,K,G,T,H) against visiting k, v (B,K,S,H), float32.

    Rows that see no key get O = 0 and LSE = -inf (they drop out of the merge).
    """
    rows = q.shape[:-1]
    if kind == SKIP:
        return jnp.zeros(q.shape, jnp.float32), jnp.full(rows, -jnp.inf, jnp.float32)
    if kind == UPPER:
        q_lo, q_hi = _halves(q, -2)
        o_hi, lse_hi = _fwd_pair(st, FULL, q_hi, k, v)
        return (
            jnp.concatenate([jnp.zeros(q_lo.shape, jnp.float32), o_hi], axis=-2),
            jnp.concatenate([jnp.full(q_lo.shape[:-1], -jnp.inf, jnp.float32), lse_hi], axis=-1),
        )
    if kind == LOWER:
        k, v = _halves(k, -2)[0], _halves(v, -2)[0]
    masking = _masking(kind == DIAG, k.shape[-2])
    return attention_fwd(q, k, v, masking, scale=st.scale, config=st.config)


def _merge(o1, lse1, o2, lse2):
    """Merges two normalized partial outputs through their log-sum-exps (-inf = no keys seen)."""
    lse = jnp.logaddexp(lse1, lse2)
    base = jnp.where(lse == -jnp.inf, 0.0, lse)
    w1, w2 = jnp.exp(lse1 - base), jnp.exp(lse2 - base)
    return w1[..., None] * o1 + w2[..., None] * o2, lse


def _bwd_pair(st: _Static, kind: str, q_s, q_dk, k_s, v_dp, k_dq, o, lse, do, dlse):
    """(dQ, dK, dV) float32 contributions of one chunk pair, given the final O and LSE of the local rows."""
    if kind == SKIP:
        return jnp.zeros(q_s.shape, jnp.float32), jnp.zeros(k_s.shape, jnp.float32), jnp.zeros(v_dp.shape, jnp.float32)
    if kind == UPPER:
        hi = [_halves(x, -2)[1] for x in (q_s, q_dk, o, do)]
        lse_hi, dlse_hi = _halves(lse, -1)[1], _halves(dlse, -1)[1]
        dq_hi, dk, dv = _bwd_pair(st, FULL, hi[0], hi[1], k_s, v_dp, k_dq, hi[2], lse_hi, hi[3], dlse_hi)
        return jnp.concatenate([jnp.zeros(dq_hi.shape, jnp.float32), dq_hi], axis=-2), dk, dv
    if kind == LOWER:
        first = [_halves(x, -2)[0] for x in (k_s, v_dp, k_dq)]
        dq, dk, dv = _bwd_pair(st, FULL, q_s, q_dk, *first, o, lse, do, dlse)
        pad = [(0, 0)] * (dk.ndim - 2) + [(0, dk.shape[-2]), (0, 0)]
        return dq, jnp.pad(dk, pad), jnp.pad(dv, pad)
    masking = _masking(kind == DIAG, k_s.shape[-2])
    dq, dk, dv, _ = attention_bwd(
        q_s, k_s, v_dp, q_dk, k_dq, o, lse, do, dlse, masking, scale=st.scale, config=st.config
    )
    return dq, dk, dv


def _kinds(st: _Static) -> tuple[str, str, str]:
    """(kind of step 0, kind when the visiting device precedes this one, kind when it follows)."""
    if not st.is_causal:
        return FULL, FULL, FULL
    if st.zigzag:
        return DIAG, LOWER, UPPER
    return DIAG, FULL, SKIP


def _off_diagonal(st: _Static, fn, step):
    """Runs fn(kind) for ring step `step` >= 1 on this device: the visiting K/V come from device
    (i - step) mod n, which precedes device i exactly when step <= i."""
    _, before, after = _kinds(st)
    if before == after:
        return fn(before)
    precedes = step <= lax.axis_index(st.axis_name)
    return lax.cond(precedes, lambda: fn(before), lambda: fn(after))


# ---------------------------------------------------------------------------------------------------------
# The ring (inside shard_map), with a custom_vjp
# ---------------------------------------------------------------------------------------------------------


def _ring_fwd(st: _Static, q, k, v):
    keys = _operand_keys(st.config)
    quants = _quantize_local(st, _q_to_hm(q, st.group), _kv_to_hm(k), _kv_to_hm(v))
    qs = _deq(quants[keys["q_s"]])
    kv0 = {key: quants[key] for key in {keys["k_s"], keys["v_o"]}}

    def step(kv, kind):
        return _fwd_pair(st, kind, qs, _deq(kv[keys["k_s"]]), _deq(kv[keys["v_o"]]))

    # Step s attends to the K/V of device (i - s) mod n. The next chunk is sent while this one is used.
    o, lse = step(kv0, _kinds(st)[0])
    if st.n > 1:
        kv = _rotate(kv0, st)

        def body(carry, s):
            kv, o, lse = carry
            kv_next = _rotate(kv, st)
            o, lse = _merge(o, lse, *_off_diagonal(st, functools.partial(step, kv), s))
            return (kv_next, o, lse), None

        (kv, o, lse), _ = lax.scan(body, (kv, o, lse), jnp.arange(1, st.n - 1, dtype=jnp.int32))
        o, lse = _merge(o, lse, *_off_diagonal(st, functools.partial(step, kv), st.n - 1))
    o = _q_from_hm(o).astype(st.out_dtype)
    b, n_kv, g, t = lse.shape
    lse = lse.reshape(b, n_kv * g, t)
    return (o, lse), (quants, o, lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(st: _Static, q, k, v):
    return _ring_fwd(st, q, k, v)[0]


def _ring_bwd(st: _Static, res, cts):
    quants, o, lse = res
    do, dlse = cts
    keys = _operand_keys(st.config)
    b, n, t = lse.shape
    hm = (b, n // st.group, st.group, t)
    o_hm = _q_to_hm(o, st.group)
    lse_hm, dlse_hm = lse.reshape(hm), dlse.astype(jnp.float32).reshape(hm)
    do_hm = _q_to_hm(do.astype(jnp.float32), st.group)
    q_s, q_dk = _deq(quants[keys["q_s"]]), _deq(quants[keys["q_dk"]])
    kv0 = {key: quants[key] for key in {keys["k_s"], keys["v_dp"], keys["k_dq"]}}

    def step(kv, kind):
        k_s, v_dp, k_dq = (_deq(kv[keys[use]]) for use in ("k_s", "v_dp", "k_dq"))
        return _bwd_pair(st, kind, q_s, q_dk, k_s, v_dp, k_dq, o_hm, lse_hm, do_hm, dlse_hm)

    # dQ stays here; the dK/dV of a K/V chunk travel with it and reach its owner after one more hop.
    dq, dk, dv = step(kv0, _kinds(st)[0])
    if st.n > 1:
        kv = _rotate(kv0, st)

        def accumulate(kv, s, dq, dkv):
            dkv = _rotate(dkv, st)
            dq_c, dk_c, dv_c = _off_diagonal(st, functools.partial(step, kv), s)
            return dq + dq_c, (dkv[0] + dk_c, dkv[1] + dv_c)

        def body(carry, s):
            kv, dq, dkv = carry
            kv_next = _rotate(kv, st)
            dq, dkv = accumulate(kv, s, dq, dkv)
            return (kv_next, dq, dkv), None

        (kv, dq, dkv), _ = lax.scan(body, (kv, dq, (dk, dv)), jnp.arange(1, st.n - 1, dtype=jnp.int32))
        dq, dkv = accumulate(kv, st.n - 1, dq, dkv)
        dk, dv = _rotate(dkv, st)
    dq = _q_from_hm(dq).astype(st.out_dtype)
    dk = _kv_to_hm(dk).astype(st.out_dtype)  # (B, K, S, H) -> (B, S, K, H): the same transpose
    dv = _kv_to_hm(dv).astype(st.out_dtype)
    return dq, dk, dv


_ring.defvjp(*remat_safe(_ring_fwd, _ring_bwd))  # FP8 residuals as bits (ops/cotangents.py: remat)


@dataclasses.dataclass(frozen=True)
class _Call:
    """Static facts of a public call: the mesh and the shard_map specs, plus the ring's own facts."""

    ring: _Static
    mesh: jax.sharding.Mesh
    qkv_spec: P
    lse_spec: P


def _sharded(call: _Call, q, k, v):
    st = call.ring

    def body(q, k, v):
        if st.zigzag:
            q, k, v = (_to_zigzag(x, 1, st) for x in (q, k, v))
        o, lse = _ring(st, q, k, v)
        if st.zigzag:
            o, lse = _from_zigzag(o, 1, st), _from_zigzag(lse, 2, st)
        return o, lse

    specs = (call.qkv_spec,) * 3
    return _shard_map(body, call.mesh, specs, (call.qkv_spec, call.lse_spec))(q, k, v)


_sharded_jit = jax.jit(_sharded, static_argnums=(0,))


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def _axes_size(mesh, axes, name: str) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    for a in names:
        if a not in mesh.axis_names:
            raise ValueError(f"{name}={axes!r}: {a!r} is not an axis of the mesh {tuple(mesh.axis_names)}")
    return math.prod(mesh.shape[a] for a in names)


def _as_operand(x, name: str):
    if isinstance(x, MXArray):
        raise ValueError(f"{name} is an MXArray; ring_attention takes float arrays (it quantizes each shard)")
    x = jnp.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"{name} must have rank 4 (BTNH / BSKH); got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating) or np.dtype(x.dtype).itemsize < 2:
        raise ValueError(f"{name} has dtype {x.dtype}; pass float32, bfloat16 or float16")
    return x


def ring_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    mesh: jax.sharding.Mesh,
    axis_name: str,
    is_causal: bool = False,
    scale: float | None = None,
    config: AttentionConfig | None = None,
    load_balance: bool = True,
    batch_axis=None,
    head_axis=None,
    return_residual: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """MXFP8 attention with the sequence split over mesh axis `axis_name` (context parallelism).

    Computes what `jax_mxfp8.dot_product_attention(query, key, value, is_causal=..., scale=..., config=...)`
    computes on one device (same quantization of Q, K, V, dO and dS; see the module docstring for the one
    difference, the running max P~ is quantized against), with K/V chunks passed around a ring of
    collective-permutes instead of being all-gathered. Differentiable in query, key and value.

    Args:
      query: (B, T, N, H) global array; its sequence axis is split over `axis_name` (under jit it may arrive
        with any sharding; shard_map lays it out as P(batch_axis, axis_name, head_axis, None)).
      key, value: (B, S, K, H), N a multiple of K (GQA). Causal attention needs S == T.
      mesh: the device mesh. axis_name: the mesh axis the sequence is split over (n devices).
      is_causal: query t sees key s <= t.
      scale: softmax scale (a Python number); default 1 / sqrt(H).
      config: AttentionConfig (default AttentionConfig()).
      load_balance: for causal attention, the zigzag layout (device i computes on sequence chunks i and
        2n-1-i of 2n) so that all devices do equal work; inputs and outputs stay in natural order (the
        reordering is two collective-permutes per tensor). Ignored when not causal.
      batch_axis, head_axis: mesh axis (or tuple of axes) that the batch / head axes are split over, or None
        (replicated). head_axis must divide K.
      return_residual: also return the float32 log-sum-exp, (B, N, T).

    Every device's chunk must be a multiple of 32 long so that MX blocks never span two devices: T and S
    must be multiples of 32 * n (32 * 2n for load-balanced causal attention).

    Returns:
      The output (B, T, N, H) in query's dtype (and the LSE with return_residual=True), sharded like query.
    """
    config = check_config(config, is_causal)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name={axis_name!r} is not an axis of the mesh {tuple(mesh.axis_names)}")
    q, k, v = _as_operand(query, "query"), _as_operand(key, "key"), _as_operand(value, "value")
    b, t, n, h, s, n_kv = check_qkv_shapes(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"query, key and value must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if is_causal and s != t:
        raise ValueError(f"causal ring attention needs key length S={s} equal to query length T={t}")

    ring_size = mesh.shape[axis_name]
    zigzag = bool(is_causal and load_balance and ring_size > 1)
    chunks = 2 * ring_size if zigzag else ring_size
    how = f"{chunks} chunks ({'load-balanced causal: 2 per device' if zigzag else 'one per device'})"
    for name, length in (("query", t), ("key", s)):
        if length % (chunks * BLOCK_SIZE) or length == 0:
            raise ValueError(
                f"{name} sequence length {length} (axis 1) must split over mesh axis {axis_name!r} of size "
                f"{ring_size} into {how} of a multiple of {BLOCK_SIZE}: a multiple of {chunks * BLOCK_SIZE}"
            )
    for ax in (batch_axis, head_axis):
        names = () if ax is None else ((ax,) if isinstance(ax, str) else tuple(ax))
        if axis_name in names:
            raise ValueError(f"axis_name={axis_name!r} cannot also split the batch or head axis")
    if b % _axes_size(mesh, batch_axis, "batch_axis"):
        raise ValueError(f"batch size {b} is not divisible by the size of batch_axis={batch_axis!r}")
    if n_kv % _axes_size(mesh, head_axis, "head_axis"):
        raise ValueError(f"key/value heads {n_kv} are not divisible by the size of head_axis={head_axis!r}")

    scale = check_scale(scale, h)
    if b == 0:  # nothing to compute (docs/numerics.md "Zero-size inputs")
        out, lse = jnp.zeros(q.shape, q.dtype), jnp.zeros((0, n, t), jnp.float32)
        return (out, lse) if return_residual else out

    ring = _Static(
        config=config,
        scale=scale,
        is_causal=bool(is_causal),
        zigzag=zigzag,
        axis_name=axis_name,
        n=ring_size,
        group=n // n_kv,
        out_dtype=np.dtype(q.dtype),
    )
    call = _Call(
        ring=ring,
        mesh=mesh,
        qkv_spec=P(batch_axis, axis_name, head_axis, None),
        lse_spec=P(batch_axis, head_axis, axis_name),
    )
    out, lse = _sharded_jit(call, q, k, v)
    return (out, lse) if return_residual else out
