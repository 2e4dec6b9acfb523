"""`python -m jax_mxfp8`: prints what runs here (versions, kernel library, GPU, each op's implementation)."""

from jax_mxfp8.diagnostics import report

if __name__ == "__main__":
    print(report())
