"""The ``megafuse`` command (also ``python -m megafuse``): one small function per subcommand.

    megafuse run [--model FILE.gguf|NAME] -p PROMPT [--chat [--system S]] [-n 128]
                 [--temperature T --top-k K --top-p P --min-p M --repeat-penalty R --seed S]
                 [--activations float|int8] [--threads N] [--ctx N] [--kv-dtype float32|float16]
    megafuse bench [--dtype q8_0] [--tokens 128] [--decode 32] [--repeat 5] [--threads N]
                   [--model FILE.gguf [--layer N] [--pp 128] [--tg 64] [--depth 0]
                                      [--activations int8] [--kv-dtype float32]]
                   [--json out.json] [--seed 0] [--no-check]
    megafuse serve [--model FILE.gguf] [--host 127.0.0.1] [--port 8000] [--parallel 4]
                   [--api-key KEY] [--threads N] [--ctx N] [--max-queue 64]
                   [--graceful-seconds 30]
    megafuse info                                  # megafuse.show_config()

``run`` generates text with a GGUF model (default: SmolLM2-135M-Instruct; ``--model`` takes a path
or the name of a model of megafuse.llm.fetch.MODELS, fetched once into the user cache): the text
streams to stdout, the token counts and rates go to stderr.  Without ``--chat`` the prompt is
continued as it is (BOS first where the file asks for it), which is what a base model such as
Gemma 3 270M wants; ``--chat`` needs the file's ``tokenizer.chat_template``.  Its default is
``--activations float`` (exact float32 activations); ``int8`` is llama.cpp's scheme.

``serve`` runs the OpenAI-compatible HTTP server (megafuse.serve; docs/serving.md) until SIGINT /
SIGTERM: --parallel sequences on one copy of the weights, each of --ctx positions.

``bench`` (the default command) builds one decoder layer -- a Qwen2-0.5B-shaped one (embed 896,
14 heads, 2 kv heads, head_dim 64, ffn 4864, seeded random weights in --dtype), or layer N of a
GGUF file (an architecture of megafuse.llm.arch) -- runs a prefill of --tokens tokens (median of
--repeat runs), then --decode single-token steps, checks every output against the float64 NumPy
reference (megafuse.reference, pure float math on the same weights) and prints a table: phase,
median ms, tokens/s, GB/s, GFLOP/s, max relative error. The error must be at most 1e-4 with
float weights (FP32 / FP16 / BF16) and 2e-2 when activations are quantized (any block-quantized
weight); the exit status is 1 otherwise. With --model it also times the whole model, in the rows
llama-bench prints: ppN (a prefill of N tokens from an empty cache) and tgN (N single-token
steps); with --depth D both start after D tokens already in the cache (their prefill untimed),
the rows ``ppN @ dD`` and ``tgN @ dD`` of llama-bench's -d. ``--kv-dtype float16`` (both
commands) keeps the whole model's KV cache in float16, as llama.cpp's default F16 cache (-ctk /
-ctv f16) does.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

#: The default layer: Qwen2-0.5B (Qwen/Qwen2.5-0.5B config.json).
QWEN2_05B = dict(embed_dim=896, num_heads=14, num_kv_heads=2, head_dim=64,
                 intermediate_dim=4864, eps=1e-6, rope_theta=1e6)

#: Error bounds (max |got - want| / max |want|) against the pure-float reference.
TOLERANCE = {"float": 1e-4, "quantized": 2e-2}

#: llama.cpp's fallback for a K-quant tensor whose rows are not whole blocks of 256
#: (llama_tensor_get_type): Qwen2-0.5B's 896-column weights are stored so in Q4_K_M files.
KQUANT_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
                   "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}

FORMATS = ["fp32", "fp16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k",
           "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"]


class Progress:
    """One status line on stderr, rewritten in place on a terminal (a line per phase
    otherwise)."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last = ""

    def __call__(self, text, final=False):
        if self.tty:
            self.stream.write("\r" + text.ljust(len(self.last)))
            if final:
                self.stream.write("\n")
            self.stream.flush()
        elif text and (final or text.split(" ")[:3] != self.last.split(" ")[:3]):
            self.stream.write(text + "\n")   # not a terminal: one line per phase
            self.stream.flush()
        self.last = text

    def done(self):
        if self.tty and self.last:
            self.stream.write("\r" + " " * len(self.last) + "\r")
            self.stream.flush()


