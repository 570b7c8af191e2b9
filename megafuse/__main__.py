"""The ``megafuse`` command (also ``python -m megafuse``).

    megafuse [bench] [--dtype q8_0] [--tokens 128] [--decode 32] [--repeat 5] [--threads N]
                     [--model file.gguf --layer N] [--json out.json] [--seed 0] [--no-check]
    megafuse info                                  # megafuse.show_config()

``bench`` (the default) builds one decoder layer -- a Qwen2-0.5B-shaped one (embed 896, 14
heads, 2 kv heads, head_dim 64, ffn 4864, seeded random weights in --dtype), or layer N of a
llama / qwen2 GGUF file -- runs a prefill of --tokens tokens (median of --repeat runs), then
--decode single-token steps, checks every output against the float64 NumPy reference
(megafuse.reference, pure float math on the same weights) and prints a table: phase, median ms,
tokens/s, GB/s, GFLOP/s, max relative error.  The error must be at most 1e-4 with float weights
(FP32 / FP16 / BF16) and 2e-2 when activations are quantized (any block-quantized weight); the
exit status is 1 otherwise.
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
KQUANT_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

FORMATS = ["fp32", "fp16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k",
           "q6_k"]


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


def build_parser():
    parser = argparse.ArgumentParser(
        prog="megafuse",
        description="megafuse: fused transformer-layer kernels for the CPU. 'bench' (the "
                    "default) times and checks one decoder layer; 'info' prints the build and "
                    "runtime configuration.")
    parser.add_argument("command", nargs="?", default="bench", choices=["bench", "info"],
                        help="bench (default) or info")
    parser.add_argument("--dtype", default="q8_0", type=str.lower, choices=FORMATS,
                        help="weight format of the random layer (default q8_0); K-quants fall "
                             "back as llama.cpp does for 896-column weights")
    parser.add_argument("--model", help="a llama / qwen2 GGUF file: use its weights")
    parser.add_argument("--layer", type=int, default=0, help="layer of --model (default 0)")
    parser.add_argument("--tokens", type=int, default=128, help="prefill tokens (128)")
    parser.add_argument("--decode", type=int, default=32, help="decode steps (32)")
    parser.add_argument("--repeat", type=int, default=5, help="timed prefill runs (5)")
    parser.add_argument("--threads", type=int, default=0, help="threads (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the comparison with the NumPy reference")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        import megafuse
        megafuse.show_config()
        return 0
    for name in ("tokens", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive value, got {getattr(args, name)}")
    if args.decode < 0:
        parser.error(f"--decode: expected a value >= 0, got {args.decode}")
    if args.threads < 0:
        parser.error(f"--threads: expected a positive value, got {args.threads}")
    try:
        report = run_bench(args)
    except (ImportError, NotImplementedError, ValueError, OSError, KeyError) as exc:
        print(f"megafuse bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0 if report["ok"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
