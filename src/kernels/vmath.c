/*
 * vmath.c - vector math for attention: x[i] = exp(x[i] - m) over a block of
 * scores, returning the sum; -inf (masked) gives exactly 0. The scalar
 * reference uses expf; the AVX2 path (x86/vmath_avx2.c) a range-reduced
 * polynomial within 2e-7 relative of it (tests/test_kernels.c).
 */
#include "kernels.h"

float kvq__exp_block_ref(float *x, size_t n, float m) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float e = x[i] == -INFINITY ? 0.0f : expf(x[i] - m);
        x[i] = e;
        s += e;
    }
    return s;
}

int kvq__page_softmax_ref(float *s, size_t ss, size_t nr, size_t n, float *m, float *l, float *f) {
    int any = 0;
    for (size_t r = 0; r < nr; r++) {
        float *x = s + r * ss, bm = -INFINITY;
        for (size_t i = 0; i < n; i++)
            bm = x[i] > bm ? x[i] : bm;
        any |= kvq__softmax_max_step(bm, &m[r], &l[r], &f[r]);
        if (m[r] == -INFINITY) { /* nothing visible yet: every weight 0 */
            memset(x, 0, n * sizeof(float));
            continue;
        }
        l[r] += kvq__exp_block_ref(x, n, m[r]);
    }
    return any;
}

void kvq__attn_add_ref(float *a, const float *s, size_t ss, size_t nr, const float *m,
                       const float *inv, const int32_t *pos, const int32_t *rqp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (size_t r = 0; r < nr; r++)
            if (inv[r] > 0.0f && pos[i] >= 0 && pos[i] <= rqp[r])
                sum += expf(s[r * ss + i] - m[r]) * inv[r];
        a[i] += sum;
    }
}

/* The path of this file's kernels for isa on this CPU: AVX-512, AVX2 (also
 * for AVX-VNNI) or the scalar reference. */
static kvq_isa kvq__vmath_path(kvq_isa isa) {
#if defined(__x86_64__)
    if (isa == KVQ_ISA_AVX512 && kvq__cpu_has_avx512())
        return KVQ_ISA_AVX512;
    if ((isa == KVQ_ISA_AVX2 || isa == KVQ_ISA_AVXVNNI || isa == KVQ_ISA_AVX512) &&
        kvq__cpu_has_avx2())
        return KVQ_ISA_AVX2;
#endif
    (void)isa;
    return KVQ_ISA_SCALAR;
}

kvq__attn_add_fn kvq__attn_add_select(kvq_isa isa) {
    switch (kvq__vmath_path(isa)) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512:
        return kvq__attn_add_avx512;
    case KVQ_ISA_AVX2:
        return kvq__attn_add_avx2;
#endif
    default:
        return kvq__attn_add_ref;
    }
}

kvq__softmax_fn kvq__page_softmax_select(kvq_isa isa) {
    switch (kvq__vmath_path(isa)) {
#if defined(__x86_64__)
    case KVQ_ISA_AVX512:
        return kvq__page_softmax_avx512;
    case KVQ_ISA_AVX2:
        return kvq__page_softmax_avx2;
#endif
    default:
        return kvq__page_softmax_ref;
    }
}
