/*
 * test_tier.c - residency tiers of the cache: pages moved hot -> warm ->
 * cold (file store) and back give exactly the attention and the K/V of an
 * all-hot cache (no warm re-encode), every move is verified (no mismatch, no
 * lost page), a warm codec changes only the warm pages' precision, store
 * faults (full disk on demotion, read errors on promotion) leave the cache
 * valid and the pages where they were, stored bytes still equal allocated
 * bytes, and without a cold store the pages are dropped as evictions.
 */
#include "testutil.h"

#include <unistd.h>

#define H 2
#define QH 4
#define D 32
#define N 400

static float K[N * H * D], V[N * H * D];

/* The shape every cache of this test has (2 layers, H KV heads, QH query
 * heads, head_dim D, room for N + 100 tokens), with codecs kc and vc. */
static void tier_cfg(kvq_cache_config *cfg, const char *kc, const char *vc) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = 2, cfg->n_kv_heads = H, cfg->n_q_heads = QH, cfg->head_dim = D;
    cfg->max_tokens = N + 100, cfg->k_codec = kc, cfg->v_codec = vc;
}

static kvq_cache *mk(kvq_store *store, size_t hot, size_t warm, const char *warm_codec,
                     kvq_allocator *al) {
    kvq_cache_config cfg;
    tier_cfg(&cfg, "int8", "int8");
    cfg.protect_recent = 32;
    cfg.hot_tokens = hot, cfg.warm_tokens = warm, cfg.warm_codec = warm_codec;
    cfg.cold_store = store, cfg.verify_tiers = 1, cfg.allocator = al;
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    return c;
}

/* Runs the same appends/attends on c and an all-hot reference; returns the
 * worst relative attention difference. */
static double drive(kvq_cache *c, kvq_cache *ref, tu_rng *r, int *fail_st) {
    float q[QH * D], o1[QH * D], o2[QH * D];
    double worst = 0;
    for (size_t t = 0; t < N; t += 10) {
        for (size_t l = 0; l < 2; l++) {
            CHECK_OK(kvq_cache_append(c, l, K + t * H * D, V + t * H * D, NULL, 10));
            CHECK_OK(kvq_cache_append(ref, l, K + t * H * D, V + t * H * D, NULL, 10));
            tu_fill_gauss(r, q, QH * D, 1.0f);
            int32_t qp = (int32_t)(t + 9);
            kvq_status st = kvq_cache_attend(c, l, q, &qp, 1, o1, QH * D, NULL, 0);
            if (st != KVQ_OK) {
                *fail_st = st;
                continue;
            }
            CHECK_OK(kvq_cache_attend(ref, l, q, &qp, 1, o2, QH * D, NULL, 0));
            worst = fmax(worst, tu_rel_err(o1, o2, QH * D));
        }
    }
    return worst;
}

static void compare_kv(kvq_cache *c, kvq_cache *ref) {
    for (size_t l = 0; l < 2; l++) {
        size_t n1, n2;
        kvq_cache_tokens(c, l, &n1);
        kvq_cache_tokens(ref, l, &n2);
        CHECK_EQ(n1, n2);
        float *a = malloc(n1 * H * D * 4), *b = malloc(n1 * H * D * 4);
        float *va = malloc(n1 * H * D * 4), *vb = malloc(n1 * H * D * 4);
        CHECK_OK(kvq_cache_get_kv(c, l, -1, 0, n1, a, va, n1 * H * D));
        CHECK_OK(kvq_cache_get_kv(ref, l, -1, 0, n1, b, vb, n1 * H * D));
        CHECK(memcmp(a, b, n1 * H * D * 4) == 0);
        CHECK(memcmp(va, vb, n1 * H * D * 4) == 0);
        free(a), free(b), free(va), free(vb);
    }
}

/* Scenarios 3 and 4 of run_store: a cache with 64 hot tokens per layer over
 * store s and an all-hot reference are driven through the sequence; then,
 * with `fault` (KVQ_FAULT_READ or KVQ_FAULT_DISCONNECT) injected, one attend
 * on `layer` fails, and the next ones give exactly the reference's output
 * with no page lost (after a disconnect, the same K/V too). */
