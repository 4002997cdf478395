/*
 * float_avx512.c - AVX-512 kernels of f32/f16/bf16 (simd_avx512.h says how
 * this file is built natively and through SIMDe):
 *  - tscore over a tiled key page ([d][P] values, P a multiple of 16): for
 *    each block of 16 tokens and 4 query rows, 8 accumulators (4 rows x even
 *    and odd dimensions) of broadcast query value times 16 tokens' values;
 *    no horizontal sum per key.
 *  - accum over value rows: f32 with d % 128 == 0, 2 weight rows x 128
 *    dimensions in 16 registers, the area read row after row (the next
 *    pair of weight rows re-reads it from L1; 32k streaming -12% against
 *    the strips); otherwise strips of up to 80 dimensions x 4 weight rows,
 *    each value row loaded once per strip (f16 rows of 256 bytes: the
 *    strips were 5% faster than whole rows).
 * Results differ from the reference only by the order of the float sums:
 * each is within gamma_d * sum |q_t k_t| (score) or gamma_n * sum |w v|
 * (accum) of exact, gamma_n = n u / (1 - n u), u = 2^-24.
 */
#include "../kernels.h"
#include "simd_avx512.h"

/* Software prefetch distances inside a page's area: the kernels do enough
 * arithmetic per line that the hardware prefetchers alone leave DRAM
 * streams at half speed (measured on Zen 4); the attention driver fetches
 * the start of the next area itself. */
#define KVQ__PF_DIMS 32
#define KVQ__PF_BYTES 2048
KVQ__T512 static inline __attribute__((always_inline)) __m512 kvq__fload16(int kind, const uint8_t *p) {
    if (kind == KVQ__F32)
        return _mm512_loadu_ps((const void *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (kind == KVQ__F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KVQ__T512 static inline __attribute__((always_inline)) void
kvq__tscore_block(int kind, size_t es, size_t d, size_t P, const uint8_t *page, size_t tb,
                  const float *q0, const float *q1, const float *q2, const float *q3, __m512 *r) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const uint8_t *k = page + tb * es, *nx = kvq__pf_next ? kvq__pf_next + tb * es : NULL;
    size_t t = 0;
    for (; t + 2 <= d; t += 2) {
        if (nx) { /* the same lines of the next page */
            _mm_prefetch((const char *)(nx + t * P * es), _MM_HINT_T0);
            _mm_prefetch((const char *)(nx + (t + 1) * P * es), _MM_HINT_T0);
        }
        __m512 x = kvq__fload16(kind, k + t * P * es), y = kvq__fload16(kind, k + (t + 1) * P * es);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[t]), x, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[t]), x, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[t]), x, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[t]), x, a3);
        b0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[t + 1]), y, b0);
        b1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[t + 1]), y, b1);
        b2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[t + 1]), y, b2);
        b3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[t + 1]), y, b3);
    }
    if (t < d) {
        __m512 x = kvq__fload16(kind, k + t * P * es);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[t]), x, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[t]), x, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[t]), x, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q3[t]), x, a3);
    }
    r[0] = _mm512_add_ps(a0, b0);
    r[1] = _mm512_add_ps(a1, b1);
    r[2] = _mm512_add_ps(a2, b2);
    r[3] = _mm512_add_ps(a3, b3);
}

KVQ__T512 static inline __attribute__((always_inline)) void
kvq__float_tscore_k(const int kind, const kvq_codec *c, float *out, size_t ostride, const void *qp,
                    size_t nq, const uint8_t *page, size_t P) {
    const float *q = (const float *)qp;
    /* es a constant of the kind: fixed offsets instead of index registers */
    const size_t qs = c->tqp_bytes / sizeof(float), d = c->d, es = kind == KVQ__F32 ? 4 : 2;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *q0 = q + i0 * qs;
        const float *q1 = q0 + (g > 1 ? qs : 0), *q2 = q0 + (g > 2 ? 2 * qs : 0),
                    *q3 = q0 + (g > 3 ? 3 * qs : 0);
        for (size_t tb = 0; tb < P; tb += 16) {
            __m512 r[4];
            kvq__tscore_block(kind, es, d, P, page, tb, q0, q1, q2, q3, r);
            for (size_t i = 0; i < g; i++)
                _mm512_storeu_ps(out + (i0 + i) * ostride + tb, r[i]);
        }
    }
}

