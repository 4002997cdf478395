/*
 * fuzz_snapshot.c - libFuzzer target for snapshots read by kvq_cache_load
 * (src/cache/cache_snapshot.c): manifests and page records. A file store
 * under /dev/shm (or /tmp) holds, for each of a few cache configurations
 * (token and channel key layouts, key centring, pre-RoPE keys, staged
 * tokens, eviction holes, a warm tier), a snapshot saved twice: as "c<i>"
 * and "g<i>". The first input byte picks the configuration (bits 0-1) and
 * what the rest replaces (bit 7):
 *  - 0: the manifest of "c<i>" (its page records stay). The manifest is
 *    re-signed first (snapshot_forge.h: c<i>'s save id, the digests of the
 *    records it names; a CRC32C that was wrong stays wrong), then tried
 *    again with its CRC32C recomputed, so mutations reach every field.
 *  - 1: page record k of "c<i>" (k = the second byte, modulo the records),
 *    tried under c<i>'s own manifest (which must refuse it unless it is the
 *    saved record, byte for byte), then as a writer of a shared store can
 *    make it pass every integrity check: c<i>'s save id in the record, its
 *    CRC32C recomputed, the manifest re-signed for it; so mutations reach
 *    the slot checks.
 * An empty cache of that configuration loads it. Properties: no read
 * outside the bytes, no undefined behaviour, no allocation the input alone
 * can make huge; a failed load returns an error and leaves the cache empty
 * and usable (the good snapshot "g<i>" then loads); a successful load gives
 * a cache whose token counts, positions (each once) and K/V can be read and
 * which takes one more token and attends to it.
 * tests/test_fuzz_replay.c replays fuzz/corpus/snapshot/ through it (and
 * kvq_fuzz_snapshot_manifest writes the seeds' valid manifests).
 */
#include "common/common.h"
#include "fuzz_dir.h"
#include "snapshot_forge.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVQ_FUZZ_SNAP_CONFIGS 4
#define KVQ_FUZZ_SNAP_L 2
#define KVQ_FUZZ_SNAP_H 2
#define KVQ_FUZZ_SNAP_QH 4
#define KVQ_FUZZ_SNAP_D 8

#define KVQ_FUZZ_SNAP_HD (KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D)
#define KVQ_FUZZ_SNAP_MAXREC 64

static char kvq_fuzz_snap_dir[128];
static kvq_store *kvq_fuzz_snap_store;
static float kvq_fuzz_snap_center[KVQ_FUZZ_SNAP_L * KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D];

/* What was saved as "c<i>": its manifest, save id and page records. */
static struct {
    uint8_t *man;
    size_t man_n;
    uint64_t id;
    int n_rec;
    char key[KVQ_FUZZ_SNAP_MAXREC][32];
    uint8_t *rec[KVQ_FUZZ_SNAP_MAXREC];
    size_t rec_n[KVQ_FUZZ_SNAP_MAXREC];
} kvq_fuzz_snap_saved[KVQ_FUZZ_SNAP_CONFIGS];

static void kvq_fuzz_snap_config(int i, kvq_cache_config *cfg) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = KVQ_FUZZ_SNAP_L;
    cfg->n_kv_heads = KVQ_FUZZ_SNAP_H;
    cfg->n_q_heads = KVQ_FUZZ_SNAP_QH;
    cfg->head_dim = KVQ_FUZZ_SNAP_D;
    cfg->max_tokens = 256;
    cfg->k_codec = "int8";
    cfg->v_codec = "int4";
    switch (i) {
    case 0: /* token layout, a partial last page with staged tokens */
        cfg->recent_window = 3;
        break;
    case 1: /* channel key pages, centred pre-RoPE keys, 8-token pages */
        cfg->k_codec = "chan:int4";
        cfg->page_tokens = 8;
        cfg->k_prerope = 1;
        cfg->k_center = 1;
        cfg->k_center_values = kvq_fuzz_snap_center;
        break;
    case 2: /* TurboQuant, utility eviction: holes in the pages */
        cfg->k_codec = "tq3";
        cfg->v_codec = "tq2";
        cfg->policy = KVQ_POLICY_UTILITY;
        cfg->budget_tokens = 20;
        cfg->sinks = 2;
        cfg->protect_recent = 4;
        break;
    default: /* a warm tier re-encoded to int4 */
        cfg->hot_tokens = 16;
        cfg->warm_codec = "int4";
        break;
    }
}

