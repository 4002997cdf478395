/*
 * record.c - encoding and validating page records (see record.h and
 * docs/record-format.md). The encoder refuses any record the decoder would
 * reject, so a record that was written can always be read back; the decoder
 * checks every field, length and the CRC32C before it hands out views.
 */
#include "record.h"

#include <stdint.h>

/* Header field offsets. */
enum {
    R_MAGIC = 0,
    R_VERSION = 4,
    R_FLAGS = 6,
    R_CACHE_ID = 8,
    R_LAYER = 16,
    R_PAGE_TOKENS = 20,
    R_HEADS = 24,
    R_HEAD_DIM = 28,
    R_N_TOKENS = 32,
    R_POS_MIN = 36,
    R_POS_MAX = 40,
    R_LAYOUT_LEN = 44,
    R_PREFIX_HASH = 48,
    R_BLOCK_LEN = 56
};
_Static_assert(R_BLOCK_LEN + 8 == KVQ__RECORD_HEADER, "record header is 64 bytes");

/* Total size for the given variable parts; 0 on overflow. */
static size_t rec_total(uint64_t page_tokens, uint64_t layout_len, uint64_t block_len) {
    uint64_t fixed = KVQ__RECORD_HEADER + 5 * page_tokens + layout_len + 4;
    if (page_tokens > KVQ__RECORD_MAX_PAGE_TOKENS || layout_len > KVQ__RECORD_MAX_LAYOUT)
        return 0;
    if (block_len > (uint64_t)SIZE_MAX - fixed)
        return 0;
    return (size_t)(fixed + block_len);
}

/* The scalar header fields are in range. */
static int fields_ok(const kvq__record *r) {
    return r->page_tokens >= 1 && r->page_tokens <= KVQ__RECORD_MAX_PAGE_TOKENS &&
           r->head_dim >= 1 && r->head_dim <= KVQ__MAX_HEAD_DIM && r->n_kv_heads >= 1 &&
           r->n_kv_heads <= KVQ__RECORD_MAX_HEADS && r->n_tokens <= r->page_tokens &&
           r->layout_len <= KVQ__RECORD_MAX_LAYOUT;
}

static int layout_ok(const char *layout, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)layout[i] < 0x20 || (unsigned char)layout[i] > 0x7e)
            return 0;
    return 1;
}

/* The slot arrays agree with n_tokens, pos_min and pos_max. Positions come
 * from posn (native) or, when posn is NULL, little-endian bytes at posb. */
static int slots_ok(const kvq__record *r, const int32_t *posn, const uint8_t *posb,
                    const uint8_t *states) {
    uint32_t n = 0;
    int32_t lo = INT32_MAX, hi = -1;
    for (uint32_t i = 0; i < r->page_tokens; i++) {
        int32_t p = posn ? posn[i] : (int32_t)kvq__ld32(posb + 4 * (size_t)i);
        unsigned s = states[i]; /* the high bit is reserved: 0 */
        if (s >= KVQ__RECORD_N_STATES || p < -1 || (p == -1) != (s == 0))
            return 0;
        if (p >= 0) {
            n++;
            lo = p < lo ? p : lo;
            hi = p > hi ? p : hi;
        }
    }
    if (n != r->n_tokens)
        return 0;
    if (n == 0)
        return r->pos_min == -1 && r->pos_max == -1;
    return r->pos_min == lo && r->pos_max == hi;
}

size_t kvq__record_size(const kvq__record *r) {
    if (!r)
        return 0;
    return rec_total(r->page_tokens, r->layout_len, r->block_len);
}

kvq_status kvq__record_encode(const kvq__record *r, void *dst, size_t cap, size_t *written) {
    if (!r || !written || !fields_ok(r) || !r->positions || !r->states ||
        (r->layout_len && !r->layout) || (r->block_len && !r->block))
        return KVQ_ERR_INVALID_ARG;
    size_t total = kvq__record_size(r);
    if (total == 0 || !layout_ok(r->layout, r->layout_len) ||
        !slots_ok(r, r->positions, NULL, r->states))
        return KVQ_ERR_INVALID_ARG;
    if (!dst || cap < total)
        return KVQ_ERR_DST_TOO_SMALL;
    uint8_t *d = (uint8_t *)dst;
    memcpy(d + R_MAGIC, KVQ__RECORD_MAGIC, 4);
    kvq__st16(d + R_VERSION, KVQ__RECORD_VERSION);
    kvq__st16(d + R_FLAGS, 0);
    kvq__st64(d + R_CACHE_ID, r->cache_id);
    kvq__st32(d + R_LAYER, r->layer);
    kvq__st32(d + R_PAGE_TOKENS, r->page_tokens);
    kvq__st32(d + R_HEADS, r->n_kv_heads);
    kvq__st32(d + R_HEAD_DIM, r->head_dim);
    kvq__st32(d + R_N_TOKENS, r->n_tokens);
    kvq__st32(d + R_POS_MIN, (uint32_t)r->pos_min);
    kvq__st32(d + R_POS_MAX, (uint32_t)r->pos_max);
    kvq__st32(d + R_LAYOUT_LEN, (uint32_t)r->layout_len);
    kvq__st64(d + R_PREFIX_HASH, r->prefix_hash);
    kvq__st64(d + R_BLOCK_LEN, (uint64_t)r->block_len);
    uint8_t *p = d + KVQ__RECORD_HEADER;
    for (uint32_t i = 0; i < r->page_tokens; i++, p += 4)
        kvq__st32(p, (uint32_t)r->positions[i]);
    memcpy(p, r->states, r->page_tokens);
    p += r->page_tokens;
    if (r->layout_len)
        memcpy(p, r->layout, r->layout_len);
    p += r->layout_len;
    if (r->block_len)
        memcpy(p, r->block, r->block_len);
    p += r->block_len;
    kvq__st32(p, kvq__crc32c(0, d, total - 4));
    *written = total;
    return KVQ_OK;
}

