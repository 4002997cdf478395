/*
 * test_int.c - tests of the int8 / int4 / int2 codecs (src/codec/int.c and
 * src/kernels/x86/int_avx2.c).
 *
 * - sizes and bits per value follow the byte layout exactly;
 * - the scalar encoder matches an independent re-statement of the format in
 *   this file byte for byte, and decode reads that layout back;
 * - round-trip error: per value |x - x^| <= s/2 + 2^-11 (|min| + |max|) of
 *   its group (fp16 rounding of m and s), and on N(0,1) data
 *   nmse(int8) <= 1e-4, nmse(int4:g=32) <= 0.01, nmse(int2:g=32) <= 0.17
 *   (groups whose values leave the fp16 range only promise finite output);
 * - the AVX2 path against the scalar reference, on many head_dims, group
 *   sizes, key counts and misaligned buffers: encode and decode bit-exact;
 *   accumulate within (d + 16) * FLT_EPSILON * sum |w v| of a double
 *   reference (as is the scalar path);
 * - score: the scalar path is within (d + 16) * FLT_EPSILON * sum |q| (|k^|
 *   + |m|) of the exact dot product with the decoded key k^. The AVX2 path
 *   quantizes the query to int8 with one scale per 32-value block b
 *   (scale_b = max|q_b|/127, error <= scale_b/2 per value), so the named
 *   bound is
 *       |score_avx2 - <q, k^>| <= sum_b (max|q_b| / 254) sum_{t in b} |k^_t - m_t|
 *                                 (+ the float term above),
 *   which implies |err| <= (sqrt(32)/254) |q| |k^ - m| ~= 0.0223 |q| |k^ - m|
 *   (m_t = the group minimum of t for int4/int2, 0 for int8);
 * - zero vectors and vectors of magnitude 1e30 stay finite everywhere.
 */
#include "testutil.h"

#include "codec/codec_impl.h"

#include <float.h>

static int have_avx2;

static kvq_codec *mk(const char *spec, size_t d, kvq_isa isa) {
    kvq_codec_params p = {0};
    char err[128];
    p.isa = isa;
    p.err_msg = err;
    p.err_msg_size = sizeof err;
    kvq_codec *c = NULL;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu: %s (%s)", spec, d, kvq_strerror(st), err);
    return c;
}

/* ---- the format, restated independently of src/codec/int.c ---- */

static float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

static size_t fmt_bytes(int bits, size_t d, size_t g) {
    size_t ng = d / g;
    if (bits == 8)
        return 2 * ng + d;
    return 4 * ng + (bits == 4 ? (d + 1) / 2 : (d + 3) / 4);
}

static void fmt_encode(int bits, size_t d, size_t g, const float *x, uint8_t *out) {
    size_t ng = d / g;
    memset(out, 0, fmt_bytes(bits, d, g));
    for (size_t gi = 0; gi < ng; gi++) {
        const float *xg = x + gi * g;
        if (bits == 8) {
            float amax = 0;
            for (size_t t = 0; t < g; t++)
                amax = fabsf(xg[t]) > amax ? fabsf(xg[t]) : amax;
            uint16_t sh = kvq_f32_to_f16(clampf(amax / 127.0f, 0, 65504.0f));
            float s = kvq_f16_to_f32(sh), inv = s > 0 ? 1.0f / s : 0.0f;
            out[2 * gi] = (uint8_t)sh;
            out[2 * gi + 1] = (uint8_t)(sh >> 8);
            for (size_t t = 0; t < g; t++)
                out[2 * ng + gi * g + t] =
                    (uint8_t)(int8_t)(int)clampf(nearbyintf(xg[t] * inv), -127, 127);
            continue;
        }
        float L = bits == 4 ? 15.0f : 3.0f;
        float mn = xg[0], mx = xg[0];
        for (size_t t = 0; t < g; t++) {
            mn = xg[t] < mn ? xg[t] : mn;
            mx = xg[t] > mx ? xg[t] : mx;
        }
        if (mn == 0.0f)
            mn = 0.0f; /* +0 */
        if (mx == 0.0f)
            mx = 0.0f;
        uint16_t mh = kvq_f32_to_f16(clampf(mn, -65504.0f, 65504.0f));
        float m = kvq_f16_to_f32(mh);
        uint16_t sh = kvq_f32_to_f16(clampf((mx - m) / L, 0, 65504.0f));
        float s = kvq_f16_to_f32(sh), inv = s > 0 ? 1.0f / s : 0.0f;
        out[2 * gi] = (uint8_t)sh;
        out[2 * gi + 1] = (uint8_t)(sh >> 8);
        out[2 * ng + 2 * gi] = (uint8_t)mh;
        out[2 * ng + 2 * gi + 1] = (uint8_t)(mh >> 8);
        for (size_t t = 0; t < g; t++) {
            unsigned q = (unsigned)clampf(nearbyintf((xg[t] - m) * inv), 0, L);
            size_t i = gi * g + t;
            if (bits == 4)
                out[4 * ng + i / 2] |= (uint8_t)(q << (4 * (i % 2)));
            else
                out[4 * ng + i / 4] |= (uint8_t)(q << (2 * (i % 4)));
        }
    }
}