/* Appends and attends n tokens to every layer of c, deterministically. */
static kvq_status kvq_fuzz_snap_fill(kvq_cache *c, size_t n, int32_t pos0) {
    enum { HD = KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D, QD = KVQ_FUZZ_SNAP_QH * KVQ_FUZZ_SNAP_D };
    float k[HD], v[HD], q[QD], out[QD];
    kvq_status st = KVQ_OK;
    for (size_t t = 0; t < n && st == KVQ_OK; t++) {
        int32_t pos = pos0 + (int32_t)t;
        for (size_t l = 0; l < KVQ_FUZZ_SNAP_L && st == KVQ_OK; l++) {
            for (size_t i = 0; i < HD; i++) {
                k[i] = sinf(0.37f * (float)(i + 3 * l) + 0.11f * (float)pos);
                v[i] = cosf(0.23f * (float)(i + 5 * l) - 0.07f * (float)pos);
            }
            for (size_t i = 0; i < QD; i++)
                q[i] = sinf(0.19f * (float)i + 0.05f * (float)pos);
            st = kvq_cache_append(c, l, k, v, &pos, 1);
            if (st == KVQ_OK)
                st = kvq_cache_attend(c, l, q, &pos, 1, out, QD, NULL, 0);
        }
    }
    return st;
}

static void kvq_fuzz_snap_cleanup(void) {
    for (int i = 0; i < KVQ_FUZZ_SNAP_CONFIGS; i++) {
        free(kvq_fuzz_snap_saved[i].man);
        for (int k = 0; k < kvq_fuzz_snap_saved[i].n_rec; k++)
            free(kvq_fuzz_snap_saved[i].rec[k]);
    }
    kvq_store_close(kvq_fuzz_snap_store);
    kvq_fuzz_snap_store = NULL;
    kvq_fuzz_rm_dir(kvq_fuzz_snap_dir);
}

/* A malloc'd copy of the value of key (NULL when absent). */
static uint8_t *kvq_fuzz_snap_get(const char *key, size_t *n) {
    void *d = NULL;
    if (kvq_store_get(kvq_fuzz_snap_store, key, &d, n) != KVQ_OK)
        return NULL;
    uint8_t *out = (uint8_t *)malloc(*n ? *n : 1);
    if (out)
        memcpy(out, d, *n);
    kvq_store_free_buf(kvq_fuzz_snap_store, d);
    return out;
}

static int kvq_fuzz_snap_keep_rec(void *ctx, const kvq_forge_page *pg) {
    int i = *(const int *)ctx;
    int k = kvq_fuzz_snap_saved[i].n_rec;
    if (k == KVQ_FUZZ_SNAP_MAXREC)
        return 1;
    char *key = kvq_fuzz_snap_saved[i].key[k];
    snprintf(key, sizeof kvq_fuzz_snap_saved[i].key[k], "c%d/l%u/p%u", i, (unsigned)pg->layer,
             (unsigned)pg->page);
    kvq_fuzz_snap_saved[i].rec[k] = kvq_fuzz_snap_get(key, &kvq_fuzz_snap_saved[i].rec_n[k]);
    kvq_fuzz_snap_saved[i].n_rec += kvq_fuzz_snap_saved[i].rec[k] != NULL;
    return 0;
}

