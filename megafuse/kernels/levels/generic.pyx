# The kernels compiled for the portable baseline of the architecture (setup.py gives the flags).
include "level.pxi"
