"""The loader fuzz (issue 36, item 6): hundreds of corrupted or hostile variants of two small valid
model files, each loaded by Model.from_gguf in a subprocess (tests/llm/fuzz_loader.py), so that a
crash or the OOM killer fails this test instead of killing pytest.  Each variant must either
load and run a forward whose logits are finite and not all equal, or raise a ValueError /
NotImplementedError (those classes exactly) whose message names the file: never a KeyError,
TypeError, IndexError, OverflowError, MemoryError, a NumPy error or a crash."""
import collections
import json
import os
import subprocess
import sys

import pytest

gguf = pytest.importorskip("gguf")

import fuzz_loader  # noqa: E402
from gguf_edit import GGUFDoc, V  # noqa: E402
from helpers import DATA_DIR, hang_timeout  # noqa: E402
from test_model import write_model  # noqa: E402

FUZZ = fuzz_loader.__file__
SMALL = (64, 4, 2, 16, 128)           # (E, H, G, D, I)
#: the least variants of each kind a run must have tried (per base file; metadata: every
#: hostile value for every key of the table's row and the file's)
LEAST = {"truncated": 60, "byte flips": 150, "tensor dropped": 17, "tensor renamed": 17,
         "tensor duplicated": 17, "tensor misshapen": 17, "tensor retyped": 17,
         "tensor_count": 7, "kv_count": 4, "block_count": 8}


def bases(tmp_path):
    """A llama file (Q8_0 layers, a tied Q8_0 embedding, a 477-token SentencePiece vocabulary,
    rope.dimension_count as llama.cpp writes it) and a qwen2 file (q/k/v biases, layer
    matrices in F16 / Q8_0 / Q4_0 / Q5_1, its own Q8_0 output head), written here; and three of
    tests/data/arch: qwen2 with YaRN, Phi-3 with LongRoPE factors (fused qkv and gate+up), Gemma
    3 (q/k norms, sandwich norms, sliding windows)."""
    llama = write_model(tmp_path / "llama.gguf", "llama", "Q8_0", shape=SMALL, bias=False,
                        with_vocab=True)
    GGUFDoc(llama).set("llama.rope.dimension_count", SMALL[3], V.UINT32).write(llama)
    formats = {"wq": "F16", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q4_0", "gate": "Q5_1",
               "up": "Q5_1", "w2": "Q8_0"}
    qwen2 = write_model(tmp_path / "qwen2.gguf", "qwen2", formats, shape=SMALL, bias=True,
                        tied=False, head_format="Q8_0", vocab=96)
    arch = [os.path.join(DATA_DIR, "arch", f"{name}.gguf")
            for name in ("qwen2_yarn", "phi3_longrope", "gemma3")]
    return [str(llama), str(qwen2), *arch]


def run_fuzz(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, FUZZ, str(work), *bases(tmp_path)],
                          capture_output=True, text=True,
                          timeout=hang_timeout(600))
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    tried = [line["try"] for line in lines if "try" in line]
    assert proc.returncode == 0, (f"the fuzz died (status {proc.returncode}) at "
                                  f"{tried[-1] if tried else 'its start'}:\n{proc.stderr[-3000:]}")
    return [line for line in lines if "kind" in line]


def acceptable(row):
    if row["outcome"] == "ran":
        return row["finite"] and row["spread"] > 0
    return row["outcome"] in ("ValueError", "NotImplementedError") and row["named"]


def test_every_variant_loads_and_runs_or_is_refused_naming_the_file(tmp_path):
    rows = run_fuzz(tmp_path)
    table = collections.Counter((r["base"], r["kind"], r["outcome"]) for r in rows)
    seconds = collections.Counter()
    for r in rows:
        seconds[r["kind"]] += r["seconds"]
    print(f"\n{len(rows)} variants")
    for key in sorted(table):
        print(f"  {key[0]:12} {key[1]:18} {key[2]:20} {table[key]:4}")
    print("  seconds a kind:", {k: round(v, 2) for k, v in sorted(seconds.items())})
    bad = [r for r in rows if not acceptable(r)]
    assert not bad, "\n".join(f"{r['base']}: {r['kind']}/{r['label']}: {r['outcome']} "
                              f"{r['message'] or ''} (finite {r['finite']}, spread "
                              f"{r['spread']})" for r in bad[:30])
    for base in {r["base"] for r in rows}:
        kinds = collections.Counter(r["kind"] for r in rows if r["base"] == base)
        arch = GGUFDoc(os.path.join(tmp_path if base in ("llama.gguf", "qwen2.gguf") else
                                    os.path.join(DATA_DIR, "arch"), base))
        keys = len(fuzz_loader.hparam_keys(arch.fields["general.architecture"][1]))
        least = dict(LEAST, metadata=(keys + len(fuzz_loader.FILE_KEYS))
                     * len(fuzz_loader.HOSTILE_VALUES))
        for kind, n in least.items():
            assert kinds[kind] >= n, (base, kind, kinds[kind])
        refused = collections.Counter(r["kind"] for r in rows
                                      if r["base"] == base and r["outcome"] != "ran")
        assert set(refused) == set(least), (base, refused)      # every kind refuses some
        # and valid variants still load: the swapped tensors, a cut in the final padding, ...
        assert sum(r["outcome"] == "ran" for r in rows if r["base"] == base) >= 50
        assert any(r["outcome"] == "ran" for r in rows
                   if r["base"] == base and r["kind"] == "tensor renamed")      # a swap
