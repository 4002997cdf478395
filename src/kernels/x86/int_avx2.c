/*
 * int_avx2.c - AVX2 kernels of int8/int4/int2 (format and reference in
 * src/codec/int.c). Tuned on a core that splits 256-bit operations (Zen 1):
 * lane-crossing and variable permutes and hadd are avoided in hot loops.
 *
 * encode  bit-exact with the reference: group parameters for up to 8 groups
 *         (of one or several vectors) at once with the same correctly
 *         rounded operations (div, min/max clamps, F16C on values already
 *         within +-65504, which rounds like kvq__f16_from_f32); codes with
 *         cvtps_epi32 (round to nearest even under the default MXCSR, like
 *         nearbyintf). Needs g % 8 == 0.
 * decode  bit-exact too (one multiply, then one add). Needs g % 8 == 0.
 * accum   acc += (w*s_g) * q, with the w*s_g products made once per key and
 *         column tiles of 64/32/16 values for 1/2/4 weight rows kept in
 *         registers over a block of keys; sum_j w_j m_g is added once per
 *         group at the end. Needs g % 16 == 0 (g % 8: a simpler loop).
 * score   the query is quantized to int8 in prep, one fp32 scale per block
 *         of 32 values (|error| <= scale/2 per value), and dotted with the
 *         codes by maddubs (u8 x s8; int8 keys use |k| and sign(q, k)) and
 *         madd; key scale, query block scale and minimum term (exact float
 *         query sums) are applied in float. Needs d % 32 == 0 and groups
 *         that line up with the 8 int32 lanes of a chunk (kvq__int_plan_make).
 *         The common d = 128 shapes have fully unrolled instances.
 * Prepared query (score), for code chunks ci of 32 bytes = V values (V = 32,
 * 64, 128 for int8, int4, int2), 64-byte aligned:
 *   [nch x V int8 query codes in plane order: plane p byte j is the value
 *    held by bit field p of code byte j of the chunk]
 *   [nch x 8 f32: the query block scale for each int32 lane of the chunk's
 *    dot product (for an int4 chunk pair, see kvq__pair_dot4, in the pair's
 *    lane order at the first chunk)]
 *   int4/int2: [ng f32 query sums per group, zero padded to a multiple of 8]
 * Values past d are zero, so partial last chunks need no special case.
 */
#include "../kernels.h"
#include "simd_avx2.h"
#include "int_tile.h"

#define KVQ__F16_MAXF 65504.0f
#define KVQ__MAX_NG8 (KVQ__MAX_HEAD_DIM / 8 + 8) /* groups of >= 8 values, padded */

/* ---- small helpers ---- */

static inline float kvq__hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* min(cnt, 8) fp16 values at p into the low lanes (rest zero); reads no further. */
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

/* ---- encode ---- */

/* Lane k of the result = max (min) over the 8 lanes of v[k]: a transpose
 * with unpacks and immediate shuffles, cheaper than 8 horizontal maxima. */
#define KVQ__HRED8X8(NAME, OP)                                                                     \
    static inline __m256 NAME(const __m256 *v) {                                                   \
        __m256 ab = OP(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));            \
        __m256 cd = OP(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));            \
        __m256 ef = OP(_mm256_unpacklo_ps(v[4], v[5]), _mm256_unpackhi_ps(v[4], v[5]));            \
        __m256 gh = OP(_mm256_unpacklo_ps(v[6], v[7]), _mm256_unpackhi_ps(v[6], v[7]));            \
        __m256 s0 = OP(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xee));          \
        __m256 s1 = OP(_mm256_shuffle_ps(ef, gh, 0x44), _mm256_shuffle_ps(ef, gh, 0xee));          \
        return OP(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));     \
    }
KVQ__HRED8X8(kvq__hmax8x8, _mm256_max_ps)
KVQ__HRED8X8(kvq__hmin8x8, _mm256_min_ps)

/* Group parameters of F groups at once (F <= KVQ__ENC_MAXF), eight lanes
 * at a time: ra = absmax (int8) or min, rb = max; out: fp16 scale (and
 * minimum) bits, float minimum and 1/scale. Bit-exact with the reference:
 * div, min/max clamps and F16C on values already within +-65504. Returns
 * nonzero when a scale saturated at 65504 (see kvq__quant32). */
#define KVQ__ENC_MAXF 136
static inline __attribute__((always_inline)) int
kvq__int_group_params(int bits, size_t F, const float *ra, const float *rb, uint16_t *sh,
                      uint16_t *mh, float *mf, float *invf) {
    const __m256 zero = _mm256_setzero_ps(), lim = _mm256_set1_ps(KVQ__F16_MAXF);
    const __m256 nlim = _mm256_set1_ps(-KVQ__F16_MAXF), one = _mm256_set1_ps(1.0f);
    __m256 sat = zero;
    for (size_t k = 0; k < F; k += 8) {
        __m256 r;
        if (bits == 8) {
            r = _mm256_div_ps(_mm256_loadu_ps(ra + k), _mm256_set1_ps(127.0f));
            sat = _mm256_or_ps(sat, _mm256_cmp_ps(r, lim, _CMP_NLT_UQ));
            r = _mm256_min_ps(r, lim);
        } else {
            __m256 mn = _mm256_add_ps(_mm256_loadu_ps(ra + k), zero); /* -0 -> +0 */
            __m256 mx = _mm256_add_ps(_mm256_loadu_ps(rb + k), zero);
            mn = _mm256_min_ps(_mm256_max_ps(mn, nlim), lim);
            __m128i m16 = _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT);
            __m256 m = _mm256_cvtph_ps(m16);
            r = _mm256_div_ps(_mm256_sub_ps(mx, m), _mm256_set1_ps(bits == 4 ? 15.0f : 3.0f));
            sat = _mm256_or_ps(sat, _mm256_cmp_ps(r, lim, _CMP_NLT_UQ));
            r = _mm256_min_ps(_mm256_max_ps(r, zero), lim);
            _mm256_store_ps(mf + k, m);
            _mm_store_si128((__m128i *)(void *)(mh + k), m16);
        }
        __m128i s16 = _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT);
        __m256 s = _mm256_cvtph_ps(s16);
        _mm256_store_ps(invf + k,
                        _mm256_and_ps(_mm256_div_ps(one, s), _mm256_cmp_ps(s, zero, _CMP_GT_OQ)));
        _mm_store_si128((__m128i *)(void *)(sh + k), s16);
    }
    return _mm256_movemask_ps(sat);
}

/* The codes of 32 values from x as 32 bytes in value order, each group's
 * parameters broadcast from iv/mv (per run of 8 values): int8 clamp(rint(
 * x*inv), -127, 127); int4/int2 clamp(rint((x - m)*inv), 0, L). The lower
 * clamp comes from saturating packs (cvtps_epi32 gives INT_MIN below
 * -2^31, which saturates the same way). The upper one is done in float
 * only when CL: without a saturated scale, y = (x - m) * inv <= 1.5 L (the
 * range is measured from the rounded minimum m, and a nonzero fp16 scale
 * s >= 2^-24 is at least 2/3 of the float scale it rounds), so the
 * conversion is exact and the packs (int8) or an unsigned byte minimum
 * (int4/int2) clamp the same. */
