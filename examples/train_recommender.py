"""A GEM/HSTU-style sequential recommender over jagged user histories, MXFP8 vs BF16.

Each user is a packed sequence of item tokens (their history) followed by one candidate item; the
model (item embeddings -> causal transformer blocks over the packed tokens with cu_seqlens -> MLP on
the candidate's position) predicts whether the user clicks the candidate. Tokens embed the item id plus its
category, an item feature as in production recommenders. Synthetic data with a
learnable signal: every user prefers a few item categories, histories are drawn from those preferences,
and clicks follow the preference for the candidate's category. No padding tokens are computed between
users: the MXFP8 path runs jax_mxfp8.varlen_attention on the packed rows. The BF16 twin gets the strong
baseline: the same users as a padded batch (users, max_len) with sequence lengths through
jax.nn.dot_product_attention (cuDNN's fused attention on a GPU; jax_mxfp8.flax.functional.jagged_attention).

Reports AUC and normalized entropy (NE = BCE / entropy of the click base rate; lower is better, 1.0 means
no better than the base rate) on held-out users, and tokens/s, for MXFP8 and BF16 models trained side by
side.

Run: python examples/train_recommender.py [--steps 300] [--smoke]
     python examples/train_recommender.py --preset h200   # 64 users x U[512, 16384) events, one H200
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_mxfp8.flax import MXLinear, MXRMSNorm, PrecisionPolicy, TransformerBlock

NUM_CATEGORIES = 20

PRESETS = {
    # the seed's recommendation shapes: 64 users per batch with jagged histories of 512 to 16,384 events
    # (~540k packed tokens per step), head_dim 128 (the Hopper attention kernel's)
    "h200": dict(
        steps=200,
        users_per_batch=64,
        min_len=512,
        max_len=16384,
        num_items=100_000,
        d_model=512,
        layers=2,
        heads=4,
        lr=1e-3,
        eval_users=512,
        log_every=20,
    ),
}


class SyntheticClicks:
    """Users with sparse category preferences; items belong to category item % NUM_CATEGORIES."""

    def __init__(self, num_items: int, min_len: int, max_len: int, seed: int):
        self.num_items, self.min_len, self.max_len = num_items, min_len, max_len
        self.rng = np.random.default_rng(seed)

    def user(self):
        prefs = self.rng.dirichlet(np.full(NUM_CATEGORIES, 0.15))
        n = int(self.rng.integers(self.min_len, self.max_len))  # history length; +1 candidate <= max_len
        cats = self.rng.choice(NUM_CATEGORIES, size=n, p=prefs)
        items = cats + NUM_CATEGORIES * self.rng.integers(0, self.num_items // NUM_CATEGORIES, size=n)
        # half the candidates come from the user's own tastes, half uniformly: both clicks and skips occur
        cand_cat = (
            self.rng.choice(NUM_CATEGORIES, p=prefs) if self.rng.random() < 0.5 else self.rng.integers(NUM_CATEGORIES)
        )
        cand = int(cand_cat + NUM_CATEGORIES * self.rng.integers(0, self.num_items // NUM_CATEGORIES))
        p_click = 1.0 / (1.0 + np.exp(-(8.0 * prefs[cand_cat] - 2.0)))
        return items, cand, float(self.rng.random() < p_click)

    def batch(self, num_users: int, capacity: int):
        """Packed tokens (capacity,), cu_seqlens (num_users + 1,), labels (num_users,).

        Rows past cu_seqlens[-1] are padding at the end of the pack (never attended, outputs zero)."""
        tokens, cu, labels = [], [0], []
        for _ in range(num_users):
            items, cand, label = self.user()
            tokens.extend(items.tolist() + [cand])
            cu.append(len(tokens))
            labels.append(label)
        if len(tokens) > capacity:
            raise ValueError(f"capacity {capacity} < packed length {len(tokens)}")
        tokens += [0] * (capacity - len(tokens))
        return np.array(tokens, np.int32), np.array(cu, np.int32), np.array(labels, np.float32)


class SequentialRecommender(nnx.Module):
    """Packed item tokens (T_total,) + cu_seqlens (B + 1,) -> click logits (B,)."""

    def __init__(self, num_items: int, *, d_model: int, num_layers: int, num_heads: int, policy, rngs: nnx.Rngs):
        self.item_embed = nnx.Embed(num_items, d_model, rngs=rngs)
        self.category_embed = nnx.Embed(NUM_CATEGORIES, d_model, rngs=rngs)  # a known item feature
        self.candidate_marker = nnx.Param(0.02 * jax.random.normal(rngs.params(), (d_model,)))
        self.blocks = nnx.List(
            [
                TransformerBlock(d_model, num_heads, policy=policy, name=f"blocks.{i}", rngs=rngs)
                for i in range(num_layers)
            ]
        )
        head = policy.for_layer("head")
        self.norm = MXRMSNorm(d_model, precision=head)
        self.hidden = MXLinear(d_model, d_model, precision=head, rngs=rngs)
        self.out = nnx.Linear(d_model, 1, rngs=rngs)

    def __call__(self, tokens: jax.Array, cu_seqlens: jax.Array, max_seqlen: int) -> jax.Array:
        x = self.item_embed(tokens) + self.category_embed(tokens % NUM_CATEGORIES)
        last = cu_seqlens[1:] - 1  # the candidate of each user
        x = x.at[last].add(self.candidate_marker[...])
        for block in self.blocks:
            x = block(x, is_causal=True, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        h, h_q = self.norm(x[last])
        return self.out(jax.nn.gelu(self.hidden(h, x_quantized=h_q)))[:, 0].astype(jnp.float32)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties averaged."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def normalized_entropy(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean BCE of the predictions divided by the entropy of the base click rate."""
    p = np.clip(1.0 / (1.0 + np.exp(-logits.astype(np.float64))), 1e-7, 1 - 1e-7)
    bce = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    base = np.clip(labels.mean(), 1e-7, 1 - 1e-7)
    return float(bce / -(base * np.log(base) + (1 - base) * np.log(1 - base)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a sized configuration; flags given still win")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--users-per-batch", type=int, default=64)
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--num-items", type=int, default=1000)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-users", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/train_recommender")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--smoke", action="store_true", help="a few steps on small batches (CI)")
    preset = p.parse_known_args(argv)[0].preset
    if preset:
        p.set_defaults(**PRESETS[preset])
    return p.parse_args(argv)


