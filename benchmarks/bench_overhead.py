"""The fixed cost of a step: what a decode call costs when there is almost no work in it.

    pytest benchmarks/bench_overhead.py --benchmark-only

Rows (E 64, 2 / 1 heads of 32, ffn 128, 64 cache positions; seeded random weights):

- ``tiny-layer-decode-<FP32|Q8_0>``: ``DecoderLayer.decode`` of one token, as a user calls it
  (the Python checks, the one native call, the thread team's wake-up).
- ``tiny-model-step-L<1|32>-<FP32|Q8_0>``: ``Model.forward`` of one token through a model of
  1 or 32 such layers and a 256-token head.  The cost of one layer inside a whole-model step is
  (L32 - L1) / 31, printed at the end of the run.  The tiny layer and the L1 model read less
  than MF_STEP_SOLO_BYTES (256 KiB) a step and run on the calling thread alone; L32 (~4.7 MB
  in FP32, ~1.3 MB in Q8_0) runs on the thread team, so that figure includes waking it.

- ``tiny-header-<attention|mlp>-<FP32|Q8_0>``: one header function call of one token on the
  same tiny layer, as a pytest-benchmark user times it: ``mega_fused_attention_decode`` (FP32)
  or ``mega_fused_attention_prefill_q8_0`` with tokens=1 (Q8_0), and ``mega_fused_mlp_prefill``
  with tokens=1: the argument checks, the GIL released once, the kernel's job on the shared
  thread team.

A round is CALLS_PER_ROUND back-to-back calls, at the next positions of a cache that starts
over (untimed ``reset()``) when full, as a generation loop makes them; the rows report the
median round / CALLS_PER_ROUND.  (One call a round would also time pytest-benchmark's own
bookkeeping between calls, during which the team's threads stop spinning and go to sleep.)
The weights are a few KiB: this is call, scheduling and synchronisation overhead, not memory
traffic.

The host's speed: on the shared development machine these microseconds are bimodal, per process
and sometimes within one (the tiny layer took 10 or 17 us), and a fixed pure-Python loop timed in
the same process moves with them (90 or 170 us): the virtual CPU's speed, not megafuse's code.
So each row also times that loop (``host_probe``) before each of its rounds (untimed, in the
rounds' setup), and the summary gives the row in units of the loop's median as well as in
microseconds.
"""
import time


import numpy as np
import pytest

import megafuse as mf
from megafuse.kernels.dtype import CKDataType
from megafuse.llm.model import Model, ModelConfig

from _config import THREADS
from _timing import measure

E, H, G, D, I, V, C = 64, 2, 1, 32, 128, 256, 64
FORMATS = ("FP32", "Q8_0")
LAYER_COUNTS = (1, 32)
CALLS_PER_ROUND = 16
PROBE_ITERATIONS = 2000
RESULTS = {}          # (kind, format, layers) -> median seconds a call
PROBES = {}           # (kind, format, layers) -> median host_probe() seconds over the row's rounds


def _probe_loop():
    s = 0
    for i in range(PROBE_ITERATIONS):
        s += i * i
    return s


def host_probe():
    """Seconds of a fixed pure-Python loop (PROBE_ITERATIONS multiply-adds): how fast the host
    runs this process now, whatever megafuse does."""
    t = time.perf_counter()
    _probe_loop()
    return time.perf_counter() - t


def _matrix(rng, rows, cols, fmt):
    w = rng.standard_normal((rows, cols), dtype=np.float32)                      # [rows, cols]
    w /= np.float32(np.sqrt(cols))
    return w if fmt == "FP32" else mf.quantize(w, CKDataType[fmt])


