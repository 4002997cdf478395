/*
 * fuzz_segment.c - libFuzzer target for the file store's segment scanner
 * (kvq__seg_scan in src/tier/store_file.c) over arbitrary bytes, as a last
 * segment and as an older one. Properties: no read outside the segment;
 * every entry handed to the visitor lies inside it, follows the previous
 * one, has a sound header and a matching CRC32C; the cut and end offsets
 * are within the segment. Each input is also tried with the header and entry
 * checksums of its plausible entries recomputed, so mutations get past them.
 * tests/test_fuzz_replay.c replays fuzz/corpus/segment/ through it.
 */
#include "tier/store_impl.h"
#include "fuzz_seg.h"

#include <stdlib.h>
#include <string.h>

typedef struct kvq_fuzz_mem {
    const uint8_t *p;
    uint64_t size;
    int bad;
} kvq_fuzz_mem;

static int kvq_fuzz_mem_read(void *ctx, uint64_t off, void *buf, size_t n) {
    kvq_fuzz_mem *m = (kvq_fuzz_mem *)ctx;
    if (off > m->size || n > m->size - off) {
        m->bad = 1;
        return -1;
    }
    memcpy(buf, m->p + off, n);
    return 0;
}

typedef struct kvq_fuzz_walk {
    kvq_fuzz_mem *m;
    uint64_t next_min; /* entries come in order, without overlap */
    int bad;
} kvq_fuzz_walk;

static int kvq_fuzz_visit(void *ctx, const kvq__seg_entry *e) {
    kvq_fuzz_walk *w = (kvq_fuzz_walk *)ctx;
    const uint8_t *p = w->m->p;
    kvq__seg_hdr h;
    if (e->off < w->next_min || e->off > w->m->size || e->len > w->m->size - e->off ||
        e->len != (uint64_t)KVQ__SEG_HDR + e->klen + e->vlen ||
        !kvq__seg_hdr_read(p + e->off, &h) || h.op != e->op || h.klen != e->klen ||
        h.vlen != e->vlen || memcmp(e->key, p + e->off + KVQ__SEG_HDR, e->klen) != 0) {
        w->bad = 1;
        return 0;
    }
    uint32_t crc = kvq__crc32c(0, p + e->off, 12);
    crc = kvq__crc32c(crc, p + e->off + KVQ__SEG_HDR, (size_t)e->len - KVQ__SEG_HDR);
    if (crc != h.crc)
        w->bad = 1;
    w->next_min = e->off + e->len;
    return 0;
}

static int kvq_fuzz_segment_once(const uint8_t *buf, size_t len) {
    kvq_allocator a;
    kvq__allocator_init(&a, NULL);
    for (int is_last = 0; is_last < 2; is_last++) {
        kvq_fuzz_mem m = {buf, len, 0};
        kvq__seg_reader rd = {kvq_fuzz_mem_read, &m, len};
        kvq_fuzz_walk w = {&m, 0, 0};
        kvq__seg_scan_result res;
        kvq_status st = kvq__seg_scan(&rd, is_last, &a, kvq_fuzz_visit, &w, &res);
        if (st != KVQ_OK || m.bad || w.bad || res.end > len || res.cut_at > len ||
            w.next_min > res.end || res.torn > 1 || (!is_last && res.torn))
            return 1;
        if (res.torn && res.cut_at != res.end)
            return 1;
    }
    return 0;
}

static int kvq_fuzz_segment(const uint8_t *data, size_t size) {
    uint8_t *buf = (uint8_t *)calloc(size ? size : 1, 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    int bad = kvq_fuzz_segment_once(buf, size);
    if (!bad) {
        kvq_fuzz_seg_fix(buf, size);
        bad = kvq_fuzz_segment_once(buf, size);
    }
    free(buf);
    return bad;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_segment(data, size))
        abort();
    return 0;
}
#endif
