/*
 * test_observe.c - kvq_cache_observe_attention, the entry point for engines
 * that compute attention themselves. Twin caches get the same appends; one
 * runs kvq_cache_attend, the other is given that attend's token_attn through
 * observe: after every step both must hold the same tokens, bytes, counters
 * and tiers (utility, fifo and no policy; lossy codecs with a recent window;
 * a budget ratio; tier capacities), and a final attend must give bit-equal
 * outputs. Per-query-head rows, the EMA's ranking and every bad input
 * (shape, NaN/Inf, negative weights, scores passed as weights, a failed
 * allocation) are checked, the last leaving the cache as a twin that never
 * saw the call.
 */
#include "testutil.h"

#define MAXTOK 512
#define KVQ__WARM_T 1 /* kvq_tier_stats index of the warm tier */

typedef struct {
    size_t L, H, QH, d;
} shape;

/* What a caller can see of a cache, bytes_read aside (attention reads
 * pages, observe does not). */
typedef struct {
    size_t n[4];
    int32_t pos[4][MAXTOK];
    kvq_stats st[4];
    kvq_tier_stats ts;
} snap;

static void take(kvq_cache *c, size_t L, snap *s) {
    memset(s, 0, sizeof *s);
    for (size_t l = 0; l < L; l++) {
        kvq_cache_tokens(c, l, &s->n[l]);
        kvq_cache_positions(c, l, s->pos[l], MAXTOK);
        kvq_cache_stats(c, (int)l, &s->st[l]);
        s->st[l].bytes_read = 0;
    }
    kvq_cache_tier_stats(c, &s->ts);
    memset(s->ts.reads, 0, sizeof s->ts.reads);
    s->ts.modeled_transfer_ms = s->ts.measured_transfer_ms = 0;
}

static int same(const snap *a, const snap *b) { return memcmp(a, b, sizeof *a) == 0; }

static kvq_cache *make(kvq_cache_config *cfg) {
    kvq_cache *c = NULL;
    char msg[200] = "";
    cfg->err_msg = msg;
    cfg->err_msg_size = sizeof msg;
    kvq_status st = kvq_cache_create(&c, cfg);
    TU_REPORT(st == KVQ_OK, "cache create: %s [%s]", kvq_strerror(st), msg);
    cfg->err_msg = NULL;
    cfg->err_msg_size = 0;
    return c;
}

static void base(kvq_cache_config *cfg, const shape *s, const char *kc, const char *vc) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = s->L;
    cfg->n_kv_heads = s->H;
    cfg->n_q_heads = s->QH;
    cfg->head_dim = s->d;
    cfg->max_tokens = 256;
    cfg->k_codec = kc;
    cfg->v_codec = vc;
    cfg->page_tokens = 8;
}

/* ---- twins: observe(token_attn of an attend) == that attend ---------------- */

typedef struct {
    const char *name, *kc, *vc;
    kvq_policy policy;
    size_t budget, recent;
    double ratio;
    size_t hot; /* hot_tokens: pages over it go warm */
} twin_case;

