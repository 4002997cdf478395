/*
 * model_eval.c - the measurement behind `kvq eval` and `kvq sweep`: every
 * line of a text teacher-forced through a compressed cache the way
 * inference runs it (an optional prefill chunk, then one token per forward
 * call), each prediction compared with an f32 reference (evalref.h), and the
 * figures llama-perplexity --kl-divergence users know: mean, median, p99 and
 * maximum KL, ΔNLL and KL with their standard errors, top-1 agreement, the
 * change of the top token's probability, and the cache's bits per value.
 */
#include "model_eval.h"
#include "evalref.h"
#include "cliargs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A cache for m with the options in o (shape from the model); NULL with st
 * and msg set when kvq_cache_create refuses it. */
static kvq_cache *kvqt_try_cache(const kvq_model *m, const kvqt_cacheopts *o,
                                 kvq_cache_config *cfg_out, kvq_status *st, char *msg,
                                 size_t msg_size) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(m, &cfg);
    kvqt_cacheopts_apply(o, &cfg);
    msg[0] = 0;
    cfg.err_msg = msg;
    cfg.err_msg_size = msg_size;
    if (cfg_out)
        *cfg_out = cfg;
    kvq_cache *c = NULL;
    *st = kvq_cache_create(&c, &cfg);
    if (!msg[0])
        snprintf(msg, msg_size, "%s", kvq_strerror(*st));
    return *st == KVQ_OK ? c : NULL;
}

/* The centre of --alloc must fit the model. */
static int kvqt_center_fits(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd) {
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    size_t need = in.n_layers * in.n_kv_heads * in.head_dim;
    if (o->center_values && o->center_count != need) {
        fprintf(stderr, "kvq %s: --alloc %s: its centre has %zu values, the model needs %zu\n",
                cmd, o->alloc_path ? o->alloc_path : "", o->center_count, need);
        return 0;
    }
    return 1;
}

kvq_cache *kvqt_make_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd) {
    if (!kvqt_center_fits(m, o, cmd))
        return NULL;
    char msg[256];
    kvq_status st;
    kvq_cache *c = kvqt_try_cache(m, o, NULL, &st, msg, sizeof msg);
    if (!c)
        fprintf(stderr, "kvq %s: cache: %s\n", cmd, msg);
    return c;
}

/* What the command line can do about a codec the cache refused, in place
 * of the library's message (msg, which names the codec): a nuq codec needs
 * tables that only kvq calibrate fits (and --alloc loads); chan: codecs are
 * keys only. 1 when msg was replaced. */
static int kvqt_codec_hint(const kvqt_cacheopts *o, kvq_status st, char *msg, size_t size) {
    if (st == KVQ_ERR_NOT_FITTED) {
        const char *at = strstr(msg, "codec nuq");
        char spec[16] = "";
        if (!at || sscanf(at + 6, "%15[^ ;]", spec) != 1)
            return 0;
        int b = spec[3] >= '2' && spec[3] <= '6' && !spec[4] ? spec[3] - '0' : 0;
        char how[96] = "kvq calibrate --codecs LIST -o FILE (its candidates are nuq2..nuq6)";
        if (b)
            snprintf(how, sizeof how, "kvq calibrate --codecs nuq%d --target-bits %d -o FILE", b,
                     b);
        snprintf(msg, size, "%s needs per-channel tables fitted to calibration data, which no "
                            "option gives: %s fits them for every head, and --alloc FILE (sweep: "
                            "alloc:FILE) loads them", spec, how);
        return 1;
    }
    if (!o->n_ovr && !strncmp(o->v_codec, "chan:", 5)) {
        const char *b = o->v_codec + 5; /* chan:intB: intB per token, where there is one */
        int same = !strcmp(b, "int2") || !strcmp(b, "int4") || !strcmp(b, "int8");
        snprintf(msg, size, "chan: is a key-only layout (per-channel scales over each page's "
                            "tokens, as KIVI keys); values are stored per token: give the values "
                            "a per-token codec such as %s (kvq codecs lists them)",
                 same ? b : "int4 or tq3");
        return 1;
    }
    return 0;
}

