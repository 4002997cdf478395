/*
 * test_failalloc.c - "when a function returns an error, it has written
 * nothing to its outputs and the handle is unchanged" (kvq.h), proved the
 * way SQLite proves it: every public call that mutates a cache, a codec or
 * a store runs with an allocator that fails at its 1st, 2nd, ... k-th
 * allocation, until k passes the number of allocations the call makes.
 * Each k runs twice: with only the k-th allocation failing, and with every
 * allocation from the k-th on failing (the "persistent" mode).
 *
 * One injector drives every allocator of a scenario (the cache's, the warm
 * arena's and the cold store's), so a failure can land in the store under
 * a tier move as well as in the cache.
 *
 * After a failed call the handle must equal a twin that never saw the call:
 * every scenario rebuilds its cache from scratch, deterministically, before
 * each k, and compares what kvq.h lets anyone observe - token counts,
 * positions, the decoded K/V of every token (get_kv), every field of the
 * per-layer and total stats and of the tier stats (all but the measured
 * transfer time) - and then runs two decode steps (append + attend with
 * token attention, on every layer) and compares their outputs bit for bit
 * and everything again. So a failed call that left hidden state behind
 * (utility scores, the pending ring, a switched codec, a budget) shows up
 * in what the next steps return. The outputs of the call itself must hold
 * the sentinel they had before. Where kvq.h states that a failed call
 * leaves something behind (tier moves already made by an attend), the
 * scenario allows exactly that class of figures to differ.
 *
 * A call that absorbed a failure and succeeded (a tier move that failed
 * and left the page where it was, a ring that could not shrink) is held
 * against a twin that ran the call without failures: same tokens,
 * positions, K/V and outputs; only the classes that kvq.h names may differ.
 *
 * After every attempt the cache is freed and the allocator must hold no
 * byte: no call leaks on any path. The summary prints, per mutator, the
 * number of injection points, the failures (all clean) and the absorbed
 * ones; the closing line the totals of leaks and changed handles (0).
 */
#include "testutil.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- injector */

typedef struct {
    long calls;   /* allocations since inj_arm */
    long fail_at; /* 1-based; 0: never */
    int persist;  /* fail every allocation from fail_at on */
    long failed;  /* allocations refused since inj_arm */
} injector;

static injector g_inj;

/* One allocator (its live bytes and blocks), driven by g_inj. */
typedef struct {
    size_t live;
    long blocks;
} fa_t;

static void *fa_alloc(void *ctx, size_t size) {
    fa_t *f = (fa_t *)ctx;
    g_inj.calls++;
    if (g_inj.fail_at &&
        (g_inj.calls == g_inj.fail_at || (g_inj.persist && g_inj.calls > g_inj.fail_at))) {
        g_inj.failed++;
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, size + 64) != 0)
        return NULL;
    *(size_t *)p = size;
    f->live += size;
    f->blocks++;
    return (char *)p + 64;
}

static void fa_free(void *ctx, void *ptr) {
    fa_t *f = (fa_t *)ctx;
    char *p = (char *)ptr - 64;
    f->live -= *(size_t *)p;
    f->blocks--;
    free(p);
}

static kvq_allocator fa_make(fa_t *f) {
    memset(f, 0, sizeof *f);
    kvq_allocator a = {fa_alloc, fa_free, f};
    return a;
}

static void inj_arm(long k, int persist) {
    g_inj.calls = 0;
    g_inj.fail_at = k;
    g_inj.persist = persist;
    g_inj.failed = 0;
}

static void inj_off(void) { g_inj.fail_at = 0; }

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char p[600];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        rm_tree(p);
    }
    closedir(d);
    rmdir(path);
}

/* ---------------------------------------------------------------- observations */

/* Classes of observed figures. */
enum {
    OC_CONTENT = 1, /* tokens, positions, statuses */
    OC_VALUES = 2,  /* decoded K/V, attention outputs, token attention */
    OC_COUNT = 4,   /* bytes_written, bytes_read, reencodes */
    OC_BYTES = 8,   /* payload/metadata/stored bytes, pages, free slots and their ratios */
    OC_PEAK = 16,   /* peak_stored_bytes */
    OC_TIER = 32    /* the tier stats */
};

typedef struct {
    char name[96];
    int cls;
    size_t off, len;
} orec;

typedef struct {
    orec *r;
    size_t nr, cr;
    unsigned char *b;
    size_t nb, cb;
} obs;

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "test_failalloc: out of memory\n");
        exit(2);
    }
    return q;
}

static void ob_add(obs *o, int cls, const char *name, const void *p, size_t n) {
    if (o->nr == o->cr) {
        o->cr = o->cr ? 2 * o->cr : 256;
        o->r = (orec *)xrealloc(o->r, o->cr * sizeof *o->r);
    }
    if (o->nb + n > o->cb) {
        while (o->nb + n > o->cb)
            o->cb = o->cb ? 2 * o->cb : 65536;
        o->b = (unsigned char *)xrealloc(o->b, o->cb);
    }
    orec *r = &o->r[o->nr++];
    snprintf(r->name, sizeof r->name, "%s", name);
    r->cls = cls;
    r->off = o->nb;
    r->len = n;
    if (n)
        memcpy(o->b + o->nb, p, n);
    o->nb += n;
}

static void ob_u64(obs *o, int cls, const char *pre, const char *name, uint64_t v) {
    char nm[96];
    snprintf(nm, sizeof nm, "%.40s%.40s", pre, name);
    ob_add(o, cls, nm, &v, sizeof v);
}

static void ob_f64(obs *o, int cls, const char *pre, const char *name, double v) {
    char nm[96];
    snprintf(nm, sizeof nm, "%.40s%.40s", pre, name);
    ob_add(o, cls, nm, &v, sizeof v);
}

static void ob_free(obs *o) {
    free(o->r);
    free(o->b);
    memset(o, 0, sizeof *o);
}

/* 1 when a differs from b in a record whose class is not in allow; why
 * names the first such record and both values. */
