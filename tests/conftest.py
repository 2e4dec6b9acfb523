"""Shared pytest setup: GPU-marked tests skip cleanly on machines without a CUDA device."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _has_cuda_gpu() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (pytest -m gpu on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
