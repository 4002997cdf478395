/*
 * tq_avx2.c - AVX2 kernels of the TurboQuant family (tq1..tq4, tqp2..tqp4),
 * used when head_dim is a multiple of 8.
 *
 * encode, decode, prep and finish follow the scalar reference (tq.c,
 * tq_rotate.c) operation for operation, so their results are bit-identical:
 * the FWHT runs the same stages (h = 1, 2, 4 inside a register, then across
 * registers), norms use the same 8-lane sums with separate multiply and add,
 * matrix rows use the same lane sums and the reduction order of
 * kvq__hsum4x256, and ||c||^2 is an order-free integer sum. The encoder is
 * software-pipelined over vectors (the rotation, norm, sqrt and division of
 * vector v+1 overlap the quantization of vector v); it compares |u| with
 * the positive thresholds (a thermometer code for 2 and 3 bits, a binary
 * search for 4), takes the index bit planes with movemask and interleaves
 * them with spread tables. Vectors whose norm is outside the fast range go
 * to the scalar encoder.
 *
 * score uses per-query lookup tables built by prep (tq_impl.h): one float
 * load and add per 1, 2 or 8 coordinates, with BMI1 bextr field extraction
 * (tq3 and tq4: two keys at a time, sixteen independent sums). It is not
 * bit-exact (other summation order). tq4 with d % 32 == 0 instead looks
 * its nibbles up 32 at a time with vpshufb in an int16 codebook and dots
 * them with an int16 query (see "tq4 score through byte shuffles"). decode expands 8 indices at
 * a time with a variable shift and a permute of the codebook (two permutes
 * and a blend for 16 entries); 3-bit groups are read 4 or 8 bytes at a
 * time, and the last tq3 vector of a call is copied to a padded buffer so
 * no byte past the input is read. Score with several queries and
 * accumulate (FMA) expand indices through per-thread tables instead, with
 * plain loads of exactly the group's bytes.
 *
 * Costs on the development CPU (Zen 1, where 256-bit variable shifts and
 * permutes take ~4 cycles) shaped these choices: FWHT butterflies are split
 * between the add and the FMA pipes (fma(x, +-1, y) rounds exactly like
 * y +- x), and score avoids permutes altogether.
 */
#include "../kernels.h"
#include "../../codec/tq_impl.h"
#include "simd_avx2.h"
#include "tq_avx2.h"

#include <float.h>

#define KVQ__AI static inline __attribute__((always_inline))
#define KVQ__UNROLL4 _Pragma("GCC unroll 4")
/* BMI1 (bextr) for the score lookups: every CPU with the BMI2 that this
 * directory is compiled for has it. */
#define KVQ__BMI __attribute__((target("bmi")))

/* ---- bit spreading: bit i of a byte -> bit k*i + s ---- */
#define KVQ__SPB(b, k, s)                                                                          \
    (((((b) >> 0 & 1u) << (0 * (k))) | (((b) >> 1 & 1u) << (1 * (k))) |                           \
      (((b) >> 2 & 1u) << (2 * (k))) | (((b) >> 3 & 1u) << (3 * (k))) |                           \
      (((b) >> 4 & 1u) << (4 * (k))) | (((b) >> 5 & 1u) << (5 * (k))) |                           \
      (((b) >> 6 & 1u) << (6 * (k))) | (((b) >> 7 & 1u) << (7 * (k))))                            \
     << (s))
#define KVQ__SP4(b, k, s)                                                                          \
    KVQ__SPB(b, k, s), KVQ__SPB(b + 1, k, s), KVQ__SPB(b + 2, k, s), KVQ__SPB(b + 3, k, s)
#define KVQ__SP16(b, k, s)                                                                         \
    KVQ__SP4(b, k, s), KVQ__SP4(b + 4, k, s), KVQ__SP4(b + 8, k, s), KVQ__SP4(b + 12, k, s)
#define KVQ__SP64(b, k, s)                                                                         \
    KVQ__SP16(b, k, s), KVQ__SP16(b + 16, k, s), KVQ__SP16(b + 32, k, s), KVQ__SP16(b + 48, k, s)
#define KVQ__SP256(k, s)                                                                           \
    {KVQ__SP64(0, k, s), KVQ__SP64(64, k, s), KVQ__SP64(128, k, s), KVQ__SP64(192, k, s)}

/* kvq__tq_spread[kb-2][s][b]: bit plane s of 8 packed kb-bit indices. */
static const uint32_t kvq__tq_spread[3][4][256] = {
    {KVQ__SP256(2, 0), KVQ__SP256(2, 1)},
    {KVQ__SP256(3, 0), KVQ__SP256(3, 1), KVQ__SP256(3, 2)},
    {KVQ__SP256(4, 0), KVQ__SP256(4, 1), KVQ__SP256(4, 2), KVQ__SP256(4, 3)}};

static inline uint32_t kvq__tq_ldu32(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

KVQ__AI __m256 kvq__tq_signmask(void) { return _mm256_set1_ps(-0.0f); }

/* ---- FWHT ---- */
/* Stages h = 1, 2, 4 inside one register, as the scalar butterflies
 * (a, b) -> (a + b, a - b). fma(x, +-1, y) rounds exactly like y +- x (the
 * product is exact), so stages 1 and 2 are a permute and one FMA each,
 * which keeps the FP add pipes free; the h = 4 stage works on 128-bit
 * halves (cheaper than a lane-crossing permute on CPUs that split 256-bit
 * operations). */
KVQ__AI __m256 kvq__tq_fwht8(__m256 x) {
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    x = _mm256_fmadd_ps(x, s1, _mm256_permute_ps(x, 0xB1));
    x = _mm256_fmadd_ps(x, s2, _mm256_permute_ps(x, 0x4E));
    __m128 lo = _mm256_castps256_ps128(x), hi = _mm256_extractf128_ps(x, 1);
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_add_ps(lo, hi)), _mm_sub_ps(lo, hi), 1);
}

/* (a, b) -> (a + b, a - b); the difference on the FMA pipes. */
#define KVQ__TQ_BF(a, b)                                                                           \
    do {                                                                                           \
        __m256 t_ = (a);                                                                           \
        (a) = _mm256_add_ps(t_, (b));                                                              \
        (b) = _mm256_fnmadd_ps((b), _mm256_set1_ps(1.0f), t_);                                     \
    } while (0)

/* Loads chunk i of src: squares into *ss (in chunk order), sign flip, and
 * the in-register stages. */
KVQ__AI __m256 kvq__tq_ld8(const float *src, const uint32_t *flip, __m256 *ss, int i) {
    __m256 x = _mm256_loadu_ps(src + 8 * i);
    if (ss)
        *ss = _mm256_add_ps(*ss, _mm256_mul_ps(x, x));
    if (flip)
        x = _mm256_xor_ps(x, _mm256_loadu_ps((const float *)(const void *)(flip + 8 * i)));
    return kvq__tq_fwht8(x);
}

/* One block of 8 * nr floats (nr = 1, 2, 4, 8) from src through every stage
 * inside the block, stored to the aligned dst. Named registers (not an
 * array) so that the block stays in registers. */
KVQ__AI void kvq__tq_block(float *dst, const float *src, const uint32_t *flip, __m256 *ss, int nr) {
    __m256 r0 = kvq__tq_ld8(src, flip, ss, 0), r1, r2, r3, r4, r5, r6, r7;
    if (nr >= 2)
        r1 = kvq__tq_ld8(src, flip, ss, 1);
    if (nr >= 4) {
        r2 = kvq__tq_ld8(src, flip, ss, 2);
        r3 = kvq__tq_ld8(src, flip, ss, 3);
    }
    if (nr >= 8) {
        r4 = kvq__tq_ld8(src, flip, ss, 4);
        r5 = kvq__tq_ld8(src, flip, ss, 5);
        r6 = kvq__tq_ld8(src, flip, ss, 6);
        r7 = kvq__tq_ld8(src, flip, ss, 7);
    }
    if (nr >= 2)
        KVQ__TQ_BF(r0, r1);
    if (nr >= 4) {
        KVQ__TQ_BF(r2, r3);
        KVQ__TQ_BF(r0, r2);
        KVQ__TQ_BF(r1, r3);
    }
    if (nr >= 8) {
        KVQ__TQ_BF(r4, r5);
        KVQ__TQ_BF(r6, r7);
        KVQ__TQ_BF(r4, r6);
        KVQ__TQ_BF(r5, r7);
        KVQ__TQ_BF(r0, r4);
        KVQ__TQ_BF(r1, r5);
        KVQ__TQ_BF(r2, r6);
        KVQ__TQ_BF(r3, r7);
    }
    _mm256_store_ps(dst, r0);
    if (nr >= 2)
        _mm256_store_ps(dst + 8, r1);
    if (nr >= 4) {
        _mm256_store_ps(dst + 16, r2);
        _mm256_store_ps(dst + 24, r3);
    }
    if (nr >= 8) {
        _mm256_store_ps(dst + 32, r4);
        _mm256_store_ps(dst + 40, r5);
        _mm256_store_ps(dst + 48, r6);
        _mm256_store_ps(dst + 56, r7);
    }
}

/* First pass of the FWHT of src (flipped by flip when not NULL) into the
 * 32-byte aligned buf: every stage with h < min(d, 64). Adds the squares of
 * src to the lanes of *ss when ss is not NULL. */
KVQ__AI void kvq__tq_fwht_blocks(float *buf, const float *src, const uint32_t *flip, __m256 *ss,
                                 size_t d) {
    switch (d) {
    case 8:
        kvq__tq_block(buf, src, flip, ss, 1);
        return;
    case 16:
        kvq__tq_block(buf, src, flip, ss, 2);
        return;
    case 32:
        kvq__tq_block(buf, src, flip, ss, 4);
        return;
    default:
        for (size_t i = 0; i < d; i += 64)
            kvq__tq_block(buf + i, src + i, flip ? flip + i : NULL, ss, 8);
    }
}

/* Stages h = from .. to-1 (floats, powers of two >= 64) over buf. */
static void kvq__tq_fwht_passes(float *buf, size_t d, size_t from, size_t to) {
    for (size_t h = from; h < to; h *= 2)
        for (size_t i = 0; i < d; i += 2 * h)
            for (size_t j = i; j < i + h; j += 8) {
                __m256 a = _mm256_load_ps(buf + j), b = _mm256_load_ps(buf + j + h);
                _mm256_store_ps(buf + j, _mm256_add_ps(a, b));
                _mm256_store_ps(buf + j + h, _mm256_fnmadd_ps(b, _mm256_set1_ps(1.0f), a));
            }
}

/* Full in-place FWHT of buf (aligned), d a power of two >= 8. */
static void kvq__tq_fwht_avx2(float *buf, size_t d) {
    kvq__tq_fwht_blocks(buf, buf, NULL, NULL, d);
    kvq__tq_fwht_passes(buf, d, 64, d);
}

/* ---- dense matrices (d % 8 == 0) ---- */
/* y = M x, rows as the scalar lane sums + kvq__tq_reduce8. */
/* y[0..8) = rows r[0..8) (stride d) dot x: eight FMA chains; each row's
 * lane sums and their reduction as the scalar kvq__tq_matvec. */
KVQ__AI void kvq__tq_rows8(const float *r, size_t d, const float *x, float *y) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t j = 0; j < d; j += 8) {
        __m256 xv = _mm256_loadu_ps(x + j);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + j), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + d + j), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 2 * d + j), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 3 * d + j), xv, a3);
        a4 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 4 * d + j), xv, a4);
        a5 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 5 * d + j), xv, a5);
        a6 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 6 * d + j), xv, a6);
        a7 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 7 * d + j), xv, a7);
    }
    _mm_storeu_ps(y, kvq__hsum4x256(a0, a1, a2, a3));
    _mm_storeu_ps(y + 4, kvq__hsum4x256(a4, a5, a6, a7));
}

/* y = M x (d % 8 == 0). */
static void kvq__tq_matvec_avx2(const float *m, size_t d, float *y, const float *x) {
    for (size_t i = 0; i < d; i += 8)
        kvq__tq_rows8(m + i * d, d, x, y + i);
}

/* y = M^T z, accumulated over rows in increasing order (y may not alias z). */
static void kvq__tq_matvec_t_avx2(const float *m, size_t d, float *y, const float *z) {
    for (size_t j = 0; j < d; j += 8)
        _mm256_storeu_ps(y + j, _mm256_setzero_ps());
    for (size_t i = 0; i < d; i++) {
        const float *row = m + i * d;
        __m256 zi = _mm256_set1_ps(z[i]);
        for (size_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j),
                                                  _mm256_mul_ps(zi, _mm256_loadu_ps(row + j))));
    }
}

/* out = sum_i sigma_i S[i][:], sigma from the sign bits. */
static void kvq__tq_sketch_t_signs_avx2(const kvq__tq *t, size_t d, float *out, const uint8_t *sg) {
    const __m256 sm = kvq__tq_signmask();
    for (size_t j = 0; j < d; j += 8)
        _mm256_storeu_ps(out + j, _mm256_setzero_ps());
    for (size_t i = 0; i < d; i++) {
        const float *row = t->skm + i * d;
        __m256 f = ((sg[i >> 3] >> (i & 7)) & 1) ? _mm256_setzero_ps() : sm;
        for (size_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j),
                                                    _mm256_xor_ps(_mm256_loadu_ps(row + j), f)));
    }
}

/* ---- codebook lookups ---- */
typedef struct {
    __m256 t0, t1;  /* permute tables: kb < 4: cent[k & (levels-1)]; kb = 4: cent[0..7], [8..15] */
    __m256i shr;    /* lane i: i * kb */
} kvq__tq_lut;

static inline void kvq__tq_lut_init(kvq__tq_lut *l, const kvq__tq *t) {
    float a[8], b[8];
    for (int k = 0; k < 8; k++) {
        a[k] = t->cent[k & (t->levels - 1) & 7];
        b[k] = t->levels == 16 ? t->cent[8 + k] : a[k];
    }
    l->t0 = _mm256_loadu_ps(a);
    l->t1 = _mm256_loadu_ps(b);
    int kb = t->kb;
    l->shr = _mm256_setr_epi32(0, kb, 2 * kb, 3 * kb, 4 * kb, 5 * kb, 6 * kb, 7 * kb);
}

