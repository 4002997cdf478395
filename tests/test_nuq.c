/*
 * test_nuq.c - tests of the nuq1..nuq8 codecs: sizes and the not-fitted
 * errors, the quality of the Lloyd-Max fit (Gaussian optimum, centroid and
 * nearest-level properties, channels with few distinct values), nuq3 against
 * int4 on keys with outlier channels, the state blob and calibration file
 * (round trip, corrupt blobs rejected with the codec unchanged, allocation
 * failures), and the AVX2 kernels against the scalar reference (bit for bit)
 * at odd sizes on misaligned buffers.
 */
#include "testutil.h"

#include <unistd.h>

static kvq_codec *mk(const char *spec, size_t d, kvq_isa isa) {
    kvq_codec_params p = {0};
    char err[256] = "";
    p.isa = isa;
    p.err_msg = err;
    p.err_msg_size = sizeof err;
    kvq_codec *c = NULL;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu isa=%d: %s (%s)", spec, d, (int)isa, kvq_strerror(st),
              err);
    return c;
}

/* The fitted levels of c (d * L floats, malloc'd) read back from its state
 * blob: payload at 4+4+4+4+spec_len+8. */
static float *levels_of(const kvq_codec *c, size_t *count) {
    size_t size = 0;
    if (kvq_codec_save_state(c, NULL, 0, &size) != KVQ_OK)
        return NULL;
    uint8_t *blob = (uint8_t *)malloc(size);
    if (kvq_codec_save_state(c, blob, size, &size) != KVQ_OK) {
        free(blob);
        return NULL;
    }
    uint32_t slen;
    memcpy(&slen, blob + 12, 4);
    uint64_t plen;
    memcpy(&plen, blob + 16 + slen, 8);
    float *lev = (float *)malloc(plen + 4);
    memcpy(lev, blob + 24 + slen, plen);
    *count = (size_t)plen / 4;
    free(blob);
    return lev;
}

static double nmse_of(const kvq_codec *c, const float *x, size_t n) {
    size_t d = kvq_codec_head_dim(c), vb = kvq_codec_vector_bytes(c);
    uint8_t *enc = (uint8_t *)malloc(n * vb + 1);
    float *y = (float *)malloc(n * d * sizeof(float));
    double num = 0, den = 0;
    if (kvq_codec_encode(c, enc, n * vb, x, n) != KVQ_OK ||
        kvq_codec_decode(c, y, n * d, enc, n * vb) != KVQ_OK) {
        num = INFINITY;
        den = 1;
    } else {
        for (size_t i = 0; i < n * d; i++) {
            double e = (double)x[i] - y[i];
            num += e * e;
            den += (double)x[i] * x[i];
        }
    }
    free(enc);
    free(y);
    return num / den;
}

