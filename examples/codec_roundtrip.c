/*
 * codec_roundtrip.c - a kvq codec on its own: encode vectors, decode them,
 * and score queries directly on the encoded bytes, with the error figures
 * of each codec against the f32 originals.
 *
 *   cc -std=c11 -O2 codec_roundtrip.c $(pkg-config --cflags --libs kvq) -lm
 *
 * Checks what theory guarantees and exits 1 when a figure breaks it:
 * - the size: kvq_codec_vector_bytes is what the codec's format stores
 *   (int8: one fp16 scale + head_dim codes; int4:g=32: an fp16 scale and
 *   minimum per group of 32 + head_dim/2 bytes; tqB: an fp16 scale + head_dim
 *   B-bit indices);
 * - int8 and int4 round to the nearest of evenly spaced levels, so no value
 *   is further than half a step from its original (step = absmax/127 for
 *   int8, (max - min)/15 per group for int4); the margin of 5% covers the
 *   fp16 rounding of the stored scale and minimum (2^-11 relative);
 * - TurboQuant-MSE with b bits has a mean squared error of at most
 *   (sqrt(3) pi / 2) 4^-b for a unit vector (Zandieh et al., "TurboQuant",
 *   2025, theorem 1); the mean over 512 vectors is held to that bound;
 * - the fused score equals the dot product with the decoded key, up to the
 *   int8 quantization of the query that the SIMD paths of the int codecs
 *   make (at most max|q|/254 per channel, so |error| <= max|q|/254 *
 *   sum|k|) plus float rounding; tq keys are scored in the rotated domain
 *   (tq4 with an int16 codebook), held to 1e-3 of |q| |k|.
 */
#include <kvq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_DIM 128
#define N_VEC 512
#define N_Q 4

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

/* xorshift64*: uniform in (0, 1) */
static double uniform(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545f4914f6cdd1du) >> 11) * (1.0 / 9007199254740992.0) + 1e-17;
}

static float gauss(void) {
    return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static int failures = 0;

static void expect(int ok, const char *codec, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL %s: %s\n", codec, what);
        failures++;
    }
}

/* Largest distance of a decoded value from its original that rounding to
 * evenly spaced levels allows, for vector x (see the top of the file). */
static double int_bound(const char *spec, const float *x) {
    if (strcmp(spec, "int8") == 0) {
        double amax = 0;
        for (int i = 0; i < HEAD_DIM; i++)
            amax = fmax(amax, fabs(x[i]));
        return 1.05 * 0.5 * amax / 127;
    }
    double worst = 0; /* int4:g=32: the widest group decides */
    for (int g = 0; g < HEAD_DIM; g += 32) {
        double lo = x[g], hi = x[g];
        for (int i = g; i < g + 32; i++) {
            lo = fmin(lo, x[i]);
            hi = fmax(hi, x[i]);
        }
        worst = fmax(worst, 1.05 * 0.5 * (hi - lo) / 15);
    }
    return worst;
}

