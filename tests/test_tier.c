/*
 * test_tier.c - residency tiers of the cache: pages moved hot -> warm ->
 * cold (file store, Redis) and back give exactly the attention and the K/V
 * of an all-hot cache (no warm re-encode), and stored bytes equal the bytes
 * the cache's allocator holds after every step; a warm codec changes only
 * the warm pages' precision; store faults that may pass (full disk on
 * demotion, read errors, a dropped connection) lose nothing; cold pages
 * whose records the store lost (segment files deleted, damaged records,
 * Redis restarted without persistence, records expired by their TTL) are
 * counted in lost_pages, their tokens dropped, and attention goes on over
 * exactly the tokens that remain, with nothing else lost; strict_tiers
 * turns a loss into KVQ_ERR_CORRUPT; without a cold store the pages are
 * dropped as evictions. Snapshots and prefix caching at the end.
 */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

/* Options of mk beyond the capacities. */
typedef struct {
    int strict, scalar;
    uint64_t ttl_ms;
    int utility; /* policy utility (no budget: nothing evicted; pages demoted by utility) */
} tier_opt;

static kvq_cache *mk_opt(kvq_store *store, size_t hot, size_t warm, const char *warm_codec,
                         kvq_allocator *al, const tier_opt *o) {
    kvq_cache_config cfg;
    tier_cfg(&cfg, "int8", "int8");
    cfg.protect_recent = 32;
    cfg.hot_tokens = hot, cfg.warm_tokens = warm, cfg.warm_codec = warm_codec;
    cfg.cold_store = store, cfg.verify_tiers = 1, cfg.allocator = al;
    if (o) {
        cfg.strict_tiers = o->strict;
        cfg.cold_ttl_ms = o->ttl_ms;
        cfg.isa = o->scalar ? KVQ_ISA_SCALAR : KVQ_ISA_AUTO;
        cfg.policy = o->utility ? KVQ_POLICY_UTILITY : KVQ_POLICY_NONE;
    }
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    return c;
}

static kvq_cache *mk(kvq_store *store, size_t hot, size_t warm, const char *warm_codec,
                     kvq_allocator *al) {
    return mk_opt(store, hot, warm, warm_codec, al, NULL);
}

/* Stored bytes must equal what the cache's allocator holds beyond `base`
 * (its live bytes right after creation): every allocation of pages, warm
 * blocks and tables is counted, nothing else stays allocated between calls. */
typedef struct {
    const tu_failalloc *fa;
    size_t base;
    int bad; /* steps where they differed */
    uint64_t stored, live;
} bytes_check;

static void check_bytes(kvq_cache *c, bytes_check *bc) {
    if (!bc)
        return;
    kvq_stats st;
    CHECK_OK(kvq_cache_stats(c, -1, &st));
    if (st.stored_bytes != bc->fa->live_bytes - bc->base && !bc->bad++) {
        bc->stored = st.stored_bytes;
        bc->live = bc->fa->live_bytes - bc->base;
    }
}

/* Runs the same appends (tokens t0..t1, 10 at a time) and attends on c and
 * an all-hot reference; returns the worst relative attention difference
 * (with cmp; without, c's attention is not compared). *fail_st gets an
 * attend failure of c. */
static double drive_range(kvq_cache *c, kvq_cache *ref, size_t t0, size_t t1, tu_rng *r,
                          int *fail_st, int cmp, bytes_check *bc) {
    float q[QH * D], o1[QH * D], o2[QH * D];
    double worst = 0;
    for (size_t t = t0; t < t1; t += 10) {
        for (size_t l = 0; l < 2; l++) {
            CHECK_OK(kvq_cache_append(c, l, K + t * H * D, V + t * H * D, NULL, 10));
            CHECK_OK(kvq_cache_append(ref, l, K + t * H * D, V + t * H * D, NULL, 10));
            check_bytes(c, bc);
            tu_fill_gauss(r, q, QH * D, 1.0f);
            int32_t qp = (int32_t)(t + 9);
            kvq_status st = kvq_cache_attend(c, l, q, &qp, 1, o1, QH * D, NULL, 0);
            check_bytes(c, bc);
            if (st != KVQ_OK) {
                *fail_st = st;
                continue;
            }
            CHECK_OK(kvq_cache_attend(ref, l, q, &qp, 1, o2, QH * D, NULL, 0));
            if (cmp)
                worst = fmax(worst, tu_rel_err(o1, o2, QH * D));
        }
    }
    return worst;
}

