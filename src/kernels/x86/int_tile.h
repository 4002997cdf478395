/*
 * int_tile.h - what the tiled int8/int4 kernels of int_avx2.c and
 * int_avx512.c share (layouts and error bounds: src/codec/int.c): the
 * prepared query of tscore, the rounding of a page's weights for taccum,
 * and the fallback for weights that rounding does not cover. Plain C: both
 * files (and the SIMDe build of the AVX-512 one) include it.
 *
 * Prepared query (tprep, one row, 64-byte aligned, c->tqp_bytes apart),
 * blocks of qb values (kvq__tile_plan_make), m_b = max |q| over block b:
 *   int8 keys: int16 codes Q = rint(q * KVQ__TILE_QK / m_b), |Q| <= 16383,
 *   taken by s16 x s16 products (vpmaddwd, vpdpwssd) against the stored
 *   bytes c + 128 widened to int16:
 *     [d x int16 Q, zero padded to a multiple of 64 bytes]
 *     [nqb x f32 beta_b = m_b / KVQ__TILE_QK]
 *     [nqb x int32 -128 sum_b Q]               the bias of the stored c + 128
 *   int4 keys: qq = rint(q * 127 / m_b) in -127..127:
 *     [d x int8 qq][nqb x f32 beta_b = m_b / 127][nqb x int32, unused]
 *     [ng x f32 sum of q over g]               the float query sums of the groups
 * int8: qb = 256, 128, 64, 32, 16 or 8, the largest of them that divides g
 * (one block per group up to 256 values; the partial sums of D_b = sum_b Q
 * c stay below 2^31, see int.c); int4: 32, 16 or 8.
 */
#ifndef KVQ_INT_TILE_H
#define KVQ_INT_TILE_H

#include "../kernels.h"

#include <float.h>

/* Blocks or groups whose largest |value| is below this quantize to zero
 * (their 127/max could overflow); int.c counts them in the bound. */
#define KVQ__TILE_TINY 0x1p-100f
/* Weights of a page are rounded in runs of at most this many tokens. */
#define KVQ__TILE_RUN 64
/* int8 keys: the range of the query codes Q, 2^14 - 1. */
#define KVQ__TILE_QK 16383
/* int8 values: the range of the rounded weights, 2^15 - 1: an s16 for
 * vpmaddwd / vpdpwssd, or 256 wh + wl with wh in 0..127 for vpdpbusd's u8
 * operand (two passes). */
#define KVQ__TILE_WK 32767
/* Bytes of one row's rounded weights of a run: ng groups of up to
 * KVQ__TILE_RUN tokens, 2 bytes a weight for int8 (kvq__wq_fmt). */
#define KVQ__WQ_ROW (2 * KVQ__MAX_HEAD_DIM / 8 * KVQ__TILE_RUN)

/* How the rounded weights of a row are stored (n tokens in the run, group
 * gi, token t): U8 the byte wq[gi n + t] (int4: W = 255); U16 a
 * little-endian u16 at wq + 2 (gi n + t) (int8 through s16 x s16
 * products); SPLIT the high byte (0..127) at wq[gi n + t] and the low byte
 * at wq[ng n + gi n + t] (int8 on AVX-512 VNNI: two passes of vpdpbusd). */
typedef enum { KVQ__WQ_U8 = 0, KVQ__WQ_U16 = 1, KVQ__WQ_SPLIT = 2 } kvq__wq_fmt;

typedef struct {
    size_t qb, nqb; /* query block, blocks per vector */
    size_t off_beta, off_bias, off_qsum, bytes;
} kvq__tile_plan;

