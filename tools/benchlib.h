/*
 * benchlib.h - the small benchmark engine behind `kvq bench ...`: a
 * monotonic clock, a measurement loop (untimed warm-up, then several timed
 * repetitions reported as median and minimum), helpers for the JSON and CSV
 * output and for strict option parsing, and what the attention benchmark
 * needs to put its times next to the memory system: the last-level cache
 * size, the SIMD level of the benchmark's own kernels, a small persistent
 * thread pool, and the streaming read bandwidth of one or more threads.
 * A measured function only does the work; callers verify its output after
 * kvqb_measure returns, never inside the timed loop.
 * Uses libc and pthreads only (no kvq internals), so every benchmark tool
 * can share it.
 */
#ifndef KVQ_BENCHLIB_H
#define KVQ_BENCHLIB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Seconds from CLOCK_MONOTONIC. */
double kvqb_now(void);

typedef struct kvqb_config {
    int warmup;          /* untimed runs first (at least one is always made) */
    int reps;            /* timed samples: at most this many, as many as fit */
    int min_reps;        /* in budget_s, but at least min_reps */
    double budget_s;     /* time for the timed samples; 0 = always reps */
    double min_sample_s; /* a sample repeats the function until it lasts this
                            long (tiny inputs); 0 = one call per sample */
    void (*prep)(void *prep_ctx); /* when set: called, untimed, before every
                                     warm-up run and every sample (e.g. to
                                     flush the caches) */
    void *prep_ctx;
} kvqb_config;

/* warmup 1, 3..15 samples within 0.2 s, samples of at least 2 ms, no prep. */
kvqb_config kvqb_default_config(void);

typedef struct kvqb_stats {
    double median_s; /* per call */
    double min_s;    /* per call */
    int reps;        /* samples taken */
    long calls;      /* calls per sample */
} kvqb_stats;

/* Sorts x[0..n) in place and returns its median (the two middle values'
 * mean for even n; 0 when n is 0). */
double kvqb_median(double *x, size_t n);

/* Measures fn(ctx). fn returns 0 on success; the first non-zero return ends
 * the measurement and is returned (st is then unspecified). */
int kvqb_measure(int (*fn)(void *ctx), void *ctx, const kvqb_config *cfg, kvqb_stats *st);

/* items / seconds, 0 when seconds is not positive. */
double kvqb_rate(double items, double seconds);

/* JSON output: a number (null when not finite) and a string with escapes. */
void kvqb_json_num(FILE *f, double v);
void kvqb_json_str(FILE *f, const char *s);

/* The CPU model name from /proc/cpuinfo, or "unknown". */
void kvqb_cpu_name(char *buf, size_t size);

/* "family F model M" and the SIMD flags that matter to the kernels (avx2,
 * fma, f16c, avx512f/bw/vl, avx512_vnni, avx512vbmi, avx_vnni) from
 * /proc/cpuinfo; "" where it does not say. */
void kvqb_cpu_detail(char *buf, size_t size);

/* Strict decimal option value: digits only (no sign, no space, nothing
 * after), lo <= value <= hi. Returns 1 and sets *out, or 0. */
int kvqb_parse_size(const char *s, size_t lo, size_t hi, size_t *out);

/* The size in bytes of the highest-level data or unified cache of CPU 0
 * (/sys/devices/system/cpu/cpu0/cache/index* /level and size), 0 when sysfs
 * does not say. */
size_t kvqb_llc_bytes(void);

/* Bytes of a buffer whose read evicts the last-level cache: 3x its size
 * (32 MiB when sysfs does not say), at least 64 MiB. */
size_t kvqb_flush_bytes(void);

/* The SIMD level of the benchmark's own kernels (the read-bandwidth sum and
 * the peer baselines), chosen at run time: AVX-512 F when the CPU and OS
 * have it, else AVX2 + FMA + F16C, else portable C. */
typedef enum { KVQB_SIMD_SCALAR = 0, KVQB_SIMD_AVX2 = 1, KVQB_SIMD_AVX512 = 2 } kvqb_simd;
kvqb_simd kvqb_simd_best(void);
const char *kvqb_simd_name(kvqb_simd s);
/* 1 when the CPU has AVX-512 VNNI and VL (vpdpbusd on 256-bit registers). */
int kvqb_has_vnni(void);

/* Sum of n floats at x (64-byte aligned for the SIMD paths' speed, not
 * needed for correctness) with the given SIMD level (at most
 * kvqb_simd_best()): the read kernel of the bandwidth measurement. */
float kvqb_sum(const float *x, size_t n, kvqb_simd s);

/* A persistent pool of n threads (the caller is thread 0, so n - 1 are
 * started). kvqb_pool_run calls fn(ctx, i, n_use) on threads i = 0..n_use-1
 * (n_use <= n, the others stay idle) and returns when all have returned.
 * kvqb_pool_create returns NULL when out of memory or threads. */
typedef struct kvqb_pool kvqb_pool;
kvqb_pool *kvqb_pool_create(int n);
int kvqb_pool_size(const kvqb_pool *p);
void kvqb_pool_run(kvqb_pool *p, int n_use, void (*fn)(void *ctx, int i, int n), void *ctx);
void kvqb_pool_free(kvqb_pool *p);

/* Streaming read bandwidth: n_threads threads (of pool, which needs at
 * least that many; NULL for one thread) each sum their contiguous share of
 * the bytes at buf (already written: the pages exist) with kvqb_sum, all
 * starting together behind a barrier; a pass lasts from the first start to
 * the last end. Returns the best of `passes` passes in GB/s (1e9 bytes
 * per second); the first pass after the buffer was written may be slower
 * (callers warm up with a pass of their own). */
double kvqb_read_gbps(kvqb_pool *pool, int n_threads, const float *buf, size_t bytes, int passes,
                      kvqb_simd s);

#endif