KVQ__T512 static void kvq__float_tscore_avx512(const kvq_codec *c, float *out, size_t ostride,
                                               const void *qp, size_t nq, const uint8_t *page,
                                               size_t P) {
    if (c->kind == KVQ__F32)
        kvq__float_tscore_k(KVQ__F32, c, out, ostride, qp, nq, page, P);
    else if (c->kind == KVQ__F16)
        kvq__float_tscore_k(KVQ__F16, c, out, ostride, qp, nq, page, P);
    else
        kvq__float_tscore_k(KVQ__BF16, c, out, ostride, qp, nq, page, P);
}

/* acc[r][s..s+16*NS) += sum_j w[r][j] v_j[s..] for 4 rows and NS <= 6
 * strips of 16 (constants at each call: the 4 x NS accumulators stay in
 * registers; the caller uses NS <= 5, so that 20 accumulators, 4 broadcast
 * weights and a value fit the 32 registers without a spill). Each value
 * line feeds 4 FMAs, as in tscore, so memory is asked for at an even pace;
 * so is the next page's area (kvq__pf_next, kvq__pace): a share per value
 * row of every strip (the first strip took it all, 4 lines a row at first:
 * f16 5% slower at 16k and 32k in an in-process A/B). */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__accum_strip(const int kind, const int NS, float *const *a, const float *const *wr, size_t g,
                 const uint8_t *vals, size_t vb, size_t es, size_t s, size_t n, kvq__pace *pc) {
    __m512 x0[6], x1[6], x2[6], x3[6];
#pragma GCC unroll 6
    for (int k = 0; k < NS; k++)
        x0[k] = x1[k] = x2[k] = x3[k] = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = vals + j * vb + s * es;
        kvq__pace_step(pc);
        __m512 b0 = _mm512_set1_ps(wr[0][j]), b1 = _mm512_set1_ps(wr[1][j]);
        __m512 b2 = _mm512_set1_ps(wr[2][j]), b3 = _mm512_set1_ps(wr[3][j]);
#pragma GCC unroll 6
        for (int k = 0; k < NS; k++) {
            __m512 vv = kvq__fload16(kind, v + 16 * k * es);
            x0[k] = _mm512_fmadd_ps(b0, vv, x0[k]);
            x1[k] = _mm512_fmadd_ps(b1, vv, x1[k]);
            x2[k] = _mm512_fmadd_ps(b2, vv, x2[k]);
            x3[k] = _mm512_fmadd_ps(b3, vv, x3[k]);
        }
    }
#pragma GCC unroll 6
    for (int k = 0; k < NS; k++) {
        __m512 xs[4] = {x0[k], x1[k], x2[k], x3[k]};
        for (size_t r = 0; r < g; r++) {
            float *p = a[r] + s + 16 * k;
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), xs[r]));
        }
    }
}

/* acc[r][c..c+128) += sum_j w[r][j] v_j[c..] for NR <= 3 rows: 8 * NR
 * accumulators over whole 512-byte (f32) rows, so that the area is read
 * line after line, an order the hardware prefetchers follow (the strips of
 * kvq__accum_strip jump between rows); a later group of rows re-reads the
 * area from L1. Each group prefetches its share [pf0, pf1) of the next
 * page's rows, so that requests also go out while later groups work from
 * L1. The sums are formed in the same order as by the strips, so the
 * results are the same. */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__accum_rows(const int kind, const int NR, float *const *a, const float *const *w,
                const uint8_t *vals, size_t vb, size_t es, size_t c, size_t n, size_t pf0,
                size_t pf1) {
    __m512 x[3][8];
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            x[r][k] = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = vals + j * vb + c * es;
        if (j >= pf0 && j < pf1 && kvq__pf_next) /* the same row of the next page */
            for (size_t o = 0; o < 128 * es; o += 64)
                _mm_prefetch((const char *)(kvq__pf_next + j * vb + c * es + o), _MM_HINT_T0);
        __m512 b[3];
#pragma GCC unroll 3
        for (int r = 0; r < NR; r++)
            b[r] = _mm512_set1_ps(w[r][j]);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512 vv = kvq__fload16(kind, v + 16 * (size_t)k * es);
#pragma GCC unroll 3
            for (int r = 0; r < NR; r++)
                x[r][k] = _mm512_fmadd_ps(b[r], vv, x[r][k]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            float *p = a[r] + c + 16 * k;
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), x[r][k]));
        }
}

