# The Python boundary of megafuse: one thin def per function of the C header
# (include/megafuse/mega_fused_attention.h), with the header's names and parameter order.
#
# Each def checks every argument (docs/contract.md §5) before anything is written, then releases
# the GIL once and calls a kernel of the SIMD level chosen at import through its KernelTable
# (kernels/kernel_table.pxd).  Kernels cannot fail; every failure is an exception raised here.
#
# This file holds the level loading and the defs; the rest of the boundary is in files of one
# role each, included below:
#   kernels/dtype_args.pxi     CKDataType arguments, storage dtypes, the ckernel_dtype.h helpers
#   kernels/checks.pxi    the checks every def shares (scalars, arrays, weights, scratch, ...)
#   kernels/threads.pxi   the thread count and the attention tiles
#   kernels/formats.pxi    quantize / dequantize and the format layer's test hooks
#   kernels/capi.pxi      the C API: c_<name> of megafuse/_kernels.pxd
#
# Dimension letters: E = embed_dim, Ea = aligned_embed_dim, D = head_dim, Da = aligned_head_dim,
# H = num_heads, G = num_kv_heads, T = tokens, C = cache_capacity, I / Ia = (aligned)
# intermediate_dim.

cimport numpy as cnp
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_New
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport SIZE_MAX
from libc.stdlib cimport malloc, free
from libc.math cimport NAN

import importlib
import os
import sys

import numpy as np

from megafuse.kernels import simd as _simd
from megafuse.kernels.kernel_table cimport (
    KernelTable, KERNEL_TABLE_VERSION, MF_ATT_MAX_KV_TILE, MF_MAX_Q_TILE, mf_boundary, mf_team,
    mf_team_slot, mf_team_slot_acquire, mf_team_slot_release,
    mega_fused_attention_prefill_fn, mega_fused_outproj_mlp_prefill_fn, mega_fused_mlp_prefill_fn)
from megafuse._ckernel_dtype cimport CKDataType
from megafuse.kernels cimport mf_scratch as scr

cnp.import_array()

include "kernels/dtype_args.pxi"
include "kernels/checks.pxi"
include "kernels/threads.pxi"


# --------------------------------------------------------------------------------------------
# The SIMD level in use
# --------------------------------------------------------------------------------------------

cdef const KernelTable *_K = NULL
_level_module = None


def _load_level(str level):
    """Point the boundary at the kernels of `level` (one of megafuse.kernels.simd.LEVELS)."""
    global _K, _level_module
    module = importlib.import_module(f"megafuse.kernels.levels.{level}")
    cdef const KernelTable *table = <const KernelTable *>PyCapsule_GetPointer(
        module.kernel_table(), b"megafuse.KernelTable")
    if table.version != KERNEL_TABLE_VERSION:
        raise ImportError(f"megafuse.kernels.levels.{level}: kernel table version {table.version}, "
                          f"expected {KERNEL_TABLE_VERSION} (a stale build: reinstall megafuse)")
    compiled = (<bytes>table.simd_level).decode()
    if compiled != level:       # the level's flags did not reach the compiler (mf_simd.h's ladder)
        raise ImportError(f"megafuse.kernels.levels.{level}: its kernels were compiled as the "
                          f"{compiled!r} level (a broken build: check setup.py's flags)")
    _K = table
    _level_module = module


# The generic kernels until megafuse.kernels.selftest.select_level() -- called by
# megafuse/__init__.py as soon as this module is complete -- has proven the best level against
# them and loads it.
_load_level("generic")


def simd_level():
    """The SIMD level whose kernels run: 'generic', 'avx2', 'avx512' or 'amx' (x86-64), 'neon',
    'neon_dotprod' or 'i8mm' (aarch64)."""
    return (<bytes>_K.simd_level).decode()


cdef extern from "megafuse/mf_cpu_x86.h":
    int mf_x86_amx_state() nogil


def _x86_amx_state():
    """Bits of what AMX needs (include/megafuse/mf_cpu_x86.h): 1 AMX-TILE, 2 AMX-INT8, 4 the OS
    saves the tile state and granted this process the tile data (asked for here: Linux
    arch_prctl ARCH_REQ_XCOMP_PERM).  0 off x86-64."""
    return mf_x86_amx_state()


# --------------------------------------------------------------------------------------------
# The thread team
# --------------------------------------------------------------------------------------------

# The team every kernel call of the process runs on: the header functions' (here and through the
# C API) and the whole-model step's (megafuse/llm/_runner.pyx, through _boundary_capsule), so that
# consecutive calls of any of them find the same threads awake (include/megafuse/mf_team.h).  A
# call takes it for its kernel and gives it back; a call that finds it taken (another Python
# thread's call, or a step) runs its job on threads of no team (mf_team_run_detached).
cdef mf_team_slot _TEAM


cdef inline mf_team *_team_take(int n_threads) noexcept nogil:
    """The shared team, with n_threads threads, or NULL (taken by another call)."""
    return mf_team_slot_acquire(&_TEAM, n_threads)


cdef inline void _team_give(mf_team *team) noexcept nogil:
    if team != NULL:
        mf_team_slot_release(&_TEAM)


def _team_threads():
    """Testing hook: threads of the shared team (0 before any call made it)."""
    return _TEAM.team.n_threads if _TEAM.team != NULL else 0


def _team_hold(bint hold):
    """Testing hook: take the shared team (hold=True; returns whether it was free) or give it
    back (False), as a call running on it in another thread would."""
    if hold:
        return mf_team_slot_acquire(&_TEAM, _num_threads) != NULL
    mf_team_slot_release(&_TEAM)
    return True


# --------------------------------------------------------------------------------------------
# Tiles
# --------------------------------------------------------------------------------------------

def mega_fuse_get_optimal_tiles(head_dim):
    """Tile sizes for this CPU: returns (q_tile, kv_tile).

    Derived from the L1d / L2 cache sizes the OS reports (see megafuse.show_config()); the
    attention kernels use exactly these tiles.  The C header writes them through two int
    pointers; here they are the return value (docs/contract.md §1).

    Kernel: none; the formula is megafuse/kernels/threads.pxi (_tiles_from_cache_sizes).
    """
    head_dim = _int_arg(head_dim, "head_dim")
    _positive(head_dim, "head_dim")
    cdef int q_tile = 0, kv_tile = 0
    _tiles(head_dim, &q_tile, &kv_tile)
    return q_tile, kv_tile


