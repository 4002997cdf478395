/*
 * calibrate.c - `kvq calibrate`: per-head mixed precision, made automatic.
 *
 * A unit is the keys or the values of one KV head of one layer. For a unit
 * and a candidate codec the tool measures KL(f32 || compressed) of the
 * next-token distributions with only that unit compressed, decoding the
 * calibration text token by token as inference (and kvq eval) does: each
 * query sees the cache as it was when its token was decoded, so a channel
 * page is seen quantized only once a later token has settled it, and the
 * open page and recent window exact. Decoding is one model call per token,
 * and the public model API gives logits only (no hidden states or queries to
 * measure a layer from), so every measurement is a whole decode. It is kept
 * cheap three ways:
 *   - the runs decode about sens_tokens predicted tokens: the longest
 *     sequences of the text, whole (long contexts, every position; the first
 *     lines of a text are no sample of it), and score every stride-th
 *     prediction (the classifier of a large vocabulary costs more than the
 *     layers; unscored tokens still pass through the cache);
 *   - one candidate per family is measured (chan:int, nuq, tq: the member
 *     with 3-bit codes; chan:int2 too); KL is second order in a small
 *     error, so the other members' KL is the measured one times the ratio of
 *     their reconstruction errors on the decoded sequences (for f16: exact).
 *     --measure-all
 *     measures every candidate of 4 bits and below instead;
 *   - the runs are independent and spread over --jobs threads.
 * Codecs fitted to data (nuq tables) are fitted on the sequences the runs do
 * not decode, so that the runs see what the tables do on text they were not
 * fitted on (values outside a table's range are clipped); the allocation
 * keeps tables refitted on the whole text.
 *
 * Bits are the cache's asymptotic bits per value (kvq_stats): the payload of
 * one token in a full encoded page, channel-page headers and alignment
 * included. Each unit's cost is measured exactly on a one-head cache and the
 * units add up to the whole cache's figure. The allocation starts at every
 * unit's cheapest candidate and takes, while the mean stays within the
 * target, the upgrade with the most KL saved per bit added. The fixed cost of
 * a sequence (f16 staging of tokens not yet encoded, of the open channel
 * page and of the recent window, unfilled page slots) does not grow with its
 * length: it is reported in bytes beside the asymptotic figure, both measured
 * by decoding the whole calibration text with the allocation.
 *
 * Keys are stored pre-RoPE and centred on their per-channel mean over the
 * calibration text (written into the allocation), which makes per-channel
 * statistics stable. The result is a complete cache configuration in JSON,
 * fitted tables included, that every model command loads with --alloc.
 */
#include "kvq.h"
#include "benchlib.h"
#include "calibrate.h"
#include "cliargs.h"
#include "evalref.h"
#include "modelopts.h"
#include "tool.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CAL_MAX_CAND 16

typedef struct cal_cand {
    char codec[32];
    double bits;     /* asymptotic bits per value of this unit alone */
    double kl;       /* KL with only this unit compressed (measured or estimated) */
    double mse;      /* mean squared reconstruction error on the samples; < 0 unknown */
    int measure;     /* measured (1) or estimated from a measured sibling (0) */
    unsigned char *state;  /* fitted state the sensitivity runs use, or NULL */
    size_t state_size;
    unsigned char *fstate; /* fitted on all the calibration text (NULL: state) */
    size_t fstate_size;
} cal_cand;

typedef struct cal_unit {
    int layer, head, is_value;
    cal_cand cand[CAL_MAX_CAND];
    int n_cand, chosen;
} cal_unit;

struct kvqt_calib {
    const kvq_model *m;
    kvq_model_info in;
    kvqt_calib_opts o;
    int32_t *tk;         /* every sequence's tokens, back to back */
    size_t *start, *len; /* per sequence */
    size_t nseq, ntok;   /* sequences, predicted tokens */
    size_t sens_seq;     /* the first sens_seq sequences are the sensitivity runs' */
    size_t sens_tok;     /* their predicted tokens */
    size_t sens_kv;      /* their tokens (K/V samples) */
    kvqt_ref_row *ref;   /* [ntok] f32 reference rows, in text order */
    uint16_t *codes;     /* their codes [ntok][vocab] */
    float *center;       /* [layers][kv heads][head_dim] */
    cal_unit *U;
    size_t nu;
    double seconds;
};

/* One measuring run's figures. */
typedef struct cal_meas {
    double kl, nll, nll_ref, top1;
    size_t scored;
    double asym, fixed, bits;
} cal_meas;

/* ---- candidates ------------------------------------------------------------- */

typedef struct cal_menu_item {
    const char *codec;
    int measure;
} cal_menu_item;

static const cal_menu_item cal_keys[] = {
    {"chan:int2", 1}, {"chan:int3", 1}, {"chan:int4", 1}, {"nuq2", 1},
    {"nuq3", 1},      {"nuq4", 1},      {"tq3:norm=8", 1}, {"tq4:norm=8", 1},
    {"nuq5", 0},      {"nuq6", 0},      {"int8", 0},       {"f16", 0}};
static const cal_menu_item cal_values[] = {
    {"nuq2", 1}, {"nuq3", 1}, {"nuq4", 1}, {"tq2:norm=8", 1}, {"tq3:norm=8", 1},
    {"tq4:norm=8", 1}, {"int4", 1}, {"nuq5", 0}, {"nuq6", 0}, {"int8", 0}, {"f16", 0}};

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

/* The unit's asymptotic bits per value: a one-layer, one-head cache with
 * this candidate beside an f16 partner, less the partner. */
static int cal_unit_bits(const kvqt_calib *cb, int is_value, cal_cand *c) {
    double asym[2];
    for (int pass = 0; pass < 2; pass++) {
        kvq_cache_config cfg;
        kvq_cache_config_init(&cfg);
        cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.n_q_heads = 1;
        cfg.head_dim = cb->in.head_dim;
        cfg.max_tokens = cb->o.page;
        cfg.page_tokens = cb->o.page;
        cfg.k_codec = "f16", cfg.v_codec = "f16";
        kvq_codec_override ov = {0, 0, is_value, c->codec, c->state, c->state_size};
        if (pass == 0) {
            cfg.overrides = &ov;
            cfg.n_overrides = 1;
        }
        kvq_cache *kc;
        if (kvq_cache_create(&kc, &cfg) != KVQ_OK)
            return -1;
        kvq_stats st;
        kvq_cache_stats(kc, -1, &st);
        asym[pass] = st.asymptotic_bits_per_value;
        kvq_cache_free(kc);
    }
    /* a one-head cache's figure is (K + V) / 2; the partner is asym[1] / 2 * 2 */
    c->bits = 2.0 * asym[0] - asym[1];
    return 0;
}

