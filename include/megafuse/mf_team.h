/*
 * mf_team.h -- a team of threads that runs one job at a time, scheduled chunk by chunk through
 * two shared counters; what the whole-model step (megafuse/kernels/levels/model_step.pxi) runs on.
 *
 * Why not an OpenMP region per phase: a decode step of a small model has ~10 phases a layer (a
 * few microseconds each), and an OpenMP barrier waits for every thread of the team to *arrive*.
 * When another process holds a core, a descheduled thread arrives milliseconds late at every
 * barrier, and the step pays that delay once a phase.  Here nothing ever waits for a thread, only
 * for work:
 *
 *   job     = a sequence of phases; phase p has n_p chunks, numbered globally
 *             base_p .. base_p + n_p - 1 (base_0 = 0; the total is the step's chunk count).
 *   claim   = a 64-bit counter (generation << 32 | next chunk).  A thread takes the next chunk
 *             with a compare-and-swap that also checks the job generation, so a thread that
 *             slept through a whole job can never take a chunk of the next one.
 *   done    = chunks finished in this job.  Phases finish in order, so "phase p may start" is
 *             exactly "done >= base_p": a thread that claimed a chunk of phase p waits for that,
 *             runs the chunk, and adds one to done.
 *
 * A thread that is descheduled while holding no chunk delays nobody: the others take all the
 * chunks.  One that is descheduled while holding a chunk delays the others by that chunk only.
 * Waiting is bounded spinning (MF_TEAM_SPIN_NS), then sleeping on the counter (a futex on Linux,
 * a condition variable elsewhere): the sleeper's core goes idle, and the scheduler can move the
 * thread being waited for onto it.  The caller of mf_team_run is thread 0 and returns as soon as
 * every chunk is done (it never waits for the other threads to notice).
 *
 * Which thread runs a chunk never changes a result: a chunk always computes the same outputs
 * with the same operations.  Results are the same for any number of threads.
 *
 * Backends: POSIX threads (Linux futex, or a mutex + condition variable elsewhere).  Where there
 * are no POSIX threads (Windows), a job runs inside one OpenMP parallel region with the same
 * counters (or on the calling thread alone, without OpenMP).  A team made before fork() is
 * remade in the child (the threads do not survive a fork).
 *
 * Usage (all calls from one thread at a time; the job function runs on every thread, and must
 * read nothing of ctx before its first successful claim: a thread that slept through a job may
 * call it with the next job's ctx, and its claims then fail):
 *   mf_team *t = mf_team_create(n_threads);           NULL if out of memory
 *   mf_team_run(t, total_chunks, fn, ctx);            fn(ctx, t, id, gen) on every thread:
 *       for (;;) { int64_t c = mf_team_claim_gen(t, gen); if (c < 0) break;
 *                  mf_team_wait_done(t, base of c's phase); ... run chunk c ...;
 *                  mf_team_chunk_done(t); }
 *   mf_team_destroy(t);
 */
#ifndef MEGAFUSE_MF_TEAM_H
#define MEGAFUSE_MF_TEAM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(_OPENMP)
#  include <omp.h>
#endif
#if defined(_WIN32)
#  define MF_TEAM_OPENMP 1
#  include <windows.h>
#else
#  define MF_TEAM_PTHREADS 1
#  include <pthread.h>
#  include <sched.h>
#  include <unistd.h>
#  if defined(__linux__)
#    define MF_TEAM_FUTEX 1
#    include <linux/futex.h>
#    include <sys/syscall.h>
#    include <limits.h>
#  endif
#endif
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#  include <immintrin.h>
#  define MF_TEAM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#  define MF_TEAM_PAUSE() __asm__ __volatile__("yield")
#else
#  define MF_TEAM_PAUSE() ((void)0)
#endif

#define MF_TEAM_MAX_THREADS 256           /* threads a team has at most */
#define MF_TEAM_SPIN_NS 50000             /* spin this long on a counter before sleeping */
#define MF_TEAM_IDLE_SPIN_NS 200000       /* an idle thread spins this long for the next job */
#define MF_TEAM_STACK_BYTES (8u << 20)    /* stack of each thread (kernels keep tiles there) */

