/*
 * nuq_avx2.c - AVX2 kernels of the nuq family, used when head_dim is a
 * multiple of 8. They give the same bytes and the same floats as the scalar
 * reference in nuq.c, bit for bit.
 *
 * encode   eight channels per register: the index is the count of the
 *          channel thresholds below the value (compare and subtract over the
 *          transposed thresholds for b <= 5, a gathered binary search above);
 *          eight indices fill exactly b bytes.
 * decode, score, accumulate
 *          eight vectors per register ("vertical"): the codes of a block of 8
 *          vectors are transposed into a tile of 32-bit words, tile[w * 8 + r]
 *          = word w of vector r, so one shift and mask give channel t of all
 *          eight vectors. The per-channel table (levels for decode/accumulate,
 *          the prepared query's q_t * level for score) is looked up with one
 *          permute for b <= 3, two permutes and a blend for b = 4 and a gather
 *          above. Scores are summed in the reference's order (four partial sums);
 *          decode and accumulate transpose 8 x 8 blocks back to rows.
 * Every kernel is generated once per b (1..8) so that shifts and masks are
 * constants.
 */
#include "../../codec/nuq_impl.h"
#include "../kernels.h"
#include "simd_avx2.h"

#define KVQ__NUQ_INLINE static inline __attribute__((always_inline))

/* 32-bit words per transposed code row: 32 channels take exactly b words. */
#define KVQ__NUQ_MAXW (KVQ__MAX_HEAD_DIM / 32 * 8)

/* Codes of the missing vectors of a last, partial block. */
static const uint8_t kvq__nuq_zero_row[KVQ__MAX_HEAD_DIM];

KVQ__NUQ_INLINE void kvq__nuq_tr8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* tile[w * 8 + r] = little-endian word w of rows[r] for w < nw; bytes past
 * the row's end read as zero. */
static void kvq__nuq_stage(uint32_t *tile, const uint8_t *const rows[8], size_t bytes, size_t nw) {
    size_t full = bytes / 4, w = 0;
    for (; w + 8 <= full; w += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; i++)
            r[i] = _mm256_loadu_ps((const float *)(const void *)(rows[i] + 4 * w));
        kvq__nuq_tr8(r);
        for (int i = 0; i < 8; i++)
            _mm256_store_ps((float *)(void *)(tile + (w + (size_t)i) * 8), r[i]);
    }
    for (; w < nw; w++) {
        size_t o = 4 * w;
        for (int r = 0; r < 8; r++) {
            uint32_t v = 0;
            if (o + 4 <= bytes)
                v = kvq__ld32(rows[r] + o);
            else
                for (size_t q = o; q < bytes; q++)
                    v |= (uint32_t)rows[r][q] << (8 * (q - o));
            tile[w * 8 + (size_t)r] = v;
        }
    }
}

/* The codes of channel i (0..31) of a 32-channel group, whose b words start
 * at gt, for the eight vectors of the tile. */
KVQ__NUQ_INLINE __m256i kvq__nuq_idx(const uint32_t *gt, int i, const int b) {
    const int bit = i * b, w = bit >> 5, s = bit & 31;
    __m256i v =
        _mm256_srli_epi32(_mm256_load_si256((const __m256i *)(const void *)(gt + w * 8)), s);
    if (s + b > 32)
        v = _mm256_or_si256(
            v, _mm256_slli_epi32(_mm256_load_si256((const __m256i *)(const void *)(gt + w * 8 + 8)),
                                 32 - s));
    return _mm256_and_si256(v, _mm256_set1_epi32((1 << b) - 1));
}

/* tab[idx] per lane from one channel's table of 2^b floats (which may be
 * followed by up to 8 readable floats). */
KVQ__NUQ_INLINE __m256 kvq__nuq_look(const float *tab, __m256i idx, const int b) {
    if (b <= 3)
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab), idx);
    if (b == 4) {
        __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab), idx);
        __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(tab + 8), idx);
        return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    }
    return _mm256_i32gather_ps(tab, idx, 4);
}

/* Points rows at the block of 8 vectors starting at vector j0 (zero codes
 * past n) and returns how many are real. */
