# Projections: a block of up to 64 weight rows, in any weight format, against a tile of tokens.
#
# These are the inner loops of every prefill and MLP projection (out[t, r] = x[t] . w[r] + b[r]):
# the kernels parallelise over blocks of GEMM_ROWS weight rows and hand each block every token of
# the call, so a weight row is read (and dequantized) once per call while the activations stay in
# L1/L2.  Every output element is one fixed-order reduction: results do not depend on the thread
# count, nor on how rows fall into blocks.
#
# Float activations, PACK_MIN_TOKENS tokens or more: the block's rows are packed 256 columns at a
# time into a panel (include/megafuse/mf_gemm.h; other formats than FP32 are dequantized first)
# and the 6-token x 16-row register block runs over it for every token of the tile.  Fewer tokens
# (too little work to pay for packing): the 3-token x 4-row dot-product block (mf_dot_3x4_f32)
# over the rows in place; with one or two tokens, 4 rows at a time stream past each token
# (mf_dot_1x4_f32 for FP32, rows_dot_f32 for the other formats: decoded in registers; both with
# prefetch of the rows ahead: decode's paths).
# Int8 activations (the _q8_0 prefill, the MLP): the token rows were quantized to the activation
# format of the weight (Q8_0 for 32-weight blocks, Q8_K for K-quants); each (row, token) is one
# integer dot product from the format layer, computed 4 weight rows x up to 64 tokens at a time
# by mf_q8_rows_tokens (one token: the 4 rows stream side by side; more: the rows decoded once
# into L1), bit-identical to the one-row dot of every pair.

cdef extern from "megafuse/mf_gemm.h" nogil:
    enum: MF_PANEL_ROWS                  # 16 weight rows a packed panel
    enum: MF_PANEL_K                     # 256 columns a packed panel
    enum: MF_GEMM_MR                     # 6 tokens a register block
    void mf_pack_panel_f32(const float **rows, Py_ssize_t kc, float *panel)
    void mf_prefetch_l2(const void *p, Py_ssize_t nbytes)
    void mf_gemm_panel_f32(int mr, const float *x, Py_ssize_t ldx, const float *panel,
                           Py_ssize_t kc, float *c, int first)
    void mf_gemm_panel2_f32(int mr, const float *x, Py_ssize_t ldx, const float *pa,
                            const float *pb, Py_ssize_t kc, float *ca, float *cb, int first)

cdef enum:
    GEMM_ROWS = 64            # weight rows a block (one task of a parallel loop): 4 panels
    DOT_ROWS = 4              # weight rows of the dot-product and int8 register blocks
    Q8_GROUP_ROWS = 16        # weight rows of one int8 tile call (rows16_tokens_dot_q8)
    GEMM_TOKENS = 3           # token rows of the dot-product register block
    PROJ_CHUNK = 512          # columns dequantized at once (dot path): a multiple of every block
    PROJ_TOKEN_TILE = 48      # tokens sharing one pass of the dot path over a block's rows
    PACK_MIN_TOKENS = 4       # from this many tokens on, the packed-panel GEMM
    PACK_TOKEN_TILE = 128     # tokens sharing one packed panel


cdef inline bint uses_q8_activations(int dt) noexcept nogil:
    """The int8 path quantizes activations for the block formats only (FP32/FP16/BF16 stay
    float)."""
    return ck_dtype_block_size(dt) > 1


cdef struct RowBlock:
    # up to GEMM_ROWS weight rows and where their results go
    int n                                 # rows in the block (1..64)
    const char *w[GEMM_ROWS]              # each row: K values in the block's format
    float bias[GEMM_ROWS]
    const float *add[GEMM_ROWS]           # [T, ld] columns added to the results, or NULL
    float *out[GEMM_ROWS]                 # [T, ld] result columns


cdef inline void store_results(const RowBlock *b, Py_ssize_t r, const float *res, Py_ssize_t stride,
                               Py_ssize_t t0, Py_ssize_t nt, Py_ssize_t ld) noexcept nogil:
    """b.out[r][(t0 + j) * ld] = res[j * stride] + b.bias[r] (+ b.add[r][(t0 + j) * ld])."""
    cdef Py_ssize_t j
    cdef float value
    for j in range(nt):
        value = res[j * stride] + b.bias[r]
        if b.add[r] != NULL:
            value = value + b.add[r][(t0 + j) * ld]
        b.out[r][(t0 + j) * ld] = value


