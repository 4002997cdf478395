/*
 * tq_impl.h - internals shared by the TurboQuant family (tq.c), its codebook
 * and rotation helpers (tq_codebook.c, tq_rotate.c) and its AVX2 kernels
 * (kernels/x86/tq_avx2.c).
 *
 * Model (see tq.c for the byte layout): a vector x is rotated, y = R x, and
 * u = y / ||x|| is quantized coordinate by coordinate with the Lloyd-Max
 * codebook of one coordinate of a uniform random unit vector in R^d. tqp
 * adds a 1-bit QJL sketch of the residual, taken in the rotated domain.
 *
 * Bit-exactness rules the SIMD paths rely on (the scalar code in tq.c and
 * tq_rotate.c is the definition):
 * - "lane sums": a sum over j < d is accumulated in 8 float lanes, lane j % 8,
 *   each lane in increasing j, with a separate multiply and add (no FMA);
 *   the lanes are then combined either in double in lane order (norms) or by
 *   kvq__tq_reduce8 (dot products of the dense rotation and the sketch).
 * - the FWHT is unnormalized and runs its stages h = 1, 2, 4, ... in order.
 * Score and accumulate are not bit-exact (FMA, other summation order).
 */
#ifndef KVQ_TQ_IMPL_H
#define KVQ_TQ_IMPL_H

#include "codec_impl.h"

#define KVQ__TQ_MAX_LEVELS 16

/* One stored norm when norm=8: code 0 is 0, codes 1..255 put log2 of the
 * norm uniformly on [lo, hi]. tab[k] is the value code k decodes to. */
typedef struct kvq__tq_ncode {
    float lo, hi;
    float tab[256];
} kvq__tq_ncode;

typedef struct kvq__tq {
    int kb;           /* index bits of the MSE part: tq bits, tqp bits - 1 */
    int levels;       /* 1 << kb */
    int pow2;         /* 1: R = H D / sqrt(d) (FWHT); 0: dense Haar matrix */
    int sketch;       /* tqp: the QJL sketch is present */
    size_t nb;        /* bytes of one stored norm: 2 (fp16) or 1 (log code) */
    size_t idx_bytes; /* ceil(d * kb / 8) */
    size_t off_idx, off_rnorm, off_sign; /* byte offsets in one vector */

    /* codebook; symmetric: cent[levels-1-k] = -cent[k] */
    double cent_d[KVQ__TQ_MAX_LEVELS]; /* centroids, ascending */
    double thr_d[KVQ__TQ_MAX_LEVELS];  /* levels-1 thresholds, ascending */
    double distortion;                 /* E||u - Q(u)||^2 for a random unit u */
    float cent[KVQ__TQ_MAX_LEVELS];
    float mag[8];  /* positive half: mag[n] = cent[levels/2 + n] */
    /* mag[n]^2 in fixed point (units of msq_unit): ||c||^2 is a sum of
     * integers, the same in any order and on every path */
    int32_t msq_fx[8];
    double msq_unit;
    float pthr[8]; /* positive thresholds tau_1..tau_{levels/2-1}: thr[levels/2-1+i] */
    float rs;      /* (float)(1 / sqrt(d)) */

    uint32_t *sflip; /* pow2: d words, 0 or 0x80000000 (the signs of D) */
    float *rot;      /* !pow2: d x d row-major M, y = M x */
    float *skm;      /* tqp: d x d row-major Gaussian sketch S */
    float sk_scale;  /* sqrt(pi/2) / d */

    float *xtab;      /* decode table of the AVX2 attention kernels (2048 floats): packed
                         index bits -> centroids (tq1: 1 byte -> 8, tq2: 1 byte -> 4,
                         tq3: 6 bits -> 2, tq4: 1 byte -> 2); built once per codec */
    /* tq4: the codebook as int16 c16[l] = round(cent[l] / c16_scale), |c16| <=
     * KVQ__TQ_C16_MAX, as low and high bytes for byte shuffles (AVX2 score
     * with an int16 query, see tq_avx2.c) */
    uint8_t c16lo[16], c16hi[16];
    float c16_scale;
    /* the codebook as int8 codes of the tiled kernels (tq.c, "Tiled pages"):
     * c8[l] = round(cent[l] / c8_scale), |c8| <= 127 (the extremes are
     * +-127), and c8u[l] = c8[l] + 128 (unsigned, for the key dot products);
     * entries l >= levels are 0 / 128 */
    int8_t c8[16];
    uint8_t c8u[16];
    float c8_scale;
    kvq__tq_ncode ns; /* scale code (norm=8) */
    kvq__tq_ncode nr; /* tqp residual norm code (norm=8) */
} kvq__tq;

