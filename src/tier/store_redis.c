/*
 * store_redis.c - the Redis store, through hiredis: each key is the string
 * "kvq:<namespace>:<key>" holding the value's bytes unchanged (values carry
 * their own checksums when they are page records). Built only when the
 * Makefile finds hiredis (KVQ_HAVE_HIREDIS); otherwise opening a redis://
 * URL fails with KVQ_ERR_UNSUPPORTED.
 *
 * Connection handling: connect and command timeouts of 2 s. When a command
 * fails at the connection level (server down, restarted, timed out) the
 * connection is dropped and the call returns KVQ_ERR_CONN; the next call
 * connects again, once. Every connection after the first bumps the store's
 * epoch: the server may have restarted without its data. A put with a time
 * to live is one SET ... PX, so a record never exists without its expiry. SIGPIPE from writing to a closed socket is blocked
 * for the calling thread during a command and any pending one is consumed,
 * so the process's signal handling is left alone.
 */
#include "store_impl.h"

#ifndef KVQ_HAVE_HIREDIS

kvq_status kvq__store_open_redis(kvq_store *s, const char *url) {
    (void)url;
    kvq__store_err(s, "hiredis not found: the Redis store is disabled");
    return KVQ_ERR_UNSUPPORTED;
}

#else

#include <hiredis/hiredis.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

#define RS_TIMEOUT_S 2
#define RS_MAX_NS 64
#define RS_SCAN_COUNT "512"

typedef struct rs_store {
    redisContext *c; /* NULL when not connected */
    int connected_before; /* a connection was made before: the next one bumps the epoch */
    char host[256];
    int port;
    char ns[RS_MAX_NS + 1];
    char prefix[RS_MAX_NS + 6]; /* "kvq:<ns>:" */
    size_t prefix_len;
    long disconnect_after; /* -1 = no fault armed */
    int fault_write;       /* 0, or the status puts fail with once write_budget is spent */
    long write_budget;
    int fault_read; /* gets fail (KVQ_ERR_IO) once read_budget is spent */
    long read_budget;
} rs_store;

static rs_store *RS(kvq_store *s) { return (rs_store *)s->impl; }

static void rs_drop(rs_store *r) {
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
}

static kvq_status rs_connect(kvq_store *s, rs_store *r) {
    struct timeval tv = {RS_TIMEOUT_S, 0};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!c || c->err) {
        kvq__store_err(s, "redis %s:%d: cannot connect: %s", r->host, r->port,
                       c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return KVQ_ERR_CONN;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        kvq__store_err(s, "redis %s:%d: cannot set the command timeout", r->host, r->port);
        redisFree(c);
        return KVQ_ERR_CONN;
    }
    r->c = c;
    /* a new connection may be to a server that restarted and lost what it
     * held (no persistence): records read or written before are unproven */
    if (r->connected_before)
        s->epoch++;
    r->connected_before = 1;
    return KVQ_OK;
}

/* Runs n commands pipelined; replies[i] get the replies (free each with
 * freeReplyObject). On a connection failure every reply is NULL, the
 * connection is dropped and KVQ_ERR_CONN returned. */
static kvq_status rs_run(kvq_store *s, rs_store *r, size_t n, const int *argc,
                         const char *const *const *argv, const size_t *const *argvlen,
                         redisReply **replies) {
    for (size_t i = 0; i < n; i++)
        replies[i] = NULL;
    if (!r->c) {
        kvq_status st = rs_connect(s, r); /* the one reconnect of this call */
        if (st != KVQ_OK)
            return st;
    }
    if (r->disconnect_after >= 0) {
        if (r->disconnect_after == 0) {
            r->disconnect_after = -1;
            rs_drop(r);
            kvq__store_err(s, "redis %s:%d: connection dropped (injected fault)", r->host, r->port);
            return KVQ_ERR_CONN;
        }
        r->disconnect_after--;
    }
    sigset_t pipe_set, old_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    int was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++)
        ok = redisAppendCommandArgv(r->c, argc[i], (const char **)argv[i], argvlen[i]) == REDIS_OK;
    for (size_t i = 0; i < n && ok; i++) {
        void *rep = NULL;
        ok = redisGetReply(r->c, &rep) == REDIS_OK && rep != NULL;
        replies[i] = (redisReply *)rep;
    }
    if (!was_pending) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_set, NULL);
    if (!ok) {
        kvq__store_err(s, "redis %s:%d: %s", r->host, r->port,
                       r->c->errstr[0] ? r->c->errstr : "connection failed");
        for (size_t i = 0; i < n; i++) {
            if (replies[i])
                freeReplyObject(replies[i]);
            replies[i] = NULL;
        }
        rs_drop(r);
        return KVQ_ERR_CONN;
    }
    return KVQ_OK;
}

