#!/usr/bin/env python3
"""Compiles the CuTe DSL kernel variants of jax_mxfp8/kernels/registry/ ahead of time (no GPU needed).

By default the production variants (registry.PRODUCTION_VARIANTS: what the library and the wheel ship); with
--with-tunes the comparison schedules too (registry.VARIANTS: tune > 0, for the benchmarks). For each arch in
registry.ARCHS and each such variant compiled for it (`config.archs`), the kernel object that
the config names for that arch (`config.make_kernel(arch)`): `cute.compile(..., options="--gpu-arch <arch>")`, then
`export_to_c` writes <out>/<arch>/<symbol>.h and .o (the .o embeds the cubin; the cubin and PTX are also
kept under <out>/<arch>/dump/<variant>/, with the traced facts the static checks read: facts.json,
tools/sm100_static.py's write_facts). Each arch runs in its own process because the DSL reads
CUTE_DSL_ARCH at import. Finally it writes the two files the C++ build needs: <out>/kernels_table.inc,
the self-contained table that csrc/kernels_table.cc includes (the exported headers inlined, plus one
launch adapter per (variant, arch) with a uniform signature, generated from the headers' tensor
structs, and one row per (variant, arch) generated from the config alone: name, arch major, op and the
named integer parameters `config.key`), and <out>/libjmx_kernels.a with every kernel object.

Usage: python tools/build_kernels.py [--out build/kernels] [--arch sm_90a --arch sm_100f] [--jobs 2] [--with-tunes]
Needs: nvidia-cutlass-dsl[cu13]==4.8.1 (and jax, for the numerics constants in jax_mxfp8.formats).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jax_mxfp8.kernels import registry  # noqa: E402 (pure Python, no DSL import)


def symbol(config, arch: str) -> str:
    return f"jmx_{config.name}_{arch.replace('_', '')}"


def compile_arch(arch: str, out: Path, names: list[str] | None, with_tunes: bool) -> None:
    """Worker: compiles the variants for one arch (runs in a fresh process with CUTE_DSL_ARCH set).

    Each config names the kernel class that builds it on `arch` (registry `KernelConfig.kernels`)."""
    import cutlass.cute as cute
    from sm100_static import write_facts  # (tools/, this script's folder)

    adir = out / arch
    adir.mkdir(parents=True, exist_ok=True)
    meta = {}
    if names and (adir / "meta.json").exists():
        # --only recompiles some variants into an existing build: keep the others' entries (replacing the file
        # would make the next library build hold only these variants); drop entries no longer registered
        known = {symbol(c, arch) for c in registry.variants(with_tunes) if arch in c.archs}
        meta = {k: v for k, v in json.loads((adir / "meta.json").read_text()).items() if k in known}
    else:  # a full build: the dumps of variants it does not compile (another build kind's) would mislead
        built = {c.name for c in registry.variants(with_tunes)}
        for old in (adir / "dump").glob("*") if (adir / "dump").is_dir() else ():
            if old.name not in built:
                shutil.rmtree(old)
    for config in registry.variants(with_tunes):
        if names and config.name not in names:
            continue
        if arch not in config.archs:
            continue
        sym = symbol(config, arch)
        t0 = time.time()
        kern = config.make_kernel(arch)
        dump = adir / "dump" / config.name  # kept cubin + PTX, for inspection (cuobjdump -sass)
        shutil.rmtree(dump, ignore_errors=True)  # an earlier compile's files (another entry's name) would stay
        dump.mkdir(parents=True)
        compiled = cute.compile(
            kern.entry(),
            *kern.fake_args(),
            options=f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {dump}",
        )
        compiled.export_to_c(str(adir), sym, function_prefix=sym)
        meta[sym] = {
            "config": config.name,
            "tensors": list(kern.tensor_names()),
            "args": _arg_specs(kern.fake_args()),
            "seconds": time.time() - t0,
        }
        write_facts(kern, dump)  # what the static checks need beyond the cubin (tools/check_sm100.py --reuse)
        print(f"[{arch}] {config.name}: {meta[sym]['seconds']:.2f} s", flush=True)
    (adir / "meta.json").write_text(json.dumps(meta, indent=1))


def _arg_specs(fake_args) -> list[dict]:
    """The host function's arguments as the adapter fills them: per tensor its rank, which dims and strides the
    kernel left dynamic (the exported struct holds those, in dimension order) and the static dims' values;
    "float" / "int32" for scalars; the stream last."""
    import cutlass

    specs = []
    for a in fake_args:
        if hasattr(a, "dynamic_shapes_mask"):
            shape = [None if m else int(d) for d, m in zip(a.shape, a.dynamic_shapes_mask)]
            specs.append({"kind": "tensor", "shape": shape, "stride_mask": list(a.dynamic_strides_mask)})
        elif isinstance(a, cutlass.Float32):
            specs.append({"kind": "float"})
        elif isinstance(a, cutlass.Int32):
            specs.append({"kind": "int32"})
    return specs


_STRUCT_RE = re.compile(r"typedef struct \{(.*?)\}\s*(\w+)_Tensor_(\w+)_t;", re.S)
_WRAPPER_RE = re.compile(r"static inline int32_t cute_dsl_(\w+)_wrapper\(([^)]*)\)")


def _tensor_fill(sym: str, argname: str, i: int, spec: dict, body: str) -> tuple[str, str]:
    """(the struct initialization of tensor argument i from jmx::TensorView t[i], the checks of its static
    dims): a rank-2 tensor is t[i]'s (rows, cols), a rank-3 one its (batch, rows, cols); the struct holds the
    dims and the row-major strides the kernel left dynamic."""
    shape = spec["shape"]
    dims = {2: [f"t[{i}].rows", f"t[{i}].cols"], 3: [f"t[{i}].batch", f"t[{i}].rows", f"t[{i}].cols"]}.get(len(shape))
    if dims is None:
        raise SystemExit(f"{sym}: tensor {argname} has rank {len(shape)}; the adapters take rank 2 or 3")
    n_shape, n_stride = sum(d is None for d in shape), sum(spec["stride_mask"])
    want = re.search(r"dynamic_shapes\[(\d+)\]", body), re.search(r"dynamic_strides\[(\d+)\]", body)
    got = tuple(int(m.group(1)) if m else 0 for m in want)
    if got != (n_shape, n_stride):
        raise SystemExit(f"{sym}: tensor {argname}: struct {got} != the fake tensor's {(n_shape, n_stride)}")
    strides = [" * ".join(f"int64_t({d})" for d in dims[k + 1 :]) or "1" for k in range(len(dims))]
    shapes = [d for d, s in zip(dims, shape) if s is None]
    dyn_strides = [st for st, m in zip(strides, spec["stride_mask"]) if m]
    fields = [f"t[{i}].data"]
    fields += ["{" + ", ".join(shapes) + "}"] if shapes else []
    fields += ["{" + ", ".join(dyn_strides) + "}"] if dyn_strides else []
    fill = f"  {sym}_Tensor_{argname}_t a{i} = {{{', '.join(fields)}}};"
    checks = [f"{d} != {s}" for d, s in zip(dims, shape) if s is not None]
    if len(shape) == 2:
        checks.append(f"t[{i}].batch != 1")
    check = f"  if ({' || '.join(checks)}) return cudaErrorInvalidValue;" if checks else ""
    return fill, check


def _adapter(sym: str, header: str, specs: list[dict]) -> str:
    """C++ launch adapter for one exported variant: fills the DSL's tensor structs from jmx::TensorView and
    passes the float and int32 scalars in the order the host function takes them."""
    bodies = {argname: body for body, prefix, argname in _STRUCT_RE.findall(header) if prefix == sym}
    m = _WRAPPER_RE.search(header)
    params = [p.strip() for p in m.group(2).split(",")]
    order = [re.search(r"_Tensor_(\w+)_t \*", p).group(1) for p in params if "_Tensor_" in p]
    scalars = [p.split()[0] for p in params[1:-1] if "_Tensor_" not in p]
    tensor_specs = [sp for sp in specs if sp["kind"] == "tensor"]
    scalar_specs = [{"float": "float", "int32": "int32_t"}[sp["kind"]] for sp in specs if sp["kind"] != "tensor"]
    if not params[-1].startswith("cudaStream_t") or scalars != scalar_specs:
        raise SystemExit(f"{sym}: unexpected wrapper parameters {params} (scalars {scalar_specs})")
    if sorted(order) != sorted(bodies) or len(order) != len(tensor_specs):
        raise SystemExit(f"{sym}: wrapper arguments {order} do not match structs {sorted(bodies)} / {tensor_specs}")
    fills, checks = zip(*(_tensor_fill(sym, a, i, tensor_specs[i], bodies[a]) for i, a in enumerate(order)))
    n_floats, n_ints = scalars.count("float"), scalars.count("int32_t")
    # the wrapper's arguments in its own order: tensors, then scalars (floats from f[], int32s from ints[])
    args, ti, fi, ii = [], 0, 0, 0
    for p in params[1:-1]:
        if "_Tensor_" in p:
            args.append(f"&a{ti}")
            ti += 1
        elif p.startswith("float"):
            args.append(f"f[{fi}]")
            fi += 1
        else:
            args.append(f"ints[{ii}]")
            ii += 1
    body = "\n".join(c for c in (*checks, *fills) if c)
    return f"""
