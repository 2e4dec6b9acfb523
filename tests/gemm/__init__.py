"""mx_dot_general and its quantized / hand-off forms, GEMM operands, align128, the MX GEMM kernels and epilogues."""
