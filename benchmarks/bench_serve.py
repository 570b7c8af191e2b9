"""Serving: many sequences on one copy of the weights (megafuse.serve.engine.Engine).

    pytest benchmarks/bench_serve.py --benchmark-only      # the rows, in pytest-benchmark
    python benchmarks/bench_serve.py [--tokens 32]          # the same figures as a table

- streams-N: aggregate decode throughput of N concurrent greedy streams (N = 1, 2, 4, 8, 16),
  each a short prompt then --tokens new tokens (end-of-generation banned, so every stream runs
  them all), through Engine.step (the native batched step: one call reads the weights once
  for every stream's token), in float and int8 mode.
- llama-server-N: the same N streams sent at once to llama-cpp-python's OpenAI server
  (``python -m llama_cpp.server``, the same file and threads; it runs one request at a time)
  over HTTP, when $MEGAFUSE_BENCH_LLAMA_PYTHON names an interpreter with llama_cpp and its
  server extras.
- prefix-reuse: the second turn of a ~1000-token conversation, time to its first token with
  prefix reuse (the first turn's whole prefill chunks kept) and without (a fresh sequence);
  issue 37 asks for <= 25 %.
- ``--steps``: the ms of one Engine.step of N sequences' decode tokens (the native batched step
  alone: no sampling, no events), for N = 1 .. 16.
- rss-8: the process's resident memory with the model loaded, then with 8 sequences of 2048
  positions each (one copy of the weights, 8 KV caches).

The model is SmolLM2-135M-Instruct, or $MEGAFUSE_BENCH_MODEL (the Llama-3.2-1B-shaped Q4_K_M
file of benchmarks/README.md); threads: $MEGAFUSE_BENCH_THREADS (2).
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


def model_path():
    from megafuse.llm import fetch
    return os.environ.get("MEGAFUSE_BENCH_MODEL") or fetch.default_model_path()


def load_model(activations="float"):
    from megafuse.llm.model import Model
    return Model.from_gguf(model_path(), cache_capacity=2048, activations=activations)


def threads():
    return int(os.environ.get("MEGAFUSE_BENCH_THREADS", "2"))


def set_threads():
    import megafuse
    megafuse.set_num_threads(threads())


class LlamaServer:
    """llama-cpp-python's OpenAI server on the benchmark's file, in the peer's interpreter
    ($MEGAFUSE_BENCH_LLAMA_PYTHON), for the duration of a `with`."""

    def __init__(self, python, path, n_threads, n_ctx=2048):
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.cmd = [python, "-m", "llama_cpp.server", "--model", path, "--host", "127.0.0.1",
                    "--port", str(self.port), "--n_threads", str(n_threads),
                    "--n_threads_batch", str(n_threads), "--n_ctx", str(n_ctx)]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        import subprocess
        import httpx
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}): "
                                   f"{' '.join(self.cmd)}")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("llama_cpp.server did not start in 300 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def aggregate_decode(self, streams, tokens=TOKENS, eog=()):
        """(decode tokens/s over all streams, end-to-end tokens/s): N greedy streamed
        completions of `tokens` tokens sent at once (end-of-generation banned).  Decode: the
        tokens after each stream's first, over the time in which some stream was past its first
        token (the union of the streams' decode intervals); end to end: every token over the
        whole time, prefills included."""
        import json
        import httpx
        from concurrent.futures import ThreadPoolExecutor

        def one(i):
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 0,
                    "logit_bias": {str(t): -100 for t in eog}, "stream": True}
            times = []
            with httpx.stream("POST", self.url + "/completions", json=body,
                              timeout=3600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if (line.startswith("data: ") and line != "data: [DONE]"
                            and json.loads(line[6:])["choices"][0].get("text")):
                        times.append(time.perf_counter())
            return times
        t0 = time.perf_counter()
        with ThreadPoolExecutor(streams) as pool:
            per_stream = list(pool.map(one, range(streams)))
        return rates(per_stream, t0, time.perf_counter())


def rates(per_stream, t0, t1):
    """(decode tokens/s, end-to-end tokens/s) of streams whose tokens arrived at the given
    times: decode counts the tokens after each stream's first over the union of the intervals
    from a stream's first token to its last."""
    spans = sorted((t[0], t[-1]) for t in per_stream if len(t) > 1)
    busy, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    decoded = sum(len(t) - 1 for t in per_stream)
    return decoded / busy, sum(len(t) for t in per_stream) / (t1 - t0)


def aggregate_decode(model, streams, tokens=TOKENS):
    """(decode tokens/s, end-to-end tokens/s) of N greedy streams of `tokens` tokens at once,
    through the engine, as `rates` counts them."""
    from megafuse.llm import completion as C
    from megafuse.serve.engine import Engine
    engine = Engine(model, parallel=streams, max_queue=0, cache_capacity=256)
    try:
        ban = {t: -100 for t in model.end_of_generation_ids()}
        done = queue.Queue()
        per_stream = [[] for _ in range(streams)]

        def on_event(e, times):
            if e.kind == "delta" and e.delta.token is not None:
                times.append(time.perf_counter())
            elif e.kind == "done":
                done.put(e)
        t0 = time.perf_counter()
        for i in range(streams):
            ids = C.prompt_ids(model, PROMPTS[i % len(PROMPTS)], 256)
            s = C.settings(model, max_tokens=tokens, temperature=0, logit_bias=ban)
            engine.submit_generation(ids, s, lambda e, t=per_stream[i]: on_event(e, t))
        for _ in range(streams):
            done.get(timeout=600)
        t1 = time.perf_counter()
    finally:
        engine.close()
    return rates(per_stream, t0, t1)


def step_ms(model, streams, steps=32, rounds=3):
    """Median ms of one Engine.step of `streams` sequences' decode tokens (after 8 cached
    tokens each): the native batched step alone, no sampling or events."""
    from megafuse.serve.engine import Engine, StepInput
    engine = Engine(model, parallel=streams, max_queue=0, cache_capacity=64)
    try:
        ids = np.random.default_rng(0).integers(0, model.vocab_size, 8 + steps).astype(np.int32)
        out = []
        for _ in range(rounds):
            for q in engine.sequences:
                q.reset()
                q.write(ids[:8])
            t = time.perf_counter()
            for j in range(8, 8 + steps):
                engine.step([StepInput(q, ids[j:j + 1], "logits") for q in engine.sequences])
            out.append((time.perf_counter() - t) / steps * 1e3)
    finally:
        engine.close()
    return float(np.median(out))


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


@pytest.fixture(scope="module", params=["float", "int8"])
def any_model(request):
    set_threads()
    return load_model(request.param)


@pytest.fixture(scope="module")
def model():
    set_threads()
    return load_model()


@pytest.fixture(scope="module")
def llama_server():
    python = os.environ.get("MEGAFUSE_BENCH_LLAMA_PYTHON")
    if not python:
        pytest.skip("set MEGAFUSE_BENCH_LLAMA_PYTHON to an interpreter with llama_cpp[server]")
    with LlamaServer(python, model_path(), threads()) as server:
        yield server


@pytest.mark.parametrize("streams", STREAMS, ids=[f"streams-{n}" for n in STREAMS])
def test_aggregate_decode(benchmark, any_model, streams):
    got = []

    def run():
        got.append(aggregate_decode(any_model, streams))
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["decode_tokens_per_s"] = float(np.median([g[0] for g in got]))
    benchmark.extra_info["end_to_end_tokens_per_s"] = float(np.median([g[1] for g in got]))


@pytest.mark.parametrize("streams", STREAMS, ids=[f"llama-server-{n}" for n in STREAMS])
def test_llama_server_aggregate_decode(benchmark, model, llama_server, streams):
    got = []
    eog = model.end_of_generation_ids()

    def run():
        got.append(llama_server.aggregate_decode(streams, eog=eog))
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["decode_tokens_per_s"] = float(np.median([g[0] for g in got]))
    benchmark.extra_info["end_to_end_tokens_per_s"] = float(np.median([g[1] for g in got]))


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
    parser.add_argument("--activations", default="float", choices=["float", "int8"])
    parser.add_argument("--rounds", type=int, default=3, help="median of this many runs")
    parser.add_argument("--llama-python", default=os.environ.get("MEGAFUSE_BENCH_LLAMA_PYTHON"),
                        help="an interpreter with llama_cpp[server]: its server's figures too")
    parser.add_argument("--streams-only", action="store_true")
    parser.add_argument("--steps", action="store_true",
                        help="only the ms of one Engine.step of N streams' decode tokens")
    args = parser.parse_args(argv)
    set_threads()
    t = time.perf_counter()
    m = load_model(args.activations)
    print(f"{model_path()}: loaded in {time.perf_counter() - t:.1f} s; "
          f"{megafuse.get_num_threads()} threads, SIMD {megafuse.simd_level()}, "
          f"{args.activations} mode; RSS {rss_mib():.0f} MiB")
    if args.steps:
        one = None
        print(f"{'streams':>8} {'ms/step':>8} {'x one (tokens/s)':>17}")
        for n in STREAMS:
            ms = step_ms(m, n, rounds=args.rounds)
            one = one or ms
            print(f"{n:>8} {ms:>8.2f} {n * one / ms:>17.2f}", flush=True)
        return
    def medians(run):
        rows = [run() for _ in range(args.rounds)]
        return tuple(float(np.median([r[i] for r in rows])) for i in range(2))
    ours = {n: medians(lambda n=n: aggregate_decode(m, n, args.tokens)) for n in STREAMS}
    peer = {}
    if args.llama_python:
        with LlamaServer(args.llama_python, model_path(), threads()) as server:
            eog = m.end_of_generation_ids()
            peer = {n: medians(lambda n=n: server.aggregate_decode(n, args.tokens, eog))
                    for n in STREAMS}
    print("decode tokens/s over all streams (end to end, prefills included, in brackets)")
    print(f"{'streams':>8} {'megafuse':>18} {'x one':>6}"
          + (f" {'llama-server':>18} {'x llama':>8}" if peer else ""))
    for n in STREAMS:
        line = (f"{n:>8} {ours[n][0]:>9.1f} ({ours[n][1]:>6.1f}) "
                f"{ours[n][0] / ours[1][0]:>6.2f}")
        if peer:
            line += f" {peer[n][0]:>9.1f} ({peer[n][1]:>6.1f}) {ours[n][0] / peer[n][0]:>8.2f}"
        print(line, flush=True)
    if args.streams_only:
        return
    rows = [prefix_reuse(m) for _ in range(3)]
    reused, cold, n = (float(np.median([r[i] for r in rows])) for i in range(3))
    print(f"prefix reuse: second turn of {n:.0f} tokens, first token after {reused * 1e3:.0f} ms "
          f"with reuse, {cold * 1e3:.0f} ms without ({100 * reused / cold:.0f} %)")
    before, after, kv = rss_with_sequences(m)
    print(f"RSS: {before:.0f} MiB with the model, {after:.0f} MiB with 8 sequences of 2048 "
          f"positions ({kv:.0f} MiB of KV caches)")


if __name__ == "__main__":
    main(sys.argv[1:])
