/*
 * cache_tier.c - residency tiers of the cache pages: hot (the primary
 * arena, the cache's codecs), warm (a second arena with its own allocator,
 * optionally re-encoded with a cheaper codec) and cold (page records in a
 * kvq_store, dropped from memory). Pages move by policy after every append
 * and attend (lowest utility or oldest first; sinks, the protected recent
 * window and not-yet-encoded tokens stay hot) and come back when attention
 * needs them. Every move is timed and also priced by the transfer model
 * (launch latency + bytes / bandwidth). A page that cannot move stays where
 * it is and is counted. Slot metadata (positions, states, scores) stays in
 * memory for every tier.
 *
 * Reading a cold page back has three outcomes: the record (checked: its
 * checksum, cache id, layer, shape, codec layout, the positions still in
 * memory, and with verify_tiers the block's CRC32C) comes back; the store
 * fails in a way that may pass (I/O, connection, memory), and the call fails
 * with the page still cold (a dropped connection is retried once first: the
 * store reconnects); or the record is lost (missing, corrupt, not this
 * page's), and the page's tokens are dropped as evictions and counted in
 * lost_pages / lost_tokens (strict_tiers: the call fails with
 * KVQ_ERR_CORRUPT and the page stays). A page demoted again reuses its
 * record only while the store's epoch (store_impl.h) is the one at which
 * the record was last written or read, so a store that lost records (Redis
 * restarted, a segment removed) never costs a page that was still in
 * memory.
 */
#include "cache_impl.h"
#include "../tier/record.h"
#include "../tier/store_impl.h"

#include <stdio.h>
#include <time.h>

static double kvq__now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void kvq__model_transfer(kvq_cache *c, int link, size_t bytes) {
    double gbps = c->cfg.link_gbps[link] > 0 ? c->cfg.link_gbps[link] : 32.0;
    c->ts.modeled_transfer_ms += c->cfg.link_latency_ms[link] + (double)bytes / (gbps * 1e6);
}

void *kvq__lalloc_tier(kvq_cache *c, kvq__layer *ly, size_t size, int warm) {
    if (!warm)
        return kvq__lalloc(c, ly, size, 0);
    void *p = kvq__calloc(&c->warm_alloc, size);
    if (p)
        kvq__layer_count(ly, size, 0);
    return p;
}

void kvq__lfree_tier(kvq_cache *c, kvq__layer *ly, void *p, size_t size, int warm) {
    if (!warm) {
        kvq__lfree(c, ly, p, size, 0);
        return;
    }
    if (!p)
        return;
    kvq__free(&c->warm_alloc, p);
    ly->payload_bytes -= size;
}

static size_t kvq__layer_index(const kvq_cache *c, const kvq__layer *ly) {
    return (size_t)(ly - c->layers);
}

static void kvq__cold_key(const kvq_cache *c, const kvq__layer *ly, size_t p, uint64_t gen, char *key,
                          size_t n) {
    snprintf(key, n, "kvq/%016llx%016llx/l%zu/p%zu/g%llu", (unsigned long long)c->cache_id,
             (unsigned long long)c->cache_id_hi, kvq__layer_index(c, ly), p,
             (unsigned long long)gen);
}

/* Deletes the store record of page p, if it has one (every cold page has). */
static void kvq__drop_record(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if (!pg->has_record)
        return;
    char key[96];
    kvq__cold_key(c, ly, p, pg->cold_gen, key, sizeof key);
    if (c->cold)
        (void)kvq_store_del(c->cold, key); /* a leftover record is harmless */
    if (ly->tier_bytes_cold >= pg->record_bytes)
        ly->tier_bytes_cold -= pg->record_bytes;
    pg->has_record = 0;
    pg->record_bytes = 0;
}

