"""The project's housekeeping: one version (pyproject.toml's), the license pyproject names, a
changelog section for that version, the contract's sections that the code cites, and the build
configuration compiled into the package."""
import io
import os
import re
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
