/*
 * mf_model.h -- a whole decoder-only model as the native step sees it: pointers to every
 * weight, each in its own format, the KV caches, the RoPE tables, the layer features of its
 * architecture (megafuse/llm/arch.py: the optional slots below, NULL or 0 where an architecture
 * has no such feature); and the layout of the step's scratch.  Filled and validated once by the Python boundary
 * (megafuse/llm/_runner.pyx), run by the step kernel (megafuse/kernels/levels/model_step.pxi).
 *
 * Dimension letters: L = layers, E = embed dim, H / G = query / kv heads, D = head dim,
 * F = intermediate (FFN) dim (I in the layer kernels; here a field, and I is a macro of
 * <complex.h>), V = vocabulary, C = cache capacity (positions), T = tokens of a step (at
 * most MF_STEP_TOKENS; longer inputs run as several steps).  No padding: every row stride is
 * its dimension (Ea = E, Da = D, Ia = F).
 */
#ifndef MEGAFUSE_MF_MODEL_H
#define MEGAFUSE_MF_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "megafuse/mf_scratch.h"
#include "megafuse/mf_team.h"

#define MF_STEP_TOKENS MF_MLP_TOKEN_TILE   /* tokens a step runs at once (the MLP's token tile) */
#define MF_STEP_SPLIT_FLOATS 16384         /* split-KV parts of one-token attention */

/* The gate's activation in the MLP (mf_model.activation). */
#define MF_ACT_SILU 0                      /* silu(g) * u: Llama, Qwen, Phi-3 */
#define MF_ACT_GELU_TANH 1                 /* gelu_tanh(g) * u: Gemma */

typedef struct {
    const float *ln1_gamma;          /* [E] */
    const float *ln2_gamma;          /* [E] */
    const void *wq, *wk, *wv;        /* [H*D, E], [G*D, E], [G*D, E] in wq_dt, wk_dt, wv_dt */
    const void *wo;                  /* [E, H*D] */
    const void *w1;                  /* [2*F, E]: the gate rows, then the up rows */
    const void *w2;                  /* [E, F] */
    const float *bq, *bk, *bv;       /* [H*D], [G*D], [G*D] or NULL */
    const float *bo, *b1, *b2;       /* [E], [2*F], [E] or NULL */
    int wq_dt, wk_dt, wv_dt, wo_dt, w1_dt, w2_dt;
    void *k_cache, *v_cache;         /* [G, cache_rows, D] float32, or float16 (mf_model.kv_f16):
                                        position p of kv head g is row [g, p % cache_rows] */
    int cache_rows;                  /* C, or (a sliding-window layer) a ring of fewer rows,
                                        at least window + MF_STEP_TOKENS */
    int window;                      /* > 0: a token at p attends to keys p - window < k <= p */
    const float *rope_cos, *rope_sin;   /* [C, D/2], or NULL (no rotation): this layer's tables */
    const float *q_norm, *k_norm;    /* [D] or NULL: RMSNorm of each query / key head before RoPE */
    const float *post_attn_norm;     /* [E] or NULL: RMSNorm of the attention block's output
                                        before it is added to the residual stream */
    const float *post_ffn_norm;      /* [E] or NULL: the same for the MLP's output */
} mf_model_layer;

typedef struct {
    int n_layers, E, H, G, D, F, V, C;
    float eps;
    int int8;                        /* 1: activations quantized (Q8_0 / Q8_K) for block-format
                                        weights, as llama.cpp does; 0: float32 throughout */
    int kv_f16;                      /* 1: the KV caches hold float16 values (k and v are
                                        rounded to float16 as they are written; D <= 256) */
    int q_tile, kv_tile;             /* attention tiles (mega_fuse_get_optimal_tiles) */
    const mf_model_layer *layers;    /* [L] */
    const void *embedding;           /* [V, E] in embedding_dt, or NULL (hidden states in) */
    int embedding_dt;
    const float *out_norm;           /* [E], or NULL (no head: hidden states out) */
    const void *head;                /* [V, E] in head_dt, or NULL */
    int head_dt;
    float embed_scale;               /* the embedding rows are multiplied by it (1: as they are) */
    float attn_scale;                /* the scores' scale (1/sqrt(D) unless the model says) */
    float attn_softcap;              /* > 0: scores capped, softcap * tanh(s / softcap) */
    float final_softcap;             /* > 0: the logits capped the same way */
    int activation;                  /* MF_ACT_SILU or MF_ACT_GELU_TANH */
} mf_model;

/* How one token's attention over keys first_key .. P is cut into tasks (one plan a kind of
 * layer: full attention, sliding window), by one_token_plan (levels/attention.pxi). */
typedef struct {
    int kind;
    ptrdiff_t first_key, tasks, n_chunks, n_seg, seg_len, max_seg;
} mf_one_token_plan;

