/*
 * fuzz_prefix.c - libFuzzer target for prefix entries read by
 * kvq_cache_prefix_get (src/cache/cache_snapshot.c). A file store under
 * /dev/shm (or /tmp) holds the entries a cache with staged tokens published
 * for one prompt (KVQ_FUZZ_PFX_PAGES full pages, two layers). An input is
 * three bytes and an entry: page j and layer l (each modulo what was
 * published) name the key the entry replaces, and the third byte's bit 0
 * makes the target pass it off as a writer of a shared store can: the
 * genuine entry's page index, parent digest, token ids and prefix_hash
 * written in, the record's and the entry's CRC32C recomputed. Then an empty
 * cache loads the prompt. Properties: no read outside the entry, no
 * undefined behaviour; a failure returns KVQ_ERR_CORRUPT, KVQ_ERR_VERSION or
 * KVQ_ERR_NOMEM with n_loaded 0 and the cache empty and usable (the genuine
 * entries then load whole); a success loads whole pages, at most those
 * published, every loaded token at exactly its position 0.., the pages
 * before j with the publisher's K/V bit for bit, and the cache takes one
 * more token and attends to it. tests/test_fuzz_replay.c replays
 * fuzz/corpus/prefix/ through it.
 */
#include "common/common.h"
#include "fuzz_dir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVQ_FUZZ_PFX_L 2
#define KVQ_FUZZ_PFX_H 2
#define KVQ_FUZZ_PFX_QH 4
#define KVQ_FUZZ_PFX_D 8
#define KVQ_FUZZ_PFX_P 8
#define KVQ_FUZZ_PFX_PAGES 4
#define KVQ_FUZZ_PFX_N (KVQ_FUZZ_PFX_P * KVQ_FUZZ_PFX_PAGES + 3) /* ids published */
#define KVQ_FUZZ_PFX_HD (KVQ_FUZZ_PFX_H * KVQ_FUZZ_PFX_D)
#define KVQ_FUZZ_PFX_REC (48 + 4 * KVQ_FUZZ_PFX_P) /* the record's offset in an entry */

static char kvq_fuzz_pfx_dir[128];
static kvq_store *kvq_fuzz_pfx_store;
static kvq_cache *kvq_fuzz_pfx_ref; /* the publisher */
static int32_t kvq_fuzz_pfx_ids[KVQ_FUZZ_PFX_N + 1];
static struct {
    char key[200];
    uint8_t *val;
    size_t n;
} kvq_fuzz_pfx_ent[KVQ_FUZZ_PFX_PAGES][KVQ_FUZZ_PFX_L];

static void kvq_fuzz_pfx_config(kvq_cache_config *cfg) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = KVQ_FUZZ_PFX_L;
    cfg->n_kv_heads = KVQ_FUZZ_PFX_H;
    cfg->n_q_heads = KVQ_FUZZ_PFX_QH;
    cfg->head_dim = KVQ_FUZZ_PFX_D;
    cfg->page_tokens = KVQ_FUZZ_PFX_P;
    cfg->max_tokens = 128;
    cfg->k_codec = "int8";
    cfg->v_codec = "tq3";
    cfg->recent_window = 3;
}

static void kvq_fuzz_pfx_cleanup(void) {
    for (int j = 0; j < KVQ_FUZZ_PFX_PAGES; j++)
        for (int l = 0; l < KVQ_FUZZ_PFX_L; l++)
            free(kvq_fuzz_pfx_ent[j][l].val);
    kvq_cache_free(kvq_fuzz_pfx_ref);
    kvq_store_close(kvq_fuzz_pfx_store);
    kvq_fuzz_pfx_store = NULL;
    kvq_fuzz_rm_dir(kvq_fuzz_pfx_dir);
}

