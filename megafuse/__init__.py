"""megafuse: fused transformer-layer kernels for the CPU over NumPy buffers.

Every function of the C header ``mega_fused_attention.h`` is a function here with the same name
and parameters (see ``megafuse.get_include()`` for the header, docs/contract.md for the contract):
RMSNorm -> Q/K/V projection -> RoPE -> flash attention over a KV cache -> output projection +
residual, for one token (decode) and many (prefill), plus the post-attention MLP block.

Kernels release the GIL and run on ``get_num_threads()`` OpenMP threads; results are bitwise the
same for any thread count.  The SIMD level (generic / avx2 / avx512 / amx) is chosen at import,
after a self-test against the generic kernels; ``MEGAFUSE_SIMD`` forces a lower one.
"""
import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import os as _os
import sys as _sys
from importlib import metadata as _metadata

from megafuse.kernels.dtype import (
    CKDataType, CK_DT_FP32, CK_DT_BF16, CK_DT_FP16, CK_DT_INT8, CK_DT_INT4, CK_DT_Q4_0,
    CK_DT_Q4_1, CK_DT_Q4_K, CK_DT_Q6_K, CK_DT_Q8_0, CK_DT_Q8_K, CK_DT_Q5_0, CK_DT_Q5_1,
    CK_DT_Q5_K, CK_DT_Q2_K, CK_DT_Q3_K, CK_DT_IQ4_NL, CK_DT_IQ4_XS, CK_DT_COUNT)
from megafuse._kernels import (
    mega_fused_attention_decode,
    mega_fused_attention_decode_workspace,
    mega_fused_attention_prefill,
    mega_fused_attention_prefill_q8_0,
    mega_fused_attention_prefill_scratch_size,
    mega_fused_attention_prefill_q8_0_scratch_size,
    mega_fused_outproj_mlp_prefill,
    mega_fused_outproj_mlp_prefill_scratch_size,
    mega_fused_mlp_prefill,
    mega_fused_mlp_prefill_scratch_size,
    mega_fused_outproj_mlp_prefill_f32,
    mega_fused_mlp_prefill_f32,
    mega_fuse_rmsnorm_qkv,
    mega_fuse_rmsnorm_qkv_rope,
    mega_fuse_get_optimal_tiles,
    mega_fuse_report_stats,
    quantize,
    dequantize,
    set_num_threads,
    get_num_threads,
    simd_level,
    CK_DT_MASK,
    ck_dtype_is_quantized,
    ck_dtype_bytes,
    ck_dtype_block_size,
    ck_dtype_block_bytes,
    ck_dtype_row_bytes,
    ck_dtype_supported,
)
from megafuse.kernels import selftest as _selftest

# The SIMD level: the best one the CPU runs, once its known-answer self-test against the generic
# kernels has passed (a RuntimeWarning and the next level down if not: kernels/selftest.py).
_selftest.select_level()

from megafuse.llm.layer import DecoderLayer, rope_tables  # noqa: E402  (pure Python)
from megafuse.llm.model import Model, ModelConfig  # noqa: E402  (pure Python)
from megafuse.kernels.memory import empty, zeros, empty_like  # noqa: E402  (2 MiB pages)


def _version():
    """The distribution's version (pyproject.toml's `version`, the one place it is written),
    from the installed metadata; in a source tree without metadata, from pyproject.toml itself."""
    try:
        return _metadata.version("megafuse")
    except _metadata.PackageNotFoundError:
        pass
    import re
    pyproject = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))),
                              "pyproject.toml")
    try:
        with open(pyproject, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return "0+unknown"
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, flags=re.M | re.S)
    found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), flags=re.M)
    return found.group(1) if found else "0+unknown"


__version__ = _version()

