"""megafuse.llm.completion: the text API in llama-cpp-python's shapes, on SmolLM2 (float mode):
responses and chunks, stop strings, logprobs, n and seeds, penalties, logits processors,
structured output through llguidance, embeddings, prefix reuse, and every bad argument refused
before the cache is touched."""
import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from megafuse.llm import completion as C
from megafuse.llm.model import Model

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model(smollm2_path):
    return Model.from_gguf(smollm2_path, cache_capacity=512, activations="float")


def test_chat_completion_shape_and_answer(model):
    r = model.create_chat_completion(FRANCE, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert isinstance(r["created"], int) and isinstance(r["model"], str)
    (choice,) = r["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert "Paris" in choice["message"]["content"] and choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None
    u = r["usage"]
    assert u["prompt_tokens"] == 37 and u["total_tokens"] == 37 + u["completion_tokens"] > 37


def test_streaming_gives_the_same_text_in_openai_chunks(model):
    whole = model.create_chat_completion(FRANCE, temperature=0)["choices"][0]
    chunks = list(model.create_chat_completion(FRANCE, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["message"]["content"]
    pieces = list(model.create_completion("The capital of France is", temperature=0,
                                          max_tokens=6, stream=True))
    assert all(p["object"] == "text_completion" for p in pieces)
    assert pieces[-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(p["choices"][0]["text"] for p in pieces)
    assert text == model.create_completion("The capital of France is", temperature=0,
                                           max_tokens=6)["choices"][0]["text"]


def test_stop_strings_are_trimmed_and_never_split(model):
    prompt = "Count from 1 to 10: 1, 2, 3,"
    full = model.create_completion(prompt, temperature=0, max_tokens=24)["choices"][0]["text"]
    assert "10." in full
    r = model.create_completion(prompt, temperature=0, max_tokens=24, stop="10.")
    (choice,) = r["choices"]
    assert choice["text"] == full[:full.index("10.")] and choice["finish_reason"] == "stop"
    assert "9," in choice["text"]
    # streamed: the held-back start of the stop string never reaches the client
    chunks = list(model.create_completion(prompt, temperature=0, max_tokens=24,
                                          stop=["10.", "zzz"], stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_logprobs_in_both_shapes(model):
    r = model.create_completion("The capital of France is", temperature=0, max_tokens=3,
                                logprobs=2)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert lp["text_offset"][0] == 0
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 2 and chosen <= 0 and max(top.values()) == pytest.approx(chosen)
    r = model.create_chat_completion(FRANCE, temperature=0, max_tokens=3, logprobs=True,
                                     top_logprobs=3)
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 3 for c in content)
    assert bytes(content[0]["bytes"]).decode() == content[0]["token"]
    probs = np.exp([t["logprob"] for t in content[1]["top_logprobs"]])
    assert np.all(np.diff(probs) <= 0) and probs.sum() <= 1 + 1e-9


def test_n_choices_and_seeds(model):
    r = model.create_completion("Once upon a time", n=3, seed=5, max_tokens=8, temperature=1.0)
    texts = [c["text"] for c in r["choices"]]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2] and len(set(texts)) > 1
    again = model.create_completion("Once upon a time", n=3, seed=5, max_tokens=8,
                                    temperature=1.0)
    assert [c["text"] for c in again["choices"]] == texts
    assert r["usage"]["completion_tokens"] == 24
    # choice i draws with seed + i
    one = model.create_completion("Once upon a time", seed=6, max_tokens=8, temperature=1.0)
    assert one["choices"][0]["text"] == texts[1]


def test_logits_processor_and_logit_bias(model):
    tok = model.tokenizer
    paris = tok.encode(" Paris", add_special=False)
    assert len(paris) == 1
    base = model.create_completion("The capital of France is", temperature=0, max_tokens=1)
    assert base["choices"][0]["text"] == " Paris"
    seen = []

    def ban_paris(input_ids, scores):
        seen.append(len(input_ids))
        scores[paris[0]] = -np.inf
        return scores
    r = model.create_completion("The capital of France is", temperature=0, max_tokens=2,
                                logits_processor=[ban_paris])
    assert "Paris" not in r["choices"][0]["text"] and seen[:1] == [5]
    r = model.create_completion("The capital of France is", temperature=0, max_tokens=1,
                                logit_bias={str(paris[0]): -100})
    assert r["choices"][0]["text"] != " Paris"
    r = model.create_completion("The capital of France is", temperature=0, max_tokens=3,
                                repeat_penalty=1.0, presence_penalty=0.0)
    assert r["choices"][0]["text"].startswith(" Paris")


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def test_response_format_json_schema(model):
    jsonschema = pytest.importorskip("jsonschema")
    r = model.create_chat_completion(
        [{"role": "user", "content": "Describe a person as JSON."}], temperature=0,
        max_tokens=60, response_format={"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": SCHEMA}})
    text = r["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), SCHEMA)
    assert r["choices"][0]["finish_reason"] == "stop"
    r = model.create_completion("A JSON object:", temperature=0, max_tokens=40,
                                response_format={"type": "json_object"})
    assert isinstance(json.loads(r["choices"][0]["text"]), dict)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(response_format={"type": "yaml"}), ValueError, "response_format"),
    (dict(response_format={"type": "json_schema"}), ValueError, "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": 5}}}),
     ValueError, "response_format"),
    (dict(response_format="json"), TypeError, "response_format"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(stop=3), TypeError, "stop"),
    (dict(stop=""), ValueError, "stop"),
    (dict(n=0), ValueError, "n"),
    (dict(logprobs=21), ValueError, "logprobs"),
    (dict(max_tokens="many"), TypeError, "max_tokens"),
    (dict(logits_processor=5), TypeError, "logits_processor"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(logit_bias={99999999: 1}), ValueError, "logit_bias"),
])
def test_bad_arguments_are_refused_before_anything_runs(model, kwargs, err, match):
    seq = model.default_sequence
    model.create_completion("Hello there", max_tokens=1)
    before = (seq.position, seq.tokens)
    with pytest.raises(err, match=match):
        model.create_completion("Hello there", **kwargs)
    with pytest.raises(err, match=match):
        model.create_completion("Hello there", stream=True, **kwargs)     # eagerly, too
    assert (seq.position, seq.tokens) == before


