/*
 * int_avx2.c - AVX2 kernels of int8/int4/int2 (format and reference in
 * src/codec/int.c).
 *
 * encode  bit-exact with the reference: the group parameters are computed
 *         eight groups at a time with the same correctly rounded operations
 *         (div, min/max clamps, F16C conversion of values already clamped to
 *         +-65504, which rounds like kvq__f16_from_f32), and codes use
 *         cvtps_epi32 (round to nearest even under the default MXCSR, like
 *         nearbyintf). Needs g % 8 == 0.
 * decode  bit-exact too (one multiply, then one add). Needs g % 8 == 0.
 * accum   acc += (w*s_g) * q for every value; the minimum term is summed per
 *         group (sum_j w_j m_g) and added once at the end. Needs g % 8 == 0.
 * score   the query is quantized to int8 in prep, one fp32 scale per block
 *         of 32 values (|error| <= scale/2 per value), and dotted with the
 *         codes by maddubs (u8 x s8; int8 keys use |k| and sign(q, k)) and
 *         madd; the per-group key scale, the query block scale and the
 *         minimum term (exact float query sums) are applied in float. Needs
 *         d % 32 == 0 and groups that line up with the 8 int32 lanes of a
 *         chunk (see kvq__int_plan_make).
 * Prepared query (score), per 32-byte code chunk ci of V values (V = 32, 64,
 * 128 for int8, int4, int2):
 *   [nch x V int8 query codes, plane order: plane p byte j is the value
 *    held by bits p of code byte j of the chunk]
 *   [nch x 8 f32 query block scale for each int32 lane]
 *   int4/int2 only: mode S [nch x 8 f32 query sum over each lane's values]
 *                   mode U [ng  x 8 f32 {query sum over the group, 0...}]
 * Values past d are zero, so partial last chunks need no special case.
 */
#include "../kernels.h"
#include "simd_avx2.h"

#define KVQ__F16_MAXF 65504.0f
#define KVQ__MAX_NG8 (KVQ__MAX_HEAD_DIM / 8 + 8) /* groups of >= 8 values, padded */

/* ---- small helpers ---- */

static inline float kvq__hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
static inline float kvq__hmin256(__m256 v) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    m = _mm_min_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline uint32_t kvq__ldu32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* cnt (< 8) fp16 values at p, exactly, into the low lanes (rest zero). */
static inline __m128i kvq__load_halves(const uint8_t *p, size_t cnt) {
    if (cnt >= 8)
        return _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i lo = cnt >= 4 ? _mm_loadl_epi64((const __m128i *)(const void *)p) : _mm_setzero_si128();
    switch (cnt) {
    case 1:
        return _mm_cvtsi32_si128(kvq__ld16(p));
    case 2:
        return _mm_cvtsi32_si128((int)kvq__ldu32(p));
    case 3:
        return _mm_insert_epi16(_mm_cvtsi32_si128((int)kvq__ldu32(p)), kvq__ld16(p + 4), 2);
    case 5:
        return _mm_insert_epi16(lo, kvq__ld16(p + 8), 4);
    case 6:
        return _mm_insert_epi32(lo, (int)kvq__ldu32(p + 8), 2);
    case 7:
        return _mm_insert_epi16(_mm_insert_epi32(lo, (int)kvq__ldu32(p + 8), 2), kvq__ld16(p + 12),
                                6);
    default:
        return lo;
    }
}

/* Stores the low cnt fp16 lanes of v at p, exactly. */
static inline void kvq__store_halves(uint8_t *p, __m128i v, size_t cnt) {
    if (cnt >= 8) {
        _mm_storeu_si128((__m128i *)(void *)p, v);
        return;
    }
    if (cnt & 4) {
        _mm_storel_epi64((__m128i *)(void *)p, v);
        v = _mm_srli_si128(v, 8);
        p += 8;
    }
    if (cnt & 2) {
        uint32_t u = (uint32_t)_mm_cvtsi128_si32(v);
        memcpy(p, &u, 4);
        v = _mm_srli_si128(v, 4);
        p += 4;
    }
    if (cnt & 1)
        kvq__st16(p, (uint16_t)_mm_cvtsi128_si32(v));
}

/* ng fp16 values at p to floats in f[0 .. ng rounded up to 8). */
static inline void kvq__halves_to_f32(float *f, const uint8_t *p, size_t ng) {
    for (size_t k = 0; k < ng; k += 8)
        _mm256_store_ps(f + k, _mm256_cvtph_ps(kvq__load_halves(p + 2 * k, ng - k)));
}

/* Four vectors of 8 int32 in [-32768, 32767] to 32 bytes in value order,
 * saturated signed (int8 codes) or unsigned (packed int2 bytes). */
static inline __m256i kvq__pack32(__m256i a, __m256i b, __m256i c, __m256i d, int is_unsigned) {
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i r = is_unsigned ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 int32 in [-128, 127] to 8 bytes at p. */
static inline void kvq__store8_s8(uint8_t *p, __m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(void *)p, _mm_packs_epi16(w, w));
}

/* ---- encode ---- */

