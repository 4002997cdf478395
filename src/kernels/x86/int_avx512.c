/*
 * int_avx512.c - AVX-512 kernels of int8/int4 over tiled pages (layouts and
 * error bounds in src/codec/int.c; simd_avx512.h says how this file is
 * built natively and through SIMDe):
 *  - tscore: 16 tokens (one 32-bit lane each) x 4 query rows; int8: the
 *    stored bytes c + 128 widened to int16 times the int16 query codes
 *    (vpdpwssd with VNNI, vpmaddwd + vpaddd without), the bias -128 sum Q
 *    starting the accumulators; int4: the low and high nibble planes times
 *    the int8 codes (vpdpbusd, or maddubs + madd on AVX-512BW);
 *  - taccum (g % 16 == 0): 64 dimensions x 4 weight rows in 16 int32
 *    accumulators (int8 on BW: 32 dimensions, two accumulators each), int8
 *    values against u16 weights 0..32767 (two vpdpbusd passes over their
 *    high and low bytes with VNNI, vpmaddwd of the codes widened to int16
 *    on BW), int4 per nibble plane of 8 tokens, the codes as c - 8, against
 *    u8 weights 0..255 (int.c);
 *  - taccum_run: the same over runs of whole pages (64 / P pages of P <= 64
 *    tokens; larger pages one by one as taccum): the weights of a run are
 *    rounded once (one scale per row and group), every page of the run
 *    goes into the same int32 accumulators, and those are converted,
 *    scaled and added to the float accumulators once per run.
 * The query rounding (tprep) is the AVX2 path's (int_avx2.c); the weights
 * are rounded by the same operations with the same step (int.c), so every
 * path computes the same integer dot products and the same float steps in
 * the same order. The two variants (VNNI and BW) are int_avx512_body.h
 * included twice.
 */
#include "../kernels.h"
#include "simd_avx512.h"
#include "int_tile.h"

/* SIMDe 0.7.4 lacks some AVX-512 conversions: there they go through two
 * 256-bit halves (the same results). */
