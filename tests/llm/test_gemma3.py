"""The real Gemma 3 270M (gemma3, a Q4_K_M mix: Q5_0, Q4_K, Q6_K, Q8_0, F32 norms), fetched once
like SmolLM2 (the gemma3_path fixture), against transformers' float32 model of the same file
(tests/data/gemma3_hf_reference.npz, made by tests/data/make_gemma3_reference.py):

- float mode: teacher-forced top-1 on an English passage and on a prompt past the 512-token
  window, greedy continuations of completion prompts;
- int8 mode: top-1 agreement at least llama.cpp's on the same passage (llama.cpp's predictions
  recorded in the same file, when they were made with the peer installed);
- a windowed and a global layer against the float64 reference on the real weights.
"""
import os

import numpy as np
import pytest

from megafuse.llm.model import Model
from helpers import DATA_DIR, TOL, rel_err

REF = np.load(os.path.join(DATA_DIR, "gemma3_hf_reference.npz"))
PROMPTS = sorted({k.split("_")[0] for k in REF.files if k.startswith("prompt")})
NEAR_TIE = 0.1          # logits: a greedy step whose two best are closer than this is a tie


@pytest.fixture(scope="module")
def gemma3_float(gemma3_path):
    return Model.from_gguf(gemma3_path, activations="float", cache_capacity=1024)


def top1(model, ids):
    model.reset()
    logits = model.forward(ids, logits="all")
    model.reset()
    return logits.argmax(1)


def test_the_file_is_gemma3_with_windows(gemma3_float):
    c = gemma3_float.config
    assert (c.architecture, c.n_layers, c.embed_dim, c.num_heads, c.num_kv_heads,
            c.head_dim, c.intermediate_dim, c.vocab_size) == ("gemma3", 18, 640, 4, 1, 256,
                                                              2048, 262144)
    assert c.sliding_window == 512 and c.window_layers == (True,) * 5 + (False,) + \
        (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert c.gate == "gelu_tanh" and c.tied_embedding and c.embed_scale == np.float32(640 ** 0.5)


def test_teacher_forced_top1_matches_transformers(gemma3_float):
    got = top1(gemma3_float, REF["passage_ids"])
    assert np.mean(got == REF["passage_top1"]) >= 0.995


def test_a_prompt_past_the_window_matches_transformers(gemma3_float):
    ids = REF["long_ids"]
    assert ids.size > 512
    got = top1(gemma3_float, ids)
    assert np.mean(got == REF["long_top1"]) >= 0.99


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuations_match_transformers(gemma3_float, prompt):
    """16 greedy tokens equal transformers', up to a near-tie (its two best within 0.1)."""
    model = gemma3_float
    want, margins = REF[f"{prompt}_greedy"], REF[f"{prompt}_margin"]
    model.reset()
    logits = model.forward(REF[f"{prompt}_ids"])
    got = []
    for _ in range(want.size):
        got.append(int(np.argmax(logits)))
        logits = model.forward(got[-1:])
    model.reset()
    ties = np.flatnonzero(margins < NEAR_TIE)
    n = int(ties[0]) if ties.size else want.size      # from a tie on, either way is right
    assert got[:n] == want[:n].tolist()


def test_int8_mode_agrees_at_least_as_well_as_llama_cpp(gemma3_path):
    model = Model.from_gguf(gemma3_path, activations="int8", cache_capacity=1024)
    ours = np.mean(top1(model, REF["passage_ids"]) == REF["passage_top1"])
    if "llama_cpp_passage_top1" in REF.files:
        peer = np.mean(REF["llama_cpp_passage_top1"] == REF["passage_top1"])
        assert ours >= peer
    assert ours >= 0.95


@pytest.mark.parametrize("index", [0, 5])           # a windowed layer, a global one
def test_real_layers_match_the_float64_reference(gemma3_float, index):
    layer = gemma3_float.layer(index, cache_capacity=600)
    assert layer.window == (512 if index == 0 else 0)
    x = np.random.default_rng(index).standard_normal((560, 640)).astype(np.float32) * 4
    assert rel_err(layer.prefill(x), layer.reference(x)) < TOL["float"] * 10


def test_the_window_cache_holds_a_long_context_in_less_memory(gemma3_path):
    """A 32k context: the windowed layers keep 512 + 128 rows, the global ones 32768."""
    model = Model.from_gguf(gemma3_path, cache_capacity=32768)
    per_row = 2 * 1 * 256 * 4                        # k and v of one position, float32
    assert model._cache_arena.nbytes == per_row * (3 * 32768 + 15 * 640)
