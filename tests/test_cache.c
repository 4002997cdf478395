/*
 * test_cache.c - the cache: fused attention over encoded pages against a
 * naive f32 reference (exact for f32, and exact against the cache's own
 * decoded K/V for every codec), GQA and MQA, recent window, pre-RoPE and
 * centred keys, channel layout, precision switching, eviction invariants,
 * byte accounting through a counting allocator, bad input and allocation
 * failures leaving the cache unchanged, threads.
 */
#include "testutil.h"

#define KVQ__MIN_T(a, b) ((a) < (b) ? (a) : (b))

typedef struct {
    size_t L, H, QH, d, n;
    float *k, *v; /* [L][n][H][d] post-RoPE */
    float *kpre;  /* [L][n][H][d] pre-RoPE */
    int32_t *pos; /* [n] */
} seqdata;

static void rope(float *x, size_t d, int32_t pos, double theta) {
    for (size_t i = 0; i < d / 2; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)d);
        float val = (float)pos * freq, fcr = cosf(val), fci = sinf(val);
        float v0 = x[2 * i], v1 = x[2 * i + 1];
        x[2 * i] = v0 * fcr - v1 * fci;
        x[2 * i + 1] = v0 * fci + v1 * fcr;
    }
}

static void make_seq(seqdata *s, size_t L, size_t H, size_t QH, size_t d, size_t n, tu_rng *r) {
    s->L = L, s->H = H, s->QH = QH, s->d = d, s->n = n;
    size_t m = L * n * H * d;
    s->k = malloc(m * sizeof(float));
    s->kpre = malloc(m * sizeof(float));
    s->v = malloc(m * sizeof(float));
    s->pos = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        s->pos[i] = (int32_t)(i * 2 + 3); /* gaps, to exercise positions */
    for (size_t i = 0; i < m; i++) {
        size_t c = i % d;
        s->kpre[i] = (float)tu_gauss(r) + (c == 1 ? 3.0f : 0.0f);
        s->v[i] = (float)tu_gauss(r);
    }
    memcpy(s->k, s->kpre, m * sizeof(float));
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < n; t++)
            for (size_t h = 0; h < H; h++)
                rope(s->k + ((l * n + t) * H + h) * d, d, s->pos[t], 10000.0);
}

static void free_seq(seqdata *s) {
    free(s->k);
    free(s->kpre);
    free(s->v);
    free(s->pos);
}

/* naive attention over explicit K/V rows [n][H][d] with positions. */
static void naive_attend(size_t H, size_t QH, size_t d, size_t n, const float *K, const float *V,
                         const int32_t *kpos, const float *q, int32_t qp, float *out) {
    size_t G = QH / H;
    double *sc = malloc(n * sizeof(double));
    for (size_t qh = 0; qh < QH; qh++) {
        size_t h = qh / G;
        double mx = -1e300;
        for (size_t j = 0; j < n; j++) {
            if (kpos[j] > qp) {
                sc[j] = -1e300;
                continue;
            }
            double s = 0;
            for (size_t t = 0; t < d; t++)
                s += (double)q[qh * d + t] * K[(j * H + h) * d + t];
            sc[j] = s / sqrt((double)d);
            if (sc[j] > mx)
                mx = sc[j];
        }
        double l = 0;
        for (size_t t = 0; t < d; t++)
            out[qh * d + t] = 0;
        double *o = calloc(d, sizeof(double));
        for (size_t j = 0; j < n; j++) {
            if (kpos[j] > qp)
                continue;
            double w = exp(sc[j] - mx);
            l += w;
            for (size_t t = 0; t < d; t++)
                o[t] += w * V[(j * H + h) * d + t];
        }
        for (size_t t = 0; t < d; t++)
            out[qh * d + t] = l > 0 ? (float)(o[t] / l) : 0.0f;
        free(o);
    }
    free(sc);
}

