"""The machine's roofline, measured in the same run as the benchmarks, on their thread count:
DRAM read bandwidth, fp32 FMA peak and int8 multiply-add peak.

benchmarks/probe.c is compiled at run time (``$CC``, default ``cc``) for megafuse's SIMD level
and loaded with ctypes; without a working compiler the bandwidth comes from NumPy alone and the
compute peaks are left out (the roofline then has its memory term only).  The figures are taken
when the first benchmark starts and again when the session ends (``MACHINE['start']`` /
``['end']``); the roofline uses the better of the two (other work on the machine only lowers
them).
"""
import ctypes
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

import megafuse as mf

from _buffers import empty, page_mode
from _config import DRAM_PROBE_BYTES, MACHINE_QUIET_WAIT, NEAR_PROBE_BYTES, THREADS
from _timing import wait_quiet

PROBE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.c")
PROBE_FLAGS = {                      # per megafuse SIMD level, as its extension is built
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}
# amx: avx512's and the AMX flags -- its int8 peak is the tile products' (probe.c)
PROBE_FLAGS["amx"] = PROBE_FLAGS["avx512"] + ["-mamx-tile", "-mamx-int8"]
REPEATS = 5                          # best of
FMA_ITERS = 20_000_000               # probe loop iterations (~0.1-0.3 s a thread)
INT8_ITERS = 20_000_000
ONES_BITS = 0x3F8000003F800000       # two float32 1.0s: the read loop adds normal numbers

MACHINE = {}

_PROBE = {}


def probe():
    """The compiled probe (a ctypes.CDLL), or a string saying why there is none."""
    if "so" in _PROBE:
        return _PROBE["so"]
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        _PROBE["so"] = f"no C compiler ({cc})"
        return _PROBE["so"]
    tmp = tempfile.mkdtemp(prefix="megafuse-probe-")
    try:
        lib = os.path.join(tmp, "probe.so")
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-ffp-contract=fast",
                               *PROBE_FLAGS.get(mf.simd_level(), []), PROBE_SOURCE, "-o", lib],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            _PROBE["so"] = f"probe.c did not compile: {proc.stderr.strip()[:200]}"
            return _PROBE["so"]
        so = ctypes.CDLL(lib)           # mapped: the file may go
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    so.fma_loop.argtypes = [ctypes.c_long]
    so.fma_loop.restype = ctypes.c_float
    so.int8_loop.argtypes = [ctypes.c_long]
    so.read_loop.argtypes = [ctypes.c_void_p, ctypes.c_long]
    so.read_loop.restype = ctypes.c_float
    _PROBE["so"] = so
    return so


