/*
 * cache_page.c - pages, slots and causal staging of a cache layer.
 *
 * Pages are blocks of P token slots (layout in cache_impl.h). Token layout
 * reuses the holes eviction leaves through a free stack; channel layout
 * fills pages in order (a page's keys are encoded together).
 *
 * Staging is what makes a prefill equal to token-by-token decoding: a token
 * is written as it arrives only where that is exact (f32 and f16 codecs);
 * lossy parts wait in f16 and are encoded by kvq__settle, which the next
 * append and the end of an attend call. The encoded bytes of a token
 * therefore never depend on how the sequence was chunked, and no query sees
 * a token compressed earlier than a decoding query would.
 */
#include "cache_impl.h"

void kvq__layer_release(kvq_cache *c, kvq__layer *ly) {
    for (size_t p = 0; p < ly->n_pages; p++) {
        if (ly->pages[p].tier != KVQ__TIER_HOT)
            kvq__tier_page_free(c, ly, p);
        else
            kvq__lfree(c, ly, ly->pages[p].block, ly->block_bytes, 0);
        kvq__lfree(c, ly, ly->pages[p].stage, ly->stage_bytes, 0);
    }
    kvq__free_tables(c, ly);
    kvq__lfree(c, ly, ly->pend_slot, ly->pend_cap * sizeof(uint32_t), 1);
    kvq__lfree(c, ly, ly->pend_pos, ly->pend_cap * sizeof(int32_t), 1);
    kvq__free(&c->alloc, ly->center);
    ly->center = NULL;
}

void kvq__free_tables(kvq_cache *c, kvq__layer *ly) {
    size_t sc = ly->slots_cap;
    kvq__lfree(c, ly, ly->pages, ly->pages_cap * sizeof *ly->pages, 1);
    kvq__lfree(c, ly, ly->pos, sc * sizeof(int32_t), 1);
    kvq__lfree(c, ly, ly->state, sc, 1);
    kvq__lfree(c, ly, ly->score, sc * sizeof(float), 1);
    kvq__lfree(c, ly, ly->free_stack, sc * sizeof(uint32_t), 1);
    kvq__lfree(c, ly, ly->evs, sc * sizeof(kvq__cand), 1);
    ly->pages = NULL;
    ly->pos = NULL;
    ly->state = NULL;
    ly->score = NULL;
    ly->free_stack = NULL;
    ly->evs = NULL;
    ly->pages_cap = ly->slots_cap = 0;
}

/* Grows the page table and per-slot arrays to hold at least n_pages pages.
 * All-or-nothing. */
kvq_status kvq__grow_pages(kvq_cache *c, kvq__layer *ly, size_t n_pages) {
    if (n_pages <= ly->pages_cap)
        return KVQ_OK;
    /* a power of two: the table's size never depends on how the tokens
     * were chunked */
    size_t cap = 4;
    while (cap < n_pages)
        cap *= 2;
    size_t slots = cap * c->P;
    int util = c->cfg.policy == KVQ_POLICY_UTILITY;
    int evict = c->cfg.policy != KVQ_POLICY_NONE;
    kvq__page *pages = kvq__lalloc(c, ly, cap * sizeof *pages, 1);
    int32_t *pos = kvq__lalloc(c, ly, slots * sizeof(int32_t), 1);
    uint8_t *state = kvq__lalloc(c, ly, slots, 1);
    float *score = util ? kvq__lalloc(c, ly, slots * sizeof(float), 1) : NULL;
    uint32_t *fs = kvq__lalloc(c, ly, slots * sizeof(uint32_t), 1);
    kvq__cand *evs = evict ? kvq__lalloc(c, ly, slots * sizeof(kvq__cand), 1) : NULL;
    if (!pages || !pos || !state || (util && !score) || !fs || (evict && !evs)) {
        kvq__lfree(c, ly, pages, cap * sizeof *pages, 1);
        kvq__lfree(c, ly, pos, slots * sizeof(int32_t), 1);
        kvq__lfree(c, ly, state, slots, 1);
        kvq__lfree(c, ly, score, slots * sizeof(float), 1);
        kvq__lfree(c, ly, fs, slots * sizeof(uint32_t), 1);
        kvq__lfree(c, ly, evs, slots * sizeof(kvq__cand), 1);
        return KVQ_ERR_NOMEM;
    }
    size_t old = ly->slots_cap;
    if (ly->pages_cap) {
        memcpy(pages, ly->pages, ly->pages_cap * sizeof *pages);
        memcpy(pos, ly->pos, old * sizeof(int32_t));
        memcpy(state, ly->state, old);
        if (util)
            memcpy(score, ly->score, old * sizeof(float));
        memcpy(fs, ly->free_stack, ly->n_free * sizeof(uint32_t));
    }
    for (size_t i = old; i < slots; i++)
        pos[i] = -1;
    kvq__free_tables(c, ly);
    ly->pages = pages;
    ly->pos = pos;
    ly->state = state;
    ly->score = score;
    ly->free_stack = fs;
    ly->evs = evs;
    ly->pages_cap = cap;
    ly->slots_cap = slots;
    return KVQ_OK;
}

