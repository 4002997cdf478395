/*
 * float_avx2.c - AVX2 kernels of f32/f16/bf16: conversion with F16C (f16
 * values are clamped to +-65504 first so the hardware rounding matches the
 * saturating reference bit for bit), and multi-query score / accumulate with
 * FMA. Used when head_dim is a multiple of 8.
 */
#include "../kernels.h"
#include "simd_avx2.h"

static inline __attribute__((always_inline)) __m256 kvq__fload(int kind, const uint8_t *p,
                                                              size_t t) {
    if (kind == KVQ__F32)
        return _mm256_loadu_ps((const float *)(const void *)(p + 4 * t));
    if (kind == KVQ__F16)
        return kvq__load_f16x8(p + 2 * t);
    return kvq__load_bf16x8(p + 2 * t);
}

static void kvq__float_encode_avx2(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    size_t m = n * c->d;
    if (c->kind == KVQ__F32) {
        memcpy(dst, src, m * 4);
        return;
    }
    size_t i = 0;
    if (c->kind == KVQ__F16) {
        const __m256 lim = _mm256_set1_ps(65504.0f), nlim = _mm256_set1_ps(-65504.0f);
        for (; i + 8 <= m; i += 8) {
            __m256 x = _mm256_loadu_ps(src + i);
            x = _mm256_min_ps(_mm256_max_ps(x, nlim), lim);
            _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        }
        for (; i < m; i++)
            kvq__st16(dst + 2 * i, kvq__f16_from_f32(src[i]));
    } else {
        const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
        for (; i + 16 <= m; i += 16) {
            __m256i a = _mm256_castps_si256(_mm256_loadu_ps(src + i));
            __m256i b = _mm256_castps_si256(_mm256_loadu_ps(src + i + 8));
            a = _mm256_srli_epi32(
                _mm256_add_epi32(a, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(a, 16), one))), 16);
            b = _mm256_srli_epi32(
                _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one))), 16);
            __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
            _mm256_storeu_si256((__m256i *)(dst + 2 * i), p);
        }
        for (; i < m; i++)
            kvq__st16(dst + 2 * i, kvq__bf16_from_f32(src[i]));
    }
}

static void kvq__float_decode_avx2(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    size_t m = n * c->d;
    if (c->kind == KVQ__F32) {
        memcpy(dst, src, m * 4);
        return;
    }
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(dst + i, kvq__fload(c->kind, src, i));
    for (; i < m; i++) {
        uint16_t h = kvq__ld16(src + 2 * i);
        dst[i] = c->kind == KVQ__F16 ? kvq__f16_to_f32(h) : kvq__bf16_to_f32(h);
    }
}

static void kvq__float_score_avx2(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                  size_t nq, const uint8_t *keys, size_t n) {
    const float *q = (const float *)qp;
    const size_t qs = c->qp_bytes / sizeof(float), d = c->d;
    const int kind = c->kind;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *q0 = q + i0 * qs;
        const float *q1 = q0 + (g > 1 ? qs : 0), *q2 = q0 + (g > 2 ? 2 * qs : 0),
                    *q3 = q0 + (g > 3 ? 3 * qs : 0);
        for (size_t j = 0; j < n; j++) {
            const uint8_t *k = keys + j * c->bytes;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t t = 0; t < d; t += 8) {
                __m256 kv = kvq__fload(kind, k, t);
                a0 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q0 + t), a0);
                a1 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q1 + t), a1);
                a2 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q2 + t), a2);
                a3 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q3 + t), a3);
            }
            float r[4];
            _mm_storeu_ps(r, kvq__hsum4x256(a0, a1, a2, a3));
            for (size_t i = 0; i < g; i++)
                out[(i0 + i) * ostride + j] = r[i];
        }
    }
}

/* Register-blocked: for each 16-value column strip, up to 4 weight rows
 * accumulate in registers over all n values, so acc is loaded and stored
 * once per strip instead of once per value. */
/* acc[r][c..c+8*NS) += sum_j w[r][j] v_j[c..] for 2 rows and NS <= 6
 * vectors of 8 columns: 2 NS accumulators, 2 broadcast weights per value
 * row, 192 of the row's 512 bytes (f32) read at a time instead of 64 (the
 * 4-row strips below step from row to row 64 bytes at a time, an order
 * the prefetchers follow poorly: f32 at 32k streaming -12%; f16 showed no
 * gain and keeps the 4-row strips). The sums are formed in the same order
 * as by the 4-row strips, so the results are the same.
 * Prefetch: the next page's area (kvq__pf_next, its n * vb
 * bytes) is asked for at an even pace (kvq__pace), a share per value row of
 * every strip of both row pairs: f32 at 32k 26% shorter than the whole area
 * in the first strip, 8 lines per row, whose burst filled the L1's miss
 * buffers while the FMAs of the other strips left the memory idle. The
 * 4-row strips (f16, bf16) spread it over their first quarter: -5% against
 * the first strip; over all of them was even (their FMAs outlast the
 * memory's time). */
