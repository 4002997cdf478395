/*
 * benchlib.c - the benchmark engine (see benchlib.h): timing with
 * clock_gettime(CLOCK_MONOTONIC), median/min over repetitions, small output
 * and parsing helpers, the cache size from sysfs, a condition-variable
 * thread pool and the read-bandwidth sum (AVX-512 / AVX2 / C, chosen at run
 * time through target attributes, so the tool needs no ISA flags).
 */
#include "benchlib.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQB_X86 1
#endif

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
    c.prep = NULL;
    c.prep_ctx = NULL;
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
        if (c.prep)
            c.prep(c.prep_ctx);
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
        if (c.prep)
            c.prep(c.prep_ctx);
        double t0 = kvqb_now();
        for (long k = 0; k < calls; k++) {
            int rc = fn(ctx);
            if (rc)
                return rc;
        }
        samples[r] = (kvqb_now() - t0) / (double)calls;
    }
    st->median_s = kvqb_median(samples, (size_t)reps);
    st->reps = reps;
    st->calls = calls;
    st->min_s = samples[0];
    return 0;
}

double kvqb_median(double *x, size_t n) {
    if (!n)
        return 0;
    qsort(x, n, sizeof x[0], kvqb_cmp_double);
    return 0.5 * (x[(n - 1) / 2] + x[n / 2]);
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

/* AMD's core generation from the CPUID family and model (AMD's revision
 * guides): the same "AMD EPYC" name covers all of them in a VM. */
static const char *kvqb_amd_core(int fam, int mod) {
    if (fam == 23)
        return mod < 0x30 ? "Zen/Zen+" : "Zen 2";
    if (fam == 25)
        return (mod >= 0x10 && mod < 0x20) || (mod >= 0x60 && mod < 0x80) ||
                       (mod >= 0xa0 && mod < 0xb0)
                   ? "Zen 4"
                   : "Zen 3";
    if (fam == 26)
        return "Zen 5";
    return NULL;
}

void kvqb_cpu_detail(char *buf, size_t size) {
    static const char *const want[] = {"avx2",      "fma",         "f16c",       "avx512f",
                                       "avx512bw",  "avx512vl",    "avx512_vnni", "avx512vbmi",
                                       "avx_vnni"};
    if (!size)
        return;
    buf[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[4096], fam[32] = "", mod[32] = "", vendor[32] = "";
    size_t len = 0;
    int flags_done = 0;
    while (fgets(line, sizeof line, f) && !flags_done) {
        char *p = strchr(line, ':');
        if (!p)
            continue;
        const char *v = p + 1 + (p[1] == ' ');
        if (!strncmp(line, "vendor_id", 9) && !vendor[0])
            snprintf(vendor, sizeof vendor, "%.*s", (int)strcspn(v, "\n"), v);
        else if (!strncmp(line, "cpu family", 10) && !fam[0])
            snprintf(fam, sizeof fam, "%.*s", (int)strcspn(v, "\n"), v);
        else if (!strncmp(line, "model\t", 6) && !mod[0])
            snprintf(mod, sizeof mod, "%.*s", (int)strcspn(v, "\n"), v);
        else if (!strncmp(line, "flags", 5)) {
            if (fam[0]) {
                len += (size_t)snprintf(buf + len, size - len, "family %s model %s", fam, mod);
                const char *zen = strcmp(vendor, "AuthenticAMD") ? NULL
                                                                 : kvqb_amd_core(atoi(fam), atoi(mod));
                if (zen && len < size)
                    len += (size_t)snprintf(buf + len, size - len, " (%s)", zen);
            }
            for (size_t k = 0; k < sizeof want / sizeof want[0] && len < size; k++) {
                char pat[32];
                size_t n = strlen(want[k]);
                snprintf(pat, sizeof pat, " %s", want[k]);
                for (const char *q = strstr(v - 1, pat); q; q = strstr(q + 1, pat))
                    if (q[n + 1] == ' ' || q[n + 1] == '\n' || q[n + 1] == 0) {
                        len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? " " : "",
                                                want[k]);
                        break;
                    }
            }
            flags_done = 1;
        }
    }
    fclose(f);
    if (len >= size)
        buf[size - 1] = 0;
}

int kvqb_parse_size(const char *s, size_t lo, size_t hi, size_t *out) {
    if (!s || *s < '0' || *s > '9')
        return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return 0;
    *out = (size_t)v;
    return 1;
}

/* ---- the last-level cache from sysfs ---- */
static int kvqb_read_line(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok;
}

size_t kvqb_llc_bytes(void) {
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!kvqb_read_line(path, buf, sizeof buf))
            break;
        if (strncmp(buf, "Instruction", 11) == 0)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!kvqb_read_line(path, buf, sizeof buf))
            continue;
        int level = atoi(buf);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!kvqb_read_line(path, buf, sizeof buf))
            continue;
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (end == buf)
            continue;
        if (*end == 'K')
            v <<= 10;
        else if (*end == 'M')
            v <<= 20;
        else if (*end == 'G')
            v <<= 30;
        if (level > best_level || (level == best_level && v > best)) {
            best_level = level;
            best = (size_t)v;
        }
    }
    return best;
}