/* The 8 centroids of the group whose kb packed bytes start at p. kb = 3
 * reads 4 bytes (callers guarantee the 4th is readable). */
KVQ__AI __m256 kvq__tq_cent8(const kvq__tq_lut *l, const uint8_t *p, int kb) {
    uint32_t w = kb == 1 ? p[0] : kb == 2 ? kvq__ld16(p) : kvq__tq_ldu32(p);
    __m256i s = _mm256_srlv_epi32(_mm256_set1_epi32((int)w), l->shr);
    __m256 lo = _mm256_permutevar8x32_ps(l->t0, s);
    if (kb < 4)
        return lo;
    __m256 hi = _mm256_permutevar8x32_ps(l->t1, s);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(s, 28)));
}

/* Lane i all ones when bit i of byte b is set. */
KVQ__AI __m256 kvq__tq_bitmask8(unsigned b) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i v = _mm256_and_si256(_mm256_set1_epi32((int)b), sel);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, sel));
}

/* ---- expansion tables for score (several queries) and accumulate ----
 * Centroids of packed indices by plain loads instead of variable shifts
 * and permutes (slow on CPUs that split 256-bit operations): an entry maps
 * one field of the index bits to consecutive floats, kb = 1: a byte -> 8,
 * kb = 2: a byte -> 4, kb = 3: 6 bits (2 indices) -> 2, kb = 4: a byte -> 2.
 * The table belongs to the codec (t->xtab, filled by tq.c at creation). */

/* Two 2-float entries a, b of x -> (x[2a], x[2a+1], x[2b], x[2b+1]). */
KVQ__AI __m128 kvq__tq_x2(const float *x, unsigned a, unsigned b) {
    __m128 v = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(x + 2 * a)));
    return _mm_loadh_pi(v, (const __m64 *)(const void *)(x + 2 * b));
}

KVQ__AI __m256 kvq__tq_x2x2(const float *x, unsigned a, unsigned b, unsigned c, unsigned d) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(kvq__tq_x2(x, a, b)), kvq__tq_x2(x, c, d), 1);
}

/* The 8 centroids of the group whose kb packed bytes start at p, through
 * table x; reads exactly kb bytes. */
KVQ__AI __m256 kvq__tq_xcent8(const float *x, const uint8_t *p, int kb) {
    if (kb == 1)
        return _mm256_load_ps(x + 8 * p[0]);
    if (kb == 2)
        return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(x + 4 * p[0])),
                                    _mm_load_ps(x + 4 * p[1]), 1);
    if (kb == 3) {
        uint32_t w = (uint32_t)kvq__ld16(p) | (uint32_t)p[2] << 16;
        return kvq__tq_x2x2(x, w & 63, (w >> 6) & 63, (w >> 12) & 63, w >> 18);
    }
    return kvq__tq_x2x2(x, p[0], p[1], p[2], p[3]);
}

/* ---- encode ---- */
typedef struct {
    __m256 sign, t1, t2, t3, t4, t6, todd, mag;
    __m256i msq;
} kvq__tq_qk;

static inline void kvq__tq_qk_init(kvq__tq_qk *k, const kvq__tq *t) {
    const float *p = t->pthr; /* p[i] = tau_{i+1} */
    int h = t->levels / 2;
    float z = 0.0f;
    k->sign = kvq__tq_signmask();
    k->t1 = _mm256_set1_ps(h > 1 ? p[0] : z);
    k->t2 = _mm256_set1_ps(h > 2 ? p[1] : z);
    k->t3 = _mm256_set1_ps(h > 3 ? p[2] : z);
    k->t4 = _mm256_set1_ps(h > 4 ? p[3] : z);
    k->t6 = _mm256_set1_ps(h > 6 ? p[5] : z);
    k->todd = h > 4 ? _mm256_setr_ps(p[0], z, p[2], z, p[4], z, p[6], z) : _mm256_setzero_ps();
    float mg[8];
    int32_t mq[8];
    for (int n = 0; n < 8; n++) {
        mg[n] = t->mag[n < h ? n : 0];
        mq[n] = t->msq_fx[n < h ? n : 0];
    }
    k->mag = _mm256_loadu_ps(mg);
    k->msq = _mm256_loadu_si256((const __m256i *)(const void *)mq);
}

/* Counts from which sum_j msq_fx[n_j] is rebuilt exactly: kb = 2 counts
 * n = 1 in n0; kb = 3 counts n >= 1, 2, 3 in n0, n1, n10; kb = 4 adds
 * msq_fx[n] in vector lanes. */
typedef struct {
    uint32_t n1, n0, n10;
    __m256i v;
} kvq__tq_cnt;

static inline uint64_t kvq__tq_cnt_total(const kvq__tq *t, const kvq__tq_cnt *k, size_t d, int kb) {
    const int32_t *m = t->msq_fx;
    if (kb == 4) {
        int32_t l[8];
        _mm256_storeu_si256((__m256i *)(void *)l, k->v);
        uint64_t s = 0;
        for (int i = 0; i < 8; i++)
            s += (uint32_t)l[i];
        return s;
    }
    if (kb == 1)
        return (uint64_t)d * (uint32_t)m[0];
    if (kb == 2)
        return (uint64_t)(d - k->n0) * (uint32_t)m[0] + (uint64_t)k->n0 * (uint32_t)m[1];
    uint64_t n3 = k->n10, n2 = k->n1 - k->n10, n1 = k->n0 - k->n1, n0 = d - k->n0;
    return n0 * (uint32_t)m[0] + n1 * (uint32_t)m[1] + n2 * (uint32_t)m[2] + n3 * (uint32_t)m[3];
}

/* Keeps the compiler from rewriting a compare mask (it would re-derive the
 * sign bits for blendv with an extra compare). */
KVQ__AI __m256 kvq__tq_opaque(__m256 m) {
    __asm__("" : "+x"(m));
    return m;
}

/* Quantizes one group of 8 u values: writes its kb index bytes at out and,
 * for tqp (cv not NULL), the signed centroids to cv. */
KVQ__AI void kvq__tq_q8(const kvq__tq_qk *k, int kb, __m256 u, uint8_t *out, float *cv,
                        kvq__tq_cnt *cnt) {
    const uint32_t(*sp)[256] = kvq__tq_spread[kb >= 2 ? kb - 2 : 0];
    const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2),
                  four = _mm256_set1_epi32(4);
    __m256 a = _mm256_andnot_ps(k->sign, u);
    unsigned ns = (unsigned)_mm256_movemask_ps(u); /* 1 = sign bit set */
    unsigned pos = ns ^ 0xffu;
    __m256i n = _mm256_setzero_si256();
    if (kb == 1) {
        out[0] = (uint8_t)pos;
    } else if (kb == 2) {
        __m256 m1 = _mm256_cmp_ps(a, k->t1, _CMP_GE_OQ);
        unsigned b0 = (unsigned)_mm256_movemask_ps(m1);
        cnt->n0 += (uint32_t)__builtin_popcount(b0);
        kvq__st16(out, (uint16_t)(sp[0][b0 ^ ns] | sp[1][pos]));
        if (cv)
            n = _mm256_and_si256(_mm256_castps_si256(m1), one);
    } else if (kb == 3) {
        /* thermometer code m_i = [|u| >= tau_i]: n = m1 + m2 + m3 */
        __m256 m1 = _mm256_cmp_ps(a, k->t1, _CMP_GE_OQ);
        __m256 m2 = _mm256_cmp_ps(a, k->t2, _CMP_GE_OQ);
        __m256 m3 = _mm256_cmp_ps(a, k->t3, _CMP_GE_OQ);
        unsigned c1 = (unsigned)_mm256_movemask_ps(m1), c2 = (unsigned)_mm256_movemask_ps(m2),
                 c3 = (unsigned)_mm256_movemask_ps(m3);
        unsigned b0 = c1 ^ c2 ^ c3; /* n bit 0; n bit 1 is c2 */
        cnt->n0 += (uint32_t)__builtin_popcount(c1);
        cnt->n1 += (uint32_t)__builtin_popcount(c2);
        cnt->n10 += (uint32_t)__builtin_popcount(c3);
        uint32_t w = sp[0][b0 ^ ns] | sp[1][c2 ^ ns] | sp[2][pos];
        kvq__st16(out, (uint16_t)w);
        out[2] = (uint8_t)(w >> 16);
        if (cv)
            n = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_add_epi32(_mm256_add_epi32(_mm256_castps_si256(m1),
                                                                   _mm256_castps_si256(m2)),
                                                  _mm256_castps_si256(m3)));
    } else {
        __m256 m4 = kvq__tq_opaque(_mm256_cmp_ps(a, k->t4, _CMP_GE_OQ));
        __m256 m2 = _mm256_cmp_ps(a, _mm256_blendv_ps(k->t2, k->t6, m4), _CMP_GE_OQ);
        __m256i n2 = _mm256_or_si256(_mm256_and_si256(_mm256_castps_si256(m4), four),
                                     _mm256_and_si256(_mm256_castps_si256(m2), two));
        __m256 m1 = _mm256_cmp_ps(a, _mm256_permutevar8x32_ps(k->todd, n2), _CMP_GE_OQ);
        n = _mm256_or_si256(n2, _mm256_and_si256(_mm256_castps_si256(m1), one));
        cnt->v = _mm256_add_epi32(cnt->v, _mm256_permutevar8x32_epi32(k->msq, n));
        unsigned b2 = (unsigned)_mm256_movemask_ps(m4) ^ ns;
        unsigned b1 = (unsigned)_mm256_movemask_ps(m2) ^ ns;
        unsigned b0 = (unsigned)_mm256_movemask_ps(m1) ^ ns;
        uint32_t w = sp[0][b0] | sp[1][b1] | sp[2][b2] | sp[3][pos];
        memcpy(out, &w, 4);
    }
    if (cv)
        _mm256_store_ps(cv, _mm256_or_ps(_mm256_permutevar8x32_ps(k->mag, n),
                                         _mm256_and_ps(u, k->sign)));
}

/* kvq__tq_q8 for kb = 3 without centroids, on two consecutive groups u0,
 * u1 (16 values): their 6 index bytes at out. Masks of both groups are
 * joined to 16 bits, so the counts take one popcount per plane and the
 * bytes two stores. */
KVQ__AI void kvq__tq_q16_kb3(const kvq__tq_qk *k, __m256 u0, __m256 u1, uint8_t *out,
                             kvq__tq_cnt *cnt) {
    const uint32_t(*sp)[256] = kvq__tq_spread[1];
    __m256 a0 = _mm256_andnot_ps(k->sign, u0), a1 = _mm256_andnot_ps(k->sign, u1);
    unsigned ns = (unsigned)_mm256_movemask_ps(u0) | (unsigned)_mm256_movemask_ps(u1) << 8;
    unsigned c1 = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a0, k->t1, _CMP_GE_OQ)) |
                  (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a1, k->t1, _CMP_GE_OQ)) << 8;
    unsigned c2 = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a0, k->t2, _CMP_GE_OQ)) |
                  (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a1, k->t2, _CMP_GE_OQ)) << 8;
    unsigned c3 = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a0, k->t3, _CMP_GE_OQ)) |
                  (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a1, k->t3, _CMP_GE_OQ)) << 8;
    cnt->n0 += (uint32_t)__builtin_popcount(c1);
    cnt->n1 += (uint32_t)__builtin_popcount(c2);
    cnt->n10 += (uint32_t)__builtin_popcount(c3);
    unsigned p0 = c1 ^ c2 ^ c3 ^ ns, p1 = c2 ^ ns, p2 = ns ^ 0xffffu;
    uint64_t w = (uint64_t)(sp[0][p0 & 255] | sp[1][p1 & 255] | sp[2][p2 & 255]) |
                 (uint64_t)(sp[0][p0 >> 8] | sp[1][p1 >> 8] | sp[2][p2 >> 8]) << 24;
    uint32_t lo = (uint32_t)w;
    memcpy(out, &lo, 4);
    kvq__st16(out + 4, (uint16_t)(w >> 32));
}

/* kvq__tq_lanes_sum of the lanes of v, in the same order. */
KVQ__AI double kvq__tq_lanes_sum_avx2(__m256 v) {
    __m256d a = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                              _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m128d b = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(b, _mm_unpackhi_pd(b, b)));
}

/* kvq__tq_put_norm with F16C for the fp16 norm (round to nearest even, as
 * kvq__f16_from_f32; s is first rounded to float, as there). */
KVQ__AI float kvq__tq_put_norm_avx2(const kvq__tq *t, const kvq__tq_ncode *nc, uint8_t *p, double s) {
    if (t->nb != 2)
        return kvq__tq_put_norm(t, nc, p, s);
    float f = s >= 65504.0 ? 65504.0f : (float)s;
    unsigned short h = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    kvq__st16(p, (uint16_t)h);
    return _cvtsh_ss(h);
}

/* tqp tail of the encoder: the rotated residual u - rho * cv (in place in
 * u), its norm and the sign bits of S r'. u, cv: aligned d floats. */
static void kvq__tq_sketch_avx2(const kvq_codec *c, uint8_t *p, float *u, const float *cv,
                                double gamma, float sq) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    __m256 vr = _mm256_set1_ps((float)((double)sq / gamma)), rr = _mm256_setzero_ps();
    for (size_t j = 0; j < d; j += 8) {
        __m256 r = _mm256_sub_ps(_mm256_load_ps(u + j), _mm256_mul_ps(vr, _mm256_load_ps(cv + j)));
        rr = _mm256_add_ps(rr, _mm256_mul_ps(r, r));
        _mm256_store_ps(u + j, r);
    }
    kvq__tq_put_norm_avx2(t, &t->nr, p + t->off_rnorm, gamma * sqrt(kvq__tq_lanes_sum_avx2(rr)));
    uint8_t *sg = p + t->off_sign;
    for (size_t i = 0; i < d; i += 8) {
        float dots[8];
        kvq__tq_rows8(t->skm + i * d, d, u, dots);
        sg[i >> 3] = (uint8_t)_mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_loadu_ps(dots), _mm256_setzero_ps(), _CMP_GE_OQ));
    }
}

/* The encoder works on blocks of up to KVQ__TQ_EB vectors so that the
 * double-precision square roots and divisions (kept for bit-exactness with
 * the reference) run four lanes at a time: one latency chain per block
 * instead of two per vector. */
#define KVQ__TQ_EB 4

