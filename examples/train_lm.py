"""Train a small decoder-only LM with MXFP8 GEMMs and attention next to a BF16 twin (the README's main job).

The text is real and needs no download: the Python standard library's own source files, byte-level,
with a held-out split of whole files (examples/stdlib_text.py; `--corpus synthetic` for the old
synthetic grammar). Both models start from the same initial weights and see the same batches; the script
prints their losses side by side, evaluates held-out loss, reports tokens/s, writes a PNG plot of both
curves and a JSON history, and saves a checkpoint that --resume continues from. CPU by default (a few
minutes on 2 cores); a GPU is used if JAX sees one; `--preset h200` sizes the model for one H200.

Timing: the steps run in windows of --log-every steps, each model's window enqueued back to back and read
back once at its end (the losses of every step included), so the host never waits for the GPU inside a
window; the tokens/s printed per window and in the summary are then the GPU-bound figure (window time over
its steps, the first two, compiling steps excluded), not the host's per-step round trip.

Run: python examples/train_lm.py [--steps 200] [--d-model 128] [--layers 2] [--policy mxfp8-head-bf16]
     python examples/train_lm.py --preset h200            # on the GPU machine, with the kernels installed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lm_checkpoint import restore_checkpoint, save_checkpoint  # noqa: E402
from lm_model import DecoderLM, eval_loss, make_optimizer, train_step  # noqa: E402
from stdlib_text import ByteTokenizer  # noqa: E402
from stdlib_text import load_corpus as load_stdlib  # noqa: E402
from synthetic_text import CharTokenizer, generate_text  # noqa: E402

from jax_mxfp8.flax import PrecisionPolicy  # noqa: E402

POLICIES = {
    "mxfp8": lambda: PrecisionPolicy.mxfp8(),
    "mxfp8-head-bf16": lambda: PrecisionPolicy.mxfp8(bf16_layers=("lm_head",)),
    "mxfp8-last-block-bf16": lambda n: PrecisionPolicy.mxfp8(bf16_layers=(f"blocks.{n - 1}.*", "lm_head")),
    "mxfp8-sr": lambda: PrecisionPolicy.mxfp8(bf16_layers=("lm_head",), grad_rounding="stochastic"),
    "mxfp8-wgrad-bf16": lambda: PrecisionPolicy.mxfp8(bf16_layers=("lm_head",), weight_grad="bf16"),
}


PRESETS = {
    # one H200: ~100M parameters (8 x d1024, head_dim 128 so the Hopper attention kernel takes it, GQA 8/2),
    # 16 x 2048 tokens per step
    "h200": dict(
        steps=1000,
        batch=16,
        seq_len=2048,
        d_model=1024,
        layers=8,
        heads=8,
        kv_heads=2,
        lr=1e-3,
        eval_every=100,
        eval_batches=8,
        log_every=50,
        # bfloat16 activations (parameters stay float32): benchmarks/profile_lm_step.py measured both on the
        # H200 (benchmarks/results/h200_profile_lm_step.json, 2026-12-02): MXFP8 60.7 vs 70.4 ms per step,
        # BF16 46.4 vs 54.6 ms, and only bfloat16 outputs take the GEMM's quantize epilogue
        dtype="bfloat16",
    ),
}


def make_policy(name: str, num_layers: int) -> PrecisionPolicy:
    if name not in POLICIES:
        raise ValueError(f"--policy {name!r} is not one of {sorted(POLICIES)}")
    factory = POLICIES[name]
    return factory(num_layers) if name == "mxfp8-last-block-bf16" else factory()


def batches(tokens: np.ndarray, batch: int, seq_len: int, seed: int):
    """Endless random windows (batch, seq_len + 1) of the token stream."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch)
        yield np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def load_corpus(name: str = "stdlib") -> tuple[CharTokenizer | ByteTokenizer, np.ndarray, np.ndarray, str]:
    """(tokenizer, training tokens, held-out tokens, description) of corpus `name`: "stdlib" (the Python
    standard library's source, bytes, whole files held out) or "synthetic" (a small grammar, characters)."""
    if name == "stdlib":
        corpus = load_stdlib()
        return ByteTokenizer(), corpus.train, corpus.val, corpus.describe()
    if name != "synthetic":
        raise ValueError(f"--corpus {name!r} is not 'stdlib' or 'synthetic'")
    text = generate_text(400_000, seed=1234)
    tok = CharTokenizer(text)
    return tok, tok.encode(text), tok.encode(generate_text(40_000, seed=4321)), "synthetic grammar text"


