#!/usr/bin/env python3
"""Compiles the CuTe DSL kernel variants of jax_mxfp8/kernels/registry/ ahead of time (no GPU needed).

By default the production variants (registry.PRODUCTION_VARIANTS: what the library and the wheel ship); with
--with-tunes the comparison schedules too (registry.VARIANTS: tune > 0, for the benchmarks). For each arch in
registry.ARCHS and each such variant compiled for it (`config.archs`), the kernel object that
the config names for that arch (`config.make_kernel(arch)`): `cute.compile(..., options="--gpu-arch <arch>")`, then
`export_to_c` writes <out>/<arch>/<symbol>.h and .o (the .o embeds the cubin; the cubin and PTX are also
kept under <out>/<arch>/dump/<variant>/). Each arch runs in its own process because the DSL reads
CUTE_DSL_ARCH at import. Finally it writes the two files the C++ build needs: <out>/kernels_table.inc,
the self-contained table that csrc/kernels_table.cc includes (the exported headers inlined, plus one
launch adapter per (variant, arch) with a uniform signature, generated from the headers' tensor
structs, and one row per (variant, arch) generated from the config alone: name, arch major, op and the
named integer parameters `config.key`), and <out>/libjmx_kernels.a with every kernel object.

Usage: python tools/build_kernels.py [--out build/kernels] [--arch sm_90a --arch sm_100a] [--jobs 2] [--with-tunes]
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
        meta[sym] = {"config": config.name, "tensors": list(kern.tensor_names()), "seconds": time.time() - t0}
        print(f"[{arch}] {config.name}: {meta[sym]['seconds']:.2f} s", flush=True)
    (adir / "meta.json").write_text(json.dumps(meta, indent=1))


_STRUCT_RE = re.compile(r"typedef struct \{(.*?)\}\s*(\w+)_Tensor_(\w+)_t;", re.S)
_WRAPPER_RE = re.compile(r"static inline int32_t cute_dsl_(\w+)_wrapper\(([^)]*)\)")


def _adapter(sym: str, header: str) -> str:
    """C++ launch adapter for one exported variant: fills the DSL's tensor structs from jmx::Tensor2D."""
    structs = []
    for body, prefix, argname in _STRUCT_RE.findall(header):
        if prefix != sym:
            continue
        shapes = re.search(r"dynamic_shapes\[(\d+)\]", body)
        strides = re.search(r"dynamic_strides\[(\d+)\]", body)
        if not shapes or shapes.group(1) != "2" or not strides or strides.group(1) != "1":
            raise SystemExit(f"{sym}: tensor {argname} has an unexpected struct layout:\n{body}")
        structs.append(argname)
    m = _WRAPPER_RE.search(header)
    params = [p.strip() for p in m.group(2).split(",")]
    order = [re.search(r"_Tensor_(\w+)_t \*", p).group(1) for p in params if "_Tensor_" in p]
    floats = [p.split()[-1] for p in params if p.startswith("float ")]
    known = len(order) + len(floats) + 2  # + module, stream
    if len(params) != known or not params[-1].startswith("cudaStream_t"):
        raise SystemExit(f"{sym}: unexpected wrapper parameters {params}")
    if sorted(order) != sorted(structs):
        raise SystemExit(f"{sym}: wrapper arguments {order} do not match structs {structs}")
    fills = "\n".join(
        f"  {sym}_Tensor_{a}_t a{i} = {{t[{i}].data, {{t[{i}].rows, t[{i}].cols}}, {{t[{i}].cols}}}};"
        for i, a in enumerate(order)
    )
    # the wrapper's arguments in its own order: tensors, then float scalars (taken from f[] in order)
    args, ti, fi = [], 0, 0
    for p in params[1:-1]:
        if "_Tensor_" in p:
            args.append(f"&a{ti}")
            ti += 1
        else:
            args.append(f"f[{fi}]")
            fi += 1
    args = ", ".join(args)
    return f"""
// ---- {sym}
static jmx::ModuleSlot g_slot_{sym};
static cudaError_t load_{sym}(int device) {{
  return jmx::LoadModule(g_slot_{sym}, device, &_mlir_{sym}_cuda_init, &_mlir_{sym}_cuda_load_to_device);
}}
static cudaError_t launch_{sym}(const jmx::Tensor2D* t, int n, const float* f, int nf, cudaStream_t stream) {{
  if (n != {len(order)} || nf != {len(floats)}) return cudaErrorInvalidValue;
  (void)f;
{fills}
  {sym}_Kernel_Module_t module{{g_slot_{sym}.library}};
  return static_cast<cudaError_t>(cute_dsl_{sym}_wrapper(&module, {args}, stream));
}}
"""


def _table_row(config: registry.KernelConfig, arch: str, sym: str) -> tuple[str, str]:
    """One kernel table row (csrc/common.h, KernelEntry), from the config alone: its named parameters
    (`config.key` as {name, value} pairs, a separate array) and the row (name, arch major, op, params,
    max_cols, launch and load adapters)."""
    params = ", ".join(f'{{"{k}", {v}}}' for k, v in config.key.items())
    decl = f"static const jmx::KernelParam kParams_{sym}[] = {{{params}}};"
    row = (
        f'    {{"{config.name}", {registry.ARCH_MAJOR[arch]}, "{config.op}", kParams_{sym}, {len(config.key)}, '
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
            if sym not in meta:
                continue
            header = (out / arch / f"{sym}.h").read_text()
            # inline the exported header so that the table is one self-contained file (Bazel, CMake)
            includes.append(f"// ---- from {arch}/{sym}.h\n" + header.replace("#pragma once", ""))
            adapters.append(_adapter(sym, header))
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