/* One command. */
static kvq_status rs_cmd(kvq_store *s, rs_store *r, int argc, const char **argv,
                         const size_t *argvlen, redisReply **reply) {
    const char *const *av[1] = {argv};
    const size_t *al[1] = {argvlen};
    return rs_run(s, r, 1, &argc, av, al, reply);
}

/* The full key "kvq:<ns>:<key>" in buf (not NUL-terminated); its length. */
static size_t full_key(rs_store *r, char *buf, const char *key, size_t klen) {
    memcpy(buf, r->prefix, r->prefix_len);
    memcpy(buf + r->prefix_len, key, klen);
    return r->prefix_len + klen;
}

static kvq_status error_reply(kvq_store *s, rs_store *r, const char *what, redisReply *rep) {
    kvq_status st = KVQ_ERR_IO;
    if (rep->type == REDIS_REPLY_ERROR && rep->str && strncmp(rep->str, "OOM", 3) == 0)
        st = KVQ_ERR_NOSPACE;
    kvq__store_err(s, "redis %s:%d: %s: %s", r->host, r->port, what,
                   rep->type == REDIS_REPLY_ERROR && rep->str ? rep->str : "unexpected reply");
    return st;
}

static kvq_status rs_put(kvq_store *s, const char *key, size_t klen, const void *data,
                         size_t size, uint64_t ttl_ms) {
    rs_store *r = RS(s);
    if (r->fault_write) {
        if ((long)size > r->write_budget) {
            r->write_budget = 0;
            kvq__store_err(s, "redis %s:%d: SET failed (injected %s)", r->host, r->port,
                           r->fault_write == KVQ_ERR_NOSPACE ? "full store" : "I/O error");
            return (kvq_status)r->fault_write;
        }
        r->write_budget -= (long)size;
    }
    char fk[RS_MAX_NS + 6 + KVQ__STORE_MAX_KEY];
    char ms[24];
    int ml = snprintf(ms, sizeof ms, "%llu", (unsigned long long)ttl_ms);
    /* SET key value [PX ms]: the expiry is set with the value, atomically */
    const char *argv[5] = {"SET", fk, size ? (const char *)data : "", "PX", ms};
    size_t argvlen[5] = {3, full_key(r, fk, key, klen), size, 2, (size_t)ml};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, ttl_ms ? 5 : 3, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rep->type != REDIS_REPLY_STATUS)
        st = error_reply(s, r, "SET", rep);
    else
        s->st.bytes_written += size;
    freeReplyObject(rep);
    return st;
}

