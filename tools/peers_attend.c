/*
 * peers_attend.c - the attention baselines of `kvq bench attend` (see
 * peers.h): a dense f32 attention and llama.cpp's CPU path over q8_0 / q4_0
 * blocks, each with a portable C version and AVX2 / AVX-512 kernels chosen
 * at run time through target attributes (the tool is built without ISA
 * flags). Written from public descriptions of the algorithms and formats.
 *
 * dense:f32, per KV head h with G query heads (padded to Gp, a multiple of
 * 4, with zero queries):
 *   pass 1  s[g][t] = <q_g, k_t> for all t: blocks of 4 keys x 4 queries,
 *           16 accumulators (AVX-512; AVX2: 2 keys x 4 queries), reduced
 *           to 16 (8) scores by one transpose-add, so no horizontal sum per
 *           key; every key load serves all the queries of the group; the
 *           keys KVQA_PF tokens ahead are prefetched;
 *   softmax p = exp((s - max) / sqrt(d)) with a vectorized exp
 *           (Cody-Waite reduction, degree-6 polynomial, |rel err| < 2e-7);
 *   pass 2  o_g = sum_t p[g][t] v_t / sum_t p[g][t]: tiles of 32 tokens;
 *           AVX-512 (d % 128 == 0): 2 queries x 128 columns in 16 register
 *           accumulators, so V is read row after row; the next pair re-reads
 *           the tile from L1. AVX2: 4 queries x 16 columns.
 * llama.cpp:qN_0, per query head (ggml's flash-attention loop for one row):
 *   Q_q = quantize_row_q8_0(q); M = -inf; S = 0; VKQ = 0
 *   for each key t: s = vec_dot(K_t, Q_q) / sqrt(d)
 *       if s > M: ms = exp(M - s), M = s, VKQ *= ms, vs = 1  else vs = exp(s - M)
 *       V32 = dequantize(V_t); VKQ += vs V32; S = S ms + vs
 *   out = VKQ / S
 */
#include "peers.h"

#include "kvq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVQA_X86 1
#endif

#define KVQA_QK 32
#define KVQA_Q8_BYTES 34
#define KVQA_Q4_BYTES 18
#define KVQA_TILE 32 /* tokens per pass-2 tile of dense:f32 */
/* Software prefetch distance of dense:f32, in tokens (16 KiB ahead at
 * d = 128): the 4 keys of a block are read chunk by chunk, 4 lines 512 B
 * apart at a time, an order the hardware prefetchers follow poorly (the
 * pass read 15 GB/s where a plain sum reads 45 on Zen 5); prefetching whole
 * rows ahead brings it to within 10% of the sum. */
#ifndef KVQA_PF
#define KVQA_PF 32
#endif
#define KVQA_MAX_THREADS 64

typedef float (*kvqa_dot_fn)(const uint8_t *x, const uint8_t *y, size_t nb);
typedef void (*kvqa_deq_fn)(const uint8_t *x, float *y, size_t nb);
typedef void (*kvqa_mad_fn)(float *y, const float *x, float v, size_t d);
typedef void (*kvqa_scale_fn)(float *y, float v, size_t d);

struct kvqp_att {
    kvqp_att_kind kind;
    size_t T, H, QH, G, Gp, d, ld, nb, rb;
    const float *K, *V; /* dense: [H][ld][d] */
    uint8_t *Kq, *Vq;   /* llama.cpp: [T][H][rb] */
    int path;           /* dense: 0 C, 1 AVX2, 2 AVX-512 */
    int q_avx2;         /* llama.cpp: quantize the query with the AVX2 kernel */
    kvqa_dot_fn dot;
    kvqa_deq_fn deq;
    kvqa_mad_fn mad;
    kvqa_scale_fn scale;
    char path_name[48];
    kvqb_pool *pool;
    int n_threads, n_max; /* the steps' threads; the threads it has scratch for */
    float *scratch[KVQA_MAX_THREADS];
    const float *q; /* the step's arguments */
    float *out;
};

const char *kvqp_att_name(kvqp_att_kind kind) {
    switch (kind) {
    case KVQP_DENSE_F32:
        return "dense:f32";
    case KVQP_LLAMA_Q8_0:
        return "llama.cpp:q8_0";
    case KVQP_LLAMA_Q4_0:
        return "llama.cpp:q4_0";
    }
    return NULL;
}

/* =================================================================== */
/* dense:f32                                                            */
/* =================================================================== */

/* ---- portable C ---- */
static void dn_scores_c(const float *K, size_t T, size_t d, const float *q, size_t Gp, float *s) {
    for (size_t t = 0; t < T; t++)
        for (size_t g = 0; g < Gp; g++) {
            float a = 0.0f;
            for (size_t c = 0; c < d; c++)
                a += q[g * d + c] * K[t * d + c];
            s[g * T + t] = a;
        }
}

static float dn_softmax_c(float *s, size_t T, float scale) {
    float m = -INFINITY, sum = 0.0f;
    for (size_t t = 0; t < T; t++)
        m = s[t] > m ? s[t] : m;
    for (size_t t = 0; t < T; t++) {
        s[t] = expf((s[t] - m) * scale);
        sum += s[t];
    }
    return sum;
}

static void dn_wsum_c(const float *V, size_t T, size_t d, const float *p, size_t Gp, float *o) {
    for (size_t t = 0; t < T; t++)
        for (size_t g = 0; g < Gp; g++) {
            float w = p[g * T + t];
            for (size_t c = 0; c < d; c++)
                o[g * d + c] += w * V[t * d + c];
        }
}

