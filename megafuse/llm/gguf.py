"""megafuse.llm.gguf: reading llama.cpp GGUF files, and the weights of one decoder layer.

``GGUFFile(path)`` is megafuse's own reader (no dependency): the header is parsed with
``struct`` over one read-only mmap of the file (a 49,152-token vocabulary and its merges in about
0.1 s), and every tensor is a read-only NumPy view of that mmap -- no copy.  A truncated or
corrupt file is a ValueError naming the file and what is wrong; a big-endian file is a
NotImplementedError.  Every function here also takes a ``gguf.GGUFReader`` (the ``gguf``
package, which megafuse's tests use to write files).

Which tensors a layer of each architecture has, their shapes and what the loader does to them
is megafuse.llm.arch's table (no tensor name is spelled here).  Weights come in their GGML
format, mapped to ``megafuse.CKDataType``:

    F32 -> FP32, F16 -> FP16, BF16 -> BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K,
    Q4_K, Q5_K, Q6_K, IQ4_XS

A layer tensor of any other type (the IQ1, IQ2 and IQ3 formats, TQ1_0, MXFP4, ...) is a
NotImplementedError naming the tensor and its type.  Three things are copies:

* ``w1``: megafuse takes the gate and the up projection as one [2*I, E] matrix (gate rows, then
  up rows), so ``blk.N.ffn_gate`` and ``blk.N.ffn_up`` are concatenated row-wise (for block
  formats, rows of bytes).  If the two are stored in different formats, both are converted to
  the one with more bits per weight (the gate's on a tie): the other is dequantized and
  requantized with megafuse.quantize (exact when it is a float format; otherwise a small extra
  rounding of that half of w1).
* llama's q / k rows (and their biases; the table's ``permute_qk``): llama.cpp's converter
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
``.context_length``; Llama 3's ``rope_freqs.weight`` tensor, Phi-3's LongRoPE factors, linear
and YaRN RoPE scaling are applied to the RoPE tables; other RoPE scalings and partial rotary
dimensions are NotImplementedError.  Each is checked as it is read: an integer where an integer
is expected (a dimension in 1..2**31 - 1; head counts and feed_forward_length may be one value
per layer, as llama.cpp allows), a number that is finite and > 0 in float64 and in float32
(the kernels' precision) for the epsilon (< 1), the RoPE bases and factors, >= 0 for the
soft-caps; values that contradict each other (head counts, embedding_length, key_length,
rope.dimension_count) are refused too.  Any such value is a ValueError naming the file and the
key.

``check_file`` is what the loaders run before they copy anything: every layer's
hyper-parameters, every tensor's name, presence, shape and type against the architecture's row,
and the vocabulary against the embedding (docs/contract.md §8.7: what a broken file gets).

    layer = megafuse.DecoderLayer.from_gguf("qwen2.5-0.5b-instruct-q8_0.gguf", layer_index=0)
"""
from __future__ import annotations

import enum
import math
import mmap
import os
import re
import struct
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

import megafuse as _mf   # the compiled helpers (megafuse is initialised before this module)
from megafuse.kernels.dtype import CKDataType
from megafuse.llm import arch as _arch
from megafuse.llm.metadata_values import describe as _describe, is_int as _is_int, \
    is_number as _is_number

#: The architectures this module reads: megafuse.llm.arch's table.
ARCHITECTURES: Dict[str, _arch.Architecture] = _arch.ARCHITECTURES

#: GGML type name -> megafuse weight format.
GGML_TO_CK: Dict[str, CKDataType] = {
    "F32": CKDataType.FP32, "F16": CKDataType.FP16, "BF16": CKDataType.BF16,
    "Q4_0": CKDataType.Q4_0, "Q4_1": CKDataType.Q4_1, "Q5_0": CKDataType.Q5_0,
    "Q5_1": CKDataType.Q5_1, "Q8_0": CKDataType.Q8_0, "IQ4_NL": CKDataType.IQ4_NL,
    "Q2_K": CKDataType.Q2_K, "Q3_K": CKDataType.Q3_K, "Q4_K": CKDataType.Q4_K,
    "Q5_K": CKDataType.Q5_K, "Q6_K": CKDataType.Q6_K, "IQ4_XS": CKDataType.IQ4_XS,
}

#: Bits per weight of each format (from ckernel_dtype.h's block sizes and byte counts): decides
#: the common format of a mixed gate / up pair.
BITS_PER_WEIGHT: Dict[CKDataType, float] = {
    dt: _mf.ck_dtype_block_bytes(dt) * 8 / _mf.ck_dtype_block_size(dt)
    for dt in GGML_TO_CK.values()
}

PathOrReader = Union[str, "os.PathLike[str]", "GGUFFile", Any]


# ---- the file format ----------------------------------------------------------------------------
#
# A GGUF file (versions 2 and 3; llama.cpp's ggml/src/gguf.cpp and docs/gguf.md), little-endian:
#
#   "GGUF"  u32 version  u64 tensor_count  u64 kv_count
#   kv_count key / values:    string key, u32 value type, value
#   tensor_count infos:       string name, u32 n_dims, u64 dims[n_dims] (GGML order: columns
#                             first), u32 GGML type, u64 offset (from the start of the data)
#   padding to `general.alignment` (u32, default 32), then the tensor data: each tensor's
#                             right after the one before, padded to the alignment (the first
#                             at offset 0), as llama.cpp's reader requires
#
# A string is u64 length + UTF-8 bytes (no terminator); an array is u32 item type, u64 count,
# the items (arrays of arrays are refused, as llama.cpp refuses them).

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4


class GGUFValueType(enum.IntEnum):
    """The type of a metadata value (gguf's GGUFValueType, llama.cpp's gguf_type)."""
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class GGMLType(enum.IntEnum):
    """The storage type of a tensor (gguf's GGMLQuantizationType, llama.cpp's ggml_type)."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


#: GGML type -> (values per block, bytes per block)
GGML_BLOCK_SIZES: Dict[GGMLType, Tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 40), GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144), GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292), GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98), GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110), GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136), GGMLType.I8: (1, 1), GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4), GGMLType.I64: (1, 8), GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56), GGMLType.BF16: (1, 2), GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17), GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
}

#: The element types a tensor's array has (shape: GGML's dims reversed); every other type
#: (block formats, BF16) is handed out as bytes, shape (..., bytes per row), as gguf does.
_ELEMENT_DTYPES: Dict[GGMLType, str] = {
    GGMLType.F32: "<f4", GGMLType.F16: "<f2", GGMLType.F64: "<f8", GGMLType.I8: "i1",
    GGMLType.I16: "<i2", GGMLType.I32: "<i4", GGMLType.I64: "<i8",
}

#: Scalar value types: (struct format, bytes), little-endian.
_SCALARS: Dict[GGUFValueType, Tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1), GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2), GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4), GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4), GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8), GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}

_HEADER = struct.Struct("<4sIQQ")       # magic, version, tensor count, kv count
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 4 + 1               # empty key, type, a one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims = 0, type, offset


class GGUFField:
    """One metadata key / value: ``name``; ``types`` ([type], or [ARRAY, item type]);
    ``offset`` (of the record in the file); ``value`` (int / float / bool / str, or a list of
    them).  ``contents()`` gives the value as gguf's ReaderField.contents() does."""
    __slots__ = ("name", "offset", "types", "value")

    def __init__(self, name: str, offset: int, types: List[GGUFValueType], value: Any) -> None:
        self.name, self.offset, self.types, self.value = name, offset, types, value

    def contents(self) -> Any:
        """The value (an array: a new list)."""
        return list(self.value) if isinstance(self.value, list) else self.value

    def __repr__(self) -> str:
        kind = "/".join(t.name for t in self.types)
        shown = (f"[{len(self.value)} items]" if isinstance(self.value, list)
                 else repr(self.value)[:60])
        return f"GGUFField({self.name!r}, {kind}, {shown})"


