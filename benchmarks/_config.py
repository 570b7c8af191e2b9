"""Every knob and constant of the layer benchmarks, in one place.

The environment variables are described in benchmarks/README.md ("Environment knobs").
"""
import os


def _env_float(name, default):
    return float(os.environ.get(name, default))


# ---- threads, time budget, rounds --------------------------------------------------------------
THREADS = int(os.environ.get("MEGAFUSE_BENCH_THREADS", "2"))   # every implementation gets these
BUDGET = _env_float("MEGAFUSE_BENCH_BUDGET", "1.0")  # seconds of timed calls per benchmark
MIN_ROUNDS = 3
MAX_ROUNDS = 400
REFERENCE_BUDGET = 2.0            # the NumPy reference: at most this, and at most 20 rounds
REFERENCE_MAX_ROUNDS = 20

# ---- a quiet machine ----------------------------------------------------------------------------
PAUSE = 0.25                      # seconds between implementations (OpenBLAS / OpenMP spin-down)
# Before each benchmark, wait (up to QUIET_WAIT s) until other processes use at most QUIET of the
# machine's CPU; MAX_WAIT caps the waiting over the whole session.
QUIET = _env_float("MEGAFUSE_BENCH_QUIET", "0.10")
QUIET_WAIT = 20.0
MACHINE_QUIET_WAIT = 30.0         # the same, before the roofline measurements
MAX_WAIT = _env_float("MEGAFUSE_BENCH_MAX_WAIT", "120")

# ---- memory -------------------------------------------------------------------------------------
# "auto" / "huge": megafuse.empty (2 MiB pages); "4k": plain NumPy (4 KiB pages).
PAGES = os.environ.get("MEGAFUSE_BENCH_PAGES", "auto")
MIN_L3_BYTES = 32 << 20           # the L3 assumed where the OS reports none (Zen 3's)


def _last_level_cache_bytes(root="/sys/devices/system/cpu/cpu0/cache"):
    """The largest cache of level >= 3 that Linux reports for CPU 0 (sysfs `size`, e.g. "32768K"),
    or MIN_L3_BYTES where it reports none or less.  On the Intel VMs of this workplace it says
    480 MiB: a set of weight copies read in turn is served from there at 52-57 GB/s up to ~96 MiB
    (2 threads), 43 GB/s at 128 MiB, and only from ~256 MiB at the DRAM rate (29-33 GB/s)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best = 0
    try:
        entries = os.listdir(root)
    except OSError:
        return MIN_L3_BYTES
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "level")) as f:
                level = int(f.read())
            with open(os.path.join(root, entry, "size")) as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        if level >= 3 and size:
            mult = units.get(size[-1].upper(), 1)
            digits = size[:-1] if size[-1].upper() in units else size
            if digits.isdigit():
                best = max(best, int(digits) * mult)
    return max(best, MIN_L3_BYTES)


L3_BYTES = _last_level_cache_bytes()  # this machine's last-level cache (sysfs), >= 32 MiB
DECODE_MIN_BYTES = 3 * L3_BYTES   # decode weight copies cycled per call: the L3 cannot hold them
WEIGHT_ALIGN = 64                 # bytes: each weight of a packed copy starts on a cache line
# The bandwidth probes read arrays the L3 cannot hold either (else they measure the L3).
DRAM_PROBE_BYTES = max(1 << 30, DECODE_MIN_BYTES)    # the session's probe (start and end)
NEAR_PROBE_BYTES = max(256 << 20, DECODE_MIN_BYTES)  # the probe beside each T=1 row (the shared
                                  # host's bandwidth swings 37-60 GB/s from one second to the next)
PAGE_PROBE_BYTES = 64 << 20       # the array that shows how many huge pages the OS grants

# ---- the cases ----------------------------------------------------------------------------------
CACHE_CAPACITY = 1024
DECODE_POS = 511                  # attention decode: the token at position 511 attends 512 keys
TOKENS = tuple(int(t) for t in os.environ.get("MEGAFUSE_BENCH_TOKENS", "1,128").split(","))

# ---- the contention benchmark -------------------------------------------------------------------
DECODE_STEPS = 64                 # each layer of the ring decodes positions 0 .. DECODE_STEPS-1
SPIN_SETTLE = 0.3                 # seconds the competing process spins before timing starts

# ---- the report ---------------------------------------------------------------------------------
TABLE_PATH = os.environ.get("MEGAFUSE_BENCH_TABLE")    # also write the table here
JSON_PATH = os.environ.get("MEGAFUSE_BENCH_JSON")      # and the rows as JSON here
# A peer's result may differ from megafuse's by at most this (max |diff| / max |megafuse|).
PEER_TOL = {"torch": 1e-3, "numpy reference": 1e-4, "ggml": 5e-2}
