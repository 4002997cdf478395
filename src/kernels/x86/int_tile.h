/*
 * int_tile.h - what the tiled int8/int4 kernels of int_avx2.c and
 * int_avx512.c share (layouts and error bounds: src/codec/int.c): the
 * prepared query of tscore, the rounding of a page's weights for taccum,
 * and the fallback for weights that rounding does not cover. Plain C: both
 * files (and the SIMDe build of the AVX-512 one) include it.
 *
 * Prepared query (tprep, one row, 64-byte aligned, c->tqp_bytes apart):
 *   [d x int8 query codes in value order, zero padded to a multiple of 64]
 *   [nqb x f32 beta_b]            query block scales (blocks of qb values)
 *   [nqb x int32 -128 * sum_b qq] int8 keys: the bias of the stored codes
 *   [ng x f32 sum of q over g]    int4: the float query sums of the groups
 * qb = 32, 16 or 8, the largest of them that divides g.
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

typedef struct {
    size_t qb, nqb;              /* query block, blocks per vector */
    size_t off_beta, off_bias, off_qsum, bytes;
} kvq__tile_plan;

static inline void kvq__tile_plan_make(const kvq_codec *c, kvq__tile_plan *p) {
    const size_t d = c->d, g = c->group;
    p->qb = g % 32 == 0 ? 32 : g % 16 == 0 ? 16 : 8;
    p->nqb = d / p->qb;
    p->off_beta = kvq__round64(d);
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
 * bytes 0..W (W = 255, or 127 for int8 weights that maddubs takes). */
unsigned kvq__int_wquant4_avx2(const kvq_codec *c, const uint8_t *const *sb, size_t P, size_t n,
                               const float *const *w,
                               uint8_t (*wq)[KVQ__MAX_HEAD_DIM / 8 * KVQ__TILE_RUN], float *al,
                               float *msum, float W);

/* The scalar tail of tprep: block scales from the block maxima, the int8
 * bias and the float group sums (qq already written). */
static inline void kvq__tile_prep_tail(const kvq_codec *c, const kvq__tile_plan *p, uint8_t *qp,
                                       const float *q) {
    const int8_t *qq = (const int8_t *)qp;
    int32_t *bias = (int32_t *)(void *)(qp + p->off_bias);
    float *qs = (float *)(void *)(qp + p->off_qsum);
    for (size_t b = 0; b < p->nqb; b++) {
        int32_t s = 0;
        for (size_t t = b * p->qb; t < (b + 1) * p->qb; t++)
            s += qq[t];
        bias[b] = -128 * s;
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
                                      uint8_t (*wq)[KVQ__MAX_HEAD_DIM / 8 * KVQ__TILE_RUN],
                                      const uint8_t *const *pages, size_t P, size_t t0, size_t n,
                                      float **a) {
    for (size_t r = 0; r < nr; r++) {
        if ((ok >> r) & 1) {
            a[r] = acc + r * astride;
            continue;
        }
        memset(wq[r], 0, c->ngroups * n); /* a row the rounding does not take */
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
