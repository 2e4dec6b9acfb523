"""One way to declare an FFI-backed op (layer 5): `FfiOp`.

A declaration names everything a kernel call needs and nothing else:
  target      the FFI target (csrc/), e.g. "jax_mxfp8_quantize"
  outputs     (static, *args) -> result avals (jax.ShapeDtypeStruct), in the op's layout
  emulation   (static, *args) -> results: the kernel's contract in XLA (the "emulated" implementation, and
              the CPU oracle of the partitioning / batching plumbing)
  sharding    (static) -> ShardingRule: ONE description from which the Shardy rule string and the GSPMD
              callbacks (infer_sharding_from_operands, partition) are both derived
  batch_dims  per operand, the axis a vmapped axis folds into (None: the operand has none, e.g. a weight);
              result_batch_dims likewise. The default batching rule ("vmap folds into the batch axis")
              broadcasts unbatched operands, merges the mapped axis into those axes, calls the op once and
              splits the results. An op whose operands cannot fold (batch_dims=None, or a batched operand
              without a batch axis) maps the op over the axis (`unbatched="map"`) or vmaps the emulation
              (`unbatched="emulation"`).
  attrs       (static) -> FFI attributes; default {"kernel": the registry variant's name} (the static config
              itself or its `variant` field): the variant the handler launches (csrc/common.h FindKernel)
  cuda        optional (decl, static, *args) -> results, for handlers that take other views of the buffers
              than the op's layout; default: one `jax.ffi.ffi_call` of `target` with `outputs` and `attrs`
  reduction   optional (static) -> Reduction | None: how the op runs when a factor it sums over (the
              rule's `reduced`, e.g. a GEMM's K) is sharded; without one those factors stay replicated

`static` is one frozen (hashable) dataclass per call site, normally holding the registry variant (the
kernel's compile-time config) plus what the call needs besides (e.g. eps). `decl.call(static, path, *args)`
runs the op on path "cuda" (the kernel) or "emulated" (the emulation body), always through the same
custom_vmap(custom_partitioning(...)) wrapper, so the CPU tests of "emulated" exercise the plumbing the GPU
runs.

ShardingRule syntax (Shardy's einsum-like rules): one string per operand and result, one entry per dim: a
factor name, or a compound "(a b)" whose first factor is the dim's shardable part and whose other factors
have sizes in `factor_sizes` (e.g. "(m r)" with r = 32: the dim shards on block boundaries only). A leading
"..." stands for any number of leading dims, shared by every operand and result that has it. Factors in
`replicated` never shard. Factors in `reduced` appear in no result (the op sums over them): with the
declaration's `reduction` they shard like any other (each device computes a partial result over its slice,
then a psum over their mesh axes; see Reduction), without one they are replicated. GSPMD derivation: each
factor takes the mesh axes of the first operand dim where it leads, kept only when they divide the factor's
size and no earlier factor took one of them; every operand and result is then laid out from its factors
(the partition callback asks for exactly these argument shardings).
`summed` names results that are sums over an operand factor they do not carry (e.g. a broadcast operand's
gradient summed over the batch): each device's call sums its shard of that factor, and the partition callback
adds the devices' results (psum over the factor's mesh axes). (`reduced` runs another FFI call for float32
partials and finishes them; `summed` psums the op's own result: the call itself already sums its shard.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

PATHS = ("cuda", "emulated")


@dataclasses.dataclass(frozen=True)
class ShardingRule:
    """How an FFI call partitions (see the module docstring for the syntax)."""

    operands: tuple[str, ...]
    results: tuple[str, ...]
    factor_sizes: tuple[tuple[str, int], ...] = ()
    replicated: tuple[str, ...] = ()
    reduced: tuple[str, ...] = ()
    summed: tuple[tuple[int, str], ...] = ()  # (result index, factor): the result sums over that factor

    def without_reduction(self) -> ShardingRule:
        """The rule for an op that cannot split its sums: the reduced factors replicated."""
        return dataclasses.replace(self, replicated=self.replicated + self.reduced, reduced=())

    def dims(self, ranks: tuple[int, ...]) -> tuple[list[list[list[str]]], list[list[list[str]]]]:
        """Per operand and result, per dim, its factor names, with "..." expanded for operand ranks `ranks`."""
        ops = [_parse(s) for s in self.operands]
        res = [_parse(s) for s in self.results]
        lead = None
        for dims, rank in zip(ops, ranks, strict=True):
            if dims and dims[0] == ["..."]:
                n = rank - (len(dims) - 1)
                if lead is not None and n != lead:
                    raise ValueError(f"operands disagree on the number of leading dims ({lead} vs {n})")
                lead = n
        names = [[f"b{i}"] for i in range(lead or 0)]
        expand = lambda dims: names + dims[1:] if dims and dims[0] == ["..."] else dims
        return [expand(d) for d in ops], [expand(d) for d in res]

    def shardy(
        self, shapes: tuple[tuple[int, ...], ...]
    ) -> tuple[str, dict[str, int], tuple[str, ...], tuple[str, ...]]:
        """(Shardy rule string, factor sizes, factors needing replication, reduction factors) for operands
        of these shapes.

        Shardy needs the size of every factor that appears only inside compounds: taken from `factor_sizes`
        or derived from the first operand dim that holds it."""
        ops, res = self.dims(tuple(len(s) for s in shapes))
        text = lambda dims: " ".join(f[0] if len(f) == 1 else f"({' '.join(f)})" for f in dims)
        rule = f"{', '.join(text(d) for d in ops)} -> {', '.join(text(d) for d in res)}"
        alone = {fs[0] for dims in ops + res for fs in dims if len(fs) == 1}
        sizes = dict(self.factor_sizes)
        for dims, shape in zip(ops, shapes, strict=True):
            for fs, n in zip(dims, shape, strict=True):
                if len(fs) > 1 and fs[0] not in alone and fs[0] not in sizes:
                    sizes[fs[0]] = n // math.prod(sizes[g] for g in fs[1:])
        # in the rule's factor order: Shardy wants the replication factors' indices sorted
        order = list(dict.fromkeys(f for dims in ops + res for fs in dims for f in fs))
        pick = lambda names: tuple(f for f in order if f in names)
        return rule, sizes, pick(self.replicated), pick(self.reduced)

    def factor_axes(self, mesh, arg_shapes) -> dict[str, object]:
        """Per factor, the mesh axes it shards over (None: replicated), from the operands' shardings."""
        ops, _ = self.dims(tuple(len(a.shape) for a in arg_shapes))
        sizes = dict(self.factor_sizes)
        axes_of: dict[str, object] = {}
        used: set[str] = set()
        for dims, arg in zip(ops, arg_shapes, strict=True):
            spec = _spec(arg, len(dims))
            for d, factors in enumerate(dims):
                f = factors[0]
                if f in axes_of:
                    continue
                names = _names(spec[d])
                size = arg.shape[d] // math.prod(sizes[g] for g in factors[1:])
                ok = names and f not in self.replicated and size % _axes_size(mesh, spec[d]) == 0
                axes_of[f] = spec[d] if ok and not used & set(names) else None  # a mesh axis shards one factor
                used |= set(names) if axes_of[f] is not None else set()
        return axes_of

    def shardings(self, mesh, arg_shapes) -> tuple[tuple[NamedSharding, ...], tuple[NamedSharding, ...]]:
        """(argument shardings, result shardings) for GSPMD, from the operands' current shardings."""
        ops, res = self.dims(tuple(len(a.shape) for a in arg_shapes))
        axes_of = self.factor_axes(mesh, arg_shapes)
        layout = lambda dims: NamedSharding(mesh, P(*(axes_of.get(fs[0]) for fs in dims)))
        return tuple(layout(d) for d in ops), tuple(layout(d) for d in res)

    def reduced_axes(self, mesh, arg_shapes) -> tuple[str, ...]:
        """The mesh axes the reduced factors shard over (the partials' psum axes; () when none shards)."""
        axes_of = self.factor_axes(mesh, arg_shapes)
        return tuple(a for f in self.reduced for a in _names(axes_of.get(f)))


