# The fused block over T tokens: RMSNorm -> Q/K/V -> RoPE -> KV-cache write -> causal flash
# attention -> out-projection + bias + residual.  Weights in any format, each its own.
# Kernels of mega_fused_attention_prefill (float activations) and mega_fused_attention_prefill_q8_0
# (the int8 path), at the end of this file: both are fused_prefill.
#
# Scratch (include/megafuse/mf_scratch.h): region A [T, H*Da] q (then the quantized attention
# rows), region B [T, max(Ea, H*Da)] the normalised input (then the attention output), region C
# (int8 path) the quantized normalised input.  k and v go straight into the cache.

cdef enum:
    PREFILL_TOKEN_TILE = PACK_TOKEN_TILE   # tokens a pass of the weight rows
    ONE_TOKEN_MAX_GROUPS = 256   # kv groups one token's queue takes (its flags on the stack)


cdef inline void rmsnorm_row(const float *x, const float *gamma, Py_ssize_t E, Py_ssize_t Ea,
                             float eps, float *y) noexcept nogil:
    """y[:E] = x[:E] / sqrt(mean(x[:E]**2) + eps) * gamma; y[E:Ea] = 0."""
    cdef float inv = rms_inverse(x, E, eps)
    cdef Py_ssize_t e
    for e in range(E):
        y[e] = x[e] * inv * gamma[e]
    for e in range(E, Ea):
        y[e] = 0.0


cdef inline int activation_format(int weight_dt) noexcept nogil:
    """Q8_0 for the 32-weight block formats, Q8_K for the K-quants (the format layer's
    choice, include/megafuse/mf_quant.h)."""
    return mf_activation_dtype(weight_dt)


cdef inline const char *activation_rows(
        int dt, const char *xq0, Py_ssize_t q8_0_row, const char *xqk, Py_ssize_t q8_k_row,
        Py_ssize_t *row) noexcept nogil:
    """The quantized rows weights of format dt read (Q8_0 or Q8_K), or NULL (float rows)."""
    row[0] = 0
    if not uses_q8_activations(dt):
        return NULL
    if activation_format(dt) == CK_DT_Q8_0:
        row[0] = q8_0_row
        return xq0
    row[0] = q8_k_row
    return xqk


