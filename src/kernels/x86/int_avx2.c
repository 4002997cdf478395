/* int_avx2.c - AVX2 kernels of the int family (placeholder until written). */
#include "../kernels.h"

void kvq__int_avx2_select(kvq_codec *c) { (void)c; }
