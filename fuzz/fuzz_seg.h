/*
 * fuzz_seg.h - for fuzz targets over file-store segments: recomputes the
 * header and entry CRC32C of every entry whose lengths fit, walking from
 * offset 0, so mutations get past the checksums. Static, no library code.
 */
#ifndef KVQ_FUZZ_SEG_H
#define KVQ_FUZZ_SEG_H

#include "tier/store_impl.h"

static void kvq_fuzz_seg_fix(uint8_t *buf, size_t len) {
    size_t off = 0;
    while (len - off >= KVQ__SEG_HDR) {
        uint8_t *h = buf + off;
        uint32_t klen = kvq__ld16(h + 6), vlen = kvq__ld32(h + 8);
        uint64_t elen = (uint64_t)KVQ__SEG_HDR + klen + vlen;
        if (elen > len - off)
            break;
        uint32_t crc = kvq__crc32c(0, h, 12);
        crc = kvq__crc32c(crc, h + KVQ__SEG_HDR, (size_t)elen - KVQ__SEG_HDR);
        kvq__st32(h + 12, crc);
        kvq__st32(h + 16, kvq__crc32c(0, h, 16));
        off += (size_t)elen;
    }
}

#endif
