/*
 * nuq_impl.h - the in-memory tables of the nuq family, shared by the scalar
 * reference (nuq.c) and the AVX2 kernels (kernels/x86/nuq_avx2.c).
 *
 * c->state points at one 64-byte aligned block of three float arrays, each
 * kvq__nuq_stride(c) floats apart (d * L floats plus slack so that an 8-float
 * SIMD load at the last channel of a table with L < 8 stays inside the block):
 *   lev   d x L   channel t's levels at lev[t * L], non-decreasing; the only
 *                 persistent part (saved as float32 by state_save)
 *   thr   d x L   thr[t * L + k] = the largest float not above the midpoint of
 *                 levels k and k + 1 (k < L - 1), so each value goes to its
 *                 nearest level;
 *                 thr[t * L + L - 1] = +Inf. An index is the number of
 *                 thresholds strictly below the value (ties go down).
 *   thr8  (d / 8) x L x 8   the thresholds of each group of 8 channels
 *                 transposed for the AVX2 encoder: thr8[g * 8L + k * 8 + lane]
 *                 (built only when d is a multiple of 8).
 * All three are derived from lev by kvq__nuq_derive and change only in fit and
 * load_state.
 */
#ifndef KVQ_NUQ_IMPL_H
#define KVQ_NUQ_IMPL_H

#include "codec_impl.h"

static inline size_t kvq__nuq_levels(const kvq_codec *c) { return (size_t)1 << c->bits; }

/* Floats between the starts of the three tables (a multiple of 16). */
static inline size_t kvq__nuq_stride(const kvq_codec *c) {
    return (c->d * kvq__nuq_levels(c) + 8 + 15) & ~(size_t)15;
}
static inline const float *kvq__nuq_lev(const kvq_codec *c) { return (const float *)c->state; }
static inline const float *kvq__nuq_thr(const kvq_codec *c) {
    return (const float *)c->state + kvq__nuq_stride(c);
}
static inline const float *kvq__nuq_thr8(const kvq_codec *c) {
    return (const float *)c->state + 2 * kvq__nuq_stride(c);
}

/* Extra bytes after each prepared query (a lookup table lut[t * L + k] =
 * q_t * lev[t * L + k]) so that SIMD kernels may load 8 floats at any
 * channel's table; prep zero-fills them. */
#define KVQ__NUQ_QP_SLACK 32

/* The scalar prep, shared by every path (the AVX2 score reads the same
 * table). */
void kvq__nuq_prep(const kvq_codec *c, void *qp, const float *q);

#endif
