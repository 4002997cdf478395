/*
 * matmul.c - the weight-times-activations product of the model runner:
 * out[t][i] = sum_j W[i][j] x[t][j] for nt vectors x of length n and a d x n
 * row-major weight matrix W (out is nt x d). The scalar reference sums each
 * dot product in index order, as llama2.c's matmul does; the SIMD paths
 * (x86/matmul_avx2.c, x86/matmul_avx512.c) split each sum over vector lanes,
 * which changes the rounding only: both the reference and a SIMD sum are
 * within gamma_n * sum_j |W[i][j] x[t][j]| of the exact value, gamma_n =
 * n u / (1 - n u), u = 2^-24 (tests/test_model.c checks both bounds).
 */
#include "kernels.h"

void kvq__matmul_ref(float *out, const float *x, const float *W, size_t n, size_t d, size_t nt) {
    size_t t = 0;
    /* four vectors at a time: independent chains the CPU can overlap */
    for (; t + 4 <= nt; t += 4) {
        const float *x0 = x + t * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        for (size_t i = 0; i < d; i++) {
            const float *row = W + i * n;
            float v0 = 0.0f, v1 = 0.0f, v2 = 0.0f, v3 = 0.0f;
            for (size_t j = 0; j < n; j++) {
                float w = row[j];
                v0 += w * x0[j];
                v1 += w * x1[j];
                v2 += w * x2[j];
                v3 += w * x3[j];
            }
            out[t * d + i] = v0;
            out[(t + 1) * d + i] = v1;
            out[(t + 2) * d + i] = v2;
            out[(t + 3) * d + i] = v3;
        }
    }
    for (; t < nt; t++)
        for (size_t i = 0; i < d; i++) {
            const float *row = W + i * n, *xt = x + t * n;
            float v = 0.0f;
            for (size_t j = 0; j < n; j++)
                v += row[j] * xt[j];
            out[t * d + i] = v;
        }
}

kvq__matmul_fn kvq__matmul_select(kvq_isa isa) {
#if defined(__x86_64__)
    if ((isa == KVQ_ISA_AUTO || isa == KVQ_ISA_AVX512) && kvq__cpu_has_avx512())
        return kvq__matmul_avx512;
    if ((isa == KVQ_ISA_AUTO || isa == KVQ_ISA_AVX2 || isa == KVQ_ISA_AVXVNNI ||
         isa == KVQ_ISA_AVX512) &&
        kvq__cpu_has_avx2())
        return kvq__matmul_avx2;
#endif
    (void)isa;
    return kvq__matmul_ref;
}