static kvq_cache *make_cache(kvq_cache_config *cfg) {
    kvq_cache *c = NULL;
    char msg[200] = "";
    cfg->err_msg = msg;
    cfg->err_msg_size = sizeof msg;
    kvq_status st = kvq_cache_create(&c, cfg);
    TU_REPORT(st == KVQ_OK, "cache create (%s/%s): %s [%s]", cfg->k_codec, cfg->v_codec,
              kvq_strerror(st), msg);
    cfg->err_msg = NULL;
    cfg->err_msg_size = 0;
    return c;
}

static void fill_cache(kvq_cache *c, const seqdata *s, int prerope, size_t chunk) {
    size_t HD = s->H * s->d;
    for (size_t l = 0; l < s->L; l++)
        for (size_t t = 0; t < s->n; t += chunk) {
            size_t m = KVQ__MIN_T(chunk, s->n - t);
            const float *k = (prerope ? s->kpre : s->k) + (l * s->n + t) * HD;
            CHECK_OK(kvq_cache_append(c, l, k, s->v + (l * s->n + t) * HD, s->pos + t, m));
        }
}

/* Compares cache attention at a few query positions with (a) naive attention
 * over the exact data and (b) naive attention over the cache's own decoded
 * K/V (the fused kernels must match the latter closely for every codec). */
static void check_attention(kvq_cache *c, const seqdata *s, size_t layer, double tol_exact,
                            double tol_decoded, const char *what, tu_rng *r) {
    size_t QH = s->QH, d = s->d, H = s->H, n;
    CHECK_OK(kvq_cache_tokens(c, layer, &n));
    float *q = malloc(QH * d * sizeof(float)), *out = malloc(QH * d * sizeof(float));
    float *ref = malloc(QH * d * sizeof(float)), *ref2 = malloc(QH * d * sizeof(float));
    float *K = malloc((n + 1) * H * d * sizeof(float)), *V = malloc((n + 1) * H * d * sizeof(float));
    int32_t *kp = malloc((n + 1) * sizeof(int32_t));
    CHECK_OK(kvq_cache_positions(c, layer, kp, n));
    double worst1 = 0, worst2 = 0;
    int32_t qps[3] = {s->pos[s->n - 1], s->pos[s->n / 2], s->pos[0]};
    for (int qi = 0; qi < 3; qi++) {
        /* what this attend sees (an attend that reaches the newest token
         * settles staged tokens after it: the next one sees them encoded) */
        CHECK_OK(kvq_cache_get_kv(c, layer, -1, 0, n, K, V, n * H * d));
        tu_fill_gauss(r, q, QH * d, 1.0f);
        CHECK_OK(kvq_cache_attend(c, layer, q, &qps[qi], 1, out, QH * d, NULL, 0));
        naive_attend(H, QH, d, s->n, s->k + layer * s->n * H * d, s->v + layer * s->n * H * d,
                     s->pos, q, qps[qi], ref);
        /* the decoded keys are pre-RoPE when the cache stores them so */
        naive_attend(H, QH, d, n, K, V, kp, q, qps[qi], ref2);
        double e1 = tu_rel_err(out, ref, QH * d), e2 = tu_rel_err(out, ref2, QH * d);
        worst1 = fmax(worst1, e1);
        worst2 = fmax(worst2, e2);
    }
    TU_REPORT(worst1 <= tol_exact, "%s: attention rel err vs exact f32 %.3g > %.3g", what, worst1,
              tol_exact);
    if (tol_decoded > 0)
        TU_REPORT(worst2 <= tol_decoded, "%s: attention rel err vs its own decoded K/V %.3g > %.3g",
                  what, worst2, tol_decoded);
    free(q), free(out), free(ref), free(ref2), free(K), free(V), free(kp);
}