/* Gaussian data with per-channel standard deviations sig[t]. */
static float *gauss_data(tu_rng *r, size_t n, size_t d, const float *sig) {
    float *x = (float *)malloc(n * d * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        for (size_t t = 0; t < d; t++)
            x[i * d + t] = (float)tu_gauss(r) * (sig ? sig[t] : 1.0f);
    return x;
}

/* The index nuq must give x among the levels l[0..L): the nearest level,
 * the lower one when two are equally near (nuq.c: "the lower one on an
 * exact tie"). Differences of floats of one channel are exact in double. */
static size_t nearest_level(const float *l, size_t L, float x) {
    size_t best = 0;
    for (size_t k = 1; k < L; k++)
        if (fabs((double)x - l[k]) < fabs((double)x - l[best]))
            best = k;
    return best;
}

/* Fits nuq<b> at head_dim d on Gaussian data of a different scale per
 * channel (many distinct values, so 2^b distinct levels), then encodes
 * probes around every midpoint m of adjacent levels: the float nearest m
 * (m itself when it is a float: a tie), the floats one and two steps either
 * side of it, the points a quarter of the gap away, and the levels
 * themselves; each must decode to its nearest level. A threshold off by one
 * float, or a tie sent up, puts some probe on the wrong side. */
static void check_boundaries(int b, size_t d, kvq_isa isa) {
    const size_t L = (size_t)1 << b, n = 2 * L + 64;
    char spec[16];
    snprintf(spec, sizeof spec, "nuq%d", b);
    kvq_codec *c = mk(spec, d, isa);
    if (!c)
        return;
    tu_rng r;
    tu_seed(&r, 1000 + (uint64_t)b * 7919 + d);
    float *sig = (float *)malloc(d * sizeof(float));
    for (size_t t = 0; t < d; t++)
        sig[t] = ldexpf(1.0f, (int)(t % 13) - 6); /* 2^-6 .. 2^6 */
    float *train = gauss_data(&r, n, d, sig);
    CHECK_OK(kvq_codec_fit(c, train, n));
    size_t cnt = 0;
    float *lev = levels_of(c, &cnt);
    const size_t np = 7 * (L - 1) + L; /* probe vectors */
    float *x = (float *)malloc(np * d * sizeof(float)), *y = (float *)malloc(np * d * sizeof(float));
    size_t vb = kvq_codec_vector_bytes(c);
    uint8_t *enc = (uint8_t *)malloc(np * vb);
    size_t distinct_bad = 0, wrong = 0, ties = 0;
    if (!lev || cnt != d * L || !x || !y || !enc) {
        TU_REPORT(0, "%s d=%zu: no levels (%zu)", spec, d, cnt);
        goto done;
    }
    for (size_t t = 0; t < d; t++) {
        const float *l = lev + t * L;
        for (size_t k = 0; k + 1 < L; k++)
            distinct_bad += !(l[k] < l[k + 1]);
        size_t j = 0;
        for (size_t k = 0; k + 1 < L; k++) {
            double m = 0.5 * l[k] + 0.5 * (double)l[k + 1]; /* exact in double */
            float f = (float)m;
            ties += (double)f == m;
            float below = nextafterf(f, -INFINITY), above = nextafterf(f, INFINITY);
            float p[7] = {f,
                          below,
                          above,
                          nextafterf(below, -INFINITY),
                          nextafterf(above, INFINITY),
                          (float)(0.75 * l[k] + 0.25 * (double)l[k + 1]),
                          (float)(0.25 * l[k] + 0.75 * (double)l[k + 1])};
            for (int i = 0; i < 7; i++)
                x[(j++) * d + t] = p[i];
        }
        for (size_t k = 0; k < L; k++)
            x[(j++) * d + t] = l[k];
    }
    CHECK_OK(kvq_codec_encode(c, enc, np * vb, x, np));
    CHECK_OK(kvq_codec_decode(c, y, np * d, enc, np * vb));
    for (size_t i = 0; i < np * d; i++) {
        const float *l = lev + (i % d) * L;
        float want = l[nearest_level(l, L, x[i])];
        if (memcmp(&y[i], &want, sizeof want) != 0 && wrong++ < 3)
            fprintf(stderr, "%s d=%zu isa %s: channel %zu: %.9g decodes to %.9g, nearest level "
                            "%.9g\n", spec, d, kvq_isa_name(isa), i % d, (double)x[i],
                    (double)y[i], (double)want);
    }
    TU_REPORT(distinct_bad == 0, "%s d=%zu: %zu adjacent levels not increasing", spec, d,
              distinct_bad);
    TU_REPORT(wrong == 0, "%s d=%zu isa %s: %zu of %zu probes not at their nearest level", spec, d,
              kvq_isa_name(isa), wrong, np * d);
    /* the exact ties are exercised, not just possible */
    TU_REPORT(ties > 0, "%s d=%zu: no midpoint is a float", spec, d);
done:
    free(lev);
    free(x);
    free(y);
    free(enc);
    free(train);
    free(sig);
    kvq_codec_free(c);
}

/* ---- sizes and errors before fit ---- */
static void test_basic(void) {
    static const size_t dims[] = {1, 7, 8, 80, 128, 1024};
    for (int b = 1; b <= 8; b++) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t d = dims[di];
            char spec[16];
            snprintf(spec, sizeof spec, "nuq%d", b);
            kvq_codec *c = mk(spec, d, KVQ_ISA_AUTO);
            if (!c)
                continue;
            CHECK_EQ(kvq_codec_vector_bytes(c), (d * (size_t)b + 7) / 8);
            CHECK_EQ(kvq_codec_state_bytes(c), d * ((size_t)1 << b) * 4);
            CHECK(strcmp(kvq_codec_spec(c), spec) == 0);
            CHECK_EQ(kvq_codec_needs_fit(c), 1);
            float x[1024] = {0}, out[1024] = {0};
            uint8_t enc[1024] = {0};
            size_t vb = kvq_codec_vector_bytes(c), sz = 0;
            CHECK_STATUS(kvq_codec_encode(c, enc, sizeof enc, x, 1), KVQ_ERR_NOT_FITTED);
            CHECK_STATUS(kvq_codec_decode(c, out, 1024, enc, vb), KVQ_ERR_NOT_FITTED);
            CHECK_STATUS(kvq_codec_score(c, out, 1024, x, 1, enc, vb), KVQ_ERR_NOT_FITTED);
            CHECK_STATUS(kvq_codec_accumulate(c, out, 1024, x, 1, enc, vb), KVQ_ERR_NOT_FITTED);
            CHECK_STATUS(kvq_codec_save_state(c, NULL, 0, &sz), KVQ_ERR_NOT_FITTED);
            x[0] = NAN;
            CHECK_STATUS(kvq_codec_fit(c, x, 1), KVQ_ERR_NONFINITE);
            CHECK_EQ(kvq_codec_needs_fit(c), 1);
            x[0] = 1.0f;
            CHECK_OK(kvq_codec_fit(c, x, 1));
            CHECK_EQ(kvq_codec_needs_fit(c), 0);
            /* one sample: every level is that sample, reconstruction exact */
            CHECK_OK(kvq_codec_encode(c, enc, sizeof enc, x, 1));
            CHECK_OK(kvq_codec_decode(c, out, 1024, enc, vb));
            CHECK(memcmp(out, x, d * sizeof(float)) == 0);
            kvq_codec_free(c);
            /* many distinct values: distinct levels, and every value goes to
             * its nearest level, at and around each midpoint */
            check_boundaries(b, d, KVQ_ISA_SCALAR);
            if (kvq_cpu_supports(KVQ_ISA_AVX2))
                check_boundaries(b, d, KVQ_ISA_AUTO);
        }
    }
    kvq_codec *c = NULL;
    CHECK_STATUS(kvq_codec_create(&c, "nuq9", 64, NULL), KVQ_ERR_UNKNOWN_CODEC);
    CHECK_STATUS(kvq_codec_create(&c, "nuq0", 64, NULL), KVQ_ERR_UNKNOWN_CODEC);
    CHECK_STATUS(kvq_codec_create(&c, "nuq3:g=8", 64, NULL), KVQ_ERR_BAD_OPTION);
}

