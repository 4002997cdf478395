/*
 * test_model.c - the llama2.c model runner on the real models in the data
 * directory, against their reference figures (../shared/data/README.md,
 * computed by an independent implementation):
 * - stories260K: the published greedy sample; the mean NLL over the shared
 *   text (1.6438 nats, 9136 tokens) with an f32 cache, with the SIMD product
 *   and with the scalar reference product, and with pre-RoPE keys;
 * - stories15M (head_dim 48): the greedy sample, decoded one forward call per
 *   token; the mean NLL (1.6344 nats, 4453 tokens) both as one prefill call
 *   per story and in decode semantics (one call per token), the two equal;
 * - the matrix product's SIMD paths against the scalar reference at odd
 *   sizes and misaligned pointers, within the float summation bound;
 * - tokenizer round trips, the ak42 v1/v2 layouts (written here from the
 *   legacy file) and corrupt files.
 * Under sanitizers (where the runner is ~10x slower) stories15M's NLL runs
 * on the first stories only (decode against prefill), and the full-text
 * checks need a SIMD path; the normal build also prints the decode speed.
 */
#include "testutil.h"

#include "kernels/kernels.h"
#include "model/model_impl.h"

#include <float.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TM_SANITIZED 1
#endif
#endif
#ifndef TM_SANITIZED
#define TM_SANITIZED 0
#endif

static char model_path[1024], tok_path[1024], text_path[1024];

/* The shared text: one story per non-empty line. */
static char **stories;
static size_t n_stories;

static int load_stories(void) {
    FILE *f = fopen(text_path, "rb");
    if (!f)
        return -1;
    static char line[65536];
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!len)
            continue;
        stories = realloc(stories, (n_stories + 1) * sizeof *stories);
        stories[n_stories] = malloc(len + 1);
        memcpy(stories[n_stories++], line, len + 1);
    }
    fclose(f);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static kvq_cache *f32_cache(const kvq_model *m, int prerope) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(m, &cfg);
    cfg.k_codec = cfg.v_codec = "f32";
    cfg.k_prerope = prerope;
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    return c;
}

/* -log softmax(l)[target], in double. */
static double token_nll(const float *l, size_t V, int32_t target) {
    double mx = -1e300, s = 0;
    for (size_t v = 0; v < V; v++)
        mx = l[v] > mx ? l[v] : mx;
    for (size_t v = 0; v < V; v++)
        s += exp(l[v] - mx);
    return -(l[target] - mx - log(s));
}

static size_t argmax(const float *l, size_t V) {
    size_t b = 0;
    for (size_t v = 1; v < V; v++)
        if (l[v] > l[b])
            b = v;
    return b;
}

/* Greedy decoding from BOS, one forward call per token, until the text is
 * as long as want (or max_tokens). */
static void test_greedy(const kvq_model *m, const kvq_tokenizer *t, const char *want,
                        int32_t max_tokens) {
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    kvq_cache *c = f32_cache(m, 0);
    if (!c)
        return;
    char out[4096] = "", buf[8];
    int32_t cur = 1;
    float *lg = malloc(in.vocab_size * sizeof(float));
    for (int32_t pos = 0; pos < max_tokens && strlen(out) < strlen(want); pos++) {
        kvq_status st = kvq_model_forward(m, c, &cur, 1, pos, lg, in.vocab_size, 1);
        CHECK_OK(st);
        if (st != KVQ_OK)
            break;
        int32_t nx = (int32_t)argmax(lg, in.vocab_size);
        strncat(out, kvq_tokenizer_piece(t, cur, nx, buf), sizeof out - strlen(out) - 1);
        cur = nx;
    }
    TU_REPORT(strncmp(out, want, strlen(want)) == 0, "greedy sample differs:\n  got  %s\n  want %s",
              out, want);
    free(lg);
    kvq_cache_free(c);
}

/* Teacher-forced mean NLL over stories [first, first + count) with an f32
 * cache, each encoded with BOS and truncated to max_len tokens: one forward
 * call per story (prefill) or one per token (decode). *ntok gets the number
 * of predicted tokens, *secs the time spent in kvq_model_forward, and
 * times (when not NULL; count * max_len entries) that of each call. */
