"""Shared test helpers: the tolerance table, the error measure, the weight formats, and builders
of layer cases.  Every test file takes these from here (one vocabulary, one definition each)."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np

import megafuse
from megafuse.reference import rel_err  # noqa: F401  (the one error measure: see its docstring)

# Where things are: this folder (tests/), its data, the repository
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.path.join(TESTS_DIR, "data")
ROOT = os.path.dirname(TESTS_DIR)

# Timeouts of subprocesses, servers and queues guard against hangs; they never measure speed.
# Under emulation every one of them stretches by MEGAFUSE_TEST_TIMEOUT_SCALE (set by
# tools/aarch64-emulated.sh: qemu-user runs the suite 10x slower, its float-mode serving tests
# several hundred times, more on a loaded machine).
TIMEOUT_SCALE = float(os.environ.get("MEGAFUSE_TEST_TIMEOUT_SCALE", "1"))
assert TIMEOUT_SCALE > 0, f"MEGAFUSE_TEST_TIMEOUT_SCALE must be positive, not {TIMEOUT_SCALE}"


def hang_timeout(seconds):
    """`seconds`, the bound of a wait that only a hang should reach, at this run's scale."""
    return seconds * TIMEOUT_SCALE


def path_with_scripts_first():
    """PATH with this interpreter's scripts folder first, for what a test runs by name (a console
    script, or a tool that runs another): a venv's pytest may run without the venv activated."""
    return os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


# Named tolerances (max |got - want| / max |want|), docs/contract.md §4 and the issues.
TOL = {
    "float": 1e-5,          # float activations vs the float64 reference
    "q8_emulated": 1e-4,    # int8 path vs the reference's emulation of the same quantization
    "q8_vs_float": 2e-2,    # int8 path vs pure float math
}

# Shapes: (name, E, Ea, H, G, D, Da)
QWEN2_05B = ("qwen2-0.5b", 896, 896, 14, 2, 64, 64)
LLAMA_STYLE = ("llama-style", 2048, 2048, 32, 8, 64, 64)
MHA = ("mha", 256, 256, 4, 4, 64, 64)
PADDED = ("padded", 200, 256, 6, 2, 40, 48)


# The int8 path against the reference's emulation.  The kernel quantizes its float32
# intermediates, the reference its float64 ones rounded to float32: where a value sits within an
# ulp of an int8 rounding boundary, the two pick neighbouring codes.  Such a flip moves the
# outputs of its token row by about one quantization step (measured 1.5e-4 .. 2e-3 relative),
# while every other element agrees to float rounding (~1e-7).  So every row must be within 1e-4,
# except a few rows (at most 1 in 8, at least 1) that must stay within a third of the int8
# path's own quantization error (|emulation - pure float|): one flipped code is a small part of
# the thousands of roundings that error sums.  A wrong scale, block or activation format is as
# large as that error or larger, in every row.


def assert_q8_close(got, want, pure, name="output", tol=None):
    tol = TOL["q8_emulated"] if tol is None else tol
    got, want, pure = (np.asarray(a, np.float64) for a in (got, want, pure))
    scale = max(float(np.max(np.abs(want))), 1e-30)
    rows = (np.abs(got - want) / scale).reshape(want.shape[0] if want.ndim > 1 else 1, -1)
    row_err = rows.max(axis=1)
    worst = float(row_err.max())
    allowance = max(tol, float(np.max(np.abs(want - pure))) / scale / 3)
    flipped = int(np.sum(row_err >= tol))
    assert worst < allowance, (f"{name}: relative error {worst:.2e} >= {allowance:.1e} (a third "
                               f"of the int8 path's own quantization error)")
    assert flipped <= max(1, len(row_err) // 8), (
        f"{name}: {flipped} of {len(row_err)} rows beyond {tol:.0e} (worst {worst:.2e})")