/* The free slots of hot page p go on the free stack (token layout), in
 * reverse so that they are handed out in ascending order. */
void kvq__push_page_free(kvq_cache *c, kvq__layer *ly, size_t p) {
    if (ly->chan_mode || ly->pages[p].tier != KVQ__TIER_HOT)
        return;
    for (size_t i = c->P; i-- > 0;)
        if (ly->pos[p * c->P + i] < 0)
            kvq__push_free_slot(ly, (uint32_t)(p * c->P + i));
}

void kvq__push_free_slot(kvq__layer *ly, uint32_t slot) {
    if (ly->state[slot] & KVQ__INSTACK)
        return;
    ly->state[slot] |= KVQ__INSTACK;
    ly->free_stack[ly->n_free++] = slot;
}

/* Removes the free-stack entries of page p (before the page is freed). */
void kvq__purge_free(kvq_cache *c, kvq__layer *ly, size_t p) {
    size_t j = 0;
    for (size_t i = 0; i < ly->n_free; i++) {
        uint32_t s = ly->free_stack[i];
        if (s / c->P == p)
            ly->state[s] &= (uint8_t)~KVQ__INSTACK;
        else
            ly->free_stack[j++] = s;
    }
    ly->n_free = j;
}

/* Releases hot page p's memory and counters (its slots must be free). */
void kvq__page_unalloc(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    ly->tier_pages[KVQ__TIER_HOT]--;
    kvq__lfree(c, ly, pg->block, ly->block_bytes, 0);
    kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
    ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
    memset(pg, 0, sizeof *pg);
    ly->pages_alloc--;
}

/* Frees page p when it holds nothing (and is not the open channel page). */
void kvq__maybe_free_page(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if ((!pg->block && pg->tier != KVQ__TIER_COLD) || pg->n_valid || p == ly->open_page)
        return;
    if (pg->tier != KVQ__TIER_HOT) {
        kvq__tier_page_free(c, ly, p);
        memset(pg, 0, sizeof *pg);
        ly->pages_alloc--;
        return;
    }
    kvq__page_unalloc(c, ly, p);
}

/* Makes page p a hot page with the given block (block_bytes, zeroed) and
 * staging (stage_bytes, or NULL), counting both. */
void kvq__page_install(kvq_cache *c, kvq__layer *ly, size_t p, uint8_t *block, uint16_t *stage) {
    kvq__page *pg = &ly->pages[p];
    pg->block = block;
    kvq__layer_count(ly, ly->block_bytes, 0);
    pg->stage = stage;
    if (stage)
        kvq__layer_count(ly, ly->stage_bytes, 0);
    pg->n_valid = pg->n_pending = pg->filled = 0;
    pg->encoded = 0;
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    ly->pages_alloc++;
    ly->tier_pages[KVQ__TIER_HOT]++;
    pg->tier = KVQ__TIER_HOT;
    for (size_t i = 0; i < c->P; i++) {
        ly->pos[p * c->P + i] = -1;
        ly->state[p * c->P + i] = KVQ__FREE;
    }
}

/* Allocates the block of page p (and its staging when stage is set). */
kvq_status kvq__page_alloc(kvq_cache *c, kvq__layer *ly, size_t p, int stage) {
    uint8_t *block = (uint8_t *)kvq__calloc(&c->alloc, ly->block_bytes);
    uint16_t *stg = stage && ly->stage_bytes ? (uint16_t *)kvq__calloc(&c->alloc, ly->stage_bytes)
                                             : NULL;
    if (!block || (stage && ly->stage_bytes && !stg)) {
        kvq__free(&c->alloc, block);
        kvq__free(&c->alloc, stg);
        return KVQ_ERR_NOMEM;
    }
    kvq__page_install(c, ly, p, block, stg);
    return KVQ_OK;
}

/* Frees page p's staging block when nothing waits in it: no pending token
 * and, with channel keys, the page encoded. */
void kvq__maybe_free_stage(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if (pg->stage && pg->n_pending == 0 && (!ly->chan_mode || pg->encoded)) {
        kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
        pg->stage = NULL;
    }
}

