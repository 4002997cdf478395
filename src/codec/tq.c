/*
 * tq.c - the TurboQuant family: tq1..tq4 (TurboQuant-MSE) and tqp2..tqp4
 * (TurboQuant-prod, tq(b-1) plus a 1-bit QJL sketch of the residual), with
 * the scalar reference kernels, the stored-norm codes and the fit/state hooks.
 *
 * tq (b index bits), per vector of d floats:
 *   gamma = ||x||, u = R x / gamma, idx_j = Lloyd-Max cell of u_j, and the
 *   scale gamma / ||c|| with nc=1 (c = the chosen centroids; the decoded
 *   rotated vector then has norm gamma) or gamma with nc=0.
 *   decode: x_hat = scale * R^T c[idx]. A zero vector stores all zero bytes.
 * tqp (b total bits = b-1 index bits + 1 sketch bit), in the rotated domain:
 *   r' = R x - scale * c[idx] (the rotated residual, ||r'|| = ||r||), store
 *   ||r'|| and sign(S r'); S is Gaussian, so S R is too and this is the QJL
 *   sketch of r with matrix S R.
 *   decode: x_hat = R^T (scale c[idx] + ||r'|| sqrt(pi/2)/d S^T sign).
 *   <q, x_hat> is an unbiased estimate of <q, x> over the draw of S.
 *
 * Byte layout of one vector (N = 2 with norm=16: fp16 little-endian, N = 1
 * with norm=8: log2 code, see kvq__tq_put_norm):
 *   tq:  [scale: N][indices: ceil(d*b/8)]
 *   tqp: [scale: N][indices: ceil(d*(b-1)/8)][residual norm: N][signs: ceil(d/8)]
 * Index j occupies bits [j*k, j*k+k) of the index area (bit i of the area is
 * bit i%8 of byte i/8), k the index bits; indices are ascending cells (0 =
 * the most negative centroid). Sign bit j is bit j%8 of byte j/8, 1 when
 * (S r')_j >= 0. Unused high bits of the last byte are 0.
 *
 * Quantization rule (defines ties): with H = 2^(k-1) and positive thresholds
 * tau_1 < ... < tau_{H-1}, n = #{i : |u_j| >= tau_i}; idx = H + n when u_j's
 * sign bit is clear, else H - 1 - n.
 *
 * norm=8 code of a norm s over [lo, hi] (log2 units; default [-10, 10],
 * kvq_codec_fit sets it from sample norms plus a margin, the state saves
 * it): 0 when s < 2^(lo-1), else clamp(1 + round((log2 s - lo) * 254 /
 * (hi - lo)), 1, 255); code k >= 1 decodes to 2^(lo + (k-1) (hi-lo) / 254).
 * tqp has a second range for the residual norm.
 *
 * Tiled pages (codec_impl.h; tq1..tq4 with head_dim % 16 == 0 and P % 16
 * == 0, both roles; tqp and other sizes keep the row layout). A page of P
 * tokens is the same P * bytes:
 *   [norms: P * N bytes, token i's stored scale at i * N][units]
 * A unit holds the indices of 64 slots in 8 b bytes, as planes of f-bit
 * fields: tq4 one plane of nibbles (32 bytes); tq3 a plane of the low 2 bits
 * (16 bytes) then a plane of bit 2 (8 bytes); tq2 one 2-bit plane; tq1 one
 * 1-bit plane. In a plane of f-bit fields (8 f bytes) slot s is bits
 * [f (s / 8f), f (s / 8f) + f) of byte s % 8f: a shift per 64-bit lane and
 * a mask take 32 or 64 consecutive slots out to one byte each.
 *   K: unit (i / 16) * (d / 4) + j / 4, slot 4 (i % 16) + j % 4: a 32-bit
 *      lane of the decoded unit is one token's 4 consecutive dimensions,
 *      the 16 tokens of a block are 16 lanes, a block's units are
 *      contiguous;
 *   V: unit (i / 4) * (d / 16) + j / 16, slot 4 (j % 16) + i % 4: a 32-bit
 *      lane is one dimension of 4 consecutive tokens, 16 dimensions per
 *      unit, a quad's units are contiguous
 * (token i, dimension j).
 *
 * Tiled kernels (tq_avx2.c, tq_avx512.c) work on integers: the centroids as
 * int8 codes c8 = round(c / s_c), s_c = max|c| / 127 (t->c8; the extremes
 * are exact), looked up with vpshufb from a 16-byte table held in a
 * register. The AVX2 kernels take them as codes of at most 63, s_c =
 * max|c| / 63, so that two vpmaddubsw results add in int16 (tq_avx2.h);
 * the bounds below hold with that s_c (the max|c| / 254 terms become
 * max|c| / 126), and their prepared query has its own header.
 *   tscore: tprep rotates the query (q = R q_in, as prep) and rounds it to
 *   int8 codes a_j = round(q_j / s_q), s_q = max_j |q_j| / Q (Q = 127 where
 *   the dot product is vpdpbusd, 63 where it is vpmaddubsw, whose int16
 *   pair sums must not saturate); the score of key k is
 *   n_k s_q s_c sum_j a_j c8[idx_kj], an exact integer sum (vpdpbusd /
 *   vpmaddubsw of the unsigned codes c8 + 128 with the query codes, the
 *   bias 128 sum_j a_j removed) times two float roundings. Against the
 *   reference n_k sum_j q_j c[idx_kj]:
 *     |err| <= n_k (s_q / 2 sum_j |c^_kj| + s_c / 2 sum_j |q_j|) + 2u |score|
 *   (c^ = c8 s_c, u = 2^-24), below n_k ||q|| sqrt(d) (||c^_k|| / (2 Q) +
 *   max|c| / 254). That worst case needs every rounding to line up; as
 *   independent roundings the query codes add a variance of about
 *   n_k^2 max|q|^2 / (12 Q^2) to a score (d = 128 and a Gaussian-like
 *   rotated query: ~1e-3 n ||q|| rms with Q = 63, against tq4's own
 *   ~8e-3 and tq3's ~1.6e-2).
 *   taccum: per query row and segment of up to 256 tokens of the page,
 *   a_k = w_k n_k (as the reference's w * scale) is rounded to u8 codes
 *   round(a_k / s_w), s_w = max_k a_k / W (W = 255 with vpdpbusd, 127 with
 *   vpmaddubsw); dimension j of the rotated accumulator gets
 *   s_w s_c sum_k code_k c8[idx_kj] (exact integer sum, one FMA). Against
 *   the reference sum_k a_k c[idx_kj]:
 *     |err| <= s_w / 2 sum_k |c^_kj| + s_c / 2 sum_k a_k + u |acc|
 *   i.e. at most (P max_k a_k / (2 W) + sum_k a_k / 254) max|c|. A row
 *   whose a_k are not all finite and >= 0 (softmax weights always are)
 *   takes an exact path instead: tget and the reference accumulate.
 *   taccum_run: the same over a run of np pages, its np * P tokens taken
 *   page after page in segments of up to 256 tokens (taccum is the run of
 *   one page): per row and segment one s_w (over the tokens of every page
 *   in it), one conversion and one FMA; the bound above holds per segment
 *   with P its length, the exact path per row and segment. The int32 sum
 *   of a dimension over a segment is below 256 * 255 * 127 < 2^23
 *   (vpdpbusd) or 256 * 127 * 127 < 2^22 (vpmaddubsw, whose int16 pair
 *   sums stay within 2 * 127 * 127 < 2^15) for any run length: it cannot
 *   overflow, and its conversion to float is exact.
 * A query or weight row whose largest value is below 2^-100 is multiplied
 * by 2^100 (exactly) before its codes are taken, so that Q / max stays
 * finite; its float scale may then be subnormal, which adds an absolute
 * 2^-150 per unit of n |integer sum| (2^-150 |integer sum| for taccum) to
 * the bounds above.
 * tests/test_tile_tq.c checks both bounds on every path and that each
 * kernel equals an emulation of its integer arithmetic up to its float
 * roundings.
 */
