"""mega_fused_attention_prefill(_q8_0) against the NumPy reference: every weight format, the
shapes of real models, cache continuation, aliasing, scratch bounds, threads and SIMD levels."""
import numpy as np
import pytest

import megafuse
from megafuse import reference
from helpers import (FLOAT_FORMATS, LLAMA_STYLE, MHA, PADDED, QWEN2_05B, TOL, WEIGHT_FORMATS,
                     assert_q8_close, copy_args, decode_case, encode_weight, fits, prefill_case,
                     rel_err)

# a shape every format fits (Ea and H*Da multiples of 256)
SMALL_256 = ("small-256", 512, 512, 8, 2, 64, 64)


def run(args, int8=False):
    """(kernel result, reference result[, pure-float reference result for the int8 path])."""
    got, want = copy_args(args), copy_args(args)
    kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
    kernel(**got)
    if not int8:
        reference.mega_fused_attention_prefill(**want)
        return got, want
    reference.mega_fused_attention_prefill_q8_0(**want)
    pure = copy_args(args)
    reference.mega_fused_attention_prefill(**pure)
    return got, want, pure


def check(got, want, tol, pure=None):
    for name in ("output", "kv_cache_k", "kv_cache_v"):
        if pure is not None and tol == TOL["q8_emulated"]:   # see helpers.assert_q8_close
            rows = [a[name].reshape(-1, a[name].shape[-1]) for a in (got, want, pure)]
            assert_q8_close(*rows, name)
            continue
        err = rel_err(got[name], want[name])
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol:.0e}"


def fits_shape(fmt, shape):
    _, E, Ea, H, G, D, Da = shape
    return fits(fmt, Ea) and fits(fmt, H * Da)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
@pytest.mark.parametrize("T", [7, 64])
def test_every_format_float_activations(simd_level, fmt, T):
    args = prefill_case(SMALL_256, T, formats={w: fmt for w in ("wq", "wk", "wv", "wo")})
    check(*run(args), TOL["float"])


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_every_format_int8_path(simd_level, fmt):
    args = prefill_case(SMALL_256, 9, formats={w: fmt for w in ("wq", "wk", "wv", "wo")},
                        int8=True)
    got, want, pure = run(args, int8=True)
    check(got, want, TOL["q8_emulated"] if fmt not in FLOAT_FORMATS else TOL["float"],
          pure)
    assert rel_err(got["output"], pure["output"]) < TOL["q8_vs_float"]


def test_random_kquant_blocks():
    """K-quant bytes not made by any quantizer (random codes and scales) read the same way."""
    rng = np.random.default_rng(11)
    args = prefill_case(SMALL_256, 6)
    for name, fmt in (("wq", "Q4_K"), ("wk", "Q5_K"), ("wv", "Q6_K"), ("wo", "Q4_K")):
        w = reference.dequantize(args[name], 0, (args[name].shape[0], args[name].shape[1]))
        args[name] = encode_weight(w.astype(np.float32), fmt, rng, random_kquants=True)
        args[name + "_dt"] = megafuse.CKDataType[fmt]
    check(*run(args), TOL["float"])


MIXES = {
    "q4_k_m-style": {"wq": "Q4_K", "wk": "Q4_K", "wv": "Q6_K", "wo": "Q4_K"},
    "legacy-mix": {"wq": "Q5_0", "wk": "Q8_0", "wv": "Q4_1", "wo": "Q5_1"},
    "float-and-blocks": {"wq": "BF16", "wk": "Q8_0", "wv": "FP16", "wo": "Q6_K"},
}


@pytest.mark.parametrize("mix", list(MIXES), ids=list(MIXES))
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
def test_mixed_formats(simd_level, mix, int8):
    args = prefill_case(LLAMA_STYLE, 13, formats=MIXES[mix], int8=int8, start_pos=3)
    results = run(args, int8=int8)
    check(results[0], results[1], TOL["q8_emulated"] if int8 else TOL["float"], *results[2:])