#ifdef KVQA_X86
#define TGT512 __attribute__((target("avx512f")))
#define TGT2 __attribute__((target("avx2,fma,f16c")))

/* ---- AVX-512 ---- */

/* e^x for x <= 0 (clamped at -87: e^-87 ~ 1.6e-38 stays normal). */
TGT512 static inline __m512 dn_exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Two vectors whose 128-bit lanes hold partial sums: x's lanes pair with y's
 * (see dn_reduce16). */
TGT512 static inline __m512 dn_pair_ps(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
}
TGT512 static inline __m512 dn_pair_pd(__m512 x, __m512 y) {
    __m512d a = _mm512_castps_pd(x), b = _mm512_castps_pd(y);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

/* The 16 horizontal sums of a0..a15, lane i = sum of a_i's 16 lanes:
 * unpack-add pairs (16 -> 8 -> 4 vectors, each 128-bit lane then holds
 * 4 partial sums of 4 consecutive a's), then a 4x4 transpose-add of the
 * 128-bit lanes. 45 instructions for 16 sums. */
TGT512 static inline __m512 dn_reduce16(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4,
                                        __m512 a5, __m512 a6, __m512 a7, __m512 a8, __m512 a9,
                                        __m512 a10, __m512 a11, __m512 a12, __m512 a13, __m512 a14,
                                        __m512 a15) {
    __m512 c0 = dn_pair_pd(dn_pair_ps(a0, a1), dn_pair_ps(a2, a3));
    __m512 c1 = dn_pair_pd(dn_pair_ps(a4, a5), dn_pair_ps(a6, a7));
    __m512 c2 = dn_pair_pd(dn_pair_ps(a8, a9), dn_pair_ps(a10, a11));
    __m512 c3 = dn_pair_pd(dn_pair_ps(a12, a13), dn_pair_ps(a14, a15));
    __m512 f0 = _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 f1 = _mm512_add_ps(_mm512_shuffle_f32x4(c2, c3, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(c2, c3, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Pass 1 (d % 16 == 0, Gp % 4 == 0): blocks of 4 keys x 4 queries. */
TGT512 static void dn_scores_512(const float *K, size_t T, size_t d, const float *q, size_t Gp,
                                 float *s) {
    size_t t = 0;
    for (; t + 4 <= T; t += 4) {
        const float *k0 = K + t * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
        /* the 4 keys KVQA_PF ahead (16d bytes): 256 bytes per step of c */
        const char *pf = (const char *)(K + (t + KVQA_PF + 4 <= T ? t + KVQA_PF : t) * d);
        for (size_t g = 0; g < Gp; g += 4) {
            const float *q0 = q + g * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
                   a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0,
                   a15 = a0;
            for (size_t c = 0; c < d; c += 16) {
                if (g == 0) {
                    _mm_prefetch(pf + c * 16, _MM_HINT_T0);
                    _mm_prefetch(pf + c * 16 + 64, _MM_HINT_T0);
                    _mm_prefetch(pf + c * 16 + 128, _MM_HINT_T0);
                    _mm_prefetch(pf + c * 16 + 192, _MM_HINT_T0);
                }
                __m512 x0 = _mm512_loadu_ps(k0 + c), x1 = _mm512_loadu_ps(k1 + c);
                __m512 x2 = _mm512_loadu_ps(k2 + c), x3 = _mm512_loadu_ps(k3 + c);
                __m512 y = _mm512_loadu_ps(q0 + c);
                a0 = _mm512_fmadd_ps(y, x0, a0);
                a1 = _mm512_fmadd_ps(y, x1, a1);
                a2 = _mm512_fmadd_ps(y, x2, a2);
                a3 = _mm512_fmadd_ps(y, x3, a3);
                y = _mm512_loadu_ps(q1 + c);
                a4 = _mm512_fmadd_ps(y, x0, a4);
                a5 = _mm512_fmadd_ps(y, x1, a5);
                a6 = _mm512_fmadd_ps(y, x2, a6);
                a7 = _mm512_fmadd_ps(y, x3, a7);
                y = _mm512_loadu_ps(q2 + c);
                a8 = _mm512_fmadd_ps(y, x0, a8);
                a9 = _mm512_fmadd_ps(y, x1, a9);
                a10 = _mm512_fmadd_ps(y, x2, a10);
                a11 = _mm512_fmadd_ps(y, x3, a11);
                y = _mm512_loadu_ps(q3 + c);
                a12 = _mm512_fmadd_ps(y, x0, a12);
                a13 = _mm512_fmadd_ps(y, x1, a13);
                a14 = _mm512_fmadd_ps(y, x2, a14);
                a15 = _mm512_fmadd_ps(y, x3, a15);
            }
            /* lane 4i+j: query g+i, key t+j */
            __m512 r =
                dn_reduce16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
            _mm_storeu_ps(s + (g + 0) * T + t, _mm512_extractf32x4_ps(r, 0));
            _mm_storeu_ps(s + (g + 1) * T + t, _mm512_extractf32x4_ps(r, 1));
            _mm_storeu_ps(s + (g + 2) * T + t, _mm512_extractf32x4_ps(r, 2));
            _mm_storeu_ps(s + (g + 3) * T + t, _mm512_extractf32x4_ps(r, 3));
        }
    }
    for (; t < T; t++)
        for (size_t g = 0; g < Gp; g++) {
            __m512 a = _mm512_setzero_ps();
            for (size_t c = 0; c < d; c += 16)
                a = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + c), _mm512_loadu_ps(K + t * d + c),
                                    a);
            s[g * T + t] = _mm512_reduce_add_ps(a);
        }
}

TGT512 static float dn_softmax_512(float *s, size_t T, float scale) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    size_t t = 0;
    for (; t + 16 <= T; t += 16)
        vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + t));
    float m = _mm512_reduce_max_ps(vm);
    for (size_t u = t; u < T; u++)
        m = s[u] > m ? s[u] : m;
    __m512 sub = _mm512_set1_ps(m), mul = _mm512_set1_ps(scale), sum = _mm512_setzero_ps();
    for (t = 0; t + 16 <= T; t += 16) {
        __m512 p = dn_exp512(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t), sub), mul));
        _mm512_storeu_ps(s + t, p);
        sum = _mm512_add_ps(sum, p);
    }
    float tot = _mm512_reduce_add_ps(sum);
    for (; t < T; t++) {
        s[t] = expf((s[t] - m) * scale);
        tot += s[t];
    }
    return tot;
}

