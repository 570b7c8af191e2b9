"""Hostile dimensions (docs/contract.md §5): no combination of integer arguments makes a header
function read or write out of bounds.

Every element and byte count the checks compute is a checked product: a count past 64 bits is a
ValueError naming the parameters, never a number that wrapped around to match a small buffer.
Each header function meets dimensions near 2**31 and products past 2**63 here, and a seeded fuzz
of random huge dimensions (in a child process, so that a crash is a failure with its seed, not
the end of the test run) must raise ValueError every time and leave every writeable buffer as it
was.  The scratch-size helpers raise rather than return a wrapped number: what they return is
checked against the layout of include/megafuse/mf_scratch.h computed here in Python integers.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import megafuse
from megafuse import _kernels
from helpers import (DT, block_bytes, decode_case, decode_workspaces, mlp_case,
                     outproj_mlp_case, prefill_case, qkv_case, without_rope)

HERE = os.path.dirname(os.path.abspath(__file__))
BIG = 2**31 - 1                       # the largest C int
# the issue's example: H * Da = 2**56 + 2, so H * Da * 256 = 2**64 + 512 wraps to 512 elements
ISSUE_H, ISSUE_DA = 1614112203, 44642246
assert ISSUE_H * ISSUE_DA == 2**56 + 2

DECODE_SHAPE = ("tiny", 64, 64, 2, 1, 32, 32)      # (name, E, Ea, H, G, D, Da)
MLP_SHAPE = ("tiny", 64, 64, 2, 32, 96, 96)        # (name, E, Ea, H, Da, I, Ia)


# ---- the functions, with small valid arguments ---------------------------------------------------

def _decode_ws(case):
    q_ws, kv_ws = decode_workspaces(case)
    return dict(case.args, q_output_workspace=q_ws, q_output_workspace_bytes=q_ws.nbytes,
                kv_workspace=kv_ws, kv_workspace_bytes=kv_ws.nbytes)


def _outproj(fmt):
    return outproj_mlp_case(MLP_SHAPE, 3, {"wo": fmt, "w1": fmt, "w2": fmt})


def _mlp(fmt):
    return mlp_case(MLP_SHAPE, 3, {"w1": fmt, "w2": fmt})


KERNELS = {   # name: (function, builder of valid arguments)
    "mega_fused_attention_decode": (
        megafuse.mega_fused_attention_decode,
        lambda: dict(decode_case(DECODE_SHAPE, cache_capacity=16, pos=5).args)),
    "mega_fused_attention_decode_workspace": (
        megafuse.mega_fused_attention_decode_workspace,
        lambda: _decode_ws(decode_case(DECODE_SHAPE, cache_capacity=16, pos=5))),
    "mega_fuse_rmsnorm_qkv": (
        megafuse.mega_fuse_rmsnorm_qkv,
        lambda: without_rope(qkv_case(hidden=64, H=2, G=1, D=32, max_seq=16))),
    "mega_fuse_rmsnorm_qkv_rope": (
        megafuse.mega_fuse_rmsnorm_qkv_rope,
        lambda: qkv_case(hidden=64, H=2, G=1, D=32, max_seq=16)),
    "mega_fused_attention_prefill": (
        megafuse.mega_fused_attention_prefill,
        lambda: prefill_case(DECODE_SHAPE, 3, formats={"wq": "Q8_0", "wo": "Q4_0"})),
    "mega_fused_attention_prefill_q8_0": (
        megafuse.mega_fused_attention_prefill_q8_0,
        lambda: prefill_case(DECODE_SHAPE, 3, formats={"wq": "Q8_0", "wo": "Q4_0"}, int8=True)),
    "mega_fused_outproj_mlp_prefill": (megafuse.mega_fused_outproj_mlp_prefill,
                                       lambda: _outproj("Q8_0")),
    "mega_fused_mlp_prefill": (megafuse.mega_fused_mlp_prefill, lambda: _mlp("Q4_1")),
    "mega_fused_outproj_mlp_prefill_f32": (megafuse.mega_fused_outproj_mlp_prefill_f32,
                                           lambda: _outproj("FP32")),
    "mega_fused_mlp_prefill_f32": (megafuse.mega_fused_mlp_prefill_f32, lambda: _mlp("Q5_0")),
}


def int_params(args):
    return [k for k, v in args.items() if isinstance(v, int) and not isinstance(v, DT)
            and k != "eps"]


def writeable_snapshot(args):
    return {k: v.tobytes() for k, v in args.items()
            if isinstance(v, np.ndarray) and v.flags.writeable}


def test_every_kernel_runs_on_its_small_arguments():
    """The builders are valid: each call below fails only through the dimensions changed."""
    for name, (fn, build) in KERNELS.items():
        args = build()
        fn(**args)
        assert all(np.isfinite(v).all() for k, v in args.items()
                   if k in ("output", "q_out") and v is not None), name


# ---- the scratch layouts in Python integers (include/megafuse/mf_scratch.h) ---------------------

def _round64(n):
    return (n + 63) // 64 * 64


def _q8_0_act_row(n):
    """Bytes of a Q8_0 activation row of n values (n % 32 == 0) in the dots' layout
    (include/megafuse/mf_act_layout.h): groups of 4 blocks, 128 code bytes and 8 floats a
    group, rounded up to 64 bytes."""
    groups = (n // 32 + 3) // 4
    return _round64(groups * (128 + 8 * 4))


def _q8_row(n):
    """The larger of a Q8_0 activation row (n % 32 == 0) and a Q8_K row (n % 256 == 0)."""
    q8_0 = _q8_0_act_row(n) if n % 32 == 0 else 0
    q8_k = n // 256 * block_bytes(DT.Q8_K) if n % 256 == 0 else 0
    return max(q8_0, q8_k)


def prefill_scratch_bytes(T, Ea, H, Da, int8):
    hda = H * Da
    widest = max(Ea, hda)
    b = _round64(T * hda * 4)
    if not int8:
        total = b + T * widest * 4
    else:
        q8_0 = _q8_0_act_row(Ea) if Ea % 32 == 0 else 0
        q8_k = Ea // 256 * block_bytes(DT.Q8_K) if Ea % 256 == 0 else 0
        c_q8_k = _round64(_round64(b + T * widest * 4) + T * q8_0)
        total = c_q8_k + T * q8_k
    # one token: region D, the attention output (the projections of one kv group overlap the
    # attention of another, so it cannot share region B with the normalised input)
    return _round64(total) + hda * 4 if T == 1 else total


def mlp_scratch_bytes(T, Ea, hda, Ia):
    tile = min(T, _kernels.MLP_TOKEN_TILE)
    widest = max(Ea, hda)
    q = _round64(tile * widest * 4)
    a = _round64(q + tile * max(_q8_row(Ea), _q8_row(hda)))
    aq = _round64(a + tile * Ia * 4)
    return aq + tile * _q8_row(Ia)


SIZE_HELPERS = {   # name: (function, exact bytes in Python integers, parameter count)
    "mega_fused_attention_prefill_scratch_size": (
        megafuse.mega_fused_attention_prefill_scratch_size,
        lambda T, Ea, H, Da: prefill_scratch_bytes(T, Ea, H, Da, False), 4),
    "mega_fused_attention_prefill_q8_0_scratch_size": (
        megafuse.mega_fused_attention_prefill_q8_0_scratch_size,
        lambda T, Ea, H, Da: prefill_scratch_bytes(T, Ea, H, Da, True), 4),
    "mega_fused_outproj_mlp_prefill_scratch_size": (
        megafuse.mega_fused_outproj_mlp_prefill_scratch_size,
        lambda T, Ea, H, Da, Ia: mlp_scratch_bytes(T, Ea, H * Da, Ia), 5),
    "mega_fused_mlp_prefill_scratch_size": (
        megafuse.mega_fused_mlp_prefill_scratch_size,
        lambda T, Ea, Ia: mlp_scratch_bytes(T, Ea, 0, Ia), 3),
}


@pytest.mark.parametrize("name", list(SIZE_HELPERS))
def test_scratch_helpers_equal_the_layout_in_python_integers(name):
    fn, exact, n = SIZE_HELPERS[name]
    for dims in [(1, 64, 2, 32, 96), (7, 896, 14, 64, 4864), (300, 2048, 32, 64, 8192),
                 (129, 200, 6, 48, 320), (5, 4096, 64, 128, 14336)]:
        dims = dims[:2] + dims[-1:] if n == 3 else dims[:n]
        assert fn(*dims) == exact(*dims), dims


# ---- hostile dimensions, one test per header function -------------------------------------------

def check_rejected(fn, args, words=()):
    """fn(**args) raises ValueError (its message naming one of `words`, when given) and no
    writeable buffer changes."""
    snapshot = writeable_snapshot(args)
    with pytest.raises(ValueError) as info:
        fn(**args)
    if words:
        assert any(w in str(info.value) for w in words), str(info.value)
    assert writeable_snapshot(args) == snapshot, "a rejected call wrote to a buffer"
    return str(info.value)


def issue_prefill_args():
    """The issue's example: embed 256, 64 tokens, capacity 256, H = G = 1614112203,
    D = Da = 44642246, no RoPE tables, 512-element weights and caches, a 64 KiB scratch.
    Unchecked, every count wraps to 512 and the process dies (SIGSEGV)."""
    E, T, C = 256, 64, 256
    f = lambda n: np.zeros(n, np.float32)  # noqa: E731
    return dict(output=f((T, E)), input=np.ones((T, E), np.float32), residual=None,
                ln1_gamma=np.ones(E, np.float32), wq=f(512), bq=None, wq_dt=DT.FP32, wk=f(512),
                bk=None, wk_dt=DT.FP32, wv=f(512), bv=None, wv_dt=DT.FP32, wo=f(512), bo=None,
                wo_dt=DT.FP32, kv_cache_k=f(512), kv_cache_v=f(512), rope_cos=None,
                rope_sin=None, start_pos=0, tokens=T, cache_capacity=C, embed_dim=E,
                aligned_embed_dim=E, num_heads=ISSUE_H, num_kv_heads=ISSUE_H, head_dim=ISSUE_DA,
                aligned_head_dim=ISSUE_DA, eps=1e-6, scratch=np.zeros(65536, np.uint8))


@pytest.mark.parametrize("name", ["mega_fused_attention_prefill",
                                  "mega_fused_attention_prefill_q8_0"])
def test_the_issue_example_is_a_value_error(name):
    message = check_rejected(getattr(megafuse, name), issue_prefill_args())
    assert "num_heads*aligned_head_dim" in message and "overflows" in message
    size = getattr(megafuse, name + "_scratch_size")
    with pytest.raises(ValueError, match="num_heads, aligned_head_dim"):
        size(64, 256, ISSUE_H, ISSUE_DA)          # was 1,024 and 37,120 bytes


# (function name, overrides of its small arguments, words one of which the message names)
HOSTILE = [
    ("mega_fused_attention_decode",
     dict(num_heads=ISSUE_H, num_kv_heads=ISSUE_H, head_dim=ISSUE_DA, aligned_head_dim=ISSUE_DA),
     ["num_heads"]),
    ("mega_fused_attention_decode",
     dict(num_heads=BIG, num_kv_heads=BIG, head_dim=BIG, aligned_head_dim=BIG, embed_dim=BIG,
          aligned_embed_dim=BIG, cache_capacity=BIG, pos=BIG - 1), ["aligned_embed_dim"]),
    ("mega_fused_attention_decode", dict(cache_capacity=BIG, pos=BIG - 1), ["kv_cache_k"]),
    ("mega_fused_attention_decode_workspace",
     dict(num_heads=BIG, num_kv_heads=BIG, head_dim=BIG, aligned_head_dim=BIG),
     ["num_heads", "q_output_workspace"]),
    ("mega_fused_attention_decode_workspace",
     dict(q_output_workspace_bytes=2**63 - 1, kv_workspace_bytes=2**64 - 4),
     ["q_output_workspace_bytes"]),
    ("mega_fuse_rmsnorm_qkv", dict(hidden=BIG, num_heads=BIG, num_kv_heads=BIG, head_dim=BIG),
     ["num_heads"]),
    ("mega_fuse_rmsnorm_qkv", dict(num_heads=ISSUE_H, num_kv_heads=ISSUE_H, head_dim=ISSUE_DA),
     ["num_heads"]),
    ("mega_fuse_rmsnorm_qkv_rope", dict(hidden=BIG, num_heads=BIG, num_kv_heads=BIG,
                                        head_dim=BIG - 1, max_seq=BIG, pos=BIG - 1),
     ["num_heads"]),
    ("mega_fuse_rmsnorm_qkv_rope", dict(max_seq=BIG, pos=0), ["max_seq"]),
    ("mega_fused_attention_prefill",
     dict(tokens=BIG, start_pos=0, cache_capacity=BIG, num_heads=BIG, num_kv_heads=BIG,
          aligned_head_dim=BIG, head_dim=BIG), ["tokens", "num_heads"]),
    ("mega_fused_attention_prefill_q8_0",
     dict(num_heads=ISSUE_H, num_kv_heads=ISSUE_H, head_dim=ISSUE_DA, aligned_head_dim=ISSUE_DA,
          embed_dim=64, aligned_embed_dim=64), ["num_heads"]),
    ("mega_fused_attention_prefill_q8_0", dict(start_pos=BIG - 3, cache_capacity=BIG),
     ["kv_cache_k"]),
    ("mega_fused_outproj_mlp_prefill", dict(num_heads=ISSUE_H, aligned_head_dim=ISSUE_DA),
     ["num_heads", "attn_out"]),
    ("mega_fused_outproj_mlp_prefill",
     dict(tokens=BIG, embed_dim=BIG, aligned_embed_dim=BIG, num_heads=BIG, aligned_head_dim=BIG,
          intermediate_dim=BIG, aligned_intermediate_dim=BIG), ["tokens", "num_heads"]),
    ("mega_fused_mlp_prefill",
     dict(tokens=BIG, embed_dim=BIG, aligned_embed_dim=BIG, intermediate_dim=BIG,
          aligned_intermediate_dim=BIG), ["tokens"]),
    ("mega_fused_mlp_prefill", dict(intermediate_dim=BIG - 5, aligned_intermediate_dim=BIG),
     ["w1"]),
    ("mega_fused_outproj_mlp_prefill_f32", dict(num_heads=ISSUE_H, aligned_head_dim=ISSUE_DA),
     ["num_heads", "attn_out"]),
    ("mega_fused_outproj_mlp_prefill_f32", dict(aligned_intermediate_dim=BIG), ["w1"]),
    ("mega_fused_mlp_prefill_f32",
     dict(tokens=BIG, embed_dim=BIG, aligned_embed_dim=BIG, intermediate_dim=BIG,
          aligned_intermediate_dim=BIG), ["tokens"]),
]


@pytest.mark.parametrize("name, overrides, words", HOSTILE,
                         ids=[f"{h[0]}-{i}" for i, h in enumerate(HOSTILE)])
def test_hostile_dimensions_are_value_errors(name, overrides, words):
    fn, build = KERNELS[name]
    args = build()
    args.update(overrides)
    check_rejected(fn, args, words)


@pytest.mark.parametrize("name", list(SIZE_HELPERS))
@pytest.mark.parametrize("dims", [(64, 256, ISSUE_H, ISSUE_DA, BIG), (BIG,) * 5,
                                  (BIG, BIG, 1, 1, BIG), (1, BIG, BIG, BIG, 1)])
def test_hostile_scratch_sizes_raise_or_are_exact(name, dims):
    """Near 2**31 every dimension: a ValueError naming the parameters, or (when the scratch fits
    64 bits: the MLP's is per tile) exactly the layout's bytes -- never a wrapped number."""
    fn, exact, n = SIZE_HELPERS[name]
    dims = dims[:2] + dims[-1:] if n == 3 else dims[:n]
    want = exact(*dims)
    try:
        got = fn(*dims)
    except ValueError as e:
        assert "overflows" in str(e) and "tokens" in str(e)
        return
    assert got == want < 2**63


def test_scratch_sizes_past_64_bits_always_raise():
    """The prefill's scratch grows with T x H x Da: at the issue's dimensions it needs more than
    2**64 bytes, and the helper says so."""
    for T in (64, 1024, BIG):
        assert prefill_scratch_bytes(T, 256, ISSUE_H, ISSUE_DA, True) >= 2**63
        for int8 in (False, True):
            fn = (megafuse.mega_fused_attention_prefill_q8_0_scratch_size if int8
                  else megafuse.mega_fused_attention_prefill_scratch_size)
            with pytest.raises(ValueError):
                fn(T, 256, ISSUE_H, ISSUE_DA)
    with pytest.raises(ValueError, match="aligned_intermediate_dim"):
        megafuse.mega_fused_outproj_mlp_prefill_scratch_size(128, 256, ISSUE_H, ISSUE_DA, 512)


def test_hostile_tiles_and_stats_are_exact():
    """The two functions without buffers: the largest head_dim still gives tiles in range, and
    the stats are exact integers."""
    q_tile, kv_tile = megafuse.mega_fuse_get_optimal_tiles(BIG)
    assert 1 <= q_tile <= 128 and 1 <= kv_tile <= 256
    stats = megafuse.mega_fuse_report_stats(BIG, BIG, BIG)
    per_token = 2 * 4 * (6 * BIG + BIG) + 2 * 4 * BIG
    assert stats["unfused_traffic_bytes_model"] == per_token * BIG * BIG > 2**64


def test_row_bytes_and_dequantize_shapes_past_64_bits():
    with pytest.raises(ValueError, match="n_elements"):
        megafuse.ck_dtype_row_bytes(DT.Q8_0, 2**64 - 32)
    with pytest.raises(ValueError, match="n_elements"):
        megafuse.ck_dtype_row_bytes(DT.FP32, 2**62)
    assert megafuse.ck_dtype_row_bytes(DT.Q8_0, 2**61) == 2**61 // 32 * block_bytes(DT.Q8_0)
    blob = np.zeros(34, np.uint8)
    with pytest.raises(ValueError, match="shape"):
        megafuse.dequantize(blob, DT.Q8_0, (2**40, 2**40, 32))
    with pytest.raises(ValueError, match="blob"):            # representable, the blob too small
        megafuse.dequantize(blob, DT.Q8_0, (2**50, 32))


# ---- the fuzz: random huge dimensions, in a child process ---------------------------------------

def hostile_value(rng):
    """A value in [2**16, 2**31): near the top of the C int, the issue's pair, or random."""
    kind = rng.integers(5)
    if kind == 0:
        return BIG - int(rng.integers(0, 1000))
    if kind == 1:
        return int(rng.choice([ISSUE_H, ISSUE_DA]))
    if kind == 2:
        return int(2 ** rng.uniform(16, 31)) - 1
    if kind == 3:
        return 2**30 + int(rng.integers(0, 2**30))
    return int(rng.integers(2**16, 2**24))


def run_fuzz(seed, rounds):
    """rounds random calls of every kernel with 1-4 of its int parameters made huge: each must
    raise ValueError and leave every writeable buffer unchanged; each scratch-size helper given
    huge dimensions raises ValueError or returns exactly the layout's bytes.  Prints a JSON
    summary (raises AssertionError on the first violation, naming seed and call)."""
    rng = np.random.default_rng(seed)
    calls = 0
    for name, (fn, build) in KERNELS.items():
        base = build()
        params = int_params(base)
        snapshot = writeable_snapshot(base)
        for _ in range(rounds):
            args = dict(base)
            for key in rng.choice(params, size=rng.integers(1, min(4, len(params)) + 1),
                                  replace=False):
                args[key] = hostile_value(rng)
            changed = {k: args[k] for k in params if args[k] != base[k]}
            try:
                fn(**args)
            except ValueError:
                pass
            else:
                raise AssertionError(f"seed {seed}: {name}({changed}) did not raise")
            assert writeable_snapshot(base) == snapshot, f"seed {seed}: {name}({changed}) wrote"
            calls += 1
    for name, (fn, exact, n) in SIZE_HELPERS.items():
        for _ in range(rounds):
            dims = [hostile_value(rng) if rng.random() < 0.7 else int(rng.integers(1, 512))
                    for _ in range(n)]
            try:
                got = fn(*dims)
            except ValueError:
                calls += 1
                continue
            assert got == exact(*dims) < 2**63, f"seed {seed}: {name}{tuple(dims)} = {got}"
            calls += 1
    print(json.dumps({"seed": seed, "calls": calls}))


@pytest.mark.parametrize("seed", [12, 2024])
def test_fuzz_of_huge_dimensions_raises_every_time(seed):
    code = (f"import sys; sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]; "
                f"import test_overflow; "
            f"test_overflow.run_fuzz({seed}, 150)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, (f"the fuzz child exited with {done.returncode} (a negative "
                                  f"status is a signal: a crash)\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == {"seed": seed, "calls": 150 * (len(KERNELS) + len(SIZE_HELPERS))}


def test_fuzz_child_reports_a_call_that_does_not_raise(monkeypatch, capsys):
    """The fuzz itself can fail: a kernel that accepted the dimensions would be reported."""
    monkeypatch.setitem(KERNELS, "mega_fuse_rmsnorm_qkv",
                        (lambda **kw: None, KERNELS["mega_fuse_rmsnorm_qkv"][1]))
    with pytest.raises(AssertionError, match="did not raise"):
        run_fuzz(1, 3)