/* Frees the storage of a warm or cold page (hot pages: cache.c). */
void kvq__tier_page_free(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if (pg->tier == KVQ__TIER_WARM) {
        kvq__lfree_tier(c, ly, pg->block, ly->wblock_bytes, 1);
        ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
        ly->tier_pages[KVQ__TIER_WARM]--;
    } else if (pg->tier == KVQ__TIER_COLD) {
        ly->tier_pages[KVQ__TIER_COLD]--;
    }
    kvq__drop_record(c, ly, p);
    pg->block = NULL;
}

/* Re-encodes (or copies) the K and V areas of every head from layout `from`
 * to layout `to` for the encoded slots of page p. */
static void kvq__reencode_block(kvq_cache *c, kvq__layer *ly, size_t p, const kvq__head *from,
                                const uint8_t *src, const kvq__head *to, uint8_t *dst) {
    const size_t P = c->P;
    for (size_t h = 0; h < c->H; h++) {
        const kvq__head *a = &from[h], *b = &to[h];
        if (a->kchan_bits || a->kc == b->kc)
            memcpy(dst + b->k_off, src + a->k_off, a->k_hdr + a->kbytes * P);
        else
            ly->reencodes += kvq__reencode_slots(ly, p, P, KVQ__ROLE_K, a->kc, a->ktiled,
                                                 src + a->k_off, b->kc, b->ktiled, dst + b->k_off,
                                                 0, NULL, NULL);
        if (a->vc == b->vc)
            memcpy(dst + b->v_off, src + a->v_off, a->vbytes * P);
        else
            ly->reencodes += kvq__reencode_slots(ly, p, P, KVQ__ROLE_V, a->vc, a->vtiled,
                                                 src + a->v_off, b->vc, b->vtiled, dst + b->v_off,
                                                 0, NULL, NULL);
    }
}

/* Moves page p between the hot and warm arenas; pre (may be NULL) is its
 * new block, allocated ahead from the target arena and not counted yet:
 * the move then cannot fail. */
static kvq_status kvq__move_hw(kvq_cache *c, kvq__layer *ly, size_t p, int to_warm,
                               uint8_t *pre) {
    kvq__page *pg = &ly->pages[p];
    double t0 = kvq__now_ms();
    size_t nb = to_warm ? ly->wblock_bytes : ly->block_bytes;
    size_t ob = to_warm ? ly->block_bytes : ly->wblock_bytes;
    uint8_t *blk = pre;
    if (blk)
        kvq__layer_count(ly, nb, 0);
    else
        blk = (uint8_t *)kvq__lalloc_tier(c, ly, nb, to_warm);
    if (!blk)
        return KVQ_ERR_NOMEM;
    if (c->cfg.verify_tiers && !to_warm && kvq__crc32c(0, pg->block, ob) != pg->crc)
        c->ts.verify_mismatches++;
    kvq__reencode_block(c, ly, p, to_warm ? ly->heads : ly->wheads, pg->block,
                        to_warm ? ly->wheads : ly->heads, blk);
    ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
    kvq__lfree_tier(c, ly, pg->block, ob, !to_warm);
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    pg->block = blk;
    ly->tier_pages[pg->tier]--;
    pg->tier = to_warm ? KVQ__TIER_WARM : KVQ__TIER_HOT;
    ly->tier_pages[pg->tier]++;
    if (pg->has_record && c->warm_distinct)
        kvq__drop_record(c, ly, p); /* the block changed codec: its record is stale */
    if (to_warm) {
        kvq__purge_free(c, ly, p); /* new tokens only go to hot pages */
        if (c->cfg.verify_tiers)
            pg->crc = kvq__crc32c(0, blk, nb);
        c->ts.demotions++;
        c->ts.bytes_hot_to_warm += ob;
    } else {
        c->ts.promotions++;
        c->ts.bytes_warm_to_hot += ob;
        kvq__push_page_free(c, ly, p); /* its free slots can take new tokens again */
    }
    kvq__model_transfer(c, 0, ob);
    c->ts.measured_transfer_ms += kvq__now_ms() - t0;
    return KVQ_OK;
}

