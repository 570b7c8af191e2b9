"""megafuse mirrors the C header it was written against, function by function.

tests/data/mega_fused_attention.h.txt is a copy of that header (upstream's documentation page of
mega_fused_attention.h).  Every function it declares must be a function of megafuse, and of
megafuse.reference, with the header's parameter names in the header's order and no extra required
parameter (docs/contract.md §1; mega_fuse_get_optimal_tiles returns its two int * instead of taking
them).  The header megafuse ships, include/megafuse/mega_fused_attention.h, must declare each of
them with the same parameters.
"""
import inspect
import os
import re

import pytest

import megafuse
from megafuse import reference

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_HEADER = os.path.join(os.path.dirname(HERE), "data", "mega_fused_attention.h.txt")
SHIPPED_HEADER = os.path.join(megafuse.get_include(), "megafuse", "mega_fused_attention.h")

# contract §1: the two int * out-parameters become the return value
PYTHON_PARAMS = {"mega_fuse_get_optimal_tiles": ["head_dim"]}

SEED_FUNCTIONS = {
    "mega_fused_attention_decode", "mega_fused_attention_decode_workspace",
    "mega_fused_attention_prefill", "mega_fused_attention_prefill_q8_0",
    "mega_fused_attention_prefill_scratch_size", "mega_fused_attention_prefill_q8_0_scratch_size",
    "mega_fused_outproj_mlp_prefill", "mega_fused_outproj_mlp_prefill_scratch_size",
    "mega_fuse_rmsnorm_qkv", "mega_fuse_rmsnorm_qkv_rope", "mega_fuse_get_optimal_tiles",
    "mega_fuse_report_stats",
}


def header_functions(text):
    """{name: [parameter names]} of the function declarations in C header text (comments and
    preprocessor lines removed; a declaration ends with `);`)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    declaration = re.compile(r"\b(?:void|size_t|int|float)\s*\**\s*(\w+)\s*\(([^;{}()]*)\)\s*;")
    functions = {}
    for m in declaration.finditer(text):
        params = [re.findall(r"\w+", p)[-1] for p in m.group(2).split(",")
                  if p.strip() and p.strip() != "void"]
        functions[m.group(1)] = params
    return functions


def signature_problem(fn, want):
    """None when fn takes the parameters `want` first, in that order, and nothing else required;
    else what is wrong."""
    if fn is None or not callable(fn):
        return "missing"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        return f"no inspectable signature ({e}): compile with binding=True"
    got = [p.name for p in params]
    if got[:len(want)] != want:
        return f"parameters {got}, header {want}"
    extra = [p.name for p in params[len(want):]
             if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if extra:
        return f"extra required parameters {extra}"
    return None


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


SEED = header_functions(_read(SEED_HEADER))


def test_the_seed_header_declares_the_twelve_functions():
    assert set(SEED) == SEED_FUNCTIONS
    assert SEED["mega_fuse_get_optimal_tiles"] == ["q_tile", "kv_tile", "head_dim"]
    assert SEED["mega_fused_attention_prefill_scratch_size"] == [
        "tokens", "aligned_embed_dim", "num_heads", "aligned_head_dim"]
    assert len(SEED["mega_fused_attention_decode_workspace"]) == 29


@pytest.mark.parametrize("name", sorted(SEED_FUNCTIONS))
def test_megafuse_function_mirrors_the_header(name):
    want = PYTHON_PARAMS.get(name, SEED[name])
    assert signature_problem(getattr(megafuse, name, None), want) is None


@pytest.mark.parametrize("name", sorted(SEED_FUNCTIONS))
def test_reference_function_mirrors_the_header(name):
    want = PYTHON_PARAMS.get(name, SEED[name])
    assert signature_problem(getattr(reference, name, None), want) is None


def test_the_shipped_header_declares_the_seed_prototypes_unchanged():
    shipped = header_functions(_read(SHIPPED_HEADER))
    for name, params in SEED.items():
        assert shipped.get(name) == params, name


def test_the_check_can_fail():
    def decode(output, input, residual):
        pass

    def with_extra(output, input, residual, scale):
        pass

    def with_default(output, input, residual, scale=1.0):
        pass

    want = ["output", "input", "residual"]
    assert signature_problem(decode, want) is None
    assert signature_problem(with_default, want) is None
    assert signature_problem(decode, ["input", "output", "residual"]).startswith("parameters")
    assert signature_problem(with_extra, want).startswith("extra required")
    assert signature_problem(None, want) == "missing"
    parsed = header_functions("/* void hidden(int a); */\n#define X(a) a\n"
                              "size_t f(int a, const float *b);\nvoid g(void);\n")
    assert parsed == {"f": ["a", "b"], "g": []}
