# Tiled flash attention with an online softmax.
#
# Prefill runs blocks of 16 query rows through include/megafuse/mf_attention.h (GEMM register
# blocks for Q.K^T and P.V, the softmax vectorised across the 16 queries); decode (the query
# heads of one kv group, all at one position) and head dims above 256 run attend_query_tile
# below.
#
# No score array longer than one KV tile exists anywhere: the scores of a tile live on the stack
# (at most MF_MAX_KV_TILE floats a query row), and a running max m and sum l per query row rescale
# that row's accumulator between tiles (the online softmax of Milakov & Gimelshein, as
# FlashAttention uses it).  Each row is normalised once, at the end.  Scores come from register
# blocks (3 query rows x 4 keys); exp runs vectorised over a row of the tile.

cdef extern from "megafuse/mf_attention.h" nogil:
    enum: MF_ATT_QUERIES                 # 16 query rows a block
    enum: MF_ATT_MAX_HEAD_DIM            # 256
    void mf_attend_block_f32(const float *q, Py_ssize_t ldq, const float *k, const float *v,
                             Py_ssize_t Da, Py_ssize_t first_pos, Py_ssize_t pos_step, int nq,
                             Py_ssize_t D, float scale, Py_ssize_t kv_tile, float *out,
                             Py_ssize_t ldo)
    void mf_attend_range_f32(const float *q, Py_ssize_t ldq, const float *k, const float *v,
                             Py_ssize_t Da, Py_ssize_t first_pos, Py_ssize_t pos_step, int nq,
                             Py_ssize_t D, float scale, Py_ssize_t kv_tile, Py_ssize_t key_begin,
                             Py_ssize_t key_end, float *out, Py_ssize_t ldo, float *m_out,
                             float *l_out)
    void mf_attend_combine_f32(const float *acc, Py_ssize_t ld_part, const float *m,
                               const float *l, Py_ssize_t ld_ml, int n_seg, Py_ssize_t D,
                               Py_ssize_t Da, float *out)


cdef inline void softmax_update(
        float *scores,         # [n]: this row's scores of the tile (overwritten by exp)
        Py_ssize_t n,
        const float *v_tile,   # [n, Da]: values of the tile
        Py_ssize_t D, Py_ssize_t Da,
        float *m, float *l,    # running max and sum of the row, updated
        float *acc) noexcept nogil:   # [D]: the row's unnormalised output, updated
    cdef float tile_max = -INFINITY
    cdef float m_new, alpha
    cdef Py_ssize_t j
    for j in range(n):
        if scores[j] > tile_max:
            tile_max = scores[j]
    m_new = m[0] if m[0] >= tile_max else tile_max
    if m_new > m[0] and l[0] != 0.0:
        alpha = expf(m[0] - m_new)
        l[0] = l[0] * alpha
        mf_scale_f32(acc, alpha, D)
    l[0] = l[0] + mf_exp_shift_sum_f32(scores, m_new, n)
    for j in range(n):
        mf_axpy_f32(acc, scores[j], v_tile + j * Da, D)
    m[0] = m_new


cdef void attend_query_tile(
        const float *q,        # [nq, ldq]: query rows of one head (head dims at stride 1)
        Py_ssize_t ldq,
        const float *k_g,      # [>last position, Da]: kv head g of the K cache
        const float *v_g,      # [>last position, Da]: the same rows of the V cache
        Py_ssize_t first_pos,  # absolute position of query row 0
        Py_ssize_t pos_step,   # row i is at first_pos + i * pos_step (1: prefill rows of one
                               # head; 0: decode, the query heads of one kv group at one position)
        Py_ssize_t nq, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out,            # [nq, ldo] out: row i = softmax over keys 0..its position, @ v
        Py_ssize_t ldo) noexcept nogil:
    """FlashAttention-2 order for one (head, query tile) -- or, in decode, for the query heads
    that share a kv head: KV tiles outer (each K/V tile stays in L1 while every query row uses
    it), query rows inner, 3 at a time through the 3 x 4 score block; only the tiles that reach
    past a row's position are cut short (the causal mask touches the diagonal tiles only)."""
    cdef float m[MF_MAX_Q_TILE]
    cdef float l[MF_MAX_Q_TILE]
    cdef float s[3][MF_MAX_KV_TILE]          # scores of 3 query rows for the tile
    cdef float blk[3][4]
    cdef const float *qp[3]
    cdef const float *kp[4]
    cdef Py_ssize_t i, i0, j0, r, c, t0 = 0, n, n_row, n_max
    cdef Py_ssize_t n_keys = first_pos + (nq - 1) * pos_step + 1   # keys the last row sees
    for i in range(nq):
        m[i] = -INFINITY
        l[i] = 0.0
        memset(out + i * ldo, 0, Da * sizeof(float))
    while t0 < n_keys:
        n = min(kv_tile, n_keys - t0)
        i0 = 0
        while i0 < nq:
            # keys the last row of this group of 3 sees
            n_max = min(n, first_pos + min(i0 + 2, nq - 1) * pos_step + 1 - t0)
            if n_max > 0:
                for r in range(3):
                    qp[r] = q + min(i0 + r, nq - 1) * ldq
                j0 = 0
                while j0 < n_max:
                    for c in range(4):
                        kp[c] = k_g + (t0 + min(j0 + c, n_max - 1)) * Da
                    mf_dot_3x4_f32(qp, kp, D, blk)
                    for r in range(3):
                        for c in range(min(<Py_ssize_t>4, n_max - j0)):
                            s[r][j0 + c] = blk[r][c] * scale
                    j0 += 4
                for r in range(min(<Py_ssize_t>3, nq - i0)):
                    i = i0 + r
                    n_row = min(n, first_pos + i * pos_step + 1 - t0)   # keys row i may see
                    if n_row > 0:
                        softmax_update(s[r], n_row, v_g + t0 * Da, D, Da, &m[i], &l[i],
                                       out + i * ldo)
            i0 += 3
        t0 += n
    for i in range(nq):
        mf_scale_f32(out + i * ldo, 1.0 / l[i], D)


cdef void attend_query_rows(
        const float *q,        # [nq, ldq]: query rows of one head at consecutive positions
        Py_ssize_t ldq,
        const float *k_g,      # [>last position, Da]: kv head g of the K cache
        const float *v_g,      # [>last position, Da]: the same rows of the V cache
        Py_ssize_t first_pos,  # absolute position of query row 0 (row i: first_pos + i)
        Py_ssize_t nq, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out,            # [nq, ldo] out: row i = causal attention of query row i
        Py_ssize_t ldo) noexcept nogil:
    """Prefill's attention for one (head, query tile): blocks of 16 rows by mf_attend_block_f32
    (attend_query_tile for head dims above MF_ATT_MAX_HEAD_DIM)."""
    cdef Py_ssize_t b0 = 0
    if D > MF_ATT_MAX_HEAD_DIM:
        attend_query_tile(q, ldq, k_g, v_g, first_pos, 1, nq, D, Da, scale, kv_tile, out, ldo)
        return
    while b0 < nq:
        mf_attend_block_f32(q + b0 * ldq, ldq, k_g, v_g, Da, first_pos + b0, 1,
                            <int>min(<Py_ssize_t>MF_ATT_QUERIES, nq - b0), D, scale, kv_tile,
                            out + b0 * ldo, ldo)
        b0 += MF_ATT_QUERIES
