"""Fixtures and the summary table of the layer benchmarks (bench_attention.py, bench_mlp.py).

Run:  pytest benchmarks --benchmark-only   (every bench_*.py: collected by the hook below)
The machine's roofline (DRAM read bandwidth, fp32 / int8 peak) is measured once per session by
the `machine` fixture; the table of every recorded case is printed at the end of the run (and
written to $MEGAFUSE_BENCH_TABLE when that is set).
"""
import fnmatch
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _layers, any --import-mode

import _layers  # noqa: E402


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
    first layer benchmark starts; the bandwidth is measured again when the session ends."""
    yield _layers.machine()
    _layers.machine_end()


def pytest_terminal_summary(terminalreporter):
    lines = _layers.table_lines()
    if not lines:
        return
    terminalreporter.section("megafuse layer benchmarks (medians)")
    for line in lines:
        terminalreporter.write_line(line)
    path = os.environ.get("MEGAFUSE_BENCH_TABLE")
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        terminalreporter.write_line(f"(table written to {path})")