static float fmt_half(const uint8_t *p) { return kvq_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
/* scale and minimum (0 for int8) of the group holding value t */
static float fmt_scale(int bits, size_t d, size_t g, const uint8_t *v, size_t t) {
    (void)bits;
    (void)d;
    return fmt_half(v + 2 * (t / g));
}
static float fmt_min(int bits, size_t d, size_t g, const uint8_t *v, size_t t) {
    return bits == 8 ? 0.0f : fmt_half(v + 2 * (d / g) + 2 * (t / g));
}
static float fmt_value(int bits, size_t d, size_t g, const uint8_t *v, size_t t) {
    size_t ng = d / g;
    float s = fmt_scale(bits, d, g, v, t);
    if (bits == 8)
        return s * (float)(int8_t)v[2 * ng + t];
    unsigned q = bits == 4 ? (v[4 * ng + t / 2] >> (4 * (t % 2))) & 15u
                           : (v[4 * ng + t / 4] >> (2 * (t % 4))) & 3u;
    return fmt_min(bits, d, g, v, t) + s * (float)q;
}

/* ---- data ---- */

enum { DATA_GAUSS, DATA_OUTLIER, DATA_SPECIAL, DATA_N };

/* Vector j of a data set; DATA_SPECIAL cycles through edge cases. */
static void fill_vec(tu_rng *r, int kind, size_t j, float *x, size_t d) {
    tu_fill_gauss(r, x, d, 1.0f);
    if (kind == DATA_OUTLIER) {
        for (size_t t = 0; t < d; t++)
            if (t % 17 == 3)
                x[t] *= 40.0f;
        x[0] += 5.0f;
        return;
    }
    if (kind != DATA_SPECIAL)
        return;
    switch (j % 10) {
    case 0: /* zeros, with mixed signs */
        for (size_t t = 0; t < d; t++)
            x[t] = (t & 1) ? -0.0f : 0.0f;
        break;
    case 1: /* huge: saturated scales */
        for (size_t t = 0; t < d; t++)
            x[t] = (t % 3 == 0) ? -1e30f : 1e30f;
        break;
    case 2: /* constant */
        for (size_t t = 0; t < d; t++)
            x[t] = 1e30f;
        break;
    case 3: /* tiny: fp16 subnormal or zero scales */
        for (size_t t = 0; t < d; t++)
            x[t] *= 1e-7f;
        break;
    case 4: /* constant, not an fp16 value */
        for (size_t t = 0; t < d; t++)
            x[t] = 0.1234567f;
        break;
    case 5: /* all negative */
        for (size_t t = 0; t < d; t++)
            x[t] = -fabsf(x[t]) - 3.0f;
        break;
    case 6: /* values near the fp16 range edge */
        for (size_t t = 0; t < d; t++)
            x[t] *= 70000.0f;
        break;
    case 7: /* many exact ties for rounding */
        for (size_t t = 0; t < d; t++)
            x[t] = (float)((int)(x[t] * 4)) * 0.25f;
        break;
    case 8: /* ones and minus zeros */
        for (size_t t = 0; t < d; t++)
            x[t] = (t % 4 == 0) ? 1.0f : -0.0f;
        break;
    default:
        break;
    }
}

static void fill(tu_rng *r, int kind, float *x, size_t n, size_t d) {
    for (size_t j = 0; j < n; j++)
        fill_vec(r, kind, j, x + j * d, d);
}

/* ---- tests ---- */

static void test_sizes(void) {
    static const struct {
        const char *spec;
        size_t d, bytes;
        double bpv;
    } t[] = {
        {"int8", 128, 130, 8.125},  {"int8:g=32", 128, 136, 8.5}, {"int4:g=32", 128, 80, 5.0},
        {"int4", 128, 68, 4.25},    {"int2:g=32", 128, 48, 3.0},  {"int2", 128, 36, 2.25},
        {"int4:g=64", 128, 72, 4.5}, {"int2:g=16", 128, 64, 4.0}, {"int8", 1, 3, 24.0},
        {"int4", 1, 5, 40.0},       {"int2", 3, 5, 40.0 / 3.0},   {"int4:g=8", 80, 80, 8.0},
        {"int4", 3, 6, 16.0},       {"int2:g=1", 5, 22, 35.2},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kvq_codec *c = mk(t[i].spec, t[i].d, KVQ_ISA_SCALAR);
        if (!c)
            continue;
        CHECK_EQ(kvq_codec_vector_bytes(c), t[i].bytes);
        CHECK_NEAR(kvq_codec_bits_per_value(c), t[i].bpv, 1e-12);
        CHECK_EQ(kvq_codec_encode_bound(c, 3), 3 * t[i].bytes);
        kvq_codec_free(c);
    }
    kvq_codec *c = NULL;
    CHECK_STATUS(kvq_codec_create(&c, "int4:g=3", 128, NULL), KVQ_ERR_GROUP);
    CHECK_STATUS(kvq_codec_create(&c, "int4:g=0", 128, NULL), KVQ_ERR_GROUP);
    CHECK_STATUS(kvq_codec_create(&c, "int3", 128, NULL), KVQ_ERR_UNKNOWN_CODEC);
    CHECK_STATUS(kvq_codec_create(&c, "int4:g=256", 128, NULL), KVQ_ERR_GROUP);
    CHECK(c == NULL);
    c = mk("int4:g=128", 128, KVQ_ISA_SCALAR);
    if (c)
        CHECK(strcmp(kvq_codec_spec(c), "int4") == 0);
    kvq_codec_free(c);
}

static const char *const specs_bits[] = {"int8", "int4", "int2"};

/* Scalar encode == the restated format; decode reads it back exactly. */
static void test_format(void) {
    static const size_t dims[] = {1, 3, 8, 16, 80, 96, 128};
    static const size_t groups[] = {0, 1, 4, 8, 16, 32};
    tu_rng r;
    tu_seed(&r, 11);
    printf("test_format: seed 11\n");
    for (int b = 0; b < 3; b++) {
        int bits = b == 0 ? 8 : b == 1 ? 4 : 2;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                size_t d = dims[di], g = groups[gi] ? groups[gi] : d;
                if (d % g)
                    continue;
                char spec[32];
                snprintf(spec, sizeof spec, "%s:g=%zu", specs_bits[b], g);
                kvq_codec *c = mk(spec, d, KVQ_ISA_SCALAR);
                if (!c)
                    continue;
                size_t n = 20, vb = kvq_codec_vector_bytes(c);
                CHECK_EQ(vb, fmt_bytes(bits, d, g));
                float *x = malloc(n * d * sizeof(float)), *y = malloc(n * d * sizeof(float));
                uint8_t *e = malloc(n * vb), *f = malloc(vb);
                int kind = (int)(di + gi) % DATA_N;
                fill(&r, kind, x, n, d);
                CHECK_OK(kvq_codec_encode(c, e, n * vb, x, n));
                CHECK_OK(kvq_codec_decode(c, y, n * d, e, n * vb));
                int bad_bytes = 0, bad_vals = 0;
                for (size_t j = 0; j < n; j++) {
                    fmt_encode(bits, d, g, x + j * d, f);
                    bad_bytes += memcmp(f, e + j * vb, vb) != 0;
                    for (size_t t = 0; t < d; t++) {
                        float v = fmt_value(bits, d, g, e + j * vb, t);
                        bad_vals += memcmp(&v, &y[j * d + t], 4) != 0;
                    }
                }
                TU_REPORT(bad_bytes == 0, "%s d=%zu kind %d: %d vectors differ from the format",
                          spec, d, kind, bad_bytes);
                TU_REPORT(bad_vals == 0, "%s d=%zu: %d decoded values differ from the format",
                          spec, d, bad_vals);
                free(x);
                free(y);
                free(e);
                free(f);
                kvq_codec_free(c);
            }
    }
    /* a hand-checked int4 vector: values 0..15 and one group */
    kvq_codec *c = mk("int4", 16, KVQ_ISA_SCALAR);
    if (c) {
        float x[16];
        uint8_t e[12];
        for (int t = 0; t < 16; t++)
            x[t] = (float)t;
        CHECK_OK(kvq_codec_encode(c, e, sizeof e, x, 1));
        CHECK_EQ(e[0] | (e[1] << 8), 0x3c00); /* scale 1.0 */
        CHECK_EQ(e[2] | (e[3] << 8), 0x0000); /* min 0 */
        CHECK_EQ(e[4], 0x10);                 /* values 0 and 1 */
        CHECK_EQ(e[11], 0xfe);                /* values 14 and 15 */
        kvq_codec_free(c);
    }
    c = mk("int2", 4, KVQ_ISA_SCALAR);
    if (c) {
        float x[4] = {3, 0, 2, 1};
        uint8_t e[5];
        CHECK_OK(kvq_codec_encode(c, e, sizeof e, x, 1));
        CHECK_EQ(e[0] | (e[1] << 8), 0x3c00);
        CHECK_EQ(e[4], 3 | (0 << 2) | (2 << 4) | (1 << 6));
        kvq_codec_free(c);
    }
}

