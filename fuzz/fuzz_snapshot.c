/*
 * fuzz_snapshot.c - libFuzzer target for the snapshot manifest read by
 * kvq_cache_load (src/cache/cache_snapshot.c). A file store under /dev/shm
 * (or /tmp) holds, for each of a few cache configurations (token and channel
 * key layouts, key centring, pre-RoPE keys, staged tokens, eviction holes, a
 * warm tier), a snapshot saved twice: as "c<i>" and "g<i>". The first input
 * byte picks the configuration; the rest replaces the manifest of "c<i>"
 * (the page records stay), and an empty cache of that configuration loads
 * it. Each input is also tried with its trailing CRC32C recomputed, so
 * mutations reach the fields behind it. Properties: no read outside the
 * manifest, no undefined behaviour, no allocation the manifest alone can
 * make huge; a failed load returns an error and leaves the cache empty and
 * usable (the good snapshot "g<i>" then loads); a successful load gives a
 * cache whose token counts, positions and K/V can be read and which takes
 * one more token and attends to it.
 * tests/test_fuzz_replay.c replays fuzz/corpus/snapshot/ through it (and
 * kvq_fuzz_snapshot_manifest writes the seeds' valid manifests).
 */
#include "common/common.h"

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

static char kvq_fuzz_snap_dir[128];
static kvq_store *kvq_fuzz_snap_store;
static float kvq_fuzz_snap_center[KVQ_FUZZ_SNAP_L * KVQ_FUZZ_SNAP_H * KVQ_FUZZ_SNAP_D];

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
    kvq_store_close(kvq_fuzz_snap_store);
    kvq_fuzz_snap_store = NULL;
    DIR *d = opendir(kvq_fuzz_snap_dir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", kvq_fuzz_snap_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(kvq_fuzz_snap_dir);
}

/* Removes base/kvq-fuzz-snap-<pid> folders of processes that are gone (a
 * crashing input skips the atexit cleanup; fork mode crashes many). */
static void kvq_fuzz_snap_sweep(const char *base) {
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        char tail;
        if (sscanf(e->d_name, "kvq-fuzz-snap-%ld%c", &pid, &tail) != 1 || pid <= 0 ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char sub[400], p[700];
        snprintf(sub, sizeof sub, "%s/%s", base, e->d_name);
        DIR *s = opendir(sub);
        struct dirent *f;
        while (s && (f = readdir(s)) != NULL)
            if (f->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", sub, f->d_name);
                unlink(p);
            }
        if (s)
            closedir(s);
        rmdir(sub);
    }
    closedir(d);
}

/* Opens the store and saves every configuration's snapshot, once. */
static int kvq_fuzz_snap_setup(void) {
    if (kvq_fuzz_snap_store)
        return 0;
    for (size_t i = 0; i < sizeof kvq_fuzz_snap_center / sizeof kvq_fuzz_snap_center[0]; i++)
        kvq_fuzz_snap_center[i] = 0.05f * (float)((int)(i % 9) - 4);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    kvq_fuzz_snap_sweep(base);
    snprintf(kvq_fuzz_snap_dir, sizeof kvq_fuzz_snap_dir, "%s/kvq-fuzz-snap-%ld", base,
             (long)getpid());
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
    }
    return 0;
}

/* The valid manifest of configuration i (malloc'd), for the seed corpus. */
__attribute__((unused)) static uint8_t *kvq_fuzz_snapshot_manifest(int i, size_t *n) {
    if (kvq_fuzz_snap_setup() != 0)
        return NULL;
    char key[32];
    snprintf(key, sizeof key, "g%d/manifest", i);
    void *d = NULL;
    if (kvq_store_get(kvq_fuzz_snap_store, key, &d, n) != KVQ_OK)
        return NULL;
    uint8_t *out = (uint8_t *)malloc(*n ? *n : 1);
    if (out)
        memcpy(out, d, *n);
    kvq_store_free_buf(kvq_fuzz_snap_store, d);
    return out;
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

static int kvq_fuzz_snap_once(int ci, const uint8_t *m, size_t n) {
    char key[32];
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
    int bad = 0;
    if (st == KVQ_OK) {
        bad = kvq_fuzz_snap_use(c);
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

static int kvq_fuzz_snapshot(const uint8_t *data, size_t size) {
    if (kvq_fuzz_snap_setup() != 0 || size == 0)
        return 0;
    int ci = data[0] % KVQ_FUZZ_SNAP_CONFIGS;
    size_t n = size - 1;
    uint8_t *m = (uint8_t *)malloc(n ? n : 1);
    if (!m)
        return 0;
    if (n)
        memcpy(m, data + 1, n);
    int bad = kvq_fuzz_snap_once(ci, m, n);
    if (!bad && n >= 4) {
        kvq__st32(m + n - 4, kvq__crc32c(0, m, n - 4));
        bad = kvq_fuzz_snap_once(ci, m, n);
    }
    free(m);
    return bad;
}

/* 1 when kvq_cache_load accepts the manifest as it is. */
static int kvq_fuzz_snapshot_accepts(const uint8_t *data, size_t size) {
    if (kvq_fuzz_snap_setup() != 0 || size == 0)
        return 0;
    int ci = data[0] % KVQ_FUZZ_SNAP_CONFIGS;
    char key[32];
    snprintf(key, sizeof key, "c%d/manifest", ci);
    if (kvq_store_put(kvq_fuzz_snap_store, key, data + 1, size - 1) != KVQ_OK)
        return 0;
    kvq_cache_config cfg;
    kvq_fuzz_snap_config(ci, &cfg);
    kvq_cache *c = NULL;
    if (kvq_cache_create(&c, &cfg) != KVQ_OK)
        return 0;
    snprintf(key, sizeof key, "c%d", ci);
    kvq_status st = kvq_cache_load(c, kvq_fuzz_snap_store, key);
    kvq_cache_free(c);
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
