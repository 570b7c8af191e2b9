"""The type stubs (megafuse/__init__.pyi, megafuse/py.typed): `mypy --strict` accepts a typed
client of the whole public API (tests/project/typing_client.py) and rejects misuse; the client also
runs, so the stubs describe what the module really does."""
import ast
import os
import subprocess
import sys

import pytest

import megafuse
from helpers import hang_timeout

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(os.path.dirname(megafuse.__file__)))
CLIENT = os.path.join(HERE, "typing_client.py")

MISUSE = '''\
import numpy as np
import megafuse

megafuse.rope_tables("64", 16)
threads: str = megafuse.get_num_threads()
megafuse.mega_fuse_get_optimal_tiles(64, 2)
layer = megafuse.DecoderLayer.from_arrays(num_heads=2)
megafuse.no_such_function()
'''


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def test_stub_files_ship_with_the_package():
    here = os.path.dirname(megafuse.__file__)
    assert os.path.isfile(os.path.join(here, "__init__.pyi"))
    assert os.path.isfile(os.path.join(here, "py.typed"))


def test_stubs_cover_the_public_api():
    with open(os.path.join(os.path.dirname(megafuse.__file__), "__init__.pyi")) as f:
        stub = f.read()
    missing = [name for name in megafuse.__all__
               if f"def {name}(" not in stub and f"{name}:" not in stub
               and f"as {name}" not in stub]
    assert not missing, f"names in megafuse.__all__ without a stub: {missing}"
    stub_all = [ast.literal_eval(node.value) for node in ast.parse(stub).body
                if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["__all__"]]
    assert stub_all == [megafuse.__all__], "the stub's __all__ is not megafuse.__all__"


def test_typing_client_runs():
    done = subprocess.run([sys.executable, CLIENT], capture_output=True, text=True,
                          env=_env(), timeout=hang_timeout(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("ok ")


def test_mypy_strict_accepts_the_client_and_rejects_misuse(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    bad = tmp_path / "misuse.py"
    bad.write_text(MISUSE)
    env = _env()
    if os.path.isfile(os.path.join(ROOT, "pyproject.toml")):
        env["MYPYPATH"] = ROOT        # a source tree (editable install): mypy reads it directly
        # and checks its modules too, as `mypy` in the tree does: found on PYTHONPATH they would
        # count as installed, their errors silenced
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in env["PYTHONPATH"].split(os.pathsep)
            if p and os.path.realpath(p) != os.path.realpath(ROOT))
    # (an installed wheel is found in site-packages through its py.typed)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-color-output", "--hide-error-context",
         "--cache-dir", str(tmp_path / "cache"), CLIENT, str(bad)],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=hang_timeout(300))
    lines = done.stdout.splitlines()
    client_errors = [ln for ln in lines if "typing_client.py" in ln or "megafuse" + os.sep in ln]
    assert not client_errors, "\n".join(client_errors)
    misuse = "\n".join(ln for ln in lines if "misuse.py" in ln)
    for line_no, code in ((4, "arg-type"), (5, "assignment"), (6, "call-arg"), (7, "call-arg"),
                          (8, "attr-defined")):
        assert f"misuse.py:{line_no}:" in misuse and f"[{code}]" in misuse, done.stdout
