"""megafuse.llm.sampling: choosing the next token from a row of logits.

Pure functions on float32 logits [V] (NumPy, no state): a ``Sampler`` applies them in a fixed
order for ``megafuse.Model.generate`` and the text API (``megafuse.llm.completion``):

    logit bias -> penalties -> (temperature 0: argmax) -> temperature -> top-k -> top-p
    -> min-p -> draw

- logit bias: a mapping token id -> a number added to its logit (OpenAI's ``logit_bias``;
  -100 or less bans the token, as -inf);
- penalties, over the distinct ids among the last ``repeat_last_n`` tokens (prompt and
  generated, as llama.cpp): the repeat penalty divides a positive logit by ``repeat_penalty``
  and multiplies a negative one (1.0: off); then ``frequency_penalty`` times the id's count
  and ``presence_penalty`` once are subtracted (0.0: off; OpenAI's and llama.cpp's formula);
- temperature 0 is greedy: the first id of the largest logit (as ``numpy.argmax``);
- temperature T > 0 divides the logits by T; top-k keeps the k largest (0: all); top-p keeps the
  smallest set of most likely tokens whose probability reaches p (1.0: all); min-p drops tokens
  less likely than min_p times the most likely one (0.0: none); the draw inverts the cumulative
  distribution at a uniform number from a ``numpy.random.Generator`` seeded with ``seed`` (same
  seed, same logits: same tokens).

Ties are broken by the lower token id everywhere (a stable sort), so results do not depend on
the platform.  Every setting is checked when the Sampler is made: a TypeError or ValueError
names it (a temperature, penalty or bias must be a finite number).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]

#: A logit bias at or below this bans the token (OpenAI: "-100 should result in a ban").
BAN_BIAS = -100.0


def apply_repeat_penalty(logits: F32Array, previous: Sequence[int], penalty: float) -> F32Array:
    """A copy of logits with llama.cpp's repetition penalty applied to the ids in `previous`."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or len(previous) == 0:
        return out
    ids = np.unique(np.asarray(previous, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < out.size)]
    values = out[ids]
    out[ids] = np.where(values > 0, values / np.float32(penalty), values * np.float32(penalty))
    return out


def apply_presence_frequency_penalty(logits: F32Array, previous: Sequence[int],
                                     presence: float, frequency: float) -> F32Array:
    """A copy of logits where each id seen c > 0 times in `previous` loses
    ``c * frequency + presence``."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if (presence == 0.0 and frequency == 0.0) or len(previous) == 0:
        return out
    ids, counts = np.unique(np.asarray(previous, dtype=np.int64), return_counts=True)
    keep = (ids >= 0) & (ids < out.size)
    ids, counts = ids[keep], counts[keep]
    out[ids] -= (counts * frequency + presence).astype(np.float32)
    return out


def apply_logit_bias(logits: F32Array, bias: Mapping[int, float]) -> F32Array:
    """A copy of logits with ``bias[id]`` added to each id's logit (-inf at or below BAN_BIAS)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    for token, value in bias.items():
        out[token] = -np.inf if value <= BAN_BIAS else out[token] + np.float32(value)
    return out


def greedy(logits: F32Array) -> int:
    """The id of the largest logit (the lowest such id on a tie)."""
    return int(np.argmax(logits))


def probabilities(logits: F32Array, temperature: float = 1.0) -> npt.NDArray[np.float64]:
    """softmax(logits / temperature) in float64 (-inf logits get probability 0).  The largest
    logit is subtracted before dividing, so any temperature > 0 gives finite probabilities
    (a temperature of 5e-324 puts everything on the largest logits)."""
    z = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):   # (a tiny temperature: -inf)
        z = (z - np.max(z)) / float(temperature)    # <= 0: exp never overflows
    z[np.isnan(z)] = -np.inf                         # (-inf - -inf: nothing is left there)
    p = np.exp(z)
    total = p.sum()
    if not total > 0:                                # every logit -inf: nothing to choose from
        raise ValueError("logits: every token is excluded (all logits are -inf)")
    out: npt.NDArray[np.float64] = p / total
    return out


def log_softmax(logits: F32Array) -> npt.NDArray[np.float64]:
    """log softmax(logits) in float64 (the logprobs the text API reports)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z)
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = z - np.log(np.exp(z).sum())
    return out


def filter_top_k_p_min_p(probs: npt.NDArray[np.float64], top_k: int = 0, top_p: float = 1.0,
                         min_p: float = 0.0) -> npt.NDArray[np.float64]:
    """probs with the tokens that top-k, then top-p, then min-p remove set to 0 (not
    renormalised).  The most likely token is never removed."""
    order = np.argsort(-probs, kind="stable")          # most likely first; ties: lower id first
    keep = np.ones(probs.size, dtype=bool)             # in `order`'s positions
    if top_k > 0:
        keep[top_k:] = False
    if top_p < 1.0:
        sorted_p = probs[order]
        cumulative = np.cumsum(np.where(keep, sorted_p, 0.0))
        # keep up to and including the first token where the running sum reaches top_p
        cut = int(np.searchsorted(cumulative, top_p * cumulative[-1], side="left")) + 1
        keep[cut:] = False
    if min_p > 0.0:
        keep &= probs[order] >= min_p * probs[order[0]]
    keep[0] = True
    out = np.zeros_like(probs)
    kept = order[keep]
    out[kept] = probs[kept]
    return out


def draw(probs: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    """An id drawn from the (not necessarily normalised) weights probs, by inverting their
    cumulative sum at one uniform number of rng; never an id of weight 0."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    i = int(np.searchsorted(cumulative, u, side="right"))
    i = min(i, probs.size - 1)
    while probs[i] == 0.0:                 # (u at the very top: the last id of weight > 0)
        i -= 1
    return i


