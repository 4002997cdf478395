/*
 * test_hpool.c - the cache's default allocator of page blocks (hpool.c):
 * blocks of registered sizes back to back in 2 MiB aligned regions, reuse
 * of freed blocks, every other size from posix_memalign, a failed mapping
 * leaving the pool as it was; and a cache on it (kvq_cache_config
 * huge_pages 0) against the same cache on posix_memalign (-1): the same
 * attention output bit for bit, the same stored_bytes, arena_bytes that
 * stops growing once evictions free blocks for the appends.
 */
#include "cache/cache_impl.h"
#include "common/common.h"
#include "testutil.h"

#include <pthread.h>
#include <stdint.h>

#define MIB ((size_t)1 << 20)

static void test_pool(void) {
    kvq__hpool *p;
    CHECK_OK(kvq__hpool_create(&p));
    kvq_allocator a;
    kvq__hpool_allocator(p, &a);
    const size_t sz = 131072 + 96; /* an f32 page block with a header: not a multiple of 64 */
    CHECK_EQ(kvq__hpool_add_size(p, sz), 0);
    CHECK_EQ(kvq__hpool_add_size(p, sz), 0); /* again: the same class */
    CHECK_EQ(kvq__hpool_add_size(p, 4), -1); /* no room for the free-list link */
    CHECK_EQ(kvq__hpool_mapped(p), 0);       /* nothing mapped before the first block */

    uint8_t *b[64];
    b[0] = (uint8_t *)kvq__alloc(&a, sz);
    b[1] = (uint8_t *)kvq__alloc(&a, sz);
    CHECK(b[0] && b[1]);
    CHECK_EQ((uintptr_t)b[0] % (2 * MIB), 0); /* 2 MiB aligned: whole huge pages */
    /* back to back: the size rounded up to 64 bytes (ASan: plus a redzone) */
    const size_t stride = (size_t)(b[1] - b[0]);
#ifdef __SANITIZE_ADDRESS__
    CHECK_EQ(stride, (sz + 63) / 64 * 64 + 64);
#else
    CHECK_EQ(stride, (sz + 63) / 64 * 64);
#endif
    /* the first region (2 MiB) holds n1 blocks, the second (4 MiB) n2 */
    const size_t n1 = 2 * MIB / stride, n2 = 4 * MIB / stride, n = n1 + n2;
    for (size_t i = 2; i < n1; i++)
        b[i] = (uint8_t *)kvq__alloc(&a, sz);
    int adjacent = 1;
    for (size_t i = 1; i < n1; i++)
        adjacent &= b[i] - b[i - 1] == (ptrdiff_t)stride;
    CHECK(adjacent);
    CHECK_EQ(kvq__hpool_mapped(p), 2 * MIB);
    CHECK_EQ(kvq__hpool_in_use(p), n1 * sz);
    for (size_t i = n1; i < n; i++)
        b[i] = (uint8_t *)kvq__alloc(&a, sz);
    CHECK(b[n - 1] != NULL);
    CHECK_EQ((uintptr_t)b[n1] % (2 * MIB), 0);
    CHECK_EQ(kvq__hpool_mapped(p), 6 * MIB);
    for (size_t i = 0; i < n; i++)
        memset(b[i], (int)(i + 1), sz);

    /* a failed mapping: NULL, nothing changed; the next one succeeds */
    size_t used = kvq__hpool_in_use(p);
    kvq__hpool_fail_maps(p, 1);
    CHECK(kvq__alloc(&a, sz) == NULL);
    CHECK_EQ(kvq__hpool_mapped(p), 6 * MIB);
    CHECK_EQ(kvq__hpool_in_use(p), used);
    uint8_t *extra = (uint8_t *)kvq__alloc(&a, sz);
    CHECK(extra != NULL);
    CHECK_EQ(kvq__hpool_mapped(p), 14 * MIB);

    /* freed blocks are handed out again, last freed first, before any new
     * memory; the other blocks keep their bytes */
    kvq__free(&a, b[3]);
    kvq__free(&a, b[5]);
    CHECK(kvq__alloc(&a, sz) == b[5]);
    CHECK(kvq__alloc(&a, sz) == b[3]);
    CHECK_EQ(kvq__hpool_mapped(p), 14 * MIB);
    int kept = 1;
    for (size_t i = 0; i < n; i++)
        if (i != 3 && i != 5)
            kept &= b[i][0] == (uint8_t)(i + 1) && b[i][sz - 1] == (uint8_t)(i + 1);
    CHECK(kept);

    /* other sizes go to posix_memalign, 64-byte aligned, freed by free */
    void *o = kvq__alloc(&a, sz + 64);
    CHECK(o != NULL);
    CHECK_EQ((uintptr_t)o % 64, 0);
    CHECK_EQ(kvq__hpool_in_use(p), n * sz + sz);
    kvq__free(&a, o);

    /* at most KVQ__HPOOL_CLASSES sizes */
    int added = 1;
    for (size_t i = 1; i < KVQ__HPOOL_CLASSES; i++)
        added &= kvq__hpool_add_size(p, 4096 * i) == 0;
    CHECK(added);
    CHECK_EQ(kvq__hpool_add_size(p, 999 * 64), -1);
    void *s = kvq__alloc(&a, 4096); /* a small class shares nothing with the large one */
    CHECK(s != NULL);
    CHECK_EQ(kvq__hpool_mapped(p), 16 * MIB);
    kvq__free(&a, s);

    for (size_t i = 0; i < n; i++)
        kvq__free(&a, b[i]);
    CHECK_EQ(kvq__hpool_mapped(p), 16 * MIB); /* one block of the size left */
    kvq__free(&a, extra);
    CHECK_EQ(kvq__hpool_in_use(p), 0);
    /* no block of the size in use: its regions are unmapped but the one
     * being carved (8 MiB, holding extra), which starts over */
    CHECK_EQ(kvq__hpool_mapped(p), 8 * MIB + 2 * MIB);
    uint8_t *again = (uint8_t *)kvq__alloc(&a, sz);
    CHECK(again == extra);
    CHECK_EQ(kvq__hpool_mapped(p), 8 * MIB + 2 * MIB);
    kvq__free(&a, again);
    kvq__hpool_destroy(p);
    kvq__hpool_destroy(NULL);
}