/* Round-trip error per value and nmse on Gaussian data. */
static void test_roundtrip(void) {
    static const struct {
        const char *spec;
        double nmse;
    } t[] = {{"int8", 1e-4},      {"int8:g=32", 1e-4},  {"int4:g=32", 0.01}, {"int4", 0.02},
             {"int4:g=16", 0.008}, {"int2:g=32", 0.17}, {"int2:g=16", 0.12}, {"int2", 0.27}};
    const size_t d = 128, n = 512;
    tu_rng r;
    tu_seed(&r, 12);
    printf("test_roundtrip: seed 12\n");
    float *x = malloc(n * d * sizeof(float)), *y = malloc(n * d * sizeof(float));
    uint8_t *e = malloc(n * 2 * d + 4096);
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kvq_codec *c = mk(t[i].spec, d, KVQ_ISA_AUTO);
        if (!c)
            continue;
        const int bits = c->bits;
        const size_t g = c->group, vb = kvq_codec_vector_bytes(c);
        for (int kind = 0; kind < DATA_N; kind++) {
            fill(&r, kind, x, n, d);
            CHECK_OK(kvq_codec_encode(c, e, n * vb, x, n));
            CHECK_OK(kvq_codec_decode(c, y, n * d, e, n * vb));
            double se = 0, sx = 0;
            int bad = 0, nonfinite = 0;
            for (size_t j = 0; j < n; j++)
                for (size_t gi = 0; gi < d / g; gi++) {
                    const float *xg = x + j * d + gi * g;
                    float mn = xg[0], mx = xg[0];
                    for (size_t u = 0; u < g; u++) {
                        mn = xg[u] < mn ? xg[u] : mn;
                        mx = xg[u] > mx ? xg[u] : mx;
                    }
                    for (size_t u = 0; u < g; u++) {
                        size_t k = j * d + gi * g + u;
                        double err = fabs((double)x[k] - y[k]);
                        float s = fmt_scale(bits, d, g, e + j * vb, gi * g);
                        /* fp16 rounding of s and m: relative 2^-11, absolute 2^-25
                         * (subnormal), times at most 127 levels */
                        double bound = 0.5 * s + ldexp(fabs(mn) + fabs(mx), -11) +
                                       1e-6 * fabs(x[k]) + ldexp(1.0, -18);
                        if (fabs(mn) > 65504.0 || fabs(mx) > 65504.0 || s == 65504.0f)
                            bound = INFINITY; /* beyond fp16: only finiteness is promised */
                        bad += !(err <= bound);
                        nonfinite += !isfinite(y[k]);
                        se += err * err;
                        sx += (double)x[k] * x[k];
                    }
                }
            TU_REPORT(bad == 0, "%s kind %d: %d values beyond s/2 + fp16 rounding", t[i].spec,
                      kind, bad);
            CHECK_EQ(nonfinite, 0);
            if (kind == DATA_GAUSS) {
                double nmse = se / sx;
                printf("  %-10s nmse %.3g (bound %.3g), %.4g bits/value\n", t[i].spec, nmse,
                       t[i].nmse, kvq_codec_bits_per_value(c));
                CHECK_LE(nmse, t[i].nmse);
            }
        }
        kvq_codec_free(c);
    }
    free(x);
    free(y);
    free(e);
}