typedef struct {
    double gamma[KVQ__TQ_EB];
    float inv[KVQ__TQ_EB];
    int fast[KVQ__TQ_EB]; /* 0: the norm is outside the fast range (scalar encoder) */
} kvq__tq_blk;

/* First half for the m <= KVQ__TQ_EB vectors at x: norms and, for the FWHT,
 * every stage below h = 64 into buf + i * KVQ__MAX_HEAD_DIM. */
KVQ__AI void kvq__tq_enc_pre(const kvq__tq *t, size_t d, const float *x, size_t m, float *buf,
                             kvq__tq_blk *b) {
    _Alignas(32) double g2[KVQ__TQ_EB] = {1.0, 1.0, 1.0, 1.0};
    for (size_t i = 0; i < m; i++) {
        const float *xi = x + i * d;
        __m256 ss = _mm256_setzero_ps();
        if (t->pow2) {
            kvq__tq_fwht_blocks(buf + i * KVQ__MAX_HEAD_DIM, xi, t->sflip, &ss, d);
        } else {
            for (size_t j = 0; j < d; j += 8) {
                __m256 xv = _mm256_loadu_ps(xi + j);
                ss = _mm256_add_ps(ss, _mm256_mul_ps(xv, xv));
            }
        }
        g2[i] = kvq__tq_lanes_sum_avx2(ss);
        b->fast[i] = g2[i] >= 0x1p-100 && g2[i] <= 0x1p100;
    }
    /* gamma = sqrt(g2); inv = (float)(1 / (sqrt(d) gamma)) or (float)(1 / gamma) */
    __m256d gm = _mm256_sqrt_pd(_mm256_load_pd(g2));
    __m256d den = t->pow2 ? _mm256_mul_pd(_mm256_set1_pd(sqrt((double)d)), gm) : gm;
    _mm256_storeu_pd(b->gamma, gm);
    _mm_storeu_ps(b->inv, _mm256_cvtpd_ps(_mm256_div_pd(_mm256_set1_pd(1.0), den)));
}

/* Second half for vector i of a block: the remaining rotation and the
 * quantization; returns sum_j c_j^2 of its centroids (for the norm
 * correction). tqp (sk) also stores its norms and sketch here. */
KVQ__AI double kvq__tq_enc_post(const kvq_codec *c, const kvq__tq_qk *k, const kvq__tq_blk *bl,
                                size_t i, float *buf, uint8_t *p, int kb, int sk) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, ng = d / 8;
    _Alignas(32) float ub[KVQ__MAX_HEAD_DIM];
    _Alignas(32) float cvb[KVQ__MAX_HEAD_DIM];
    uint8_t *ix = p + t->off_idx;
    kvq__tq_cnt cnt = {0, 0, 0, _mm256_setzero_si256()};
    __m256 vi = _mm256_set1_ps(bl->inv[i]);
    if (t->pow2 && d > 64) {
        if (d > 128)
            kvq__tq_fwht_passes(buf, d, 64, d / 2);
        const size_t hg = ng / 2; /* the last stage, fused with quantization */
        if (kb == 3 && !sk) { /* pairs of groups g, g + 1 and g + hg, g + hg + 1 */
            const __m256 one = _mm256_set1_ps(1.0f);
            for (size_t g = 0; g < hg; g += 2) {
                __m256 a = _mm256_load_ps(buf + 8 * g), b = _mm256_load_ps(buf + 8 * (g + hg));
                __m256 a2 = _mm256_load_ps(buf + 8 * g + 8);
                __m256 b2 = _mm256_load_ps(buf + 8 * (g + hg) + 8);
                kvq__tq_q16_kb3(k, _mm256_mul_ps(_mm256_add_ps(a, b), vi),
                                _mm256_mul_ps(_mm256_add_ps(a2, b2), vi), ix + 3 * g, &cnt);
                kvq__tq_q16_kb3(k, _mm256_mul_ps(_mm256_fnmadd_ps(b, one, a), vi),
                                _mm256_mul_ps(_mm256_fnmadd_ps(b2, one, a2), vi),
                                ix + 3 * (g + hg), &cnt);
            }
        } else {
            for (size_t g = 0; g < hg; g++) {
                __m256 a = _mm256_load_ps(buf + 8 * g), b = _mm256_load_ps(buf + 8 * (g + hg));
                __m256 u0 = _mm256_mul_ps(_mm256_add_ps(a, b), vi);
                __m256 u1 = _mm256_mul_ps(_mm256_fnmadd_ps(b, _mm256_set1_ps(1.0f), a), vi);
                if (sk) {
                    _mm256_store_ps(ub + 8 * g, u0);
                    _mm256_store_ps(ub + 8 * (g + hg), u1);
                }
                kvq__tq_q8(k, kb, u0, ix + g * kb, sk ? cvb + 8 * g : NULL, &cnt);
                kvq__tq_q8(k, kb, u1, ix + (g + hg) * kb, sk ? cvb + 8 * (g + hg) : NULL, &cnt);
            }
        }
    } else {
        for (size_t g = 0; g < ng; g++) {
            __m256 u = _mm256_mul_ps(_mm256_load_ps(buf + 8 * g), vi);
            if (sk)
                _mm256_store_ps(ub + 8 * g, u);
            kvq__tq_q8(k, kb, u, ix + g * kb, sk ? cvb + 8 * g : NULL, &cnt);
        }
    }
    double cn2 = (double)kvq__tq_cnt_total(t, &cnt, d, kb) * t->msq_unit;
    if (sk) {
        const double gamma = bl->gamma[i];
        float sq = kvq__tq_put_norm_avx2(t, &t->ns, p, c->nc ? gamma / sqrt(cn2) : gamma);
        kvq__tq_sketch_avx2(c, p, ub, cvb, gamma, sq);
    }
    return cn2;
}

/* Encoder for d % 8 == 0 and fixed kb / sketch (inlined per pair). */
KVQ__AI void kvq__tq_encode_kb(const kvq_codec *c, uint8_t *dst, const float *src, size_t nv,
                               int kb, int sk) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, vb = c->bytes;
    _Alignas(32) float buf[KVQ__TQ_EB * KVQ__MAX_HEAD_DIM];
    kvq__tq_qk k;
    kvq__tq_qk_init(&k, t);
    for (size_t v0 = 0; v0 < nv; v0 += KVQ__TQ_EB) {
        const size_t m = KVQ__MIN(KVQ__TQ_EB, nv - v0);
        const float *x = src + v0 * d;
        uint8_t *p = dst + v0 * vb;
        kvq__tq_blk bl;
        kvq__tq_enc_pre(t, d, x, m, buf, &bl);
        _Alignas(32) double cn2[KVQ__TQ_EB] = {1.0, 1.0, 1.0, 1.0};
        for (size_t i = 0; i < m; i++) {
            float *bi = buf + i * KVQ__MAX_HEAD_DIM;
            if (!bl.fast[i]) {
                kvq__tq_encode_one(c, p + i * vb, x + i * d);
            } else {
                if (!t->pow2)
                    kvq__tq_matvec_avx2(t->rot, d, bi, x + i * d);
                cn2[i] = kvq__tq_enc_post(c, &k, &bl, i, bi, p + i * vb, kb, sk);
            }
        }
        if (sk)
            continue;
        /* the stored norms of the block: gamma / sqrt(cn2) (nc) or gamma */
        __m256d sc = _mm256_loadu_pd(bl.gamma);
        if (c->nc)
            sc = _mm256_div_pd(sc, _mm256_sqrt_pd(_mm256_load_pd(cn2)));
        if (t->nb == 2) { /* kvq__tq_put_norm_avx2, four at once */
            __m128 f = _mm256_cvtpd_ps(_mm256_min_pd(sc, _mm256_set1_pd(65504.0)));
            __m128i h = _mm_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
            _Alignas(16) uint16_t hv[8];
            _mm_store_si128((__m128i *)(void *)hv, h);
            for (size_t i = 0; i < m; i++)
                if (bl.fast[i])
                    kvq__st16(p + i * vb, hv[i]);
        } else {
            _Alignas(32) double sv[KVQ__TQ_EB];
            _mm256_store_pd(sv, sc);
            for (size_t i = 0; i < m; i++)
                if (bl.fast[i])
                    kvq__tq_put_norm(t, &t->ns, p + i * vb, sv[i]);
        }
    }
}

static void kvq__tq_encode_avx2(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    switch (t->kb * 2 + t->sketch) {
    case 2:
        kvq__tq_encode_kb(c, dst, src, n, 1, 0);
        break;
    case 3:
        kvq__tq_encode_kb(c, dst, src, n, 1, 1);
        break;
    case 4:
        kvq__tq_encode_kb(c, dst, src, n, 2, 0);
        break;
    case 5:
        kvq__tq_encode_kb(c, dst, src, n, 2, 1);
        break;
    case 6:
        kvq__tq_encode_kb(c, dst, src, n, 3, 0);
        break;
    case 7:
        kvq__tq_encode_kb(c, dst, src, n, 3, 1);
        break;
    default:
        kvq__tq_encode_kb(c, dst, src, n, 4, 0);
        break;
    }
}

/* ---- decode ---- */
/* Pointer to vector v's bytes, or to a zero-padded copy in pad when a
 * 4-byte read of its last 3-bit group would pass the end of the input. */
static inline const uint8_t *kvq__tq_vec(const kvq_codec *c, const uint8_t *base, size_t v,
                                         size_t n, uint8_t *pad) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const uint8_t *p = base + v * c->bytes;
    if (t->kb == 3 && !t->sketch && v + 1 == n) {
        memcpy(pad, p, c->bytes);
        pad[c->bytes] = 0;
        return pad;
    }
    return p;
}

static void kvq__tq_decode_avx2(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    _Alignas(32) float z[KVQ__MAX_HEAD_DIM];
    float tmp[KVQ__MAX_HEAD_DIM];
    uint8_t pad[4 * KVQ__MAX_HEAD_DIM];
    kvq__tq_lut l;
    kvq__tq_lut_init(&l, t);
    const int kb = t->kb;
    for (size_t v = 0; v < n; v++) {
        const uint8_t *p = kvq__tq_vec(c, src, v, n, pad), *ix = p + t->off_idx;
        float *x = dst + v * d;
        float scale = kvq__tq_get_norm(t, &t->ns, p);
        for (size_t g = 0; g < d / 8; g++)
            _mm256_store_ps(z + 8 * g, kb == 1   ? kvq__tq_cent8(&l, ix + g, 1)
                                       : kb == 2 ? kvq__tq_cent8(&l, ix + 2 * g, 2)
                                       : kb == 3 ? kvq__tq_cent8(&l, ix + 3 * g, 3)
                                                 : kvq__tq_cent8(&l, ix + 4 * g, 4));
        if (t->sketch) {
            __m256 kap = _mm256_set1_ps(kvq__tq_get_norm(t, &t->nr, p + t->off_rnorm) * t->sk_scale);
            __m256 sc = _mm256_set1_ps(scale);
            kvq__tq_sketch_t_signs_avx2(t, d, tmp, p + t->off_sign);
            for (size_t j = 0; j < d; j += 8)
                _mm256_store_ps(z + j, _mm256_add_ps(_mm256_mul_ps(sc, _mm256_load_ps(z + j)),
                                                     _mm256_mul_ps(kap, _mm256_loadu_ps(tmp + j))));
            scale = 1.0f;
        }
        if (t->pow2) {
            kvq__tq_fwht_avx2(z, d);
            __m256 f = _mm256_set1_ps(scale * t->rs);
            for (size_t j = 0; j < d; j += 8)
                _mm256_storeu_ps(x + j, _mm256_xor_ps(_mm256_mul_ps(_mm256_load_ps(z + j), f),
                                                      _mm256_loadu_ps((const float *)(const void *)(t->sflip + j))));
        } else {
            kvq__tq_matvec_t_avx2(t->rot, d, x, z);
            __m256 f = _mm256_set1_ps(scale);
            for (size_t j = 0; j < d; j += 8)
                _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), f));
        }
    }
}

/* ---- score ---- */
/* sum_j sq_j * sigma_j for one vector's sign bits. */
KVQ__AI float kvq__tq_sign_dot(const float *sq, const uint8_t *sg, size_t d) {
    const __m256 sm = kvq__tq_signmask();
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    size_t g = 0;
    for (; g + 2 <= d / 8; g += 2) {
        a0 = _mm256_add_ps(a0, _mm256_xor_ps(_mm256_load_ps(sq + 8 * g),
                                             _mm256_andnot_ps(kvq__tq_bitmask8(sg[g]), sm)));
        a1 = _mm256_add_ps(a1, _mm256_xor_ps(_mm256_load_ps(sq + 8 * g + 8),
                                             _mm256_andnot_ps(kvq__tq_bitmask8(sg[g + 1]), sm)));
    }
    if (g < d / 8)
        a0 = _mm256_add_ps(a0, _mm256_xor_ps(_mm256_load_ps(sq + 8 * g),
                                             _mm256_andnot_ps(kvq__tq_bitmask8(sg[g]), sm)));
    return kvq__hsum256(_mm256_add_ps(a0, a1));
}