/* ---- atomics (GCC / Clang builtins; MSVC Interlocked) ------------------------------------- */
#if defined(_MSC_VER) && !defined(__clang__)
static inline uint32_t mf_atomic_load32(volatile uint32_t *p)
{ return (uint32_t)InterlockedCompareExchange((volatile LONG *)p, 0, 0); }
static inline void mf_atomic_store32(volatile uint32_t *p, uint32_t v)
{ InterlockedExchange((volatile LONG *)p, (LONG)v); }
static inline uint32_t mf_atomic_add32(volatile uint32_t *p, uint32_t v)   /* returns the new */
{ return (uint32_t)InterlockedAdd((volatile LONG *)p, (LONG)v); }
static inline uint64_t mf_atomic_load64(volatile uint64_t *p)
{ return (uint64_t)InterlockedCompareExchange64((volatile LONG64 *)p, 0, 0); }
static inline void mf_atomic_store64(volatile uint64_t *p, uint64_t v)
{ InterlockedExchange64((volatile LONG64 *)p, (LONG64)v); }
static inline int mf_atomic_cas64(volatile uint64_t *p, uint64_t expected, uint64_t desired)
{ return (uint64_t)InterlockedCompareExchange64((volatile LONG64 *)p, (LONG64)desired,
                                                (LONG64)expected) == expected; }
