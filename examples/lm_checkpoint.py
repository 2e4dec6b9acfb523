"""Plain checkpoints for the examples: model + optimizer state as msgpack (flax.serialization), step and
history as JSON. No orbax needed; restores into freshly built models of the same configuration."""

from __future__ import annotations

import json
import os

from flax import nnx, serialization


def save_checkpoint(path: str, runs: dict, step: int, history: dict) -> None:
    os.makedirs(path, exist_ok=True)
    for name, (model, opt) in runs.items():
        state = {"model": nnx.to_pure_dict(nnx.state(model, nnx.Param)), "opt": nnx.to_pure_dict(nnx.state(opt))}
        tmp = os.path.join(path, f"{name}.msgpack.tmp")
        with open(tmp, "wb") as f:
            f.write(serialization.msgpack_serialize(state))
        os.replace(tmp, os.path.join(path, f"{name}.msgpack"))  # never leave a half-written checkpoint
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"step": step, "history": history}, f)


def restore_checkpoint(path: str, runs: dict) -> tuple[int, dict]:
    """Loads the states saved by save_checkpoint into `runs` in place; returns (step, history)."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    for name, (model, opt) in runs.items():
        with open(os.path.join(path, f"{name}.msgpack"), "rb") as f:
            state = serialization.msgpack_restore(f.read())
        params = nnx.state(model, nnx.Param)
        nnx.replace_by_pure_dict(params, state["model"])
        nnx.update(model, params)
        opt_state = nnx.state(opt)
        nnx.replace_by_pure_dict(opt_state, state["opt"])
        nnx.update(opt, opt_state)
    return int(meta["step"]), meta["history"]