static inline uint64_t kvq__tq_ldu64(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* Builds the score tables of one prepared query whose rotated part q is in
 * place (layout: tq_impl.h, kvq__tq_lut_floats). Entry (h << kb) | l of a
 * two-coordinate field is q_a c[l] + q_b c[h]. */
static void kvq__tq_lut_build(const kvq__tq *t, size_t d, const float *q, float *lut) {
    const int kb = t->kb;
    const float *c = t->cent;
    if (kb == 4) { /* 16 entries per coordinate */
        __m256 c0 = _mm256_loadu_ps(c), c1 = _mm256_loadu_ps(c + 8);
        for (size_t j = 0; j < d; j++) {
            __m256 qj = _mm256_set1_ps(q[j]);
            _mm256_store_ps(lut + 16 * j, _mm256_mul_ps(qj, c0));
            _mm256_store_ps(lut + 16 * j + 8, _mm256_mul_ps(qj, c1));
        }
    } else if (kb == 3) { /* 64 entries per pair: 8 rows of 8 */
        __m256 cv = _mm256_loadu_ps(c);
        for (size_t f = 0; f < d / 2; f++) {
            __m256 pa = _mm256_mul_ps(_mm256_set1_ps(q[2 * f]), cv);
            float qb = q[2 * f + 1], *tf = lut + 64 * f;
            for (int h = 0; h < 8; h++)
                _mm256_store_ps(tf + 8 * h, _mm256_add_ps(pa, _mm256_set1_ps(qb * c[h])));
        }
    } else if (kb == 2) { /* 16 entries per pair: 4 rows of 4, two rows per register */
        __m128 cv = _mm_loadu_ps(c);
        for (size_t f = 0; f < d / 2; f++) {
            __m128 pa = _mm_mul_ps(_mm_set1_ps(q[2 * f]), cv);
            __m256 pa2 = _mm256_insertf128_ps(_mm256_castps128_ps256(pa), pa, 1);
            float qb = q[2 * f + 1], *tf = lut + 16 * f;
            __m256 h01 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(qb * c[0])),
                                              _mm_set1_ps(qb * c[1]), 1);
            __m256 h23 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(qb * c[2])),
                                              _mm_set1_ps(qb * c[3]), 1);
            _mm256_store_ps(tf, _mm256_add_ps(pa2, h01));
            _mm256_store_ps(tf + 8, _mm256_add_ps(pa2, h23));
        }
    } else { /* kb = 1: one byte = 8 coordinates, entry (h << 4) | l = lo[l] + hi[h] */
        const __m256 b0 = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
        const __m256 b1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, -1, -1, 0, 0, -1, -1));
        const __m256 b2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1));
        for (size_t f = 0; f < d / 8; f++) {
            const float *qf = q + 8 * f;
            _Alignas(32) float lo[16], hi[16];
            for (int half = 0; half < 2; half++) {
                const float *qh = qf + 4 * half;
                /* entries v < 8 (bit 3 clear) and v >= 8: sum_i q_i c[bit i of v] */
                __m256 s = _mm256_blendv_ps(_mm256_set1_ps(qh[0] * c[0]), _mm256_set1_ps(qh[0] * c[1]), b0);
                s = _mm256_add_ps(s, _mm256_blendv_ps(_mm256_set1_ps(qh[1] * c[0]),
                                                      _mm256_set1_ps(qh[1] * c[1]), b1));
                s = _mm256_add_ps(s, _mm256_blendv_ps(_mm256_set1_ps(qh[2] * c[0]),
                                                      _mm256_set1_ps(qh[2] * c[1]), b2));
                float *dst = half ? hi : lo;
                _mm256_store_ps(dst, _mm256_add_ps(s, _mm256_set1_ps(qh[3] * c[0])));
                _mm256_store_ps(dst + 8, _mm256_add_ps(s, _mm256_set1_ps(qh[3] * c[1])));
            }
            __m256 l0 = _mm256_load_ps(lo), l1 = _mm256_load_ps(lo + 8);
            float *tf = lut + 256 * f;
            for (int h = 0; h < 16; h++) {
                __m256 hv = _mm256_set1_ps(hi[h]);
                _mm256_store_ps(tf + 16 * h, _mm256_add_ps(l0, hv));
                _mm256_store_ps(tf + 16 * h + 8, _mm256_add_ps(l1, hv));
            }
        }
    }
}

/* sum_j q'_j c[idx_j] for one vector's index area ix, by table lookups.
 * kb = 3 reads 8 bytes at a time (up to 2 bytes past the area; callers
 * guarantee they are readable). */
KVQ__BMI KVQ__AI float kvq__tq_lut_dot(const float *lut, const uint8_t *ix, size_t d, int kb) {
    /* eight independent sums (named, so they stay in registers): the add
     * latency, not the loads, would otherwise bound the loop */
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    const float *tb = lut;
    if (kb == 1) { /* one byte per field */
        size_t f = 0, nf = d / 8;
        for (; f + 8 <= nf; f += 8, tb += 2048) {
            s0 += tb[0 + ix[f + 0]];
            s1 += tb[256 + ix[f + 1]];
            s2 += tb[512 + ix[f + 2]];
            s3 += tb[768 + ix[f + 3]];
            s4 += tb[1024 + ix[f + 4]];
            s5 += tb[1280 + ix[f + 5]];
            s6 += tb[1536 + ix[f + 6]];
            s7 += tb[1792 + ix[f + 7]];
        }
        for (; f < nf; f++, tb += 256)
            s0 += tb[ix[f]];
    } else if (kb == 2 || kb == 4) { /* nibble fields, 16 per 8 bytes */
        size_t f = 0, nf = d * (size_t)kb / 4;
        for (; f + 16 <= nf; f += 16, tb += 256) {
            uint64_t w = kvq__tq_ldu64(ix + f / 2);
            s0 += tb[0 + (w & 15)];
            s1 += tb[16 + (_bextr_u64(w, 4, 4))];
            s2 += tb[32 + (_bextr_u64(w, 8, 4))];
            s3 += tb[48 + (_bextr_u64(w, 12, 4))];
            s4 += tb[64 + (_bextr_u64(w, 16, 4))];
            s5 += tb[80 + (_bextr_u64(w, 20, 4))];
            s6 += tb[96 + (_bextr_u64(w, 24, 4))];
            s7 += tb[112 + (_bextr_u64(w, 28, 4))];
            s0 += tb[128 + (_bextr_u64(w, 32, 4))];
            s1 += tb[144 + (_bextr_u64(w, 36, 4))];
            s2 += tb[160 + (_bextr_u64(w, 40, 4))];
            s3 += tb[176 + (_bextr_u64(w, 44, 4))];
            s4 += tb[192 + (_bextr_u64(w, 48, 4))];
            s5 += tb[208 + (_bextr_u64(w, 52, 4))];
            s6 += tb[224 + (_bextr_u64(w, 56, 4))];
            s7 += tb[240 + (w >> 60)];
        }
        for (; f < nf; f += 2, tb += 32) {
            unsigned b = ix[f / 2];
            s0 += tb[b & 15];
            s1 += tb[16 + (b >> 4)];
        }
    } else { /* kb = 3: 6-bit fields, 8 per 6 bytes */
        size_t f = 0, nf = d / 2;
        const uint8_t *p = ix;
        for (; f + 8 <= nf; f += 8, tb += 512, p += 6) {
            uint64_t w = kvq__tq_ldu64(p);
            s0 += tb[0 + (w & 63)];
            s1 += tb[64 + (_bextr_u64(w, 6, 6))];
            s2 += tb[128 + (_bextr_u64(w, 12, 6))];
            s3 += tb[192 + (_bextr_u64(w, 18, 6))];
            s4 += tb[256 + (_bextr_u64(w, 24, 6))];
            s5 += tb[320 + (_bextr_u64(w, 30, 6))];
            s6 += tb[384 + (_bextr_u64(w, 36, 6))];
            s7 += tb[448 + (_bextr_u64(w, 42, 6))];
        }
        if (f < nf) { /* 4 fields in the last 3 bytes */
            uint32_t w = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
            s0 += tb[w & 63];
            s1 += tb[64 + ((w >> 6) & 63)];
            s2 += tb[128 + ((w >> 12) & 63)];
            s3 += tb[192 + (w >> 18)];
        }
    }
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}

/* Two keys' kvq__tq_lut_dot at once for kb = 3 and 4 (a and b are index
 * areas; same reads as kvq__tq_lut_dot): sixteen independent sums, so the
 * add latency of one key overlaps the other's instead of bounding the loop
 * (on Zen 1 the out-of-order window does not reach the next key). */
KVQ__BMI KVQ__AI void kvq__tq_lut_dot2(const float *lut, const uint8_t *a, const uint8_t *b, size_t d,
                                       int kb, float *ra, float *rb) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
    float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f, t4 = 0.0f, t5 = 0.0f, t6 = 0.0f, t7 = 0.0f;
    const float *tb = lut;
    if (kb == 4) {
        size_t f = 0, nf = d;
        for (; f + 16 <= nf; f += 16, tb += 256) {
            uint64_t w = kvq__tq_ldu64(a + f / 2), v = kvq__tq_ldu64(b + f / 2);
            s0 += tb[0 + (w & 15)];
            t0 += tb[0 + (v & 15)];
            s1 += tb[16 + (_bextr_u64(w, 4, 4))];
            t1 += tb[16 + (_bextr_u64(v, 4, 4))];
            s2 += tb[32 + (_bextr_u64(w, 8, 4))];
            t2 += tb[32 + (_bextr_u64(v, 8, 4))];
            s3 += tb[48 + (_bextr_u64(w, 12, 4))];
            t3 += tb[48 + (_bextr_u64(v, 12, 4))];
            s4 += tb[64 + (_bextr_u64(w, 16, 4))];
            t4 += tb[64 + (_bextr_u64(v, 16, 4))];
            s5 += tb[80 + (_bextr_u64(w, 20, 4))];
            t5 += tb[80 + (_bextr_u64(v, 20, 4))];
            s6 += tb[96 + (_bextr_u64(w, 24, 4))];
            t6 += tb[96 + (_bextr_u64(v, 24, 4))];
            s7 += tb[112 + (_bextr_u64(w, 28, 4))];
            t7 += tb[112 + (_bextr_u64(v, 28, 4))];
            s0 += tb[128 + (_bextr_u64(w, 32, 4))];
            t0 += tb[128 + (_bextr_u64(v, 32, 4))];
            s1 += tb[144 + (_bextr_u64(w, 36, 4))];
            t1 += tb[144 + (_bextr_u64(v, 36, 4))];
            s2 += tb[160 + (_bextr_u64(w, 40, 4))];
            t2 += tb[160 + (_bextr_u64(v, 40, 4))];
            s3 += tb[176 + (_bextr_u64(w, 44, 4))];
            t3 += tb[176 + (_bextr_u64(v, 44, 4))];
            s4 += tb[192 + (_bextr_u64(w, 48, 4))];
            t4 += tb[192 + (_bextr_u64(v, 48, 4))];
            s5 += tb[208 + (_bextr_u64(w, 52, 4))];
            t5 += tb[208 + (_bextr_u64(v, 52, 4))];
            s6 += tb[224 + (_bextr_u64(w, 56, 4))];
            t6 += tb[224 + (_bextr_u64(v, 56, 4))];
            s7 += tb[240 + (w >> 60)];
            t7 += tb[240 + (v >> 60)];
        }
        for (; f < nf; f += 2, tb += 32) {
            unsigned x = a[f / 2], y = b[f / 2];
            s0 += tb[x & 15];
            t0 += tb[y & 15];
            s1 += tb[16 + (x >> 4)];
            t1 += tb[16 + (y >> 4)];
        }
    } else { /* kb = 3 */
        size_t f = 0, nf = d / 2;
        const uint8_t *p = a, *q = b;
        for (; f + 8 <= nf; f += 8, tb += 512, p += 6, q += 6) {
            uint64_t w = kvq__tq_ldu64(p), v = kvq__tq_ldu64(q);
            s0 += tb[0 + (w & 63)];
            t0 += tb[0 + (v & 63)];
            s1 += tb[64 + (_bextr_u64(w, 6, 6))];
            t1 += tb[64 + (_bextr_u64(v, 6, 6))];
            s2 += tb[128 + (_bextr_u64(w, 12, 6))];
            t2 += tb[128 + (_bextr_u64(v, 12, 6))];
            s3 += tb[192 + (_bextr_u64(w, 18, 6))];
            t3 += tb[192 + (_bextr_u64(v, 18, 6))];
            s4 += tb[256 + (_bextr_u64(w, 24, 6))];
            t4 += tb[256 + (_bextr_u64(v, 24, 6))];
            s5 += tb[320 + (_bextr_u64(w, 30, 6))];
            t5 += tb[320 + (_bextr_u64(v, 30, 6))];
            s6 += tb[384 + (_bextr_u64(w, 36, 6))];
            t6 += tb[384 + (_bextr_u64(v, 36, 6))];
            s7 += tb[448 + (_bextr_u64(w, 42, 6))];
            t7 += tb[448 + (_bextr_u64(v, 42, 6))];
        }
        if (f < nf) {
            uint32_t w = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
            uint32_t v = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16;
            s0 += tb[w & 63];
            t0 += tb[v & 63];
            s1 += tb[64 + ((w >> 6) & 63)];
            t1 += tb[64 + ((v >> 6) & 63)];
            s2 += tb[128 + ((w >> 12) & 63)];
            t2 += tb[128 + ((v >> 12) & 63)];
            s3 += tb[192 + (w >> 18)];
            t3 += tb[192 + (v >> 18)];
        }
    }
    *ra = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    *rb = ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7));
}

/* A stored norm (F16C for fp16). */
KVQ__AI float kvq__tq_norm_avx2(const kvq__tq *t, const kvq__tq_ncode *nc, const uint8_t *p) {
    return t->nb == 2 ? _cvtsh_ss(kvq__ld16(p)) : nc->tab[p[0]];
}

KVQ__BMI KVQ__AI void kvq__tq_score_kb(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                       size_t nq, const uint8_t *keys, size_t n, int kb) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, qs = c->qp_bytes / 4, so = kvq__round64(d * 4) / 4, vb = c->bytes;
    const size_t lo = (t->sketch ? 2 : 1) * so, oi = t->off_idx;
    /* tq3 reads up to 2 bytes past a vector: the last one goes through pad */
    const size_t direct = (kb == 3 && !t->sketch && n) ? n - 1 : n;
    uint8_t pad[4 * KVQ__MAX_HEAD_DIM];
    for (size_t i = 0; i < nq; i++) {
        const float *qb = (const float *)qp + i * qs;
        float *o = out + i * ostride;
        size_t k = 0;
        if ((kb == 3 || kb == 4) && !t->sketch) {
            if (kb == 3 && d == 128 && t->nb == 2) { /* the common shape: fixed loops */
                for (; k + 2 <= direct; k += 2) {
                    const uint8_t *p = keys + k * vb;
                    float sa, sb;
                    kvq__tq_lut_dot2(qb + lo, p + oi, p + vb + oi, 128, kb, &sa, &sb);
                    o[k] = sa * _cvtsh_ss(kvq__ld16(p));
                    o[k + 1] = sb * _cvtsh_ss(kvq__ld16(p + vb));
                }
            }
            for (; k + 2 <= direct; k += 2) {
                const uint8_t *p = keys + k * vb;
                float sa, sb;
                kvq__tq_lut_dot2(qb + lo, p + oi, p + vb + oi, d, kb, &sa, &sb);
                o[k] = sa * kvq__tq_norm_avx2(t, &t->ns, p);
                o[k + 1] = sb * kvq__tq_norm_avx2(t, &t->ns, p + vb);
            }
        }
        for (; k < n; k++) {
            const uint8_t *p = keys + k * vb;
            if (k >= direct) {
                memcpy(pad, p, vb);
                memset(pad + vb, 0, 8);
                p = pad;
            }
            float s = kvq__tq_lut_dot(qb + lo, p + oi, d, kb) * kvq__tq_norm_avx2(t, &t->ns, p);
            if (t->sketch)
                s += kvq__tq_norm_avx2(t, &t->nr, p + t->off_rnorm) * t->sk_scale *
                     kvq__tq_sign_dot(qb + so, p + t->off_sign, d);
            o[k] = s;
        }
    }
}

