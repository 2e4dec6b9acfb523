"""Building blocks shared by the CuTe DSL kernels (import the CuTe DSL)."""
