"""Llama-3.2-1B-shaped GGUF files for bench_model.py, written once and cached.

The shape of Llama-3.2-1B (16 layers, embed 2048, 32 heads / 8 kv heads of 64, ffn 8192, RoPE
theta 5e5, a tied head) with a 49,152-token vocabulary (SmolLM2's size: a SentencePiece list of
byte tokens and filler pieces, enough for llama.cpp and megafuse to load the file; the benchmarks
feed seeded random ids, never text).  The weights are seeded random, N(0, 0.02^2), written as F16
with ``gguf.GGUFWriter`` tensor by tensor (the whole F16 file, ~2.1 GB, is never in memory), then
quantized to each file type users download most (FTYPES):

- by llama.cpp's own quantizer (``llama_model_quantize``, in the peer's interpreter through
  ``_llama_peer.py --quantize``) when the llama.cpp peer is installed: its per-tensor choices
  (Q4_K_M: Q6_K for the tied embedding, for attn_v and ffn_down in the layers llama.cpp's
  ``use_more_bits`` picks, Q4_K elsewhere; Q4_0: a Q6_K embedding);
- else by megafuse's quantizer (``megafuse.quantize``) following the same per-tensor rules
  (``llama_cpp_type``), so that the file types and the formats each tensor gets are the same.

Files live in ``$MEGAFUSE_BENCH_FILES`` or else ``megafuse.llm.fetch.cache_dir()/bench``:
``llama1b-F16.gguf`` and ``llama1b-<FTYPE>.gguf``; a file is written under a temporary name and
renamed, so an interrupted run leaves nothing half-written behind.
"""
import os
import subprocess
import sys

import numpy as np

SHAPE = dict(n_layers=16, embed=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
             vocab=49152, rope_theta=500000.0, context=4096 + 256, eps=1e-5)
FTYPES = ("Q4_K_M", "Q8_0", "Q4_0")
WEIGHT_STD = 0.02
SEED = 38
PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_llama_peer.py")


def folder():
    explicit = os.environ.get("MEGAFUSE_BENCH_FILES")
    if explicit:
        path = os.path.abspath(os.path.expanduser(explicit))
    else:
        from megafuse.llm.fetch import cache_dir
        path = os.path.join(cache_dir(), "bench")
    os.makedirs(path, exist_ok=True)
    return path