static int ob_diff(const obs *a, const obs *b, int allow, char *why, size_t n) {
    size_t m = a->nr < b->nr ? a->nr : b->nr;
    for (size_t i = 0; i < m; i++) {
        const orec *x = &a->r[i], *y = &b->r[i];
        if (strcmp(x->name, y->name) != 0) {
            snprintf(why, n, "observation %zu is %s here, %s in the twin", i, x->name, y->name);
            return 1;
        }
        if (x->cls & allow)
            continue;
        if (x->len == y->len && memcmp(a->b + x->off, b->b + y->off, x->len) == 0)
            continue;
        if (x->len == 8 && y->len == 8) {
            uint64_t u, v;
            double du, dv;
            memcpy(&u, a->b + x->off, 8);
            memcpy(&v, b->b + y->off, 8);
            memcpy(&du, &u, 8);
            memcpy(&dv, &v, 8);
            snprintf(why, n, "%s is %llu (%.9g) here, %llu (%.9g) in the twin", x->name,
                     (unsigned long long)u, du, (unsigned long long)v, dv);
        } else if (x->len != y->len) {
            snprintf(why, n, "%s has %zu bytes here, %zu in the twin", x->name, x->len, y->len);
        } else {
            size_t j = 0;
            while (a->b[x->off + j] == b->b[y->off + j])
                j++;
            float fa = 0, fb = 0;
            size_t fi = j / 4;
            if (x->len % 4 == 0) {
                memcpy(&fa, a->b + x->off + 4 * fi, 4);
                memcpy(&fb, b->b + y->off + 4 * fi, 4);
            }
            snprintf(why, n, "%s differs at byte %zu (as float %zu: %.9g here, %.9g in the twin)",
                     x->name, j, fi, (double)fa, (double)fb);
        }
        return 1;
    }
    if (a->nr != b->nr) {
        snprintf(why, n, "%zu observations here, %zu in the twin", a->nr, b->nr);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the caches */

#define NL 2
#define NH 2
#define NQH 4
#define HD 32
#define PT 4
#define MAXTOK 256
#define FBUF (2 * MAXTOK * NH * HD + 64)
#define SENT 0xA5

static char g_dir[256];
static float g_center[NL * NH * HD];

typedef struct env {
    kvq_cache *c;
    kvq_store *s; /* the cold tier and the snapshot / prefix store (a fresh one per run) */
    fa_t fa, wfa, sfa;
    kvq_allocator al, wal, sal;
    kvq_cache_config cfg;
    kvq_codec_override ov[2];
    /* outputs of the call under test, filled with SENT before it */
    float fbuf[FBUF];
    char cbuf[65536];
    int32_t ibuf[MAXTOK];
    size_t written, n_loaded;
    double nmse;
    /* scratch of the helpers */
    float k[MAXTOK * NH * HD], v[MAXTOK * NH * HD], q[MAXTOK * NQH * HD];
    int32_t qpos[MAXTOK];
    float out[MAXTOK * NQH * HD], ta[NH * MAXTOK];
} env;

static uint64_t seed_of(size_t l, size_t pos, int what) {
    return ((uint64_t)l * 1000003u + pos) * 8u + (uint64_t)what + 1;
}

static void gen(float *x, size_t n, uint64_t seed, float sigma) {
    tu_rng r;
    tu_seed(&r, seed);
    tu_fill_gauss(&r, x, n, sigma);
}

/* The next position of a layer: positions are dense from 0 in every
 * scenario, so it is the count of tokens ever appended. */
static size_t next_pos(env *e, size_t l) {
    kvq_stats s;
    if (kvq_cache_stats(e->c, (int)l, &s) != KVQ_OK)
        return 0;
    return (size_t)s.tokens_appended;
}

static kvq_status app(env *e, size_t l, size_t n) {
    size_t p0 = next_pos(e, l), HDn = NH * HD;
    for (size_t t = 0; t < n; t++) {
        gen(e->k + t * HDn, HDn, seed_of(l, p0 + t, 0), 1.0f);
        gen(e->v + t * HDn, HDn, seed_of(l, p0 + t, 1), 1.0f);
    }
    return kvq_cache_append(e->c, l, e->k, e->v, NULL, n);
}

/* Attention of the queries at the last nq positions of layer l. */
static kvq_status att(env *e, size_t l, size_t nq, float *out, float *ta, size_t ta_cap) {
    size_t p1 = next_pos(e, l), QD = NQH * HD;
    for (size_t t = 0; t < nq; t++) {
        e->qpos[t] = (int32_t)(p1 - nq + t);
        gen(e->q + t * QD, QD, seed_of(l, p1 - nq + t, 2), 2.0f);
    }
    return kvq_cache_attend(e->c, l, e->q, e->qpos, nq, out, nq * QD, ta, ta_cap);
}

static void ob_stats(obs *o, const char *pre, const kvq_stats *s) {
    ob_u64(o, OC_CONTENT, pre, "tokens", s->tokens);
    ob_u64(o, OC_CONTENT, pre, "tokens_appended", s->tokens_appended);
    ob_u64(o, OC_CONTENT, pre, "tokens_evicted", s->tokens_evicted);
    ob_u64(o, OC_BYTES, pre, "payload_bytes", s->payload_bytes);
    ob_u64(o, OC_BYTES, pre, "metadata_bytes", s->metadata_bytes);
    ob_u64(o, OC_BYTES, pre, "codec_meta_bytes", s->codec_meta_bytes);
    ob_u64(o, OC_BYTES, pre, "stored_bytes", s->stored_bytes);
    ob_u64(o, OC_PEAK, pre, "peak_stored_bytes", s->peak_stored_bytes);
    ob_u64(o, OC_COUNT, pre, "bytes_written", s->bytes_written);
    ob_u64(o, OC_COUNT, pre, "bytes_read", s->bytes_read);
    ob_u64(o, OC_COUNT, pre, "reencodes", s->reencodes);
    ob_u64(o, OC_BYTES, pre, "pages", s->pages);
    ob_u64(o, OC_BYTES, pre, "free_slots", s->free_slots);
    ob_f64(o, OC_BYTES, pre, "bits_per_value", s->bits_per_value);
    ob_f64(o, OC_BYTES, pre, "total_bits_per_value", s->total_bits_per_value);
    ob_f64(o, OC_BYTES, pre, "fragmentation", s->fragmentation);
    ob_f64(o, OC_BYTES, pre, "asymptotic_bits_per_value", s->asymptotic_bits_per_value);
    ob_u64(o, OC_BYTES, pre, "fixed_bytes", s->fixed_bytes);
}

/* Everything kvq.h lets a caller read back from the cache, under prefix pre. */
static void observe(env *e, obs *o, const char *pre) {
    char nm[64];
    kvq_status st;
    kvq_cache_config g;
    kvq_cache_get_config(e->c, &g);
    for (size_t l = 0; l < g.n_layers; l++) {
        size_t n = 0;
        st = kvq_cache_tokens(e->c, l, &n);
        snprintf(nm, sizeof nm, "%.20sl%zu.", pre, l);
        ob_u64(o, OC_CONTENT, nm, "status_tokens", (uint64_t)st);
        ob_u64(o, OC_CONTENT, nm, "n_tokens", n);
        int32_t pos[MAXTOK];
        st = kvq_cache_positions(e->c, l, pos, MAXTOK);
        ob_u64(o, OC_CONTENT, nm, "status_positions", (uint64_t)st);
        char nm2[64];
        snprintf(nm2, sizeof nm2, "%.40spositions", nm);
        ob_add(o, OC_CONTENT, nm2, pos, st == KVQ_OK ? n * sizeof(int32_t) : 0);
        if (n) {
            size_t cap = n * g.n_kv_heads * g.head_dim;
            st = kvq_cache_get_kv(e->c, l, -1, 0, n, e->k, e->v, cap);
            ob_u64(o, OC_CONTENT, nm, "status_get_kv", (uint64_t)st);
            snprintf(nm2, sizeof nm2, "%.40sk", nm);
            ob_add(o, OC_VALUES, nm2, e->k, st == KVQ_OK ? cap * sizeof(float) : 0);
            snprintf(nm2, sizeof nm2, "%.40sv", nm);
            ob_add(o, OC_VALUES, nm2, e->v, st == KVQ_OK ? cap * sizeof(float) : 0);
        }
        kvq_stats s;
        kvq_cache_stats(e->c, (int)l, &s);
        ob_stats(o, nm, &s);
    }
    kvq_stats s;
    kvq_cache_stats(e->c, -1, &s);
    snprintf(nm, sizeof nm, "%.20stotal.", pre);
    ob_stats(o, nm, &s);
    kvq_tier_stats t;
    kvq_cache_tier_stats(e->c, &t);
    t.measured_transfer_ms = 0; /* a clock, not a state */
    snprintf(nm, sizeof nm, "%.20stier_stats", pre);
    ob_add(o, OC_TIER, nm, &t, sizeof t);
}

/* Like ob_diff, over the records whose names start with prefix. */
static int ob_diff_prefix(const obs *a, const obs *b, const char *prefix, char *why, size_t n) {
    obs x = {0}, y = {0};
    size_t pl = strlen(prefix);
    for (size_t i = 0; i < a->nr; i++)
        if (strncmp(a->r[i].name, prefix, pl) == 0)
            ob_add(&x, a->r[i].cls, a->r[i].name, a->b + a->r[i].off, a->r[i].len);
    for (size_t i = 0; i < b->nr; i++)
        if (strncmp(b->r[i].name, prefix, pl) == 0)
            ob_add(&y, b->r[i].cls, b->r[i].name, b->b + b->r[i].off, b->r[i].len);
    int d = ob_diff(&x, &y, 0, why, n);
    ob_free(&x);
    ob_free(&y);
    return d;
}

/* The state, then two decode steps on every layer (outputs and token
 * attention compared bit for bit), then the state again. */
static void probe(env *e, obs *o) {
    observe(e, o, "before.");
    char nm[64];
    for (int step = 0; step < 2; step++)
        for (size_t l = 0; l < NL; l++) {
            snprintf(nm, sizeof nm, "probe%d.l%zu.", step, l);
            kvq_status st = app(e, l, 1);
            ob_u64(o, OC_CONTENT, nm, "status_append", (uint64_t)st);
            size_t n = 0;
            kvq_cache_tokens(e->c, l, &n);
            memset(e->ta, 0, sizeof e->ta);
            memset(e->out, 0, sizeof e->out);
            st = att(e, l, 1, e->out, e->ta, NH * n);
            ob_u64(o, OC_CONTENT, nm, "status_attend", (uint64_t)st);
            char nm2[64];
            snprintf(nm2, sizeof nm2, "%.40sout", nm);
            ob_add(o, OC_VALUES, nm2, e->out, NQH * HD * sizeof(float));
            snprintf(nm2, sizeof nm2, "%.40stoken_attn", nm);
            ob_add(o, OC_VALUES, nm2, e->ta, NH * n * sizeof(float));
        }
    observe(e, o, "after.");
}

/* ---------------------------------------------------------------- configurations */

static void cfg_base(env *e) {
    kvq_cache_config *g = &e->cfg;
    kvq_cache_config_init(g);
    g->n_layers = NL, g->n_kv_heads = NH, g->n_q_heads = NQH, g->head_dim = HD;
    g->max_tokens = MAXTOK, g->page_tokens = PT;
    g->k_codec = "int8", g->v_codec = "tq3";
    g->recent_window = 3, g->sinks = 2, g->protect_recent = 4;
    g->allocator = &e->al;
}

static void cfg_plain(env *e) { cfg_base(e); }

/* pages of 16: the f16 staging is tiled for keys, so an attend of several
 * queries over staged tokens takes the tiled copies' scratch (kidx, ktt) */
static void cfg_p16(env *e) {
    cfg_base(e);
    e->cfg.page_tokens = 16;
}

/* utility policy under a budget, a per-head override with its own codec */
static void cfg_util(env *e) {
    cfg_base(e);
    kvq_cache_config *g = &e->cfg;
    g->policy = KVQ_POLICY_UTILITY, g->budget_tokens = 16;
    g->k_codec = "int4:g=16", g->v_codec = "int8";
    e->ov[0] = (kvq_codec_override){1, 1, 1, "tqp3", NULL, 0};
    g->overrides = e->ov, g->n_overrides = 1;
}

/* hot / warm (int4) / cold (file store) tiers, verified, utility order */
static void cfg_tier(env *e) {
    cfg_base(e);
    kvq_cache_config *g = &e->cfg;
    g->policy = KVQ_POLICY_UTILITY, g->budget_tokens = 64;
    g->hot_tokens = 8, g->warm_tokens = 8, g->warm_codec = "int4";
    g->warm_allocator = &e->wal;
    g->cold_store = e->s, g->verify_tiers = 1;
}

/* the same with warm pages promoted when attention needs them */
static void cfg_tier_promote(env *e) {
    cfg_tier(e);
    e->cfg.warm_promote = 1;
    e->cfg.policy = KVQ_POLICY_FIFO;
}

/* KIVI channel-layout keys, window policy */
static void cfg_chan(env *e) {
    cfg_base(e);
    kvq_cache_config *g = &e->cfg;
    g->k_layout = KVQ_LAYOUT_CHANNEL, g->k_codec = "int4", g->v_codec = "int4";
    g->policy = KVQ_POLICY_WINDOW, g->budget_tokens = 20;
}

/* pre-RoPE keys with a given centre, two attention threads */
static void cfg_prerope(env *e) {
    cfg_base(e);
    kvq_cache_config *g = &e->cfg;
    g->k_prerope = 1, g->k_center = 1, g->k_center_values = g_center;
    g->k_codec = "tq3", g->v_codec = "int4:g=8", g->n_threads = 2;
}

/* ---------------------------------------------------------------- builds */

static int g_build_bad;

static void bok(kvq_status st, const char *what) {
    if (st != KVQ_OK && g_build_bad++ < 5)
        TU_REPORT(0, "build step %s: %s", what, kvq_strerror(st));
}

static void build_none(env *e) { (void)e; }

/* a prefill of 14 tokens attended whole, then 3 decode steps, every layer */
static void build_std(env *e) {
    for (size_t l = 0; l < NL; l++) {
        bok(app(e, l, 14), "append");
        bok(att(e, l, 14, e->out, NULL, 0), "attend");
    }
    for (int s = 0; s < 3; s++)
        for (size_t l = 0; l < NL; l++) {
            bok(app(e, l, 1), "append");
            bok(att(e, l, 1, e->out, NULL, 0), "attend");
        }
}

/* longer (tier scenarios: pages in every tier) */
static void build_long(env *e) {
    for (size_t l = 0; l < NL; l++) {
        bok(app(e, l, 30), "append");
        bok(att(e, l, 30, e->out, NULL, 0), "attend");
    }
    for (int s = 0; s < 4; s++)
        for (size_t l = 0; l < NL; l++) {
            bok(app(e, l, 1), "append");
            bok(att(e, l, 1, e->out, NULL, 0), "attend");
        }
}

/* build_std, then a chunk appended to layer 0 that no attend has reached:
 * its tokens are staged, and the next append owes their encoding */
static void build_staged(env *e) {
    build_std(e);
    bok(app(e, 0, 6), "append");
}

/* ---------------------------------------------------------------- the calls */

static void ids_of(int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)(1000 + 7 * i);
}

static size_t n_tokens(env *e, size_t l) {
    size_t n = 0;
    kvq_cache_tokens(e->c, l, &n);
    return n;
}

static kvq_status op_create(env *e) { return kvq_cache_create(&e->c, &e->cfg); }
static kvq_status op_append1(env *e) { return app(e, 0, 1); }
static kvq_status op_append_chunk(env *e) { return app(e, 1, 23); }
static kvq_status op_append_chunk0(env *e) { return app(e, 0, 23); }
static kvq_status op_attend(env *e) { return att(e, 0, 3, e->fbuf, NULL, 0); }
/* the chunk build_staged left staged, attended by its 6 queries (a prefill) */
static kvq_status op_attend_chunk(env *e) { return att(e, 0, 6, e->fbuf, NULL, 0); }
static kvq_status op_attend_ta(env *e) {
    size_t n = n_tokens(e, 1);
    return att(e, 1, 2, e->fbuf, e->fbuf + 2 * NQH * HD, NH * n);
}
static kvq_status op_prec_all(env *e) {
    return kvq_cache_set_precision(e->c, -1, -1, 1, "int4", &e->nmse);
}
static kvq_status op_prec_one(env *e) {
    return kvq_cache_set_precision(e->c, 1, 0, 0, "tqp4", &e->nmse);
}
static kvq_status op_prec_f16(env *e) {
    return kvq_cache_set_precision(e->c, -1, 1, 1, "f16", &e->nmse);
}
static kvq_status op_budget(env *e) { return kvq_cache_set_budget(e->c, 9); }
static kvq_status op_get_kv(env *e) {
    size_t n = n_tokens(e, 0);
    return kvq_cache_get_kv(e->c, 0, -1, 0, n, e->fbuf, e->fbuf + FBUF / 2, n * NH * HD);
}
static kvq_status op_get_kv_head(env *e) {
    size_t n = n_tokens(e, 1);
    return kvq_cache_get_kv(e->c, 1, 1, 1, n - 1, e->fbuf, NULL, n * HD);
}
static kvq_status op_positions(env *e) { return kvq_cache_positions(e->c, 0, e->ibuf, MAXTOK); }
static kvq_status op_save(env *e) { return kvq_cache_save(e->c, e->s, "fa-save", INT32_MAX); }
static kvq_status op_load(env *e) { return kvq_cache_load(e->c, e->s, "fa-snap"); }
static kvq_status op_prefix_put(env *e) {
    int32_t ids[MAXTOK];
    size_t n = next_pos(e, 0);
    ids_of(ids, n);
    return kvq_cache_prefix_put(e->c, e->s, ids, n);
}
static kvq_status op_prefix_get(env *e) {
    int32_t ids[MAXTOK];
    ids_of(ids, 21);
    return kvq_cache_prefix_get(e->c, e->s, ids, 21, &e->n_loaded);
}
static kvq_status op_stats_json(env *e) {
    return kvq_cache_stats_json(e->c, e->cbuf, sizeof e->cbuf, &e->written);
}

/* Every record under "fa-save/" (sorted keys, their values) into o. */
typedef struct {
    char keys[256][64];
    size_t n;
} keyset;

static int collect_key(void *ctx, const char *key, size_t size) {
    keyset *ks = (keyset *)ctx;
    (void)size;
    if (ks->n < 256)
        snprintf(ks->keys[ks->n++], sizeof ks->keys[0], "%s", key);
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}

static void save_records(kvq_store *s, obs *o) {
    keyset *ks = (keyset *)calloc(1, sizeof *ks);
    kvq_store_list(s, "fa-save/", collect_key, ks);
    qsort(ks->keys, ks->n, sizeof ks->keys[0], cmp_key);
    for (size_t i = 0; i < ks->n; i++) {
        void *d = NULL;
        size_t n = 0;
        kvq_status st = kvq_store_get(s, ks->keys[i], &d, &n);
        ob_add(o, OC_CONTENT, ks->keys[i], d, st == KVQ_OK ? n : 0);
        if (st == KVQ_OK)
            kvq_store_free_buf(s, d);
    }
    free(ks);
}

static obs g_old_save; /* the records of the older snapshot, when there is one */

/* after a failed save: no manifest (the save leaves none when cut short),
 * or the older snapshot whole (the save failed before it touched it) */
static void after_save(env *e) {
    void *d = NULL;
    size_t n = 0;
    kvq_status st = kvq_store_get(e->s, "fa-save/manifest", &d, &n);
    if (st == KVQ_OK)
        kvq_store_free_buf(e->s, d);
    if (st == KVQ_ERR_RANGE)
        return;
    obs now = {0};
    save_records(e->s, &now);
    char why[400];
    int bad = !g_old_save.nr || ob_diff(&now, &g_old_save, 0, why, sizeof why);
    TU_REPORT(!bad, "a failed save left a manifest (%s) over other records: %s",
              kvq_strerror(st), g_old_save.nr ? why : "there was no snapshot before");
    ob_free(&now);
}

/* an older snapshot under the name op_save writes: a save that fails must
 * not leave its manifest over a mix of its pages and the new ones */
static void prep_save_old(env *dst) {
    env *e = (env *)calloc(1, sizeof *e);
    e->al = fa_make(&e->fa);
    e->s = dst->s;
    cfg_plain(e);
    CHECK_OK(kvq_cache_create(&e->c, &e->cfg));
    for (size_t l = 0; l < NL; l++)
        CHECK_OK(app(e, l, 40));
    CHECK_OK(kvq_cache_save(e->c, e->s, "fa-save", INT32_MAX));
    ob_free(&g_old_save);
    save_records(e->s, &g_old_save);
    kvq_cache_free(e->c);
    free(e);
}

/* the snapshot that op_load reads: a tiered cache with pages in every tier */
static void prep_load(env *dst) {
    env *e = (env *)calloc(1, sizeof *e);
    e->al = fa_make(&e->fa);
    e->wal = fa_make(&e->wfa);
    e->s = dst->s;
    cfg_tier(e);
    CHECK_OK(kvq_cache_create(&e->c, &e->cfg));
    build_long(e);
    kvq_tier_stats t;
    kvq_cache_tier_stats(e->c, &t);
    TU_REPORT(t.pages[1] > 0 && t.pages[2] > 0,
              "the snapshot's source has %llu warm, %llu cold pages",
              (unsigned long long)t.pages[1], (unsigned long long)t.pages[2]);
    CHECK_OK(kvq_cache_save(e->c, e->s, "fa-snap", INT32_MAX));
    kvq_cache_free(e->c);
    free(e);
}

/* the prefix entries that op_prefix_get finds: 21 tokens, 5 full pages */
static void prep_prefix(env *dst) {
    env *e = (env *)calloc(1, sizeof *e);
    e->al = fa_make(&e->fa);
    e->s = dst->s;
    cfg_plain(e);
    e->cfg.recent_window = 0;
    CHECK_OK(kvq_cache_create(&e->c, &e->cfg));
    for (size_t l = 0; l < NL; l++) {
        CHECK_OK(app(e, l, 21));
        CHECK_OK(att(e, l, 21, e->out, NULL, 0));
    }
    int32_t ids[MAXTOK];
    ids_of(ids, 21);
    CHECK_OK(kvq_cache_prefix_put(e->c, e->s, ids, 21));
    kvq_cache_free(e->c);
    free(e);
}

static void cfg_prefix(env *e) {
    cfg_base(e);
    e->cfg.recent_window = 0;
}

/* ---------------------------------------------------------------- the sweep */

typedef struct scen {
    const char *name;
    void (*cfg)(env *);
    void (*build)(env *);
    kvq_status (*op)(env *);
    void (*prep)(env *);        /* fills the fresh store before the cache is built, or NULL */
    void (*after_fail)(env *);  /* extra checks after a failed call, or NULL */
    int allow_fail;             /* classes a failed call may change (kvq.h says which) */
    int allow_absorb;           /* classes a call that absorbed a failure may change */
    int create;                 /* op creates the cache */
    int like_success;           /* a failed call leaves the cache as the call that succeeds
                                   (kvq.h: it settles first what the next append would) */
} scen;

static long g_points, g_failures, g_absorbed, g_changed, g_leaks;

static void env_open(env *e, const scen *sc) {
    memset(e, 0, offsetof(env, fbuf));
    e->al = fa_make(&e->fa);
    e->wal = fa_make(&e->wfa);
    e->sal = fa_make(&e->sfa);
    char path[300], url[320];
    snprintf(path, sizeof path, "%s/store", g_dir);
    rm_tree(path);
    snprintf(url, sizeof url, "file:%s", path);
    bok(kvq_store_open(&e->s, url, &e->sal, NULL, 0), "store_open");
    if (sc->prep)
        sc->prep(e);
    sc->cfg(e);
    if (!sc->create) {
        bok(kvq_cache_create(&e->c, &e->cfg), "create");
        sc->build(e);
    }
}

/* Frees the cache; returns 1 when its allocators still hold anything. */
static int env_close(env *e) {
    kvq_cache_free(e->c);
    e->c = NULL;
    kvq_store_close(e->s);
    e->s = NULL;
    return e->fa.live || e->fa.blocks || e->wfa.live || e->wfa.blocks || e->sfa.live ||
           e->sfa.blocks;
}

static void sentinel(env *e) {
    memset(e->fbuf, SENT, sizeof e->fbuf);
    memset(e->cbuf, SENT, sizeof e->cbuf);
    memset(e->ibuf, SENT, sizeof e->ibuf);
    e->written = 12345;
    e->n_loaded = 777;
    e->nmse = 1234.5;
}

static int untouched(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != SENT)
            return 0;
    return 1;
}