def _layer_spec(rng, fmt):
    dims = {"wq": (H * D, E), "wk": (G * D, E), "wv": (G * D, E), "wo": (E, H * D),
            "w1": (2 * I, E), "w2": (E, I)}
    spec = {name: _matrix(rng, r, c, fmt) for name, (r, c) in dims.items()}
    for name in dims:
        spec[name + "_dt"] = int(CKDataType[fmt])
    spec["ln1_gamma"] = (1.0 + 0.1 * rng.standard_normal(E)).astype(np.float32)   # [E]
    spec["ln2_gamma"] = (1.0 + 0.1 * rng.standard_normal(E)).astype(np.float32)   # [E]
    for name in ("bq", "bk", "bv", "bo", "b1", "b2"):
        spec[name] = None
    return spec


def tiny_model(fmt, n_layers):
    rng = np.random.default_rng(7)
    layers = [_layer_spec(rng, fmt) for _ in range(n_layers)]
    head = _matrix(rng, V, E, fmt)                                                # [V, E]
    cos, sin = mf.rope_tables(D, C, 10000.0)
    config = ModelConfig(architecture="llama", n_layers=n_layers, embed_dim=E, num_heads=H,
                         num_kv_heads=G, head_dim=D, intermediate_dim=I, vocab_size=V,
                         context_length=C, eps=1e-5, rope_theta=10000.0, rope_position_scale=1.0,
                         has_rope_freqs=False, tied_embedding=True, name="tiny")
    return Model(config=config, layers=layers, embedding=head, embedding_dt=CKDataType[fmt],
                 out_norm=np.ones(E, np.float32), head=head, head_dt=CKDataType[fmt],
                 rope_cos=cos, rope_sin=sin, cache_capacity=C, activations="int8")