/* Two threads allocate and free blocks of one size at once (get_kv may
 * read cold pages into blocks on several threads): no block is handed to
 * both, and each keeps what its thread wrote. */
typedef struct {
    kvq_allocator a;
    size_t sz;
    uint8_t tag;
    int bad;
} thr_arg;

static _Atomic int thr_ready;

static void *thr_run(void *v) {
    thr_arg *t = (thr_arg *)v;
    uint8_t *held[8] = {0};
    thr_ready++; /* start together */
    while (thr_ready < 2)
        ;
    for (int i = 0; i < 200000; i++) {
        int k = i % 8;
        if (held[k]) {
            for (size_t j = 0; j < t->sz; j += 1021)
                t->bad |= held[k][j] != t->tag;
            kvq__free(&t->a, held[k]);
        }
        held[k] = (uint8_t *)kvq__alloc(&t->a, t->sz);
        if (!held[k]) {
            t->bad = 1;
            break;
        }
        for (size_t j = 0; j < t->sz; j += 1021)
            held[k][j] = t->tag;
    }
    for (int k = 0; k < 8; k++)
        kvq__free(&t->a, held[k]);
    return NULL;
}

static void test_threads(void) {
    kvq__hpool *p;
    CHECK_OK(kvq__hpool_create(&p));
    kvq_allocator a;
    kvq__hpool_allocator(p, &a);
    const size_t sz = 3 * 4096;
    CHECK_EQ(kvq__hpool_add_size(p, sz), 0);
    thr_arg t[2] = {{a, sz, 0x5a, 0}, {a, sz, 0xa5, 0}};
    pthread_t th;
    thr_ready = 0;
    int started = pthread_create(&th, NULL, thr_run, &t[1]) == 0;
    if (!started)
        thr_ready = 1; /* this thread alone */
    thr_run(&t[0]);
    if (started)
        pthread_join(th, NULL);
    CHECK(started);
    CHECK(!t[0].bad && !t[1].bad);
    CHECK_EQ(kvq__hpool_in_use(p), 0);
    /* 16 blocks live at most: one region of 2 MiB */
    CHECK_EQ(kvq__hpool_mapped(p), 2 * MIB);
    kvq__hpool_destroy(p);
}

/* A one-codec cache config of the given shape. */
static kvq_cache_config hp_cfg(size_t L, size_t H, size_t QH, size_t D, size_t max_tokens,
                               const char *codec) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = L;
    cfg.n_kv_heads = H;
    cfg.n_q_heads = QH;
    cfg.head_dim = D;
    cfg.max_tokens = max_tokens;
    cfg.k_codec = cfg.v_codec = codec;
    return cfg;
}

