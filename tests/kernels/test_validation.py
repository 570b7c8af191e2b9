"""docs/contract.md §5 for the decode and rmsnorm_qkv entry points: each rule has a test; every
rejected call leaves output, caches and workspaces byte-identical."""
import warnings

import numpy as np
import pytest

import megafuse
from helpers import PADDED, QWEN2_05B, decode_case, decode_workspaces, qkv_case, without_rope


def call_decode(args, workspace=False):
    if workspace:
        megafuse.mega_fused_attention_decode_workspace(**args)
    else:
        megafuse.mega_fused_attention_decode(**args)


def ws_args(case):
    q_ws, kv_ws = decode_workspaces(case)
    return dict(case.args, q_output_workspace=q_ws, q_output_workspace_bytes=q_ws.nbytes,
                kv_workspace=kv_ws, kv_workspace_bytes=kv_ws.nbytes)


def writeable_snapshot(args):
    return {k: v.tobytes() for k, v in args.items()
            if isinstance(v, np.ndarray) and v.flags.writeable}


def f32(n):
    return np.zeros(n, dtype=np.float32)


# (id, mutation of the args dict, exception, words the message must contain)
DECODE_RULES = [
    # wrong dtype / not an array -> TypeError
    ("input-float64", lambda a: a.update(input=a["input"].astype(np.float64)), TypeError,
     ["input", "float32", "float64"]),
    ("wq-list", lambda a: a.update(wq=a["wq"].tolist()), TypeError, ["wq", "ndarray", "list"]),
    ("output-int32", lambda a: a.update(output=np.zeros(a["output"].shape, np.int32)), TypeError,
     ["output", "float32"]),
    ("cache-byteswapped", lambda a: a.update(
        kv_cache_k=a["kv_cache_k"].astype(">f4")), TypeError, ["kv_cache_k", "native"]),
    ("gamma-none", lambda a: a.update(ln1_gamma=None), TypeError, ["ln1_gamma", "NoneType"]),
    ("wo-none", lambda a: a.update(wo=None), TypeError, ["wo"]),
    # dims <= 0 -> ValueError
    ("embed_dim-0", lambda a: a.update(embed_dim=0), ValueError, ["embed_dim", "positive", "0"]),
    ("num_heads-neg", lambda a: a.update(num_heads=-2), ValueError, ["num_heads", "-2"]),
    ("num_kv_heads-0", lambda a: a.update(num_kv_heads=0), ValueError, ["num_kv_heads"]),
    ("head_dim-0", lambda a: a.update(head_dim=0), ValueError, ["head_dim"]),
    ("cache_capacity-0", lambda a: a.update(cache_capacity=0, pos=0), ValueError,
     ["cache_capacity"]),
    # int beyond the C type -> OverflowError
    ("pos-huge", lambda a: a.update(pos=2 ** 40), OverflowError, []),
    ("pos-float", lambda a: a.update(pos=3.0), TypeError, []),
    # wrong size
    ("wq-size", lambda a: a.update(wq=a["wq"][:-1].copy()), ValueError,
     ["wq", "num_heads*aligned_head_dim", "elements"]),
    ("bq-size", lambda a: a.update(bq=f32(3)), ValueError, ["bq", "3"]),
    ("residual-size", lambda a: a.update(residual=f32(7)), ValueError, ["residual"]),
    ("gamma-padded-size", lambda a: a.update(ln1_gamma=f32(a["aligned_embed_dim"] + 1)),
     ValueError, ["ln1_gamma", "embed_dim"]),
    ("cache-size", lambda a: a.update(kv_cache_v=a["kv_cache_v"][:, :-1].copy()), ValueError,
     ["kv_cache_v", "cache_capacity"]),
    # non-contiguous, read-only
    ("input-strided", lambda a: a.update(input=np.repeat(a["input"], 2)[::2]), ValueError,
     ["input", "contiguous"]),
    ("output-readonly", lambda a: a["output"].setflags(write=False), ValueError,
     ["output", "writeable"]),
    ("cache-readonly", lambda a: a["kv_cache_k"].setflags(write=False), ValueError,
     ["kv_cache_k", "writeable"]),
    ("unaligned", lambda a: a.update(
        input=np.frombuffer(np.zeros(a["aligned_embed_dim"] * 4 + 1, np.uint8).data, np.float32,
                            a["aligned_embed_dim"], 1)), ValueError, ["input", "aligned"]),
    # positions
    ("pos-eq-capacity", lambda a: a.update(pos=a["cache_capacity"]), ValueError,
     ["pos", "cache_capacity"]),
    ("pos-negative", lambda a: a.update(pos=-1), ValueError, ["pos"]),
    ("rope-too-short", lambda a: a.update(rope_cos=a["rope_cos"][:10].copy(),
                                          rope_sin=a["rope_sin"][:10].copy()), ValueError,
     ["rope_cos", "position 37"]),
    ("rope-partial-row", lambda a: a.update(rope_sin=a["rope_sin"].reshape(-1)[:-1].copy()),
     ValueError, ["rope_sin", "whole rows"]),
    ("rope-one-none", lambda a: a.update(rope_sin=None), ValueError, ["rope_cos", "rope_sin"]),
    # aligned < unaligned, heads, odd head_dim with rope
    ("aligned-embed-small", lambda a: a.update(aligned_embed_dim=a["embed_dim"] - 1), ValueError,
     ["aligned_embed_dim", "embed_dim"]),
    ("aligned-head-small", lambda a: a.update(aligned_head_dim=a["head_dim"] - 2), ValueError,
     ["aligned_head_dim"]),
    ("heads-not-multiple", lambda a: a.update(num_kv_heads=4), ValueError,
     ["num_heads", "multiple", "num_kv_heads"]),
    ("odd-head-dim-rope", lambda a: a.update(head_dim=a["head_dim"] - 1), ValueError,
     ["head_dim", "even"]),
    # overlapping buffers
    ("cache-k-is-v", lambda a: a.update(kv_cache_v=a["kv_cache_k"]), ValueError,
     ["kv_cache_k", "overlaps", "kv_cache_v"]),
    ("output-overlaps-input", lambda a: a.update(
        output=np.zeros(a["aligned_embed_dim"] + 8, np.float32)[8:],
        input=None) or a.update(input=a["output"].base[:a["aligned_embed_dim"]]), ValueError,
     ["overlaps"]),
    ("output-is-cache",
     lambda a: a.update(output=a["kv_cache_k"].reshape(-1)[:a["aligned_embed_dim"]]),
     ValueError, ["overlaps"]),
]


