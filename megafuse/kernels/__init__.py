"""megafuse.kernels: the kernel library behind the header's functions.

- the boundary's parts, included by ``megafuse/_kernels.pyx``: argument checks (``checks.pxi``),
  data-type arguments (``dtype_args.pxi``), threads and tiles (``threads.pxi``), the format API
  (``formats.pxi``) and the C API (``capi.pxi``);
- ``kernel_table.pxd``: the table of kernel pointers a SIMD level hands the boundary, and the
  model step's structs; ``mf_quant.pxd`` / ``mf_scratch.pxd``: the C helpers' declarations;
- ``levels/``: the kernels, compiled once per SIMD level (``levels/level.pxi`` and its family
  files); ``simd.py`` picks the level, ``selftest.py`` proves it at import;
- ``dtype.py``: ``CKDataType``; ``memory.py``: arrays on 2 MiB pages.
"""
