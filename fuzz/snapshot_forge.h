/*
 * snapshot_forge.h - what a writer of a shared store can do to a snapshot,
 * for the fuzz targets and tests that play one: walk a snapshot manifest
 * (docs/record-format.md, version 3) and re-sign it, i.e. give it another
 * save id and the SHA-256 of the page records that are in the store now,
 * then a fresh CRC32C. A re-signed manifest passes every integrity check,
 * so what the loader refuses after that it refuses on the records' contents
 * alone. Static functions over the public API and src/common only.
 */
#ifndef KVQ_SNAPSHOT_FORGE_H
#define KVQ_SNAPSHOT_FORGE_H

#include "common/common.h"

#include <stdio.h>

#define KVQ_FORGE_HDR 24   /* "KVQM", version, text length, name length, save id */
#define KVQ_FORGE_LAYER 28 /* a layer section's header */
#define KVQ_FORGE_ENTRY 36 /* page index, SHA-256 of its record */

/* One page entry of a walked manifest. */
typedef struct {
    uint32_t layer, page;
    size_t off; /* of the entry in the manifest */
} kvq_forge_page;

/* Walks manifest m (n bytes) of a cache with n_kv_heads * head_dim centre
 * values per centred layer: calls fn for each page entry until it returns
 * non-zero. Returns the number of entries walked, or -1 when the bytes are
 * not a manifest as far as the walk needs. Version 2 (no name, save id or
 * digests: 12-byte header, 4-byte page entries) is walked too, so the tests
 * can show what the library before version 3 let through. */
static long kvq_forge_walk(const uint8_t *m, size_t n, size_t hd,
                           int (*fn)(void *ctx, const kvq_forge_page *pg), void *ctx) {
    if (n < 16 || memcmp(m, "KVQM", 4) != 0 || kvq__ld32(m + 4) < 2 || kvq__ld32(m + 4) > 3)
        return -1;
    int v2 = kvq__ld32(m + 4) == 2;
    if (!v2 && n < KVQ_FORGE_HDR + 4)
        return -1;
    size_t esz = v2 ? 4 : KVQ_FORGE_ENTRY;
    uint64_t at = v2 ? 12 + (uint64_t)kvq__ld32(m + 8)
                     : (uint64_t)KVQ_FORGE_HDR + kvq__ld32(m + 8) + kvq__ld32(m + 12),
             end = n - 4;
    long walked = 0;
    for (uint32_t l = 0; at < end; l++) {
        if (end - at < KVQ_FORGE_LAYER)
            return -1;
        uint32_t saved = kvq__ld32(m + at + 20), has_center = kvq__ld32(m + at + 24);
        at += KVQ_FORGE_LAYER + (has_center ? 4 * (uint64_t)hd : 0);
        if (at > end || (end - at) / esz < saved)
            return -1;
        for (uint32_t k = 0; k < saved; k++, at += esz, walked++) {
            kvq_forge_page pg = {l, kvq__ld32(m + at), (size_t)at};
            if (fn && fn(ctx, &pg))
                return walked + 1;
        }
    }
    return walked;
}

typedef struct {
    kvq_store *s;
    const char *name;
    uint8_t *m;
} kvq_forge_sign_ctx;

static int kvq_forge_sign_one(void *ctx, const kvq_forge_page *pg) {
    kvq_forge_sign_ctx *x = (kvq_forge_sign_ctx *)ctx;
    char key[300];
    snprintf(key, sizeof key, "%s/l%u/p%u", x->name, (unsigned)pg->layer, (unsigned)pg->page);
    void *d = NULL;
    size_t dn = 0;
    if (kvq_store_get(x->s, key, &d, &dn) == KVQ_OK) {
        kvq__sha256(d, dn, x->m + pg->off + 4);
        kvq_store_free_buf(x->s, d);
    }
    return 0;
}

/* Re-signs manifest m (n bytes) of snapshot name in s: save id `id` (when
 * set_id), each page entry's digest from the record in the store (entries
 * whose record is missing keep theirs), the CRC32C. Returns 0 when the walk
 * covered the manifest; otherwise only the CRC is recomputed (n >= 4). */
static int kvq_forge_resign(kvq_store *s, const char *name, uint8_t *m, size_t n, size_t hd,
                            int set_id, uint64_t id) {
    int rc = -1;
    if (n >= KVQ_FORGE_HDR + 4 && memcmp(m, "KVQM", 4) == 0 && kvq__ld32(m + 4) == 3) {
        if (set_id)
            kvq__st64(m + 16, id);
        kvq_forge_sign_ctx x = {s, name, m};
        rc = kvq_forge_walk(m, n, hd, kvq_forge_sign_one, &x) < 0 ? -1 : 0;
    }
    if (n >= 4)
        kvq__st32(m + n - 4, kvq__crc32c(0, m, n - 4));
    return rc;
}

#endif