KVQ__T512 static inline __attribute__((always_inline)) void
kvq__float_accum_k(const int kind, const kvq_codec *c, float *acc, size_t astride, const float *w,
                   size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    const size_t d = c->d, vb = c->bytes, es = kind == KVQ__F32 ? 4 : 2;
    if (kind == KVQ__F32 && d % 128 == 0) { /* whole rows, 3 weight rows at a time */
        for (size_t i0 = 0; i0 < nq;) {
            const size_t nr = KVQ__MIN(3, nq - i0);
            float *ar[3] = {acc + i0 * astride, acc + (i0 + 1) * astride, acc + (i0 + 2) * astride};
            const float *wr[3] = {w + i0 * wstride, w + (i0 + 1) * wstride, w + (i0 + 2) * wstride};
            /* this group's share of the prefetch: its share of the rows */
            const size_t pf0 = n * i0 / nq, pf1 = n * (i0 + nr) / nq;
            for (size_t col = 0; col < d; col += 128) {
                if (nr == 3)
                    kvq__accum_rows(kind, 3, ar, wr, vals, vb, es, col, n, pf0, pf1);
                else if (nr == 2)
                    kvq__accum_rows(kind, 2, ar, wr, vals, vb, es, col, n, pf0, pf1);
                else
                    kvq__accum_rows(kind, 1, ar, wr, vals, vb, es, col, n, pf0, pf1);
            }
            i0 += nr;
        }
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *w0 = w + i0 * wstride;
        const float *wr[4] = {w0, g > 1 ? w0 + wstride : w0, g > 2 ? w0 + 2 * wstride : w0,
                              g > 3 ? w0 + 3 * wstride : w0};
        float *a[4] = {acc + i0 * astride, acc + (i0 + 1) * astride, acc + (i0 + 2) * astride,
                       acc + (i0 + 3) * astride};
        size_t s = 0;
        /* strips of 80, 48, 32 and 16 columns (d % 16 == 0) */
        const size_t nst = d / 80 + (d % 80) / 48 + (d % 80 % 48) / 32 + (d % 80 % 48 % 32) / 16;
        kvq__pace pc = kvq__pace_make(n * vb, i0 == 0 ? (uint64_t)nst * n : 0, 1);
        for (; s + 80 <= d; s += 80)
            kvq__accum_strip(kind, 5, a, wr, g, vals, vb, es, s, n, &pc);
        for (; s + 48 <= d; s += 48)
            kvq__accum_strip(kind, 3, a, wr, g, vals, vb, es, s, n, &pc);
        for (; s + 32 <= d; s += 32)
            kvq__accum_strip(kind, 2, a, wr, g, vals, vb, es, s, n, &pc);
        for (; s < d; s += 16)
            kvq__accum_strip(kind, 1, a, wr, g, vals, vb, es, s, n, &pc);
    }
}

KVQ__T512 static void kvq__float_accum_avx512(const kvq_codec *c, float *acc, size_t astride,
                                              const float *w, size_t wstride, size_t nq,
                                              const uint8_t *vals, size_t n) {
    if (c->kind == KVQ__F32)
        kvq__float_accum_k(KVQ__F32, c, acc, astride, w, wstride, nq, vals, n);
    else if (c->kind == KVQ__F16)
        kvq__float_accum_k(KVQ__F16, c, acc, astride, w, wstride, nq, vals, n);
    else
        kvq__float_accum_k(KVQ__BF16, c, acc, astride, w, wstride, nq, vals, n);
}

