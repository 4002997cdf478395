/*
 * simd_avx2.h - small AVX2 helpers shared by the AVX2 kernel files. Include
 * only from files compiled with -mavx2 -mfma -mf16c.
 */
#ifndef KVQ_SIMD_AVX2_H
#define KVQ_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define KVQ__UNROLL4 _Pragma("GCC unroll 4")

/* 4 bytes at p (any alignment) as one 32-bit value. */
static inline uint32_t kvq__ldu32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 8 bytes at p (any alignment) as one 64-bit value. */
static inline uint64_t kvq__ldu64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The sums of the int32 lane pairs (2i, 2i + 1) of a (i < 4) then of b, in
 * order: what vpmaddwd leaves of 4 items (tokens, dimensions) x 4 bytes
 * widened to int16, each item's two pair sums in adjacent lanes. */
static inline __m256i kvq__int_pairsum8(__m256i a, __m256i b) {
    const __m256 x = _mm256_castsi256_ps(a), y = _mm256_castsi256_ps(b);
    const __m256i s = _mm256_add_epi32(_mm256_castps_si256(_mm256_shuffle_ps(x, y, 0x88)),
                                       _mm256_castps_si256(_mm256_shuffle_ps(x, y, 0xdd)));
    return _mm256_permute4x64_epi64(s, 0xd8); /* items 0 1 4 5 | 2 3 6 7 in order */
}

static inline float kvq__hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

/* Horizontal sums of four vectors at once: result lane i = sum of v_i. */
static inline __m128 kvq__hsum4x256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* 8 fp16 values at p (unaligned) to floats. */
static inline __m256 kvq__load_f16x8(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
/* 8 bf16 values at p to floats. */
static inline __m256 kvq__load_bf16x8(const void *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

#endif