/* The outputs of the call still hold the sentinel (kvq_cache_prefix_get
 * sets *n_loaded to 0 on error, as kvq.h says). */
static int sentinel_kept(const env *e) {
    return untouched((const unsigned char *)e->fbuf, sizeof e->fbuf) &&
           untouched((const unsigned char *)e->cbuf, sizeof e->cbuf) &&
           untouched((const unsigned char *)e->ibuf, sizeof e->ibuf) && e->written == 12345 &&
           (e->n_loaded == 777 || e->n_loaded == 0) && e->nmse == 1234.5;
}

static void run_scen(const scen *sc) {
    env *e = (env *)calloc(1, sizeof *e);
    obs ref0 = {0}, ref1 = {0};
    g_build_bad = 0;
    /* the twin that never sees the call, and the one that sees it succeed */
    if (!sc->create) {
        env_open(e, sc);
        probe(e, &ref0);
        g_leaks += env_close(e);
    }
    env_open(e, sc);
    sentinel(e);
    inj_arm(0, 0);
    kvq_status st = sc->op(e);
    long points = g_inj.calls;
    TU_REPORT(st == KVQ_OK, "%s: the call without failures: %s", sc->name, kvq_strerror(st));
    if (st == KVQ_OK)
        probe(e, &ref1);
    g_leaks += env_close(e);

    long fails = 0, absorbed = 0, changed = 0, leaks = 0, reported = 0;
    for (int persist = 0; persist < 2; persist++) {
        for (long k = 1;; k++) {
            env_open(e, sc);
            sentinel(e);
            inj_arm(k, persist);
            st = sc->op(e);
            long failed = g_inj.failed;
            inj_off();
            char why[400];
            why[0] = 0;
            int bad = 0;
            if (!failed) {
                /* k is past the last allocation: the sweep is complete */
                TU_REPORT(st == KVQ_OK && k == points + 1,
                          "%s: no failure at allocation %ld of %ld: %s", sc->name, k, points,
                          kvq_strerror(st));
                leaks += env_close(e);
                break;
            }
            if (st != KVQ_OK) {
                fails++;
                if (st != KVQ_ERR_NOMEM)
                    bad = snprintf(why, sizeof why, "returned %s, not KVQ_ERR_NOMEM",
                                   kvq_strerror(st)) > 0;
                else if (!sentinel_kept(e))
                    bad = snprintf(why, sizeof why, "the call wrote to its outputs") > 0;
                else if (sc->create && e->c)
                    bad = snprintf(why, sizeof why, "*out is not NULL") > 0;
                if (sc->after_fail)
                    sc->after_fail(e);
                if (!bad && !sc->create) {
                    obs o = {0};
                    probe(e, &o);
                    bad = ob_diff(&o, sc->like_success ? &ref1 : &ref0, sc->allow_fail, why,
                                  sizeof why);
                    ob_free(&o);
                }
            } else {
                absorbed++;
                obs o = {0};
                probe(e, &o);
                bad = ob_diff(&o, &ref1, sc->allow_absorb, why, sizeof why);
                ob_free(&o);
            }
            changed += bad;
            if (bad && reported++ < 4)
                TU_REPORT(0, "%s: allocation %ld%s failed, the call %s: %s", sc->name, k,
                          persist ? " and on" : "", st == KVQ_OK ? "absorbed it" : "failed", why);
            int leak = env_close(e);
            leaks += leak;
            if (leak && reported++ < 4)
                TU_REPORT(0, "%s: allocation %ld%s failed: memory leaked", sc->name, k,
                          persist ? " and on" : "");
            if (k > points + 1) {
                TU_REPORT(0, "%s: allocation %ld still fails, the clean call made %ld", sc->name,
                          k, points);
                break;
            }
        }
    }
    CHECK_EQ(changed, 0);
    CHECK_EQ(leaks, 0);
    printf("  %-34s %4ld injection points: %4ld failed clean, %3ld absorbed, %ld changed, %ld "
           "leaked\n",
           sc->name, points, fails, absorbed, changed, leaks);
    g_points += points;
    g_failures += fails;
    g_absorbed += absorbed;
    g_changed += changed;
    g_leaks += leaks;
    ob_free(&ref0);
    ob_free(&ref1);
    free(e);
}