static double drive(kvq_cache *c, kvq_cache *ref, tu_rng *r, int *fail_st) {
    return drive_range(c, ref, 0, N, r, fail_st, 1, NULL);
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

/* After losses: every token c still holds is one of ref's, with the same K
 * and V bit for bit, and c holds every token of ref but `lost` (summed over
 * the layers). */
static void compare_survivors(kvq_cache *c, kvq_cache *ref, uint64_t lost, const char *name) {
    uint64_t missing = 0;
    int same = 1;
    for (size_t l = 0; l < 2; l++) {
        size_t n1, n2;
        CHECK_OK(kvq_cache_tokens(c, l, &n1));
        CHECK_OK(kvq_cache_tokens(ref, l, &n2));
        if (n1 > n2) {
            TU_REPORT(0, "%s: layer %zu holds %zu tokens, more than all-hot's %zu", name, l, n1, n2);
            continue;
        }
        missing += n2 - n1;
        int32_t *p1 = malloc((n1 + 1) * 4), *p2 = malloc((n2 + 1) * 4);
        float *k1 = malloc((n1 + 1) * H * D * 4), *v1 = malloc((n1 + 1) * H * D * 4);
        float *k2 = malloc((n2 + 1) * H * D * 4), *v2 = malloc((n2 + 1) * H * D * 4);
        CHECK_OK(kvq_cache_positions(c, l, p1, n1));
        CHECK_OK(kvq_cache_positions(ref, l, p2, n2));
        CHECK_OK(kvq_cache_get_kv(c, l, -1, 0, n1, k1, v1, n1 * H * D));
        CHECK_OK(kvq_cache_get_kv(ref, l, -1, 0, n2, k2, v2, n2 * H * D));
        size_t j = 0;
        for (size_t i = 0; i < n1 && same; i++) {
            while (j < n2 && p2[j] < p1[i])
                j++;
            same = j < n2 && p2[j] == p1[i] && !memcmp(k1 + i * H * D, k2 + j * H * D, H * D * 4) &&
                   !memcmp(v1 + i * H * D, v2 + j * H * D, H * D * 4);
        }
        free(p1), free(p2), free(k1), free(v1), free(k2), free(v2);
    }
    TU_REPORT(same, "%s: a surviving token differs from the all-hot cache's", name);
    TU_REPORT(missing == lost, "%s: %llu tokens missing, %llu counted lost", name,
              (unsigned long long)missing, (unsigned long long)lost);
}

/* Attention of c on layer l for query q at position qp against softmax
 * attention computed in double over the K/V c holds now (kvq_cache_get_kv:
 * the values attention reads). c computes in float with the scalar path
 * (cfg.isa), so each output component differs from the double one by at
 * most the forward error of the computation: scores (d products summed)
 * err <= d*u*S with S = max_j sum_i |q_i k_ji| / sqrt(d), each weight
 * exp(s_j - m) then has relative error <= 2*d*u*S + 2u, the normaliser and
 * the weighted sum add n*u each (n visible tokens), online-softmax rescaling
 * a few u more, so |out_c - ref_c| <= (2*d*S + 2*n + 8) * u * M_c with
 * M_c = sum_j p_j |v_jc|. The check allows 4 times that (u = 2^-24). */
static void check_exact_attention(kvq_cache *c, size_t l, const float *q, int32_t qp,
                                  const char *name) {
    float out[QH * D];
    CHECK_OK(kvq_cache_attend(c, l, q, &qp, 1, out, QH * D, NULL, 0));
    /* nothing is staged when this runs (the last attend reached the newest
     * token and recent_window is 0), so the attend changed no K/V: it read
     * what get_kv returns now, minus the pages it found lost */
    size_t n;
    CHECK_OK(kvq_cache_tokens(c, l, &n));
    int32_t *pos = malloc((n + 1) * 4);
    float *k = malloc((n + 1) * H * D * 4), *v = malloc((n + 1) * H * D * 4);
    double *w = malloc((n + 1) * sizeof(double));
    CHECK_OK(kvq_cache_positions(c, l, pos, n));
    CHECK_OK(kvq_cache_get_kv(c, l, -1, 0, n, k, v, n * H * D));
    const double u = 0x1p-24;
    int ok = 1;
    double worst = 0;
    for (size_t qh = 0; qh < QH; qh++) {
        size_t h = qh / (QH / H);
        const float *qv = q + qh * D;
        double m = -INFINITY, S = 0, l_sum = 0;
        size_t nv = 0;
        for (size_t j = 0; j < n; j++) {
            w[j] = -INFINITY;
            if (pos[j] > qp)
                continue;
            double sc = 0, sa = 0;
            for (size_t i = 0; i < D; i++) {
                sc += (double)qv[i] * k[(j * H + h) * D + i];
                sa += fabs((double)qv[i] * k[(j * H + h) * D + i]);
            }
            w[j] = sc / sqrt((double)D);
            S = fmax(S, sa / sqrt((double)D));
            m = fmax(m, w[j]);
            nv++;
        }
        for (size_t j = 0; j < n; j++) {
            w[j] = pos[j] > qp ? 0.0 : exp(w[j] - m);
            l_sum += w[j];
        }
        for (size_t i = 0; i < D; i++) {
            double o = 0, mag = 0;
            for (size_t j = 0; j < n; j++) {
                o += w[j] * v[(j * H + h) * D + i];
                mag += w[j] * fabs((double)v[(j * H + h) * D + i]);
            }
            o /= l_sum;
            mag /= l_sum;
            double bound = 4.0 * (2.0 * D * S + 2.0 * (double)nv + 8.0) * u * mag;
            double e = fabs((double)out[qh * D + i] - o);
            worst = fmax(worst, bound > 0 ? e / bound : e);
            ok &= e <= bound;
        }
    }
    TU_REPORT(ok, "%s: layer %zu attention is not attention over the %zu tokens it holds "
              "(worst error %.3g of its bound)", name, l, n, worst);
    free(pos), free(k), free(v), free(w);
}

/* Scenarios 3 and 4 of run_store: a cache with 64 hot tokens per layer over
 * store s and an all-hot reference are driven through the sequence; then,
 * with `fault` (KVQ_FAULT_READ or KVQ_FAULT_DISCONNECT) injected, one attend
 * on `layer` meets it: a read error fails the attend and the next one gives
 * exactly the reference's output; a dropped connection is retried (the
 * store reconnects) and the attend succeeds at once. No page is lost, the
 * K/V are the reference's. */
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
            TU_REPORT(as == KVQ_ERR_IO, "%s: attend under a read error gave %s", name,
                      kvq_strerror(as));
            kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0);
            CHECK_OK(kvq_cache_attend(c, layer, q, &qp, 1, o1, QH * D, NULL, 0));
        } else {
            TU_REPORT(as == KVQ_OK, "%s: attend over a dropped connection gave %s", name,
                      kvq_strerror(as));
        }
        CHECK_OK(kvq_cache_attend(ref, layer, q, &qp, 1, o2, QH * D, NULL, 0));
        CHECK(tu_rel_err(o1, o2, QH * D) == 0.0);
        compare_kv(c, ref);
        kvq_tier_stats ts;
        CHECK_OK(kvq_cache_tier_stats(c, &ts));
        /* a failure that may pass is no loss */
        CHECK_EQ(ts.lost_pages, 0);
        CHECK_EQ(ts.lost_tokens, 0);
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
    /* 1. hot 64 + warm 64 tokens per layer, the rest cold: exact, and the
     * cache's allocator holds exactly the stored bytes after every call */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    kvq_cache *c = mk(s, 64, 64, NULL, &al), *ref = mk(NULL, 0, 0, NULL, NULL);
    bytes_check bc = {&fa, fa.live_bytes, 0, 0, 0};
    int fst = 0;
    double w = drive_range(c, ref, 0, N, r, &fst, 1, &bc);
    CHECK_EQ(fst, 0);
    TU_REPORT(w == 0.0, "%s: tiered attention differs from all-hot by %.3g", name, w);
    TU_REPORT(bc.bad == 0, "%s: stored bytes differ from allocated bytes at %d steps (first: %llu "
              "stored, %llu allocated)", name, bc.bad, (unsigned long long)bc.stored,
              (unsigned long long)bc.live);
    kvq_tier_stats ts;
    CHECK_OK(kvq_cache_tier_stats(c, &ts));
    printf("%s: demotions %llu promotions %llu to_cold %llu from_cold %llu modeled %.2f ms measured "
           "%.2f ms\n", name, (unsigned long long)ts.demotions, (unsigned long long)ts.promotions,
           (unsigned long long)ts.bytes_to_cold, (unsigned long long)ts.bytes_from_cold,
           ts.modeled_transfer_ms, ts.measured_transfer_ms);
    CHECK(ts.demotions > 0 && ts.promotions > 0 && ts.bytes_to_cold > 0 && ts.bytes_from_cold > 0);
    CHECK_EQ(ts.lost_pages, 0); /* nothing was lost: a false loss would drop tokens */
    CHECK_EQ(ts.verify_mismatches, 0);
    CHECK_EQ(ts.demotion_failures, 0);
    TU_REPORT(ts.pages[2] > 0 && ts.pages[1] > 0 && ts.pages[0] > 0, "pages hot/warm/cold %llu %llu %llu",
              (unsigned long long)ts.pages[0], (unsigned long long)ts.pages[1],
              (unsigned long long)ts.pages[2]);
    CHECK(ts.tokens[0] <= 2 * 64 + 2 * 16 * 3);
    CHECK(ts.modeled_transfer_ms > 0);
    {
        /* bits per value counts the tokens held in memory: cold ones are in the store */
        kvq_stats sv;
        kvq_cache_config g;
        CHECK_OK(kvq_cache_stats(c, -1, &sv));
        CHECK_OK(kvq_cache_get_config(c, &g));
        CHECK_EQ(sv.tokens_cold, ts.tokens[2]);
        double vals = (double)(sv.tokens - sv.tokens_cold) * g.n_kv_heads * g.head_dim * 2;
        CHECK_NEAR(sv.bits_per_value, sv.payload_bytes * 8.0 / vals, 1e-9);
    }
    compare_kv(c, ref); /* cold tokens are read from the store */
    size_t jl;
    CHECK_OK(kvq_cache_stats_json(c, NULL, 0, &jl));
    char *js = malloc(jl + 1);
    CHECK_OK(kvq_cache_stats_json(c, js, jl + 1, &jl));
    CHECK(strstr(js, "\"tiers\"") && strstr(js, "\"lost_pages\": 0") && strstr(js, "\"bytes_moved\""));
    free(js);
    kvq_cache_free(c);
    TU_REPORT(fa.live_bytes == 0, "%s: %zu bytes leaked", name, fa.live_bytes);
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
    /* 4. a dropped connection costs no failed call: the attend retries once */
    fault_on_attend(s, KVQ_FAULT_DISCONNECT, 1, name, r);
    kvq_store_close(s);
}

