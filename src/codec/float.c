/*
 * float.c - the plain codecs f32, f16 and bf16: head_dim values stored as
 * they are (f16 and bf16 rounded to nearest even; f16 saturates at +-65504).
 * They are the baselines every other codec is measured against.
 */
#include "codec_impl.h"

static void kvq__float_encode(const kvq_codec *c, uint8_t *dst, const float *src, size_t n) {
    size_t m = n * c->d;
    if (c->kind == KVQ__F32) {
        memcpy(dst, src, m * 4);
    } else if (c->kind == KVQ__F16) {
        for (size_t i = 0; i < m; i++)
            kvq__st16(dst + 2 * i, kvq__f16_from_f32(src[i]));
    } else {
        for (size_t i = 0; i < m; i++)
            kvq__st16(dst + 2 * i, kvq__bf16_from_f32(src[i]));
    }
}

static inline float kvq__float_get(const kvq_codec *c, const uint8_t *p, size_t i) {
    if (c->kind == KVQ__F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h = kvq__ld16(p + 2 * i);
    return c->kind == KVQ__F16 ? kvq__f16_to_f32(h) : kvq__bf16_to_f32(h);
}

static void kvq__float_decode(const kvq_codec *c, float *dst, const uint8_t *src, size_t n) {
    size_t m = n * c->d;
    if (c->kind == KVQ__F32) {
        memcpy(dst, src, m * 4);
        return;
    }
    for (size_t i = 0; i < m; i++)
        dst[i] = kvq__float_get(c, src, i);
}

static void kvq__float_prep(const kvq_codec *c, void *qp, const float *q) {
    memcpy(qp, q, c->d * sizeof(float));
}

static void kvq__float_score(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                             size_t nq, const uint8_t *keys, size_t n) {
    const float *q = (const float *)qp;
    size_t qs = c->qp_bytes / sizeof(float);
    for (size_t j = 0; j < n; j++) {
        const uint8_t *k = keys + j * c->bytes;
        for (size_t i = 0; i < nq; i++) {
            const float *qi = q + i * qs;
            float s = 0.0f;
            for (size_t t = 0; t < c->d; t++)
                s += qi[t] * kvq__float_get(c, k, t);
            out[i * ostride + j] = s;
        }
    }
}

static void kvq__float_accum(const kvq_codec *c, float *acc, size_t astride, const float *w,
                             size_t wstride, size_t nq, const uint8_t *vals, size_t n) {
    for (size_t j = 0; j < n; j++) {
        const uint8_t *v = vals + j * c->bytes;
        for (size_t i = 0; i < nq; i++) {
            float wj = w[i * wstride + j];
            float *a = acc + i * astride;
            for (size_t t = 0; t < c->d; t++)
                a[t] += wj * kvq__float_get(c, v, t);
        }
    }
}

/* Tiled layout (codec_impl.h): keys of a page of P tokens, P a multiple of
 * 16, are stored dimension-major, [d][P] values, so a key score is a sum of
 * broadcast query values times vectors of 16 (or 8) tokens: no horizontal
 * sum per key. Values keep the row layout (their accumulation is already a
 * sum of broadcast weights times rows). */
static int kvq__float_tiled(const kvq_codec *c, int role, size_t P) {
    (void)c;
    return role == KVQ__ROLE_K && P % 16 == 0;
}

static void kvq__float_tput(const kvq_codec *c, int role, size_t P, uint8_t *page, size_t i,
                            const uint8_t *row) {
    (void)role;
    size_t es = c->bytes / c->d;
    for (size_t t = 0; t < c->d; t++)
        memcpy(page + (t * P + i) * es, row + t * es, es);
}

static void kvq__float_tget(const kvq_codec *c, int role, size_t P, const uint8_t *page, size_t i,
                            uint8_t *row) {
    (void)role;
    size_t es = c->bytes / c->d;
    for (size_t t = 0; t < c->d; t++)
        memcpy(row + t * es, page + (t * P + i) * es, es);
}

static kvq_status kvq__float_init(kvq_codec *c, char *err, size_t err_size) {
    (void)err;
    (void)err_size;
    c->bytes = c->d * (c->kind == KVQ__F32 ? 4 : 2);
    c->qp_bytes = kvq__round64(c->d * sizeof(float));
    c->acc_len = c->d;
    c->ref.encode = kvq__float_encode;
    c->ref.decode = kvq__float_decode;
    c->ref.prep = kvq__float_prep;
    c->ref.score = kvq__float_score;
    c->ref.accum = kvq__float_accum;
    c->ref.finish = NULL;
    c->tiled = kvq__float_tiled;
    c->tput = kvq__float_tput;
    c->tget = kvq__float_tget;
    return KVQ_OK;
}

static void kvq__float_destroy(kvq_codec *c) { (void)c; }

const kvq__family_ops kvq__float_ops = {
    .init = kvq__float_init,
    .destroy = kvq__float_destroy,
};
