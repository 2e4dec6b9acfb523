"""Compile-time options of the MX GEMM (`mx_dot_general`)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_mxfp8.config.fields import int_field
from jax_mxfp8.formats import element_format
from jax_mxfp8.formats.quantize import ROUNDINGS
from jax_mxfp8.formats.scales import check_scale_rounding

WEIGHT_GRADS = ("mxfp8", "bf16")


@dataclasses.dataclass(frozen=True)
class MXDotConfig:
    """Options of mx_dot_general. Hashable, so it can be a static argument.

    Attributes:
      dtype: element type of the forward operands (float8_e4m3fn default, or float8_e5m2).
      grad_dtype: element type of the incoming gradient G in the backward GEMMs (default E4M3, like
        jax.nn.scaled_dot_general's mxfp8 config).
      scale_rounding: "up" (default) or "floor".
      grad_rounding: "nearest" (default) or "stochastic" (unbiased rounding of G; needs `rng` at call).
      weight_grad: "mxfp8" (default) or "bf16": compute the rhs ("weight") gradient with BF16 operands and
        FP32 accumulation instead of MX operands, for layers whose weight gradient is sensitive.
      hadamard_seed: if not None, apply a blocked random Hadamard transform (seeded, orthonormal) on the
        contracted axis of every GEMM (forward: K; lhs gradient: N; rhs gradient: M) before quantizing.
      hadamard_block: Hadamard block size (power of two dividing the contracted axis; default 32).
    """

    dtype: np.dtype = np.dtype(jnp.float8_e4m3fn)
    grad_dtype: np.dtype = np.dtype(jnp.float8_e4m3fn)
    scale_rounding: str = "up"
    grad_rounding: str = "nearest"
    weight_grad: str = "mxfp8"
    hadamard_seed: int | None = None
    hadamard_block: int = 32

    def __post_init__(self):
        object.__setattr__(self, "dtype", element_format(self.dtype).dtype)
        object.__setattr__(self, "grad_dtype", element_format(self.grad_dtype).dtype)
        check_scale_rounding(self.scale_rounding)
        if self.grad_rounding not in ROUNDINGS:
            raise ValueError(f"grad_rounding={self.grad_rounding!r} is not one of {ROUNDINGS}")
        if self.weight_grad not in WEIGHT_GRADS:
            raise ValueError(f"weight_grad={self.weight_grad!r} is not one of {WEIGHT_GRADS}")
        hb = int_field("MXDotConfig", "hadamard_block", self.hadamard_block, "a power of two")
        if hb < 1 or hb & (hb - 1):
            raise ValueError(f"MXDotConfig.hadamard_block={hb!r} must be a power of two")
        seed = self.hadamard_seed
        if seed is not None:
            seed = int_field("MXDotConfig", "hadamard_seed", seed, "None or an int seed")
        # normalised (np.int64(32) -> 32): equal configs hash and print alike
        object.__setattr__(self, "hadamard_block", hb)
        object.__setattr__(self, "hadamard_seed", seed)