/* Zero vectors decode to exact zeros; 1e30 vectors saturate, stay finite. */
static void test_extremes(void) {
    static const char *const sp[] = {"int8", "int8:g=8", "int4:g=32", "int4", "int2:g=16", "int2"};
    const size_t d = 64;
    for (int isa = 0; isa < 2; isa++) {
        if (isa && !have_avx2)
            break;
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            kvq_codec *c = mk(sp[i], d, isa ? KVQ_ISA_AVX2 : KVQ_ISA_SCALAR);
            if (!c)
                continue;
            size_t vb = kvq_codec_vector_bytes(c);
            float x[3 * 64], y[3 * 64], q[64], sc[3], acc[64] = {0}, w[3] = {0.5f, 1.0f, 2.0f};
            uint8_t e[3 * 200];
            for (size_t t = 0; t < d; t++) {
                x[t] = 0.0f;
                x[d + t] = (t & 1) ? 1e30f : -1e30f;
                x[2 * d + t] = 1e30f;
                q[t] = 1.0f;
            }
            CHECK_OK(kvq_codec_encode(c, e, sizeof e, x, 3));
            CHECK_OK(kvq_codec_decode(c, y, 3 * d, e, 3 * vb));
            int zero_ok = 1, finite = 1;
            for (size_t t = 0; t < d; t++) {
                zero_ok &= y[t] == 0.0f;
                finite &= isfinite(y[d + t]) && isfinite(y[2 * d + t]);
            }
            CHECK(zero_ok);
            CHECK(finite);
            CHECK_EQ(e[vb] | (e[vb + 1] << 8), 0x7bff); /* scale saturated at 65504 */
            CHECK_OK(kvq_codec_score(c, sc, 3, q, 1, e, 3 * vb));
            CHECK(sc[0] == 0.0f);
            CHECK(isfinite(sc[1]) && isfinite(sc[2]));
            CHECK_OK(kvq_codec_accumulate(c, acc, d, w, 1, e, 3 * vb));
            finite = 1;
            for (size_t t = 0; t < d; t++)
                finite &= isfinite(acc[t]);
            CHECK(finite);
            kvq_codec_free(c);
        }
    }
}