#include "tq_impl.h"

#include <stdio.h>

#define KVQ__TQ_LOG_LO (-10.0f)
#define KVQ__TQ_LOG_HI 10.0f
#define KVQ__TQ_LOG_MIN (-120.0f) /* accepted range of lo/hi: decoded norms stay */
#define KVQ__TQ_LOG_MAX 100.0f    /* far from float under/overflow */

static inline float kvq__tq_flipf(float v, uint32_t f) { return kvq__bits_f32(kvq__f32_bits(v) ^ f); }

static void kvq__tq_ncode_set(kvq__tq_ncode *nc, float lo, float hi) {
    nc->lo = lo;
    nc->hi = hi;
    nc->tab[0] = 0.0f;
    for (int k = 1; k < 256; k++)
        nc->tab[k] = (float)exp2((double)lo + (double)(k - 1) * ((double)hi - lo) / 254.0);
}

/* Fills u[0..d) = R x / ||x|| and *gamma = ||x||; returns 0 for a zero
 * vector. The fast range test and arithmetic are mirrored by the AVX2
 * encoder, which calls this whole encoder outside that range. */
static int kvq__tq_unit(const kvq__tq *t, size_t d, const float *x, float *u, double *gamma) {
    float s[8] = {0};
    for (size_t j = 0; j < d; j++)
        s[j & 7] += x[j] * x[j];
    double g2 = kvq__tq_lanes_sum(s), g, p = 1.0;
    const float *src = x;
    float xs[KVQ__MAX_HEAD_DIM];
    if (g2 >= 0x1p-100 && g2 <= 0x1p100) {
        g = sqrt(g2);
    } else {
        /* huge or tiny: exact norm in double, rotate x scaled by a power of 2 */
        double a = 0.0;
        for (size_t j = 0; j < d; j++)
            a += (double)x[j] * (double)x[j];
        g = sqrt(a);
        if (g == 0.0)
            return 0;
        p = ldexp(1.0, -ilogb(g));
        for (size_t j = 0; j < d; j++)
            xs[j] = (float)((double)x[j] * p);
        src = xs;
    }
    float inv;
    if (t->pow2) {
        for (size_t j = 0; j < d; j++)
            u[j] = kvq__tq_flipf(src[j], t->sflip[j]);
        kvq__tq_fwht(u, d);
        inv = (float)(1.0 / (sqrt((double)d) * (g * p)));
    } else {
        kvq__tq_matvec(t->rot, d, u, src);
        inv = (float)(1.0 / (g * p));
    }
    for (size_t j = 0; j < d; j++)
        u[j] *= inv;
    *gamma = g;
    return 1;
}

