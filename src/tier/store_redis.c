/*
 * store_redis.c - the Redis store: each key is the string "kvq:<ns>:<key>"
 * holding the value's bytes unchanged (values carry their own checksums when
 * they are page records). Built only when the Makefile finds hiredis
 * (KVQ_HAVE_HIREDIS); otherwise opening a redis:// URL fails with
 * KVQ_ERR_UNSUPPORTED.
 *
 * Every byte that comes back from the server is untrusted. hiredis makes
 * the connection and turns reply bytes into redisReply objects; the socket
 * itself is driven here, with poll(), so that:
 * - Every call has one deadline for all of its work: connecting, sending
 *   each command, every byte of every reply, every SCAN round. It is
 *   timeout_ms from the URL ("redis://HOST:PORT/NS?timeout_ms=N", 1 ms to
 *   1 h), RS_DEFAULT_TIMEOUT_MS (5 s) when absent. No wait goes past it,
 *   however slowly a server dribbles its bytes: a call past its deadline
 *   fails with KVQ_ERR_CONN ("GET: timed out after 301 ms (timeout_ms=300)
 *   waiting for the reply") and drops its connection, which is out of step;
 *   the next call connects again. For kvq_store_list the deadline covers the
 *   store's own time in all the SCAN rounds of one listing together, not
 *   the time spent in the caller's callback. Name resolution (getaddrinfo,
 *   inside hiredis) is the one step outside it.
 * - Reply bytes are framed here (rs_frame) before hiredis sees them, against
 *   caps: a GET value of at most KVQ__STORE_MAX_VALUE (1 GiB, the largest
 *   value a put accepts), any other bulk string of at most RS_MAX_ITEM
 *   (64 KiB), status and error lines of at most RS_MAX_LINE (4 KiB),
 *   RS_MAX_ELEMENTS (65536) array elements in one reply, arrays nested at
 *   most two deep (SCAN's reply), RS_MAX_REPLY (32 MiB) for any reply but
 *   GET's, RESP2 type bytes only and plain decimal lengths. A GET value
 *   announced larger than 1 GiB is KVQ_ERR_CORRUPT (what is under the key
 *   is no kvq value, as with WRONGTYPE); any other breach is KVQ_ERR_IO. In
 *   both cases the call fails when the offending header arrives, without
 *   waiting for the bytes it announces, and the connection is dropped.
 * - Replies must be ones the command can get: SET succeeds on the status
 *   "OK" only and PING on "PONG"; another status (+QUEUED: a transaction
 *   kvq never opened), a reply of a type the command never gets, or bytes
 *   the server sent unasked fail the call with KVQ_ERR_IO quoting what came
 *   and drop the connection. Error replies keep it: WRONGTYPE on a GET is
 *   KVQ_ERR_CORRUPT (another kind of value lives under the key), OOM is
 *   KVQ_ERR_NOSPACE, any other error KVQ_ERR_IO.
 * - A SCAN walk (a listing, kvq_store_stats) ends: a cursor that comes back
 *   (Brent's cycle check, with constant memory: a Redis SCAN cursor moves
 *   forward through the table and never repeats within a walk) fails it
 *   with KVQ_ERR_IO, as does a walk of more than RS_MAX_ROUNDS rounds.
 *
 * When a call fails at the connection level (server down, restarted, timed
 * out, closed) it returns KVQ_ERR_CONN with the connection dropped; the next
 * call connects again, once. A connection that has bytes nobody asked for or
 * has been closed by the server when a call starts is dropped and made
 * anew. Every connection after the first bumps the store's epoch: the
 * server may have restarted without its data. A put with a time to live is
 * one SET ... PX, so a record never exists without its expiry. Commands are
 * sent with MSG_NOSIGNAL: a closed socket raises no SIGPIPE.
 */
#include "store_redis.h"

#ifndef KVQ_HAVE_HIREDIS

kvq_status kvq__store_open_redis(kvq_store *s, const char *url) {
    (void)url;
    kvq__store_err(s, "hiredis not found: the Redis store is disabled");
    return KVQ_ERR_UNSUPPORTED;
}

kvq_status kvq__redis_reply_eval(int call, const uint8_t *bytes, size_t n, size_t chunk,
                                 kvq__rs_eval *out) {
    (void)call;
    (void)bytes;
    (void)n;
    (void)chunk;
    if (out)
        memset(out, 0, sizeof *out);
    return KVQ_ERR_UNSUPPORTED;
}

void kvq__rs_eval_free(kvq__rs_eval *e) { (void)e; }

#else

#include <hiredis/hiredis.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* where it is missing, SO_NOSIGPIPE is set on the socket */
#endif

#define RS_DEFAULT_TIMEOUT_MS 5000L
#define RS_MAX_TIMEOUT_MS 3600000L
#define RS_MAX_NS 64
#define RS_SCAN_COUNT "512"
#define RS_MAX_LINE 4096                     /* bytes of a status or error line */
#define RS_MAX_ITEM 65536                    /* bytes of a bulk string other than a GET value */
#define RS_MAX_REPLY ((uint64_t)32 << 20)    /* bytes of any reply but GET's */
#define RS_MAX_GET_REPLY (KVQ__STORE_MAX_VALUE + 64) /* "$<len>\r\n", the value, "\r\n" */
#define RS_MAX_ELEMENTS 65536                /* array elements of one reply, all arrays together */
#define RS_MAX_DEPTH 2                       /* arrays in arrays: SCAN's [cursor, [keys]] */
/* A SCAN round returns after COUNT (512) keys or 10 x COUNT buckets, so a
 * walk of a table of under 2^32 keys takes fewer than 2^24 rounds. */
#define RS_MAX_ROUNDS ((uint64_t)1 << 24)
#define RS_WALKS 16       /* listings of one store whose walk state is kept at once */
#define RS_CHUNK 16384    /* bytes read from the socket at a time */
#define RS_COPY_MAX 4096  /* arguments up to this size are copied into the request */
#define RS_IOV_MAX 64     /* iovecs per sendmsg */

/* ---- framing: the reply stream checked before hiredis parses it ---- */

enum { RF_TYPE, RF_LINE, RF_BULK, RF_CR, RF_LF };