static void kvq__int_encode_one_avx2(const kvq_codec *c, uint8_t *dst, const float *x) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    const int bits = c->bits;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 zero = _mm256_setzero_ps(), lim = _mm256_set1_ps(KVQ__F16_MAXF);
    const __m256 nlim = _mm256_set1_ps(-KVQ__F16_MAXF), one = _mm256_set1_ps(1.0f);
    _Alignas(32) float ra[KVQ__MAX_NG8], rb[KVQ__MAX_NG8];
    _Alignas(32) float mf[KVQ__MAX_NG8], invf[KVQ__MAX_NG8];
    _Alignas(32) uint8_t qb[KVQ__MAX_HEAD_DIM];
    const size_t ng8 = (ng + 7) & ~(size_t)7;

    /* group reductions (exact: min/max are order independent up to the sign
     * of zero, which is folded below) */
    for (size_t gi = 0; gi < ng; gi++) {
        const float *xg = x + gi * g;
        if (bits == 8) {
            __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg), absmask);
            for (size_t t = 8; t < g; t += 8)
                a = _mm256_max_ps(a, _mm256_and_ps(_mm256_loadu_ps(xg + t), absmask));
            ra[gi] = kvq__hmax256(a);
        } else {
            __m256 v = _mm256_loadu_ps(xg), lo = v, hi = v;
            for (size_t t = 8; t < g; t += 8) {
                v = _mm256_loadu_ps(xg + t);
                lo = _mm256_min_ps(lo, v);
                hi = _mm256_max_ps(hi, v);
            }
            ra[gi] = kvq__hmin256(lo);
            rb[gi] = kvq__hmax256(hi);
        }
    }
    for (size_t gi = ng; gi < ng8; gi++)
        ra[gi] = rb[gi] = 0.0f;

    /* group parameters, eight groups at a time */
    for (size_t k = 0; k < ng; k += 8) {
        const size_t cnt = KVQ__MIN(8, ng - k);
        __m256 r;
        if (bits == 8) {
            r = _mm256_min_ps(_mm256_div_ps(_mm256_load_ps(ra + k), _mm256_set1_ps(127.0f)), lim);
        } else {
            __m256 mn = _mm256_add_ps(_mm256_load_ps(ra + k), zero);
            __m256 mx = _mm256_add_ps(_mm256_load_ps(rb + k), zero);
            mn = _mm256_min_ps(_mm256_max_ps(mn, nlim), lim);
            __m128i mh = _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT);
            __m256 m = _mm256_cvtph_ps(mh);
            r = _mm256_div_ps(_mm256_sub_ps(mx, m), _mm256_set1_ps(bits == 4 ? 15.0f : 3.0f));
            r = _mm256_min_ps(_mm256_max_ps(r, zero), lim);
            _mm256_store_ps(mf + k, m);
            kvq__store_halves(dst + 2 * ng + 2 * k, mh, cnt);
        }
        __m128i sh = _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT);
        __m256 s = _mm256_cvtph_ps(sh);
        __m256 inv = _mm256_and_ps(_mm256_div_ps(one, s), _mm256_cmp_ps(s, zero, _CMP_GT_OQ));
        _mm256_store_ps(invf + k, inv);
        kvq__store_halves(dst + 2 * k, sh, cnt);
    }

    /* codes; clamping before rounding equals rounding before clamping */
    if (bits == 8) {
        const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        uint8_t *codes = dst + 2 * ng;
        for (size_t gi = 0; gi < ng; gi++) {
            const __m256 iv = _mm256_set1_ps(invf[gi]);
            for (size_t t = gi * g; t < (gi + 1) * g; t += 8) {
                __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + t), iv);
                y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
                kvq__store8_s8(codes + t, _mm256_cvtps_epi32(y));
            }
        }
        return;
    }
    const __m256 hi = _mm256_set1_ps(bits == 4 ? 15.0f : 3.0f);
    for (size_t gi = 0; gi < ng; gi++) {
        const __m256 iv = _mm256_set1_ps(invf[gi]), mv = _mm256_set1_ps(mf[gi]);
        for (size_t t = gi * g; t < (gi + 1) * g; t += 8) {
            __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + t), mv), iv);
            y = _mm256_min_ps(_mm256_max_ps(y, zero), hi);
            kvq__store8_s8(qb + t, _mm256_cvtps_epi32(y));
        }
    }
    uint8_t *codes = dst + 4 * ng;
    size_t t = 0;
    if (bits == 4) {
        const __m256i c116 = _mm256_set1_epi16(0x1001); /* bytes 1, 16 */
        for (; t + 64 <= d; t += 64) {
            __m256i w0 = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(qb + t)), c116);
            __m256i w1 =
                _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(qb + t + 32)), c116);
            __m256i o = _mm256_permute4x64_epi64(_mm256_packus_epi16(w0, w1), 0xd8);
            _mm256_storeu_si256((__m256i *)(void *)(codes + t / 2), o);
        }
        for (; t < d; t += 2)
            codes[t / 2] = (uint8_t)(qb[t] | (qb[t + 1] << 4));
    } else {
        const __m256i c14 = _mm256_set1_epi16(0x0401), c116 = _mm256_set1_epi32(0x00100001);
        for (; t + 128 <= d; t += 128) {
            __m256i p[4];
            for (int k = 0; k < 4; k++)
                p[k] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(qb + t + 32 * k)),
                                         c14),
                    c116);
            _mm256_storeu_si256((__m256i *)(void *)(codes + t / 4),
                                kvq__pack32(p[0], p[1], p[2], p[3], 1));
        }
        for (; t < d; t += 4)
            codes[t / 4] =
                (uint8_t)(qb[t] | (qb[t + 1] << 2) | (qb[t + 2] << 4) | (qb[t + 3] << 6));
    }
}

static void kvq__int_encode_avx2(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    for (size_t j = 0; j < n; j++)
        kvq__int_encode_one_avx2(c, dst + j * c->bytes, src + j * c->d);
}

/* ---- code unpacking (decode, accumulate) ---- */