@pytest.mark.parametrize("rule", DECODE_RULES, ids=[r[0] for r in DECODE_RULES])
@pytest.mark.parametrize("workspace", [False, True], ids=["decode", "workspace"])
def test_decode_rejects(rule, workspace):
    _, mutate, exc, words = rule
    case = decode_case(PADDED)
    args = ws_args(case) if workspace else dict(case.args)
    mutate(args)
    snapshot = writeable_snapshot(args)
    with pytest.raises(exc) as info:
        call_decode(args, workspace)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot, "a rejected call wrote to a buffer"


def _workspace_holding_output(a):
    """q_output_workspace large enough, but output lives inside it."""
    big = np.zeros(a["q_output_workspace"].size + a["aligned_embed_dim"], np.float32)
    a.update(q_output_workspace=big, q_output_workspace_bytes=big.nbytes,
             output=big[-a["aligned_embed_dim"]:])


WORKSPACE_RULES = [
    ("q-ws-small", lambda a: a.update(q_output_workspace=f32(3), q_output_workspace_bytes=12),
     ValueError, ["q_output_workspace", "at least"]),
    ("q-bytes-small", lambda a: a.update(q_output_workspace_bytes=8), ValueError,
     ["q_output_workspace_bytes", "at least"]),
    ("kv-bytes-beyond-array", lambda a: a.update(kv_workspace_bytes=a["kv_workspace"].nbytes + 4),
     ValueError, ["kv_workspace_bytes", "at most"]),
    ("kv-bytes-zero", lambda a: a.update(kv_workspace_bytes=0), ValueError,
     ["kv_workspace_bytes"]),
    ("kv-bytes-negative", lambda a: a.update(kv_workspace_bytes=-4), OverflowError, []),
    ("kv-ws-float64", lambda a: a.update(kv_workspace=np.zeros(1000)), TypeError,
     ["kv_workspace", "float32"]),
    ("q-ws-readonly", lambda a: a["q_output_workspace"].setflags(write=False), ValueError,
     ["q_output_workspace", "writeable"]),
    ("ws-overlaps-output", lambda a: _workspace_holding_output(a), ValueError, ["overlaps"]),
    ("ws-shared", lambda a: a.update(kv_workspace=a["q_output_workspace"],
                                     kv_workspace_bytes=a["q_output_workspace"].nbytes),
     ValueError, ["overlaps"]),
]


