/*
 * cache_stats.c - reading a cache back (token counts, positions, decoded
 * K/V, staged tokens as staged) and its accounting: bytes stored (payload,
 * metadata, codec metadata), written and read, the asymptotic cost of a
 * token and the per-sequence fixed cost, and their JSON rendering.
 */
#include "cache_impl.h"

#include <stdio.h>

kvq_status kvq_cache_tokens(const kvq_cache *c, size_t layer, size_t *n) {
    if (!c || !n)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    *n = c->layers[layer].n_tokens;
    return KVQ_OK;
}

kvq_status kvq_cache_positions(const kvq_cache *c, size_t layer, int32_t *positions,
                               size_t capacity) {
    if (!c || (!positions && capacity))
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    const kvq__layer *ly = &c->layers[layer];
    if (capacity < ly->n_tokens)
        return KVQ_ERR_DST_TOO_SMALL;
    size_t n;
    kvq__cand *v = kvq__sorted_tokens(c, ly, &n);
    if (!v)
        return KVQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        positions[i] = v[i].pos;
    kvq__free(&c->alloc, v);
    return KVQ_OK;
}

/* Decodes one stored token of head h: key (centre added back) and value. */
static void kvq__read_token(const kvq_cache *c, const kvq__layer *ly, size_t slot, size_t h,
                            const uint8_t *blk, float *k, float *v) {
    size_t p = slot / c->P, i = slot % c->P, d = c->d;
    const kvq__page *pg = &ly->pages[p];
    const kvq__head *hd = kvq__page_heads(ly, pg) + h;
    int pend = KVQ__STATE(ly->state[slot]) == KVQ__PEND;
    uint8_t tmp[4 * KVQ__MAX_HEAD_DIM];
    int kst = hd->kchan_bits ? !pg->encoded : pend && hd->kstage;
    if (kst && k) {
        c->f16->k.decode(c->f16, k, (const uint8_t *)(kvq__stage_k(pg, hd) + i * d), 1);
        k = NULL;
    }
    if (pend && hd->vstage && v) {
        c->f16->k.decode(c->f16, v, (const uint8_t *)(kvq__stage_v(pg, hd) + i * d), 1);
        v = NULL;
    }
    if (k) {
        if (hd->kchan_bits)
            kvq__chan_decode_row(blk + hd->k_off, d, c->P, hd->kchan_bits, i, k);
        else
            kvq__slot_decode(hd->kc, hd->ktiled, KVQ__ROLE_K, c->P, blk + hd->k_off, i, k, tmp);
        if (ly->center)
            for (size_t t = 0; t < d; t++)
                k[t] += ly->center[h * d + t];
    }
    if (v)
        kvq__slot_decode(hd->vc, hd->vtiled, KVQ__ROLE_V, c->P, blk + hd->v_off, i, v, tmp);
}

kvq_status kvq_cache_get_kv(const kvq_cache *c, size_t layer, int kv_head, size_t first,
                            size_t count, float *k, float *v, size_t capacity) {
    if (!c || (!k && !v))
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L || kv_head >= (int)c->H || kv_head < -1)
        return KVQ_ERR_RANGE;
    const kvq__layer *ly = &c->layers[layer];
    if (first > ly->n_tokens || count > ly->n_tokens - first)
        return KVQ_ERR_RANGE;
    size_t nh = kv_head < 0 ? c->H : 1;
    if (count && capacity < count * nh * c->d)
        return KVQ_ERR_DST_TOO_SMALL;
    size_t n;
    kvq__cand *sorted = kvq__sorted_tokens(c, ly, &n);
    if (!sorted)
        return KVQ_ERR_NOMEM;
    /* the records of the cold pages in the range are read first, so that a
     * failure writes nothing to k and v */
    kvq_status st = KVQ_OK;
    uint8_t **cold = NULL;
    for (size_t r = 0; r < count && st == KVQ_OK; r++) {
        size_t p = sorted[first + r].slot / c->P;
        if (ly->pages[p].tier != KVQ__TIER_COLD || (cold && cold[p]))
            continue;
        if (!cold) {
            cold = (uint8_t **)kvq__calloc(&c->alloc, ly->n_pages * sizeof *cold);
            if (!cold) {
                st = KVQ_ERR_NOMEM;
                break;
            }
        }
        st = kvq__tier_peek(c, ly, p, &cold[p]);
    }
    for (size_t r = 0; r < count && st == KVQ_OK; r++) {
        uint32_t slot = sorted[first + r].slot;
        size_t p = slot / c->P;
        const uint8_t *blk = ly->pages[p].tier == KVQ__TIER_COLD ? cold[p] : ly->pages[p].block;
        for (size_t j = 0; j < nh; j++) {
            size_t h = kv_head < 0 ? j : (size_t)kv_head;
            size_t off = (r * nh + j) * c->d;
            kvq__read_token(c, ly, slot, h, blk, k ? k + off : NULL, v ? v + off : NULL);
        }
    }
    for (size_t p = 0; cold && p < ly->n_pages; p++)
        kvq__free(&c->alloc, cold[p]);
    kvq__free(&c->alloc, cold);
    kvq__free(&c->alloc, sorted);
    return st;
}


