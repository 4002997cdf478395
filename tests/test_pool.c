/*
 * test_pool.c - the attention workers (cache_pool.c): every job of a batch
 * runs exactly once, on whichever thread claims it, and kvq__pool_run
 * returns only when all are done; batches follow each other with workers
 * polling, asleep (idle longer than their polling bound) or woken in the
 * middle of a batch; jobs of one batch never run during another; a pool
 * of no workers (NULL) runs the jobs in order on the caller. Under
 * ThreadSanitizer (make check-tsan) it also checks the claim protocol's
 * memory ordering: the jobs' plain writes are read after the batch.
 */
#include "cache/cache_impl.h"
#include "common/common.h"
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define MAXJ 64

typedef struct {
    _Atomic int runs[MAXJ];   /* times each job ran */
    int out[MAXJ];            /* plain writes, read by the caller afterwards */
    _Atomic int inside;       /* jobs running now */
    _Atomic int batch;        /* the batch a job belongs to */
    int expect_batch;
    _Atomic int bad_batch;    /* a job saw another batch's number */
    size_t spin_us;           /* busy work per job */
} ctx_t;

static void sleep_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

static void job(void *arg, size_t j) {
    ctx_t *x = (ctx_t *)arg;
    atomic_fetch_add(&x->inside, 1);
    if (atomic_load(&x->batch) != x->expect_batch)
        atomic_store(&x->bad_batch, 1);
    if (x->spin_us) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do
            clock_gettime(CLOCK_MONOTONIC, &t1);
        while ((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000 <
               (long)x->spin_us);
    }
    x->out[j] = (int)j * 7 + x->expect_batch;
    atomic_fetch_add(&x->runs[j], 1);
    atomic_fetch_sub(&x->inside, 1);
}

/* n_jobs jobs on p; checks each ran once and wrote its result */
static void run_batch(kvq__pool *p, ctx_t *x, size_t n_jobs, int b) {
    for (size_t j = 0; j < MAXJ; j++) {
        atomic_store(&x->runs[j], 0);
        x->out[j] = -1;
    }
    x->expect_batch = b;
    atomic_store(&x->batch, b);
    kvq__pool_run(p, job, x, n_jobs);
    CHECK_EQ(atomic_load(&x->inside), 0); /* returned only after every job ended */
    int once = 1, wrote = 1, none_past = 1;
    for (size_t j = 0; j < n_jobs; j++) {
        once &= atomic_load(&x->runs[j]) == 1;
        wrote &= x->out[j] == (int)j * 7 + b;
    }
    for (size_t j = n_jobs; j < MAXJ; j++)
        none_past &= atomic_load(&x->runs[j]) == 0 && x->out[j] == -1;
    CHECK(once);
    CHECK(wrote);
    CHECK(none_past);
}

static void test_pool_runs(size_t workers) {
    kvq_allocator al;
    kvq__allocator_init(&al, NULL);
    const kvq_allocator *a = &al;
    kvq__pool *p;
    CHECK_OK(kvq__pool_create(&p, a, workers));
    CHECK(p != NULL);
    ctx_t x = {0};
    int b = 0;
    /* back to back (workers polling), jobs fewer than, as many as and
     * more than the threads */
    for (int rep = 0; rep < 200; rep++)
        for (size_t n = 1; n <= 2 * workers + 3; n++)
            run_batch(p, &x, n, ++b);
    /* after idling past the polling bound (KVQ__POOL_SPIN_NS 50 us): the
     * workers sleep, the caller claims what they have not; with jobs long
     * enough for a woken worker to take some */
    for (int rep = 0; rep < 20; rep++) {
        sleep_us(2000);
        x.spin_us = rep % 2 ? 200 : 0;
        run_batch(p, &x, workers + 1 + (size_t)rep % 3, ++b);
    }
    x.spin_us = 0;
    CHECK_EQ(atomic_load(&x.bad_batch), 0);
    kvq__pool_free(p, a);
}

/* No pool (n = 0 gives NULL): every job on the caller, in order. */
static size_t order[8], norder;
static void job_order(void *arg, size_t j) {
    (void)arg;
    order[norder++] = j;
}

static void test_no_workers(void) {
    kvq_allocator al;
    kvq__allocator_init(&al, NULL);
    kvq__pool *p = (kvq__pool *)1;
    CHECK_OK(kvq__pool_create(&p, &al, 0));
    CHECK(p == NULL);
    norder = 0;
    kvq__pool_run(NULL, job_order, NULL, 5);
    CHECK_EQ(norder, 5);
    int inorder = 1;
    for (size_t j = 0; j < 5; j++)
        inorder &= order[j] == j;
    CHECK(inorder);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_no_workers();
    test_pool_runs(1);
    test_pool_runs(3);
    return tu_finish();
}
