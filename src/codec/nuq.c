/*
 * nuq.c - the nuq1..nuq8 codecs: non-uniform scalar quantization with a
 * separate table of L = 2^b levels for each of the d channels (in the spirit
 * of KVQuant's per-channel non-uniform key quantization). The tables are
 * fitted by 1-D Lloyd-Max (k-means) on calibration vectors and are codec
 * state (saved and loaded with kvq_codec_save_state/load_state).
 *
 * Encoded vector: for each channel t the b-bit index of the nearest level,
 * packed little-end first over the whole vector (index t occupies bits
 * [t*b, t*b + b) of the byte string, bit i of the string being bit i % 8 of
 * byte i / 8); ceil(d * b / 8) bytes, padding bits zero, nothing else.
 * State payload: d * L float32 little-endian, channel-major (channel t's
 * levels at [t * L, t * L + L)), each finite, non-decreasing within a channel.
 *
 * This file holds the scalar reference kernels, the fit and the state hooks;
 * the table layout in memory is described in nuq_impl.h.
 */
#include "nuq_impl.h"

#include <float.h>
#include <stdio.h>

/* Lloyd iterations stop when the partition no longer changes or after this
 * many rounds. */
#define KVQ__NUQ_MAX_ITERS 1000

/* ---- tables ---- */

/* The largest float not above the exact midpoint of a <= b. With "index =
 * thresholds strictly below x", a float x then goes to the upper level
 * exactly when it is nearer to it: a midpoint rounded up to the next float
 * would send that float, nearer the upper level, down. The halves are exact
 * in double (no overflow near FLT_MAX); their sum is s + e exactly (TwoSum). */
static float kvq__nuq_mid_down(float a, float b) {
    double ha = 0.5 * (double)a, hb = 0.5 * (double)b;
    double s = ha + hb, bv = s - ha;
    double e = (ha - (s - bv)) + (hb - bv);
    float f = (float)s;
    if ((double)f > s || ((double)f == s && e < 0.0))
        f = nextafterf(f, -INFINITY);
    return f;
}

/* Rebuilds thr and thr8 from lev. */
static void kvq__nuq_derive(kvq_codec *c) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    const float *lev = kvq__nuq_lev(c);
    float *thr = (float *)kvq__nuq_thr(c);
    for (size_t t = 0; t < d; t++) {
        const float *l = lev + t * L;
        for (size_t k = 0; k + 1 < L; k++)
            thr[t * L + k] = kvq__nuq_mid_down(l[k], l[k + 1]);
        thr[t * L + L - 1] = INFINITY;
    }
    if (d % 8 == 0) {
        float *thr8 = (float *)kvq__nuq_thr8(c);
        for (size_t g = 0; g < d / 8; g++)
            for (size_t k = 0; k < L; k++)
                for (size_t lane = 0; lane < 8; lane++)
                    thr8[g * 8 * L + k * 8 + lane] = thr[(g * 8 + lane) * L + k];
    }
}

/* Number of thresholds of one channel strictly below x: the index of the
 * nearest level (the lower one on an exact tie). Branchless binary search;
 * valid because thr is non-decreasing and x > thr[k] holds on a prefix. */
static inline unsigned kvq__nuq_find(const float *thr, size_t L, float x) {
    size_t pos = 0;
    for (size_t s = L >> 1; s; s >>= 1)
        pos += (x > thr[pos + s - 1]) ? s : 0;
    return (unsigned)pos;
}

/* The b-bit index of channel t in an encoded vector p. */
static inline unsigned kvq__nuq_get(const uint8_t *p, size_t t, int b) {
    size_t bit = t * (size_t)b;
    const uint8_t *q = p + (bit >> 3);
    unsigned sh = (unsigned)(bit & 7);
    unsigned v = q[0];
    if (sh + (unsigned)b > 8)
        v |= (unsigned)q[1] << 8;
    return (v >> sh) & ((1u << b) - 1u);
}

/* ---- scalar reference kernels ---- */

