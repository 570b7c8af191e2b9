# The fused single-token layer: RMSNorm -> Q/K/V -> RoPE -> KV-cache write -> attention over the
# cache -> out-projection + bias + residual.  Float32 weights, float32 activations throughout.
#
# Long contexts split the keys (split-KV): more than SPLIT_MIN_KEYS keys are cut into ranges of
# at least that many, each range of each kv group a task, and the parts are combined head by head
# (mf_attend_combine_f32).  The number of ranges depends only on the position, the heads and
# head_dim -- never on the threads -- so the result is the same for any thread count.

cdef enum:
    SPLIT_MIN_KEYS = 512          # keys a range of split-KV decode has at least
    SPLIT_PART_FLOATS = 16384     # the parts of every range and head, on the caller's stack


cdef void outproj_rows_block(
        Py_ssize_t e0, const float *wo, const float *bo, const float *residual,
        const float *attn,     # [H*Da]
        float *output,         # [Ea]: rows e0 .. e0+3 written
        Py_ssize_t E, Py_ssize_t Ea, Py_ssize_t HDa) noexcept nogil:
    """output[e] = wo[e] . attn + bo[e] + residual[e] for 4 rows (0 for e >= E)."""
    cdef const float *rows[4]
    cdef float out4[4]
    cdef Py_ssize_t r, e
    for r in range(4):
        rows[r] = wo + min(e0 + r, E - 1) * HDa
    if e0 < E:
        mf_dot_1x4_f32(attn, rows, HDa, out4, wo + (e0 + 4) * HDa)   # next: the following 4 rows
    for r in range(4):
        e = e0 + r
        if e >= Ea:
            break
        if e >= E:
            output[e] = 0.0
        else:
            output[e] = out4[r] + (bo[e] if bo != NULL else 0.0) + (
                residual[e] if residual != NULL else 0.0)


