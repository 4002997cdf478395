/*
 * store.c - the public kvq_store calls: URL parsing and backend choice, the
 * argument checks every backend relies on, the per-store lock, the call
 * counters and the last-error message. Listing runs the user's callback
 * outside the lock, on batches of keys copied under it, so the callback may
 * call the store. Also the internal put/get variants of the cache's cold
 * tier (a time to live, the loss epoch: store_impl.h).
 */
#include "store_impl.h"
#include "store_ref.h"

#include <stdarg.h>
#include <stdio.h>

void kvq__store_err(kvq_store *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
}

kvq_status kvq__keylist_add(kvq__keylist *l, const char *key, size_t klen, size_t size) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        kvq__keyent *items = (kvq__keyent *)kvq__alloc(l->alloc, cap * sizeof *items);
        if (!items)
            return KVQ_ERR_NOMEM;
        if (l->n)
            memcpy(items, l->items, l->n * sizeof *items);
        kvq__free(l->alloc, l->items);
        l->items = items;
        l->cap = cap;
    }
    char *k = (char *)kvq__alloc(l->alloc, klen + 1);
    if (!k)
        return KVQ_ERR_NOMEM;
    memcpy(k, key, klen);
    k[klen] = 0;
    l->items[l->n].key = k;
    l->items[l->n].size = size;
    l->n++;
    return KVQ_OK;
}

