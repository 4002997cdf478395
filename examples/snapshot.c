/*
 * snapshot.c - save a cache to a file store and restore it into a fresh
 * cache (as another process would after a restart), then check that the
 * restored cache is the same: the same tokens, the same decoded K/V bit for
 * bit, and the same attention output for the next decode step.
 *
 *   cc -std=c11 -O2 snapshot.c $(pkg-config --cflags --libs kvq) -lm
 *
 * A snapshot stores the encoded pages as they are, so nothing is re-encoded
 * and "the same" means byte-equal (memcmp), not close. A cache configured
 * differently (another value codec here) is refused with KVQ_ERR_MISMATCH
 * and a message naming the setting, and stays empty. Exits 1 when any of
 * this does not hold.
 */
#define _POSIX_C_SOURCE 200809L
#include <kvq.h>

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { LAYERS = 2, KV_HEADS = 2, Q_HEADS = 8, DIM = 64 };
enum { PREFILL = 200, DECODE = 20, TOTAL = PREFILL + DECODE + 1, MAX_TOKENS = 512 };

static uint64_t rng_state = 0xda942042e4dd58b5u;

static double uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545f4914f6cdd1du) >> 11) * (1.0 / 9007199254740992.0) + 1e-17;
}

static float gauss(void) {
    return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

static int failures = 0;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static void die(const char *what, kvq_status st, const char *detail) {
    fprintf(stderr, "%s: %s (%s)\n", what, kvq_strerror(st), detail);
    exit(1);
}

static kvq_cache *make_cache(const char *v_codec) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = LAYERS;
    cfg.n_kv_heads = KV_HEADS;
    cfg.n_q_heads = Q_HEADS;
    cfg.head_dim = DIM;
    cfg.max_tokens = MAX_TOKENS;
    cfg.k_codec = "int8";
    cfg.v_codec = v_codec;
    char err[256] = "";
    cfg.err_msg = err;
    cfg.err_msg_size = sizeof err;
    kvq_cache *kv;
    kvq_status st = kvq_cache_create(&kv, &cfg);
    if (st != KVQ_OK)
        die("kvq_cache_create", st, err);
    return kv;
}

static float K[TOTAL][LAYERS][KV_HEADS][DIM], V[TOTAL][LAYERS][KV_HEADS][DIM];
static float Q[TOTAL][LAYERS][Q_HEADS][DIM];

/* Appends tokens first..first+n-1 to every layer and attends with their
 * queries; out (optional) gets the last layer's [n][Q_HEADS][DIM]. */
static void run_step(kvq_cache *kv, int first, int n, float *out) {
    static float K1[PREFILL][KV_HEADS][DIM], V1[PREFILL][KV_HEADS][DIM];
    static float Q1[PREFILL][Q_HEADS][DIM], o[PREFILL][Q_HEADS][DIM];
    int32_t pos[PREFILL];
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < n; i++) { /* this layer's rows of the tokens */
            pos[i] = first + i;
            memcpy(K1[i], K[first + i][l], sizeof K1[i]);
            memcpy(V1[i], V[first + i][l], sizeof V1[i]);
            memcpy(Q1[i], Q[first + i][l], sizeof Q1[i]);
        }
        kvq_status st = kvq_cache_append(kv, (size_t)l, &K1[0][0][0], &V1[0][0][0], pos, (size_t)n);
        if (st == KVQ_OK)
            st = kvq_cache_attend(kv, (size_t)l, &Q1[0][0][0], pos, (size_t)n, &o[0][0][0],
                                  (size_t)n * Q_HEADS * DIM, NULL, 0);
        if (st != KVQ_OK)
            die("append/attend", st, kvq_cache_last_error(kv));
    }
    if (out)
        memcpy(out, o, sizeof(float) * n * Q_HEADS * DIM);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                unlink(path);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

