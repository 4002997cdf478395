/*
 * simd_avx512.h - what the AVX-512 kernel files include. Those files are
 * built twice:
 *  - natively, with the AVX2 flags: their functions carry the AVX-512 target
 *    themselves (KVQ__T512, KVQ__T512VNNI, KVQ__T512VBMI) and run only after
 *    run-time detection; their selector is KVQ__SEL512(name) = name;
 *  - with -DKVQ_SIMDE for the tests (Makefile: $(BUILD)/simde/): the
 *    intrinsics come from SIMDe's portable implementation, the target
 *    attributes vanish and the selector is name_simde, so `make check`
 *    compiles and checks the AVX-512 sources on CPUs without AVX-512.
 * Selectors take the AVX-512 extensions to use (KVQ__X512_* bits): the
 * dispatcher passes the CPU's, the tests pass every one.
 * Only the selector of such a file may have external linkage.
 */
#ifndef KVQ_SIMD_AVX512_H
#define KVQ_SIMD_AVX512_H

#ifdef KVQ_SIMDE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define KVQ__T512
#define KVQ__T512VNNI
#define KVQ__T512VBMI
#define KVQ__SEL512(name) name##_simde
/* SIMDe 0.7.4 (Debian 12) lacks these: lane-by-lane versions for the tests
 * (defined over the native names, which would otherwise reach GCC's own
 * declarations and fail to inline without the AVX-512 target). */
