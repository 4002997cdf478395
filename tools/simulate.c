/*
 * simulate.c - `kvq simulate`, the main job: a prefill and a decode session
 * through a kvq cache on a seeded llama-like workload (or real K/V/Q from
 * .npy files), with exact f32 attention over the full, never-evicted context
 * alongside, reporting the cache's accounting, the attention error and the
 * KL divergence of attention weights against that reference, and timings
 * against an f32 cache driven the same way in the same run.
 *
 * Synthetic workload, per layer and KV head: pre-RoPE keys are a fixed
 * per-channel mean (norm about three times the varying part) plus a
 * Gaussian varying part and two outlier channels, then RoPE at the token's
 * position; values are Gaussian. Each query aims at one earlier token (a
 * fixed set of heavy hitters, a recent token or any token) through that
 * token's varying part, so attention is peaked and has heavy hitters.
 */
#include "kvq.h"
#include "benchlib.h"
#include "cliargs.h"
#include "modelopts.h"
#include "npy.h"
#include "tool.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    size_t L, H, QH, d, prompt, decode, N;
    float *kpre, *k, *v; /* [L][N][H][d] */
    float *q;            /* [L][N][QH][d] */
} sim_data;

/* Progress on stderr (--progress, or by default when stderr is a
 * terminal; --quiet: none). On a terminal one line is rewritten in place,
 * at most 4 times a second, and cleared at the end; elsewhere a line every
 * 2 s and one at the end of each phase, so that a log shows how far a run
 * got. */
typedef struct {
    int on, tty;
    double phase_start, last;
    int width; /* characters of the line now on the terminal */
} sim_progress;

static void sim_phase(sim_progress *pr) {
    pr->phase_start = kvqb_now();
    pr->last = pr->tty ? 0 : pr->phase_start; /* a terminal shows the phase at once */
}

/* 1 when a progress line is due. */
static int sim_due(const sim_progress *pr) {
    return pr->on && kvqb_now() - pr->last >= (pr->tty ? 0.25 : 2.0);
}

/* "kvq simulate: WHAT, S s[, about S s left]", frac the phase's share done
 * (for the estimate of the time left); end: the phase's last line, shown
 * whether due or not. */