/* ---- fit quality ---- */

/* Lloyd-Max mean squared error of N(0,1) with 2, 4, 8, 16 levels. */
static const double kvq_lloyd_gauss[5] = {1.0, 0.3634, 0.1175, 0.03454, 0.009497};

static void test_fit_gauss(void) {
    tu_rng r;
    tu_seed(&r, 11);
    const size_t d = 16, n = 20000;
    float sig[16];
    for (size_t t = 0; t < d; t++)
        sig[t] = 0.01f * (float)(1 << (t % 12)); /* scales 0.01 .. 20 */
    float *train = gauss_data(&r, n, d, sig), *test = gauss_data(&r, n, d, sig);
    double prev = 1.0;
    for (int b = 1; b <= 8; b++) {
        char spec[16];
        snprintf(spec, sizeof spec, "nuq%d", b);
        kvq_codec *c = mk(spec, d, KVQ_ISA_AUTO);
        if (!c)
            continue;
        CHECK_OK(kvq_codec_fit(c, train, n));
        double e = nmse_of(c, test, n);
        printf("  %s gaussian held-out nmse %.6f", spec, e);
        if (b <= 4) {
            printf(" (Lloyd-Max optimum %.6f)", kvq_lloyd_gauss[b]);
            /* sampling: a little above the optimum, never far */
            CHECK_LE(e, kvq_lloyd_gauss[b] * 1.05);
            CHECK_LE(kvq_lloyd_gauss[b] * 0.95, e);
        }
        printf("\n");
        /* each bit cuts the error (less so at high b, where 20000 samples
         * limit how well the tails are placed) */
        CHECK_LE(e, prev * (b <= 5 ? 0.5 : 0.75));
        prev = e;
        /* levels sorted per channel */
        size_t m = 0;
        float *lev = levels_of(c, &m);
        size_t L = (size_t)1 << b;
        CHECK_EQ(m, d * L);
        int sorted = lev != NULL;
        for (size_t i = 0; lev && i < m; i++)
            if (i % L && lev[i] < lev[i - 1])
                sorted = 0;
        CHECK(sorted);
        free(lev);
        /* deterministic: fitting again gives the same blob */
        kvq_codec *c2 = mk(spec, d, KVQ_ISA_SCALAR);
        if (c2) {
            CHECK_OK(kvq_codec_fit(c2, train, n));
            size_t m2 = 0;
            float *l1 = levels_of(c, &m), *l2 = levels_of(c2, &m2);
            CHECK(l1 && l2 && m == m2 && memcmp(l1, l2, m * 4) == 0);
            free(l1);
            free(l2);
            kvq_codec_free(c2);
        }
        kvq_codec_free(c);
    }
    free(train);
    free(test);
}

/* After the fit each level is the mean of the training values that encode to
 * it, and every value decodes to its nearest level (the lower on a tie). */
