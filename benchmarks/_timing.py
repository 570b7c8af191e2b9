"""Timing on a shared machine: wait for other processes to quiet down, time with
pytest-benchmark, and note how much CPU other processes took while a row was timed.
"""
import os
import time

from _config import BUDGET, MAX_ROUNDS, MAX_WAIT, MIN_ROUNDS, PAUSE, QUIET, QUIET_WAIT


OWN_HELPERS = set()   # pids of this run's own helper processes (bench_model.py's llama.cpp peer):
                      # their CPU time is the timed row's work, not other processes'


def cpu_ticks():
    """(busy clock ticks of the whole machine, ticks of this process and its OWN_HELPERS), or
    None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        own = process_ticks("self")
    except (OSError, ValueError, IndexError):
        return None
    for pid in tuple(OWN_HELPERS):
        try:
            own += process_ticks(pid)
        except (OSError, ValueError, IndexError):     # it has exited
            pass
    return sum_busy(fields), own


def sum_busy(fields):
    """Busy ticks of /proc/stat's cpu line: user nice system idle iowait irq softirq steal."""
    return sum(fields[:8]) - fields[3] - fields[4]


def process_ticks(pid="self"):
    """utime + stime of a process (its /proc/<pid>/stat fields 14 and 15), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        mine = f.read().rsplit(")", 1)[1].split()
    return int(mine[11]) + int(mine[12])


def ticks_per_second():
    return os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def other_load(before, after, seconds):
    """Share of the machine's CPU time (0..1) that processes other than this one (and its
    helpers) used between two cpu_ticks() readings `seconds` apart."""
    if before is None or after is None or seconds <= 0:
        return None
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, other / ticks_per_second() / (seconds * (os.cpu_count() or 1)))


WAITED = [0.0]     # seconds spent waiting for a quiet machine in this session


def wait_quiet(limit=QUIET_WAIT):
    """Sleep in PAUSE steps (at least one: the pause between implementations) until other
    processes used at most QUIET of the CPU during the last step, for at most `limit` seconds
    (and MAX_WAIT over the session).  Returns the last step's share (None off Linux)."""
    start = time.perf_counter()
    while True:
        before, t0 = cpu_ticks(), time.perf_counter()
        time.sleep(PAUSE)
        share = other_load(before, cpu_ticks(), time.perf_counter() - t0)
        waited = time.perf_counter() - start
        if share is None or share <= QUIET or waited >= limit or \
                WAITED[0] + waited >= MAX_WAIT:
            WAITED[0] += waited - PAUSE
            return share


def measure(benchmark, fn, *, budget=BUDGET, max_rounds=MAX_ROUNDS, min_rounds=MIN_ROUNDS,
            setup=None, quiet=True):
    """Time fn() with pytest-benchmark, one call a round: one trial call sets the round count so
    the timed calls take about `budget` seconds.  setup() (untimed) runs before every round.
    Waits a little for a quiet machine first (unless quiet=False).  Returns (median seconds,
    share of the CPU other processes used meanwhile), the share also in
    benchmark.extra_info['other_cpu_share']."""
    if quiet:
        wait_quiet()
    if setup is not None:
        setup()
    t0 = time.perf_counter()
    fn()
    trial = time.perf_counter() - t0
    rounds = int(min(max_rounds, max(min_rounds, budget / max(trial, 1e-6))))
    warmup = 2 if trial < 0.01 else (1 if trial < 0.2 else 0)
    before, t0 = cpu_ticks(), time.perf_counter()
    benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=warmup)
    other = other_load(before, cpu_ticks(), time.perf_counter() - t0)
    benchmark.extra_info["other_cpu_share"] = other
    return benchmark.stats.stats.median, other
