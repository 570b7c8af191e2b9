"""megafuse.gguf.GGUFFile, megafuse's own GGUF reader: the same fields and tensors as
gguf.GGUFReader (every key, type and value; every tensor's name, type, GGML shape, offset and
bytes, and the array shape and dtype it is handed out with) on the real SmolLM2 file and on
every kind of file the other tests write; zero-copy, read-only views; and every corrupt or
truncated file a ValueError naming the file and what is wrong (big-endian files a
NotImplementedError), never another exception."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import megafuse  # noqa: E402
from megafuse.llm.gguf import GGUFFile, GGUFValueType, open_reader  # noqa: E402
import gguf_vocab  # noqa: E402
from test_gguf import TENSORS  # noqa: E402
from test_gguf import write_model as write_layer_model  # noqa: E402
from test_model import write_model as write_whole_model  # noqa: E402

V = GGUFValueType


# ---- comparison with gguf.GGUFReader -------------------------------------------------------

def assert_same_as_gguf(path):
    """Every field and tensor of megafuse's reader equals gguf.GGUFReader's."""
    theirs = gguf.GGUFReader(str(path))
    ours = open_reader(str(path))
    assert isinstance(ours, GGUFFile)
    assert list(ours.fields) == list(theirs.fields)          # the same keys in the same order
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert mine.name == field.name == key
        assert [int(t) for t in mine.types] == [int(t) for t in field.types], key
        assert mine.offset == field.offset, key
        want, got = field.contents(), mine.contents()
        assert type(got) is type(want) and got == want, key
        if isinstance(want, list):
            assert [type(v) for v in got] == [type(v) for v in want], key
        assert ours.get(key) == want
    assert (ours.alignment, ours.data_offset) == (theirs.alignment, theirs.data_offset)
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, t in zip(ours.tensors, theirs.tensors):
        assert mine.name == t.name
        assert int(mine.tensor_type) == int(t.tensor_type), t.name
        assert mine.tensor_type.name == t.tensor_type.name, t.name
        assert list(mine.shape) == [int(n) for n in t.shape], t.name
        assert (mine.n_elements, mine.n_bytes, mine.data_offset) == \
            (t.n_elements, t.n_bytes, t.data_offset), t.name
        assert mine.data.shape == t.data.shape and mine.data.dtype == t.data.dtype, t.name
        assert mine.data.tobytes() == t.data.tobytes(), t.name
        assert not mine.data.flags.writeable, t.name           # a view of the file, read-only
        assert np.shares_memory(mine.data, ours.data) or mine.data.size == 0, t.name
        assert ours.tensor_map[t.name] is mine
    return ours, theirs


def assert_same_layer_arrays(path, *, layers=None):
    """megafuse.gguf.tensor() gives the same arrays through either reader."""
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    for t in theirs.tensors:
        if t.tensor_type.name not in megafuse.gguf.GGML_TO_CK:
            continue
        a, a_dt = megafuse.gguf.tensor(ours, t.name)
        b, b_dt = megafuse.gguf.tensor(theirs, t.name)
        assert a_dt == b_dt and a.shape == b.shape and a.dtype == b.dtype, t.name
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), t.name
    assert megafuse.gguf.hparams(ours) == megafuse.gguf.hparams(theirs)


def test_smollm2_equals_gguf_reader(smollm2_path):
    ours, _ = assert_same_as_gguf(smollm2_path)
    assert len(ours.fields["tokenizer.ggml.tokens"].value) == 49152
    assert len(ours.tensors) == 272
    assert_same_layer_arrays(smollm2_path)


FORMAT_SETS = {
    "floats": {"wq": "F32", "wk": "F16", "wv": "BF16", "wo": "F16", "gate": "F32", "up": "F32",
               "w2": "BF16"},
    "blocks": {"wq": "Q4_0", "wk": "Q4_1", "wv": "Q5_0", "wo": "Q5_1", "gate": "Q8_0",
               "up": "Q8_0", "w2": "Q4_0"},
    "kquants": {"wq": "Q4_K", "wk": "Q5_K", "wv": "Q6_K", "wo": "Q2_K", "gate": "Q4_K",
                "up": "Q6_K", "w2": "Q5_K"},
}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("formats", sorted(FORMAT_SETS))
def test_layer_files_equal_gguf_reader(tmp_path, arch, formats):
    path = tmp_path / "layers.gguf"
    write_layer_model(path, arch, FORMAT_SETS[formats], n_layers=2, norm_format="F16",
                      key_length=True, freq_factors=np.linspace(1, 2, 32))
    assert_same_as_gguf(path)
    assert_same_layer_arrays(path)


@pytest.mark.parametrize("fmt,tied", [("Q4_1", True), ("Q8_0", False), ("F16", True)])
def test_model_files_equal_gguf_reader(tmp_path, fmt, tied):
    path = write_whole_model(tmp_path / "model.gguf", "llama", fmt, tied=tied, n_layers=2)
    assert_same_as_gguf(path)
    assert_same_layer_arrays(path)


@pytest.mark.parametrize("kind", ["llama", "llama-bpe", "qwen2"])
def test_vocabulary_files_equal_gguf_reader(tmp_path, kind):
    path = str(tmp_path / "vocab.gguf")
    if kind == "llama":
        gguf_vocab.write_llama_gguf(path)
    else:
        gguf_vocab.write_gpt2_gguf(path, kind)
    ours, _ = assert_same_as_gguf(path)
    assert ours.get("tokenizer.ggml.model") == ("llama" if kind == "llama" else "gpt2")


def write_every_type(path, *, alignment=None, big_endian=False):
    """A file with a scalar and an array of every value type (non-ASCII strings, an empty
    string), tensors of every element type and of 1 to 4 dimensions, and optionally a custom
    alignment."""
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    G = gguf.GGUFValueType
    scalars = {G.UINT8: 200, G.INT8: -100, G.UINT16: 60000, G.INT16: -30000,
               G.UINT32: 4_000_000_000, G.INT32: -2_000_000_000, G.FLOAT32: 0.1,
               G.BOOL: True, G.UINT64: 2**64 - 1, G.INT64: -2**63, G.FLOAT64: 1e-300,
               G.STRING: "héllo ▁ 🙂"}
    for vtype, value in scalars.items():
        w.add_key_value(f"test.scalar.{vtype.name.lower()}", value, vtype)
        items = (["", "a", "ü€🙂", "x" * 300] if vtype == G.STRING else
                 [True, False, True] if vtype == G.BOOL else [value, 0, value])
        w.add_key_value(f"test.array.{vtype.name.lower()}", items, G.ARRAY, sub_type=vtype)
    rng = np.random.default_rng(0)
    w.add_tensor("t.f32.1d", rng.standard_normal(7).astype(np.float32))
    w.add_tensor("t.f16.2d", rng.standard_normal((3, 5)).astype(np.float16))
    w.add_tensor("t.f64.3d", rng.standard_normal((2, 3, 4)))
    w.add_tensor("t.i8.4d", rng.integers(-128, 127, (2, 2, 3, 4), dtype=np.int8))
    w.add_tensor("t.i16", rng.integers(-3000, 3000, (4, 6), dtype=np.int16))
    w.add_tensor("t.i32", rng.integers(-2**31, 2**31 - 1, (5,), dtype=np.int32))
    w.add_tensor("t.i64", rng.integers(-2**62, 2**62, (2, 3), dtype=np.int64))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                             gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("t.q8_0", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 4096])
def test_every_value_and_tensor_type_equals_gguf_reader(tmp_path, alignment):
    path = write_every_type(tmp_path / "types.gguf", alignment=alignment)
    ours, _ = assert_same_as_gguf(path)
    assert ours.alignment == (alignment or 32) and ours.data_offset % ours.alignment == 0
    assert ours.get("test.scalar.string") == "héllo ▁ 🙂"
    assert ours.get("test.scalar.uint64") == 2**64 - 1
    assert ours.get("test.array.string") == ["", "a", "ü€🙂", "x" * 300]
    assert ours.fields["test.array.int16"].types == [V.ARRAY, V.INT16]
    assert ours.tensor_map["t.i8.4d"].shape == (4, 3, 2, 2)
    assert ours.tensor_map["t.i8.4d"].data.shape == (2, 2, 3, 4)


def test_version_2_equals_gguf_reader(tmp_path):
    """Version 2 has version 3's layout (3 added big-endian files)."""
    path = write_every_type(tmp_path / "v2.gguf")
    patch(path, 4, struct.pack("<I", 2))
    ours, _ = assert_same_as_gguf(path)
    assert ours.version == 2