def _vocab(n):
    """A SentencePiece vocabulary of n tokens: <unk>, <s>, </s>, the 256 byte tokens, then
    filler pieces (NORMAL, score -rank)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    filler = n - len(tokens)
    tokens += [f"\u2581t{i}" for i in range(filler)]
    types += [1] * filler
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(filler)]
    return tokens, scores, types


def _tensors():
    """(name, numpy shape [rows, cols] or [n]) of every tensor, in file order."""
    s = SHAPE
    E, H, G, D, F = s["embed"], s["heads"], s["kv_heads"], s["head_dim"], s["ffn"]
    out = [("token_embd.weight", (s["vocab"], E)), ("output_norm.weight", (E,))]
    for n in range(s["n_layers"]):
        out += [(f"blk.{n}.attn_norm.weight", (E,)), (f"blk.{n}.attn_q.weight", (H * D, E)),
                (f"blk.{n}.attn_k.weight", (G * D, E)), (f"blk.{n}.attn_v.weight", (G * D, E)),
                (f"blk.{n}.attn_output.weight", (E, H * D)), (f"blk.{n}.ffn_norm.weight", (E,)),
                (f"blk.{n}.ffn_gate.weight", (F, E)), (f"blk.{n}.ffn_up.weight", (F, E)),
                (f"blk.{n}.ffn_down.weight", (E, F))]
    return out


def _writer(path, file_type):
    import gguf
    s = SHAPE
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("llama-3.2-1b-shaped (random weights, megafuse benchmarks)")
    w.add_block_count(s["n_layers"])
    w.add_context_length(s["context"])
    w.add_embedding_length(s["embed"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(file_type)
    tokens, scores, types = _vocab(s["vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    return w


def _write_streamed(path, file_type, entries):
    """Write a GGUF file from entries (name, shape, dtype, nbytes, raw_dtype, make) -- make()
    returns the tensor's array when its turn comes -- to path, through a temporary name."""
    part = path + ".part"
    w = _writer(part, file_type)
    for name, shape, dtype, nbytes, raw, _ in entries:
        w.add_tensor_info(name, shape, dtype, nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for *_, make in entries:
        w.write_tensor_data(make())
    w.close()
    os.replace(part, path)


def f16_path():
    """The F16 file (written on first use, ~2.1 GB, a minute or two here)."""
    import gguf
    path = os.path.join(folder(), "llama1b-F16.gguf")
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(SEED)
    entries = []
    for name, shape in _tensors():
        if len(shape) == 1:                       # norms: float32 ones, as converters keep them
            entries.append((name, shape, np.dtype(np.float32), 4 * shape[0], None,
                            lambda n=shape[0]: np.ones(n, np.float32)))
            continue

        def make(shape=shape):
            rows = []                             # [rows, cols] float16, 4096 rows at a time
            for r0 in range(0, shape[0], 4096):
                n = min(4096, shape[0] - r0)
                rows.append((rng.standard_normal((n, shape[1]), dtype=np.float32)
                             * np.float32(WEIGHT_STD)).astype(np.float16))
            return np.concatenate(rows)
        entries.append((name, shape, np.dtype(np.float16), 2 * shape[0] * shape[1], None, make))
    _write_streamed(path, gguf.LlamaFileType.MOSTLY_F16, entries)
    return path


def _use_more_bits(i, n):
    """llama.cpp's use_more_bits (src/llama-quant.cpp): the layers Q4_K_M gives more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama_cpp_type(ftype, name):
    """The format llama.cpp's quantizer gives tensor `name` of this model in file type ftype
    (its rules for a llama model with a tied head and rows that are multiples of 256)."""
    n = SHAPE["n_layers"]
    if name.endswith("_norm.weight"):
        return "F32"
    if name == "token_embd.weight":              # the tied head: output's type
        return "Q8_0" if ftype == "Q8_0" else "Q6_K"
    if ftype != "Q4_K_M":
        return ftype
    layer = int(name.split(".")[1])
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and _use_more_bits(layer, n):
        return "Q6_K"
    return "Q4_K"


def _megafuse_quantize(src, dst, ftype):
    """dst = src quantized by megafuse.quantize with llama_cpp_type's choices."""
    import gguf
    import megafuse as mf
    from megafuse.kernels.dtype import CKDataType
    reader = gguf.GGUFReader(src)
    entries = []
    for t in reader.tensors:
        kind = llama_cpp_type(ftype, t.name)
        shape = tuple(int(d) for d in reversed(t.shape))     # numpy order
        if kind == "F32":
            entries.append((t.name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)), None,
                            lambda t=t: np.asarray(t.data, np.float32)))
            continue
        dt = CKDataType[kind]
        row_bytes = mf.ck_dtype_row_bytes(dt, shape[1])
        entries.append((t.name, (shape[0], row_bytes), np.dtype(np.uint8), shape[0] * row_bytes,
                        gguf.GGMLQuantizationType[kind],
                        lambda t=t, dt=dt: mf.quantize(np.asarray(t.data, np.float32), dt)))
    file_type = {"Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[ftype]
    _write_streamed(dst, file_type, entries)


def path(ftype, llama_python=None):
    """The file of type ftype (FTYPES), made once: by llama.cpp's quantizer in the interpreter
    llama_python (one whose llama_cpp imports), else by megafuse's.  Returns (path, by)."""
    if ftype not in FTYPES:
        raise ValueError(f"ftype: expected one of {FTYPES}, got {ftype!r}")
    dst = os.path.join(folder(), f"llama1b-{ftype}.gguf")
    marker = dst + ".by"
    if not os.path.exists(dst):
        src = f16_path()
        if llama_python:
            part = dst + ".part"
            done = subprocess.run([llama_python, PEER_SCRIPT, "--quantize", src, part, ftype,
                                   "2"], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype}: "
                                   f"{done.stderr[-2000:]}")
            os.replace(part, dst)
            by = "llama.cpp"
        else:
            _megafuse_quantize(src, dst, ftype)
            by = "megafuse"
        with open(marker, "w") as f:
            f.write(by + "\n")
    with open(marker) as f:
        return dst, f.read().strip()


if __name__ == "__main__":        # python benchmarks/_llama1b.py [LLAMA_PYTHON]: make every file
    for ft in FTYPES:
        print(ft, *path(ft, sys.argv[1] if len(sys.argv) > 1 else None))