static double nll_stories(const kvq_model *m, const kvq_tokenizer *t, size_t max_len, int prerope,
                          int decode, size_t first, size_t count, size_t *ntok, double *secs,
                          double *times) {
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    size_t V = in.vocab_size;
    int32_t *tk = malloc(sizeof(int32_t) * 65536);
    float *lg = malloc(sizeof(float) * V * (decode ? 1 : max_len));
    double nll = 0, tsum = 0;
    size_t calls = 0;
    *ntok = 0;
    for (size_t s = first; s < first + count && s < n_stories; s++) {
        size_t n;
        CHECK_OK(kvq_tokenizer_encode(t, stories[s], 1, 0, tk, 65536, &n));
        if (n > max_len)
            n = max_len;
        kvq_cache *c = f32_cache(m, prerope);
        if (!c)
            break;
        kvq_status st = KVQ_OK;
        if (decode) {
            for (size_t i = 0; i + 1 < n && st == KVQ_OK; i++) {
                double t0 = now_s();
                st = kvq_model_forward(m, c, tk + i, 1, (int32_t)i, lg, V, 1);
                double dt = now_s() - t0;
                tsum += dt;
                if (times)
                    times[calls++] = dt;
                nll += token_nll(lg, V, tk[i + 1]);
                (*ntok)++;
            }
        } else {
            double t0 = now_s();
            st = kvq_model_forward(m, c, tk, n, 0, lg, V * max_len, 0);
            double dt = now_s() - t0;
            tsum += dt;
            if (times)
                times[calls++] = dt;
            for (size_t i = 0; i + 1 < n && st == KVQ_OK; i++) {
                nll += token_nll(lg + i * V, V, tk[i + 1]);
                (*ntok)++;
            }
        }
        CHECK_OK(st);
        kvq_cache_free(c);
    }
    free(tk);
    free(lg);
    if (secs)
        *secs = tsum;
    return *ntok ? nll / (double)*ntok : NAN;
}

/* Every matrix-product path the CPU has against the scalar reference and
 * against the exact (double) product, at odd sizes, on misaligned pointers,
 * with guards around the output. A float dot product of n terms, summed in
 * any order with or without FMA, is within gamma_n * sum_j |w_j x_j| of the
 * exact value (gamma_n = n u / (1 - n u), u = 2^-24; Higham, Accuracy and
 * Stability, 3.1); with n <= 300, gamma_n < (n + 1) u. So each path is held
 * to (n + 1) u S of exact and to 2 (n + 1) u S = (n + 1) FLT_EPSILON S of
 * the reference. */
static void test_matmul_paths(void) {
    static const size_t ns[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 48, 64, 127, 172, 288};
    static const size_t ds[] = {1, 3, 5, 8, 9, 17};
    static const size_t nts[] = {1, 2, 3, 4, 5, 6, 7, 13, 97, 200};
    struct {
        const char *name;
        kvq__matmul_fn fn;
        int ok;
    } paths[] = {
#if defined(__x86_64__)
        {"avx2", kvq__matmul_avx2, kvq__cpu_has_avx2()},
        {"avx512", kvq__matmul_avx512, kvq__cpu_has_avx512()},
#else
        {"avx2", kvq__matmul_ref, 0},
        {"avx512", kvq__matmul_ref, 0},
#endif
    };
    uint64_t seed = 9;
    printf("matmul paths: seed %llu, avx2 %s, avx512 %s\n", (unsigned long long)seed,
           paths[0].ok ? "tested" : "not on this CPU", paths[1].ok ? "tested" : "not on this CPU");
    tu_rng r;
    tu_seed(&r, seed);
    const size_t maxn = 288, maxd = 17, maxt = 200, guard = 16;
    float *wb = malloc((maxn * maxd + 1) * sizeof(float));
    float *xb = malloc((maxn * maxt + 1) * sizeof(float));
    float *ref = malloc(maxd * maxt * sizeof(float));
    float *ob = malloc((maxd * maxt + 2 * guard) * sizeof(float));
    double worst[2] = {0, 0}; /* largest error / bound seen, per path */
    long bad[2] = {0, 0}, bad_exact = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof ds / sizeof *ds; b++)
            for (size_t c = 0; c < sizeof nts / sizeof *nts; c++) {
                size_t n = ns[a], d = ds[b], nt = nts[c];
                float *W = wb + 1, *x = xb + 1; /* 4-byte aligned only */
                tu_fill_gauss(&r, W, n * d, 1.0f);
                tu_fill_gauss(&r, x, n * nt, 1.0f);
                kvq__matmul_ref(ref, x, W, n, d, nt);
                for (size_t p = 0; p < 2; p++) {
                    if (!paths[p].ok)
                        continue;
                    for (size_t i = 0; i < d * nt + 2 * guard; i++)
                        ob[i] = 12345.0f;
                    float *out = ob + guard;
                    paths[p].fn(out, x, W, n, d, nt);
                    for (size_t i = 0; i < guard; i++)
                        if (ob[i] != 12345.0f || out[d * nt + i] != 12345.0f)
                            bad[p]++;
                    for (size_t t = 0; t < nt; t++)
                        for (size_t i = 0; i < d; i++) {
                            double ex = 0, S = 0;
                            for (size_t j = 0; j < n; j++) {
                                ex += (double)W[i * n + j] * x[t * n + j];
                                S += fabs((double)W[i * n + j] * x[t * n + j]);
                            }
                            double g = out[t * d + i], e = fabs(g - ref[t * d + i]);
                            double bound = (double)(n + 1) * FLT_EPSILON * S;
                            if (!(e <= bound))
                                bad[p]++;
                            if (!(fabs(g - ex) <= 0.5 * bound) ||
                                !(fabs(ref[t * d + i] - ex) <= 0.5 * bound))
                                bad_exact++;
                            if (bound > 0 && e / bound > worst[p])
                                worst[p] = e / bound;
                        }
                }
            }
    for (size_t p = 0; p < 2; p++)
        if (paths[p].ok) {
            TU_REPORT(bad[p] == 0, "matmul %s: %ld outputs off the reference or guards touched",
                      paths[p].name, bad[p]);
            printf("matmul %s: largest |path - reference| = %.3f of the bound\n", paths[p].name,
                   worst[p]);
        }
    TU_REPORT(bad_exact == 0, "matmul: %ld outputs off the exact product by more than (n+1)u S",
              bad_exact);
    free(wb);
    free(xb);
    free(ref);
    free(ob);
}
static void test_tokenizer(const kvq_tokenizer *t) {
    const char *texts[] = {"Once upon a time, Lily said \"hi!\"", "x", "caf\xc3\xa9 \xe2\x9c\x93 zzz",
                           "  two  spaces"};
    for (size_t i = 0; i < 4; i++) {
        int32_t tk[256];
        size_t n;
        CHECK_OK(kvq_tokenizer_encode(t, texts[i], 1, 0, tk, 256, &n));
        CHECK(tk[0] == 1);
        char out[512] = "", buf[8];
        for (size_t j = 1; j < n; j++)
            strncat(out, kvq_tokenizer_piece(t, tk[j - 1], tk[j], buf), sizeof out - strlen(out) - 1);
        /* the dummy prefix space after BOS is dropped by the decoder */
        TU_REPORT(strcmp(out, texts[i]) == 0, "round trip '%s' -> '%s'", texts[i], out);
    }
    int32_t tk[4];
    size_t n;
    CHECK_STATUS(kvq_tokenizer_encode(t, "abcdef", 1, 0, tk, 4, &n), KVQ_ERR_DST_TOO_SMALL);
    CHECK_OK(kvq_tokenizer_encode(t, "", 1, 1, tk, 4, &n));
    CHECK_EQ(n, 2);
}

