"""The kernels of each SIMD level: ``generic`` (every architecture), ``avx2``, ``avx512``, ``amx``
(x86-64; amx on Linux), ``neon``, ``neon_dotprod``, ``i8mm`` (aarch64), each the same sources
(``level.pxi`` and the family files it includes) compiled with the level's flags."""
