/* tq_avx2.c - AVX2 kernels of the tq family (placeholder until written). */
#include "../kernels.h"

void kvq__tq_avx2_select(kvq_codec *c) { (void)c; }
