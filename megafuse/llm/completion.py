"""megafuse.llm.completion: text in, llama-cpp-python's response dicts out.

    model = megafuse.Model.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", activations="float")
    r = model.create_chat_completion([{"role": "user", "content": "Capital of France?"}])
    r["choices"][0]["message"]["content"]                   # 'The capital of France is Paris.'
    for chunk in model.create_completion("Once upon a time", max_tokens=32, stream=True):
        print(chunk["choices"][0]["text"], end="")

``create_completion(prompt, ...)`` and ``create_chat_completion(messages, ...)`` take the
arguments and return the dicts of llama-cpp-python's ``Llama`` methods of the same names (which
are OpenAI's ``text_completion`` / ``chat.completion`` objects; ``stream=True`` gives an
iterator of OpenAI's chunk dicts), ``create_embedding(input)`` OpenAI's embedding list.

One request is a ``TextGeneration`` per choice: a state machine fed the logits of each step
(``step(logits) -> Delta``), which applies the logits processors, the logit bias, the
penalties and the structured-output mask, samples, decodes, trims stop strings and decides the
finish reason.  The synchronous calls here drive it on one sequence; the server's engine
(``megafuse.serve.engine``) drives many of them in one batched step.

Structured output (``response_format`` ``json_object`` / ``json_schema``) is llguidance's: the
schema becomes an llguidance grammar, and a matcher masks, before each draw, every token that
cannot continue a text the grammar accepts.

Every argument is checked before anything runs: a TypeError or ValueError names it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence as Seq,
                    Set, Tuple, Union)

import numpy as np
import numpy.typing as npt

from megafuse.llm.sampling import Sampler, _integer, log_softmax
from megafuse.llm.sequence import PREFILL_CHUNK, Sequence, stop_list

F32Array = npt.NDArray[np.float32]
LogitsProcessor = Callable[[npt.NDArray[np.intc], F32Array], F32Array]

#: The most alternatives ``logprobs`` / ``top_logprobs`` may ask for (OpenAI's bound).
MAX_TOP_LOGPROBS = 20

#: llama-cpp-python's defaults for its create_completion / create_chat_completion.
COMPLETION_DEFAULTS = dict(max_tokens=16, temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                           repeat_penalty=1.0)
CHAT_DEFAULTS = dict(max_tokens=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
                     repeat_penalty=1.0)


# ---- settings ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Settings:
    """One request's checked generation settings (``settings()``)."""
    max_tokens: Optional[int]               # None: until the cache is full
    sampler: Dict[str, Any]                 # Sampler's keyword arguments, but the seed
    seed: Optional[int]                     # choice i draws with seed + i
    stop_ids: Set[int]
    stop_texts: List[str]
    logprobs: Optional[int]                 # None: no logprobs; k: the token's and k others'
    grammar: Optional[str]                  # an llguidance grammar (response_format)
    processors: List[LogitsProcessor]
    n: int


