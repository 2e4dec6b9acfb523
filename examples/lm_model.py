"""A small decoder-only LM built from jax_mxfp8's NNX modules (used by train_lm.py and the tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jax_mxfp8.flax import MXLinear, MXRMSNorm, PrecisionPolicy, TransformerBlock


class DecoderLM(nnx.Module):
    """tokens (B, T) int32 -> logits (B, T, vocab) float32. Policy layer names: "blocks.{i}.attn",
    "blocks.{i}.mlp", "lm_head".

    `dtype`: the activations' dtype (the embedding's output, every block's GEMM outputs, the residual
    stream); parameters stay float32 either way. float32 (default) is the CPU example's; bfloat16 is the usual
    mixed-precision GPU set-up (and the one the fused quantize epilogue covers: it writes bf16). The logits
    are float32 in both."""

    def __init__(
        self,
        vocab_size: int,
        *,
        d_model: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int | None = None,
        policy: PrecisionPolicy | None = None,
        attention_config=None,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        policy = policy or PrecisionPolicy()
        self.num_layers = num_layers
        self.embed = nnx.Embed(vocab_size, d_model, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(
            [
                TransformerBlock(
                    d_model,
                    num_heads,
                    num_kv_heads=num_kv_heads,
                    policy=policy,
                    name=f"blocks.{i}",
                    attention_config=attention_config,
                    dtype=dtype,
                    rngs=rngs,
                )
                for i in range(num_layers)
            ]
        )
        head = policy.for_layer("lm_head")
        self.norm = MXRMSNorm(d_model, precision=head)
        self.lm_head = MXLinear(d_model, vocab_size, precision=head, use_bias=False, dtype=jnp.float32, rngs=rngs)

    def layer_names(self) -> list[str]:
        names = [f"blocks.{i}.{part}" for i in range(self.num_layers) for part in ("attn", "mlp")]
        return names + ["lm_head"]

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, is_causal=True)
        h, h_q = self.norm(x)
        return self.lm_head(h, x_quantized=h_q).astype(jnp.float32)


def lm_loss(model: DecoderLM, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy (nats) of tokens (B, T + 1)."""
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def make_optimizer(model: DecoderLM, *, learning_rate: float, steps: int) -> nnx.Optimizer:
    warmup = min(50, steps // 5 + 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup, max(steps, warmup + 1), learning_rate / 10
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


@nnx.jit
def train_step(model: DecoderLM, optimizer: nnx.Optimizer, tokens: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(lm_loss)(model, tokens)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def eval_loss(model: DecoderLM, tokens: jax.Array) -> jax.Array:
    return lm_loss(model, tokens)
