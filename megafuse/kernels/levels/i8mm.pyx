# The kernels compiled for ARMv8.2 Advanced SIMD with the dot product and the int8 matrix multiply
# (sdot, smmla; setup.py gives the flags).  Imported only on a CPU that has them.
include "level.pxi"
