/*
 * fuzz_record.c - libFuzzer target for the page-record decoder
 * (src/tier/record.c). Property: decoding arbitrary bytes never reads out
 * of bounds and either fails with KVQ_ERR_CORRUPT / KVQ_ERR_VERSION or
 * yields a record that re-encodes to exactly the same bytes, on which
 * kvq_record_inspect agrees. Each input is tried twice: as given, and with
 * its trailing CRC32C recomputed so that mutations reach the checks behind
 * the checksum. tests/test_fuzz_replay.c includes this file (with
 * KVQ_FUZZ_NO_ENTRY) to replay fuzz/corpus/record/ in `make check`.
 */
#include "tier/record.h"

#include <stdlib.h>
#include <string.h>

/* 0 when the property holds for these len bytes (buf is 4-byte aligned). */
static int kvq_fuzz_record_once(const uint8_t *buf, size_t len) {
    kvq__record r;
    kvq_status st = kvq__record_decode(buf, len, &r);
    kvq_record_info info;
    kvq_status st2 = kvq_record_inspect(buf, len, &info);
    if (st != st2)
        return 1;
    if (st != KVQ_OK)
        return st == KVQ_ERR_CORRUPT || st == KVQ_ERR_VERSION ? 0 : 1;
    /* every view must lie inside buf (ASan checks the reads) */
    volatile uint64_t sink = 0;
    for (uint32_t i = 0; i < r.page_tokens; i++)
        sink += (uint64_t)(uint32_t)r.positions[i] + r.states[i];
    for (size_t i = 0; i < r.layout_len; i++)
        sink += (uint8_t)r.layout[i];
    for (size_t i = 0; i < r.block_len; i++)
        sink += r.block[i];
    (void)sink;
    if (info.layer != r.layer || info.n_tokens != r.n_tokens || info.pos_min != r.pos_min ||
        info.pos_max != r.pos_max || info.block_len != r.block_len ||
        info.layout_len != r.layout_len || info.prefix_hash != r.prefix_hash)
        return 1;
    size_t n = kvq__record_size(&r);
    if (n != len)
        return 1;
    uint8_t *out = (uint8_t *)malloc(n);
    if (!out)
        return 0;
    size_t w = 0;
    int bad = kvq__record_encode(&r, out, n, &w) != KVQ_OK || w != n || memcmp(out, buf, n) != 0;
    /* one byte short must be refused */
    if (!bad)
        bad = kvq__record_encode(&r, out, n - 1, &w) != KVQ_ERR_DST_TOO_SMALL;
    free(out);
    return bad;
}

static int kvq_fuzz_record(const uint8_t *data, size_t size) {
    uint8_t *buf = (uint8_t *)calloc(size ? size : 1, 1); /* aligned copy */
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    int bad = kvq_fuzz_record_once(buf, size);
    if (!bad && size >= 4) {
        kvq__st32(buf + size - 4, kvq__crc32c(0, buf, size - 4));
        bad = kvq_fuzz_record_once(buf, size);
    }
    free(buf);
    return bad;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_record(data, size))
        abort();
    return 0;
}
#endif