static void base_cfg(kvq_cache_config *cfg, const seqdata *s, const char *kc, const char *vc) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = s->L;
    cfg->n_kv_heads = s->H;
    cfg->n_q_heads = s->QH;
    cfg->head_dim = s->d;
    cfg->max_tokens = 4096;
    cfg->k_codec = kc;
    cfg->v_codec = vc;
}

/* A cache made with cfg, filled with s in chunks of `chunk` tokens (pre-RoPE
 * keys when prerope), its attention on `layer` checked as check_attention
 * does, then freed; nothing more when creation fails (make_cache reports
 * it). */
static void check_filled(kvq_cache_config *cfg, const seqdata *s, int prerope, size_t chunk,
                         size_t layer, double tol_exact, double tol_decoded, const char *what,
                         tu_rng *r) {
    kvq_cache *c = make_cache(cfg);
    if (!c)
        return;
    fill_cache(c, s, prerope, chunk);
    check_attention(c, s, layer, tol_exact, tol_decoded, what, r);
    kvq_cache_free(c);
}

/* The start of most tests: a random sequence s (L layers, H KV heads, QH
 * query heads, head_dim d, n tokens; free it with free_seq) and cfg set to
 * its shape with codecs kc and vc. */
static void seq_and_cfg(seqdata *s, kvq_cache_config *cfg, size_t L, size_t H, size_t QH, size_t d,
                        size_t n, const char *kc, const char *vc, tu_rng *r) {
    make_seq(s, L, H, QH, d, n, r);
    base_cfg(cfg, s, kc, vc);
}

static void test_exact_and_codecs(tu_rng *r) {
    const size_t shapes[][3] = {{2, 8, 16}, {1, 4, 32}, {4, 4, 8}, {2, 6, 64}}; /* H, QH, d */
    for (size_t si = 0; si < 4; si++) {
        seqdata s;
        make_seq(&s, 2, shapes[si][0], shapes[si][1], shapes[si][2], 75, r);
        kvq_cache_config cfg;
        base_cfg(&cfg, &s, "f32", "f32");
        char what[96];
        snprintf(what, sizeof what, "f32 H=%zu QH=%zu d=%zu", s.H, s.QH, s.d);
        check_filled(&cfg, &s, 0, 7, 1, 1e-5, 1e-5, what, r);
        /* every codec: close to exact, and matching its own decoded K/V */
        const char *codecs[][3] = {{"f16", "f16", "2e-3"},   {"bf16", "bf16", "2e-2"},
                                   {"int8", "int8", "2e-2"}, {"int4", "int4", "0.25"},
                                   {"tq4", "tq4", "0.25"},   {"tq3", "tq3", "0.5"},
                                   {"int8", "tq3", "0.3"},   {"tqp3", "int4", "0.6"}};
        for (size_t ci = 0; ci < 8; ci++) {
            base_cfg(&cfg, &s, codecs[ci][0], codecs[ci][1]);
            cfg.page_tokens = 8;
            snprintf(what, sizeof what, "%s/%s H=%zu QH=%zu d=%zu", codecs[ci][0], codecs[ci][1],
                     s.H, s.QH, s.d);
            check_filled(&cfg, &s, 0, 75, 0, atof(codecs[ci][2]), 2e-2, what, r);
        }
        free_seq(&s);
    }
}