/* ---- lost cold pages ---- */

/* One attend on layer l of c and ref at position qp, with a random query
 * (aim < 0) or one aimed at the keys of token aim (2 x its key: that token
 * takes most of the attention, and its page the highest utility). */
static void attend_both(kvq_cache *c, kvq_cache *ref, size_t l, int32_t qp, int aim, tu_rng *r) {
    float q[QH * D], o[QH * D];
    tu_fill_gauss(r, q, QH * D, 1.0f);
    if (aim >= 0)
        for (size_t qh = 0; qh < QH; qh++)
            for (size_t i = 0; i < D; i++)
                q[qh * D + i] = 2.0f * K[((size_t)aim * H + qh / (QH / H)) * D + i];
    CHECK_OK(kvq_cache_attend(c, l, q, &qp, 1, o, QH * D, NULL, 0));
    CHECK_OK(kvq_cache_attend(ref, l, q, &qp, 1, o, QH * D, NULL, 0));
}

/* A tiered cache (hot 64, warm 64 tokens per layer, utility policy without
 * a budget, scalar path) over s and an all-hot reference, driven through
 * tokens 0..T_LOSS; then one attend per layer aimed at token 20 promotes
 * the pages of its layer, and page 1 (tokens 16..31), now the most useful,
 * stays in memory with its record in the store (a later demotion could
 * reuse that record). *cold gets the tier figures just after. */
