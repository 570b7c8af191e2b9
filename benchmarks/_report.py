"""The report: the rows the benchmarks record, the summary table conftest.py prints at the end
of the run (and writes to $MEGAFUSE_BENCH_TABLE) and the same rows as JSON
($MEGAFUSE_BENCH_JSON).  Every column is described in benchmarks/README.md.
"""
import json
import os
import platform

import megafuse as mf

from _buffers import decode_copy_count, page_mode, weight_set
from _cases import PEERS, format_note, megafuse_variants
from _config import (DECODE_MIN_BYTES, L3_BYTES, MAX_WAIT, NEAR_PROBE_BYTES, PEER_TOL, QUIET,
                     THREADS)
from _roofline import MACHINE, best, dram_fraction, roofline
from _timing import WAITED

RESULTS = []        # layer rows: see record()
CONTENTION = []     # contention rows: see record_contention()
MODEL = []          # whole-model rows: see record_model()


# ---- recording ----------------------------------------------------------------------------------
def record(benchmark, case, impl, median, runner, *, other=None, err=None, int8=False):
    """One (case, implementation) row; its figures also go to the benchmark's extra_info."""
    nbytes = runner.bytes + case.kv_bytes() + case.activation_bytes()
    row = dict(case=case, impl=impl, median=median, flops=runner.flops,
               weight_bytes=runner.bytes, bytes=nbytes, err=err, note=runner.note, int8=int8,
               other=other, dram_bw=runner.dram_bw)
    RESULTS.append(row)
    bound, kind = roofline(runner.flops, nbytes, int8, runner.dram_bw)
    info = benchmark.extra_info
    info.update(case=case.id, impl=impl, median_ms=median * 1e3,
                weight_GBps=runner.bytes / median / 1e9 if median and runner.bytes else None,
                GFLOPs=runner.flops / median / 1e9 if median else None,
                dram_fraction=dram_fraction(runner.bytes, median, runner.dram_bw),
                dram_bw_beside_GBps=runner.dram_bw / 1e9 if runner.dram_bw else None,
                roofline_fraction=bound / median if bound and median else None, bound=kind)
    if case.decode:
        ws = weight_set(case)
        n = decode_copy_count(ws.bytes_per_copy)
        info.update(weight_copies=n, weight_copies_MiB=n * ws.bytes_per_copy / 2**20)
    if err is not None:
        info["max_rel_diff_vs_megafuse"] = err
    for mrow in RESULTS:
        if mrow["case"] == case and mrow["impl"].startswith("megafuse") and \
                not impl.startswith("megafuse"):
            info[f"speedup_of_{mrow['impl'].replace(' ', '_')}"] = speedup(mrow, row)
    return row


def record_contention(benchmark, *, shape, label, mode, median, other, competitor, layers,
                      weight_bytes):
    """One row of the contention benchmark (mode 'quiet' or 'busy')."""
    row = dict(shape=shape, label=label, mode=mode, median=median, other=other,
               competitor=competitor, layers=layers, weight_bytes=weight_bytes)
    CONTENTION.append(row)
    info = benchmark.extra_info
    info.update(shape=shape.name, format=label, mode=mode, median_ms=median * 1e3,
                competitor_cpu_share=competitor, ring_layers=layers)
    ratio = contention_ratio(shape, label)
    if ratio is not None:
        info["busy_over_quiet"] = ratio
    return row


def record_model(benchmark, *, file, test, mode, impl, tokens, median, other, competitor,
                 ops=None, nbytes=None, int8=True):
    """One whole-model row (bench_model.py): file = the model file's label ("Q4_1", or
    "Q4_K_M*" for a requantization, "1B-Q4_K_M" for a Llama-1B-shaped file), test "pp128" /
    "tg64" / "tg64@1024", mode "quiet" / "busy".  ops / nbytes: the integer (or float) operations
    and the bytes read from DRAM of the timed call, for the roofline columns (None: not shown)."""
    row = dict(file=file, test=test, mode=mode, impl=impl, tokens=tokens, median=median,
               other=other, competitor=competitor, ops=ops, nbytes=nbytes, int8=int8)
    MODEL.append(row)
    peak, dram = _model_roof(row)
    benchmark.extra_info.update(file=file, test=test, mode=mode, impl=impl, median_s=median,
                                tokens_per_s=tokens / median if median else None,
                                competitor_cpu_share=competitor, ops=ops, bytes=nbytes,
                                peak_fraction=peak, dram_fraction=dram)
    return row


def _model_roof(r):
    """(ops / median / the int8 peak (fp32 where there is none, or in float mode), bytes /
    median / the DRAM read bandwidth) of a whole-model row; None where unknown."""
    if not r["median"]:
        return None, None
    peak = (best("int8_peak") if r["int8"] else None) or best("fp32_peak")
    bw = best("dram_bw")
    return (r["ops"] / r["median"] / (peak * 1e9) if r["ops"] and peak else None,
            r["nbytes"] / r["median"] / bw if r["nbytes"] and bw else None)