static void kvq__nuq_encode(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    const int b = c->bits;
    const float *thr = kvq__nuq_thr(c);
    for (size_t j = 0; j < n; j++) {
        const float *x = src + j * d;
        uint8_t *p = dst + j * c->bytes;
        uint32_t acc = 0; /* pending bits, low first; fewer than 8 between values */
        int nb = 0;
        for (size_t t = 0; t < d; t++) {
            acc |= (uint32_t)kvq__nuq_find(thr + t * L, L, x[t]) << nb;
            nb += b;
            while (nb >= 8) {
                *p++ = (uint8_t)acc;
                acc >>= 8;
                nb -= 8;
            }
        }
        if (nb > 0)
            *p = (uint8_t)acc;
    }
}

static void kvq__nuq_decode(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    const int b = c->bits;
    const float *lev = kvq__nuq_lev(c);
    for (size_t j = 0; j < n; j++) {
        const uint8_t *p = src + j * c->bytes;
        float *y = dst + j * d;
        for (size_t t = 0; t < d; t++)
            y[t] = lev[t * L + kvq__nuq_get(p, t, b)];
    }
}

void kvq__nuq_prep(const kvq_codec *c, void *qp, const float *q) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    const float *lev = kvq__nuq_lev(c);
    float *lut = (float *)qp;
    for (size_t t = 0; t < d; t++)
        for (size_t k = 0; k < L; k++)
            lut[t * L + k] = q[t] * lev[t * L + k];
    memset(lut + d * L, 0, c->qp_bytes - d * L * sizeof(float));
}

/* A score is a float sum of lut entries in four partial sums over channels
 * t mod 4, combined as (s0 + s1) + (s2 + s3) (independent chains for the
 * SIMD path, which adds in the same order and matches bit for bit). */
static void kvq__nuq_score(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                           size_t nq, const uint8_t *keys, size_t n) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    const int b = c->bits;
    const size_t qs = c->qp_bytes / sizeof(float);
    uint32_t offs[KVQ__MAX_HEAD_DIM]; /* t * L + index of each channel of one key */
    for (size_t j = 0; j < n; j++) {
        const uint8_t *p = keys + j * c->bytes;
        for (size_t t = 0; t < d; t++)
            offs[t] = (uint32_t)(t * L + kvq__nuq_get(p, t, b));
        for (size_t i = 0; i < nq; i++) {
            const float *lut = (const float *)qp + i * qs;
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (size_t t = 0; t < d; t++)
                s[t & 3] += lut[offs[t]];
            out[i * ostride + j] = (s[0] + s[1]) + (s[2] + s[3]);
        }
    }
}

/* acc += w * v as a product then a sum (no fused multiply-add), vectors in
 * order: the AVX2 path does the same and matches bit for bit. */
static void kvq__nuq_accum(const kvq_codec *c, float *acc, size_t astride, const float *w,
                           size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    const size_t d = c->d;
    float v[KVQ__MAX_HEAD_DIM];
    for (size_t j = 0; j < n; j++) {
        kvq__nuq_decode(c, v, vals + j * c->bytes, 1);
        for (size_t i = 0; i < nq; i++) {
            const float wj = w[i * wstride + j];
            float *a = acc + i * astride;
            for (size_t t = 0; t < d; t++)
                a[t] += wj * v[t];
        }
    }
}

/* ---- fit: per-channel Lloyd-Max ---- */

/* Order-preserving map of float bits to unsigned keys (-0 sorts before +0). */
static inline uint32_t kvq__nuq_key(float f) {
    uint32_t u = kvq__f32_bits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static inline float kvq__nuq_unkey(uint32_t k) {
    return kvq__bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* LSD radix sort of n keys, 8 bits per pass; the result ends in a (four
 * passes), tmp is scratch of n keys. */
static void kvq__nuq_radix(uint32_t *a, uint32_t *tmp, size_t n) {
    uint32_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
        size_t count[256] = {0};
        for (size_t i = 0; i < n; i++)
            count[(src[i] >> shift) & 0xff]++;
        size_t sum = 0;
        for (int v = 0; v < 256; v++) {
            size_t cnt = count[v];
            count[v] = sum;
            sum += cnt;
        }
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & 0xff]++] = src[i];
        uint32_t *sw = src;
        src = dst;
        dst = sw;
    }
}

