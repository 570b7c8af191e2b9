"""Small synthetic GGUF tokenizers for the tokenizer tests, and a tiny llama model around one
(write_llama_model, for the CLI tests); not a test module.

Each vocabulary is learned here, deterministically, by a plain BPE trainer on CORPUS, then written
with ``gguf.GGUFWriter`` as llama.cpp's converter would write it (``tokenizer.ggml.*`` metadata,
the hyper-parameters transformers needs to read the file, no tensors):

* ``llama``: a SentencePiece BPE vocabulary laid out as Llama 2's: <unk>, <s>, </s>, the byte
  tokens <0x00>..<0xFF>, then the learned pieces (spaces written U+2581) with scores -rank, then
  the single characters; two control tokens and one user-defined token at the end.  Characters
  outside CORPUS (emoji, most CJK, tabs, newlines) fall back to bytes.
* ``gpt2``: a byte-level BPE vocabulary (the 256 characters GPT-2 spells bytes with, then the
  learned merges), pre-tokenized while learning with the regex its ``pre`` names; control tokens
  of that family at the end.

tests/data/make_tokenizer_reference.py writes the same files and records transformers' ids on
them; the tests write them again and compare (the fixture holds each file's sha256, so a change
here that is not re-recorded fails loudly).
"""
from __future__ import annotations

import collections
import re
from typing import Dict, List, Sequence, Tuple

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away into the forest.
Hello world! Hello again, world. It's a test, isn't it? We'll see what they've done, I'm sure.
Le renard brun saute par-dessus le chien paresseux. C'est l'été, et la forêt est très belle.
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße und Übung für alle.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca?
def main(argv):
    for i in range(10):
        print(i, argv[i])
    return 0
