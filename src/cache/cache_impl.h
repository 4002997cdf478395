/*
 * cache_impl.h - internal layout of a kvq_cache.
 *
 * A layer owns an array of pages of P token slots. A page is one block
 * holding, for every KV head, a K area and a V area (P encoded vectors each,
 * or for channel-layout keys a per-page header of channel scales/minimums
 * followed by P packed code rows), so all heads of a layer share one slot
 * numbering. Slot metadata: position (-1 = free), state, and (utility
 * policy) the EMA score.
 *
 * Causal staging (cache_page.c): an append writes the K and V of lossy
 * codecs into an f16 staging block of their page (lossless f32/f16 codecs
 * are written to the block at once) and marks the slot PEND; the slot is
 * encoded ("settled") only by a later call: at the start of the next append
 * and at the end of an attend that reached the newest token, every pending
 * token but the newest R-1 (R = recent_window) is encoded. So the queries
 * of a chunk see the chunk exactly, and a decode step sees its own token
 * and the R-1 before it exactly. Channel-layout key pages are encoded as a
 * whole once full and settled (pg->encoded); until then their keys stay in
 * staging whatever the slot states say.
 *
 * Invariants: a page block exists iff the page has a valid slot or is the
 * open channel page; a staging block exists iff the page has a PEND slot or
 * unencoded channel keys; every allocation is counted in the layer's
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
    int ktiled, vtiled;  /* the K / V areas use their codec's tiled layout (codec_impl.h) */
    /* staging: keys / values of this head wait in f16 until settled (lossy
     * codecs and channel keys); their offsets in a page's staging block, in
     * uint16 units (SIZE_MAX when not staged) */
    int kstage, vstage;
    size_t ks_off, vs_off;
} kvq__head;

enum { KVQ__TIER_HOT = 0, KVQ__TIER_WARM = 1, KVQ__TIER_COLD = 2 };

typedef struct {
    float key;
    int32_t pos;
    uint32_t slot;
} kvq__cand;

typedef struct kvq__page {
    uint8_t *block;  /* NULL when the page is not allocated or is cold */
    uint16_t *stage; /* f16 staging [K|V][head][slot][d], or NULL */
    uint32_t n_valid;   /* encoded + pending slots */
    uint32_t n_pending;
    uint32_t filled;    /* channel layout: slots handed out (sequential) */
    int encoded;        /* channel layout: keys of the page are encoded */
    uint64_t last_seq;  /* arrival index of the newest token placed in the page */
    int32_t min_pos;    /* lower bound of the positions in the page (exact until evictions) */
    uint8_t tier;       /* KVQ__TIER_*: hot (primary arena), warm (warm arena, warm layout) or
                           cold (in the store; block NULL) */
    uint8_t cold_warm;  /* cold page written from the warm layout */
    uint8_t has_record; /* a record of this page's current block is in the store (cold_gen,
                           written from the layout cold_warm says): demoting it again only
                           drops the memory */
    uint8_t lost;       /* strict_tiers: the record was found lost (counted once) */
    uint32_t crc;       /* verify_tiers: CRC32C of the block when it was demoted */
    uint64_t cold_gen;  /* store key generation of the page's record */
    uint64_t record_epoch; /* store epoch when the record was last written or read */
    size_t record_bytes; /* size of that record */
} kvq__page;

typedef struct kvq__layer {
    kvq__head *heads;
    kvq__head *wheads;     /* layout of warm pages (a copy of heads without a warm codec) */
    size_t wblock_bytes;
    size_t tier_pages[3], tier_tokens[3];
    uint64_t tier_bytes_cold; /* bytes of this layer's records in the store */
    int chan_mode; /* a head has channel-layout keys (pages filled in order, encoded whole) */
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
    kvq__cand *evs;       /* eviction scratch (slots_cap entries): eviction never allocates */
    uint32_t *pend_slot; /* ring of staged slots in arrival order (stale entries: evicted) */
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
    uint8_t *qpk, *qpf, *qpw; /* prepared queries: hot K codec, f16 staging, warm K codec */
    float *accw;              /* accumulator in the warm V codec's domain */
    uint8_t *qtk, *qtw;       /* queries prepared for the tiled kernels (tprep): hot, warm K codec */
    uint8_t *qtf;             /* ... and for the f16 codec's tscore over ktt (NULL: no tprep) */
    /* an attend of several query tokens: the staged keys of the head being
     * worked, page kidx[p] of them tiled at ktt + kidx[p] * P * d (the f16
     * codec's tiled key layout, [d][P]), so that tiles of queries score
     * them with its tscore; NULL otherwise (set by kvq_cache_attend) */
    uint16_t *ktt;
    const int32_t *kidx;
    uint8_t *rows;            /* one page area gathered into rows (P * 4 * d bytes) */
    uint64_t tier_reads[3];
    uint8_t *cls, *vcls;   /* key / value slot classes of the current block */
    size_t *bpages;        /* pages of the current block */
    int *bne, *bnp;        /* their encoded / staged visible value counts */
    int32_t *rqp;          /* query position of each row of the tile */
    uint64_t bytes_read;
} kvq__work;

