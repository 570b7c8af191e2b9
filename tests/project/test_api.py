"""The public surface: header signatures, data types, configuration, tiles, stats, SIMD levels."""
import inspect
import os
import re
import subprocess
import sys

import pytest

import megafuse
from megafuse import reference

HERE = os.path.dirname(os.path.abspath(__file__))
# upstream's header
SEED_HEADER = os.path.join(os.path.dirname(HERE), "data", "mega_fused_attention.h.txt")
HEADER = os.path.join(megafuse.get_include(), "megafuse", "mega_fused_attention.h")

# megafuse's additions to the header (declared beside the seed's functions)
ADDITIONS = {"mega_fused_mlp_prefill", "mega_fused_mlp_prefill_scratch_size",
             "mega_fused_outproj_mlp_prefill_f32", "mega_fused_mlp_prefill_f32"}


def read_text(path):
    with open(path) as f:
        return f.read()


def header_declarations():
    """{name: [parameter names]} parsed from the shipped C header."""
    text = read_text(HEADER)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    decls = {}
    for m in re.finditer(r"\b(?:void|size_t)\s+(\w+)\s*\(([^;{}()]*)\)\s*;", text):
        decls[m.group(1)] = [re.findall(r"\w+", p)[-1] for p in m.group(2).split(",")
                             if p.strip()]
    return decls