int main(int argc, char **argv) { return argc > 1 ? 0 : 1; }
In 2024 there were 1234567 tokens, 3.14159 of them were pi, and 42 was the answer.
The year 1999 and the year 2000 were 365 days long; 12 + 34 = 46.
你好世界。我们今天学习中文。日本語のテキストもあります。
"""

SPACE = "\u2581"

# Token types of tokenizer.ggml.token_type (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The splitting regexes the gpt2-type vocabularies are learned with (llama.cpp's, per pre name).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TRAINING_SPLITS = {"llama-bpe": [_LLAMA3], "qwen2": [_QWEN2], "smollm": [r"\p{N}", _GPT2],
                   "gpt-2": [_GPT2]}

CHAT_TEMPLATES = {
    # Zephyr / TinyLlama style: bos_token, eos_token and raise_exception from the environment
    "llama": (
        "{{ bos_token }}{% for message in messages %}"
        "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + eos_token + '\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # Llama 3 style, with loop controls, trim_blocks / lstrip_blocks and a tojson of the tools
    "llama-bpe": (
        "{{- bos_token }}\n"
        "{%- if tools is defined and tools %}\n"
        "    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}\n"
        "    {{- tools | tojson(indent=2) }}\n"
        "    {{- '<|eot_id|>' }}\n"
        "{%- endif %}\n"
        "{% for message in messages %}\n"
        "    {% if message['role'] == 'skip' %}{% continue %}{% endif %}\n"
        "    {{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
        "+ message['content'] | trim + '<|eot_id|>' }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}\n"
        "    {{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
        "{% endif %}\n"),
    # Qwen2 ChatML with a default system message
    "qwen2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
}


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's spelling of bytes as printable characters (byte -> character)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def learn_merges(words: Dict[Tuple[str, ...], int], n_merges: int) -> List[Tuple[str, str]]:
    """Plain BPE: repeatedly merge the most frequent adjacent pair (ties: the smallest pair)."""
    words = dict(words)
    merges: List[Tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Dict[Tuple[str, str], int] = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        merged: Dict[Tuple[str, ...], int] = collections.Counter()
        for word, count in words.items():
            out: List[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def llama_vocab(n_merges: int = 300):
    """(tokens, scores, token_types) of a SentencePiece BPE vocabulary learned on CORPUS."""
    text = SPACE + CORPUS.replace("\n", " ").replace(" ", SPACE)
    words: Dict[Tuple[str, ...], int] = collections.Counter(
        tuple(w) for w in re.findall(SPACE + "[^" + SPACE + "]*", text))
    merges = learn_merges(words, n_merges)
    chars = collections.Counter(c for w, n in words.items() for c in w for _ in range(n))
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    seen = set(tokens)
    for rank, (a, b) in enumerate(merges):
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
            types.append(NORMAL)
            scores.append(-float(rank))
    for j, (c, _) in enumerate(sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))):
        if c not in seen:
            seen.add(c)
            tokens.append(c)
            types.append(NORMAL)
            scores.append(-float(len(merges) + j))
    specials = (("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<tool_call>", USER_DEFINED))
    for tok, typ in specials:
        tokens.append(tok)
        types.append(typ)
        scores.append(0.0)
    return tokens, scores, types


def _split(text: str, regexes: Sequence[str]) -> List[str]:
    """``text`` cut by each regex in turn, matches and the text between them both kept (as
    llama.cpp's unicode_regex_split and an 'isolated' tokenizers.Split do)."""
    from tokenizers import Regex, pre_tokenizers
    splitter = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    return [piece for piece, _ in splitter.pre_tokenize_str(text)]


GPT2_SPECIALS = {
    "llama-bpe": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}


def gpt2_vocab(pre: str, n_merges: int = 400):
    """(tokens, token_types, merges) of a byte-level BPE vocabulary learned on CORPUS with the
    splitting regexes of ``pre``."""
    spelling = bytes_to_unicode()
    words: Dict[Tuple[str, ...], int] = collections.Counter()
    for piece in _split(CORPUS, TRAINING_SPLITS[pre]):
        words[tuple(spelling[b] for b in piece.encode("utf-8"))] += 1
    merges = learn_merges(words, n_merges)
    tokens = [spelling[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    types = [NORMAL] * len(tokens)
    for tok in GPT2_SPECIALS[pre]:
        tokens.append(tok)
        types.append(CONTROL)
    return tokens, types, [f"{a} {b}" for a, b in merges]


def _hparams(writer, arch: str, vocab_size: int) -> None:
    """The hyper-parameters transformers reads along with the tokenizer (no tensors follow)."""
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab_size)


def write_llama_gguf(path: str) -> str:
    """A llama-architecture file with the SentencePiece vocabulary of llama_vocab()."""
    import gguf
    tokens, scores, types = llama_vocab()
    w = gguf.GGUFWriter(path, "llama")
    _hparams(w, "llama", len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATES["llama"])
    _finish(w)
    return path


def write_gpt2_gguf(path: str, pre: str) -> str:
    """A byte-level BPE file: ``pre`` = 'llama-bpe' (a llama-architecture file with Llama 3's
    tokenizer family) or 'qwen2' (a qwen2-architecture file)."""
    import gguf
    tokens, types, merges = gpt2_vocab(pre)
    arch = "qwen2" if pre == "qwen2" else "llama"
    w = gguf.GGUFWriter(path, arch)
    _hparams(w, arch, len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if pre == "llama-bpe":
        w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
        w.add_eos_token_id(tokens.index("<|eot_id|>"))
        w.add_add_bos_token(True)
    else:
        w.add_bos_token_id(tokens.index("<|endoftext|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_pad_token_id(tokens.index("<|endoftext|>"))
        w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATES[pre])
    _finish(w)
    return path


def write_llama_model(path: str, *, chat_template: bool = False, n_layers: int = 1,
                      seed: int = 0, fields=None) -> str:
    """A tiny whole llama model (embed 128, 2 heads, 1 kv head, head_dim 64, ffn 256; random
    float32 weights, a tied head) with the SentencePiece vocabulary of llama_vocab() -- one
    embedding row a token -- and, only with ``chat_template``, its chat template: a base model
    for the CLI tests.  ``fields``: tokenizer keys written with another value (a float as
    FLOAT32, a str as STRING) in place of the vocabulary's."""
    import gguf
    import numpy as np
    tokens, scores, types = llama_vocab()
    E, H, G, D, I = 128, 2, 1, 64, 256
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(n_layers)
    writer.add_context_length(256)
    writer.add_embedding_length(E)
    writer.add_feed_forward_length(I)
    writer.add_head_count(H)
    writer.add_head_count_kv(G)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    fields = dict(fields or {})
    for key, value in (("tokenizer.ggml.bos_token_id", 1), ("tokenizer.ggml.eos_token_id", 2),
                       ("tokenizer.ggml.unknown_token_id", 0)):
        value = fields.pop(key, value)
        if isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    assert not fields, f"write_llama_model: unknown fields {sorted(fields)}"
    writer.add_add_bos_token(True)
    if chat_template:
        writer.add_chat_template(CHAT_TEMPLATES["llama"])
    writer.add_tensor("token_embd.weight", w(len(tokens), E))
    writer.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for n in range(n_layers):
        for name, shape in (("attn_q", (H * D, E)), ("attn_k", (G * D, E)),
                            ("attn_v", (G * D, E)), ("attn_output", (E, H * D)),
                            ("ffn_gate", (I, E)), ("ffn_up", (I, E)), ("ffn_down", (E, I))):
            writer.add_tensor(f"blk.{n}.{name}.weight", w(*shape))
        writer.add_tensor(f"blk.{n}.attn_norm.weight", np.ones(E, np.float32))
        writer.add_tensor(f"blk.{n}.ffn_norm.weight", np.ones(E, np.float32))
    _finish(writer)
    return path


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


#: name -> (writer, file name)
SYNTHETIC = {
    "llama": (write_llama_gguf, "synthetic-llama-spm.gguf"),
    "llama-bpe": (lambda p: write_gpt2_gguf(p, "llama-bpe"), "synthetic-llama-bpe.gguf"),
    "qwen2": (lambda p: write_gpt2_gguf(p, "qwen2"), "synthetic-qwen2.gguf"),
}