cdef void rows_dot_tokens_f32(
        const RowBlock *b, Py_ssize_t r0, int dt, Py_ssize_t K,
        const float *x,        # [T, ldx] token rows, K values each
        Py_ssize_t ldx, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """Rows r0 .. r0+3 of the block (those < b.n) by the dot-product register block (few tokens)."""
    cdef float chunk[DOT_ROWS * PROJ_CHUNK]      # the rows, dequantized, chunk by chunk
    cdef float acc[PROJ_TOKEN_TILE * DOT_ROWS]   # [tile, 4] sums over the chunks so far
    cdef float res[GEMM_TOKENS][DOT_ROWS]
    cdef const float *wp[DOT_ROWS]
    cdef const void *wq[DOT_ROWS]                # the same rows, any format
    cdef const float *xp[GEMM_TOKENS]
    cdef Py_ssize_t t0, nt, tg, j, r, k0, n
    cdef Py_ssize_t nr = min(<Py_ssize_t>DOT_ROWS, b.n - r0)
    cdef bint direct = dt == CK_DT_FP32
    cdef const char *ahead
    if direct and T < GEMM_TOKENS:               # one or two tokens: 4 rows stream past each
        for r in range(DOT_ROWS):
            wp[r] = <const float *>b.w[r0 + min(r, nr - 1)]
        # the next rows to prefetch: the block's next 4, or past its last row
        ahead = b.w[r0 + DOT_ROWS] if r0 + DOT_ROWS < b.n else b.w[b.n - 1] + K * sizeof(float)
        for j in range(T):
            mf_dot_1x4_f32(x + j * ldx, wp, K, &res[0][0], ahead)
            for r in range(nr):
                acc[j * DOT_ROWS + r] = res[0][r]
        for r in range(nr):
            store_results(b, r0 + r, acc + r, DOT_ROWS, 0, T, ld)
        return
    if not direct and T < GEMM_TOKENS:           # one or two tokens: 4 rows decoded in registers
        for r in range(DOT_ROWS):
            wq[r] = <const void *>b.w[r0 + min(r, nr - 1)]
        for j in range(T):
            rows_dot_f32(wq, dt, x + j * ldx, K, &res[0][0])
            for r in range(nr):
                acc[j * DOT_ROWS + r] = res[0][r]
        for r in range(nr):
            store_results(b, r0 + r, acc + r, DOT_ROWS, 0, T, ld)
        return
    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>PROJ_TOKEN_TILE, T - t0)
        for j in range(nt * DOT_ROWS):
            acc[j] = 0.0
        k0 = 0
        while k0 < K:
            n = K if direct else min(<Py_ssize_t>PROJ_CHUNK, K - k0)
            for r in range(DOT_ROWS):
                if direct:
                    wp[r] = <const float *>b.w[r0 + min(r, nr - 1)]
                else:
                    wp[r] = chunk + min(r, nr - 1) * PROJ_CHUNK
                    if r < nr:
                        dequantize_row(b.w[r0 + r] + ck_dtype_row_bytes(dt, k0),
                                       chunk + r * PROJ_CHUNK, n, dt)
            tg = 0
            while tg < nt:
                for j in range(GEMM_TOKENS):
                    xp[j] = x + (t0 + min(tg + j, nt - 1)) * ldx + k0
                mf_dot_3x4_f32(xp, wp, n, res)
                for j in range(min(<Py_ssize_t>GEMM_TOKENS, nt - tg)):
                    for r in range(DOT_ROWS):
                        acc[(tg + j) * DOT_ROWS + r] += res[j][r]
                tg += GEMM_TOKENS
            k0 += n
        for r in range(nr):
            store_results(b, r0 + r, acc + r, DOT_ROWS, t0, nt, ld)
        t0 += nt


