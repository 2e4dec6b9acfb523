"""FFI-backed Hopper MXFP8 attention forward (layer 5): the producer pass and the kernel call.

  prepare(q, k, v, *, scale, q_len, kv_len) -> AlignedOperands   XLA, head-major MXArrays; runs anywhere
  prepare_sequence_major(q, k, v, ...) -> AlignedOperands          the same from (B, L, N, H) MXArrays: exponents
                                                                   in XLA, FP8 data through the realign kernel
  attention_fwd(ops, *, causal, t, p_scale, p_rounding, tune=0)   the sm_90a kernel -> (o (B, T, N, H), lse);
                                                                   shards over batch and KV-head groups, vmaps
                                                                   into the batch
  emulate_fwd(ops, *, causal, t, p_scale, p_rounding) -> (o, lse)   the kernel's math in XLA, o (B, N, T, H)

The kernel (jax_mxfp8/kernels/sm90/attention_fwd.py) takes the contract's square-block MX operands
re-encoded to one exponent per GEMM sub-tile ("way (a)", docs/numerics.md "Hopper attention kernel"):

* Q, K: every 32-row block gets e_row = max of its H/32 block exponents; each element is re-rounded
  to E4M3 at that exponent: q' = RNE(q * 2^(e_block - e_row)), starting from the MX element q (so Q^ is
  reproduced wherever the shift loses nothing: exact unless an element drops below E4M3's normal range,
  error <= 2^-10 * 2^e_row per element).
* V: every (128-key tile, 32 head-dim columns) gets e_tile = max of its 4 block exponents; elements as
  above, stored transposed (B, K, H, Sp) with the keys of every 32-key chunk permuted by PV_PERMUTATION
  (the order the kernel's P fragment has them in).

P~ is quantized as the kernel does it: p_scale="const" stores E4M3(256 P~); "block" stores E4M3(P~ * 2^offset)
with one offset per (query row, 128-key tile) from the contract's block rule on the row-tile's amax
(p_tile_offset; docs/numerics.md "Hopper attention kernel" says why this reproduces the contract's 32-key
blocks except below 2^-6 of the row-tile scale).

Exponents are clamped to [-126, 126] so that 2^e and 2^-e are normal float32 numbers; finite float32 input
never produces a block exponent above 120 (docs/numerics.md), and raising a tiny exponent only flushes
elements below 2^-135 relative to the block, which E4M3 already rounds to 0. A block whose scale byte is
0xFF (NaN) makes its whole row block (Q, K) or tile column group (V) NaN.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.mxarray import MXArray
from jax_mxfp8.formats.scales import pow2
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import quantize as pq

TILE_M = 128  # query rows per CTA
TILE_N = 128  # keys per KV tile (AttentionConfig.kv_tile must equal it)
LOG2E = float(np.log2(np.e))
E_MIN, E_MAX = -126, 126
V_SPREAD = 64
"""V tile exponents are raised to at least (the largest of the sequence's column group) - V_SPREAD, so that
acc_O, kept in the current tile's units, stays far from float32 overflow (|acc| <= 2^off * S * 448 *
2^spread, off = 8 for p_scale "const", <= registry.P_OFFSET_MAX = 24 for "block"); elements of such raised
tiles lose only what lies 2^-70 below the sequence's largest V."""