static void fault_on_attend(kvq_store *s, int fault, size_t layer, const char *name, tu_rng *r) {
    int is_read = fault == KVQ_FAULT_READ;
    kvq_cache *c = mk(s, 64, 0, NULL, NULL), *ref = mk(NULL, 0, 0, NULL, NULL);
    int fst = 0;
    drive(c, ref, r, &fst);
    kvq_status fs = kvq_store_inject_fault(s, fault, 0);
    if (fs == KVQ_OK) {
        float q[QH * D], o1[QH * D], o2[QH * D];
        tu_fill_gauss(r, q, QH * D, 1.0f);
        int32_t qp = 10000;
        kvq_status as = kvq_cache_attend(c, layer, q, &qp, 1, o1, QH * D, NULL, 0);
        if (is_read) {
            CHECK(as != KVQ_OK);
            kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0);
        } else {
            TU_REPORT(as == KVQ_ERR_CONN, "%s: attend over a dropped connection gave %s", name,
                      kvq_strerror(as));
        }
        CHECK_OK(kvq_cache_attend(c, layer, q, &qp, 1, o1, QH * D, NULL, 0));
        CHECK_OK(kvq_cache_attend(ref, layer, q, &qp, 1, o2, QH * D, NULL, 0));
        CHECK(tu_rel_err(o1, o2, QH * D) == 0.0);
        if (!is_read)
            compare_kv(c, ref);
        kvq_tier_stats ts;
        CHECK_OK(kvq_cache_tier_stats(c, &ts));
        CHECK_EQ(ts.lost_pages, 0);
    } else {
        printf("%s: no %s fault injection (%s)\n", name, is_read ? "READ" : "DISCONNECT",
               kvq_strerror(fs));
    }
    kvq_cache_free(c);
    kvq_cache_free(ref);
}