def test_contents_are_copies(tmp_path):
    path = write_every_type(tmp_path / "types.gguf")
    ours = GGUFFile(path)
    ours.get("test.array.string").append("more")
    ours.fields["test.array.int32"].contents()[0] = 1
    assert ours.get("test.array.string") == ["", "a", "ü€🙂", "x" * 300]
    assert ours.get("test.array.int32")[0] == -2_000_000_000
    assert ours.get("no.such.key", 7) == 7
    assert "version 3" in repr(ours) and "8 tensors" in repr(ours)


# ---- reading needs no gguf package ----------------------------------------------------------

def test_loading_a_model_imports_no_gguf(tmp_path):
    """Model.from_gguf, the tokenizer and DecoderLayer.from_gguf read files without gguf."""
    path = str(tmp_path / "vocab.gguf")
    gguf_vocab.write_gpt2_gguf(path, "qwen2")
    model_path = write_whole_model(tmp_path / "model.gguf", "qwen2", "Q8_0", n_layers=1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(megafuse.__file__)))
    code = (
        "import sys; sys.modules['gguf'] = None\n"      # `import gguf` would fail
        "import megafuse\n"
        f"m = megafuse.Model.from_gguf({str(model_path)!r})\n"
        "assert m.forward([1, 2, 3]).shape[-1] == m.vocab_size\n"
        f"layer = megafuse.DecoderLayer.from_gguf({str(model_path)!r}, 0)\n"
        f"tok = megafuse.Tokenizer.from_gguf({path!r})\n"
        "assert tok.decode(tok.encode('hello world')) == 'hello world'\n"
        "print('OK')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr


def test_a_gguf_reader_still_works_everywhere(tmp_path):
    path = write_whole_model(tmp_path / "model.gguf", "llama", "Q4_1", n_layers=1)
    a = megafuse.Model.from_gguf(gguf.GGUFReader(str(path)), cache_capacity=16)
    b = megafuse.Model.from_gguf(str(path), cache_capacity=16)
    assert isinstance(b._source, GGUFFile)
    assert np.array_equal(a.forward([1, 2, 3]), b.forward([1, 2, 3]))
    with pytest.raises(TypeError, match=r"reader: expected a path.*got int"):
        open_reader(3)


# ---- corrupt files ------------------------------------------------------------------------

def patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def corrupt_copy(src, dst, offset, data):
    dst.write_bytes(src.read_bytes())
    patch(dst, offset, data)
    return dst


def refused(path, match):
    """open_reader(path) raises a ValueError that names the file and matches `match`."""
    with pytest.raises(ValueError, match=match) as exc:
        open_reader(str(path))
    assert str(path) in str(exc.value)
    return str(exc.value)


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    """A small file with a vocabulary (string arrays), scalars of every type and tensors."""
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(["<s>", "</s>", "hé", "▁a", "🙂"])
    w.add_token_scores([0.0, -1.0, -2.5, -3.0, -4.0])
    w.add_key_value("test.u64", 7, gguf.GGUFValueType.UINT64)
    w.add_key_value("test.f64", 0.5, gguf.GGUFValueType.FLOAT64)
    w.add_key_value("test.bool", True, gguf.GGUFValueType.BOOL)
    rng = np.random.default_rng(1)
    w.add_tensor("a", rng.standard_normal((3, 32)).astype(np.float32))
    w.add_tensor("b", gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32),
                                           gguf.GGMLQuantizationType.Q4_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def layout(path):
    """Offsets in the file, from gguf's reader: key -> offset of the field's record, tensor
    name -> offset of its info; the end of the last tensor's data."""
    r = gguf.GGUFReader(str(path))
    fields = {k: f.offset for k, f in r.fields.items()}
    infos = {t.name: t.field.offset for t in r.tensors}
    end = max(t.data_offset + t.n_bytes for t in r.tensors)
    return fields, infos, end, r.data_offset


def test_truncated_at_every_offset(small_file, tmp_path):
    """Every cut before the last tensor's data ends is a ValueError naming the file; a cut
    in the padding after it still reads."""
    data = small_file.read_bytes()
    _, _, end, data_offset = layout(small_file)
    cut = tmp_path / "cut.gguf"
    messages = set()
    for n in [*range(data_offset + 8), *range(data_offset + 8, len(data), 7), end - 1]:
        cut.write_bytes(data[:n])
        if n >= end:
            assert GGUFFile(cut).tensor_map["b"].data.tobytes() == \
                GGUFFile(small_file).tensor_map["b"].data.tobytes()
            continue
        messages.add(refused(cut, r"truncated|past the end").split(": ", 1)[1][:40])
    assert len(messages) > 10                   # the messages say where it stopped


def test_bad_magic(small_file, tmp_path):
    for magic in (b"GGUG", b"gguf", b"\0\0\0\0", b"FUGG"):
        msg = refused(corrupt_copy(small_file, tmp_path / "m.gguf", 0, magic),
                      r"not a GGUF file")
        assert repr(magic) in msg
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    refused(empty, r"0 bytes, less than the 24-byte header")


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFF, 2**32 - 1])
def test_unsupported_version(small_file, tmp_path, version):
    path = corrupt_copy(small_file, tmp_path / "v.gguf", 4, struct.pack("<I", version))
    refused(path, rf"GGUF version {version} is not supported \(megafuse reads versions 2 "
                  rf"and 3\)")


