"""p_scale="block" in the Hopper attention kernel's numerics, checked on CPU (emulate_fwd, the kernel's math).

The kernel cannot apply a scale that varies along the P V GEMM's contracting axis (Hopper's wgmma has no
block scales), so it stores P~ with ONE power-of-two scale per (query row, 128-key tile): the scale the
contract's block rule gives for the row-tile's amax (primitives.attention_fwd.p_tile_offset). Checked here:
  * the claim that makes this the contract's numerics, bit for bit: for every 32-key block, elements
    >= 2^-6 * s_rt (s_rt the row-tile scale) equal the contract's block quantization (fake_quant_p, and the
    independent float64 model tests/attention/attention_oracle.mx_fake_quant); smaller ones differ by at most half
    an E4M3 subnormal step, 2^-10 * s_rt;
  * emulate_fwd(p_scale="block") against the XLA reference with the same config: O and LSE >= 40 dB and
    within 0.5 dB of its float64 SQNR, including a long-context "attention sink" input where p_scale="const"
    loses precision (most of P's mass lies below the constant scale's subnormal range) and "block" does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp8 as mx
from jax_mxfp8.formats.scales import pow2
from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import attention_emulation as emulation
from jax_mxfp8.reference.attention_quant import fake_quant_p
from tests.attention.attention_kernel_testutil import case_id, case_inputs, emulated, sink_inputs
from tests.attention.attention_oracle import _round_e4m3, exact_attention, mx_fake_quant, sqnr_db
from tests.attention.attention_testutil import fresh_rng

TILE = 128
LOG2_448 = np.log2(448.0)


def _p_tiles(rng, rows: int) -> np.ndarray:
    """(rows, 128) float32 P~ tiles in [0, 1]: row maxima 2^-d with d from 0 up to 30 (beyond P_OFFSET_MAX),
    log-normal spreads from narrow to 40 binades (values deep in E4M3's subnormal range and below it),
    some 32-key blocks 2^0..2^-20 smaller than the rest of the row, exact zeros (masked keys) and a few
    all-zero rows (fully masked tiles)."""
    n0, n1 = rows // 8, rows // 2
    d = np.concatenate([np.zeros(n0), rng.uniform(0, 4, n1), rng.uniform(4, 30, rows - n0 - n1)])
    spread = rng.choice([0.3, 2.0, 6.0, 20.0], size=(rows, 1))
    log2p = -np.abs(rng.standard_normal((rows, TILE))) * spread
    blocks = log2p.reshape(rows, 4, 32)
    blocks -= np.where(rng.random((rows, 4, 1)) < 0.3, rng.uniform(0, 20, (rows, 4, 1)), 0.0)
    log2p = blocks.reshape(rows, TILE)
    log2p -= log2p.max(axis=1, keepdims=True)  # each row's max is exactly 2^0 ...
    p = np.exp2(log2p - d[:, None]).astype(np.float32)  # ... then 2^-d
    p[rng.random(p.shape) < 0.05] = 0.0
    p[rng.choice(rows, 4, replace=False)] = 0.0
    return _off_boundaries(p)


def _off_boundaries(p: np.ndarray) -> np.ndarray:
    """Moves rows whose amax lies within 1e-3 binades of a scale-rule boundary by 2^-0.01: there, float
    rounding of log2(amax) may pick the neighbouring scale (test_offset_boundary covers those)."""
    amax = p.max(axis=1).astype(np.float64)
    x = -np.log2(np.where(amax > 0, amax, 1.0))
    near = np.zeros(len(p), bool)
    for edge in (x + LOG2_448, x):  # the "up" and "floor" rules' boundaries
        frac = edge - np.floor(edge)
        near |= np.isfinite(edge) & ((frac < 1e-3) | (frac > 1 - 1e-3))
    p[near] = (p[near].astype(np.float64) * 2.0**-0.01).astype(np.float32)
    return p


def _kernel_style(p: np.ndarray, rounding: str) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's quantization of P~ tiles, as emulate_fwd does it: (dequantized values, s_rt per row).

    The log2-domain tile max comes from the tile's own amax here (m_use = 0), so that both sides quantize the
    same float32 P~ values."""
    pj = jnp.asarray(p)
    with np.errstate(divide="ignore"):
        tile_max = jnp.log2(jnp.max(pj, axis=1))
    off = emulation.p_tile_offset(tile_max, jnp.zeros_like(tile_max), jnp.float32(registry.P_CONST_OFFSET), rounding)
    off = np.asarray(off, np.float64)
    # 2^off from the exponent bits: XLA:CPU's exp2 is not exact on integers (2^13, 2^15), which moves P
    # values off E4M3 rounding ties
    q = np.asarray(emulation.p_to_e4m3(pj * pow2(jnp.asarray(off, jnp.int32))[:, None]), np.float64)
    s_rt = 2.0**-off
    return q * s_rt[:, None], s_rt


def _contract_block_scales(p: np.ndarray, rounding: str) -> np.ndarray:
    """(rows, 128) the contract's scale of each element's 32-key block (from the library's quantize)."""
    a = mx.quantize(jnp.asarray(p), axis=-1, block="row", scale_rounding=rounding)
    s_b = 2.0 ** (np.asarray(a.scale, np.float64) - 127)
    return np.repeat(s_b, 32, axis=1)


@pytest.mark.parametrize("rounding", ["up", "floor"])
def test_row_tile_scale_reproduces_contract_blocks(rounding):
    p = _p_tiles(fresh_rng(), 2048)
    got, s_rt = _kernel_style(p, rounding)
    want = np.asarray(fake_quant_p(jnp.asarray(p), -1, "block", rounding), np.float64)
    np.testing.assert_array_equal(want, mx_fake_quant(p, (-1,), rounding))  # the contract, two implementations
    s_b = _contract_block_scales(p, rounding)
    x = p.astype(np.float64)
    s = s_rt[:, None] * np.ones_like(x)
    nonzero_row = p.max(axis=1) > 0

    # The row-tile scale is the contract's scale of the block holding the tile's max (capped at
    # 2^-P_OFFSET_MAX), so it is never finer than any block's scale of that row.
    top = np.take_along_axis(s_b, np.argmax(p, axis=1)[:, None], axis=1)[:, 0]
    capped = nonzero_row & (top < 2.0**-registry.P_OFFSET_MAX)
    np.testing.assert_array_equal(s_rt[nonzero_row & ~capped], top[nonzero_row & ~capped])
    np.testing.assert_array_equal(s_rt[capped], 2.0**-registry.P_OFFSET_MAX)
    np.testing.assert_array_equal(s_rt[~nonzero_row], 2.0**-registry.P_CONST_OFFSET)  # masked: previous offset
    assert np.all(s_b[nonzero_row] <= s[nonzero_row])
    assert capped.sum() > 50 and (s_b < s).any()

    # "floor" saturates the contract's elements above 448 * s_b (its block scale puts the amax in [256, 512));
    # at a coarser row-tile scale they are not saturated: where normal there, the kernel gives the contract's
    # rounding without the saturation (where s_b == s_rt both saturate the same elements the same way).
    sat = (x / s_b > 448.0) & (s_b < s)
    normal = x >= 2.0**-6 * s
    sub = ~normal
    if rounding == "up":
        assert not sat.any()
    else:
        m = sat & normal
        assert m.any()
        np.testing.assert_array_equal(got[m], _round_e4m3(x[m] / s_b[m]) * s_b[m])
    np.testing.assert_array_equal(got[normal & ~sat], want[normal & ~sat])
    # below 2^-6 s_rt: the kernel rounds to the subnormal grid of s_rt, within half a step of x and of the
    # contract's value (a finer grid that contains the kernel's)
    assert np.all(np.abs(got[sub] - x[sub]) <= 2.0**-10 * s[sub])
    assert np.all(np.abs(got[sub & ~sat] - want[sub & ~sat]) <= 2.0**-10 * s[sub & ~sat])
    # the bound is reached: some elements below 2^-6 s_rt do differ from the contract
    assert (got[sub] != want[sub]).sum() > 100
    print(f"{rounding}: {(normal & ~sat).sum()} elements equal, {sub.sum()} below 2^-6 s_rt "
          f"({(got[sub] != want[sub]).sum()} differ), {sat.sum()} saturated by the contract only")  # fmt: skip


# "up" only: it is the registered rule. Under "floor" the finer neighbouring scale puts the tile's max in
# [512, 1024) * s_rt, which cvt.rn.satfinite clips to 448 * s_rt (up to 56% off that element): one more
# reason "floor" takes the XLA path (registry.ATTENTION_FWD_VARIANTS). Whether float32 log2 picks the
# finer scale at such a boundary varied between runs of the full suite, so that case is not asserted.
@pytest.mark.parametrize("rounding", ["up"])
def test_offset_boundary_gives_the_contract_value(rounding):
    """Where float rounding of d picks the scale next to the contract's, the tile's max still quantizes to
    the contract's value ("up": the finer scale puts it just above 448, satfinite gives 448 * s_rt = 224 *
    s_b), and every element stays within half a subnormal step of the coarser of the two scales."""
    k = np.arange(0, 24)
    eps = np.float32(2.0**-23) * np.arange(-64, 65)[:, None]
    edge = 448.0 if rounding == "up" else 1.0
    amax = (edge * 2.0 ** -k.astype(np.float64) * (1.0 + eps)).astype(np.float32).reshape(-1)
    amax = amax[(amax > 0) & (amax <= 1)]
    rng = fresh_rng()
    p = (amax[:, None] * rng.uniform(0, 1, (len(amax), TILE))).astype(np.float32)
    p[np.arange(len(p)), rng.integers(0, TILE, len(p))] = amax
    got, s_rt = _kernel_style(p, rounding)
    want = np.asarray(fake_quant_p(jnp.asarray(p), -1, "block", rounding), np.float64)
    s_b = _contract_block_scales(p, rounding)
    top = np.take_along_axis(s_b, np.argmax(p, axis=1)[:, None], axis=1)[:, 0]
    moved = s_rt != top
    assert moved.any()  # the search found boundary cases
    x = p.astype(np.float64)
    s = np.maximum(s_rt[:, None], s_b)
    if rounding == "up":
        assert np.all(s_rt[moved] == top[moved] / 2)
        i = np.argmax(p, axis=1)
        np.testing.assert_array_equal(got[np.arange(len(p)), i], want[np.arange(len(p)), i])
        ok = x >= 2.0**-6 * s
        np.testing.assert_array_equal(got[ok], want[ok])
    assert np.all(np.abs(got - x) <= np.maximum(np.abs(want - x), 2.0**-10 * s))


BLOCK_CASES = [
    dict(b=1, t=256, s=256, n=2, n_kv=2, h=128, causal=False),
    dict(b=1, t=256, s=384, n=4, n_kv=2, h=64, causal=False),
    dict(b=2, t=320, s=320, n=2, n_kv=1, h=128, causal=True),
    dict(b=2, t=256, s=256, n=2, n_kv=2, h=64, causal=True, lengths=True),
    dict(b=2, t=256, s=256, n=2, n_kv=1, h=64, causal=False, lengths=True),
]


def _compare(q, k, v, *, causal, config, q_len=None, kv_len=None):
    """(emulation vs reference O dB, LSE dB, emulation vs float64 dB, reference vs float64 dB)."""
    # each side under one jit (eager dispatch compiles hundreds of small XLA programs on CI's CPU)
    o_e, lse_e = jax.jit(lambda q, k, v, ql, kl: emulated(q, k, v, causal=causal, q_len=ql, kv_len=kl, config=config))(
        q, k, v, q_len, kv_len
    )
    o_r, lse_r = jax.jit(lambda q, k, v, ql, kl: mx.dot_product_attention(
        q, k, v, is_causal=causal, query_seq_lengths=ql, key_value_seq_lengths=kl,
        implementation="xla", config=config, return_residual="lse",
    ))(q, k, v, q_len, kv_len)  # fmt: skip
    f64 = [np.asarray(x, np.float64) for x in (q, k, v)]
    o_x, _ = exact_attention(*f64, causal=causal, q_len=None if q_len is None else np.asarray(q_len),
                             kv_len=None if kv_len is None else np.asarray(kv_len))  # fmt: skip
    o_e, o_r = np.asarray(o_e, np.float64), np.asarray(o_r, np.float64)
    lse_e, lse_r = np.asarray(lse_e, np.float64), np.asarray(lse_r, np.float64)
    assert not np.isnan(o_e).any()
    np.testing.assert_array_equal(np.isneginf(lse_e), np.isneginf(lse_r))
    fin = np.isfinite(lse_r)
    return sqnr_db(o_e, o_r), sqnr_db(lse_e[fin], lse_r[fin]), sqnr_db(o_e, o_x), sqnr_db(o_r, o_x)


@pytest.mark.parametrize("case", BLOCK_CASES, ids=case_id)
def test_block_emulation_matches_reference(case):
    rng = fresh_rng()
    q, k, v, shape, causal, lengths = case_inputs(case, rng)
    config = mx.AttentionConfig(p_scale="block")
    q_len = kv_len = None
    if lengths:
        q_len = jnp.asarray(rng.integers(1, shape["t"] + 1, shape["b"]), jnp.int32)
        kv_len = jnp.asarray(rng.integers(0, shape["s"] + 1, shape["b"]), jnp.int32)
    s_o, s_lse, e64, r64 = _compare(q, k, v, causal=causal, config=config, q_len=q_len, kv_len=kv_len)
    print(f"O {s_o:.1f} dB, LSE {s_lse:.1f} dB vs reference; float64: emulation {e64:.2f}, reference {r64:.2f} dB")
    assert s_o >= 40.0 and s_lse >= 40.0
    assert abs(e64 - r64) <= 0.5


def test_block_floor_rule_takes_the_reference_path():
    """scale_rounding="floor" with p_scale="block" is not a kernel variant: one scale per row-tile follows the
    floor rule's scale choice (test_row_tile_scale_reproduces_contract_blocks) but not its saturation of the
    elements of blocks whose amax has a mantissa >= 1.75, which moves O by ~1-2% (36.8-40.5 dB measured,
    below the 40 dB gate). The emulation is never further from float64 than the contract there."""
    from jax_mxfp8.ops.attention_core import kernel_unsupported

    base = dict(head_dim=128, is_causal=False, has_bias=False, has_mask=False, out_dtype=jnp.bfloat16, mx_inputs=[])
    why = kernel_unsupported(mx.AttentionConfig(p_scale="block", scale_rounding="floor"), **base)
    assert why is not None and "floor" in why
    rng = fresh_rng()
    q, k, v, _, causal, _ = case_inputs(dict(b=1, t=256, s=384, n=2, n_kv=1, h=128, causal=True), rng)
    config = mx.AttentionConfig(p_scale="block", scale_rounding="floor")
    s_o, s_lse, e64, r64 = _compare(q, k, v, causal=causal, config=config)
    print(f"floor: O {s_o:.1f} dB, LSE {s_lse:.1f} dB vs reference; float64: emulation {e64:.2f}, reference {r64:.2f}")
    assert s_o >= 30.0 and s_lse >= 40.0
    assert e64 >= r64 - 0.05


def test_block_tracks_reference_where_const_loses():
    q, k, v = sink_inputs(fresh_rng(), 32768)
    got = {}
    for p_scale in ("const", "block"):
        got[p_scale] = _compare(q, k, v, causal=False, config=mx.AttentionConfig(p_scale=p_scale))
        s_o, s_lse, e64, r64 = got[p_scale]
        print(f"{p_scale}: O {s_o:.1f} dB, LSE {s_lse:.1f} dB vs reference; float64: emulation {e64:.2f}, "
              f"reference {r64:.2f} dB")  # fmt: skip
    s_o, s_lse, e64, r64 = got["block"]
    assert s_o >= 40.0 and s_lse >= 40.0 and abs(e64 - r64) <= 0.5
    # block mode keeps the small tiles' mass: closer to float64 than const, by several dB (6.8 measured)
    assert e64 >= got["const"][2] + 4.0 and r64 >= got["const"][3] + 4.0


def test_block_nan_operand_gives_reference_nan_pattern():
    rng = fresh_rng()
    q, k, v, _, _, _ = case_inputs(dict(b=1, t=128, s=256, n=2, n_kv=2, h=64, causal=False), rng)
    config = mx.AttentionConfig(p_scale="block")
    # jitted once, outside the loop: the three cases share shapes, so each side compiles once
    emu = jax.jit(lambda q, k, v: emulated(q, k, v, causal=False, config=config))
    ref = jax.jit(
        lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="xla", config=config, return_residual="lse")
    )
    for name in ("q", "k", "v"):
        args = dict(q=q, k=k, v=v)
        args[name] = args[name].at[0, 40, 1, 7].set(jnp.nan)
        o_e, lse_e = emu(**args)
        o_r, lse_r = ref(**args)
        np.testing.assert_array_equal(np.isnan(np.asarray(o_e)), np.isnan(np.asarray(o_r, np.float32)), name)
        np.testing.assert_array_equal(np.isnan(np.asarray(lse_e)), np.isnan(np.asarray(lse_r)), name)
        assert np.isnan(np.asarray(o_e)).any()
