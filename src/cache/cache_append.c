/*
 * cache_append.c - kvq_cache_append: a chunk of tokens into one layer.
 *
 * An append first reserves everything the chunk needs (pages, staging,
 * the pending ring, the page table) all or nothing, and only then settles
 * what earlier calls left pending (cache_page.c) and places the tokens:
 * exactly, as staged f16 or f32/f16 codes, so that the chunk's own queries
 * see it exactly. So a failed append changes nothing, not even the
 * settling it owed. Eviction that the policy owes at this point (older tokens over
 * the budget when no attend ran since, or room under max_tokens) comes last
 * and never touches the chunk; the chunk itself is subject to the budget
 * only after its queries attended (cache_attend.c).
 */
#include "cache_impl.h"

/* Argument checks of an append: positions strictly increase after the
 * layer's last one; values finite. */
static kvq_status kvq__append_check(const kvq_cache *c, const kvq__layer *ly, const float *k,
                                    const float *v, const int32_t *positions, size_t T) {
    size_t HD = c->H * c->d;
    if (T > c->cfg.max_tokens || T > ((size_t)1 << 30))
        return KVQ_ERR_FULL;
    if (!kvq__all_finite(k, T * HD) || !kvq__all_finite(v, T * HD))
        return KVQ_ERR_NONFINITE;
    int32_t prev = ly->appended ? ly->last_pos : -1;
    for (size_t t = 0; t < T; t++) {
        int32_t p = positions ? positions[t] : prev + 1;
        if (p <= prev || p < 0 || p == INT32_MAX)
            return KVQ_ERR_ORDER;
        prev = p;
    }
    if (c->cfg.policy == KVQ_POLICY_NONE && ly->n_tokens + T > c->cfg.max_tokens)
        return KVQ_ERR_FULL;
    return KVQ_OK;
}

size_t kvq__ring_cap(const kvq_cache *c, size_t need) {
    size_t cap = 4;
    while (cap < need || cap < c->cfg.recent_window + 2)
        cap *= 2;
    return cap;
}

/* Moves the pending ring into slot/pos (cap entries, not counted yet). */
static void kvq__ring_install(kvq_cache *c, kvq__layer *ly, uint32_t *slot, int32_t *pos,
                              size_t cap) {
    kvq__layer_count(ly, cap * sizeof(uint32_t), 1);
    kvq__layer_count(ly, cap * sizeof(int32_t), 1);
    for (size_t i = 0; i < ly->pend_count; i++) {
        size_t at = (ly->pend_head + i) % ly->pend_cap;
        slot[i] = ly->pend_slot[at];
        pos[i] = ly->pend_pos[at];
    }
    kvq__lfree(c, ly, ly->pend_slot, ly->pend_cap * sizeof(uint32_t), 1);
    kvq__lfree(c, ly, ly->pend_pos, ly->pend_cap * sizeof(int32_t), 1);
    ly->pend_slot = slot;
    ly->pend_pos = pos;
    ly->pend_cap = cap;
    ly->pend_head = 0;
}

kvq_status kvq__ring_resize(kvq_cache *c, kvq__layer *ly, size_t cap) {
    uint32_t *slot = (uint32_t *)kvq__calloc(&c->alloc, cap * sizeof(uint32_t));
    int32_t *pos = (int32_t *)kvq__calloc(&c->alloc, cap * sizeof(int32_t));
    if (!slot || !pos) {
        kvq__free(&c->alloc, slot);
        kvq__free(&c->alloc, pos);
        return KVQ_ERR_NOMEM;
    }
    kvq__ring_install(c, ly, slot, pos, cap);
    return KVQ_OK;
}

/* What an append allocates before it changes anything: the blocks (and
 * staging) of the pages it opens, staging for the existing pages whose
 * free slots it takes, a larger pending ring, and last the page table (the
 * one reservation made in place; it is all or nothing itself). Nothing of
 * it is counted before the commit, which cannot fail. */
typedef struct {
    size_t page;
    uint8_t *block;
    uint16_t *stage;
} kvq__rnew;

typedef struct {
    size_t page;
    uint16_t *stage;
} kvq__rreuse;

typedef struct {
    kvq__rnew *nw; /* pages opened for the chunk, in the order they fill */
    size_t n_new;
    kvq__rreuse *ru; /* existing pages that may need staging */
    size_t n_reuse;
    uint32_t *ring_slot; /* a pending ring of ring_cap entries, or NULL */
    int32_t *ring_pos;
    size_t ring_cap;
    void *arrays; /* nw and ru, when the buffers are too small */
    kvq__rnew nbuf[16];
    kvq__rreuse rbuf[32];
} kvq__reserve;

static void kvq__reserve_free(kvq_cache *c, kvq__reserve *rs) {
    for (size_t j = 0; j < rs->n_new; j++) {
        kvq__free(&c->alloc, rs->nw[j].block);
        kvq__free(&c->alloc, rs->nw[j].stage);
    }
    for (size_t j = 0; j < rs->n_reuse; j++)
        kvq__free(&c->alloc, rs->ru[j].stage);
    kvq__free(&c->alloc, rs->ring_slot);
    kvq__free(&c->alloc, rs->ring_pos);
    kvq__free(&c->alloc, rs->arrays);
}

