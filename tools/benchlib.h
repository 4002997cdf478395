/*
 * benchlib.h - the small benchmark engine behind `kvq bench ...`: a
 * monotonic clock, a measurement loop (untimed warm-up, then several timed
 * repetitions reported as median and minimum), and helpers for the JSON and
 * CSV output. A measured function only does the work; callers verify its
 * output after kvqb_measure returns, never inside the timed loop.
 * Uses libc only (no kvq internals), so every benchmark tool can share it.
 */
#ifndef KVQ_BENCHLIB_H
#define KVQ_BENCHLIB_H

#include <stddef.h>
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
} kvqb_config;

/* warmup 1, 3..15 samples within 0.2 s, samples of at least 2 ms. */
kvqb_config kvqb_default_config(void);

typedef struct kvqb_stats {
    double median_s; /* per call */
    double min_s;    /* per call */
    int reps;        /* samples taken */
    long calls;      /* calls per sample */
} kvqb_stats;

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

#endif