def _parallel_best(fn, repeats=REPEATS):
    """Best wall time of running fn() on THREADS threads at once (ctypes and NumPy's reduce
    release the GIL)."""
    best = float("inf")
    for _ in range(repeats):
        ths = [threading.Thread(target=fn) for _ in range(THREADS)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return best


def dram_bandwidth(nbytes=DRAM_PROBE_BYTES, a=None, repeats=REPEATS):
    """Read bandwidth in bytes/s: THREADS threads each read their share of a DRAM_PROBE_BYTES
    array (>= 1 GiB and 3x the L3; from empty(): the same pages as the weights; or of a, an
    array from probe_array), best of 5, by two readers, the better one counted: NumPy's int64
    sum of the bits (its float32 sum is pairwise and compute-bound) and probe.c's 4-accumulator
    read loop."""
    if a is None:
        a = probe_array(nbytes)
    nbytes = a.nbytes
    parts = np.array_split(a, THREADS)
    lock = threading.Lock()
    idx = itertools.count()

    def part():
        with lock:
            return parts[next(idx) % THREADS]
    best = nbytes / _parallel_best(lambda: np.add.reduce(part()), repeats)
    so = probe()
    if not isinstance(so, str):
        def c_read():
            p = part()
            so.read_loop(p.ctypes.data, p.nbytes // 4)
        best = max(best, nbytes / _parallel_best(c_read, repeats))
    return best


def probe_array(nbytes):
    """The probe's array: nbytes on 2 MiB pages, touched (mapped); read as floats, every value
    is 1.0."""
    a = empty((nbytes // 8,), np.int64)                                # [nbytes / 8]
    a[:] = ONES_BITS
    return a


_NEAR = {}


def dram_bandwidth_near():
    """The DRAM read bandwidth now: dram_bandwidth over a NEAR_PROBE_BYTES array (>= 256 MiB and
    3x the L3; allocated once), best of 3 -- taken just before and just after each T=1 row,
    whose %dram is against the better of the two (the machine is shared: its bandwidth moves
    between 37 and 60 GB/s from one second to the next, so the session's start / end figures
    say little about a row's minute)."""
    if "a" not in _NEAR:
        _NEAR["a"] = probe_array(NEAR_PROBE_BYTES)
    return dram_bandwidth(a=_NEAR["a"], repeats=3)


def compute_peaks():
    """(fp32 GFLOP/s, int8 GOP/s or None, how) on THREADS threads from probe.c; (None, None,
    why) without it."""
    so = probe()
    if isinstance(so, str):
        return None, None, so
    width = so.probe_width()
    t = _parallel_best(lambda: so.fma_loop(FMA_ITERS))
    fp32 = THREADS * FMA_ITERS * so.fma_chains() * width * 2 / t / 1e9
    int8 = None
    macs = so.int8_macs_per_iter()
    if macs:
        t = _parallel_best(lambda: so.int8_loop(INT8_ITERS))
        int8 = THREADS * INT8_ITERS * macs * 2 / t / 1e9
    return fp32, int8, f"probe.c, {mf.simd_level()}, {width * 32}-bit vectors"


def _measure():
    """Wait (a while) for a quiet machine, then: DRAM bandwidth, fp32 / int8 peaks."""
    quiet = wait_quiet(limit=MACHINE_QUIET_WAIT)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    bw = dram_bandwidth()
    fp32, int8, how = compute_peaks()
    return dict(dram_bw=bw, fp32_peak=fp32, int8_peak=int8, peak_how=how, load=load,
                other=quiet)


def machine():
    """Measure once per run (the session fixture `machine` calls this first)."""
    if not MACHINE:
        mf.set_num_threads(THREADS)
        MACHINE.update(simd=mf.simd_level(), threads=THREADS, pages=page_mode(),
                       start=_measure())
    return MACHINE


def machine_end():
    """At the end of the session, measure again: the pair shows how much the machine drifted
    while the benchmarks ran."""
    if MACHINE and "end" not in MACHINE:
        MACHINE["end"] = _measure()


def best(key):
    """The better of the start and end measurements of key (None when neither has it)."""
    vals = [MACHINE[w][key] for w in ("start", "end") if w in MACHINE and MACHINE[w].get(key)]
    return max(vals) if vals else None


def dram_fraction(weight_bytes, seconds, near=None):
    """Weight bytes read per second / the DRAM read bandwidth: near (measured beside the row)
    when given, else the session's better figure (None when either is unknown)."""
    bw = near or best("dram_bw")
    if not (bw and seconds and weight_bytes):
        return None
    return weight_bytes / seconds / bw


def roofline(flops, nbytes, int8, near=None):
    """(roofline seconds, 'mem' / 'cpu'): max(bytes / DRAM bandwidth, flops / peak), the peak
    the int8 one for the int8 path (the fp32 one where there is no int8 figure); the bandwidth
    near (measured beside the row) when given, else the session's."""
    bw = near or best("dram_bw")
    t_mem = nbytes / bw if bw else 0.0
    peak = (best("int8_peak") if int8 else None) or best("fp32_peak")
    t_cpu = flops / (peak * 1e9) if peak else 0.0
    return max(t_mem, t_cpu), ("mem" if t_mem >= t_cpu else "cpu")