/* The codes of one int4/int2 vector as one byte per value in value order. */
static inline void kvq__int_unpack(int bits, size_t d, const uint8_t *codes, uint8_t *cb) {
    size_t i = 0; /* code byte */
    if (bits == 4) {
        const size_t nb = d / 2;
        const __m256i m = _mm256_set1_epi8(15);
        for (; i + 32 <= nb; i += 32) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(codes + i));
            __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
            _mm256_store_si256((__m256i *)(cb + 2 * i), _mm256_permute2x128_si256(a, b, 0x20));
            _mm256_store_si256((__m256i *)(cb + 2 * i + 32), _mm256_permute2x128_si256(a, b, 0x31));
        }
        if (i + 16 <= nb) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(codes + i));
            __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
            _mm_store_si128((__m128i *)(cb + 2 * i), _mm_unpacklo_epi8(lo, hi));
            _mm_store_si128((__m128i *)(cb + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
            i += 16;
        }
        for (; i < nb; i++) {
            cb[2 * i] = codes[i] & 15;
            cb[2 * i + 1] = codes[i] >> 4;
        }
        return;
    }
    const size_t nb = d / 4;
    const __m256i m = _mm256_set1_epi8(3);
    for (; i + 32 <= nb; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(codes + i));
        __m256i p0 = _mm256_and_si256(v, m), p1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), m);
        __m256i p2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        __m256i p3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), m);
        __m256i a = _mm256_unpacklo_epi8(p0, p1), b = _mm256_unpacklo_epi8(p2, p3);
        __m256i e = _mm256_unpackhi_epi8(p0, p1), f = _mm256_unpackhi_epi8(p2, p3);
        __m256i q0 = _mm256_unpacklo_epi16(a, b), q1 = _mm256_unpackhi_epi16(a, b);
        __m256i q2 = _mm256_unpacklo_epi16(e, f), q3 = _mm256_unpackhi_epi16(e, f);
        uint8_t *o = cb + 4 * i;
        _mm256_store_si256((__m256i *)o, _mm256_permute2x128_si256(q0, q1, 0x20));
        _mm256_store_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(q2, q3, 0x20));
        _mm256_store_si256((__m256i *)(o + 64), _mm256_permute2x128_si256(q0, q1, 0x31));
        _mm256_store_si256((__m256i *)(o + 96), _mm256_permute2x128_si256(q2, q3, 0x31));
    }
    for (; i < nb; i++) {
        unsigned v = codes[i];
        cb[4 * i] = v & 3;
        cb[4 * i + 1] = (v >> 2) & 3;
        cb[4 * i + 2] = (v >> 4) & 3;
        cb[4 * i + 3] = v >> 6;
    }
}

/* 8 codes at p as floats (signed for int8). */
static inline __m256 kvq__codes8_f32(const uint8_t *p, int is_signed) {
    __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)p);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

/* ---- decode ---- */

static void kvq__int_decode_avx2(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    const int bits = c->bits;
    _Alignas(32) uint8_t cb[KVQ__MAX_HEAD_DIM];
    _Alignas(32) float sf[KVQ__MAX_NG8], mf[KVQ__MAX_NG8];
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = src + j * c->bytes;
        float *o = dst + j * d;
        kvq__halves_to_f32(sf, v, ng);
        if (bits == 8) {
            const uint8_t *codes = v + 2 * ng;
            for (size_t gi = 0; gi < ng; gi++) {
                const __m256 s = _mm256_set1_ps(sf[gi]);
                for (size_t t = gi * g; t < (gi + 1) * g; t += 8)
                    _mm256_storeu_ps(o + t, _mm256_mul_ps(s, kvq__codes8_f32(codes + t, 1)));
            }
            continue;
        }
        kvq__halves_to_f32(mf, v + 2 * ng, ng);
        kvq__int_unpack(bits, d, v + 4 * ng, cb);
        for (size_t gi = 0; gi < ng; gi++) {
            const __m256 s = _mm256_set1_ps(sf[gi]), m = _mm256_set1_ps(mf[gi]);
            for (size_t t = gi * g; t < (gi + 1) * g; t += 8)
                _mm256_storeu_ps(o + t,
                                 _mm256_add_ps(m, _mm256_mul_ps(s, kvq__codes8_f32(cb + t, 0))));
        }
    }
}

/* ---- accumulate ---- */

/* Up to 4 weight rows at once; each value vector is unpacked once for them. */
static void kvq__int_accum_rows(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                size_t wstride, size_t nr, const uint8_t *vals, size_t n) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    const size_t ng8 = (ng + 7) & ~(size_t)7;
    const int bits = c->bits, asym = bits != 8;
    _Alignas(32) uint8_t cb[KVQ__MAX_HEAD_DIM];
    _Alignas(32) float sf[KVQ__MAX_NG8], mf[KVQ__MAX_NG8];
    _Alignas(32) float ws[4][KVQ__MAX_NG8], tm[4][KVQ__MAX_NG8]; /* w*s_g; sum_j w_j m_g */
    for (size_t r = 0; r < nr; r++)
        for (size_t k = 0; k < ng8; k++)
            tm[r][k] = 0.0f;
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = vals + j * c->bytes;
        const uint8_t *codes;
        kvq__halves_to_f32(sf, v, ng);
        if (asym) {
            kvq__halves_to_f32(mf, v + 2 * ng, ng);
            kvq__int_unpack(bits, d, v + 4 * ng, cb);
            codes = cb;
        } else {
            codes = v + 2 * ng;
        }
        for (size_t r = 0; r < nr; r++) {
            const __m256 wv = _mm256_set1_ps(w[r * wstride + j]);
            for (size_t k = 0; k < ng; k += 8) {
                _mm256_store_ps(ws[r] + k, _mm256_mul_ps(wv, _mm256_load_ps(sf + k)));
                if (asym)
                    _mm256_store_ps(tm[r] + k, _mm256_fmadd_ps(wv, _mm256_load_ps(mf + k),
                                                               _mm256_load_ps(tm[r] + k)));
            }
        }
        for (size_t gi = 0; gi < ng; gi++) {
            for (size_t t = gi * g; t < (gi + 1) * g; t += 8) {
                const __m256 f = kvq__codes8_f32(codes + t, !asym);
                for (size_t r = 0; r < nr; r++) {
                    float *a = acc + r * astride + t;
                    _mm256_storeu_ps(
                        a, _mm256_fmadd_ps(_mm256_set1_ps(ws[r][gi]), f, _mm256_loadu_ps(a)));
                }
            }
        }
    }
    if (!asym)
        return;
    for (size_t r = 0; r < nr; r++)
        for (size_t gi = 0; gi < ng; gi++) {
            const __m256 m = _mm256_set1_ps(tm[r][gi]);
            for (size_t t = gi * g; t < (gi + 1) * g; t += 8) {
                float *a = acc + r * astride + t;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), m));
            }
        }
}

