"""benchmarks/multi_gpu.py's LM on a mesh: examples/train_lm.py's model, data, optimizer and train_step placed
on a (data, fsdp, tp) mesh with examples/train_multihost.py's sharding (MeshRun), the BF16-gather training
step of part 3 (bf16_kernel_step), the collectives of a compiled step (collective_summary) and the
library's kernel calls in a compiled program (kernel_targets).
"""

from __future__ import annotations

import re
import sys
import time

import harness
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(harness.ROOT / "examples"))

import train_lm  # noqa: E402
import train_multihost  # noqa: E402
from lm_model import lm_loss, make_optimizer, train_step  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


def lm_args(sizes: dict, steps: int, policy: str, seed: int):
    """train_lm's own argument namespace for these sizes (so the model is exactly train_lm's)."""
    argv = ["--steps", str(steps), "--batch", str(sizes["batch"]), "--seq-len", str(sizes["seq_len"])]
    argv += ["--d-model", str(sizes["d_model"]), "--layers", str(sizes["layers"]), "--heads", str(sizes["heads"])]
    return train_lm.parse_args([*argv, "--policy", policy, "--seed", str(seed), "--no-bf16", "--no-progress"])


def bf16_gather(x: jax.Array, shard: NamedSharding, whole: NamedSharding) -> jax.Array:
    """x (float32, sharded `shard`) rounded to bfloat16 on the shard, then all-gathered in bfloat16 to `whole`.

    Constraining the rounded kernel to its own sharded spec does not place the all-gather: the partitioner
    keeps the value sharded through the MX quantizer (its float32 cast and shard-local blocks) and gathers
    where the GEMM needs the whole operand, i.e. the float32 dequantized values: on H200s that step
    gathered the FP32 variant's bytes (and, with no collective left between the f32 -> bf16 -> f32
    converts, XLA:GPU's simplify-fp-conversions may drop the rounding itself). The constraint to the
    gathered sharding (as gather_quantized does for the FP8 bytes) pins the gather to the bfloat16 value.
    Differentiated as is, the cotangent would get that replicated sharding too (an all-reduce of the weight
    gradient, sliced after the bf16 -> f32 casts, which no longer forms a reduce-scatter); the custom
    backward is the plain cast's, back on the shard, so the gradient reduce-scatters in float32 as in the
    other variants. XLA:CPU widens bf16 all-gathers to f32 (float-normalization-bf16): on CPU the compiled
    HLO shows f32 gathers, the bfloat16 ones are in the HLO after SPMD partitioning."""
    dtype = x.dtype

    @jax.custom_vjp
    def gather(x):
        return lax.with_sharding_constraint(lax.with_sharding_constraint(x.astype(jnp.bfloat16), shard), whole)

    def fwd(x):
        return gather(x), None

    def bwd(_, g):
        return (lax.with_sharding_constraint(g.astype(dtype), shard),)

    gather.defvjp(fwd, bwd)
    return gather(x)


def bf16_kernel_step(mesh: jax.sharding.Mesh):
    """lm_model.train_step with every layer kernel rounded to bfloat16 where it is used (float32 master
    weights; the gradient flows back through the cast): the usual mixed-precision FSDP, which all-gathers
    BF16 kernels: each kernel is rounded on its shard (param_spec) and all-gathered in bfloat16 to
    gathered_spec (bf16_gather). The gathered BF16 kernels serve the backward GEMMs too (no second gather;
    the FP8 variant re-gathers the float32 kernels there)."""

    def loss_fn(model, tokens):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def low(path, x):
            keys = train_multihost.path_keys(path)
            if keys[-1] != "kernel":
                return x
            shard = NamedSharding(mesh, train_multihost.param_spec(keys, x.shape))
            whole = NamedSharding(mesh, train_multihost.gathered_spec(".".join(str(k) for k in keys[:-1])))
            return bf16_gather(x, shard, whole)

        return lm_loss(nnx.merge(graphdef, jax.tree_util.tree_map_with_path(low, params), rest), tokens)

    @nnx.jit
    def step(model, optimizer, tokens: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
        optimizer.update(model, grads)
        return loss

    return step


class MeshRun:
    """One DecoderLM + optimizer placed on a (data, fsdp, tp) mesh, stepping with lm_model.train_step (or,
    bf16=True, with bf16_kernel_step)."""

    def __init__(self, args, vocab_size: int, sizes: dict[str, int], devices, *, fp8_gather: bool, bf16=False):
        self.mesh = train_multihost.make_mesh(sizes, devices)
        self.step_fn = bf16_kernel_step(self.mesh) if bf16 else train_step
        self.model = train_lm.build_model(args, train_lm.make_policy(args.policy, args.layers), vocab_size)
        train_multihost.shard_model(self.model, self.mesh, fp8_gather=fp8_gather)
        self.opt = make_optimizer(self.model, learning_rate=args.lr, steps=args.steps)
        train_multihost.settle_shardings(self.model, self.opt)
        self.batch_sharding = NamedSharding(self.mesh, P(("data", "fsdp"), None))

    def step(self, tokens: np.ndarray) -> float:
        batch = train_multihost.global_array(tokens, self.batch_sharding)
        return float(self.step_fn(self.model, self.opt, batch))  # float() waits for the step

    def hlo(self, tokens: np.ndarray) -> str:
        """The compiled training step (jit's cache holds it once step() has run)."""
        batch = train_multihost.global_array(tokens, self.batch_sharding)
        return self.step_fn.lower(self.model, self.opt, batch).compile().as_text()

    def forward_hlo(self, tokens: np.ndarray) -> str:
        """The compiled loss alone (lm_model.lm_loss: the forward, no gradient) on the same mesh."""
        batch = train_multihost.global_array(tokens, self.batch_sharding)
        return nnx.jit(lm_loss).lower(self.model, batch).compile().as_text()


KERNEL_CALL = re.compile(r'custom_call_target="(jax_mxfp8_[A-Za-z0-9_]*)"')


def kernel_targets(hlo: str) -> dict[str, int]:
    """{FFI target: count} of the library's kernel calls in a compiled HLO text (empty: every op of the
    program ran its XLA reference)."""
    counts: dict[str, int] = {}
    for name in KERNEL_CALL.findall(hlo):
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


ELEMENT = re.compile(r"(\w+)\[([\d,]*)\]")


def all_gather_bytes_by_dtype(colls: list[dict]) -> dict[str, int]:
    """{element dtype: bytes} over the results of every all-gather of train_multihost.step_collectives' list,
    counted per array, so that a combined (tuple) all-gather of several dtypes splits by dtype."""
    out: dict[str, int] = {}
    for c in colls:
        if c["op"] != "all-gather":
            continue
        for dtype, dims in ELEMENT.findall(c["shape"]):
            size = int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
            out[dtype] = out.get(dtype, 0) + train_multihost.DTYPE_BYTES.get(dtype, 4) * size
    return dict(sorted(out.items()))


def collective_summary(hlo: str) -> dict:
    colls = train_multihost.step_collectives(hlo)
    return {
        "all_gather_bytes": sum(c["bytes"] for c in colls if c["op"] == "all-gather"),
        "all_gather_bytes_by_dtype": all_gather_bytes_by_dtype(colls),
        "collectives": {
            k: {"count": n, "bytes": b} for k, (n, b) in train_multihost.collectives_by_kind(colls).items()
        },
        "kernel_custom_calls": hlo.count('custom_call_target="jax_mxfp8_'),
        "kernel_targets": kernel_targets(hlo),
    }
