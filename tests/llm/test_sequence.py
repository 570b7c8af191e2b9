"""megafuse.llm.sequence: many sequences on one copy of the weights, prefix reuse, rewind,
state save / load, and the generation defects of issue 37 (each test fails without its fix).

A small synthetic llama file (test_model.write_model) for the cache mechanics; SmolLM2 where
text is needed."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from megafuse.llm.model import Model  # noqa: E402
from megafuse.llm.sequence import PREFILL_CHUNK, Sequence, SequenceState  # noqa: E402
from test_model import VOCAB, write_model  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("seq") / "m.gguf", "llama", "Q8_0")
    # past the tiny file's 256-token context on purpose: the sequences' tests need 512 positions
    with pytest.warns(RuntimeWarning, match="cache_capacity = 512 is more than"):
        return Model.from_gguf(path, cache_capacity=512, activations="float")


def ids_of(n, seed=0):
    return [int(i) for i in np.random.default_rng(seed).integers(0, VOCAB, n)]


def test_sequences_share_the_weights_and_keep_their_own_caches(small):
    a, b = small.new_sequence(), small.new_sequence(cache_capacity=64)
    assert isinstance(a, Sequence) and b.cache_capacity == 64 and a.cache_capacity == 512
    for name in ("wq", "wk", "wv", "wo", "w1", "w2"):
        assert a._layers[0][name] is b._layers[0][name] is small._layers[0][name]
    caches = {id(s._arena) for s in (a, b, small.default_sequence)}
    assert len(caches) == 3
    x, y = ids_of(20, 1), ids_of(20, 2)

    def alone(ids):
        s = small.new_sequence()
        return [s.forward(ids[:10])] + [s.forward(ids[t:t + 1]) for t in range(10, 20)]

    want_x, want_y = alone(x), alone(y)
    got_x, got_y = [a.forward(x[:10])], [b.forward(y[:10])]
    for t in range(10, 20):                               # interleaved token by token
        got_x.append(a.forward(x[t:t + 1]))
        got_y.append(b.forward(y[t:t + 1]))
    np.testing.assert_array_equal(np.stack(got_x), np.stack(want_x))
    np.testing.assert_array_equal(np.stack(got_y), np.stack(want_y))
    assert not np.array_equal(got_x[-1], got_y[-1])
    assert a.position == b.position == 20 and a.tokens == x and b.tokens == y


def test_new_sequences_within_the_models_rope_tables(small):
    with pytest.raises(ValueError, match="at most the model's cache_capacity = 512"):
        small.new_sequence(cache_capacity=700)            # the model's tables have 512 rows
    assert small.new_sequence(cache_capacity=100).forward(ids_of(3)).shape == (VOCAB,)
    with pytest.raises(TypeError, match="cache_capacity"):
        small.new_sequence(cache_capacity=2.5)
    with pytest.raises(ValueError, match="cache_capacity"):
        small.new_sequence(cache_capacity=0)


def test_rewind_truncates_and_the_rows_are_rewritten(small):
    s = small.new_sequence()
    x, y = ids_of(30, 3), ids_of(12, 4)
    s.forward(x)
    s.rewind(18)
    assert s.position == 18 and s.tokens == x[:18]
    got = s.forward(y, logits="all")
    fresh = small.new_sequence()
    fresh.forward(x[:18])
    np.testing.assert_array_equal(got, fresh.forward(y, logits="all"))
    for bad, err in ((31 + 12, ValueError), (-1, ValueError), (1.0, TypeError)):
        with pytest.raises(err, match="position"):
            s.rewind(bad)
    assert s.position == 30


def test_save_and_load_state(small):
    s = small.new_sequence()
    x = ids_of(40, 5)
    s.forward(x[:33])
    state = s.save_state()
    assert isinstance(state, SequenceState) and state.position == 33
    want = s.forward(x[33:], logits="all")
    other = small.new_sequence(cache_capacity=64)
    other.forward(ids_of(50, 6))                          # something else in it first
    other.load_state(state)
    assert other.position == 33 and other.tokens == x[:33]
    np.testing.assert_array_equal(other.forward(x[33:], logits="all"), want)
    with pytest.raises(TypeError, match="state"):
        other.load_state({"tokens": x})
    with pytest.raises(ValueError, match="cache_capacity"):
        small.new_sequence(cache_capacity=16).load_state(state)


def test_prefix_reuse_keeps_whole_prefill_chunks_and_changes_no_bit(small, monkeypatch):
    """The second prompt shares 300 tokens with the first: the two whole chunks (256) are kept,
    the rest runs, and the logits are those of a prefill from scratch.  Tokens written by
    decode steps are never reused."""
    s = small.new_sequence()
    first = ids_of(310, 7)
    second = first[:300] + ids_of(20, 8)
    s.prefill(first)
    assert s.reusable_prefix(second) == 2 * PREFILL_CHUNK
    ran = []
    real = s._runner.forward
    monkeypatch.setattr(s, "_runner", type("R", (), {"forward": staticmethod(
        lambda **kw: ran.append((kw["start_pos"], kw["tokens"].size)) or real(**kw))})())
    got = s.prefill(second)
    assert ran == [(256, 64)]                             # only the rest of the prompt ran
    monkeypatch.undo()
    np.testing.assert_array_equal(got, small.new_sequence().prefill(second))
    assert s.tokens == second
    # a different token inside the first chunk: nothing is kept
    assert s.reusable_prefix([second[0] + 1] + second[1:]) == 0
    # tokens written one at a time (decode) are not reused
    d = small.new_sequence()
    for t in first[:300]:
        d.forward([t])
    assert d.reusable_prefix(second) == 0
    # a rewind inside a chunk keeps the whole chunks before it
    s.rewind(200)
    assert s.reusable_prefix(second) == PREFILL_CHUNK


def test_prefill_checks_before_writing(small):
    s = small.new_sequence(cache_capacity=64)
    s.prefill(ids_of(10))
    with pytest.raises(ValueError, match="cache_capacity = 64"):
        s.prefill(ids_of(65))
    with pytest.raises(ValueError, match="token ids in"):
        s.prefill([1, 2, VOCAB])
    assert s.position == 10


def test_a_sequence_is_used_by_one_thread_at_a_time(small):
    s = small.new_sequence()
    s._lock.acquire()
    try:
        with pytest.raises(RuntimeError, match="another thread"):
            s.forward([1])
    finally:
        s._lock.release()
    assert s.position == 0


# ---- generation defects (issue 37) ----------------------------------------------------------

def test_generate_keeps_every_yielded_token_in_the_cache(small):
    """The last yielded token is written too: a 43-token prompt + 5 tokens ends at 48 (it was
    47), and the cache holds what a forward of prompt + tokens would."""
    small.reset()
    prompt = ids_of(43, 9)
    out = list(small.generate(prompt, 5))
    assert len(out) == 5 and small.position == 48 and small.tokens == prompt + out
    assert small.stop_reason == "length"
    state = small.save_state()
    fresh = small.new_sequence()
    for t in prompt + out:                               # the same rows, written one by one
        fresh.forward([t])
    for got, want in zip(state.kv, fresh.save_state().kv):     # a layer each: [2, G, P, D]
        np.testing.assert_allclose(got[:, :, 43:], want[:, :, 43:], rtol=0, atol=1e-5)
    small.reset()


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(repeat_penalty=float("inf")), ValueError, "repeat_penalty"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(stop=""), ValueError, "stop"),
    (dict(stop=[""]), ValueError, "stop"),
    (dict(stop=3), TypeError, "stop"),
    (dict(stop=[1.5]), TypeError, "stop"),
    (dict(stop=[VOCAB]), ValueError, "stop"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(temperature="hot"), TypeError, "temperature"),
])
def test_generate_refuses_bad_arguments_before_writing(small, kwargs, err, match):
    small.reset()
    small.forward([1, 2, 3])
    with pytest.raises(err, match=match):
        small.generate([4, 5], 3, **kwargs)
    assert small.position == 3
    small.reset()


def test_a_tiny_temperature_samples_the_top_token(small):
    """temperature=5e-324 passed the check, then NumPy raised 'Probabilities contain NaN'
    with the prompt already in the cache: now it is the (near-)greedy choice."""
    small.reset()
    prompt = ids_of(5, 10)
    greedy = list(small.generate(prompt, 3))
    small.reset()
    assert list(small.generate(prompt, 3, temperature=5e-324, seed=1)) == greedy
    assert small.position == 8
    small.reset()


def test_stop_string_is_not_split_into_characters(smollm2_float):
    """stop="10." stopped at '1' (the string was iterated as characters)."""
    m = smollm2_float
    ids = m.tokenizer.encode("Count from 1 to 10: 1, 2, 3,")
    m.reset()
    text = m.tokenizer.decode(list(m.generate(ids, 30, stop="10.")))
    assert text.endswith("10.") and "9," in text, text
    assert m.stop_reason == "stop"
    m.reset()
    # a token id in the list still stops before it
    first = list(m.generate(ids, 3))
    m.reset()
    assert list(m.generate(ids, 3, stop=[first[1]])) == first[:1]
    m.reset()


@pytest.fixture(scope="module")
def smollm2_float(smollm2_path):
    pytest.importorskip("tokenizers")
    return Model.from_gguf(smollm2_path, cache_capacity=512, activations="float")


def test_a_continued_conversation_loses_no_token(smollm2_float):
    """Generate, then append the next turn at ``position``: the cache then holds exactly the
    ids of prompt + answer + next turn (before the fix the answer's last token was missing)."""
    m = smollm2_float
    tok = m.tokenizer
    m.reset()
    prompt = tok.encode("The capital of France is")
    answer = list(m.generate(prompt, 4))
    more = tok.encode(" And of Italy?", add_special=False)
    logits = m.forward(more)
    assert m.tokens == prompt + answer + more
    fresh = m.new_sequence()
    want = fresh.prefill(prompt + answer + more)
    assert int(np.argmax(logits)) == int(np.argmax(want))
    m.reset()