/* Pass 2 (d % 128 == 0, Gp even): tiles of KVQA_TILE tokens; per tile,
 * pairs of queries x 128 columns in 16 accumulators. */
TGT512 static void dn_wsum_512(const float *V, size_t T, size_t d, const float *p, size_t Gp,
                               float *o) {
    for (size_t t0 = 0; t0 < T; t0 += KVQA_TILE) {
        size_t t1 = t0 + KVQA_TILE < T ? t0 + KVQA_TILE : T;
        for (size_t c = 0; c < d; c += 128)
            for (size_t g = 0; g < Gp; g += 2) {
                float *oa = o + g * d + c, *ob = oa + d;
                const float *pa = p + g * T, *pb = pa + T;
                __m512 a0 = _mm512_loadu_ps(oa), a1 = _mm512_loadu_ps(oa + 16);
                __m512 a2 = _mm512_loadu_ps(oa + 32), a3 = _mm512_loadu_ps(oa + 48);
                __m512 a4 = _mm512_loadu_ps(oa + 64), a5 = _mm512_loadu_ps(oa + 80);
                __m512 a6 = _mm512_loadu_ps(oa + 96), a7 = _mm512_loadu_ps(oa + 112);
                __m512 b0 = _mm512_loadu_ps(ob), b1 = _mm512_loadu_ps(ob + 16);
                __m512 b2 = _mm512_loadu_ps(ob + 32), b3 = _mm512_loadu_ps(ob + 48);
                __m512 b4 = _mm512_loadu_ps(ob + 64), b5 = _mm512_loadu_ps(ob + 80);
                __m512 b6 = _mm512_loadu_ps(ob + 96), b7 = _mm512_loadu_ps(ob + 112);
                for (size_t t = t0; t < t1; t++) {
                    const float *v = V + t * d + c;
                    if (g == 0 && t + KVQA_PF < T) /* the row KVQA_PF ahead */
                        for (size_t j = 0; j < 128; j += 16)
                            _mm_prefetch((const char *)(v + KVQA_PF * d + j), _MM_HINT_T0);
                    __m512 wa = _mm512_set1_ps(pa[t]), wb = _mm512_set1_ps(pb[t]), x;
                    x = _mm512_loadu_ps(v);
                    a0 = _mm512_fmadd_ps(wa, x, a0);
                    b0 = _mm512_fmadd_ps(wb, x, b0);
                    x = _mm512_loadu_ps(v + 16);
                    a1 = _mm512_fmadd_ps(wa, x, a1);
                    b1 = _mm512_fmadd_ps(wb, x, b1);
                    x = _mm512_loadu_ps(v + 32);
                    a2 = _mm512_fmadd_ps(wa, x, a2);
                    b2 = _mm512_fmadd_ps(wb, x, b2);
                    x = _mm512_loadu_ps(v + 48);
                    a3 = _mm512_fmadd_ps(wa, x, a3);
                    b3 = _mm512_fmadd_ps(wb, x, b3);
                    x = _mm512_loadu_ps(v + 64);
                    a4 = _mm512_fmadd_ps(wa, x, a4);
                    b4 = _mm512_fmadd_ps(wb, x, b4);
                    x = _mm512_loadu_ps(v + 80);
                    a5 = _mm512_fmadd_ps(wa, x, a5);
                    b5 = _mm512_fmadd_ps(wb, x, b5);
                    x = _mm512_loadu_ps(v + 96);
                    a6 = _mm512_fmadd_ps(wa, x, a6);
                    b6 = _mm512_fmadd_ps(wb, x, b6);
                    x = _mm512_loadu_ps(v + 112);
                    a7 = _mm512_fmadd_ps(wa, x, a7);
                    b7 = _mm512_fmadd_ps(wb, x, b7);
                }
                _mm512_storeu_ps(oa, a0), _mm512_storeu_ps(oa + 16, a1);
                _mm512_storeu_ps(oa + 32, a2), _mm512_storeu_ps(oa + 48, a3);
                _mm512_storeu_ps(oa + 64, a4), _mm512_storeu_ps(oa + 80, a5);
                _mm512_storeu_ps(oa + 96, a6), _mm512_storeu_ps(oa + 112, a7);
                _mm512_storeu_ps(ob, b0), _mm512_storeu_ps(ob + 16, b1);
                _mm512_storeu_ps(ob + 32, b2), _mm512_storeu_ps(ob + 48, b3);
                _mm512_storeu_ps(ob + 64, b4), _mm512_storeu_ps(ob + 80, b5);
                _mm512_storeu_ps(ob + 96, b6), _mm512_storeu_ps(ob + 112, b7);
            }
    }
}