#ifdef KVQ_SIMDE
#undef _mm512_madd_epi16 /* SIMDe 0.7.4 aliases it with the masked form's arguments */
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
static inline __m512 kvq__i512_i2f(__m512i v) {
    __m256 lo = _mm256_cvtepi32_ps(_mm512_castsi512_si256(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
static inline __m512 kvq__i512_h2f(const uint8_t *p) {
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
static inline __m512i kvq__i512_sra4(__m512i v) {
    __m256i lo = _mm256_srai_epi32(_mm512_castsi512_si256(v), 4);
    __m256i hi = _mm256_srai_epi32(_mm512_extracti64x4_epi64(v, 1), 4);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static inline __m256i kvq__i512_f2h(__m512 v) {
    __m128i lo = _mm256_cvtps_ph(_mm512_castps512_ps256(v), _MM_FROUND_TO_NEAREST_INT);
    __m128i hi = _mm256_cvtps_ph(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)),
                                 _MM_FROUND_TO_NEAREST_INT);
    return _mm256_set_m128i(hi, lo);
}
static inline __m512 kvq__i512_h2fv(__m256i h) {
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
static inline __m512i kvq__i512_f2i(__m512 v) {
    __m256i lo = _mm256_cvtps_epi32(_mm512_castps512_ps256(v));
    __m256i hi = _mm256_cvtps_epi32(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static inline void kvq__i512_store_b16(uint8_t *p, __m512i v) {
    int32_t x[16];
    _mm512_storeu_si512((void *)x, v);
    for (int k = 0; k < 16; k++)
        p[k] = (uint8_t)x[k];
}
static inline float kvq__i512_hmax(__m512 v) {
    float x[16], m;
    _mm512_storeu_ps(x, v);
    m = x[0];
    for (int k = 1; k < 16; k++)
        m = x[k] > m ? x[k] : m;
    return m;
}
static inline float kvq__i512_hsum(__m512 v) {
    float x[16], s = 0.0f;
    _mm512_storeu_ps(x, v);
    for (int k = 0; k < 16; k++)
        s += x[k];
    return s;
}
static inline void kvq__i512_store_w16(uint8_t *p, __m512i v) {
    int32_t x[16];
    _mm512_storeu_si512((void *)x, v);
    for (int k = 0; k < 16; k++) {
        p[2 * k] = (uint8_t)x[k];
        p[2 * k + 1] = (uint8_t)(x[k] >> 8);
    }
}
static inline __m512i kvq__i512_cvtepu8_epi16(__m256i v) {
    uint8_t b[32];
    int16_t x[32];
    _mm256_storeu_si256((__m256i *)(void *)b, v);
    for (int k = 0; k < 32; k++)
        x[k] = b[k];
    return _mm512_loadu_si512((const void *)x);
}
static inline __m512i kvq__i512_cvtepi8_epi16(__m256i v) {
    int8_t b[32];
    int16_t x[32];
    _mm256_storeu_si256((__m256i *)(void *)b, v);
    for (int k = 0; k < 32; k++)
        x[k] = b[k];
    return _mm512_loadu_si512((const void *)x);
}
static inline void kvq__i512_store_b64(uint8_t *p, __m512i a, __m512i b, __m512i c, __m512i d) {
    kvq__i512_store_b16(p, a);
    kvq__i512_store_b16(p + 16, b);
    kvq__i512_store_b16(p + 32, c);
    kvq__i512_store_b16(p + 48, d);
}
#else
#define kvq__i512_i2f(v) _mm512_cvtepi32_ps(v)
#define kvq__i512_f2i(v) _mm512_cvtps_epi32(v)
#define kvq__i512_h2f(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define kvq__i512_store_b16(p, v) _mm_storeu_si128((__m128i *)(void *)(p), _mm512_cvtepi32_epi8(v))
#define kvq__i512_store_w16(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), _mm512_cvtepi32_epi16(v))
#define kvq__i512_cvtepu8_epi16(v) _mm512_cvtepu8_epi16(v)
#define kvq__i512_cvtepi8_epi16(v) _mm512_cvtepi8_epi16(v)
#define kvq__i512_hmax(v) _mm512_reduce_max_ps(v)
#define kvq__i512_hsum(v) _mm512_reduce_add_ps(v)
#define kvq__i512_f2h(v) _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)
#define kvq__i512_sra4(v) _mm512_srai_epi32(v, 4)
#define kvq__i512_h2fv(h) _mm512_cvtph_ps(h)
/* 4 x 16 int32 in 0..255 to 64 bytes in order: two packs, one permute. */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__i512_store_b64(uint8_t *p, __m512i a, __m512i b, __m512i c, __m512i d) {
    /* 128-bit lane k: a_k b_k c_k d_k (4 bytes each) */
    __m512i x = _mm512_packus_epi16(_mm512_packs_epi32(a, b), _mm512_packs_epi32(c, d));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512((void *)p, _mm512_permutexvar_epi32(idx, x));
}
#endif

static inline uint32_t kvq__i512_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t kvq__i512_ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#define KVQ__I512_UNROLL4 _Pragma("GCC unroll 4")

/* The sums of the int32 lane pairs (2i, 2i + 1) of a (i < 8) then of b, in
 * order: what vpmaddwd leaves of 8 items (tokens, dimensions) x 4 bytes
 * widened to int16, each item's two pair sums in adjacent lanes. */
KVQ__T512 static inline __attribute__((always_inline)) __m512i kvq__i512_pairsum16(__m512i a, __m512i b) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(a, ev, b), _mm512_permutex2var_epi32(a, od, b));
}

/* acc + u8 x s8 dot of a's bytes with the 4 bytes at p in every lane:
 * vpdpbusd with an embedded broadcast (one instruction; GCC 12 does not
 * fold the broadcast itself). */
#ifdef KVQ_SIMDE
#define kvq__i512_dpb(acc, a, p) _mm512_dpbusd_epi32(acc, a, _mm512_set1_epi32((int)kvq__i512_ld32(p)))
#else
KVQ__T512VNNI static inline __attribute__((always_inline)) __m512i
kvq__i512_dpb(__m512i acc, __m512i a, const uint8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const uint32_t *)(const void *)p));
    return acc;
}
#endif

static const float kvq__i512_zeros[KVQ__TILE_RUN];

/* Lane i of the result = the maximum (MAX 1), minimum (MAX 2), sum (MAX
 * 0) or maximum as signed integers of the bit patterns (MAX 3) of the 16
 * lanes of
 * v[T(i)], T(i) = 4 (i % 4) + i / 4 (T is its own inverse): a transposing
 * reduction tree, 15 max/add and 30 shuffles for 16 reductions. */
#ifdef KVQ_SIMDE
static inline __m512 kvq__i512_red16(const __m512 *v, const int MAX) {
    float x[16], out[16];
    for (int i = 0; i < 16; i++) {
        _mm512_storeu_ps(x, v[4 * (i % 4) + i / 4]);
        float a = MAX ? x[0] : 0.0f;
        for (int k = MAX ? 1 : 0; k < 16; k++) {
            int32_t xb, ab;
            memcpy(&xb, &x[k], 4);
            memcpy(&ab, &a, 4);
            a = MAX == 1   ? (x[k] > a ? x[k] : a)
                : MAX == 2 ? (x[k] < a ? x[k] : a)
                : MAX == 3 ? (xb > ab ? x[k] : a)
                           : a + x[k];
        }
        out[i] = a;
    }
    return _mm512_loadu_ps(out);
}
#else
KVQ__T512 static inline __attribute__((always_inline)) __m512 kvq__i512_red16(const __m512 *v,
                                                                             const int MAX) {
#define KVQ__RED(a, b)                                                                             \
    (MAX == 1 ? _mm512_max_ps(a, b) : MAX == 2 ? _mm512_min_ps(a, b)                               \
     : MAX == 3 ? _mm512_castsi512_ps(_mm512_max_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b))) \
                : _mm512_add_ps(a, b))
    __m512 u[8], w[4], z[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        u[i] = KVQ__RED(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        w[i] = KVQ__RED(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        z[i] = KVQ__RED(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return KVQ__RED(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
#undef KVQ__RED
}
#endif

/* 16 rounded weights (int32 lanes: tokens t..t+15 of group gi of ng, runs
 * of n tokens) into a row of wq in format fmt (int_tile.h). */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__i512_wq_store16(uint8_t *row, size_t ng, size_t n, size_t gi, size_t t, __m512i v,
                     kvq__wq_fmt fmt) {
    if (fmt == KVQ__WQ_U16) {
        kvq__i512_store_w16(row + 2 * (gi * n + t), v);
    } else if (fmt == KVQ__WQ_SPLIT) {
        kvq__i512_store_b16(row + gi * n + t, _mm512_srli_epi32(v, 8));
        kvq__i512_store_b16(row + (ng + gi) * n + t, _mm512_and_si512(v, _mm512_set1_epi32(255)));
    } else {
        kvq__i512_store_b16(row + gi * n + t, v);
    }
}

/* The rounded weights of 4 rows w[r] (rows past the call's use zeros) for
 * a run of n tokens (n % 16 == 0, n <= KVQ__TILE_RUN): rint(w s W / max)
 * in 0..W in format fmt (int_tile.h: U8 with W = 255 for int4, U16 or
 * SPLIT with W = KVQ__TILE_WK for int8; the AVX2 path's weights: the same
 * operations), al = max / W, msum = sum w (m + 8 s) for int4 (its
 * codes taken as c - 8), summed in another order than AVX2's; al and msum
 * (4 ng + 16 floats) are indexed r * ng + group. The run's tokens come in
 * blocks of 16, each from its own page: sb[j] (j < n / 16) is the fp16
 * scale of group 0 of the block's first token in its page's scale plane
 * (group gi at sb[j] + 2 gi P, the minima at sb[j] + 2 (ng + gi) P), so a
 * run may span pages (taccum_run). The 4 * ng (row, group) pairs go 16 at
 * a time through kvq__i512_red16. Returns the rows done (bit r); the
 * others have weights that are not all >= 0 and finite, or products that
 * overflow. */
KVQ__T512 static unsigned
kvq__i512_wquant4_any(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t n,
                  const float *const *w, uint8_t (*wq)[KVQ__WQ_ROW],
                  float *al, float *msum, kvq__wq_fmt fmt) {
    const size_t ng = c->ngroups, npair = 4 * ng;
    const float W = fmt == KVQ__WQ_U8 ? 255.0f : (float)KVQ__TILE_WK;
    const int off8 = c->bits != 8;
    const __m512 zero = _mm512_setzero_ps(), big = _mm512_set1_ps(FLT_MAX);
    const __m512 tiny = _mm512_set1_ps(KVQ__TILE_TINY), lW = _mm512_set1_ps(W);
    unsigned ok = 0;
    for (int r = 0; r < 4; r++) {
        __mmask16 m = 0xffff;
        for (size_t t = 0; t < n; t += 16) {
            __m512 x = _mm512_loadu_ps(w[r] + t);
            m &= (__mmask16)(_mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, big, _CMP_LE_OQ));
        }
        ok |= m == 0xffff ? 1u << r : 0u;
    }
    _Alignas(64) float inv[4 * KVQ__MAX_HEAD_DIM / 8 + 16];
    /* pair pr = (row r, group gi), pr = r * ng + gi, walked without divisions */
    for (size_t p0 = 0, r = 0, gi = 0; p0 < npair; p0 += 16) {
        __m512 v[16];
        unsigned rowof[16];
        for (size_t i = 0; i < 16; i++) {
            __m512 mx = zero;
            rowof[i] = (unsigned)r;
            if (p0 + i < npair) {
                for (size_t t = 0; t < n; t += 16)
                    mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_loadu_ps(w[r] + t),
                                                         kvq__i512_h2f(sb[t / 16] + 2 * gi * P)));
                if (++gi == ng) {
                    gi = 0;
                    r++;
                }
            }
            v[4 * (i % 4) + i / 4] = mx;
        }
        const __m512 M = kvq__i512_red16(v, 1);
        const __mmask16 use = _mm512_cmp_ps_mask(M, tiny, _CMP_GE_OQ);
        unsigned bad = (unsigned)(__mmask16)~_mm512_cmp_ps_mask(M, big, _CMP_LE_OQ);
        for (size_t i = 0; bad && i < 16 && p0 + i < npair; i++, bad >>= 1)
            if (bad & 1)
                ok &= ~(1u << rowof[i]);
        _mm512_store_ps(inv + p0, _mm512_maskz_div_ps(use, lW, M));
        _mm512_storeu_ps(al + p0, _mm512_maskz_div_ps(use, M, lW));
    }
    for (size_t r = 0, pr = 0; r < 4; r++) {
        if (!((ok >> r) & 1)) {
            pr += ng;
            continue;
        }
        for (size_t gi = 0; gi < ng; gi++, pr++) {
            const __m512 iv = _mm512_set1_ps(inv[pr]);
            for (size_t t = 0; t < n; t += 16) {
                __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w[r] + t), kvq__i512_h2f(sb[t / 16] + 2 * gi * P));
                kvq__i512_wq_store16(wq[r], ng, n, gi, t, kvq__i512_f2i(_mm512_mul_ps(x, iv)), fmt);
            }
        }
    }
    const __m512 eight = _mm512_set1_ps(8.0f);
    if (c->bits != 8)
        for (size_t p0 = 0, r = 0, gi = 0; p0 < npair; p0 += 16) {
            __m512 v[16];
            for (size_t i = 0; i < 16; i++) {
                __m512 sm = zero;
                if (p0 + i < npair) {
                    for (size_t t = 0; t < n; t += 16) {
                        __m512 h = kvq__i512_h2f(sb[t / 16] + 2 * (ng + gi) * P);
                        if (off8) /* m + 8 s: the codes are taken as c - 8 */
                            h = _mm512_fmadd_ps(kvq__i512_h2f(sb[t / 16] + 2 * gi * P), eight, h);
                        sm = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + t), h, sm);
                    }
                    if (++gi == ng) {
                        gi = 0;
                        r++;
                    }
                }
                v[4 * (i % 4) + i / 4] = sm;
            }
            _mm512_storeu_ps(msum + p0, kvq__i512_red16(v, 0));
        }
    return ok;
}

