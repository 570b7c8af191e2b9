"""The layer benchmark cases: model shapes, weight formats, token counts, and the work of each.

A case is (block, shape, format label, tokens T).  Its benchmark ids read
``<shape>-<block>-T<T>-<format>-<implementation>`` (e.g. ``llama-3.2-1b-mlp-T1-Q4_K-ggml``), so
``pytest -k`` selects by any of them.  Dimension letters: E embed, H heads, G kv heads, D head_dim,
I intermediate, T tokens; no padding (Ea = E, Da = D, Ia = I).
"""
import dataclasses

import megafuse as mf

from _config import DECODE_POS, TOKENS

DT = mf.CKDataType

BLOCK_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
KQUANT_BLOCK = 256               # weights per K-quant block: rows must be a multiple of it
# llama.cpp's fallback when a tensor's row length is not a multiple of 256 (llama-quant.cpp).
# So SmolLM2's "Q4_K" MLP is the layout llama.cpp really writes there: gate/up (576 columns)
# Q5_0, down (1536 = 6 x 256 columns) Q4_K.
KQUANT_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


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
    labels: tuple   # the weight formats benchmarked on this shape


SHAPES = (
    Shape("smollm2-135m", 576, 9, 3, 64, 1536, False, 1e5, 1e-5, ("FP32",) + BLOCK_FORMATS),
    Shape("llama-3.2-1b", 2048, 32, 8, 64, 8192, False, 5e5, 1e-5, ("FP32",) + BLOCK_FORMATS),
    # FP32 only: the shape of the FP32 attention decode target against PyTorch (issue 13)
    Shape("qwen2-0.5b", 896, 14, 2, 64, 4864, True, 1e6, 1e-6, ("FP32",)),
)
SHAPE = {s.name: s for s in SHAPES}

BLOCKS = ("attention", "mlp")
WEIGHTS = {"attention": ("wq", "wk", "wv", "wo"), "mlp": ("w1", "w2")}


def weight_rows(shape, name):
    s = shape
    return {"wq": s.H * s.D, "wk": s.G * s.D, "wv": s.G * s.D, "wo": s.E, "w1": 2 * s.I,
            "w2": s.E}[name]


def weight_cols(shape, name):
    s = shape
    return {"wq": s.E, "wk": s.E, "wv": s.E, "wo": s.H * s.D, "w1": s.E, "w2": s.I}[name]


def block_formats(block, shape, label):
    """{weight name: format name} of the case; None when no weight of the block can take the
    format (a K-quant where every row length is not a multiple of 256)."""
    names = WEIGHTS[block]
    if label not in KQUANT_FALLBACK:
        return {n: label for n in names}
    fmts = {n: (label if weight_cols(shape, n) % KQUANT_BLOCK == 0 else KQUANT_FALLBACK[label])
            for n in names}
    return fmts if label in fmts.values() else None


def format_note(block, shape, label):
    """(label, note): 'Q4_K*' and what the star means for a mixed layout, else (label, '')."""
    fmts = block_formats(block, shape, label)
    if fmts is None or len(set(fmts.values())) == 1:
        return label, ""
    others = sorted({f"{n} {f}" for n, f in fmts.items() if f != label})
    return label + "*", ", ".join(others)


