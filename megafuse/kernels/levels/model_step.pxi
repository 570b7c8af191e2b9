# The whole-model step: embedding rows -> every decoder layer -> final norm -> output head, in
# one call without the GIL, on a thread team (include/megafuse/mf_team.h) that persists across
# steps.  Layouts and scratch: include/megafuse/mf_model.h.
#
# A step of T <= MF_STEP_TOKENS tokens is a list of phases; a phase is a number of independent
# chunks (a head, 32 or 64 weight rows, a group of tokens, ...).  The team's threads claim chunks
# in order; a chunk of a phase starts once every chunk of the phases before it is done.  The
# phases of layer l:
#
#   NORM_ATTN   xn = rmsnorm(x, ln1_gamma)  (+ its quantized rows)       tokens, 8 a chunk
#   QKV         q / k / v of one head for every token, RoPE; k, v into the cache      H + 2G
#   ATTN        decode: (kv group, key range) tasks; prefill: (head, query tile)
#   COMBINE     decode over long contexts: the key ranges of each head combined        H
#   QUANT_ATTN  the attention rows quantized for wo (int8 mode, block-format wo)       tokens
#               (none when wo reads Q8_0 rows and D is a multiple of 32: each ATTN / COMBINE
#               chunk quantizes the Q8_0 blocks of the heads it computed)
#   OUTPROJ     x += attn @ wo.T + bo                                    rows of wo, 32 or 64
#               (a layer with a post-attention norm: y = attn @ wo.T + bo, then
#   POST_ATTN   x += rmsnorm(y, post_attn_norm))                                        tokens
#   NORM_FFN    xn = rmsnorm(x, ln2_gamma)  (+ quantized)                               tokens
#   GATEUP      act = silu(xn @ Wg.T + bg) * (xn @ Wu.T + bu)            64 intermediate rows
#               (gelu_tanh instead of silu where the model says, mf_model.activation)
#   QUANT_ACT   act quantized for w2 (int8 mode, K-quant w2; a Q8_0 row is quantized by the
#               GATEUP chunks, 2 blocks each)                                           tokens
#   DOWN        x += act @ w2.T + b2  (the last layer may write x_out instead)  rows of w2
#               (a layer with a post-MLP norm: y = act @ w2.T + b2, then
#   POST_FFN    x += rmsnorm(y, post_ffn_norm))                                         tokens
#
# The layer features of an architecture (megafuse/llm/arch.py) are the optional slots of
# mf_model_layer and mf_model: q / k norms (in QKV), a sliding window and a ring cache (QKV,
# ATTN), per-layer RoPE tables, sandwich norms (the POST phases), the embedding's scale (LOAD),
# the attention's scale and capping (ATTN), the gate's activation (GATEUP), the logits' capping
# (HEAD).
# then NORM_OUT (the rows that want logits) and HEAD (HEAD_ROWS vocabulary rows a chunk).
#
# Prefetch.  The one-token dots prefetch MF_Q_PF_MIN_BYTES ahead as they stream, but in a decode
# step a chunk is only 12-46 KB, and the chunk right after it is being read by another thread at
# the same time: that lead arrives too late, and a chunk's first rows would wait on DRAM.  So
# each phase is cut into one lane of contiguous chunks per thread (mf_phase_take, mf_model.h:
# a thread takes its own lane's chunks in order, then helps with the others'), and before a
# thread runs a chunk it prefetches into L2 the weight rows of that chunk (a no-op when they
# came already) and of the chunk it most likely runs next: the next of its lane, or its lane's
# first in the next phase that reads weights (prefetch_chunk_weights; of a head chunk, its first
# PREFETCH_HEAD_BYTES).  A guess that another thread takes still brings the rows on chip.
#
# Small steps (fewer than MF_STEP_SOLO_BYTES of weights x tokens, mf_model.h; st.solo_bytes) run
# their chunks in order on the calling thread (run_step_alone) without waking the team.
#
# A step holds the rows of one or several sequences (st.segs: a batch), each at its own
# positions in its own KV caches; the weights are read once for all of them.  Every row gets the
# operations it would get in a step of its sequence alone: the attention runs per sequence (its
# decode tasks, or its query tiles), and a projection whose activations are float32 -- whose
# method depends on how many rows it multiplies -- runs per sequence, unless every sequence has
# one row (then every row at once by the one-token method: linear_block's apart); one whose
# activations are quantized runs over every row at once (its integer dots give each pair the
# bits of its one-row dot whatever the row count, contract §7).
#
# Every chunk runs the building blocks of the per-layer kernels (linear_block, swiglu_block,
# rmsnorm_row, the attention tasks) on the same token rows, so a step computes what the header
# functions compute layer by layer; which thread runs a chunk never changes a result.

cdef enum:
    PHASE_LOAD = 0
    PHASE_NORM_ATTN = 1
    PHASE_QKV = 2
    PHASE_ATTN = 3
    PHASE_COMBINE = 4
    PHASE_QUANT_ATTN = 5
    PHASE_OUTPROJ = 6
    PHASE_NORM_FFN = 7
    PHASE_GATEUP = 8
    PHASE_QUANT_ACT = 9
    PHASE_DOWN = 10
    PHASE_NORM_OUT = 11
    PHASE_HEAD = 12
    PHASE_POST_ATTN = 13
    PHASE_POST_FFN = 14
    STEP_ROW_TOKENS = 8       # token rows a chunk of the norm / quantize / load phases
    HEAD_ROWS = 256           # vocabulary rows a chunk of the head
    PREFETCH_HEAD_BYTES = 16384   # of a head chunk's rows, prefetched as it starts
    SMALL_STEP_TOKENS = 4     # up to this many tokens, projections are cut into 32-row chunks


