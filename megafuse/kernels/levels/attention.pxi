# Tiled flash attention with an online softmax.
#
# Prefill runs blocks of 16 query rows through include/megafuse/mf_attention.h (GEMM register
# blocks for Q.K^T and P.V, the softmax vectorised across the 16 queries); decode (the query
# heads of one kv group, all at one position) and head dims above 256 run attend_query_tile
# below.
#
# No score array longer than one KV tile exists anywhere: the scores of a tile live on the stack
# (at most MF_ATT_MAX_KV_TILE floats a query row), and a running max m and sum l per query row
# rescale that row's accumulator between tiles (the online softmax of Milakov & Gimelshein, as
# FlashAttention uses it).  Each row is normalised once, at the end.  Scores come from register
# blocks (3 query rows x 4 keys); exp runs vectorised over a row of the tile.

cdef extern from "megafuse/mf_attention.h" nogil:
    enum: MF_ATT_QUERIES                 # 16 query rows a block
    enum: MF_ATT_MAX_HEAD_DIM            # 256
    ctypedef struct mf_att_opts:         # a layer's capping, window and ring cache (all 0: none)
        float softcap
        ptrdiff_t window
        ptrdiff_t ring
    void mf_attend_block_f32(const float *q, Py_ssize_t ldq, const float *k, const float *v,
                             Py_ssize_t Da, Py_ssize_t first_pos, Py_ssize_t pos_step, int nq,
                             Py_ssize_t D, float scale, Py_ssize_t kv_tile, float *out,
                             Py_ssize_t ldo, const mf_att_opts *opts)
    void mf_attend_range_f32(const float *q, Py_ssize_t ldq, const float *k, const float *v,
                             Py_ssize_t Da, Py_ssize_t first_pos, Py_ssize_t pos_step, int nq,
                             Py_ssize_t D, float scale, Py_ssize_t kv_tile, Py_ssize_t key_begin,
                             Py_ssize_t key_end, float *out, Py_ssize_t ldo, float *m_out,
                             float *l_out, const mf_att_opts *opts)
    void mf_attend_range_f16(const float *q, Py_ssize_t ldq, const uint16_t *k,
                             const uint16_t *v, Py_ssize_t Da, Py_ssize_t first_pos,
                             Py_ssize_t pos_step, int nq, Py_ssize_t D, float scale,
                             Py_ssize_t kv_tile, Py_ssize_t key_begin, Py_ssize_t key_end,
                             float *out, Py_ssize_t ldo, float *m_out, float *l_out,
                             const mf_att_opts *opts)
    void mf_attend_combine_f32(const float *acc, Py_ssize_t ld_part, const float *m,
                               const float *l, Py_ssize_t ld_ml, int n_seg, Py_ssize_t D,
                               Py_ssize_t Da, float *out)


