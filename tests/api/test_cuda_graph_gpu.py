"""The FFI handlers under XLA command buffers (CUDA graphs): results stay exact across replays.

The handlers are registered with the kCmdBufferCompatible trait; with --xla_gpu_enable_command_buffer
including CUSTOM_CALL (and a minimum graph size of 1) XLA records them into CUDA graphs and replays them.
Runs in a subprocess because XLA_FLAGS are read once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    import jax_mxfp8
    from jax_mxfp8.primitives.library import kernels_runnable
    from jax_mxfp8.reference.rms_norm import rms_norm_quantize_fwd
    ok, why = kernels_runnable()
    assert ok, why

    @jax.jit
    def step(x, w):
        q = jax_mxfp8.quantize(x, implementation="cuda")
        s = jax_mxfp8.quantize(x, block="square", implementation="cuda")
        y, yq = jax_mxfp8.rms_norm_quantize(x, w, implementation="cuda")
        return q.data, q.scale, s.data, s.scale, y, yq.data, yq.scale

    w = jnp.linspace(0.5, 1.5, 1024, dtype=jnp.float32)
    for i in range(5):  # fresh inputs each replay of the recorded graph
        x = (jax.random.normal(jax.random.key(i), (512, 1024)) * 10.0 ** (i - 2)).astype(jnp.bfloat16)
        got = step(x, w)
        rq = jax_mxfp8.quantize(x, implementation="xla")
        rs = jax_mxfp8.quantize(x, block="square", implementation="xla")
        ry, ryq = rms_norm_quantize_fwd(x, w, 1e-6, dtype=jnp.float8_e4m3fn, scale_rounding="up")
        want = (rq.data, rq.scale, rs.data, rs.scale, ry, ryq.data, ryq.scale)
        for g, r in zip(got[:4] + got[5:], want[:4] + want[5:]):
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(r).view(np.uint8))
        np.testing.assert_allclose(np.asarray(got[4], np.float32), np.asarray(want[4], np.float32), rtol=2**-7)
    print("command-buffer replays exact")
    """
)


def test_kernels_replay_exactly_inside_command_buffers():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "")
        + " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "command-buffer replays exact" in out.stdout