cdef inline Py_ssize_t ceil_div(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    return (a + b - 1) // b


cdef inline Py_ssize_t proj_rows(const mf_step *st) noexcept nogil:
    """Weight rows a chunk of OUTPROJ / DOWN: 32 for a few tokens (decode: more chunks than
    threads, so a slow thread is not left with a large share), else a 64-row block."""
    return 32 if st.T <= SMALL_STEP_TOKENS else GEMM_ROWS


cdef inline void add_phase(mf_step *st, int kind, int layer, Py_ssize_t n,
                           uint32_t *total) noexcept nogil:
    cdef mf_phase *ph
    if n <= 0:
        return
    ph = &st.phases[st.n_phases]
    ph.kind = kind
    ph.layer = layer
    ph.base = total[0]
    ph.n = <uint32_t>n
    mf_phase_cut_lanes(ph, st.n_threads)
    total[0] += <uint32_t>n
    st.n_phases += 1


cdef inline const mf_one_token_plan *layer_plan(const mf_segment *sg,
                                                const mf_model_layer *ly) noexcept nogil:
    """A one-row sequence's plan for a layer: [1] for sliding-window layers, [0] else."""
    return &sg.att[1] if ly.window > 0 else &sg.att[0]


cdef inline void *seg_cache(const mf_segment *sg, const mf_model_layer *ly, int layer,
                            bint v) noexcept nogil:
    """A sequence's K (v False) or V cache of a layer: its own, or the layer's."""
    if v:
        return sg.v_cache[layer] if sg.v_cache != NULL else ly.v_cache
    return sg.k_cache[layer] if sg.k_cache != NULL else ly.k_cache


cdef inline const mf_segment *chunk_segment(const mf_step *st, int kind,
                                            Py_ssize_t *c) noexcept nogil:
    """The sequence whose attention chunk c (of an ATTN phase of layers of this kind: 0 full,
    1 windowed) is; c becomes the chunk's number within that sequence's."""
    cdef int s
    for s in range(st.n_segs - 1):
        if c[0] < st.segs[s].att_chunks[kind]:
            return &st.segs[s]
        c[0] -= st.segs[s].att_chunks[kind]
    return &st.segs[st.n_segs - 1]


cdef inline const mf_segment *combine_segment(const mf_step *st, int kind,
                                              Py_ssize_t *c) noexcept nogil:
    """Likewise for a COMBINE chunk: H chunks a sequence whose one-row attention was split."""
    cdef int s
    cdef const mf_one_token_plan *p
    for s in range(st.n_segs):
        p = &st.segs[s].att[kind]
        if st.segs[s].n == 1 and p.kind == ONE_TOKEN_SPLIT:
            if c[0] < st.m.H:
                return &st.segs[s]
            c[0] -= st.m.H
    return NULL


cdef inline mf_att_opts layer_att_opts(const mf_model *m,
                                       const mf_model_layer *ly) noexcept nogil:
    """A layer's capping, window and ring cache for the attention kernels."""
    cdef mf_att_opts o
    o.softcap = m.attn_softcap
    o.window = ly.window
    o.ring = ly.cache_rows if ly.cache_rows < m.C else 0
    return o


cdef void plan_segments(mf_step *st) noexcept nogil:
    """The rows of the step's sequences (st.segs[:n_segs], their t0, n, pos, logits set): each
    row's sequence and position, the rows that want logits, and how each sequence's attention
    is cut (one-row sequences: the one-token plans of full and windowed layers)."""
    cdef const mf_model *m = st.m
    cdef mf_segment *sg
    cdef Py_ssize_t window = 0
    cdef int s, t, l, kind
    for l in range(m.n_layers):                  # (every windowed layer has the same window)
        if m.layers[l].window > 0:
            window = m.layers[l].window
            break
    st.T = st.R = 0
    for s in range(st.n_segs):
        sg = &st.segs[s]
        sg.t0 = st.T
        for t in range(sg.n):
            st.row_seg[st.T + t] = s
            st.row_pos[st.T + t] = sg.pos + t
        st.T += sg.n
        sg.r0 = st.R
        if sg.logits != NULL:
            if sg.all_logits:
                for t in range(sg.n):
                    st.logit_row[st.R + t] = sg.t0 + t
                st.R += sg.n
            else:
                st.logit_row[st.R] = sg.t0 + sg.n - 1
                st.R += 1
        for kind in range(2):
            if sg.n == 1:
                sg.att[kind] = one_token_plan(sg.pos, 0 if kind == 0 or window == 0
                                              else max(0, sg.pos - window + 1),
                                              m.H, m.G, m.D, m.D)
                sg.att_chunks[kind] = <uint32_t>sg.att[kind].tasks
            else:
                sg.att_chunks[kind] = <uint32_t>(m.H * ceil_div(sg.n, m.q_tile))


cdef uint32_t plan_step(mf_step *st) noexcept nogil:
    """Fill st.phases for the step of st.segs (plan_segments first); return the chunk count."""
    cdef const mf_model *m = st.m
    cdef const mf_model_layer *ly = NULL
    cdef Py_ssize_t rows_tokens = ceil_div(st.T, STEP_ROW_TOKENS), att_chunks, combine
    cdef uint32_t total = 0
    cdef int l, s, kind
    st.n_phases = 0
    add_phase(st, PHASE_LOAD, -1, rows_tokens, &total)
    for l in range(m.n_layers):
        ly = &m.layers[l]
        kind = 1 if ly.window > 0 else 0
        add_phase(st, PHASE_NORM_ATTN, l, rows_tokens, &total)
        add_phase(st, PHASE_QKV, l, m.H + 2 * m.G, &total)
        att_chunks = combine = 0
        for s in range(st.n_segs):
            att_chunks += st.segs[s].att_chunks[kind]
            if st.segs[s].n == 1 and st.segs[s].att[kind].kind == ONE_TOKEN_SPLIT:
                combine += m.H
        add_phase(st, PHASE_ATTN, l, att_chunks, &total)
        add_phase(st, PHASE_COMBINE, l, combine, &total)
        if m.int8 and uses_q8_activations(ly.wo_dt) and not quantized_in_place(m, ly.wo_dt, m.D):
            add_phase(st, PHASE_QUANT_ATTN, l, rows_tokens, &total)
        add_phase(st, PHASE_OUTPROJ, l, ceil_div(m.E, proj_rows(st)), &total)
        if ly.post_attn_norm != NULL:
            add_phase(st, PHASE_POST_ATTN, l, rows_tokens, &total)
        add_phase(st, PHASE_NORM_FFN, l, rows_tokens, &total)
        add_phase(st, PHASE_GATEUP, l, ceil_div(m.F, GEMM_ROWS), &total)
        if (m.int8 and uses_q8_activations(ly.w2_dt)
                and not quantized_in_place(m, ly.w2_dt, GEMM_ROWS)):
            add_phase(st, PHASE_QUANT_ACT, l, rows_tokens, &total)
        add_phase(st, PHASE_DOWN, l, ceil_div(m.E, proj_rows(st)), &total)
        if ly.post_ffn_norm != NULL:
            add_phase(st, PHASE_POST_FFN, l, rows_tokens, &total)
    if m.head != NULL and st.R > 0:
        add_phase(st, PHASE_NORM_OUT, -1, ceil_div(st.R, STEP_ROW_TOKENS), &total)
        add_phase(st, PHASE_HEAD, -1, ceil_div(m.V, HEAD_ROWS), &total)
    return total


cdef inline bint quantized_in_place(const mf_model *m, int dt, Py_ssize_t piece) noexcept nogil:
    """True when the activation rows a weight of format dt reads are Q8_0 rows and the chunks that
    compute them, `piece` values of a row each (whole blocks of 32), quantize their own blocks:
    no phase of its own (and one crossing of the team fewer) for that quantization."""
    return (m.int8 and uses_q8_activations(dt) and activation_format(dt) == CK_DT_Q8_0
            and piece % ck_dtype_block_size(CK_DT_Q8_0) == 0)


cdef inline void quantize_row_piece(const float *x, char *dst, Py_ssize_t n, Py_ssize_t v0,
                                    Py_ssize_t v1) noexcept nogil:
    """Values v0 .. v1-1 (whole blocks) of x[n] into the Q8_0 activation row dst: the same bytes
    quantize_activation_row writes for them; the piece that ends the row also writes the bytes of
    no block (zero blocks, padding)."""
    cdef Py_ssize_t qk = ck_dtype_block_size(CK_DT_Q8_0)
    mf_quantize_blocks_q8_0_act(x, dst, n, v0 // qk, v1 // qk)
    if v1 == n:
        mf_q8_0_act_pad(dst, n)


cdef inline char *q8_rows_for(const mf_step *st, int dt, Py_ssize_t *row) noexcept nogil:
    """The quantized copy of xn that weights of format dt read (NULL: float activations)."""
    if not st.m.int8 or not uses_q8_activations(dt):
        row[0] = 0
        return NULL
    if activation_format(dt) == CK_DT_Q8_K:
        row[0] = st.layout.xqk_row
        return st.scratch + st.layout.xqk
    row[0] = st.layout.xq_row
    return st.scratch + st.layout.xq


cdef void normalise_rows(const mf_step *st, const float *x, const float *gamma, Py_ssize_t t0,
                         Py_ssize_t t1, int dt_a, int dt_b, int dt_c) noexcept nogil:
    """xn[t] = rmsnorm(x[t], gamma) for t0 <= t < t1, and its quantized rows for each format
    among dt_a, dt_b, dt_c that reads them (one Q8_0 and one Q8_K copy at most)."""
    cdef const mf_model *m = st.m
    cdef Py_ssize_t E = m.E, t, row, other_row
    cdef float *xn = <float *>(st.scratch + st.layout.xn)
    cdef char *dst
    cdef int dts[3]
    cdef int i, j, dt
    cdef bint seen
    dts[0] = dt_a
    dts[1] = dt_b
    dts[2] = dt_c
    for t in range(t0, t1):
        rmsnorm_row(x + t * E, gamma, E, E, m.eps, xn + t * E)
        for i in range(3):
            dt = dts[i]
            dst = q8_rows_for(st, dt, &row)
            if dst == NULL:
                continue
            seen = False
            for j in range(i):                  # that copy was made already
                if q8_rows_for(st, dts[j], &other_row) == dst:
                    seen = True
            if not seen:
                quantize_activation_row(xn + t * E, dst + t * row, E, dt)


cdef void linear_rows(const mf_step *st, Py_ssize_t e0, const char *w, Py_ssize_t w_row_bytes,
                      int dt, Py_ssize_t K, const float *bias, Py_ssize_t n_valid,
                      Py_ssize_t n_rows, const float *x, Py_ssize_t ldx, const char *xq,
                      Py_ssize_t xq_row, float *out, const float *add,
                      Py_ssize_t ld) noexcept nogil:
    """linear_block over the step's rows: at once when their activations are quantized (xq),
    else sequence by sequence (the float methods depend on how many rows they multiply) -- or,
    when every sequence has one row (decode), all at once with each row's bits its own
    (linear_block's apart)."""
    cdef const mf_segment *sg
    cdef int s
    if xq != NULL or st.n_segs == 1 or st.T == st.n_segs:
        linear_block(e0, w, w_row_bytes, dt, K, bias, n_valid, n_rows, x, ldx, xq, xq_row, st.T,
                     out, add, ld, xq == NULL and st.n_segs > 1)
        return
    for s in range(st.n_segs):
        sg = &st.segs[s]
        linear_block(e0, w, w_row_bytes, dt, K, bias, n_valid, n_rows, x + sg.t0 * ldx, ldx,
                     NULL, xq_row, sg.n, out + sg.t0 * ld,
                     add + sg.t0 * ld if add != NULL else NULL, ld)


cdef void qkv_head(const mf_step *st, const mf_model_layer *ly, int layer,
                   Py_ssize_t hh) noexcept nogil:
    """q, k or v of head hh (< H + 2G) for every row of the step: projected, biased, normed,
    roped at each row's position; k and v into each row's sequence's cache."""
    cdef const mf_model *m = st.m
    cdef Py_ssize_t E = m.E, H = m.H, G = m.G, D = m.D, C = ly.cache_rows, T = st.T
    cdef Py_ssize_t HD = H * D, row_bytes, ld, g = 0, t, r0, xq_row, row, pos
    cdef const float *xn = <const float *>(st.scratch + st.layout.xn)
    cdef float *q = <float *>(st.scratch + st.layout.q)
    cdef const char *w
    cdef const float *b
    cdef const float *norm = NULL
    cdef float *out = NULL
    cdef char *xq
    cdef char *cache
    cdef bint ring = ly.cache_rows < m.C  # position p at row p % C
    cdef bint kv = hh >= H, is_v = hh >= H + G, direct = False
    cdef Py_ssize_t elem = 2 if m.kv_f16 else 4
    cdef int dt
    if hh < H:
        dt, row_bytes = ly.wq_dt, ck_dtype_row_bytes(ly.wq_dt, E)
        w = <const char *>ly.wq + hh * D * row_bytes
        b = ly.bq + hh * D if ly.bq != NULL else NULL
        out, ld, norm = q + hh * D, HD, ly.q_norm
    elif hh < H + G:
        g = hh - H
        dt, row_bytes = ly.wk_dt, ck_dtype_row_bytes(ly.wk_dt, E)
        w = <const char *>ly.wk + g * D * row_bytes
        b = ly.bk + g * D if ly.bk != NULL else NULL
        ld, norm = D, ly.k_norm
    else:
        g = hh - H - G
        dt, row_bytes = ly.wv_dt, ck_dtype_row_bytes(ly.wv_dt, E)
        w = <const char *>ly.wv + g * D * row_bytes
        b = ly.bv + g * D if ly.bv != NULL else NULL
        ld = D
    if kv:
        # one sequence, a float32 cache that is not a ring: straight into rows pos .. pos+T-1;
        # else computed in float32 first (kv head hh - H's rows), then each to its row
        direct = not m.kv_f16 and not ring and st.n_segs == 1
        if direct:
            out = (<float *>seg_cache(&st.segs[0], ly, layer, is_v) + g * C * D
                   + st.segs[0].pos * D)
        else:
            out = <float *>(st.scratch + st.layout.kv) + (hh - H) * T * D
    xq = q8_rows_for(st, dt, &xq_row)
    r0 = 0
    while r0 < D:
        linear_rows(st, r0, w, row_bytes, dt, E, b, D, D, xn, E, xq, xq_row, out, NULL, ld)
        r0 += GEMM_ROWS
    if norm != NULL:                      # each head's q or k normalised over its D dims
        for t in range(T):
            rmsnorm_row(out + t * ld, norm, D, D, m.eps, out + t * ld)
    if not is_v and ly.rope_cos != NULL:
        for t in range(T):
            pos = st.row_pos[t]
            rope_rotate_heads(out + t * ld, 1, D, D, ly.rope_cos + pos * (D // 2),
                              ly.rope_sin + pos * (D // 2))
    if kv and not direct:                 # into each row's sequence's cache (a ring wraps)
        for t in range(T):
            cache = <char *>seg_cache(&st.segs[st.row_seg[t]], ly, layer, is_v) + g * C * D * elem
            row = st.row_pos[t] % C
            if m.kv_f16:                  # rounded to nearest-even float16 (NumPy's cast)
                mf_quantize_row(out + t * D, <uint16_t *>cache + row * D, D, CK_DT_FP16)
            else:
                memcpy(<float *>cache + row * D, out + t * D, D * sizeof(float))


cdef void attention_chunk(const mf_step *st, const mf_model_layer *ly, int layer,
                          Py_ssize_t c) noexcept nogil:
    """Chunk c of PHASE_ATTN: a task of one sequence's attention; with wo quantized in place,
    the Q8_0 blocks of the heads it computed too (a split-KV pass: PHASE_COMBINE does it)."""
    cdef const mf_model *m = st.m
    cdef Py_ssize_t H = m.H, G = m.G, D = m.D, C = ly.cache_rows, HD = H * D
    cdef Py_ssize_t n_qt, h, i0, nq, g, t, nh, cc = c
    cdef const float *q = <const float *>(st.scratch + st.layout.q)
    cdef float *attn = <float *>(st.scratch + st.layout.attn)
    cdef float *parts = <float *>(st.scratch + st.layout.parts)
    cdef char *attnq = st.scratch + st.layout.attnq
    cdef float scale = m.attn_scale
    cdef bint quantize = quantized_in_place(m, ly.wo_dt, D)
    cdef const mf_one_token_plan *p
    cdef mf_att_opts opts = layer_att_opts(m, ly)
    cdef const mf_segment *sg = chunk_segment(st, 1 if ly.window > 0 else 0, &cc)
    cdef const void *k_c = seg_cache(sg, ly, layer, False)
    cdef const void *v_c = seg_cache(sg, ly, layer, True)
    cdef Py_ssize_t row0 = sg.t0
    if sg.n == 1:
        p = layer_plan(sg, ly)
        one_token_task(p, cc, q + row0 * HD, k_c, v_c, m.kv_f16, sg.pos, H, G, D, D, C, scale,
                       m.kv_tile, attn + row0 * HD,
                       parts + (sg - st.segs) * MF_STEP_SPLIT_FLOATS, &opts)
        if quantize and p.kind != ONE_TOKEN_SPLIT:
            h = one_token_task_heads(p, cc, H, G, &nh)
            quantize_row_piece(attn + row0 * HD, attnq + row0 * st.layout.attnq_row, HD, h * D,
                               (h + nh) * D)
        return
    n_qt = ceil_div(sg.n, m.q_tile)
    h = cc // n_qt
    i0 = (cc % n_qt) * m.q_tile
    nq = min(<Py_ssize_t>m.q_tile, sg.n - i0)
    g = h // (H // G)
    attend_query_rows(q + (row0 + i0) * HD + h * D, HD, kv_rows(k_c, m.kv_f16, g * C * D),
                      kv_rows(v_c, m.kv_f16, g * C * D), m.kv_f16, sg.pos + i0, nq, D, D,
                      scale, m.kv_tile, attn + (row0 + i0) * HD + h * D, HD, &opts)
    if quantize:
        for t in range(row0 + i0, row0 + i0 + nq):
            quantize_row_piece(attn + t * HD, attnq + t * st.layout.attnq_row, HD, h * D,
                               (h + 1) * D)


cdef inline void add_normalised(const float *y, const float *gamma, Py_ssize_t E, float eps,
                                const float *x, float *out) noexcept nogil:
    """out[:E] = x[:E] + rmsnorm(y[:E], gamma) (a sandwich norm's residual add; out may be x)."""
    cdef float inv = rms_inverse(y, E, eps)
    cdef Py_ssize_t e
    for e in range(E):
        out[e] = x[e] + y[e] * inv * gamma[e]


cdef bint prefetch_chunk_weights(const mf_step *st, const mf_phase *ph,
                                 Py_ssize_t c) noexcept nogil:
    """Prefetch into L2 the weight rows chunk c (< ph.n) of phase ph reads (see the top);
    False for a phase that reads no weights."""
    cdef const mf_model *m = st.m
    cdef const mf_model_layer *ly = NULL
    cdef Py_ssize_t E = m.E, H = m.H, G = m.G, D = m.D, I = m.F, HD = H * D, rb, e0, rows
    cdef int kind = ph.kind
    if ph.layer >= 0:
        ly = &m.layers[ph.layer]
    if kind == PHASE_QKV:
        if c < H:
            rb = ck_dtype_row_bytes(ly.wq_dt, E)
            mf_prefetch_l2(<const char *>ly.wq + c * D * rb, D * rb)
        elif c < H + G:
            rb = ck_dtype_row_bytes(ly.wk_dt, E)
            mf_prefetch_l2(<const char *>ly.wk + (c - H) * D * rb, D * rb)
        else:
            rb = ck_dtype_row_bytes(ly.wv_dt, E)
            mf_prefetch_l2(<const char *>ly.wv + (c - H - G) * D * rb, D * rb)
    elif kind == PHASE_OUTPROJ:
        rows = proj_rows(st)
        e0 = c * rows
        rb = ck_dtype_row_bytes(ly.wo_dt, HD)
        mf_prefetch_l2(<const char *>ly.wo + e0 * rb, (min(E, e0 + rows) - e0) * rb)
    elif kind == PHASE_GATEUP:
        rb = ck_dtype_row_bytes(ly.w1_dt, E)
        e0 = c * GEMM_ROWS
        rows = min(I, e0 + GEMM_ROWS) - e0
        mf_prefetch_l2(<const char *>ly.w1 + e0 * rb, rows * rb)           # gate rows
        mf_prefetch_l2(<const char *>ly.w1 + (I + e0) * rb, rows * rb)     # up rows
    elif kind == PHASE_DOWN:
        rows = proj_rows(st)
        e0 = c * rows
        rb = ck_dtype_row_bytes(ly.w2_dt, I)
        mf_prefetch_l2(<const char *>ly.w2 + e0 * rb, (min(E, e0 + rows) - e0) * rb)
    elif kind == PHASE_HEAD:
        rb = ck_dtype_row_bytes(m.head_dt, E)
        e0 = c * HEAD_ROWS
        rows = min(m.V, e0 + HEAD_ROWS) - e0
        mf_prefetch_l2(<const char *>m.head + e0 * rb,
                       min(<Py_ssize_t>PREFETCH_HEAD_BYTES, rows * rb))
    else:
        return False
    return True


cdef void run_chunk(const mf_step *st, const mf_phase *ph, Py_ssize_t c) noexcept nogil:
    """Chunk c (< ph.n) of phase ph."""
    cdef const mf_model *m = st.m
    cdef const mf_model_layer *ly = NULL
    cdef const mf_segment *sg
    cdef Py_ssize_t E = m.E, H = m.H, D = m.D, I = m.F, V = m.V, T = st.T, HD = H * D
    cdef Py_ssize_t t0 = c * STEP_ROW_TOKENS, t1, t, e0, e1, rows, row_bytes, xq_row, rb, r, cc
    cdef Py_ssize_t n_r
    cdef float *x = <float *>(st.scratch + st.layout.x)
    cdef float *xn = <float *>(st.scratch + st.layout.xn)
    cdef float *attn = <float *>(st.scratch + st.layout.attn)
    cdef char *attnq = st.scratch + st.layout.attnq
    cdef float *act = <float *>(st.scratch + st.layout.act)
    cdef char *actq = st.scratch + st.layout.actq
    cdef float *hid
    cdef float *y = <float *>(st.scratch + st.layout.y)
    cdef char *xq
    cdef int kind = ph.kind, s
    if ph.layer >= 0:
        ly = &m.layers[ph.layer]
    t1 = min(t0 + STEP_ROW_TOKENS, T)

    if kind == PHASE_LOAD:
        for t in range(t0, t1):
            if st.tokens != NULL:
                row_bytes = ck_dtype_row_bytes(m.embedding_dt, E)
                dequantize_row(<const char *>m.embedding + <Py_ssize_t>st.tokens[t] * row_bytes,
                               x + t * E, E, m.embedding_dt)
                if m.embed_scale != 1.0:
                    mf_scale_f32(x + t * E, m.embed_scale, E)
            else:
                memcpy(x + t * E, st.x_in + t * E, E * sizeof(float))
    elif kind == PHASE_NORM_ATTN:
        normalise_rows(st, x, ly.ln1_gamma, t0, t1, ly.wq_dt, ly.wk_dt, ly.wv_dt)
    elif kind == PHASE_QKV:
        qkv_head(st, ly, ph.layer, c)
    elif kind == PHASE_ATTN:
        attention_chunk(st, ly, ph.layer, c)
    elif kind == PHASE_COMBINE:
        cc = c
        sg = combine_segment(st, 1 if ly.window > 0 else 0, &cc)
        one_token_combine(layer_plan(sg, ly), cc,
                          <const float *>(st.scratch + st.layout.parts)
                          + (sg - st.segs) * MF_STEP_SPLIT_FLOATS, H, D, D, attn + sg.t0 * HD)
        if quantized_in_place(m, ly.wo_dt, D):
            quantize_row_piece(attn + sg.t0 * HD, attnq + sg.t0 * st.layout.attnq_row, HD,
                               cc * D, (cc + 1) * D)
    elif kind == PHASE_QUANT_ATTN:
        for t in range(t0, t1):
            quantize_activation_row(attn + t * HD, attnq + t * st.layout.attnq_row, HD, ly.wo_dt)
    elif kind == PHASE_OUTPROJ:
        rows = proj_rows(st)
        e0 = c * rows
        rb = ck_dtype_row_bytes(ly.wo_dt, HD)
        linear_rows(st, e0, <const char *>ly.wo, rb, ly.wo_dt, HD, ly.bo, E, min(E, e0 + rows),
                    attn, HD, attnq if m.int8 and uses_q8_activations(ly.wo_dt) else NULL,
                    st.layout.attnq_row, x if ly.post_attn_norm == NULL else y,
                    x if ly.post_attn_norm == NULL else NULL, E)
    elif kind == PHASE_POST_ATTN:
        for t in range(t0, t1):                 # x += rmsnorm(y, post_attn_norm)
            add_normalised(y + t * E, ly.post_attn_norm, E, m.eps, x + t * E, x + t * E)
    elif kind == PHASE_NORM_FFN:
        normalise_rows(st, x, ly.ln2_gamma, t0, t1, ly.w1_dt, ly.w1_dt, ly.w1_dt)
    elif kind == PHASE_GATEUP:
        xq = q8_rows_for(st, ly.w1_dt, &xq_row)
        if xq != NULL or st.n_segs == 1 or T == st.n_segs:   # (float: sequence by sequence,
            swiglu_block(c * GEMM_ROWS, <const char *>ly.w1,      # or one row each, apart)
                         ck_dtype_row_bytes(ly.w1_dt, E), ly.w1_dt, E, ly.b1, xn, xq, xq_row, T,
                         I, I, act, m.activation, xq == NULL and st.n_segs > 1)
        else:
            for s in range(st.n_segs):
                sg = &st.segs[s]
                swiglu_block(c * GEMM_ROWS, <const char *>ly.w1,
                             ck_dtype_row_bytes(ly.w1_dt, E), ly.w1_dt, E, ly.b1,
                             xn + sg.t0 * E, NULL, xq_row, sg.n, I, I, act + sg.t0 * I,
                             m.activation)
        if quantized_in_place(m, ly.w2_dt, GEMM_ROWS):
            for t in range(T):
                quantize_row_piece(act + t * I, actq + t * st.layout.actq_row, I, c * GEMM_ROWS,
                                   min(I, (c + 1) * GEMM_ROWS))
    elif kind == PHASE_QUANT_ACT:
        for t in range(t0, t1):
            quantize_activation_row(act + t * I, actq + t * st.layout.actq_row, I, ly.w2_dt)
    elif kind == PHASE_DOWN:
        rows = proj_rows(st)
        e0 = c * rows
        e1 = min(E, e0 + rows)
        linear_rows(st, e0, <const char *>ly.w2, ck_dtype_row_bytes(ly.w2_dt, I), ly.w2_dt, I,
                    ly.b2, E, e1, act, I,
                    actq if m.int8 and uses_q8_activations(ly.w2_dt) else NULL,
                    st.layout.actq_row, x if ly.post_ffn_norm == NULL else y,
                    x if ly.post_ffn_norm == NULL else NULL, E)
        if st.hidden != NULL and ly.post_ffn_norm == NULL:
            hid = st.hidden + ph.layer * st.hidden_layer_stride
            for t in range(T):
                memcpy(hid + t * E + e0, x + t * E + e0, (e1 - e0) * sizeof(float))
    elif kind == PHASE_POST_FFN:
        for t in range(t0, t1):                 # x += rmsnorm(y, post_ffn_norm)
            add_normalised(y + t * E, ly.post_ffn_norm, E, m.eps, x + t * E, x + t * E)
            if st.hidden != NULL:
                memcpy(st.hidden + ph.layer * st.hidden_layer_stride + t * E, x + t * E,
                       E * sizeof(float))
    elif kind == PHASE_NORM_OUT:
        t1 = min(t0 + STEP_ROW_TOKENS, <Py_ssize_t>st.R)
        xq = q8_rows_for(st, m.head_dt, &xq_row)
        for r in range(t0, t1):            # logit row r normalises the step's row logit_row[r]
            rmsnorm_row(x + st.logit_row[r] * E, m.out_norm, E, E, m.eps, xn + r * E)
            if xq != NULL:
                quantize_activation_row(xn + r * E, xq + r * xq_row, E, m.head_dt)
    elif kind == PHASE_HEAD:
        xq = q8_rows_for(st, m.head_dt, &xq_row)
        row_bytes = ck_dtype_row_bytes(m.head_dt, E)
        e1 = min(V, (c + 1) * HEAD_ROWS)
        if xq == NULL and st.n_segs > 1 and head_rows_apart(st, c * HEAD_ROWS, e1, row_bytes):
            pass                                # (float, one logit row a sequence: done)
        else:
            for s in range(st.n_segs):          # each sequence's rows into its own logits
                sg = &st.segs[s]
                if sg.logits == NULL:
                    continue
                n_r = sg.n if sg.all_logits else 1
                e0 = c * HEAD_ROWS
                while e0 < e1:
                    linear_block(e0, <const char *>m.head, row_bytes, m.head_dt, E, NULL, V, e1,
                                 xn + sg.r0 * E, E,
                                 xq + sg.r0 * xq_row if xq != NULL else NULL, xq_row, n_r,
                                 sg.logits, NULL, V)
                    e0 += GEMM_ROWS
        for s in range(st.n_segs):
            sg = &st.segs[s]
            if sg.logits == NULL:
                continue
            n_r = sg.n if sg.all_logits else 1
            if m.final_softcap > 0.0:          # logits capped: softcap * tanh(z / softcap)
                for t in range(n_r):
                    for r in range(c * HEAD_ROWS, e1):
                        sg.logits[t * V + r] = m.final_softcap * tanhf(sg.logits[t * V + r]
                                                                       / m.final_softcap)


cdef bint head_rows_apart(const mf_step *st, Py_ssize_t e0, Py_ssize_t e1,
                          Py_ssize_t row_bytes) noexcept nogil:
    """Float head rows e0 .. e1-1 for a step whose every sequence wants one logit row: each
    sequence's logits the bits of its own step (linear_block's one-token path: the 4-row dot,
    + a bias of 0), the rows decoded once for two sequences where the level has the 2-token
    4-row dot.  False (nothing done) when a sequence wants more rows or the head has no 4-row
    dot (FP32): the caller runs each sequence's rows."""
    cdef const mf_model *m = st.m
    cdef const float *xn = <const float *>(st.scratch + st.layout.xn)
    cdef mf_dot4_f32_fn dot4 = mf_dot4_f32_for(m.head_dt)
    cdef mf_dot4x2_f32_fn dot4x2 = mf_dot4x2_f32_for(m.head_dt)
    cdef int seg[MF_STEP_MAX_SEGMENTS]
    cdef float res0[4]
    cdef float res1[4]
    cdef const char *rows[4]
    cdef const mf_segment *a
    cdef const mf_segment *b
    cdef int s, n = 0, i
    cdef Py_ssize_t e, r, nr, E = m.E
    if dot4 == NULL:
        return False
    for s in range(st.n_segs):
        if st.segs[s].logits == NULL:
            continue
        if st.segs[s].all_logits and st.segs[s].n > 1:
            return False
        seg[n] = s
        n += 1
    e = e0
    while e < e1:
        nr = min(<Py_ssize_t>4, e1 - e)
        for r in range(4):                  # missing rows: the last one again (discarded)
            rows[r] = <const char *>m.head + (e + min(r, nr - 1)) * row_bytes
        i = 0
        if dot4x2 != NULL:
            while i + 1 < n:
                a, b = &st.segs[seg[i]], &st.segs[seg[i + 1]]
                dot4x2(<const void **>rows, xn + a.r0 * E, xn + b.r0 * E, E, res0, res1)
                for r in range(nr):
                    a.logits[e + r] = res0[r] + <float>0.0
                    b.logits[e + r] = res1[r] + <float>0.0
                i += 2
        while i < n:
            a = &st.segs[seg[i]]
            dot4(<const void **>rows, xn + a.r0 * E, E, res0)
            for r in range(nr):
                a.logits[e + r] = res0[r] + <float>0.0
            i += 1
        e += 4
    return True


cdef void step_job(void *ctx, mf_team *team, int thread_id, uint32_t gen) noexcept nogil:
    """What every thread of the team runs for a step: claim a ticket, take a chunk of its phase
    (its own lane first), prefetch that chunk's weights and the next one's, wait for the phase,
    run, count."""
    cdef const mf_step *st
    cdef const mf_phase *ph
    cdef const mf_phase *nxt
    cdef int64_t c
    cdef uint32_t chunk
    cdef int p = 0, q, lane
    while True:
        c = mf_team_claim_gen(team, gen)
        if c < 0:
            return
        st = <const mf_step *>ctx           # (read only after a successful claim)
        while st.phases[p].base + st.phases[p].n <= <uint32_t>c:
            p += 1
        ph = &st.phases[p]
        lane = thread_id % ph.n_lanes
        chunk = mf_phase_take(<mf_phase *>ph, lane)      # c is a ticket of phase p
        prefetch_chunk_weights(st, ph, chunk)
        # and the chunk this thread most likely runs next: the next of its lane, else the first
        # of its lane in the next phase that reads weights
        if chunk + 1 < ph.lanes[lane].end:
            prefetch_chunk_weights(st, ph, chunk + 1)
        else:
            q = p + 1
            while q < st.n_phases and q <= p + 3:
                nxt = &st.phases[q]
                if prefetch_chunk_weights(st, nxt, nxt.lanes[thread_id % nxt.n_lanes].start):
                    break
                q += 1
        mf_team_wait_done(team, ph.base)
        run_chunk(st, ph, chunk)
        mf_team_chunk_done(team)


cdef bint step_is_small(const mf_step *st, size_t limit) noexcept nogil:
    """True when the step reads fewer than `limit` weight bytes: every layer's six projections,
    and the head's rows when logits are wanted (the embedding rows of the tokens are a few KB).
    The sum stops as soon as it reaches the limit: a real model's first layer or two."""
    cdef const mf_model *m = st.m
    cdef const mf_model_layer *ly
    cdef Py_ssize_t E = m.E, HD = m.H * m.D, GD = m.G * m.D, F = m.F
    cdef size_t total = 0
    cdef int l
    for l in range(m.n_layers):
        ly = &m.layers[l]
        total += <size_t>(HD * ck_dtype_row_bytes(ly.wq_dt, E)
                          + GD * ck_dtype_row_bytes(ly.wk_dt, E)
                          + GD * ck_dtype_row_bytes(ly.wv_dt, E)
                          + E * ck_dtype_row_bytes(ly.wo_dt, HD)
                          + 2 * F * ck_dtype_row_bytes(ly.w1_dt, E)
                          + E * ck_dtype_row_bytes(ly.w2_dt, F))
        if total >= limit:
            return False
    if m.head != NULL and st.R > 0:
        total += <size_t>(m.V * ck_dtype_row_bytes(m.head_dt, E))
    return total < limit


cdef void run_step_alone(mf_step *st, uint32_t total) noexcept nogil:
    """The step's chunks in order on the calling thread (st.n_threads = 1: one lane a phase):
    the chunks the team would run, so the same results."""
    cdef const mf_phase *ph
    cdef uint32_t c, chunk
    cdef int p = 0
    for c in range(total):
        while st.phases[p].base + st.phases[p].n <= c:
            p += 1
        ph = &st.phases[p]
        chunk = mf_phase_take(<mf_phase *>ph, 0)
        run_chunk(st, ph, chunk)


cdef void run_step(mf_step *st, mf_team *team) noexcept nogil:
    """The step of st.segs (their t0, n, pos, caches and outputs set; st.tokens / x_in its
    rows): planned, run on the team or alone, each sequence's last-layer rows copied to its
    x_out."""
    cdef const mf_model *m = st.m
    cdef const float *x = <const float *>(st.scratch + st.layout.x)
    cdef uint32_t total
    cdef bint solo
    cdef int s
    plan_segments(st)
    solo = team.n_threads == 1 or step_is_small(st, st.solo_bytes // <size_t>st.T)
    st.n_threads = 1 if solo else team.n_threads
    total = plan_step(st)
    if solo:
        run_step_alone(st, total)
    else:
        mf_team_run(team, total, step_job, st)
    for s in range(st.n_segs):
        if st.segs[s].x_out != NULL:
            memcpy(st.segs[s].x_out, x + st.segs[s].t0 * m.E,
                   st.segs[s].n * m.E * sizeof(float))


cdef void model_forward_kernel(
        mf_step *st,               # the model, its scratch and phase table (the boundary's)
        mf_team *team,
        const int32_t *tokens,     # [T] token ids, or NULL (then x_in)
        const float *x_in,         # [T, E] hidden states in, or NULL
        int tokens_n,              # T
        int start_pos,             # position of the first token
        float *logits,             # [T, V] (all_logits) or [V] (the last token's), or NULL
        int all_logits,
        float *x_out,              # [T, E] hidden states out (no head), or NULL
        float *hidden,             # [L, T, E] every layer's output, or NULL
        int num_threads) noexcept nogil:
    """Tokens (or hidden states) at positions start_pos .. start_pos+T-1 of the model's own
    sequence (the layers' caches), in steps of at most MF_STEP_TOKENS tokens; their k, v are
    appended to the caches."""
    cdef Py_ssize_t T = tokens_n, t0 = 0, nt
    cdef const mf_model *m = st.m
    cdef mf_segment *sg = &st.segs[0]
    st.hidden_layer_stride = T * m.E
    st.n_segs = 1
    sg.k_cache = sg.v_cache = NULL
    while t0 < T:
        nt = min(<Py_ssize_t>MF_STEP_TOKENS, T - t0)
        sg.n, sg.pos = <int>nt, start_pos + <int>t0
        st.tokens = tokens + t0 if tokens != NULL else NULL
        st.x_in = x_in + t0 * m.E if x_in != NULL else NULL
        sg.x_out = x_out + t0 * m.E if x_out != NULL else NULL
        st.hidden = hidden + t0 * m.E if hidden != NULL else NULL
        sg.all_logits = all_logits
        if logits == NULL or (not all_logits and t0 + nt < T):
            sg.logits = NULL
        else:
            sg.logits = logits + t0 * m.V if all_logits else logits
        run_step(st, team)
        t0 += nt


cdef void model_batch_kernel(
        mf_step *st,               # st.segs[:n_segs]: each sequence's n, pos, caches, outputs
        mf_team *team,
        const int32_t *tokens,     # [T] every sequence's token ids, in order (T <= MF_STEP_TOKENS)
        int n_segs,
        int num_threads) noexcept nogil:
    """One step of several sequences' tokens (a batch): the weights read once for all of them,
    every row computed as in a step of its sequence alone."""
    st.n_segs = n_segs
    st.tokens = tokens
    st.x_in = NULL
    st.hidden = NULL
    run_step(st, team)