def _model_lines():
    head = (f"{'file':<10} {'model':<9} {'mode':<6} {'impl':<19} {'t/s':>9} {'ms':>9} "
            f"{'/llama.cpp':>10} {'busy/quiet':>10} {'%peak':>5} {'%dram':>5} {'other':>5}")
    lines = [head, "-" * len(head)]
    def find(file, test, mode, impl):
        return next((r for r in MODEL
                     if (r["file"], r["test"], r["mode"], r["impl"]) == (file, test, mode, impl)),
                    None)
    for r in MODEL:
        peer = find(r["file"], r["test"], r["mode"], "llama.cpp")
        quiet = find(r["file"], r["test"], "quiet", r["impl"])
        ratio = peer["median"] / r["median"] if peer and r is not peer else None
        slow = r["median"] / quiet["median"] if r["mode"] == "busy" and quiet else None
        peak, dram = _model_roof(r)
        lines.append(
            f"{r['file']:<10} {r['test']:<9} {r['mode']:<6} {r['impl']:<19} "
            f"{_cell(r['tokens'] / r['median'], '9.1f', 9)} {_cell(r['median'] * 1e3, '9.1f', 9)} "
            f"{_cell(ratio, '9.2f', 9)}{'x' if ratio else ' '} "
            f"{_cell(slow, '9.2f', 9)}{'x' if slow else ' '} "
            f"{_cell(None if peak is None else 100 * peak, '4.0f', 4)}{'%' if peak else ' '} "
            f"{_cell(None if dram is None else 100 * dram, '4.0f', 4)}{'%' if dram else ' '} "
            f"{_cell(None if r['other'] is None else 100 * r['other'], '4.0f', 4)}%")
    return lines


def speedup(mrow, prow):
    """megafuse's speed over a peer's, normalised by the work each does: (megafuse flops /
    time) / (peer flops / time); the peer's time / megafuse's when both do the same work."""
    if not (mrow["median"] and prow["median"] and mrow["flops"] and prow["flops"]):
        return None
    return (mrow["flops"] / mrow["median"]) / (prow["flops"] / prow["median"])


def contention_ratio(shape, label):
    """busy median / quiet median of the latest rows of (shape, label), None without both."""
    med = {r["mode"]: r["median"] for r in CONTENTION if r["shape"] == shape
           and r["label"] == label}
    if med.get("quiet") and med.get("busy"):
        return med["busy"] / med["quiet"]
    return None


# ---- the table ----------------------------------------------------------------------------------
def _versions():
    vers = [f"megafuse {mf.__version__} (SIMD {mf.simd_level()}, {mf.get_num_threads()} threads)"]
    try:
        import torch
        vers.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        vers.append("torch: not installed")
    try:
        from importlib.metadata import version
        vers.append(f"ggml-python {version('ggml-python')} ({THREADS} threads)")
    except Exception:  # noqa: BLE001 -- PackageNotFoundError and friends
        vers.append("ggml-python: not installed")
    return vers


def _header_lines():
    m = MACHINE
    lines = ["megafuse layer benchmarks: " + ", ".join(_versions())]
    cpu = platform.processor() or platform.machine()
    lines.append(f"CPU: {cpu}, {os.cpu_count()} cores; weights and caches on "
                 f"{m.get('pages') or page_mode()}")
    if "start" not in m:
        return lines

    def fig(key, scale, unit):
        vals = [f"{m[w][key] / scale:.1f}" if m[w].get(key) else "?"
                for w in ("start", "end") if w in m]
        return " / ".join(vals) + " " + unit
    lines.append(f"roofline ({THREADS} threads; start / end of the session, the better one used): "
                 f"DRAM read {fig('dram_bw', 1e9, 'GB/s')}; fp32 peak "
                 f"{fig('fp32_peak', 1, 'GFLOP/s')}, int8 peak {fig('int8_peak', 1, 'GOP/s')} "
                 f"({m['start']['peak_how']})")
    loads = [f"{m[w]['load']:.1f}" for w in ("start", "end")
             if w in m and m[w].get("load") is not None]
    if loads:
        lines.append(f"1-min load average {' / '.join(loads)} (start / end; above ~0.5 other "
                     f"work competes for the {os.cpu_count()} cores: see the 'other' column)")
    if WAITED[0] > 0.5:
        lines.append(f"waited {WAITED[0]:.0f} s in all for other processes to quiet down "
                     f"(MEGAFUSE_BENCH_QUIET={QUIET}, MEGAFUSE_BENCH_MAX_WAIT={MAX_WAIT:.0f})")
    lines.append(f"decode (T=1) weights: each call takes the next of >= 2 distinct copies "
                 f"totalling >= {DECODE_MIN_BYTES >> 20} MiB (3x the {L3_BYTES >> 20} MiB L3 "
                 f"the OS reports: it cannot serve them)")
    return lines