static void kvq__int_accum_avx2(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    for (size_t i = 0; i < nq; i += 4)
        kvq__int_accum_rows(c, acc + i * astride, astride, w + i * wstride, wstride,
                            KVQ__MIN(4, nq - i), vals, n);
}

/* ---- score ---- */

enum { KVQ__MODE_U = 1, KVQ__MODE_S = 2 };

/* How a codec's chunks meet its groups, and where the prepared query keeps
 * its parts. Chunk ci covers values [ci*V, ci*V + V); int32 lane l of its
 * dot product covers W = V/8 consecutive values from ci*V + W*l.
 * mode U: every chunk lies inside one group (g % V == 0, or one group);
 *         the scale is broadcast per group.
 * mode S: V % g == 0 and g % W == 0: every lane lies inside one group and a
 *         chunk spans gpc = V/g (2, 4 or 8) groups. With gpc == 8 the 8
 *         scales of a chunk are its lanes in order. Otherwise the chunk's
 *         groups lie in one aligned set of 4 scales, which pshufb orders
 *         so that one immediate vshufps spreads them to the lanes
 *         (gpc 2: halves 0123|1032, element 0 or 2; gpc 4: 0123|2301,
 *         elements 0011); variable permutes are slow on some cores.
 * The minimum term sum_g m_g * qsum_g is one multiply-add per 8 groups (per
 * 4 when ng <= 4). Lanes past the data are zeroed by masks, so garbage
 * fp16 bits never meet a zero weight. */
typedef struct {
    int mode;
    size_t ng, V, W, nch, last_nb; /* last_nb: code bytes in the last chunk */
    size_t cpg;                    /* U: chunks per group */
    size_t gpc;                    /* S: groups per chunk */
    size_t off_qs, off_ql, size;
    uint16_t kmask[8]; /* S: scale lanes with data in the last set (gpc < 8: of 4
                          groups) or last chunk (gpc == 8) */
    uint16_t mmask[8]; /* minimum lanes with data in the last window */
} kvq__int_plan;

static int kvq__int_plan_make(const kvq_codec *c, kvq__int_plan *p) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    const int bits = c->bits, asym = bits != 8;
    memset(p, 0, sizeof *p);
    if (d % 32 != 0)
        return 0;
    p->ng = ng;
    p->V = bits == 8 ? 32 : bits == 4 ? 64 : 128;
    p->W = p->V / 8;
    p->nch = (d + p->V - 1) / p->V;
    p->last_nb = (d - (p->nch - 1) * p->V) * (size_t)bits / 8;
    size_t end = 0; /* bytes of a vector the scale / minimum loads may touch */
    if (ng == 1 || g % p->V == 0) {
        p->mode = KVQ__MODE_U;
        p->cpg = ng == 1 ? p->nch : g / p->V;
    } else if (p->V % g == 0 && g % p->W == 0) {
        p->mode = KVQ__MODE_S;
        p->gpc = p->V / g;
        size_t valid = p->gpc == 8 ? (d - (p->nch - 1) * p->V) / g : ng - 4 * ((ng - 1) / 4);
        for (size_t l = 0; l < 8; l++)
            p->kmask[l] = l < valid ? 0xffff : 0;
        end = p->gpc == 8 ? 16 * p->nch : 8 * ((ng + 3) / 4);
    } else {
        return 0;
    }
    if (asym) {
        for (size_t l = 0; l < 8; l++)
            p->mmask[l] = l < (ng <= 4 ? ng : ng - 8 * ((ng - 1) / 8)) ? 0xffff : 0;
        end = KVQ__MAX(end, 2 * ng + (ng <= 4 ? 8 : 16 * ((ng + 7) / 8)));
    }
    if (end > c->bytes)
        return 0;
    p->off_qs = p->nch * p->V;
    p->off_ql = p->off_qs + 32 * p->nch;
    p->size = p->off_ql + (asym ? 4 * ((ng + 7) & ~(size_t)7) : 0);
    return p->size <= c->qp_bytes;
}

/* Whether chunk ci starts an int4 pair (kernel and prep agree on this). */
static inline int kvq__int_pair_start(const kvq__int_plan *p, int bits, size_t ci) {
    if (bits != 4)
        return 0;
    if (p->mode == KVQ__MODE_S)
        return p->gpc == 2 && ci % 2 == 0 && ci + 1 < p->nch;
    size_t e = ci % p->cpg;
    return e % 2 == 0 && e + 1 < p->cpg;
}

