/*
 * tiers.c - a cache whose pages live in three tiers: hot (the cache's
 * arena), warm (a second arena, here also re-encoded from int8 to int4) and
 * cold (page records in a file store on disk), with the bytes each move
 * costs counted.
 *
 *   cc -std=c11 -O2 tiers.c $(pkg-config --cflags --libs kvq) -lm
 *
 * Three caches see the same prefill and decode steps: one keeps every page
 * hot, one has hot/warm/cold tiers with warm pages stored as they were hot,
 * and one re-encodes warm pages to int4. Exits 1 when a promise breaks:
 * - tiers decide where a page lives, not what attention computes: with
 *   warm pages stored as hot, the outputs equal those of the all-hot cache
 *   (the same encoded bytes; a tolerance of 1e-5 relative covers a different
 *   summation order over at most 512 tokens, 512 * 2^-24 = 3e-5 of the
 *   largest term and in practice far less);
 * - every stored token is in exactly one tier; the warm tier holds at most
 *   its capacity; the hot tier at most its capacity plus the pages that must
 *   stay hot (the sink page and the pages of the protected recent window);
 * - pages went cold and came back (bytes_to_cold, bytes_from_cold > 0), the
 *   store wrote at least the bytes the cache sent to it, and freeing the
 *   caches deletes their records from the store.
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

enum { LAYERS = 2, KV_HEADS = 2, Q_HEADS = 4, DIM = 64 };
enum { PREFILL = 256, DECODE = 256, TOTAL = PREFILL + DECODE };
enum { PAGE = 16, HOT = 128, WARM = 128, SINKS = 4, PROTECT = 32 };

static uint64_t rng_state = 0x853c49e6748fea9bu;

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

static kvq_cache *make_cache(kvq_store *cold, const char *warm_codec) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = LAYERS;
    cfg.n_kv_heads = KV_HEADS;
    cfg.n_q_heads = Q_HEADS;
    cfg.head_dim = DIM;
    cfg.max_tokens = TOTAL;
    cfg.k_codec = "int8";
    cfg.v_codec = "int8";
    cfg.page_tokens = PAGE;
    cfg.sinks = SINKS;
    cfg.protect_recent = PROTECT;
    if (cold) { /* per layer: 128 tokens hot, 128 warm, the rest cold */
        cfg.hot_tokens = HOT;
        cfg.warm_tokens = WARM;
        cfg.warm_codec = warm_codec;
        cfg.cold_store = cold;
    }
    char err[256] = "";
    cfg.err_msg = err;
    cfg.err_msg_size = sizeof err;
    kvq_cache *kv;
    kvq_status st = kvq_cache_create(&kv, &cfg);
    if (st != KVQ_OK)
        die("kvq_cache_create", st, err);
    return kv;
}

/* Appends tokens first..first+n-1 (K/V from k, v) to every layer and
 * attends with their queries q; out gets [LAYERS][n][Q_HEADS][DIM]. */
static void run_step(kvq_cache *kv, int first, int n, const float *k, const float *v,
                     const float *q, float *out) {
    int32_t pos[PREFILL];
    for (int i = 0; i < n; i++)
        pos[i] = first + i;
    size_t kvn = (size_t)n * KV_HEADS * DIM, qn = (size_t)n * Q_HEADS * DIM;
    for (int l = 0; l < LAYERS; l++) {
        kvq_status st = kvq_cache_append(kv, (size_t)l, k + l * kvn, v + l * kvn, pos, (size_t)n);
        if (st == KVQ_OK)
            st = kvq_cache_attend(kv, (size_t)l, q + l * qn, pos, (size_t)n, out + l * qn, qn,
                                  NULL, 0);
        if (st != KVQ_OK)
            die("append/attend", st, kvq_cache_last_error(kv));
    }
}

static void print_tiers(const char *name, const kvq_tier_stats *t) {
    static const char *tier[3] = {"hot", "warm", "cold"};
    printf("%s\n", name);
    for (int i = 0; i < 3; i++)
        printf("  %-4s %4llu pages %5llu tokens %8llu bytes %7llu page reads\n", tier[i],
               (unsigned long long)t->pages[i], (unsigned long long)t->tokens[i],
               (unsigned long long)t->bytes[i], (unsigned long long)t->reads[i]);
    printf("  moved: hot->warm %llu B, warm->hot %llu B, to cold %llu B, from cold %llu B"
           " (%llu demotions, %llu promotions)\n",
           (unsigned long long)t->bytes_hot_to_warm, (unsigned long long)t->bytes_warm_to_hot,
           (unsigned long long)t->bytes_to_cold, (unsigned long long)t->bytes_from_cold,
           (unsigned long long)t->demotions, (unsigned long long)t->promotions);
    printf("  transfer time: %.3f ms modeled (PCIe-like link), %.3f ms measured\n",
           t->modeled_transfer_ms, t->measured_transfer_ms);
}