static size_t kvq__nuq_rows(const uint8_t *rows[8], const uint8_t *src, size_t bytes, size_t j0,
                            size_t n) {
    size_t nr = KVQ__MIN((size_t)8, n - j0);
    for (size_t r = 0; r < 8; r++)
        rows[r] = r < nr ? src + (j0 + r) * bytes : kvq__nuq_zero_row;
    return nr;
}

/* ---- encode ---- */

KVQ__NUQ_INLINE void kvq__nuq_encode_b(const kvq_codec *c, uint8_t *dst, const float *src, size_t n,
                                       const int b) {
    const size_t d = c->d, L = (size_t)1 << b, bytes = c->bytes;
    const float *thr8 = kvq__nuq_thr8(c), *thr = kvq__nuq_thr(c);
    const __m256i sh_lo = _mm256_setr_epi64x(0, b, 2 * b, 3 * b);
    const __m256i sh_hi = _mm256_setr_epi64x(4 * b, 5 * b, 6 * b, 7 * b);
    const __m256i lane_off = _mm256_setr_epi32(0, (int)L, 2 * (int)L, 3 * (int)L, 4 * (int)L,
                                               5 * (int)L, 6 * (int)L, 7 * (int)L);
    for (size_t j = 0; j < n; j++) {
        const float *x = src + j * d;
        uint8_t *p = dst + j * bytes;
        for (size_t g = 0; g < d / 8; g++) {
            __m256 v = _mm256_loadu_ps(x + 8 * g);
            __m256i idx = _mm256_setzero_si256();
            if (b <= 5) {
                const float *tg = thr8 + g * 8 * L;
                for (size_t k = 0; k + 1 < L; k++) {
                    __m256 m = _mm256_cmp_ps(v, _mm256_load_ps(tg + 8 * k), _CMP_GT_OQ);
                    idx = _mm256_sub_epi32(idx, _mm256_castps_si256(m));
                }
            } else {
                const float *tg = thr + g * 8 * L;
                for (int s = (int)L >> 1; s; s >>= 1) {
                    __m256i at =
                        _mm256_add_epi32(lane_off, _mm256_add_epi32(idx, _mm256_set1_epi32(s - 1)));
                    __m256 m = _mm256_cmp_ps(v, _mm256_i32gather_ps(tg, at, 4), _CMP_GT_OQ);
                    idx = _mm256_add_epi32(
                        idx, _mm256_and_si256(_mm256_castps_si256(m), _mm256_set1_epi32(s)));
                }
            }
            __m256i lo =
                _mm256_sllv_epi64(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(idx)), sh_lo);
            __m256i hi =
                _mm256_sllv_epi64(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(idx, 1)), sh_hi);
            __m256i o = _mm256_or_si256(lo, hi);
            __m128i o2 = _mm_or_si128(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1));
            uint64_t bits = (uint64_t)_mm_cvtsi128_si64(o2) | (uint64_t)_mm_extract_epi64(o2, 1);
            memcpy(p + g * (size_t)b, &bits, (size_t)b); /* little-endian host */
        }
    }
}

/* ---- decode and accumulate ---- */

/* Decodes channels [t0, t0 + 8) of the 8 tile vectors into rows (r[k] = those
 * channels of vector k); ci is t0's position in its 32-channel group. */
KVQ__NUQ_INLINE void kvq__nuq_block8(__m256 r[8], const uint32_t *gt, const float *lev, size_t t0,
                                     int ci, const int b) {
    const size_t L = (size_t)1 << b;
    for (int k = 0; k < 8; k++)
        r[k] = kvq__nuq_look(lev + (t0 + (size_t)k) * L, kvq__nuq_idx(gt, ci + k, b), b);
    kvq__nuq_tr8(r);
}