static void kvq__int_prep_avx2(const kvq_codec *c, void *qp, const float *q) {
    kvq__int_plan p;
    kvq__int_plan_make(c, &p);
    const size_t d = c->d, g = c->group, ng = c->ngroups, V = p.V, W = p.W;
    const int bits = c->bits;
    uint8_t *base = (uint8_t *)qp;
    int8_t *qc = (int8_t *)base;
    float *qs = (float *)(void *)(base + p.off_qs), *ql = (float *)(void *)(base + p.off_ql);
    _Alignas(32) int8_t qi[KVQ__MAX_HEAD_DIM];
    float bs[KVQ__MAX_HEAD_DIM / 32];
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));

    for (size_t b = 0; b < d / 32; b++) {
        const float *x = q + 32 * b;
        __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
        __m256 x2 = _mm256_loadu_ps(x + 16), x3 = _mm256_loadu_ps(x + 24);
        __m256 a = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(x0, absmask), _mm256_and_ps(x1, absmask)),
            _mm256_max_ps(_mm256_and_ps(x2, absmask), _mm256_and_ps(x3, absmask)));
        float amax = kvq__hmax256(a);
        /* tiny blocks (where 127/amax could overflow) quantize to zero;
         * otherwise |q*inv| <= 127 (plus rounding) and no clamp is needed */
        float inv = amax > 1e-30f ? 127.0f / amax : 0.0f;
        bs[b] = amax > 1e-30f ? amax / 127.0f : 0.0f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i r = kvq__pack32(_mm256_cvtps_epi32(_mm256_mul_ps(x0, iv)),
                                _mm256_cvtps_epi32(_mm256_mul_ps(x1, iv)),
                                _mm256_cvtps_epi32(_mm256_mul_ps(x2, iv)),
                                _mm256_cvtps_epi32(_mm256_mul_ps(x3, iv)), 0);
        _mm256_store_si256((__m256i *)(void *)(qi + 32 * b), r);
    }
    memset(base, 0, p.size);
    if (bits == 8) {
        memcpy(qc, qi, d);
    } else if (bits == 4) {
        for (size_t t = 0; t < d; t++) {
            size_t r = t % 64;
            qc[t - r + (r & 1) * 32 + r / 2] = qi[t];
        }
    } else {
        for (size_t t = 0; t < d; t++) {
            size_t r = t % 128;
            qc[t - r + (r & 3) * 32 + r / 4] = qi[t];
        }
    }
    for (size_t ci = 0; ci < p.nch; ci++)
        for (size_t l = 0; l < 8; l++) {
            /* first value of the block lane l multiplies (see kvq__pair_dot4) */
            size_t t0 = kvq__int_pair_start(&p, bits, ci)
                            ? (2 * (ci + (l % 4) / 2) + l / 4) * 32
                            : ci * V + W * l;
            if (t0 < d)
                qs[8 * ci + l] = bs[t0 / 32];
        }
    if (bits == 8)
        return;
    /* minimum term: sum_g m_g * (sum of q over g), exact float sums, one
     * lane per group, zero past ng */
    for (size_t gi = 0; gi < ng; gi++) {
        float s = 0.0f;
        for (size_t t = gi * g; t < (gi + 1) * g; t++)
            s += q[t];
        ql[gi] = s;
    }
}

/* 32 code bytes of a chunk (nb of them valid, 8..32; the rest read as 0). */
static inline __m256i kvq__load_chunk(const uint8_t *p, size_t nb) {
    if (nb == 32)
        return _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (nb == 16)
        return _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
    if (nb == 8)
        return _mm256_zextsi128_si256(_mm_loadl_epi64((const __m128i *)(const void *)p));
    return _mm256_set_m128i(_mm_loadl_epi64((const __m128i *)(const void *)(p + 16)),
                            _mm_loadu_si128((const __m128i *)(const void *)p));
}

/* The key side of a chunk's integer dot product, computed once per key. */
typedef struct {
    __m256i p0, p1, p2, p3;
} kvq__planes;

static inline __attribute__((always_inline)) kvq__planes kvq__key_planes(__m256i v,
                                                                         const int BITS) {
    kvq__planes k;
    if (BITS == 8) {
        k.p0 = v;
        k.p1 = _mm256_abs_epi8(v);
        k.p2 = k.p3 = v;
    } else if (BITS == 4) {
        const __m256i m = _mm256_set1_epi8(15);
        k.p0 = _mm256_and_si256(v, m);
        k.p1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        k.p2 = k.p3 = k.p0;
    } else {
        const __m256i m = _mm256_set1_epi8(3);
        k.p0 = _mm256_and_si256(v, m);
        k.p1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), m);
        k.p2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
        k.p3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), m);
    }
    return k;
}

/* int32 lanes of sum(code * qcode) over a chunk; qc is 32-byte aligned.
 * No saturation: pair sums stay below 2*127*127 (int8), 4*15*127 (int4),
 * 8*3*127 (int2) before madd. */