cdef void block_gemm_packed_f32(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x,        # [T, ldx] token rows, K values each
        Py_ssize_t ldx, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """All rows of the block by packed panels of 16 rows (include/megafuse/mf_gemm.h), two panels
    through each register block (mf_gemm_panel2_f32) while two remain.

    Loop order: token tiles, then 256-column slices, then the block's panels: a slice of the
    tile's activations (PACK_TOKEN_TILE x 256 floats, 128 KiB) stays in L2 while all the block's
    panels (each pair packed into L1) go through it."""
    cdef float panel_mem[2 * MF_PANEL_K * MF_PANEL_ROWS + 16]   # 2 x [256, 16] packed, aligned
    cdef float stage[2 * MF_PANEL_ROWS * MF_PANEL_K]   # 2 x [16, 256] dequantized rows (not FP32)
    cdef float acc[GEMM_ROWS * PACK_TOKEN_TILE]    # [panel][tile][16] sums of the slices so far
    cdef const float *rows[MF_PANEL_ROWS]
    cdef float *panel = <float *>((<size_t>panel_mem + 63) & ~(<size_t>63))
    cdef float *acc_p
    cdef Py_ssize_t t0, nt, i, mr, j, k0, kc, p0, np_rows, last, q, pq, n_pan
    cdef Py_ssize_t pn, kn, n_next, next_off, next_bytes, per_call, g
    cdef float value
    cdef bint direct = dt == CK_DT_FP32
    t0 = 0
    while t0 < T:
        nt = min(<Py_ssize_t>PACK_TOKEN_TILE, T - t0)
        k0 = 0
        while k0 < K:
            kc = min(<Py_ssize_t>MF_PANEL_K, K - k0)
            p0 = 0
            while p0 < b.n:                      # panels q: rows p0 + 16q .. p0 + 16q + 15
                n_pan = 2 if p0 + MF_PANEL_ROWS < b.n else 1
                for q in range(n_pan):
                    pq = p0 + q * MF_PANEL_ROWS
                    np_rows = min(<Py_ssize_t>MF_PANEL_ROWS, b.n - pq)
                    last = pq + np_rows - 1      # rows past the block repeat it (results unused)
                    for j in range(MF_PANEL_ROWS):
                        if direct:
                            rows[j] = <const float *>b.w[min(pq + j, last)] + k0
                        else:
                            if j < np_rows:
                                dequantize_row(b.w[pq + j] + ck_dtype_row_bytes(dt, k0),
                                               stage + (q * MF_PANEL_ROWS + j) * MF_PANEL_K,
                                               kc, dt)
                            rows[j] = stage + (q * MF_PANEL_ROWS + min(j, np_rows - 1)) * MF_PANEL_K
                    mf_pack_panel_f32(rows, kc, panel + q * MF_PANEL_K * MF_PANEL_ROWS)
                # the next panels' rows (this slice's next pair, or the next slice's first),
                # prefetched a few rows per register block while these panels compute
                pn, kn = p0 + n_pan * MF_PANEL_ROWS, k0
                if pn >= b.n:
                    pn, kn = 0, k0 + kc
                n_next = min(<Py_ssize_t>(2 * MF_PANEL_ROWS), b.n - pn) if kn < K else 0
                if n_next > 0:
                    next_off = ck_dtype_row_bytes(dt, kn)
                    next_bytes = ck_dtype_row_bytes(dt, min(<Py_ssize_t>MF_PANEL_K, K - kn))
                per_call = (n_next * MF_GEMM_MR + nt - 1) // nt   # rows a block, >= 1 if any
                acc_p = acc + p0 * PACK_TOKEN_TILE
                i = 0
                g = 0
                while i < nt:
                    mr = min(<Py_ssize_t>MF_GEMM_MR, nt - i)
                    for j in range(g, min(g + per_call, n_next)):
                        mf_prefetch_l2(b.w[pn + j] + next_off, next_bytes)
                    g += per_call
                    if n_pan == 2:
                        mf_gemm_panel2_f32(<int>mr, x + (t0 + i) * ldx + k0, ldx, panel,
                                           panel + MF_PANEL_K * MF_PANEL_ROWS, kc,
                                           acc_p + i * MF_PANEL_ROWS,
                                           acc_p + MF_PANEL_ROWS * PACK_TOKEN_TILE
                                           + i * MF_PANEL_ROWS, k0 == 0)
                    else:
                        mf_gemm_panel_f32(<int>mr, x + (t0 + i) * ldx + k0, ldx, panel, kc,
                                          acc_p + i * MF_PANEL_ROWS, k0 == 0)
                    i += mr
                p0 += n_pan * MF_PANEL_ROWS
            k0 += kc
        for i in range(nt):          # token by token: a token's results are contiguous in out
            for j in range(b.n):
                value = (acc[(j // MF_PANEL_ROWS) * MF_PANEL_ROWS * PACK_TOKEN_TILE
                             + i * MF_PANEL_ROWS + j % MF_PANEL_ROWS] + b.bias[j])
                if b.add[j] != NULL:
                    value = value + b.add[j][(t0 + i) * ld]
                b.out[j][(t0 + i) * ld] = value
        t0 += nt


cdef inline void one_token_rows(
        const RowBlock *b, Py_ssize_t K,
        mf_dot4_q8_fn dot4_q8, const char *xq,      # the int8 dot and the token's quantized row,
        mf_dot4_f32_fn dot4_f32, const float *x) noexcept nogil:   # or the float dot and row
    """The block for one token through a 4-row dot straight, each result stored by store_results:
    the same bits as the general paths, without their token loops: a decode step makes tens of
    thousands of such calls a token, so those loops would be a visible share of its work."""
    cdef float res[DOT_ROWS]
    cdef const char *rows[DOT_ROWS]
    cdef Py_ssize_t r0, r, nr
    r0 = 0
    while r0 < b.n:
        nr = min(<Py_ssize_t>DOT_ROWS, b.n - r0)
        for r in range(DOT_ROWS):          # missing rows: the last one again (discarded)
            rows[r] = b.w[r0 + min(r, nr - 1)]
        if dot4_q8 != NULL:
            dot4_q8(<const void **>rows, xq, K, res)
        else:
            dot4_f32(<const void **>rows, x, K, res)
        for r in range(nr):
            store_results(b, r0 + r, res + r, 1, 0, 1, 0)
        r0 += DOT_ROWS


cdef void block_dot_tokens_f32(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x,        # [T, ldx] token rows, K values each
        Py_ssize_t ldx, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """b.out[r][t * ld] = x[t] . w_r + b.bias[r] (+ b.add[r][t * ld]) for r < b.n, t < T."""
    cdef Py_ssize_t r0
    cdef mf_dot4_f32_fn one_token = mf_dot4_f32_for(dt) if T == 1 else NULL   # NULL for FP32
    if one_token != NULL:
        one_token_rows(b, K, NULL, NULL, one_token, x)
        return
    if T >= PACK_MIN_TOKENS:
        block_gemm_packed_f32(b, dt, K, x, ldx, T, ld)
        return
    r0 = 0
    while r0 < b.n:
        rows_dot_tokens_f32(b, r0, dt, K, x, ldx, T, ld)
        r0 += DOT_ROWS


cdef inline void store_tile(const RowBlock *b,
                            const float *res,   # [b.n / 4 groups][MF_Q8_TILE_TOKENS][4]
                            Py_ssize_t t0, Py_ssize_t nt, Py_ssize_t ld) noexcept nogil:
    """b.out[r][(t0 + j) * ld] = res(r, j) + b.bias[r] (+ b.add[r][(t0 + j) * ld]) for every row
    of the block: store_results' values, written token by token (a token's results are
    contiguous in out; column by column, each store would touch a line of its own, ld apart)
    when the rows' results (and added columns) sit side by side -- every block but those whose
    rows span K/V cache heads (a head's rows are cache_capacity * Da apart from the next's),
    which store_results writes row by row."""
    cdef Py_ssize_t j, r, n = b.n
    cdef float value
    cdef float *dst
    cdef const float *add
    cdef const float *src
    cdef bint side_by_side = True
    for r in range(1, n):
        if b.out[r] != b.out[0] + r or (b.add[r] != NULL) != (b.add[0] != NULL) or (
                b.add[0] != NULL and b.add[r] != b.add[0] + r):
            side_by_side = False
            break
    if side_by_side:
        for j in range(nt):
            dst = b.out[0] + (t0 + j) * ld
            src = res + j * DOT_ROWS
            if b.add[0] == NULL:
                for r in range(n):
                    dst[r] = src[(r // DOT_ROWS) * (MF_Q8_TILE_TOKENS * DOT_ROWS)
                                 + r % DOT_ROWS] + b.bias[r]
            else:
                add = b.add[0] + (t0 + j) * ld
                for r in range(n):
                    value = src[(r // DOT_ROWS) * (MF_Q8_TILE_TOKENS * DOT_ROWS)
                                + r % DOT_ROWS] + b.bias[r]
                    dst[r] = value + add[r]
        return
    for r in range(n):       # rows apart (K/V cache heads): column by column
        store_results(b, r, res + (r // DOT_ROWS) * (MF_Q8_TILE_TOKENS * DOT_ROWS) + r % DOT_ROWS,
                      DOT_ROWS, t0, nt, ld)


cdef void block_dot_tokens_q8(
        const RowBlock *b, int dt, Py_ssize_t K,
        const char *xq,        # [T, xq_row_bytes]: token rows quantized to dt's activation format
        Py_ssize_t xq_row_bytes, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """b.out[r][t * ld] = int8 dot(w_r, xq[t]) + b.bias[r] (+ b.add[r][t * ld]).

    16 rows x up to MF_Q8_TILE_TOKENS tokens at a time (fewer for long rows: the tokens' rows stay
    in L2 while the block's rows go past them), the rows decoded once for all of them
    (rows16_tokens_dot_q8: 16 rows in the lanes at avx512, else 4-row groups;
    the bits of one weight_row_dot_q8 per pair); a tile's results are stored when all the
    block's rows have them (store_tile)."""
    cdef float res[GEMM_ROWS * MF_Q8_TILE_TOKENS]   # [4-row group, token, 4]: a tile of the block
    cdef Py_ssize_t r0, nr, t0, nt
    cdef Py_ssize_t tile
    cdef mf_dot4_q8_fn one_token = mf_dot4_q8_for(dt) if T == 1 else NULL
    if one_token != NULL:
        one_token_rows(b, K, one_token, xq, NULL, NULL)
        return
    tile = mf_q8_rows16_tile_tokens(dt, <size_t>xq_row_bytes)
    t0 = 0
    while t0 < T:
        nt = min(tile, T - t0)
        r0 = 0
        while r0 < b.n:
            nr = min(<Py_ssize_t>Q8_GROUP_ROWS, b.n - r0)
            rows16_tokens_dot_q8(<const void **>(b.w + r0), <int>nr, dt,
                                 xq + t0 * xq_row_bytes, xq_row_bytes, <int>nt, K,
                                 res + (r0 // DOT_ROWS) * (MF_Q8_TILE_TOKENS * DOT_ROWS),
                                 MF_Q8_TILE_TOKENS * DOT_ROWS)
            r0 += Q8_GROUP_ROWS
        store_tile(b, res, t0, nt, ld)
        t0 += nt


cdef void block_dot_each_token_f32(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x,        # [T, ldx] token rows, K values each
        Py_ssize_t ldx, Py_ssize_t T, Py_ssize_t ld) noexcept nogil:
    """block_dot_tokens_f32's results for each token alone (T = 1), bit for bit: the rows of a
    batched step's decode tokens, one a sequence.  Two tokens at a time through the 2-token 4-row
    dot where the level has one (each block's weights decoded once for both), else the 4-row dot
    a token; FP32 (no 4-row dot) through block_dot_tokens_f32 a token."""
    cdef mf_dot4_f32_fn dot4 = mf_dot4_f32_for(dt)
    cdef mf_dot4x2_f32_fn dot4x2 = mf_dot4x2_f32_for(dt)
    cdef RowBlock one
    cdef float res0[DOT_ROWS]
    cdef float res1[DOT_ROWS]
    cdef const char *rows[DOT_ROWS]
    cdef Py_ssize_t t, r0, r, nr
    if dot4 == NULL:
        for t in range(T):
            one = b[0]
            for r in range(b.n):
                one.out[r] = b.out[r] + t * ld
                one.add[r] = b.add[r] + t * ld if b.add[r] != NULL else NULL
            block_dot_tokens_f32(&one, dt, K, x + t * ldx, ldx, 1, ld)
        return
    r0 = 0
    while r0 < b.n:
        nr = min(<Py_ssize_t>DOT_ROWS, b.n - r0)
        for r in range(DOT_ROWS):          # missing rows: the last one again (discarded)
            rows[r] = b.w[r0 + min(r, nr - 1)]
        t = 0
        if dot4x2 != NULL:
            while t + 1 < T:
                dot4x2(<const void **>rows, x + t * ldx, x + (t + 1) * ldx, K, res0, res1)
                for r in range(nr):
                    store_results(b, r0 + r, res0 + r, 1, t, 1, ld)
                    store_results(b, r0 + r, res1 + r, 1, t + 1, 1, ld)
                t += 2
        while t < T:
            dot4(<const void **>rows, x + t * ldx, K, res0)
            for r in range(nr):
                store_results(b, r0 + r, res0 + r, 1, t, 1, ld)
            t += 1
        r0 += DOT_ROWS


cdef inline void block_dot_tokens(
        const RowBlock *b, int dt, Py_ssize_t K,
        const float *x, Py_ssize_t ldx,          # [T, ldx] float rows
        const char *xq, Py_ssize_t xq_row,       # [T, xq_row] the same rows quantized, or NULL
        Py_ssize_t T, Py_ssize_t ld, bint apart=False) noexcept nogil:
    """The int8 dots when the rows were quantized (xq given) and dt is a block format; float
    dots otherwise (apart: each token's bits as if it were alone, block_dot_each_token_f32)."""
    if xq != NULL and uses_q8_activations(dt):
        block_dot_tokens_q8(b, dt, K, xq, xq_row, T, ld)
    elif apart and T > 1:
        block_dot_each_token_f32(b, dt, K, x, ldx, T, ld)
    else:
        block_dot_tokens_f32(b, dt, K, x, ldx, T, ld)


cdef inline void zero_column(float *out, Py_ssize_t ld_out, Py_ssize_t T) noexcept nogil:
    cdef Py_ssize_t t
    for t in range(T):
        out[t * ld_out] = 0.0


cdef void linear_block(
        Py_ssize_t e0,         # first weight row of the block
        const char *w, Py_ssize_t w_row_bytes, int dt, Py_ssize_t K,
        const float *bias,     # [R] or NULL
        Py_ssize_t n_valid,    # rows >= n_valid (padding) are written as 0
        Py_ssize_t n_rows,     # R: rows of the weight
        const float *x, Py_ssize_t ldx,          # [T, ldx]
        const char *xq, Py_ssize_t xq_row,       # [T, xq_row] or NULL
        Py_ssize_t T,
        float *out,            # [T, ld]: column e receives row e's results
        const float *add,      # [T, ld] or NULL: added column by column (a residual)
        Py_ssize_t ld,
        bint apart=False) noexcept nogil:      # float rows: each token's bits as if alone
    """Columns e0 .. e0+63 of out = x @ w.T + bias (+ add): one block of rows, one thread's task."""
    cdef RowBlock rb
    cdef Py_ssize_t r, e
    rb.n = 0
    for r in range(GEMM_ROWS):
        e = e0 + r
        if e >= n_rows:
            break
        if e >= n_valid:
            zero_column(out + e, ld, T)
            continue
        rb.w[rb.n] = w + e * w_row_bytes
        rb.bias[rb.n] = bias[e] if bias != NULL else 0.0
        rb.add[rb.n] = add + e if add != NULL else NULL
        rb.out[rb.n] = out + e
        rb.n += 1
    if rb.n > 0:
        block_dot_tokens(&rb, dt, K, x, ldx, xq, xq_row, T, ld, apart)
