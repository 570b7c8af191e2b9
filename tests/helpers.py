"""Shared test helpers: the tolerance table, the error measure, and builders of layer cases."""
import dataclasses

import numpy as np

# Named tolerances (max |got - want| / max |want|), SPEC section 4 and the issues.
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


def rel_err(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.max(np.abs(want))
    return float(np.max(np.abs(got - want)) / (scale if scale > 0 else 1.0))


def rope_tables(head_dim, rows, theta=10000.0):
    """cos, sin [rows, D/2] for rotate-half RoPE (the HF Llama/Qwen2 convention)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def padded_matrix(rng, rows_heads, D, Da, cols, Ea, scale):
    """A [rows_heads*Da, Ea] float32 weight whose padding rows (d >= D) and columns (>= cols)
    are zero, as SPEC section 3 expects."""
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