static void test_window_prerope_center_chan(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    /* recent window: the newest R tokens in f16, the rest int8 */
    seq_and_cfg(&s, &cfg, 2, 2, 4, 16, 90, "int8", "int8", r);
    cfg.recent_window = 20;
    check_filled(&cfg, &s, 0, 9, 1, 2e-2, 2e-3, "int8 + recent window 20", r);
    /* pre-RoPE keys in f32: exactly the post-RoPE result */
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_prerope = 1;
    check_filled(&cfg, &s, 1, 13, 0, 1e-5, 0, "f32 pre-RoPE", r);
    /* centring (given channel means: the pre-RoPE means of the keys, what
     * calibration would supply) is exact in f32 */
    float *cen = calloc(s.L * s.H * s.d, sizeof(float));
    for (size_t l = 0; l < s.L; l++)
        for (size_t t = 0; t < s.n; t++)
            for (size_t i = 0; i < s.H * s.d; i++)
                cen[l * s.H * s.d + i] += s.kpre[(l * s.n + t) * s.H * s.d + i] / (float)s.n;
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_center = 1;
    cfg.k_center_values = cen;
    check_filled(&cfg, &s, 0, 30, 1, 1e-5, 1e-5, "f32 centred", r);
    /* centring + pre-RoPE + tq keys */
    base_cfg(&cfg, &s, "tq4", "tq4");
    cfg.k_center = 1;
    cfg.k_center_values = cen;
    cfg.k_prerope = 1;
    check_filled(&cfg, &s, 1, 30, 1, 0.25, 0, "tq4 centred pre-RoPE", r);
    /* a centre without values is refused (it would come from the sequence) */
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_center = 1;
    {
        kvq_cache *bad = NULL;
        CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_INVALID_ARG);
        CHECK(bad == NULL);
    }
    free(cen);
    /* channel layout int8 keys, pages of 16: partial page stays f16 */
    const char *ck[] = {"int8", "int4", "int3", "int2"};
    const double ct[] = {2e-2, 0.2, 0.35, 0.7};
    for (int i = 0; i < 4; i++) {
        base_cfg(&cfg, &s, ck[i], "int8");
        cfg.k_layout = KVQ_LAYOUT_CHANNEL;
        cfg.k_prerope = i >= 2;
        char what[64];
        snprintf(what, sizeof what, "channel %s%s", ck[i], cfg.k_prerope ? " pre-RoPE" : "");
        check_filled(&cfg, &s, cfg.k_prerope, 11, 1, ct[i], cfg.k_prerope ? 0 : 2e-2, what, r);
    }
    base_cfg(&cfg, &s, "tq3", "int8");
    cfg.k_layout = KVQ_LAYOUT_CHANNEL;
    kvq_cache *bad = NULL;
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_BAD_OPTION);
    free_seq(&s);
}

static void test_precision_switch(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 2, 2, 4, 32, 50, "f16", "f16", r);
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    fill_cache(c, &s, 0, 50);
    double e = -1;
    CHECK_OK(kvq_cache_set_precision(c, 1, -1, 0, "int4", &e));
    CHECK(e > 1e-4 && e < 0.05);
    CHECK_OK(kvq_cache_set_precision(c, 1, 0, 1, "int8", &e));
    CHECK(e > 0 && e < 1e-3);
    check_attention(c, &s, 1, 0.2, 2e-2, "after set_precision", r);
    CHECK_STATUS(kvq_cache_set_precision(c, 1, 0, 1, "int5", &e), KVQ_ERR_UNKNOWN_CODEC);
    CHECK_STATUS(kvq_cache_set_precision(c, 7, 0, 1, "int8", &e), KVQ_ERR_RANGE);
    /* new tokens use the new codec */
    int32_t p = 1000;
    float *k = calloc(s.H * s.d, sizeof(float)), *v = calloc(s.H * s.d, sizeof(float));
    CHECK_OK(kvq_cache_append(c, 1, k, v, &p, 1));
    kvq_stats st;
    CHECK_OK(kvq_cache_stats(c, 1, &st));
    CHECK(st.reencodes == 50 * 2 + 50);
    free(k), free(v);
    kvq_cache_free(c);
    free_seq(&s);
}