def random_layer(dtype, cache_capacity, seed=0, shape=None):
    """A DecoderLayer of the given shape (default Qwen2-0.5B) with seeded random weights
    (N(0, 1/fan_in); gammas 1 + N(0, 0.01); q/k/v biases as Qwen2 has them) in format dtype;
    K-quant weights whose rows are not whole blocks of 256 fall back as llama.cpp does."""
    from megafuse import CKDataType, DecoderLayer

    hp = dict(QWEN2_05B, **(shape or {}))
    E, H, G, D, I = (hp["embed_dim"], hp["num_heads"], hp["num_kv_heads"], hp["head_dim"],
                     hp["intermediate_dim"])
    rng = np.random.default_rng(seed)

    def w(rows, cols):
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(cols ** -0.5)

    weights = {"wq": w(H * D, E), "wk": w(G * D, E), "wv": w(G * D, E), "wo": w(E, H * D),
               "w1": w(2 * I, E), "w2": w(E, I)}
    fmt = CKDataType[dtype.upper()]
    dtypes = {}
    for name, arr in weights.items():
        chosen = fmt
        if fmt.name in KQUANT_FALLBACK and arr.shape[1] % 256:
            chosen = CKDataType[KQUANT_FALLBACK[fmt.name]]
        dtypes[name] = chosen
    vec = lambda n, s: (rng.standard_normal(n, dtype=np.float32) * np.float32(s))  # noqa: E731
    return DecoderLayer.from_arrays(
        ln1_gamma=1 + vec(E, 0.1), ln2_gamma=1 + vec(E, 0.1),
        bq=vec(H * D, 0.1), bk=vec(G * D, 0.1), bv=vec(G * D, 0.1),
        dtypes=dtypes, cache_capacity=cache_capacity, **hp, **weights)