/*
 * Scratch of a step, for at most MF_STEP_TOKENS tokens (every region 64-byte aligned):
 *   x      [T, E]  float32       the residual stream
 *   xn     [T, E]  float32       a normalised copy of it (attention, MLP, final norm)
 *   xq     [T, xq_row]           xn quantized for the 32-weight formats   (int8 mode)
 *   xqk    [T, xqk_row]          xn quantized for the K-quants            (int8 mode)
 *   q      [T, H*D] float32      queries (roped)
 *   attn   [T, H*D] float32      attention output, token-major
 *   attnq  [T, attnq_row]        attn quantized for wo                    (int8 mode)
 *   act    [T, F]  float32       silu(gate) * up
 *   actq   [T, actq_row]         act quantized for w2                     (int8 mode)
 *   parts  [S, MF_STEP_SPLIT_FLOATS] float32   split-KV partial sums of one-token attention, for
 *                                each of the S sequences a step may hold (max_segments)
 *   kv     [2G, T, D] float32    each kv head's k and v rows before they go to the cache, for
 *                                float16 caches and ring caches (kv_floats = 2G * D; else 0)
 *   y      [T, E]  float32       a projection's output before its sandwich norm (y_floats =
 *                                E where a layer has post norms; else 0)
 * The quantized row sizes are the activation rows of the model's formats (the caller takes the
 * largest, mf_activation_row_bytes); 0 where nothing is quantized.
 */
typedef struct {
    size_t x, xn, xq, xqk, q, attn, attnq, act, actq, parts, kv, y;
    size_t xq_row, xqk_row, attnq_row, actq_row;
    size_t total;
} mf_step_scratch;

static inline mf_step_scratch mf_step_scratch_layout(size_t E, size_t HD, size_t F,
                                                     size_t xq_row, size_t xqk_row,
                                                     size_t attnq_row, size_t actq_row,
                                                     size_t kv_floats, size_t y_floats,
                                                     size_t max_segments)
{
    mf_step_scratch s;
    size_t T = MF_STEP_TOKENS, at = 0;
    s.xq_row = xq_row;
    s.xqk_row = xqk_row;
    s.attnq_row = attnq_row;
    s.actq_row = actq_row;
    s.x = at;      at = mf_round_up_64(at + T * E * sizeof(float));
    s.xn = at;     at = mf_round_up_64(at + T * E * sizeof(float));
    s.xq = at;     at = mf_round_up_64(at + T * xq_row);
    s.xqk = at;    at = mf_round_up_64(at + T * xqk_row);
    s.q = at;      at = mf_round_up_64(at + T * HD * sizeof(float));
    s.attn = at;   at = mf_round_up_64(at + T * HD * sizeof(float));
    s.attnq = at;  at = mf_round_up_64(at + T * attnq_row);
    s.act = at;    at = mf_round_up_64(at + T * F * sizeof(float));
    s.actq = at;   at = mf_round_up_64(at + T * actq_row);
    s.parts = at;  at = mf_round_up_64(at + max_segments * MF_STEP_SPLIT_FLOATS * sizeof(float));
    s.kv = at;     at = mf_round_up_64(at + T * kv_floats * sizeof(float));
    s.y = at;      at = mf_round_up_64(at + T * y_floats * sizeof(float));
    s.total = at;
    return s;
}

/*
 * A step in flight (kernels/levels/model_step.pxi): the model, its scratch, and the phases of the step
 * being run.  Owned by the boundary (one per model, allocated once), filled by the step kernel;
 * it is the context every thread of the team reads.
 */
/* A lane: a contiguous run of a phase's chunks, handed out in order. */
#define MF_STEP_LANES 8              /* lanes a phase is cut into at most (one per thread) */
typedef struct {
    volatile uint32_t next;          /* the next chunk to hand out; runs past `end` when taken */
    uint32_t start, end;             /* chunks start .. end-1 */
    char pad[64 - 3 * sizeof(uint32_t)];   /* one cache line a lane: no false sharing */
} mf_lane;

typedef struct {
    int kind;                        /* what the chunks of this phase do (levels/model_step.pxi) */
    int layer;                       /* the layer it belongs to, or -1 */
    uint32_t base;                   /* global number of its first chunk */
    uint32_t n;                      /* its chunks */
    int n_lanes;                     /* min(threads, MF_STEP_LANES, n) */
    mf_lane lanes[MF_STEP_LANES];
} mf_phase;

/*
 * Which chunk a thread runs.  The team hands out tickets in order (one per chunk, mf_team.h);
 * a ticket of phase p entitles its holder to one chunk of p, but not to a particular one: the
 * holder takes the next chunk of its own lane (thread t: lane t % n_lanes), and once that lane is
 * exhausted, the next chunk of the first other lane that has one.  There are as many tickets as
 * chunks, so a holder always finds one.  A thread thus reads a contiguous run of weight rows
 * (whose next rows the dots' prefetch reaches in time) instead of every n_threads-th chunk,
 * while a thread that is descheduled still leaves its lane to the others.
 */