/* Scores over keys in rows (staged f16 tokens, pages that are not tiled):
 * blocks of 4 keys x 4 queries in 16 accumulators over d (a multiple of 16),
 * reduced 4 at a time by kvq__red4x16 - no horizontal sum per key. */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__float_score_k(const int kind, const kvq_codec *c, float *out, size_t ostride, const void *qp,
                   size_t nq, const uint8_t *keys, size_t n) {
    const float *q = (const float *)qp;
    const size_t qs = c->qp_bytes / sizeof(float), d = c->d, kb = c->bytes, es = c->bytes / c->d;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        size_t g = KVQ__MIN(4, nq - i0);
        const float *q0 = q + i0 * qs;
        const float *qr[4] = {q0, q0 + (g > 1 ? qs : 0), q0 + (g > 2 ? 2 * qs : 0),
                              q0 + (g > 3 ? 3 * qs : 0)};
        for (size_t j0 = 0; j0 < n; j0 += 4) {
            size_t m = KVQ__MIN(4, n - j0);
            const uint8_t *kr[4];
            for (size_t k = 0; k < 4; k++)
                kr[k] = keys + (j0 + (k < m ? k : 0)) * kb;
            __m512 a[4][4];
            for (int x = 0; x < 4; x++)
                for (int y = 0; y < 4; y++)
                    a[x][y] = _mm512_setzero_ps();
            for (size_t t = 0; t < d; t += 16) {
                __m512 k0 = kvq__fload16(kind, kr[0] + t * es), k1 = kvq__fload16(kind, kr[1] + t * es);
                __m512 k2 = kvq__fload16(kind, kr[2] + t * es), k3 = kvq__fload16(kind, kr[3] + t * es);
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++) {
                    __m512 qv = _mm512_loadu_ps(qr[x] + t);
                    a[x][0] = _mm512_fmadd_ps(qv, k0, a[x][0]);
                    a[x][1] = _mm512_fmadd_ps(qv, k1, a[x][1]);
                    a[x][2] = _mm512_fmadd_ps(qv, k2, a[x][2]);
                    a[x][3] = _mm512_fmadd_ps(qv, k3, a[x][3]);
                }
            }
            for (size_t x = 0; x < g; x++) {
                float r[16];
                _mm512_storeu_ps(r, kvq__red4x16(a[x][0], a[x][1], a[x][2], a[x][3], 0));
                for (size_t k = 0; k < m; k++)
                    out[(i0 + x) * ostride + j0 + k] = r[4 * k];
            }
        }
    }
}

KVQ__T512 static void kvq__float_score_avx512(const kvq_codec *c, float *out, size_t ostride,
                                              const void *qp, size_t nq, const uint8_t *keys,
                                              size_t n) {
    if (c->kind == KVQ__F32)
        kvq__float_score_k(KVQ__F32, c, out, ostride, qp, nq, keys, n);
    else if (c->kind == KVQ__F16)
        kvq__float_score_k(KVQ__F16, c, out, ostride, qp, nq, keys, n);
    else
        kvq__float_score_k(KVQ__BF16, c, out, ostride, qp, nq, keys, n);
}

static void kvq__float_tprep512(const kvq_codec *c, void *qp, const float *q) {
    memcpy(qp, q, c->d * sizeof(float));
}

void KVQ__SEL512(kvq__float_avx512_select)(kvq_codec *c, unsigned feat) {
    (void)feat;
    if (c->d % 16 == 0) {
        c->k.accum = kvq__float_accum_avx512;
        c->k.score = kvq__float_score_avx512;
    }
    c->k.tprep = kvq__float_tprep512;
    c->k.tscore = kvq__float_tscore_avx512;
    c->tqp_bytes = kvq__round64(c->d * sizeof(float));
    c->pf_self = c->d % 16 == 0; /* tscore always; accum with d % 16 == 0 */
}