#include "../../common/common.h"
static inline __m512 kvq__sx_cvtepi32_ps(__m512i a) {
    int32_t x[16];
    float y[16];
    _mm512_storeu_si512((void *)x, a);
    for (int i = 0; i < 16; i++)
        y[i] = (float)x[i];
    return _mm512_loadu_ps(y);
}
static inline __m512i kvq__sx_widen(const void *p, int bytes, int sign) {
    int32_t y[16];
    for (int i = 0; i < 16; i++) {
        const uint8_t *b = (const uint8_t *)p + i * bytes;
        if (bytes == 1)
            y[i] = sign ? (int32_t)(int8_t)b[0] : (int32_t)b[0];
        else {
            uint16_t u = (uint16_t)(b[0] | b[1] << 8);
            y[i] = sign ? (int32_t)(int16_t)u : (int32_t)u;
        }
    }
    return _mm512_loadu_si512((const void *)y);
}
static inline __m512i kvq__sx_cvtepu16_epi32(__m256i a) {
    uint8_t b[32];
    _mm256_storeu_si256((__m256i *)(void *)b, a);
    return kvq__sx_widen(b, 2, 0);
}
static inline __m512i kvq__sx_cvtepi16_epi32(__m256i a) {
    uint8_t b[32];
    _mm256_storeu_si256((__m256i *)(void *)b, a);
    return kvq__sx_widen(b, 2, 1);
}
static inline __m512i kvq__sx_cvtepu8_epi32(__m128i a) {
    uint8_t b[16];
    _mm_storeu_si128((__m128i *)(void *)b, a);
    return kvq__sx_widen(b, 1, 0);
}
static inline __m512i kvq__sx_cvtepi8_epi32(__m128i a) {
    uint8_t b[16];
    _mm_storeu_si128((__m128i *)(void *)b, a);
    return kvq__sx_widen(b, 1, 1);
}
static inline __m512 kvq__sx_cvtph_ps(__m256i a) {
    uint16_t h[16];
    float y[16];
    _mm256_storeu_si256((__m256i *)(void *)h, a);
    for (int i = 0; i < 16; i++)
        y[i] = kvq__f16_to_f32(h[i]);
    return _mm512_loadu_ps(y);
}
static inline __m256i kvq__sx_cvtps_ph(__m512 a, int rounding) {
    float y[16];
    uint16_t h[16];
    (void)rounding; /* round to nearest even, the only mode the kernels use */
    _mm512_storeu_ps(y, a);
    for (int i = 0; i < 16; i++)
        h[i] = kvq__f16_from_f32(y[i]);
    return _mm256_loadu_si256((const __m256i *)(const void *)h);
}
static inline float kvq__sx_reduce_add_ps(__m512 a) {
    float y[16], s = 0.0f;
    _mm512_storeu_ps(y, a);
    for (int i = 0; i < 16; i++)
        s += y[i];
    return s;
}
static inline float kvq__sx_reduce_max_ps(__m512 a) {
    float y[16], s;
    _mm512_storeu_ps(y, a);
    s = y[0];
    for (int i = 1; i < 16; i++)
        s = y[i] > s ? y[i] : s;
    return s;
}
static inline __m512i kvq__sx_cvtps_epi32(__m512 a) {
    float y[16];
    int32_t x[16];
    _mm512_storeu_ps(y, a);
    for (int i = 0; i < 16; i++)
        x[i] = (int32_t)nearbyintf(y[i]); /* the default rounding: to nearest even */
    return _mm512_loadu_si512((const void *)x);
}
static inline __m512 kvq__sx_mask_loadu_ps(__m512 src, __mmask16 k, const void *p) {
    float y[16];
    _mm512_storeu_ps(y, src);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            memcpy(&y[i], (const char *)p + 4 * i, 4);
    return _mm512_loadu_ps(y);
}
static inline void kvq__sx_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    float y[16];
    _mm512_storeu_ps(y, a);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1)
            memcpy((char *)p + 4 * i, &y[i], 4);
}
#define _mm512_reduce_max_ps kvq__sx_reduce_max_ps
#define _mm512_cvtps_epi32 kvq__sx_cvtps_epi32
#define _mm512_mask_loadu_ps kvq__sx_mask_loadu_ps
#define _mm512_mask_storeu_ps kvq__sx_mask_storeu_ps
#define _mm512_cvtepi32_ps kvq__sx_cvtepi32_ps
#define _mm512_cvtepu16_epi32 kvq__sx_cvtepu16_epi32
#define _mm512_cvtepi16_epi32 kvq__sx_cvtepi16_epi32
#define _mm512_cvtepu8_epi32 kvq__sx_cvtepu8_epi32
#define _mm512_cvtepi8_epi32 kvq__sx_cvtepi8_epi32
#define _mm512_cvtph_ps kvq__sx_cvtph_ps
#define _mm512_cvtps_ph kvq__sx_cvtps_ph
#define _mm512_reduce_add_ps kvq__sx_reduce_add_ps
#else
#include <immintrin.h>
#define KVQ__T512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c,bmi2")))
#define KVQ__T512VNNI                                                                              \
    __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512vnni,avx2,fma,f16c,bmi2")))
#define KVQ__T512VBMI                                                                              \
    __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi2")))
#define KVQ__SEL512(name) name
#endif

/* Lane-wise reductions of 4 vectors at once: every lane of quarter k of the
 * result holds the maximum (sum) of the 16 lanes of a_k. Permutes by index
 * vectors (SIMDe 0.7.4 has these, not the immediate shuffles). */
KVQ__T512 static inline __m512 kvq__red4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3, int mx) {
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i ev = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i od = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i sw2 = _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    const __m512i sw1 = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#define KVQ__RED(x, y) (mx ? _mm512_max_ps(x, y) : _mm512_add_ps(x, y))
    __m512 s01 = KVQ__RED(_mm512_permutex2var_ps(a0, lo, a1), _mm512_permutex2var_ps(a0, hi, a1));
    __m512 s23 = KVQ__RED(_mm512_permutex2var_ps(a2, lo, a3), _mm512_permutex2var_ps(a2, hi, a3));
    __m512 r = KVQ__RED(_mm512_permutex2var_ps(s01, ev, s23), _mm512_permutex2var_ps(s01, od, s23));
    r = KVQ__RED(r, _mm512_permutexvar_ps(sw2, r));
    return KVQ__RED(r, _mm512_permutexvar_ps(sw1, r));
#undef KVQ__RED
}

#endif