def pv_permutation() -> np.ndarray:
    """Key (within a 32-key chunk) in 8-bit A-fragment k-slot a (registry.pv_permutation)."""
    return np.asarray(registry.pv_permutation())


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AlignedOperands:
    """The kernel's inputs (shapes with Tp, Sp = T, S rounded up to 128; N = K * G query heads)."""

    q: jax.Array  # (B, N, Tp, H) float8_e4m3fn
    k: jax.Array  # (B, K, Sp, H) float8_e4m3fn
    vt: jax.Array  # (B, K, H, Sp) float8_e4m3fn, keys permuted within 32
    qs: jax.Array  # (B, N, Tp/32) float32: tau * log2(e) * 2^eQ
    ks: jax.Array  # (B, K, Sp/32) float32: 2^eK
    vs: jax.Array  # (B, K, Sp/128 * H/32) float32: 2^eV
    vi: jax.Array  # (B, K, Sp/128 * H/32) float32: 2^-eV
    lens: jax.Array  # (2, B) int32: query lengths, KV lengths


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pad_seq(mx_data: jax.Array, mx_scale: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """Zero-pads (..., L, H) data and (..., L/32, H/32) scales along L to `length`."""
    extra = length - mx_data.shape[-2]
    if extra == 0:
        return mx_data, mx_scale
    pad = [(0, 0)] * (mx_data.ndim - 2) + [(0, extra), (0, 0)]
    spad = [(0, 0)] * (mx_scale.ndim - 2) + [(0, extra // 32), (0, 0)]
    return jnp.pad(mx_data, pad), jnp.pad(mx_scale, spad)


def _realign(data: jax.Array, shift: jax.Array) -> jax.Array:
    """RNE_E4M3(data * 2^shift), shift <= 0 per element (broadcast); shifts below -126 give 0."""
    x = decode_elements(data)
    f = jnp.where(shift >= E_MIN, pow2(jnp.maximum(shift, E_MIN)), 0.0)
    return (x * f).astype(jnp.float8_e4m3fn)


def _exponents(scale: jax.Array) -> tuple[jax.Array, jax.Array]:
    e = scale.astype(jnp.int32) - 127
    return e, scale == 255


def _row_exponents(scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(..., L/32, H/32) square-block scales of Q or K -> (e_row (..., L/32), nan_row, shift, nan) with
    shift = e_block - e_row (..., L/32, H/32) and nan the blocks' NaN flags."""
    e, nan = _exponents(scale)
    e_row = jnp.clip(jnp.max(jnp.where(nan, E_MIN, e), axis=-1), E_MIN, E_MAX)
    return e_row, jnp.any(nan, axis=-1), e - e_row[..., None], nan


def _sequence_max(e_tile: jax.Array, tile_seq: jax.Array | None) -> jax.Array:
    """(..., Sp/128, H/32) -> the largest e_tile of each tile's sequence: all tiles (tile_seq None), or the
    tiles with the same id in tile_seq (Sp/128,) (packed sequences: one sequence's V never moves another's)."""
    if tile_seq is None:
        return jnp.max(e_tile, axis=-2, keepdims=True)
    moved = jnp.moveaxis(e_tile, -2, 0)
    seg = jax.ops.segment_max(moved, tile_seq, num_segments=moved.shape[0], indices_are_sorted=True)
    return jnp.moveaxis(seg[tile_seq], 0, -2)


def _v_exponents(
    scale: jax.Array, tile_seq: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(..., Sp/32, H/32) square-block scales of V -> (e_tile (..., Sp/128, H/32), nan_tile, shift (..., Sp/32,
    H/32), nan): one exponent per (128-key tile, 32 columns), raised to within V_SPREAD of the sequence's
    largest, and each block's shift to it. tile_seq: see _sequence_max."""
    e, nan = _exponents(scale)
    *lead, sb, hb = e.shape
    et = e.reshape(*lead, sb // 4, 4, hb)
    nt = nan.reshape(et.shape)
    e_tile = jnp.clip(jnp.max(jnp.where(nt, E_MIN, et), axis=-2), E_MIN, E_MAX)
    # The kernel keeps acc_O in the current tile's units: bound the spread between tiles (zero tiles, padding)
    e_tile = jnp.maximum(e_tile, _sequence_max(e_tile, tile_seq) - V_SPREAD)
    shift = (et - e_tile[..., None, :]).reshape(e.shape)
    return e_tile, jnp.any(nt, axis=-2), shift, nan


def _align_rows(data: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(..., L, H) square-block MX operand -> (data', e_row (..., L/32), nan_row (..., L/32))."""
    e_row, nan_row, shift, _ = _row_exponents(scale)
    *lead, length, h = data.shape
    blocks = data.reshape(*lead, length // 32, 32, h // 32, 32)
    out = _realign(blocks, shift[..., :, None, :, None]).reshape(data.shape)
    return out, e_row, nan_row


def _permute_keys_transposed(v: jax.Array) -> jax.Array:
    """(..., Sp, H) -> (..., H, Sp) with the keys of every 32 in pv_permutation order."""
    *lead, s, h = v.shape
    v = v.reshape(*lead, s // 32, 2, 2, 4, 2, h)
    # key 16h + 8ib + 2q + i0 goes to slot 16h + 4q + 2ib + i0
    nd = len(lead)
    perm = (*range(nd), nd + 5, nd, nd + 1, nd + 3, nd + 2, nd + 4)
    return v.transpose(perm).reshape(*lead, h, s)


def _align_v(data: jax.Array, scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(..., Sp, H) square-block V -> (V'^T (..., H, Sp) permuted, e_tile (..., Sp/128 * H/32), nan)."""
    e_tile, nan_tile, shift, _ = _v_exponents(scale)
    *lead, s, h = data.shape
    blocks = data.reshape(*lead, s // 32, 32, h // 32, 32)
    v = _realign(blocks, shift[..., :, None, :, None]).reshape(data.shape)
    return _permute_keys_transposed(v), e_tile.reshape(*lead, -1), nan_tile.reshape(*lead, -1)


def _factor(e: jax.Array, nan: jax.Array, mult: float = 1.0) -> jax.Array:
    return jnp.where(nan, jnp.nan, jnp.float32(mult) * pow2(e)).astype(jnp.float32)


def prepare(
    q: MXArray, k: MXArray, v: MXArray, *, scale: float, q_len: jax.Array | None, kv_len: jax.Array | None
) -> AlignedOperands:
    """The producer pass.

    Args:
      q: (B, N, T, H) square-block MXArray (float8_e4m3fn, blocks over (T, H)); head n uses KV head n // G.
      k, v: (B, K, S, H) square-block MXArrays. Padding positions must already be zero (their blocks too).
      scale: softmax scale tau. q_len, kv_len: (B,) int32 or None (= T, S).
    """
    b, n, t, h = q.shape
    s = k.shape[-2]
    tp, sp = _round_up(t, TILE_M), _round_up(s, TILE_N)
    qd, qsc = _pad_seq(q.data, q.scale, tp)
    kd, ksc = _pad_seq(k.data, k.scale, sp)
    vd, vsc = _pad_seq(v.data, v.scale, sp)
    q_al, eq, nq = _align_rows(qd, qsc)
    k_al, ek, nk = _align_rows(kd, ksc)
    vt, ev, nv = _align_v(vd, vsc)
    return AlignedOperands(
        q=q_al,
        k=k_al,
        vt=vt,
        qs=_factor(eq, nq, float(np.float32(scale * LOG2E))),
        ks=_factor(ek, nk),
        vs=_factor(ev, nv),
        vi=_factor(-ev, nv),
        lens=_lengths(q_len, kv_len, b, t, s),
    )


def _lengths(q_len, kv_len, b: int, t: int, s: int) -> jax.Array:
    ql = jnp.full((b,), t, jnp.int32) if q_len is None else q_len.astype(jnp.int32)
    kl = jnp.full((b,), s, jnp.int32) if kv_len is None else kv_len.astype(jnp.int32)
    return jnp.stack([ql, kl])


def _head_major_scale(x: MXArray, padded: int) -> jax.Array:
    """(B, L/32, N, H/32) scales of a sequence-major MXArray -> (B, N, Lp/32, H/32), zero blocks past L."""
    sc = x.scale.transpose(0, 2, 1, 3)
    return jnp.pad(sc, [(0, 0), (0, 0), (0, padded // 32 - sc.shape[2]), (0, 0)])


def _shift_bytes(shift: jax.Array, nan: jax.Array, length: int) -> jax.Array:
    """(B, N, Lp/32, H/32) block shifts -> the realign kernel's int8 (B, L/32, N, H/32): shifts below -126 all
    flush the block (-127), NaN blocks keep their (NaN) elements (0)."""
    sh = jnp.where(nan, 0, jnp.maximum(shift, -127)).astype(jnp.int8)
    return sh[:, :, : length // 32].transpose(0, 2, 1, 3)


def prepare_sequence_major(
    q: MXArray,
    k: MXArray,
    v: MXArray,
    *,
    scale: float,
    q_len: jax.Array | None,
    kv_len: jax.Array | None,
    kv_tile_seq: jax.Array | None = None,
    _impl_override: str | None = None,
) -> AlignedOperands:
    """The producer pass on sequence-major operands, bit-identical to `prepare` on their head-major transposes.

    Args:
      q: (B, T, N, H) square-block MXArray (float8_e4m3fn, blocks over (T, H): axes (-3, -1)); T % 32 == 0.
      k, v: (B, S, K, H) likewise. Padding positions must already be zero (their blocks too).
      scale: softmax scale tau. q_len, kv_len: (B,) int32 or None (= T, S).
      kv_tile_seq: packed sequences (B = 1) only: (Sp/128,) int32 non-decreasing sequence id of every KV
        tile, so that V's exponent spread is bounded per sequence (None: per batch row).
    The exponent arithmetic runs in XLA on the scales; the FP8 data is re-encoded and transposed to the
    kernel's layouts by the realign kernel (kernels/sm90/attention_realign.py), one read and one write per
    byte. _impl_override="xla" runs that step's XLA emulation through the same partitioning (CPU tests).
    """
    b, t, n, h = q.shape
    s = k.shape[1]
    tp, sp = _round_up(t, TILE_M), _round_up(s, TILE_N)
    impl = _impl_override or "cuda"
    eq, nq, shq, nanq = _row_exponents(_head_major_scale(q, tp))
    ek, nk, shk, nank = _row_exponents(_head_major_scale(k, sp))
    ev, nv, shv, nanv = _v_exponents(_head_major_scale(v, sp), kv_tile_seq)
    ev, nv = ev.reshape(b, ev.shape[1], -1), nv.reshape(b, nv.shape[1], -1)  # (B, K, Sp/128 * H/32)
    return AlignedOperands(
        q=_realign_op("rows", impl)(q.data, _shift_bytes(shq, nanq, t)),
        k=_realign_op("rows", impl)(k.data, _shift_bytes(shk, nank, s)),
        vt=_realign_op("v", impl)(v.data, _shift_bytes(shv, nanv, s)),
        qs=_factor(eq, nq, float(np.float32(scale * LOG2E))),
        ks=_factor(ek, nk),
        vs=_factor(ev, nv),
        vi=_factor(-ev, nv),
        lens=_lengths(q_len, kv_len, b, t, s),
    )


def _realign_ffi(operand: str):
    def fn(data, shift):
        b, length, n, h = data.shape
        lp = _round_up(length, TILE_N)
        call = jax.ffi.ffi_call("jax_mxfp8_attention_realign", jax.ShapeDtypeStruct((b * n, lp * h), data.dtype))
        out = call(
            data.reshape(b, length * n * h),
            shift.reshape(b, -1),
            head_dim=np.int32(h),
            operand=np.int32(operand == "v"),
        )
        return out.reshape((b, n, lp, h) if operand == "rows" else (b, n, h, lp))

    return fn


def _realign_emulated(operand: str):
    """The realign kernel's contract in XLA (CPU tests): the same block realignment, transposes and padding."""

    def fn(data, shift):
        b, length, n, h = data.shape
        sh = jnp.minimum(shift.astype(jnp.int32), 0)
        blocks = data.reshape(b, length // 32, 32, n, h // 32, 32)
        out = _realign(blocks, sh[:, :, None, :, :, None]).reshape(data.shape).transpose(0, 2, 1, 3)
        out = jnp.pad(out, [(0, 0), (0, 0), (0, _round_up(length, TILE_N) - length), (0, 0)])
        return out if operand == "rows" else _permute_keys_transposed(out)

    return fn


@functools.cache
def _realign_op(operand: str, impl: str):
    """custom_vmap(custom_partitioning(realign)): (B, L, N, H) data + (B, L/32, N, H/32) shifts -> (B, N, Lp, H)
    ("rows") or (B, N, H, Lp) ("v"); batch and heads shard, the sequence and head_dim do not."""
    body = _realign_ffi(operand) if impl == "cuda" else _realign_emulated(operand)

    def specs(mesh, arg_shapes):
        d = arg_shapes[0]
        batch, heads = _batch_and_heads(mesh, d, 0, 2, d.shape[2])
        arg = NamedSharding(mesh, P(batch, None, heads, None))
        return (arg, arg), NamedSharding(mesh, P(batch, heads, None, None))

    def partition(mesh, arg_shapes, result_shape):
        args, out = specs(mesh, arg_shapes)
        return mesh, body, out, args

    cp = custom_partitioning(body)
    cp.def_partition(
        partition=partition,
        infer_sharding_from_operands=lambda mesh, arg_shapes, result_shape: specs(mesh, arg_shapes)[1],
        sharding_rule="b l n h, b m n c -> b n p q",
    )

    @jax.custom_batching.custom_vmap
    def op(data, shift):
        return cp(data, shift)

    @op.def_vmap
    def _vmap(axis_size, in_batched, data, shift):
        # the vmapped axis (at 0) becomes part of the batch: (V, B, ...) -> (V * B, ...)
        args = [x if bt else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, bt in zip((data, shift), in_batched)]
        out = op(*(x.reshape(axis_size * x.shape[1], *x.shape[2:]) for x in args))
        return out.reshape(axis_size, -1, *out.shape[1:]), True

    return op


def p_options(p_scale: str, p_rounding: str) -> tuple[str, str]:
    """Checked (p_scale, p_rounding), p_rounding normalized to "up" for "const" (one fixed scale, no rule)."""
    if p_scale not in registry.P_SCALES:
        raise ValueError(f"p_scale={p_scale!r} is not one of {registry.P_SCALES}")
    if p_rounding not in registry.SCALE_ROUNDINGS:
        raise ValueError(f"p_rounding={p_rounding!r} is not one of {registry.SCALE_ROUNDINGS}")
    return p_scale, (p_rounding if p_scale == "block" else "up")


def unsupported(*, head_dim: int, causal: bool, p_scale: str = "const", p_rounding: str = "up") -> str | None:
    """Why the kernel cannot run these arguments, or None."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    if registry.find(registry.AttentionFwdConfig, head_dim=head_dim, causal=causal) is None:
        return f"no attention kernel for head_dim={head_dim} (the kernel covers 64 and 128)"
    if (
        registry.find(
            registry.AttentionFwdConfig, head_dim=head_dim, causal=causal, p_scale=p_scale, p_rounding=p_rounding
        )
        is None
    ):
        return (
            f"no attention kernel for p_scale={p_scale!r} with scale_rounding={p_rounding!r}: the kernel's one P "
            "scale per (row, 128-key tile) reproduces the 'up' block rule, not the 'floor' rule's saturation of "
            "P elements (docs/numerics.md, 'Hopper attention kernel')"
        )
    return None


def kernel_available() -> tuple[bool, str]:
    """(True, "") when the sm_90a attention kernel can run on the default backend."""
    ok, why = pq.kernel_available()
    if not ok:
        return ok, why
    if pq._gpu_major() != 9:
        return False, "the MXFP8 attention kernel is built for Hopper (sm_90a) only"
    return True, ""


def _out_shapes(q: jax.Array) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """The kernel's outputs for Q' of shape (B, N, Tp, H): o (B, Tp, N, H) bfloat16 (the caller's layout),
    lse (B, N, Tp) float32."""
    b, n, tp, h = q.shape
    return jax.ShapeDtypeStruct((b, tp, n, h), jnp.bfloat16), jax.ShapeDtypeStruct((b, n, tp), jnp.float32)


def _attrs(causal: bool, p_scale: str, p_rounding: str, tune: int) -> dict[str, np.int32]:
    """The FFI call's attributes (csrc/attention_fwd.cc picks the variant by them; codes from the registry)."""
    return dict(
        causal=np.int32(causal),
        p_scale=np.int32(registry.P_SCALE_CODE[p_scale]),
        p_rounding=np.int32(registry.ROUNDING_CODE[p_rounding]),
        tune=np.int32(tune),
    )


def _ffi_body(causal: bool, p_scale: str, p_rounding: str, tune: int, packed: bool):
    target = "jax_mxfp8_attention_fwd_packed" if packed else "jax_mxfp8_attention_fwd"

    def fn(q, k, vt, qs, ks, vs, vi, *tables):
        return tuple(
            jax.ffi.ffi_call(target, _out_shapes(q))(
                q, k, vt, qs, ks, vs, vi, *tables, **_attrs(causal, p_scale, p_rounding, tune)
            )
        )

    return fn


def _emulated_body(causal: bool, p_scale: str, p_rounding: str, packed: bool):
    """The same contract as the kernel call, computed by emulate_fwd (CPU tests of the partitioning)."""

    def fn(q, k, vt, qs, ks, vs, vi, *tables):
        ops = AlignedOperands(q, k, vt, qs, ks, vs, vi, tables[0])
        p = dict(p_scale=p_scale, p_rounding=p_rounding)
        if packed:
            o, lse = emulate_packed_fwd(ops, causal=causal, **p)
        else:
            o, lse = emulate_fwd(ops, causal=causal, t=q.shape[2], **p)
        return o.transpose(0, 2, 1, 3).astype(jnp.bfloat16), lse

    return fn


def _axes_size(mesh, names) -> int:
    if names is None:
        return 1
    return int(np.prod([mesh.shape[a] for a in (names if isinstance(names, tuple) else (names,))]))


def _batch_and_heads(mesh, arg, batch_dim: int, heads_dim: int, heads: int):
    """The mesh axes on `arg`'s batch and head dims, each kept only where it divides the batch / `heads`
    (the calls shard whole batch rows and whole heads; everything else is replicated)."""
    spec = tuple(arg.sharding.spec) + (None,) * 4
    b, h = spec[batch_dim], spec[heads_dim]
    return (b if arg.shape[batch_dim] % _axes_size(mesh, b) == 0 else None), (
        h if heads % _axes_size(mesh, h) == 0 else None
    )


@functools.cache
def _attention_op(
    causal: bool, p_scale: str, p_rounding: str, tune: int, impl: str, group: int, n_kv: int, packed: bool = False
):
    """custom_vmap(custom_partitioning(kernel call)): batch and KV-head groups shard, sequences do not.

    Heads shard as whole KV groups (query head n = kv * G + g): a mesh axis on the query-head dim is
    kept only when it divides the KV heads, and the KV operands then take the same axis. Everything
    along the sequence and head_dim is replicated (each device runs whole sequences). packed: the
    packed-sequence call (one batch row; the seqs and work tables replicated), which has no vmap rule.
    """
    if impl == "cuda":
        body = _ffi_body(causal, p_scale, p_rounding, tune, packed)
    else:
        body = _emulated_body(causal, p_scale, p_rounding, packed)

    def specs(mesh, arg_shapes):
        q, k = arg_shapes[0], arg_shapes[1]
        batch, heads = _batch_and_heads(mesh, q, 0, 1, k.shape[1])  # whole KV-head groups
        four, three = P(batch, heads, None, None), P(batch, heads, None)
        tables = (P(None, None), P(None, None)) if packed else (P(None, batch),)
        args = (four, four, four, three, three, three, three, *tables)
        o = P(batch, None, heads, None)
        return tuple(NamedSharding(mesh, a) for a in args), (NamedSharding(mesh, o), NamedSharding(mesh, three))

    def infer(mesh, arg_shapes, result_shape):
        return specs(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        args, outs = specs(mesh, arg_shapes)
        return mesh, body, outs, args

    # Query heads are the compound factor (k g). Shardy rejects a size-1 factor inside a compound one:
    # MHA (G = 1) names k alone; MQA (K = 1) gives the query heads their own factor g (they cannot
    # shard as KV groups then, and the partition callback replicates them).
    if group == 1:
        n, sizes = "k", {}
    elif n_kv == 1:
        n, sizes = "g", {}
    else:
        n, sizes = "(k g)", {"g": group}
    tables = "l z, y x" if packed else "l b"
    cp = custom_partitioning(body)
    cp.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=f"b {n} t h, b k s h, b k h s, b {n} u, b k v, b k w, b k w, {tables} -> b t {n} h, b {n} t",
        **sizes,
    )
    if packed:
        return cp

    @jax.custom_batching.custom_vmap
    def op(q, k, vt, qs, ks, vs, vi, lens):
        return cp(q, k, vt, qs, ks, vs, vi, lens)

    @op.def_vmap
    def _vmap(axis_size, in_batched, *args):
        # the vmapped axis (at 0) becomes part of the batch: (V, B, ...) -> (V * B, ...)
        args = [x if bt else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, bt in zip(args, in_batched, strict=True)]
        merged = [x.reshape(axis_size * x.shape[1], *x.shape[2:]) for x in args[:7]]
        lens = args[7].transpose(1, 0, 2).reshape(2, -1)
        o, lse = op(*merged, lens)
        b = args[0].shape[1]
        return (o.reshape(axis_size, b, *o.shape[1:]), lse.reshape(axis_size, b, *lse.shape[1:])), (True, True)

    return op


def attention_fwd(
    ops: AlignedOperands,
    *,
    causal: bool,
    t: int,
    p_scale: str = "const",
    p_rounding: str = "up",
    tune: int = 0,
    out: tuple[jax.Array, jax.Array] | None = None,
    _impl_override: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel. Returns o (B, T, N, H) bfloat16 and lse (B, N, T) float32 (padding rows dropped).

    p_scale: "const" or "block" (AttentionConfig.p_scale); p_rounding: the block scale rule ("up" or
    "floor", AttentionConfig.scale_rounding; ignored for "const").
    Under jit with sharded operands the call partitions over batch and KV-head groups (see
    _attention_op); under vmap the mapped axis joins the batch.
    out: optional (o (B, Tp, N, H) bfloat16, lse (B, N, Tp) float32) buffers the kernel writes into
    (aliased; tests pass NaN-filled ones to check that every element is written). _impl_override="xla"
    runs the emulation through the same partitioning and batching (CPU tests).
    """
    args = (ops.q, ops.k, ops.vt, ops.qs, ops.ks, ops.vs, ops.vi, ops.lens)
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    if out is None:
        n_kv = ops.k.shape[1]
        op = _attention_op(
            bool(causal), p_scale, p_rounding, int(tune), _impl_override or "cuda", ops.q.shape[1] // n_kv, n_kv
        )
        o, lse = op(*args)
    else:
        call = jax.ffi.ffi_call("jax_mxfp8_attention_fwd_into", _out_shapes(ops.q), input_output_aliases={8: 0, 9: 1})
        o, lse = call(*args, *out, **_attrs(bool(causal), p_scale, p_rounding, int(tune)))
    return o[:, :t], lse[:, :, :t]


def packed_tables(
    q_len: jax.Array, kv_len: jax.Array, q_start: jax.Array, kv_start: jax.Array, *, causal: bool, q_rows: int
) -> tuple[jax.Array, jax.Array]:
    """The packed kernel's int32 tables for S sequences laid out from rows q_start / kv_start (multiples of 128)
    in operands of q_rows query rows.

    Returns seqs (4, S) = (first query tile, first KV tile, query length, KV length) and work (2, q_rows/128):
    one item (sequence, query tile) per query tile holding rows of a sequence, the longest first (a CTA's
    work is its number of KV tiles; the GPU starts CTAs in grid order, so the long ones do not trail), then
    (-1, 0) items that do nothing.
    """
    q_len, kv_len = q_len.astype(jnp.int32), kv_len.astype(jnp.int32)
    seqs = jnp.stack([q_start // TILE_M, kv_start // TILE_N, q_len, kv_len]).astype(jnp.int32)
    tiles = jnp.arange(q_rows // TILE_M, dtype=jnp.int32)
    b = jnp.clip(jnp.searchsorted(q_start // TILE_M, tiles, side="right").astype(jnp.int32) - 1, 0, q_len.shape[0] - 1)
    m = tiles - q_start[b] // TILE_M
    live = (m >= 0) & (m * TILE_M < q_len[b])
    n_kv = -(-kv_len[b] // TILE_N)
    if causal:
        last_row = jnp.minimum((m + 1) * TILE_M, q_len[b]) - 1
        n_kv = jnp.minimum(n_kv, last_row // TILE_N + 1)
    cost = jnp.where(live, n_kv, -1)
    order = jnp.argsort(-cost, stable=True)
    work = jnp.stack([jnp.where(live, b, -1)[order], jnp.where(live, m, 0)[order]]).astype(jnp.int32)
    return seqs, work


def attention_fwd_packed(
    ops: AlignedOperands,
    work: jax.Array,
    *,
    causal: bool,
    p_scale: str = "const",
    p_rounding: str = "up",
    tune: int = 0,
    out: tuple[jax.Array, jax.Array] | None = None,
    _impl_override: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Runs the kernel over packed sequences (packed_tables; ops.lens holds the seqs table, B = 1).

    Returns o (1, Tp, N, H) bfloat16 and lse (1, N, Tp) float32 in the operands' aligned row order: rows of
    every sequence's query tiles are written (0 / -inf past its length); rows in no query tile of a
    sequence are left unwritten (garbage: read only through the sequences' rows). Shards over KV-head
    groups like attention_fwd; no vmap rule. out, _impl_override: as for attention_fwd.
    """
    args = (ops.q, ops.k, ops.vt, ops.qs, ops.ks, ops.vs, ops.vi, ops.lens, work)
    if out is None:
        n_kv = ops.k.shape[1]
        impl = _impl_override or "cuda"
        op = _attention_op(bool(causal), p_scale, p_rounding, int(tune), impl, ops.q.shape[1] // n_kv, n_kv, True)
        return op(*args)
    call = jax.ffi.ffi_call(
        "jax_mxfp8_attention_fwd_packed_into", _out_shapes(ops.q), input_output_aliases={9: 0, 10: 1}
    )
    return call(*args, *out, **_attrs(causal, p_scale, p_rounding, tune))


def _sequence_windows(x: jax.Array, first_tile: jax.Array, n_tiles: jax.Array, axis: int) -> jax.Array:
    """(1, ..., L, ...) aligned operand -> (S, ..., L, ...): sequence s's tiles first_tile[s] .. + n_tiles[s]
    along `axis` from position 0, zeros after them (so that no other sequence's bytes reach the emulation)."""
    length = x.shape[axis]
    pos = jnp.arange(length, dtype=jnp.int32)
    idx = jnp.clip(first_tile[:, None] * TILE_N + pos[None, :], 0, length - 1)  # (S, L)
    valid = pos[None, :] < n_tiles[:, None] * TILE_N
    moved = jnp.moveaxis(x[0], axis - 1, 0)[idx]  # (S, L, ...)
    moved = jnp.where(valid.reshape(valid.shape + (1,) * (moved.ndim - 2)), moved, jnp.zeros((), x.dtype))
    return jnp.moveaxis(moved, 1, axis)


def emulate_packed_fwd(
    ops: AlignedOperands, *, causal: bool, p_scale: str = "const", p_rounding: str = "up"
) -> tuple[jax.Array, jax.Array]:
    """The packed kernel's arithmetic in XLA: emulate_fwd on each sequence's own tiles (ops.lens = seqs).
    Returns o (1, N, Tp, H) and lse (1, N, Tp), 0 / -inf on rows in no sequence's query tiles."""
    seqs = ops.lens
    qt0, kt0, q_len, kv_len = seqs[0], seqs[1], seqs[2], seqs[3]
    nq, nk = -(-q_len // TILE_M), -(-kv_len // TILE_N)
    hg = ops.q.shape[-1] // 32
    win_q = functools.partial(_sequence_windows, first_tile=qt0, n_tiles=nq)
    win_k = functools.partial(_sequence_windows, first_tile=kt0, n_tiles=nk)
    q32 = ops.qs.shape[-1]
    k32 = ops.ks.shape[-1]
    # scale factors: per 32 rows (qs, ks) and per (tile, 32 columns) (vs, vi); windows in tile units
    qs = _sequence_windows(jnp.repeat(ops.qs, 32, axis=-1), qt0, nq, 2)[..., ::32]
    ks = _sequence_windows(jnp.repeat(ops.ks, 32, axis=-1), kt0, nk, 2)[..., ::32]
    nt = ops.vs.shape[-1] // hg

    def tile_factors(f):
        per_key = jnp.repeat(f.reshape(1, f.shape[1], nt, hg), TILE_N, axis=2).reshape(1, f.shape[1], nt * TILE_N * hg)
        per_key = per_key.reshape(1, f.shape[1], nt * TILE_N, hg)
        w = _sequence_windows(per_key, kt0, nk, 2)[:, :, ::TILE_N]
        return jnp.where(w == 0, 1.0, w).reshape(w.shape[0], w.shape[1], -1)

    assert q32 * 32 == ops.q.shape[2] and k32 * 32 == ops.k.shape[2]
    seq_ops = AlignedOperands(
        q=win_q(ops.q, axis=2),
        k=win_k(ops.k, axis=2),
        vt=win_k(ops.vt, axis=3),
        qs=qs,
        ks=ks,
        vs=tile_factors(ops.vs),
        vi=tile_factors(ops.vi),
        lens=jnp.stack([q_len, kv_len]),
    )
    o, lse = emulate_fwd(seq_ops, causal=causal, t=ops.q.shape[2], p_scale=p_scale, p_rounding=p_rounding)
    rows = jnp.arange(ops.q.shape[2], dtype=jnp.int32)
    tile = rows // TILE_M
    b = jnp.clip(jnp.searchsorted(qt0, tile, side="right").astype(jnp.int32) - 1, 0, qt0.shape[0] - 1)
    i = rows - qt0[b] * TILE_M
    live = (i >= 0) & (i < nq[b] * TILE_M)
    ic = jnp.clip(i, 0, ops.q.shape[2] - 1)
    o = jnp.where(live[None, :, None], o[b, :, ic].transpose(1, 0, 2), 0.0)[None]
    lse = jnp.where(live[None, :], lse[b, :, ic].T, -jnp.inf)[None]
    return o, lse


def p_tile_offset(tile_max: jax.Array, m_use: jax.Array, prev: jax.Array, p_rounding: str) -> jax.Array:
    """p_scale="block": the kernel's P offset per (query row, KV tile), as AttentionForwardSm90._p_offset.

    Args (log2 domain, float32, any common shape): tile_max: the row's largest logit in the tile (-inf when
      the tile is fully masked for the row); m_use: the running max the tile is exponentiated against
      (tile_max <= m_use); prev: the row's offset of the previous tile. p_rounding: "up" or "floor".
    Returns float32 integers in [8, P_OFFSET_MAX]: the tile stores E4M3(P~ * 2^offset), i.e. its scale is
    the contract's block scale for an amax of 2^-d, d = m_use - tile_max ("up": 2^ceil(-d - log2 448),
    "floor": 2^(floor(-d) - 8)), capped at 2^-P_OFFSET_MAX below; fully masked tiles keep `prev`; NaN
    rows get P_OFFSET_MAX (fmin ignores NaN, as the kernel's min.f32 does).
    """
    d = m_use - tile_max
    if p_rounding == "up":
        off = jnp.floor(d + np.float32(registry.LOG2_E4M3_MAX))
    elif p_rounding == "floor":
        off = jnp.ceil(d) + np.float32(registry.P_CONST_OFFSET)
    else:
        raise ValueError(f"p_rounding={p_rounding!r} is not one of {registry.SCALE_ROUNDINGS}")
    off = jnp.fmin(off, np.float32(registry.P_OFFSET_MAX))
    return jnp.where(tile_max == -jnp.inf, prev, off).astype(jnp.float32)


def p_to_e4m3(p: jax.Array) -> jax.Array:
    """The kernel's P rounding, cvt.rn.satfinite.e4m3: float32 P (>= 0, or NaN) -> E4M3 values as float32.

    Saturates at 448 (an "up" tile's max can land just above 448 where float rounding of d picked the
    finer scale; "floor" tiles reach [256, 512) by design, as the contract's own saturation does)."""
    return decode_elements(jnp.minimum(p, np.float32(448.0)).astype(jnp.float8_e4m3fn))


def _pow2f(k: jax.Array) -> jax.Array:
    """2^k for integer-valued float32 k in [-126, 127] (exact, from the bits)."""
    return pow2(k.astype(jnp.int32))


def emulate_fwd(
    ops: AlignedOperands, *, causal: bool, t: int, p_scale: str = "const", p_rounding: str = "up"
) -> tuple[jax.Array, jax.Array]:
    """The kernel's arithmetic in XLA (float32 GEMMs on the aligned operands, same tile order, exp2 with the
    max offset, E4M3 P, per-tile V exponents): the tight oracle for the kernel and a CPU check of
    `prepare`. p_scale "const": P = E4M3(256 P~); "block": P = E4M3(P~ * 2^offset) with the per-(row, tile)
    p_tile_offset, l kept in 2^-8 units, acc_O in the current tile's P units (rescaled by
    2^(offset_j - offset_{j-1}) with alpha), O = acc * 2^(8 - offset_last) * 2^eV / l.
    Returns o (B, N, T, H) float32 and lse (B, N, T) float32."""
    p_scale, p_rounding = p_options(p_scale, p_rounding)
    block = p_scale == "block"
    b, n, tp, h = ops.q.shape
    nk, sp = ops.k.shape[1], ops.k.shape[2]
    g, hg, nt = n // nk, h // 32, sp // TILE_N
    hp = lax.Precision.HIGHEST
    q = decode_elements(ops.q).reshape(b, nk, g, tp, h)
    k = decode_elements(ops.k)
    # undo the key permutation of V'^T: slot 16h + 4q + 2ib + i0 holds key 16h + 8ib + 2q + i0 (a transpose,
    # not a gather, so the emulation closes over no array constants: custom_partitioning needs that)
    v = decode_elements(ops.vt).reshape(b, nk, h, sp // 32, 2, 4, 2, 2).swapaxes(-3, -2)
    v = v.reshape(b, nk, h, sp).swapaxes(-1, -2)
    qs = jnp.repeat(ops.qs.reshape(b, nk, g, tp // 32), 32, axis=-1)[..., None]  # (b, nk, g, tp, 1)
    ks = jnp.repeat(ops.ks, 32, axis=-1).reshape(b, nk, nt, TILE_N)
    vs = ops.vs.reshape(b, nk, nt, hg)
    vi = ops.vi.reshape(b, nk, nt, hg)
    q_len, kv_len = ops.lens[0], ops.lens[1]
    rows = jnp.arange(tp)[:, None]
    const_off = np.float32(registry.P_CONST_OFFSET)

    def step(carry, j):
        m, lsum, acc, v_prev, off_prev = carry
        kj = lax.dynamic_slice_in_dim(k, j * TILE_N, TILE_N, axis=2)
        vj = lax.dynamic_slice_in_dim(v, j * TILE_N, TILE_N, axis=2)
        s = jnp.einsum("bkgth,bksh->bkgts", q, kj, precision=hp) * (qs * ks[:, :, None, j, None, :])
        cols = j * TILE_N + jnp.arange(TILE_N)[None, :]
        bad = cols[None] >= kv_len[:, None, None]
        if causal:
            bad = bad | (cols > rows)[None]
        s = jnp.where(bad[:, None, None], -jnp.inf, s)
        tile_max = jnp.max(s, axis=-1)
        m_new = jnp.maximum(m, tile_max)
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        off = p_tile_offset(tile_max, m_use, off_prev, p_rounding) if block else off_prev
        p = jnp.exp2(s - (m_use - off)[..., None])  # P~ in this tile's P units (2^off)
        alpha = jnp.exp2(m - m_use)
        if block:
            # l in fixed 2^-8 units; acc_O moves into this tile's P units (exact powers of two)
            lsum = alpha * lsum + jnp.sum(p, axis=-1) * _pow2f(const_off - off)
            alpha = alpha * _pow2f(off - off_prev)
        else:
            lsum = alpha * lsum + jnp.sum(p, axis=-1)
        pq = p_to_e4m3(p)
        ratio = jnp.where(j == 0, 1.0, v_prev * vi[:, :, j])  # (b, nk, hg)
        ratio = jnp.repeat(ratio, 32, axis=-1)[:, :, None, None, :]
        acc = acc * alpha[..., None] * ratio + jnp.einsum("bkgts,bksh->bkgth", pq, vj, precision=hp)
        return (m_new, lsum, acc, vs[:, :, j], off), None

    init = (
        jnp.full((b, nk, g, tp), -jnp.inf, jnp.float32),
        jnp.zeros((b, nk, g, tp), jnp.float32),
        jnp.zeros((b, nk, g, tp, h), jnp.float32),
        jnp.ones((b, nk, hg), jnp.float32),
        jnp.full((b, nk, g, tp), const_off, jnp.float32),
    )
    (m, lsum, acc, v_last, off_last), _ = lax.scan(step, init, jnp.arange(nt))
    live = (lsum > 0) | jnp.isnan(lsum)
    live = live & (jnp.arange(tp)[None, None, None, :] < q_len[:, None, None, None])
    if block:
        acc = acc * _pow2f(const_off - off_last)[..., None]  # back to the fixed 2^-8 units of l
    o = jnp.where(live[..., None], acc * jnp.repeat(v_last, 32, axis=-1)[:, :, None, None, :] / lsum[..., None], 0.0)
    lse = jnp.where(live, (m - 8.0 + jnp.log2(lsum)) * np.float32(np.log(2.0)), -jnp.inf)
    return o.reshape(b, n, tp, h)[:, :, :t], lse.reshape(b, n, tp)[:, :, :t]
