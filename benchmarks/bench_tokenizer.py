"""Loading and running Gemma 3 270M's 262,144-token SentencePiece vocabulary (megafuse.Tokenizer).

    pytest benchmarks/bench_tokenizer.py --benchmark-only

Rows: ``Tokenizer.from_gguf`` on the file (the GGUF metadata read, the vocabulary checked, the
special tokens' matcher built), and ``encode`` of a 20 kB English and code text (SentencePiece
in Python: llama.cpp's algorithm).
Skipped when the model is not cached (``megafuse.models.model_path("gemma-3-270m")`` fetches
it).
"""
import pytest

pytest.importorskip("tokenizers")

from megafuse.llm import fetch
from megafuse.llm import tokenizer as mf_tokenizer


@pytest.fixture(scope="module")
def gemma3_path():
    try:
        return fetch.model_path("gemma-3-270m", fetch=False)
    except fetch.ModelFetchError as exc:
        pytest.skip(str(exc))


def test_load(benchmark, gemma3_path):
    tok = benchmark.pedantic(mf_tokenizer.Tokenizer.from_gguf, args=(gemma3_path,), rounds=5,
                             iterations=1, warmup_rounds=1)
    assert tok.vocab_size == 262144


def test_encode_20kb(benchmark, gemma3_path):
    tok = mf_tokenizer.Tokenizer.from_gguf(gemma3_path)
    text = ("The quick brown fox jumps over the lazy dog. " * 8
            + "def fibonacci(n):\n    if n < 2:\n        return n\n"
            "    return fibonacci(n - 1) + fibonacci(n - 2)\n") * 50
    ids = benchmark(tok.encode, text)
    assert tok.decode(ids[1:]) == text