/* The encoder; scale_out / rnorm_out (may be NULL) get the norms before they
 * are rounded to the stored format (kvq_codec_fit uses them). */
static void kvq__tq_encode_impl(const kvq_codec *c, uint8_t *dst, const float *x, double *scale_out,
                                double *rnorm_out) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    const int kb = t->kb, h = t->levels / 2;
    float u[KVQ__MAX_HEAD_DIM], cv[KVQ__MAX_HEAD_DIM];
    double gamma;
    memset(dst, 0, c->bytes);
    if (!kvq__tq_unit(t, d, x, u, &gamma)) {
        if (scale_out)
            *scale_out = 0.0;
        if (rnorm_out)
            *rnorm_out = 0.0;
        return;
    }
    uint8_t *ix = dst + t->off_idx;
    uint64_t cs = 0;
    for (size_t j = 0; j < d; j++) {
        float a = fabsf(u[j]);
        int n = 0;
        for (int i = 0; i + 1 < h; i++)
            n += a >= t->pthr[i];
        int neg = signbit(u[j]) != 0;
        unsigned idx = neg ? (unsigned)(h - 1 - n) : (unsigned)(h + n);
        cs += (uint64_t)t->msq_fx[n];
        cv[j] = neg ? -t->mag[n] : t->mag[n];
        size_t bit = j * (size_t)kb;
        ix[bit >> 3] |= (uint8_t)(idx << (bit & 7));
        if ((bit & 7) + (size_t)kb > 8)
            ix[(bit >> 3) + 1] |= (uint8_t)(idx >> (8 - (bit & 7)));
    }
    double scale = c->nc ? gamma / sqrt((double)cs * t->msq_unit) : gamma;
    float sq = kvq__tq_put_norm(t, &t->ns, dst, scale);
    if (scale_out)
        *scale_out = scale;
    if (!t->sketch)
        return;
    float rho = (float)((double)sq / gamma), rl[8] = {0};
    for (size_t j = 0; j < d; j++) {
        u[j] = u[j] - rho * cv[j]; /* u now holds the rotated residual / gamma */
        rl[j & 7] += u[j] * u[j];
    }
    double rn = gamma * sqrt(kvq__tq_lanes_sum(rl));
    kvq__tq_put_norm(t, &t->nr, dst + t->off_rnorm, rn);
    if (rnorm_out)
        *rnorm_out = rn;
    kvq__tq_matvec(t->skm, d, cv, u);
    uint8_t *sg = dst + t->off_sign;
    for (size_t i = 0; i < d; i++)
        sg[i >> 3] |= (uint8_t)((cv[i] >= 0.0f) << (i & 7));
}

void kvq__tq_encode_one(const kvq_codec *c, uint8_t *dst, const float *x) {
    kvq__tq_encode_impl(c, dst, x, NULL, NULL);
}

static void kvq__tq_encode(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++)
        kvq__tq_encode_impl(c, dst + i * c->bytes, src + i * c->d, NULL, NULL);
}

/* sum_i sigma_i S[i][:] into t (sigma = +-1 from the sign bits). */
static void kvq__tq_sketch_t_signs(const kvq__tq *t, size_t d, float *out, const uint8_t *sg) {
    for (size_t j = 0; j < d; j++)
        out[j] = 0.0f;
    for (size_t i = 0; i < d; i++) {
        const float *row = t->skm + i * d;
        if ((sg[i >> 3] >> (i & 7)) & 1)
            for (size_t j = 0; j < d; j++)
                out[j] += row[j];
        else
            for (size_t j = 0; j < d; j++)
                out[j] -= row[j];
    }
}