/* Writes the legacy model as ak42 v1 (fp32) or v2 (Q8_0, group 32); with
 * dequant, v1 holds the v2 file's weights as fp32 (q * s, one correctly
 * rounded float product: what a Q8_0 value means). */
static int write_ak42(const char *src, const char *dst, int version, int dequant) {
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    int32_t h[7];
    if (fread(h, 4, 7, f) != 7)
        return -1;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 28, SEEK_SET);
    float *w = malloc((size_t)sz);
    size_t nw = fread(w, 4, (size_t)(sz - 28) / 4, f);
    fclose(f);
    size_t D = (size_t)h[0], HD = (size_t)h[1], L = (size_t)h[2], NH = (size_t)h[3], KV = (size_t)h[4];
    size_t V = (size_t)(h[5] < 0 ? -h[5] : h[5]), hs = D / NH, kvd = KV * hs;
    (void)nw;
    float *p = w;
    float *emb = p; p += V * D;
    float *rms_att = p; p += L * D;
    float *wq = p; p += L * D * D;
    float *wk = p; p += L * D * kvd;
    float *wv = p; p += L * D * kvd;
    float *wo = p; p += L * D * D;
    float *rms_ffn = p; p += L * D;
    float *w1 = p; p += L * D * HD;
    float *w2 = p; p += L * D * HD;
    float *w3 = p; p += L * D * HD;
    float *rms_final = p;
    FILE *o = fopen(dst, "wb");
    unsigned char hdr[256] = {0};
    uint32_t magic = 0x616b3432;
    int32_t ver = version;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &ver, 4);
    int32_t h2[7] = {h[0], h[1], h[2], h[3], h[4], (int32_t)V, h[6]};
    memcpy(hdr + 8, h2, 28);
    hdr[36] = 1;
    int32_t gs = 32;
    if (version == 2)
        memcpy(hdr + 37, &gs, 4);
    fwrite(hdr, 1, 256, o);
    fwrite(rms_att, 4, L * D, o);
    fwrite(rms_ffn, 4, L * D, o);
    fwrite(rms_final, 4, D, o);
    struct {
        float *p;
        size_t per, cnt;
    } mats[] = {{emb, V * D, 1},   {wq, D * D, L},  {wk, D * kvd, L}, {wv, D * kvd, L},
                {wo, D * D, L},    {w1, D * HD, L}, {w2, D * HD, L},  {w3, D * HD, L}};
    for (size_t i = 0; i < 8; i++)
        for (size_t k = 0; k < mats[i].cnt; k++) {
            float *x = mats[i].p + k * mats[i].per;
            size_t n = mats[i].per;
            if (version == 1 && !dequant) {
                fwrite(x, 4, n, o);
                continue;
            }
            int8_t *q = malloc(n);
            float *s = malloc(n / 32 * 4);
            for (size_t g = 0; g < n / 32; g++) {
                float amax = 0;
                for (size_t j = 0; j < 32; j++)
                    amax = fmaxf(amax, fabsf(x[g * 32 + j]));
                s[g] = amax / 127.0f;
                for (size_t j = 0; j < 32; j++)
                    q[g * 32 + j] = (int8_t)lrintf(s[g] > 0 ? x[g * 32 + j] / s[g] : 0);
            }
            if (version == 1) {
                for (size_t j = 0; j < n; j++) {
                    float v = (float)q[j] * s[j / 32];
                    fwrite(&v, 4, 1, o);
                }
            } else {
                fwrite(q, 1, n, o);
                fwrite(s, 4, n / 32, o);
            }
            free(q);
            free(s);
        }
    fclose(o);
    free(w);
    return 0;
}