@pytest.mark.parametrize("shape", [QWEN2_05B, LLAMA_STYLE, MHA, PADDED], ids=lambda s: s[0])
@pytest.mark.parametrize("T", [1, 7, 64, 200])
def test_shapes_and_token_counts(shape, T):
    if shape is LLAMA_STYLE and T == 200:
        T = 150     # keeps the float64 reference quick; still several query and KV tiles
    check(*run(prefill_case(shape, T, cache_capacity=T + 9)), TOL["float"])


@pytest.mark.parametrize("shape", [QWEN2_05B, PADDED], ids=lambda s: s[0])
@pytest.mark.parametrize("fmt", ["Q8_0", "Q5_0"])
@pytest.mark.parametrize("T", [1, 64])
def test_qwen_shapes_quantized(shape, fmt, T):
    if not fits_shape(fmt, shape):
        pytest.skip(f"{fmt} does not fit {shape[0]}")
    formats = {w: fmt for w in ("wq", "wk", "wv", "wo")}
    check(*run(prefill_case(shape, T, formats=formats)), TOL["float"])
    got, want, pure = run(prefill_case(shape, T, formats=formats, int8=True), int8=True)
    check(got, want, TOL["q8_emulated"], pure)


@pytest.mark.parametrize("option", ["no_bias", "no_residual", "no_rope"])
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
def test_options(simd_level, option, int8):
    kw = {"bias": option != "no_bias", "residual": option != "no_residual",
          "rope": option != "no_rope"}
    args = prefill_case(PADDED, 11, formats={"wq": "Q8_0", "wo": "Q4_0"}, int8=int8, **kw)
    results = run(args, int8=int8)
    check(results[0], results[1], TOL["q8_emulated"] if int8 else TOL["float"], *results[2:])


def test_continuation_prefill_then_prefill():
    N, M = 37, 29
    full = prefill_case(QWEN2_05B, N + M, cache_capacity=N + M + 4)
    megafuse.mega_fused_attention_prefill(**full)
    first = prefill_case(QWEN2_05B, N + M, cache_capacity=N + M + 4)   # same seed: same data
    a = dict(first, input=first["input"][:N].copy(), output=np.zeros((N, 896), np.float32),
             residual=first["residual"][:N].copy(), tokens=N)
    megafuse.mega_fused_attention_prefill(**a)
    b = dict(first, input=first["input"][N:].copy(), output=np.zeros((M, 896), np.float32),
             residual=first["residual"][N:].copy(), tokens=M, start_pos=N)
    megafuse.mega_fused_attention_prefill(**b)
    assert rel_err(np.concatenate([a["output"], b["output"]]), full["output"]) < TOL["float"]
    assert rel_err(first["kv_cache_k"], full["kv_cache_k"]) < TOL["float"]


def test_continuation_prefill_then_decode():
    N = 40
    full = prefill_case(QWEN2_05B, N + 1, cache_capacity=64)
    megafuse.mega_fused_attention_prefill(**full)
    case = prefill_case(QWEN2_05B, N + 1, cache_capacity=64)
    part = dict(case, input=case["input"][:N].copy(), residual=case["residual"][:N].copy(),
                output=np.zeros((N, 896), np.float32), tokens=N)
    megafuse.mega_fused_attention_prefill(**part)
    out = np.zeros(896, np.float32)
    megafuse.mega_fused_attention_decode(
        out, case["input"][N], case["residual"][N], case["ln1_gamma"], case["wq"], case["bq"],
        case["wk"], case["bk"], case["wv"], case["bv"], case["wo"], case["bo"],
        case["kv_cache_k"], case["kv_cache_v"], case["rope_cos"], case["rope_sin"], N, 896, 896,
        14, 2, 64, 64, 64, 1e-6)
    assert rel_err(out, full["output"][N]) < TOL["float"]
    assert rel_err(case["kv_cache_v"], full["kv_cache_v"]) < TOL["float"]