cdef void attention_decode_kernel(
        float *output,             # [Ea]: columns >= E written as 0
        const float *input,        # [Ea]
        const float *residual,     # [Ea] or NULL
        const float *ln1_gamma,    # [E]
        const float *wq, const float *bq,   # [H*Da, Ea], [H*Da]
        const float *wk, const float *bk,   # [G*Da, Ea], [G*Da]
        const float *wv, const float *bv,   # [G*Da, Ea], [G*Da]
        const float *wo, const float *bo,   # [Ea, H*Da], [Ea]
        float *kv_cache_k,         # [G, cache_capacity, Da]
        float *kv_cache_v,         # [G, cache_capacity, Da]
        const float *rope_cos,     # [>pos, D/2] or NULL
        const float *rope_sin,     # [>pos, D/2] or NULL
        int pos, int embed_dim, int aligned_embed_dim, int num_heads, int num_kv_heads,
        int head_dim, int aligned_head_dim, int cache_capacity, float eps,
        float *q_output_workspace,   # [2, H*Da]: q, then the attention output
        float *kv_workspace,         # [2, G*Da]: k, then v
        int kv_tile, int num_threads) noexcept nogil:
    cdef Py_ssize_t E = embed_dim, Ea = aligned_embed_dim, H = num_heads, G = num_kv_heads
    cdef Py_ssize_t D = head_dim, Da = aligned_head_dim, C = cache_capacity, P = pos
    cdef Py_ssize_t HDa = H * Da, group = H // G
    cdef float *q = q_output_workspace          # [H, Da]
    cdef float *attn = q_output_workspace + HDa  # [H, Da]
    cdef float *k = kv_workspace                 # [G, Da]
    cdef float *v = kv_workspace + G * Da        # [G, Da]
    cdef float scale = 1.0 / sqrtf(<float>D)
    cdef float acc
    cdef Py_ssize_t g, h, e, blk, task, n_chunks, n_seg, seg_len, s
    cdef float parts[SPLIT_PART_FLOATS]        # split-KV: [n_seg, H, Da] sums, then m, l
    cdef float *part_acc = parts                # [n_seg, H, Da]
    cdef float *part_m = parts + (SPLIT_PART_FLOATS // (H * (Da + 2))) * H * Da   # [n_seg, H]
    cdef float *part_l = part_m + (SPLIT_PART_FLOATS // (H * (Da + 2))) * H       # [n_seg, H]

    project_qkv(input, ln1_gamma, rms_inverse(input, E, eps), wq, bq, wk, bk, wv, bv,
                q, k, v, E, Ea, H, G, D, Da, num_threads)
    if rope_cos != NULL:
        rope_rotate_heads(q, H, D, Da, rope_cos + P * (D // 2), rope_sin + P * (D // 2))
        rope_rotate_heads(k, G, D, Da, rope_cos + P * (D // 2), rope_sin + P * (D // 2))

    # The token's k, v go to row [g, pos] of the caches (padded dims are already 0).
    for g in range(G):
        memcpy(kv_cache_k + (g * C + P) * Da, k + g * Da, Da * sizeof(float))
        memcpy(kv_cache_v + (g * C + P) * Da, v + g * Da, Da * sizeof(float))

    # Query head h reads kv head g = h // (H // G) over positions 0..pos.  A task is the query
    # heads of one kv group (up to 16: one block of mf_attend_block_f32, every K/V row loaded once
    # for all of them) over one range of keys; head dims above 256 take attend_query_tile, 3 heads
    # a task, unsplit.
    n_seg = min((P + SPLIT_MIN_KEYS) // SPLIT_MIN_KEYS, SPLIT_PART_FLOATS // (H * (Da + 2)))
    if D <= MF_ATT_MAX_HEAD_DIM and n_seg > 1:
        seg_len = (P + n_seg) // n_seg                   # ceil((P + 1) / n_seg)
        n_chunks = (group + MF_ATT_QUERIES - 1) // MF_ATT_QUERIES
        for task in prange(G * n_chunks * n_seg, num_threads=num_threads, schedule='dynamic',
                           nogil=True):
            s = task % n_seg
            g = task // n_seg // n_chunks
            h = g * group + (task // n_seg % n_chunks) * MF_ATT_QUERIES
            mf_attend_range_f32(q + h * Da, Da, kv_cache_k + g * C * Da, kv_cache_v + g * C * Da,
                                Da, P, 0, <int>min(<Py_ssize_t>MF_ATT_QUERIES, (g + 1) * group - h),
                                D, scale, kv_tile, s * seg_len, min(P + 1, (s + 1) * seg_len),
                                part_acc + (s * H + h) * Da, Da, part_m + s * H + h,
                                part_l + s * H + h)
        for h in prange(H, num_threads=num_threads, schedule='static', nogil=True):
            mf_attend_combine_f32(part_acc + h * Da, H * Da, part_m + h, part_l + h, H,
                                  <int>n_seg, D, Da, attn + h * Da)
    elif D <= MF_ATT_MAX_HEAD_DIM:
        n_chunks = (group + MF_ATT_QUERIES - 1) // MF_ATT_QUERIES
        for task in prange(G * n_chunks, num_threads=num_threads, schedule='dynamic', nogil=True):
            g = task // n_chunks
            h = g * group + (task % n_chunks) * MF_ATT_QUERIES
            mf_attend_block_f32(q + h * Da, Da, kv_cache_k + g * C * Da, kv_cache_v + g * C * Da,
                                Da, P, 0, <int>min(<Py_ssize_t>MF_ATT_QUERIES, (g + 1) * group - h),
                                D, scale, kv_tile, attn + h * Da, Da)
    else:
        n_chunks = (group + 2) // 3
        for task in prange(G * n_chunks, num_threads=num_threads, schedule='dynamic', nogil=True):
            g = task // n_chunks
            h = g * group + (task % n_chunks) * 3
            attend_query_tile(q + h * Da, Da, kv_cache_k + g * C * Da, kv_cache_v + g * C * Da, P,
                              0, min(<Py_ssize_t>3, (g + 1) * group - h), D, Da, scale, kv_tile,
                              attn + h * Da, Da)

    # output = attn @ wo.T + bo + residual.  Row e of output reads only residual[e]: output may be
    # the residual (or the input, no longer needed) itself.
    for blk in prange((Ea + 3) // 4, num_threads=num_threads, schedule='static', nogil=True):
        outproj_rows_block(blk * 4, wo, bo, residual, attn, output, E, Ea, HDa)