/* kvq__i512_wquant4_any for NG groups and runs of 16 NT tokens known at
 * compile time (4 NG <= 16 pairs). The products w * s are formed twice,
 * for the maxima and then row by row for the bytes (the same
 * multiplications, so the same values), instead of being kept: 4 NG NT of
 * them (64 at NG = NT = 4) do not fit in the 32 registers. */
KVQ__T512 static inline __attribute__((always_inline)) unsigned
kvq__i512_wquant4_fix(const kvq_codec *c, const uint8_t *const *sb, size_t P,
                      const float *const *w, uint8_t (*wq)[KVQ__WQ_ROW],
                      float *al, float *msum, kvq__wq_fmt fmt, const int NG, const int NT) {
    const size_t n = 16 * (size_t)NT;
    const float W = fmt == KVQ__WQ_U8 ? 255.0f : (float)KVQ__TILE_WK;
    const int off8 = c->bits != 8;
    const __m512 zero = _mm512_setzero_ps(), big = _mm512_set1_ps(FLT_MAX);
    const __m512 tiny = _mm512_set1_ps(KVQ__TILE_TINY), lW = _mm512_set1_ps(W);
    __m512 S[4][4], v[16];
    unsigned ok = 0;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __mmask16 m = 0xffff;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m512 x = _mm512_loadu_ps(w[r] + 16 * t);
            m &= (__mmask16)(_mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, big, _CMP_LE_OQ));
        }
        ok |= m == 0xffff ? 1u << r : 0u;
    }
