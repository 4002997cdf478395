/*
 * matmul_avx512.c - AVX-512 weight-times-activations product (see matmul.c
 * and matmul_avx2.c, whose structure this follows with 16-lane vectors and
 * 32 registers). Tokens in groups of 6 use 4x6 tiles (24 accumulators, 4 rows,
 * 1 token piece); the rows stay in L1 while the tile sweeps a block of up to
 * 96 tokens in L2, and the next tile's rows are prefetched meanwhile. A
 * single token uses 8x1 tiles. The last piece of a row is a masked load.
 * This file is built with the AVX2 flags; its functions carry the AVX-512
 * target themselves and run only after kvq__cpu_has_avx512().
 */
#include "../kernels.h"
#include "simd_avx2.h"

#define KVQ__AVX512_TB 96 /* tokens per L2 block; a multiple of 6 */
#define KVQ__T512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))

/* Sum of the 16 lanes of a, b, c, d: lane i of the result = sum of the i-th. */
KVQ__T512 static inline __m128 kvq__hsum4x512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    return kvq__hsum4x256(a8, b8, c8, d8);
}

/* out[t*d + r] = W[r*n ..] . x[t*n ..] for r < R, t < T (constants at each
 * call: the loops unroll and acc stays in registers). */
KVQ__T512 static inline __attribute__((always_inline)) void
kvq__mm_tile16(float *out, const float *x, const float *W, size_t n, size_t d, const int R,
               const int T) {
    __m512 acc[8][6];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        if (T == 1) {
            __m512 xv = _mm512_loadu_ps(x + j);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(W + r * n + j), xv, acc[r][0]);
        } else {
            __m512 w[8];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                w[r] = _mm512_loadu_ps(W + r * n + j);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                __m512 xv = _mm512_loadu_ps(x + t * n + j);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
            }
        }
    }
    if (j < n) {
        __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);
        __m512 w[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            w[r] = _mm512_maskz_loadu_ps(m, W + r * n + j);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * n + j);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
        }
    }
    if (T == 1 && R % 4 == 0) {
#pragma GCC unroll 2
        for (int r = 0; r < R; r += 4)
            _mm_storeu_ps(out + r, kvq__hsum4x512(acc[r][0], acc[r + 1][0], acc[r + 2][0],
                                                  acc[r + 3][0]));
    } else if (R == 4) {
        /* four rows of one token side by side */
#pragma GCC unroll 6
        for (int t = 0; t < T; t++)
            _mm_storeu_ps(out + t * d, kvq__hsum4x512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
                out[t * d + r] = _mm512_reduce_add_ps(acc[r][t]);
    }
}

/* Every row of W times T (1..6) token vectors, T a constant. */
#define KVQ__ROWS512(T)                                                                            \
    for (; i + 4 <= d; i += 4)                                                                     \
        kvq__mm_tile16(out + i, x, W + i * n, n, d, 4, T);                                         \
    for (; i < d; i++)                                                                             \
        kvq__mm_tile16(out + i, x, W + i * n, n, d, 1, T);

KVQ__T512 static void kvq__mm_rows_avx512(float *out, const float *x, const float *W, size_t n,
                                          size_t d, size_t T) {
    size_t i = 0;
    switch (T) {
    case 1:
        for (; i + 8 <= d; i += 8)
            kvq__mm_tile16(out + i, x, W + i * n, n, d, 8, 1);
        for (; i < d; i++)
            kvq__mm_tile16(out + i, x, W + i * n, n, d, 1, 1);
        break;
    case 2:
        KVQ__ROWS512(2)
        break;
    case 3:
        KVQ__ROWS512(3)
        break;
    case 4:
        KVQ__ROWS512(4)
        break;
    case 5:
        KVQ__ROWS512(5)
        break;
    }
}

KVQ__T512 void kvq__matmul_avx512(float *out, const float *x, const float *W, size_t n, size_t d,
                                  size_t nt) {
    for (size_t t0 = 0; t0 < nt; t0 += KVQ__AVX512_TB) {
        size_t tb = nt - t0 < KVQ__AVX512_TB ? nt - t0 : KVQ__AVX512_TB;
        size_t t6 = tb - tb % 6;
        const float *xb = x + t0 * n;
        float *ob = out + t0 * d;
        if (t6) {
            size_t i = 0;
            for (; i + 4 <= d; i += 4) {
                /* the next tile's rows, while this one sweeps the block */
                if (i + 8 <= d)
                    for (size_t b = 0; b < 16 * n; b += 64)
                        _mm_prefetch((const char *)(W + (i + 4) * n) + b, _MM_HINT_T0);
                for (size_t t = 0; t < t6; t += 6)
                    kvq__mm_tile16(ob + t * d + i, xb + t * n, W + i * n, n, d, 4, 6);
            }
            for (; i < d; i++)
                for (size_t t = 0; t < t6; t += 6)
                    kvq__mm_tile16(ob + t * d + i, xb + t * n, W + i * n, n, d, 1, 6);
        }
        if (tb > t6)
            kvq__mm_rows_avx512(ob + t6 * d, xb + t6 * n, W, n, d, tb - t6);
    }
}
