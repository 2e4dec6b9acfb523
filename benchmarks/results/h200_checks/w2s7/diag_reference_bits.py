"""GPU vs CPU bits of the float32 element rounding and of the attention reference (session 7 diagnostic).

Why: tests/test_attention_gpu.py::test_gpu_reference_matches_emulation fell to 46-49 dB (O) on the H200 after
the references moved to formats.quantize_dequantize. This script showed that the rounding is bit-identical
GPU vs CPU and the reference's O is 81 dB from the float64 emulation on both (the test had run the Hopper
kernel, which takes float32 inputs since an earlier session). Run from the repository root on the GPU machine:
PYTHONPATH=$PWD python3 benchmarks/results/h200_checks/w2s7/diag_reference_bits.py (output: diag_reference_bits.log).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, "tests")
from attention_emulation import EmuConfig, mx_attention, sqnr_db  # noqa: E402
from attention_testutil import normal_inputs  # noqa: E402

import jax_mxfp8 as mx  # noqa: E402
import jax_mxfp8.reference.attention_fwd as attention_fwd  # noqa: E402
from jax_mxfp8.formats.decode import decode_elements  # noqa: E402
from jax_mxfp8.formats.elements import E4M3  # noqa: E402
from jax_mxfp8.formats.quantize import dequantize, quantize, quantize_dequantize  # noqa: E402
from jax_mxfp8.formats.rounding import round_to_elements  # noqa: E402
from jax_mxfp8.reference.attention_quant import fake_quant_p, fake_quant_square  # noqa: E402

CPU, GPU = jax.devices("cpu")[0], jax.devices()[0]


def both(f, *xs):
    """f jitted on the default device (the GPU) and on the CPU."""
    return tuple(np.asarray(jax.jit(f)(*[jax.device_put(x, d) for x in xs])) for d in (GPU, CPU))


def report(name, g, c):
    bad = g.view(np.uint32) != c.view(np.uint32)
    print(f"{name}: {bad.sum()} / {bad.size} differ", flush=True)
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        print("   gpu", g.ravel()[idx], "\n   cpu", c.ravel()[idx])


def old_fake_quant_p(p, axis, p_scale, scale_rounding):
    """The P fake-quantization before quantize_dequantize: FP8 convert + bit decode."""
    if p_scale == "const":
        y = jnp.minimum(p.astype(jnp.float32) * 256.0, 448.0).astype(jnp.float8_e4m3fn)
        return decode_elements(y) * jnp.float32(2.0**-8)
    return dequantize(quantize(p.astype(jnp.float32), axis=axis, block="row", scale_rounding=scale_rounding))


def main():
    rng = np.random.default_rng(0)
    p = [rng.uniform(0, 1, 4096), np.exp(-rng.uniform(0, 30, 4096)), 2.0 ** -rng.integers(0, 40, 2048)]
    p = np.concatenate(p).astype(np.float32).reshape(-1, 32)
    y = np.minimum(p * 256, 448).astype(np.float32)
    report("round_to_elements(y)", *both(lambda y: round_to_elements(y, E4M3), y))
    g, c = both(lambda y: decode_elements(y.astype(jnp.float8_e4m3fn)), y)
    report("decode(convert(y)) gpu vs cpu", g, c)
    report("round gpu vs convert gpu", both(lambda y: round_to_elements(y, E4M3), y)[0], g)
    report("fake_quant_p const", *both(lambda p: fake_quant_p(p, -1, "const", "up"), p))
    report("fake_quant_p block", *both(lambda p: fake_quant_p(p, -1, "block", "up"), p))
    x = rng.standard_normal((256, 256)).astype(np.float32)
    report("fake_quant_square", *both(fake_quant_square, x))
    report("quantize_dequantize row", *both(lambda x: quantize_dequantize(x, axis=-1), x))
    report("dequantize(quantize) row", *both(lambda x: dequantize(quantize(x, axis=-1)), x))

    q, k, v, do = normal_inputs(np.random.default_rng(1), b=1, t=256, s=256, n=4, n_kv=2, h=128)
    want = mx_attention(q, k, v, do, cfg=EmuConfig(), causal=False)

    def f(q, k, v):
        return mx.dot_product_attention(q, k, v, implementation="xla")

    g, c = both(f, q, k, v)
    report("attention O (xla ref) gpu vs cpu", g, c)
    gpu_db, cpu_db = (sqnr_db(a.astype(np.float64), want[0]) for a in (g, c))
    print("sqnr O gpu vs emu", gpu_db, "cpu vs emu", cpu_db)
    attention_fwd.fake_quant_p = old_fake_quant_p
    g3, c3 = both(f, q, k, v)
    report("attention O old P path gpu vs cpu", g3, c3)
    print("sqnr O old-path gpu vs emu", sqnr_db(g3.astype(np.float64), want[0]))


if __name__ == "__main__":
    main()
