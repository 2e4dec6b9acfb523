"""Flax NNX modules with MXFP8 GEMMs and attention (parameters here, math in flax/functional.py)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jax_mxfp8.flax import functional as F
from jax_mxfp8.flax.checks import check_attention_config, check_bool, check_input
from jax_mxfp8.flax.policy import MXFP8, LayerPrecision, PrecisionPolicy, check_layer_precision, check_policy
from jax_mxfp8.formats import MXArray
from jax_mxfp8.ops.checks import check_eps, check_features

DEFAULT_POLICY = PrecisionPolicy()
default_kernel_init = nnx.initializers.lecun_normal()
default_bias_init = nnx.initializers.zeros_init()


class MXLinear(nnx.Module):
    """Dense layer y = x @ W + b with MXFP8 GEMMs forward and backward; W stays in `param_dtype`.

    Args:
      in_features, out_features: sizes; in_features must be a multiple of 32 for MXFP8.
      precision: LayerPrecision (default MXFP8). "bf16" GEMMs use BF16 operands, FP32 accumulation.
      use_bias: add a bias.
      dtype: output dtype (default: the input's).
      param_dtype: dtype of W and b (default float32).
      hadamard_seed: seed of the random Hadamard transform when precision.hadamard is set.
      rngs: nnx.Rngs for initialisation; with stochastic gradient rounding it also supplies the rounding
        keys (stream "quant" if present, else "default").
    Call: (..., in_features) -> (..., out_features); x_quantized= an MXArray of x (e.g. from MXRMSNorm).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        precision: LayerPrecision = MXFP8,
        use_bias: bool = True,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=default_kernel_init,
        bias_init=default_bias_init,
        hadamard_seed: int = 0,
        rngs: nnx.Rngs,
    ):
        precision = check_layer_precision(precision)
        use_bias = check_bool(use_bias, "use_bias")
        mxfp8 = precision.gemm == "mxfp8"
        in_features = check_features(in_features, "in_features", multiple_of_block=mxfp8)
        out_features = check_features(out_features, "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.precision, self.dtype, self.hadamard_seed = precision, dtype, hadamard_seed
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None
        self.gather_sharding = None  # set by jax_mxfp8.flax.use_quantized_gather (FSDP)
        self.quant_rngs = rngs.fork() if precision.grad_rounding == "stochastic" and precision.gemm == "mxfp8" else None

    def _inputs(self, x: jax.Array):
        check_input(x, type(self).__name__)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features on its last axis; this layer takes {self.in_features}")
        rng = None
        if self.quant_rngs is not None:
            rng = self.quant_rngs.quant() if "quant" in self.quant_rngs else self.quant_rngs.default()
        return self.kernel[...], None if self.bias is None else self.bias[...], rng

    def __call__(self, x: jax.Array, *, x_quantized: MXArray | None = None) -> jax.Array:
        kernel, bias, rng = self._inputs(x)
        return F.linear(
            x,
            kernel,
            bias,
            self.precision,
            dtype=self.dtype,
            x_quantized=x_quantized,
            rng=rng,
            hadamard_seed=self.hadamard_seed,
            gather_sharding=self.gather_sharding,
        )

    def gelu(self, x: jax.Array, *, x_quantized: MXArray | None = None) -> tuple[jax.Array, F.MXHandoff | None]:
        """(jax.nn.gelu(self(x)), its MXHandoff (both orientations) for the next MX GEMM's x_quantized, or
        None): functional.linear_gelu (the GEMM's quantize epilogue when precision.fuses_quantize)."""
        kernel, bias, rng = self._inputs(x)
        return F.linear_gelu(
            x, kernel, bias, self.precision, dtype=self.dtype, x_quantized=x_quantized, rng=rng,
            gather_sharding=self.gather_sharding,
        )  # fmt: skip


def use_quantized_gather(
    model: nnx.Module, sharding_for: Callable[[str, MXLinear], jax.sharding.Sharding | None]
) -> int:
    """Makes every MXLinear in `model` all-gather its kernel as MXFP8 (FSDP pre-all-gather quantization).

    `sharding_for(path, layer)` returns the sharding the gathered kernel should have (e.g. replicated over
    the FSDP axis, still split over a tensor-parallel axis), or None to leave that layer alone.
    Returns the number of layers changed. ValueError naming sharding_for when it is not callable or returns
    anything but a jax.sharding.Sharding or None (then no layer is changed).
    """
    if not callable(sharding_for):
        raise ValueError(
            f"sharding_for={sharding_for!r} must be a callable (path, layer) -> jax.sharding.Sharding | None"
        )
    chosen = []
    for path, layer in nnx.iter_graph(model):
        if isinstance(layer, MXLinear):
            name = ".".join(str(p) for p in path)
            sharding = sharding_for(name, layer)
            if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
                raise ValueError(
                    f"sharding_for({name!r}, layer) returned {sharding!r}; it must return a "
                    "jax.sharding.Sharding or None"
                )
            chosen.append((layer, sharding))
    for layer, sharding in chosen:
        layer.gather_sharding = sharding
    return sum(sharding is not None for _, sharding in chosen)


class MXRMSNorm(nnx.Module):
    """RMSNorm whose output also comes back as an MXArray (row blocks along the features) when the layer
    after it runs MXFP8, so that layer skips its own quantize pass.

    Call: x (..., features) -> (y (..., features) in x.dtype, MXArray of y or None).
    """

    def __init__(
        self,
        features: int,
        *,
        precision: LayerPrecision = MXFP8,
        eps: float = 1e-6,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs
        precision = check_layer_precision(precision)
        # the fused RMSNorm + quantize blocks the feature axis when the next GEMM runs in MXFP8 (functional.norm)
        fused = precision.gemm == "mxfp8" and not precision.hadamard
        features = check_features(features, "features", multiple_of_block=fused)
        self.precision, self.eps = precision, check_eps(eps)
        self.scale = nnx.Param(jnp.ones((features,), param_dtype))

    def __call__(self, x: jax.Array) -> tuple[jax.Array, MXArray | None]:
        check_input(x, type(self).__name__)
        return F.norm(x, self.scale[...], self.precision, self.eps)


class MXAttention(nnx.Module):
    """Multi-head self-attention with GQA, RoPE, MXFP8 projections and MXFP8 attention.

    Args:
      features: model width D.
      num_heads: query heads N; num_kv_heads: K (N % K == 0; default N).
      head_dim: H (default D // N); a multiple of 32 up to 256 for MXFP8 attention.
      precision: LayerPrecision of the projections and of the attention itself.
      attention_config: jax_mxfp8.AttentionConfig for the MXFP8 attention (default config).
      use_rope: apply rotary position embeddings to q and k.
    Call:
      dense: x (B, T, D) -> (B, T, D), with is_causal and an optional boolean mask (B|1, N|1, T, T).
      jagged: x (T_total, D) packed sequences with cu_seqlens (B + 1,) int32 and static max_seqlen, checked
        (concrete) or sanitized (traced) by one rule for every precision (functional.packed_offsets, the
        rule of jax_mxfp8.varlen_attention).
      x_quantized: the MXArray of x from MXRMSNorm (skips quantizing x for the QKV GEMM).
    """

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        precision: LayerPrecision = MXFP8,
        attention_config=None,
        use_rope: bool = True,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        precision = check_layer_precision(precision)
        attention_config = check_attention_config(attention_config)
        use_rope = check_bool(use_rope, "use_rope")
        features = check_features(features, "features")
        num_heads = check_features(num_heads, "num_heads")
        num_kv_heads = num_heads if num_kv_heads is None else check_features(num_kv_heads, "num_kv_heads")
        if head_dim is None:
            if features % num_heads:
                raise ValueError(
                    f"num_heads={num_heads} does not divide features={features}; pass head_dim= explicitly"
                )
            head_dim = features // num_heads
        head_dim = check_features(head_dim, "head_dim")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.precision, self.attention_config, self.use_rope = precision, attention_config, use_rope
        qkv_out = (num_heads + 2 * num_kv_heads) * head_dim
        common = dict(precision=precision, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.qkv = MXLinear(features, qkv_out, use_bias=False, **common)
        self.out = MXLinear(num_heads * head_dim, features, use_bias=False, **common)

    def _split_heads(self, qkv: jax.Array):
        n, k, h = self.num_heads, self.num_kv_heads, self.head_dim
        q, kk, v = jnp.split(qkv, [n * h, (n + k) * h], axis=-1)
        lead = qkv.shape[:-1]
        return q.reshape(*lead, n, h), kk.reshape(*lead, k, h), v.reshape(*lead, k, h)

    def __call__(
        self,
        x: jax.Array,
        *,
        x_quantized: MXArray | None = None,
        is_causal: bool = True,
        mask: jax.Array | None = None,
        cu_seqlens: jax.Array | None = None,
        max_seqlen: int | None = None,
    ) -> jax.Array:
        check_input(x, type(self).__name__, rank=3 if cu_seqlens is None else 2)
        if cu_seqlens is not None:
            if max_seqlen is None:
                raise ValueError(f"{type(self).__name__}: cu_seqlens (packed x (T_total, D)) needs max_seqlen")
            if mask is not None:
                raise ValueError("mask is not supported with cu_seqlens (sequences already isolate each other)")
            # one offsets rule for every precision (checked, or sanitized when traced), RoPE positions included
            cu_seqlens, max_seqlen = F.packed_offsets(cu_seqlens, max_seqlen, x.shape[0])
        q, k, v = self._split_heads(self.qkv(x, x_quantized=x_quantized))
        if cu_seqlens is not None:
            if self.use_rope:
                pos = F.positions_in_sequences(cu_seqlens, x.shape[0])
                q, k = F.rope(q[None], pos[None])[0], F.rope(k[None], pos[None])[0]
            o = F.jagged_attention(
                q, k, v, cu_seqlens, max_seqlen, self.precision, is_causal=is_causal, config=self.attention_config
            )
        else:
            if self.use_rope:
                pos = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
                q, k = F.rope(q, pos), F.rope(k, pos)
            o = F.attention(q, k, v, self.precision, is_causal=is_causal, mask=mask, config=self.attention_config)
        # (..., N, H) -> (..., N * H), spelled out: -1 cannot be inferred when there are no rows
        return self.out(o.reshape(*o.shape[:-2], self.num_heads * self.head_dim))


class MXMLP(nnx.Module):
    """GELU MLP: (..., D) -> (..., D) through a hidden width; both GEMMs MXFP8 per `precision`."""

    def __init__(
        self,
        features: int,
        hidden: int,
        *,
        precision: LayerPrecision = MXFP8,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        precision = check_layer_precision(precision)
        common = dict(precision=precision, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.up = MXLinear(features, hidden, **common)
        self.down = MXLinear(hidden, features, **common)

    def __call__(self, x: jax.Array, *, x_quantized: MXArray | None = None) -> jax.Array:
        check_input(x, type(self).__name__)
        # with precision.fuses_quantize the up GEMM's epilogue quantizes gelu(h) for the down GEMM
        h, h_q = self.up.gelu(x, x_quantized=x_quantized)
        return self.down(h, x_quantized=h_q)


class TransformerBlock(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)); fused RMSNorm+quantize feeds the
    QKV and MLP-up GEMMs. Layer names for the policy: f"{name}.attn", f"{name}.mlp" (and .norm1/.norm2
    follow the GEMM after them).
    """

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        mlp_ratio: int = 4,
        policy: PrecisionPolicy = DEFAULT_POLICY,
        name: str = "block",
        attention_config=None,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        policy = check_policy(policy)
        attention_config = check_attention_config(attention_config)
        if not isinstance(name, str):
            raise ValueError(f"name={name!r} must be a str (the layer-name prefix the policy matches)")
        mlp_ratio = check_features(mlp_ratio, "mlp_ratio")
        attn_p, mlp_p = policy.for_layer(f"{name}.attn"), policy.for_layer(f"{name}.mlp")
        common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm1 = MXRMSNorm(features, precision=attn_p, param_dtype=param_dtype)
        self.attn = MXAttention(
            features,
            num_heads,
            num_kv_heads=num_kv_heads,
            precision=attn_p,
            attention_config=attention_config,
            **common,
        )
        self.norm2 = MXRMSNorm(features, precision=mlp_p, param_dtype=param_dtype)
        self.mlp = MXMLP(features, mlp_ratio * features, precision=mlp_p, **common)

    def __call__(self, x: jax.Array, **attention_kwargs) -> jax.Array:
        """x (B, T, D), or packed (T_total, D) with cu_seqlens= and max_seqlen=; attention_kwargs go to
        MXAttention (is_causal, mask, cu_seqlens, max_seqlen). Returns x's shape and dtype."""
        check_input(x, type(self).__name__, rank=3 if attention_kwargs.get("cu_seqlens") is None else 2)
        h, h_q = self.norm1(x)
        x = x + self.attn(h, x_quantized=h_q, **attention_kwargs)
        h, h_q = self.norm2(x)
        return x + self.mlp(h, x_quantized=h_q)
