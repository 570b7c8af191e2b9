# Tiled flash attention with an online softmax.
#
# No score array longer than one KV tile exists anywhere: the scores of a tile live on the stack
# (at most MF_MAX_KV_TILE floats), and a running max m and sum l per query row rescale that row's
# accumulator between tiles (the online softmax of Milakov & Gimelshein, as FlashAttention uses
# it).  Each row is normalised once, at the end.


cdef inline void online_softmax_tile(
        const float *q,        # [D]: one query row
        const float *k_tile,   # [n, Da]: keys of the tile
        const float *v_tile,   # [n, Da]: values of the tile
        Py_ssize_t n, Py_ssize_t D, Py_ssize_t Da, float scale,
        float *m, float *l,    # running max and sum of the row, updated
        float *acc) noexcept nogil:   # [D]: the row's unnormalised output, updated
    cdef float scores[MF_MAX_KV_TILE]
    cdef float tile_max = -INFINITY
    cdef float m_new, alpha, p
    cdef Py_ssize_t j
    for j in range(n):
        scores[j] = mf_dot_f32(q, k_tile + j * Da, D) * scale
        if scores[j] > tile_max:
            tile_max = scores[j]
    m_new = m[0] if m[0] >= tile_max else tile_max
    if m_new > m[0] and l[0] != 0.0:
        alpha = expf(m[0] - m_new)
        l[0] = l[0] * alpha
        mf_scale_f32(acc, alpha, D)
    for j in range(n):
        p = expf(scores[j] - m_new)
        l[0] = l[0] + p
        mf_axpy_f32(acc, p, v_tile + j * Da, D)
    m[0] = m_new


cdef void attend_one_query(
        const float *q,        # [D] (a head of stride Da)
        const float *k_g,      # [n_keys, Da]: kv head g of the K cache, positions 0..n_keys-1
        const float *v_g,      # [n_keys, Da]: the same rows of the V cache
        Py_ssize_t n_keys, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out) noexcept nogil:   # [Da] out: softmax(q.k * scale) @ v; dims >= D are 0
    cdef float m = -INFINITY, l = 0.0
    cdef Py_ssize_t t0 = 0, n
    memset(out, 0, Da * sizeof(float))
    while t0 < n_keys:
        n = min(kv_tile, n_keys - t0)
        online_softmax_tile(q, k_g + t0 * Da, v_g + t0 * Da, n, D, Da, scale, &m, &l, out)
        t0 += n
    mf_scale_f32(out, 1.0 / l, D)


cdef void attend_query_tile(
        const float *q,        # [nq, ldq]: query rows of one head (head dims at stride 1)
        Py_ssize_t ldq,
        const float *k_g,      # [>last position, Da]: kv head g of the K cache
        const float *v_g,      # [>last position, Da]: the same rows of the V cache
        Py_ssize_t first_pos,  # absolute position of query row 0; row i is at first_pos + i
        Py_ssize_t nq, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out,            # [nq, ldo] out: row i = softmax over keys 0..first_pos+i, @ v
        Py_ssize_t ldo) noexcept nogil:
    """FlashAttention-2 order for one (head, query tile): KV tiles outer (each K/V tile stays in
    L1 while every query row of the tile uses it), query rows inner; only tiles that reach past
    a row's position are cut short (the causal mask touches the diagonal tiles only)."""
    cdef float m[MF_MAX_Q_TILE]
    cdef float l[MF_MAX_Q_TILE]
    cdef Py_ssize_t i, t0 = 0, n, n_row
    cdef Py_ssize_t n_keys = first_pos + nq      # keys the last row sees
    for i in range(nq):
        m[i] = -INFINITY
        l[i] = 0.0
        memset(out + i * ldo, 0, Da * sizeof(float))
    while t0 < n_keys:
        n = min(kv_tile, n_keys - t0)
        for i in range(nq):
            n_row = min(n, first_pos + i + 1 - t0)   # keys of this tile row i may see
            if n_row > 0:
                online_softmax_tile(q + i * ldq, k_g + t0 * Da, v_g + t0 * Da, n_row, D, Da,
                                    scale, &m[i], &l[i], out + i * ldo)
        t0 += n
    for i in range(nq):
        mf_scale_f32(out + i * ldo, 1.0 / l[i], D)