static int kvq_fuzz_pfx_find(void *ctx, const char *key, size_t size) {
    (void)ctx;
    (void)size;
    void *d = NULL;
    size_t n = 0;
    if (kvq_store_get(kvq_fuzz_pfx_store, key, &d, &n) != KVQ_OK)
        return 0;
    const uint8_t *e = (const uint8_t *)d;
    if (n > KVQ_FUZZ_PFX_REC + 64 && memcmp(e, "KVQP", 4) == 0) {
        uint32_t j = kvq__ld32(e + 8), l = kvq__ld32(e + KVQ_FUZZ_PFX_REC + 16);
        if (j < KVQ_FUZZ_PFX_PAGES && l < KVQ_FUZZ_PFX_L && !kvq_fuzz_pfx_ent[j][l].val) {
            uint8_t *v = (uint8_t *)malloc(n);
            if (v) {
                memcpy(v, e, n);
                snprintf(kvq_fuzz_pfx_ent[j][l].key, sizeof kvq_fuzz_pfx_ent[j][l].key, "%s", key);
                kvq_fuzz_pfx_ent[j][l].val = v;
                kvq_fuzz_pfx_ent[j][l].n = n;
            }
        }
    }
    kvq_store_free_buf(kvq_fuzz_pfx_store, d);
    return 0;
}

/* Publishes the prompt's pages once. */
static int kvq_fuzz_pfx_setup(void) {
    if (kvq_fuzz_pfx_store)
        return 0;
    kvq_fuzz_dir_make("kvq-fuzz-pfx", kvq_fuzz_pfx_dir, sizeof kvq_fuzz_pfx_dir);
    char url[160];
    snprintf(url, sizeof url, "file:%s", kvq_fuzz_pfx_dir);
    if (kvq_store_open(&kvq_fuzz_pfx_store, url, NULL, NULL, 0) != KVQ_OK)
        return -1;
    atexit(kvq_fuzz_pfx_cleanup);
    kvq_cache_config cfg;
    kvq_fuzz_pfx_config(&cfg);
    if (kvq_cache_create(&kvq_fuzz_pfx_ref, &cfg) != KVQ_OK)
        return -1;
    float k[KVQ_FUZZ_PFX_HD], v[KVQ_FUZZ_PFX_HD];
    for (int32_t pos = 0; pos <= KVQ_FUZZ_PFX_N; pos++) {
        kvq_fuzz_pfx_ids[pos] = (pos * 37 + 11) % 500;
        if (pos == KVQ_FUZZ_PFX_N)
            break;
        for (size_t l = 0; l < KVQ_FUZZ_PFX_L; l++) {
            for (size_t i = 0; i < KVQ_FUZZ_PFX_HD; i++) {
                k[i] = sinf(0.37f * (float)(i + 3 * l) + 0.11f * (float)pos);
                v[i] = cosf(0.23f * (float)(i + 5 * l) - 0.07f * (float)pos);
            }
            if (kvq_cache_append(kvq_fuzz_pfx_ref, l, k, v, &pos, 1) != KVQ_OK)
                return -1;
        }
    }
    if (kvq_cache_prefix_put(kvq_fuzz_pfx_ref, kvq_fuzz_pfx_store, kvq_fuzz_pfx_ids,
                             KVQ_FUZZ_PFX_N) != KVQ_OK ||
        kvq_store_list(kvq_fuzz_pfx_store, "kvqp/", kvq_fuzz_pfx_find, NULL) != KVQ_OK)
        return -1;
    for (int j = 0; j < KVQ_FUZZ_PFX_PAGES; j++)
        for (int l = 0; l < KVQ_FUZZ_PFX_L; l++)
            if (!kvq_fuzz_pfx_ent[j][l].val)
                return -1;
    return 0;
}

/* The genuine entry of page j, layer l (for the seed corpus), or NULL. */
__attribute__((unused)) static const uint8_t *kvq_fuzz_prefix_entry(int j, int l, size_t *n) {
    if (kvq_fuzz_pfx_setup() != 0)
        return NULL;
    *n = kvq_fuzz_pfx_ent[j][l].n;
    return kvq_fuzz_pfx_ent[j][l].val;
}