/* Reserves what T new tokens need once the append has settled what it
 * owes (kvq__settle(c, ly, 0)). All or nothing: on failure the layer is as
 * it was, its peak included. */
static kvq_status kvq__append_reserve(kvq_cache *c, kvq__layer *ly, size_t T, kvq__reserve *rs) {
    size_t P = c->P, R = c->cfg.recent_window, keep = R > 0 ? R - 1 : 0;
    int chan = ly->chan_mode, stage = ly->stage_bytes > 0;
    rs->n_new = rs->n_reuse = 0;
    rs->ring_slot = NULL;
    rs->ring_pos = NULL;
    rs->arrays = NULL;
    size_t avail = chan ? (ly->open_page != SIZE_MAX ? P - ly->pages[ly->open_page].filled : 0)
                        : ly->n_free;
    size_t need_new = T > avail ? (T - avail + P - 1) / P : 0;
    /* free slots the chunk takes from the top of the free stack */
    size_t take = chan || !stage ? 0 : KVQ__MIN(ly->n_free, T);
    rs->nw = rs->nbuf;
    rs->ru = rs->rbuf;
    if (need_new > sizeof rs->nbuf / sizeof rs->nbuf[0] ||
        take > sizeof rs->rbuf / sizeof rs->rbuf[0]) {
        rs->arrays = kvq__calloc(&c->alloc, need_new * sizeof *rs->nw + take * sizeof *rs->ru + 1);
        if (!rs->arrays)
            return KVQ_ERR_NOMEM;
        rs->nw = (kvq__rnew *)rs->arrays;
        rs->ru = (kvq__rreuse *)(rs->nw + need_new);
    }
    kvq_status st = KVQ_OK;
    /* pages for the chunk: unallocated entries of the table first, then new
     * ones past its end */
    size_t scan = 0, next = ly->n_pages;
    for (size_t j = 0; j < need_new && st == KVQ_OK; j++) {
        while (scan < ly->n_pages && kvq__page_live(&ly->pages[scan]))
            scan++;
        kvq__rnew *r = &rs->nw[rs->n_new++];
        r->page = scan < ly->n_pages ? scan++ : next++;
        r->block = (uint8_t *)kvq__calloc(&c->alloc, ly->block_bytes);
        r->stage = stage ? (uint16_t *)kvq__calloc(&c->alloc, ly->stage_bytes) : NULL;
        if (!r->block || (stage && !r->stage))
            st = KVQ_ERR_NOMEM;
    }
    /* staging for the pages whose free slots the chunk takes: those without
     * it, and when the settling will encode tokens, also those with it (the
     * settling frees the staging of a page whose pending tokens it encodes
     * all of); a page given staging twice keeps one */
    int settles = ly->pend_count > keep;
    for (size_t j = 0; j < take && st == KVQ_OK; j++) {
        size_t p = ly->free_stack[ly->n_free - 1 - j] / P;
        if ((rs->n_reuse && rs->ru[rs->n_reuse - 1].page == p) ||
            (ly->pages[p].stage && !settles))
            continue;
        kvq__rreuse *r = &rs->ru[rs->n_reuse++];
        r->page = p;
        r->stage = (uint16_t *)kvq__calloc(&c->alloc, ly->stage_bytes);
        if (!r->stage)
            st = KVQ_ERR_NOMEM;
    }
    /* the pending ring after the settling holds min(pend_count, keep)
     * entries (in a ring shrunk to fit them when it was larger) and must
     * take the chunk's */
    if (st == KVQ_OK && stage) {
        size_t left = KVQ__MIN(ly->pend_count, keep), need = left + T;
        size_t cap_after = KVQ__MIN(ly->pend_cap, kvq__ring_cap(c, left));
        if (cap_after < need) {
            rs->ring_cap = kvq__ring_cap(c, need);
            rs->ring_slot = (uint32_t *)kvq__calloc(&c->alloc, rs->ring_cap * sizeof(uint32_t));
            rs->ring_pos = (int32_t *)kvq__calloc(&c->alloc, rs->ring_cap * sizeof(int32_t));
            if (!rs->ring_slot || !rs->ring_pos)
                st = KVQ_ERR_NOMEM;
        }
    }
    size_t peak = ly->peak_bytes;
    if (st == KVQ_OK)
        st = kvq__grow_pages(c, ly, next);
    if (st != KVQ_OK) {
        ly->peak_bytes = peak; /* a failed growth of the table counted its arrays */
        kvq__reserve_free(c, rs);
    }
    return st;
}