static void twins(const twin_case *tc, tu_rng *r) {
    const shape s = {2, 2, 4, 16};
    kvq_cache_config cfg;
    base(&cfg, &s, tc->kc, tc->vc);
    cfg.policy = tc->policy;
    cfg.budget_tokens = tc->budget;
    cfg.budget_ratio = tc->ratio;
    cfg.recent_window = tc->recent;
    cfg.sinks = 2;
    cfg.protect_recent = 4;
    cfg.hot_tokens = tc->hot;
    cfg.warm_tokens = tc->hot ? 256 : 0; /* pages over hot_tokens go warm, none dropped */
    kvq_cache *a = make(&cfg), *b = make(&cfg);
    if (!a || !b) {
        kvq_cache_free(a);
        kvq_cache_free(b);
        return;
    }
    const size_t HD = s.H * s.d, QD = s.QH * s.d;
    float k[32 * 32], v[32 * 32], q[32 * 64], out[32 * 64], ta[2 * MAXTOK];
    int32_t pos[32];
    int32_t next = 0;
    int ok = 1, okn = 1;
    size_t step = 0;
    /* a prefill of 30, then chunks of 1 and 3 tokens */
    while (next < 150) {
        size_t m = step == 0 ? 30 : step % 5 == 0 ? 3 : 1;
        for (size_t i = 0; i < m; i++)
            pos[i] = next + (int32_t)i;
        next += (int32_t)m;
        for (size_t l = 0; l < s.L; l++) {
            tu_fill_gauss(r, k, m * HD, 1.0f);
            tu_fill_gauss(r, v, m * HD, 1.0f);
            tu_fill_gauss(r, q, m * QD, 1.5f);
            CHECK_OK(kvq_cache_append(a, l, k, v, pos, m));
            CHECK_OK(kvq_cache_append(b, l, k, v, pos, m));
            size_t n;
            kvq_cache_tokens(a, l, &n);
            CHECK_OK(kvq_cache_attend(a, l, q, pos, m, out, m * QD, ta, sizeof ta / sizeof *ta));
            kvq_status st = kvq_cache_observe_attention(b, l, ta, s.H, n, m);
            okn &= st == KVQ_OK;
        }
        snap sa, sb;
        take(a, s.L, &sa);
        take(b, s.L, &sb);
        if (ok && !same(&sa, &sb))
            fprintf(stderr, "%s: the twins differ after step %zu (%zu vs %zu tokens)\n", tc->name,
                    step, sa.n[0], sb.n[0]);
        ok &= same(&sa, &sb);
        step++;
    }
    TU_REPORT(okn, "%s: observe failed", tc->name);
    TU_REPORT(ok, "%s: observe of attend's token_attn left another cache than attend", tc->name);
    /* the tokens the budget allows, and identical attention afterwards */
    size_t n;
    kvq_cache_tokens(a, 1, &n);
    if (tc->policy != KVQ_POLICY_NONE && tc->budget)
        CHECK_EQ(n, tc->budget);
    if (tc->ratio > 0)
        CHECK_EQ(n, (size_t)ceil(tc->ratio * 30));
    kvq_stats st;
    kvq_cache_stats(a, -1, &st);
    if (tc->policy != KVQ_POLICY_NONE)
        CHECK(st.tokens_evicted > 0);
    if (tc->hot) {
        kvq_tier_stats ts;
        kvq_cache_tier_stats(a, &ts);
        TU_REPORT(ts.pages[KVQ__WARM_T] > 0, "%s: no page went warm", tc->name);
    }
    float out2[64];
    tu_fill_gauss(r, q, QD, 1.5f);
    int32_t qp = next - 1;
    for (size_t l = 0; l < s.L; l++) {
        CHECK_OK(kvq_cache_attend(a, l, q, &qp, 1, out, QD, NULL, 0));
        CHECK_OK(kvq_cache_attend(b, l, q, &qp, 1, out2, QD, NULL, 0));
        TU_REPORT(memcmp(out, out2, QD * sizeof(float)) == 0, "%s: layer %zu outputs differ",
                  tc->name, l);
    }
    kvq_cache_free(a);
    kvq_cache_free(b);
}

/* ---- what the weights mean ------------------------------------------------ */

/* Ten tokens, no attend; one query's weights rank them. Sink 0 and the
 * newest (9) are protected; of 1..8 the four with the least weight go:
 * a = .2 .025 .25 .2 .05 .075 .25 .1 for tokens 1..8 leaves 0 1 3 4 7 9. The
 * rows are per query head (four, two per KV head) or per KV head, the
 * weight of a token spread over the heads unevenly. */