void kvq__keylist_free(kvq__keylist *l) {
    for (size_t i = 0; i < l->n; i++)
        kvq__free(l->alloc, l->items[i].key);
    kvq__free(l->alloc, l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

static void copy_msg(char *dst, size_t n, const char *msg) {
    if (dst && n) {
        snprintf(dst, n, "%s", msg);
    }
}

kvq_status kvq_store_open(kvq_store **out, const char *url, const kvq_allocator *alloc,
                          char *err_msg, size_t err_msg_size) {
    if (out)
        *out = NULL;
    if (!out || !url || !*url) {
        copy_msg(err_msg, err_msg_size, "kvq_store_open: NULL or empty argument");
        return KVQ_ERR_INVALID_ARG;
    }
    kvq_allocator a;
    kvq__allocator_init(&a, alloc);
    kvq_store *s = (kvq_store *)kvq__calloc(&a, sizeof *s);
    if (!s) {
        copy_msg(err_msg, err_msg_size, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    s->alloc = a;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        kvq__free(&a, s);
        copy_msg(err_msg, err_msg_size, "cannot create the store's lock");
        return KVQ_ERR_NOMEM;
    }
    kvq_status st;
    if (strncmp(url, "redis://", 8) == 0) {
        st = kvq__store_open_redis(s, url);
    } else if (strncmp(url, "file:", 5) == 0) {
        /* file:DIR[?opt=v&...]: the path is everything before '?' */
        const char *path = url + 5;
        const char *q = strchr(path, '?');
        size_t plen = q ? (size_t)(q - path) : strlen(path);
        char *dir = (char *)kvq__alloc(&a, plen + 1);
        if (!dir) {
            st = KVQ_ERR_NOMEM;
            kvq__store_err(s, "out of memory");
        } else {
            memcpy(dir, path, plen);
            dir[plen] = 0;
            if (plen == 0) {
                st = KVQ_ERR_INVALID_ARG;
                kvq__store_err(s, "store URL '%s' has no directory", url);
            } else {
                st = kvq__store_open_file(s, dir, q ? q + 1 : NULL);
            }
            kvq__free(&a, dir);
        }
    } else if (strstr(url, "://")) {
        st = KVQ_ERR_INVALID_ARG;
        kvq__store_err(s, "unknown store URL '%s' (known: file:DIR, DIR, redis://HOST:PORT[/NS])",
                       url);
    } else {
        st = kvq__store_open_file(s, url, NULL);
    }
    if (st != KVQ_OK) {
        copy_msg(err_msg, err_msg_size, s->err[0] ? s->err : kvq_strerror(st));
        pthread_mutex_destroy(&s->mu);
        kvq__free(&a, s);
        return st;
    }
    s->err[0] = 0;
    *out = s;
    return KVQ_OK;
}

static void store_destroy(kvq_store *s) {
    s->ops->close(s);
    pthread_mutex_destroy(&s->mu);
    kvq_allocator a = s->alloc;
    kvq__free(&a, s);
}

/* A store still used as a cold store by caches is closed by the last of
 * them (kvq__store_release): closing is deferred, never an error, so a
 * kvq_cache_free after kvq_store_close still deletes its records. */
void kvq_store_close(kvq_store *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    int defer = s->refs > 0;
    s->closing = 1;
    pthread_mutex_unlock(&s->mu);
    if (!defer)
        store_destroy(s);
}

void kvq__store_retain(kvq_store *s) {
    pthread_mutex_lock(&s->mu);
    s->refs++;
    pthread_mutex_unlock(&s->mu);
}

void kvq__store_release(kvq_store *s) {
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    int last = --s->refs == 0 && s->closing;
    pthread_mutex_unlock(&s->mu);
    if (last)
        store_destroy(s);
}

/* The key's length, or 0 when it is not a valid key. */
static size_t key_len(const char *key) {
    if (!key)
        return 0;
    size_t n = strnlen(key, KVQ__STORE_MAX_KEY + 1);
    return n > KVQ__STORE_MAX_KEY ? 0 : n;
}

static kvq_status done(kvq_store *s, kvq_status st) {
    if (st != KVQ_OK && st != KVQ_ERR_RANGE)
        s->st.errors++;
    if (st != KVQ_OK && !s->err[0])
        kvq__store_err(s, "%s", kvq_strerror(st));
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void begin(kvq_store *s) {
    pthread_mutex_lock(&s->mu);
    s->err[0] = 0;
}

kvq_status kvq__store_put_ttl(kvq_store *s, const char *key, const void *data, size_t size,
                              uint64_t ttl_ms, uint64_t *epoch) {
    if (!s)
        return KVQ_ERR_INVALID_ARG;
    begin(s);
    size_t klen = key_len(key);
    if (klen == 0 || (size && !data)) {
        kvq__store_err(s, "put: the key must be 1..%d bytes and data non-NULL", KVQ__STORE_MAX_KEY);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    if (size > KVQ__STORE_MAX_VALUE) {
        kvq__store_err(s, "put: value of %zu bytes is larger than 1 GiB", size);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    kvq_status st = s->ops->put(s, key, klen, data, size, ttl_ms);
    if (st == KVQ_OK)
        s->st.puts++;
    if (epoch)
        *epoch = s->epoch;
    return done(s, st);
}

kvq_status kvq_store_put(kvq_store *s, const char *key, const void *data, size_t size) {
    return kvq__store_put_ttl(s, key, data, size, 0, NULL);
}

kvq_status kvq__store_get_ep(kvq_store *s, const char *key, void **data, size_t *size,
                             uint64_t *epoch) {
    if (!s)
        return KVQ_ERR_INVALID_ARG;
    begin(s);
    size_t klen = key_len(key);
    if (klen == 0 || !data || !size) {
        kvq__store_err(s, "get: the key must be 1..%d bytes, data and size non-NULL",
                       KVQ__STORE_MAX_KEY);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    void *d = NULL;
    size_t n = 0;
    kvq_status st = s->ops->get(s, key, klen, &d, &n);
    if (st == KVQ_OK) {
        s->st.gets++;
        *data = d;
        *size = n;
    } else if (st == KVQ_ERR_RANGE && !s->err[0]) {
        kvq__store_err(s, "no key '%.200s'", key);
    }
    if (epoch)
        *epoch = s->epoch;
    return done(s, st);
}

kvq_status kvq_store_get(kvq_store *s, const char *key, void **data, size_t *size) {
    return kvq__store_get_ep(s, key, data, size, NULL);
}

uint64_t kvq__store_epoch(kvq_store *s) {
    pthread_mutex_lock(&s->mu);
    if (s->ops->check_lost) {
        char keep[KVQ__STORE_ERR_SIZE]; /* not a call of its own: the last error stays */
        memcpy(keep, s->err, sizeof keep);
        s->ops->check_lost(s);
        memcpy(s->err, keep, sizeof keep);
    }
    uint64_t e = s->epoch;
    pthread_mutex_unlock(&s->mu);
    return e;
}

void kvq_store_free_buf(kvq_store *s, void *data) {
    if (s && data)
        kvq__free(&s->alloc, data);
}

kvq_status kvq_store_del(kvq_store *s, const char *key) {
    if (!s)
        return KVQ_ERR_INVALID_ARG;
    begin(s);
    size_t klen = key_len(key);
    if (klen == 0) {
        kvq__store_err(s, "del: the key must be 1..%d bytes", KVQ__STORE_MAX_KEY);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    kvq_status st = s->ops->del(s, key, klen);
    if (st == KVQ_OK)
        s->st.dels++;
    else if (st == KVQ_ERR_RANGE && !s->err[0])
        kvq__store_err(s, "no key '%.200s'", key);
    return done(s, st);
}

kvq_status kvq_store_list(kvq_store *s, const char *prefix,
                          int (*fn)(void *ctx, const char *key, size_t size), void *ctx) {
    if (!s)
        return KVQ_ERR_INVALID_ARG;
    if (!prefix)
        prefix = "";
    size_t plen = strnlen(prefix, KVQ__STORE_MAX_KEY + 1);
    if (!fn || plen > KVQ__STORE_MAX_KEY) {
        begin(s);
        kvq__store_err(s, "list: fn must be non-NULL and the prefix at most %d bytes",
                       KVQ__STORE_MAX_KEY);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    uint64_t cursor = 0;
    kvq__keylist batch = {&s->alloc, NULL, 0, 0};
    do {
        begin(s);
        kvq_status st = s->ops->scan(s, prefix, plen, &cursor, &batch);
        if (st != KVQ_OK) {
            kvq__keylist_free(&batch);
            return done(s, st);
        }
        pthread_mutex_unlock(&s->mu);
        for (size_t i = 0; i < batch.n; i++) {
            if (fn(ctx, batch.items[i].key, batch.items[i].size) != 0) {
                kvq__keylist_free(&batch);
                return KVQ_OK;
            }
        }
        kvq__keylist_free(&batch);
    } while (cursor != 0);
    return KVQ_OK;
}

kvq_status kvq_store_stats(kvq_store *s, kvq_store_metrics *out) {
    if (!s || !out)
        return KVQ_ERR_INVALID_ARG;
    begin(s);
    kvq_store_metrics st = s->st;
    kvq_status rc = s->ops->stats(s, &st);
    if (rc == KVQ_OK)
        *out = st;
    return done(s, rc);
}

const char *kvq_store_last_error(kvq_store *s) { return s ? s->err : ""; }

kvq_status kvq_store_inject_fault(kvq_store *s, int kind, long after) {
    if (!s)
        return KVQ_ERR_INVALID_ARG;
    begin(s);
    if (kind < KVQ_FAULT_NONE || kind > KVQ_FAULT_DISCONNECT || after < 0) {
        kvq__store_err(s, "inject_fault: unknown kind %d or negative count", kind);
        return done(s, KVQ_ERR_INVALID_ARG);
    }
    return done(s, s->ops->fault(s, kind, after));
}
