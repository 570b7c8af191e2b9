"""mega_fused_attention_decode(_workspace) and mega_fuse_rmsnorm_qkv(_rope) against the NumPy
reference, across shapes, options, SIMD levels and thread counts."""
import numpy as np
import pytest

import megafuse
from megafuse import reference
from helpers import (LLAMA_STYLE, MHA, PADDED, QWEN2_05B, TOL, decode_case, decode_workspaces,
                     qkv_case, rel_err, without_rope)

SHAPES = [QWEN2_05B, LLAMA_STYLE, MHA, PADDED]


def run_both(case):
    """(kernel result case, reference result case), each on its own copy of every buffer."""
    got, want = case.copy(), case.copy()
    megafuse.mega_fused_attention_decode(**got.args)
    reference.mega_fused_attention_decode(**want.args)
    return got.args, want.args


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s[0])
def test_decode_matches_reference(simd_level, shape):
    got, want = run_both(decode_case(shape))
    assert rel_err(got["output"], want["output"]) < TOL["float"]
    assert rel_err(got["kv_cache_k"], want["kv_cache_k"]) < TOL["float"]
    assert rel_err(got["kv_cache_v"], want["kv_cache_v"]) < TOL["float"]
    # the reference and kernel are not the same trivial thing: the output moved off the input
    assert rel_err(got["output"], got["input"]) > 0.1


@pytest.mark.parametrize("option", ["no_bias", "no_residual", "no_rope", "all_off"])
@pytest.mark.parametrize("shape", [QWEN2_05B, PADDED], ids=lambda s: s[0])
def test_decode_options(simd_level, shape, option):
    kw = dict(bias=option not in ("no_bias", "all_off"),
              residual=option not in ("no_residual", "all_off"),
              rope=option not in ("no_rope", "all_off"))
    got, want = run_both(decode_case(shape, **kw))
    assert rel_err(got["output"], want["output"]) < TOL["float"]
    assert rel_err(got["kv_cache_k"], want["kv_cache_k"]) < TOL["float"]


@pytest.mark.parametrize("pos", ["first", "last"])
def test_decode_positions_at_cache_ends(simd_level, pos):
    C = 80
    p = 0 if pos == "first" else C - 1
    got, want = run_both(decode_case(QWEN2_05B, cache_capacity=C, pos=p))
    assert rel_err(got["output"], want["output"]) < TOL["float"]
    assert rel_err(got["kv_cache_v"], want["kv_cache_v"]) < TOL["float"]


def test_decode_long_context_crosses_many_kv_tiles(simd_level):
    # 700 keys: several KV tiles whatever tile the CPU picks, with a ragged last tile
    got, want = run_both(decode_case(LLAMA_STYLE, cache_capacity=720, pos=699))
    assert rel_err(got["output"], want["output"]) < TOL["float"]


def test_cache_changes_only_at_pos():
    case = decode_case(QWEN2_05B, pos=21)
    before_k, before_v = case.args["kv_cache_k"].copy(), case.args["kv_cache_v"].copy()
    megafuse.mega_fused_attention_decode(**case.args)
    for before, after in ((before_k, case.args["kv_cache_k"]), (before_v, case.args["kv_cache_v"])):
        changed = np.argwhere(np.any(before != after, axis=2))
        G = case.args["num_kv_heads"]
        assert sorted(map(tuple, changed)) == [(g, 21) for g in range(G)]


def test_padded_dims_written_as_zero():
    case = decode_case(PADDED, pos=3)
    case.args["kv_cache_k"][:] = 5.0   # garbage everywhere, padding included
    case.args["kv_cache_v"][:] = 5.0
    megafuse.mega_fused_attention_decode(**case.args)
    E, D = case.args["embed_dim"], case.args["head_dim"]
    assert np.all(case.args["output"][E:] == 0.0)
    assert np.all(case.args["kv_cache_k"][:, 3, D:] == 0.0)
    assert np.all(case.args["kv_cache_v"][:, 3, D:] == 0.0)
    assert np.all(np.isfinite(case.args["output"]))


def test_output_independent_of_input_padding():
    a = decode_case(PADDED)
    b = a.copy()
    E = a.args["embed_dim"]
    b.args["input"][E:] = -123.0
    b.args["residual"][E:] = np.nan
    megafuse.mega_fused_attention_decode(**a.args)
    megafuse.mega_fused_attention_decode(**b.args)
    assert np.array_equal(a.args["output"], b.args["output"])


