"""Hopper (sm_90a) CuTe DSL kernels; the memory-bound ones are compiled for sm_100a as well."""