static inline __attribute__((always_inline)) __m256i
kvq__quant32(const float *x, const float *iv, const float *mv, const uint8_t *gv, int bits,
             const int CL, const int ONE) {
    const __m256 hi = _mm256_set1_ps(bits == 8 ? 127.0f : bits == 4 ? 15.0f : 3.0f);
    __m256 y0 = _mm256_loadu_ps(x), y1 = _mm256_loadu_ps(x + 8);
    __m256 y2 = _mm256_loadu_ps(x + 16), y3 = _mm256_loadu_ps(x + 24);
    /* ONE: the 32 values are in one group (g % 32 == 0), one broadcast */
    const size_t g0 = gv[0], g1 = ONE ? g0 : gv[1], g2 = ONE ? g0 : gv[2], g3 = ONE ? g0 : gv[3];
    if (bits != 8) {
        const __m256 m0 = _mm256_broadcast_ss(mv + g0);
        y0 = _mm256_sub_ps(y0, m0);
        y1 = _mm256_sub_ps(y1, ONE ? m0 : _mm256_broadcast_ss(mv + g1));
        y2 = _mm256_sub_ps(y2, ONE ? m0 : _mm256_broadcast_ss(mv + g2));
        y3 = _mm256_sub_ps(y3, ONE ? m0 : _mm256_broadcast_ss(mv + g3));
    }
    const __m256 s0 = _mm256_broadcast_ss(iv + g0);
    y0 = _mm256_mul_ps(y0, s0);
    y1 = _mm256_mul_ps(y1, ONE ? s0 : _mm256_broadcast_ss(iv + g1));
    y2 = _mm256_mul_ps(y2, ONE ? s0 : _mm256_broadcast_ss(iv + g2));
    y3 = _mm256_mul_ps(y3, ONE ? s0 : _mm256_broadcast_ss(iv + g3));
    if (CL) {
        y0 = _mm256_min_ps(y0, hi);
        y1 = _mm256_min_ps(y1, hi);
        y2 = _mm256_min_ps(y2, hi);
        y3 = _mm256_min_ps(y3, hi);
    }
    __m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(y0), _mm256_cvtps_epi32(y1));
    __m256i cd = _mm256_packs_epi32(_mm256_cvtps_epi32(y2), _mm256_cvtps_epi32(y3));
    __m256i r = bits == 8 ? _mm256_max_epi8(_mm256_packs_epi16(ab, cd), _mm256_set1_epi8(-127))
                          : _mm256_packus_epi16(ab, cd);
    if (bits != 8 && !CL)
        r = _mm256_min_epu8(r, _mm256_set1_epi8(bits == 4 ? 15 : 3));
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The same for 8 values, into 8 bytes at p. */
static inline void kvq__quant8(uint8_t *p, const float *x, float iv, float mv, int bits) {
    __m256 y = _mm256_loadu_ps(x);
    if (bits != 8)
        y = _mm256_sub_ps(y, _mm256_set1_ps(mv));
    y = _mm256_min_ps(_mm256_mul_ps(y, _mm256_set1_ps(iv)),
                      _mm256_set1_ps(bits == 8 ? 127.0f : bits == 4 ? 15.0f : 3.0f));
    __m256i q = _mm256_cvtps_epi32(y);
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    __m128i b = bits == 8 ? _mm_max_epi8(_mm_packs_epi16(w, w), _mm_set1_epi8(-127))
                          : _mm_packus_epi16(w, w);
    _mm_storel_epi64((__m128i *)(void *)p, b);
}

/* Integer maximum of float bit patterns: on values with the sign bit
 * cleared it orders finite values as floats do and puts Inf and every NaN
 * (bits > 0x7f800000) above them, so the absolute maximum also says
 * whether the group is finite. */
static inline __m256 kvq__maxbits(__m256 a, __m256 b) {
    return _mm256_castsi256_ps(_mm256_max_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b)));
}
KVQ__HRED8X8(kvq__hmaxbits8x8, kvq__maxbits)

/* The group reductions of nb vectors (F = nb * ng <= KVQ__ENC_MAXF - 8
 * groups), eight groups at a time, into ra (int8: absmax; else minimum)
 * and rb (maximum), zero past F up to a multiple of 8. Exact: order
 * independent up to the sign of zero, which the parameters fold. Returns
 * nonzero when a value is NaN or infinite: int8 through the bit-pattern
 * maximum, int4/int2 through sums of x * 0 (NaN exactly when x is not
 * finite; min/max would drop a NaN). */
static inline __attribute__((always_inline)) int
kvq__int_reduce_batch(const kvq_codec *c, const float *src, size_t nb, float *ra, float *rb,
                      const int GZ, const int BITS, const size_t pfd) {
    const size_t d = c->d, ng = c->ngroups, F = nb * ng;
    const size_t g = GZ ? (size_t)GZ : c->group; /* GZ: the group size, when fixed */
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 zero = _mm256_setzero_ps();
    __m256 nf = zero; /* int4/int2: sum of x * 0 */
    int bad = 0;
    for (size_t f0 = 0, j = 0, gi = 0; f0 < F; f0 += 8) {
        __m256 lo[8], hi[8];
#pragma GCC unroll 8
        for (size_t k = 0; k < 8; k++) {
            if (f0 + k >= F) {
                lo[k] = hi[k] = zero;
                continue;
            }
            const float *xg = src + j * d + gi * g;
            if (++gi == ng) {
                gi = 0;
                j++;
            }
            if (pfd)
                for (size_t t = 0; t < g; t += 16)
                    _mm_prefetch((const char *)(xg + pfd + t), _MM_HINT_T0);
            if (BITS == 8) {
                __m256 a0 = _mm256_and_ps(_mm256_loadu_ps(xg), absmask), a1 = a0;
                size_t t = 8;
                for (; t + 16 <= g; t += 16) {
                    a0 = kvq__maxbits(a0, _mm256_and_ps(_mm256_loadu_ps(xg + t), absmask));
                    a1 = kvq__maxbits(a1, _mm256_and_ps(_mm256_loadu_ps(xg + t + 8), absmask));
                }
                if (t < g)
                    a0 = kvq__maxbits(a0, _mm256_and_ps(_mm256_loadu_ps(xg + t), absmask));
                hi[k] = kvq__maxbits(a0, a1);
            } else {
                __m256 v = _mm256_loadu_ps(xg), lo0 = v, hi0 = v, lo1 = v, hi1 = v;
                __m256 z0 = _mm256_mul_ps(v, zero), z1 = zero;
                size_t t = 8;
                for (; t + 16 <= g; t += 16) {
                    __m256 v0 = _mm256_loadu_ps(xg + t), v1 = _mm256_loadu_ps(xg + t + 8);
                    lo0 = _mm256_min_ps(lo0, v0);
                    hi0 = _mm256_max_ps(hi0, v0);
                    lo1 = _mm256_min_ps(lo1, v1);
                    hi1 = _mm256_max_ps(hi1, v1);
                    z0 = _mm256_fmadd_ps(v0, zero, z0);
                    z1 = _mm256_fmadd_ps(v1, zero, z1);
                }
                if (t < g) {
                    v = _mm256_loadu_ps(xg + t);
                    lo0 = _mm256_min_ps(lo0, v);
                    hi0 = _mm256_max_ps(hi0, v);
                    z0 = _mm256_fmadd_ps(v, zero, z0);
                }
                lo[k] = _mm256_min_ps(lo0, lo1);
                hi[k] = _mm256_max_ps(hi0, hi1);
                /* OR keeps a NaN (all-ones exponent, nonzero mantissa) and
                 * keeps the groups' chains apart (no latency chain) */
                nf = _mm256_or_ps(nf, _mm256_add_ps(z0, z1));
            }
        }
        if (BITS == 8) {
            const __m256 m = kvq__hmaxbits8x8(hi);
            _mm256_storeu_ps(ra + f0, m);
            bad |= _mm256_movemask_ps(_mm256_castsi256_ps(
                _mm256_cmpgt_epi32(_mm256_castps_si256(m), _mm256_set1_epi32(0x7f7fffff))));
        } else {
            _mm256_storeu_ps(ra + f0, kvq__hmin8x8(lo));
            _mm256_storeu_ps(rb + f0, kvq__hmax8x8(hi));
        }
    }
    return bad | _mm256_movemask_ps(_mm256_cmp_ps(nf, nf, _CMP_UNORD_Q));
}