typedef struct rs_frame {
    uint64_t max_bulk, max_reply; /* this call's caps */
    int get;                      /* GET's reply: a bulk string over max_bulk is a foreign value */
    int state;                    /* RF_*: what the next byte is */
    char type;                    /* of the line being read */
    int cr;                       /* the last byte of the line was '\r' */
    size_t line_len;              /* content bytes of the line so far */
    char num[24];                 /* the first of them, for the numbers of ':', '$', '*' */
    uint64_t bulk_left;           /* bulk string bytes still to come (RF_BULK) */
    int depth;                    /* open arrays */
    uint64_t left[RS_MAX_DEPTH];  /* elements still to come in each */
    uint64_t bytes, elements;     /* of the reply being read */
    size_t done;                  /* whole replies framed */
    kvq_status st;                /* on a breach: KVQ_ERR_IO or KVQ_ERR_CORRUPT, and why */
    char why[128];
} rs_frame;

static void rf_init(rs_frame *f, int get) {
    memset(f, 0, sizeof *f);
    f->get = get;
    f->max_bulk = get ? KVQ__STORE_MAX_VALUE : RS_MAX_ITEM;
    f->max_reply = get ? RS_MAX_GET_REPLY : RS_MAX_REPLY;
    f->state = RF_TYPE;
}

__attribute__((format(printf, 3, 4))) static long rf_fail(rs_frame *f, kvq_status st,
                                                          const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
    f->st = st;
    return -1;
}

/* The number of the line, in the one form hiredis reads (string2ll): "0",
 * or digits without a leading zero ('-' first when signed_ok), at most 18
 * of them. 0 when the line is not one. */
static int rf_decimal(const rs_frame *f, int signed_ok, long long *v) {
    size_t i = 0, n = f->line_len;
    int neg = 0;
    if (n > 0 && f->num[0] == '-' && signed_ok) {
        neg = 1;
        i = 1;
    }
    if (i == n || n - i > 18 || (f->num[i] == '0' && (n - i > 1 || neg)))
        return 0;
    long long x = 0;
    for (; i < n; i++) {
        if (f->num[i] < '0' || f->num[i] > '9')
            return 0;
        x = x * 10 + (f->num[i] - '0');
    }
    *v = neg ? -x : x;
    return 1;
}

static int rf_is_nil(const rs_frame *f) {
    return f->line_len == 2 && f->num[0] == '-' && f->num[1] == '1';
}

/* One item is complete: close the arrays it completes. */
static void rf_item_done(rs_frame *f) {
    f->state = RF_TYPE;
    while (f->depth > 0) {
        if (--f->left[f->depth - 1] > 0)
            return;
        f->depth--;
    }
    f->done++;
    f->bytes = 0;
    f->elements = 0;
}

/* A line ended (its content in num / line_len). */
static long rf_line(rs_frame *f) {
    long long v = 0;
    switch (f->type) {
    case ':':
        if (!rf_decimal(f, 1, &v))
            return rf_fail(f, KVQ_ERR_IO, "an integer that is not a decimal number");
        break;
    case '$':
        if (rf_is_nil(f))
            break;
        if (!rf_decimal(f, 0, &v))
            return rf_fail(f, KVQ_ERR_IO, "a bulk string length that is not a decimal number");
        if ((uint64_t)v > f->max_bulk) {
            if (f->get)
                return rf_fail(f, KVQ_ERR_CORRUPT,
                               "a value of %lld bytes announced, more than any value a store "
                               "holds (%llu)",
                               v, (unsigned long long)f->max_bulk);
            return rf_fail(f, KVQ_ERR_IO, "a bulk string of %lld bytes announced (at most %llu)",
                           v, (unsigned long long)f->max_bulk);
        }
        f->bulk_left = (uint64_t)v;
        f->state = v ? RF_BULK : RF_CR;
        return 0;
    case '*':
        if (rf_is_nil(f))
            break;
        if (!rf_decimal(f, 0, &v))
            return rf_fail(f, KVQ_ERR_IO, "an array length that is not a decimal number");
        if (v == 0)
            break;
        if (f->depth == RS_MAX_DEPTH)
            return rf_fail(f, KVQ_ERR_IO, "arrays nested more than %d deep", RS_MAX_DEPTH);
        f->elements += (uint64_t)v;
        if (f->elements > RS_MAX_ELEMENTS)
            return rf_fail(f, KVQ_ERR_IO, "arrays of more than %d elements in one reply",
                           RS_MAX_ELEMENTS);
        f->left[f->depth++] = (uint64_t)v;
        f->state = RF_TYPE;
        return 0;
    default: /* '+' and '-': text */
        break;
    }
    rf_item_done(f);
    return 0;
}

static void rf_text(rs_frame *f, char ch) {
    if (f->line_len < sizeof f->num)
        f->num[f->line_len] = ch;
    f->line_len++;
}

static long rf_too_big(rs_frame *f) {
    return rf_fail(f, KVQ_ERR_IO, "a reply of more than %llu bytes",
                   (unsigned long long)f->max_reply);
}

/* Frames len bytes of the reply stream, stopping at the end of the reply
 * that makes f->done reach want: returns the bytes taken (the rest belongs
 * to later replies), or -1 when the bytes break a rule (f->st, f->why). */
static long rf_feed(rs_frame *f, const char *buf, size_t len, size_t want) {
    size_t i = 0;
    while (i < len && f->done < want) {
        if (f->state == RF_BULK) {
            uint64_t take = KVQ__MIN(f->bulk_left, (uint64_t)(len - i));
            i += (size_t)take;
            f->bulk_left -= take;
            f->bytes += take;
            if (f->bytes > f->max_reply)
                return rf_too_big(f);
            if (f->bulk_left == 0)
                f->state = RF_CR;
            continue;
        }
        char c = buf[i++];
        if (++f->bytes > f->max_reply)
            return rf_too_big(f);
        switch (f->state) {
        case RF_TYPE:
            if (c != '+' && c != '-' && c != ':' && c != '$' && c != '*')
                return rf_fail(f, KVQ_ERR_IO, "a reply type byte 0x%02x", (unsigned)(uint8_t)c);
            f->type = c;
            f->state = RF_LINE;
            f->line_len = 0;
            f->cr = 0;
            break;
        case RF_LINE: {
            if (f->cr && c == '\n') {
                if (rf_line(f) < 0)
                    return -1;
                break;
            }
            if (f->cr) /* a '\r' not followed by '\n' is text, as hiredis reads it */
                rf_text(f, '\r');
            f->cr = c == '\r';
            if (!f->cr)
                rf_text(f, c);
            size_t max = f->type == '+' || f->type == '-' ? RS_MAX_LINE : 20;
            if (f->line_len > max)
                return rf_fail(f, KVQ_ERR_IO, "a '%c' line of more than %zu bytes", f->type, max);
            break;
        }
        case RF_CR:
            if (c != '\r')
                return rf_fail(f, KVQ_ERR_IO, "a bulk string longer than announced");
            f->state = RF_LF;
            break;
        default: /* RF_LF */
            if (c != '\n')
                return rf_fail(f, KVQ_ERR_IO, "a bulk string longer than announced");
            rf_item_done(f);
            break;
        }
    }
    return (long)i;
}