static void test_fit_properties(void) {
    tu_rng r;
    tu_seed(&r, 12);
    const size_t d = 8, n = 3000;
    for (int b = 1; b <= 4; b++) {
        char spec[16];
        snprintf(spec, sizeof spec, "nuq%d", b);
        float *x = gauss_data(&r, n, d, NULL);
        for (size_t i = 0; i < n; i++) /* skewed channel */
            x[i * d + 1] = x[i * d + 1] * x[i * d + 1];
        kvq_codec *c = mk(spec, d, KVQ_ISA_SCALAR);
        if (!c) {
            free(x);
            continue;
        }
        CHECK_OK(kvq_codec_fit(c, x, n));
        size_t L = (size_t)1 << b, m = 0, vb = kvq_codec_vector_bytes(c);
        float *lev = levels_of(c, &m);
        uint8_t *enc = (uint8_t *)malloc(n * vb);
        float *y = (float *)malloc(n * d * sizeof(float));
        CHECK_OK(kvq_codec_encode(c, enc, n * vb, x, n));
        CHECK_OK(kvq_codec_decode(c, y, n * d, enc, n * vb));
        int centroid_ok = 1, nearest_ok = 1;
        for (size_t t = 0; t < d; t++) {
            const float *l = lev + t * L;
            for (size_t k = 0; k < L; k++) {
                double s = 0, cnt = 0;
                for (size_t i = 0; i < n; i++)
                    if (y[i * d + t] == l[k]) {
                        s += x[i * d + t];
                        cnt++;
                    }
                if (cnt > 0 && fabs(s / cnt - l[k]) > 1e-5 * (1 + fabs(l[k])))
                    centroid_ok = 0;
            }
            for (size_t i = 0; i < n; i++) {
                float v = x[i * d + t], best = l[0];
                for (size_t k = 1; k < L; k++)
                    if (fabsf(v - l[k]) < fabsf(v - best))
                        best = l[k];
                if (fabsf(v - y[i * d + t]) > fabsf(v - best) * (1 + 1e-6f) + 1e-30f)
                    nearest_ok = 0;
            }
        }
        CHECK(centroid_ok);
        CHECK(nearest_ok);
        /* the float nearest the midpoint goes down when it is the midpoint
         * (a tie) or below it, up when above; the next float up goes up */
        float v[8], out[8];
        uint8_t e1[8];
        for (size_t k = 0; k + 1 < L; k++) {
            int up[8];
            for (size_t t = 0; t < d; t++) {
                const float *l = lev + t * L;
                double mid = 0.5 * l[k] + 0.5 * (double)l[k + 1]; /* exact */
                v[t] = (float)mid;
                up[t] = (double)v[t] > mid;
            }
            CHECK_OK(kvq_codec_encode(c, e1, sizeof e1, v, 1));
            CHECK_OK(kvq_codec_decode(c, out, 8, e1, vb));
            int tie_ok = 1;
            for (size_t t = 0; t < d; t++)
                if (lev[t * L + k] != lev[t * L + k + 1] && out[t] != lev[t * L + k + up[t]])
                    tie_ok = 0;
            CHECK(tie_ok);
            for (size_t t = 0; t < d; t++)
                v[t] = nextafterf(v[t], INFINITY);
            CHECK_OK(kvq_codec_encode(c, e1, sizeof e1, v, 1));
            CHECK_OK(kvq_codec_decode(c, out, 8, e1, vb));
            int up_ok = 1;
            for (size_t t = 0; t < d; t++)
                if (lev[t * L + k] != lev[t * L + k + 1] && out[t] != lev[t * L + k + 1])
                    up_ok = 0;
            CHECK(up_ok);
        }
        free(lev);
        free(enc);
        free(y);
        free(x);
        kvq_codec_free(c);
    }
}

/* Channels with fewer distinct values than levels are reproduced exactly. */
static void test_few_distinct(void) {
    tu_rng r;
    tu_seed(&r, 13);
    const size_t d = 5, n = 500;
    float *x = (float *)malloc(n * d * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        x[i * d + 0] = 3.5f;                             /* constant */
        x[i * d + 1] = (tu_next(&r) & 1) ? -1.0f : 2.0f; /* two values */
        x[i * d + 2] = (float)(tu_next(&r) % 8) - 3.0f;  /* eight values */
        x[i * d + 3] = (tu_next(&r) & 1) ? -0.0f : 0.0f; /* signed zeros */
        x[i * d + 4] = (float)tu_gauss(&r);              /* many */
    }
    for (int b = 1; b <= 8; b++) {
        char spec[16];
        snprintf(spec, sizeof spec, "nuq%d", b);
        kvq_codec *c = mk(spec, d, KVQ_ISA_AUTO);
        if (!c)
            continue;
        CHECK_OK(kvq_codec_fit(c, x, n));
        size_t vb = kvq_codec_vector_bytes(c);
        uint8_t *enc = (uint8_t *)malloc(n * vb);
        float *y = (float *)malloc(n * d * sizeof(float));
        CHECK_OK(kvq_codec_encode(c, enc, n * vb, x, n));
        CHECK_OK(kvq_codec_decode(c, y, n * d, enc, n * vb));
        int ok0 = 1, ok1 = 1, ok2 = 1, ok3 = 1;
        for (size_t i = 0; i < n; i++) {
            ok0 &= y[i * d + 0] == x[i * d + 0];
            ok1 &= y[i * d + 1] == x[i * d + 1];
            if (b >= 3)
                ok2 &= y[i * d + 2] == x[i * d + 2];
            ok3 &= y[i * d + 3] == 0.0f;
        }
        CHECK(ok0);
        CHECK(ok1);
        CHECK(ok2);
        CHECK(ok3);
        free(enc);
        free(y);
        kvq_codec_free(c);
    }
    free(x);
}

/* ---- nuq3 against int4 per vector on keys with outlier channels ---- */

/* int4 per vector as documented in kvq.h (asymmetric, fp16 scale and min,
 * 16 levels), computed here when the int4 codec is not available. */
static double int4_sim_nmse(const float *x, size_t n, size_t d) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const float *v = x + i * d;
        float lo = v[0], hi = v[0];
        for (size_t t = 1; t < d; t++) {
            lo = fminf(lo, v[t]);
            hi = fmaxf(hi, v[t]);
        }
        float mn = kvq_f16_to_f32(kvq_f32_to_f16(lo));
        float sc = kvq_f16_to_f32(kvq_f32_to_f16((hi - lo) / 15.0f));
        for (size_t t = 0; t < d; t++) {
            float q = sc > 0 ? roundf((v[t] - mn) / sc) : 0.0f;
            q = fminf(fmaxf(q, 0.0f), 15.0f);
            double e = (double)v[t] - (mn + q * sc);
            num += e * e;
            den += (double)v[t] * v[t];
        }
    }
    return num / den;
}