static void kvq__layer_stats(const kvq_cache *c, const kvq__layer *ly, kvq_stats *st) {
    memset(st, 0, sizeof *st);
    st->tokens = ly->n_tokens;
    st->tokens_appended = ly->appended;
    st->tokens_evicted = ly->evicted;
    st->payload_bytes = ly->payload_bytes;
    st->metadata_bytes = ly->meta_bytes;
    st->codec_meta_bytes = ly->codec_meta_bytes;
    st->stored_bytes = ly->payload_bytes + ly->meta_bytes;
    st->peak_stored_bytes = ly->peak_bytes;
    st->bytes_written = ly->bytes_written;
    st->bytes_read = ly->bytes_read;
    st->reencodes = ly->reencodes;
    st->pages = ly->pages_alloc;
    st->free_slots = ly->pages_alloc * c->P - ly->n_tokens;
    /* asymptotic: a full encoded page costs block_bytes for P tokens */
    double per_tok = (double)ly->block_bytes / (double)c->P;
    double vals = (double)c->H * (double)c->d * 2.0;
    st->asymptotic_bits_per_value = per_tok * 8.0 / vals;
    for (size_t p = 0; p < ly->n_pages; p++)
        if (ly->pages[p].tier == KVQ__TIER_COLD && !ly->pages[p].block)
            st->tokens_cold += ly->pages[p].n_valid;
    double fixed = (double)ly->payload_bytes - per_tok * (double)(ly->n_tokens - st->tokens_cold);
    st->fixed_bytes = fixed > 0 ? (uint64_t)(fixed + 0.5) : 0;
}

static void kvq__finish_stats(const kvq_cache *c, kvq_stats *st) {
    double vals = (double)(st->tokens - st->tokens_cold) * (double)c->H * (double)c->d * 2.0;
    st->bits_per_value = vals > 0 ? (double)st->payload_bytes * 8.0 / vals : 0.0;
    st->total_bits_per_value = vals > 0 ? (double)st->stored_bytes * 8.0 / vals : 0.0;
    double slots = (double)st->pages * (double)c->P;
    st->fragmentation = slots > 0 ? (double)st->free_slots / slots : 0.0;
    st->arena_bytes = kvq__hpool_mapped(c->hpool);
}

kvq_status kvq_cache_stats(const kvq_cache *c, int layer, kvq_stats *st) {
    if (!c || !st)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= (int)c->L || layer < -1)
        return KVQ_ERR_RANGE;
    if (layer >= 0) {
        kvq__layer_stats(c, &c->layers[layer], st);
    } else {
        memset(st, 0, sizeof *st);
        for (size_t l = 0; l < c->L; l++) {
            kvq_stats s;
            kvq__layer_stats(c, &c->layers[l], &s);
            st->tokens += s.tokens;
            st->tokens_appended += s.tokens_appended;
            st->tokens_evicted += s.tokens_evicted;
            st->payload_bytes += s.payload_bytes;
            st->metadata_bytes += s.metadata_bytes;
            st->codec_meta_bytes += s.codec_meta_bytes;
            st->stored_bytes += s.stored_bytes;
            st->bytes_written += s.bytes_written;
            st->bytes_read += s.bytes_read;
            st->reencodes += s.reencodes;
            st->pages += s.pages;
            st->free_slots += s.free_slots;
            st->fixed_bytes += s.fixed_bytes;
            st->tokens_cold += s.tokens_cold;
            st->asymptotic_bits_per_value += s.asymptotic_bits_per_value / (double)c->L;
        }
        st->peak_stored_bytes = c->total_peak;
    }
    kvq__finish_stats(c, st);
    return KVQ_OK;
}