int kvqt_check_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd,
                     int name_option) {
    if (!kvqt_center_fits(m, o, cmd))
        return KVQT_EXIT_USAGE;
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    kvqt_cacheopts *t = malloc(sizeof *t);
    if (!t) {
        fprintf(stderr, "kvq %s: out of memory\n", cmd);
        return KVQT_EXIT_FAIL;
    }
    *t = *o; /* a shallow copy: not freed */
    if (t->budget_ratio > 0) { /* the largest budget a sequence can get */
        double b = ceil(t->budget_ratio * (double)in.seq_len);
        t->budget = b < 1 ? 1 : (size_t)b;
        t->budget_ratio = 0;
    }
    char msg[256], msg2[256];
    kvq_status st, st2;
    kvq_cache *c = kvqt_try_cache(m, t, NULL, &st, msg, sizeof msg);
    int rc = KVQT_EXIT_OK;
    if (c) {
        kvq_cache_free(c);
    } else if (st == KVQ_ERR_NOMEM || st == KVQ_ERR_IO) {
        fprintf(stderr, "kvq %s: cache: %s\n", cmd, msg);
        rc = KVQT_EXIT_FAIL;
    } else {
        /* name the option: the codecs one at a time in an f32 partner's place */
        const char *opt = NULL, *val = NULL;
        if (name_option && !t->n_ovr) {
            char k[sizeof t->k_codec];
            memcpy(k, t->k_codec, sizeof k);
            snprintf(t->k_codec, sizeof t->k_codec, "f32");
            int klay = t->k_layout_channel;
            t->k_layout_channel = 0;
            c = kvqt_try_cache(m, t, NULL, &st2, msg2, sizeof msg2);
            memcpy(t->k_codec, k, sizeof k);
            t->k_layout_channel = klay;
            if (c)
                opt = klay ? "--k-codec (with --k-layout channel)" : "--k-codec", val = o->k_codec;
            kvq_cache_free(c);
            if (!opt) {
                snprintf(t->v_codec, sizeof t->v_codec, "f32");
                c = kvqt_try_cache(m, t, NULL, &st2, msg2, sizeof msg2);
                if (c)
                    opt = "--v-codec", val = o->v_codec;
                kvq_cache_free(c);
            }
            if (!opt && !strcmp(t->k_codec, o->v_codec) && !t->k_layout_channel &&
                (st == KVQ_ERR_UNKNOWN_CODEC || st == KVQ_ERR_BAD_OPTION || st == KVQ_ERR_GROUP))
                opt = "--k-codec and --v-codec", val = o->k_codec;
        }
        int hinted = kvqt_codec_hint(o, st, msg, sizeof msg);
        if (hinted && st != KVQ_ERR_NOT_FITTED && !t->n_ovr) /* chan: values */
            opt = name_option ? "--v-codec" : NULL, val = o->v_codec;
        char hd[32] = ""; /* the model's head_dim, where the message leaves it out */
        if (!strstr(msg, "head_dim") && !hinted)
            snprintf(hd, sizeof hd, " (head_dim %zu)", in.head_dim);
        if (opt)
            fprintf(stderr, "kvq %s: %s %s: %s%s\n", cmd, opt, val, msg, hd);
        else if (name_option)
            fprintf(stderr, "kvq %s: the cache options do not fit this model: %s\n", cmd, msg);
        else
            fprintf(stderr, "kvq %s: %s%s\n", cmd, msg, hd);
        rc = KVQT_EXIT_USAGE;
    }
    free(t);
    return rc;
}

void kvqt_evalopts_init(kvqt_evalopts *eo) {
    memset(eo, 0, sizeof *eo);
    eo->cmd = "eval";
}

/* ---- the text: each line's tokens ------------------------------------------ */

typedef struct ev_text {
    int32_t *tk;          /* every sequence's tokens, one after another */
    size_t *start, *len;  /* per sequence */
    size_t n, predicted;  /* sequences; predicted tokens (sum of len - 1) */
    uint64_t hash;        /* evalref.h: the text hash */
} ev_text;

static void ev_text_free(ev_text *t) {
    free(t->tk);
    free(t->start);
    free(t->len);
    memset(t, 0, sizeof *t);
}

static uint64_t ev_hash_seq(uint64_t h, const int32_t *tk, size_t n) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    h = kvqt_fnv1a(h, b, 8);
    for (size_t t = 0; t < n; t++) {
        for (int i = 0; i < 4; i++)
            b[i] = (unsigned char)((uint32_t)tk[t] >> (8 * i));
        h = kvqt_fnv1a(h, b, 4);
    }
    return h;
}

/* Encodes each line (BOS first), keeps at most seq_len tokens and leaves out
 * lines of fewer than two tokens (nothing to predict). */