/* Opens the store and saves every configuration's snapshot, once. */
static int kvq_fuzz_snap_setup(void) {
    if (kvq_fuzz_snap_store)
        return 0;
    for (size_t i = 0; i < sizeof kvq_fuzz_snap_center / sizeof kvq_fuzz_snap_center[0]; i++)
        kvq_fuzz_snap_center[i] = 0.05f * (float)((int)(i % 9) - 4);
    kvq_fuzz_dir_make("kvq-fuzz-snap", kvq_fuzz_snap_dir, sizeof kvq_fuzz_snap_dir);
    char url[160];
    snprintf(url, sizeof url, "file:%s", kvq_fuzz_snap_dir);
    if (kvq_store_open(&kvq_fuzz_snap_store, url, NULL, NULL, 0) != KVQ_OK)
        return -1;
    atexit(kvq_fuzz_snap_cleanup);
    for (int i = 0; i < KVQ_FUZZ_SNAP_CONFIGS; i++) {
        kvq_cache_config cfg;
        kvq_fuzz_snap_config(i, &cfg);
        kvq_cache *c = NULL;
        if (kvq_cache_create(&c, &cfg) != KVQ_OK)
            return -1;
        kvq_status st = kvq_fuzz_snap_fill(c, 37, 0);
        /* one more appended without attention: staged tokens in the snapshot */
        if (st == KVQ_OK) {
            float k[KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D], v[KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D];
            for (size_t j = 0; j < sizeof k / sizeof k[0]; j++)
                k[j] = v[j] = 0.01f * (float)j;
            for (size_t l = 0; l < KVQ_FUZZ_SNAP_L && st == KVQ_OK; l++)
                st = kvq_cache_append(c, l, k, v, NULL, 1);
        }
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        if (st == KVQ_OK)
            st = kvq_cache_save(c, kvq_fuzz_snap_store, name, INT32_MAX);
        name[0] = 'g';
        if (st == KVQ_OK)
            st = kvq_cache_save(c, kvq_fuzz_snap_store, name, INT32_MAX);
        kvq_cache_free(c);
        if (st != KVQ_OK)
            return -1;
        snprintf(name, sizeof name, "c%d/manifest", i);
        uint8_t *m = kvq_fuzz_snap_get(name, &kvq_fuzz_snap_saved[i].man_n);
        if (!m || kvq_fuzz_snap_saved[i].man_n < KVQ_FORGE_HDR + 4)
            return -1;
        kvq_fuzz_snap_saved[i].man = m;
        kvq_fuzz_snap_saved[i].id = kvq__ld64(m + 16);
        if (kvq_forge_walk(m, kvq_fuzz_snap_saved[i].man_n, KVQ_FUZZ_SNAP_HD,
                           kvq_fuzz_snap_keep_rec, &i) <= 0)
            return -1;
    }
    return 0;
}

/* The valid manifest of configuration i as saved (malloc'd), for the seed
 * corpus. */
__attribute__((unused)) static uint8_t *kvq_fuzz_snapshot_manifest(int i, size_t *n) {
    if (kvq_fuzz_snap_setup() != 0)
        return NULL;
    char key[32];
    snprintf(key, sizeof key, "c%d/manifest", i);
    return kvq_fuzz_snap_get(key, n);
}

/* Record k of configuration i as saved (for the seed corpus), or NULL. */
__attribute__((unused)) static const uint8_t *kvq_fuzz_snapshot_record(int i, int k, size_t *n) {
    if (kvq_fuzz_snap_setup() != 0 || k >= kvq_fuzz_snap_saved[i].n_rec)
        return NULL;
    *n = kvq_fuzz_snap_saved[i].rec_n[k];
    return kvq_fuzz_snap_saved[i].rec[k];
}