static void kvq__tq_decode(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    float z[KVQ__MAX_HEAD_DIM], tmp[KVQ__MAX_HEAD_DIM];
    for (size_t v = 0; v < n; v++) {
        const uint8_t *p = src + v * c->bytes;
        float *x = dst + v * d;
        float scale = kvq__tq_get_norm(t, &t->ns, p);
        for (size_t j = 0; j < d; j++)
            z[j] = t->cent[kvq__tq_get_idx(p + t->off_idx, j, t->kb)];
        if (t->sketch) {
            float kappa = kvq__tq_get_norm(t, &t->nr, p + t->off_rnorm) * t->sk_scale;
            kvq__tq_sketch_t_signs(t, d, tmp, p + t->off_sign);
            for (size_t j = 0; j < d; j++)
                z[j] = scale * z[j] + kappa * tmp[j];
            scale = 1.0f;
        }
        if (t->pow2) {
            kvq__tq_fwht(z, d);
            float f = scale * t->rs;
            for (size_t j = 0; j < d; j++)
                x[j] = kvq__tq_flipf(z[j] * f, t->sflip[j]);
        } else {
            kvq__tq_matvec_t(t->rot, d, x, z);
            for (size_t j = 0; j < d; j++)
                x[j] *= scale;
        }
    }
}

/* qp: [R q: d floats][tqp: S R q at byte offset round64(4d)]; the AVX2
 * path adds its lookup tables after these. */
static void kvq__tq_prep(const kvq_codec *c, void *qp, const float *q) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    float *qr = (float *)qp;
    kvq__tq_rotate(t, c->d, qr, q);
    if (t->sketch)
        kvq__tq_matvec(t->skm, c->d, qr + kvq__round64(c->d * 4) / 4, qr);
}

static void kvq__tq_score(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                          size_t nq, const uint8_t *keys, size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, qs = c->qp_bytes / 4, so = kvq__round64(d * 4) / 4;
    for (size_t k = 0; k < n; k++) {
        const uint8_t *p = keys + k * c->bytes;
        float scale = kvq__tq_get_norm(t, &t->ns, p);
        float kappa = t->sketch ? kvq__tq_get_norm(t, &t->nr, p + t->off_rnorm) * t->sk_scale : 0;
        for (size_t i = 0; i < nq; i++) {
            const float *q = (const float *)qp + i * qs;
            float s = 0.0f;
            for (size_t j = 0; j < d; j++)
                s += q[j] * t->cent[kvq__tq_get_idx(p + t->off_idx, j, t->kb)];
            s *= scale;
            if (t->sketch) {
                const float *sq = q + so;
                const uint8_t *sg = p + t->off_sign;
                float s2 = 0.0f;
                for (size_t j = 0; j < d; j++)
                    s2 += ((sg[j >> 3] >> (j & 7)) & 1) ? sq[j] : -sq[j];
                s += kappa * s2;
            }
            out[i * ostride + k] = s;
        }
    }
}

/* acc row: [rotated part: d][tqp: sketch part: d, sum of w * ||r'|| * sign] */
static void kvq__tq_accum(const kvq_codec *c, float *acc, size_t astride, const float *w,
                          size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    float z[KVQ__MAX_HEAD_DIM];
    for (size_t k = 0; k < n; k++) {
        const uint8_t *p = vals + k * c->bytes;
        float scale = kvq__tq_get_norm(t, &t->ns, p);
        float rn = t->sketch ? kvq__tq_get_norm(t, &t->nr, p + t->off_rnorm) : 0.0f;
        for (size_t j = 0; j < d; j++)
            z[j] = t->cent[kvq__tq_get_idx(p + t->off_idx, j, t->kb)];
        for (size_t i = 0; i < nq; i++) {
            float *a = acc + i * astride;
            float wk = w[i * wstride + k], ws = wk * scale;
            for (size_t j = 0; j < d; j++)
                a[j] += ws * z[j];
            if (t->sketch) {
                float wr = wk * rn;
                const uint8_t *sg = p + t->off_sign;
                for (size_t j = 0; j < d; j++)
                    a[d + j] += ((sg[j >> 3] >> (j & 7)) & 1) ? wr : -wr;
            }
        }
    }
}

static void kvq__tq_finish(const kvq_codec *c, float *out, const float *acc) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d;
    float z[KVQ__MAX_HEAD_DIM], tmp[KVQ__MAX_HEAD_DIM];
    memcpy(z, acc, d * sizeof(float));
    if (t->sketch) {
        kvq__tq_matvec_t(t->skm, d, tmp, acc + d);
        for (size_t j = 0; j < d; j++)
            z[j] += t->sk_scale * tmp[j];
    }
    kvq__tq_unrotate_add(t, d, out, z);
}

/* ---- tiled pages ---- */

static int kvq__tq_tiled(const kvq_codec *c, int role, size_t P) {
    (void)role;
    return kvq__tq_tiled_ok(c, (const kvq__tq *)c->state, P);
}