static void test_outlier_vs_int4(void) {
    tu_rng r;
    tu_seed(&r, 14);
    const size_t d = 128, ntr = 8192, nte = 4096;
    float sig[128];
    for (size_t t = 0; t < d; t++)
        sig[t] = 1.0f;
    sig[3] = sig[40] = sig[77] = sig[120] = 20.0f;
    float *train = gauss_data(&r, ntr, d, sig), *test = gauss_data(&r, nte, d, sig);
    kvq_codec *c = mk("nuq3", d, KVQ_ISA_AUTO);
    if (c) {
        CHECK_OK(kvq_codec_fit(c, train, ntr));
        double e3 = nmse_of(c, test, nte), e4;
        kvq_codec *i4 = NULL;
        const char *how = "int4 codec";
        if (kvq_codec_create(&i4, "int4", d, NULL) == KVQ_OK) {
            e4 = nmse_of(i4, test, nte);
            CHECK_LE(kvq_codec_bits_per_value(c), kvq_codec_bits_per_value(i4));
            kvq_codec_free(i4);
        } else {
            how = "int4 simulated in the test (codec not available)";
            e4 = int4_sim_nmse(test, nte, d);
        }
        printf("  outlier keys d=128: nuq3 nmse %.5f (3.00 bits) vs int4 nmse %.5f [%s]\n", e3, e4,
               how);
        /* per-vector int4 spends its 16 levels on the outliers' range */
        CHECK_LE(e3, e4 * 0.8);
        kvq_codec_free(c);
    }
    free(train);
    free(test);
}

/* ---- state blob and file ---- */

static int same_encoding(const kvq_codec *a, const kvq_codec *b, const float *x, size_t n) {
    size_t vb = kvq_codec_vector_bytes(a);
    uint8_t *ea = (uint8_t *)malloc(n * vb), *eb = (uint8_t *)malloc(n * vb);
    int ok = kvq_codec_encode(a, ea, n * vb, x, n) == KVQ_OK &&
             kvq_codec_encode(b, eb, n * vb, x, n) == KVQ_OK && memcmp(ea, eb, n * vb) == 0;
    free(ea);
    free(eb);
    return ok;
}