static int ev_text_make(ev_text *t, const kvq_tokenizer *tok, char **lines, size_t nlines,
                        size_t seq_len, const char *cmd) {
    memset(t, 0, sizeof *t);
    size_t total = 0;
    for (size_t i = 0; i < nlines; i++)
        total += strlen(lines[i]) + 3;
    t->tk = malloc((total ? total : 1) * sizeof *t->tk);
    t->start = malloc((nlines ? nlines : 1) * sizeof *t->start);
    t->len = malloc((nlines ? nlines : 1) * sizeof *t->len);
    if (!t->tk || !t->start || !t->len) {
        fprintf(stderr, "kvq %s: out of memory\n", cmd);
        return -1;
    }
    size_t used = 0;
    t->hash = KVQT_FNV_INIT;
    for (size_t i = 0; i < nlines; i++) {
        size_t n;
        if (kvq_tokenizer_encode(tok, lines[i], 1, 0, t->tk + used, total - used, &n) != KVQ_OK) {
            fprintf(stderr, "kvq %s: cannot encode line %zu\n", cmd, i + 1);
            return -1;
        }
        n = n < seq_len ? n : seq_len;
        if (n < 2)
            continue;
        t->start[t->n] = used;
        t->len[t->n++] = n;
        t->predicted += n - 1;
        t->hash = ev_hash_seq(t->hash, t->tk + used, n);
        used += n;
    }
    return 0;
}

/* ---- per-token figures ----------------------------------------------------- */

typedef struct ev_acc {
    double *kl, *dnll; /* per predicted token */
    size_t n;
    double nll, nll_ref, top1, dp, kept; /* sums */
} ev_acc;

static void ev_acc_add(ev_acc *a, const kvqt_token_cmp *c, double kept) {
    a->kl[a->n] = c->kl;
    a->dnll[a->n] = c->nll - c->nll_ref;
    a->n++;
    a->nll += c->nll;
    a->nll_ref += c->nll_ref;
    a->top1 += c->top1;
    a->dp += c->dp_top;
    a->kept += kept;
}

static void ev_mean_stderr(const double *x, size_t n, double *mean, double *se) {
    double s = 0, v = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    double m = s / (double)n;
    for (size_t i = 0; i < n; i++)
        v += (x[i] - m) * (x[i] - m);
    *mean = m;
    *se = n > 1 ? sqrt(v / (double)(n - 1) / (double)n) : 0;
}

static int ev_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q quantile of sorted x, interpolated between order statistics. */
static double ev_quantile(const double *x, size_t n, double q) {
    double h = (double)(n - 1) * q;
    size_t i = (size_t)h;
    return i + 1 < n ? x[i] + (h - (double)i) * (x[i + 1] - x[i]) : x[n - 1];
}

/* The means and spreads into r (sorts a->kl). */
static void ev_acc_finish(ev_acc *a, kvqt_eval_result *r) {
    r->tokens = a->n;
    if (!a->n)
        return;
    double n = (double)a->n;
    r->nll = a->nll / n;
    r->nll_f32 = a->nll_ref / n;
    r->top1 = a->top1 / n;
    r->dp_top_mean_abs = a->dp / n;
    r->tokens_kept_mean = a->kept / n;
    ev_mean_stderr(a->dnll, a->n, &r->delta_nll, &r->delta_nll_stderr);
    ev_mean_stderr(a->kl, a->n, &r->kl, &r->kl_stderr);
    qsort(a->kl, a->n, sizeof *a->kl, ev_cmp_double);
    r->kl_median = ev_quantile(a->kl, a->n, 0.5);
    r->kl_p99 = ev_quantile(a->kl, a->n, 0.99);
    r->kl_max = a->kl[a->n - 1];
}

/* ---- the run ----------------------------------------------------------------- */

typedef struct ev_ctx {
    const kvq_model *m;
    kvq_model_info in;
    const kvqt_evalopts *eo;
    const char *cmd;
    kvqt_cacheopts *run_o;    /* a copy of the options, budget set per sequence from ratio */
    double ratio;             /* --budget-ratio (the library's own ratio is left at 0) */
    kvqt_cacheopts f32o;
    kvqt_ref_cmp cmp;
    kvqt_ref_file file;
    int reading, writing;     /* file: --base-logits, --save-logits */
    kvqt_ref_row *rows;       /* the reference of the current sequence, [seq_len] */
    uint16_t *codes;          /* their codes, [seq_len][vocab] */
    float *ref_lg, *lg;       /* logits of the f32 run [seq_len][vocab], of the compressed run */
    ev_acc acc;
    double bits, vals, asym, fixed;
} ev_ctx;

