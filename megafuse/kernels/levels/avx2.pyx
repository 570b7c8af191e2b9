# The kernels compiled for AVX2 + FMA + F16C (setup.py gives the flags).
include "level.pxi"
