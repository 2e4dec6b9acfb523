"""Layer 1: MX element/scale formats, the MXArray pytree, quantize/dequantize, stochastic rounding and
random Hadamard transforms. Pure jnp; imports nothing else from jax_mxfp8."""

from jax_mxfp8.formats.blocked_scales import from_blocked_scales, to_blocked_scales
from jax_mxfp8.formats.elements import BLOCK_SIZE, E4M3, E5M2, SCALE_DTYPE, ElementFormat, element_format
from jax_mxfp8.formats.hadamard import hadamard_matrix, random_hadamard
from jax_mxfp8.formats.mxarray import BLOCK_KINDS, MXArray
from jax_mxfp8.formats.quantize import dequantize, fake_quantize, quantize, quantize_dequantize
from jax_mxfp8.formats.rounding import round_to_elements

__all__ = [
    "BLOCK_KINDS",
    "BLOCK_SIZE",
    "E4M3",
    "E5M2",
    "SCALE_DTYPE",
    "ElementFormat",
    "MXArray",
    "dequantize",
    "element_format",
    "fake_quantize",
    "from_blocked_scales",
    "hadamard_matrix",
    "random_hadamard",
    "quantize",
    "quantize_dequantize",
    "round_to_elements",
    "to_blocked_scales",
]
