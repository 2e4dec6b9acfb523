"""Blackwell (sm_100a) CuTe DSL kernels; today only names for the arch-neutral kernels of kernels/common/."""