/* Entry e (n bytes) as a forger passes it off as page j's of layer l. */
static void kvq_fuzz_pfx_forge(uint8_t *e, size_t n, int j, int l) {
    const uint8_t *g = kvq_fuzz_pfx_ent[j][l].val;
    size_t head = KVQ_FUZZ_PFX_REC + 56; /* the entry's header, ids, and the record's up to prefix_hash */
    if (n < head + 4)
        return;
    memcpy(e + 8, g + 8, 4);                                   /* page index */
    memcpy(e + 16, g + 16, 32 + 4 * KVQ_FUZZ_PFX_P);           /* parent digest, ids */
    memcpy(e + KVQ_FUZZ_PFX_REC + 48, g + KVQ_FUZZ_PFX_REC + 48, 8); /* prefix_hash */
    kvq__st32(e + n - 8, kvq__crc32c(0, e + KVQ_FUZZ_PFX_REC, n - 8 - KVQ_FUZZ_PFX_REC));
    kvq__st32(e + n - 4, kvq__crc32c(0, e, n - 4));
}

/* What a loaded cache must show; 1 when a property is broken. */
static int kvq_fuzz_pfx_use(kvq_cache *c, size_t got, int j) {
    static float ka[KVQ_FUZZ_PFX_N * KVQ_FUZZ_PFX_HD], va[KVQ_FUZZ_PFX_N * KVQ_FUZZ_PFX_HD];
    static float kb[KVQ_FUZZ_PFX_N * KVQ_FUZZ_PFX_HD], vb[KVQ_FUZZ_PFX_N * KVQ_FUZZ_PFX_HD];
    if (got % KVQ_FUZZ_PFX_P != 0 || got > KVQ_FUZZ_PFX_PAGES * KVQ_FUZZ_PFX_P)
        return 1;
    size_t exact = KVQ__MIN(got, (size_t)j * KVQ_FUZZ_PFX_P); /* pages before j */
    for (size_t l = 0; l < KVQ_FUZZ_PFX_L; l++) {
        size_t n = 0;
        int32_t pos[KVQ_FUZZ_PFX_N + 2];
        if (kvq_cache_tokens(c, l, &n) != KVQ_OK || n != got ||
            kvq_cache_positions(c, l, pos, KVQ_FUZZ_PFX_N + 2) != KVQ_OK)
            return 1;
        for (size_t i = 0; i < n; i++)
            if (pos[i] != (int32_t)i)
                return 1;
        if (n && kvq_cache_get_kv(c, l, -1, 0, n, ka, va, n * KVQ_FUZZ_PFX_HD) != KVQ_OK)
            return 1;
        if (exact) {
            if (kvq_cache_get_kv(kvq_fuzz_pfx_ref, l, -1, 0, exact, kb, vb,
                                 exact * KVQ_FUZZ_PFX_HD) != KVQ_OK ||
                memcmp(ka, kb, exact * KVQ_FUZZ_PFX_HD * sizeof(float)) != 0 ||
                memcmp(va, vb, exact * KVQ_FUZZ_PFX_HD * sizeof(float)) != 0)
                return 1;
        }
    }
    for (size_t l = 0; l < KVQ_FUZZ_PFX_L; l++) {
        float k[KVQ_FUZZ_PFX_HD], q[KVQ_FUZZ_PFX_QH * KVQ_FUZZ_PFX_D], out[KVQ_FUZZ_PFX_QH * KVQ_FUZZ_PFX_D];
        for (size_t i = 0; i < KVQ_FUZZ_PFX_HD; i++)
            k[i] = 0.125f * (float)((int)(i % 5) - 2);
        for (size_t i = 0; i < KVQ_FUZZ_PFX_QH * KVQ_FUZZ_PFX_D; i++)
            q[i] = 0.25f;
        int32_t p = (int32_t)got;
        kvq_status st = kvq_cache_append(c, l, k, k, &p, 1);
        if (st == KVQ_OK)
            st = kvq_cache_attend(c, l, q, &p, 1, out, KVQ_FUZZ_PFX_QH * KVQ_FUZZ_PFX_D, NULL, 0);
        if (st != KVQ_OK && st != KVQ_ERR_NOMEM)
            return 1;
    }
    return 0;
}

