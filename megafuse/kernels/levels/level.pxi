# The kernels of one SIMD level.  Included by each kernels/levels/<level>.pyx, whose build flags
# decide which bodies of include/megafuse/mf_simd.h the family files below compile to.
#
# The module exports one thing: kernel_table(), a capsule holding a KernelTable of pointers to the
# kernels compiled here.  megafuse/_kernels.pyx validates every argument and then calls through it.

from cpython.pycapsule cimport PyCapsule_New
from libc.math cimport sqrtf, expf, tanhf, INFINITY
from libc.string cimport memcpy, memset
from cython.parallel cimport prange

from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from megafuse.kernels.kernel_table cimport (
    KernelTable, KERNEL_TABLE_VERSION, MF_ATT_MAX_KV_TILE, MF_MAX_Q_TILE, MF_SIMD_NAME,
    mf_team, mf_team_claim_gen, mf_team_wait_done, mf_team_chunk_done, mf_team_run,
    mf_team_run_detached,
    mf_atomic_load32, mf_atomic_store32, MF_TEAM_PAUSE,
    mf_model, mf_model_layer, mf_step, mf_phase, mf_phase_cut_lanes, mf_phase_take,
    mf_one_token_plan, mf_segment, MF_STEP_TOKENS, MF_STEP_SPLIT_FLOATS, MF_ACT_GELU_TANH,
    MF_STEP_MAX_SEGMENTS)
from megafuse._ckernel_dtype cimport (
    CKDataType, CK_DT_FP32, CK_DT_FP16, CK_DT_Q8_0, CK_DT_Q8_K, ck_dtype_block_size,
    ck_dtype_row_bytes)
from megafuse.kernels.mf_quant cimport (
    mf_dequantize_row, mf_quantize_row, mf_weight_row_dot_f32, mf_weight_row_dot_q8,
    mf_quantize_activation_row, mf_quantize_blocks_q8_0_act, mf_q8_0_act_pad,
    mf_activation_row_bytes, mf_activation_dtype, mf_q8_rows_tokens, mf_q8_rows16_tokens,
    MF_Q8_TILE_TOKENS, mf_q8_tile_tokens, mf_q8_rows16_tile_tokens, mf_dot4_f32_fn,
    mf_dot4_f32_for, mf_dot4x2_f32_fn, mf_dot4x2_f32_for, mf_dot4_q8_fn,
    mf_dot4_q8_for, mf_q_fp16_table_init)
from megafuse.kernels.mf_scratch cimport (
    mf_prefill_scratch, mf_prefill_scratch_layout, mf_mlp_scratch, mf_mlp_scratch_layout,
    MF_MLP_TOKEN_TILE)

cdef extern from "megafuse/mf_simd.h" nogil:
    float mf_dot_f32(const float *a, const float *b, Py_ssize_t n)
    float mf_dot3_f32(const float *w, const float *x, const float *g, Py_ssize_t n)
    void mf_axpy_f32(float *y, float a, const float *x, Py_ssize_t n)
    void mf_scale_f32(float *y, float a, Py_ssize_t n)
    void mf_dot_3x4_f32(const float *const *x, const float *const *w, Py_ssize_t n,
                        float (*out)[4])
    void mf_dot_1x4_f32(const float *x, const float *const *w, Py_ssize_t n, float *out,
                        const void *ahead)
    void mf_dot3_1x4_f32(const float *x, const float *g, const float *const *w, Py_ssize_t n,
                         float *out, const void *ahead)
    float mf_exp_shift_sum_f32(float *s, float m, Py_ssize_t n)
    void mf_silu_mul_f32(const float *g, const float *u, float *out, Py_ssize_t n)
    void mf_gelu_tanh_mul_f32(const float *g, const float *u, float *out, Py_ssize_t n)

include "team_job.pxi"
include "quant.pxi"
include "norm_qkv_rope.pxi"
include "attention.pxi"
include "decode.pxi"
include "gemm.pxi"
include "prefill.pxi"
include "mlp.pxi"
include "model_step.pxi"

mf_q_fp16_table_init()      # before any kernel of this level runs (mf_quant_common.h)

# slot <name>: kernel <name>_kernel (megafuse/kernels/kernel_table.pxd)
cdef KernelTable _TABLE
_TABLE.version = KERNEL_TABLE_VERSION
_TABLE.simd_level = MF_SIMD_NAME
_TABLE.mega_fused_attention_decode_workspace = mega_fused_attention_decode_workspace_kernel
_TABLE.mega_fuse_rmsnorm_qkv = mega_fuse_rmsnorm_qkv_kernel
_TABLE.mega_fuse_rmsnorm_qkv_rope = mega_fuse_rmsnorm_qkv_rope_kernel
_TABLE.mega_fused_attention_prefill = mega_fused_attention_prefill_kernel
_TABLE.mega_fused_attention_prefill_q8_0 = mega_fused_attention_prefill_q8_0_kernel
_TABLE.mega_fused_outproj_mlp_prefill = mega_fused_outproj_mlp_prefill_kernel
_TABLE.mega_fused_mlp_prefill = mega_fused_mlp_prefill_kernel
_TABLE.mega_fused_outproj_mlp_prefill_f32 = mega_fused_outproj_mlp_prefill_f32_kernel
_TABLE.mega_fused_mlp_prefill_f32 = mega_fused_mlp_prefill_f32_kernel
_TABLE.quantize = quantize_kernel
_TABLE.dequantize = dequantize_kernel
_TABLE.rows_dot = rows_dot_kernel
_TABLE.quantize_activations = quantize_activations_kernel
_TABLE.model_forward = model_forward_kernel
_TABLE.model_batch = model_batch_kernel

SIMD_LEVEL = (<bytes>MF_SIMD_NAME).decode()


def kernel_table():
    """A capsule ("megafuse.KernelTable") holding this level's table of kernel pointers."""
    return PyCapsule_New(<void *>&_TABLE, b"megafuse.KernelTable", NULL)