/* The mean squared error of channel-layout keys (KIVI pages of the
 * calibration page size) on the sensitivity runs' sequences: each appended in chunks
 * of a page to a one-head cache, as decoding settles them, and read back
 * (the last, unsettled page stays exact, as it does in decoding). */
static double cal_chan_mse(const kvqt_calib *cb, const char *spec, const float *smp) {
    size_t d = cb->in.head_dim, P = cb->o.page;
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.n_q_heads = 1;
    cfg.head_dim = d;
    cfg.max_tokens = cb->in.seq_len;
    cfg.page_tokens = P;
    cfg.k_codec = "f16", cfg.v_codec = "f16";
    kvq_codec_override ov = {0, 0, 0, spec, NULL, 0};
    cfg.overrides = &ov;
    cfg.n_overrides = 1;
    float *back = malloc(cb->in.seq_len * d * sizeof(float));
    double e = 0;
    size_t at = 0, cnt = 0;
    int rc = back ? 0 : -1;
    for (size_t s = 0; rc == 0 && s < cb->sens_seq; s++) {
        size_t n = cb->len[s];
        const float *k = smp + at * d;
        kvq_cache *c = NULL;
        if (kvq_cache_create(&c, &cfg) != KVQ_OK)
            rc = -1;
        for (size_t t = 0; rc == 0 && t < n; t += P) {
            size_t m = n - t < P ? n - t : P;
            if (kvq_cache_append(c, 0, k + t * d, k + t * d, NULL, m) != KVQ_OK)
                rc = -1;
        }
        if (rc == 0 && kvq_cache_get_kv(c, 0, 0, 0, n, back, NULL, n * d) != KVQ_OK)
            rc = -1;
        for (size_t i = 0; rc == 0 && i < n * d; i++)
            e += ((double)back[i] - k[i]) * ((double)back[i] - k[i]);
        kvq_cache_free(c);
        at += n;
        cnt += n * d;
    }
    free(back);
    return rc == 0 && cnt ? e / (double)cnt : -1;
}

/* A codec for spec fitted on n samples when it needs fitting; its state
 * (NULL when it has none) is copied to *state. */
static kvq_codec *cal_codec(const char *spec, size_t d, const float *smp, size_t n,
                            unsigned char **state, size_t *state_size) {
    kvq_codec *k = NULL;
    *state = NULL;
    *state_size = 0;
    if (kvq_codec_create(&k, spec, d, NULL) != KVQ_OK)
        return NULL;
    if (kvq_codec_needs_fit(k) && kvq_codec_fit(k, smp, n) != KVQ_OK) {
        kvq_codec_free(k);
        return NULL;
    }
    if (kvq_codec_state_bytes(k) > 0) {
        size_t sz = 0;
        kvq_codec_save_state(k, NULL, 0, &sz);
        *state = malloc(sz);
        if (!*state || kvq_codec_save_state(k, *state, sz, &sz) != KVQ_OK) {
            free(*state);
            *state = NULL;
            kvq_codec_free(k);
            return NULL;
        }
        *state_size = sz;
    }
    return k;
}

/* Mean squared error of a codec's round trip over n samples; < 0 on error. */
static double cal_codec_mse(const kvq_codec *k, const float *smp, size_t n) {
    size_t d = kvq_codec_head_dim(k), cap = kvq_codec_encode_bound(k, n);
    unsigned char *enc = malloc(cap);
    float *dec = malloc(n * d * sizeof(float));
    double e = -1;
    if (enc && dec && kvq_codec_encode(k, enc, cap, smp, n) == KVQ_OK &&
        kvq_codec_decode(k, dec, n * d, enc, n * kvq_codec_vector_bytes(k)) == KVQ_OK) {
        e = 0;
        for (size_t i = 0; i < n * d; i++)
            e += ((double)dec[i] - smp[i]) * ((double)dec[i] - smp[i]);
        e /= (double)(n * d);
    }
    free(enc), free(dec);
    return e;
}

/* Adds a candidate to a unit. Codecs fitted to data (nuq) are fitted twice:
 * on the calibration sequences that the sensitivity runs do not decode (the
 * tables those runs measure, and the error is taken on the decoded ones, so
 * both see text the tables were not fitted on: a table clips what it has
 * not seen), and on all of them (the tables the allocation keeps). smp holds
 * the unit's ns samples, sequence by sequence. */
static int cal_add(const kvqt_calib *cb, cal_unit *u, const char *spec, int measure,
                   const float *smp, size_t ns) {
    cal_cand *c = &u->cand[u->n_cand];
    memset(c, 0, sizeof *c);
    snprintf(c->codec, sizeof c->codec, "%s", spec);
    c->measure = measure;
    c->mse = -1;
    size_t d = cb->in.head_dim, s1 = cb->sens_kv;
    size_t f0 = s1 < ns ? s1 : 0; /* the fitting samples: [f0, ns) */
    if (!strncmp(spec, "chan:", 5)) {
        c->mse = cal_chan_mse(cb, spec, smp);
    } else {
        kvq_codec *k = cal_codec(spec, d, smp + f0 * d, ns - f0, &c->state, &c->state_size);
        if (!k)
            return -1;
        c->mse = cal_codec_mse(k, smp, s1);
        kvq_codec_free(k);
        if (c->mse < 0)
            return -1;
        if (c->state && f0 > 0) {
            k = cal_codec(spec, d, smp, ns, &c->fstate, &c->fstate_size);
            if (!k)
                return -1;
            kvq_codec_free(k);
        }
    }
    if (cal_unit_bits(cb, u->is_value, c) != 0)
        return -1;
    u->n_cand++;
    return 0;
}

/* ---- decoding runs ---------------------------------------------------------- */

/* A cache of f32 heads, except the given overrides, with pre-RoPE centred
 * keys, the calibration page and recent window. */
