# The kernels compiled for ARMv8.0 Advanced SIMD (NEON; setup.py gives the flags).
include "level.pxi"
