# The kernels compiled for ARMv8.2 Advanced SIMD with the dot product (sdot / udot; setup.py gives
# the flags).  Imported only on a CPU that has them: even this module's initialisation code may use
# them.
include "level.pxi"
