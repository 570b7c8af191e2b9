"""megafuse.llm.tokenizer: text <-> token ids from a GGUF file's ``tokenizer.ggml.*`` metadata.

``Tokenizer.from_gguf(path_or_reader)`` rebuilds the tokenizer llama.cpp's converter stored in
the file, on the ``tokenizers`` package (byte-level BPE, and the matching of special tokens),
with plain Python for SentencePiece and decoding and jinja2 for the chat template
(``pip install 'megafuse[llm]'``: tokenizers, jinja2)::

    tok = megafuse.Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("Hello <|im_start|>")        # special tokens are recognised in the text
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
    stream = tok.stream_decoder()
    for i in ids:
        print(stream.push(i), end="")             # never half a UTF-8 character
    print(stream.flush())

Two vocabulary types (``tokenizer.ggml.model``); any other is a NotImplementedError naming it:

* ``gpt2``: byte-level BPE.  The text is cut by the regexes llama.cpp (``llama-vocab.cpp``)
  associates with ``tokenizer.ggml.pre`` (PRE_TOKENIZERS below; an unknown name is a
  NotImplementedError), each piece's UTF-8 bytes are spelled with GPT-2's 256 printable
  characters and merged by rank (``tokenizer.ggml.merges``).  The Llama 3 family matches a whole
  piece that is a token before merging (llama.cpp's ``ignore_merges``).
* ``llama``: SentencePiece BPE with byte fallback, as llama.cpp's ``llm_tokenizer_spm`` runs
  it.  Spaces are written U+2581 ("▁"), a "▁" is put before the text (the dummy prefix,
  ``tokenizer.ggml.add_space_prefix``, default on; Gemma's files turn it off), then from the
  characters the adjacent pair that makes the best-scoring token (``tokenizer.ggml.scores``) is
  merged, the leftmost on a tie, until none makes a token; a character no token covers becomes
  its ``<0xXX>`` byte tokens.  Only NORMAL tokens are made by merging.  No merge list is built
  (the `tokenizers` BPE model of the half a million merges Gemma 3's 262,144 tokens imply took
  most of the load), so a vocabulary of any size loads at once; encoding runs in Python
  (benchmarks/bench_tokenizer.py times both).

Special tokens (token types CONTROL, USER_DEFINED and UNKNOWN) are matched whole in the text
before anything else, as llama.cpp does; with ``parse_special=False`` CONTROL and UNKNOWN tokens
are read as plain text (USER_DEFINED ones still match, as in llama.cpp and transformers).

Where llama.cpp and transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``) disagree, this module follows (tests/llm/test_tokenizer.py checks the ids against
both):

* llama.cpp's regexes for ``pre`` (transformers uses GPT-2's single regex for the names it does
  not know, e.g. ``smollm``, whose digits llama.cpp -- and SmolLM's own tokenizer.json -- split
  one by one first: "x  1" and "a ½" differ);
* for the ``llama`` type's dummy prefix, SentencePiece and llama.cpp at the start of the text (a
  "▁" also before a leading space, which transformers' Metaspace omits: so that
  ``decode(encode(text)) == text``), and transformers after a special token in the text (no
  "▁" there; llama.cpp puts one), except in phi3 files, where transformers puts one too;
* transformers' text after Phi-3's special tokens: llama.cpp strips its leading whitespace, a
  workaround it applies only where ``general.name`` contains "phi-3" or "phi3";
* llama.cpp's matching of the tokens matched whole: those of type UNKNOWN too (Phi-3's [PADn];
  transformers matches only CONTROL and USER_DEFINED ones), and a run of Gemma's space tokens
  the longest first (40 spaces: 31 + 9; transformers respells them "▁▁..." and merges the run
  by BPE: 16 + 24).

Decoding is the exact inverse of encoding (no clean-up of spaces before punctuation); the
``llama`` type drops the one space its dummy prefix put at the start of the text (and after
each special token, where it put one there).
"""
from __future__ import annotations

import codecs
import contextvars
import functools
import heapq
import importlib
import json
import math
import operator
import re
import time
from typing import (Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from megafuse.llm.metadata_values import describe, is_bool, is_int, is_number

# ---- constants -------------------------------------------------------------------------------

#: tokenizer.ggml.token_type values (llama.cpp's llama_token_type; gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNDEFINED = 0   # llama.cpp's LLAMA_TOKEN_TYPE_UNDEFINED: read as NORMAL

# a SentencePiece byte token's spelling (llama.cpp reads the byte from it)
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")

#: The vocabulary types this module builds (tokenizer.ggml.model).
MODELS = ("gpt2", "llama")

SPM_SPACE = "\u2581"   # SentencePiece's spelling of a space

# llama.cpp's splitting regexes (llama-vocab.cpp, llm_tokenizer_bpe), applied in turn: each cuts
# every piece the previous ones left into its matches and the text between them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
           r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

#: pre-tokenizer family -> its regexes, in the order llama.cpp applies them
PRE_TOKENIZER_REGEXES: Dict[str, Tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),              # digits one by one, then GPT-2's regex
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (_TEKKEN,),
}

#: tokenizer.ggml.pre -> pre-tokenizer family (llama.cpp's names)
PRE_TOKENIZERS: Dict[str, str] = {
    "default": "default",
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
                     "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt", "olmo",
                     "jais"), "gpt2"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                     "minerva-7b"), "starcoder"),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe",
                     "chatglm-bpe"), "llama3"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), "qwen2"),
    "falcon": "falcon",
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), "bloom"),
    "viking": "viking",
    "tekken": "tekken",
}

#: Architectures whose SentencePiece files transformers reads with the dummy prefix before each
#: text between special tokens (as llama.cpp reads every file), not only at the start.
_PREFIX_AFTER_SPECIAL = frozenset(("phi3",))

#: pre names whose vocabularies llama.cpp matches whole before merging, and that add a BOS
#: unless the metadata says otherwise
_IGNORE_MERGES_AND_BOS = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3", "tekken"))

# Tokens llama.cpp finds by their text when the metadata does not name them (llama-vocab.cpp).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_EOG_TEXTS = (  # FIM pad, repo and file-separator tokens also end a generation
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>")


# Bounds on the work of one rendering of a chat template (apply_chat_template).  The template
# comes from the model file, which may be hostile; jinja2's sandbox keeps it away from Python's
# internals but not from running for hours or filling the memory.  Each bound is far above what a
# real template needs: a few loop iterations per message, values the size of the conversation.

#: The loop iterations one rendering may run: every iteration of every ``{% for %}`` and every
#: number ``range()`` yields count (a loop over ``range(n)`` counts n, once).  A real template
#: runs a few per message (a 10 000-message chat: some 10**5); two nested ``range(100000)``, each
#: within jinja2's MAX_RANGE, would run 10**10 (hours).  Past it: a ValueError.
MAX_TEMPLATE_LOOP_ITERATIONS = 1_000_000

#: The most items (characters, list elements) of a value the template makes with ``*`` or ``+``,
#: passes to or gets back from a call (a macro, a method), keeps in a ``namespace()``, and of its
#: whole output: ten million characters is a prompt of millions of tokens, far beyond any
#: context window, and ``'a' * 10**12`` would otherwise be a MemoryError (or the machine
#: swapping).
MAX_TEMPLATE_VALUE_SIZE = 10_000_000