/* Reads everything back from a loaded cache, appends a token and attends. */
static int kvq_fuzz_snap_use(kvq_cache *c) {
    size_t total = 0;
    for (size_t l = 0; l < KVQ_FUZZ_SNAP_L; l++) {
        size_t n = 0;
        if (kvq_cache_tokens(c, l, &n) != KVQ_OK || n > 256)
            return 1;
        total += n;
        int32_t pos[256];
        if (kvq_cache_positions(c, l, pos, 256) != KVQ_OK)
            return 1;
        for (size_t i = 1; i < n; i++)
            if (pos[i] <= pos[i - 1])
                return 1;
        if (n) {
            size_t cap = n * KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D;
            float *k = (float *)malloc(cap * sizeof(float)), *v = (float *)malloc(cap * sizeof(float));
            kvq_status st = k && v ? kvq_cache_get_kv(c, l, -1, 0, n, k, v, cap) : KVQ_OK;
            free(k);
            free(v);
            if (st != KVQ_OK && st != KVQ_ERR_NOMEM)
                return 1;
        }
    }
    kvq_stats s;
    if (kvq_cache_stats(c, -1, &s) != KVQ_OK || s.tokens != total)
        return 1;
    /* one more token at the next position, and attention over everything */
    kvq_status st;
    for (size_t l = 0; l < KVQ_FUZZ_SNAP_L; l++) {
        enum { HD = KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D, QD = KVQ_FUZZ_SNAP_QH * KVQ_FUZZ_SNAP_D };
        float k[HD], v[HD], q[QD], out[QD];
        for (size_t i = 0; i < HD; i++)
            k[i] = v[i] = 0.125f * (float)((int)(i % 5) - 2);
        for (size_t i = 0; i < QD; i++)
            q[i] = 0.25f;
        st = kvq_cache_append(c, l, k, v, NULL, 1);
        if (st != KVQ_OK && st != KVQ_ERR_NOMEM && st != KVQ_ERR_FULL && st != KVQ_ERR_RANGE)
            return 1;
        size_t n = 0;
        int32_t pos[257];
        if (kvq_cache_tokens(c, l, &n) != KVQ_OK || n > 257 ||
            kvq_cache_positions(c, l, pos, 257) != KVQ_OK)
            return 1;
        for (size_t i = 1; i < n; i++) /* still strictly ascending: no position twice */
            if (pos[i] <= pos[i - 1])
                return 1;
        if (!n)
            continue;
        st = kvq_cache_attend(c, l, q, &pos[n - 1], 1, out, QD, NULL, 0);
        if (st != KVQ_OK && st != KVQ_ERR_NOMEM && st != KVQ_ERR_RANGE)
            return 1;
    }
    return 0;
}

/* Loads "c<ci>" with manifest m (n bytes) into an empty cache and checks
 * the properties; must_fail: any successful load breaks them. Returns 1
 * when one is broken (st gets the load's status). */
static int kvq_fuzz_snap_once(int ci, const uint8_t *m, size_t n, int must_fail, kvq_status *lst) {
    char key[32];
    *lst = KVQ_ERR_IO;
    snprintf(key, sizeof key, "c%d/manifest", ci);
    if (kvq_store_put(kvq_fuzz_snap_store, key, m, n) != KVQ_OK)
        return 0; /* the store is out of space or memory: not the loader's fault */
    kvq_cache_config cfg;
    kvq_fuzz_snap_config(ci, &cfg);
    kvq_cache *c = NULL;
    if (kvq_cache_create(&c, &cfg) != KVQ_OK)
        return 0;
    snprintf(key, sizeof key, "c%d", ci);
    kvq_status st = kvq_cache_load(c, kvq_fuzz_snap_store, key);
    *lst = st;
    int bad = 0;
    if (st == KVQ_OK) {
        bad = must_fail || kvq_fuzz_snap_use(c);
    } else if (must_fail && st != KVQ_ERR_CORRUPT && st != KVQ_ERR_NOMEM) {
        bad = 1; /* a record the manifest does not name: KVQ_ERR_CORRUPT */
    } else if (st > 0 || (st != KVQ_ERR_CORRUPT && st != KVQ_ERR_VERSION && st != KVQ_ERR_MISMATCH &&
                          st != KVQ_ERR_NOMEM && st != KVQ_ERR_RANGE && st != KVQ_ERR_INVALID_ARG &&
                          st != KVQ_ERR_FULL)) {
        bad = 1;
    } else {
        /* left empty, and the good snapshot loads into it */
        kvq_stats s;
        bad = kvq_cache_stats(c, -1, &s) != KVQ_OK || s.tokens != 0 || s.tokens_appended != 0;
        key[0] = 'g';
        if (!bad) {
            st = kvq_cache_load(c, kvq_fuzz_snap_store, key);
            bad = st != KVQ_OK && st != KVQ_ERR_NOMEM;
        }
        if (!bad && st == KVQ_OK)
            bad = kvq_fuzz_snap_use(c);
    }
    kvq_cache_free(c);
    return bad;
}

