"""The header functions run on the thread team of the whole-model step (include/megafuse/mf_team.h,
kernels/levels/team_job.pxi): one team for the process, sized by megafuse.set_num_threads; a call
that finds it taken runs the same job on threads of no team, with the same bits; a forked child
starts the team anew."""

import numpy as np
import pytest

import megafuse
from megafuse import _kernels
from helpers import (LLAMA_STYLE, QWEN2_05B, decode_case, fork_child_status, mlp_case,
                     prefill_case)


@pytest.fixture
def two_threads():
    before = megafuse.get_num_threads()
    megafuse.set_num_threads(2)
    yield
    megafuse.set_num_threads(before)


def _copy(args):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}


def _calls():
    """(name, function, args) of the decode-relevant header calls, T = 1."""
    q8 = {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0", "wo": "Q8_0"}
    return [
        ("decode", megafuse.mega_fused_attention_decode,
         decode_case(LLAMA_STYLE, cache_capacity=700, pos=600).args),
        ("prefill_q8_0", megafuse.mega_fused_attention_prefill_q8_0,
         prefill_case(QWEN2_05B, 1, start_pos=9, cache_capacity=16, int8=True, formats=q8)),
        ("prefill_q8_0-group-queue", megafuse.mega_fused_attention_prefill_q8_0,
         prefill_case(LLAMA_STYLE, 1, start_pos=9, cache_capacity=16, int8=True, formats=q8)),
        ("prefill", megafuse.mega_fused_attention_prefill,
         prefill_case(QWEN2_05B, 1, start_pos=9, cache_capacity=16, formats=q8)),
        ("mlp_prefill", megafuse.mega_fused_mlp_prefill,
         mlp_case(("small", 64, 64, 2, 32, 96, 96), 1,
                  {"w1": "Q8_0", "w2": "Q8_0"})),
    ]


def test_header_calls_run_on_the_shared_team(two_threads):
    for n in (3, 2):
        megafuse.set_num_threads(n)
        megafuse.mega_fused_attention_decode(**decode_case(LLAMA_STYLE).args)
        assert _kernels._team_threads() == n


@pytest.mark.parametrize("call", _calls(), ids=lambda c: c[0])
def test_a_call_finding_the_team_taken_gives_the_same_bits(two_threads, call):
    _, fn, args = call
    on_team, detached = _copy(args), _copy(args)
    fn(**on_team)
    assert _kernels._team_hold(True)
    try:
        fn(**detached)
    finally:
        _kernels._team_hold(False)
    for name, value in on_team.items():
        if isinstance(value, np.ndarray):
            assert value.tobytes() == detached[name].tobytes(), name


def test_a_forked_child_runs_header_calls_on_two_threads():
    """After a two-thread header call in the parent, a fork()ed child's two-thread header call
    finishes: the team's threads are started anew in the child (an OpenMP region run by the
    parent would make it hang)."""
    out = fork_child_status("""
        import megafuse
        from helpers import LLAMA_STYLE, decode_case
        megafuse.set_num_threads(2)
        megafuse.mega_fused_attention_decode(**decode_case(LLAMA_STYLE).args)
    """, "megafuse.mega_fused_attention_decode(**decode_case(LLAMA_STYLE).args)")
    assert "CHILD 0" in out.stdout, (out.stdout, out.stderr)