static uint8_t *blob_of(const kvq_codec *c, size_t *size) {
    *size = 0;
    if (kvq_codec_save_state(c, NULL, 0, size) != KVQ_OK)
        return NULL;
    uint8_t *b = (uint8_t *)malloc(*size);
    size_t w = 0;
    CHECK_STATUS(kvq_codec_save_state(c, b, *size - 1, &w), KVQ_ERR_DST_TOO_SMALL);
    CHECK_OK(kvq_codec_save_state(c, b, *size, &w));
    CHECK_EQ(w, *size);
    return b;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void reseal(uint8_t *b, size_t size) { put32(b + size - 4, kvq_crc32c(0, b, size - 4)); }

static void test_state(void) {
    tu_rng r;
    tu_seed(&r, 15);
    const size_t d = 96, n = 2000;
    float *x = gauss_data(&r, n, d, NULL), *x2 = gauss_data(&r, n, d, NULL);
    for (size_t i = 0; i < n * d; i++)
        x2[i] *= 3.0f;
    kvq_codec *a = mk("nuq4", d, KVQ_ISA_AUTO), *u = mk("nuq4", d, KVQ_ISA_AUTO),
              *f = mk("nuq4", d, KVQ_ISA_AUTO);
    if (!a || !u || !f)
        goto out;
    CHECK_OK(kvq_codec_fit(a, x, n));
    CHECK_OK(kvq_codec_fit(f, x2, n));
    size_t size = 0;
    uint8_t *blob = blob_of(a, &size);
    size_t slen = strlen("nuq4"), poff = 24 + slen, L = 16;
    CHECK_EQ(size, 28 + slen + d * L * 4);
    /* a copy of f to compare against after failed loads */
    kvq_codec *f0 = mk("nuq4", d, KVQ_ISA_AUTO);
    size_t fsize = 0;
    uint8_t *fblob = blob_of(f, &fsize);
    CHECK_OK(kvq_codec_load_state(f0, fblob, fsize));

    /* corrupt blobs: rejected, both codecs unchanged */
    uint8_t *bad = (uint8_t *)malloc(size + 8);
    struct {
        const char *what;
        kvq_status want;
    } cases[] = {
        {"truncated", KVQ_ERR_CORRUPT}, {"bit flip", KVQ_ERR_CORRUPT},
        {"NaN level", KVQ_ERR_CORRUPT}, {"Inf level", KVQ_ERR_CORRUPT},
        {"unsorted", KVQ_ERR_CORRUPT},  {"short payload", KVQ_ERR_CORRUPT},
        {"bad magic", KVQ_ERR_CORRUPT}, {"other spec", KVQ_ERR_MISMATCH},
        {"huge level ok", KVQ_OK},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        memcpy(bad, blob, size);
        size_t bs = size;
        float nanf_ = NAN, inff = INFINITY;
        switch (ci) {
        case 0:
            bs = size - 1;
            break;
        case 1:
            bad[poff + 17] ^= 0x10;
            break;
        case 2:
            memcpy(bad + poff + 4 * 37, &nanf_, 4);
            reseal(bad, bs);
            break;
        case 3:
            memcpy(bad + poff + 4 * (5 * L + 15), &inff, 4);
            reseal(bad, bs);
            break;
        case 4: { /* swap levels 3 and 4 of channel 7 */
            uint8_t tmp[4];
            uint8_t *p3 = bad + poff + 4 * (7 * L + 3);
            memcpy(tmp, p3, 4);
            memcpy(p3, p3 + 4, 4);
            memcpy(p3 + 4, tmp, 4);
            reseal(bad, bs);
            break;
        }
        case 5: /* drop the last level, keep the header consistent */
            bs = size - 4;
            put32(bad + 16 + slen, (uint32_t)(d * L * 4 - 4));
            memmove(bad + bs - 4, bad + size - 4, 4);
            reseal(bad, bs);
            break;
        case 6:
            bad[0] = 'X';
            reseal(bad, bs);
            break;
        case 7: /* nuq3 spec in a nuq4 codec */
            bad[16 + 3] = '3';
            reseal(bad, bs);
            break;
        case 8: { /* the top level of channel 0 raised to FLT_MAX: valid */
            float big = 3.4028235e38f;
            memcpy(bad + poff + 4 * (L - 1), &big, 4);
            reseal(bad, bs);
            break;
        }
        }
        kvq_status su = kvq_codec_load_state(u, bad, bs);
        TU_REPORT(su == cases[ci].want, "%s: load into unfitted gave %s", cases[ci].what,
                  kvq_strerror(su));
        if (cases[ci].want != KVQ_OK) {
            CHECK_EQ(kvq_codec_needs_fit(u), 1);
            kvq_status sf = kvq_codec_load_state(f, bad, bs);
            TU_REPORT(sf == cases[ci].want, "%s: load into fitted gave %s", cases[ci].what,
                      kvq_strerror(sf));
            TU_REPORT(same_encoding(f, f0, x, 64), "%s: fitted codec changed", cases[ci].what);
        } else {
            /* FLT_MAX level: midpoint has no overflow, encode/decode work */
            float big = 3.4028235e38f, v[96] = {0}, out[96];
            v[0] = big;
            uint8_t e[96];
            CHECK_OK(kvq_codec_encode(u, e, sizeof e, v, 1));
            CHECK_OK(kvq_codec_decode(u, out, 96, e, kvq_codec_vector_bytes(u)));
            CHECK(out[0] == big);
        }
    }
    free(bad);

    /* round trip in memory */
    kvq_codec *b2 = mk("nuq4", d, KVQ_ISA_SCALAR);
    CHECK_OK(kvq_codec_load_state(b2, blob, size));
    CHECK_EQ(kvq_codec_needs_fit(b2), 0);
    CHECK(same_encoding(a, b2, x2, n));
    size_t size2 = 0;
    uint8_t *blob2 = blob_of(b2, &size2);
    CHECK(size2 == size && memcmp(blob, blob2, size) == 0);
    free(blob2);
    /* loading into a fitted codec replaces its tables */
    CHECK_OK(kvq_codec_load_state(f, blob, size));
    CHECK(same_encoding(a, f, x2, n));
    kvq_codec_free(b2);

    /* mismatched codecs */
    kvq_codec *o1 = mk("nuq4", d + 8, KVQ_ISA_AUTO), *o2 = mk("nuq3", d, KVQ_ISA_AUTO);
    CHECK_STATUS(kvq_codec_load_state(o1, blob, size), KVQ_ERR_MISMATCH);
    CHECK_STATUS(kvq_codec_load_state(o2, blob, size), KVQ_ERR_MISMATCH);
    CHECK_EQ(kvq_codec_needs_fit(o1), 1);
    CHECK_EQ(kvq_codec_needs_fit(o2), 1);
    kvq_codec_free(o1);
    kvq_codec_free(o2);

    /* calibration file */
    char path[] = "/tmp/kvq_test_nuq_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        close(fd);
        CHECK_OK(kvq_codec_save_file(a, path));
        kvq_codec *b3 = mk("nuq4", d, KVQ_ISA_AUTO);
        CHECK_OK(kvq_codec_load_file(b3, path));
        CHECK(same_encoding(a, b3, x2, n));
        kvq_codec_free(b3);
        /* a corrupted file is rejected */
        FILE *fp = fopen(path, "r+b");
        if (fp) {
            fseek(fp, (long)(poff + 100), SEEK_SET);
            fputc(0x5a, fp);
            fclose(fp);
        }
        kvq_codec *b4 = mk("nuq4", d, KVQ_ISA_AUTO);
        CHECK_STATUS(kvq_codec_load_file(b4, path), KVQ_ERR_CORRUPT);
        CHECK_EQ(kvq_codec_needs_fit(b4), 1);
        unlink(path);
        CHECK_STATUS(kvq_codec_load_file(b4, path), KVQ_ERR_IO);
        kvq_codec_free(b4);
    }
    kvq_codec_free(f0);
    free(fblob);
    free(blob);
out:
    kvq_codec_free(a);
    kvq_codec_free(u);
    kvq_codec_free(f);
    free(x);
    free(x2);
}

