"""Layer 3: CuTe DSL kernels compiled ahead of time (tools/build_kernels.py).

`registry` is pure Python and safe to import anywhere; it says, per config, which kernel builds it on each
arch. `common/` (arch-neutral kernels and PTX helpers), `sm90/` and `sm100/` import the CuTe DSL
(nvidia-cutlass-dsl), which only the build needs.
"""
