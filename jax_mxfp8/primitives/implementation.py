"""Implementation selection, one policy for every op (the public `implementation=` argument).

  None        the CUDA kernel when it can run here (kernel library built, default backend a GPU whose arch
              the kernel is built for) and covers the arguments; the XLA reference otherwise.
  "xla"       the XLA reference (exact numerics of the contract; runs anywhere).
  "emulated"  the kernel path with every FFI call replaced by its XLA emulation (the kernel's arithmetic
              and layouts: producer passes, re-encodings, tiling), under the same sharding and batching
              rules. Runs anywhere; slow; for tests and for reading the kernel's numerics on a CPU.
              ValueError when the kernel does not cover the arguments.
  "cuda"      the kernel, or RuntimeError when it cannot run here and ValueError naming why it does not
              cover the arguments.

`resolve` turns the argument into the path one call takes: "xla", "emulated" or "cuda".
"""

from __future__ import annotations

from jax_mxfp8.kernels import registry
from jax_mxfp8.primitives import library

IMPLEMENTATIONS = (None, "xla", "emulated", "cuda")
PATHS = ("xla", "emulated", "cuda")


def check(implementation) -> None:
    """ValueError unless `implementation` is one of IMPLEMENTATIONS."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}")


def resolve(implementation: str | None, unsupported: str | None, archs: tuple[str, ...] = registry.ARCHS) -> str:
    """The path ("xla", "emulated" or "cuda") one call takes.

    Args:
      implementation: the caller's argument (see the module docstring).
      unsupported: why the kernel does not cover this call's arguments, or None when it does.
      archs: the archs the kernel family is built for (its registry configs' `archs`).
    """
    check(implementation)
    if implementation == "xla":
        return "xla"
    if implementation == "emulated":
        if unsupported:
            raise ValueError(f"implementation='emulated': {unsupported}")
        return "emulated"
    ok, why = library.kernels_runnable(archs)
    if implementation == "cuda":
        if not ok:
            raise RuntimeError(f"implementation='cuda' was requested but {why}")
        if unsupported:
            raise ValueError(f"implementation='cuda': {unsupported}")
        library.preload()
        return "cuda"
    if ok and not unsupported:
        library.preload()
        return "cuda"
    return "xla"