@pytest.mark.parametrize("alias", ["input", "residual"])
def test_output_may_be_input_or_residual(simd_level, alias):
    case = decode_case(QWEN2_05B)
    out_of_place = case.copy()
    megafuse.mega_fused_attention_decode(**out_of_place.args)
    in_place = case.copy()
    in_place.args["output"] = in_place.args[alias]
    megafuse.mega_fused_attention_decode(**in_place.args)
    assert np.array_equal(in_place.args[alias], out_of_place.args["output"])


@pytest.mark.parametrize("shape", [QWEN2_05B, PADDED], ids=lambda s: s[0])
def test_workspace_variant_is_bitwise_equal(simd_level, shape):
    case = decode_case(shape)
    plain = case.copy()
    megafuse.mega_fused_attention_decode(**plain.args)
    ws = case.copy()
    q_ws, kv_ws = decode_workspaces(ws, extra=5)
    q_ws[:] = np.nan      # prior contents must not matter
    kv_ws[:] = np.nan
    megafuse.mega_fused_attention_decode_workspace(
        **ws.args, q_output_workspace=q_ws, q_output_workspace_bytes=q_ws.nbytes,
        kv_workspace=kv_ws, kv_workspace_bytes=kv_ws.nbytes)
    assert np.array_equal(ws.args["output"], plain.args["output"])
    assert np.array_equal(ws.args["kv_cache_k"], plain.args["kv_cache_k"])
    assert np.array_equal(ws.args["kv_cache_v"], plain.args["kv_cache_v"])
    # the workspace holds q: not left untouched
    assert np.isfinite(q_ws[:10]).all()


@pytest.mark.parametrize("shape", [QWEN2_05B, LLAMA_STYLE], ids=lambda s: s[0])
def test_one_and_two_threads_bitwise_equal(simd_level, threads, shape):
    case = decode_case(shape, cache_capacity=400, pos=333)
    results = []
    for n in (1, 2, 3):
        run = case.copy()
        megafuse.set_num_threads(n)
        megafuse.mega_fused_attention_decode(**run.args)
        results.append(run.args)
    for other in results[1:]:
        assert np.array_equal(results[0]["output"], other["output"])
        assert np.array_equal(results[0]["kv_cache_k"], other["kv_cache_k"])


def test_decode_then_decode_sequence_matches_reference(simd_level):
    # a run of tokens through one cache: each step reads what the previous ones wrote
    case = decode_case(QWEN2_05B, fill_cache=False, pos=0)
    got, want = case.copy(), case.copy()
    rng = np.random.default_rng(7)
    for p in range(6):
        x = rng.standard_normal(case.args["aligned_embed_dim"]).astype(np.float32)
        for c in (got, want):
            c.args["input"] = x.copy()
            c.args["pos"] = p
        megafuse.mega_fused_attention_decode(**got.args)
        reference.mega_fused_attention_decode(**want.args)
        assert rel_err(got.args["output"], want.args["output"]) < TOL["float"]


def test_decode_uses_the_kv_tile_it_reports():
    """Online-softmax rounding depends on where tiles start: a forced tile changes the bits,
    and forcing the reported tiles reproduces the default bits exactly."""
    from megafuse import _kernels
    case = decode_case(LLAMA_STYLE, cache_capacity=600, pos=590)
    default = case.copy()
    megafuse.mega_fused_attention_decode(**default.args)
    q_tile, kv_tile = megafuse.mega_fuse_get_optimal_tiles(case.args["head_dim"])
    outputs = {}
    try:
        for tile in sorted({kv_tile, 16, 48, 256}):
            _kernels._set_tile_override(q_tile, tile)
            run = case.copy()
            megafuse.mega_fused_attention_decode(**run.args)
            outputs[tile] = run.args["output"]
    finally:
        _kernels._set_tile_override(None, None)
    assert np.array_equal(outputs[kv_tile], default.args["output"])
    assert any(not np.array_equal(outputs[t], default.args["output"]) for t in outputs
               if t != kv_tile)
    want = case.copy()
    reference.mega_fused_attention_decode(**want.args)
    for out in outputs.values():
        assert rel_err(out, want.args["output"]) < TOL["float"]