def run(args) -> dict:
    if args.smoke:
        args.steps, args.users_per_batch, args.eval_users = 4, 16, 64
    os.makedirs(args.out, exist_ok=True)
    # static pack size: generous for the mean length, a multiple of 32
    capacity = -(-int(args.users_per_batch * (args.min_len + args.max_len) / 2 * 1.3 + args.max_len) // 32) * 32
    policies = {"mxfp8": PrecisionPolicy.mxfp8(), "bf16": PrecisionPolicy.bf16()}
    runs = {}
    for name, policy in policies.items():
        model = SequentialRecommender(
            args.num_items,
            d_model=args.d_model,
            num_layers=args.layers,
            num_heads=args.heads,
            policy=policy,
            rngs=nnx.Rngs(args.seed),
        )
        schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, args.steps // 10), args.steps, args.lr / 10)
        runs[name] = (model, nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.01), wrt=nnx.Param))

    max_seqlen = args.max_len

    @nnx.jit
    def train_step(model, opt, tokens, cu, labels):
        def loss_fn(m):
            return optax.sigmoid_binary_cross_entropy(m(tokens, cu, max_seqlen), labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    @nnx.jit
    def predict(model, tokens, cu):
        return model(tokens, cu, max_seqlen)

    data = SyntheticClicks(args.num_items, args.min_len, args.max_len, seed=args.seed)
    history = {"args": vars(args), "loss": {n: [] for n in runs}, "step_time_s": {}}
    times = {n: [] for n in runs}
    packed = []  # valid (packed) tokens per step
    t_start = time.perf_counter()
    print(f"devices: {jax.devices()}  pack capacity {capacity} tokens, max_seqlen {max_seqlen}")
    for step in range(args.steps):
        tokens, cu, labels = data.batch(args.users_per_batch, capacity)
        packed.append(int(cu[-1]))
        for name, (model, opt) in runs.items():
            t0 = time.perf_counter()
            history["loss"][name].append(float(train_step(model, opt, tokens, cu, labels)))
            times[name].append(time.perf_counter() - t0)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            w = args.log_every
            losses = "  ".join(f"{n} {np.mean(history['loss'][n][-w:]):.4f}" for n in runs)
            print(f"step {step + 1:4d}  train BCE (mean of last {w}) {losses}  [{time.perf_counter() - t_start:.0f} s]")
    history["step_time_s"] = {n: float(np.median(t[2:])) if len(t) > 2 else None for n, t in times.items()}
    # tokens/s over the steps after the first two (compilation): packed tokens, the work both models do
    history["tokens_per_s"] = {
        n: float(np.sum(packed[2:]) / np.sum(t[2:])) if len(t) > 2 else None for n, t in times.items()
    }

    held_out = SyntheticClicks(args.num_items, args.min_len, args.max_len, seed=args.seed + 1_000_003)
    results = {}
    for name, (model, _) in runs.items():
        all_labels, all_logits = [], []
        for _ in range(max(1, args.eval_users // args.users_per_batch)):
            tokens, cu, labels = held_out.batch(args.users_per_batch, capacity)
            all_labels.append(labels)
            all_logits.append(np.asarray(predict(model, tokens, cu)))
        held_out.rng = np.random.default_rng(args.seed + 1_000_003)  # same users for every model
        y, z = np.concatenate(all_labels), np.concatenate(all_logits)
        results[name] = {
            "auc": auc(y, z),
            "ne": normalized_entropy(y, z),
            "step_time_s": history["step_time_s"][name],
            "tokens_per_s": history["tokens_per_s"][name],
        }
    history["eval"] = results
    print(f"held-out users: {len(y)}, click rate {y.mean():.3f}")
    for name, r in results.items():
        t, tps = r["step_time_s"], r["tokens_per_s"]
        speed = f"step {t * 1e3:.1f} ms  {tps:,.0f} tokens/s" if t else "step time n/a"
        print(f"  {name:6s} AUC {r['auc']:.4f}  NE {r['ne']:.4f}  {speed}")
    with open(os.path.join(args.out, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    return history


if __name__ == "__main__":
    run(parse_args())