@pytest.mark.parametrize("alias", ["input", "residual"])
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
def test_output_may_be_input_or_residual(alias, int8):
    args = prefill_case(QWEN2_05B, 70, formats={"wo": "Q8_0"}, int8=int8)
    kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
    out_of_place = copy_args(args)
    kernel(**out_of_place)
    in_place = copy_args(args)
    in_place["output"] = in_place[alias]
    kernel(**in_place)
    assert np.array_equal(in_place[alias], out_of_place["output"])


@pytest.mark.parametrize("T", [1, 33])
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("shape", [QWEN2_05B, SMALL_256, PADDED, LLAMA_STYLE],
                         ids=lambda s: s[0])
def test_scratch_guard_bytes_and_prior_content(int8, shape, T):
    formats = {"wq": "Q8_0", "wk": "Q4_K", "wv": "Q8_0", "wo": "Q4_K"} if shape is SMALL_256 \
        else {"wq": "Q8_0", "wo": "Q8_0"}
    if shape is PADDED:
        formats = {}
    args = prefill_case(shape, T, start_pos=40, formats=formats, int8=int8)
    need = args["scratch"].nbytes
    results = []
    for fill in (0x00, 0xFF, 0x7F):
        run_args = copy_args(args)
        scratch = np.full(need + 4096, fill, np.uint8)
        run_args["scratch"] = scratch
        kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
                  else megafuse.mega_fused_attention_prefill)
        kernel(**run_args)
        assert np.all(scratch[need:] == fill), "the kernel wrote past scratch_size bytes"
        results.append(run_args["output"])
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[2])


def test_scratch_size_is_small_and_linear():
    sizes = [megafuse.mega_fused_attention_prefill_scratch_size(T, 896, 14, 64)
             for T in (32, 64, 96)]
    assert sizes[0] < 648_192                      # upstream at T=32 on these dims
    assert abs((sizes[2] - sizes[1]) - (sizes[1] - sizes[0])) <= 128   # linear in T
    q8 = megafuse.mega_fused_attention_prefill_q8_0_scratch_size(32, 896, 14, 64)
    assert sizes[0] < q8 < 648_192


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
def test_one_and_two_threads_bitwise_equal(simd_level, threads, int8):
    args = prefill_case(LLAMA_STYLE, 150, formats={"wq": "Q4_K", "wk": "Q8_0", "wo": "Q6_K"},
                        int8=int8)
    kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
    results = []
    for n in (1, 2):
        megafuse.set_num_threads(n)
        r = copy_args(args)
        kernel(**r)
        results.append(r)
    for name in ("output", "kv_cache_k", "kv_cache_v"):
        assert np.array_equal(results[0][name], results[1][name])


