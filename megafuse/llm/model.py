"""megafuse.llm.model: a whole decoder-only LLM from a GGUF file -- token ids in, logits out.

    model = megafuse.Model.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True)
    for token in model.generate(ids, 64):
        ...

The model is embedding -> L pre-norm decoder layers (an architecture of
megafuse.llm.arch: llama, qwen2, qwen3, phi3, gemma2, gemma3) -> final RMSNorm -> output
head (``output.weight``, or the token embedding itself when the file ties them), every matrix in
its own GGML format, run by one native call per ``forward`` (megafuse/kernels/levels/
model_step.pxi, through ``megafuse.llm._runner.ModelRunner``): no Python between layers, one team
of threads for the step.

Two accuracy modes:

- ``activations="int8"`` (default): llama.cpp's scheme.  The activations that meet a
  block-format weight are quantized (Q8_0 for the 32-weight formats, Q8_K for the K-quants) and
  the products are integer dot products;
- ``activations="float"``: float32 activations through every projection, attention and the MLP,
  with the weights dequantized in registers.  Each layer matches the float64 NumPy reference of
  ``megafuse.reference`` to 1e-4 (relative) on the same quantized weights.

A model's own state is one sequence: ``forward`` appends its tokens to the KV cache at
``position``; ``reset`` empties it.  ``new_sequence()`` makes more sequences on the same weights
(megafuse/llm/sequence.py), each with its own KV cache; the text API is
megafuse/llm/completion.py.  Every mistake (a token id outside the vocabulary, a prompt longer
than the cache, a full cache) is a ValueError raised before anything is written: the model stays
usable.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set,
                    Tuple, Union)

import numpy as np
import numpy.typing as npt

from megafuse.kernels.dtype import CKDataType, kv_cache_dtype
from megafuse.llm import arch as _arch

if TYPE_CHECKING:
    from megafuse.llm.sequence import Sequence as _Sequence, SequenceState

F32Array = npt.NDArray[np.float32]
TokenIds = Union[Sequence[int], npt.NDArray[np.integer]]

_ACTIVATIONS = ("int8", "float")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters of a model (from the GGUF metadata), and the layer features of its
    architecture (megafuse.llm.arch)."""
    architecture: str              # general.architecture: a row of megafuse.llm.arch
    n_layers: int
    embed_dim: int                 # E
    num_heads: int                 # H
    num_kv_heads: int              # G
    head_dim: int                  # D
    intermediate_dim: int          # I (the FFN's)
    vocab_size: int                # V
    context_length: int            # what the model was trained for (0: not in the file)
    eps: float                     # RMSNorm epsilon
    rope_theta: float
    rope_position_scale: float     # linear RoPE scaling (1.0: none)
    has_rope_freqs: bool           # Llama 3's per-frequency factors (rope_freqs.weight)
    tied_embedding: bool           # the head is the token embedding
    name: str = ""                 # general.name
    embed_scale: float = 1.0       # the embedding rows are multiplied by it (Gemma: sqrt(E))
    attn_scale: float = 0.0        # the scores' scale (0: 1/sqrt(head_dim))
    attn_softcap: float = 0.0      # scores capped at softcap * tanh(s / softcap) (0: not)
    final_softcap: float = 0.0     # logits capped the same way (0: not)
    gate: str = "silu"             # the MLP gate's activation: "silu" or "gelu_tanh"
    sliding_window: int = 0        # the window of sliding-window layers (0: none)
    window_layers: Tuple[bool, ...] = ()   # which layers attend over the window (empty: none)
    rope_theta_swa: float = 0.0    # the RoPE base of the windowed layers (0: rope_theta)
    rope_yarn: Optional[Tuple[float, int, float, float]] = None   # YaRN (factor, original
                                   # context, beta_fast, beta_slow), or None
    rope_attn_factor: float = 1.0  # the RoPE tables' magnitude (LongRoPE's attn_factor)

    def features(self) -> Dict[str, Any]:
        """The model-wide features as ModelRunner and megafuse.reference take them."""
        return {"embed_scale": self.embed_scale,
                "attn_scale": self.attn_scale or 1.0 / float(np.sqrt(np.float32(self.head_dim))),
                "attn_softcap": self.attn_softcap, "final_softcap": self.final_softcap,
                "gate": self.gate}