static void ranking(void) {
    const shape s = {1, 2, 4, 8};
    static const double a[10] = {0.25, 0.2, 0.025, 0.25, 0.2, 0.05, 0.075, 0.25, 0.1, 0.25};
    static const int32_t keep[6] = {0, 1, 3, 4, 7, 9};
    static const double share[4] = {0.1, 0.2, 0.3, 0.4}; /* of a token's weight per query head */
    for (int per_kv = 0; per_kv < 2; per_kv++) {
        kvq_cache_config cfg;
        base(&cfg, &s, "f32", "f32");
        cfg.policy = KVQ_POLICY_UTILITY;
        cfg.budget_tokens = 6;
        cfg.sinks = 1;
        cfg.protect_recent = 1;
        kvq_cache *c = make(&cfg);
        if (!c)
            return;
        float k[10 * 16], v[10 * 16];
        for (size_t i = 0; i < 10 * 16; i++)
            k[i] = v[i] = (float)(i % 7) * 0.25f;
        CHECK_OK(kvq_cache_append(c, 0, k, v, NULL, 10));
        float w[4 * 10];
        size_t rows = per_kv ? 2 : 4;
        memset(w, 0, sizeof w);
        for (size_t qh = 0; qh < 4; qh++)
            for (size_t i = 0; i < 10; i++)
                w[(per_kv ? qh / 2 : qh) * 10 + i] += (float)(a[i] * share[qh]);
        CHECK_OK(kvq_cache_observe_attention(c, 0, w, rows, 10, 1));
        int32_t p[10];
        size_t n;
        kvq_cache_tokens(c, 0, &n);
        kvq_cache_positions(c, 0, p, 10);
        CHECK_EQ(n, 6);
        TU_REPORT(n == 6 && memcmp(p, keep, sizeof keep) == 0,
                  "%s rows: kept %d %d %d %d %d %d", per_kv ? "KV-head" : "query-head", p[0],
                  p[1], p[2], p[3], p[4], p[5]);
        /* tokens 1 and 4 now tie (equal weight, equal score): a budget of 5
         * would evict the older, 1. A second query that attends only to
         * token 1 lifts its score above 4's, and 4 goes instead */
        float w2[4 * 6];
        memset(w2, 0, sizeof w2);
        for (size_t h = 0; h < rows; h++)
            w2[h * 6 + 1] = per_kv ? 2.0f : 1.0f; /* token 1 has all of each row */
        CHECK_OK(kvq_cache_observe_attention(c, 0, w2, rows, 6, 1));
        kvq_cache_tokens(c, 0, &n);
        CHECK_EQ(n, 6);
        CHECK_OK(kvq_cache_set_budget(c, 5));
        kvq_cache_positions(c, 0, p, 10);
        static const int32_t keep5[5] = {0, 1, 3, 7, 9};
        TU_REPORT(memcmp(p, keep5, sizeof keep5) == 0, "after the second observe: %d %d %d %d %d",
                  p[0], p[1], p[2], p[3], p[4]);
        kvq_cache_free(c);
    }
}

/* ---- bad input leaves the cache unchanged --------------------------------- */