def _parse(spec: str) -> list[list[str]]:
    return [t[1:-1].split() if t.startswith("(") else [t] for t in re.findall(r"\([^)]*\)|\S+", spec)]


def _spec(arg, rank: int) -> tuple:
    spec = tuple(arg.sharding.spec)
    return spec + (None,) * (rank - len(spec))


def _names(axes) -> tuple[str, ...]:
    """A PartitionSpec entry (None, an axis name or a tuple of them) as a tuple of axis names."""
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, tuple) else (axes,)


def _axes_size(mesh, names) -> int:
    return math.prod(mesh.shape[a] for a in _names(names))


@dataclasses.dataclass(frozen=True)
class Reduction:
    """How an op runs when a factor it sums over (ShardingRule.reduced) is sharded: each device runs `decl`
    with `static` on its slices of the first `n_args` operands, giving float32 partial results; they are
    summed over the reduced factors' mesh axes (one float32 psum: the sum order differs from one device's),
    and `finish(partials, *args)` makes the op's results from the sums (e.g. the bias added once, one
    rounding to the output dtype)."""

    decl: FfiOp
    static: object
    n_args: int
    finish: Callable


def kernel_name(static) -> str:
    """The registry variant name of a call's static config: the config itself, or its `variant` field."""
    return getattr(static, "variant", static).name


