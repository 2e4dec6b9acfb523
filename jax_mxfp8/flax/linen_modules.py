"""Flax Linen equivalents of the NNX modules (same math, from flax/functional.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jax_mxfp8.flax import functional as F
from jax_mxfp8.flax.checks import check_attention_config, check_bool, check_input
from jax_mxfp8.flax.policy import MXFP8, LayerPrecision, PrecisionPolicy, check_layer_precision, check_policy
from jax_mxfp8.formats import MXArray
from jax_mxfp8.ops.checks import check_eps, check_features


class MXDense(nn.Module):
    """Linen dense layer with MXFP8 GEMMs: (..., D_in) -> (..., features). See nnx_modules.MXLinear.

    Stochastic gradient rounding draws keys from the "quant" RNG stream (pass rngs={"quant": key}).
    """

    features: int
    precision: LayerPrecision = MXFP8
    use_bias: bool = True
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    hadamard_seed: int = 0

    def __post_init__(self):
        check_layer_precision(self.precision)
        check_features(self.features, "features")
        check_bool(self.use_bias, "use_bias")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, *, x_quantized: MXArray | None = None, activation: str | None = None):
        """y = x @ kernel + bias; activation="gelu": (gelu(y), its MXHandoff or None), functional.linear_gelu
        (the GEMM's quantize epilogue hands the next MX GEMM its operand when precision.fuses_quantize)."""
        if activation not in (None, "gelu"):
            raise ValueError(f"activation={activation!r} is not one of (None, 'gelu')")
        check_input(x, type(self).__name__)
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        stochastic = self.precision.gemm == "mxfp8" and self.precision.grad_rounding == "stochastic"
        rng = self.make_rng("quant") if stochastic else None
        if activation == "gelu":
            return F.linear_gelu(x, kernel, bias, self.precision, dtype=self.dtype, x_quantized=x_quantized, rng=rng)
        return F.linear(
            x,
            kernel,
            bias,
            self.precision,
            dtype=self.dtype,
            x_quantized=x_quantized,
            rng=rng,
            hadamard_seed=self.hadamard_seed,
        )


class MXRMSNorm(nn.Module):
    """Linen RMSNorm returning (y, MXArray of y or None). See nnx_modules.MXRMSNorm."""

    precision: LayerPrecision = MXFP8
    eps: float = 1e-6
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        check_layer_precision(self.precision)
        check_eps(self.eps)
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, MXArray | None]:
        check_input(x, type(self).__name__)  # before the scale's shape reads x.shape[-1]
        scale = self.param("scale", nn.initializers.ones_init(), (x.shape[-1],), self.param_dtype)
        return F.norm(x, scale, self.precision, self.eps)


class MXAttention(nn.Module):
    """Linen multi-head self-attention with GQA and RoPE (dense (B, T, D) input). See nnx_modules.MXAttention."""

    num_heads: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    precision: LayerPrecision = MXFP8
    attention_config: object = None
    use_rope: bool = True
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32

    def __post_init__(self):
        check_features(self.num_heads, "num_heads")
        for name in ("num_kv_heads", "head_dim"):
            if getattr(self, name) is not None:
                check_features(getattr(self, name), name)
        check_layer_precision(self.precision)
        check_attention_config(self.attention_config)
        check_bool(self.use_rope, "use_rope")
        super().__post_init__()

    @nn.compact
    def __call__(
        self, x: jax.Array, *, x_quantized: MXArray | None = None, is_causal: bool = True, mask: jax.Array | None = None
    ) -> jax.Array:
        check_input(x, type(self).__name__, rank=3)
        n = self.num_heads
        k = self.num_kv_heads or n
        h = self.head_dim or x.shape[-1] // n
        if n % k:
            raise ValueError(f"num_heads={n} is not a multiple of num_kv_heads={k}")
        common = dict(precision=self.precision, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
        qkv = MXDense((n + 2 * k) * h, name="qkv", **common)(x, x_quantized=x_quantized)
        q, kk, v = jnp.split(qkv, [n * h, (n + k) * h], axis=-1)
        q, kk, v = q.reshape(*x.shape[:-1], n, h), kk.reshape(*x.shape[:-1], k, h), v.reshape(*x.shape[:-1], k, h)
        if self.use_rope:
            pos = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
            q, kk = F.rope(q, pos), F.rope(kk, pos)
        o = F.attention(q, kk, v, self.precision, is_causal=is_causal, mask=mask, config=self.attention_config)
        return MXDense(x.shape[-1], name="out", **common)(o.reshape(*o.shape[:-2], n * h))


class TransformerBlock(nn.Module):
    """Linen pre-norm transformer block (see nnx_modules.TransformerBlock); policy names f"{name}.attn/.mlp"."""

    num_heads: int
    num_kv_heads: int | None = None
    mlp_ratio: int = 4
    policy: PrecisionPolicy = PrecisionPolicy()
    layer_name: str = "block"
    attention_config: object = None
    dtype: jnp.dtype | None = None

    def __post_init__(self):
        check_features(self.num_heads, "num_heads")
        if self.num_kv_heads is not None:
            check_features(self.num_kv_heads, "num_kv_heads")
        check_features(self.mlp_ratio, "mlp_ratio")
        check_policy(self.policy)
        check_attention_config(self.attention_config)
        if not isinstance(self.layer_name, str):
            raise ValueError(f"layer_name={self.layer_name!r} must be a str (the prefix the policy matches)")
        super().__post_init__()

    @nn.compact
    def __call__(self, x: jax.Array, *, is_causal: bool = True, mask: jax.Array | None = None) -> jax.Array:
        check_input(x, type(self).__name__, rank=3)
        attn_p = self.policy.for_layer(f"{self.layer_name}.attn")
        mlp_p = self.policy.for_layer(f"{self.layer_name}.mlp")
        d = x.shape[-1]
        h, h_q = MXRMSNorm(precision=attn_p, name="norm1")(x)
        x = x + MXAttention(
            self.num_heads,
            self.num_kv_heads,
            precision=attn_p,
            attention_config=self.attention_config,
            dtype=self.dtype,
            name="attn",
        )(h, x_quantized=h_q, is_causal=is_causal, mask=mask)
        h, h_q = MXRMSNorm(precision=mlp_p, name="norm2")(x)
        g, g_q = MXDense(self.mlp_ratio * d, precision=mlp_p, dtype=self.dtype, name="up")(
            h, x_quantized=h_q, activation="gelu"
        )
        return x + MXDense(d, precision=mlp_p, dtype=self.dtype, name="down")(g, x_quantized=g_q)