cdef inline const void *kv_rows(const void *cache, bint kv_f16, Py_ssize_t i) noexcept nogil:
    """Element i of a K or V cache of float32 (kv_f16 False) or float16 values."""
    return <const char *>cache + i * (2 if kv_f16 else 4)


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
    cdef float s[3][MF_ATT_MAX_KV_TILE]          # scores of 3 query rows for the tile
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
        const void *k_g,       # [>last position, Da]: kv head g of the K cache
        const void *v_g,       # [>last position, Da]: the same rows of the V cache
        bint kv_f16,           # the caches hold float16 (else float32) values
        Py_ssize_t first_pos,  # absolute position of query row 0 (row i: first_pos + i)
        Py_ssize_t nq, Py_ssize_t D, Py_ssize_t Da, float scale, Py_ssize_t kv_tile,
        float *out,            # [nq, ldo] out: row i = causal attention of query row i
        Py_ssize_t ldo,
        const mf_att_opts *opts) noexcept nogil:   # capping / window / ring, or NULL
    """Prefill's attention for one (head, query tile): blocks of 16 rows by mf_attend_block_f32
    (attend_query_tile for head dims above MF_ATT_MAX_HEAD_DIM: float32 caches, no opts)."""
    cdef Py_ssize_t b0 = 0, nb
    if D > MF_ATT_MAX_HEAD_DIM:
        attend_query_tile(q, ldq, <const float *>k_g, <const float *>v_g, first_pos, 1, nq, D, Da,
                          scale, kv_tile, out, ldo)
        return
    while b0 < nq:
        nb = min(<Py_ssize_t>MF_ATT_QUERIES, nq - b0)
        if kv_f16:
            mf_attend_range_f16(q + b0 * ldq, ldq, <const uint16_t *>k_g, <const uint16_t *>v_g,
                                Da, first_pos + b0, 1, <int>nb, D, scale, kv_tile, 0,
                                first_pos + b0 + nb, out + b0 * ldo, ldo, NULL, NULL, opts)
        else:
            mf_attend_block_f32(q + b0 * ldq, ldq, <const float *>k_g, <const float *>v_g, Da,
                                first_pos + b0, 1, <int>nb, D, scale, kv_tile, out + b0 * ldo,
                                ldo, opts)
        b0 += MF_ATT_QUERIES


# ---- one token (decode, and prefill of one token) ------------------------------------------------
# Query head h reads kv head g = h // (H // G) over positions 0..pos.  A task is the query heads of
# one kv group (up to 16: one block of mf_attend_block_f32, every K/V row loaded once for all of
# them) over one range of keys.  Long contexts split the keys (split-KV): more than SPLIT_MIN_KEYS
# keys are cut into ranges of at least that many, each range of each group a task, and the parts
# are combined head by head (mf_attend_combine_f32).  The number of ranges depends only on the
# position, the heads and head_dim -- never on the threads -- so the result is the same for any
# thread count.  Head dims above 256 take attend_query_tile, 3 heads a task, unsplit.

cdef enum:
    SPLIT_MIN_KEYS = 512          # keys a range of split-KV decode has at least
    SPLIT_PART_FLOATS = 16384     # the parts of every range and head, on the caller's stack


# How the attention of one token at position P over keys first_key .. P is cut into tasks (fixed
# by P, first_key, H, G, D, Da): mf_one_token_plan of include/megafuse/mf_model.h, whose fields
# are kind (ONE_TOKEN_*), first_key, tasks (of the first pass), n_chunks (query-head chunks of a
# kv group), n_seg (key ranges: split-KV, else 1), seg_len (keys a range), max_seg (ranges the
# parts buffer holds).
ctypedef mf_one_token_plan OneTokenPlan


cdef enum:
    ONE_TOKEN_SPLIT = 0       # split-KV: (group, head chunk, key range) tasks, then a combine
    ONE_TOKEN_BLOCKS = 1      # (group, head chunk) tasks through mf_attend_block_f32
    ONE_TOKEN_TILES = 2       # head dims above 256: (group, 3 heads) tasks, attend_query_tile


