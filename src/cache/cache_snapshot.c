/*
 * cache_snapshot.c - saving and restoring caches through a kvq_store: whole-cache
 * (or token-prefix) snapshots, and vLLM-style prefix caching where each full
 * page is keyed by a hash of the token ids up to its end. Pages travel as
 * page records (record.c), so every byte is checksummed; a snapshot's
 * manifest is written last and is itself checksummed, so a save cut short
 * is never mistaken for a complete one. Restores are all or nothing: the
 * target cache must be empty and is left empty when anything fails.
 */
#include "cache_impl.h"
#include "../tier/record.h"

#include <stdio.h>

#define KVQ__MANIFEST_VERSION 1u

static uint64_t kvq__fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Layout text of a page's heads, with a tier prefix and a staging flag. */
static size_t kvq__snap_layout(const kvq_cache *c, const kvq__head *hs, int warm, int stage, char *buf,
                               size_t n) {
    size_t at = (size_t)snprintf(buf, n, "%s%s|", warm ? "warm" : "hot", stage ? "+stage" : "");
    if (at >= n)
        return n - 1;
    return at + kvq__heads_layout(c, hs, buf + at, n - at);
}

/* A configuration hash: shape, page size, key handling and every layout. */
static uint64_t kvq__config_hash(const kvq_cache *c) {
    uint64_t h = 0xcbf29ce484222325ull;
    size_t shape[6] = {c->L, c->H, c->QH, c->d, c->P, (size_t)c->cfg.k_prerope};
    h = kvq__fnv(h, shape, sizeof shape);
    char buf[4096];
    for (size_t l = 0; l < c->L; l++) {
        size_t n = kvq__snap_layout(c, c->layers[l].heads, 0, 0, buf, sizeof buf);
        h = kvq__fnv(h, buf, n);
        if (c->layers[l].center)
            h = kvq__fnv(h, c->layers[l].center, c->H * c->d * sizeof(float));
    }
    return h;
}

/* The block bytes of page p (a copy of a cold page's record block, or the
 * arena block) plus its staging; *warm tells the layout. Caller frees. */
static kvq_status kvq__page_bytes(kvq_cache *c, kvq__layer *ly, size_t p, uint8_t **out, size_t *len,
                                  int *warm, int *stage) {
    kvq__page *pg = &ly->pages[p];
    *warm = pg->tier == KVQ__TIER_WARM || (pg->tier == KVQ__TIER_COLD && pg->cold_warm);
    size_t bb = *warm ? ly->wblock_bytes : ly->block_bytes;
    *stage = pg->stage != NULL;
    size_t sb = *stage ? ly->stage_bytes : 0;
    uint8_t *buf = (uint8_t *)kvq__alloc(&c->alloc, bb + sb);
    if (!buf)
        return KVQ_ERR_NOMEM;
    if (pg->tier == KVQ__TIER_COLD) {
        uint8_t *blk = NULL;
        kvq_status st = kvq__tier_peek(c, ly, p, &blk);
        if (st != KVQ_OK) {
            kvq__free(&c->alloc, buf);
            return st;
        }
        memcpy(buf, blk, bb);
        kvq__free(&c->alloc, blk);
    } else {
        memcpy(buf, pg->block, bb);
    }
    if (sb)
        memcpy(buf + bb, pg->stage, sb);
    *out = buf;
    *len = bb + sb;
    return KVQ_OK;
}

/* Encodes page p as a record (positions >= prefix_end masked out) and puts
 * it under key. */
