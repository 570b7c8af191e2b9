"""Serving: many sequences on one copy of the weights (megafuse.serve.engine.Engine).

    pytest benchmarks/bench_serve.py --benchmark-only      # the rows, in pytest-benchmark
    python benchmarks/bench_serve.py [--tokens 32]          # the same figures as a table

- streams-N: aggregate decode throughput of N concurrent greedy streams (N = 1, 2, 4, 8, 16),
  each a short prompt then --tokens new tokens (end-of-generation banned, so every stream runs
  them all), through Engine.step.  Until the native batched step lands, a step runs each
  sequence's forward in turn, so the aggregate stays near one stream's rate; the harness is
  the one the batched step is measured with.
- prefix-reuse: the second turn of a ~1000-token conversation, time to its first token with
  prefix reuse (the first turn's whole prefill chunks kept) and without (a fresh sequence);
  issue 37 asks for <= 25 %.
- rss-8: the process's resident memory with the model loaded, then with 8 sequences of 2048
  positions each (one copy of the weights, 8 KV caches).

The model is SmolLM2-135M-Instruct (float mode, the server's default), or
$MEGAFUSE_BENCH_MODEL; threads: $MEGAFUSE_BENCH_THREADS (2).
"""
import os
import queue
import sys
import time

import numpy as np
import pytest

STREAMS = (1, 2, 4, 8, 16)
TOKENS = 32
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "Water boils at", "The three primary colors are", "In 1969, astronauts",
           "My favourite recipe", "The history of Rome"]


def load_model(activations="float"):
    from megafuse.llm import fetch
    from megafuse.llm.model import Model
    path = os.environ.get("MEGAFUSE_BENCH_MODEL") or fetch.default_model_path()
    return Model.from_gguf(path, cache_capacity=2048, activations=activations)


def set_threads():
    import megafuse
    megafuse.set_num_threads(int(os.environ.get("MEGAFUSE_BENCH_THREADS", "2")))


def aggregate_decode(model, streams, tokens=TOKENS):
    """(tokens/s over all streams, seconds): N greedy streams of `tokens` tokens at once."""
    from megafuse.llm import completion as C
    from megafuse.serve.engine import Engine
    engine = Engine(model, parallel=streams, max_queue=0, cache_capacity=256)
    try:
        ban = {t: -100 for t in model.end_of_generation_ids()}
        done = queue.Queue()
        t0 = time.perf_counter()
        for i in range(streams):
            ids = C.prompt_ids(model, PROMPTS[i % len(PROMPTS)], 256)
            s = C.settings(model, max_tokens=tokens, temperature=0, logit_bias=ban)
            engine.submit_generation(ids, s, lambda e: e.kind == "done" and done.put(e))
        for _ in range(streams):
            done.get(timeout=600)
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
    return streams * tokens / seconds, seconds


def conversation(turns=7):
    """A chat of about 1000 tokens: long user turns and short answers."""
    messages = []
    for i in range(turns):
        messages.append({"role": "user", "content": " ".join(
            f"Note {i}.{j}: the value of item {j} in list {i} is {i * j + 7}." for j in range(6))})
        messages.append({"role": "assistant", "content": f"Noted, list {i}."})
    return messages


def prefix_reuse(model):
    """(first-token seconds of the second turn with reuse, without, prompt tokens)."""
    from megafuse.llm import completion as C
    seq = model.new_sequence(2048)
    history = conversation()
    first = history[:-1]
    C.create_chat_completion(seq, first, temperature=0, max_tokens=8)
    second = history + [{"role": "user", "content": "Which list had value 19?"}]
    ids = C.chat_prompt_ids(model, second, 2048)
    t = time.perf_counter()
    seq.prefill(ids)
    reused = time.perf_counter() - t
    fresh = model.new_sequence(2048)
    t = time.perf_counter()
    fresh.prefill(ids)
    cold = time.perf_counter() - t
    return reused, cold, len(ids)


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_with_sequences(model, n=8, capacity=2048):
    before = rss_mib()
    seqs = [model.new_sequence(capacity) for _ in range(n)]
    after = rss_mib()
    return before, after, sum(s.kv_bytes for s in seqs) / 2**20


@pytest.fixture(scope="module")
def model():
    set_threads()
    return load_model()


@pytest.mark.parametrize("streams", STREAMS, ids=[f"streams-{n}" for n in STREAMS])
def test_aggregate_decode(benchmark, model, streams):
    rates = []

    def run():
        rates.append(aggregate_decode(model, streams)[0])
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["tokens_per_s"] = float(np.median(rates))


def test_prefix_reuse(benchmark, model):
    out = []
    benchmark.pedantic(lambda: out.append(prefix_reuse(model)), rounds=3, iterations=1)
    reused, cold, n = (float(np.median([o[i] for o in out])) for i in range(3))
    benchmark.extra_info.update(reused_s=reused, cold_s=cold, prompt_tokens=n,
                                ratio=reused / cold)


def test_rss_with_8_sequences(benchmark, model):
    out = benchmark.pedantic(lambda: rss_with_sequences(model), rounds=1, iterations=1)
    benchmark.extra_info.update(rss_before_mib=out[0], rss_after_mib=out[1],
                                kv_mib=out[2])


def main(argv):
    import argparse
    import megafuse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=TOKENS)
    args = parser.parse_args(argv)
    set_threads()
    t = time.perf_counter()
    m = load_model()
    print(f"model loaded in {time.perf_counter() - t:.1f} s; {megafuse.get_num_threads()} "
          f"threads, SIMD {megafuse.simd_level()}; RSS {rss_mib():.0f} MiB")
    print(f"{'streams':>8} {'tokens/s':>10} {'x one':>7}")
    one = None
    for n in STREAMS:
        rate = max(aggregate_decode(m, n, args.tokens)[0] for _ in range(2))
        one = one or rate
        print(f"{n:>8} {rate:>10.1f} {rate / one:>7.2f}")
    rows = [prefix_reuse(m) for _ in range(3)]
    reused, cold, n = (float(np.median([r[i] for r in rows])) for i in range(3))
    print(f"prefix reuse: second turn of {n:.0f} tokens, first token after {reused * 1e3:.0f} ms "
          f"with reuse, {cold * 1e3:.0f} ms without ({100 * reused / cold:.0f} %)")
    before, after, kv = rss_with_sequences(m)
    print(f"RSS: {before:.0f} MiB with the model, {after:.0f} MiB with 8 sequences of 2048 "
          f"positions ({kv:.0f} MiB of KV caches)")


if __name__ == "__main__":
    main(sys.argv[1:])
