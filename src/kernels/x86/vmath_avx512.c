/*
 * vmath_avx512.c - AVX-512 online softmax over one page of scores (see
 * kernels.h, kvq__page_softmax_ref): the same exp as vmath_avx2.c (range
 * reduction by ln 2 in two parts, degree-6 polynomial, within 2e-7 of expf,
 * below -87.3 flushed to 0, so -inf gives 0) on 16 lanes, masked tails. Built
 * natively and through SIMDe (simd_avx512.h).
 */
#include "../kernels.h"
#include "simd_avx512.h"

KVQ__T512 static inline __m512 kvq__exp512(__m512 y) {
    /* no clamps: below -87.3 (-inf too) the mask gives 0, and vscalefps
     * scales by 2^n without building its exponent bits: the same product,
     * so the same bits as 2^n formed by hand (with y clamped at 88) for
     * every y <= 88; the callers' y stay below KVQ__SOFTMAX_SLACK */
    const __mmask16 under = _mm512_cmp_ps_mask(y, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), y);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(p, n));
}

KVQ__T512 int KVQ__SEL512(kvq__page_softmax_avx512)(float *s, size_t ss, size_t nr, size_t n,
                                                    float *m, float *l, float *f) {
    int any = 0;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    size_t r0 = 0;
    if (n % 16 == 0 && n <= 64) /* runs of 16..64 tokens: 4 rows at a time, reductions side by side */
        for (; r0 + 4 <= nr; r0 += 4) {
            const size_t nb = n / 16;
            __m512 mx[4];
            float bmv[16], sum[16];
            for (int k = 0; k < 4; k++) {
                const float *x = s + (r0 + (size_t)k) * ss;
                mx[k] = _mm512_loadu_ps(x);
                for (size_t b = 1; b < nb; b++)
                    mx[k] = _mm512_max_ps(mx[k], _mm512_loadu_ps(x + 16 * b));
            }
            _mm512_storeu_ps(bmv, kvq__red4x16(mx[0], mx[1], mx[2], mx[3], 1));
            for (int k = 0; k < 4; k++) {
                size_t r = r0 + (size_t)k;
                any |= kvq__softmax_max_step(bmv[4 * k], &m[r], &l[r], &f[r]);
            }
            __m512 acc[4];
            for (int k = 0; k < 4; k++) {
                float *x = s + (r0 + (size_t)k) * ss;
                acc[k] = _mm512_setzero_ps();
                if (m[r0 + (size_t)k] == -INFINITY) { /* nothing visible yet: every weight 0 */
                    memset(x, 0, n * sizeof(float));
                    continue;
                }
                const __m512 mv = _mm512_set1_ps(m[r0 + (size_t)k]);
                for (size_t b = 0; b < nb; b++) {
                    __m512 e = kvq__exp512(_mm512_sub_ps(_mm512_loadu_ps(x + 16 * b), mv));
                    _mm512_storeu_ps(x + 16 * b, e);
                    acc[k] = _mm512_add_ps(acc[k], e);
                }
            }
            _mm512_storeu_ps(sum, kvq__red4x16(acc[0], acc[1], acc[2], acc[3], 0));
            for (int k = 0; k < 4; k++)
                l[r0 + (size_t)k] += sum[4 * k];
        }
    for (size_t r = r0; r < nr; r++) {
        float *x = s + r * ss;
        __m512 mx = ninf;
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + i));
        __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        if (i < n)
            mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(ninf, tail, x + i));
        float bm = _mm512_reduce_max_ps(mx);
        any |= kvq__softmax_max_step(bm, &m[r], &l[r], &f[r]);
        if (m[r] == -INFINITY) { /* nothing visible yet: every weight 0 */
            memset(x, 0, n * sizeof(float));
            continue;
        }
        __m512 mv = _mm512_set1_ps(m[r]), acc = _mm512_setzero_ps();
        for (i = 0; i + 16 <= n; i += 16) {
            __m512 e = kvq__exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
            _mm512_storeu_ps(x + i, e);
            acc = _mm512_add_ps(acc, e);
        }
        if (i < n) {
            __m512 e = kvq__exp512(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, tail, x + i), mv));
            _mm512_mask_storeu_ps(x + i, tail, e);
            acc = _mm512_add_ps(acc, e);
        }
        l[r] += _mm512_reduce_add_ps(acc);
    }
    return any;
}

/* kvq__attn_add (kernels.h): 16 slots at a time (a masked tail), the rows'
 * terms masked by the slots' positions, the sum of a slot's rows formed row
 * after row as in the reference. */
KVQ__T512 void KVQ__SEL512(kvq__attn_add_avx512)(float *a, const float *s, size_t ss, size_t nr,
                                                 const float *m, const float *inv,
                                                 const int32_t *pos, const int32_t *rqp,
                                                 size_t n) {
    const __m512 zero = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 tail = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        /* the masked float load (SIMDe 0.7.4 has it through simd_avx512.h,
         * bit for bit), the unmasked compares and an AND (its masked
         * compares are broken macros) */
        const __m512i p = _mm512_castps_si512(_mm512_mask_loadu_ps(zero, tail, pos + i));
        const __mmask16 valid = (__mmask16)(tail & _mm512_cmpge_epi32_mask(p, _mm512_setzero_si512()));
        __m512 sum = zero;
        for (size_t r = 0; r < nr; r++) {
            if (!(inv[r] > 0.0f))
                continue;
            const __mmask16 use = (__mmask16)(valid & _mm512_cmple_epi32_mask(p, _mm512_set1_epi32(rqp[r])));
            const __m512 x = _mm512_mask_loadu_ps(zero, use, s + r * ss + i);
            const __m512 e = kvq__exp512(_mm512_sub_ps(x, _mm512_set1_ps(m[r])));
            sum = _mm512_mask_add_ps(sum, use, sum, _mm512_mul_ps(e, _mm512_set1_ps(inv[r])));
        }
        _mm512_mask_storeu_ps(a + i, tail, _mm512_add_ps(_mm512_mask_loadu_ps(zero, tail, a + i), sum));
    }
}