def rope_tables(head_dim, rows, theta=10000.0):
    """cos, sin [rows, D/2] for rotate-half RoPE (the HF Llama/Qwen2 convention)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def padded_matrix(rng, rows_heads, D, Da, cols, Ea, scale):
    """A [rows_heads*Da, Ea] float32 weight whose padding rows (d >= D) and columns (>= cols)
    are zero, as docs/contract.md §3 expects."""
    w = np.zeros((rows_heads, Da, Ea), dtype=np.float32)
    w[:, :D, :cols] = rng.standard_normal((rows_heads, D, cols)) * scale
    return w.reshape(rows_heads * Da, Ea)


@dataclasses.dataclass
class DecodeCase:
    """Every argument of mega_fused_attention_decode (as its keyword names)."""
    args: dict

    def copy(self):
        return DecodeCase({k: (v.copy() if isinstance(v, np.ndarray) else v)
                           for k, v in self.args.items()})


def decode_case(shape, *, cache_capacity=96, pos=37, bias=True, residual=True, rope=True,
                seed=0, fill_cache=True):
    """A random decode case for shape = (name, E, Ea, H, G, D, Da)."""
    _, E, Ea, H, G, D, Da = shape
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    C = cache_capacity
    x = f32(Ea)
    x[E:] = 1e3           # input padding must be ignored
    res = f32(Ea) if residual else None
    if res is not None:
        res[E:] = -7.0    # residual padding must be ignored too
    bias_vec = lambda heads: (np.pad(f32(heads, D) * 0.1, ((0, 0), (0, Da - D)))  # noqa: E731
                              .reshape(-1).astype(np.float32))
    cache_k = f32(G, C, Da)
    cache_v = f32(G, C, Da)
    cache_k[:, :, D:] = 0.0
    cache_v[:, :, D:] = 0.0
    if not fill_cache:
        cache_k[:] = 0.0
        cache_v[:] = 0.0
    wo = np.zeros((Ea, H, Da), dtype=np.float32)
    wo[:E, :, :D] = rng.standard_normal((E, H, D)) / np.sqrt(H * D)
    cos, sin = rope_tables(D, C + 3)
    args = dict(
        output=np.full(Ea, np.nan, dtype=np.float32),
        input=x, residual=res,
        ln1_gamma=(1.0 + 0.1 * f32(E)).astype(np.float32),
        wq=padded_matrix(rng, H, D, Da, E, Ea, 1 / np.sqrt(E)),
        bq=bias_vec(H) if bias else None,
        wk=padded_matrix(rng, G, D, Da, E, Ea, 1 / np.sqrt(E)),
        bk=bias_vec(G) if bias else None,
        wv=padded_matrix(rng, G, D, Da, E, Ea, 1 / np.sqrt(E)),
        bv=bias_vec(G) if bias else None,
        wo=wo.reshape(Ea, H * Da),
        bo=(np.pad(f32(E) * 0.1, (0, Ea - E)).astype(np.float32) if bias else None),
        kv_cache_k=cache_k, kv_cache_v=cache_v,
        rope_cos=cos if rope else None, rope_sin=sin if rope else None,
        pos=pos, embed_dim=E, aligned_embed_dim=Ea, num_heads=H, num_kv_heads=G,
        head_dim=D, aligned_head_dim=Da, cache_capacity=C, eps=1e-6,
    )
    return DecodeCase(args)


def decode_workspaces(case, extra=0):
    """(q_output_workspace, kv_workspace) float32 arrays of the sizes the header states."""
    a = case.args
    q_ws = np.zeros(2 * a["num_heads"] * a["aligned_head_dim"] + extra, dtype=np.float32)
    kv_ws = np.zeros(2 * a["num_kv_heads"] * a["aligned_head_dim"] + extra, dtype=np.float32)
    return q_ws, kv_ws


def qkv_case(*, hidden=128, H=4, G=2, D=32, bias=True, rope=True, pos=5, max_seq=16, seed=1):
    """Arguments of mega_fuse_rmsnorm_qkv_rope (drop rope_cos/rope_sin/pos/max_seq for the
    plain variant)."""
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    cos, sin = rope_tables(D, max_seq)
    return dict(
        q_out=np.full(H * D, np.nan, np.float32), k_out=np.full(G * D, np.nan, np.float32),
        v_out=np.full(G * D, np.nan, np.float32),
        input=f32(hidden), gamma=(1 + 0.1 * f32(hidden)).astype(np.float32),
        W_qkv=(f32((H + 2 * G) * D, hidden) / np.sqrt(hidden)).astype(np.float32),
        b_qkv=(0.1 * f32((H + 2 * G) * D)).astype(np.float32) if bias else None,
        rope_cos=cos if rope else None, rope_sin=sin if rope else None,
        pos=pos, hidden=hidden, num_heads=H, num_kv_heads=G, head_dim=D, max_seq=max_seq,
        eps=1e-5,
    )


def without_rope(args):
    return {k: v for k, v in args.items() if k not in ("rope_cos", "rope_sin", "pos", "max_seq")}


# ---- weights in every format -----------------------------------------------------------------

# The format vocabulary of the tests: the names of megafuse.CKDataType ("Q8_0"), which
# DecoderLayer's dtypes= take too.  DT[name] is the enum member; sizes come from megafuse's
# ckernel_dtype.h helpers, never from literals.
DT = megafuse.CKDataType
FLOAT_FORMATS = ("FP32", "FP16", "BF16")                    # activations stay float for these
# 32 weights a block; Q8_0 activations
BLOCK32_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL")
# 256 weights a block (the K-quants and IQ4_XS); Q8_K activations
KQUANT_FORMATS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
# what gguf.quants.quantize makes (the tests' independent quantizer); megafuse.quantize the rest
GGUF_QUANTIZES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
BLOCK_FORMATS = BLOCK32_FORMATS + KQUANT_FORMATS
WEIGHT_FORMATS = FLOAT_FORMATS + BLOCK_FORMATS


def block_size(fmt):
    """Weights a block of format fmt (a name or a CKDataType): 1, 32 or 256."""
    return megafuse.ck_dtype_block_size(DT[fmt] if isinstance(fmt, str) else fmt)


def block_bytes(fmt):
    """Bytes a block of format fmt (GGML's byte counts; bytes an element for the float ones)."""
    return megafuse.ck_dtype_block_bytes(DT[fmt] if isinstance(fmt, str) else fmt)


def fits(fmt, cols):
    """Whether a row of cols weights is whole blocks of format fmt."""
    return cols % block_size(fmt) == 0


def _fp16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_kquant_blocks(fmt, rows, cols, rng, target):
    """Random K-quant bytes whose scales are set so the weights have a spread ~ target.
    Independent of any quantizer: the reference dequantizes these bit for bit."""
    nb = rows * cols // 256
    blob = rng.integers(0, 256, size=(nb, block_bytes(fmt)), dtype=np.uint8)
    u = rng.uniform(0.5, 1.5, nb)
    if fmt in ("Q4_K", "Q5_K"):
        qmax = 15 if fmt == "Q4_K" else 31
        d = u * target * 2 / (63 * qmax / 2)
        blob[:, 0:2] = _fp16_bytes(d)
        blob[:, 2:4] = _fp16_bytes(d * qmax / 2)      # dmin: centres the 6-bit mins near 0.5*range
    elif fmt == "Q6_K":  # ql[128] qh[64] scales int8[16] d fp16
        blob[:, 208:210] = _fp16_bytes(u * target * 2 / (64 * 32))
    elif fmt == "Q2_K":  # scales[16] qs[64] d dmin: 4-bit scales and mins, 2-bit codes
        d = u * target / 8
        blob[:, 80:82] = _fp16_bytes(d)
        blob[:, 82:84] = _fp16_bytes(1.5 * d)         # dmin: centres the weights near 0
    elif fmt == "Q3_K":  # hmask[32] qs[64] scales[12] d: (6-bit scale - 32) * (3-bit code - 4)
        blob[:, 108:110] = _fp16_bytes(u * target / 42)
    else:  # IQ4_XS: d scales_h scales_l[4] qs[128]: (6-bit scale - 32) * kvalues_iq4nl
        blob[:, 0:2] = _fp16_bytes(u * target / 1260)
    return blob.reshape(rows, -1)


def encode_weight(w, fmt, rng, random_kquants=False):
    """Float32 weight [rows, cols] -> the array megafuse takes for format fmt.  Block formats
    come from gguf's quantizer (GGUF_QUANTIZES) or megafuse.quantize (the others, which gguf
    cannot make); random_kquants=True gives random blocks of the 256-weight formats instead.
    Either way the reference dequantizes the bytes on its own, so the data's origin does not
    weaken a test."""
    import gguf
    w = np.ascontiguousarray(w, dtype=np.float32)
    if fmt == "FP32":
        return w
    if fmt == "FP16":
        return w.astype(np.float16) if rng.integers(2) else w.astype(np.float16).view(np.uint16)
    if fmt == "BF16":
        from megafuse import reference
        return reference.float_to_bf16_bits(w)
    if fmt in GGUF_QUANTIZES:
        return gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, fmt))
    if random_kquants:
        return random_kquant_blocks(fmt, w.shape[0], w.shape[1], rng, float(np.std(w)))
    return megafuse.quantize(w, DT[fmt])