static kvq_status kvq__put_page(kvq_cache *c, size_t l, size_t p, kvq_store *s, const char *key,
                                int32_t prefix_end, uint64_t prefix_hash, size_t *n_tokens) {
    kvq__layer *ly = &c->layers[l];
    size_t P = c->P;
    uint8_t *blk = NULL;
    size_t blen = 0;
    int warm, stage;
    kvq_status st = kvq__page_bytes(c, ly, p, &blk, &blen, &warm, &stage);
    if (st != KVQ_OK)
        return st;
    int32_t pos[4096];
    uint8_t states[4096];
    kvq__record r;
    memset(&r, 0, sizeof r);
    r.pos_min = INT32_MAX, r.pos_max = INT32_MIN;
    for (size_t i = 0; i < P; i++) {
        int32_t q = ly->pos[p * P + i];
        int keep = q >= 0 && q < prefix_end;
        pos[i] = keep ? q : -1;
        states[i] = keep ? KVQ__STATE(ly->state[p * P + i]) : 0;
        if (keep) {
            r.n_tokens++;
            r.pos_min = q < r.pos_min ? q : r.pos_min;
            r.pos_max = q > r.pos_max ? q : r.pos_max;
        }
    }
    if (!r.n_tokens)
        r.pos_min = r.pos_max = -1;
    char layout[4096];
    r.cache_id = c->cache_id;
    r.layer = (uint32_t)l;
    r.page_tokens = (uint32_t)P;
    r.n_kv_heads = (uint32_t)c->H;
    r.head_dim = (uint32_t)c->d;
    r.prefix_hash = prefix_hash;
    r.layout = layout;
    r.layout_len = kvq__snap_layout(c, warm ? ly->wheads : ly->heads, warm, stage, layout, sizeof layout);
    r.positions = pos;
    r.states = states;
    r.block = blk;
    r.block_len = blen;
    size_t sz = kvq__record_size(&r), wr = 0;
    uint8_t *buf = sz ? (uint8_t *)kvq__alloc(&c->alloc, sz) : NULL;
    if (!buf)
        st = KVQ_ERR_NOMEM;
    else
        st = kvq__record_encode(&r, buf, sz, &wr);
    if (st == KVQ_OK)
        st = kvq_store_put(s, key, buf, wr);
    kvq__free(&c->alloc, buf);
    kvq__free(&c->alloc, blk);
    if (n_tokens)
        *n_tokens = r.n_tokens;
    return st;
}

kvq_status kvq_cache_save(kvq_cache *c, kvq_store *s, const char *name, int32_t prefix_end) {
    if (!c || !s || !name || !*name || strlen(name) > 200)
        return KVQ_ERR_INVALID_ARG;
    /* manifest: "KVQM" ver L H d P cfg_hash, per layer: appended last_pos
     * sink_until n_sinks_seen n_pages has_center [center] then per saved page
     * its index; CRC32C at the end */
    size_t cap = 64;
    for (size_t l = 0; l < c->L; l++)
        cap += 64 + c->H * c->d * 4 + c->layers[l].n_pages * 4;
    uint8_t *m = (uint8_t *)kvq__alloc(&c->alloc, cap);
    if (!m)
        return KVQ_ERR_NOMEM;
    size_t at = 0;
    memcpy(m, "KVQM", 4);
    kvq__st32(m + 4, KVQ__MANIFEST_VERSION);
    kvq__st32(m + 8, (uint32_t)c->L);
    kvq__st32(m + 12, (uint32_t)c->H);
    kvq__st32(m + 16, (uint32_t)c->d);
    kvq__st32(m + 20, (uint32_t)c->P);
    kvq__st64(m + 24, kvq__config_hash(c));
    at = 32;
    kvq_status st = KVQ_OK;
    char key[300];
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        size_t hdr = at;
        at += 28;
        if (ly->center) {
            memcpy(m + at, ly->center, c->H * c->d * 4);
            at += c->H * c->d * 4;
        }
        uint32_t saved = 0;
        int32_t last = -1;
        uint64_t appended = 0;
        for (size_t p = 0; p < ly->n_pages && st == KVQ_OK; p++) {
            if (!kvq__page_live(&ly->pages[p]))
                continue;
            int any = 0;
            for (size_t i = 0; i < c->P; i++) {
                int32_t q = ly->pos[p * c->P + i];
                if (q >= 0 && q < prefix_end) {
                    any = 1;
                    last = q > last ? q : last;
                    appended++;
                }
            }
            if (!any)
                continue;
            snprintf(key, sizeof key, "%s/l%zu/p%zu", name, l, p);
            st = kvq__put_page(c, l, p, s, key, prefix_end, 0, NULL);
            kvq__st32(m + at, (uint32_t)p);
            at += 4;
            saved++;
        }
        if (prefix_end == INT32_MAX) {
            last = ly->appended ? ly->last_pos : -1;
            appended = ly->appended;
        }
        kvq__st64(m + hdr, appended);
        kvq__st32(m + hdr + 8, (uint32_t)last);
        kvq__st32(m + hdr + 12, (uint32_t)ly->sink_until);
        kvq__st32(m + hdr + 16, (uint32_t)KVQ__MIN(ly->n_sinks_seen, appended));
        kvq__st32(m + hdr + 20, saved);
        kvq__st32(m + hdr + 24, ly->center ? 1u : 0u);
    }
    if (st == KVQ_OK) {
        kvq__st32(m + at, kvq__crc32c(0, m, at));
        at += 4;
        snprintf(key, sizeof key, "%s/manifest", name);
        st = kvq_store_put(s, key, m, at);
    }
    kvq__free(&c->alloc, m);
    return st;
}