#pragma GCC unroll 4
    for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            S[g][t] = kvq__i512_h2f(sb[t] + 2 * (size_t)g * P);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        v[i] = zero;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const int i = r * NG + g;
            __m512 mx = _mm512_mul_ps(_mm512_loadu_ps(w[r]), S[g][0]);
#pragma GCC unroll 4
            for (int t = 1; t < NT; t++)
                mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_loadu_ps(w[r] + 16 * t), S[g][t]));
            v[4 * (i % 4) + i / 4] = mx;
        }
    const __m512 M = kvq__i512_red16(v, 1);
    const unsigned fin = _mm512_cmp_ps_mask(M, big, _CMP_LE_OQ);
    const __mmask16 use = _mm512_cmp_ps_mask(M, tiny, _CMP_GE_OQ);
    const __m512 inv = _mm512_maskz_div_ps(use, lW, M);
    _mm512_storeu_ps(al, _mm512_maskz_div_ps(use, M, lW));
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        if (((fin >> (r * NG)) & ((1u << NG) - 1)) != (1u << NG) - 1)
            ok &= ~(1u << r);
        __m512i Q[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            const __m512 iv = _mm512_permutexvar_ps(_mm512_set1_epi32(r * NG + g), inv);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                Q[g][t] = kvq__i512_f2i(
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w[r] + 16 * t), S[g][t]), iv));
        }
        /* the weights of row r: groups one after the other, 16 NT each */
        if (fmt == KVQ__WQ_SPLIT && NT == 4) { /* the high bytes' plane, then the low bytes' */
            const __m512i m255 = _mm512_set1_epi32(255);
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) {
                kvq__i512_store_b64(wq[r] + (size_t)g * n, _mm512_srli_epi32(Q[g][0], 8),
                                    _mm512_srli_epi32(Q[g][1], 8), _mm512_srli_epi32(Q[g][2], 8),
                                    _mm512_srli_epi32(Q[g][3], 8));
                kvq__i512_store_b64(wq[r] + (size_t)(NG + g) * n, _mm512_and_si512(Q[g][0], m255),
                                    _mm512_and_si512(Q[g][1], m255), _mm512_and_si512(Q[g][2], m255),
                                    _mm512_and_si512(Q[g][3], m255));
            }
            continue;
        }
        if (fmt != KVQ__WQ_U8) {
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    kvq__i512_wq_store16(wq[r], (size_t)NG, n, (size_t)g, 16 * (size_t)t, Q[g][t], fmt);
            continue;
        }
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++) {
            if (NT == 4) {
                kvq__i512_store_b64(wq[r] + (size_t)g * n, Q[g][0], Q[g][1], Q[g][2], Q[g][3]);
            } else if (NG * NT == 4) {
                if (g == 0) {
                    const __m512i q1 = NT == 1 ? Q[1][0] : Q[0][1];
                    const __m512i q2 = NT == 1 ? Q[2][0] : Q[1][0];
                    const __m512i q3 = NT == 1 ? Q[3][0] : Q[1][1];
                    kvq__i512_store_b64(wq[r], Q[0][0], q1, q2, q3);
                }
            } else {
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    kvq__i512_store_b16(wq[r] + (size_t)g * n + 16 * (size_t)t, Q[g][t]);
            }
        }
    }
    if (c->bits != 8) {
#pragma GCC unroll 4
        for (int g = 0; g < NG; g++)
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                S[g][t] = kvq__i512_h2f(sb[t] + 2 * (size_t)(NG + g) * P);
                if (off8) /* m + 8 s: the codes are taken as c - 8 */
                    S[g][t] = _mm512_fmadd_ps(kvq__i512_h2f(sb[t] + 2 * (size_t)g * P),
                                              _mm512_set1_ps(8.0f), S[g][t]);
            }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int g = 0; g < NG; g++) {
                const int i = r * NG + g;
                __m512 sm = _mm512_mul_ps(_mm512_loadu_ps(w[r]), S[g][0]);
#pragma GCC unroll 4
                for (int t = 1; t < NT; t++)
                    sm = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + 16 * t), S[g][t], sm);
                v[4 * (i % 4) + i / 4] = sm;
            }
        _mm512_storeu_ps(msum, kvq__i512_red16(v, 0));
    }
    return ok;
}