KVQ__NUQ_INLINE void kvq__nuq_decode_b(const kvq_codec *c, float *dst, const uint8_t *src, size_t n,
                                       const int b) {
    const size_t d = c->d, bytes = c->bytes, ngr = (d + 31) / 32;
    const float *lev = kvq__nuq_lev(c);
    _Alignas(32) uint32_t tile[KVQ__NUQ_MAXW * 8];
    const uint8_t *rows[8];
    for (size_t j0 = 0; j0 < n; j0 += 8) {
        size_t nr = kvq__nuq_rows(rows, src, bytes, j0, n);
        kvq__nuq_stage(tile, rows, bytes, ngr * (size_t)b);
        for (size_t g = 0; g < ngr; g++) {
            const uint32_t *gt = tile + g * (size_t)b * 8;
#pragma GCC unroll 4
            for (int ci = 0; ci < 32; ci += 8) {
                size_t t0 = g * 32 + (size_t)ci;
                if (t0 >= d)
                    break;
                __m256 r[8];
                kvq__nuq_block8(r, gt, lev, t0, ci, b);
                for (size_t k = 0; k < nr; k++)
                    _mm256_storeu_ps(dst + (j0 + k) * d + t0, r[k]);
            }
        }
    }
}

KVQ__NUQ_INLINE void kvq__nuq_accum_b(const kvq_codec *c, float *acc, size_t astride,
                                      const float *w, size_t wstride, size_t nq,
                                      const uint8_t *vals, size_t n, const int b) {
    const size_t d = c->d, bytes = c->bytes, ngr = (d + 31) / 32;
    const float *lev = kvq__nuq_lev(c);
    _Alignas(32) uint32_t tile[KVQ__NUQ_MAXW * 8];
    const uint8_t *rows[8];
    for (size_t j0 = 0; j0 < n; j0 += 8) {
        size_t nr = kvq__nuq_rows(rows, vals, bytes, j0, n);
        kvq__nuq_stage(tile, rows, bytes, ngr * (size_t)b);
        for (size_t g = 0; g < ngr; g++) {
            const uint32_t *gt = tile + g * (size_t)b * 8;
#pragma GCC unroll 4
            for (int ci = 0; ci < 32; ci += 8) {
                size_t t0 = g * 32 + (size_t)ci;
                if (t0 >= d)
                    break;
                __m256 r[8];
                kvq__nuq_block8(r, gt, lev, t0, ci, b);
                for (size_t i = 0; i < nq; i++) {
                    float *a = acc + i * astride + t0;
                    const float *wi = w + i * wstride + j0;
                    __m256 s = _mm256_loadu_ps(a);
                    /* product then sum, vectors in order: as the reference */
                    for (size_t k = 0; k < nr; k++)
                        s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(wi[k]), r[k]));
                    _mm256_storeu_ps(a, s);
                }
            }
        }
    }
}

/* ---- score ---- */

/* Scores of QN (1 or 2) prepared queries (lut[q], each a table of d * 2^b
 * floats) against the 8 tile vectors: lane k of out[q] is the sum of
 * lut[q][t * L + code_t(vector k)] accumulated like the reference, in four
 * partial sums over t mod 4 combined as (s0 + s1) + (s2 + s3). */
KVQ__NUQ_INLINE void kvq__nuq_score_tile(__m256 out[2], const uint32_t *tile,
                                         const float *const lut[2], size_t d, const int b,
                                         const int QN) {
    const size_t L = (size_t)1 << b, ngr = (d + 31) / 32;
    __m256 acc[2][4];
    for (int q = 0; q < QN; q++)
        for (int p = 0; p < 4; p++)
            acc[q][p] = _mm256_setzero_ps();
    for (size_t g = 0; g < ngr; g++) {
        const uint32_t *gt = tile + g * (size_t)b * 8;
#pragma GCC unroll 32
        for (int ci = 0; ci < 32; ci++) {
            size_t t = g * 32 + (size_t)ci;
            if (t >= d)
                break;
            __m256i idx = kvq__nuq_idx(gt, ci, b);
            for (int q = 0; q < QN; q++)
                acc[q][ci & 3] =
                    _mm256_add_ps(acc[q][ci & 3], kvq__nuq_look(lut[q] + t * L, idx, b));
        }
    }
    for (int q = 0; q < QN; q++)
        out[q] =
            _mm256_add_ps(_mm256_add_ps(acc[q][0], acc[q][1]), _mm256_add_ps(acc[q][2], acc[q][3]));
}

