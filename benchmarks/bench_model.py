"""The whole model, as llama-bench measures it, beside llama.cpp on the same GGUF file.

    pytest benchmarks/bench_model.py --benchmark-only [-k "tg64 and int8"]

- pp128: a prefill of 128 tokens from an empty cache (Model.forward of 128 ids; llama.cpp:
  llm.eval of the same count);
- tg64: 64 single-token steps from an empty cache;
- busy: tg64 again while a spinning process pinned to one core holds it (issue 13: a step must
  not collapse when another process holds a core);
- tg64@1024: 64 single-token steps after a prefill of 1024 tokens (untimed): decode in a long
  conversation, where attention reads 1024+ cached keys a layer (in megafuse, float32 K/V by
  default: 48 MB a token for SmolLM2; llama.cpp's default cache is F16, half of that).  The
  `megafuse-int8-f16kv` row runs megafuse with kv_dtype="float16", llama.cpp's cache type.

The model is SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 tied embedding: the default model,
megafuse.llm.fetch.default_model_path(), fetched once), or $MEGAFUSE_BENCH_MODEL.  megafuse runs
in both activation modes; llama.cpp (llama-cpp-python==0.3.36, which builds llama.cpp from
source with -march=native, OpenMP and CPU_REPACK) runs in its own process
(benchmarks/_llama_peer.py) with the interpreter $MEGAFUSE_BENCH_LLAMA_PYTHON (default: this
one), on the same thread count.  Its rows skip, with the reason, when llama_cpp cannot be
imported there.  Each row: median of the timed rounds (at least 5); the summary table gives
tokens/s and megafuse / llama.cpp in the same run.

The same file requantized by llama.cpp's own quantizer (llama_model_quantize, in the peer's
interpreter; cached beside the model) to Q4_K_M, Q6_K and Q8_0 -- the files users download most,
with llama.cpp's per-tensor choices and fallbacks -- gives pp128 and tg64 rows (both modes, and
llama.cpp): the whole model's K-quant and Q8_0 paths.  They skip without llama_cpp.

Llama-3.2-1B-shaped files (benchmarks/_llama1b.py: random weights, written once as F16 and
quantized by llama.cpp's quantizer when the peer is there, else by megafuse's) in Q4_K_M, Q8_0
and Q4_0 give pp128, pp512, tg64 and tg64@4096 rows (int8 mode, and llama.cpp) with the roofline
columns: the real-size model, where prefill is bound by arithmetic and decode by memory.  Their
tg64@4096 fills the cache once (untimed) and rewinds it to 4096 tokens before each round (both
sides: Model's position, llama.cpp's n_tokens), where a fill per round would take minutes.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import megafuse as mf

import _llama1b
import _report
import _timing
from _config import PAUSE, THREADS
from _timing import measure, wait_quiet
from bench_contention import Spinner

MODEL_ROWS = (("pp", 128, 0), ("tg", 64, 0), ("tg", 64, 1024))   # (kind, tokens, cached keys)
LLAMA1B_ROWS = (("pp", 128, 0), ("pp", 512, 0), ("tg", 64, 0), ("tg", 64, 4096))
LLAMA1B_IMPLS = ("megafuse-int8", "llama.cpp")
REQUANTIZED = ("Q4_K_M", "Q6_K", "Q8_0")    # llama.cpp file types the model is requantized to
REQUANT_ROWS = (("pp", 128, 0), ("tg", 64, 0))
PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_llama_peer.py")
DEPTH_MAX = max(depth for _, _, depth in MODEL_ROWS)
MIN_ROUNDS = 5
BUDGET = 6.0                     # seconds of timed calls per row


def model_path():
    path = os.environ.get("MEGAFUSE_BENCH_MODEL")
    if path:
        return path
    from megafuse.llm import fetch as models
    try:
        return models.default_model_path()
    except models.ModelFetchError as exc:
        pytest.skip(f"the default model could not be fetched: {exc}")


_LLAMA_PYTHON = []        # the interpreter once its llama_cpp import has been seen to work


def llama_python():
    """The interpreter that has llama_cpp, or a skip saying how to get one."""
    python = os.environ.get("MEGAFUSE_BENCH_LLAMA_PYTHON", sys.executable)
    if python not in _LLAMA_PYTHON:
        probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"llama.cpp peer: llama_cpp is not importable by {python} (pip install "
                        f"llama-cpp-python==0.3.36, or set MEGAFUSE_BENCH_LLAMA_PYTHON)")
        _LLAMA_PYTHON.append(python)
    return python


_REQUANTIZED = {}


def requantized_path(ftype):
    """The model file requantized by llama.cpp to file type ftype (REQUANTIZED), made once and
    kept beside the model (or in the temporary directory if that is read-only)."""
    if ftype not in _REQUANTIZED:
        src = model_path()
        folder = os.path.dirname(os.path.abspath(src))
        if not os.access(folder, os.W_OK):
            folder = tempfile.gettempdir()
        stem = os.path.splitext(os.path.basename(src))[0]
        dst = os.path.join(folder, f"{stem}.requant-{ftype}.gguf")
        if not os.path.exists(dst):
            done = subprocess.run([llama_python(), PEER_SCRIPT, "--quantize", src, dst, ftype,
                                   str(THREADS)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"llama.cpp could not requantize {src} to {ftype}: "
                                   f"{done.stderr[-2000:]}")
        _REQUANTIZED[ftype] = dst
    return _REQUANTIZED[ftype]


def row_file(ftype):
    """(path, table label) of a row's model file: the model itself (ftype None), labelled by the
    format its name gives (SmolLM2-135M-Instruct.Q4_1.gguf: Q4_1), or its requantization to
    ftype (labelled ftype*)."""
    if ftype is None:
        path = model_path()
        label = os.path.splitext(os.path.basename(path))[0].rsplit(".", 1)[-1]
        return path, label if re.fullmatch(r"(B?F|Q|IQ)[0-9A-Z_]+", label) else "file"
    if ftype.startswith("1B-"):
        try:
            python = llama_python()
        except pytest.skip.Exception:
            python = None
        return _llama1b.path(ftype[3:], python)[0], ftype
    return requantized_path(ftype), f"{ftype}*"


def capacity(path):
    """Cache positions of a row's model (and the peer's n_ctx): the deepest row's and a step."""
    depth = max(d for _, _, d in LLAMA1B_ROWS) if "llama1b-" in os.path.basename(path) \
        else DEPTH_MAX
    return depth + 128


