# The kernels of the avx512 level with the AMX-INT8 prefill tiles (include/megafuse/
# mf_amx_tiles.h), compiled for AVX-512 F/BW/DQ/VL/VNNI, AMX-TILE and AMX-INT8 (setup.py gives the
# flags).  Imported only on a CPU that has them and where the OS granted this process the tile
# data state (megafuse.kernels.simd): even this module's initialisation code may use those
# instructions.
include "level.pxi"
