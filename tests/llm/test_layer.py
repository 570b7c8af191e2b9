"""megafuse.DecoderLayer and megafuse.rope_tables: a whole decoder layer over the header
functions, checked against megafuse.reference composed here from the same weights."""
import numpy as np
import pytest

import megafuse
from megafuse import CKDataType, DecoderLayer, reference
from helpers import TOL, assert_q8_close, rel_err

# (E, H, G, D, I): small, GQA; K-quants need E, H*D and I to be multiples of 256
SHAPE = (256, 4, 2, 64, 512)


def float_weights(shape=SHAPE, seed=0, bias=True, all_biases=False):
    E, H, G, D, I = shape
    rng = np.random.default_rng(seed)

    def w(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    def v(n, scale=0.1):
        return (rng.standard_normal(n) * scale).astype(np.float32)

    weights = dict(ln1_gamma=1 + v(E), ln2_gamma=1 + v(E), wq=w(H * D, E),
                   wk=w(G * D, E), wv=w(G * D, E), wo=w(E, H * D), w1=w(2 * I, E),
                   w2=w(E, I))
    if bias:
        weights.update(bq=v(H * D), bk=v(G * D), bv=v(G * D))
    if all_biases:
        weights.update(bo=v(E), b1=v(2 * I), b2=v(E))
    return weights


def hyper(shape=SHAPE, **kw):
    E, H, G, D, I = shape
    return dict(dict(num_heads=H, num_kv_heads=G, head_dim=D, intermediate_dim=I, eps=1e-5,
                     rope_theta=10000.0), **kw)


def reference_layer(weights, dtypes, x, shape=SHAPE, theta=10000.0, eps=1e-5,
                    quantize_activations=False, freq_factors=None):
    """The layer over rows x at positions 0..T-1, from megafuse.reference's kernel functions
    (float64 math), with the weights given in their stored formats."""
    E, H, G, D, I = shape
    T = x.shape[0]
    inv = theta ** (-np.arange(0, D, 2) / D)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, np.float64)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    cache_k, cache_v = np.zeros((G, T, D), np.float32), np.zeros((G, T, D), np.float32)
    h = np.zeros((T, E), np.float32)
    attention = (reference.mega_fused_attention_prefill_q8_0 if quantize_activations
                 else reference.mega_fused_attention_prefill)
    g = weights.get
    attention(h, x, x, g("ln1_gamma"), g("wq"), g("bq"), dtypes["wq"], g("wk"), g("bk"),
              dtypes["wk"], g("wv"), g("bv"), dtypes["wv"], g("wo"), g("bo"), dtypes["wo"],
              cache_k, cache_v, cos, sin, 0, T, T, E, E, H, G, D, D, eps, None)
    out = np.zeros((T, E), np.float32)
    reference.mega_fused_mlp_prefill(out, h, h, g("ln2_gamma"), g("w1"), g("b1"), dtypes["w1"],
                                     g("w2"), g("b2"), dtypes["w2"], T, E, E, I, I, eps, None,
                                     quantize_activations=quantize_activations)
    return out


def run_layer(layer, x, n_prefill):
    """prefill of x[:n_prefill], then one decode per remaining row; all outputs stacked."""
    outs = [layer.prefill(x[:n_prefill])]
    for t in range(n_prefill, x.shape[0]):
        outs.append(layer.decode(x[t])[None, :])
    return np.concatenate(outs)


def inputs(T, E=SHAPE[0], seed=7):
    return np.random.default_rng(seed).standard_normal((T, E)).astype(np.float32)


# ---- rope_tables -------------------------------------------------------------------------

def test_rope_tables_formula():
    cos, sin = megafuse.rope_tables(64, 50, theta=500000.0)
    assert cos.shape == sin.shape == (50, 32) and cos.dtype == sin.dtype == np.float32
    p, i = 37, 5
    angle = p * 500000.0 ** (-2 * i / 64)
    assert cos[p, i] == np.float32(np.cos(angle)) and sin[p, i] == np.float32(np.sin(angle))
    assert np.all(cos[0] == 1) and np.all(sin[0] == 0)
    factors = np.linspace(1, 8, 32)
    c2, s2 = megafuse.rope_tables(64, 50, 500000.0, freq_factors=factors, position_scale=0.5)
    angle2 = p * 0.5 * 500000.0 ** (-2 * i / 64) / factors[i]
    assert c2[p, i] == np.float32(np.cos(angle2)) and s2[p, i] == np.float32(np.sin(angle2))