static inline void kvq__tile_plan_make(const kvq_codec *c, kvq__tile_plan *p) {
    const size_t d = c->d, g = c->group;
    if (c->bits == 8) {
        p->qb = g % 256 == 0 ? 256 : g % 128 == 0 ? 128 : g % 64 == 0 ? 64
              : g % 32 == 0  ? 32  : g % 16 == 0  ? 16  : 8;
        p->off_beta = kvq__round64(2 * d);
    } else {
        p->qb = g % 32 == 0 ? 32 : g % 16 == 0 ? 16 : 8;
        p->off_beta = kvq__round64(d);
    }
    p->nqb = d / p->qb;
    p->off_bias = p->off_beta + 4 * p->nqb;
    p->off_qsum = p->off_bias + 4 * p->nqb;
    p->bytes = kvq__round64(p->off_qsum + 4 * c->ngroups);
}

/* Whether the tiled kernels handle codec c: int8/int4 with g % 8 == 0 (the
 * codecs int.c tiles). */
static inline int kvq__tile_ok(const kvq_codec *c) {
    return (c->bits == 8 || c->bits == 4) && c->group % 8 == 0 && c->d % 8 == 0;
}

/* int_avx2.c, also the AVX-512 path's: the prepared query of tscore. */
void kvq__int_tprep_avx2(const kvq_codec *c, void *qp, const float *q);
/* int_avx2.c, also int_avxvnni.c's: a run's weights of 4 rows rounded to
 * 0..W in format fmt: W = 255 (U8, int4) or KVQ__TILE_WK (int8: U16 for
 * vpmaddwd, SPLIT for vpdpbusd). */
unsigned kvq__int_wquant4_avx2(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t n,
                               const float *const *w, uint8_t (*wq)[KVQ__WQ_ROW], float *al,
                               float *msum, kvq__wq_fmt fmt);

/* The scalar tail of tprep: the int8 bias -128 sum_b Q (Q already
 * written) and the float group sums. */
static inline void kvq__tile_prep_tail(const kvq_codec *c, const kvq__tile_plan *p, uint8_t *qp,
                                       const float *q) {
    int32_t *bias = (int32_t *)(void *)(qp + p->off_bias);
    float *qs = (float *)(void *)(qp + p->off_qsum);
    if (c->bits == 8) {
        const int16_t *Q = (const int16_t *)(const void *)qp;
        for (size_t b = 0; b < p->nqb; b++) {
            int32_t s = 0;
            for (size_t t = b * p->qb; t < (b + 1) * p->qb; t++)
                s += Q[t];
            bias[b] = -128 * s;
        }
    } else {
        memset(bias, 0, 4 * p->nqb);
    }
    for (size_t gi = 0; gi < c->ngroups; gi++) {
        float s = 0.0f;
        for (size_t t = gi * c->group; t < (gi + 1) * c->group; t++)
            s += q[t];
        qs[gi] = s;
    }
}

/* acc += w . v over tokens [t0, t0 + n) of a tiled V page for one row, in
 * float, through the row kernels (the weights the rounding cannot take). */
static inline void kvq__tile_accum_exact(const kvq_codec *c, float *acc, const float *w,
                                         const uint8_t *page, size_t P, size_t t0, size_t n) {
    uint8_t rows[16 * (KVQ__MAX_HEAD_DIM + KVQ__MAX_HEAD_DIM / 2)];
    for (size_t j = 0; j < n; j += 16) {
        size_t m = KVQ__MIN(16, n - j);
        for (size_t i = 0; i < m; i++)
            c->tget(c, KVQ__ROLE_V, P, page, t0 + j + i, rows + i * c->bytes);
        c->k.accum(c, acc, 0, w + j, 0, 1, rows, m);
    }
}

/* The block pointers of the weight rounding (sb: the scales of a block's
 * first token) and of the accumulation (cb: its codes) for the n tokens of
 * a run that starts at token t0 of pages[0] and continues at token 0 of the
 * following pages (of P tokens each), 16 tokens a block. */
static inline void kvq__int_run_blocks(const kvq_codec *c, const uint8_t *const *pages, size_t P,
                                       size_t t0, size_t n, const uint8_t **sb, const uint8_t **cb) {
    const size_t cbytes = c->bits == 8 ? c->d : c->d / 2; /* code bytes per token */
    for (size_t j = 0, pi = 0, t = t0; j < n / 16; j++, t += 16) {
        if (t == P) {
            pi++;
            t = 0;
        }
        sb[j] = pages[pi] + cbytes * P + 2 * t;
        cb[j] = pages[pi] + cbytes * t;
    }
}