// ---- {sym}
static jmx::ModuleSlot g_slot_{sym};
static cudaError_t load_{sym}(int device) {{
  return jmx::LoadModule(g_slot_{sym}, device, &_mlir_{sym}_cuda_init, &_mlir_{sym}_cuda_load_to_device);
}}
static cudaError_t launch_{sym}(const jmx::TensorView* t, int n, const float* f, int nf, const int32_t* ints,
                                int ni, cudaStream_t stream) {{
  if (n != {len(order)} || nf != {n_floats} || ni != {n_ints}) return cudaErrorInvalidValue;
  (void)f;
  (void)ints;
{body}
  {sym}_Kernel_Module_t module{{g_slot_{sym}.library}};
  return static_cast<cudaError_t>(cute_dsl_{sym}_wrapper(&module, {", ".join(args)}, stream));
}}
"""


def _table_row(config: registry.KernelConfig, arch: str, sym: str) -> tuple[str, str]:
    """One kernel table row (csrc/common.h, KernelEntry), from the config alone: its named parameters
    (`config.key` as {name, value} pairs, a separate array) and the row (name, arch, the compute capabilities
    that load the cubin (registry.ARCH_CCS), op, params, max_cols, launch and load adapters)."""
    params = ", ".join(f'{{"{k}", {v}}}' for k, v in config.key.items())
    decl = f"static const jmx::KernelParam kParams_{sym}[] = {{{params}}};"
    ccs = ", ".join(str(10 * major + minor) for major, minor in registry.ARCH_CCS[arch])
    row = (
        f'    {{"{config.name}", "{arch}", {{{ccs}}}, "{config.op}", kParams_{sym}, {len(config.key)}, '
        f"{config.max_cols}, &launch_{sym}, &load_{sym}}},"
    )
    return decl, row


def write_table(out: Path, archs: list[str], with_tunes: bool) -> Path:
    """kernels_table.inc and libjmx_kernels.a of the variants compiled into `out` (a variant of the other build
    kind left there by an earlier run is not included)."""
    includes, adapters, params, rows, syms = [], [], [], [], []
    for arch in archs:
        meta = json.loads((out / arch / "meta.json").read_text())
        for config in registry.variants(with_tunes):
            sym = symbol(config, arch)
            if sym not in meta or arch not in config.archs:  # (an earlier build's entry for an arch dropped since)
                continue
            header = (out / arch / f"{sym}.h").read_text()
            # inline the exported header so that the table is one self-contained file (Bazel, CMake)
            includes.append(f"// ---- from {arch}/{sym}.h\n" + header.replace("#pragma once", ""))
            adapters.append(_adapter(sym, header, meta[sym]["args"]))
            syms.append((arch, sym))
            decl, row = _table_row(config, arch, sym)
            params.append(decl)
            rows.append(row)
    text = (
        "// Generated by tools/build_kernels.py from jax_mxfp8/kernels/registry/. Do not edit.\n"
        "// Included once, by csrc/kernels_table.cc, after csrc/common.h.\n"
        "#define CUTE_DSL_CUDA_ERROR_CHECK(err) jmx::RecordDslError(err)\n"
        + "\n".join(includes)
        + "\n"
        + "".join(adapters)
        + "\n"
        + "\n".join(params)
        + "\n\nnamespace jmx {\nconst KernelEntry kKernelTable[] = {\n"
        + "\n".join(rows)
        + "\n};\nconst int kKernelTableSize = sizeof(kKernelTable) / sizeof(kKernelTable[0]);\n}  // namespace jmx\n"
    )
    path = out / "kernels_table.inc"
    path.write_text(text)
    # every kernel object in one static archive, next to the table
    objs = [str(out / arch / f"{sym}.o") for arch, sym in syms]
    archive = out / "libjmx_kernels.a"
    archive.unlink(missing_ok=True)
    subprocess.run(["ar", "rcs", str(archive), *objs], check=True)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "build" / "kernels"))
    ap.add_argument("--arch", action="append", choices=registry.ARCHS, help="default: all of registry.ARCHS")
    ap.add_argument("--only", action="append", help="compile only these variant names (debugging)")
    ap.add_argument("--jobs", type=int, default=1, help="archs compiled in parallel (one process each)")
    ap.add_argument("--with-tunes", action="store_true", help="also the comparison schedules (tune > 0)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()

    if args.worker:
        compile_arch(args.worker, out, args.only, args.with_tunes)
        return 0

    archs = args.arch or list(registry.ARCHS)
    t0 = time.time()
    procs, pending = [], list(archs)
    while pending or procs:
        while pending and len(procs) < max(1, args.jobs):
            arch = pending.pop(0)
            cmd = [sys.executable, __file__, "--out", str(out), "--worker", arch]
            cmd += ["--with-tunes"] if args.with_tunes else []
            for n in args.only or []:
                cmd += ["--only", n]
            procs.append((arch, subprocess.Popen(cmd, env={**os.environ, "CUTE_DSL_ARCH": arch})))
        arch, p = procs.pop(0)
        if p.wait() != 0:
            for _, q in procs:
                q.kill()
            print(f"kernel compilation for {arch} failed", file=sys.stderr)
            return 1
    table = write_table(out, archs, args.with_tunes)
    counts = ", ".join(f"{sum(a in v.archs for v in registry.variants(args.with_tunes))} {a}" for a in archs)
    print(f"compiled {counts} variants in {time.time() - t0:.1f} s -> {table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