size_t kvqb_flush_bytes(void) {
    const size_t llc = kvqb_llc_bytes(), eff = llc ? llc : (size_t)32 << 20;
    return 3 * eff > ((size_t)64 << 20) ? 3 * eff : (size_t)64 << 20;
}

/* ---- SIMD level ---- */
kvqb_simd kvqb_simd_best(void) {
#ifdef KVQB_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return KVQB_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return KVQB_SIMD_AVX2;
#endif
    return KVQB_SIMD_SCALAR;
}

int kvqb_has_vnni(void) {
#ifdef KVQB_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

const char *kvqb_simd_name(kvqb_simd s) {
    return s == KVQB_SIMD_AVX512 ? "avx512" : s == KVQB_SIMD_AVX2 ? "avx2" : "scalar";
}

/* ---- the read kernel: eight independent sums, 128 floats per step ---- */
static float kvqb_sum_c(const float *x, size_t n) {
    float a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += x[i + k];
    for (; i < n; i++)
        a[0] += x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

#ifdef KVQB_X86
__attribute__((target("avx512f"))) static float kvqb_sum_avx512(const float *x, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
        a4 = _mm512_add_ps(a4, _mm512_loadu_ps(x + i + 64));
        a5 = _mm512_add_ps(a5, _mm512_loadu_ps(x + i + 80));
        a6 = _mm512_add_ps(a6, _mm512_loadu_ps(x + i + 96));
        a7 = _mm512_add_ps(a7, _mm512_loadu_ps(x + i + 112));
    }
    a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                       _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    return _mm512_reduce_add_ps(a0) + kvqb_sum_c(x + i, n - i);
}

__attribute__((target("avx2,fma"))) static float kvqb_sum_avx2(const float *x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
        a4 = _mm256_add_ps(a4, _mm256_loadu_ps(x + i + 32));
        a5 = _mm256_add_ps(a5, _mm256_loadu_ps(x + i + 40));
        a6 = _mm256_add_ps(a6, _mm256_loadu_ps(x + i + 48));
        a7 = _mm256_add_ps(a7, _mm256_loadu_ps(x + i + 56));
    }
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                       _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h) + kvqb_sum_c(x + i, n - i);
}
#endif

float kvqb_sum(const float *x, size_t n, kvqb_simd s) {
#ifdef KVQB_X86
    if (s == KVQB_SIMD_AVX512)
        return kvqb_sum_avx512(x, n);
    if (s == KVQB_SIMD_AVX2)
        return kvqb_sum_avx2(x, n);
#endif
    (void)s;
    return kvqb_sum_c(x, n);
}

/* ---- thread pool ---- */
struct kvqb_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;
    int pending, stop, n_use, started;
    void (*fn)(void *ctx, int i, int n);
    void *ctx;
    struct kvqb_seat {
        struct kvqb_pool *p;
        int i;
    } *seats;
};

