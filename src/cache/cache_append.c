/*
 * cache_append.c - kvq_cache_append: a chunk of tokens into one layer.
 *
 * An append first settles what earlier calls left pending (cache_page.c),
 * then reserves everything the chunk needs (page table, pages, staging,
 * the pending ring) all or nothing, then places the tokens: exactly, as
 * staged f16 or f32/f16 codes, so that the chunk's own queries see it
 * exactly. Eviction that the policy owes at this point (older tokens over
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

/* The pending ring holds at least need entries (kept in arrival order). */
static kvq_status kvq__ring_reserve(kvq_cache *c, kvq__layer *ly, size_t need) {
    if (need <= ly->pend_cap)
        return KVQ_OK;
    return kvq__ring_resize(c, ly, kvq__ring_cap(c, need));
}

size_t kvq__ring_cap(const kvq_cache *c, size_t need) {
    size_t cap = 4;
    while (cap < need || cap < c->cfg.recent_window + 2)
        cap *= 2;
    return cap;
}

kvq_status kvq__ring_resize(kvq_cache *c, kvq__layer *ly, size_t cap) {
    uint32_t *slot = kvq__lalloc(c, ly, cap * sizeof(uint32_t), 1);
    int32_t *pos = kvq__lalloc(c, ly, cap * sizeof(int32_t), 1);
    if (!slot || !pos) {
        kvq__lfree(c, ly, slot, cap * sizeof(uint32_t), 1);
        kvq__lfree(c, ly, pos, cap * sizeof(int32_t), 1);
        return KVQ_ERR_NOMEM;
    }
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
    return KVQ_OK;
}

/* What an append allocates before it changes anything. */
typedef struct {
    size_t *newpages, n_new, cap_new; /* pages allocated for the chunk */
    size_t *staged, n_staged;         /* existing pages given a staging block */
    size_t n_pages_before;
    size_t buf[128];
} kvq__reserve;

static void kvq__reserve_undo(kvq_cache *c, kvq__layer *ly, kvq__reserve *rs) {
    for (size_t j = 0; j < rs->n_new; j++)
        kvq__page_unalloc(c, ly, rs->newpages[j]);
    for (size_t j = 0; j < rs->n_staged; j++) {
        kvq__page *pg = &ly->pages[rs->staged[j]];
        kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
        pg->stage = NULL;
    }
    ly->n_pages = rs->n_pages_before;
}

static void kvq__reserve_free(kvq_cache *c, kvq__reserve *rs) {
    if (rs->newpages != rs->buf)
        kvq__free(&c->alloc, rs->newpages);
}

/* Reserves the pages and staging T new tokens need. All or nothing. */
static kvq_status kvq__append_reserve(kvq_cache *c, kvq__layer *ly, size_t T, kvq__reserve *rs) {
    size_t P = c->P;
    int chan = ly->chan_mode, stage = ly->stage_bytes > 0;
    memset(rs, 0, sizeof *rs);
    rs->n_pages_before = ly->n_pages;
    size_t avail = chan ? (ly->open_page != SIZE_MAX ? P - ly->pages[ly->open_page].filled : 0)
                        : ly->n_free;
    size_t need_new = T > avail ? (T - avail + P - 1) / P : 0;
    /* existing pages whose free slots the chunk takes (top of the free stack) */
    size_t n_reuse = chan || !stage ? 0 : KVQ__MIN(ly->n_free, T);
    size_t n_unalloc = 0;
    for (size_t p = 0; p < ly->n_pages; p++)
        n_unalloc += !kvq__page_live(&ly->pages[p]);
    kvq_status st = kvq__grow_pages(c, ly, ly->n_pages + need_new - KVQ__MIN(n_unalloc, need_new));
    if (st == KVQ_OK && stage)
        st = kvq__ring_reserve(c, ly, ly->pend_count + T);
    if (st != KVQ_OK)
        return st;
    rs->newpages = rs->buf;
    if (need_new + n_reuse > sizeof rs->buf / sizeof rs->buf[0]) {
        rs->newpages = (size_t *)kvq__alloc(&c->alloc, (need_new + n_reuse) * sizeof(size_t));
        if (!rs->newpages)
            return KVQ_ERR_NOMEM;
    }
    rs->staged = rs->newpages + need_new;
    size_t scan = 0;
    while (rs->n_new < need_new) {
        while (scan < ly->n_pages && kvq__page_live(&ly->pages[scan]))
            scan++;
        size_t p = scan < ly->n_pages ? scan : ly->n_pages++;
        st = kvq__page_alloc(c, ly, p, stage);
        if (st != KVQ_OK)
            break;
        rs->newpages[rs->n_new++] = p;
        scan = p + 1;
    }
    for (size_t j = 0; j < n_reuse && st == KVQ_OK; j++) {
        size_t p = ly->free_stack[ly->n_free - 1 - j] / P;
        if (ly->pages[p].stage)
            continue;
        ly->pages[p].stage = kvq__lalloc(c, ly, ly->stage_bytes, 0);
        if (!ly->pages[p].stage)
            st = KVQ_ERR_NOMEM;
        else
            rs->staged[rs->n_staged++] = p;
    }
    if (st != KVQ_OK) {
        kvq__reserve_undo(c, ly, rs);
        kvq__reserve_free(c, rs);
    }
    return st;
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
    /* what earlier calls left pending is owed now, whatever this call does */
    kvq__settle(c, ly, 0);
    kvq__reserve rs;
    st = kvq__append_reserve(c, ly, T, &rs);
    if (st != KVQ_OK)
        return st;

    /* commit: the new pages' slots go below the free stack's entries (which
     * serve the first tokens), in reverse so that they fill in order */
    if (!ly->chan_mode && rs.n_new) {
        size_t add = rs.n_new * P;
        memmove(ly->free_stack + add, ly->free_stack, ly->n_free * sizeof(uint32_t));
        size_t at = 0;
        for (size_t j = rs.n_new; j-- > 0;)
            for (size_t i = P; i-- > 0;) {
                uint32_t s = (uint32_t)(rs.newpages[j] * P + i);
                ly->state[s] |= KVQ__INSTACK;
                ly->free_stack[at++] = s;
            }
        ly->n_free += add;
    }
    kvq__reserve_free(c, &rs);
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
