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
L3_BYTES = 32 << 20               # the last-level cache of the development machine (Zen 3)
DECODE_MIN_BYTES = 3 * L3_BYTES   # decode weight copies cycled per call: the L3 cannot hold them
WEIGHT_ALIGN = 64                 # bytes: each weight of a packed copy starts on a cache line
DRAM_PROBE_BYTES = 1 << 30        # the bandwidth probe's array
NEAR_PROBE_BYTES = 256 << 20      # the probe beside each T=1 row (the shared host's bandwidth
                                  # swings 37-60 GB/s from one second to the next)
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
