/*
 * dispatch.c - picks the SIMD kernels of a codec for its CPU path. Called
 * once per codec at creation; the choice is stored in the handle (c->k), so
 * two handles of one codec may run different paths side by side (tests and
 * benchmarks compare them that way).
 */
#include "kernels.h"

void kvq__kernels_select(kvq_codec *c) {
    if (c->isa != KVQ_ISA_AVX2 && c->isa != KVQ_ISA_AVXVNNI && c->isa != KVQ_ISA_AVX512)
        return;
#if defined(__x86_64__)
    switch (c->family) {
    case KVQ__FAM_FLOAT:
        kvq__float_avx2_select(c);
        break;
    case KVQ__FAM_INT:
        kvq__int_avx2_select(c);
        break;
    case KVQ__FAM_TQ:
    case KVQ__FAM_TQP:
        kvq__tq_avx2_select(c);
        break;
    case KVQ__FAM_NUQ:
        kvq__nuq_avx2_select(c);
        break;
    }
    if (c->isa == KVQ_ISA_AVXVNNI && c->family == KVQ__FAM_INT)
        kvq__int_avxvnni_select(c);
    if (c->isa != KVQ_ISA_AVX512)
        return;
    unsigned feat = kvq__cpu_avx512_features();
    switch (c->family) {
    case KVQ__FAM_FLOAT:
        kvq__float_avx512_select(c, feat);
        break;
    case KVQ__FAM_INT:
        kvq__int_avx512_select(c, feat);
        break;
    case KVQ__FAM_TQ:
    case KVQ__FAM_TQP:
        kvq__tq_avx512_select(c, feat);
        break;
    default:
        break;
    }
#endif
}
