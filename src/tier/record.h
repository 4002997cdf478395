/*
 * record.h - page records: the self-describing, checksummed byte form of one
 * cache page, as the tiers write it to a store (cold pages, snapshots). The
 * byte layout is fixed and little-endian; docs/record-format.md draws it.
 * Decoding never trusts its input: every length, range and the CRC32C are
 * checked before any view into the bytes is handed out.
 */
#ifndef KVQ_RECORD_H
#define KVQ_RECORD_H

#include "../common/common.h"

#define KVQ__RECORD_MAGIC "KVQR"
#define KVQ__RECORD_VERSION 2 /* 2: areas of tiled codecs in their tiled layout */
#define KVQ__RECORD_HEADER 64 /* fixed header; positions start here (4-aligned) */
#define KVQ__RECORD_MAX_PAGE_TOKENS 4096
#define KVQ__RECORD_MAX_HEADS 65536
#define KVQ__RECORD_MAX_LAYOUT 65535
#define KVQ__RECORD_N_STATES 3 /* slot states 0 free, 1 encoded, 2 pending (byte values 0..2) */

/* One page. Decoded records are views: every pointer points into the bytes
 * given to kvq__record_decode and lives as long as they do. */
typedef struct kvq__record {
    uint64_t cache_id;
    uint32_t layer;
    uint32_t page_tokens;     /* P, 1..4096 */
    uint32_t n_kv_heads;      /* 1..65536 */
    uint32_t head_dim;        /* 1..1024 */
    uint32_t n_tokens;        /* slots with a position >= 0 */
    int32_t pos_min, pos_max; /* over those slots; both -1 when n_tokens == 0 */
    uint64_t prefix_hash;
    const char *layout; /* codec specs of the page, given by the cache; printable ASCII,
                           not NUL-terminated; 0..65535 bytes */
    size_t layout_len;
    const int32_t *positions; /* [page_tokens], -1 = free slot */
    const uint8_t *states;    /* [page_tokens]; 0..2, 0 exactly on free slots */
    const uint8_t *block;     /* the page block, opaque */
    size_t block_len;
} kvq__record;

/* Bytes of the encoded record; 0 when the sizes overflow. */
size_t kvq__record_size(const kvq__record *r);

/* Encodes r into dst. KVQ_ERR_INVALID_ARG when r breaks a rule that decode
 * checks (so every encoded record decodes), KVQ_ERR_DST_TOO_SMALL when cap
 * is short. *written gets the size. */
kvq_status kvq__record_encode(const kvq__record *r, void *dst, size_t cap, size_t *written);

/* Validates len bytes as exactly one record and fills *out with its fields
 * and views into src. src must be 4-byte aligned (the positions view);
 * otherwise KVQ_ERR_INVALID_ARG. KVQ_ERR_VERSION for a record of another
 * format version, KVQ_ERR_CORRUPT for anything else wrong. On error *out is
 * untouched. */
kvq_status kvq__record_decode(const void *src, size_t len, kvq__record *out);

/* The same checks without views (any alignment): fills every field of *out
 * except positions and states, which are left NULL. */
kvq_status kvq__record_check(const void *src, size_t len, kvq__record *out);

#endif