/* ---------------------------------------------------------------- codecs */

/* What a codec shows: needs_fit, its state blob, and the codes of 8 vectors. */
static void codec_obs(kvq_codec *c, obs *o) {
    size_t n = 0;
    ob_u64(o, OC_CONTENT, "", "needs_fit", (uint64_t)kvq_codec_needs_fit(c));
    kvq_status st = kvq_codec_save_state(c, NULL, 0, &n);
    ob_u64(o, OC_CONTENT, "", "state_status", (uint64_t)st);
    unsigned char *blob = (unsigned char *)malloc(n + 1);
    st = st == KVQ_OK ? kvq_codec_save_state(c, blob, n, &n) : st;
    ob_add(o, OC_CONTENT, "state", blob, st == KVQ_OK ? n : 0);
    free(blob);
    float x[8 * HD];
    gen(x, 8 * HD, 99, 1.0f);
    unsigned char codes[8 * 4 * HD + 64];
    st = kvq_codec_encode(c, codes, sizeof codes, x, 8);
    ob_u64(o, OC_CONTENT, "", "encode_status", (uint64_t)st);
    ob_add(o, OC_CONTENT, "codes", codes, st == KVQ_OK ? 8 * kvq_codec_vector_bytes(c) : 0);
}

static void codec_create_sweep(const char *spec) {
    long points = 0, fails = 0, leaks = 0;
    for (long k = 1;; k++) {
        fa_t f;
        kvq_allocator a = fa_make(&f);
        kvq_codec_params p = {0};
        p.allocator = &a;
        kvq_codec *c = (kvq_codec *)&f; /* not NULL: a failure must set it */
        inj_arm(k, 0);
        kvq_status st = kvq_codec_create(&c, spec, HD, &p);
        long failed = g_inj.failed;
        inj_off();
        if (!failed) {
            CHECK_OK(st);
            points = k - 1;
            kvq_codec_free(c);
            leaks += f.live != 0;
            break;
        }
        fails++;
        TU_REPORT(st == KVQ_ERR_NOMEM && c == NULL, "codec_create %s: allocation %ld: %s", spec,
                  k, kvq_strerror(st));
        if (st == KVQ_OK)
            kvq_codec_free(c);
        leaks += f.live != 0 || f.blocks != 0;
    }
    CHECK_EQ(leaks, 0);
    char nm[64];
    snprintf(nm, sizeof nm, "kvq_codec_create %s", spec);
    printf("  %-34s %4ld injection points: %4ld failed clean, %3d absorbed, 0 changed, %ld "
           "leaked\n",
           nm, points, fails, 0, leaks);
    g_points += points;
    g_failures += fails;
    g_leaks += leaks;
}