/* Keys p and p + vb against Q (2 or 4) rotated queries q (stride qs
 * floats): each key decoded once, 2Q independent FMA chains; the scores go
 * to out[i * ostride] and out[i * ostride + 1] for query i. */
KVQ__AI void kvq__tq_keys2(const kvq__tq *t, const float *x, const uint8_t *p, size_t vb,
                           const float *q, size_t qs, size_t ng, int kb, float *out,
                           size_t ostride, const int Q) {
    const uint8_t *ix = p + t->off_idx, *iy = ix + vb;
    __m256 a[4], b[4];
    KVQ__UNROLL4 for (int i = 0; i < Q; i++) a[i] = b[i] = _mm256_setzero_ps();
    for (size_t g = 0; g < ng; g++) {
        __m256 cz = kvq__tq_xcent8(x, ix + g * (size_t)kb, kb);
        __m256 cy = kvq__tq_xcent8(x, iy + g * (size_t)kb, kb);
        KVQ__UNROLL4 for (int i = 0; i < Q; i++) {
            __m256 v = _mm256_load_ps(q + (size_t)i * qs + 8 * g);
            a[i] = _mm256_fmadd_ps(cz, v, a[i]);
            b[i] = _mm256_fmadd_ps(cy, v, b[i]);
        }
    }
    float r[8]; /* key p: r[0..Q), key p + vb: r[Q..2Q) */
    if (Q == 4) {
        _mm_storeu_ps(r, kvq__hsum4x256(a[0], a[1], a[2], a[3]));
        _mm_storeu_ps(r + 4, kvq__hsum4x256(b[0], b[1], b[2], b[3]));
    } else {
        _mm_storeu_ps(r, kvq__hsum4x256(a[0], a[1], b[0], b[1]));
    }
    float sa = kvq__tq_norm_avx2(t, &t->ns, p), sb = kvq__tq_norm_avx2(t, &t->ns, p + vb);
    KVQ__UNROLL4 for (int i = 0; i < Q; i++) {
        out[(size_t)i * ostride] = r[i] * sa;
        out[(size_t)i * ostride + 1] = r[Q + i] * sb;
    }
}

/* Several queries (a GQA group, a prefill tile): each key is decoded once
 * to its centroids in the rotated domain (expansion table), then dotted
 * with every rotated query in registers; the per-query lookup tables (16.9
 * KB each for tq3 at d=128) would not stay in L1 for a group. The first 4
 * queries take the centroids straight from the decode; z keeps them for
 * the others. */
KVQ__AI void kvq__tq_score_mq_kb(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                 size_t nq, const uint8_t *keys, size_t n, int kb) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, qs = c->qp_bytes / 4, so = kvq__round64(d * 4) / 4, ng = d / 8;
    const size_t oi = t->off_idx, vb = c->bytes;
    _Alignas(32) float z[KVQ__MAX_HEAD_DIM];
    const float *x = t->xtab;
    const float *q = (const float *)qp;
    const int keep = nq > 4;
    size_t k = 0;
    if ((nq == 4 || nq == 2) && !t->sketch) /* two keys at a time, no idle query slots */
        for (; k + 2 <= n; k += 2) {
            if (nq == 4)
                kvq__tq_keys2(t, x, keys + k * vb, vb, q, qs, ng, kb, out + k, ostride, 4);
            else
                kvq__tq_keys2(t, x, keys + k * vb, vb, q, qs, ng, kb, out + k, ostride, 2);
        }
    for (; k < n; k++) {
        const uint8_t *p = keys + k * vb, *ix = p + oi;
        float scale = kvq__tq_norm_avx2(t, &t->ns, p);
        float rk = t->sketch ? kvq__tq_norm_avx2(t, &t->nr, p + t->off_rnorm) * t->sk_scale : 0.0f;
        for (size_t i0 = 0; i0 < nq; i0 += 4) {
            size_t m = KVQ__MIN(4, nq - i0);
            const float *q0 = q + i0 * qs, *q1 = q0 + (m > 1 ? qs : 0), *q2 = q0 + (m > 2 ? 2 * qs : 0),
                        *q3 = q0 + (m > 3 ? 3 * qs : 0);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t g = 0; g < ng; g++) {
                __m256 cz;
                if (i0 == 0) {
                    cz = kvq__tq_xcent8(x, ix + g * (size_t)kb, kb);
                    if (keep)
                        _mm256_store_ps(z + 8 * g, cz);
                } else {
                    cz = _mm256_load_ps(z + 8 * g);
                }
                a0 = _mm256_fmadd_ps(cz, _mm256_load_ps(q0 + 8 * g), a0);
                a1 = _mm256_fmadd_ps(cz, _mm256_load_ps(q1 + 8 * g), a1);
                a2 = _mm256_fmadd_ps(cz, _mm256_load_ps(q2 + 8 * g), a2);
                a3 = _mm256_fmadd_ps(cz, _mm256_load_ps(q3 + 8 * g), a3);
            }
            float r[4];
            _mm_storeu_ps(r, kvq__hsum4x256(a0, a1, a2, a3));
            for (size_t i = 0; i < m; i++) {
                float sc = r[i] * scale;
                if (t->sketch)
                    sc += rk * kvq__tq_sign_dot(q + (i0 + i) * qs + so, p + t->off_sign, d);
                out[(i0 + i) * ostride + k] = sc;
            }
        }
    }
}

/* ---- tq4 score through byte shuffles (d % 32 == 0) ----
 * Four-bit indices are nibbles, so vpshufb looks up 32 centroids at once in
 * the codebook held as int16 (t->c16lo / c16hi, one table per byte); vpmaddwd
 * dots them with the query quantized to int16 (prep: one scale per query,
 * codes within +-KVQ__TQ_C16_MAX, stored in the order the shuffles produce
 * centroids). About 8 vector operations per 32 coordinates and no table
 * loads, against 32 scalar lookups. The int16 codebook and query cost a
 * relative error of about 1e-5 of |q||k| (tests bound it); int32 sums are
 * turned to float every 128 coordinates, below overflow. */

/* The query of a prepared block as int16 codes; their scale (times
 * c16_scale) follows the d codes. */
static void kvq__tq4_prep_q16(const kvq__tq *t, size_t d, const float *qr, int16_t *q16) {
    __m256 mx = _mm256_setzero_ps();
    for (size_t j = 0; j < d; j += 8)
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(kvq__tq_signmask(), _mm256_load_ps(qr + j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    float s = m > 0.0f ? (float)KVQ__TQ_C16_MAX / m : 0.0f;
    for (size_t k = 0; k < d; k += 32) /* [even 0..14, odd 1..15], [even 16..30, odd 17..31] */
        for (size_t i = 0; i < 8; i++) {
            q16[k + i] = (int16_t)lrintf(qr[k + 2 * i] * s);
            q16[k + 8 + i] = (int16_t)lrintf(qr[k + 2 * i + 1] * s);
            q16[k + 16 + i] = (int16_t)lrintf(qr[k + 16 + 2 * i] * s);
            q16[k + 24 + i] = (int16_t)lrintf(qr[k + 17 + 2 * i] * s);
        }
    float sc = m > 0.0f ? m / (float)KVQ__TQ_C16_MAX * t->c16_scale : 0.0f;
    memcpy(q16 + d, &sc, sizeof sc);
}

/* The 32 centroids (int16) of the 16 index bytes at ix: a = even
 * coordinates 0..14 | odd 1..15, b = even 16..30 | odd 17..31. */
KVQ__AI void kvq__tq4_c16x32(__m256i tlo, __m256i thi, const uint8_t *ix, __m256i *a, __m256i *b) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)ix);
    const __m256i v =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    const __m256i lo = _mm256_shuffle_epi8(tlo, v), hi = _mm256_shuffle_epi8(thi, v);
    *a = _mm256_unpacklo_epi8(lo, hi);
    *b = _mm256_unpackhi_epi8(lo, hi);
}

/* One key against up to four int16 queries (q0..q3; repeats for fewer):
 * float lane sums in f[0..3]. */
KVQ__AI void kvq__tq4_key(__m256i tlo, __m256i thi, const uint8_t *ix, const int16_t *const *q,
                          size_t d, const int nq4, __m256 *f) {
    KVQ__UNROLL4 for (int i = 0; i < nq4; i++) f[i] = _mm256_setzero_ps();
    for (size_t k0 = 0; k0 < d; k0 += 128) {
        __m256i acc[4];
        KVQ__UNROLL4 for (int i = 0; i < nq4; i++) acc[i] = _mm256_setzero_si256();
        const size_t end = KVQ__MIN(d, k0 + 128);
        KVQ__UNROLL4 for (size_t k = k0; k < end; k += 32) {
            __m256i a, b;
            kvq__tq4_c16x32(tlo, thi, ix + k / 2, &a, &b);
            KVQ__UNROLL4 for (int i = 0; i < nq4; i++) {
                const __m256i *qv = (const __m256i *)(const void *)(q[i] + k);
                acc[i] = _mm256_add_epi32(acc[i], _mm256_add_epi32(_mm256_madd_epi16(a, _mm256_load_si256(qv)),
                                                                   _mm256_madd_epi16(b, _mm256_load_si256(qv + 1))));
            }
        }
        KVQ__UNROLL4 for (int i = 0; i < nq4; i++) f[i] = _mm256_add_ps(f[i], _mm256_cvtepi32_ps(acc[i]));
    }
}

/* (not inlined into kvq__tq_score_avx2: its aligned vector temporaries would
 * take a frame register from the lookup loops there, which need them all) */
__attribute__((noinline)) static void kvq__tq4_score(const kvq_codec *c, float *out, size_t ostride,
                                                     const void *qp, size_t nq, const uint8_t *keys,
                                                     size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, qs = c->qp_bytes / 4, lo = kvq__round64(d * 4) / 4, vb = c->bytes;
    const size_t oi = t->off_idx;
    const __m256i tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)t->c16lo));
    const __m256i thi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)t->c16hi));
    if (nq == 1) { /* four keys per reduction */
        const int16_t *q16 = (const int16_t *)(const void *)((const float *)qp + lo);
        float qsc;
        memcpy(&qsc, q16 + d, sizeof qsc);
        size_t k = 0;
        for (; k + 4 <= n; k += 4) {
            const uint8_t *p = keys + k * vb;
            __m256 f0, f1, f2, f3;
            kvq__tq4_key(tlo, thi, p + oi, &q16, d, 1, &f0);
            kvq__tq4_key(tlo, thi, p + vb + oi, &q16, d, 1, &f1);
            kvq__tq4_key(tlo, thi, p + 2 * vb + oi, &q16, d, 1, &f2);
            kvq__tq4_key(tlo, thi, p + 3 * vb + oi, &q16, d, 1, &f3);
            __m128 nr = _mm_setr_ps(kvq__tq_norm_avx2(t, &t->ns, p), kvq__tq_norm_avx2(t, &t->ns, p + vb),
                                    kvq__tq_norm_avx2(t, &t->ns, p + 2 * vb),
                                    kvq__tq_norm_avx2(t, &t->ns, p + 3 * vb));
            _mm_storeu_ps(out + k, _mm_mul_ps(_mm_mul_ps(kvq__hsum4x256(f0, f1, f2, f3), nr), _mm_set1_ps(qsc)));
        }
        for (; k < n; k++) {
            const uint8_t *p = keys + k * vb;
            __m256 f0, z = _mm256_setzero_ps();
            kvq__tq4_key(tlo, thi, p + oi, &q16, d, 1, &f0);
            out[k] = _mm_cvtss_f32(kvq__hsum4x256(f0, z, z, z)) * kvq__tq_norm_avx2(t, &t->ns, p) * qsc;
        }
        return;
    }
    for (size_t i0 = 0; i0 < nq; i0 += 4) { /* each key decoded once per group of four queries */
        const size_t m = KVQ__MIN(4, nq - i0);
        const int16_t *q[4];
        float qsc[4];
        for (size_t i = 0; i < 4; i++) {
            q[i] = (const int16_t *)(const void *)((const float *)qp + (i0 + (i < m ? i : 0)) * qs + lo);
            memcpy(&qsc[i], q[i] + d, sizeof qsc[i]);
        }
        const __m128 qv = _mm_loadu_ps(qsc);
        for (size_t k = 0; k < n; k++) {
            const uint8_t *p = keys + k * vb;
            __m256 f[4];
            if (m == 4 && d == 128) {
                kvq__tq4_key(tlo, thi, p + oi, q, 128, 4, f);
            } else if (m == 4) {
                kvq__tq4_key(tlo, thi, p + oi, q, d, 4, f);
            } else {
                kvq__tq4_key(tlo, thi, p + oi, q, d, 2, f);
                f[2] = f[3] = _mm256_setzero_ps();
                if (m == 3)
                    kvq__tq4_key(tlo, thi, p + oi, q + 2, d, 1, f + 2);
            }
            float r[4];
            _mm_storeu_ps(r, _mm_mul_ps(_mm_mul_ps(kvq__hsum4x256(f[0], f[1], f[2], f[3]), qv),
                                        _mm_set1_ps(kvq__tq_norm_avx2(t, &t->ns, p))));
            for (size_t i = 0; i < m; i++)
                out[(i0 + i) * ostride + k] = r[i];
        }
    }
}