/* Exact <q, k^> in double, and the terms of the two score bounds. */
typedef struct {
    double dot, fsum, qbound, cs;
} score_ref;

static score_ref score_reference(const float *q, const float *kd, const uint8_t *kenc, int bits,
                                 size_t d, size_t g) {
    score_ref s = {0, 0, 0, 0};
    double qn = 0, cn = 0;
    for (size_t t = 0; t < d; t++) {
        double m = fmt_min(bits, d, g, kenc, t);
        s.dot += (double)q[t] * kd[t];
        s.fsum += fabs(q[t]) * (fabs(kd[t]) + fabs(m));
        qn += (double)q[t] * q[t];
        cn += (kd[t] - m) * (kd[t] - m);
    }
    for (size_t b = 0; b + 32 <= d; b += 32) {
        double amax = 0, ksum = 0;
        for (size_t t = b; t < b + 32; t++) {
            amax = fabs(q[t]) > amax ? fabs(q[t]) : amax;
            ksum += fabs(kd[t] - fmt_min(bits, d, g, kenc, t));
        }
        s.qbound += amax / 254.0 * ksum;
    }
    s.qbound *= 1.0 + 1e-4;
    s.cs = sqrt(32.0) / 254.0 * sqrt(qn) * sqrt(cn) * (1.0 + 1e-4);
    return s;
}

