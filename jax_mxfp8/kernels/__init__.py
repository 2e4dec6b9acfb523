"""Layer 3: CuTe DSL kernels compiled ahead of time (tools/build_kernels.py).

`registry` is pure Python and safe to import anywhere; `common/` and `sm90/` import the CuTe DSL
(nvidia-cutlass-dsl), which only the build needs.
"""