static size_t kvq__stats_obj(char *dst, size_t cap, const kvq_stats *s) {
    int n = snprintf(dst, cap,
                     "{\"tokens\": %llu, \"tokens_appended\": %llu, \"tokens_evicted\": %llu, "
                     "\"payload_bytes\": %llu, \"metadata_bytes\": %llu, \"codec_meta_bytes\": %llu, "
                     "\"stored_bytes\": %llu, \"peak_stored_bytes\": %llu, \"bytes_written\": %llu, "
                     "\"bytes_read\": %llu, \"reencodes\": %llu, \"pages\": %llu, "
                     "\"free_slots\": %llu, \"bits_per_value\": %.6g, \"total_bits_per_value\": "
                     "%.6g, \"fragmentation\": %.6g, \"asymptotic_bits_per_value\": %.6g, "
                     "\"fixed_bytes\": %llu, \"tokens_cold\": %llu, \"arena_bytes\": %llu}",
                     (unsigned long long)s->tokens, (unsigned long long)s->tokens_appended,
                     (unsigned long long)s->tokens_evicted, (unsigned long long)s->payload_bytes,
                     (unsigned long long)s->metadata_bytes,
                     (unsigned long long)s->codec_meta_bytes, (unsigned long long)s->stored_bytes,
                     (unsigned long long)s->peak_stored_bytes,
                     (unsigned long long)s->bytes_written, (unsigned long long)s->bytes_read,
                     (unsigned long long)s->reencodes, (unsigned long long)s->pages,
                     (unsigned long long)s->free_slots, s->bits_per_value, s->total_bits_per_value,
                     s->fragmentation, s->asymptotic_bits_per_value,
                     (unsigned long long)s->fixed_bytes, (unsigned long long)s->tokens_cold,
                     (unsigned long long)s->arena_bytes);
    return n < 0 ? 0 : (size_t)n;
}

kvq_status kvq_cache_stats_json(const kvq_cache *c, char *dst, size_t cap, size_t *written) {
    if (!c || !written)
        return KVQ_ERR_INVALID_ARG;
    /* render into a scratch buffer large enough for any layer count */
    /* an object is about 520 characters of text and 20 numbers of at most
     * 20 characters each */
    size_t need = 1000 * (c->L + 1) + 1200;
    char *buf = (char *)kvq__alloc(&c->alloc, need);
    if (!buf)
        return KVQ_ERR_NOMEM;
    size_t n = 0;
    kvq_stats s;
    kvq_cache_stats(c, -1, &s);
    n += (size_t)snprintf(buf + n, need - n, "{\"total\": ");
    n += kvq__stats_obj(buf + n, need - n, &s);
    n += (size_t)snprintf(buf + n, need - n, ", \"layers\": [");
    for (size_t l = 0; l < c->L; l++) {
        kvq_cache_stats(c, (int)l, &s);
        if (l)
            n += (size_t)snprintf(buf + n, need - n, ", ");
        n += kvq__stats_obj(buf + n, need - n, &s);
    }
    n += (size_t)snprintf(buf + n, need - n, "]");
    if (c->tiers) {
        kvq_tier_stats t;
        kvq_cache_tier_stats(c, &t);
        static const char *names[3] = {"hot", "warm", "cold"};
        uint64_t reads = t.reads[0] + t.reads[1] + t.reads[2];
        n += (size_t)snprintf(buf + n, need - n, ", \"tiers\": {");
        for (int k = 0; k < 3; k++)
            n += (size_t)snprintf(buf + n, need - n,
                                  "\"%s\": {\"pages\": %llu, \"tokens\": %llu, \"bytes\": %llu, "
                                  "\"reads\": %llu, \"hit_rate\": %.6g}, ",
                                  names[k], (unsigned long long)t.pages[k],
                                  (unsigned long long)t.tokens[k], (unsigned long long)t.bytes[k],
                                  (unsigned long long)t.reads[k],
                                  reads ? (double)t.reads[k] / (double)reads : 0.0);
        n += (size_t)snprintf(
            buf + n, need - n,
            "\"demotions\": %llu, \"promotions\": %llu, \"demotion_failures\": %llu, "
            "\"dropped_pages\": %llu, \"bytes_moved\": {\"hot_to_warm\": %llu, \"warm_to_hot\": "
            "%llu, \"to_cold\": %llu, \"from_cold\": %llu}, \"modeled_transfer_ms\": %.6g, "
            "\"measured_transfer_ms\": %.6g, \"lost_pages\": %llu, \"lost_tokens\": %llu, "
            "\"verify_mismatches\": %llu}",
            (unsigned long long)t.demotions, (unsigned long long)t.promotions,
            (unsigned long long)t.demotion_failures, (unsigned long long)t.dropped_pages,
            (unsigned long long)t.bytes_hot_to_warm, (unsigned long long)t.bytes_warm_to_hot,
            (unsigned long long)t.bytes_to_cold, (unsigned long long)t.bytes_from_cold,
            t.modeled_transfer_ms, t.measured_transfer_ms, (unsigned long long)t.lost_pages,
            (unsigned long long)t.lost_tokens, (unsigned long long)t.verify_mismatches);
    }
    n += (size_t)snprintf(buf + n, need - n, "}");
    kvq_status st = KVQ_OK;
    if (dst) {
        if (cap < n + 1)
            st = KVQ_ERR_DST_TOO_SMALL;
        else
            memcpy(dst, buf, n + 1);
    }
    *written = n;
    kvq__free(&c->alloc, buf);
    return st;
}