def test_nan_input_propagates_to_every_output():
    case = decode_case(QWEN2_05B)
    case.args["input"][3] = np.nan
    megafuse.mega_fused_attention_decode(**case.args)
    assert np.isnan(case.args["output"][: case.args["embed_dim"]]).all()


def query_heads(args):
    """q [H, D] of the decode token (after RoPE), from the reference's projection."""
    a = args
    x = reference._f64(a["input"], (1, a["aligned_embed_dim"]))
    q, _, _ = reference._qkv_rows(
        x, a["ln1_gamma"], a["wq"], a["bq"], 0, a["wk"], a["bk"], 0, a["wv"], a["bv"], 0,
        a["rope_cos"], a["rope_sin"], np.array([a["pos"]]), a["embed_dim"],
        a["aligned_embed_dim"], a["num_heads"], a["num_kv_heads"], a["head_dim"],
        a["aligned_head_dim"], a["eps"], False)
    return q[0]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # inf - inf
@pytest.mark.parametrize("where", ["k-score-minus-inf", "k-score-plus-inf", "v-inf"])
def test_inf_in_the_cache_lands_where_the_math_puts_it(simd_level, where):
    """An infinity in a cached key or value (one kv head per query head: MHA):
    - a key whose score is -inf gets weight 0: every output stays finite and equals the reference;
    - a key whose score is +inf makes that head's softmax inf - inf = NaN, which the out-projection
      spreads over every output;
    - an infinite value reaches every output as +-inf, the sign of its out-projection weight.
    In each case the NaN / +inf / -inf pattern is the reference's, and the finite values match."""
    case = decode_case(MHA)
    a = case.args
    q = query_heads(a)                                       # [H, D]
    head = 1
    d = int(np.argmax(np.abs(q[head])))
    if where == "k-score-minus-inf":
        a["kv_cache_k"][head, 2, d] = -np.sign(q[head, d]) * np.inf
    elif where == "k-score-plus-inf":
        a["kv_cache_k"][head, 2, d] = np.sign(q[head, d]) * np.inf
    else:
        a["kv_cache_v"][head, 5, 3] = np.inf
    got, want = run_both(case)
    out, ref = got["output"], want["output"]
    E = a["embed_dim"]
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert np.array_equal(np.isinf(out), np.isinf(ref))
    assert np.array_equal(np.sign(out[np.isinf(out)]), np.sign(ref[np.isinf(ref)]))
    finite = np.isfinite(ref)
    if finite.any():
        assert rel_err(out[finite], ref[finite]) < TOL["float"]
    if where == "k-score-minus-inf":
        assert finite.all()
    elif where == "k-score-plus-inf":
        assert np.isnan(out[:E]).all()
    else:                                                    # +-inf by the weights' signs
        wo = a["wo"].reshape(E, -1)[:, head * a["aligned_head_dim"] + 3]
        assert np.array_equal(np.sign(out[:E]), np.sign(wo)) and np.isinf(out[:E]).all()


# ---- mega_fuse_rmsnorm_qkv / _rope -----------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rope", [True, False])
def test_rmsnorm_qkv_rope_matches_reference(simd_level, bias, rope):
    args = qkv_case(bias=bias, rope=rope)
    got = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    megafuse.mega_fuse_rmsnorm_qkv_rope(**got)
    reference.mega_fuse_rmsnorm_qkv_rope(**want)
    for name in ("q_out", "k_out", "v_out"):
        assert rel_err(got[name], want[name]) < TOL["float"], name


@pytest.mark.parametrize("bias", [True, False])
def test_rmsnorm_qkv_matches_reference(simd_level, bias):
    args = without_rope(qkv_case(bias=bias, hidden=896, H=14, G=2, D=64))
    got = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    megafuse.mega_fuse_rmsnorm_qkv(**got)
    reference.mega_fuse_rmsnorm_qkv(**want)
    for name in ("q_out", "k_out", "v_out"):
        assert rel_err(got[name], want[name]) < TOL["float"], name


def test_rmsnorm_qkv_rope_at_pos_zero_is_no_rotation():
    args = qkv_case(pos=0)
    plain = without_rope(args)
    rotated = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    unrotated = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in plain.items()}
    megafuse.mega_fuse_rmsnorm_qkv_rope(**rotated)
    megafuse.mega_fuse_rmsnorm_qkv(**unrotated)
    for name in ("q_out", "k_out", "v_out"):
        assert np.array_equal(rotated[name], unrotated[name])