/* Scratch of one channel fit, all sized for n samples. */
typedef struct {
    uint32_t *keys, *tmp; /* n each */
    float *u;             /* distinct sorted values, n */
    double *cw, *cs;      /* prefix counts and sums over u, n + 1 each */
} kvq__nuq_scratch;

/* First index i in u[0..m) with u[i] > t (m if none). */
static size_t kvq__nuq_upper(const float *u, size_t m, double t) {
    size_t lo = 0, hi = m;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((double)u[mid] <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Fits the L levels of one channel from its n samples v (v is reused as
 * scratch). Deterministic: levels start at the quantiles of the distinct
 * values, then alternate nearest-level partition and centroids until the
 * partition is stable. With m <= L distinct values the levels are those
 * values (the last one repeated). */
static void kvq__nuq_fit_channel(const float *v, size_t n, size_t L, kvq__nuq_scratch *s,
                                 float *out) {
    for (size_t i = 0; i < n; i++)
        s->keys[i] = kvq__nuq_key(v[i]);
    kvq__nuq_radix(s->keys, s->tmp, n);

    float *u = s->u;
    double *cw = s->cw, *cs = s->cs;
    size_t m = 0;
    cw[0] = 0.0;
    cs[0] = 0.0;
    for (size_t i = 0; i < n; i++) {
        float f = kvq__nuq_unkey(s->keys[i]);
        if (m == 0 || f != u[m - 1]) {
            u[m] = f;
            m++;
            cw[m] = cw[m - 1];
            cs[m] = cs[m - 1];
        }
        cw[m] += 1.0;
        cs[m] += (double)f;
    }
    if (m <= L) {
        for (size_t k = 0; k < L; k++)
            out[k] = u[KVQ__MIN(k, m - 1)];
        return;
    }

    double lev[256];
    size_t edge[256]; /* edge[k]: first distinct value of cluster k + 1 */
    for (size_t k = 0; k < L; k++) {
        lev[k] = (double)u[((2 * k + 1) * m) / (2 * L)]; /* strictly increasing: m > L */
        edge[k] = SIZE_MAX;
    }
    edge[L - 1] = m;
    for (int it = 0; it < KVQ__NUQ_MAX_ITERS; it++) {
        int changed = 0;
        for (size_t k = 0; k + 1 < L; k++) {
            size_t e = kvq__nuq_upper(u, m, 0.5 * lev[k] + 0.5 * lev[k + 1]);
            changed |= e != edge[k];
            edge[k] = e;
        }
        if (!changed)
            break;
        size_t lo = 0;
        for (size_t k = 0; k < L; k++) {
            size_t hi = edge[k];
            if (hi > lo) {
                double mean = (cs[hi] - cs[lo]) / (cw[hi] - cw[lo]);
                /* rounding must not push a centroid out of its cluster (this
                 * keeps the levels sorted) */
                lev[k] = KVQ__MIN(KVQ__MAX(mean, (double)u[lo]), (double)u[hi - 1]);
            } /* an empty cluster keeps its level, which lies between its
                 neighbours' clusters, so the order is kept */
            lo = hi;
        }
    }
    for (size_t k = 0; k < L; k++) {
        out[k] = (float)lev[k];
        if (k && out[k] < out[k - 1])
            out[k] = out[k - 1];
    }
}

static kvq_status kvq__nuq_fit(kvq_codec *c, const float *x, size_t n) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    enum { BLOCK = 16 }; /* channels gathered per pass over x (one cache line) */
    if (n > SIZE_MAX / (BLOCK * sizeof(double)) - 2)
        return KVQ_ERR_NOMEM;
    const kvq_allocator *al = &c->alloc;
    kvq__nuq_scratch s;
    float *cols = (float *)kvq__alloc(al, BLOCK * n * sizeof(float));
    float *newlev = (float *)kvq__alloc(al, d * L * sizeof(float));
    s.keys = (uint32_t *)kvq__alloc(al, n * sizeof(uint32_t));
    s.tmp = (uint32_t *)kvq__alloc(al, n * sizeof(uint32_t));
    s.u = (float *)kvq__alloc(al, n * sizeof(float));
    s.cw = (double *)kvq__alloc(al, (n + 1) * sizeof(double));
    s.cs = (double *)kvq__alloc(al, (n + 1) * sizeof(double));
    kvq_status st = KVQ_OK;
    if (!cols || !newlev || !s.keys || !s.tmp || !s.u || !s.cw || !s.cs) {
        st = KVQ_ERR_NOMEM;
    } else {
        for (size_t c0 = 0; c0 < d; c0 += BLOCK) {
            size_t nch = KVQ__MIN((size_t)BLOCK, d - c0);
            for (size_t i = 0; i < n; i++)
                for (size_t ci = 0; ci < nch; ci++)
                    cols[ci * n + i] = x[i * d + c0 + ci];
            for (size_t ci = 0; ci < nch; ci++)
                kvq__nuq_fit_channel(cols + ci * n, n, L, &s, newlev + (c0 + ci) * L);
        }
        /* commit: nothing below can fail */
        memcpy(c->state, newlev, d * L * sizeof(float));
        kvq__nuq_derive(c);
        c->fitted = 1;
    }
    kvq__free(al, s.cs);
    kvq__free(al, s.cw);
    kvq__free(al, s.u);
    kvq__free(al, s.tmp);
    kvq__free(al, s.keys);
    kvq__free(al, newlev);
    kvq__free(al, cols);
    return st;
}

/* ---- state ---- */

static size_t kvq__nuq_state_size(const kvq_codec *c) {
    return c->d * kvq__nuq_levels(c) * sizeof(float);
}

static void kvq__nuq_state_save(const kvq_codec *c, uint8_t *dst) {
    const float *lev = kvq__nuq_lev(c);
    size_t m = c->d * kvq__nuq_levels(c);
    for (size_t i = 0; i < m; i++)
        kvq__st32(dst + 4 * i, kvq__f32_bits(lev[i]));
}

/* Validates everything before writing: on error the codec is unchanged. */
static kvq_status kvq__nuq_state_load(kvq_codec *c, const uint8_t *src, size_t size) {
    const size_t d = c->d, L = kvq__nuq_levels(c);
    if (size != kvq__nuq_state_size(c))
        return KVQ_ERR_CORRUPT;
    for (size_t t = 0; t < d; t++) {
        float prev = -INFINITY;
        for (size_t k = 0; k < L; k++) {
            float f = kvq__bits_f32(kvq__ld32(src + 4 * (t * L + k)));
            if (!isfinite(f) || f < prev)
                return KVQ_ERR_CORRUPT;
            prev = f;
        }
    }
    float *lev = (float *)c->state;
    for (size_t i = 0; i < d * L; i++)
        lev[i] = kvq__bits_f32(kvq__ld32(src + 4 * i));
    kvq__nuq_derive(c);
    c->fitted = 1;
    return KVQ_OK;
}

/* ---- family hooks ---- */

static kvq_status kvq__nuq_init(kvq_codec *c, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    const size_t d = c->d, L = kvq__nuq_levels(c);
    c->bytes = (d * (size_t)c->bits + 7) / 8;
    c->qp_bytes = kvq__round64(d * L * sizeof(float) + KVQ__NUQ_QP_SLACK);
    c->acc_len = d;
    c->state = kvq__calloc(&c->alloc, 3 * kvq__nuq_stride(c) * sizeof(float));
    if (!c->state) {
        if (err && err_size)
            snprintf(err, err_size, "out of memory for the nuq%d tables", c->bits);
        return KVQ_ERR_NOMEM;
    }
    c->state_bytes = kvq__nuq_state_size(c);
    c->fitted = 0;
    c->ref.encode = kvq__nuq_encode;
    c->ref.decode = kvq__nuq_decode;
    c->ref.prep = kvq__nuq_prep;
    c->ref.score = kvq__nuq_score;
    c->ref.accum = kvq__nuq_accum;
    c->ref.finish = NULL;
    return KVQ_OK;
}

static void kvq__nuq_destroy(kvq_codec *c) {
    kvq__free(&c->alloc, c->state);
    c->state = NULL;
}

const kvq__family_ops kvq__nuq_ops = {
    .init = kvq__nuq_init,
    .destroy = kvq__nuq_destroy,
    .fit = kvq__nuq_fit,
    .state_size = kvq__nuq_state_size,
    .state_save = kvq__nuq_state_save,
    .state_load = kvq__nuq_state_load,
};
