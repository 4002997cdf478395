/*
 * int.c - the integer codecs int8, int4 and int2 (scalar reference kernels).
 *
 * A vector of d floats is cut into ng = d/g groups of g values. int8 is
 * symmetric: one fp16 scale s per group and x ~ s*q, q in [-127, 127]. int4
 * and int2 are asymmetric: an fp16 scale s and an fp16 minimum m per group
 * and x ~ m + s*q, q in [0, L] with L = 15 or 3. Byte layout of one vector
 * (little-endian; docs/format.md):
 *   int8       [ng x f16 scale][d x int8 code]
 *   int4/int2  [ng x f16 scale][ng x f16 min][codes packed over the vector]
 * int4 value i sits in byte i/2 (low nibble when i is even), int2 value i in
 * byte i/4 at bits 2*(i%4); unused high bits of the last byte are zero.
 *
 * Group parameters (the AVX2 encoder reproduces them bit for bit, so every
 * step is one correctly rounded float operation in a fixed order):
 *   int8:  s = f16(min(amax/127, 65504)), inv = s > 0 ? 1/s : 0,
 *          q = clamp(rint(x*inv), -127, 127)
 *   asym:  m = f16(clamp(min, +-65504)), s = f16(clamp((max - m)/L, 0, 65504)),
 *          inv as above, q = clamp(rint((x - m)*inv), 0, L)
 * rint is round-to-nearest-even. min and max are taken with -0 folded into
 * +0 so the scan order cannot change the stored bits. The clamps keep huge
 * inputs (1e30) finite: their scale saturates at 65504.
 *
 * The reference prepared query is the float query followed by the float sum
 * of each group (the minimum term of int4/int2 is m_g * sum of q over g).
 * qp_bytes also covers the AVX2 layout (src/kernels/x86/int_avx2.c: query
 * codes <= d + 96, block scales <= d, group sums <= d/2 + 28 bytes; the
 * AVX2 path is not selected when its layout would not fit).
 *
 * Tiled pages (codec_impl.h; docs/format.md "Tiled int8/int4 pages"): int8
 * and int4 with g % 8 == 0 tile pages of P % 16 == 0 tokens (int2 and other
 * shapes keep rows). The codes come first, then the fp16 scale plane
 * [ng][P] (scale of group gi of slot i at 2 (gi P + i)), then for int4 the
 * minimum plane [ng][P]: the P * bytes of the row layout, 16 tokens' scales
 * in one 32-byte load. Code bytes:
 *   K int8  [d/4][P][4]: byte j of lane (k, i) = code of value 4k+j of slot
 *           i plus 128 (u8 1..255), so u8 x s8 dot products (vpdpbusd) take
 *           it as it is and the query sum times 128 removes the bias;
 *   K int4  [d/8][P][4]: byte j of lane (k, i) = value 8k+j (low nibble) and
 *           8k+4+j (high nibble) of slot i;
 *   V int8  [P/4][d][4]: byte j of lane (b, t) = signed code of value t of
 *           slot 4b+j (4 tokens per lane, a dimension per lane);
 *   V int4  [P/8][d][4]: byte j of lane (b, t) = value t of slot 8b+j (low
 *           nibble) and of slot 8b+4+j (high nibble).
 * A key lane holds one token, so tscore sums over dimensions with no
 * horizontal sum per key; a value lane holds one dimension, so taccum's sum
 * over tokens is a dot product of 4 tokens' bytes with 4 weights.
 *
 * Tiled kernels (src/kernels/x86/int_avx2.c, int_avx512.c; int_tile.h):
 *   tprep   q is cut into blocks of qb values (int8 keys: the largest of
 *           256, 128, 64, 32, 16, 8 dividing g; int4: of 32, 16, 8); block
 *           b gets beta_b = max|q_b| / K and codes qq = rint(q * (K /
 *           max|q_b|)) in -K..K, K = 16383 for int8 keys (int16 codes,
 *           taken by s16 x s16 products against the key bytes widened to
 *           int16: vpmaddwd, or vpdpwssd with VNNI), K = 127 for int4 (int8
 *           codes against the nibbles, u8 x s8) (a block with max|q_b| <
 *           2^-100 gets beta 0 and zero codes);
 *   tscore  score = sum_g s_g sum_{b in g} beta_b D_b (+ m_g * sum of q over
 *           g, in float, for int4) with D_b = sum qq * c, exact in int32
 *           (int8: every partial sum of the biased codes c + 128 below 128
 *           * 256 * 16383 + 64 * 2 * 255 * 16383 < 2^31);
 *   taccum  for each row, group g and run of up to 64 tokens of the page
 *           (taccum_run: of whole pages, 64 tokens at P = 16),
 *           p_t = w_t * s_{t,g} (float) is rounded to wq_t = rint(p_t * (W
 *           / max_t p_t)) in 0..W, alpha = max_t p_t / W, and acc +=
 *           alpha * sum_t wq_t c'_t (exact in int32) + sum_t w_t m'_{t,g}
 *           (float, int4). int8: W = 32767 and c' = c on every path, the
 *           weights as u16 (s16 x s16 products against the codes widened
 *           to int16: vpmaddwd on AVX2 and AVX-512BW, vpdpwssd on
 *           AVX-VNNI) or split into bytes 256 wh + wl (wh <= 127; two
 *           passes of vpdpbusd u8 x s8, the first sum times 256, AVX-512
 *           VNNI); |sum| <= 64 * 32767 * 127 < 2^31. int4:
 *           W = 255, the u8 operand of the u8 x s8 products, the codes taken
 *           as c' = c - 8 (s8 -8..7) and m' = m + 8 s (one fma) putting the
 *           8 back; int16 sums of int4 products (maddubs pairs added with
 *           vpaddw before the madd to int32) take at most 16 products:
 *           |sum| <= 16 * 255 * 8 = 32640 < 32767 (AVX2: 2 blocks of 16
 *           tokens x 2 halves x 2 nibbles x 2 tokens per pair; AVX-512 BW: 4
 *           products); int32 sums <= 64 * 255 * 8. A run whose max is below
 *           2^-100 is dropped; a row with a weight that is negative or not
 *           finite (or a product that overflows) takes the float row kernels
 *           for that run instead.
 * Error bounds (what tests/test_tile_int.c checks, beside float rounding of
 * (d + 16) eps sum|q| (s|c| + |m|) for scores and (P + 16) eps (|acc| +
 * sum |w| (s (|c| + 8 [c' = c - 8]) + |m|)) for accumulations; c = signed
 * int8 code or int4 code 0..15; u = 2^-24):
 *   |score - <q, k^>|  <= sum_b e_b sum_{t in b} s_g(t) |c_t|,
 *                         e_b = beta_b / 2 (1 + 8 K u), or max|q_b| if dropped
 *   |acc_t - exact_t|   <= sum_runs sum_g e_g sum_{j in run} |c'_{j,t}| (g = the
 *                         group of t), e_g = alpha / 2 (1 + 8 W u), or the run's
 *                         max if dropped, 0 for a run on the float kernels.
 * The 8 K u (8 W u) covers the float roundings of K/max, max/K and of q K /
 * max before rint, at most 6 K u of a step together (0.6% at K = 16383,
 * 1.2% at W = 32767). The steps against the codecs' own: a query code is
 * within max|q_b| / 32766 of q and an int8 key code within max|k| / 254 of
 * k, a weight within max p / 65534 of p and a value code within max|v| /
 * 254: the kernels' rounding adds about 1/128 of the codec's error per
 * side (before, with K = 127 and W = 255 or 127, about as much as the
 * codec's own: stories15M's int8 KL rose by 40-75%). Every path rounds
 * the query the same way and, for each codec, the weights the same way:
 * their integer sums agree exactly and results differ only in float
 * order.
 */