static inline __attribute__((always_inline)) __m256i
kvq__chunk_dot(const kvq__planes *k, const int8_t *qc, const int BITS) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i *q = (const __m256i *)(const void *)qc;
    __m256i s;
    if (BITS == 8) {
        s = _mm256_maddubs_epi16(k->p1, _mm256_sign_epi8(_mm256_load_si256(q), k->p0));
    } else if (BITS == 4) {
        s = _mm256_add_epi16(_mm256_maddubs_epi16(k->p0, _mm256_load_si256(q)),
                             _mm256_maddubs_epi16(k->p1, _mm256_load_si256(q + 1)));
    } else {
        __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(k->p0, _mm256_load_si256(q)),
                                     _mm256_maddubs_epi16(k->p1, _mm256_load_si256(q + 1)));
        __m256i b = _mm256_add_epi16(_mm256_maddubs_epi16(k->p2, _mm256_load_si256(q + 2)),
                                     _mm256_maddubs_epi16(k->p3, _mm256_load_si256(q + 3)));
        s = _mm256_add_epi16(a, b);
    }
    return _mm256_madd_epi16(s, ones);
}

#define KVQ__UNROLL4 _Pragma("GCC unroll 4")

/* int4, chunks ci and ci+1 together (needs g % 32 == 0): the two int16
 * product vectors are folded into one before madd, so int32 lane l holds
 * block 2ci + h + 2*(l%4 >= 2), h = l/4 the 128-bit half, i.e. lanes
 * [b0 b0 b2 b2 | b1 b1 b3 b3] for ci = 0. int16 sums stay below 4*15*127*2. */
static inline __attribute__((always_inline)) __m256i
kvq__pair_dot4(const kvq__planes *k0, const kvq__planes *k1, const int8_t *qc) {
    const __m256i *q = (const __m256i *)(const void *)qc;
    __m256i P = _mm256_add_epi16(_mm256_maddubs_epi16(k0->p0, _mm256_load_si256(q)),
                                 _mm256_maddubs_epi16(k0->p1, _mm256_load_si256(q + 1)));
    __m256i Q = _mm256_add_epi16(_mm256_maddubs_epi16(k1->p0, _mm256_load_si256(q + 2)),
                                 _mm256_maddubs_epi16(k1->p1, _mm256_load_si256(q + 3)));
    __m256i S = _mm256_add_epi16(_mm256_unpacklo_epi64(P, Q), _mm256_unpackhi_epi64(P, Q));
    return _mm256_madd_epi16(S, _mm256_set1_epi16(1));
}

/* One key against NQ prepared queries: r[b] gets 8 partial sums whose total
 * is the score. D and G are compile-time shapes (0: read them from the
 * plan). Successive steps (a chunk or an int4 pair) alternate between two
 * accumulators (for latency), the same way for every NQ, so a query's
 * score does not depend on how many queries share the call. */
static inline __attribute__((always_inline)) void
kvq__int_score_key(const kvq__int_plan *p, const uint8_t *key, const uint8_t *qp, size_t qpb,
                   __m256 *r, const int BITS, const int MODE, const int NQ, const size_t D,
                   const size_t G) {
    const int ASYM = BITS != 8;
    const size_t V = 256 / (size_t)BITS;
    const size_t ng = D ? D / G : p->ng;
    const size_t nch = D ? (D + V - 1) / V : p->nch;
    const size_t last_nb = D ? (D - (nch - 1) * V) * (size_t)BITS / 8 : p->last_nb;
    const uint8_t *codes = key + (ASYM ? 4 : 2) * ng;
#define KVQ__QC(b, ci) ((const int8_t *)(qp + (b) * qpb) + (ci) * V)
#define KVQ__QS(b, ci) _mm256_load_ps((const float *)(const void *)(qp + (b) * qpb + p->off_qs) + 8 * (ci))
#define KVQ__CHUNK(ci)                                                                             \
    kvq__key_planes(kvq__load_chunk(codes + 32 * (ci), (ci) + 1 == nch ? last_nb : 32), BITS)
    __m256 acc[4], acc2[4];
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc[b] = acc2[b] = _mm256_setzero_ps();

    if (ASYM) { /* minimum term */
        const uint8_t *mins = key + 2 * ng;
        const size_t nlast = D ? (ng <= 4 ? ng : ng - 8 * ((ng - 1) / 8)) : 0;
        const __m128i mmask =
            D ? _mm_cmpgt_epi16(_mm_set1_epi16((short)nlast), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7))
              : _mm_loadu_si128((const __m128i *)(const void *)p->mmask);
        if (ng <= 4) {
            const __m128 m = _mm_cvtph_ps(
                _mm_and_si128(_mm_loadl_epi64((const __m128i *)(const void *)mins), mmask));
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc2[b] = _mm256_zextps128_ps256(
                _mm_mul_ps(m, _mm_load_ps((const float *)(const void *)(qp + b * qpb + p->off_ql))));
        } else {
            for (size_t w = 0; w < ng; w += 8) {
                __m128i mh = _mm_loadu_si128((const __m128i *)(const void *)(mins + 2 * w));
                const __m256 m = _mm256_cvtph_ps(w + 8 >= ng ? _mm_and_si128(mh, mmask) : mh);
                KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc2[b] = _mm256_fmadd_ps(
                    m, _mm256_load_ps((const float *)(const void *)(qp + b * qpb + p->off_ql) + w),
                    acc2[b]);
            }
        }
    }

    if (MODE == KVQ__MODE_S) {
        const size_t gpc = D ? V / G : p->gpc;
        const __m128i kmask =
            D ? _mm_cmpgt_epi16(_mm_set1_epi16((short)(gpc == 8 ? (D - (nch - 1) * V) / G
                                                               : ng - 4 * ((ng - 1) / 4))),
                                _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7))
              : _mm_loadu_si128((const __m128i *)(const void *)p->kmask);