static kvq_cache *cal_cache(const kvqt_calib *cb, const kvq_codec_override *ov, size_t nov) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(cb->m, &cfg);
    cfg.k_codec = "f32";
    cfg.v_codec = "f32";
    cfg.overrides = nov ? ov : NULL;
    cfg.n_overrides = nov;
    cfg.k_prerope = 1;
    cfg.k_center = 1;
    cfg.k_center_values = cb->center;
    cfg.page_tokens = cb->o.page;
    cfg.recent_window = cb->o.recent;
    char msg[256] = "";
    cfg.err_msg = msg;
    cfg.err_msg_size = sizeof msg;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&c, &cfg);
    if (st != KVQ_OK)
        fprintf(stderr, "kvq calibrate: cache: %s\n", msg[0] ? msg : kvq_strerror(st));
    return c;
}

/* Decodes the first nseq sequences token by token through a cache with the
 * overrides and compares every stride-th prediction with the reference.
 * cmp and lg ([vocab]) are the caller's scratch. */
static int cal_run(const kvqt_calib *cb, const kvq_codec_override *ov, size_t nov, size_t nseq,
                   size_t stride, kvqt_ref_cmp *cmp, float *lg, cal_meas *out) {
    memset(out, 0, sizeof *out);
    size_t V = cb->in.vocab_size, at = 0;
    double vals = 0, pb = 0;
    for (size_t s = 0; s < nseq; s++) {
        kvq_cache *c = cal_cache(cb, ov, nov);
        if (!c)
            return -1;
        const int32_t *tk = cb->tk + cb->start[s];
        size_t n = cb->len[s];
        for (size_t t = 0; t < n; t++) {
            int scored = t + 1 < n && t % stride == 0;
            kvq_status st = kvq_model_forward(cb->m, c, tk + t, 1, (int32_t)t, scored ? lg : NULL, V, 1);
            if (st != KVQ_OK) {
                fprintf(stderr, "kvq calibrate: forward: %s\n", kvq_strerror(st));
                kvq_cache_free(c);
                return -1;
            }
            if (!scored)
                continue;
            kvqt_token_cmp r;
            kvqt_ref_compare(cmp, &cb->ref[at + t], lg, tk[t + 1], &r);
            out->kl += r.kl;
            out->nll += r.nll;
            out->nll_ref += r.nll_ref;
            out->top1 += r.top1;
            out->scored++;
        }
        at += n - 1;
        kvq_stats st;
        kvq_cache_stats(c, -1, &st);
        out->asym = st.asymptotic_bits_per_value;
        out->fixed += (double)st.fixed_bytes;
        pb += (double)st.payload_bytes * 8.0;
        vals += (double)st.tokens * (double)(cb->in.n_kv_heads * cb->in.head_dim) * 2.0;
        kvq_cache_free(c);
    }
    if (out->scored) {
        double k = (double)out->scored;
        out->kl /= k, out->nll /= k, out->nll_ref /= k, out->top1 /= k;
    }
    out->fixed /= (double)(nseq ? nseq : 1);
    out->bits = vals > 0 ? pb / vals : 0;
    return 0;
}

/* ---- the sensitivity runs, spread over threads --------------------------- */

typedef struct cal_job {
    int unit, cand;
} cal_job;

typedef struct cal_pool {
    kvqt_calib *cb;
    cal_job *jobs;
    size_t njobs, next, done;
    int failed;
    pthread_mutex_t mu;
} cal_pool;

static void *cal_worker(void *arg) {
    cal_pool *p = arg;
    kvqt_calib *cb = p->cb;
    kvqt_ref_cmp cmp;
    float *lg = malloc(cb->in.vocab_size * sizeof(float));
    int ok = lg && kvqt_ref_cmp_init(&cmp, cb->in.vocab_size) == 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!ok)
            p->failed = 1;
        size_t j = p->failed ? p->njobs : p->next++;
        pthread_mutex_unlock(&p->mu);
        if (j >= p->njobs)
            break;
        cal_unit *u = &cb->U[p->jobs[j].unit];
        cal_cand *c = &u->cand[p->jobs[j].cand];
        kvq_codec_override ov = {u->layer, u->head, u->is_value, c->codec, c->state, c->state_size};
        cal_meas m;
        int rc = cal_run(cb, &ov, 1, cb->sens_seq, cb->o.stride, &cmp, lg, &m);
        pthread_mutex_lock(&p->mu);
        if (rc)
            p->failed = 1;
        c->kl = m.kl > 0 ? m.kl : 0;
        p->done++;
        if (cb->o.progress)
            fprintf(stderr, "\rmeasuring sensitivities %zu/%zu", p->done, p->njobs);
        pthread_mutex_unlock(&p->mu);
    }
    if (ok)
        kvqt_ref_cmp_free(&cmp);
    free(lg);
    return NULL;
}

static int cal_measure_all(kvqt_calib *cb) {
    cal_pool p;
    memset(&p, 0, sizeof p);
    p.cb = cb;
    for (size_t i = 0; i < cb->nu; i++)
        for (int c = 0; c < cb->U[i].n_cand; c++)
            p.njobs += cb->U[i].cand[c].measure;
    p.jobs = malloc((p.njobs ? p.njobs : 1) * sizeof *p.jobs);
    if (!p.jobs)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < cb->nu; i++)
        for (int c = 0; c < cb->U[i].n_cand; c++)
            if (cb->U[i].cand[c].measure)
                p.jobs[k++] = (cal_job){(int)i, c};
    pthread_mutex_init(&p.mu, NULL);
    size_t nth = cb->o.jobs > 1 ? cb->o.jobs : 1;
    pthread_t *th = calloc(nth, sizeof *th);
    size_t started = 0;
    for (size_t t = 1; th && t < nth; t++, started++)
        if (pthread_create(&th[t], NULL, cal_worker, &p) != 0)
            break;
    cal_worker(&p);
    for (size_t t = 1; t <= started; t++)
        pthread_join(th[t], NULL);
    pthread_mutex_destroy(&p.mu);
    free(th);
    free(p.jobs);
    if (cb->o.progress)
        fprintf(stderr, "\r%50s\r", "");
    return p.failed ? -1 : 0;
}

/* The family of a codec: its name up to the first digit ("chan:int", "nuq",
 * "tq", "int", "f"). */
static size_t cal_family(const char *codec) {
    return strcspn(codec, "0123456789");
}

/* The bits of a codec's codes: the number after its family name. */
static int cal_code_bits(const char *codec) {
    return atoi(codec + cal_family(codec));
}