/* kind 0: fit; 1: load_state; 2: load_file. The codec is fitted on set A
 * first (unless unfitted), then the call brings set B's tables. */
static void codec_mut_sweep(const char *spec, int kind, int prefit) {
    const size_t NS = 300;
    float *a = (float *)malloc(NS * HD * sizeof(float));
    float *b = (float *)malloc(NS * HD * sizeof(float));
    gen(a, NS * HD, 11, 1.0f);
    gen(b, NS * HD, 12, 3.0f);
    /* set B's state, as a blob and as a file */
    kvq_codec *src = NULL;
    CHECK_OK(kvq_codec_create(&src, spec, HD, NULL));
    CHECK_OK(kvq_codec_fit(src, b, NS));
    size_t bn = 0;
    kvq_codec_save_state(src, NULL, 0, &bn);
    unsigned char *blob = (unsigned char *)malloc(bn);
    CHECK_OK(kvq_codec_save_state(src, blob, bn, &bn));
    char path[300];
    snprintf(path, sizeof path, "%s/state.kvqc", g_dir);
    CHECK_OK(kvq_codec_save_file(src, path));
    kvq_codec_free(src);
    long points = -1, fails = 0, changed = 0, leaks = 0;
    for (long k = 0;; k++) {
        fa_t f;
        kvq_allocator al = fa_make(&f);
        kvq_codec_params p = {0};
        p.allocator = &al;
        kvq_codec *c = NULL;
        CHECK_OK(kvq_codec_create(&c, spec, HD, &p));
        if (prefit)
            CHECK_OK(kvq_codec_fit(c, a, NS));
        obs before = {0}, after = {0};
        codec_obs(c, &before);
        inj_arm(k, 0);
        kvq_status st = kind == 0   ? kvq_codec_fit(c, b, NS)
                        : kind == 1 ? kvq_codec_load_state(c, blob, bn)
                                    : kvq_codec_load_file(c, path);
        long failed = g_inj.failed, calls = g_inj.calls;
        inj_off();
        codec_obs(c, &after);
        char why[400];
        if (k == 0) {
            CHECK_OK(st);
            points = calls;
        } else if (!failed) {
            CHECK_OK(st);
            CHECK_EQ(k, points + 1);
        } else {
            fails++;
            int bad = st != KVQ_ERR_NOMEM;
            if (bad)
                snprintf(why, sizeof why, "returned %s", kvq_strerror(st));
            else
                bad = ob_diff(&after, &before, 0, why, sizeof why);
            changed += bad;
            if (bad)
                TU_REPORT(0, "codec %s %s: allocation %ld failed: %s", spec,
                          kind == 0 ? "fit" : kind == 1 ? "load_state" : "load_file", k, why);
        }
        ob_free(&before);
        ob_free(&after);
        kvq_codec_free(c);
        leaks += f.live != 0 || f.blocks != 0;
        if (k && !failed)
            break;
        if (k > points + 1)
            break;
    }
    CHECK_EQ(changed, 0);
    CHECK_EQ(leaks, 0);
    char nm[80];
    snprintf(nm, sizeof nm, "kvq_codec_%s %s%s",
             kind == 0 ? "fit" : kind == 1 ? "load_state" : "load_file", spec,
             prefit ? " (refit)" : "");
    printf("  %-34s %4ld injection points: %4ld failed clean, %3d absorbed, %ld changed, %ld "
           "leaked\n",
           nm, points, fails, 0, changed, leaks);
    g_points += points;
    g_failures += fails;
    g_changed += changed;
    g_leaks += leaks;
    free(a);
    free(b);
    free(blob);
}

