# The parallel work of the header functions' kernels as one job of the thread team
# (include/megafuse/mf_team.h): the team the whole-model step runs on, not an OpenMP region a phase.
#
# A kernel lists its phases in a Job, in the order they must run, then runs the Job once.  Phase p
# is `count` independent iterations fn(ctx, arg, i), i = 0 .. count-1, cut into chunks of `per`
# iterations; its chunks are the job's chunks base_p .. base_p + n_p - 1.  A thread that claims a
# chunk of phase p waits until every chunk before base_p is done (mf_team_wait_done), so phase p
# reads everything the phases before it wrote.  Chunks are claimed in order, one at a time, by any
# thread; an iteration computes the same outputs with the same operations whichever thread runs
# it, so results do not depend on the thread count.  A phase of one iteration is a serial step.
#
# ctx holds what every phase of the kernel reads (its arguments, its scratch pointers); arg is the
# phase's own value (a token tile's first token, say), so a kernel can list the same phase for
# several tiles.  A Job holds up to JOB_MAX_PHASES phases; a kernel with more (many token tiles)
# runs its Job when it is full and starts the next (job_add does it): the phases still run in
# order.  With no team (the shared one is busy, or the C API's call), the same job runs on
# num_threads threads of no team (mf_team_run_detached).

ctypedef void (*job_chunk_fn)(const void *ctx, Py_ssize_t arg, Py_ssize_t i) noexcept nogil

cdef enum:
    JOB_MAX_PHASES = 32
    JOB_CHUNKS_A_THREAD = 4       # chunks of a phase of small iterations, a thread


cdef struct JobPhase:
    job_chunk_fn fn
    const void *ctx
    Py_ssize_t arg
    Py_ssize_t count              # iterations
    Py_ssize_t per                # iterations a chunk (the last chunk may have fewer)
    uint32_t base                 # the phase's first chunk in the job
    uint32_t n                    # its chunks


cdef struct Job:
    JobPhase phases[JOB_MAX_PHASES]
    int n_phases
    uint32_t total                # chunks of every phase
    mf_team *team                 # or NULL: run detached on num_threads threads
    int num_threads


cdef inline void job_init(Job *j, mf_team *team, int num_threads) noexcept nogil:
    j.n_phases = 0
    j.total = 0
    j.team = team
    j.num_threads = num_threads if num_threads > 0 else 1


cdef void job_thread(void *ctx, mf_team *team, int thread_id, uint32_t gen) noexcept nogil:
    """What every thread of the team runs: claim a chunk, wait for the phases before it, run it.
    ctx (the Job) is read only after a claim succeeded (mf_team.h's rule)."""
    cdef const Job *j
    cdef const JobPhase *ph
    cdef int64_t c
    cdef int p
    cdef Py_ssize_t i, i0, i1
    while True:
        c = mf_team_claim_gen(team, gen)
        if c < 0:
            return
        j = <const Job *>ctx
        p = 0
        while p + 1 < j.n_phases and <uint32_t>c >= j.phases[p + 1].base:
            p += 1
        ph = &j.phases[p]
        mf_team_wait_done(team, ph.base)
        i0 = (<Py_ssize_t>(<uint32_t>c - ph.base)) * ph.per
        i1 = min(i0 + ph.per, ph.count)
        for i in range(i0, i1):
            ph.fn(ph.ctx, ph.arg, i)
        mf_team_chunk_done(team)


cdef void job_run(Job *j) noexcept nogil:
    """Run the listed phases (on the team, else detached) and empty the list."""
    if j.total > 0:
        if j.n_phases == 1 and j.phases[0].count == 1:     # one serial step: no thread wakes
            j.phases[0].fn(j.phases[0].ctx, j.phases[0].arg, 0)
        elif j.team != NULL:
            mf_team_run(j.team, j.total, job_thread, j)
        else:
            mf_team_run_detached(j.num_threads, j.total, job_thread, j)
    j.n_phases = 0
    j.total = 0


cdef void job_add(Job *j, job_chunk_fn fn, const void *ctx, Py_ssize_t arg, Py_ssize_t count,
                  Py_ssize_t per) noexcept nogil:
    """Phase fn(ctx, arg, i) for i in 0 .. count-1, `per` iterations a chunk (0: a few chunks a
    thread, for many small iterations).  A full Job runs first."""
    cdef JobPhase *ph
    if count <= 0:
        return
    if per <= 0:
        per = max(<Py_ssize_t>1, count // (JOB_CHUNKS_A_THREAD * j.num_threads))
    if j.n_phases == JOB_MAX_PHASES:
        job_run(j)
    ph = &j.phases[j.n_phases]
    ph.fn, ph.ctx, ph.arg, ph.count, ph.per = fn, ctx, arg, count, per
    ph.base = j.total
    ph.n = <uint32_t>((count + per - 1) // per)
    j.total += ph.n
    j.n_phases += 1
