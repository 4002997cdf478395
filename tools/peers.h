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

#endif