static kvq_status rs_get(kvq_store *s, const char *key, size_t klen, void **data, size_t *size) {
    rs_store *r = RS(s);
    char fk[RS_MAX_NS + 6 + KVQ__STORE_MAX_KEY];
    const char *argv[2] = {"GET", fk};
    size_t argvlen[2] = {3, full_key(r, fk, key, klen)};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 2, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rep->type == REDIS_REPLY_NIL) {
        st = KVQ_ERR_RANGE;
    } else if (r->fault_read && (rep->type != REDIS_REPLY_STRING ||
                                 (long long)rep->len > (long long)r->read_budget)) {
        r->read_budget = 0;
        st = KVQ_ERR_IO;
        kvq__store_err(s, "redis %s:%d: GET '%.200s' failed (injected read error)", r->host,
                       r->port, key);
    } else if (rep->type == REDIS_REPLY_STRING && rep->len <= KVQ__STORE_MAX_VALUE) {
        size_t n = (size_t)rep->len;
        if (r->fault_read)
            r->read_budget -= (long)n;
        void *v = kvq__alloc(&s->alloc, n ? n : 1);
        if (!v) {
            st = KVQ_ERR_NOMEM;
        } else {
            if (n)
                memcpy(v, rep->str, n);
            *data = v;
            *size = n;
            s->st.bytes_read += n;
        }
    } else if (rep->type == REDIS_REPLY_ERROR) {
        /* e.g. WRONGTYPE: something else lives under our key */
        st = KVQ_ERR_CORRUPT;
        s->st.corrupt_skipped++;
        kvq__store_err(s, "redis %s:%d: GET '%.200s': %s", r->host, r->port, key,
                       rep->str ? rep->str : "error");
    } else {
        st = KVQ_ERR_CORRUPT;
        s->st.corrupt_skipped++;
        kvq__store_err(s, "redis %s:%d: GET '%.200s': not a string value", r->host, r->port, key);
    }
    freeReplyObject(rep);
    return st;
}

static kvq_status rs_del(kvq_store *s, const char *key, size_t klen) {
    rs_store *r = RS(s);
    char fk[RS_MAX_NS + 6 + KVQ__STORE_MAX_KEY];
    const char *argv[2] = {"DEL", fk};
    size_t argvlen[2] = {3, full_key(r, fk, key, klen)};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 2, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rep->type != REDIS_REPLY_INTEGER)
        st = error_reply(s, r, "DEL", rep);
    else if (rep->integer == 0)
        st = KVQ_ERR_RANGE;
    freeReplyObject(rep);
    return st;
}

/* One SCAN step over "kvq:<ns>:<prefix>*": calls add for every key found
 * (the part after "kvq:<ns>:") with its value size. */
