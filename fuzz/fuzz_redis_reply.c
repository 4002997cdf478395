/*
 * fuzz_redis_reply.c - libFuzzer target for the Redis store's handling of
 * what a server sends back (src/tier/store_redis.c): the framing checks and
 * caps, the hiredis reader and the interpretation of the replies to PING,
 * SET, GET, DEL and SCAN + STRLEN (a whole listing, or stats), run on fuzzed
 * bytes through kvq__redis_reply_eval (store_redis.h) as if a server had
 * sent them. Input: byte 0 picks the call (mod KVQ__RS_N_CALLS), byte 1 the
 * size of the pieces the bytes arrive in, the rest is what the server sent.
 * Properties, against oracles written here, not taken from the store:
 * - SET succeeds only when the bytes it read are exactly "+OK\r\n", PING
 *   only on "+PONG\r\n";
 * - GET succeeds only on "$N\r\n", N bytes, "\r\n", and returns those N
 *   bytes; KVQ_ERR_RANGE only on a nil ("$-1\r\n", "*-1\r\n"); a value
 *   announced larger than 1 GiB is KVQ_ERR_CORRUPT;
 * - DEL reads ":N\r\n": KVQ_OK when N >= 1, KVQ_ERR_RANGE when N == 0;
 * - a listed key has 1..1024 bytes and no NUL, and "kvq:fuzz:<key>" is in
 *   the bytes; stats count no more records than SCAN rounds could name;
 * - a failure has a message, and its status is one the call may return;
 *   bytes the framing let through are never refused by hiredis;
 * - a call never reads past the bytes it was given, and what it does with
 *   them does not depend on how they are cut into pieces (all at once, the
 *   piece size of byte 1, byte by byte for short inputs).
 * In a build without hiredis the target does nothing. tests/test_fuzz_replay.c
 * includes this file (KVQ_FUZZ_NO_ENTRY) to replay fuzz/corpus/redis_reply/.
 */
#include "tier/store_redis.h"

#include <stdlib.h>
#include <string.h>

/* 1 when b[0..n) is exactly s. */
static int kvq_fuzz_rr_is(const uint8_t *b, size_t n, const char *s) {
    return n == strlen(s) && memcmp(b, s, n) == 0;
}

/* Reads "<c>[-]digits\r\n" at b[0..n): 1 and *v, *len (bytes of the line)
 * when it is one with at most 18 digits and no leading zero ("0" itself,
 * never "-0"), the one form of a RESP number. */
static int kvq_fuzz_rr_number(const uint8_t *b, size_t n, char c, int neg_ok, long long *v,
                              size_t *len) {
    if (n < 4 || b[0] != c)
        return 0;
    size_t i = 1;
    int neg = 0;
    if (neg_ok && b[i] == '-') {
        neg = 1;
        i++;
    }
    size_t d0 = i;
    long long x = 0;
    while (i < n && b[i] >= '0' && b[i] <= '9' && i - d0 < 18)
        x = x * 10 + (b[i++] - '0');
    if (i == d0 || i + 1 >= n || b[i] != '\r' || b[i + 1] != '\n' ||
        (b[d0] == '0' && (i - d0 > 1 || neg)))
        return 0;
    *v = neg ? -x : x;
    *len = i + 2;
    return 1;
}

/* 1 when st is a status the call may return. */
static int kvq_fuzz_rr_status_ok(int call, kvq_status st) {
    switch (st) {
    case KVQ_OK:
    case KVQ_ERR_IO:
    case KVQ_ERR_CONN:
    case KVQ_ERR_NOMEM:
        return 1;
    case KVQ_ERR_NOSPACE: /* an OOM error reply */
        return call != KVQ__RS_PING;
    case KVQ_ERR_RANGE:
        return call == KVQ__RS_GET || call == KVQ__RS_DEL;
    case KVQ_ERR_CORRUPT: /* WRONGTYPE, a value over 1 GiB */
        return call == KVQ__RS_GET;
    default:
        return 0;
    }
}