def tiny_layer(fmt):
    rng = np.random.default_rng(7)
    spec = _layer_spec(rng, fmt)
    ws = {name: spec[name] for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    return mf.DecoderLayer(ln1_gamma=spec["ln1_gamma"], ln2_gamma=spec["ln2_gamma"], **ws,
                           dtype=fmt, num_heads=H, num_kv_heads=G, head_dim=D,
                           intermediate_dim=I, eps=1e-5, rope_theta=10000.0, cache_capacity=C,
                           max_tokens=1)


@pytest.fixture(autouse=True)
def _threads():
    before = mf.get_num_threads()
    mf.set_num_threads(THREADS)
    yield
    mf.set_num_threads(before)


def per_call(benchmark, runner, step, key):
    """Median seconds of one step(): CALLS_PER_ROUND back-to-back steps a round, the runner
    (a DecoderLayer or a Model) reset before a round its cache could not hold.  The host probe
    runs before every round; its median goes to PROBES[key]."""
    probes = []

    def setup():
        probes.append(host_probe())
        if runner.position + CALLS_PER_ROUND > C:
            runner.reset()

    def calls():
        for _ in range(CALLS_PER_ROUND):
            step()

    median, _ = measure(benchmark, calls, setup=setup)
    PROBES[key] = float(np.median(probes))
    return median / CALLS_PER_ROUND


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_layer_decode(benchmark, fmt):
    benchmark.name = f"tiny-layer-decode-{fmt}"
    layer = tiny_layer(fmt)
    x = np.random.default_rng(1).standard_normal(E, dtype=np.float32)            # [E]
    key = ("layer", fmt, 1)
    RESULTS[key] = per_call(benchmark, layer, lambda: layer.decode(x), key)


@pytest.mark.parametrize("n_layers", LAYER_COUNTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_model_step(benchmark, fmt, n_layers):
    benchmark.name = f"tiny-model-step-L{n_layers}-{fmt}"
    model = tiny_model(fmt, n_layers)
    token = np.array([3], np.int32)                                               # [1]
    key = ("model", fmt, n_layers)
    RESULTS[key] = per_call(benchmark, model, lambda: model.forward(token), key)


class _HeaderCalls:
    """One-token header calls on the tiny layer, at positions 0 .. C-1 in turn."""

    def __init__(self, fmt):
        rng = np.random.default_rng(7)
        spec = _layer_spec(rng, fmt)
        self.fmt, self.spec = fmt, spec
        self.x = rng.standard_normal(E, dtype=np.float32)                          # [E]
        self.out = np.empty(E, np.float32)                                          # [E]
        self.k_cache = np.zeros((G, C, D), np.float32)                              # [G, C, D]
        self.v_cache = np.zeros((G, C, D), np.float32)
        self.cos, self.sin = mf.rope_tables(D, C, 10000.0)                          # [C, D/2]
        self.att_scratch = np.zeros(mf.mega_fused_attention_prefill_q8_0_scratch_size(1, E, H, D),
                                    np.uint8)
        self.mlp_scratch = np.zeros(mf.mega_fused_mlp_prefill_scratch_size(1, E, I), np.uint8)
        self.position = 0

    def reset(self):
        self.position = 0

    def attention(self):
        s, p = self.spec, self.position
        if self.fmt == "FP32":
            mf.mega_fused_attention_decode(
                self.out, self.x, self.x, s["ln1_gamma"], s["wq"], None, s["wk"], None, s["wv"],
                None, s["wo"], None, self.k_cache, self.v_cache, self.cos, self.sin, p, E, E, H,
                G, D, D, C, 1e-5)
        else:
            mf.mega_fused_attention_prefill_q8_0(
                self.out, self.x, self.x, s["ln1_gamma"], s["wq"], None, s["wq_dt"], s["wk"],
                None, s["wk_dt"], s["wv"], None, s["wv_dt"], s["wo"], None, s["wo_dt"],
                self.k_cache, self.v_cache, self.cos, self.sin, p, 1, C, E, E, H, G, D, D, 1e-5,
                self.att_scratch)
        self.position += 1

    def mlp(self):
        s = self.spec
        mf.mega_fused_mlp_prefill(self.out, self.x, self.x, s["ln2_gamma"], s["w1"], None,
                                  s["w1_dt"], s["w2"], None, s["w2_dt"], 1, E, E, I, I, 1e-5,
                                  self.mlp_scratch)
        self.position += 1


@pytest.mark.parametrize("block", ("attention", "mlp"))
@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_header_call(benchmark, fmt, block):
    benchmark.name = f"tiny-header-{block}-{fmt}"
    calls = _HeaderCalls(fmt)
    key = ("header-" + block, fmt, 1)
    RESULTS[key] = per_call(benchmark, calls, getattr(calls, block), key)


def summary_lines():
    lines = []
    for fmt in FORMATS:
        layer = RESULTS.get(("layer", fmt, 1))
        one, many = RESULTS.get(("model", fmt, 1)), RESULTS.get(("model", fmt, 32))
        if layer is not None:
            probe = PROBES[("layer", fmt, 1)]
            lines.append(f"tiny layer decode {fmt}: {layer * 1e6:.1f} us a call "
                         f"({layer / probe:.3f} host probes; host probe {probe * 1e6:.0f} us)")
        for block in ("attention", "mlp"):
            call = RESULTS.get(("header-" + block, fmt, 1))
            if call is not None:
                probe = PROBES[("header-" + block, fmt, 1)]
                lines.append(f"tiny header {block} {fmt}: {call * 1e6:.1f} us a call "
                             f"({call / probe:.3f} host probes; host probe {probe * 1e6:.0f} us)")
        if one is not None and many is not None:
            lines.append(f"model step {fmt}: L1 {one * 1e6:.1f} us, L32 {many * 1e6:.1f} us, "
                         f"{(many - one) / 31 * 1e6:.2f} us a layer (host probe "
                         f"{PROBES[('model', fmt, 1)] * 1e6:.0f} / "
                         f"{PROBES[('model', fmt, 32)] * 1e6:.0f} us)")
    return lines


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    lines = summary_lines()
    if lines:
        print("\n" + "\n".join(["fixed cost (bench_overhead.py)"] + lines))