static kvq_status
rs_scan_step(kvq_store *s, rs_store *r, const char *prefix, size_t plen, uint64_t *cursor,
             kvq_status (*add)(void *ctx, const char *key, size_t klen, size_t size), void *ctx) {
    /* the MATCH pattern, glob characters of the prefix escaped */
    char pat[RS_MAX_NS + 6 + 2 * KVQ__STORE_MAX_KEY + 2];
    size_t pl = r->prefix_len;
    memcpy(pat, r->prefix, pl);
    for (size_t i = 0; i < plen; i++) {
        char ch = prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            pat[pl++] = '\\';
        pat[pl++] = ch;
    }
    pat[pl++] = '*';
    char cur[24];
    int cl = snprintf(cur, sizeof cur, "%llu", (unsigned long long)*cursor);
    const char *argv[6] = {"SCAN", cur, "MATCH", pat, "COUNT", RS_SCAN_COUNT};
    size_t argvlen[6] = {4, (size_t)cl, 5, pl, 5, sizeof RS_SCAN_COUNT - 1};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 6, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING || rep->element[1]->type != REDIS_REPLY_ARRAY) {
        st = error_reply(s, r, "SCAN", rep);
        freeReplyObject(rep);
        return st;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long next = strtoull(rep->element[0]->str, &end, 10);
    if (errno != 0 || end == rep->element[0]->str) {
        kvq__store_err(s, "redis %s:%d: SCAN returned a bad cursor", r->host, r->port);
        freeReplyObject(rep);
        return KVQ_ERR_IO;
    }
    redisReply *keys = rep->element[1];
    size_t n = keys->elements;
    /* sizes: one pipelined STRLEN per key */
    redisReply **lens = NULL;
    int *argcs = NULL;
    const char *const **argvs = NULL;
    const size_t **argvlens = NULL;
    const char **args = NULL;
    size_t *arglens = NULL;
    if (n) {
        lens = (redisReply **)kvq__alloc(&s->alloc, n * sizeof *lens);
        argcs = (int *)kvq__alloc(&s->alloc, n * sizeof *argcs);
        argvs = (const char *const **)kvq__alloc(&s->alloc, n * sizeof *argvs);
        argvlens = (const size_t **)kvq__alloc(&s->alloc, n * sizeof *argvlens);
        args = (const char **)kvq__alloc(&s->alloc, 2 * n * sizeof *args);
        arglens = (size_t *)kvq__alloc(&s->alloc, 2 * n * sizeof *arglens);
        if (!lens || !argcs || !argvs || !argvlens || !args || !arglens) {
            st = KVQ_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            redisReply *k = keys->element[i];
            args[2 * i] = "STRLEN";
            arglens[2 * i] = 6;
            args[2 * i + 1] = k->type == REDIS_REPLY_STRING ? k->str : "";
            arglens[2 * i + 1] = k->type == REDIS_REPLY_STRING ? k->len : 0;
            argcs[i] = 2;
            argvs[i] = args + 2 * i;
            argvlens[i] = arglens + 2 * i;
        }
        st = rs_run(s, r, n, argcs, argvs, argvlens, lens);
        if (st != KVQ_OK)
            goto out;
        for (size_t i = 0; i < n && st == KVQ_OK; i++) {
            redisReply *k = keys->element[i];
            if (k->type != REDIS_REPLY_STRING || k->len <= r->prefix_len ||
                k->len - r->prefix_len > KVQ__STORE_MAX_KEY ||
                memcmp(k->str, r->prefix, r->prefix_len) != 0 || memchr(k->str, 0, k->len) != NULL)
                continue; /* not a key this store can name */
            if (lens[i]->type != REDIS_REPLY_INTEGER)
                continue; /* not a string value (WRONGTYPE): get() reports it */
            st = add(ctx, k->str + r->prefix_len, k->len - r->prefix_len,
                     (size_t)(lens[i]->integer > 0 ? lens[i]->integer : 0));
        }
        for (size_t i = 0; i < n; i++)
            freeReplyObject(lens[i]);
    }
    if (st == KVQ_OK)
        *cursor = next;
out:
    kvq__free(&s->alloc, arglens);
    kvq__free(&s->alloc, args);
    kvq__free(&s->alloc, argvlens);
    kvq__free(&s->alloc, argvs);
    kvq__free(&s->alloc, argcs);
    kvq__free(&s->alloc, lens);
    freeReplyObject(rep);
    return st;
}

static kvq_status add_to_list(void *ctx, const char *key, size_t klen, size_t size) {
    return kvq__keylist_add((kvq__keylist *)ctx, key, klen, size);
}

static kvq_status rs_scan(kvq_store *s, const char *prefix, size_t plen, uint64_t *cursor,
                          kvq__keylist *out) {
    return rs_scan_step(s, RS(s), prefix, plen, cursor, add_to_list, out);
}

typedef struct rs_count {
    uint64_t n, bytes;
} rs_count;

static kvq_status add_to_count(void *ctx, const char *key, size_t klen, size_t size) {
    (void)key;
    (void)klen;
    rs_count *c = (rs_count *)ctx;
    c->n++;
    c->bytes += size;
    return KVQ_OK;
}

static kvq_status rs_stats(kvq_store *s, kvq_store_metrics *st) {
    rs_count c = {0, 0};
    uint64_t cursor = 0;
    do {
        kvq_status rc = rs_scan_step(s, RS(s), "", 0, &cursor, add_to_count, &c);
        if (rc != KVQ_OK)
            return rc;
    } while (cursor != 0);
    st->records = c.n;
    st->live_bytes = c.bytes;
    st->stored_bytes = c.bytes;
    st->segments = 0;
    return KVQ_OK;
}

static kvq_status rs_fault(kvq_store *s, int kind, long after) {
    rs_store *r = RS(s);
    switch (kind) {
    case KVQ_FAULT_NONE:
        r->disconnect_after = -1;
        r->fault_write = r->fault_read = 0;
        return KVQ_OK;
    case KVQ_FAULT_DISCONNECT:
        r->disconnect_after = after;
        return KVQ_OK;
    case KVQ_FAULT_NOSPACE:
    case KVQ_FAULT_WRITE_IO:
        r->fault_write = kind == KVQ_FAULT_NOSPACE ? KVQ_ERR_NOSPACE : KVQ_ERR_IO;
        r->write_budget = after;
        return KVQ_OK;
    case KVQ_FAULT_READ:
        r->fault_read = 1;
        r->read_budget = after;
        return KVQ_OK;
    default:
        break;
    }
    kvq__store_err(s, "the Redis store has no fault of kind %d", kind);
    return KVQ_ERR_UNSUPPORTED;
}

