"""Loading and running Gemma 3 270M's 262,144-token SentencePiece vocabulary (megafuse.Tokenizer).

    pytest benchmarks/bench_tokenizer.py --benchmark-only

Rows: ``Tokenizer.from_gguf`` on the file (the GGUF metadata read, the vocabulary checked, the
`tokenizers` BPE model built), with the SentencePiece merges already in the cache directory (the
usual case) and with an empty cache (the first load of a vocabulary on a machine: the merges
derived from the vocabulary, then cached); and ``encode`` of a 20 kB English and code text.
Skipped when the model is not cached (``megafuse.models.model_path("gemma-3-270m")`` fetches
it).
"""
import os

import pytest

pytest.importorskip("tokenizers")

from megafuse.llm import fetch  # noqa: E402
from megafuse.llm import tokenizer as mf_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def gemma3_path():
    try:
        return fetch.model_path("gemma-3-270m", fetch=False)
    except fetch.ModelFetchError as exc:
        pytest.skip(str(exc))


def test_load_with_cached_merges(benchmark, gemma3_path):
    mf_tokenizer.Tokenizer.from_gguf(gemma3_path)          # (makes sure the merges are cached)
    tok = benchmark.pedantic(mf_tokenizer.Tokenizer.from_gguf, args=(gemma3_path,), rounds=5,
                             iterations=1, warmup_rounds=1)
    assert tok.vocab_size == 262144


def test_load_first_time(benchmark, gemma3_path, tmp_path, monkeypatch):
    rounds = iter(range(1000))
    folder = str(tmp_path)

    def empty_cache():
        path = os.path.join(folder, str(next(rounds)))        # a new, empty folder each round
        monkeypatch.setattr(mf_tokenizer, "_spm_merges_cache_path",
                            lambda key: os.path.join(path, f"spm-merges-{key}.npy"))
        return (gemma3_path,), {}

    tok = benchmark.pedantic(mf_tokenizer.Tokenizer.from_gguf, setup=empty_cache, rounds=3,
                             iterations=1)
    assert tok.vocab_size == 262144


def test_encode_20kb(benchmark, gemma3_path):
    tok = mf_tokenizer.Tokenizer.from_gguf(gemma3_path)
    text = ("The quick brown fox jumps over the lazy dog. " * 8
            + "def fibonacci(n):\n    if n < 2:\n        return n\n"
            "    return fibonacci(n - 1) + fibonacci(n - 2)\n") * 50
    ids = benchmark(tok.encode, text)
    assert tok.decode(ids[1:]) == text
