/*
 * store_impl.h - the inside of a kvq_store: a small vtable of backends (the
 * file store in store_file.c, Redis in store_redis.c) behind the public
 * wrappers in store.c, which check arguments, take the store's lock, count
 * calls and keep the last error message. Also the segment-entry format and
 * scanner of the file store, shared with its fuzz target.
 */
#ifndef KVQ_STORE_IMPL_H
#define KVQ_STORE_IMPL_H

#include "../common/common.h"

#include <pthread.h>

#define KVQ__STORE_MAX_KEY 1024
#define KVQ__STORE_MAX_VALUE ((size_t)1 << 30)
#define KVQ__STORE_ERR_SIZE 256

/* A batch of listed keys; keys are owned copies. */
typedef struct kvq__keyent {
    char *key;
    size_t size;
} kvq__keyent;
typedef struct kvq__keylist {
    const kvq_allocator *alloc;
    kvq__keyent *items;
    size_t n, cap;
} kvq__keylist;
kvq_status kvq__keylist_add(kvq__keylist *l, const char *key, size_t klen, size_t size);
void kvq__keylist_free(kvq__keylist *l); /* frees everything, leaves an empty list */

/* Backend operations. Called with the store's lock held; keys are checked
 * (1..KVQ__STORE_MAX_KEY bytes) and klen is their length. On failure they
 * set the message with kvq__store_err. */
typedef struct kvq__store_ops {
    void (*close)(kvq_store *s);
    /* ttl_ms > 0: the value expires that long after the put (backends
     * without expiry ignore it; kvq__store_put_ttl documents which) */
    kvq_status (*put)(kvq_store *s, const char *key, size_t klen, const void *data, size_t size,
                      uint64_t ttl_ms);
    kvq_status (*get)(kvq_store *s, const char *key, size_t klen, void **data, size_t *size);
    kvq_status (*del)(kvq_store *s, const char *key, size_t klen);
    /* Appends one batch of keys starting with prefix to out. *cursor is 0 on
     * the first call and is 0 again after the last batch. */
    kvq_status (*scan)(kvq_store *s, const char *prefix, size_t plen, uint64_t *cursor,
                       kvq__keylist *out);
    /* Fills records, live_bytes, stored_bytes, segments. */
    kvq_status (*stats)(kvq_store *s, kvq_store_metrics *st);
    kvq_status (*fault)(kvq_store *s, int kind, long after);
    /* Looks for records lost behind the store's back (file store: segment
     * files removed from the directory), forgets them and bumps s->epoch.
     * NULL when the backend notices its losses otherwise (Redis: at a
     * reconnect). */
    void (*check_lost)(kvq_store *s);
} kvq__store_ops;

struct kvq_store {
    const kvq__store_ops *ops;
    kvq_allocator alloc;
    pthread_mutex_t mu;
    kvq_store_metrics st; /* counters; backends add bytes, torn, corrupt, compactions */
    /* Bumped by the backend whenever records may have vanished without a
     * del (a Redis reconnect: the server may have restarted without
     * persistence; a removed segment file). A record read or written at
     * epoch e is still there while the epoch is e, unless something the
     * store cannot see removed it (another client's DEL or FLUSHALL, Redis
     * eviction under maxmemory, its TTL). */
    uint64_t epoch;
    /* store_ref.h: caches holding the store as their cold store, and
     * whether kvq_store_close was called (closing waits for refs == 0) */
    size_t refs;
    int closing;
    char err[KVQ__STORE_ERR_SIZE];
    void *impl; /* the backend's state, owned by it */
};

/* ---- used by the cache's cold tier (cache_tier.c) ----
 * kvq_store_put / kvq_store_get that also return the store's epoch as it
 * was when the call ended (under the store's lock, so no loss can slip in
 * between), and put with a time to live: ttl_ms > 0 makes Redis expire the
 * record that long after the put (SET ... PX); the file store has no expiry
 * and keeps the record until it is deleted. */
