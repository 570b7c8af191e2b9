"""Several sequences in one native step (ModelRunner.forward_batch): the weights are read once
for all of them, and each sequence gets the bits of its own forward alone (docs/contract.md §7),
whatever else is in the step and however many threads run it: prefill chunks beside decode
tokens, sliding windows whose ring caches wrap, float activations (run sequence by sequence)
beside quantized ones (run over every row at once)."""
import os

import numpy as np
import pytest

import megafuse
from megafuse.llm import _runner
from megafuse.llm.model import Model
from helpers import DATA_DIR
from test_arch import quantized_copy
from test_model import BLOCK_FORMATS, write_model

# each sequence's chunks, in steps: the k-th chunk of every sequence that has one runs in step k
# (no step holds more than 128 tokens)
SCHEDULE = [
    [37, 1, 1, 1, 1, 1, 1, 1, 1],
    [5, 20, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1, 1, 1, 1],
    [60, 50, 90, 1, 1, 1, 1],
]


def sequences(model, n, caches=None):
    """n runners of the model's weights, each with KV caches of its own (one sequence each);
    caches, if given, receives each one's layer mappings."""
    out = []
    for _ in range(n):
        layers = [dict(spec, k_cache=np.zeros_like(spec["k_cache"]),
                       v_cache=np.zeros_like(spec["v_cache"])) for spec in model._layers]
        out.append(_runner.ModelRunner(layers=layers, max_sequences=n, **model._runner_args))
        if caches is not None:
            caches.append(layers)
    return out


def chunks(seed, vocab):
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, vocab, n).astype(np.int32) for n in lengths]
            for lengths in SCHEDULE]


def alone(model, work):
    """Each sequence's logits, its chunks run one by one on its own."""
    V = model.vocab_size
    result = []
    for runner, seq in zip(sequences(model, len(work)), work):
        pos, rows = 0, []
        for ids in seq:
            logits = np.empty(V, np.float32)
            runner.forward(ids, start_pos=pos, logits=logits)
            rows.append(logits)
            pos += ids.size
        result.append(np.stack(rows))
    return result


def batched(model, work):
    V = model.vocab_size
    runners = sequences(model, len(work))
    pos = [0] * len(work)
    rows = [[] for _ in work]
    for k in range(max(len(seq) for seq in work)):
        items, outs = [], []
        for s, seq in enumerate(work):
            if k < len(seq):
                logits = np.empty(V, np.float32)
                items.append((runners[s], seq[k], pos[s], logits, False, None))
                outs.append((s, logits))
                pos[s] += seq[k].size
        runners[0].forward_batch(items)
        for s, logits in outs:
            rows[s].append(logits)
    return [np.stack(r) for r in rows]


def assert_batch_equals_alone(model, threads=(1, 2, 3)):
    work = chunks(1, model.vocab_size)
    want = None
    for n in threads:
        megafuse.set_num_threads(n)
        got_alone = alone(model, work)
        got_batch = batched(model, work)
        for a, b in zip(got_alone, got_batch):
            np.testing.assert_array_equal(a, b)
        if want is None:
            want = got_alone
        for a, b in zip(want, got_batch):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["int8", "float"])
@pytest.mark.parametrize("fmt", ["Q4_1", "F16"])
def test_llama_batches_equal_each_sequence_alone(tmp_path, fmt, mode, threads):
    """Q4_1 in int8 mode: quantized activations, every row at once; F16 weights or float mode:
    float activations, sequence by sequence."""
    path = write_model(tmp_path / "m.gguf", "llama", fmt, n_layers=2)
    assert_batch_equals_alone(Model.from_gguf(path, activations=mode, cache_capacity=256))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS + ("F16", "BF16", "F32"))
