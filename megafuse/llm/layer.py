"""megafuse.llm.layer: one transformer decoder layer (attention + MLP block) with its KV cache.

A layer runs on the whole-model step with one layer (megafuse.llm._runner.ModelRunner; the same
native call megafuse.Model makes for all its layers): ``prefill`` and ``decode`` are one call
each, without the GIL, on a team of threads kept between calls.  The step is built from the
kernels of the header functions and computes exactly what they compute, chained:

    activations="int8" (the default):
      mega_fused_attention_prefill_q8_0 (the int8 path, for block-quantized weights), then
      mega_fused_mlp_prefill with residual = the attention output;
    activations="float": float32 activations through every projection, whatever the weights:
      mega_fused_attention_prefill, then mega_fused_mlp_prefill_f32;

bit for bit (tests/llm/test_model.py), for prefill and for decode (one token: the prefill path).

Dimension letters (docs/contract.md §3): E = embed_dim, H = num_heads, G = num_kv_heads,
D = head_dim, I = intermediate_dim, T = tokens, C = cache_capacity.  The layer uses no padding
(Ea = E, Da = D, Ia = I).
"""
from __future__ import annotations

import importlib
import math
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

import megafuse as _mf   # the kernels, looked up at call time (this module is imported by
                         # megafuse/__init__.py once they are bound)
from megafuse.kernels.dtype import CKDataType, kv_cache_dtype
from megafuse.llm import arch as _arch
from megafuse.kernels.memory import map_zero_pages as _map_zero_pages
from megafuse.kernels.memory import zeros as _huge_page_zeros

F32Array = npt.NDArray[np.float32]
#: A weight format: a CKDataType, its int value, or its name ("Q8_0", "q4_k", ...).
DTypeLike = Union[CKDataType, int, str]

#: The activation precisions a layer runs with (the ``activations=`` keyword).
ACTIVATIONS: Tuple[str, ...] = ("int8", "float")
#: The weights of a layer, in the order of the header's arguments (megafuse.llm.arch's roles).
WEIGHT_NAMES: Tuple[str, ...] = _arch.MATRIX_ROLES
BIAS_NAMES: Tuple[str, ...] = _arch.BIAS_ROLES
# the formats a `w, w_dt` argument accepts: the header's CK_DT_WEIGHT_FORMATS mask, by block size
_kernels: Any = importlib.import_module("megafuse._kernels")     # (private: not in the stubs)
_runner: Any = importlib.import_module("megafuse.llm._runner")   # (private: not in the stubs)
_WEIGHT_FORMATS = tuple(sorted(
    (dt for dt in CKDataType
     if dt != CKDataType.COUNT and _mf.ck_dtype_supported(_kernels.WEIGHT_FORMATS_MASK, dt)),
    key=lambda dt: (_mf.ck_dtype_block_size(dt), dt.name)))


def as_weight_format(dt: DTypeLike, name: str = "dtype") -> CKDataType:
    """A weight format from a CKDataType, an int or a name (case-insensitive: "q8_0", "FP16")."""
    if isinstance(dt, str):
        key = dt.strip().upper()
        aliases = {"F32": "FP32", "F16": "FP16", "FLOAT32": "FP32", "FLOAT16": "FP16"}
        key = aliases.get(key, key)
        if key not in CKDataType.__members__:
            raise ValueError(f"{name}: expected a weight format name "
                             f"({', '.join(f.name for f in _WEIGHT_FORMATS)}), got {dt!r}")
        value = CKDataType[key]
    elif isinstance(dt, bool) or not hasattr(dt, "__index__"):
        raise TypeError(f"{name}: expected a megafuse.CKDataType, an int or a format name, got "
                        f"{type(dt).__name__}")
    else:
        try:
            value = CKDataType(dt.__index__())
        except ValueError:
            raise ValueError(f"{name}: expected a CKDataType value, got {dt!r}") from None
    if value not in _WEIGHT_FORMATS:
        raise ValueError(f"{name}: expected a weight format "
                         f"({', '.join(f.name for f in _WEIGHT_FORMATS)}), got {value.name}")
    return value


