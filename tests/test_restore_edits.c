/*
 * test_restore_edits.c - snapshots and prefix entries come back from a store
 * that others may write (a shared Redis), so kvq_cache_load and
 * kvq_cache_prefix_get take nothing on trust. Every load of an edited
 * snapshot or entry either restores exactly what was saved or fails with
 * KVQ_ERR_CORRUPT and leaves the cache as it was (a prefix entry of another
 * prompt: a miss, the pages before it loaded exactly); never a crash, never
 * other K/V.
 *
 *  1. The reproductions of the defects this guards against, each a named
 *     check: a record with a pending slot and no staged K/V (the next append
 *     read a staging block that did not exist: a crash), the free-stack bit
 *     in a state byte, a page record of another save of the same snapshot,
 *     a record carrying the previous page's positions, a prefix entry with
 *     shifted positions or a pending slot.
 *  2. A randomized sweep (--iters N, default 12,000; seed printed, --seed S)
 *     over four cache configurations (staged tokens, utility eviction with
 *     holes, channel-key pages, a warm tier) and prefix entries: each
 *     iteration edits what a writer of the store can edit (slot states,
 *     positions, the layer field, a record of another save or page, a
 *     manifest's page list, an entry's page index or ids), with every
 *     checksum recomputed and, for half of the snapshot edits, the manifest
 *     re-signed (fuzz/snapshot_forge.h) so that only the slot checks stand
 *     between the edit and the cache. Each outcome is checked: a restore is
 *     compared with the cache that was saved (positions and K/V bit for
 *     bit, per layer), a failure must be KVQ_ERR_CORRUPT with the cache's
 *     stats unchanged and the cache still able to load the genuine
 *     snapshot. Edits that a re-signed manifest lets through by design (a
 *     consistent forgery) are not drawn there: every drawn edit breaks a
 *     rule the loader states (kvq.h).
 */
#include "testutil.h"

#include "../fuzz/snapshot_forge.h"
#include "tier/record.h"

#include <dirent.h>
#include <unistd.h>

enum { NL = 2, NH = 2, NQ = 4, ND = 16, NP = 8, NT = 45, HD = NH * ND, QD = NQ * ND };
#define NCFG 4

/* record byte offsets (docs/record-format.md) */
enum { R_LAYER = 16, R_PT = 20, R_NTOK = 32, R_PMIN = 36, R_PMAX = 40, R_LLEN = 44, R_PHASH = 48 };

static void cfg_of(int i, kvq_cache_config *c) {
    kvq_cache_config_init(c);
    c->n_layers = NL, c->n_kv_heads = NH, c->n_q_heads = NQ, c->head_dim = ND;
    c->page_tokens = NP, c->max_tokens = 256;
    c->k_codec = "int8", c->v_codec = "tq3";
    c->recent_window = 4; /* the last tokens stay pending, staged in f16 */
    switch (i) {
    case 1: /* utility eviction: evicted slots are reused, sinks kept */
        c->k_codec = "int4", c->v_codec = "int4";
        c->policy = KVQ_POLICY_UTILITY, c->budget_tokens = 20, c->sinks = 2;
        c->protect_recent = 4, c->recent_window = 3;
        break;
    case 2: /* channel-layout keys: pages filled in order, encoded whole */
        c->k_codec = "chan:int4";
        break;
    case 3: /* a warm tier re-encoded to int4 */
        c->hot_tokens = 16, c->warm_codec = "int4";
        break;
    default:
        break;
    }
}

/* Appends and attends NT tokens per layer (data from seed), then one more
 * token without attention, so the newest stay pending. */
static kvq_cache *make_filled(int ci, uint64_t seed) {
    kvq_cache_config cfg;
    cfg_of(ci, &cfg);
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    if (!c)
        return NULL;
    tu_rng r;
    tu_seed(&r, seed);
    float k[HD], v[HD], q[QD], out[QD];
    for (int32_t pos = 0; pos <= NT; pos++)
        for (size_t l = 0; l < NL; l++) {
            tu_fill_gauss(&r, k, HD, 1.0f);
            tu_fill_gauss(&r, v, HD, 1.0f);
            tu_fill_gauss(&r, q, QD, 1.0f);
            CHECK_OK(kvq_cache_append(c, l, k, v, &pos, 1));
            if (pos < NT)
                CHECK_OK(kvq_cache_attend(c, l, q, &pos, 1, out, QD, NULL, 0));
        }
    return c;
}

static kvq_cache *make_empty(int ci) {
    kvq_cache_config cfg;
    cfg_of(ci, &cfg);
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    return c;
}

/* 1 when b holds exactly a's tokens: count, positions and K/V bit for bit
 * on every layer (both caches are read the same way). */
