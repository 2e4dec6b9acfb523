"""The LM of train_lm.py under a device mesh: data, FSDP and tensor parallelism, one or many processes.

Single process (any number of local devices; on CPU fake 8 with
XLA_FLAGS=--xla_force_host_platform_device_count=8):
    python examples/train_multihost.py --mesh data=2,fsdp=2,tp=2 --steps 20
Several processes (here 2 x 4 CPU devices on localhost; on GPUs one process per host):
    python examples/train_multihost.py --num-processes 2 --process-id 0 --coordinator localhost:12355 ... &
    python examples/train_multihost.py --num-processes 2 --process-id 1 --coordinator localhost:12355 ...

Parameters: column-parallel kernels (qkv, mlp up) are split (fsdp, tp), row-parallel kernels (attention
out, mlp down) (tp, fsdp), the LM head (fsdp, -): FSDP always splits the d_model axis (see param_spec);
the batch is split over (data, fsdp). With --fp8-gather every MXFP8 layer quantizes its kernel shard and
all-gathers FP8 bytes + scales instead of the FP32 kernel. Prints the losses, and the collectives of one
training step with their bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lm_model import DecoderLM, make_optimizer, train_step  # noqa: E402
from synthetic_text import CharTokenizer, generate_text  # noqa: E402

from jax_mxfp8.flax import PrecisionPolicy, use_quantized_gather  # noqa: E402

COLUMN_PARALLEL = ("qkv", "up")
ROW_PARALLEL = ("out", "down")
# A collective and its result shape. GPU backends split collectives into async "-start" / "-done" pairs:
# the "-done" op carries the result shape (a "-start" tuple also holds the operands), so "-start" is skipped.
COLLECTIVE = re.compile(
    r"= (?P<shape>\([^)]*\)|\S+) (?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<phase>-start|-done)?\("
)
DTYPE_BYTES = {"u8": 1, "s8": 1, "f8e4m3fn": 1, "f16": 2, "bf16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1}


def parse_mesh(text: str) -> dict[str, int]:
    sizes = {"data": 1, "fsdp": 1, "tp": 1}
    for part in filter(None, text.split(",")):
        name, _, n = part.partition("=")
        if name not in sizes:
            raise ValueError(f"--mesh axis {name!r} is not one of {sorted(sizes)}")
        sizes[name] = int(n)
    return sizes


def path_keys(path) -> tuple:
    """A jax tree path (of an nnx state or pure dict) as plain keys, for param_spec ('value' leaves dropped)."""
    keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
    return keys[:-1] if keys and keys[-1] == "value" else keys


def param_spec(path: tuple, shape: tuple[int, ...]) -> P:
    """PartitionSpec of one DecoderLM parameter, by its path.

    FSDP splits every kernel along its d_model axis: the input axis of qkv / up / lm_head, the output axis
    of out / down. Splitting down along its hidden input axis instead puts a mesh axis on a free axis of
    the backward's dX GEMM (dH = dY W^T, (tokens, hidden)) that the batch also wants; when the kernel is
    the larger operand (hidden > global tokens, e.g. d_model 2048 with 8 x 512 tokens) the partitioner
    keeps the kernel split and shards dH by hidden, then all-to-alls it back to the batch split and
    all-gathers activations for the weight-gradient GEMMs.
    """
    names = [str(p) for p in path]
    if names[-1] == "kernel" and len(shape) == 2:
        if names[-2] in COLUMN_PARALLEL:
            return P("fsdp", "tp")
        if names[-2] in ROW_PARALLEL:
            return P("tp", "fsdp")
        return P("fsdp", None)  # lm_head
    if names[-1] == "bias" and names[-2] in COLUMN_PARALLEL:
        return P("tp")
    return P()


def gathered_spec(path: str) -> P | None:
    """Where an FSDP-gathered kernel lives: still split over tp, whole over fsdp."""
    last = path.split(".")[-1]
    if last in COLUMN_PARALLEL:
        return P(None, "tp")
    if last in ROW_PARALLEL:
        return P("tp", None)
    return P()


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global jax.Array from a host value every process holds (works across processes)."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


def make_mesh(sizes: dict[str, int], devices=None) -> jax.sharding.Mesh:
    """A (data, fsdp, tp) mesh with Auto axes over the first data * fsdp * tp devices (or `devices`)."""
    n = sizes["data"] * sizes["fsdp"] * sizes["tp"]
    devices = jax.devices()[:n] if devices is None else devices
    if n > len(devices):
        raise ValueError(f"mesh {sizes} needs {n} devices; {len(devices)} are available")
    return jax.make_mesh(
        tuple(sizes.values()), tuple(sizes), axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices[:n]
    )


def shard_model(model: DecoderLM, mesh: jax.sharding.Mesh, *, fp8_gather: bool = False) -> None:
    """Places the model's parameters on `mesh` (param_spec) in place; with fp8_gather every MXFP8 layer
    all-gathers its kernel as MXFP8 bytes + scales (use_quantized_gather). Create the optimizer after."""
    params = nnx.state(model, nnx.Param)
    sharded = jax.tree.map_with_path(
        lambda path, v: global_array(
            np.asarray(v),
            NamedSharding(mesh, param_spec(path_keys(path), v.shape)),
        ),
        nnx.to_pure_dict(params),
    )
    nnx.replace_by_pure_dict(params, sharded)
    nnx.update(model, params)
    if fp8_gather:
        use_quantized_gather(model, lambda path, layer: NamedSharding(mesh, gathered_spec(path)))


def settle_shardings(*nodes) -> None:
    """Gives every array of the NNX nodes (model, optimizer) the sharding a jitted step returns it with: the
    same layout, spelled as jit spells it (e.g. P() for an axis of size 1), scalars moved onto the mesh. The
    first step's compilation then serves every later step, instead of the second step compiling again."""
    state = nnx.state(nodes)
    nnx.update(nodes, jax.jit(lambda s: jax.tree.map(lambda x: x + jnp.zeros((), x.dtype), s))(state))