#include "codec_impl.h"

#define KVQ__F16_MAXF 65504.0f

static size_t kvq__int_code_bytes(int bits, size_t d) {
    return bits == 8 ? d : bits == 4 ? (d + 1) / 2 : (d + 3) / 4;
}

/* Bytes of scales (and minimums) in front of the codes. */
static size_t kvq__int_param_bytes(int bits, size_t ng) { return (bits == 8 ? 2 : 4) * ng; }

static inline float kvq__clampf(float v, float lo, float hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

static inline unsigned kvq__int_code(const uint8_t *codes, int bits, size_t i) {
    if (bits == 8)
        return codes[i];
    if (bits == 4)
        return (codes[i >> 1] >> ((i & 1) * 4)) & 15u;
    return (codes[i >> 2] >> ((i & 3) * 2)) & 3u;
}

static void kvq__int_encode_one(const kvq_codec *c, uint8_t *dst, const float *x) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    if (c->bits == 8) {
        uint8_t *codes = dst + 2 * ng;
        for (size_t gi = 0; gi < ng; gi++) {
            const float *xg = x + gi * g;
            float amax = 0.0f;
            for (size_t t = 0; t < g; t++) {
                float a = fabsf(xg[t]);
                if (a > amax)
                    amax = a;
            }
            float r = amax / 127.0f;
            if (r > KVQ__F16_MAXF)
                r = KVQ__F16_MAXF;
            uint16_t sh = kvq__f16_from_f32(r);
            float s = kvq__f16_to_f32(sh);
            float inv = s > 0.0f ? 1.0f / s : 0.0f;
            kvq__st16(dst + 2 * gi, sh);
            for (size_t t = 0; t < g; t++) {
                float q = kvq__clampf(nearbyintf(xg[t] * inv), -127.0f, 127.0f);
                codes[gi * g + t] = (uint8_t)(int8_t)(int)q;
            }
        }
        return;
    }
    const int bits = c->bits;
    const float L = bits == 4 ? 15.0f : 3.0f;
    uint8_t *codes = dst + 4 * ng;
    memset(codes, 0, kvq__int_code_bytes(bits, d));
    for (size_t gi = 0; gi < ng; gi++) {
        const float *xg = x + gi * g;
        float mn = xg[0], mx = xg[0];
        for (size_t t = 1; t < g; t++) {
            if (xg[t] < mn)
                mn = xg[t];
            if (xg[t] > mx)
                mx = xg[t];
        }
        mn = mn + 0.0f; /* -0 -> +0 */
        mx = mx + 0.0f;
        uint16_t mh = kvq__f16_from_f32(kvq__clampf(mn, -KVQ__F16_MAXF, KVQ__F16_MAXF));
        float m = kvq__f16_to_f32(mh);
        float r = kvq__clampf((mx - m) / L, 0.0f, KVQ__F16_MAXF);
        uint16_t sh = kvq__f16_from_f32(r);
        float s = kvq__f16_to_f32(sh);
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        kvq__st16(dst + 2 * gi, sh);
        kvq__st16(dst + 2 * ng + 2 * gi, mh);
        for (size_t t = 0; t < g; t++) {
            unsigned q = (unsigned)kvq__clampf(nearbyintf((xg[t] - m) * inv), 0.0f, L);
            size_t i = gi * g + t;
            if (bits == 4)
                codes[i >> 1] |= (uint8_t)(q << ((i & 1) * 4));
            else
                codes[i >> 2] |= (uint8_t)(q << ((i & 3) * 2));
        }
    }
}