def rope_tables(head_dim: int, max_seq: int, theta: float = 10000.0, *,
                freq_factors: Optional[npt.ArrayLike] = None,
                position_scale: float = 1.0,
                yarn: Optional[Tuple[float, int, float, float]] = None,
                attn_factor: float = 1.0) -> Tuple[F32Array, F32Array]:
    """RoPE tables (cos, sin), each float32 [max_seq, head_dim/2], in the rotate-half convention
    of HF Llama / Qwen2 (docs/contract.md §4):

        angle[p, i] = p * position_scale * theta ** (-2i / head_dim) / freq_factors[i]

    freq_factors (head_dim/2 values, default all 1) are the per-frequency divisors of Llama 3's
    RoPE scaling (GGUF tensor ``rope_freqs.weight``) and of Phi-3's LongRoPE
    (``rope_factors_long`` / ``_short``); position_scale < 1 is linear RoPE scaling
    (1 / factor).

    yarn = (factor, original_context, beta_fast, beta_slow) is YaRN, as llama.cpp and HF apply
    it: frequency i blends its interpolated value (divided by factor) and its original one by a
    ramp over the dims between the correction dims of beta_fast and beta_slow, and every value
    is multiplied by 1 + 0.1 ln(factor).  attn_factor multiplies every value too (GGUF
    ``rope.scaling.attn_factor``: LongRoPE's).  Angles are computed in float64 and rounded once
    to float32.  Angles that are not all finite (a theta <= 0 or NaN, a zero freq factor, a
    huge position_scale: from a broken model file, say) are a ValueError, not NaN tables.
    """
    D, rows = _positive_int(head_dim, "head_dim"), _positive_int(max_seq, "max_seq")
    if D % 2:
        raise ValueError(f"head_dim: expected an even value (rotate-half RoPE), got {D}")
    with np.errstate(all="ignore"):         # (a bad theta or factor: checked below)
        inv_freq = float(theta) ** (-np.arange(0, D, 2, dtype=np.float64) / D)   # [D/2]
        if freq_factors is not None:
            factors = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
            if factors.size != D // 2:
                raise ValueError(f"freq_factors: expected head_dim/2 = {D // 2} values, got "
                                 f"{factors.size}")
            inv_freq = inv_freq / factors
        mscale = float(attn_factor)
        if yarn is not None:
            factor, original, beta_fast, beta_slow = (float(v) for v in yarn)

            def corr_dim(n_rot: float) -> float:    # the dim whose wavelength fits n_rot turns
                return D * math.log(original / (n_rot * 2 * math.pi)) / (2 * math.log(theta))
            low = max(0.0, math.floor(corr_dim(beta_fast)))
            high = min(D - 1.0, math.ceil(corr_dim(beta_slow)))
            ramp = np.clip((np.arange(D // 2) - low) / max(0.001, high - low), 0.0, 1.0)
            keep = 1.0 - ramp                       # 1: the original frequency, 0: interpolated
            inv_freq = inv_freq / factor * (1.0 - keep) + inv_freq * keep
            if factor > 1.0:
                mscale *= 1.0 + 0.1 * math.log(factor)
        positions = np.arange(rows, dtype=np.float64) * float(position_scale)
        angles = positions[:, None] * inv_freq[None, :]                         # [rows, D/2]
    if not (np.isfinite(angles).all() and math.isfinite(mscale)):
        raise ValueError(f"rope_tables: the angles p * position_scale * theta ** (-2i / "
                         f"head_dim) / freq_factors[i] are not all finite (theta = {theta!r}, "
                         f"position_scale = {position_scale!r}"
                         f"{', freq_factors given' if freq_factors is not None else ''})")
    if mscale != 1.0:
        return ((np.cos(angles) * mscale).astype(np.float32),
                (np.sin(angles) * mscale).astype(np.float32))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _activations_arg(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"activations: expected 'int8' or 'float', got {type(value).__name__}")
    if value not in ACTIVATIONS:
        raise ValueError(f"activations: expected 'int8' or 'float', got {value!r}")
    return value


def _nonnegative_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value.__index__() < 0:
        raise ValueError(f"{name}: expected a value >= 0, got {value.__index__()}")
    return int(value.__index__())


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    v = int(value.__index__())
    if v <= 0:
        raise ValueError(f"{name}: expected a positive value, got {v}")
    return v


def _storage_dtypes(dt: CKDataType) -> Tuple[np.dtype[Any], ...]:
    """The NumPy dtypes that may hold a weight of format dt (the kernels' own table)."""
    return tuple(_kernels._weight_storage(dt))


class DecoderLayer:
    """One pre-norm decoder layer (Llama / Qwen2) with its KV cache:

        h   = x + attention(rope(rmsnorm(x, ln1_gamma) @ [wq; wk; wv].T + b)) @ wo.T + bo
        out = h + (silu(z @ Wg.T + bg) * (z @ Wu.T + bu)) @ w2.T + b2,  z = rmsnorm(h, ln2_gamma)

    Weights are kept as given (a read-only memmap stays a memmap: no copy), each in its own
    format.  The KV cache ([G, cache_capacity, D] float32, K and V), the RoPE tables and the
    step's scratch are allocated once.  ``max_tokens``, if given, is the most tokens one
    ``prefill`` call takes (a ValueError beyond; None: any number).

    Build it with :meth:`from_arrays` (float32 or pre-quantized weights) or :meth:`from_gguf`;
    the constructor takes the same keywords as ``from_arrays`` but never converts a weight.
    ``prefill`` and ``decode`` append to the cache; ``reset`` empties it.  Not thread-safe: one
    layer (its cache) per sequence; the kernels themselves use ``megafuse.get_num_threads()``.
    """

    def __init__(self, *, ln1_gamma: npt.ArrayLike, wq: npt.NDArray[Any], wk: npt.NDArray[Any],
                 wv: npt.NDArray[Any], wo: npt.NDArray[Any], ln2_gamma: npt.ArrayLike,
                 w1: npt.NDArray[Any], w2: npt.NDArray[Any],
                 bq: Optional[npt.ArrayLike] = None, bk: Optional[npt.ArrayLike] = None,
                 bv: Optional[npt.ArrayLike] = None, bo: Optional[npt.ArrayLike] = None,
                 b1: Optional[npt.ArrayLike] = None, b2: Optional[npt.ArrayLike] = None,
                 dtype: DTypeLike = CKDataType.FP32,
                 dtypes: Optional[Mapping[str, DTypeLike]] = None,
                 embed_dim: Optional[int] = None, num_heads: int,
                 num_kv_heads: Optional[int] = None, head_dim: Optional[int] = None,
                 intermediate_dim: Optional[int] = None, eps: float = 1e-6,
                 rope_theta: float = 10000.0, cache_capacity: int = 2048,
                 max_tokens: Optional[int] = None,
                 rope_freq_factors: Optional[npt.ArrayLike] = None,
                 rope_position_scale: float = 1.0, activations: str = "int8",
                 kv_dtype: str = "float32", q_norm: Optional[npt.ArrayLike] = None,
                 k_norm: Optional[npt.ArrayLike] = None,
                 post_attn_norm: Optional[npt.ArrayLike] = None,
                 post_ffn_norm: Optional[npt.ArrayLike] = None, window: int = 0,
                 attn_scale: Optional[float] = None, attn_softcap: float = 0.0,
                 gate: str = "silu", rope_yarn: Optional[Tuple[float, int, float, float]] = None,
                 rope_attn_factor: float = 1.0) -> None:
        cache_dtype = kv_cache_dtype(kv_dtype)
        gamma1 = self._vector(ln1_gamma, "ln1_gamma")
        E = _positive_int(embed_dim if embed_dim is not None else gamma1.size, "embed_dim")
        H = _positive_int(num_heads, "num_heads")
        G = _positive_int(num_kv_heads if num_kv_heads is not None else H, "num_kv_heads")
        if H % G:
            raise ValueError(f"num_heads: expected a multiple of num_kv_heads = {G}, got {H}")
        if head_dim is None and E % H:
            raise ValueError(f"head_dim: embed_dim = {E} is not a multiple of num_heads = {H}; "
                             f"give head_dim")
        D = _positive_int(head_dim if head_dim is not None else E // H, "head_dim")
        if D % 2:
            raise ValueError(f"head_dim: expected an even value (rotate-half RoPE), got {D}")
        if intermediate_dim is None:
            if np.ndim(w1) != 2:
                raise ValueError("intermediate_dim: expected a value (w1 is not a 2-D "
                                 "[2*intermediate_dim, ...] array to infer it from)")
            intermediate_dim = np.shape(w1)[0] // 2
        I = _positive_int(intermediate_dim, "intermediate_dim")
        from megafuse.llm.model import cache_capacity_arg, check_cache_memory
        C = cache_capacity_arg(cache_capacity)
        window = _nonnegative_int(window, "window")
        check_cache_memory(C, [window], G, D, cache_dtype, rope_tables=1)
        self.embed_dim, self.num_heads, self.num_kv_heads = E, H, G
        self.head_dim, self.intermediate_dim, self.cache_capacity = D, I, C
        self.eps = float(eps)
        self.rope_theta = float(rope_theta)

        formats = self._formats(dtype, dtypes)
        self.ln1_gamma = self._vector(gamma1, "ln1_gamma", E, "[embed_dim]")
        self.ln2_gamma = self._vector(ln2_gamma, "ln2_gamma", E, "[embed_dim]")
        shapes = {"wq": (H * D, E), "wk": (G * D, E), "wv": (G * D, E), "wo": (E, H * D),
                  "w1": (2 * I, E), "w2": (E, I)}
        given = {"wq": wq, "wk": wk, "wv": wv, "wo": wo, "w1": w1, "w2": w2}
        self._weights: Dict[str, npt.NDArray[Any]] = {}
        self._dtypes: Dict[str, CKDataType] = {}
        for name in WEIGHT_NAMES:
            rows, cols = shapes[name]
            self._weights[name] = self._stored_weight(given[name], name, formats[name], rows,
                                                      cols)
            self._dtypes[name] = formats[name]
        bias_sizes = {"bq": (H * D, "[num_heads*head_dim]"),
                      "bk": (G * D, "[num_kv_heads*head_dim]"),
                      "bv": (G * D, "[num_kv_heads*head_dim]"), "bo": (E, "[embed_dim]"),
                      "b1": (2 * I, "[2*intermediate_dim]"), "b2": (E, "[embed_dim]")}
        biases = {"bq": bq, "bk": bk, "bv": bv, "bo": bo, "b1": b1, "b2": b2}
        self._biases: Dict[str, Optional[F32Array]] = {
            n: None if biases[n] is None else self._vector(biases[n], n, *bias_sizes[n])
            for n in BIAS_NAMES}
        # the layer features of an architecture (megafuse.llm.arch), each optional
        feature_sizes = {"q_norm": (D, "[head_dim]"), "k_norm": (D, "[head_dim]"),
                         "post_attn_norm": (E, "[embed_dim]"),
                         "post_ffn_norm": (E, "[embed_dim]")}
        given_features = {"q_norm": q_norm, "k_norm": k_norm, "post_attn_norm": post_attn_norm,
                          "post_ffn_norm": post_ffn_norm}
        self._features: Dict[str, Optional[F32Array]] = {
            n: None if given_features[n] is None
            else self._vector(given_features[n], n, *feature_sizes[n])
            for n in _arch.FEATURE_ROLES}
        self.window = window
        self.attn_scale = attn_scale
        self.attn_softcap = float(attn_softcap)
        self.gate = str(gate)

        # activations="int8": the int8 path as soon as any weight is block-quantized (with float
        # weights only, the two paths are the same math).  activations="float": float32
        # activations everywhere.
        self._activations = _activations_arg(activations)
        self._int8 = self._activations == "int8" and any(
            _mf.ck_dtype_is_quantized(dt) for dt in self._dtypes.values())

        self.rope_cos, self.rope_sin = rope_tables(D, C, rope_theta, yarn=rope_yarn,
                                                   attn_factor=rope_attn_factor,
                                                   freq_factors=rope_freq_factors,
                                                   position_scale=rope_position_scale)
        # the caches on 2 MiB pages (megafuse.kernels.memory): decode reads them end to end every
        # token; float32, or float16 (kv_dtype: as megafuse.Model's)
        self.kv_dtype = kv_dtype
        # k and v in one mapping, its pages mapped now (not by the first decode: as Model's)
        from megafuse.llm.model import cache_rows
        rows = cache_rows(C, self.window)             # a sliding-window layer: a ring
        caches = _huge_page_zeros((2, G, rows, D), cache_dtype)              # [k|v, G, rows, D]
        _map_zero_pages(caches)
        self.kv_cache_k: npt.NDArray[Any] = caches[0]                          # [G, C, D]
        self.kv_cache_v: npt.NDArray[Any] = caches[1]                          # [G, C, D]
        spec: Dict[str, Any] = {"ln1_gamma": self.ln1_gamma, "ln2_gamma": self.ln2_gamma,
                                "k_cache": self.kv_cache_k, "v_cache": self.kv_cache_v}
        spec.update(self._weights)
        spec.update(self._biases)
        spec.update(self._features)
        spec["window"] = self.window
        spec.update({name + "_dt": int(dt) for name, dt in self._dtypes.items()})
        self._runner = _runner.ModelRunner(
            layers=[spec], embed_dim=E, num_heads=H, num_kv_heads=G, head_dim=D,
            intermediate_dim=I, cache_capacity=C, eps=self.eps, rope_cos=self.rope_cos,
            rope_sin=self.rope_sin, activations=self._activations, attn_scale=attn_scale,
            attn_softcap=self.attn_softcap, gate=self.gate)
        self._position = 0
        self.max_tokens: Optional[int] = (None if max_tokens is None
                                          else _positive_int(max_tokens, "max_tokens"))

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_arrays(cls, *, ln1_gamma: npt.ArrayLike, wq: npt.NDArray[Any],
                    wk: npt.NDArray[Any], wv: npt.NDArray[Any], wo: npt.NDArray[Any],
                    ln2_gamma: npt.ArrayLike, w1: npt.NDArray[Any], w2: npt.NDArray[Any],
                    bq: Optional[npt.ArrayLike] = None, bk: Optional[npt.ArrayLike] = None,
                    bv: Optional[npt.ArrayLike] = None, bo: Optional[npt.ArrayLike] = None,
                    b1: Optional[npt.ArrayLike] = None, b2: Optional[npt.ArrayLike] = None,
                    dtype: DTypeLike = CKDataType.FP32,
                    dtypes: Optional[Mapping[str, DTypeLike]] = None,
                    embed_dim: Optional[int] = None, num_heads: int,
                    num_kv_heads: Optional[int] = None, head_dim: Optional[int] = None,
                    intermediate_dim: Optional[int] = None, eps: float = 1e-6,
                    rope_theta: float = 10000.0, cache_capacity: int = 2048,
                    max_tokens: Optional[int] = None,
                    rope_freq_factors: Optional[npt.ArrayLike] = None,
                    rope_position_scale: float = 1.0,
                    activations: str = "int8", kv_dtype: str = "float32",
                    q_norm: Optional[npt.ArrayLike] = None,
                    k_norm: Optional[npt.ArrayLike] = None,
                    post_attn_norm: Optional[npt.ArrayLike] = None,
                    post_ffn_norm: Optional[npt.ArrayLike] = None, window: int = 0,
                    attn_scale: Optional[float] = None, attn_softcap: float = 0.0,
                    gate: str = "silu",
                    rope_yarn: Optional[Tuple[float, int, float, float]] = None,
                    rope_attn_factor: float = 1.0) -> DecoderLayer:
        """A layer from NumPy weights in the torch ``Linear.weight`` layout:

        wq [H*D, E], wk / wv [G*D, E], wo [E, H*D], w1 [2*I, E] (the gate rows, then the up
        rows), w2 [E, I]; ln1_gamma / ln2_gamma [E]; biases (optional) bq [H*D], bk / bv [G*D],
        bo [E], b1 [2*I], b2 [E].

        Formats: ``dtype`` for every weight (default FP32), ``dtypes`` per weight
        ({"w2": "Q6_K", ...}; a CKDataType, an int or a name).  A float32 weight whose format
        is not FP32 is converted here (``megafuse.quantize``); any other array (uint8 block
        bytes, float16 / uint16 FP16, uint16 BF16 bits) is taken as already stored in its format
        and used as is, without a copy.

        Hyper-parameters: embed_dim (default ln1_gamma.size), num_heads, num_kv_heads (default
        num_heads), head_dim (default embed_dim // num_heads), intermediate_dim (default
        w1.shape[0] // 2), eps, rope_theta, cache_capacity (KV-cache positions: an integer
        whose cache and RoPE tables the machine can hold, megafuse.llm.model.check_cache_memory),
        max_tokens (the most tokens one prefill call takes; None: any), rope_freq_factors /
        rope_position_scale / rope_yarn / rope_attn_factor (see ``rope_tables``: freq_factors,
        position_scale, yarn, attn_factor).

        activations: "int8" (default) takes the int8 path whenever a weight is block-quantized
        (activations quantized to Q8_0 / Q8_K for those weights' integer dot products); "float"
        keeps float32 activations through every projection (mega_fused_attention_prefill and
        mega_fused_mlp_prefill_f32: block-format weights dequantized as they are read).

        kv_dtype: what the KV cache (``kv_cache_k`` / ``kv_cache_v``) holds, "float32" (default)
        or "float16" (k and v rounded to float16 as they are written; see ``megafuse.Model``).

        Layer features of the architectures of megafuse.llm.arch (each off by default):
        q_norm / k_norm [head_dim] (RMSNorm of each q / k head before RoPE), post_attn_norm /
        post_ffn_norm [embed_dim] (sandwich norms: each block's output normalised before the
        residual add), window (sliding-window attention over the last `window` positions; the
        cache is then a ring of window + 128 rows), attn_scale (the scores' scale, default
        1/sqrt(head_dim)), attn_softcap (scores capped at softcap * tanh(s / softcap); 0: not),
        gate ("silu" or "gelu_tanh": the MLP gate's activation).
        """
        formats = cls._formats(dtype, dtypes)
        given = {"wq": wq, "wk": wk, "wv": wv, "wo": wo, "w1": w1, "w2": w2}
        converted: Dict[str, npt.NDArray[Any]] = {}
        for name, arr in given.items():
            a = np.asarray(arr)
            if a.dtype == np.float32 and formats[name] != CKDataType.FP32:
                cols = a.shape[-1] if a.ndim >= 2 else None
                if cols is None:
                    raise ValueError(f"{name}: expected a 2-D float32 [rows, cols] array to "
                                     f"convert to {formats[name].name}, got shape {a.shape}")
                block = _mf.ck_dtype_block_size(formats[name])
                if cols % block:
                    raise ValueError(f"{name}: {formats[name].name} stores rows in whole blocks "
                                     f"of {block} weights, but the weight has {cols} columns")
                a = _mf.quantize(a, formats[name])
            converted[name] = a
        return cls(ln1_gamma=ln1_gamma, ln2_gamma=ln2_gamma, bq=bq, bk=bk, bv=bv, bo=bo, b1=b1,
                   b2=b2, dtypes=formats, embed_dim=embed_dim, num_heads=num_heads,
                   num_kv_heads=num_kv_heads, head_dim=head_dim,
                   intermediate_dim=intermediate_dim, eps=eps, rope_theta=rope_theta,
                   cache_capacity=cache_capacity, max_tokens=max_tokens,
                   rope_freq_factors=rope_freq_factors,
                   rope_position_scale=rope_position_scale, activations=activations,
                   kv_dtype=kv_dtype, q_norm=q_norm, k_norm=k_norm, post_attn_norm=post_attn_norm,
                   post_ffn_norm=post_ffn_norm, window=window, attn_scale=attn_scale,
                   attn_softcap=attn_softcap, gate=gate, rope_yarn=rope_yarn,
                   rope_attn_factor=rope_attn_factor, wq=converted["wq"],
                   wk=converted["wk"], wv=converted["wv"], wo=converted["wo"],
                   w1=converted["w1"], w2=converted["w2"])

    @classmethod
    def from_gguf(cls, reader: Any, layer_index: int, *, cache_capacity: Optional[int] = None,
                  max_tokens: Optional[int] = None,
                  activations: str = "int8", kv_dtype: str = "float32") -> DecoderLayer:
        """Layer ``layer_index`` of a GGUF file of an architecture of megafuse.llm.arch (the
        whole file checked first, as by ``Model.from_gguf``: a file of layers only is taken).

        reader: a path, a ``megafuse.llm.gguf.GGUFFile`` or a ``gguf.GGUFReader``.  Weights stay
        read-only views of the file in their GGML format, except w1 (gate and up rows
        concatenated) and llama's wq / wk (rows put back in rotate-half order), which are
        copies.  Hyper-parameters come from the metadata; cache_capacity defaults to
        min(context length, 4096); activations and kv_dtype as in ``from_arrays``.  See
        ``megafuse.llm.gguf``.
        """
        from megafuse.llm import gguf as _gguf
        from megafuse.llm.model import (cache_capacity_arg, default_cache_capacity,
                                        warn_past_context)
        if cache_capacity is not None:
            cache_capacity_arg(cache_capacity)
        source = _gguf.open_reader(reader)
        _gguf.check_file(source, whole_model=False)     # the file, before anything is copied
        kwargs = _gguf.layer_arrays(source, layer_index)
        context_length = kwargs.pop("context_length")
        if cache_capacity is None:
            cache_capacity = default_cache_capacity(context_length)
        kwargs["rope_freq_factors"] = _gguf.rope_freq_factors(kwargs, cache_capacity)
        for name in ("rope_factors_long", "rope_factors_short", "rope_original_context"):
            kwargs.pop(name)
        layer = cls(cache_capacity=cache_capacity, max_tokens=max_tokens, activations=activations,
                    kv_dtype=kv_dtype, **kwargs)
        warn_past_context(layer.cache_capacity, context_length)
        return layer

    @staticmethod
    def _formats(dtype: DTypeLike,
                 dtypes: Optional[Mapping[str, DTypeLike]]) -> Dict[str, CKDataType]:
        base = as_weight_format(dtype, "dtype")
        formats = {name: base for name in WEIGHT_NAMES}
        for name, dt in (dtypes or {}).items():
            if name not in formats:
                raise ValueError(f"dtypes: expected keys among {', '.join(WEIGHT_NAMES)}, got "
                                 f"{name!r}")
            formats[name] = as_weight_format(dt, f"dtypes[{name!r}]")
        return formats

    @staticmethod
    def _vector(arr: Any, name: str, size: Optional[int] = None,
                shape: str = "") -> F32Array:
        a = np.asarray(arr)
        if a.dtype != np.float32:
            if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
                raise TypeError(f"{name}: expected float32 values, got dtype {a.dtype}")
            a = a.astype(np.float32)
        a = np.ascontiguousarray(a).reshape(-1)
        if size is not None and a.size != size:
            raise ValueError(f"{name}: expected {shape} = {size} values, got {a.size}")
        return a

    @staticmethod
    def _stored_weight(arr: npt.ArrayLike, name: str, dt: CKDataType, rows: int,
                       cols: int) -> npt.NDArray[Any]:
        """arr checked as a [rows, cols] weight stored in format dt (no conversion)."""
        arr = np.asarray(arr)
        allowed = _storage_dtypes(dt)
        if arr.dtype not in allowed:
            hint = (" (a float32 weight is converted only by DecoderLayer.from_arrays)"
                    if arr.dtype == np.float32 else "")
            raise TypeError(f"{name}: a {dt.name} weight is stored as "
                            f"{' or '.join(str(d) for d in allowed)}, got {arr.dtype}{hint}")
        block = _mf.ck_dtype_block_size(dt)
        if cols % block:
            raise ValueError(f"{name}: {dt.name} stores rows in whole blocks of {block} weights, "
                             f"but [{rows}, {cols}] has {cols} columns")
        if block > 1:
            want = rows * int(_mf.ck_dtype_row_bytes(dt, cols))
            what = f"{rows} rows x {_mf.ck_dtype_row_bytes(dt, cols)} bytes"
        else:
            want, what = rows * cols, f"[{rows}, {cols}]"
        if arr.size != want:
            unit = "bytes" if block > 1 else "values"
            raise ValueError(f"{name}: expected {what} = {want} {unit} of {dt.name}, got "
                             f"{arr.size} (shape {arr.shape})")
        if not (arr.flags.c_contiguous and arr.flags.aligned):
            arr = np.array(arr, order="C")            # a copy: C-contiguous and aligned
        return arr

    # ---- state -------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Tokens in the KV cache: the absolute position of the next token."""
        return self._position

    def reset(self) -> None:
        """Empty the KV cache (position 0).  The cache rows are not cleared: positions at or
        after ``position`` are always written before they are read."""
        self._position = 0

    @property
    def weights(self) -> Dict[str, Optional[npt.NDArray[Any]]]:
        """Every parameter by its header name (wq ... w2 as stored; gammas and biases float32,
        None for an absent bias)."""
        out: Dict[str, Optional[npt.NDArray[Any]]] = {"ln1_gamma": self.ln1_gamma,
                                                       "ln2_gamma": self.ln2_gamma}
        out.update(self._weights)
        out.update(self._biases)
        return out

    @property
    def dtypes(self) -> Dict[str, CKDataType]:
        """The format of each weight (wq, wk, wv, wo, w1, w2)."""
        return dict(self._dtypes)

    @property
    def activations(self) -> str:
        """"int8" or "float": the ``activations=`` the layer was built with."""
        return self._activations

    @property
    def int8_path(self) -> bool:
        """True when the layer quantizes activations: activations="int8" and some weight is
        block-quantized (activations are then quantized to Q8_0 / Q8_K for those weights'
        integer dot products)."""
        return self._int8

    @property
    def weight_bytes(self) -> int:
        """Bytes of every parameter (weights, biases, gammas): what one call streams."""
        return sum(int(a.nbytes) for a in self.weights.values() if a is not None)

    def __repr__(self) -> str:
        formats = ", ".join(f"{n}={dt.name}" for n, dt in self._dtypes.items())
        return (f"DecoderLayer(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"intermediate_dim={self.intermediate_dim}, {formats}, "
                f"activations={self._activations!r}, "
                f"position={self._position}/{self.cache_capacity})")

    # ---- running -----------------------------------------------------------------------------

    def _check_room(self, tokens: int, what: str) -> None:
        if self._position + tokens > self.cache_capacity:
            raise ValueError(
                f"{what}: {tokens} token{'s' if tokens != 1 else ''} at position "
                f"{self._position} would need cache positions up to "
                f"{self._position + tokens - 1}, but cache_capacity is {self.cache_capacity} "
                f"(reset() the layer, or build it with a larger cache_capacity); the cache is "
                f"unchanged")

    def _input(self, x: Any, ndim: int, what: str) -> F32Array:
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        if a.dtype != np.float32 and not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"{what}: expected float32 hidden states, got dtype {a.dtype}")
        if ndim == 1 and a.ndim == 2 and a.shape[0] == 1:
            a = a.reshape(-1)
        if a.ndim != ndim or a.shape[-1] != self.embed_dim or (ndim == 2 and a.shape[0] == 0):
            expected = "[tokens, embed_dim]" if ndim == 2 else "[embed_dim]"
            raise ValueError(f"{what}: expected x of shape {expected} with embed_dim = "
                             f"{self.embed_dim}, got shape {a.shape}")
        if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.aligned:
            return a
        return np.require(a, dtype=np.float32, requirements=("C", "A"))

    def prefill(self, x: npt.ArrayLike) -> F32Array:
        """Run the layer on x [T, embed_dim] (float32; the tokens at positions position ..
        position+T-1) and return the new hidden states [T, embed_dim] (a new array; x is not
        changed).  Their k, v are appended to the cache.  A prompt may be prefilled in chunks:
        each call continues at ``position``.  Raises ValueError, before touching the cache,
        when position + T > cache_capacity or T > max_tokens.
        """
        xa = self._input(x, 2, "prefill")
        tokens = int(xa.shape[0])
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise ValueError(f"prefill: {tokens} tokens exceed max_tokens = {self.max_tokens} "
                             f"(the most this layer was built to take in one call); the cache "
                             f"is unchanged")
        self._check_room(tokens, "prefill")
        out = np.empty((tokens, self.embed_dim), dtype=np.float32)
        self._runner.forward(x=xa, start_pos=self._position, x_out=out)
        self._position += tokens
        return out

    def decode(self, x: npt.ArrayLike) -> F32Array:
        """Run the layer on one token x [embed_dim] at position ``position``; returns the new
        hidden state [embed_dim].  The prefill path with one token: equal to row N of a
        prefill of N+1 tokens within the tolerance of docs/contract.md §4 (bit for bit on the
        int8 path)."""
        xa = self._input(x, 1, "decode")
        self._check_room(1, "decode")
        out = np.empty(self.embed_dim, dtype=np.float32)
        self._runner.forward(x=xa, start_pos=self._position, x_out=out)
        self._position += 1
        return out

    def reference(self, x: npt.ArrayLike, *,
                  quantize_activations: Optional[bool] = None) -> F32Array:
        """What ``prefill(x)`` on an empty cache computes, by ``megafuse.reference`` (plain
        NumPy, float64 math, weights dequantized bit for bit).  quantize_activations=None
        (default) follows the layer: the int8 path's emulation when ``int8_path``, else pure
        float math (activations="float", or float weights only); False is pure float math and
        True the int8 path's emulation whatever the layer runs.  The layer's own cache and
        position are not touched.  Slow: for checking, not for running."""
        if quantize_activations is None:
            quantize_activations = self._int8
        # (imported by name: megafuse.reference is plain untyped NumPy, not part of the stubs)
        ref: Any = importlib.import_module("megafuse.reference")
        xa = self._input(x, 2, "reference")
        T = int(xa.shape[0])
        if T > self.cache_capacity:  # noqa: SIM300 -- T is the token count, not a constant
            raise ValueError(f"reference: {T} tokens exceed cache_capacity = "
                             f"{self.cache_capacity}")
        spec: Dict[str, Any] = {"ln1_gamma": self.ln1_gamma, "ln2_gamma": self.ln2_gamma,
                                "window": self.window}
        spec.update(self._weights)
        spec.update(self._biases)
        spec.update(self._features)
        spec.update({name + "_dt": int(dt) for name, dt in self._dtypes.items()})
        out: F32Array = ref.layer_forward(
            xa, spec, self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim,
            self.intermediate_dim, self.eps, self.rope_cos, self.rope_sin,
            quantize_activations=quantize_activations, kv_dtype=self.kv_dtype,
            attn_scale=self.attn_scale, attn_softcap=self.attn_softcap, gate=self.gate)
        return out

    # ---- figures for benchmarks --------------------------------------------------------------

    def flops(self, tokens: int, start_pos: int = 0) -> int:
        """Floating-point operations (multiply + add = 2) of tokens at positions start_pos ..
        start_pos+tokens-1: the six projections, 2*tokens*(H*D*E + 2*G*D*E + E*H*D + 3*I*E),
        plus attention, 4*H*D per (query, visible key) pair."""
        E, H, G, D, I = (self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim,
                         self.intermediate_dim)
        proj = 2 * tokens * (H * D * E + 2 * G * D * E + E * H * D + 3 * I * E)
        pairs = tokens * start_pos + tokens * (tokens + 1) // 2       # sum of (position + 1)
        return int(proj + 4 * H * D * pairs)

    def bytes_moved(self, tokens: int, start_pos: int = 0) -> int:
        """Bytes a call must move at least: every parameter once, the K and V cache rows of
        positions 0 .. start_pos+tokens-1 once, and the input and output rows."""
        kv = 2 * self.num_kv_heads * (start_pos + tokens) * self.head_dim * 4
        return int(self.weight_bytes + kv + 2 * tokens * self.embed_dim * 4)


__all__ = ["DecoderLayer", "rope_tables", "as_weight_format", "WEIGHT_NAMES", "ACTIVATIONS"]