def run_bench(args, out=None):
    """Build the layer, time prefill and decode, check against the reference; returns the
    report (a dict, also what --json writes)."""
    import megafuse

    out = out if out is not None else sys.stdout
    progress = Progress()
    if args.threads:
        megafuse.set_num_threads(args.threads)
    T, K = args.tokens, args.decode
    capacity = T + K
    t0 = time.perf_counter()
    if args.model:
        progress(f"megafuse bench: loading layer {args.layer} of {args.model}")
        layer = megafuse.DecoderLayer.from_gguf(args.model, args.layer, cache_capacity=capacity,
                                                max_tokens=T)
        source = f"layer {args.layer} of {args.model}"
    else:
        progress(f"megafuse bench: building a Qwen2-0.5B-shaped layer in {args.dtype}")
        layer = random_layer(args.dtype, capacity, seed=args.seed)
        source = f"Qwen2-0.5B-shaped layer, seeded random weights (seed {args.seed})"
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed + 1)
    x = rng.standard_normal((T + K, layer.embed_dim), dtype=np.float32)

    # prefill: one warm-up, then the timed runs, each on an empty cache
    times = []
    for i in range(args.repeat + 1):
        progress(f"megafuse bench: prefill {i}/{args.repeat} ({T} tokens)")
        layer.reset()
        t = time.perf_counter()
        prefill_out = layer.prefill(x[:T])
        if i:
            times.append(time.perf_counter() - t)
    prefill_s = statistics.median(times)

    # decode: K steps after the prompt, each timed
    decode_times, decode_out = [], []
    for j in range(K):
        progress(f"megafuse bench: decode {j + 1}/{K} (position {T + j})")
        t = time.perf_counter()
        decode_out.append(layer.decode(x[T + j]))
        decode_times.append(time.perf_counter() - t)
    decode_s = statistics.median(decode_times) if K else float("nan")

    float_only = not layer.int8_path
    tol = TOLERANCE["float"] if float_only else TOLERANCE["quantized"]
    err_prefill = err_decode = None
    if args.check:
        progress("megafuse bench: checking against megafuse.reference (float64)")
        time.sleep(0.1)                   # (OpenBLAS threads spin briefly after numpy calls)
        from megafuse.reference import rel_err
        want = layer.reference(x[:T + K], quantize_activations=False)   # pure float math
        err_prefill = rel_err(prefill_out, want[:T])
        err_decode = rel_err(np.stack(decode_out), want[T:]) if K else None
    progress.done()

    def row(phase, tokens, seconds, nbytes, flops, err):
        return {"phase": phase, "tokens": tokens, "median_ms": seconds * 1e3,
                "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
                "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else float("nan"),
                "gflop_per_s": flops / seconds / 1e9 if seconds > 0 else float("nan"),
                "max_rel_error": err}

    rows = [row("prefill", T, prefill_s, layer.bytes_moved(T, 0), layer.flops(T, 0),
                err_prefill)]
    if K:
        mid = T + K // 2        # the bytes and flops of a typical step
        rows.append(row("decode", 1, decode_s, layer.bytes_moved(1, mid), layer.flops(1, mid),
                        err_decode))
    errors = [r["max_rel_error"] for r in rows if r["max_rel_error"] is not None]
    ok = all(e <= tol for e in errors)
    report = {
        "megafuse": megafuse.__version__,
        "source": source,
        "shape": {k: getattr(layer, k) for k in ("embed_dim", "num_heads", "num_kv_heads",
                                                 "head_dim", "intermediate_dim")},
        "formats": {k: v.name for k, v in layer.dtypes.items()},
        "int8_path": layer.int8_path,
        "threads": megafuse.get_num_threads(),
        "simd_level": megafuse.simd_level(),
        "prefill_tokens": T,
        "decode_steps": K,
        "prefill_repeats": args.repeat,
        "build_seconds": build_s,
        "tolerance": tol if args.check else None,
        "results": rows,
        "ok": ok if args.check else None,
    }
    print_report(report, out)
    return report


def print_report(report, out):
    shape = report["shape"]
    formats = report["formats"]
    same = len(set(formats.values())) == 1
    fmt_text = (next(iter(formats.values())) if same
                else " ".join(f"{k}={v}" for k, v in formats.items()))
    print(f"megafuse {report['megafuse']} bench: {report['source']}", file=out)
    print(f"  embed {shape['embed_dim']}, {shape['num_heads']} heads, {shape['num_kv_heads']} "
          f"kv heads, head_dim {shape['head_dim']}, ffn {shape['intermediate_dim']}; weights "
          f"{fmt_text}{' (int8 activations)' if report['int8_path'] else ''}; "
          f"{report['threads']} threads, SIMD {report['simd_level']}", file=out)
    print(f"  prefill of {report['prefill_tokens']} tokens (median of "
          f"{report['prefill_repeats']}), then {report['decode_steps']} decode steps (median)",
          file=out)
    head = (f"  {'phase':<8} {'tokens':>6} {'median ms':>10} {'tokens/s':>10} {'GB/s':>7} "
            f"{'GFLOP/s':>8} {'max rel err':>12}")
    print(head, file=out)
    for r in report["results"]:
        err = "-" if r["max_rel_error"] is None else f"{r['max_rel_error']:.2e}"
        print(f"  {r['phase']:<8} {r['tokens']:>6} {r['median_ms']:>10.3f} "
              f"{r['tokens_per_s']:>10.1f} {r['gb_per_s']:>7.2f} {r['gflop_per_s']:>8.2f} "
              f"{err:>12}", file=out)
    print("  GB/s: every parameter + the K/V cache rows read + input/output rows, once per "
          "call; GFLOP/s: 2 per multiply-add of the six projections and of attention", file=out)
    if report["ok"] is None:
        print("  (not checked against the reference: --no-check)", file=out)
    else:
        kind = ("float weights" if not report["int8_path"]
                else "quantized activations vs the pure-float reference")
        worst = max(r["max_rel_error"] for r in report["results"])
        verdict = "OK" if report["ok"] else "MISMATCH"
        print(f"  {verdict}: max relative error {worst:.2e} "
              f"{'<=' if report['ok'] else '>'} {report['tolerance']:.0e} ({kind})", file=out)