# One token with at least 2 kv groups a thread runs projections and attention as one queue of kv
# groups (fused_prefill); fewer groups, or split-KV positions (>= 512), run phase by phase.  Both
# must give the same bits, whichever the thread count picks.
@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("shape, formats", [
    (("gqa-8", 256, 256, 16, 8, 32, 32), {"wq": "Q4_0", "wk": "Q5_1", "wv": "FP16", "wo": "Q8_0"}),
    (("mha-6-padded", 200, 224, 6, 6, 40, 48), {}),
    (("gqa-4-kquant", 512, 512, 8, 4, 64, 64), {"wq": "Q4_K", "wk": "Q6_K", "wv": "BF16",
                                                "wo": "Q5_K"}),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
@pytest.mark.parametrize("pos", [0, 37, 511, 700])
def test_one_token_group_queue_gives_the_phase_by_phase_bits(threads, int8, shape, formats, pos):
    args = prefill_case(shape, 1, start_pos=pos, formats=formats, int8=int8)
    kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
    results = []
    for n in (1, 2, 3, 4, 8):     # the queue where kv groups >= 2 x threads
        megafuse.set_num_threads(n)
        r = copy_args(args)
        kernel(**r)
        results.append(r)
    for r in results[1:]:
        for name in ("output", "kv_cache_k", "kv_cache_v"):
            assert np.array_equal(results[0][name], r[name]), name
    if pos == 37:                 # and the reference's numbers
        want = copy_args(args)
        (reference.mega_fused_attention_prefill_q8_0 if int8
         else reference.mega_fused_attention_prefill)(**want)
        for name in ("output", "kv_cache_k", "kv_cache_v"):
            assert rel_err(results[0][name], want[name]) < 1e-4, name


def test_cache_rows_outside_the_call_are_untouched():
    args = prefill_case(PADDED, 10, start_pos=6, cache_capacity=30)
    before = args["kv_cache_k"].copy()
    megafuse.mega_fused_attention_prefill(**args)
    changed = np.where(np.any(before != args["kv_cache_k"], axis=(0, 2)))[0]
    assert changed.min() >= 6 and changed.max() <= 15


def test_tokens_one_matches_decode():
    """A one-token prefill is a decode step (the way a quantized decode runs)."""
    dec = decode_case(QWEN2_05B, pos=20, cache_capacity=40)
    a = dec.args
    pre = dict(output=np.zeros((1, 896), np.float32), input=a["input"][None].copy(),
               residual=a["residual"][None].copy(), ln1_gamma=a["ln1_gamma"],
               wq=a["wq"], bq=a["bq"], wq_dt=0, wk=a["wk"], bk=a["bk"], wk_dt=0, wv=a["wv"],
               bv=a["bv"], wv_dt=0, wo=a["wo"], bo=a["bo"], wo_dt=0,
               kv_cache_k=a["kv_cache_k"].copy(), kv_cache_v=a["kv_cache_v"].copy(),
               rope_cos=a["rope_cos"], rope_sin=a["rope_sin"], start_pos=20, tokens=1,
               cache_capacity=40, embed_dim=896, aligned_embed_dim=896, num_heads=14,
               num_kv_heads=2, head_dim=64, aligned_head_dim=64, eps=a["eps"],
               scratch=np.zeros(megafuse.mega_fused_attention_prefill_scratch_size(1, 896, 14,
                                                                                   64), np.uint8))
    megafuse.mega_fused_attention_prefill(**pre)
    megafuse.mega_fused_attention_decode(**a)
    assert rel_err(pre["output"][0], a["output"]) < TOL["float"]


# Shapes at the edges of the float GEMM and attention blocks: weight rows not a multiple of the
# 16-row panel, columns not a multiple of 8 (the packing's vector width), head dims with a tail
# past the last 16 (attention's P.V block) and above 256 (the fallback attention).
ODD_DIMS = ("odd-dims", 100, 108, 3, 1, 20, 28)       # H*Da = 84 rows / columns, Ea = 108
WIDE_HEAD = ("wide-head", 60, 64, 2, 1, 260, 264)     # head_dim above MF_ATT_MAX_HEAD_DIM
GROUP_OF_18 = ("group-of-18", 128, 128, 36, 2, 16, 16)  # one token: two blocks of a kv group


@pytest.mark.parametrize("shape", [ODD_DIMS, WIDE_HEAD, PADDED, GROUP_OF_18], ids=lambda s: s[0])
@pytest.mark.parametrize("T", [1, 2, 4, 5, 6, 13, 131])
def test_gemm_and_attention_block_edges(simd_level, shape, T):
    """Token counts around the 6-token register block and the packed path's threshold (4), past
    the 128-token tile, on dims that leave partial panels and vector tails everywhere."""
    args = prefill_case(shape, T, start_pos=3)
    check(*run(args), TOL["float"])


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "FP16"])
def test_packed_path_dequantizes_block_formats(simd_level, fmt):
    """Float activations, block-format weights, 17 tokens: rows dequantized 256 columns at a time
    into the packed panels (K = 512: two panels of columns)."""
    args = prefill_case(SMALL_256, 17, formats={w: fmt for w in ("wq", "wk", "wv", "wo")})
    check(*run(args), TOL["float"])