/* ---- the store ---- */

/* One SCAN walk of a listing, kept between its batches (kvq_store_list
 * hands back the Redis cursor; the walk is found again by it). */
typedef struct rs_walk {
    uint64_t cursor;  /* where the walk goes on from; 0: a free slot */
    uint64_t rounds;
    int64_t spent;    /* ns spent in its rounds */
    uint64_t mark;    /* Brent: a cursor seen earlier; coming back to it is a loop */
    uint64_t power, lam;
    uint64_t used;    /* when it was kept (the oldest slot is reused) */
} rs_walk;

typedef struct rs_store {
    redisContext *c;  /* NULL when not connected */
    redisReader *rd;  /* this connection's replies, NULL with it */
    int connected_before; /* a connection was made before: the next one bumps the epoch */
    char host[256];
    int port;
    char ns[RS_MAX_NS + 1];
    char prefix[RS_MAX_NS + 6]; /* "kvq:<ns>:" */
    size_t prefix_len;
    long timeout_ms;
    int64_t call_start, call_spent, deadline; /* ns, CLOCK_MONOTONIC */
    const char *what; /* the command of the call, for messages */
    char pend[RS_CHUNK]; /* bytes read past the replies asked for */
    size_t pend_off, pend_len;
    rs_walk walks[RS_WALKS];
    uint64_t walk_clock;
    /* replies from memory instead of a socket (kvq__redis_reply_eval) */
    const uint8_t *mem;
    size_t mem_len, mem_pos, mem_chunk;
    unsigned long drops; /* connections dropped */
    unsigned long reader_refused; /* framed replies hiredis would not read (never, if framing is right) */
    long disconnect_after; /* -1 = no fault armed */
    int fault_write;       /* 0, or the status puts fail with once write_budget is spent */
    long write_budget;
    int fault_read; /* gets fail (KVQ_ERR_IO) once read_budget is spent */
    long read_budget;
} rs_store;

static rs_store *RS(kvq_store *s) { return (rs_store *)s->impl; }

static int64_t rs_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A call starts: its deadline is timeout_ms after now, less what the walk
 * it continues has spent already. */
static void rs_begin(rs_store *r, const char *what, int64_t spent) {
    r->what = what;
    r->call_start = rs_now();
    r->call_spent = spent;
    r->deadline = r->call_start - spent + (int64_t)r->timeout_ms * 1000000;
}

/* Milliseconds to the deadline, rounded up; 0 once it has passed. */
static int rs_left_ms(const rs_store *r) {
    int64_t left = r->deadline - rs_now();
    if (left <= 0)
        return 0;
    int64_t ms = (left + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static kvq_status rs_timed_out(kvq_store *s, rs_store *r, const char *doing) {
    long long ms = (long long)((rs_now() - r->call_start + r->call_spent) / 1000000);
    kvq__store_err(s, "redis %s:%d: %s: timed out after %lld ms (timeout_ms=%ld) %s", r->host,
                   r->port, r->what, ms, r->timeout_ms, doing);
    return KVQ_ERR_CONN;
}

static void rs_drop(rs_store *r) {
    if (r->c) {
        redisFree(r->c);
        r->c = NULL;
    }
    if (r->rd) {
        redisReaderFree(r->rd);
        r->rd = NULL;
    }
    r->pend_off = r->pend_len = 0;
    r->drops++;
}

static kvq_status rs_connect(kvq_store *s, rs_store *r) {
    int ms = rs_left_ms(r);
    if (ms == 0)
        return rs_timed_out(s, r, "connecting");
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!c || c->err) {
        kvq_status st = KVQ_ERR_CONN;
        if (c && rs_left_ms(r) == 0)
            st = rs_timed_out(s, r, "connecting");
        else
            kvq__store_err(s, "redis %s:%d: cannot connect: %s", r->host, r->port,
                           c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return st;
    }
#if defined(SO_NOSIGPIPE)
    int one = 1;
    setsockopt(c->fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    r->rd = redisReaderCreate();
    if (!r->rd) {
        redisFree(c);
        kvq__store_err(s, "redis %s:%d: out of memory", r->host, r->port);
        return KVQ_ERR_NOMEM;
    }
    r->c = c;
    /* a new connection may be to a server that restarted and lost what it
     * held (no persistence): records read or written before are unproven */
    if (r->connected_before)
        s->epoch++;
    r->connected_before = 1;
    return KVQ_OK;
}

/* Before a command: a connection, in step (nothing unread on it). */
static kvq_status rs_ready(kvq_store *s, rs_store *r) {
    if (r->mem) {
        if (!r->rd)
            r->rd = redisReaderCreate();
        return r->rd ? KVQ_OK : KVQ_ERR_NOMEM;
    }
    if (r->c) {
        /* bytes nobody asked for, a close by the server or an error:
         * this connection is done, make a new one */
        struct pollfd p = {r->c->fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 0)
            rs_drop(r);
    }
    return r->c ? KVQ_OK : rs_connect(s, r);
}

/* Waits until the socket is ready for events, within the deadline. */
static kvq_status rs_wait(kvq_store *s, rs_store *r, short events, const char *doing) {
    for (;;) {
        int ms = rs_left_ms(r);
        if (ms == 0)
            return rs_timed_out(s, r, doing);
        struct pollfd p = {r->c->fd, events, 0};
        int k = poll(&p, 1, ms);
        if (k > 0)
            return KVQ_OK; /* ready, or an error or hang-up that the next call reports */
        if (k < 0 && errno != EINTR) {
            kvq__store_err(s, "redis %s:%d: %s: poll: %s", r->host, r->port, r->what,
                           strerror(errno));
            return KVQ_ERR_CONN;
        }
    }
}

/* Sends the iovecs (changed on the way). */
static kvq_status rs_send(kvq_store *s, rs_store *r, struct iovec *iov, size_t n) {
    if (r->mem)
        return KVQ_OK;
    size_t i = 0;
    while (i < n) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        kvq_status st = rs_wait(s, r, POLLOUT, "sending the command");
        if (st != KVQ_OK)
            return st;
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov + i;
        m.msg_iovlen = KVQ__MIN(n - i, (size_t)RS_IOV_MAX);
        ssize_t k = sendmsg(r->c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            kvq__store_err(s, "redis %s:%d: %s: %s", r->host, r->port, r->what, strerror(errno));
            return KVQ_ERR_CONN;
        }
        size_t left = (size_t)k;
        while (left > 0) {
            if (left >= iov[i].iov_len) {
                left -= iov[i].iov_len;
                i++;
            } else {
                iov[i].iov_base = (char *)iov[i].iov_base + left;
                iov[i].iov_len -= left;
                left = 0;
            }
        }
    }
    return KVQ_OK;
}

/* Up to cap more reply bytes into buf: their count, 0 when the server
 * closed the connection, -1 on a failure (*st and the message set). */
static long rs_pull(kvq_store *s, rs_store *r, char *buf, size_t cap, kvq_status *st) {
    if (r->mem) {
        size_t k = KVQ__MIN(r->mem_len - r->mem_pos, cap);
        if (r->mem_chunk)
            k = KVQ__MIN(k, r->mem_chunk);
        if (k)
            memcpy(buf, r->mem + r->mem_pos, k);
        r->mem_pos += k;
        return (long)k;
    }
    for (;;) {
        *st = rs_wait(s, r, POLLIN, "waiting for the reply");
        if (*st != KVQ_OK)
            return -1;
        ssize_t k = recv(r->c->fd, buf, cap, MSG_DONTWAIT);
        if (k >= 0)
            return (long)k;
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            kvq__store_err(s, "redis %s:%d: %s: %s", r->host, r->port, r->what, strerror(errno));
            *st = KVQ_ERR_CONN;
            return -1;
        }
    }
}

/* Reads the next want replies into rep[] (GET's caps when get). On failure
 * every rep[i] is NULL and the caller drops the connection. */
static kvq_status rs_read(kvq_store *s, rs_store *r, int get, size_t want, redisReply **rep) {
    rs_frame f;
    rf_init(&f, get);
    char buf[RS_CHUNK];
    size_t got = 0;
    kvq_status st = KVQ_OK;
    while (got < want) {
        void *x = NULL;
        if (redisReaderGetReply(r->rd, &x) != REDIS_OK) {
            r->reader_refused += r->rd->err != REDIS_ERR_OOM;
            st = r->rd->err == REDIS_ERR_OOM ? KVQ_ERR_NOMEM : KVQ_ERR_IO;
            kvq__store_err(s, "redis %s:%d: %s: bad reply: %s", r->host, r->port, r->what,
                           r->rd->errstr);
            goto fail;
        }
        if (x) {
            rep[got++] = (redisReply *)x;
            continue;
        }
        if (f.done > got) { /* framed whole, yet hiredis wants more: never so */
            r->reader_refused++;
            st = KVQ_ERR_IO;
            kvq__store_err(s, "redis %s:%d: %s: the reply reader lost step", r->host, r->port,
                           r->what);
            goto fail;
        }
        const char *in;
        long k;
        if (r->pend_len) {
            in = r->pend + r->pend_off;
            k = (long)r->pend_len;
        } else {
            k = rs_pull(s, r, buf, sizeof buf, &st);
            if (k < 0)
                goto fail;
            if (k == 0) {
                st = KVQ_ERR_CONN;
                kvq__store_err(s, "redis %s:%d: %s: the connection closed before the reply was whole",
                               r->host, r->port, r->what);
                goto fail;
            }
            in = buf;
        }
        long used = rf_feed(&f, in, (size_t)k, want);
        if (used < 0) {
            st = f.st;
            if (st == KVQ_ERR_CORRUPT)
                s->st.corrupt_skipped++;
            kvq__store_err(s, "redis %s:%d: %s: refused reply: %s", r->host, r->port, r->what,
                           f.why);
            goto fail;
        }
        if (redisReaderFeed(r->rd, in, (size_t)used) != REDIS_OK) {
            st = KVQ_ERR_NOMEM;
            kvq__store_err(s, "redis %s:%d: %s: out of memory", r->host, r->port, r->what);
            goto fail;
        }
        if (in == buf) {
            r->pend_off = 0;
            r->pend_len = (size_t)(k - used);
            if (r->pend_len)
                memcpy(r->pend, buf + used, r->pend_len);
        } else {
            r->pend_off += (size_t)used;
            r->pend_len -= (size_t)used;
        }
    }
    return KVQ_OK;
fail:
    for (size_t i = 0; i < got; i++) {
        freeReplyObject(rep[i]);
        rep[i] = NULL;
    }
    return st;
}

/* The RESP bytes of n commands: arguments up to RS_COPY_MAX bytes are
 * copied into *bufp, larger ones are pointed at. */
static kvq_status rs_request(kvq_store *s, size_t n, const int *argc,
                             const char *const *const *argv, const size_t *const *argvlen,
                             char **bufp, struct iovec **iovp, size_t *niovp) {
    size_t bytes = 0, niov = 1;
    for (size_t i = 0; i < n; i++) {
        bytes += 24;
        for (int j = 0; j < argc[i]; j++) {
            bytes += 26;
            if (argvlen[i][j] <= RS_COPY_MAX)
                bytes += argvlen[i][j];
            else
                niov += 2;
        }
    }
    char *buf = (char *)kvq__alloc(&s->alloc, bytes);
    struct iovec *iov = (struct iovec *)kvq__alloc(&s->alloc, niov * sizeof *iov);
    if (!buf || !iov) {
        kvq__free(&s->alloc, buf);
        kvq__free(&s->alloc, iov);
        kvq__store_err(s, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    size_t pos = 0, seg = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        pos += (size_t)snprintf(buf + pos, bytes - pos, "*%d\r\n", argc[i]);
        for (int j = 0; j < argc[i]; j++) {
            size_t len = argvlen[i][j];
            pos += (size_t)snprintf(buf + pos, bytes - pos, "$%zu\r\n", len);
            if (len <= RS_COPY_MAX) {
                if (len)
                    memcpy(buf + pos, argv[i][j], len);
                pos += len;
            } else {
                iov[k].iov_base = buf + seg;
                iov[k++].iov_len = pos - seg;
                iov[k].iov_base = (void *)argv[i][j];
                iov[k++].iov_len = len;
                seg = pos;
            }
            memcpy(buf + pos, "\r\n", 2);
            pos += 2;
        }
    }
    iov[k].iov_base = buf + seg;
    iov[k++].iov_len = pos - seg;
    *bufp = buf;
    *iovp = iov;
    *niovp = k;
    return KVQ_OK;
}

/* Runs n commands pipelined within the call's deadline; replies[i] get the
 * replies (free each with freeReplyObject). On failure every reply is NULL,
 * and the connection is dropped unless nothing was sent. */
static kvq_status rs_run(kvq_store *s, rs_store *r, int get, size_t n, const int *argc,
                         const char *const *const *argv, const size_t *const *argvlen,
                         redisReply **replies) {
    for (size_t i = 0; i < n; i++)
        replies[i] = NULL;
    if (!r->mem && rs_left_ms(r) == 0) /* a listing that has spent its time */
        return rs_timed_out(s, r, "before sending the command");
    kvq_status st = rs_ready(s, r); /* the one (re)connect of this call */
    if (st != KVQ_OK)
        return st;
    if (r->disconnect_after >= 0) {
        if (r->disconnect_after == 0) {
            r->disconnect_after = -1;
            rs_drop(r);
            kvq__store_err(s, "redis %s:%d: connection dropped (injected fault)", r->host, r->port);
            return KVQ_ERR_CONN;
        }
        r->disconnect_after--;
    }
    char *buf = NULL;
    struct iovec *iov = NULL;
    size_t niov = 0;
    st = rs_request(s, n, argc, argv, argvlen, &buf, &iov, &niov);
    if (st != KVQ_OK)
        return st;
    st = rs_send(s, r, iov, niov);
    kvq__free(&s->alloc, iov);
    kvq__free(&s->alloc, buf);
    if (st == KVQ_OK)
        st = rs_read(s, r, get, n, replies);
    if (st == KVQ_OK && r->pend_len && !r->mem) {
        st = KVQ_ERR_IO;
        kvq__store_err(s, "redis %s:%d: %s: the server sent more than the %zu replies asked for",
                       r->host, r->port, r->what, n);
        for (size_t i = 0; i < n; i++) {
            freeReplyObject(replies[i]);
            replies[i] = NULL;
        }
    }
    if (st != KVQ_OK)
        rs_drop(r);
    return st;
}

/* One command. */
static kvq_status rs_cmd(kvq_store *s, rs_store *r, int get, int argc, const char **argv,
                         const size_t *argvlen, redisReply **reply) {
    const char *const *av[1] = {argv};
    const size_t *al[1] = {argvlen};
    return rs_run(s, r, get, 1, &argc, av, al, reply);
}

/* ---- replies: what each command may get ---- */

/* Text from the server, printable and cut, for a message. */
static const char *rs_quote(char *dst, size_t cap, const char *src, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        unsigned char ch = (unsigned char)src[i];
        dst[k++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (k < n && k + 3 < cap) {
        memcpy(dst + k, "...", 3);
        k += 3;
    }
    dst[k] = 0;
    return dst;
}

static int rs_is_status(const redisReply *rep, const char *want) {
    size_t n = strlen(want);
    return rep->type == REDIS_REPLY_STATUS && rep->len == n && memcmp(rep->str, want, n) == 0;
}

/* A reply this command never gets from a Redis server: the connection is
 * out of step, drop it. */
static kvq_status rs_unexpected(kvq_store *s, rs_store *r, redisReply *rep) {
    char q[72], d[96];
    switch (rep->type) {
    case REDIS_REPLY_STATUS:
        snprintf(d, sizeof d, "the status '%s'", rs_quote(q, sizeof q, rep->str, rep->len));
        break;
    case REDIS_REPLY_INTEGER:
        snprintf(d, sizeof d, "the integer %lld", rep->integer);
        break;
    case REDIS_REPLY_ARRAY:
        snprintf(d, sizeof d, "an array of %zu", (size_t)rep->elements);
        break;
    case REDIS_REPLY_NIL:
        snprintf(d, sizeof d, "nil");
        break;
    case REDIS_REPLY_STRING:
        snprintf(d, sizeof d, "a string of %zu bytes", (size_t)rep->len);
        break;
    default:
        snprintf(d, sizeof d, "a reply of type %d", rep->type);
        break;
    }
    kvq__store_err(s, "redis %s:%d: %s: unexpected reply: %s", r->host, r->port, r->what, d);
    rs_drop(r);
    return KVQ_ERR_IO;
}

/* An error reply (the connection stays): OOM is a full store. */
static kvq_status rs_error_reply(kvq_store *s, rs_store *r, redisReply *rep) {
    char q[160];
    kvq__store_err(s, "redis %s:%d: %s: %s", r->host, r->port, r->what,
                   rs_quote(q, sizeof q, rep->str, rep->len));
    return rep->len >= 3 && memcmp(rep->str, "OOM", 3) == 0 ? KVQ_ERR_NOSPACE : KVQ_ERR_IO;
}

/* The full key "kvq:<ns>:<key>" in buf (not NUL-terminated); its length. */
static size_t full_key(rs_store *r, char *buf, const char *key, size_t klen) {
    memcpy(buf, r->prefix, r->prefix_len);
    memcpy(buf + r->prefix_len, key, klen);
    return r->prefix_len + klen;
}

static kvq_status rs_ping(kvq_store *s, rs_store *r) {
    const char *argv[1] = {"PING"};
    size_t argvlen[1] = {4};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 0, 1, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (!rs_is_status(rep, "PONG")) {
        if (rep->type == REDIS_REPLY_ERROR)
            rs_error_reply(s, r, rep); /* e.g. NOAUTH */
        else
            rs_unexpected(s, r, rep);
        st = KVQ_ERR_CONN;
    }
    freeReplyObject(rep);
    return st;
}

static kvq_status rs_put(kvq_store *s, const char *key, size_t klen, const void *data,
                         size_t size, uint64_t ttl_ms) {
    rs_store *r = RS(s);
    rs_begin(r, "SET", 0);
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
    kvq_status st = rs_cmd(s, r, 0, ttl_ms ? 5 : 3, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rs_is_status(rep, "OK"))
        s->st.bytes_written += size;
    else if (rep->type == REDIS_REPLY_ERROR)
        st = rs_error_reply(s, r, rep);
    else
        st = rs_unexpected(s, r, rep); /* +QUEUED and the like: not stored */
    freeReplyObject(rep);
    return st;
}

static kvq_status rs_get(kvq_store *s, const char *key, size_t klen, void **data, size_t *size) {
    rs_store *r = RS(s);
    rs_begin(r, "GET", 0);
    char fk[RS_MAX_NS + 6 + KVQ__STORE_MAX_KEY];
    const char *argv[2] = {"GET", fk};
    size_t argvlen[2] = {3, full_key(r, fk, key, klen)};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 1, 2, argv, argvlen, &rep);
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
    } else if (rep->type == REDIS_REPLY_ERROR && rep->len >= 9 &&
               memcmp(rep->str, "WRONGTYPE", 9) == 0) {
        /* something else lives under our key */
        char q[160];
        st = KVQ_ERR_CORRUPT;
        s->st.corrupt_skipped++;
        kvq__store_err(s, "redis %s:%d: GET '%.200s': %s", r->host, r->port, key,
                       rs_quote(q, sizeof q, rep->str, rep->len));
    } else if (rep->type == REDIS_REPLY_ERROR) {
        st = rs_error_reply(s, r, rep); /* LOADING, BUSY...: may pass */
    } else {
        st = rs_unexpected(s, r, rep);
    }
    freeReplyObject(rep);
    return st;
}

static kvq_status rs_del(kvq_store *s, const char *key, size_t klen) {
    rs_store *r = RS(s);
    rs_begin(r, "DEL", 0);
    char fk[RS_MAX_NS + 6 + KVQ__STORE_MAX_KEY];
    const char *argv[2] = {"DEL", fk};
    size_t argvlen[2] = {3, full_key(r, fk, key, klen)};
    redisReply *rep;
    kvq_status st = rs_cmd(s, r, 0, 2, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0)
        st = rep->integer == 0 ? KVQ_ERR_RANGE : KVQ_OK;
    else if (rep->type == REDIS_REPLY_ERROR)
        st = rs_error_reply(s, r, rep);
    else
        st = rs_unexpected(s, r, rep);
    freeReplyObject(rep);
    return st;
}

/* A SCAN cursor: plain decimal digits of a 64-bit number. */
static int rs_cursor(const redisReply *e, uint64_t *v) {
    if (e->len == 0 || e->len > 20)
        return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < e->len; i++) {
        unsigned d = (unsigned)(e->str[i] - '0');
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            return 0;
        x = x * 10 + d;
    }
    *v = x;
    return 1;
}

/* 1 when the SCAN key k names a key of this store (the part after
 * "kvq:<ns>:" is 1..KVQ__STORE_MAX_KEY bytes without NUL). */
static int rs_our_key(const rs_store *r, const redisReply *k) {
    return k->len > r->prefix_len && k->len - r->prefix_len <= KVQ__STORE_MAX_KEY &&
           memcmp(k->str, r->prefix, r->prefix_len) == 0 && memchr(k->str, 0, k->len) == NULL;
}

/* One SCAN round over "kvq:<ns>:<prefix>*": calls add for every key found
 * (the part after "kvq:<ns>:") with its value size, from pipelined STRLENs.
 * *cursor moves on only on success. */
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
    r->what = "SCAN";
    kvq_status st = rs_cmd(s, r, 0, 6, argv, argvlen, &rep);
    if (st != KVQ_OK)
        return st;
    uint64_t next = 0;
    if (rep->type == REDIS_REPLY_ERROR) {
        st = rs_error_reply(s, r, rep);
        freeReplyObject(rep);
        return st;
    }
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
             rep->element[0]->type == REDIS_REPLY_STRING &&
             rep->element[1]->type == REDIS_REPLY_ARRAY;
    for (size_t i = 0; ok && i < rep->element[1]->elements; i++)
        ok = rep->element[1]->element[i]->type == REDIS_REPLY_STRING;
    if (!ok) {
        st = rs_unexpected(s, r, rep);
        freeReplyObject(rep);
        return st;
    }
    if (!rs_cursor(rep->element[0], &next)) {
        char q[48];
        kvq__store_err(s, "redis %s:%d: SCAN: a bad cursor '%s'", r->host, r->port,
                       rs_quote(q, sizeof q, rep->element[0]->str, rep->element[0]->len));
        rs_drop(r);
        freeReplyObject(rep);
        return KVQ_ERR_IO;
    }
    redisReply *keys = rep->element[1];
    /* sizes: one pipelined STRLEN per key this store can name */
    size_t n = 0;
    for (size_t i = 0; i < keys->elements; i++)
        n += (size_t)rs_our_key(r, keys->element[i]);
    redisReply **lens = NULL;
    int *argcs = NULL;
    const char *const **argvs = NULL;
    const size_t **argvlens = NULL;
    const char **args = NULL;
    size_t *arglens = NULL;
    redisReply **named = NULL;
    if (n) {
        lens = (redisReply **)kvq__alloc(&s->alloc, n * sizeof *lens);
        named = (redisReply **)kvq__alloc(&s->alloc, n * sizeof *named);
        argcs = (int *)kvq__alloc(&s->alloc, n * sizeof *argcs);
        argvs = (const char *const **)kvq__alloc(&s->alloc, n * sizeof *argvs);
        argvlens = (const size_t **)kvq__alloc(&s->alloc, n * sizeof *argvlens);
        args = (const char **)kvq__alloc(&s->alloc, 2 * n * sizeof *args);
        arglens = (size_t *)kvq__alloc(&s->alloc, 2 * n * sizeof *arglens);
        if (!lens || !named || !argcs || !argvs || !argvlens || !args || !arglens) {
            st = KVQ_ERR_NOMEM;
            goto out;
        }
        size_t j = 0;
        for (size_t i = 0; i < keys->elements; i++) {
            redisReply *k = keys->element[i];
            if (!rs_our_key(r, k))
                continue; /* not a key this store can name */
            named[j] = k;
            args[2 * j] = "STRLEN";
            arglens[2 * j] = 6;
            args[2 * j + 1] = k->str;
            arglens[2 * j + 1] = k->len;
            argcs[j] = 2;
            argvs[j] = args + 2 * j;
            argvlens[j] = arglens + 2 * j;
            j++;
        }
        r->what = "STRLEN";
        st = rs_run(s, r, 0, n, argcs, argvs, argvlens, lens);
        if (st != KVQ_OK)
            goto out;
        for (size_t i = 0; i < n && st == KVQ_OK; i++) {
            if (lens[i]->type == REDIS_REPLY_ERROR)
                continue; /* not a string value (WRONGTYPE): get() reports it */
            if (lens[i]->type != REDIS_REPLY_INTEGER || lens[i]->integer < 0) {
                st = rs_unexpected(s, r, lens[i]);
                break;
            }
            st = add(ctx, named[i]->str + r->prefix_len, named[i]->len - r->prefix_len,
                     (size_t)lens[i]->integer);
        }
        for (size_t i = 0; i < n; i++)
            freeReplyObject(lens[i]);
    }
    if (st == KVQ_OK)
        *cursor = next;
out:
    if (st == KVQ_ERR_NOMEM && !s->err[0])
        kvq__store_err(s, "out of memory");
    kvq__free(&s->alloc, arglens);
    kvq__free(&s->alloc, args);
    kvq__free(&s->alloc, argvlens);
    kvq__free(&s->alloc, argvs);
    kvq__free(&s->alloc, argcs);
    kvq__free(&s->alloc, named);
    kvq__free(&s->alloc, lens);
    freeReplyObject(rep);
    return st;
}

static void rs_walk_init(rs_walk *w) {
    memset(w, 0, sizeof *w);
    w->power = 1;
}

/* A round of walk w ended at cursor next: a cursor that comes back (Brent:
 * the mark moves to the latest cursor at every power of two, so a loop of
 * any length meets it within twice its length) or too many rounds end the
 * walk. */
static kvq_status rs_walk_step(kvq_store *s, rs_store *r, rs_walk *w, uint64_t next) {
    w->rounds++;
    if (next == 0)
        return KVQ_OK;
    if (next == w->mark) {
        kvq__store_err(s,
                       "redis %s:%d: SCAN: cursor %llu came back after %llu rounds: the server "
                       "loops",
                       r->host, r->port, (unsigned long long)next, (unsigned long long)w->rounds);
        return KVQ_ERR_IO;
    }
    if (w->rounds >= RS_MAX_ROUNDS) {
        kvq__store_err(s, "redis %s:%d: SCAN: no end after %llu rounds", r->host, r->port,
                       (unsigned long long)w->rounds);
        return KVQ_ERR_IO;
    }
    if (++w->lam == w->power) {
        w->mark = next;
        w->power *= 2;
        w->lam = 0;
    }
    return KVQ_OK;
}

/* The walk going on from cursor (a fresh one for 0, or when its state was
 * not kept: then its rounds and time count from here). */
static rs_walk rs_walk_take(rs_store *r, uint64_t cursor) {
    rs_walk w;
    rs_walk_init(&w);
    for (int i = 0; cursor && i < RS_WALKS; i++) {
        if (r->walks[i].cursor == cursor) {
            w = r->walks[i];
            r->walks[i].cursor = 0;
            break;
        }
    }
    return w;
}

/* Keeps walk w (to go on from cursor) in a free slot or the oldest. Two
 * listings at the same cursor share a slot: either state is a true count of
 * how such a walk got there. */
static void rs_walk_keep(rs_store *r, rs_walk *w, uint64_t cursor) {
    int at = 0;
    for (int i = 0; i < RS_WALKS; i++) {
        if (r->walks[i].cursor == 0 || r->walks[i].cursor == cursor) {
            at = i;
            break;
        }
        if (r->walks[i].used < r->walks[at].used)
            at = i;
    }
    w->cursor = cursor;
    w->used = ++r->walk_clock;
    r->walks[at] = *w;
}

static kvq_status add_to_list(void *ctx, const char *key, size_t klen, size_t size) {
    return kvq__keylist_add((kvq__keylist *)ctx, key, klen, size);
}

