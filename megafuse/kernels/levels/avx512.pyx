# The kernels compiled for AVX-512 F/BW/DQ/VL/VNNI (setup.py gives the flags).  Imported only on a
# CPU that has them: even this module's initialisation code may use those instructions.
include "level.pxi"
