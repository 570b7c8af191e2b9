# Tiled flash attention with an online softmax.
#
# No score array longer than one KV tile exists anywhere: scores of a tile live on the stack
# (at most MF_MAX_KV_TILE floats), and the running max / sum rescale the accumulator between tiles
# (Milakov & Gimelshein's online softmax, as FlashAttention uses it).


cdef void attend_one_query(
        const float *q,        # [D] (a head of stride Da)
        const float *k_g,      # [n_keys, Da]: kv head g of the K cache, positions 0..n_keys-1
        const float *v_g,      # [n_keys, Da]: the same rows of the V cache
        Py_ssize_t n_keys, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out) noexcept nogil:   # [Da] out: softmax(q.k * scale) @ v; dims >= D are 0
    cdef float scores[MF_MAX_KV_TILE]
    cdef float m = -INFINITY        # running max of the scores seen so far
    cdef float l = 0.0              # running sum of exp(score - m)
    cdef float tile_max, m_new, alpha, p
    cdef Py_ssize_t t0, j, n
    memset(out, 0, Da * sizeof(float))
    t0 = 0
    while t0 < n_keys:
        n = min(kv_tile, n_keys - t0)
        tile_max = -INFINITY
        for j in range(n):
            scores[j] = mf_dot_f32(q, k_g + (t0 + j) * Da, D) * scale
            if scores[j] > tile_max:
                tile_max = scores[j]
        m_new = m if m >= tile_max else tile_max
        if m_new > m and l != 0.0:
            alpha = expf(m - m_new)
            l = l * alpha
            mf_scale_f32(out, alpha, D)
        for j in range(n):
            p = expf(scores[j] - m_new)
            l = l + p
            mf_axpy_f32(out, p, v_g + (t0 + j) * Da, D)
        m = m_new
        t0 += n
    mf_scale_f32(out, 1.0 / l, D)