/* cache_pool.c: persistent attention workers (none when n = 0) */
typedef struct kvq__pool kvq__pool;
kvq_status kvq__pool_create(kvq__pool **out, const kvq_allocator *a, size_t n);
void kvq__pool_free(kvq__pool *p, const kvq_allocator *a);
/* Runs fn(arg, 0..n_jobs-1), each job once, on whichever thread claims it
 * (the caller claims too, so one thread may run several jobs one after the
 * other: a job must never wait for another); returns when every job is
 * done. */
void kvq__pool_run(kvq__pool *p, void (*fn)(void *arg, size_t job), void *arg, size_t n_jobs);

struct kvq_cache {
    kvq_allocator alloc;
    kvq__hpool *hpool; /* behind alloc (and warm_alloc) when the config gives none */
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
    kvq__work *work; /* one per thread; work[0].scratch also serves settling */
    kvq__pool *pool; /* n_threads - 1 attention workers, or NULL */
    size_t n_threads;  /* workers + 1 (the work scratch count) */
    size_t n_active;   /* threads an attend uses (kvq_cache_set_threads) */
    size_t max_qp, max_acc;
    size_t block_pages;                     /* pages per online-softmax block */
    size_t rows_max;                        /* query rows per tile (a multiple of G) */
    int (*page_softmax)(float *s, size_t ss, size_t nr, size_t n, float *m, float *l, float *f);
    /* the attention tokens received (utility scores, token_attn): kvq__attn_add */
    void (*attn_add)(float *a, const float *s, size_t ss, size_t nr, const float *m,
                     const float *inv, const int32_t *pos, const int32_t *rqp, size_t n);
    size_t total_peak;
    /* residency tiers */
    int tiers;                 /* some capacity is set */
    int warm_distinct;         /* warm pages use other codecs than hot ones */
    kvq_allocator warm_alloc;
    struct kvq_store *cold;
    /* a random 128-bit id from the OS (never the heap address: two processes
     * sharing a store may get the same one): the namespace of this cache's
     * records in the store; records carry cache_id, keys both halves */
    uint64_t cache_id, cache_id_hi;
    uint64_t gen;              /* record key generations */
    kvq_tier_stats ts;         /* counters (per-tier page/token/byte figures are recomputed) */
    char errbuf[256];          /* detail of the last failure (kvq_cache_last_error) */
};

static inline const kvq__head *kvq__page_heads(const kvq__layer *ly, const kvq__page *pg) {
    return pg->tier == KVQ__TIER_WARM || (pg->tier == KVQ__TIER_COLD && pg->cold_warm) ? ly->wheads
                                                                                      : ly->heads;
}

/* internals shared between the cache's files */
/* cache.c: creation, codec registry, layouts, workspaces */
kvq_status kvq__get_codec(kvq_cache *c, const char *spec, kvq_codec **out);
void kvq__layout_layer(kvq_cache *c, kvq__layer *ly);
kvq_status kvq__work_alloc(kvq_cache *c, kvq__work *w);
void kvq__work_free(kvq_cache *c, kvq__work *w);
void kvq__track_total_peak(kvq_cache *c);

/* cache_page.c: pages, slots and staging */
void kvq__layer_release(kvq_cache *c, kvq__layer *ly);
kvq_status kvq__grow_pages(kvq_cache *c, kvq__layer *ly, size_t n_pages);
/* Frees the page table and the per-slot arrays (pages_cap = slots_cap = 0). */
void kvq__free_tables(kvq_cache *c, kvq__layer *ly);
kvq_status kvq__page_alloc(kvq_cache *c, kvq__layer *ly, size_t p, int stage);
void kvq__page_install(kvq_cache *c, kvq__layer *ly, size_t p, uint8_t *block, uint16_t *stage);
void kvq__page_unalloc(kvq_cache *c, kvq__layer *ly, size_t p);
void kvq__maybe_free_page(kvq_cache *c, kvq__layer *ly, size_t p);
void kvq__maybe_free_stage(kvq_cache *c, kvq__layer *ly, size_t p);
void kvq__purge_free(kvq_cache *c, kvq__layer *ly, size_t p);
void kvq__push_free_slot(kvq__layer *ly, uint32_t slot);
void kvq__push_page_free(kvq_cache *c, kvq__layer *ly, size_t p);
/* Writes one token (k, v: [H][d]) into slot: staged parts into the page's
 * staging (the slot becomes PEND when it has any), the rest encoded. */
