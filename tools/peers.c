/*
 * peers.c - q8_0 / q4_0 baselines for `kvq bench codecs` (see peers.h).
 *
 * Block layouts (little-endian): q8_0 = [fp16 d][32 x int8], 34 bytes;
 * q4_0 = [fp16 d][16 bytes of nibbles], 18 bytes. Quantization rules:
 * q8_0 d = absmax/127, q = round(x/d); q4_0 d = m/-8 with m the value of
 * largest magnitude, q = min(15, trunc(x * (1/d) + 8.5)) (a multiply, then an
 * add, in both paths). The dot product of a
 * q4_0 row with a q8_0 query sums, per block, d_x d_y sum_j (q4_j - 8) q8_j.
 * The AVX2 kernels round to nearest even where the scalar rule rounds half
 * away from zero (q8_0); they are checked against the scalar code after
 * the timed loops.
 */
#include "peers.h"

#include "kvq.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQP_X86 1
#endif

#define KVQP_QK 32
#define KVQP_Q8_BYTES 34
#define KVQP_Q4_BYTES 18
#define KVQP_HOT 64

/* ---- scalar reference ---- */
static void kvqp_q8_scalar(uint8_t *dst, const float *x, size_t nblk) {
    for (size_t b = 0; b < nblk; b++, x += KVQP_QK, dst += KVQP_Q8_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < KVQP_QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = kvq_f32_to_f16(d);
        memcpy(dst, &h, 2);
        for (int j = 0; j < KVQP_QK; j++)
            dst[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

static void kvqp_q4_scalar(uint8_t *dst, const float *x, size_t nblk) {
    for (size_t b = 0; b < nblk; b++, x += KVQP_QK, dst += KVQP_Q4_BYTES) {
        float hi = x[0], lo = x[0];
        for (int j = 1; j < KVQP_QK; j++) {
            hi = fmaxf(hi, x[j]);
            lo = fminf(lo, x[j]);
        }
        float m = -lo > hi ? lo : hi; /* the value of largest magnitude (a tie: the positive) */
        float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = kvq_f32_to_f16(d);
        memcpy(dst, &h, 2);
        for (int j = 0; j < KVQP_QK / 2; j++) {
            int a = (int)(x[j] * id + 8.5f), c = (int)(x[16 + j] * id + 8.5f);
            a = a > 15 ? 15 : a;
            c = c > 15 ? 15 : c;
            dst[2 + j] = (uint8_t)(a | (c << 4));
        }
    }
}

static float kvqp_dot_scalar(const uint8_t *row, const uint8_t *q8, size_t nblk) {
    float s = 0.0f;
    for (size_t b = 0; b < nblk; b++, row += KVQP_Q4_BYTES, q8 += KVQP_Q8_BYTES) {
        uint16_t hx, hy;
        memcpy(&hx, row, 2);
        memcpy(&hy, q8, 2);
        int acc = 0;
        for (int j = 0; j < KVQP_QK / 2; j++) {
            acc += ((row[2 + j] & 15) - 8) * (int8_t)q8[2 + j];
            acc += ((row[2 + j] >> 4) - 8) * (int8_t)q8[2 + 16 + j];
        }
        s += kvq_f16_to_f32(hx) * kvq_f16_to_f32(hy) * (float)acc;
    }
    return s;
}

/* ---- AVX2 ---- */
#ifdef KVQP_X86
#define KVQP_AVX2 __attribute__((target("avx2,fma,f16c")))

KVQP_AVX2 static float kvqp_hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

KVQP_AVX2 static void kvqp_q8_avx2(uint8_t *dst, const float *x, size_t nblk) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (size_t b = 0; b < nblk; b++, x += KVQP_QK, dst += KVQP_Q8_BYTES) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        float d = kvqp_hmax(a) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(dst, &h, 2);
        __m256 m = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, m)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, m));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, m)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, m));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(void *)(dst + 2), _mm256_permutevar8x32_epi32(p, fix));
    }
}

KVQP_AVX2 static void kvqp_q4_avx2(uint8_t *dst, const float *x, size_t nblk) {
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256 half8 = _mm256_set1_ps(8.5f);
    const __m256i fifteen = _mm256_set1_epi32(15);
    for (size_t b = 0; b < nblk; b++, x += KVQP_QK, dst += KVQP_Q4_BYTES) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3));
        __m256 mn = _mm256_min_ps(_mm256_min_ps(v0, v1), _mm256_min_ps(v2, v3));
        float hi = kvqp_hmax(mx), lo = -kvqp_hmax(_mm256_sub_ps(_mm256_setzero_ps(), mn));
        float m = -lo > hi ? lo : hi;
        float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(dst, &h, 2);
        __m256 s = _mm256_set1_ps(id);
        __m256i i0 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v0, s), half8)), fifteen);
        __m256i i1 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v1, s), half8)), fifteen);
        __m256i i2 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v2, s), half8)), fifteen);
        __m256i i3 = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v3, s), half8)), fifteen);
        __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, fix); /* bytes 0..31 in value order */
        __m128i l = _mm256_castsi256_si128(p), u = _mm256_extracti128_si256(p, 1);
        __m128i nib = _mm_or_si128(l, _mm_slli_epi16(u, 4)); /* u < 16: no carry across bytes */
        _mm_storeu_si128((__m128i *)(void *)(dst + 2), nib);
    }
}