/* The codes (and stored parameters) of nb vectors given their group
 * parameters; CL: see kvq__quant32. */
static inline __attribute__((always_inline)) void
kvq__int_codes_batch(const kvq_codec *c, uint8_t *dst, const float *src, size_t nb,
                     const uint8_t *gv, const uint16_t *sh, const uint16_t *mh, const float *mf,
                     const float *invf, const int BITS, const int CL, const int ONE) {
    const size_t d = c->d, ng = c->ngroups, bytes = c->bytes;
    const int bits = BITS;
    _Alignas(32) uint8_t qb[KVQ__MAX_HEAD_DIM];
    for (size_t j = 0; j < nb; j++) {
        const float *x = src + j * d;
        uint8_t *v = dst + j * bytes;
        const float *iv = invf + j * ng, *mv = mf + j * ng;
        for (size_t gi = 0; gi < ng; gi++) {
            kvq__st16(v + 2 * gi, sh[j * ng + gi]);
            if (bits != 8)
                kvq__st16(v + 2 * ng + 2 * gi, mh[j * ng + gi]);
        }
        uint8_t *codes = v + (bits == 8 ? 2 : 4) * ng;
        size_t t = 0;
        if (bits == 8) {
            for (; t + 32 <= d; t += 32)
                _mm256_storeu_si256((__m256i *)(void *)(codes + t),
                                    kvq__quant32(x + t, iv, iv, gv + t / 8, 8, CL, ONE));
            for (; t < d; t += 8)
                kvq__quant8(codes + t, x + t, iv[gv[t / 8]], 0.0f, 8);
            continue;
        }
        if (bits == 4) {
            const __m256i c116 = _mm256_set1_epi16(0x1001); /* bytes 1, 16 */
            for (; t + 64 <= d; t += 64) {
                const uint8_t *gt = gv + t / 8;
                __m256i b0 =
                    _mm256_maddubs_epi16(kvq__quant32(x + t, iv, mv, gt, 4, CL, ONE), c116);
                __m256i b1 =
                    _mm256_maddubs_epi16(kvq__quant32(x + t + 32, iv, mv, gt + 4, 4, CL, ONE), c116);
                _mm256_storeu_si256((__m256i *)(void *)(codes + t / 2),
                                    _mm256_permute4x64_epi64(_mm256_packus_epi16(b0, b1), 0xd8));
            }
        } else {
            const __m256i c14 = _mm256_set1_epi16(0x0401), c116 = _mm256_set1_epi32(0x00100001);
            for (; t + 128 <= d; t += 128) {
                __m256i b[4];
                KVQ__UNROLL4 for (int h = 0; h < 4; h++) {
                    const __m256i q = kvq__quant32(x + t + 32 * (size_t)h, iv, mv,
                                                   gv + t / 8 + 4 * (size_t)h, 2, CL, ONE);
                    b[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, c14), c116);
                }
                _mm256_storeu_si256((__m256i *)(void *)(codes + t / 4),
                                    kvq__pack32(b[0], b[1], b[2], b[3], 1));
            }
        }
        /* the tail (fewer values than one packing unit) through bytes */
        if (t < d) {
            const size_t t0 = t;
            for (; t < d; t += 8)
                kvq__quant8(qb + t, x + t, iv[gv[t / 8]], mv[gv[t / 8]], bits);
            for (t = t0; t < d; t += 8) {
                const uint8_t *q = qb + t;
                if (bits == 4) {
                    for (int k = 0; k < 4; k++)
                        codes[t / 2 + (size_t)k] = (uint8_t)(q[2 * k] | (q[2 * k + 1] << 4));
                } else {
                    codes[t / 4] = (uint8_t)(q[0] | (q[1] << 2) | (q[2] << 4) | (q[3] << 6));
                    codes[t / 4 + 1] = (uint8_t)(q[4] | (q[5] << 2) | (q[6] << 4) | (q[7] << 6));
                }
            }
        }
    }
}

/* The codes of nb vectors of one batch from their group reductions ra, rb
 * (kvq__int_reduce_batch); gv[t/8] is the group of value t. */
static inline __attribute__((always_inline)) void
kvq__int_encode_batch(const kvq_codec *c, uint8_t *dst, const float *src, size_t nb,
                      const uint8_t *gv, const float *ra, const float *rb, const int ONE,
                      const int BITS) {
    const size_t F = nb * c->ngroups;
    _Alignas(32) float mf[KVQ__ENC_MAXF], invf[KVQ__ENC_MAXF];
    _Alignas(32) uint16_t sh[KVQ__ENC_MAXF], mh[KVQ__ENC_MAXF];
    if (kvq__int_group_params(BITS, F, ra, rb, sh, mh, mf, invf))
        kvq__int_codes_batch(c, dst, src, nb, gv, sh, mh, mf, invf, BITS, 1, ONE);
    else
        kvq__int_codes_batch(c, dst, src, nb, gv, sh, mh, mf, invf, BITS, 0, ONE);
}

/* Batches of vectors share the group-parameter pass (8 groups per lane set;
 * with ng < 8 groups per vector, several vectors fill it): the groups of
 * batch b are reduced into ra/rb + b * stride. */
