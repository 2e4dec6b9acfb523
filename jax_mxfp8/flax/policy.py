"""Per-layer precision policy: which GEMMs and attentions run in MXFP8, and with which gradient options."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.flax.checks import check_bool, patterns

PRECISIONS = ("mxfp8", "bf16")


@dataclasses.dataclass(frozen=True)
class LayerPrecision:
    """What one layer does.

    Attributes:
      gemm: "mxfp8" (MX GEMMs forward and backward) or "bf16" (BF16 operands, FP32 accumulation).
      attention: "mxfp8" (jax_mxfp8.dot_product_attention) or "bf16" (BF16 XLA attention), for
        attention layers.
      weight_grad: "mxfp8" or "bf16" weight gradient of MX GEMMs.
      grad_rounding: "nearest" or "stochastic" rounding of incoming gradients in MX GEMMs.
      hadamard: apply a random Hadamard transform on the contracted axis of MX GEMMs.
      quantize_epilogue: an MX GEMM whose output feeds another MX GEMM (the MLP's up -> GELU -> down)
        quantizes that output in its epilogue (jax_mxfp8.ops.mx_dot_quantized) and hands the MXArray
        over, instead of a separate quantize pass; the quantized values are then those of the float32
        GEMM result (+ bias, GELU) rather than of its rounding to the activation dtype (identical for
        float32 activations). Not with hadamard (the next GEMM rotates its operand first).

    Every field is checked at construction (ValueError naming it): the strings must be one of their
    options, the two flags a bool or a NumPy bool (stored as a Python bool; "no" or 0 are refused, not
    read as truthy or falsy).

    Known difference of gemm="bf16" (and of hadamard): the RMSNorm before such a layer is the reference
    rms_norm and its backward is autodiff, as in stock Flax, so rows whose RMS lies between ~1e13 and
    ~1.8e19 lose part of their gradient (rsqrt's derivative r^3 is subnormal or 0 there); the MXFP8
    policy's fused rms_norm_quantize backward does not (docs/numerics.md, "Edge inputs").
    """

    gemm: str = "mxfp8"
    attention: str = "mxfp8"
    weight_grad: str = "mxfp8"
    grad_rounding: str = "nearest"
    hadamard: bool = False
    quantize_epilogue: bool = True

    def __post_init__(self):
        for field in ("gemm", "attention", "weight_grad", "grad_rounding"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"{field}={getattr(self, field)!r} must be a str")
        for field in ("gemm", "attention"):
            if getattr(self, field) not in PRECISIONS:
                raise ValueError(f"{field}={getattr(self, field)!r} is not one of {PRECISIONS}")
        MXDotConfig(weight_grad=self.weight_grad, grad_rounding=self.grad_rounding)  # validates both
        for field in ("hadamard", "quantize_epilogue"):
            object.__setattr__(self, field, check_bool(getattr(self, field), field))

    def dot_config(self, seed: int = 0) -> MXDotConfig:
        """The MXDotConfig of this layer's MX GEMMs (hadamard seeded with `seed`)."""
        return MXDotConfig(
            weight_grad=self.weight_grad,
            grad_rounding=self.grad_rounding,
            hadamard_seed=seed if self.hadamard else None,
        )

    @property
    def fuses_quantize(self) -> bool:
        """Whether this layer's MX GEMMs hand their outputs to the next MX GEMM as MXArrays (quantize_epilogue)."""
        return self.gemm == "mxfp8" and self.quantize_epilogue and not self.hadamard

    def describe(self) -> tuple[str, str]:
        """(GEMM description, attention description) for PrecisionPolicy.table."""
        gemm = self.gemm
        if self.gemm == "mxfp8":
            extras = [f"wgrad {self.weight_grad}"]
            if self.grad_rounding == "stochastic":
                extras.append("SR grads")
            if self.hadamard:
                extras.append("RHT")
            gemm += f" ({', '.join(extras)})"
        return gemm, self.attention


MXFP8 = LayerPrecision()
BF16 = LayerPrecision(gemm="bf16", attention="bf16")


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    """Maps layer names (dotted paths such as "blocks.3.mlp.up") to a LayerPrecision.

    Rules are (glob pattern, LayerPrecision) pairs (fnmatch.fnmatchcase on the whole dotted name); the LAST
    matching rule wins, else `default`.

    Checked at construction (ValueError naming the argument): `default` must be a LayerPrecision (not a
    string such as "bf16": use jax_mxfp8.flax.BF16), `rules` a sequence of (non-empty str pattern,
    LayerPrecision) pairs, stored as a tuple of tuples.

    Example:
      PrecisionPolicy.mxfp8(bf16_layers=("blocks.3.*", "lm_head"))  # MXFP8 except the last block and head
    """

    default: LayerPrecision = MXFP8
    rules: tuple[tuple[str, LayerPrecision], ...] = ()

    def __post_init__(self):
        check_layer_precision(self.default, "default")
        if isinstance(self.rules, (str, bytes)) or not isinstance(self.rules, Iterable):
            raise ValueError(f"rules={self.rules!r} must be a sequence of (pattern, LayerPrecision) pairs")
        rules = []
        for i, rule in enumerate(self.rules):
            if isinstance(rule, (str, bytes)) or not isinstance(rule, Iterable) or len(tuple(rule)) != 2:
                raise ValueError(f"rules[{i}]={rule!r} must be a (pattern, LayerPrecision) pair")
            pattern, precision = tuple(rule)
            (pattern,) = patterns((pattern,), f"rules[{i}] pattern")
            rules.append((pattern, check_layer_precision(precision, f"rules[{i}] precision")))
        object.__setattr__(self, "rules", tuple(rules))

    @classmethod
    def mxfp8(
        cls,
        *,
        bf16_layers: str | Iterable[str] = (),
        weight_grad: str = "mxfp8",
        grad_rounding: str = "nearest",
        hadamard: bool = False,
    ) -> PrecisionPolicy:
        """MXFP8 everywhere except the glob patterns in `bf16_layers`, which run in BF16.

        bf16_layers: a sequence of glob patterns, or one pattern as a str ("lm_head" is that one name,
        not its characters).
        """
        layers = patterns(bf16_layers, "bf16_layers")
        default = LayerPrecision(weight_grad=weight_grad, grad_rounding=grad_rounding, hadamard=hadamard)
        return cls(default=default, rules=tuple((p, BF16) for p in layers))

    @classmethod
    def bf16(cls) -> PrecisionPolicy:
        """Everything in BF16: the baseline to compare MXFP8 training against."""
        return cls(default=BF16)

    def for_layer(self, name: str) -> LayerPrecision:
        """The LayerPrecision of the layer with this dotted name: the last rule whose pattern matches it."""
        if not isinstance(name, str):
            raise ValueError(f"name={name!r} must be a str layer name")
        chosen = self.default
        for pattern, precision in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                chosen = precision
        return chosen

    def table(self, layer_names: Iterable[str]) -> str:
        """A markdown table of what each named layer will do (attention layers are named "*.attn").

        layer_names: a sequence of names, or one name as a str."""
        rows = ["| layer | GEMMs | attention |", "| --- | --- | --- |"]
        for name in patterns(layer_names, "layer_names"):
            gemm, attention = self.for_layer(name).describe()
            rows.append(f"| {name} | {gemm} | {attention if name.endswith('attn') else '-'} |")
        return "\n".join(rows)


def check_layer_precision(value, name: str = "precision") -> LayerPrecision:
    """value if it is a LayerPrecision, else a ValueError naming `name` (e.g. a string "bf16" passed where
    jax_mxfp8.flax.BF16 is meant)."""
    if not isinstance(value, LayerPrecision):
        raise ValueError(
            f"{name}={value!r} must be a LayerPrecision (e.g. jax_mxfp8.flax.MXFP8 or jax_mxfp8.flax.BF16), "
            f"got {type(value).__name__}"
        )
    return value


def check_policy(value, name: str = "policy") -> PrecisionPolicy:
    """value if it is a PrecisionPolicy, else a ValueError naming `name`."""
    if not isinstance(value, PrecisionPolicy):
        raise ValueError(f"{name} must be a PrecisionPolicy, got {type(value).__name__}")
    return value