/* Re-signs manifest m for c<ci> (snapshot_forge.h); a CRC32C that was
 * wrong before stays wrong, unless fix_crc. */
static void kvq_fuzz_snap_resign(int ci, uint8_t *m, size_t n, int fix_crc) {
    if (n < 4)
        return;
    int crc_ok = kvq__ld32(m + n - 4) == kvq__crc32c(0, m, n - 4);
    char name[16];
    snprintf(name, sizeof name, "c%d", ci);
    kvq_forge_resign(kvq_fuzz_snap_store, name, m, n, KVQ_FUZZ_SNAP_HD, 1,
                     kvq_fuzz_snap_saved[ci].id);
    if (!crc_ok && !fix_crc)
        m[n - 1] ^= 0x5a;
}

/* The input as the target uses it: *mode 0 (manifest) or 1 (record k),
 * body and its length. */
static void kvq_fuzz_snap_split(const uint8_t *data, size_t size, int *ci, int *mode, int *k,
                                const uint8_t **body, size_t *n) {
    *ci = data[0] % KVQ_FUZZ_SNAP_CONFIGS;
    *mode = (data[0] & 0x80) != 0;
    *k = 0;
    *body = data + 1;
    *n = size - 1;
    if (*mode) {
        int nr = kvq_fuzz_snap_saved[*ci].n_rec;
        *k = size > 1 && nr ? data[1] % nr : 0;
        *body = data + (size > 1 ? 2 : 1);
        *n = size > 1 ? size - 2 : 0;
    }
}

/* Record bytes r (n >= 4) as a forger passes them off as c<ci>'s: its save
 * id as the record's prefix_hash, the CRC32C recomputed. */
static void kvq_fuzz_snap_forge_rec(int ci, uint8_t *r, size_t n) {
    if (n >= 64)
        kvq__st64(r + 48, kvq_fuzz_snap_saved[ci].id);
    kvq__st32(r + n - 4, kvq__crc32c(0, r, n - 4));
}

/* Puts the saved record k of c<ci> back. */
static void kvq_fuzz_snap_restore_rec(int ci, int k) {
    kvq_store_put(kvq_fuzz_snap_store, kvq_fuzz_snap_saved[ci].key[k],
                  kvq_fuzz_snap_saved[ci].rec[k], kvq_fuzz_snap_saved[ci].rec_n[k]);
}