/* ---------------------------------------------------------------- model */

/* kvq_model_forward appends and attends layer by layer; kvq.h states what
 * a failure leaves: the layers before the failing one hold the tokens
 * (exactly as after a forward that succeeded), the others are as before. */
static void model_sweep(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/stories260K/stories260K.bin", tu_data_dir());
    fa_t mfa;
    kvq_allocator mal = fa_make(&mfa);
    kvq_model *m = NULL;
    kvq_status st = kvq_model_load(&m, path, &mal);
    if (st != KVQ_OK) {
        printf("  kvq_model_forward: SKIP (%s: %s)\n", path, kvq_strerror(st));
        return;
    }
    kvq_model_info info;
    kvq_model_get_info(m, &info);
    const size_t N0 = 9, N1 = 6;
    int32_t toks[16];
    for (size_t i = 0; i < 16; i++)
        toks[i] = (int32_t)((i * 37 + 11) % info.vocab_size);
    size_t lcap = N1 * info.vocab_size;
    float *logits = (float *)malloc(lcap * sizeof(float));
    env *e = (env *)calloc(1, sizeof *e);
    obs ref0 = {0}, ref1 = {0};
    long points = -1, fails = 0, changed = 0, leaks = 0, reported = 0;
    for (long k = -1;; k++) {
        memset(e, 0, offsetof(env, fbuf));
        e->al = fa_make(&e->fa);
        cfg_base(e);
        kvq_model_cache_shape(m, &e->cfg);
        e->cfg.policy = KVQ_POLICY_UTILITY, e->cfg.budget_tokens = 12;
        bok(kvq_cache_create(&e->c, &e->cfg), "create");
        bok(kvq_model_forward(m, e->c, toks, N0, 0, NULL, 0, 1), "forward");
        memset(logits, SENT, lcap * sizeof(float));
        if (k < 0) { /* the twin before the call */
            observe(e, &ref0, "");
            leaks += env_close(e);
            continue;
        }
        inj_arm(k, 0);
        st = kvq_model_forward(m, e->c, toks + N0, N1, (int32_t)N0, logits, lcap, 0);
        long failed = g_inj.failed, calls = g_inj.calls;
        inj_off();
        char why[400];
        why[0] = 0;
        int bad = 0;
        if (k == 0) {
            CHECK_OK(st);
            points = calls;
            observe(e, &ref1, "");
        } else if (!failed) {
            CHECK_OK(st);
            CHECK_EQ(k, points + 1);
        } else {
            fails++;
            obs o = {0};
            observe(e, &o, "");
            if (st != KVQ_ERR_NOMEM)
                bad = snprintf(why, sizeof why, "returned %s", kvq_strerror(st)) > 0;
            else if (!untouched((const unsigned char *)logits, lcap * sizeof(float)))
                bad = snprintf(why, sizeof why, "the call wrote logits") > 0;
            /* layers 0..f-1 as after the forward, layer f as before it or
             * holding the tokens appended but not attended, the rest as
             * before it */
            int phase = 0; /* 0: done layers, 1: past the failing layer */
            for (size_t l = 0; l < info.n_layers && !bad; l++) {
                char pre[32], w1[400], w0[400];
                snprintf(pre, sizeof pre, "l%zu.", l);
                int eq1 = !ob_diff_prefix(&o, &ref1, pre, w1, sizeof w1);
                int eq0 = !ob_diff_prefix(&o, &ref0, pre, w0, sizeof w0);
                kvq_stats ls;
                kvq_cache_stats(e->c, (int)l, &ls);
                if (phase == 0 && eq1)
                    continue;
                if (phase == 0 && !eq0 && ls.tokens_appended != N0 + N1)
                    bad = snprintf(why, sizeof why, "failing layer %zu: %s", l, w0) > 0;
                else if (phase == 1 && !eq0)
                    bad = snprintf(why, sizeof why, "layer %zu after the failing one: %s", l,
                                   w0) > 0;
                phase = 1;
            }
            ob_free(&o);
            changed += bad;
            if (bad && reported++ < 4)
                TU_REPORT(0, "kvq_model_forward: allocation %ld failed: %s", k, why);
        }
        leaks += env_close(e);
        if ((k > 0 && !failed) || k > points + 1)
            break;
    }
    CHECK_EQ(changed, 0);
    CHECK_EQ(leaks, 0);
    printf("  %-34s %4ld injection points: %4ld failed as kvq.h says, %ld changed otherwise, %ld "
           "leaked\n",
           "kvq_model_forward (stories260K)", points, fails, changed, leaks);
    g_points += points;
    g_failures += fails;
    g_changed += changed;
    g_leaks += leaks;
    ob_free(&ref0);
    ob_free(&ref1);
    free(e);
    free(logits);
    kvq_model_free(m);
    CHECK(mfa.live == 0);
}

