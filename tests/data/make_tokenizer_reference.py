"""Record the reference tokenizers on the tokenizer tests' texts: tokenizer_reference.json.

transformers reads a GGUF vocabulary only with torch installed (its GGUF reader imports torch),
which the test environment does not have; so its answers are recorded here once and committed,
and so are llama.cpp's (llama-cpp-python builds llama.cpp from source: not a test dependency
either).  Two passes, each where its reference is installed:

    # 1. transformers (+ torch, gguf, tokenizers): writes the fixture
    python tests/data/make_tokenizer_reference.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
        --keep /tmp/synthetic
    # 2. llama-cpp-python: adds llama.cpp's ids and end-of-generation sets to it
    python tests/data/make_tokenizer_reference.py --llama-cpp \
        --model SmolLM2-135M-Instruct.Q4_1.gguf --keep /tmp/synthetic

(--model defaults to megafuse.llm.fetch.default_model_path(), which fetches it once; Gemma 3
270M comes from megafuse.llm.fetch.model_path("gemma-3-270m") the same way; Phi-3 mini's and
Qwen3's vocabularies are tests/data/vocab/*.gguf.xz, written by make_vocab_files.py.)  Pass 1
writes the synthetic GGUF files of tests/llm/gguf_vocab.py and the decompressed vocabularies
(into --keep, else a temporary folder), and for each file (the real SmolLM2, Gemma 3, Phi-3 and
Qwen3 vocabularies and the synthetic ones) records, per text:
``AutoTokenizer.from_pretrained(dir, gguf_file=name).encode(text)`` (with the special tokens
transformers adds) and the same without them; and per conversation: ``apply_chat_template`` as
text and as ids (or the error it raised; none for a file without a template).  Each written
file's sha256 is recorded too: the tests write the files again and refuse a stale fixture.
Pass 2 reads the same files from --keep and records ``Llama(model_path,
vocab_only=True).tokenize(text, add_bos=False, special=True)`` per text and the ids
``llama_vocab_is_eog`` accepts per file.
Recorded with transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0, llama-cpp-python 0.3.36.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "llm"))  # tests/llm (gguf_vocab)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))    # the source tree (megafuse)

import gguf_vocab  # noqa: E402

OUT = os.path.join(HERE, "tokenizer_reference.json")

TEXTS = [
    "",
    " ",
    "  ",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    # languages
    "Le cœur a ses raisons que la raison ne connaît point. À bientôt, garçon !",
    "Größenwahn und Übermut: Die Straße heißt »Königsallee«, nicht Strasse.",
    "我爱北京天安门，天安门上太阳升。今天天气很好。",
    "日本語のテキスト、ひらがなとカタカナ、そして漢字。東京タワーへ行きましょう！",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "مرحبا بالعالم، كيف حالك اليوم؟ أنا بخير.",
    "नमस्ते दुनिया, आप कैसे हैं? मैं ठीक हूँ।",
    "Ελληνικά: Καλημέρα κόσμε. 한국어: 안녕하세요 세계.",
    # emoji: plain, skin tones, ZWJ sequences, flags, variation selectors
    "I ❤️ emoji 😀🎉👍 and 👍🏽👋🏿 tones.",
    "Family 👨‍👩‍👧‍👦, coder 🧑🏿‍💻, rainbow 🏳️‍🌈, flag 🇫🇷🇯🇵.",
    # digits and numbers
    "1234567890",
    "3.14159265358979323846",
    "Call 555-0199 or +1 (800) 123-4567 before 2024-12-31 at 23:59.",
    "In 1999 we had 1,234,567.89 dollars and 42 cats; 2^64 = 18446744073709551616.",
    " 42",
    "x  1",
    "[1,  2,   3,    4]",
    "0.5e-10 and 6.02214076e23",
    # whitespace
    "a  b   c    d     e",
    "\t\tindented\twith\ttabs",
    "line1\nline2\n\n\nline5\r\nline6",
    "   leading and trailing   ",
    "\n",
    "\t",
    "  \n  \t x \n\n",
    "trailing newline\n",
    # code
    ("def square(x):\n    \"\"\"Return x squared.\"\"\"\n    return x ** 2  # comment\n\n"
     "print([square(i) for i in range(10)])\n"),
    ("#include <stdio.h>\n\nint main(void) {\n\tint a[3] = {1, 2, 3};\n"
     "\tprintf(\"%d\\n\", a[0] + a[2]);\n\treturn 0;\n}\n"),
    "if (x != nullptr && y->z >= 0x1F) { return ~x | (y << 2); }",
    # punctuation, contractions, casing
    "I'm sure you'll see they've done it. Don't you? IT'S FINE, WE'RE OK.",
    "Wait... what?! (yes) [no] {maybe} <html> &amp; @user #tag $5 %20 ^_^ ~~ `code`",
    "https://example.com/path/to?q=1&r=two#frag",
    "café naïve résumé — “quotes” ‘single’ … ™ © ® °C",
    "a ½ cup, 2 ¾ pints, x² + y³ and Ⅻ",
    "e\u0301 vs \u00e9, zero\u200bwidth, nbsp\u00a0here",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababababababab",
    "nul\x00byte and \x7f delete",
    "The quick brown fox jumps over the lazy dog.",
]

# Special tokens in text, per vocabulary
SPECIAL_TEXTS = {
    "gemma3": ["<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
               "<bos>text<eos>", "a<start_of_image>b<end_of_image>", "<mask>[multimodal]<pad>",
               "<table><tr><td>x</td></tr></table>", "<unused0> and <unused6241>",
               "<h1>Title</h1>\n<strong>bold</strong> <s>strike</s>",
               "x  y   z    w" + " " * 40 + "v", "\t\tcode\n\n\n\tmore" + "\t" * 35,
               "\n" * 40 + "end", "<0x41> and <0x0A> as text", "<unk> <start_of_turn>"],
    "phi-3": ["<|user|>\nHi there<|end|>\n<|assistant|>\n", "<|system|>Be terse.<|end|>",
              "a<|endoftext|>b", "</s> and <s>", "<|placeholder1|><|placeholder6|>",
              " <|user|> x", "<unk> [PAD32011]"],
    "qwen3": [("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
               "</think>\n\nOK"), "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
              "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "a<|endoftext|>b",
              "<tool_response>ok</tool_response>", "<|vision_start|><|image_pad|><|vision_end|>",
              "[PAD151700] <think>"],
    "smollm2": ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
                "a<|im_start|>b", "<|endoftext|>", "<|im_start|><|im_end|>",
                "not special: <|im_sta rt|> and <| im_end |>", "code: <filename>x.py<file_sep>"],
    "llama": ["<s>Hello</s>", "a<|im_start|>b", "<|im_start|>user\nHi<|im_end|>",
              "call <tool_call> now", "<unk> unknown"],
    "llama-bpe": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
                  "a<|eot_id|>b", "x <|end_of_text|> y"],
    "qwen2": ["<|im_start|>user\nHi<|im_end|>\n", "a<|endoftext|>b", "<|im_start|><|im_end|>"],
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Ça va ? 😀 Écris 2+2."}],
]
# per-vocabulary extras: (messages, keyword arguments)
CHAT_EXTRAS = {
    "llama": [([{"role": "tool", "content": "x"}], {})],          # raise_exception
    "llama-bpe": [([{"role": "user", "content": "  padded  "}, {"role": "skip", "content": "-"}],
                   {"tools": [{"name": "get_weather", "description": "Météo à Paris"}]})],
}


def save(out):
    """The fixture as JSON with one text or conversation a line (readable diffs)."""
    lines = ["{"]
    for key in ("transformers", "tokenizers", "llama_cpp"):
        if key in out:
            lines.append(f" {json.dumps(key)}: {json.dumps(out[key])},")
    lines.append(' "files": {')
    for n, (name, entry) in enumerate(out["files"].items()):
        lines.append(f"  {json.dumps(name)}: {{")
        scalars = [f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in entry.items()
                   if k not in ("texts", "chats")]
        blocks = [f"   {json.dumps(k)}: [\n" + ",\n".join(
            "    " + json.dumps(item, ensure_ascii=False) for item in entry[k]) + "\n   ]"
            for k in ("texts", "chats")]
        lines.append(",\n".join(scalars + blocks))
        lines.append("  }" + ("," if n + 1 < len(out["files"]) else ""))
    lines.append(" }")
    lines.append("}")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


#: Real vocabularies: key -> how the file is had (megafuse.llm.fetch's model name, or the
#: compressed vocabulary-only file of tests/data/vocab written by make_vocab_files.py)
REAL = {"smollm2": ("model", "smollm2-135m-instruct"), "gemma3": ("model", "gemma-3-270m"),
        "phi-3": ("vocab", "phi-3.gguf.xz"), "qwen3": ("vocab", "qwen3.gguf.xz")}


def real_file(key, folder):
    """The path of the real vocabulary ``key``: a fetched model (cached), or a vocabulary of
    tests/data/vocab decompressed into ``folder``."""
    kind, name = REAL[key]
    if kind == "model":
        from megafuse.llm import fetch as models
        return models.model_path(name)
    import lzma
    path = os.path.join(folder, name[:-len(".xz")])
    with open(os.path.join(HERE, "vocab", name), "rb") as f:
        data = lzma.decompress(f.read())
    with open(path, "wb") as f:
        f.write(data)
    return path


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def transformers_tokenizer(folder, name):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def record(tok, key):
    texts = TEXTS + SPECIAL_TEXTS[key]
    entry = {"texts": [], "chats": []}
    for text in texts:
        item = {"text": text, "ids": tok.encode(text),
                "ids_no_special": tok.encode(text, add_special_tokens=False)}
        if text.startswith(" "):
            # transformers' Metaspace puts no dummy prefix before a leading space; SentencePiece
            # (and megafuse) does, which transformers gives for one more leading space
            item["ids_extra_space"] = tok.encode(" " + text)
        entry["texts"].append(item)
    chats = [(m, {}) for m in CONVERSATIONS] + CHAT_EXTRAS.get(key, [])
    if not getattr(tok, "chat_template", None):
        chats = []          # (a base model's file: no template to compare)
    for messages, kwargs in chats:
        for gen in (True, False):
            item = {"messages": messages, "kwargs": kwargs, "add_generation_prompt": gen}
            try:
                item["text"] = tok.apply_chat_template(messages, add_generation_prompt=gen,
                                                       tokenize=False, **kwargs)
                ids = tok.apply_chat_template(messages, add_generation_prompt=gen,
                                              tokenize=True, **kwargs)
                item["ids"] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            except Exception as exc:  # noqa: BLE001 -- the template's raise_exception, recorded
                item["error"] = f"{type(exc).__name__}: {exc}"
            entry["chats"].append(item)
    return entry


def add_llama_cpp(model, folder):
    """Pass 2: llama.cpp's ids (without BOS) and end-of-generation ids, added to the fixture."""
    import llama_cpp
    with open(OUT, encoding="utf-8") as f:
        out = json.load(f)
    paths = {key: real_file(key, folder) for key in REAL}
    paths["smollm2"] = model
    for key in REAL:
        if "sha256" in out["files"][key] and sha256_of(paths[key]) != out["files"][key]["sha256"]:
            raise SystemExit(f"{paths[key]} is not the file pass 1 recorded")
    for key, (_, name) in gguf_vocab.SYNTHETIC.items():
        paths[key] = os.path.join(folder, name)
        with open(paths[key], "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != out["files"][key]["sha256"]:
                raise SystemExit(f"{paths[key]} is not the file pass 1 recorded")
    for key, path in paths.items():
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        entry = out["files"][key]
        for item in entry["texts"]:
            item["llama_cpp_ids"] = llm.tokenize(item["text"].encode("utf-8"), add_bos=False,
                                                 special=True)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        entry["llama_cpp_eog"] = [i for i in range(llm.n_vocab())
                                  if llama_cpp.llama_vocab_is_eog(vocab, i)]
    out["llama_cpp"] = llama_cpp.__version__
    save(out)
    print(f"added llama.cpp's ids to {OUT}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the SmolLM2 GGUF file (default: fetched and cached)")
    parser.add_argument("--keep", help="folder for the synthetic GGUF files")
    parser.add_argument("--llama-cpp", action="store_true", help="pass 2 (llama-cpp-python)")
    args = parser.parse_args()
    if args.model:
        model = os.path.abspath(args.model)
    else:
        from megafuse.llm import fetch as models
        model = models.default_model_path()
    if args.llama_cpp:
        if not args.keep:
            parser.error("--llama-cpp needs --keep: the folder pass 1 wrote the files to")
        return add_llama_cpp(model, args.keep)
    import tokenizers
    import transformers
    out = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        for key in REAL:
            path = model if key == "smollm2" else real_file(key, folder)
            entry = record(transformers_tokenizer(os.path.dirname(path),
                                                  os.path.basename(path)), key)
            if REAL[key][0] == "vocab":
                entry["sha256"] = sha256_of(path)
            out["files"][key] = entry
        for key, (write, name) in gguf_vocab.SYNTHETIC.items():
            path = write(os.path.join(folder, name))
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            entry = record(transformers_tokenizer(folder, name), key)
            entry["sha256"] = digest
            out["files"][key] = entry
    save(out)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