#else
static inline uint32_t mf_atomic_load32(volatile uint32_t *p)
{ return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void mf_atomic_store32(volatile uint32_t *p, uint32_t v)
{ __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline uint32_t mf_atomic_add32(volatile uint32_t *p, uint32_t v)
{ return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t mf_atomic_load64(volatile uint64_t *p)
{ return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void mf_atomic_store64(volatile uint64_t *p, uint64_t v)
{ __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline int mf_atomic_cas64(volatile uint64_t *p, uint64_t expected, uint64_t desired)
{ return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST); }
#endif

typedef struct mf_team mf_team;
/* The job function: runs on every thread; `gen` is the job's generation (claim with it). */
typedef void (*mf_team_fn)(void *ctx, mf_team *team, int thread_id, uint32_t gen);

struct mf_team {
    int n_threads;                    /* including the caller of mf_team_run (thread 0) */
    /* the current job (written by thread 0 before it publishes the generation) */
    mf_team_fn fn;
    void *ctx;
    uint32_t total;                   /* chunks of the job */
    volatile uint64_t claim;          /* generation << 32 | next chunk */
    volatile uint32_t done;           /* chunks finished (futex word of mf_team_wait_done) */
    volatile uint32_t gen;            /* job generation (futex word of idle threads) */
    volatile uint32_t stop;           /* 1: threads exit */
    volatile uint32_t sleepers;       /* threads asleep (or about to sleep) on done or gen */
#if defined(MF_TEAM_PTHREADS)
    pthread_t threads[MF_TEAM_MAX_THREADS];
    int n_started;                    /* threads 1 .. n_started were created */
    pid_t owner;                      /* process that created the threads */
#  if !defined(MF_TEAM_FUTEX)
    pthread_mutex_t lock;             /* the sleeping of the condition-variable backend */
    pthread_cond_t wake;
#  endif
#endif
};

typedef struct {
    mf_team *team;
    int id;
    uint32_t gen;                     /* the generation before the thread's first job */
} mf_team_start_arg;

static inline int64_t mf_team_now_ns(void)
{
#if defined(_WIN32)
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (int64_t)((double)c.QuadPart * 1e9 / (double)f.QuadPart);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#endif
}

/* ---- sleeping on a 32-bit word --------------------------------------------------------------- */

/* Sleep while *word == seen (may return spuriously; the caller re-checks). */
static inline void mf_team_sleep(mf_team *t, volatile uint32_t *word, uint32_t seen)
{
#if defined(MF_TEAM_FUTEX)
    (void)t;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#elif defined(MF_TEAM_PTHREADS)
    pthread_mutex_lock(&t->lock);
    if (mf_atomic_load32(word) == seen)
        pthread_cond_wait(&t->wake, &t->lock);
    pthread_mutex_unlock(&t->lock);
#else
    (void)t; (void)word; (void)seen;
#  if defined(_WIN32)
    SwitchToThread();
#  endif
#endif
}

/* Wake every thread asleep on `word` (called after changing it, if t->sleepers > 0). */
static inline void mf_team_wake(mf_team *t, volatile uint32_t *word)
{
#if defined(MF_TEAM_FUTEX)
    (void)t;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#elif defined(MF_TEAM_PTHREADS)
    (void)word;
    pthread_mutex_lock(&t->lock);
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
#else
    (void)t; (void)word;
#endif
}

/* Wait until *word != seen: spin for spin_ns, then sleep.  Returns the new value. */
static inline uint32_t mf_team_wait_change(mf_team *t, volatile uint32_t *word, uint32_t seen,
                                           int64_t spin_ns)
{
    uint32_t v = mf_atomic_load32(word);
    int64_t t0 = 0;
    int i = 0;
    while (v == seen) {
        MF_TEAM_PAUSE();
        if (++i % 64 == 0) {
            int64_t now = mf_team_now_ns();
            if (t0 == 0)
                t0 = now;
            else if (now - t0 > spin_ns) {
                /* announce the sleep, then re-check: the changer adds to the word before it
                   reads sleepers (both sequentially consistent), so no wake-up is lost */
                mf_atomic_add32(&t->sleepers, 1);
                if (mf_atomic_load32(word) == seen)
                    mf_team_sleep(t, word, seen);
                mf_atomic_add32(&t->sleepers, (uint32_t)-1);
            }
        }
        v = mf_atomic_load32(word);
    }
    return v;
}

/* ---- what a job function calls ---------------------------------------------------------------- */

/* The next chunk of the current job for a thread that entered it at generation `gen`, or -1 when
   the job has no chunk left (or is over). */
static inline int64_t mf_team_claim_gen(mf_team *t, uint32_t gen)
{
    for (;;) {
        uint64_t c = mf_atomic_load64(&t->claim);
        if ((uint32_t)(c >> 32) != gen || (uint32_t)c >= t->total)
            return -1;
        if (mf_atomic_cas64(&t->claim, c, c + 1))
            return (int64_t)(uint32_t)c;
    }
}

/* Wait until `target` chunks of the job are done (the phases before the one about to run). */
static inline void mf_team_wait_done(mf_team *t, uint32_t target)
{
    uint32_t d = mf_atomic_load32(&t->done);
    while (d < target)
        d = mf_team_wait_change(t, &t->done, d, MF_TEAM_SPIN_NS);
}

/* Count one chunk as finished. */
static inline void mf_team_chunk_done(mf_team *t)
{
    mf_atomic_add32(&t->done, 1);
    if (mf_atomic_load32(&t->sleepers))
        mf_team_wake(t, &t->done);
}

/* ---- threads ---------------------------------------------------------------------------------- */

#if defined(MF_TEAM_PTHREADS)
static void *mf_team_thread_main(void *arg)
{
    mf_team_start_arg a = *(mf_team_start_arg *)arg;
    mf_team *t = a.team;
    uint32_t seen = a.gen;            /* (not read here: the thread may start jobs later) */
    free(arg);
    for (;;) {
        seen = mf_team_wait_change(t, &t->gen, seen, MF_TEAM_IDLE_SPIN_NS);
        if (mf_atomic_load32(&t->stop))
            return NULL;
        t->fn(t->ctx, t, a.id, seen);
    }
}

static inline void mf_team_stop_threads(mf_team *t)
{
    if (t->n_started == 0)
        return;
    if (t->owner == getpid()) {
        mf_atomic_store32(&t->stop, 1);
        mf_atomic_add32(&t->gen, 1);
        mf_team_wake(t, &t->gen);
        for (int i = 1; i <= t->n_started; i++)
            pthread_join(t->threads[i], NULL);
    }
    /* in a forked child the threads do not exist: forget them */
    t->n_started = 0;
    t->stop = 0;
}

/* Start threads 1 .. n_threads-1 (again, in a forked child).  Fewer start if the OS refuses
   some: the team then simply has fewer threads (the job is the same). */
static inline void mf_team_start_threads(mf_team *t)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, MF_TEAM_STACK_BYTES);
    t->owner = getpid();
    for (int i = 1; i < t->n_threads; i++) {
        mf_team_start_arg *a = (mf_team_start_arg *)malloc(sizeof *a);
        if (a == NULL)
            break;
        a->team = t;
        a->id = i;
        a->gen = mf_atomic_load32(&t->gen);
        if (pthread_create(&t->threads[i], &attr, mf_team_thread_main, a) != 0) {
            free(a);
            break;
        }
        t->n_started = i;
    }
    pthread_attr_destroy(&attr);
}
#endif

/* A team of n_threads threads (1 .. MF_TEAM_MAX_THREADS), or NULL if out of memory. */
static inline mf_team *mf_team_create(int n_threads)
{
    mf_team *t = (mf_team *)calloc(1, sizeof(mf_team));
    if (t == NULL)
        return NULL;
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > MF_TEAM_MAX_THREADS)
        n_threads = MF_TEAM_MAX_THREADS;
    t->n_threads = n_threads;
#if defined(MF_TEAM_PTHREADS) && !defined(MF_TEAM_FUTEX)
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->wake, NULL);
#endif
    return t;
}