/* ---------------------------------------------------------------- stores */

#define SKEYS 6

/* What a store shows: every key's value (or status), records and live bytes. */
static void store_obs(kvq_store *s, obs *o) {
    char key[32];
    for (int i = 0; i < SKEYS; i++) {
        snprintf(key, sizeof key, "k%d", i);
        void *d = NULL;
        size_t n = 0;
        kvq_status st = kvq_store_get(s, key, &d, &n);
        ob_u64(o, OC_CONTENT, key, ".status", (uint64_t)st);
        ob_add(o, OC_CONTENT, key, d, st == KVQ_OK ? n : 0);
        if (st == KVQ_OK)
            kvq_store_free_buf(s, d);
    }
    kvq_store_metrics m;
    kvq_store_stats(s, &m);
    ob_u64(o, OC_CONTENT, "", "records", m.records);
    ob_u64(o, OC_CONTENT, "", "live_bytes", m.live_bytes);
}

/* op 0: put of a new key; 1: put over an existing key; 2: del; 3: open;
 * 4: a put that rolls to a new segment; 5: a del that compacts. After a
 * failure the store, and the store reopened, must show what they showed
 * before (the file store's promise: a failed put or del leaves it as it
 * was); after a call that absorbed a failure (a compaction that could not
 * run), what the call shows when nothing fails. */
