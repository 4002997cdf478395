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

struct kvq__pool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    pthread_t *th;
    size_t n;      /* workers running */
    uint64_t gen;  /* incremented for every batch of jobs */
    size_t busy;   /* workers not finished with the current batch */
    size_t n_jobs; /* jobs of the current batch (job 0 runs on the caller) */
    int quit;
    void (*fn)(void *arg, size_t job);
    void *arg;
    struct kvq__pool_seat {
        struct kvq__pool *pool;
        size_t index; /* this worker runs job index + 1 */
    } *seats;
};

static void *kvq__pool_worker(void *arg) {
    struct kvq__pool_seat *seat = (struct kvq__pool_seat *)arg;
    kvq__pool *p = seat->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->quit)
            break;
        seen = p->gen;
        size_t job = seat->index + 1;
        if (job < p->n_jobs) {
            pthread_mutex_unlock(&p->mu);
            p->fn(p->arg, job);
            pthread_mutex_lock(&p->mu);
        }
        if (--p->busy == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->quit = 1;
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
        pthread_mutex_lock(&p->mu);
        p->fn = fn;
        p->arg = arg;
        p->n_jobs = n_jobs;
        p->busy = p->n;
        p->gen++;
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0);
    for (size_t j = workers + 1; j < n_jobs; j++) /* jobs without a worker */
        fn(arg, j);
    if (workers) {
        pthread_mutex_lock(&p->mu);
        while (p->busy)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