static void logits_first(const kvq_model *m, float *lg) {
    kvq_cache *c = f32_cache(m, 0);
    int32_t tk[5] = {1, 403, 407, 261, 378};
    float all[5 * 512];
    CHECK_OK(kvq_model_forward(m, c, tk, 5, 0, all, 5 * 512, 0));
    memcpy(lg, all + 4 * 512, 512 * sizeof(float));
    kvq_cache_free(c);
}

static void test_ak42(const kvq_model *m) {
    char p1[] = "/tmp/kvq_ak42_v1_XXXXXX", p2[] = "/tmp/kvq_ak42_v2_XXXXXX";
    char p3[] = "/tmp/kvq_ak42_dq_XXXXXX";
    int f1 = mkstemp(p1), f2 = mkstemp(p2), f3 = mkstemp(p3);
    close(f1);
    close(f2);
    close(f3);
    CHECK(write_ak42(model_path, p1, 1, 0) == 0);
    CHECK(write_ak42(model_path, p2, 2, 0) == 0);
    CHECK(write_ak42(model_path, p3, 1, 1) == 0);
    float ref[512], a[512], b[512], c[512];
    logits_first(m, ref);
    kvq_model *m1 = NULL, *m2 = NULL, *m3 = NULL;
    CHECK_OK(kvq_model_load(&m1, p1, NULL));
    CHECK_OK(kvq_model_load(&m2, p2, NULL));
    CHECK_OK(kvq_model_load(&m3, p3, NULL));
    if (m1 && m2 && m3) {
        kvq_model_info i1, i2;
        kvq_model_get_info(m1, &i1);
        kvq_model_get_info(m2, &i2);
        CHECK_EQ(i1.version, 1);
        CHECK_EQ(i2.version, 2);
        logits_first(m1, a);
        logits_first(m2, b);
        logits_first(m3, c);
        CHECK(memcmp(a, ref, sizeof a) == 0);
        /* v2 is dequantized at load: the same model as the fp32 file of
         * its dequantized weights, bit for bit */
        int differ = 0;
        double e = 0;
        for (int i = 0; i < 512; i++) {
            differ += memcmp(&b[i], &c[i], sizeof b[i]) != 0;
            e = fmax(e, fabs(b[i] - c[i]));
        }
        TU_REPORT(differ == 0, "ak42 v2 logits differ from its dequantized weights' in %d of 512 (by %.3g)",
                  differ, e);
        /* and not the fp32 model's: the Q8_0 rounding is there */
        CHECK(memcmp(b, ref, sizeof b) != 0);
    }
    kvq_model_free(m3);
    unlink(p3);
    kvq_model_free(m1);
    kvq_model_free(m2);
    /* truncated file */
    FILE *f = fopen(p1, "r+b");
    if (f) {
        fclose(f);
        CHECK(truncate(p1, 1000) == 0);
        kvq_model *bad = NULL;
        CHECK_STATUS(kvq_model_load(&bad, p1, NULL), KVQ_ERR_CORRUPT);
        CHECK(bad == NULL);
    }
    unlink(p1);
    unlink(p2);
    kvq_model *none = NULL;
    CHECK_STATUS(kvq_model_load(&none, "/nonexistent/model.bin", NULL), KVQ_ERR_IO);
}


