"""megafuse.empty / zeros / empty_like: arrays on 2 MiB pages for weights and caches."""
import gc
import mmap
import sys

import numpy as np
import pytest

import megafuse
from megafuse.kernels import memory

from helpers import QWEN2_05B, TOL, decode_case, rel_err
from megafuse import reference


@pytest.mark.parametrize("shape, dtype", [
    ((3, 5), np.float32), ((7,), np.float32), ((0, 4), np.float32), ((2, 3, 4), np.uint8),
    ((1024, 2, 64), np.float16), (((4 << 20) + 3,), np.uint8), ((), np.int64)])
def test_empty_is_aligned_contiguous_writeable(shape, dtype):
    a = megafuse.empty(shape, dtype)
    assert a.shape == (shape if isinstance(shape, tuple) else (shape,))
    assert a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    assert a.size == 0 or a.ctypes.data % memory.HUGE_PAGE_BYTES == 0
    a[...] = 1
    assert np.all(a == 1)


def test_zeros_and_empty_like():
    z = megafuse.zeros((300, 7), np.float64)
    assert z.dtype == np.float64 and not z.any()
    w = np.arange(12, dtype=np.float16).reshape(3, 4)
    e = megafuse.empty_like(w)
    assert e.shape == w.shape and e.dtype == w.dtype and e.ctypes.data % (2 << 20) == 0
    e[...] = w
    assert np.array_equal(e, w)
    assert megafuse.empty_like(w, dtype=np.uint8, shape=5).shape == (5,)


@pytest.mark.parametrize("bad, exc", [((-1, 3), ValueError), ((2.5,), TypeError),
                                      ("abc", TypeError), (None, TypeError)])
def test_bad_shapes_raise(bad, exc):
    with pytest.raises(exc):
        megafuse.empty(bad)


def test_object_dtype_is_refused():
    with pytest.raises(TypeError):
        megafuse.empty(3, object)


def skip_unless_the_advice_is_kept():
    """Skip where madvise(MADV_HUGEPAGE) succeeds but leaves no trace on a mapping of our own:
    qemu-user (the aarch64 emulation of tools/aarch64-emulated.sh) returns success and drops it,
    so neither the advice nor the huge pages it asks for can be seen there."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    probe_map = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        probe_map.madvise(mmap.MADV_HUGEPAGE)
    except OSError as exc:
        pytest.skip(f"madvise(MADV_HUGEPAGE) refused: {exc}")
    probe = np.frombuffer(probe_map, np.uint8)
    if memory.huge_pages_requested(probe) is False:
        pytest.skip("madvise(MADV_HUGEPAGE) is accepted but not kept on any mapping here "
                    "(as under qemu-user)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VMA flags are Linux's")
def test_huge_page_advice_is_on_a_private_mapping():
    """The advice is set, on a private mapping (a shared anonymous one is shmem, which THP does
    not serve unless shmem_enabled says so); NumPy's own memory has neither."""
    a = megafuse.empty((4 << 20,), np.uint8)
    # a private anonymous mapping of our own without the advice (NumPy's memory may come from
    # the malloc heap or an arena, whose flags this test does not control)
    plain_map = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    plain = np.frombuffer(plain_map, np.uint8)
    got = memory.huge_pages_requested(a)
    if got is None:
        pytest.skip("/proc/self/smaps not readable")
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        thp = f.read()
    if "[never]" in thp:
        pytest.skip("transparent huge pages are disabled on this machine")
    skip_unless_the_advice_is_kept()
    assert got is True, memory._vma_fields(a)
    assert memory.huge_pages_requested(plain) is False, memory._vma_fields(plain)


THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_setting():
    """The bracketed word of THP_ENABLED ("always", "madvise", "never"), None where unreadable."""
    try:
        with open(THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps is Linux's")
def test_huge_pages_are_granted_where_thp_is_enabled():
    """8 MiB from megafuse.empty, touched: where THP is "always" or "madvise" the OS backs it with
    2 MiB pages (at least one; the mapping is 2 MiB-aligned and advised) -- and never with more
    than the mapping holds."""
    setting = thp_setting()
    if setting is None:
        pytest.skip(f"{THP_ENABLED} not readable: no transparent huge pages here")
    if setting == "never":
        pytest.skip(f"{THP_ENABLED} says never: the OS grants no huge pages on this machine")
    if setting == "madvise":
        skip_unless_the_advice_is_kept()
    a = megafuse.empty((8 << 20,), np.uint8)
    before = memory.huge_page_bytes(a)
    if before is None:
        pytest.skip("/proc/self/smaps not readable")
    assert before == 0                       # nothing touched yet
    a[:] = 1
    after = memory.huge_page_bytes(a)
    assert memory.HUGE_PAGE_BYTES <= after <= 10 << 20, (
        f"THP is {setting!r} but {after} bytes of the 8 MiB array are on huge pages")


def test_map_zero_pages_maps_every_page_and_changes_no_value():
    """map_zero_pages maps a fresh array's pages (its mapping's Rss grows to hold it) without
    changing a value; it refuses what it could only write through a copy."""
    a = megafuse.zeros((3, 5 << 20), np.uint8)                    # 15 MiB: 8 huge pages
    fields = memory._vma_fields(a)
    if fields is None or "Rss" not in fields:
        pytest.skip("/proc/self/smaps not readable")
    before = int(fields["Rss"].split()[0]) * 1024
    memory.map_zero_pages(a)
    after = int(memory._vma_fields(a)["Rss"].split()[0]) * 1024
    assert after - before >= a.nbytes - memory.HUGE_PAGE_BYTES
    assert not a.any()
    for bad in (a[:, ::2], a.T, [0.0]):
        with pytest.raises(ValueError, match="C-contiguous, writeable"):
            memory.map_zero_pages(bad)
    frozen = megafuse.zeros(8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous, writeable"):
        memory.map_zero_pages(frozen)


def test_memory_lives_as_long_as_a_view():
    a = megafuse.empty((1000,), np.float32)
    view = a[10:20]
    del a
    gc.collect()
    view[...] = 3.0                      # the mapping is still there
    assert np.all(view == 3.0)


def test_kernels_accept_arrays_from_empty():
    """A decode whose weights and caches all live on 2 MiB pages gives the same bits."""
    case = decode_case(QWEN2_05B, seed=3)
    moved = case.copy()
    for name, arr in list(moved.args.items()):
        if isinstance(arr, np.ndarray):
            new = megafuse.empty_like(arr)
            new[...] = arr
            moved.args[name] = new
    ref = case.copy()
    reference.mega_fused_attention_decode(**ref.args)
    megafuse.mega_fused_attention_decode(**case.args)
    megafuse.mega_fused_attention_decode(**moved.args)
    for name in ("output", "kv_cache_k", "kv_cache_v"):
        assert np.array_equal(moved.args[name], case.args[name]), name
    assert rel_err(moved.args["output"], ref.args["output"]) < TOL["float"]