def test_rmsnorm_qkv_agrees_with_decode_projection():
    """The unaligned phase function and the fused decode compute the same q/k (via the cache)."""
    case = decode_case(QWEN2_05B, bias=True, residual=False, pos=4)
    a = case.args
    H, G, D = a["num_heads"], a["num_kv_heads"], a["head_dim"]
    qkv = dict(q_out=np.zeros(H * D, np.float32), k_out=np.zeros(G * D, np.float32),
               v_out=np.zeros(G * D, np.float32), input=a["input"], gamma=a["ln1_gamma"],
               W_qkv=np.concatenate([a["wq"], a["wk"], a["wv"]]),
               b_qkv=np.concatenate([a["bq"], a["bk"], a["bv"]]),
               rope_cos=a["rope_cos"], rope_sin=a["rope_sin"], pos=4, hidden=a["embed_dim"],
               num_heads=H, num_kv_heads=G, head_dim=D, max_seq=a["rope_cos"].shape[0],
               eps=a["eps"])
    megafuse.mega_fuse_rmsnorm_qkv_rope(**qkv)
    megafuse.mega_fused_attention_decode(**a)
    assert rel_err(a["kv_cache_k"][:, 4, :].reshape(-1), qkv["k_out"]) < TOL["float"]
    assert rel_err(a["kv_cache_v"][:, 4, :].reshape(-1), qkv["v_out"]) < TOL["float"]


def test_kernels_release_the_gil(threads):
    """A Python thread makes progress while kernel calls run -- which it could not if a call
    held the GIL: the ticks it records fall inside the calls (the first and last 20 ms of each
    left out: the thread may run just before a call takes over).  Calls are repeated until
    0.2 s inside them can be looked at (on a machine whose load changes, calls can get
    shorter), and the prompt is made longer until one call takes 0.1 s, so a fast machine tells
    as well as a slow one (a call of ~40 ms would leave nothing to look at)."""
    import threading
    import time
    from helpers import prefill_case
    megafuse.set_num_threads(1)                    # leave a core to the Python thread
    tokens = 192
    while True:
        args = prefill_case(LLAMA_STYLE, tokens, bias=False)
        t0 = time.perf_counter()
        megafuse.mega_fused_attention_prefill(**args)
        if time.perf_counter() - t0 >= 0.1 or tokens >= 3072:
            break
        tokens *= 2
    ticks, stop, calls = [], threading.Event(), []

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)                      # (the GIL is free between ticks)

    thread = threading.Thread(target=tick)
    thread.start()
    time.sleep(0.05)
    window, started = 0.0, time.perf_counter()     # the time inside calls, 20 ms off each end
    while window < 0.2 and time.perf_counter() - started < 30:
        t0 = time.perf_counter()
        megafuse.mega_fused_attention_prefill(**args)
        calls.append((t0, time.perf_counter()))
        window += max(0.0, calls[-1][1] - t0 - 0.04)
    stop.set()
    thread.join()
    inside = [t for t in ticks if any(t0 + 0.02 < t < t1 - 0.02 for t0, t1 in calls)]
    assert window > 0.1, f"{len(calls)} calls left {window:.3f} s to look at: too short to tell"
    assert len(inside) >= 10, (f"{len(inside)} ticks of the Python thread during {len(calls)} "
                               f"kernel calls ({window:.2f} s inside them)")


def test_concurrent_calls_from_two_threads_equal_serial():
    """Two Python threads each running decode on their own buffers: both finish, results equal
    the serial ones (no shared state between calls)."""
    import threading
    cases = [decode_case(LLAMA_STYLE, cache_capacity=300, pos=250, seed=s) for s in (1, 2)]
    serial = [c.copy() for c in cases]
    for c in serial:
        megafuse.mega_fused_attention_decode(**c.args)
    errors = []

    def work(case):
        try:
            for _ in range(5):
                megafuse.mega_fused_attention_decode(**case.args)
        except Exception as e:  # noqa: BLE001 -- any failure in a thread: asserted none below
            errors.append(e)
    threads_ = [threading.Thread(target=work, args=(c,)) for c in cases]
    for t in threads_:
        t.start()
    for t in threads_:
        t.join()
    assert not errors
    for c, s in zip(cases, serial):
        assert np.array_equal(c.args["output"], s.args["output"])