/* The d indices of a row's index area, one per byte, and back. */
static void kvq__tq_unpack_idx(const uint8_t *ix, size_t d, int kb, uint8_t *v) {
    switch (kb) {
    case 4:
        for (size_t b = 0; b < d / 2; b++) {
            v[2 * b] = ix[b] & 15u;
            v[2 * b + 1] = ix[b] >> 4;
        }
        break;
    case 3:
        for (size_t b = 0; b < d / 8; b++) { /* 8 indices in 3 bytes */
            uint32_t w = ix[3 * b] | (uint32_t)ix[3 * b + 1] << 8 | (uint32_t)ix[3 * b + 2] << 16;
            for (int k = 0; k < 8; k++)
                v[8 * b + k] = (uint8_t)((w >> (3 * k)) & 7u);
        }
        break;
    case 2:
        for (size_t b = 0; b < d / 4; b++)
            for (int k = 0; k < 4; k++)
                v[4 * b + k] = (ix[b] >> (2 * k)) & 3u;
        break;
    default:
        for (size_t b = 0; b < d / 8; b++)
            for (int k = 0; k < 8; k++)
                v[8 * b + k] = (ix[b] >> k) & 1u;
        break;
    }
}

static void kvq__tq_pack_idx(const uint8_t *v, size_t d, int kb, uint8_t *ix) {
    switch (kb) {
    case 4:
        for (size_t b = 0; b < d / 2; b++)
            ix[b] = (uint8_t)(v[2 * b] | v[2 * b + 1] << 4);
        break;
    case 3:
        for (size_t b = 0; b < d / 8; b++) {
            uint32_t w = 0;
            for (int k = 0; k < 8; k++)
                w |= (uint32_t)v[8 * b + k] << (3 * k);
            ix[3 * b] = (uint8_t)w;
            ix[3 * b + 1] = (uint8_t)(w >> 8);
            ix[3 * b + 2] = (uint8_t)(w >> 16);
        }
        break;
    default:
        memset(ix, 0, (d * (size_t)kb + 7) / 8);
        for (size_t j = 0; j < d; j++)
            ix[(j * (size_t)kb) >> 3] |= (uint8_t)(v[j] << ((j * (size_t)kb) & 7));
        break;
    }
}

static inline uint32_t kvq__tq_ld32u(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

static inline void kvq__tq_st32u(uint8_t *p, uint32_t w) { memcpy(p, &w, 4); }

/* Token i's fields in a tiled page (tq_impl.h), plane by plane: tq3 has a
 * plane of the low 2 bits (f = 2 at unit byte 0) and one of bit 2 (f = 1
 * at byte 16), other codecs one plane of f = kb bits. In a plane of f-bit
 * fields:
 *  K: the 4 dimensions of unit u are 4 consecutive bytes from
 *     4 (i % 2f), at shift f ((i % 16) / 2f): one 32-bit word per unit;
 *  V: byte 4k + i % 4 of the plane (k < 2f) holds, at shift f m, the field
 *     of dimension k + 2f m of the unit (m < 8 / f): whole bytes.
 * The indices move through one byte per index (v, d of them); bytes hold
 * up to 4 bits, so 32-bit words move 4 fields at once. */
#define KVQ__TQ_AI static inline __attribute__((always_inline))

/* One plane (f-bit fields of the index bits from dsh, at unit byte off) of
 * token i: put (get = 0) or get (get = 1; p0: the first plane, stores
 * instead of or-ing). Inlined with constant f, dsh, role. */
KVQ__TQ_AI void kvq__tq_tplane(uint8_t *units, size_t ub, size_t d, size_t i, uint8_t *v, int role,
                               const unsigned f, const unsigned dsh, const size_t off, const int get,
                               const int p0) {
    const unsigned fm = (1u << f) - 1u;
    const uint32_t m4 = fm * 0x01010101u;
    if (role == KVQ__ROLE_K) {
        const unsigned sh = f * (unsigned)((i % 16) / (2 * f));
        uint8_t *un = units + (i / 16) * (d / 4) * ub + off + 4 * (i % (2 * f));
        for (size_t u = 0; u < d / 4; u++, un += ub) {
            if (get) {
                uint32_t val = ((kvq__tq_ld32u(un) >> sh) & m4) << dsh;
                kvq__tq_st32u(v + 4 * u, p0 ? val : kvq__tq_ld32u(v + 4 * u) | val);
            } else {
                uint32_t val = (kvq__tq_ld32u(v + 4 * u) >> dsh) & m4;
                kvq__tq_st32u(un, (kvq__tq_ld32u(un) & ~(m4 << sh)) | val << sh);
            }
        }
        return;
    }
    uint8_t *un = units + (i / 4) * (d / 16) * ub + off + i % 4;
    for (size_t h = 0; h < d / 16; h++, un += ub) {
        uint8_t *vh = v + 16 * h;
        for (unsigned k = 0; k < 2 * f; k++) {
            if (get) {
                const unsigned b = un[4 * k];
                for (unsigned m = 0; m < 8 / f; m++) {
                    uint8_t x = (uint8_t)(((b >> (f * m)) & fm) << dsh);
                    vh[k + 2 * f * m] = p0 ? x : (uint8_t)(vh[k + 2 * f * m] | x);
                }
            } else {
                unsigned b = 0;
                for (unsigned m = 0; m < 8 / f; m++)
                    b |= ((unsigned)(vh[k + 2 * f * m] >> dsh) & fm) << (f * m);
                un[4 * k] = (uint8_t)b;
            }
        }
    }
}

/* Token i's fields in a tiled page (tq_impl.h), plane by plane: tq3 has a
 * plane of the low 2 bits (f = 2 at unit byte 0) and one of bit 2 (f = 1
 * at byte 16), other codecs one plane of f = kb bits. In a plane of f-bit
 * fields:
 *  K: the 4 dimensions of unit u are 4 consecutive bytes from
 *     4 (i % 2f), at shift f ((i % 16) / 2f): one 32-bit word per unit;
 *  V: byte 4k + i % 4 of the plane (k < 2f) holds, at shift f m, the field
 *     of dimension k + 2f m of the unit (m < 8 / f): whole bytes.
 * The indices move through one byte per index (v, d of them); bytes hold
 * up to 4 bits, so 32-bit words move 4 fields at once. */
static void kvq__tq_tmove(const kvq_codec *c, int role, size_t P, uint8_t *page, size_t i, uint8_t *v,
                          int get) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t ub = 8 * (size_t)t->kb, d = c->d;
    uint8_t *units = page + P * t->nb;
    switch (t->kb) {
    case 4:
        if (get)
            kvq__tq_tplane(units, ub, d, i, v, role, 4, 0, 0, 1, 1);
        else
            kvq__tq_tplane(units, ub, d, i, v, role, 4, 0, 0, 0, 0);
        break;
    case 3:
        if (get) {
            kvq__tq_tplane(units, ub, d, i, v, role, 2, 0, 0, 1, 1);
            kvq__tq_tplane(units, ub, d, i, v, role, 1, 2, 16, 1, 0);
        } else {
            kvq__tq_tplane(units, ub, d, i, v, role, 2, 0, 0, 0, 0);
            kvq__tq_tplane(units, ub, d, i, v, role, 1, 2, 16, 0, 0);
        }
        break;
    case 2:
        if (get)
            kvq__tq_tplane(units, ub, d, i, v, role, 2, 0, 0, 1, 1);
        else
            kvq__tq_tplane(units, ub, d, i, v, role, 2, 0, 0, 0, 0);
        break;
    default:
        if (get)
            kvq__tq_tplane(units, ub, d, i, v, role, 1, 0, 0, 1, 1);
        else
            kvq__tq_tplane(units, ub, d, i, v, role, 1, 0, 0, 0, 0);
        break;
    }
}