kvq_status kvq__store_put_ttl(kvq_store *s, const char *key, const void *data, size_t size,
                              uint64_t ttl_ms, uint64_t *epoch);
kvq_status kvq__store_get_ep(kvq_store *s, const char *key, void **data, size_t *size,
                             uint64_t *epoch);
/* The epoch now, after looking for losses (check_lost). */
uint64_t kvq__store_epoch(kvq_store *s);

/* Sets s->err (printf-style). */
void kvq__store_err(kvq_store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Backend constructors: fill s->ops and s->impl, or set s->err and fail. */
kvq_status kvq__store_open_file(kvq_store *s, const char *dir, const char *options);
kvq_status kvq__store_open_redis(kvq_store *s, const char *url);

/* ---- file-store segment entries (docs/record-format.md) ----
 *   0  4  magic "KVQE"
 *   4  1  version (1)
 *   5  1  op: 1 put, 2 delete
 *   6  2  key length (1..1024)
 *   8  4  value length (0..1 GiB; 0 for delete)
 *  12  4  CRC32C of bytes 0..11, the key and the value
 *  16  4  CRC32C of bytes 0..15 (the header: lengths can be trusted)
 *  20     key, then value */
#define KVQ__SEG_MAGIC "KVQE"
#define KVQ__SEG_VERSION 1
#define KVQ__SEG_HDR 20
enum { KVQ__SEG_PUT = 1, KVQ__SEG_DEL = 2 };

typedef struct kvq__seg_hdr {
    int op;
    uint32_t klen, vlen;
    uint32_t crc; /* entry CRC */
} kvq__seg_hdr;

/* Fills hdr[KVQ__SEG_HDR] for an entry; crc is the entry CRC. */
void kvq__seg_hdr_write(uint8_t *hdr, int op, uint32_t klen, uint32_t vlen, uint32_t crc);
/* 1 when hdr is a well-formed header (magic, version, op, lengths, header
 * CRC); fills *h. */
int kvq__seg_hdr_read(const uint8_t *hdr, kvq__seg_hdr *h);

/* A positional reader over one segment: read fills buf with n bytes at off
 * (all within size) and returns 0, or -1 with errno set. */
typedef struct kvq__seg_reader {
    int (*read)(void *ctx, uint64_t off, void *buf, size_t n);
    void *ctx;
    uint64_t size;
} kvq__seg_reader;

/* One good entry found by the scanner; key points into scanner memory that
 * lives until the visit returns. */
typedef struct kvq__seg_entry {
    int op;
    uint64_t off, len; /* entry offset and total length in the segment */
    const char *key;
    uint32_t klen, vlen;
} kvq__seg_entry;

typedef struct kvq__seg_scan_result {
    uint64_t end;     /* offset after the last entry scanned (good or skipped) */
    uint64_t cut_at;  /* last segment: the torn tail starts here (== size when none) */
    int appendable;   /* last segment: appends may continue at cut_at */
    uint64_t torn;    /* torn tails found (0 or 1) */
    uint64_t corrupt; /* corrupt entries skipped, or an unreadable rest */
} kvq__seg_scan_result;

/* Scans one segment from offset 0: good entries go to visit (a non-zero
 * return stops the scan with KVQ_ERR_NOMEM); a corrupt entry whose header
 * is sound is skipped; a bad header stops the scan. In the last segment
 * (is_last) an incomplete entry, a checksum failure of the final entry or
 * a rest of zero bytes is a torn tail. Never reads outside [0, size).
 * KVQ_ERR_IO when the reader fails, KVQ_ERR_NOMEM. */
kvq_status kvq__seg_scan(const kvq__seg_reader *rd, int is_last, const kvq_allocator *alloc,
                         int (*visit)(void *ctx, const kvq__seg_entry *e), void *vctx,
                         kvq__seg_scan_result *res);

#endif
