"""Shared pytest setup: 8 host (CPU) devices for the sharding tests; GPU-marked tests skip cleanly on
machines without a CUDA device, Blackwell-marked ones on anything but compute capability 10.x."""

from __future__ import annotations

import functools
import os
import shutil

import pytest  # pytest does not import jax: the flags below still come first


def _add_xla_flag(flag: str) -> None:
    """Appends --name=value to XLA_FLAGS unless the caller's XLA_FLAGS already set that name."""
    name = flag.split("=")[0]
    if name not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


# Must happen before jax is imported anywhere in the session. 8 CPU devices: only adds host devices.
_add_xla_flag("--xla_force_host_platform_device_count=8")
# On a machine without an NVIDIA device (CI, the README's test command on a laptop) the suite's time is
# mostly XLA compiling small CPU programs; LLVM's optimisation passes are most of that and buy nothing for
# test-sized arrays. Level 0 keeps IEEE semantics (no fast-math either way): same results, 30-40% less
# time. Not on a GPU machine: the flag also sets the level of XLA's GPU fusions, which the GPU tests time.
if os.environ.get("JAX_PLATFORMS", "") == "cpu" or not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi")):
    _add_xla_flag("--xla_backend_optimization_level=1")


@functools.cache
def _has_cuda_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


@functools.cache
def _compute_capability_major() -> int | None:
    try:
        import jax

        dev = jax.devices()[0]
        return int(str(dev.compute_capability).split(".")[0]) if dev.platform == "gpu" else None
    except (RuntimeError, AttributeError, ValueError):
        return None


def pytest_collection_modifyitems(config, items):
    if _has_cuda_gpu() and _compute_capability_major() != 10:
        skip = pytest.mark.skip(reason="needs a Blackwell GPU of compute capability 10.x (pytest -m blackwell)")
        for item in items:
            if "blackwell" in item.keywords:
                item.add_marker(skip)
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (pytest -m gpu on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
