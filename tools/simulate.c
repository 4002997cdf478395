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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    size_t L, H, QH, d, prompt, decode, N;
    float *kpre, *k, *v; /* [L][N][H][d] */
    float *q;            /* [L][N][QH][d] */
} sim_data;

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

static int sim_synth(sim_data *D, uint64_t seed) {
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
    for (size_t l = 0; l < L; l++) {
        for (size_t i = 0; i < H * d; i++)
            mu[i] = (float)(3.0 * sim_gauss(&r));
        for (size_t t = 0; t < N; t++)
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
        for (size_t t = 0; t < N; t++)
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
    double nlk;         /* sum of -log(mass kept): what the KL would be if the cache held
                           its kept tokens exactly and one query head per KV head read them */
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
            "                    [--strict-tiers] [--cold-ttl MS]\n"
            "  a prefill (chunks of 256 tokens) and a decode through a kvq cache, beside exact\n"
            "  f32 attention over the whole context, an f32 cache with the same eviction (what\n"
            "  eviction alone costs) and an f32 cache without eviction (the time baseline)\n"
            "  --layers N (8, 1..1024)  --kv-heads N (8, 1..1024)  --q-heads N (32, a multiple\n"
            "  of --kv-heads)  --head-dim N (128, 1..1024)  --prompt N (2048, 1..2^30)\n"
            "  --decode N (512, 0..2^30)\n"
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
            "    --warm-codec C, --cold URL (none), --verify (CRC of demoted blocks),\n"
            "    --strict-tiers (a lost cold page fails the attend), --cold-ttl MS (Redis)\n"
            "  synthetic data: " SIM_SYNTH_TEXT "\n"
            "exit status: 0 ok, 1 failure, 2 usage error\n");
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
    const char *tier_opt = o->warm_codec ? "--warm-codec" : o->cold ? "--cold"
                         : o->verify ? "--verify" : o->strict ? "--strict-tiers"
                         : o->cold_ttl_ms ? "--cold-ttl" : NULL;
    if (!tiers && tier_opt)
        return kvqt_usage_error(cmd, "%s needs tiers (--hot-tokens N or --warm-tokens N): "
                                     "without them every page stays hot", tier_opt);
    if (o->cold_ttl_ms && !o->cold)
        return kvqt_usage_error(cmd, "--cold-ttl needs a cold store (--cold URL)");
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
        KVQT_FLAG("--json", &o->json)};
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

/* The figures of one cache against exact attention. */
static void sim_figures(const sim_quality *q, double *rel, double *kl, double *kept) {
    *rel = q->ref2 > 0 ? sqrt(q->err2 / q->ref2) : 0;
    *kl = q->n_kl ? fmax(q->kl / (double)q->n_kl, 0) : 0; /* < 0: rounding of a zero */
    *kept = q->n_kl ? q->kept / (double)q->n_kl : 0;
}