def add_bench_arguments(parser):
    parser.add_argument("--dtype", default="q8_0", type=str.lower, choices=FORMATS,
                        help="weight format of the random layer (default q8_0); K-quants fall "
                             "back as llama.cpp does for 896-column weights")
    parser.add_argument("--model", help="a GGUF file (llama, qwen2, qwen3, phi3, gemma2, "
                                        "gemma3): use its weights, and time the whole model "
                                        "too (ppN, tgN)")
    parser.add_argument("--layer", type=int, default=0, help="layer of --model (default 0)")
    parser.add_argument("--tokens", type=int, default=128, help="prefill tokens (128)")
    parser.add_argument("--decode", type=int, default=32, help="decode steps (32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (5)")
    parser.add_argument("--pp", type=int, default=128,
                        help="whole model: tokens of the prefill row ppN (128; 0: none)")
    parser.add_argument("--tg", type=int, default=64,
                        help="whole model: single-token steps of the row tgN (64; 0: none)")
    parser.add_argument("--depth", type=int, default=0,
                        help="whole model: tokens already in the cache when each row starts "
                             "(their prefill untimed), as llama-bench's -d (0)")
    parser.add_argument("--activations", default="int8", choices=["int8", "float"],
                        help="whole model: activation mode (int8, llama.cpp's scheme)")
    parser.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"],
                        help="whole model: what the KV cache holds (float32; float16 as "
                             "llama.cpp's default)")
    parser.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the comparison with the NumPy reference")


def add_run_arguments(parser):
    parser.add_argument("--model", help="a GGUF file, or a model megafuse fetches once by name: "
                                        "smollm2-135m-instruct (the default), gemma-3-270m")
    parser.add_argument("-p", "--prompt", required=True, help="the prompt: a text the model "
                        "continues (or the user's message with --chat)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the model's chat template (a user message); "
                             "without it the prompt is continued as it is (base models)")
    parser.add_argument("--system", help="with --chat: a system message")
    parser.add_argument("-n", "--max-tokens", type=int, default=128,
                        help="new tokens at most (128)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 (default): greedy; else sampling at this temperature")
    parser.add_argument("--top-k", type=int, default=0, help="top-k sampling (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="top-p sampling (1.0: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="min-p sampling (0.0: off)")
    parser.add_argument("--repeat-penalty", type=float, default=1.0,
                        help="llama.cpp's repetition penalty (1.0: off)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--activations", default="float", choices=["float", "int8"],
                        help="float (default: float32 activations, exact) or int8 "
                             "(llama.cpp's quantized activations)")
    parser.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    parser.add_argument("--ctx", type=int, default=None,
                        help="KV-cache positions (default: the model's context, at most 4096)")
    parser.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"],
                        help="what the KV cache holds: float32 (default) or float16 (half the "
                             "memory, faster decode late in a long context)")


