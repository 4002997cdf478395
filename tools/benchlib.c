/*
 * benchlib.c - the benchmark engine (see benchlib.h): timing with
 * clock_gettime(CLOCK_MONOTONIC), median/min over repetitions, and small
 * output helpers.
 */
#include "benchlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double kvqb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

kvqb_config kvqb_default_config(void) {
    kvqb_config c;
    c.warmup = 1;
    c.min_reps = 3;
    c.reps = 15;
    c.budget_s = 0.2;
    c.min_sample_s = 2e-3;
    return c;
}

static int kvqb_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define KVQB_MAX_REPS 1000

int kvqb_measure(int (*fn)(void *ctx), void *ctx, const kvqb_config *cfg, kvqb_stats *st) {
    kvqb_config c = cfg ? *cfg : kvqb_default_config();
    if (c.reps < 1)
        c.reps = 1;
    if (c.reps > KVQB_MAX_REPS)
        c.reps = KVQB_MAX_REPS;
    if (c.min_reps < 1)
        c.min_reps = 1;
    if (c.min_reps > c.reps)
        c.min_reps = c.reps;

    /* warm-up; its time (the last call) sizes the samples */
    double one = 0.0;
    for (int i = 0; i < (c.warmup > 0 ? c.warmup : 1); i++) {
        double t0 = kvqb_now();
        int rc = fn(ctx);
        one = kvqb_now() - t0;
        if (rc)
            return rc;
    }
    long calls = 1;
    if (c.min_sample_s > 0 && one < c.min_sample_s)
        calls = (long)ceil(c.min_sample_s / (one > 1e-9 ? one : 1e-9));
    if (calls > 1000000)
        calls = 1000000;
    int reps = c.reps;
    if (c.budget_s > 0) {
        double fit = c.budget_s / (one * (double)calls > 1e-12 ? one * (double)calls : 1e-12);
        reps = fit < (double)c.min_reps ? c.min_reps : fit > (double)c.reps ? c.reps : (int)fit;
    }

    double samples[KVQB_MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = kvqb_now();
        for (long k = 0; k < calls; k++) {
            int rc = fn(ctx);
            if (rc)
                return rc;
        }
        samples[r] = (kvqb_now() - t0) / (double)calls;
    }
    qsort(samples, (size_t)reps, sizeof samples[0], kvqb_cmp_double);
    st->reps = reps;
    st->calls = calls;
    st->min_s = samples[0];
    st->median_s = reps % 2 ? samples[reps / 2] : 0.5 * (samples[reps / 2 - 1] + samples[reps / 2]);
    return 0;
}

double kvqb_rate(double items, double seconds) { return seconds > 0 ? items / seconds : 0.0; }

void kvqb_json_num(FILE *f, double v) {
    if (!isfinite(v))
        fputs("null", f);
    else
        fprintf(f, "%.6g", v);
}

void kvqb_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void kvqb_cpu_name(char *buf, size_t size) {
    if (!size)
        return;
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *p = strchr(line, ':');
        if (!p)
            break;
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, "\n");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        snprintf(buf, size, "%.*s", (int)n, p);
        break;
    }
    fclose(f);
}
