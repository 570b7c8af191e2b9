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


def test_the_recorded_cases_are_there():
    assert {"phi3", "mistral"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_float_mode_matches_hf_on_the_same_weights(name):
    want = np.load(os.path.join(ARCH_DIR, f"{name}_hf.npz"))
    model = Model.from_gguf(os.path.join(ARCH_DIR, f"{name}.gguf"), activations="float")
    got = model.forward(want["ids"], logits="all")
    assert rel_err(got, want["logits"]) < 1e-4
    assert np.array_equal(got.argmax(1), want["logits"].argmax(1))


@pytest.mark.parametrize("mode", ["float", "int8"])
@pytest.mark.parametrize("name", CASES)
def test_every_layer_matches_the_float64_reference(name, mode):
    ids = np.load(os.path.join(ARCH_DIR, f"{name}_hf.npz"))["ids"]
    model = Model.from_gguf(os.path.join(ARCH_DIR, f"{name}.gguf"), activations=mode)
    assert_model_matches_reference(model, ids, tol_float=TOL["float"] * 10)


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