static void bad_input(tu_rng *r) {
    const shape s = {2, 2, 4, 16};
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    kvq_cache_config cfg;
    base(&cfg, &s, "int8", "tq3");
    cfg.policy = KVQ_POLICY_UTILITY;
    cfg.budget_tokens = 20;
    cfg.sinks = 2;
    cfg.protect_recent = 4;
    cfg.allocator = &al;
    kvq_cache *c = make(&cfg), *twin = make(&cfg);
    if (!c || !twin) {
        kvq_cache_free(c);
        kvq_cache_free(twin);
        return;
    }
    /* 40 tokens appended, staged in f16, over the budget: an observe that
     * went through would evict and settle */
    float k[40 * 32], v[40 * 32];
    tu_fill_gauss(r, k, 40 * 32, 1.0f);
    tu_fill_gauss(r, v, 40 * 32, 1.0f);
    for (size_t l = 0; l < 2; l++) {
        CHECK_OK(kvq_cache_append(c, l, k, v, NULL, 40));
        CHECK_OK(kvq_cache_append(twin, l, k, v, NULL, 40));
    }
    const size_t n = 40, T = 3;
    float w[4 * 40];
    /* valid weights per query head: each row spreads T queries' weight
     * evenly over the tokens */
    for (size_t i = 0; i < 4 * n; i++)
        w[i] = (float)T / (float)n;
    snap s0, s1;
    take(twin, 2, &s0);
    struct {
        const char *what;
        kvq_cache *cache;
        size_t layer, heads, tokens, queries;
        int null_w;
        long at;   /* index of w to set, -1 none */
        float val; /* its value */
        kvq_status want;
        const char *msg; /* in kvq_cache_last_error */
    } bad[] = {
        {"NULL cache", NULL, 0, 4, n, T, 0, -1, 0, KVQ_ERR_INVALID_ARG, NULL},
        {"layer", c, 2, 4, n, T, 0, -1, 0, KVQ_ERR_RANGE, NULL},
        {"no queries", c, 0, 4, n, 0, 0, -1, 0, KVQ_ERR_INVALID_ARG, "n_queries"},
        {"heads", c, 0, 3, n, T, 0, -1, 0, KVQ_ERR_INVALID_ARG, "n_heads is 3"},
        {"fewer tokens", c, 0, 4, n - 1, T, 0, -1, 0, KVQ_ERR_MISMATCH, "holds 40"},
        {"more tokens", c, 0, 4, n + 1, T, 0, -1, 0, KVQ_ERR_MISMATCH, "n_tokens is 41"},
        {"NULL weights", c, 0, 4, n, T, 1, -1, 0, KVQ_ERR_INVALID_ARG, "NULL"},
        {"NaN", c, 0, 4, n, T, 0, 77, NAN, KVQ_ERR_NONFINITE, "weights[1][37]"},
        {"Inf", c, 1, 4, n, T, 0, 0, INFINITY, KVQ_ERR_NONFINITE, "weights[0][0]"},
        {"-Inf", c, 0, 4, n, T, 0, 159, -INFINITY, KVQ_ERR_NONFINITE, "weights[3][39]"},
        {"negative", c, 0, 4, n, T, 0, 45, -1e-3f, KVQ_ERR_RANGE, "weights[1][5]"},
        /* one entry of 1.0 more pushes row 2 to 4/3 of its bound 3 */
        {"row over its queries", c, 0, 4, n, T, 0, 85, 1.0f + (float)T / 40, KVQ_ERR_RANGE,
         "row 2 sums"},
        /* KV-head rows may sum to T x 2 (group of two), not more */
        {"KV row over", c, 0, 2, n, T, 0, 3, 3.5f, KVQ_ERR_RANGE, "row 0 sums"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        float save = 0;
        if (bad[i].at >= 0) {
            save = w[bad[i].at];
            w[bad[i].at] = bad[i].val;
        }
        kvq_status st = kvq_cache_observe_attention(bad[i].cache, bad[i].layer,
                                                    bad[i].null_w ? NULL : w, bad[i].heads,
                                                    bad[i].tokens, bad[i].queries);
        if (bad[i].at >= 0)
            w[bad[i].at] = save;
        TU_REPORT(st == bad[i].want, "%s: got %d (%s), want %d", bad[i].what, (int)st,
                  kvq_strerror(st), (int)bad[i].want);
        if (bad[i].msg)
            TU_REPORT(strstr(kvq_cache_last_error(c), bad[i].msg) != NULL,
                      "%s: last error \"%s\" lacks \"%s\"", bad[i].what, kvq_cache_last_error(c),
                      bad[i].msg);
        take(c, 2, &s1);
        TU_REPORT(same(&s0, &s1), "%s changed the cache", bad[i].what);
    }
    /* a failed allocation (the position order of the slots) */
    fa.fail_at = fa.calls + 1;
    CHECK_STATUS(kvq_cache_observe_attention(c, 0, w, 4, n, T), KVQ_ERR_NOMEM);
    fa.fail_at = 0;
    take(c, 2, &s1);
    TU_REPORT(same(&s0, &s1), "a failed allocation changed the cache");
    /* rounding within the margin passes: a row at 1.01 x its bound */
    w[0] += 0.01f * (float)T;
    CHECK_OK(kvq_cache_observe_attention(c, 0, w, 4, n, T));
    CHECK_OK(kvq_cache_observe_attention(twin, 0, w, 4, n, T));
    w[0] -= 0.01f * (float)T;
    /* and KV-head rows at exactly their bound (T x 2) */
    for (size_t i = 0; i < 2 * n; i++)
        w[i] = 2.0f * (float)T / (float)n;
    CHECK_OK(kvq_cache_observe_attention(c, 1, w, 2, n, T));
    CHECK_OK(kvq_cache_observe_attention(twin, 1, w, 2, n, T));
    size_t n1;
    for (size_t l = 0; l < 2; l++) {
        kvq_cache_tokens(c, l, &n1);
        CHECK_EQ(n1, 20); /* the valid observes evicted to the budget */
    }
    take(c, 2, &s1);
    take(twin, 2, &s0);
    TU_REPORT(same(&s0, &s1), "after the same valid observe the caches differ");
    kvq_cache_free(c);
    kvq_cache_free(twin);
    TU_REPORT(fa.live_bytes == 0, "%zu bytes leaked", fa.live_bytes);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    uint64_t seed = 1212;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng r;
    tu_seed(&r, seed);
    static const twin_case cases[] = {
        {"utility int8", "int8", "int8", KVQ_POLICY_UTILITY, 24, 0, 0, 0},
        {"utility tq3/int4 recent 3", "tq3", "int4", KVQ_POLICY_UTILITY, 40, 3, 0, 0},
        {"utility f32", "f32", "f32", KVQ_POLICY_UTILITY, 17, 0, 0, 0},
        {"fifo int8", "int8", "int4", KVQ_POLICY_FIFO, 24, 0, 0, 0},
        {"no policy int8", "int8", "int8", KVQ_POLICY_NONE, 0, 2, 0, 0},
        {"utility ratio 0.5", "int8", "int8", KVQ_POLICY_UTILITY, 0, 0, 0.5, 0},
        {"utility hot 16", "int8", "int8", KVQ_POLICY_UTILITY, 48, 0, 0, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        twins(&cases[i], &r);
    ranking();
    bad_input(&r);
    return tu_finish();
}
