"""Shared parts of the layer benchmarks (bench_attention.py, bench_mlp.py).

- the two model shapes and the weight formats each block of each shape can take;
- ``Case``: one benchmark case (block, shape, format, tokens) and its work: weight bytes, MACs,
  attention flops, KV bytes;
- builders of weights (distinct copies for decode, so that DRAM serves them), activations,
  KV caches and rope tables, one weight set alive at a time;
- the runners: megafuse's kernels and the peers (PyTorch fp32, ggml through ggml-python, the
  NumPy reference), each a zero-argument callable plus the array its result lands in;
- the machine's roofline (DRAM read bandwidth, fp32 and int8 peak) measured in the same run;
- ``RESULTS`` and the summary table conftest.py prints at the end.

Self-contained: nothing here imports from tests/.
"""
import ctypes
import dataclasses
import itertools
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np

import megafuse as mf

DT = mf.CKDataType

# ---- knobs (environment) ------------------------------------------------------------------------
THREADS = int(os.environ.get("MEGAFUSE_BENCH_THREADS", "2"))
# Seconds of timed calls aimed at per benchmark (the round count follows from one trial call).
BUDGET = float(os.environ.get("MEGAFUSE_BENCH_BUDGET", "1.0"))
MAX_ROUNDS = 400
MIN_ROUNDS = 3
# "auto" / "huge": megafuse.empty (2 MiB pages); "4k": plain NumPy (4 KiB pages).
PAGES = os.environ.get("MEGAFUSE_BENCH_PAGES", "auto")
PAUSE = 0.25                      # seconds between implementations (OpenBLAS / OpenMP spin-down)
# Before each benchmark, wait (up to 20 s) until other processes use at most this share of the
# machine's CPU; MAX_WAIT caps the waiting over the whole session.
QUIET = float(os.environ.get("MEGAFUSE_BENCH_QUIET", "0.10"))
MAX_WAIT = float(os.environ.get("MEGAFUSE_BENCH_MAX_WAIT", "120"))

DECODE_MIN_BYTES = 96 << 20       # decode weight copies cycled per call: > 3x the 32 MiB L3
CACHE_CAPACITY = 1024
DECODE_POS = 511                  # decode token position: attends over 512 keys
PREFILL_TOKENS = (128, 512)
MLP_TOKENS = (1, 128, 512)


# ---- shapes and formats -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    E: int          # embed
    H: int          # query heads
    G: int          # kv heads
    D: int          # head_dim
    I: int          # intermediate
    qkv_bias: bool
    theta: float
    eps: float


SHAPES = [
    Shape("qwen2-0.5b", 896, 14, 2, 64, 4864, True, 1e6, 1e-6),
    Shape("llama-3.2-1b", 2048, 32, 8, 64, 8192, False, 5e5, 1e-5),
]
LABELS = ["FP32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"]
# llama.cpp's fallback when a tensor's row length is not a multiple of 256 (llama-quant.cpp):
# Q4_K -> Q5_0, Q6_K -> Q8_0.  So the "Q4_K" MLP of Qwen2-0.5B is Q4_K_M's real layout there:
# gate/up (896 columns) Q5_0, down (4864 = 19 * 256 columns) Q4_K.
KQUANT_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def weight_cols(shape, name):
    return {"wq": shape.E, "wk": shape.E, "wv": shape.E, "wo": shape.H * shape.D,
            "w1": shape.E, "w2": shape.I}[name]


def weight_rows(shape, name):
    return {"wq": shape.H * shape.D, "wk": shape.G * shape.D, "wv": shape.G * shape.D,
            "wo": shape.E, "w1": 2 * shape.I, "w2": shape.E}[name]


WEIGHTS = {"attention": ("wq", "wk", "wv", "wo"), "mlp": ("w1", "w2"),
           "attn-core": ("wq", "wk", "wv", "wo")}


def block_formats(block, shape, label):
    """{weight name: CKDataType name} for the case, or None when no weight of the block can
    take the format (a K-quant on a block whose every row is 896 long)."""
    names = WEIGHTS[block]
    if label not in KQUANT_FALLBACK:
        return {n: label for n in names}
    fmts = {n: (label if weight_cols(shape, n) % 256 == 0 else KQUANT_FALLBACK[label])
            for n in names}
    if label not in fmts.values():
        return None
    if block != "mlp" and len(set(fmts.values())) > 1:
        return None        # attention: all four projections share the row length E or H*D
    return fmts


def format_note(block, shape, label):
    """'Q4_K*' style label for a mixed layout, with what the star means."""
    fmts = block_formats(block, shape, label)
    if fmts is None or len(set(fmts.values())) == 1:
        return label, ""
    others = sorted({f"{n} {f}" for n, f in fmts.items() if f != label})
    return label + "*", ", ".join(others)


# ---- one case and its work ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    block: str          # "attention", "mlp", or "attn-core" (decode attention over 512 keys)
    shape: Shape
    label: str          # weight format label (LABELS)
    T: int              # tokens

    @property
    def decode(self):
        return self.T == 1

    @property
    def start_pos(self):
        return DECODE_POS if (self.decode and self.block != "mlp") else 0

    @property
    def formats(self):
        return block_formats(self.block, self.shape, self.label)

    @property
    def weights_key(self):
        return ("attention" if self.block == "attn-core" else self.block, self.shape, self.label)

    @property
    def id(self):
        return f"{self.shape.name}-{self.block}-T{self.T}-{self.label}"

    @property
    def group(self):
        return f"{self.block} {self.shape.name} T={self.T} {self.label}"

    def weight_bytes(self):
        """Bytes of one copy of the block's weights (what a decode call streams)."""
        if self.block == "attn-core":
            return 0
        s = self.shape
        return sum(weight_rows(s, n) * mf.ck_dtype_row_bytes(DT[f], weight_cols(s, n))
                   for n, f in self.formats.items())

    def macs(self):
        if self.block == "attn-core":
            return 0
        s = self.shape
        return self.T * sum(weight_rows(s, n) * weight_cols(s, n) for n in WEIGHTS[self.block])

    def attention_flops(self):
        """q.k and p.v: 4 * D flops per (head, query, key) pair, causal by absolute position."""
        if self.block == "mlp":
            return 0
        s, p0, T = self.shape, self.start_pos, self.T
        pairs = T * p0 + T * (T + 1) // 2
        return 4 * s.D * s.H * pairs

    def flops(self):
        return 2 * self.macs() + self.attention_flops()

    def kv_bytes(self):
        """KV cache bytes read by attention (float32): every row 0..last position, k and v."""
        if self.block == "mlp":
            return 0
        s = self.shape
        return 2 * s.G * (self.start_pos + self.T) * s.D * 4

    def activation_bytes(self):
        s = self.shape
        return 3 * self.T * s.E * 4          # input, residual, output

    def int8(self):
        """True when megafuse's int8 path applies (some weight in a block format)."""
        return self.block != "attn-core" and any(f != "FP32" for f in self.formats.values())