typedef struct {
    double worst_rel; /* max |err| / (|q| |k^ - m|) of the AVX2 score */
    double sum_rel;
    long count;
} score_stats;

/* One spec at one head_dim: AVX2 against scalar on every kernel. */
static void compare_paths(const char *spec, size_t d, tu_rng *r, score_stats *st) {
    static const size_t counts[] = {1, 3, 7, 31, 33, 127};
    kvq_codec *cs = mk(spec, d, KVQ_ISA_SCALAR), *cv = mk(spec, d, KVQ_ISA_AVX2);
    if (!cs || !cv) {
        kvq_codec_free(cs);
        kvq_codec_free(cv);
        return;
    }
    const int bits = cs->bits;
    const size_t g = cs->group, vb = kvq_codec_vector_bytes(cs), nmax = 127, nqmax = 5;
    const double feps = (double)(d + 16) * FLT_EPSILON;
    float *xb = malloc((nmax * d + 1) * sizeof(float)), *x = xb + 1; /* misaligned by 1 float */
    uint8_t *es = malloc(nmax * vb), *evb = malloc(nmax * vb + 1), *ev = evb + 1;
    float *ys = malloc(nmax * d * sizeof(float)), *yvb = malloc((nmax * d + 1) * sizeof(float));
    float *yv = yvb + 1;
    float *qb = malloc((nqmax * d + 1) * sizeof(float)), *q = qb + 1;
    float *ss = malloc(nqmax * nmax * sizeof(float)), *sv = malloc(nqmax * nmax * sizeof(float));
    float *s1 = malloc(nmax * sizeof(float));
    float *w = malloc(nqmax * nmax * sizeof(float));
    float *as = malloc(nqmax * d * sizeof(float)), *avb = malloc((nqmax * d + 1) * sizeof(float));
    float *av = avb + 1;
    double *aref = malloc(nqmax * d * sizeof(double)), *amag = malloc(nqmax * d * sizeof(double));

    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        const size_t n = counts[ci];
        const int kind = (int)(ci % DATA_N);
        const size_t nq = 1 + ci % nqmax;
        fill(r, kind, x, n, d);
        /* encode: bit-exact */
        CHECK_OK(kvq_codec_encode(cs, es, n * vb, x, n));
        CHECK_OK(kvq_codec_encode(cv, ev, n * vb, x, n));
        TU_REPORT(memcmp(es, ev, n * vb) == 0, "%s d=%zu n=%zu kind %d: AVX2 encode differs",
                  spec, d, n, kind);
        /* decode: bit-exact */
        CHECK_OK(kvq_codec_decode(cs, ys, n * d, es, n * vb));
        CHECK_OK(kvq_codec_decode(cv, yv, n * d, ev, n * vb));
        TU_REPORT(memcmp(ys, yv, n * d * sizeof(float)) == 0,
                  "%s d=%zu n=%zu: AVX2 decode differs", spec, d, n);
        /* score */
        tu_fill_gauss(r, q, nq * d, 1.0f);
        for (size_t t = 0; t < nq * d; t += 13)
            q[t] *= 8.0f;
        CHECK_OK(kvq_codec_score(cs, ss, nq * n, q, nq, es, n * vb));
        CHECK_OK(kvq_codec_score(cv, sv, nq * n, q, nq, ev, n * vb)); /* misaligned keys */
        int bad_s = 0, bad_v = 0, bad_cs = 0, bad_1 = 0;
        double worst = 0;
        for (size_t i = 0; i < nq; i++) {
            /* one query at a time gives the same bits as a block of queries */
            CHECK_OK(kvq_codec_score(cv, s1, n, q + i * d, 1, ev, n * vb));
            for (size_t j = 0; j < n; j++) {
                score_ref sr = score_reference(q + i * d, ys + j * d, es + j * vb, bits, d, g);
                double es_ = fabs(ss[i * n + j] - sr.dot), ev_ = fabs(sv[i * n + j] - sr.dot);
                bad_s += !(es_ <= feps * sr.fsum + 1e-30);
                if (cv->k.score != cs->ref.score) {
                    bad_v += !(ev_ <= sr.qbound + feps * sr.fsum + 1e-30);
                    bad_cs += !(ev_ <= sr.cs + feps * sr.fsum + 1e-30);
                    if (sr.cs > 0 && kind != DATA_SPECIAL) {
                        double rel = ev_ / (sr.cs / (sqrt(32.0) / 254.0 * (1.0 + 1e-4)));
                        worst = rel > worst ? rel : worst;
                        st->sum_rel += rel;
                        st->count++;
                    }
                } else {
                    bad_v += !(ev_ <= feps * sr.fsum + 1e-30);
                }
                bad_1 += memcmp(&s1[j], &sv[i * n + j], 4) != 0;
            }
        }
        st->worst_rel = worst > st->worst_rel ? worst : st->worst_rel;
        TU_REPORT(bad_s == 0, "%s d=%zu n=%zu: %d scalar scores off", spec, d, n, bad_s);
        TU_REPORT(bad_v == 0, "%s d=%zu n=%zu nq=%zu: %d AVX2 scores beyond the bound", spec, d,
                  n, nq, bad_v);
        TU_REPORT(bad_cs == 0, "%s d=%zu n=%zu: %d AVX2 scores beyond 0.0223|q||k-m|", spec, d, n,
                  bad_cs);
        TU_REPORT(bad_1 == 0, "%s d=%zu n=%zu: %d scores depend on the query block", spec, d, n,
                  bad_1);
        /* accumulate (misaligned output) */
        for (size_t k = 0; k < nq * n; k++)
            w[k] = (float)tu_uniform(r);
        for (size_t k = 0; k < nq * d; k++) {
            as[k] = av[k] = (float)(k % 7) - 3.0f;
            aref[k] = as[k];
            amag[k] = fabs(as[k]);
        }
        /* the AVX2 path sums w*s*q and w*m apart: its error scales with |v| + |m| */
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < n; j++)
                for (size_t t = 0; t < d; t++) {
                    double wj = w[i * n + j], m = fmt_min(bits, d, g, es + j * vb, t);
                    aref[i * d + t] += wj * ys[j * d + t];
                    amag[i * d + t] += fabs(wj) * (fabs(ys[j * d + t]) + fabs(m));
                }
        CHECK_OK(kvq_codec_accumulate(cs, as, nq * d, w, nq, es, n * vb));
        CHECK_OK(kvq_codec_accumulate(cv, av, nq * d, w, nq, ev, n * vb));
        int bad_as = 0, bad_av = 0;
        const double aeps = (double)(n + 16) * FLT_EPSILON;
        for (size_t k = 0; k < nq * d; k++) {
            bad_as += !(fabs(as[k] - aref[k]) <= aeps * amag[k] + 1e-30);
            bad_av += !(fabs(av[k] - aref[k]) <= aeps * amag[k] + 1e-30);
        }
        TU_REPORT(bad_as == 0, "%s d=%zu n=%zu: %d scalar accumulate values off", spec, d, n,
                  bad_as);
        TU_REPORT(bad_av == 0, "%s d=%zu n=%zu nq=%zu: %d AVX2 accumulate values off", spec, d,
                  n, nq, bad_av);
    }
    free(xb);
    free(es);
    free(evb);
    free(ys);
    free(yvb);
    free(qb);
    free(ss);
    free(sv);
    free(s1);
    free(w);
    free(as);
    free(avb);
    free(aref);
    free(amag);
    kvq_codec_free(cs);
    kvq_codec_free(cv);
}