#define KVQ__I512_WQ(NG, NT)                                                                       \
    KVQ__T512 static unsigned kvq__i512_wq_##NG##_##NT(                                            \
        const kvq_codec *c, const uint8_t *const *sb, size_t P, const float *const *w,             \
        uint8_t (*wq)[KVQ__WQ_ROW], float *al, float *msum, kvq__wq_fmt fmt) {                     \
        return kvq__i512_wquant4_fix(c, sb, P, w, wq, al, msum, fmt, NG, NT);                      \
    }
KVQ__I512_WQ(1, 1)
KVQ__I512_WQ(2, 1)
KVQ__I512_WQ(4, 1)
KVQ__I512_WQ(1, 2)
KVQ__I512_WQ(2, 2)
KVQ__I512_WQ(4, 2)
KVQ__I512_WQ(1, 4)
KVQ__I512_WQ(2, 4)
KVQ__I512_WQ(4, 4)

/* The rounded weights of a run (see kvq__i512_wquant4_any). */
static unsigned kvq__i512_wquant4(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t n,
                                  const float *const *w,
                                  uint8_t (*wq)[KVQ__WQ_ROW], float *al,
                                  float *msum, kvq__wq_fmt fmt) {
    typedef unsigned (*fn)(const kvq_codec *, const uint8_t *const *, size_t, const float *const *,
                           uint8_t (*)[KVQ__WQ_ROW], float *, float *, kvq__wq_fmt);
    static const fn tab[3][3] = {
        {kvq__i512_wq_1_1, kvq__i512_wq_2_1, kvq__i512_wq_4_1},
        {kvq__i512_wq_1_2, kvq__i512_wq_2_2, kvq__i512_wq_4_2},
        {kvq__i512_wq_1_4, kvq__i512_wq_2_4, kvq__i512_wq_4_4},
    };
    const size_t ng = c->ngroups;
    const int gi = ng == 1 ? 0 : ng == 2 ? 1 : ng == 4 ? 2 : -1;
    const int ti = n == 16 ? 0 : n == 32 ? 1 : n == 64 ? 2 : -1;
    if (gi >= 0 && ti >= 0)
        return tab[ti][gi](c, sb, P, w, wq, al, msum, fmt);
    return kvq__i512_wquant4_any(c, sb, P, n, w, wq, al, msum, fmt);
}

/* ---- encode: bit-exact with the reference (src/codec/int.c), as the
 * AVX2 encoder: the group parameters of 16 groups at once with the same
 * correctly rounded operations (division, clamps, F16C on values within
 * +-65504), codes with cvtps_epi32 (round to nearest even) and saturating
 * packs for the lower clamp. Needs d % 64 == 0 and g % 16 == 0. ---- */

#define KVQ__ENC512_F 16 /* groups per parameter pass */

/* The group reductions of nb vectors (nb * ng <= 16, or one vector), 16
 * groups at a time, into ra (maxima; int8: of |x|) and rb (minima; int4),
 * KVQ__ENC512_F per pass. Returns nonzero when a value is NaN or infinite:
 * int8 through the maximum of the bit patterns of |x| (kvq__maxbits in
 * int_avx2.c), int4 through sums of x * 0. */
