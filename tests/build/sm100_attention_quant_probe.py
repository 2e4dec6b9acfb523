"""Compiles a small probe kernel around jax_mxfp8/kernels/sm100/attention_quant.py for Blackwell targets and
reports its SASS and resource usage as JSON (run by tests/build/test_sm100_attention_quant_sass.py with a Python
that has nvidia-cutlass-dsl; no GPU needed: nothing is launched).

  python tests/build/sm100_attention_quant_probe.py --arch sm_100a --arch sm_100f --out DIR

The probe: 128 threads (4 warps), thread t holds row t of a (128, 32) float32 tile, i.e. warp w holds the
32 x 32 square block w. Per thread it quantizes its row three ways, as the attention kernels will: dS (amax
of the square block: abs_max then square_block_amax, then quantize32), P with a block scale (quantize32 on
its own row's abs_max) and P with the constant scale (p_const_words), and stores the words and scale bytes.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ROWS, COLS = 128, 32


def _build(arch: str, dump: Path) -> Path:
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Uint32
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from jax_mxfp8.kernels.sm100 import attention_quant as aq

    @cute.kernel
    def probe(x: cute.Tensor, ds: cute.Tensor, ds_b: cute.Tensor, pb: cute.Tensor, pb_b: cute.Tensor, pc: cute.Tensor):
        t, _, _ = cute.arch.thread_idx()
        vals = [x[t, c] for c in range(COLS)]
        block_amax = aq.square_block_amax(aq.abs_max(vals))
        b, words = aq.quantize32(vals, block_amax)
        ds_b[t] = b.to(cutlass.Uint8)
        for w in cutlass.range_constexpr(COLS // 4):
            ds[t, w] = words[w]
        b, words = aq.quantize32(vals, aq.abs_max(vals))
        pb_b[t] = b.to(cutlass.Uint8)
        for w in cutlass.range_constexpr(COLS // 4):
            pb[t, w] = words[w]
        pwords = aq.p_const_words(vals)
        for w in cutlass.range_constexpr(COLS // 4):
            pc[t, w] = pwords[w]

    @cute.jit
    def launch(x, ds, ds_b, pb, pb_b, pc, stream: cuda.CUstream):
        probe(x, ds, ds_b, pb, pb_b, pc).launch(grid=[1, 1, 1], block=[ROWS, 1, 1], stream=stream)

    def t(dtype, shape):
        return make_fake_compact_tensor(dtype, shape, stride_order=tuple(reversed(range(len(shape)))), assumed_align=16)

    words = (ROWS, COLS // 4)
    args = (
        t(cutlass.Float32, (ROWS, COLS)),
        t(Uint32, words),
        t(cutlass.Uint8, (ROWS,)),
        t(Uint32, words),
        t(cutlass.Uint8, (ROWS,)),
        t(Uint32, words),
        make_fake_stream(),
    )
    dump.mkdir(parents=True, exist_ok=True)
    cute.compile(launch, *args, options=f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir {dump}")
    cubins = sorted(dump.rglob("*.cubin"))
    if not cubins:
        raise RuntimeError(f"no cubin kept under {dump}")
    return cubins[-1]


def _tool(name: str) -> str:
    import nvidia

    for base in nvidia.__path__:
        p = Path(base) / "cu13" / "bin" / name
        if p.exists():
            return str(p)
    raise FileNotFoundError(f"{name} not found in the nvidia cu13 wheels")


def _report(cubin: Path) -> dict:
    def dump(flag: str) -> str:
        return subprocess.run([_tool("cuobjdump"), flag, str(cubin)], capture_output=True, text=True, check=True).stdout

    sass, res = dump("-sass"), dump("-res-usage")
    ops = sorted({m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)})
    usage = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res))
    return {"cubin": str(cubin), "opcodes": ops, "usage": {k: int(v) for k, v in usage.items()}, "sass": sass}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.worker:  # one arch per process: the DSL reads CUTE_DSL_ARCH at import
        arch = args.arch[0]
        (out / f"{arch}.json").write_text(json.dumps(_report(_build(arch, out / arch))))
        return 0
    for arch in args.arch:
        env = dict(os.environ, CUTE_DSL_ARCH=arch)
        subprocess.run([sys.executable, __file__, "--worker", "--arch", arch, "--out", str(out)], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
