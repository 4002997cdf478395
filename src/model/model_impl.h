/*
 * model_impl.h - internal entry points of the model runner (model.c) for the
 * tests and benchmarks: a loader that fixes the kernel path, and a view of
 * the weights as loaded.
 */
#ifndef KVQ_MODEL_IMPL_H
#define KVQ_MODEL_IMPL_H

#include "../common/common.h"

/* kvq_model_load with the matrix-product path chosen by isa (KVQ_ISA_AUTO:
 * the widest the CPU has, what kvq_model_load uses; KVQ_ISA_SCALAR: the
 * reference loop; an ISA the CPU lacks falls back to a narrower one). */
kvq_status kvq__model_load_isa(kvq_model **out, const char *path, const kvq_allocator *alloc,
                               kvq_isa isa);
/* kvq__model_load_isa from the size bytes of a checkpoint at buf (borrowed:
 * the weights are copied). On KVQ_ERR_CORRUPT / KVQ_ERR_VERSION why (when
 * not NULL) gets the reason, e.g. "the header's shape needs N bytes of
 * weights, the file has M". The fuzz target calls this. */
kvq_status kvq__model_load_mem(kvq_model **out, const uint8_t *buf, size_t size,
                               const kvq_allocator *alloc, kvq_isa isa, char *why,
                               size_t why_size);
/* The tokenizer from the len bytes of a tokenizer.bin at buf (borrowed). */
kvq_status kvq__tokenizer_load_mem(kvq_tokenizer **out, const uint8_t *buf, size_t len,
                                   size_t vocab, const kvq_allocator *alloc, char *why,
                                   size_t why_size);
/* The path in use: "scalar", "avx2" or "avx512". */
const char *kvq__model_kernel_name(const kvq_model *m);
/* All weights (f32, read-only), as one array of *n floats. */
const float *kvq__model_weights(const kvq_model *m, size_t *n);

#endif