int kvq_tool_simulate(int argc, char **argv) {
    sim_opts o = {8, 8, 32, 128, 2048, 512, 0, 128, 4, 16, 1, 0, 16, 0.0, "int8", NULL,
                  "none", "token", "synthetic", 0, 0, 0, 1, 0, 0, NULL, NULL, 0, 0, 0};
    kvq_policy pol = KVQ_POLICY_NONE;
    int r = sim_args(argc, argv, &o, &pol);
    if (r == KVQT_ARGS_HELP) {
        sim_usage(stdout);
        return KVQT_EXIT_OK;
    }
    if (r)
        return r;
    sim_data D = {0};
    D.L = o.L, D.H = o.H, D.QH = o.QH, D.d = o.d, D.prompt = o.prompt, D.decode = o.decode;
    D.N = o.prompt + o.decode;
    int real = strcmp(o.data, "synthetic") != 0;
    if (real ? sim_load(&D, o.data) : sim_synth(&D, o.seed)) {
        if (!real)
            fprintf(stderr, "kvq simulate: out of memory for the workload\n");
        free(D.k), free(D.kpre), free(D.v), free(D.q);
        return KVQT_EXIT_FAIL;
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
    /* --k-center: channel means of the prompt's keys, known when the prompt
     * is prefilled (the library takes a centre only as given values) */
    float *center = NULL;
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
    /* the f32 cache with the same eviction: what eviction alone costs */
    kvq_cache_config ev_cfg;
    kvq_cache_config_init(&ev_cfg);
    ev_cfg.n_layers = L, ev_cfg.n_kv_heads = H, ev_cfg.n_q_heads = QH, ev_cfg.head_dim = d;
    ev_cfg.max_tokens = N, ev_cfg.k_codec = "f32", ev_cfg.v_codec = "f32";
    ev_cfg.page_tokens = o.page, ev_cfg.sinks = o.sinks, ev_cfg.policy = pol;
    ev_cfg.budget_tokens = o.budget, ev_cfg.budget_ratio = o.budget_ratio;
    ev_cfg.protect_recent = o.window, ev_cfg.n_threads = o.threads;
    kvq_store *store = NULL;
    int tiers = o.hot_tokens || o.warm_tokens;
    cfg.hot_tokens = o.hot_tokens, cfg.warm_tokens = o.warm_tokens;
    cfg.warm_codec = o.warm_codec, cfg.verify_tiers = o.verify;
    cfg.strict_tiers = o.strict, cfg.cold_ttl_ms = o.cold_ttl_ms;
    cfg.err_msg = msg, cfg.err_msg_size = sizeof msg;
    kvq_cache *cache = NULL, *ref = NULL, *allhot = NULL, *fev = NULL;
    /* the configuration is checked before the cold store is opened (which
     * may create its directory) */
    kvq_status st = kvq_cache_create(&cache, &cfg);
    kvq_cache_free(cache);
    cache = NULL;
    int rc = KVQT_EXIT_USAGE;
    if (st == KVQ_OK && o.cold) {
        char serr[256] = "";
        kvq_status sst = kvq_store_open(&store, o.cold, NULL, serr, sizeof serr);
        if (sst != KVQ_OK) {
            fprintf(stderr, "kvq simulate: --cold %s: %s\n", o.cold, serr[0] ? serr : kvq_strerror(sst));
            free(D.k), free(D.kpre), free(D.v), free(D.q), free(center);
            return KVQT_EXIT_FAIL;
        }
    }
    cfg.cold_store = store;
    if (st == KVQ_OK)
        st = kvq_cache_create(&cache, &cfg);
    if (st == KVQ_OK && tiers)
        st = kvq_cache_create(&allhot, &hot_cfg);
    if (st != KVQ_OK) {
        if (st == KVQ_ERR_NOMEM)
            rc = KVQT_EXIT_FAIL;
        if (v_default && st == KVQ_ERR_GROUP && strstr(msg, SIM_DEFAULT_V_SMALL))
            fprintf(stderr, "kvq simulate: cache: %s (--k-codec %s, the default --v-codec %s)\n",
                    msg[0] ? msg : kvq_strerror(st), o.kc, o.vc);
        else
            fprintf(stderr, "kvq simulate: cache: %s\n", msg[0] ? msg : kvq_strerror(st));
        if (rc == KVQT_EXIT_USAGE)
            kvqt_usage_hint("simulate");
        kvq_cache_free(cache);
        kvq_store_close(store);
        free(D.k), free(D.kpre), free(D.v), free(D.q), free(center);
        return rc;
    }
    kvq_cache_config rcfg;
    kvq_cache_config_init(&rcfg);
    rcfg.n_layers = L, rcfg.n_kv_heads = H, rcfg.n_q_heads = QH, rcfg.head_dim = d;
    rcfg.max_tokens = N, rcfg.k_codec = "f32", rcfg.v_codec = "f32", rcfg.page_tokens = o.page;
    rcfg.n_threads = o.threads;
    st = kvq_cache_create(&ref, &rcfg);
    if (st == KVQ_OK)
        st = kvq_cache_create(&fev, &ev_cfg);
    float *out = malloc(QH * d * sizeof(float) * 64), *tattn = malloc(H * N * sizeof(float));
    float *ftattn = malloc(H * N * sizeof(float));
    int32_t *pos = malloc(N * sizeof(int32_t)), *fpos = malloc(N * sizeof(int32_t));
    int32_t *qpos = malloc(64 * sizeof(int32_t));
    double *p = malloc((N + 1) * sizeof(double)), *pg = malloc((N + 1) * sizeof(double));
    if (st != KVQ_OK || !out || !tattn || !ftattn || !pos || !fpos || !qpos || !p || !pg) {
        fprintf(stderr, "kvq simulate: out of memory\n");
        return KVQT_EXIT_FAIL;
    }
    const float *K = o.prerope ? D.kpre : D.k;
    int tty = !o.json && isatty(2);
    /* prefill in chunks of 256 tokens, attending with the chunk's last 8
     * queries (chunked prefill: utility scores see the prompt) */
    const size_t chunk = 256;
    unsigned long retries = 0;
    double t_app = 0, t_app_ref = 0;
    size_t n_app = 0;
    for (size_t t0 = 0; t0 < D.prompt && st == KVQ_OK; t0 += chunk) {
        size_t m = D.prompt - t0 < chunk ? D.prompt - t0 : chunk;
        for (size_t l = 0; l < L && st == KVQ_OK; l++) {
            int32_t pp[256];
            for (size_t i = 0; i < m; i++)
                pp[i] = (int32_t)(t0 + i);
            const float *kk = K + (l * N + t0) * H * d, *vv = D.v + (l * N + t0) * H * d;
            double a0 = kvqb_now();
            st = kvq_cache_append(cache, l, kk, vv, pp, m);
            double a1 = kvqb_now();
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, D.k + (l * N + t0) * H * d, vv, pp, m);
            t_app += a1 - a0;
            t_app_ref += kvqb_now() - a1;
            if (st == KVQ_OK)
                st = kvq_cache_append(fev, l, D.k + (l * N + t0) * H * d, vv, pp, m);
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
        if (tty)
            fprintf(stderr, "\rprefill %zu/%zu", t0 + m, D.prompt);
    }
    /* decode */
    sim_quality qa = {0}, fqa = {0};
    double hot_err2 = 0, hot_ref2 = 0;
    double t_dec = 0, t_dec_ref = 0, t_dapp = 0;
    long skipped_lost = 0; /* samples (per KV head) not taken: a cold page was lost */
    size_t n_dapp = 0;
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
            t_dapp += a1 - a0;
            n_dapp++;
            t_dec += a2 - a0;
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, kref, vv, &pt, 1);
            float *ro = out + QH * d;
            if (st == KVQ_OK)
                st = kvq_cache_attend(ref, l, q, &pt, 1, ro, QH * d, NULL, 0);
            t_dec_ref += kvqb_now() - a2;
            float *fo = out + 3 * QH * d;
            if (st == KVQ_OK)
                st = kvq_cache_append(fev, l, kref, vv, &pt, 1);
            if (st == KVQ_OK && sample) {
                kvq_cache_tokens(fev, l, &fn);
                kvq_cache_positions(fev, l, fpos, N);
            }
            if (st == KVQ_OK)
                st = kvq_cache_attend(fev, l, q, &pt, 1, fo, QH * d, sample ? ftattn : NULL,
                                      H * N);
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
            }
        }
        if (tty && (s % 8 == 0 || s + 1 == D.decode))
            fprintf(stderr, "\rdecode %zu/%zu   ", s + 1, D.decode);
    }
    if (tty)
        fprintf(stderr, "\r                         \r");
    if (st != KVQ_OK) {
        const char *detail = kvq_cache_last_error(cache);
        fprintf(stderr, "kvq simulate: %s%s%s\n", kvq_strerror(st), detail[0] ? ": " : "", detail);
        return KVQT_EXIT_FAIL;
    }
    kvq_tier_stats tst;
    kvq_cache_tier_stats(cache, &tst);
    double step_ms = D.decode ? t_dec / (double)D.decode * 1e3 : 0;
    double ref_ms = D.decode ? t_dec_ref / (double)D.decode * 1e3 : 0;
    double app_ns = (t_app + t_dapp) / (double)(n_app + n_dapp) * 1e9;
    double rel, kl, kept, frel, fkl, fkept;
    sim_figures(&qa, &rel, &kl, &kept);
    sim_figures(&fqa, &frel, &fkl, &fkept);
    size_t jl;
    kvq_cache_stats_json(cache, NULL, 0, &jl);
    char *js = malloc(jl + 1);
    kvq_cache_stats_json(cache, js, jl + 1, &jl);
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
               "\"samples_skipped_lost\": %ld, "
               "\"f32_same_eviction\": "
               "{\"attn_rel_err\": %.6g, \"attn_kl\": %.6g, \"attn_mass_kept\": %.6g, "
               "\"tokens\": %llu, \"tokens_evicted\": %llu}",
               rel, kl, kept, qa.n_kl ? qa.nlk / (double)qa.n_kl : 0.0, qa.n_kl, skipped_lost, frel, fkl, fkept,
               (unsigned long long)ftot.tokens, (unsigned long long)ftot.tokens_evicted);
        if (allhot)
            printf(", \"attn_rel_err_vs_all_hot\": %.6g, \"lost_pages\": %llu, \"lost_tokens\": "
                   "%llu, \"store_retries\": %lu",
                   hot_ref2 > 0 ? sqrt(hot_err2 / hot_ref2) : 0.0,
                   (unsigned long long)tst.lost_pages, (unsigned long long)tst.lost_tokens, retries);
        printf("}, \"timing\": {\"decode_step_ms\": "
               "%.4f, \"append_ns_per_token\": %.1f, \"f32_decode_step_ms\": %.4f, "
               "\"ratio_vs_f32\": %.4f, \"f32_stored_bytes\": %llu}}\n",
               step_ms, app_ns, ref_ms, ref_ms > 0 ? step_ms / ref_ms : 0,
               (unsigned long long)rtot.stored_bytes);
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
            printf(" (budget %zu%s, sinks %zu, protected %zu)", o.budget,
                   o.budget_ratio > 0 ? " from ratio" : "", o.sinks, o.window);
        printf("\n\n");
        printf("  %-30s %14s %18s\n", "", "kvq cache", "f32 no eviction");
        printf("  %-30s %14llu %18llu\n", "tokens stored (all layers)",
               (unsigned long long)tot.tokens, (unsigned long long)rtot.tokens);
        if (tiers)
            printf("  %-30s %14llu %18s\n", "  of which in the cold tier", (unsigned long long)cold_tok,
                   "0");
        printf("  %-30s %14llu %18llu\n", "tokens evicted", (unsigned long long)tot.tokens_evicted,
               (unsigned long long)rtot.tokens_evicted);
        printf("  %-30s %14.2f %18.2f\n", tiers ? "stored MiB (hot and warm)" : "stored MiB",
               tot.stored_bytes / 1048576.0, rtot.stored_bytes / 1048576.0);
        printf("  %-30s %14.2f %18.2f\n", "  payload MiB", tot.payload_bytes / 1048576.0,
               rtot.payload_bytes / 1048576.0);
        printf("  %-30s %14.2f %18.2f\n", "  metadata MiB", tot.metadata_bytes / 1048576.0,
               rtot.metadata_bytes / 1048576.0);
        printf("  %-30s %14.2f %18.2f\n", "peak stored MiB", tot.peak_stored_bytes / 1048576.0,
               rtot.peak_stored_bytes / 1048576.0);
        if (tiers) {
            printf("  %-30s %14.2f %18s\n", "cold tier records MiB", tst.bytes[2] / 1048576.0, "-");
            printf("  %-30s %14.3f %18.3f\n", "bits per value (hot and warm)", res_bits,
                   rtot.bits_per_value);
            printf("  %-30s %14.3f %18s\n", "bits per value (cold records)", cold_bits, "-");
        } else {
            printf("  %-30s %14.3f %18.3f\n", "bits per value (payload)", tot.bits_per_value,
                   rtot.bits_per_value);
            printf("  %-30s %14.3f %18.3f\n", "bits per value (all bytes)",
                   tot.total_bits_per_value, rtot.total_bits_per_value);
        }
        printf("  %-30s %14.4f %18.4f\n", "fragmentation", tot.fragmentation, rtot.fragmentation);
        printf("  %-30s %14.2f %18.2f\n", "MiB read by attention", tot.bytes_read / 1048576.0,
               rtot.bytes_read / 1048576.0);
        printf("  %-30s %14.2f %18.2f\n", "MiB written (encoded)", tot.bytes_written / 1048576.0,
               rtot.bytes_written / 1048576.0);
        printf("  %-30s %14.4f %18.4f\n", "decode step ms", step_ms, ref_ms);
        printf("  %-30s %14.1f %18.1f\n", "append ns/token/layer", app_ns,
               (t_app_ref) / (double)(n_app ? n_app : 1) * 1e9);
        printf("\nquality vs exact f32 attention over the full context (%ld samples each):\n",
               qa.n_kl);
        printf("  %-30s %14s %18s\n", "", "kvq cache", "f32 same eviction");
        printf("  %-30s %14.5f %18.5f\n", "attention output rel. error", rel, frel);
        printf("  %-30s %14.5f %18.5f\n", "KL(cache || f32) of weights", kl, fkl);
        printf("  %-30s %14.5f %18.5f\n", "f32 attention mass kept", kept, fkept);
        printf("  (the f32 cache with the same eviction shows what eviction alone costs%s)\n",
               pol == KVQ_POLICY_NONE ? "; no policy: nothing" : "");
        if (allhot) {
            kvq_tier_stats ts;
            kvq_cache_tier_stats(cache, &ts);
            printf("\nresidency tiers (hot %zu tokens/layer, warm %zu, warm codec %s, cold %s):\n",
                   o.hot_tokens, o.warm_tokens, o.warm_codec ? o.warm_codec : "as hot",
                   o.cold ? o.cold : "none");
            printf("  pages hot/warm/cold          %llu / %llu / %llu\n",
                   (unsigned long long)ts.pages[0], (unsigned long long)ts.pages[1],
                   (unsigned long long)ts.pages[2]);
            printf("  tokens hot/warm/cold         %llu / %llu / %llu\n",
                   (unsigned long long)ts.tokens[0], (unsigned long long)ts.tokens[1],
                   (unsigned long long)ts.tokens[2]);
            printf("  demotions / promotions       %llu / %llu (failures %llu, dropped %llu)\n",
                   (unsigned long long)ts.demotions, (unsigned long long)ts.promotions,
                   (unsigned long long)ts.demotion_failures, (unsigned long long)ts.dropped_pages);
            printf("  transfer ms modeled/measured %.3f / %.3f\n", ts.modeled_transfer_ms,
                   ts.measured_transfer_ms);
            printf("  lost pages (tokens dropped)  %llu (%llu)\n", (unsigned long long)ts.lost_pages,
                   (unsigned long long)ts.lost_tokens);
            printf("  verify mismatches            %llu\n", (unsigned long long)ts.verify_mismatches);
            printf("  store retries                %lu\n", retries);
            if (ts.lost_pages)
                printf("  last loss: %s\n", kvq_cache_last_error(cache));
            printf("  attention rel. error vs all-hot cache %.6f\n",
                   hot_ref2 > 0 ? sqrt(hot_err2 / hot_ref2) : 0.0);
        }
    }
    free(js);
    kvq_cache_free(cache);
    kvq_cache_free(ref);
    kvq_cache_free(fev);
    kvq_cache_free(allhot);
    kvq_store_close(store);
    free(out), free(tattn), free(ftattn), free(pos), free(fpos), free(qpos), free(p), free(pg);
    free(D.k), free(D.kpre), free(D.v), free(D.q), free(center);
    return KVQT_EXIT_OK;
}
