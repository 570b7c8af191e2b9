"""The linters, run by the test suite: ruff on the Python files and the stubs (pyproject.toml
[tool.ruff]), cython-lint on the Cython files ([tool.cython-lint]).  mypy runs in
tests/project/test_typing.py.  Both tools are pinned in the `test` extra, so a new release cannot
bring a new rule into CI unannounced.  They lint the source tree, so they skip where there is none
(the tests run against an installed wheel)."""
import glob
import importlib.util
import os
import subprocess
import sys
from importlib import metadata

import pytest

import megafuse
from helpers import hang_timeout, path_with_scripts_first

ROOT = os.path.dirname(os.path.abspath(os.path.dirname(megafuse.__file__)))
PACKAGE = os.path.join(ROOT, "megafuse")
CYTHON_PATTERNS = ("*.pyx", "*.pxi", "*.pxd")


@pytest.fixture(scope="module", autouse=True)
def source_tree():
    if not os.path.isfile(os.path.join(ROOT, "pyproject.toml")):
        pytest.skip(f"no source tree: no pyproject.toml next to the package in {ROOT} (an "
                    "installed wheel); the linters check the sources")


def _findings(done):
    return f"exit status {done.returncode}\n{done.stdout}{done.stderr}"


def test_ruff_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    # --no-cache: nothing written into the tree; the configuration is pyproject's (from cwd)
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=hang_timeout(120))
    assert done.returncode == 0, _findings(done)
    assert "All checks passed!" in done.stdout, _findings(done)


def _cython_lint_command():
    """`cython-lint` as `python -c`, through its console-script entry point (the package has no
    __main__), so that it runs under this interpreter whatever PATH says."""
    try:
        dist = metadata.distribution("cython-lint")
    except metadata.PackageNotFoundError:
        if sys.version_info < (3, 11):                  # the pinned release needs Python 3.11
            pytest.skip("the test extra's cython-lint needs Python 3.11 or later")
        pytest.skip("cython-lint is not installed (pip install -e '.[test]')")
    (entry,) = [ep for ep in dist.entry_points
                if ep.group == "console_scripts" and ep.name == "cython-lint"]
    module, _, func = entry.value.partition(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def test_cython_lint_is_clean():
    command = _cython_lint_command()
    files = sorted(f for pattern in CYTHON_PATTERNS
                   for f in glob.glob(os.path.join(PACKAGE, "**", pattern), recursive=True))
    assert any(f.endswith(".pyx") for f in files), f"no Cython sources under {PACKAGE}"
    # the configuration is pyproject's: cython-lint looks in the files' common folder and up.
    # It runs `pycodestyle` by name.
    env = dict(os.environ, PATH=path_with_scripts_first())
    done = subprocess.run(command + files, cwd=ROOT, capture_output=True, text=True,
                          timeout=hang_timeout(120), env=env)
    assert done.returncode == 0, _findings(done)