#define T_LOSS 300
static void loss_setup(kvq_store *s, const tier_opt *o, kvq_cache **c, kvq_cache **ref,
                       kvq_tier_stats *cold, tu_rng *r) {
    tier_opt so = o ? *o : (tier_opt){0, 1, 0, 1};
    so.scalar = 1;
    so.utility = 1;
    *c = mk_opt(s, 64, 64, NULL, NULL, &so);
    *ref = mk_opt(NULL, 0, 0, NULL, NULL, &so);
    int fst = 0;
    double w = drive_range(*c, *ref, 0, T_LOSS, r, &fst, 1, NULL);
    CHECK_EQ(fst, 0);
    CHECK(w == 0.0);
    for (int i = 0; i < 20; i++) /* the score converges to ~1 (0.9^20 left of the rest) */
        for (size_t l = 0; l < 2; l++)
            attend_both(*c, *ref, l, T_LOSS - 1, 20, r);
    CHECK_OK(kvq_cache_tier_stats(*c, cold));
    CHECK(cold->pages[2] > 0 && cold->lost_pages == 0);
}

/* After the store lost every record of c's cold pages (before = the tier
 * figures then): one attend per layer drops exactly those pages and their
 * tokens, gives attention over the tokens that remain, and the cache goes
 * on (tokens T_LOSS..N appended and attended) without losing anything more:
 * what it holds is the all-hot cache's tokens bar the lost ones, bit for
 * bit. */