KVQ__NUQ_INLINE void kvq__nuq_score_b(const kvq_codec *c, float *out, size_t ostride,
                                      const void *qp, size_t nq, const uint8_t *keys, size_t n,
                                      const int b) {
    const size_t d = c->d, bytes = c->bytes, ngr = (d + 31) / 32;
    const size_t qs = c->qp_bytes / sizeof(float);
    _Alignas(32) uint32_t tile[KVQ__NUQ_MAXW * 8];
    const uint8_t *rows[8];
    for (size_t j0 = 0; j0 < n; j0 += 8) {
        size_t nr = kvq__nuq_rows(rows, keys, bytes, j0, n);
        kvq__nuq_stage(tile, rows, bytes, ngr * (size_t)b);
        for (size_t i0 = 0; i0 < nq;) {
            __m256 res[2];
            const float *lut[2];
            size_t m = nq - i0 >= 2 ? 2 : 1;
            for (size_t q = 0; q < m; q++)
                lut[q] = (const float *)qp + (i0 + q) * qs;
            if (m == 2)
                kvq__nuq_score_tile(res, tile, lut, d, b, 2);
            else
                kvq__nuq_score_tile(res, tile, lut, d, b, 1);
            for (size_t q = 0; q < m; q++) {
                float *o = out + (i0 + q) * ostride + j0;
                if (nr == 8) {
                    _mm256_storeu_ps(o, res[q]);
                } else {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, res[q]);
                    memcpy(o, tmp, nr * sizeof(float));
                }
            }
            i0 += m;
        }
    }
}

/* ---- one instance per b ---- */

#define KVQ__NUQ_INSTANCES(B)                                                                      \
    static void kvq__nuq_encode_avx2_##B(const kvq_codec *c, uint8_t *dst, const float *src,       \
                                         size_t n) {                                               \
        kvq__nuq_encode_b(c, dst, src, n, B);                                                      \
    }                                                                                              \
    static void kvq__nuq_decode_avx2_##B(const kvq_codec *c, float *dst, const uint8_t *src,       \
                                         size_t n) {                                               \
        kvq__nuq_decode_b(c, dst, src, n, B);                                                      \
    }                                                                                              \
    static void kvq__nuq_score_avx2_##B(const kvq_codec *c, float *out, size_t ostride,            \
                                        const void *qp, size_t nq, const uint8_t *keys,            \
                                        size_t n) {                                                \
        kvq__nuq_score_b(c, out, ostride, qp, nq, keys, n, B);                                     \
    }                                                                                              \
    static void kvq__nuq_accum_avx2_##B(const kvq_codec *c, float *acc, size_t astride,            \
                                        const float *w, size_t wstride, size_t nq,                 \
                                        const uint8_t *vals, size_t n) {                           \
        kvq__nuq_accum_b(c, acc, astride, w, wstride, nq, vals, n, B);                             \
    }

KVQ__NUQ_INSTANCES(1)
KVQ__NUQ_INSTANCES(2)
KVQ__NUQ_INSTANCES(3)
KVQ__NUQ_INSTANCES(4)
KVQ__NUQ_INSTANCES(5)
KVQ__NUQ_INSTANCES(6)
KVQ__NUQ_INSTANCES(7)
KVQ__NUQ_INSTANCES(8)

#define KVQ__NUQ_SET(B)                                                                            \
    case B:                                                                                        \
        c->k.encode = kvq__nuq_encode_avx2_##B;                                                    \
        c->k.decode = kvq__nuq_decode_avx2_##B;                                                    \
        c->k.score = kvq__nuq_score_avx2_##B;                                                      \
        c->k.accum = kvq__nuq_accum_avx2_##B;                                                      \
        break;

void kvq__nuq_avx2_select(kvq_codec *c) {
    if (c->d % 8 != 0)
        return;
    switch (c->bits) {
        KVQ__NUQ_SET(1)
        KVQ__NUQ_SET(2)
        KVQ__NUQ_SET(3)
        KVQ__NUQ_SET(4)
        KVQ__NUQ_SET(5)
        KVQ__NUQ_SET(6)
        KVQ__NUQ_SET(7)
        KVQ__NUQ_SET(8)
    default:
        break;
    }
}