static inline __attribute__((always_inline)) int
kvq__int_encode_pass(const kvq_codec *c, uint8_t *dst, const float *src, size_t n, float *ra,
                     float *rb, size_t stride, int phase, const int BITS) {
    const size_t ng = c->ngroups, batch = ng >= 8 ? 1 : 8 / ng;
    uint8_t gv[KVQ__MAX_HEAD_DIM / 8];
    for (size_t v = 0, gi = 0, left = c->group; v < c->d / 8; v++) {
        gv[v] = (uint8_t)gi;
        if ((left -= 8) == 0) {
            gi++;
            left = c->group;
        }
    }
    int bad = 0;
    for (size_t j = 0, b = 0; j < n; j += batch, b++) {
        uint8_t *o = dst + j * c->bytes;
        const float *x = src + j * c->d;
        const size_t m = KVQ__MIN(batch, n - j);
        float *a = ra + b * stride, *z = rb + b * stride;
        if (phase != 2) {
            const size_t pfd = BITS == 8 ? 0 : kvq__enc_pf_dist(j, batch, n, c->d);
            if (BITS == 8) /* see kvq__enc_pf_dist */
                kvq__enc_prefetch_part(x, j, batch, n, c->d, phase == 0 ? 1 : 0);
            if (c->group == 32) /* the common groups with their loops unrolled */
                bad |= kvq__int_reduce_batch(c, x, m, a, z, 32, BITS, pfd);
            else if (c->group == 128)
                bad |= kvq__int_reduce_batch(c, x, m, a, z, 128, BITS, pfd);
            else
                bad |= kvq__int_reduce_batch(c, x, m, a, z, 0, BITS, pfd);
        }
        if (BITS == 8 && phase == 0)
            kvq__enc_prefetch_part(x, j, batch, n, c->d, 2);
        if (phase != 1 && c->group % 32 == 0)
            kvq__int_encode_batch(c, o, x, m, gv, a, z, 1, BITS);
        else if (phase != 1)
            kvq__int_encode_batch(c, o, x, m, gv, a, z, 0, BITS);
    }
    return bad;
}

/* kvq__int_encode_pass with one instance per width (no branch on it in the
 * loops). */
static int kvq__int_encode_run(const kvq_codec *c, uint8_t *dst, const float *src, size_t n,
                               float *ra, float *rb, size_t stride, int phase) {
    if (c->bits == 8)
        return kvq__int_encode_pass(c, dst, src, n, ra, rb, stride, phase, 8);
    if (c->bits == 4)
        return kvq__int_encode_pass(c, dst, src, n, ra, rb, stride, phase, 4);
    return kvq__int_encode_pass(c, dst, src, n, ra, rb, stride, phase, 2);
}

/* One pass: the batches' reductions in place (input already checked). */
static void kvq__int_encode_avx2(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    _Alignas(32) float ra[KVQ__ENC_MAXF], rb[KVQ__ENC_MAXF];
    kvq__int_encode_run(c, dst, src, n, ra, rb, 0, 0);
}

/* Checked encode (codec_impl.h, encode_chk): kvq__int_encode_checked
 * (int_tile.h) over batches of 8 groups. */
static int kvq__int_encode_chk_avx2(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    const size_t ng = c->ngroups, batch = ng >= 8 ? 1 : 8 / ng;
    return kvq__int_encode_checked(c, dst, src, n, batch, (batch * ng + 7) / 8 * 8,
                                   kvq__int_encode_run);
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

/* 16 codes from value t on (t % 16 == 0) as two float vectors: int8 and
 * int2 in value order (a: t..t+7, b: t+8..t+15), int4 as the even (a) and
 * odd (b) values of t..t+15. */
static inline __attribute__((always_inline)) void
kvq__codes16_f32(const uint8_t *codes, size_t t, const int BITS, __m256 *a, __m256 *b) {
    if (BITS == 8) {
        *a = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(codes + t))));
        *b = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(codes + t + 8))));
    } else if (BITS == 4) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(codes + t / 2)));
        *a = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
        *b = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
    } else {
        __m256i v = _mm256_set1_epi32((int)kvq__ldu32(codes + t / 4));
        const __m256i m = _mm256_set1_epi32(3);
        *a = _mm256_cvtepi32_ps(
            _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), m));
        *b = _mm256_cvtepi32_ps(_mm256_and_si256(
            _mm256_srlv_epi32(v, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)), m));
    }
}

#define KVQ__ACC_WS 256 /* w*s products per weight row and key block */

/* One column tile (np 16-value pieces from t0) of NQ weight rows over the
 * nb keys of a block: the sums stay in registers, then are added to acc. */
static inline __attribute__((always_inline)) void
kvq__int_accum_tile(const kvq_codec *c, float *acc, size_t astride, const uint8_t *vals,
                    size_t nb, const float (*ws)[KVQ__ACC_WS + 8], size_t t0, size_t np,
                    const int NQ, const int BITS) {
    const size_t g = c->group, ng = c->ngroups, bytes = c->bytes;
    const size_t pbytes = (BITS == 8 ? 2 : 4) * ng;
    size_t gp[4] = {0, 0, 0, 0}; /* group of each piece (np <= 4) */
    __m256 A[4][8];
    KVQ__UNROLL4 for (size_t pc = 0; pc < np; pc++) gp[pc] = (t0 + 16 * pc) / g;
    KVQ__UNROLL4 for (int r = 0; r < NQ; r++) {
        for (int k = 0; k < 8; k++)
            A[r][k] = _mm256_setzero_ps();
    }
    for (size_t j = 0; j < nb; j++) {
        const uint8_t *codes = vals + j * bytes + pbytes;
        KVQ__UNROLL4 for (size_t pc = 0; pc < np; pc++) {
            __m256 f0, f1;
            kvq__codes16_f32(codes, t0 + 16 * pc, BITS, &f0, &f1);
            KVQ__UNROLL4 for (int r = 0; r < NQ; r++) {
                const __m256 b = _mm256_broadcast_ss(&ws[r][j * ng + gp[pc]]);
                A[r][2 * pc] = _mm256_fmadd_ps(b, f0, A[r][2 * pc]);
                A[r][2 * pc + 1] = _mm256_fmadd_ps(b, f1, A[r][2 * pc + 1]);
            }
        }
    }
    KVQ__UNROLL4 for (int r = 0; r < NQ; r++) {
        KVQ__UNROLL4 for (size_t pc = 0; pc < np; pc++) {
            float *a = acc + (size_t)r * astride + t0 + 16 * pc;
            __m256 n0 = A[r][2 * pc], n1 = A[r][2 * pc + 1];
            if (BITS == 4) { /* even/odd back to value order */
                __m256 lo = _mm256_unpacklo_ps(n0, n1), hi = _mm256_unpackhi_ps(n0, n1);
                n0 = _mm256_permute2f128_ps(lo, hi, 0x20);
                n1 = _mm256_permute2f128_ps(lo, hi, 0x31);
            }
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), n0));
            _mm256_storeu_ps(a + 8, _mm256_add_ps(_mm256_loadu_ps(a + 8), n1));
        }
    }
}

/* NQ (1, 2 or 4) weight rows; tiles of 64/NQ values keep 8 sums in
 * registers. Needs d % 16 == 0 and g % 16 == 0. Keys go in blocks whose
 * w*s products are computed first; sum_j w_j m_g is added at the end. */
