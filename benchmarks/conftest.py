"""Collection, fixtures and the summary table of the benchmarks.

Run:  pytest benchmarks --benchmark-only   (every bench_*.py: collected by the hook below)

The helper modules, one role each (none imports from tests/):
    _config.py    every knob (environment variables) and constant
    _cases.py     shapes, formats, token counts: the cases, their work and their ids
    _buffers.py   weights (decode copies on 2 MiB pages), activations, caches, rope tables
    _runners.py   megafuse's kernels as runners
    _peers.py     PyTorch, ggml (ggml-python), the NumPy reference
    _roofline.py  DRAM bandwidth and compute peaks, from probe.c compiled at run time
    _timing.py    quiet-machine waits and timing
    _report.py    the rows, the table and the JSON
    _run.py       one layer benchmark: runner, timing, check, row
The machine's roofline is measured once per session by the `machine` fixture (and again at
its end); the table of every recorded row is printed at the end of the run, and written to
$MEGAFUSE_BENCH_TABLE / $MEGAFUSE_BENCH_JSON when those are set.
"""
import fnmatch
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the helpers, any --import-mode

import _report
import _roofline
from _config import JSON_PATH, TABLE_PATH


def pytest_collect_file(file_path, parent):
    """Collect benchmarks/bench_*.py when the folder is given (`pytest benchmarks`): the default
    python_files pattern is test_*.py.  Files named on the command line are collected by pytest
    itself, and so are files some python_files setting already matches."""
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    if parent.session.isinitpath(file_path):
        return None
    if any(fnmatch.fnmatch(file_path.name, pat) for pat in parent.config.getini("python_files")):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


@pytest.fixture(scope="session")
def machine():
    """DRAM read bandwidth and compute peaks on the benchmark's thread count, measured when the
    first layer benchmark starts and again when the session ends."""
    yield _roofline.machine()
    _roofline.machine_end()


def pytest_terminal_summary(terminalreporter):
    lines = _report.table_lines()
    if not lines:
        return
    terminalreporter.section("megafuse layer benchmarks (medians)")
    for line in lines:
        terminalreporter.write_line(line)
    if TABLE_PATH:
        with open(TABLE_PATH, "w") as f:
            f.write("\n".join(lines) + "\n")
        terminalreporter.write_line(f"(table written to {TABLE_PATH})")
    if JSON_PATH:
        _report.write_json(JSON_PATH)
        terminalreporter.write_line(f"(rows written to {JSON_PATH} as JSON)")
