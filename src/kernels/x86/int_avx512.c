/*
 * int_avx512.c - AVX-512 kernels of int8/int4 over tiled pages (layouts and
 * error bounds in src/codec/int.c; simd_avx512.h says how this file is
 * built natively and through SIMDe):
 *  - tscore: 16 tokens (one 32-bit lane each) x 4 query rows; with VNNI one
 *    vpdpbusd per 4 dimensions (int8: the stored byte c + 128 times the
 *    query code, the bias -128 * sum q starting the accumulator; int4: the
 *    low and high nibble planes), without it the AVX-512BW sequence
 *    maddubs + madd (int8 by |c| * sign(q, c));
 *  - taccum (g % 16 == 0): 64 dimensions x 4 weight rows in 16 int32
 *    accumulators, one vpdpbusd (or maddubs + madd) per 4 tokens (int4: per
 *    nibble plane of 8 tokens) with the rounded weights broadcast.
 * The query and weight rounding (tprep, the weights of a page) is the AVX2
 * path's (int_avx2.c), so every path computes the same integer dot
 * products and the same float steps in the same order.
 * The two variants (VNNI and BW) are int_avx512_body.h included twice.
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
#else
#define kvq__i512_i2f(v) _mm512_cvtepi32_ps(v)
#define kvq__i512_h2f(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#endif

static inline uint32_t kvq__i512_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define KVQ__I512_UNROLL4 _Pragma("GCC unroll 4")

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
    if (!kvq__tile_ok(c))
        return;
    const int vnni = (feat & KVQ__X512_VNNI) != 0, b8 = c->bits == 8;
    kvq__tile_plan tp;
    kvq__tile_plan_make(c, &tp);
    c->tqp_bytes = tp.bytes;
    c->k.tprep = kvq__int_tprep_avx2;
    c->k.tscore = vnni ? (b8 ? kvq__i512_tscore8_vnni : kvq__i512_tscore4_vnni)
                       : (b8 ? kvq__i512_tscore8_bw : kvq__i512_tscore4_bw);
    if (c->group % 16 == 0)
        c->k.taccum = vnni ? (b8 ? kvq__i512_taccum8_vnni : kvq__i512_taccum4_vnni)
                           : (b8 ? kvq__i512_taccum8_bw : kvq__i512_taccum4_bw);
}