cdef inline OneTokenPlan one_token_plan(Py_ssize_t P, Py_ssize_t K0, Py_ssize_t H, Py_ssize_t G,
                                        Py_ssize_t D, Py_ssize_t Da) noexcept nogil:
    """The tasks of one token at position P over keys K0 .. P (K0 > 0: a sliding window)."""
    cdef OneTokenPlan p
    cdef Py_ssize_t group = H // G, n_keys = P + 1 - K0
    p.first_key = K0
    p.max_seg = SPLIT_PART_FLOATS // (H * (Da + 2))
    p.n_seg = min((n_keys - 1 + SPLIT_MIN_KEYS) // SPLIT_MIN_KEYS, p.max_seg)
    p.seg_len = n_keys
    if D > MF_ATT_MAX_HEAD_DIM:
        p.kind = ONE_TOKEN_TILES
        p.n_seg = 1
        p.n_chunks = (group + 2) // 3
        p.tasks = G * p.n_chunks
        return p
    p.n_chunks = (group + MF_ATT_QUERIES - 1) // MF_ATT_QUERIES
    if p.n_seg > 1:
        p.kind = ONE_TOKEN_SPLIT
        p.seg_len = (n_keys - 1 + p.n_seg) // p.n_seg         # ceil(n_keys / n_seg)
        p.tasks = G * p.n_chunks * p.n_seg
    else:
        p.kind = ONE_TOKEN_BLOCKS
        p.n_seg = 1
        p.tasks = G * p.n_chunks
    return p


cdef inline Py_ssize_t one_token_task_heads(const OneTokenPlan *p, Py_ssize_t task,
                                            Py_ssize_t H, Py_ssize_t G,
                                            Py_ssize_t *n_heads) noexcept nogil:
    """The first query head task `task` (< p.tasks) computes; n_heads[0]: how many (consecutive,
    of one kv group).  Split-KV tasks of one head chunk differ only in their key range."""
    cdef Py_ssize_t group = H // G, per, i, g, h
    per = 3 if p.kind == ONE_TOKEN_TILES else MF_ATT_QUERIES
    i = task // p.n_seg                  # (n_seg is 1 unless split)
    g = i // p.n_chunks
    h = g * group + (i % p.n_chunks) * per
    n_heads[0] = min(per, (g + 1) * group - h)
    return h


cdef void one_token_task(
        const OneTokenPlan *p, Py_ssize_t task,
        const float *q,        # [H, Da]: the token's query heads (roped)
        const void *kv_cache_k,    # [G, C, Da]: rows 0 .. P are read
        const void *kv_cache_v,    # [G, C, Da]
        bint kv_f16,           # the caches hold float16 values (else float32; D <= 256 then)
        Py_ssize_t P, Py_ssize_t H, Py_ssize_t G, Py_ssize_t D, Py_ssize_t Da, Py_ssize_t C,
        float scale, Py_ssize_t kv_tile,
        float *attn,           # [H, Da] out (ONE_TOKEN_BLOCKS / TILES)
        float *parts,          # [max_seg, H, Da] sums, then m, l (split-KV; else NULL)
        const mf_att_opts *opts) noexcept nogil:   # capping / window / ring, or NULL
    """Task `task` (< p.tasks) of one token's attention."""
    cdef Py_ssize_t s, nh, k0 = p.first_key, k1 = P + 1
    cdef Py_ssize_t h = one_token_task_heads(p, task, H, G, &nh)
    cdef Py_ssize_t g = h // (H // G)
    cdef float *part_m           # [max_seg, H] (split-KV: after the parts' sums)
    cdef float *part_l           # [max_seg, H]
    cdef const void *k_g = kv_rows(kv_cache_k, kv_f16, g * C * Da)
    cdef const void *v_g = kv_rows(kv_cache_v, kv_f16, g * C * Da)
    cdef float *out = attn + h * Da
    cdef Py_ssize_t ldo = Da
    cdef float *m_out = NULL
    cdef float *l_out = NULL
    if p.kind == ONE_TOKEN_TILES:
        attend_query_tile(q + h * Da, Da, <const float *>k_g, <const float *>v_g, P, 0, nh, D,
                          Da, scale, kv_tile, out, ldo)
        return
    if p.kind == ONE_TOKEN_SPLIT:
        part_m = parts + p.max_seg * H * Da
        part_l = part_m + p.max_seg * H
        s = task % p.n_seg
        k0 = p.first_key + s * p.seg_len
        k1 = min(P + 1, k0 + p.seg_len)
        out, m_out, l_out = parts + (s * H + h) * Da, part_m + s * H + h, part_l + s * H + h
    if kv_f16:
        mf_attend_range_f16(q + h * Da, Da, <const uint16_t *>k_g, <const uint16_t *>v_g, Da, P,
                            0, <int>nh, D, scale, kv_tile, k0, k1, out, ldo, m_out, l_out, opts)
    elif p.kind == ONE_TOKEN_SPLIT or k0 > 0:
        mf_attend_range_f32(q + h * Da, Da, <const float *>k_g, <const float *>v_g, Da, P, 0,
                            <int>nh, D, scale, kv_tile, k0, k1, out, ldo, m_out, l_out, opts)
    else:
        mf_attend_block_f32(q + h * Da, Da, <const float *>k_g, <const float *>v_g, Da, P, 0,
                            <int>nh, D, scale, kv_tile, out, ldo, opts)


cdef inline void one_token_combine(const OneTokenPlan *p, Py_ssize_t h, const float *parts,
                                   Py_ssize_t H, Py_ssize_t D, Py_ssize_t Da,
                                   float *attn) noexcept nogil:
    """Head h of a split-KV pass: its n_seg parts combined into attn [H, Da]."""
    cdef const float *part_m = parts + p.max_seg * H * Da
    cdef const float *part_l = part_m + p.max_seg * H
    mf_attend_combine_f32(parts + h * Da, H * Da, part_m + h, part_l + h, H, <int>p.n_seg, D,
                          Da, attn + h * Da)


cdef struct OneTokenJob:
    # the attention of one token over keys 0 .. P (attend_one_token_phases)
    OneTokenPlan plan
    const float *q             # [H, Da]: the token's query heads (roped)
    const float *kv_cache_k    # [G, C, Da]: rows 0 .. P are read
    const float *kv_cache_v    # [G, C, Da]
    Py_ssize_t P, H, G, D, Da, C, kv_tile
    float scale
    float *attn                # [H, Da] out: head h's attention output (dims >= D: 0)
    float parts[SPLIT_PART_FLOATS]   # split-KV: [n_seg, H, Da] sums, then m, l


cdef void one_token_job_task(const void *ctx, Py_ssize_t arg, Py_ssize_t task) noexcept nogil:
    cdef OneTokenJob *c = <OneTokenJob *>ctx
    one_token_task(&c.plan, task, c.q, c.kv_cache_k, c.kv_cache_v, False, c.P, c.H, c.G, c.D,
                   c.Da, c.C, c.scale, c.kv_tile, c.attn, c.parts, NULL)


cdef void one_token_job_combine(const void *ctx, Py_ssize_t arg, Py_ssize_t h) noexcept nogil:
    cdef OneTokenJob *c = <OneTokenJob *>ctx
    one_token_combine(&c.plan, h, c.parts, c.H, c.D, c.Da, c.attn)


cdef void attend_one_token_phases(
        Job *job, OneTokenJob *c,  # c: filled here; must live until the job has run
        const float *q,        # [H, Da]: the token's query heads (roped)
        const float *kv_cache_k,   # [G, C, Da]: rows 0 .. pos are read
        const float *kv_cache_v,   # [G, C, Da]
        Py_ssize_t P,          # the token's position
        Py_ssize_t H, Py_ssize_t G, Py_ssize_t D, Py_ssize_t Da, Py_ssize_t C, float scale,
        Py_ssize_t kv_tile,
        float *attn) noexcept nogil:   # [H, Da] out
    """The phases of one token's attention: its tasks (one at a time a chunk: their sizes
    differ), then for split-KV the combine of each head's parts."""
    c.plan = one_token_plan(P, 0, H, G, D, Da)
    c.q, c.kv_cache_k, c.kv_cache_v = q, kv_cache_k, kv_cache_v
    c.P, c.H, c.G, c.D, c.Da, c.C, c.kv_tile, c.scale = P, H, G, D, Da, C, kv_tile, scale
    c.attn = attn
    job_add(job, one_token_job_task, c, 0, c.plan.tasks, 1)
    if c.plan.kind == ONE_TOKEN_SPLIT:
        job_add(job, one_token_job_combine, c, 0, H, 0)
