/*
 * test_codecs.c - tests that loop over every codec (after ggml's
 * test-quantize-fns): the error codes and messages of the public API, spec
 * parsing, fp16/bf16 rounding, and for every codec x head_dim x CPU path:
 * round-trip error within a per-codec bound, score and accumulate against
 * the decoded vectors, cross-path decoding, bad input leaving outputs
 * untouched, zero and huge vectors, and allocation failures at every step.
 */
#include "testutil.h"

#include <float.h>

static const char *all_codecs[] = {"f32",   "f16",      "bf16",  "int8",     "int8:g=8", "int4",
                                   "int4:g=8", "int2",  "int2:g=8", "tq1",   "tq2",      "tq3",
                                   "tq4",   "tq3:nc=0", "tq3:norm=8", "tqp2", "tqp3",   "tqp4",
                                   "nuq1",  "nuq2",     "nuq3",  "nuq4",     "nuq8"};
#define N_CODECS (sizeof all_codecs / sizeof all_codecs[0])

#define U24 0x1p-24 /* unit roundoff of float */

/* gamma_n of Higham's "Accuracy and Stability of Numerical Algorithms"
 * (Thm 3.1): a sum of n float products, in any order, with or without FMA,
 * is off by at most gamma_n times the sum of the products' magnitudes. */
static double gamma_n(double n) { return n * U24 / (1 - n * U24); }