static void run_store(const char *url, const char *name, tu_rng *r) {
    kvq_store *s = NULL;
    char err[256] = "";
    kvq_status st = kvq_store_open(&s, url, NULL, err, sizeof err);
    TU_REPORT(st == KVQ_OK, "%s: open %s: %s", name, url, err);
    if (!s)
        return;
    /* 1. hot 64 + warm 64 tokens per layer, the rest cold: exact */
    kvq_cache *c = mk(s, 64, 64, NULL, NULL), *ref = mk(NULL, 0, 0, NULL, NULL);
    int fst = 0;
    double w = drive(c, ref, r, &fst);
    CHECK_EQ(fst, 0);
    TU_REPORT(w == 0.0, "%s: tiered attention differs from all-hot by %.3g", name, w);
    kvq_tier_stats ts;
    CHECK_OK(kvq_cache_tier_stats(c, &ts));
    printf("%s: demotions %llu promotions %llu to_cold %llu from_cold %llu modeled %.2f ms measured "
           "%.2f ms\n", name, (unsigned long long)ts.demotions, (unsigned long long)ts.promotions,
           (unsigned long long)ts.bytes_to_cold, (unsigned long long)ts.bytes_from_cold,
           ts.modeled_transfer_ms, ts.measured_transfer_ms);
    CHECK(ts.demotions > 0 && ts.promotions > 0 && ts.bytes_to_cold > 0 && ts.bytes_from_cold > 0);
    CHECK_EQ(ts.lost_pages, 0);
    CHECK_EQ(ts.verify_mismatches, 0);
    CHECK_EQ(ts.demotion_failures, 0);
    TU_REPORT(ts.pages[2] > 0 && ts.pages[1] > 0 && ts.pages[0] > 0, "pages hot/warm/cold %llu %llu %llu",
              (unsigned long long)ts.pages[0], (unsigned long long)ts.pages[1],
              (unsigned long long)ts.pages[2]);
    CHECK(ts.tokens[0] <= 2 * 64 + 2 * 16 * 3);
    CHECK(ts.modeled_transfer_ms > 0);
    compare_kv(c, ref); /* cold tokens are read from the store */
    size_t jl;
    CHECK_OK(kvq_cache_stats_json(c, NULL, 0, &jl));
    char *js = malloc(jl + 1);
    CHECK_OK(kvq_cache_stats_json(c, js, jl + 1, &jl));
    CHECK(strstr(js, "\"tiers\"") && strstr(js, "\"lost_pages\": 0") && strstr(js, "\"bytes_moved\""));
    free(js);
    kvq_cache_free(c);
    kvq_cache_free(ref);

    /* 2. faults: a full store on demotion keeps pages in memory */
    c = mk(s, 64, 64, NULL, NULL);
    ref = mk(NULL, 0, 0, NULL, NULL);
    kvq_status fs = kvq_store_inject_fault(s, KVQ_FAULT_NOSPACE, 0);
    if (fs == KVQ_OK) {
        fst = 0;
        w = drive(c, ref, r, &fst);
        CHECK_EQ(fst, 0);
        TU_REPORT(w == 0.0, "%s: attention changed under a full store (%.3g)", name, w);
        CHECK_OK(kvq_cache_tier_stats(c, &ts));
        CHECK(ts.demotion_failures > 0);
        CHECK_EQ(ts.pages[2], 0);
        CHECK_EQ(ts.lost_pages, 0);
        kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0);
        /* the next append demotes for real */
        float k1[H * D] = {0}, v1[H * D] = {0};
        CHECK_OK(kvq_cache_append(c, 0, k1, v1, NULL, 1));
        CHECK_OK(kvq_cache_tier_stats(c, &ts));
        CHECK(ts.pages[2] > 0);
    } else {
        printf("%s: no NOSPACE fault injection (%s)\n", name, kvq_strerror(fs));
    }
    kvq_cache_free(c);
    kvq_cache_free(ref);

    /* 3. a read error on promotion fails attend cleanly; after it, all is well */
    fault_on_attend(s, KVQ_FAULT_READ, 0, name, r);
    /* 4. a dropped connection (a Redis restart) fails one call cleanly; the
     * next call reconnects and everything is still there */
    fault_on_attend(s, KVQ_FAULT_DISCONNECT, 1, name, r);
    kvq_store_close(s);
}

static void test_warm_codec_and_drop(tu_rng *r) {
    /* a warm codec re-encodes only warm pages: close to, not equal to, all-hot */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    kvq_cache *c = mk(NULL, 64, 100000, getenv("KVQ_WARM") ? getenv("KVQ_WARM") : "int4", &al), *ref = mk(NULL, 0, 0, NULL, NULL);
    int fst = 0;
    size_t base = fa.live_bytes;
    double w = drive(c, ref, r, &fst);
    TU_REPORT(w > 0 && w < 1.0, "warm int4: attention differs from all-hot by %.3g", w);
    /* every stored vector is the all-hot one (hot pages) or exactly its int4
     * re-encoding (warm pages) */
    {
        kvq_codec *w4 = NULL;
        CHECK_OK(kvq_codec_create(&w4, getenv("KVQ_WARM") ? getenv("KVQ_WARM") : "int4", D, NULL));
        size_t n;
        kvq_cache_tokens(ref, 0, &n);
        float *a = malloc(n * H * D * 4), *b = malloc(n * H * D * 4), y[D];
        uint8_t enc[256];
        CHECK_OK(kvq_cache_get_kv(c, 0, -1, 0, n, a, NULL, n * H * D));
        CHECK_OK(kvq_cache_get_kv(ref, 0, -1, 0, n, b, NULL, n * H * D));
        size_t same = 0, re = 0, other = 0;
        for (size_t i = 0; i < n * H; i++) {
            CHECK_OK(kvq_codec_encode(w4, enc, sizeof enc, b + i * D, 1));
            CHECK_OK(kvq_codec_decode(w4, y, D, enc, kvq_codec_vector_bytes(w4)));
            if (!memcmp(a + i * D, b + i * D, D * 4))
                same++;
            else if (!memcmp(a + i * D, y, D * 4))
                re++;
            else
                other++;
        }
        TU_REPORT(other == 0 && same > 0 && re > 0, "warm re-encode: %zu same, %zu re-encoded, %zu other",
                  same, re, other);
        free(a), free(b);
        kvq_codec_free(w4);
    }
    kvq_stats st;
    kvq_cache_stats(c, -1, &st);
    (void)base;
    kvq_tier_stats ts;
    kvq_cache_tier_stats(c, &ts);
    CHECK(ts.pages[1] > 0 && ts.bytes_hot_to_warm > 0);
    CHECK_EQ(ts.dropped_pages, 0);
    kvq_cache_free(c);
    TU_REPORT(fa.live_bytes == 0, "warm arena leaked %zu bytes", fa.live_bytes);
    kvq_cache_free(ref);
    /* no cold store: pages over the warm capacity are dropped (evicted) */
    c = mk(NULL, 64, 64, NULL, NULL);
    ref = mk(NULL, 0, 0, NULL, NULL);
    drive(c, ref, r, &fst);
    kvq_cache_tier_stats(c, &ts);
    kvq_cache_stats(c, -1, &st);
    CHECK(ts.dropped_pages > 0);
    CHECK_EQ(st.tokens_evicted, ts.dropped_pages * 16);
    CHECK(st.tokens + st.tokens_evicted == st.tokens_appended);
    kvq_cache_free(c);
    kvq_cache_free(ref);
}