static inline __attribute__((always_inline)) void
kvq__accum2_strip(const int kind, const int NS, float *a0, float *a1, const float *w0,
                  const float *w1, const uint8_t *vals, size_t vb, size_t c, size_t n,
                  kvq__pace *pc) {
    __m256 x[6], y[6];
#pragma GCC unroll 6
    for (int k = 0; k < NS; k++)
        x[k] = y[k] = _mm256_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = vals + j * vb;
        kvq__pace_step(pc);
        const __m256 b0 = _mm256_broadcast_ss(w0 + j), b1 = _mm256_broadcast_ss(w1 + j);
#pragma GCC unroll 6
        for (int k = 0; k < NS; k++) {
            const __m256 vv = kvq__fload(kind, v, c + 8 * (size_t)k);
            x[k] = _mm256_fmadd_ps(b0, vv, x[k]);
            y[k] = _mm256_fmadd_ps(b1, vv, y[k]);
        }
    }
#pragma GCC unroll 6
    for (int k = 0; k < NS; k++) {
        float *p = a0 + c + 8 * k;
        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), x[k]));
        if (a1) {
            p = a1 + c + 8 * k;
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), y[k]));
        }
    }
}

static inline __attribute__((always_inline)) void
kvq__float_accum_k(const int kind, const kvq_codec *c, float *acc, size_t astride, const float *w,
                   size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    const size_t d = c->d, vb = c->bytes;
    if (kind == KVQ__F32 && d % 16 == 0) { /* strips of 48, 32, 16 columns for 2 rows */
        const size_t ns = d / 48 + (d % 48 >= 32) + (d % 48 % 32) / 16;
        kvq__pace pc = kvq__pace_make(n * vb, (uint64_t)(nq + 1) / 2 * ns * n, 1);
        for (size_t i0 = 0; i0 < nq; i0 += 2) {
            const int two = i0 + 1 < nq;
            float *a0 = acc + i0 * astride, *a1 = two ? a0 + astride : NULL;
            const float *w0 = w + i0 * wstride, *w1 = w + (i0 + two) * wstride;
            size_t col = 0;
            for (; col + 48 <= d; col += 48)
                kvq__accum2_strip(kind, 6, a0, a1, w0, w1, vals, vb, col, n, &pc);
            for (; col + 32 <= d; col += 32)
                kvq__accum2_strip(kind, 4, a0, a1, w0, w1, vals, vb, col, n, &pc);
            for (; col < d; col += 16)
                kvq__accum2_strip(kind, 2, a0, a1, w0, w1, vals, vb, col, n, &pc);
        }
        return;
    }
    kvq__pace pc = kvq__pace_make(n * vb, (uint64_t)(nq + 3) / 4 * ((d + 15) / 16) * n, 4);
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *w0 = w + i0 * wstride;
        const float *w1 = g > 1 ? w0 + wstride : w0, *w2 = g > 2 ? w0 + 2 * wstride : w0,
                    *w3 = g > 3 ? w0 + 3 * wstride : w0;
        float *a0 = acc + i0 * astride;
        float *a1 = g > 1 ? a0 + astride : NULL, *a2 = g > 2 ? a0 + 2 * astride : NULL,
              *a3 = g > 3 ? a0 + 3 * astride : NULL;
        for (size_t t = 0; t < d; t += 16) {
            int two = t + 16 <= d;
            __m256 z = _mm256_setzero_ps();
            __m256 x00 = z, x01 = z, x10 = z, x11 = z, x20 = z, x21 = z, x30 = z, x31 = z;
            for (size_t j = 0; j < n; j++) {
                const uint8_t *v = vals + j * vb;
                kvq__pace_step(&pc);
                __m256 v0 = kvq__fload(kind, v, t);
                __m256 v1 = two ? kvq__fload(kind, v, t + 8) : z;
                __m256 b0 = _mm256_broadcast_ss(w0 + j), b1 = _mm256_broadcast_ss(w1 + j);
                __m256 b2 = _mm256_broadcast_ss(w2 + j), b3 = _mm256_broadcast_ss(w3 + j);
                x00 = _mm256_fmadd_ps(b0, v0, x00);
                x01 = _mm256_fmadd_ps(b0, v1, x01);
                x10 = _mm256_fmadd_ps(b1, v0, x10);
                x11 = _mm256_fmadd_ps(b1, v1, x11);
                x20 = _mm256_fmadd_ps(b2, v0, x20);
                x21 = _mm256_fmadd_ps(b2, v1, x21);
                x30 = _mm256_fmadd_ps(b3, v0, x30);
                x31 = _mm256_fmadd_ps(b3, v1, x31);
            }
            float *rows[4] = {a0, a1, a2, a3};
            __m256 xs[4][2] = {{x00, x01}, {x10, x11}, {x20, x21}, {x30, x31}};
            for (size_t r = 0; r < g; r++) {
                float *a = rows[r] + t;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), xs[r][0]));
                if (two)
                    _mm256_storeu_ps(a + 8, _mm256_add_ps(_mm256_loadu_ps(a + 8), xs[r][1]));
            }
        }
    }
}