# --------------------------------------------------------------------------------------------
# Decode: one token through RMSNorm -> QKV -> RoPE -> cache -> attention -> out-proj + residual
# --------------------------------------------------------------------------------------------

cdef object _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                          kv_cache_k, kv_cache_v, rope_cos, rope_sin, int pos, int embed_dim,
                          int aligned_embed_dim, int num_heads, int num_kv_heads, int head_dim,
                          int aligned_head_dim, int cache_capacity, q_ws, kv_ws):
    """Every check of the decode entry points; returns nothing, raises on the first problem."""
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    _positive(cache_capacity, "cache_capacity")
    if pos < 0 or pos >= cache_capacity:
        raise ValueError(f"pos: expected a position in 0..cache_capacity-1 = {C - 1}, got {pos}")
    _array(output, "output", _F32, Ea, "[aligned_embed_dim]", True)
    _array(input, "input", _F32, Ea, "[aligned_embed_dim]")
    _optional(residual, "residual", _F32, Ea, "[aligned_embed_dim]")
    _array(ln1_gamma, "ln1_gamma", _F32, E, "[embed_dim]")
    q_rows, kv_rows = "[num_heads*aligned_head_dim]", "[num_kv_heads*aligned_head_dim]"
    cdef Py_ssize_t HDa = _count("bq", q_rows, H, Da), GDa = _count("bk", kv_rows, G, Da)
    shape = "[num_heads*aligned_head_dim, aligned_embed_dim]"
    _array(wq, "wq", _F32, _count("wq", shape, H, Da, Ea), shape)
    _optional(bq, "bq", _F32, HDa, q_rows)
    shape = "[num_kv_heads*aligned_head_dim, aligned_embed_dim]"
    _array(wk, "wk", _F32, _count("wk", shape, G, Da, Ea), shape)
    _optional(bk, "bk", _F32, GDa, kv_rows)
    _array(wv, "wv", _F32, _count("wv", shape, G, Da, Ea), shape)
    _optional(bv, "bv", _F32, GDa, kv_rows)
    shape = "[aligned_embed_dim, num_heads*aligned_head_dim]"
    _array(wo, "wo", _F32, _count("wo", shape, Ea, H, Da), shape)
    _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    shape = "[num_kv_heads, cache_capacity, aligned_head_dim]"
    cdef Py_ssize_t cache = _count("kv_cache_k", shape, G, C, Da)
    _array(kv_cache_k, "kv_cache_k", _F32, cache, shape, True)
    _array(kv_cache_v, "kv_cache_v", _F32, cache, shape, True)
    _rope_tables(rope_cos, rope_sin, D, pos)
    _no_overlap_flat(("output", "kv_cache_k", "kv_cache_v", "q_output_workspace", "kv_workspace",
                      "input", "residual", "ln1_gamma", "wq", "bq", "wk", "bk", "wv", "bv", "wo",
                      "bo", "rope_cos", "rope_sin"),
                     (output, kv_cache_k, kv_cache_v, q_ws, kv_ws, input, residual, ln1_gamma, wq,
                      bq, wk, bk, wv, bv, wo, bo, rope_cos, rope_sin), 5,
                     may_alias=("input", "residual"))


cdef object _workspace(object ws, str name, object nbytes, Py_ssize_t need, str shape):
    """A caller-owned float32 workspace of at least `need` floats, and its byte count `nbytes`
    (a checked size_t): at least `need` floats' bytes, at most the array's."""
    _array(ws, name, _F32, need, shape, True, True)
    cdef Py_ssize_t need_bytes = _mul(need, sizeof(float))
    if (need_bytes > 0 and PyLong_CheckExact(nbytes) and need_bytes <= nbytes
            and nbytes <= cnp.PyArray_NBYTES(<cnp.ndarray>ws)):
        return                                    # fast path: the messages are never built
    _positive(nbytes, f"{name}_bytes")
    need_bytes = _count(name, f"{shape} float32 (bytes)", need, sizeof(float))
    if nbytes < need_bytes:
        raise ValueError(f"{name}_bytes: expected at least {shape} = {need} floats = "
                         f"{need_bytes} bytes, got {nbytes}")
    if nbytes > cnp.PyArray_NBYTES(<cnp.ndarray>ws):
        raise ValueError(f"{name}_bytes: expected at most the {ws.nbytes} bytes of "
                         f"{name}, got {nbytes}")


cdef void _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                      kv_cache_k, kv_cache_v, rope_cos, rope_sin, int pos, int embed_dim,
                      int aligned_embed_dim, int num_heads, int num_kv_heads, int head_dim,
                      int aligned_head_dim, int cache_capacity, float eps,
                      float *p_qws, size_t q_output_workspace_bytes, float *p_kvws,
                      size_t kv_workspace_bytes):
    cdef int q_tile, kv_tile
    _tiles(head_dim, &q_tile, &kv_tile)
    cdef float *p_out = _wp(output)
    cdef const float *p_in = _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln1_gamma)
    cdef const float *p_wq = _fp(wq)
    cdef const float *p_bq = _fp(bq)
    cdef const float *p_wk = _fp(wk)
    cdef const float *p_bk = _fp(bk)
    cdef const float *p_wv = _fp(wv)
    cdef const float *p_bv = _fp(bv)
    cdef const float *p_wo = _fp(wo)
    cdef const float *p_bo = _fp(bo)
    cdef float *p_kc = _wp(kv_cache_k)
    cdef float *p_vc = _wp(kv_cache_v)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef int nt = _num_threads
    cdef mf_team *team
    with nogil:
        team = _team_take(nt)
        _K.mega_fused_attention_decode_workspace(
            p_out, p_in, p_res, p_g, p_wq, p_bq, p_wk, p_bk, p_wv, p_bv, p_wo, p_bo, p_kc, p_vc,
            p_cos, p_sin, pos, embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim,
            aligned_head_dim, cache_capacity, eps, p_qws, q_output_workspace_bytes, p_kvws,
            kv_workspace_bytes, kv_tile, team, nt)
        _team_give(team)


