"""A decode step timed on a quiet machine and while a busy competing process holds one core.

    pytest benchmarks/bench_contention.py --benchmark-only [-k Q4_1]

The step is one ``DecoderLayer.decode`` of SmolLM2-135M's layer shape (E 576, 9 / 3 heads,
D 64, ffn 1536; seeded random weights in the format of the case: Q4_1 is the real model file's).
Each call decodes the next layer of a ring of distinct layers whose weights total >= 96 MiB
(RING_MIN_BYTES: what a SmolLM2 step reads, its 30 layers' 66 MB and its 30 MB head), so they
come from where a real model's come from: DRAM on a 32 MiB L3, partly the L3 on a larger one;
each layer decodes positions 0..63 of its own cache, then starts over (reset() between rounds,
untimed).  Every layer decodes one untimed token first, so that nothing a first step does once
is timed.

"busy": a Python process spinning ``while True: pass``, pinned to the last CPU this process may
run on, started before the timing and killed after it.  The table shows both medians and
busy / quiet (run both ids: ``-k contention`` or ``-k Q4_1``).
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import megafuse as mf

import _report
from _buffers import packed_copies
from _cases import DT, SHAPE
from _config import DECODE_STEPS, SPIN_SETTLE, THREADS
from _timing import measure, process_ticks, ticks_per_second, wait_quiet

SHAPE_NAME = "smollm2-135m"
FORMATS = ("Q4_1", "FP32")
MODES = ("quiet", "busy")
LAYER_WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2")
RING_MIN_BYTES = 96 << 20         # the ring's weights: about what one SmolLM2 step reads


class LayerRing:
    """Distinct DecoderLayers of one shape and format (weights packed on 2 MiB pages,
    >= RING_MIN_BYTES in all); step() decodes one token in the next layer."""

    def __init__(self, shape, label):
        s = shape
        rng = np.random.default_rng(42)
        dims = {"wq": (s.H * s.D, s.E), "wk": (s.G * s.D, s.E), "wv": (s.G * s.D, s.E),
                "wo": (s.E, s.H * s.D), "w1": (2 * s.I, s.E), "w2": (s.E, s.I)}
        first = {}
        for name in LAYER_WEIGHTS:
            rows, cols = dims[name]
            w = rng.standard_normal((rows, cols), dtype=np.float32)     # [rows, cols]
            w *= np.float32(1.0 / np.sqrt(cols))
            first[name] = w if label == "FP32" else mf.quantize(w, DT[label])
        per_layer = sum(a.nbytes for a in first.values())
        gamma1 = (1.0 + 0.1 * rng.standard_normal(s.E)).astype(np.float32)   # [E]
        gamma2 = (1.0 + 0.1 * rng.standard_normal(s.E)).astype(np.float32)   # [E]
        self.layers = [
            mf.DecoderLayer(ln1_gamma=gamma1, ln2_gamma=gamma2, **ws, dtype=label,
                            num_heads=s.H, num_kv_heads=s.G, head_dim=s.D,
                            intermediate_dim=s.I, eps=s.eps, rope_theta=s.theta,
                            cache_capacity=DECODE_STEPS, max_tokens=1)
            for ws in packed_copies(first, max(2, -(-RING_MIN_BYTES // per_layer)))]
        self.weight_bytes = self.layers[0].weight_bytes
        self.x = rng.standard_normal(s.E, dtype=np.float32)                   # [E]
        self.next = 0
        # one untimed token in every layer: what a layer's first step does once is not the
        # steady decode step measured here (its KV cache's pages, which on a fresh virtual
        # machine cost milliseconds each, are mapped when the layer is built)
        for layer in self.layers:
            layer.decode(self.x)
            layer.reset()

    def step(self):
        layer = self.layers[self.next]
        self.next = (self.next + 1) % len(self.layers)
        layer.decode(self.x)

    def setup(self):
        """Before a round: the next layer starts over when its cache is full."""
        layer = self.layers[self.next]
        if layer.position >= DECODE_STEPS:
            layer.reset()


_RING = {}


def ring(label):
    """One ring alive at a time (the quiet and busy ids of a format share it)."""
    if label not in _RING:
        _RING.clear()
        _RING[label] = LayerRing(SHAPE[SHAPE_NAME], label)
    return _RING[label]


class Spinner:
    """A busy process holding one core: started, pinned, killed (by its own pid)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                     stdin=subprocess.DEVNULL)
        self.cpu = None
        if hasattr(os, "sched_setaffinity"):
            self.cpu = max(os.sched_getaffinity(0))
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        time.sleep(SPIN_SETTLE)
        self.t0, self.ticks0 = time.perf_counter(), self._ticks()

    def _ticks(self):
        try:
            return process_ticks(self.proc.pid)
        except (OSError, ValueError, IndexError):
            return None

    def share(self):
        """Share of one core the spinner used since it settled (None off Linux)."""
        now = self._ticks()
        if now is None or self.ticks0 is None:
            return None
        return (now - self.ticks0) / ticks_per_second() / (time.perf_counter() - self.t0)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def _params():
    return [pytest.param(label, mode, id=f"{SHAPE_NAME}-decode-step-{label}-{mode}")
            for label in FORMATS for mode in MODES]


@pytest.mark.parametrize("label,mode", _params())
def test_contention(benchmark, label, mode):
    mf.set_num_threads(THREADS)
    r = ring(label)
    benchmark.group = f"contention {SHAPE_NAME} decode step {label}"
    competitor = None
    if mode == "quiet":
        med, other = measure(benchmark, r.step, setup=r.setup)
    else:
        wait_quiet()
        spin = Spinner()
        try:
            med, other = measure(benchmark, r.step, setup=r.setup, quiet=False)
            competitor = spin.share()
        finally:
            spin.stop()
    _report.record_contention(benchmark, shape=SHAPE[SHAPE_NAME], label=label, mode=mode,
                              median=med, other=other, competitor=competitor,
                              layers=len(r.layers), weight_bytes=r.weight_bytes)