/* Hands the reservation to the layer, after the settling. Never fails. */
static void kvq__append_commit(kvq_cache *c, kvq__layer *ly, kvq__reserve *rs) {
    if (rs->ring_slot) {
        kvq__ring_install(c, ly, rs->ring_slot, rs->ring_pos, rs->ring_cap);
        rs->ring_slot = NULL;
        rs->ring_pos = NULL;
    }
    for (size_t j = 0; j < rs->n_reuse; j++) {
        kvq__page *pg = &ly->pages[rs->ru[j].page];
        if (!pg->stage) {
            pg->stage = rs->ru[j].stage;
            kvq__layer_count(ly, ly->stage_bytes, 0);
            rs->ru[j].stage = NULL;
        }
    }
    for (size_t j = 0; j < rs->n_new; j++) {
        kvq__rnew *r = &rs->nw[j];
        kvq__page_install(c, ly, r->page, r->block, r->stage);
        r->block = NULL;
        r->stage = NULL;
        if (r->page >= ly->n_pages)
            ly->n_pages = r->page + 1;
    }
}

/* The slot of the next token: the open channel page in order, or the top
 * of the free stack. */
static size_t kvq__next_slot(kvq_cache *c, kvq__layer *ly) {
    size_t P = c->P;
    if (!ly->chan_mode) {
        uint32_t s;
        do {
            s = ly->free_stack[--ly->n_free];
            ly->state[s] &= (uint8_t)~KVQ__INSTACK;
        } while (KVQ__STATE(ly->state[s]) != KVQ__FREE);
        return s;
    }
    if (ly->open_page == SIZE_MAX || ly->pages[ly->open_page].filled == P) {
        size_t np = SIZE_MAX;
        /* the next allocated page that has not been filled yet */
        for (size_t p = 0; p < ly->n_pages; p++)
            if (ly->pages[p].block && ly->pages[p].filled == 0 && !ly->pages[p].encoded &&
                ly->pages[p].n_valid == 0 && p != ly->open_page) {
                np = p;
                break;
            }
        size_t old = ly->open_page;
        ly->open_page = np;
        if (old != SIZE_MAX && ly->pages[old].n_valid == 0)
            kvq__maybe_free_page(c, ly, old);
    }
    return ly->open_page * P + ly->pages[ly->open_page].filled++;
}

kvq_status kvq_cache_append(kvq_cache *c, size_t layer, const float *k, const float *v,
                            const int32_t *positions, size_t T) {
    if (!c || !k || !v || T == 0)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    kvq__layer *ly = &c->layers[layer];
    size_t HD = c->H * c->d, P = c->P;
    kvq_status st = kvq__append_check(c, ly, k, v, positions, T);
    if (st != KVQ_OK)
        return st;
    kvq__reserve rs;
    st = kvq__append_reserve(c, ly, T, &rs);
    if (st != KVQ_OK)
        return st;
    /* what earlier calls left pending is owed now */
    kvq__settle(c, ly, 0);
    kvq__append_commit(c, ly, &rs);

    /* the new pages' slots go below the free stack's entries (which serve
     * the first tokens), in reverse so that they fill in order */
    if (!ly->chan_mode && rs.n_new) {
        size_t add = rs.n_new * P;
        memmove(ly->free_stack + add, ly->free_stack, ly->n_free * sizeof(uint32_t));
        size_t at = 0;
        for (size_t j = rs.n_new; j-- > 0;)
            for (size_t i = P; i-- > 0;) {
                uint32_t s = (uint32_t)(rs.nw[j].page * P + i);
                ly->state[s] |= KVQ__INSTACK;
                ly->free_stack[at++] = s;
            }
        ly->n_free += add;
    }
    kvq__reserve_free(c, &rs); /* what the commit did not take */
    size_t n_before = ly->n_tokens;
    for (size_t t = 0; t < T; t++) {
        int32_t pos = positions ? positions[t] : (ly->appended ? ly->last_pos + 1 : 0);
        size_t slot = kvq__next_slot(c, ly);
        kvq__page *pg = &ly->pages[slot / P];
        ly->pos[slot] = pos;
        pg->last_seq = ly->appended;
        if (pg->n_valid == 0 || pos < pg->min_pos)
            pg->min_pos = pos;
        if (ly->score)
            ly->score[slot] = 1.0f;
        pg->n_valid++;
        ly->n_tokens++;
        if (ly->n_sinks_seen < c->cfg.sinks) {
            ly->n_sinks_seen++;
            ly->sink_until = pos;
        }
        kvq__put_token(c, ly, slot, k + t * HD, v + t * HD);
        if (KVQ__STATE(ly->state[slot]) == KVQ__PEND) {
            size_t at = (ly->pend_head + ly->pend_count) % ly->pend_cap;
            ly->pend_slot[at] = (uint32_t)slot;
            ly->pend_pos[at] = pos;
            ly->pend_count++;
        }
        ly->last_pos = pos;
        ly->appended++;
    }
    /* eviction owed now, never of this chunk: older tokens over the budget
     * (no attend since), and room under max_tokens */
    if (c->cfg.policy != KVQ_POLICY_NONE) {
        size_t target = ly->n_tokens;
        if (c->budget && n_before > c->budget)
            target = c->budget + T;
        target = KVQ__MIN(target, c->cfg.max_tokens);
        kvq__evict_to(c, ly, target, T);
    }
    if (c->tiers)
        (void)kvq__tier_enforce(c, layer); /* failures stay hot and are counted */
    kvq__track_total_peak(c);
    return KVQ_OK;
}