def test_bad_prompts_and_messages(model):
    with pytest.raises(ValueError, match="prompt: 600 tokens leave no room"):
        model.create_completion(list(range(600)))
    with pytest.raises(TypeError, match="prompt"):
        model.create_completion(3.5)
    with pytest.raises(ValueError, match="prompt"):
        model.create_completion([1, 2, 10**6])
    with pytest.raises(TypeError, match="messages"):
        model.create_chat_completion("hi")
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        model.create_chat_completion([{"content": "no role"}])
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]"):
        model.create_chat_completion([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ValueError, match="top_logprobs"):
        model.create_chat_completion(FRANCE, top_logprobs=2)
    r = model.create_chat_completion([{"role": "user", "content": [
        {"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]}],
        temperature=0, max_tokens=8)
    assert "Paris" in r["choices"][0]["message"]["content"]


def test_an_open_stream_holds_its_sequence(model):
    stream = model.create_completion("Hello", max_tokens=4, stream=True)
    next(stream)
    with pytest.raises(RuntimeError, match="unfinished stream"):
        model.create_completion("Hello", max_tokens=1)
    stream.close()
    model.create_completion("Hello", max_tokens=1)


def test_a_second_turn_reuses_the_first_turns_prompt(model):
    """A long first turn, then the conversation continued: the second prefill runs only what
    follows the first turn's whole chunks, and answers as a fresh sequence would."""
    story = " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}."
                     for i in range(25))
    turn1 = [{"role": "user", "content": story + " Is 7 even or odd?"}]
    r1 = model.create_chat_completion(turn1, temperature=0, max_tokens=12)
    seq = model.default_sequence
    turn2 = turn1 + [r1["choices"][0]["message"], {"role": "user", "content": "And 8?"}]
    ids2 = C.chat_prompt_ids(model, turn2, seq.cache_capacity)
    assert seq.reusable_prefix(ids2) >= 256
    r2 = model.create_chat_completion(turn2, temperature=0, max_tokens=12)
    fresh = C.create_chat_completion(model.new_sequence(), turn2, temperature=0, max_tokens=12)
    assert r2["choices"][0]["message"] == fresh["choices"][0]["message"]


def test_embeddings(model):
    r = model.create_embedding(["The cat sat on the mat.", "A cat was sitting on a mat.",
                                "Quarterly revenue rose by four percent."])
    assert r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1, 2]
    v = np.array([d["embedding"] for d in r["data"]])
    assert v.shape == (3, 576)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]                  # the paraphrase is closer
    # the mean of the final-normed hidden states, normalised
    ids = model.tokenizer.encode("The cat sat on the mat.")
    rows = model.new_sequence().normed_hidden(ids).astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(v[0], rows / np.linalg.norm(rows), atol=1e-5)
    assert r["usage"]["prompt_tokens"] == sum(
        len(model.tokenizer.encode(t)) for t in ["The cat sat on the mat.",
                                                 "A cat was sitting on a mat.",
                                                 "Quarterly revenue rose by four percent."])
    with pytest.raises(TypeError, match="input"):
        model.create_embedding(5)