static void kvq__tq_tput(const kvq_codec *c, int role, size_t P, uint8_t *page, size_t i,
                         const uint8_t *row) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    uint8_t v[KVQ__MAX_HEAD_DIM];
    kvq__tq_unpack_idx(row + t->off_idx, c->d, t->kb, v);
    memcpy(page + i * t->nb, row, t->nb);
    kvq__tq_tmove(c, role, P, page, i, v, 0);
}

static void kvq__tq_tget(const kvq_codec *c, int role, size_t P, const uint8_t *page, size_t i,
                         uint8_t *row) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    uint8_t v[KVQ__MAX_HEAD_DIM];
    memcpy(row, page + i * t->nb, t->nb);
    kvq__tq_tmove(c, role, P, (uint8_t *)(uintptr_t)page, i, v, 1); /* get only reads the page */
    kvq__tq_pack_idx(v, c->d, t->kb, row + t->off_idx);
}

void kvq__tq_taccum_exact(const kvq_codec *c, float *acc, const float *w, const uint8_t *page,
                          size_t P, size_t k0, size_t n) {
    uint8_t row[KVQ__MAX_HEAD_DIM + 8]; /* >= c->bytes of a tq codec (no sketch) */
    for (size_t k = k0; k < k0 + n; k++) {
        if (w[k] == 0.0f)
            continue;
        kvq__tq_tget(c, KVQ__ROLE_V, P, page, k, row);
        c->ref.accum(c, acc, 0, w + k, 0, 1, row, 1);
    }
}

static void kvq__tq_destroy(kvq_codec *c) {
    kvq__tq *t = (kvq__tq *)c->state;
    if (!t)
        return;
    kvq__free(&c->alloc, t->sflip);
    kvq__free(&c->alloc, t->rot);
    kvq__free(&c->alloc, t->skm);
    kvq__free(&c->alloc, t->xtab);
    kvq__free(&c->alloc, t);
    c->state = NULL;
}

void kvq__tq_xtab_fill(kvq__tq *t) {
    const float *c = t->cent;
    float *x = t->xtab;
    switch (t->kb) {
    case 1:
        for (unsigned b = 0; b < 256; b++)
            for (unsigned i = 0; i < 8; i++)
                x[8 * b + i] = c[(b >> i) & 1];
        break;
    case 2:
        for (unsigned b = 0; b < 256; b++)
            for (unsigned i = 0; i < 4; i++)
                x[4 * b + i] = c[(b >> (2 * i)) & 3];
        break;
    case 3:
        for (unsigned v = 0; v < 64; v++) {
            x[2 * v] = c[v & 7];
            x[2 * v + 1] = c[v >> 3];
        }
        break;
    default:
        for (unsigned b = 0; b < 256; b++) {
            x[2 * b] = c[b & 15];
            x[2 * b + 1] = c[b >> 4];
        }
        break;
    }
}