#: The largest integer, in bits, ``*`` and ``**`` may make (``10 ** 10 ** 10`` would take hours
#: and gigabytes; chat templates count messages).
MAX_TEMPLATE_INT_BITS = 1 << 16

#: A backstop in wall-clock seconds, checked at every call, operator ``*`` / ``**`` / ``+`` and
#: every 64 loop iterations: the bounds above limit how often the template loops, not what one
#: iteration does with values of up to MAX_TEMPLATE_VALUE_SIZE items (or a recursion's fan-out).
#: Real templates render in milliseconds.
MAX_TEMPLATE_SECONDS = 10.0

#: The most characters given to the ``wordwrap`` and ``urlize`` filters, which run for long in
#: one call, out of reach of the checks above: wordwrap's time grows with the square of a word's
#: length (20 s for a 10**6-character word), urlize takes some microseconds a word.
MAX_TEMPLATE_SLOW_FILTER_INPUT = 100_000

#: The most characters of a chat template's source, checked before compiling: compiling is not
#: covered by the bounds above, and its time grows with the source (seconds a megabyte).  The
#: largest real templates (tool calling, several languages) are some 20 000 characters.
MAX_TEMPLATE_SOURCE_CHARS = 200_000


def _require(module: str) -> Any:
    """An optional dependency, or an ImportError that says how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"megafuse.Tokenizer needs the '{module}' package: pip install "
                          f"{module}  (or pip install 'megafuse[llm]')") from exc


@functools.cache
def _byte_spelling() -> Tuple[Dict[int, str], Dict[str, int]]:
    """GPT-2's byte-level alphabet: the printable Latin-1 bytes stand for themselves, the other
    68 bytes for U+0100.. in byte order.  (byte -> character, character -> byte)"""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spell = {b: chr(b) for b in printable}
    extra = 0x100
    for b in range(256):
        if b not in spell:
            spell[b] = chr(extra)
            extra += 1
    return spell, {c: b for b, c in spell.items()}


@functools.lru_cache(maxsize=1)
def _byte_spelling_as_latin1() -> Dict[int, str]:
    """A str.translate table: each character of GPT-2's byte alphabet -> the Latin-1 character
    of its byte; each other character below U+0100 -> its UTF-8 bytes as Latin-1 characters.
    (A translated token whose characters are all below U+0100 encodes to its bytes in
    Latin-1.)"""
    spell, _ = _byte_spelling()
    table = {ord(c): chr(b) for b, c in spell.items()}
    for code in range(0x100):
        table.setdefault(code, chr(code).encode("utf-8").decode("latin-1"))
    return table


def _metadata_array(value: Any, key: str, expected: str, ok: Callable[[Any], bool],
                    fast: Optional[Callable[[List[Any]], bool]] = None) -> List[Any]:
    """A metadata array as a list whose every element passes ``ok``; else a ValueError naming
    the key (and the index of the first bad element).  ``fast``, if given, vouches for a whole
    list at C speed (a 262k-token vocabulary: milliseconds, where ``ok`` on each element takes
    a second); when it cannot, each element is checked with ``ok``."""
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1:   # a NumPy array
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{key}: expected an array, got {describe(value)}")
    items: List[Any] = list(value)
    if fast is not None and fast(items):
        return items
    for i, item in enumerate(items):
        if not ok(item):
            raise ValueError(f"{key}[{i}]: expected {expected}, got {describe(item)}")
    return items


def _all_str(values: List[Any]) -> bool:
    return set(map(type, values)) <= {str}


def _all_token_types(values: List[Any]) -> bool:
    return set(map(type, values)) <= {int} and (
        not values or (min(values) >= UNDEFINED and max(values) <= BYTE))


def _all_finite_numbers(values: List[Any]) -> bool:
    return set(map(type, values)) <= {float, int} and all(map(math.isfinite, values))


def _metadata_id(value: Any, key: str, vocab_size: int) -> int:
    """A token id read from the metadata: an integer in [0, vocab_size); else a ValueError
    naming the key (a float, a string, an array, a boolean are not ids)."""
    if not is_int(value):
        raise ValueError(f"{key}: expected a token id (an integer), got {describe(value)}")
    i = int(value)
    if not 0 <= i < vocab_size:
        raise ValueError(f"{key}: {i} is outside the vocabulary [0, {vocab_size})")
    return i


def _flag(value: Any, key: str) -> Optional[bool]:
    """A boolean metadata value (None: not given)."""
    if value is None:
        return None
    if is_bool(value) or (is_int(value) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{key}: expected a boolean, got {describe(value)}")


def _as_id(value: Any, vocab_size: int, what: str = "token id") -> int:
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: expected an int, got {type(value).__name__}") from None
    if not 0 <= i < vocab_size:
        raise ValueError(f"{what}: {i} is outside the vocabulary [0, {vocab_size})")
    return i


# ---- the tokenizer ---------------------------------------------------------------------------

class Tokenizer:
    """A GGUF vocabulary: ``encode`` / ``decode`` / ``stream_decoder`` / ``apply_chat_template``.

    Usually made by ``Tokenizer.from_gguf``; the constructor takes the metadata's values
    (``tokens``, ``token_types``, ``scores``, ``merges`` as lists; ids as ints or None).  Each
    is checked: tokens are strings, token types integers 0..6 (a BYTE token of the ``llama``
    type spelled ``<0xNN>``), scores finite numbers, merges "left right" pairs of tokens that
    make a token; a ValueError names the field and the index of the first bad element.
    ``prefix_after_special``: the ``llama`` type's dummy prefix also goes before the text that
    follows each special or user-defined token (llama.cpp always; transformers for phi3 files),
    not only at the start of the text.
    ``add_bos`` / ``add_eos`` / ``add_space_prefix`` default to llama.cpp's choice for the
    vocabulary type and ``pre`` when None.
    """

    def __init__(self, tokens: Sequence[str], *, model: str,
                 token_types: Optional[Sequence[int]] = None,
                 scores: Optional[Sequence[float]] = None,
                 merges: Optional[Sequence[str]] = None, pre: Optional[str] = None,
                 bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                 eot_id: Optional[int] = None, eom_id: Optional[int] = None,
                 unk_id: Optional[int] = None, pad_id: Optional[int] = None,
                 add_bos: Optional[bool] = None, add_eos: Optional[bool] = None,
                 add_space_prefix: Optional[bool] = None, prefix_after_special: bool = False,
                 chat_template: Optional[str] = None) -> None:
        if model not in MODELS:
            raise NotImplementedError(
                f"tokenizer.ggml.model: megafuse builds {' and '.join(MODELS)} vocabularies, "
                f"got {model!r}")
        tokens = _metadata_array(tokens, "tokenizer.ggml.tokens", "a string",
                                 lambda t: isinstance(t, str), _all_str)
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer.ggml.tokens: the vocabulary is empty")
        # llama.cpp renames an empty token so that every text is distinct
        self._tokens: List[str] = tokens if all(tokens) else [
            t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._types: List[int] = [NORMAL] * n if token_types is None else list(map(
            int, _metadata_array(token_types, "tokenizer.ggml.token_type",
                                 f"a token type (an integer {UNDEFINED}..{BYTE})",
                                 lambda t: is_int(t) and UNDEFINED <= t <= BYTE,
                                 _all_token_types)))
        if len(self._types) != n:
            raise ValueError(f"tokenizer.ggml.token_type: {len(self._types)} types for {n} "
                             f"tokens")
        self._scores: Optional[List[float]] = None if scores is None else list(map(
            float, _metadata_array(scores, "tokenizer.ggml.scores", "a finite number",
                                   lambda s: is_number(s) and math.isfinite(s),
                                   _all_finite_numbers)))
        if merges is not None:
            merges = _metadata_array(merges, "tokenizer.ggml.merges",
                                     "a string 'left right'", lambda m: isinstance(m, str),
                                     _all_str)
        if pre is not None and not isinstance(pre, str):
            raise ValueError(f"tokenizer.ggml.pre: expected a string, got {describe(pre)}")
        add_bos = _flag(add_bos, "tokenizer.ggml.add_bos_token")
        add_eos = _flag(add_eos, "tokenizer.ggml.add_eos_token")
        add_space_prefix = _flag(add_space_prefix, "tokenizer.ggml.add_space_prefix")
        if self._scores is not None and len(self._scores) != n:
            raise ValueError(f"tokenizer.ggml.scores: {len(self._scores)} scores for {n} tokens")
        self._ids: Dict[str, int] = dict(zip(self._tokens, range(n)))
        if len(self._ids) != n:
            first: Dict[str, int] = {}
            for i, t in enumerate(self._tokens):
                if first.setdefault(t, i) != i:
                    raise ValueError(f"tokenizer.ggml.tokens: token {t!r} appears twice "
                                     f"(ids {first[t]} and {i})")
        self.model = model
        self.pre: Optional[str] = pre
        if model == "gpt2":
            if merges is None:
                raise ValueError("tokenizer.ggml.merges: a gpt2 vocabulary needs its merges")
            family = PRE_TOKENIZERS.get(pre or "default")
            if family is None:
                raise NotImplementedError(
                    f"tokenizer.ggml.pre: pre-tokenizer {pre!r} is not supported (supported: "
                    f"{', '.join(sorted(PRE_TOKENIZERS))})")
            self._regexes = PRE_TOKENIZER_REGEXES[family]
            self._ignore_merges = pre in _IGNORE_MERGES_AND_BOS
            default_bos = pre in _IGNORE_MERGES_AND_BOS
            self.add_space_prefix = False
        else:
            if self._scores is None:
                raise ValueError("tokenizer.ggml.scores: a llama vocabulary needs its scores")
            self._regexes = ()
            self._ignore_merges = False
            default_bos = True
            self.add_space_prefix = True if add_space_prefix is None else add_space_prefix
        self.prefix_after_special = bool(prefix_after_special) and self.add_space_prefix
        self._merges = merges
        self.add_bos = default_bos if add_bos is None else add_bos
        self.add_eos = False if add_eos is None else add_eos

        def check(name: str, value: Optional[int]) -> Optional[int]:
            return None if value is None else _metadata_id(value, f"tokenizer.ggml.{name}", n)

        self.bos_id = check("bos_token_id", bos_id)
        self.eos_id = check("eos_token_id", eos_id)
        self.unk_id = check("unknown_token_id", unk_id)
        self.pad_id = check("padding_token_id", pad_id)
        self.eot_id = check("eot_token_id", eot_id)
        if self.eot_id is None:
            self.eot_id = self._find(_EOT_TEXTS)
        self.eom_id = check("eom_token_id", eom_id)
        if self.eom_id is None:
            self.eom_id = self._find(_EOM_TEXTS)
        self.eog_ids: FrozenSet[int] = self._end_of_generation()
        self.chat_template: Optional[str] = chat_template

        # CONTROL and UNKNOWN tokens: matched whole in the text when parse_special, left out
        # of a decoded text by skip_special (USER_DEFINED ones are always matched and shown)
        self._special_ids = frozenset(i for i, t in enumerate(self._types)
                                      if t in (CONTROL, UNKNOWN))
        self._matched_whole_ids = self._special_ids | frozenset(
            i for i, t in enumerate(self._types) if t == USER_DEFINED)
        self._check_byte_tokens()
        # each token's bytes in a decoded text, made when first decoded (_piece)
        self._pieces: List[Optional[bytes]] = [None] * n
        self._backend = self._build_backend()
        self._backend_plain: Any = None   # the same without special tokens, made on first use

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, source: Any) -> Tokenizer:
        """The tokenizer of a GGUF file (a path, a ``megafuse.llm.gguf.GGUFFile`` or a
        ``gguf.GGUFReader``)."""
        from megafuse.llm import gguf as mf_gguf
        reader = mf_gguf.open_reader(source)

        def field(key: str, default: Any = None) -> Any:
            return mf_gguf._field(reader, f"tokenizer.{key}", default)

        model = field("ggml.model")
        if model is None:
            raise ValueError("GGUF metadata: tokenizer.ggml.model is missing (the file has no "
                             "vocabulary)")
        if not isinstance(model, str):
            raise ValueError(f"tokenizer.ggml.model: expected a string, got {describe(model)}")
        tokens = field("ggml.tokens")
        if tokens is None:
            raise ValueError("GGUF metadata: tokenizer.ggml.tokens is missing")
        # llama.cpp's defaults for SentencePiece vocabularies
        ids = {"bos": 1, "eos": 2, "unknown": 0} if model == "llama" else {}
        kw = {name: field(f"ggml.{name}_token_id", ids.get(name))
              for name in ("bos", "eos", "eot", "eom", "unknown", "padding")}
        return cls(
            tokens, model=model, token_types=field("ggml.token_type"),
            scores=field("ggml.scores"), merges=field("ggml.merges"), pre=field("ggml.pre"),
            bos_id=kw["bos"], eos_id=kw["eos"], eot_id=kw["eot"], eom_id=kw["eom"],
            unk_id=kw["unknown"], pad_id=kw["padding"], add_bos=field("ggml.add_bos_token"),
            add_eos=field("ggml.add_eos_token"), add_space_prefix=field("ggml.add_space_prefix"),
            prefix_after_special=mf_gguf._field(reader, "general.architecture")
            in _PREFIX_AFTER_SPECIAL,
            chat_template=field("chat_template"))

    def _find(self, texts: Iterable[str]) -> Optional[int]:
        for text in texts:
            if text in self._ids:
                return self._ids[text]
        return None

    def _end_of_generation(self) -> FrozenSet[int]:
        """llama.cpp's end-of-generation set: FIM pad / repo / file-separator tokens, tokens
        whose text ends a turn or a text, and the eos, eot and eom ids."""
        eog = {i for i in (self._find(texts) for texts in _FIM_EOG_TEXTS) if i is not None}
        eog.update(self._ids[t] for t in _EOG_TEXTS if t in self._ids)
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        # gpt-oss (o200k_harmony) / solar-open: <|end|> ends a message, not the generation
        names = {self._tokens[i] for i in eog}
        if "<|end|>" in names and "<|call|>" in names | {"<|calls|>"} and \
                ("<|return|>" in names or "<|flush|>" in names):
            eog.discard(self._ids["<|end|>"])
        return frozenset(eog)

    def _merge_pairs(self) -> List[Tuple[str, str]]:
        """The gpt2 type's merges (tokenizer.ggml.merges) as pairs of tokens."""
        pairs = []
        ids = self._ids
        for i, merge in enumerate(self._merges or ()):
            cut = merge.find(" ", 1)   # a merge may start with a space token (llama.cpp)
            left, right = merge[:cut], merge[cut + 1:]
            if cut < 0 or not right:
                raise ValueError(f"tokenizer.ggml.merges[{i}]: {merge!r} is not a pair of "
                                 f"tokens 'left right'")
            # the two tokens and the one they make must be in the vocabulary (the tokenizers
            # package refuses the merges otherwise)
            if left not in ids or right not in ids or left + right not in ids:
                missing = next(p for p in (left, right, left + right) if p not in ids)
                raise ValueError(f"tokenizer.ggml.merges[{i}]: {merge!r} is not a pair of "
                                 f"tokens 'left right': {missing!r} is not in the "
                                 f"vocabulary (tokenizer.ggml.tokens)")
            pairs.append((left, right))
        return pairs

    def _build_backend(self) -> Any:
        """The ``tokenizers`` model: for gpt2, the byte-level BPE; for llama, a word-level
        model that knows no word: encoding cuts the text into the tokens matched whole and the
        runs of text between them (each one unknown word, encoded by _spm_encode)."""
        models = _require("tokenizers").models
        if self.model == "gpt2":
            merges = self._merge_pairs()
            try:
                self._model: Any = models.BPE(
                    vocab=self._ids, merges=merges, ignore_merges=self._ignore_merges,
                    fuse_unk=False, byte_fallback=False)
            except Exception as exc:   # (tokenizers raises a bare Exception)
                raise ValueError(f"tokenizer.ggml.tokens / tokenizer.ggml.merges: the "
                                 f"tokenizers package refused the vocabulary: {exc}") from exc
        else:
            # every run of text is this model's unknown word; the tokens matched whole come
            # out under their own text
            run = "\x00megafuse:text\x00"           # (a name no token has)
            while run in self._ids:
                run += "\x00"
            self._text_run = run
            self._model = models.WordLevel(vocab={run: 0}, unk_token=run)
            self._byte_ids: List[Optional[int]] = [
                self._ids.get(f"<0x{b:02X}>") for b in range(256)]
        return self._new_backend(encode_special_tokens=False)

    def _new_backend(self, *, encode_special_tokens: bool) -> Any:
        """A ``tokenizers.Tokenizer`` on the model (shared, not copied): the special
        (CONTROL, UNKNOWN) and USER_DEFINED tokens matched whole, then gpt2's pre-tokenizer;
        ``encode_special_tokens``: the special ones read as plain text."""
        tk = _require("tokenizers")
        pre_tokenizers = tk.pre_tokenizers
        backend = tk.Tokenizer(self._model)
        if self.model == "gpt2":
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(tk.Regex(r), behavior="isolated") for r in self._regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = [tk.AddedToken(self._tokens[i], special=True, normalized=False)
                   for i in sorted(self._special_ids)]
        user = [tk.AddedToken(self._tokens[i], special=False, normalized=False)
                for i, typ in enumerate(self._types) if typ == USER_DEFINED]
        if special:
            backend.add_special_tokens(special)
        if user:
            backend.add_tokens(user)
        backend.encode_special_tokens = encode_special_tokens
        return backend

    def _check_byte_tokens(self) -> None:
        """A BYTE token of the ``llama`` type must be spelled <0xNN> (its byte)."""
        if self.model == "gpt2":
            return
        for i, (token, typ) in enumerate(zip(self._tokens, self._types)):
            if typ == BYTE and not _BYTE_TOKEN.match(token):
                raise ValueError(f"tokenizer.ggml.tokens[{i}]: {token!r} has the token type "
                                 f"BYTE (tokenizer.ggml.token_type[{i}] = {BYTE}) but is not "
                                 f"spelled <0xNN>")

    def _piece(self, i: int) -> bytes:
        """Token ``i``'s bytes in a decoded text (a special token: its text), made on first use
        and kept."""
        piece = self._pieces[i]
        if piece is None:
            piece = self._pieces[i] = self._piece_of(self._tokens[i], self._types[i])
        return piece

    def _piece_of(self, token: str, typ: int) -> bytes:
        if typ in (CONTROL, UNKNOWN, USER_DEFINED):
            return token.encode("utf-8")
        if self.model == "gpt2":
            # each character of the byte alphabet is its byte; a character outside it stands
            # for itself (its UTF-8 bytes).  str.translate does both at C speed for characters
            # below U+0100; a token with others takes the loop.
            try:
                return token.translate(_byte_spelling_as_latin1()).encode("latin-1")
            except UnicodeEncodeError:
                _, to_byte = _byte_spelling()
                return b"".join(bytes((to_byte[c],)) if c in to_byte else c.encode("utf-8")
                                for c in token)
        if typ == BYTE:
            return bytes((int(token[3:5], 16),))
        return token.replace(SPM_SPACE, " ").encode("utf-8")

    def _spm_encode(self, text: str) -> List[int]:
        """llama.cpp's SentencePiece tokenizer (llm_tokenizer_spm) on one run of text (spaces
        already written "▁"): start from the characters; merge the adjacent pair that makes the
        best-scoring token, the leftmost on a tie, until no pair makes one; a character that is
        no token becomes its <0xXX> byte tokens (the unknown token where those are missing).
        Only NORMAL tokens are made by merging: BYTE tokens stand for their byte, CONTROL /
        UNKNOWN / USER_DEFINED / UNUSED ones only come whole from the text."""
        symbols = list(text)                         # [n] each symbol's text
        n = len(symbols)
        after = list(range(1, n + 1))                # [n] the next live symbol (n: none)
        before = list(range(-1, n - 1))              # [n] the previous one (-1: none)
        ids, types, scores = self._ids, self._types, self._scores
        assert scores is not None
        mergeable = (NORMAL, UNDEFINED)

        def score(merged: str) -> Optional[float]:
            i = ids.get(merged)
            return scores[i] if i is not None and types[i] in mergeable else None

        heap = []                                    # (-score, left symbol, merged text)
        for i in range(n - 1):
            merged = symbols[i] + symbols[i + 1]
            s = score(merged)
            if s is not None:
                heap.append((-s, i, merged))
        heapq.heapify(heap)
        while heap:
            _, i, merged = heapq.heappop(heap)
            j = after[i]
            # a pair that a merge before this one changed is stale
            if j >= n or symbols[i] + symbols[j] != merged:
                continue
            symbols[i], symbols[j] = merged, ""
            k = after[i] = after[j]
            if k < n:
                before[k] = i
                s = score(merged + symbols[k])
                if s is not None:
                    heapq.heappush(heap, (-s, i, merged + symbols[k]))
            h = before[i]
            if h >= 0:
                s = score(symbols[h] + merged)
                if s is not None:
                    heapq.heappush(heap, (-s, h, symbols[h] + merged))
        out: List[int] = []
        i = 0
        while i < n:
            token = ids.get(symbols[i])
            if token is not None:
                out.append(token)
            else:
                for b in symbols[i].encode("utf-8"):
                    byte = self._byte_ids[b]
                    if byte is None:
                        if self.unk_id is None:
                            raise ValueError(f"encode: {symbols[i]!r} is not in the vocabulary, "
                                             f"which has neither its byte tokens nor an "
                                             f"unknown token (tokenizer.ggml.unknown_token_id)")
                        byte = self.unk_id
                    out.append(byte)
            i = after[i]
        return out

    # -- vocabulary ----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of a token's text as the file spells it (None if it is not a token)."""
        return self._ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The text of a token as the file spells it (e.g. 'Ġthe', '▁the', '<0x0A>')."""
        return self._tokens[_as_id(token_id, len(self._tokens))]

    def token_type(self, token_id: int) -> int:
        """tokenizer.ggml.token_type of a token (NORMAL, CONTROL, BYTE, ...)."""
        return self._types[_as_id(token_id, len(self._tokens))]

    def is_eog(self, token_id: int) -> bool:
        """Whether the token ends a generation (``eog_ids``)."""
        return operator.index(token_id) in self.eog_ids

    # -- text -> ids ---------------------------------------------------------------------------

    def encode(self, text: str, *, add_special: Optional[bool] = None,
               parse_special: bool = True) -> List[int]:
        """The token ids of ``text``.

        ``add_special``: None puts BOS / EOS where the metadata says (``add_bos`` /
        ``add_eos``), True puts both (those the vocabulary has), False neither.
        ``parse_special``: special tokens written in the text (e.g. "<|im_start|>") become
        their ids; False reads CONTROL tokens as plain text.
        """
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        if parse_special:
            backend = self._backend
        else:
            if self._backend_plain is None:
                self._backend_plain = self._new_backend(encode_special_tokens=True)
            backend = self._backend_plain
        ids: List[int]
        if not text:
            ids = []
        elif self.model == "gpt2":
            ids = backend.encode(text, add_special_tokens=False).ids
        else:
            # the tokens matched whole, and the runs of text between them (SentencePiece)
            found = backend.encode(text, add_special_tokens=False)
            ids = []
            every = self.prefix_after_special
            prefix = SPM_SPACE if self.add_space_prefix else ""
            for token, (start, end) in zip(found.tokens, found.offsets):
                if token != self._text_run:
                    ids.append(self._ids[token])
                    continue
                run = text[start:end].replace(" ", SPM_SPACE)
                ids += self._spm_encode(prefix + run if every or start == 0 else run)
        bos = self.add_bos if add_special is None else bool(add_special)
        eos = self.add_eos if add_special is None else bool(add_special)
        if bos:
            if self.bos_id is None:
                raise ValueError("encode: the vocabulary has no BOS token to add "
                                 "(pass add_special=False)")
            ids.insert(0, self.bos_id)
        if eos:
            if self.eos_id is None:
                raise ValueError("encode: the vocabulary has no EOS token to add "
                                 "(pass add_special=False)")
            ids.append(self.eos_id)
        return ids

    # -- ids -> text ---------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to a decoded text (a special token: its text); may be
        part of a UTF-8 character."""
        return self._piece(_as_id(token_id, len(self._tokens)))

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of ``ids``; ``skip_special`` leaves CONTROL and UNKNOWN tokens (BOS, EOS,
        <|im_end|>, ...) out.  Bytes that are not valid UTF-8 become U+FFFD."""
        stream = self.stream_decoder(skip_special=skip_special)
        return "".join([stream.push(i) for i in ids] + [stream.flush()])

    def stream_decoder(self, *, skip_special: bool = False,
                       at_start: bool = True) -> StreamDecoder:
        """A decoder fed one id at a time that returns only whole characters: a UTF-8 sequence
        split over tokens is held back until it completes.  The pieces of ``push`` and
        ``flush`` concatenate to ``decode(ids)``.  ``at_start=False`` for ids that continue a
        text (tokens generated after a prompt): the ``llama`` type's dummy-prefix space is then
        kept on the first token."""
        return StreamDecoder(self, skip_special=skip_special, at_start=at_start)

    # -- chat ----------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, tokenize: bool = False, *,
                            chat_template: Optional[str] = None,
                            **kwargs: Any) -> Union[str, List[int]]:
        """Render the chat template (the file's ``tokenizer.chat_template``, or
        ``chat_template``) over ``messages`` ([{"role": ..., "content": ...}, ...]) as
        transformers does: a sandboxed jinja2 environment with trim_blocks and lstrip_blocks,
        loop controls, ``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson`` filter
        that keeps non-ASCII characters, and the variables ``messages``,
        ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``,
        ``tools`` and ``documents`` (None), then ``kwargs``.

        ``tokenize=True`` returns the ids instead: special tokens parsed, and BOS put first
        where the metadata asks for it, unless the template already wrote it.

        Errors:

        * ``raise_exception(msg)``, the template refusing the messages (e.g. "roles must
          alternate"), raises a jinja2 ``TemplateError`` with ``msg`` as transformers does; its
          class is also a ValueError (``except ValueError`` catches it too).
        * Any other failure of the template, while compiling or rendering (a syntax error, an
          undefined variable, something the sandbox forbids, a division by zero, a recursive
          macro, ...) is a ValueError "tokenizer.chat_template: the model file's chat template
          failed: <Type>: <message>" (for ``chat_template=``: "chat_template: the chat template
          passed to apply_chat_template failed: ..."), chained from the original exception.
        * So is a template that exceeds the work bounds (MAX_TEMPLATE_LOOP_ITERATIONS loop
          iterations, values or an output of more than MAX_TEMPLATE_VALUE_SIZE items, integers
          of more than MAX_TEMPLATE_INT_BITS bits, MAX_TEMPLATE_SECONDS seconds).
        * A stored template that is not a string is a ValueError naming
          ``tokenizer.chat_template``; a ``chat_template=`` that is not one, a TypeError.
        """
        if chat_template is not None:
            template: Any = chat_template
            origin = "chat_template: the chat template passed to apply_chat_template"
            if not isinstance(template, str):
                raise TypeError(f"chat_template: expected a str, got {type(template).__name__}")
        else:
            template = self.chat_template
            origin = "tokenizer.chat_template: the model file's chat template"
            if template is None:
                raise ValueError("apply_chat_template: this GGUF file has no "
                                 "tokenizer.chat_template; pass chat_template=")
            if not isinstance(template, str):
                raise ValueError(f"tokenizer.chat_template: expected a string, got "
                                 f"{describe(template)}")
        context: Dict[str, Any] = {"tools": None, "documents": None}
        for name, token_id in (("bos_token", self.bos_id), ("eos_token", self.eos_id),
                               ("unk_token", self.unk_id), ("pad_token", self.pad_id)):
            if token_id is not None:
                context[name] = self._tokens[token_id]
        context.update(kwargs)
        context.update(messages=list(messages), add_generation_prompt=add_generation_prompt)
        text = _render_template(template, origin, context)
        if not tokenize:
            return text
        ids = self.encode(text, add_special=False)
        if self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}"
                f", bos_id={self.bos_id}, eos_id={self.eos_id}, eog_ids={sorted(self.eog_ids)})")


class StreamDecoder:
    """Incremental decoding (``Tokenizer.stream_decoder``): ``push(id)`` returns the text that
    is complete so far, ``flush()`` the rest (an unfinished UTF-8 sequence as U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False,
                 at_start: bool = True) -> None:
        self._tok = tokenizer
        self._skip = tokenizer._special_ids if skip_special else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # the llama type drops the one space its dummy prefix put before the text (and, with
        # prefix_after_special, after each special or user-defined token)
        self._strip_space = at_start and tokenizer.add_space_prefix
        self._strip_after: FrozenSet[int] = (tokenizer._matched_whole_ids
                                             if tokenizer.prefix_after_special else frozenset())

    def push(self, token_id: int) -> str:
        i = _as_id(token_id, self._tok.vocab_size)
        if i in self._strip_after:
            text = "" if i in self._skip else self._emit(self._utf8.decode(self._tok._piece(i)))
            self._strip_space = True
            return text
        if i in self._skip:
            return ""
        return self._emit(self._utf8.decode(self._tok._piece(i)))

    def flush(self) -> str:
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_space and text:
            self._strip_space = False
            if text[0] == " ":
                text = text[1:]
        return text


# ---- chat templates --------------------------------------------------------------------------

class _LimitExceeded(Exception):
    """A chat template went past one of the MAX_TEMPLATE_* bounds."""


class _RenderBudget:
    """What one rendering of a chat template may still do (the MAX_TEMPLATE_* bounds, read when
    the rendering starts)."""

    _SIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset)

    def __init__(self) -> None:
        self.iterations = 0
        self.max_iterations = MAX_TEMPLATE_LOOP_ITERATIONS
        self.max_size = MAX_TEMPLATE_VALUE_SIZE
        self.max_bits = MAX_TEMPLATE_INT_BITS
        self.seconds = MAX_TEMPLATE_SECONDS
        self.deadline = time.monotonic() + self.seconds

    def tick(self) -> None:
        """One loop iteration."""
        self.iterations = n = self.iterations + 1
        if n > self.max_iterations:
            raise _LimitExceeded(f"the template exceeded {self.max_iterations} loop iterations "
                                 f"(megafuse.tokenizer.MAX_TEMPLATE_LOOP_ITERATIONS)")
        # the clock every 64 iterations: reading it takes as long as an empty iteration
        if not n & 63 and time.monotonic() > self.deadline:
            self._late()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            self._late()

    def _late(self) -> None:
        raise _LimitExceeded(f"the template ran for more than {self.seconds:g} s "
                             f"(megafuse.tokenizer.MAX_TEMPLATE_SECONDS)")

    @staticmethod
    def _amount(n: int) -> str:   # (an int of over 4300 digits cannot be printed)
        return str(n) if n < 10**15 else f"about 2**{n.bit_length() - 1}"

    def too_big(self, size: int, what: str) -> _LimitExceeded:
        return _LimitExceeded(f"{what} would have {self._amount(size)} items (the limit is "
                              f"{self.max_size}: megafuse.tokenizer.MAX_TEMPLATE_VALUE_SIZE)")

    def too_many_bits(self, bits: int, what: str) -> _LimitExceeded:
        return _LimitExceeded(f"{what} would be an integer of {self._amount(bits)} bits or "
                              f"more (the limit is {self.max_bits}: "
                              f"megafuse.tokenizer.MAX_TEMPLATE_INT_BITS)")

    def check_value(self, value: Any, what: str) -> Any:
        """``value`` if its size is within the bounds."""
        if isinstance(value, int):
            if value.bit_length() > self.max_bits:
                raise self.too_many_bits(value.bit_length(), what)
        elif isinstance(value, self._SIZED) and len(value) > self.max_size:
            raise self.too_big(len(value), what)
        return value

    def check_binop(self, operator: str, left: Any, right: Any) -> None:
        """Refuse ``left <operator> right`` before computing it if its result is too big."""
        self.check_time()
        sized = (str, bytes, bytearray, list, tuple)
        what = f"{type(left).__name__} {operator} {type(right).__name__}"
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, sized) and isinstance(times, int) and \
                        len(seq) * max(times, 0) > self.max_size:
                    raise self.too_big(len(seq) * times, what)
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > self.max_bits:
                raise self.too_many_bits(left.bit_length() + right.bit_length(), what)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and \
                right > 0 and abs(left) > 1:
            bits = right if right > self.max_bits else int(right * math.log2(abs(left))) + 1
            if bits > self.max_bits:
                raise self.too_many_bits(bits, what)
        elif operator == "+" and isinstance(left, sized) and isinstance(right, sized) and \
                len(left) + len(right) > self.max_size:
            raise self.too_big(len(left) + len(right), what)
        elif operator == "%" and isinstance(left, (str, bytes)):
            self.check_size(_printf_size(left, right), what)

    def check_size(self, size: int, what: str) -> None:
        """Refuse a value of `size` items before it is made."""
        if size > self.max_size:
            raise self.too_big(size, what)