def build_model(args: argparse.Namespace, policy: PrecisionPolicy, vocab_size: int) -> DecoderLM:
    """The DecoderLM of these arguments; the same seed gives the same initial weights for any policy."""
    return DecoderLM(
        vocab_size,
        d_model=args.d_model,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        policy=policy,
        dtype=jnp.dtype(getattr(args, "dtype", "float32")),
        rngs=nnx.Rngs(args.seed),
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a sized configuration; flags given still win")
    p.add_argument("--corpus", default="stdlib", choices=["stdlib", "synthetic"])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None, help="GQA: fewer key/value heads (default: --heads)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="activation dtype of both models (parameters stay float32)",
    )
    p.add_argument("--policy", default="mxfp8-head-bf16", choices=sorted(POLICIES))
    p.add_argument("--no-bf16", action="store_true", help="train only the MXFP8 model")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument(
        "--log-every",
        type=int,
        default=10,
        help="steps per timing window: one read-back (sync) per window and model, its tokens/s printed",
    )
    p.add_argument("--eval-batches", type=int, default=1, help="held-out batches of 32 windows per evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/train_lm", help="folder for the plot, history and checkpoint")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument(
        "--stop-after", type=int, default=None, help="save a checkpoint and stop after this step (preemption)"
    )
    p.add_argument("--no-progress", action="store_true")
    preset = p.parse_known_args(argv)[0].preset
    if preset:
        p.set_defaults(**PRESETS[preset])
    return p.parse_args(argv)


def window_ends(start: int, end: int, log_every: int, eval_every: int) -> list[int]:
    """The steps (1-based) at which a timing window ends: the first two steps together (they compile: the
    second call can compile again for its inputs' new layouts), then every multiple of log_every, every
    multiple of eval_every (evaluations fall on window ends) and `end`."""
    if log_every < 1 or eval_every < 1:
        raise ValueError(f"--log-every {log_every} and --eval-every {eval_every} must be >= 1")
    warm = min(start + 2, end)
    ends = {warm, end} | {s for s in range(start + 1, end + 1) if s % eval_every == 0}
    ends |= {s for s in range(warm + 1, end + 1) if s % log_every == 0}
    return sorted(e for e in ends if start < e <= end)