@pytest.mark.parametrize("args, match", [((63, 10), "even"), ((0, 10), "head_dim"),
                                         ((64, 0), "max_seq")])
def test_rope_tables_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        megafuse.rope_tables(*args)


@pytest.mark.parametrize("kwargs", [{"theta": 0.0}, {"theta": -1.0}, {"theta": float("nan")},
                                    {"theta": 5e-324}, {"position_scale": 1e320},
                                    {"position_scale": float("inf")},
                                    {"freq_factors": np.zeros(32)}])
def test_rope_tables_refuse_angles_that_are_not_finite(kwargs):
    """What a broken model file's RoPE metadata gives (a base of 0 or 5e-324, a linear factor of
    1e-320, a zero rope_freqs entry): a ValueError, not NaN tables."""
    with pytest.raises(ValueError, match="not all finite"):
        megafuse.rope_tables(64, 50, **kwargs)


# ---- the layer against the reference ---------------------------------------------------------

@pytest.mark.parametrize("fmt", ["FP32", "FP16", "BF16"])
def test_float_layer_prefill_then_decode_equals_reference(fmt):
    """prefill of N tokens + decode of K tokens == the reference layer over N + K tokens."""
    weights = float_weights(all_biases=True)
    layer = DecoderLayer.from_arrays(**weights, dtype=fmt, cache_capacity=40, **hyper())
    x = inputs(29)
    got = run_layer(layer, x, 24)
    stored = layer.weights
    want = reference_layer(stored, layer.dtypes, x)
    assert layer.position == 29
    assert rel_err(got, want) < TOL["float"]
    assert not layer.int8_path


