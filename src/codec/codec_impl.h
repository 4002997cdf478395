/*
 * codec_impl.h - the internal shape of a codec: the kvq_codec struct, the
 * kernel table each codec family fills in, and the family hooks that the
 * codec table (codec.c) calls. Families live in one file each (float.c,
 * int.c, tq.c, nuq.c); their scalar kernels are the reference, and the SIMD
 * kernels in src/kernels/ must agree with them (bit-exact for packing, within
 * named bounds for float arithmetic).
 *
 * Kernel contracts (n may be 0; pointers need no alignment):
 *   encode(c, dst, src, n)   n vectors of d floats -> n * c->bytes bytes.
 *                            src is already checked finite.
 *   decode(c, dst, src, n)   n * c->bytes bytes -> n * d floats.
 *   prep(c, qp, q)           one float query -> c->qp_bytes bytes of prepared
 *                            query (rotated, quantized, LUTs...). qp is
 *                            64-byte aligned.
 *   score(c, out, ostride, qp, nq, keys, n)
 *                            out[i * ostride + j] = <q_i, key_j>, i < nq,
 *                            j < n; qp holds nq prepared queries, each
 *                            c->qp_bytes apart.
 *   accum(c, acc, astride, w, wstride, nq, vals, n)
 *                            acc[i * astride + t] += sum_j w[i * wstride + j]
 *                            * v_j[t] in the codec's accumulation domain
 *                            (c->acc_len floats per row; for tq this is the
 *                            rotated domain).
 *   finish(c, out, acc)      out[t] += (acc mapped back to the value domain)[t]
 *                            for t < d; NULL when the domain is the identity
 *                            (then acc is added directly).
 * All kernels are thread-safe: they only read the codec and use the stack.
 *
 * Tiled pages (src/codec/tile.c). The cache stores a page of P vectors of one
 * codec either as P rows of c->bytes (the row layout: encode's output as is)
 * or, where the codec defines one for (role, P), in a tiled layout of the
 * same P * c->bytes bytes in which the attention kernels find the tokens of
 * the page in SIMD lanes (keys: a token per lane, the sum runs over
 * dimensions; values: a dimension per lane, the sum runs over tokens). The
 * layout depends only on the codec's parameters, the role and P, never on
 * the CPU path, so pages and records move between machines unchanged.
 *   c->tiled(c, role, P)             nonzero: (role, P) uses the tiled layout
 *   c->tput(c, role, P, page, i, row) slot i of a tiled page <- one encoded row
 *   c->tget(c, role, P, page, i, row) slot i of a tiled page -> one encoded row
 * Tiled kernels (c->k; NULL when the codec has none on its path: the cache
 * then gathers the page's rows and calls score/accum):
 *   tprep(c, qp, q)            one query -> c->tqp_bytes of prepared query
 *                              for tscore (64-byte aligned)
 *   tscore(c, out, ostride, qp, nq, page, P)
 *                              as score over the P keys of a tiled K page
 *   taccum(c, acc, astride, w, wstride, nq, page, P)
 *                              as accum over the P values of a tiled V page,
 *                              in the same accumulation domain; it may round
 *                              the weights (per row and page) within the bound
 *                              its family documents.
 *   taccum_run(c, acc, astride, w, wstride, nq, pages, np, P)
 *                              optional (NULL: the driver calls taccum page
 *                              by page): as taccum over the np tiled V pages
 *                              pages[0..np), the weights of page i at w +
 *                              i * P (row stride wstride >= np * P); it may
 *                              round the weights once per run of pages, and
 *                              convert and scale its integer sums once per
 *                              run, within its family's bound for a run of
 *                              np * P tokens. Any np >= 1.
 * The scalar reference of a tiled kernel is tget + ref.score / ref.accum
 * (for taccum_run: that, page after page).
 */
#ifndef KVQ_CODEC_IMPL_H
#define KVQ_CODEC_IMPL_H

#include "../common/common.h"

enum { KVQ__ROLE_K = 0, KVQ__ROLE_V = 1 };

typedef struct kvq__kernels {
    void (*encode)(const kvq_codec *c, uint8_t *dst, const float *src, size_t n);
    /* optional: encode with the finiteness check fused into the kernel's
     * first pass over src; 1: encoded, 0: a value is NaN or infinite,
     * -1: out of scratch memory (0 and -1 leave dst untouched) */
    int (*encode_chk)(const kvq_codec *c, uint8_t *dst, const float *src, size_t n);
    void (*decode)(const kvq_codec *c, float *dst, const uint8_t *src, size_t n);
    void (*prep)(const kvq_codec *c, void *qp, const float *q);
    void (*score)(const kvq_codec *c, float *out, size_t ostride, const void *qp, size_t nq,
                  const uint8_t *keys, size_t n);
    void (*accum)(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride,
                  size_t nq, const uint8_t *vals, size_t n);
    void (*finish)(const kvq_codec *c, float *out, const float *acc);
    /* tiled pages (see above); NULL when absent */
    void (*tprep)(const kvq_codec *c, void *qp, const float *q);
    void (*tscore)(const kvq_codec *c, float *out, size_t ostride, const void *qp, size_t nq,
                   const uint8_t *page, size_t P);
    void (*taccum)(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride,
                   size_t nq, const uint8_t *page, size_t P);
    void (*taccum_run)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                       size_t wstride, size_t nq, const uint8_t *const *pages, size_t np, size_t P);
} kvq__kernels;