# The attention blocks of decode: the query heads of a kv group go through one block of up to 16
# (mf_attend_block_f32); more heads a group take several blocks, head dims above 256 the 3-head
# path.  Odd head dims leave a tail past the last 16 dims.
@pytest.mark.parametrize("shape", [
    ("group-of-18", 128, 128, 36, 2, 16, 16),
    ("wide-head", 60, 64, 2, 1, 260, 264),
    ("odd-head", 96, 96, 5, 1, 20, 24),
], ids=lambda s: s[0])
@pytest.mark.parametrize("pos", [0, 70, 300])
def test_attention_block_shapes(simd_level, shape, pos):
    got, want = run_both(decode_case(shape, cache_capacity=320, pos=pos))
    for name in ("output", "kv_cache_k", "kv_cache_v"):
        assert rel_err(got[name], want[name]) < TOL["float"], name


# Split-KV decode: past 512 keys the keys are cut into ranges (the count fixed by the position,
# the heads and head_dim, capped so the parts fit 64 KiB) whose parts are combined per head.
@pytest.mark.parametrize("shape, pos", [
    (("mqa", 128, 128, 4, 1, 64, 64), 1500),            # one kv group: ranges are the only split
    (("many-heads", 256, 256, 64, 4, 64, 64), 2999),    # 64 heads: the stack caps it at 3 ranges
    (("qwen-like", 896, 896, 14, 2, 64, 64), 512),      # 513 keys: two ranges, 257 and 256 keys
    (("odd-head", 96, 96, 5, 1, 20, 24), 1100),
], ids=lambda v: v[0] if isinstance(v, tuple) else str(v))
def test_split_kv_long_context(simd_level, shape, pos):
    got, want = run_both(decode_case(shape, cache_capacity=pos + 8, pos=pos))
    for name in ("output", "kv_cache_k", "kv_cache_v"):
        assert rel_err(got[name], want[name]) < TOL["float"], name


def test_split_kv_is_bitwise_thread_independent(threads):
    case = decode_case(("mqa", 128, 128, 4, 1, 64, 64), cache_capacity=2100, pos=2047)
    outputs = []
    for n in (1, 2, 3):
        megafuse.set_num_threads(n)
        got = case.copy()
        megafuse.mega_fused_attention_decode(**got.args)
        outputs.append(got.args["output"])
    assert np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[0], outputs[2])


def split_kv_ranges(pos, H, Da):
    """The key ranges split-KV decode cuts positions 0..pos into (kernels/levels/attention.pxi,
    attend_one_token: ranges of at least SPLIT_MIN_KEYS = 512 keys, at most what fits
    SPLIT_PART_FLOATS = 16384 floats of parts)."""
    n_seg = min((pos + 512) // 512, 16384 // (H * (Da + 2)))
    seg_len = (pos + n_seg) // n_seg
    return [(s * seg_len, min(pos + 1, (s + 1) * seg_len)) for s in range(n_seg)]


def test_split_kv_range_of_a_single_key(threads):
    """261633 keys in 512 ranges of 512: the last range holds one key, the token's own.  Every
    other cached key is 0 (score 0, value 0) and wk = wq makes the token's own score large, so
    the attention output is (nearly) its own value: a range dropped, or counted twice, would
    move the output by O(1).  Bitwise the same for 1, 2 and 3 threads."""
    pos = 261632
    shape = ("one-key-range", 64, 64, 1, 1, 4, 4)
    ranges = split_kv_ranges(pos, 1, 4)
    assert len(ranges) == 512 and ranges[-1] == (pos, pos + 1)
    case = decode_case(shape, cache_capacity=pos + 1, pos=pos, fill_cache=False, bias=False)
    a = case.args
    a["wq"] *= 6.0
    a["wk"][:] = a["wq"]                           # q . k = |q|^2 > 0 for the token's own key
    q = query_heads(a)[0]
    assert q @ q / 2 > 20                          # exp(score) >> 261632 keys of score 0
    outputs = []
    for n in (1, 2, 3):
        megafuse.set_num_threads(n)
        got, want = run_both(case)
        outputs.append(got["output"])
        assert rel_err(got["output"], want["output"]) < TOL["float"]
    assert np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[0], outputs[2])
    # without the last range's key the attention output would be ~0: the out-projection moves
    no_attention = a["residual"].astype(np.float64)
    assert rel_err(no_attention, want["output"]) > 0.05
