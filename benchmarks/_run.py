"""One layer benchmark: build the implementation's runner, time it, check its output against
megafuse's, record the row (the body of bench_attention.py and bench_mlp.py)."""
import numpy as np

import _peers
import _report
from _cases import megafuse_variants
from _config import BUDGET, REFERENCE_BUDGET, REFERENCE_MAX_ROUNDS
from _runners import keep_megafuse_output, megafuse_output, megafuse_runner
from _roofline import dram_bandwidth_near
from _timing import measure


def rel_err(got, want):
    """max |got - want| / max |want|."""
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got - want))) / scale


def _measure_row(benchmark, case, runner):
    """measure(), and for a T=1 row the DRAM bandwidth just before and after it: the better of
    the two goes to runner.dram_bw, the row's %dram figure."""
    before = dram_bandwidth_near() if case.decode else None
    med, other = measure(benchmark, runner.fn)
    if case.decode:
        runner.dram_bw = max(before, dram_bandwidth_near())
    return med, other


def run_case(benchmark, case, impl):
    """Benchmark one implementation of one case and record its row of the summary table."""
    benchmark.group = case.group
    if impl.startswith("megafuse"):
        r = megafuse_runner(case, impl)
        med, other = _measure_row(benchmark, case, r)
        assert np.isfinite(r.out).all(), f"{impl}: non-finite output"
        if impl == megafuse_variants(case)[0]:
            keep_megafuse_output(case, r.out)
        _report.record(benchmark, case, impl, med, r, other=other,
                       int8=impl != "megafuse float" and case.int8())
        return
    _peers.require(impl)
    r = _peers.runner(case, impl)
    try:
        if impl == "numpy reference":
            med, other = measure(benchmark, r.fn, budget=min(BUDGET, REFERENCE_BUDGET),
                                 max_rounds=REFERENCE_MAX_ROUNDS)
        else:
            med, other = _measure_row(benchmark, case, r)
        err = rel_err(r.out, megafuse_output(case))
        _report.record(benchmark, case, impl, med, r, other=other, err=err,
                       int8=impl == "ggml" and case.int8())
    finally:
        if r.close is not None:
            r.close()