def cache_rows(cache_capacity: int, window: int) -> int:
    """Rows of a layer's KV cache: cache_capacity, or for a sliding-window layer a ring of its
    window and one native step's tokens (fewer when that is less than cache_capacity):
    position p lives in row p % rows, and the rows a step writes never overwrite a key it still
    reads."""
    import importlib
    runner: Any = importlib.import_module("megafuse.llm._runner")
    if window <= 0:
        return cache_capacity
    return int(min(cache_capacity, window + runner.STEP_TOKENS))


#: The most positions a KV cache holds: the step's positions are C ints.
MAX_CACHE_CAPACITY = 2**31 - 1
#: cache_capacity when the file gives no context length, and the most the default takes.
DEFAULT_CACHE_CAPACITY = 4096


def cache_capacity_arg(value: Any) -> int:
    """cache_capacity checked: an integer (a bool, a float -- 1.5 is not 1 --, a string:
    TypeError naming it) >= 1 (ValueError).  Its upper bound depends on the model: see
    check_cache_memory."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        from megafuse.llm.metadata_values import describe
        raise TypeError(f"cache_capacity: expected an int, got {describe(value)}")
    C = int(value.__index__())
    if C < 1:
        raise ValueError(f"cache_capacity: expected a positive value, got {C}")
    return C


def default_cache_capacity(context_length: int) -> int:
    """The cache_capacity of a model loaded without one: its context length (what it was
    trained for), at most DEFAULT_CACHE_CAPACITY; DEFAULT_CACHE_CAPACITY when the file gives
    none (0)."""
    if context_length > 0:
        return min(int(context_length), DEFAULT_CACHE_CAPACITY)
    return DEFAULT_CACHE_CAPACITY


def warn_past_context(cache_capacity: int, context_length: int, stacklevel: int = 3) -> None:
    """A cache larger than the context the model was trained for is allowed, as llama.cpp
    allows it ("possible training context overflow"), with a warning: positions past it are
    outside what the model has seen."""
    if 0 < context_length < cache_capacity:
        warnings.warn(f"cache_capacity = {cache_capacity} is more than the model's "
                      f"context_length = {context_length}: positions past it are outside what "
                      f"the model was trained on", RuntimeWarning, stacklevel=stacklevel)


def machine_memory() -> Optional[int]:
    """Bytes of memory this process can have: the machine's physical memory
    (SC_PHYS_PAGES x SC_PAGE_SIZE), or its cgroup's limit when that is lower; None where
    neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    positive = [n for n in limits if n > 0]
    return min(positive) if positive else None