def _default_attrs(static) -> dict:
    return {"kernel": kernel_name(static)}


@dataclasses.dataclass(frozen=True, eq=False)
class FfiOp:
    """The declaration of one FFI call (see the module docstring). Hashable by identity."""

    target: str
    outputs: Callable
    emulation: Callable
    sharding: Callable[[object], ShardingRule]
    batch_dims: tuple[int | None, ...] | None
    result_batch_dims: tuple[int, ...] | None = None
    unbatched: str = "map"
    attrs: Callable[[object], dict] = _default_attrs
    cuda: Callable | None = None
    sharding_takes_shapes: bool = False  # sharding(static, operand shapes) instead of sharding(static)
    reduction: Callable[[object], Reduction | None] | None = None

    def __post_init__(self):
        if self.unbatched not in ("map", "emulation"):
            raise ValueError(f"unbatched={self.unbatched!r} not in ('map', 'emulation')")

    def ffi(self, static, *args, target: str | None = None, outputs=None, **call_kwargs):
        """One `jax.ffi.ffi_call` of this target (or `target`) with the declaration's attributes; results
        as a tuple."""
        outs = tuple(outputs if outputs is not None else self.outputs(static, *args))
        res = jax.ffi.ffi_call(target or self.target, outs, **call_kwargs)(*args, **self.attrs(static))
        return tuple(res)

    def ffi_into(self, static, args: tuple, outs: tuple):
        """The `<target>_into` test hook: the kernel writes into `outs` (aliased to the results), so a test
        can pass NaN-filled buffers and check that every element is written. No partitioning or batching."""
        n = len(args)
        aliases = {n + i: i for i in range(len(outs))}
        return self.ffi(static, *args, *outs, target=self.target + "_into", outputs=self.outputs(static, *args),
                        input_output_aliases=aliases)  # fmt: skip

    def call(self, static, path: str, *args):
        """Runs the op on `path` ("cuda" or "emulated"); a tuple of results, or the result of one-result ops."""
        if path not in PATHS:
            raise ValueError(f"path={path!r} not in {PATHS}")
        return _batched(self, static, path)(*args)


def _body(decl: FfiOp, static, path: str) -> Callable:
    if path == "emulated":
        return lambda *args: _as_tuple(decl.emulation(static, *args))
    if decl.cuda is not None:
        return lambda *args: _as_tuple(decl.cuda(decl, static, *args))
    return lambda *args: decl.ffi(static, *args)


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