/* ---- AVX2 ---- */

/* e^x for x <= 0, as dn_exp512; 2^n built in the exponent field (n >= -126). */
TGT2 static inline __m256 dn_exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

TGT2 static inline float dn_hsum256(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Pass 1 (d % 8 == 0, Gp % 4 == 0): blocks of 2 keys x 4 queries; the 8
 * sums come out of one hadd tree (lane 2i+j: query g+i, key t+j). */
TGT2 static void dn_scores_256(const float *K, size_t T, size_t d, const float *q, size_t Gp,
                               float *s) {
    size_t t = 0;
    for (; t + 2 <= T; t += 2) {
        const float *k0 = K + t * d, *k1 = k0 + d;
        /* the 2 keys KVQA_PF ahead (8d bytes): 64 bytes per step of c */
        const char *pf = (const char *)(K + (t + KVQA_PF + 2 <= T ? t + KVQA_PF : t) * d);
        for (size_t g = 0; g < Gp; g += 4) {
            const float *q0 = q + g * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
                   a7 = a0;
            for (size_t c = 0; c < d; c += 8) {
                if (g == 0)
                    _mm_prefetch(pf + c * 8, _MM_HINT_T0);
                __m256 x0 = _mm256_loadu_ps(k0 + c), x1 = _mm256_loadu_ps(k1 + c), y;
                y = _mm256_loadu_ps(q0 + c);
                a0 = _mm256_fmadd_ps(y, x0, a0);
                a1 = _mm256_fmadd_ps(y, x1, a1);
                y = _mm256_loadu_ps(q1 + c);
                a2 = _mm256_fmadd_ps(y, x0, a2);
                a3 = _mm256_fmadd_ps(y, x1, a3);
                y = _mm256_loadu_ps(q2 + c);
                a4 = _mm256_fmadd_ps(y, x0, a4);
                a5 = _mm256_fmadd_ps(y, x1, a5);
                y = _mm256_loadu_ps(q3 + c);
                a6 = _mm256_fmadd_ps(y, x0, a6);
                a7 = _mm256_fmadd_ps(y, x1, a7);
            }
            __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
            __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                     _mm256_permute2f128_ps(h0, h1, 0x31));
            float tmp[8];
            _mm256_storeu_ps(tmp, r);
            for (int i = 0; i < 4; i++) {
                s[(g + (size_t)i) * T + t] = tmp[2 * i];
                s[(g + (size_t)i) * T + t + 1] = tmp[2 * i + 1];
            }
        }
    }
    for (; t < T; t++)
        for (size_t g = 0; g < Gp; g++) {
            __m256 a = _mm256_setzero_ps();
            for (size_t c = 0; c < d; c += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), _mm256_loadu_ps(K + t * d + c),
                                    a);
            s[g * T + t] = dn_hsum256(a);
        }
}

TGT2 static float dn_softmax_256(float *s, size_t T, float scale) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    size_t t = 0;
    for (; t + 8 <= T; t += 8)
        vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + t));
    float mm[8], m = -INFINITY;
    _mm256_storeu_ps(mm, vm);
    for (int i = 0; i < 8; i++)
        m = mm[i] > m ? mm[i] : m;
    for (size_t u = t; u < T; u++)
        m = s[u] > m ? s[u] : m;
    __m256 sub = _mm256_set1_ps(m), mul = _mm256_set1_ps(scale), sum = _mm256_setzero_ps();
    for (t = 0; t + 8 <= T; t += 8) {
        __m256 p = dn_exp256(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), sub), mul));
        _mm256_storeu_ps(s + t, p);
        sum = _mm256_add_ps(sum, p);
    }
    float tot = dn_hsum256(sum);
    for (; t < T; t++) {
        s[t] = expf((s[t] - m) * scale);
        tot += s[t];
    }
    return tot;
}

/* Pass 2 (d % 16 == 0, Gp % 4 == 0): tiles of KVQA_TILE tokens, 4 queries x
 * 16 columns in 8 accumulators. */
TGT2 static void dn_wsum_256(const float *V, size_t T, size_t d, const float *p, size_t Gp,
                             float *o) {
    for (size_t t0 = 0; t0 < T; t0 += KVQA_TILE) {
        size_t t1 = t0 + KVQA_TILE < T ? t0 + KVQA_TILE : T;
        for (size_t g = 0; g < Gp; g += 4) {
            const float *p0 = p + g * T, *p1 = p0 + T, *p2 = p1 + T, *p3 = p2 + T;
            for (size_t c = 0; c < d; c += 16) {
                float *o0 = o + g * d + c, *o1 = o0 + d, *o2 = o1 + d, *o3 = o2 + d;
                __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o0 + 8);
                __m256 a2 = _mm256_loadu_ps(o1), a3 = _mm256_loadu_ps(o1 + 8);
                __m256 a4 = _mm256_loadu_ps(o2), a5 = _mm256_loadu_ps(o2 + 8);
                __m256 a6 = _mm256_loadu_ps(o3), a7 = _mm256_loadu_ps(o3 + 8);
                for (size_t t = t0; t < t1; t++) {
                    if (g == 0 && c == 0 && t + KVQA_PF < T) /* the row KVQA_PF ahead */
                        for (size_t j = 0; j < d; j += 16)
                            _mm_prefetch((const char *)(V + (t + KVQA_PF) * d + j), _MM_HINT_T0);
                    __m256 x0 = _mm256_loadu_ps(V + t * d + c),
                           x1 = _mm256_loadu_ps(V + t * d + c + 8);
                    __m256 w = _mm256_broadcast_ss(p0 + t);
                    a0 = _mm256_fmadd_ps(w, x0, a0);
                    a1 = _mm256_fmadd_ps(w, x1, a1);
                    w = _mm256_broadcast_ss(p1 + t);
                    a2 = _mm256_fmadd_ps(w, x0, a2);
                    a3 = _mm256_fmadd_ps(w, x1, a3);
                    w = _mm256_broadcast_ss(p2 + t);
                    a4 = _mm256_fmadd_ps(w, x0, a4);
                    a5 = _mm256_fmadd_ps(w, x1, a5);
                    w = _mm256_broadcast_ss(p3 + t);
                    a6 = _mm256_fmadd_ps(w, x0, a6);
                    a7 = _mm256_fmadd_ps(w, x1, a7);
                }
                _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o0 + 8, a1);
                _mm256_storeu_ps(o1, a2), _mm256_storeu_ps(o1 + 8, a3);
                _mm256_storeu_ps(o2, a4), _mm256_storeu_ps(o2 + 8, a5);
                _mm256_storeu_ps(o3, a6), _mm256_storeu_ps(o3 + 8, a7);
            }
        }
    }
}
#endif /* KVQA_X86 */

