# RMSNorm -> Q/K/V projection -> RoPE (float32 weights): the projections decode uses, and the
# kernels of mega_fuse_rmsnorm_qkv and mega_fuse_rmsnorm_qkv_rope (at the end of this file).
#
# Dimension letters: E = embed (hidden) dim, Ea = its aligned row stride, H / G = query / kv heads,
# D = head_dim, Da = its aligned stride.  Padded dims (d >= D of a head, columns >= E of a row) are
# never read from the input and are written as 0.


cdef inline float rms_inverse(const float *x, Py_ssize_t E, float eps) noexcept nogil:
    """1 / sqrt(mean(x[:E]**2) + eps)."""
    return 1.0 / sqrtf(mf_dot_f32(x, x, E) / <float>E + eps)


cdef void qkv_rows_block(
        Py_ssize_t blk, Py_ssize_t n_bq, Py_ssize_t n_bkv,
        const float *x, const float *gamma, float inv_rms,
        const float *wq, const float *bq, const float *wk, const float *bk,
        const float *wv, const float *bv,
        float *q, float *k, float *v,
        Py_ssize_t E, Py_ssize_t Ea, Py_ssize_t HDa, Py_ssize_t GDa, Py_ssize_t D,
        Py_ssize_t Da) noexcept nogil:
    """Rows 4*blk .. 4*blk+3 of wq, wk or wv (whichever block `blk` falls in) for one token."""
    cdef const float *w
    cdef const float *b
    cdef float *dst
    cdef Py_ssize_t r0, n_rows, r, row
    cdef const float *rows[4]
    cdef float out4[4]
    if blk < n_bq:
        w, b, dst, r0, n_rows = wq, bq, q, blk * 4, HDa
    elif blk < n_bq + n_bkv:
        w, b, dst, r0, n_rows = wk, bk, k, (blk - n_bq) * 4, GDa
    else:
        w, b, dst, r0, n_rows = wv, bv, v, (blk - n_bq - n_bkv) * 4, GDa
    for r in range(4):
        rows[r] = w + min(r0 + r, n_rows - 1) * Ea
    mf_dot3_1x4_f32(x, gamma, rows, E, out4, w + (r0 + 4) * Ea)   # next: the following 4 rows
    for r in range(min(<Py_ssize_t>4, n_rows - r0)):
        row = r0 + r
        if row % Da >= D:
            dst[row] = 0.0
        else:
            dst[row] = out4[r] * inv_rms + (b[row] if b != NULL else 0.0)


cdef struct QkvJob:
    # the Q/K/V projections of one token (project_qkv_phase): x [E] (a row of stride Ea), gamma
    # [E], 1/rms(x); wq [H*Da, Ea], wk, wv [G*Da, Ea], biases or NULL; q [H*Da], k, v [G*Da] out
    const float *x
    const float *gamma
    float inv_rms
    const float *wq
    const float *bq
    const float *wk
    const float *bk
    const float *wv
    const float *bv
    float *q
    float *k
    float *v
    Py_ssize_t E, Ea, HDa, GDa, D, Da, n_bq, n_bkv


cdef void qkv_job_block(const void *ctx, Py_ssize_t arg, Py_ssize_t blk) noexcept nogil:
    cdef const QkvJob *c = <const QkvJob *>ctx
    qkv_rows_block(blk, c.n_bq, c.n_bkv, c.x, c.gamma, c.inv_rms, c.wq, c.bq, c.wk, c.bk, c.wv,
                   c.bv, c.q, c.k, c.v, c.E, c.Ea, c.HDa, c.GDa, c.D, c.Da)


