/*
 * cache_pool.c - the persistent worker threads of a cache's attention.
 *
 * A cache with n_threads > 1 starts n_threads - 1 workers when it is created
 * and joins them when it is freed, so no thread is created per call. An
 * attend publishes a batch of job indices that the caller and the workers
 * claim one at a time: a job runs on whichever thread claims it, and the
 * caller, which claims too, waits only for jobs claimed by workers, never
 * for a worker to wake. Workers never call the cache's allocator (the
 * attend reserves their scratch on the calling thread first). When a
 * worker cannot be started the cache runs with fewer.
 */
#include "cache_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* How long a worker polls for the next batch before it sleeps, and the
 * caller for the workers' end before it sleeps: a futex wake-up on a busy
 * VM takes 10-50 us, as long as a whole decode step of 1k tokens (two
 * threads were slower than one there). Decode calls its layers' attends
 * one after the other, and the caller's share often ends just before a
 * worker's; a worker that finds nothing within the bound sleeps, so an
 * idle cache costs no CPU. */
#define KVQ__POOL_SPIN_NS 50000

struct kvq__pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *th;
    size_t n; /* workers running */
    /* the current batch of jobs, claimed one at a time by compare-exchange:
     * generation << 32 | n_jobs << 16 | next job. A worker claims only in
     * the generation it woke for, so one that wakes late (after the batch
     * ended, or during a later one's publication) takes nothing stale; fn
     * and arg are read after a claim, which the caller's release store of
     * claim orders after their writes. */
    _Atomic uint64_t claim;
    _Atomic size_t finished; /* jobs of the current batch finished */
    size_t sleepers;         /* workers waiting on go (under mu) */
    _Atomic int quit;
    void (*fn)(void *arg, size_t job);
    void *arg;
};

#define KVQ__POOL_GEN(cl) ((uint32_t)((cl) >> 32))
#define KVQ__POOL_MAX_JOBS 0xffffu

static inline void kvq__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t kvq__now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Polls, for at most KVQ__POOL_SPIN_NS, until the generation of p->claim
 * differs from gen (caller 0) or p->finished reaches n (caller 1); returns
 * whether that happened. */
static int kvq__spin_until(kvq__pool *p, int caller, uint32_t gen, size_t n) {
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (caller ? atomic_load_explicit(&p->finished, memory_order_acquire) == n
                   : KVQ__POOL_GEN(atomic_load_explicit(&p->claim, memory_order_acquire)) != gen)
            return 1;
        if ((i & 63) == 0) {
            uint64_t t = kvq__now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > KVQ__POOL_SPIN_NS)
                return 0;
        }
        kvq__cpu_relax();
    }
}

/* Claims and runs jobs of generation gen until none is left; the thread
 * that finishes a worker-run batch's last job wakes a sleeping caller. */
static void kvq__pool_work(kvq__pool *p, uint32_t gen, int caller) {
    uint64_t cl = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        const size_t n_jobs = (size_t)(cl >> 16) & KVQ__POOL_MAX_JOBS;
        const size_t j = (size_t)cl & KVQ__POOL_MAX_JOBS;
        if (KVQ__POOL_GEN(cl) != gen || j >= n_jobs)
            return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &cl, cl + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* cl reloaded */
        p->fn(p->arg, j);
        if (atomic_fetch_add_explicit(&p->finished, 1, memory_order_acq_rel) + 1 == n_jobs &&
            !caller) {
            /* under mu, so that a caller about to wait sees the count or
             * gets the signal */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
        cl = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

static void *kvq__pool_worker(void *arg) {
    kvq__pool *p = (kvq__pool *)arg;
    uint32_t seen = 0;
    for (;;) {
        if (!kvq__spin_until(p, 0, seen, 0)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (!atomic_load(&p->quit) && KVQ__POOL_GEN(atomic_load(&p->claim)) == seen)
                pthread_cond_wait(&p->go, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit))
            break;
        seen = KVQ__POOL_GEN(atomic_load_explicit(&p->claim, memory_order_acquire));
        kvq__pool_work(p, seen, 0);
    }
    return NULL;
}

kvq_status kvq__pool_create(kvq__pool **out, const kvq_allocator *a, size_t n) {
    *out = NULL;
    if (n == 0)
        return KVQ_OK;
    kvq__pool *p = (kvq__pool *)kvq__calloc(a, sizeof *p);
    if (!p)
        return KVQ_ERR_NOMEM;
    p->th = (pthread_t *)kvq__calloc(a, n * sizeof *p->th);
    if (!p->th) {
        kvq__free(a, p);
        return KVQ_ERR_NOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (size_t i = 0; i < n; i++) {
        if (pthread_create(&p->th[i], NULL, kvq__pool_worker, p) != 0)
            break; /* fewer workers: the caller runs the rest */
        p->n++;
    }
    *out = p;
    return KVQ_OK;
}

void kvq__pool_free(kvq__pool *p, const kvq_allocator *a) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    atomic_fetch_add(&p->claim, (uint64_t)1 << 32); /* ends the workers' polling too */
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    kvq__free(a, p->th);
    kvq__free(a, p);
}

void kvq__pool_run(kvq__pool *p, void (*fn)(void *arg, size_t job), void *arg, size_t n_jobs) {
    if (!p || !p->n || n_jobs < 2 || n_jobs > KVQ__POOL_MAX_JOBS) {
        for (size_t j = 0; j < n_jobs; j++)
            fn(arg, j);
        return;
    }
    /* the batch: published by the claim word (release), after fn, arg and
     * the count; every job of the last batch finished before this call */
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    const uint32_t gen = KVQ__POOL_GEN(atomic_load_explicit(&p->claim, memory_order_relaxed)) + 1;
    atomic_store_explicit(&p->claim, (uint64_t)gen << 32 | (uint64_t)n_jobs << 16,
                          memory_order_release);
    if (p->sleepers)
        pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    /* the caller claims jobs too, and never waits for a worker to start:
     * a sleeping one wakes late on a busy VM (about 90 us measured here,
     * more than a 1k-token decode step), and then finds the jobs taken */
    kvq__pool_work(p, gen, 1);
    if (!kvq__spin_until(p, 1, 0, n_jobs)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->finished, memory_order_acquire) != n_jobs)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
