"""Architectures as data (megafuse/llm/arch.py): each row's files load and run.

The files in tests/data/arch are small random-init HF transformers models written to GGUF the
way llama.cpp's converter writes them, with HF's own float32 logits on a fixed sequence
(tests/data/make_arch_references.py).  Each is compared with HF (logits) and with the float64
reference (every layer's output), in float mode and in int8 mode."""
import glob
import os
import re

import numpy as np
import pytest

from megafuse.llm import arch as _arch
from megafuse.llm.model import Model
from helpers import DATA_DIR, ROOT, TOL, rel_err
from test_model import assert_model_matches_reference

ARCH_DIR = os.path.join(DATA_DIR, "arch")
CASES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ARCH_DIR, "*.gguf")))
# LongRoPE takes its short factors up to the original context (64 here), as HF does for a
# sequence that short: the cache must not be longer (llama.cpp's choice is by the cache)
CACHE = {"phi3_longrope": 64}


def test_the_recorded_cases_are_there():
    assert {"phi3", "mistral", "qwen3", "gemma2", "gemma3", "qwen2_yarn",
            "phi3_longrope"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_float_mode_matches_hf_on_the_same_weights(name):
    want = np.load(os.path.join(ARCH_DIR, f"{name}_hf.npz"))
    model = Model.from_gguf(os.path.join(ARCH_DIR, f"{name}.gguf"), activations="float",
                            cache_capacity=CACHE.get(name))
    got = model.forward(want["ids"], logits="all")
    assert rel_err(got, want["logits"]) < 1e-4
    assert np.array_equal(got.argmax(1), want["logits"].argmax(1))


@pytest.mark.parametrize("mode", ["float", "int8"])
@pytest.mark.parametrize("name", CASES)
def test_every_layer_matches_the_float64_reference(name, mode):
    ids = np.load(os.path.join(ARCH_DIR, f"{name}_hf.npz"))["ids"]
    model = Model.from_gguf(os.path.join(ARCH_DIR, f"{name}.gguf"), activations=mode)
    assert_model_matches_reference(model, ids, tol_float=TOL["float"] * 10)


def quantized_copy(src, dst, fmt):
    """The model file src with every layer matrix requantized to fmt (the rest as it is), so
    that the int8 path runs on the architecture's features."""
    gguf = pytest.importorskip("gguf")
    import megafuse
    from megafuse.llm.gguf import GGUFFile
    reader = GGUFFile(src)
    arch = reader.get("general.architecture")
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
    qtype = getattr(gguf.GGMLQuantizationType, fmt)
    for info in reader.tensors:
        data = np.asarray(info.data)
        if info.name.startswith("blk.") and data.ndim == 2:
            dt = getattr(megafuse.CKDataType, fmt)
            writer.add_tensor(info.name, megafuse.quantize(data.astype(np.float32), dt),
                              raw_dtype=qtype)
        else:
            writer.add_tensor(info.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("name", ["qwen3", "gemma2", "gemma3"])
def test_int8_mode_on_block_weights_matches_the_emulation(tmp_path, name, fmt):
    path = quantized_copy(os.path.join(ARCH_DIR, f"{name}.gguf"), tmp_path / "q.gguf", fmt)
    ids = np.load(os.path.join(ARCH_DIR, f"{name}_hf.npz"))["ids"]
    for mode in ("int8", "float"):
        model = Model.from_gguf(path, activations=mode)
        assert fmt in model.formats
        assert_model_matches_reference(model, ids)


@pytest.mark.filterwarnings("ignore:cache_capacity = 640 is more than the model's context")
@pytest.mark.parametrize("mode", ["float", "int8"])
@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_sliding_windows_past_the_ring_and_split_kv(tmp_path, name, mode, threads):
    """300 tokens (steps of 128) then 24 decoded one by one through windows of 8 keys, whose
    ring caches (8 + 128 rows) wrap twice, and global layers past split-KV's 512 keys: the
    logits of every position against the float64 reference, and the same bits for 1, 2 and 3
    threads."""
    import megafuse
    path = quantized_copy(os.path.join(ARCH_DIR, f"{name}.gguf"), tmp_path / "q.gguf", "Q8_0")
    ids = np.random.default_rng(3).integers(0, 128, 600)
    results = []
    for n_threads in (1, 2, 3):
        megafuse.set_num_threads(n_threads)
        model = Model.from_gguf(path, activations=mode, cache_capacity=640)
        model._runner.solo_bytes = 0                  # on the team, even this small model
        assert model._layers[0]["k_cache"].shape[1] == 136 < 640
        rows = [model.forward(ids[:300], logits="all")]
        rows += [model.forward(ids[t:t + 1], logits="all") for t in range(300, 324)]
        results.append(np.concatenate(rows))
        if n_threads == 1:
            want, _ = model.reference(ids[:324])
            tol = TOL["float"] * 10 if mode == "float" else 2e-2
            assert rel_err(results[0], want) < tol
            # decode at 560 .. 599 too: the global layers' keys split, the windows' do not
            model.forward(ids[324:560])
            far = np.concatenate([model.forward(ids[t:t + 1], logits="all")
                                  for t in range(560, 600)])
            want, _ = model.reference(ids[:600])
            assert rel_err(far, want[560:600]) < tol
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_gemma3_float16_cache_and_its_reference():
    model = Model.from_gguf(os.path.join(ARCH_DIR, "gemma3.gguf"), activations="float",
                            kv_dtype="float16")
    ids = np.load(os.path.join(ARCH_DIR, "gemma3_hf.npz"))["ids"]
    assert_model_matches_reference(model, ids, tol_float=TOL["float"] * 10)


def test_a_gemma3_layer_from_the_file_matches_its_reference():
    import megafuse
    path = os.path.join(ARCH_DIR, "gemma3.gguf")
    for index, window in ((0, 8), (5, 0)):       # a windowed layer, the global one
        layer = megafuse.DecoderLayer.from_gguf(path, index, activations="float")
        assert layer.window == window and layer.gate == "gelu_tanh"
        x = np.random.default_rng(index).standard_normal((20, 64)).astype(np.float32)
        assert rel_err(layer.prefill(x), layer.reference(x)) < TOL["float"] * 10


def test_the_table_describes_each_architectures_features():
    rows = _arch.ARCHITECTURES
    assert rows["gemma3"].norm_placement == "sandwich" and rows["gemma3"].qk_norm
    assert rows["qwen3"].norm_placement == "pre" and rows["qwen3"].qk_norm
    assert rows["llama"].norm_placement == "pre" and not rows["llama"].qk_norm
    assert rows["gemma2"].activation == rows["gemma3"].activation == "gelu_tanh"
    from megafuse.llm.gguf import hparams
    hp = hparams(os.path.join(ARCH_DIR, "gemma3.gguf"))
    assert hp["window_layers"] == [True] * 5 + [False] and hp["sliding_window"] == 8
    assert hp["rope_theta_swa"] == 10000.0 and hp["rope_theta"] == 1e6
    assert hp["attn_scale"] == 1 / np.sqrt(32) and hp["embed_scale"] == np.float32(8.0)
    hp2 = hparams(os.path.join(ARCH_DIR, "gemma2.gguf"))
    assert hp2["window_layers"] == [True, False]
    assert (hp2["attn_softcap"], hp2["final_softcap"]) == (50.0, 30.0)


def test_yarn_and_longrope_tables():
    """YaRN: the file's factor and original context reach the tables; LongRoPE: the short
    factors up to the original context, the long ones past it, and the attention factor."""
    from megafuse.llm.layer import rope_tables
    yarn = Model.from_gguf(os.path.join(ARCH_DIR, "qwen2_yarn.gguf"))
    assert yarn.config.rope_yarn == (4.0, 64, 32.0, 1.0)
    plain, _ = rope_tables(16, yarn.cache_capacity, 10000.0)
    assert not np.allclose(yarn.rope_cos, plain)
    path = os.path.join(ARCH_DIR, "phi3_longrope.gguf")
    from megafuse.llm.gguf import GGUFFile, tensor
    reader = GGUFFile(path)
    long, _ = tensor(reader, "rope_factors_long.weight")
    short, _ = tensor(reader, "rope_factors_short.weight")
    for capacity, factors in ((64, short), (256, long)):
        model = Model.from_gguf(path, cache_capacity=capacity)
        factor = model.config.rope_attn_factor              # the file's (float32)
        assert factor == np.float32(np.sqrt(1 + np.log(256 / 64) / np.log(64)))
        want, _ = rope_tables(16, capacity, 10000.0, freq_factors=factors, attn_factor=factor)
        np.testing.assert_array_equal(model.rope_cos, want)


def test_phi3_fused_tensors_are_cut_into_the_layer_roles():
    """attn_qkv is cut into wq / wk / wv by rows (views of the file: no copy) and ffn_up is w1
    (gate rows, then up rows) as it is."""
    from megafuse.llm import gguf
    reader = gguf.GGUFFile(os.path.join(ARCH_DIR, "phi3.gguf"))
    arrays = gguf.layer_arrays(reader, 0)
    qkv, _ = gguf.tensor(reader, "blk.0.attn_qkv.weight")
    H, G, D = arrays["num_heads"], arrays["num_kv_heads"], arrays["head_dim"]
    assert arrays["wq"].shape[0] == H * D and arrays["wk"].shape[0] == G * D
    np.testing.assert_array_equal(np.concatenate([arrays["wq"], arrays["wk"], arrays["wv"]]),
                                  qkv)
    assert np.shares_memory(arrays["wq"], qkv)
    assert arrays["w1"].shape[0] == 2 * arrays["intermediate_dim"]


def test_shape_rules():
    dims = {"E": 64, "H": 4, "G": 2, "D": 16, "I": 96}
    assert _arch.evaluate("(H+2*G)*D", dims) == 128
    assert _arch.evaluate("D//2", dims) == 8
    with pytest.raises(ValueError, match="only names"):
        _arch.evaluate("__import__('os')", dims)


def test_no_layer_tensor_name_is_spelled_outside_the_table():
    """The GGUF names of a layer's tensors live in megafuse/llm/arch.py only."""
    names = {t.gguf.split(".")[0] for a in _arch.ARCHITECTURES.values() for t in a.layer_tensors}
    pattern = re.compile(r"[\"'.](" + "|".join(sorted(names)) + r")\.(weight|bias)")
    offenders = []
    for path in glob.glob(os.path.join(ROOT, "megafuse", "**", "*.*"), recursive=True):
        if path.endswith(("arch.py", ".so", ".c")) or "__pycache__" in path:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if pattern.search(line):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_an_unknown_architecture_names_the_ones_megafuse_runs():
    with pytest.raises(NotImplementedError, match="llama, phi3, qwen2"):
        _arch.architecture("mamba")
