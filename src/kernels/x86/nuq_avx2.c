/* nuq_avx2.c - AVX2 kernels of the nuq family (placeholder until written). */
#include "../kernels.h"

void kvq__nuq_avx2_select(kvq_codec *c) { (void)c; }