def test_big_endian_is_not_implemented(tmp_path):
    path = write_every_type(tmp_path / "be.gguf", big_endian=True)
    with pytest.raises(NotImplementedError, match=r"be\.gguf: a big-endian GGUF file"):
        open_reader(str(path))


@pytest.mark.parametrize("where,value,match", [
    ("tensor_count", 2**64 - 1, r"tensor_count = 18446744073709551615 tensor infos"),
    ("tensor_count", 2**40, r"tensor infos.*needs"),
    ("tensor_count", 3, r"past the end of the file|truncated"),   # (reads into the data)
    ("kv_count", 2**64 - 1, r"kv_count = 18446744073709551615 key / values"),
    ("kv_count", 2**33, r"key / values.*needs"),
])
def test_absurd_header_counts(small_file, tmp_path, where, value, match):
    offset = {"tensor_count": 8, "kv_count": 16}[where]
    refused(corrupt_copy(small_file, tmp_path / "c.gguf", offset, struct.pack("<Q", value)),
            match)


def field_value_at(path, key):
    """Offset of the value of `key` (past its key string and u32 type)."""
    fields, _, _, _ = layout(path)
    return fields[key] + 8 + len(key.encode()) + 4


def test_absurd_lengths_and_types(small_file, tmp_path):
    tokens = field_value_at(small_file, "tokenizer.ggml.tokens")   # u32 item type, u64 count
    c = tmp_path / "c.gguf"
    refused(corrupt_copy(small_file, c, tokens + 4, struct.pack("<Q", 2**62)),
            r"tokenizer\.ggml\.tokens: an array of 4611686018427387904 STRING values")
    # one token more: the next key is read as the sixth token, and the rest is misread
    refused(corrupt_copy(small_file, c, tokens + 4, struct.pack("<Q", 6)),
            r"key / value 2: key: \d+-byte string at byte \d+ needs")
    # the first token's length, then its bytes: a length past the end of the file
    refused(corrupt_copy(small_file, c, tokens + 12, struct.pack("<Q", 2**63)),
            r"tokenizer\.ggml\.tokens\[0\]: 9223372036854775808-byte string at byte \d+ "
            r"needs 9223372036854775808 bytes")
    refused(corrupt_copy(small_file, c, tokens + 12 + 8 + 3 + 8, b"\xff"),   # "</s>"
            r"tokenizer\.ggml\.tokens\[1\]: not UTF-8")
    refused(corrupt_copy(small_file, c, tokens, struct.pack("<I", 13)),
            r"tokenizer\.ggml\.tokens: array item: unknown GGUF value type 13")
    refused(corrupt_copy(small_file, c, tokens, struct.pack("<I", 9)),
            r"tokenizer\.ggml\.tokens: arrays of arrays are not supported")
    refused(corrupt_copy(small_file, c, tokens - 4, struct.pack("<I", 2**32 - 1)),
            r"tokenizer\.ggml\.tokens: unknown GGUF value type 4294967295")
    # the first key's length
    fields, _, _, _ = layout(small_file)
    first = fields["general.architecture"]
    refused(corrupt_copy(small_file, c, first, struct.pack("<Q", 2**64 - 1)),
            r"key / value 0: key: 18446744073709551615-byte string")
    refused(corrupt_copy(small_file, c, first + 8, b"\xc3\x28"),
            r"key / value 0: key: not UTF-8")


