"""llama.cpp (llama-cpp-python) as a peer process for bench_model.py: it loads a GGUF file once,
then answers commands on stdin, one a line, with seconds on stdout:

    pp N      a prefill of N tokens from an empty cache (llm.eval of N ids)
    tg N      N single-token steps from an empty cache
    fill D    an empty cache, then a prefill of D tokens: the untimed setup of `tg N D`
    tg N D    N single-token steps after the first D tokens of the cache (`fill D` put them
              there; steps a former `tg N D` added after them are dropped first, as llama.cpp's
              eval drops every cached position from n_tokens on)
    quit

`--quantize SRC DST FTYPE THREADS` instead writes DST, SRC requantized by llama.cpp (quantize()).

Run by bench_model.py with the interpreter that has llama_cpp ($MEGAFUSE_BENCH_LLAMA_PYTHON,
else the benchmark's own); the token ids come from a seeded generator, as megafuse's do.
Arguments: model path, threads, context size (n_ctx; default 512).
"""
import sys
import time

import numpy as np


def main(path, threads, n_ctx):
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=512, logits_all=False, verbose=False)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, llm.n_vocab(), n_ctx)]
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        n = int(words[1])
        depth = int(words[2]) if len(words) > 2 else 0
        if not (words[0] == "tg" and depth):     # only `tg N D` continues a cache
            llm.reset()
        elif llm.n_tokens > depth:               # keep the first D tokens (the fill)
            llm.n_tokens = depth
        t = time.perf_counter()
        if words[0] in ("pp", "fill"):
            llm.eval(ids[:n])
        else:
            for j in range(depth, depth + n):
                llm.eval(ids[j:j + 1])
        print(f"{time.perf_counter() - t:.9f}", flush=True)


def quantize(src, dst, ftype, threads):
    """dst = src requantized by llama.cpp's own quantizer (llama_model_quantize, as the
    llama-quantize tool runs it with --allow-requantize) to the file type LLAMA_FTYPE_MOSTLY_<ftype>
    ("Q4_K_M", "Q6_K", ...): its per-tensor choices, fallbacks included.  Written to a temporary
    name first, so an interrupted run leaves no partial dst."""
    import ctypes
    import os

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = threads
    part = dst + ".part"
    rc = llama_cpp.llama_model_quantize(src.encode(), part.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src!r} -> {ftype}) returned {rc}")
    os.replace(part, dst)


if __name__ == "__main__":
    if sys.argv[1] == "--quantize":      # --quantize SRC DST FTYPE THREADS
        quantize(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 512)