static void ev_ctx_free(ev_ctx *cx) {
    kvqt_ref_close(&cx->file);
    kvqt_ref_cmp_free(&cx->cmp);
    free(cx->run_o), free(cx->rows), free(cx->codes), free(cx->ref_lg), free(cx->lg);
    free(cx->acc.kl), free(cx->acc.dnll);
}

static int ev_ctx_init(ev_ctx *cx, const kvq_model *m, const kvqt_cacheopts *o,
                       const kvqt_evalopts *eo, size_t predicted) {
    memset(cx, 0, sizeof *cx);
    cx->m = m;
    cx->eo = eo;
    cx->cmd = eo->cmd ? eo->cmd : "eval";
    kvq_model_get_info(m, &cx->in);
    kvqt_cacheopts_init(&cx->f32o);
    size_t S = cx->in.seq_len, V = cx->in.vocab_size;
    size_t chunk = eo->prefill < S ? eo->prefill : S;
    cx->run_o = malloc(sizeof *cx->run_o);
    cx->rows = malloc(S * sizeof *cx->rows);
    cx->codes = malloc(S * V * sizeof *cx->codes);
    cx->lg = malloc((chunk ? chunk : 1) * V * sizeof *cx->lg);
    cx->ref_lg = eo->base_logits ? NULL : malloc(S * V * sizeof *cx->ref_lg);
    cx->acc.kl = malloc((predicted ? predicted : 1) * sizeof(double));
    cx->acc.dnll = malloc((predicted ? predicted : 1) * sizeof(double));
    if (!cx->run_o || !cx->rows || !cx->codes || !cx->lg || (!eo->base_logits && !cx->ref_lg) ||
        !cx->acc.kl || !cx->acc.dnll || kvqt_ref_cmp_init(&cx->cmp, V) != 0) {
        fprintf(stderr, "kvq %s: out of memory\n", cx->cmd);
        return -1;
    }
    *cx->run_o = *o;
    cx->ratio = o->budget_ratio;
    cx->run_o->budget_ratio = 0;
    for (size_t t = 0; t < S; t++)
        cx->rows[t].codes = cx->codes + t * V;
    return 0;
}

/* Opens --base-logits (checked against this model and text) or starts
 * --save-logits; nothing without either. */
static int ev_file_open(ev_ctx *cx, const ev_text *t) {
    const kvqt_evalopts *eo = cx->eo;
    if (!eo->base_logits && !eo->save_logits)
        return 0;
    const char *opt = eo->base_logits ? "--base-logits" : "--save-logits";
    const char *path = eo->base_logits ? eo->base_logits : eo->save_logits;
    kvqt_ref_header h = {(uint32_t)cx->in.vocab_size, 0, 0, t->hash, t->n, t->predicted};
    if (!eo->model_path || kvqt_file_hash(eo->model_path, &h.model_size, &h.model_hash) != 0) {
        fprintf(stderr, "kvq %s: %s: cannot read the model file to hash it\n", cx->cmd, opt);
        return -1;
    }
    char err[512];
    int rc = eo->base_logits ? kvqt_ref_open(&cx->file, path, &h, err, sizeof err)
                             : kvqt_ref_create(&cx->file, path, &h, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kvq %s: %s %s: %s\n", cx->cmd, opt, path, err);
        return -1;
    }
    cx->reading = eo->base_logits != NULL;
    cx->writing = !cx->reading;
    return 0;
}

/* The reference rows 0..n-2 of a sequence: read, or one prefill of its n
 * tokens through an f32 cache (written out with --save-logits). */
