"""Checkpoints for the examples with orbax-checkpoint (the JAX ecosystem's convention; flax depends on it).

One orbax `CheckpointManager` folder per run: `<path>/<step>/` holds one item per model ("mxfp8",
"bf16": its nnx.Param state and its optimizer state, saved with `StandardSave`) and "meta" (step and
history, `JsonSave`). Restoring reads the latest step into freshly built models of the same
configuration (the abstract target comes from them, shardings included), bit for bit: a resumed run
continues exactly as the uninterrupted one (tests/examples/test_examples.py).
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx


def _state(model, opt) -> dict:
    """{"model": Param state, "opt": optimizer state} as pure nested dicts (nnx.List indices are ints)."""
    return {"model": nnx.to_pure_dict(nnx.state(model, nnx.Param)), "opt": nnx.to_pure_dict(nnx.state(opt))}


def _str_keys(tree):
    """The same nested dicts with string keys (orbax names its files after them)."""
    if isinstance(tree, dict):
        return {str(k): _str_keys(v) for k, v in tree.items()}
    return tree


def _like(template, restored):
    """`restored` (string keys) with the keys of `template` (some ints)."""
    if isinstance(template, dict):
        return {k: _like(v, restored[str(k)]) for k, v in template.items()}
    return restored


def _manager(path: str) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(path), options=options)


def save_checkpoint(path: str, runs: dict, step: int, history: dict) -> None:
    """Saves every run's model + optimizer state and (step, history) as step `step` under `path`."""
    items = {name: ocp.args.StandardSave(_str_keys(_state(model, opt))) for name, (model, opt) in runs.items()}
    items["meta"] = ocp.args.JsonSave({"step": step, "history": history})
    mgr = _manager(path)
    try:
        if step in mgr.all_steps():  # a rerun writing the same step again
            mgr.delete(step)
        mgr.save(step, args=ocp.args.Composite(**items))
        mgr.wait_until_finished()
    finally:
        mgr.close()


def restore_checkpoint(path: str, runs: dict) -> tuple[int, dict]:
    """Loads the latest step saved by save_checkpoint into `runs` in place; returns (step, history)."""
    mgr = _manager(path)
    try:
        step = mgr.latest_step()
        if step is None:
            raise FileNotFoundError(f"no orbax checkpoint under {os.path.abspath(path)}")
        templates = {name: _state(model, opt) for name, (model, opt) in runs.items()}
        items = {
            name: ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, _str_keys(t)))
            for name, t in templates.items()
        }
        restored = mgr.restore(step, args=ocp.args.Composite(**items, meta=ocp.args.JsonRestore()))
    finally:
        mgr.close()
    for name, (model, opt) in runs.items():
        state = _like(templates[name], restored[name])
        params = nnx.state(model, nnx.Param)
        nnx.replace_by_pure_dict(params, state["model"])
        nnx.update(model, params)
        opt_state = nnx.state(opt)
        nnx.replace_by_pure_dict(opt_state, state["opt"])
        nnx.update(opt, opt_state)
    meta = restored["meta"]
    return int(meta["step"]), meta["history"]