static int kvq_fuzz_snapshot(const uint8_t *data, size_t size) {
    if (kvq_fuzz_snap_setup() != 0 || size == 0)
        return 0;
    int ci, mode, k;
    const uint8_t *body;
    size_t n;
    kvq_fuzz_snap_split(data, size, &ci, &mode, &k, &body, &n);
    kvq_status st;
    int bad = 0;
    if (mode == 0) {
        uint8_t *m = (uint8_t *)malloc(n ? n : 1);
        if (!m)
            return 0;
        if (n)
            memcpy(m, body, n);
        kvq_fuzz_snap_resign(ci, m, n, 0);
        bad = kvq_fuzz_snap_once(ci, m, n, 0, &st);
        if (!bad && n >= 4) {
            kvq_fuzz_snap_resign(ci, m, n, 1);
            bad = kvq_fuzz_snap_once(ci, m, n, 0, &st);
        }
        free(m);
        return bad;
    }
    if (kvq_fuzz_snap_saved[ci].n_rec == 0)
        return 0;
    size_t mn = kvq_fuzz_snap_saved[ci].man_n;
    uint8_t *m = (uint8_t *)malloc(mn), *r = (uint8_t *)malloc(n ? n : 1);
    if (!m || !r) {
        free(m);
        free(r);
        return 0;
    }
    memcpy(m, kvq_fuzz_snap_saved[ci].man, mn);
    if (n)
        memcpy(r, body, n);
    int same = n == kvq_fuzz_snap_saved[ci].rec_n[k] &&
               memcmp(r, kvq_fuzz_snap_saved[ci].rec[k], n) == 0;
    if (kvq_store_put(kvq_fuzz_snap_store, kvq_fuzz_snap_saved[ci].key[k], r, n) == KVQ_OK) {
        /* c<ci>'s own manifest holds the saved record's digest */
        bad = kvq_fuzz_snap_once(ci, m, mn, !same, &st);
        if (!bad && n >= 4) {
            kvq_fuzz_snap_forge_rec(ci, r, n);
            if (kvq_store_put(kvq_fuzz_snap_store, kvq_fuzz_snap_saved[ci].key[k], r, n) == KVQ_OK) {
                kvq_fuzz_snap_resign(ci, m, mn, 1);
                bad = kvq_fuzz_snap_once(ci, m, mn, 0, &st);
            }
        }
    }
    kvq_fuzz_snap_restore_rec(ci, k);
    free(m);
    free(r);
    return bad;
}

/* 1 when kvq_cache_load accepts the input as the target's first forged try
 * uses it (manifest: re-signed, its CRC32C as it is; record: forged, under
 * the manifest re-signed for it). */
static int kvq_fuzz_snapshot_accepts(const uint8_t *data, size_t size) {
    if (kvq_fuzz_snap_setup() != 0 || size == 0)
        return 0;
    int ci, mode, k;
    const uint8_t *body;
    size_t n;
    kvq_fuzz_snap_split(data, size, &ci, &mode, &k, &body, &n);
    if (mode && kvq_fuzz_snap_saved[ci].n_rec == 0)
        return 0;
    size_t mn = mode ? kvq_fuzz_snap_saved[ci].man_n : n;
    uint8_t *m = (uint8_t *)malloc(mn ? mn : 1);
    if (!m)
        return 0;
    memcpy(m, mode ? kvq_fuzz_snap_saved[ci].man : body, mn);
    if (mode) {
        uint8_t *r = (uint8_t *)malloc(n ? n : 1);
        kvq_status ps = r && n >= 4 ? KVQ_OK : KVQ_ERR_NOMEM;
        if (ps == KVQ_OK) {
            memcpy(r, body, n);
            kvq_fuzz_snap_forge_rec(ci, r, n);
            ps = kvq_store_put(kvq_fuzz_snap_store, kvq_fuzz_snap_saved[ci].key[k], r, n);
        }
        free(r);
        if (ps != KVQ_OK) {
            free(m);
            return 0;
        }
    }
    kvq_fuzz_snap_resign(ci, m, mn, mode);
    char key[32];
    snprintf(key, sizeof key, "c%d/manifest", ci);
    kvq_status st = kvq_store_put(kvq_fuzz_snap_store, key, m, mn);
    free(m);
    kvq_cache_config cfg;
    kvq_fuzz_snap_config(ci, &cfg);
    kvq_cache *c = NULL;
    if (st == KVQ_OK && kvq_cache_create(&c, &cfg) == KVQ_OK) {
        snprintf(key, sizeof key, "c%d", ci);
        st = kvq_cache_load(c, kvq_fuzz_snap_store, key);
        kvq_cache_free(c);
    } else {
        st = KVQ_ERR_IO;
    }
    if (mode)
        kvq_fuzz_snap_restore_rec(ci, k);
    return st == KVQ_OK;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_snapshot(data, size))
        abort();
    return 0;
}
#endif