static int ev_reference(ev_ctx *cx, const int32_t *tk, size_t n) {
    char err[256];
    size_t V = cx->in.vocab_size;
    for (size_t t = 0; cx->reading && t + 1 < n; t++)
        if (kvqt_ref_read(&cx->file, &cx->rows[t], err, sizeof err) != 0) {
            fprintf(stderr, "kvq %s: --base-logits %s: %s\n", cx->cmd, cx->eo->base_logits, err);
            return -1;
        }
    if (cx->reading)
        return 0;
    kvq_cache *c = kvqt_make_cache(cx->m, &cx->f32o, cx->cmd);
    if (!c)
        return -1;
    kvq_status st = kvq_model_forward(cx->m, c, tk, n, 0, cx->ref_lg, n * V, 0);
    kvq_cache_free(c);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq %s: f32 forward: %s\n", cx->cmd, kvq_strerror(st));
        return -1;
    }
    for (size_t t = 0; t + 1 < n; t++) {
        kvqt_ref_make(&cx->rows[t], cx->ref_lg + t * V, V, tk[t + 1]);
        if (cx->writing && kvqt_ref_write(&cx->file, &cx->rows[t]) != 0) {
            fprintf(stderr, "kvq %s: --save-logits %s: write failed\n", cx->cmd,
                    cx->eo->save_logits);
            return -1;
        }
    }
    return 0;
}

/* The budget of a sequence of n tokens under --budget-ratio R: ceil(R * N),
 * N the prefill length or n (the 1e-9 keeps 0.1 * 30 at 3). */
static size_t ev_budget(double ratio, size_t prefill, size_t n) {
    size_t N = prefill && prefill < n ? prefill : n;
    double b = ceil(ratio * (double)N - 1e-9);
    return b < 1 ? 1 : (size_t)b;
}

static kvq_cache *ev_story_cache(ev_ctx *cx, size_t n) {
    if (cx->ratio > 0)
        cx->run_o->budget = ev_budget(cx->ratio, cx->eo->prefill, n);
    return kvqt_make_cache(cx->m, cx->run_o, cx->cmd);
}

static size_t ev_layer0_tokens(const kvq_cache *c) {
    kvq_stats s;
    return kvq_cache_stats(c, 0, &s) == KVQ_OK ? (size_t)s.tokens : 0;
}

static void ev_score(ev_ctx *cx, const int32_t *tk, size_t t, const float *logits, size_t kept) {
    kvqt_token_cmp c;
    kvqt_ref_compare(&cx->cmp, &cx->rows[t], logits, tk[t + 1], &c);
    ev_acc_add(&cx->acc, &c, (double)kept);
}

/* The compressed run of a sequence of n tokens whose first n0 are in the
 * cache already: positions n0..prefill-1 in one chunk (its queries see the
 * whole chunk, exact), then one token per call; every prediction is scored. */
static kvq_status ev_decode(ev_ctx *cx, kvq_cache *c, const int32_t *tk, size_t n, size_t n0) {
    size_t V = cx->in.vocab_size, pre = cx->eo->prefill;
    size_t pe = pre > n0 ? (pre < n ? pre : n) : n0;
    kvq_status st = KVQ_OK;
    if (pe > n0) {
        st = kvq_model_forward(cx->m, c, tk + n0, pe - n0, (int32_t)n0, cx->lg, (pe - n0) * V, 0);
        for (size_t t = n0; st == KVQ_OK && t < pe && t + 1 < n; t++)
            ev_score(cx, tk, t, cx->lg + (t - n0) * V, t + 1); /* query t sees 0..t */
    }
    size_t held = ev_layer0_tokens(c);
    for (size_t t = pe; st == KVQ_OK && t < n; t++) {
        int scored = t + 1 < n;
        st = kvq_model_forward(cx->m, c, tk + t, 1, (int32_t)t, scored ? cx->lg : NULL, V, 1);
        if (st == KVQ_OK && scored)
            ev_score(cx, tk, t, cx->lg, held + 1); /* what it held, and the new token */
        held = ev_layer0_tokens(c);
    }
    return st;
}

static void ev_cache_figures(ev_ctx *cx, const kvq_cache *c, kvqt_eval_result *res) {
    kvq_stats s;
    kvq_cache_stats(c, -1, &s);
    cx->bits += (double)s.payload_bytes * 8.0;
    cx->vals += (double)s.tokens * (double)(cx->in.n_kv_heads * cx->in.head_dim) * 2.0;
    cx->asym += s.asymptotic_bits_per_value;
    cx->fixed += (double)s.fixed_bytes;
    res->total_bits += (double)s.stored_bytes * 8.0;
    res->sequences++;
}

/* One sequence: its reference, then the compressed run (with a prefix store,
 * leading pages of an earlier sequence with the same tokens are loaded
 * instead of computed, and only the rest is scored). */