static float f16_at(const uint8_t *p) { return kvq_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Group size of an int spec ("int4:g=8" -> 8, else d). */
static size_t int_group(const char *spec, size_t d) {
    const char *g = strstr(spec, ":g=");
    return g ? (size_t)atoi(g + 3) : d;
}

/* Gaussian Lloyd-Max distortion per unit variance (Max 1960), b = 1..4.
 * tq's codebook is Lloyd-Max for one coordinate of a random unit vector in
 * R^d, whose density (1 - x^2)^((d-3)/2) has lighter tails than the
 * Gaussian of the same variance: its distortion is below these at every
 * d >= 2 (d = 3: the uniform density, 4^-b). */
static const double lloyd_max_gauss[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};

/* nmse of tq<b>: with the norm correction (nc=1, x' = |x| c/|c|) the error
 * is 2(1 - cos) = 2 sin^2/(1 + cos), sin^2 <= |u - c|^2 ~ D, cos ~
 * sqrt(1 - D); without it, D. */
static double tq_nmse(int b, int nc) {
    double D = lloyd_max_gauss[b];
    return nc ? D * 2.0 / (1.0 + sqrt(1.0 - D)) : D;
}

/* Upper bound on the nmse of n vectors x of N(0,1) data (sum |x' - x|^2 /
 * sum |x|^2) for each codec, from its theory; `seeds` tqp sketches are
 * averaged. Every bound is below 1, the nmse of a decode to zero.
 * - f16, bf16: round to nearest: |error| <= 2^-11 / 2^-8 of each value.
 * - int: every value within half a step of its code (step = s, the fp16
 *   scale absmax/127 or range/L), the fp16 rounding of s and of the
 *   minimum adding 2^-10 relative: a deterministic bound per group from x.
 * - tq: d = 1 is exact but for the stored scale (fp16: 2^-11; norm=8:
 *   half a step of the log2 code, 2^(10/254) - 1 with the default range
 *   [-10, 10]); d >= 2: tq_nmse, times 1.25 for the sample (67 vectors;
 *   at d = 3 the per-vector error has a relative spread of ~1, so ~12 %
 *   on the mean, and the norm correction's cos ~ sqrt(1 - D) is itself an
 *   estimate).
 * - tqp: tq(b-1) leaves r = x - x_mse with |r|^2 = tq_nmse |x|^2; the QJL
 *   estimate r' = |r| sqrt(pi/2)/d S^T sign(S r) is unbiased with
 *   E_S |r' - r|^2 = (pi/2 - 1/d)|r|^2 (expanding |S^T sign|^2 over the d
 *   Gaussian rows). One fixed sketch of d rows deviates from that mean by
 *   ~1/sqrt(d) relative (d independent rows): 2/sqrt(seeds d) covers two
 *   standard deviations; 1.1 the sample.
 * - nuq: fitted on >= 512 samples, measured on others: the Gaussian
 *   Lloyd-Max distortion (0.363, 0.118, 0.0345, 0.0095 for 1..4 bits) with
 *   room for the held-out excess of levels fitted on 512 samples (24, 28,
 *   45, 110 %; at 8 bits, 256 levels from 512 samples are far from the
 *   high-resolution 4e-5: 0.005), times 1 + 4/sqrt(n d) for the sample (a
 *   mean of n d squared errors whose relative spread per value is below
 *   1.5: 3 standard deviations; it matters at d = 1 and 3). */
static double nmse_bound(const char *spec, size_t d, const float *x, size_t n, int seeds) {
    const double eps8 = pow(2.0, 10.0 / 254) - 1; /* norm=8: half a code step, relative */
    if (!strcmp(spec, "f32"))
        return 0.0;
    if (!strcmp(spec, "f16"))
        return 0x1p-22;
    if (!strcmp(spec, "bf16"))
        return 0x1p-16;
    if (!strncmp(spec, "int", 3)) {
        int bits = atoi(spec + 3);
        size_t g = int_group(spec, d);
        double L = bits == 8 ? 254.0 : 2.0 * ((1 << bits) - 1); /* step = span / L */
        double e = 0, xx = 0;
        for (size_t i = 0; i < n * d; i += g) {
            double mn = x[i], mx = x[i], am = 0;
            for (size_t t = i; t < i + g; t++) {
                mn = fmin(mn, x[t]), mx = fmax(mx, x[t]), am = fmax(am, fabs(x[t]));
                xx += (double)x[t] * x[t];
            }
            double half = (bits == 8 ? am : mx - mn) / L * (1 + 0x1p-10) +
                          (bits == 8 ? 0 : 0x1p-10 * fmax(fabs(mn), fabs(mx)));
            e += (double)g * half * half;
        }
        return e / xx;
    }
    if (!strncmp(spec, "tq", 2)) {
        int tqp = spec[2] == 'p', b = spec[tqp ? 3 : 2] - '0';
        int nc = strstr(spec, "nc=0") == NULL, n8 = strstr(spec, "norm=8") != NULL;
        double e;
        if (d == 1)
            e = 0x1p-20;
        else if (!tqp)
            e = tq_nmse(b, nc) * 1.25;
        else
            e = tq_nmse(b - 1, nc) * (M_PI / 2 - 1.0 / (double)d) *
                (1 + 2 / sqrt((double)seeds * (double)d)) * 1.1;
        return n8 ? pow(sqrt(e) + eps8, 2) : e;
    }
    if (!strncmp(spec, "nuq", 3)) {
        int b = atoi(spec + 3);
        double e = b == 1 ? 0.45 : b == 2 ? 0.15 : b == 3 ? 0.05 : b == 4 ? 0.02 : 0.005;
        return e * (1 + 4 / sqrt((double)(n * d)));
    }
    return 0.0;
}

/* Bound on |score(q, key) - <q, y>| for one key: y its decoding, x the
 * vector it encodes, enc its bytes (docs/format.md), on path isa.
 * - Float arithmetic (every path): the direct paths (float, int, nuq) sum
 *   d products (gamma_{d+2}; int4/int2 also m_g times the query's group
 *   sum: 2|m_g| per value). tq/tqp score <R q, scale c> where decode gives
 *   R^T(scale c): in exact arithmetic the same, in float off by the query's
 *   rotation and the decode's inverse rotation, each within
 *   rho = sqrt(d) gamma_L of |q| resp. |y| in norm (L = log2 d + 2 for the
 *   FWHT of a power of two, d + 1 for the dense Haar matrix, whose rows
 *   have norm 1), and the dot (gamma_{d+2}); tqp adds its sketch S (d x d
 *   Gaussian, |S|_F <= d (1 + 2/d)) on both sides:
 *   2 gamma_d sqrt(d) sqrt(pi/2)(1 + 2/d) |r| |q|.
 * - AVX2 int codecs at d % 32 == 0 quantize the query to int8 per block of
 *   32 (step = block absmax/127, |error| <= step/2 per value) against the
 *   codes, which stand for y - m_g (int8: y).
 * - AVX2 tq4 at d % 32 == 0: int16 query (step max|Rq|/8191 <= |q|/8191)
 *   against scale c (sum |scale c_i| <= sqrt(d) |y|), and int16 codebook
 *   (|error| <= cmax/16382, cmax < 1 for a unit vector's coordinate)
 *   against R q (sum <= sqrt(d) |q|), times the stored scale. */
static double score_bound(const char *spec, size_t d, kvq_isa isa, const float *q, const float *y,
                          const float *x, const uint8_t *enc) {
    double qq = 0, yy = 0, xx = 0, bound = 0;
    for (size_t t = 0; t < d; t++) {
        qq += (double)q[t] * q[t];
        yy += (double)y[t] * y[t];
        xx += (double)x[t] * x[t];
    }
    double qn = sqrt(qq), yn = sqrt(yy), xn = sqrt(xx), sd = sqrt((double)d);
    int simd = isa == KVQ_ISA_AVX2 && d % 32 == 0;
    if (!strncmp(spec, "tq", 2)) {
        int tqp = spec[2] == 'p', b = spec[tqp ? 3 : 2] - '0', n16 = !strstr(spec, "norm=8");
        int pow2 = (d & (d - 1)) == 0;
        double L = pow2 ? log2((double)d) + 2 : d + 1.0;
        double rho = sd * gamma_n(L), w = tqp ? fmax(xn, yn) : yn;
        bound = (2 * rho + gamma_n(d + 2.0)) * qn * w * (1 + 1e-3);
        if (tqp) {
            double rn = n16 ? f16_at(enc + 2 + (d * (size_t)(b - 1) + 7) / 8) : 2 * xn;
            bound += 2 * gamma_n((double)d) * sd * sqrt(M_PI / 2) * (1 + 2.0 / d) * rn * qn;
        }
        if (simd && !tqp && b == 4 && n16) {
            double scale = f16_at(enc);
            bound += sd * qn * (w + scale) / 16382 * (1 + 1e-3);
        }
        return bound;
    }
    int asym = !strncmp(spec, "int", 3) && atoi(spec + 3) != 8;
    size_t g = !strncmp(spec, "int", 3) ? int_group(spec, d) : d, ng = d / g;
    double mag = 0, quant = 0;
    for (size_t t = 0; t < d; t++) {
        double m = asym ? f16_at(enc + 2 * ng + 2 * (t / g)) : 0;
        mag += fabs(q[t]) * (fabs(y[t]) + 2 * fabs(m));
        if (simd && !strncmp(spec, "int", 3)) {
            double bm = 0;
            for (size_t i = t / 32 * 32; i < t / 32 * 32 + 32; i++)
                bm = fmax(bm, fabs(q[i]));
            quant += bm / 254 * (1 + 0x1p-10) * fabs(y[t] - m);
        }
    }
    return gamma_n(d + 2.0) * mag + quant;
}

static void test_errors(void) {
    CHECK(strcmp(kvq_strerror(KVQ_OK), "ok") == 0);
    CHECK(strcmp(kvq_strerror((kvq_status)-999), "unknown error") == 0);
    for (int s = 0; s >= -19; s--)
        CHECK(kvq_strerror((kvq_status)s) != NULL && strlen(kvq_strerror((kvq_status)s)) > 1);
    CHECK(kvq_version_string() != NULL);
    CHECK(strcmp(kvq_isa_name(KVQ_ISA_SCALAR), "scalar") == 0);
    CHECK(kvq_cpu_supports(KVQ_ISA_SCALAR));
    /* the best path is one the CPU supports, AVX-512 only with AVX2 */
    CHECK(kvq_cpu_supports(kvq_cpu_best_isa()));
    CHECK(!kvq_cpu_supports(KVQ_ISA_AVX512) || kvq_cpu_supports(KVQ_ISA_AVX2));
    CHECK(!kvq_cpu_supports(KVQ_ISA_AVXVNNI) || kvq_cpu_supports(KVQ_ISA_AVX2));
    CHECK(strcmp(kvq_isa_name(KVQ_ISA_AVXVNNI), "avxvnni") == 0);
    /* auto: AVX-512, else AVX-VNNI, else AVX2 */
    CHECK(kvq_cpu_best_isa() == (kvq_cpu_supports(KVQ_ISA_AVX512)    ? KVQ_ISA_AVX512
                                 : kvq_cpu_supports(KVQ_ISA_AVXVNNI) ? KVQ_ISA_AVXVNNI
                                 : kvq_cpu_supports(KVQ_ISA_AVX2)    ? KVQ_ISA_AVX2
                                                                     : KVQ_ISA_SCALAR));
    CHECK(strcmp(kvq_isa_name((kvq_isa)5), "unknown") == 0 && !kvq_cpu_supports((kvq_isa)5));
}

static void expect_create(const char *spec, size_t d, kvq_status want) {
    kvq_codec *c = (kvq_codec *)0x1;
    char msg[160] = "";
    kvq_codec_params p = {0};
    p.err_msg = msg;
    p.err_msg_size = sizeof msg;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == want, "create('%s', %zu) = %d (%s), want %d [%s]", spec, d, (int)st,
              kvq_strerror(st), (int)want, msg);
    if (st == KVQ_OK) {
        CHECK(c != NULL);
        kvq_codec_free(c);
    } else {
        CHECK(c == NULL);
        TU_REPORT(msg[0] != 0, "no detailed message for '%s'", spec);
    }
}