static void sim_show(sim_progress *pr, double frac, int end, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sim_show(sim_progress *pr, double frac, int end, const char *fmt, ...) {
    if (!pr->on)
        return;
    double now = kvqb_now();
    pr->last = now;
    double el = now - pr->phase_start;
    char line[200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, 120, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    n = n < 120 ? n : 119;
    n += snprintf(line + n, sizeof line - (size_t)n, ", %.1f s", el);
    if (!end && frac > 0 && frac < 1 && el >= 1)
        snprintf(line + n, sizeof line - (size_t)n, ", about %.0f s left", el / frac * (1 - frac));
    if (pr->tty) {
        int w = (int)strlen(line) + 14;
        fprintf(stderr, "\rkvq simulate: %s%*s", line, pr->width > w ? pr->width - w : 0, "");
        pr->width = w;
    } else {
        fprintf(stderr, "kvq simulate: %s\n", line);
    }
    fflush(stderr);
}

/* A line of its own (the memory estimate), before any progress line. */
static void sim_note(sim_progress *pr, const char *msg) {
    if (!pr->on)
        return;
    if (pr->tty && pr->width) {
        fprintf(stderr, "\r%*s\r", pr->width, "");
        pr->width = 0;
    }
    fprintf(stderr, "kvq simulate: %s\n", msg);
    fflush(stderr);
}

/* Clears the terminal line at the end of the run. */
static void sim_progress_end(sim_progress *pr) {
    if (pr->on && pr->tty && pr->width) {
        fprintf(stderr, "\r%*s\r", pr->width, "");
        fflush(stderr);
    }
    pr->width = 0;
}

typedef struct {
    uint64_t s;
} sim_rng;
static uint64_t sim_next(sim_rng *r) {
    uint64_t x = r->s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static double sim_unif(sim_rng *r) { return (double)(sim_next(r) >> 11) * 0x1.0p-53; }
static double sim_gauss(sim_rng *r) {
    double u = sim_unif(r), v = sim_unif(r);
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static void sim_rope(float *x, size_t d, size_t pos, double theta) {
    for (size_t i = 0; i < d / 2; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)d);
        float val = (float)pos * freq, fcr = cosf(val), fci = sinf(val);
        float v0 = x[2 * i], v1 = x[2 * i + 1];
        x[2 * i] = v0 * fcr - v1 * fci;
        x[2 * i + 1] = v0 * fci + v1 * fcr;
    }
}

static int sim_synth(sim_data *D, uint64_t seed, sim_progress *pr) {
    size_t L = D->L, H = D->H, QH = D->QH, d = D->d, N = D->N, G = QH / H;
    size_t nkv = L * N * H * d;
    D->kpre = malloc(nkv * sizeof(float));
    D->k = malloc(nkv * sizeof(float));
    D->v = malloc(nkv * sizeof(float));
    D->q = malloc(L * N * QH * d * sizeof(float));
    float *delta = malloc(nkv * sizeof(float)); /* post-RoPE varying parts */
    float *mu = malloc(H * d * sizeof(float));
    if (!D->kpre || !D->k || !D->v || !D->q || !delta || !mu) {
        free(delta);
        free(mu);
        return -1;
    }
    sim_rng r = {seed};
    size_t heavy[10];
    for (int i = 0; i < 4; i++)
        heavy[i] = (size_t)i;
    for (int i = 4; i < 10; i++)
        heavy[i] = 4 + (size_t)(sim_unif(&r) * (double)(D->prompt > 8 ? D->prompt - 4 : 1));
    sim_phase(pr);
    for (size_t l = 0; l < L; l++) {
        for (size_t i = 0; i < H * d; i++)
            mu[i] = (float)(3.0 * sim_gauss(&r));
        for (size_t t = 0; t < N; t++) {
            if (sim_due(pr))
                sim_show(pr, ((double)l + 0.5 * (double)t / (double)N) / (double)L, 0,
                         "data: layer %zu/%zu, K/V %zu/%zu tokens", l + 1, L, t, N);
            for (size_t h = 0; h < H; h++) {
                size_t o = ((l * N + t) * H + h) * d;
                for (size_t c = 0; c < d; c++) {
                    float dv = (float)sim_gauss(&r);
                    if (c == (h * 7 + 3) % d || c == (h * 13 + 5) % d)
                        dv *= 5.0f; /* outlier channels */
                    delta[o + c] = dv;
                    D->kpre[o + c] = mu[h * d + c] + dv;
                    D->v[o + c] = (float)sim_gauss(&r);
                }
                memcpy(D->k + o, D->kpre + o, d * sizeof(float));
                sim_rope(D->k + o, d, t, 10000.0);
                sim_rope(delta + o, d, t, 10000.0);
            }
        }
        for (size_t t = 0; t < N; t++) {
            if (sim_due(pr))
                sim_show(pr, ((double)l + 0.5 + 0.5 * (double)t / (double)N) / (double)L, 0,
                         "data: layer %zu/%zu, Q %zu/%zu tokens", l + 1, L, t, N);
            for (size_t qh = 0; qh < QH; qh++) {
                size_t h = qh / G;
                double u = sim_unif(&r);
                size_t tgt;
                if (u < 0.4) {
                    tgt = heavy[(size_t)(sim_unif(&r) * 10)];
                } else if (u < 0.8) {
                    size_t back = (size_t)(sim_unif(&r) * 64);
                    tgt = t > back ? t - back : 0;
                } else {
                    tgt = (size_t)(sim_unif(&r) * (double)(t + 1));
                }
                if (tgt > t)
                    tgt = t;
                const float *dl = delta + ((l * N + tgt) * H + h) * d;
                double nn = 0;
                for (size_t c = 0; c < d; c++)
                    nn += (double)dl[c] * dl[c];
                double a = 9.0 * sqrt((double)d) / (sqrt(nn) + 1e-9) / sqrt(nn / (double)d + 1e-9);
                float *qo = D->q + ((l * N + t) * QH + qh) * d;
                for (size_t c = 0; c < d; c++)
                    qo[c] = (float)(a * dl[c] + 0.3 * sim_gauss(&r));
            }
        }
    }
    sim_show(pr, 1, 1, "data: %zu layers x %zu tokens generated", L, N);
    free(delta);
    free(mu);
    return 0;
}

/* Real activations: DIR/k.npy, k_prerope.npy, v.npy [L][T][H][d] and q.npy
 * [L][T][QH][d] (the layout of ../shared/data/stories260K/kv-story1); the
 * shapes come from the files. */
static int sim_load(sim_data *D, const char *dir) {
    char path[4096], err[256];
    size_t sh[4][KVQT_NPY_MAX_AXES];
    int nd[4];
    const char *names[4] = {"k.npy", "k_prerope.npy", "v.npy", "q.npy"};
    float **dst[4] = {&D->k, &D->kpre, &D->v, &D->q};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (kvqt_npy_load_shape(path, dst[i], sh[i], &nd[i], err, sizeof err) != 0) {
            fprintf(stderr, "kvq simulate: %s\n", err);
            return -1;
        }
        if (nd[i] != 4) {
            fprintf(stderr, "kvq simulate: %s must have 4 axes [layers, tokens, heads, head_dim]\n", path);
            return -1;
        }
    }
    for (int i = 1; i < 3; i++)
        if (memcmp(sh[i], sh[0], 4 * sizeof(size_t)) != 0) {
            fprintf(stderr, "kvq simulate: %s has a different shape from k.npy\n", names[i]);
            return -1;
        }
    if (sh[3][0] != sh[0][0] || sh[3][1] != sh[0][1] || sh[3][3] != sh[0][3] || sh[3][2] % sh[0][2]) {
        fprintf(stderr, "kvq simulate: q.npy does not match k.npy (layers, tokens, head_dim, GQA)\n");
        return -1;
    }
    D->L = sh[0][0], D->H = sh[0][2], D->QH = sh[3][2], D->d = sh[0][3];
    size_t T = sh[0][1];
    if (D->prompt + D->decode > T) {
        if (T <= D->decode)
            D->decode = T / 2;
        D->prompt = T - D->decode;
    }
    /* keep [layers][N] with N = prompt + decode: the arrays hold T tokens, so
     * index with T as the stride */
    D->N = T;
    return 0;
}

typedef struct {
    double err2, ref2;  /* attention output error */
    double kl;          /* sum of KL(p_cache || p_ref) */
    double kept;        /* sum of reference mass on kept tokens */
    double nlk;         /* sum of -log(mass kept): the least KL a cache holding only the
                           kept tokens can have (Gibbs: sum pc log(pc/pg) >= -log(sum pg)
                           when pc sums to 1), reached by the exact weights renormalised,
                           which is what an exact cache gives when each KV head serves one
                           query head */
    long n_kl;
} sim_quality;

/* What one cache gave for a query token: its attention output [QH][d], its
 * per-KV-head token attention [H][n] over the positions pos[0..n), and the
 * figures it adds to. */
typedef struct {
    const float *out, *tattn;
    const int32_t *pos;
    size_t n;
    sim_quality *qa;
} sim_view;

/* Exact attention for layer l, query token t over tokens 0..t of the full
 * context, compared with each of the nv caches' outputs and token
 * attention. */
static void sim_reference(const sim_data *D, size_t l, size_t t, const sim_view *vw, size_t nv,
                          double *p, double *pg) {
    size_t H = D->H, QH = D->QH, d = D->d, G = QH / H, N = D->N;
    double sc = 1.0 / sqrt((double)d);
    for (size_t h = 0; h < H; h++) {
        for (size_t j = 0; j <= t; j++)
            pg[j] = 0;
        for (size_t g = 0; g < G; g++) {
            size_t qh = h * G + g;
            const float *q = D->q + ((l * N + t) * QH + qh) * d;
            double mx = -1e300;
            for (size_t j = 0; j <= t; j++) {
                const float *k = D->k + ((l * N + j) * H + h) * d;
                double s = 0;
                for (size_t c = 0; c < d; c++)
                    s += (double)q[c] * k[c];
                p[j] = s * sc;
                if (p[j] > mx)
                    mx = p[j];
            }
            double sum = 0;
            for (size_t j = 0; j <= t; j++) {
                p[j] = exp(p[j] - mx);
                sum += p[j];
            }
            for (size_t c = 0; c < d; c++) {
                double o = 0;
                for (size_t j = 0; j <= t; j++)
                    o += p[j] * D->v[((l * N + j) * H + h) * d + c];
                o /= sum;
                for (size_t k = 0; k < nv; k++) {
                    double e = vw[k].out[qh * d + c] - o;
                    vw[k].qa->err2 += e * e;
                    vw[k].qa->ref2 += o * o;
                }
            }
            for (size_t j = 0; j <= t; j++)
                pg[j] += p[j] / sum / (double)G;
        }
        for (size_t k = 0; k < nv; k++) {
            double kl = 0, kept = 0;
            for (size_t i = 0; i < vw[k].n; i++) {
                size_t j = (size_t)vw[k].pos[i];
                if (j > t)
                    continue;
                double pc = vw[k].tattn[h * vw[k].n + i] / (double)G;
                kept += pg[j];
                if (pc > 0)
                    kl += pc * log(pc / fmax(pg[j], 1e-300));
            }
            vw[k].qa->kl += kl;
            vw[k].qa->kept += kept;
            vw[k].qa->nlk += -log(fmax(kept, 1e-300));
            vw[k].qa->n_kl++;
        }
    }
}

/* kvq_cache_attend on the tiered cache, riding out a cold store that is
 * away for a while (a Redis restart): a failure that may pass (I/O or
 * connection; the cache is unchanged and retries a dropped connection once
 * itself) is retried every 100 ms for up to 30 s. *retries counts them. */
static kvq_status sim_attend(kvq_cache *c, size_t layer, const float *q, const int32_t *qpos,
                             size_t n, float *out, size_t cap, float *tattn, size_t tcap,
                             unsigned long *retries) {
    kvq_status st = kvq_cache_attend(c, layer, q, qpos, n, out, cap, tattn, tcap);
    for (int i = 0; i < 300 && (st == KVQ_ERR_CONN || st == KVQ_ERR_IO); i++) {
        if (i == 0)
            fprintf(stderr, "kvq simulate: layer %zu: %s: retrying\n", layer, kvq_strerror(st));
        usleep(100000);
        ++*retries;
        st = kvq_cache_attend(c, layer, q, qpos, n, out, cap, tattn, tcap);
    }
    return st;
}

typedef struct {
    size_t L, H, QH, d, prompt, decode, budget, window, sinks, page, threads, recent, every;
    double budget_ratio;
    const char *kc, *vc, *policy, *layout, *data;
    int prerope, center, json;
    unsigned long long seed;
    size_t hot_tokens, warm_tokens;
    const char *warm_codec, *cold;
    int verify, strict;
    size_t cold_ttl_ms;
    int progress, quiet;
} sim_opts;

static int sim_parse_policy(const char *s, kvq_policy *p) {
    if (!strcmp(s, "none"))
        *p = KVQ_POLICY_NONE;
    else if (!strcmp(s, "window"))
        *p = KVQ_POLICY_WINDOW;
    else if (!strcmp(s, "fifo"))
        *p = KVQ_POLICY_FIFO;
    else if (!strcmp(s, "utility"))
        *p = KVQ_POLICY_UTILITY;
    else
        return -1;
    return 0;
}

/* The default V codec: int4 in groups of 32 where 32 divides head_dim,
 * else int4 over the whole vector. */
#define SIM_DEFAULT_V "int4:g=32"
#define SIM_DEFAULT_V_SMALL "int4"

/* The prefill's chunk: tokens appended before each attend. */
#define SIM_CHUNK 256

/* What the synthetic workload is (see the top of the file). */
#define SIM_SYNTH_TEXT                                                                             \
    "synthetic (seeded): keys = a per-channel mean + Gaussian, 2 outlier channels x5, RoPE; "     \
    "values Gaussian; each query aims at one earlier token (40%% 10 heavy hitters, 40%% the "     \
    "last 64, 20%% any)"

static void sim_usage(FILE *f) {
    fprintf(f,
            "usage: kvq simulate [--layers N] [--kv-heads N] [--q-heads N] [--head-dim N]\n"
            "                    [--prompt N] [--decode N] [--k-codec C] [--v-codec C]\n"
            "                    [--k-layout token|channel] [--k-prerope] [--k-center]\n"
            "                    [--policy none|window|fifo|utility --budget N | --budget-ratio R\n"
            "                     --window N --sinks N] [--page N] [--recent N] [--threads N]\n"
            "                    [--data synthetic|DIR] [--quality-every N] [--seed N] [--json]\n"
            "                    [--hot-tokens N] [--warm-tokens N] [--warm-codec C]\n"
            "                    [--cold file:DIR|redis://HOST:PORT|none] [--verify]\n"
            "                    [--strict-tiers] [--cold-ttl MS] [--progress | --quiet]\n"
            "  a prefill (chunks of 256 tokens) and a decode through a kvq cache, beside exact\n"
            "  f32 attention over the whole context, an f32 cache with the same eviction (what\n"
            "  eviction alone costs) and an f32 cache without eviction (the time baseline)\n"
            "  --layers N (8, 1..1024)  --kv-heads N (8, 1..1024)  --q-heads N (32, a multiple\n"
            "  of --kv-heads)  --head-dim N (128, 1..1024)  --prompt N (2048, 1..2^30)\n"
            "  --decode N (512, 0..2^30; --prompt + --decode at most 2^30)\n"
            "  --k-codec C (int8), --v-codec C (" SIM_DEFAULT_V ", or " SIM_DEFAULT_V_SMALL
            " where 32 does not divide head_dim)\n"
            "  --policy P (none): a policy needs --budget N (1..2^30) or --budget-ratio R\n"
            "    (0 < R <= 1, of the prompt); --window N (128) and --sinks N (4) are its\n"
            "    protected newest and first tokens\n"
            "  --page N (16, 1..4096)  --recent N (f16 recent window, 0)  --threads N (1, 1..256)\n"
            "  --data synthetic|DIR: synthetic K/V/Q (below), or DIR/k.npy, k_prerope.npy,\n"
            "    v.npy [layers][tokens][heads][head_dim] and q.npy (the shapes come from the\n"
            "    files; --prompt and --decode are clamped to their tokens)\n"
            "  --quality-every N (16): compare every N-th decode step (and the last)\n"
            "  --seed N (1, 0..2^64-1): the synthetic data's seed\n"
            "  tiers: --hot-tokens N and --warm-tokens N per layer (0 = unlimited; pages of\n"
            "    the sinks and the protected window stay hot),\n"
            "    --warm-codec C, --cold URL (none; file:DIR, DIR or redis://HOST[:PORT][/NS]),\n"
            "    --verify (CRC of demoted blocks), --strict-tiers (a lost cold page fails the\n"
            "    attend), --cold-ttl MS (Redis)\n"
            "  --progress: progress lines on stderr (a line every 2 s and one per phase) even\n"
            "    when stderr is not a terminal; --quiet: none, even on a terminal (default:\n"
            "    a line rewritten in place when stderr is a terminal, else nothing)\n"
            "  synthetic data: " SIM_SYNTH_TEXT "\n"
            "  every option is checked before any data is made; the memory the run needs (the\n"
            "  K/V/Q data, the f32 caches, this cache) is estimated first and a run that does\n"
            "  not fit in the memory available is refused with both figures (exit 1)\n"
            "exit status: 0 ok, 1 failure (files, store, memory, run), 2 usage error\n");
}

/* --cold: file:DIR, redis://..., none, or a directory path. A value that
 * begins as a URL does (a scheme: a letter, then letters, digits, '+', '-'
 * or '.', then ':') must name a store kvq has; anything else is refused
 * here, before a directory of that name is made (a directory whose name
 * looks so is given as ./NAME or file:NAME). The rest of a Redis URL is
 * checked when the store opens, before any data is made. */
static int sim_check_cold(const char *v) {
    size_t n = 0;
    if ((*v >= 'a' && *v <= 'z') || (*v >= 'A' && *v <= 'Z'))
        for (n = 1; (v[n] >= 'a' && v[n] <= 'z') || (v[n] >= 'A' && v[n] <= 'Z') ||
                    (v[n] >= '0' && v[n] <= '9') || v[n] == '+' || v[n] == '-' || v[n] == '.';
             n++)
            ;
    if (n == 0 || v[n] != ':' || (n == 4 && !strncmp(v, "file", 4)))
        return 0;
    if (n == 5 && !strncmp(v, "redis", 5)) {
        if (!strncmp(v + 5, "://", 3))
            return 0;
        return kvqt_usage_error("simulate", "--cold %s: a Redis store is "
                                            "redis://HOST[:PORT][/NAMESPACE]", v);
    }
    return kvqt_usage_error("simulate", "--cold %s: unknown store '%.*s:' (known: file:DIR, "
                                        "redis://HOST[:PORT][/NAMESPACE], none; a directory "
                                        "named so: ./%s)",
                            v, (int)(n < 40 ? n : 40), v, v);
}

/* The options as a whole: the one rule that is broken, or 0. */
static int sim_check(const sim_opts *o, kvq_policy *pol, int window_set, int sinks_set) {
    const char *cmd = "simulate";
    if (sim_parse_policy(o->policy, pol) != 0)
        return kvqt_usage_error(cmd, "--policy must be none, window, fifo or utility, got '%s'",
                                o->policy);
    if (strcmp(o->layout, "token") && strcmp(o->layout, "channel"))
        return kvqt_usage_error(cmd, "--k-layout must be token or channel, got '%s'", o->layout);
    if (o->QH % o->H)
        return kvqt_usage_error(cmd, "--q-heads %zu must be a multiple of --kv-heads %zu", o->QH,
                                o->H);
    /* the cache's max_tokens (KVQ_MAX_TOKENS) holds every token of the run;
     * .npy data clamps both to its tokens */
    if (!strcmp(o->data, "synthetic") && o->prompt + o->decode > KVQ_MAX_TOKENS)
        return kvqt_usage_error(cmd, "--prompt %zu + --decode %zu is %zu tokens, above the "
                                     "cache's limit of 2^30 (%u)",
                                o->prompt, o->decode, o->prompt + o->decode, KVQ_MAX_TOKENS);
    if (o->budget && o->budget_ratio > 0)
        return kvqt_usage_error(cmd, "give --budget or --budget-ratio, not both");
    int budget = o->budget || o->budget_ratio > 0;
    int tiers = o->hot_tokens || o->warm_tokens;
    /* sinks and the protected window also keep pages hot in the tiers */
    if (*pol == KVQ_POLICY_NONE && (budget || (!tiers && (window_set || sinks_set))))
        return kvqt_usage_error(cmd, "%s needs an eviction policy (--policy window, fifo or "
                                     "utility): without one nothing is evicted",
                                o->budget                ? "--budget"
                                : o->budget_ratio > 0    ? "--budget-ratio"
                                : window_set             ? "--window"
                                                         : "--sinks");
    if (*pol != KVQ_POLICY_NONE && !budget)
        return kvqt_usage_error(cmd, "--policy %s needs a budget (--budget N or --budget-ratio "
                                     "R): without one it evicts nothing", o->policy);
    if (o->cold && sim_check_cold(o->cold))
        return KVQT_EXIT_USAGE;
    const char *tier_opt = o->warm_codec ? "--warm-codec" : o->cold ? "--cold"
                         : o->verify ? "--verify" : o->strict ? "--strict-tiers"
                         : o->cold_ttl_ms ? "--cold-ttl" : NULL;
    if (!tiers && tier_opt)
        return kvqt_usage_error(cmd, "%s needs tiers (--hot-tokens N or --warm-tokens N): "
                                     "without them every page stays hot", tier_opt);
    if (o->cold_ttl_ms && !o->cold)
        return kvqt_usage_error(cmd, "--cold-ttl needs a cold store (--cold URL)");
    if (o->progress && o->quiet)
        return kvqt_usage_error(cmd, "give --progress or --quiet, not both");
    return 0;
}

/* Parses the command line into o: 0, KVQT_ARGS_HELP, or the exit code of a
 * usage error (message printed). */
static int sim_args(int argc, char **argv, sim_opts *o, kvq_policy *pol) {
    const size_t M = KVQT_MAX_COUNT;
    size_t window = SIZE_MAX, sinks = SIZE_MAX;
    const char *cold = NULL;
    const kvqt_opt opts[] = {
        KVQT_SIZE("--layers", &o->L, 1, 1024), KVQT_SIZE("--kv-heads", &o->H, 1, 1024),
        KVQT_SIZE("--q-heads", &o->QH, 1, 16384), KVQT_SIZE("--head-dim", &o->d, 1, 1024),
        KVQT_SIZE("--prompt", &o->prompt, 1, M), KVQT_SIZE("--decode", &o->decode, 0, M),
        KVQT_SIZE("--budget", &o->budget, 1, M), KVQT_SIZE("--window", &window, 0, M),
        KVQT_SIZE("--sinks", &sinks, 0, M), KVQT_SIZE("--page", &o->page, 1, 4096),
        KVQT_SIZE("--threads", &o->threads, 1, 256), KVQT_SIZE("--recent", &o->recent, 0, M),
        KVQT_SIZE("--quality-every", &o->every, 1, M),
        KVQT_SIZE("--hot-tokens", &o->hot_tokens, 0, M),
        KVQT_SIZE("--warm-tokens", &o->warm_tokens, 0, M),
        KVQT_SIZE("--cold-ttl", &o->cold_ttl_ms, 0, (size_t)1 << 31),
        KVQT_DOUBLE("--budget-ratio", &o->budget_ratio, 0, 1, 1),
        KVQT_ULL("--seed", &o->seed, 0, ULLONG_MAX), KVQT_STR("--k-codec", &o->kc),
        KVQT_STR("--v-codec", &o->vc), KVQT_STR("--policy", &o->policy),
        KVQT_STR("--k-layout", &o->layout), KVQT_STR("--data", &o->data),
        KVQT_STR("--warm-codec", &o->warm_codec), KVQT_STR("--cold", &cold),
        KVQT_FLAG("--k-prerope", &o->prerope), KVQT_FLAG("--k-center", &o->center),
        KVQT_FLAG("--verify", &o->verify), KVQT_FLAG("--strict-tiers", &o->strict),
        KVQT_FLAG("--json", &o->json), KVQT_FLAG("--progress", &o->progress),
        KVQT_FLAG("--quiet", &o->quiet)};
    int r = kvqt_model_args(argc, argv, "simulate", NULL, NULL, opts, KVQT_NOPTS(opts));
    if (r == KVQT_ARGS_HELP)
        return KVQT_ARGS_HELP;
    if (r != KVQT_ARGS_OK)
        return KVQT_EXIT_USAGE;
    const char *empty = !*o->kc ? "--k-codec" : o->vc && !*o->vc ? "--v-codec"
                      : !*o->data ? "--data" : o->warm_codec && !*o->warm_codec ? "--warm-codec"
                      : cold && !*cold ? "--cold" : NULL;
    if (empty)
        return kvqt_usage_error("simulate", "%s needs a value, got ''", empty);
    o->cold = cold && strcmp(cold, "none") ? cold : NULL;
    o->window = window == SIZE_MAX ? 128 : window;
    o->sinks = sinks == SIZE_MAX ? 4 : sinks;
    return sim_check(o, pol, window != SIZE_MAX, sinks != SIZE_MAX);
}

/* Codec names and options, which do not depend on head_dim: checked before
 * .npy data is read (its head_dim comes from the files). A group that may
 * not divide the files' head_dim is left to sim_try_cache, and so is a key
 * codec in the channel layout (int1..int8, not codecs of their own). 0 or
 * the exit code of a usage error. */
static int sim_check_codec_names(const sim_opts *o) {
    const char *opt[3] = {"--k-codec", "--v-codec", "--warm-codec"};
    const char *val[3] = {strcmp(o->layout, "channel") && strncmp(o->kc, "chan:", 5) ? o->kc : NULL,
                          o->vc, o->warm_codec};
    for (int i = 0; i < 3; i++) {
        if (!val[i])
            continue;
        if (i > 0 && !strncmp(val[i], "chan:", 5)) { /* a key layout, not a value codec */
            const char *b = val[i] + 5;
            int same = !strcmp(b, "int2") || !strcmp(b, "int4") || !strcmp(b, "int8");
            return kvqt_usage_error("simulate",
                                    "%s %s: chan: is a key-only layout (per-channel scales over "
                                    "each page's tokens, as KIVI keys; --k-codec %s or --k-layout "
                                    "channel); %s stored per token: give a per-token codec such as "
                                    "%s (kvq codecs lists them)",
                                    opt[i], val[i], val[i],
                                    i == 1 ? "values are" : "warm pages are re-encoded and",
                                    same ? b : "int4 or tq3");
        }
        if (!strncmp(val[i], "nuq", 3) && val[i][3] >= '1' && val[i][3] <= '8')
            return kvqt_usage_error("simulate",
                                    "%s %s: nuq codecs need per-channel tables fitted to "
                                    "calibration data, which simulate has no option to load: "
                                    "measure them on a model with kvq calibrate --codecs %.4s "
                                    "--target-bits %c -o FILE and kvq eval --alloc FILE",
                                    opt[i], val[i], val[i], val[i][3]);
        char msg[256] = "";
        kvq_codec_params cp = {0};
        cp.err_msg = msg, cp.err_msg_size = sizeof msg;
        kvq_codec *c = NULL;
        kvq_status st = kvq_codec_create(&c, val[i], KVQ_MAX_HEAD_DIM, &cp);
        kvq_codec_free(c);
        if (st == KVQ_ERR_UNKNOWN_CODEC || st == KVQ_ERR_BAD_OPTION)
            return kvqt_usage_error("simulate", "%s %s: %s", opt[i], val[i],
                                    msg[0] ? msg : kvq_strerror(st));
    }
    return 0;
}

/* Creates and frees the cache cfg describes (no cold store, no centre: the
 * codecs and settings only), before any data is made. 0, or the exit code
 * with a message that names the option at fault, found as kvq eval does:
 * each codec in turn replaced by f32. */
static int sim_try_cache(const kvq_cache_config *cfg0, int v_default) {
    kvq_cache_config cfg = *cfg0, t;
    char msg[256] = "", m2[256];
    cfg.err_msg = msg, cfg.err_msg_size = sizeof msg;
    cfg.cold_store = NULL;
    cfg.k_center = 0, cfg.k_center_values = NULL; /* the values come from the data */
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&c, &cfg);
    kvq_cache_free(c);
    if (st == KVQ_OK)
        return 0;
    if (st == KVQ_ERR_NOMEM) {
        fprintf(stderr, "kvq simulate: cache: %s\n", msg[0] ? msg : kvq_strerror(st));
        return KVQT_EXIT_FAIL;
    }
    const char *opt = NULL, *val = NULL, *with = "";
    for (int i = 0; i < 3 && !opt; i++) {
        t = cfg;
        t.err_msg = m2, t.err_msg_size = sizeof m2;
        if (i == 0)
            t.k_codec = "f32", t.k_layout = KVQ_LAYOUT_TOKEN;
        else if (i == 1)
            t.v_codec = "f32";
        else if (cfg.warm_codec)
            t.warm_codec = NULL;
        else
            break;
        c = NULL;
        if (kvq_cache_create(&c, &t) == KVQ_OK) {
            opt = i == 0 ? "--k-codec" : i == 1 ? "--v-codec" : "--warm-codec";
            val = i == 0 ? cfg.k_codec : i == 1 ? cfg.v_codec : cfg.warm_codec;
            with = i == 0 && cfg.k_layout == KVQ_LAYOUT_CHANNEL ? " (with --k-layout channel)"
                   : i == 1 && v_default                         ? " (the default)"
                                                                 : "";
        }
        kvq_cache_free(c);
    }
    char hd[32] = ""; /* the head_dim, where the message leaves it out */
    if (!strstr(msg, "head_dim"))
        snprintf(hd, sizeof hd, " (head_dim %zu)", cfg.head_dim);
    if (opt)
        fprintf(stderr, "kvq simulate: %s %s%s: %s%s\n", opt, val, with, msg, hd);
    else
        fprintf(stderr, "kvq simulate: cache: %s\n", msg[0] ? msg : kvq_strerror(st));
    return kvqt_usage_hint("simulate");
}