#pragma GCC unroll 8
        for (size_t ci = 0; ci < nch; ci++) {
            const size_t g0 = ci * gpc, set = g0 / 4; /* first group; its set of 4 */
            const int pair = BITS == 4 && gpc == 2 && ci + 1 < nch;
            __m256 K;
            if (gpc == 8) {
                __m128i sh = _mm_loadu_si128((const __m128i *)(const void *)(key + 16 * ci));
                K = _mm256_cvtph_ps(ci + 1 == nch ? _mm_and_si128(sh, kmask) : sh);
            } else {
                __m128i sh = _mm_loadl_epi64((const __m128i *)(const void *)(key + 8 * set));
                if (set == (ng - 1) / 4)
                    sh = _mm_and_si128(sh, kmask);
                if (pair) /* lanes s0 s0 s2 s2 | s1 s1 s3 s3 */
                    K = _mm256_cvtph_ps(_mm_shuffle_epi8(
                        sh, _mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 2, 3, 2, 3, 6, 7, 6, 7)));
                else {
                    const __m256 X = _mm256_cvtph_ps(_mm_shuffle_epi8(
                        sh, gpc == 2 ? _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 2, 3, 0, 1, 6, 7, 4, 5)
                                     : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 0, 1, 2, 3)));
                    if (gpc == 4)
                        K = _mm256_shuffle_ps(X, X, 0x50);
                    else if (g0 % 4 == 0)
                        K = _mm256_shuffle_ps(X, X, 0x00);
                    else
                        K = _mm256_shuffle_ps(X, X, 0xaa);
                }
            }
            if (pair) {
                kvq__planes k0 = KVQ__CHUNK(ci), k1 = KVQ__CHUNK(ci + 1);
                KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
                    __m256 F = _mm256_mul_ps(_mm256_cvtepi32_ps(kvq__pair_dot4(&k0, &k1, KVQ__QC(b, ci))),
                                             KVQ__QS(b, ci));
                    acc[b] = _mm256_fmadd_ps(F, K, acc[b]);
                    __m256 t = acc[b];
                    acc[b] = acc2[b];
                    acc2[b] = t;
                }
                ci++;
                continue;
            }
            kvq__planes kp = KVQ__CHUNK(ci);
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
                __m256 F = _mm256_mul_ps(_mm256_cvtepi32_ps(kvq__chunk_dot(&kp, KVQ__QC(b, ci), BITS)),
                                         KVQ__QS(b, ci));
                acc[b] = _mm256_fmadd_ps(F, K, acc[b]);
                __m256 t = acc[b];
                acc[b] = acc2[b];
                acc2[b] = t;
            }
        }
    } else {
        const size_t cpg = D ? (ng == 1 ? nch : G / V) : p->cpg;
        size_t ci = 0;
#pragma GCC unroll 4
        for (size_t gi = 0; gi < ng; gi++) {
            __m256 g1[4], g2[4];
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) g1[b] = g2[b] = _mm256_setzero_ps();
#pragma GCC unroll 8
            for (size_t e = 0; e < cpg; e++, ci++) {
                if (BITS == 4 && e + 1 < cpg) {
                    kvq__planes k0 = KVQ__CHUNK(ci), k1 = KVQ__CHUNK(ci + 1);
                    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
                        g1[b] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(kvq__pair_dot4(&k0, &k1, KVQ__QC(b, ci))),
                            KVQ__QS(b, ci), g1[b]);
                        __m256 t = g1[b];
                        g1[b] = g2[b];
                        g2[b] = t;
                    }
                    e++, ci++;
                    continue;
                }
                kvq__planes kp = KVQ__CHUNK(ci);
                KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
                    g1[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kvq__chunk_dot(&kp, KVQ__QC(b, ci), BITS)),
                                            KVQ__QS(b, ci), g1[b]);
                    __m256 t = g1[b];
                    g1[b] = g2[b];
                    g2[b] = t;
                }
            }
            const __m256 s = _mm256_cvtph_ps(_mm_set1_epi16((short)kvq__ld16(key + 2 * gi)));
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc[b] =
                _mm256_fmadd_ps(_mm256_add_ps(g1[b], g2[b]), s, acc[b]);
        }
    }
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) r[b] = _mm256_add_ps(acc[b], acc2[b]);
#undef KVQ__QC
#undef KVQ__QS
#undef KVQ__CHUNK
}

/* Lane sums of four vectors, lane i = sum of the i-th; unpacks and
 * immediate shuffles instead of hadd (slow on some cores). */
static inline __m128 kvq__sum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    __m256 v = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xee));
    return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

/* Scores of NQ prepared queries against n keys; four keys' partial sums are
 * reduced together. */
static inline __attribute__((always_inline)) void
kvq__int_score_body(const kvq_codec *c, const kvq__int_plan *p, float *out, size_t ostride,
                    const uint8_t *qp, const uint8_t *keys, size_t n, const int BITS,
                    const int MODE, const int NQ, const size_t D, const size_t G) {
    const size_t bytes = c->bytes, qpb = c->qp_bytes;
    _Alignas(32) float part[4][4][8];
    for (size_t j0 = 0; j0 < n; j0 += 4) {
        const size_t nk = KVQ__MIN(4, n - j0);
        for (size_t kk = 0; kk < 4; kk++) {
            __m256 r[4];
            if (kk < nk) {
                kvq__int_score_key(p, keys + (j0 + kk) * bytes, qp, qpb, r, BITS, MODE, NQ, D, G);
            } else {
                KVQ__UNROLL4 for (int b = 0; b < NQ; b++)
                    r[b] = _mm256_setzero_ps();
            }
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++)
                _mm256_store_ps(part[b][kk], r[b]);
        }
        KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
            __m128 s = kvq__sum4x8(_mm256_load_ps(part[b][0]), _mm256_load_ps(part[b][1]),
                                   _mm256_load_ps(part[b][2]), _mm256_load_ps(part[b][3]));
            float *o = out + (size_t)b * ostride + j0;
            if (nk == 4) {
                _mm_storeu_ps(o, s);
            } else {
                float tmp[4];
                _mm_storeu_ps(tmp, s);
                for (size_t kk = 0; kk < nk; kk++)
                    o[kk] = tmp[kk];
            }
        }
    }
}