static int cal_same_family(const char *a, const char *b) {
    size_t n = cal_family(a);
    return n == cal_family(b) && !strncmp(a, b, n);
}

/* Which candidates are measured. With measure_all, those the menu marks
 * (4 bits and below); otherwise anchors of the families chan:int, nuq and
 * tq: the member whose codes are closest to 3 bits (the size of the codes,
 * not the bits per value with scales and page headers), and for chan:int
 * also the one closest to 2 bits (on stories260K and stories15M the KL of
 * 2-bit channel keys was 1.3 to 1.6 times what the error ratio to 3 bits
 * predicts, with a wide spread; 2-bit nuq and tq stay within about 1.3x).
 * Without any such family in the unit (a --codecs list), the candidate
 * closest to 3 bits per value is measured.
 * f16 is never measured (it counts as exact). */
static void cal_plan(cal_unit *u, int measure_all) {
    if (measure_all)
        return; /* the menu's flags */
    static const struct {
        const char *family;
        int code_bits;
    } anchored[] = {{"chan:int", 3}, {"chan:int", 2}, {"nuq", 3}, {"tq", 3}};
    int any = 0;
    for (int c = 0; c < u->n_cand; c++)
        u->cand[c].measure = 0;
    for (size_t f = 0; f < sizeof anchored / sizeof *anchored; f++) {
        int best = -1, b = anchored[f].code_bits;
        for (int c = 0; c < u->n_cand; c++)
            if (cal_same_family(u->cand[c].codec, anchored[f].family) &&
                (best < 0 || abs(cal_code_bits(u->cand[c].codec) - b) <
                                 abs(cal_code_bits(u->cand[best].codec) - b)))
                best = c;
        if (best >= 0)
            u->cand[best].measure = any = 1;
    }
    if (!any) {
        int best = -1;
        for (int c = 0; c < u->n_cand; c++)
            if (strcmp(u->cand[c].codec, "f16") &&
                (best < 0 || fabs(u->cand[c].bits - 3) < fabs(u->cand[best].bits - 3)))
                best = c;
        if (best >= 0)
            u->cand[best].measure = 1;
    }
}

/* The KL of candidates that were not measured: KL is second order in a
 * small error, so a measured candidate's KL is scaled by the ratio of
 * reconstruction errors on the calibration samples, from the measured
 * member of the same family, else from the measured candidate whose error
 * is closest. f16 (and anything that reconstructs exactly) counts as exact. */
static void cal_estimate(cal_unit *u) {
    for (int c = 0; c < u->n_cand; c++) {
        cal_cand *x = &u->cand[c];
        if (x->measure)
            continue;
        int a = -1;
        for (int m = 0; m < u->n_cand; m++) {
            const cal_cand *y = &u->cand[m];
            if (!y->measure || y->mse <= 0)
                continue;
            int fam = cal_same_family(y->codec, x->codec);
            int afam = a >= 0 && cal_same_family(u->cand[a].codec, x->codec);
            if (a < 0 || (fam && !afam) ||
                (fam == afam && fabs(log(y->mse / x->mse)) < fabs(log(u->cand[a].mse / x->mse))))
                a = m;
        }
        if (!strcmp(x->codec, "f16") || x->mse <= 0 || a < 0)
            x->kl = 0;
        else
            x->kl = u->cand[a].kl * x->mse / u->cand[a].mse;
    }
}

/* ---- preparation -------------------------------------------------------------- */

void kvqt_calib_opts_init(kvqt_calib_opts *o) {
    memset(o, 0, sizeof *o);
    o->page = 32;
    o->sens_tokens = 640;
    o->stride = 3;
    o->jobs = 1;
}

void kvqt_calib_free(kvqt_calib *cb) {
    if (!cb)
        return;
    for (size_t i = 0; cb->U && i < cb->nu; i++)
        for (int c = 0; c < cb->U[i].n_cand; c++) {
            free(cb->U[i].cand[c].state);
            free(cb->U[i].cand[c].fstate);
        }
    free(cb->U), free(cb->center), free(cb->ref), free(cb->codes);
    free(cb->tk), free(cb->start), free(cb->len);
    free(cb);
}

/* The lines as sequences (BOS first, at most seq_len tokens, two or more). */
static int cal_text(kvqt_calib *cb, const kvq_tokenizer *tok, char **lines, size_t nl) {
    size_t total = 0;
    for (size_t i = 0; i < nl; i++)
        total += strlen(lines[i]) + 3;
    cb->tk = malloc((total ? total : 1) * sizeof *cb->tk);
    cb->start = malloc((nl ? nl : 1) * sizeof *cb->start);
    cb->len = malloc((nl ? nl : 1) * sizeof *cb->len);
    if (!cb->tk || !cb->start || !cb->len)
        return -1;
    size_t used = 0;
    for (size_t i = 0; i < nl; i++) {
        size_t n;
        if (kvq_tokenizer_encode(tok, lines[i], 1, 0, cb->tk + used, total - used, &n) != KVQ_OK)
            return -1;
        n = n < cb->in.seq_len ? n : cb->in.seq_len;
        if (n < 2)
            continue;
        cb->start[cb->nseq] = used;
        cb->len[cb->nseq++] = n;
        cb->ntok += n - 1;
        used += n;
    }
    /* the sensitivity runs decode the longest sequences (the long contexts
     * where compression matters, every position), up to sens_tokens
     * predicted tokens; they go first */
    for (size_t i = 0; i < cb->nseq && cb->sens_tok < cb->o.sens_tokens; i++) {
        size_t b = i;
        for (size_t j = i + 1; j < cb->nseq; j++)
            if (cb->len[j] > cb->len[b])
                b = j;
        size_t st = cb->start[b], ln = cb->len[b];
        memmove(cb->start + i + 1, cb->start + i, (b - i) * sizeof *cb->start);
        memmove(cb->len + i + 1, cb->len + i, (b - i) * sizeof *cb->len);
        cb->start[i] = st, cb->len[i] = ln;
        cb->sens_seq = i + 1;
        cb->sens_tok += ln - 1;
        cb->sens_kv += ln;
    }
    return cb->ntok ? 0 : -1;
}

/* The f32 reference (one prefill of each sequence through an f32 cache, as
 * kvq eval's) and the pre-RoPE keys and values of every layer and head:
 * K and V are [layers * kv heads][tokens][head_dim]. */