static void test_threads(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 1, 4, 8, 64, 70, "tq3", "int4", r);
    kvq_cache *a = make_cache(&cfg);
    cfg.n_threads = 3;
    kvq_cache *b = make_cache(&cfg);
    if (a && b) {
        fill_cache(a, &s, 0, 70);
        fill_cache(b, &s, 0, 70);
        float q[8 * 64], oa[8 * 64], ob[8 * 64];
        tu_fill_gauss(r, q, 8 * 64, 1.0f);
        int32_t qp = 1000;
        float ta[4 * 70], tb[4 * 70];
        CHECK_OK(kvq_cache_attend(a, 0, q, &qp, 1, oa, 8 * 64, ta, 4 * 70));
        CHECK_OK(kvq_cache_attend(b, 0, q, &qp, 1, ob, 8 * 64, tb, 4 * 70));
        CHECK(memcmp(oa, ob, sizeof oa) == 0);
        CHECK(memcmp(ta, tb, sizeof ta) == 0);
        /* token attention sums to the number of query heads per group */
        for (size_t h = 0; h < 4; h++) {
            double sum = 0;
            for (size_t t = 0; t < 70; t++)
                sum += ta[h * 70 + t];
            CHECK_NEAR(sum, 2.0, 1e-4);
        }
    }
    kvq_cache_free(a);
    kvq_cache_free(b);
    /* the allocator is only called from the thread calling the API (this
     * counting allocator is not thread-safe: make tsan reports a race if a
     * worker thread calls it) */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    cfg.allocator = &al;
    kvq_cache *t = make_cache(&cfg);
    if (t) {
        fill_cache(t, &s, 0, 10);
        float q[8 * 64], o[8 * 64], ta[4 * 70];
        for (int i = 0; i < 3; i++) {
            tu_fill_gauss(r, q, 8 * 64, 1.0f);
            int32_t qp = 1000 + i;
            CHECK_OK(kvq_cache_attend(t, 0, q, &qp, 1, o, 8 * 64, ta, 4 * 70));
        }
    }
    kvq_cache_free(t);
    TU_REPORT(fa.live_bytes == 0, "%zu bytes leaked", fa.live_bytes);
    free_seq(&s);
}

/* Eviction: budget never exceeded after an append, sinks and the protected
 * window always present, deterministic. */
static void run_eviction(kvq_policy pol, size_t budget, size_t sinks, size_t protect, int32_t *final,
                         size_t *nfinal, tu_rng *r) {
    size_t H = 2, QH = 4, d = 16, n = 300;
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1;
    cfg.n_kv_heads = H;
    cfg.n_q_heads = QH;
    cfg.head_dim = d;
    cfg.max_tokens = 1000;
    cfg.k_codec = "int8";
    cfg.v_codec = "int4";
    cfg.policy = pol;
    cfg.budget_tokens = budget;
    cfg.sinks = sinks;
    cfg.protect_recent = protect;
    cfg.page_tokens = 8;
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    float k[2 * 16], v[2 * 16], q[4 * 16], o[4 * 16];
    int ok_budget = 1, ok_sinks = 1, ok_recent = 1;
    int32_t *pos = malloc(1000 * sizeof(int32_t));
    for (size_t t = 0; t < n; t++) {
        tu_fill_gauss(r, k, H * d, 1.0f);
        tu_fill_gauss(r, v, H * d, 1.0f);
        int32_t p = (int32_t)t;
        CHECK_OK(kvq_cache_append(c, 0, k, v, &p, 1));
        tu_fill_gauss(r, q, QH * d, 2.0f);
        CHECK_OK(kvq_cache_attend(c, 0, q, &p, 1, o, QH * d, NULL, 0));
        size_t nt;
        kvq_cache_tokens(c, 0, &nt);
        ok_budget &= nt <= budget;
        kvq_cache_positions(c, 0, pos, 1000);
        for (size_t i = 0; i < sinks && i <= t; i++)
            ok_sinks &= pos[i] == (int32_t)i;
        size_t want = KVQ__MIN_T(protect, t + 1);
        for (size_t i = 0; i < want; i++)
            ok_recent &= pos[nt - 1 - i] == (int32_t)(t - i);
    }
    TU_REPORT(ok_budget, "policy %d: budget %zu exceeded", (int)pol, budget);
    TU_REPORT(ok_sinks, "policy %d: a sink token was evicted", (int)pol);
    TU_REPORT(ok_recent, "policy %d: a protected recent token was evicted", (int)pol);
    kvq_cache_tokens(c, 0, nfinal);
    kvq_cache_positions(c, 0, final, 1000);
    kvq_stats st;
    kvq_cache_stats(c, 0, &st);
    CHECK_EQ(st.tokens_evicted, n - *nfinal);
    CHECK(st.fragmentation >= 0 && st.fragmentation < 1);
    free(pos);
    kvq_cache_free(c);
}