static void rs_close(kvq_store *s) {
    rs_store *r = RS(s);
    rs_drop(r);
    kvq__free(&s->alloc, r);
}

static const kvq__store_ops rs_ops = {rs_close, rs_put,   rs_get,   rs_del,
                                      rs_scan,  rs_stats, rs_fault, NULL};

static int ns_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-' || ch == '.';
}

/* redis://HOST[:PORT][/NS] */
static kvq_status parse_url(kvq_store *s, rs_store *r, const char *url) {
    const char *p = url + 8;
    const char *slash = strchr(p, '/');
    const char *hp_end = slash ? slash : p + strlen(p);
    const char *colon = memchr(p, ':', (size_t)(hp_end - p));
    const char *h_end = colon ? colon : hp_end;
    size_t hl = (size_t)(h_end - p);
    if (hl == 0 || hl >= sizeof r->host) {
        kvq__store_err(s, "bad Redis URL '%s': want redis://HOST[:PORT][/NAMESPACE]", url);
        return KVQ_ERR_INVALID_ARG;
    }
    memcpy(r->host, p, hl);
    r->host[hl] = 0;
    r->port = 6379;
    if (colon) {
        long port = 0;
        const char *q = colon + 1;
        for (; q < hp_end && *q >= '0' && *q <= '9' && port <= 65535; q++)
            port = port * 10 + (*q - '0');
        if (q != hp_end || q == colon + 1 || port < 1 || port > 65535) {
            kvq__store_err(s, "bad port in Redis URL '%s'", url);
            return KVQ_ERR_INVALID_ARG;
        }
        r->port = (int)port;
    }
    const char *ns = slash && slash[1] ? slash + 1 : "default";
    size_t nl = strlen(ns);
    int ok = nl >= 1 && nl <= RS_MAX_NS;
    for (size_t i = 0; ok && i < nl; i++)
        ok = ns_char(ns[i]);
    if (!ok) {
        kvq__store_err(s, "bad namespace in Redis URL '%s' (1..%d of A-Z a-z 0-9 _ - .)", url,
                       RS_MAX_NS);
        return KVQ_ERR_INVALID_ARG;
    }
    memcpy(r->ns, ns, nl + 1);
    r->prefix_len = (size_t)snprintf(r->prefix, sizeof r->prefix, "kvq:%s:", r->ns);
    return KVQ_OK;
}

kvq_status kvq__store_open_redis(kvq_store *s, const char *url) {
    rs_store *r = (rs_store *)kvq__calloc(&s->alloc, sizeof *r);
    if (!r) {
        kvq__store_err(s, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    r->disconnect_after = -1;
    kvq_status st = parse_url(s, r, url);
    if (st == KVQ_OK)
        st = rs_connect(s, r);
    if (st == KVQ_OK) {
        const char *argv[1] = {"PING"};
        size_t argvlen[1] = {4};
        redisReply *rep;
        st = rs_cmd(s, r, 1, argv, argvlen, &rep);
        if (st == KVQ_OK) {
            if (rep->type != REDIS_REPLY_STATUS) {
                kvq__store_err(s, "redis %s:%d: PING: %s", r->host, r->port,
                               rep->type == REDIS_REPLY_ERROR && rep->str ? rep->str
                                                                          : "unexpected reply");
                st = KVQ_ERR_CONN;
            }
            freeReplyObject(rep);
        }
    }
    if (st != KVQ_OK) {
        rs_drop(r);
        kvq__free(&s->alloc, r);
        return st;
    }
    s->impl = r;
    s->ops = &rs_ops;
    return KVQ_OK;
}

#endif