def mega_fused_attention_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv,
                                wo, bo, kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos,
                                embed_dim, aligned_embed_dim, num_heads,
                                num_kv_heads, head_dim, aligned_head_dim,
                                cache_capacity, float eps):
    """One token through the fused attention block (float32 weights).

    output[Ea] = attention(rope(rmsnorm(input) @ W.T + b)) @ wo.T + bo + residual, with the
    token's k, v written to row [g, pos] of the caches first and attention over positions
    0..pos.  Layouts (docs/contract.md §3): input, residual, output [Ea]; ln1_gamma [E];
    wq [H*Da, Ea]; wk, wv [G*Da, Ea]; bq [H*Da]; bk, bv [G*Da]; wo [Ea, H*Da]; bo [Ea];
    kv_cache_k, kv_cache_v [G, cache_capacity, Da]; rope_cos, rope_sin [rows > pos, D/2].
    residual, biases and the rope tables (both or neither) may be None.  output may be input or
    residual itself.  Query head h reads kv head h // (H // G).

    Kernel: kernels/levels/decode.pxi (mega_fused_attention_decode_workspace_kernel, on workspaces
    allocated here), include/megafuse/mf_attention.h.
    """
    pos = _int_arg(pos, "pos")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                  kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                  aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                  cache_capacity, None, None)
    # one allocation: q_ws [2, H*Da] (q, then the attention output), then kv_ws [2, G*Da]
    cdef size_t q_bytes = 2 * <size_t>num_heads * <size_t>aligned_head_dim * sizeof(float)
    cdef size_t kv_bytes = 2 * <size_t>num_kv_heads * <size_t>aligned_head_dim * sizeof(float)
    cdef float *ws = <float *>malloc(q_bytes + kv_bytes)
    if ws == NULL:
        raise MemoryError(f"mega_fused_attention_decode: {q_bytes + kv_bytes} bytes of workspace")
    try:
        _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                    kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                    aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                    cache_capacity, eps, ws, q_bytes, ws + q_bytes // sizeof(float), kv_bytes)
    finally:
        free(ws)


def mega_fused_attention_decode_workspace(output, input, residual, ln1_gamma, wq, bq, wk, bk,
                                          wv, bv, wo, bo, kv_cache_k, kv_cache_v, rope_cos,
                                          rope_sin, pos, embed_dim,
                                          aligned_embed_dim, num_heads,
                                          num_kv_heads, head_dim, aligned_head_dim,
                                          cache_capacity, float eps, q_output_workspace,
                                          q_output_workspace_bytes, kv_workspace,
                                          kv_workspace_bytes):
    """mega_fused_attention_decode without any allocation: every intermediate lives in the two
    caller-owned float32 workspaces.

    q_output_workspace: at least 2*H*Da floats (q, then the attention output);
    kv_workspace: at least 2*G*Da floats (k, then v).  The *_bytes arguments are the sizes the
    caller vouches for: each must cover what the kernel needs and fit inside its array.
    The result is bitwise that of mega_fused_attention_decode.

    Kernel: megafuse/kernels/levels/decode.pxi (mega_fused_attention_decode_workspace_kernel),
    include/megafuse/mf_attention.h.
    """
    pos = _int_arg(pos, "pos")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    q_output_workspace_bytes = _size_arg(q_output_workspace_bytes, "q_output_workspace_bytes")
    kv_workspace_bytes = _size_arg(kv_workspace_bytes, "kv_workspace_bytes")
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    cdef Py_ssize_t q_need = _count("q_output_workspace", "[2, num_heads*aligned_head_dim]", 2,
                                    num_heads, aligned_head_dim)
    cdef Py_ssize_t kv_need = _count("kv_workspace", "[2, num_kv_heads*aligned_head_dim]", 2,
                                     num_kv_heads, aligned_head_dim)
    _workspace(q_output_workspace, "q_output_workspace", q_output_workspace_bytes, q_need,
               "[2, num_heads*aligned_head_dim]")
    _workspace(kv_workspace, "kv_workspace", kv_workspace_bytes, kv_need,
               "[2, num_kv_heads*aligned_head_dim]")
    _check_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                  kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim,
                  aligned_embed_dim, num_heads, num_kv_heads, head_dim, aligned_head_dim,
                  cache_capacity, q_output_workspace, kv_workspace)
    _run_decode(output, input, residual, ln1_gamma, wq, bq, wk, bk, wv, bv, wo, bo,
                kv_cache_k, kv_cache_v, rope_cos, rope_sin, pos, embed_dim, aligned_embed_dim,
                num_heads, num_kv_heads, head_dim, aligned_head_dim, cache_capacity, eps,
                _wp(q_output_workspace), q_output_workspace_bytes, _wp(kv_workspace),
                kv_workspace_bytes)


# --------------------------------------------------------------------------------------------
# RMSNorm + QKV (+ RoPE), the unaligned layout of the header's "phase" functions
# --------------------------------------------------------------------------------------------