/* One KV head: queries q [G][d] -> out [G][d]; scratch holds Gp*T scores
 * and 2*Gp*d floats (padded queries and outputs). */
static void dn_head(const kvqp_att *a, size_t h, const float *q, float *out, float *scratch) {
    const size_t T = a->T, d = a->d, G = a->G, Gp = a->Gp;
    const float *K = a->K + h * a->ld * d, *V = a->V + h * a->ld * d;
    float *s = scratch, *qp = s + Gp * T, *op = qp + Gp * d;
    memcpy(qp, q, G * d * sizeof(float));
    memset(qp + G * d, 0, (Gp - G) * d * sizeof(float));
    memset(op, 0, Gp * d * sizeof(float));
    const float scale = 1.0f / sqrtf((float)d);
    float sum[64];
    switch (a->path) {
#ifdef KVQA_X86
    case 2:
        dn_scores_512(K, T, d, qp, Gp, s);
        for (size_t g = 0; g < G; g++)
            sum[g] = dn_softmax_512(s + g * T, T, scale);
        dn_wsum_512(V, T, d, s, Gp, op);
        break;
    case 1:
        dn_scores_256(K, T, d, qp, Gp, s);
        for (size_t g = 0; g < G; g++)
            sum[g] = dn_softmax_256(s + g * T, T, scale);
        dn_wsum_256(V, T, d, s, Gp, op);
        break;
#endif
    default:
        dn_scores_c(K, T, d, qp, Gp, s);
        for (size_t g = 0; g < G; g++)
            sum[g] = dn_softmax_c(s + g * T, T, scale);
        dn_wsum_c(V, T, d, s, Gp, op);
    }
    /* the padded queries' weights were not normalised; their rows are dropped */
    for (size_t g = 0; g < G; g++) {
        float inv = 1.0f / sum[g];
        for (size_t c = 0; c < d; c++)
            out[g * d + c] = op[g * d + c] * inv;
    }
}

static void dn_part(void *arg, int i, int n) {
    kvqp_att *a = (kvqp_att *)arg;
    for (size_t h = (size_t)i; h < a->H; h += (size_t)n)
        dn_head(a, h, a->q + h * a->G * a->d, a->out + h * a->G * a->d, a->scratch[i]);
}

/* =================================================================== */
/* llama.cpp: q8_0 / q4_0                                               */
/* =================================================================== */

static float ll_dot_q8_c(const uint8_t *x, const uint8_t *y, size_t nb) {
    float s = 0.0f;
    for (size_t b = 0; b < nb; b++, x += KVQA_Q8_BYTES, y += KVQA_Q8_BYTES) {
        uint16_t hx, hy;
        memcpy(&hx, x, 2);
        memcpy(&hy, y, 2);
        int acc = 0;
        for (int j = 0; j < KVQA_QK; j++)
            acc += (int8_t)x[2 + j] * (int8_t)y[2 + j];
        s += (float)acc * (kvq_f16_to_f32(hx) * kvq_f16_to_f32(hy));
    }
    return s;
}

static float ll_dot_q4_c(const uint8_t *x, const uint8_t *y, size_t nb) {
    float s = 0.0f;
    for (size_t b = 0; b < nb; b++, x += KVQA_Q4_BYTES, y += KVQA_Q8_BYTES) {
        uint16_t hx, hy;
        memcpy(&hx, x, 2);
        memcpy(&hy, y, 2);
        int acc = 0;
        for (int j = 0; j < KVQA_QK / 2; j++) {
            acc += ((x[2 + j] & 15) - 8) * (int8_t)y[2 + j];
            acc += ((x[2 + j] >> 4) - 8) * (int8_t)y[2 + 16 + j];
        }
        s += (float)acc * (kvq_f16_to_f32(hx) * kvq_f16_to_f32(hy));
    }
    return s;
}

static void ll_deq_q8_c(const uint8_t *x, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += KVQA_Q8_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        float d = kvq_f16_to_f32(h);
        for (int j = 0; j < KVQA_QK; j++)
            y[j] = (float)(int8_t)x[2 + j] * d;
    }
}