KVQ__T512 static inline __attribute__((always_inline)) int
kvq__i512_reduce_batch(const kvq_codec *c, const float *src, size_t nb, float *ra, float *rb,
                       const int ZPG, const int BITS, const size_t pfd) {
    const size_t g = c->group, ng = c->ngroups;
    const size_t F = nb * ng, gz = ZPG ? 16 * (size_t)ZPG : g;
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    __m512 nf = _mm512_setzero_ps();
    int bad = 0;
    for (size_t f0 = 0; f0 < F; f0 += KVQ__ENC512_F) {
        /* the maxima (int8: of |x|) and minima of 16 groups; groups past F
         * repeat the last one (their lanes are not used) */
        __m512 v[16], w[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const float *x = src + KVQ__MIN(f0 + (size_t)i, F - 1) * g;
            if (pfd && f0 + (size_t)i < F)
                for (size_t t = 0; t < gz; t += 16)
                    _mm_prefetch((const char *)(x + pfd + t), _MM_HINT_T0);
            if (BITS == 8) {
                __m512i a = _mm512_and_si512(_mm512_loadu_si512((const void *)x), absmask);
                for (size_t t = 16; t < gz; t += 16)
                    a = _mm512_max_epi32(a, _mm512_and_si512(_mm512_loadu_si512((const void *)(x + t)), absmask));
                v[4 * (i % 4) + i / 4] = _mm512_castsi512_ps(a); /* kvq__i512_red16's input order */
            } else { /* maxima and minima of one load */
                __m512 a = _mm512_loadu_ps(x), b = a, z = _mm512_mul_ps(a, _mm512_setzero_ps());
                for (size_t t = 16; t < gz; t += 16) {
                    const __m512 y = _mm512_loadu_ps(x + t);
                    a = _mm512_max_ps(a, y);
                    b = _mm512_min_ps(b, y);
                    z = _mm512_fmadd_ps(y, _mm512_setzero_ps(), z);
                }
                /* +-0 or NaN: OR keeps a NaN's exponent and mantissa bits */
                nf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(nf), _mm512_castps_si512(z)));
                v[4 * (i % 4) + i / 4] = a;
                w[4 * (i % 4) + i / 4] = b;
            }
        }
        const __m512 rmax = kvq__i512_red16(v, BITS == 8 ? 3 : 1);
        _mm512_storeu_ps(ra + f0, rmax);
        if (BITS == 8)
            bad |= _mm512_cmpgt_epi32_mask(_mm512_castps_si512(rmax), _mm512_set1_epi32(0x7f7fffff)) != 0;
        if (BITS != 8)
            _mm512_storeu_ps(rb + f0, kvq__i512_red16(w, 2));
    }
    return bad | (_mm512_cmp_ps_mask(nf, nf, _CMP_UNORD_Q) != 0);
}

/* The codes (and stored parameters) of nb vectors given their group
 * parameters. The upper clamp is done in float only when CL, a scale
 * saturated; otherwise (x - m) * inv <= 1.5 L (kvq__quant32 in
 * int_avx2.c) and the packs (int8) or an unsigned byte minimum (int4) clamp
 * the same. */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__i512_codes_batch(const kvq_codec *c, uint8_t *dst, const float *src, size_t nb,
                      const uint8_t *zg, const uint16_t *sh, const uint16_t *mh, const float *mf,
                      const float *iv, const int ZPG, const int BITS, const int CL) {
    const size_t d = c->d, ng = c->ngroups, bytes = c->bytes;
    const __m512 top = _mm512_set1_ps(BITS == 8 ? 127.0f : 15.0f);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (size_t j = 0; j < nb; j++) {
        const float *x = src + j * d;
        uint8_t *v = dst + j * bytes;
        for (size_t k = 0; k < ng; k++) { /* (a memcpy of 2 ng bytes would be a call) */
            kvq__st16(v + 2 * k, sh[j * ng + k]);
            if (BITS != 8)
                kvq__st16(v + 2 * (ng + k), mh[j * ng + k]);
        }
        uint8_t *codes = v + (BITS == 8 ? 2 : 4) * ng;
        __m512i pend = _mm512_setzero_si512(); /* int4: the nibble words of an odd block */
        for (size_t t = 0, blk = 0; t < d; t += 64, blk++) {
            __m512i q[4];
            /* the group of each 16 values: from the table, or known to be
             * the block's first group for 1, 2, or 4 of its 16-value parts */
            const size_t fb = j * ng + zg[t / 16];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const size_t f = ZPG >= 4 ? fb : ZPG == 2 ? fb + (size_t)k / 2 : j * ng + zg[t / 16 + (size_t)k];
                __m512 y = _mm512_loadu_ps(x + t + 16 * (size_t)k);
                if (BITS != 8)
                    y = _mm512_sub_ps(y, _mm512_set1_ps(mf[f]));
                y = _mm512_mul_ps(y, _mm512_set1_ps(iv[f]));
                q[k] = kvq__i512_f2i(CL ? _mm512_min_ps(y, top) : y);
            }
            if (BITS == 8) {
                __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
                b = _mm512_max_epi8(b, _mm512_set1_epi8(-127));
                _mm512_storeu_si512((void *)(codes + t), _mm512_permutexvar_epi32(order, b));
                continue;
            }
            __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(q[0], q[1]), _mm512_packus_epi32(q[2], q[3]));
            if (!CL)
                b = _mm512_min_epu8(b, _mm512_set1_epi8(15));
            /* value pairs to one byte each, lo + 16 hi (in the packs' lane order) */
            const __m512i w = _mm512_maddubs_epi16(_mm512_permutexvar_epi32(order, b), _mm512_set1_epi16(0x1001));
            if (blk % 2 == 0) {
                pend = w;
                if (t + 64 < d)
                    continue;
                const __m512i p = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                                           _mm512_packus_epi16(pend, pend));
                _mm256_storeu_si256((__m256i *)(void *)(codes + t / 2), _mm512_castsi512_si256(p));
            } else {
                const __m512i p = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
                                                           _mm512_packus_epi16(pend, w));
                _mm512_storeu_si512((void *)(codes + t / 2 - 32), p);
            }
        }
    }
}

