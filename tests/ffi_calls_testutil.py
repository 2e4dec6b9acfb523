"""The FFI calls a traced program makes, for the dataflow tests of the hand-offs between layers."""

from __future__ import annotations

import jax

from jax_mxfp8.primitives import ffi_op
from jax_mxfp8.primitives import implementation as impl


def ffi_calls(monkeypatch, fn, *args) -> list[tuple[str, tuple[int, ...]]]:
    """(target, first operand's shape) of every FFI call made while tracing fn(*args), every kernel
    decision forced to "emulated"."""
    monkeypatch.setattr(impl, "_decide", lambda i, u, a: ("emulated", "") if u is None else ("xla", u))
    calls = []
    real = ffi_op.FfiOp.call

    def record(self, static, path, *a):
        calls.append((self.target, tuple(a[0].shape)))
        return real(self, static, path, *a)

    monkeypatch.setattr(ffi_op.FfiOp, "call", record)
    jax.make_jaxpr(fn)(*args)
    return calls