def settings(model: Any, *, max_tokens: Optional[int] = 16, temperature: float = 0.8,
             top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
             repeat_penalty: float = 1.0, presence_penalty: float = 0.0,
             frequency_penalty: float = 0.0, repeat_last_n: int = 64,
             seed: Optional[int] = None, stop: Any = None, logprobs: Optional[int] = None,
             logit_bias: Optional[Mapping[Any, Any]] = None, n: int = 1,
             response_format: Optional[Mapping[str, Any]] = None,
             logits_processor: Any = None) -> Settings:
    """Check every generation argument (TypeError / ValueError naming it) and gather them.

    max_tokens None or <= 0: until the cache is full (llama-cpp-python's rule); logprobs None
    or 0..MAX_TOP_LOGPROBS alternatives; n 1..128 choices; response_format None,
    {"type": "text"}, {"type": "json_object"} (any JSON object, or the JSON schema under
    "schema", llama-cpp-python's form) or {"type": "json_schema", "json_schema": {"schema":
    {...}}} (OpenAI's form); logits_processor a callable (input_ids, logits) -> logits or a list
    of them, llama-cpp-python's LogitsProcessorList."""
    if max_tokens is not None:
        max_tokens = int(_integer(max_tokens, "max_tokens", -(2**62)))
        if max_tokens <= 0:
            max_tokens = None
    V = model.config.vocab_size
    sampler: Dict[str, Any] = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                   presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                   logit_bias=logit_bias)
    checked = Sampler(**sampler, seed=seed, vocab_size=V)           # checks them all
    sampler["logit_bias"] = checked.logit_bias
    stop_ids, stop_texts = stop_list(stop, V)
    if logprobs is not None:
        if isinstance(logprobs, bool):
            logprobs = 0 if logprobs else None
        else:
            logprobs = _integer(logprobs, "logprobs", 0, MAX_TOP_LOGPROBS)
    n = _integer(n, "n", 1, 128)
    if logits_processor is None:
        processors: List[LogitsProcessor] = []
    elif callable(logits_processor):
        processors = [logits_processor]
    elif isinstance(logits_processor, (list, tuple)) and all(map(callable, logits_processor)):
        processors = list(logits_processor)
    else:
        raise TypeError(f"logits_processor: expected a callable (input_ids, logits) -> logits "
                        f"or a list of them, got {type(logits_processor).__name__}")
    return Settings(max_tokens=max_tokens, sampler=sampler, seed=checked.seed,
                    stop_ids=stop_ids, stop_texts=stop_texts, logprobs=logprobs,
                    grammar=grammar_of(model, response_format), processors=processors, n=n)


# ---- structured output (llguidance) -----------------------------------------------------------

