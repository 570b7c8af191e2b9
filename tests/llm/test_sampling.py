"""megafuse.llm.sampling: the distribution each filter leaves, checked by drawing from it (fixed
seeds, so each run draws the same), the seeds, the penalties and the logit bias.

Each distribution test compares the frequencies of N draws with the distribution the filter
should leave (within 5 standard deviations a token, and the tokens it removes never drawn): a
filter switched off, or a temperature ignored, fails it."""
import numpy as np
import pytest

from megafuse.llm.sampling import (Sampler, apply_logit_bias, apply_presence_frequency_penalty,
                                   apply_repeat_penalty, probabilities)

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
N = 20000


def softmax(z, temperature=1.0):
    z = np.asarray(z, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    return p / p.sum()


def frequencies(sampler, logits=LOGITS, n=N):
    counts = np.bincount([sampler.sample(logits) for _ in range(n)], minlength=logits.size)
    return counts / n


def assert_drawn_from(freq, want):
    want = np.asarray(want, dtype=np.float64)
    want = want / want.sum()
    sigma = np.sqrt(want * (1 - want) / N)
    assert np.all(freq[want == 0] == 0), (freq, want)            # removed: never drawn
    assert np.all(np.abs(freq - want) <= 5 * sigma + 1e-9), (freq, want)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_scales_the_distribution(temperature):
    freq = frequencies(Sampler(temperature=temperature, seed=1))
    assert_drawn_from(freq, softmax(LOGITS, temperature))


def test_temperature_is_not_ignored():
    """The check above tells temperatures apart: the T=2 frequencies are not softmax(T=1)."""
    freq = frequencies(Sampler(temperature=2.0, seed=1))
    with pytest.raises(AssertionError):
        assert_drawn_from(freq, softmax(LOGITS, 1.0))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_top_k_keeps_the_k_most_likely(k):
    freq = frequencies(Sampler(temperature=1.0, top_k=k, seed=2))
    want = softmax(LOGITS)
    want[k:] = 0                                  # LOGITS are sorted, most likely first
    assert_drawn_from(freq, want)


@pytest.mark.parametrize("p, kept", [(0.5, 2), (0.8, 4), (0.95, 6)])
def test_top_p_keeps_the_smallest_set_reaching_p(p, kept):
    full = softmax(LOGITS)
    cumulative = np.cumsum(full)
    assert cumulative[kept - 2] < p <= cumulative[kept - 1]       # (the case is what it says)
    freq = frequencies(Sampler(temperature=1.0, top_p=p, seed=3))
    want = full.copy()
    want[kept:] = 0
    assert_drawn_from(freq, want)


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.6])
def test_min_p_drops_the_tokens_below_min_p_of_the_top(min_p):
    full = softmax(LOGITS)
    freq = frequencies(Sampler(temperature=1.0, min_p=min_p, seed=4))
    want = np.where(full >= min_p * full[0], full, 0.0)
    assert 0 < np.count_nonzero(want) < LOGITS.size
    assert_drawn_from(freq, want)


def test_filters_apply_in_order_after_temperature():
    """temperature 0.7, then top-k 6, top-p 0.9 of what is left, then min-p 0.05."""
    full = softmax(LOGITS, 0.7)
    want = full.copy()
    want[6:] = 0
    cumulative = np.cumsum(want) / want.sum()
    cut = int(np.searchsorted(cumulative, 0.9)) + 1
    want[cut:] = 0
    want = np.where(want >= 0.05 * want[0], want, 0.0)
    freq = frequencies(Sampler(temperature=0.7, top_k=6, top_p=0.9, min_p=0.05, seed=5))
    assert_drawn_from(freq, want)


def test_the_most_likely_token_is_never_removed():
    s = Sampler(temperature=1.0, top_p=0.0, min_p=1.0, top_k=1, seed=6)
    assert {s.sample(LOGITS) for _ in range(200)} == {0}