static void run_codec(const char *spec, const float *x, const float *q) {
    kvq_codec *c;
    char err[256] = "";
    kvq_codec_params params = {0};
    params.err_msg = err;
    params.err_msg_size = sizeof err;
    kvq_status st = kvq_codec_create(&c, spec, HEAD_DIM, &params);
    if (st != KVQ_OK) {
        fprintf(stderr, "FAIL %s: kvq_codec_create: %s (%s)\n", spec, kvq_strerror(st), err);
        failures++;
        return;
    }
    size_t vb = kvq_codec_vector_bytes(c);
    size_t cap = kvq_codec_encode_bound(c, N_VEC);
    unsigned char *bytes = malloc(cap);
    float *y = malloc(sizeof(float) * N_VEC * HEAD_DIM);
    float *scores = malloc(sizeof(float) * N_Q * N_VEC);
    if (!bytes || !y || !scores) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    st = kvq_codec_encode(c, bytes, cap, x, N_VEC);
    if (st == KVQ_OK)
        st = kvq_codec_decode(c, y, (size_t)N_VEC * HEAD_DIM, bytes, vb * N_VEC);
    if (st == KVQ_OK)
        st = kvq_codec_score(c, scores, (size_t)N_Q * N_VEC, q, N_Q, bytes, vb * N_VEC);
    if (st != KVQ_OK) {
        fprintf(stderr, "FAIL %s: %s\n", spec, kvq_strerror(st));
        failures++;
        goto done;
    }

    /* size against the format */
    size_t want = 0;
    int tq_bits = 0;
    if (strcmp(spec, "int8") == 0)
        want = 2 + HEAD_DIM;
    else if (strcmp(spec, "int4:g=32") == 0)
        want = (HEAD_DIM / 32) * 4 + HEAD_DIM / 2;
    else if (sscanf(spec, "tq%d", &tq_bits) == 1)
        want = 2 + (size_t)HEAD_DIM * tq_bits / 8;
    expect(vb == want, spec, "vector_bytes differs from the format");
    expect(fabs(kvq_codec_bits_per_value(c) - vb * 8.0 / HEAD_DIM) < 1e-12, spec,
           "bits_per_value is not vector_bytes * 8 / head_dim");

    /* reconstruction error */
    double err2 = 0, norm2 = 0, unit_mse = 0;
    int over_step = 0;
    for (int j = 0; j < N_VEC; j++) {
        const float *xj = x + (size_t)j * HEAD_DIM, *yj = y + (size_t)j * HEAD_DIM;
        double e = 0, n = 0, emax = 0;
        for (int i = 0; i < HEAD_DIM; i++) {
            double d = (double)xj[i] - yj[i];
            e += d * d;
            n += (double)xj[i] * xj[i];
            emax = fmax(emax, fabs(d));
        }
        err2 += e;
        norm2 += n;
        unit_mse += e / n;
        if (tq_bits == 0 && emax > int_bound(spec, xj))
            over_step++;
    }
    unit_mse /= N_VEC;
    expect(over_step == 0, spec, "a value is further than half a step from its original");
    if (tq_bits > 0)
        expect(unit_mse <= 0.5 * sqrt(3.0) * 3.141592653589793 * pow(4.0, -tq_bits), spec,
               "mean squared error above the TurboQuant bound");

    /* scores on the encoded keys: against the decoded keys (the kernel's
     * own error) and against the originals (what the codec costs) */
    double s_err2 = 0, s_ref2 = 0;
    int score_bad = 0;
    for (int i = 0; i < N_Q; i++) {
        const float *qi = q + (size_t)i * HEAD_DIM;
        double qmax = 0, qn = sqrt(dot(qi, qi, HEAD_DIM));
        for (int c2 = 0; c2 < HEAD_DIM; c2++)
            qmax = fmax(qmax, fabs(qi[c2]));
        for (int j = 0; j < N_VEC; j++) {
            const float *yj = y + (size_t)j * HEAD_DIM;
            double ksum = 0;
            for (int c2 = 0; c2 < HEAD_DIM; c2++)
                ksum += fabs(yj[c2]);
            double s = scores[(size_t)i * N_VEC + j];
            double on_decoded = dot(qi, yj, HEAD_DIM);
            double exact = dot(qi, x + (size_t)j * HEAD_DIM, HEAD_DIM);
            double allowed = tq_bits ? 1e-3 * qn * sqrt(dot(yj, yj, HEAD_DIM))
                                     : 1.01 * qmax / 254 * ksum + 1e-4 * qn;
            if (fabs(s - on_decoded) > allowed)
                score_bad++;
            s_err2 += (s - exact) * (s - exact);
            s_ref2 += exact * exact;
        }
    }
    expect(score_bad == 0, spec, "fused score differs from the dot product with the decoded key");

    printf("%-10s %6.3f bits/value  %4zu bytes/vector  nmse %.2e  unit-vector mse %.2e"
           "  score rel. rms error %.2e  (%s kernels)\n",
           kvq_codec_spec(c), kvq_codec_bits_per_value(c), vb, err2 / norm2, unit_mse,
           sqrt(s_err2 / s_ref2), kvq_isa_name(kvq_codec_isa(c)));
done:
    free(bytes);
    free(y);
    free(scores);
    kvq_codec_free(c);
}

int main(void) {
    static float x[N_VEC * HEAD_DIM], q[N_Q * HEAD_DIM];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = gauss();
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = gauss();

    printf("kvq %s: %d gaussian vectors of head_dim %d, %d queries\n", kvq_version_string(),
           N_VEC, HEAD_DIM, N_Q);
    const char *specs[] = {"int8", "int4:g=32", "tq3", "tq4"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        run_codec(specs[i], x, q);

    /* bad input is refused, and nothing is written */
    kvq_codec *c;
    kvq_status st = kvq_codec_create(&c, "int4:g=48", HEAD_DIM, NULL);
    expect(st == KVQ_ERR_GROUP && c == NULL, "int4:g=48", "a group that does not divide head_dim");
    printf("int4:g=48 with head_dim %d: %s\n", HEAD_DIM, kvq_strerror(st));

    if (failures) {
        fprintf(stderr, "codec_roundtrip: %d check(s) failed\n", failures);
        return 1;
    }
    printf("codec_roundtrip: all checks passed\n");
    return 0;
}