class GGUFTensor(NamedTuple):
    """One tensor: ``shape`` in GGML order (columns first), ``data`` a read-only view of the
    file (no copy) shaped as gguf's reader shapes it: the dims reversed, in bytes per row for
    block formats and BF16 (rows, bytes) and float / int elements otherwise."""
    name: str
    tensor_type: GGMLType
    shape: Tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: npt.NDArray[Any]


class GGUFFile:
    """A GGUF file opened read-only through one mmap: ``fields`` (key -> GGUFField, with
    gguf's three pseudo-keys GGUF.version, GGUF.tensor_count, GGUF.kv_count first),
    ``tensors`` (a list of GGUFTensor in file order; ``tensor_map`` by name), ``data`` (the
    whole file as a read-only uint8 array), ``version``, ``alignment``, ``data_offset``.

    A file that is not GGUF, a version other than 2 and 3, a truncated or corrupt header, a
    tensor past the end of the file, an empty tensor (a dimension of 0) or one of more than
    2**63 - 1 values: ValueError naming the file and what is wrong.  A
    big-endian file: NotImplementedError."""

    byte_order = "I"                    # (as gguf's reader: host order; the other is refused)

    def __init__(self, path: Union[str, os.PathLike[str]]) -> None:
        self.path = os.fsdecode(path)
        self.version, self.alignment, self.data_offset = 0, GGUF_DEFAULT_ALIGNMENT, 0
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER.size:
                raise ValueError(f"{self.path}: truncated or not a GGUF file ({size} bytes, "
                                 f"less than the {_HEADER.size}-byte header)")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = len(self._mmap)     # (what was mapped, should the file have changed since)
        self.data: npt.NDArray[np.uint8] = np.frombuffer(self._mmap, np.uint8)  # [size]
        self.fields: Dict[str, GGUFField] = {}
        self.tensors: List[GGUFTensor] = []
        self.tensor_map: Dict[str, GGUFTensor] = {}
        _Parser(self).parse()

    def get(self, key: str, default: Any = None) -> Any:
        """The value of the metadata key (an array: a list), or default."""
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version {self.version}, {len(self.fields)} fields, "
                f"{len(self.tensors)} tensors)")


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode()
    except UnicodeDecodeError:
        return False
    return True