/* Installs a decoded record as page p of layer l of an empty cache. */
static kvq_status kvq__install_page(kvq_cache *c, size_t l, size_t p, const kvq__record *r) {
    kvq__layer *ly = &c->layers[l];
    size_t P = c->P;
    char want[4096];
    int warm = r->layout_len >= 4 && memcmp(r->layout, "warm", 4) == 0;
    int stage = memchr(r->layout, '+', r->layout_len) != NULL;
    size_t wl = kvq__snap_layout(c, warm ? ly->wheads : ly->heads, warm, stage, want, sizeof want);
    size_t bb = warm ? ly->wblock_bytes : ly->block_bytes, sb = stage ? ly->stage_bytes : 0;
    if (r->layer != l || r->page_tokens != P || r->n_kv_heads != c->H || r->head_dim != c->d ||
        r->layout_len != wl || memcmp(r->layout, want, wl) != 0 || r->block_len != bb + sb)
        return KVQ_ERR_MISMATCH;
    kvq_status st = kvq__grow_pages(c, ly, p + 1);
    if (st != KVQ_OK)
        return st;
    kvq__page *pg = &ly->pages[p];
    if (kvq__page_live(pg))
        return KVQ_ERR_CORRUPT; /* the same page twice */
    uint8_t *blk = (uint8_t *)kvq__lalloc_tier(c, ly, bb, warm);
    uint16_t *stg = sb ? (uint16_t *)kvq__lalloc(c, ly, sb, 0) : NULL;
    if (!blk || (sb && !stg)) {
        kvq__lfree_tier(c, ly, blk, bb, warm);
        kvq__lfree(c, ly, stg, sb, 0);
        return KVQ_ERR_NOMEM;
    }
    memcpy(blk, r->block, bb);
    if (sb)
        memcpy(stg, r->block + bb, sb);
    if (p >= ly->n_pages)
        ly->n_pages = p + 1;
    memset(pg, 0, sizeof *pg);
    pg->block = blk;
    pg->stage = stg;
    pg->tier = warm ? KVQ__TIER_WARM : KVQ__TIER_HOT;
    ly->tier_pages[pg->tier]++;
    ly->pages_alloc++;
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    pg->min_pos = INT32_MAX;
    for (size_t i = 0; i < P; i++) {
        size_t s = p * P + i;
        ly->pos[s] = r->positions[i];
        ly->state[s] = r->positions[i] >= 0 ? r->states[i] : KVQ__FREE;
        if (ly->score)
            ly->score[s] = 1.0f;
        if (r->positions[i] < 0)
            continue;
        pg->n_valid++;
        pg->filled = (uint32_t)(i + 1);
        pg->n_pending += r->states[i] == KVQ__PEND;
        pg->min_pos = r->positions[i] < pg->min_pos ? r->positions[i] : pg->min_pos;
        ly->n_tokens++;
    }
    pg->encoded = stg == NULL; /* what still waits for encoding travels staged */
    return KVQ_OK;
}