static void ll_deq_q4_c(const uint8_t *x, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += KVQA_Q4_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        float d = kvq_f16_to_f32(h);
        for (int j = 0; j < KVQA_QK / 2; j++) {
            y[j] = (float)((x[2 + j] & 15) - 8) * d;
            y[j + 16] = (float)((x[2 + j] >> 4) - 8) * d;
        }
    }
}

static void ll_mad_c(float *y, const float *x, float v, size_t d) {
    for (size_t i = 0; i < d; i++)
        y[i] += x[i] * v;
}

static void ll_scale_c(float *y, float v, size_t d) {
    for (size_t i = 0; i < d; i++)
        y[i] *= v;
}

#ifdef KVQA_X86
#define TGTVNNI __attribute__((target("avx2,fma,f16c,avx512vl,avx512vnni")))

/* sum of the int8 products x_j y_j, 4 at a time into 8 int32 lanes, as
 * floats: |x| times y with x's sign (maddubs takes unsigned x signed). */
#define LL_MULSUM_AVX2(x, y)                                                                       \
    _mm256_cvtepi32_ps(                                                                            \
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),    \
                          _mm256_set1_epi16(1)))
#define LL_MULSUM_VNNI(x, y)                                                                       \
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x),         \
                                           _mm256_sign_epi8(y, x)))
/* 32 nibbles: low nibbles are values 0..15, high nibbles 16..31; minus 8 */
#define LL_Q4_BYTES(p)                                                                             \
    _mm256_sub_epi8(_mm256_and_si256(                                                              \
                        _mm256_set_m128i(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(p)), 4), \
                                         _mm_loadu_si128((const __m128i *)(p))),                   \
                        _mm256_set1_epi8(15)),                                                     \
                    _mm256_set1_epi8(8))

/* q_x . q_y over nb blocks (x: q8_0 or q4_0 rows, y: the q8_0 query), as
 * ggml's vec_dot: per block d_x d_y times the int32 sum, FMA into 8 lanes. */
#define LL_DOT_FN(NAME, TGT, XB, LOADX, MULSUM)                                                    \
    TGT static float NAME(const uint8_t *x, const uint8_t *y, size_t nb) {                         \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (size_t b = 0; b < nb; b++, x += XB, y += KVQA_Q8_BYTES) {                             \
            uint16_t hx, hy;                                                                       \
            memcpy(&hx, x, 2);                                                                     \
            memcpy(&hy, y, 2);                                                                     \
            __m256 dd = _mm256_set1_ps(_cvtsh_ss(hx) * _cvtsh_ss(hy));                             \
            __m256i qx = LOADX(x + 2);                                                             \
            __m256i qy = _mm256_loadu_si256((const __m256i *)(const void *)(y + 2));               \
            acc = _mm256_fmadd_ps(dd, MULSUM(qx, qy), acc);                                        \
        }                                                                                          \
        return dn_hsum256(acc);                                                                    \
    }

#define LL_LOAD8(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

LL_DOT_FN(ll_dot_q8_avx2, TGT2, KVQA_Q8_BYTES, LL_LOAD8, LL_MULSUM_AVX2)
LL_DOT_FN(ll_dot_q4_avx2, TGT2, KVQA_Q4_BYTES, LL_Q4_BYTES, LL_MULSUM_AVX2)
LL_DOT_FN(ll_dot_q8_vnni, TGTVNNI, KVQA_Q8_BYTES, LL_LOAD8, LL_MULSUM_VNNI)
LL_DOT_FN(ll_dot_q4_vnni, TGTVNNI, KVQA_Q4_BYTES, LL_Q4_BYTES, LL_MULSUM_VNNI)

TGT2 static void ll_deq_q8_avx2(const uint8_t *x, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += KVQA_Q8_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        for (int j = 0; j < KVQA_QK; j += 8) {
            __m256i v =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(x + 2 + j)));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
        }
    }
}

TGT2 static void ll_deq_q4_avx2(const uint8_t *x, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += KVQA_Q4_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        __m256i q = LL_Q4_BYTES(x + 2); /* values 0..31 in order, minus 8 */
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
        _mm256_storeu_ps(
            y + 8,
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
        _mm256_storeu_ps(
            y + 24,
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
    }
}

TGT2 static void ll_mad_avx2(float *y, const float *x, float v, size_t d) {
    __m256 w = _mm256_set1_ps(v);
    for (size_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), w, _mm256_loadu_ps(y + i)));
}

TGT2 static void ll_scale_avx2(float *y, float v, size_t d) {
    __m256 w = _mm256_set1_ps(v);
    for (size_t i = 0; i < d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), w));
}

TGT512 static void ll_deq_q8_512(const uint8_t *x, float *y, size_t nb) {
    for (size_t b = 0; b < nb; b++, x += KVQA_Q8_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        __m512 d = _mm512_set1_ps(kvq_f16_to_f32(h));
        __m512i v0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(x + 2)));
        __m512i v1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(x + 18)));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(v0), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(v1), d));
    }
}

TGT512 static void ll_deq_q4_512(const uint8_t *x, float *y, size_t nb) {
    const __m128i m = _mm_set1_epi8(15);
    for (size_t b = 0; b < nb; b++, x += KVQA_Q4_BYTES, y += KVQA_QK) {
        uint16_t h;
        memcpy(&h, x, 2);
        __m512 d = _mm512_set1_ps(kvq_f16_to_f32(h));
        __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)(x + 2));
        __m512i lo =
            _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(raw, m)), _mm512_set1_epi32(8));
        __m512i hi = _mm512_sub_epi32(
            _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), m)), _mm512_set1_epi32(8));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d));
    }
}