KVQ__BMI static void kvq__tq_score_avx2(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                               size_t nq, const uint8_t *keys, size_t n) {
    if (((const kvq__tq *)c->state)->kb == 4 && c->d % 32 == 0) {
        kvq__tq4_score(c, out, ostride, qp, nq, keys, n);
        return;
    }
    if (nq > 1) {
        switch (((const kvq__tq *)c->state)->kb) {
        case 1:
            kvq__tq_score_mq_kb(c, out, ostride, qp, nq, keys, n, 1);
            return;
        case 2:
            kvq__tq_score_mq_kb(c, out, ostride, qp, nq, keys, n, 2);
            return;
        case 3:
            kvq__tq_score_mq_kb(c, out, ostride, qp, nq, keys, n, 3);
            return;
        default:
            kvq__tq_score_mq_kb(c, out, ostride, qp, nq, keys, n, 4);
            return;
        }
    }
    switch (((const kvq__tq *)c->state)->kb) {
    case 1:
        kvq__tq_score_kb(c, out, ostride, qp, nq, keys, n, 1);
        break;
    case 2:
        kvq__tq_score_kb(c, out, ostride, qp, nq, keys, n, 2);
        break;
    case 3:
        kvq__tq_score_kb(c, out, ostride, qp, nq, keys, n, 3);
        break;
    default:
        kvq__tq_score_kb(c, out, ostride, qp, nq, keys, n, 4);
        break;
    }
}

/* ---- prep / finish ---- */
void kvq__tq_rotate_avx2(const kvq_codec *c, float *qr, const float *q) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    if (t->pow2) {
        for (size_t j = 0; j < d; j += 8)
            _mm256_store_ps(qr + j, _mm256_xor_ps(_mm256_loadu_ps(q + j),
                                                  _mm256_loadu_ps((const float *)(const void *)(t->sflip + j))));
        kvq__tq_fwht_avx2(qr, d);
        __m256 rs = _mm256_set1_ps(t->rs);
        for (size_t j = 0; j < d; j += 8)
            _mm256_store_ps(qr + j, _mm256_mul_ps(_mm256_load_ps(qr + j), rs));
    } else {
        kvq__tq_matvec_avx2(t->rot, d, qr, q);
    }
}

static void kvq__tq_prep_avx2(const kvq_codec *c, void *qp, const float *q) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    float *qr = (float *)qp; /* 64-byte aligned */
    kvq__tq_rotate_avx2(c, qr, q);
    if (t->sketch)
        kvq__tq_matvec_avx2(t->skm, d, qr + kvq__round64(d * 4) / 4, qr);
    float *tail = qr + (t->sketch ? 2 : 1) * (kvq__round64(d * 4) / 4);
    if (t->kb == 4 && d % 32 == 0)
        kvq__tq4_prep_q16(t, d, qr, (int16_t *)(void *)tail);
    else
        kvq__tq_lut_build(t, d, qr, tail);
}

static void kvq__tq_finish_avx2(const kvq_codec *c, float *out, const float *acc) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    _Alignas(32) float z[KVQ__MAX_HEAD_DIM];
    float tmp[KVQ__MAX_HEAD_DIM];
    memcpy(z, acc, d * sizeof(float));
    if (t->sketch) {
        kvq__tq_matvec_t_avx2(t->skm, d, tmp, acc + d);
        __m256 ks = _mm256_set1_ps(t->sk_scale);
        for (size_t j = 0; j < d; j += 8)
            _mm256_store_ps(z + j, _mm256_add_ps(_mm256_load_ps(z + j),
                                                 _mm256_mul_ps(ks, _mm256_loadu_ps(tmp + j))));
    }
    if (t->pow2) {
        kvq__tq_fwht_avx2(z, d);
        __m256 rs = _mm256_set1_ps(t->rs);
        for (size_t j = 0; j < d; j += 8) {
            __m256 v = _mm256_xor_ps(_mm256_mul_ps(_mm256_load_ps(z + j), rs),
                                     _mm256_loadu_ps((const float *)(const void *)(t->sflip + j)));
            _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j), v));
        }
    } else {
        kvq__tq_matvec_t_avx2(t->rot, d, tmp, z);
        for (size_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j), _mm256_loadu_ps(tmp + j)));
    }
}

/* ---- accumulate ---- */
/* Register-blocked accumulate: for each pair of 8-coordinate groups, up to
 * 4 weight rows stay in registers over a chunk of values, so the
 * accumulator rows are loaded and stored once per chunk instead of once per
 * value; each value's centroids are decoded (expansion table) once per 4
 * rows, and each broadcast weight serves two groups. The QJL sketch part of
 * tqp follows value by value. */
/* Accumulator rows r < m (computed for R = 2 or 4 rows; weights sw[r *
 * sws + k]) of groups g and g + 1 over the kn keys at ptr: each key's 16
 * centroids are decoded once for all rows. */
KVQ__AI void kvq__tq_acc_2g(const float *x, const uint8_t *const *ptr, const float *sw, size_t sws,
                            size_t kn, size_t off, int kb, float *const *rows, size_t m, size_t g,
                            const int R) {
    __m256 xs[4], ys[4];
    KVQ__UNROLL4 for (int r = 0; r < R; r++) xs[r] = ys[r] = _mm256_setzero_ps();
    for (size_t kk = 0; kk < kn; kk++) {
        __m256 cz = kvq__tq_xcent8(x, ptr[kk] + off, kb);
        __m256 cy = kvq__tq_xcent8(x, ptr[kk] + off + (size_t)kb, kb);
        KVQ__UNROLL4 for (int r = 0; r < R; r++) {
            __m256 wr = _mm256_broadcast_ss(sw + (size_t)r * sws + kk);
            xs[r] = _mm256_fmadd_ps(wr, cz, xs[r]);
            ys[r] = _mm256_fmadd_ps(wr, cy, ys[r]);
        }
    }
    KVQ__UNROLL4 for (int r = 0; r < R; r++) { /* constant indices: xs, ys stay in registers */
        if ((size_t)r >= m)
            break;
        float *ar = rows[r] + 8 * g;
        _mm256_storeu_ps(ar, _mm256_add_ps(_mm256_loadu_ps(ar), xs[r]));
        _mm256_storeu_ps(ar + 8, _mm256_add_ps(_mm256_loadu_ps(ar + 8), ys[r]));
    }
}

KVQ__AI void kvq__tq_accum_kb(const kvq_codec *c, float *acc, size_t astride, const float *w,
                              size_t wstride, size_t nq, const uint8_t *vals, size_t n, int kb) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, ng = d / 8, oi = t->off_idx, vb = c->bytes;
    const __m256 sm = kvq__tq_signmask();
    enum { CH = 64 };
    const float *x = t->xtab;
    const uint8_t *ptr[CH];
    float nrm[CH];
    float sw[4][CH];
    for (size_t k0 = 0; k0 < n; k0 += CH) {
        size_t kn = KVQ__MIN((size_t)CH, n - k0);
        for (size_t kk = 0; kk < kn; kk++) {
            ptr[kk] = vals + (k0 + kk) * vb + oi;
            nrm[kk] = kvq__tq_norm_avx2(t, &t->ns, vals + (k0 + kk) * vb);
        }
        for (size_t i0 = 0; i0 < nq; i0 += 4) {
            size_t m = KVQ__MIN(4, nq - i0);
            for (size_t r = 0; r < 4; r++)
                for (size_t kk = 0; kk < kn; kk++)
                    sw[r][kk] = r < m ? w[(i0 + r) * wstride + k0 + kk] * nrm[kk] : 0.0f;
            float *a0 = acc + i0 * astride;
            float *a1 = m > 1 ? a0 + astride : a0, *a2 = m > 2 ? a0 + 2 * astride : a0,
                  *a3 = m > 3 ? a0 + 3 * astride : a0;
            float *rows[4] = {a0, a1, a2, a3};
            size_t g = 0;
            if (m == 1) { /* one row: four groups per pass over the keys, no idle rows */
                for (; g + 4 <= ng; g += 4) {
                    __m256 x0 = _mm256_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
                    const size_t off = g * (size_t)kb;
                    for (size_t kk = 0; kk < kn; kk++) {
                        const uint8_t *pk = ptr[kk] + off;
                        __m256 wk = _mm256_broadcast_ss(&sw[0][kk]);
                        x0 = _mm256_fmadd_ps(wk, kvq__tq_xcent8(x, pk, kb), x0);
                        x1 = _mm256_fmadd_ps(wk, kvq__tq_xcent8(x, pk + kb, kb), x1);
                        x2 = _mm256_fmadd_ps(wk, kvq__tq_xcent8(x, pk + 2 * kb, kb), x2);
                        x3 = _mm256_fmadd_ps(wk, kvq__tq_xcent8(x, pk + 3 * kb, kb), x3);
                    }
                    float *ar = a0 + 8 * g;
                    _mm256_storeu_ps(ar, _mm256_add_ps(_mm256_loadu_ps(ar), x0));
                    _mm256_storeu_ps(ar + 8, _mm256_add_ps(_mm256_loadu_ps(ar + 8), x1));
                    _mm256_storeu_ps(ar + 16, _mm256_add_ps(_mm256_loadu_ps(ar + 16), x2));
                    _mm256_storeu_ps(ar + 24, _mm256_add_ps(_mm256_loadu_ps(ar + 24), x3));
                }
            }
            if (m == 2) /* two rows: no idle ones */
                for (; g + 2 <= ng; g += 2)
                    kvq__tq_acc_2g(x, ptr, &sw[0][0], CH, kn, g * (size_t)kb, kb, rows, m, g, 2);
            for (; g + 2 <= ng; g += 2)
                kvq__tq_acc_2g(x, ptr, &sw[0][0], CH, kn, g * (size_t)kb, kb, rows, m, g, 4);
            if (g < ng) {
                __m256 x0 = _mm256_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
                for (size_t kk = 0; kk < kn; kk++) {
                    __m256 cz = kvq__tq_xcent8(x, ptr[kk] + g * (size_t)kb, kb);
                    x0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sw[0][kk]), cz, x0);
                    x1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sw[1][kk]), cz, x1);
                    x2 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sw[2][kk]), cz, x2);
                    x3 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sw[3][kk]), cz, x3);
                }
                __m256 xs[4] = {x0, x1, x2, x3};
                for (size_t r = 0; r < m; r++)
                    _mm256_storeu_ps(rows[r] + 8 * g,
                                     _mm256_add_ps(_mm256_loadu_ps(rows[r] + 8 * g), xs[r]));
            }
        }
        if (!t->sketch)
            continue;
        for (size_t kk = 0; kk < kn; kk++) {
            const uint8_t *p = vals + (k0 + kk) * vb;
            float rn = kvq__tq_get_norm(t, &t->nr, p + t->off_rnorm);
            const uint8_t *sg = p + t->off_sign;
            for (size_t i = 0; i < nq; i++) {
                float wk = w[i * wstride + k0 + kk];
                if (wk == 0.0f)
                    continue;
                float *a = acc + i * astride;
                __m256 wr = _mm256_set1_ps(wk * rn);
                for (size_t g = 0; g < ng; g++) {
                    __m256 v = _mm256_xor_ps(wr, _mm256_andnot_ps(kvq__tq_bitmask8(sg[g]), sm));
                    _mm256_storeu_ps(a + d + 8 * g, _mm256_add_ps(_mm256_loadu_ps(a + d + 8 * g), v));
                }
            }
        }
    }
}

static void kvq__tq_accum_avx2(const kvq_codec *c, float *acc, size_t astride, const float *w,
                               size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    switch (((const kvq__tq *)c->state)->kb) {
    case 1:
        kvq__tq_accum_kb(c, acc, astride, w, wstride, nq, vals, n, 1);
        break;
    case 2:
        kvq__tq_accum_kb(c, acc, astride, w, wstride, nq, vals, n, 2);
        break;
    case 3:
        kvq__tq_accum_kb(c, acc, astride, w, wstride, nq, vals, n, 3);
        break;
    default:
        kvq__tq_accum_kb(c, acc, astride, w, wstride, nq, vals, n, 4);
        break;
    }
}


/* ---- tiled pages (layout and error bound: tq.c, "Tiled pages") ----
 * Keys: for each block of 16 tokens and each group of 4 dimensions, one
 * unit of 64 index slots decodes to 64 unsigned centroid codes c6 + 64 (a
 * 32-bit lane = one token's 4 dimensions; c6: tq_avx2.h), which vpmaddubsw
 * multiplies with the 4 int8 query codes of the group (|code| <= 63, held
 * broadcast to 32 bytes in the prepared query); the int16 results of two
 * groups are added, then vpmaddwd with ones widens them to int32 per token
 * (2 x 2 x 127 x 63 < 2^15). tq1..tq3 decode a block's units into a
 * buffer first, from which the dot products of the 4 query rows take their
 * operands; tq4, whose decode is two masks, a shift and two lookups,
 * decodes in the loop, 8 tokens per pass. Values: for each quad of tokens and block of 16 dimensions, one
 * unit decodes to 64 signed codes c6 (a 32-bit lane = one dimension of 4
 * tokens), multiplied with the 4 tokens' weights quantized to u8 (<= 127)
 * and broadcast, two quads per int16 sum (2 x 2 x 127 x 63 < 2^15);
 * taccum_run rounds the weights once over the run of pages (per segment of
 * 256 tokens), decodes the segment's units of a block of 16 dimensions into
 * a buffer (tq1..tq3; tq4 in the loop) and sums the pages of the run in the
 * same int32 registers, converted once. Decoding: kvq__tq_tdec. On Zen 4 (no VNNI on this path)
 * the vector pipes bound these kernels: about 3 vector ops retire per
 * cycle, 20 of the ~29 per unit (4 rows) are the dot products. */

/* The 64 codes of the unit at u: c[0] slots 0..31, c[1] slots 32..63, one
 * byte each, looked up in tab (kvq__tq_ttab). Every kb first builds 32
 * bytes X holding two slots per byte as nibbles: byte p of the low 128 bits
 * slots p (low nibble) and p + 32 (high), byte p of the high 128 bits slots
 * p + 16 and p + 48, so that the low nibbles are slots 0..31 and the high
 * ones 32..63. tq4's plane is X as stored. For tq1..tq3 a nibble holds the
 * crumb in bits 0-1 (tq2, tq3: crumb plane byte p, bits 2k for slot p + 16k:
 * a shift by 0 or 2 per 128 bits and the mask 0x33) and the bit in bit 2
 * (tq1, tq3: bit plane byte p % 8, bit 2k + p / 8: a shift by 2, 1, 0, -1
 * per 64 bits and the mask 0x44; no bit under the mask leaves its byte), and
 * bits 3 and 7 of X are 0: vpshufb looks the low nibbles up in X as it is
 * (it ignores bits 4-6 of an index) and the high ones in X >> 4 by 16-bit
 * lanes (bit 7 of a byte is then bit 3 of the next one), without a mask. */
