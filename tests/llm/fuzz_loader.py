"""The loader fuzz (run by tests/llm/test_loader_fuzz.py in a subprocess, so that a crash fails
the test instead of killing pytest):

    python fuzz_loader.py WORK_DIR BASE.gguf [BASE.gguf ...]

derives corrupted and hostile variants of small valid model files, deterministically, and
loads each with ``megafuse.Model.from_gguf``: truncations at many offsets, random bytes written
into the header (the key / values and tensor infos), metadata values of the wrong type or an
absurd size for every hyper-parameter key, tensors dropped / renamed / duplicated / swapped /
misshapen / retyped, the header's counts rewritten, block_count past the tensors.  Each outcome
is one JSON line on stdout, flushed, after a line that names the variant being tried:

    {"try": "base.gguf: metadata/llama.block_count=UINT64:4294967296"}
    {"base": "base.gguf", "kind": "metadata", "label": ..., "outcome": "ValueError",
     "named": true, "message": ..., "finite": null, "spread": null, "seconds": ...}

outcome: "ran" (it loaded and a forward of 3 tokens ran: finite, its logits were all finite;
spread, their max - min, 0 when every logit is the same), ValueError / NotImplementedError (a
subclass under its own name), or the name of any other exception.  named: the message names the
file.  The test decides what passes.  The address space is capped (RLIMIT_AS, 4 GiB): a loader
that tries to allocate what a hostile count asks for fails here with a MemoryError instead of
calling in the machine's OOM killer."""
import json
import math
import os
import sys
import time
import traceback

import numpy as np

from gguf_edit import GGUFDoc, V

SEED = 36
#: The keys of the file every loader reads, beside the architecture's hyper-parameters
#: (megafuse.llm.arch: hparam_keys).
FILE_KEYS = ("general.architecture", "general.alignment", "tokenizer.ggml.tokens")
#: (label, types, value): the wrong type, out of range, beyond float32, an absurd size
HOSTILE_VALUES = (
    ("missing", None, None),
    ("STRING:'64'", [V.STRING], "64"),
    ("FLOAT32:1.5", [V.FLOAT32], 1.5),
    ("BOOL:True", [V.BOOL], True),
    ("UINT32:0", [V.UINT32], 0),
    ("INT32:-1", [V.INT32], -1),
    ("UINT64:2**32", [V.UINT64], 2**32),
    ("UINT64:2**64-1", [V.UINT64], 2**64 - 1),
    ("INT64:-2**63", [V.INT64], -2**63),
    ("FLOAT64:1e300", [V.FLOAT64], 1e300),
    ("FLOAT64:1e-300", [V.FLOAT64], 1e-300),
    ("FLOAT32:nan", [V.FLOAT32], math.nan),
    ("FLOAT64:-inf", [V.FLOAT64], -math.inf),
    ("FLOAT32:3e38", [V.FLOAT32], 3e38),
    ("ARRAY/UINT32[3]", [V.ARRAY, V.UINT32], [16, 16, 16]),
    ("ARRAY/STRING[2]", [V.ARRAY, V.STRING], ["a", "b"]),
    ("ARRAY/UINT32[100000]", [V.ARRAY, V.UINT32], [7] * 100000),
    ("STRING[100000]", [V.STRING], "x" * 100000),
)


def hparam_keys(arch):
    """The full keys of an architecture's hyper-parameters, from megafuse.llm.arch's table."""
    from megafuse.llm import arch as table
    row = table.ARCHITECTURES[arch]
    return [f"{arch}.{key}" for _, key in table.COMMON_HPARAMS + row.hparams]


def swaps(tensors):
    """Pairs of tensors of the same GGML shape and type (the same layer tensor of layers 0 and
    1; two tensors of layer 0): swapping their names gives a valid file of other weights."""
    by_name = {t[0]: t for t in tensors}
    pairs = []
    for name, dims, ggml_type, _ in tensors:
        if name.startswith("blk.0."):
            other = by_name.get("blk.1." + name[len("blk.0."):])
            if other is not None and (other[1], other[2]) == (dims, ggml_type):
                pairs.append((name, other[0]))
                break
    layer0 = [t for t in tensors if t[0].startswith("blk.0.") and len(t[1]) == 2]
    for i, a in enumerate(layer0):
        b = next((b for b in layer0[i + 1:] if (b[1], b[2]) == (a[1], a[2])), None)
        if b is not None:
            pairs.append((a[0], b[0]))
            break
    return pairs


