"""`named_op`: the public ops run under `jax.named_scope("jax_mxfp8.<op>")`, so their HLO ops carry the
op's name in a profiler trace (XProf / Perfetto / nsys) and in `lower(...).as_text(debug_info=True)`, and
under `implementation.public_op(<op>)`, so a kernel-fallback warning raised by an op they call inside
(attention quantizes its operands with `quantize`) names the op the user called."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import jax

from jax_mxfp8.primitives.implementation import public_op

F = TypeVar("F", bound=Callable)


def named_op(name: str) -> Callable[[F], F]:
    """Decorator: runs the function under jax.named_scope(f"jax_mxfp8.{name}") and public_op(name)."""
    scope = f"jax_mxfp8.{name}"

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with jax.named_scope(scope), public_op(name):
                return fn(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorate
