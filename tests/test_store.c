/*
 * test_store.c - page records and stores. Records: round trip, every
 * single-byte corruption and every truncation rejected, version and range
 * checks behind a valid CRC, encoder refusals. File store: put/get/del/list,
 * reopen rebuilding the index, torn tails written by hand (cut off, later
 * appends clean), corrupt entries in the middle and after open, injected
 * full disk / write / fsync / read faults keeping old values readable, many
 * keys, large values, segment roll-over, compaction, the directory lock,
 * readonly mode and failing allocations; segment ids past 2^32 (roll-over
 * and compaction from seg-4294967294.log), the last id refusing a new
 * segment, names that are not segments; two processes on one directory
 * (fork: writer + writer, writer + readers, a killed writer). Redis store: against a
 * redis-server this test starts on a free loopback port (killed and
 * restarted mid-run to check KVQ_ERR_CONN and the reconnect); skipped with
 * a "SKIP redis:" line when redis-server or hiredis is missing.
 */
#include "testutil.h"

#include "tier/record.h"
#include "tier/store_impl.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static char g_tmp[256];

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        rm_tree(p);
    }
    closedir(d);
    rmdir(path);
}

/* A fresh store directory path under the test's temporary folder. */
static void fresh_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_tmp, name);
    rm_tree(out);
}

static char *seg_path(char *buf, size_t n, const char *dir, unsigned id) {
    snprintf(buf, n, "%s/seg-%06u.log", dir, id);
    return buf;
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static int append_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_APPEND);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, data, n);
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

static int xor_byte(const char *path, long off, uint8_t x) {
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return -1;
    uint8_t b;
    int ok = pread(fd, &b, 1, off) == 1;
    b ^= x;
    ok = ok && pwrite(fd, &b, 1, off) == 1;
    close(fd);
    return ok ? 0 : -1;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    size_t sl = strlen(suffix);
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l >= sl && strcmp(de->d_name + l - sl, suffix) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Encodes one segment entry by hand (the format of store_impl.h). */
static size_t make_entry(uint8_t *out, int op, const char *key, const void *val, size_t vlen) {
    size_t klen = strlen(key);
    kvq__seg_hdr_write(out, op, (uint32_t)klen, (uint32_t)vlen, 0);
    uint32_t crc = kvq__crc32c(0, out, 12);
    crc = kvq__crc32c(crc, key, klen);
    crc = kvq__crc32c(crc, val, vlen);
    kvq__seg_hdr_write(out, op, (uint32_t)klen, (uint32_t)vlen, crc);
    memcpy(out + KVQ__SEG_HDR, key, klen);
    if (vlen)
        memcpy(out + KVQ__SEG_HDR + klen, val, vlen);
    return KVQ__SEG_HDR + klen + vlen;
}

static size_t entry_len(const char *key, size_t vlen) { return KVQ__SEG_HDR + strlen(key) + vlen; }

static kvq_store *open_ok(const char *url) {
    kvq_store *s = NULL;
    char err[256] = "";
    kvq_status st = kvq_store_open(&s, url, NULL, err, sizeof err);
    TU_REPORT(st == KVQ_OK, "open %s: %s (%s)", url, kvq_strerror(st), err);
    return s;
}

/* 1 when key holds exactly (val, n). */
static int has_value(kvq_store *s, const char *key, const void *val, size_t n) {
    void *d = NULL;
    size_t sz = 0;
    kvq_status st = kvq_store_get(s, key, &d, &sz);
    if (st != KVQ_OK) {
        fprintf(stderr, "  get '%s': %s (%s)\n", key, kvq_strerror(st), kvq_store_last_error(s));
        return 0;
    }
    int ok = d != NULL && sz == n && (n == 0 || memcmp(d, val, n) == 0);
    kvq_store_free_buf(s, d);
    return ok;
}

static kvq_status get_status(kvq_store *s, const char *key) {
    void *d = NULL;
    size_t sz = 0;
    kvq_status st = kvq_store_get(s, key, &d, &sz);
    kvq_store_free_buf(s, d);
    return st;
}

static kvq_store_metrics stats_of(kvq_store *s) {
    kvq_store_metrics m;
    memset(&m, 0, sizeof m);
    CHECK_OK(kvq_store_stats(s, &m));
    return m;
}

static void fill_bytes(tu_rng *r, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)tu_next(r);
}

/* Closes s and opens url again: the index is rebuilt from the segments. */
static kvq_store *reopen(kvq_store *s, const char *url) {
    kvq_store_close(s);
    return open_ok(url);
}

/* A fresh store directory NAME (in dir) opened through the URL
 * "file:DIR?query" (in url). */
static kvq_store *open_fresh_url(char *dir, size_t dn, char *url, size_t un, const char *name,
                                 const char *query) {
    fresh_dir(dir, dn, name);
    snprintf(url, un, "file:%s?%s", dir, query);
    return open_ok(url);
}

/* What a store should be after a reopen with nothing torn or corrupt. */
static void check_clean(kvq_store *s, uint64_t records) {
    kvq_store_metrics m = stats_of(s);
    CHECK_EQ(m.torn_tails, 0);
    CHECK_EQ(m.corrupt_skipped, 0);
    CHECK_EQ(m.records, records);
}

/* ---------------------------------------------------------------- records */

typedef struct {
    int32_t pos[4096];
    uint8_t states[4096];
    uint8_t block[4096];
    char layout[256];
    kvq__record r;
} rec_src;

static void make_record(rec_src *src, uint32_t P, tu_rng *rng) {
    memset(&src->r, 0, sizeof src->r);
    src->r.cache_id = 0x1122334455667788ull;
    src->r.layer = 3;
    src->r.page_tokens = P;
    src->r.n_kv_heads = 2;
    src->r.head_dim = 8;
    src->r.prefix_hash = 0xfeedfacecafebeefull;
    snprintf(src->layout, sizeof src->layout, "k=int8,v=tq3;k=int8,v=tq3");
    src->r.layout = src->layout;
    src->r.layout_len = strlen(src->layout);
    int32_t lo = -1, hi = -1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < P; i++) {
        if (i % 5 == 3) {
            src->pos[i] = -1;
            src->states[i] = 0;
        } else {
            src->pos[i] = (int32_t)(100 + 7 * i - (i % 3));
            src->states[i] = (uint8_t)(1 + (i % 2));
            lo = (n == 0 || src->pos[i] < lo) ? src->pos[i] : lo;
            hi = (n == 0 || src->pos[i] > hi) ? src->pos[i] : hi;
            n++;
        }
    }
    src->r.n_tokens = n;
    src->r.pos_min = lo;
    src->r.pos_max = hi;
    src->r.positions = src->pos;
    src->r.states = src->states;
    fill_bytes(rng, src->block, 37);
    src->r.block = src->block;
    src->r.block_len = 37;
}

static uint8_t *encode_alloc(const kvq__record *r, size_t *n) {
    *n = kvq__record_size(r);
    uint8_t *buf = (uint8_t *)malloc(*n + 8);
    size_t w = 0;
    kvq_status st = kvq__record_encode(r, buf, *n, &w);
    CHECK_OK(st);
    CHECK_EQ(w, *n);
    return buf;
}

/* Sets a 32-bit field, then fixes the CRC so only the field check can fail. */
static kvq_status decode_with(const uint8_t *good, size_t n, size_t off, uint32_t v, int width) {
    uint8_t *b = (uint8_t *)malloc(n);
    memcpy(b, good, n);
    if (width == 2)
        kvq__st16(b + off, (uint16_t)v);
    else if (width == 1)
        b[off] = (uint8_t)v;
    else
        kvq__st32(b + off, v);
    kvq__st32(b + n - 4, kvq__crc32c(0, b, n - 4));
    kvq__record r;
    kvq_status st = kvq__record_decode(b, n, &r);
    free(b);
    return st;
}

static void test_records(void) {
    tu_rng rng;
    tu_seed(&rng, 11);
    static rec_src src;
    make_record(&src, 16, &rng);
    size_t n;
    uint8_t *buf = encode_alloc(&src.r, &n);
    CHECK_EQ(n, 68 + 5 * 16 + src.r.layout_len + 37);

    kvq__record d;
    CHECK_OK(kvq__record_decode(buf, n, &d));
    CHECK(d.cache_id == src.r.cache_id && d.layer == 3 && d.page_tokens == 16 &&
          d.n_kv_heads == 2 && d.head_dim == 8 && d.n_tokens == src.r.n_tokens &&
          d.pos_min == src.r.pos_min && d.pos_max == src.r.pos_max &&
          d.prefix_hash == src.r.prefix_hash);
    CHECK(d.layout_len == src.r.layout_len && memcmp(d.layout, src.layout, d.layout_len) == 0);
    CHECK(memcmp(d.positions, src.pos, 16 * 4) == 0 && memcmp(d.states, src.states, 16) == 0);
    CHECK(d.block_len == 37 && memcmp(d.block, src.block, 37) == 0);
    CHECK((const uint8_t *)d.block > buf && d.block + d.block_len == buf + n - 4); /* views */

    /* every single-byte corruption is rejected */
    int all_rejected = 1, version_seen = 0;
    static const uint8_t flips[] = {0x01, 0x80, 0xff, 0x10};
    for (size_t i = 0; i < n; i++) {
        for (size_t f = 0; f < sizeof flips; f++) {
            buf[i] ^= flips[f];
            kvq_status st = kvq__record_decode(buf, n, &d);
            if (st == KVQ_OK || (st != KVQ_ERR_CORRUPT && st != KVQ_ERR_VERSION)) {
                all_rejected = 0;
                fprintf(stderr, "  byte %zu ^ 0x%02x: %s\n", i, flips[f], kvq_strerror(st));
            }
            version_seen |= st == KVQ_ERR_VERSION;
            buf[i] ^= flips[f];
        }
    }
    CHECK(all_rejected);
    CHECK(version_seen);
    /* every truncation, and one byte too many */
    int trunc_rejected = 1;
    for (size_t len = 0; len < n; len++)
        if (kvq__record_decode(buf, len, &d) != KVQ_ERR_CORRUPT && len >= 6)
            trunc_rejected = 0;
        else if (len < 6 && kvq__record_decode(buf, len, &d) == KVQ_OK)
            trunc_rejected = 0;
    CHECK(trunc_rejected);
    buf[n] = 0;
    CHECK_STATUS(kvq__record_decode(buf, n + 1, &d), KVQ_ERR_CORRUPT);
    CHECK_OK(kvq__record_decode(buf, n, &d));

    /* another version (3) with a valid CRC: KVQ_ERR_VERSION; other checks behind the CRC */
    CHECK_STATUS(decode_with(buf, n, 4, 3, 2), KVQ_ERR_VERSION);
    CHECK_STATUS(decode_with(buf, n, 4, 0, 2), KVQ_ERR_VERSION);
    CHECK_STATUS(decode_with(buf, n, 6, 1, 2), KVQ_ERR_CORRUPT);     /* flags */
    CHECK_STATUS(decode_with(buf, n, 20, 0, 4), KVQ_ERR_CORRUPT);    /* P = 0 */
    CHECK_STATUS(decode_with(buf, n, 20, 4097, 4), KVQ_ERR_CORRUPT); /* P big */
    CHECK_STATUS(decode_with(buf, n, 20, 15, 4), KVQ_ERR_CORRUPT);   /* lengths */
    CHECK_STATUS(decode_with(buf, n, 24, 0, 4), KVQ_ERR_CORRUPT);    /* heads */
    CHECK_STATUS(decode_with(buf, n, 28, 0, 4), KVQ_ERR_CORRUPT);    /* head_dim */
    CHECK_STATUS(decode_with(buf, n, 28, 1025, 4), KVQ_ERR_CORRUPT);
    CHECK_OK(decode_with(buf, n, 28, 1024, 4));
    CHECK_STATUS(decode_with(buf, n, 32, src.r.n_tokens + 1, 4), KVQ_ERR_CORRUPT); /* n_tokens */
    CHECK_STATUS(decode_with(buf, n, 32, 17, 4), KVQ_ERR_CORRUPT);
    CHECK_STATUS(decode_with(buf, n, 36, (uint32_t)(src.r.pos_min - 1), 4), KVQ_ERR_CORRUPT);
    CHECK_STATUS(decode_with(buf, n, 40, (uint32_t)(src.r.pos_max + 1), 4), KVQ_ERR_CORRUPT);
    CHECK_STATUS(decode_with(buf, n, 44, 0xffffffffu, 4), KVQ_ERR_CORRUPT);  /* layout_len */
    CHECK_STATUS(decode_with(buf, n, 56, 0xffffffffu, 4), KVQ_ERR_CORRUPT);  /* block_len */
    CHECK_STATUS(decode_with(buf, n, 60, 0xffffffffu, 4), KVQ_ERR_CORRUPT);  /* overflow */
    CHECK_STATUS(decode_with(buf, n, 64, (uint32_t)-2, 4), KVQ_ERR_CORRUPT); /* pos -2 */
    CHECK_STATUS(decode_with(buf, n, 64 + 4 * 3, 5, 4), KVQ_ERR_CORRUPT);    /* free->used */
    CHECK_STATUS(decode_with(buf, n, 64 + 64 + 0, 3, 1), KVQ_ERR_CORRUPT);   /* state 3 */
    CHECK_STATUS(decode_with(buf, n, 64 + 64 + 0, 0, 1), KVQ_ERR_CORRUPT);   /* used, free */
    CHECK_STATUS(decode_with(buf, n, 64 + 64 + 0, 0x82, 1), KVQ_ERR_CORRUPT); /* high bit */
    CHECK_STATUS(decode_with(buf, n, 64 + 64 + 3, 0x80, 1), KVQ_ERR_CORRUPT); /* on a free slot */
    CHECK_STATUS(decode_with(buf, n, 64 + 64 + 3, 1, 1), KVQ_ERR_CORRUPT);   /* free, used */
    CHECK_STATUS(decode_with(buf, n, 64 + 80, 0x07, 1), KVQ_ERR_CORRUPT);    /* layout ctl */

    /* alignment: decode needs 4-byte alignment, check/inspect do not */
    uint8_t *mis = (uint8_t *)malloc(n + 1);
    memcpy(mis + 1, buf, n);
    CHECK_STATUS(kvq__record_decode(mis + 1, n, &d), KVQ_ERR_INVALID_ARG);
    CHECK_OK(kvq__record_check(mis + 1, n, &d));
    CHECK(d.positions == NULL && d.states == NULL && d.layer == 3);
    kvq_record_info info;
    CHECK_OK(kvq_record_inspect(mis + 1, n, &info));
    CHECK(info.version == KVQ__RECORD_VERSION && info.layer == 3 && info.page_tokens == 16 &&
          info.n_tokens == src.r.n_tokens && info.pos_min == src.r.pos_min &&
          info.pos_max == src.r.pos_max && info.block_len == 37 &&
          info.layout_len == src.r.layout_len && info.prefix_hash == src.r.prefix_hash);
    mis[1 + 10] ^= 1;
    CHECK_STATUS(kvq_record_inspect(mis + 1, n, &info), KVQ_ERR_CORRUPT);
    free(mis);

    /* the encoder refuses what the decoder would reject */
    size_t w;
    uint8_t small[8];
    CHECK_STATUS(kvq__record_encode(&src.r, small, sizeof small, &w), KVQ_ERR_DST_TOO_SMALL);
    CHECK_STATUS(kvq__record_encode(&src.r, buf, n - 1, &w), KVQ_ERR_DST_TOO_SMALL);
    kvq__record bad = src.r;
    bad.n_tokens++;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    bad = src.r;
    bad.pos_max++;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    bad = src.r;
    bad.page_tokens = 0;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    bad = src.r;
    bad.head_dim = 2000;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    bad = src.r;
    bad.layout = "k=int8\n";
    bad.layout_len = 7;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    bad = src.r;
    bad.positions = NULL;
    CHECK_STATUS(kvq__record_encode(&bad, buf, n, &w), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq__record_encode(NULL, buf, n, &w), KVQ_ERR_INVALID_ARG);
    CHECK(kvq__record_size(NULL) == 0);
    free(buf);

    /* an empty page, no layout, no block; the largest page */
    for (uint32_t i = 0; i < 4; i++) {
        src.pos[i] = -1;
        src.states[i] = 0;
    }
    kvq__record e = src.r;
    e.page_tokens = 4;
    e.n_tokens = 0;
    e.pos_min = e.pos_max = -1;
    e.layout_len = 0;
    e.block_len = 0;
    buf = encode_alloc(&e, &n);
    CHECK_EQ(n, 68 + 20);
    CHECK_OK(kvq__record_decode(buf, n, &d));
    CHECK(d.n_tokens == 0 && d.pos_min == -1 && d.block_len == 0 && d.layout_len == 0);
    free(buf);
    make_record(&src, 4096, &rng);
    buf = encode_alloc(&src.r, &n);
    CHECK_OK(kvq__record_decode(buf, n, &d));
    CHECK(d.page_tokens == 4096 && d.n_tokens == src.r.n_tokens);
    free(buf);
}

/* ---------------------------------------------------------------- file store */

typedef struct {
    int n;
    size_t bytes;
    int stop_after;
    kvq_store *del_from; /* delete each listed key (the callback may call the store) */
} list_acc;

static int list_cb(void *ctx, const char *key, size_t size) {
    list_acc *a = (list_acc *)ctx;
    a->n++;
    a->bytes += size;
    if (a->del_from && kvq_store_del(a->del_from, key) != KVQ_OK)
        a->n += 1000000;
    return a->stop_after && a->n >= a->stop_after;
}

static void test_file_basic(void) {
    char dir[300], url[320];
    fresh_dir(dir, sizeof dir, "basic");
    snprintf(url, sizeof url, "file:%s", dir);
    kvq_store *s = open_ok(url);
    if (!s)
        return;
    CHECK_OK(kvq_store_put(s, "alpha", "one", 3));
    CHECK_OK(kvq_store_put(s, "beta", "two!", 4));
    CHECK_OK(kvq_store_put(s, "empty", "", 0));
    CHECK(has_value(s, "alpha", "one", 3));
    CHECK(has_value(s, "beta", "two!", 4));
    CHECK(has_value(s, "empty", "", 0));
    CHECK_OK(kvq_store_put(s, "alpha", "uno", 3)); /* replaces */
    CHECK(has_value(s, "alpha", "uno", 3));
    CHECK_STATUS(get_status(s, "gamma"), KVQ_ERR_RANGE);
    CHECK(strstr(kvq_store_last_error(s), "gamma") != NULL);
    CHECK_STATUS(kvq_store_del(s, "gamma"), KVQ_ERR_RANGE);
    CHECK_OK(kvq_store_del(s, "beta"));
    CHECK_STATUS(get_status(s, "beta"), KVQ_ERR_RANGE);
    CHECK_OK(kvq_store_put(s, "alps/1", "x", 1));
    CHECK_OK(kvq_store_put(s, "alps/2", "yy", 2));

    list_acc a = {0, 0, 0, NULL};
    CHECK_OK(kvq_store_list(s, "", list_cb, &a));
    CHECK_EQ(a.n, 4);
    CHECK_EQ(a.bytes, 3 + 0 + 1 + 2);
    memset(&a, 0, sizeof a);
    CHECK_OK(kvq_store_list(s, "alp", list_cb, &a));
    CHECK_EQ(a.n, 3);
    memset(&a, 0, sizeof a);
    CHECK_OK(kvq_store_list(s, "alps/", list_cb, &a));
    CHECK_EQ(a.n, 2);
    memset(&a, 0, sizeof a);
    a.stop_after = 1;
    CHECK_OK(kvq_store_list(s, NULL, list_cb, &a));
    CHECK_EQ(a.n, 1);

    kvq_store_metrics m = stats_of(s);
    CHECK_EQ(m.records, 4);
    CHECK_EQ(m.live_bytes, 6);
    CHECK_EQ(m.puts, 6);
    CHECK_EQ(m.dels, 1);
    CHECK_EQ(m.segments, 1);
    CHECK_EQ(m.errors, 0); /* absent keys are not errors */
    CHECK(m.stored_bytes > m.live_bytes && m.bytes_written == m.stored_bytes);

    /* bad arguments */
    char longkey[1100];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    void *d;
    size_t sz;
    CHECK_STATUS(kvq_store_put(s, "", "x", 1), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_put(s, NULL, "x", 1), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_put(s, longkey, "x", 1), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_put(s, "k", NULL, 1), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_get(s, "alpha", NULL, &sz), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_get(s, longkey, &d, &sz), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_list(s, "", NULL, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_inject_fault(s, 99, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_inject_fault(s, KVQ_FAULT_DISCONNECT, 0), KVQ_ERR_UNSUPPORTED);
    CHECK_STATUS(kvq_store_put(NULL, "k", "x", 1), KVQ_ERR_INVALID_ARG);
    longkey[1024] = 0; /* exactly 1024 bytes: allowed */
    CHECK_OK(kvq_store_put(s, longkey, "L", 1));
    CHECK(has_value(s, longkey, "L", 1));
    CHECK_OK(kvq_store_del(s, longkey));

    /* the directory is locked while open */
    kvq_store *s2 = NULL;
    char err[256] = "";
    CHECK_STATUS(kvq_store_open(&s2, url, NULL, err, sizeof err), KVQ_ERR_IO);
    CHECK(s2 == NULL && strstr(err, "locked") != NULL);
    kvq_store_close(s);

    /* reopen rebuilds the index */
    s = open_ok(dir); /* the plain-path form */
    if (!s)
        return;
    CHECK(has_value(s, "alpha", "uno", 3));
    CHECK(has_value(s, "empty", "", 0));
    CHECK(has_value(s, "alps/2", "yy", 2));
    CHECK_STATUS(get_status(s, "beta"), KVQ_ERR_RANGE);
    CHECK_STATUS(get_status(s, longkey), KVQ_ERR_RANGE);
    check_clean(s, 4);
    /* a listing callback may delete what it is given */
    memset(&a, 0, sizeof a);
    a.del_from = s;
    CHECK_OK(kvq_store_list(s, "alps/", list_cb, &a));
    CHECK_EQ(a.n, 2);
    CHECK_STATUS(get_status(s, "alps/1"), KVQ_ERR_RANGE);
    kvq_store_close(s);

    /* readonly: shared lock, reads only */
    snprintf(url, sizeof url, "file:%s?readonly=1", dir);
    s = open_ok(url);
    kvq_store *s3 = open_ok(url); /* two readers at once */
    if (s && s3) {
        CHECK(has_value(s, "alpha", "uno", 3));
        CHECK_STATUS(kvq_store_put(s, "z", "z", 1), KVQ_ERR_UNSUPPORTED);
        CHECK_STATUS(kvq_store_del(s, "alpha"), KVQ_ERR_UNSUPPORTED);
        char wurl[320];
        snprintf(wurl, sizeof wurl, "file:%s", dir);
        CHECK_STATUS(kvq_store_open(&s2, wurl, NULL, NULL, 0), KVQ_ERR_IO); /* writer waits */
    }
    kvq_store_close(s3);
    kvq_store_close(s);

    /* URLs and options */
    char bad_url[340];
    snprintf(bad_url, sizeof bad_url, "file:%s?segment_bytes=12", dir);
    CHECK_STATUS(kvq_store_open(&s2, bad_url, NULL, err, sizeof err), KVQ_ERR_INVALID_ARG);
    CHECK(strstr(err, "segment_bytes") != NULL);
    snprintf(bad_url, sizeof bad_url, "file:%s?colour=blue", dir);
    CHECK_STATUS(kvq_store_open(&s2, bad_url, NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s2, "s3://bucket", NULL, err, sizeof err), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s2, "file:", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s2, "", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(NULL, dir, NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    snprintf(bad_url, sizeof bad_url, "file:%s/missing/deeper", dir);
    CHECK_STATUS(kvq_store_open(&s2, bad_url, NULL, err, sizeof err), KVQ_ERR_IO);
    snprintf(bad_url, sizeof bad_url, "file:%s/missing?readonly=1", dir);
    CHECK_STATUS(kvq_store_open(&s2, bad_url, NULL, NULL, 0), KVQ_ERR_IO);
    kvq_store_close(NULL);
}

/* A torn tail of each kind is cut off; later appends are clean. */
static void test_file_torn(void) {
    tu_rng rng;
    tu_seed(&rng, 5);
    uint8_t val[300], ent[600];
    fill_bytes(&rng, val, sizeof val);
    for (int kind = 0; kind < 5; kind++) {
        char dir[300], seg[330];
        fresh_dir(dir, sizeof dir, "torn");
        kvq_store *s = open_ok(dir);
        if (!s)
            return;
        CHECK_OK(kvq_store_put(s, "a", val, 100));
        CHECK_OK(kvq_store_put(s, "b", val + 1, 200));
        kvq_store_close(s);
        seg_path(seg, sizeof seg, dir, 1);
        long good = file_size(seg);
        CHECK_EQ(good, (long)(entry_len("a", 100) + entry_len("b", 200)));
        size_t n = make_entry(ent, KVQ__SEG_PUT, "c", val + 2, 250);
        switch (kind) {
        case 0: /* only part of the header */
            append_file(seg, ent, 11);
            break;
        case 1: /* header but only part of the value */
            append_file(seg, ent, n - 17);
            break;
        case 2: /* complete length, checksum fails (the value never made it) */
            ent[n - 5] ^= 0x40;
            append_file(seg, ent, n);
            break;
        case 3: { /* the file grew but the blocks stayed zero */
            uint8_t z[700];
            memset(z, 0, sizeof z);
            append_file(seg, z, sizeof z);
            break;
        }
        default: /* a delete whose header is torn */
            n = make_entry(ent, KVQ__SEG_DEL, "a", NULL, 0);
            append_file(seg, ent, n - 1);
            break;
        }
        CHECK(file_size(seg) > good);
        s = open_ok(dir);
        if (!s)
            return;
        kvq_store_metrics m = stats_of(s);
        TU_REPORT(m.torn_tails == 1 && m.corrupt_skipped == 0, "kind %d: torn %llu corrupt %llu",
                  kind, (unsigned long long)m.torn_tails, (unsigned long long)m.corrupt_skipped);
        CHECK_EQ(file_size(seg), good); /* cut off */
        CHECK(has_value(s, "a", val, 100));
        CHECK(has_value(s, "b", val + 1, 200));
        CHECK_STATUS(get_status(s, "c"), KVQ_ERR_RANGE);
        CHECK_OK(kvq_store_put(s, "d", val + 3, 50));
        s = reopen(s, dir);
        if (!s)
            return;
        check_clean(s, 3);
        CHECK(has_value(s, "d", val + 3, 50));
        CHECK(has_value(s, "a", val, 100));
        kvq_store_close(s);
    }
}

/* A fresh store NAME (in dir) holding a (100 bytes of val), b (150) and c
 * (120), closed again; 0 when it could not be opened. */
static int write_abc(char *dir, size_t dn, const char *name, const uint8_t *val) {
    fresh_dir(dir, dn, name);
    kvq_store *s = open_ok(dir);
    if (!s)
        return 0;
    CHECK_OK(kvq_store_put(s, "a", val, 100));
    CHECK_OK(kvq_store_put(s, "b", val + 1, 150));
    CHECK_OK(kvq_store_put(s, "c", val + 2, 120));
    kvq_store_close(s);
    return 1;
}

static void test_file_corrupt(void) {
    tu_rng rng;
    tu_seed(&rng, 6);
    uint8_t val[400];
    fill_bytes(&rng, val, sizeof val);
    char dir[300], seg[330];
    long off_b = (long)entry_len("a", 100), off_c = off_b + (long)entry_len("b", 150);

    /* a corrupt value in the middle: skipped, the rest is scanned */
    if (!write_abc(dir, sizeof dir, "corrupt", val))
        return;
    seg_path(seg, sizeof seg, dir, 1);
    CHECK_OK(xor_byte(seg, off_b + KVQ__SEG_HDR + 1 + 70, 0x08));
    kvq_store *s = open_ok(dir);
    if (!s)
        return;
    kvq_store_metrics m = stats_of(s);
    CHECK_EQ(m.corrupt_skipped, 1);
    CHECK_EQ(m.torn_tails, 0);
    CHECK(has_value(s, "a", val, 100));
    CHECK(has_value(s, "c", val + 2, 120));
    CHECK_STATUS(get_status(s, "b"), KVQ_ERR_RANGE); /* never the corrupt bytes */
    CHECK_OK(kvq_store_put(s, "b", val + 3, 10));    /* appends go on after c */
    s = reopen(s, dir);
    if (!s)
        return;
    CHECK(has_value(s, "b", val + 3, 10));
    CHECK(has_value(s, "c", val + 2, 120));
    CHECK_EQ(stats_of(s).corrupt_skipped, 1); /* still there, still skipped */

    /* bit rot after open: get re-verifies */
    CHECK_OK(xor_byte(seg, 20 + 1 + 5, 0x01)); /* a's value */
    CHECK_STATUS(get_status(s, "a"), KVQ_ERR_CORRUPT);
    m = stats_of(s);
    CHECK_EQ(m.corrupt_skipped, 2);
    CHECK_EQ(m.errors, 1);
    CHECK(has_value(s, "c", val + 2, 120));
    CHECK_OK(kvq_store_put(s, "a", val + 4, 40)); /* a fresh copy heals it */
    CHECK(has_value(s, "a", val + 4, 40));
    kvq_store_close(s);

    /* a corrupt header in the middle of the last segment: the scan stops there,
     * appends move to a new segment, nothing after the bad header is trusted */
    if (!write_abc(dir, sizeof dir, "corrupt2", val))
        return;
    CHECK_OK(xor_byte(seg_path(seg, sizeof seg, dir, 1), off_b + 9, 0x01)); /* b's length */
    long before = file_size(seg);
    s = open_ok(dir);
    if (!s)
        return;
    m = stats_of(s);
    CHECK_EQ(m.corrupt_skipped, 1);
    CHECK_EQ(m.torn_tails, 0);
    CHECK_EQ(file_size(seg), before); /* not cut: it was not a torn write */
    CHECK(has_value(s, "a", val, 100));
    CHECK_STATUS(get_status(s, "b"), KVQ_ERR_RANGE);
    CHECK_OK(kvq_store_put(s, "d", val + 5, 33));
    CHECK_EQ(stats_of(s).segments, 2);
    s = reopen(s, dir);
    if (!s)
        return;
    CHECK(has_value(s, "a", val, 100));
    CHECK(has_value(s, "d", val + 5, 33));
    CHECK_EQ(stats_of(s).corrupt_skipped, 1);
    kvq_store_close(s);

    /* a corrupt middle entry in an older segment, and garbage files around */
    (void)off_c;
    char url[400];
    s = open_fresh_url(dir, sizeof dir, url, sizeof url, "corrupt3", "segment_bytes=4096");
    if (!s)
        return;
    for (int i = 0; i < 40; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%02d", i);
        CHECK_OK(kvq_store_put(s, k, val + i, 300));
    }
    m = stats_of(s);
    CHECK(m.segments >= 3);
    kvq_store_close(s);
    CHECK_OK(xor_byte(seg_path(seg, sizeof seg, dir, 1), (long)entry_len("k00", 300) + 40, 0x20));
    char junk[340];
    snprintf(junk, sizeof junk, "%s/notes.txt", dir);
    FILE *jf = fopen(junk, "w");
    if (jf) {
        fputs("not a segment\n", jf);
        fclose(jf);
    }
    snprintf(junk, sizeof junk, "%s/seg-000099.tmp", dir); /* an interrupted compaction */
    jf = fopen(junk, "w");
    if (jf) {
        fputs("partial", jf);
        fclose(jf);
    }
    s = open_ok(url);
    if (!s)
        return;
    m = stats_of(s);
    CHECK_EQ(m.corrupt_skipped, 1);
    CHECK_EQ(m.records, 39);
    CHECK_STATUS(get_status(s, "k01"), KVQ_ERR_RANGE);
    CHECK(has_value(s, "k00", val, 300));
    CHECK(has_value(s, "k39", val + 39, 300));
    CHECK_EQ(count_files(dir, ".tmp"), 0);
    CHECK_EQ(file_size(junk), -1);
    kvq_store_close(s);
}

static void test_file_faults(void) {
    tu_rng rng;
    tu_seed(&rng, 7);
    static uint8_t v1[5000], v2[5000];
    fill_bytes(&rng, v1, sizeof v1);
    fill_bytes(&rng, v2, sizeof v2);
    char dir[300], seg[330];
    fresh_dir(dir, sizeof dir, "faults");
    kvq_store *s = open_ok(dir);
    if (!s)
        return;
    seg_path(seg, sizeof seg, dir, 1);
    CHECK_OK(kvq_store_put(s, "k", v1, 3000));
    CHECK_OK(kvq_store_put(s, "other", v1 + 1, 10));
    long size0 = file_size(seg);

    /* a full disk after a few bytes, in the header, and mid-value */
    static const long afters[] = {0, 7, 100, 2999};
    for (size_t i = 0; i < sizeof afters / sizeof afters[0]; i++) {
        CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NOSPACE, afters[i]));
        CHECK_STATUS(kvq_store_put(s, "k", v2, 3000), KVQ_ERR_NOSPACE);
        CHECK(strstr(kvq_store_last_error(s), "No space") != NULL);
        CHECK_STATUS(kvq_store_put(s, "new", v2, 100), KVQ_ERR_NOSPACE); /* stays full */
        CHECK_EQ(file_size(seg), size0);                                 /* cut back */
        CHECK(has_value(s, "k", v1, 3000));
        CHECK_STATUS(get_status(s, "new"), KVQ_ERR_RANGE);
    }
    CHECK_STATUS(kvq_store_del(s, "other"), KVQ_ERR_NOSPACE);
    CHECK(has_value(s, "other", v1 + 1, 10));
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK_OK(kvq_store_put(s, "k", v2, 3000));
    CHECK(has_value(s, "k", v2, 3000));

    /* EIO while writing */
    long size1 = file_size(seg);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_WRITE_IO, 50));
    CHECK_STATUS(kvq_store_put(s, "k", v1, 4000), KVQ_ERR_IO);
    CHECK_EQ(file_size(seg), size1);
    CHECK(has_value(s, "k", v2, 3000));
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));

    /* fdatasync fails once: the write is undone, the next put works */
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_SYNC, 1));
    CHECK_OK(kvq_store_put(s, "s1", "x", 1));
    CHECK_STATUS(kvq_store_put(s, "k", v1, 4000), KVQ_ERR_IO);
    CHECK(strstr(kvq_store_last_error(s), "fdatasync") != NULL);
    CHECK(has_value(s, "k", v2, 3000));
    CHECK_OK(kvq_store_put(s, "s2", "y", 1));
    CHECK_OK(kvq_store_del(s, "s1"));

    /* reads fail */
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_READ, 10));
    CHECK_STATUS(get_status(s, "k"), KVQ_ERR_IO);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK(has_value(s, "k", v2, 3000));
    kvq_store_metrics m = stats_of(s);
    CHECK_EQ(m.errors, 2 * 4 + 1 + 1 + 1 + 1);
    kvq_store_close(s);

    /* nothing of the failed writes survives a reopen */
    s = open_ok(dir);
    if (!s)
        return;
    check_clean(s, 3);
    CHECK(has_value(s, "k", v2, 3000));
    CHECK(has_value(s, "other", v1 + 1, 10));
    CHECK(has_value(s, "s2", "y", 1));
    CHECK_STATUS(get_status(s, "new"), KVQ_ERR_RANGE);
    CHECK_STATUS(get_status(s, "s1"), KVQ_ERR_RANGE);
    /* a full disk when a new segment is due */
    kvq_store_close(s);
    char url[400];
    snprintf(url, sizeof url, "file:%s?segment_bytes=8192", dir);
    s = open_ok(url);
    if (!s)
        return;
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NOSPACE, 0));
    CHECK_STATUS(kvq_store_put(s, "big", v1, 5000), KVQ_ERR_NOSPACE);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK_OK(kvq_store_put(s, "big", v1, 5000));
    CHECK(has_value(s, "big", v1, 5000));
    s = reopen(s, url);
    if (!s)
        return;
    m = stats_of(s);
    CHECK_EQ(m.torn_tails + m.corrupt_skipped, 0);
    CHECK(has_value(s, "big", v1, 5000));
    CHECK(has_value(s, "k", v2, 3000));
    kvq_store_close(s);
}

/* Many keys, overwrites and deletes against a model; large values; roll-over. */
static void test_file_many(void) {
    enum { N = 3000 };
    tu_rng rng;
    tu_seed(&rng, 8);
    printf("file store many keys: seed 8\n");
    static uint8_t pool[70000];
    fill_bytes(&rng, pool, sizeof pool);
    static size_t off[N], len[N];
    static int live[N];
    char dir[300], url[400], key[32];
    kvq_store *s = open_fresh_url(dir, sizeof dir, url, sizeof url, "many",
                                  "segment_bytes=65536&compact_min=0");
    if (!s)
        return;
    int fails = 0;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t r = tu_next(&rng);
            snprintf(key, sizeof key, "page/%d/%05d", i % 7, i);
            if (round > 0 && r % 4 == 0) {
                kvq_status st = kvq_store_del(s, key);
                fails += st != (live[i] ? KVQ_OK : KVQ_ERR_RANGE);
                live[i] = 0;
            } else if (round == 0 || r % 4 == 1) {
                len[i] = (size_t)(r >> 8) % 300;
                off[i] = (size_t)(r >> 20) % (sizeof pool - 300);
                fails += kvq_store_put(s, key, pool + off[i], len[i]) != KVQ_OK;
                live[i] = 1;
            }
        }
    }
    CHECK_EQ(fails, 0);
    for (int pass = 0; pass < 2; pass++) {
        size_t want_n = 0, want_bytes = 0;
        int bad = 0;
        for (int i = 0; i < N; i++) {
            snprintf(key, sizeof key, "page/%d/%05d", i % 7, i);
            if (live[i]) {
                want_n++;
                want_bytes += len[i];
                bad += !has_value(s, key, pool + off[i], len[i]);
            } else {
                bad += get_status(s, key) != KVQ_ERR_RANGE;
            }
        }
        CHECK_EQ(bad, 0);
        kvq_store_metrics m = stats_of(s);
        CHECK_EQ(m.records, want_n);
        CHECK_EQ(m.live_bytes, want_bytes);
        CHECK(m.segments > 3);
        CHECK_EQ(m.torn_tails + m.corrupt_skipped, 0);
        list_acc a = {0, 0, 0, NULL};
        CHECK_OK(kvq_store_list(s, "page/3/", list_cb, &a));
        size_t want3 = 0;
        for (int i = 3; i < N; i += 7)
            want3 += live[i];
        CHECK_EQ(a.n, want3);
        s = reopen(s, url); /* second pass: after a reopen */
        if (!s)
            return;
    }

    /* large values: bigger than a segment, and several MiB */
    size_t big = (size_t)9 << 20;
    uint8_t *bv = (uint8_t *)malloc(big);
    fill_bytes(&rng, bv, big);
    CHECK_OK(kvq_store_put(s, "big/1", bv, 200000));
    CHECK_OK(kvq_store_put(s, "big/2", bv + 1, big - 1));
    CHECK(has_value(s, "big/1", bv, 200000));
    CHECK(has_value(s, "big/2", bv + 1, big - 1));
    s = reopen(s, url);
    if (s) {
        CHECK(has_value(s, "big/2", bv + 1, big - 1));
        CHECK(has_value(s, "big/1", bv, 200000));
        kvq_store_close(s);
    }
    free(bv);
}

/* How many of key0..key11 do not hold the 1000 bytes at pool + last[k]. */
static int wrong_keys(kvq_store *s, const uint8_t *pool, const size_t *last) {
    char key[32];
    int bad = 0;
    for (int k = 0; k < 12; k++) {
        snprintf(key, sizeof key, "key%d", k);
        bad += !has_value(s, key, pool + last[k], 1000);
    }
    return bad;
}

static void test_file_compaction(void) {
    tu_rng rng;
    tu_seed(&rng, 9);
    static uint8_t pool[20000];
    fill_bytes(&rng, pool, sizeof pool);
    char dir[300], url[400], key[32];
    kvq_store *s = open_fresh_url(dir, sizeof dir, url, sizeof url, "compact",
                                  "segment_bytes=16384&compact_min=65536");
    if (!s)
        return;
    size_t last[12];
    int fails = 0;
    for (int it = 0; it < 300; it++) {
        int k = it % 12;
        last[k] = (size_t)(tu_next(&rng) % 18000);
        snprintf(key, sizeof key, "key%d", k);
        fails += kvq_store_put(s, key, pool + last[k], 1000) != KVQ_OK;
        if (it % 50 == 49) { /* a key that comes and goes */
            fails += kvq_store_put(s, "temp", pool, 500) != KVQ_OK;
            fails += kvq_store_del(s, "temp") != KVQ_OK;
        }
    }
    CHECK_EQ(fails, 0);
    kvq_store_metrics m = stats_of(s);
    CHECK(m.compactions >= 2);
    CHECK(m.stored_bytes < 65536 * 2 + 16384);
    CHECK_EQ(m.records, 12);
    CHECK_EQ(m.live_bytes, 12000);
    CHECK_EQ(count_files(dir, ".tmp"), 0);
    CHECK_EQ((uint64_t)count_files(dir, ".log"), m.segments);
    CHECK_EQ(wrong_keys(s, pool, last), 0);
    CHECK_STATUS(get_status(s, "temp"), KVQ_ERR_RANGE);
    s = reopen(s, url);
    if (!s)
        return;
    CHECK_EQ(wrong_keys(s, pool, last), 0);
    CHECK_STATUS(get_status(s, "temp"), KVQ_ERR_RANGE);
    m = stats_of(s);
    CHECK_EQ(m.torn_tails + m.corrupt_skipped, 0);
    CHECK_EQ(m.records, 12);

    /* compaction that cannot write gives up without losing anything */
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NOSPACE, 40000));
    fails = 0;
    int nospace = 0;
    for (int it = 0; it < 120; it++) {
        int k = it % 12;
        snprintf(key, sizeof key, "key%d", k);
        size_t o = (size_t)(tu_next(&rng) % 18000);
        kvq_status st = kvq_store_put(s, key, pool + o, 1000);
        if (st == KVQ_OK)
            last[k] = o;
        else
            nospace += st == KVQ_ERR_NOSPACE;
        fails += st != KVQ_OK && st != KVQ_ERR_NOSPACE;
    }
    CHECK_EQ(fails, 0);
    CHECK(nospace > 0);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK_EQ(wrong_keys(s, pool, last), 0);
    CHECK_EQ(count_files(dir, ".tmp"), 0);
    s = reopen(s, url);
    if (!s)
        return;
    CHECK_EQ(wrong_keys(s, pool, last), 0);
    CHECK_EQ(stats_of(s).torn_tails + stats_of(s).corrupt_skipped, 0);
    kvq_store_close(s);
}

/* Every allocation failing in turn: open, put, get, list, reopen. Nothing
 * leaks, nothing crashes, and what succeeded is there. */
static void test_file_failalloc(void) {
    char dir[300];
    int leaks = 0, ok_runs = 0, wrong = 0;
    for (long fail_at = 1; fail_at < 60; fail_at++) {
        fresh_dir(dir, sizeof dir, "failalloc");
        tu_failalloc fa;
        kvq_allocator a = tu_failalloc_make(&fa, fail_at);
        kvq_store *s = NULL;
        if (kvq_store_open(&s, dir, &a, NULL, 0) == KVQ_OK) {
            int put_ok[40];
            char key[16];
            for (int i = 0; i < 40; i++) {
                snprintf(key, sizeof key, "k%d", i);
                put_ok[i] = kvq_store_put(s, key, key, strlen(key)) == KVQ_OK;
            }
            list_acc la = {0, 0, 0, NULL};
            (void)kvq_store_list(s, "", list_cb, &la);
            kvq_store_close(s);
            s = NULL;
            fa.fail_at = 0;
            if (kvq_store_open(&s, dir, &a, NULL, 0) == KVQ_OK) {
                for (int i = 0; i < 40; i++) {
                    snprintf(key, sizeof key, "k%d", i);
                    if (put_ok[i] && !has_value(s, key, key, strlen(key)))
                        wrong++;
                }
                kvq_store_close(s);
                ok_runs++;
            }
        }
        leaks += fa.live_blocks != 0;
    }
    CHECK_EQ(leaks, 0);
    CHECK_EQ(wrong, 0);
    CHECK(ok_runs > 0);

    /* the same through compactions: a failure at any allocation keeps the data */
    static uint8_t pool[4000];
    tu_rng rng;
    tu_seed(&rng, 10);
    fill_bytes(&rng, pool, sizeof pool);
    leaks = wrong = ok_runs = 0;
    int compactions = 0;
    for (long fail_at = 1; fail_at < 120; fail_at += 3) {
        char url[400], key[16];
        fresh_dir(dir, sizeof dir, "failalloc2");
        snprintf(url, sizeof url, "file:%s?segment_bytes=4096&compact_min=8192", dir);
        tu_failalloc fa;
        kvq_allocator a = tu_failalloc_make(&fa, fail_at);
        kvq_store *s = NULL;
        if (kvq_store_open(&s, url, &a, NULL, 0) != KVQ_OK) {
            leaks += fa.live_blocks != 0;
            continue;
        }
        long last[5] = {-1, -1, -1, -1, -1};
        for (int i = 0; i < 100; i++) {
            snprintf(key, sizeof key, "c%d", i % 5);
            long o = (long)(tu_next(&rng) % 3000);
            if (kvq_store_put(s, key, pool + o, 300) == KVQ_OK)
                last[i % 5] = o;
        }
        kvq_store_metrics m;
        if (kvq_store_stats(s, &m) == KVQ_OK)
            compactions += m.compactions > 0;
        for (int k = 0; k < 5; k++) { /* still readable in this session */
            snprintf(key, sizeof key, "c%d", k);
            void *d = NULL;
            size_t sz = 0;
            kvq_status gs = last[k] >= 0 ? kvq_store_get(s, key, &d, &sz) : KVQ_ERR_NOMEM;
            if (gs != KVQ_ERR_NOMEM &&
                (gs != KVQ_OK || sz != 300 || memcmp(d, pool + last[k], 300)))
                wrong++;
            kvq_store_free_buf(s, d);
        }
        kvq_store_close(s);
        fa.fail_at = 0;
        if (kvq_store_open(&s, url, &a, NULL, 0) == KVQ_OK) {
            for (int k = 0; k < 5; k++) {
                snprintf(key, sizeof key, "c%d", k);
                if (last[k] >= 0 && !has_value(s, key, pool + last[k], 300))
                    wrong++;
            }
            kvq_store_close(s);
            ok_runs++;
        }
        leaks += fa.live_blocks != 0;
        CHECK_EQ(count_files(dir, ".tmp"), 0);
    }
    CHECK_EQ(leaks, 0);
    CHECK_EQ(wrong, 0);
    CHECK(ok_runs > 0);
    CHECK(compactions > 0);
}

/* ---------------------------------------------------------------- segment ids */

static int write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = n ? write(fd, data, n) : 0;
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

/* A directory holding one empty segment file named seg-<id>.log. */
static int dir_with_empty_seg(char *dir, size_t dn, const char *name, const char *id) {
    char p[400];
    fresh_dir(dir, dn, name);
    snprintf(p, sizeof p, "%s/seg-%s.log", dir, id);
    return mkdir(dir, 0755) == 0 && write_file(p, "", 0) == 0 ? 0 : -1;
}

/* The smallest and largest id of the seg-<id>.log files in dir (0 and 0
 * when none); the number of them. */
static int seg_id_span(const char *dir, unsigned long long *lo, unsigned long long *hi) {
    DIR *d = opendir(dir);
    int n = 0;
    *lo = *hi = 0;
    if (!d)
        return -1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "seg-", 4) != 0 || l < 9 || strcmp(de->d_name + l - 4, ".log") != 0)
            continue;
        unsigned long long id = strtoull(de->d_name + 4, NULL, 10);
        if (n == 0 || id < *lo)
            *lo = id;
        if (n == 0 || id > *hi)
            *hi = id;
        n++;
    }
    closedir(d);
    return n;
}

/* Segment ids go past 2^32 - 1 without wrapping: from one empty
 * seg-4294967294.log, puts that roll over and compactions that write new
 * segments keep every acknowledged value, before and after a reopen. When
 * no id is left (seg-18446744073709551614.log is the largest id there is)
 * a put that needs a new segment is refused, and nothing is lost. */
static void test_file_segment_ids(void) {
    tu_rng rng;
    tu_seed(&rng, 31);
    static uint8_t val[8][3000];
    for (int i = 0; i < 8; i++)
        fill_bytes(&rng, val[i], sizeof val[i]);
    char dir[300], url[400], key[32];
    unsigned long long lo, hi;

    /* roll-over across 2^32 */
    CHECK_EQ(dir_with_empty_seg(dir, sizeof dir, "ids-roll", "4294967294"), 0);
    snprintf(url, sizeof url, "file:%s?segment_bytes=4096&compact_min=0", dir);
    kvq_store *s = open_ok(url);
    if (!s)
        return;
    int fails = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        fails += kvq_store_put(s, key, val[i], sizeof val[i]) != KVQ_OK;
    }
    CHECK_EQ(fails, 0);
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK(has_value(s, key, val[i], sizeof val[i]));
    }
    CHECK_EQ(stats_of(s).segments, 4);
    s = reopen(s, url);
    if (!s)
        return;
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK(has_value(s, key, val[i], sizeof val[i]));
    }
    check_clean(s, 4);
    kvq_store_close(s);
    CHECK_EQ(seg_id_span(dir, &lo, &hi), 4);
    CHECK_EQ(lo, 4294967294ull);
    CHECK_EQ(hi, 4294967297ull);

    /* compaction across 2^32 */
    CHECK_EQ(dir_with_empty_seg(dir, sizeof dir, "ids-compact", "4294967293"), 0);
    snprintf(url, sizeof url, "file:%s?segment_bytes=4096&compact_min=4096", dir);
    s = open_ok(url);
    if (!s)
        return;
    fails = 0;
    fails += kvq_store_put(s, "b", val[7], 1500) != KVQ_OK;
    for (int it = 0; it < 24; it++)
        fails += kvq_store_put(s, "a", val[it % 7] + it, 1500) != KVQ_OK;
    CHECK_EQ(fails, 0);
    CHECK(stats_of(s).compactions >= 3);
    CHECK(has_value(s, "a", val[23 % 7] + 23, 1500));
    CHECK(has_value(s, "b", val[7], 1500));
    s = reopen(s, url);
    if (!s)
        return;
    CHECK(has_value(s, "a", val[23 % 7] + 23, 1500));
    CHECK(has_value(s, "b", val[7], 1500));
    check_clean(s, 2);
    kvq_store_close(s);
    CHECK(seg_id_span(dir, &lo, &hi) >= 1);
    CHECK(lo > 4294967295ull);
    CHECK_EQ(count_files(dir, ".tmp"), 0);

    /* no id left: refused before anything is written */
    CHECK_EQ(dir_with_empty_seg(dir, sizeof dir, "ids-last", "18446744073709551614"), 0);
    snprintf(url, sizeof url, "file:%s?segment_bytes=4096&compact_min=0", dir);
    s = open_ok(url);
    if (!s)
        return;
    CHECK_OK(kvq_store_put(s, "a", val[0], sizeof val[0]));
    CHECK_STATUS(kvq_store_put(s, "b", val[1], sizeof val[1]), KVQ_ERR_NOSPACE);
    CHECK(strstr(kvq_store_last_error(s), "segment id") != NULL);
    CHECK_OK(kvq_store_put(s, "c", "small", 5)); /* still fits the last segment */
    CHECK(has_value(s, "a", val[0], sizeof val[0]));
    CHECK_STATUS(get_status(s, "b"), KVQ_ERR_RANGE);
    s = reopen(s, url);
    if (!s)
        return;
    CHECK(has_value(s, "a", val[0], sizeof val[0]));
    CHECK(has_value(s, "c", "small", 5));
    CHECK_STATUS(get_status(s, "b"), KVQ_ERR_RANGE);
    check_clean(s, 2);
    kvq_store_close(s);
    /* a compaction that finds no id left gives up; the puts stand */
    snprintf(url, sizeof url, "file:%s?segment_bytes=4096&compact_min=1", dir);
    s = open_ok(url);
    if (!s)
        return;
    fails = 0;
    for (int i = 0; i < 3; i++)
        fails += kvq_store_put(s, "c", val[i], 100) != KVQ_OK;
    CHECK_EQ(fails, 0);
    CHECK_EQ(stats_of(s).compactions, 0);
    s = reopen(s, url);
    if (!s)
        return;
    CHECK(has_value(s, "a", val[0], sizeof val[0]));
    CHECK(has_value(s, "c", val[2], 100));
    kvq_store_close(s);
    CHECK_EQ(seg_id_span(dir, &lo, &hi), 1);
    CHECK_EQ(count_files(dir, ".tmp"), 0);

    /* names: ids in numeric order whatever their width (seg-1000000.log
     * is newer than seg-999999.log); other spellings of an id are not
     * segment files; an id this store never writes refuses the open */
    fresh_dir(dir, sizeof dir, "ids-names");
    CHECK_EQ(mkdir(dir, 0755), 0);
    uint8_t e[64];
    char p[400];
    size_t n = make_entry(e, KVQ__SEG_PUT, "k", "old", 3);
    snprintf(p, sizeof p, "%s/seg-999999.log", dir);
    CHECK_EQ(write_file(p, e, n), 0);
    n = make_entry(e, KVQ__SEG_PUT, "k", "new", 3);
    snprintf(p, sizeof p, "%s/seg-1000000.log", dir);
    CHECK_EQ(write_file(p, e, n), 0);
    n = make_entry(e, KVQ__SEG_PUT, "k", "one", 3);
    snprintf(p, sizeof p, "%s/seg-1.log", dir);
    CHECK_EQ(write_file(p, e, n), 0);
    snprintf(p, sizeof p, "%s/seg-0000002.log", dir);
    CHECK_EQ(write_file(p, e, n), 0);
    snprintf(url, sizeof url, "file:%s", dir);
    s = open_ok(url);
    if (!s)
        return;
    CHECK(has_value(s, "k", "new", 3));
    CHECK_OK(kvq_store_put(s, "m", "m", 1));
    check_clean(s, 2);
    s = reopen(s, url);
    if (!s)
        return;
    CHECK(has_value(s, "k", "new", 3));
    CHECK(has_value(s, "m", "m", 1));
    kvq_store_close(s);
    CHECK_EQ(seg_id_span(dir, &lo, &hi), 4);
    CHECK_EQ(hi, 1000000); /* the put went to the active segment */
    static const char *const refused[] = {"000000", "18446744073709551615",
                                          "18446744073709551616", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(p, sizeof p, "%s/seg-%s.log", dir, refused[i]);
        CHECK_EQ(write_file(p, "", 0), 0);
        for (int ro = 0; ro < 2; ro++) {
            kvq_store *s2 = NULL;
            char err[256] = "";
            snprintf(url, sizeof url, "file:%s?readonly=%d", dir, ro);
            CHECK_STATUS(kvq_store_open(&s2, url, NULL, err, sizeof err), KVQ_ERR_CORRUPT);
            TU_REPORT(strstr(err, refused[i]) != NULL, "seg-%s.log: '%s'", refused[i], err);
        }
        unlink(p);
    }
    s = open_ok(url);
    kvq_store_close(s);
}

/* ---------------------------------------------------------------- two processes */

/* A child process that opens url (a writer puts key=key first), tells the
 * parent the status through a pipe, then holds the store until the parent
 * writes a byte to *go (or kills it). */
typedef struct {
    pid_t pid;
    int go;
} holder;

static kvq_status hold_in_child(holder *h, const char *url, const char *key) {
    int up[2], down[2];
    h->pid = -1;
    h->go = -1;
    if (pipe(up) != 0)
        return KVQ_ERR_IO;
    if (pipe(down) != 0) {
        close(up[0]);
        close(up[1]);
        return KVQ_ERR_IO;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        kvq_store *s = NULL;
        int st = kvq_store_open(&s, url, NULL, NULL, 0);
        if (st == KVQ_OK && key)
            st = kvq_store_put(s, key, key, strlen(key));
        if (write(up[1], &st, sizeof st) != (ssize_t)sizeof st)
            _exit(2);
        char c;
        if (read(down[0], &c, 1) < 0)
            _exit(3);
        kvq_store_close(s);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    int st = KVQ_ERR_IO;
    if (pid < 0 || read(up[0], &st, sizeof st) != (ssize_t)sizeof st)
        st = KVQ_ERR_IO;
    close(up[0]);
    h->pid = pid;
    h->go = down[1];
    return (kvq_status)st;
}

/* Lets the child close the store and exit (or kills it); its exit status. */
static int release_child(holder *h, int kill_it) {
    if (h->pid <= 0)
        return -1;
    if (kill_it)
        kill(h->pid, SIGKILL);
    else if (write(h->go, "x", 1) != 1)
        return -1;
    close(h->go);
    int ws = 0;
    if (waitpid(h->pid, &ws, 0) != h->pid)
        return -1;
    h->pid = -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

/* The status and message of opening url from this process. */
static kvq_status try_open(const char *url, char *err, size_t en) {
    kvq_store *s = NULL;
    err[0] = 0;
    kvq_status st = kvq_store_open(&s, url, NULL, err, en);
    kvq_store_close(s);
    return st;
}

/* Two processes on one directory: one writer, or any number of readonly
 * opens, at a time. A second writer, a reader beside a writer and a writer
 * beside readers are refused at once with KVQ_ERR_IO and a message that
 * says which kind of open holds the lock; a killed writer's lock goes with
 * it and its acknowledged puts stay. */
static void test_file_two_processes(void) {
    char dir[300], wurl[400], rurl[400], err[256];
    fresh_dir(dir, sizeof dir, "procs");
    snprintf(wurl, sizeof wurl, "file:%s", dir);
    snprintf(rurl, sizeof rurl, "file:%s?readonly=1", dir);
    holder h;

    /* a writer in another process */
    CHECK_OK(hold_in_child(&h, wurl, "from-writer"));
    CHECK_STATUS(try_open(wurl, err, sizeof err), KVQ_ERR_IO);
    TU_REPORT(strstr(err, "locked") && strstr(err, "a writer has it open"), "second writer: '%s'",
              err);
    CHECK_STATUS(try_open(rurl, err, sizeof err), KVQ_ERR_IO);
    TU_REPORT(strstr(err, "locked") && strstr(err, "a writer has it open"), "reader: '%s'", err);
    CHECK_EQ(release_child(&h, 0), 0);
    kvq_store *s = open_ok(wurl);
    if (s)
        CHECK(has_value(s, "from-writer", "from-writer", 11));
    kvq_store_close(s);

    /* readers in other processes: more readers are welcome, writers not */
    holder h2;
    CHECK_OK(hold_in_child(&h, rurl, NULL));
    CHECK_OK(hold_in_child(&h2, rurl, NULL));
    CHECK_STATUS(try_open(wurl, err, sizeof err), KVQ_ERR_IO);
    TU_REPORT(strstr(err, "locked") && strstr(err, "open readonly"), "writer beside readers: '%s'",
              err);
    s = open_ok(rurl);
    if (s)
        CHECK(has_value(s, "from-writer", "from-writer", 11));
    kvq_store_close(s);
    CHECK_EQ(release_child(&h, 0), 0);
    CHECK_STATUS(try_open(wurl, err, sizeof err), KVQ_ERR_IO); /* one reader is left */
    CHECK_EQ(release_child(&h2, 0), 0);
    CHECK_OK(try_open(wurl, err, sizeof err));

    /* a writer killed while holding the store */
    CHECK_OK(hold_in_child(&h, wurl, "acked"));
    CHECK_EQ(release_child(&h, 1), 128 + SIGKILL);
    s = open_ok(wurl);
    if (s) {
        CHECK(has_value(s, "acked", "acked", 5));
        CHECK(has_value(s, "from-writer", "from-writer", 11));
        check_clean(s, 2);
    }
    kvq_store_close(s);
}

/* ---------------------------------------------------------------- redis */

static pid_t g_redis = -1;
static int g_port;

static void redis_kill(int sig) {
    if (g_redis > 0) {
        kill(g_redis, sig);
        waitpid(g_redis, NULL, 0);
        g_redis = -1;
    }
}

static void redis_atexit(void) { redis_kill(SIGKILL); }

static int in_path(const char *prog) {
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char buf[1024];
    while (*path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, path, prog);
        if (n && access(buf, X_OK) == 0)
            return 1;
        path += n + (c ? 1 : 0);
    }
    return 0;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts redis-server on g_port and waits until a store opens on it. */
static int redis_start(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", g_port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
        }
        execlp("redis-server", "redis-server", "--port", port, "--save", "", "--appendonly", "no",
               "--bind", "127.0.0.1", "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    g_redis = pid;
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", g_port);
    for (int i = 0; i < 100; i++) {
        kvq_store *s = NULL;
        if (kvq_store_open(&s, url, NULL, NULL, 0) == KVQ_OK) {
            kvq_store_close(s);
            return 0;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            g_redis = -1;
            return -1;
        }
        sleep_ms(50);
    }
    return -1;
}

/* Sends a raw RESP command (to make a key of the wrong type). */
static int redis_raw(const char *resp) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)g_port);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             write(fd, resp, strlen(resp)) == (ssize_t)strlen(resp);
    char buf[64];
    ok = ok && read(fd, buf, sizeof buf) > 0;
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

static void test_redis(void) {
    kvq_store *s = NULL;
    char err[256] = "";
    kvq_status st = kvq_store_open(&s, "redis://127.0.0.1:1", NULL, err, sizeof err);
    if (st == KVQ_ERR_UNSUPPORTED) {
        CHECK(strstr(err, "hiredis not found") != NULL);
        printf("SKIP redis: built without hiredis (%s)\n", err);
        return;
    }
    CHECK_STATUS(st, KVQ_ERR_CONN); /* nothing listens on port 1 */
    CHECK(s == NULL && strstr(err, "127.0.0.1:1") != NULL);
    CHECK_STATUS(kvq_store_open(&s, "redis://", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s, "redis://h:0", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s, "redis://h:99999", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s, "redis://h:12x", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_store_open(&s, "redis://h:1/bad:ns", NULL, NULL, 0), KVQ_ERR_INVALID_ARG);
    if (!in_path("redis-server")) {
        printf("SKIP redis: redis-server not found in PATH\n");
        return;
    }
    g_port = free_port();
    atexit(redis_atexit);
    if (g_port <= 0 || redis_start() != 0) {
        TU_REPORT(0, "redis-server did not start on port %d", g_port);
        return;
    }
    printf("redis-server on 127.0.0.1:%d\n", g_port);
    char url[96], url2[96];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/t1", g_port);
    /* the second handle by host name, where "localhost" resolves (a bare
     * chroot has no /etc/hosts: then by address, and the name form is
     * skipped, named) */
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int named = getaddrinfo("localhost", NULL, &hints, &ai) == 0;
    if (ai)
        freeaddrinfo(ai);
    snprintf(url2, sizeof url2, "redis://%s:%d/t2", named ? "localhost" : "127.0.0.1", g_port);
    if (!named)
        printf("SKIP redis host name: 'localhost' does not resolve here (no /etc/hosts entry)\n");
    s = open_ok(url);
    kvq_store *s2 = open_ok(url2);
    if (!s || !s2) {
        kvq_store_close(s);
        kvq_store_close(s2);
        return;
    }
    tu_rng rng;
    tu_seed(&rng, 12);
    size_t big = (size_t)4 << 20;
    uint8_t *bv = (uint8_t *)malloc(big);
    fill_bytes(&rng, bv, big);
    CHECK_OK(kvq_store_put(s, "a", "one", 3));
    CHECK_OK(kvq_store_put(s, "bin", bv, 1000)); /* NUL bytes inside */
    CHECK_OK(kvq_store_put(s, "empty", "", 0));
    CHECK_OK(kvq_store_put(s, "big", bv, big));
    CHECK_OK(kvq_store_put(s, "gl*b?[x]", "g", 1));
    CHECK_OK(kvq_store_put(s, "gl-other", "h", 1));
    CHECK_OK(kvq_store_put(s2, "a", "other ns", 8));
    CHECK(has_value(s, "a", "one", 3));
    CHECK(has_value(s, "bin", bv, 1000));
    CHECK(has_value(s, "empty", "", 0));
    CHECK(has_value(s, "big", bv, big));
    CHECK(has_value(s2, "a", "other ns", 8));
    CHECK_OK(kvq_store_put(s, "a", "uno", 3));
    CHECK(has_value(s, "a", "uno", 3));
    CHECK_STATUS(get_status(s, "missing"), KVQ_ERR_RANGE);
    CHECK_STATUS(kvq_store_del(s, "missing"), KVQ_ERR_RANGE);
    list_acc a = {0, 0, 0, NULL};
    CHECK_OK(kvq_store_list(s, "", list_cb, &a));
    CHECK_EQ(a.n, 6);
    CHECK_EQ(a.bytes, 3 + 1000 + 0 + big + 1 + 1);
    memset(&a, 0, sizeof a);
    CHECK_OK(kvq_store_list(s, "gl*b?[", list_cb, &a)); /* glob characters are literal */
    CHECK_EQ(a.n, 1);
    memset(&a, 0, sizeof a);
    CHECK_OK(kvq_store_list(s2, NULL, list_cb, &a));
    CHECK_EQ(a.n, 1);
    kvq_store_metrics m = stats_of(s);
    CHECK_EQ(m.records, 6);
    CHECK_EQ(m.live_bytes, 3 + 1000 + 0 + big + 1 + 1);
    CHECK_EQ(m.puts, 7);

    /* many keys: SCAN takes several batches */
    int fails = 0;
    char key[32];
    for (int i = 0; i < 1500; i++) {
        snprintf(key, sizeof key, "many/%04d", i);
        fails += kvq_store_put(s, key, key, 9) != KVQ_OK;
    }
    CHECK_EQ(fails, 0);
    memset(&a, 0, sizeof a);
    CHECK_OK(kvq_store_list(s, "many/", list_cb, &a));
    CHECK(a.n >= 1500); /* SCAN may repeat a key, never miss one */
    CHECK_EQ(stats_of(s).records, 1506);
    memset(&a, 0, sizeof a);
    a.del_from = s;
    CHECK_OK(kvq_store_list(s, "many/", list_cb, &a));
    CHECK_EQ(stats_of(s).records, 6);

    /* a key of another type under our name */
    CHECK_OK(redis_raw("*3\r\n$5\r\nLPUSH\r\n$9\r\nkvq:t1:li\r\n$1\r\nx\r\n"));
    CHECK_STATUS(get_status(s, "li"), KVQ_ERR_CORRUPT);
    CHECK(strstr(kvq_store_last_error(s), "WRONGTYPE") != NULL);
    CHECK_OK(kvq_store_del(s, "li"));

    /* an injected disconnect: one call fails, the next reconnects */
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_DISCONNECT, 1));
    CHECK(has_value(s, "a", "uno", 3));
    CHECK_STATUS(get_status(s, "a"), KVQ_ERR_CONN);
    CHECK(has_value(s, "a", "uno", 3));
    CHECK_STATUS(kvq_store_inject_fault(s, KVQ_FAULT_SYNC, 0), KVQ_ERR_UNSUPPORTED);
    /* injected full store and read errors: old values stay, clearing heals */
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NOSPACE, 5));
    CHECK_OK(kvq_store_put(s, "f1", "abc", 3));
    CHECK_STATUS(kvq_store_put(s, "a", "toolong", 7), KVQ_ERR_NOSPACE);
    CHECK(has_value(s, "a", "uno", 3));
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_WRITE_IO, 0));
    CHECK_STATUS(kvq_store_put(s, "a", "x", 1), KVQ_ERR_IO);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_READ, 3));
    CHECK(has_value(s, "f1", "abc", 3));
    CHECK_STATUS(get_status(s, "a"), KVQ_ERR_IO);
    CHECK_OK(kvq_store_inject_fault(s, KVQ_FAULT_NONE, 0));
    CHECK(has_value(s, "a", "uno", 3));
    CHECK_OK(kvq_store_del(s, "f1"));

    /* the server goes away: calls fail with KVQ_ERR_CONN, no crash, no SIGPIPE */
    redis_kill(SIGKILL);
    CHECK_STATUS(kvq_store_put(s, "a", "dead", 4), KVQ_ERR_CONN);
    CHECK(kvq_store_last_error(s)[0] != 0);
    CHECK_STATUS(get_status(s, "a"), KVQ_ERR_CONN); /* the reconnect fails */
    CHECK_STATUS(kvq_store_list(s, "", list_cb, &a), KVQ_ERR_CONN);
    kvq_store_metrics m1;
    CHECK_STATUS(kvq_store_stats(s, &m1), KVQ_ERR_CONN);
    /* ... and comes back (empty: no persistence): the next call reconnects */
    if (redis_start() != 0) {
        TU_REPORT(0, "redis-server did not restart");
    } else {
        CHECK_STATUS(get_status(s, "a"), KVQ_ERR_RANGE);
        CHECK_OK(kvq_store_put(s, "a", "back", 4));
        CHECK(has_value(s, "a", "back", 4));
        /* s2 still holds the old connection: one KVQ_ERR_CONN, then it works */
        kvq_status st2 = kvq_store_put(s2, "b", "x", 1);
        CHECK(st2 == KVQ_ERR_CONN || st2 == KVQ_OK);
        CHECK_OK(kvq_store_put(s2, "b", "x", 1));
        CHECK(has_value(s2, "b", "x", 1));
        m = stats_of(s);
        CHECK(m.errors >= 5);
    }
    kvq_store_close(s);
    kvq_store_close(s2);
    free(bv);
    redis_kill(SIGTERM);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    snprintf(g_tmp, sizeof g_tmp, "%s/kvq_test_store.XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_tmp)) {
        fprintf(stderr, "cannot create a temporary directory\n");
        return 1;
    }
    test_records();
    test_file_basic();
    test_file_torn();
    test_file_corrupt();
    test_file_faults();
    test_file_many();
    test_file_compaction();
    test_file_failalloc();
    test_file_segment_ids();
    test_file_two_processes();
    test_redis();
    rm_tree(g_tmp);
    return tu_finish();
}