__all__ = [
    # the header's functions
    "mega_fused_attention_decode", "mega_fused_attention_decode_workspace",
    "mega_fused_attention_prefill", "mega_fused_attention_prefill_q8_0",
    "mega_fused_attention_prefill_scratch_size", "mega_fused_attention_prefill_q8_0_scratch_size",
    "mega_fused_outproj_mlp_prefill", "mega_fused_outproj_mlp_prefill_scratch_size",
    "mega_fused_mlp_prefill", "mega_fused_mlp_prefill_scratch_size",
    "mega_fused_outproj_mlp_prefill_f32", "mega_fused_mlp_prefill_f32",
    "mega_fuse_rmsnorm_qkv", "mega_fuse_rmsnorm_qkv_rope", "mega_fuse_get_optimal_tiles",
    "mega_fuse_report_stats",
    # weight formats
    "quantize", "dequantize",
    # data types
    "CKDataType", "CK_DT_FP32", "CK_DT_BF16", "CK_DT_FP16", "CK_DT_INT8", "CK_DT_INT4",
    "CK_DT_Q4_0", "CK_DT_Q4_1", "CK_DT_Q4_K", "CK_DT_Q6_K", "CK_DT_Q8_0", "CK_DT_Q8_K",
    "CK_DT_Q5_0", "CK_DT_Q5_1", "CK_DT_Q5_K", "CK_DT_Q2_K", "CK_DT_Q3_K", "CK_DT_IQ4_NL",
    "CK_DT_IQ4_XS", "CK_DT_COUNT", "CK_DT_MASK",
    "ck_dtype_is_quantized", "ck_dtype_bytes", "ck_dtype_block_size", "ck_dtype_block_bytes",
    "ck_dtype_row_bytes", "ck_dtype_supported",
    # configuration
    "set_num_threads", "get_num_threads", "simd_level", "get_include", "show_config",
    # a whole decoder layer (megafuse.llm.layer); GGUF weights: the megafuse.llm.gguf module (lazy)
    "DecoderLayer", "rope_tables",
    # a whole GGUF model, tokens in and logits / text out (megafuse.llm.model, .sampling)
    "Model", "ModelConfig",
    # text <-> token ids from a GGUF vocabulary (megafuse.llm.tokenizer, imported on first use)
    "Tokenizer",
    # arrays on 2 MiB pages for weights and caches (megafuse.kernels.memory)
    "empty", "zeros", "empty_like",
]


# Module paths from before the subpackages (docs/contract.md §1): ``import megafuse.gguf`` gives
# the module object of megafuse.llm.gguf itself, not a copy.
_MODULE_ALIASES = {
    "gguf": "megafuse.llm.gguf", "tokenizer": "megafuse.llm.tokenizer",
    "sampling": "megafuse.llm.sampling", "models": "megafuse.llm.fetch",
    "model": "megafuse.llm.model", "layer": "megafuse.llm.layer",
    "memory": "megafuse.kernels.memory",
}


class _AliasImporter(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """Finds ``megafuse.<old name>`` and hands out the module it now lives in."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix == "megafuse" and name in _MODULE_ALIASES:
            return _importlib_util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return _importlib.import_module(_MODULE_ALIASES[spec.name.partition(".")[2]])

    def exec_module(self, module):
        pass                                # the module it stands for is already executed


if not any(isinstance(f, _AliasImporter) for f in _sys.meta_path):
    _sys.meta_path.append(_AliasImporter())


def __getattr__(name):
    """The old module paths (``megafuse.gguf``, ``megafuse.models``, ...) and
    ``megafuse.Tokenizer`` are imported on first use (the optional ``tokenizers`` and ``jinja2``
    packages are needed only by the tokenizer; GGUF files are read by megafuse.llm.gguf itself,
    without the ``gguf`` package)."""
    if name in _MODULE_ALIASES:
        return _importlib.import_module(f"megafuse.{name}")
    if name == "Tokenizer":
        return _importlib.import_module("megafuse.llm.tokenizer").Tokenizer
    raise AttributeError(f"module 'megafuse' has no attribute {name!r}")


def get_include():
    """The folder to add to a C compiler's include path: it holds megafuse/*.h
    (``#include "megafuse/mega_fused_attention.h"``)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    shipped = _os.path.join(here, "include")                 # an installed wheel
    if _os.path.isfile(_os.path.join(shipped, "megafuse", "mega_fused_attention.h")):
        return shipped
    return _os.path.join(_os.path.dirname(here), "include")  # a source tree (editable install)


def show_config(file=None):
    """Print (and return as a dict) how this megafuse was built and what it runs with."""
    import sys

    from megafuse.kernels import simd as _simd
    try:
        from megafuse._build_info import BUILD_CONFIG
    except ImportError:  # built by something other than setup.py
        BUILD_CONFIG = {}
    l1d, l2 = _simd.cache_sizes()
    config = {
        "version": __version__,
        "python": sys.version.split()[0],
        "compiler_flags": BUILD_CONFIG.get("compile_flags", "unknown"),
        "openmp": BUILD_CONFIG.get("openmp", "unknown"),
        "debug_build": BUILD_CONFIG.get("debug", "unknown"),
        "num_threads": get_num_threads(),
        "simd_level": simd_level(),
        "simd_levels_built": _simd.built_levels(),
        "simd_levels_supported": _simd.supported_levels(),
        "simd_selftest": _selftest.summary(),
        "l1d_cache_bytes": l1d,
        "l2_cache_bytes": l2,
        "include_dir": get_include(),
    }
    out = file if file is not None else sys.stdout
    width = max(len(k) for k in config)
    for key, value in config.items():
        if isinstance(value, dict):          # one line per entry, under the key
            lines = [f"{k}: {v}" for k, v in value.items()] or ["-"]
            print(f"{key:<{width}}  {lines[0]}", file=out)
            for line in lines[1:]:
                print(f"{'':<{width}}  {line}", file=out)
        else:
            print(f"{key:<{width}}  {value}", file=out)
    return config