cdef void _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin,
                       int pos, int hidden, int num_heads, int num_kv_heads, int head_dim,
                       int max_seq, bint has_pos, float eps) except *:
    cdef Py_ssize_t E = hidden, H = num_heads, G = num_kv_heads, D = head_dim
    _positive(hidden, "hidden")
    _check_heads(num_heads, num_kv_heads)
    _positive(head_dim, "head_dim")
    if has_pos:
        _positive(max_seq, "max_seq")
        if pos < 0 or pos >= max_seq:
            raise ValueError(f"pos: expected a position in 0..max_seq-1 = {max_seq - 1}, "
                             f"got {pos}")
    _array(q_out, "q_out", _F32, _count("q_out", "[num_heads*head_dim]", H, D),
           "[num_heads*head_dim]", True)
    cdef Py_ssize_t GD = _count("k_out", "[num_kv_heads*head_dim]", G, D)
    _array(k_out, "k_out", _F32, GD, "[num_kv_heads*head_dim]", True)
    _array(v_out, "v_out", _F32, GD, "[num_kv_heads*head_dim]", True)
    _array(input, "input", _F32, E, "[hidden]")
    _array(gamma, "gamma", _F32, E, "[hidden]")
    shape = "[(num_heads+2*num_kv_heads)*head_dim, hidden]"
    _array(W_qkv, "W_qkv", _F32, _count("W_qkv", shape, H + 2 * G, D, E), shape)
    shape = "[(num_heads+2*num_kv_heads)*head_dim]"
    _optional(b_qkv, "b_qkv", _F32, _count("b_qkv", shape, H + 2 * G, D), shape)
    _rope_tables(rope_cos, rope_sin, D, pos, max_seq if has_pos else 0)
    _no_overlap_flat(("q_out", "k_out", "v_out", "input", "gamma", "W_qkv", "b_qkv", "rope_cos",
                      "rope_sin"),
                     (q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin), 3)
    cdef float *p_q = _wp(q_out)
    cdef float *p_k = _wp(k_out)
    cdef float *p_v = _wp(v_out)
    cdef const float *p_in = _fp(input)
    cdef const float *p_g = _fp(gamma)
    cdef const float *p_w = _fp(W_qkv)
    cdef const float *p_b = _fp(b_qkv)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef int nt = _num_threads
    cdef mf_team *team
    with nogil:
        team = _team_take(nt)
        if has_pos:
            _K.mega_fuse_rmsnorm_qkv_rope(p_q, p_k, p_v, p_in, p_g, p_w, p_b, p_cos, p_sin, pos,
                                          hidden, num_heads, num_kv_heads, head_dim, max_seq,
                                          eps, team, nt)
        else:
            _K.mega_fuse_rmsnorm_qkv(p_q, p_k, p_v, p_in, p_g, p_w, p_b, hidden, num_heads,
                                     num_kv_heads, head_dim, eps, team, nt)
        _team_give(team)


def mega_fuse_rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, hidden,
                          num_heads, num_kv_heads, head_dim, float eps):
    """q, k, v of one token: rmsnorm(input) @ W_qkv.T + b_qkv, split into q_out [H*D],
    k_out [G*D], v_out [G*D].  W_qkv is [(H+2G)*D, hidden] (q rows, then k, then v), b_qkv
    [(H+2G)*D] or None; no padding anywhere.

    Kernel: megafuse/kernels/levels/norm_qkv_rope.pxi (mega_fuse_rmsnorm_qkv_kernel),
    include/megafuse/mf_simd.h.
    """
    hidden = _int_arg(hidden, "hidden")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, None, None, 0, hidden,
                 num_heads, num_kv_heads, head_dim, 0, False, eps)


def mega_fuse_rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos,
                               rope_sin, pos, hidden, num_heads, num_kv_heads,
                               head_dim, max_seq, float eps):
    """mega_fuse_rmsnorm_qkv, then rotate-half RoPE of q and k at position pos
    (0 <= pos < max_seq; rope_cos / rope_sin [max_seq, D/2] -- at least max_seq rows, whatever
    pos is -- or both None: no rotation).

    Kernel: megafuse/kernels/levels/norm_qkv_rope.pxi (mega_fuse_rmsnorm_qkv_rope_kernel),
    include/megafuse/mf_simd.h.
    """
    pos = _int_arg(pos, "pos")
    hidden = _int_arg(hidden, "hidden")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    max_seq = _int_arg(max_seq, "max_seq")
    _rmsnorm_qkv(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin, pos,
                 hidden, num_heads, num_kv_heads, head_dim, max_seq, True, eps)


# --------------------------------------------------------------------------------------------
# Prefill: T tokens through the fused block, weights in any format
# --------------------------------------------------------------------------------------------

cdef Py_ssize_t _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim,
                                       bint int8_path) except -1:
    tokens = _int_arg(tokens, "tokens")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    for name, value in (("tokens", tokens), ("aligned_embed_dim", aligned_embed_dim),
                        ("num_heads", num_heads), ("aligned_head_dim", aligned_head_dim)):
        _positive(value, name)
    return _prefill_scratch_total(tokens, aligned_embed_dim, num_heads, aligned_head_dim,
                                  int8_path)


def mega_fused_attention_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                              aligned_head_dim):
    """Bytes of scratch mega_fused_attention_prefill uses (exactly: it touches no byte past).

    Layout (include/megafuse/mf_scratch.h), regions at 64-byte offsets:
      A [T, H*Da] float32      q;
      B [T, max(Ea, H*Da)] f32 the normalised input, then the attention output.
    k and v go straight into the KV cache; no [T, T] or [T, cache] array exists.
    Dimensions whose scratch would not fit 64-bit sizes are a ValueError naming them
    (never a wrapped-around number).

    Kernel: none; the layout is include/megafuse/mf_scratch.h (mf_prefill_scratch_layout).
    """
    return _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim, False)


def mega_fused_attention_prefill_q8_0_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                   aligned_head_dim):
    """Bytes of scratch mega_fused_attention_prefill_q8_0 uses (exactly).

    The regions A and B of the float prefill (A later holds the quantized attention rows), then
    C: the normalised input quantized to Q8_0 ([T] rows of Ea/32 blocks, when Ea % 32 == 0) and
    to Q8_K ([T] rows of Ea/256 blocks, when Ea % 256 == 0) -- the helper takes no dtypes, so
    room is made for both formats a mix of weights can need.
    Dimensions whose scratch would not fit 64-bit sizes are a ValueError naming them
    (never a wrapped-around number).

    Kernel: none; the layout is include/megafuse/mf_scratch.h (mf_prefill_scratch_layout).
    """
    return _prefill_scratch_bytes(tokens, aligned_embed_dim, num_heads, aligned_head_dim, True)