static void kvq__int_encode(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    for (size_t j = 0; j < n; j++)
        kvq__int_encode_one(c, dst + j * c->bytes, src + j * c->d);
}

/* x = s*q (int8) or m + s*q (int4/int2): one multiply, then one add. */
static void kvq__int_decode_one(const kvq_codec *c, float *out, const uint8_t *src) {
    const size_t g = c->group, ng = c->ngroups;
    const int bits = c->bits;
    const uint8_t *codes = src + kvq__int_param_bytes(bits, ng);
    for (size_t gi = 0; gi < ng; gi++) {
        float s = kvq__f16_to_f32(kvq__ld16(src + 2 * gi));
        if (bits == 8) {
            for (size_t t = gi * g; t < (gi + 1) * g; t++)
                out[t] = s * (float)(int8_t)codes[t];
        } else {
            float m = kvq__f16_to_f32(kvq__ld16(src + 2 * ng + 2 * gi));
            for (size_t t = gi * g; t < (gi + 1) * g; t++)
                out[t] = m + s * (float)kvq__int_code(codes, bits, t);
        }
    }
}

static void kvq__int_decode(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    for (size_t j = 0; j < n; j++)
        kvq__int_decode_one(c, dst + j * c->d, src + j * c->bytes);
}

/* Reference prepared query: q[d] then qsum[ng] (float sums per group). */
static void kvq__int_prep(const kvq_codec *c, void *qp, const float *q) {
    float *f = (float *)qp;
    memcpy(f, q, c->d * sizeof(float));
    for (size_t gi = 0; gi < c->ngroups; gi++) {
        float s = 0.0f;
        for (size_t t = gi * c->group; t < (gi + 1) * c->group; t++)
            s += q[t];
        f[c->d + gi] = s;
    }
}

