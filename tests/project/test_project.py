"""The project's housekeeping: one version (pyproject.toml's), the license pyproject names, a
changelog section for that version, the contract's sections that the code cites, the build
configuration compiled into the package, and comments that quote no measurements."""
import glob
import io
import os
import platform
import re
import sys
from importlib import metadata

import pytest

import megafuse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.dirname(os.path.abspath(megafuse.__file__))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _pyproject():
    try:
        import tomllib
    except ImportError:                       # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(_read("pyproject.toml"))


def test_version_is_the_one_in_pyproject():
    assert megafuse.__version__ == _pyproject()["project"]["version"]


def test_version_without_metadata_comes_from_pyproject(monkeypatch):
    """A source tree on sys.path (no installed metadata): the fallback reads pyproject.toml."""
    if os.path.dirname(PACKAGE) != ROOT:
        pytest.skip("megafuse is imported from an installation, not this source tree")

    def not_found(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(megafuse._metadata, "version", not_found)
    assert megafuse._version() == _pyproject()["project"]["version"]


def test_version_is_written_once():
    """No second literal of the version anywhere in the package, its headers or setup.py."""
    version = _pyproject()["project"]["version"]
    literal = re.compile(r"""["']""" + re.escape(version) + r"""["']""")
    files = [os.path.join(ROOT, "setup.py")]
    for folder in (os.path.join(ROOT, "megafuse"), os.path.join(ROOT, "include", "megafuse")):
        files += [os.path.join(folder, name) for name in os.listdir(folder)
                  if name.endswith((".py", ".pyi", ".pyx", ".pxi", ".pxd", ".h"))]
    assert len(files) > 10
    for path in files:
        with open(path, encoding="utf-8") as f:
            assert not literal.search(f.read()), f"{path} spells the version {version} again"


def test_license_is_the_one_pyproject_names():
    assert _pyproject()["project"]["license"] == "MIT"
    text = _read("LICENSE")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 megafuse developers" in text


def test_changelog_has_the_version_and_unreleased():
    text = _read("CHANGELOG.md")
    version = _pyproject()["project"]["version"]
    assert re.search(r"^## \[Unreleased\]", text, flags=re.M)
    assert re.search(r"^## \[" + re.escape(version) + r"\] - \d{4}-\d{2}-\d{2}$", text,
                     flags=re.M)


def test_contract_has_every_section_the_code_cites():
    """docs/contract.md keeps the section numbers §1 .. §7 of the contract; every
    "contract.md §N" cited in the code, the headers, the tests or the benchmarks is a heading."""
    headings = set(re.findall(r"^#+ §(\d+(?:\.\d+)*)[. ]", _read("docs", "contract.md"),
                              flags=re.M))
    assert {str(n) for n in range(1, 8)} <= headings
    cited = set()
    for folder in ("megafuse", os.path.join("include", "megafuse"), "tests", "benchmarks"):
        for name in os.listdir(os.path.join(ROOT, folder)):
            if name.endswith((".py", ".pyi", ".pyx", ".pxi", ".pxd", ".h")):
                cited |= set(re.findall(r"contract\.md,? §(\d+(?:\.\d+)*)",
                                        _read(folder, name)))
    assert cited, "nothing cites docs/contract.md"
    assert not cited - headings, f"cited sections missing from docs/contract.md: {cited - headings}"


def test_build_configuration_is_compiled_in():
    from megafuse import _build_info
    from megafuse.kernels import simd as _simd

    config = _build_info.BUILD_CONFIG
    assert set(config) >= {"compile_flags", "simd_flags", "openmp", "debug", "simd_levels"}
    assert isinstance(config["openmp"], bool) and isinstance(config["debug"], bool)
    assert set(_simd.built_levels()) <= set(config["simd_levels"]) == set(config["simd_flags"])
    shown = megafuse.show_config(file=io.StringIO())
    assert shown["compiler_flags"] == config["compile_flags"] != "unknown"
    assert shown["openmp"] is config["openmp"] and shown["debug_build"] is config["debug"]
    assert shown["version"] == megafuse.__version__


# A figure that only a measurement gives: a rate, a time a call, a before -> after pair, a
# speed-up or slow-down.  Comments state the invariant, the layout or the reason; measurements
# and their history live in benchmarks/README.md and CHANGELOG.md, where they can be re-measured.
# Sizes ("256 KiB", "2 MiB", "64 bytes"), counts, bounds and C's % (modulo) are not figures.
_NUM = r"\d+(?:\.\d+)?"
_RANGE = _NUM + r"(?:\s*-\s*" + _NUM + r")?"
_FIGURE = re.compile("|".join([
    _RANGE + r"\s*(?:GB/s|GiB/s|MB/s|MiB/s|tok/s|tokens/s|t/s|GFLOP/s|GFLOPS|TFLOP/s)",
    _RANGE + r"\s*(?:µs|us|ms)\s+(?:(?:a|per|each)\s+(?:call|token|step|layer)|more|less)\b",
    _NUM + r"\s*-\s*" + _NUM + r"\s*(?:µs|us|ms)\b",                    # a range of times
    r"\d+\.\d+\s*(?:µs|us|ms)\b",                                      # a time to a decimal
    _NUM + r"\s*(?:%|x|µs|us|ms)?\s*(?:->|→)\s*~?" + _NUM + r"\s*(?:%|x|µs|us|ms)",
    r"\d+\.\d+\s*(?:->|→)\s*~?" + _NUM + r"|" + _NUM + r"\s*(?:->|→)\s*~?\d+\.\d+",
    _RANGE + r"\s*%\s+(?:faster|slower|more|less|fewer|of (?:its|the|a)\b)",
    _RANGE + r"x\s+(?:faster|slower|the time|its compute)",
    r"\d+\.\d+x\s+(?:the|its|of)\b",                                     # a ratio to a decimal
]), flags=re.I)


def _comments(path):
    """The comment text of a C header (/* */ and //) or of a Python / Cython file (# comments
    and triple-quoted strings: the docstrings), as (line number, text) pairs."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    c_comment, py_comment = r"/\*.*?\*/|//[^\n]*", r'""".*?"""|\'\'\'.*?\'\'\'|#[^\n]*'
    pattern = c_comment if path.endswith(".h") else py_comment
    for m in re.finditer(pattern, text, flags=re.S):
        yield text.count("\n", 0, m.start()) + 1, m.group(0)


def _commented_sources():
    files = sorted(glob.glob(os.path.join(ROOT, "include", "megafuse", "*.h")))
    for ext in ("py", "pyi", "pyx", "pxi", "pxd"):
        files += sorted(glob.glob(os.path.join(ROOT, "megafuse", "**", "*." + ext),
                                  recursive=True))
    return files


@pytest.mark.parametrize("text", [
    "Q4_0 8.9 -> 17.2, Q4_1 6.9 -> 15.1", "from 184 to 201 tok/s", "17.4, 13.4 GB/s",
    "tg64 about 10 % faster", "~72 % -> ~90 % of a plain read's rate", "6.6 -> 3.6 ms a token",
    "decodes in 8.7-10 us on one thread", "Q4_0 0.74x the time", "2-3x slower",
    "~200 ms more", "took 338-367 µs a call", "1.12x the Q4_1 dot's compute ceiling",
    "Q4_1 79 -> 87.5", "pays ~10-20 % of its attention time", "~1.5 µs a crossing"])
def test_figure_pattern_finds_measurements(text):
    assert _FIGURE.search(text), text


@pytest.mark.parametrize("text", [
    "256 KiB of scales", "on 2 MiB pages", "a lead of 64 bytes", "4 x 8 int32 -> 32 int8",
    "word j / 8 % 2", "Ea % 256 == 0", "(0.5x .. 1.5x)", "avx512 -> avx2 -> generic",
    "spins 50 µs, then sleeps", "a chunk is 12-46 KB", "16 bytes of nibbles -> 32 bytes",
    "MAX_TEMPLATE_SECONDS", "6 tokens x 16 rows", "rows of 2048 weights"])
def test_figure_pattern_allows_sizes_and_constants(text):
    assert not _FIGURE.search(text), text


def test_comments_quote_no_measurements():
    """No header or Python / Cython source comment quotes a benchmark figure or its history
    (docs/contract.md keeps design notes; the figures: benchmarks/README.md)."""
    files = _commented_sources()
    if not any(path.endswith(".h") for path in files):
        pytest.skip(f"no source tree: no include/megafuse headers in {ROOT}")
    assert len(files) > 40
    found = []
    for path in files:
        for line, text in _comments(path):
            for m in _FIGURE.finditer(text):
                found.append(f"{os.path.relpath(path, ROOT)}:"
                             f"{line + text.count(chr(10), 0, m.start())}: {m.group(0)!r}")
    assert not found, "comments quoting measurements (move them to benchmarks/README.md):\n" + \
        "\n".join(found)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64")
                    or not sys.platform.startswith("linux"), reason="the amx level: Linux x86-64")
def test_linux_x86_builds_the_amx_level():
    """setup.py builds amx wherever the compiler knows the AMX instructions (GCC 11+, the
    manylinux images' and this project's compilers): a wheel carries it for the CPUs that have
    it, and megafuse.kernels.simd offers it only where the OS granted the tile data."""
    from megafuse._build_info import BUILD_CONFIG
    from megafuse.kernels import simd as _simd
    assert "amx" in BUILD_CONFIG["simd_levels"]
    assert "-mamx-int8" in BUILD_CONFIG["simd_flags"]["amx"]
    assert "amx" in _simd.built_levels()
