# Threads and tiles at the boundary (included by megafuse/_kernels.pyx): the one module-level
# thread count every kernel call passes on as num_threads= (docs/contract.md §7), and the
# attention tiles from this CPU's cache sizes (mega_fuse_get_optimal_tiles), read once at import.


# ---- threads -----------------------------------------------------------------------------------

def _default_num_threads():
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


cdef int _num_threads = _default_num_threads()


def set_num_threads(n):
    """Set how many threads the kernels use (for every later call, from any Python thread)."""
    global _num_threads
    try:
        value = int(n.__index__())
    except AttributeError:
        raise TypeError(f"n: expected an int, got {type(n).__name__}") from None
    if value < 1 or value > 4096:
        raise ValueError(f"n: expected a thread count in 1..4096, got {value}")
    _num_threads = value


def get_num_threads():
    """The number of threads the kernels use."""
    return _num_threads


# ---- tiles -------------------------------------------------------------------------------------

cdef extern from "megafuse/mega_fused_attention.h" nogil:
    enum: MEGA_FUSE_Q_TILE            # the header's tiles, where the OS does not tell cache sizes
    enum: MEGA_FUSE_KV_TILE

cdef Py_ssize_t _l1d_bytes = 0, _l2_bytes = 0
_l1d_bytes, _l2_bytes = _simd.cache_sizes()
cdef int _q_tile_override = 0, _kv_tile_override = 0


cdef inline Py_ssize_t _floor_pow2(Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t p = 1
    while p * 2 <= n:
        p *= 2
    return p


cdef inline Py_ssize_t _clamp(Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    return lo if n < lo else (hi if n > hi else n)


cdef void _tiles_from_cache_sizes(Py_ssize_t l1d, Py_ssize_t l2, int head_dim, int *q_tile,
                                  int *kv_tile) noexcept nogil:
    """The tiles for caches of l1d / l2 bytes.

    kv_tile: one K tile (kv_tile rows of head_dim floats) fills half of L1d, so a tile of K (then
      of V) stays in L1 while the queries stream over it;
    q_tile: a query tile, its accumulators (2 * head_dim floats a row) and a row of kv_tile scores
      fill half of L2.
    Both rounded down to a power of two, kv_tile in [16, MF_ATT_MAX_KV_TILE], q_tile in
    [16, MF_MAX_Q_TILE].  Where the OS does not tell the cache sizes: the header's defaults
    MEGA_FUSE_Q_TILE and MEGA_FUSE_KV_TILE.
    """
    cdef Py_ssize_t d = head_dim if head_dim > 0 else 1
    cdef Py_ssize_t kv
    if l1d <= 0 or l2 <= 0:
        q_tile[0] = MEGA_FUSE_Q_TILE
        kv_tile[0] = MEGA_FUSE_KV_TILE
        return
    kv = _clamp(_floor_pow2((l1d // 2) // (d * 4)), 16, MF_ATT_MAX_KV_TILE)
    kv_tile[0] = <int>kv
    q_tile[0] = <int>_clamp(_floor_pow2((l2 // 2) // ((2 * d + kv) * 4)), 16, MF_MAX_Q_TILE)


cdef void _tiles(int head_dim, int *q_tile, int *kv_tile) noexcept nogil:
    """The tiles for this CPU (its cache sizes, read once at import); a test override wins."""
    if _q_tile_override > 0:
        q_tile[0] = _q_tile_override
        kv_tile[0] = _kv_tile_override
        return
    _tiles_from_cache_sizes(_l1d_bytes, _l2_bytes, head_dim, q_tile, kv_tile)


def _optimal_tiles_for(l1d_bytes, l2_bytes, head_dim):
    """Testing hook: the tile formula for any cache sizes (0 = unknown)."""
    cdef int q_tile = 0, kv_tile = 0
    _tiles_from_cache_sizes(l1d_bytes, l2_bytes, _int_arg(head_dim, "head_dim"), &q_tile,
                            &kv_tile)
    return q_tile, kv_tile


def _set_tile_override(q_tile=None, kv_tile=None):
    """Testing hook: force the tiles every kernel uses (None, None: back to the CPU's)."""
    global _q_tile_override, _kv_tile_override
    if q_tile is None and kv_tile is None:
        _q_tile_override = _kv_tile_override = 0
        return
    if not (1 <= int(kv_tile) <= MF_ATT_MAX_KV_TILE and 1 <= int(q_tile) <= MF_MAX_Q_TILE):
        raise ValueError(f"tiles: expected q_tile in 1..{MF_MAX_Q_TILE} and kv_tile in "
                         f"1..{MF_ATT_MAX_KV_TILE}, got {q_tile}, {kv_tile}")
    _q_tile_override, _kv_tile_override = int(q_tile), int(kv_tile)