def add_serve_arguments(parser):
    parser.add_argument("--model", help="a GGUF file (llama, qwen2, qwen3, phi3, gemma2, "
                                        "gemma3; default: "
                                        "SmolLM2-135M-Instruct, fetched once)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000)")
    parser.add_argument("--parallel", type=int, default=4,
                        help="sequences run at once, each with its own KV cache (4)")
    parser.add_argument("--max-queue", type=int, default=64,
                        help="requests that may wait for a sequence; more get 429 (64)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' (default: the "
                             "MEGAFUSE_API_KEY environment variable, else no key)")
    parser.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    parser.add_argument("--ctx", type=int, default=0,
                        help="KV-cache positions of each sequence (default: min(the model's "
                             "context, 2048))")
    parser.add_argument("--activations", default="int8", choices=["int8", "float"],
                        help="int8 (default: llama.cpp's quantized activations; a step's "
                             "streams share each weight read) or float (exact float32 "
                             "activations; each block decoded once for two streams)")
    parser.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"],
                        help="what the KV caches hold (float32)")
    parser.add_argument("--model-name", default=None,
                        help="the model id clients use (default: the file's name)")
    parser.add_argument("--graceful-seconds", type=float, default=30.0,
                        help="on SIGTERM / SIGINT, how long the requests in flight may take to "
                             "finish before they are cancelled (30)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="megafuse",
        description="megafuse: fused transformer kernels for the CPU. 'run' generates text with "
                    "a GGUF model; 'bench' (the default) times and checks a decoder layer and, "
                    "with --model, the whole model; 'info' prints the build and runtime "
                    "configuration.")
    sub = parser.add_subparsers(dest="command", metavar="{run,bench,serve,info}")
    add_run_arguments(sub.add_parser("run", help="generate text with a GGUF model"))
    add_bench_arguments(sub.add_parser("bench", help="time and check a layer (and a model)"))
    add_serve_arguments(sub.add_parser("serve", help="an OpenAI-compatible HTTP server"))
    sub.add_parser("info", help="print the build and runtime configuration")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "bench")                  # bench is the default command
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        import megafuse
        megafuse.show_config()
        return 0
    if args.threads < 0:
        parser.error(f"--threads: expected a positive value, got {args.threads}")
    cpus = available_cpus()
    if args.threads > cpus:
        print(f"megafuse: warning: --threads {args.threads} is more than the {cpus} CPUs "
              f"this process may run on: the threads will wait for each other (much slower "
              f"than --threads {cpus})", file=sys.stderr)
    if args.command == "run":
        return cmd_run(args, parser)
    if args.command == "serve":
        return cmd_serve(args, parser)
    return cmd_bench(args, parser)