def prefill_case(shape, T, *, start_pos=0, formats=None, bias=True, residual=True, rope=True,
                 cache_capacity=None, seed=0, int8=False):
    """Every argument of mega_fused_attention_prefill(_q8_0) for shape (name, E, Ea, H, G, D,
    Da); formats = {"wq": "Q8_0", ...} (default FP32 everywhere).  Positions < start_pos of the
    cache hold random history."""
    _, E, Ea, H, G, D, Da = shape
    formats = dict({"wq": "FP32", "wk": "FP32", "wv": "FP32", "wo": "FP32"}, **(formats or {}))
    C = cache_capacity or (start_pos + T + 5)
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x = f32(T, Ea)
    x[:, E:] = 1e3
    res = f32(T, Ea) if residual else None
    if res is not None:
        res[:, E:] = 5.0
    bias_vec = lambda heads: (np.pad(f32(heads, D) * 0.1, ((0, 0), (0, Da - D)))  # noqa: E731
                              .reshape(-1).astype(np.float32))
    cache_k = np.zeros((G, C, Da), np.float32)
    cache_v = np.zeros((G, C, Da), np.float32)
    cache_k[:, :start_pos, :D] = f32(G, start_pos, D)
    cache_v[:, :start_pos, :D] = f32(G, start_pos, D)
    wo = np.zeros((Ea, H, Da), dtype=np.float32)
    wo[:E, :, :D] = rng.standard_normal((E, H, D)) / np.sqrt(H * D)
    cos, sin = rope_tables(D, C)
    weights = {
        "wq": padded_matrix(rng, H, D, Da, E, Ea, 1 / np.sqrt(E)),
        "wk": padded_matrix(rng, G, D, Da, E, Ea, 1 / np.sqrt(E)),
        "wv": padded_matrix(rng, G, D, Da, E, Ea, 1 / np.sqrt(E)),
        "wo": wo.reshape(Ea, H * Da),
    }
    size_fn = (megafuse.mega_fused_attention_prefill_q8_0_scratch_size if int8
               else megafuse.mega_fused_attention_prefill_scratch_size)
    args = dict(
        output=np.full((T, Ea), np.nan, np.float32), input=x, residual=res,
        ln1_gamma=(1.0 + 0.1 * f32(E)).astype(np.float32),
        wq=encode_weight(weights["wq"], formats["wq"], rng), bq=bias_vec(H) if bias else None,
        wq_dt=DT[formats["wq"]],
        wk=encode_weight(weights["wk"], formats["wk"], rng), bk=bias_vec(G) if bias else None,
        wk_dt=DT[formats["wk"]],
        wv=encode_weight(weights["wv"], formats["wv"], rng), bv=bias_vec(G) if bias else None,
        wv_dt=DT[formats["wv"]],
        wo=encode_weight(weights["wo"], formats["wo"], rng),
        bo=(np.pad(f32(E) * 0.1, (0, Ea - E)).astype(np.float32) if bias else None),
        wo_dt=DT[formats["wo"]],
        kv_cache_k=cache_k, kv_cache_v=cache_v,
        rope_cos=cos if rope else None, rope_sin=sin if rope else None,
        start_pos=start_pos, tokens=T, cache_capacity=C, embed_dim=E, aligned_embed_dim=Ea,
        num_heads=H, num_kv_heads=G, head_dim=D, aligned_head_dim=Da, eps=1e-6,
    )
    args["scratch"] = np.zeros(size_fn(T, Ea, H, Da), np.uint8)
    return args