/* The memory a run holds at its peak, in bytes (doubles: the product of the
 * largest options is above 2^64). */
typedef struct {
    double data;    /* K, pre-RoPE K, V [L][N][H][d] and Q [L][N][QH][d], f32 */
    double f32;     /* the f32 caches: every token, and the same eviction's tokens */
    double cache;   /* the kvq cache (and its all-hot copy with tiers) */
    double bufs;    /* per-token buffers of the comparison, the centre, the program */
    double total;
} sim_mem;

/* Estimates the run's peak: the data, the caches and buffers the prefill
 * and decode add, and 32 MiB for the program, its libraries and stacks.
 * (The generator's scratch, the keys' varying parts, is one key array,
 * freed before the prefill: less than the f32 reference cache's two, so it
 * never sets the peak.) A cache holds its
 * tokens at page_tokens granularity; with a policy at most the budget (or
 * the protected tokens) plus one prefill chunk, appended before the attend
 * that evicts. Metadata: a position, a state and a score per KV head per
 * token (the f32 demo cache holds 22 bytes per token and layer with 8 KV
 * heads; 8 + 4 H = 40 here). kv_bytes: the kvq cache's encoded bytes of one
 * token's K and V vectors in one KV head. */
static void sim_estimate(const sim_opts *o, kvq_policy pol, size_t L, size_t H, size_t QH,
                         size_t d, size_t N, size_t prompt, double kv_bytes, sim_mem *m) {
    double l = (double)L, n = (double)N, h = (double)H, dd = (double)d;
    double kv = l * n * h * dd * 4;
    m->data = 3 * kv + l * n * (double)QH * dd * 4;
    double held = n;
    if (pol != KVQ_POLICY_NONE) {
        double b = o->budget ? (double)o->budget : ceil(o->budget_ratio * (double)prompt);
        double prot = (double)o->window + (double)o->sinks;
        held = fmin(n, fmax(b, prot) + SIM_CHUNK);
    }
    double page = (double)o->page;
    double pages_all = ceil(n / page) + 1, pages_held = ceil(held / page) + 1;
    double meta = 8 + 4 * h;
    double f32_tok = h * 2 * dd * 4 + meta;
    m->f32 = l * page * (pages_all + pages_held) * f32_tok;
    double tok = h * kv_bytes + meta;
    double staging = l * fmin((double)o->recent, n) * h * 2 * dd * 2; /* f16 recent window */
    m->cache = (l * page * pages_held * tok + staging) * (o->hot_tokens || o->warm_tokens ? 2 : 1);
    m->bufs = 2 * h * n * 4 + 2 * n * 4 + 2 * (n + 1) * 8 + 64 * (double)QH * dd * 4 +
              (o->center ? l * h * dd * 4 : 0);
    m->bufs += 32.0 * 1048576;
    m->total = m->data + m->f32 + m->cache + m->bufs;
}