typedef enum {
    KVQ__FAM_FLOAT = 1, /* f32, f16, bf16 */
    KVQ__FAM_INT,       /* int8, int4, int2 */
    KVQ__FAM_TQ,        /* tq1..tq4 */
    KVQ__FAM_TQP,       /* tqp2..tqp4 */
    KVQ__FAM_NUQ        /* nuq1..nuq8 */
} kvq__family;

/* float family kinds */
enum { KVQ__F32 = 0, KVQ__F16 = 1, KVQ__BF16 = 2 };

#define KVQ__SEED_DEFAULT 0x6b7671u

struct kvq_codec {
    kvq_allocator alloc;
    kvq__family family;
    int kind;        /* float family: KVQ__F32/F16/BF16 */
    int bits;        /* int: 8/4/2; tq: 1..4 (index bits); tqp: total bits 2..4; nuq: 1..8 */
    size_t d;        /* head_dim */
    size_t group;    /* int codecs: group size (divides d) */
    size_t ngroups;  /* d / group */
    int nc;          /* tq/tqp: norm correction */
    int norm_bits;   /* tq/tqp: 16 (fp16 scale) or 8 (log2 code) */
    uint64_t seed;   /* tq/tqp rotation and sketch */
    size_t bytes;    /* encoded bytes per vector */
    size_t qp_bytes; /* prepared query size in bytes (multiple of 64) */
    size_t acc_len;  /* floats per accumulation row (>= d) */
    size_t tqp_bytes; /* prepared query of tscore (multiple of 64; 0 without tprep) */
    int pf_self;      /* the kernels in use prefetch kvq__pf_next themselves */
    int pf_tscore;    /* tscore prefetches (T0) the bytes of kvq__pf_next (the next
                         page's key area) that it reads in its own page */
    kvq_isa isa;     /* path the kernels were chosen for */
    /* tiled page layout (see above); tiled NULL: the family has none */
    int (*tiled)(const kvq_codec *c, int role, size_t P);
    void (*tput)(const kvq_codec *c, int role, size_t P, uint8_t *page, size_t i,
                 const uint8_t *row);
    void (*tget)(const kvq_codec *c, int role, size_t P, const uint8_t *page, size_t i,
                 uint8_t *row);
    char spec[96];   /* canonical spec */

    kvq__kernels ref; /* the scalar reference kernels */
    kvq__kernels k;   /* the kernels in use (SIMD where available) */

    /* family state; owned, freed by the family's destroy hook */
    void *state;
    size_t state_bytes; /* bytes of state that are fitted/persistent (nuq tables) */
    int fitted;         /* nuq: tables present */
};

/* Family hooks. init() has c->family/kind/bits/d/group/ngroups/nc/norm_bits/
 * seed/alloc filled and must set bytes, qp_bytes, acc_len, ref and state; it
 * may fail with KVQ_ERR_NOMEM / KVQ_ERR_HEAD_DIM (writing a message into err
 * with snprintf when err is not NULL). destroy() frees c->state (also after
 * a failed init). After init, codec.c copies ref into k and lets
 * src/kernels/dispatch.c override the entries that have a SIMD path for
 * c->isa (kvq__kernels_select). */
typedef struct kvq__family_ops {
    kvq_status (*init)(kvq_codec *c, char *err, size_t err_size);
    void (*destroy)(kvq_codec *c);
    /* optional: */
    kvq_status (*fit)(kvq_codec *c, const float *x, size_t n);
    size_t (*state_size)(const kvq_codec *c); /* payload bytes of persistent state */
    void (*state_save)(const kvq_codec *c, uint8_t *dst);
    kvq_status (*state_load)(kvq_codec *c, const uint8_t *src, size_t size); /* validates */
} kvq__family_ops;

extern const kvq__family_ops kvq__float_ops;
extern const kvq__family_ops kvq__int_ops;
extern const kvq__family_ops kvq__tq_ops;  /* tq and tqp */
extern const kvq__family_ops kvq__nuq_ops;

/* src/kernels/dispatch.c: override c->k entries with SIMD kernels for
 * c->isa where the family and its parameters have one. */
void kvq__kernels_select(kvq_codec *c);

/* Internal entry points the cache uses (no argument checks: callers ensure
 * sizes). qp must be 64-byte aligned, nq * c->qp_bytes bytes. */
