"""Hopper (sm_90a) CuTe DSL kernels: the wgmma attention kernel and its producer, plus the names of the
arch-neutral kernels (kernels/common/) that build the other configs on sm_90a (`quantize`)."""
