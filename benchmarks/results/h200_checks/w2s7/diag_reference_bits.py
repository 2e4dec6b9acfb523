"""GPU vs CPU bits of the new float32 rounding and the attention reference (why O fell to 46 dB)."""
import sys
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, "tests")
import jax_mxfp8 as mx
from jax_mxfp8.reference.attention_quant import fake_quant_p, fake_quant_square
from jax_mxfp8.formats.rounding import round_to_elements
from jax_mxfp8.formats.elements import E4M3
from jax_mxfp8.formats.decode import decode_elements
from jax_mxfp8.formats.quantize import quantize_dequantize, quantize, dequantize

cpu = jax.devices("cpu")[0]; gpu = jax.devices()[0]
rng = np.random.default_rng(0)
def both(f, *xs):
    g = np.asarray(jax.jit(f)(*[jax.device_put(x, gpu) for x in xs]))
    c = np.asarray(jax.jit(f, device=cpu)(*[jax.device_put(x, cpu) for x in xs])) if False else np.asarray(jax.jit(f)(*[jax.device_put(x, cpu) for x in xs]))
    return g, c
def report(name, g, c):
    gb, cb = g.view(np.uint32), c.view(np.uint32)
    bad = gb != cb
    print(f"{name}: {bad.sum()} / {bad.size} differ", flush=True)
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        print("   gpu", g.ravel()[idx], "\n   cpu", c.ravel()[idx])
    return bad
p = np.concatenate([rng.uniform(0, 1, 4096), np.exp(-rng.uniform(0, 30, 4096)), 2.0 ** -rng.integers(0, 40, 2048)]).astype(np.float32).reshape(-1, 32)
y = np.minimum(p * 256, 448).astype(np.float32)
g, c = both(lambda y: round_to_elements(y, E4M3), y); bad = report("round_to_elements(y)", g, c)
if bad.any(): print("   in", y.ravel()[np.flatnonzero(bad)[:8]])
g, c = both(lambda y: decode_elements(y.astype(jnp.float8_e4m3fn)), y); report("decode(convert(y)) gpu vs cpu", g, c)
g2, _ = both(lambda y: round_to_elements(y, E4M3), y); report("round gpu vs convert gpu", g2, g)
g, c = both(lambda p: fake_quant_p(p, -1, "const", "up"), p); report("fake_quant_p const", g, c)
g, c = both(lambda p: fake_quant_p(p, -1, "block", "up"), p); report("fake_quant_p block", g, c)
x = rng.standard_normal((256, 256)).astype(np.float32)
g, c = both(fake_quant_square, x); report("fake_quant_square", g, c)
g, c = both(lambda x: quantize_dequantize(x, axis=-1), x); report("quantize_dequantize row", g, c)
g, c = both(lambda x: dequantize(quantize(x, axis=-1)), x); report("dequantize(quantize) row", g, c)
from attention_testutil import normal_inputs
q, k, v, do = normal_inputs(np.random.default_rng(1), b=1, t=256, s=256, n=4, n_kv=2, h=128)
f = lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="xla")
g, c = both(f, q, k, v); report("attention O (xla ref) gpu vs cpu", g, c)
from attention_emulation import mx_attention, EmuConfig, sqnr_db
want = mx_attention(q, k, v, do, cfg=EmuConfig(), causal=False)
print("sqnr O gpu vs emu", sqnr_db(np.asarray(g, np.float64), want[0]), "cpu vs emu", sqnr_db(np.asarray(c, np.float64), want[0]))
fq = lambda q, k, v: mx.dot_product_attention(q, k, v, implementation="xla", config=mx.AttentionConfig())
# the same with XLA_FLAGS-free old path: P via convert + decode
import jax_mxfp8.reference.attention_quant as aq
def old_fake_quant_p(p, axis, p_scale, scale_rounding):
    if p_scale == "const":
        y = jnp.minimum(p.astype(jnp.float32) * 256.0, 448.0).astype(jnp.float8_e4m3fn)
        return decode_elements(y) * jnp.float32(2.0 ** -8)
    return dequantize(quantize(p.astype(jnp.float32), axis=axis, block="row", scale_rounding=scale_rounding))
import jax_mxfp8.reference.attention_fwd as af
af.fake_quant_p = old_fake_quant_p
g3, c3 = both(f, q, k, v); report("attention O old P path gpu vs cpu", g3, c3)
print("sqnr O old-path gpu vs emu", sqnr_db(np.asarray(g3, np.float64), want[0]))
