# Type stubs of megafuse's public API (the compiled functions of megafuse._kernels, re-exported
# here, plus the pure-Python layer and GGUF modules).  Buffers are NumPy arrays: float32 for
# activations, caches, biases and FP32 weights; uint8 / uint16 / float16 for the other weight
# formats; any dtype for scratch.  The run-time checks (docs/contract.md §5) are stricter than these
# types can say: sizes, contiguity and writeability are checked when called.
from typing import (IO, Any, Dict, Literal, Optional, Sequence, SupportsIndex, Tuple, TypeAlias,
                    Union)

import numpy as np
import numpy.typing as npt

from megafuse.llm import gguf as gguf
from megafuse.llm import layer as layer
from megafuse.kernels.dtype import CKDataType as CKDataType
from megafuse.llm.layer import DecoderLayer as DecoderLayer
from megafuse.llm.layer import rope_tables as rope_tables
from megafuse.llm import model as model
from megafuse.llm import sampling as sampling
from megafuse.llm.model import Model as Model
from megafuse.llm.model import ModelConfig as ModelConfig
from megafuse.kernels import memory as memory
from megafuse.llm import fetch as models  # noqa: F401 -- megafuse.models is megafuse.llm.fetch
from megafuse.llm import tokenizer as tokenizer
from megafuse.llm.tokenizer import Tokenizer as Tokenizer
from megafuse.kernels.memory import empty as empty
from megafuse.kernels.memory import empty_like as empty_like
from megafuse.kernels.memory import zeros as zeros

_F32: TypeAlias = npt.NDArray[np.float32]
_Array: TypeAlias = npt.NDArray[Any]                  # a weight in its format, or any-dtype scratch
_DType: TypeAlias = Union[CKDataType, SupportsIndex]  # a CKDataType or its int value
_Shape: TypeAlias = Union[SupportsIndex, Sequence[SupportsIndex]]

__version__: str
# the same list as megafuse/__init__.py's (tests/project/test_typing.py compares them)
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

CK_DT_FP32: Literal[CKDataType.FP32]
CK_DT_BF16: Literal[CKDataType.BF16]
CK_DT_FP16: Literal[CKDataType.FP16]
CK_DT_INT8: Literal[CKDataType.INT8]
CK_DT_INT4: Literal[CKDataType.INT4]
CK_DT_Q4_0: Literal[CKDataType.Q4_0]
CK_DT_Q4_1: Literal[CKDataType.Q4_1]
CK_DT_Q4_K: Literal[CKDataType.Q4_K]
CK_DT_Q6_K: Literal[CKDataType.Q6_K]
CK_DT_Q8_0: Literal[CKDataType.Q8_0]
CK_DT_Q8_K: Literal[CKDataType.Q8_K]
CK_DT_Q5_0: Literal[CKDataType.Q5_0]
CK_DT_Q5_1: Literal[CKDataType.Q5_1]
CK_DT_Q5_K: Literal[CKDataType.Q5_K]
CK_DT_Q2_K: Literal[CKDataType.Q2_K]
CK_DT_Q3_K: Literal[CKDataType.Q3_K]
CK_DT_IQ4_NL: Literal[CKDataType.IQ4_NL]
CK_DT_IQ4_XS: Literal[CKDataType.IQ4_XS]
CK_DT_COUNT: Literal[CKDataType.COUNT]

# ---- the header's functions ----------------------------------------------------------------

def mega_fused_attention_decode(
    output: _F32, input: _F32, residual: Optional[_F32], ln1_gamma: _F32,
    wq: _F32, bq: Optional[_F32], wk: _F32, bk: Optional[_F32], wv: _F32, bv: Optional[_F32],
    wo: _F32, bo: Optional[_F32], kv_cache_k: _F32, kv_cache_v: _F32,
    rope_cos: Optional[_F32], rope_sin: Optional[_F32], pos: int, embed_dim: int,
    aligned_embed_dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
    aligned_head_dim: int, cache_capacity: int, eps: float) -> None: ...

def mega_fused_attention_decode_workspace(
    output: _F32, input: _F32, residual: Optional[_F32], ln1_gamma: _F32,
    wq: _F32, bq: Optional[_F32], wk: _F32, bk: Optional[_F32], wv: _F32, bv: Optional[_F32],
    wo: _F32, bo: Optional[_F32], kv_cache_k: _F32, kv_cache_v: _F32,
    rope_cos: Optional[_F32], rope_sin: Optional[_F32], pos: int, embed_dim: int,
    aligned_embed_dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
    aligned_head_dim: int, cache_capacity: int, eps: float, q_output_workspace: _F32,
    q_output_workspace_bytes: int, kv_workspace: _F32, kv_workspace_bytes: int) -> None: ...

def mega_fused_attention_prefill(
    output: _F32, input: _F32, residual: Optional[_F32], ln1_gamma: _F32,
    wq: _Array, bq: Optional[_F32], wq_dt: _DType, wk: _Array, bk: Optional[_F32],
    wk_dt: _DType, wv: _Array, bv: Optional[_F32], wv_dt: _DType, wo: _Array,
    bo: Optional[_F32], wo_dt: _DType, kv_cache_k: _F32, kv_cache_v: _F32,
    rope_cos: Optional[_F32], rope_sin: Optional[_F32], start_pos: int, tokens: int,
    cache_capacity: int, embed_dim: int, aligned_embed_dim: int, num_heads: int,
    num_kv_heads: int, head_dim: int, aligned_head_dim: int, eps: float,
    scratch: _Array) -> None: ...

