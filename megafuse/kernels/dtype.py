"""megafuse.CKDataType: the data types of weights and activations (upstream's enum values).

The one Python definition of the enum: megafuse, its layer and GGUF modules and megafuse.reference
(which needs no compiled code) all import it from here; Cython code uses the C enum of
include/megafuse/ckernel_dtype.h (megafuse/_ckernel_dtype.pxd), and importing megafuse._kernels
checks that the two agree value for value.
"""
from enum import IntEnum
from typing import Any


class CKDataType(IntEnum):
    """Values of include/megafuse/ckernel_dtype.h (docs/contract.md §2).

    Weight formats: FP32, BF16, FP16 and the GGML block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    IQ4_NL (32 weights a block) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (256).  Q8_K is the
    activation format of the 256-weight formats' integer dot products; INT8 / INT4 have no scales
    and are not weight formats.  Values 0..13 are upstream's; Q2_K, Q3_K, IQ4_NL and IQ4_XS
    (14..17) are megafuse's own (docs/contract.md §2).
    """
    FP32 = 0
    BF16 = 1
    FP16 = 2
    INT8 = 3
    INT4 = 4
    Q4_0 = 5
    Q4_1 = 6
    Q4_K = 7
    Q6_K = 8
    Q8_0 = 9
    Q8_K = 10
    Q5_0 = 11
    Q5_1 = 12
    Q5_K = 13
    Q2_K = 14
    Q3_K = 15
    IQ4_NL = 16
    IQ4_XS = 17
    COUNT = 18


CK_DT_FP32 = CKDataType.FP32
CK_DT_BF16 = CKDataType.BF16
CK_DT_FP16 = CKDataType.FP16
CK_DT_INT8 = CKDataType.INT8
CK_DT_INT4 = CKDataType.INT4
CK_DT_Q4_0 = CKDataType.Q4_0
CK_DT_Q4_1 = CKDataType.Q4_1
CK_DT_Q4_K = CKDataType.Q4_K
CK_DT_Q6_K = CKDataType.Q6_K
CK_DT_Q8_0 = CKDataType.Q8_0
CK_DT_Q8_K = CKDataType.Q8_K
CK_DT_Q5_0 = CKDataType.Q5_0
CK_DT_Q5_1 = CKDataType.Q5_1
CK_DT_Q5_K = CKDataType.Q5_K
CK_DT_Q2_K = CKDataType.Q2_K
CK_DT_Q3_K = CKDataType.Q3_K
CK_DT_IQ4_NL = CKDataType.IQ4_NL
CK_DT_IQ4_XS = CKDataType.IQ4_XS
CK_DT_COUNT = CKDataType.COUNT


# What a KV cache may hold (the kv_dtype= of megafuse.Model, DecoderLayer and
# megafuse.reference.model_forward), by the NumPy dtype name of the cache.
KV_DTYPES = ("float32", "float16")


def kv_cache_dtype(kv_dtype: Any) -> str:
    """kv_dtype checked: "float32" or "float16" (the cache's NumPy dtype name); ValueError else."""
    if not isinstance(kv_dtype, str) or kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype: expected 'float32' or 'float16', got {kv_dtype!r}")
    return kv_dtype