def grammar_of(model: Any, response_format: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The llguidance grammar of a response_format (None: unconstrained), checked against the
    model's vocabulary: a ValueError naming response_format for anything llguidance refuses."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise TypeError(f"response_format: expected a mapping such as {{'type': "
                        f"'json_object'}}, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {"type": "object"})
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise ValueError("response_format: type 'json_schema' needs "
                             "{'json_schema': {'name': ..., 'schema': {...}}}")
        schema = spec["schema"]
    else:
        raise ValueError(f"response_format: expected type 'text', 'json_object' or "
                         f"'json_schema', got {kind!r}")
    if not isinstance(schema, (Mapping, bool)):
        raise TypeError(f"response_format: expected the JSON schema as an object, got "
                        f"{type(schema).__name__}")
    llg = _llguidance()
    try:
        grammar: str = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ValueError(f"response_format: the JSON schema is refused: {exc}") from None
    error = llg.LLMatcher.validate_grammar(grammar, llg_tokenizer(model))
    if error and not error.startswith("WARNING"):
        raise ValueError(f"response_format: the JSON schema is refused: {error}")
    return grammar


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise ImportError("response_format needs the 'llguidance' package: pip install "
                          "llguidance  (or pip install 'megafuse[serve]')") from exc
    return llguidance


def llg_tokenizer(model: Any) -> Any:
    """llguidance's view of the model's vocabulary (built once a model): each token's
    bytes (special tokens marked by a 0xFF byte, as llguidance expects), the
    end-of-generation ids as its EOS set, and megafuse's own encoder."""
    cached = getattr(model, "_llg_tokenizer", None)
    if cached is None:
        cached = model._llg_tokenizer = _build_llg_tokenizer(model.tokenizer)
    return cached


def _build_llg_tokenizer(tok: Any) -> Any:
    llg = _llguidance()

    class Vocabulary:
        """What llguidance.TokenizerWrapper reads of a tokenizer."""
        eos_token_id = tok.eos_id
        bos_token_id = tok.bos_id
        tokens = [(b"\xff" if i in tok._special_ids else b"") + tok.token_bytes(i)
                  for i in range(tok.vocab_size)]
        special_token_ids = sorted(tok._special_ids)

        def __call__(self, text: bytes) -> List[int]:
            ids: List[int] = tok.encode(text.decode("utf-8", errors="replace"),
                                        add_special=False, parse_special=False)
            return ids

    return llg.LLTokenizer(llg.TokenizerWrapper(Vocabulary()), n_vocab=tok.vocab_size,
                           eos_token=sorted(tok.eog_ids))


# ---- one choice's generation ------------------------------------------------------------------

@dataclasses.dataclass
class Delta:
    """What one step of a TextGeneration gives the client: the text that is now final (stop
    strings trimmed, a possible stop string's start held back), the sampled token's logprob
    entry, and the finish reason once it is done."""
    text: str
    token: Optional[int]
    logprob: Optional[Dict[str, Any]]
    finish_reason: Optional[str]


class TextGeneration:
    """One choice of one request, from its prompt's logits to its finish.

    ``step(logits)`` takes the logits [V] of the sequence's last token, samples the next one
    and returns a ``Delta``; while ``finish_reason`` is None, ``token`` is the id the caller
    runs next.  finish_reason: "stop" (an end-of-generation token, a stop string or id, the
    grammar complete) or "length" (max_tokens, or the cache full).  index: the choice (its
    seed is seed + index).  room: how many tokens the sequence's cache has left after the
    prompt."""

    def __init__(self, model: Any, prompt_ids: Seq[int], s: Settings, *, index: int = 0,
                 room: int) -> None:
        tok = model.tokenizer
        self.model = model
        self.index = index
        self.settings = s
        self.prompt_ids = [int(i) for i in prompt_ids]
        self.sampler = Sampler(**s.sampler, seed=None if s.seed is None else s.seed + index)
        self.matcher = None
        if s.grammar is not None:
            self.matcher = _llguidance().LLMatcher(llg_tokenizer(model), s.grammar)
            self._mask = np.full((model.config.vocab_size + 31) // 32, -1, dtype=np.int32)
        self.limit = room if s.max_tokens is None else min(s.max_tokens, room)
        self.eog = set(model.end_of_generation_ids())
        self._tok = tok
        self._decoder = tok.stream_decoder(skip_special=True, at_start=False)
        self._hold = max((len(t) for t in s.stop_texts), default=1) - 1
        self.history = list(self.prompt_ids)
        self.completion_ids: List[int] = []
        self.text = ""                          # the decoded completion so far
        self.released = 0                       # characters of it given out
        self.logprobs: List[Dict[str, Any]] = []
        self.finish_reason: Optional[str] = None
        self.token: Optional[int] = None        # the last sampled token, to run next
        self.trimmed = False                    # the text was cut at a stop string

    def step(self, logits: F32Array) -> Delta:
        if self.finish_reason is not None:
            raise RuntimeError("TextGeneration.step: the generation has finished")
        scores = np.array(logits, dtype=np.float32, copy=True)
        for processor in self.settings.processors:
            scores = _processed(processor, self.history, scores)
        scores = self.sampler.adjust(scores, self.history)
        if self.matcher is not None:
            self._apply_grammar(scores)
        token = self.sampler.choose(scores)
        trimmed = None
        entry = self._logprob(logits, token) if self.settings.logprobs is not None else None
        self.token = token
        if token in self.eog or token in self.settings.stop_ids:
            self.finish_reason = "stop"
        else:
            self.completion_ids.append(token)
            self.history.append(token)
            if self.matcher is not None and not self.matcher.consume_token(token):
                raise RuntimeError(f"llguidance refused token {token} it allowed: "
                                   f"{self.matcher.get_error()}")
            if entry is not None:
                entry["text_offset"] = len(self.text)
            self.text += self._decoder.push(token)
            if self._trim_stop():
                self.finish_reason = trimmed = "stop"
                self.trimmed = True
            elif self.matcher is not None and self.matcher.is_stopped():
                self.finish_reason = "stop"
            elif len(self.completion_ids) >= self.limit:
                self.finish_reason = "length"
        if entry is not None:
            self.logprobs.append(entry)
        if self.finish_reason is not None:
            if not trimmed:                      # (an unfinished UTF-8 sequence: U+FFFD)
                self.text += self._decoder.flush()
            end = len(self.text)
        else:
            end = max(self.released, len(self.text) - self._held_back())
        piece = self.text[self.released:end]
        self.released = end
        return Delta(piece, token, entry, self.finish_reason)

    def _apply_grammar(self, scores: F32Array) -> None:
        m = self._mask
        self.matcher.unsafe_compute_mask_ptr(m.ctypes.data, m.nbytes)  # type: ignore[union-attr]
        bits = np.unpackbits(m.view(np.uint8), bitorder="little")[:scores.size]
        scores[bits == 0] = -np.inf

    def _trim_stop(self) -> bool:
        """Cut the text at the first stop string that it now contains (True if one)."""
        texts = self.settings.stop_texts
        if not texts:
            return False
        start = max(0, self.released - self._hold)
        cuts = [i for i in (self.text.find(s, start) for s in texts) if i >= 0]
        if not cuts:
            return False
        self.text = self.text[:min(cuts)]
        return True

    def _held_back(self) -> int:
        """Characters at the end of the text that may begin a stop string (not released)."""
        for k in range(min(self._hold, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.settings.stop_texts):
                return k
        return 0

    def _logprob(self, logits: F32Array, token: int) -> Dict[str, Any]:
        """The sampled token's log-probability under the model's distribution and the
        ``logprobs`` most likely alternatives."""
        lp = log_softmax(logits)
        k = self.settings.logprobs or 0
        top = np.argsort(-lp, kind="stable")[:k] if k else np.empty(0, dtype=np.intp)
        return {"token": token, "logprob": float(lp[token]),
                "top": [(int(i), float(lp[i])) for i in top], "text_offset": len(self.text)}

    def finished_text(self) -> str:
        return self.text

    def piece(self, token: int) -> bytes:
        return bytes(self._tok.token_bytes(token))


def _processed(processor: LogitsProcessor, history: List[int], scores: F32Array) -> F32Array:
    out = processor(np.asarray(history, dtype=np.intc), scores)
    arr = np.asarray(out)
    if arr.shape != scores.shape or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"logits_processor: expected it to return float logits of shape "
                         f"{scores.shape}, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


# ---- response dicts ---------------------------------------------------------------------------

def _token_text(gen: TextGeneration, token: int) -> str:
    return gen.piece(token).decode("utf-8", errors="replace")


def completion_logprobs(gen: TextGeneration, entries: List[Dict[str, Any]],
                        text_len: Optional[int] = None) -> Dict[str, Any]:
    """llama-cpp-python's (OpenAI's legacy) completion logprobs of these entries; text_len:
    drop the entries past it (a trimmed stop string)."""
    keep = [e for e in entries if text_len is None or e["text_offset"] < text_len]
    return {"tokens": [_token_text(gen, e["token"]) for e in keep],
            "text_offset": [e["text_offset"] for e in keep],
            "token_logprobs": [e["logprob"] for e in keep],
            "top_logprobs": [{_token_text(gen, i): v for i, v in e["top"]} for e in keep]}


def chat_logprobs(gen: TextGeneration, entries: List[Dict[str, Any]],
                  text_len: Optional[int] = None) -> Dict[str, Any]:
    """OpenAI's chat logprobs ({"content": [{"token", "logprob", "bytes", "top_logprobs"}]})."""
    def item(token: int, logprob: float) -> Dict[str, Any]:
        return {"token": _token_text(gen, token), "logprob": logprob,
                "bytes": list(gen.piece(token))}
    keep = [e for e in entries if text_len is None or e["text_offset"] < text_len]
    return {"content": [dict(item(e["token"], e["logprob"]),
                             top_logprobs=[item(i, v) for i, v in e["top"]]) for e in keep]}


def _usage(prompt: int, completion: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def completion_chunk(rid: str, created: int, model_name: str, gen: TextGeneration,
                     delta: Delta) -> Dict[str, Any]:
    """A ``text_completion`` stream chunk of one step."""
    lp = None
    if delta.logprob is not None:
        lp = completion_logprobs(gen, [delta.logprob])
    return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
            "choices": [{"text": delta.text, "index": gen.index, "logprobs": lp,
                         "finish_reason": delta.finish_reason}]}


def chat_chunk(rid: str, created: int, model_name: str, index: int,
               delta: Dict[str, Any], finish_reason: Optional[str],
               logprobs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A ``chat.completion.chunk``."""
    return {"id": rid, "object": "chat.completion.chunk", "created": created,
            "model": model_name, "choices": [{"index": index, "delta": delta,
                                              "logprobs": logprobs,
                                              "finish_reason": finish_reason}]}


def chat_stream_chunks(rid: str, created: int, model_name: str, gen: TextGeneration,
                       delta: Delta, first: bool) -> List[Dict[str, Any]]:
    """The chat chunks of one step: the role first, then content, then the finish."""
    out = []
    if first:
        out.append(chat_chunk(rid, created, model_name, gen.index,
                              {"role": "assistant", "content": ""}, None))
    lp = chat_logprobs(gen, [delta.logprob]) if delta.logprob is not None else None
    if delta.text or lp is not None:
        out.append(chat_chunk(rid, created, model_name, gen.index, {"content": delta.text},
                              None, lp))
    if delta.finish_reason is not None:
        out.append(chat_chunk(rid, created, model_name, gen.index, {}, delta.finish_reason))
    return out


def completion_response(rid: str, created: int, model_name: str,
                        gens: List[TextGeneration], prompt_tokens: int) -> Dict[str, Any]:
    choices = []
    for g in gens:
        lp = None
        if g.settings.logprobs is not None:
            lp = completion_logprobs(g, g.logprobs, len(g.text) if g.trimmed else None)
        choices.append({"text": g.text, "index": g.index, "logprobs": lp,
                        "finish_reason": g.finish_reason})
    return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
            "choices": choices,
            "usage": _usage(prompt_tokens, sum(len(g.completion_ids) for g in gens))}


def chat_response(rid: str, created: int, model_name: str, gens: List[TextGeneration],
                  prompt_tokens: int) -> Dict[str, Any]:
    choices = []
    for g in gens:
        lp = None
        if g.settings.logprobs is not None:
            lp = chat_logprobs(g, g.logprobs, len(g.text) if g.trimmed else None)
        choices.append({"index": g.index, "message": {"role": "assistant", "content": g.text},
                        "logprobs": lp, "finish_reason": g.finish_reason})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model_name,
            "choices": choices,
            "usage": _usage(prompt_tokens, sum(len(g.completion_ids) for g in gens))}


# ---- prompts ----------------------------------------------------------------------------------

def prompt_ids(model: Any, prompt: Any, capacity: int) -> List[int]:
    """A prompt (a string, or a list of token ids) as ids, with room for one new token in a
    cache of `capacity` positions: else a ValueError naming prompt."""
    ids: List[int]
    if isinstance(prompt, str):
        ids = model.tokenizer.encode(prompt)
        if not ids:
            raise ValueError("prompt: expected a non-empty text (it has no tokens)")
    elif isinstance(prompt, (list, tuple, np.ndarray)) and len(prompt) and \
            all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in prompt):
        ids = [int(i) for i in prompt]
        V = model.config.vocab_size
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise ValueError(f"prompt: expected token ids in 0..{V - 1}, got {bad[0]}")
    else:
        raise TypeError(f"prompt: expected a string or a non-empty list of token ids, got "
                        f"{type(prompt).__name__}")
    check_room(len(ids), capacity, "prompt")
    return ids


def check_room(tokens: int, capacity: int, what: str) -> None:
    if tokens >= capacity:
        raise ValueError(f"{what}: {tokens} tokens leave no room for a new token in the "
                         f"context of {capacity} positions")


def chat_prompt_ids(model: Any, messages: Any, capacity: int) -> List[int]:
    """The conversation in the model's chat template, ready for the assistant's turn."""
    return prompt_ids(model, model.tokenizer.apply_chat_template(
        check_messages(messages), add_generation_prompt=True), capacity)


def check_messages(messages: Any) -> List[Dict[str, Any]]:
    """OpenAI's messages as the chat template takes them: a list of {"role", "content"} where
    content is a string, None, or a list of {"type": "text", "text": ...} parts (joined)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(f"messages: expected a non-empty list of {{'role', 'content'}} "
                        f"mappings, got {type(messages).__name__}"
                        f"{' (empty)' if isinstance(messages, (list, tuple)) else ''}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TypeError(f"messages[{i}]: expected a mapping with a string 'role'")
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text" or \
                        not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}].content[{j}]: expected a text part "
                                     f"{{'type': 'text', 'text': ...}} (this model takes text "
                                     f"only)")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise TypeError(f"messages[{i}].content: expected a string, got "
                            f"{type(content).__name__}")
        out.append(dict(m, content=content if content is not None else ""))
    return out


# ---- the synchronous API ----------------------------------------------------------------------

def _sequence(target: Any) -> Sequence:
    if isinstance(target, Sequence):
        return target
    seq = getattr(target, "default_sequence", None)
    if not isinstance(seq, Sequence):
        raise TypeError(f"expected a megafuse Model or Sequence, got {type(target).__name__}")
    return seq


def _model_name(model: Any, name: Optional[str]) -> str:
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"model: expected a string, got {type(name).__name__}")
        return name
    return str(model.config.name or model.config.architecture)


def _generations(seq: Sequence, ids: List[int], s: Settings) -> Iterator[Tuple[TextGeneration,
                                                                              Delta]]:
    """Run the request's choices one after the other on seq: the prompt once (with prefix
    reuse), then each choice from the prompt's end."""
    owner = object()
    if getattr(seq, "_text_owner", None) is not None:
        raise RuntimeError("the sequence is in use by an unfinished stream (finish or close "
                           "it first)")
    seq._text_owner = owner   # type: ignore[attr-defined]
    try:
        first = seq.prefill(ids)
        P = len(ids)
        for index in range(s.n):
            seq.rewind(P)
            gen = TextGeneration(seq.model, ids, s, index=index,
                                 room=seq.cache_capacity - P)
            logits = first
            while True:
                delta = gen.step(logits)
                yield gen, delta
                if gen.finish_reason is not None:
                    break
                assert delta.token is not None
                logits = seq.forward([delta.token])
    finally:
        seq._text_owner = None   # type: ignore[attr-defined]


def create_completion(target: Any, prompt: Any, *,
                      stream: bool = False, model: Optional[str] = None,
                      **kwargs: Any) -> Any:
    """Complete `prompt` (a string or token ids) on a Model's sequence (or a Sequence):
    llama-cpp-python's ``Llama.create_completion``.  kwargs: ``settings()``'s (max_tokens 16,
    temperature 0.8, top_p 0.95, top_k 40, min_p 0.05 by default, as llama-cpp-python).
    Returns the ``text_completion`` dict, or with stream=True an iterator of its chunks."""
    seq = _sequence(target)
    s = settings(seq.model, **dict(COMPLETION_DEFAULTS, **kwargs))
    ids = prompt_ids(seq.model, prompt, seq.cache_capacity)
    name, rid, created = _model_name(seq.model, model), new_id("text"), int(time.time())
    if stream:
        return _stream_completion(seq, ids, s, rid, created, name)
    return completion_response(rid, created, name, _finished(seq, ids, s), len(ids))


def _finished(seq: Sequence, ids: List[int], s: Settings) -> List[TextGeneration]:
    """Every choice run to its end (not streamed), in the order of their indices."""
    gens: Dict[int, TextGeneration] = {}
    for gen, _ in _generations(seq, ids, s):
        gens[gen.index] = gen
    return [gens[i] for i in sorted(gens)]


def _stream_completion(seq: Sequence, ids: List[int], s: Settings, rid: str, created: int,
                       name: str) -> Iterator[Dict[str, Any]]:
    for gen, delta in _generations(seq, ids, s):
        yield completion_chunk(rid, created, name, gen, delta)


def create_chat_completion(target: Any, messages: Seq[Mapping[str, Any]], *,
                           stream: bool = False, model: Optional[str] = None,
                           logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None,
                           **kwargs: Any) -> Any:
    """Answer a conversation (OpenAI messages) on a Model's sequence (or a Sequence), in the
    model's chat template: llama-cpp-python's ``Llama.create_chat_completion``.  logprobs
    True adds the tokens' logprobs and top_logprobs (0..20) alternatives; other kwargs:
    ``settings()``'s (max_tokens None, temperature 0.2, top_p 0.95, top_k 40, min_p 0.05 by
    default, as llama-cpp-python).  Returns the ``chat.completion`` dict, or with stream=True
    an iterator of ``chat.completion.chunk`` dicts."""
    seq = _sequence(target)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise TypeError(f"logprobs: expected a bool, got {type(logprobs).__name__}")
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs: needs logprobs=True")
    k = (_integer(top_logprobs, "top_logprobs", 0, MAX_TOP_LOGPROBS)
         if top_logprobs is not None else 0) if logprobs else None
    s = settings(seq.model, **dict(CHAT_DEFAULTS, **kwargs), logprobs=k)
    ids = chat_prompt_ids(seq.model, messages, seq.cache_capacity)
    name, rid, created = _model_name(seq.model, model), new_id("chat"), int(time.time())
    if stream:
        return _stream_chat(seq, ids, s, rid, created, name)
    return chat_response(rid, created, name, _finished(seq, ids, s), len(ids))


def _stream_chat(seq: Sequence, ids: List[int], s: Settings, rid: str, created: int,
                 name: str) -> Iterator[Dict[str, Any]]:
    started: Set[int] = set()
    for gen, delta in _generations(seq, ids, s):
        yield from chat_stream_chunks(rid, created, name, gen, delta, gen.index not in started)
        started.add(gen.index)


# ---- embeddings -------------------------------------------------------------------------------

def pooled(rows_sum: npt.NDArray[np.float64], count: int) -> F32Array:
    """The mean of `count` rows (given their sum), L2-normalised."""
    mean = rows_sum / count
    norm = math.sqrt(float(np.dot(mean, mean)))
    out: F32Array = (mean / norm if norm > 0 else mean).astype(np.float32)
    return out


def embedding_ids(model: Any, text: Any, capacity: int) -> List[int]:
    """An embedding input (a string or token ids) as ids that fit a cache of capacity."""
    ids = prompt_ids(model, text, capacity + 1)          # (no new token: all of it may fit)
    return ids


def embed_on(seq: Sequence, ids: List[int]) -> F32Array:
    """The embedding of ids computed on seq (from position 0, in aligned chunks): the
    final-normed hidden states mean-pooled and L2-normalised, float32 [E]."""
    seq.reset()
    total = np.zeros(seq.model.config.embed_dim, dtype=np.float64)
    for start in range(0, len(ids), PREFILL_CHUNK):
        total += seq.normed_hidden(ids[start:start + PREFILL_CHUNK]).sum(axis=0, dtype=np.float64)
    seq.reset()
    return pooled(total, len(ids))


def _embedding_sequence(model: Any) -> Sequence:
    """The model's sequence for embeddings (made once): its conversation is left alone."""
    seq: Optional[Sequence] = getattr(model, "_embedding_sequence", None)
    if seq is None:
        seq = model._embedding_sequence = model.new_sequence()
    return seq


def embedding(target: Any, text: Union[str, List[int]]) -> F32Array:
    """The embedding of a text (``embed_on``) on the model's embedding sequence."""
    model = target.model if isinstance(target, Sequence) else target
    seq = _embedding_sequence(model)
    return embed_on(seq, embedding_ids(model, text, seq.cache_capacity))


def create_embedding(target: Any, input: Union[str, List[str], List[int], List[List[int]]], *,
                     model: Optional[str] = None) -> Dict[str, Any]:
    """OpenAI's embedding list (llama-cpp-python's ``create_embedding``) of one input or a
    list of them (strings or token-id lists)."""
    m = target.model if isinstance(target, Sequence) else target
    inputs = embedding_inputs(input)
    seq = _embedding_sequence(m)
    all_ids = [embedding_ids(m, text, seq.cache_capacity) for text in inputs]   # checked first
    vectors = [embed_on(seq, ids) for ids in all_ids]
    tokens = sum(len(ids) for ids in all_ids)
    return {"object": "list", "model": _model_name(m, model),
            "data": [{"object": "embedding", "embedding": v.tolist(), "index": i}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def embedding_inputs(input: Any) -> List[Any]:
    """input as a list of single inputs (strings or token-id lists)."""
    if isinstance(input, str):
        return [input]
    if isinstance(input, (list, tuple)) and input:
        if all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in input):
            return [list(input)]
        if all(isinstance(i, (str, list, tuple)) for i in input):
            return list(input)
    raise TypeError(f"input: expected a string, a list of strings or token-id lists, got "
                    f"{type(input).__name__}")


__all__ = ["create_completion", "create_chat_completion", "create_embedding", "embedding",
           "TextGeneration", "Delta", "Settings", "settings", "grammar_of", "llg_tokenizer",
           "COMPLETION_DEFAULTS", "CHAT_DEFAULTS", "MAX_TOP_LOGPROBS"]