def mega_fused_attention_prefill_q8_0(
    output: _F32, input: _F32, residual: Optional[_F32], ln1_gamma: _F32,
    wq: _Array, bq: Optional[_F32], wq_dt: _DType, wk: _Array, bk: Optional[_F32],
    wk_dt: _DType, wv: _Array, bv: Optional[_F32], wv_dt: _DType, wo: _Array,
    bo: Optional[_F32], wo_dt: _DType, kv_cache_k: _F32, kv_cache_v: _F32,
    rope_cos: Optional[_F32], rope_sin: Optional[_F32], start_pos: int, tokens: int,
    cache_capacity: int, embed_dim: int, aligned_embed_dim: int, num_heads: int,
    num_kv_heads: int, head_dim: int, aligned_head_dim: int, eps: float,
    scratch: _Array) -> None: ...

def mega_fused_attention_prefill_scratch_size(
    tokens: int, aligned_embed_dim: int, num_heads: int, aligned_head_dim: int) -> int: ...

def mega_fused_attention_prefill_q8_0_scratch_size(
    tokens: int, aligned_embed_dim: int, num_heads: int, aligned_head_dim: int) -> int: ...

def mega_fused_outproj_mlp_prefill(
    output: _F32, attn_out: _F32, residual: Optional[_F32], ln2_gamma: _F32, wo: _Array,
    bo: Optional[_F32], wo_dt: _DType, w1: _Array, b1: Optional[_F32], w1_dt: _DType,
    w2: _Array, b2: Optional[_F32], w2_dt: _DType, tokens: int, embed_dim: int,
    aligned_embed_dim: int, num_heads: int, aligned_head_dim: int, intermediate_dim: int,
    aligned_intermediate_dim: int, eps: float, scratch: _Array) -> None: ...

def mega_fused_outproj_mlp_prefill_scratch_size(
    tokens: int, aligned_embed_dim: int, num_heads: int, aligned_head_dim: int,
    aligned_intermediate_dim: int) -> int: ...

def mega_fused_mlp_prefill(
    output: _F32, input: _F32, residual: Optional[_F32], ln2_gamma: _F32, w1: _Array,
    b1: Optional[_F32], w1_dt: _DType, w2: _Array, b2: Optional[_F32], w2_dt: _DType,
    tokens: int, embed_dim: int, aligned_embed_dim: int, intermediate_dim: int,
    aligned_intermediate_dim: int, eps: float, scratch: _Array) -> None: ...

def mega_fused_mlp_prefill_scratch_size(
    tokens: int, aligned_embed_dim: int, aligned_intermediate_dim: int) -> int: ...

def mega_fused_outproj_mlp_prefill_f32(
    output: _F32, attn_out: _F32, residual: Optional[_F32], ln2_gamma: _F32, wo: _Array,
    bo: Optional[_F32], wo_dt: _DType, w1: _Array, b1: Optional[_F32], w1_dt: _DType,
    w2: _Array, b2: Optional[_F32], w2_dt: _DType, tokens: int, embed_dim: int,
    aligned_embed_dim: int, num_heads: int, aligned_head_dim: int, intermediate_dim: int,
    aligned_intermediate_dim: int, eps: float, scratch: _Array) -> None: ...

def mega_fused_mlp_prefill_f32(
    output: _F32, input: _F32, residual: Optional[_F32], ln2_gamma: _F32, w1: _Array,
    b1: Optional[_F32], w1_dt: _DType, w2: _Array, b2: Optional[_F32], w2_dt: _DType,
    tokens: int, embed_dim: int, aligned_embed_dim: int, intermediate_dim: int,
    aligned_intermediate_dim: int, eps: float, scratch: _Array) -> None: ...

def mega_fuse_rmsnorm_qkv(
    q_out: _F32, k_out: _F32, v_out: _F32, input: _F32, gamma: _F32, W_qkv: _F32,
    b_qkv: Optional[_F32], hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
    eps: float) -> None: ...

def mega_fuse_rmsnorm_qkv_rope(
    q_out: _F32, k_out: _F32, v_out: _F32, input: _F32, gamma: _F32, W_qkv: _F32,
    b_qkv: Optional[_F32], rope_cos: Optional[_F32], rope_sin: Optional[_F32], pos: int,
    hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, max_seq: int,
    eps: float) -> None: ...

def mega_fuse_get_optimal_tiles(head_dim: int) -> Tuple[int, int]: ...

def mega_fuse_report_stats(
    hidden: int, num_layers: int, seq_len: int) -> Dict[str, Union[int, float]]: ...

# ---- weight formats ------------------------------------------------------------------------

def quantize(x: _F32, dtype: _DType) -> _Array: ...
def dequantize(blob: _Array, dtype: _DType, shape: _Shape) -> _F32: ...

# ---- data types (ckernel_dtype.h) ----------------------------------------------------------

def CK_DT_MASK(dt: _DType) -> int: ...
def ck_dtype_is_quantized(dt: _DType) -> bool: ...
def ck_dtype_bytes(dt: _DType) -> int: ...
def ck_dtype_block_size(dt: _DType) -> int: ...
def ck_dtype_block_bytes(dt: _DType) -> int: ...
def ck_dtype_row_bytes(dt: _DType, n_elements: int) -> int: ...
def ck_dtype_supported(mask: int, dt: _DType) -> bool: ...

# ---- configuration -------------------------------------------------------------------------

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def simd_level() -> str: ...
def get_include() -> str: ...
def show_config(file: Optional[IO[str]] = None) -> Dict[str, Any]: ...