def _cell(value, fmt, width):
    return f"{value:{fmt}}" if value is not None else f"{'-':>{width}}"


def _layer_lines():
    head = (f"{'block':<9} {'shape':<12} {'T':>3} {'weights':<7} {'impl':<15} {'ms':>9} "
            f"{'GB/s':>6} {'%dram':>5} {'probe':>5} {'GFLOP/s':>7} {'roof':>8} {'xtorch':>6} "
            f"{'xggml':>6} {'xref':>6} {'diff':>7} {'other':>5}")
    lines = [head, "-" * len(head)]
    seen = []
    for r in RESULTS:
        if r["case"] not in seen:
            seen.append(r["case"])
    notes = {}
    for case in seen:
        rows = [r for r in RESULTS if r["case"] == case]
        order = megafuse_variants(case) + list(PEERS)
        rows.sort(key=lambda r: order.index(r["impl"]) if r["impl"] in order else len(order))
        peers = {r["impl"]: r for r in rows if not r["impl"].startswith("megafuse")}
        label, note = format_note(case.block, case.shape, case.label)
        if note:
            notes[(label, case.shape.name, case.block)] = (
                f"{label} on {case.shape.name} {case.block}: {note} (llama.cpp's fallback for "
                f"rows not a multiple of 256)")
        for r in rows:
            med = r["median"]
            gbs = r["weight_bytes"] / med / 1e9 if med and r["weight_bytes"] else None
            gfl = r["flops"] / med / 1e9 if med and r["flops"] else None
            frac = dram_fraction(r["weight_bytes"], med, r.get("dram_bw"))
            bound, kind = roofline(r["flops"], r["bytes"], r["int8"], r.get("dram_bw"))
            roof = f"{100 * bound / med:4.0f}%{kind:>3}" if bound and med else f"{'-':>8}"
            probe = None if not r.get("dram_bw") else r["dram_bw"] / 1e9
            cells = []
            for p in PEERS:
                sp = speedup(r, peers[p]) if r["impl"].startswith("megafuse") and p in peers \
                    else None
                cells.append(f"{sp:5.2f}x" if sp else "")
            diff = "" if r["err"] is None else f"{r['err']:.0e}"
            if r["err"] is not None and r["err"] > PEER_TOL.get(r["impl"], 1e-2):
                diff += "!"
            impl = r["impl"] + (f" ({r['note']})" if r["note"] else "")
            lines.append(
                f"{case.block:<9} {case.shape.name:<12} {case.T:>3} {label:<7} {impl:<15} "
                f"{med * 1e3:9.3f} {_cell(gbs, '6.3g', 6)} "
                f"{_cell(None if frac is None else 100 * frac, '4.0f', 4)}% "
                f"{_cell(probe, '5.1f', 5)} {_cell(gfl, '7.3g', 7)} {roof} "
                f"{cells[0]:>6} {cells[1]:>6} {cells[2]:>6} {diff:>7} "
                f"{_cell(None if r['other'] is None else 100 * r['other'], '4.0f', 4)}%")
    lines += ["* " + n for n in notes.values()]
    return lines


def _contention_lines():
    head = (f"{'contention':<12} {'shape':<12} {'weights':<7} {'layers':>6} {'quiet ms':>9} "
            f"{'busy ms':>9} {'busy/quiet':>10} {'competitor':>10} {'other':>5}")
    lines = [head, "-" * len(head)]
    keys = []
    for r in CONTENTION:
        if (r["shape"], r["label"]) not in keys:
            keys.append((r["shape"], r["label"]))
    for shape, label in keys:
        rows = {r["mode"]: r for r in CONTENTION if r["shape"] == shape and r["label"] == label}
        q, b = rows.get("quiet"), rows.get("busy")
        ratio = contention_ratio(shape, label)
        any_row = q or b
        comp = b["competitor"] if b else None
        other = [f"{100 * r['other']:.0f}%" if r["other"] is not None else "-"
                 for r in (q, b) if r]
        lines.append(
            f"{'decode step':<12} {shape.name:<12} {label:<7} {any_row['layers']:>6} "
            f"{_cell(q['median'] * 1e3 if q else None, '9.3f', 9)} "
            f"{_cell(b['median'] * 1e3 if b else None, '9.3f', 9)} "
            f"{_cell(ratio, '9.2f', 9)}{'x' if ratio else ' '} "
            f"{_cell(None if comp is None else 100 * comp, '9.0f', 9)}% {'/'.join(other):>5}")
    return lines