cdef object _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv,
                     wv_dt, wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin,
                     start_pos, tokens, cache_capacity, embed_dim, aligned_embed_dim,
                     num_heads, num_kv_heads, head_dim, aligned_head_dim, float eps, scratch,
                     bint int8_path):
    """Validate every argument of either prefill variant (docs/contract.md §5), then run it."""
    start_pos = _int_arg(start_pos, "start_pos")
    tokens = _int_arg(tokens, "tokens")
    cache_capacity = _int_arg(cache_capacity, "cache_capacity")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    num_heads = _int_arg(num_heads, "num_heads")
    num_kv_heads = _int_arg(num_kv_heads, "num_kv_heads")
    head_dim = _int_arg(head_dim, "head_dim")
    aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity, T = tokens
    _positive(tokens, "tokens")
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_heads(num_heads, num_kv_heads)
    _check_aligned(aligned_head_dim, head_dim, "aligned_head_dim", "head_dim")
    _positive(cache_capacity, "cache_capacity")
    if start_pos < 0:
        raise ValueError(f"start_pos: expected a position >= 0, got {start_pos}")
    if start_pos + T > C:
        raise ValueError(f"start_pos: expected start_pos + tokens <= cache_capacity = {C}, got "
                         f"{start_pos} + {T} = {start_pos + T}")
    rows = "[tokens, aligned_embed_dim]"
    cdef Py_ssize_t TEa = _count("output", rows, T, Ea)
    _array(output, "output", _F32, TEa, rows, True)
    _array(input, "input", _F32, TEa, rows)
    _optional(residual, "residual", _F32, TEa, rows)
    _array(ln1_gamma, "ln1_gamma", _F32, E, "[embed_dim]")
    q_rows, kv_rows = "[num_heads*aligned_head_dim]", "[num_kv_heads*aligned_head_dim]"
    cdef Py_ssize_t HDa = _count("wq", q_rows, H, Da), GDa = _count("wk", kv_rows, G, Da)
    cdef int q_dt = _weight(wq, "wq", wq_dt, HDa, Ea,
                            "[num_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int k_dt = _weight(wk, "wk", wk_dt, GDa, Ea,
                            "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int v_dt = _weight(wv, "wv", wv_dt, GDa, Ea,
                            "[num_kv_heads*aligned_head_dim, aligned_embed_dim]")
    cdef int o_dt = _weight(wo, "wo", wo_dt, Ea, HDa,
                            "[aligned_embed_dim, num_heads*aligned_head_dim]")
    _optional(bq, "bq", _F32, HDa, q_rows)
    _optional(bk, "bk", _F32, GDa, kv_rows)
    _optional(bv, "bv", _F32, GDa, kv_rows)
    _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    cache_shape = "[num_kv_heads, cache_capacity, aligned_head_dim]"
    cdef Py_ssize_t cache = _count("kv_cache_k", cache_shape, G, C, Da)
    _array(kv_cache_k, "kv_cache_k", _F32, cache, cache_shape, True)
    _array(kv_cache_v, "kv_cache_v", _F32, cache, cache_shape, True)
    _rope_tables(rope_cos, rope_sin, D, start_pos + T - 1)
    _scratch(scratch, _prefill_scratch_total(T, Ea, H, Da, int8_path))
    _no_overlap_flat(("output", "kv_cache_k", "kv_cache_v", "scratch", "input", "residual",
                      "ln1_gamma", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "rope_cos",
                      "rope_sin"),
                     (output, kv_cache_k, kv_cache_v, scratch, input, residual, ln1_gamma, wq, bq,
                      wk, bk, wv, bv, wo, bo, rope_cos, rope_sin), 4,
                     may_alias=("input", "residual"))

    cdef int q_tile, kv_tile
    _tiles(head_dim, &q_tile, &kv_tile)
    cdef float *p_out = _wp(output)
    cdef const float *p_in = _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln1_gamma)
    cdef const void *p_wq = cnp.PyArray_DATA(<cnp.ndarray>wq)
    cdef const void *p_wk = cnp.PyArray_DATA(<cnp.ndarray>wk)
    cdef const void *p_wv = cnp.PyArray_DATA(<cnp.ndarray>wv)
    cdef const void *p_wo = cnp.PyArray_DATA(<cnp.ndarray>wo)
    cdef const float *p_bq = _fp(bq)
    cdef const float *p_bk = _fp(bk)
    cdef const float *p_bv = _fp(bv)
    cdef const float *p_bo = _fp(bo)
    cdef float *p_kc = _wp(kv_cache_k)
    cdef float *p_vc = _wp(kv_cache_v)
    cdef const float *p_cos = _fp(rope_cos)
    cdef const float *p_sin = _fp(rope_sin)
    cdef void *p_scratch = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef int sp = start_pos, nt = tokens, cap = cache_capacity, e_ = embed_dim
    cdef int ea = aligned_embed_dim, h_ = num_heads, g_ = num_kv_heads, d_ = head_dim
    cdef int da = aligned_head_dim, threads = _num_threads
    cdef mega_fused_attention_prefill_fn kernel = (
        _K.mega_fused_attention_prefill_q8_0 if int8_path else _K.mega_fused_attention_prefill)
    cdef mf_team *team
    with nogil:
        team = _team_take(threads)
        kernel(p_out, p_in, p_res, p_g, p_wq, p_bq, <CKDataType>q_dt, p_wk, p_bk,
               <CKDataType>k_dt, p_wv, p_bv, <CKDataType>v_dt, p_wo, p_bo, <CKDataType>o_dt,
               p_kc, p_vc, p_cos, p_sin, sp, nt, cap, e_, ea, h_, g_, d_, da, eps, p_scratch,
               q_tile, kv_tile, team, threads)
        _team_give(team)


def mega_fused_attention_prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk,
                                 wk_dt, wv, bv, wv_dt, wo, bo, wo_dt, kv_cache_k, kv_cache_v,
                                 rope_cos, rope_sin, start_pos, tokens, cache_capacity,
                                 embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                                 head_dim, aligned_head_dim, float eps, scratch):
    """T = tokens rows through the fused attention block, every activation in float32.

    Row t is the token at absolute position start_pos + t: its k, v are written to row
    [g, start_pos + t] of the caches, and it attends over positions 0..start_pos+t (causal
    flash attention in tiles of mega_fuse_get_optimal_tiles(head_dim); no [T, T] array).
    Layouts: input, residual, output [T, Ea]; wq [H*Da, Ea], wk/wv [G*Da, Ea], wo [Ea, H*Da],
    each in its own format (w*_dt: FP32 float32, FP16 float16/uint16, BF16 uint16, the GGML
    block formats uint8), dequantized in registers; biases float32 or None; caches
    [G, cache_capacity, Da]; rope tables [>= start_pos+T rows, D/2] or both None.
    scratch: any writeable array of at least mega_fused_attention_prefill_scratch_size(...)
    bytes.  output may be input or residual itself.

    Kernel: megafuse/kernels/levels/prefill.pxi (mega_fused_attention_prefill_kernel),
    include/megafuse/mf_gemm.h, include/megafuse/mf_attention.h.
    """
    _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
             wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
             cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim,
             aligned_head_dim, eps, scratch, False)