def header_prototypes(text):
    """{name: (return type, [parameters as 'type*name' without spaces around '*'])}."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"(//|#)[^\n]*", " ", text)
    norm = lambda p: re.sub(r"\s*\*\s*", "*", re.sub(r"\s+", " ", p.strip()))  # noqa: E731
    return {m.group(2): (m.group(1), [norm(p) for p in m.group(3).split(",") if p.strip()])
            for m in re.finditer(r"(?:cdef\s+)?\b(void|size_t)\s+(?:c_)?(\w+)\s*\(([^;{}()]*)\)",
                                 text)}


def test_pxd_declares_every_header_function_with_its_parameters():
    """megafuse/_kernels.pxd: a c_<name> for every function of the header, with exactly its
    return type and parameters (types and names, in order)."""
    header = header_prototypes(read_text(HEADER))
    pxd = header_prototypes(read_text(os.path.join(os.path.dirname(megafuse.__file__),
                                                   "_kernels.pxd")))
    assert set(pxd) == set(header)
    for name, proto in header.items():
        assert pxd[name] == proto, name


def test_shipped_header_declares_every_seed_function():
    decls = header_declarations()
    assert len(decls) == 12 + len(ADDITIONS)
    assert set(decls) >= ADDITIONS
    text = read_text(SEED_HEADER)
    for name in set(decls) - ADDITIONS:
        assert name in text


@pytest.mark.parametrize("name", sorted(header_declarations()))
def test_signature_matches_header(name):
    want = header_declarations()[name]
    if name == "mega_fuse_get_optimal_tiles":
        want = ["head_dim"]   # docs/contract.md §1: the two int* become the return value
    got = list(inspect.signature(getattr(megafuse, name)).parameters)
    assert got == want


def test_every_header_function_is_exported():
    for name in header_declarations():
        assert name in megafuse.__all__ and callable(getattr(megafuse, name))


def test_reference_mirrors_the_header_too():
    for name, params in header_declarations().items():
        fn = getattr(reference, name)
        if name == "mega_fuse_get_optimal_tiles":
            params = ["head_dim"]
        assert list(inspect.signature(fn).parameters)[:len(params)] == params


def test_ckdatatype_values():
    want = dict(FP32=0, BF16=1, FP16=2, INT8=3, INT4=4, Q4_0=5, Q4_1=6, Q4_K=7, Q6_K=8, Q8_0=9,
                Q8_K=10, Q5_0=11, Q5_1=12, Q5_K=13, Q2_K=14, Q3_K=15, IQ4_NL=16, IQ4_XS=17,
                COUNT=18)
    assert {m.name: m.value for m in megafuse.CKDataType} == want
    for name, value in want.items():
        assert getattr(megafuse, f"CK_DT_{name}") == value
    # the C header agrees: its enum is what the helpers switch on
    text = read_text(os.path.join(megafuse.get_include(), "megafuse", "ckernel_dtype.h"))
    for name, value in want.items():
        assert re.search(rf"CK_DT_{name}\s*=\s*{value}\b", text)


BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
          "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
          "Q8_K": (256, 292), "Q2_K": (256, 84), "Q3_K": (256, 110), "IQ4_NL": (32, 18),
          "IQ4_XS": (256, 136)}


def test_dtype_helpers():
    DT = megafuse.CKDataType
    assert megafuse.ck_dtype_bytes(DT.FP32) == 4
    assert megafuse.ck_dtype_bytes(DT.FP16) == megafuse.ck_dtype_bytes(DT.BF16) == 2
    assert megafuse.ck_dtype_bytes(DT.INT8) == 1
    for name, (block, nbytes) in BLOCKS.items():
        dt = DT[name]
        assert megafuse.ck_dtype_is_quantized(dt)
        assert megafuse.ck_dtype_block_size(dt) == block
        assert megafuse.ck_dtype_block_bytes(dt) == nbytes
        assert megafuse.ck_dtype_row_bytes(dt, 4 * block) == 4 * nbytes
        if name != "Q8_K":
            assert megafuse.ck_dtype_row_bytes(dt, 2 * block) == reference.ck_dtype_row_bytes(
                dt, 2 * block)
    for dt in (DT.FP32, DT.FP16, DT.BF16, DT.INT8):
        assert not megafuse.ck_dtype_is_quantized(dt)
        assert megafuse.ck_dtype_block_size(dt) == 1
    assert megafuse.ck_dtype_row_bytes(DT.FP32, 896) == 3584
    assert megafuse.ck_dtype_row_bytes(9, 64) == 68          # plain ints work too
    assert megafuse.CK_DT_MASK(DT.Q8_0) == 1 << 9
    mask = megafuse.CK_DT_MASK(DT.Q8_0) | megafuse.CK_DT_MASK(DT.FP32)
    assert megafuse.ck_dtype_supported(mask, DT.Q8_0)
    assert megafuse.ck_dtype_supported(mask, DT.FP32)
    assert not megafuse.ck_dtype_supported(mask, DT.Q4_K)


@pytest.mark.parametrize("call,exc", [
    (lambda: megafuse.ck_dtype_bytes(18), ValueError),
    (lambda: megafuse.ck_dtype_bytes(-1), ValueError),
    (lambda: megafuse.ck_dtype_bytes(1.0), TypeError),
    (lambda: megafuse.ck_dtype_bytes("FP32"), TypeError),
    (lambda: megafuse.ck_dtype_row_bytes(megafuse.CK_DT_Q8_0, 33), ValueError),
    (lambda: megafuse.ck_dtype_row_bytes(megafuse.CK_DT_Q4_K, 0), ValueError),
    (lambda: megafuse.ck_dtype_supported(-1, 0), ValueError),
])
def test_dtype_helpers_reject(call, exc):
    with pytest.raises(exc):
        call()


def test_get_include_holds_the_headers():
    inc = megafuse.get_include()
    for name in ("mega_fused_attention.h", "ckernel_dtype.h", "mf_simd.h"):
        assert os.path.isfile(os.path.join(inc, "megafuse", name))


def test_show_config(capsys):
    config = megafuse.show_config()
    printed = capsys.readouterr().out
    for key in ("version", "openmp", "num_threads", "simd_level", "simd_levels_supported",
                "compiler_flags"):
        assert key in config and key in printed
    assert config["simd_level"] == megafuse.simd_level()
    assert config["simd_level"] in config["simd_levels_supported"]
    assert "-march=native" not in str(config["compiler_flags"])
    assert "fast-math" not in str(config["compiler_flags"])


def test_threads_default_and_setting(threads):
    assert megafuse.get_num_threads() >= 1
    megafuse.set_num_threads(3)
    assert megafuse.get_num_threads() == 3


def test_default_threads_follow_omp_num_threads():
    code = "import megafuse; print(megafuse.get_num_threads())"
    env = dict(os.environ, OMP_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "3"


@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
def test_optimal_tiles_follow_the_reference_formula(head_dim):
    assert megafuse.mega_fuse_get_optimal_tiles(head_dim) == \
        reference.mega_fuse_get_optimal_tiles(head_dim)
    from megafuse import _kernels
    for l1d, l2 in [(32768, 524288), (49152, 2 << 20), (0, 0), (16384, 262144), (1 << 20, 1 << 24)]:
        assert _kernels._optimal_tiles_for(l1d, l2, head_dim) == \
            reference.optimal_tiles_from_cache_sizes(l1d, l2, head_dim)
    assert _kernels._optimal_tiles_for(0, 0, head_dim) == (64, 64)   # the header's defaults


def test_report_stats_prints_and_returns_the_formula(capsys):
    got = megafuse.mega_fuse_report_stats(896, 24, 512)
    printed = capsys.readouterr().out
    want = reference.mega_fuse_report_stats(896, 24, 512)
    capsys.readouterr()
    assert got == want
    assert got["unfused_intermediate_bytes_per_token"] == 4 * (6 * 896 + 512)
    for key, value in got.items():
        assert key in printed
        if isinstance(value, int):
            assert f"{value:,}" in printed


def simd_env_run(level):
    code = "import megafuse; print(megafuse.simd_level())"
    env = dict(os.environ, MEGAFUSE_SIMD=level)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_megafuse_simd_env_forces_a_level():
    from megafuse.kernels import simd as _simd
    for level in _simd.supported_levels():
        out = simd_env_run(level)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == level


def test_megafuse_simd_env_rejects_unknown_or_unsupported_levels():
    from megafuse.kernels import simd as _simd
    out = simd_env_run("sse9")
    assert out.returncode != 0 and "MEGAFUSE_SIMD" in out.stderr
    unsupported = [lv for lv in _simd.LEVELS if lv not in _simd.supported_levels()]
    for level in unsupported:   # refused cleanly, never an illegal instruction
        out = simd_env_run(level)
        assert out.returncode == 1 and "ImportError" in out.stderr


def test_best_level_is_the_default():
    from megafuse.kernels import simd as _simd
    env = {k: v for k, v in os.environ.items() if k != "MEGAFUSE_SIMD"}
    out = subprocess.run([sys.executable, "-c", "import megafuse; print(megafuse.simd_level())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _simd.supported_levels()[-1]


def test_kernels_run_under_every_forced_level():
    """Each level end to end in a fresh process (the env override path), against the reference."""
    from megafuse.kernels import simd as _simd
    code = (f"import numpy as np, megafuse, sys; sys.path.insert(0, {os.path.dirname(HERE)!r});"
            "from helpers import decode_case, rel_err, QWEN2_05B; from megafuse import reference;"
            "c = decode_case(QWEN2_05B); r = c.copy();"
            "megafuse.mega_fused_attention_decode(**c.args);"
            "reference.mega_fused_attention_decode(**r.args);"
            "print(megafuse.simd_level(), rel_err(c.args['output'], r.args['output']))")
    for level in _simd.supported_levels():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, MEGAFUSE_SIMD=level))
        assert out.returncode == 0, out.stderr
        name, err = out.stdout.split()
        assert name == level and float(err) < 1e-5


@pytest.mark.parametrize("old, new", [
    ("megafuse.gguf", "megafuse.llm.gguf"), ("megafuse.tokenizer", "megafuse.llm.tokenizer"),
    ("megafuse.sampling", "megafuse.llm.sampling"), ("megafuse.models", "megafuse.llm.fetch"),
    ("megafuse.model", "megafuse.llm.model"), ("megafuse.layer", "megafuse.llm.layer"),
    ("megafuse.memory", "megafuse.kernels.memory")])
def test_old_module_paths_are_the_moved_modules(old, new):
    """The module paths before the house moved (issue 35) import the same module objects, as
    `import x.y`, `from x import y` and attribute access."""
    import importlib
    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved
    assert getattr(megafuse, old.rpartition(".")[2]) is moved
    namespace = {}
    exec(f"from megafuse import {old.rpartition('.')[2]} as got", namespace)
    assert namespace["got"] is moved
