# RMSNorm -> Q/K/V projection -> RoPE (float32 weights).
#
# Dimension letters: E = embed (hidden) dim, Ea = its aligned row stride, H / G = query / kv heads,
# D = head_dim, Da = its aligned stride.  Padded dims (d >= D of a head, columns >= E of a row) are
# never read from the input and are written as 0.


cdef inline float rms_inverse(const float *x, Py_ssize_t E, float eps) noexcept nogil:
    """1 / sqrt(mean(x[:E]**2) + eps)."""
    return 1.0 / sqrtf(mf_dot_f32(x, x, E) / <float>E + eps)


cdef void project_qkv(
        const float *x,        # [E] (a row of stride Ea: only the first E columns are read)
        const float *gamma,    # [E]
        float inv_rms,
        const float *wq, const float *bq,    # [H*Da, Ea], [H*Da] or NULL
        const float *wk, const float *bk,    # [G*Da, Ea], [G*Da] or NULL
        const float *wv, const float *bv,    # [G*Da, Ea], [G*Da] or NULL
        float *q,              # [H*Da] out
        float *k,              # [G*Da] out
        float *v,              # [G*Da] out
        Py_ssize_t E, Py_ssize_t Ea, Py_ssize_t H, Py_ssize_t G,
        Py_ssize_t D, Py_ssize_t Da, int num_threads) noexcept nogil:
    """q = rmsnorm(x) @ wq.T + bq, likewise k and v; rows d >= D of each head are written as 0.

    One output element per loop iteration and a fixed-order dot product inside it: the result does
    not depend on how many threads share the rows.
    """
    cdef Py_ssize_t HDa = H * Da, GDa = G * Da
    cdef Py_ssize_t r, row
    cdef const float *w
    cdef const float *b
    cdef float *dst
    for r in prange(HDa + 2 * GDa, num_threads=num_threads, schedule='static', nogil=True):
        if r < HDa:
            row = r
            w = wq
            b = bq
            dst = q
        elif r < HDa + GDa:
            row = r - HDa
            w = wk
            b = bk
            dst = k
        else:
            row = r - HDa - GDa
            w = wv
            b = bv
            dst = v
        if row % Da >= D:
            dst[row] = 0.0
        else:
            dst[row] = mf_dot3_f32(w + row * Ea, x, gamma, E) * inv_rms
            if b != NULL:
                dst[row] = dst[row] + b[row]


cdef inline void rope_rotate_heads(
        float *x,              # [n_heads, Da]
        Py_ssize_t n_heads, Py_ssize_t D, Py_ssize_t Da,
        const float *cos_p,    # [D/2]: the table row of this token's position
        const float *sin_p) noexcept nogil:
    """Rotate-half RoPE of the first D dims of each head, in place."""
    cdef Py_ssize_t h, i, half = D // 2
    cdef float a, b
    cdef float *xh
    for h in range(n_heads):
        xh = x + h * Da
        for i in range(half):
            a = xh[i]
            b = xh[i + half]
            xh[i] = a * cos_p[i] - b * sin_p[i]
            xh[i + half] = a * sin_p[i] + b * cos_p[i]


cdef void rmsnorm_qkv_rope_kernel(
        float *q_out, float *k_out, float *v_out,
        const float *input, const float *gamma,
        const float *W_qkv,    # [(H+2G)*D, hidden]: q rows, then k rows, then v rows
        const float *b_qkv,    # [(H+2G)*D] or NULL
        const float *rope_cos, const float *rope_sin,
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, float eps,
        int num_threads) noexcept nogil:
    """mega_fuse_rmsnorm_qkv(_rope): the unaligned layout (E = Ea = hidden, Da = D)."""
    cdef Py_ssize_t E = hidden, H = num_heads, G = num_kv_heads, D = head_dim
    cdef const float *wk = W_qkv + H * D * E
    cdef const float *wv = wk + G * D * E
    cdef const float *bq = b_qkv
    cdef const float *bk = NULL
    cdef const float *bv = NULL
    if b_qkv != NULL:
        bk = b_qkv + H * D
        bv = bk + G * D
    project_qkv(input, gamma, rms_inverse(input, E, eps), W_qkv, bq, wk, bk, wv, bv,
                q_out, k_out, v_out, E, E, H, G, D, D, num_threads)
    if rope_cos != NULL:
        rope_rotate_heads(q_out, H, D, D, rope_cos + <Py_ssize_t>pos * (D // 2),
                          rope_sin + <Py_ssize_t>pos * (D // 2))
        rope_rotate_heads(k_out, G, D, D, rope_cos + <Py_ssize_t>pos * (D // 2),
                          rope_sin + <Py_ssize_t>pos * (D // 2))
