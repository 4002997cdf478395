/*
 * vmath_avx2.c - AVX2 exp over a block of attention scores (see vmath.c).
 * exp(y) = 2^n * p(r), n = round(y / ln 2), r = y - n ln 2 (two-part ln 2),
 * p a degree-6 Taylor/minimax-style polynomial on |r| <= ln2/2; y below
 * -87.3 flushes to 0, which also covers masked (-inf) entries.
 */
#include "../kernels.h"
#include "simd_avx2.h"

static inline __m256 kvq__exp256(__m256 y) {
    /* no clamps: below -87.3 (-inf too) whatever 2^n's bits
     * become, the mask gives 0; the callers' y stay below
     * KVQ__SOFTMAX_SLACK, far from 88 where 2^n would overflow; the same
     * bits as with y clamped to [-87.3, 88] (18.4 million values compared) */
    __m256 under = _mm256_cmp_ps(y, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
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

/* The maxima (mx) or sums of a0..a3's 8 lanes each, in that order. */
static inline __m128 kvq__red4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, int mx) {
    __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
    __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
    __m256 u0 = mx ? _mm256_max_ps(t0, t1) : _mm256_add_ps(t0, t1);
    __m256 u1 = mx ? _mm256_max_ps(t2, t3) : _mm256_add_ps(t2, t3);
    __m256 v0 = _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 v1 = _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 w = mx ? _mm256_max_ps(v0, v1) : _mm256_add_ps(v0, v1);
    __m128 lo = _mm256_castps256_ps128(w), hi = _mm256_extractf128_ps(w, 1);
    return mx ? _mm_max_ps(lo, hi) : _mm_add_ps(lo, hi);
}

int kvq__page_softmax_avx2(float *s, size_t ss, size_t nr, size_t n, float *m, float *l,
                           float *f) {
    int any = 0;
    size_t r0 = 0;
    if (n % 8 == 0 && n <= 64) /* pages and runs of pages: 4 rows at a time, reductions side by side */
        for (; r0 + 4 <= nr; r0 += 4) {
            const size_t nb = n / 8;
            __m256 v[4];
            float red[4];
            for (int k = 0; k < 4; k++) {
                const float *x = s + (r0 + (size_t)k) * ss;
                v[k] = _mm256_loadu_ps(x);
                for (size_t b = 1; b < nb; b++)
                    v[k] = _mm256_max_ps(v[k], _mm256_loadu_ps(x + 8 * b));
            }
            _mm_storeu_ps(red, kvq__red4x8(v[0], v[1], v[2], v[3], 1));
            for (int k = 0; k < 4; k++) {
                size_t r = r0 + (size_t)k;
                any |= kvq__softmax_max_step(red[k], &m[r], &l[r], &f[r]);
            }
            for (int k = 0; k < 4; k++) {
                float *x = s + (r0 + (size_t)k) * ss;
                v[k] = _mm256_setzero_ps();
                if (m[r0 + (size_t)k] == -INFINITY) { /* nothing visible yet: every weight 0 */
                    memset(x, 0, n * sizeof(float));
                    continue;
                }
                const __m256 mv = _mm256_set1_ps(m[r0 + (size_t)k]);
                for (size_t b = 0; b < nb; b++) {
                    __m256 e = kvq__exp256(_mm256_sub_ps(_mm256_loadu_ps(x + 8 * b), mv));
                    _mm256_storeu_ps(x + 8 * b, e);
                    v[k] = _mm256_add_ps(v[k], e);
                }
            }
            _mm_storeu_ps(red, kvq__red4x8(v[0], v[1], v[2], v[3], 0));
            for (int k = 0; k < 4; k++)
                l[r0 + (size_t)k] += red[k];
        }
    for (size_t r = r0; r < nr; r++) {
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

/* kvq__attn_add (kernels.h): 8 slots at a time, the rows' terms masked by
 * the slots' positions, the sum of a slot's rows formed row after row as in
 * the reference; the last n % 8 slots through the reference. */
void kvq__attn_add_avx2(float *a, const float *s, size_t ss, size_t nr, const float *m,
                        const float *inv, const int32_t *pos, const int32_t *rqp, size_t n) {
    const __m256i neg = _mm256_set1_epi32(-1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(const void *)(pos + i));
        const __m256i valid = _mm256_cmpgt_epi32(p, neg); /* pos >= 0 */
        __m256 sum = _mm256_setzero_ps();
        for (size_t r = 0; r < nr; r++) {
            if (!(inv[r] > 0.0f))
                continue;
            /* pos <= rqp[r]: not pos > rqp[r] */
            const __m256i late = _mm256_cmpgt_epi32(p, _mm256_set1_epi32(rqp[r]));
            const __m256 use = _mm256_castsi256_ps(_mm256_andnot_si256(late, valid));
            const __m256 e = kvq__exp256(_mm256_sub_ps(_mm256_loadu_ps(s + r * ss + i), _mm256_set1_ps(m[r])));
            sum = _mm256_add_ps(sum, _mm256_and_ps(use, _mm256_mul_ps(e, _mm256_set1_ps(inv[r]))));
        }
        _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), sum));
    }
    if (i < n)
        kvq__attn_add_ref(a + i, s + i, ss, nr, m, inv, pos + i, rqp, n - i);
}
