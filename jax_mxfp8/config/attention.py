"""AttentionConfig: the numerics options of MXFP8 attention, and which MX block layout each GEMM operand uses.

The options are static (hashable, frozen): they select code paths at trace time and are part of the
custom_vjp's non-differentiable arguments.
"""

from __future__ import annotations

import dataclasses

from jax_mxfp8.config.fields import bool_field, int_field
from jax_mxfp8.formats.elements import BLOCK_SIZE
from jax_mxfp8.formats.scales import SCALE_ROUNDINGS

QKV_BLOCKS = ("square", "row")
P_SCALES = ("const", "block")
DQ_ACCUMS = ("fp32", "fp16")

# Block layouts of a (sequence, head_dim) operand tile.
SQUARE = "square"  # 32x32 over (sequence, head_dim): valid for GEMMs contracting either axis
HEAD = "head"  # 1x32 along head_dim: one position per block (no block spans two sequence positions)
SEQ = "seq"  # 32x1 along the sequence axis

DQ_FP16_SCALE_LOG2 = 12
"""dq_accum="fp16" keeps dQ * 2**12 in float16 by default (the static scale of the contract;
AttentionConfig.dq_fp16_scale_log2 changes it)."""
DQ_FP16_SCALE_LOG2_RANGE = (0, 15)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Numerics options of MXFP8 attention (the contract and its decisions: docs/numerics.md).

    Attributes:
      qkv_blocks: "square" (default): Q, K, V are each quantized once in 32x32 blocks over
        (sequence, head_dim); one quantization serves every GEMM of forward and backward. "row": each GEMM
        gets Q/K/V quantized in 1x32 blocks along its own contracting axis (Q, K along head_dim for
        S = Q K^T; V along the sequence for P V and along head_dim for dP = dO V^T; K along the sequence for
        dQ = dS K; Q along the sequence for dK = dS^T Q).
      p_scale: "const" (default): the softmax numerator P~ <= 1 is quantized with the fixed scale 2^-8
        (256 P~ rounded to E4M3). "block": one E8M0 scale per 32 elements along the GEMM's contracting axis
        (KV for P V in the forward, the query axis for dV = P^T dO in the backward).
      dq_accum: "fp32" (default) or "fp16": dQ is accumulated over KV tiles in float16 holding dQ * 2^e,
        e = dq_fp16_scale_log2; one float16 rounding per KV tile, tiles in ascending order (the Hopper
        kernel's deterministic mode exactly; its atomics round twice, in any order: docs/numerics.md).
        Beyond float16's range (|dQ| 2^e >= 65520) the accumulator holds +-Inf (or NaN): dq comes out Inf /
        NaN, never clamped.
      dq_fp16_scale_log2: e of dq_accum="fp16", an int in [0, 15] (default 12); ignored for "fp32". Larger e
        keeps more of small gradients (float16's subnormals start at 2^-14 / 2^e), smaller e more headroom.
      deterministic: False (default). True: dQ's accumulation over KV tiles is bit-identical across runs
        (the Hopper backward kernel orders its adds; the XLA reference always is).
      scale_rounding: "up" (default) or "floor" (OCP) for Q, K, V, dO and block-scaled P. dS always uses "up"
        (the contract fixes it: "floor" saturates up to 2x the element max, a bias gradients should not get).
      kv_tile: KV columns per online-softmax step (a positive multiple of 32; default 128, the kernel's tile).
        It changes numerics (the running max that P~ is quantized against), so kernel and reference must agree.
      causal_safe: False (default). True: no block used by the forward pass spans two sequence positions, so
        no output depends on later positions through a shared block scale (the "causal leak" of 32-row
        blocks). Q, K and V are quantized in 1x32 blocks along head_dim for S = Q K^T and O = P V (and V
        reuses that quantization for dP); the backward-only GEMMs (dQ's K, dK's Q) keep the qkv_blocks
        layout, which a kernel needs there and which cannot leak into outputs.
    """

    qkv_blocks: str = "square"
    p_scale: str = "const"
    dq_accum: str = "fp32"
    scale_rounding: str = "up"
    kv_tile: int = 128
    causal_safe: bool = False
    dq_fp16_scale_log2: int = DQ_FP16_SCALE_LOG2
    deterministic: bool = False

    def __post_init__(self):
        _check_choice("qkv_blocks", self.qkv_blocks, QKV_BLOCKS)
        _check_choice("p_scale", self.p_scale, P_SCALES)
        _check_choice("dq_accum", self.dq_accum, DQ_ACCUMS)
        _check_choice("scale_rounding", self.scale_rounding, SCALE_ROUNDINGS)
        kv_tile = int_field("AttentionConfig", "kv_tile", self.kv_tile, f"a positive multiple of {BLOCK_SIZE}")
        if kv_tile <= 0 or kv_tile % BLOCK_SIZE:
            raise ValueError(f"AttentionConfig.kv_tile={kv_tile!r} must be a positive multiple of {BLOCK_SIZE}")
        lo, hi = DQ_FP16_SCALE_LOG2_RANGE
        e = int_field("AttentionConfig", "dq_fp16_scale_log2", self.dq_fp16_scale_log2, f"an int in [{lo}, {hi}]")
        if not lo <= e <= hi:
            raise ValueError(f"AttentionConfig.dq_fp16_scale_log2={e!r} must be an int in [{lo}, {hi}]")
        # normalised (np.int64(64) -> 64, np.True_ -> True): equal configs hash and print alike
        object.__setattr__(self, "kv_tile", kv_tile)
        object.__setattr__(self, "dq_fp16_scale_log2", e)
        object.__setattr__(self, "causal_safe", bool_field("AttentionConfig", "causal_safe", self.causal_safe))
        object.__setattr__(self, "deterministic", bool_field("AttentionConfig", "deterministic", self.deterministic))


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"AttentionConfig.{name}={value!r} is not one of {choices}")


@dataclasses.dataclass(frozen=True)
class OperandLayouts:
    """Block layout (SQUARE, HEAD or SEQ) of each use of Q, K, V in the six attention GEMMs.

    q_s, k_s: S = tau Q K^T (forward and its backward recomputation; contracting head_dim).
    v_o: O = P V (contracting the sequence). v_dp: dP = dO V^T (contracting head_dim).
    q_dk: dK = tau dS^T Q (contracting the query sequence). k_dq: dQ = tau dS K (contracting the KV sequence).
    """

    q_s: str
    k_s: str
    v_o: str
    v_dp: str
    q_dk: str
    k_dq: str


def operand_layouts(config: AttentionConfig) -> OperandLayouts:
    """The MX block layout of every operand use under `config` (see AttentionConfig)."""
    if config.qkv_blocks == "square":
        lay = OperandLayouts(SQUARE, SQUARE, SQUARE, SQUARE, SQUARE, SQUARE)
    else:
        lay = OperandLayouts(q_s=HEAD, k_s=HEAD, v_o=SEQ, v_dp=HEAD, q_dk=SEQ, k_dq=SEQ)
    if config.causal_safe:
        # The forward's operands (and dP's V, which then reuses V's only quantization) go per position.
        lay = dataclasses.replace(lay, q_s=HEAD, k_s=HEAD, v_o=HEAD, v_dp=HEAD)
    return lay
