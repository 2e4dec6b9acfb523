"""Behaviour every public op shares: the implementation= switch, diagnostics, remat, second order, CUDA graphs."""