/* 0 when one result keeps the properties on its own. */
static int kvq_fuzz_rr_check(int call, const uint8_t *b, size_t n, const kvq__rs_eval *e) {
    if (!kvq_fuzz_rr_status_ok(call, e->st) || e->consumed > n)
        return 1;
    if (e->st != KVQ_OK && e->st != KVQ_ERR_RANGE && !e->err[0])
        return 1;
    /* the framing never passes on what hiredis then refuses */
    if (e->reader_refused)
        return 1;
    size_t used = e->consumed;
    long long v = 0;
    size_t hl = 0;
    switch (call) {
    case KVQ__RS_PING:
        if ((e->st == KVQ_OK) != kvq_fuzz_rr_is(b, used, "+PONG\r\n"))
            return 1;
        break;
    case KVQ__RS_SET:
        if ((e->st == KVQ_OK) != kvq_fuzz_rr_is(b, used, "+OK\r\n"))
            return 1;
        break;
    case KVQ__RS_GET: {
        /* RESP2 has two nils; hiredis reads both as one */
        if ((e->st == KVQ_ERR_RANGE) !=
            (kvq_fuzz_rr_is(b, used, "$-1\r\n") || kvq_fuzz_rr_is(b, used, "*-1\r\n")))
            return 1;
        int num = kvq_fuzz_rr_number(b, n, '$', 0, &v, &hl);
        if (num && v > (1LL << 30) && e->st != KVQ_ERR_CORRUPT)
            return 1;
        if (e->st == KVQ_OK) {
            if (!num || !e->value || (long long)e->size != v || used != hl + e->size + 2 ||
                memcmp(b + hl, e->value, e->size) != 0 || b[used - 2] != '\r' ||
                b[used - 1] != '\n')
                return 1;
        } else if (e->value) {
            return 1;
        }
        break;
    }
    case KVQ__RS_DEL: {
        int num = kvq_fuzz_rr_number(b, used, ':', 1, &v, &hl) && hl == used;
        if ((e->st == KVQ_OK) != (num && v >= 1))
            return 1;
        if ((e->st == KVQ_ERR_RANGE) != (num && v == 0))
            return 1;
        break;
    }
    default: { /* LIST, STATS */
        static const char pre[] = "kvq:" KVQ__RS_EVAL_NS ":";
        size_t pl = sizeof pre - 1;
        for (size_t i = 0; i < e->keys.n; i++) {
            const char *k = e->keys.items[i].key;
            size_t kl = strlen(k);
            if (kl < 1 || kl > 1024)
                return 1;
            int found = 0;
            for (size_t j = 0; !found && j + pl + kl <= used; j++)
                found = memcmp(b + j, pre, pl) == 0 && memcmp(b + j + pl, k, kl) == 0;
            if (!found)
                return 1;
        }
        /* every record counted stands for a "kvq:fuzz:" key and its reply */
        if (call == KVQ__RS_STATS && e->st == KVQ_OK && e->m.records * (pl + 6) > used)
            return 1;
        if (call == KVQ__RS_LIST && e->st == KVQ_OK && e->batches == 0)
            return 1;
        break;
    }
    }
    return 0;
}

/* 1 when two runs on the same bytes did the same thing. */
static int kvq_fuzz_rr_same(const kvq__rs_eval *a, const kvq__rs_eval *b) {
    if (a->st != b->st || a->dropped != b->dropped || a->size != b->size ||
        (a->value == NULL) != (b->value == NULL) || a->keys.n != b->keys.n ||
        a->batches != b->batches || a->m.records != b->m.records ||
        a->m.live_bytes != b->m.live_bytes)
        return 0;
    if (a->st == KVQ_OK && a->consumed != b->consumed)
        return 0;
    if (a->value && a->size && memcmp(a->value, b->value, a->size) != 0)
        return 0;
    for (size_t i = 0; i < a->keys.n; i++)
        if (strcmp(a->keys.items[i].key, b->keys.items[i].key) != 0 ||
            a->keys.items[i].size != b->keys.items[i].size)
            return 0;
    return 1;
}

static int kvq_fuzz_redis_reply(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    int call = data[0] % KVQ__RS_N_CALLS;
    size_t piece = data[1] % 32; /* 0: all at once */
    const uint8_t *b = data + 2;
    size_t n = size - 2;
    size_t pieces[3] = {0, piece, 1};
    int runs = n <= 512 ? 3 : 2;
    kvq__rs_eval e[3];
    int bad = 0, done = 0;
    for (int i = 0; i < runs && !bad; i++) {
        kvq_status st = kvq__redis_reply_eval(call, b, n, pieces[i], &e[i]);
        if (st == KVQ_ERR_UNSUPPORTED) /* built without hiredis */
            break;
        done++;
        if (st != KVQ_OK) {
            bad = st != KVQ_ERR_NOMEM;
            break;
        }
        bad = kvq_fuzz_rr_check(call, b, n, &e[i]) || (i > 0 && !kvq_fuzz_rr_same(&e[0], &e[i]));
    }
    for (int i = 0; i < done; i++)
        kvq__rs_eval_free(&e[i]);
    return bad;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_redis_reply(data, size))
        abort();
    return 0;
}
#endif