def cases(block):
    """Every case of a block (attention or mlp), in the order the weights are built."""
    out = []
    tokens = (1,) + PREFILL_TOKENS if block == "attention" else MLP_TOKENS
    for shape in SHAPES:
        for label in LABELS:
            if block_formats(block, shape, label) is None:
                continue
            for T in tokens:
                out.append(Case(block, shape, label, T))
            if block == "attention" and label == "FP32":
                out.append(Case("attn-core", shape, "FP32", 1))
    return out


# ---- memory -------------------------------------------------------------------------------------
def page_mode():
    if PAGES == "4k":
        return "4 KiB pages (numpy.empty)"
    granted = ""
    probe = empty((64 << 20,), np.uint8)      # what the OS grants: a 64 MiB probe, touched
    probe[:] = 1
    got = mf.memory.huge_page_bytes(probe)
    if got is not None:
        granted = f"; the OS backed {100 * got / probe.nbytes:.0f}% of a 64 MiB probe with them"
    return f"2 MiB pages (megafuse.empty{granted})"


def empty(shape, dtype):
    """Where every weight, cache and the bandwidth probe's array live (see PAGES)."""
    if PAGES == "4k":
        return np.empty(shape, dtype)
    return mf.empty(shape, dtype)


def placed(arr):
    """A copy of arr in memory from empty()."""
    out = empty(arr.shape, arr.dtype)
    out[...] = arr
    return out


def rel_err(got, want):
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got - want))) / scale