@pytest.mark.parametrize("rule", WORKSPACE_RULES, ids=[r[0] for r in WORKSPACE_RULES])
def test_decode_workspace_rejects(rule):
    _, mutate, exc, words = rule
    args = ws_args(decode_case(QWEN2_05B))
    mutate(args)
    snapshot = writeable_snapshot(args)
    with pytest.raises(exc) as info:
        megafuse.mega_fused_attention_decode_workspace(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot


def test_decode_accepts_larger_workspaces_and_any_shape():
    case = decode_case(QWEN2_05B)
    args = ws_args(case)
    args["q_output_workspace"] = np.zeros((2, 1000), np.float32)
    args["q_output_workspace_bytes"] = 8000
    args["kv_cache_k"] = args["kv_cache_k"].reshape(-1)    # only the element count matters
    megafuse.mega_fused_attention_decode_workspace(**args)
    assert np.isfinite(args["output"]).all()


def test_decode_accepts_readonly_inputs():
    case = decode_case(QWEN2_05B)
    for name in ("input", "ln1_gamma", "wq", "wk", "wv", "wo", "bq", "rope_cos", "rope_sin"):
        case.args[name].setflags(write=False)
    megafuse.mega_fused_attention_decode(**case.args)
    assert np.isfinite(case.args["output"]).all()


QKV_RULES = [
    ("hidden-0", lambda a: a.update(hidden=0), ValueError, ["hidden"]),
    ("max_seq-0", lambda a: a.update(max_seq=0, pos=0), ValueError, ["max_seq"]),
    ("pos-ge-max_seq", lambda a: a.update(pos=a["max_seq"]), ValueError, ["pos", "max_seq"]),
    ("W-size", lambda a: a.update(W_qkv=a["W_qkv"][:-1].copy()), ValueError, ["W_qkv"]),
    ("b-size", lambda a: a.update(b_qkv=f32(5)), ValueError, ["b_qkv"]),
    ("q_out-size", lambda a: a.update(q_out=f32(5)), ValueError, ["q_out"]),
    ("k_out-float16", lambda a: a.update(k_out=a["k_out"].astype(np.float16)), TypeError,
     ["k_out"]),
    ("v_out-readonly", lambda a: a["v_out"].setflags(write=False), ValueError,
     ["v_out", "writeable"]),
    ("heads", lambda a: a.update(num_heads=5), ValueError, ["num_heads", "multiple"]),
    ("rope-short", lambda a: a.update(rope_cos=a["rope_cos"][:2].copy()), ValueError,
     ["rope_cos"]),
    # [max_seq, D/2] tables: fewer rows than max_seq are refused whatever pos is
    ("rope-shorter-than-max_seq-pos-0", lambda a: a.update(max_seq=a["max_seq"] + 1, pos=0),
     ValueError, ["rope_cos", "max_seq"]),
    ("rope-sin-shorter-than-max_seq", lambda a: a.update(rope_sin=a["rope_sin"][:-1].copy()),
     ValueError, ["rope_sin", "max_seq"]),
    ("k-is-v", lambda a: a.update(v_out=a["k_out"]), ValueError, ["overlaps"]),
    ("q-is-input", lambda a: a.update(q_out=np.zeros(a["hidden"], np.float32),
                                      num_heads=a["hidden"] // a["head_dim"]) or
     a.update(input=a["q_out"]), ValueError, ["overlaps"]),
]


@pytest.mark.parametrize("rule", QKV_RULES, ids=[r[0] for r in QKV_RULES])
def test_rmsnorm_qkv_rope_rejects(rule):
    _, mutate, exc, words = rule
    args = qkv_case()
    mutate(args)
    snapshot = writeable_snapshot(args)
    with pytest.raises(exc) as info:
        megafuse.mega_fuse_rmsnorm_qkv_rope(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot


def test_rmsnorm_qkv_rejects_bad_sizes():
    args = without_rope(qkv_case())
    args["input"] = f32(3)
    with pytest.raises(ValueError, match="input"):
        megafuse.mega_fuse_rmsnorm_qkv(**args)
    args = without_rope(qkv_case())
    args["gamma"] = args["gamma"].astype(np.float64)
    with pytest.raises(TypeError, match="gamma"):
        megafuse.mega_fuse_rmsnorm_qkv(**args)


@pytest.mark.parametrize("call", [
    lambda: megafuse.mega_fuse_get_optimal_tiles(0),
    lambda: megafuse.mega_fuse_get_optimal_tiles(-64),
    lambda: megafuse.mega_fuse_report_stats(0, 24, 128),
    lambda: megafuse.mega_fuse_report_stats(896, 0, 128),
    lambda: megafuse.mega_fuse_report_stats(896, 24, -1),
])
def test_size_arguments_must_be_positive(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("bad", [0, -1, "2", 2.5])
def test_set_num_threads_rejects(threads, bad):
    with pytest.raises((ValueError, TypeError)):
        megafuse.set_num_threads(bad)


def test_fuzzed_arguments_never_crash():
    """Random mixes of wrong sizes/dims: always a Python exception or a valid run, never a
    crash; the cache is untouched whenever the call raised."""
    rng = np.random.default_rng(123)
    keys = ["embed_dim", "aligned_embed_dim", "num_heads", "num_kv_heads", "head_dim",
            "aligned_head_dim", "cache_capacity", "pos"]
    for _ in range(300):
        case = decode_case(PADDED, cache_capacity=16, pos=3)
        args = dict(case.args)
        for key in rng.choice(keys, size=rng.integers(1, 4), replace=False):
            args[key] = int(args[key] + rng.integers(-3, 4) * rng.choice([1, 8, 1000]))
        snapshot = writeable_snapshot(args)
        try:
            megafuse.mega_fused_attention_decode(**args)
        except (ValueError, TypeError, OverflowError):
            assert writeable_snapshot(args) == snapshot


# ---- prefill ----------------------------------------------------------------------------------

from helpers import prefill_case  # noqa: E402

PREFILL_RULES = [
    ("tokens-0", lambda a: a.update(tokens=0), ValueError, ["tokens"]),
    ("start_pos-neg", lambda a: a.update(start_pos=-1), ValueError, ["start_pos"]),
    ("past-capacity", lambda a: a.update(start_pos=a["cache_capacity"] - a["tokens"] + 1),
     ValueError, ["start_pos", "cache_capacity"]),
    ("rope-short", lambda a: a.update(rope_cos=a["rope_cos"][:a["tokens"] - 1].copy(),
                                      rope_sin=a["rope_sin"][:a["tokens"] - 1].copy()),
     ValueError, ["rope_cos", "position"]),
    ("dt-float", lambda a: a.update(wq_dt=9.0), TypeError, ["wq_dt"]),
    ("dt-out-of-enum", lambda a: a.update(wk_dt=99), ValueError, ["wk_dt", "99"]),
    ("dt-count", lambda a: a.update(wk_dt=int(megafuse.CKDataType.COUNT)), ValueError, ["wk_dt"]),
    ("dt-int8", lambda a: a.update(wv_dt=megafuse.CK_DT_INT8), ValueError,
     ["wv_dt", "weight format", "INT8"]),
    ("dt-int4", lambda a: a.update(wv_dt=megafuse.CK_DT_INT4), ValueError, ["wv_dt", "INT4"]),
    ("dt-q8_k", lambda a: a.update(wo_dt=megafuse.CK_DT_Q8_K), ValueError, ["wo_dt", "Q8_K"]),
    ("fp32-array-as-q8_0", lambda a: a.update(wq_dt=megafuse.CK_DT_Q8_0), TypeError,
     ["wq", "uint8", "float32"]),
    ("q8_0-bytes-as-fp32", lambda a: a.update(wo=np.zeros(a["wo"].nbytes // 4, np.float32),
                                              wo_dt=megafuse.CK_DT_FP32) or
     a.update(wo=np.zeros(7, np.float32)), ValueError, ["wo"]),
    ("bf16-as-float16", lambda a: a.update(wk=a["wk"].astype(np.float16),
                                           wk_dt=megafuse.CK_DT_BF16), TypeError,
     ["wk", "uint16"]),
    ("kquant-896-columns", lambda a: a.update(wq_dt=megafuse.CK_DT_Q4_K,
                                              wq=np.zeros(10, np.uint8)), ValueError,
     ["wq", "Q4_K", "blocks of 256", "896"]),
    ("block-byte-count", lambda a: a.update(
        wq_dt=megafuse.CK_DT_Q8_0,
        wq=np.zeros(896 * megafuse.ck_dtype_row_bytes(megafuse.CK_DT_Q8_0, 896) - 1, np.uint8)),
     ValueError, ["wq", "Q8_0", "bytes"]),
    ("scratch-small", lambda a: a.update(scratch=a["scratch"][:-1].copy()), ValueError,
     ["scratch", "at least"]),
    ("scratch-readonly", lambda a: a["scratch"].setflags(write=False), ValueError,
     ["scratch", "writeable"]),
    ("scratch-list", lambda a: a.update(scratch=[0] * 10), TypeError, ["scratch"]),
    ("scratch-none", lambda a: a.update(scratch=None), TypeError, ["scratch"]),
    ("cache-inside-scratch", lambda a: a.update(
        kv_cache_k=a["scratch"][:a["kv_cache_k"].nbytes].view(np.float32)), ValueError,
     ["overlaps"]),
    ("output-size", lambda a: a.update(output=a["output"][:-1].copy()), ValueError,
     ["output", "tokens"]),
    ("residual-none-ok-but-input-bad", lambda a: a.update(residual=None,
                                                         input=a["input"].astype(np.float16)),
     TypeError, ["input"]),
    ("heads", lambda a: a.update(num_kv_heads=4), ValueError, ["num_heads", "multiple"]),
]


@pytest.mark.parametrize("rule", PREFILL_RULES, ids=[r[0] for r in PREFILL_RULES])
@pytest.mark.parametrize("variant", ["float", "int8"])
def test_prefill_rejects(rule, variant):
    _, mutate, exc, words = rule
    int8 = variant == "int8"
    args = prefill_case(QWEN2_05B, 5, cache_capacity=12, int8=int8)
    mutate(args)
    snapshot = writeable_snapshot(args)
    kernel = (megafuse.mega_fused_attention_prefill_q8_0 if int8
              else megafuse.mega_fused_attention_prefill)
    with pytest.raises(exc) as info:
        kernel(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot, "a rejected call wrote to a buffer"


@pytest.mark.parametrize("call", [
    lambda: megafuse.mega_fused_attention_prefill_scratch_size(0, 896, 14, 64),
    lambda: megafuse.mega_fused_attention_prefill_scratch_size(4, -896, 14, 64),
    lambda: megafuse.mega_fused_attention_prefill_q8_0_scratch_size(4, 896, 0, 64),
    lambda: megafuse.mega_fused_attention_prefill_q8_0_scratch_size(4, 896, 14, 0),
])
def test_prefill_scratch_size_rejects(call):
    with pytest.raises(ValueError):
        call()


# ---- every call checks afresh -------------------------------------------------------------------
# The boundary's fast paths remember nothing between calls: an argument that breaks a rule after
# a valid call with the same objects is refused as on a first call, and a new array of the same
# shape is read where it is now (never where an earlier call's array was).

@pytest.mark.parametrize("rule", DECODE_RULES, ids=[r[0] for r in DECODE_RULES])
def test_decode_checks_again_after_a_valid_call(rule):
    _, mutate, exc, words = rule
    case = decode_case(PADDED)
    args = ws_args(case)
    call_decode(dict(args, pos=args["pos"] - 1), True)      # valid, with the same objects
    mutate(args)
    snapshot = writeable_snapshot(args)
    with pytest.raises(exc) as info:
        call_decode(args, True)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot, "a rejected call wrote to a buffer"


@pytest.mark.parametrize("rule", PREFILL_RULES, ids=[r[0] for r in PREFILL_RULES])
def test_prefill_checks_again_after_a_valid_call(rule):
    _, mutate, exc, words = rule
    args = prefill_case(QWEN2_05B, 5, cache_capacity=12, int8=True)
    megafuse.mega_fused_attention_prefill_q8_0(**args)        # valid, with the same objects
    mutate(args)
    snapshot = writeable_snapshot(args)
    with pytest.raises(exc) as info:
        megafuse.mega_fused_attention_prefill_q8_0(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"
    assert writeable_snapshot(args) == snapshot, "a rejected call wrote to a buffer"


def _in_place_changes():
    """(id, change made to an argument array in place after a valid call, exception, words)."""
    def retype(a):
        # the same object and buffer, another dtype: NumPy 2.5 deprecates setting .dtype, and
        # while a NumPy allows it the checks must see it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                a["input"].dtype = np.int32
            except (AttributeError, TypeError) as e:
                pytest.skip(f"this NumPy cannot change an array's dtype in place: {e}")

    def shrink(a):
        a["wq"].resize(a["wq"].size - 4, refcheck=False)    # the same object, fewer elements

    return [("input-retyped", retype, TypeError, ["input", "float32", "int32"]),
            ("wq-shrunk", shrink, ValueError, ["wq", "elements"]),
            ("output-made-readonly", lambda a: a["output"].setflags(write=False), ValueError,
             ["output", "writeable"])]


@pytest.mark.parametrize("change", _in_place_changes(), ids=lambda c: c[0])
def test_decode_sees_an_array_changed_in_place(change):
    _, mutate, exc, words = change
    case = decode_case(PADDED)
    args = ws_args(case)
    for name in ("input", "wq", "output"):
        args[name] = args[name].copy()         # arrays of their own, so resize may move them
    call_decode(dict(args, pos=args["pos"] - 1), True)
    mutate(args)
    with pytest.raises(exc) as info:
        call_decode(args, True)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!r}"


def test_a_new_array_of_the_same_shape_is_read_where_it_is():
    """Two calls with equal shapes and different weight arrays: the second reads its own
    weights, bit for bit what a first call with them gives."""
    base = prefill_case(QWEN2_05B, 1, start_pos=3, cache_capacity=8, int8=True,
                        formats={"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q8_0"})
    other = prefill_case(QWEN2_05B, 1, start_pos=3, cache_capacity=8, int8=True, seed=5,
                         formats={"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q8_0"})
    fresh = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in base.items()}
    swapped = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in base.items()}
    megafuse.mega_fused_attention_prefill_q8_0(**swapped)       # the base weights first
    swapped.update(kv_cache_k=base["kv_cache_k"].copy(), kv_cache_v=base["kv_cache_v"].copy())
    for name in ("wq", "wk", "wv", "wo"):
        swapped[name] = other[name].copy()
        fresh[name] = other[name].copy()
    megafuse.mega_fused_attention_prefill_q8_0(**swapped)
    megafuse.mega_fused_attention_prefill_q8_0(**fresh)
    assert swapped["output"].tobytes() == fresh["output"].tobytes()
    assert swapped["kv_cache_k"].tobytes() == fresh["kv_cache_k"].tobytes()
