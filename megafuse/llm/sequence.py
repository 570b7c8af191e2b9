"""megafuse.llm.sequence: one conversation's state on a model's weights.

    model = megafuse.Model.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    a, b = model.new_sequence(), model.new_sequence()    # one copy of the weights, two caches
    logits = a.forward(ids)

A ``Sequence`` owns a KV cache (every layer's k and v, ``[L, 2, G, C, D]`` in one arena), its
``position`` (the tokens in the cache) and the ids of those tokens.  It runs on the model's
weights through a ``ModelRunner`` of its own, which keeps pointers to the same weight arrays
(nothing is copied): N sequences cost one copy of the weights and N caches.  A ``Model`` is
itself a sequence's worth of state (``Model.forward`` is its default sequence's).

**Prompts run in aligned chunks.**  A prompt's tokens go through the model in chunks of
``PREFILL_CHUNK`` positions that start at multiples of it (128, the native step's token tile:
positions 0-127, 128-255, ..., then the rest).  Each chunk is then the same native call whatever
else ran before or beside it, so a prompt's logits never depend on what the sequence held
before, on how requests were batched, or on the thread count (docs/contract.md §7).

**Prefix reuse** (llama.cpp's ``cache_prompt``): ``prefill(prompt)`` keeps the leading whole
chunks the cache already holds for the same tokens, written by an earlier prompt's prefill, and
runs only the rest.  Only whole chunks are kept, and only prefill-written ones (not tokens
written by decode steps, whose float-mode rows differ in the last bits from a prefill's): a
reused prefix then holds exactly what a prefill from scratch writes, so reuse changes the time
to the first token and nothing else.

``rewind(position)`` truncates the sequence (the rows past it are overwritten later);
``save_state()`` / ``load_state()`` copy the cache rows and ids out and back.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, Optional, Set, Tuple, Union

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:                       # (model.py imports this module)
    from megafuse.llm.model import Model, TokenIds

F32Array = npt.NDArray[np.float32]

#: Prompt tokens run in chunks of this many positions, each starting at a multiple of it: the
#: native step's token tile (MF_STEP_TOKENS, include/megafuse/mf_model.h), so a chunk is one
#: step.  Prefix reuse keeps whole chunks.
PREFILL_CHUNK = 128


@dataclasses.dataclass(frozen=True)
class SequenceState:
    """A sequence's saved state (``Sequence.save_state``): the ids in its cache, their cache rows
    ``kv`` (a layer each: [2, G, position, D], k and v in the cache's dtype; a sliding-window
    layer's whole ring), and how many leading positions were written by aligned prefill chunks
    (what prefix reuse may keep).  ``model`` names the model it came from (its config and cache
    dtype): a state loads only into a sequence of a model of the same shape and dtype."""
    tokens: Tuple[int, ...]
    kv: Tuple[npt.NDArray[Any], ...]
    chunked: int
    model: Any

    @property
    def position(self) -> int:
        return len(self.tokens)


class Sequence:
    """One sequence (a conversation) on a model's weights: its own KV cache of
    ``cache_capacity`` positions, ``position``, ``tokens``.  Made by ``Model.new_sequence()``.

    - ``forward(token_ids, logits="last"|"all")`` appends tokens and returns logits;
      ``write(token_ids)`` appends them without computing logits;
    - ``prefill(prompt_ids)`` runs a prompt in aligned chunks, reusing the cached prefix, and
      returns the last token's logits; ``reusable_prefix(prompt_ids)`` says how much it keeps;
    - ``generate(...)`` as ``Model.generate``; ``last_hidden(token_ids)`` /
      ``normed_hidden(token_ids)`` the last layer's output before / after the final RMSNorm
      (embeddings pool the latter);
    - ``reset()``, ``rewind(position)``, ``save_state()``, ``load_state(state)``.

    Every mistake is a ValueError / TypeError raised before anything is written.  Not
    thread-safe: a sequence is used by one thread at a time (a second thread gets a
    RuntimeError); different sequences may run in different threads.

    ``max_sequences`` (private; the serving engine's): how many sequences this one's runner may
    lead in one batched call (``ModelRunner.forward_batch``).
    """

    def __init__(self, model: Model, cache_capacity: int, max_sequences: int = 1) -> None:
        import importlib
        from megafuse.kernels.dtype import kv_cache_dtype
        from megafuse.kernels.memory import map_zero_pages, zeros as huge_page_zeros
        from megafuse.llm.model import cache_capacity_arg, cache_rows, check_cache_memory
        runner: Any = importlib.import_module("megafuse.llm._runner")  # (private: not in stubs)
        cfg = model.config
        G, D = cfg.num_kv_heads, cfg.head_dim
        C = cache_capacity_arg(cache_capacity)
        if model.cache_capacity < C:
            raise ValueError(f"cache_capacity: expected at most the model's cache_capacity = "
                             f"{model.cache_capacity} (its RoPE tables' rows; load the model "
                             f"with a larger one), got {C}")
        self.model = model
        self.cache_capacity = C
        # Every layer's KV cache in one arena on 2 MiB pages (decode reads them whole), its pages
        # mapped here, as llama.cpp clears its cache at load: one 2 MiB-aligned mapping a cache
        # would take a whole huge page for each (60 x 2 MiB for SmolLM2's 60 caches of 48 KiB at
        # C = 64), and unmapped pages would make the first forward pay for mapping them.  A
        # sliding-window layer keeps only its window and one step's rows (a ring).
        self._rows = [cache_rows(C, int(spec.get("window", 0) or 0)) for spec in model._weights]
        self._windows = [int(spec.get("window", 0) or 0) for spec in model._weights]
        check_cache_memory(C, self._windows, G, D, kv_cache_dtype(model.kv_dtype), rope_tables=0)
        arena = huge_page_zeros(2 * G * D * sum(self._rows), kv_cache_dtype(model.kv_dtype))
        map_zero_pages(arena)                                     # [L x (k|v, G, rows, D)]
        self._arena = arena
        self._kv: List[Any] = []                                  # [2, G, rows, D] a layer
        self._layers = []
        at = 0
        for spec, n in zip(model._weights, self._rows):
            kv = arena[at:at + 2 * G * n * D].reshape(2, G, n, D)
            at += 2 * G * n * D
            own = dict(spec)                    # the same weight arrays, this sequence's caches
            own["k_cache"], own["v_cache"] = kv[0], kv[1]          # [G, rows, D] each
            if own.get("rope_cos") is not None:                   # the tables' first C rows
                own["rope_cos"], own["rope_sin"] = own["rope_cos"][:C], own["rope_sin"][:C]
            self._kv.append(kv)
            self._layers.append(own)
        args = dict(model._runner_args, cache_capacity=C)
        if args.get("rope_cos") is not None:
            args["rope_cos"], args["rope_sin"] = args["rope_cos"][:C], args["rope_sin"][:C]
        self._runner = runner.ModelRunner(layers=self._layers, max_sequences=max_sequences,
                                          **args)
        self._position = 0
        self._high = 0           # positions 0.._high-1 were written since the last reset
        self._tokens = np.zeros(C, dtype=np.int32)    # [C]: the id at each cache position
        self._chunked = 0        # positions 0.._chunked-1 were written by aligned prefill chunks
        self._lock = threading.Lock()
        self.stop_reason: Optional[str] = None

    # ---- state ------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Tokens in the KV cache: the position of the next token."""
        return self._position

    @property
    def tokens(self) -> List[int]:
        """The ids of the tokens in the cache, positions 0..position-1."""
        return [int(t) for t in self._tokens[:self._position]]

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def kv_bytes(self) -> int:
        """Bytes of this sequence's KV cache."""
        return int(self._arena.nbytes)

    def reset(self) -> None:
        """Empty the KV cache (position 0).  Rows past ``position`` are always written before
        they are read, so nothing is cleared."""
        self.rewind(0)

    def rewind(self, position: int) -> None:
        """Truncate the sequence to its first `position` tokens (0..position): the next token
        goes to `position`.  The cache rows past it are overwritten later.  A model with
        sliding-window layers keeps only a ring of each such layer's window and one step: a
        position whose window has been overwritten since is a ValueError (``kept_from``)."""
        from megafuse.llm.sampling import _integer
        p = _integer(position, "position", 0, self._position)
        if 0 < p < self.kept_from:
            raise ValueError(f"position: the sliding-window layers' rings no longer hold the "
                             f"window before position {p} (they keep positions from "
                             f"{self.kept_from}); rewind to 0 or to at least {self.kept_from}")
        self._position = p
        if p == 0:
            self._high = 0
        self._chunked = min(self._chunked, p - p % PREFILL_CHUNK)

    @property
    def kept_from(self) -> int:
        """The lowest position > 0 this sequence can rewind to (0 without sliding-window
        layers): rewinding to p needs the window before p, which a ring of R rows keeps while
        p - window >= (the highest position written) - R."""
        low = 0
        for rows, window in zip(self._rows, self._windows):
            if window > 0 and rows < self.cache_capacity:
                low = max(low, self._high - rows + window)
        return low

    def save_state(self) -> SequenceState:
        """A copy of the sequence's state: the ids of positions 0..position-1 and their cache
        rows (a sliding-window layer's whole ring)."""
        P = self._position
        kv = tuple(kv[:, :, :P].copy() if rows == self.cache_capacity else kv.copy()
                   for kv, rows in zip(self._kv, self._rows))
        return SequenceState(tokens=tuple(self.tokens), kv=kv, chunked=self._chunked,
                             model=(self.model.config, self.model.kv_dtype))

    def load_state(self, state: SequenceState) -> None:
        """Make this sequence hold `state` (from ``save_state`` of a sequence of a model of the
        same shape and cache dtype -- this sequence's model or another copy of it -- and, with
        sliding-window layers, of the same cache_capacity)."""
        if not isinstance(state, SequenceState):
            raise TypeError(f"state: expected a SequenceState (from save_state()), got "
                            f"{type(state).__name__}")
        c = self.model.config
        if state.model != (c, self.model.kv_dtype):
            raise ValueError(f"state: saved from another model or cache dtype (this sequence "
                             f"is of {c.name or c.architecture!r}, {self.model.kv_dtype})")
        P = state.position
        if self.cache_capacity < P:
            raise ValueError(f"state: {P} positions do not fit in cache_capacity = "
                             f"{self.cache_capacity}")
        if len(state.kv) != len(self._rows):
            raise ValueError(f"state: {len(state.kv)} layers, this sequence has "
                             f"{len(self._rows)}")
        for l, (rows, saved) in enumerate(zip(self._rows, state.kv)):
            want = (2, c.num_kv_heads, P if rows == self.cache_capacity else rows, c.head_dim)
            if saved.shape != want:
                raise ValueError(f"state: layer {l}'s rows are {saved.shape}, this sequence "
                                 f"takes {want} (a sliding-window layer's ring: save and load "
                                 f"between sequences of the same cache_capacity)")
        for kv, saved in zip(self._kv, state.kv):
            kv[:, :, :saved.shape[2]] = saved
        self._tokens[:P] = state.tokens
        self._position = self._high = P
        self._chunked = min(int(state.chunked), P - P % PREFILL_CHUNK)

    def __repr__(self) -> str:
        return f"Sequence(position={self._position}/{self.cache_capacity})"

    # ---- running ----------------------------------------------------------------------------

    def _check_room(self, tokens: int, what: str) -> None:
        if self._position + tokens > self.cache_capacity:
            raise ValueError(
                f"{what}: {tokens} token{'s' if tokens != 1 else ''} at position "
                f"{self._position} would need cache positions up to "
                f"{self._position + tokens - 1}, but cache_capacity is {self.cache_capacity} "
                f"(reset() or rewind() the sequence, or give it a larger cache_capacity); "
                f"nothing was written")

    def forward(self, token_ids: TokenIds, logits: str = "last") -> F32Array:
        """Append token_ids (at positions position .. position+T-1) to the cache and return
        float32 logits: [V] for the last token (logits="last") or [T, V] (logits="all").

        Only the rows asked for go through the output head.  Raises ValueError, with nothing
        written, for an id outside the vocabulary or more tokens than the cache has room for.
        """
        if logits not in ("last", "all"):
            raise ValueError(f"logits: expected 'last' or 'all', got {logits!r}")
        ids = self.model._ids(token_ids)
        T = int(ids.size)
        self._check_room(T, "forward")
        out = np.empty((T, self.vocab_size) if logits == "all" else self.vocab_size,
                       dtype=np.float32)
        self._run(ids, logits=out, all_logits=logits == "all")
        return out

    def write(self, token_ids: TokenIds) -> None:
        """Append token_ids to the cache without computing logits (the head is skipped)."""
        ids = self.model._ids(token_ids)
        self._check_room(int(ids.size), "write")
        self._run(ids)

    def hidden_states(self, token_ids: TokenIds) -> F32Array:
        """Append token_ids to the cache like ``forward``, and return every layer's output
        float32 [L, T, E] (the residual stream after each layer; no logits)."""
        ids = self.model._ids(token_ids)
        T = int(ids.size)
        self._check_room(T, "hidden_states")
        c = self.model.config
        hidden = np.empty((c.n_layers, T, c.embed_dim), dtype=np.float32)
        self._run(ids, hidden=hidden)
        return hidden

    def last_hidden(self, token_ids: TokenIds) -> F32Array:
        """Append token_ids to the cache and return the last layer's output, float32 [T, E]
        (before the final RMSNorm; no logits)."""
        ids = self.model._ids(token_ids)
        T = int(ids.size)
        self._check_room(T, "last_hidden")
        x = np.empty((T, self.model.config.embed_dim), dtype=np.float32)
        self._run(ids, x_out=x)
        return x

    def normed_hidden(self, token_ids: TokenIds) -> F32Array:
        """Append token_ids to the cache and return the last layer's output after the final
        RMSNorm, float32 [T, E]: the rows the output head reads (transformers'
        ``last_hidden_state``; what embeddings pool)."""
        return self.model.final_norm(self.last_hidden(token_ids))

    def _run(self, ids: npt.NDArray[np.int32], **outputs: Any) -> None:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("Sequence: already running in another thread (a sequence is "
                               "used by one thread at a time)")
        try:
            self._runner.forward(tokens=ids, start_pos=self._position, **outputs)
            self._record(ids)
        finally:
            self._lock.release()

    def _record(self, ids: npt.NDArray[np.int32]) -> None:
        """Note that ids were just written to the cache at ``position`` (by this sequence's
        runner, or by a batched step that wrote this sequence's cache rows): the ids, the new
        position, and the aligned prefill chunks prefix reuse may keep."""
        start, T = self._position, int(ids.size)
        self._tokens[start:start + T] = ids
        self._position = start + T
        # The native step runs T tokens as steps of PREFILL_CHUNK from `start`: from the end of
        # the chunked prefix, its whole steps are aligned prefill chunks.
        if start == self._chunked:
            self._chunked = start + T - T % PREFILL_CHUNK

    # ---- prompts ----------------------------------------------------------------------------

    def reusable_prefix(self, prompt_ids: TokenIds) -> int:
        """How many leading tokens of prompt_ids ``prefill`` keeps from the cache: the common
        prefix with the cached ids, cut to the whole aligned prefill chunks the cache holds,
        and short of the last token (whose logits are wanted).  A multiple of PREFILL_CHUNK."""
        ids = self.model._ids(prompt_ids, "prompt_ids")
        n = min(self._chunked, int(ids.size) - 1)
        if n <= 0:
            return 0
        differ = np.flatnonzero(self._tokens[:n] != ids[:n])
        common = int(differ[0]) if differ.size else n
        keep = common - common % PREFILL_CHUNK
        return keep if keep >= self.kept_from else 0

    def prefill(self, prompt_ids: TokenIds) -> F32Array:
        """Make the sequence hold exactly prompt_ids and return the last token's logits [V]:
        the reusable prefix is kept (``reusable_prefix``), the rest runs in aligned chunks.
        Checked before anything is written (ids, room in the cache)."""
        ids = self.model._ids(prompt_ids, "prompt_ids")
        if ids.size > self.cache_capacity:
            raise ValueError(f"prompt_ids: {ids.size} tokens exceed cache_capacity = "
                             f"{self.cache_capacity} (give the sequence a larger cache, or "
                             f"shorten the prompt); nothing was written")
        keep = self.reusable_prefix(ids)
        self.rewind(keep)
        for start in range(keep, int(ids.size), PREFILL_CHUNK):
            chunk = ids[start:start + PREFILL_CHUNK]
            if start + PREFILL_CHUNK >= ids.size:
                return self.forward(chunk)
            self.write(chunk)
        raise AssertionError("unreachable: the last chunk returns")

    # ---- generation -------------------------------------------------------------------------

    def generate(self, prompt_ids: TokenIds, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, seed: Optional[int] = None,
                 stop: Union[None, str, Iterable[Union[int, str]]] = None) -> Iterator[int]:
        """Yield up to max_new_tokens new token ids, one at a time, after prompt_ids (appended
        to the cache at ``position``).  temperature 0 is greedy; otherwise top-k / top-p /
        min-p sampling (megafuse.llm.sampling), reproducible with a seed.

        stop: a string, or a list of strings and token ids.  Generation ends at an
        end-of-generation token of the file (not yielded), at a token id in `stop` (not
        yielded), when the decoded text of the generated tokens contains a string of `stop`
        (the token completing it is yielded), after max_new_tokens, or when the cache is full.
        ``stop_reason`` then says which: "eog", "stop", "length" or "context".  Every yielded
        token is in the cache when the generator ends (position = the prompt's end + the
        tokens yielded), so a conversation can go on from there.  Every argument and the
        prompt (ids, room in the cache) are checked before anything runs.
        """
        from megafuse.llm.sampling import Sampler, _integer
        n_new = _integer(max_new_tokens, "max_new_tokens", 0)
        sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=repeat_penalty, seed=seed)
        stop_ids, stop_texts = stop_list(stop, self.vocab_size)
        ids = self.model._ids(prompt_ids, "prompt_ids")
        self._check_room(int(ids.size), "generate")
        eog = set(self.model.end_of_generation_ids())
        decoder = self.model.tokenizer.stream_decoder(at_start=False) if stop_texts else None
        return self._generate(ids, n_new, sampler, eog, stop_ids, stop_texts, decoder)

    def _generate(self, ids: npt.NDArray[np.int32], n_new: int, sampler: Any, eog: Set[int],
                  stop_ids: Set[int], stop_texts: List[str], decoder: Any) -> Iterator[int]:
        self.stop_reason = None
        history = [int(i) for i in ids]
        if n_new == 0:
            self.stop_reason = "length"
            return
        logits = self.forward(ids)
        text = ""
        for count in range(n_new):
            token = sampler.sample(logits, history)
            if token in eog:
                self.stop_reason = "eog"
                return
            if token in stop_ids:
                self.stop_reason = "stop"
                return
            if self._position >= self.cache_capacity:     # no room to keep it
                self.stop_reason = "context"
                return
            history.append(token)
            hit = False
            if decoder is not None:
                text += decoder.push(token)
                hit = any(s in text for s in stop_texts)
            if hit or count + 1 == n_new:
                self.write([token])               # the last token goes into the cache too
                self.stop_reason = "stop" if hit else "length"
                yield token
                return
            yield token
            logits = self.forward([token])


def stop_list(stop: Any, vocab_size: int) -> Tuple[Set[int], List[str]]:
    """`stop` (None, a string, or a list / tuple of strings and token ids) as (ids, strings);
    anything else, an empty string or an id outside the vocabulary is a TypeError /
    ValueError naming stop."""
    if stop is None:
        return set(), []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"stop: expected a string or a list of strings and token ids, got "
                        f"{type(stop).__name__}")
    ids: Set[int] = set()
    texts: List[str] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise ValueError(f"stop[{i}]: expected a non-empty string (an empty string "
                                 f"would stop before the first token), got ''")
            texts.append(item)
        elif isinstance(item, bool) or not hasattr(item, "__index__"):
            raise TypeError(f"stop[{i}]: expected a string or a token id, got "
                            f"{type(item).__name__}")
        else:
            token = int(item.__index__())
            if not 0 <= token < vocab_size:
                raise ValueError(f"stop[{i}]: expected a token id in 0..{vocab_size - 1}, got "
                                 f"{token}")
            ids.add(token)
    return ids, texts


__all__ = ["Sequence", "SequenceState", "PREFILL_CHUNK", "stop_list"]