/* ---- tq_codebook.c ---- */
/* Lloyd-Max codebook with 2^bits levels (bits 1..4) for the density
 * f(x) ~ (1-x^2)^((d-3)/2) on [-1, 1] (d >= 2), or evenly spaced levels on
 * [-1, 1] for d = 1. Fills cent[2^bits] and thr[2^bits - 1], both
 * ascending. Returns the number of Lloyd iterations, or -1 if it did not
 * converge (the result is still usable). Deterministic. */
int kvq__tq_lloyd_max(size_t d, int bits, double *cent, double *thr);
/* E||u - Q(u)||^2 for a uniform random unit u in R^d quantized coordinate-
 * wise with the codebook (d times the per-coordinate distortion). */
double kvq__tq_codebook_distortion(size_t d, int bits, const double *cent, const double *thr);

/* ---- tq_rotate.c ---- */
/* Fills t->sflip (pow2 d) or t->rot (other d) from seed; t->skm from the
 * sketch seed when t->sketch. */
kvq_status kvq__tq_rotation_init(const kvq_allocator *al, kvq__tq *t, size_t d, uint64_t seed);
/* The sketch seed derived from the codec seed. */
#define KVQ__TQ_SKETCH_SEED(seed) ((seed) ^ 0x9e3779b97f4a7c15ull)

static inline float kvq__tq_reduce8(const float *s) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
/* In-place unnormalized Walsh-Hadamard transform, d a power of two. */
void kvq__tq_fwht(float *x, size_t d);
/* y = M x with lane sums and kvq__tq_reduce8 per row (M d x d row-major). */
void kvq__tq_matvec(const float *m, size_t d, float *y, const float *x);
/* y = M^T z: y[j] = sum_i z[i] * M[i][j], accumulated in increasing i. */
void kvq__tq_matvec_t(const float *m, size_t d, float *y, const float *z);
/* y = R x (normalized). */
void kvq__tq_rotate(const kvq__tq *t, size_t d, float *y, const float *x);
/* out += R^T z. z is clobbered. */
void kvq__tq_unrotate_add(const kvq__tq *t, size_t d, float *out, float *z);

/* ---- score lookup tables of the AVX2 path ----
 * A field is C consecutive coordinates whose indices form F = C * kb bits of
 * the packed area; the table of a field has 2^F floats, entry v = sum over
 * its coordinates i of q'_i * c[(v >> (i * kb)) & (levels-1)]. The tables
 * follow the rotated (and sketched) query in the prepared query. */
static inline int kvq__tq_lut_coords(int kb) { return kb == 1 ? 8 : kb == 4 ? 1 : 2; }
static inline size_t kvq__tq_lut_floats(int kb, size_t d) {
    int cpf = kvq__tq_lut_coords(kb);
    return (d / (size_t)cpf) << (cpf * kb);
}

/* tq4 int16 score: codebook and query codes are at most this in magnitude,
 * so 128 products sum without overflow in an int32 lane:
 * 128 * 8191 * 8191 < 2^31. */
#define KVQ__TQ_C16_MAX 8191

/* ---- tiled pages (layout and bound: tq.c, "Tiled pages") ----
 * A page of P tokens is [norms: P * nb bytes][units]; a unit holds the
 * indices of 64 slots in 8 * kb bytes, as planes of f-bit fields (f = 4:
 * tq4; 2 then 1: tq3, low 2 bits then bit 2; 2: tq2; 1: tq1). In a plane of
 * f-bit fields (8 f bytes), slot s is bits [f (s / 8f), + f) of byte s % 8f.
 * K: unit (i / 16) * (d / 4) + j / 4, slot 4 (i % 16) + j % 4;
 * V: unit (i / 4) * (d / 16) + j / 16, slot 4 (j % 16) + i % 4
 * (token i, dimension j). */
