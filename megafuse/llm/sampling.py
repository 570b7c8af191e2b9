"""megafuse.llm.sampling: choosing the next token from a row of logits.

Pure functions on float32 logits [V] (NumPy, no state): a ``Sampler`` applies them in a fixed
order for ``megafuse.Model.generate``:

    repeat penalty -> (temperature 0: argmax) -> temperature -> top-k -> top-p -> min-p -> draw

- repeat penalty (llama.cpp's): each distinct id among the last ``repeat_last_n`` tokens has its
  logit divided by ``penalty`` when positive, multiplied when negative (1.0: off);
- temperature 0 is greedy: the first id of the largest logit (as ``numpy.argmax``);
- temperature T > 0 divides the logits by T; top-k keeps the k largest (0: all); top-p keeps the
  smallest set of most likely tokens whose probability reaches p (1.0: all); min-p drops tokens
  less likely than min_p times the most likely one (0.0: none); the draw uses a
  ``numpy.random.Generator`` seeded with ``seed`` (same seed, same logits: same tokens).

Ties are broken by the lower token id everywhere (a stable sort), so results do not depend on
the platform.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
import numpy.typing as npt

F32Array = npt.NDArray[np.float32]


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


def greedy(logits: F32Array) -> int:
    """The id of the largest logit (the lowest such id on a tie)."""
    return int(np.argmax(logits))


def probabilities(logits: F32Array, temperature: float = 1.0) -> npt.NDArray[np.float64]:
    """softmax(logits / temperature) in float64 (-inf logits get probability 0)."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    z = z - np.max(z)
    p = np.exp(z)
    out: npt.NDArray[np.float64] = p / p.sum()
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


class Sampler:
    """The sampling settings of a generation and its random state.

    ``Sampler(temperature=0.0)`` is greedy.  ``sample(logits, previous)`` returns the next id;
    ``previous`` are the ids so far (prompt and generated), for the repeat penalty.
    """

    def __init__(self, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: Optional[int] = None) -> None:
        self.temperature = _number(temperature, "temperature", 0.0)
        self.top_k = _integer(top_k, "top_k", 0)
        self.top_p = _number(top_p, "top_p", 0.0, 1.0)
        self.min_p = _number(min_p, "min_p", 0.0, 1.0)
        self.repeat_penalty = _number(repeat_penalty, "repeat_penalty", 0.0)
        if self.repeat_penalty == 0.0:
            raise ValueError("repeat_penalty: expected a value > 0 (1.0: off), got 0")
        self.repeat_last_n = _integer(repeat_last_n, "repeat_last_n", 0)
        if seed is not None:
            seed = _integer(seed, "seed", 0)
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    def sample(self, logits: F32Array, previous: Iterable[int] = ()) -> int:
        prev = list(previous)
        if self.repeat_penalty != 1.0 and self.repeat_last_n > 0:
            logits = apply_repeat_penalty(logits, prev[-self.repeat_last_n:], self.repeat_penalty)
        if self.temperature == 0.0:
            return greedy(logits)
        probs = filter_top_k_p_min_p(probabilities(logits, self.temperature), self.top_k,
                                     self.top_p, self.min_p)
        probs = probs / probs.sum()
        return int(self._rng.choice(probs.size, p=probs))


def _number(value: object, name: str, lo: float, hi: Optional[float] = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    v = float(value)
    if not (v >= lo and (hi is None or v <= hi)):
        bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}: expected a value {bound}, got {value}")
    return v


def _integer(value: object, name: str, lo: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    v = int(value.__index__())
    if v < lo:
        raise ValueError(f"{name}: expected a value >= {lo}, got {v}")
    return v


__all__ = ["Sampler", "apply_repeat_penalty", "greedy", "probabilities", "filter_top_k_p_min_p"]