class Sampler:
    """The sampling settings of a generation and its random state.

    ``Sampler(temperature=0.0)`` is greedy.  ``sample(logits, previous)`` returns the next id;
    ``previous`` are the ids so far (prompt and generated), for the penalties.
    ``adjust(logits, previous)`` is the bias and penalties alone (what ``sample`` draws from at
    temperature 1).  vocab_size, when given, bounds the ids of logit_bias.
    """

    def __init__(self, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Optional[Mapping[Any, Any]] = None, seed: Optional[int] = None,
                 vocab_size: Optional[int] = None) -> None:
        self.temperature = _number(temperature, "temperature", 0.0)
        self.top_k = _integer(top_k, "top_k", 0)
        self.top_p = _number(top_p, "top_p", 0.0, 1.0)
        self.min_p = _number(min_p, "min_p", 0.0, 1.0)
        self.repeat_penalty = _number(repeat_penalty, "repeat_penalty", 0.0)
        if self.repeat_penalty == 0.0:
            raise ValueError("repeat_penalty: expected a value > 0 (1.0: off), got 0")
        self.repeat_last_n = _integer(repeat_last_n, "repeat_last_n", 0)
        self.presence_penalty = _number(presence_penalty, "presence_penalty", -2.0, 2.0)
        self.frequency_penalty = _number(frequency_penalty, "frequency_penalty", -2.0, 2.0)
        self.logit_bias = _logit_bias(logit_bias, vocab_size)
        if seed is not None:
            seed = _integer(seed, "seed", 0)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def adjust(self, logits: F32Array, previous: Sequence[int] = ()) -> F32Array:
        """The logits after the logit bias and the penalties (a copy)."""
        out = apply_logit_bias(logits, self.logit_bias) if self.logit_bias else logits
        if self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty or
                                       self.frequency_penalty):
            window = list(previous)[-self.repeat_last_n:]
            out = apply_repeat_penalty(out, window, self.repeat_penalty)
            out = apply_presence_frequency_penalty(out, window, self.presence_penalty,
                                                   self.frequency_penalty)
        return np.array(out, dtype=np.float32, copy=out is logits)

    def choose(self, adjusted: F32Array) -> int:
        """The next id from logits that ``adjust`` already gave."""
        if self.temperature == 0.0:
            return greedy(adjusted)
        probs = filter_top_k_p_min_p(probabilities(adjusted, self.temperature), self.top_k,
                                     self.top_p, self.min_p)
        return draw(probs, self._rng)

    def sample(self, logits: F32Array, previous: Iterable[int] = ()) -> int:
        return self.choose(self.adjust(logits, list(previous)))


def _number(value: object, name: str, lo: float, hi: Optional[float] = None) -> float:
    """A finite number in lo..hi (hi None: no upper bound), else a TypeError / ValueError
    naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and v >= lo and (hi is None or v <= hi)):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}: expected a finite value {bound}, got {value}")
    return v


def _integer(value: object, name: str, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    v = int(value.__index__())
    if v < lo:
        raise ValueError(f"{name}: expected a value >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValueError(f"{name}: expected a value <= {hi}, got {v}")
    return v


def _logit_bias(bias: Optional[Mapping[Any, Any]], vocab_size: Optional[int]) -> Dict[int, float]:
    """logit_bias as {id: finite bias}; keys may be ints or decimal strings (JSON's)."""
    if bias is None:
        return {}
    if not isinstance(bias, Mapping):
        raise TypeError(f"logit_bias: expected a mapping of token id to bias, got "
                        f"{type(bias).__name__}")
    out: Dict[int, float] = {}
    for key, value in bias.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            token = int(key)
        elif isinstance(key, bool) or not hasattr(key, "__index__"):
            raise TypeError(f"logit_bias: expected token ids as keys, got {key!r}")
        else:
            token = int(key.__index__())
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            top = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
            raise ValueError(f"logit_bias: expected token ids in {top}, got {token}")
        out[token] = _number(value, f"logit_bias[{token}]", -math.inf)
    return out


__all__ = ["Sampler", "apply_repeat_penalty", "apply_presence_frequency_penalty",
           "apply_logit_bias", "greedy", "probabilities", "log_softmax", "filter_top_k_p_min_p",
           "draw", "BAN_BIAS"]