typedef void (*kvq__int_score_fn)(const kvq_codec *c, const kvq__int_plan *p, float *out,
                                  size_t ostride, const uint8_t *qp, const uint8_t *keys, size_t n);

/* Instances: one query or four, generic shapes and the common d = 128 ones. */
#define KVQ__INT_SCORE_FN(NAME, B, M, Q, D, G)                                                     \
    static void NAME(const kvq_codec *c, const kvq__int_plan *p, float *out, size_t ostride,     \
                     const uint8_t *qp, const uint8_t *keys, size_t n) {                           \
        kvq__int_score_body(c, p, out, ostride, qp, keys, n, B, M, Q, D, G);                       \
    }
#define KVQ__INT_SCORE_PAIR(B, M, D, G)                                                            \
    KVQ__INT_SCORE_FN(kvq__int_score_##B##_##M##_##D##_##G##_1, B, M, 1, D, G)                     \
    KVQ__INT_SCORE_FN(kvq__int_score_##B##_##M##_##D##_##G##_4, B, M, 4, D, G)
KVQ__INT_SCORE_PAIR(8, 1, 0, 0)
KVQ__INT_SCORE_PAIR(8, 2, 0, 0)
KVQ__INT_SCORE_PAIR(4, 1, 0, 0)
KVQ__INT_SCORE_PAIR(4, 2, 0, 0)
KVQ__INT_SCORE_PAIR(2, 1, 0, 0)
KVQ__INT_SCORE_PAIR(2, 2, 0, 0)
KVQ__INT_SCORE_PAIR(8, 1, 128, 128)
KVQ__INT_SCORE_PAIR(8, 1, 128, 64)
KVQ__INT_SCORE_PAIR(8, 1, 128, 32)
KVQ__INT_SCORE_PAIR(4, 1, 128, 128)
KVQ__INT_SCORE_PAIR(4, 1, 128, 64)
KVQ__INT_SCORE_PAIR(4, 2, 128, 32)
KVQ__INT_SCORE_PAIR(2, 1, 128, 128)
KVQ__INT_SCORE_PAIR(2, 2, 128, 64)
KVQ__INT_SCORE_PAIR(2, 2, 128, 32)

typedef struct {
    int bits, mode;
    size_t d, g;
    kvq__int_score_fn one, four;
} kvq__int_score_entry;

#define KVQ__INT_SCORE_ENTRY(B, M, D, G)                                                           \
    {B, M, D, G, kvq__int_score_##B##_##M##_##D##_##G##_1, kvq__int_score_##B##_##M##_##D##_##G##_4}
/* fixed shapes first; the d = 0 entries match any shape of their bits/mode */
static const kvq__int_score_entry kvq__int_score_tab[] = {
    KVQ__INT_SCORE_ENTRY(8, 1, 128, 128), KVQ__INT_SCORE_ENTRY(8, 1, 128, 64),
    KVQ__INT_SCORE_ENTRY(8, 1, 128, 32),  KVQ__INT_SCORE_ENTRY(4, 1, 128, 128),
    KVQ__INT_SCORE_ENTRY(4, 1, 128, 64),  KVQ__INT_SCORE_ENTRY(4, 2, 128, 32),
    KVQ__INT_SCORE_ENTRY(2, 1, 128, 128), KVQ__INT_SCORE_ENTRY(2, 2, 128, 64),
    KVQ__INT_SCORE_ENTRY(2, 2, 128, 32),  KVQ__INT_SCORE_ENTRY(8, 1, 0, 0),
    KVQ__INT_SCORE_ENTRY(8, 2, 0, 0),     KVQ__INT_SCORE_ENTRY(4, 1, 0, 0),
    KVQ__INT_SCORE_ENTRY(4, 2, 0, 0),     KVQ__INT_SCORE_ENTRY(2, 1, 0, 0),
    KVQ__INT_SCORE_ENTRY(2, 2, 0, 0),
};

static void kvq__int_score_avx2(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                size_t nq, const uint8_t *keys, size_t n) {
    kvq__int_plan p;
    kvq__int_plan_make(c, &p);
    const kvq__int_score_entry *e = kvq__int_score_tab;
    while (e->bits != c->bits || e->mode != p.mode || (e->d && (e->d != c->d || e->g != c->group)))
        e++;
    size_t i = 0;
    for (; i + 4 <= nq; i += 4)
        e->four(c, &p, out + i * ostride, ostride, (const uint8_t *)qp + i * c->qp_bytes, keys, n);
    for (; i < nq; i++)
        e->one(c, &p, out + i * ostride, ostride, (const uint8_t *)qp + i * c->qp_bytes, keys, n);
}

void kvq__int_avx2_select(kvq_codec *c) {
    if (c->group % 8 == 0) {
        c->k.encode = kvq__int_encode_avx2;
        c->k.decode = kvq__int_decode_avx2;
        c->k.accum = kvq__int_accum_avx2;
    }
    kvq__int_plan p;
    if (kvq__int_plan_make(c, &p)) {
        c->k.prep = kvq__int_prep_avx2;
        c->k.score = kvq__int_score_avx2;
    }
}