def test_float_decode_rows_of_every_format_are_each_their_own(tmp_path, fmt, simd_level):
    """Float mode, a step of one token a sequence (decode): the projections and the (tied) head run
    every row at once with each row's bits its own (two tokens a pass through the 2-token 4-row
    dots where the level has them), odd and even sequence counts, at every SIMD level."""
    path = write_model(tmp_path / "m.gguf", "llama", fmt, n_layers=1, embed_format=fmt)
    model = Model.from_gguf(path, activations="float", cache_capacity=64)
    V = model.vocab_size
    for S in (2, 3, 5):
        rng = np.random.default_rng(S)
        prompts = [rng.integers(0, V, 3 + s).astype(np.int32) for s in range(S)]
        steps = rng.integers(0, V, (3, S)).astype(np.int32)
        alone = []
        for s, p in enumerate(prompts):
            (r,) = sequences(model, 1)
            r.forward(p, start_pos=0)
            rows = []
            for k in range(len(steps)):
                logits = np.empty(V, np.float32)
                r.forward(steps[k, s:s + 1], start_pos=p.size + k, logits=logits)
                rows.append(logits)
            alone.append(rows)
        runners = sequences(model, S)
        for r, p in zip(runners, prompts):
            r.forward(p, start_pos=0)
        for k in range(len(steps)):
            outs = [np.empty(V, np.float32) for _ in range(S)]
            runners[0].forward_batch([(runners[s], steps[k, s:s + 1], prompts[s].size + k,
                                       outs[s], False, None) for s in range(S)])
            for s in range(S):
                np.testing.assert_array_equal(outs[s], alone[s][k], err_msg=f"S={S} seq {s}")


@pytest.mark.parametrize("mode", ["int8", "float"])
def test_gemma3_windows_and_rings_in_batches(tmp_path, mode, threads):
    """Windows of 8 keys whose ring caches (136 rows) wrap inside a batch, q/k norms, sandwich
    norms, the GELU gate, per-layer RoPE."""
    path = quantized_copy(os.path.join(DATA_DIR, "arch", "gemma3.gguf"), tmp_path / "q.gguf",
                          "Q8_0")
    model = Model.from_gguf(path, activations=mode, cache_capacity=256)
    assert model._layers[0]["k_cache"].shape[1] == 136
    assert_batch_equals_alone(model, threads=(1, 2))


def test_last_layer_rows_and_all_logits_per_sequence(tmp_path):
    path = write_model(tmp_path / "m.gguf", "qwen2", "Q8_0", n_layers=2)
    model = Model.from_gguf(path, cache_capacity=64)
    a, b = sequences(model, 2)
    E, V = model.config.embed_dim, model.vocab_size
    ids_a, ids_b = np.arange(5, dtype=np.int32), np.arange(7, 10, dtype=np.int32)
    want_x, want_l = np.empty((5, E), np.float32), np.empty((3, V), np.float32)
    a.forward(ids_a, start_pos=0, x_out=want_x)
    b.forward(ids_b, start_pos=0, logits=want_l, all_logits=True)
    a2, b2 = sequences(model, 2)
    got_x, got_l = np.empty((5, E), np.float32), np.empty((3, V), np.float32)
    a2.forward_batch([(a2, ids_a, 0, None, False, got_x), (b2, ids_b, 0, got_l, True, None)])
    np.testing.assert_array_equal(got_x, want_x)
    np.testing.assert_array_equal(got_l, want_l)


def test_batch_mistakes_change_no_cache(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama", "Q8_0", n_layers=1)
    model = Model.from_gguf(path, cache_capacity=256)
    other = Model.from_gguf(path, cache_capacity=256)
    layers = []
    a, b = sequences(model, 2, layers)
    (c,) = sequences(other, 1)
    ids = np.arange(4, dtype=np.int32)
    a.forward(ids, start_pos=0)                     # something in a's cache to keep
    before = [(ly["k_cache"].copy(), ly["v_cache"].copy()) for seq in layers for ly in seq]
    cases = [
        ([(a, ids, 0, None, False, None), (a, ids, 0, None, False, None)], ValueError,
         "same sequence twice"),
        ([(a, ids, 0, None, False, None), (c, ids, 0, None, False, None)], ValueError,
         "another model"),
        ([(a, np.arange(129, dtype=np.int32) % 8, 0, None, False, None)], ValueError,
         "at most 128"),
        ([(a, ids, 254, None, False, None)], ValueError, "cache positions"),
        ([(a, np.array([1, 10 ** 6], np.int32), 0, None, False, None)], ValueError,
         "token ids"),
        ([(a, ids, 0, np.empty(3, np.float32), False, None)], ValueError, "logits"),
        ([(a, ids, 0)], TypeError, "expected"),
        ([(a, ids, 0, None, False, None)] * 3, ValueError, "max_sequences"),
    ]
    for items, error, match in cases:
        with pytest.raises(error, match=match):
            a.forward_batch(items)
    after = [(ly["k_cache"], ly["v_cache"]) for seq in layers for ly in seq]
    for (k0, v0), (k1, v1) in zip(before, after):
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)
    # the sequences still run
    logits = np.empty(model.vocab_size, np.float32)
    a.forward_batch([(a, ids, 0, logits, False, None), (b, ids, 0, None, False, None)])
    assert np.isfinite(logits).all()
