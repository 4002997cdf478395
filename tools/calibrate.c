/*
 * calibrate.c - `kvq calibrate`: per-head mixed precision, made automatic.
 * For every (layer, KV head, K or V) unit it measures, on the calibration
 * text, the KL divergence (f32 || compressed) of the next-token
 * distributions when only that unit is compressed with each candidate
 * (per-channel int keys in pages of 32, fitted nuq tables, TurboQuant with
 * an 8-bit norm code, int, f16), then allocates bits greedily: every unit
 * starts at its cheapest candidate and the upgrade with the best KL saved
 * per bit added is taken while the average bits per value (every codec
 * byte counted) stays within the target. Keys are stored pre-RoPE and
 * centred (calibrated channel means), which makes per-channel statistics
 * stable. The result is a complete cache configuration in JSON, fitted
 * tables included, that every command loads with --alloc.
 */
#include "kvq.h"
#include "alloc_json.h"
#include "benchlib.h"
#include "cacheopts.h"
#include "model_eval.h"
#include "tool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CAL_MAX_CAND 12

typedef struct {
    char codec[64];
    double bits;   /* nominal bits per value, all codec bytes */
    double kl;     /* KL with only this unit compressed */
    unsigned char *state;
    size_t state_size;
} cal_cand;

typedef struct {
    int layer, head, is_value;
    cal_cand cand[CAL_MAX_CAND];
    int n_cand, chosen;
} cal_unit;

typedef struct {
    const kvq_model *m;
    kvq_model_info in;
    int32_t **seq;
    size_t *len, nseq, ntok;
    float *ref_logp; /* [ntok][V] reference log-probabilities */
    int32_t *next;   /* [ntok] */
    size_t page;
} cal_ctx;