/* The same sequence on a cache with the pool (0) and without (-1). */
static void test_cache(const char *codec) {
    const size_t H = 2, QH = 8, D = 64, T = 700, CAP = 512;
    kvq_cache *c[2];
    for (int k = 0; k < 2; k++) {
        /* appends past CAP evict: blocks freed and reused */
        kvq_cache_config cfg = hp_cfg(2, H, QH, D, CAP, codec);
        cfg.policy = KVQ_POLICY_FIFO;
        cfg.huge_pages = k ? -1 : 0;
        CHECK_OK(kvq_cache_create(&c[k], &cfg));
    }
    tu_rng r;
    tu_seed(&r, 11);
    float *kv = (float *)malloc(2 * 64 * H * D * sizeof(float));
    float q[8 * 64], out[2][8 * 64];
    tu_fill_gauss(&r, q, QH * D, 1.0f);
    int same = 1;
    uint64_t arena_mid = 0;
    for (size_t t = 0; t < T; t += 64) {
        tu_fill_gauss(&r, kv, 2 * 64 * H * D, 1.0f);
        for (int k = 0; k < 2; k++)
            for (int l = 0; l < 2; l++)
                CHECK_OK(kvq_cache_append(c[k], l, kv, kv + 64 * H * D, NULL, 64));
        int32_t pos = (int32_t)(t + 64);
        for (int k = 0; k < 2; k++)
            CHECK_OK(kvq_cache_attend(c[k], 1, q, &pos, 1, out[k], QH * D, NULL, 0));
        same &= memcmp(out[0], out[1], sizeof out[0]) == 0;
        kvq_stats s0, s1;
        kvq_cache_stats(c[0], -1, &s0);
        kvq_cache_stats(c[1], -1, &s1);
        CHECK_EQ(s0.stored_bytes, s1.stored_bytes);
        CHECK_EQ(s1.arena_bytes, 0);
        CHECK(s0.arena_bytes > 0);
        if (t + 64 == CAP + 64)
            arena_mid = s0.arena_bytes;
        if (t + 64 > CAP + 64) /* at capacity: freed blocks take the new tokens */
            CHECK_EQ(s0.arena_bytes, arena_mid);
    }
    CHECK(same);
    free(kv);
    kvq_cache_free(c[0]);
    kvq_cache_free(c[1]);
}

/* A switch of codec frees every block of the old size: the pool unmaps
 * that size's regions but the one being carved. Against a cache created
 * with the new codec (which maps just the regions of the new blocks). */
static void test_switch(void) {
    const size_t H = 8, D = 128, T = 2048;
    kvq_cache *c[2];
    for (int k = 0; k < 2; k++) {
        kvq_cache_config cfg = hp_cfg(1, H, H, D, T, "int8");
        cfg.v_codec = k ? "int4:g=32" : "int8";
        CHECK_OK(kvq_cache_create(&c[k], &cfg));
    }
    tu_rng r;
    tu_seed(&r, 5);
    float *kv = (float *)malloc(2 * 256 * H * D * sizeof(float));
    for (size_t t = 0; t < T; t += 256) {
        tu_fill_gauss(&r, kv, 2 * 256 * H * D, 1.0f);
        for (int k = 0; k < 2; k++)
            CHECK_OK(kvq_cache_append(c[k], 0, kv, kv + 256 * H * D, NULL, 256));
    }
    float q[8 * 128], out[8 * 128];
    tu_fill_gauss(&r, q, H * D, 1.0f);
    int32_t pos = (int32_t)T;
    for (int k = 0; k < 2; k++) /* encodes the staged tokens */
        CHECK_OK(kvq_cache_attend(c[k], 0, q, &pos, 1, out, H * D, NULL, 0));
    kvq_stats s0, s1, s2;
    kvq_cache_stats(c[0], -1, &s0);
    kvq_cache_stats(c[1], -1, &s1);
    CHECK_OK(kvq_cache_set_precision(c[0], -1, -1, 1, "int4:g=32", NULL));
    kvq_cache_stats(c[0], -1, &s2);
    CHECK_EQ(s2.stored_bytes, s1.stored_bytes);
    /* the old size keeps at most its last region (<= 64 MiB; here the
     * 8 MiB one of 2 + 4 + 8); without the release s2 = s0 + s1 */
    CHECK_LE(s2.arena_bytes, s1.arena_bytes + 8 * MIB);
    CHECK(s2.arena_bytes < s0.arena_bytes + s1.arena_bytes);
    free(kv);
    kvq_cache_free(c[0]);
    kvq_cache_free(c[1]);
}

