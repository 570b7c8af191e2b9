"""megafuse.gguf: the weights of one decoder layer from a llama.cpp GGUF file.

Reads llama- and qwen2-architecture files with the ``gguf`` package (PyPI; an optional
dependency, imported on first use: ``pip install gguf``).  Tensors stay what
``gguf.GGUFReader`` hands out -- read-only memmaps of the file, no copy -- in their GGML format,
mapped to ``megafuse.CKDataType``:

    F32 -> FP32, F16 -> FP16, BF16 -> BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K

A layer tensor of any other type (Q2_K, Q3_K, the IQ formats, ...) is a NotImplementedError
naming the tensor and its type.  Three things are copies:

* ``w1``: megafuse takes the gate and the up projection as one [2*I, E] matrix (gate rows, then
  up rows), so ``blk.N.ffn_gate`` and ``blk.N.ffn_up`` are concatenated row-wise (for block
  formats, rows of bytes).  If the two are stored in different formats, both are converted to
  the one with more bits per weight (the gate's on a tie): the other is dequantized and
  requantized with megafuse.quantize (exact when it is a float format; otherwise a small extra
  rounding of that half of w1).
* llama's ``attn_q`` / ``attn_k`` (and their biases): llama.cpp's converter
  (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders each head's rows from the
  rotate-half pairs (i, i + D/2) of HF transformers to the interleaved pairs (2i, 2i + 1) that
  GGML's "normal" RoPE wants.  megafuse's RoPE is rotate-half, so the rows are put back (row
  2i -> i, 2i+1 -> i + D/2 within each head; whole rows of bytes for block formats).  qwen2
  files use GGML's NEOX RoPE, which is rotate-half already: nothing is permuted.
* norm weights and biases stored in F16 / BF16 are converted to float32.

Hyper-parameters come from the metadata: ``{arch}.embedding_length``,
``.attention.head_count``, ``.attention.head_count_kv`` (default: head_count),
``.attention.layer_norm_rms_epsilon``, ``.rope.freq_base`` (default 10000),
``.feed_forward_length``, ``.attention.key_length`` (default embedding_length / head_count),
``.context_length``; Llama 3's ``rope_freqs.weight`` tensor and linear RoPE scaling are applied
to the RoPE tables; other RoPE scalings (YaRN, ...) and partial rotary dimensions are
NotImplementedError.

    layer = megafuse.DecoderLayer.from_gguf("qwen2.5-0.5b-instruct-q8_0.gguf", layer_index=0)
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

import megafuse as _mf   # the compiled helpers (megafuse is initialised before this module)
from megafuse._dtype import CKDataType

#: The architectures this module reads, and whether llama.cpp permuted their q/k rows.
ARCHITECTURES: Dict[str, bool] = {"llama": True, "qwen2": False}

#: GGML type name -> megafuse weight format.
GGML_TO_CK: Dict[str, CKDataType] = {
    "F32": CKDataType.FP32, "F16": CKDataType.FP16, "BF16": CKDataType.BF16,
    "Q4_0": CKDataType.Q4_0, "Q4_1": CKDataType.Q4_1, "Q5_0": CKDataType.Q5_0,
    "Q5_1": CKDataType.Q5_1, "Q8_0": CKDataType.Q8_0, "Q4_K": CKDataType.Q4_K,
    "Q5_K": CKDataType.Q5_K, "Q6_K": CKDataType.Q6_K,
}

#: Bits per weight of each format (from ckernel_dtype.h's block sizes and byte counts): decides
#: the common format of a mixed gate / up pair.
BITS_PER_WEIGHT: Dict[CKDataType, float] = {
    dt: _mf.ck_dtype_block_bytes(dt) * 8 / _mf.ck_dtype_block_size(dt)
    for dt in GGML_TO_CK.values()
}

PathOrReader = Union[str, "os.PathLike[str]", Any]


def _gguf() -> Any:
    """The ``gguf`` package, or an ImportError that says how to get it."""
    try:
        return importlib.import_module("gguf")
    except ImportError as exc:
        raise ImportError("megafuse.gguf needs the 'gguf' package to read GGUF files: "
                          "pip install gguf  (or pip install 'megafuse[gguf]')") from exc


def open_reader(source: PathOrReader) -> Any:
    """A ``gguf.GGUFReader`` for a path (opened read-only, memory-mapped); a reader is returned
    as is."""
    if isinstance(source, (str, bytes, os.PathLike)):
        reader = _gguf().GGUFReader(os.fsdecode(source), "r")
    elif hasattr(source, "tensors") and hasattr(source, "fields"):
        reader = source
    else:
        raise TypeError(f"reader: expected a gguf.GGUFReader or a path, got "
                        f"{type(source).__name__}")
    if getattr(reader, "byte_order", "I") != "I":
        raise NotImplementedError("reader: a GGUF file of the other byte order (big-endian "
                                  "here) is not supported")
    return reader


def ck_dtype(ggml_type: Any, tensor_name: str = "tensor") -> CKDataType:
    """The megafuse format of a GGML type (a gguf.GGMLQuantizationType or its name);
    NotImplementedError naming the tensor and the type for a format megafuse cannot run."""
    name = getattr(ggml_type, "name", str(ggml_type))
    if name not in GGML_TO_CK:
        raise NotImplementedError(
            f"{tensor_name}: GGML type {name} is not supported by megafuse (supported: "
            f"{', '.join(GGML_TO_CK)})")
    return GGML_TO_CK[name]


def _field(reader: Any, key: str, default: Any = None, index: Optional[int] = None) -> Any:
    """A metadata value (an array value: its element ``index``, for per-layer values)."""
    field = reader.fields.get(key)
    if field is None:
        return default
    if hasattr(field, "contents"):
        value = field.contents()
    else:  # gguf < 0.10
        parts = [field.parts[i] for i in field.data]
        value = parts[0].tolist()[0] if len(parts) == 1 else [p.tolist()[0] for p in parts]
        if isinstance(value, list) and value and isinstance(value[0], int) and \
                field.types and field.types[0].name == "STRING":
            value = bytes(field.parts[-1]).decode()
    if isinstance(value, list) and index is not None and value and \
            not isinstance(value[0], str):
        return value[index]
    return value


def _need(reader: Any, key: str, index: Optional[int] = None) -> Any:
    value = _field(reader, key, index=index)
    if value is None:
        raise ValueError(f"GGUF metadata: {key} is missing")
    return value


def architecture(reader: Any) -> str:
    """``general.architecture``; NotImplementedError unless it is llama or qwen2."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise NotImplementedError(f"general.architecture: megafuse reads "
                                  f"{' and '.join(ARCHITECTURES)} GGUF files, got {arch!r}")
    return str(arch)


