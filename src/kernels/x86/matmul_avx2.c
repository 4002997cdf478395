/*
 * matmul_avx2.c - AVX2+FMA weight-times-activations product (see matmul.c).
 *
 * A tile of R rows of W by T token vectors keeps R*T accumulators of 8 lanes
 * in registers: per 8 columns it loads R row pieces and T token pieces and
 * issues R*T FMAs. Tokens in groups of 4 use 3x4 tiles (12 accumulators, 3
 * rows, 1 token piece: all 16 registers), the rows of the tile stay in L1
 * while the tile sweeps a block of up to 64 tokens that stays in L2, and
 * the next tile's rows are prefetched meanwhile. A single token (decode)
 * uses 8x1 tiles: 8 rows streamed once, 8 independent sums, the weights read
 * straight into the FMAs, the next 8 rows prefetched at the pace these are
 * read (decode of stories15M: 1.41 -> 1.31 ms/token; the same prefetch slows
 * the AVX-512 path, whose wider loads keep enough lines in flight without
 * it); that path is bound by memory bandwidth for matrices that do not fit
 * in cache. A row whose length is not a multiple of 8 ends with a masked
 * load (zeros past the end).
 */
#include "../kernels.h"
#include "simd_avx2.h"

#define KVQ__AVX2_TB 64 /* tokens per L2 block; a multiple of 4 */

/* Lanes 0..r-1 set (r in 1..7). */
static inline __m256i kvq__mm_mask8(size_t r) {
    static const int32_t bits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(const void *)(bits + 8 - r));
}

/* out[t*d + r] = W[r*n ..] . x[t*n ..] for r < R, t < T; R and T are
 * constants at every call, so the loops unroll and acc stays in registers.
 * pf (T == 1 only; NULL for none): the next tile's rows, prefetched. */
static inline __attribute__((always_inline)) void
kvq__mm_tile8(float *out, const float *x, const float *W, size_t n, size_t d, const int R,
              const int T, const char *pf) {
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        if (T == 1) {
            if (pf) {
                /* the next 8 rows, 4 lines per step: as fast as these are read */
                const char *q = pf + j * 32;
                _mm_prefetch(q + 0, _MM_HINT_T0);
                _mm_prefetch(q + 64, _MM_HINT_T0);
                _mm_prefetch(q + 128, _MM_HINT_T0);
                _mm_prefetch(q + 192, _MM_HINT_T0);
            }
            __m256 xv = _mm256_loadu_ps(x + j);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(W + r * n + j), xv, acc[r][0]);
        } else {
            __m256 w[8];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                w[r] = _mm256_loadu_ps(W + r * n + j);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                __m256 xv = _mm256_loadu_ps(x + t * n + j);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
            }
        }
    }
    if (j < n) {
        __m256i m = kvq__mm_mask8(n - j);
        __m256 w[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            w[r] = _mm256_maskload_ps(W + r * n + j, m);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256 xv = _mm256_maskload_ps(x + t * n + j, m);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][t] = _mm256_fmadd_ps(w[r], xv, acc[r][t]);
        }
    }
    if (T == 1 && R % 4 == 0) {
        /* four rows' sums at once, stored side by side (out rows are adjacent) */
#pragma GCC unroll 2
        for (int r = 0; r < R; r += 4)
            _mm_storeu_ps(out + r, kvq__hsum4x256(acc[r][0], acc[r + 1][0], acc[r + 2][0],
                                                  acc[r + 3][0]));
    } else if (T == 4) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float s[4];
            _mm_storeu_ps(s, kvq__hsum4x256(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            for (int t = 0; t < 4; t++)
                out[t * d + r] = s[t];
        }
    } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                out[t * d + r] = kvq__hsum256(acc[r][t]);
    }
}

/* Every row of W times T (1..3) token vectors. */
static void kvq__mm_rows_avx2(float *out, const float *x, const float *W, size_t n, size_t d,
                              size_t T) {
    size_t i = 0;
    switch (T) {
    case 1:
        for (; i + 8 <= d; i += 8)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 8, 1,
                          i + 16 <= d ? (const char *)(W + (i + 8) * n) : NULL);
        for (; i < d; i++)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 1, 1, NULL);
        break;
    case 2:
        for (; i + 3 <= d; i += 3)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 3, 2, NULL);
        for (; i < d; i++)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 1, 2, NULL);
        break;
    case 3:
        for (; i + 3 <= d; i += 3)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 3, 3, NULL);
        for (; i < d; i++)
            kvq__mm_tile8(out + i, x, W + i * n, n, d, 1, 3, NULL);
        break;
    }
}

void kvq__matmul_avx2(float *out, const float *x, const float *W, size_t n, size_t d, size_t nt) {
    for (size_t t0 = 0; t0 < nt; t0 += KVQ__AVX2_TB) {
        size_t tb = nt - t0 < KVQ__AVX2_TB ? nt - t0 : KVQ__AVX2_TB;
        size_t t4 = tb - tb % 4;
        const float *xb = x + t0 * n;
        float *ob = out + t0 * d;
        if (t4) {
            size_t i = 0;
            for (; i + 3 <= d; i += 3) {
                /* the next tile's rows, while this one sweeps the block */
                if (i + 6 <= d)
                    for (size_t b = 0; b < 12 * n; b += 64)
                        _mm_prefetch((const char *)(W + (i + 3) * n) + b, _MM_HINT_T0);
                for (size_t t = 0; t < t4; t += 4)
                    kvq__mm_tile8(ob + t * d + i, xb + t * n, W + i * n, n, d, 3, 4, NULL);
            }
            for (; i < d; i++)
                for (size_t t = 0; t < t4; t += 4)
                    kvq__mm_tile8(ob + t * d + i, xb + t * n, W + i * n, n, d, 1, 4, NULL);
        }
        if (tb > t4)
            kvq__mm_rows_avx2(ob + t4 * d, xb + t4 * n, W, n, d, tb - t4);
    }
}