static int cal_reference(kvqt_calib *cb, float *K, float *Vv, size_t nkv) {
    size_t V = cb->in.vocab_size, S = cb->in.seq_len, L = cb->in.n_layers;
    size_t H = cb->in.n_kv_heads, d = cb->in.head_dim;
    float *lg = malloc(S * V * sizeof(float));
    float *rk = malloc(S * H * d * sizeof(float)), *rv = malloc(S * H * d * sizeof(float));
    int rc = lg && rk && rv ? 0 : -1;
    size_t at = 0, kat = 0;
    for (size_t s = 0; s < cb->nseq && rc == 0; s++) {
        const int32_t *tk = cb->tk + cb->start[s];
        size_t n = cb->len[s];
        for (int pre = 0; pre < 2 && rc == 0; pre++) {
            kvq_cache_config cfg;
            kvq_cache_config_init(&cfg);
            kvq_model_cache_shape(cb->m, &cfg);
            cfg.k_codec = "f32", cfg.v_codec = "f32";
            cfg.k_prerope = pre;
            kvq_cache *c = NULL;
            if (kvq_cache_create(&c, &cfg) != KVQ_OK ||
                kvq_model_forward(cb->m, c, tk, n, 0, pre ? NULL : lg, n * V, 0) != KVQ_OK) {
                rc = -1;
            } else if (!pre) {
                for (size_t t = 0; t + 1 < n; t++)
                    kvqt_ref_make(&cb->ref[at + t], lg + t * V, V, tk[t + 1]);
            } else {
                for (size_t l = 0; l < L && rc == 0; l++) {
                    if (kvq_cache_get_kv(c, l, -1, 0, n, rk, rv, n * H * d) != KVQ_OK)
                        rc = -1;
                    for (size_t t = 0; t < n && rc == 0; t++)
                        for (size_t h = 0; h < H; h++) {
                            size_t u = l * H + h;
                            memcpy(K + (u * nkv + kat + t) * d, rk + (t * H + h) * d, d * sizeof(float));
                            memcpy(Vv + (u * nkv + kat + t) * d, rv + (t * H + h) * d, d * sizeof(float));
                        }
                }
            }
            kvq_cache_free(c);
        }
        at += n - 1;
        kat += n;
    }
    free(lg), free(rk), free(rv);
    return rc;
}

kvqt_calib *kvqt_calib_new(const kvq_model *m, const kvq_tokenizer *tok, char **lines,
                           size_t nlines, const kvqt_calib_opts *o) {
    double t0 = kvqb_now();
    kvqt_calib *cb = calloc(1, sizeof *cb);
    if (!cb)
        return NULL;
    cb->m = m;
    cb->o = *o;
    if (cb->o.stride < 1)
        cb->o.stride = 1;
    kvq_model_get_info(m, &cb->in);
    size_t L = cb->in.n_layers, H = cb->in.n_kv_heads, d = cb->in.head_dim, V = cb->in.vocab_size;
    if (cal_text(cb, tok, lines, nlines) != 0) {
        fprintf(stderr, "kvq calibrate: the text has no line of two or more tokens\n");
        kvqt_calib_free(cb);
        return NULL;
    }
    size_t nkv = cb->ntok + cb->nseq;
    cb->ref = malloc(cb->ntok * sizeof *cb->ref);
    cb->codes = malloc(cb->ntok * V * sizeof *cb->codes);
    float *K = malloc(L * H * nkv * d * sizeof(float)), *Vv = malloc(L * H * nkv * d * sizeof(float));
    cb->center = calloc(L * H * d, sizeof(float));
    cb->nu = L * H * 2;
    cb->U = calloc(cb->nu, sizeof *cb->U);
    int rc = cb->ref && cb->codes && K && Vv && cb->center && cb->U ? 0 : -1;
    for (size_t t = 0; rc == 0 && t < cb->ntok; t++)
        cb->ref[t].codes = cb->codes + t * V;
    if (rc == 0 && cal_reference(cb, K, Vv, nkv) != 0) {
        fprintf(stderr, "kvq calibrate: the f32 reference run failed\n");
        rc = -1;
    }
    /* channel means of the pre-RoPE keys, subtracted before fitting */
    for (size_t u = 0; rc == 0 && u < L * H; u++) {
        double *acc = calloc(d, sizeof(double));
        for (size_t t = 0; acc && t < nkv; t++)
            for (size_t j = 0; j < d; j++)
                acc[j] += K[(u * nkv + t) * d + j];
        for (size_t j = 0; acc && j < d; j++)
            cb->center[u * d + j] = (float)(acc[j] / (double)nkv);
        for (size_t t = 0; t < nkv; t++)
            for (size_t j = 0; j < d; j++)
                K[(u * nkv + t) * d + j] -= cb->center[u * d + j];
        if (!acc)
            rc = -1;
        free(acc);
    }
    for (size_t l = 0; rc == 0 && l < L; l++)
        for (size_t h = 0; rc == 0 && h < H; h++)
            for (int isv = 0; rc == 0 && isv < 2; isv++) {
                cal_unit *u = &cb->U[(l * H + h) * 2 + (size_t)isv];
                u->layer = (int)l, u->head = (int)h, u->is_value = isv;
                const float *smp = (isv ? Vv : K) + (l * H + h) * nkv * d;
                const cal_menu_item *menu = isv ? cal_values : cal_keys;
                size_t nm = isv ? sizeof cal_values / sizeof *cal_values
                                : sizeof cal_keys / sizeof *cal_keys;
                for (size_t c = 0; rc == 0 && c < nm; c++) {
                    if (!cal_allowed(o->only, menu[c].codec))
                        continue;
                    if (cal_add(cb, u, menu[c].codec, menu[c].measure, smp, nkv) != 0) {
                        fprintf(stderr, "kvq calibrate: candidate %s failed\n", menu[c].codec);
                        rc = -1;
                    }
                }
                if (rc == 0 && u->n_cand == 0) {
                    fprintf(stderr, "kvq calibrate: --codecs leaves no candidate for %s\n",
                            isv ? "values" : "keys");
                    rc = -1;
                }
                if (rc == 0)
                    cal_plan(u, o->measure_all);
            }
    free(K), free(Vv);
    if (rc == 0 && cal_measure_all(cb) != 0) {
        fprintf(stderr, "kvq calibrate: a sensitivity run failed\n");
        rc = -1;
    }
    if (rc) {
        kvqt_calib_free(cb);
        return NULL;
    }
    for (size_t i = 0; i < cb->nu; i++)
        cal_estimate(&cb->U[i]);
    if (o->verbose)
        for (size_t i = 0; i < cb->nu; i++)
            for (int c = 0; c < cb->U[i].n_cand; c++) {
                const cal_cand *x = &cb->U[i].cand[c];
                fprintf(stderr, "unit L%d H%d %c %-12s bits %6.3f kl %.3e %s mse %.3e\n",
                        cb->U[i].layer, cb->U[i].head, cb->U[i].is_value ? 'V' : 'K', x->codec,
                        x->bits, x->kl, x->measure ? "measured " : "estimated", x->mse);
            }
    cb->seconds = kvqb_now() - t0;
    return cb;
}

