"""Helpers for the sharding tests: meshes over the 8 CPU devices and the collectives an HLO contains."""

from __future__ import annotations

import re

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

COLLECTIVE = re.compile(
    r"= (?P<shape>\([^)]*\)|\S+) (?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    if len(jax.devices()) < 8:
        import pytest

        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def put(x, m, *spec):
    return jax.device_put(x, NamedSharding(m, P(*spec)))


def collectives(f, *args) -> list[tuple[str, str]]:
    """(op, result shape) of every collective in the compiled HLO of jit(f)(*args)."""
    text = jax.jit(f).lower(*args).compile().as_text()
    return [(m["op"], m["shape"]) for m in COLLECTIVE.finditer(text)]


def bytes_of(shape: str) -> int:
    """Bytes of an HLO shape string such as 'u8[512,256,4]{2,1,0}' or 'f32[]'."""
    m = re.match(r"(\w+)\[([\d,]*)\]", shape)
    width = {"u8": 1, "s8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f16": 2, "bf16": 2, "f32": 4, "s32": 4, "u32": 4}[m[1]]
    n = 1
    for d in filter(None, m[2].split(",")):
        n *= int(d)
    return n * width