KVQ__AI void kvq__tq_tdec(const uint8_t *u, int kb, const __m256i tab, __m256i *c) {
    if (kb == 4) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)u), m = _mm256_set1_epi8(15);
        c[0] = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, m));
        c[1] = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), m));
        return;
    }
    __m256i x = _mm256_setzero_si256();
    if (kb >= 2) {
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)u));
        x = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 2, 2)), _mm256_set1_epi8(0x33));
    }
    if (kb & 1) {
        const __m256i w = _mm256_castpd_si256(_mm256_broadcast_sd((const double *)(const void *)(u + (kb == 3 ? 16 : 0))));
        __m256i b = _mm256_srli_epi64(_mm256_sllv_epi64(w, _mm256_setr_epi64x(3, 2, 1, 0)), 1);
        b = _mm256_and_si256(b, _mm256_set1_epi8(0x44));
        x = kb == 3 ? _mm256_or_si256(x, b) : b;
    }
    c[0] = _mm256_shuffle_epi8(tab, x);
    c[1] = _mm256_shuffle_epi8(tab, _mm256_srli_epi16(x, 4));
}

/* The lookup table of kvq__tq_tdec from the 16 codes cb[l] of index l:
 * entry e is cb[e >> 2] for tq1 (its bit in bit 2), cb[e] otherwise. */
KVQ__AI __m256i kvq__tq_ttab(__m128i cb, int kb) {
    if (kb == 1)
        cb = _mm_shuffle_epi8(cb, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    return _mm256_broadcastsi128_si256(cb);
}

void kvq__tq_tnorms(const kvq__tq *t, const uint8_t *page, size_t k0, size_t n, float *out) {
    if (t->nb == 2) {
        for (size_t k = 0; k < n; k += 8)
            _mm256_storeu_ps(out + k, kvq__load_f16x8(page + 2 * (k0 + k)));
    } else {
        for (size_t k = 0; k < n; k++)
            out[k] = t->ns.tab[page[k0 + k]];
    }
}

size_t kvq__tq_tpieces(const kvq__tq *t, const uint8_t *const *pages, size_t P, size_t qb, size_t s0,
                       size_t sn, kvq__tq_tpiece *pc, float *nrm) {
    size_t npc = 0;
    for (size_t s = s0; s < s0 + sn; npc++) {
        const size_t i = s / P, k0 = s - i * P, kn = KVQ__MIN(P - k0, s0 + sn - s);
        kvq__tq_tpiece_set(t, pages[i], i, P, qb, k0, kn, &pc[npc], nrm + (s - s0));
        s += kn;
    }
    return npc;
}

void kvq__tq_tpieces_exact(const kvq_codec *c, float *acc, const float *w, const kvq__tq_tpiece *pc,
                           size_t npc, size_t P) {
    for (size_t p = 0; p < npc; p++)
        kvq__tq_taccum_exact(c, acc, w + pc[p].pg * P, pc[p].page, P, pc[p].k0, 4 * pc[p].nquad);
}

/* The tiled query preparation with query codes within +-qmax, centroid code
 * scale cs and bias: sc = s_q cs, corr = bias sum_j a_j. */
static void kvq__tq_tprep_qs(const kvq_codec *c, void *qp, const float *q, int qmax, float cs, int bias) {
    const size_t d = c->d;
    _Alignas(32) float qr[KVQ__MAX_HEAD_DIM];
    kvq__tq_rotate_avx2(c, qr, q);
    __m256 mx = _mm256_setzero_ps();
    for (size_t j = 0; j < d; j += 8)
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(kvq__tq_signmask(), _mm256_load_ps(qr + j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    kvq__tq_tqh *hd = (kvq__tq_tqh *)qp;
    int8_t *code = (int8_t *)qp + KVQ__TQ_TQ_CODES;
    /* a NaN or infinite query gives NaN scores, as the reference does */
    if (!(m > 0.0f) || !(m <= FLT_MAX)) {
        memset(code, 0, d);
        hd->sc = m == 0.0f ? 0.0f : NAN;
        hd->corr = 0;
        return;
    }
    /* below 2^-100, qmax / m could overflow: scale by 2^100 first (exact) */
    const float ps = m < 0x1p-100f ? 0x1p100f : 1.0f, ms = m * ps;
    const __m256 inv = _mm256_set1_ps((float)qmax / ms), vps = _mm256_set1_ps(ps);
    __m256i sum = _mm256_setzero_si256();
    for (size_t j = 0; j < d; j += 16) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(qr + j), vps), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(qr + j + 8), vps), inv));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, b));
        __m128i p = _mm_packs_epi16(_mm256_castsi256_si128(_mm256_packs_epi32(a, b)),
                                    _mm256_extracti128_si256(_mm256_packs_epi32(a, b), 1));
        /* packs_epi32 interleaves 128-bit lanes: a0..3 b0..3 | a4..7 b4..7 */
        p = _mm_shuffle_epi32(p, 0xD8);
        _mm_storeu_si128((__m128i *)(void *)(code + j), p);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    hd->sc = ms / (float)qmax * cs * (1.0f / ps);
    hd->corr = bias * _mm_cvtsi128_si32(s4);
}

void kvq__tq_tprep_q(const kvq_codec *c, void *qp, const float *q, int qmax) {
    kvq__tq_tprep_qs(c, qp, q, qmax, ((const kvq__tq *)c->state)->c8_scale, 128);
}


/* Codes of a_k = w_k nrm_k (n a multiple of 16; from buf when it holds
 * them) times inv, times ps first when ps != 1: the products of the rule in
 * tq_impl.h. */
KVQ__AI void kvq__tq_wcodes(const float *buf, const float *w, const float *nrm, size_t n, float ps, float inv,
                            uint8_t *code) {
    const __m256 vi = _mm256_set1_ps(inv), vps = _mm256_set1_ps(ps);
    for (size_t k = 0; k < n; k += 16) {
        __m256 x, y;
        if (buf) {
            x = _mm256_load_ps(buf + k);
            y = _mm256_load_ps(buf + k + 8);
        } else {
            x = _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(nrm + k));
            y = _mm256_mul_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(nrm + k + 8));
        }
        if (ps != 1.0f) {
            x = _mm256_mul_ps(x, vps);
            y = _mm256_mul_ps(y, vps);
        }
        __m256i p16 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x, vi)),
                                         _mm256_cvtps_epi32(_mm256_mul_ps(y, vi))); /* a0..3 b0..3 | a4..7 b4..7 */
        __m128i p = _mm_packus_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
        _mm_storeu_si128((__m128i *)(void *)(code + k), _mm_shuffle_epi32(p, 0xD8));
    }
}

#define KVQ__TQ_WBUF 256 /* rows up to this long keep a_k for the second pass */

int kvq__tq_wquant(const float *w, const float *nrm, size_t n, int wmax, uint8_t *code, float *scale) {
    _Alignas(32) float a[KVQ__TQ_WBUF];
    float *buf = n <= KVQ__TQ_WBUF ? a : NULL;
    __m256 mx = _mm256_setzero_ps(), mn = mx, bad = mx;
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    for (size_t k = 0; k < n; k += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(nrm + k));
        if (buf)
            _mm256_store_ps(buf + k, x);
        /* not (x <= FLT_MAX): infinite or NaN; negative: the minimum below 0 */
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, big, _CMP_NLE_UQ));
        mn = _mm256_min_ps(mn, x);
        mx = _mm256_max_ps(mx, x);
    }
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(mn, _mm256_setzero_ps(), _CMP_LT_OQ));
    if (_mm256_movemask_ps(bad))
        return 0;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (m == 0.0f) {
        memset(code, 0, n);
        *scale = 0.0f;
        return 1;
    }
    /* below 2^-100, wmax / m could overflow: scale by 2^100 first (exact) */
    const float ps = m < 0x1p-100f ? 0x1p100f : 1.0f, ms = m * ps;
    kvq__tq_wcodes(buf, w, nrm, n, ps, (float)wmax / ms, code);
    *scale = ms / (float)wmax * (1.0f / ps);
    return 1;
}

/* The 16 codes c6 (tq_avx2.h) in the low 128 bits. */
KVQ__AI __m128i kvq__tq_c6(const kvq__tq *t) {
    const float m = fabsf(t->cent[t->levels - 1]);
    const __m256 k = _mm256_set1_ps(m > 0.0f ? 63.0f / m : 0.0f);
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(t->cent), k));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(t->cent + 8), k));
    __m256i p16 = _mm256_packs_epi32(a, b); /* a0..3 b0..3 | a4..7 b4..7 */
    __m128i p = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
    p = _mm_shuffle_epi32(p, 0xD8);
    p = _mm_min_epi8(_mm_max_epi8(p, _mm_set1_epi8(-KVQ__TQ_C_AVX2)), _mm_set1_epi8(KVQ__TQ_C_AVX2));
    /* entries l >= levels are 0 */
    const __m128i l = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm_and_si128(p, _mm_cmpgt_epi8(_mm_set1_epi8((char)t->levels), l));
}

void kvq__tq_avx2_codes(const kvq__tq *t, int8_t *c6, float *s6) {
    _mm_storeu_si128((__m128i *)(void *)c6, kvq__tq_c6(t));
    const float m = fabsf(t->cent[t->levels - 1]);
    *s6 = m > 0.0f ? m / 63.0f : 1.0f;
}

static inline int32_t kvq__tq_ld32i(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void kvq__tq_tprep_avx2(const kvq_codec *c, void *qp, const float *q) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    int8_t c6[16];
    float s6;
    kvq__tq_avx2_codes(t, c6, &s6);
    kvq__tq_tprep_qs(c, qp, q, KVQ__TQ_Q_MADD, s6, KVQ__TQ_BIAS_AVX2);
    kvq__tq_tqh2 *hd = (kvq__tq_tqh2 *)qp;
    hd->pad[0] = hd->pad[1] = 0;
    /* the codes of each group of 4 dimensions broadcast to 32 bytes (the
     * operands of tscore's vpmaddubsw, read from memory without a broadcast) */
    const int8_t *code = (const int8_t *)qp + KVQ__TQ_TQ_CODES;
    __m256i *qv = (__m256i *)(void *)((uint8_t *)qp + KVQ__TQ_TQ_QV(c->d));
    for (size_t g = 0; g < c->d / 4; g++)
        _mm256_store_si256(qv + g, _mm256_set1_epi32(kvq__tq_ld32i(code + 4 * g)));
    _mm_storeu_si128((__m128i *)(void *)hd->tabu,
                     _mm_add_epi8(_mm_loadu_si128((const __m128i *)(const void *)c6), _mm_set1_epi8(KVQ__TQ_BIAS_AVX2)));
}

/* int32 lanes += vpmaddwd(vpmaddubsw(a0, b0) + vpmaddubsw(a1, b1), 1): the
 * int16 sum of two pair sums must not overflow (tq_avx2.h). */
KVQ__AI __m256i kvq__tq_dot4x2(__m256i acc, __m256i a0, __m256i b0, __m256i a1, __m256i b1) {
    __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(a0, b0), _mm256_maddubs_epi16(a1, b1));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
}


/* R (1, 2 or 4) query rows q[r] against the 16 keys of token block tb,
 * sums starting at init[r]: the block's units are decoded first (biased
 * codes, tab) into a buffer from which the dot products take their operands
 * (no register pressure: 8 accumulators), or for tq4 in the loop, 8 tokens
 * per pass; two groups per int16 sum. */
KVQ__AI void kvq__tq_tscore_blk(const kvq_codec *c, const uint8_t *units, const int8_t *const *q,
                                const __m256i tab, const __m256i *init, __m256i *f, int kb, const int R,
                                const uint8_t *pf) {
    const size_t ng = c->d / 4, ub = 8 * (size_t)kb;
    if (kb == 4) { /* tq4: a cheap decode, in the loop; 8 tokens per pass (4 accumulators) */
        KVQ__UNROLL4 for (int H = 0; H < 2; H++) {
            __m256i x[4];
            KVQ__UNROLL4 for (int r = 0; r < R; r++) x[r] = init[r];
            for (size_t g = 0; g < ng; g += 2) {
                const uint8_t *u = units + g * ub;
                if (pf && H == 0) /* the same bytes of the next page */
                    _mm_prefetch((const char *)(pf + g * ub), _MM_HINT_T0);
                __m256i a0[2], a1[2];
                kvq__tq_tdec(u, kb, tab, a0);
                kvq__tq_tdec(u + ub, kb, tab, a1);
                KVQ__UNROLL4 for (int r = 0; r < R; r++) {
                    const __m256i *qv = (const __m256i *)(const void *)(q[r] - KVQ__TQ_TQ_CODES + KVQ__TQ_TQ_QV(c->d)) + g;
                    x[r] = kvq__tq_dot4x2(x[r], a0[H], qv[0], a1[H], qv[1]);
                }
            }
            KVQ__UNROLL4 for (int r = 0; r < R; r++) f[2 * r + H] = x[r];
        }
        return;
    }
    _Alignas(32) __m256i cb[2 * KVQ__MAX_HEAD_DIM / 4];
    for (size_t g = 0; g < ng; g++) {
        if (pf && g % 2 == 0)
            _mm_prefetch((const char *)(pf + g * ub), _MM_HINT_T0);
        kvq__tq_tdec(units + g * ub, kb, tab, cb + 2 * g);
    }
    __m256i lo[4], hi[4];
    KVQ__UNROLL4 for (int r = 0; r < R; r++) lo[r] = hi[r] = init[r];
    for (size_t g = 0; g < ng; g += 2) { /* ng = d / 4 is a multiple of 4 */
        KVQ__UNROLL4 for (int r = 0; r < R; r++) {
            const __m256i *qv = (const __m256i *)(const void *)(q[r] - KVQ__TQ_TQ_CODES + KVQ__TQ_TQ_QV(c->d)) + g;
            lo[r] = kvq__tq_dot4x2(lo[r], cb[2 * g], qv[0], cb[2 * g + 2], qv[1]);
            hi[r] = kvq__tq_dot4x2(hi[r], cb[2 * g + 1], qv[0], cb[2 * g + 3], qv[1]);
        }
    }
    KVQ__UNROLL4 for (int r = 0; r < R; r++) {
        f[2 * r] = lo[r];
        f[2 * r + 1] = hi[r];
    }
}