static inline void mf_phase_cut_lanes(mf_phase *ph, int n_threads)
{
    int nl = n_threads < MF_STEP_LANES ? n_threads : MF_STEP_LANES;
    if ((uint32_t)nl > ph->n)
        nl = (int)ph->n;
    if (nl < 1)
        nl = 1;
    ph->n_lanes = nl;
    for (int i = 0; i < nl; i++) {
        ph->lanes[i].start = (uint32_t)((uint64_t)ph->n * (uint64_t)i / (uint64_t)nl);
        ph->lanes[i].end = (uint32_t)((uint64_t)ph->n * (uint64_t)(i + 1) / (uint64_t)nl);
        ph->lanes[i].next = ph->lanes[i].start;
    }
}

/* The chunk (0 .. n-1) a ticket of phase ph gives the thread preferring `lane`. */
static inline uint32_t mf_phase_take(mf_phase *ph, int lane)
{
    for (int i = 0; i < ph->n_lanes; i++) {
        mf_lane *l = &ph->lanes[(lane + i) % ph->n_lanes];
        if (mf_atomic_load32(&l->next) >= l->end)
            continue;
        const uint32_t c = mf_atomic_add32(&l->next, 1) - 1;
        if (c < l->end)
            return c;
    }
    return 0;      /* not reached: a ticket holder always finds a chunk */
}

#define MF_STEP_PHASES_PER_LAYER 12  /* at most, per layer; plus 3 for the model (load, head) */

static inline size_t mf_step_max_phases(size_t n_layers)
{
    return n_layers * MF_STEP_PHASES_PER_LAYER + 3;
}

/*
 * One sequence's part of a step.  A step runs the rows of one or several sequences together
 * (a batch: the weights are read once for all of them); each sequence's rows are t0 .. t0+n-1
 * of the step, at positions pos .. pos+n-1 of its own KV caches, and every row is computed by
 * the operations it would get in a step of that sequence alone (contract §7).
 */
#define MF_STEP_MAX_SEGMENTS 64      /* sequences a step runs at most */
typedef struct {
    int t0, n, pos;
    void *const *k_cache;            /* [L] this sequence's K caches, or NULL: the layers' */
    void *const *v_cache;            /* [L] likewise */
    float *logits;                   /* [n, V] (all_logits) or [V] (the last row's), or NULL */
    int all_logits;
    float *x_out;                    /* [n, E]: the last layer's output rows, or NULL */
    mf_one_token_plan att[2];        /* n == 1: how its attention is cut (full, windowed) */
    uint32_t att_chunks[2];          /* chunks of its attention phase (full, windowed layers) */
    int r0;                          /* its first row among the step's logit rows */
} mf_segment;

typedef struct {
    const mf_model *m;
    char *scratch;                   /* mf_step_scratch_layout(...).total bytes, 64-aligned */
    mf_step_scratch layout;
    mf_phase *phases;                /* [mf_step_max_phases(L)] */
    int n_phases;
    int n_threads;                   /* of the team running the step (its lanes) */
    /* the step being run: T rows, of the sequences in segs */
    const int32_t *tokens;           /* [T] token ids, or NULL (then x_in) */
    const float *x_in;               /* [T, E], or NULL */
    float *hidden;                   /* every layer's output (a step of one sequence): layer l's
                                        rows start at hidden + l * hidden_layer_stride; or NULL */
    size_t hidden_layer_stride;
    int T;                           /* rows of the step, of every segment */
    int R;                           /* rows that want logits, of every segment */
    mf_segment *segs;                /* [MF_STEP_MAX_SEGMENTS]: the sequences of the step */
    int n_segs;
    int row_seg[MF_STEP_TOKENS];     /* row t: its segment */
    int row_pos[MF_STEP_TOKENS];     /* row t: its position */
    int logit_row[MF_STEP_TOKENS];   /* logit row r: the step's row it normalises */
    /* a step whose weight bytes times tokens are fewer runs on the calling thread alone (its
     * chunks in order, no team): MF_STEP_SOLO_BYTES by default, 0 never */
    size_t solo_bytes;
} mf_step;

/* Below this much work (weight bytes read x tokens), a second thread costs more than it saves:
 * waking it, and waiting for a chunk it holds while the host deschedules it.  A layer of E = 64
 * (bench_overhead.py, ~150 KB of FP32 weights) decodes faster on one thread than on two;
 * SmolLM2-135M (97 MB a step) uses the team. */
#define MF_STEP_SOLO_BYTES ((size_t)256 << 10)

#endif /* MEGAFUSE_MF_MODEL_H */
