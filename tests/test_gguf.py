"""megafuse.gguf and DecoderLayer.from_gguf: small llama / qwen2 GGUF files written here with
gguf.GGUFWriter (llama q/k rows permuted as llama.cpp's convert_hf_to_gguf.py does), loaded,
run, and checked against megafuse.reference computed from gguf.quants.dequantize of the same
tensors."""
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import megafuse  # noqa: E402
from megafuse import CKDataType, DecoderLayer  # noqa: E402
from helpers import KQUANT_FORMATS, TOL, assert_q8_close, rel_err  # noqa: E402
from test_layer import float_weights, reference_layer, run_layer  # noqa: E402

SHAPE = (256, 4, 2, 64, 512)          # (E, H, G, D, I)
Q = gguf.GGMLQuantizationType
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
    if fmt in KQUANT_FORMATS:             # gguf cannot make K-quants: megafuse's quantizer
        return megafuse.quantize(w, CKDataType[fmt]), Q[fmt]
    if fmt == "Q2_K":                     # unsupported by megafuse: any bytes will do
        return np.zeros((w.shape[0], w.shape[1] // 256 * 84), np.uint8), Q.Q2_K
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

def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    path = tmp_path / "q2k.gguf"
    formats = {k: "Q8_0" for k in TENSORS}
    formats["wv"] = "Q2_K"
    write_model(path, "llama", formats, n_layers=1)
    with pytest.raises(NotImplementedError, match=r"blk\.0\.attn_v\.weight: GGML type Q2_K"):
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
    for name in ("Q8_1", "Q3_K", "IQ4_NL", "Q8_K", "F64"):
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