static void check_loss(kvq_cache *c, kvq_cache *ref, const kvq_tier_stats *before,
                       const char *name, tu_rng *r) {
    kvq_stats s0, s1;
    CHECK_OK(kvq_cache_stats(c, -1, &s0));
    float q[QH * D];
    for (size_t l = 0; l < 2; l++) {
        tu_fill_gauss(r, q, QH * D, 1.0f);
        check_exact_attention(c, l, q, 10000, name); /* the attend that meets the losses */
        float o[QH * D];
        CHECK_OK(kvq_cache_attend(ref, l, q, &(int32_t){10000}, 1, o, QH * D, NULL, 0));
    }
    kvq_tier_stats ts;
    CHECK_OK(kvq_cache_tier_stats(c, &ts));
    CHECK_OK(kvq_cache_stats(c, -1, &s1));
    printf("%s: %llu cold pages (%llu tokens) before the loss; lost %llu pages, %llu tokens\n",
           name, (unsigned long long)before->pages[2], (unsigned long long)before->tokens[2],
           (unsigned long long)ts.lost_pages, (unsigned long long)ts.lost_tokens);
    TU_REPORT(ts.lost_pages == before->pages[2], "%s: %llu pages lost, %llu were cold", name,
              (unsigned long long)ts.lost_pages, (unsigned long long)before->pages[2]);
    CHECK_EQ(ts.lost_tokens, before->tokens[2]);
    CHECK_EQ(s1.tokens, s0.tokens - before->tokens[2]);
    CHECK_EQ(s1.tokens_evicted, s0.tokens_evicted + before->tokens[2]);
    CHECK(strstr(kvq_cache_last_error(c), "lost") != NULL);
    compare_survivors(c, ref, ts.lost_tokens, name);
    /* the cache goes on, and loses nothing more: random queries let page 1's
     * utility sink (it is in memory, its record read before the loss), the
     * appends below then push it cold again and the next attend reads it */
    for (int i = 0; i < 60; i++)
        for (size_t l = 0; l < 2; l++)
            attend_both(c, ref, l, T_LOSS - 1, -1, r);
    int fst = 0;
    drive_range(c, ref, T_LOSS, N, r, &fst, 0, NULL);
    CHECK_EQ(fst, 0);
    kvq_tier_stats ts2;
    CHECK_OK(kvq_cache_tier_stats(c, &ts2));
    TU_REPORT(ts2.lost_pages == ts.lost_pages && ts2.lost_tokens == ts.lost_tokens,
              "%s: %llu more pages lost after the store's loss", name,
              (unsigned long long)(ts2.lost_pages - ts.lost_pages));
    CHECK(ts2.promotions > ts.promotions && ts2.pages[2] > 0);
    for (size_t l = 0; l < 2; l++) {
        tu_fill_gauss(r, q, QH * D, 1.0f);
        check_exact_attention(c, l, q, 10000, name);
    }
    compare_survivors(c, ref, ts.lost_tokens, name);
}

/* Removes every segment file of the file store in dir (under the running
 * store); returns how many. */
static int remove_segments(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "seg-", 4) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        n += unlink(path) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

static int count_key(void *ctx, const char *key, size_t size) {
    (void)key, (void)size;
    ++*(size_t *)ctx;
    return 0;
}

static size_t count_records(kvq_store *s) {
    size_t n = 0;
    CHECK_OK(kvq_store_list(s, "", count_key, &n));
    return n;
}

typedef struct {
    kvq_store *s;
    const char *dir;
    int flipped;
} flip_ctx;

/* Flips one byte in the middle of key's value where it lies in the
 * segment files (found by its bytes). */
