/*
 * peers.h - baselines for `kvq bench codecs` in the block formats of
 * llama.cpp's ggml, measured in the same run as kvq's codecs: q8_0 (32
 * values: fp16 scale absmax/127, int8 values) and q4_0 (32 values: fp16
 * scale m/-8 where m is the value of largest magnitude, 4-bit values
 * offset by 8, value j in the low nibble of byte j and value 16+j in its
 * high nibble), and the q4_0 x q8_0 row dot product that ggml uses for
 * q4_0 weights. The kernels are written here from the published formats
 * and quantization rules (scalar, and AVX2 chosen at run time); they are
 * not llama.cpp's code, so they stand for what such kernels reach on the
 * machine at hand, to put the Zen 4 figures on this machine's
 * scale.
 */
#ifndef KVQ_PEERS_H
#define KVQ_PEERS_H

#include "benchlib.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kvqp_result {
    int ok;                     /* 0: d is not a multiple of 32, or no memory */
    double q8_quant_gbps;       /* f32 input GB/s over the whole measured set */
    double q8_quant_hot_gbps;   /* ... over one 64-vector block, again and again */
    double q4_quant_gbps;
    double q4_quant_hot_gbps;
    double q4_dot_rows_per_s;   /* rows of d values (q4_0) against one q8_0 query */
    double q4_nmse;             /* reconstruction error of q4_0 on this data */
    int avx2;                   /* the AVX2 kernels ran */
} kvqp_result;

/* Measures the baselines on n vectors of d floats at x (hot: the first 64)
 * with query q (d floats). Returns 0, or -1 when out of memory. */
int kvqp_measure(const float *x, size_t n, size_t d, const float *q, const kvqb_config *cfg,
                 int use_avx2, kvqp_result *r);

/* The ggml block quantizers (the rules above) over nblk blocks of 32 floats;
 * use_avx2 only where the CPU has AVX2 + F16C. */
void kvqp_quantize_q8_0(uint8_t *dst, const float *x, size_t nblk, int use_avx2);
void kvqp_quantize_q4_0(uint8_t *dst, const float *x, size_t nblk, int use_avx2);

/* ---- attention baselines for `kvq bench attend` (peers_attend.c) ----
 * One decode step (one query per query head) over T tokens of H KV heads
 * and QH query heads (query head i uses KV head i / (QH / H)), head_dim d,
 * out = softmax(q.K^T / sqrt(d)).V, measured in the same run as kvq's cache:
 *
 * dense:f32       a competent plain f32 attention without pages: K and V
 *                 contiguous per KV head ([H][T][d]); per KV head two
 *                 passes: the scores of all its query heads (each key load
 *                 shared by the group, blocks of 4 keys x 4 queries reduced
 *                 by one transpose-add, no horizontal sum per key), a
 *                 vectorized softmax, then the weighted sum of V rows
 *                 (register accumulators, V read in token order).
 * llama.cpp:q8_0  llama.cpp's CPU path for a quantized KV cache as ggml's
 * llama.cpp:q4_0  flash-attention kernel does it: K and V in ggml blocks,
 *                 token-major as llama.cpp keeps its cache ([T][H][blocks]);
 *                 one query head at a time: the query quantized to q8_0
 *                 (the vec_dot type of both), for each key the block dot
 *                 product (q8_0.q8_0 or q4_0.q8_0, AVX2 maddubs or VNNI
 *                 dpbusd), online softmax with expf, the V row dequantized
 *                 to f32 and added with an FMA (ggml_vec_mad_f32).
 *
 * Written here from the public descriptions (not llama.cpp's code). Threads
 * (when n_threads > 1, over the pool): dense splits the KV heads, llama.cpp
 * contiguous ranges of query heads, as ggml splits rows. */
typedef enum { KVQP_DENSE_F32 = 0, KVQP_LLAMA_Q8_0 = 1, KVQP_LLAMA_Q4_0 = 2 } kvqp_att_kind;
#define KVQP_ATT_KINDS 3

typedef struct kvqp_att kvqp_att;

/* "dense:f32", "llama.cpp:q8_0", "llama.cpp:q4_0"; NULL for another value. */
const char *kvqp_att_name(kvqp_att_kind kind);

/* K, V: [H][ld][d] floats (the first T tokens of each head are used; ld >=
 * T). dense keeps the pointers (they must outlive the handle); llama.cpp
 * quantizes them into blocks of its own. simd <= kvqb_simd_best(). pool may
 * be NULL (one thread); it needs n_threads threads. Returns 0, -1 when out
 * of memory, -2 when the shape does not suit (llama.cpp: d % 32 != 0;
 * QH % H != 0; n_threads outside 1..64 or over the pool). */
int kvqp_att_create(kvqp_att **out, kvqp_att_kind kind, const float *K, const float *V, size_t ld,
                    size_t T, size_t H, size_t QH, size_t d, kvqb_simd simd, kvqb_pool *pool,
                    int n_threads);
void kvqp_att_free(kvqp_att *a);
/* The threads of the next steps: 1 to the n_threads it was created with.
 * Returns 0, or -2 outside (nothing changed). */
int kvqp_att_set_threads(kvqp_att *a, int n_threads);

/* Bytes of K and V the step reads: the stored cache. */
uint64_t kvqp_att_bytes(const kvqp_att *a);
/* The kernel path, e.g. "avx512", "avx2+vnni". */
const char *kvqp_att_path(const kvqp_att *a);

/* One step: q [QH][d] -> out [QH][d]. */
void kvqp_att_step(kvqp_att *a, const float *q, float *out);

/* The largest relative L2 error ||out - ref|| / ||ref|| over the first, a
 * middle and the last query head, ref computed in double from the values the baseline
 * stores (llama.cpp: dequantized blocks and the q8_0 query). */
double kvqp_att_check(const kvqp_att *a, const float *q, const float *out);

#endif