static inline int kvq__tq_tiled_ok(const kvq_codec *c, const kvq__tq *t, size_t P) {
    return !t->sketch && c->d % 16 == 0 && P > 0 && P % 16 == 0;
}
/* Prepared query of the tiled score (c->tqp_bytes, 64-byte aligned):
 * header, then the d int8 query codes at KVQ__TQ_TQ_CODES. The score of a
 * key with norm n and index codes c8u[idx_j] is
 * n * sc * (sum_j code_j c8u[idx_j] - corr). */
typedef struct kvq__tq_tqh {
    float sc;     /* query scale times c8_scale */
    int32_t corr; /* 128 * sum_j code_j (AVX-512; AVX2: kvq__tq_tqh2, tq_avx2.h) */
} kvq__tq_tqh;
#define KVQ__TQ_TQ_CODES 64
/* Query code bound: 127 where the dot product is vpdpbusd (int32 sums),
 * 63 where it is vpmaddubsw (int16 pair sums: 2 * 255 * 63 < 2^15). Weight
 * code bound of the tiled accumulate: 255 with vpdpbusd, 127 with
 * vpmaddubsw (2 * 127 * 127 < 2^15). */
#define KVQ__TQ_Q_VNNI 127
#define KVQ__TQ_Q_MADD 63
#define KVQ__TQ_W_VNNI 255
#define KVQ__TQ_W_MADD 127
/* Rows of a tiled V page whose weighted norms w_k n_k are not all finite
 * and >= 0 go through this exact path for tokens k0..k0+n-1 (tget + the
 * reference accumulate, token by token); acc and w are that row's. */
void kvq__tq_taccum_exact(const kvq_codec *c, float *acc, const float *w, const uint8_t *page,
                          size_t P, size_t k0, size_t n);
/* tq_avx2.c, shared with tq_avx512.c: the tiled query preparation with
 * query codes within +-qmax, and the weight quantization of one row of n
 * tokens (n a multiple of 16): a_k = w_k nrm_k, m = max a,
 * code_k = round((a_k ps) (wmax / (m ps))) (nearest even; ps = 2^100 when
 * m < 2^-100, else 1), *scale = (m ps / wmax) / ps. Returns 0 (nothing
 * written) when some a_k is negative, infinite or NaN. The query codes
 * follow the same rule with |q_j| for a_k and qmax for wmax. */
void kvq__tq_tprep_q(const kvq_codec *c, void *qp, const float *q, int qmax);
/* Norms (decoded) of tokens k0..k0+n-1 (n a multiple of 8) of a tiled page. */
void kvq__tq_tnorms(const kvq__tq *t, const uint8_t *page, size_t k0, size_t n, float *out);
/* taccum_run (tq_avx2.c, tq_avx512.c) takes the np * P tokens of a run of
 * tiled V pages page after page, in segments of up to 256 tokens (one
 * weight scale per row and segment). A piece is a page of the run, or its
 * part in one segment: tokens k0..k0 + 4 nquad - 1 of page pg. */
typedef struct kvq__tq_tpiece {
    const uint8_t *page, *units; /* units: those of the piece's first quad */
    size_t pg, k0, nquad;
} kvq__tq_tpiece;
#define KVQ__TQ_TPIECES 16 /* pieces of a segment at most: 256 / 16 */
/* Fills pc with the pieces of tokens s0..s0+sn-1 of the run (s0, sn
 * multiples of 16, sn <= 256; qb: bytes of a quad's units) and nrm[0..sn)
 * with their norms; returns the number of pieces. */
size_t kvq__tq_tpieces(const kvq__tq *t, const uint8_t *const *pages, size_t P, size_t qb, size_t s0,
                       size_t sn, kvq__tq_tpiece *pc, float *nrm);
