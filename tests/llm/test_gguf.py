"""megafuse.llm.gguf and DecoderLayer.from_gguf: small llama / qwen2 GGUF files written here with
gguf.GGUFWriter (llama q/k rows permuted as llama.cpp's convert_hf_to_gguf.py does), loaded,
run, and checked against megafuse.reference computed from gguf.quants.dequantize of the same
tensors."""
import re
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import megafuse  # noqa: E402
from megafuse import CKDataType, DecoderLayer  # noqa: E402
from helpers import GGUF_QUANTIZES, TOL, assert_q8_close, rel_err  # noqa: E402
from test_layer import float_weights, reference_layer, run_layer  # noqa: E402

SHAPE = (256, 4, 2, 64, 512)          # (E, H, G, D, I)
Q = gguf.GGMLQuantizationType
# GGML's formats megafuse does not run: the rest of the IQ family (and ternary, FP4)
UNSUPPORTED = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0",
               "MXFP4")
TENSORS = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
           "gate": "ffn_gate", "up": "ffn_up", "w2": "ffn_down"}


def llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py, LlamaModel.permute: HF's rotate-half rows -> GGML's interleaved
    rows (applied to q_proj / k_proj weights and biases of llama-architecture models)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_row_order(n_head, D):
    """Index of the GGUF row holding each HF row: HF row h*D + i is GGUF row h*D + 2i and HF
    row h*D + D/2 + i is GGUF row h*D + 2i + 1 (i < D/2)."""
    idx = np.empty(n_head * D, dtype=np.int64)
    for h in range(n_head):
        for i in range(D // 2):
            idx[h * D + i] = h * D + 2 * i
            idx[h * D + D // 2 + i] = h * D + 2 * i + 1
    return idx


def encode(w, fmt):
    """A float32 matrix as GGUFWriter.add_tensor arguments: (array, raw_dtype)."""
    w = np.ascontiguousarray(w, np.float32)
    if fmt == "F32":
        return w, None
    if fmt == "F16":
        return w.astype(np.float16), None
    if fmt in UNSUPPORTED:                # unsupported by megafuse: any bytes will do
        block, nbytes = gguf.constants.GGML_QUANT_SIZES[Q[fmt]]
        return np.zeros((w.shape[0], w.shape[1] // block * nbytes), np.uint8), Q[fmt]
    if fmt not in GGUF_QUANTIZES:         # gguf cannot make K-quants, IQ4_*: megafuse's quantizer
        return megafuse.quantize(w, CKDataType[fmt]), Q[fmt]
    return gguf.quants.quantize(w, Q[fmt]), Q[fmt]


def write_model(path, arch, formats, *, shape=SHAPE, n_layers=2, seed=0, bias="qkv",
                norm_format="F32", key_length=False, head_count_kv=True, rope_theta=1e6,
                freq_factors=None, eps=1e-6, context_length=8192, expert_count=None):
    """A GGUF file of n_layers layers; returns the HF-order float32 weights of every layer."""
    E, H, G, D, I = shape
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(n_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(E)
    writer.add_feed_forward_length(I)
    writer.add_head_count(H)
    if head_count_kv:
        writer.add_head_count_kv(G)
    if key_length:
        writer.add_key_length(D)
        writer.add_value_length(D)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_freq_base(rope_theta)
    if expert_count:
        writer.add_expert_count(expert_count)
    if freq_factors is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(freq_factors, np.float32))
    layers = []
    for n in range(n_layers):
        w = float_weights(shape, seed=seed + n, bias=bias == "qkv")
        w["gate"], w["up"] = w["w1"][:I], w["w1"][I:]
        layers.append(w)
        stored = dict(w)
        if arch == "llama":               # what convert_hf_to_gguf.py writes
            stored["wq"] = llama_cpp_permute(w["wq"], H)
            stored["wk"] = llama_cpp_permute(w["wk"], G)
            if "bq" in w:
                stored["bq"] = llama_cpp_permute(w["bq"], H)
                stored["bk"] = llama_cpp_permute(w["bk"], G)
        for key, name in TENSORS.items():
            arr, raw = encode(stored[key], formats[key])
            writer.add_tensor(f"blk.{n}.{name}.weight", arr, raw_dtype=raw)
        for key, name in (("ln1_gamma", "attn_norm"), ("ln2_gamma", "ffn_norm")):
            arr, raw = encode(stored[key][None, :], norm_format)
            writer.add_tensor(f"blk.{n}.{name}.weight", arr.reshape(-1) if raw is None else arr,
                              raw_dtype=raw)
        for key, name in (("bq", "attn_q"), ("bk", "attn_k"), ("bv", "attn_v")):
            if key in stored:
                writer.add_tensor(f"blk.{n}.{name}.bias", stored[key])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return layers


def file_tensors(path, n, arch, shape=SHAPE):
    """Layer n's weights read back with gguf's own reader: (dequantized float32 in HF row
    order by gguf.quants.dequantize, stored format with rows in HF order, CKDataType)."""
    E, H, G, D, I = shape
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    floats, stored, dtypes = {}, {}, {}
    for key, name in TENSORS.items():
        t = by_name[f"blk.{n}.{name}.weight"]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        data = np.asarray(t.data)
        if t.tensor_type.name == "BF16":
            data = data.view(np.uint16)
        if arch == "llama" and key in ("wq", "wk"):
            order = hf_row_order(H if key == "wq" else G, D)
            values, data = values[order], data[order]
        floats[key], stored[key] = values, np.ascontiguousarray(data)
        dtypes[key] = CKDataType[{"F32": "FP32", "F16": "FP16"}.get(t.tensor_type.name,
                                                                     t.tensor_type.name)]
    for key in (("ln1_gamma", "attn_norm"), ("ln2_gamma", "ffn_norm")):
        t = by_name[f"blk.{n}.{key[1]}.weight"]
        floats[key[0]] = stored[key[0]] = gguf.quants.dequantize(
            t.data, t.tensor_type).astype(np.float32).reshape(-1)
    for key, name in (("bq", "attn_q"), ("bk", "attn_k"), ("bv", "attn_v")):
        t = by_name.get(f"blk.{n}.{name}.bias")
        if t is not None:
            b = np.asarray(t.data, np.float32)
            if arch == "llama" and key in ("bq", "bk"):
                b = b[hf_row_order(H if key == "bq" else G, D)]
            floats[key] = stored[key] = b
    floats["w1"] = np.concatenate([floats.pop("gate"), floats.pop("up")])
    if dtypes["gate"] == dtypes["up"]:                # (a mixed pair has no stored form)
        stored["w1"] = np.concatenate([stored.pop("gate"), stored.pop("up")])
    dtypes["w1"] = dtypes.pop("gate")
    dtypes.pop("up")
    return floats, stored, dtypes


FP32_ALL = {k: CKDataType.FP32 for k in ("wq", "wk", "wv", "wo", "w1", "w2")}


def inputs(T, E=SHAPE[0]):
    return np.random.default_rng(11).standard_normal((T, E)).astype(np.float32)


# ---- llama: the converter's permutation undone ---------------------------------------------

def test_llama_f32_file_gives_back_the_hf_weights(tmp_path):
    path = tmp_path / "llama-f32.gguf"
    formats = {k: "F32" for k in TENSORS}
    hf = write_model(path, "llama", formats, rope_theta=500000.0, eps=1e-5)
    layer = DecoderLayer.from_gguf(str(path), 1, cache_capacity=32)
    w = hf[1]
    for key in ("wq", "wk", "wv", "wo", "w1", "w2", "bq", "bk", "bv", "ln1_gamma",
                "ln2_gamma"):
        assert np.array_equal(layer.weights[key], w[key]), key
    assert layer.dtypes == {k: CKDataType.FP32 for k in FP32_ALL}
    assert (layer.embed_dim, layer.num_heads, layer.num_kv_heads, layer.head_dim,
            layer.intermediate_dim) == SHAPE
    assert layer.eps == pytest.approx(1e-5) and layer.rope_theta == 500000.0
    x = inputs(20)
    got = run_layer(layer, x, 14)
    want = reference_layer(w, FP32_ALL, x, theta=500000.0, eps=1e-5)
    assert rel_err(got, want) < TOL["float"]


def test_llama_quantized_rows_are_unpermuted_whole(tmp_path):
    """Block formats: the converter permuted float rows before quantizing, and quantization is
    row by row, so the loaded bytes equal the HF-order weights quantized directly."""
    path = tmp_path / "llama-q.gguf"
    formats = {"wq": "Q4_K", "wk": "Q8_0", "wv": "F16", "wo": "BF16", "gate": "Q5_1",
               "up": "Q5_1", "w2": "Q5_K"}
    hf = write_model(path, "llama", formats, n_layers=1, bias="none")
    layer = DecoderLayer.from_gguf(path, 0, cache_capacity=32)
    assert np.array_equal(layer.weights["wq"], megafuse.quantize(hf[0]["wq"], CKDataType.Q4_K))
    assert np.array_equal(layer.weights["wk"], gguf.quants.quantize(hf[0]["wk"], Q.Q8_0))
    floats, stored, dtypes = file_tensors(path, 0, "llama")
    assert {k: v.name for k, v in layer.dtypes.items()} == {k: v.name for k, v in dtypes.items()}
    x = inputs(24)
    got = run_layer(layer, x, 16)
    pure = reference_layer(floats, FP32_ALL, x, theta=1e6, eps=1e-6)
    emulated = reference_layer(stored, dtypes, x, theta=1e6, eps=1e-6,
                               quantize_activations=True)
    assert_q8_close(got, emulated, pure)
    assert rel_err(got, pure) < TOL["q8_vs_float"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_low_bit_and_iq4_formats_load_and_run(tmp_path, arch):
    """A layer in Q2_K, Q3_K, IQ4_NL and IQ4_XS (the Q2_K / Q3_K_M / IQ4_XS downloads' formats),
    gate and up in different formats (up converted to the gate's IQ4_XS, the finer one): loaded
    (llama's q / k rows unpermuted as whole rows of blocks) and run by the int8 path, against
    the reference's emulation on the same bytes."""
    path = tmp_path / f"{arch}-lowbit.gguf"
    formats = {"wq": "Q2_K", "wk": "Q3_K", "wv": "IQ4_NL", "wo": "IQ4_XS", "gate": "IQ4_XS",
               "up": "Q3_K", "w2": "Q2_K"}
    hf = write_model(path, arch, formats, n_layers=1)
    layer = DecoderLayer.from_gguf(str(path), 0, cache_capacity=32)
    assert {k: v.name for k, v in layer.dtypes.items()} == {
        "wq": "Q2_K", "wk": "Q3_K", "wv": "IQ4_NL", "wo": "IQ4_XS", "w1": "IQ4_XS", "w2": "Q2_K"}
    for key, fmt in (("wq", "Q2_K"), ("wk", "Q3_K"), ("wv", "IQ4_NL")):
        assert np.array_equal(layer.weights[key], megafuse.quantize(hf[0][key], CKDataType[fmt]))
    floats, stored, dtypes = file_tensors(path, 0, arch)
    I = SHAPE[4]
    up = megafuse.quantize(floats["w1"][I:], CKDataType.IQ4_XS)     # Q3_K up, requantized
    assert np.array_equal(layer.weights["w1"], np.concatenate([stored["gate"], up]))
    stored["w1"], dtypes["w1"] = layer.weights["w1"], CKDataType.IQ4_XS
    floats["w1"] = megafuse.dequantize(stored["w1"], CKDataType.IQ4_XS, (2 * I, SHAPE[0]))
    x = inputs(20)
    got = run_layer(layer, x, 12)
    pure = reference_layer(floats, FP32_ALL, x, theta=1e6, eps=1e-6)
    emulated = reference_layer(stored, dtypes, x, theta=1e6, eps=1e-6,
                               quantize_activations=True)
    assert_q8_close(got, emulated, pure)
    assert rel_err(got, pure) < TOL["q8_vs_float"]


def test_permutation_helpers_are_inverse():
    w = np.arange(4 * 64 * 3).reshape(4 * 64, 3)
    assert np.array_equal(megafuse.gguf.permute_rows(w, 4), llama_cpp_permute(w, 4))
    assert np.array_equal(megafuse.gguf.unpermute_rows(llama_cpp_permute(w, 4), 4), w)
    assert np.array_equal(llama_cpp_permute(w, 4)[hf_row_order(4, 64)], w)


# ---- qwen2: rotate-half already, biases ------------------------------------------------------

@pytest.mark.parametrize("reader_kind", ["megafuse", "gguf"])
def test_qwen2_quantized_file_zero_copy(tmp_path, reader_kind):
    path = tmp_path / "qwen2-q.gguf"
    formats = {"wq": "Q8_0", "wk": "Q5_0", "wv": "Q4_1", "wo": "Q4_K", "gate": "Q4_0",
               "up": "Q4_0", "w2": "Q6_K"}
    hf = write_model(path, "qwen2", formats)
    reader = (megafuse.gguf.GGUFFile(path) if reader_kind == "megafuse" else
              gguf.GGUFReader(str(path)))
    layer = DecoderLayer.from_gguf(reader, 1, cache_capacity=40)
    for key in ("wq", "wk", "wv", "wo", "w2", "ln1_gamma", "bq"):     # no copy of the file
        arr = layer.weights[key]
        assert np.shares_memory(arr, reader.data) and not arr.flags.writeable, key
    assert not np.shares_memory(layer.weights["w1"], reader.data)   # gate + up: a copy
    assert np.array_equal(layer.weights["wq"], gguf.quants.quantize(hf[1]["wq"], Q.Q8_0))
    floats, stored, dtypes = file_tensors(path, 1, "qwen2")
    x = inputs(30)
    got = run_layer(layer, x, 22)
    pure = reference_layer(floats, FP32_ALL, x, theta=1e6, eps=1e-6)
    emulated = reference_layer(stored, dtypes, x, theta=1e6, eps=1e-6,
                               quantize_activations=True)
    assert_q8_close(got, emulated, pure)
    assert rel_err(got, pure) < TOL["q8_vs_float"]


def test_qwen2_f16_norms_key_length_and_mha(tmp_path):
    """head_dim from attention.key_length (H*D != E), norms stored F16, no head_count_kv."""
    shape = (256, 2, 2, 64, 256)
    path = tmp_path / "qwen2-f16.gguf"
    formats = {"wq": "F16", "wk": "F16", "wv": "F32", "wo": "F16", "gate": "F32", "up": "F32",
               "w2": "F16"}
    write_model(path, "qwen2", formats, shape=shape, n_layers=1, norm_format="F16",
                key_length=True, head_count_kv=False)
    hp = megafuse.gguf.hparams(str(path))
    assert (hp["num_heads"], hp["num_kv_heads"], hp["head_dim"]) == (2, 2, 64)
    layer = DecoderLayer.from_gguf(str(path), 0, cache_capacity=16)
    assert layer.ln1_gamma.dtype == np.float32
    floats, _, _ = file_tensors(path, 0, "qwen2", shape)
    x = inputs(16)
    got = run_layer(layer, x, 10)
    want = reference_layer(floats, FP32_ALL, x, shape=shape, theta=1e6, eps=1e-6)
    assert rel_err(got, want) < TOL["float"]


def test_rope_freqs_tensor_scales_the_rope_tables(tmp_path):
    path = tmp_path / "llama3.gguf"
    factors = np.linspace(1.0, 8.0, 32).astype(np.float32)
    hf = write_model(path, "llama", {k: "F32" for k in TENSORS}, n_layers=1,
                     rope_theta=500000.0, freq_factors=factors)
    layer = DecoderLayer.from_gguf(str(path), 0, cache_capacity=24)
    cos, sin = megafuse.rope_tables(64, 24, 500000.0, freq_factors=factors)
    assert np.array_equal(layer.rope_cos, cos) and np.array_equal(layer.rope_sin, sin)
    x = inputs(24)
    got = run_layer(layer, x, 20)
    want = reference_layer(hf[0], FP32_ALL, x, theta=500000.0, freq_factors=factors)
    assert rel_err(got, want) < TOL["float"]


# ---- gate and up in different formats ------------------------------------------------------

def test_mixed_gate_up_formats_use_the_finer_one(tmp_path):
    path = tmp_path / "mixed.gguf"
    formats = {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q8_0", "gate": "Q4_0",
               "up": "Q8_0", "w2": "Q8_0"}
    write_model(path, "qwen2", formats, n_layers=1)
    layer = DecoderLayer.from_gguf(str(path), 0, cache_capacity=16)
    assert layer.dtypes["w1"] == CKDataType.Q8_0
    floats, stored, _ = file_tensors(path, 0, "qwen2")
    I = SHAPE[4]
    gate_q4 = floats["w1"][:I]                                    # dequantized Q4_0 gate
    assert np.array_equal(layer.weights["w1"][:I], megafuse.quantize(gate_q4, CKDataType.Q8_0))
    assert np.array_equal(layer.weights["w1"][I:], stored["up"])    # up: the bytes as stored
    x = inputs(16)
    got = layer.prefill(x)
    want = reference_layer(floats, FP32_ALL, x, theta=1e6, eps=1e-6)
    assert rel_err(got, want) < TOL["q8_vs_float"]


# ---- what is refused, and how --------------------------------------------------------------

@pytest.mark.parametrize("fmt", UNSUPPORTED)
def test_unsupported_tensor_type_names_tensor_and_type(tmp_path, fmt):
    path = tmp_path / f"{fmt}.gguf"
    formats = {k: "Q8_0" for k in TENSORS}
    formats["wv"] = fmt
    write_model(path, "llama", formats, n_layers=1)
    with pytest.raises(NotImplementedError, match=rf"blk\.0\.attn_v\.weight: GGML type {fmt}"):
        DecoderLayer.from_gguf(str(path), 0)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_model(path, "gpt2", {k: "F32" for k in TENSORS}, n_layers=1)
    with pytest.raises(NotImplementedError, match=r"general.architecture.*'gpt2'"):
        DecoderLayer.from_gguf(str(path), 0)


def test_mixture_of_experts_is_refused(tmp_path):
    path = tmp_path / "moe.gguf"
    write_model(path, "llama", {k: "F32" for k in TENSORS}, n_layers=1, expert_count=8)
    with pytest.raises(NotImplementedError, match=r"llama.expert_count = 8: mixture-of-experts"):
        DecoderLayer.from_gguf(str(path), 0)


def test_layer_index_and_cache_capacity(tmp_path):
    path = tmp_path / "small.gguf"
    write_model(path, "qwen2", {k: "F32" for k in TENSORS}, n_layers=2, context_length=1000)
    with pytest.raises(ValueError, match=r"layer_index: expected a layer in 0\.\.1, got 2"):
        DecoderLayer.from_gguf(str(path), 2)
    assert DecoderLayer.from_gguf(str(path), 0).cache_capacity == 1000       # the context
    big = tmp_path / "big.gguf"
    write_model(big, "qwen2", {k: "F32" for k in TENSORS}, n_layers=1, context_length=32768)
    assert DecoderLayer.from_gguf(str(big), 0).cache_capacity == 4096        # capped
    assert DecoderLayer.from_gguf(str(big), 0, cache_capacity=64).cache_capacity == 64


def test_type_mapping():
    assert megafuse.gguf.ck_dtype(Q.Q6_K) == CKDataType.Q6_K
    assert megafuse.gguf.ck_dtype(Q.F16) == CKDataType.FP16
    assert megafuse.gguf.ck_dtype(Q.BF16) == CKDataType.BF16
    for name in ("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"):
        assert megafuse.gguf.ck_dtype(Q[name]) == CKDataType[name]
    for name in ("Q8_1", "Q8_K", "F64") + UNSUPPORTED:
        with pytest.raises(NotImplementedError, match=f"my.tensor: GGML type {name}"):
            megafuse.gguf.ck_dtype(Q[name], "my.tensor")


def test_reading_needs_no_gguf_package(tmp_path, monkeypatch):
    """megafuse reads GGUF files itself: gguf is needed only to write them (these tests)."""
    path = tmp_path / "small.gguf"
    write_model(path, "qwen2", {k: "Q8_0" for k in TENSORS}, n_layers=1)
    monkeypatch.setitem(sys.modules, "gguf", None)          # `import gguf` now fails
    with pytest.raises(ImportError):
        __import__("gguf")
    layer = DecoderLayer.from_gguf(str(path), 0, cache_capacity=8)
    assert layer.dtypes["wq"] == CKDataType.Q8_0
    assert isinstance(megafuse.gguf.open_reader(path), megafuse.gguf.GGUFFile)


# ---- hostile metadata: a ValueError naming the key ------------------------------------------

VT = gguf.GGUFValueType
#: The hyper-parameters of a 2-layer llama file: key -> (value, type)
HPARAMS = {
    "general.architecture": ("llama", VT.STRING),
    "llama.block_count": (2, VT.UINT32),
    "llama.context_length": (8192, VT.UINT32),
    "llama.embedding_length": (256, VT.UINT32),
    "llama.feed_forward_length": (512, VT.UINT32),
    "llama.attention.head_count": (4, VT.UINT32),
    "llama.attention.head_count_kv": (2, VT.UINT32),
    "llama.attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT32),
    "llama.rope.freq_base": (10000.0, VT.FLOAT32),
}
NAN, INF = float("nan"), float("inf")


def write_metadata(path, **changes):
    """A file of HPARAMS (no tensors: hparams() reads only the metadata), with changes: a key
    (dots as "__") -> (value, type) or (items, ARRAY, item type); None drops the key.  The
    writer is made with no architecture so that general.architecture, too, can be anything."""
    kv = dict(HPARAMS)
    for name, spec in changes.items():
        key = name.replace("__", ".")
        if spec is None:
            kv.pop(key)
        else:
            kv[key] = spec
    writer = gguf.GGUFWriter(str(path), "")
    for key, spec in kv.items():
        writer.add_key_value(key, *spec)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return str(path)


def readers(path):
    """The file through megafuse's reader and through gguf's."""
    return [megafuse.gguf.GGUFFile(path), gguf.GGUFReader(path)]


def array(items, item_type=VT.UINT32):
    return (list(items), VT.ARRAY, item_type)


def assert_refused(path, match, layer_index=0):
    """hparams() through either reader: a ValueError naming the file, then matching `match`
    (a regex, anchored after the file's name with "^")."""
    assert match.startswith("^")
    for reader in readers(path):
        with pytest.raises(ValueError, match="^" + re.escape(str(path)) + ": " + match[1:]):
            megafuse.gguf.hparams(reader, layer_index)


def test_metadata_helper_writes_a_valid_file(tmp_path):
    path = write_metadata(tmp_path / "ok.gguf")
    for reader in readers(path):
        hp = megafuse.gguf.hparams(reader)
        assert (hp["block_count"], hp["embed_dim"], hp["num_heads"], hp["num_kv_heads"],
                hp["head_dim"], hp["intermediate_dim"], hp["context_length"]) == \
            (2, 256, 4, 2, 64, 512, 8192)
        assert hp["eps"] == pytest.approx(1e-5) and hp["rope_theta"] == 10000.0


INT_KEYS = ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
            "llama.context_length", "llama.attention.head_count",
            "llama.attention.head_count_kv", "llama.attention.key_length",
            "llama.attention.value_length", "llama.rope.dimension_count", "llama.expert_count"]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value,vtype,said", [
    (INF, VT.FLOAT32, "float inf"), (NAN, VT.FLOAT32, "float nan"),
    (64.0, VT.FLOAT64, "float 64.0"), ("64", VT.STRING, "the string '64'"),
    (True, VT.BOOL, "the boolean True"),
])
def test_integer_hparam_of_another_type(tmp_path, key, value, vtype, said):
    path = write_metadata(tmp_path / "m.gguf", **{key.replace(".", "__"): (value, vtype)})
    assert_refused(path, rf"^{key}: expected an integer, got {said}$")


@pytest.mark.parametrize("key", INT_KEYS)
def test_integer_hparam_as_an_array(tmp_path, key):
    """An array where one value is expected (the per-layer keys: an array of another length
    than block_count)."""
    path = write_metadata(tmp_path / "m.gguf", **{key.replace(".", "__"): array([64, 64, 64])})
    assert_refused(path, rf"^{key}: expected one value(, got| or one per layer "
                         rf"\(block_count = 2\), got) an array of 3 values$")
    path = write_metadata(tmp_path / "s.gguf",
                          **{key.replace(".", "__"): array(["a", "b"], VT.STRING)})
    assert_refused(path, rf"^{key}(\[0\])?: expected (one value|an integer), got")


@pytest.mark.parametrize("key,value,vtype,minimum", [
    ("llama.block_count", 0, VT.UINT32, 1), ("llama.block_count", -1, VT.INT32, 1),
    ("llama.embedding_length", 0, VT.UINT32, 1), ("llama.feed_forward_length", 0, VT.UINT32, 1),
    ("llama.attention.head_count", 0, VT.UINT32, 1),
    ("llama.attention.head_count_kv", -2, VT.INT64, 1),
    ("llama.attention.key_length", 0, VT.UINT32, 1),
    ("llama.context_length", -1, VT.INT32, 0), ("llama.expert_count", -1, VT.INT32, 0),
])
def test_integer_hparam_out_of_range(tmp_path, key, value, vtype, minimum):
    path = write_metadata(tmp_path / "m.gguf", **{key.replace(".", "__"): (value, vtype)})
    assert_refused(path, rf"^{key}: expected an integer >= {minimum}, got "
                         rf"{value}$")


def test_block_count_zero_is_refused_by_the_layer_and_the_model(tmp_path):
    """Not model.py's "feed_forward_length differs between layers ([])"."""
    path = write_metadata(tmp_path / "m.gguf", llama__block_count=(0, VT.UINT32))
    match = "^" + re.escape(path) + r": llama\.block_count: expected an integer >= 1, got 0$"
    with pytest.raises(ValueError, match=match):
        DecoderLayer.from_gguf(path, 0)
    with pytest.raises(ValueError, match=match):
        megafuse.Model.from_gguf(path)


def test_missing_and_derived_hparams(tmp_path):
    path = write_metadata(tmp_path / "m.gguf", llama__embedding_length=None)
    assert_refused(path, r"^llama\.embedding_length is missing$")
    path = write_metadata(tmp_path / "m.gguf", llama__block_count=None)
    with pytest.raises(ValueError, match=re.escape(path) + r": llama\.block_count is missing$"):
        DecoderLayer.from_gguf(path, 0)
    # no key_length and more heads than embedding dims: head_dim would be 0
    path = write_metadata(tmp_path / "m.gguf", llama__attention__head_count=(512, VT.UINT32),
                          llama__attention__head_count_kv=None)
    assert_refused(path, r"^llama\.embedding_length = 256 is not a multiple of "
                         r"llama\.attention\.head_count = 512, and llama\.attention\.key_length "
                         r"is missing")
    # optional keys missing: their defaults
    path = write_metadata(tmp_path / "m.gguf", llama__context_length=None,
                          llama__attention__layer_norm_rms_epsilon=None,
                          llama__rope__freq_base=None, llama__attention__head_count_kv=None)
    for reader in readers(path):
        hp = megafuse.gguf.hparams(reader)
        assert (hp["context_length"], hp["eps"], hp["rope_theta"], hp["num_kv_heads"]) == \
            (0, 1e-6, 10000.0, 4)


def test_per_layer_arrays(tmp_path):
    """llama.cpp allows the head counts and feed_forward_length one value per layer."""
    path = write_metadata(tmp_path / "m.gguf", llama__feed_forward_length=array([512, 768]),
                          llama__attention__head_count_kv=array([2, 4]))
    for reader in readers(path):
        assert megafuse.gguf.hparams(reader, 0)["intermediate_dim"] == 512
        hp = megafuse.gguf.hparams(reader, 1)
        assert (hp["intermediate_dim"], hp["num_kv_heads"]) == (768, 4)
        with pytest.raises(ValueError, match=r": llama\.attention\."
                                             r"head_count_kv: an array of 2 values has no value "
                                             r"for layer 2$"):
            megafuse.gguf.hparams(reader, 2)
        with pytest.raises(ValueError, match=r"llama\.feed_forward_length: an array of 2 "
                                             r"values has no value for layer 5"):
            megafuse.gguf._field(reader, "llama.feed_forward_length", index=5)
    # shorter than block_count: refused for every layer, not an IndexError for the last ones
    for key in ("llama.feed_forward_length", "llama.attention.head_count",
                "llama.attention.head_count_kv"):
        path = write_metadata(tmp_path / "m.gguf", **{key.replace(".", "__"): array([4])})
        for layer_index in (0, 1):
            assert_refused(path, rf"^{key}: expected one value or one per layer "
                                 rf"\(block_count = 2\), got an array of 1 values$", layer_index)
        with pytest.raises(ValueError, match=rf"{re.escape(path)}: {key}: expected one value or"):
            DecoderLayer.from_gguf(path, 1)
    # a bad entry: named with its layer
    path = write_metadata(tmp_path / "m.gguf", llama__attention__head_count_kv=array([2, 0]))
    assert megafuse.gguf.hparams(path, 0)["num_kv_heads"] == 2
    assert_refused(path, r"^llama\.attention\.head_count_kv\[1\]: expected an "
                         r"integer >= 1, got 0$", 1)
    path = write_metadata(tmp_path / "m.gguf",
                          llama__feed_forward_length=array([512.0, 512.0], VT.FLOAT32))
    assert_refused(path, r"^llama\.feed_forward_length\[0\]: expected an "
                         r"integer, got float 512\.0$")


FLOAT_KEYS = ["llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base"]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("spec,message", [
    (("abc", VT.STRING), r"expected a number, got the string 'abc'"),
    ((True, VT.BOOL), r"expected a number, got the boolean True"),
    (array([1e-5], VT.FLOAT32), r"expected one value, got an array of 1 values"),
    ((NAN, VT.FLOAT32), r"expected a finite value > 0, got nan"),
    ((INF, VT.FLOAT64), r"expected a finite value > 0, got inf"),
    ((-INF, VT.FLOAT32), r"expected a finite value > 0, got -inf"),
    ((0.0, VT.FLOAT32), r"expected a finite value > 0, got 0\.0"),
    ((-1e-5, VT.FLOAT64), r"expected a finite value > 0, got -1e-05"),
    ((0, VT.UINT32), r"expected a finite value > 0, got 0\.0"),
])
def test_float_hparam_refused(tmp_path, key, spec, message):
    path = write_metadata(tmp_path / "m.gguf", **{key.replace(".", "__"): spec})
    assert_refused(path, rf"^{key}: {message}$")


def test_float_hparams_taken_as_integers(tmp_path):
    path = write_metadata(tmp_path / "m.gguf", llama__rope__freq_base=(500000, VT.UINT32),
                          llama__attention__layer_norm_rms_epsilon=(1e-6, VT.FLOAT64))
    for reader in readers(path):
        hp = megafuse.gguf.hparams(reader)
        assert hp["rope_theta"] == 500000.0 and type(hp["rope_theta"]) is float
        assert hp["eps"] == 1e-6


@pytest.mark.parametrize("spec,scale", [
    ((4.0, VT.FLOAT32), 0.25), ((2, VT.UINT32), 0.5), (None, 1.0),
    ((0.0, VT.FLOAT32), 1.0),     # llama.cpp: a factor of 0 is no scaling
])
def test_linear_rope_scaling_factor(tmp_path, spec, scale):
    changes = {"llama__rope__scaling__type": ("linear", VT.STRING)}
    if spec is not None:
        changes["llama__rope__scaling__factor"] = spec
    path = write_metadata(tmp_path / "m.gguf", **changes)
    for reader in readers(path):
        assert megafuse.gguf.hparams(reader)["rope_position_scale"] == scale


@pytest.mark.parametrize("spec,message", [
    (("abc", VT.STRING), r"expected a number, got the string 'abc'"),
    (array([2.0], VT.FLOAT32), r"expected one value, got an array of 1 values"),
    ((NAN, VT.FLOAT32), r"expected a finite value > 0, got nan"),
    ((INF, VT.FLOAT32), r"expected a finite value > 0, got inf"),
    ((-2.0, VT.FLOAT32), r"expected a finite value > 0, got -2\.0"),
])
def test_linear_rope_scaling_factor_refused(tmp_path, spec, message):
    path = write_metadata(tmp_path / "m.gguf", llama__rope__scaling__type=("linear", VT.STRING),
                          llama__rope__scaling__factor=spec)
    assert_refused(path, rf"^llama\.rope\.scaling\.factor: {message}$")


def test_string_metadata_of_another_type(tmp_path):
    path = write_metadata(tmp_path / "m.gguf",
                          general__architecture=array(["llama"], VT.STRING))
    assert_refused(path, r"^general\.architecture: expected one value, got an "
                         r"array of 1 values$")
    path = write_metadata(tmp_path / "m.gguf", general__architecture=(7, VT.UINT32))
    assert_refused(path, r"^general\.architecture: expected a string, got "
                         r"int 7$")
    path = write_metadata(tmp_path / "m.gguf", general__architecture=None)
    assert_refused(path, r"^general\.architecture is missing$")
    path = write_metadata(tmp_path / "m.gguf", llama__rope__scaling__type=(1, VT.UINT8))
    assert_refused(path, r"^llama\.rope\.scaling\.type: expected a string, got "
                         r"int 1$")
    # valid but unsupported values keep their NotImplementedError
    path = write_metadata(tmp_path / "m.gguf", llama__rope__scaling__type=("longrope",
                                                                           VT.STRING))
    with pytest.raises(NotImplementedError, match=r"rope\.scaling\.type = 'longrope'"):
        megafuse.gguf.hparams(path)
    path = write_metadata(tmp_path / "m.gguf", llama__rope__dimension_count=(32, VT.UINT32))
    with pytest.raises(NotImplementedError, match=r"rope\.dimension_count = 32: partial"):
        megafuse.gguf.hparams(path)