def test_duplicate_key_and_bad_alignment(small_file, tmp_path):
    fields, _, _, _ = layout(small_file)
    c = tmp_path / "c.gguf"
    # rename test.f64 to test.u64 (same length): a duplicate key
    refused(corrupt_copy(small_file, c, fields["test.f64"] + 8, b"test.u64"),
            r"test\.u64: duplicate key")
    # rename test.u64 to general.alignment's length? Write alignments with gguf instead
    for alignment, match in ((0, r"general\.alignment = 0: not a power of two"),
                             (48, r"general\.alignment = 48: not a power of two")):
        w = gguf.GGUFWriter(str(c), "llama")
        w.add_key_value("general.alignment", alignment, gguf.GGUFValueType.UINT32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        refused(c, match)
    w = gguf.GGUFWriter(str(c), "llama")
    w.add_key_value("general.alignment", 64, gguf.GGUFValueType.UINT64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    refused(c, r"general\.alignment: expected a UINT32, got UINT64")


def test_corrupt_tensor_infos(small_file, tmp_path):
    _, infos, _, _ = layout(small_file)
    c = tmp_path / "c.gguf"
    b = infos["b"] + 8 + 1                         # n_dims of tensor "b" (name "b")
    refused(corrupt_copy(small_file, c, b, struct.pack("<I", 1000)),
            r"b: n_dims = 1000, at most 4")
    refused(corrupt_copy(small_file, c, b + 4 + 8, struct.pack("<Q", 2**40)),   # rows
            r"b: data at bytes \d+\.\.\d+ is past the end of the file")
    refused(corrupt_copy(small_file, c, b + 4, struct.pack("<Q", 48)),          # columns
            r"b: 48 values per row is not a multiple of the Q4_0 block \(32\)")
    refused(corrupt_copy(small_file, c, b + 4 + 16, struct.pack("<I", 4)),       # type
            r"b: unknown GGML type 4")
    refused(corrupt_copy(small_file, c, b + 4 + 16 + 4, struct.pack("<Q", 2**64 - 32)),
            r"b: data offset 18446744073709551584, expected \d+ \(right after the tensor "
            r"before, padded to general\.alignment = 32\)")
    refused(corrupt_copy(small_file, c, b + 4 + 16 + 4, struct.pack("<Q", 32 + 4)),  # offset
            r"b: data offset 36 is not a multiple of general\.alignment \(32\)")
    a = infos["a"] + 8 + 1                         # n_dims of tensor "a", F32 [32, 3]
    refused(corrupt_copy(small_file, c, a + 4 + 16, struct.pack("<I", 1)),       # F32 -> F16
            r"b: data offset 384, expected 192 \(right after the tensor before")
    refused(corrupt_copy(small_file, c, infos["b"] + 8, b"a"),                   # rename
            r"a: duplicate tensor name")
    refused(corrupt_copy(small_file, c, b + 4 + 8, struct.pack("<Q", 2**63)),
            r"b: dims \[64, 9223372036854775808\]: more than 2\*\*63 - 1 values")


def test_empty_tensors_are_refused(small_file, tmp_path):
    """A dimension of 0 is a ValueError naming the file and the tensor, whatever the other
    dims (a 0 makes the element count 0 and would hide a huge one from the size checks).
    gguf.GGUFReader reads an empty tensor: megafuse.gguf.tensor() refuses it too."""
    _, infos, _, _ = layout(small_file)
    c = tmp_path / "c.gguf"
    b = infos["b"] + 8 + 1                         # n_dims of tensor "b" (Q4_0, dims [64, 2])
    a = infos["a"] + 8 + 1                         # n_dims of tensor "a" (F32, dims [32, 3])
    refused(corrupt_copy(small_file, c, b + 4 + 8, struct.pack("<Q", 0)),        # no rows
            r"b: dims \[64, 0\]: a dimension of 0 \(an empty tensor\)")
    with pytest.raises(ValueError, match=r"^b: GGML shape \[64, 0\]: a dimension of 0"):
        megafuse.gguf.tensor(gguf.GGUFReader(str(c)), "b")
    refused(corrupt_copy(small_file, c, b + 4, struct.pack("<QQ", 0, 2)),         # no columns
            r"b: dims \[0, 2\]: a dimension of 0")
    refused(corrupt_copy(small_file, c, a + 4, struct.pack("<QQ", 0, 2**63 - 1)),
            r"a: dims \[0, 9223372036854775807\]: a dimension of 0")
    refused(corrupt_copy(small_file, c, a + 4, struct.pack("<QQ", 2**63 - 1, 0)),
            r"a: dims \[9223372036854775807, 0\]: a dimension of 0")


@pytest.mark.parametrize("dims,match", [
    ((0, 2**62, 4), r"t\.f64\.3d: dims \[0, 4611686018427387904, 4\]: a dimension of 0"),
    ((0, 2**40, 2**40), r"t\.f64\.3d: dims \[0, 1099511627776, 1099511627776\]: a dimension"),
    ((2**21, 2**21, 2**21), (r"t\.f64\.3d: dims \[2097152, 2097152, 2097152\]: more than "
                             r"2\*\*63 - 1 values")),
    ((2**20, 2**20, 2**20), r"t\.f64\.3d: data at bytes \d+\.\.\d+ is past the end"),
])
def test_huge_dims_are_refused(tmp_path, dims, match):
    """A 3-d tensor's dims: a 0 beside huge dims, an element count past 2**63 - 1, a byte count
    past the end of the file: ValueErrors naming the file and the tensor, not NumPy's."""
    path = write_every_type(tmp_path / "types.gguf")
    _, infos, _, _ = layout(path)
    at = infos["t.f64.3d"] + 8 + len("t.f64.3d") + 4             # its dims, past n_dims
    refused(corrupt_copy(path, tmp_path / "c.gguf", at, struct.pack("<3Q", *dims)), match)


def test_random_corruption_is_a_value_error_or_reads(small_file, tmp_path):
    """Random bytes written anywhere in the header: the file reads, or the reader says why
    it cannot (ValueError / NotImplementedError), never anything else."""
    data = small_file.read_bytes()
    _, _, _, data_offset = layout(small_file)
    rng = np.random.default_rng(5)
    c = tmp_path / "c.gguf"
    outcomes = {"read": 0, "refused": 0}
    for _ in range(400):
        blob = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, data_offset))
            blob[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        c.write_bytes(bytes(blob[:len(data)]))
        try:
            open_reader(str(c))
            outcomes["read"] += 1
        except (ValueError, NotImplementedError) as exc:
            assert str(c) in str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100, outcomes


def test_layer_of_a_file_without_tensors_is_a_clear_error(tmp_path):
    """Reading a layer of a file that has only metadata: ValueError naming the tensor."""
    path = str(tmp_path / "vocab.gguf")
    gguf_vocab.write_llama_gguf(path)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_norm\.weight: a llama layer needs "
                                         r"this tensor"):
        megafuse.DecoderLayer.from_gguf(path, 0)


