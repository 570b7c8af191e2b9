# include/megafuse/mf_scratch.h for Cython: the scratch layouts of the prefill and MLP kernels,
# shared by the size helpers of the boundary (megafuse/_kernels.pyx) and the kernels
# (kernels/levels/prefill.pxi, kernels/levels/mlp.pxi), so the two can never disagree.
#
# The layout functions compute in size_t without overflow checks: the boundary calls them only
# once it has proven a bound of their total to fit (megafuse/kernels/checks.pxi:
# _prefill_scratch_bound, _mlp_scratch_bound).

cdef extern from "megafuse/mf_scratch.h" nogil:
    enum: MF_MLP_TOKEN_TILE          # tokens a tile of the MLP kernels

    ctypedef struct mf_prefill_scratch:
        size_t a, b, c_q8_0, c_q8_k, d, q8_0_row, q8_k_row, total
    mf_prefill_scratch mf_prefill_scratch_layout(size_t T, size_t Ea, size_t H, size_t Da,
                                                 int int8_path)

    ctypedef struct mf_mlp_scratch:
        size_t tile, f, q, a, aq, q_row, aq_row, total
    mf_mlp_scratch mf_mlp_scratch_layout(size_t T, size_t Ea, size_t hda, size_t Ia)