def hparams(source: PathOrReader, layer_index: int = 0) -> Dict[str, Any]:
    """The hyper-parameters of a llama / qwen2 file, named as DecoderLayer's keywords:
    architecture, block_count, context_length, embed_dim, num_heads, num_kv_heads, head_dim,
    intermediate_dim, eps, rope_theta, rope_position_scale (per-layer arrays: the value of
    ``layer_index``)."""
    reader = open_reader(source)
    arch = architecture(reader)
    E = int(_need(reader, f"{arch}.embedding_length"))
    H = int(_need(reader, f"{arch}.attention.head_count", layer_index))
    G = int(_field(reader, f"{arch}.attention.head_count_kv", H, layer_index))
    D = int(_field(reader, f"{arch}.attention.key_length", E // H if H else 0))
    Dv = _field(reader, f"{arch}.attention.value_length")
    if Dv is not None and int(Dv) != D:
        raise NotImplementedError(f"{arch}.attention.value_length = {Dv} differs from "
                                  f"key_length = {D}: not supported")
    experts = _field(reader, f"{arch}.expert_count")
    if experts:
        raise NotImplementedError(f"{arch}.expert_count = {experts}: mixture-of-experts layers "
                                  f"are not supported")
    rope_dims = _field(reader, f"{arch}.rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != D:
        raise NotImplementedError(f"{arch}.rope.dimension_count = {rope_dims}: partial rotary "
                                  f"embeddings (head_dim = {D}) are not supported")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    position_scale = 1.0
    if scaling == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        position_scale = 1.0 / factor
    elif scaling not in ("none", None):
        raise NotImplementedError(f"{arch}.rope.scaling.type = {scaling!r}: only linear RoPE "
                                  f"scaling is supported")
    return {
        "architecture": arch,
        "block_count": int(_need(reader, f"{arch}.block_count")),
        "context_length": int(_field(reader, f"{arch}.context_length", 0) or 0),
        "embed_dim": E,
        "num_heads": H,
        "num_kv_heads": G,
        "head_dim": D,
        "intermediate_dim": int(_need(reader, f"{arch}.feed_forward_length", layer_index)),
        "eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_position_scale": position_scale,
    }


def _tensor_map(reader: Any) -> Dict[str, Any]:
    cache = getattr(reader, "_megafuse_tensor_map", None)
    if cache is None:
        cache = {t.name: t for t in reader.tensors}
        try:
            reader._megafuse_tensor_map = cache
        except AttributeError:
            pass
    return cache


def tensor(source: PathOrReader, name: str) -> Tuple[npt.NDArray[Any], CKDataType]:
    """(array, format) of the tensor ``name``, zero-copy: a read-only memmap of the file of
    shape (rows, cols) -- (rows, bytes per row) for block formats, uint16 bits for BF16 -- or
    (n,) for a vector.  KeyError if the file has no such tensor."""
    reader = open_reader(source)
    t = _tensor_map(reader).get(name)
    if t is None:
        raise KeyError(f"{name}: no such tensor in the GGUF file")
    dt = ck_dtype(t.tensor_type, name)
    data = t.data
    if dt == CKDataType.BF16:
        data = data.view(np.uint16)                      # (rows, 2*cols) uint8 -> bfloat16 bits
    ne = [int(n) for n in t.shape]                       # GGML order: columns first
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    data = data.reshape(-1) if len(ne) == 1 else data.reshape(rows, -1)
    return data, dt


def _float_vector(reader: Any, name: str, size: int) -> npt.NDArray[np.float32]:
    """A norm weight or bias as float32 [size] (zero-copy when stored F32)."""
    data, dt = tensor(reader, name)
    if dt == CKDataType.FP32:
        out = data.reshape(-1)
    else:
        import megafuse as _mf
        try:
            out = _mf.dequantize(np.ascontiguousarray(data), dt, size).reshape(-1)
        except ValueError as exc:
            raise ValueError(f"{name}: expected {size} values ({exc})") from None
    if out.size != size:
        raise ValueError(f"{name}: expected {size} values, got {out.size}")
    return out


def _check_matrix(reader: Any, name: str, rows: int, cols: int) -> None:
    t = _tensor_map(reader)[name]
    ne = [int(n) for n in t.shape]
    if ne[:2] != [cols, rows] or any(n != 1 for n in ne[2:]):
        raise ValueError(f"{name}: expected GGML shape [{cols}, {rows}] (a [{rows}, {cols}] "
                         f"matrix), got {ne}")


def unpermute_rows(w: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """Undo llama.cpp's ``LlamaModel.permute`` of q / k rows (or of a bias): within each of the
    n_head heads of D rows, row 2i goes back to i and row 2i+1 to i + D/2.  Works on float
    rows and on rows of block bytes alike (a row is moved whole).  Returns a new C-contiguous
    array of w's shape."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"unpermute_rows: {rows} rows are not n_head = {n_head} heads of an "
                         f"even head_dim")
    half = rows // n_head // 2
    return np.ascontiguousarray(
        w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def permute_rows(w: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """llama.cpp's ``LlamaModel.permute`` itself (rotate-half -> interleaved rows), the inverse
    of ``unpermute_rows``: for writing llama-layout files (tests, converters)."""
    rows = w.shape[0]
    return np.ascontiguousarray(
        w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _gate_up(reader: Any, prefix: str, I: int, E: int) -> Tuple[npt.NDArray[Any], CKDataType]:
    """w1 = [gate rows; up rows] in one format (see the module docstring for mixed formats)."""
    import megafuse as _mf
    gate, g_dt = tensor(reader, f"{prefix}.ffn_gate.weight")
    up, u_dt = tensor(reader, f"{prefix}.ffn_up.weight")
    _check_matrix(reader, f"{prefix}.ffn_gate.weight", I, E)
    _check_matrix(reader, f"{prefix}.ffn_up.weight", I, E)
    if g_dt != u_dt:
        target = u_dt if BITS_PER_WEIGHT[u_dt] > BITS_PER_WEIGHT[g_dt] else g_dt

        def convert(blob: npt.NDArray[Any], dt: CKDataType) -> npt.NDArray[Any]:
            if dt == target:
                return blob
            values = _mf.dequantize(blob, dt, (I, E))
            return values if target == CKDataType.FP32 else _mf.quantize(values, target)

        gate, up, g_dt = convert(gate, g_dt), convert(up, u_dt), target
    if g_dt == CKDataType.FP16:      # float16 and uint16 views of the same bits
        gate, up = gate.view(np.uint16), up.view(np.uint16)
    return np.concatenate([gate.reshape(I, -1), up.reshape(I, -1)], axis=0), g_dt


def layer_arrays(source: PathOrReader, layer_index: int) -> Dict[str, Any]:
    """Everything ``DecoderLayer(...)`` needs for layer ``layer_index``: the weights (stored
    format, zero-copy where possible), their ``dtypes``, the biases, the hyper-parameters, and
    ``context_length`` (for the caller to size the cache)."""
    if isinstance(layer_index, bool) or not hasattr(layer_index, "__index__"):
        raise TypeError(f"layer_index: expected an int, got {type(layer_index).__name__}")
    layer_index = int(layer_index.__index__())
    reader = open_reader(source)
    n_layers = int(_need(reader, f"{architecture(reader)}.block_count"))
    if not 0 <= layer_index < n_layers:
        raise ValueError(f"layer_index: expected a layer in 0..{n_layers - 1}, got "
                         f"{layer_index}")
    hp = hparams(reader, layer_index)
    arch = hp["architecture"]
    E, H, G, D, I = (hp["embed_dim"], hp["num_heads"], hp["num_kv_heads"], hp["head_dim"],
                     hp["intermediate_dim"])
    p = f"blk.{layer_index}"
    names = _tensor_map(reader)

    shapes = {"attn_q": (H * D, E), "attn_k": (G * D, E), "attn_v": (G * D, E),
              "attn_output": (E, H * D), "ffn_down": (E, I)}
    keys = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
            "ffn_down": "w2"}
    out: Dict[str, Any] = {}
    dtypes: Dict[str, CKDataType] = {}
    for gname, (rows, cols) in shapes.items():
        full = f"{p}.{gname}.weight"
        data, dt = tensor(reader, full)
        _check_matrix(reader, full, rows, cols)
        out[keys[gname]], dtypes[keys[gname]] = data, dt
    out["w1"], dtypes["w1"] = _gate_up(reader, p, I, E)

    out["ln1_gamma"] = _float_vector(reader, f"{p}.attn_norm.weight", E)
    out["ln2_gamma"] = _float_vector(reader, f"{p}.ffn_norm.weight", E)
    for gname, key, size in (("attn_q", "bq", H * D), ("attn_k", "bk", G * D),
                             ("attn_v", "bv", G * D), ("attn_output", "bo", E),
                             ("ffn_gate", "b_gate", I), ("ffn_up", "b_up", I),
                             ("ffn_down", "b2", E)):
        full = f"{p}.{gname}.bias"
        out[key] = _float_vector(reader, full, size) if full in names else None
    b_gate, b_up = out.pop("b_gate"), out.pop("b_up")
    if b_gate is not None or b_up is not None:
        out["b1"] = np.concatenate([np.zeros(I, np.float32) if b_gate is None else b_gate,
                                    np.zeros(I, np.float32) if b_up is None else b_up])

    if ARCHITECTURES[arch]:           # llama: put q / k rows back in rotate-half order
        out["wq"] = unpermute_rows(out["wq"], H)
        out["wk"] = unpermute_rows(out["wk"], G)
        if out["bq"] is not None:
            out["bq"] = unpermute_rows(out["bq"], H)
        if out["bk"] is not None:
            out["bk"] = unpermute_rows(out["bk"], G)

    freq_factors = None
    if "rope_freqs.weight" in names:
        freq_factors = _float_vector(reader, "rope_freqs.weight", D // 2)
    out.update(
        dtypes=dtypes, embed_dim=E, num_heads=H, num_kv_heads=G, head_dim=D,
        intermediate_dim=I, eps=hp["eps"], rope_theta=hp["rope_theta"],
        rope_freq_factors=freq_factors, rope_position_scale=hp["rope_position_scale"],
        context_length=hp["context_length"])
    return out


__all__ = ["ARCHITECTURES", "GGML_TO_CK", "BITS_PER_WEIGHT", "open_reader", "ck_dtype",
           "architecture", "hparams", "tensor", "unpermute_rows", "permute_rows",
           "layer_arrays"]