/* Allocation failures in create and fit leave nothing behind and the codec
 * unchanged. */
static void test_nomem(void) {
    tu_rng r;
    tu_seed(&r, 16);
    const size_t d = 24, n = 300;
    float *x = gauss_data(&r, n, d, NULL);
    for (long k = 1; k <= 2; k++) {
        tu_failalloc fa;
        kvq_allocator al = tu_failalloc_make(&fa, k);
        kvq_codec_params p = {0};
        p.allocator = &al;
        kvq_codec *c = NULL;
        CHECK_STATUS(kvq_codec_create(&c, "nuq2", d, &p), KVQ_ERR_NOMEM);
        CHECK(c == NULL);
        CHECK_EQ(fa.live_blocks, 0);
    }
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    kvq_codec_params p = {0};
    p.allocator = &al;
    kvq_codec *c = NULL;
    CHECK_OK(kvq_codec_create(&c, "nuq2", d, &p));
    long live = fa.live_blocks;
    int failures = 0;
    for (long k = 1; k <= 20; k++) {
        fa.fail_at = fa.calls + k;
        kvq_status st = kvq_codec_fit(c, x, n);
        CHECK_EQ(fa.live_blocks, live);
        if (st == KVQ_OK)
            break;
        CHECK_STATUS(st, KVQ_ERR_NOMEM);
        CHECK_EQ(kvq_codec_needs_fit(c), 1);
        failures++;
    }
    CHECK(failures > 0);
    CHECK_EQ(kvq_codec_needs_fit(c), 0);
    /* a failed refit keeps the fitted tables */
    kvq_codec *ref = mk("nuq2", d, KVQ_ISA_AUTO);
    CHECK_OK(kvq_codec_fit(ref, x, n));
    float *x2 = gauss_data(&r, n, d, NULL);
    fa.fail_at = fa.calls + 2;
    CHECK_STATUS(kvq_codec_fit(c, x2, n), KVQ_ERR_NOMEM);
    CHECK(same_encoding(c, ref, x2, n));
    fa.fail_at = 0;
    kvq_codec_free(ref);
    kvq_codec_free(c);
    CHECK_EQ(fa.live_blocks, 0);
    free(x);
    free(x2);
}

/* ---- AVX2 against the scalar reference ---- */

/* <q, decoded key> in double, and the error the float LUT sum may have. */
static void check_scores(const float *sc, const float *q, size_t nq, const float *dec, size_t n,
                         size_t d) {
    int ok = 1;
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (size_t t = 0; t < d; t++) {
                s += (double)q[i * d + t] * dec[j * d + t];
                mag += fabs((double)q[i * d + t] * dec[j * d + t]);
            }
            if (fabs(sc[i * n + j] - s) > 1e-6 * (double)(d + 2) * mag + 1e-30)
                ok = 0;
        }
    CHECK(ok);
}