def test_tensor_names_cover_the_layer(tmp_path):
    path = tmp_path / "l.gguf"
    write_layer_model(path, "qwen2", {k: "F32" for k in TENSORS}, n_layers=1)
    names = set(GGUFFile(path).tensor_map)
    assert {f"blk.0.{n}.weight" for n in TENSORS.values()} <= names


def test_megafuse_run_reports_a_corrupt_file(small_file, tmp_path, capsys):
    from megafuse import cli
    bad = corrupt_copy(small_file, tmp_path / "bad.gguf", 0, b"GGML")
    status = cli.main(["run", "--model", str(bad), "-p", "hi", "-n", "1"])
    err = capsys.readouterr().err
    assert status == 2 and f"{bad}: not a GGUF file" in err, err


def test_type_tables_agree_with_gguf():
    """megafuse's GGML types, block sizes and value types are gguf's (for every type both
    know: an older gguf knows fewer, a newer one more)."""
    from megafuse.llm.gguf import GGML_BLOCK_SIZES, GGMLType
    known = gguf.GGMLQuantizationType.__members__
    assert len([t for t in GGMLType if t.name in known]) >= 30
    for t in GGMLType:
        if t.name not in known:
            continue
        q = known[t.name]
        assert int(q) == int(t) and gguf.GGML_QUANT_SIZES[q] == GGML_BLOCK_SIZES[t], t.name
    assert {v.name: int(v) for v in V} == {v.name: int(v) for v in gguf.GGUFValueType}
    assert megafuse.gguf.ck_dtype(GGMLType.Q6_K) == megafuse.CKDataType.Q6_K
    assert megafuse.gguf.ck_dtype(GGMLType.IQ4_NL) == megafuse.CKDataType.IQ4_NL
    with pytest.raises(NotImplementedError, match=r"w: GGML type IQ2_XXS is not supported"):
        megafuse.gguf.ck_dtype(GGMLType.IQ2_XXS, "w")