@functools.cache
def _partitioned(decl: FfiOp, static, path: str, shapes: tuple[tuple[int, ...], ...]):
    """custom_partitioning of the body for operands of these shapes (a Shardy rule fixes ranks and sizes)."""
    rule = decl.sharding(static, shapes) if decl.sharding_takes_shapes else decl.sharding(static)
    reduction = decl.reduction(static) if decl.reduction is not None else None
    if reduction is None:
        rule = rule.without_reduction()
    single = len(rule.results) == 1
    body = _body(decl, static, path)

    def fn(*args):
        out = body(*args)
        return out[0] if single else out

    def reduced_fn(axes: tuple[str, ...]) -> Callable:
        partial = _body(reduction.decl, reduction.static, path)

        def run(*args):
            sums = tuple(jax.lax.psum(p, axes) for p in partial(*args[: reduction.n_args]))
            out = _as_tuple(reduction.finish(sums, *args))
            return out[0] if single else out

        return run

    def shardings(mesh, arg_shapes):
        args, outs = rule.shardings(mesh, arg_shapes)
        return args, (outs[0] if single else outs)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[1]

    def partition(mesh, arg_shapes, result_shape):
        args, outs = shardings(mesh, arg_shapes)
        axes = rule.reduced_axes(mesh, arg_shapes)
        if axes:
            return mesh, reduced_fn(axes), outs, args
        factor_axes = rule.factor_axes(mesh, arg_shapes)
        sums = {i: factor_axes[f] for i, f in rule.summed if factor_axes.get(f) is not None}
        if not sums:
            return mesh, fn, outs, args

        def summed(*a):  # each device summed its shard of the factor: add the devices' partial results
            out = [jax.lax.psum(y, sums[i]) if i in sums else y for i, y in enumerate(body(*a))]
            return out[0] if single else tuple(out)

        return mesh, summed, outs, args

    text, sizes, need, reduced = rule.shardy(shapes)
    cp = custom_partitioning(fn)
    kw = {"need_replication_factors": need} if need else {}
    kw |= {"reduction_factors": reduced} if reduced else {}
    cp.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=text, **kw, **sizes)
    return cp


def _fold(x: jax.Array, axis: int) -> jax.Array:
    """(V, ...) -> the mapped axis merged into `axis` of the unmapped shape: (..., V * n_axis, ...)."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2 :])


def _unfold(y: jax.Array, axis: int, size: int) -> jax.Array:
    y = y.reshape(*y.shape[:axis], size, y.shape[axis] // size, *y.shape[axis + 1 :])
    return jnp.moveaxis(y, axis, 0)


@functools.cache
def _batched(decl: FfiOp, static, path: str):
    """custom_vmap(custom_partitioning(body)) with the declaration's batching rule."""

    @jax.custom_batching.custom_vmap
    def op(*args):
        out = _partitioned(decl, static, path, tuple(tuple(a.shape) for a in args))(*args)
        return out

    @op.def_vmap
    def _vmap(axis_size, in_batched, *args):
        in_batched = tuple(in_batched)
        dims = decl.batch_dims
        foldable = dims is not None and all(d is not None or not b for d, b in zip(dims, in_batched, strict=True))
        if not foldable:
            return _unbatched(decl, static, path, axis_size, in_batched, args)
        merged = []
        for x, b, d in zip(args, in_batched, dims, strict=True):
            if d is not None:
                x = _fold(x if b else jnp.broadcast_to(x, (axis_size, *x.shape)), d)
            merged.append(x)
        out = op(*merged)
        outs = _as_tuple(out)
        split = tuple(_unfold(y, d, axis_size) for y, d in zip(outs, decl.result_batch_dims, strict=True))
        return (split if isinstance(out, (tuple, list)) else split[0]), _all_true(out)

    return op


def _all_true(out):
    return tuple(True for _ in out) if isinstance(out, (tuple, list)) else True


def _unbatched(decl: FfiOp, static, path: str, axis_size: int, in_batched: tuple, args: tuple):
    """Batching for operands that cannot fold: the emulation vmapped, or the op mapped over the axis."""
    if decl.unbatched == "emulation":
        f = lambda *a: decl.emulation(static, *a)
        out = jax.vmap(f, in_axes=tuple(0 if b else None for b in in_batched))(*args)
    else:
        mapped = [x for x, b in zip(args, in_batched, strict=True) if b]

        def one(xs):
            it = iter(xs)
            return decl.call(static, path, *(next(it) if b else x for x, b in zip(args, in_batched, strict=True)))

        out = jax.lax.map(one, mapped)
    return out, _all_true(out)