static void test_avx2(void) {
    if (!kvq_cpu_supports(KVQ_ISA_AVX2)) {
        printf("  note: no AVX2 on this CPU, AVX2 equivalence skipped\n");
        return;
    }
    static const size_t dims[] = {1, 7, 8, 16, 24, 40, 64, 80, 96, 128, 256, 1024};
    static const size_t counts[] = {1, 3, 7, 31, 33, 127};
    tu_rng r;
    tu_seed(&r, 17);
    printf("  avx2 vs scalar: seed 17\n");
    for (int b = 1; b <= 8; b++) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t d = dims[di];
            if (d == 1024 && b != 4 && b != 8)
                continue;
            char spec[16];
            snprintf(spec, sizeof spec, "nuq%d", b);
            kvq_codec *cs = mk(spec, d, KVQ_ISA_SCALAR), *cv = mk(spec, d, KVQ_ISA_AVX2);
            if (!cs || !cv) {
                kvq_codec_free(cs);
                kvq_codec_free(cv);
                continue;
            }
            size_t ntr = 200 + (size_t)b * 40;
            float *train = gauss_data(&r, ntr, d, NULL);
            CHECK_OK(kvq_codec_fit(cs, train, ntr));
            size_t bsz = 0;
            uint8_t *blob = blob_of(cs, &bsz);
            CHECK_OK(kvq_codec_load_state(cv, blob, bsz));
            size_t L = (size_t)1 << b, nl = 0;
            float *lev = levels_of(cs, &nl);
            size_t vb = kvq_codec_vector_bytes(cs), nmax = 127;
            /* misaligned: floats shifted by one float, codes by one byte */
            float *xb = (float *)malloc((nmax * d + 1) * sizeof(float));
            float *x = xb + 1;
            float *train2 = gauss_data(&r, nmax, d, NULL);
            memcpy(x, train2, nmax * d * sizeof(float));
            free(train2);
            for (size_t i = 0; i < nmax * d; i += 3) { /* exact ties and out of range */
                size_t t = i % d, k = tu_next(&r) % L;
                if (k + 1 < L)
                    x[i] = 0.5f * lev[t * L + k] + 0.5f * lev[t * L + k + 1];
                if (i % 7 == 0)
                    x[i] = (i & 1) ? 1e6f : -1e6f;
            }
            uint8_t *eb = (uint8_t *)malloc(nmax * vb + 2), *es = eb + 1;
            uint8_t *ev = (uint8_t *)malloc(nmax * vb + 2) + 1;
            float *ds = (float *)malloc((nmax * d + 1) * sizeof(float));
            float *dvb = (float *)malloc((nmax * d + 1) * sizeof(float)), *dv = dvb + 1;
            size_t nqmax = 5;
            float *qb = (float *)malloc((nqmax * d + 1) * sizeof(float)), *q = qb + 1;
            for (size_t i = 0; i < nqmax * d; i++)
                q[i] = (float)tu_gauss(&r);
            float *ss = (float *)malloc(nqmax * nmax * sizeof(float));
            float *sv = (float *)malloc((nqmax * nmax + 1) * sizeof(float)) + 1;
            float *ws = (float *)malloc((3 * nmax + 1) * sizeof(float)) + 1;
            float *as = (float *)malloc(3 * d * sizeof(float));
            float *av = (float *)malloc((3 * d + 1) * sizeof(float)) + 1;
            for (size_t i = 0; i < 3 * nmax; i++)
                ws[i] = (float)tu_gauss(&r);
            int enc_ok = 1, dec_ok = 1, sc_ok = 1, acc_ok = 1;
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t n = counts[ci];
                CHECK_OK(kvq_codec_encode(cs, es, n * vb, x, n));
                CHECK_OK(kvq_codec_encode(cv, ev, n * vb, x, n));
                enc_ok &= memcmp(es, ev, n * vb) == 0;
                CHECK_OK(kvq_codec_decode(cs, ds, n * d, es, n * vb));
                CHECK_OK(kvq_codec_decode(cv, dv, n * d, es, n * vb));
                dec_ok &= memcmp(ds, dv, n * d * sizeof(float)) == 0;
                static const size_t nqs[] = {1, 2, 4, 5};
                for (size_t qi = 0; qi < 4; qi++) {
                    size_t nq = nqs[qi];
                    CHECK_OK(kvq_codec_score(cs, ss, nq * n, q, nq, es, n * vb));
                    CHECK_OK(kvq_codec_score(cv, sv, nq * n, q, nq, es, n * vb));
                    sc_ok &= memcmp(ss, sv, nq * n * sizeof(float)) == 0;
                    if (qi == 3)
                        check_scores(ss, q, nq, ds, n, d);
                }
                for (size_t nq = 1; nq <= 3; nq += 2) {
                    for (size_t t = 0; t < nq * d; t++)
                        as[t] = av[t] = (float)t * 0.25f - 1.0f;
                    CHECK_OK(kvq_codec_accumulate(cs, as, nq * d, ws, nq, es, n * vb));
                    CHECK_OK(kvq_codec_accumulate(cv, av, nq * d, ws, nq, es, n * vb));
                    acc_ok &= memcmp(as, av, nq * d * sizeof(float)) == 0;
                }
                /* accumulate against a double reference on decoded values */
                int accref_ok = 1;
                for (size_t t = 0; t < d; t++) {
                    double s = (double)t * 0.25 - 1.0, mag = fabs(s);
                    for (size_t j = 0; j < n; j++) {
                        s += (double)ws[j] * ds[j * d + t];
                        mag += fabs((double)ws[j] * ds[j * d + t]);
                    }
                    if (fabs(as[t] - s) > 1e-6 * (double)(n + 2) * mag + 1e-30)
                        accref_ok = 0;
                }
                CHECK(accref_ok);
            }
            TU_REPORT(enc_ok, "%s d=%zu: AVX2 encode differs", spec, d);
            TU_REPORT(dec_ok, "%s d=%zu: AVX2 decode differs", spec, d);
            TU_REPORT(sc_ok, "%s d=%zu: AVX2 score differs", spec, d);
            TU_REPORT(acc_ok, "%s d=%zu: AVX2 accumulate differs", spec, d);
            free(ws - 1);
            free(as);
            free(av - 1);
            free(ss);
            free(sv - 1);
            free(qb);
            free(ds);
            free(dvb);
            free(eb);
            free(ev - 1);
            free(xb);
            free(lev);
            free(blob);
            free(train);
            kvq_codec_free(cs);
            kvq_codec_free(cv);
        }
    }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_basic();
    test_fit_gauss();
    test_fit_properties();
    test_few_distinct();
    test_outlier_vs_int4();
    test_state();
    test_nomem();
    test_avx2();
    return tu_finish();
}