/* After pages are installed: free slots, the pending ring and the open page. */
static void kvq__finish_restore(kvq_cache *c, kvq__layer *ly) {
    size_t P = c->P;
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        if (!pg->block)
            continue;
        if (ly->chan_mode) {
            if (!pg->encoded && pg->filled < P)
                ly->open_page = p;
            continue;
        }
        kvq__push_page_free(c, ly, p);
    }
    /* pending tokens, in position order */
    size_t npend = 0;
    for (size_t p = 0; p < ly->n_pages; p++)
        npend += ly->pages[p].block ? ly->pages[p].n_pending : 0;
    if (npend && npend > ly->pend_cap) {
        size_t cap = 2 * npend + c->cfg.recent_window + 2;
        kvq__lfree(c, ly, ly->pend_slot, ly->pend_cap * sizeof(uint32_t), 1);
        kvq__lfree(c, ly, ly->pend_pos, ly->pend_cap * sizeof(int32_t), 1);
        ly->pend_cap = 0;
        ly->pend_slot = kvq__lalloc(c, ly, cap * sizeof(uint32_t), 1);
        ly->pend_pos = kvq__lalloc(c, ly, cap * sizeof(int32_t), 1);
        if (ly->pend_slot && ly->pend_pos) {
            ly->pend_cap = cap;
        } else { /* stays staged, in no ring: only larger */
            kvq__lfree(c, ly, ly->pend_slot, cap * sizeof(uint32_t), 1);
            kvq__lfree(c, ly, ly->pend_pos, cap * sizeof(int32_t), 1);
            ly->pend_slot = NULL;
            ly->pend_pos = NULL;
        }
    }
    if (ly->pend_slot && ly->pend_pos && ly->pend_cap) {
        ly->pend_head = ly->pend_count = 0;
        for (int32_t last = -1;;) {
            size_t best = SIZE_MAX;
            for (size_t s = 0; s < ly->n_pages * P; s++)
                if (ly->pos[s] > last && KVQ__STATE(ly->state[s]) == KVQ__PEND &&
                    (best == SIZE_MAX || ly->pos[s] < ly->pos[best]))
                    best = s;
            if (best == SIZE_MAX || ly->pend_count >= ly->pend_cap)
                break;
            ly->pend_slot[ly->pend_count] = (uint32_t)best;
            ly->pend_pos[ly->pend_count] = ly->pos[best];
            ly->pend_count++;
            last = ly->pos[best];
        }
    }
}

static void kvq__reset_layer(kvq_cache *c, kvq__layer *ly) {
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        if (!pg->block)
            continue;
        int warm = pg->tier == KVQ__TIER_WARM;
        kvq__lfree_tier(c, ly, pg->block, warm ? ly->wblock_bytes : ly->block_bytes, warm);
        kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
        ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
        ly->tier_pages[pg->tier]--;
        memset(pg, 0, sizeof *pg);
    }
    for (size_t s = 0; s < ly->n_pages * c->P; s++) {
        ly->pos[s] = -1;
        ly->state[s] = KVQ__FREE;
    }
    ly->n_pages = 0;
    ly->n_free = 0;
    ly->n_tokens = 0;
    ly->pages_alloc = 0;
    ly->appended = 0;
    ly->open_page = SIZE_MAX;
    ly->pend_count = ly->pend_head = 0;
}

static int kvq__cache_empty(const kvq_cache *c) {
    for (size_t l = 0; l < c->L; l++)
        if (c->layers[l].n_tokens || c->layers[l].appended)
            return 0;
    return 1;
}

