/*
 * cache_evict.c - eviction policies and budgets.
 *
 * A policy (window = StreamingLLM, fifo = arrival order, utility = H2O-style
 * EMA of the attention a token received) chooses which tokens leave when a
 * layer holds more than its budget. The first `sinks` tokens and the newest
 * `protect_recent` tokens are never chosen; when the budget is smaller than
 * both together, the protected window shrinks to fit it, then the sinks
 * (so a budget always holds). Eviction runs after attention (the end of
 * kvq_cache_attend, when the scores include the chunk's own attention) and,
 * for callers that append without attending or to keep max_tokens, at an
 * append, never touching the tokens of that append.
 *
 * Choosing m victims among n tokens is O(n): selections partition the
 * sinks, the protected window and the m lowest (score, position) in a
 * per-layer scratch array, so eviction never allocates and never fails.
 */
#include "cache_impl.h"

#include <stdio.h>
#include <stdlib.h>

/* (key, pos) order when by_key, else position order; positions are unique */
static inline int kvq__cand_less(const kvq__cand *x, const kvq__cand *y, int by_key) {
    if (by_key && x->key != y->key)
        return x->key < y->key;
    return x->pos < y->pos;
}

/* Reorders a[0..n) so that a[k] is the k-th smallest (k < n), nothing
 * after it smaller and nothing before it larger. Deterministic quickselect
 * (middle pivot, three-way partition). */
static void kvq__cand_select(kvq__cand *a, size_t n, size_t k, int by_key) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        kvq__cand piv = a[lo + (hi - lo) / 2];
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (kvq__cand_less(&a[i], &piv, by_key)) {
                kvq__cand x = a[lt];
                a[lt++] = a[i];
                a[i++] = x;
            } else if (kvq__cand_less(&piv, &a[i], by_key)) {
                kvq__cand x = a[--gt];
                a[gt] = a[i];
                a[i] = x;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return;
    }
}

void kvq__evict_slot(kvq_cache *c, kvq__layer *ly, uint32_t slot) {
    size_t p = slot / c->P;
    kvq__page *pg = &ly->pages[p];
    if (KVQ__STATE(ly->state[slot]) == KVQ__PEND)
        pg->n_pending--;
    ly->state[slot] = (uint8_t)(ly->state[slot] & KVQ__INSTACK);
    ly->pos[slot] = -1;
    pg->n_valid--;
    ly->n_tokens--;
    ly->evicted++;
    if (!ly->chan_mode && pg->n_valid > 0 && pg->tier == KVQ__TIER_HOT)
        kvq__push_free_slot(ly, slot);
    if (pg->n_valid == 0 && p != ly->open_page) {
        kvq__purge_free(c, ly, p);
        kvq__maybe_free_page(c, ly, p);
    } else {
        kvq__maybe_free_stage(c, ly, p);
    }
}

static int kvq__pos_cmp(const void *a, const void *b) {
    const kvq__cand *x = (const kvq__cand *)a, *y = (const kvq__cand *)b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Valid slots sorted by position (caller frees). NULL on OOM. */
kvq__cand *kvq__sorted_tokens(const kvq_cache *c, const kvq__layer *ly, size_t *n) {
    size_t cnt = 0;
    kvq__cand *v = (kvq__cand *)kvq__alloc(&c->alloc, (ly->n_tokens + 1) * sizeof *v);
    if (!v)
        return NULL;
    for (size_t s = 0; s < ly->n_pages * c->P; s++)
        if (ly->pos[s] >= 0) {
            v[cnt].pos = ly->pos[s];
            v[cnt].slot = (uint32_t)s;
            v[cnt].key = 0;
            cnt++;
        }
    qsort(v, cnt, sizeof *v, kvq__pos_cmp);
    *n = cnt;
    return v;
}

void kvq__evict_to(kvq_cache *c, kvq__layer *ly, size_t target, size_t keep_new) {
    if (ly->n_tokens <= target || c->cfg.policy == KVQ_POLICY_NONE || !ly->evs)
        return;
    /* what is protected: the sinks, then the newest tokens (the window
     * shrinks first to fit the target); the newest keep_new always */
    size_t sinks = KVQ__MIN(c->cfg.sinks, target);
    size_t prot = KVQ__MIN(c->cfg.protect_recent, target - sinks);
    prot = KVQ__MAX(prot, keep_new);
    if (sinks + prot > target)
        sinks = target > prot ? target - prot : 0;
    int util = c->cfg.policy == KVQ_POLICY_UTILITY;
    kvq__cand *a = ly->evs;
    size_t n = 0;
    for (size_t s = 0; s < ly->n_pages * c->P; s++)
        if (ly->pos[s] >= 0) {
            a[n].pos = ly->pos[s];
            a[n].slot = (uint32_t)s;
            a[n].key = util ? ly->score[s] : 0.0f;
            n++;
        }
    if (sinks + prot >= n)
        return;
    if (sinks)
        kvq__cand_select(a, n, sinks - 1, 0);
    kvq__cand *mid = a + sinks;
    size_t nm = n - sinks;
    if (prot)
        kvq__cand_select(mid, nm, nm - prot, 0);
    size_t ne = nm - prot; /* candidates: mid[0..ne) */
    size_t m = KVQ__MIN(ly->n_tokens - target, ne);
    if (m == 0)
        return;
    if (m < ne)
        kvq__cand_select(mid, ne, m - 1, util);
    for (size_t i = 0; i < m; i++)
        kvq__evict_slot(c, ly, mid[i].slot);
}

kvq_status kvq_cache_set_budget(kvq_cache *c, size_t budget) {
    if (!c)
        return KVQ_ERR_INVALID_ARG;
    if (budget == 0 || budget > c->cfg.max_tokens) {
        snprintf(c->errbuf, sizeof c->errbuf, "budget %zu is outside 1..max_tokens (%zu)", budget,
                 c->cfg.max_tokens);
        return KVQ_ERR_INVALID_ARG;
    }
    if (c->cfg.policy == KVQ_POLICY_NONE) {
        snprintf(c->errbuf, sizeof c->errbuf, "set_budget needs an eviction policy (policy none)");
        return KVQ_ERR_UNSUPPORTED;
    }
    c->errbuf[0] = 0;
    c->budget = budget;
    c->budget_pending_ratio = 0;
    for (size_t l = 0; l < c->L; l++)
        kvq__evict_to(c, &c->layers[l], c->budget, 0);
    kvq__track_total_peak(c);
    return KVQ_OK;
}
