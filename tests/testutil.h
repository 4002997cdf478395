/*
 * testutil.h - the one small test helper. CHECK* macros count passes and
 * failures and print both values on failure; TEST_MAIN_END prints
 * "N passed, N failed" and returns non-zero on failure. Random tests print
 * their seed. The data directory comes from --data DIR (default
 * ../shared/data); tu_data_dir() returns it.
 */
#ifndef KVQ_TESTUTIL_H
#define KVQ_TESTUTIL_H

#include "kvq.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int tu_pass, tu_fail;
extern const char *tu_data;

void tu_init(int argc, char **argv);
int tu_finish(void);
const char *tu_data_dir(void);

/* The environment variable NAME (KVQ_TEST_REDIS or KVQ_TEST_REDIS_SERVER,
 * exported by tests/with_redis.sh when it started a redis-server), or NULL
 * when it is unset or this libkvq was built without hiredis; *why then says
 * which, for the SKIP line. Every Redis test asks here, so that all of them
 * run, or all skip, for the same reason. */
const char *tu_redis_env(const char *name, const char **why);

/* deterministic RNG for tests (xorshift64* + Box-Muller) */
typedef struct {
    uint64_t s;
} tu_rng;
void tu_seed(tu_rng *r, uint64_t seed);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r);
double tu_gauss(tu_rng *r);
void tu_fill_gauss(tu_rng *r, float *x, size_t n, float sigma);

/* ||a - b|| / ||b|| over n floats, in double (0 when both are zero). */
double tu_rel_err(const float *a, const float *b, size_t n);

/* Allocator that fails on the Nth allocation (1-based; 0 = never) and counts
 * live bytes. */
typedef struct {
    long fail_at;
    long calls;
    size_t live_bytes;
    size_t peak_bytes;
    long live_blocks;
} tu_failalloc;
kvq_allocator tu_failalloc_make(tu_failalloc *fa, long fail_at);

/* .npy loader: float32 or float16, C order; returns malloc'd floats, shape. */
float *tu_load_npy(const char *path, size_t *shape, int *ndim);

#define TU_REPORT(ok, ...)                                                                          \
    do {                                                                                           \
        if (ok) {                                                                                  \
            tu_pass++;                                                                             \
        } else {                                                                                   \
            tu_fail++;                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK(cond) TU_REPORT((cond), "%s", #cond)
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long _a = (long long)(a), _b = (long long)(b);                                        \
        TU_REPORT(_a == _b, "%s == %s: %lld vs %lld", #a, #b, _a, _b);                             \
    } while (0)
#define CHECK_STATUS(st, want)                                                                     \
    do {                                                                                           \
        kvq_status _s = (st), _w = (want);                                                         \
        TU_REPORT(_s == _w, "%s: got %d (%s), want %d (%s)", #st, (int)_s, kvq_strerror(_s),      \
                  (int)_w, kvq_strerror(_w));                                                      \
    } while (0)
#define CHECK_OK(st) CHECK_STATUS(st, KVQ_OK)
#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double _a = (double)(a), _b = (double)(b), _t = (double)(tol);                             \
        TU_REPORT(fabs(_a - _b) <= _t, "%s ~ %s: %.9g vs %.9g (tol %.3g)", #a, #b, _a, _b, _t);    \
    } while (0)
#define CHECK_LE(a, b)                                                                             \
    do {                                                                                           \
        double _a = (double)(a), _b = (double)(b);                                                 \
        TU_REPORT(_a <= _b, "%s <= %s: %.9g vs %.9g", #a, #b, _a, _b);                             \
    } while (0)

#endif