class _Parser:
    """Reads a GGUFFile's header; every read is bounds-checked first."""

    def __init__(self, file: GGUFFile) -> None:
        self.file = file
        self.buf = file._mmap
        self.size = file.size
        self.pos = 0
        self.next_offset = 0            # where the next tensor's data must start (see tensor())

    # -- errors --------------------------------------------------------------------------

    def error(self, what: str) -> ValueError:
        return ValueError(f"{self.file.path}: {what}")

    def need(self, n: int, what: str, pos: Optional[int] = None) -> int:
        """The start of n bytes at pos (default: the cursor); ValueError if they pass the end
        of the file."""
        start = self.pos if pos is None else pos
        if n > self.size - start:
            raise self.error(f"truncated or corrupt: {what} at byte {start} needs {n} bytes, "
                             f"the file has {self.size}")
        return start

    # -- reads ---------------------------------------------------------------------------

    def u32(self, what: str) -> int:
        start = self.need(4, what)
        self.pos = start + 4
        return int(_U32.unpack_from(self.buf, start)[0])

    def u64(self, what: str) -> int:
        start = self.need(8, what)
        self.pos = start + 8
        return int(_U64.unpack_from(self.buf, start)[0])

    def string(self, what: str) -> str:
        n = self.u64(f"{what}: length")
        start = self.need(n, f"{what}: {n}-byte string")
        self.pos = start + n
        try:
            return str(self.buf[start:start + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(f"{what}: not UTF-8 ({exc.reason} at byte {start + exc.start})") \
                from None

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.u32(f"{what}: value type")
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.error(f"{what}: unknown GGUF value type {raw}") from None

    def value(self, vtype: GGUFValueType, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(key)
        fmt, n = _SCALARS[vtype]
        start = self.need(n, f"{key}: {vtype.name} value")
        self.pos = start + n
        return struct.unpack_from(fmt, self.buf, start)[0]

    def array(self, key: str) -> Tuple[GGUFValueType, List[Any]]:
        itype = self.value_type(f"{key}: array item")
        count = self.u64(f"{key}: array length")
        if itype == GGUFValueType.ARRAY:
            raise self.error(f"{key}: arrays of arrays are not supported")
        least = 8 if itype == GGUFValueType.STRING else _SCALARS[itype][1]
        self.need(count * least, f"{key}: an array of {count} {itype.name} values")
        if itype == GGUFValueType.STRING:
            return itype, self.strings(count, key)
        fmt, n = _SCALARS[itype]
        items = np.frombuffer(self.buf, np.dtype(fmt), count, self.pos)   # [count]
        self.pos += count * n
        return itype, items.tolist()

    def strings(self, count: int, key: str) -> List[str]:
        """count strings: the bytes cut out in a tight loop, then decoded (a vocabulary: ~50k
        tokens and ~50k merges).  The caller checked that count * 8 bytes are left."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        pieces: List[bytes] = []
        append = pieces.append
        for i in range(count):
            if pos + 8 > size:
                self.need(8, f"{key}[{i}]: length", pos)
            end = pos + 8 + unpack(buf, pos)[0]
            if end > size:
                self.need(end - pos - 8, f"{key}[{i}]: {end - pos - 8}-byte string", pos + 8)
            append(buf[pos + 8:end])
            pos = end
        self.pos = pos
        try:
            return [piece.decode() for piece in pieces]
        except UnicodeDecodeError as exc:
            bad = next(i for i, piece in enumerate(pieces) if not _is_utf8(piece))
            raise self.error(f"{key}[{bad}]: not UTF-8 ({exc.reason})") from None

    # -- the file ------------------------------------------------------------------------

    def parse(self) -> None:
        f = self.file
        magic, version, n_tensors, n_kv = _HEADER.unpack_from(self.buf, 0)
        if magic != GGUF_MAGIC:
            raise self.error(f"not a GGUF file (it starts with {magic!r}, expected "
                             f"{GGUF_MAGIC!r})")
        if version not in GGUF_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if version & 0xFFFF == 0 and swapped in GGUF_VERSIONS:
                raise NotImplementedError(f"{f.path}: a big-endian GGUF file (version "
                                          f"{swapped}) is not supported")
            raise self.error(f"GGUF version {version} is not supported (megafuse reads "
                             f"versions {' and '.join(map(str, GGUF_VERSIONS))})")
        f.version = version
        u32, u64 = [GGUFValueType.UINT32], [GGUFValueType.UINT64]
        f.fields = {"GGUF.version": GGUFField("GGUF.version", 4, u32, version),
                    "GGUF.tensor_count": GGUFField("GGUF.tensor_count", 8, u64, n_tensors),
                    "GGUF.kv_count": GGUFField("GGUF.kv_count", 16, u64, n_kv)}
        self.pos = _HEADER.size
        self.need(n_kv * _MIN_KV_BYTES, f"kv_count = {n_kv} key / values")
        for k in range(n_kv):
            offset = self.pos
            key = self.string(f"key / value {k}: key")
            vtype = self.value_type(key)
            if vtype == GGUFValueType.ARRAY:
                itype, value = self.array(key)
                types = [vtype, itype]
            else:
                value, types = self.value(vtype, key), [vtype]
            if key in f.fields:
                raise self.error(f"{key}: duplicate key")
            f.fields[key] = GGUFField(key, offset, types, value)

        align = f.fields.get("general.alignment")
        f.alignment = GGUF_DEFAULT_ALIGNMENT
        if align is not None:
            if align.types != [GGUFValueType.UINT32]:
                raise self.error(f"general.alignment: expected a UINT32, got "
                                 f"{'/'.join(t.name for t in align.types)}")
            if align.value == 0 or align.value & (align.value - 1):
                raise self.error(f"general.alignment = {align.value}: not a power of two")
            f.alignment = int(align.value)

        self.need(n_tensors * _MIN_TENSOR_INFO_BYTES, f"tensor_count = {n_tensors} tensor infos")
        infos = []
        for t in range(n_tensors):
            name = self.string(f"tensor {t}: name")
            n_dims = self.u32(f"{name}: n_dims")
            if n_dims > GGML_MAX_DIMS:
                raise self.error(f"{name}: n_dims = {n_dims}, at most {GGML_MAX_DIMS}")
            start = self.need(8 * n_dims, f"{name}: dims")
            dims = struct.unpack_from(f"<{n_dims}Q", self.buf, start)
            self.pos = start + 8 * n_dims
            raw = self.u32(f"{name}: type")
            offset = self.u64(f"{name}: offset")
            infos.append((name, dims, raw, offset))
        pad = -self.pos % f.alignment
        f.data_offset = self.pos + pad
        for name, dims, raw, offset in infos:
            self.tensor(name, dims, raw, offset)

    def tensor(self, name: str, dims: Tuple[int, ...], raw: int, offset: int) -> None:
        f = self.file
        if name in f.tensor_map:
            raise self.error(f"{name}: duplicate tensor name")
        try:
            ggml_type = GGMLType(raw)
        except ValueError:
            raise self.error(f"{name}: unknown GGML type {raw}") from None
        # An empty tensor is refused first: a 0 dim makes the element count 0 and so hides a
        # huge other dim ([0, 2**62, 4]) from the overflow check below, which NumPy then
        # refuses with an error naming neither the file nor the tensor (and GGML's own check
        # of the element count divides by the dims).  No tensor megafuse reads can be empty.
        if 0 in dims:
            raise self.error(f"{name}: dims {list(dims)}: a dimension of 0 (an empty tensor)")
        block, block_bytes = GGML_BLOCK_SIZES[ggml_type]
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise self.error(f"{name}: {ne0} values per row is not a multiple of the "
                             f"{ggml_type.name} block ({block})")
        n_elements = 1
        for n in dims:
            n_elements *= n
        if max(dims, default=0) >= 2**63 or n_elements >= 2**63:
            raise self.error(f"{name}: dims {list(dims)}: more than 2**63 - 1 values")
        n_bytes = n_elements // block * block_bytes
        if offset % f.alignment:      # (llama.cpp refuses it too: a general.alignment that does
            raise self.error(         # not match the padding would read every tensor shifted)
                f"{name}: data offset {offset} is not a multiple of general.alignment "
                f"({f.alignment})")
        # Each tensor's data follows the one before, padded to the alignment, as llama.cpp's
        # reader requires ("tensor ... has offset ..., expected ..."): a file it refuses is not
        # read here either, and a wrong type, dims or offset in a tensor info (whose data would
        # otherwise be read as valid-looking garbage) shows as an offset out of place.
        if offset != self.next_offset:
            raise self.error(f"{name}: data offset {offset}, expected {self.next_offset} (right "
                             f"after the tensor before, padded to general.alignment = "
                             f"{f.alignment}): a tensor info's type, dims or offset is wrong")
        self.next_offset = offset + n_bytes + (-n_bytes % f.alignment)
        start = f.data_offset + offset
        if start > self.size or n_bytes > self.size - start:
            raise self.error(f"{name}: data at bytes {start}..{start + n_bytes} is past the end "
                             f"of the file ({self.size} bytes)")
        shape = tuple(reversed(dims))
        dtype = _ELEMENT_DTYPES.get(ggml_type)
        if dtype is None:               # block formats, BF16: bytes per row
            dtype, shape = "u1", (*shape[:-1], ne0 // block * block_bytes)
        data = np.frombuffer(self.buf, np.dtype(dtype), n_bytes // np.dtype(dtype).itemsize,
                             start).reshape(shape)
        t = GGUFTensor(name, ggml_type, tuple(dims), n_elements, n_bytes, start, data)
        f.tensors.append(t)
        f.tensor_map[name] = t


def open_reader(source: PathOrReader) -> Any:
    """A ``GGUFFile`` for a path (read-only, memory-mapped); a reader (a GGUFFile, or a
    ``gguf.GGUFReader``) is returned as is."""
    if isinstance(source, (str, bytes, os.PathLike)):
        reader: Any = GGUFFile(os.fsdecode(source))
    elif hasattr(source, "tensors") and hasattr(source, "fields"):
        reader = source
    else:
        raise TypeError(f"reader: expected a path, a megafuse.gguf.GGUFFile or a "
                        f"gguf.GGUFReader, got {type(source).__name__}")
    if getattr(reader, "byte_order", "I") != "I":
        raise NotImplementedError("reader: a GGUF file of the other byte order (big-endian "
                                  "here) is not supported")
    return reader


def ck_dtype(ggml_type: Any, tensor_name: str = "tensor") -> CKDataType:
    """The megafuse format of a GGML type (a GGMLType, a gguf.GGMLQuantizationType or a name);
    NotImplementedError naming the tensor and the type for a format megafuse cannot run."""
    name = getattr(ggml_type, "name", str(ggml_type))
    if name not in GGML_TO_CK:
        raise NotImplementedError(
            f"{tensor_name}: GGML type {name} is not supported by megafuse (supported: "
            f"{', '.join(GGML_TO_CK)})")
    return GGML_TO_CK[name]


def file_name(reader: Any) -> str:
    """How an error names a reader's file: its path (a GGUFFile's, or a gguf.GGUFReader's
    memmap's), else "GGUF file"."""
    path = getattr(reader, "path", None)
    if path is None:
        path = getattr(getattr(reader, "data", None), "filename", None)
    return os.fsdecode(path) if path is not None else "GGUF file"


def _error(reader: Any, what: str) -> ValueError:
    """A ValueError about a file: ``{path}: {what}`` (what names the key or the tensor)."""
    return ValueError(f"{file_name(reader)}: {what}")


def _field(reader: Any, key: str, default: Any = None, index: Optional[int] = None) -> Any:
    """A metadata value, as stored (an array value: its element ``index``, for per-layer
    values; ValueError naming the key if the array has no such element)."""
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
        if not 0 <= index < len(value):
            raise _error(reader, f"{key}: an array of {len(value)} values has no value for "
                                 f"layer {index}")
        return value[index]
    return value


# ---- typed metadata -----------------------------------------------------------------------
#
# A hyper-parameter is checked where it is read, so that a hostile or broken file is a
# ValueError naming the key and what is wrong, not an OverflowError / "invalid literal for
# int()" / IndexError from the conversion, nor (NaN or a negative epsilon) NaN logits later.
# llama.cpp's converter writes the integers as UINT32 and the floats as FLOAT32; any integer
# type is taken (an INT32 or a UINT64 block_count means the same), and an integer for a float.

_REQUIRED: Any = object()      # the default of a key the file must have
_MISSING: Any = object()       # (_metadata: the key is not in the file)


def _metadata(reader: Any, key: str, default: Any, layer: Optional[int] = None,
              n_layers: Optional[int] = None) -> Tuple[Any, str]:
    """(the value of key, its name for errors: ``key`` or ``key[layer]``); the value is
    _MISSING if the file has no such key (ValueError if default is _REQUIRED).  llama.cpp
    allows some keys (the head counts, feed_forward_length) one value per layer: with
    ``layer`` given, an array must have block_count (``n_layers``) values, as llama.cpp too
    requires ("wrong array length"), and gives the layer's; without, an array where one value
    is expected is a ValueError."""
    value = _field(reader, key)
    if value is None:
        if default is _REQUIRED:
            raise _error(reader, f"{key} is missing")
        return _MISSING, key
    if not isinstance(value, list):
        return value, key
    if layer is None:
        raise _error(reader, f"{key}: expected one value, got {_describe(value)}")
    if n_layers is not None and len(value) != n_layers:
        raise _error(reader, f"{key}: expected one value or one per layer (block_count = "
                             f"{n_layers}), got {_describe(value)}")
    if not 0 <= layer < len(value):
        raise _error(reader, f"{key}: {_describe(value)} has no value for layer {layer}")
    return value[layer], f"{key}[{layer}]"


#: The largest dimension, window or count the native step takes (a C int).
MAX_DIM = 2**31 - 1
#: The most layers a GGUF model has: llama.cpp's LLAMA_MAX_LAYERS (it asserts
#: 0 < n_layer <= 512 at load), so that a per-layer list never grows with a corrupt count.
MAX_LAYERS = 512


def _int_field(reader: Any, key: str, default: Any = _REQUIRED, *,
               layer: Optional[int] = None, n_layers: Optional[int] = None,
               minimum: int = 1, maximum: Optional[int] = MAX_DIM, why: str = "") -> Any:
    """An integer hyper-parameter in minimum..maximum (default 1..MAX_DIM: a dimension the
    step takes; maximum None: no bound); default when the key is missing (missing and no
    default: ValueError).  A float, a string, a boolean, an array (unless per-layer: see
    _metadata) or a value out of range: ValueError naming the file and the key (``why``: the
    reason for the maximum, for the message)."""
    value, name = _metadata(reader, key, default, layer, n_layers)
    if value is _MISSING:
        return default
    if not _is_int(value):
        raise _error(reader, f"{name}: expected an integer, got {_describe(value)}")
    if value < minimum:
        raise _error(reader, f"{name}: expected an integer >= {minimum}, got {int(value)}")
    if maximum is not None and value > maximum:
        raise _error(reader, f"{name}: expected an integer <= {maximum}"
                             f"{why or ' (a C int of the native step)'}, got {int(value)}")
    return int(value)


def _float_field(reader: Any, key: str, default: Any = _REQUIRED, *,
                 zero_ok: bool = False) -> Any:
    """A float hyper-parameter, finite and > 0 (an epsilon, a RoPE base or factor: NaN, inf,
    0 or a negative value would give NaN / inf logits, not an error; zero_ok: 0 too, a
    soft-cap's "not capped"), and still so in float32, the kernels' precision (an epsilon of
    1e300 is inf there, and every logit 0); default when the key is missing.  An integer is
    taken; a string, a boolean, an array: ValueError naming the file and the key."""
    value, _ = _metadata(reader, key, default)
    if value is _MISSING:
        return default
    if not _is_number(value):
        raise _error(reader, f"{key}: expected a number, got {_describe(value)}")
    v = float(value)
    lowest = ">= 0" if zero_ok else "> 0"
    if not (math.isfinite(v) and (v > 0 or (zero_ok and v == 0))):
        raise _error(reader, f"{key}: expected a finite value {lowest}, got {v!r}")
    with np.errstate(over="ignore", under="ignore"):
        single = np.float32(v)
    if not (np.isfinite(single) and (single > 0 or v == 0)):
        raise _error(reader, f"{key}: {v!r} is {float(single)!r} in float32, the kernels' "
                             f"precision: expected a value that is finite and {lowest} there")
    return v


def _str_field(reader: Any, key: str, default: Any = _REQUIRED) -> Any:
    """A string value; default when the key is missing.  Not a string: ValueError naming
    the key."""
    value, _ = _metadata(reader, key, default)
    if value is _MISSING:
        return default
    if not isinstance(value, str):
        raise _error(reader, f"{key}: expected a string, got {_describe(value)}")
    return value


def _architecture(reader: Any) -> _arch.Architecture:
    """The row of the file's ``general.architecture`` (megafuse.llm.arch): missing or not a
    string, a ValueError; an architecture megafuse does not run, a NotImplementedError; each
    naming the file."""
    name = _str_field(reader, "general.architecture")
    try:
        return _arch.architecture(name)
    except NotImplementedError as exc:
        raise NotImplementedError(f"{file_name(reader)}: {exc}") from None


def architecture(reader: Any) -> str:
    """``general.architecture``; NotImplementedError unless megafuse.llm.arch has a row for it
    (missing or not a string: ValueError)."""
    return _architecture(open_reader(reader)).name


def _keys(arch: _arch.Architecture) -> Dict[str, str]:
    """{hyper-parameter role: its full GGUF key} of an architecture."""
    return {role: f"{arch.name}.{key}" for role, key in _arch.COMMON_HPARAMS + arch.hparams}


def _block_count(reader: Any, key: Dict[str, str]) -> int:
    L: int = _int_field(reader, key["block_count"], maximum=MAX_LAYERS,
                        why=" (llama.cpp's LLAMA_MAX_LAYERS)")
    return L


def _head_dims(reader: Any, key: Dict[str, str], L: int,
               layer: int) -> Tuple[int, int, int, int, int]:
    """(E, H, G, D, Dv) of a layer: embedding_length, the head counts, key_length (default
    E / H) and value_length (default key_length).  Values that contradict each other are a
    broken file (ValueError naming the file and the keys); NotImplementedError is kept for a
    consistent file that uses what megafuse does not run (hparams decides)."""
    E = _int_field(reader, key["embed_dim"])
    H = _int_field(reader, key["num_heads"], layer=layer, n_layers=L)
    G = _int_field(reader, key["num_kv_heads"], H, layer=layer, n_layers=L)
    if H % G:
        raise _error(reader, f"{key['num_heads']} = {H} is not a multiple of "
                             f"{key['num_kv_heads']} = {G} (query heads share kv heads in "
                             f"equal groups)")
    D = _int_field(reader, key["head_dim"], None)
    if D is None:
        if E % H:
            raise _error(reader, f"{key['embed_dim']} = {E} is not a multiple of "
                                 f"{key['num_heads']} = {H}, and {key['head_dim']} is "
                                 f"missing (head_dim would be embedding_length / head_count)")
        D = E // H
    Dv = _int_field(reader, key["value_dim"], D)
    return E, H, G, D, Dv


def _check_core_shapes(reader: Any, arch: _arch.Architecture) -> None:
    """The file's own tensors against the dimensions of its metadata, before a
    NotImplementedError is raised for a feature: the token embedding's columns (E) and layer
    0's attention matrices (H, G, D; v and the output by value_length).  A corrupt head_count
    or embedding_length then reads as the broken file it is (ValueError), not as an
    unsupported feature (partial rotary dimensions, value_length != key_length, ...)."""
    key = _keys(arch)
    E, H, G, D, Dv = _head_dims(reader, key, _block_count(reader, key), 0)
    names = _tensor_map(reader)
    for spec in _arch.COMMON_MODEL_TENSORS + arch.model_tensors:
        if spec.role == "embedding" and spec.gguf in names:
            ne = [int(n) for n in names[spec.gguf].shape]
            if ne[0] != E:
                raise _error(reader, f"{spec.gguf}: {ne[0]} columns, but {key['embed_dim']} = "
                                     f"{E} (GGML shape {ne})")
    for spec in arch.layer_tensors:
        name = f"blk.0.{spec.gguf}"
        if name in names and spec.role in ("wq", "wk", "wv", "wo", "wqkv"):
            d = Dv if spec.role in ("wv", "wo") else D
            _check_shape(reader, name, _arch.shape_of(spec, {"E": E, "H": H, "G": G, "D": d}))


def hparams(source: PathOrReader, layer_index: int = 0) -> Dict[str, Any]:
    """The hyper-parameters of a file of an architecture megafuse runs (megafuse.llm.arch),
    named as DecoderLayer's keywords: architecture, block_count, context_length, embed_dim,
    num_heads, num_kv_heads, head_dim, intermediate_dim, eps, rope_theta, rope_position_scale
    (per-layer arrays: the value of ``layer_index``).  A missing key, a value of the wrong type,
    a dimension < 1 or past a C int, more than MAX_LAYERS layers, a per-layer array without
    one value per layer, a float that is not finite and > 0 in float32 too, values that
    contradict each other: ValueError naming the file and the key.  A valid value megafuse
    does not run: NotImplementedError naming the file and the key, once every value is read (a
    file both broken and unsupported is a ValueError)."""
    reader = open_reader(source)
    arch = _architecture(reader)
    where = file_name(reader)
    key = _keys(arch)
    L = _block_count(reader, key)
    E, H, G, D, Dv = _head_dims(reader, key, L, layer_index)
    # What megafuse does not run is a NotImplementedError, raised once every value has been
    # read and checked: a file that is broken as well is a ValueError first.
    unsupported: List[str] = []
    if Dv != D:
        unsupported.append(f"{key['value_dim']} = {Dv} differs from key_length = {D}: not "
                           f"supported")
    experts = _int_field(reader, key["expert_count"], None, minimum=0, maximum=None)
    if experts:
        unsupported.append(f"{key['expert_count']} = {experts}: mixture-of-experts layers are "
                           f"not supported")
    rope_dims = _int_field(reader, key["rope_dims"], None, minimum=0)
    if rope_dims is not None and rope_dims > D:
        raise _error(reader, f"{key['rope_dims']} = {rope_dims} is more than head_dim = {D}: "
                             f"RoPE rotates dimensions of a head")
    if rope_dims is not None and rope_dims != D:
        unsupported.append(f"{key['rope_dims']} = {rope_dims}: partial rotary embeddings "
                           f"(head_dim = {D}) are not supported")
    elif D % 2:
        source_of_d = key["head_dim"] if key["head_dim"] in reader.fields else \
            "embedding_length / head_count"
        raise _error(reader, f"head_dim = {D} ({source_of_d}) is odd: RoPE rotates pairs of "
                             f"dimensions")
    scaling = _str_field(reader, key["rope_scaling"], "none")
    position_scale, yarn = 1.0, None
    context = _int_field(reader, key["context_length"], 0, minimum=0, maximum=None)
    original = _int_field(reader, key["rope_original_context"], context or None, maximum=None)
    if scaling in ("linear", "yarn"):
        # llama.cpp reads a factor of 0 as no scaling (rope_freq_scale_train = 1), as we do
        raw = _field(reader, key["rope_scaling_factor"])
        factor = (1.0 if _is_number(raw) and raw == 0
                  else _float_field(reader, key["rope_scaling_factor"], 1.0))
        if scaling == "linear":
            position_scale = 1.0 / factor
        elif original is None:
            raise _error(reader, f"{key['rope_scaling']} = 'yarn' needs "
                                 f"{key['rope_original_context']} (or {key['context_length']})")
        else:
            yarn = (factor, original, _float_field(reader, key["yarn_beta_fast"], 32.0),
                    _float_field(reader, key["yarn_beta_slow"], 1.0))
    elif scaling != "none":
        unsupported.append(f"{key['rope_scaling']} = {scaling!r}: linear and yarn RoPE "
                           f"scaling are supported")
    features = _features(reader, arch, key, L, E, H, D)
    rope_theta = _float_field(reader, key["rope_theta"], 10000.0)
    swa = arch.sliding_window
    rope_theta_swa = rope_theta if swa is None or swa.rope_base is None else swa.rope_base
    rope_theta_swa = _float_field(reader, key["rope_theta_swa"], rope_theta_swa)
    scale_swa = position_scale if swa is None or swa.rope_scaling else 1.0
    intermediate_dim = _int_field(reader, key["intermediate_dim"], layer=layer_index,
                                  n_layers=L)
    eps = _float_field(reader, key["eps"], 1e-6)
    if eps >= 1:    # (finite in float32 up to 3.4e38, where every output underflows to 0)
        raise _error(reader, f"{key['eps']}: expected an epsilon < 1, got {eps!r} (it is added "
                             f"to a row's mean square: a value this size swamps it, and at "
                             f"~1e30 the float32 outputs underflow to 0)")
    # the RoPE tables are scaled by attn_factor, so are q and k, and the scores by its square
    attn_factor = _float_field(reader, key["rope_attn_factor"], 1.0)
    with np.errstate(over="ignore"):
        scores_scale = np.float32(attn_factor) * np.float32(attn_factor)
    if not np.isfinite(scores_scale):
        raise _error(reader, f"{key['rope_attn_factor']}: {attn_factor!r} scales q and k, so "
                             f"the scores by its square, which is inf in float32")
    if unsupported:
        raise NotImplementedError(f"{where}: {unsupported[0]}")
    return {
        "architecture": arch.name,
        "block_count": L,
        "context_length": context,
        "embed_dim": E,
        "num_heads": H,
        "num_kv_heads": G,
        "head_dim": D,
        "intermediate_dim": intermediate_dim,
        "eps": eps,
        "rope_theta": rope_theta,
        "rope_position_scale": position_scale,
        "rope_yarn": yarn,
        "rope_attn_factor": attn_factor,
        "rope_original_context": original or 0,
        "rope_theta_swa": rope_theta_swa,
        "rope_position_scale_swa": scale_swa,
        **features,
    }


def _features(reader: Any, arch: _arch.Architecture, key: Dict[str, str], L: int, E: int,
              H: int, D: int) -> Dict[str, Any]:
    """The layer features of a file (megafuse.llm.arch): embed_scale, attn_scale,
    attn_softcap, final_softcap, gate, sliding_window and window_layers (one bool a layer)."""
    def cap(role: str, default: float) -> float:
        value: float = _float_field(reader, key[role], default, zero_ok=True)
        return value
    window, layers = 0, [False] * L
    swa = arch.sliding_window
    if swa is not None:
        window = _int_field(reader, key["sliding_window"], swa.default_window, minimum=0)
        pattern = _field(reader, key["sliding_window_pattern"])
        if isinstance(pattern, list):
            if len(pattern) != L or not all(isinstance(b, bool) for b in pattern):
                raise _error(reader, f"{key['sliding_window_pattern']}: expected an integer "
                                     f"or one boolean a layer ({L}), got {_describe(pattern)}")
            layers = [bool(b) for b in pattern]
        else:
            n = _int_field(reader, key["sliding_window_pattern"], swa.pattern, minimum=0,
                           maximum=None)
            layers = [n == 0 or i % n < n - 1 for i in range(L)]
        if window == 0:
            layers = [False] * L
    scale_dim = E // H if L in arch.attn_scale_by_embed_at else D
    if scale_dim < 1:       # (only with key_length given: else E is a multiple of H)
        raise _error(reader, f"{key['embed_dim']} = {E} is less than {key['num_heads']} = {H}: "
                             f"a {arch.name} model of {L} layers scales its scores by "
                             f"1/sqrt(embedding_length / head_count)")
    return {
        "embed_scale": float(np.float32(math.sqrt(E))) if arch.embedding_scale == "sqrt_embed"
        else 1.0,
        "attn_scale": 1.0 / math.sqrt(scale_dim),
        "attn_softcap": cap("attn_softcap", arch.attn_softcap),
        "final_softcap": cap("final_softcap", arch.final_softcap),
        "gate": arch.activation,
        "sliding_window": window,
        "window_layers": layers,
    }


def _tensor_map(reader: Any) -> Dict[str, Any]:
    if isinstance(reader, GGUFFile):
        return reader.tensor_map
    cache = getattr(reader, "_megafuse_tensor_map", None)  # a gguf.GGUFReader
    if cache is None:
        cache = {t.name: t for t in reader.tensors}
        try:
            reader._megafuse_tensor_map = cache
        except AttributeError:
            pass
    return cache


def tensor(source: PathOrReader, name: str) -> Tuple[npt.NDArray[Any], CKDataType]:
    """(array, format) of the tensor ``name``, zero-copy: a read-only view of the file of
    shape (rows, cols) -- (rows, bytes per row) for block formats, uint16 bits for BF16 -- or
    (n,) for a vector.  KeyError if the file has no such tensor; ValueError if it is empty (a
    dimension of 0: GGUFFile refuses those already, gguf.GGUFReader reads them)."""
    reader = open_reader(source)
    t = _tensor_map(reader).get(name)
    if t is None:
        raise KeyError(f"{name}: no such tensor in the GGUF file")
    ne = [int(n) for n in t.shape]                       # GGML order: columns first
    if 0 in ne:
        raise ValueError(f"{name}: GGML shape {ne}: a dimension of 0 (an empty tensor)")
    dt = ck_dtype(t.tensor_type, name)
    data = t.data
    if dt == CKDataType.BF16:
        data = data.view(np.uint16)                      # (rows, 2*cols) uint8 -> bfloat16 bits
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    data = data.reshape(-1) if len(ne) == 1 else data.reshape(rows, -1)
    return data, dt


def _ck_dtype_of(reader: Any, name: str) -> CKDataType:
    """The megafuse format of a tensor of the file (NotImplementedError naming the file, the
    tensor and its type)."""
    return ck_dtype(_tensor_map(reader)[name].tensor_type, f"{file_name(reader)}: {name}")


def _float_vector(reader: Any, name: str, size: int) -> npt.NDArray[np.float32]:
    """A norm weight or bias as float32 [size] (zero-copy when stored F32)."""
    _check_shape(reader, name, (size,))
    _ck_dtype_of(reader, name)
    data, dt = tensor(reader, name)
    if dt == CKDataType.FP32:
        out = data.reshape(-1)
    else:
        out = _mf.dequantize(np.ascontiguousarray(data), dt, size).reshape(-1)
    return out


def _check_shape(reader: Any, name: str, shape: Tuple[int, ...]) -> None:
    """The tensor's GGML dims are shape's, reversed (columns first); further dims may only be
    1 (as llama.cpp's check_tensor_dims): else a ValueError naming the file and the tensor."""
    ne = [int(n) for n in _tensor_map(reader)[name].shape]
    want = list(reversed(shape))
    if len(ne) < len(want) or ne[:len(want)] != want or any(n != 1 for n in ne[len(want):]):
        what = (f"a [{shape[0]}, {shape[1]}] matrix" if len(shape) == 2
                else f"a vector of {shape[0]}")
        raise _error(reader, f"{name}: expected GGML shape {want} ({what}), got {ne}")


def _check_matrix(reader: Any, name: str, rows: int, cols: int) -> None:
    _check_shape(reader, name, (rows, cols))


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


def _gate_up(gate: Any, g_dt: CKDataType, up: Any, u_dt: CKDataType, I: int,
             E: int) -> Tuple[npt.NDArray[Any], CKDataType]:
    """w1 = [gate rows; up rows] in one format (see the module docstring for mixed formats)."""
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


def _layer_tensor(reader: Any, name: str, spec: _arch.TensorSpec,
                  dims: Dict[str, int]) -> Tuple[Any, Optional[CKDataType]]:
    """(data, format) of one layer tensor: a matrix as stored (zero-copy), a vector as float32;
    its shape checked against the architecture's rule."""
    shape = _arch.shape_of(spec, dims)
    if len(shape) == 1:
        return _float_vector(reader, name, shape[0]), None
    _check_matrix(reader, name, *shape)
    _ck_dtype_of(reader, name)
    return tensor(reader, name)


_LAYER_TENSOR = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")    # blk.N.<name>, N in decimal


def check_file(source: PathOrReader, *, whole_model: bool = True) -> Dict[str, Any]:
    """Everything megafuse checks in a model file before it reads a weight (Model.from_gguf
    and DecoderLayer.from_gguf run it first, so that a broken file is refused before anything
    is copied or allocated).  Returns the hyper-parameters of layer 0 (``hparams``) and
    ``vocab_size`` (the token embedding's rows; None in a file of layers only).
    whole_model=False (DecoderLayer) takes a file of layers only: the model's own tensors
    are then checked only if the file has them.

    In order: the hyper-parameters of every layer (``hparams``; before one is called
    unsupported, the token embedding and layer 0's attention matrices against them); the
    tensors' names against the architecture's row of megafuse.llm.arch -- a tensor the row does
    not list (``blk.N.x`` of an unknown x, ``blk.N`` with N >= block_count, an unknown model
    tensor) is a ValueError, as llama.cpp refuses it; every required tensor of every layer and
    of the model present; every tensor's GGML shape as its rule says for its layer's
    hyper-parameters, and its type one megafuse runs (else NotImplementedError); the output
    head's rows, ``{arch}.vocab_size`` and the length of ``tokenizer.ggml.tokens`` equal to the
    embedding's rows; the RoPE frequency factors (Llama 3's, LongRoPE's) finite and > 0.  Every
    ValueError and NotImplementedError names the file and the key or the tensor."""
    reader = open_reader(source)
    arch = _architecture(reader)
    try:
        hp = hparams(reader, 0)
    except NotImplementedError:
        _check_core_shapes(reader, arch)        # (a ValueError if the metadata lies)
        raise
    key = _keys(arch)
    L = hp["block_count"]
    names = _tensor_map(reader)
    layer_names = {t.gguf for t in arch.layer_tensors}
    model_specs = {t.gguf: t for t in _arch.COMMON_MODEL_TENSORS + arch.model_tensors}
    layers_present = set()
    for name in names:
        m = _LAYER_TENSOR.fullmatch(name)
        if m is None:
            if name not in model_specs:
                raise _error(reader, f"{name}: not a tensor of a {arch.name} model (it has "
                                     f"{', '.join(sorted(model_specs))} and blk.N.* layer "
                                     f"tensors)")
            continue
        index, rest = m.groups()
        if rest not in layer_names:
            raise _error(reader, f"{name}: not a tensor of a {arch.name} layer (a layer has "
                                 f"{', '.join(sorted(layer_names))})")
        if len(index) > len(str(L)) or int(index) >= L:
            raise _error(reader, f"{name}: a tensor of layer {index}, but {key['block_count']} "
                                 f"= {L} (layers 0..{L - 1})")
        layers_present.add(int(index))
    for layer in range(L):
        for full, spec in arch.tensor_names(layer).items():
            if spec.required and full not in names:
                held = (f"; it has tensors of layers {_ranges(sorted(layers_present))}"
                        if layers_present else "; it has no layer tensors")
                raise _error(reader, f"{full}: a {arch.name} layer needs this tensor; the file "
                                     f"has none ({key['block_count']} = {L}{held})")
    for layer in range(L):
        hl = hp if layer == 0 else hparams(reader, layer)
        dims = {"E": hl["embed_dim"], "H": hl["num_heads"], "G": hl["num_kv_heads"],
                "D": hl["head_dim"], "I": hl["intermediate_dim"]}
        for full, spec in arch.tensor_names(layer).items():
            if full in names:
                _check_shape(reader, full, _arch.shape_of(spec, dims))
                _ck_dtype_of(reader, full)
    E, D = hp["embed_dim"], hp["head_dim"]
    for spec in model_specs.values():
        if spec.required and spec.gguf not in names and whole_model:
            raise _error(reader, f"{spec.gguf}: a {arch.name} model needs this tensor; the file "
                                 f"has none")
    embedding = next(s.gguf for s in model_specs.values() if s.role == "embedding")
    head = next(s.gguf for s in model_specs.values() if s.role == "head")
    rows_of = embedding if embedding in names else head     # (no embedding: a layers' file)
    V: Optional[int] = None
    if rows_of in names:
        ne = [int(n) for n in names[rows_of].shape]
        V = ne[1] if len(ne) > 1 else 1         # (a 1-d matrix: its shape check says so)
    dims = {"E": E, "D": D, "V": V or 0}
    for spec in model_specs.values():
        if spec.gguf not in names:
            continue
        ne = [int(n) for n in names[spec.gguf].shape]
        if spec.gguf == head and len(ne) > 1 and ne[0] == E and ne[1] != V:
            raise _error(reader, f"{spec.gguf}: {ne[1]} rows (the output head's vocabulary), "
                                 f"but {embedding} has {V}")
        _check_shape(reader, spec.gguf, _arch.shape_of(spec, dims))
        _ck_dtype_of(reader, spec.gguf)
    if V is not None:
        _check_vocabulary(reader, key, embedding, V)
    for spec in model_specs.values():       # they divide the RoPE frequencies
        if spec.role in _ROPE_FACTOR_ROLES and spec.gguf in names:
            values = _float_vector(reader, spec.gguf, D // 2)
            if not (np.isfinite(values).all() and (values > 0).all()):
                raise _error(reader, f"{spec.gguf}: expected RoPE frequency factors that are "
                                     f"finite and > 0, got {values.tolist()[:8]}"
                                     f"{' ...' if values.size > 8 else ''}")
    return {**hp, "vocab_size": V}


#: The model tensors that divide the RoPE frequencies (Llama 3's, Phi-3's LongRoPE).
_ROPE_FACTOR_ROLES = ("rope_freq_factors", "rope_factors_long", "rope_factors_short")


def _check_vocabulary(reader: Any, key: Dict[str, str], embedding: str, V: int) -> None:
    """The embedding's V rows are the vocabulary: ``{arch}.vocab_size`` and the length of
    ``tokenizer.ggml.tokens``, where the file has them, must be V (llama.cpp refuses a file
    whose token list and embedding disagree)."""
    if V > MAX_DIM:
        raise _error(reader, f"{embedding}: {V} rows, more than the native step takes "
                             f"({MAX_DIM})")
    vocab = _int_field(reader, key["vocab_size"], None)
    if vocab is not None and vocab != V:
        raise _error(reader, f"{key['vocab_size']} = {vocab}, but {embedding} has {V} rows "
                             f"(one a token)")
    if reader.fields.get("tokenizer.ggml.tokens") is not None:
        tokens = _field(reader, "tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise _error(reader, f"tokenizer.ggml.tokens: expected an array of strings, got "
                                 f"{_describe(tokens)}")
        if len(tokens) != V:
            raise _error(reader, f"tokenizer.ggml.tokens: {len(tokens)} tokens, but {embedding} "
                                 f"has {V} rows (one a token)")


def _ranges(indices: List[int]) -> str:
    """Sorted layer indices as runs: [0, 1, 2, 5] -> "0..2, 5"."""
    runs: List[List[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def model_arrays(source: PathOrReader, dims: Mapping[str, Optional[int]],
                 roles: Optional[Tuple[str, ...]] = None) -> Dict[str, Any]:
    """The model's own tensors (megafuse.llm.arch.COMMON_MODEL_TENSORS and the architecture's
    ``model_tensors``) by role: matrices as (data, format), vectors as float32; None for an
    optional tensor the file lacks.  dims: E, D, V (the vocabulary: None to take the
    embedding's rows).  roles: only these."""
    reader = open_reader(source)
    arch = _architecture(reader)
    names = _tensor_map(reader)
    known: Dict[str, int] = {k: v for k, v in dims.items() if v is not None}
    out: Dict[str, Any] = {}
    for spec in _arch.COMMON_MODEL_TENSORS + arch.model_tensors:
        if roles is not None and spec.role not in roles:
            continue
        if spec.gguf not in names:
            if spec.required:
                raise _error(reader, f"{spec.gguf}: a {arch.name} model needs this tensor; "
                                     f"the file has none")
            out[spec.role] = None
            continue
        if "V" not in known and "V" in spec.shape[:1]:
            known["V"] = int(tensor(reader, spec.gguf)[0].shape[0])
        shape = _arch.shape_of(spec, known)
        if len(shape) == 1:
            out[spec.role] = _float_vector(reader, spec.gguf, shape[0])
        else:
            _check_matrix(reader, spec.gguf, *shape)
            _ck_dtype_of(reader, spec.gguf)
            out[spec.role] = tensor(reader, spec.gguf)
    return out


def rope_freq_factors(arrays: Mapping[str, Any], cache_capacity: int) -> Any:
    """The RoPE frequency divisors a model of these arrays (``layer_arrays``) runs with:
    Llama 3's rope_freqs, or Phi-3's LongRoPE factors -- the long ones when the cache holds
    more than the original context, the short ones otherwise (llama.cpp's choice) -- or None."""
    if arrays.get("rope_freq_factors") is not None:
        return arrays["rope_freq_factors"]
    long, short = arrays.get("rope_factors_long"), arrays.get("rope_factors_short")
    if long is None or short is None:
        return long if long is not None else short
    original = arrays.get("rope_original_context") or 0
    return long if original and cache_capacity > original else short


def layer_arrays(source: PathOrReader, layer_index: int) -> Dict[str, Any]:
    """Everything ``DecoderLayer(...)`` needs for layer ``layer_index``: the weights (stored
    format, zero-copy where possible), their ``dtypes``, the biases, the hyper-parameters, and
    ``context_length`` (for the caller to size the cache).  Which tensors a layer has, their
    shapes and what is done to them is the architecture's row in megafuse.llm.arch."""
    if isinstance(layer_index, bool) or not hasattr(layer_index, "__index__"):
        raise TypeError(f"layer_index: expected an int, got {type(layer_index).__name__}")
    layer_index = int(layer_index.__index__())
    reader = open_reader(source)
    arch = _architecture(reader)
    n_layers = _int_field(reader, _keys(arch)["block_count"])
    if not 0 <= layer_index < n_layers:
        raise ValueError(f"layer_index: expected a layer in 0..{n_layers - 1}, got "
                         f"{layer_index}")
    hp = hparams(reader, layer_index)
    E, H, G, D, I = (hp["embed_dim"], hp["num_heads"], hp["num_kv_heads"], hp["head_dim"],
                     hp["intermediate_dim"])
    dims = {"E": E, "H": H, "G": G, "D": D, "I": I}
    names = _tensor_map(reader)

    found: Dict[str, Any] = {}
    dtypes: Dict[str, CKDataType] = {}
    for full, spec in arch.tensor_names(layer_index).items():
        if full not in names:
            if spec.required:
                raise _error(reader, f"{full}: a {arch.name} layer needs this tensor; the file "
                                     f"has none")
            continue
        data, dt = _layer_tensor(reader, full, spec, dims)
        if spec.parts:                          # a fused tensor, cut into its roles by rows
            row = 0
            assert dt is not None                # (a matrix)
            for role, rows in spec.parts:
                n = _arch.evaluate(rows, dims)
                found[role], dtypes[role] = data[row:row + n], dt
                row += n
        else:
            found[spec.role] = data
            if dt is not None:
                dtypes[spec.role] = dt
    if "w_gate" in found:                       # gate and up as one [2*I, E] matrix
        found["w1"], dtypes["w1"] = _gate_up(found.pop("w_gate"), dtypes.pop("w_gate"),
                                             found.pop("w_up"), dtypes.pop("w_up"), I, E)
    b_gate, b_up = found.pop("b_gate", None), found.pop("b_up", None)
    if b_gate is not None or b_up is not None:
        found["b1"] = np.concatenate([np.zeros(I, np.float32) if b_gate is None else b_gate,
                                      np.zeros(I, np.float32) if b_up is None else b_up])

    if arch.permute_qk:               # llama: put q / k rows back in rotate-half order
        for role, heads in (("wq", H), ("wk", G), ("bq", H), ("bk", G)):
            if found.get(role) is not None:
                found[role] = unpermute_rows(found[role], heads)

    out: Dict[str, Any] = {role: found[role] for role in _arch.MATRIX_ROLES + _arch.NORM_ROLES}
    for role in _arch.BIAS_ROLES + _arch.FEATURE_ROLES:
        out[role] = found.get(role)
    windowed = hp["window_layers"][layer_index]
    rope = model_arrays(reader, dims, roles=("rope_freq_factors", "rope_factors_long",
                                             "rope_factors_short"))
    freq_factors = rope["rope_freq_factors"]
    out.update(
        dtypes=dtypes, embed_dim=E, num_heads=H, num_kv_heads=G, head_dim=D,
        intermediate_dim=I, eps=hp["eps"],
        rope_theta=hp["rope_theta_swa"] if windowed else hp["rope_theta"],
        rope_freq_factors=freq_factors,
        rope_position_scale=(hp["rope_position_scale_swa"] if windowed
                             else hp["rope_position_scale"]),
        window=hp["sliding_window"] if windowed else 0,
        rope_yarn=hp["rope_yarn"], rope_attn_factor=hp["rope_attn_factor"],
        rope_factors_long=rope.get("rope_factors_long"),
        rope_factors_short=rope.get("rope_factors_short"),
        rope_original_context=hp["rope_original_context"],
        attn_scale=hp["attn_scale"], attn_softcap=hp["attn_softcap"], gate=hp["gate"],
        context_length=hp["context_length"])
    return out


__all__ = ["GGUFFile", "GGUFField", "GGUFTensor", "GGUFValueType", "GGMLType",
           "GGML_BLOCK_SIZES", "ARCHITECTURES", "GGML_TO_CK", "BITS_PER_WEIGHT", "open_reader",
           "ck_dtype",
           "architecture", "hparams", "tensor", "unpermute_rows", "permute_rows",
           "layer_arrays", "model_arrays", "rope_freq_factors"]