/* The pool cannot map a region (out of memory): the append that needs one
 * fails with KVQ_ERR_NOMEM and leaves the cache as it was; the same append
 * then succeeds and attention sees every token. */
static void test_nomem(void) {
    const size_t H = 8, D = 128;
    kvq_cache_config cfg = hp_cfg(1, H, H, D, 4096, "f32");
    kvq_cache *c;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    CHECK(c->hpool != NULL);
    tu_rng r;
    tu_seed(&r, 9);
    /* appends of one page each until one needs a new region, which the
     * pool cannot map: that append fails and changes nothing */
    const size_t m = 16, maxp = 64;
    float *kv = (float *)malloc(2 * maxp * m * H * D * sizeof(float));
    tu_fill_gauss(&r, kv, 2 * maxp * m * H * D, 1.0f);
    CHECK_OK(kvq_cache_append(c, 0, kv, kv + m * H * D, NULL, m)); /* maps the first region */
    kvq__hpool_fail_maps(c->hpool, 1);
    size_t n = m; /* tokens appended */
    kvq_status st = KVQ_OK;
    kvq_stats s0, s1;
    while (n / m < maxp) {
        const float *k1 = kv + 2 * n * H * D, *v1 = k1 + m * H * D;
        kvq_cache_stats(c, -1, &s0);
        st = kvq_cache_append(c, 0, k1, v1, NULL, m);
        if (st != KVQ_OK)
            break;
        n += m;
    }
    CHECK_STATUS(st, KVQ_ERR_NOMEM);
    CHECK(n >= 15 * m); /* a first region of 2 MiB: at least 15 pages of 128 KiB */
    kvq_cache_stats(c, -1, &s1);
    CHECK_EQ(s1.tokens, n);
    CHECK_EQ(s1.tokens_appended, s0.tokens_appended);
    CHECK_EQ(s1.stored_bytes, s0.stored_bytes);
    CHECK_EQ(s1.pages, s0.pages);
    CHECK_EQ(s1.arena_bytes, s0.arena_bytes);
    const float *k1 = kv + 2 * n * H * D, *v1 = k1 + m * H * D;
    CHECK_OK(kvq_cache_append(c, 0, k1, v1, NULL, m)); /* the mapping works again */
    kvq_cache_stats(c, -1, &s1);
    CHECK_EQ(s1.tokens, n + m);
    CHECK(s1.arena_bytes > s0.arena_bytes);
    /* the same output as a cache without the pool that got the same tokens */
    float q[8 * 128], out[2][8 * 128];
    for (size_t i = 0; i < H * D; i++)
        q[i] = kv[i] * 0.1f;
    int32_t pos = (int32_t)(n + m);
    n += m;
    CHECK_OK(kvq_cache_attend(c, 0, q, &pos, 1, out[0], H * D, NULL, 0));
    kvq_cache *c2;
    cfg.huge_pages = -1;
    CHECK_OK(kvq_cache_create(&c2, &cfg));
    for (size_t t = 0; t < n; t += m)
        CHECK_OK(kvq_cache_append(c2, 0, kv + 2 * t * H * D, kv + (2 * t + m) * H * D, NULL, m));
    CHECK_OK(kvq_cache_attend(c2, 0, q, &pos, 1, out[1], H * D, NULL, 0));
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    free(kv);
    kvq_cache_free(c);
    kvq_cache_free(c2);
}

static void test_config(void) {
    kvq_cache_config cfg = hp_cfg(1, 1, 1, 64, 64, NULL);
    cfg.huge_pages = 1;
    kvq_cache *c = NULL;
    CHECK_STATUS(kvq_cache_create(&c, &cfg), KVQ_ERR_INVALID_ARG);
    CHECK(c == NULL);
    /* a user allocator: no pool */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    cfg.allocator = &al;
    cfg.huge_pages = 0;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    float kv[2 * 64];
    for (int i = 0; i < 128; i++)
        kv[i] = (float)i / 64.0f;
    CHECK_OK(kvq_cache_append(c, 0, kv, kv + 64, NULL, 1));
    kvq_stats s;
    kvq_cache_stats(c, 0, &s);
    CHECK_EQ(s.arena_bytes, 0);
    kvq_cache_free(c);
    CHECK_EQ(fa.live_bytes, 0);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_pool();
    test_threads();
    test_cache("f32");
    test_cache("int4:g=32");
    test_switch();
    test_nomem();
    test_config();
    return tu_finish();
}