static int same_kv(const kvq_cache *a, const kvq_cache *b) {
    for (size_t l = 0; l < NL; l++) {
        size_t na = 0, nb = 0;
        if (kvq_cache_tokens(a, l, &na) != KVQ_OK || kvq_cache_tokens(b, l, &nb) != KVQ_OK || na != nb)
            return 0;
        int32_t pa[256], pb[256];
        if (kvq_cache_positions(a, l, pa, 256) != KVQ_OK ||
            kvq_cache_positions(b, l, pb, 256) != KVQ_OK || memcmp(pa, pb, na * sizeof *pa) != 0)
            return 0;
        if (!na)
            continue;
        static float ka[256 * HD], va[256 * HD], kb[256 * HD], vb[256 * HD];
        if (kvq_cache_get_kv(a, l, -1, 0, na, ka, va, na * HD) != KVQ_OK ||
            kvq_cache_get_kv(b, l, -1, 0, nb, kb, vb, nb * HD) != KVQ_OK ||
            memcmp(ka, kb, na * HD * sizeof(float)) != 0 || memcmp(va, vb, na * HD * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

/* What a failed restore must leave as it was (all but peak_stored_bytes). */
static void stats_text(const kvq_cache *c, char *buf, size_t n) {
    kvq_stats t;
    kvq_cache_stats(c, -1, &t);
    snprintf(buf, n, "%llu %llu %llu %llu %llu %llu %llu %llu %llu",
             (unsigned long long)t.tokens, (unsigned long long)t.tokens_appended,
             (unsigned long long)t.payload_bytes, (unsigned long long)t.metadata_bytes,
             (unsigned long long)t.codec_meta_bytes, (unsigned long long)t.stored_bytes,
             (unsigned long long)t.pages, (unsigned long long)t.free_slots,
             (unsigned long long)t.tokens_evicted);
}

/* A malloc'd copy of key's value (NULL when absent). */
static uint8_t *get_copy(kvq_store *s, const char *key, size_t *n) {
    void *d = NULL;
    if (kvq_store_get(s, key, &d, n) != KVQ_OK)
        return NULL;
    uint8_t *o = malloc(*n ? *n : 1);
    memcpy(o, d, *n);
    kvq_store_free_buf(s, d);
    return o;
}

/* ---- page records as bytes ---- */
typedef struct {
    uint8_t *b; /* the record */
    size_t n;
    uint32_t P;
} rec_t;

static int32_t rpos(const rec_t *r, uint32_t i) { return (int32_t)kvq__ld32(r->b + 64 + 4 * i); }
static void rset_pos(rec_t *r, uint32_t i, int32_t p) { kvq__st32(r->b + 64 + 4 * i, (uint32_t)p); }
static uint8_t *rstate(rec_t *r, uint32_t i) { return r->b + 64 + 4 * r->P + i; }
static int rstaged(const rec_t *r) {
    const char *lay = (const char *)r->b + 64 + 5 * r->P;
    return memchr(lay, '+', kvq__ld32(r->b + R_LLEN)) != NULL;
}
/* n_tokens, pos_min, pos_max from the slots, then the CRC32C. */
static void rfix(rec_t *r) {
    uint32_t n = 0;
    int32_t lo = -1, hi = -1;
    for (uint32_t i = 0; i < r->P; i++) {
        int32_t p = rpos(r, i);
        if (p < 0)
            continue;
        lo = n == 0 || p < lo ? p : lo;
        hi = n == 0 || p > hi ? p : hi;
        n++;
    }
    kvq__st32(r->b + R_NTOK, n);
    kvq__st32(r->b + R_PMIN, (uint32_t)lo);
    kvq__st32(r->b + R_PMAX, (uint32_t)hi);
    kvq__st32(r->b + r->n - 4, kvq_crc32c(0, r->b, r->n - 4));
}
static int rslot(const rec_t *r, tu_rng *g) { /* a random occupied slot, or -1 */
    int idx[4096], k = 0;
    for (uint32_t i = 0; i < r->P; i++)
        if (rpos(r, i) >= 0)
            idx[k++] = (int)i;
    return k ? idx[tu_next(g) % (uint64_t)k] : -1;
}

/* ---- a saved snapshot and what the sweep needs of it ---- */
typedef struct {
    int ci;
    kvq_cache *orig;        /* the cache that was saved */
    char name[16], other[16]; /* its snapshot; another save of another cache */
    uint8_t *man;
    size_t man_n;
    int n_rec;
    uint32_t layer[64], page[64];
    uint8_t *rec[64], *orec[64]; /* this save's records; the other save's of the same page */
    size_t rec_n[64], orec_n[64];
    int32_t last[NL];
    char empty_stats[256];
} snap_t;

static int walk_keep(void *ctx, const kvq_forge_page *pg) {
    snap_t *s = ctx;
    if (s->n_rec < 64) {
        s->layer[s->n_rec] = pg->layer;
        s->page[s->n_rec] = pg->page;
        s->n_rec++;
    }
    return 0;
}

static void rec_key(const snap_t *s, int k, char *key, size_t n) {
    snprintf(key, n, "%s/l%u/p%u", s->name, (unsigned)s->layer[k], (unsigned)s->page[k]);
}

static void snap_setup(snap_t *s, kvq_store *st, int ci) {
    memset(s, 0, sizeof *s);
    s->ci = ci;
    snprintf(s->name, sizeof s->name, "s%d", ci);
    snprintf(s->other, sizeof s->other, "o%d", ci);
    s->orig = make_filled(ci, 100 + (uint64_t)ci);
    kvq_cache *o = make_filled(ci, 200 + (uint64_t)ci);
    if (!s->orig || !o) {
        kvq_cache_free(o);
        return;
    }
    CHECK_OK(kvq_cache_save(s->orig, st, s->name, INT32_MAX));
    CHECK_OK(kvq_cache_save(o, st, s->other, INT32_MAX));
    kvq_cache_free(o);
    char key[64];
    snprintf(key, sizeof key, "%s/manifest", s->name);
    s->man = get_copy(st, key, &s->man_n);
    CHECK(s->man != NULL);
    if (!s->man)
        return;
    CHECK(kvq_forge_walk(s->man, s->man_n, HD, walk_keep, s) > 0);
    for (int k = 0; k < s->n_rec; k++) {
        rec_key(s, k, key, sizeof key);
        s->rec[k] = get_copy(st, key, &s->rec_n[k]);
        char okey[64];
        snprintf(okey, sizeof okey, "%s/l%u/p%u", s->other, (unsigned)s->layer[k], (unsigned)s->page[k]);
        s->orec[k] = get_copy(st, okey, &s->orec_n[k]);
        CHECK(s->rec[k] != NULL);
    }
    for (size_t l = 0; l < NL; l++)
        s->last[l] = NT; /* positions 0..NT were appended */
    kvq_cache *e = make_empty(ci);
    if (e)
        stats_text(e, s->empty_stats, sizeof s->empty_stats);
    kvq_cache_free(e);
}

static void snap_free(snap_t *s) {
    kvq_cache_free(s->orig);
    free(s->man);
    for (int k = 0; k < s->n_rec; k++)
        free(s->rec[k]), free(s->orec[k]);
}

/* Puts the saved manifest and records back. */
static void snap_restore(const snap_t *s, kvq_store *st) {
    char key[64];
    snprintf(key, sizeof key, "%s/manifest", s->name);
    CHECK_OK(kvq_store_put(st, key, s->man, s->man_n));
    for (int k = 0; k < s->n_rec; k++) {
        rec_key(s, k, key, sizeof key);
        CHECK_OK(kvq_store_put(st, key, s->rec[k], s->rec_n[k]));
    }
}

/* Re-signs the snapshot's manifest for the records now in the store. */
static void snap_resign(const snap_t *s, kvq_store *st) {
    uint8_t *m = malloc(s->man_n);
    memcpy(m, s->man, s->man_n);
    kvq_forge_resign(st, s->name, m, s->man_n, HD, 0, 0);
    char key[64];
    snprintf(key, sizeof key, "%s/manifest", s->name);
    CHECK_OK(kvq_store_put(st, key, m, s->man_n));
    free(m);
}

/* Outcomes of the sweep, counted. */
static long n_restored, n_corrupt, n_miss, n_bad;

/* Loads the snapshot into a fresh cache and checks the outcome: restored
 * exactly, or KVQ_ERR_CORRUPT (when allowed) with the cache unchanged and
 * still able to load the genuine snapshot afterwards. */
static int load_check(const snap_t *s, kvq_store *st, int may_restore, int may_fail, const char *what) {
    kvq_cache *c = make_empty(s->ci);
    if (!c)
        return 0;
    kvq_status rc = kvq_cache_load(c, st, s->name);
    int ok;
    if (rc == KVQ_OK) {
        ok = may_restore && same_kv(s->orig, c);
        n_restored++;
    } else {
        char now[256];
        stats_text(c, now, sizeof now);
        ok = may_fail && rc == KVQ_ERR_CORRUPT && strcmp(now, s->empty_stats) == 0 &&
             kvq_cache_last_error(c)[0] != 0;
        n_corrupt++;
        if (ok) { /* the cache is as it was: the genuine snapshot loads into it */
            snap_restore(s, st);
            ok = kvq_cache_load(c, st, s->name) == KVQ_OK && same_kv(s->orig, c);
        }
    }
    if (!ok) {
        n_bad++;
        if (n_bad <= 10)
            fprintf(stderr, "config %d, %s: load gave %s (%s)\n", s->ci, what, kvq_strerror(rc),
                    kvq_cache_last_error(c));
    }
    kvq_cache_free(c);
    return ok;
}

/* ---- 1. reproductions ---- */

/* The first record of layer l that is staged (want_stage) or not. */
static int find_rec(const snap_t *s, int l, int want_stage) {
    for (int k = 0; k < s->n_rec; k++) {
        rec_t r = {s->rec[k], s->rec_n[k], kvq__ld32(s->rec[k] + R_PT)};
        if ((int)s->layer[k] == l && rstaged(&r) == want_stage)
            return k;
    }
    return -1;
}

/* Record k of s edited by fn (a copy), stored under its key; with resign,
 * the manifest is re-signed for it. */
static void put_edit(const snap_t *s, kvq_store *st, int k, void (*fn)(rec_t *, void *), void *arg,
                     int resign) {
    rec_t r = {malloc(s->rec_n[k]), s->rec_n[k], kvq__ld32(s->rec[k] + R_PT)};
    memcpy(r.b, s->rec[k], r.n);
    fn(&r, arg);
    char key[64];
    rec_key(s, k, key, sizeof key);
    CHECK_OK(kvq_store_put(st, key, r.b, r.n));
    free(r.b);
    if (resign)
        snap_resign(s, st);
}

static void ed_pending(rec_t *r, void *arg) {
    (void)arg;
    *rstate(r, 0) = 2;
    rfix(r);
}
static void ed_flag(rec_t *r, void *arg) {
    (void)arg;
    *rstate(r, 0) |= 0x80;
    rfix(r);
}
static void ed_positions(rec_t *r, void *arg) { /* the previous page's positions */
    const rec_t *prev = arg;
    for (uint32_t i = 0; i < r->P; i++) {
        rset_pos(r, i, rpos(prev, i));
        *rstate(r, i) = rpos(prev, i) >= 0 ? 1 : 0;
    }
    rfix(r);
}

static void test_reproductions(kvq_store *st) {
    snap_t s;
    snap_setup(&s, st, 0);
    if (!s.man) {
        snap_free(&s);
        return;
    }
    /* defect 1: a pending slot in a page saved without staging. Before the
     * slot checks this loaded, and the next append read the staging block
     * the page does not have (a segfault). */
    int k = find_rec(&s, 0, 0);
    CHECK(k >= 0);
    if (k >= 0) {
        put_edit(&s, st, k, ed_pending, NULL, 1);
        kvq_cache *c = make_empty(0);
        kvq_status rc = kvq_cache_load(c, st, s.name);
        TU_REPORT(rc == KVQ_ERR_CORRUPT, "pending slot without staging: load gave %s",
                  kvq_strerror(rc));
        if (rc == KVQ_OK) { /* what crashed: the next append */
            float kv[HD] = {0};
            kvq_cache_append(c, 0, kv, kv, NULL, 1);
        }
        CHECK(strstr(kvq_cache_last_error(c), "pending") != NULL);
        kvq_cache_free(c);
        snap_restore(&s, st);
    }
    /* the free-stack bit from a record's state byte */
    if (k >= 0) {
        put_edit(&s, st, k, ed_flag, NULL, 1);
        kvq_cache *c = make_empty(0);
        kvq_status rc = kvq_cache_load(c, st, s.name);
        TU_REPORT(rc == KVQ_ERR_CORRUPT, "state byte 0x81: load gave %s", kvq_strerror(rc));
        kvq_cache_free(c);
        snap_restore(&s, st);
    }
    /* defect 3: page 1 of layer 0 from another save of the same
     * configuration (as two writers of one name leave it); before, it
     * loaded and get_kv returned the other save's keys */
    for (int j = 0; j < s.n_rec; j++) {
        if (s.layer[j] != 0 || s.page[j] != 1 || !s.orec[j])
            continue;
        char key[64];
        rec_key(&s, j, key, sizeof key);
        CHECK_OK(kvq_store_put(st, key, s.orec[j], s.orec_n[j]));
        kvq_cache *c = make_empty(0);
        kvq_status rc = kvq_cache_load(c, st, s.name);
        TU_REPORT(rc == KVQ_ERR_CORRUPT, "a record of another save: load gave %s", kvq_strerror(rc));
        if (rc == KVQ_OK)
            TU_REPORT(same_kv(s.orig, c), "a record of another save loaded other K/V");
        char now[256];
        stats_text(c, now, sizeof now);
        CHECK(strcmp(now, s.empty_stats) == 0);
        kvq_cache_free(c);
        /* ... and with the manifest re-signed for it, the save id gives it away */
        snap_resign(&s, st);
        c = make_empty(0);
        rc = kvq_cache_load(c, st, s.name);
        TU_REPORT(rc == KVQ_ERR_CORRUPT, "a record of another save, re-signed: load gave %s",
                  kvq_strerror(rc));
        CHECK(strstr(kvq_cache_last_error(c), "another save") != NULL);
        kvq_cache_free(c);
        snap_restore(&s, st);
    }
    /* defect 3: page 2 carrying page 1's positions (loaded as 0 0 1 1 ...) */
    int k1 = -1, k2 = -1;
    for (int j = 0; j < s.n_rec; j++) {
        k1 = s.layer[j] == 0 && s.page[j] == 1 ? j : k1;
        k2 = s.layer[j] == 0 && s.page[j] == 2 ? j : k2;
    }
    CHECK(k1 >= 0 && k2 >= 0);
    if (k1 >= 0 && k2 >= 0) {
        rec_t prev = {s.rec[k1], s.rec_n[k1], kvq__ld32(s.rec[k1] + R_PT)};
        put_edit(&s, st, k2, ed_positions, &prev, 1);
        kvq_cache *c = make_empty(0);
        kvq_status rc = kvq_cache_load(c, st, s.name);
        TU_REPORT(rc == KVQ_ERR_CORRUPT, "the previous page's positions: load gave %s",
                  kvq_strerror(rc));
        CHECK(strstr(kvq_cache_last_error(c), "twice") != NULL);
        kvq_cache_free(c);
        snap_restore(&s, st);
    }
    snap_free(&s);
}

/* ---- prefix entries ---- */
enum { PTOK = 40, PREC = 48 + 4 * NP };
static int32_t IDS_A[PTOK + 1], IDS_B[PTOK + 1];

typedef struct {
    char key[NT / NP + 1][NL][200];
    uint8_t *val[NT / NP + 1][NL];
    size_t n[NT / NP + 1][NL];
    int pages;
} prefix_t;

typedef struct {
    kvq_store *s;
    prefix_t *p;
} pfx_list_ctx;

static int pfx_fn(void *ctx, const char *key, size_t size) {
    pfx_list_ctx *x = ctx;
    (void)size;
    size_t n = 0;
    uint8_t *v = get_copy(x->s, key, &n);
    if (v && n > PREC + 64 && memcmp(v, "KVQP", 4) == 0) {
        uint32_t j = kvq__ld32(v + 8), l = kvq__ld32(v + PREC + R_LAYER);
        if (j < NT / NP + 1 && l < NL && !x->p->val[j][l]) {
            snprintf(x->p->key[j][l], sizeof x->p->key[j][l], "%s", key);
            x->p->val[j][l] = v;
            x->p->n[j][l] = n;
            x->p->pages = (int)j + 1 > x->p->pages ? (int)j + 1 : x->p->pages;
            return 0;
        }
    }
    free(v);
    return 0;
}

/* Publishes ids' first PTOK tokens (data of seed) into s and collects the
 * entries. */
static void prefix_setup(prefix_t *p, kvq_store *s, const int32_t *ids, uint64_t seed, kvq_cache **keep) {
    memset(p, 0, sizeof *p);
    kvq_cache *c = make_filled(0, seed);
    if (!c)
        return;
    CHECK_OK(kvq_cache_prefix_put(c, s, ids, PTOK));
    pfx_list_ctx x = {s, p};
    CHECK_OK(kvq_store_list(s, "kvqp/", pfx_fn, &x));
    if (keep)
        *keep = c;
    else
        kvq_cache_free(c);
}

static void prefix_free(prefix_t *p) {
    for (int j = 0; j < NT / NP + 1; j++)
        for (int l = 0; l < NL; l++)
            free(p->val[j][l]);
}

/* Entry e (n bytes): the inner record's and the entry's CRC32C. */
static void entry_fix(uint8_t *e, size_t n) {
    rec_t r = {e + PREC, n - PREC - 4, NP};
    rfix(&r);
    kvq__st32(e + n - 4, kvq_crc32c(0, e, n - 4));
}

/* prefix_get of IDS_A; the outcome must be: every page loaded and equal to
 * the publisher's (may_full), a miss at page j (the pages before it loaded
 * exactly; may_miss), or KVQ_ERR_CORRUPT with the cache unchanged
 * (may_fail). */
static int prefix_check(kvq_store *s, const kvq_cache *ref, int pages, int j, int may_full,
                        int may_miss, int may_fail, const char *what, const char *empty_stats) {
    kvq_cache *c = make_empty(0);
    if (!c)
        return 0;
    size_t got = 99999;
    kvq_status rc = kvq_cache_prefix_get(c, s, IDS_A, PTOK + 1, &got);
    int ok;
    if (rc == KVQ_OK) {
        int full = got == (size_t)pages * NP, miss = got == (size_t)j * NP;
        ok = (full && may_full) || (miss && may_miss);
        n_miss += miss && !full;
        n_restored += full;
        /* the loaded tokens are exactly the publisher's first ones */
        for (size_t l = 0; l < NL && ok; l++) {
            size_t n = 0;
            int32_t pos[256];
            kvq_cache_tokens(c, l, &n);
            kvq_cache_positions(c, l, pos, 256);
            ok = n == got;
            for (size_t i = 0; i < n && ok; i++)
                ok = pos[i] == (int32_t)i;
            static float ka[256 * HD], va[256 * HD], kb[256 * HD], vb[256 * HD];
            if (ok && n) {
                ok = kvq_cache_get_kv(c, l, -1, 0, n, ka, va, n * HD) == KVQ_OK &&
                     kvq_cache_get_kv(ref, l, -1, 0, n, kb, vb, n * HD) == KVQ_OK &&
                     memcmp(ka, kb, n * HD * 4) == 0 && memcmp(va, vb, n * HD * 4) == 0;
            }
        }
    } else {
        char now[256];
        stats_text(c, now, sizeof now);
        ok = may_fail && rc == KVQ_ERR_CORRUPT && got == 0 && strcmp(now, empty_stats) == 0;
        n_corrupt++;
    }
    if (!ok) {
        n_bad++;
        if (n_bad <= 10)
            fprintf(stderr, "prefix, %s: %s, %zu tokens loaded (%s)\n", what, kvq_strerror(rc), got,
                    kvq_cache_last_error(c));
    }
    kvq_cache_free(c);
    return ok;
}

static void test_prefix_reproductions(kvq_store *s, prefix_t *pa, const kvq_cache *ref,
                                      const char *empty_stats) {
    /* defect 3: page 1's entry with its positions shifted by 1000 (the
     * record re-checksummed): loaded as 0..7, 1008..1015 before */
    uint8_t *e = malloc(pa->n[1][0]);
    memcpy(e, pa->val[1][0], pa->n[1][0]);
    for (uint32_t i = 0; i < NP; i++)
        kvq__st32(e + PREC + 64 + 4 * i, kvq__ld32(e + PREC + 64 + 4 * i) + 1000);
    entry_fix(e, pa->n[1][0]);
    CHECK_OK(kvq_store_put(s, pa->key[1][0], e, pa->n[1][0]));
    TU_REPORT(prefix_check(s, ref, pa->pages, 1, 0, 0, 1, "shifted positions", empty_stats),
              "a prefix entry with shifted positions was not refused");
    /* defect 1: a pending slot in an entry (a crash on the next append before) */
    memcpy(e, pa->val[1][0], pa->n[1][0]);
    e[PREC + 64 + 4 * NP] = 2;
    entry_fix(e, pa->n[1][0]);
    CHECK_OK(kvq_store_put(s, pa->key[1][0], e, pa->n[1][0]));
    TU_REPORT(prefix_check(s, ref, pa->pages, 1, 0, 0, 1, "pending slot", empty_stats),
              "a prefix entry with a pending slot was not refused");
    CHECK_OK(kvq_store_put(s, pa->key[1][0], pa->val[1][0], pa->n[1][0]));
    free(e);
}

/* ---- 2. the randomized sweep ---- */

/* One snapshot edit; returns 1 when it was drawn (some need a suitable
 * record). */
static int sweep_snapshot(snap_t *s, kvq_store *st, tu_rng *g) {
    int k = (int)(tu_next(g) % (uint64_t)s->n_rec);
    rec_t r = {malloc(s->rec_n[k]), s->rec_n[k], kvq__ld32(s->rec[k] + R_PT)};
    memcpy(r.b, s->rec[k], r.n);
    int resign = (int)(tu_next(g) & 1), kind = (int)(tu_next(g) % 9), drawn = 1;
    char what[96];
    int slot = rslot(&r, g);
    const char *key_to = NULL;
    char kbuf[64];
    rec_key(s, k, kbuf, sizeof kbuf);
    key_to = kbuf;
    switch (kind) {
    case 0: { /* a slot state that is not free/encoded/pending, or the flag */
        static const uint8_t bad[] = {3, 4, 0x7f, 0x80, 0x81, 0x82, 0xff};
        if (slot < 0) {
            drawn = 0;
            break;
        }
        *rstate(&r, (uint32_t)slot) = bad[tu_next(g) % sizeof bad];
        rfix(&r);
        snprintf(what, sizeof what, "state byte %#x", *rstate(&r, (uint32_t)slot));
        break;
    }
    case 1: { /* a pending slot: on a page without staging, or the oldest encoded slot */
        int oldest = -1;
        for (uint32_t i = 0; i < r.P; i++)
            if (rpos(&r, i) >= 0 && *rstate(&r, i) == 1 && (oldest < 0 || rpos(&r, i) < rpos(&r, (uint32_t)oldest)))
                oldest = (int)i;
        /* the page must hold an encoded token older than some other
         * encoded one of the layer: true of every page but the newest
         * staged ones, so take pages without staging only */
        if (oldest < 0 || rstaged(&r)) {
            drawn = 0;
            break;
        }
        *rstate(&r, (uint32_t)oldest) = 2;
        rfix(&r);
        snprintf(what, sizeof what, "pending slot on an unstaged page");
        break;
    }
    case 2: { /* a position twice: another occupied slot's position of this layer */
        int j = (int)(tu_next(g) % (uint64_t)s->n_rec);
        if (slot < 0 || s->layer[j] != s->layer[k]) {
            drawn = 0;
            break;
        }
        rec_t o = {s->rec[j], s->rec_n[j], r.P};
        int os = rslot(&o, g);
        if (os < 0 || (j == k && os == slot)) {
            drawn = 0;
            break;
        }
        rset_pos(&r, (uint32_t)slot, rpos(&o, (uint32_t)os));
        rfix(&r);
        snprintf(what, sizeof what, "position %d twice", rpos(&o, (uint32_t)os));
        break;
    }
    case 3: /* a position past the layer's last */
        if (slot < 0) {
            drawn = 0;
            break;
        }
        rset_pos(&r, (uint32_t)slot, s->last[s->layer[k]] + 1 + (int32_t)(tu_next(g) % 100000));
        rfix(&r);
        snprintf(what, sizeof what, "a position past the last");
        break;
    case 4: /* another layer's index */
        kvq__st32(r.b + R_LAYER, (s->layer[k] + 1 + (uint32_t)(tu_next(g) % 3)) % 4);
        rfix(&r);
        snprintf(what, sizeof what, "layer field %u", kvq__ld32(r.b + R_LAYER));
        break;
    case 5: /* the same page of another save */
        if (!s->orec[k]) {
            drawn = 0;
            break;
        }
        free(r.b);
        r.n = s->orec_n[k];
        r.b = malloc(r.n);
        memcpy(r.b, s->orec[k], r.n);
        snprintf(what, sizeof what, "a record of another save");
        break;
    case 6: { /* this record also under another page's key of its layer */
        int j = (int)(tu_next(g) % (uint64_t)s->n_rec);
        if (j == k || s->layer[j] != s->layer[k]) {
            drawn = 0;
            break;
        }
        rec_key(s, j, kbuf, sizeof kbuf);
        snprintf(what, sizeof what, "page %u's record under page %u", s->page[k], s->page[j]);
        break;
    }
    case 7: /* slot order on a channel page: two occupied slots swapped */
        if (!s->orig || s->ci != 2 || slot < 0) {
            drawn = 0;
            break;
        }
        {
            int o2 = rslot(&r, g);
            if (o2 == slot) {
                drawn = 0;
                break;
            }
            int32_t a = rpos(&r, (uint32_t)slot);
            rset_pos(&r, (uint32_t)slot, rpos(&r, (uint32_t)o2));
            rset_pos(&r, (uint32_t)o2, a);
            rfix(&r);
            snprintf(what, sizeof what, "channel page slots swapped");
        }
        break;
    default: /* any byte of the record flipped (the CRC recomputed): only
              * the manifest's digest stands against it */
        if (resign) {
            drawn = 0;
            break;
        }
        r.b[tu_next(g) % (r.n - 4)] ^= (uint8_t)(1 + tu_next(g) % 255);
        kvq__st32(r.b + r.n - 4, kvq_crc32c(0, r.b, r.n - 4));
        snprintf(what, sizeof what, "a byte flipped");
        break;
    }
    if (drawn) {
        CHECK_OK(kvq_store_put(st, key_to, r.b, r.n));
        if (resign)
            snap_resign(s, st);
        char w2[128];
        snprintf(w2, sizeof w2, "%s%s", what, resign ? " (manifest re-signed)" : "");
        load_check(s, st, 0, 1, w2);
        snap_restore(s, st);
    }
    free(r.b);
    return drawn;
}

/* One edit of the manifest's page list (the CRC recomputed): a page
 * dropped, or its index changed. */
static int sweep_manifest(snap_t *s, kvq_store *st, tu_rng *g) {
    uint8_t *m = malloc(s->man_n);
    memcpy(m, s->man, s->man_n);
    long want = (long)(tu_next(g) % (uint64_t)s->n_rec), i = 0;
    size_t off = 0; /* the entry's offset: walk to it */
    uint64_t at = KVQ_FORGE_HDR + kvq__ld32(m + 8) + kvq__ld32(m + 12);
    for (uint32_t l = 0; l < NL && !off; l++) {
        uint32_t saved = kvq__ld32(m + at + 20), hc = kvq__ld32(m + at + 24);
        at += KVQ_FORGE_LAYER + (hc ? 4 * HD : 0);
        for (uint32_t k = 0; k < saved; k++, at += KVQ_FORGE_ENTRY, i++)
            if (i == want && !off)
                off = (size_t)at;
    }
    uint32_t p = kvq__ld32(m + off);
    kvq__st32(m + off, p + 1 + (uint32_t)(tu_next(g) % 7));
    kvq__st32(m + s->man_n - 4, kvq_crc32c(0, m, s->man_n - 4));
    char key[64];
    snprintf(key, sizeof key, "%s/manifest", s->name);
    CHECK_OK(kvq_store_put(st, key, m, s->man_n));
    free(m);
    load_check(s, st, 0, 1, "a page index in the manifest changed");
    snap_restore(s, st);
    return 1;
}

/* One prefix edit of A's entry (page j, layer l), checksums recomputed. */
static void sweep_prefix(kvq_store *s, prefix_t *pa, prefix_t *pb, const kvq_cache *ref, tu_rng *g,
                         const char *empty_stats) {
    int j = (int)(tu_next(g) % (uint64_t)pa->pages), l = (int)(tu_next(g) % NL);
    size_t n = pa->n[j][l];
    uint8_t *e = malloc(n + 64);
    memcpy(e, pa->val[j][l], n);
    int kind = (int)(tu_next(g) % 6);
    char what[96];
    int may_miss = 0, may_fail = 1;
    uint32_t sl = (uint32_t)(tu_next(g) % NP);
    switch (kind) {
    case 0: /* a state byte */
        e[PREC + 64 + 4 * NP + sl] = (uint8_t)(tu_next(g) % 2 ? 2 : 0x81);
        entry_fix(e, n);
        snprintf(what, sizeof what, "state of slot %u", sl);
        break;
    case 1: { /* a position moved (within or past the prompt) */
        int32_t d = 1 + (int32_t)(tu_next(g) % 50);
        kvq__st32(e + PREC + 64 + 4 * sl, kvq__ld32(e + PREC + 64 + 4 * sl) + (uint32_t)d);
        entry_fix(e, n);
        snprintf(what, sizeof what, "position of slot %u + %d", sl, d);
        break;
    }
    case 2: /* another layer's record index: a miss (not this layer's page) */
        kvq__st32(e + PREC + R_LAYER, (uint32_t)(l + 1) % NL);
        entry_fix(e, n);
        may_miss = 1;
        snprintf(what, sizeof what, "layer field");
        break;
    case 3: /* the entry's page index: a miss */
        kvq__st32(e + 8, (uint32_t)(j + 1 + (int)(tu_next(g) % 3)));
        kvq__st32(e + n - 4, kvq_crc32c(0, e, n - 4));
        may_miss = 1, may_fail = 0;
        snprintf(what, sizeof what, "page index");
        break;
    case 4: /* another prompt's entry for this page and layer: a miss */
        if (!pb->val[j][l] || pb->n[j][l] != n || memcmp(pb->val[j][l] + 48, e + 48, 4 * NP) == 0) {
            free(e);
            return;
        }
        memcpy(e, pb->val[j][l], n);
        may_miss = 1, may_fail = 0;
        snprintf(what, sizeof what, "another prompt's entry");
        break;
    default: /* page j's entry under page j+1's key, made to claim page j+1
              * (its ids and parent digest): the positions give it away */
        if (j + 1 >= pa->pages) {
            free(e);
            return;
        }
        {
            const uint8_t *nx = pa->val[j + 1][l];
            kvq__st32(e + 8, (uint32_t)j + 1);
            memcpy(e + 16, nx + 16, 32);          /* parent digest */
            memcpy(e + 48, nx + 48, 4 * NP);      /* ids */
            memcpy(e + PREC + R_PHASH, nx + PREC + R_PHASH, 8);
            entry_fix(e, n);
            CHECK_OK(kvq_store_put(s, pa->key[j + 1][l], e, n));
            snprintf(what, sizeof what, "page %d's entry claiming page %d", j, j + 1);
            prefix_check(s, ref, pa->pages, j + 1, 0, 0, 1, what, empty_stats);
            CHECK_OK(kvq_store_put(s, pa->key[j + 1][l], pa->val[j + 1][l], n));
            free(e);
            return;
        }
    }
    CHECK_OK(kvq_store_put(s, pa->key[j][l], e, n));
    prefix_check(s, ref, pa->pages, j, 0, may_miss, may_fail, what, empty_stats);
    CHECK_OK(kvq_store_put(s, pa->key[j][l], pa->val[j][l], n));
    free(e);
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[600];
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    long iters = 12000;
    uint64_t seed = 20261207;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0)
            iters = atol(argv[i + 1]);
        if (strcmp(argv[i], "--seed") == 0)
            seed = strtoull(argv[i + 1], NULL, 10);
    }
    printf("seed %llu, %ld iterations\n", (unsigned long long)seed, iters);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char dir[256], url[300];
    snprintf(dir, sizeof dir, "%s/kvq_edits_%ld", base, (long)getpid());
    snprintf(url, sizeof url, "file:%s", dir);
    kvq_store *st = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&st, url, NULL, err, sizeof err));
    if (!st)
        return tu_finish();

    test_reproductions(st);

    for (int i = 0; i <= PTOK; i++) {
        IDS_A[i] = (i * 37 + 11) % 500;
        IDS_B[i] = IDS_A[i];
    }
    IDS_B[3] = 499; /* B: another prompt from page 0 on */
    prefix_t pa, pb;
    kvq_cache *ref = NULL;
    prefix_setup(&pa, st, IDS_A, 300, &ref);
    prefix_setup(&pb, st, IDS_B, 400, NULL);
    char empty_stats[256] = "";
    kvq_cache *e0 = make_empty(0);
    if (e0)
        stats_text(e0, empty_stats, sizeof empty_stats);
    kvq_cache_free(e0);
    CHECK(pa.pages >= 3);
    /* the genuine entries load whole */
    CHECK(prefix_check(st, ref, pa.pages, 0, 1, 0, 0, "genuine", empty_stats));
    test_prefix_reproductions(st, &pa, ref, empty_stats);

    snap_t snaps[NCFG];
    for (int ci = 0; ci < NCFG; ci++) {
        snap_setup(&snaps[ci], st, ci);
        CHECK(snaps[ci].n_rec >= 4);
        /* the genuine snapshot restores exactly */
        if (snaps[ci].man)
            CHECK(load_check(&snaps[ci], st, 1, 0, "genuine"));
    }
    long before_bad = n_bad;
    n_restored = n_corrupt = n_miss = 0;
    tu_rng g;
    tu_seed(&g, seed);
    long done = 0, snap_it = 0, man_it = 0, pfx_it = 0;
    while (done < iters) {
        int what = (int)(tu_next(&g) % 10);
        if (what < 6) {
            snap_t *s = &snaps[tu_next(&g) % NCFG];
            if (!s->man || !s->n_rec)
                break;
            if (sweep_snapshot(s, st, &g))
                done++, snap_it++;
        } else if (what < 7) {
            snap_t *s = &snaps[tu_next(&g) % NCFG];
            if (!s->man || !s->n_rec)
                break;
            done += sweep_manifest(s, st, &g), man_it++;
        } else if (pa.pages >= 2) {
            sweep_prefix(st, &pa, &pb, ref, &g, empty_stats);
            done++, pfx_it++;
        }
    }
    printf("sweep: %ld edits (%ld page records, %ld manifests, %ld prefix entries): %ld refused "
           "(KVQ_ERR_CORRUPT, cache unchanged), %ld prefix misses, %ld restored exactly, %ld broke a "
           "rule\n",
           done, snap_it, man_it, pfx_it, n_corrupt, n_miss, n_restored, n_bad - before_bad);
    TU_REPORT(done >= iters, "only %ld edits drawn", done);
    TU_REPORT(n_bad == before_bad, "%ld edits broke a rule", n_bad - before_bad);
    for (int ci = 0; ci < NCFG; ci++)
        snap_free(&snaps[ci]);
    prefix_free(&pa);
    prefix_free(&pb);
    kvq_cache_free(ref);
    kvq_store_close(st);
    rm_dir(dir);
    return tu_finish();
}