static void check_tiers(const char *name, kvq_cache *kv, const kvq_tier_stats *t) {
    kvq_stats s;
    kvq_cache_stats(kv, -1, &s);
    char what[160];
    snprintf(what, sizeof what, "%s: the tiers do not hold every stored token once", name);
    expect(t->tokens[0] + t->tokens[1] + t->tokens[2] == s.tokens, what);
    snprintf(what, sizeof what, "%s: more warm tokens than the warm capacity", name);
    expect(t->tokens[1] <= (uint64_t)LAYERS * WARM, what);
    /* pinned: the sink page and the pages the protected window spans */
    uint64_t pinned = PAGE * (1 + (PROTECT + PAGE - 1) / PAGE + 1);
    snprintf(what, sizeof what, "%s: more hot tokens than the hot capacity and pinned pages", name);
    expect(t->tokens[0] <= (uint64_t)LAYERS * (HOT + pinned), what);
    snprintf(what, sizeof what, "%s: no page went cold and came back", name);
    expect(t->bytes_to_cold > 0 && t->bytes_from_cold > 0 && t->tokens[2] > 0, what);
}

/* Removes the store's directory (segment files only, no subfolders). */
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
    static float k[LAYERS * TOTAL * KV_HEADS * DIM], v[LAYERS * TOTAL * KV_HEADS * DIM];
    static float q[LAYERS * TOTAL * Q_HEADS * DIM];
    static float out_hot[LAYERS * PREFILL * Q_HEADS * DIM];
    static float out_tier[LAYERS * PREFILL * Q_HEADS * DIM];
    static float out_int4[LAYERS * PREFILL * Q_HEADS * DIM];

    char dir[] = "/tmp/kvq_tiers_XXXXXX", url[64], err[256] = "";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(url, sizeof url, "file:%s", dir);
    kvq_store *store;
    kvq_status st = kvq_store_open(&store, url, NULL, err, sizeof err);
    if (st != KVQ_OK)
        die(url, st, err);

    kvq_cache *hot = make_cache(NULL, NULL);
    kvq_cache *tiered = make_cache(store, NULL);
    kvq_cache *tiered4 = make_cache(store, "int4");

    /* K/V and queries laid out per step: [token][layer][...] blocks */
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        k[i] = gauss();
        v[i] = gauss();
    }
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = gauss();

    double max_diff = 0, max_ref = 0, err4 = 0, ref4 = 0;
    for (int t = 0; t < TOTAL; t += (t < PREFILL ? PREFILL : 1)) {
        int n = t < PREFILL ? PREFILL : 1;
        const float *kt = k + (size_t)t * LAYERS * KV_HEADS * DIM;
        const float *vt = v + (size_t)t * LAYERS * KV_HEADS * DIM;
        const float *qt = q + (size_t)t * LAYERS * Q_HEADS * DIM;
        run_step(hot, t, n, kt, vt, qt, out_hot);
        run_step(tiered, t, n, kt, vt, qt, out_tier);
        run_step(tiered4, t, n, kt, vt, qt, out_int4);
        for (size_t i = 0; i < (size_t)LAYERS * n * Q_HEADS * DIM; i++) {
            max_diff = fmax(max_diff, fabs((double)out_tier[i] - out_hot[i]));
            max_ref = fmax(max_ref, fabs((double)out_hot[i]));
            err4 += ((double)out_int4[i] - out_hot[i]) * ((double)out_int4[i] - out_hot[i]);
            ref4 += (double)out_hot[i] * out_hot[i];
        }
    }
    expect(max_diff <= 1e-5 * max_ref, "tiered attention differs from the all-hot cache");

    kvq_tier_stats t1, t4;
    kvq_cache_tier_stats(tiered, &t1);
    kvq_cache_tier_stats(tiered4, &t4);
    kvq_store_metrics m;
    kvq_store_stats(store, &m);

    printf("kvq %s: %d layers, %d KV heads, head_dim %d, int8 K/V in pages of %d tokens;"
           " per layer %d tokens hot, %d warm, the rest cold in %s\n",
           kvq_version_string(), LAYERS, KV_HEADS, DIM, PAGE, HOT, WARM, url);
    print_tiers("warm pages as hot (int8):", &t1);
    print_tiers("warm pages re-encoded to int4:", &t4);
    printf("attention against the all-hot cache: max |difference| %.2e with warm pages as hot;"
           " relative L2 error %.4f with int4 warm pages\n",
           max_diff, sqrt(err4 / ref4));
    printf("(each of the %d decode steps attends over every token, so it reads every cold page"
           " back: that is the from-cold traffic)\n", DECODE);
    printf("file store: %llu records, %llu bytes written, %llu bytes read, %llu puts, %llu gets\n",
           (unsigned long long)m.records, (unsigned long long)m.bytes_written,
           (unsigned long long)m.bytes_read, (unsigned long long)m.puts,
           (unsigned long long)m.gets);

    check_tiers("warm as hot", tiered, &t1);
    check_tiers("int4 warm", tiered4, &t4);
    expect(m.bytes_written >= t1.bytes_to_cold + t4.bytes_to_cold,
           "the store wrote fewer bytes than the caches sent to it");
    expect(t4.bytes[1] * t1.tokens[1] < t1.bytes[1] * t4.tokens[1],
           "int4 warm pages are not smaller per token than int8 ones");

    kvq_cache_free(hot);
    kvq_cache_free(tiered);
    kvq_cache_free(tiered4);
    kvq_store_stats(store, &m);
    expect(m.records == 0, "freed caches left records in the store");
    kvq_store_close(store);
    remove_dir(dir);

    if (failures) {
        fprintf(stderr, "tiers: %d check(s) failed\n", failures);
        return 1;
    }
    printf("tiers: all checks passed\n");
    return 0;
}