static inline void kvq__codec_prep(const kvq_codec *c, void *qp, const float *q, size_t nq) {
    for (size_t i = 0; i < nq; i++)
        c->k.prep(c, (uint8_t *)qp + i * c->qp_bytes, q + i * c->d);
}

/* Set by the attention driver around a score/accum/tscore/taccum call: the
 * area of the same head and role in the page it will read next (same size
 * and layout), or NULL. Kernels that read many lines per page may prefetch
 * it line by line as they read their own, which keeps a steady stream of
 * requests one page ahead (pages are separate blocks: the hardware
 * prefetchers lose the stream at each). Kernels may ignore it. */
#if defined(__GNUC__)
/* initial-exec: one %fs-relative load; in libkvq.so the default model
 * calls __tls_get_addr on every kernel call (8 bytes of the static TLS
 * that glibc reserves for libraries loaded later, too) */
#define KVQ__TLS_IE __attribute__((tls_model("initial-exec")))
#else
#define KVQ__TLS_IE
#endif
extern _Thread_local const uint8_t *kvq__pf_next KVQ__TLS_IE;

/* A kernel's paced prefetch of the bytes at kvq__pf_next: a
 * share of their lines at each of its steps, step / 65536 lines (16.16
 * fixed point, no division in the loop: two per step made f16 50% slower),
 * rather than all of them in a burst, which fills the L1's miss buffers
 * while the rest of the kernel leaves the memory idle. */
typedef struct {
    uint64_t f, step, nl; /* position, lines per step (16.16), lines */
} kvq__pace;

/* A pace over the first steps / part of a kernel's steps (all the bytes
 * asked for by then); none without kvq__pf_next or steps. */
static inline kvq__pace kvq__pace_make(size_t bytes, uint64_t steps, uint64_t part) {
    kvq__pace p = {0, 0, 0};
    if (kvq__pf_next && bytes && steps) {
        p.nl = ((uint64_t)bytes + 63) / 64;
        p.step = (p.nl << 16) * part / steps + 1;
    }
    return p;
}

/* One step's share of the lines (prefetcht0). */
static inline __attribute__((always_inline)) void kvq__pace_step(kvq__pace *p) {
    if (!p->step)
        return;
    const uint64_t l0 = p->f >> 16, l1 = KVQ__MIN(p->nl, (p->f + p->step) >> 16);
    p->f += p->step;
    for (uint64_t l = l0; l < l1; l++)
        __builtin_prefetch(kvq__pf_next + 64 * l, 0, 3);
}
/* Set by the decode driver around a value kernel's call (taccum_run): the
 * distance from this head's value areas to the next head's in the same
 * page blocks, whose lines the int and tq kernels prefetch (T0) as they
 * read their own; 0: none. */
extern _Thread_local ptrdiff_t kvq__pf_delta KVQ__TLS_IE;

/* Whether (role, P) of codec c uses the tiled layout. */
static inline int kvq__tiled(const kvq_codec *c, int role, size_t P) {
    return c && c->tiled && c->tiled(c, role, P);
}

/* tile.c: one slot of a page area of P vectors in the layout `tiled` says:
 * encode x into slot i (tmp: c->bytes of scratch) / decode slot i. */
void kvq__slot_encode(const kvq_codec *c, int tiled, int role, size_t P, uint8_t *area, size_t i,
                      const float *x, uint8_t *tmp);
void kvq__slot_decode(const kvq_codec *c, int tiled, int role, size_t P, const uint8_t *area,
                      size_t i, float *x, uint8_t *tmp);
/* The reference of the tiled kernels: rows of the page gathered (tget) into
 * rows (P * c->bytes) then the row kernels of `k` (c->ref or c->k). */
void kvq__tile_gather(const kvq_codec *c, int role, size_t P, const uint8_t *page, uint8_t *rows);
void kvq__tile_score_rows(const kvq_codec *c, const kvq__kernels *k, float *out, size_t ostride,
                          const void *qp, size_t nq, const uint8_t *page, size_t P, uint8_t *rows);
void kvq__tile_accum_rows(const kvq_codec *c, const kvq__kernels *k, float *acc, size_t astride,
                          const float *w, size_t wstride, size_t nq, const uint8_t *page, size_t P,
                          uint8_t *rows);

/* taccum_run's meaning through `k`'s taccum (or the gathered rows and
 * k->accum when k has no taccum: rows then holds P * c->bytes of scratch),
 * page after page: the reference of taccum_run, and the driver's path for
 * codecs without one. */
void kvq__tile_accum_pages(const kvq_codec *c, const kvq__kernels *k, float *acc, size_t astride,
                           const float *w, size_t wstride, size_t nq, const uint8_t *const *pages,
                           size_t np, size_t P, uint8_t *rows);

/* Round up to a multiple of 64. */
static inline size_t kvq__round64(size_t x) { return (x + 63) & ~(size_t)63; }

#endif
