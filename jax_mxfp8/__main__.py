"""`python -m jax_mxfp8`: prints what runs here (versions, kernel library, GPU, each op's implementation); exits 1
when no JAX backend starts (the report says why). `python -m jax_mxfp8 --self-test`: runs the first-use
self-test of every kernel family not yet run on hardware (the Blackwell kernels) and prints a report to paste
into an issue; exits 1 when one fails."""

import sys

from jax_mxfp8.diagnostics import main

if __name__ == "__main__":
    sys.exit(main())