cdef void project_qkv_phase(
        Job *job, QkvJob *c,   # c: filled here; must live until the job has run
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
        Py_ssize_t D, Py_ssize_t Da) noexcept nogil:
    """The phase q = rmsnorm(x) @ wq.T + bq, likewise k and v; rows d >= D of each head are
    written as 0.

    Blocks of 4 rows share each load of x * gamma (mf_dot3_1x4_f32); every output element is one
    fixed-order dot product, so the result does not depend on how many threads share the blocks.
    """
    c.x, c.gamma, c.inv_rms = x, gamma, inv_rms
    c.wq, c.bq, c.wk, c.bk, c.wv, c.bv = wq, bq, wk, bk, wv, bv
    c.q, c.k, c.v = q, k, v
    c.E, c.Ea, c.HDa, c.GDa, c.D, c.Da = E, Ea, H * Da, G * Da, D, Da
    c.n_bq, c.n_bkv = (c.HDa + 3) // 4, (c.GDa + 3) // 4
    job_add(job, qkv_job_block, c, 0, c.n_bq + 2 * c.n_bkv, 0)


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


cdef void rmsnorm_qkv_rope(
        float *q_out, float *k_out, float *v_out,
        const float *input, const float *gamma,
        const float *W_qkv,    # [(H+2G)*D, hidden]: q rows, then k rows, then v rows
        const float *b_qkv,    # [(H+2G)*D] or NULL
        const float *rope_cos, const float *rope_sin,   # [> pos rows, D/2] or NULL
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, float eps,
        mf_team *team, int num_threads) noexcept nogil:
    """Both phase functions: the unaligned layout (E = Ea = hidden, Da = D)."""
    cdef Py_ssize_t E = hidden, H = num_heads, G = num_kv_heads, D = head_dim
    cdef const float *wk = W_qkv + H * D * E
    cdef const float *wv = wk + G * D * E
    cdef const float *bq = b_qkv
    cdef const float *bk = NULL
    cdef const float *bv = NULL
    if b_qkv != NULL:
        bk = b_qkv + H * D
        bv = bk + G * D
    cdef Job job
    cdef QkvJob qkv
    job_init(&job, team, num_threads)
    project_qkv_phase(&job, &qkv, input, gamma, rms_inverse(input, E, eps), W_qkv, bq, wk, bk,
                      wv, bv, q_out, k_out, v_out, E, E, H, G, D, D)
    job_run(&job)
    if rope_cos != NULL:
        rope_rotate_heads(q_out, H, D, D, rope_cos + <Py_ssize_t>pos * (D // 2),
                          rope_sin + <Py_ssize_t>pos * (D // 2))
        rope_rotate_heads(k_out, G, D, D, rope_cos + <Py_ssize_t>pos * (D // 2),
                          rope_sin + <Py_ssize_t>pos * (D // 2))


cdef void mega_fuse_rmsnorm_qkv_kernel(
        float *q_out, float *k_out, float *v_out,    # [H*D], [G*D], [G*D]
        const float *input, const float *gamma,      # [hidden], [hidden]
        const float *W_qkv,    # [(H+2G)*D, hidden]
        const float *b_qkv,    # [(H+2G)*D] or NULL
        int hidden, int num_heads, int num_kv_heads, int head_dim, float eps,
        mf_team *team, int num_threads) noexcept nogil:
    rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, NULL, NULL, 0, hidden,
                     num_heads, num_kv_heads, head_dim, eps, team, num_threads)


cdef void mega_fuse_rmsnorm_qkv_rope_kernel(
        float *q_out, float *k_out, float *v_out,    # [H*D], [G*D], [G*D]
        const float *input, const float *gamma,      # [hidden], [hidden]
        const float *W_qkv,    # [(H+2G)*D, hidden]
        const float *b_qkv,    # [(H+2G)*D] or NULL
        const float *rope_cos, const float *rope_sin,   # [max_seq, D/2] or NULL
        int pos, int hidden, int num_heads, int num_kv_heads, int head_dim, int max_seq,
        float eps, mf_team *team, int num_threads) noexcept nogil:
    rmsnorm_qkv_rope(q_out, k_out, v_out, input, gamma, W_qkv, b_qkv, rope_cos, rope_sin, pos,
                     hidden, num_heads, num_kv_heads, head_dim, eps, team, num_threads)