TGT512 static void ll_mad_512(float *y, const float *x, float v, size_t d) {
    __m512 w = _mm512_set1_ps(v);
    for (size_t i = 0; i < d; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), w, _mm512_loadu_ps(y + i)));
}

TGT512 static void ll_scale_512(float *y, float v, size_t d) {
    __m512 w = _mm512_set1_ps(v);
    for (size_t i = 0; i < d; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), w));
}
#endif /* KVQA_X86 */

/* One query head: ggml's flash-attention loop over one row. scratch: d
 * floats V32, d floats VKQ, then the q8_0 query. */
static void ll_head(const kvqp_att *a, size_t iq, const float *q, float *out, float *scratch) {
    const size_t d = a->d, nb = a->nb, rb = a->rb, H = a->H, h = iq / a->G;
    float *v32 = scratch, *vkq = scratch + d;
    uint8_t *qq = (uint8_t *)(vkq + d);
    kvqp_quantize_q8_0(qq, q, nb, a->q_avx2);
    memset(vkq, 0, d * sizeof(float));
    const float scale = 1.0f / sqrtf((float)d);
    float M = -INFINITY, S = 0.0f;
    for (size_t t = 0; t < a->T; t++) {
        const uint8_t *k = a->Kq + (t * H + h) * rb, *v = a->Vq + (t * H + h) * rb;
        float s = a->dot(k, qq, nb) * scale;
        float ms = 1.0f, vs = 1.0f;
        const float Mold = M;
        if (s > M) {
            M = s;
            ms = expf(Mold - M);
            a->scale(vkq, ms, d);
        } else {
            vs = expf(s - M);
        }
        a->deq(v, v32, nb);
        a->mad(vkq, v32, vs, d);
        S = S * ms + vs;
    }
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (size_t c = 0; c < d; c++)
        out[c] = vkq[c] * inv;
}

static void ll_part(void *arg, int i, int n) {
    kvqp_att *a = (kvqp_att *)arg;
    size_t lo = a->QH * (size_t)i / (size_t)n, hi = a->QH * (size_t)(i + 1) / (size_t)n;
    for (size_t iq = lo; iq < hi; iq++)
        ll_head(a, iq, a->q + iq * a->d, a->out + iq * a->d, a->scratch[i]);
}

/* =================================================================== */
/* the handle                                                           */
/* =================================================================== */

void kvqp_att_free(kvqp_att *a) {
    if (!a)
        return;
    for (int i = 0; i < KVQA_MAX_THREADS; i++)
        free(a->scratch[i]);
    free(a->Kq);
    free(a->Vq);
    free(a);
}

static void *kvqa_alloc(size_t bytes) {
    size_t n = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n ? n : 64);
}

int kvqp_att_create(kvqp_att **out, kvqp_att_kind kind, const float *K, const float *V, size_t ld,
                    size_t T, size_t H, size_t QH, size_t d, kvqb_simd simd, kvqb_pool *pool,
                    int n_threads) {
    *out = NULL;
    if (!kvqp_att_name(kind) || !H || !QH || QH % H || !d || !T || ld < T || n_threads < 1 ||
        n_threads > KVQA_MAX_THREADS || n_threads > kvqb_pool_size(pool) || QH / H > 64)
        return -2;
    if (kind != KVQP_DENSE_F32 && d % KVQA_QK)
        return -2;
    kvqp_att *a = (kvqp_att *)calloc(1, sizeof *a);
    if (!a)
        return -1;
    a->kind = kind;
    a->T = T, a->H = H, a->QH = QH, a->G = QH / H, a->Gp = (QH / H + 3) / 4 * 4, a->d = d,
    a->ld = ld;
    a->pool = pool;
    a->n_threads = n_threads;
#ifndef KVQA_X86
    simd = KVQB_SIMD_SCALAR;
#endif
    size_t scratch_floats;
    if (kind == KVQP_DENSE_F32) {
        a->K = K, a->V = V;
        a->path = simd == KVQB_SIMD_AVX512 && d % 128 == 0 ? 2
                  : simd >= KVQB_SIMD_AVX2 && d % 16 == 0  ? 1
                                                           : 0;
        snprintf(a->path_name, sizeof a->path_name, "%s",
                 a->path == 2   ? "avx512"
                 : a->path == 1 ? "avx2"
                                : "scalar");
        scratch_floats = a->Gp * T + 2 * a->Gp * d;
    } else {
        const int q4 = kind == KVQP_LLAMA_Q4_0;
        a->nb = d / KVQA_QK;
        a->rb = a->nb * (q4 ? KVQA_Q4_BYTES : KVQA_Q8_BYTES);
        a->Kq = (uint8_t *)kvqa_alloc(T * H * a->rb);
        a->Vq = (uint8_t *)kvqa_alloc(T * H * a->rb);
        if (!a->Kq || !a->Vq) {
            kvqp_att_free(a);
            return -1;
        }
        const int avx2 = simd >= KVQB_SIMD_AVX2;
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < H; h++) {
                const float *k = K + (h * ld + t) * d, *v = V + (h * ld + t) * d;
                uint8_t *kd = a->Kq + (t * H + h) * a->rb, *vd = a->Vq + (t * H + h) * a->rb;
                if (q4) {
                    kvqp_quantize_q4_0(kd, k, a->nb, avx2);
                    kvqp_quantize_q4_0(vd, v, a->nb, avx2);
                } else {
                    kvqp_quantize_q8_0(kd, k, a->nb, avx2);
                    kvqp_quantize_q8_0(vd, v, a->nb, avx2);
                }
            }
        a->q_avx2 = avx2;
        a->dot = q4 ? ll_dot_q4_c : ll_dot_q8_c;
        a->deq = q4 ? ll_deq_q4_c : ll_deq_q8_c;
        a->mad = ll_mad_c;
        a->scale = ll_scale_c;
        const char *dot = "scalar", *vec = "scalar";
#ifdef KVQA_X86
        if (simd >= KVQB_SIMD_AVX2) {
            int vnni = kvqb_has_vnni();
            a->dot = q4 ? (vnni ? ll_dot_q4_vnni : ll_dot_q4_avx2)
                        : (vnni ? ll_dot_q8_vnni : ll_dot_q8_avx2);
            a->deq = q4 ? ll_deq_q4_avx2 : ll_deq_q8_avx2;
            a->mad = ll_mad_avx2;
            a->scale = ll_scale_avx2;
            dot = vnni ? "avx2+vnni" : "avx2";
            vec = "avx2";
        }
        if (simd == KVQB_SIMD_AVX512) {
            a->deq = q4 ? ll_deq_q4_512 : ll_deq_q8_512;
            a->mad = ll_mad_512;
            a->scale = ll_scale_512;
            vec = "avx512";
        }
#endif
        snprintf(a->path_name, sizeof a->path_name, "dot %s, V %s", dot, vec);
        scratch_floats = 2 * d + (a->nb * KVQA_Q8_BYTES + 3) / 4;
    }
    for (int i = 0; i < n_threads; i++)
        if (!(a->scratch[i] = (float *)kvqa_alloc(scratch_floats * sizeof(float)))) {
            kvqp_att_free(a);
            return -1;
        }
    a->n_max = n_threads;
    *out = a;
    return 0;
}