static void cal_logsoftmax(const float *x, size_t n, float *out) {
    double mx = -1e300, s = 0;
    for (size_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (size_t i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    double ls = log(s) + mx;
    for (size_t i = 0; i < n; i++)
        out[i] = (float)((double)x[i] - ls);
}

/* Mean KL(f32 || o) and NLL over the calibration tokens; payload bits. */
static int cal_eval(const cal_ctx *cx, const kvqt_cacheopts *o, double *kl, double *nll, double *bits) {
    size_t V = cx->in.vocab_size, S = cx->in.seq_len;
    float *lg = malloc(S * V * sizeof(float)), *lp = malloc(V * sizeof(float));
    double k = 0, nl = 0, pb = 0, vals = 0;
    size_t at = 0;
    int rc = 0;
    for (size_t s = 0; s < cx->nseq && rc == 0; s++) {
        kvq_cache *c = kvqt_make_cache(cx->m, o, "calibrate");
        if (!c || kvq_model_forward(cx->m, c, cx->seq[s], cx->len[s], 0, lg, S * V, 0) != KVQ_OK) {
            rc = -1;
            kvq_cache_free(c);
            break;
        }
        for (size_t t = 0; t + 1 < cx->len[s]; t++, at++) {
            cal_logsoftmax(lg + t * V, V, lp);
            const float *r = cx->ref_logp + at * V;
            double d = 0;
            for (size_t i = 0; i < V; i++)
                d += exp((double)r[i]) * ((double)r[i] - lp[i]);
            k += d;
            nl -= lp[cx->next[at]];
        }
        kvq_stats st;
        kvq_cache_stats(c, -1, &st);
        pb += (double)st.payload_bytes * 8.0;
        vals += (double)st.tokens * cx->in.n_kv_heads * cx->in.head_dim * 2.0;
        kvq_cache_free(c);
    }
    free(lg);
    free(lp);
    if (rc)
        return rc;
    *kl = k / (double)cx->ntok;
    *nll = nl / (double)cx->ntok;
    *bits = vals > 0 ? pb / vals : 0;
    return 0;
}

/* Options with every unit at f32 except the chosen candidates. */
static void cal_opts(kvqt_cacheopts *o, const cal_unit *u, size_t nu, int only, int cand,
                     const float *center, size_t ncenter, size_t page) {
    kvqt_cacheopts_init(o);
    o->k_prerope = 1;
    o->k_center = 1;
    o->center_values = (float *)center; /* borrowed: never freed through o */
    o->center_count = ncenter;
    o->page = page;
    for (size_t i = 0; i < nu; i++) {
        if (only >= 0 && (int)i != only)
            continue;
        const cal_cand *c = &u[i].cand[only >= 0 ? cand : u[i].chosen];
        kvq_codec_override *ov = &o->ovr[o->n_ovr];
        memset(ov, 0, sizeof *ov);
        ov->layer = u[i].layer;
        ov->kv_head = u[i].head;
        ov->is_value = u[i].is_value;
        snprintf(o->ovr_codec[o->n_ovr], sizeof o->ovr_codec[0], "%s", c->codec);
        ov->codec = o->ovr_codec[o->n_ovr];
        ov->state = c->state;
        ov->state_size = c->state_size;
        o->n_ovr++;
    }
}

static double cal_avg_bits(const cal_unit *u, size_t nu) {
    double b = 0;
    for (size_t i = 0; i < nu; i++)
        b += u[i].cand[u[i].chosen].bits;
    return b / (double)nu;
}

/* Greedy: from the current choice, repeatedly take the upgrade with the most
 * KL saved per bit added while the nominal average stays within budget. */
static void cal_greedy(cal_unit *U, size_t nu, double budget) {
    for (;;) {
        double cur = cal_avg_bits(U, nu), best_ratio = 0;
        int bu = -1, bc = -1;
        for (size_t i = 0; i < nu; i++) {
            const cal_cand *a = &U[i].cand[U[i].chosen];
            for (int c = 0; c < U[i].n_cand; c++) {
                const cal_cand *b = &U[i].cand[c];
                double db = b->bits - a->bits, dk = a->kl - b->kl;
                if (db <= 0 || dk <= 0 || cur + db / (double)nu > budget + 1e-9)
                    continue;
                if (dk / db > best_ratio) {
                    best_ratio = dk / db;
                    bu = (int)i;
                    bc = c;
                }
            }
        }
        if (bu < 0)
            return;
        U[bu].chosen = bc;
    }
}

/* A fitted candidate: creates the codec, fits it on samples, keeps its state. */
static int cal_add(cal_unit *u, const char *spec, size_t d, const float *samples, size_t ns,
                   size_t page) {
    cal_cand *c = &u->cand[u->n_cand];
    memset(c, 0, sizeof *c);
    snprintf(c->codec, sizeof c->codec, "%s", spec);
    if (!strncmp(spec, "chan:int", 8)) {
        c->bits = atoi(spec + 8) + 32.0 / (double)page;
        u->n_cand++;
        return 0;
    }
    kvq_codec *k = NULL;
    if (kvq_codec_create(&k, spec, d, NULL) != KVQ_OK)
        return -1;
    if (kvq_codec_fit(k, samples, ns) != KVQ_OK) {
        kvq_codec_free(k);
        return -1;
    }
    c->bits = kvq_codec_bits_per_value(k);
    if (kvq_codec_state_bytes(k) > 0) {
        size_t n;
        kvq_codec_save_state(k, NULL, 0, &n);
        c->state = malloc(n);
        kvq_codec_save_state(k, c->state, n, &n);
        c->state_size = n;
    }
    kvq_codec_free(k);
    u->n_cand++;
    return 0;
}

static void cal_hex(FILE *f, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", p[i]);
}

struct kvqt_calib {
    cal_ctx cx;
    cal_unit *U;
    size_t nu, L, H, d;
    float *center;
    size_t ntok;
};

void kvqt_calib_free(kvqt_calib *cb) {
    if (!cb)
        return;
    for (size_t i = 0; i < cb->nu; i++)
        for (int c = 0; c < cb->U[i].n_cand; c++)
            free(cb->U[i].cand[c].state);
    free(cb->U);
    free(cb->center);
    free(cb->cx.ref_logp);
    free(cb->cx.next);
    for (size_t s = 0; s < cb->cx.nseq; s++)
        free(cb->cx.seq[s]);
    free(cb->cx.seq);
    free(cb->cx.len);
    free(cb);
}

/* 1 when spec is in the comma-separated list (NULL: every candidate). */
static int cal_allowed(const char *list, const char *spec) {
    if (!list)
        return 1;
    size_t n = strlen(spec);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, spec, n))
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

kvqt_calib *kvqt_calib_prepare(const kvq_model *m, const kvq_tokenizer *tk, char **lines, size_t nl,
                               size_t max_tokens, size_t page, int progress, const char *only) {
    kvqt_calib *cb = calloc(1, sizeof *cb);
    if (!cb)
        return NULL;
    cal_ctx *cx = &cb->cx;
    cx->m = m;
    cx->page = page;
    kvq_model_get_info(m, &cx->in);
    size_t L = cx->in.n_layers, H = cx->in.n_kv_heads, d = cx->in.head_dim, V = cx->in.vocab_size;
    cb->L = L, cb->H = H, cb->d = d;
    cx->seq = calloc(nl, sizeof *cx->seq);
    cx->len = calloc(nl, sizeof *cx->len);
    for (size_t i = 0; i < nl && cx->ntok < max_tokens; i++) {
        size_t cap = strlen(lines[i]) + 3, n;
        cx->seq[cx->nseq] = malloc(cap * sizeof(int32_t));
        kvq_tokenizer_encode(tk, lines[i], 1, 0, cx->seq[cx->nseq], cap, &n);
        if (n > cx->in.seq_len)
            n = cx->in.seq_len; /* whole sequences: their page slack is what eval will see */
        if (n < 2) {
            free(cx->seq[cx->nseq]);
            continue;
        }
        cx->len[cx->nseq++] = n;
        cx->ntok += n - 1;
    }
    if (!cx->ntok) {
        kvqt_calib_free(cb);
        return NULL;
    }
    /* reference log-probs and the f32 keys/values (pre-RoPE) for fitting */
    cx->ref_logp = malloc(cx->ntok * V * sizeof(float));
    cx->next = malloc(cx->ntok * sizeof(int32_t));
    size_t nkv = 0;
    for (size_t s = 0; s < cx->nseq; s++)
        nkv += cx->len[s];
    float *K = malloc(L * H * nkv * d * sizeof(float)), *Vv = malloc(L * H * nkv * d * sizeof(float));
    float *lg = malloc(cx->in.seq_len * V * sizeof(float));
    float *row = malloc(cx->in.seq_len * H * d * sizeof(float)), *rowv = malloc(cx->in.seq_len * H * d * sizeof(float));
    size_t at = 0, kat = 0;
    kvqt_cacheopts fo;
    kvqt_cacheopts_init(&fo);
    fo.k_prerope = 1;
    for (size_t s = 0; s < cx->nseq; s++) {
        kvq_cache *c = kvqt_make_cache(m, &fo, "calibrate");
        kvq_model_forward(m, c, cx->seq[s], cx->len[s], 0, lg, cx->in.seq_len * V, 0);
        for (size_t t = 0; t + 1 < cx->len[s]; t++, at++) {
            cal_logsoftmax(lg + t * V, V, cx->ref_logp + at * V);
            cx->next[at] = cx->seq[s][t + 1];
        }
        for (size_t l = 0; l < L; l++) {
            kvq_cache_get_kv(c, l, -1, 0, cx->len[s], row, rowv, cx->len[s] * H * d);
            for (size_t t = 0; t < cx->len[s]; t++)
                for (size_t h = 0; h < H; h++) {
                    memcpy(K + ((l * H + h) * nkv + kat + t) * d, row + (t * H + h) * d, d * sizeof(float));
                    memcpy(Vv + ((l * H + h) * nkv + kat + t) * d, rowv + (t * H + h) * d, d * sizeof(float));
                }
        }
        kat += cx->len[s];
        kvq_cache_free(c);
    }
    free(lg), free(row), free(rowv);
    /* channel means of the pre-RoPE keys, subtracted before fitting */
    cb->center = calloc(L * H * d, sizeof(float));
    for (size_t u = 0; u < L * H; u++) {
        for (size_t t = 0; t < nkv; t++)
            for (size_t j = 0; j < d; j++)
                cb->center[u * d + j] += K[(u * nkv + t) * d + j];
        for (size_t j = 0; j < d; j++)
            cb->center[u * d + j] /= (float)nkv;
        for (size_t t = 0; t < nkv; t++)
            for (size_t j = 0; j < d; j++)
                K[(u * nkv + t) * d + j] -= cb->center[u * d + j];
    }
    /* candidates */
    cb->nu = L * H * 2;
    cb->U = calloc(cb->nu, sizeof *cb->U);
    static const char *kc[] = {"chan:int2", "chan:int3", "chan:int4", "nuq2", "nuq3", "nuq4",
                               "tq3:norm=8", "tq4:norm=8", "chan:int8", "nuq8", "f16"};
    static const char *vc[] = {"nuq2", "nuq3", "nuq4", "tq2:norm=8", "tq3:norm=8", "tq4:norm=8",
                               "int4", "int8", "nuq8", "f16"};
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < H; h++)
            for (int isv = 0; isv < 2; isv++) {
                cal_unit *u = &cb->U[(l * H + h) * 2 + (size_t)isv];
                u->layer = (int)l, u->head = (int)h, u->is_value = isv;
                const float *smp = (isv ? Vv : K) + (l * H + h) * nkv * d;
                const char **list = isv ? vc : kc;
                size_t nc = isv ? sizeof vc / sizeof vc[0] : sizeof kc / sizeof kc[0];
                for (size_t c = 0; c < nc; c++)
                    if (cal_allowed(only, list[c]))
                        cal_add(u, list[c], d, smp, nkv, page);
                if (u->n_cand == 0) {
                    fprintf(stderr, "kvq calibrate: --codecs leaves no candidate for %s\n",
                            isv ? "values" : "keys");
                    free(K), free(Vv);
                    kvqt_calib_free(cb);
                    return NULL;
                }
            }
    free(K), free(Vv);
    /* sensitivities: KL with only one unit compressed */
    size_t done = 0, total = 0;
    for (size_t i = 0; i < cb->nu; i++)
        total += (size_t)cb->U[i].n_cand;
    for (size_t i = 0; i < cb->nu; i++)
        for (int c = 0; c < cb->U[i].n_cand; c++) {
            kvqt_cacheopts o;
            cal_opts(&o, cb->U, cb->nu, (int)i, c, cb->center, L * H * d, page);
            double kl, nll, bits;
            if (!strcmp(cb->U[i].cand[c].codec, "f16")) {
                cb->U[i].cand[c].kl = 0; /* indistinguishable from f32 at this scale */
            } else if (cal_eval(cx, &o, &kl, &nll, &bits) == 0) {
                cb->U[i].cand[c].kl = kl > 0 ? kl : 0;
            } else {
                fprintf(stderr, "kvq calibrate: evaluating %s failed\n", cb->U[i].cand[c].codec);
                kvqt_calib_free(cb);
                return NULL;
            }
            done++;
            if (progress)
                fprintf(stderr, "\rmeasuring sensitivities %zu/%zu", done, total);
        }
    if (progress)
        fprintf(stderr, "\r%50s\r", "");
    if (getenv("KVQ_CALIB_DEBUG"))
        for (size_t i = 0; i < cb->nu; i++)
            for (int c = 0; c < cb->U[i].n_cand; c++)
                fprintf(stderr, "unit %zu L%d H%d %c %-12s bits %.3f kl %.6f\n", i, cb->U[i].layer,
                        cb->U[i].head, cb->U[i].is_value ? 'V' : 'K', cb->U[i].cand[c].codec,
                        cb->U[i].cand[c].bits, cb->U[i].cand[c].kl);
    cb->ntok = cx->ntok;
    return cb;
}