def cache_bytes(cache_capacity: int, windows: Sequence[int], num_kv_heads: int, head_dim: int,
                kv_dtype: str, rope_tables: int) -> Tuple[int, int]:
    """(bytes of the KV caches, bytes of the RoPE tables) at cache_capacity: k and v
    [G, rows, D] of kv_dtype a layer (windows: each layer's sliding window, 0 for none: its
    rows, ``cache_rows``), and rope_tables pairs of cos / sin float32 [C, D/2]."""
    itemsize = 2 if kv_dtype == "float16" else 4
    rows = sum(cache_rows(cache_capacity, int(w)) for w in windows)
    return (2 * num_kv_heads * head_dim * itemsize * rows,
            rope_tables * 2 * cache_capacity * (head_dim // 2) * 4)


def check_cache_memory(cache_capacity: int, windows: Sequence[int], num_kv_heads: int,
                       head_dim: int, kv_dtype: str, rope_tables: int) -> None:
    """A ValueError naming cache_capacity, before anything is allocated, when the KV caches
    and RoPE tables it needs (``cache_bytes``) do not fit in the machine's memory
    (``machine_memory``), or when it is past MAX_CACHE_CAPACITY."""
    kv, rope = cache_bytes(cache_capacity, windows, num_kv_heads, head_dim, kv_dtype,
                           rope_tables)
    have = machine_memory()
    if have is not None and kv + rope > have:
        raise ValueError(f"cache_capacity = {cache_capacity}: the KV caches ({kv} bytes) and "
                         f"the RoPE tables ({rope} bytes) would need {kv + rope} bytes "
                         f"({(kv + rope) / 2**30:.4g} GiB), more than this machine's memory "
                         f"({have} bytes, {have / 2**30:.4g} GiB)")
    if cache_capacity > MAX_CACHE_CAPACITY:
        raise ValueError(f"cache_capacity = {cache_capacity}: at most {MAX_CACHE_CAPACITY} "
                         f"positions (the step's positions are C ints); the caches would need "
                         f"{kv + rope} bytes")


def _pack_weights(layers: List[Dict[str, Any]], head: Any) -> Any:
    """Copy every layer's matrices (in the order a step reads them), then the output head, into
    one read-only arena on 2 MiB pages (``megafuse.empty``), each at a 64-byte boundary; the
    layer specs then hold views of it.  Returns the head's view.

    Why: a decode step streams every weight byte from DRAM once.  From the file's mmap (4 KiB
    page-cache pages, tensors in the file's order) the reads cross a page every 4 KiB, and the
    prefetch that runs ahead of one matrix's rows lands in whatever tensor the file puts next.
    On 2 MiB pages in step order, it lands in the next matrix the step reads."""
    from megafuse.kernels.memory import empty
    order: List[Tuple[Optional[Dict[str, Any]], str]] = [
        (spec, name) for spec in layers for name in _arch.MATRIX_ROLES]
    order.append((None, "head"))

    def source(spec: Optional[Dict[str, Any]], name: str) -> Any:
        return head if spec is None else spec[name]

    def padded(nbytes: int) -> int:
        return -(-nbytes // 64) * 64

    arena = empty(sum(padded(source(s, n).nbytes) for s, n in order), np.uint8)   # [bytes]
    offset = 0
    packed_head = head
    for spec, name in order:
        a = source(spec, name)
        view = arena[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)   # a's shape
        view[...] = a
        view.flags.writeable = False
        if spec is None:
            packed_head = view
        else:
            spec[name] = view
        offset += padded(a.nbytes)
    return packed_head


class Model:
    """A decoder-only LLM (an architecture of megafuse.llm.arch) on megafuse's kernels.  Build
    it with :meth:`from_gguf`.

    - ``forward(token_ids, logits="last"|"all")`` appends the tokens to the cache and returns
      float32 logits: [V] for the last token, or [T, V] for every token;
    - ``generate(prompt_ids, max_new_tokens, ...)`` yields new token ids one at a time;
    - ``create_completion(prompt, ...)`` / ``create_chat_completion(messages, ...)``: text in,
      llama-cpp-python's response dicts out (``megafuse.llm.completion``);
    - ``new_sequence()``: another sequence (its own KV cache) on the same weights;
    - ``reset()``, ``rewind(position)``, ``save_state()`` / ``load_state()``, ``position``
      (tokens in the cache), ``cache_capacity``, ``vocab_size``, ``config``, ``tokenizer``
      (``megafuse.Tokenizer``, from the same file), ``activations``, ``kv_dtype``.

    The model's own state is one sequence (``default_sequence``, a
    ``megafuse.llm.sequence.Sequence``): ``forward``, ``generate`` and the rest run on it.

    ``kv_dtype`` is what the KV caches hold: "float32" (the default: k and v as computed) or
    "float16" (k and v rounded to float16 as they are written, as llama.cpp's default F16
    cache does: half the cache's memory, and half the bytes a decode step reads from it --
    what decode costs late in a long context; head_dim <= 256).

    A sequence is used by one thread at a time; different sequences may run in different
    threads.  The kernels use ``megafuse.get_num_threads()`` threads.
    """

    def __init__(self, *, config: ModelConfig, layers: List[Dict[str, Any]],
                 embedding: npt.NDArray[Any], embedding_dt: CKDataType,
                 out_norm: F32Array, head: npt.NDArray[Any], head_dt: CKDataType,
                 rope_cos: Optional[F32Array], rope_sin: Optional[F32Array],
                 cache_capacity: int, activations: str = "int8", source: Any = None,
                 rope_freq_factors: Optional[F32Array] = None,
                 kv_dtype: str = "float32") -> None:
        if activations not in _ACTIVATIONS:
            raise ValueError(f"activations: expected 'int8' or 'float', got {activations!r}")
        cache_dtype = kv_cache_dtype(kv_dtype)
        cfg = config
        G, C, D = cfg.num_kv_heads, cache_capacity_arg(cache_capacity), cfg.head_dim
        windows = [int(spec.get("window", 0) or 0) for spec in layers]
        check_cache_memory(C, windows, G, D, cache_dtype, rope_tables=0)   # (tables: given)
        self.config = cfg
        self.activations = activations
        self.kv_dtype = str(kv_dtype)
        self._cache_capacity = C
        # the weights of each layer (no caches: every sequence adds its own)
        self._weights = [{k: v for k, v in spec.items() if not k.endswith("_cache")}
                         for spec in layers]
        self._embedding, self._embedding_dt = embedding, CKDataType(embedding_dt)
        self._head, self._head_dt = head, CKDataType(head_dt)
        self._out_norm = out_norm
        self.rope_cos, self.rope_sin = rope_cos, rope_sin
        self._rope_freq_factors = rope_freq_factors
        # what a runner of this model's weights takes beside its layers (their caches, its
        # cache_capacity and RoPE tables): every sequence's (megafuse.llm.sequence)
        cfg = config
        self._runner_args: Dict[str, Any] = dict(
            embed_dim=cfg.embed_dim, num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            intermediate_dim=cfg.intermediate_dim, cache_capacity=C, eps=cfg.eps,
            vocab_size=cfg.vocab_size, embedding=embedding, embedding_dt=int(embedding_dt),
            out_norm=out_norm, head=head, head_dt=int(head_dt), rope_cos=rope_cos,
            rope_sin=rope_sin, activations=activations, **cfg.features())
        self._source = source
        self._tokenizer: Any = None
        self._default: Optional[_Sequence] = None      # made on first use (default_sequence)
        from megafuse.llm.sequence import Sequence
        Sequence(self, 1)        # ModelRunner checks every array now, at load (a 1-row cache)

    # ---- sequences --------------------------------------------------------------------------

    def new_sequence(self, cache_capacity: Optional[int] = None) -> _Sequence:
        """A new, empty sequence on this model's weights (shared, not copied) with a KV cache
        of its own of cache_capacity positions (default: this model's cache_capacity)."""
        from megafuse.llm.sequence import Sequence
        return Sequence(self, self.cache_capacity if cache_capacity is None else cache_capacity)

    @property
    def default_sequence(self) -> _Sequence:
        """The sequence ``forward``, ``generate`` and the text API of the model run on (its
        KV cache is allocated on first use: a server that only makes sequences of its own
        never pays for it)."""
        if self._default is None:
            from megafuse.llm.sequence import Sequence
            self._default = Sequence(self, self._cache_capacity)
        return self._default

    @property
    def _seq(self) -> _Sequence:
        return self.default_sequence

    @property
    def _layers(self) -> List[Dict[str, Any]]:
        """The default sequence's layers: the weights and its caches."""
        return self.default_sequence._layers

    @property
    def _cache_arena(self) -> Any:
        """The default sequence's KV-cache arena."""
        return self.default_sequence._arena

    def final_norm(self, x: F32Array) -> F32Array:
        """The model's final RMSNorm of rows x [T, E] (float64 math, float32 out): what the
        output head reads."""
        x64 = np.asarray(x, dtype=np.float64)
        scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.config.eps)
        out: F32Array = (x64 * scale * self._out_norm).astype(np.float32)
        return out

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: Any, *, cache_capacity: Optional[int] = None,
                  activations: str = "int8", kv_dtype: str = "float32") -> Model:
        """The model of a GGUF file of an architecture of megafuse.llm.arch (any other is a
        NotImplementedError naming it).  path: a path, a ``megafuse.llm.gguf.GGUFFile`` or a
        ``gguf.GGUFReader``.  The whole file is checked first (``megafuse.llm.gguf.check_file``):
        a broken file is a ValueError naming the file and the key or tensor, a valid file
        megafuse cannot run a NotImplementedError, before anything is copied or allocated.
        Weights keep their GGML formats.  The layers' matrices and the output head are copied
        once into one arena on 2 MiB pages, in the order a step reads them (``_pack_weights``);
        an untied token embedding stays a read-only view of the file (a step reads only its
        tokens' rows).  ``megafuse.llm.gguf.layer_arrays`` already gives
        w1 as gate + up rows and llama's q / k rows in rotate-half order.  cache_capacity
        (positions of the KV cache, an integer) defaults to min(context length, 4096); one
        whose caches and RoPE tables the machine cannot hold is a ValueError naming it and the
        bytes (``check_cache_memory``), one past the context length a RuntimeWarning; kv_dtype
        ("float32" or "float16") is what the cache holds (see the class)."""
        from megafuse.llm import gguf as _gguf
        from megafuse.llm.layer import rope_tables
        if activations not in _ACTIVATIONS:
            raise ValueError(f"activations: expected 'int8' or 'float', got {activations!r}")
        kv_cache_dtype(kv_dtype)
        if cache_capacity is not None:
            cache_capacity_arg(cache_capacity)
        reader = _gguf.open_reader(path)
        # the whole file checked before anything is copied or allocated: ValueError naming the
        # file and the key or tensor if it is broken, NotImplementedError if megafuse cannot
        # run it (another architecture, a feature or a tensor type)
        hp = _gguf.check_file(reader)
        L = hp["block_count"]
        ctx = hp["context_length"]
        if cache_capacity is None:
            C = default_cache_capacity(ctx)
        else:
            C = cache_capacity_arg(cache_capacity)
        windows = [hp["sliding_window"] if w else 0 for w in hp["window_layers"]]
        pairs = {(hp["rope_theta_swa"], hp["rope_position_scale_swa"]) if w
                 else (hp["rope_theta"], hp["rope_position_scale"]) for w in hp["window_layers"]}
        check_cache_memory(C, windows, hp["num_kv_heads"], hp["head_dim"], kv_dtype,
                           rope_tables=len(pairs))
        warn_past_context(C, ctx)
        layers: List[Dict[str, Any]] = []
        freq_arrays: Dict[str, Any] = {}
        for index in range(L):
            arrays = _gguf.layer_arrays(reader, index)
            for key in ("num_heads", "num_kv_heads", "head_dim", "embed_dim"):
                if arrays[key] != hp[key]:
                    raise NotImplementedError(f"blk.{index}: {key} = {arrays[key]} differs from "
                                              f"layer 0's {hp[key]}: not supported")
            freq_arrays = arrays
            spec = {name: arrays[name] for name in _arch.NORM_ROLES + _arch.MATRIX_ROLES}
            for name in _arch.BIAS_ROLES + _arch.FEATURE_ROLES:
                spec[name] = arrays.get(name)
            for name in ("window", "rope_theta", "rope_position_scale"):
                spec[name] = arrays[name]
            for name, dt in arrays["dtypes"].items():
                spec[name + "_dt"] = int(dt)
            spec["intermediate_dim"] = arrays["intermediate_dim"]
            layers.append(spec)
        sizes = {spec.pop("intermediate_dim") for spec in layers}
        if len(sizes) != 1:
            raise NotImplementedError(f"feed_forward_length differs between layers "
                                      f"({sorted(sizes)}): not supported")
        E = hp["embed_dim"]
        own = _gguf.model_arrays(reader, {"E": E, "D": hp["head_dim"], "V": None})
        embedding, emb_dt = own["embedding"]
        V = int(embedding.shape[0])
        tied = own["head"] is None
        head, head_dt = (embedding, emb_dt) if tied else own["head"]
        out_norm = own["out_norm"]
        head = _pack_weights(layers, head)
        if tied:
            embedding = head                      # the tied embedding: the head's rows
        freq_factors = _gguf.rope_freq_factors(freq_arrays, C)
        tables: Dict[Tuple[float, float], Tuple[F32Array, F32Array]] = {}
        for spec in layers:                       # one pair of tables a RoPE base and scale
            theta, scale = spec["rope_theta"], spec["rope_position_scale"]
            if (theta, scale) not in tables:
                tables[theta, scale] = rope_tables(hp["head_dim"], C, theta,
                                                   freq_factors=freq_factors,
                                                   position_scale=scale, yarn=hp["rope_yarn"],
                                                   attn_factor=hp["rope_attn_factor"])
            spec["rope_cos"], spec["rope_sin"] = tables[theta, scale]
        cos, sin = tables.get((hp["rope_theta"], hp["rope_position_scale"]),
                              (layers[0]["rope_cos"], layers[0]["rope_sin"]))
        name = _gguf._field(reader, "general.name", "") or ""
        config = ModelConfig(
            architecture=hp["architecture"], n_layers=L, embed_dim=E, num_heads=hp["num_heads"],
            num_kv_heads=hp["num_kv_heads"], head_dim=hp["head_dim"],
            intermediate_dim=sizes.pop(), vocab_size=V, context_length=ctx, eps=hp["eps"],
            rope_theta=hp["rope_theta"], rope_position_scale=hp["rope_position_scale"],
            has_rope_freqs=freq_factors is not None, tied_embedding=tied, name=str(name),
            embed_scale=hp["embed_scale"], attn_scale=hp["attn_scale"],
            attn_softcap=hp["attn_softcap"], final_softcap=hp["final_softcap"], gate=hp["gate"],
            sliding_window=hp["sliding_window"], window_layers=tuple(hp["window_layers"]),
            rope_theta_swa=hp["rope_theta_swa"], rope_yarn=hp["rope_yarn"],
            rope_attn_factor=hp["rope_attn_factor"])
        return cls(config=config, layers=layers, embedding=embedding, embedding_dt=emb_dt,
                   out_norm=out_norm, head=head, head_dt=head_dt, rope_cos=cos, rope_sin=sin,
                   cache_capacity=C, activations=activations, source=reader,
                   rope_freq_factors=freq_factors, kv_dtype=kv_dtype)

    # ---- state (of the default sequence) -----------------------------------------------------

    @property
    def position(self) -> int:
        """Tokens in the KV cache: the position of the next token."""
        return self._seq.position

    @property
    def cache_capacity(self) -> int:
        """Positions of the default sequence's KV cache, and the most a new sequence may
        have (the RoPE tables' rows)."""
        return self._cache_capacity

    @property
    def tokens(self) -> List[int]:
        """The ids of the tokens in the cache (positions 0..position-1)."""
        return self._seq.tokens

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the last ``generate`` ended: "eog", "stop", "length" or "context"."""
        return self._seq.stop_reason

    @property
    def _runner(self) -> Any:
        return self._seq._runner

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def reset(self) -> None:
        """Empty the KV cache (position 0).  Rows past ``position`` are always written before
        they are read, so nothing is cleared."""
        self._seq.reset()

    def rewind(self, position: int) -> None:
        """Truncate the sequence to its first `position` tokens (``Sequence.rewind``)."""
        self._seq.rewind(position)

    def save_state(self) -> SequenceState:
        """A copy of the sequence's ids and cache rows (``Sequence.save_state``)."""
        return self._seq.save_state()

    def load_state(self, state: SequenceState) -> None:
        """Make the model's sequence hold a saved state (``Sequence.load_state``)."""
        self._seq.load_state(state)

    @property
    def tokenizer(self) -> Any:
        """The ``megafuse.Tokenizer`` of the GGUF file (needs the ``tokenizers`` package:
        pip install 'megafuse[llm]')."""
        if self._tokenizer is None:
            if self._source is None:
                raise ValueError("tokenizer: this model was not read from a GGUF file")
            from megafuse.llm.tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self._source)
        return self._tokenizer

    @property
    def formats(self) -> Dict[str, str]:
        """Weight formats and how many matrices use each ("Q4_1": 210, ...)."""
        counts: Dict[str, int] = {}
        for spec in self._weights:
            for name in _arch.MATRIX_ROLES:
                key = CKDataType(spec[name + "_dt"]).name
                counts[key] = counts.get(key, 0) + 1
        for dt in (self._embedding_dt,) + (() if self.config.tied_embedding else
                                           (self._head_dt,)):
            counts[dt.name] = counts.get(dt.name, 0) + 1
        return {k: str(v) for k, v in sorted(counts.items())}

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight of the model (what a decode step reads, but the embedding)."""
        total = sum(int(a.nbytes) for spec in self._weights for k, a in spec.items()
                    if isinstance(a, np.ndarray) and not k.endswith("_cache"))
        total += int(self._embedding.nbytes) + int(self._out_norm.nbytes)
        if not self.config.tied_embedding:
            total += int(self._head.nbytes)
        return total

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.name or c.architecture!r}, layers={c.n_layers}, embed_dim={c.embed_dim}"
                f", heads={c.num_heads}/{c.num_kv_heads}, vocab={c.vocab_size}, "
                f"activations={self.activations!r}, position={self.position}/"
                f"{self.cache_capacity})")

    # ---- running ----------------------------------------------------------------------------

    def _ids(self, token_ids: TokenIds, what: str = "token_ids") -> npt.NDArray[np.int32]:
        ids = np.asarray(token_ids)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1:
            raise ValueError(f"{what}: expected a sequence of token ids, got shape {ids.shape}")
        if ids.size == 0:
            raise ValueError(f"{what}: expected at least one token id, got none")
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"{what}: expected integer token ids, got dtype {ids.dtype}")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"{what}: expected token ids in 0..{self.vocab_size - 1}, got "
                             f"{lo if lo < 0 else hi}")
        return np.ascontiguousarray(ids, dtype=np.int32)

    def forward(self, token_ids: TokenIds, logits: str = "last") -> F32Array:
        """Append token_ids (at positions position .. position+T-1) to the cache and return
        float32 logits: [V] for the last token (logits="last") or [T, V] (logits="all").

        Only the rows asked for go through the output head.  Raises ValueError, with nothing
        written, for an id outside the vocabulary or more tokens than the cache has room for.
        """
        return self._seq.forward(token_ids, logits)

    def hidden_states(self, token_ids: TokenIds) -> F32Array:
        """Append token_ids to the cache like ``forward``, and return every layer's output
        float32 [L, T, E] (the residual stream after each layer; no logits)."""
        return self._seq.hidden_states(token_ids)

    def embed(self, token_ids: TokenIds) -> F32Array:
        """The embedding rows of token_ids, float32 [T, E] (only those rows are dequantized)."""
        import megafuse
        ids = self._ids(token_ids)
        rows = np.ascontiguousarray(self._embedding[ids])
        return megafuse.dequantize(rows, self._embedding_dt, (ids.size, self.config.embed_dim))

    # ---- generation -------------------------------------------------------------------------

    def end_of_generation_ids(self) -> Tuple[int, ...]:
        """The ids that end a generation: the tokenizer's end-of-generation set when the
        tokenizer can be built, else the file's eos / eot / eom ids (none for a file without a
        vocabulary)."""
        try:
            return tuple(sorted(self.tokenizer.eog_ids))
        except (ImportError, ValueError):       # no `tokenizers` package; no vocabulary
            pass
        from megafuse.llm import gguf as _gguf
        ids: Set[int] = set()
        for key in ("eos", "eot", "eom"):       # (not an integer >= 0: ValueError naming it)
            value = _gguf._int_field(self._source, f"tokenizer.ggml.{key}_token_id", None,
                                     minimum=0)
            if value is not None:
                ids.add(value)
        return tuple(sorted(ids))

    def generate(self, prompt_ids: TokenIds, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, seed: Optional[int] = None,
                 stop: Union[None, str, Iterable[Union[int, str]]] = None) -> Iterator[int]:
        """Yield up to max_new_tokens new token ids after prompt_ids, appended to the cache at
        ``position`` (``Sequence.generate``: greedy at temperature 0, else top-k / top-p /
        min-p sampling reproducible with a seed; `stop` a string or a list of strings and token
        ids; ``stop_reason`` says why it ended; every yielded token ends up in the cache)."""
        return self._seq.generate(prompt_ids, max_new_tokens, temperature=temperature,
                                  top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty, seed=seed, stop=stop)

    # ---- text -------------------------------------------------------------------------------

    def create_completion(self, prompt: Union[str, TokenIds], **kwargs: Any) -> Any:
        """Complete a text prompt: llama-cpp-python's ``create_completion`` (a response dict,
        or an iterator of chunk dicts with stream=True), on the model's sequence with prefix
        reuse.  Arguments: ``megafuse.llm.completion.create_completion``."""
        from megafuse.llm import completion
        return completion.create_completion(self, prompt, **kwargs)

    def create_chat_completion(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        """Answer a conversation: llama-cpp-python's ``create_chat_completion`` (OpenAI's
        chat.completion dict, or chunk dicts with stream=True).  Arguments:
        ``megafuse.llm.completion.create_chat_completion``."""
        from megafuse.llm import completion
        return completion.create_chat_completion(self, messages, **kwargs)

    def create_embedding(self, input: Any, **kwargs: Any) -> Any:
        """OpenAI's embedding list of a text or a list of texts (or token-id lists): each the
        final-normed hidden states of its tokens, mean-pooled and L2-normalised, computed on a
        sequence of its own (the model's conversation is left alone).  llama-cpp-python's
        ``create_embedding``; ``megafuse.llm.completion.create_embedding``."""
        from megafuse.llm import completion
        return completion.create_embedding(self, input, **kwargs)

    # ---- checking ---------------------------------------------------------------------------

    def reference(self, token_ids: TokenIds, *,
                  quantize_activations: Optional[bool] = None) -> Tuple[F32Array, F32Array]:
        """What ``forward(token_ids, logits="all")`` on an empty cache computes, by
        ``megafuse.reference.model_forward`` (plain NumPy, float64 math on the same weights):
        (logits [T, V], hidden [L, T, E]).  quantize_activations defaults to this model's mode
        (True: the int8 path's emulation); the reference's cache holds this model's kv_dtype.
        The model's own cache is not touched.  Slow: for checking, not for running."""
        import importlib
        ref: Any = importlib.import_module("megafuse.reference")
        ids = self._ids(token_ids)
        if ids.size > self.cache_capacity:
            raise ValueError(f"token_ids: {ids.size} tokens exceed cache_capacity = "
                             f"{self.cache_capacity}")
        if quantize_activations is None:
            quantize_activations = self.activations == "int8"
        c = self.config
        out: Tuple[F32Array, F32Array] = ref.model_forward(
            self._weights, self._embedding, int(self._embedding_dt), self._out_norm, self._head,
            int(self._head_dt), ids, c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_dim, c.vocab_size, c.eps, self.rope_cos, self.rope_sin,
            quantize_activations=bool(quantize_activations), kv_dtype=self.kv_dtype,
            **c.features())
        return out

    def layer(self, index: int, *, cache_capacity: Optional[int] = None) -> Any:
        """Layer `index` as a ``megafuse.DecoderLayer`` sharing this model's weights (its own,
        new KV cache) and activation mode: for checking a layer against
        ``megafuse.reference``."""
        from megafuse.llm.layer import DecoderLayer
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"index: expected an int, got {type(index).__name__}")
        if not 0 <= index < self.config.n_layers:
            raise ValueError(f"index: expected a layer in 0..{self.config.n_layers - 1}, got "
                             f"{index}")
        spec, cfg = self._weights[index], self.config
        kwargs: Dict[str, Any] = {name: spec.get(name) for name in _arch.NORM_ROLES
                                  + _arch.MATRIX_ROLES + _arch.BIAS_ROLES + _arch.FEATURE_ROLES}
        dtypes = {name: CKDataType(spec[name + "_dt"]) for name in _arch.MATRIX_ROLES}
        features = cfg.features()
        features.pop("embed_scale")
        features.pop("final_softcap")
        layer = DecoderLayer(**kwargs, dtypes=dtypes, embed_dim=cfg.embed_dim,
                             num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                             head_dim=cfg.head_dim, intermediate_dim=cfg.intermediate_dim,
                             eps=cfg.eps, rope_theta=spec.get("rope_theta", cfg.rope_theta),
                             cache_capacity=(self.cache_capacity if cache_capacity is None
                                             else cache_capacity),
                             rope_position_scale=spec.get("rope_position_scale",
                                                          cfg.rope_position_scale),
                             rope_freq_factors=self._rope_freq_factors,
                             window=int(spec.get("window", 0) or 0), rope_yarn=cfg.rope_yarn,
                             rope_attn_factor=cfg.rope_attn_factor,
                             activations=self.activations, kv_dtype=self.kv_dtype, **features)
        return layer


__all__ = ["Model", "ModelConfig"]