/* Loads the prompt into an empty cache; *st and *got get the outcome.
 * Returns 1 when a property is broken. */
static int kvq_fuzz_pfx_load(int j, kvq_status *st, size_t *got) {
    kvq_cache_config cfg;
    kvq_fuzz_pfx_config(&cfg);
    kvq_cache *c = NULL;
    *st = KVQ_ERR_NOMEM;
    *got = 0;
    if (kvq_cache_create(&c, &cfg) != KVQ_OK)
        return 0;
    size_t n = 12345;
    *st = kvq_cache_prefix_get(c, kvq_fuzz_pfx_store, kvq_fuzz_pfx_ids, KVQ_FUZZ_PFX_N + 1, &n);
    *got = n;
    int bad;
    if (*st == KVQ_OK) {
        bad = kvq_fuzz_pfx_use(c, n, j);
    } else {
        kvq_stats s;
        bad = (*st != KVQ_ERR_CORRUPT && *st != KVQ_ERR_VERSION && *st != KVQ_ERR_NOMEM) || n != 0 ||
              kvq_cache_stats(c, -1, &s) != KVQ_OK || s.tokens != 0 || s.tokens_appended != 0 ||
              s.pages != 0;
    }
    kvq_cache_free(c);
    return bad;
}

/* Puts the genuine entry of page j, layer l back. */
static void kvq_fuzz_pfx_restore(int j, int l) {
    kvq_store_put(kvq_fuzz_pfx_store, kvq_fuzz_pfx_ent[j][l].key, kvq_fuzz_pfx_ent[j][l].val,
                  kvq_fuzz_pfx_ent[j][l].n);
}

/* Stores the input's entry (forged when its flag says so); returns the
 * page j and layer l, -1 when the input is too short or the put failed. */
static int kvq_fuzz_pfx_put(const uint8_t *data, size_t size, int *l) {
    if (size < 3)
        return -1;
    int j = data[0] % KVQ_FUZZ_PFX_PAGES;
    *l = data[1] % KVQ_FUZZ_PFX_L;
    size_t n = size - 3;
    uint8_t *e = (uint8_t *)malloc(n ? n : 1);
    if (!e)
        return -1;
    if (n)
        memcpy(e, data + 3, n);
    if (data[2] & 1)
        kvq_fuzz_pfx_forge(e, n, j, *l);
    kvq_status st = kvq_store_put(kvq_fuzz_pfx_store, kvq_fuzz_pfx_ent[j][*l].key, e, n);
    free(e);
    return st == KVQ_OK ? j : -1;
}

static int kvq_fuzz_prefix(const uint8_t *data, size_t size) {
    if (kvq_fuzz_pfx_setup() != 0)
        return 0;
    int l, j = kvq_fuzz_pfx_put(data, size, &l);
    if (j < 0)
        return 0;
    kvq_status st;
    size_t got;
    int bad = kvq_fuzz_pfx_load(j, &st, &got);
    kvq_fuzz_pfx_restore(j, l);
    if (!bad && st != KVQ_OK) { /* the cache was left usable: the genuine entries load whole */
        bad = kvq_fuzz_pfx_load(KVQ_FUZZ_PFX_PAGES, &st, &got);
        bad |= st == KVQ_OK && got != KVQ_FUZZ_PFX_PAGES * KVQ_FUZZ_PFX_P;
    }
    return bad;
}

/* 1 when the entry as the input gives it loads the prompt whole. */
static int kvq_fuzz_prefix_accepts(const uint8_t *data, size_t size) {
    if (kvq_fuzz_pfx_setup() != 0)
        return 0;
    int l, j = kvq_fuzz_pfx_put(data, size, &l);
    if (j < 0)
        return 0;
    kvq_status st;
    size_t got;
    kvq_fuzz_pfx_load(j, &st, &got);
    kvq_fuzz_pfx_restore(j, l);
    return st == KVQ_OK && got == KVQ_FUZZ_PFX_PAGES * KVQ_FUZZ_PFX_P;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_prefix(data, size))
        abort();
    return 0;
}
#endif