static inline __attribute__((always_inline)) void
kvq__int_accum_nq(const kvq_codec *c, float *acc, size_t astride, const float *w,
                  size_t wstride, const uint8_t *vals, size_t n, const int NQ, const int BITS) {
    const size_t d = c->d, g = c->group, ng = c->ngroups, bytes = c->bytes;
    const size_t ng8 = (ng + 7) & ~(size_t)7, T = 64 / (size_t)NQ;
    const size_t kb = KVQ__MAX(1, KVQ__MIN(32, KVQ__ACC_WS / ng));
    _Alignas(32) float ws[4][KVQ__ACC_WS + 8];
    _Alignas(32) float tm[4][KVQ__MAX_NG8];
    _Alignas(32) float sf[KVQ__MAX_NG8], mf[KVQ__MAX_NG8];
    for (int r = 0; r < NQ; r++)
        for (size_t k = 0; k < ng8; k++)
            tm[r][k] = 0.0f;
    for (size_t j0 = 0; j0 < n; j0 += kb) {
        const size_t nb = KVQ__MIN(kb, n - j0);
        for (size_t j = 0; j < nb; j++) {
            const uint8_t *v = vals + (j0 + j) * bytes;
            kvq__halves_to_f32(sf, v, ng);
            if (BITS != 8)
                kvq__halves_to_f32(mf, v + 2 * ng, ng);
            KVQ__UNROLL4 for (int r = 0; r < NQ; r++) {
                const __m256 wv = _mm256_set1_ps(w[(size_t)r * wstride + j0 + j]);
                for (size_t k = 0; k < ng; k += 8) {
                    _mm256_storeu_ps(&ws[r][j * ng + k], _mm256_mul_ps(wv, _mm256_load_ps(sf + k)));
                    if (BITS != 8)
                        _mm256_store_ps(tm[r] + k, _mm256_fmadd_ps(wv, _mm256_load_ps(mf + k),
                                                                   _mm256_load_ps(tm[r] + k)));
                }
            }
        }
        const uint8_t *vb = vals + j0 * bytes;
        size_t t0 = 0;
        for (; t0 + T <= d; t0 += T)
            kvq__int_accum_tile(c, acc, astride, vb, nb, (const float(*)[KVQ__ACC_WS + 8])ws, t0,
                                T / 16, NQ, BITS);
        if (t0 < d)
            kvq__int_accum_tile(c, acc, astride, vb, nb, (const float(*)[KVQ__ACC_WS + 8])ws, t0,
                                (d - t0) / 16, NQ, BITS);
    }
    if (BITS == 8)
        return;
    for (int r = 0; r < NQ; r++)
        for (size_t gi = 0; gi < ng; gi++) {
            const __m256 m = _mm256_set1_ps(tm[r][gi]);
            for (size_t t = gi * g; t < (gi + 1) * g; t += 8) {
                float *a = acc + (size_t)r * astride + t;
                _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), m));
            }
        }
}

#define KVQ__INT_ACC_FN(B, Q)                                                                      \
    static void kvq__int_accum_##B##_##Q(const kvq_codec *c, float *acc, size_t astride,          \
                                         const float *w, size_t wstride, const uint8_t *vals,      \
                                         size_t n) {                                               \
        kvq__int_accum_nq(c, acc, astride, w, wstride, vals, n, Q, B);                             \
    }
KVQ__INT_ACC_FN(8, 1)
KVQ__INT_ACC_FN(8, 2)
KVQ__INT_ACC_FN(8, 4)
KVQ__INT_ACC_FN(4, 1)
KVQ__INT_ACC_FN(4, 2)
KVQ__INT_ACC_FN(4, 4)
KVQ__INT_ACC_FN(2, 1)
KVQ__INT_ACC_FN(2, 2)
KVQ__INT_ACC_FN(2, 4)

typedef void (*kvq__int_accum_fn)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                  size_t wstride, const uint8_t *vals, size_t n);
static const kvq__int_accum_fn kvq__int_accum_tab[3][3] = {
    {kvq__int_accum_8_1, kvq__int_accum_8_2, kvq__int_accum_8_4},
    {kvq__int_accum_4_1, kvq__int_accum_4_2, kvq__int_accum_4_4},
    {kvq__int_accum_2_1, kvq__int_accum_2_2, kvq__int_accum_2_4},
};

/* Rows in blocks of 4, then 2, then 1 (each block reads the values once). */
static void kvq__int_accum_tiled(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                 size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    const kvq__int_accum_fn *fns = kvq__int_accum_tab[c->bits == 8 ? 0 : c->bits == 4 ? 1 : 2];
    size_t i = 0;
    for (; i + 4 <= nq; i += 4)
        fns[2](c, acc + i * astride, astride, w + i * wstride, wstride, vals, n);
    for (; i + 2 <= nq; i += 2)
        fns[1](c, acc + i * astride, astride, w + i * wstride, wstride, vals, n);
    for (; i < nq; i++)
        fns[0](c, acc + i * astride, astride, w + i * wstride, wstride, vals, n);
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

/* The per-key steps below work on acc/acc2 (two accumulation chains, for
 * latency) and swap them after each step, the same way for every NQ, so a
 * query's score does not depend on how many queries share the call. */
#define KVQ__QC(b, ci) ((const int8_t *)(qp + (b) * qpb) + (ci) * (256 / BITS))
#define KVQ__QS(b, ci) _mm256_load_ps((const float *)(const void *)(qp + (b) * qpb + p->off_qs) + 8 * (ci))
#define KVQ__CHUNK(ci)                                                                             \
    kvq__key_planes(kvq__load_chunk(codes + 32 * (ci), (ci) + 1 == nch ? last_nb : 32), BITS)

/* One step of query b's two accumulation chains: the integer dot times its
 * scale goes onto a[b]; then the chains swap (a[b] gets the other one). */
static inline __attribute__((always_inline)) void kvq__int_push(__m256 *a, __m256 *a2, int b,
                                                                __m256i dot, __m256 scale) {
    __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, a[b]);
    a[b] = a2[b];
    a2[b] = t;
}

/* Mode S: chunk ci (or the int4 pair ci, ci+1); returns the chunks used. */
static inline __attribute__((always_inline)) size_t
kvq__int_step_s(const kvq__int_plan *p, const uint8_t *key, const uint8_t *codes,
                const uint8_t *qp, size_t qpb, size_t ci, size_t nch, size_t last_nb, size_t ng,
                size_t gpc, __m128i kmask, __m256 *acc, __m256 *acc2, const int BITS,
                const int NQ) {
    const size_t g0 = ci * gpc, set = g0 / 4; /* first group; its set of 4 */
    const int pair = BITS == 4 && gpc == 2 && ci + 1 < nch;
    __m256 K;
    if (gpc == 8) {
        __m128i sh = _mm_loadu_si128((const __m128i *)(const void *)(key + 16 * ci));
        /* the last chunk may hold fewer than 8 groups */
        K = _mm256_cvtph_ps(ci + 1 == nch && last_nb < 32 ? _mm_and_si128(sh, kmask) : sh);
    } else {
        __m128i sh = _mm_loadl_epi64((const __m128i *)(const void *)(key + 8 * set));
        if (ng % 4 != 0 && set == (ng - 1) / 4) /* a partial last set */
            sh = _mm_and_si128(sh, kmask);
        if (pair) { /* lanes s0 s0 s2 s2 | s1 s1 s3 s3 */
            K = _mm256_cvtph_ps(
                _mm_shuffle_epi8(sh, _mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 2, 3, 2, 3, 6, 7, 6, 7)));
        } else {
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
        KVQ__UNROLL4 for (int b = 0; b < NQ; b++) { /* QS * K off the dot's dependency chain */
            kvq__int_push(acc, acc2, b, kvq__pair_dot4(&k0, &k1, KVQ__QC(b, ci)),
                          _mm256_mul_ps(KVQ__QS(b, ci), K));
        }
        return 2;
    }
    kvq__planes kp = KVQ__CHUNK(ci);
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
        kvq__int_push(acc, acc2, b, kvq__chunk_dot(&kp, KVQ__QC(b, ci), BITS),
                      _mm256_mul_ps(KVQ__QS(b, ci), K));
    }
    return 1;
}

