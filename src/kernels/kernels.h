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

/* x[i] = exp(x[i] - m) (0 for -inf), returns the sum. */
typedef float (*kvq__exp_block_fn)(float *x, size_t n, float m);
float kvq__exp_block_ref(float *x, size_t n, float m);
float kvq__exp_block_avx2(float *x, size_t n, float m);
kvq__exp_block_fn kvq__exp_block_select(kvq_isa isa);

#endif