def mega_fused_attention_prefill_q8_0(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk,
                                      bk, wk_dt, wv, bv, wv_dt, wo, bo, wo_dt, kv_cache_k,
                                      kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                                      cache_capacity, embed_dim, aligned_embed_dim, num_heads,
                                      num_kv_heads, head_dim, aligned_head_dim, float eps,
                                      scratch):
    """mega_fused_attention_prefill on the int8 path.

    The normalised input rows (for the Q/K/V projections) and the attention output rows (for
    the out-projection) are quantized to the activation format of each weight -- Q8_0 for
    Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q8_K for Q4_K/Q5_K/Q6_K -- and multiplied with integer dot
    products (GGML's vec_dot scheme); FP32/FP16/BF16 weights stay float.  Same layouts;
    scratch: mega_fused_attention_prefill_q8_0_scratch_size(...) bytes.

    Kernel: megafuse/kernels/levels/prefill.pxi (mega_fused_attention_prefill_q8_0_kernel),
    include/megafuse/mf_quant.h, include/megafuse/mf_attention.h.
    """
    _prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
             wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
             cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads, head_dim,
             aligned_head_dim, eps, scratch, True)


# --------------------------------------------------------------------------------------------
# The post-attention block: out-projection + residual -> RMSNorm -> SwiGLU MLP -> residual
# --------------------------------------------------------------------------------------------

MLP_TOKEN_TILE = scr.MF_MLP_TOKEN_TILE     # tokens a tile of the MLP kernels (for tests)


def mega_fused_outproj_mlp_prefill_scratch_size(tokens, aligned_embed_dim, num_heads,
                                                aligned_head_dim, aligned_intermediate_dim):
    """Bytes of scratch mega_fused_outproj_mlp_prefill uses (exactly).

    Per tile of up to MF_MLP_TOKEN_TILE = 128 tokens (include/megafuse/mf_scratch.h): the tile's
    attention rows, then its normalised rows [tile, max(H*Da, Ea)] float32 and their quantized
    copy; the SwiGLU activation [tile, Ia] float32 and its quantized copy.  Nothing grows with
    the prompt beyond one tile: no [T, I] buffer.
    Dimensions whose scratch would not fit 64-bit sizes are a ValueError naming them
    (never a wrapped-around number).

    Kernel: none; the layout is include/megafuse/mf_scratch.h (mf_mlp_scratch_layout).
    """
    values = [_int_arg(v, n) for v, n in ((tokens, "tokens"),
              (aligned_embed_dim, "aligned_embed_dim"), (num_heads, "num_heads"),
              (aligned_head_dim, "aligned_head_dim"),
              (aligned_intermediate_dim, "aligned_intermediate_dim"))]
    for value, name in zip(values, ("tokens", "aligned_embed_dim", "num_heads",
                                    "aligned_head_dim", "aligned_intermediate_dim")):
        _positive(value, name)
    T, Ea, H, Da, Ia = values
    return _mlp_scratch_total(T, Ea, _count("num_heads*aligned_head_dim",
                                            "num_heads x aligned_head_dim", H, Da), Ia)


def mega_fused_mlp_prefill_scratch_size(tokens, aligned_embed_dim, aligned_intermediate_dim):
    """Bytes of scratch mega_fused_mlp_prefill uses (exactly): the tile buffers of
    mega_fused_outproj_mlp_prefill_scratch_size without the attention rows.
    Dimensions whose scratch would not fit 64-bit sizes are a ValueError naming them
    (never a wrapped-around number).

    Kernel: none; the layout is include/megafuse/mf_scratch.h (mf_mlp_scratch_layout).
    """
    values = [_int_arg(v, n) for v, n in ((tokens, "tokens"),
              (aligned_embed_dim, "aligned_embed_dim"),
              (aligned_intermediate_dim, "aligned_intermediate_dim"))]
    for value, name in zip(values, ("tokens", "aligned_embed_dim", "aligned_intermediate_dim")):
        _positive(value, name)
    T, Ea, Ia = values
    return _mlp_scratch_total(T, Ea, 0, Ia)