void kvq__put_token(kvq_cache *c, kvq__layer *ly, size_t slot, const float *k, const float *v);
/* Encodes every pending token but the newest max(R, 1) - 1 (with all,
 * every pending token), then the channel key pages that are full and
 * settled; frees staging that holds nothing more. Never fails. */
void kvq__settle(kvq_cache *c, kvq__layer *ly, int all);
/* The pending ring's capacity: a power of two >= need and >= R + 2, so
 * that it does not depend on the chunking once a chunk is settled; resize
 * keeps the entries (cap >= pend_count), all or nothing. */
size_t kvq__ring_cap(const kvq_cache *c, size_t need);
kvq_status kvq__ring_resize(kvq_cache *c, kvq__layer *ly, size_t cap);
/* A page's staged key / value rows of head hd: [P][d] f16 */
static inline uint16_t *kvq__stage_k(const kvq__page *pg, const kvq__head *hd) {
    return pg->stage + hd->ks_off;
}
static inline uint16_t *kvq__stage_v(const kvq__page *pg, const kvq__head *hd) {
    return pg->stage + hd->vs_off;
}

/* cache_attend.c: the newest token's query has attended (an attend, or
 * kvq_cache_observe_attention): its chunk is subject to the budget now (a
 * pending budget ratio is fixed, the layer evicted to the budget), and what
 * a next decode step would see encoded is encoded. Never fails. */
void kvq__newest_attended(kvq_cache *c, kvq__layer *ly);
/* cache_evict.c */
void kvq__evict_slot(kvq_cache *c, kvq__layer *ly, uint32_t slot);
/* Evicts down to target tokens by the policy, never the newest keep_new
 * tokens; sinks and the protected window shrink to fit the target. Never
 * fails. */
void kvq__evict_to(kvq_cache *c, kvq__layer *ly, size_t target, size_t keep_new);
/* "k=<spec>,v=<spec>;..." for the heads' codecs (cache_tier.c); returns the length. */
size_t kvq__heads_layout(const kvq_cache *c, const kvq__head *hs, char *buf, size_t n);
kvq__cand *kvq__sorted_tokens(const kvq_cache *c, const kvq__layer *ly, size_t *n);
/* Counts size bytes more of a layer's metadata (meta) or payload, and its peak. */
static inline void kvq__layer_count(kvq__layer *ly, size_t size, int meta) {
    if (meta)
        ly->meta_bytes += size;
    else
        ly->payload_bytes += size;
    if (ly->meta_bytes + ly->payload_bytes > ly->peak_bytes)
        ly->peak_bytes = ly->meta_bytes + ly->payload_bytes;
}
void *kvq__lalloc(kvq_cache *c, kvq__layer *ly, size_t size, int meta);
void kvq__lfree(kvq_cache *c, kvq__layer *ly, void *p, size_t size, int meta);
size_t kvq__block_codec_meta(const kvq_cache *c, const kvq__layer *ly);
/* Re-encodes the slots of page p that hold an encoded vector (with pend,
 * also pending ones) from codec `from` (slots of fb bytes at src) to `to`
 * (at dst), one vector at a time, each area in the layout its flag says. With err/ref (may be
 * NULL), adds the squared error of the new codes against the old values and
 * the squared norm of the old values. Returns the slots re-encoded. */
size_t kvq__reencode_slots(const kvq__layer *ly, size_t p, size_t P, int role, const kvq_codec *from,
                           int ftiled, const uint8_t *src, const kvq_codec *to, int ttiled,
                           uint8_t *dst, int pend, double *err, double *ref);

static inline int kvq__page_live(const kvq__page *pg) {
    return pg->block != NULL || pg->tier == KVQ__TIER_COLD;
}

/* cache_tier.c */
/* A copy of cold page p's block (caller frees with the cache allocator). */
kvq_status kvq__tier_peek(const kvq_cache *c, const kvq__layer *ly, size_t p, uint8_t **block);
kvq_status kvq__tier_before_attend(kvq_cache *c, size_t layer, int32_t qmax);
kvq_status kvq__tier_enforce(kvq_cache *c, size_t layer);
void kvq__tier_page_free(kvq_cache *c, kvq__layer *ly, size_t p); /* frees a warm/cold page's storage */
void *kvq__lalloc_tier(kvq_cache *c, kvq__layer *ly, size_t size, int warm);
void kvq__lfree_tier(kvq_cache *c, kvq__layer *ly, void *p, size_t size, int warm);

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