/* <q, key> = sum_g (s_g * sum_{t in g} q_t code_t + m_g * qsum_g). */
static void kvq__int_score(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                           size_t nq, const uint8_t *keys, size_t n) {
    const size_t d = c->d, g = c->group, ng = c->ngroups;
    const size_t qs = c->qp_bytes / sizeof(float);
    const int bits = c->bits;
    float cf[KVQ__MAX_HEAD_DIM];
    for (size_t j = 0; j < n; j++) {
        const uint8_t *k = keys + j * c->bytes;
        const uint8_t *codes = k + kvq__int_param_bytes(bits, ng);
        for (size_t t = 0; t < d; t++)
            cf[t] = bits == 8 ? (float)(int8_t)codes[t] : (float)kvq__int_code(codes, bits, t);
        for (size_t i = 0; i < nq; i++) {
            const float *q = (const float *)qp + i * qs;
            float dot = 0.0f;
            for (size_t gi = 0; gi < ng; gi++) {
                float a = 0.0f;
                for (size_t t = gi * g; t < (gi + 1) * g; t++)
                    a += q[t] * cf[t];
                dot += kvq__f16_to_f32(kvq__ld16(k + 2 * gi)) * a;
                if (bits != 8)
                    dot += kvq__f16_to_f32(kvq__ld16(k + 2 * ng + 2 * gi)) * q[d + gi];
            }
            out[i * ostride + j] = dot;
        }
    }
}

static void kvq__int_accum(const kvq_codec *c, float *acc, size_t astride, const float *w,
                           size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    float v[KVQ__MAX_HEAD_DIM];
    for (size_t j = 0; j < n; j++) {
        kvq__int_decode_one(c, v, vals + j * c->bytes);
        for (size_t i = 0; i < nq; i++) {
            float wj = w[i * wstride + j];
            float *a = acc + i * astride;
            for (size_t t = 0; t < c->d; t++)
                a[t] += wj * v[t];
        }
    }
}

/* ---- tiled pages (layouts in the header comment) ---- */

static int kvq__int_tiled(const kvq_codec *c, int role, size_t P) {
    (void)role;
    return c->bits != 2 && c->group % 8 == 0 && P % 16 == 0;
}

/* Where the codes end and the [ng][P] scale (then minimum) planes begin. */
static size_t kvq__int_tile_codes(const kvq_codec *c, size_t P) {
    return c->bits == 8 ? c->d * P : c->d / 2 * P;
}

static inline uint32_t kvq__int_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void kvq__int_st32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* The 8 nibbles of a 32-bit word (nibble p = bits 4p..4p+3) from value
 * order n0..n7 to the key lane order n0 n4 n1 n5 n2 n6 n3 n7 (byte j = n_j
 * low, n_{j+4} high), and back: two exchanges of bit fields. */
static inline uint32_t kvq__int_nib_out(uint32_t x) {
    uint32_t t = ((x >> 8) ^ x) & 0x0000ff00u;
    x ^= t ^ (t << 8);
    t = ((x >> 4) ^ x) & 0x00f000f0u;
    return x ^ t ^ (t << 4);
}
static inline uint32_t kvq__int_nib_in(uint32_t x) {
    uint32_t t = ((x >> 4) ^ x) & 0x00f000f0u;
    x ^= t ^ (t << 4);
    t = ((x >> 8) ^ x) & 0x0000ff00u;
    return x ^ t ^ (t << 8);
}