def train_window(step_fn, device_batches: list) -> tuple[list[float], float]:
    """Runs step_fn on each batch without waiting for any (JAX dispatches them asynchronously), then reads
    all their losses back at once: (losses, seconds from the first dispatch to the last loss on the host)."""
    t0 = time.perf_counter()
    losses = [step_fn(b) for b in device_batches]
    values = jax.device_get(losses)  # the window's one sync
    return [float(v) for v in values], time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    """Trains the models and returns the history dict (also written to <out>/history.json)."""
    os.makedirs(args.out, exist_ok=True)
    tok, train_tokens, val_tokens, corpus = load_corpus(args.corpus)
    val_stream = batches(val_tokens, 32, args.seq_len, seed=99)
    val_batches = [next(val_stream) for _ in range(args.eval_batches)]

    policies = {"mxfp8": make_policy(args.policy, args.layers)}
    if not args.no_bf16:
        policies["bf16"] = PrecisionPolicy.bf16()
    runs = {}
    for name, policy in policies.items():
        model = build_model(args, policy, tok.vocab_size)  # same seed -> same initial weights
        runs[name] = (model, make_optimizer(model, learning_rate=args.lr, steps=args.steps))
    print(f"corpus: {corpus}")
    print(
        f"devices: {jax.devices()}  vocab: {tok.vocab_size}  train tokens: {len(train_tokens)}"
        f"  activations: {args.dtype}"
    )
    print("precision policy of the MXFP8 model:\n" + policies["mxfp8"].table(runs["mxfp8"][0].layer_names()))

    history = {
        "args": vars(args),
        "step": [],
        "loss": {n: [] for n in runs},
        "val": {n: [] for n in runs},
        "val_step": [],
    }
    start = 0
    ckpt = os.path.join(args.out, "checkpoint")
    if args.resume:
        start, history = restore_checkpoint(ckpt, runs)
        print(f"resumed from {ckpt} at step {start}")

    # nnx.cached_partial: the (model, optimizer) graph is flattened once, not on every call as plain nnx.jit
    # does: the dispatch of one call at the h200 preset's model size measured 20-60 ms with nnx.jit and 5-15 ms
    # this way (2-core CPU, batch 1 x 32). State updates land in the same model and optimizer objects. Timed
    # one synchronised step at a time, that step took twice its GPU time on the H200 (122 vs 61 ms): hence
    # the windows below, one read-back per window.
    step_fns = {name: nnx.cached_partial(train_step, model, opt) for name, (model, opt) in runs.items()}
    data = batches(train_tokens, args.batch, args.seq_len, seed=args.seed)
    for _ in range(start):  # the data stream continues where the interrupted run stopped
        next(data)
    end = args.steps if args.stop_after is None else min(args.steps, args.stop_after)
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(initial=start, total=end, unit="step", dynamic_ncols=True)
    log = progress.write if progress is not None else print
    tokens_per_step = args.batch * args.seq_len
    timed = {n: [0, 0.0] for n in runs}  # (steps, seconds) of every window after the first
    prev = start
    for stop in window_ends(start, end, args.log_every, args.eval_every):
        device_batches = jax.device_put([next(data) for _ in range(prev, stop)])
        jax.block_until_ready(device_batches)  # the host-to-device copies are not timed
        speed = {}
        for name in runs:  # each model's window back to back: its time is its own
            losses, seconds = train_window(step_fns[name], device_batches)
            history["loss"][name].extend(losses)
            speed[name] = tokens_per_step * (stop - prev) / seconds
            if prev >= start + 2:  # not the first two, compiling steps
                timed[name][0] += stop - prev
                timed[name][1] += seconds
        history["step"].extend(range(prev + 1, stop + 1))
        for i in range(stop - prev):
            bad = {n: history["loss"][n][i - (stop - prev)] for n in runs}
            if not all(np.isfinite(v) for v in bad.values()):
                raise FloatingPointError(f"non-finite loss at step {prev + i + 1}: {bad}")
        last = {n: history["loss"][n][-1] for n in runs}
        msg = f"step {stop:4d}  train " + "  ".join(f"{n} {v:.4f}" for n, v in last.items())
        if stop % args.eval_every == 0 or stop == end:
            history["val_step"].append(stop)
            for name, (model, _) in runs.items():
                history["val"][name].append(float(np.mean([eval_loss(model, vb) for vb in val_batches])))
            msg += "  | val " + "  ".join(f"{n} {history['val'][n][-1]:.4f}" for n in runs)
        k = stop - prev
        what = "compiling" if prev < start + 2 else f"{k} step{'s' * (k != 1)}, one sync"
        log(msg + "  | tokens/s " + "  ".join(f"{n} {v:,.0f}" for n, v in speed.items()) + f" ({what})")
        if progress is not None:
            progress.update(stop - prev)
        prev = stop
    if progress is not None:
        progress.close()

    # GPU-bound step time: the windows after the first two steps, each from its first dispatch to its read-back
    history["step_time_s"] = {n: (t / k if k else None) for n, (k, t) in timed.items()}
    history["tokens_per_s"] = {n: tokens_per_step / t if t else None for n, t in history["step_time_s"].items()}
    history["corpus"] = corpus
    save_checkpoint(ckpt, runs, end, history)
    if end < args.steps:
        print(f"stopped after step {end}; continue with --resume")
        return history
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    plot(history, os.path.join(args.out, "loss.png"))
    summary = {
        n: {"final_train_loss": float(np.mean(history["loss"][n][-10:])), "final_val_loss": history["val"][n][-1]}
        for n in runs
    }
    history["summary"] = summary
    print("final (train: mean of last 10 steps):")
    for n, s in summary.items():
        t, tps = history["step_time_s"][n], history["tokens_per_s"][n]
        speed = f"step {t * 1e3:.1f} ms  {tps:,.0f} tokens/s (windows after step 2, one sync each)" if t else ""
        print(f"  {n:6s} train {s['final_train_loss']:.4f}  val {s['final_val_loss']:.4f}  {speed}")
    print(f"wrote {args.out}/loss.png, history.json, checkpoint/")
    return history


def plot(history: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"mxfp8": "tab:blue", "bf16": "tab:orange"}
    for name, losses in history["loss"].items():
        ax.plot(history["step"], losses, color=colors.get(name), label=f"{name} train", alpha=0.6)
        ax.plot(history["val_step"], history["val"][name], "o--", color=colors.get(name), label=f"{name} held-out")
    ax.set_xlabel("step")
    corpus = history.get("args", {}).get("corpus", "stdlib")
    unit, what = ("byte", "Python stdlib source") if corpus == "stdlib" else ("char", "synthetic text")
    ax.set_ylabel(f"cross-entropy (nats/{unit})")
    ax.set_title(f"Decoder LM on {what}: MXFP8 vs BF16")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    run(parse_args())