KVQ__AI void kvq__tq_tscore_kb(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                               size_t nq, const uint8_t *page, size_t P, int kb) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t qs = c->tqp_bytes, ubb = (c->d / 4) * 8 * (size_t)kb;
    const uint8_t *units = page + P * t->nb;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t m = KVQ__MIN(4, nq - i0);
        const int8_t *q[4];
        __m256 sc[4];
        __m256i corr[4]; /* -corr: the sums start there */
        for (size_t r = 0; r < 4; r++) {
            const uint8_t *p = (const uint8_t *)qp + (i0 + (r < m ? r : 0)) * qs;
            const kvq__tq_tqh2 *hd = (const kvq__tq_tqh2 *)(const void *)p;
            q[r] = (const int8_t *)(p + KVQ__TQ_TQ_CODES);
            sc[r] = _mm256_set1_ps(hd->sc);
            corr[r] = _mm256_set1_epi32(-hd->corr);
        }
        const __m256i tab =
            kvq__tq_ttab(_mm_loadu_si128((const __m128i *)(const void *)((const kvq__tq_tqh2 *)qp)->tabu), kb);
        for (size_t tb = 0; tb < P; tb += 16) {
            __m256i f[8];
            const uint8_t *u = units + (tb / 16) * ubb;
            const uint8_t *pf = kvq__pf_next && i0 == 0 ? kvq__pf_next + (u - page) : NULL;
            if (pf && tb == 0)
                for (size_t o = 0; o < P * t->nb; o += 64)
                    _mm_prefetch((const char *)(kvq__pf_next + o), _MM_HINT_T0);
            if (m > 2)
                kvq__tq_tscore_blk(c, u, q, tab, corr, f, kb, 4, pf);
            else if (m == 2)
                kvq__tq_tscore_blk(c, u, q, tab, corr, f, kb, 2, pf);
            else
                kvq__tq_tscore_blk(c, u, q, tab, corr, f, kb, 1, pf);
            float nrm[16];
            kvq__tq_tnorms(t, page, tb, 16, nrm);
            const __m256 n0 = _mm256_loadu_ps(nrm), n1 = _mm256_loadu_ps(nrm + 8);
            for (size_t r = 0; r < m; r++) {
                float *o = out + (i0 + r) * ostride + tb;
                /* sum - corr = sum_j code_j c6[idx_j], |.| <= 63 * 63 d < 2^24: exact in float */
                __m256 d0 = _mm256_cvtepi32_ps(f[2 * r]);
                __m256 d1 = _mm256_cvtepi32_ps(f[2 * r + 1]);
                _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_mul_ps(d0, sc[r]), n0));
                _mm256_storeu_ps(o + 8, _mm256_mul_ps(_mm256_mul_ps(d1, sc[r]), n1));
            }
        }
    }
}

/* Tokens of a page, or of a run of pages (taccum_run), handled with one
 * weight scale per row. It bounds the int32 sums of a dimension: |sum_k
 * code_k c8_k| <= 256 * 127 * 127 < 2^22 (the int16 pair sums of
 * vpmaddubsw stay within 2 * 127 * 127 < 2^15) whatever the run's length:
 * no overflow, and the conversion to float is exact. */
#define KVQ__TQ_TSEG 256
_Static_assert(KVQ__TQ_TSEG <= 16 * KVQ__TQ_TPIECES, "segment pieces");

/* R rows: acc rows a[r] (dims 16h..16h+15) += the quads of the pieces
 * pc[0..npc) (one after the other; units d/16 apart) weighted by wq[r]
 * (u8, 4 per quad) times fs[r]: the pages of a run sum into the same int32
 * registers, converted and scaled once. Per block h of 16 dimensions the
 * segment's units are decoded first (signed codes c6, tab) into a buffer
 * from which the dot products take their operands (8 accumulators, no
 * spills), or with direct (tq4) in the loop; two quads per int16 sum (a
 * piece's nquad is a multiple of 4). */
KVQ__AI void kvq__tq_taccum_blk(const kvq_codec *c, const kvq__tq_tpiece *pc, size_t npc,
                                const uint8_t (*wq)[KVQ__TQ_TSEG], float *const *a, const float *fs,
                                const __m256i tab, int kb, const int R, const int direct) {
    const size_t nh = c->d / 16, ub = 8 * (size_t)kb, qb = nh * ub;
    _Alignas(32) __m256i cb[2 * KVQ__TQ_TSEG / 4];
    for (size_t h = 0; h < nh && direct; h++) {
        /* tq4: a cheap decode, where the buffer's stores and reloads cost
         * more than they save (+11% on one page, +3% on runs); the 8
         * dimensions of each half in a pass of their own (4 accumulators) */
        KVQ__UNROLL4 for (int H = 0; H < 2; H++) {
            __m256i x[4];
            KVQ__UNROLL4 for (int r = 0; r < R; r++) x[r] = _mm256_setzero_si256();
            size_t wo = 0;
            for (size_t pi = 0; pi < npc; pi++) {
                const uint8_t *u = pc[pi].units + h * ub;
                for (size_t qd = 0; qd < pc[pi].nquad; qd += 2, u += 2 * qb, wo += 8) {
                    if (kvq__pf_delta && h == 0 && H == 0) /* the quads in the next head's area */
                        for (size_t o = 0; o < 2 * qb; o += 64)
                            _mm_prefetch((const char *)(u + kvq__pf_delta + o), _MM_HINT_T0);
                    __m256i c0[2], c1[2];
                    kvq__tq_tdec(u, kb, tab, c0);
                    kvq__tq_tdec(u + qb, kb, tab, c1);
                    KVQ__UNROLL4 for (int r = 0; r < R; r++)
                        x[r] = kvq__tq_dot4x2(x[r], _mm256_set1_epi32(kvq__tq_ld32i(wq[r] + wo)), c0[H],
                                              _mm256_set1_epi32(kvq__tq_ld32i(wq[r] + wo + 4)), c1[H]);
                }
            }
            KVQ__UNROLL4 for (int r = 0; r < R; r++) {
                if (!a[r])
                    continue;
                float *o = a[r] + 16 * h + 8 * H;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(x[r]), _mm256_set1_ps(fs[r]), _mm256_loadu_ps(o)));
            }
        }
    }
    for (size_t h = 0; h < nh && !direct; h++) {
        size_t nqd = 0;
        for (size_t pi = 0; pi < npc; pi++) {
            const uint8_t *u = pc[pi].units + h * ub;
            for (size_t qd = 0; qd < pc[pi].nquad; qd++, u += qb, nqd++) {
                if (kvq__pf_delta && h == 0) /* the quad in the next head's area */
                    for (size_t o = 0; o < qb; o += 64)
                        _mm_prefetch((const char *)(u + kvq__pf_delta + o), _MM_HINT_T0);
                kvq__tq_tdec(u, kb, tab, cb + 2 * nqd);
            }
        }
        __m256i lo[4], hi[4];
        KVQ__UNROLL4 for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        for (size_t qd = 0; qd < nqd; qd += 2) {
            KVQ__UNROLL4 for (int r = 0; r < R; r++) {
                const __m256i w0 = _mm256_set1_epi32(kvq__tq_ld32i(wq[r] + 4 * qd));
                const __m256i w1 = _mm256_set1_epi32(kvq__tq_ld32i(wq[r] + 4 * qd + 4));
                lo[r] = kvq__tq_dot4x2(lo[r], w0, cb[2 * qd], w1, cb[2 * qd + 2]);
                hi[r] = kvq__tq_dot4x2(hi[r], w0, cb[2 * qd + 1], w1, cb[2 * qd + 3]);
            }
        }
        KVQ__UNROLL4 for (int r = 0; r < R; r++) {
            if (!a[r])
                continue;
            float *o = a[r] + 16 * h;
            __m256 sv = _mm256_set1_ps(fs[r]);
            _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r]), sv, _mm256_loadu_ps(o)));
            _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[r]), sv, _mm256_loadu_ps(o + 8)));
        }
    }
}

/* taccum over the run of np pages (np = 1: one page), in segments of the
 * run's np * P tokens (page after page) of up to KVQ__TQ_TSEG: one weight
 * scale per row and segment, one conversion per segment. */
KVQ__AI void kvq__tq_taccum_kb(const kvq_codec *c, float *acc, size_t astride, const float *w,
                               size_t wstride, size_t nq, const uint8_t *const *pages, size_t np, size_t P,
                               int kb, const int one) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t qb = (c->d / 16) * 8 * (size_t)kb; /* bytes of a quad's units */
    const __m256i tab = kvq__tq_ttab(kvq__tq_c6(t), kb);
    const float m6 = fabsf(t->cent[t->levels - 1]), s6 = m6 > 0.0f ? m6 / 63.0f : 1.0f;
    float nrm[KVQ__TQ_TSEG];
    uint8_t wq[4][KVQ__TQ_TSEG];
    kvq__tq_tpiece pc[KVQ__TQ_TPIECES];
    const size_t N = np * P;
    for (size_t s0 = 0; s0 < N; s0 += KVQ__TQ_TSEG) {
        const size_t sn = KVQ__MIN((size_t)KVQ__TQ_TSEG, N - s0);
        size_t npc = 1;
        if (one) /* taccum (np = 1): npc a constant in the loops */
            kvq__tq_tpiece_set(t, pages[0], 0, P, qb, s0, sn, pc, nrm);
        else
            npc = kvq__tq_tpieces(t, pages, P, qb, s0, sn, pc, nrm);
        for (size_t i0 = 0; i0 < nq; i0 += 4) {
            const size_t m = KVQ__MIN(4, nq - i0);
            float *a[4] = {NULL, NULL, NULL, NULL};
            float fs[4] = {0, 0, 0, 0};
            int any = 0;
            for (size_t r = 0; r < 4; r++) {
                float sw;
                const float *wr = w + (i0 + r) * wstride;
                if (r >= m) {
                    memset(wq[r], 0, sn);
                } else if (kvq__tq_wquant(wr + s0, nrm, sn, KVQ__TQ_W_MADD, wq[r], &sw)) {
                    a[r] = acc + (i0 + r) * astride;
                    fs[r] = sw * s6;
                    any = 1;
                } else {
                    memset(wq[r], 0, sn);
                    kvq__tq_tpieces_exact(c, acc + (i0 + r) * astride, wr, pc, npc, P);
                }
            }
            if (!any)
                continue;
            if (m > 2)
                kvq__tq_taccum_blk(c, pc, npc, wq, a, fs, tab, kb, 4, kb == 4);
            else if (m == 2)
                kvq__tq_taccum_blk(c, pc, npc, wq, a, fs, tab, kb, 2, kb == 4);
            else
                kvq__tq_taccum_blk(c, pc, npc, wq, a, fs, tab, kb, 1, kb == 4);
        }
    }
}

/* The tiled kernels of kb index bits: separate functions (GCC's choices for
 * one kb then do not depend on the code of the others). */
#define KVQ__TQ_TKERNELS(kb)                                                                         \
    static void kvq__tq_tscore_avx2_##kb(const kvq_codec *c, float *out, size_t ostride, const void *qp, \
                                         size_t nq, const uint8_t *page, size_t P) {                 \
        kvq__tq_tscore_kb(c, out, ostride, qp, nq, page, P, kb);                                     \
    }                                                                                                \
    static void kvq__tq_taccum_run_avx2_##kb(const kvq_codec *c, float *acc, size_t astride,         \
                                             const float *w, size_t wstride, size_t nq,              \
                                             const uint8_t *const *pages, size_t np, size_t P) {     \
        kvq__tq_taccum_kb(c, acc, astride, w, wstride, nq, pages, np, P, kb, 0);                     \
    }                                                                                                \
    static void kvq__tq_taccum_avx2_##kb(const kvq_codec *c, float *acc, size_t astride, const float *w, \
                                         size_t wstride, size_t nq, const uint8_t *page, size_t P) {  \
        const uint8_t *const pages[1] = {page};                                                      \
        kvq__tq_taccum_kb(c, acc, astride, w, wstride, nq, pages, 1, P, kb, 1);                      \
    }
KVQ__TQ_TKERNELS(1)
KVQ__TQ_TKERNELS(2)
KVQ__TQ_TKERNELS(3)
KVQ__TQ_TKERNELS(4)

void kvq__tq_avx2_select(kvq_codec *c) {
    if (c->d % 8 != 0)
        return;
    if (c->tiled && c->d % 16 == 0) { /* tq (no sketch) with tiled pages */
        c->k.tprep = kvq__tq_tprep_avx2;
        switch (((const kvq__tq *)c->state)->kb) {
        case 1:
            c->k.tscore = kvq__tq_tscore_avx2_1;
            c->k.taccum = kvq__tq_taccum_avx2_1;
            c->k.taccum_run = kvq__tq_taccum_run_avx2_1;
            break;
        case 2:
            c->k.tscore = kvq__tq_tscore_avx2_2;
            c->k.taccum = kvq__tq_taccum_avx2_2;
            c->k.taccum_run = kvq__tq_taccum_run_avx2_2;
            break;
        case 3:
            c->k.tscore = kvq__tq_tscore_avx2_3;
            c->k.taccum = kvq__tq_taccum_avx2_3;
            c->k.taccum_run = kvq__tq_taccum_run_avx2_3;
            break;
        default:
            c->k.tscore = kvq__tq_tscore_avx2_4;
            c->k.taccum = kvq__tq_taccum_avx2_4;
            c->k.taccum_run = kvq__tq_taccum_run_avx2_4;
            break;
        }
        c->tqp_bytes = KVQ__TQ_TQ_QV(c->d) + 8 * c->d; /* tq_avx2.h */
        c->pf_tscore = 1;
    }
    c->k.encode = kvq__tq_encode_avx2;
    c->k.decode = kvq__tq_decode_avx2;
    c->k.prep = kvq__tq_prep_avx2;
    c->k.score = kvq__tq_score_avx2;
    c->k.accum = kvq__tq_accum_avx2;
    c->k.finish = kvq__tq_finish_avx2;
}