/* Mode U: chunk ci (or the int4 pair ci, ci+1 when both are in the group)
 * into the group sums g1/g2; returns the chunks used. */
static inline __attribute__((always_inline)) size_t
kvq__int_step_u(const kvq__int_plan *p, const uint8_t *codes, const uint8_t *qp, size_t qpb,
                size_t ci, size_t left, size_t nch, size_t last_nb, __m256 *g1, __m256 *g2,
                const int BITS, const int NQ) {
    if (BITS == 4 && left >= 2) {
        kvq__planes k0 = KVQ__CHUNK(ci), k1 = KVQ__CHUNK(ci + 1);
        KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
            kvq__int_push(g1, g2, b, kvq__pair_dot4(&k0, &k1, KVQ__QC(b, ci)), KVQ__QS(b, ci));
        }
        return 2;
    }
    kvq__planes kp = KVQ__CHUNK(ci);
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) {
        kvq__int_push(g1, g2, b, kvq__chunk_dot(&kp, KVQ__QC(b, ci), BITS), KVQ__QS(b, ci));
    }
    return 1;
}
#undef KVQ__QC
#undef KVQ__QS
#undef KVQ__CHUNK

/* One key against NQ prepared queries: r[b] gets 8 partial sums whose total
 * is the score. D and G are compile-time shapes (then every loop unrolls);
 * 0 reads them from the plan. */
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
    __m256 acc[4], acc2[4];
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc[b] = acc2[b] = _mm256_setzero_ps();

    if (ASYM) { /* minimum term, into acc2 */
        const uint8_t *mins = key + 2 * ng;
        const size_t nlast = D ? (ng <= 4 ? ng : ng - 8 * ((ng - 1) / 8)) : 0;
        const __m128i mmask =
            D ? _mm_cmpgt_epi16(_mm_set1_epi16((short)nlast), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7))
              : _mm_loadu_si128((const __m128i *)(const void *)p->mmask);
        const float *ql = (const float *)(const void *)(qp + p->off_ql);
        if (ng <= 4) {
            __m128i mh = _mm_loadl_epi64((const __m128i *)(const void *)mins);
            const __m128 m = _mm_cvtph_ps(ng < 4 ? _mm_and_si128(mh, mmask) : mh);
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc2[b] =
                _mm256_zextps128_ps256(_mm_mul_ps(m, _mm_load_ps(ql + b * (qpb / 4))));
        } else {
            for (size_t w = 0; w < ng; w += 8) {
                __m128i mh = _mm_loadu_si128((const __m128i *)(const void *)(mins + 2 * w));
                const __m256 m =
                    _mm256_cvtph_ps(w + 8 > ng ? _mm_and_si128(mh, mmask) : mh); /* partial */
                KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc2[b] =
                    _mm256_fmadd_ps(m, _mm256_load_ps(ql + b * (qpb / 4) + w), acc2[b]);
            }
        }
    }

    if (MODE == KVQ__MODE_S) {
        const size_t gpc = D ? 256 / (size_t)BITS / G : p->gpc;
        const __m128i kmask =
            D ? _mm_cmpgt_epi16(_mm_set1_epi16((short)(gpc == 8 ? (D - (nch - 1) * V) / G
                                                               : ng - 4 * ((ng - 1) / 4))),
                                _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7))
              : _mm_loadu_si128((const __m128i *)(const void *)p->kmask);
        if (D) {
#pragma GCC unroll 8
            for (size_t ci = 0; ci < nch;)
                ci += kvq__int_step_s(p, key, codes, qp, qpb, ci, nch, last_nb, ng, gpc, kmask, acc,
                                      acc2, BITS, NQ);
        } else {
            for (size_t ci = 0; ci < nch;)
                ci += kvq__int_step_s(p, key, codes, qp, qpb, ci, nch, last_nb, ng, gpc, kmask, acc,
                                      acc2, BITS, NQ);
        }
    } else {
        const size_t cpg = D ? (ng == 1 ? nch : G / V) : p->cpg;
        for (size_t gi = 0, ci = 0; gi < ng; gi++) {
            __m256 g1[4], g2[4];
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) g1[b] = g2[b] = _mm256_setzero_ps();
            const size_t end = ci + cpg;
            if (D) {
#pragma GCC unroll 8
                while (ci < end)
                    ci += kvq__int_step_u(p, codes, qp, qpb, ci, end - ci, nch, last_nb, g1, g2,
                                          BITS, NQ);
            } else {
                while (ci < end)
                    ci += kvq__int_step_u(p, codes, qp, qpb, ci, end - ci, nch, last_nb, g1, g2,
                                          BITS, NQ);
            }
            const __m256 s = _mm256_cvtph_ps(_mm_set1_epi16((short)kvq__ld16(key + 2 * gi)));
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) acc[b] =
                _mm256_fmadd_ps(_mm256_add_ps(g1[b], g2[b]), s, acc[b]);
        }
    }
    KVQ__UNROLL4 for (int b = 0; b < NQ; b++) r[b] = _mm256_add_ps(acc[b], acc2[b]);
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
 * reduced together. Fixed shapes score the four keys in one unrolled block
 * (the core overlaps their dependency chains). */
static inline __attribute__((always_inline)) void
kvq__int_score_body(const kvq_codec *c, const kvq__int_plan *p, float *out, size_t ostride,
                    const uint8_t *qp, const uint8_t *keys, size_t n, const int BITS,
                    const int MODE, const int NQ, const size_t D, const size_t G) {
    const size_t bytes = c->bytes, qpb = c->qp_bytes;
    _Alignas(32) float part[4][4][8];
    size_t j0 = 0;
    if (D) {
        for (; j0 + 4 <= n; j0 += 4) {
            __m256 r0[4], r1[4], r2[4], r3[4];
            kvq__int_score_key(p, keys + j0 * bytes, qp, qpb, r0, BITS, MODE, NQ, D, G);
            kvq__int_score_key(p, keys + (j0 + 1) * bytes, qp, qpb, r1, BITS, MODE, NQ, D, G);
            kvq__int_score_key(p, keys + (j0 + 2) * bytes, qp, qpb, r2, BITS, MODE, NQ, D, G);
            kvq__int_score_key(p, keys + (j0 + 3) * bytes, qp, qpb, r3, BITS, MODE, NQ, D, G);
            KVQ__UNROLL4 for (int b = 0; b < NQ; b++) _mm_storeu_ps(
                out + (size_t)b * ostride + j0, kvq__sum4x8(r0[b], r1[b], r2[b], r3[b]));
        }
    }
    for (; j0 < n; j0 += 4) {
        const size_t nk = KVQ__MIN(4, n - j0);
        for (size_t kk = 0; kk < 4; kk++) {
            __m256 r[4];
            if (kk < nk) {
                kvq__int_score_key(p, keys + (j0 + kk) * bytes, qp, qpb, r, BITS, MODE, NQ, D, G);
            } else {
                for (int b = 0; b < NQ; b++)
                    r[b] = _mm256_setzero_ps();
            }
            for (int b = 0; b < NQ; b++)
                _mm256_store_ps(part[b][kk], r[b]);
        }
        for (int b = 0; b < NQ; b++) {
            float tmp[4];
            _mm_storeu_ps(tmp, kvq__sum4x8(_mm256_load_ps(part[b][0]), _mm256_load_ps(part[b][1]),
                                           _mm256_load_ps(part[b][2]), _mm256_load_ps(part[b][3])));
            for (size_t kk = 0; kk < nk; kk++)
                out[(size_t)b * ostride + j0 + kk] = tmp[kk];
        }
    }
}