int kvqp_att_set_threads(kvqp_att *a, int n_threads) {
    if (n_threads < 1 || n_threads > a->n_max)
        return -2;
    a->n_threads = n_threads;
    return 0;
}

uint64_t kvqp_att_bytes(const kvqp_att *a) {
    if (a->kind == KVQP_DENSE_F32)
        return 2ull * a->T * a->H * a->d * sizeof(float);
    return 2ull * a->T * a->H * a->rb;
}

const char *kvqp_att_path(const kvqp_att *a) { return a->path_name; }

void kvqp_att_step(kvqp_att *a, const float *q, float *out) {
    a->q = q;
    a->out = out;
    kvqb_pool_run(a->pool, a->n_threads, a->kind == KVQP_DENSE_F32 ? dn_part : ll_part, a);
}

double kvqp_att_check(const kvqp_att *a, const float *q, const float *out) {
    const size_t d = a->d, T = a->T;
    double worst = 0.0;
    double *sc = (double *)malloc(T * sizeof(double)), *o = (double *)malloc(d * sizeof(double));
    float *kx = (float *)malloc(d * sizeof(float)), *vx = (float *)malloc(d * sizeof(float));
    float *qx = (float *)malloc(d * sizeof(float));
    uint8_t *qq = (uint8_t *)malloc(d / KVQA_QK * KVQA_Q8_BYTES + KVQA_Q8_BYTES);
    if (!sc || !o || !kx || !vx || !qx || !qq) {
        worst = INFINITY;
        goto done;
    }
    const size_t heads[3] = {0, a->QH / 2 + (a->QH > 2), a->QH - 1};
    for (int k = 0; k < 3; k++) {
        const size_t iq = heads[k], h = iq / a->G;
        const float *qi = q + iq * d;
        if (a->kind == KVQP_DENSE_F32)
            memcpy(qx, qi, d * sizeof(float));
        else {
            kvqp_quantize_q8_0(qq, qi, a->nb, a->q_avx2); /* as the step does */
            ll_deq_q8_c(qq, qx, a->nb);
        }
        double m = -INFINITY;
        for (size_t t = 0; t < T; t++) {
            const float *kr = kx;
            if (a->kind == KVQP_DENSE_F32)
                kr = a->K + (h * a->ld + t) * d;
            else if (a->kind == KVQP_LLAMA_Q8_0)
                ll_deq_q8_c(a->Kq + (t * a->H + h) * a->rb, kx, a->nb);
            else
                ll_deq_q4_c(a->Kq + (t * a->H + h) * a->rb, kx, a->nb);
            double s = 0;
            for (size_t c = 0; c < d; c++)
                s += (double)qx[c] * kr[c];
            sc[t] = s / sqrt((double)d);
            m = sc[t] > m ? sc[t] : m;
        }
        double sum = 0;
        memset(o, 0, d * sizeof(double));
        for (size_t t = 0; t < T; t++) {
            double p = exp(sc[t] - m);
            sum += p;
            const float *vr = vx;
            if (a->kind == KVQP_DENSE_F32)
                vr = a->V + (h * a->ld + t) * d;
            else if (a->kind == KVQP_LLAMA_Q8_0)
                ll_deq_q8_c(a->Vq + (t * a->H + h) * a->rb, vx, a->nb);
            else
                ll_deq_q4_c(a->Vq + (t * a->H + h) * a->rb, vx, a->nb);
            for (size_t c = 0; c < d; c++)
                o[c] += p * vr[c];
        }
        double num = 0, den = 0;
        for (size_t c = 0; c < d; c++) {
            double r = o[c] / sum, e = (double)out[iq * d + c] - r;
            num += e * e;
            den += r * r;
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (!(rel <= worst))
            worst = rel;
    }
done:
    free(sc);
    free(o);
    free(kx);
    free(vx);
    free(qx);
    free(qq);
    return worst;
}