/* One batch of a listing. */
static kvq_status rs_scan(kvq_store *s, const char *prefix, size_t plen, uint64_t *cursor,
                          kvq__keylist *out) {
    rs_store *r = RS(s);
    rs_walk w = rs_walk_take(r, *cursor);
    rs_begin(r, "SCAN", w.spent);
    uint64_t next = *cursor;
    kvq_status st = rs_scan_step(s, r, prefix, plen, &next, add_to_list, out);
    w.spent += rs_now() - r->call_start;
    if (st == KVQ_OK)
        st = rs_walk_step(s, r, &w, next);
    if (st != KVQ_OK)
        return st;
    if (next)
        rs_walk_keep(r, &w, next);
    *cursor = next;
    return KVQ_OK;
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
    rs_store *r = RS(s);
    rs_begin(r, "SCAN", 0);
    rs_walk w;
    rs_walk_init(&w);
    rs_count c = {0, 0};
    uint64_t cursor = 0;
    do {
        kvq_status rc = rs_scan_step(s, r, "", 0, &cursor, add_to_count, &c);
        if (rc == KVQ_OK)
            rc = rs_walk_step(s, r, &w, cursor);
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

/* "k=v&k=v" options of the URL: timeout_ms=N. */
static kvq_status parse_options(kvq_store *s, rs_store *r, const char *opt) {
    while (opt && *opt) {
        const char *amp = strchr(opt, '&');
        size_t n = amp ? (size_t)(amp - opt) : strlen(opt);
        const char *eq = memchr(opt, '=', n);
        size_t kl = eq ? (size_t)(eq - opt) : n;
        long v = 0;
        int ok = eq != NULL && eq + 1 < opt + n && opt + n - (eq + 1) <= 7;
        for (const char *p = eq ? eq + 1 : opt; ok && p < opt + n; p++) {
            ok = *p >= '0' && *p <= '9';
            v = v * 10 + (*p - '0');
        }
        if (ok && kl == 10 && memcmp(opt, "timeout_ms", 10) == 0 && v >= 1 &&
            v <= RS_MAX_TIMEOUT_MS) {
            r->timeout_ms = v;
        } else {
            kvq__store_err(s, "bad Redis URL option '%.*s' (known: timeout_ms=1..%ld)", (int)n,
                           opt, RS_MAX_TIMEOUT_MS);
            return KVQ_ERR_INVALID_ARG;
        }
        opt = amp ? amp + 1 : NULL;
    }
    return KVQ_OK;
}

/* redis://HOST[:PORT][/NS][?timeout_ms=N] */
static kvq_status parse_url(kvq_store *s, rs_store *r, const char *url) {
    const char *p = url + 8;
    const char *q = strchr(p, '?');
    const char *end = q ? q : p + strlen(p);
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hp_end = slash ? slash : end;
    const char *colon = memchr(p, ':', (size_t)(hp_end - p));
    const char *h_end = colon ? colon : hp_end;
    size_t hl = (size_t)(h_end - p);
    if (hl == 0 || hl >= sizeof r->host) {
        kvq__store_err(s, "bad Redis URL '%s': want redis://HOST[:PORT][/NAMESPACE][?timeout_ms=N]",
                       url);
        return KVQ_ERR_INVALID_ARG;
    }
    memcpy(r->host, p, hl);
    r->host[hl] = 0;
    r->port = 6379;
    if (colon) {
        long port = 0;
        const char *d = colon + 1;
        for (; d < hp_end && *d >= '0' && *d <= '9' && port <= 65535; d++)
            port = port * 10 + (*d - '0');
        if (d != hp_end || d == colon + 1 || port < 1 || port > 65535) {
            kvq__store_err(s, "bad port in Redis URL '%s'", url);
            return KVQ_ERR_INVALID_ARG;
        }
        r->port = (int)port;
    }
    const char *ns = "default";
    size_t nl = 7;
    if (slash && slash + 1 < end) {
        ns = slash + 1;
        nl = (size_t)(end - ns);
    }
    int ok = nl >= 1 && nl <= RS_MAX_NS;
    for (size_t i = 0; ok && i < nl; i++)
        ok = ns_char(ns[i]);
    if (!ok) {
        kvq__store_err(s, "bad namespace in Redis URL '%s' (1..%d of A-Z a-z 0-9 _ - .)", url,
                       RS_MAX_NS);
        return KVQ_ERR_INVALID_ARG;
    }
    memcpy(r->ns, ns, nl);
    r->ns[nl] = 0;
    r->prefix_len = (size_t)snprintf(r->prefix, sizeof r->prefix, "kvq:%s:", r->ns);
    r->timeout_ms = RS_DEFAULT_TIMEOUT_MS;
    return parse_options(s, r, q ? q + 1 : NULL);
}

kvq_status kvq__store_open_redis(kvq_store *s, const char *url) {
    rs_store *r = (rs_store *)kvq__calloc(&s->alloc, sizeof *r);
    if (!r) {
        kvq__store_err(s, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    r->disconnect_after = -1;
    kvq_status st = parse_url(s, r, url);
    if (st == KVQ_OK) {
        rs_begin(r, "PING", 0); /* one deadline for connecting and the PING */
        st = rs_ping(s, r);
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

/* ---- the fuzz target's door (store_redis.h) ---- */

kvq_status kvq__redis_reply_eval(int call, const uint8_t *bytes, size_t n, size_t chunk,
                                 kvq__rs_eval *out) {
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    kvq__allocator_init(&out->alloc, NULL);
    out->keys.alloc = &out->alloc;
    if (call < 0 || call >= KVQ__RS_N_CALLS || (!bytes && n))
        return KVQ_ERR_INVALID_ARG;
    kvq_store s;
    memset(&s, 0, sizeof s);
    s.alloc = out->alloc;
    rs_store *r = (rs_store *)kvq__calloc(&s.alloc, sizeof *r);
    if (!r)
        return KVQ_ERR_NOMEM;
    r->disconnect_after = -1;
    snprintf(r->host, sizeof r->host, "memory");
    snprintf(r->ns, sizeof r->ns, "%s", KVQ__RS_EVAL_NS);
    r->prefix_len = (size_t)snprintf(r->prefix, sizeof r->prefix, "kvq:%s:", r->ns);
    r->timeout_ms = RS_MAX_TIMEOUT_MS;
    r->mem = bytes ? bytes : (const uint8_t *)"";
    r->mem_len = n;
    r->mem_chunk = chunk;
    s.impl = r;
    s.ops = &rs_ops;
    kvq_status st = KVQ_OK;
    switch (call) {
    case KVQ__RS_PING:
        rs_begin(r, "PING", 0);
        st = rs_ping(&s, r);
        break;
    case KVQ__RS_SET:
        st = rs_put(&s, "k", 1, "v", 1, 0);
        break;
    case KVQ__RS_GET:
        st = rs_get(&s, "k", 1, &out->value, &out->size);
        break;
    case KVQ__RS_DEL:
        st = rs_del(&s, "k", 1);
        break;
    case KVQ__RS_LIST: {
        uint64_t cursor = 0;
        do {
            st = rs_scan(&s, "", 0, &cursor, &out->keys);
            out->batches++;
        } while (st == KVQ_OK && cursor != 0);
        break;
    }
    default: /* KVQ__RS_STATS */
        st = rs_stats(&s, &out->m);
        break;
    }
    out->st = st;
    if (st != KVQ_OK)
        snprintf(out->err, sizeof out->err, "%s", s.err);
    out->dropped = r->drops > 0;
    out->reader_refused = r->reader_refused > 0;
    out->consumed = r->mem_pos - r->pend_len;
    rs_drop(r);
    kvq__free(&s.alloc, r);
    return KVQ_OK;
}

void kvq__rs_eval_free(kvq__rs_eval *e) {
    if (!e || !e->alloc.free)
        return;
    kvq__free(&e->alloc, e->value);
    e->value = NULL;
    kvq__keylist_free(&e->keys);
}

#endif