@pytest.mark.parametrize("fmt", ["FP32", "Q8_0"])
def test_one_token_over_a_long_context(simd_level, fmt):
    """Prefill of one token at position 1500 (DecoderLayer's decode with block-format weights):
    decode's split-KV attention, against the reference."""
    args = prefill_case(("mqa", 256, 256, 4, 1, 64, 64), 1, start_pos=1500,
                        formats={w: fmt for w in ("wq", "wk", "wv", "wo")}, int8=fmt != "FP32")
    if fmt == "FP32":
        check(*run(args), TOL["float"])
    else:
        got, want, pure = run(args, int8=True)
        check(got, want, TOL["q8_emulated"], pure)


def one_hot_rows(rng, rows, cols):
    """[rows, cols]: a single 1.0 a row, in a random column.  A projection through it picks one
    input value exactly, so every summation order gives the same bits."""
    w = np.zeros((rows, cols), np.float32)
    w[np.arange(rows), rng.integers(0, cols, rows)] = 1.0
    return w


@pytest.mark.parametrize("shape", [("group-1", 128, 128, 2, 2, 64, 64),
                                   ("group-2", 128, 128, 4, 2, 64, 64),
                                   ("group-3", 192, 192, 3, 1, 64, 64),
                                   ("group-4", 128, 128, 4, 1, 20, 32),
                                   ("group-7", 224, 224, 7, 1, 32, 32)], ids=lambda s: s[0])
def test_one_token_attention_equals_prefill_bit_for_bit(simd_level, shape):
    """Decode's attention (keys in lanes for 1-4 query heads a kv group, the 8-wide query panel
    above) against prefill's 16-query blocks: one-hot projections make q, k, v and the output
    projection exact on both paths, so the outputs show the attention's own bits.  75 one-token
    calls after 10 cached positions equal one 75-token call: two tiles of keys, whole and partial
    key blocks, a head_dim (20) that is not a multiple of 8."""
    _, E, Ea, H, G, D, Da = shape
    T, S = 75, 10
    rng = np.random.default_rng(5)
    whole = prefill_case(shape, T, start_pos=S, bias=False)
    pad = np.arange(Da) >= D                                 # padded head dims: zero rows
    for name, heads in (("wq", H), ("wk", G), ("wv", G)):
        w = one_hot_rows(rng, heads * Da, Ea)
        w[np.tile(pad, heads)] = 0.0
        whole[name] = w
    wo = one_hot_rows(rng, Ea, H * Da)
    wo[:, np.tile(pad, H)] = 0.0
    wo[E:] = 0.0
    whole["wo"] = wo
    steps = copy_args(whole)
    megafuse.mega_fused_attention_prefill(**whole)
    one = dict(steps, tokens=1, scratch=np.zeros(
        megafuse.mega_fused_attention_prefill_scratch_size(1, Ea, H, Da), np.uint8))
    for t in range(T):
        one.update(output=steps["output"][t:t + 1], input=steps["input"][t:t + 1],
                   residual=steps["residual"][t:t + 1], start_pos=S + t)
        megafuse.mega_fused_attention_prefill(**one)
    for name in ("kv_cache_k", "kv_cache_v", "output"):
        np.testing.assert_array_equal(steps[name], whole[name], err_msg=name)


@pytest.mark.parametrize("T", [1, 9])
def test_int8_out_projection_of_one_32_wide_head(simd_level, T):
    """H * Da = 32: the quantized attention rows (a Q8_0 activation row of 32 values: 192 bytes)
    are wider than the float rows they replace in region A of scratch; the scratch layout makes
    room, and nothing past scratch_size is written."""
    args = prefill_case(("one-head-32", 64, 64, 1, 1, 32, 32), T,
                        formats={"wq": "Q8_0", "wk": "Q4_1", "wv": "Q5_0", "wo": "Q8_0"}, int8=True)
    need = args["scratch"].nbytes
    args["scratch"] = np.full(need + 256, 0x5A, np.uint8)
    got, want, pure = run(args, int8=True)
    assert np.all(got["scratch"][need:] == 0x5A), "the kernel wrote past scratch_size bytes"
    check(got, want, TOL["q8_emulated"], pure)