static inline void mf_team_destroy(mf_team *t)
{
    if (t == NULL)
        return;
#if defined(MF_TEAM_PTHREADS)
    mf_team_stop_threads(t);
#  if !defined(MF_TEAM_FUTEX)
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->wake);
#  endif
#endif
    free(t);
}

/* Run a job of `total` chunks: fn(ctx, t, id, gen) on every thread of the team (this one is id 0).
   Returns when all chunks are done.  One job at a time per team. */
static inline void mf_team_run(mf_team *t, uint32_t total, mf_team_fn fn, void *ctx)
{
    uint32_t gen = t->gen + 1;
    if (gen == 0)
        gen = 1;
    t->fn = fn;
    t->ctx = ctx;
    t->total = total;
    mf_atomic_store32(&t->done, 0);
    mf_atomic_store64(&t->claim, (uint64_t)gen << 32);
#if defined(MF_TEAM_PTHREADS)
    if (t->n_threads > 1 && (t->n_started == 0 || t->owner != getpid())) {
        mf_team_stop_threads(t);
        mf_team_start_threads(t);
    }
    mf_atomic_store32(&t->gen, gen);              /* publish the job */
    if (mf_atomic_load32(&t->sleepers))
        mf_team_wake(t, &t->gen);
    fn(ctx, t, 0, gen);
    mf_team_wait_done(t, total);
#elif defined(MF_TEAM_OPENMP) && defined(_OPENMP)
    mf_atomic_store32(&t->gen, gen);
    #pragma omp parallel num_threads(t->n_threads)
    fn(ctx, t, omp_get_thread_num(), gen);
#else
    mf_atomic_store32(&t->gen, gen);
    fn(ctx, t, 0, gen);
#endif
}

/* ---- a job without a team ---------------------------------------------------------------------- */

/* Run a job of `total` chunks as mf_team_run would, on n_threads threads that belong to no team:
   inside one OpenMP parallel region with the same counters (each thread runs fn until its claims
   fail; the region ends when every chunk is done), or on the calling thread alone without
   OpenMP.  For a call that finds the shared team busy (mf_team_slot_acquire). */
static inline void mf_team_run_detached(int n_threads, uint32_t total, mf_team_fn fn, void *ctx)
{
    mf_team t;
    memset(&t, 0, sizeof t);
    t.n_threads = n_threads < 1 ? 1 : n_threads;
    t.fn = fn;
    t.ctx = ctx;
    t.total = total;
    t.gen = 1;
    t.claim = (uint64_t)1 << 32;
#if defined(MF_TEAM_PTHREADS) && !defined(MF_TEAM_FUTEX)
    pthread_mutex_init(&t.lock, NULL);
    pthread_cond_init(&t.wake, NULL);
#endif
#if defined(_OPENMP)
    if (t.n_threads > 1) {
        #pragma omp parallel num_threads(t.n_threads)
        fn(ctx, &t, omp_get_thread_num(), 1);
    } else
#endif
    fn(ctx, &t, 0, 1);
    mf_team_wait_done(&t, total);
#if defined(MF_TEAM_PTHREADS) && !defined(MF_TEAM_FUTEX)
    pthread_mutex_destroy(&t.lock);
    pthread_cond_destroy(&t.wake);
#endif
}

/* ---- one team shared by every caller of a process ------------------------------------------------ */

/* The team the whole-model step and the header functions share (megafuse/_kernels.pyx owns one),
   so that consecutive calls of either find the same threads awake.  One caller at a time holds
   it: acquire takes it (remade with n_threads threads if it has another count) or returns NULL
   when another caller holds it or memory runs out; release gives it back.  Neither needs the
   GIL. */
typedef struct {
    mf_team *team;
    volatile uint64_t busy;           /* 1 while a caller holds the team */
} mf_team_slot;

static inline mf_team *mf_team_slot_acquire(mf_team_slot *s, int n_threads)
{
    int want = n_threads < 1 ? 1 : (n_threads > MF_TEAM_MAX_THREADS ? MF_TEAM_MAX_THREADS
                                                                      : n_threads);
    if (!mf_atomic_cas64(&s->busy, 0, 1))
        return NULL;
    if (s->team == NULL || s->team->n_threads != want) {
        mf_team_destroy(s->team);
        s->team = mf_team_create(want);
        if (s->team == NULL) {
            mf_atomic_store64(&s->busy, 0);
            return NULL;
        }
    }
    return s->team;
}

static inline void mf_team_slot_release(mf_team_slot *s)
{
    mf_atomic_store64(&s->busy, 0);
}

#endif /* MEGAFUSE_MF_TEAM_H */