/* One q4_0 block against one q8_0 block: the int32 lanes of sum (q4-8) q8. */
KVQP_AVX2 static inline __m256i kvqp_blk_avx2(const uint8_t *bx4, const uint8_t *by8) {
    const __m256i lo4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)bx4);
    __m256i bx = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    bx = _mm256_sub_epi8(_mm256_and_si256(bx, lo4), eight);
    __m256i by = _mm256_loadu_si256((const __m256i *)(const void *)by8);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(bx, bx), _mm256_sign_epi8(by, bx)),
                             ones);
}

/* Two blocks per step with two sums (the FMA latency of one overlaps the
 * other); scales through F16C. */
KVQP_AVX2 static float kvqp_dot_avx2(const uint8_t *row, const uint8_t *q8, size_t nblk) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    size_t b = 0;
    for (; b + 2 <= nblk; b += 2, row += 2 * KVQP_Q4_BYTES, q8 += 2 * KVQP_Q8_BYTES) {
        uint16_t h[4];
        memcpy(&h[0], row, 2);
        memcpy(&h[1], row + KVQP_Q4_BYTES, 2);
        memcpy(&h[2], q8, 2);
        memcpy(&h[3], q8 + KVQP_Q8_BYTES, 2);
        __m128 f = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)h));
        __m128 dd = _mm_mul_ps(f, _mm_movehl_ps(f, f)); /* dx0 dy0, dx1 dy1 */
        a0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(kvqp_blk_avx2(row + 2, q8 + 2)), a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                             _mm256_cvtepi32_ps(kvqp_blk_avx2(row + KVQP_Q4_BYTES + 2, q8 + KVQP_Q8_BYTES + 2)), a1);
    }
    for (; b < nblk; b++, row += KVQP_Q4_BYTES, q8 += KVQP_Q8_BYTES) {
        uint16_t hx, hy;
        memcpy(&hx, row, 2);
        memcpy(&hy, q8, 2);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(hx) * _cvtsh_ss(hy)),
                             _mm256_cvtepi32_ps(kvqp_blk_avx2(row + 2, q8 + 2)), a0);
    }
    __m256 acc = _mm256_add_ps(a0, a1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* ---- measurement ---- */
typedef struct {
    int op; /* 0 q8, 1 q4, 2 q8 hot, 3 q4 hot, 4 dot */
    int avx2;
    const float *x;
    size_t n, d;
    uint8_t *out;
    const uint8_t *rows, *q8;
    float *scores;
} kvqp_ctx;

static void kvqp_quant(int q4, int avx2, uint8_t *dst, const float *x, size_t nblk) {
#ifdef KVQP_X86
    if (avx2) {
        if (q4)
            kvqp_q4_avx2(dst, x, nblk);
        else
            kvqp_q8_avx2(dst, x, nblk);
        return;
    }
#endif
    (void)avx2;
    if (q4)
        kvqp_q4_scalar(dst, x, nblk);
    else
        kvqp_q8_scalar(dst, x, nblk);
}

void kvqp_quantize_q8_0(uint8_t *dst, const float *x, size_t nblk, int use_avx2) {
    kvqp_quant(0, use_avx2, dst, x, nblk);
}

void kvqp_quantize_q4_0(uint8_t *dst, const float *x, size_t nblk, int use_avx2) {
    kvqp_quant(1, use_avx2, dst, x, nblk);
}

static float kvqp_dot(int avx2, const uint8_t *row, const uint8_t *q8, size_t nblk) {
#ifdef KVQP_X86
    if (avx2)
        return kvqp_dot_avx2(row, q8, nblk);
#endif
    (void)avx2;
    return kvqp_dot_scalar(row, q8, nblk);
}

static int kvqp_run(void *p) {
    kvqp_ctx *c = (kvqp_ctx *)p;
    const size_t nb = c->d / KVQP_QK;
    switch (c->op) {
    case 0:
    case 1:
        kvqp_quant(c->op == 1, c->avx2, c->out, c->x, c->n * nb);
        break;
    case 2:
    case 3: {
        size_t m = c->n < KVQP_HOT ? c->n : KVQP_HOT;
        for (size_t v = 0; v < c->n; v += m)
            kvqp_quant(c->op == 3, c->avx2, c->out, c->x, m * nb);
        break;
    }
    default: {
        const size_t rb = nb * KVQP_Q4_BYTES;
        for (size_t r = 0; r < c->n; r++)
            c->scores[r] = kvqp_dot(c->avx2, c->rows + r * rb, c->q8, nb);
    }
    }
    return 0;
}

static double kvqp_time(kvqp_ctx *c, const kvqb_config *cfg) {
    kvqb_stats st;
    return kvqb_measure(kvqp_run, c, cfg, &st) == 0 ? st.median_s : 0.0;
}

int kvqp_measure(const float *x, size_t n, size_t d, const float *q, const kvqb_config *cfg,
                 int use_avx2, kvqp_result *r) {
    memset(r, 0, sizeof *r);
#ifndef KVQP_X86
    use_avx2 = 0;
#endif
    if (d % KVQP_QK != 0 || n == 0)
        return 0;
    const size_t nb = d / KVQP_QK, hot = n < KVQP_HOT ? n : KVQP_HOT;
    const size_t hot_total = (n + hot - 1) / hot * hot;
    uint8_t *out = malloc(n * nb * KVQP_Q8_BYTES), *rows = malloc(n * nb * KVQP_Q4_BYTES);
    uint8_t *q8 = malloc(nb * KVQP_Q8_BYTES), *chk = malloc(nb * KVQP_Q8_BYTES);
    float *scores = malloc(n * sizeof(float));
    int rc = -1;
    if (!out || !rows || !q8 || !chk || !scores)
        goto done;
    r->avx2 = use_avx2;
    kvqp_ctx c = {0, use_avx2, x, n, d, out, rows, q8, scores};
    const double in_bytes = (double)n * (double)d * 4.0;
    double t;
    if ((t = kvqp_time(&c, cfg)) > 0)
        r->q8_quant_gbps = in_bytes / t * 1e-9;
    c.op = 2;
    if ((t = kvqp_time(&c, cfg)) > 0)
        r->q8_quant_hot_gbps = (double)hot_total * (double)d * 4.0 / t * 1e-9;
    c.op = 1;
    c.out = rows;
    if ((t = kvqp_time(&c, cfg)) > 0)
        r->q4_quant_gbps = in_bytes / t * 1e-9;
    c.op = 3;
    c.out = out; /* (rows keeps the full q4_0 set for the dot product) */
    if ((t = kvqp_time(&c, cfg)) > 0)
        r->q4_quant_hot_gbps = (double)hot_total * (double)d * 4.0 / t * 1e-9;
    kvqp_quant(0, use_avx2, q8, q, nb);
    c.op = 4;
    if ((t = kvqp_time(&c, cfg)) > 0)
        r->q4_dot_rows_per_s = (double)n / t;

    /* checks after the timed loops: the kernels against the scalar rules
     * (q4_0 bytes equal; dot within float rounding of the same integers) */
    int good = 1;
    uint8_t blk[KVQP_Q4_BYTES];
    double num = 0, den = 0;
    for (size_t v = 0; v < n && good; v++) {
        const uint8_t *rv = rows + v * nb * KVQP_Q4_BYTES;
        for (size_t b = 0; b < nb; b++) {
            kvqp_q4_scalar(blk, x + v * d + b * KVQP_QK, 1);
            good &= memcmp(blk, rv + b * KVQP_Q4_BYTES, KVQP_Q4_BYTES) == 0;
            float dx;
            uint16_t h;
            memcpy(&h, rv + b * KVQP_Q4_BYTES, 2);
            dx = kvq_f16_to_f32(h);
            for (int j = 0; j < KVQP_QK; j++) {
                int qv = j < 16 ? rv[b * KVQP_Q4_BYTES + 2 + j] & 15 : rv[b * KVQP_Q4_BYTES + 2 + j - 16] >> 4;
                double e = (double)x[v * d + b * KVQP_QK + j] - dx * (qv - 8);
                num += e * e;
                den += (double)x[v * d + b * KVQP_QK + j] * x[v * d + b * KVQP_QK + j];
            }
        }
        float ref = kvqp_dot_scalar(rv, q8, nb);
        good &= fabsf(scores[v] - ref) <= 1e-4f * (fabsf(ref) + 1.0f) * (float)nb;
    }
    kvqp_q8_scalar(chk, q, nb);
    for (size_t i = 0; i < nb * KVQP_Q8_BYTES; i++) /* half-way cases may round differently */
        good &= abs((int)(int8_t)chk[i] - (int)(int8_t)q8[i]) <= 1 || i % KVQP_Q8_BYTES < 2;
    r->q4_nmse = den > 0 ? num / den : 0.0;
    r->ok = good;
    rc = 0;
done:
    free(out);
    free(rows);
    free(q8);
    free(chk);
    free(scores);
    return rc;
}