static int flip_value(void *ctx, const char *key, size_t size) {
    flip_ctx *fc = (flip_ctx *)ctx;
    void *val = NULL;
    size_t vs = 0;
    if (kvq_store_get(fc->s, key, &val, &vs) != KVQ_OK || vs < 64)
        return 0;
    (void)size;
    DIR *d = opendir(fc->dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "seg-", 4) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", fc->dir, e->d_name);
        int fd = open(path, O_RDWR);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        unsigned char *buf = malloc((size_t)sb.st_size + 1);
        if (pread(fd, buf, (size_t)sb.st_size, 0) == sb.st_size) {
            unsigned char *at = memmem(buf, (size_t)sb.st_size, val, vs);
            if (at) {
                unsigned char b = (unsigned char)(at[vs / 2] ^ 0x10);
                if (pwrite(fd, &b, 1, (off_t)(at - buf) + (off_t)(vs / 2)) == 1)
                    fc->flipped++;
            }
        }
        free(buf);
        close(fd);
    }
    if (d)
        closedir(d);
    kvq_store_free_buf(fc->s, val);
    return 0;
}

/* File store: every segment file deleted under a running tiered cache; then
 * every record damaged in place (checksum failures); then strict_tiers. */
static void test_lost_file(const char *root, tu_rng *r) {
    const char *name = "file store, segments deleted";
    char dir[400], url[420];
    snprintf(dir, sizeof dir, "%s/lost", root);
    snprintf(url, sizeof url, "file:%s", dir);
    kvq_store *s = NULL;
    CHECK_OK(kvq_store_open(&s, url, NULL, NULL, 0));
    if (!s)
        return;
    kvq_cache *c, *ref;
    kvq_tier_stats before;
    loss_setup(s, NULL, &c, &ref, &before, r);
    CHECK(remove_segments(dir) > 0);
    check_loss(c, ref, &before, name, r);
    /* the store writes to a new segment file, which is in the directory */
    struct stat sb;
    char seg2[460];
    snprintf(seg2, sizeof seg2, "%s/seg-000002.log", dir);
    TU_REPORT(stat(seg2, &sb) == 0 && sb.st_size > 0, "%s: no new segment file", name);
    kvq_cache_free(c);
    kvq_cache_free(ref);

    /* damaged records: a checksum failure is a loss too */
    name = "file store, records damaged";
    loss_setup(s, NULL, &c, &ref, &before, r);
    flip_ctx fc = {s, dir, 0};
    CHECK_OK(kvq_store_list(s, "kvq/", flip_value, &fc));
    CHECK(fc.flipped > 0);
    kvq_store_metrics m0, m1;
    CHECK_OK(kvq_store_stats(s, &m0));
    kvq_stats s0, s1;
    CHECK_OK(kvq_cache_stats(c, -1, &s0));
    float q[QH * D];
    for (size_t l = 0; l < 2; l++) {
        tu_fill_gauss(r, q, QH * D, 1.0f);
        check_exact_attention(c, l, q, 10000, name);
    }
    kvq_tier_stats ts;
    CHECK_OK(kvq_cache_tier_stats(c, &ts));
    CHECK_OK(kvq_store_stats(s, &m1));
    CHECK_OK(kvq_cache_stats(c, -1, &s1));
    TU_REPORT(ts.lost_pages == before.pages[2], "%s: %llu pages lost, %llu were cold", name,
              (unsigned long long)ts.lost_pages, (unsigned long long)before.pages[2]);
    CHECK_EQ(ts.lost_tokens, before.tokens[2]);
    CHECK_EQ(s1.tokens, s0.tokens - before.tokens[2]);
    CHECK(m1.corrupt_skipped >= m0.corrupt_skipped + before.pages[2]);
    compare_survivors(c, ref, ts.lost_tokens, name);
    kvq_cache_free(c);
    kvq_cache_free(ref);

    /* strict_tiers: the loss fails attend with KVQ_ERR_CORRUPT, the cache
     * keeps its tokens, the page is counted once */
    name = "file store, strict";
    tier_opt so = {1, 1, 0};
    loss_setup(s, &so, &c, &ref, &before, r);
    CHECK(remove_segments(dir) > 0);
    CHECK_OK(kvq_cache_stats(c, -1, &s0));
    float o[QH * D];
    int32_t qp = 10000;
    tu_fill_gauss(r, q, QH * D, 1.0f);
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &qp, 1, o, QH * D, NULL, 0), KVQ_ERR_CORRUPT);
    CHECK(strstr(kvq_cache_last_error(c), "lost") != NULL);
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &qp, 1, o, QH * D, NULL, 0), KVQ_ERR_CORRUPT);
    CHECK_OK(kvq_cache_tier_stats(c, &ts));
    CHECK_OK(kvq_cache_stats(c, -1, &s1));
    CHECK_EQ(ts.lost_pages, 1);
    CHECK_EQ(ts.lost_tokens, 0);
    CHECK_EQ(s1.tokens, s0.tokens);
    CHECK_EQ(s1.tokens_evicted, s0.tokens_evicted);
    size_t n0;
    CHECK_OK(kvq_cache_tokens(c, 0, &n0));
    float *kk = malloc(n0 * H * D * 4);
    CHECK_STATUS(kvq_cache_get_kv(c, 0, -1, 0, n0, kk, NULL, n0 * H * D), KVQ_ERR_CORRUPT);
    free(kk);
    kvq_cache_free(c);
    kvq_cache_free(ref);
    kvq_store_close(s);
}