def available_cpus():
    """The CPUs this process may run on."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                     # (not on Linux)
        return os.cpu_count() or 1


def context_capped(path, ctx, what, err):
    """ctx (None: the model's default, megafuse.llm.model.default_cache_capacity), capped at
    the model's context length (with a note on err); also the opened file."""
    from megafuse.llm import gguf as _gguf
    from megafuse.llm.model import default_cache_capacity
    reader = _gguf.open_reader(path)
    limit = _gguf.hparams(reader)["context_length"]
    if ctx is None:
        return reader, default_cache_capacity(limit)
    if limit and ctx > limit:
        print(f"megafuse {what}: --ctx {ctx} is more than the model's context length "
              f"{limit}: using {limit}", file=err)
        ctx = limit
    return reader, ctx


def cmd_serve(args, parser):
    """Run the OpenAI-compatible server until SIGINT / SIGTERM."""
    import os
    for name in ("parallel", "port"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive value, got {getattr(args, name)}")
    if args.max_queue < 0:
        parser.error(f"--max-queue: expected a value >= 0, got {args.max_queue}")
    if args.ctx < 0:
        parser.error(f"--ctx: expected a positive value, got {args.ctx}")
    if not args.graceful_seconds >= 0:
        parser.error(f"--graceful-seconds: expected a value >= 0, got {args.graceful_seconds}")
    try:
        from megafuse.llm import fetch as models
        from megafuse.llm.model import Model
        from megafuse.serve.app import create_app, run
        path = args.model or models.default_model_path(file=sys.stderr)
        reader, ctx = context_capped(path, args.ctx or 2048, "serve", sys.stderr)
        if not args.ctx:
            ctx = min(ctx, 2048)
        model = Model.from_gguf(reader, cache_capacity=ctx, activations=args.activations,
                                kv_dtype=args.kv_dtype)
        key = args.api_key if args.api_key is not None else os.environ.get("MEGAFUSE_API_KEY")
        from megafuse.serve.app import _file_id
        app = create_app(model, parallel=args.parallel, max_queue=args.max_queue, ctx=ctx,
                         api_key=key or None, threads=args.threads or None,
                         model_name=args.model_name or _file_id(path))
    except (models.ModelFetchError, ImportError, NotImplementedError, ValueError,
            OSError) as exc:
        print(f"megafuse serve: {exc}", file=sys.stderr)
        return 2
    print(f"megafuse serve: {model.config.name or path} on http://{args.host}:{args.port}/v1 "
          f"({args.parallel} sequences of {ctx} positions, {model.activations} activations)",
          file=sys.stderr, flush=True)
    run(app, host=args.host, port=args.port, graceful_seconds=args.graceful_seconds)
    return 0


def cmd_bench(args, parser):
    for name in ("tokens", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive value, got {getattr(args, name)}")
    for name in ("decode", "pp", "tg", "depth"):
        if getattr(args, name) < 0:
            parser.error(f"--{name}: expected a value >= 0, got {getattr(args, name)}")
    try:
        report = run_bench(args)
        if args.model and (args.pp or args.tg):
            report["model"] = run_model_bench(args)
    except (ImportError, NotImplementedError, ValueError, OSError, KeyError) as exc:
        print(f"megafuse bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0 if report["ok"] in (True, None) else 1


def run_model_bench(args, out=None):
    """The whole model of --model, timed as llama-bench does: ppN = a prefill of N tokens,
    tgN = N single-token steps, each from an empty cache or, with --depth D, after a prefill of
    D tokens that is not timed (llama-bench's ``ppN @ dD``, ``tgN @ dD``).  Each row: median of
    --repeat runs after a warm-up, tokens/s and its standard deviation."""
    import megafuse
    from megafuse.llm.model import Model

    from megafuse.llm import gguf as _gguf

    out = out if out is not None else sys.stdout
    reader = _gguf.open_reader(args.model)
    if "token_embd.weight" not in {t.name for t in reader.tensors}:
        print("  (no whole-model rows: the file has no token_embd.weight)", file=out)
        return None
    progress = Progress()
    progress(f"megafuse bench: loading the model {args.model}")
    depth, longest = args.depth, max(args.pp, args.tg, 1)
    model = Model.from_gguf(reader, cache_capacity=depth + longest,
                            activations=args.activations, kv_dtype=args.kv_dtype)
    rng = np.random.default_rng(args.seed + 2)
    ids = rng.integers(0, model.vocab_size, depth + longest)          # [depth + longest]
    rows = []
    for name, n in (("pp", args.pp), ("tg", args.tg)):
        if n == 0:
            continue
        test = f"{name}{n}" + (f" @ d{depth}" if depth else "")
        rates = []
        for i in range(args.repeat + 1):
            progress(f"megafuse bench: {test} {i}/{args.repeat}")
            model.reset()
            if depth:
                model.forward(ids[:depth])
            t = time.perf_counter()
            if name == "pp":
                model.forward(ids[depth:depth + n])
            else:
                for j in range(depth, depth + n):
                    model.forward(ids[j:j + 1])
            if i:                              # (the first run warms up)
                rates.append(n / (time.perf_counter() - t))
        rows.append({"test": test, "tokens": n, "depth": depth,
                     "tokens_per_s": statistics.median(rates),
                     "stddev": statistics.stdev(rates) if len(rates) > 1 else 0.0})
    progress.done()
    c = model.config
    report = {"model": args.model, "name": c.name, "layers": c.n_layers,
              "formats": model.formats, "weight_bytes": model.weight_bytes,
              "activations": model.activations, "kv_dtype": model.kv_dtype,
              "threads": megafuse.get_num_threads(),
              "repeats": args.repeat, "depth": depth, "results": rows}
    print(f"  whole model: {c.name or c.architecture}, {c.n_layers} layers, "
          f"{model.weight_bytes / 1e6:.1f} MB of weights ({', '.join(model.formats)}), "
          f"{model.activations} activations, {model.kv_dtype} KV cache, "
          f"{report['threads']} threads", file=out)
    width = max([8] + [len(r["test"]) for r in rows])
    print(f"  {'test':<{width}} {'t/s':>10} {'+/-':>8}", file=out)
    for r in rows:
        print(f"  {r['test']:<{width}} {r['tokens_per_s']:>10.2f} {r['stddev']:>8.2f}", file=out)
    return report


def cmd_run(args, parser):
    """Generate: the text to stdout as it comes, the figures to stderr."""
    import megafuse
    from megafuse.llm import fetch as models
    from megafuse.llm import gguf as _gguf
    from megafuse.llm.model import Model

    if args.max_tokens < 0:
        parser.error(f"--max-tokens: expected a value >= 0, got {args.max_tokens}")
    if args.ctx is not None and args.ctx < 1:
        parser.error(f"--ctx: expected a positive value, got {args.ctx}")
    if args.system is not None and not args.chat:
        parser.error("--system: a system message needs --chat")
    if args.threads:
        megafuse.set_num_threads(args.threads)
    err = sys.stderr
    try:
        path = models.resolve(args.model, file=err)
        t0 = time.perf_counter()
        reader, ctx = context_capped(path, args.ctx, "run", err)
        if args.chat and _gguf._field(reader, "tokenizer.chat_template") is None:
            # (checked before the weights are loaded)
            raise ValueError(f"--chat: {path} has no chat template (no tokenizer.chat_template "
                             f"in its metadata: a base model?); run it without --chat to have "
                             f"the prompt continued as plain text")
        model = Model.from_gguf(reader, cache_capacity=ctx, activations=args.activations,
                                kv_dtype=args.kv_dtype)
        tok = model.tokenizer
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": args.prompt})
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        else:
            ids = tok.encode(args.prompt)
        load_s = time.perf_counter() - t0
        if len(ids) >= ctx:
            raise ValueError(f"the prompt is {len(ids)} tokens, which leaves no room in "
                             f"--ctx {ctx}: raise --ctx (up to the model's context, "
                             f"{model.config.context_length or 'unknown'})")
        print(f"megafuse run: {model.config.name or path} ({model.activations} activations, "
              f"{megafuse.get_num_threads()} threads, SIMD {megafuse.simd_level()}), loaded in "
              f"{load_s:.2f} s; prompt: {len(ids)} tokens", file=err, flush=True)
        stream = tok.stream_decoder(skip_special=True, at_start=False)
        gen = model.generate(ids, args.max_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             repeat_penalty=args.repeat_penalty, seed=args.seed)
        t_start = time.perf_counter()
        t_first = None
        count = 0
        for token in gen:
            if t_first is None:
                t_first = time.perf_counter()
            count += 1
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
        t_end = time.perf_counter()
        sys.stdout.write(stream.flush() + "\n")
        sys.stdout.flush()
    except (models.ModelFetchError, ImportError, NotImplementedError, ValueError,
            OSError) as exc:
        print(f"megafuse run: {exc}", file=err)
        return 2
    decode_s = t_end - t_first if t_first is not None else 0.0
    decode_n = max(count - 1, 0)
    rate = f"{decode_n / decode_s:.1f} tokens/s" if decode_n and decode_s > 0 else "-"
    if t_first is None:                    # no token came: the prefill's time is not known
        prefill = "prefill -" if args.max_tokens else "no prefill (-n 0)"
    else:
        prefill = f"prefill {len(ids) / (t_first - t_start):.1f} tokens/s"
    print(f"megafuse run: prompt {len(ids)} tokens, {prefill}; {count} tokens generated, "
          f"decode {rate}; stopped: {model.stop_reason}", file=err)
    return 0