kvq_status kvq_cache_load(kvq_cache *c, kvq_store *s, const char *name) {
    if (!c || !s || !name || !*name || strlen(name) > 200)
        return KVQ_ERR_INVALID_ARG;
    if (!kvq__cache_empty(c))
        return KVQ_ERR_MISMATCH;
    char key[300];
    snprintf(key, sizeof key, "%s/manifest", name);
    void *md = NULL;
    size_t ms = 0;
    kvq_status st = kvq_store_get(s, key, &md, &ms);
    if (st != KVQ_OK)
        return st;
    const uint8_t *m = (const uint8_t *)md;
    if (ms < 36 || memcmp(m, "KVQM", 4) != 0 || kvq__ld32(m + ms - 4) != kvq__crc32c(0, m, ms - 4))
        st = KVQ_ERR_CORRUPT;
    else if (kvq__ld32(m + 4) != KVQ__MANIFEST_VERSION)
        st = KVQ_ERR_VERSION;
    else if (kvq__ld32(m + 8) != c->L || kvq__ld32(m + 12) != c->H || kvq__ld32(m + 16) != c->d ||
             kvq__ld32(m + 20) != c->P)
        st = KVQ_ERR_MISMATCH;
    size_t at = 32, end = ms - 4;
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        if (end - at < 28) {
            st = KVQ_ERR_CORRUPT;
            break;
        }
        uint64_t appended = kvq__ld64(m + at);
        int32_t last = (int32_t)kvq__ld32(m + at + 8);
        int32_t sink_until = (int32_t)kvq__ld32(m + at + 12);
        uint32_t sinks_seen = kvq__ld32(m + at + 16), saved = kvq__ld32(m + at + 20);
        uint32_t has_center = kvq__ld32(m + at + 24);
        at += 28;
        if (has_center) {
            if (end - at < c->H * c->d * 4 || !c->cfg.k_center) {
                st = has_center && !c->cfg.k_center ? KVQ_ERR_MISMATCH : KVQ_ERR_CORRUPT;
                break;
            }
            if (!ly->center) {
                ly->center = (float *)kvq__alloc(&c->alloc, c->H * c->d * 4);
                if (!ly->center) {
                    st = KVQ_ERR_NOMEM;
                    break;
                }
            }
            memcpy(ly->center, m + at, c->H * c->d * 4);
            ly->center_ready = 1;
            at += c->H * c->d * 4;
        }
        if (end - at < (size_t)saved * 4) {
            st = KVQ_ERR_CORRUPT;
            break;
        }
        for (uint32_t k = 0; k < saved && st == KVQ_OK; k++) {
            size_t p = kvq__ld32(m + at + 4 * k);
            snprintf(key, sizeof key, "%s/l%zu/p%zu", name, l, p);
            void *rd = NULL;
            size_t rs = 0;
            st = kvq_store_get(s, key, &rd, &rs);
            if (st != KVQ_OK)
                break;
            kvq__record r;
            /* records are decoded from a 4-byte aligned copy */
            st = kvq__record_decode(rd, rs, &r);
            if (st == KVQ_OK)
                st = kvq__install_page(c, l, p, &r);
            kvq_store_free_buf(s, rd);
        }
        at += (size_t)saved * 4;
        if (st == KVQ_OK) {
            ly->appended = appended;
            ly->last_pos = last;
            ly->sink_until = sink_until;
            ly->n_sinks_seen = sinks_seen;
            kvq__finish_restore(c, ly);
        }
    }
    kvq_store_free_buf(s, md);
    if (st != KVQ_OK)
        for (size_t l = 0; l < c->L; l++)
            kvq__reset_layer(c, &c->layers[l]);
    return st;
}

/* ---- prefix caching ---- */
static int kvq__prefix_ok(const kvq_cache *c) {
    if (c->cfg.k_center && !c->cfg.k_center_values)
        return 0;
    for (size_t l = 0; l < c->L; l++)
        if (c->layers[l].chan_mode)
            return 0;
    return 1;
}

/* Is page j of layer l exactly positions jP..jP+P-1, encoded, in memory? */
static int kvq__clean_page(const kvq_cache *c, const kvq__layer *ly, size_t j) {
    if (j >= ly->n_pages || !kvq__page_live(&ly->pages[j]) || ly->pages[j].n_pending)
        return 0;
    for (size_t i = 0; i < c->P; i++)
        if (ly->pos[j * c->P + i] != (int32_t)(j * c->P + i) ||
            KVQ__STATE(ly->state[j * c->P + i]) != KVQ__ENC)
            return 0;
    return 1;
}

static void kvq__prefix_key(uint64_t cfg, uint64_t h, size_t l, char *key, size_t n) {
    snprintf(key, n, "kvqp/%016llx/%016llx/l%zu", (unsigned long long)cfg, (unsigned long long)h, l);
}