/* kvq__tile_accum_exact over the n tokens of a run that starts at token t0
 * of pages[0] and goes on page after page (w: the row's weights of them). */
static inline void kvq__tile_accum_exact_run(const kvq_codec *c, float *acc, const float *w,
                                             const uint8_t *const *pages, size_t P, size_t t0,
                                             size_t n) {
    for (size_t t = 0, pi = 0, tp = t0; t < n; pi++, tp = 0) {
        const size_t m = KVQ__MIN(n - t, P - tp);
        kvq__tile_accum_exact(c, acc, w + t, pages[pi], P, tp, m);
        t += m;
    }
}

/* After the rounding of a run's weights for nr rows (bit r of ok: row r's
 * weights taken; acc and wr[r] are row r's accumulator and weights): a[r]
 * = that accumulator for a row taken, NULL (as the caller set it) for a
 * row whose byte weights are zeroed and that takes the exact path. */
static inline void kvq__tile_run_rows(const kvq_codec *c, unsigned ok, size_t nr, float *acc,
                                      size_t astride, const float *const *wr,
                                      uint8_t (*wq)[KVQ__WQ_ROW], const uint8_t *const *pages,
                                      size_t P, size_t t0, size_t n, float **a) {
    for (size_t r = 0; r < nr; r++) {
        if ((ok >> r) & 1) {
            a[r] = acc + r * astride;
            continue;
        }
        memset(wq[r], 0, (c->bits == 8 ? 2 : 1) * c->ngroups * n); /* a row the rounding does not take */
        kvq__tile_accum_exact_run(c, acc + r * astride, wr[r], pages, P, t0, n);
    }
}

#define KVQ__CHK_L1 (64 * 1024) /* most input bytes taken in two passes */

/* The encoders' reduction passes read a batch's groups side by side, an
 * order the hardware prefetchers follow poorly (without the prefetch a
 * streaming encode runs at half speed): each prefetches the batch about
 * KVQ__ENC_PF_BYTES of input ahead of the current one (its first vector j,
 * at x), if any, when the input is over KVQ__CHK_L1 bytes. A smaller one
 * was most likely just written (a token's K or V), so in cache, where the
 * prefetches only take load slots (11% of a hot AVX2 int4:g=32 encode).
 * The distance in bytes, not batches (whose size goes from 1 KiB, AVX2
 * int4:g=32, to 8 KiB, AVX-512 int8): two batches ahead at first,
 * against which 8 KiB measured AVX-512 int8 +7..16%, AVX2 int4:g=32
 * +3..7%, AVX-512 int4:g=32 +0..4% (streaming, flushed, in-process A/B). */
#define KVQ__ENC_PF_BYTES 8192
/* The distance in floats from the batch of vector j to the input it
 * prefetches, 0 for none. The int4/int2 reductions prefetch it line by
 * line next to their loads (paired against ggml's q4_0
 * streaming: AVX2 0.94 -> 0.96-0.98, AVX-512 1.09-1.13 -> 1.19-1.24;
 * distances of 4 and 16 KiB were even or slower); int8 in the two bursts
 * of kvq__enc_prefetch_part (paced, it was 4-12% slower). */
static inline size_t kvq__enc_pf_dist(size_t j, size_t batch, size_t n, size_t d) {
    const size_t bb = batch * d * sizeof(float);
    const size_t dist = bb >= KVQ__ENC_PF_BYTES ? 1 : KVQ__ENC_PF_BYTES / bb;
    return n * d > KVQ__CHK_L1 / sizeof(float) && j + (dist + 1) * batch <= n ? dist * batch * d : 0;
}

