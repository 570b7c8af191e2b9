"""megafuse.serve.engine: a request's output is the same alone or among others, at any thread
count (greedy tokens and their logprobs, bit for bit); cancelling frees the sequence; the
queue limit; a failing request does not stop the others."""
import queue
import threading

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import megafuse
from megafuse.llm import completion as C
from megafuse.serve.engine import Engine, QueueFull, StepInput

from helpers import hang_timeout

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "Water boils at", " ".join(f"item {i}," for i in range(70)),   # > 128 tokens
           "The three primary colors are", "1, 2, 3,"]


def run(engine, model, requests):
    """Submit every (prompt, max_tokens) at once; return each one's (ids, logprobs, text,
    finish_reason) once all are done."""
    events = queue.Queue()
    for i, (prompt, n) in enumerate(requests):
        ids = C.prompt_ids(model, prompt, engine.cache_capacity)
        s = C.settings(model, max_tokens=n, temperature=0, logprobs=0)
        engine.submit_generation(ids, s, lambda e, i=i: events.put((i, e)))
    results, done = {}, 0
    while done < len(requests):
        i, e = events.get(timeout=hang_timeout(120))
        if e.kind == "done":
            done += 1
        elif e.kind == "error":
            raise e.error
        elif e.kind == "delta" and e.delta.finish_reason is not None:
            g = e.generation
            results[i] = (g.completion_ids, [x["logprob"] for x in g.logprobs], g.text,
                          g.finish_reason)
    return [results[i] for i in range(len(requests))]


@pytest.fixture(scope="module")
def requests_():
    return [(p, 6 + (i % 3) * 3) for i, p in enumerate(PROMPTS)]


def test_outputs_alone_equal_outputs_among_others_at_any_thread_count(float_model, requests_,
                                                                      threads):
    model = float_model
    megafuse.set_num_threads(1)
    alone_engine = Engine(model, parallel=1, cache_capacity=512)
    try:
        alone = [run(alone_engine, model, [r])[0] for r in requests_]
    finally:
        alone_engine.close()
    megafuse.set_num_threads(2)
    engine = Engine(model, parallel=4, cache_capacity=512)
    try:
        together = run(engine, model, requests_ + requests_[::-1])
        steps = engine.steps
    finally:
        engine.close()
    assert together[:len(alone)] == alone
    assert together[len(alone):] == alone[::-1]
    # they really ran together: fewer steps than one after the other
    assert steps < sum(len(a[0]) for a in alone) * 2
    assert all(a[3] in ("length", "stop") and a[0] for a in alone)


def test_step_gives_each_sequence_what_it_gets_alone(float_model):
    """Engine.step, the native batched step: a batch mixing a prefill chunk, a write-only chunk,
    a decode token and hidden rows equals each call made alone."""
    model = float_model
    engine = Engine(model, parallel=3, cache_capacity=256)
    try:
        a, b, c = engine.sequences
        rng = np.random.default_rng(0)
        ids = [rng.integers(0, 49152, n).astype(np.int32) for n in (40, 128, 1)]
        a.forward(ids[2])
        out = engine.step([StepInput(a, ids[2], "logits"), StepInput(b, ids[1], "none"),
                           StepInput(c, ids[0], "hidden")])
        ref_a, ref_c = model.new_sequence(256), model.new_sequence(256)
        ref_a.forward(ids[2])
        np.testing.assert_array_equal(out[0], ref_a.forward(ids[2]))
        assert out[1] is None and b.position == 128
        np.testing.assert_array_equal(out[2], ref_c.last_hidden(ids[0]))
    finally:
        engine.close()


class CountingLeader:
    """The engine's leading runner, counting its batched calls and their sizes."""

    def __init__(self, runner):
        self.runner, self.calls = runner, []
        self.max_sequences = runner.max_sequences

    def forward_batch(self, items):
        items = list(items)
        self.calls.append([int(np.asarray(it[1]).size) for it in items])
        return self.runner.forward_batch(items)