typedef void (*kvq__int_score_fn)(const kvq_codec *c, const kvq__int_plan *p, float *out,
                                  size_t ostride, const uint8_t *qp, const uint8_t *keys, size_t n);

/* Instances: one query, two (a GQA pair) or four, generic shapes and the
 * common d = 128 ones. */
#define KVQ__INT_SCORE_FN(NAME, B, M, Q, D, G)                                                     \
    static void NAME(const kvq_codec *c, const kvq__int_plan *p, float *out, size_t ostride,     \
                     const uint8_t *qp, const uint8_t *keys, size_t n) {                           \
        kvq__int_score_body(c, p, out, ostride, qp, keys, n, B, M, Q, D, G);                       \
    }
#define KVQ__INT_SCORE_PAIR(B, M, D, G)                                                            \
    KVQ__INT_SCORE_FN(kvq__int_score_##B##_##M##_##D##_##G##_1, B, M, 1, D, G)                     \
    KVQ__INT_SCORE_FN(kvq__int_score_##B##_##M##_##D##_##G##_2, B, M, 2, D, G)                     \
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
    kvq__int_score_fn one, two, four;
} kvq__int_score_entry;

#define KVQ__INT_SCORE_ENTRY(B, M, D, G)                                                           \
    {B, M, D, G, kvq__int_score_##B##_##M##_##D##_##G##_1, kvq__int_score_##B##_##M##_##D##_##G##_2, \
     kvq__int_score_##B##_##M##_##D##_##G##_4}
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
    for (; i + 2 <= nq; i += 2)
        e->two(c, &p, out + i * ostride, ostride, (const uint8_t *)qp + i * c->qp_bytes, keys, n);
    for (; i < nq; i++)
        e->one(c, &p, out + i * ostride, ostride, (const uint8_t *)qp + i * c->qp_bytes, keys, n);
}

/* ---- tiled pages (layouts: src/codec/int.c; shared parts: int_tile.h) ---- */

/* The prepared query of tscore (int_tile.h): per block of qb values, codes
 * rint(q * K / max) with K = KVQ__TILE_QK (int8 keys: int16 codes) or 127
 * (int4 keys: int8 codes), round to nearest even like the reference's
 * nearbyintf. */
void kvq__int_tprep_avx2(const kvq_codec *c, void *qp, const float *q) {
    kvq__tile_plan p;
    kvq__tile_plan_make(c, &p);
    uint8_t *base = (uint8_t *)qp;
    float *beta = (float *)(void *)(base + p.off_beta);
    const int b8 = c->bits == 8;
    const float K = b8 ? (float)KVQ__TILE_QK : 127.0f;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    memset(base, 0, p.bytes);
    for (size_t b = 0; b < p.nqb; b++) {
        const float *x = q + b * p.qb;
        __m256 a = _mm256_setzero_ps();
        for (size_t t = 0; t < p.qb; t += 8)
            a = _mm256_max_ps(a, _mm256_and_ps(_mm256_loadu_ps(x + t), absmask));
        float mx = kvq__hmax256(a);
        const __m256 iv = _mm256_set1_ps(mx >= KVQ__TILE_TINY ? K / mx : 0.0f);
        beta[b] = mx >= KVQ__TILE_TINY ? mx / K : 0.0f;
        for (size_t t = 0; t < p.qb; t += 8) {
            const size_t at = b * p.qb + t;
            __m256i i = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + t), iv));
            __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
            if (b8)
                _mm_storeu_si128((__m128i *)(void *)(base + 2 * at), w);
            else
                _mm_storel_epi64((__m128i *)(void *)(base + at), _mm_packs_epi16(w, w));
        }
    }
    kvq__tile_prep_tail(c, &p, base, q);
}

KVQ__HRED8X8(kvq__hsum8x8, _mm256_add_ps)

/* Rounded weights, 16 tokens at t of one (row, group), int32 in i0 (tokens
 * t..t+7) and i1, to the format FMT (int_tile.h) at row, for group gi of
 * ng and runs of n tokens. */
static inline __attribute__((always_inline)) void
kvq__int_wq_store16(uint8_t *row, size_t ng, size_t n, size_t gi, size_t t, __m256i i0, __m256i i1,
                    const kvq__wq_fmt FMT) {
    if (FMT == KVQ__WQ_U16) { /* packus lanes: 0-3 8-11 | 4-7 12-15 */
        const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(i0, i1), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(row + 2 * (gi * n + t)), h);
        return;
    }
    for (int part = 0; part < (FMT == KVQ__WQ_SPLIT ? 2 : 1); part++) {
        __m256i a = i0, b = i1;
        if (FMT == KVQ__WQ_SPLIT) { /* the high byte, then the low byte */
            const __m256i m = _mm256_set1_epi32(255);
            a = part ? _mm256_and_si256(i0, m) : _mm256_srli_epi32(i0, 8);
            b = part ? _mm256_and_si256(i1, m) : _mm256_srli_epi32(i1, 8);
        }
        __m256i h = _mm256_packs_epi32(a, b); /* lanes: 0-3 8-11 | 4-7 12-15 */
        __m128i v = _mm_packus_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_storeu_si128((__m128i *)(void *)(row + (size_t)part * ng * n + gi * n + t),
                         _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 1, 2, 0)));
    }
}

/* The rounded weights of 4 rows w[r] (rows past the call's use zeros) for a
 * run of n tokens (n % 16 == 0, n <= KVQ__TILE_RUN; int.c, "taccum"):
 * al[r ng + g] = alpha = max / W, wq[r] the weights 0..W in format FMT
 * (int_tile.h), msum[r ng + g] = sum_t w_t m'_{t,g} (int4: W = 255, U8,
 * the codes taken as c - 8, so m' = m + 8 s; int8: W = KVQ__TILE_WK, U16
 * or SPLIT). The run's tokens come in blocks of 16, each from its
 * own page: sb[j] (j < n / 16) is the fp16 scale of group 0 of the block's
 * first token in its page's scale plane (group gi at sb[j] + 2 gi P, the
 * minima at sb[j] + 2 (ng + gi) P), so a run may span pages (taccum_run).
 * Groups go two at a time: their scales (and m') are converted once for
 * the 4 rows, the 8 (group, row) pairs' maxima and sums go through the
 * transposing reductions, and the weights are formed from the same products
 * w * s. Returns the rows done (bit r); the others have a weight that is
 * negative or not finite, or a product that overflows (their weights are
 * written but not used). */