/* ---- allocation --------------------------------------------------------------- */

static double cal_mean_bits(const cal_unit *U, size_t nu) {
    double b = 0;
    for (size_t i = 0; i < nu; i++)
        b += U[i].cand[U[i].chosen].bits;
    return b / (double)nu;
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

/* From the cheapest choice, repeatedly take the upgrade with the most KL
 * saved per bit added while the mean stays within the budget. */
static void cal_greedy(cal_unit *U, size_t nu, double budget) {
    cal_cheapest(U, nu);
    double total = cal_mean_bits(U, nu) * (double)nu, cap = budget * (double)nu + 1e-9;
    for (;;) {
        double best_ratio = 0;
        int bu = -1, bc = -1;
        for (size_t i = 0; i < nu; i++) {
            const cal_cand *a = &U[i].cand[U[i].chosen];
            for (int c = 0; c < U[i].n_cand; c++) {
                const cal_cand *b = &U[i].cand[c];
                double db = b->bits - a->bits, dk = a->kl - b->kl;
                if (db <= 0 || dk <= 0 || total + db > cap)
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
        total += U[bu].cand[bc].bits - U[bu].cand[U[bu].chosen].bits;
        U[bu].chosen = bc;
    }
}

/* The state the allocation keeps: fitted on all the calibration text. */
static const unsigned char *cal_final_state(const cal_cand *c, size_t *n) {
    *n = c->fstate ? c->fstate_size : c->state_size;
    return c->fstate ? c->fstate : c->state;
}

static void cal_hex(FILE *f, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", p[i]);
}

typedef struct cal_wctx {
    const kvqt_calib *cb;
    const kvqt_calib_report *r;
} cal_wctx;

static int cal_write_json(FILE *f, void *ctx) {
    const kvqt_calib *cb = ((const cal_wctx *)ctx)->cb;
    const kvqt_calib_report *r = ((const cal_wctx *)ctx)->r;
    fprintf(f, "{\"kvq_alloc\": 1, \"target_bits\": %.4f, \"asymptotic_bits_per_value\": %.4f, "
               "\"fixed_bytes_per_sequence\": %.0f, \"bits_per_value\": %.4f, "
               "\"nominal_bits\": %.4f, \"kl\": %.6g, \"kl_estimate\": %.6g, \"nll\": %.6f, "
               "\"nll_f32\": %.6f, \"calibration_tokens\": %zu, \"sensitivity_tokens\": %zu,\n",
            r->target, r->asymptotic_bits, r->fixed_bytes, r->bits, r->asymptotic_bits, r->kl,
            r->kl_estimate, r->nll, r->nll_f32, r->tokens, r->sens_tokens);
    fprintf(f, " \"k_codec\": \"f16\", \"v_codec\": \"f16\", \"k_layout\": \"token\", \"k_prerope\": "
               "true, \"k_center\": true, \"page\": %zu, \"recent\": %zu,\n \"overrides\": [\n",
            cb->o.page, cb->o.recent);
    for (size_t i = 0; i < cb->nu; i++) {
        const cal_unit *u = &cb->U[i];
        const cal_cand *c = &u->cand[u->chosen];
        fprintf(f, "  {\"layer\": %d, \"head\": %d, \"kind\": \"%s\", \"codec\": \"%s\", \"bits\": "
                   "%.4f, \"kl_alone\": %.6g, \"measured\": %s",
                u->layer, u->head, u->is_value ? "v" : "k", c->codec, c->bits, c->kl,
                c->measure ? "true" : "false");
        size_t sn;
        const unsigned char *st = cal_final_state(c, &sn);
        if (st) {
            fprintf(f, ", \"state\": \"");
            cal_hex(f, st, sn);
            fprintf(f, "\"");
        }
        fprintf(f, "}%s\n", i + 1 < cb->nu ? "," : "");
    }
    size_t nc = cb->in.n_layers * cb->in.n_kv_heads * cb->in.head_dim;
    fprintf(f, " ],\n \"center\": [");
    for (size_t i = 0; i < nc; i++)
        fprintf(f, "%s%.9g", i ? ", " : "", cb->center[i]);
    fprintf(f, "]}\n");
    return 0;
}

/* The allocation file, written whole or not at all. */
static int cal_write(const kvqt_calib *cb, const char *path, const kvqt_calib_report *r) {
    cal_wctx w = {cb, r};
    return kvqt_write_file(cb->o.cmd ? cb->o.cmd : "calibrate", path, cal_write_json, &w) ? 1 : 0;
}

int kvqt_calib_solve(kvqt_calib *cb, double target, const char *out, kvqt_calib_report *r) {
    memset(r, 0, sizeof *r);
    cal_cheapest(cb->U, cb->nu);
    double low = cal_mean_bits(cb->U, cb->nu);
    if (low > target + 1e-9) {
        fprintf(stderr, "kvq calibrate: the cheapest allocation needs %.3f bits per value, above "
                        "the target %.3f\n", low, target);
        return 2;
    }
    cal_greedy(cb->U, cb->nu, target);
    kvq_codec_override *ov = calloc(cb->nu, sizeof *ov);
    if (!ov)
        return 1;
    for (size_t i = 0; i < cb->nu; i++) {
        const cal_unit *u = &cb->U[i];
        const cal_cand *c = &u->cand[u->chosen];
        size_t sn;
        const unsigned char *st = cal_final_state(c, &sn);
        ov[i] = (kvq_codec_override){u->layer, u->head, u->is_value, c->codec, st, sn};
        r->kl_estimate += c->kl;
    }
    kvqt_ref_cmp cmp;
    float *lg = malloc(cb->in.vocab_size * sizeof(float));
    cal_meas m;
    int rc = lg && kvqt_ref_cmp_init(&cmp, cb->in.vocab_size) == 0 ? 0 : 1;
    if (rc == 0) {
        rc = cal_run(cb, ov, cb->nu, cb->nseq, 1, &cmp, lg, &m) ? 1 : 0;
        kvqt_ref_cmp_free(&cmp);
    }
    free(lg), free(ov);
    if (rc)
        return rc;
    if (m.asym > target + 1e-6) { /* the units' costs add up to the cache's: never expected */
        fprintf(stderr, "kvq calibrate: the allocation stores %.4f bits per value, above %.4f\n",
                m.asym, target);
        return 1;
    }
    r->target = target;
    r->asymptotic_bits = m.asym;
    r->fixed_bytes = m.fixed;
    r->bits = m.bits;
    r->kl = m.kl;
    r->nll = m.nll;
    r->nll_f32 = m.nll_ref;
    r->top1 = m.top1;
    r->tokens = cb->ntok;
    r->sens_tokens = cb->sens_tok;
    r->seconds_measure = cb->seconds;
    return out ? cal_write(cb, out, r) : 0;
}

const float *kvqt_calib_center(const kvqt_calib *cb, size_t *n) {
    *n = cb->in.n_layers * cb->in.n_kv_heads * cb->in.head_dim;
    return cb->center;
}

void kvqt_calib_print(const kvqt_calib *cb) {
    printf("  %-6s %-5s %-4s %-12s %7s %12s\n", "layer", "head", "K/V", "codec", "bits", "KL alone");
    for (size_t i = 0; i < cb->nu; i++) {
        const cal_unit *u = &cb->U[i];
        const cal_cand *c = &u->cand[u->chosen];
        printf("  %-6d %-5d %-4s %-12s %7.3f %12.3e%s\n", u->layer, u->head,
               u->is_value ? "V" : "K", c->codec, c->bits, c->kl, c->measure ? "" : " (est.)");
    }
}

/* ---- the command ---------------------------------------------------------------- */

/* ---- checks before the work ------------------------------------------------- */

static int cal_in_menu(const cal_menu_item *menu, size_t n, const char *spec, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(menu[i].codec) == len && !strncmp(menu[i].codec, spec, len))
            return 1;
    return 0;
}

static void cal_print_menus(FILE *f) {
    fprintf(f, "keys:");
    for (size_t i = 0; i < sizeof cal_keys / sizeof *cal_keys; i++)
        fprintf(f, " %s", cal_keys[i].codec);
    fprintf(f, "; values:");
    for (size_t i = 0; i < sizeof cal_values / sizeof *cal_values; i++)
        fprintf(f, " %s", cal_values[i].codec);
}

int kvqt_calib_check_codecs(const char *only, const char *cmd) {
    if (!only)
        return 0;
    const size_t nk = sizeof cal_keys / sizeof *cal_keys, nv = sizeof cal_values / sizeof *cal_values;
    int keys = 0, values = 0;
    for (const char *p = only;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int k = cal_in_menu(cal_keys, nk, p, len), v = cal_in_menu(cal_values, nv, p, len);
        if (!k && !v) {
            fprintf(stderr, "kvq %s: --codecs: '%.*s' is not a candidate (", cmd, (int)len, p);
            cal_print_menus(stderr);
            fprintf(stderr, ")\n");
            return -1;
        }
        keys |= k, values |= v;
        if (!e)
            break;
        p = e + 1;
    }
    if (!keys || !values) {
        fprintf(stderr, "kvq %s: --codecs %s has no candidate for the %s (", cmd, only,
                keys ? "values" : "keys");
        cal_print_menus(stderr);
        fprintf(stderr, ")\n");
        return -1;
    }
    return 0;
}

double kvqt_calib_cheapest(const kvq_model *m, const kvqt_calib_opts *o) {
    kvqt_calib cb;
    memset(&cb, 0, sizeof cb);
    cb.m = m;
    cb.o = *o;
    kvq_model_get_info(m, &cb.in);
    size_t d = cb.in.head_dim, ns = 64;
    float *smp = malloc(ns * d * sizeof(float));
    if (!smp)
        return -1;
    uint64_t r = 0x9e3779b97f4a7c15ull; /* any data: a codec's size does not depend on it */
    for (size_t i = 0; i < ns * d; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        smp[i] = (float)((double)(r >> 11) * 0x1.0p-53 - 0.5);
    }
    double least[2] = {INFINITY, INFINITY};
    for (int isv = 0; isv < 2; isv++) {
        const cal_menu_item *menu = isv ? cal_values : cal_keys;
        size_t nm = isv ? sizeof cal_values / sizeof *cal_values : sizeof cal_keys / sizeof *cal_keys;
        for (size_t i = 0; i < nm; i++) {
            if (!cal_allowed(o->only, menu[i].codec))
                continue;
            cal_cand c;
            memset(&c, 0, sizeof c);
            snprintf(c.codec, sizeof c.codec, "%s", menu[i].codec);
            kvq_codec *k = NULL;
            if (strncmp(c.codec, "chan:", 5) != 0 &&
                !(k = cal_codec(c.codec, d, smp, ns, &c.state, &c.state_size)))
                continue;
            kvq_codec_free(k);
            if (cal_unit_bits(&cb, isv, &c) == 0 && c.bits < least[isv])
                least[isv] = c.bits;
            free(c.state);
        }
    }
    free(smp);
    return isfinite(least[0]) && isfinite(least[1]) ? (least[0] + least[1]) / 2 : -1;
}

static void cal_usage(FILE *f) {
    fprintf(f,
            "usage: kvq calibrate --model M --tokenizer T --text FILE [--skip N] [--max-lines N]\n"
            "                     --target-bits B -o alloc.json [--json] [--verbose]\n"
            "                     [--max-tokens N] [--stride N] [--jobs N] [--page N]\n"
            "                     [--recent N] [--codecs LIST] [--measure-all]\n"
            "  chooses a codec per layer, KV head and K/V from measurements of KL(f32 || kvq)\n"
            "  decoding the text, within B asymptotic bits per value (a long sequence's bytes\n"
            "  per token; the fixed bytes of a sequence are reported beside them), and writes\n"
            "  the allocation, which every model command loads with --alloc FILE\n"
            "  --target-bits B       0 < B <= 32, at least the cheapest allocation's bits\n"
            "  -o FILE               the allocation (JSON); checked writable before the work\n"
            "  --max-tokens N        predicted tokens of the sensitivity runs, 1..2^30 (640)\n"
            "  --stride N            score every N-th of them, 1..2^30 (3)\n"
            "  --jobs N              measuring threads, 1..256 (1)\n"
            "  --page N              the allocation's cache page, 1..4096 (32)\n"
            "  --recent N            its f16 recent window, 0..2^30 (0)\n"
            "  --codecs LIST         restrict the candidates, e.g. nuq4 or chan:int3,tq3:norm=8\n"
            "  --measure-all         measure every candidate of 4 bits and below\n"
            "  --verbose             every unit's candidates and their KL on stderr\n"
            "  --json                one JSON object on stdout instead of the table\n"
            "  candidates: ");
    cal_print_menus(f);
    fprintf(f, "\nexit status: 0 ok, 1 failure (files, model, run), 2 usage error\n");
}

int kvq_tool_calibrate(int argc, char **argv) {
    const char *outp = NULL;
    double target = 0;
    int json = 0, verbose = 0;
    kvqt_calib_opts co;
    kvqt_calib_opts_init(&co);
    const size_t M = KVQT_MAX_COUNT;
    const kvqt_opt opts[] = {KVQT_STR("--codecs", &co.only),
                             KVQT_DOUBLE("--target-bits", &target, 0, 32, 1),
                             KVQT_STR("-o", &outp),
                             KVQT_SIZE("--max-tokens", &co.sens_tokens, 1, M),
                             KVQT_SIZE("--stride", &co.stride, 1, M),
                             KVQT_SIZE("--page", &co.page, 1, 4096),
                             KVQT_SIZE("--recent", &co.recent, 0, M),
                             KVQT_SIZE("--jobs", &co.jobs, 1, 256),
                             KVQT_FLAG("--measure-all", &co.measure_all),
                             KVQT_FLAG("--verbose", &verbose),
                             KVQT_FLAG("--json", &json)};
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, 1);
    const char *cmd = "calibrate";
    int r0 = kvqt_model_args(argc, argv, cmd, &mo, NULL, opts, KVQT_NOPTS(opts));
    if (r0 == KVQT_ARGS_HELP) {
        cal_usage(stdout);
        return KVQT_EXIT_OK;
    }
    if (r0 != KVQT_ARGS_OK || kvqt_modelopts_require(&mo, cmd) != 0)
        return KVQT_EXIT_USAGE;
    if (!(target > 0))
        return kvqt_usage_error(cmd, "--target-bits B is required");
    if (!outp)
        return kvqt_usage_error(cmd, "-o FILE (where the allocation goes) is required");
    if (kvqt_calib_check_codecs(co.only, cmd) != 0)
        return kvqt_usage_hint(cmd);
    if (kvqt_check_output_file(cmd, "-o", outp) != 0)
        return KVQT_EXIT_FAIL;
    co.progress = !json && isatty(2);
    co.verbose = verbose;
    kvqt_model_session ms;
    if (kvqt_model_session_open(&ms, &mo, 1, cmd))
        return KVQT_EXIT_FAIL;
    /* the cheapest allocation needs no measurement: refuse a target below
     * it before the sensitivity runs */
    double low = kvqt_calib_cheapest(ms.model, &co);
    if (low < 0) {
        kvq_model_info in;
        kvq_model_get_info(ms.model, &in);
        fprintf(stderr, "kvq calibrate: no candidate codec works at the model's head_dim %zu\n",
                in.head_dim);
        kvqt_model_session_close(&ms);
        return KVQT_EXIT_FAIL;
    }
    if (target + 1e-9 < low) {
        kvqt_model_session_close(&ms);
        return kvqt_usage_error(cmd, "--target-bits %g is below the cheapest allocation, %.4f "
                                     "asymptotic bits per value (page %zu%s%s)",
                                target, low, co.page, co.only ? ", --codecs " : "",
                                co.only ? co.only : "");
    }
    double t0 = kvqb_now();
    int rc = KVQT_EXIT_FAIL;
    kvqt_calib *cb = kvqt_calib_new(ms.model, ms.tok, ms.lines, ms.nlines, &co);
    kvqt_calib_report r;
    if (cb)
        rc = kvqt_calib_solve(cb, target, outp, &r);
    if (rc == 0) {
        double dn = r.nll_f32 > 0 ? 100.0 * (r.nll - r.nll_f32) / r.nll_f32 : 0;
        if (json) {
            printf("{\"target_bits\": %.4f, \"asymptotic_bits_per_value\": %.4f, "
                   "\"fixed_bytes_per_sequence\": %.0f, \"bits_per_value\": %.4f, \"kl\": %.6g, "
                   "\"kl_estimate\": %.6g, \"nll\": %.6f, \"nll_f32\": %.6f, \"delta_nll_pct\": "
                   "%.4f, \"top1_agree\": %.6f, \"tokens\": %zu, \"sensitivity_tokens\": %zu, "
                   "\"seconds_measure\": %.1f, \"seconds\": %.1f, \"output\": ",
                   target, r.asymptotic_bits, r.fixed_bytes, r.bits, r.kl, r.kl_estimate, r.nll,
                   r.nll_f32, dn, r.top1, r.tokens, r.sens_tokens, r.seconds_measure,
                   kvqb_now() - t0);
            kvqb_json_str(stdout, outp);
            printf("}\n");
        } else {
            printf("kvq calibrate: %zu calibration tokens (%zu in the sensitivity runs), target "
                   "%.3f bits per value\n", r.tokens, r.sens_tokens, target);
            kvqt_calib_print(cb);
            printf("asymptotic %.3f bits per value, fixed %.0f bytes per sequence (%.3f bits per "
                   "value as stored on the calibration text)\n",
                   r.asymptotic_bits, r.fixed_bytes, r.bits);
            printf("decoding the calibration text: KL %.5f (sum of units alone %.5f), NLL %.4f "
                   "(f32 %.4f, %+.2f%%), top-1 %.4f\n",
                   r.kl, r.kl_estimate, r.nll, r.nll_f32, dn, r.top1);
            printf("wrote %s (%.1f s, sensitivities %.1f s)\n", outp, kvqb_now() - t0,
                   r.seconds_measure);
        }
    }
    kvqt_calib_free(cb);
    kvqt_model_session_close(&ms);
    return rc;
}
