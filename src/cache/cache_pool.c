/*
 * cache_pool.c - the persistent worker threads of a cache's attention.
 *
 * A cache with n_threads > 1 starts n_threads - 1 workers when it is created
 * and joins them when it is freed; an attend hands each worker one job
 * index and runs job 0 itself, so no thread is created per call. Workers
 * never call the cache's allocator (the attend reserves their scratch on
 * the calling thread first). When a worker cannot be started the cache
 * runs with fewer: the jobs left over run on the calling thread.
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
    size_t n;              /* workers running */
    _Atomic uint64_t gen;  /* incremented (under mu) for every batch of jobs */
    _Atomic size_t busy;   /* workers not finished with the current batch */
    size_t sleepers;       /* workers waiting on go (under mu) */
    _Atomic int quit;
    size_t n_jobs; /* jobs of the current batch (job 0 runs on the caller) */
    void (*fn)(void *arg, size_t job);
    void *arg;
    struct kvq__pool_seat {
        struct kvq__pool *pool;
        size_t index; /* this worker runs job index + 1 */
    } *seats;
};

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

/* Polls, for at most KVQ__POOL_SPIN_NS, until *g differs from v (g given)
 * or *b is 0 (g NULL); returns whether that happened. */
static int kvq__spin_until(_Atomic uint64_t *g, uint64_t v, _Atomic size_t *b) {
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (g ? atomic_load_explicit(g, memory_order_acquire) != v
              : atomic_load_explicit(b, memory_order_acquire) == 0)
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

static void *kvq__pool_worker(void *arg) {
    struct kvq__pool_seat *seat = (struct kvq__pool_seat *)arg;
    kvq__pool *p = seat->pool;
    uint64_t seen = 0;
    for (;;) {
        if (!kvq__spin_until(&p->gen, seen, NULL)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (!atomic_load(&p->quit) && atomic_load(&p->gen) == seen)
                pthread_cond_wait(&p->go, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit))
            break;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        size_t job = seat->index + 1;
        if (job < p->n_jobs)
            p->fn(p->arg, job);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            /* the last one: wake the caller if it sleeps (under mu, so that
             * a caller about to wait sees busy == 0 or gets the signal) */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
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
    p->seats = (struct kvq__pool_seat *)kvq__calloc(a, n * sizeof *p->seats);
    if (!p->th || !p->seats) {
        kvq__free(a, p->th);
        kvq__free(a, p->seats);
        kvq__free(a, p);
        return KVQ_ERR_NOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (size_t i = 0; i < n; i++) {
        p->seats[i].pool = p;
        p->seats[i].index = i;
        if (pthread_create(&p->th[i], NULL, kvq__pool_worker, &p->seats[i]) != 0)
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
    atomic_fetch_add(&p->gen, 1); /* ends the workers' polling too */
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    kvq__free(a, p->th);
    kvq__free(a, p->seats);
    kvq__free(a, p);
}

void kvq__pool_run(kvq__pool *p, void (*fn)(void *arg, size_t job), void *arg, size_t n_jobs) {
    size_t workers = p ? KVQ__MIN(p->n, n_jobs > 0 ? n_jobs - 1 : 0) : 0;
    if (workers) {
        /* every worker takes part (those without a job only count down):
         * the batch is published by gen, after fn, arg and n_jobs */
        p->fn = fn;
        p->arg = arg;
        p->n_jobs = n_jobs;
        atomic_store_explicit(&p->busy, p->n, memory_order_relaxed);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        if (p->sleepers)
            pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0);
    for (size_t j = workers + 1; j < n_jobs; j++) /* jobs without a worker */
        fn(arg, j);
    if (workers && !kvq__spin_until(NULL, 0, &p->busy)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->busy, memory_order_acquire))
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
