/*
 * cache_impl.h - internal layout of a kvq_cache.
 *
 * A layer owns an array of pages of P token slots. A page is one block
 * holding, for every KV head, a K area and a V area (P encoded vectors each,
 * or for channel-layout keys a per-page header of channel scales/minimums
 * followed by P packed code rows), so all heads of a layer share one slot
 * numbering. Tokens that are not encoded yet (the full-precision recent
 * window, or the open page of channel-layout keys) live in an f16 staging
 * block attached to their page. Slot metadata: position (-1 = free), state,
 * and (utility policy) the EMA score.
 *
 * Invariants: a page block exists iff the page has a valid or pending slot
 * or is the open channel page; every allocation is counted in the layer's
 * payload/metadata byte counters at the size it was allocated with.
 */
#ifndef KVQ_CACHE_IMPL_H
#define KVQ_CACHE_IMPL_H

#include "../codec/codec_impl.h"

#include <pthread.h>

enum { KVQ__FREE = 0, KVQ__ENC = 1, KVQ__PEND = 2, KVQ__INSTACK = 0x80 };
#define KVQ__STATE(x) ((x) & 0x7f)

typedef struct kvq__head {
    kvq_codec *kc, *vc; /* borrowed from the cache registry; kc NULL for channel keys */
    int kchan_bits;     /* channel layout: bits per key code (1..8), else 0 */
    size_t kbytes;      /* token layout: encoded key bytes; channel: code bytes per token */
    size_t vbytes;
    size_t k_off, v_off; /* offsets in the page block */
    size_t k_hdr;        /* channel layout: bytes of the per-page header (scales + mins) */
} kvq__head;

typedef struct kvq__page {
    uint8_t *block;  /* NULL when the page is not allocated */
    uint16_t *stage; /* f16 staging [K|V][head][slot][d], or NULL */
    uint32_t n_valid;   /* encoded + pending slots */
    uint32_t n_pending;
    uint32_t filled;    /* channel layout: slots handed out (sequential) */
    int encoded;        /* channel layout: keys of the page are encoded */
    uint64_t last_seq;  /* arrival index of the newest token placed in the page */
    int32_t min_pos;    /* lower bound of the positions in the page (exact until evictions) */
} kvq__page;

typedef struct kvq__layer {
    kvq__head *heads;
    int chan_mode; /* a head has channel-layout keys: those keys wait in f16 until the page is
                      full; everything else is encoded on arrival */
    size_t block_bytes, stage_bytes;
    kvq__page *pages;
    size_t n_pages; /* length of pages[] (allocated or not) */
    size_t pages_cap;
    int32_t *pos;
    uint8_t *state;
    float *score; /* utility policy only */
    uint32_t *free_stack;
    size_t n_free;
    size_t slots_cap; /* capacity of the per-slot arrays (multiple of P) */
    uint32_t *pend_slot; /* ring of pending slots in arrival order (token layout) */
    int32_t *pend_pos;
    size_t pend_head, pend_count, pend_cap;
    size_t open_page; /* channel layout: page being filled, or SIZE_MAX */
    float *center;    /* [heads][d] or NULL */
    int center_ready;
    size_t n_tokens;
    uint64_t appended;
    int32_t last_pos;
    int32_t sink_until; /* positions <= sink_until are sinks (when n_sinks_seen > 0) */
    size_t n_sinks_seen;
    uint64_t evicted, bytes_written, bytes_read, reencodes;
    size_t payload_bytes, meta_bytes, codec_meta_bytes, peak_bytes, pages_alloc;
} kvq__layer;

typedef struct kvq__work {
    float *qs, *sc, *sc2, *w, *w2, *acc, *accs, *m, *l, *cdot, *scratch, *outh;
    uint8_t *qpk, *qpf;
    uint8_t *cls;          /* slot classes of the current block */
    size_t *bpages;        /* pages of the current block */
    int *bne, *bnp;        /* their encoded / pending visible counts */
    int32_t *rqp;          /* query position of each row of the tile */
    uint64_t bytes_read;
} kvq__work;

struct kvq_cache {
    kvq_allocator alloc;
    kvq_cache_config cfg; /* copy; pointer fields other than allocator cleared */
    size_t L, H, QH, G, d, P;
    kvq_codec **codecs;
    uint8_t *codec_private; /* codecs[i] carries its own state: never shared */
    size_t n_codecs;
    kvq_codec *f16; /* staging codec */
    kvq__layer *layers;
    size_t budget; /* 0 = none */
    int budget_pending_ratio;
    float *rope_freq; /* rope_dims/2 */
    size_t rope_dims;
    kvq__work *work; /* one per thread */
    size_t n_threads;
    size_t max_qp, max_acc;
    size_t block_pages;                     /* pages per online-softmax block */
    size_t rows_max;                        /* query rows per tile (a multiple of G) */
    float (*exp_block)(float *x, size_t n, float m);
    size_t total_peak;
};

/* channel-layout key pages (cache_chan.c) */
size_t kvq__chan_header_bytes(size_t d);
size_t kvq__chan_row_bytes(size_t d, int bits);
/* Encodes rows[P][d] (only rows with valid[i] != 0 count for the ranges)
 * into hdr + codes. */
void kvq__chan_encode(uint8_t *area, size_t d, size_t P, int bits, const float *rows,
                      const uint8_t *valid);
void kvq__chan_decode_row(const uint8_t *area, size_t d, size_t P, int bits, size_t row,
                          float *out);
/* s[g*sstride + i] = <q_g, row_i> for i < P (q already scaled). */
void kvq__chan_score(const uint8_t *area, size_t d, size_t P, int bits, const float *q, size_t G,
                     float *s, size_t sstride);

#endif