/* One piece: tokens k0..k0 + kn - 1 of page pg of the run (at page), its
 * norms into nrm. Inline: with a run of one page (taccum) the kernels'
 * loops see one piece as a constant. */
static inline void kvq__tq_tpiece_set(const kvq__tq *t, const uint8_t *page, size_t pg, size_t P,
                                      size_t qb, size_t k0, size_t kn, kvq__tq_tpiece *pc,
                                      float *nrm) {
    pc->page = page;
    pc->units = page + P * t->nb + (k0 / 4) * qb;
    pc->pg = pg;
    pc->k0 = k0;
    pc->nquad = kn / 4;
    kvq__tq_tnorms(t, page, k0, kn, nrm);
}
/* The exact path (kvq__tq_taccum_exact) of one row over the pieces; w is
 * the row's weights of the whole run (page pg's at w + pg * P). */
void kvq__tq_tpieces_exact(const kvq_codec *c, float *acc, const float *w, const kvq__tq_tpiece *pc,
                           size_t npc, size_t P);
int kvq__tq_wquant(const float *w, const float *nrm, size_t n, int wmax, uint8_t *code, float *scale);
/* tq_avx2.c: qr (32-byte aligned, d floats) = R q, bit-identical to
 * kvq__tq_rotate (used by the tiled query preparation of AVX2 and AVX-512). */
void kvq__tq_rotate_avx2(const kvq_codec *c, float *qr, const float *q);

/* ---- tq.c ---- */
#define KVQ__TQ_XTAB_FLOATS 2048
/* Fills t->xtab from t->cent for t->kb. */
void kvq__tq_xtab_fill(kvq__tq *t);
/* Scalar encoder of one vector; the AVX2 encoder falls back to it for
 * vectors whose norm is outside its fast range. */
void kvq__tq_encode_one(const kvq_codec *c, uint8_t *dst, const float *x);

/* ---- stored norms ---- */
/* Sum of 8 float lanes in double as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
 * (the order of the AVX2 reduction; the first level is exact). */
static inline double kvq__tq_lanes_sum(const float *s) {
    double a0 = (double)s[0] + s[4], a1 = (double)s[1] + s[5];
    double a2 = (double)s[2] + s[6], a3 = (double)s[3] + s[7];
    return (a0 + a2) + (a1 + a3);
}

/* Writes norm s >= 0 (double, may exceed the float range) in t's norm
 * format; returns the value the stored bytes decode to. */
static inline float kvq__tq_put_norm(const kvq__tq *t, const kvq__tq_ncode *nc, uint8_t *p,
                                     double s) {
    if (t->nb == 2) {
        float f = s >= 65504.0 ? 65504.0f : (float)s;
        uint16_t h = kvq__f16_from_f32(f);
        kvq__st16(p, h);
        return kvq__f16_to_f32(h);
    }
    int code = 0;
    if (s > 0.0) {
        double l = log2(s);
        if (l >= (double)nc->lo - 1.0) { /* below that, 0 is the nearer value */
            double k = 1.0 + floor((l - nc->lo) * 254.0 / ((double)nc->hi - nc->lo) + 0.5);
            code = k < 1.0 ? 1 : k > 255.0 ? 255 : (int)k;
        }
    }
    p[0] = (uint8_t)code;
    return nc->tab[code];
}

static inline float kvq__tq_get_norm(const kvq__tq *t, const kvq__tq_ncode *nc, const uint8_t *p) {
    return t->nb == 2 ? kvq__f16_to_f32(kvq__ld16(p)) : nc->tab[p[0]];
}

/* b-bit index j of a packed area (b in 1..4; indices never straddle in a
 * way that needs more than two bytes). */
static inline unsigned kvq__tq_get_idx(const uint8_t *p, size_t j, int b) {
    size_t bit = j * (size_t)b;
    unsigned w = p[bit >> 3];
    if ((bit & 7) + (size_t)b > 8)
        w |= (unsigned)p[(bit >> 3) + 1] << 8;
    return (w >> (bit & 7)) & ((1u << b) - 1u);
}

#endif