static void kvq__int_tput(const kvq_codec *c, int role, size_t P, uint8_t *page, size_t i,
                          const uint8_t *row) {
    const size_t d = c->d, ng = c->ngroups;
    const int bits = c->bits;
    const size_t pb = kvq__int_param_bytes(bits, ng), cb = kvq__int_tile_codes(c, P);
    const uint8_t *codes = row + pb;
    if (role == KVQ__ROLE_K) {
        for (size_t k = 0; k < (bits == 8 ? d / 4 : d / 8); k++) {
            uint32_t x = kvq__int_ld32(codes + 4 * k);
            kvq__int_st32(page + (k * P + i) * 4, bits == 8 ? x ^ 0x80808080u : kvq__int_nib_out(x));
        }
    } else if (bits == 8) {
        uint8_t *o = page + (i / 4) * d * 4 + i % 4;
        for (size_t t = 0; t < d; t++)
            o[4 * t] = codes[t];
    } else {
        uint8_t *o = page + (i / 8) * d * 4 + i % 4;
        const unsigned sh = (i % 8) >= 4 ? 4 : 0, keep = sh ? 0x0fu : 0xf0u;
        for (size_t t = 0; t < d; t += 2) {
            unsigned b = codes[t / 2];
            o[4 * t] = (uint8_t)((o[4 * t] & keep) | (b & 15u) << sh);
            o[4 * t + 4] = (uint8_t)((o[4 * t + 4] & keep) | (b >> 4) << sh);
        }
    }
    for (size_t k = 0; k < pb / 2; k++) /* scale planes, then minimum planes */
        kvq__st16(page + cb + 2 * (k * P + i), kvq__ld16(row + 2 * k));
}

static void kvq__int_tget(const kvq_codec *c, int role, size_t P, const uint8_t *page, size_t i,
                          uint8_t *row) {
    const size_t d = c->d, ng = c->ngroups;
    const int bits = c->bits;
    const size_t pb = kvq__int_param_bytes(bits, ng), cb = kvq__int_tile_codes(c, P);
    uint8_t *codes = row + pb;
    if (role == KVQ__ROLE_K) {
        for (size_t k = 0; k < (bits == 8 ? d / 4 : d / 8); k++) {
            uint32_t x = kvq__int_ld32(page + (k * P + i) * 4);
            kvq__int_st32(codes + 4 * k, bits == 8 ? x ^ 0x80808080u : kvq__int_nib_in(x));
        }
    } else if (bits == 8) {
        const uint8_t *o = page + (i / 4) * d * 4 + i % 4;
        for (size_t t = 0; t < d; t++)
            codes[t] = o[4 * t];
    } else {
        const uint8_t *o = page + (i / 8) * d * 4 + i % 4;
        const unsigned sh = (i % 8) >= 4 ? 4 : 0;
        for (size_t t = 0; t < d; t += 2)
            codes[t / 2] = (uint8_t)(((o[4 * t] >> sh) & 15u) | ((o[4 * t + 4] >> sh) & 15u) << 4);
    }
    for (size_t k = 0; k < pb / 2; k++)
        kvq__st16(row + 2 * k, kvq__ld16(page + cb + 2 * (k * P + i)));
}

static kvq_status kvq__int_init(kvq_codec *c, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    const size_t d = c->d, ng = c->ngroups;
    c->bytes = kvq__int_param_bytes(c->bits, ng) + kvq__int_code_bytes(c->bits, d);
    size_t ref_qp = (d + ng) * sizeof(float);
    size_t simd_qp = 3 * d + 128;
    c->qp_bytes = kvq__round64(KVQ__MAX(ref_qp, simd_qp));
    c->acc_len = d;
    c->ref.encode = kvq__int_encode;
    c->ref.decode = kvq__int_decode;
    c->ref.prep = kvq__int_prep;
    c->ref.score = kvq__int_score;
    c->ref.accum = kvq__int_accum;
    c->ref.finish = NULL;
    c->tiled = kvq__int_tiled;
    c->tput = kvq__int_tput;
    c->tget = kvq__int_tget;
    c->state = NULL;
    return KVQ_OK;
}

static void kvq__int_destroy(kvq_codec *c) { (void)c; }

const kvq__family_ops kvq__int_ops = {
    .init = kvq__int_init,
    .destroy = kvq__int_destroy,
};