@pytest.mark.parametrize("activations", ["int8", "float"])
def test_step_packs_the_batch_in_native_calls(smollm2_path, activations, threads):
    """Decode tokens of six sequences, a 100-token chunk, a 128-token chunk and a 300-token
    input (more than one call takes) in one step: the decode tokens and the 100-token chunk share
    calls of at most 128 tokens and `parallel` sequences, the 300 tokens run on their own, and
    every output is bitwise what each sequence gets alone."""
    pytest.importorskip("tokenizers")
    from megafuse.llm.model import Model
    model = Model.from_gguf(smollm2_path, cache_capacity=512, activations=activations)
    rng = np.random.default_rng(1)
    lengths = [1, 1, 100, 1, 128, 1, 300, 1, 1]
    history = [rng.integers(0, 49152, 5 + 7 * i).astype(np.int32) for i in range(len(lengths))]
    ids = [rng.integers(0, 49152, n).astype(np.int32) for n in lengths]
    outputs = ["logits", "logits", "hidden", "logits", "none", "logits", "logits", "logits",
               "hidden"]
    want = []
    for h, x, o in zip(history, ids, outputs):
        seq = model.new_sequence(512)
        seq.write(h)
        want.append(seq.forward(x) if o == "logits" else seq.last_hidden(x) if o == "hidden"
                    else (seq.write(x), None)[1])
    for n in (1, 2, 3):
        megafuse.set_num_threads(n)
        engine = Engine(model, parallel=len(lengths), cache_capacity=512)
        try:
            engine._leader = leader = CountingLeader(engine._leader)
            for seq, h in zip(engine.sequences, history):
                seq.write(h)
            got = engine.step([StepInput(s, x, o)
                               for s, x, o in zip(engine.sequences, ids, outputs)])
            for g, w in zip(got, want):
                if w is None:
                    assert g is None
                else:
                    np.testing.assert_array_equal(g, w)
            assert [s.position for s in engine.sequences] == [
                h.size + x.size for h, x in zip(history, ids)]
            assert leader.calls == [[1, 1, 100, 1], [128], [1, 1, 1]]
        finally:
            engine.close()


def test_step_checks_everything_before_it_runs(float_model):
    engine = Engine(float_model, parallel=2, cache_capacity=64)
    try:
        a, b = engine.sequences
        ok = np.array([1, 2, 3], dtype=np.int32)
        for bad, match in [([StepInput(a, ok, "logits"), StepInput(a, ok, "logits")], "twice"),
                           ([StepInput(a, ok, "logits"), StepInput(b, ok, "all")], "output"),
                           ([StepInput(a, ok, "logits"),
                             StepInput(b, np.array([49152], dtype=np.int32), "logits")],
                            "49152|vocab"),
                           ([StepInput(a, ok, "logits"),
                             StepInput(b, np.zeros(65, dtype=np.int32), "none")],
                            "cache_capacity")]:
            with pytest.raises(ValueError, match=match):
                engine.step(bad)
            assert a.position == 0 and b.position == 0
    finally:
        engine.close()


def test_a_cancelled_request_frees_its_sequence_at_once(float_model):
    engine = Engine(model := float_model, parallel=1, max_queue=4, cache_capacity=256)
    try:
        got = queue.Queue()
        first = threading.Event()

        def on_event(e):
            got.put(e)
            first.set()
        ids = C.prompt_ids(model, "Tell me a long story.", 256)
        job = engine.submit_generation(ids, C.settings(model, max_tokens=200, temperature=0),
                                       on_event)
        assert first.wait(hang_timeout(60))
        job.cancel()
        while got.get(timeout=hang_timeout(30)).kind != "done":
            pass
        assert engine.load["free"] == 1 and engine.load["running"] == 0
        # the freed sequence serves the next request
        out = run(engine, model, [("The capital of France is", 3)])
        assert out[0][2].startswith(" Paris")
    finally:
        engine.close()


def test_the_queue_limit_and_a_failing_request(float_model):
    model = float_model
    engine = Engine(model, parallel=1, max_queue=1, cache_capacity=256)
    try:
        ids = C.prompt_ids(model, "Hello", 256)
        events = queue.Queue()
        s = C.settings(model, max_tokens=50, temperature=0)
        engine.submit_generation(ids, s, events.put)
        engine.submit_generation(ids, s, events.put)                 # waits
        with pytest.raises(QueueFull, match="max_queue = 1"):
            engine.submit_generation(ids, s, events.put)

        def broken(input_ids, scores):
            raise RuntimeError("processor broke")
        bad = C.settings(model, max_tokens=5, temperature=0, logits_processor=broken)
        failed = queue.Queue()
        while engine.load["waiting"]:
            threading.Event().wait(0.05)
        engine.submit_generation(ids, bad, failed.put)
        kinds = []
        while True:
            e = failed.get(timeout=hang_timeout(120))
            kinds.append(e.kind)
            if e.kind == "done":
                break
        assert kinds == ["error", "done"]
        assert run(engine, model, [("The capital of France is", 2)])[0][2] == " Paris."
    finally:
        engine.close()
    assert engine.closed