cdef void qkv_block(
        Py_ssize_t blk, Py_ssize_t n_bq, Py_ssize_t n_bkv,
        const void *wq, const float *bq, int wq_dt,
        const void *wk, const float *bk, int wk_dt,
        const void *wv, const float *bv, int wv_dt,
        float *q,              # [T, H*Da]
        float *kv_cache_k,     # [G, C, Da]: rows S .. S+T-1 receive k
        float *kv_cache_v,     # [G, C, Da]: rows S .. S+T-1 receive v
        const float *xn,       # [T, Ea] normalised input
        const char *xq0, Py_ssize_t q8_0_row,    # [T, q8_0_row] or NULL
        const char *xqk, Py_ssize_t q8_k_row,    # [T, q8_k_row] or NULL
        Py_ssize_t T, Py_ssize_t S, Py_ssize_t C, Py_ssize_t Ea, Py_ssize_t H, Py_ssize_t G,
        Py_ssize_t D, Py_ssize_t Da) noexcept nogil:
    """Block `blk` of the Q/K/V projections: 64 rows of wq, wk or wv against every token.
    q rows land in q[t, row]; k and v rows (kv head g = row / Da, dim d = row % Da) go straight
    to the caches at [g, S + t, d].  Padded dims (d >= D) are written as 0."""
    cdef RowBlock rb
    cdef const char *w
    cdef const float *b
    cdef float *cache
    cdef int dt
    cdef Py_ssize_t r0, n_rows, row, r, ld, w_row
    cdef const char *xq
    cdef Py_ssize_t xq_row
    if blk < n_bq:
        w, b, dt, r0, n_rows, ld = <const char *>wq, bq, wq_dt, blk * GEMM_ROWS, H * Da, H * Da
    elif blk < n_bq + n_bkv:
        w, b, dt, r0, n_rows, ld = <const char *>wk, bk, wk_dt, (blk - n_bq) * GEMM_ROWS, G * Da, Da
        cache = kv_cache_k
    else:
        w, b, dt, r0, n_rows, ld = (<const char *>wv, bv, wv_dt, (blk - n_bq - n_bkv) * GEMM_ROWS,
                                    G * Da, Da)
        cache = kv_cache_v
    w_row = ck_dtype_row_bytes(dt, Ea)
    xq = activation_rows(dt, xq0, q8_0_row, xqk, q8_k_row, &xq_row)
    rb.n = 0
    for r in range(GEMM_ROWS):
        row = r0 + r
        if row >= n_rows:
            break
        rb.w[r] = w + row * w_row
        rb.bias[r] = b[row] if b != NULL else 0.0
        rb.add[r] = NULL
        if blk < n_bq:
            rb.out[r] = q + row
        else:
            rb.out[r] = cache + ((row // Da) * C + S) * Da + row % Da
        rb.n += 1
    block_dot_tokens(&rb, dt, Ea, xn, Ea, xq, xq_row, T, ld)
    for r in range(rb.n):
        if (r0 + r) % Da >= D:
            zero_column(rb.out[r], ld, T)


cdef void project_one_token(
        const char *w, int dt, const float *b,   # [rows, Ea] in dt, [rows] or NULL
        Py_ssize_t r0, Py_ssize_t r1,
        float *out,            # [r1 - r0]: out[r - r0] = w[r] . xn + b[r]; 0 where r % Da >= D
        const float *xn,       # [Ea] the normalised input
        const char *xq0, Py_ssize_t q8_0_row, const char *xqk, Py_ssize_t q8_k_row,
        Py_ssize_t Ea, Py_ssize_t D, Py_ssize_t Da) noexcept nogil:
    """Rows r0 .. r1-1 of one projection against one token, GEMM_ROWS rows a block: each row's
    bits are those qkv_block gives it (a row's dot depends on no other row)."""
    cdef RowBlock rb
    cdef Py_ssize_t w_row = ck_dtype_row_bytes(dt, Ea), xq_row, row = r0
    cdef const char *xq = activation_rows(dt, xq0, q8_0_row, xqk, q8_k_row, &xq_row)
    while row < r1:
        rb.n = 0
        while rb.n < GEMM_ROWS and row < r1:
            rb.w[rb.n] = w + row * w_row
            rb.bias[rb.n] = b[row] if b != NULL else 0.0
            rb.add[rb.n] = NULL
            rb.out[rb.n] = out + (row - r0)
            rb.n += 1
            row += 1
        block_dot_tokens(&rb, dt, Ea, xn, Ea, xq, xq_row, 1, 1)
    for row in range(r0, r1):
        if row % Da >= D:
            out[row - r0] = 0.0


cdef void one_token_queue_task(
        Py_ssize_t i, Py_ssize_t ahead, const OneTokenPlan *plan, uint32_t *ready,
        const void *wq, const float *bq, int wq_dt,
        const void *wk, const float *bk, int wk_dt,
        const void *wv, const float *bv, int wv_dt,
        float *q,              # [H, Da]
        float *kv_cache_k,     # [G, C, Da]: row S receives k
        float *kv_cache_v,     # [G, C, Da]: row S receives v
        const float *xn,       # [Ea]
        const char *xq0, Py_ssize_t q8_0_row, const char *xqk, Py_ssize_t q8_k_row,
        const float *cos_p, const float *sin_p,   # [D/2] the rows of position S, or NULL
        Py_ssize_t S, Py_ssize_t C, Py_ssize_t Ea, Py_ssize_t H, Py_ssize_t G, Py_ssize_t D,
        Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *attn) noexcept nogil:     # [H, Da] out
    """Item i of one token's queue (fused_prefill, T = 1).  The queue is the `ahead` first
    groups' projections, then for each later group g its projections followed by the attention
    tasks of group g - ahead, then the attention of the last `ahead` groups.  Projecting group g
    (its query heads, k and v rows; RoPE; k, v into the cache at row S) sets ready[g]; an
    attention task of group g (one_token_task) waits for it.  Items are taken in order, and a
    group's projections come before its attention, so a wait always ends."""
    cdef Py_ssize_t n_att = plan.n_chunks, group = H // G, j, g, r, a, hq
    cdef bint project
    a = ahead
    if i < a:
        project, g = True, i
    elif i < a + (G - a) * (1 + n_att):
        j = i - a
        r = j % (1 + n_att)
        project = r == 0
        g = a + j // (1 + n_att) if project else j // (1 + n_att)
        r -= 1
    else:
        j = i - a - (G - a) * (1 + n_att)
        project, g, r = False, G - a + j // n_att, j % n_att
    if project:
        hq = g * group * Da
        project_one_token(<const char *>wq, wq_dt, bq, hq, hq + group * Da, q + hq, xn, xq0,
                          q8_0_row, xqk, q8_k_row, Ea, D, Da)
        project_one_token(<const char *>wk, wk_dt, bk, g * Da, (g + 1) * Da,
                          kv_cache_k + (g * C + S) * Da, xn, xq0, q8_0_row, xqk, q8_k_row,
                          Ea, D, Da)
        project_one_token(<const char *>wv, wv_dt, bv, g * Da, (g + 1) * Da,
                          kv_cache_v + (g * C + S) * Da, xn, xq0, q8_0_row, xqk, q8_k_row,
                          Ea, D, Da)
        if cos_p != NULL:
            rope_rotate_heads(q + hq, group, D, Da, cos_p, sin_p)
            rope_rotate_heads(kv_cache_k + (g * C + S) * Da, 1, D, Da, cos_p, sin_p)
        mf_atomic_store32(&ready[g], 1)
        return
    while mf_atomic_load32(&ready[g]) == 0:
        MF_TEAM_PAUSE()
    one_token_task(plan, g * n_att + r, q, kv_cache_k, kv_cache_v, False, S, H, G, D, Da, C,
                   scale, kv_tile, attn, NULL, NULL)


cdef struct PrefillJob:
    # what every phase of fused_prefill reads: its arguments, the scratch regions, the plan
    float *output              # [T, Ea]
    const float *input         # [T, Ea]
    const float *residual      # [T, Ea] or NULL
    const float *ln1_gamma     # [E]
    const void *wq
    const float *bq
    const void *wk
    const float *bk
    const void *wv
    const float *bv
    const void *wo
    const float *bo
    int wq_dt, wk_dt, wv_dt, wo_dt
    float *kv_cache_k          # [G, C, Da]
    float *kv_cache_v
    const float *rope_cos      # [>= S+T rows, D/2] or NULL
    const float *rope_sin
    Py_ssize_t E, Ea, H, G, D, Da, C, T, S, HDa, q_tile, kv_tile, n_bq, n_bkv, n_qt, group
    float eps, scale
    float *q                   # [T, H*Da]
    float *xn                  # [T, Ea]
    float *attn                # [T, H*Da]
    char *attn_q8              # [T, attn_q8_row]
    Py_ssize_t attn_q8_row
    int attn_fmt
    char *xq0                  # [T, q8_0_row] or NULL
    char *xqk                  # [T, q8_k_row] or NULL
    Py_ssize_t q8_0_row, q8_k_row, wo_row, ahead
    OneTokenPlan plan
    uint32_t ready[ONE_TOKEN_MAX_GROUPS]   # [G] the queue's groups projected


cdef void pf_rmsnorm(const void *ctx, Py_ssize_t arg, Py_ssize_t t) noexcept nogil:
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    rmsnorm_row(c.input + t * c.Ea, c.ln1_gamma, c.E, c.Ea, c.eps, c.xn + t * c.Ea)


cdef void pf_quantize(const void *ctx, Py_ssize_t arg, Py_ssize_t t) noexcept nogil:
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    if c.xq0 != NULL:
        quantize_activation_row(c.xn + t * c.Ea, c.xq0 + t * c.q8_0_row, c.Ea, CK_DT_Q8_0)
    if c.xqk != NULL:
        quantize_activation_row(c.xn + t * c.Ea, c.xqk + t * c.q8_k_row, c.Ea, CK_DT_Q8_K)


cdef void pf_qkv(const void *ctx, Py_ssize_t t0, Py_ssize_t blk) noexcept nogil:
    """Block blk of the Q/K/V projections for the token tile starting at t0."""
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    cdef Py_ssize_t nt = min(<Py_ssize_t>PREFILL_TOKEN_TILE, c.T - t0)
    qkv_block(blk, c.n_bq, c.n_bkv, c.wq, c.bq, c.wq_dt, c.wk, c.bk, c.wk_dt, c.wv, c.bv,
              c.wv_dt, c.q + t0 * c.HDa, c.kv_cache_k, c.kv_cache_v, c.xn + t0 * c.Ea,
              c.xq0 + t0 * c.q8_0_row if c.xq0 != NULL else NULL, c.q8_0_row,
              c.xqk + t0 * c.q8_k_row if c.xqk != NULL else NULL, c.q8_k_row,
              nt, c.S + t0, c.C, c.Ea, c.H, c.G, c.D, c.Da)


cdef void pf_rope(const void *ctx, Py_ssize_t arg, Py_ssize_t t) noexcept nogil:
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    cdef Py_ssize_t g, half = c.D // 2
    rope_rotate_heads(c.q + t * c.HDa, c.H, c.D, c.Da, c.rope_cos + (c.S + t) * half,
                      c.rope_sin + (c.S + t) * half)
    for g in range(c.G):
        rope_rotate_heads(c.kv_cache_k + (g * c.C + c.S + t) * c.Da, 1, c.D, c.Da,
                          c.rope_cos + (c.S + t) * half, c.rope_sin + (c.S + t) * half)


cdef void pf_attend(const void *ctx, Py_ssize_t arg, Py_ssize_t task) noexcept nogil:
    """Causal flash attention of one (head, query tile)."""
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    cdef Py_ssize_t h = task // c.n_qt, qt = task % c.n_qt
    cdef Py_ssize_t i0 = qt * c.q_tile
    cdef Py_ssize_t nq = min(c.q_tile, c.T - i0)
    attend_query_rows(c.q + i0 * c.HDa + h * c.Da, c.HDa,
                      c.kv_cache_k + (h // c.group) * c.C * c.Da,
                      c.kv_cache_v + (h // c.group) * c.C * c.Da, False, c.S + i0, nq, c.D,
                      c.Da, c.scale, c.kv_tile, c.attn + i0 * c.HDa + h * c.Da, c.HDa, NULL)


cdef void pf_queue(const void *ctx, Py_ssize_t arg, Py_ssize_t i) noexcept nogil:
    cdef PrefillJob *c = <PrefillJob *>ctx
    cdef Py_ssize_t half = c.D // 2
    one_token_queue_task(
        i, c.ahead, &c.plan, c.ready, c.wq, c.bq, c.wq_dt, c.wk, c.bk, c.wk_dt, c.wv, c.bv,
        c.wv_dt, c.q, c.kv_cache_k, c.kv_cache_v, c.xn, c.xq0, c.q8_0_row, c.xqk, c.q8_k_row,
        c.rope_cos + c.S * half if c.rope_cos != NULL else NULL,
        c.rope_sin + c.S * half if c.rope_cos != NULL else NULL,
        c.S, c.C, c.Ea, c.H, c.G, c.D, c.Da, c.scale, c.kv_tile, c.attn)


cdef void pf_quantize_attn(const void *ctx, Py_ssize_t arg, Py_ssize_t t) noexcept nogil:
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    quantize_activation_row(c.attn + t * c.HDa, c.attn_q8 + t * c.attn_q8_row, c.HDa, c.attn_fmt)


cdef void pf_outproj(const void *ctx, Py_ssize_t t0, Py_ssize_t blk) noexcept nogil:
    """Block blk of the out-projection (+ bias + residual) for the token tile starting at t0."""
    cdef const PrefillJob *c = <const PrefillJob *>ctx
    cdef Py_ssize_t nt = min(<Py_ssize_t>PREFILL_TOKEN_TILE, c.T - t0)
    linear_block(blk * GEMM_ROWS, <const char *>c.wo, c.wo_row, c.wo_dt, c.HDa, c.bo, c.E, c.Ea,
                 c.attn + t0 * c.HDa, c.HDa,
                 c.attn_q8 + t0 * c.attn_q8_row if c.attn_q8_row > 0 else NULL, c.attn_q8_row,
                 nt, c.output + t0 * c.Ea,
                 c.residual + t0 * c.Ea if c.residual != NULL else NULL, c.Ea)


cdef void fused_prefill(
        float *output,             # [T, Ea]: columns >= E written as 0
        const float *input,        # [T, Ea]
        const float *residual,     # [T, Ea] or NULL
        const float *ln1_gamma,    # [E]
        const void *wq, const float *bq, int wq_dt,   # [H*Da, Ea] in wq_dt, [H*Da]
        const void *wk, const float *bk, int wk_dt,   # [G*Da, Ea] in wk_dt, [G*Da]
        const void *wv, const float *bv, int wv_dt,   # [G*Da, Ea] in wv_dt, [G*Da]
        const void *wo, const float *bo, int wo_dt,   # [Ea, H*Da] in wo_dt, [Ea]
        float *kv_cache_k,         # [G, cache_capacity, Da]
        float *kv_cache_v,         # [G, cache_capacity, Da]
        const float *rope_cos,     # [>= start_pos+T rows, D/2] or NULL
        const float *rope_sin,
        int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
        int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
        void *scratch,             # mf_prefill_scratch_layout(...).total bytes
        int int8_path, int q_tile, int kv_tile, mf_team *team, int num_threads) noexcept nogil:
    """Both prefills: int8_path = 0 keeps every activation float32 (block-format weights
    dequantized as they are read); 1 quantizes the normalised input and the attention output
    rows for the block-format weights' integer dot products.  One job of the team (a few, for
    many token tiles): its phases below, each after the one before."""
    cdef Py_ssize_t T = tokens, H = num_heads, G = num_kv_heads, Ea = aligned_embed_dim
    cdef Py_ssize_t Da = aligned_head_dim, HDa = H * Da, GDa = G * Da
    cdef mf_prefill_scratch layout = mf_prefill_scratch_layout(T, Ea, H, Da, int8_path)
    cdef char *base = <char *>scratch
    cdef bint need_q8_0 = False, need_q8_k = False
    cdef Py_ssize_t t0
    cdef int dt, fmt
    cdef bint queue = False         # one token: phases 1-2 as one queue of kv groups
    cdef Job job
    cdef PrefillJob c
    cdef OneTokenJob att

    c.output, c.input, c.residual, c.ln1_gamma = output, input, residual, ln1_gamma
    c.wq, c.bq, c.wk, c.bk, c.wv, c.bv, c.wo, c.bo = wq, bq, wk, bk, wv, bv, wo, bo
    c.wq_dt, c.wk_dt, c.wv_dt, c.wo_dt = wq_dt, wk_dt, wv_dt, wo_dt
    c.kv_cache_k, c.kv_cache_v, c.rope_cos, c.rope_sin = kv_cache_k, kv_cache_v, rope_cos, rope_sin
    c.E, c.Ea, c.H, c.G, c.D, c.Da = embed_dim, Ea, H, G, head_dim, Da
    c.C, c.T, c.S, c.HDa, c.group = cache_capacity, T, start_pos, HDa, H // G
    c.q_tile, c.kv_tile, c.eps = q_tile, kv_tile, eps
    c.scale = 1.0 / sqrtf(<float>head_dim)
    c.q = <float *>(base + layout.a)             # [T, H*Da]   phases 1-2
    c.attn_q8 = base + layout.a                  # [T, q8 row of H*Da]  phase 3
    c.xn = <float *>(base + layout.b)            # [T, Ea]     phase 1
    c.attn = <float *>(base + layout.b)          # [T, H*Da]   phases 2-3 (queue: region D)
    c.wo_row = ck_dtype_row_bytes(wo_dt, HDa)
    c.attn_q8_row = 0
    c.attn_fmt = 0
    c.q8_0_row, c.q8_k_row = layout.q8_0_row, layout.q8_k_row
    c.n_bq = (HDa + GEMM_ROWS - 1) // GEMM_ROWS
    c.n_bkv = (GDa + GEMM_ROWS - 1) // GEMM_ROWS
    c.n_qt = 0

    if int8_path:
        for dt in range(3):                 # which activation formats do wq, wk, wv need?
            fmt = wq_dt if dt == 0 else (wk_dt if dt == 1 else wv_dt)
            if uses_q8_activations(fmt):
                if activation_format(fmt) == CK_DT_Q8_0:
                    need_q8_0 = True
                else:
                    need_q8_k = True
    c.xq0 = base + layout.c_q8_0 if need_q8_0 else NULL   # [T, Q8_0 row of Ea]  phase 1
    c.xqk = base + layout.c_q8_k if need_q8_k else NULL   # [T, Q8_K row of Ea]  phase 1
    if T == 1:
        c.plan = one_token_plan(start_pos, 0, H, G, head_dim, Da)
        # (a few groups -- Qwen2's 2, SmolLM2's 3 on 2 threads -- would leave a thread idle
        # through the projections, which the phases below share row block by row block)
        queue = (c.plan.kind != ONE_TOKEN_SPLIT and G >= 2 * num_threads
                 and G <= ONE_TOKEN_MAX_GROUPS)
    job_init(&job, team, num_threads)

    if queue:
        # ---- one token, phases 1-2 as one queue of kv groups (one_token_queue_task) ----------
        # The attention of a group needs only that group's projections: while one thread
        # attends (KV rows from the caches, no weights), the others stream the next groups'
        # weight rows, where phase-by-phase the DRAM would idle through the attention.
        c.attn = <float *>(base + layout.d)
        pf_rmsnorm(&c, 0, 0)
        pf_quantize(&c, 0, 0)
        memset(c.ready, 0, G * sizeof(uint32_t))
        c.ahead = min(<Py_ssize_t>max(num_threads, 1), G)
        job_add(&job, pf_queue, &c, 0, G * (1 + c.plan.n_chunks), 1)
    else:
        # ---- phase 1: RMSNorm, (int8 path) quantized copies, Q/K/V, RoPE -------------------------
        job_add(&job, pf_rmsnorm, &c, 0, T, 0)
        if need_q8_0 or need_q8_k:
            job_add(&job, pf_quantize, &c, 0, T, 0)
        t0 = 0
        while t0 < T:   # a tile of tokens stays in L2 while every weight row streams past it
            job_add(&job, pf_qkv, &c, t0, c.n_bq + 2 * c.n_bkv, 1)
            t0 += PREFILL_TOKEN_TILE
        if rope_cos != NULL:
            job_add(&job, pf_rope, &c, 0, T, 0)

        # ---- phase 2: causal flash attention, one task per (head, query tile) -------------------
        # (one token over a long context: decode's split-KV attention, attention.pxi)
        if T == 1:
            attend_one_token_phases(&job, &att, c.q, kv_cache_k, kv_cache_v, start_pos, H, G,
                                    head_dim, Da, cache_capacity, c.scale, kv_tile, c.attn)
        else:
            c.n_qt = (T + q_tile - 1) // q_tile
            job_add(&job, pf_attend, &c, 0, H * c.n_qt, 1)

    # ---- phase 3: out-projection + bias + residual -----------------------------------------------
    if int8_path and uses_q8_activations(wo_dt):
        c.attn_fmt = activation_format(wo_dt)
        c.attn_q8_row = activation_row_bytes(c.attn_fmt, HDa)
        job_add(&job, pf_quantize_attn, &c, 0, T, 0)
    t0 = 0
    while t0 < T:
        job_add(&job, pf_outproj, &c, t0, (Ea + GEMM_ROWS - 1) // GEMM_ROWS, 1)
        t0 += PREFILL_TOKEN_TILE
    job_run(&job)


cdef void mega_fused_attention_prefill_kernel(
        float *output, const float *input, const float *residual,   # [T, Ea] each (or NULL)
        const float *ln1_gamma,                                     # [E]
        const void *wq, const float *bq, CKDataType wq_dt,
        const void *wk, const float *bk, CKDataType wk_dt,
        const void *wv, const float *bv, CKDataType wv_dt,
        const void *wo, const float *bo, CKDataType wo_dt,
        float *kv_cache_k, float *kv_cache_v,                       # [G, cache_capacity, Da]
        const float *rope_cos, const float *rope_sin,
        int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
        int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
        void *scratch, int q_tile, int kv_tile, mf_team *team, int num_threads) noexcept nogil:
    """Every activation float32 (fused_prefill with int8_path = 0)."""
    fused_prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
                  wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                  cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                  head_dim, aligned_head_dim, eps, scratch, 0, q_tile, kv_tile, team, num_threads)


cdef void mega_fused_attention_prefill_q8_0_kernel(
        float *output, const float *input, const float *residual,   # [T, Ea] each (or NULL)
        const float *ln1_gamma,                                     # [E]
        const void *wq, const float *bq, CKDataType wq_dt,
        const void *wk, const float *bk, CKDataType wk_dt,
        const void *wv, const float *bv, CKDataType wv_dt,
        const void *wo, const float *bo, CKDataType wo_dt,
        float *kv_cache_k, float *kv_cache_v,                       # [G, cache_capacity, Da]
        const float *rope_cos, const float *rope_sin,
        int start_pos, int tokens, int cache_capacity, int embed_dim, int aligned_embed_dim,
        int num_heads, int num_kv_heads, int head_dim, int aligned_head_dim, float eps,
        void *scratch, int q_tile, int kv_tile, mf_team *team, int num_threads) noexcept nogil:
    """The int8 path (fused_prefill with int8_path = 1)."""
    fused_prefill(output, input, residual, ln1_gamma, wq, bq, wq_dt, wk, bk, wk_dt, wv, bv, wv_dt,
                  wo, bo, wo_dt, kv_cache_k, kv_cache_v, rope_cos, rope_sin, start_pos, tokens,
                  cache_capacity, embed_dim, aligned_embed_dim, num_heads, num_kv_heads,
                  head_dim, aligned_head_dim, eps, scratch, 1, q_tile, kv_tile, team, num_threads)
