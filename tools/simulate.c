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
#include "npy.h"
#include "tool.h"

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
    long n_kl;
} sim_quality;

/* Exact attention for layer l, query token t over tokens 0..t of the full
 * context; compares with the cache output and its per-KV-head token
 * attention (positions given in pos[0..n)). */
static void sim_reference(const sim_data *D, size_t l, size_t t, const float *out,
                          const float *tattn, const int32_t *pos, size_t n, sim_quality *qa,
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
                double e = out[qh * d + c] - o;
                qa->err2 += e * e;
                qa->ref2 += o * o;
            }
            for (size_t j = 0; j <= t; j++)
                pg[j] += p[j] / sum / (double)G;
        }
        double kl = 0, kept = 0;
        for (size_t i = 0; i < n; i++) {
            size_t j = (size_t)pos[i];
            if (j > t)
                continue;
            double pc = tattn[h * n + i] / (double)G;
            kept += pg[j];
            if (pc > 0)
                kl += pc * log(pc / fmax(pg[j], 1e-300));
        }
        qa->kl += kl;
        qa->kept += kept;
        qa->n_kl++;
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
    uint64_t seed;
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

static void sim_usage(FILE *f) {
    fprintf(f, "usage: kvq simulate [--layers 8] [--kv-heads 8] [--q-heads 32] [--head-dim 128]\n"
               "  [--prompt 2048] [--decode 512] [--k-codec C] [--v-codec C]\n"
               "  [--k-layout token|channel] [--k-prerope] [--k-center]\n"
               "  [--policy none|window|fifo|utility] [--budget N | --budget-ratio R]\n"
               "  [--window N (protected recent tokens, 128)] [--sinks N (4)] [--page N (16)]\n"
               "  [--recent N (full-precision recent window, 0)] [--threads N (1)]\n"
               "  [--data synthetic|DIR] [--quality-every N (16)] [--seed N] [--json]\n"
               "  [--hot-tokens N] [--warm-tokens N] [--warm-codec C]\n"
               "  [--cold file:DIR|redis://HOST:PORT|none] [--verify] [--strict-tiers]\n"
               "  [--cold-ttl MS (records expire; Redis)]\n");
}

static int sim_need(int i, int argc, const char *opt) {
    if (i + 1 >= argc) {
        fprintf(stderr, "kvq simulate: %s needs a value\n", opt);
        return 0;
    }
    return 1;
}

static int sim_size(const char *s, size_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '-' || end == s || *end)
        return -1;
    *out = (size_t)v;
    return 0;
}

