"""Arrays on 2 MiB pages, for weights and KV caches.

Decode streams every weight byte from DRAM once a token, so the TLB matters: with 4 KiB pages a
core walks page tables every 4 KiB of a weight, with 2 MiB pages every 2 MiB.  ``megafuse.empty``
gives a NumPy array whose data starts on a 2 MiB boundary, in an anonymous mapping for which
transparent huge pages are requested (``madvise(MADV_HUGEPAGE)``); the kernel grants them when
the system's THP setting is ``always`` or ``madvise`` and 2 MiB of contiguous memory can be found,
and falls back to 4 KiB pages silently otherwise.  Where the OS has no such advice (macOS,
Windows) the array is still 2 MiB-aligned and otherwise an ordinary array.

The array owns its mapping (through ``.base``); the memory is returned when the last view of it
goes.  Pages are mapped on first touch -- fill the array from the thread that will read it, or
from any thread: THP pages are not tied to a core.
"""
import mmap as _mmap
import operator as _operator

import numpy as _np

__all__ = ["HUGE_PAGE_BYTES", "empty", "zeros", "empty_like", "map_zero_pages",
           "huge_pages_requested", "huge_page_bytes"]

HUGE_PAGE_BYTES = 2 << 20        # the x86-64 / aarch64 (4 KiB granule) transparent huge page
_SMALL_PAGE_BYTES = 4096         # the smallest page the OS may back a mapping with


def _shape_tuple(shape):
    if isinstance(shape, (int, _np.integer)):
        shape = (shape,)
    try:
        dims = tuple(_operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {dims}")
    return dims


def empty(shape, dtype=_np.float32):
    """A new C-contiguous, writeable array of ``shape`` and ``dtype`` whose data starts on a 2 MiB
    boundary, with transparent huge pages requested for it (see the module docstring).

    Like ``numpy.empty`` but the contents are zeros (a fresh anonymous mapping is zero-filled by
    the OS); do not rely on that -- use ``zeros`` to say so.
    """
    dims = _shape_tuple(shape)
    dtype = _np.dtype(dtype)
    if dtype.hasobject:
        raise TypeError("megafuse.empty holds plain numbers, not Python objects")
    count = 1
    for d in dims:
        count *= d
    nbytes = count * dtype.itemsize
    # whole huge pages from an aligned start: the mapping is one huge page longer than the
    # rounded-up size, and the array starts at its first 2 MiB boundary
    span = -(-max(nbytes, 1) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    if hasattr(_mmap, "MAP_PRIVATE"):
        # private: Python's default for anonymous maps is MAP_SHARED, i.e. shmem, which THP
        # serves only under shmem_enabled (usually never) -- anonymous THP needs MAP_PRIVATE
        mapping = _mmap.mmap(-1, span + HUGE_PAGE_BYTES,
                             flags=_mmap.MAP_PRIVATE | getattr(_mmap, "MAP_ANONYMOUS", 0x20))
    else:                    # Windows: no flags (and no THP advice either)
        mapping = _mmap.mmap(-1, span + HUGE_PAGE_BYTES)
    advise = getattr(mapping, "madvise", None)
    if advise is not None and hasattr(_mmap, "MADV_HUGEPAGE"):
        try:
            advise(_mmap.MADV_HUGEPAGE)
        except OSError:          # THP compiled out, or the advice refused: 4 KiB pages it is
            pass
    raw = _np.frombuffer(mapping, _np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE_BYTES
    return raw[start:start + nbytes].view(dtype).reshape(dims)


def zeros(shape, dtype=_np.float32):
    """``empty`` filled with zeros (which a fresh mapping already is: no pass over the memory)."""
    return empty(shape, dtype)


def map_zero_pages(a):
    """Have the OS map every page of ``a`` (a C-contiguous array of zeros, e.g. from ``zeros``)
    now, rather than at its first writes: one zero byte written a 4 KiB page, so no value
    changes.  For state that is written in scattered places later (KV caches: each head's rows
    are their own region), so that the cost of mapping it is paid once, up front."""
    if not (isinstance(a, _np.ndarray) and a.flags.c_contiguous and a.flags.writeable):
        raise ValueError("map_zero_pages: expected a C-contiguous, writeable NumPy array")
    a.reshape(-1).view(_np.uint8)[::_SMALL_PAGE_BYTES] = 0


def empty_like(a, dtype=None, shape=None):
    """``empty`` with the shape and dtype of ``a`` (either overridable).  To move a weight onto
    2 MiB pages: ``w2 = megafuse.empty_like(w); w2[...] = w``."""
    a = _np.asarray(a)
    return empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def _vma_fields(a):
    """{field: text} of the /proc/self/smaps entry of the mapping holding a's first byte (Linux),
    None where that cannot be read."""
    addr = _np.asarray(a).__array_interface__["data"][0]
    fields = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    if fields is not None:
                        break                       # past the mapping we were in
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    if lo <= addr < hi:
                        fields = {}
                elif fields is not None:
                    fields[head.rstrip(":")] = line.split(None, 1)[1].strip()
    except OSError:
        return None
    return fields


def huge_pages_requested(a):
    """Whether the memory of ``a`` is a private mapping with the huge-page advice (Linux: the
    ``hg`` flag, and not ``sh``, of its VMA in /proc/self/smaps); None where that cannot be
    read."""
    fields = _vma_fields(a)
    if not fields or "VmFlags" not in fields:
        return None
    flags = fields["VmFlags"].split()
    return "hg" in flags and "sh" not in flags


def huge_page_bytes(a):
    """Bytes of the mapping holding ``a`` that the OS backs with transparent huge pages right now
    (AnonHugePages of its VMA; touched pages only); None where that cannot be read."""
    fields = _vma_fields(a)
    if not fields or "AnonHugePages" not in fields:
        return None
    return int(fields["AnonHugePages"].split()[0]) * 1024
