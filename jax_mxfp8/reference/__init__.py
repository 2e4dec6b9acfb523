"""Layer 2: XLA reference implementations with the exact numerics of docs/numerics.md.

They run on any backend, are the CPU path, and are the oracle the CUDA kernels are tested against.
"""

from jax_mxfp8.reference.attention_bwd import attention_bwd
from jax_mxfp8.reference.attention_fwd import attention_fwd
from jax_mxfp8.reference.attention_tiling import Masking

__all__ = ["Masking", "attention_bwd", "attention_fwd"]
