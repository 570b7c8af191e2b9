"""Write the real Phi-3 and Qwen3 vocabularies the tokenizer tests read: tests/data/vocab/*.gguf.xz.

No Phi-3 or Qwen3 model file is reachable here (PyPI only), but llama.cpp's own tokenizer tests
are: the llama-cpp-python source package ships ``vendor/llama.cpp/models/ggml-vocab-*.gguf``,
vocabulary-only GGUF files that llama.cpp's ``convert_hf_to_gguf.py`` wrote from the models'
Hugging Face tokenizers.  From the 0.3.36 sdist::

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d DIR
    tar xzf DIR/llama_cpp_python-0.3.36.tar.gz
    python tests/data/make_vocab_files.py llama_cpp_python-0.3.36/vendor/llama.cpp/models

* ``phi-3.gguf.xz``: ``ggml-vocab-phi-3.gguf`` as it is (microsoft/Phi-3-mini-4k-instruct:
  Llama 2's 32,000-token SentencePiece vocabulary, Phi-3's added tokens <|endoftext|>,
  <|assistant|>, <|system|>, <|end|>, <|user|>, ..., padded to 32,064 with [PADn] tokens; its
  chat template), xz-compressed.
* ``qwen3.gguf.xz``: Qwen3's vocabulary, written with gguf.GGUFWriter as convert_hf_to_gguf.py
  writes a Qwen3 file: the byte-level BPE tokens (151,643) and merges of ``ggml-vocab-qwen2.gguf``
  (Qwen1.5's, which Qwen2, Qwen2.5 and Qwen3 share), then Qwen3's 26 added tokens (ids
  151643-151668; CONTROL if special or "<|...|>", else USER_DEFINED, as convert_hf_to_gguf.py
  types them), then [PADn] (UNUSED) up to Qwen3's 151,936 embedding rows; ``pre`` qwen2; BOS /
  padding <|endoftext|>, EOS <|im_end|>, no BOS added; Qwen3-0.6B's hyper-parameters (which
  transformers reads with the tokenizer); no chat template (Qwen3's is not in any file here).

Each output is checked against the sha256 recorded in tests/data/tokenizer_reference.json by
the tests (a changed file must be recorded again with make_tokenizer_reference.py).
"""
import argparse
import lzma
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "vocab")

# Qwen3's added tokens (tokenizer_config.json's added_tokens_decoder): (text, special)
QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
QWEN3_BASE = 151643          # the BPE tokens before the added ones
QWEN3_ROWS = 151936          # Qwen3's vocab_size (embedding rows)


def compress(data, name):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {path} ({len(data)} bytes, {os.path.getsize(path)} compressed)")


def write_qwen3(qwen2_path, path):
    import gguf
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from megafuse.llm.gguf import GGUFFile
    src = GGUFFile(qwen2_path)
    tokens = src.get("tokenizer.ggml.tokens")[:QWEN3_BASE]
    types = src.get("tokenizer.ggml.token_type")[:QWEN3_BASE]
    merges = src.get("tokenizer.ggml.merges")
    assert set(types) == {gguf.TokenType.NORMAL} and tokens[-1] == "â½Ĺ", "not the qwen2 file"
    for text, special in QWEN3_ADDED:   # convert_hf_to_gguf.py: does_token_look_special
        looks_special = text.startswith("<|") and text.endswith("|>")
        tokens.append(text)
        types.append(gguf.TokenType.CONTROL if special or looks_special
                     else gguf.TokenType.USER_DEFINED)
    for i in range(len(tokens), QWEN3_ROWS):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_name("Qwen3 vocabulary")
    w.add_block_count(28)
    w.add_context_length(40960)
    w.add_embedding_length(1024)
    w.add_feed_forward_length(3072)
    w.add_head_count(16)
    w.add_head_count_kv(8)
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", help="llama.cpp's models/ folder (ggml-vocab-*.gguf)")
    args = parser.parse_args()
    with open(os.path.join(args.models, "ggml-vocab-phi-3.gguf"), "rb") as f:
        compress(f.read(), "phi-3.gguf.xz")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "qwen3.gguf")
        write_qwen3(os.path.join(args.models, "ggml-vocab-qwen2.gguf"), path)
        with open(path, "rb") as f:
            compress(f.read(), "qwen3.gguf.xz")


if __name__ == "__main__":
    main()