# ---- the MLP blocks: shapes (name, E, Ea, H, Da, I, Ia) -----------------------------------------

def mlp_weights(shape, formats, rng):
    """wo [Ea, H*Da], w1 [2*Ia, Ea] (gate rows, then up rows), w2 [Ea, Ia], zero in their padding,
    encoded in formats.get(name, "FP32")."""
    _, E, Ea, H, Da, I, Ia = shape
    wo = np.zeros((Ea, H * Da), np.float32)
    wo[:E] = rng.standard_normal((E, H * Da)) / np.sqrt(H * Da)
    w1 = np.zeros((2, Ia, Ea), np.float32)
    w1[:, :I, :E] = rng.standard_normal((2, I, E)) / np.sqrt(E)
    w2 = np.zeros((Ea, Ia), np.float32)
    w2[:E, :I] = rng.standard_normal((E, I)) / np.sqrt(I)
    return {"wo": encode_weight(wo, formats.get("wo", "FP32"), rng),
            "w1": encode_weight(w1.reshape(2 * Ia, Ea), formats.get("w1", "FP32"), rng),
            "w2": encode_weight(w2, formats.get("w2", "FP32"), rng)}


def outproj_mlp_case(shape, T, formats=None, *, bias=True, residual=True, seed=0):
    """Every argument of mega_fused_outproj_mlp_prefill(_f32) for shape (name, E, Ea, H, Da, I,
    Ia) and T tokens; formats = {"wo": "Q8_0", ...} (default FP32)."""
    _, E, Ea, H, Da, I, Ia = shape
    formats = formats or {}
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    w = mlp_weights(shape, formats, rng)
    res = f32(T, Ea) if residual else None
    if res is not None:
        res[:, E:] = 3.0
    pad = lambda v, n: np.pad(v, (0, n - v.size)).astype(np.float32)  # noqa: E731
    b1 = np.zeros((2, Ia), np.float32)
    b1[:, :I] = 0.1 * rng.standard_normal((2, I))
    return dict(
        output=np.full((T, Ea), np.nan, np.float32), attn_out=f32(H, T, Da) * 0.5,
        residual=res, ln2_gamma=(1 + 0.1 * f32(E)).astype(np.float32),
        wo=w["wo"], bo=pad(0.1 * f32(E), Ea) if bias else None,
        wo_dt=DT[formats.get("wo", "FP32")],
        w1=w["w1"], b1=b1.reshape(-1) if bias else None,
        w1_dt=DT[formats.get("w1", "FP32")],
        w2=w["w2"], b2=pad(0.1 * f32(E), Ea) if bias else None,
        w2_dt=DT[formats.get("w2", "FP32")],
        tokens=T, embed_dim=E, aligned_embed_dim=Ea, num_heads=H, aligned_head_dim=Da,
        intermediate_dim=I, aligned_intermediate_dim=Ia, eps=1e-6,
        scratch=np.zeros(megafuse.mega_fused_outproj_mlp_prefill_scratch_size(T, Ea, H, Da, Ia),
                         np.uint8))