static void cal_cheapest(cal_unit *U, size_t nu) {
    for (size_t i = 0; i < nu; i++) {
        int best = 0;
        for (int c = 1; c < U[i].n_cand; c++)
            if (U[i].cand[c].bits < U[i].cand[best].bits ||
                (U[i].cand[c].bits == U[i].cand[best].bits && U[i].cand[c].kl < U[i].cand[best].kl))
                best = c;
        U[i].chosen = best;
    }
}

int kvqt_calib_allocate(kvqt_calib *cb, double target, const char *outp, kvqt_calib_result *res) {
    cal_unit *U = cb->U;
    size_t nu = cb->nu, L = cb->L, H = cb->H, d = cb->d;
    memset(res, 0, sizeof *res);
    cal_cheapest(U, nu);
    if (cal_avg_bits(U, nu) > target) {
        fprintf(stderr, "kvq calibrate: the cheapest allocation needs %.3f bits per value, above "
                        "the target %.3f\n", cal_avg_bits(U, nu), target);
        return 2;
    }
    /* the measured bits exceed the nominal ones by page slack and the f16
     * open page of channel keys; bisect the nominal budget so that the
     * measured bits meet the target */
    double kl = 0, nll = 0, bits = 0, lo = cal_avg_bits(U, nu), hi = target;
    int *best = malloc(nu * sizeof(int)), have = 0;
    double best_kl = INFINITY, best_nll = 0, best_bits = 0;
    for (int round = 0; round < 7; round++) {
        double budget = round == 0 ? target : 0.5 * (lo + hi);
        cal_cheapest(U, nu);
        cal_greedy(U, nu, budget);
        kvqt_cacheopts o;
        cal_opts(&o, U, nu, -1, 0, cb->center, L * H * d, cb->cx.page);
        if (cal_eval(&cb->cx, &o, &kl, &nll, &bits) != 0) {
            free(best);
            return 1;
        }
        if (bits <= target + 1e-9) {
            if (kl < best_kl) {
                best_kl = kl, best_nll = nll, best_bits = bits, have = 1;
                for (size_t i = 0; i < nu; i++)
                    best[i] = U[i].chosen;
            }
            if (round == 0)
                break;
            lo = budget;
        } else {
            hi = budget;
        }
    }
    if (!have) {
        free(best);
        fprintf(stderr, "kvq calibrate: no allocation meets %.3f bits per value as stored\n", target);
        return 2;
    }
    for (size_t i = 0; i < nu; i++)
        U[i].chosen = best[i];
    free(best);
    kvqt_cacheopts f32o;
    kvqt_cacheopts_init(&f32o);
    double bk, bn, bb;
    cal_eval(&cb->cx, &f32o, &bk, &bn, &bb);
    res->target = target;
    res->bits = best_bits;
    res->nominal_bits = cal_avg_bits(U, nu);
    res->kl = best_kl;
    res->nll = best_nll;
    res->nll_f32 = bn;
    res->tokens = cb->ntok;
    FILE *f = fopen(outp, "w");
    if (!f) {
        fprintf(stderr, "kvq calibrate: cannot write %s\n", outp);
        return 1;
    }
    fprintf(f, "{\"kvq_alloc\": 1, \"target_bits\": %.4f, \"bits_per_value\": %.4f, "
               "\"nominal_bits\": %.4f, \"kl\": %.6g, \"nll\": %.6f, \"nll_f32\": %.6f, "
               "\"calibration_tokens\": %zu,\n",
            target, res->bits, res->nominal_bits, res->kl, res->nll, res->nll_f32, cb->ntok);
    fprintf(f, " \"k_codec\": \"f16\", \"v_codec\": \"f16\", \"k_layout\": \"token\", \"k_prerope\": "
               "true, \"k_center\": true, \"page\": %zu, \"recent\": 0,\n \"overrides\": [\n",
            cb->cx.page);
    for (size_t i = 0; i < nu; i++) {
        const cal_cand *c = &U[i].cand[U[i].chosen];
        fprintf(f, "  {\"layer\": %d, \"head\": %d, \"kind\": \"%s\", \"codec\": \"%s\", \"bits\": "
                   "%.4f, \"kl_alone\": %.6g",
                U[i].layer, U[i].head, U[i].is_value ? "v" : "k", c->codec, c->bits, c->kl);
        if (c->state) {
            fprintf(f, ", \"state\": \"");
            cal_hex(f, c->state, c->state_size);
            fprintf(f, "\"");
        }
        fprintf(f, "}%s\n", i + 1 < nu ? "," : "");
    }
    fprintf(f, " ],\n \"center\": [");
    for (size_t i = 0; i < L * H * d; i++)
        fprintf(f, "%s%.9g", i ? ", " : "", cb->center[i]);
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "kvq calibrate: writing %s failed\n", outp);
        return 1;
    }
    return 0;
}