static void kvq__float_accum_avx2(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                  size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    if (c->kind == KVQ__F32)
        kvq__float_accum_k(KVQ__F32, c, acc, astride, w, wstride, nq, vals, n);
    else if (c->kind == KVQ__F16)
        kvq__float_accum_k(KVQ__F16, c, acc, astride, w, wstride, nq, vals, n);
    else
        kvq__float_accum_k(KVQ__BF16, c, acc, astride, w, wstride, nq, vals, n);
}

/* Tiled keys ([d][P], P a multiple of 16; codec_impl.h): 16 tokens x 4
 * query rows in 8 accumulators, broadcast query values, no horizontal sum. */
static inline __attribute__((always_inline)) void
kvq__float_tscore_k(const int kind, const kvq_codec *c, float *out, size_t ostride, const void *qp,
                    size_t nq, const uint8_t *page, size_t P) {
    const float *q = (const float *)qp;
    const size_t qs = c->tqp_bytes / sizeof(float), d = c->d, es = c->bytes / c->d;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *q0 = q + i0 * qs;
        const float *q1 = q0 + (g > 1 ? qs : 0), *q2 = q0 + (g > 2 ? 2 * qs : 0),
                    *q3 = q0 + (g > 3 ? 3 * qs : 0);
        for (size_t tb = 0; tb < P; tb += 16) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
                   b3 = a0;
            const uint8_t *nx = kvq__pf_next && i0 == 0 ? kvq__pf_next + tb * es : NULL;
            for (size_t t = 0; t < d; t++) {
                const uint8_t *k = page + (t * P + tb) * es;
                if (nx) /* the same line of the next page */
                    _mm_prefetch((const char *)(nx + t * P * es), _MM_HINT_T0);
                __m256 x = kvq__fload(kind, k, 0), y = kvq__fload(kind, k, 8);
                __m256 s0 = _mm256_broadcast_ss(q0 + t), s1 = _mm256_broadcast_ss(q1 + t);
                __m256 s2 = _mm256_broadcast_ss(q2 + t), s3 = _mm256_broadcast_ss(q3 + t);
                a0 = _mm256_fmadd_ps(s0, x, a0);
                b0 = _mm256_fmadd_ps(s0, y, b0);
                a1 = _mm256_fmadd_ps(s1, x, a1);
                b1 = _mm256_fmadd_ps(s1, y, b1);
                a2 = _mm256_fmadd_ps(s2, x, a2);
                b2 = _mm256_fmadd_ps(s2, y, b2);
                a3 = _mm256_fmadd_ps(s3, x, a3);
                b3 = _mm256_fmadd_ps(s3, y, b3);
            }
            __m256 ra[4] = {a0, a1, a2, a3}, rb[4] = {b0, b1, b2, b3};
            for (size_t i = 0; i < g; i++) {
                _mm256_storeu_ps(out + (i0 + i) * ostride + tb, ra[i]);
                _mm256_storeu_ps(out + (i0 + i) * ostride + tb + 8, rb[i]);
            }
        }
    }
}

static void kvq__float_tscore_avx2(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                   size_t nq, const uint8_t *page, size_t P) {
    if (c->kind == KVQ__F32)
        kvq__float_tscore_k(KVQ__F32, c, out, ostride, qp, nq, page, P);
    else if (c->kind == KVQ__F16)
        kvq__float_tscore_k(KVQ__F16, c, out, ostride, qp, nq, page, P);
    else
        kvq__float_tscore_k(KVQ__BF16, c, out, ostride, qp, nq, page, P);
}

static void kvq__float_tprep_avx2(const kvq_codec *c, void *qp, const float *q) {
    memcpy(qp, q, c->d * sizeof(float));
}

void kvq__float_avx2_select(kvq_codec *c) {
    c->k.tprep = kvq__float_tprep_avx2;
    c->k.tscore = kvq__float_tscore_avx2;
    c->tqp_bytes = kvq__round64(c->d * sizeof(float));
    c->pf_self = c->d % 8 == 0; /* tscore always; accum with d % 8 == 0 */
    c->k.encode = kvq__float_encode_avx2;
    c->k.decode = kvq__float_decode_avx2;
    if (c->d % 8 == 0) {
        c->k.score = kvq__float_score_avx2;
        c->k.accum = kvq__float_accum_avx2;
    }
}
