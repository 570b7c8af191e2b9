"""Where the benchmarks' data lives: weights, activations, KV caches, rope tables.

- Weights, caches and the bandwidth probe's array sit on 2 MiB pages (``megafuse.empty``), as a
  model loader would place them; ``MEGAFUSE_BENCH_PAGES=4k`` puts them in plain NumPy memory.
- A decode case (T = 1) cycles through enough distinct copies of its weights (same bytes,
  separate memory, >= DECODE_MIN_BYTES in all: 3x the L3 the OS reports) that every call streams its
  weights from DRAM.  The copies are packed back to back into one mapping, each weight on a
  cache line, the way a GGUF file lays tensors out.
- One weight set is alive at a time (the cases are ordered so each set is built once).
"""
import dataclasses
import math

import numpy as np

import megafuse as mf

from _cases import DT, WEIGHTS, block_formats, weight_cols, weight_rows
from _config import CACHE_CAPACITY, DECODE_MIN_BYTES, PAGE_PROBE_BYTES, PAGES, WEIGHT_ALIGN


def empty(shape, dtype):
    """An array from megafuse.empty (2 MiB pages), or numpy.empty with MEGAFUSE_BENCH_PAGES=4k."""
    if PAGES == "4k":
        return np.empty(shape, dtype)
    return mf.empty(shape, dtype)


def placed(arr):
    """A copy of arr in memory from empty()."""
    out = empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def page_mode():
    """A line for the report: the page size the buffers get, and what the OS granted."""
    if PAGES == "4k":
        return "4 KiB pages (numpy.empty)"
    probe = empty((PAGE_PROBE_BYTES,), np.uint8)
    # The kernel may merge the probe's mapping with its neighbours (same flags) into one VMA:
    # count the huge pages that touching the probe adds to it.
    before = mf.memory.huge_page_bytes(probe)
    probe[:] = 1                                       # touched, so the OS maps it
    after = mf.memory.huge_page_bytes(probe)
    got = None if before is None or after is None else min(after - before, probe.nbytes)
    granted = "" if got is None else (
        f"; the OS backed {100 * got / probe.nbytes:.0f}% of a {PAGE_PROBE_BYTES >> 20} MiB "
        f"probe with them")
    return f"2 MiB pages (megafuse.empty{granted})"


def packed_copies(first, n):
    """n copies of the arrays of dict `first`, packed back to back into one empty() mapping
    (each array on a WEIGHT_ALIGN boundary): a list of n dicts of views."""
    offsets, end = {}, 0
    for name, a in first.items():
        end = -(-end // WEIGHT_ALIGN) * WEIGHT_ALIGN
        offsets[name] = end
        end += a.nbytes
    stride = -(-end // WEIGHT_ALIGN) * WEIGHT_ALIGN
    arena = empty((n * stride,), np.uint8)                      # [n copies, stride bytes]
    out = []
    for i in range(n):
        views = {}
        for name, a in first.items():
            lo = i * stride + offsets[name]
            v = arena[lo:lo + a.nbytes].view(a.dtype).reshape(a.shape)
            v[...] = a
            views[name] = v
        out.append(views)
    return out


def decode_copy_count(bytes_per_copy):
    """Copies a decode case cycles through: >= 2, and >= DECODE_MIN_BYTES in all."""
    return max(2, -(-DECODE_MIN_BYTES // bytes_per_copy))


class WeightSet:
    """The weights of one (block, shape, label), seeded random N(0, 1/cols) and quantized by
    megafuse.quantize: ``copies(decode)`` gives one dict {weight name: encoded array} per copy.
    The small vectors (gamma, biases) are shared by every copy."""

    def __init__(self, block, shape, label):
        self.block, self.shape, self.label = block, shape, label
        self.formats = block_formats(block, shape, label)
        rng = np.random.default_rng(1234)
        s = shape
        first = {}
        for name in WEIGHTS[block]:
            rows, cols = weight_rows(s, name), weight_cols(s, name)
            w = rng.standard_normal((rows, cols), dtype=np.float32)      # [rows, cols]
            w *= np.float32(1.0 / math.sqrt(cols))
            fmt = self.formats[name]
            first[name] = w if fmt == "FP32" else mf.quantize(w, DT[fmt])
            del w
        self._first = first
        self.bytes_per_copy = sum(a.nbytes for a in first.values())
        self._copies = {}
        f32 = lambda *n: rng.standard_normal(n, dtype=np.float32)  # noqa: E731
        self.gamma = (1.0 + 0.1 * f32(s.E)).astype(np.float32)       # [E]
        if block == "attention" and s.qkv_bias:
            self.bq = 0.1 * f32(s.H * s.D)                             # [H*D]
            self.bk = 0.1 * f32(s.G * s.D)                             # [G*D]
            self.bv = 0.1 * f32(s.G * s.D)                             # [G*D]
        else:
            self.bq = self.bk = self.bv = None
        self.bo = None                      # none of the models has an o_proj or MLP bias
        self.b1 = self.b2 = None

    def copies(self, decode):
        """The copies a case cycles through: decode_copy_count() of them for decode, else 1."""
        n = decode_copy_count(self.bytes_per_copy) if decode else 1
        if n not in self._copies:
            self._copies.clear()            # the decode copies and the prefill copy in turn
            self._copies[n] = packed_copies(self._first, n)
        return self._copies[n]


_WEIGHTS = {}


def weight_set(case):
    """The case's weight set; building a new one frees the previous one."""
    key = case.weights_key
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        _WEIGHTS[key] = WeightSet(*key)
    return _WEIGHTS[key]


def weights_for(case):
    """(weight set, [weight dict per copy]) of the case."""
    ws = weight_set(case)
    return ws, ws.copies(case.decode)


def rope_tables(shape, rows=CACHE_CAPACITY):
    """Rotate-half (cos, sin), each float32 [rows, D/2]."""
    inv = shape.theta ** (-np.arange(0, shape.D, 2, dtype=np.float64) / shape.D)   # [D/2]
    ang = np.arange(rows, dtype=np.float64)[:, None] * inv[None, :]               # [rows, D/2]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@dataclasses.dataclass
class Activations:
    x: np.ndarray           # [T, E] input
    res: np.ndarray         # [T, E] residual
    cache_k: np.ndarray     # [G, C, D] pristine initial state (positions < start_pos random)
    cache_v: np.ndarray     # [G, C, D]
    cos: np.ndarray         # [C, D/2]
    sin: np.ndarray         # [C, D/2]


def activations(case):
    """Seeded inputs of a case; every implementation copies the caches it writes."""
    s, T = case.shape, case.T
    rng = np.random.default_rng(7 + T)
    x = rng.standard_normal((T, s.E), dtype=np.float32)
    res = rng.standard_normal((T, s.E), dtype=np.float32)
    ck = np.zeros((s.G, CACHE_CAPACITY, s.D), np.float32)
    cv = np.zeros_like(ck)
    p0 = case.start_pos
    if p0:
        ck[:, :p0] = rng.standard_normal((s.G, p0, s.D), dtype=np.float32)
        cv[:, :p0] = rng.standard_normal((s.G, p0, s.D), dtype=np.float32)
    cos, sin = rope_tables(s)
    return Activations(x, res, ck, cv, cos, sin)