/* The batch at x (vector j) prefetches, part 0: the whole batch ahead; 1,
 * 2: its first and second half (a one-pass encode asks for the first
 * before its reduction and the second before its codes, so that the memory
 * is also busy while the codes are formed: paired against
 * ggml's q8_0 streaming, AVX-512 int8 0.93-0.96 -> 1.02-1.07, AVX2 int8
 * 0.99-1.05 -> 1.04-1.19). */
static inline __attribute__((always_inline)) void
kvq__enc_prefetch_part(const float *x, size_t j, size_t batch, size_t n, size_t d, int part) {
    const size_t pfd = kvq__enc_pf_dist(j, batch, n, d);
    const size_t t0 = part == 2 ? (batch * d / 2) & ~(size_t)15 : 0;
    const size_t t1 = part == 1 ? (batch * d / 2) & ~(size_t)15 : batch * d;
    if (pfd)
        for (size_t t = t0; t < t1; t += 16)
            __builtin_prefetch(x + pfd + t, 0, 3);
}

/* ---- the checked encode (codec_impl.h, encode_chk) of both files ----
 * run(c, dst, src, n, ra, rb, stride, phase) is a file's encode pass over
 * batches of `batch` vectors whose groups take `stride` floats of ra/rb:
 * phase 0 reduces (finding NaN/Inf) and encodes each batch in turn, phase
 * 1 only reduces every batch into ra/rb + b * stride and returns nonzero
 * on NaN/Inf, phase 2 encodes from there. From KVQ__CHK_L1 bytes of input
 * up to KVQ__CHK_COPY bytes of codes: one phase-0 pass into scratch, each
 * batch encoded while in L1, copied to dst when the whole input is
 * finite. Other inputs (a small one is likely in cache, where two passes
 * cost less; or no memory for the copy): phase 1 over all of it (scratch
 * on the stack for up to KVQ__CHK_STACK floats), then phase 2 when it is
 * finite. Returns 1, 0 (NaN/Inf: dst untouched) or -1 (no scratch). */
#define KVQ__CHK_COPY ((size_t)1 << 20) /* most bytes of codes encoded into scratch */
#define KVQ__CHK_STACK 4096             /* floats of phase-1 scratch on the stack */
#define KVQ__CHK_LANES (KVQ__MAX_HEAD_DIM / 8 + 16) /* floats of one batch's groups, at most */
typedef int (*kvq__enc_pass_fn)(const kvq_codec *c, uint8_t *dst, const float *src, size_t n,
                                float *ra, float *rb, size_t stride, int phase);
static inline int kvq__int_encode_checked(const kvq_codec *c, uint8_t *dst, const float *src,
                                          size_t n, size_t batch, size_t stride,
                                          kvq__enc_pass_fn run) {
    const int one = n > KVQ__CHK_L1 / sizeof(float) / c->d && n <= KVQ__CHK_COPY / c->bytes;
    uint8_t *tmp = one ? (uint8_t *)kvq__alloc(&c->alloc, n * c->bytes) : NULL;
    if (tmp) {
        _Alignas(64) float a[KVQ__CHK_LANES], b[KVQ__CHK_LANES];
        const int bad = run(c, tmp, src, n, a, b, 0, 0);
        if (!bad)
            memcpy(dst, tmp, n * c->bytes);
        kvq__free(&c->alloc, tmp);
        return !bad;
    }
    const size_t nbat = (n + batch - 1) / batch;
    _Alignas(64) float stack[KVQ__CHK_STACK];
    float *ra = stack;
    if (nbat > SIZE_MAX / sizeof(float) / 2 / stride)
        return -1;
    if (2 * nbat * stride > KVQ__CHK_STACK &&
        !(ra = (float *)kvq__alloc(&c->alloc, 2 * nbat * stride * sizeof(float))))
        return -1;
    float *rb = ra + nbat * stride;
    const int bad = run(c, dst, src, n, ra, rb, stride, 1);
    if (!bad)
        run(c, dst, src, n, ra, rb, stride, 2);
    if (ra != stack)
        kvq__free(&c->alloc, ra);
    return !bad;
}

#endif