/* ---- a private redis-server (tests/with_redis.sh names the binary) ---- */
typedef struct {
    pid_t pid;
    int port;
    char dir[64];
    const char *bin;
} tu_redis;

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

/* Starts redis-server without persistence on rs->port; 0 when it accepts
 * connections. */
static int redis_start(tu_redis *rs) {
    char port[16];
    snprintf(port, sizeof port, "%d", rs->port);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) {
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execl(rs->bin, rs->bin, "--port", port, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--dir", rs->dir, "--daemonize", "no", "--loglevel",
              "warning", (char *)NULL);
        _exit(127);
    }
    rs->pid = pid;
    for (int i = 0; i < 200; i++) { /* up to 10 s */
        if (port_open(rs->port))
            return 0;
        int stt;
        if (waitpid(pid, &stt, WNOHANG) == pid) {
            rs->pid = -1;
            return -1;
        }
        sleep_ms(50);
    }
    return -1;
}

static void redis_stop(tu_redis *rs) {
    if (rs->pid <= 0)
        return;
    kill(rs->pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        int stt;
        if (waitpid(rs->pid, &stt, WNOHANG) == rs->pid) {
            rs->pid = -1;
            return;
        }
        sleep_ms(50);
    }
    kill(rs->pid, SIGKILL);
    waitpid(rs->pid, NULL, 0);
    rs->pid = -1;
}

/* Redis restarted without persistence under a running tiered cache: the
 * records are gone, the connection is dropped; the next attends reconnect
 * (no failed call), lose exactly the cold pages and go on. */