# ---- one case and its work ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    block: str          # "attention" or "mlp"
    shape: Shape
    label: str          # weight format label
    T: int              # tokens

    @property
    def decode(self):
        return self.T == 1

    @property
    def start_pos(self):
        """Attention decode runs at DECODE_POS (512 keys); prefill and the MLP from 0."""
        return DECODE_POS if (self.decode and self.block == "attention") else 0

    @property
    def formats(self):
        return block_formats(self.block, self.shape, self.label)

    @property
    def weights_key(self):
        """Cases with the same key share one weight set."""
        return (self.block, self.shape, self.label)

    @property
    def id(self):
        return f"{self.shape.name}-{self.block}-T{self.T}-{self.label}"

    @property
    def group(self):
        return f"{self.block} {self.shape.name} T={self.T} {self.label}"

    def weight_bytes(self):
        """Bytes of one copy of the block's weights: what one call streams."""
        s = self.shape
        return sum(weight_rows(s, n) * mf.ck_dtype_row_bytes(DT[f], weight_cols(s, n))
                   for n, f in self.formats.items())

    def macs(self):
        s = self.shape
        return self.T * sum(weight_rows(s, n) * weight_cols(s, n) for n in WEIGHTS[self.block])

    def attention_flops(self):
        """q.k and p.v: 4 * D flops per (head, query, key) pair, causal by absolute position."""
        if self.block != "attention":
            return 0
        s, p0, T = self.shape, self.start_pos, self.T
        pairs = T * p0 + T * (T + 1) // 2
        return 4 * s.D * s.H * pairs

    def flops(self):
        return 2 * self.macs() + self.attention_flops()

    def kv_bytes(self):
        """KV cache bytes attention reads (float32): rows 0 .. the last position, k and v."""
        if self.block != "attention":
            return 0
        s = self.shape
        return 2 * s.G * (self.start_pos + self.T) * s.D * 4

    def activation_bytes(self):
        return 3 * self.T * self.shape.E * 4          # input, residual, output

    def int8(self):
        """True when megafuse's int8 path applies (some weight in a block format)."""
        return any(f != "FP32" for f in self.formats.values())


# ---- which implementations run a case -----------------------------------------------------------
# float64 NumPy written to be read: only on the smallest shape
REFERENCE_CASES = {("attention", "smollm2-135m", 1), ("attention", "smollm2-135m", 128),
                   ("mlp", "smollm2-135m", 1), ("mlp", "smollm2-135m", 128)}
PEERS = ("torch", "ggml", "numpy reference")


def megafuse_variants(case):
    """megafuse's kernels for a case: 'megafuse' (the MLP: mega_fused_mlp_prefill),
    'megafuse decode' (mega_fused_attention_decode, FP32), 'megafuse int8'
    (mega_fused_attention_prefill_q8_0), 'megafuse float' (mega_fused_attention_prefill: float
    activations, weights decoded in registers).  The first is the one peers are checked
    against."""
    if case.block == "mlp":
        return ["megafuse"]
    if case.decode:
        return ["megafuse int8", "megafuse float"] if case.int8() else ["megafuse decode"]
    return ["megafuse int8"] if case.int8() else ["megafuse float"]


def peers(case):
    """PyTorch on FP32 weights, ggml on every format, the reference on a few small cases."""
    out = ["torch"] if case.label == "FP32" else []
    out.append("ggml")
    if case.label == "FP32" and (case.block, case.shape.name, case.T) in REFERENCE_CASES:
        out.append("numpy reference")
    return out


def impl_id(impl):
    return impl.replace(" ", "_")


# cases beyond SHAPES x TOKENS: the FP32 attention-block prefill of Llama-3.2-1B at T = 512, the
# FP32 prefill target against PyTorch (issue 38)
EXTRA_CASES = (("attention", "llama-3.2-1b", "FP32", 512),)


def cases(block):
    """Every case of a block, grouped by weight set (each set is built once), and the reason a
    listed format cannot run on a shape (None when it can)."""
    out = []
    for shape in SHAPES:
        for label in shape.labels:
            why = None
            if block_formats(block, shape, label) is None:
                bad = sorted({weight_cols(shape, n) for n in WEIGHTS[block]})
                why = (f"{label} needs rows of a multiple of {KQUANT_BLOCK} weights; every "
                       f"{block} row of {shape.name} is {' or '.join(map(str, bad))} long "
                       f"(llama.cpp writes {KQUANT_FALLBACK[label]} there: see those rows)")
            for T in TOKENS:
                out.append((Case(block, shape, label, T), why))
    for b, name, label, T in EXTRA_CASES:
        if b == block and T not in TOKENS:
            out.append((Case(block, SHAPE[name], label, T), None))
    return out


def params(block):
    """pytest params (case, impl); an impossible case is one skipped param naming why."""
    import pytest
    out = []
    for case, why in cases(block):
        if why is not None:
            out.append(pytest.param(case, "megafuse", id=f"{case.id}-megafuse",
                                    marks=pytest.mark.skip(reason=why)))
            continue
        for impl in megafuse_variants(case) + peers(case):
            out.append(pytest.param(case, impl, id=f"{case.id}-{impl_id(impl)}"))
    return out
