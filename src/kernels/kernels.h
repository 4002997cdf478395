/*
 * kernels.h - SIMD kernel selectors, one per codec family and ISA. Each one
 * overrides the entries of c->k for which it has a kernel that supports the
 * codec's parameters, and leaves the scalar reference in place otherwise.
 * Files under x86/ are compiled with the flags of their ISA and only called
 * after run-time CPU detection said the ISA is there.
 */
#ifndef KVQ_KERNELS_H
#define KVQ_KERNELS_H

#include "../codec/codec_impl.h"

void kvq__float_avx2_select(kvq_codec *c);
void kvq__int_avx2_select(kvq_codec *c);
void kvq__tq_avx2_select(kvq_codec *c);
void kvq__nuq_avx2_select(kvq_codec *c);
/* AVX-512 selectors (x86/<family>_avx512.c, see simd_avx512.h): run after the AVX2
 * one of the family, override what they have kernels for; feat is the set
 * of KVQ__X512_* extensions they may use. The _simde twins are the same
 * sources built through SIMDe, linked into the tests only. */
void kvq__float_avx512_select(kvq_codec *c, unsigned feat);
void kvq__float_avx512_select_simde(kvq_codec *c, unsigned feat);
void kvq__int_avx512_select(kvq_codec *c, unsigned feat);
void kvq__int_avxvnni_select(kvq_codec *c);
void kvq__int_avxvnni_select_simde(kvq_codec *c);
void kvq__int_avx512_select_simde(kvq_codec *c, unsigned feat);
void kvq__tq_avx512_select(kvq_codec *c, unsigned feat);
void kvq__tq_avx512_select_simde(kvq_codec *c, unsigned feat);

/* x[i] = exp(x[i] - m) (0 for -inf), returns the sum. */
float kvq__exp_block_ref(float *x, size_t n, float m);
float kvq__exp_block_avx2(float *x, size_t n, float m);

/* Online softmax over one page (or run of pages) of scores, nr rows of n:
 * row r is s[r*ss .. r*ss + n). With bm its maximum, the running maximum
 * m[r] moves by kvq__softmax_max_step (f[r] its rescale factor, 1 when it
 * stays). Then s_i = exp(s_i - m[r]) (-inf gives 0; within 2e-7 relative of
 * expf) and l[r] += their sum. Returns nonzero when some f[r] != 1: the
 * caller then rescales those rows' accumulators by f[r]. */
/* How far a page maximum may rise above the running maximum before the
 * running maximum follows it: weights exp(s - m) stay below e^8 = 2981, so
 * sums of up to 2^100 tokens stay finite in float, while a sequence whose
 * scores creep upwards rescales its accumulators (d floats per row and
 * codec) a few times instead of at nearly every page. The softmax is the
 * same either way: acc and l carry the same factor. */
#define KVQ__SOFTMAX_SLACK 8.0f

/* The running-maximum step of kvq__page_softmax for one row: when nothing
 * is summed yet (*l == 0) a page maximum bm above *m becomes *m; when a sum
 * is running, bm becomes *m only if it is more than KVQ__SOFTMAX_SLACK above
 * it, and then *l is rescaled by *f = expf(old m - bm) (returns 1: the
 * caller's accumulators need it too); otherwise *f = 1 and 0 is returned. */
static inline int kvq__softmax_max_step(float bm, float *m, float *l, float *f) {
    *f = 1.0f;
    if (!(bm > *m))
        return 0;
    if (!(*l > 0.0f)) {
        *m = bm;
        return 0;
    }
    if (!(bm > *m + KVQ__SOFTMAX_SLACK))
        return 0;
    *f = expf(*m - bm);
    *l *= *f;
    *m = bm;
    return 1;
}

typedef int (*kvq__softmax_fn)(float *s, size_t ss, size_t nr, size_t n, float *m, float *l,
                               float *f);
int kvq__page_softmax_ref(float *s, size_t ss, size_t nr, size_t n, float *m, float *l, float *f);
int kvq__page_softmax_avx2(float *s, size_t ss, size_t nr, size_t n, float *m, float *l, float *f);
int kvq__page_softmax_avx512(float *s, size_t ss, size_t nr, size_t n, float *m, float *l,
                             float *f);
int kvq__page_softmax_avx512_simde(float *s, size_t ss, size_t nr, size_t n, float *m, float *l,
                                   float *f);
kvq__softmax_fn kvq__page_softmax_select(kvq_isa isa);

/* The attention that n tokens (slots) received from nr query rows, added to
 * a: a[i] += sum over rows r with inv[r] > 0 and 0 <= pos[i] <= rqp[r] of
 * exp(s[r * ss + i] - m[r]) * inv[r] (m the row's softmax maximum, inv 1 /
 * its sum). Scores of slots that fail the test are never used (they may be
 * anything, NaN included). The reference uses expf, the SIMD paths the
 * softmax's polynomial exp (within 2e-7 relative of it). */
typedef void (*kvq__attn_add_fn)(float *a, const float *s, size_t ss, size_t nr, const float *m,
                                 const float *inv, const int32_t *pos, const int32_t *rqp,
                                 size_t n);
void kvq__attn_add_ref(float *a, const float *s, size_t ss, size_t nr, const float *m,
                       const float *inv, const int32_t *pos, const int32_t *rqp, size_t n);
void kvq__attn_add_avx2(float *a, const float *s, size_t ss, size_t nr, const float *m,
                        const float *inv, const int32_t *pos, const int32_t *rqp, size_t n);
void kvq__attn_add_avx512(float *a, const float *s, size_t ss, size_t nr, const float *m,
                          const float *inv, const int32_t *pos, const int32_t *rqp, size_t n);
void kvq__attn_add_avx512_simde(float *a, const float *s, size_t ss, size_t nr, const float *m,
                                const float *inv, const int32_t *pos, const int32_t *rqp,
                                size_t n);
kvq__attn_add_fn kvq__attn_add_select(kvq_isa isa);

/* out[t*d + i] = sum_{j<n} W[i*n + j] * x[t*n + j] for i < d, t < nt: a d x n
 * row-major weight matrix times nt vectors (the model runner's products).
 * The reference sums in index order; the SIMD paths block over rows and
 * tokens and sum over vector lanes. Each output of either is within
 * gamma_n * sum_j |W x| of exact, gamma_n = n u / (1 - n u), u = 2^-24. */
typedef void (*kvq__matmul_fn)(float *out, const float *x, const float *W, size_t n, size_t d,
                               size_t nt);
void kvq__matmul_ref(float *out, const float *x, const float *W, size_t n, size_t d, size_t nt);
void kvq__matmul_avx2(float *out, const float *x, const float *W, size_t n, size_t d, size_t nt);
void kvq__matmul_avx512(float *out, const float *x, const float *W, size_t n, size_t d, size_t nt);
/* AUTO: the widest path the CPU has (AVX-512, AVX2, scalar); an ISA the CPU
 * lacks falls back to the next narrower one. */
kvq__matmul_fn kvq__matmul_select(kvq_isa isa);

#endif
