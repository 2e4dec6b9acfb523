"""`python -m jax_mxfp8`: prints what runs here (versions, kernel library, GPU, each op's implementation); exits 1
when no JAX backend starts (the report says why)."""

import sys

from jax_mxfp8.diagnostics import main

if __name__ == "__main__":
    sys.exit(main())