int main(void) {
    for (int t = 0; t < TOTAL; t++)
        for (int l = 0; l < LAYERS; l++) {
            for (int h = 0; h < KV_HEADS; h++)
                for (int c = 0; c < DIM; c++) {
                    K[t][l][h][c] = gauss();
                    V[t][l][h][c] = gauss();
                }
            for (int h = 0; h < Q_HEADS; h++)
                for (int c = 0; c < DIM; c++)
                    Q[t][l][h][c] = gauss();
        }

    char dir[] = "/tmp/kvq_snapshot_XXXXXX", url[80], err[256] = "";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }

    /* 1. a session: prefill, a few decode steps, then save it */
    kvq_cache *a = make_cache("tq4");
    run_step(a, 0, PREFILL, NULL);
    for (int t = PREFILL; t < PREFILL + DECODE; t++)
        run_step(a, t, 1, NULL);
    snprintf(url, sizeof url, "file:%s", dir);
    kvq_store *store;
    kvq_status st = kvq_store_open(&store, url, NULL, err, sizeof err);
    if (st != KVQ_OK)
        die(url, st, err);
    st = kvq_cache_save(a, store, "session-1", INT32_MAX);
    if (st != KVQ_OK)
        die("kvq_cache_save", st, kvq_cache_last_error(a));
    kvq_store_metrics m;
    kvq_store_stats(store, &m);
    kvq_store_close(store);

    /* 2. a fresh cache restores it from the store, opened read-only */
    snprintf(url, sizeof url, "file:%s?readonly=1", dir);
    st = kvq_store_open(&store, url, NULL, err, sizeof err);
    if (st != KVQ_OK)
        die(url, st, err);
    kvq_cache *b = make_cache("tq4");
    st = kvq_cache_load(b, store, "session-1");
    if (st != KVQ_OK)
        die("kvq_cache_load", st, kvq_cache_last_error(b));

    /* 3. the same tokens, the same K/V bit for bit */
    static float ka[MAX_TOKENS * KV_HEADS * DIM], va[MAX_TOKENS * KV_HEADS * DIM];
    static float kb[MAX_TOKENS * KV_HEADS * DIM], vb[MAX_TOKENS * KV_HEADS * DIM];
    int32_t pa[MAX_TOKENS], pb[MAX_TOKENS];
    for (int l = 0; l < LAYERS; l++) {
        size_t na = 0, nb = 0;
        kvq_cache_tokens(a, (size_t)l, &na);
        kvq_cache_tokens(b, (size_t)l, &nb);
        expect(na == PREFILL + DECODE && nb == na, "the restored cache holds other tokens");
        if (nb != na)
            continue;
        size_t cap = na * KV_HEADS * DIM;
        if (kvq_cache_positions(a, (size_t)l, pa, MAX_TOKENS) != KVQ_OK ||
            kvq_cache_positions(b, (size_t)l, pb, MAX_TOKENS) != KVQ_OK ||
            kvq_cache_get_kv(a, (size_t)l, -1, 0, na, ka, va, cap) != KVQ_OK ||
            kvq_cache_get_kv(b, (size_t)l, -1, 0, nb, kb, vb, cap) != KVQ_OK) {
            expect(0, "reading the caches back failed");
            continue;
        }
        expect(memcmp(pa, pb, na * sizeof pa[0]) == 0, "positions differ");
        expect(memcmp(ka, kb, cap * sizeof ka[0]) == 0, "restored keys differ");
        expect(memcmp(va, vb, cap * sizeof va[0]) == 0, "restored values differ");
    }

    /* 4. the next decode step gives the same attention output in both */
    static float oa[Q_HEADS * DIM], ob[Q_HEADS * DIM];
    run_step(a, PREFILL + DECODE, 1, oa);
    run_step(b, PREFILL + DECODE, 1, ob);
    expect(memcmp(oa, ob, sizeof oa) == 0, "the next step's attention differs after restore");

    /* 5. a cache configured otherwise is refused and stays empty */
    kvq_cache *c = make_cache("tq3");
    st = kvq_cache_load(c, store, "session-1");
    size_t nc = 1;
    kvq_cache_tokens(c, 0, &nc);
    expect(st == KVQ_ERR_MISMATCH && nc == 0, "a snapshot of another v_codec was not refused");
    printf("loading into a cache with tq3 values: %s: %s\n", kvq_strerror(st),
           kvq_cache_last_error(c));
    st = kvq_cache_load(c, store, "no-such-session");
    expect(st != KVQ_OK, "a missing snapshot loaded");
    const char *why = kvq_cache_last_error(c);
    printf("loading a missing snapshot: %s%s%s\n", kvq_strerror(st), *why ? ": " : "", why);

    kvq_stats s;
    kvq_cache_stats(b, -1, &s);
    printf("kvq %s: saved %d tokens x %d layers (int8 K, tq4 V, head_dim %d) as %llu records,"
           " %llu bytes, to %s; restored into a fresh cache: %llu bytes stored, %.3f bits/value;"
           " positions, K/V and the next step's attention identical\n",
           kvq_version_string(), PREFILL + DECODE, LAYERS, DIM, (unsigned long long)m.records,
           (unsigned long long)m.live_bytes, dir, (unsigned long long)s.stored_bytes,
           s.bits_per_value);

    kvq_cache_free(a);
    kvq_cache_free(b);
    kvq_cache_free(c);
    kvq_store_close(store);
    remove_dir(dir);
    if (failures) {
        fprintf(stderr, "snapshot: %d check(s) failed\n", failures);
        return 1;
    }
    printf("snapshot: all checks passed\n");
    return 0;
}