static inline __attribute__((always_inline)) unsigned
kvq__int_wquant4_body(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t nrt,
                      const float *const *w, uint8_t (*wq)[KVQ__WQ_ROW], float *al, float *msum,
                      const kvq__wq_fmt FMT, const size_t NT, const int ASYM) {
    const size_t ng = c->ngroups, n = NT ? 16 * NT : nrt;
    const int asym = ASYM;
    const __m256 zero = _mm256_setzero_ps(), big = _mm256_set1_ps(FLT_MAX);
    const __m256 tiny = _mm256_set1_ps(KVQ__TILE_TINY);
    const __m256 lW = _mm256_set1_ps(FMT == KVQ__WQ_U8 ? 255.0f : (float)KVQ__TILE_WK);
    const __m256 eight = _mm256_set1_ps(8.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _Alignas(32) float sf[2][KVQ__TILE_RUN], hf[2][KVQ__TILE_RUN], iv[8], av[8], mv[8];
    unsigned ok = 0;
    for (int r = 0; r < 4; r++) {
        __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        _Pragma("GCC unroll 8") for (size_t t = 0; t < n; t += 8) {
            __m256 x = _mm256_loadu_ps(w[r] + t);
            m = _mm256_and_ps(m, _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GE_OQ),
                                               _mm256_cmp_ps(x, big, _CMP_LE_OQ)));
        }
        ok |= _mm256_movemask_ps(m) == 0xff ? 1u << r : 0u;
    }
    for (size_t g0 = 0; g0 < ng; g0 += 2) {
        const size_t n2 = KVQ__MIN(2, ng - g0);
        for (size_t z = 0; z < n2; z++)
            _Pragma("GCC unroll 8") for (size_t t = 0; t < n; t += 8) {
                const uint8_t *sv = sb[t / 16] + 2 * ((g0 + z) * P + t % 16);
                const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)sv));
                _mm256_store_ps(sf[z] + t, s);
                if (asym) /* m + 8 s: the codes are taken as c - 8 */
                    _mm256_store_ps(hf[z] + t, _mm256_fmadd_ps(s, eight,
                                                               _mm256_cvtph_ps(_mm_loadu_si128(
                                                                   (const __m128i *)(const void *)(sv + 2 * ng * P)))));
            }
        __m256 v[8], u[8];
        _Pragma("GCC unroll 8") for (size_t i = 0; i < 8; i++) { /* pair i: group g0 + i / 4, row i % 4 */
            __m256 mx = zero, sm = zero;
            if (i / 4 < n2) {
                const float *wr = w[i % 4], *s = sf[i / 4], *h = hf[i / 4];
                _Pragma("GCC unroll 8") for (size_t t = 0; t < n; t += 8) {
                    const __m256 x = _mm256_loadu_ps(wr + t);
                    mx = _mm256_max_ps(mx, _mm256_mul_ps(x, _mm256_load_ps(s + t)));
                    if (asym)
                        sm = _mm256_fmadd_ps(x, _mm256_load_ps(h + t), sm);
                }
            }
            v[i] = mx;
            u[i] = sm;
        }
        const __m256 M = kvq__hmax8x8(v);
        const __m256 use = _mm256_cmp_ps(M, tiny, _CMP_GE_OQ);
        const unsigned bad = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(M, big, _CMP_NLE_UQ));
        for (size_t i = 0; i < 4 * n2; i++)
            if ((bad >> i) & 1)
                ok &= ~(1u << (i % 4));
        _mm256_store_ps(iv, _mm256_and_ps(_mm256_div_ps(lW, M), use));
        _mm256_store_ps(av, _mm256_and_ps(_mm256_div_ps(M, lW), use));
        if (asym)
            _mm256_store_ps(mv, kvq__hsum8x8(u));
        for (size_t i = 0; i < 4 * n2; i++) {
            const size_t r = i % 4, gi = g0 + i / 4;
            al[r * ng + gi] = av[i];
            if (asym)
                msum[r * ng + gi] = mv[i];
            const __m256 ivv = _mm256_broadcast_ss(iv + i);
            const float *wr = w[r], *s = sf[i / 4];
            uint8_t *dst = wq[r] + gi * n;
            size_t t = 0;
            if (FMT == KVQ__WQ_U8)
                for (; t + 32 <= n; t += 32) {
                    __m256i q[4];
                    KVQ__UNROLL4 for (int k = 0; k < 4; k++)
                        q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(
                            _mm256_mul_ps(_mm256_loadu_ps(wr + t + 8 * k), _mm256_load_ps(s + t + 8 * k)), ivv));
                    /* lanes: dwords of 4 tokens 0 2 4 6 | 1 3 5 7 */
                    const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
                    _mm256_storeu_si256((__m256i *)(void *)(dst + t), _mm256_permutevar8x32_epi32(b, perm));
                }
            for (; t < n; t += 16) {
                __m256i i0 = _mm256_cvtps_epi32(
                    _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(wr + t), _mm256_load_ps(s + t)), ivv));
                __m256i i1 = _mm256_cvtps_epi32(
                    _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(wr + t + 8), _mm256_load_ps(s + t + 8)), ivv));
                kvq__int_wq_store16(wq[r], ng, n, gi, t, i0, i1, FMT);
            }
        }
    }
    return ok;
}

/* kvq__int_wquant4_body with the run's length (64 tokens: runs of 4 pages
 * of 16) and the format known at compile time where it can (int4: U8;
 * int8: U16 or SPLIT, int_tile.h). */
unsigned kvq__int_wquant4_avx2(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t n,
                               const float *const *w, uint8_t (*wq)[KVQ__WQ_ROW], float *al,
                               float *msum, kvq__wq_fmt fmt) {
    if (fmt == KVQ__WQ_U8)
        return n == 64 ? kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_U8, 4, 1)
                       : kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_U8, 0, 1);
    if (fmt == KVQ__WQ_U16)
        return n == 64 ? kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_U16, 4, 0)
                       : kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_U16, 0, 0);
    return n == 64 ? kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_SPLIT, 4, 0)
                   : kvq__int_wquant4_body(c, sb, P, n, w, wq, al, msum, KVQ__WQ_SPLIT, 0, 0);
}

#define KVQ__VNNI 0
#define KVQ__TGT
#define KVQ__FN(name) name##_avx2
#include "int_avx2_body.h"
#undef KVQ__VNNI
#undef KVQ__TGT
#undef KVQ__FN

void kvq__int_avx2_select(kvq_codec *c) {
    if (kvq__tile_ok(c)) {
        kvq__tile_plan tp;
        kvq__tile_plan_make(c, &tp);
        c->tqp_bytes = tp.bytes;
        c->k.tprep = kvq__int_tprep_avx2;
        c->k.tscore = c->bits == 8 ? kvq__int_tscore8_avx2 : kvq__int_tscore4_avx2;
        c->pf_tscore = 1;
        c->k.taccum = c->bits == 8 ? kvq__int_taccum8_avx2 : kvq__int_taccum4_avx2;
        c->k.taccum_run = c->bits == 8 ? kvq__int_taccum_run8_avx2 : kvq__int_taccum_run4_avx2;
    }
    if (c->group % 8 == 0) {
        c->k.encode = kvq__int_encode_avx2;
        c->k.encode_chk = kvq__int_encode_chk_avx2;
        c->k.decode = kvq__int_decode_avx2;
        c->k.accum = c->group % 16 == 0 ? kvq__int_accum_tiled : kvq__int_accum_avx2;
    }
    kvq__int_plan p;
    if (kvq__int_plan_make(c, &p)) {
        c->k.prep = kvq__int_prep_avx2;
        c->k.score = kvq__int_score_avx2;
    }
}