static int ev_sequence(ev_ctx *cx, const int32_t *tk, size_t n, kvqt_eval_result *res) {
    kvq_store *ps = cx->run_o->prefix_store;
    if (ev_reference(cx, tk, n) != 0)
        return -1;
    kvq_cache *c = ev_story_cache(cx, n);
    if (!c)
        return -1;
    size_t n0 = 0;
    kvq_status st = KVQ_OK;
    if (ps && (st = kvq_cache_prefix_get(c, ps, tk, n, &n0)) != KVQ_OK)
        fprintf(stderr, "kvq %s: prefix store: %s\n", cx->cmd, kvq_strerror(st));
    if (st == KVQ_OK)
        st = ev_decode(cx, c, tk, n, n0);
    if (st == KVQ_OK && ps)
        st = kvq_cache_prefix_put(c, ps, tk, n);
    res->prefix_tokens += n0;
    if (st == KVQ_OK)
        ev_cache_figures(cx, c, res);
    else
        fprintf(stderr, "kvq %s: forward: %s\n", cx->cmd, kvq_strerror(st));
    kvq_cache_free(c);
    return st == KVQ_OK ? 0 : -1;
}

static void ev_progress(size_t done, size_t total) {
    int w = 30, bar = (int)(done * (size_t)w / (total ? total : 1));
    fprintf(stderr, "\r[%.*s%*s] %zu/%zu", bar, "##############################", w - bar, "", done,
            total);
}

int kvqt_eval_run_opts(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                       const kvqt_cacheopts *o, const kvqt_evalopts *eo, int progress,
                       kvqt_eval_result *res) {
    memset(res, 0, sizeof *res);
    res->prefill = eo->prefill;
    const char *cmd = eo->cmd ? eo->cmd : "eval";
    if (eo->base_logits && eo->save_logits) {
        fprintf(stderr, "kvq %s: --save-logits and --base-logits exclude each other\n", cmd);
        return -1;
    }
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    ev_text text;
    ev_ctx cx;
    int rc = ev_text_make(&text, tok, lines, nlines, in.seq_len, cmd);
    if (rc == 0 && text.n == 0) {
        fprintf(stderr, "kvq %s: no selected line has two or more tokens: nothing to predict\n",
                cmd);
        rc = -1;
    }
    /* what --prefill really does: each sequence takes at most its own length
     * in the chunk */
    size_t longest = 0;
    for (size_t i = 0; rc == 0 && i < text.n; i++) {
        longest = text.len[i] > longest ? text.len[i] : longest;
        res->prefill_whole += eo->prefill && text.len[i] <= eo->prefill;
    }
    if (rc == 0 && eo->prefill > longest) {
        fprintf(stderr, "kvq %s: --prefill %zu is longer than every sequence (the longest is %zu "
                        "tokens): each is prefilled whole, nothing is decoded; prefill %zu "
                        "reported\n", cmd, eo->prefill, longest, longest);
        res->prefill = longest;
    }
    if (rc == 0)
        rc = ev_ctx_init(&cx, m, o, eo, text.predicted);
    else
        memset(&cx, 0, sizeof cx);
    if (rc == 0)
        rc = ev_file_open(&cx, &text);
    for (size_t i = 0; rc == 0 && i < text.n; i++) {
        rc = ev_sequence(&cx, text.tk + text.start[i], text.len[i], res);
        if (progress)
            ev_progress(i + 1, text.n);
    }
    if (progress)
        fprintf(stderr, "\r%60s\r", "");
    char err[512];
    if (rc == 0 && cx.writing && kvqt_ref_commit(&cx.file, err, sizeof err) != 0) {
        fprintf(stderr, "kvq %s: --save-logits %s: %s\n", cmd, eo->save_logits, err);
        rc = -1;
    }
    if (rc == 0) {
        ev_acc_finish(&cx.acc, res);
        res->bits_per_value = cx.vals > 0 ? cx.bits / cx.vals : 0;
        res->total_bits_per_value = cx.vals > 0 ? res->total_bits / cx.vals : 0;
        if (res->sequences) {
            res->asymptotic_bits_per_value = cx.asym / (double)res->sequences;
            res->fixed_bytes_per_sequence = cx.fixed / (double)res->sequences;
        }
    }
    ev_ctx_free(&cx);
    ev_text_free(&text);
    return rc;
}

int kvqt_eval_run(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                  const kvqt_cacheopts *o, int progress, kvqt_eval_result *res) {
    kvqt_evalopts eo;
    kvqt_evalopts_init(&eo);
    return kvqt_eval_run_opts(m, tok, lines, nlines, o, &eo, progress, res);
}