int kvq_tool_simulate(int argc, char **argv) {
    sim_opts o = {8, 8, 32, 128, 2048, 512, 0, 128, 4, 16, 1, 0, 16, 0.0, "int8", "int4:g=32",
                  "none", "token", "synthetic", 0, 0, 0, 1, 0, 0, NULL, NULL, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        struct {
            const char *name;
            size_t *dst;
        } sz[] = {{"--layers", &o.L},     {"--kv-heads", &o.H},   {"--q-heads", &o.QH},
                  {"--head-dim", &o.d},   {"--prompt", &o.prompt}, {"--decode", &o.decode},
                  {"--budget", &o.budget}, {"--window", &o.window}, {"--sinks", &o.sinks},
                  {"--page", &o.page},    {"--threads", &o.threads}, {"--recent", &o.recent},
                  {"--quality-every", &o.every}, {"--hot-tokens", &o.hot_tokens},
                  {"--warm-tokens", &o.warm_tokens}, {"--cold-ttl", &o.cold_ttl_ms}};
        int done = 0;
        for (size_t k = 0; k < sizeof sz / sizeof sz[0]; k++)
            if (!strcmp(a, sz[k].name)) {
                if (!sim_need(i, argc, a))
                    return 2;
                if (sim_size(argv[++i], sz[k].dst) != 0) {
                    fprintf(stderr, "kvq simulate: %s: '%s' is not a count\n", a, argv[i]);
                    return 2;
                }
                done = 1;
            }
        if (done)
            continue;
        if (!strcmp(a, "--k-codec") || !strcmp(a, "--v-codec") || !strcmp(a, "--policy") ||
            !strcmp(a, "--k-layout") || !strcmp(a, "--data") || !strcmp(a, "--budget-ratio") ||
            !strcmp(a, "--seed") || !strcmp(a, "--warm-codec") || !strcmp(a, "--cold")) {
            if (!sim_need(i, argc, a))
                return 2;
            const char *v = argv[++i];
            if (!strcmp(a, "--k-codec"))
                o.kc = v;
            else if (!strcmp(a, "--v-codec"))
                o.vc = v;
            else if (!strcmp(a, "--policy"))
                o.policy = v;
            else if (!strcmp(a, "--k-layout"))
                o.layout = v;
            else if (!strcmp(a, "--data"))
                o.data = v;
            else if (!strcmp(a, "--seed"))
                o.seed = strtoull(v, NULL, 10);
            else if (!strcmp(a, "--warm-codec"))
                o.warm_codec = v;
            else if (!strcmp(a, "--cold"))
                o.cold = strcmp(v, "none") ? v : NULL;
            else {
                char *end;
                o.budget_ratio = strtod(v, &end);
                if (*end || !(o.budget_ratio > 0)) {
                    fprintf(stderr, "kvq simulate: --budget-ratio needs a positive number\n");
                    return 2;
                }
            }
        } else if (!strcmp(a, "--k-prerope")) {
            o.prerope = 1;
        } else if (!strcmp(a, "--k-center")) {
            o.center = 1;
        } else if (!strcmp(a, "--verify")) {
            o.verify = 1;
        } else if (!strcmp(a, "--strict-tiers")) {
            o.strict = 1;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            sim_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvq simulate: unknown option '%s'\n", a);
            sim_usage(stderr);
            return 2;
        }
    }
    kvq_policy pol;
    if (sim_parse_policy(o.policy, &pol) != 0) {
        fprintf(stderr, "kvq simulate: unknown policy '%s' (none, window, fifo, utility)\n", o.policy);
        return 2;
    }
    if (strcmp(o.layout, "token") && strcmp(o.layout, "channel")) {
        fprintf(stderr, "kvq simulate: --k-layout must be token or channel\n");
        return 2;
    }
    if (o.budget && o.budget_ratio > 0) {
        fprintf(stderr, "kvq simulate: give --budget or --budget-ratio, not both\n");
        return 2;
    }
    if (!o.L || !o.H || !o.QH || o.QH % o.H || !o.d || o.d > 1024 || !o.prompt || !o.page ||
        !o.threads || !o.every) {
        fprintf(stderr, "kvq simulate: shape must be positive, q-heads a multiple of kv-heads, "
                        "head-dim <= 1024\n");
        return 2;
    }
    sim_data D = {0};
    D.L = o.L, D.H = o.H, D.QH = o.QH, D.d = o.d, D.prompt = o.prompt, D.decode = o.decode;
    D.N = o.prompt + o.decode;
    int real = strcmp(o.data, "synthetic") != 0;
    if (real) /* the prompt and decode lengths are clamped to the file's tokens */
        D.decode = o.decode, D.prompt = o.prompt;
    if (real ? sim_load(&D, o.data) : sim_synth(&D, o.seed)) {
        if (!real)
            fprintf(stderr, "kvq simulate: out of memory for the workload\n");
        free(D.k), free(D.kpre), free(D.v), free(D.q);
        return 1;
    }
    size_t L = D.L, H = D.H, QH = D.QH, d = D.d, N = D.N, G = QH / H;

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
    kvq_store *store = NULL;
    if (o.cold) {
        char serr[256] = "";
        kvq_status sst = kvq_store_open(&store, o.cold, NULL, serr, sizeof serr);
        if (sst != KVQ_OK) {
            fprintf(stderr, "kvq simulate: --cold %s: %s\n", o.cold, serr[0] ? serr : kvq_strerror(sst));
            free(D.k), free(D.kpre), free(D.v), free(D.q);
            return 2;
        }
    }
    int tiers = o.hot_tokens || o.warm_tokens;
    cfg.hot_tokens = o.hot_tokens, cfg.warm_tokens = o.warm_tokens;
    cfg.warm_codec = o.warm_codec, cfg.cold_store = store, cfg.verify_tiers = o.verify;
    cfg.strict_tiers = o.strict, cfg.cold_ttl_ms = o.cold_ttl_ms;
    cfg.err_msg = msg, cfg.err_msg_size = sizeof msg;
    kvq_cache *cache = NULL, *ref = NULL, *allhot = NULL;
    kvq_status st = kvq_cache_create(&cache, &cfg);
    if (st == KVQ_OK && tiers)
        st = kvq_cache_create(&allhot, &hot_cfg);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq simulate: cache: %s (%s)\n", msg[0] ? msg : kvq_strerror(st),
                kvq_strerror(st));
        free(D.k), free(D.kpre), free(D.v), free(D.q);
        return 2;
    }
    kvq_cache_config rcfg;
    kvq_cache_config_init(&rcfg);
    rcfg.n_layers = L, rcfg.n_kv_heads = H, rcfg.n_q_heads = QH, rcfg.head_dim = d;
    rcfg.max_tokens = N, rcfg.k_codec = "f32", rcfg.v_codec = "f32", rcfg.page_tokens = o.page;
    rcfg.n_threads = o.threads;
    st = kvq_cache_create(&ref, &rcfg);
    float *out = malloc(QH * d * sizeof(float) * 64), *tattn = malloc(H * N * sizeof(float));
    (void)tiers;
    int32_t *pos = malloc(N * sizeof(int32_t)), *qpos = malloc(64 * sizeof(int32_t));
    double *p = malloc((N + 1) * sizeof(double)), *pg = malloc((N + 1) * sizeof(double));
    if (st != KVQ_OK || !out || !tattn || !pos || !qpos || !p || !pg) {
        fprintf(stderr, "kvq simulate: out of memory\n");
        return 1;
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
            double a0 = kvqb_now();
            st = kvq_cache_append(cache, l, K + (l * N + t0) * H * d, D.v + (l * N + t0) * H * d, pp, m);
            double a1 = kvqb_now();
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, D.k + (l * N + t0) * H * d, D.v + (l * N + t0) * H * d, pp, m);
            if (st == KVQ_OK && allhot)
                st = kvq_cache_append(allhot, l, K + (l * N + t0) * H * d, D.v + (l * N + t0) * H * d, pp, m);
            t_app += a1 - a0;
            t_app_ref += kvqb_now() - a1;
            n_app += m;
            size_t nq = m < 8 ? m : 8;
            for (size_t i = 0; i < nq; i++)
                qpos[i] = (int32_t)(t0 + m - nq + i);
            if (st == KVQ_OK)
                st = sim_attend(cache, l, D.q + (l * N + t0 + m - nq) * QH * d, qpos, nq, out,
                                QH * d * 64, NULL, 0, &retries);
            if (st == KVQ_OK && allhot)
                st = kvq_cache_attend(allhot, l, D.q + (l * N + t0 + m - nq) * QH * d, qpos, nq, out,
                                      QH * d * 64, NULL, 0);
        }
        if (tty)
            fprintf(stderr, "\rprefill %zu/%zu", t0 + m, D.prompt);
    }
    /* decode */
    sim_quality qa = {0};
    double hot_err2 = 0, hot_ref2 = 0;
    double t_dec = 0, t_dec_ref = 0, t_dapp = 0;
    size_t n_dapp = 0;
    for (size_t s = 0; s < D.decode && st == KVQ_OK; s++) {
        size_t t = D.prompt + s;
        int32_t pt = (int32_t)t;
        int sample = (s % o.every) == 0 || s + 1 == D.decode;
        for (size_t l = 0; l < L && st == KVQ_OK; l++) {
            const float *q = D.q + (l * N + t) * QH * d;
            double a0 = kvqb_now();
            st = kvq_cache_append(cache, l, K + (l * N + t) * H * d, D.v + (l * N + t) * H * d, &pt, 1);
            double a1 = kvqb_now();
            if (st == KVQ_OK)
                st = sim_attend(cache, l, q, &pt, 1, out, QH * d, sample ? tattn : NULL, H * N,
                                &retries);
            double a2 = kvqb_now();
            t_dapp += a1 - a0;
            n_dapp++;
            t_dec += a2 - a0;
            if (st == KVQ_OK)
                st = kvq_cache_append(ref, l, D.k + (l * N + t) * H * d, D.v + (l * N + t) * H * d, &pt, 1);
            float *ro = out + QH * d;
            if (st == KVQ_OK)
                st = kvq_cache_attend(ref, l, q, &pt, 1, ro, QH * d, NULL, 0);
            t_dec_ref += kvqb_now() - a2;
            if (st == KVQ_OK && allhot) {
                float *ho = out + 2 * QH * d;
                st = kvq_cache_append(allhot, l, K + (l * N + t) * H * d, D.v + (l * N + t) * H * d, &pt, 1);
                if (st == KVQ_OK)
                    st = kvq_cache_attend(allhot, l, q, &pt, 1, ho, QH * d, NULL, 0);
                for (size_t i = 0; i < QH * d && st == KVQ_OK; i++) {
                    double e = (double)out[i] - ho[i];
                    hot_err2 += e * e;
                    hot_ref2 += (double)ho[i] * ho[i];
                }
            }
            if (st == KVQ_OK && sample) {
                size_t n;
                kvq_cache_tokens(cache, l, &n);
                kvq_cache_positions(cache, l, pos, N);
                sim_reference(&D, l, t, out, tattn, pos, n, &qa, p, pg);
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
        return 1;
    }
    kvq_tier_stats tst;
    kvq_cache_tier_stats(cache, &tst);
    (void)G;
    double step_ms = D.decode ? t_dec / (double)D.decode * 1e3 : 0;
    double ref_ms = D.decode ? t_dec_ref / (double)D.decode * 1e3 : 0;
    double app_ns = (t_app + t_dapp) / (double)(n_app + n_dapp) * 1e9;
    double rel = qa.ref2 > 0 ? sqrt(qa.err2 / qa.ref2) : 0;
    double kl = qa.n_kl ? qa.kl / (double)qa.n_kl : 0;
    double kept = qa.n_kl ? qa.kept / (double)qa.n_kl : 0;
    size_t jl;
    kvq_cache_stats_json(cache, NULL, 0, &jl);
    char *js = malloc(jl + 1);
    kvq_cache_stats_json(cache, js, jl + 1, &jl);
    kvq_stats tot, rtot;
    kvq_cache_stats(cache, -1, &tot);
    kvq_cache_stats(ref, -1, &rtot);
    if (o.json) {
        printf("{\"config\": {\"layers\": %zu, \"kv_heads\": %zu, \"q_heads\": %zu, \"head_dim\": "
               "%zu, \"prompt\": %zu, \"decode\": %zu, \"k_codec\": ",
               L, H, QH, d, D.prompt, D.decode);
        kvqb_json_str(stdout, o.kc);
        printf(", \"v_codec\": ");
        kvqb_json_str(stdout, o.vc);
        printf(", \"k_layout\": \"%s\", \"k_prerope\": %s, \"k_center\": %s, \"policy\": \"%s\", "
               "\"budget\": %zu, \"budget_ratio\": %g, \"window\": %zu, \"sinks\": %zu, \"page\": "
               "%zu, \"recent\": %zu, \"threads\": %zu, \"data\": ",
               o.layout, o.prerope ? "true" : "false", o.center ? "true" : "false", o.policy,
               o.budget, o.budget_ratio, o.window, o.sinks, o.page, o.recent, o.threads);
        kvqb_json_str(stdout, o.data);
        printf("}, \"stats\": %s, \"quality\": {\"attn_rel_err\": %.6g, \"attn_kl\": %.6g, "
               "\"attn_mass_kept\": %.6g, \"samples\": %ld",
               js, rel, kl, kept, qa.n_kl);
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
               "decode %zu, data %s, %zu thread(s)\n",
               L, H, QH, d, D.prompt, D.decode, o.data, o.threads);
        printf("cache: K %s (%s%s%s), V %s, page %zu, recent f16 window %zu, policy %s", o.kc,
               o.layout, o.prerope ? ", pre-RoPE" : "", o.center ? ", centred" : "", o.vc, o.page,
               o.recent, o.policy);
        if (pol != KVQ_POLICY_NONE)
            printf(" (budget %zu%s, sinks %zu, protected %zu)", o.budget,
                   o.budget_ratio > 0 ? " from ratio" : "", o.sinks, o.window);
        printf("\n\n");
        printf("  %-28s %14s %14s\n", "", "kvq cache", "f32 cache");
        printf("  %-28s %14llu %14llu\n", "tokens stored (all layers)",
               (unsigned long long)tot.tokens, (unsigned long long)rtot.tokens);
        printf("  %-28s %14llu %14llu\n", "tokens evicted", (unsigned long long)tot.tokens_evicted,
               (unsigned long long)rtot.tokens_evicted);
        printf("  %-28s %14.2f %14.2f\n", "stored MiB", tot.stored_bytes / 1048576.0,
               rtot.stored_bytes / 1048576.0);
        printf("  %-28s %14.2f %14.2f\n", "  payload MiB", tot.payload_bytes / 1048576.0,
               rtot.payload_bytes / 1048576.0);
        printf("  %-28s %14.2f %14.2f\n", "  metadata MiB", tot.metadata_bytes / 1048576.0,
               rtot.metadata_bytes / 1048576.0);
        printf("  %-28s %14.2f %14.2f\n", "peak stored MiB", tot.peak_stored_bytes / 1048576.0,
               rtot.peak_stored_bytes / 1048576.0);
        printf("  %-28s %14.3f %14.3f\n", "bits per value (payload)", tot.bits_per_value,
               rtot.bits_per_value);
        printf("  %-28s %14.3f %14.3f\n", "bits per value (all bytes)", tot.total_bits_per_value,
               rtot.total_bits_per_value);
        printf("  %-28s %14.4f %14.4f\n", "fragmentation", tot.fragmentation, rtot.fragmentation);
        printf("  %-28s %14.2f %14.2f\n", "MiB read by attention", tot.bytes_read / 1048576.0,
               rtot.bytes_read / 1048576.0);
        printf("  %-28s %14.2f %14.2f\n", "MiB written (encoded)", tot.bytes_written / 1048576.0,
               rtot.bytes_written / 1048576.0);
        printf("  %-28s %14.4f %14.4f\n", "decode step ms", step_ms, ref_ms);
        printf("  %-28s %14.1f %14.1f\n", "append ns/token/layer", app_ns,
               (t_app_ref) / (double)(n_app ? n_app : 1) * 1e9);
        printf("\nquality vs exact f32 attention over the full context (%ld samples):\n", qa.n_kl);
        printf("  attention output rel. error  %.5f\n", rel);
        printf("  KL(cache || f32) of weights  %.5f\n", kl);
        printf("  f32 attention mass kept      %.5f\n", kept);
        if (allhot) {
            kvq_tier_stats ts;
            kvq_cache_tier_stats(cache, &ts);
            printf("\nresidency tiers (hot %zu tokens/layer, warm %zu, warm codec %s, cold %s):\n",
                   o.hot_tokens, o.warm_tokens, o.warm_codec ? o.warm_codec : "as hot",
                   o.cold ? o.cold : "none");
            printf("  pages hot/warm/cold          %llu / %llu / %llu\n",
                   (unsigned long long)ts.pages[0], (unsigned long long)ts.pages[1],
                   (unsigned long long)ts.pages[2]);
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
    kvq_cache_free(allhot);
    kvq_store_close(store);
    free(out), free(tattn), free(pos), free(qpos), free(p), free(pg);
    free(D.k), free(D.kpre), free(D.v), free(D.q), free(center);
    return 0;
}