/* Bytes as "12.3 MiB". */
static void sim_bytes(double b, char *buf, size_t size) {
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
    int i = 0;
    while (b >= 1024 && i < 7)
        b /= 1024, i++;
    snprintf(buf, size, i ? "%.1f %s" : "%.0f %s", b, unit[i]);
}

/* A number from the first line of a file: 1 and *v, or 0 (missing, "max"). */
static int sim_read_num(const char *path, double *v) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long x;
    int ok = fscanf(f, "%llu", &x) == 1;
    fclose(f);
    if (ok)
        *v = (double)x;
    return ok;
}

/* The memory this process may use, in bytes (0: unknown), and in src where
 * the figure comes from: MemAvailable of /proc/meminfo (free memory and
 * what the kernel can reclaim), else the free physical pages (sysconf),
 * lowered by a cgroup's limit less what the group uses (v2 memory.max, v1
 * memory.limit_in_bytes) and by ulimit -v / -d (RLIMIT_AS, RLIMIT_DATA). */
static double sim_mem_limit(char *src, size_t size) {
    double lim = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                lim = (double)kb * 1024;
                snprintf(src, size, "MemAvailable in /proc/meminfo");
                break;
            }
        fclose(f);
    }
    if (lim == 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) {
            lim = (double)pages * (double)psz;
            snprintf(src, size, "free physical memory");
        }
    }
    /* the cgroup: its own folder (v2 "0::/path", v1 "N:memory:/path"), else
     * the mount's root, which is the group inside a container */
    char grp[512] = "", path[700];
    int v2 = 0;
    f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (!strncmp(line, "0::", 3) && !grp[0])
                snprintf(grp, sizeof grp, "%s", line + 3), v2 = 1;
            const char *m = strstr(line, ":memory:");
            if (m)
                snprintf(grp, sizeof grp, "%s", m + 8), v2 = 0;
        }
        fclose(f);
    }
    const char *base = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const char *fmax_name = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *fcur_name = v2 ? "memory.current" : "memory.usage_in_bytes";
    for (int i = 0; i < 2; i++) {
        double mx, cur = 0;
        snprintf(path, sizeof path, "%s%s/%s", base, i ? "" : grp, fmax_name);
        if (!sim_read_num(path, &mx))
            continue;
        snprintf(path, sizeof path, "%s%s/%s", base, i ? "" : grp, fcur_name);
        sim_read_num(path, &cur);
        if (mx < 0x1p60 && (lim == 0 || mx - cur < lim)) {
            lim = mx > cur ? mx - cur : 1;
            snprintf(src, size, "the cgroup's %s less its usage", fmax_name);
        }
        break;
    }
    const int res[2] = {RLIMIT_AS, RLIMIT_DATA};
    const char *rname[2] = {"ulimit -v, RLIMIT_AS", "ulimit -d, RLIMIT_DATA"};
    for (int i = 0; i < 2; i++) {
        struct rlimit rl;
        if (getrlimit(res[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
            (lim == 0 || (double)rl.rlim_cur < lim)) {
            lim = (double)rl.rlim_cur;
            snprintf(src, size, "%s", rname[i]);
        }
    }
    return lim;
}

/* Refuses a run of est bytes above the limit: 0, or KVQT_EXIT_FAIL (the
 * machine's memory is the world, not the command line) with both figures. */
static int sim_fits(const sim_mem *m, double limit, const char *src, int real) {
    if (limit <= 0 || m->total <= limit)
        return 0;
    char t[32], lm[32], a[32], b[32], c[32], e[32];
    sim_bytes(m->total, t, sizeof t), sim_bytes(limit, lm, sizeof lm);
    sim_bytes(m->data, a, sizeof a), sim_bytes(m->f32, b, sizeof b);
    sim_bytes(m->cache, c, sizeof c), sim_bytes(m->bufs, e, sizeof e);
    fprintf(stderr,
            "kvq simulate: the run needs about %s of memory, more than the %s available (%s): "
            "K/V/Q data %s, f32 caches %s, this cache %s, buffers and the program %s; %s\n",
            t, lm, src, a, b, c, e,
            real ? "use fewer layers or tokens in the .npy files"
                 : "lower --prompt, --decode, --layers, --kv-heads, --q-heads or --head-dim");
    return KVQT_EXIT_FAIL;
}

/* The figures of one cache against exact attention. */
static void sim_figures(const sim_quality *q, double *rel, double *kl, double *kept, double *nlk) {
    *rel = q->ref2 > 0 ? sqrt(q->err2 / q->ref2) : 0;
    *kl = q->n_kl ? fmax(q->kl / (double)q->n_kl, 0) : 0; /* < 0: rounding of a zero */
    *kept = q->n_kl ? q->kept / (double)q->n_kl : 0;
    *nlk = q->n_kl ? q->nlk / (double)q->n_kl : 0;
}

/* What a figure is, under its row: indented 8, in lines of at most 96
 * characters broken at spaces. */
static void sim_meaning(const char *s) {
    while (*s) {
        size_t n = strlen(s);
        if (n > 88) {
            n = 88;
            while (n > 0 && s[n] != ' ')
                n--;
            if (n == 0)
                n = strcspn(s, " ");
        }
        printf("        %.*s\n", (int)n, s);
        s += n;
        while (*s == ' ')
            s++;
    }
}

/* A row of the text tables: the label, ncol figures with prec decimals,
 * and below it what the figure is. */
static void sim_row(int ncol, const char *label, int prec, double a, double b, double c,
                    const char *meaning) {
    const double v[3] = {a, b, c};
    const int w[3] = {12, 18, 16};
    printf("  %-30s", label);
    for (int i = 0; i < ncol; i++)
        printf(" %*.*f", w[i], prec, v[i]);
    printf("\n");
    sim_meaning(meaning);
}

int kvq_tool_simulate(int argc, char **argv) {
    sim_opts o = {.L = 8, .H = 8, .QH = 32, .d = 128, .prompt = 2048, .decode = 512,
                  .window = 128, .sinks = 4, .page = 16, .threads = 1, .every = 16,
                  .kc = "int8", .policy = "none", .layout = "token", .data = "synthetic",
                  .seed = 1};
    kvq_policy pol = KVQ_POLICY_NONE;
    int r = sim_args(argc, argv, &o, &pol);
    if (r == KVQT_ARGS_HELP) {
        sim_usage(stdout);
        return KVQT_EXIT_OK;
    }
    if (r)
        return r;
    sim_progress pr = {0};
    pr.tty = isatty(2);
    pr.on = o.progress || (!o.quiet && pr.tty);
    sim_data D = {0};
    D.L = o.L, D.H = o.H, D.QH = o.QH, D.d = o.d, D.prompt = o.prompt, D.decode = o.decode;
    D.N = o.prompt + o.decode;
    int real = strcmp(o.data, "synthetic") != 0;
    char lim_src[96] = "";
    double limit = sim_mem_limit(lim_src, sizeof lim_src);
    char note[256], b1[32], b2[32];
    kvq_store *store = NULL;
    kvq_cache *cache = NULL, *ref = NULL, *allhot = NULL, *fev = NULL;
    float *out = NULL, *tattn = NULL, *ftattn = NULL, *center = NULL;
    int32_t *pos = NULL, *fpos = NULL, *qpos = NULL;
    double *p = NULL, *pg = NULL;
    char *js = NULL;
    int rc = KVQT_EXIT_FAIL;
    /* everything that can be checked is checked before any data is made:
     * the options, the cache they describe, the memory the run needs; .npy
     * data gives the shape, so the cache is checked once it is read (its
     * files are first held against the memory there is) */
    if ((r = sim_check_codec_names(&o)) != 0)
        return r;
    if (real) {
        double bytes = 0;
        const char *names[4] = {"k.npy", "k_prerope.npy", "v.npy", "q.npy"};
        for (int i = 0; i < 4; i++) {
            char path[4096];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", o.data, names[i]);
            if (stat(path, &sb) == 0)
                bytes += (double)sb.st_size; /* a missing file: sim_load names it */
        }
        if (limit > 0 && bytes > limit) {
            sim_bytes(bytes, b1, sizeof b1), sim_bytes(limit, b2, sizeof b2);
            fprintf(stderr, "kvq simulate: --data %s: the .npy files hold %s, more than the %s "
                            "of memory available (%s)\n", o.data, b1, b2, lim_src);
            return KVQT_EXIT_FAIL;
        }
        if (sim_load(&D, o.data) != 0)
            goto done;
    }
    size_t L = D.L, H = D.H, QH = D.QH, d = D.d, N = D.N;
    int v_default = !o.vc;
    if (v_default)
        o.vc = d % 32 == 0 ? SIM_DEFAULT_V : SIM_DEFAULT_V_SMALL;

    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    char msg[256] = "";
    cfg.n_layers = L, cfg.n_kv_heads = H, cfg.n_q_heads = QH, cfg.head_dim = d;
    cfg.max_tokens = N;
    cfg.k_codec = o.kc, cfg.v_codec = o.vc;
    cfg.page_tokens = o.page, cfg.recent_window = o.recent, cfg.sinks = o.sinks;
    cfg.policy = pol, cfg.budget_tokens = o.budget, cfg.budget_ratio = o.budget_ratio;
    cfg.protect_recent = o.window;
    cfg.k_layout = strcmp(o.layout, "channel") ? KVQ_LAYOUT_TOKEN : KVQ_LAYOUT_CHANNEL;
    cfg.k_prerope = o.prerope, cfg.k_center = o.center, cfg.n_threads = o.threads;
    int tiers = o.hot_tokens || o.warm_tokens;
    cfg.hot_tokens = o.hot_tokens, cfg.warm_tokens = o.warm_tokens;
    cfg.warm_codec = o.warm_codec, cfg.verify_tiers = o.verify;
    cfg.strict_tiers = o.strict, cfg.cold_ttl_ms = o.cold_ttl_ms;
    cfg.err_msg = msg, cfg.err_msg_size = sizeof msg;
    if ((r = sim_try_cache(&cfg, v_default)) != 0) {
        rc = r;
        goto done;
    }
    /* the kvq cache's bytes per token and KV head: its codecs' vector bytes
     * (f32's where a codec is not one on its own, a channel layout's key) */
    double kv_bytes = 0;
    const char *specs[2] = {o.kc, o.vc};
    for (int i = 0; i < 2; i++) {
        kvq_codec *c = NULL;
        kv_bytes += kvq_codec_create(&c, specs[i], d, NULL) == KVQ_OK
                        ? (double)kvq_codec_vector_bytes(c) : 4.0 * (double)d;
        kvq_codec_free(c);
    }
    sim_mem mem;
    sim_estimate(&o, pol, L, H, QH, d, N, D.prompt, kv_bytes, &mem);
    if ((r = sim_fits(&mem, limit, lim_src, real)) != 0) {
        rc = r;
        goto done;
    }
    sim_bytes(mem.total, b1, sizeof b1), sim_bytes(limit, b2, sizeof b2);
    snprintf(note, sizeof note, "about %s of memory needed, %s available (%s)", b1,
             limit > 0 ? b2 : "unknown", limit > 0 ? lim_src : "not found");
    sim_note(&pr, note);
    /* the cold store opens once the configuration passed (opening may make
     * its directory): a URL the store refuses is a usage error, a store
     * that cannot be reached a failure */
    if (o.cold) {
        char serr[256] = "";
        kvq_status sst = kvq_store_open(&store, o.cold, NULL, serr, sizeof serr);
        if (sst != KVQ_OK) {
            fprintf(stderr, "kvq simulate: --cold %s: %s\n", o.cold,
                    serr[0] ? serr : kvq_strerror(sst));
            if (sst == KVQ_ERR_INVALID_ARG)
                rc = kvqt_usage_hint("simulate");
            goto done;
        }
    }
    if (!real && sim_synth(&D, o.seed, &pr) != 0) {
        sim_progress_end(&pr);
        fprintf(stderr, "kvq simulate: out of memory for the workload\n");
        goto done;
    }
    /* --k-center: channel means of the prompt's keys, known when the prompt
     * is prefilled (the library takes a centre only as given values) */
    if (o.center) {
        const float *Ks = o.prerope ? D.kpre : D.k;
        size_t np = D.prompt ? D.prompt : 1;
        center = calloc(L * H * d, sizeof(float));
        for (size_t l = 0; center && l < L; l++)
            for (size_t t = 0; t < np && t < N; t++)
                for (size_t i = 0; i < H * d; i++)
                    center[l * H * d + i] += Ks[(l * N + t) * H * d + i] / (float)np;
        cfg.k_center_values = center;
    }
    kvq_cache_config hot_cfg = cfg; /* the same cache with every page hot */
    hot_cfg.hot_tokens = hot_cfg.warm_tokens = 0, hot_cfg.warm_codec = NULL;
    hot_cfg.verify_tiers = hot_cfg.strict_tiers = 0, hot_cfg.cold_ttl_ms = 0;
    /* the f32 cache with the same eviction: what eviction alone costs */
    kvq_cache_config ev_cfg;
    kvq_cache_config_init(&ev_cfg);
    ev_cfg.n_layers = L, ev_cfg.n_kv_heads = H, ev_cfg.n_q_heads = QH, ev_cfg.head_dim = d;
    ev_cfg.max_tokens = N, ev_cfg.k_codec = "f32", ev_cfg.v_codec = "f32";
    ev_cfg.page_tokens = o.page, ev_cfg.sinks = o.sinks, ev_cfg.policy = pol;
    ev_cfg.budget_tokens = o.budget, ev_cfg.budget_ratio = o.budget_ratio;
    ev_cfg.protect_recent = o.window, ev_cfg.n_threads = o.threads;
    /* the f32 cache without eviction: the time baseline */
    kvq_cache_config rcfg;
    kvq_cache_config_init(&rcfg);
    rcfg.n_layers = L, rcfg.n_kv_heads = H, rcfg.n_q_heads = QH, rcfg.head_dim = d;
    rcfg.max_tokens = N, rcfg.k_codec = "f32", rcfg.v_codec = "f32", rcfg.page_tokens = o.page;
    rcfg.n_threads = o.threads;
    cfg.cold_store = store;
    kvq_status st = o.center && !center ? KVQ_ERR_NOMEM : kvq_cache_create(&cache, &cfg);
    if (st == KVQ_OK && tiers)
        st = kvq_cache_create(&allhot, &hot_cfg);
    if (st == KVQ_OK)
        st = kvq_cache_create(&ref, &rcfg);
    if (st == KVQ_OK)
        st = kvq_cache_create(&fev, &ev_cfg);
    out = malloc(QH * d * sizeof(float) * 64), tattn = malloc(H * N * sizeof(float));
    ftattn = malloc(H * N * sizeof(float));
    pos = malloc(N * sizeof(int32_t)), fpos = malloc(N * sizeof(int32_t));
    qpos = malloc(64 * sizeof(int32_t));
    p = malloc((N + 1) * sizeof(double)), pg = malloc((N + 1) * sizeof(double));
    if (st != KVQ_OK || !out || !tattn || !ftattn || !pos || !fpos || !qpos || !p || !pg) {
        sim_progress_end(&pr);
        fprintf(stderr, "kvq simulate: cache: %s\n",
                st != KVQ_OK && msg[0] ? msg : kvq_strerror(st != KVQ_OK ? st : KVQ_ERR_NOMEM));
        goto done;
    }
    const float *K = o.prerope ? D.kpre : D.k;
    /* prefill in chunks of SIM_CHUNK tokens, attending with the chunk's last
     * 8 queries (chunked prefill: utility scores see the prompt); the
     * appends are timed per cache */
    unsigned long retries = 0;
    double t_app = 0, t_app_ref = 0, t_app_fev = 0;
    size_t n_app = 0;
    sim_phase(&pr);
    for (size_t t0 = 0; t0 < D.prompt && st == KVQ_OK; t0 += SIM_CHUNK) {
        size_t m = D.prompt - t0 < SIM_CHUNK ? D.prompt - t0 : SIM_CHUNK;
        for (size_t l = 0; l < L && st == KVQ_OK; l++) {
            int32_t pp[SIM_CHUNK];
            for (size_t i = 0; i < m; i++)
                pp[i] = (int32_t)(t0 + i);
            const float *kk = K + (l * N + t0) * H * d, *vv = D.v + (l * N + t0) * H * d;
            const float *kref = D.k + (l * N + t0) * H * d;
            double a0 = kvqb_now();
            st = kvq_cache_append(cache, l, kk, vv, pp, m);
            double a1 = kvqb_now();
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, kref, vv, pp, m);
            double a2 = kvqb_now();
            if (st == KVQ_OK)
                st = kvq_cache_append(fev, l, kref, vv, pp, m);
            double a3 = kvqb_now();
            t_app += a1 - a0, t_app_ref += a2 - a1, t_app_fev += a3 - a2;
            if (st == KVQ_OK && allhot)
                st = kvq_cache_append(allhot, l, kk, vv, pp, m);
            n_app += m;
            size_t nq = m < 8 ? m : 8;
            for (size_t i = 0; i < nq; i++)
                qpos[i] = (int32_t)(t0 + m - nq + i);
            const float *qq = D.q + (l * N + t0 + m - nq) * QH * d;
            if (st == KVQ_OK)
                st = sim_attend(cache, l, qq, qpos, nq, out, QH * d * 64, NULL, 0, &retries);
            if (st == KVQ_OK)
                st = kvq_cache_attend(fev, l, qq, qpos, nq, out, QH * d * 64, NULL, 0);
            if (st == KVQ_OK && allhot)
                st = kvq_cache_attend(allhot, l, qq, qpos, nq, out, QH * d * 64, NULL, 0);
        }
        if (sim_due(&pr))
            sim_show(&pr, (double)(t0 + m) / (double)D.prompt, 0, "prefill %zu/%zu tokens",
                     t0 + m, D.prompt);
    }
    if (st == KVQ_OK)
        sim_show(&pr, 1, 1, "prefill %zu/%zu tokens", D.prompt, D.prompt);
    /* decode: each step appends and attends in every layer of each cache,
     * timed per cache; every o.every-th step (and the last) is compared
     * with exact attention */
    sim_quality qa = {0}, fqa = {0};
    double hot_err2 = 0, hot_ref2 = 0, cf_err2 = 0, cf_ref2 = 0;
    double t_dec = 0, t_dec_ref = 0, t_dec_fev = 0, t_dapp = 0, t_dapp_ref = 0, t_dapp_fev = 0;
    long skipped_lost = 0; /* samples (per KV head) not taken: a cold page was lost */
    size_t n_dapp = 0;
    sim_phase(&pr);
    for (size_t s = 0; s < D.decode && st == KVQ_OK; s++) {
        size_t t = D.prompt + s;
        int32_t pt = (int32_t)t;
        int sample = (s % o.every) == 0 || s + 1 == D.decode;
        for (size_t l = 0; l < L && st == KVQ_OK; l++) {
            const float *q = D.q + (l * N + t) * QH * d;
            const float *vv = D.v + (l * N + t) * H * d, *kref = D.k + (l * N + t) * H * d;
            double a0 = kvqb_now();
            st = kvq_cache_append(cache, l, K + (l * N + t) * H * d, vv, &pt, 1);
            double a1 = kvqb_now();
            /* token_attn covers the tokens the queries see: those stored
             * before the attend (its eviction comes after), read now */
            size_t n = 0, fn = 0;
            uint64_t lost0 = 0;
            if (st == KVQ_OK && sample) {
                kvq_cache_tokens(cache, l, &n);
                kvq_cache_positions(cache, l, pos, N);
                kvq_tier_stats ls;
                kvq_cache_tier_stats(cache, &ls);
                lost0 = ls.lost_tokens;
            }
            if (st == KVQ_OK)
                st = sim_attend(cache, l, q, &pt, 1, out, QH * d, sample ? tattn : NULL, H * N,
                                &retries);
            double a2 = kvqb_now();
            t_dapp += a1 - a0, t_dec += a2 - a0;
            n_dapp++;
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, kref, vv, &pt, 1);
            double a3 = kvqb_now();
            float *ro = out + QH * d;
            if (st == KVQ_OK)
                st = kvq_cache_attend(ref, l, q, &pt, 1, ro, QH * d, NULL, 0);
            double a4 = kvqb_now();
            t_dapp_ref += a3 - a2, t_dec_ref += a4 - a2;
            float *fo = out + 3 * QH * d;
            if (st == KVQ_OK)
                st = kvq_cache_append(fev, l, kref, vv, &pt, 1);
            double a5 = kvqb_now();
            if (st == KVQ_OK && sample) {
                kvq_cache_tokens(fev, l, &fn);
                kvq_cache_positions(fev, l, fpos, N);
            }
            if (st == KVQ_OK)
                st = kvq_cache_attend(fev, l, q, &pt, 1, fo, QH * d, sample ? ftattn : NULL,
                                      H * N);
            t_dapp_fev += a5 - a4, t_dec_fev += kvqb_now() - a4;
            if (st == KVQ_OK && allhot) {
                float *ho = out + 2 * QH * d;
                st = kvq_cache_append(allhot, l, K + (l * N + t) * H * d, vv, &pt, 1);
                if (st == KVQ_OK)
                    st = kvq_cache_attend(allhot, l, q, &pt, 1, ho, QH * d, NULL, 0);
                for (size_t i = 0; i < QH * d && st == KVQ_OK; i++) {
                    double e = (double)out[i] - ho[i];
                    hot_err2 += e * e;
                    hot_ref2 += (double)ho[i] * ho[i];
                }
            }
            kvq_tier_stats ls;
            /* a lost cold page's tokens were dropped inside the attend, so
             * its token_attn covers fewer tokens: that step is not sampled */
            if (st == KVQ_OK && sample && kvq_cache_tier_stats(cache, &ls) == KVQ_OK &&
                ls.lost_tokens != lost0)
                skipped_lost += H;
            else if (st == KVQ_OK && sample) {
                sim_view vw[2] = {{out, tattn, pos, n, &qa}, {fo, ftattn, fpos, fn, &fqa}};
                sim_reference(&D, l, t, vw, 2, p, pg);
                for (size_t i = 0; i < QH * d; i++) { /* the codecs against f32 alone */
                    double e = (double)out[i] - fo[i];
                    cf_err2 += e * e;
                    cf_ref2 += (double)fo[i] * fo[i];
                }
            }
        }
        if (sim_due(&pr))
            sim_show(&pr, (double)(s + 1) / (double)D.decode, 0, "decode %zu/%zu tokens", s + 1,
                     D.decode);
    }
    if (st == KVQ_OK && D.decode)
        sim_show(&pr, 1, 1, "decode %zu/%zu tokens", D.decode, D.decode);
    sim_progress_end(&pr);
    if (st != KVQ_OK) {
        const char *detail = kvq_cache_last_error(cache);
        fprintf(stderr, "kvq simulate: %s%s%s\n", kvq_strerror(st), detail[0] ? ": " : "", detail);
        goto done;
    }
    kvq_tier_stats tst;
    kvq_cache_tier_stats(cache, &tst);
    double steps = D.decode ? (double)D.decode : 1, appends = (double)(n_app + n_dapp);
    if (appends == 0)
        appends = 1;
    double step_ms = t_dec / steps * 1e3, ref_ms = t_dec_ref / steps * 1e3;
    double fev_ms = t_dec_fev / steps * 1e3;
    double app_ns = (t_app + t_dapp) / appends * 1e9;
    double app_ref_ns = (t_app_ref + t_dapp_ref) / appends * 1e9;
    double app_fev_ns = (t_app_fev + t_dapp_fev) / appends * 1e9;
    double rel, kl, kept, nlk, frel, fkl, fkept, fnlk;
    sim_figures(&qa, &rel, &kl, &kept, &nlk);
    sim_figures(&fqa, &frel, &fkl, &fkept, &fnlk);
    double cfrel = cf_ref2 > 0 ? sqrt(cf_err2 / cf_ref2) : 0;
    double hot_rel = hot_ref2 > 0 ? sqrt(hot_err2 / hot_ref2) : 0.0;
    struct rusage ru;
    double rss = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024 : 0; /* kB */
    size_t jl;
    kvq_cache_stats_json(cache, NULL, 0, &jl);
    js = malloc(jl + 1);
    if (!js || kvq_cache_stats_json(cache, js, jl + 1, &jl) != KVQ_OK) {
        fprintf(stderr, "kvq simulate: out of memory\n");
        goto done;
    }
    kvq_stats tot, rtot, ftot;
    kvq_cache_stats(cache, -1, &tot);
    kvq_cache_stats(ref, -1, &rtot);
    kvq_cache_stats(fev, -1, &ftot);
    /* cold pages' records are in the store, not in the cache's stored bytes */
    uint64_t cold_tok = tst.tokens[2], res_tok = tot.tokens - cold_tok;
    double vals_per_tok = (double)(H * d * 2);
    double res_bits = res_tok ? (double)tot.payload_bytes * 8 / ((double)res_tok * vals_per_tok) : 0;
    double cold_bits = cold_tok ? (double)tst.bytes[2] * 8 / ((double)cold_tok * vals_per_tok) : 0;
    const char *desc = real ? "real K/V/Q from .npy files" : "";
    if (o.json) {
        printf("{\"config\": {\"layers\": %zu, \"kv_heads\": %zu, \"q_heads\": %zu, \"head_dim\": "
               "%zu, \"prompt\": %zu, \"decode\": %zu, \"k_codec\": ",
               L, H, QH, d, D.prompt, D.decode);
        kvqb_json_str(stdout, o.kc);
        printf(", \"v_codec\": ");
        kvqb_json_str(stdout, o.vc);
        printf(", \"k_layout\": \"%s\", \"k_prerope\": %s, \"k_center\": %s, \"policy\": \"%s\", "
               "\"budget\": %zu, \"budget_ratio\": %g, \"window\": %zu, \"sinks\": %zu, \"page\": "
               "%zu, \"recent\": %zu, \"threads\": %zu, \"seed\": %llu, \"data\": ",
               o.layout, o.prerope ? "true" : "false", o.center ? "true" : "false", o.policy,
               o.budget, o.budget_ratio, o.window, o.sinks, o.page, o.recent, o.threads, o.seed);
        kvqb_json_str(stdout, o.data);
        printf(", \"data_description\": ");
        if (real)
            kvqb_json_str(stdout, desc);
        else
            printf("\"" SIM_SYNTH_TEXT "\"");
        printf("}, \"stats\": %s, \"accounting\": {\"tokens\": %llu, \"tokens_cold\": %llu, "
               "\"cold_record_bytes\": %llu, \"bits_per_value_resident\": %.6g, "
               "\"bits_per_value_cold_records\": %.6g}",
               js, (unsigned long long)tot.tokens, (unsigned long long)cold_tok,
               (unsigned long long)tst.bytes[2], res_bits, cold_bits);
        printf(", \"quality\": {\"attn_rel_err\": %.6g, \"attn_kl\": %.6g, "
               "\"attn_mass_kept\": %.6g, \"attn_kl_eviction_only\": %.6g, \"samples\": %ld, "
               "\"samples_skipped_lost\": %ld, \"attn_rel_err_vs_f32_same_eviction\": %.6g, "
               "\"f32_same_eviction\": "
               "{\"attn_rel_err\": %.6g, \"attn_kl\": %.6g, \"attn_mass_kept\": %.6g, "
               "\"attn_kl_eviction_only\": %.6g, \"tokens\": %llu, \"tokens_evicted\": %llu}",
               rel, kl, kept, nlk, qa.n_kl, skipped_lost, cfrel, frel, fkl, fkept, fnlk,
               (unsigned long long)ftot.tokens, (unsigned long long)ftot.tokens_evicted);
        if (allhot)
            printf(", \"attn_rel_err_vs_all_hot\": %.6g, \"lost_pages\": %llu, \"lost_tokens\": "
                   "%llu, \"store_retries\": %lu",
                   hot_rel, (unsigned long long)tst.lost_pages,
                   (unsigned long long)tst.lost_tokens, retries);
        printf("}, \"timing\": {\"decode_step_ms\": "
               "%.4f, \"append_ns_per_token\": %.1f, \"f32_decode_step_ms\": %.4f, "
               "\"ratio_vs_f32\": %.4f, \"f32_stored_bytes\": %llu, \"f32_append_ns_per_token\": "
               "%.1f, \"f32_same_eviction_decode_step_ms\": %.4f, "
               "\"f32_same_eviction_append_ns_per_token\": %.1f}",
               step_ms, app_ns, ref_ms, ref_ms > 0 ? step_ms / ref_ms : 0,
               (unsigned long long)rtot.stored_bytes, app_ref_ns, fev_ms, app_fev_ns);
        printf(", \"memory\": {\"estimate_bytes\": %.0f, \"limit_bytes\": %.0f, "
               "\"limit_source\": ", mem.total, limit);
        kvqb_json_str(stdout, lim_src);
        printf(", \"peak_rss_bytes\": %.0f}}\n", rss);
    } else {
        printf("kvq simulate: %zu layers, %zu KV heads, %zu query heads, head_dim %zu, prompt %zu, "
               "decode %zu, %zu thread(s)\n",
               L, H, QH, d, D.prompt, D.decode, o.threads);
        if (real)
            printf("data: %s, %s\n", o.data, desc);
        else
            printf("data: " SIM_SYNTH_TEXT ", seed %llu\n", o.seed);
        printf("cache: K %s (%s%s%s), V %s%s, page %zu, recent f16 window %zu, policy %s", o.kc,
               o.layout, o.prerope ? ", pre-RoPE" : "", o.center ? ", centred" : "", o.vc,
               v_default ? " (default)" : "", o.page, o.recent, o.policy);
        if (pol != KVQ_POLICY_NONE)
            printf(" (budget %zu%s, sinks %zu, protected %zu)",
                   o.budget ? o.budget : (size_t)ceil(o.budget_ratio * (double)D.prompt),
                   o.budget_ratio > 0 ? " from ratio" : "", o.sinks, o.window);
        printf("\nbaselines, run beside this cache on the same K/V/Q: exact attention in double "
               "precision\n  over every token (the 0 of the error figures), an f32 cache with "
               "the same eviction (what\n  eviction alone costs) and an f32 cache without "
               "eviction (every token kept; the time\n  baseline). Under each figure, what it "
               "measures.\n\n");
        const double MiB = 1048576.0;
        printf("  %-30s %12s %18s %16s\n", "memory and time (all layers)", "this cache",
               "f32 same eviction", "f32 no eviction");
        sim_row(3, "tokens stored", 0, (double)tot.tokens, (double)ftot.tokens,
                (double)rtot.tokens,
                "tokens held at the end, summed over layers; without eviction (prompt + decode) "
                "x layers");
        if (tiers)
            sim_row(3, "  of which in the cold tier", 0, (double)cold_tok, 0, 0,
                    "tokens whose pages went to the cold store (the f32 caches keep all in "
                    "memory)");
        sim_row(3, "tokens evicted", 0, (double)tot.tokens_evicted, (double)ftot.tokens_evicted,
                (double)rtot.tokens_evicted,
                "tokens the policy dropped (and those of lost cold pages); 0 = every token kept");
        sim_row(3, tiers ? "stored MiB (hot and warm)" : "stored MiB", 2,
                (double)tot.stored_bytes / MiB, (double)ftot.stored_bytes / MiB,
                (double)rtot.stored_bytes / MiB,
                "memory the cache holds at the end: payload + metadata; lower is better");
        sim_row(3, "  payload MiB", 2, (double)tot.payload_bytes / MiB,
                (double)ftot.payload_bytes / MiB, (double)rtot.payload_bytes / MiB,
                "the encoded K/V (scales included) and the f16 staging of tokens not yet encoded");
        sim_row(3, "  metadata MiB", 2, (double)tot.metadata_bytes / MiB,
                (double)ftot.metadata_bytes / MiB, (double)rtot.metadata_bytes / MiB,
                "page tables and per-token positions, states and scores");
        sim_row(3, "peak stored MiB", 2, (double)tot.peak_stored_bytes / MiB,
                (double)ftot.peak_stored_bytes / MiB, (double)rtot.peak_stored_bytes / MiB,
                "the most the cache held at any time in the run: what to provision");
        if (tiers) {
            sim_row(3, "cold tier records MiB", 2, (double)tst.bytes[2] / MiB, 0, 0,
                    "bytes of this cache's page records in the cold store");
            sim_row(3, "bits per value (hot and warm)", 3, res_bits, ftot.bits_per_value,
                    rtot.bits_per_value,
                    "payload bits per K or V value held in memory (pages partly filled count: "
                    "f32 in full pages is 32)");
            sim_row(3, "bits per value (cold records)", 3, cold_bits, 0, 0,
                    "record bits per K or V value in the cold store (headers and checksums "
                    "included)");
        } else {
            sim_row(3, "bits per value (payload)", 3, tot.bits_per_value, ftot.bits_per_value,
                    rtot.bits_per_value,
                    "payload bits per stored K or V value (pages partly filled count: f32 in "
                    "full pages is 32)");
            sim_row(3, "bits per value (all bytes)", 3, tot.total_bits_per_value,
                    ftot.total_bits_per_value, rtot.total_bits_per_value,
                    "the same with the metadata counted");
        }
        sim_row(3, "fragmentation", 4, tot.fragmentation, ftot.fragmentation,
                rtot.fragmentation,
                "free token slots / all slots of the allocated pages; 0 = no waste (eviction "
                "leaves holes)");
        sim_row(3, "MiB read by attention", 2, (double)tot.bytes_read / MiB,
                (double)ftot.bytes_read / MiB, (double)rtot.bytes_read / MiB,
                "bytes attention scanned over the whole run: memory traffic; lower is better");
        sim_row(3, "MiB written (encoded)", 2, (double)tot.bytes_written / MiB,
                (double)ftot.bytes_written / MiB, (double)rtot.bytes_written / MiB,
                "bytes the encoders produced over the run (appends and re-encodes)");
        sim_row(3, "decode step ms", 4, step_ms, fev_ms, ref_ms,
                "one decode step: append + attention in every layer; lower is faster (this "
                "machine)");
        sim_row(3, "append ns/token/layer", 1, app_ns, app_fev_ns, app_ref_ns,
                "appending (encoding and storing) one token in one layer, prefill and decode");
        printf("\n  %-30s %12s %18s\n",
               "quality vs exact attention", "this cache", "f32 same eviction");
        printf("  (%ld samples: one every %zu decode steps and the last, in each layer and KV "
               "head)\n", qa.n_kl, o.every);
        sim_row(2, "attention output rel. error", 5, rel, frel, 0,
                "||out - exact|| / ||exact||; 0 = exact, 1 = as far off as an output of 0");
        sim_row(2, "rel. error vs the f32 cache", 5, cfrel, 0, 0,
                "||out - out of the f32 cache with the same eviction|| / ||that||: what the "
                "codecs add");
        char m[400];
        sim_row(2, "KL(cache || exact) of weights", 5, kl, fkl, 0,
                "KL divergence of the attention weights (per KV head, nats) from the exact; 0 = "
                "the same");
        snprintf(m, sizeof m,
                 "-log(exact mass kept), JSON attn_kl_eviction_only: no cache holding only the "
                 "kept tokens has a lower KL; 0 without eviction; an exact cache reaches it when "
                 "each KV head serves one query head %s",
                 QH > H ? "(here several share one and renormalise apart: the f32 cache stays "
                         "above it)"
                       : "(as here: the f32 cache's KL equals it)");
        sim_row(2, "KL floor from eviction", 5, nlk, fnlk, 0, m);
        sim_row(2, "exact attention mass kept", 5, kept, fkept, 0,
                "exact attention weight on the tokens still held; 1 = nothing attended was "
                "evicted");
        printf("  (the f32 same eviction column shows what eviction alone costs%s)\n",
               pol == KVQ_POLICY_NONE ? "; no policy: nothing" : "");
        if (allhot) {
            printf("\nresidency tiers of this cache (hot %zu tokens/layer, warm %zu, warm codec %s, "
                   "cold %s);\nthe f32 caches and an all-hot copy of this cache keep every page "
                   "in memory:\n",
                   o.hot_tokens, o.warm_tokens, o.warm_codec ? o.warm_codec : "as hot",
                   o.cold ? o.cold : "none");
            printf("  pages hot/warm/cold          %llu / %llu / %llu\n"
                   "        where this cache's pages are at the end (the f32 caches: all hot)\n",
                   (unsigned long long)tst.pages[0], (unsigned long long)tst.pages[1],
                   (unsigned long long)tst.pages[2]);
            printf("  tokens hot/warm/cold         %llu / %llu / %llu\n"
                   "        the same in tokens\n",
                   (unsigned long long)tst.tokens[0], (unsigned long long)tst.tokens[1],
                   (unsigned long long)tst.tokens[2]);
            printf("  demotions / promotions       %llu / %llu (failures %llu, dropped %llu)\n"
                   "        page moves down a tier / back up when attention needs them; "
                   "failures: moves that\n        failed (the page stayed); dropped: pages with "
                   "no tier below; 0 for the f32 caches\n",
                   (unsigned long long)tst.demotions, (unsigned long long)tst.promotions,
                   (unsigned long long)tst.demotion_failures,
                   (unsigned long long)tst.dropped_pages);
            printf("  transfer ms modeled/measured %.3f / %.3f\n"
                   "        time of those moves: modeled from the links' bandwidth and latency "
                   "/ measured; 0 for\n        the f32 caches\n",
                   tst.modeled_transfer_ms, tst.measured_transfer_ms);
            printf("  lost pages (tokens dropped)  %llu (%llu)\n"
                   "        cold pages the store no longer had or returned corrupt; 0 = none\n",
                   (unsigned long long)tst.lost_pages, (unsigned long long)tst.lost_tokens);
            printf("  verify mismatches            %llu\n"
                   "        --verify: demoted blocks whose checksum changed; 0 = none\n",
                   (unsigned long long)tst.verify_mismatches);
            printf("  store retries                %lu\n"
                   "        attends retried while the cold store was away; 0 = none\n",
                   retries);
            if (tst.lost_pages)
                printf("  last loss: %s\n", kvq_cache_last_error(cache));
            printf("  attention rel. error vs all-hot cache %.6f\n"
                   "        ||out - out of the same cache with every page hot|| / ||that||: what "
                   "the tiers cost;\n        0 = nothing\n",
                   hot_rel);
        }
    }
    rc = KVQT_EXIT_OK;
done:
    free(js);
    kvq_cache_free(cache);
    kvq_cache_free(ref);
    kvq_cache_free(fev);
    kvq_cache_free(allhot);
    kvq_store_close(store);
    free(out), free(tattn), free(ftattn), free(pos), free(fpos), free(qpos), free(p), free(pg);
    free(D.k), free(D.kpre), free(D.v), free(D.q), free(center);
    return rc;
}