static kvq_status kvq__tq_init(kvq_codec *c, char *err, size_t err_size) {
    kvq__tq *t = (kvq__tq *)kvq__calloc(&c->alloc, sizeof *t);
    if (!t) {
        if (err && err_size)
            snprintf(err, err_size, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    c->state = t;
    const size_t d = c->d;
    t->sketch = c->family == KVQ__FAM_TQP;
    t->kb = t->sketch ? c->bits - 1 : c->bits;
    t->levels = 1 << t->kb;
    t->pow2 = (d & (d - 1)) == 0;
    t->nb = c->norm_bits == 16 ? 2 : 1;
    t->idx_bytes = (d * (size_t)t->kb + 7) / 8;
    t->off_idx = t->nb;
    c->bytes = t->nb + t->idx_bytes;
    if (t->sketch) {
        t->off_rnorm = c->bytes;
        t->off_sign = c->bytes + t->nb;
        c->bytes = t->off_sign + (d + 7) / 8;
    }
    kvq__tq_lloyd_max(d, t->kb, t->cent_d, t->thr_d);
    t->distortion = kvq__tq_codebook_distortion(d, t->kb, t->cent_d, t->thr_d);
    const int h = t->levels / 2;
    for (int k = 0; k < t->levels; k++)
        t->cent[k] = (float)t->cent_d[k];
    for (int n = 0; n < h; n++)
        t->mag[n] = t->cent[h + n];
    /* fixed point with d * max mag^2 < 2^31: an int32 lane never overflows */
    double mmax = (double)t->mag[h - 1] * t->mag[h - 1];
    int e = (int)floor(log2(2147483647.0 / ((double)d * mmax)));
    e = e > 60 ? 60 : e;
    t->msq_unit = ldexp(1.0, -e);
    for (int n = 0; n < h; n++)
        t->msq_fx[n] = (int32_t)llround(ldexp((double)t->mag[n] * t->mag[n], e));
    for (int i = 0; i + 1 < h; i++)
        t->pthr[i] = (float)t->thr_d[h + i];
    t->rs = (float)(1.0 / sqrt((double)d));
    t->sk_scale = (float)(sqrt(2.0 * atan(1.0)) / (double)d); /* sqrt(pi/2) / d */
    kvq__tq_ncode_set(&t->ns, KVQ__TQ_LOG_LO, KVQ__TQ_LOG_HI);
    kvq__tq_ncode_set(&t->nr, KVQ__TQ_LOG_LO, KVQ__TQ_LOG_HI);
    t->xtab = (float *)kvq__alloc(&c->alloc, KVQ__TQ_XTAB_FLOATS * sizeof(float));
    if (!t->xtab) {
        if (err && err_size)
            snprintf(err, err_size, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    kvq__tq_xtab_fill(t);
    if (t->kb == 4) { /* cent[15] = -cent[0] is the largest magnitude */
        double cm = fabs((double)t->cent[15]);
        t->c16_scale = cm > 0.0 ? (float)(cm / KVQ__TQ_C16_MAX) : 1.0f;
        for (int l = 0; l < 16; l++) {
            long v = lround((double)t->cent[l] / (double)t->c16_scale);
            v = v > KVQ__TQ_C16_MAX ? KVQ__TQ_C16_MAX : v < -KVQ__TQ_C16_MAX ? -KVQ__TQ_C16_MAX : v;
            uint16_t u = (uint16_t)(int16_t)v;
            t->c16lo[l] = (uint8_t)(u & 0xff);
            t->c16hi[l] = (uint8_t)(u >> 8);
        }
    }
    { /* int8 codebook of the tiled kernels; cent[levels-1] is the largest magnitude */
        double cm = fabs((double)t->cent[t->levels - 1]);
        t->c8_scale = cm > 0.0 ? (float)(cm / 127.0) : 1.0f;
        for (int l = 0; l < 16; l++) {
            long v = l < t->levels ? lround((double)t->cent[l] / (double)t->c8_scale) : 0;
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            t->c8[l] = (int8_t)v;
            t->c8u[l] = (uint8_t)(v + 128);
        }
    }
    kvq_status st = kvq__tq_rotation_init(&c->alloc, t, d, c->seed);
    if (st != KVQ_OK) {
        if (err && err_size)
            snprintf(err, err_size, "out of memory building the rotation");
        return st;
    }
    size_t q1 = kvq__round64(d * sizeof(float));
    c->qp_bytes = t->sketch ? 2 * q1 : q1;
    if (d % 8 == 0) /* room for the lookup tables of the AVX2 score */
        c->qp_bytes += kvq__round64(kvq__tq_lut_floats(t->kb, d) * sizeof(float));
    c->acc_len = t->sketch ? 2 * d : d;
    c->state_bytes = c->norm_bits == 8 ? (t->sketch ? 16 : 8) : 0;
    c->ref.encode = kvq__tq_encode;
    c->ref.decode = kvq__tq_decode;
    c->ref.prep = kvq__tq_prep;
    c->ref.score = kvq__tq_score;
    c->ref.accum = kvq__tq_accum;
    c->ref.finish = kvq__tq_finish;
    if (!t->sketch) {
        c->tiled = kvq__tq_tiled;
        c->tput = kvq__tq_tput;
        c->tget = kvq__tq_tget;
    }
    return KVQ_OK;
}

/* ---- fitted state: the log2 ranges of the 8-bit norm codes ---- */

/* [lo, hi] covering log2 of the nonzero values in [vmin, vmax] with a margin
 * of 0.1 + 5% of the spread. Returns 0 when there is no nonzero value. */
static int kvq__tq_range(double vmin, double vmax, float *lo, float *hi) {
    if (!(vmax > 0.0))
        return 0;
    double a = log2(vmin), b = log2(vmax), m = 0.1 + 0.05 * (b - a);
    a = fmax(a - m, (double)KVQ__TQ_LOG_MIN);
    b = fmin(b + m, (double)KVQ__TQ_LOG_MAX);
    if (b < a + 0.2)
        b = a + 0.2;
    *lo = (float)a;
    *hi = (float)b;
    return 1;
}

static kvq_status kvq__tq_fit(kvq_codec *c, const float *x, size_t n) {
    kvq__tq *t = (kvq__tq *)c->state;
    if (t->nb != 1)
        return KVQ_OK; /* fp16 norms need no fitting */
    uint8_t scratch[4 * KVQ__MAX_HEAD_DIM];
    float lo, hi;
    double smin = INFINITY, smax = 0.0;
    for (size_t i = 0; i < n; i++) {
        double s;
        kvq__tq_encode_impl(c, scratch, x + i * c->d, &s, NULL);
        if (s > 0.0) {
            smin = fmin(smin, s);
            smax = fmax(smax, s);
        }
    }
    if (kvq__tq_range(smin, smax, &lo, &hi))
        kvq__tq_ncode_set(&t->ns, lo, hi);
    if (t->sketch) { /* residual norms depend on the scale code just set */
        smin = INFINITY;
        smax = 0.0;
        for (size_t i = 0; i < n; i++) {
            double s;
            kvq__tq_encode_impl(c, scratch, x + i * c->d, NULL, &s);
            if (s > 0.0) {
                smin = fmin(smin, s);
                smax = fmax(smax, s);
            }
        }
        if (kvq__tq_range(smin, smax, &lo, &hi))
            kvq__tq_ncode_set(&t->nr, lo, hi);
    }
    c->fitted = 1;
    return KVQ_OK;
}

/* payload (norm=8 only): f32 lo, f32 hi of the scale code; tqp adds f32 lo,
 * f32 hi of the residual norm code. Little-endian. */
static size_t kvq__tq_state_size(const kvq_codec *c) { return c->state_bytes; }

static void kvq__tq_state_save(const kvq_codec *c, uint8_t *dst) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    if (c->state_bytes == 0)
        return;
    kvq__st32(dst, kvq__f32_bits(t->ns.lo));
    kvq__st32(dst + 4, kvq__f32_bits(t->ns.hi));
    if (t->sketch) {
        kvq__st32(dst + 8, kvq__f32_bits(t->nr.lo));
        kvq__st32(dst + 12, kvq__f32_bits(t->nr.hi));
    }
}

static int kvq__tq_range_ok(float lo, float hi) {
    return lo >= KVQ__TQ_LOG_MIN && hi <= KVQ__TQ_LOG_MAX && hi > lo; /* false for NaN */
}

static kvq_status kvq__tq_state_load(kvq_codec *c, const uint8_t *src, size_t size) {
    kvq__tq *t = (kvq__tq *)c->state;
    if (size != c->state_bytes)
        return KVQ_ERR_MISMATCH;
    if (size == 0)
        return KVQ_OK;
    float v[4];
    for (size_t i = 0; i < size / 4; i++)
        v[i] = kvq__bits_f32(kvq__ld32(src + 4 * i));
    if (!kvq__tq_range_ok(v[0], v[1]) || (t->sketch && !kvq__tq_range_ok(v[2], v[3])))
        return KVQ_ERR_CORRUPT;
    kvq__tq_ncode_set(&t->ns, v[0], v[1]);
    if (t->sketch)
        kvq__tq_ncode_set(&t->nr, v[2], v[3]);
    c->fitted = 1;
    return KVQ_OK;
}

const kvq__family_ops kvq__tq_ops = {
    .init = kvq__tq_init,
    .destroy = kvq__tq_destroy,
    .fit = kvq__tq_fit,
    .state_size = kvq__tq_state_size,
    .state_save = kvq__tq_state_save,
    .state_load = kvq__tq_state_load,
};
