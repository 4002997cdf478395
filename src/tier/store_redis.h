/*
 * store_redis.h - a door into the Redis store's reply handling for its fuzz
 * target (fuzz/fuzz_redis_reply.c): runs one store call against reply bytes
 * held in memory instead of a server, through the same framing checks, caps,
 * hiredis reader and reply interpretation as a call over a socket. Needs no
 * hiredis header; in a build without hiredis it says KVQ_ERR_UNSUPPORTED.
 */
#ifndef KVQ_STORE_REDIS_H
#define KVQ_STORE_REDIS_H

#include "store_impl.h"

/* The store call whose replies the bytes are. */
enum {
    KVQ__RS_PING = 0,  /* the PING of kvq_store_open */
    KVQ__RS_SET = 1,   /* kvq_store_put of key "k", value "v" */
    KVQ__RS_GET = 2,   /* kvq_store_get of key "k" */
    KVQ__RS_DEL = 3,   /* kvq_store_del of key "k" */
    KVQ__RS_LIST = 4,  /* kvq_store_list: SCAN batches (each with its STRLENs) until cursor 0 */
    KVQ__RS_STATS = 5, /* kvq_store_stats */
    KVQ__RS_N_CALLS = 6
};

/* The namespace of the store the bytes are replies to: keys it can name
 * are "kvq:fuzz:<key>". */
#define KVQ__RS_EVAL_NS "fuzz"

typedef struct kvq__rs_eval {
    kvq_allocator alloc; /* malloc/free: value and keys come from it */
    kvq_status st;    /* what the call returned */
    char err[KVQ__STORE_ERR_SIZE]; /* its message ("" on success) */
    int dropped;      /* the call dropped its connection */
    int reader_refused; /* hiredis refused bytes the framing let through */
    size_t consumed;  /* bytes the call read */
    void *value;      /* GET: the value, NULL otherwise */
    size_t size;
    kvq__keylist keys;  /* LIST: the keys listed (with their sizes), in order */
    uint64_t batches;   /* LIST: SCAN batches done */
    kvq_store_metrics m; /* STATS: records and live_bytes */
} kvq__rs_eval;

/* Runs call (KVQ__RS_*) on the replies in bytes[0..n), handed over chunk
 * bytes at a time (chunk 0: all at once); bytes that end before the call
 * has every reply it waits for read as a closed connection. Fills *out
 * (release with kvq__rs_eval_free). KVQ_ERR_UNSUPPORTED without hiredis,
 * KVQ_ERR_INVALID_ARG for an unknown call, KVQ_ERR_NOMEM; else KVQ_OK with
 * the call's own status in out->st. */
kvq_status kvq__redis_reply_eval(int call, const uint8_t *bytes, size_t n, size_t chunk,
                                 kvq__rs_eval *out);
void kvq__rs_eval_free(kvq__rs_eval *e);

#endif