_MODELS = {}


def megafuse_model(activations, path, kv_dtype="float32"):
    key = (activations, path, kv_dtype)
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = mf.Model.from_gguf(path, cache_capacity=capacity(path),
                                          activations=activations, kv_dtype=kv_dtype)
    return _MODELS[key]


class LlamaPeer:
    """llama.cpp in a process of its own, timing what it is told to (see _llama_peer.py)."""

    def __init__(self, path):
        python = llama_python()
        env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
        self.filled = 0                # tokens the last `fill` left in its cache
        self.proc = subprocess.Popen([python, PEER_SCRIPT, path, str(THREADS),
                                      str(capacity(path))],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        _timing.OWN_HELPERS.add(self.proc.pid)     # its CPU time is the row's, not "other"
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("llama.cpp peer: did not start")

    def run(self, kind, n, depth=0):
        command = f"{kind} {n} {depth}"
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:            # the process is gone: say how, not "could not convert ''"
            raise RuntimeError(f"llama.cpp peer: died running '{command}' ({self._death()})")
        if kind == "fill":
            self.filled = n
        elif not (kind == "tg" and depth):       # pp and tg from 0 empty the cache
            self.filled = 0
        return float(line)

    def _death(self):
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "no answer, still running"
        if code >= 0:
            return f"exit status {code}"
        how = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        hint = ""
        if -code in (signal.SIGSEGV, signal.SIGILL):
            hint = ("; llama-cpp-python 0.3.36 built with -march=native on a CPU with AMX "
                    "segfaults in its AMX kernels (seen on Intel VMs here): build it without "
                    "them, benchmarks/README.md, 'Running'")
        return f"killed by {how}{hint}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        _timing.OWN_HELPERS.discard(self.proc.pid)


class LlamaPeers:
    """One peer process at a time: the one for the model file the current row runs."""

    def __init__(self):
        self.path = self.peer = None

    def get(self, path):
        if path != self.path:
            self.close()
            self.peer = LlamaPeer(path)
            self.path = path
        return self.peer

    def close(self):
        if self.peer is not None:
            self.peer.close()
        self.path = self.peer = None


@pytest.fixture(scope="module")
def llama_peers():
    peers = LlamaPeers()
    yield peers
    peers.close()


def _work(model, kind, n, depth, ids, rewind=False):
    """(the timed call, its untimed setup): pp: a prefill of n tokens; tg: n single-token steps
    after a prefill of `depth` tokens, from an empty cache (rewind: the prefill once, then the
    cache rewound to `depth` tokens before each round: the rows past a model's position are
    always written before they are read)."""
    def fn():
        if kind == "pp":
            model.forward(ids[:n])
        else:
            for j in range(depth, depth + n):
                model.forward(ids[j:j + 1])

    filled = []

    def setup():
        if rewind and filled:
            model.rewind(depth)
            return
        model.reset()
        if depth:
            model.forward(ids[:depth])
            filled.append(depth)
    return fn, setup


def _roof_work(model, kind, n, depth):
    """(operations, bytes read from DRAM) of a timed call: 2 x multiply-adds of every layer's
    projections a token and of the head a logit row (pp: the last token's; tg: every step's),
    plus attention's 4 x head_dim x heads a (query, key) pair and layer; bytes: every weight once
    a step of at most 128 tokens (the head once a call for pp, once a step for tg) plus, for tg,
    the float32 K/V rows each step's attention reads."""
    c = model.config
    E, H, G, D, F, L, V = (c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim,
                           c.intermediate_dim, c.n_layers, c.vocab_size)
    layer_macs = E * (H + 2 * G) * D + H * D * E + 3 * E * F
    head_bytes = model._embedding.nbytes if c.tied_embedding else model._head.nbytes
    layer_bytes = model.weight_bytes - head_bytes
    kv_row = 2 * G * D * 4 * L                # K and V of one position, every layer (float32)
    if kind == "pp":
        pairs = n * (n + 1) // 2
        ops = 2 * (n * L * layer_macs + V * E) + 4 * D * H * L * pairs
        nbytes = -(-n // 128) * layer_bytes + head_bytes
    else:
        keys = sum(p + 1 for p in range(depth, depth + n))
        ops = 2 * n * (L * layer_macs + V * E) + 4 * D * H * L * keys
        nbytes = n * (layer_bytes + head_bytes) + kv_row * keys
    return ops, nbytes


def _test_name(kind, n, depth):
    return f"{kind}{n}" + (f"@{depth}" if depth else "")


def _params():
    out = []
    for kind, n, depth in MODEL_ROWS:
        for mode in ("quiet", "busy") if kind == "tg" and not depth else ("quiet",):
            impls = ("megafuse-int8", "megafuse-float", "llama.cpp")
            if depth:                         # + megafuse with llama.cpp's F16 cache type
                impls = impls[:2] + ("megafuse-int8-f16kv",) + impls[2:]
            for impl in impls:
                out.append(pytest.param(None, kind, n, depth, mode, impl,
                                        id=f"smollm2-model-{_test_name(kind, n, depth)}-{mode}-"
                                           f"{impl}"))
    for ftype in REQUANTIZED:
        for kind, n, depth in REQUANT_ROWS:
            for impl in ("megafuse-int8", "megafuse-float", "llama.cpp"):
                out.append(pytest.param(ftype, kind, n, depth, "quiet", impl,
                                        id=f"smollm2-{ftype}-model-{_test_name(kind, n, depth)}-"
                                           f"quiet-{impl}"))
    for ftype in _llama1b.FTYPES:
        for kind, n, depth in LLAMA1B_ROWS:
            for impl in LLAMA1B_IMPLS:
                out.append(pytest.param(f"1B-{ftype}", kind, n, depth, "quiet", impl,
                                        id=f"llama1b-{ftype}-model-{_test_name(kind, n, depth)}-"
                                           f"quiet-{impl}"))
    return out


@pytest.mark.parametrize("ftype,kind,n,depth,mode,impl", _params())
def test_model(benchmark, request, ftype, kind, n, depth, mode, impl):
    mf.set_num_threads(THREADS)
    test = _test_name(kind, n, depth)
    path, label = row_file(ftype)
    benchmark.group = f"model {label} {test} {mode}"
    big = label.startswith("1B-")     # the Llama-1B-shaped files: roofline columns, one fill
    ids = np.random.default_rng(2).integers(0, 49152, capacity(path))
    setup = None
    ops = nbytes = None
    if big:
        request.getfixturevalue("machine")       # the roofline's peaks and DRAM bandwidth
    if impl == "llama.cpp":           # (one call: a command to the peer process and its reply;
        peer = request.getfixturevalue("llama_peers").get(path)   # the pipe adds ~0.1 ms)
        fn = lambda: peer.run(kind, n, depth)                # noqa: E731
        if depth:
            def setup():                  # (returns None: pytest-benchmark would take a value
                if big and peer.filled == depth:     # for the arguments of fn)
                    return                # `tg N D` rewinds to the fill itself
                peer.run("fill", depth)
    else:
        model = megafuse_model(impl.split("-")[1], path,
                               "float16" if impl.endswith("-f16kv") else "float32")
        fn, setup = _work(model, kind, n, depth, ids, rewind=big)
        if big:
            ops, nbytes = _roof_work(model, kind, n, depth)
    spin = None
    if mode == "busy":
        wait_quiet()
        spin = Spinner()
    try:
        med, other = measure(benchmark, fn, setup=setup, budget=BUDGET, min_rounds=MIN_ROUNDS,
                             quiet=mode == "quiet")
        competitor = spin.share() if spin else None
    finally:
        if spin:
            spin.stop()
    time.sleep(PAUSE)
    _report.record_model(benchmark, file=label, test=test, mode=mode, impl=impl, tokens=n,
                         median=med, other=other, competitor=competitor, ops=ops, nbytes=nbytes,
                         int8=impl != "megafuse-float")