static void test_paths(void) {
    static const size_t dims[] = {1, 3, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 1024};
    static const size_t groups[] = {0, 1, 4, 8, 16, 24, 32, 64, 128};
    if (!have_avx2) {
        printf("test_paths: AVX2 not available on this CPU, skipped\n");
        return;
    }
    tu_rng r;
    tu_seed(&r, 13);
    printf("test_paths: seed 13\n");
    score_stats st[3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    int configs = 0;
    for (int b = 0; b < 3; b++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                size_t d = dims[di], g = groups[gi] ? groups[gi] : d;
                if (d % g || (groups[gi] == d))
                    continue;
                if (d == 1024 && g < 32)
                    continue;
                char spec[32];
                snprintf(spec, sizeof spec, "%s:g=%zu", specs_bits[b], g);
                compare_paths(spec, d, &r, &st[b]);
                configs++;
            }
    printf("  %d configurations\n", configs);
    for (int b = 0; b < 3; b++)
        printf("  %s AVX2 score error / (|q| |k^-m|): max %.3g, mean %.3g (bound %.4f)\n",
               specs_bits[b], st[b].worst_rel,
               st[b].count ? st[b].sum_rel / (double)st[b].count : 0.0, sqrt(32.0) / 254.0);
}

/* The AVX2 kernels are really chosen for the shapes they claim. */
static void test_selection(void) {
    static const struct {
        const char *spec;
        size_t d;
        int enc, score;
    } t[] = {
        {"int8", 128, 1, 1},      {"int8:g=32", 128, 1, 1}, {"int8:g=16", 128, 1, 1},
        {"int8:g=8", 128, 1, 1},  {"int4:g=32", 128, 1, 1}, {"int4", 128, 1, 1},
        {"int4:g=64", 128, 1, 1}, {"int4:g=16", 128, 1, 1}, {"int4:g=8", 128, 1, 1},
        {"int2:g=32", 128, 1, 1}, {"int2:g=16", 128, 1, 1}, {"int2", 128, 1, 1},
        {"int2:g=64", 128, 1, 1}, {"int4", 96, 1, 1},       {"int4:g=32", 96, 1, 1},
        {"int8", 80, 1, 0},       {"int4:g=16", 80, 1, 0},  {"int4:g=4", 128, 0, 0},
        {"int4", 3, 0, 0},        {"int2:g=8", 128, 1, 0},  {"int8:g=4", 128, 0, 1},
    };
    if (!have_avx2)
        return;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kvq_codec *c = mk(t[i].spec, t[i].d, KVQ_ISA_AVX2);
        if (!c)
            continue;
        TU_REPORT((c->k.encode != c->ref.encode) == t[i].enc &&
                      (c->k.decode != c->ref.decode) == t[i].enc &&
                      (c->k.accum != c->ref.accum) == t[i].enc,
                  "%s d=%zu: AVX2 encode/decode/accum selected != %d", t[i].spec, t[i].d,
                  t[i].enc);
        TU_REPORT((c->k.score != c->ref.score) == t[i].score &&
                      (c->k.prep != c->ref.prep) == t[i].score,
                  "%s d=%zu: AVX2 score selected != %d", t[i].spec, t[i].d, t[i].score);
        kvq_codec_free(c);
    }
}