/* Three caches with cfg (NULL where creation failed); the first n tokens of
 * K and V appended on both layers of the first. */
static void three_caches(const kvq_cache_config *cfg, size_t n, kvq_cache **a, kvq_cache **b,
                         kvq_cache **c) {
    *a = *b = *c = NULL;
    CHECK_OK(kvq_cache_create(a, cfg));
    CHECK_OK(kvq_cache_create(b, cfg));
    CHECK_OK(kvq_cache_create(c, cfg));
    for (size_t l = 0; l < 2; l++)
        CHECK_OK(kvq_cache_append(*a, l, K, V, NULL, n));
}

/* Snapshots restore bit-identical pages (same K/V, same attention); a
 * prefix of the tokens restores only those; prefix caching loads the
 * leading full pages of a matching token sequence. */
static void test_snapshot_prefix(const char *url, tu_rng *r) {
    kvq_store *s = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (!s)
        return;
    const char *kvs[][2] = {{"int8", "tq3"}, {"tq4", "int4"}};
    for (int ci = 0; ci < 2; ci++) {
        for (int recent = 0; recent < 2; recent++) {
            kvq_cache_config cfg;
            tier_cfg(&cfg, kvs[ci][0], kvs[ci][1]);
            cfg.recent_window = recent ? 24 : 0;
            kvq_cache *a, *b, *pfx;
            three_caches(&cfg, 203, &a, &b, &pfx);
            CHECK_OK(kvq_cache_save(a, s, "snap1", INT32_MAX));
            CHECK_OK(kvq_cache_load(b, s, "snap1"));
            compare_kv(b, a);
            float q[QH * D], o1[QH * D], o2[QH * D];
            tu_fill_gauss(r, q, QH * D, 1.0f);
            int32_t qp = 1000;
            for (size_t l = 0; l < 2; l++) {
                CHECK_OK(kvq_cache_attend(a, l, q, &qp, 1, o1, QH * D, NULL, 0));
                CHECK_OK(kvq_cache_attend(b, l, q, &qp, 1, o2, QH * D, NULL, 0));
                CHECK(memcmp(o1, o2, sizeof o1) == 0);
            }
            /* both continue identically */
            for (size_t l = 0; l < 2; l++) {
                CHECK_OK(kvq_cache_append(a, l, K + 203 * H * D, V + 203 * H * D, NULL, 40));
                CHECK_OK(kvq_cache_append(b, l, K + 203 * H * D, V + 203 * H * D, NULL, 40));
            }
            compare_kv(b, a);
            /* a prefix of 100 tokens */
            CHECK_OK(kvq_cache_save(a, s, "snap2", 100));
            CHECK_OK(kvq_cache_load(pfx, s, "snap2"));
            size_t n;
            kvq_cache_tokens(pfx, 1, &n);
            CHECK_EQ(n, 100);
            /* loading into a non-empty cache, or a missing snapshot, fails */
            CHECK_STATUS(kvq_cache_load(b, s, "snap1"), KVQ_ERR_MISMATCH);
            kvq_cache *e = NULL;
            CHECK_OK(kvq_cache_create(&e, &cfg));
            CHECK(kvq_cache_load(e, s, "nope") != KVQ_OK);
            /* a corrupt manifest is refused and leaves the cache empty */
            void *md;
            size_t ms;
            CHECK_OK(kvq_store_get(s, "snap1/manifest", &md, &ms));
            ((unsigned char *)md)[ms / 2] ^= 1;
            CHECK_OK(kvq_store_put(s, "snapX/manifest", md, ms));
            kvq_store_free_buf(s, md);
            CHECK_STATUS(kvq_cache_load(e, s, "snapX"), KVQ_ERR_CORRUPT);
            kvq_cache_tokens(e, 0, &n);
            CHECK_EQ(n, 0);
            kvq_cache_free(e);
            kvq_cache_free(a);
            kvq_cache_free(b);
            kvq_cache_free(pfx);
        }
    }
    /* prefix caching */
    int32_t ids[300];
    for (int i = 0; i < 300; i++)
        ids[i] = (i * 37) % 500;
    kvq_cache_config cfg;
    tier_cfg(&cfg, "int8", "int8");
    kvq_cache *a, *b, *c2;
    three_caches(&cfg, 200, &a, &b, &c2);
    CHECK_OK(kvq_cache_prefix_put(a, s, ids, 200));
    size_t got = 0;
    CHECK_OK(kvq_cache_prefix_get(b, s, ids, 250, &got));
    CHECK_EQ(got, 192); /* 12 full pages of 16 */
    for (size_t l = 0; l < 2; l++) {
        CHECK_OK(kvq_cache_append(b, l, K + got * H * D, V + got * H * D, NULL, 200 - got));
    }
    /* an attend of the newest token settles b's staged tokens, as the
     * prefix_put settled a's */
    {
        float q[QH * D], o[QH * D];
        memset(q, 0, sizeof q);
        int32_t qp = 199;
        for (size_t l = 0; l < 2; l++)
            CHECK_OK(kvq_cache_attend(b, l, q, &qp, 1, o, QH * D, NULL, 0));
    }
    compare_kv(b, a);
    int32_t other[300];
    memcpy(other, ids, sizeof other);
    other[40] = 7; /* diverges in page 2 */
    CHECK_OK(kvq_cache_prefix_get(c2, s, other, 250, &got));
    CHECK_EQ(got, 32);
    kvq_cache_free(a);
    kvq_cache_free(b);
    kvq_cache_free(c2);
    kvq_store_close(s);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    tu_rng r;
    tu_seed(&r, 99);
    printf("seed 99\n");
    tu_fill_gauss(&r, K, N * H * D, 1.0f);
    tu_fill_gauss(&r, V, N * H * D, 1.0f);
    char dir[] = "/tmp/kvq_tier_XXXXXX";
    if (!mkdtemp(dir)) {
        tu_fail++;
        return tu_finish();
    }
    char url[300];
    snprintf(url, sizeof url, "file:%s", dir);
    run_store(url, "file store", &r);
    const char *redis = getenv("KVQ_TEST_REDIS"); /* set by the test harness when it runs one */
    if (redis && *redis)
        run_store(redis, "redis store", &r);
    else
        printf("SKIP redis: KVQ_TEST_REDIS is not set\n");
    test_warm_codec_and_drop(&r);
    test_snapshot_prefix(url, &r);
    if (redis && *redis)
        test_snapshot_prefix(redis, &r);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    return tu_finish();
}
