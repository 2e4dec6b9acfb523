"""Adapters that plug MXFP8 into stock Flax modules (nnx.MultiHeadAttention, nnx.Linear, nn.Dense, ...)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_mxfp8.config.gemm import MXDotConfig
from jax_mxfp8.flax.checks import check_attention_config
from jax_mxfp8.ops.attention import dot_product_attention
from jax_mxfp8.ops.mx_dot_general import mx_dot_general
from jax_mxfp8.primitives import implementation as impl


def dot_general(**options) -> Callable:
    """A `dot_general` for nnx.Linear / nnx.Einsum / nn.Dense(dot_general=...) that runs MXFP8.

    `options` are MXDotConfig fields (weight_grad="bf16", hadamard_seed=0, ...), or config=MXDotConfig(...).
    Example: nnx.Linear(1024, 4096, dot_general=jax_mxfp8.flax.dot_general(weight_grad="bf16"), rngs=...)
    Bad options raise a ValueError naming them here, not at the module's first call.
    """
    opts = dict(options)
    implementation = opts.pop("implementation", None)
    impl.check(implementation)
    config = opts.pop("config", None)
    if config is not None and not isinstance(config, MXDotConfig):
        raise ValueError(f"config must be an MXDotConfig or None; got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(MXDotConfig)}
    params = set(inspect.signature(mx_dot_general).parameters) - {"lhs", "rhs", "dimension_numbers", "options"}
    unknown = sorted(set(opts) - known - params)
    if unknown:
        raise ValueError(f"unknown options {unknown}: use MXDotConfig fields {sorted(known)} or {sorted(params)}")
    config_opts = {k: v for k, v in opts.items() if k in known}
    dataclasses.replace(config or MXDotConfig(), **config_opts)  # validates the option values
    return functools.partial(mx_dot_general, **options)


def attention_fn(*, config=None, implementation: str | None = None) -> Callable:
    """An `attention_fn` for nnx.MultiHeadAttention / nn.MultiHeadDotProductAttention running MXFP8 attention.

    The returned function accepts every keyword those modules pass. What it cannot honour raises a
    ValueError: dropout inside attention (dropout_rate > 0 while not deterministic) and `module=` (sowing
    attention weights: the MXFP8 kernel never forms them). `precision`, `dtype` promotion and
    `force_fp32_for_softmax` are accepted: softmax statistics are always FP32.
    Layout: query (B, T, N, H), key/value (B, S, K, H); mask broadcastable to (B, N, T, S), True = attend.
    A bad `config` or `implementation` raises a ValueError here, not at the module's first call.
    """
    impl.check(implementation)
    check_attention_config(config, "config")

    def fn(
        query: jax.Array,
        key: jax.Array,
        value: jax.Array,
        bias: jax.Array | None = None,
        mask: jax.Array | None = None,
        broadcast_dropout: bool = True,
        dropout_rng: jax.Array | None = None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype=None,
        precision=None,
        module=None,
        is_causal: bool = False,
        promote_dtype=None,
        force_fp32_for_softmax: bool = False,
        **unknown,
    ) -> jax.Array:
        del broadcast_dropout, dropout_rng, precision, force_fp32_for_softmax
        if unknown:
            raise ValueError(f"jax_mxfp8 attention_fn does not support the arguments {sorted(unknown)}")
        if dropout_rate > 0.0 and not deterministic:
            raise ValueError(
                f"dropout_rate={dropout_rate}: dropout inside attention is not supported by MXFP8 attention; "
                "set dropout_rate=0 or deterministic=True"
            )
        if module is not None:
            raise ValueError("sowing attention weights (module=...) is not supported: MXFP8 attention never forms them")
        if mask is not None:
            mask = jnp.asarray(mask).astype(bool)  # Flax builds masks as 0/1 floats (nnx.make_causal_mask)
        if promote_dtype is not None:
            query, key, value = promote_dtype((query, key, value), dtype=dtype)
        if query.ndim != 4:
            raise ValueError(f"query must be (batch, length, heads, head_dim); got shape {query.shape}")
        out = dot_product_attention(
            query, key, value, bias=bias, mask=mask, is_causal=is_causal, implementation=implementation, config=config
        )
        return out.astype(dtype) if dtype is not None else out

    return fn
