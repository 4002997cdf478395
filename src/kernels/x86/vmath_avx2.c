/*
 * vmath_avx2.c - AVX2 exp over a block of attention scores (see vmath.c).
 * exp(y) = 2^n * p(r), n = round(y / ln 2), r = y - n ln 2 (two-part ln 2),
 * p a degree-6 Taylor/minimax-style polynomial on |r| <= ln2/2; y below
 * -87.3 flushes to 0, which also covers masked (-inf) entries.
 */
#include "../kernels.h"
#include "simd_avx2.h"

static inline __m256 kvq__exp256(__m256 y) {
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.0f);
    __m256 under = _mm256_cmp_ps(y, lo, _CMP_LT_OQ);
    y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), y);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, res);
}

int kvq__page_softmax_avx2(float *s, size_t ss, size_t nr, size_t n, float *m, float *l,
                           float *f) {
    int any = 0;
    for (size_t r = 0; r < nr; r++) {
        float *x = s + r * ss, bm = -INFINITY;
        size_t i = 0;
        if (n >= 8) {
            __m256 mx = _mm256_loadu_ps(x);
            for (i = 8; i + 8 <= n; i += 8)
                mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            bm = _mm_cvtss_f32(h);
        }
        for (; i < n; i++)
            bm = x[i] > bm ? x[i] : bm;
        any |= kvq__softmax_max_step(bm, &m[r], &l[r], &f[r]);
        if (m[r] == -INFINITY) { /* nothing visible yet: every weight 0 */
            memset(x, 0, n * sizeof(float));
            continue;
        }
        l[r] += kvq__exp_block_avx2(x, n, m[r]);
    }
    return any;
}

float kvq__exp_block_avx2(float *x, size_t n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = kvq__exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = kvq__hsum256(acc);
    if (i < n) {
        float tmp[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                        -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(tmp, x + i, (n - i) * sizeof(float));
        __m256 e = kvq__exp256(_mm256_sub_ps(_mm256_loadu_ps(tmp), mv));
        _mm256_storeu_ps(tmp, e);
        for (size_t j = 0; j < n - i; j++) {
            x[i + j] = tmp[j];
            s += tmp[j];
        }
    }
    return s;
}