/* ---- corrupt files (issue 10): every size from a header is checked for
 * overflow and against the file's real length ---- */

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = (!n || fwrite(p, 1, n, f) == n);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* A legacy checkpoint of the given header with every weight byte zero
 * (the file's length is 28 + body bytes; ftruncate keeps it sparse). */
static int write_legacy(const char *path, const int32_t h[7], size_t body) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(h, 4, 7, f) == 7;
    ok = fclose(f) == 0 && ok;
    return ok && truncate(path, (off_t)(28 + body)) == 0 ? 0 : -1;
}

/* A tokenizer.bin: <unk> <s> </s>, the 256 byte pieces and `extra` merges. */
static size_t make_tokenizer(uint8_t *b, uint32_t max_len, int extra) {
    size_t n = 0;
    memcpy(b, &max_len, 4);
    n = 4;
    for (int i = 0; i < 259 + extra; i++) {
        char s[16];
        if (i < 3)
            snprintf(s, sizeof s, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(s, sizeof s, "<0x%02X>", i - 3);
        else
            snprintf(s, sizeof s, "%c%c", 'a' + (i - 259) % 26, 'a' + (i - 259) / 26);
        float sc = -(float)i;
        uint32_t l = (uint32_t)strlen(s);
        memcpy(b + n, &sc, 4);
        memcpy(b + n + 4, &l, 4);
        memcpy(b + n + 8, s, l);
        n += 8 + l;
    }
    return n;
}

static void test_corrupt_files(void) {
    char path[] = "/tmp/kvq_corrupt_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    kvq_model *m = NULL;
    /* The crafted checkpoint: dim 2^20, hidden 2796202, 2^20 layers,
     * 1024 heads and KV heads (head_dim 1024), vocab 3, seq_len 1. Every
     * layer size overflows 64 bits; the sum of the tensor sizes, times 4,
     * wraps to 2^22 * (vocab + 1) = 16 MiB, and the unused freq_cis table
     * adds 4 KiB: a loader that computes these in size_t accepts this 16 MiB
     * file and places the weight pointers 2^40 floats apart. */
    {
        const int32_t h[7] = {1 << 20, 2796202, 1 << 20, 1024, 1024, 3, 1};
        CHECK(write_legacy(path, h, ((size_t)16 << 20) + 4096) == 0);
        CHECK_STATUS(kvq_model_load(&m, path, NULL), KVQ_ERR_CORRUPT);
        CHECK(m == NULL);
        kvq_model_free(m);
        m = NULL;
        char why[256] = "";
        CHECK_STATUS(kvq__model_load_mem(&m, (const uint8_t *)h, 28, NULL, KVQ_ISA_AUTO, why,
                                         sizeof why),
                     KVQ_ERR_CORRUPT);
        TU_REPORT(strstr(why, "overflow") != NULL, "overflow reason: '%s'", why);
    }
    /* A small well-formed checkpoint, then cut, extended and with bad fields:
     * dim 8, hidden 16, 2 layers, 2 heads, 1 KV head, vocab 300, seq_len 4 */
    {
        const int32_t h[7] = {8, 16, 2, 2, 1, 300, 4};
        size_t floats = 300 * 8 + 2 * 2 * 8 + 2 * 2 * 8 * 8 + 2 * 2 * 8 * 4 + 3 * 2 * 8 * 16 + 8 +
                        4 * 4; /* the last term: freq_cis, seq_len * head_dim */
        CHECK(write_legacy(path, h, floats * 4) == 0);
        CHECK_OK(kvq_model_load(&m, path, NULL));
        kvq_model_free(m);
        m = NULL;
        CHECK(write_legacy(path, h, floats * 4 - 4) == 0); /* truncated */
        CHECK_STATUS(kvq_model_load(&m, path, NULL), KVQ_ERR_CORRUPT);
        CHECK(write_legacy(path, h, floats * 4 + 4) == 0); /* trailing bytes */
        CHECK_STATUS(kvq_model_load(&m, path, NULL), KVQ_ERR_CORRUPT);
        uint8_t buf[28 + 8];
        memcpy(buf, h, 28);
        memset(buf + 28, 0, 8);
        char why[256] = "";
        CHECK_STATUS(kvq__model_load_mem(&m, buf, sizeof buf, NULL, KVQ_ISA_AUTO, why, sizeof why),
                     KVQ_ERR_CORRUPT);
        TU_REPORT(strstr(why, "needs") != NULL, "length reason: '%s'", why);
        int32_t hv[7];
        memcpy(hv, h, sizeof hv);
        hv[5] = INT32_MIN; /* negating it overflowed */
        CHECK(write_legacy(path, hv, floats * 4) == 0);
        CHECK_STATUS(kvq_model_load(&m, path, NULL), KVQ_ERR_CORRUPT);
        CHECK(m == NULL);
    }
    /* tokenizers */
    {
        kvq_tokenizer *t = NULL;
        static uint8_t tb[8192];
        size_t n = make_tokenizer(tb, 6, 20);
        CHECK(write_file(path, tb, n) == 0);
        CHECK_OK(kvq_tokenizer_load(&t, path, 279, NULL));
        kvq_tokenizer_free(t);
        t = NULL;
        /* ids 0..258 are reserved: a smaller vocabulary made the encoder's
         * byte fallback index past the table */
        CHECK_STATUS(kvq_tokenizer_load(&t, path, 258, NULL), KVQ_ERR_INVALID_ARG);
        CHECK(t == NULL);
        CHECK_STATUS(kvq_tokenizer_load(&t, path, 280, NULL), KVQ_ERR_CORRUPT); /* one short */
        /* one token more than the model's vocabulary (another model's
         * tokenizer): ids past the model's were loaded without a word */
        {
            char why2[256] = "";
            CHECK_STATUS(kvq_tokenizer_load_msg(&t, path, 278, NULL, why2, sizeof why2),
                         KVQ_ERR_CORRUPT);
            CHECK(t == NULL);
            TU_REPORT(strstr(why2, "bytes after the model's 278 tokens") != NULL,
                      "larger tokenizer reason: '%s'", why2);
        }
        /* a directory opens as a FILE; its size made a huge allocation */
        {
            char why2[256] = "";
            kvq_model *md = NULL;
            CHECK_STATUS(kvq_tokenizer_load_msg(&t, "/tmp", 279, NULL, why2, sizeof why2),
                         KVQ_ERR_IO);
            TU_REPORT(strstr(why2, "directory") != NULL, "directory reason: '%s'", why2);
            CHECK_STATUS(kvq_model_load(&md, "/tmp", NULL), KVQ_ERR_IO);
            CHECK(md == NULL && t == NULL);
        }
        /* a huge max_token_length: the encoder allocated 2 * it + 8 bytes */
        uint32_t huge = 0xffffffffu;
        memcpy(tb, &huge, 4);
        CHECK(write_file(path, tb, n) == 0);
        CHECK_STATUS(kvq_tokenizer_load(&t, path, 279, NULL), KVQ_ERR_CORRUPT);
        CHECK(t == NULL);
        char why[256] = "";
        CHECK_STATUS(kvq__tokenizer_load_mem(&t, tb, n, 279, NULL, why, sizeof why),
                     KVQ_ERR_CORRUPT);
        TU_REPORT(strstr(why, "max_token_length") != NULL, "max_len reason: '%s'", why);
        uint32_t six = 6, len = 0xfffffff0u;
        memcpy(tb, &six, 4);
        memcpy(tb + 4 + 4, &len, 4); /* the first piece's length */
        CHECK(write_file(path, tb, n) == 0);
        CHECK_STATUS(kvq_tokenizer_load(&t, path, 279, NULL), KVQ_ERR_CORRUPT);
        CHECK_STATUS(kvq__tokenizer_load_mem(&t, tb, n, 279, NULL, why, sizeof why),
                     KVQ_ERR_CORRUPT);
        TU_REPORT(strstr(why, "length") != NULL, "piece length reason: '%s'", why);
        CHECK(t == NULL);
    }
    unlink(path);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* A plain sum over n floats, four AVX2 chains: the memory-bandwidth baseline
 * the decode step is compared with. */
__attribute__((target("avx2"))) static float plain_sum_avx2(const float *p, size_t n) {
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a = _mm256_add_ps(a, _mm256_loadu_ps(p + i));
        b = _mm256_add_ps(b, _mm256_loadu_ps(p + i + 8));
        c = _mm256_add_ps(c, _mm256_loadu_ps(p + i + 16));
        d = _mm256_add_ps(d, _mm256_loadu_ps(p + i + 24));
    }
    float s[8];
    _mm256_storeu_ps(s, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    float r = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    for (; i < n; i++)
        r += p[i];
    return r;
}
#endif

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Decode time per token (the median of the calls: other processes on the
 * machine inflate the mean) against a plain sum over the model's weights,
 * which each decode step reads once, both measured here. */
static void print_decode_speed(const kvq_model *m, double *times, size_t ntok) {
    size_t nw;
    const float *w = kvq__model_weights(m, &nw);
    qsort(times, ntok, sizeof *times, cmp_double);
    double per = times[ntok / 2], mb = (double)nw * 4 / 1e6;
    printf("stories15M decode (%s): median %.3f ms/token (fastest %.3f), %.1f MB of weights each "
           "= %.1f GB/s", kvq__model_kernel_name(m), per * 1e3, times[0] * 1e3, mb, mb / 1e3 / per);
#if defined(__x86_64__)
    if (kvq__cpu_has_avx2()) {
        double best = 1e9;
        volatile float sink = 0;
        for (int r = 0; r < 5; r++) {
            double t0 = now_s();
            sink += plain_sum_avx2(w, nw);
            double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        (void)sink;
        printf("; a plain sum over the same bytes: %.3f ms = %.1f GB/s", best * 1e3,
               mb / 1e3 / best);
    }
#endif
    printf("\n");
}

static void test_stories260k(void) {
    snprintf(model_path, sizeof model_path, "%s/stories260K/stories260K.bin", tu_data_dir());
    snprintf(tok_path, sizeof tok_path, "%s/stories260K/tok512.bin", tu_data_dir());
    kvq_model *m = NULL, *ms = NULL;
    kvq_tokenizer *t = NULL;
    CHECK_OK(kvq_model_load(&m, model_path, NULL));
    CHECK_OK(kvq__model_load_isa(&ms, model_path, NULL, KVQ_ISA_SCALAR));
    if (m)
        CHECK_OK(kvq_tokenizer_load(&t, tok_path, 512, NULL));
    if (m && ms && t) {
        CHECK(strcmp(kvq__model_kernel_name(ms), "scalar") == 0);
        test_greedy(m, t,
                    "Once upon a time, there was a little girl named Lily. She loved to play "
                    "outside in the park. One day, she saw a big, red ball. She wanted to play "
                    "with it, but it was too high.",
                    120);
        test_tokenizer(t);
        size_t n;
        double nll = nll_stories(m, t, 512, 0, 0, 0, n_stories, &n, NULL, NULL);
        printf("stories260K, f32 cache (%s): mean NLL %.6f over %zu tokens (reference 1.6438, "
               "9136)\n", kvq__model_kernel_name(m), nll, n);
        /* the references are given to 4 decimals (+-5e-5); 1e-4 allows as
         * much again for another implementation's summation order (our
         * paths agree with each other to ~1e-6) */
        CHECK_EQ(n, 9136);
        CHECK_NEAR(nll, 1.6438, 1e-4);
        double nls = nll_stories(ms, t, 512, 0, 0, 0, n_stories, &n, NULL, NULL);
        printf("stories260K, f32 cache (scalar): mean NLL %.6f\n", nls);
        CHECK_NEAR(nls, 1.6438, 1e-4);
        double nll2 = nll_stories(m, t, 512, 1, 0, 0, n_stories, &n, NULL, NULL);
        printf("stories260K, f32 cache, pre-RoPE keys: mean NLL %.6f\n", nll2);
        CHECK_NEAR(nll2, nll, 1e-4);
        test_ak42(m);
    }
    kvq_tokenizer_free(t);
    kvq_model_free(m);
    kvq_model_free(ms);
}

/* Largest |a - b| over the logits of the first n tokens of story 0 (one
 * prefill call each). */
static double logit_gap(const kvq_model *a, const kvq_model *b, const kvq_tokenizer *t, size_t n,
                        double *amax) {
    kvq_model_info in;
    kvq_model_get_info(a, &in);
    int32_t tk[4096];
    size_t len;
    CHECK_OK(kvq_tokenizer_encode(t, stories[0], 1, 0, tk, 4096, &len));
    n = n < len ? n : len;
    float *la = malloc(n * in.vocab_size * sizeof(float)), *lb = malloc(n * in.vocab_size * sizeof(float));
    kvq_cache *ca = f32_cache(a, 0), *cb = f32_cache(b, 0);
    CHECK_OK(kvq_model_forward(a, ca, tk, n, 0, la, n * in.vocab_size, 0));
    CHECK_OK(kvq_model_forward(b, cb, tk, n, 0, lb, n * in.vocab_size, 0));
    double gap = 0;
    *amax = 0;
    for (size_t i = 0; i < n * in.vocab_size; i++) {
        gap = fmax(gap, fabs((double)la[i] - lb[i]));
        *amax = fmax(*amax, fabs((double)lb[i]));
    }
    kvq_cache_free(ca);
    kvq_cache_free(cb);
    free(la);
    free(lb);
    return gap;
}

static void test_stories15m(void) {
    char mp[1024], tp[1024];
    snprintf(mp, sizeof mp, "%s/stories15M/stories15M.bin", tu_data_dir());
    snprintf(tp, sizeof tp, "%s/stories15M/tokenizer.bin", tu_data_dir());
    kvq_model *m = NULL, *ms = NULL;
    kvq_tokenizer *t = NULL;
    CHECK_OK(kvq_model_load(&m, mp, NULL));
    CHECK_OK(kvq__model_load_isa(&ms, mp, NULL, KVQ_ISA_SCALAR));
    if (m)
        CHECK_OK(kvq_tokenizer_load(&t, tp, 32000, NULL));
    if (!m || !ms || !t)
        goto done;
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    CHECK(in.dim == 288 && in.hidden_dim == 768 && in.n_layers == 6 && in.n_heads == 6 &&
          in.n_kv_heads == 6 && in.head_dim == 48 && in.vocab_size == 32000 && in.seq_len == 256 &&
          in.shared_classifier);
    test_greedy(m, t,
                "Once upon a time, there was a little girl named Lily. She loved to play outside "
                "in the sunshine. One day, she saw a big, red ball in the sky. It was the sun! She "
                "thought it was so pretty.",
                120);
    /* The SIMD and the scalar products differ in summation order only: each
     * output is within (n + 1) u S of exact (see test_matmul_paths), about
     * 5e-5 of S at n = 768 in the worst case and ~sqrt(n) u ~ 2e-6 of S
     * typically. Through the ~40 products behind a logit (|l| < 30) that is
     * ~1e-5 typically and a few 1e-2 at worst; 1e-3 lies between the two and
     * far below the O(1) that a wrong tile, tail or token block gives. */
    double amax, gap = logit_gap(m, ms, t, TM_SANITIZED ? 16 : 64, &amax);
    printf("stories15M: %s vs scalar product, largest logit gap %.3g (largest |logit| %.3g)\n",
           kvq__model_kernel_name(m), gap, amax);
    CHECK_LE(gap, 1e-3);
    size_t n, n2;
    double tp_s, td_s;
    int full = !TM_SANITIZED && strcmp(kvq__model_kernel_name(m), "scalar") != 0;
    size_t count = full ? n_stories : 2;
    double *times = malloc(count * 256 * sizeof(double));
    double pre = nll_stories(m, t, 256, 0, 0, 0, count, &n, &tp_s, NULL);
    double dec = nll_stories(m, t, 256, 0, 1, 0, count, &n2, &td_s, times);
    printf("stories15M, f32 cache, %zu stories: mean NLL %.6f (prefill, %.2f s), %.6f (decode, one "
           "call per token, %.2f s) over %zu tokens%s\n",
           count, pre, tp_s, dec, td_s, n, full ? " (reference 1.6344, 4453)" : "");
    CHECK_EQ(n, n2);
    /* a logit gap of g moves each token's NLL by at most 2g: the 1e-3 gap
     * bound above allows 2e-3; decode and prefill differ in summation order
     * only (one-token tiles against blocked tiles). */
    CHECK_NEAR(dec, pre, 2e-3);
    if (full) {
        CHECK_EQ(n, 4453);
        CHECK_NEAR(pre, 1.6344, 1e-4); /* as for stories260K */
        CHECK_NEAR(dec, 1.6344, 1e-4);
        print_decode_speed(m, times, n2);
    }
    free(times);
    size_t len0 = TM_SANITIZED ? 64 : 256;
    double rope = nll_stories(m, t, len0, 1, 0, 0, 1, &n, NULL, NULL);
    double ref0 = nll_stories(m, t, len0, 0, 0, 0, 1, &n, NULL, NULL);
    printf("stories15M, story 0 (%zu tokens): mean NLL %.6f, with pre-RoPE keys %.6f\n", n, ref0,
           rope);
    CHECK_NEAR(rope, ref0, 2e-3);
done:
    kvq_tokenizer_free(t);
    kvq_model_free(m);
    kvq_model_free(ms);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_corrupt_files(); /* needs no data */
    snprintf(text_path, sizeof text_path, "%s/text/tinystories-valid-sample.txt", tu_data_dir());
    char p15[1024], p260[1024];
    snprintf(p260, sizeof p260, "%s/stories260K/stories260K.bin", tu_data_dir());
    snprintf(p15, sizeof p15, "%s/stories15M/stories15M.bin", tu_data_dir());
    if (access(p260, R_OK) != 0 || access(p15, R_OK) != 0 || load_stories() != 0) {
        fprintf(stderr, "FAIL: the model data is missing under %s (pass --data DIR)\n", tu_data_dir());
        tu_fail++;
        return tu_finish();
    }
    test_matmul_paths();
    test_stories260k();
    test_stories15m();
    for (size_t i = 0; i < n_stories; i++)
        free(stories[i]);
    free(stories);
    return tu_finish();
}