cdef object _mlp(output, attn_out, input, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2,
                 b2, w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
                 intermediate_dim, aligned_intermediate_dim, float eps, scratch,
                 bint with_outproj, bint int8_path):
    """Validate any of the four MLP entries (docs/contract.md §5), then run its kernel:
    with_outproj (attn_out, wo) or not (token-major input); int8_path (quantized activations
    for block-format weights) or float32 activations throughout."""
    tokens = _int_arg(tokens, "tokens")
    embed_dim = _int_arg(embed_dim, "embed_dim")
    aligned_embed_dim = _int_arg(aligned_embed_dim, "aligned_embed_dim")
    intermediate_dim = _int_arg(intermediate_dim, "intermediate_dim")
    aligned_intermediate_dim = _int_arg(aligned_intermediate_dim, "aligned_intermediate_dim")
    if with_outproj:
        num_heads = _int_arg(num_heads, "num_heads")
        aligned_head_dim = _int_arg(aligned_head_dim, "aligned_head_dim")
        _positive(num_heads, "num_heads")
        _positive(aligned_head_dim, "aligned_head_dim")
    else:
        num_heads, aligned_head_dim = 0, 0
    cdef Py_ssize_t T = tokens, E = embed_dim, Ea = aligned_embed_dim
    cdef Py_ssize_t Ia = aligned_intermediate_dim
    _positive(tokens, "tokens")
    _check_aligned(aligned_embed_dim, embed_dim, "aligned_embed_dim", "embed_dim")
    _check_aligned(aligned_intermediate_dim, intermediate_dim, "aligned_intermediate_dim",
                   "intermediate_dim")
    cdef Py_ssize_t HDa = _count("wo", "num_heads x aligned_head_dim", num_heads,
                                 aligned_head_dim)
    rows = "[tokens, aligned_embed_dim]"
    cdef Py_ssize_t TEa = _count("output", rows, T, Ea)
    _array(output, "output", _F32, TEa, rows, True)
    if with_outproj:
        shape = "[num_heads, tokens, aligned_head_dim]"
        _array(attn_out, "attn_out", _F32,
               _count("attn_out", shape, num_heads, T, aligned_head_dim), shape)
    else:
        _array(input, "input", _F32, TEa, rows)
    _optional(residual, "residual", _F32, TEa, rows)
    _array(ln2_gamma, "ln2_gamma", _F32, E, "[embed_dim]")
    cdef int o_dt = 0
    if with_outproj:
        o_dt = _weight(wo, "wo", wo_dt, Ea, HDa, "[aligned_embed_dim, num_heads*aligned_head_dim]")
        _optional(bo, "bo", _F32, Ea, "[aligned_embed_dim]")
    cdef Py_ssize_t gate_up = _count("w1", "2 x aligned_intermediate_dim", 2, Ia)
    cdef int g_dt = _weight(w1, "w1", w1_dt, gate_up, Ea,
                            "[2*aligned_intermediate_dim, aligned_embed_dim]")
    _optional(b1, "b1", _F32, gate_up, "[2*aligned_intermediate_dim]")
    cdef int d_dt = _weight(w2, "w2", w2_dt, Ea, Ia,
                            "[aligned_embed_dim, aligned_intermediate_dim]")
    _optional(b2, "b2", _F32, Ea, "[aligned_embed_dim]")
    _scratch(scratch, _mlp_scratch_total(T, Ea, HDa, Ia))
    if with_outproj:
        _no_overlap_flat(("output", "scratch", "residual", "ln2_gamma", "w1", "b1", "w2", "b2",
                          "attn_out", "wo", "bo"),
                         (output, scratch, residual, ln2_gamma, w1, b1, w2, b2, attn_out, wo, bo),
                         2, may_alias=("residual",))
    else:
        _no_overlap_flat(("output", "scratch", "residual", "ln2_gamma", "w1", "b1", "w2", "b2",
                          "input"),
                         (output, scratch, residual, ln2_gamma, w1, b1, w2, b2, input), 2,
                         may_alias=("input", "residual"))

    cdef float *p_out = _wp(output)
    cdef const float *p_attn = _fp(attn_out) if with_outproj else NULL
    cdef const float *p_in = NULL if with_outproj else _fp(input)
    cdef const float *p_res = _fp(residual)
    cdef const float *p_g = _fp(ln2_gamma)
    cdef const void *p_wo = cnp.PyArray_DATA(<cnp.ndarray>wo) if with_outproj else NULL
    cdef const float *p_bo = _fp(bo) if with_outproj else NULL
    cdef const void *p_w1 = cnp.PyArray_DATA(<cnp.ndarray>w1)
    cdef const float *p_b1 = _fp(b1)
    cdef const void *p_w2 = cnp.PyArray_DATA(<cnp.ndarray>w2)
    cdef const float *p_b2 = _fp(b2)
    cdef void *p_scratch = cnp.PyArray_DATA(<cnp.ndarray>scratch)
    cdef int nt = tokens, e_ = embed_dim, ea = aligned_embed_dim, h_ = num_heads
    cdef int da = aligned_head_dim, i_ = intermediate_dim, ia = aligned_intermediate_dim
    cdef int threads = _num_threads
    cdef mega_fused_outproj_mlp_prefill_fn outproj_kernel = (
        _K.mega_fused_outproj_mlp_prefill if int8_path else _K.mega_fused_outproj_mlp_prefill_f32)
    cdef mega_fused_mlp_prefill_fn mlp_kernel = (
        _K.mega_fused_mlp_prefill if int8_path else _K.mega_fused_mlp_prefill_f32)
    cdef mf_team *team
    with nogil:
        team = _team_take(threads)
        if with_outproj:
            outproj_kernel(p_out, p_attn, p_res, p_g, p_wo, p_bo, <CKDataType>o_dt, p_w1, p_b1,
                           <CKDataType>g_dt, p_w2, p_b2, <CKDataType>d_dt, nt, e_, ea, h_, da,
                           i_, ia, eps, p_scratch, team, threads)
        else:
            mlp_kernel(p_out, p_in, p_res, p_g, p_w1, p_b1, <CKDataType>g_dt, p_w2, p_b2,
                       <CKDataType>d_dt, nt, e_, ea, i_, ia, eps, p_scratch, team, threads)
        _team_give(team)


def mega_fused_outproj_mlp_prefill(output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1,
                                   b1, w1_dt, w2, b2, w2_dt, tokens, embed_dim,
                                   aligned_embed_dim, num_heads, aligned_head_dim,
                                   intermediate_dim, aligned_intermediate_dim, float eps,
                                   scratch):
    """Everything after attention, for T tokens.

    h1 = attn @ wo.T + bo + residual (attn_out head-major [H, T, Da], as attention produces
    it); z = rmsnorm(h1, ln2_gamma); output = h1 + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu))
    @ w2.T + b2.  w1 [2*Ia, Ea] holds the gate rows, then the up rows; w2 [Ea, Ia]; each weight
    in its own format.  Activations are quantized to Q8_0 (32-weight formats) or Q8_K
    (K-quants) for integer dot products; FP32/FP16/BF16 weights see float activations.
    residual and biases may be None; output may be residual itself.  scratch:
    mega_fused_outproj_mlp_prefill_scratch_size(...) bytes.

    Kernel: megafuse/kernels/levels/mlp.pxi (mega_fused_outproj_mlp_prefill_kernel),
    include/megafuse/mf_quant.h, include/megafuse/mf_gemm.h.
    """
    _mlp(output, attn_out, None, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
         w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
         intermediate_dim, aligned_intermediate_dim, eps, scratch, True, True)


def mega_fused_mlp_prefill(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                           tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                           aligned_intermediate_dim, float eps, scratch):
    """The MLP block on token-major hidden states (a megafuse addition to the header):
    output = residual + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu)) @ w2.T + b2 with
    z = rmsnorm(input, ln2_gamma).  The same kernel as mega_fused_outproj_mlp_prefill, so a
    whole layer is mega_fused_attention_prefill (or _decode) followed by this, usually with
    residual = input = output.  scratch: mega_fused_mlp_prefill_scratch_size(...) bytes.

    Kernel: kernels/levels/mlp.pxi (mega_fused_mlp_prefill_kernel), include/megafuse/mf_quant.h,
    include/megafuse/mf_gemm.h.
    """
    _mlp(output, None, input, residual, ln2_gamma, None, None, 0, w1, b1, w1_dt, w2, b2, w2_dt,
         tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim, aligned_intermediate_dim,
         eps, scratch, False, True)