_BUDGET: contextvars.ContextVar[Optional[_RenderBudget]] = contextvars.ContextVar(
    "megafuse_chat_template_budget", default=None)


def _budget() -> _RenderBudget:
    budget = _BUDGET.get()
    if budget is None:
        raise RuntimeError("megafuse.tokenizer: chat templates are rendered by "
                           "Tokenizer.apply_chat_template")
    return budget


class _CountedIterable:
    """An iterable whose items count as loop iterations (the iterable of each ``{% for %}``)."""

    __slots__ = ("_iterable", "_budget")

    def __init__(self, iterable: Any, budget: _RenderBudget) -> None:
        self._iterable = iterable
        self._budget = budget

    def __len__(self) -> int:   # a TypeError for a generator: jinja2's loop.length copes
        return len(self._iterable)

    def __iter__(self) -> Iterator[Any]:
        tick = self._budget.tick
        for item in self._iterable:
            tick()
            yield item


class _CountedRange(_CountedIterable):
    """The templates' ``range()``: jinja2's sandboxed range (at most MAX_RANGE numbers) whose
    numbers count as loop iterations wherever they are used (a loop, ``|list``, ``|sum``)."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        item = self._iterable[key]
        return _CountedRange(item, self._budget) if isinstance(item, range) else item

    def __contains__(self, value: Any) -> bool:
        return value in self._iterable

    def __reversed__(self) -> Iterator[Any]:
        return iter(_CountedIterable(reversed(self._iterable), self._budget))

    def __getattr__(self, name: str) -> Any:
        if name in ("start", "stop", "step", "count", "index"):
            return getattr(self._iterable, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return repr(self._iterable)


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    """The jinja2 environment chat templates are compiled in: transformers' (a sandboxed
    environment with trim_blocks, lstrip_blocks, loop controls, ``raise_exception``,
    ``strftime_now`` and a ``tojson`` that keeps non-ASCII characters), with the work of a
    rendering bounded (the MAX_TEMPLATE_* constants)."""
    jinja2 = _require("jinja2")
    sandbox = _require("jinja2.sandbox")
    utils = jinja2.utils
    # (the optional jinja2 is imported at run time: to mypy its classes are Any)
    template_error: Any = jinja2.exceptions.TemplateError
    importlib.import_module("jinja2.compiler")
    Markup = _require("markupsafe").Markup
    sandboxed: Any = sandbox.ImmutableSandboxedEnvironment
    namespace: Any = utils.Namespace

    class ChatTemplateRaised(template_error, ValueError):  # type: ignore[misc]
        """``raise_exception(msg)`` in a chat template: a jinja2 TemplateError as in
        transformers, and a ValueError."""

    ChatTemplateRaised.__module__ = __name__
    ChatTemplateRaised.__qualname__ = "ChatTemplateRaised"

    code_generator: Any = jinja2.compiler.CodeGenerator

    class CodeGenerator(code_generator):  # type: ignore[misc]
        """Jinja's code generator, but ``a ~ b ~ ...`` goes through the environment's
        megafuse_concat, which bounds the result before joining."""

        def visit_Concat(self, node: Any, frame: Any) -> None:
            if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
                super().visit_Concat(node, frame)
                return
            self.write("environment.megafuse_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Environment(sandboxed):  # type: ignore[misc]
        # repetition, powers, concatenation and printf-formatting go through call_binop (and
        # are not folded at compile time)
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        raised_error = ChatTemplateRaised
        code_generator_class = CodeGenerator

        def megafuse_concat(self, parts: Tuple[Any, ...]) -> str:
            budget = _budget()
            texts = [str(p) for p in parts]
            budget.check_size(sum(map(len, texts)), "a ~ concatenation")
            return "".join(texts)

        def wrap_str_format(self, value: Any) -> Any:
            """str.format / format_map whose every field is bounded before it is formatted
            (the width of ``'{:>3000000000}'.format(x)`` would be allocated at once)."""
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            f_self, is_map = value.__self__, value.__name__ == "format_map"
            escape = getattr(f_self, "escape", None) if isinstance(f_self, Markup) else None

            def bounded(*args: Any, **kwargs: Any) -> Any:
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    kwargs = args[0]
                    args = ()
                formatter = (_BoundedEscapeFormatter(self, escape=escape) if escape is not None
                             else _BoundedFormatter(self))
                return type(f_self)(formatter.vformat(f_self, args, kwargs))
            return functools.update_wrapper(bounded, value)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _budget().check_binop(operator, left, right)
            return self.binop_table[operator](left, right)

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            budget = _budget()
            budget.check_time()
            for value in (*args, *kwargs.values()):
                budget.check_value(value, "an argument of a call")
            args = _check_string_method(budget, obj, args, kwargs)
            return budget.check_value(super().call(context, obj, *args, **kwargs),
                                      "the result of a call")

        def megafuse_count_loop(self, iterable: Any) -> Any:
            """The iterable of a ``{% for %}`` (the compiled templates call it)."""
            if isinstance(iterable, _CountedRange):   # its numbers count already
                return iterable
            return _CountedIterable(iterable, _budget())

    class BoundedNamespace(namespace):  # type: ignore[misc]
        """``namespace()``, whose attributes are values within MAX_TEMPLATE_VALUE_SIZE (a value
        doubled at each iteration of a loop is refused before it fills the memory)."""

        def __setitem__(self, name: str, value: Any) -> None:
            _budget().check_value(value, f"namespace attribute {name!r}")
            super().__setitem__(name, value)

    def counted_range(*args: Any) -> _CountedRange:
        return _CountedRange(sandbox.safe_range(*args), _budget())

    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:
        if n > 100 or max > 1000:
            raise _LimitExceeded(f"lipsum(n={n}, max={max}): megafuse allows at most 100 "
                                 f"paragraphs of at most 1000 words")
        return utils.generate_lorem_ipsum(n, html, min, max)

    def raise_exception(message: str) -> None:
        raise ChatTemplateRaised(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        # an indent is written once per nesting level on every line: bounded (as separators)
        if len(str(indent if not isinstance(indent, int) else " " * min(indent, 65))) > 64 or \
                len(str(separators)) > 64:
            raise _LimitExceeded("tojson: an indent or separators of more than 64 characters")
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = Environment(trim_blocks=True, lstrip_blocks=True,
                      extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    for name in ("wordwrap", "urlize"):
        env.filters[name] = _bounded_filter(env.filters[name], name)
    for name, size in _GROWING_FILTERS.items():
        env.filters[name] = _sized_filter(env.filters[name], name, size)
    env.globals.update(range=counted_range, namespace=BoundedNamespace, lipsum=lipsum,
                       raise_exception=raise_exception, strftime_now=strftime_now)
    return env


# ---- sizes of what string-growing operations would make, before they make it ----------------

# a printf field: %[(key)][flags][width][.precision][length]type
_PRINTF_FIELD = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)")

#: Characters a number's field may take beyond its width and precision (a float's integer
#: digits: 309 for 1e308, a sign, an exponent).
_NUMBER_SLACK = 330


def _printf_size(fmt: Any, args: Any) -> int:
    """An upper bound of the length of ``fmt % args``: the format's own characters, and for each
    field its width, precision and the longest argument's text."""
    values = list(args.values()) if isinstance(args, Mapping) else \
        list(args) if isinstance(args, tuple) else [args]
    longest = max((len(str(v)) for v in values), default=0)
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    size = len(text)
    for _key, width, precision, _kind in _PRINTF_FIELD.findall(text):
        star = [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
        w = max(star, default=0) if width == "*" else int(width or 0)
        p = max(star, default=0) if precision == "*" else int(precision or 0)
        size += w + p + longest + _NUMBER_SLACK
    return size


def _join_size(items: Sequence[Any], separator: Any) -> int:
    return sum(len(str(i)) for i in items) + len(str(separator)) * max(len(items) - 1, 0)


def _replace_size(s: Any, old: Any, new: Any, count: Any = None) -> int:
    s, old, new = str(s), str(old), str(new)
    n = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _lines(s: Any) -> int:
    return str(s).count("\n") + 1


def _width(value: Any) -> int:
    """A width argument as a number of characters (a string: its length)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return len(str(value))


#: Filters whose result can be far larger than their input: an upper bound of its size from
#: the filter's arguments (as jinja2 passes them, after any context argument).
_GROWING_FILTERS: Dict[str, Callable[..., int]] = {
    "center": lambda value, width=80: max(len(str(value)), _width(width)),
    "indent": lambda s, width=4, *a, **k: len(str(s)) + _lines(s) * _width(width),
    "replace": lambda s, old, new, count=None: _replace_size(s, old, new, count),
    "format": lambda value, *args, **kwargs: _printf_size(str(value), kwargs or args),
    "join": lambda value, d="", attribute=None: (
        _join_size(list(value), d) if attribute is None else 0),
    "wordwrap": lambda s, width=79, break_long_words=True, wrapstring=None, *a, **k: (
        len(str(s)) + (len(str(s)) // max(_width(width), 1) + _lines(s)) *
        len(str(wrapstring or "\n"))),
    "batch": lambda value, linecount, fill_with=None: _width(linecount),
    "slice": lambda value, slices, fill_with=None: _width(slices),
    "urlize": lambda value, trim_url_limit=None, nofollow=False, target=None, rel=None,
    extra_schemes=None: len(str(value)) * (3 + len(str(target or "")) + len(str(rel or ""))),
}


def _sized_filter(function: Any, name: str, size: Callable[..., int]) -> Any:
    """A filter that refuses, before running, to make a result larger than
    MAX_TEMPLATE_VALUE_SIZE (``size`` bounds it from the arguments)."""
    takes_context = getattr(function, "jinja_pass_arg", None) is not None

    @functools.wraps(function)   # keeps jinja2's pass_environment / pass_eval_context mark
    def sized(*args: Any, **kwargs: Any) -> Any:
        own = args[1:] if takes_context else args
        if name == "join" and own and not isinstance(own[0], (list, tuple, str)):
            own = (list(own[0]),) + tuple(own[1:])         # (an iterator is read once)
            args = (args[:1] if takes_context else ()) + own
        _budget().check_size(size(*own, **kwargs), f"the {name} filter's result")
        return function(*args, **kwargs)
    return sized


#: str / bytes methods whose result can be far larger than the string: an upper bound of it
_GROWING_METHODS: Dict[str, Callable[..., int]] = {
    "center": lambda s, width, *a: max(len(s), _width(width)),
    "ljust": lambda s, width, *a: max(len(s), _width(width)),
    "rjust": lambda s, width, *a: max(len(s), _width(width)),
    "zfill": lambda s, width: max(len(s), _width(width)),
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t" if isinstance(s, str) else
                                                          b"\t") * max(_width(tabsize), 0),
    "replace": lambda s, old, new, count=-1: _replace_size(s, old, new, count),
    "join": lambda s, items: _join_size(items, s),
    "translate": lambda s, table, *a: len(s) * max(
        [len(v) if isinstance(v, (str, bytes)) else 1 for v in table.values()]
        if isinstance(table, Mapping) else [1]),
}


def _check_string_method(budget: _RenderBudget, obj: Any, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> Tuple[Any, ...]:
    """Refuse a call of a growing str / bytes method (``'a'.ljust(10**9)``) before it runs;
    the args to call it with (join's iterable read into a list)."""
    owner = getattr(obj, "__self__", None)
    size = _GROWING_METHODS.get(getattr(obj, "__name__", ""))
    if size is None or not isinstance(owner, (str, bytes, bytearray)):
        return args
    if obj.__name__ == "join" and args and not isinstance(args[0], (list, tuple)):
        args = (list(args[0]),) + args[1:]
    budget.check_size(size(owner, *args, **kwargs), f"{type(owner).__name__}.{obj.__name__}()")
    return args


def _bounded_format_field(formatter: Any, value: Any, format_spec: str) -> Any:
    """One field of str.format: its width and precision (every number in the spec) and its
    value's text bounded, and the running total of the formatted string."""
    budget = _budget()
    digits = re.findall(r"\d+", format_spec)
    if any(len(d) > 9 for d in digits):
        raise budget.too_big(10**9, "a str.format field")
    formatter.megafuse_size = getattr(formatter, "megafuse_size", 0) + sum(map(int, digits)) + \
        len(str(value)) + _NUMBER_SLACK
    budget.check_size(formatter.megafuse_size, "str.format()")
    return format(value, format_spec)


@functools.lru_cache(maxsize=1)
def _formatters() -> Tuple[Any, Any]:
    sandbox = _require("jinja2.sandbox")

    plain: Any = sandbox.SandboxedFormatter
    escaping: Any = sandbox.SandboxedEscapeFormatter

    class BoundedFormatter(plain):  # type: ignore[misc]
        format_field = _bounded_format_field

    class BoundedEscapeFormatter(escaping):  # type: ignore[misc]
        def format_field(self, value: Any, format_spec: str) -> Any:
            _bounded_format_field(self, value, format_spec)
            return super().format_field(value, format_spec)
    return BoundedFormatter, BoundedEscapeFormatter


def _BoundedFormatter(env: Any) -> Any:
    return _formatters()[0](env)


def _BoundedEscapeFormatter(env: Any, escape: Any) -> Any:
    return _formatters()[1](env, escape=escape)


def _bounded_filter(function: Any, name: str) -> Any:
    """A filter (whose first argument is jinja2's environment or eval context, as for wordwrap
    and urlize) that refuses a text longer than MAX_TEMPLATE_SLOW_FILTER_INPUT."""
    @functools.wraps(function)   # keeps jinja2's pass_environment / pass_eval_context mark
    def bounded(first: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_TEMPLATE_SLOW_FILTER_INPUT:
            raise _LimitExceeded(f"the {name} filter was given {len(value)} characters, more "
                                 f"than {MAX_TEMPLATE_SLOW_FILTER_INPUT} (megafuse.tokenizer."
                                 f"MAX_TEMPLATE_SLOW_FILTER_INPUT)")
        return function(first, value, *args, **kwargs)
    return bounded


@functools.lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """A chat template compiled in _environment() (cached), each ``{% for %}``'s iterable
    counted by the environment's megafuse_count_loop."""
    env = _environment()
    nodes = _require("jinja2").nodes
    tree = env.parse(template)
    for loop in list(tree.find_all(nodes.For)):
        loop.iter = nodes.Call(nodes.EnvironmentAttribute("megafuse_count_loop"), [loop.iter],
                               [], None, None).set_lineno(loop.iter.lineno, override=False)
    tree.set_environment(env)
    return env.from_string(tree)


def _render_template(template: str, origin: str, context: Dict[str, Any]) -> str:
    """``template`` rendered over ``context``; its failures and its going past the bounds are
    ValueErrors that begin with ``origin`` (apply_chat_template's docstring)."""
    env = _environment()
    budget = _RenderBudget()
    token = _BUDGET.set(budget)
    try:
        if len(template) > MAX_TEMPLATE_SOURCE_CHARS:
            raise _LimitExceeded(f"the template has {len(template)} characters, more than "
                                 f"{MAX_TEMPLATE_SOURCE_CHARS} (megafuse.tokenizer."
                                 f"MAX_TEMPLATE_SOURCE_CHARS)")
        compiled = _compile_template(template)
        pieces: List[str] = []
        size = 0
        for piece in compiled.generate(**context):
            size += len(piece)
            if size > budget.max_size:
                raise budget.too_big(size, "the output")
            pieces.append(piece)
        return "".join(pieces)
    except env.raised_error:
        raise
    except _LimitExceeded as exc:
        raise ValueError(f"{origin} failed: {exc}") from exc
    except Exception as exc:   # any other failure of the template
        raise ValueError(f"{origin} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        _BUDGET.reset(token)