void kvq__put_token(kvq_cache *c, kvq__layer *ly, size_t slot, const float *k, const float *v) {
    size_t p = slot / c->P, i = slot % c->P, d = c->d;
    kvq__page *pg = &ly->pages[p];
    int staged = 0;
    float kb[KVQ__MAX_HEAD_DIM];
    uint8_t tmp[4 * KVQ__MAX_HEAD_DIM];
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        const float *kh = k + h * d, *vh = v + h * d;
        if (hd->kstage) {
            c->f16->k.encode(c->f16, (uint8_t *)(kvq__stage_k(pg, hd) + i * d), kh, 1);
            staged = 1;
        } else {
            if (ly->center) {
                for (size_t t = 0; t < d; t++)
                    kb[t] = kh[t] - ly->center[h * d + t];
                kh = kb;
            }
            kvq__slot_encode(hd->kc, hd->ktiled, KVQ__ROLE_K, c->P, pg->block + hd->k_off, i, kh, tmp);
            ly->bytes_written += hd->kbytes;
        }
        if (hd->vstage) {
            c->f16->k.encode(c->f16, (uint8_t *)(kvq__stage_v(pg, hd) + i * d), vh, 1);
            staged = 1;
        } else {
            kvq__slot_encode(hd->vc, hd->vtiled, KVQ__ROLE_V, c->P, pg->block + hd->v_off, i, vh, tmp);
            ly->bytes_written += hd->vbytes;
        }
    }
    ly->state[slot] = staged ? KVQ__PEND : KVQ__ENC;
    pg->n_pending += staged;
}

/* Encodes the staged token-layout parts of a pending slot (channel keys
 * stay staged until their page is encoded). */
static void kvq__settle_token(kvq_cache *c, kvq__layer *ly, size_t slot) {
    size_t p = slot / c->P, i = slot % c->P, d = c->d;
    kvq__page *pg = &ly->pages[p];
    float x[KVQ__MAX_HEAD_DIM];
    uint8_t tmp[4 * KVQ__MAX_HEAD_DIM];
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        if (hd->kstage && !hd->kchan_bits) {
            c->f16->k.decode(c->f16, x, (const uint8_t *)(kvq__stage_k(pg, hd) + i * d), 1);
            if (ly->center)
                for (size_t t = 0; t < d; t++)
                    x[t] -= ly->center[h * d + t];
            kvq__slot_encode(hd->kc, hd->ktiled, KVQ__ROLE_K, c->P, pg->block + hd->k_off, i, x, tmp);
            ly->bytes_written += hd->kbytes;
        }
        if (hd->vstage) {
            c->f16->k.decode(c->f16, x, (const uint8_t *)(kvq__stage_v(pg, hd) + i * d), 1);
            kvq__slot_encode(hd->vc, hd->vtiled, KVQ__ROLE_V, c->P, pg->block + hd->v_off, i, x, tmp);
            ly->bytes_written += hd->vbytes;
        }
    }
    ly->state[slot] = (uint8_t)((ly->state[slot] & KVQ__INSTACK) | KVQ__ENC);
    pg->n_pending--;
}

/* Encodes the channel keys of full page p from staging; rows holds P*d
 * floats, valid P bytes (work scratch). */
static void kvq__chan_flush_page(kvq_cache *c, kvq__layer *ly, size_t p, float *rows,
                                 uint8_t *valid) {
    kvq__page *pg = &ly->pages[p];
    size_t P = c->P, d = c->d;
    for (size_t i = 0; i < P; i++)
        valid[i] = ly->pos[p * P + i] >= 0;
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        if (!hd->kchan_bits)
            continue;
        c->f16->k.decode(c->f16, rows, (const uint8_t *)kvq__stage_k(pg, hd), P);
        if (ly->center)
            for (size_t i = 0; i < P; i++)
                for (size_t t = 0; t < d; t++)
                    rows[i * d + t] -= ly->center[h * d + t];
        kvq__chan_encode(pg->block + hd->k_off, d, P, hd->kchan_bits, rows, valid);
        ly->bytes_written += hd->k_hdr + hd->kbytes * P;
    }
    pg->encoded = 1;
}

void kvq__settle(kvq_cache *c, kvq__layer *ly, int all) {
    size_t R = c->cfg.recent_window, keep = R > 0 && !all ? R - 1 : 0;
    while (ly->pend_count > keep) {
        uint32_t slot = ly->pend_slot[ly->pend_head];
        int32_t pos = ly->pend_pos[ly->pend_head];
        ly->pend_head = (ly->pend_head + 1) % ly->pend_cap;
        ly->pend_count--;
        if (ly->pos[slot] != pos || KVQ__STATE(ly->state[slot]) != KVQ__PEND)
            continue; /* evicted while pending */
        kvq__settle_token(c, ly, slot);
        if (!ly->chan_mode)
            kvq__maybe_free_stage(c, ly, slot / c->P);
    }
    /* a ring grown for a long chunk goes back to its usual size (if that
     * cannot be allocated it stays larger) */
    size_t cap = kvq__ring_cap(c, ly->pend_count);
    if (ly->pend_cap > cap)
        (void)kvq__ring_resize(c, ly, cap);
    if (!ly->chan_mode)
        return;
    float *rows = c->work[0].scratch;
    uint8_t *valid = c->work[0].cls;
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        if (pg->block && pg->tier == KVQ__TIER_HOT && !pg->encoded && pg->filled == c->P &&
            pg->n_pending == 0 && pg->n_valid > 0)
            kvq__chan_flush_page(c, ly, p, rows, valid);
        if (pg->block)
            kvq__maybe_free_stage(c, ly, p);
    }
}