static void kvqt_calib_print(const kvqt_calib *cb) {
    for (size_t i = 0; i < cb->nu; i++) {
        const cal_cand *c = &cb->U[i].cand[cb->U[i].chosen];
        printf("  %-7d %-5d %-4s %-12s %6.3f %12.6f\n", cb->U[i].layer, cb->U[i].head,
               cb->U[i].is_value ? "V" : "K", c->codec, c->bits, c->kl);
    }
}

int kvq_tool_calibrate(int argc, char **argv) {
    const char *outp = NULL;
    double target = 0;
    size_t max_tokens = 1024, page = 32;
    int json = 0;
    const char *only = NULL;
    const kvqt_opt opts[] = {{"--codecs", KVQT_OPT_STR, &only},
                             {"--target-bits", KVQT_OPT_DOUBLE, &target},
                             {"-o", KVQT_OPT_STR, &outp},
                             {"--max-tokens", KVQT_OPT_SIZE, &max_tokens},
                             {"--page", KVQT_OPT_SIZE, &page},
                             {"--json", KVQT_OPT_FLAG, &json}};
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, 1);
    int bad = kvqt_model_args(argc, argv, "calibrate", &mo, NULL, opts, KVQT_NOPTS(opts));
    if (bad || !kvqt_modelopts_complete(&mo) || !outp || !(target > 0) || max_tokens < 16 ||
        page < 1) {
        fprintf(stderr, "usage: kvq calibrate --model M --tokenizer T --text FILE --target-bits B "
                        "-o alloc.json [--json] [--max-tokens N (1024)] [--page N (32)]\n"
                        "  [--codecs LIST (restrict the candidates, e.g. nuq4 or chan:int3,tq3:norm=8)]\n"
                        "  candidates: keys chan:int2 chan:int3 chan:int4 nuq2 nuq3 nuq4 tq3:norm=8\n"
                        "  tq4:norm=8 chan:int8 nuq8 f16; values nuq2 nuq3 nuq4 tq2:norm=8 tq3:norm=8\n"
                        "  tq4:norm=8 int4 int8 nuq8 f16\n");
        return 2;
    }
    kvqt_model_session ms;
    if (kvqt_model_session_open(&ms, &mo, 1, "calibrate", " (or it has no lines)"))
        return 1;
    double t0 = kvqb_now();
    int rc = 1;
    kvqt_calib *cb = kvqt_calib_prepare(ms.model, ms.tok, ms.lines, ms.nlines, max_tokens, page,
                                        !json && isatty(2), only);
    kvqt_calib_result r;
    if (cb)
        rc = kvqt_calib_allocate(cb, target, outp, &r);
    if (rc == 0) {
        if (json) {
            printf("{\"target_bits\": %.4f, \"bits_per_value\": %.4f, \"nominal_bits\": %.4f, "
                   "\"kl\": %.6g, \"nll\": %.6f, \"nll_f32\": %.6f, \"tokens\": %zu, \"seconds\": "
                   "%.1f, \"output\": ",
                   target, r.bits, r.nominal_bits, r.kl, r.nll, r.nll_f32, r.tokens, kvqb_now() - t0);
            kvqb_json_str(stdout, outp);
            printf("}\n");
        } else {
            printf("kvq calibrate: %zu calibration tokens, target %.3f bits per value\n", r.tokens,
                   target);
            printf("  %-7s %-5s %-4s %-12s %6s %12s\n", "layer", "head", "K/V", "codec", "bits",
                   "KL alone");
            kvqt_calib_print(cb);
            printf("measured on the calibration text: %.3f bits per value (nominal %.3f), KL %.5f, "
                   "NLL %.4f (f32 %.4f)\n", r.bits, r.nominal_bits, r.kl, r.nll, r.nll_f32);
            printf("wrote %s (%.1f s)\n", outp, kvqb_now() - t0);
        }
    }
    kvqt_calib_free(cb);
    kvqt_model_session_close(&ms);
    return rc;
}