def table_lines():
    """The summary table: header lines, one line per (case, implementation), then the
    contention rows."""
    if not RESULTS and not CONTENTION and not MODEL:
        return []
    lines = _header_lines()
    if RESULTS:
        lines.append(
            "ms = median; GB/s = weight bytes / median; %dram = GB/s / DRAM read bandwidth (T=1 "
            f"rows: probe = the better of two reads of {NEAR_PROBE_BYTES >> 20} MiB just before "
            "and after the row, GB/s; other rows: the session's figure above); "
            "GFLOP/s = (2 x weight MACs + attention flops) / median; roof = roofline time / "
            "median, roofline time = max(mem: (weights + KV + activations) / DRAM bw, cpu: flops "
            "/ fp32 or int8 peak); xPEER = megafuse speed / peer speed (>1: megafuse faster); "
            "diff = peer's max |diff| / max |megafuse output|, ! above tolerance; other = share "
            "of the machine's CPU other processes used while the row was timed")
        lines += _layer_lines()
    if CONTENTION:
        if RESULTS:
            lines.append("")
        lines.append("decode step = one DecoderLayer.decode, the next layer of a ring of distinct "
                     "layers each call; busy = while a spinning process pinned to one core runs; "
                     "competitor = its share of one core while timed; other = machine share of "
                     "other processes (quiet / busy)")
        lines += _contention_lines()
    if MODEL:
        if RESULTS or CONTENTION:
            lines.append("")
        lines.append("whole model (bench_model.py): pp128 = prefill of 128 tokens, tg64 = 64 "
                     "single-token steps, both from an empty cache; tg64@1024 = 64 steps after "
                     "1024 cached tokens (@4096: 4096); pp512 = 512 tokens; t/s = tokens / "
                     "median; %peak = operations (2 x multiply-adds + attention) / median / the "
                     "int8 peak (float mode: fp32); %dram = bytes read (every weight once a step "
                     "+ the KV cache) / median / the DRAM read bandwidth; 1B-<type> = the "
                     "Llama-3.2-1B-shaped file (_llama1b.py); "
                     "/llama.cpp = llama.cpp's median / this row's (>1: faster); busy = a "
                     "spinning process pinned to one core; busy/quiet = slowdown; file = the "
                     "model file's format (*: that file requantized to this format by "
                     "llama.cpp's quantizer)")
        lines += _model_lines()
    return lines


# ---- JSON ---------------------------------------------------------------------------------------
def _case_dict(case):
    return dict(block=case.block, shape=case.shape.name, format=case.label,
                formats=case.formats, tokens=case.T, id=case.id)


def report_dict():
    """Everything the table shows, as plain data."""
    rows = []
    for r in RESULTS:
        med = r["median"]
        bound, kind = roofline(r["flops"], r["bytes"], r["int8"], r.get("dram_bw"))
        peers = {p["impl"]: p for p in RESULTS if p["case"] == r["case"]
                 and not p["impl"].startswith("megafuse")}
        rows.append(dict(
            _case_dict(r["case"]), impl=r["impl"], median_s=med, flops=r["flops"],
            weight_bytes=r["weight_bytes"], bytes=r["bytes"], int8_path=r["int8"],
            weight_GBps=r["weight_bytes"] / med / 1e9 if med and r["weight_bytes"] else None,
            GFLOPs=r["flops"] / med / 1e9 if med else None,
            dram_fraction=dram_fraction(r["weight_bytes"], med, r.get("dram_bw")),
            dram_bw_beside=r.get("dram_bw"),
            roofline_fraction=bound / med if bound and med else None, bound=kind,
            speedup={p: speedup(r, peers[p]) for p in peers} if r["impl"].startswith("megafuse")
            else {},
            max_rel_diff_vs_megafuse=r["err"], other_cpu_share=r["other"]))
    contention = [dict(shape=r["shape"].name, format=r["label"], mode=r["mode"],
                       median_s=r["median"], other_cpu_share=r["other"],
                       competitor_cpu_share=r["competitor"], ring_layers=r["layers"],
                       weight_bytes_per_layer=r["weight_bytes"],
                       busy_over_quiet=contention_ratio(r["shape"], r["label"]))
                  for r in CONTENTION]
    model = [dict(file=r["file"], test=r["test"], mode=r["mode"], impl=r["impl"],
                  median_s=r["median"],
                  tokens_per_s=r["tokens"] / r["median"], other_cpu_share=r["other"],
                  competitor_cpu_share=r["competitor"], ops=r["ops"], bytes=r["nbytes"],
                  peak_fraction=_model_roof(r)[0], dram_fraction=_model_roof(r)[1])
             for r in MODEL]
    return dict(versions=_versions(), cpu=platform.processor() or platform.machine(),
                cores=os.cpu_count(), machine=MACHINE, rows=rows, contention=contention,
                model=model)


def write_json(path):
    with open(path, "w") as f:
        json.dump(report_dict(), f, indent=1, default=str)