# ---- weights, activations, caches ---------------------------------------------------------------
class WeightSet:
    """The weights of one (block, shape, label): ``copies[i]`` maps a weight name to its encoded
    array; every copy holds the same bytes in distinct memory.  Small vectors are shared."""

    def __init__(self, block, shape, label):
        self.block, self.shape, self.label = block, shape, label
        self.formats = block_formats(block, shape, label)
        rng = np.random.default_rng(1234)
        s = shape
        first = {}
        for name in WEIGHTS[block]:
            rows, cols = weight_rows(s, name), weight_cols(s, name)
            w = rng.standard_normal((rows, cols), dtype=np.float32)
            w *= np.float32(1.0 / math.sqrt(cols))
            first[name] = placed(mf.quantize(w, DT[self.formats[name]]) if self.formats[name]
                                 != "FP32" else w)
            del w
        self.copies = [first]
        self.bytes_per_copy = sum(a.nbytes for a in first.values())
        f32 = lambda *n: rng.standard_normal(n, dtype=np.float32)  # noqa: E731
        self.gamma = (1.0 + 0.1 * f32(s.E)).astype(np.float32)
        if block == "attention" and s.qkv_bias:
            self.bq = 0.1 * f32(s.H * s.D)
            self.bk = 0.1 * f32(s.G * s.D)
            self.bv = 0.1 * f32(s.G * s.D)
        else:
            self.bq = self.bk = self.bv = None
        self.bo = None                      # neither model has an o_proj or MLP bias
        self.b1 = self.b2 = None

    def decode_copies(self):
        """Enough distinct copies (>= 2, >= 96 MiB in all) that no call finds its weights in the
        L3 cache: each call takes the next copy."""
        n = max(2, -(-DECODE_MIN_BYTES // self.bytes_per_copy))
        while len(self.copies) < n:
            self.copies.append({k: placed(v) for k, v in self.copies[0].items()})
        return self.copies[:n]


_WEIGHTS = {}


def weight_set(case):
    """One weight set alive at a time (the cases are ordered so each is built once)."""
    key = case.weights_key
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        _WEIGHTS[key] = WeightSet(*key)
    return _WEIGHTS[key]


def weights_for(case):
    ws = weight_set(case)
    return ws, (ws.decode_copies() if case.decode else ws.copies[:1])


def rope_tables(shape, rows=CACHE_CAPACITY):
    inv = shape.theta ** (-np.arange(0, shape.D, 2, dtype=np.float64) / shape.D)
    ang = np.arange(rows, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@dataclasses.dataclass
class Activations:
    x: np.ndarray           # [T, E] input
    res: np.ndarray         # [T, E] residual
    cache_k: np.ndarray     # [G, C, D] pristine initial state (positions < start_pos random)
    cache_v: np.ndarray
    cos: np.ndarray         # [C, D/2]
    sin: np.ndarray


def activations(case):
    s, T = case.shape, case.T
    rng = np.random.default_rng(7 + T)
    x = rng.standard_normal((T, s.E), dtype=np.float32)
    res = rng.standard_normal((T, s.E), dtype=np.float32)
    ck = np.zeros((s.G, CACHE_CAPACITY, s.D), np.float32)
    cv = np.zeros_like(ck)
    p0 = case.start_pos
    if case.block != "mlp" and p0:
        ck[:, :p0] = rng.standard_normal((s.G, p0, s.D), dtype=np.float32)
        cv[:, :p0] = rng.standard_normal((s.G, p0, s.D), dtype=np.float32)
    cos, sin = rope_tables(s)
    return Activations(x, res, ck, cv, cos, sin)


# ---- runners ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Runner:
    """fn(): one call of the block; out: where its result lands (compared across impls)."""
    fn: object
    out: np.ndarray
    flops: int              # the work this runner does (for GFLOP/s and work-normalised ratios)
    bytes: int              # weight bytes one call reads
    close: object = None
    note: str = ""
    other: float = None     # share of the CPU other processes used while this was timed


def _cycle(arg_tuples, call):
    """A zero-argument function calling call(*args) with the next argument tuple each time."""
    if len(arg_tuples) == 1:
        args = arg_tuples[0]
        return lambda: call(*args)
    it = itertools.cycle(arg_tuples)
    return lambda: call(*next(it))


def megafuse_variants(case):
    """The megafuse kernels a case runs: 'megafuse' (MLP: mega_fused_mlp_prefill; attn-core:
    mega_fused_attention_decode), 'megafuse decode' (mega_fused_attention_decode, FP32),
    'megafuse int8' (mega_fused_attention_prefill_q8_0), 'megafuse float'
    (mega_fused_attention_prefill: float activations, weights dequantized in registers)."""
    if case.block in ("mlp", "attn-core"):
        return ["megafuse"]
    if case.decode:
        return ["megafuse int8", "megafuse float"] if case.int8() else ["megafuse decode"]
    return ["megafuse int8"] if case.int8() else ["megafuse float"]


def megafuse_call(case, variant, pos=None):
    """(kernel, [argument tuple per weight copy], output array) of a megafuse variant."""
    s, T = case.shape, case.T
    ws, copies = weights_for(case)
    act = activations(case)
    out = np.full((T, s.E), np.nan, np.float32)
    x, res = act.x, act.res
    dts = {n: DT[f] for n, f in ws.formats.items()}
    if case.block == "mlp":
        scratch = np.zeros(mf.mega_fused_mlp_prefill_scratch_size(T, s.E, s.I), np.uint8)
        tuples = [(out, x, res, ws.gamma, c["w1"], ws.b1, dts["w1"], c["w2"], ws.b2, dts["w2"],
                   T, s.E, s.E, s.I, s.I, s.eps, scratch) for c in copies]
        return mf.mega_fused_mlp_prefill, tuples, out
    ck, cv = placed(act.cache_k), placed(act.cache_v)
    p0 = case.start_pos if pos is None else pos
    if variant in ("megafuse decode", "megafuse"):
        tuples = [(out, x, res, ws.gamma, c["wq"], ws.bq, c["wk"], ws.bk, c["wv"], ws.bv,
                   c["wo"], ws.bo, ck, cv, act.cos, act.sin, p0, s.E, s.E, s.H, s.G, s.D, s.D,
                   CACHE_CAPACITY, s.eps) for c in copies]
        return mf.mega_fused_attention_decode, tuples, out
    kernel, size = {
        "megafuse int8": (mf.mega_fused_attention_prefill_q8_0,
                          mf.mega_fused_attention_prefill_q8_0_scratch_size),
        "megafuse float": (mf.mega_fused_attention_prefill,
                           mf.mega_fused_attention_prefill_scratch_size)}[variant]
    scratch = np.zeros(size(T, s.E, s.H, s.D), np.uint8)
    tuples = [(out, x, res, ws.gamma, c["wq"], ws.bq, dts["wq"], c["wk"], ws.bk, dts["wk"],
               c["wv"], ws.bv, dts["wv"], c["wo"], ws.bo, dts["wo"], ck, cv, act.cos, act.sin,
               p0, T, CACHE_CAPACITY, s.E, s.E, s.H, s.G, s.D, s.D, s.eps, scratch)
              for c in copies]
    return kernel, tuples, out


def megafuse_runner(case, variant, pos=None, rotate=0):
    """rotate: start the cycle of weight copies that many copies later."""
    kernel, tuples, out = megafuse_call(case, variant, pos)
    tuples = tuples[rotate:] + tuples[:rotate]
    return Runner(_cycle(tuples, kernel), out, case.flops(), case.weight_bytes())


_MF_OUT = {}


def megafuse_output(case):
    """megafuse's result for the case (its first variant), to check a peer against: the one
    its benchmark left, or computed here when that benchmark did not run."""
    if case not in _MF_OUT:
        r = megafuse_runner(case, megafuse_variants(case)[0])
        r.fn()
        record_megafuse_output(case, r.out)
    return _MF_OUT[case]


def record_megafuse_output(case, out):
    if case not in _MF_OUT:
        _MF_OUT.clear()
        _MF_OUT[case] = np.array(out, copy=True)


# -- the NumPy reference ---------------------------------------------------------------------------
REFERENCE_CASES = {  # (block, shape name, T): float64 NumPy written to be read, so small cases
    ("attention", "qwen2-0.5b", 1), ("attention", "qwen2-0.5b", 128),
    ("mlp", "qwen2-0.5b", 1), ("mlp", "qwen2-0.5b", 128),
}


def reference_runner(case):
    """megafuse.reference's function of the same name, on the same arguments."""
    from megafuse import reference
    kernel, tuples, out = megafuse_call(case, megafuse_variants(case)[0])
    return Runner(_cycle(tuples, getattr(reference, kernel.__name__)), out, case.flops(),
                  case.weight_bytes())


# -- PyTorch --------------------------------------------------------------------------------------
def torch_runner(case):
    """The same block in PyTorch fp32 (FP32 weights, shared with megafuse without a copy)."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(THREADS)
    s, T = case.shape, case.T
    ws, copies = weights_for(case)
    act = activations(case)
    tt = torch.from_numpy
    x, res, gamma = tt(act.x), tt(act.res), tt(ws.gamma)
    eps = s.eps
    out = np.full((T, s.E), np.nan, np.float32)
    out_t = tt(out)

    def rmsnorm(v):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * gamma

    if case.block == "mlp":
        wts = [(tt(c["w1"]), tt(c["w2"])) for c in copies]
        it = itertools.cycle(wts)
        I = s.I

        @torch.inference_mode()
        def fn():
            w1, w2 = next(it)
            gu = F.linear(rmsnorm(x), w1)
            h = F.silu(gu[:, :I]) * gu[:, I:]
            torch.add(F.linear(h, w2), res, out=out_t)
        return Runner(fn, out, case.flops(), case.weight_bytes())

    H, G, D, p0 = s.H, s.G, s.D, case.start_pos
    if T > 1 and p0 != 0:
        raise ValueError("torch peer: is_causal=True assumes the prompt starts at position 0")
    ck = tt(placed(act.cache_k)).unsqueeze(0)     # [1, G, C, D], its own copy
    cv = tt(placed(act.cache_v)).unsqueeze(0)
    cos = tt(np.concatenate([act.cos, act.cos], axis=1))   # [C, D]
    sin = tt(np.concatenate([act.sin, act.sin], axis=1))
    cos_t, sin_t = cos[p0:p0 + T], sin[p0:p0 + T]           # [T, D]
    n = p0 + T

    def rope(v):                                  # v [heads, T, D], rotate-half
        v1, v2 = v[..., :D // 2], v[..., D // 2:]
        return v * cos_t + torch.cat((-v2, v1), dim=-1) * sin_t

    if case.block == "attn-core":                 # SDPA alone over the cache's n keys
        q = tt(np.random.default_rng(5).standard_normal((1, H, 1, D), dtype=np.float32))
        core = np.full(H * D, np.nan, np.float32)
        core_t = tt(core)

        @torch.inference_mode()
        def fn():
            o = F.scaled_dot_product_attention(q, ck[:, :, :n], cv[:, :, :n], enable_gqa=True)
            core_t.copy_(o.reshape(-1))
        return Runner(fn, core, case.flops(), 0, note="SDPA only")

    bq = tt(ws.bq) if ws.bq is not None else None
    bk = tt(ws.bk) if ws.bk is not None else None
    bv = tt(ws.bv) if ws.bv is not None else None
    wts = [tuple(tt(c[k]) for k in ("wq", "wk", "wv", "wo")) for c in copies]
    it = itertools.cycle(wts)

    @torch.inference_mode()
    def fn():
        wq, wk, wv, wo = next(it)
        h = rmsnorm(x)
        q = rope(F.linear(h, wq, bq).view(T, H, D).transpose(0, 1))
        k = rope(F.linear(h, wk, bk).view(T, G, D).transpose(0, 1))
        v = F.linear(h, wv, bv).view(T, G, D).transpose(0, 1)
        ck[0, :, p0:n] = k
        cv[0, :, p0:n] = v
        o = F.scaled_dot_product_attention(q.unsqueeze(0), ck[:, :, :n], cv[:, :, :n],
                                           is_causal=T > 1, enable_gqa=True)
        o = o[0].transpose(0, 1).reshape(T, H * D)
        torch.add(F.linear(o, wo), res, out=out_t)
    return Runner(fn, out, case.flops(), case.weight_bytes())


# -- ggml (ggml-python) ---------------------------------------------------------------------------
def _ggml():
    import ggml
    return ggml


GGML_TYPE_NAMES = {"FP32": "GGML_TYPE_F32", "Q8_0": "GGML_TYPE_Q8_0", "Q5_0": "GGML_TYPE_Q5_0",
                   "Q4_K": "GGML_TYPE_Q4_K", "Q6_K": "GGML_TYPE_Q6_K"}


class GGMLGraph:
    """A ggml graph planned once and computed many times with a work buffer we own
    (ggml_graph_compute_with_ctx would take a new work buffer from the context on every call).

    Leaf tensors (weights, activations, caches) live in a no_alloc context and point at NumPy
    memory (GGML's block layouts are megafuse's, byte for byte); op results live in a second
    context.  Weights given as several copies are switched to the next copy before each compute,
    by rewriting the tensors' data pointers."""

    def __init__(self, mem_bytes):
        g = self.g = _ggml()
        self.ctx_leaf = g.ggml_init(g.ggml_init_params(
            mem_size=256 * g.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
        self.ctx = g.ggml_init(g.ggml_init_params(
            mem_size=int(mem_bytes) + g.ggml_graph_overhead() + (8 << 20), mem_buffer=None,
            no_alloc=False))
        self.keep = []
        self.switch = []            # (tensor, [data pointers]) cycled per call
        self.gf = None

    def leaf(self, arr, type_name, *ne):
        """A tensor of ggml shape ne (ne[0] = the contiguous dimension) over arr's bytes."""
        g = self.g
        new = {1: g.ggml_new_tensor_1d, 2: g.ggml_new_tensor_2d, 3: g.ggml_new_tensor_3d}[len(ne)]
        t = new(self.ctx_leaf, getattr(g, type_name), *ne)
        if g.ggml_nbytes(t) != arr.nbytes:
            raise ValueError(f"ggml tensor {ne} of {type_name}: {g.ggml_nbytes(t)} bytes, "
                             f"array {arr.nbytes}")
        assert arr.flags.c_contiguous
        t.contents.data = arr.ctypes.data
        self.keep.append(arr)
        return t

    def weight(self, arrays, label, rows, cols):
        """A [rows, cols] weight in format label; arrays: one per copy (cycled per call)."""
        t = self.leaf(arrays[0], GGML_TYPE_NAMES[label], cols, rows)
        if len(arrays) > 1:
            self.keep.extend(arrays)
            self.switch.append((t, [a.ctypes.data for a in arrays]))
        return t

    def expand(self, t):
        if self.gf is None:
            self.gf = self.g.ggml_new_graph(self.ctx)
        self.g.ggml_build_forward_expand(self.gf, t)

    def finish(self, out):
        """Plan the graph ending at out; returns the function computing it."""
        g = self.g
        self.expand(out)
        self.plan = g.ggml_graph_plan(self.gf, THREADS, None)
        self.work = np.zeros(max(int(self.plan.work_size), 64), np.uint8)
        self.plan.work_data = self.work.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        self.plan_ref = ctypes.byref(self.plan)
        self.out = out
        n = max([len(p) for _, p in self.switch], default=1)
        compute = g.ggml_graph_compute
        gf, plan_ref = self.gf, self.plan_ref
        if not self.switch:
            def fn():
                if compute(gf, plan_ref) != 0:
                    raise RuntimeError("ggml_graph_compute failed")
        else:
            contents = [(t.contents, ptrs) for t, ptrs in self.switch]
            step = itertools.cycle(range(n))

            def fn():
                i = next(step)
                for c, ptrs in contents:
                    c.data = ptrs[i]
                if compute(gf, plan_ref) != 0:
                    raise RuntimeError("ggml_graph_compute failed")
        return fn

    def result(self, shape):
        """A NumPy view of the output tensor (valid until close())."""
        g = self.g
        n = int(np.prod(shape))
        assert g.ggml_nbytes(self.out) == 4 * n
        buf = (ctypes.c_float * n).from_address(g.ggml_get_data(self.out))
        return np.ctypeslib.as_array(buf).reshape(shape)

    def close(self):
        if self.ctx is not None:
            self.g.ggml_free(self.ctx)
            self.g.ggml_free(self.ctx_leaf)
            self.ctx = self.ctx_leaf = None


def ggml_runner(case):
    """The same block as a ggml graph: rms_norm * gamma, mul_mat (+bias), rope_ext (NEOX =
    rotate-half), k/v copied into the F32 cache, flash_attn_ext, mul_mat, + residual; or
    rms_norm * gamma, mul_mat gate / up, silu * up, mul_mat down, + residual."""
    g = _ggml()
    s, T = case.shape, case.T
    ws, copies = weights_for(case)
    act = activations(case)
    E, H, G, D, I = s.E, s.H, s.G, s.D, s.I
    f4 = 4 * T
    gr = GGMLGraph(mem_bytes=f4 * (12 * E + 12 * (H + 2 * G) * D + 8 * I) + (1 << 20))
    ctx = gr.ctx
    fmts = ws.formats

    def finish(out_t, shape=(T, E), note=""):
        fn = gr.finish(out_t)
        return Runner(fn, gr.result(shape), case.flops(), case.weight_bytes(), close=gr.close,
                      note=note)

    if case.block == "attn-core":
        rng = np.random.default_rng(5)
        qa = rng.standard_normal((H, D), dtype=np.float32)
        n = case.start_pos + 1
        kc = gr.leaf(placed(act.cache_k), "GGML_TYPE_F32", D, CACHE_CAPACITY, G)
        vc = gr.leaf(placed(act.cache_v), "GGML_TYPE_F32", D, CACHE_CAPACITY, G)
        q = g.ggml_permute(ctx, gr.leaf(qa, "GGML_TYPE_F32", D, H, 1), 0, 2, 1, 3)
        kv = g.ggml_view_3d(ctx, kc, D, n, G, kc.contents.nb[1], kc.contents.nb[2], 0)
        vv = g.ggml_view_3d(ctx, vc, D, n, G, vc.contents.nb[1], vc.contents.nb[2], 0)
        fa = g.ggml_flash_attn_ext(ctx, q, kv, vv, None, 1.0 / math.sqrt(D), 0.0, 0.0)
        g.ggml_flash_attn_ext_set_prec(fa, g.GGML_PREC_F32)
        return finish(fa, (H * D,), "flash_attn_ext only")

    x = gr.leaf(act.x, "GGML_TYPE_F32", E, T)
    res = gr.leaf(act.res, "GGML_TYPE_F32", E, T)
    gamma = gr.leaf(ws.gamma, "GGML_TYPE_F32", E)
    h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, x, s.eps), gamma)

    def w(name, rows, cols, part=None):
        arrays = [c[name] if part is None else c[name][part] for c in copies]
        arrays = [np.ascontiguousarray(a) for a in arrays]
        return gr.weight(arrays, fmts[name], rows, cols)

    if case.block == "mlp":
        wg = w("w1", I, E, slice(0, I))
        wu = w("w1", I, E, slice(I, 2 * I))
        wd = w("w2", E, I)
        a = g.ggml_mul(ctx, g.ggml_silu(ctx, g.ggml_mul_mat(ctx, wg, h)),
                       g.ggml_mul_mat(ctx, wu, h))
        out = g.ggml_add(ctx, g.ggml_mul_mat(ctx, wd, a), res)
        return finish(out)

    p0, n = case.start_pos, case.start_pos + T
    q = g.ggml_mul_mat(ctx, w("wq", H * D, E), h)
    k = g.ggml_mul_mat(ctx, w("wk", G * D, E), h)
    v = g.ggml_mul_mat(ctx, w("wv", G * D, E), h)
    if ws.bq is not None:
        q = g.ggml_add(ctx, q, gr.leaf(ws.bq, "GGML_TYPE_F32", H * D))
        k = g.ggml_add(ctx, k, gr.leaf(ws.bk, "GGML_TYPE_F32", G * D))
        v = g.ggml_add(ctx, v, gr.leaf(ws.bv, "GGML_TYPE_F32", G * D))
    positions = np.arange(p0, n, dtype=np.int32)
    pos = gr.leaf(positions, "GGML_TYPE_I32", T)
    rope = lambda t: g.ggml_rope_ext(ctx, t, pos, None, D, g.GGML_ROPE_TYPE_NEOX, 0,  # noqa
                                     s.theta, 1.0, 0.0, 1.0, 0.0, 0.0)
    q = rope(g.ggml_reshape_3d(ctx, q, D, H, T))
    k = rope(g.ggml_reshape_3d(ctx, k, D, G, T))
    v = g.ggml_reshape_3d(ctx, v, D, G, T)
    kc = gr.leaf(placed(act.cache_k), "GGML_TYPE_F32", D, CACHE_CAPACITY, G)
    vc = gr.leaf(placed(act.cache_v), "GGML_TYPE_F32", D, CACHE_CAPACITY, G)
    nb1, nb2 = kc.contents.nb[1], kc.contents.nb[2]
    for src, cache in ((k, kc), (v, vc)):
        dst = g.ggml_view_3d(ctx, cache, D, T, G, nb1, nb2, p0 * nb1)
        gr.expand(g.ggml_cpy(ctx, g.ggml_permute(ctx, src, 0, 2, 1, 3), dst))
    kv = g.ggml_view_3d(ctx, kc, D, n, G, nb1, nb2, 0)
    vv = g.ggml_view_3d(ctx, vc, D, n, G, nb1, nb2, 0)
    mask = None
    if T > 1:
        pad = -(-T // g.GGML_KQ_MASK_PAD) * g.GGML_KQ_MASK_PAD
        m = np.full((pad, n), -np.inf, np.float16)
        for t in range(T):
            m[t, :p0 + t + 1] = 0
        mask = gr.leaf(m, "GGML_TYPE_F16", n, pad)
    fa = g.ggml_flash_attn_ext(ctx, g.ggml_permute(ctx, q, 0, 2, 1, 3), kv, vv, mask,
                               1.0 / math.sqrt(D), 0.0, 0.0)
    g.ggml_flash_attn_ext_set_prec(fa, g.GGML_PREC_F32)
    o = g.ggml_reshape_2d(ctx, fa, H * D, T)
    out = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w("wo", E, H * D), o), res)
    return finish(out)


# ---- the machine's roofline ---------------------------------------------------------------------
MACHINE = {}

_PROBE_C = r"""
#include <immintrin.h>
#include <stdint.h>
#if defined(__AVX512F__)
typedef float vf __attribute__((vector_size(64)));
#define VW 16
#else
typedef float vf __attribute__((vector_size(32)));
#define VW 8
#endif
int probe_width(void) { return VW; }
/* Sum n floats (n a multiple of 4 * VW) with 4 accumulators: a plain streaming read. */
float read_loop(const float *p, long n) {
    const vf *v = (const vf *)p;
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (long i = 0; i + 4 <= n / VW; i += 4) {
        s0 += v[i]; s1 += v[i + 1]; s2 += v[i + 2]; s3 += v[i + 3];
    }
    vf s = s0 + s1 + s2 + s3;
    float r = 0; for (int k = 0; k < VW; k++) r += s[k];
    return r;
}
/* 12 independent FMA chains (distinct starting values, so no two can be merged):
   FLOPs per iteration = 12 * VW * 2. */
float fma_loop(long n) {
    vf a[12], x, y;
    for (int i = 0; i < VW; i++) {
        x[i] = 0.999999f; y[i] = 1e-7f;
        for (int j = 0; j < 12; j++) a[j][i] = 0.01f * (j + 1);
    }
    vf a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7],
       a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];
    for (long i = 0; i < n; i++) {
        a0 = a0 * x + y; a1 = a1 * x + y; a2 = a2 * x + y; a3 = a3 * x + y;
        a4 = a4 * x + y; a5 = a5 * x + y; a6 = a6 * x + y; a7 = a7 * x + y;
        a8 = a8 * x + y; a9 = a9 * x + y; a10 = a10 * x + y; a11 = a11 * x + y;
    }
    vf s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    float r = 0; for (int i = 0; i < VW; i++) r += s[i];
    return r;
}
/* int8 multiply-accumulates the way GGML's dot products do them. */
#if defined(__AVX512VNNI__)
int int8_macs_per_iter(void) { return 8 * 64; }
int int8_loop(long n) {
    __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
            c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
            c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7);
    for (long i = 0; i < n; i++) {
        __asm__ volatile("" : "+v"(a));
        c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b);
        c2 = _mm512_dpbusd_epi32(c2, a, b); c3 = _mm512_dpbusd_epi32(c3, a, b);
        c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
        c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1),
        _mm512_add_epi32(c2, c3)), _mm512_add_epi32(_mm512_add_epi32(c4, c5),
        _mm512_add_epi32(c6, c7)));
    return _mm512_reduce_add_epi32(s);
}
#elif defined(__AVX2__)
/* maddubs (u8 x s8 -> pairs summed to s16) + madd with ones (-> s32) + add: 32 MACs a step;
   four chains, each on an input the compiler must reload every iteration. */
int int8_macs_per_iter(void) { return 4 * 32; }
int int8_loop(long n) {
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),
            a3 = _mm256_set1_epi8(4);
    const __m256i b = _mm256_set1_epi8(2), ones = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (long i = 0; i < n; i++) {
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3));
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(a0, b), ones));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(a1, b), ones));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_maddubs_epi16(a2, b), ones));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_maddubs_epi16(a3, b), ones));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
    return _mm256_extract_epi32(s, 0);
}
#else
int int8_macs_per_iter(void) { return 0; }
int int8_loop(long n) { return (int)n; }
#endif
"""

_PROBE_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}


def _parallel_best(fn, repeats=5):
    """Best wall time of running fn() on THREADS threads at once."""
    best = float("inf")
    for _ in range(repeats):
        ths = [threading.Thread(target=fn) for _ in range(THREADS)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return best


_PROBE = {}


def _probe():
    """The C probe (compiled once per session for megafuse's SIMD level), or a string saying
    why there is none."""
    if "so" in _PROBE:
        return _PROBE["so"]
    level = mf.simd_level()
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        _PROBE["so"] = f"no C compiler ({cc})"
        return _PROBE["so"]
    tmp = tempfile.mkdtemp(prefix="megafuse-probe-")
    try:
        src, lib = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(_PROBE_C)
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-ffp-contract=fast",
                               *_PROBE_FLAGS.get(level, []), src, "-o", lib],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            _PROBE["so"] = f"probe did not compile: {proc.stderr.strip()[:200]}"
            return _PROBE["so"]
        so = ctypes.CDLL(lib)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    so.fma_loop.argtypes = [ctypes.c_long]
    so.fma_loop.restype = ctypes.c_float
    so.int8_loop.argtypes = [ctypes.c_long]
    so.read_loop.argtypes = [ctypes.c_void_p, ctypes.c_long]
    so.read_loop.restype = ctypes.c_float
    _PROBE["so"] = so
    return so


def measure_dram_bandwidth(nbytes=1 << 30):
    """Read bandwidth: THREADS threads each reading their share of a 1 GiB array (memory from
    empty(), so the same pages as the weights), best of 5, by two readers, the better one
    counted: NumPy's int64 sum of the bits (its float32 sum is pairwise and compute-bound,
    ~12 GB/s a core here) and the C probe's 4-accumulator float loop (one ctypes call a thread,
    GIL released)."""
    a = empty((nbytes // 8,), np.int64)
    a[:] = 1
    parts = np.array_split(a, THREADS)
    lock = threading.Lock()
    idx = itertools.count()

    def part():
        with lock:
            return parts[next(idx) % THREADS]
    best = nbytes / _parallel_best(lambda: np.add.reduce(part()))
    so = _probe()
    if not isinstance(so, str):
        def c_read():
            p = part()
            so.read_loop(p.ctypes.data, p.nbytes // 4)
        best = max(best, nbytes / _parallel_best(c_read))
    return best


def measure_peaks():
    """(fp32 GFLOP/s, int8 GOP/s, how) on THREADS threads, from the C probe compiled for
    megafuse's SIMD level (12 independent FMA chains; GGML-style int8 multiply-adds: maddubs +
    madd on AVX2, dpbusd on AVX-512 VNNI).  (None, None, why) when no C compiler works."""
    so = _probe()
    if isinstance(so, str):
        return None, None, so
    width = so.probe_width()
    n = 20_000_000
    t = _parallel_best(lambda: so.fma_loop(n))
    fp32 = THREADS * n * 12 * width * 2 / t / 1e9
    int8 = None
    macs = so.int8_macs_per_iter()
    if macs:
        t = _parallel_best(lambda: so.int8_loop(n))
        int8 = THREADS * n * macs * 2 / t / 1e9
    return fp32, int8, f"C probe, {mf.simd_level()}, {width * 32}-bit vectors"


def _measure_machine():
    """Wait (up to 30 s) for a quiet machine, then: DRAM bandwidth, fp32 / int8 peaks."""
    quiet = wait_quiet(limit=30.0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    bw = measure_dram_bandwidth()
    fp32, int8, how = measure_peaks()
    return dict(dram_bw=bw, fp32_peak=fp32, int8_peak=int8, peak_how=how, load=load,
                other=quiet)


def machine():
    """Measure once per run (the session fixture `machine` calls this first)."""
    if not MACHINE:
        mf.set_num_threads(THREADS)
        MACHINE.update(simd=mf.simd_level(), threads=THREADS, pages=page_mode(),
                       start=_measure_machine())
    return MACHINE


def machine_end():
    """At the end of the session, measure again: the roofline takes the better figure of the
    two (other processes only ever lower them), and the pair shows how much the machine drifted
    while the benchmarks ran.  (extra_info's roofline_fraction used the start figures.)"""
    if MACHINE and "end" not in MACHINE:
        MACHINE["end"] = _measure_machine()


def best(key):
    """The better of the start and end measurements of key (None when neither has it)."""
    vals = [MACHINE[w][key] for w in ("start", "end") if w in MACHINE and MACHINE[w].get(key)]
    return max(vals) if vals else None


def roofline(case, flops, nbytes, int8):
    """(roofline time, 'mem' / 'cpu'): the bound is max(bytes / DRAM bandwidth, flops / peak),
    bytes = weights + KV cache + activations (one pass each)."""
    bw = best("dram_bw")
    t_mem = nbytes / bw if bw else 0.0
    peak = best("int8_peak" if int8 else "fp32_peak")
    t_cpu = flops / (peak * 1e9) if peak else 0.0
    return max(t_mem, t_cpu), ("mem" if t_mem >= t_cpu else "cpu")


# ---- timing and results -------------------------------------------------------------------------
RESULTS = []      # dicts: case, impl, median, rounds, flops, bytes, err, note


def _cpu_ticks():
    """(busy clock ticks of the whole machine, ticks of this process), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            mine = f.read().rsplit(")", 1)[1].split()
        # user nice system idle iowait irq softirq steal ...; utime, stime = fields 14, 15
        busy = sum(fields[:8]) - fields[3] - fields[4]
        return busy, int(mine[11]) + int(mine[12])
    except (OSError, ValueError, IndexError):
        return None


def _other_load(before, after, seconds):
    """Share of the machine's CPU time that other processes used meanwhile (0..1)."""
    if before is None or after is None or seconds <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, other / hz / (seconds * (os.cpu_count() or 1)))


WAITED = [0.0]     # seconds spent waiting for a quiet machine in this session


def wait_quiet(limit=20.0):
    """Sleep in PAUSE steps (at least one: the pause between implementations) until other
    processes used at most QUIET of the CPU during the last step, for at most `limit` seconds
    (and MAX_WAIT over the session).  Returns the last step's share (None off Linux)."""
    start = time.perf_counter()
    while True:
        before, t0 = _cpu_ticks(), time.perf_counter()
        time.sleep(PAUSE)
        share = _other_load(before, _cpu_ticks(), time.perf_counter() - t0)
        waited = time.perf_counter() - start
        if share is None or share <= QUIET or waited >= limit or \
                WAITED[0] + waited >= MAX_WAIT:
            WAITED[0] += waited - PAUSE
            return share


def measure(benchmark, runner, budget=BUDGET, max_rounds=MAX_ROUNDS, min_rounds=MIN_ROUNDS):
    """Time runner.fn with pytest-benchmark: one trial call sets the round count so the timed
    calls take about `budget` seconds; one call a round (KV-cache writers rewrite the same rows,
    so repeating a call is harmless).  Also notes how much CPU other processes took meanwhile
    (benchmark.extra_info['other_cpu_share']), after waiting a little for a quiet machine."""
    wait_quiet()
    t0 = time.perf_counter()
    runner.fn()
    trial = time.perf_counter() - t0
    rounds = int(min(max_rounds, max(min_rounds, budget / max(trial, 1e-6))))
    warmup = 2 if trial < 0.01 else (1 if trial < 0.2 else 0)
    before, t0 = _cpu_ticks(), time.perf_counter()
    benchmark.pedantic(runner.fn, rounds=rounds, iterations=1, warmup_rounds=warmup)
    other = _other_load(before, _cpu_ticks(), time.perf_counter() - t0)
    benchmark.extra_info["other_cpu_share"] = other
    runner.other = other
    return benchmark.stats.stats.median


def record(benchmark, case, impl, median, runner, err=None, int8=False):
    kvb = case.kv_bytes() if case.block != "mlp" else 0
    nbytes = runner.bytes + kvb + case.activation_bytes()
    bound, kind = roofline(case, runner.flops, nbytes, int8) if MACHINE else (0.0, "-")
    row = dict(case=case, impl=impl, median=median, flops=runner.flops,
               weight_bytes=runner.bytes, bytes=nbytes, err=err, note=runner.note, int8=int8,
               other=runner.other,
               roofline=bound / median if median and bound else None, bound=kind)
    RESULTS.append(row)
    info = benchmark.extra_info
    if case.decode and case.block != "attn-core":
        ws = weight_set(case)
        n = len(ws.decode_copies())
        info.update(weight_copies=n, weight_copies_MiB=n * ws.bytes_per_copy / 2**20)
    info.update(case=case.id, impl=impl, median_ms=median * 1e3,
                weight_GBps=runner.bytes / median / 1e9 if median and runner.bytes else None,
                GFLOPs=runner.flops / median / 1e9 if median else None,
                roofline_fraction=row["roofline"], bound=kind)
    if err is not None:
        info["max_rel_diff_vs_megafuse"] = err
    for mrow in RESULTS:
        if mrow["case"] == case and mrow["impl"].startswith("megafuse") and impl != mrow["impl"] \
                and not impl.startswith("megafuse"):
            info[f"speedup_of_{mrow['impl'].replace(' ', '_')}"] = speedup(mrow, row)
    return row


def speedup(mrow, prow):
    """megafuse's speed over a peer's, normalised by the work each does: (megafuse flops /
    time) / (peer flops / time); the time ratio when both do the same work."""
    if not (mrow["median"] and prow["median"] and mrow["flops"] and prow["flops"]):
        return None
    return (mrow["flops"] / mrow["median"]) / (prow["flops"] / prow["median"])


PEER_TOL = {"torch": 1e-3, "numpy reference": 1e-4, "ggml": 5e-2}


# ---- the table ----------------------------------------------------------------------------------
PEERS = ("torch", "ggml", "numpy reference")


def table_lines():
    """The summary table: one line per (case, implementation)."""
    if not RESULTS:
        return []
    m = MACHINE
    lines = []
    import platform
    vers = [f"megafuse {mf.__version__} (SIMD {mf.simd_level()}, {mf.get_num_threads()} threads)"]
    try:
        import torch
        vers.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        vers.append("torch: not installed")
    try:
        from importlib.metadata import version
        vers.append(f"ggml-python {version('ggml-python')}")
    except Exception:  # noqa: BLE001
        vers.append("ggml-python: not installed")
    lines.append("megafuse layer benchmarks: " + ", ".join(vers))
    lines.append(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
                 f"weights and caches on {m.get('pages', page_mode())}")
    if m:
        def fig(key, scale, unit):
            vals = [f"{m[w][key] / scale:.1f}" if m[w].get(key) else "?"
                    for w in ("start", "end") if w in m]
            return " / ".join(vals) + " " + unit
        lines.append(f"roofline ({THREADS} threads; start / end of the session, the better one "
                     f"used): DRAM read {fig('dram_bw', 1e9, 'GB/s')} (1 GiB, NumPy / C reader, "
                     f"best of 5); fp32 peak {fig('fp32_peak', 1, 'GFLOP/s')}, int8 peak "
                     f"{fig('int8_peak', 1, 'GOP/s')} ({m['start']['peak_how']})")
        loads = [f"{m[w]['load']:.1f}" for w in ("start", "end")
                 if w in m and m[w].get("load") is not None]
        if loads:
            lines.append(f"1-min load average {' / '.join(loads)} (start / end; the machine is "
                         f"shared: above ~0.5 other work competes for the {os.cpu_count()} "
                         f"cores and the timings are noisy: see the 'other' column)")
        if WAITED[0] > 0.5:
            lines.append(f"waited {WAITED[0]:.0f} s in all for other processes to quiet down "
                         f"(MEGAFUSE_BENCH_QUIET={QUIET}, MEGAFUSE_BENCH_MAX_WAIT={MAX_WAIT:.0f})")
        lines.append(f"decode (T=1) weights: each call takes the next of >= 2 distinct copies "
                     f"totalling >= {DECODE_MIN_BYTES >> 20} MiB (L3 cannot serve them)")
    lines.append("ms = median; GB/s = weight bytes / median; GFLOP/s = (2 x weight MACs + "
                 "attention flops) / median; roof = roofline time / median, roofline time = "
                 "max(mem: (weights + KV + activations) / best DRAM bw, cpu: flops / fp32 or "
                 "int8 peak); xPEER = megafuse speed / peer speed (>1: megafuse faster); "
                 "diff = peer's max |diff| / max |megafuse output|, ! above tolerance; "
                 "other = share of the machine's CPU time other processes used while the row "
                 "was timed (above ~10%: the row is disturbed, rerun it)")
    head = (f"{'block':<9} {'shape':<12} {'T':>3} {'weights':<7} {'impl':<27} {'ms':>9} "
            f"{'GB/s':>6} {'GFLOP/s':>7} {'roof':>8} {'xtorch':>6} {'xggml':>6} {'xref':>7} "
            f"{'diff':>7} {'other':>5}")
    lines.append(head)
    lines.append("-" * len(head))
    seen = []
    for r in RESULTS:
        if r["case"] not in seen:
            seen.append(r["case"])
    notes = {}
    for case in seen:
        rows = [r for r in RESULTS if r["case"] == case]
        order = megafuse_variants(case) + ["torch", "ggml", "numpy reference"]
        rows.sort(key=lambda r: order.index(r["impl"]) if r["impl"] in order else len(order))
        peers = {r["impl"]: r for r in rows if not r["impl"].startswith("megafuse")}
        label, note = format_note(case.block if case.block != "attn-core" else "attention",
                                  case.shape, case.label)
        if note:
            notes[label + " " + case.shape.name] = f"{label} on {case.shape.name} {case.block}:" \
                f" {note} (llama.cpp's fallback for rows not a multiple of 256)"
        for r in rows:
            med = r["median"]
            gbs = f"{r['weight_bytes'] / med / 1e9:6.3g}" if med and r["weight_bytes"] else \
                f"{'-':>6}"
            gfl = f"{r['flops'] / med / 1e9:7.3g}" if med and r["flops"] else f"{'-':>7}"
            bound, kind = roofline(case, r["flops"], r["bytes"], r["int8"])
            frac = bound / med if bound and med and med > 0 else None
            roof = f"{100 * frac:4.0f}%{kind:>3}" if frac else f"{'-':>8}"
            cells = []
            for p in PEERS:
                if r["impl"].startswith("megafuse") and p in peers:
                    sp = speedup(r, peers[p])
                    cells.append(f"{sp:5.2f}x" if sp else "-")
                else:
                    cells.append("")
            diff = "" if r["err"] is None else f"{r['err']:.0e}"
            if r["err"] is not None and r["err"] > PEER_TOL.get(r["impl"], 1e-2):
                diff += "!"
            impl = r["impl"] + (" " + "(" + r["note"] + ")" if r["note"] else "")
            other = f"{100 * r['other']:4.0f}%" if r.get("other") is not None else "-"
            lines.append(f"{case.block:<9} {case.shape.name:<12} {case.T:>3} {label:<7} "
                         f"{impl:<27} {med * 1e3:9.3f} {gbs} {gfl} {roof} {cells[0]:>6} "
                         f"{cells[1]:>6} {cells[2]:>7} {diff:>7} {other:>5}")
    for n in notes.values():
        lines.append("* " + n)
    return lines


# ---- the benchmark bodies (shared by bench_attention.py and bench_mlp.py) ------------------------
def peers(case):
    out = []
    if case.label == "FP32":
        out.append("torch")
    out.append("ggml")
    if (case.block, case.shape.name, case.T) in REFERENCE_CASES and case.label == "FP32":
        out.append("numpy reference")
    return out


def params(block):
    """pytest params (case, impl), grouped by weight set so each set is built once."""
    import pytest
    out = []
    for case in cases(block):
        impls = megafuse_variants(case) + (["torch", "ggml"] if case.block == "attn-core"
                                           else peers(case))
        for impl in impls:
            out.append(pytest.param(case, impl, id=f"{case.id}-{impl.replace(' ', '_')}"))
    return out


def _import_peer(impl):
    import pytest
    name = {"torch": "torch", "ggml": "ggml"}.get(impl)
    if name is None:
        return
    try:
        __import__(name)
    except ImportError:
        pytest.skip(f"{impl} peer: {name} is not installed "
                    f"(pip install -e '.[{'bench' if name == 'torch' else 'ggml'}]')")
    except Exception as e:  # noqa: BLE001 -- e.g. ggml-python without its shared library
        pytest.skip(f"{impl} peer: import {name} failed: {e!r}")


def run_case(benchmark, case, impl):
    """Benchmark one implementation of one case and record the row of the summary table."""
    benchmark.group = case.group
    if impl.startswith("megafuse"):
        if case.block == "attn-core":
            return _run_core(benchmark, case)
        r = megafuse_runner(case, impl)
        med = measure(benchmark, r)
        assert np.isfinite(r.out).all(), f"{impl}: non-finite output"
        if impl == megafuse_variants(case)[0]:
            record_megafuse_output(case, r.out)
        record(benchmark, case, impl, med, r, int8=impl != "megafuse float" and case.int8())
        return
    _import_peer(impl)
    build = {"torch": torch_runner, "ggml": ggml_runner, "numpy reference": reference_runner}
    r = build[impl](case)
    try:
        if impl == "numpy reference":
            med = measure(benchmark, r, budget=min(BUDGET, 2.0), max_rounds=20)
        else:
            med = measure(benchmark, r)
        err = None
        if case.block != "attn-core":
            err = rel_err(r.out, megafuse_output(case))
        record(benchmark, case, impl, med, r, err=err, int8=impl == "ggml" and case.int8())
    finally:
        if r.close is not None:
            r.close()


def _run_core(benchmark, case):
    """megafuse has no attention-only kernel: its attention over 512 keys is measured as the
    difference of decode calls at position 511 and position 0, interleaved call by call (each
    on a cold weight copy of its own), median of the differences."""
    a = megafuse_runner(case, "megafuse", pos=DECODE_POS)
    ncopies = len(weights_for(case)[1])
    b = megafuse_runner(case, "megafuse", pos=0, rotate=ncopies // 2)
    ta, tb = [], []
    clock = time.perf_counter

    def pair():
        t0 = clock()
        a.fn()
        t1 = clock()
        b.fn()
        ta.append(t1 - t0)
        tb.append(clock() - t1)
    pair_runner = Runner(pair, a.out, case.flops(), 0)
    measure(benchmark, pair_runner, budget=2 * BUDGET)
    ta, tb = np.array(ta), np.array(tb)
    med = float(np.median(ta - tb))
    r = Runner(pair, a.out, case.flops(), 0, note="decode 511 - 0", other=pair_runner.other)
    record(benchmark, case, "megafuse", med, r)
    benchmark.extra_info.update(
        timed="a pair of decode calls (pos 511, pos 0); median_ms is the median of the "
              "differences", pairs=len(ta), median_ms_pos511=float(np.median(ta)) * 1e3,
        median_ms_pos0=float(np.median(tb)) * 1e3)