static void test_redis_restart(const char *bin, tu_rng *r) {
    const char *name = "redis restarted";
    tu_redis rs = {-1, free_port(), "", bin};
    snprintf(rs.dir, sizeof rs.dir, "/tmp/kvq_tier_redis_XXXXXX");
    if (rs.port <= 0 || !mkdtemp(rs.dir) || redis_start(&rs) != 0) {
        TU_REPORT(0, "%s: cannot start %s on port %d", name, bin, rs.port);
        redis_stop(&rs);
        return;
    }
    char url[96];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/restart", rs.port);
    kvq_store *s = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (s) {
        kvq_cache *c, *ref;
        kvq_tier_stats before;
        loss_setup(s, NULL, &c, &ref, &before, r);
        CHECK(count_records(s) > 0);
        redis_stop(&rs);
        TU_REPORT(redis_start(&rs) == 0, "%s: the server did not come back", name);
        check_loss(c, ref, &before, name, r);
        kvq_cache_free(c);
        kvq_cache_free(ref);
        kvq_store_close(s);
    }
    redis_stop(&rs);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rs.dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", rs.dir);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Record TTL (Redis): a cache with cold_ttl_ms and one without, side by
 * side in two namespaces. Past the TTL the first one's records are gone
 * from Redis (and its cold pages lost when needed), the second's are all
 * there. */
static void test_redis_ttl(const char *base_url, tu_rng *r) {
    const char *name = "redis ttl";
    char url_a[300], url_b[300];
    const char *slash = strchr(base_url + 8, '/');
    int hl = slash ? (int)(slash - base_url) : (int)strlen(base_url);
    snprintf(url_a, sizeof url_a, "%.*s/ttl_on", hl, base_url);
    snprintf(url_b, sizeof url_b, "%.*s/ttl_off", hl, base_url);
    kvq_store *sa = NULL, *sb = NULL;
    CHECK_OK(kvq_store_open(&sa, url_a, NULL, NULL, 0));
    CHECK_OK(kvq_store_open(&sb, url_b, NULL, NULL, 0));
    if (!sa || !sb) {
        kvq_store_close(sa);
        kvq_store_close(sb);
        return;
    }
    const uint64_t ttl = 1000;
    tier_opt oa = {0, 1, ttl};
    kvq_cache *ca, *refa, *cb, *refb;
    kvq_tier_stats ba, bb;
    double t0 = now_ms();
    loss_setup(sa, &oa, &ca, &refa, &ba, r);
    double t1 = now_ms();
    loss_setup(sb, NULL, &cb, &refb, &bb, r);
    size_t na = count_records(sa), nb = count_records(sb);
    /* every record of A was written after t0: all live while now < t0 + ttl */
    if (now_ms() < t0 + (double)ttl)
        TU_REPORT(na >= ba.pages[2], "%s: %zu records for %llu cold pages before the TTL", name, na,
                  (unsigned long long)ba.pages[2]);
    else
        printf("%s: the setup took longer than the TTL: records not counted before it\n", name);
    CHECK(nb >= bb.pages[2]);
    /* A's last record was written before t1: all expired by t1 + ttl (Redis
     * never returns a key past its expiry); 300 ms margin for clocks */
    double wait = t1 + (double)ttl + 300.0 - now_ms();
    if (wait > 0)
        sleep_ms((long)wait);
    TU_REPORT(count_records(sa) == 0, "%s: %zu records outlived their TTL", name,
              count_records(sa));
    CHECK_EQ(count_records(sb), nb);
    check_loss(ca, refa, &ba, "redis ttl (expired)", r);
    /* B never lost anything */
    float q[QH * D];
    for (size_t l = 0; l < 2; l++) {
        tu_fill_gauss(r, q, QH * D, 1.0f);
        check_exact_attention(cb, l, q, 10000, name);
    }
    kvq_tier_stats tb;
    CHECK_OK(kvq_cache_tier_stats(cb, &tb));
    CHECK_EQ(tb.lost_pages, 0);
    compare_survivors(cb, refb, 0, "redis without ttl");
    kvq_cache_free(ca);
    kvq_cache_free(refa);
    kvq_cache_free(cb);
    kvq_cache_free(refb);
    kvq_store_close(sa);
    kvq_store_close(sb);
}

static void test_warm_codec_and_drop(tu_rng *r) {
    /* a warm codec re-encodes only warm pages: close to, not equal to, all-hot */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    kvq_cache *c = mk(NULL, 64, 100000, "int4", &al), *ref = mk(NULL, 0, 0, NULL, NULL);
    int fst = 0;
    bytes_check bc = {&fa, fa.live_bytes, 0, 0, 0};
    double w = drive_range(c, ref, 0, N, r, &fst, 1, &bc);
    CHECK_EQ(fst, 0);
    TU_REPORT(w > 0 && w < 1.0, "warm int4: attention differs from all-hot by %.3g", w);
    TU_REPORT(bc.bad == 0, "warm int4: stored bytes differ from allocated bytes at %d steps (first: "
              "%llu stored, %llu allocated)", bc.bad, (unsigned long long)bc.stored,
              (unsigned long long)bc.live);
    /* every stored vector is the all-hot one (hot pages) or exactly its int4
     * re-encoding (warm pages) */
    {
        kvq_codec *w4 = NULL;
        CHECK_OK(kvq_codec_create(&w4, "int4", D, NULL));
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
    const char *why = "", *why_server = "";
    const char *redis = tu_redis_env("KVQ_TEST_REDIS", &why); /* tests/with_redis.sh */
    if (redis)
        run_store(redis, "redis store", &r);
    else
        printf("SKIP redis: %s\n", why);
    test_warm_codec_and_drop(&r);
    test_lost_file(dir, &r);
    const char *server = tu_redis_env("KVQ_TEST_REDIS_SERVER", &why_server); /* its binary */
    if (server)
        test_redis_restart(server, &r);
    else
        printf("SKIP redis restart: %s\n", why_server);
    if (redis)
        test_redis_ttl(redis, &r);
    else
        printf("SKIP redis ttl: %s\n", why);
    test_snapshot_prefix(url, &r);
    if (redis)
        test_snapshot_prefix(redis, &r);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("note: could not remove %s\n", dir);
    return tu_finish();
}