kvq_status kvq_cache_prefix_put(kvq_cache *c, kvq_store *s, const int32_t *ids, size_t n) {
    if (!c || !s || (!ids && n))
        return KVQ_ERR_INVALID_ARG;
    if (!kvq__prefix_ok(c))
        return KVQ_ERR_UNSUPPORTED;
    for (size_t l = 0; l < c->L; l++) /* what the next call would encode is owed now */
        kvq__settle(c, &c->layers[l], 0);
    uint64_t cfg = kvq__config_hash(c), h = 0xcbf29ce484222325ull;
    char key[128];
    for (size_t j = 0; (j + 1) * c->P <= n; j++) {
        h = kvq__fnv(h, ids + j * c->P, c->P * sizeof(int32_t));
        for (size_t l = 0; l < c->L; l++) {
            if (!kvq__clean_page(c, &c->layers[l], j))
                return KVQ_OK; /* the run of clean pages ends here */
        }
        for (size_t l = 0; l < c->L; l++) {
            kvq__prefix_key(cfg, h, l, key, sizeof key);
            kvq_status st = kvq__put_page(c, l, j, s, key, INT32_MAX, h, NULL);
            if (st != KVQ_OK)
                return st;
        }
    }
    return KVQ_OK;
}

kvq_status kvq_cache_prefix_get(kvq_cache *c, kvq_store *s, const int32_t *ids, size_t n,
                                size_t *n_loaded) {
    if (!c || !s || !n_loaded || (!ids && n))
        return KVQ_ERR_INVALID_ARG;
    *n_loaded = 0;
    if (!kvq__prefix_ok(c))
        return KVQ_ERR_UNSUPPORTED;
    if (!kvq__cache_empty(c))
        return KVQ_ERR_MISMATCH;
    uint64_t cfg = kvq__config_hash(c), h = 0xcbf29ce484222325ull;
    char key[128];
    size_t j = 0;
    kvq_status st = KVQ_OK;
    for (; (j + 1) * c->P < n && st == KVQ_OK; j++) { /* leave at least one token to run */
        h = kvq__fnv(h, ids + j * c->P, c->P * sizeof(int32_t));
        size_t l = 0;
        for (; l < c->L; l++) {
            kvq__prefix_key(cfg, h, l, key, sizeof key);
            void *rd = NULL;
            size_t rs = 0;
            kvq_status gs = kvq_store_get(s, key, &rd, &rs);
            if (gs == KVQ_ERR_RANGE)
                break;
            if (gs != KVQ_OK) {
                st = gs;
                break;
            }
            kvq__record r;
            gs = kvq__record_decode(rd, rs, &r);
            if (gs == KVQ_OK && r.prefix_hash != h)
                gs = KVQ_ERR_MISMATCH;
            if (gs == KVQ_OK)
                gs = kvq__install_page(c, l, j, &r);
            kvq_store_free_buf(s, rd);
            if (gs != KVQ_OK) {
                st = gs;
                break;
            }
        }
        if (l < c->L) {
            /* a layer misses this page: drop the partial page from the others */
            for (size_t k = 0; k < l; k++) {
                kvq__layer *ly = &c->layers[k];
                kvq__page *pg = &ly->pages[j];
                if (pg->block) {
                    int warm = pg->tier == KVQ__TIER_WARM;
                    kvq__lfree_tier(c, ly, pg->block, warm ? ly->wblock_bytes : ly->block_bytes, warm);
                    ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
                    ly->tier_pages[pg->tier]--;
                    ly->pages_alloc--;
                    ly->n_tokens -= pg->n_valid;
                    for (size_t i = 0; i < c->P; i++) {
                        ly->pos[j * c->P + i] = -1;
                        ly->state[j * c->P + i] = KVQ__FREE;
                    }
                    memset(pg, 0, sizeof *pg);
                    ly->n_pages = j;
                }
            }
            break;
        }
    }
    if (st != KVQ_OK) {
        for (size_t l = 0; l < c->L; l++)
            kvq__reset_layer(c, &c->layers[l]);
        return st;
    }
    size_t loaded = j * c->P;
    for (size_t l = 0; l < c->L && loaded; l++) {
        kvq__layer *ly = &c->layers[l];
        ly->appended = loaded;
        ly->last_pos = (int32_t)loaded - 1;
        ly->n_sinks_seen = KVQ__MIN(c->cfg.sinks, loaded);
        ly->sink_until = (int32_t)ly->n_sinks_seen - 1;
        if (c->cfg.k_center && !ly->center_ready)
            ly->center_ready = 1; /* centre values were given at create */
        kvq__finish_restore(c, ly);
    }
    *n_loaded = loaded;
    return KVQ_OK;
}