static void test_eviction(void) {
    kvq_policy pols[] = {KVQ_POLICY_WINDOW, KVQ_POLICY_FIFO, KVQ_POLICY_UTILITY};
    for (int i = 0; i < 3; i++) {
        int32_t a[1000], b[1000];
        size_t na = 0, nb = 0;
        tu_rng r1, r2;
        tu_seed(&r1, 77);
        tu_seed(&r2, 77);
        run_eviction(pols[i], 64, 4, 16, a, &na, &r1);
        run_eviction(pols[i], 64, 4, 16, b, &nb, &r2);
        CHECK_EQ(na, 64);
        TU_REPORT(na == nb && memcmp(a, b, na * sizeof(int32_t)) == 0,
                  "policy %d not deterministic", (int)pols[i]);
        if (pols[i] == KVQ_POLICY_WINDOW) {
            /* StreamingLLM: sinks 0..3 and the newest 60 */
            int ok = 1;
            for (size_t t = 0; t < 4; t++)
                ok &= a[t] == (int32_t)t;
            for (size_t t = 4; t < 64; t++)
                ok &= a[t] == (int32_t)(300 - 64 + t);
            CHECK(ok);
        }
        if (pols[i] == KVQ_POLICY_UTILITY) {
            /* heavy hitters: not simply the newest */
            int differs = 0;
            for (size_t t = 4; t < 64; t++)
                differs |= a[t] != (int32_t)(300 - 64 + t);
            CHECK(differs);
        }
    }
}

/* Stored bytes equal what the allocator holds for the layers; failures at
 * every allocation leave the cache unchanged. */
