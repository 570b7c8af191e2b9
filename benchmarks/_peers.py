"""The peers: the same block run by PyTorch (FP32), ggml (every format, through ggml-python) and
megafuse's NumPy reference, each as a ``Runner`` on the same weight bytes and inputs.

A peer that is not installed skips its rows with the reason (``require``).
"""
import ctypes
import itertools
import math

import numpy as np

from _buffers import activations, placed, weights_for
from _cases import megafuse_variants
from _config import CACHE_CAPACITY, THREADS
from _runners import Runner, cycled, megafuse_call

# the module each peer imports, and the pyproject extra that installs it
PEER_MODULES = {"torch": ("torch", "bench"), "ggml": ("ggml", "ggml")}


def require(impl):
    """Skip the current benchmark when the peer's module is missing or fails to import."""
    import pytest
    if impl not in PEER_MODULES:
        return
    name, extra = PEER_MODULES[impl]
    try:
        __import__(name)
    except ImportError:
        pytest.skip(f"{impl} peer: {name} is not installed (pip install '.[{extra}]')")
    except Exception as e:  # noqa: BLE001 -- e.g. ggml-python without its shared library
        pytest.skip(f"{impl} peer: import {name} failed: {e!r}")


def runner(case, impl):
    return {"torch": torch_runner, "ggml": ggml_runner,
            "numpy reference": reference_runner}[impl](case)


# ---- the NumPy reference ------------------------------------------------------------------------
def reference_runner(case):
    """megafuse.reference's function of the same name, on the same arguments."""
    from megafuse import reference
    kernel, tuples, out = megafuse_call(case, megafuse_variants(case)[0])
    return Runner(cycled(tuples, getattr(reference, kernel.__name__)), out, case.flops(),
                  case.weight_bytes())


# ---- PyTorch ------------------------------------------------------------------------------------
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
    out = np.full((T, s.E), np.nan, np.float32)                          # [T, E]
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
            gu = F.linear(rmsnorm(x), w1)                                # [T, 2I]
            h = F.silu(gu[:, :I]) * gu[:, I:]
            torch.add(F.linear(h, w2), res, out=out_t)
        return Runner(fn, out, case.flops(), case.weight_bytes())

    H, G, D, p0 = s.H, s.G, s.D, case.start_pos
    if T > 1 and p0 != 0:
        raise ValueError("torch peer: is_causal=True assumes the prompt starts at position 0")
    ck = tt(placed(act.cache_k)).unsqueeze(0)                 # [1, G, C, D], its own copy
    cv = tt(placed(act.cache_v)).unsqueeze(0)
    cos = tt(np.concatenate([act.cos, act.cos], axis=1))      # [C, D]
    sin = tt(np.concatenate([act.sin, act.sin], axis=1))
    cos_t, sin_t = cos[p0:p0 + T], sin[p0:p0 + T]             # [T, D]
    n = p0 + T

    def rope(v):                                              # v [heads, T, D], rotate-half
        v1, v2 = v[..., :D // 2], v[..., D // 2:]
        return v * cos_t + torch.cat((-v2, v1), dim=-1) * sin_t

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


# ---- ggml (ggml-python) -------------------------------------------------------------------------
def _ggml():
    import ggml
    return ggml


def ggml_type_name(label):
    """The GGML_TYPE_* name of a megafuse format name (their block layouts are the same)."""
    return "GGML_TYPE_F32" if label == "FP32" else f"GGML_TYPE_{label}"


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
        t = self.leaf(arrays[0], ggml_type_name(label), cols, rows)
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
        self.out = out
        n = max([len(p) for _, p in self.switch], default=1)
        compute = g.ggml_graph_compute
        gf, plan_ref = self.gf, ctypes.byref(self.plan)
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
    """The same block as one ggml graph, its projections ggml_mul_mat on megafuse's weight bytes:
    rms_norm * gamma, mul_mat (+bias), rope_ext (NEOX = rotate-half), k/v copied into the F32
    cache, flash_attn_ext, mul_mat, + residual; or rms_norm * gamma, mul_mat gate / up,
    silu * up, mul_mat down, + residual."""
    g = _ggml()
    s, T = case.shape, case.T
    ws, copies = weights_for(case)
    act = activations(case)
    E, H, G, D, I = s.E, s.H, s.G, s.D, s.I
    f4 = 4 * T
    gr = GGMLGraph(mem_bytes=f4 * (12 * E + 12 * (H + 2 * G) * D + 8 * I) + (1 << 20))
    ctx = gr.ctx
    fmts = ws.formats

    def finish(out_t):
        fn = gr.finish(out_t)
        return Runner(fn, gr.result((T, E)), case.flops(), case.weight_bytes(), close=gr.close)

    x = gr.leaf(act.x, "GGML_TYPE_F32", E, T)
    res = gr.leaf(act.res, "GGML_TYPE_F32", E, T)
    gamma = gr.leaf(ws.gamma, "GGML_TYPE_F32", E)
    h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, x, s.eps), gamma)

    def w(name, rows, cols, part=None):
        arrays = [c[name] if part is None else c[name][part] for c in copies]
        arrays = [np.ascontiguousarray(a) for a in arrays]      # row slices: no copy
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
    positions = np.arange(p0, n, dtype=np.int32)                         # [T]
    pos = gr.leaf(positions, "GGML_TYPE_I32", T)

    def rope(t):
        return g.ggml_rope_ext(ctx, t, pos, None, D, g.GGML_ROPE_TYPE_NEOX, 0, s.theta, 1.0,
                               0.0, 1.0, 0.0, 0.0)
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
        m = np.full((pad, n), -np.inf, np.float16)                       # [pad, n]
        for t in range(T):
            m[t, :p0 + t + 1] = 0
        mask = gr.leaf(m, "GGML_TYPE_F16", n, pad)
    fa = g.ggml_flash_attn_ext(ctx, g.ggml_permute(ctx, q, 0, 2, 1, 3), kv, vv, mask,
                               1.0 / math.sqrt(D), 0.0, 0.0)
    g.ggml_flash_attn_ext_set_prec(fa, g.GGML_PREC_F32)
    o = g.ggml_reshape_2d(ctx, fa, H * D, T)
    out = g.ggml_add(ctx, g.ggml_mul_mat(ctx, w("wo", E, H * D), o), res)
    return finish(out)
