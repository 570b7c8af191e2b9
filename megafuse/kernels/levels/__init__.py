"""The kernels of each SIMD level: ``generic``, ``avx2``, ``avx512`` (x86-64), each the same
sources (``level.pxi`` and the family files it includes) compiled with the level's flags."""