def test_greedy_is_the_first_largest():
    logits = np.array([0.0, 3.0, 3.0, 1.0], dtype=np.float32)
    assert Sampler().sample(logits) == 1
    assert Sampler(temperature=0.0, top_k=1, seed=3).sample(logits) == 1


def test_seeds_reproduce_and_differ():
    def draws(seed):
        s = Sampler(temperature=1.5, top_k=6, seed=seed)
        return [s.sample(LOGITS) for _ in range(64)]
    assert draws(11) == draws(11)
    assert draws(11) != draws(12)
    assert Sampler(temperature=1.0, seed=None).seed is None


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    out = apply_repeat_penalty(logits, [0, 1, 1], 2.0)
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0, 0.5])
    assert logits[0] == 2.0                                       # a copy
    s = Sampler(repeat_penalty=4.0)
    assert s.sample(logits, previous=[]) == 0
    assert s.sample(logits, previous=[0]) == 2                    # 2 / 4 < 1
    # only the last repeat_last_n ids count
    assert Sampler(repeat_penalty=4.0, repeat_last_n=1).sample(logits, previous=[0, 3]) == 0


def test_presence_and_frequency_penalties():
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    out = apply_presence_frequency_penalty(logits, [0, 0, 0, 1], presence=0.5, frequency=0.25)
    np.testing.assert_allclose(out, [2.0 - 0.75 - 0.5, 1.9 - 0.25 - 0.5, 0.0], rtol=1e-6)
    assert Sampler(presence_penalty=0.5).sample(logits, previous=[0]) == 1
    assert Sampler(frequency_penalty=0.05).sample(logits, previous=[0]) == 0   # 1.95 > 1.9
    assert Sampler(frequency_penalty=0.05).sample(logits, previous=[0, 0, 0]) == 1
    # negative values encourage repetition (OpenAI's range -2..2)
    assert Sampler(presence_penalty=-1.0).sample(logits, previous=[1]) == 1


def test_logit_bias_adds_and_bans():
    out = apply_logit_bias(LOGITS, {3: 5.0, 0: -100})
    assert out[3] == LOGITS[3] + 5 and out[0] == -np.inf
    assert Sampler(logit_bias={"3": 5.0}).sample(LOGITS) == 3     # JSON's string keys
    s = Sampler(temperature=1.0, logit_bias={0: -100, 1: -100}, seed=9)
    freq = frequencies(s, n=2000)
    assert freq[0] == freq[1] == 0 and freq[2] > 0.2


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(temperature=-0.1), ValueError, "temperature"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(min_p=-0.1), ValueError, "min_p"),
    (dict(top_k=-1), ValueError, "top_k"),
    (dict(top_k=2.0), TypeError, "top_k"),
    (dict(repeat_penalty=0), ValueError, "repeat_penalty"),
    (dict(repeat_penalty=float("inf")), ValueError, "repeat_penalty"),
    (dict(presence_penalty=3.0), ValueError, "presence_penalty"),
    (dict(frequency_penalty=float("nan")), ValueError, "frequency_penalty"),
    (dict(logit_bias=[1, 2]), TypeError, "logit_bias"),
    (dict(logit_bias={"x": 1}), TypeError, "logit_bias"),
    (dict(logit_bias={1: float("inf")}), ValueError, "logit_bias"),
    (dict(logit_bias={100: 1.0}, vocab_size=8), ValueError, "logit_bias"),
    (dict(seed=True), TypeError, "seed"),
])
def test_bad_settings_name_themselves(kwargs, err, match):
    with pytest.raises(err, match=match):
        Sampler(**kwargs)


def test_probabilities_at_extreme_temperatures_stay_finite():
    p = probabilities(LOGITS, 5e-324)
    assert np.isfinite(p).all() and p[0] == 1.0
    p = probabilities(LOGITS, 1e300)
    np.testing.assert_allclose(p, 1 / LOGITS.size)
    with pytest.raises(ValueError, match="every token is excluded"):
        probabilities(np.full(4, -np.inf, dtype=np.float32))