static void *kvqb_worker(void *arg) {
    struct kvqb_seat *seat = (struct kvqb_seat *)arg;
    kvqb_pool *p = seat->p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        void (*fn)(void *, int, int) = p->fn;
        void *ctx = p->ctx;
        int n_use = p->n_use;
        pthread_mutex_unlock(&p->mu);
        if (seat->i < n_use)
            fn(ctx, seat->i, n_use);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kvqb_pool *kvqb_pool_create(int n) {
    if (n < 1)
        return NULL;
    kvqb_pool *p = (kvqb_pool *)calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n;
    p->th = (pthread_t *)calloc((size_t)n, sizeof *p->th);
    p->seats = (struct kvqb_seat *)calloc((size_t)n, sizeof *p->seats);
    if (!p->th || !p->seats || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->th);
        free(p->seats);
        free(p);
        return NULL;
    }
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 1; i < n; i++) {
        p->seats[i].p = p;
        p->seats[i].i = i;
        if (pthread_create(&p->th[i], NULL, kvqb_worker, &p->seats[i]) != 0) {
            p->n = i; /* the started ones are stopped by kvqb_pool_free */
            kvqb_pool_free(p);
            return NULL;
        }
    }
    return p;
}

int kvqb_pool_size(const kvqb_pool *p) { return p ? p->n : 1; }

void kvqb_pool_run(kvqb_pool *p, int n_use, void (*fn)(void *ctx, int i, int n), void *ctx) {
    if (!p || p->n == 1 || n_use <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (n_use > p->n)
        n_use = p->n;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_use = n_use;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, n_use);
    pthread_mutex_lock(&p->mu);
    while (p->pending)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void kvqb_pool_free(kvqb_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p->seats);
    free(p);
}

/* ---- read bandwidth ---- */
typedef struct {
    const float *buf;
    size_t n; /* floats */
    kvqb_simd simd;
    atomic_int arrived;
    double t0[64], t1[64];
    float sum[64];
} kvqb_bw_ctx;

static void kvqb_bw_part(void *arg, int i, int n) {
    kvqb_bw_ctx *c = (kvqb_bw_ctx *)arg;
    /* shares of whole 4 KiB pages */
    size_t pages = c->n / 1024, lo = pages * (size_t)i / (size_t)n * 1024,
           hi = i == n - 1 ? c->n : pages * (size_t)(i + 1) / (size_t)n * 1024;
    atomic_fetch_add(&c->arrived, 1);
    while (atomic_load(&c->arrived) < n)
        sched_yield();
    c->t0[i] = kvqb_now();
    c->sum[i] = kvqb_sum(c->buf + lo, hi - lo, c->simd);
    c->t1[i] = kvqb_now();
}

double kvqb_read_gbps(kvqb_pool *pool, int n_threads, const float *buf, size_t bytes, int passes,
                      kvqb_simd s) {
    if (n_threads < 1 || n_threads > 64 || n_threads > kvqb_pool_size(pool) || passes < 1)
        return 0.0;
    kvqb_bw_ctx *c = (kvqb_bw_ctx *)calloc(1, sizeof *c);
    if (!c)
        return 0.0;
    c->buf = buf;
    c->n = bytes / sizeof(float);
    c->simd = s;
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int p = 0; p < passes; p++) {
        atomic_store(&c->arrived, 0);
        kvqb_pool_run(pool, n_threads, kvqb_bw_part, c);
        double a = c->t0[0], b = c->t1[0];
        for (int i = 0; i < n_threads; i++) {
            a = c->t0[i] < a ? c->t0[i] : a;
            b = c->t1[i] > b ? c->t1[i] : b;
            sink += c->sum[i];
        }
        double gbps = b > a ? (double)(c->n * sizeof(float)) / (b - a) * 1e-9 : 0.0;
        if (gbps > best)
            best = gbps;
    }
    (void)sink;
    free(c);
    return best;
}