/* The codes of nb vectors of one batch from their reductions ra, rb. */
#define KVQ__ENC512_NP (KVQ__MAX_HEAD_DIM / 16 + KVQ__ENC512_F)
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__i512_encode_batch(const kvq_codec *c, uint8_t *dst, const float *src, size_t nb,
                       const uint8_t *zg, const float *ra, const float *rb, const int ZPG,
                       const int BITS) {
    const size_t F = nb * c->ngroups;
    _Alignas(64) float mf[KVQ__ENC512_NP], iv[KVQ__ENC512_NP];
    _Alignas(64) uint16_t sh[KVQ__ENC512_NP], mh[KVQ__ENC512_NP];
    const __m512 zero = _mm512_setzero_ps(), lim = _mm512_set1_ps(65504.0f);
    const __m512 nlim = _mm512_set1_ps(-65504.0f), one = _mm512_set1_ps(1.0f);
    __mmask16 sat = 0;
    for (size_t f0 = 0; f0 < F; f0 += KVQ__ENC512_F) {
        const __m512 rmax = _mm512_loadu_ps(ra + f0);
        const __m512 rmin = BITS == 8 ? zero : _mm512_loadu_ps(rb + f0);
        __m512 r;
        if (BITS == 8) {
            r = _mm512_div_ps(rmax, _mm512_set1_ps(127.0f));
            sat |= _mm512_cmp_ps_mask(r, lim, _CMP_NLT_UQ);
            r = _mm512_min_ps(r, lim);
        } else {
            __m512 mn = _mm512_add_ps(rmin, zero); /* -0 -> +0 */
            __m512 mx = _mm512_add_ps(rmax, zero);
            mn = _mm512_min_ps(_mm512_max_ps(mn, nlim), lim);
            const __m256i m16 = kvq__i512_f2h(mn);
            const __m512 m = kvq__i512_h2fv(m16);
            r = _mm512_div_ps(_mm512_sub_ps(mx, m), _mm512_set1_ps(BITS == 4 ? 15.0f : 3.0f));
            sat |= _mm512_cmp_ps_mask(r, lim, _CMP_NLT_UQ);
            r = _mm512_min_ps(_mm512_max_ps(r, zero), lim);
            _mm512_store_ps(mf + f0, m);
            _mm256_store_si256((__m256i *)(void *)(mh + f0), m16);
        }
        const __m256i s16 = kvq__i512_f2h(r);
        const __m512 sv = kvq__i512_h2fv(s16);
        _mm512_store_ps(iv + f0, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(sv, zero, _CMP_GT_OQ), one, sv));
        _mm256_store_si256((__m256i *)(void *)(sh + f0), s16);
    }
    if (sat)
        kvq__i512_codes_batch(c, dst, src, nb, zg, sh, mh, mf, iv, ZPG, BITS, 1);
    else
        kvq__i512_codes_batch(c, dst, src, nb, zg, sh, mh, mf, iv, ZPG, BITS, 0);
}

/* Batches of vectors share the group-parameter pass (16 groups; with
 * ng < 16 groups per vector, several vectors fill it). phase 0: each
 * batch reduced into ra/rb and encoded; phase 1: every batch reduced into
 * ra/rb + b * KVQ__ENC512_F (returns nonzero on NaN/Inf); phase 2: every
 * batch encoded from there. */
KVQ__T512 static inline __attribute__((always_inline)) int
kvq__i512_encode_pass(const kvq_codec *c, uint8_t *dst, const float *src, size_t n, float *ra,
                      float *rb, size_t stride, int phase, const int ZPG, const int BITS) {
    const size_t ng = c->ngroups;
    const size_t batch = ng < KVQ__ENC512_F && KVQ__ENC512_F % ng == 0 ? KVQ__ENC512_F / ng : 1;
    uint8_t zg[KVQ__MAX_HEAD_DIM / 16]; /* group of each 16 values */
    for (size_t z = 0, gi = 0, left = c->group; z < c->d / 16; z++) {
        zg[z] = (uint8_t)gi;
        if ((left -= 16) == 0) {
            gi++;
            left = c->group;
        }
    }
    int bad = 0;
    for (size_t j = 0, b = 0; j < n; j += batch, b++) {
        uint8_t *o = dst + j * c->bytes;
        const float *x = src + j * c->d;
        const size_t m = KVQ__MIN(batch, n - j);
        float *pa = ra + b * stride, *pb = rb + b * stride;
        if (phase != 2) {
            if (BITS == 8) /* see kvq__enc_pf_dist */
                kvq__enc_prefetch_part(x, j, batch, n, c->d, phase == 0 ? 1 : 0);
            bad |= kvq__i512_reduce_batch(c, x, m, pa, pb, ZPG, BITS,
                                          BITS == 8 ? 0 : kvq__enc_pf_dist(j, batch, n, c->d));
        }
        if (BITS == 8 && phase == 0)
            kvq__enc_prefetch_part(x, j, batch, n, c->d, 2);
        if (phase != 1)
            kvq__i512_encode_batch(c, o, x, m, zg, pa, pb, ZPG, BITS);
    }
    return bad;
}

