/*
 * cache_observe.c - kvq_cache_observe_attention: attention computed outside
 * kvq (FlashAttention, ggml, a PyTorch module over K/V the engine read back
 * or keeps itself) fed into the cache as if kvq_cache_attend had computed
 * it. The weights update the utility scores with the same EMA as attend,
 * then the call ends as an attend that reached the newest token does: a
 * pending budget ratio is fixed, the layer is evicted to its budget, staged
 * tokens are settled and the tier capacities enforced.
 *
 * Everything is checked before anything changes (shape, NaN/Inf, negative
 * weights, rows that sum to more than softmax probabilities can), and the
 * one allocation (the position order of the slots) comes before the first
 * change, so on error the cache is as it was.
 */
#include "cache_impl.h"

#include <stdarg.h>
#include <stdio.h>

/* The bound on a row's sum, relative: a softmax row sums to 1 in exact
 * arithmetic; an engine's weights in bf16 carry a relative error of 2^-9
 * each, so their sum can exceed its bound by up to that much, and a sum of
 * n float32 terms by n * 2^-24 (under 1% for n <= 2^17). 1/32 leaves room
 * for both and still tells weights from scores or logits, whose sums are
 * not bounded by the number of queries at all. */
#define KVQ__OBS_SLACK (1.0 / 32.0)

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static kvq_status kvq__obs_fail(kvq_cache *c, kvq_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errbuf, sizeof c->errbuf, fmt, ap);
    va_end(ap);
    return st;
}

kvq_status kvq_cache_observe_attention(kvq_cache *c, size_t layer, const float *weights,
                                       size_t n_heads, size_t n_tokens, size_t n_queries) {
    if (!c)
        return KVQ_ERR_INVALID_ARG;
    c->errbuf[0] = 0;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    kvq__layer *ly = &c->layers[layer];
    const size_t H = c->H, QH = c->QH;
    if (n_queries == 0)
        return kvq__obs_fail(c, KVQ_ERR_INVALID_ARG,
                             "n_queries is 0: the weights are sums over at least one query");
    if (n_heads != H && n_heads != QH)
        return kvq__obs_fail(c, KVQ_ERR_INVALID_ARG,
                             "n_heads is %zu: the weights have one row per KV head (%zu) or per "
                             "query head (%zu)", n_heads, H, QH);
    if (n_tokens != ly->n_tokens)
        return kvq__obs_fail(c, KVQ_ERR_MISMATCH,
                             "n_tokens is %zu, layer %zu holds %zu tokens: the weights cover "
                             "every stored token (kvq_cache_positions order)",
                             n_tokens, layer, ly->n_tokens);
    if (n_tokens && !weights)
        return kvq__obs_fail(c, KVQ_ERR_INVALID_ARG, "weights is NULL");
    /* n_heads * n_tokens fits: n_tokens <= max_tokens, whose per-layer
     * tables (times the heads) were allocated */
    size_t n = n_heads * n_tokens;
    if (!kvq__all_finite(weights, n)) {
        size_t i = 0;
        while (i + 1 < n && isfinite(weights[i]))
            i++;
        return kvq__obs_fail(c, KVQ_ERR_NONFINITE, "weights[%zu][%zu] is %g", i / n_tokens,
                             i % n_tokens, (double)weights[i]);
    }
    /* a query head's row sums over n_queries probability distributions; a
     * KV head's row also over the group's query heads */
    const double row_max = (double)n_queries * (double)(n_heads == QH ? 1 : QH / H);
    for (size_t h = 0; h < n_heads; h++) {
        const float *row = weights + h * n_tokens;
        double sum = 0.0;
        for (size_t i = 0; i < n_tokens; i++) {
            if (row[i] < 0.0f)
                return kvq__obs_fail(c, KVQ_ERR_RANGE,
                                     "weights[%zu][%zu] is %g: attention weights are >= 0", h, i,
                                     (double)row[i]);
            sum += row[i];
        }
        if (sum > row_max * (1.0 + KVQ__OBS_SLACK))
            return kvq__obs_fail(c, KVQ_ERR_RANGE,
                                 "weights row %zu sums to %g, more than the %g that %zu queries' "
                                 "softmax probabilities can give (scores or logits instead of "
                                 "weights?)",
                                 h, sum, row_max, n_queries);
    }

    if (c->cfg.policy == KVQ_POLICY_UTILITY && n_tokens) {
        size_t n_sorted = 0;
        kvq__cand *sorted = kvq__sorted_tokens(c, ly, &n_sorted);
        if (!sorted)
            return KVQ_ERR_NOMEM;
        /* the same float operations as kvq_cache_attend: a token's weight
         * summed over the heads in order, then the EMA with norm 1 / (QH T) */
        const float norm = 1.0f / (float)(QH * n_queries);
        for (size_t r = 0; r < n_sorted; r++) {
            float a = 0.0f;
            for (size_t h = 0; h < n_heads; h++)
                a += weights[h * n_tokens + r];
            float *s = &ly->score[sorted[r].slot];
            *s = 0.9f * *s + 0.1f * a * norm;
        }
        kvq__free(&c->alloc, sorted);
    }
    if (ly->appended) /* as at the end of an attend that reached the newest token */
        kvq__newest_attended(c, ly);
    if (c->tiers)
        (void)kvq__tier_enforce(c, layer);
    return KVQ_OK;
}
