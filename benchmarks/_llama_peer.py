"""llama.cpp (llama-cpp-python) as a peer process for bench_model.py: it loads a GGUF file once,
then answers commands on stdin, one a line, with seconds on stdout:

    pp N      a prefill of N tokens from an empty cache (llm.eval of N ids)
    tg N      N single-token steps from an empty cache
    quit

Run by bench_model.py with the interpreter that has llama_cpp ($MEGAFUSE_BENCH_LLAMA_PYTHON,
else the benchmark's own); the token ids come from a seeded generator, as megafuse's do.
Arguments: model path, threads.
"""
import sys
import time

import numpy as np


def main(path, threads):
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512,
                n_batch=512, logits_all=False, verbose=False)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, llm.n_vocab(), 512)]
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        n = int(words[1])
        llm.reset()
        t = time.perf_counter()
        if words[0] == "pp":
            llm.eval(ids[:n])
        else:
            for j in range(n):
                llm.eval(ids[j:j + 1])
        print(f"{time.perf_counter() - t:.9f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