static void test_spec_parsing(void) {
    expect_create("f32", 8, KVQ_OK);
    expect_create("int4:g=4", 8, KVQ_OK);
    expect_create("int4:g=3", 8, KVQ_ERR_GROUP);
    expect_create("int4:g=0", 8, KVQ_ERR_GROUP);
    expect_create("int4:g=16", 8, KVQ_ERR_GROUP);
    expect_create("int3", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("int16", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("tq0", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("tq5", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("tqp1", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("tqp5", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("nuq9", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("nuq0", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("q4_0", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("f32x", 8, KVQ_ERR_UNKNOWN_CODEC);
    expect_create("int4:x=1", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=-2", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=4x", 8, KVQ_ERR_BAD_OPTION);
    expect_create("f16:g=8", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:nc=2", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:norm=12", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:g=8", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int8:seed=1", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:", 8, KVQ_ERR_BAD_OPTION);
    /* option values are decimal only: strtoull(..., 0) read "010" as 8
     * (octal) and "0x10" as 16, skipped leading spaces and took '+' */
    expect_create("int4:g=010", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=08", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=0x8", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=+4", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g= 4", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=4 ", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=\t4", 8, KVQ_ERR_BAD_OPTION);
    expect_create("int4:g=-0", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=0x10", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=010", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=1e3", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:nc=00", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:norm=016", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=18446744073709551616", 8, KVQ_ERR_BAD_OPTION); /* 2^64 */
    expect_create("tq3:seed=99999999999999999999", 8, KVQ_ERR_BAD_OPTION);
    expect_create("tq3:seed=18446744073709551615", 8, KVQ_OK); /* 2^64 - 1 */
    expect_create("tq3:seed=0", 8, KVQ_OK);
    expect_create("tq3:nc=0", 8, KVQ_OK);
    {
        /* the message says why the value is refused */
        const char *bad[][2] = {{"int4:g=010", "leading zero"},
                                {"tq3:seed=0x10", "decimal digits only"},
                                {"int4:g=", "empty"},
                                {"tq3:seed=18446744073709551616", "above 2^64 - 1"}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            kvq_codec *b = NULL;
            char msg[160] = "";
            kvq_codec_params bp = {0};
            bp.err_msg = msg;
            bp.err_msg_size = sizeof msg;
            kvq_status bst = kvq_codec_create(&b, bad[i][0], 8, &bp);
            TU_REPORT(bst == KVQ_ERR_BAD_OPTION && strstr(msg, bad[i][1]) != NULL,
                      "'%s': status %d, message '%s' should say '%s'", bad[i][0], (int)bst, msg,
                      bad[i][1]);
            kvq_codec_free(b);
        }
    }
    expect_create("f32", 0, KVQ_ERR_HEAD_DIM);
    expect_create("f32", 1025, KVQ_ERR_HEAD_DIM);
    expect_create("f32", 1024, KVQ_OK);

    kvq_codec *c = NULL;
    CHECK_STATUS(kvq_codec_create(NULL, "f32", 8, NULL), KVQ_ERR_INVALID_ARG);
    CHECK_STATUS(kvq_codec_create(&c, NULL, 8, NULL), KVQ_ERR_INVALID_ARG);
    kvq_codec_params p = {0};
    p.isa = KVQ_ISA_AVX512;
    if (kvq_cpu_supports(KVQ_ISA_AVX512)) {
        CHECK_STATUS(kvq_codec_create(&c, "f32", 8, &p), KVQ_OK);
        kvq_codec_free(c);
        c = NULL;
    } else {
        CHECK_STATUS(kvq_codec_create(&c, "f32", 8, &p), KVQ_ERR_ISA);
        CHECK(c == NULL);
    }
    p.isa = (kvq_isa)7;
    CHECK_STATUS(kvq_codec_create(&c, "f32", 8, &p), KVQ_ERR_INVALID_ARG);
    kvq_codec_free(NULL);

    /* canonical specs */
    struct {
        const char *in, *out;
        size_t d;
    } canon[] = {{"int4:g=128", "int4", 128}, {"int4:g=32", "int4:g=32", 128},
                 {"tq3:nc=1:norm=16", "tq3", 64}, {"tq3:nc=0:seed=7", "tq3:nc=0:seed=7", 64},
                 {"tqp3:norm=8", "tqp3:norm=8", 64}, {"int08", "int8", 16}};
    for (size_t i = 0; i < sizeof canon / sizeof canon[0]; i++) {
        c = NULL;
        kvq_status st = kvq_codec_create(&c, canon[i].in, canon[i].d, NULL);
        TU_REPORT(st == KVQ_OK, "create %s: %s", canon[i].in, kvq_strerror(st));
        if (st == KVQ_OK)
            TU_REPORT(strcmp(kvq_codec_spec(c), canon[i].out) == 0, "canonical of %s is %s, want %s",
                      canon[i].in, kvq_codec_spec(c), canon[i].out);
        kvq_codec_free(c);
    }
}

static void test_half_floats(void) {
    /* every finite half round-trips exactly through float */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 0x1f) == 0x1f)
            continue;
        float f = kvq_f16_to_f32((uint16_t)h);
        if (kvq_f32_to_f16(f) != h)
            bad++;
    }
    CHECK_EQ(bad, 0);
    /* ties round to even, in normal and subnormal range */
    CHECK_EQ(kvq_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);         /* tie, even stays */
    CHECK_EQ(kvq_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);     /* tie, odd rounds up */
    CHECK_EQ(kvq_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    CHECK_EQ(kvq_f32_to_f16(0x1p-25f), 0x0000);                /* tie to even: 0 */
    CHECK_EQ(kvq_f32_to_f16(3 * 0x1p-25f), 0x0002);            /* 1.5 units -> 2 */
    CHECK_EQ(kvq_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ(kvq_f32_to_f16(65519.0f), 0x7bff);
    CHECK_EQ(kvq_f32_to_f16(1e30f), 0x7bff); /* saturates */
    CHECK_EQ(kvq_f32_to_f16(-1e30f), 0xfbff);
    CHECK_EQ(kvq_f32_to_f16(-0.0f), 0x8000);
    CHECK(isinf(kvq_f16_to_f32(0x7c00)));
    /* bf16 */
    CHECK_EQ(kvq_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ(kvq_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);             /* tie, even */
    CHECK_EQ(kvq_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);         /* tie, odd up */
    CHECK_EQ(kvq_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK(kvq_bf16_to_f32(kvq_f32_to_bf16(1e30f)) > 9.9e29f);
    /* CRC32C check value */
    CHECK_EQ(kvq_crc32c(0, "123456789", 9), 0xe3069283u);
}

static kvq_codec *make(const char *spec, size_t d, kvq_isa isa, const float *fit, size_t nfit) {
    kvq_codec *c = NULL;
    kvq_codec_params p = {0};
    char msg[160] = "";
    p.isa = isa;
    p.err_msg = msg;
    p.err_msg_size = sizeof msg;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu isa=%s: %s [%s]", spec, d, kvq_isa_name(isa),
              kvq_strerror(st), msg);
    if (st != KVQ_OK)
        return NULL;
    if (kvq_codec_needs_fit(c)) {
        st = kvq_codec_fit(c, fit, nfit);
        TU_REPORT(st == KVQ_OK, "fit %s d=%zu: %s", spec, d, kvq_strerror(st));
    }
    return c;
}

static double dot(const float *a, const float *b, size_t d) {
    double s = 0;
    for (size_t i = 0; i < d; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* One codec at one head_dim on one path. */
static void check_codec(const char *spec, size_t d, kvq_isa isa, tu_rng *rng) {
    /* nuq is fitted on nfit samples and measured on n others: a test value
     * past its channel's fitted range (probability 2/(nfit + 1) each, by
     * exchangeability) is clipped to the extreme level; at small d few
     * channels average such a tail out, so they get more fit samples */
    const size_t n = 67, nq = 3, nfit = d >= 16 ? 512 : 8192 / d;
    float *x = malloc(sizeof(float) * n * d), *fit = malloc(sizeof(float) * nfit * d);
    float *y = malloc(sizeof(float) * n * d), *q = malloc(sizeof(float) * nq * d);
    tu_fill_gauss(rng, x, n * d, 1.0f);
    tu_fill_gauss(rng, fit, nfit * d, 1.0f);
    tu_fill_gauss(rng, q, nq * d, 1.0f);
    kvq_codec *c = make(spec, d, isa, fit, nfit);
    if (!c)
        goto out;
    size_t vb = kvq_codec_vector_bytes(c);
    CHECK(vb > 0);
    CHECK_NEAR(kvq_codec_bits_per_value(c), vb * 8.0 / d, 1e-12);
    CHECK_EQ(kvq_codec_encode_bound(c, n), n * vb);
    CHECK_EQ(kvq_codec_head_dim(c), d);
    uint8_t *enc = malloc(n * vb + 1), *enc2 = malloc(n * vb + 1);

    /* round trip */
    CHECK_OK(kvq_codec_encode(c, enc, n * vb, x, n));
    CHECK_OK(kvq_codec_decode(c, y, n * d, enc, n * vb));
    double e = 0, s = 0;
    int finite = 1;
    for (size_t i = 0; i < n * d; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s += (double)x[i] * x[i];
        finite &= isfinite(y[i]) != 0;
    }
    CHECK(finite);
    /* tqp at small d: one d x d sketch is a small sample of the QJL
     * estimator (the default seed's nmse exceeds 1 at d = 3), so its mean over 8
     * sketches is held to the bound */
    int seeds = !strncmp(spec, "tqp", 3) && d > 1 && d <= 16 ? 8 : 1;
    double nm = e / s;
    for (int k = 1; k < seeds; k++) {
        char sp[64];
        snprintf(sp, sizeof sp, "%s:seed=%d", spec, k);
        kvq_codec *cs = make(sp, d, isa, fit, nfit);
        if (!cs)
            continue;
        CHECK_OK(kvq_codec_encode(cs, enc2, n * vb, x, n));
        CHECK_OK(kvq_codec_decode(cs, y, n * d, enc2, n * vb));
        double ek = 0;
        for (size_t i = 0; i < n * d; i++)
            ek += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        nm += ek / s;
        kvq_codec_free(cs);
    }
    nm /= seeds;
    if (seeds > 1) /* y back to the default seed's decoding */
        CHECK_OK(kvq_codec_decode(c, y, n * d, enc, n * vb));
    double bound = nmse_bound(spec, d, x, n, seeds);
    TU_REPORT(bound < 1, "%s d=%zu: nmse bound %.3g would accept a decode to zero", spec, d, bound);
    TU_REPORT(nm <= bound, "%s d=%zu %s: nmse %.4g%s > %.4g", spec, d, kvq_isa_name(isa), nm,
              seeds > 1 ? " (mean of 8 sketches)" : "", bound);

    /* score == <q, decode(k)> within the path's bound (score_bound) */
    float *sc = malloc(sizeof(float) * nq * n);
    CHECK_OK(kvq_codec_score(c, sc, nq * n, q, nq, enc, n * vb));
    int bad = 0;
    double worst = 0;
    for (size_t i = 0; i < nq; i++)
        for (size_t j = 0; j < n; j++) {
            double ref = dot(q + i * d, y + j * d, d);
            double lim = score_bound(spec, d, kvq_codec_isa(c), q + i * d, y + j * d, x + j * d,
                                     enc + j * vb);
            double err = fabs(sc[i * n + j] - ref);
            worst = fmax(worst, err / (lim + 1e-300));
            bad += err > lim;
        }
    TU_REPORT(bad == 0, "%s d=%zu %s: score vs <q,decode> off by %.3gx its bound", spec, d,
              kvq_isa_name(isa), worst);

    /* accumulate == sum_j w_j decode(v_j) */
    float *w = malloc(sizeof(float) * nq * n), *acc = calloc(nq * d, sizeof(float));
    for (size_t i = 0; i < nq * n; i++)
        w[i] = (float)tu_uniform(rng);
    for (size_t i = 0; i < nq * d; i++)
        acc[i] = 0.5f;
    CHECK_OK(kvq_codec_accumulate(c, acc, nq * d, w, nq, enc, n * vb));
    bad = 0;
    worst = 0;
    for (size_t i = 0; i < nq; i++)
        for (size_t t = 0; t < d; t++) {
            double ref = 0.5, mag = 0;
            for (size_t j = 0; j < n; j++) {
                ref += (double)w[i * n + j] * y[j * d + t];
                mag += fabs((double)w[i * n + j] * y[j * d + t]);
            }
            double err = fabs(acc[i * d + t] - ref) / (mag + 1e-3);
            if (err > worst)
                worst = err;
            if (err > 1e-4)
                bad++;
        }
    TU_REPORT(bad == 0, "%s d=%zu %s: accumulate worst rel err %.3g", spec, d, kvq_isa_name(isa),
              worst);

    /* cross path: encode scalar, decode here, and vice versa */
    kvq_codec *r = make(spec, d, KVQ_ISA_SCALAR, fit, nfit);
    if (r) {
        /* codec state (nuq tables, a norm=8 range) fitted on the same data
         * on either path must be identical, byte for byte */
        size_t sz_c = 0, sz_r = 0;
        CHECK_OK(kvq_codec_save_state(c, NULL, 0, &sz_c));
        CHECK_OK(kvq_codec_save_state(r, NULL, 0, &sz_r));
        CHECK_EQ(sz_c, sz_r);
        if (sz_c == sz_r && sz_c > 0) {
            uint8_t *st_c = malloc(sz_c), *st_r = malloc(sz_r);
            CHECK_OK(kvq_codec_save_state(c, st_c, sz_c, &sz_c));
            CHECK_OK(kvq_codec_save_state(r, st_r, sz_r, &sz_r));
            TU_REPORT(memcmp(st_c, st_r, sz_c) == 0, "%s d=%zu %s: fitted state differs from the "
                      "scalar path's", spec, d, kvq_isa_name(isa));
            free(st_c), free(st_r);
        }
        CHECK_OK(kvq_codec_encode(r, enc2, n * vb, x, n));
        size_t differ = 0;
        for (size_t i = 0; i < n * vb; i++)
            differ += enc[i] != enc2[i];
        TU_REPORT(differ == 0, "%s d=%zu %s: %zu encoded bytes differ from the scalar reference",
                  spec, d, kvq_isa_name(isa), differ);
        float *y2 = malloc(sizeof(float) * n * d);
        CHECK_OK(kvq_codec_decode(r, y2, n * d, enc, n * vb));
        double md = 0;
        for (size_t i = 0; i < n * d; i++)
            md = fmax(md, fabs(y2[i] - y[i]) / (fabs(y2[i]) + 1e-3));
        TU_REPORT(md <= 1e-4, "%s d=%zu %s: decode differs from reference by %.3g", spec, d,
                  kvq_isa_name(isa), md);
        free(y2);
        kvq_codec_free(r);
    }

    /* bad input: nothing written */
    memset(enc2, 0xab, n * vb + 1);
    x[(n / 2) * d + d / 2] = NAN;
    CHECK_STATUS(kvq_codec_encode(c, enc2, n * vb, x, n), KVQ_ERR_NONFINITE);
    x[(n / 2) * d + d / 2] = INFINITY;
    CHECK_STATUS(kvq_codec_encode(c, enc2, n * vb, x, n), KVQ_ERR_NONFINITE);
    x[(n / 2) * d + d / 2] = 0.0f;
    CHECK_STATUS(kvq_codec_encode(c, enc2, n * vb - 1, x, n), KVQ_ERR_DST_TOO_SMALL);
    int untouched = 1;
    for (size_t i = 0; i < n * vb + 1; i++)
        untouched &= enc2[i] == 0xab;
    CHECK(untouched);
    /* a size that is not a whole number of vectors (with 1-byte vectors it is
     * one vector fewer, which is valid) */
    CHECK_STATUS(kvq_codec_decode(c, y, n * d, enc, n * vb - 1), vb > 1 ? KVQ_ERR_SRC_SIZE : KVQ_OK);
    CHECK_STATUS(kvq_codec_decode(c, y, n * d - 1, enc, n * vb), KVQ_ERR_DST_TOO_SMALL);
    CHECK_STATUS(kvq_codec_score(c, sc, nq * n - 1, q, nq, enc, n * vb), KVQ_ERR_DST_TOO_SMALL);
    q[1] = NAN;
    CHECK_STATUS(kvq_codec_score(c, sc, nq * n, q, nq, enc, n * vb), KVQ_ERR_NONFINITE);
    q[1] = 0.25f;
    w[2] = INFINITY;
    CHECK_STATUS(kvq_codec_accumulate(c, acc, nq * d, w, nq, enc, n * vb), KVQ_ERR_NONFINITE);
    CHECK_STATUS(kvq_codec_encode(c, NULL, 10, x, 1), KVQ_ERR_INVALID_ARG);

    /* zero and huge vectors */
    float *z = calloc(2 * d, sizeof(float));
    for (size_t t = 0; t < d; t++)
        z[d + t] = (t % 3 == 0 ? -1e30f : 1e30f) * (float)(t + 1) / (float)d;
    CHECK_OK(kvq_codec_encode(c, enc2, 2 * vb, z, 2));
    CHECK_OK(kvq_codec_decode(c, y, 2 * d, enc2, 2 * vb));
    finite = 1;
    for (size_t i = 0; i < 2 * d; i++)
        finite &= isfinite(y[i]) != 0;
    TU_REPORT(finite, "%s d=%zu: zero/1e30 vectors decode to non-finite values", spec, d);
    if (strncmp(spec, "nuq", 3) != 0) {
        int zero = 1;
        for (size_t t = 0; t < d; t++)
            zero &= y[t] == 0.0f;
        TU_REPORT(zero, "%s d=%zu: zero vector does not decode to zero", spec, d);
    }
    CHECK_OK(kvq_codec_score(c, sc, 2, q, 1, enc2, 2 * vb));
    TU_REPORT(isfinite(sc[0]) && isfinite(sc[1]), "%s d=%zu: score of zero/1e30 keys not finite",
              spec, d);

    free(z);
    free(w);
    free(acc);
    free(sc);
    free(enc);
    free(enc2);
    kvq_codec_free(c);
out:
    free(x);
    free(y);
    free(q);
    free(fit);
}

static void test_all_codecs(void) {
    const size_t dims[] = {1, 3, 8, 16, 64, 80, 96, 128, 256};
    kvq_isa isas[2] = {KVQ_ISA_SCALAR, KVQ_ISA_AVX2};
    int nisa = kvq_cpu_supports(KVQ_ISA_AVX2) ? 2 : 1;
    if (nisa == 1)
        printf("note: no AVX2 on this CPU; only the scalar path is tested\n");
    uint64_t seed = 20261129;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng rng;
    tu_seed(&rng, seed);
    for (size_t ci = 0; ci < N_CODECS; ci++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const char *spec = all_codecs[ci];
            size_t d = dims[di];
            if (strstr(spec, ":g=8") && d % 8)
                continue;
            for (int ii = 0; ii < nisa; ii++)
                check_codec(spec, d, isas[ii], &rng);
        }
}

/* Every allocation made by create can fail; each failure is clean. */
static void test_alloc_failures(void) {
    const char *specs[] = {"f32", "int4:g=8", "tq3", "tqp3", "nuq3", "tq2"};
    const size_t dims[] = {64, 80};
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t di = 0; di < 2; di++) {
            int created = 0;
            for (long k = 1; k < 200 && !created; k++) {
                tu_failalloc fa;
                kvq_allocator a = tu_failalloc_make(&fa, k);
                kvq_codec_params p = {0};
                p.allocator = &a;
                kvq_codec *c = NULL;
                kvq_status st = kvq_codec_create(&c, specs[si], dims[di], &p);
                if (st == KVQ_OK) {
                    created = 1;
                    CHECK(fa.live_blocks > 0);
                    kvq_codec_free(c);
                } else {
                    TU_REPORT(st == KVQ_ERR_NOMEM && c == NULL, "%s: failing alloc %ld gave %s",
                              specs[si], k, kvq_strerror(st));
                }
                TU_REPORT(fa.live_bytes == 0 && fa.live_blocks == 0,
                          "%s d=%zu: %zu bytes leaked after failing alloc %ld", specs[si],
                          dims[di], fa.live_bytes, k);
            }
            TU_REPORT(created, "%s never created", specs[si]);
        }
}

/* The NaN/Inf check before encoding, at every position of the SIMD blocks
 * and the scalar tail, against values that are large or tiny but finite. */
static void test_finite_check(void) {
    const size_t d = 37, n = 3, m = n * d; /* 111 floats: three 32-value blocks and a tail */
    kvq_codec *c = NULL;
    CHECK_OK(kvq_codec_create(&c, "f32", d, NULL));
    if (!c)
        return;
    float x[111];
    uint8_t out[111 * 4];
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const float good[] = {FLT_MAX, -FLT_MAX, 1e-45f, -0.0f, 1e30f};
    size_t wrong = 0;
    for (size_t p = 0; p < m; p++) {
        for (size_t i = 0; i < m; i++)
            x[i] = (float)i - 50.0f;
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            x[p] = bad[b];
            wrong += kvq_codec_encode(c, out, sizeof out, x, n) != KVQ_ERR_NONFINITE;
        }
        for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
            x[p] = good[g];
            wrong += kvq_codec_encode(c, out, sizeof out, x, n) != KVQ_OK;
        }
    }
    TU_REPORT(wrong == 0, "finite check: %zu positions/values misjudged", wrong);
    kvq_codec_free(c);
}

/* The int kernels check finiteness inside their encode (encode_chk: the
 * first of two passes reduces the groups and finds NaN/Inf, the second
 * writes codes): NaN/Inf anywhere, in every group position and lane, gives
 * KVQ_ERR_NONFINITE with dst untouched; extreme finite values encode
 * bit-exactly as the scalar reference; inputs whose scratch does not fit on
 * the stack take the heap, and when that allocation fails the encode falls
 * back to check-then-encode with the same bytes. */
static void check_fused_encode(const char *spec, kvq_isa isa, tu_rng *rng) {
    const size_t d = 128, n = 3, nbig = 1500;
    kvq_codec *c = make(spec, d, isa, NULL, 0), *r = make(spec, d, KVQ_ISA_SCALAR, NULL, 0);
    const size_t vb = c ? kvq_codec_vector_bytes(c) : 0;
    float *x = malloc(sizeof(float) * nbig * d);
    uint8_t *out = malloc(nbig * vb + 1), *ref = malloc(nbig * vb + 1);
    if (!c || !r || !x || !out || !ref)
        goto done;
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    const float good[] = {FLT_MAX, -FLT_MAX, 1e-45f, -0.0f, 1e30f, -1e-30f};
    size_t wrong = 0, touched = 0, differ = 0;
    for (size_t p = 0; p < n * d; p++) {
        for (size_t i = 0; i < n * d; i++)
            x[i] = (float)tu_gauss(rng);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            x[p] = bad[b];
            memset(out, 0xab, n * vb);
            wrong += kvq_codec_encode(c, out, n * vb, x, n) != KVQ_ERR_NONFINITE;
            for (size_t i = 0; i < n * vb; i++)
                touched += out[i] != 0xab;
        }
        for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
            x[p] = good[g];
            wrong += kvq_codec_encode(c, out, n * vb, x, n) != KVQ_OK;
            wrong += kvq_codec_encode(r, ref, n * vb, x, n) != KVQ_OK;
            differ += memcmp(out, ref, n * vb) != 0;
        }
    }
    TU_REPORT(wrong == 0 && touched == 0 && differ == 0,
              "%s %s fused check: %zu misjudged, %zu bytes touched on error, %zu encodings "
              "differ from the reference",
              spec, kvq_isa_name(isa), wrong, touched, differ);
    /* a long input (heap scratch): bad value first, last, or none */
    for (size_t i = 0; i < nbig * d; i++)
        x[i] = (float)tu_gauss(rng);
    const size_t at[] = {0, nbig * d - 1, (nbig / 2) * d + 7};
    wrong = touched = 0;
    for (size_t k = 0; k < 3; k++) {
        x[at[k]] = NAN;
        memset(out, 0xab, nbig * vb);
        wrong += kvq_codec_encode(c, out, nbig * vb, x, nbig) != KVQ_ERR_NONFINITE;
        for (size_t i = 0; i < nbig * vb; i++)
            touched += out[i] != 0xab;
        x[at[k]] = 1.0f;
    }
    CHECK_OK(kvq_codec_encode(c, out, nbig * vb, x, nbig));
    CHECK_OK(kvq_codec_encode(r, ref, nbig * vb, x, nbig));
    TU_REPORT(wrong == 0 && touched == 0 && memcmp(out, ref, nbig * vb) == 0,
              "%s %s, %zu vectors: %zu misjudged, %zu bytes touched, codes %s the reference", spec,
              kvq_isa_name(isa), nbig, wrong, touched,
              memcmp(out, ref, nbig * vb) ? "differ from" : "equal");
    /* more than 1 MiB of codes: the kernels reduce every group first
     * instead of encoding into scratch */
    {
        const size_t nh = ((size_t)1 << 20) / vb + 9;
        float *xh = malloc(sizeof(float) * nh * d);
        uint8_t *oh = malloc(nh * vb), *rh = malloc(nh * vb);
        if (xh && oh && rh) {
            for (size_t i = 0; i < nh * d; i++)
                xh[i] = (float)tu_gauss(rng);
            xh[nh * d - 3] = -INFINITY;
            memset(oh, 0xab, nh * vb);
            size_t t2 = 0;
            kvq_status st = kvq_codec_encode(c, oh, nh * vb, xh, nh);
            for (size_t i = 0; i < nh * vb; i++)
                t2 += oh[i] != 0xab;
            xh[nh * d - 3] = 0.5f;
            CHECK_OK(kvq_codec_encode(c, oh, nh * vb, xh, nh));
            CHECK_OK(kvq_codec_encode(r, rh, nh * vb, xh, nh));
            TU_REPORT(st == KVQ_ERR_NONFINITE && t2 == 0 && memcmp(oh, rh, nh * vb) == 0,
                      "%s %s, %zu vectors: %s, %zu bytes touched, codes %s the reference", spec,
                      kvq_isa_name(isa), nh, kvq_strerror(st), t2,
                      memcmp(oh, rh, nh * vb) ? "differ from" : "equal");
        }
        free(xh);
        free(oh);
        free(rh);
    }
    /* every allocation of create + encode failing in turn */
    wrong = 0;
    for (long k = 1; k < 40; k++) {
        tu_failalloc fa;
        kvq_allocator a = tu_failalloc_make(&fa, k);
        kvq_codec_params p = {0};
        p.allocator = &a;
        p.isa = isa;
        kvq_codec *f = NULL;
        if (kvq_codec_create(&f, spec, d, &p) != KVQ_OK)
            continue;
        memset(out, 0, nbig * vb);
        wrong += kvq_codec_encode(f, out, nbig * vb, x, nbig) != KVQ_OK;
        wrong += memcmp(out, ref, nbig * vb) != 0;
        kvq_codec_free(f);
    }
    TU_REPORT(wrong == 0, "%s %s: %zu encodes failed or differ under failing allocations", spec,
              kvq_isa_name(isa), wrong);
done:
    kvq_codec_free(c);
    kvq_codec_free(r);
    free(x);
    free(out);
    free(ref);
}

static void test_fused_check(void) {
    const char *specs[] = {"int8", "int8:g=32", "int4", "int4:g=32", "int4:g=8", "int2:g=32"};
    kvq_isa isas[4] = {KVQ_ISA_SCALAR, KVQ_ISA_AVX2, KVQ_ISA_AVX512, KVQ_ISA_AVXVNNI};
    tu_rng rng;
    tu_seed(&rng, 20261201);
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (int ii = 0; ii < 4; ii++)
            if (kvq_cpu_supports(isas[ii]))
                check_fused_encode(specs[si], isas[ii], &rng);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_errors();
    test_spec_parsing();
    test_half_floats();
    test_finite_check();
    test_fused_check();
    test_all_codecs();
    test_alloc_failures();
    return tu_finish();
}