/* The pass for the codec's 16-value vectors per group: fixed for the common
 * groups (2, 4, 8), any multiple of 16 otherwise. */
KVQ__T512 static inline __attribute__((always_inline)) int
kvq__i512_encode_body(const kvq_codec *c, uint8_t *dst, const float *src, size_t n, float *ra,
                      float *rb, size_t stride, int phase, const int BITS) {
    const size_t zpg = c->group / 16;
    if (zpg == 2)
        return kvq__i512_encode_pass(c, dst, src, n, ra, rb, stride, phase, 2, BITS);
    if (zpg == 8)
        return kvq__i512_encode_pass(c, dst, src, n, ra, rb, stride, phase, 8, BITS);
    if (zpg == 4)
        return kvq__i512_encode_pass(c, dst, src, n, ra, rb, stride, phase, 4, BITS);
    return kvq__i512_encode_pass(c, dst, src, n, ra, rb, stride, phase, 0, BITS);
}

/* kvq__i512_encode_body with one instance per width. */
KVQ__T512 static int kvq__i512_encode_run(const kvq_codec *c, uint8_t *dst, const float *src,
                                          size_t n, float *ra, float *rb, size_t stride, int phase) {
    if (c->bits == 8)
        return kvq__i512_encode_body(c, dst, src, n, ra, rb, stride, phase, 8);
    return kvq__i512_encode_body(c, dst, src, n, ra, rb, stride, phase, 4);
}

/* One pass: the batches' reductions in place (input already checked). */
KVQ__T512 static void kvq__i512_encode(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    _Alignas(64) float ra[KVQ__ENC512_NP], rb[KVQ__ENC512_NP];
    kvq__i512_encode_run(c, dst, src, n, ra, rb, 0, 0);
}

/* Checked encode (codec_impl.h, encode_chk): kvq__int_encode_checked
 * (int_tile.h) over batches of 16 groups (a batch takes ceil(F / 16) * 16
 * floats: the passes store 16 lanes). */
KVQ__T512 static int kvq__i512_encode_chk(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    const size_t ng = c->ngroups;
    const size_t batch = ng < KVQ__ENC512_F && KVQ__ENC512_F % ng == 0 ? KVQ__ENC512_F / ng : 1;
    const size_t stride = (batch * ng + KVQ__ENC512_F - 1) / KVQ__ENC512_F * KVQ__ENC512_F;
    return kvq__int_encode_checked(c, dst, src, n, batch, stride, kvq__i512_encode_run);
}

#define KVQ__VNNI 1
#define KVQ__TGT KVQ__T512VNNI
#define KVQ__FN(name) name##_vnni
#include "int_avx512_body.h"
#undef KVQ__VNNI
#undef KVQ__TGT
#undef KVQ__FN

#define KVQ__VNNI 0
#define KVQ__TGT KVQ__T512
#define KVQ__FN(name) name##_bw
#include "int_avx512_body.h"
#undef KVQ__VNNI
#undef KVQ__TGT
#undef KVQ__FN

void KVQ__SEL512(kvq__int_avx512_select)(kvq_codec *c, unsigned feat) {
    if ((c->bits == 8 || c->bits == 4) && c->d % 64 == 0 && c->group % 16 == 0 &&
        c->ngroups <= KVQ__MAX_HEAD_DIM / 16) {
        c->k.encode = kvq__i512_encode;
        c->k.encode_chk = kvq__i512_encode_chk;
    }
    if (!kvq__tile_ok(c))
        return;
    const int vnni = (feat & KVQ__X512_VNNI) != 0, b8 = c->bits == 8;
    kvq__tile_plan tp;
    kvq__tile_plan_make(c, &tp);
    c->tqp_bytes = tp.bytes;
    c->k.tprep = kvq__int_tprep_avx2;
    c->k.tscore = vnni ? (b8 ? kvq__i512_tscore8_vnni : kvq__i512_tscore4_vnni)
                       : (b8 ? kvq__i512_tscore8_bw : kvq__i512_tscore4_bw);
    c->pf_tscore = 1;
    if (c->group % 16 == 0) {
        c->k.taccum = vnni ? (b8 ? kvq__i512_taccum8_vnni : kvq__i512_taccum4_vnni)
                           : (b8 ? kvq__i512_taccum8_bw : kvq__i512_taccum4_bw);
        c->k.taccum_run = vnni ? (b8 ? kvq__i512_taccum_run8_vnni : kvq__i512_taccum_run4_vnni)
                               : (b8 ? kvq__i512_taccum_run8_bw : kvq__i512_taccum_run4_bw);
    }
}