static void test_accounting_and_failures(tu_rng *r) {
    seqdata s;
    make_seq(&s, 2, 2, 4, 16, 120, r);
    const char *kcs[] = {"int4:g=8", "tq3", "f16"};
    for (int ci = 0; ci < 3; ci++)
        for (int win = 0; win < 2; win++) {
            tu_failalloc fa;
            kvq_allocator al = tu_failalloc_make(&fa, 0);
            kvq_cache_config cfg;
            base_cfg(&cfg, &s, kcs[ci], "int8");
            cfg.allocator = &al;
            cfg.recent_window = win ? 10 : 0;
            cfg.policy = KVQ_POLICY_UTILITY;
            cfg.budget_tokens = 70;
            cfg.protect_recent = 16;
            cfg.page_tokens = 8;
            kvq_cache *c = make_cache(&cfg);
            if (!c)
                continue;
            size_t base = fa.live_bytes;
            int ok = 1;
            for (size_t t = 0; t < s.n; t += 5) {
                for (size_t l = 0; l < 2; l++)
                    CHECK_OK(kvq_cache_append(c, l, s.k + (l * s.n + t) * 32, s.v + (l * s.n + t) * 32,
                                              s.pos + t, 5));
                kvq_stats st;
                kvq_cache_stats(c, -1, &st);
                ok &= st.stored_bytes == fa.live_bytes - base;
                ok &= st.peak_stored_bytes >= st.stored_bytes;
                ok &= st.payload_bytes + st.metadata_bytes == st.stored_bytes;
            }
            TU_REPORT(ok, "%s window %d: stored bytes differ from allocated bytes", kcs[ci], win);
            /* failure injection on one more append: unchanged on NOMEM */
            size_t n0;
            kvq_cache_tokens(c, 0, &n0);
            int32_t *p0 = malloc(n0 * sizeof(int32_t)), *p1 = malloc((n0 + 40) * sizeof(int32_t));
            kvq_cache_positions(c, 0, p0, n0);
            float *kk = malloc(40 * 32 * sizeof(float)), *vv = malloc(40 * 32 * sizeof(float));
            tu_fill_gauss(r, kk, 40 * 32, 1.0f);
            tu_fill_gauss(r, vv, 40 * 32, 1.0f);
            int32_t pp[40];
            for (int i = 0; i < 40; i++)
                pp[i] = 1000 + i;
            int clean = 1, succeeded = 0;
            for (long f = 1; f < 60 && !succeeded; f++) {
                fa.fail_at = fa.calls + f;
                kvq_status st = kvq_cache_append(c, 0, kk, vv, pp, 40);
                if (st == KVQ_OK) {
                    succeeded = 1;
                } else {
                    size_t n1;
                    kvq_cache_tokens(c, 0, &n1);
                    kvq_cache_positions(c, 0, p1, n0 + 40);
                    clean &= st == KVQ_ERR_NOMEM && n1 == n0 && memcmp(p0, p1, n0 * 4) == 0;
                    kvq_stats sst;
                    kvq_cache_stats(c, -1, &sst);
                    clean &= sst.stored_bytes == fa.live_bytes - base;
                }
            }
            fa.fail_at = 0;
            TU_REPORT(clean, "%s window %d: a failed append changed the cache", kcs[ci], win);
            CHECK(succeeded);
            free(p0), free(p1), free(kk), free(vv);
            kvq_cache_free(c);
            TU_REPORT(fa.live_bytes == 0, "%zu bytes leaked", fa.live_bytes);
        }
    free_seq(&s);
}

static void test_bad_input(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 1, 2, 4, 8, 10, "int8", "int8", r);
    cfg.max_tokens = 10;
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    fill_cache(c, &s, 0, 10);
    int32_t p = 100;
    float k[16] = {0}, v[16] = {0}, q[32] = {0}, o[32];
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_FULL);
    CHECK_STATUS(kvq_cache_append(c, 1, k, v, &p, 1), KVQ_ERR_RANGE);
    kvq_cache_free(c);
    cfg.max_tokens = 100;
    c = make_cache(&cfg);
    fill_cache(c, &s, 0, 10);
    p = 5;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_ORDER);
    p = 100;
    k[3] = NAN;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_NONFINITE);
    k[3] = 0;
    v[5] = INFINITY;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_NONFINITE);
    q[0] = NAN;
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &p, 1, o, 32, NULL, 0), KVQ_ERR_NONFINITE);
    q[0] = 0;
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &p, 1, o, 31, NULL, 0), KVQ_ERR_DST_TOO_SMALL);
    size_t n;
    kvq_cache_tokens(c, 0, &n);
    CHECK_EQ(n, 10);
    check_attention(c, &s, 0, 2e-2, 2e-3, "after bad input", r);
    kvq_cache_free(c);
    /* configuration errors */
    kvq_cache *bad = NULL;
    base_cfg(&cfg, &s, "int4:g=3", "int8");
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_GROUP);
    base_cfg(&cfg, &s, "int8", "int8");
    cfg.n_q_heads = 5;
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_INVALID_ARG);
    base_cfg(&cfg, &s, "int8", "nope");
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_UNKNOWN_CODEC);
    CHECK(bad == NULL);
    free_seq(&s);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    uint64_t seed = 4242;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng r;
    tu_seed(&r, seed);
    test_exact_and_codecs(&r);
    test_window_prerope_center_chan(&r);
    test_precision_switch(&r);
    test_threads(&r);
    test_eviction();
    test_accounting_and_failures(&r);
    test_bad_input(&r);
    return tu_finish();
}