static void store_sweep(int op) {
    static const char *names[] = {"kvq_store_put (new key)", "kvq_store_put (overwrite)",
                                  "kvq_store_del",           "kvq_store_open",
                                  "kvq_store_put (roll)",    "kvq_store_del (compaction)"};
    static const char *opts[] = {"", "", "", "", "?segment_bytes=4096", "?compact_min=1"};
    char dir[300], url[400], url_op[420];
    snprintf(dir, sizeof dir, "%s/st%d", g_dir, op);
    snprintf(url, sizeof url, "file:%s", dir);
    snprintf(url_op, sizeof url_op, "%s%s", url, opts[op]);
    static unsigned char val[5000];
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (unsigned char)(i * 31 + 7);
    long points = -1, fails = 0, absorbed = 0, changed = 0, leaks = 0;
    obs ref_after = {0}, ref_reopened = {0};
    for (long k = 0;; k++) {
        rm_tree(dir);
        kvq_store *s = NULL;
        CHECK_OK(kvq_store_open(&s, url, NULL, NULL, 0));
        for (int i = 0; i < SKEYS - 1; i++) {
            char key[32];
            snprintf(key, sizeof key, "k%d", i);
            CHECK_OK(kvq_store_put(s, key, val + i, 100 + 50 * (size_t)i));
        }
        for (int r = 0; op == 5 && r < 6; r++) /* dead entries for the compaction */
            CHECK_OK(kvq_store_put(s, "k0", val + r, 900));
        obs before = {0}, after = {0}, reopened = {0};
        store_obs(s, &before);
        kvq_store_close(s);
        s = NULL;
        fa_t f;
        kvq_allocator al = fa_make(&f);
        if (op != 3)
            CHECK_OK(kvq_store_open(&s, url_op, &al, NULL, 0));
        inj_arm(k, 0);
        kvq_status st;
        kvq_store *s2 = (kvq_store *)&f;
        if (op == 0)
            st = kvq_store_put(s, "k5", val, 2000);
        else if (op == 1)
            st = kvq_store_put(s, "k2", val + 9, 1500);
        else if (op == 2 || op == 5)
            st = kvq_store_del(s, "k3");
        else if (op == 3)
            st = kvq_store_open(&s2, url, &al, NULL, 0);
        else
            st = kvq_store_put(s, "k5", val, 3900);
        long failed = g_inj.failed, calls = g_inj.calls;
        inj_off();
        kvq_store_metrics met;
        if (op == 3) {
            if (st == KVQ_OK)
                kvq_store_close(s2);
            else
                TU_REPORT(s2 == NULL, "kvq_store_open: *out not NULL after allocation %ld", k);
        } else {
            store_obs(s, &after);
            kvq_store_stats(s, &met);
            kvq_store_close(s);
        }
        leaks += f.live != 0 || f.blocks != 0;
        /* the store as a later process sees it */
        CHECK_OK(kvq_store_open(&s, url, NULL, NULL, 0));
        store_obs(s, &reopened);
        kvq_store_close(s);
        char why[400];
        why[0] = 0;
        int bad = 0;
        if (k == 0) {
            CHECK_OK(st);
            points = calls;
            TU_REPORT(op != 4 || met.segments >= 2, "the put did not roll (%llu segments)",
                      (unsigned long long)met.segments);
            TU_REPORT(op != 5 || met.compactions >= 1, "the del did not compact");
            ob_free(&ref_after);
            ob_free(&ref_reopened);
            ref_after = after;
            ref_reopened = reopened;
            memset(&after, 0, sizeof after);
            memset(&reopened, 0, sizeof reopened);
        } else if (!failed) {
            CHECK_OK(st);
            CHECK_EQ(k, points + 1);
        } else if (st == KVQ_OK) {
            absorbed++;
            bad = op != 3 && ob_diff(&after, &ref_after, 0, why, sizeof why);
            if (!bad && ob_diff(&reopened, &ref_reopened, 0, why, sizeof why))
                bad = 1;
        } else {
            fails++;
            if (st != KVQ_ERR_NOMEM)
                bad = snprintf(why, sizeof why, "returned %s", kvq_strerror(st)) > 0;
            if (!bad && op != 3)
                bad = ob_diff(&after, &before, 0, why, sizeof why);
            if (!bad && ob_diff(&reopened, &before, 0, why, sizeof why))
                bad = 1;
        }
        changed += bad;
        if (bad)
            TU_REPORT(0, "%s: allocation %ld failed (the call %s): %s", names[op], k,
                      st == KVQ_OK ? "absorbed it" : "failed", why);
        ob_free(&before);
        ob_free(&after);
        ob_free(&reopened);
        if (k && !failed)
            break;
        if (k > points + 1)
            break;
    }
    ob_free(&ref_after);
    ob_free(&ref_reopened);
    rm_tree(dir);
    CHECK_EQ(changed, 0);
    CHECK_EQ(leaks, 0);
    printf("  %-34s %4ld injection points: %4ld failed clean, %3ld absorbed, %ld changed, %ld "
           "leaked\n",
           names[op], points, fails, absorbed, changed, leaks);
    g_points += points;
    g_failures += fails;
    g_absorbed += absorbed;
    g_changed += changed;
    g_leaks += leaks;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    tu_init(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kvq_test_failalloc.XXXXXX", base ? base : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    gen(g_center, NL * NH * HD, 5, 0.5f);

    /* What a call that succeeds although an allocation inside it failed
     * may change against the twin that ran it without failures (kvq.h): a
     * buffer it could not shrink holds more bytes; a page that could not
     * move to the warm or cold tier stays where it was, so its K/V keep the
     * hot codec's precision and attention reads other bytes. A failed call
     * may only change the peak, and only in kvq_cache_load and
     * kvq_cache_prefix_get (what the restore held while it ran). */
    const int ABSORB = OC_BYTES | OC_PEAK;
    const int TIERMOVE = OC_TIER | OC_BYTES | OC_PEAK | OC_VALUES | OC_COUNT;
    const scen scens[] = {
        /* name, configuration, build, call, prep, after a failure,
         * allowed after a failure / after an absorbed one, creates, like success */
        {"kvq_cache_create (plain)", cfg_plain, build_none, op_create, NULL, NULL, 0, 0, 1, 0},
        {"kvq_cache_create (utility)", cfg_util, build_none, op_create, NULL, NULL, 0, 0, 1, 0},
        {"kvq_cache_create (tiers)", cfg_tier, build_none, op_create, NULL, NULL, 0, 0, 1, 0},
        {"kvq_cache_create (channel)", cfg_chan, build_none, op_create, NULL, NULL, 0, 0, 1, 0},
        {"kvq_cache_create (prerope, 2 thr)", cfg_prerope,
         build_none, op_create, NULL, NULL, 0, 0, 1, 0},
        {"kvq_cache_append (decode)", cfg_plain, build_std, op_append1, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_append (chunk)", cfg_plain, build_std,
         op_append_chunk, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_append (after staged)", cfg_plain, build_staged,
         op_append_chunk0, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_append (utility)", cfg_util, build_std,
         op_append_chunk, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_append (channel)", cfg_chan, build_std,
         op_append_chunk, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_append (tiers)", cfg_tier, build_long,
         op_append_chunk, NULL, NULL, 0, TIERMOVE, 0, 0},
        {"kvq_cache_attend", cfg_plain, build_std, op_attend, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (staged chunk, P 16)", cfg_p16, build_staged, op_attend_chunk, NULL,
         NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (token_attn)", cfg_plain, build_std,
         op_attend_ta, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (utility)", cfg_util, build_std,
         op_attend_ta, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (channel)", cfg_chan, build_std,
         op_attend_ta, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (prerope, 2 thr)", cfg_prerope,
         build_std, op_attend_ta, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_attend (tiers)", cfg_tier, build_long,
         op_attend_ta, NULL, NULL, 0, TIERMOVE, 0, 0},
        {"kvq_cache_attend (tiers, promote)", cfg_tier_promote,
         build_long, op_attend, NULL, NULL, 0, TIERMOVE, 0, 0},
        {"kvq_cache_set_precision (-1)", cfg_plain, build_std,
         op_prec_all, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_set_precision (-1, staged)", cfg_plain,
         build_staged, op_prec_all, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_set_precision (l1 h0 K)", cfg_util, build_std,
         op_prec_one, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_set_precision (V f16)", cfg_chan, build_std,
         op_prec_f16, NULL, NULL, 0, ABSORB, 0, 0},
        {"kvq_cache_set_budget", cfg_util, build_std, op_budget, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_get_kv (cold pages)", cfg_tier, build_long, op_get_kv, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_get_kv (one head)", cfg_tier, build_long,
         op_get_kv_head, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_positions", cfg_tier, build_long, op_positions, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_save (tiers)", cfg_tier, build_long, op_save, NULL, after_save, 0, 0, 0, 0},
        {"kvq_cache_save (over a snapshot)", cfg_tier, build_long,
         op_save, prep_save_old, after_save, 0, 0, 0, 0},
        {"kvq_cache_load (tiers)", cfg_tier, build_none,
         op_load, prep_load, NULL, OC_PEAK, 0, 0, 0},
        {"kvq_cache_prefix_put", cfg_prefix, build_std, op_prefix_put, NULL, NULL, 0, 0, 0, 0},
        {"kvq_cache_prefix_put (staged)", cfg_plain, build_staged,
         op_prefix_put, NULL, NULL, 0, 0, 0, 1},
        {"kvq_cache_prefix_get", cfg_prefix, build_none,
         op_prefix_get, prep_prefix, NULL, OC_PEAK, 0, 0, 0},
        {"kvq_cache_stats_json (tiers)", cfg_tier, build_long,
         op_stats_json, NULL, NULL, 0, 0, 0, 0},
    };
    printf("cache calls (allocation k fails, then k and every later one):\n");
    for (size_t i = 0; i < sizeof scens / sizeof scens[0]; i++) {
        run_scen(&scens[i]);
        ob_free(&g_old_save);
    }

    printf("codec calls:\n");
    static const char *specs[] = {"int4:g=16", "tq3", "tqp3:norm=8", "nuq3", "f16"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        codec_create_sweep(specs[i]);
    codec_mut_sweep("nuq3", 0, 0);
    codec_mut_sweep("nuq3", 0, 1);
    codec_mut_sweep("tq3:norm=8", 0, 1);
    codec_mut_sweep("nuq3", 1, 1);
    codec_mut_sweep("nuq3", 2, 1);

    printf("model:\n");
    model_sweep();

    printf("store calls (file store):\n");
    for (int op = 0; op < 6; op++)
        store_sweep(op);

    printf("failalloc: %ld injection points, %ld failed calls, %ld absorbed, %ld changed handles, "
           "%ld leaks\n",
           g_points, g_failures, g_absorbed, g_changed, g_leaks);
    rm_tree(g_dir);
    return tu_finish();
}