def variants(base):
    """(kind, label, bytes) of every variant, in a fixed order."""
    doc = GGUFDoc(base)
    raw = doc.to_bytes()
    header, _ = doc.header_and_data()
    rng = np.random.default_rng(SEED)
    arch = doc.fields["general.architecture"][1]
    L = doc.fields[f"{arch}.block_count"][1]

    # truncations: dense in the header, sparse in the data (a cut in the last padding reads)
    cuts = sorted(set(rng.integers(0, len(header), 60).tolist()
                      + rng.integers(len(header), len(raw), 40).tolist() + [len(raw) - 1]))
    for n in cuts:
        yield "truncated", f"at {n} of {len(raw)}", raw[:n]

    # random bytes written over 1-4 places of the header (key / values, tensor infos)
    for _ in range(150):
        blob = bytearray(raw)
        places = []
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(0, len(header)))
            width = int(rng.choice([1, 1, 2, 4, 8]))
            blob[at:at + width] = rng.integers(0, 256, width, dtype=np.uint8).tobytes()
            places.append(f"{at}+{width}")
        yield "byte flips", " ".join(places), bytes(blob[:len(raw)])

    # a hostile value for every key
    for key in hparam_keys(arch) + list(FILE_KEYS):
        for label, types, value in HOSTILE_VALUES:
            d = GGUFDoc(base)
            if types is None:
                d.drop(key)
            else:
                d.set(key, value, *types)
            yield "metadata", f"{key}={label}", d.to_bytes()

    # tensors
    names = [t[0] for t in doc.tensors]
    for name in names:
        d = GGUFDoc(base)
        yield "tensor dropped", name, d.drop_tensor(name).to_bytes()
        d = GGUFDoc(base)
        yield "tensor renamed", f"{name} -> x{name}", d.rename_tensor(name, "x" + name).to_bytes()
        if name.startswith("blk."):
            moved = f"blk.{L}." + name.split(".", 2)[2]
            d = GGUFDoc(base)
            yield "tensor renamed", f"{name} -> {moved}", d.rename_tensor(name, moved).to_bytes()
        d = GGUFDoc(base)
        yield "tensor duplicated", name, d.copy_tensor(name, name).to_bytes()
        d = GGUFDoc(base)
        t = d.tensors[d.index(name)]
        if len(t[1]) == 2 and t[1][0] != t[1][1]:
            t[1] = [t[1][1], t[1][0]]                       # rows and columns swapped
            label = "dims swapped"
        elif len(t[1]) == 2:                                # the same bytes, another shape
            t[1] = [t[1][0] * 2, t[1][1] // 2]
            label = "columns doubled, rows halved"
        else:
            t[1] = [t[1][0], 2]                             # a vector made a matrix
            t[3] = t[3] * 2
            label = "a second row"
        yield "tensor misshapen", f"{name}: {label}", d.to_bytes()
        d = GGUFDoc(base)
        t = d.tensors[d.index(name)]
        t[2] = {0: 26, 8: 2}.get(t[2], 0)                   # F32 -> I32, Q8_0 -> Q4_0, ...
        yield "tensor retyped", f"{name}: type {t[2]}", d.to_bytes()
    # two same-shape tensors swapped: a valid file (other weights), which must load and run
    for a, b in swaps(doc.tensors):
        d = GGUFDoc(base).rename_tensor(a, "tmp").rename_tensor(b, a).rename_tensor("tmp", b)
        yield "tensor renamed", f"{a} <-> {b}", d.to_bytes()

    # the header's counts rewritten (the rest of the file as it is)
    n, k = len(doc.tensors), len(doc.fields)
    for count in (0, 1, n - 1, n + 1, 2 * n, 2**32, 2**64 - 1):
        yield "tensor_count", str(count), doc.to_bytes(tensor_count=count)
    for count in (0, k - 1, k + 1, 2**64 - 1):
        yield "kv_count", str(count), doc.to_bytes(kv_count=count)

    # block_count larger than the tensors
    for count in (L + 1, L + 2, 64, 511, 512, 513, 2**31, 2**63):
        d = GGUFDoc(base).set(f"{arch}.block_count", count, V.UINT64)
        yield "block_count", str(count), d.to_bytes()


def load(path):
    """(outcome, named, finite) of Model.from_gguf(path) and a forward of 3 tokens."""
    import megafuse
    try:
        model = megafuse.Model.from_gguf(path)
        ids = [i % model.vocab_size for i in (1, 2, 3)]
        logits = model.forward(ids, logits="all")
        del model
        with np.errstate(all="ignore"):
            return {"outcome": "ran", "finite": bool(np.isfinite(logits).all()),
                    "spread": float(np.ptp(logits))}
    except (ValueError, NotImplementedError) as exc:   # (a subclass keeps its own name)
        return {"outcome": type(exc).__name__, "named": path in str(exc),
                "message": str(exc)[:300]}


def main(work, bases):
    import resource
    import warnings
    warnings.simplefilter("ignore")              # (a cache past the context: not an error)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    i = 0
    for base in bases:
        name = os.path.basename(base)
        for kind, label, blob in variants(base):
            print(json.dumps({"try": f"{name}: {kind}/{label}"[:200]}), flush=True)
            path = os.path.join(work, f"v{i}.gguf")
            i += 1
            with open(path, "wb") as f:
                f.write(blob)
            start = time.perf_counter()
            try:
                result = load(path)
            except Exception as exc:  # noqa: BLE001 -- anything else is reported, the test judges
                result = {"outcome": type(exc).__name__, "named": path in str(exc),
                          "message": traceback.format_exception_only(type(exc), exc)[-1][:300]}
            os.unlink(path)
            row = {"base": name, "kind": kind, "label": label[:200], "named": None,
                   "message": None, "finite": None, "spread": None}
            row.update(result)
            row["seconds"] = round(time.perf_counter() - start, 4)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