/* Allocation failures and rejected input leave nothing behind. */
static void test_errors(void) {
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 1);
    kvq_codec_params p = {0};
    p.allocator = &al;
    kvq_codec *c = NULL;
    CHECK_STATUS(kvq_codec_create(&c, "int4:g=32", 128, &p), KVQ_ERR_NOMEM);
    CHECK(c == NULL);
    CHECK_EQ(fa.live_blocks, 0);
    /* many queries: the prepared queries go to the heap */
    al = tu_failalloc_make(&fa, 2);
    CHECK_OK(kvq_codec_create(&c, "int4:g=32", 128, &p));
    if (c) {
        const size_t nq = 64, d = 128;
        float *q = calloc(nq * d, sizeof(float)), sc[64];
        uint8_t e[80] = {0};
        CHECK_STATUS(kvq_codec_score(c, sc, nq, q, nq, e, sizeof e), KVQ_ERR_NOMEM);
        CHECK_OK(kvq_codec_score(c, sc, nq, q, nq, e, sizeof e));
        q[5] = NAN;
        CHECK_STATUS(kvq_codec_encode(c, e, sizeof e, q, 1), KVQ_ERR_NONFINITE);
        free(q);
        kvq_codec_free(c);
    }
    CHECK_EQ(fa.live_blocks, 0);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    have_avx2 = kvq_cpu_supports(KVQ_ISA_AVX2);
    if (!have_avx2)
        printf("note: AVX2 not available; only the scalar path is tested\n");
    test_sizes();
    test_format();
    test_roundtrip();
    test_extremes();
    test_selection();
    test_paths();
    test_errors();
    return tu_finish();
}