def step_collectives(compiled_text: str) -> list[dict]:
    """Every collective of a compiled HLO text: op, result shape, dtype(s) and result bytes."""
    out = []
    for m in COLLECTIVE.finditer(compiled_text):
        if m["phase"] == "-start":
            continue
        shapes = re.findall(r"(\w+)\[([\d,]*)\]", m["shape"])
        nbytes = sum(
            DTYPE_BYTES.get(t, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1])) for t, dims in shapes
        )
        out.append(
            {"op": m["op"], "shape": m["shape"], "dtype": "+".join(sorted({t for t, _ in shapes})), "bytes": nbytes}
        )
    return out


def collectives_by_kind(collectives: list[dict]) -> dict[str, tuple[int, int]]:
    """{"op dtype": (count, bytes)} of step_collectives' list."""
    kinds = {}
    for c in collectives:
        key = f"{c['op']} {c['dtype']}"
        count, nbytes = kinds.get(key, (0, 0))
        kinds[key] = (count + 1, nbytes + c["bytes"])
    return kinds


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", default="data=2,fsdp=2,tp=2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--policy", default="mxfp8", choices=["mxfp8", "bf16"])
    p.add_argument("--fp8-gather", action="store_true", help="FSDP: all-gather MXFP8 kernels, not FP32")
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--coordinator", default="localhost:12355")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write a JSON summary here (process 0)")
    return p.parse_args(argv)


def run(args) -> dict:
    if args.num_processes > 1:
        if jax.config.jax_platforms in (None, "", "cpu"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    sizes = parse_mesh(args.mesh)
    mesh = make_mesh(sizes)

    text = generate_text(200_000, seed=1234)
    tok = CharTokenizer(text)
    tokens = tok.encode(text)
    policy = PrecisionPolicy.mxfp8() if args.policy == "mxfp8" else PrecisionPolicy.bf16()
    model = DecoderLM(
        tok.vocab_size,
        d_model=args.d_model,
        num_layers=args.layers,
        num_heads=args.heads,
        policy=policy,
        rngs=nnx.Rngs(args.seed),
    )
    shard_model(model, mesh, fp8_gather=args.fp8_gather)
    opt = make_optimizer(model, learning_rate=args.lr, steps=args.steps)
    settle_shardings(model, opt)

    rng = np.random.default_rng(args.seed)
    batch_sharding = NamedSharding(mesh, P(("data", "fsdp"), None))
    losses, collectives = [], None
    for step in range(args.steps):
        starts = rng.integers(0, len(tokens) - args.seq_len - 1, size=args.batch)
        batch = global_array(np.stack([tokens[s : s + args.seq_len + 1] for s in starts]), batch_sharding)
        if collectives is None:
            collectives = step_collectives(train_step.lower(model, opt, batch).compile().as_text())
        losses.append(float(train_step(model, opt, batch)))
        if jax.process_index() == 0 and ((step + 1) % 5 == 0 or step + 1 == args.steps):
            print(f"step {step + 1:3d}  loss {losses[-1]:.5f}", flush=True)

    gathered = sum(c["bytes"] for c in collectives if c["op"] == "all-gather")
    summary = {
        "mesh": sizes,
        "processes": jax.process_count(),
        "fp8_gather": args.fp8_gather,
        "losses": losses,
        "collectives": collectives,
        "all_gather_bytes": gathered,
    }
    if jax.process_index() == 0:
        print(f"mesh {sizes} on {jax.process_count()} process(es); collectives of one training step:")
        for kind, (count, nbytes) in sorted(collectives_by_kind(collectives).items()):
            op, dtype = kind.split(" ")
            print(f"  {op:18s} {dtype:8s} x{count:3d}  {nbytes / 1024:10.1f} KiB")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    run(parse_args())