kvq_status kvq__record_check(const void *src, size_t len, kvq__record *out) {
    if (!src || !out)
        return KVQ_ERR_INVALID_ARG;
    const uint8_t *s = (const uint8_t *)src;
    if (len < 6 || memcmp(s + R_MAGIC, KVQ__RECORD_MAGIC, 4) != 0)
        return KVQ_ERR_CORRUPT;
    if (kvq__ld16(s + R_VERSION) != KVQ__RECORD_VERSION)
        return KVQ_ERR_VERSION;
    if (len < KVQ__RECORD_HEADER + 4 || kvq__ld16(s + R_FLAGS) != 0)
        return KVQ_ERR_CORRUPT;
    kvq__record r;
    memset(&r, 0, sizeof r);
    r.cache_id = kvq__ld64(s + R_CACHE_ID);
    r.layer = kvq__ld32(s + R_LAYER);
    r.page_tokens = kvq__ld32(s + R_PAGE_TOKENS);
    r.n_kv_heads = kvq__ld32(s + R_HEADS);
    r.head_dim = kvq__ld32(s + R_HEAD_DIM);
    r.n_tokens = kvq__ld32(s + R_N_TOKENS);
    r.pos_min = (int32_t)kvq__ld32(s + R_POS_MIN);
    r.pos_max = (int32_t)kvq__ld32(s + R_POS_MAX);
    uint32_t layout_len = kvq__ld32(s + R_LAYOUT_LEN);
    r.prefix_hash = kvq__ld64(s + R_PREFIX_HASH);
    uint64_t block_len = kvq__ld64(s + R_BLOCK_LEN);
    /* Lengths first: nothing past len is read, and they must add up to len. */
    size_t total = rec_total(r.page_tokens, layout_len, block_len);
    if (total == 0 || total != len)
        return KVQ_ERR_CORRUPT;
    r.layout_len = layout_len;
    r.block_len = (size_t)block_len;
    if (!fields_ok(&r))
        return KVQ_ERR_CORRUPT;
    if (kvq__crc32c(0, s, len - 4) != kvq__ld32(s + len - 4))
        return KVQ_ERR_CORRUPT;
    const uint8_t *posb = s + KVQ__RECORD_HEADER;
    const uint8_t *states = posb + 4 * (size_t)r.page_tokens;
    const char *layout = (const char *)(states + r.page_tokens);
    if (!layout_ok(layout, r.layout_len) || !slots_ok(&r, NULL, posb, states))
        return KVQ_ERR_CORRUPT;
    r.layout = layout;
    r.block = (const uint8_t *)layout + r.layout_len;
    *out = r;
    return KVQ_OK;
}

kvq_status kvq__record_decode(const void *src, size_t len, kvq__record *out) {
    if (!src || !out)
        return KVQ_ERR_INVALID_ARG;
    if ((uintptr_t)src % 4 != 0)
        return KVQ_ERR_INVALID_ARG;
    kvq__record r;
    kvq_status st = kvq__record_check(src, len, &r);
    if (st != KVQ_OK)
        return st;
    const uint8_t *posb = (const uint8_t *)src + KVQ__RECORD_HEADER;
    r.positions = (const int32_t *)(const void *)posb;
    r.states = posb + 4 * (size_t)r.page_tokens;
    *out = r;
    return KVQ_OK;
}

kvq_status kvq_record_inspect(const void *data, size_t size, kvq_record_info *info) {
    if (!data || !info)
        return KVQ_ERR_INVALID_ARG;
    kvq__record r;
    kvq_status st = kvq__record_check(data, size, &r);
    if (st != KVQ_OK)
        return st;
    memset(info, 0, sizeof *info);
    info->version = KVQ__RECORD_VERSION;
    info->cache_id = r.cache_id;
    info->layer = r.layer;
    info->page_tokens = r.page_tokens;
    info->n_kv_heads = r.n_kv_heads;
    info->head_dim = r.head_dim;
    info->n_tokens = r.n_tokens;
    info->pos_min = r.pos_min;
    info->pos_max = r.pos_max;
    info->prefix_hash = r.prefix_hash;
    info->layout = r.layout;
    info->layout_len = r.layout_len;
    info->block_len = r.block_len;
    return KVQ_OK;
}