@pytest.mark.parametrize("formats", [
    {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q8_0", "w1": "Q8_0", "w2": "Q8_0"},
    {"wq": "Q4_K", "wk": "Q5_K", "wv": "Q6_K", "wo": "Q4_0", "w1": "Q5_1", "w2": "Q6_K"},
    {"wq": "FP16", "wk": "BF16", "wv": "Q4_1", "wo": "FP32", "w1": "Q5_0", "w2": "Q4_K"},
], ids=["q8_0", "k-quant-mix", "float-and-block-mix"])
def test_quantized_layer_prefill_then_decode_equals_reference(formats):
    weights = float_weights()
    layer = DecoderLayer.from_arrays(**weights, dtypes=formats, cache_capacity=40, **hyper())
    assert layer.int8_path
    assert {k: v.name for k, v in layer.dtypes.items()} == formats
    x = inputs(28)
    got = run_layer(layer, x, 20)
    stored = layer.weights
    emulated = reference_layer(stored, layer.dtypes, x, quantize_activations=True)
    pure = reference_layer(stored, layer.dtypes, x)
    assert_q8_close(got, emulated, pure)
    assert rel_err(got, pure) < TOL["q8_vs_float"]


def test_layer_reference_method_matches_composed_reference():
    weights = float_weights(all_biases=True)
    layer = DecoderLayer.from_arrays(**weights, dtype="Q8_0", cache_capacity=16, **hyper())
    x = inputs(9)
    for qa in (False, True):
        want = reference_layer(layer.weights, layer.dtypes, x, quantize_activations=qa)
        assert np.array_equal(layer.reference(x, quantize_activations=qa), want)
    assert layer.position == 0


def test_chunked_prefill_equals_one_prefill():
    weights = float_weights()
    x = inputs(40)
    one = DecoderLayer.from_arrays(**weights, dtype="Q8_0", cache_capacity=40, **hyper())
    whole = one.prefill(x)
    chunked = DecoderLayer.from_arrays(**weights, dtype="Q8_0", cache_capacity=40, **hyper())
    parts = np.concatenate([chunked.prefill(x[:13]), chunked.prefill(x[13:31]),
                            chunked.prefill(x[31:])])
    assert rel_err(parts, whole) < 1e-6
    assert np.allclose(chunked.kv_cache_k, one.kv_cache_k, atol=1e-5)


@pytest.mark.parametrize("activations", ["int8", "float"])
@pytest.mark.parametrize("dtype", ["FP32", "Q8_0", "Q4_K"])
def test_prefill_and_decode_are_the_header_chain_bit_for_bit(dtype, activations):
    """The layer runs on the whole-model step; it computes what the header functions compute
    chained (attention prefill, then the MLP with the attention output as residual), for a
    prefill and for decode steps."""
    E, H, G, D, I = SHAPE
    layer = DecoderLayer.from_arrays(**float_weights(all_biases=True), dtype=dtype,
                                     cache_capacity=16, activations=activations, **hyper())
    int8 = layer.int8_path
    attention = (megafuse.mega_fused_attention_prefill_q8_0 if int8
                 else megafuse.mega_fused_attention_prefill)
    mlp = megafuse.mega_fused_mlp_prefill if int8 else megafuse.mega_fused_mlp_prefill_f32
    w, dt = layer.weights, layer.dtypes
    cache_k, cache_v = np.zeros_like(layer.kv_cache_k), np.zeros_like(layer.kv_cache_v)
    scratch = np.zeros(1 << 22, np.uint8)
    x = inputs(9)
    pos = 0
    for rows in (x[:6], x[6:7], x[7:8], x[8:9]):
        T = rows.shape[0]
        want = np.empty((T, E), np.float32)
        attention(want, rows, rows, w["ln1_gamma"], w["wq"], w["bq"], dt["wq"], w["wk"],
                  w["bk"], dt["wk"], w["wv"], w["bv"], dt["wv"], w["wo"], w["bo"], dt["wo"],
                  cache_k, cache_v, layer.rope_cos, layer.rope_sin, pos, T, 16, E, E, H, G, D, D,
                  layer.eps, scratch)
        mlp(want, want, want, w["ln2_gamma"], w["w1"], w["b1"], dt["w1"], w["w2"], w["b2"],
            dt["w2"], T, E, E, I, I, layer.eps, scratch)
        got = layer.prefill(rows) if T > 1 else layer.decode(rows[0])[None]
        np.testing.assert_array_equal(got, want)
        pos += T
    np.testing.assert_array_equal(layer.kv_cache_k, cache_k)
    np.testing.assert_array_equal(layer.kv_cache_v, cache_v)


def test_no_bias_mha_and_explicit_embed_dim():
    shape = (128, 2, 2, 64, 256)
    weights = float_weights(shape, bias=False)
    layer = DecoderLayer.from_arrays(**weights, embed_dim=128, cache_capacity=12,
                                     **hyper(shape))
    x = inputs(12, 128)
    got = run_layer(layer, x, 6)
    want = reference_layer(layer.weights, layer.dtypes, x, shape=shape)
    assert rel_err(got, want) < TOL["float"]


# ---- state: position, reset, capacity, scratch -----------------------------------------------

def test_prefill_past_capacity_is_a_value_error_and_changes_nothing():
    layer = DecoderLayer.from_arrays(**float_weights(), dtype="Q8_0", cache_capacity=20,
                                     **hyper())
    x = inputs(20)
    layer.prefill(x[:15])
    k, v = layer.kv_cache_k.copy(), layer.kv_cache_v.copy()
    with pytest.raises(ValueError, match=r"6 tokens at position 15.*cache_capacity is 20"):
        layer.prefill(x[:6])
    assert layer.position == 15
    assert np.array_equal(layer.kv_cache_k, k) and np.array_equal(layer.kv_cache_v, v)
    layer.prefill(x[15:])                        # exactly fills the cache
    with pytest.raises(ValueError, match=r"1 token at position 20.*cache_capacity is 20"):
        layer.decode(x[0])
    assert layer.position == 20


def test_max_tokens_bounds_a_prefill_call():
    """max_tokens is the most tokens one prefill takes: more is a ValueError naming it, before
    the cache is touched; up to it (in as many calls as the cache holds) runs."""
    layer = DecoderLayer.from_arrays(**float_weights(), dtype="Q8_0", cache_capacity=20,
                                     max_tokens=8, **hyper())
    assert layer.max_tokens == 8
    x = inputs(20)
    with pytest.raises(ValueError, match=r"9 tokens exceed max_tokens = 8"):
        layer.prefill(x[:9])
    assert layer.position == 0 and not layer.kv_cache_k.any()
    layer.prefill(x[:8])
    layer.prefill(x[8:16])
    assert layer.position == 16
    with pytest.raises(ValueError, match="max_tokens"):
        DecoderLayer.from_arrays(**float_weights(), max_tokens=0, **hyper())


def test_reset_starts_over():
    layer = DecoderLayer.from_arrays(**float_weights(), dtype="Q4_0", cache_capacity=16,
                                     **hyper())
    x = inputs(10)
    first = layer.prefill(x)
    layer.decode(x[0])
    layer.reset()
    assert layer.position == 0
    assert np.array_equal(layer.prefill(x), first)


def test_outputs_are_new_arrays_and_inputs_unchanged():
    layer = DecoderLayer.from_arrays(**float_weights(), cache_capacity=16, **hyper())
    x = inputs(5)
    x_before = x.copy()
    a = layer.prefill(x)
    b = layer.decode(x[0])
    assert np.array_equal(x, x_before)
    assert a.shape == (5, 256) and b.shape == (256,) and a.dtype == b.dtype == np.float32
    assert not np.shares_memory(a, x) and not np.shares_memory(b, x)


def test_scratch_is_allocated_once_and_long_prompts_run_in_steps():
    """The layer runs on the whole-model step: its scratch (one step of up to 128 tokens) is
    sized once, at construction; a longer prompt runs as several steps, with the results of
    one call over the whole prompt."""
    layer = DecoderLayer.from_arrays(**float_weights(), dtype="Q8_0", cache_capacity=400,
                                     **hyper())
    size = layer._runner.scratch_bytes
    assert size > 0
    x = inputs(300)
    whole = layer.prefill(x)                                  # 300 tokens: steps of 128
    assert layer._runner.scratch_bytes == size and layer.position == 300
    layer.reset()
    parts = np.concatenate([layer.prefill(x[:128]), layer.prefill(x[128:256]),
                            layer.prefill(x[256:])])
    np.testing.assert_array_equal(parts, whole)
    assert_q8_close(whole, layer.reference(x), layer.reference(x, quantize_activations=False))


# ---- weights as given: pre-quantized, read-only, no copy -------------------------------------

def test_prequantized_and_float_weights_give_the_same_layer():
    weights = float_weights()
    formats = {"wq": "Q8_0", "wk": "Q4_K", "wv": "BF16", "wo": "FP16", "w1": "Q5_0",
               "w2": "Q6_K"}
    from_float = DecoderLayer.from_arrays(**weights, dtypes=formats, cache_capacity=8,
                                          **hyper())
    stored = {}
    for name, fmt in formats.items():
        blob = megafuse.quantize(weights[name], CKDataType[fmt])
        blob.flags.writeable = False                 # as a GGUF memmap would be
        stored[name] = blob
    given = DecoderLayer.from_arrays(**dict(weights, **stored), dtypes=formats,
                                     cache_capacity=8, **hyper())
    for name in formats:
        assert given.weights[name] is stored[name] or np.shares_memory(given.weights[name],
                                                                        stored[name])
    x = inputs(8)
    assert np.array_equal(from_float.prefill(x), given.prefill(x))


def test_constructor_takes_stored_weights_only():
    weights = float_weights()
    with pytest.raises(TypeError, match=r"wq: a Q8_0 weight is stored as uint8, got float32"):
        DecoderLayer(**weights, dtype="Q8_0", cache_capacity=8, **hyper())


@pytest.mark.parametrize("change, error, match", [
    (dict(wq=np.zeros((10, 256), np.float32)), ValueError, r"wq: expected \[256, 256\]"),
    (dict(w2=np.zeros(100, np.uint8), dtypes={"w2": "Q8_0"}), ValueError,
     r"w2: expected 256 rows x 544 bytes = 139264 bytes of Q8_0, got 100"),
    (dict(dtypes={"wv": "Q8_K"}), ValueError, r"dtypes\['wv'\]: expected a weight format"),
    (dict(dtypes={"wx": "Q8_0"}), ValueError, r"dtypes: expected keys"),
    (dict(dtype="q9_9"), ValueError, r"dtype: expected a weight format name"),
    (dict(ln1_gamma=np.ones(100, np.float32)), ValueError, r"ln2_gamma: expected \[embed_dim\]"),
    (dict(bk=np.ones(7, np.float32)), ValueError, r"bk: expected \[num_kv_heads\*head_dim\]"),
    (dict(num_kv_heads=3), ValueError, r"num_heads: expected a multiple of num_kv_heads"),
], ids=["shape", "bytes", "activation-format", "key", "name", "gamma", "bias", "heads"])
def test_construction_errors_name_the_parameter(change, error, match):
    weights = float_weights()
    kw = dict(weights, cache_capacity=8, **hyper())
    kw.update(change)
    with pytest.raises(error, match=match):
        DecoderLayer.from_arrays(**kw)


def test_kquant_needs_whole_blocks_of_256():
    shape = (128, 2, 2, 64, 256)
    with pytest.raises(ValueError, match=r"wq: Q4_K stores rows in whole blocks of 256 "
                                         r"weights, but the weight has 128 columns"):
        DecoderLayer.from_arrays(**float_weights(shape), dtype="Q4_K", cache_capacity=8,
                                 **hyper(shape))


@pytest.mark.parametrize("x, match", [(np.zeros((3, 100), np.float32), r"\[tokens, embed_dim\]"),
                                      (np.zeros((0, 256), np.float32), r"got shape \(0, 256\)"),
                                      (np.zeros(256, np.float32), r"got shape \(256,\)")])
def test_prefill_input_errors(x, match):
    layer = DecoderLayer.from_arrays(**float_weights(), cache_capacity=8, **hyper())
    with pytest.raises(ValueError, match=match):
        layer.prefill(x)
    assert layer.position == 0


def test_decode_input_errors_and_accepted_forms():
    layer = DecoderLayer.from_arrays(**float_weights(), cache_capacity=8, **hyper())
    with pytest.raises(ValueError, match=r"decode: expected x of shape \[embed_dim\]"):
        layer.decode(np.zeros((2, 256), np.float32))
    with pytest.raises(TypeError, match="float32"):
        layer.decode(np.zeros(256, np.int64))
    x = inputs(2).astype(np.float64)             # converted; [1, E] is one token too
    a = layer.decode(x[0])
    b = layer.decode(x[1:2])
    assert a.shape == b.shape == (256,) and layer.position == 2


def test_repr_and_figures():
    layer = DecoderLayer.from_arrays(**float_weights(), dtype="Q8_0", cache_capacity=8,
                                     **hyper())
    assert "w2=Q8_0" in repr(layer) and "position=0/8" in repr(layer)
    E, H, G, D, I = SHAPE
    assert layer.flops(1, 0) == 2 * (H * D * E + 2 * G * D * E + E * H * D + 3 * I * E) \
        + 4 * H * D
    stored = sum(a.nbytes for a in layer.weights.values() if a is not None)
    assert layer.weight_bytes == stored
    assert layer.bytes_moved(1, 3) == stored + 2 * G * 4 * D * 4 + 2 * E * 4


# ---- activations="int8" | "float" ----------------------------------------------------------

MIXED = {"wq": "Q8_0", "wk": "Q4_K", "wv": "Q6_K", "wo": "Q5_0", "w1": "Q4_K", "w2": "Q6_K"}


def test_activations_default_is_int8_and_runs_the_int8_path():
    layer = DecoderLayer.from_arrays(**float_weights(), dtypes=MIXED, cache_capacity=8, **hyper())
    assert layer.activations == "int8" and layer.int8_path
    fp32 = DecoderLayer.from_arrays(**float_weights(), cache_capacity=8, **hyper())
    assert fp32.activations == "int8" and not fp32.int8_path


@pytest.mark.parametrize("formats", [MIXED, {n: "Q8_0" for n in MIXED},
                                     {"wq": "FP32", "wk": "FP32", "wv": "FP32", "wo": "FP32",
                                      "w1": "Q4_0", "w2": "BF16"}],
                         ids=["k-quant-mix", "q8_0", "fp32-attention"])
def test_float_activations_prefill_then_decode_equal_the_float_reference(formats):
    """activations="float": prefill and decode (the allocation-free kernel where the attention
    weights are FP32) match pure float math on the dequantized weights to TOL["float"]."""
    weights = float_weights(all_biases=True)
    layer = DecoderLayer.from_arrays(**weights, dtypes=formats, cache_capacity=40,
                                     activations="float", **hyper())
    assert layer.activations == "float" and not layer.int8_path
    x = inputs(27)
    got = run_layer(layer, x, 22)
    want = reference_layer(layer.weights, layer.dtypes, x)
    assert rel_err(got, want) < TOL["float"]
    assert np.array_equal(layer.reference(x), want)        # reference() follows the mode


def test_float_and_int8_activations_differ_on_block_weights():
    weights = float_weights()
    x = inputs(12)
    f = DecoderLayer.from_arrays(**weights, dtypes=MIXED, cache_capacity=16, activations="float",
                                 **hyper()).prefill(x)
    q = DecoderLayer.from_arrays(**weights, dtypes=MIXED, cache_capacity=16, **hyper())
    got = q.prefill(x)
    assert rel_err(f, got) > 10 * TOL["float"]
    # and the int8 layer's default reference() is the int8 emulation, not pure float math
    assert_q8_close(got, q.reference(x), q.reference(x, quantize_activations=False))
    assert np.array_equal(q.reference(x), reference_layer(q.weights, q.dtypes, x,
                                                          quantize_activations=True))


@pytest.mark.parametrize("bad, exc", [("fp32", ValueError), ("INT8", ValueError),
                                      (8, TypeError), (None, TypeError)])
def test_activations_keyword_rejects(bad, exc):
    with pytest.raises(exc, match="activations"):
        DecoderLayer.from_arrays(**float_weights(), cache_capacity=8, activations=bad, **hyper())
