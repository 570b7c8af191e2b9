"""Rewriting a GGUF file with changes, byte by byte under the test's control: for the broken-file
tests (tests/llm/test_broken_files.py) and the loader fuzz (tests/llm/fuzz_loader.py).

    doc = GGUFDoc(path)                          # read with megafuse's own reader
    doc.set("llama.block_count", 3, V.UINT32)    # a value of any type, or an array
    doc.drop_tensor("blk.1.ffn_down.weight")
    doc.write(out, tensor_count=...)             # header counts may be rewritten (lies)

No third-party package: the fuzz runs it in a bare subprocess."""
import struct

import numpy as np

from megafuse.llm.gguf import GGUF_DEFAULT_ALIGNMENT, GGUFFile, GGUFValueType

V = GGUFValueType
#: struct formats of the scalar value types (little-endian)
_FORMATS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
            V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q",
            V.FLOAT64: "<d"}


def _string(text):
    data = text.encode() if isinstance(text, str) else bytes(text)
    return struct.pack("<Q", len(data)) + data


def _value(vtype, value):
    if vtype == V.STRING:
        return _string(value)
    return struct.pack(_FORMATS[vtype], value)


class GGUFDoc:
    """A GGUF file as editable lists: ``fields`` {key: (types, value)} in file order (types as
    GGUFField.types: [type] or [ARRAY, item type]) and ``tensors`` [[name, dims (GGML order),
    GGML type, data bytes]] in file order."""

    def __init__(self, path):
        f = GGUFFile(path)
        self.version = f.version
        self.fields = {k: (list(v.types), v.contents()) for k, v in f.fields.items()
                       if not k.startswith("GGUF.")}
        raw = f.data
        self.tensors = [[t.name, list(t.shape), int(t.tensor_type),
                         raw[t.data_offset:t.data_offset + t.n_bytes].tobytes()]
                        for t in f.tensors]
        del f, raw

    # ---- edits ------------------------------------------------------------------------------

    def set(self, key, value, vtype, item_type=None):
        """key = value of vtype (an array: vtype ARRAY, item_type, value a list)."""
        types = [vtype] if item_type is None else [vtype, item_type]
        self.fields[key] = (types, value)
        return self

    def drop(self, key):
        self.fields.pop(key, None)
        return self

    def index(self, name):
        return next(i for i, t in enumerate(self.tensors) if t[0] == name)

    def drop_tensor(self, name):
        del self.tensors[self.index(name)]
        return self

    def rename_tensor(self, name, new):
        self.tensors[self.index(name)][0] = new
        return self

    def add_tensor(self, name, values):
        """An F32 tensor of a float32 array (GGML dims: its shape reversed)."""
        a = np.ascontiguousarray(values, dtype=np.float32)
        self.tensors.append([name, list(reversed(a.shape)), 0, a.tobytes()])
        return self

    def copy_tensor(self, name, new):
        t = self.tensors[self.index(name)]
        self.tensors.append([new, list(t[1]), t[2], t[3]])
        return self

    # ---- bytes ------------------------------------------------------------------------------

    def header_and_data(self, *, tensor_count=None, kv_count=None):
        """(the header's bytes: magic .. the tensor infos, padded; the data) with the counts
        written as given (default: the true ones)."""
        align = GGUF_DEFAULT_ALIGNMENT
        given = self.fields.get("general.alignment", (None, None))[1]
        if type(given) is int and 0 < given <= 2**16 and not given & (given - 1):
            align = given           # (a hostile alignment is written, not followed)
        out = [struct.pack("<4sIQQ", b"GGUF", self.version,
                           len(self.tensors) if tensor_count is None else tensor_count,
                           len(self.fields) if kv_count is None else kv_count)]
        for key, (types, value) in self.fields.items():
            out.append(_string(key) + struct.pack("<I", types[0]))
            if types[0] == V.ARRAY:
                out.append(struct.pack("<IQ", types[1], len(value)))
                out.extend(_value(types[1], item) for item in value)
            else:
                out.append(_value(types[0], value))
        data, offset = [], 0
        for name, dims, ggml_type, blob in self.tensors:
            out.append(_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims,
                                                   ggml_type, offset))
            pad = -len(blob) % align
            data.append(blob + b"\0" * pad)
            offset += len(blob) + pad
        header = b"".join(out)
        header += b"\0" * (-len(header) % align)
        return header, b"".join(data)

    def to_bytes(self, **counts):
        header, data = self.header_and_data(**counts)
        return header + data

    def write(self, path, **counts):
        with open(path, "wb") as f:
            f.write(self.to_bytes(**counts))
        return path