size_t kvq__heads_layout(const kvq_cache *c, const kvq__head *hs, char *buf, size_t n) {
    size_t at = 0;
    for (size_t h = 0; h < c->H && at < n; h++) {
        char ks[64];
        if (hs[h].kchan_bits)
            snprintf(ks, sizeof ks, "chan:int%d", hs[h].kchan_bits);
        else
            snprintf(ks, sizeof ks, "%s", kvq_codec_spec(hs[h].kc));
        int w = snprintf(buf + at, n - at, "%sk=%s,v=%s", h ? ";" : "", ks, kvq_codec_spec(hs[h].vc));
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return at < n ? at : n - 1;
}

/* Writes page p (hot or warm) to the cold store and drops it from memory. */
static kvq_status kvq__to_cold(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    int warm = pg->tier == KVQ__TIER_WARM;
    const kvq__head *hs = warm ? ly->wheads : ly->heads;
    size_t bb = warm ? ly->wblock_bytes : ly->block_bytes, P = c->P;
    double t0 = kvq__now_ms();
    if (pg->has_record && pg->cold_warm == warm && !c->cfg.cold_ttl_ms &&
        pg->record_epoch == kvq__store_epoch(c->cold)) {
        /* blocks never change once encoded and the store cannot have lost
         * the record since it was read at promotion: only the memory goes */
        if (!warm)
            kvq__purge_free(c, ly, p);
        ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
        kvq__lfree_tier(c, ly, pg->block, bb, warm);
        pg->block = NULL;
        ly->tier_pages[pg->tier]--;
        pg->tier = KVQ__TIER_COLD;
        ly->tier_pages[KVQ__TIER_COLD]++;
        c->ts.demotions++;
        c->ts.measured_transfer_ms += kvq__now_ms() - t0;
        return KVQ_OK;
    }
    if (pg->has_record)
        kvq__drop_record(c, ly, p);
    char layout[2048];
    kvq__record r;
    memset(&r, 0, sizeof r);
    r.cache_id = c->cache_id;
    r.layer = (uint32_t)kvq__layer_index(c, ly);
    r.page_tokens = (uint32_t)P;
    r.n_kv_heads = (uint32_t)c->H;
    r.head_dim = (uint32_t)c->d;
    r.pos_min = INT32_MAX;
    r.pos_max = INT32_MIN;
    for (size_t i = 0; i < P; i++) {
        int32_t q = ly->pos[p * P + i];
        if (q < 0)
            continue;
        r.n_tokens++;
        r.pos_min = q < r.pos_min ? q : r.pos_min;
        r.pos_max = q > r.pos_max ? q : r.pos_max;
    }
    if (!r.n_tokens)
        r.pos_min = r.pos_max = -1;
    r.layout = layout;
    r.layout_len = kvq__heads_layout(c, hs, layout, sizeof layout);
    r.positions = ly->pos + p * P;
    uint8_t states[4096];
    for (size_t i = 0; i < P; i++)
        states[i] = KVQ__STATE(ly->state[p * P + i]);
    r.states = states;
    r.block = pg->block;
    r.block_len = bb;
    size_t sz = kvq__record_size(&r), wr = 0;
    uint8_t *buf = (uint8_t *)kvq__alloc(&c->alloc, sz);
    if (!buf)
        return KVQ_ERR_NOMEM;
    kvq_status st = kvq__record_encode(&r, buf, sz, &wr);
    char key[96];
    uint64_t gen = ++c->gen;
    kvq__cold_key(c, ly, p, gen, key, sizeof key);
    uint64_t epoch = 0;
    if (st == KVQ_OK) {
        st = kvq__store_put_ttl(c->cold, key, buf, wr, c->cfg.cold_ttl_ms, &epoch);
        if (st == KVQ_ERR_CONN) /* the connection dropped: the store reconnects once */
            st = kvq__store_put_ttl(c->cold, key, buf, wr, c->cfg.cold_ttl_ms, &epoch);
    }
    kvq__free(&c->alloc, buf);
    if (st != KVQ_OK) {
        c->ts.demotion_failures++;
        return st;
    }
    if (c->cfg.verify_tiers)
        pg->crc = kvq__crc32c(0, pg->block, bb);
    if (!warm)
        kvq__purge_free(c, ly, p);
    ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
    kvq__lfree_tier(c, ly, pg->block, bb, warm);
    pg->block = NULL;
    ly->tier_pages[pg->tier]--;
    pg->tier = KVQ__TIER_COLD;
    pg->cold_warm = (uint8_t)warm;
    pg->cold_gen = gen;
    pg->has_record = 1;
    pg->record_bytes = wr;
    pg->record_epoch = epoch;
    ly->tier_pages[KVQ__TIER_COLD]++;
    ly->tier_bytes_cold += wr;
    c->ts.demotions++;
    c->ts.bytes_to_cold += wr;
    kvq__model_transfer(c, warm ? 1 : 0, wr);
    if (!warm)
        kvq__model_transfer(c, 1, wr);
    c->ts.measured_transfer_ms += kvq__now_ms() - t0;
    return KVQ_OK;
}

/* 1 for a store or record status that means the record is gone for good
 * (missing, corrupt, unreadable version, not this page's); 0 for failures
 * that may pass. */
static int kvq__is_loss(kvq_status st) {
    return st == KVQ_ERR_RANGE || st == KVQ_ERR_CORRUPT || st == KVQ_ERR_VERSION ||
           st == KVQ_ERR_MISMATCH;
}

/* Reads and checks the record of cold page p: on success *data (the store's
 * buffer: kvq_store_free_buf) holds it, r points into it and *epoch is the
 * store's epoch after the read. On failure why (n bytes) says what went
 * wrong; *verify_fail is set when only the verify_tiers CRC32C differed. */
static kvq_status kvq__cold_read(const kvq_cache *c, const kvq__layer *ly, size_t p, void **data,
                                 size_t *size, kvq__record *r, uint64_t *epoch, int *verify_fail,
                                 char *why, size_t n) {
    const kvq__page *pg = &ly->pages[p];
    *data = NULL;
    *verify_fail = 0;
    why[0] = 0;
    if (!c->cold) {
        snprintf(why, n, "no cold store");
        return KVQ_ERR_IO;
    }
    char key[96];
    kvq__cold_key(c, ly, p, pg->cold_gen, key, sizeof key);
    kvq_status st = kvq__store_get_ep(c->cold, key, data, size, epoch);
    if (st == KVQ_ERR_CONN) /* the connection dropped (a restart?): the store reconnects once */
        st = kvq__store_get_ep(c->cold, key, data, size, epoch);
    if (st != KVQ_OK) {
        snprintf(why, n, "cold record %s: %s", key, kvq_store_last_error(c->cold));
        *data = NULL;
        return st;
    }
    int warm = pg->cold_warm;
    const kvq__head *hs = warm ? ly->wheads : ly->heads;
    size_t bb = warm ? ly->wblock_bytes : ly->block_bytes, P = c->P;
    st = kvq__record_decode((const uint8_t *)*data, *size, r);
    char layout[2048];
    size_t ll = kvq__heads_layout(c, hs, layout, sizeof layout);
    if (st != KVQ_OK) {
        snprintf(why, n, "cold record %s is not a valid record (%s)", key, kvq_strerror(st));
    } else if (r->cache_id != c->cache_id || r->layer != kvq__layer_index(c, ly) ||
               r->page_tokens != P || r->n_kv_heads != c->H || r->head_dim != c->d ||
               r->block_len != bb || r->layout_len != ll || memcmp(r->layout, layout, ll) != 0) {
        st = KVQ_ERR_MISMATCH;
        snprintf(why, n, "cold record %s belongs to another cache, layer or layout", key);
    }
    /* tokens evicted while cold are gone from memory; every token still in
     * memory must be in the record at the same slot */
    for (size_t i = 0; i < P && st == KVQ_OK; i++)
        if (ly->pos[p * P + i] >= 0 && ly->pos[p * P + i] != r->positions[i]) {
            st = KVQ_ERR_MISMATCH;
            snprintf(why, n, "cold record %s holds other positions than the page", key);
        }
    if (st == KVQ_OK && c->cfg.verify_tiers && kvq__crc32c(0, r->block, bb) != pg->crc) {
        st = KVQ_ERR_CORRUPT;
        *verify_fail = 1;
        snprintf(why, n, "cold record %s: the block's CRC32C differs from the demoted one", key);
    }
    if (st != KVQ_OK) {
        kvq_store_free_buf(c->cold, *data);
        *data = NULL;
    }
    return st;
}

/* Cold page p's record is lost (st, why): counts it and drops its tokens
 * as evictions, which frees the page; with strict_tiers leaves it as it is
 * (counted once) and returns KVQ_ERR_CORRUPT. */
static kvq_status kvq__page_lost(kvq_cache *c, kvq__layer *ly, size_t p, kvq_status st,
                                 const char *why) {
    kvq__page *pg = &ly->pages[p];
    size_t P = c->P;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (size_t i = 0; i < P; i++) {
        int32_t q = ly->pos[p * P + i];
        if (q >= 0) {
            lo = q < lo ? q : lo;
            hi = q > hi ? q : hi;
        }
    }
    snprintf(c->errbuf, sizeof c->errbuf,
             "layer %zu: cold page %zu (%u tokens, positions %d..%d) is lost%s: %.150s",
             kvq__layer_index(c, ly), p, (unsigned)pg->n_valid, (int)lo, (int)hi,
             c->cfg.strict_tiers ? "" : ", its tokens dropped", why);
    if (c->cfg.strict_tiers) {
        if (!pg->lost)
            c->ts.lost_pages++;
        pg->lost = 1;
        return KVQ_ERR_CORRUPT;
    }
    c->ts.lost_pages++;
    c->ts.lost_tokens += pg->n_valid;
    if (st == KVQ_ERR_RANGE) {
        /* nothing to delete: spare the store a round trip */
        if (ly->tier_bytes_cold >= pg->record_bytes)
            ly->tier_bytes_cold -= pg->record_bytes;
        pg->has_record = 0;
        pg->record_bytes = 0;
    }
    /* the last eviction frees the page (and deletes a corrupt record) */
    for (size_t i = 0; i < P && kvq__page_live(pg); i++)
        if (ly->pos[p * P + i] >= 0)
            kvq__evict_slot(c, ly, (uint32_t)(p * P + i));
    return KVQ_OK;
}

/* A page that attention needs back, read and allocated before any page
 * moves (kvq__tier_before_attend is all or nothing). */
typedef struct {
    size_t p;
    uint8_t *blk;    /* cold: its block, copied from the record into the arena of the
                        layout it left with (not counted yet) */
    size_t size;     /* cold: the record's size */
    uint64_t epoch;  /* cold: the store's epoch after the read */
    uint8_t *hot;    /* warm_promote: the hot block it moves to (not counted yet) */
    double t0;
} kvq__fetch;

static void kvq__fetch_release(kvq_cache *c, const kvq__layer *ly, kvq__fetch *x) {
    if (x->blk && ly->pages[x->p].cold_warm)
        kvq__free(&c->warm_alloc, x->blk);
    else
        kvq__free(&c->alloc, x->blk);
    kvq__free(&c->alloc, x->hot);
    x->blk = x->hot = NULL;
}

/* Reads cold page p's record into x->blk. A lost record is handled here
 * (kvq__page_lost: the page is then gone, or with strict_tiers the call
 * fails); other failures leave the page cold. */
static kvq_status kvq__cold_fetch(kvq_cache *c, kvq__layer *ly, size_t p, kvq__fetch *x) {
    kvq__page *pg = &ly->pages[p];
    x->p = p;
    x->t0 = kvq__now_ms();
    void *data = NULL;
    kvq__record r;
    int vfail = 0;
    char why[200];
    kvq_status st =
        kvq__cold_read(c, ly, p, &data, &x->size, &r, &x->epoch, &vfail, why, sizeof why);
    if (vfail)
        c->ts.verify_mismatches++;
    if (st != KVQ_OK)
        return kvq__is_loss(st) ? kvq__page_lost(c, ly, p, st, why) : st;
    int warm = pg->cold_warm;
    size_t bb = warm ? ly->wblock_bytes : ly->block_bytes;
    x->blk = (uint8_t *)kvq__calloc(warm ? &c->warm_alloc : &c->alloc, bb);
    if (x->blk)
        memcpy(x->blk, r.block, bb);
    kvq_store_free_buf(c->cold, data);
    return x->blk ? KVQ_OK : KVQ_ERR_NOMEM;
}

/* Puts the fetched block of cold page x->p in place. Never fails. */
static void kvq__cold_install(kvq_cache *c, kvq__layer *ly, kvq__fetch *x) {
    kvq__page *pg = &ly->pages[x->p];
    int warm = pg->cold_warm;
    kvq__layer_count(ly, warm ? ly->wblock_bytes : ly->block_bytes, 0);
    pg->block = x->blk; /* the record stays: the block is immutable, a later demotion reuses it */
    x->blk = NULL;
    pg->record_epoch = x->epoch;
    pg->lost = 0;
    ly->tier_pages[KVQ__TIER_COLD]--;
    pg->tier = warm ? KVQ__TIER_WARM : KVQ__TIER_HOT;
    ly->tier_pages[pg->tier]++;
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    c->ts.promotions++;
    c->ts.bytes_from_cold += x->size;
    kvq__model_transfer(c, 1, x->size);
    c->ts.measured_transfer_ms += kvq__now_ms() - x->t0;
    kvq__push_page_free(c, ly, x->p);
}

/* Brings back every page the queries up to qmax see: cold pages from the
 * store, and with warm_promote warm pages to the hot arena. All or
 * nothing: every record is read and every block allocated before a page
 * moves, so a failure moves nothing and counts no read. Lost records found
 * on the way are handled as they are found (their tokens dropped, counted)
 * and stay so. */
kvq_status kvq__tier_before_attend(kvq_cache *c, size_t layer, int32_t qmax) {
    kvq__layer *ly = &c->layers[layer];
    int promote = c->cfg.warm_promote;
    size_t n = 0;
    for (size_t p = 0; p < ly->n_pages; p++) {
        const kvq__page *pg = &ly->pages[p];
        if (kvq__page_live(pg) && pg->n_valid && pg->min_pos <= qmax &&
            (pg->tier == KVQ__TIER_COLD || (pg->tier == KVQ__TIER_WARM && promote)))
            n++;
    }
    kvq__fetch *f = NULL;
    if (n) {
        f = (kvq__fetch *)kvq__calloc(&c->alloc, n * sizeof *f);
        if (!f)
            return KVQ_ERR_NOMEM;
    }
    uint64_t reads[3] = {0, 0, 0}; /* one read of each page by this attention call */
    size_t m = 0;
    kvq_status st = KVQ_OK;
    for (size_t p = 0; p < ly->n_pages && st == KVQ_OK; p++) {
        kvq__page *pg = &ly->pages[p];
        if (!kvq__page_live(pg) || !pg->n_valid || pg->min_pos > qmax)
            continue;
        reads[pg->tier]++;
        if (pg->tier == KVQ__TIER_HOT || (pg->tier == KVQ__TIER_WARM && !promote))
            continue;
        kvq__fetch *x = &f[m];
        x->p = p;
        if (pg->tier == KVQ__TIER_COLD) {
            st = kvq__cold_fetch(c, ly, p, x);
            if (st == KVQ_OK && !kvq__page_live(pg))
                continue; /* lost: its tokens are gone */
        }
        m++;
        if (st == KVQ_OK && promote && (pg->tier == KVQ__TIER_WARM || pg->cold_warm)) {
            x->hot = (uint8_t *)kvq__calloc(&c->alloc, ly->block_bytes);
            if (!x->hot)
                st = KVQ_ERR_NOMEM;
        }
    }
    if (st == KVQ_OK) {
        for (int t = 0; t < 3; t++)
            c->ts.reads[t] += reads[t];
        for (size_t j = 0; j < m; j++) {
            kvq__fetch *x = &f[j];
            if (x->blk)
                kvq__cold_install(c, ly, x);
            if (x->hot) {
                (void)kvq__move_hw(c, ly, x->p, 0, x->hot); /* cannot fail with its block */
                x->hot = NULL;
            }
        }
    }
    for (size_t j = 0; j < m; j++)
        kvq__fetch_release(c, ly, &f[j]);
    kvq__free(&c->alloc, f);
    return st;
}

/* Demotion order: lowest score first (utility: the best token's score;
 * otherwise the page's newest position). */
static float kvq__page_score(const kvq_cache *c, const kvq__layer *ly, size_t p) {
    float best = -INFINITY;
    for (size_t i = 0; i < c->P; i++) {
        size_t s = p * c->P + i;
        if (ly->pos[s] < 0)
            continue;
        float v = ly->score ? ly->score[s] : (float)ly->pos[s];
        best = v > best ? v : best;
    }
    return best;
}

static size_t kvq__tier_tokens(const kvq_cache *c, const kvq__layer *ly, int tier) {
    size_t n = 0;
    (void)c;
    for (size_t p = 0; p < ly->n_pages; p++)
        if (ly->pages[p].tier == tier && (ly->pages[p].block || tier == KVQ__TIER_COLD))
            n += ly->pages[p].n_valid;
    return n;
}

static int kvq__over(const kvq_cache *c, const kvq__layer *ly, int tier) {
    size_t cap_t = tier == KVQ__TIER_HOT ? c->cfg.hot_tokens : c->cfg.warm_tokens;
    size_t cap_b = tier == KVQ__TIER_HOT ? c->cfg.hot_bytes : c->cfg.warm_bytes;
    size_t bb = tier == KVQ__TIER_HOT ? ly->block_bytes : ly->wblock_bytes;
    if (cap_t && kvq__tier_tokens(c, ly, tier) > cap_t)
        return 1;
    return cap_b && ly->tier_pages[tier] * bb > cap_b;
}

kvq_status kvq__tier_enforce(kvq_cache *c, size_t layer) {
    kvq__layer *ly = &c->layers[layer];
    int warm_on = c->cfg.warm_tokens || c->cfg.warm_bytes;
    size_t n;
    kvq__cand *v = kvq__sorted_tokens(c, ly, &n);
    if (!v)
        return KVQ_ERR_NOMEM;
    int32_t recent = n > c->cfg.protect_recent ? v[n - c->cfg.protect_recent].pos : INT32_MIN;
    if (c->cfg.protect_recent == 0)
        recent = INT32_MAX;
    kvq__free(&c->alloc, v);
    kvq__cand *cand = (kvq__cand *)kvq__alloc(&c->alloc, (ly->n_pages + 1) * sizeof *cand);
    if (!cand)
        return KVQ_ERR_NOMEM;
    kvq_status ret = KVQ_OK;
    for (int tier = KVQ__TIER_HOT; tier <= KVQ__TIER_WARM; tier++) {
        if (!kvq__over(c, ly, tier))
            continue;
        size_t nc = 0;
        for (size_t p = 0; p < ly->n_pages; p++) {
            kvq__page *pg = &ly->pages[p];
            if (pg->tier != tier || !pg->block || !pg->n_valid || pg->n_pending || pg->stage ||
                p == ly->open_page)
                continue;
            int prot = 0;
            for (size_t i = 0; i < c->P && !prot; i++) {
                int32_t q = ly->pos[p * c->P + i];
                if (q < 0)
                    continue;
                prot = q >= recent || (ly->n_sinks_seen && q <= ly->sink_until);
            }
            if (prot)
                continue;
            cand[nc].key = kvq__page_score(c, ly, p);
            cand[nc].pos = (int32_t)p;
            cand[nc].slot = (uint32_t)p;
            nc++;
        }
        /* lowest score first, then the lowest page index */
        for (size_t i = 1; i < nc; i++) {
            kvq__cand x = cand[i];
            size_t j = i;
            while (j > 0 && (cand[j - 1].key > x.key || (cand[j - 1].key == x.key && cand[j - 1].pos > x.pos))) {
                cand[j] = cand[j - 1];
                j--;
            }
            cand[j] = x;
        }
        for (size_t i = 0; i < nc && kvq__over(c, ly, tier); i++) {
            size_t p = cand[i].slot;
            kvq_status st;
            if (tier == KVQ__TIER_HOT && warm_on)
                st = kvq__move_hw(c, ly, p, 1, NULL);
            else if (c->cold)
                st = kvq__to_cold(c, ly, p);
            else {
                /* no cold store: the page's tokens are evicted for good */
                for (size_t k = 0; k < c->P; k++)
                    if (ly->pos[p * c->P + k] >= 0)
                        kvq__evict_slot(c, ly, (uint32_t)(p * c->P + k));
                c->ts.dropped_pages++;
                st = KVQ_OK;
            }
            if (st != KVQ_OK) {
                ret = st;
                break; /* the page stays where it is; counted in demotion_failures */
            }
        }
    }
    kvq__free(&c->alloc, cand);
    return ret;
}

kvq_status kvq_cache_tier_stats(const kvq_cache *c, kvq_tier_stats *st) {
    if (!c || !st)
        return KVQ_ERR_INVALID_ARG;
    *st = c->ts;
    for (int t = 0; t < 3; t++)
        st->pages[t] = st->tokens[t] = st->bytes[t] = 0;
    for (size_t l = 0; l < c->L; l++) {
        const kvq__layer *ly = &c->layers[l];
        for (size_t p = 0; p < ly->n_pages; p++) {
            const kvq__page *pg = &ly->pages[p];
            if (!pg->block && pg->tier != KVQ__TIER_COLD)
                continue;
            st->pages[pg->tier]++;
            st->tokens[pg->tier] += pg->n_valid;
            if (pg->tier == KVQ__TIER_HOT)
                st->bytes[0] += ly->block_bytes;
            else if (pg->tier == KVQ__TIER_WARM)
                st->bytes[1] += ly->wblock_bytes;
        }
        st->bytes[2] += ly->tier_bytes_cold;
    }
    return KVQ_OK;
}

kvq_status kvq__tier_peek(const kvq_cache *c, const kvq__layer *ly, size_t p, uint8_t **block) {
    const kvq__page *pg = &ly->pages[p];
    *block = NULL;
    void *data = NULL;
    size_t size = 0;
    kvq__record r;
    uint64_t epoch;
    int vfail;
    char why[200];
    kvq_status st = kvq__cold_read(c, ly, p, &data, &size, &r, &epoch, &vfail, why, sizeof why);
    if (st != KVQ_OK) /* a const caller cannot drop the page: a loss is KVQ_ERR_CORRUPT */
        return kvq__is_loss(st) ? KVQ_ERR_CORRUPT : st;
    size_t bb = pg->cold_warm ? ly->wblock_bytes : ly->block_bytes;
    *block = (uint8_t *)kvq__alloc(&c->alloc, bb);
    if (!*block)
        st = KVQ_ERR_NOMEM;
    else
        memcpy(*block, r.block, bb);
    kvq_store_free_buf(c->cold, data);
    return st;
}