def mlp_case(shape, T, formats=None, **kw):
    """Every argument of mega_fused_mlp_prefill(_f32): outproj_mlp_case's, token-major input."""
    a = outproj_mlp_case(shape, T, formats, **kw)
    _, E, Ea, H, Da, I, Ia = shape
    x = np.random.default_rng(99).standard_normal((T, Ea)).astype(np.float32)
    x[:, E:] = -50.0
    for key in ("attn_out", "wo", "bo", "wo_dt", "num_heads", "aligned_head_dim"):
        del a[key]
    return dict(output=a.pop("output"), input=x, **a,
                ) | {"scratch": np.zeros(megafuse.mega_fused_mlp_prefill_scratch_size(T, Ea, Ia),
                                         np.uint8)}


def copy_args(args):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}


def fork_child_status(parent, child, env=None):
    """Run `parent` (code) in a fresh interpreter that can import these helpers, then fork: the
    child runs `child` and exits 0; the parent waits up to 60 s.  Returns the process, whose
    stdout says "CHILD <wait status>" or "CHILD HUNG" (a child killed after 60 s)."""
    code = textwrap.dedent(parent) + "\n" + textwrap.dedent("""
        import os as _os, sys as _sys, time as _time
        _pid = _os.fork()
        if _pid == 0:
        %s
            _os._exit(0)
        _deadline = _time.time() + 60
        while _time.time() < _deadline:
            _done, _status = _os.waitpid(_pid, _os.WNOHANG)
            if _done:
                print("CHILD", _status)
                _sys.exit(0)
            _time.sleep(0.02)
        _os.kill(_pid, 9)
        print("CHILD HUNG")
    """) % textwrap.indent(textwrap.dedent(child).strip(), "    ")
    path = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {path!r})\n" + code
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=hang_timeout(120), env=env)