def mega_fused_outproj_mlp_prefill_f32(output, attn_out, residual, ln2_gamma, wo, bo, wo_dt, w1,
                                       b1, w1_dt, w2, b2, w2_dt, tokens, embed_dim,
                                       aligned_embed_dim, num_heads, aligned_head_dim,
                                       intermediate_dim, aligned_intermediate_dim, float eps,
                                       scratch):
    """mega_fused_outproj_mlp_prefill with float32 activations (a megafuse addition to the
    header): the same parameters, layouts, math and scratch
    (mega_fused_outproj_mlp_prefill_scratch_size), but every projection multiplies float32
    activations -- block-format weights are dequantized as they are read, as
    mega_fused_attention_prefill does, so the result matches a float reference on the
    dequantized weights.  The quantized regions of the scratch are not touched.

    Kernel: megafuse/kernels/levels/mlp.pxi (mega_fused_outproj_mlp_prefill_f32_kernel),
    include/megafuse/mf_gemm.h, include/megafuse/mf_quant.h.
    """
    _mlp(output, attn_out, None, residual, ln2_gamma, wo, bo, wo_dt, w1, b1, w1_dt, w2, b2,
         w2_dt, tokens, embed_dim, aligned_embed_dim, num_heads, aligned_head_dim,
         intermediate_dim, aligned_intermediate_dim, eps, scratch, True, False)


def mega_fused_mlp_prefill_f32(output, input, residual, ln2_gamma, w1, b1, w1_dt, w2, b2, w2_dt,
                               tokens, embed_dim, aligned_embed_dim, intermediate_dim,
                               aligned_intermediate_dim, float eps, scratch):
    """mega_fused_mlp_prefill with float32 activations (a megafuse addition to the header):
    the same parameters, layouts, math and scratch (mega_fused_mlp_prefill_scratch_size), every
    projection on float32 activations (block-format weights dequantized as they are read).  A
    layer of float activations is mega_fused_attention_prefill followed by this.

    Kernel: kernels/levels/mlp.pxi (mega_fused_mlp_prefill_f32_kernel), include/megafuse/mf_gemm.h,
    include/megafuse/mf_quant.h.
    """
    _mlp(output, None, input, residual, ln2_gamma, None, None, 0, w1, b1, w1_dt, w2, b2, w2_dt,
         tokens, embed_dim, aligned_embed_dim, 0, 0, intermediate_dim, aligned_intermediate_dim,
         eps, scratch, False, False)


# --------------------------------------------------------------------------------------------
# mega_fuse_report_stats: memory traffic of the unfused vs the fused layer
# --------------------------------------------------------------------------------------------

def mega_fuse_report_stats(hidden, num_layers, seq_len):
    """Print, and return as a dict, the memory traffic an unfused attention block spends on
    intermediates against the fused one.  Every figure comes from these formulas (float32,
    per token per layer):

      unfused intermediates = normed input, q, k, v, attention output, out-projection result
                              (hidden floats each) + one row of attention scores (seq_len floats)
                            = 4 * (6 * hidden + seq_len) bytes, each written once and read once;
      unfused traffic       = 2 * intermediates + input read + output written (2 * 4 * hidden);
      fused traffic         = input read + output written = 2 * 4 * hidden
                              (every intermediate stays in registers, L1 or L2);
    per layer: times seq_len tokens; per model: times num_layers; reduction = unfused / fused.

    Kernel: none; computed here.
    """
    hidden = _int_arg(hidden, "hidden")
    num_layers = _int_arg(num_layers, "num_layers")
    seq_len = _int_arg(seq_len, "seq_len")
    _positive(hidden, "hidden")
    _positive(num_layers, "num_layers")
    _positive(seq_len, "seq_len")
    h, layers, t = hidden, num_layers, seq_len     # Python ints: these products never wrap
    inter = 4 * (6 * h + t)
    unfused = 2 * inter + 2 * 4 * h
    fused = 2 * 4 * h
    stats = {
        "hidden": hidden,
        "num_layers": num_layers,
        "seq_len": seq_len,
        "unfused_intermediate_bytes_per_token": inter,
        "unfused_traffic_bytes_per_token": unfused,
        "fused_traffic_bytes_per_token": fused,
        "unfused_traffic_bytes_per_layer": unfused * t,
        "fused_traffic_bytes_per_layer": fused * t,
        "unfused_traffic_bytes_model": unfused * t * layers,
        "fused_traffic_bytes_model": fused * t * layers,
        "reduction": unfused / fused,
    }
    out = sys.stdout
    out.write(f"megafuse: memory traffic of the attention block, hidden={hidden}, "
              f"layers={num_layers}, seq_len={seq_len}\n")
    out.write("  (float32; unfused = 2 x 4*(6*hidden + seq_len) B of intermediates + 2 x "
              "4*hidden B in/out per token; fused = 2 x 4*hidden B)\n")
    width = max(len(k) for k in stats)
    for key, value in stats.items():
        shown = f"{value:.2f}x" if key == "reduction" else f"{value:,}"
        out.write(f"  {key:<{width}}  {shown}\n")
    return stats


# --------------------------------------------------------------------------------------------
# The format API and the C API
# --------------------------------------------------------------------------------------------

include "kernels/formats.pxi"
include "kernels/capi.pxi"


# --------------------------------------------------------------------------------------------
# For megafuse's other compiled modules: the level in use and the thread count
# --------------------------------------------------------------------------------------------

cdef mf_boundary _BOUNDARY
_BOUNDARY.table = &_K
_BOUNDARY.num_threads = &_num_threads
_BOUNDARY.team_slot = &_TEAM


def _boundary_capsule():
    """A capsule ("megafuse.boundary") of an mf_boundary (megafuse/kernels/kernel_table.pxd):
    the model runner (megafuse/llm/_runner.pyx) reads the level and the thread count through it,
    and takes the shared thread team from it."""
    return PyCapsule_New(<void *>&_BOUNDARY, b"megafuse.boundary", NULL)
