/*
 * model.c - a llama2.c-format transformer whose attention runs through a kvq
 * cache. Loads the legacy checkpoint header and the versioned "ak42" layouts
 * (v1 fp32; v2 Q8_0, dequantized to f32 at load), and runs the forward pass
 * in f32: RMSNorm, RoPE (interleaved pairs, theta 10000), grouped-query
 * attention through kvq_cache_append/kvq_cache_attend, SwiGLU, and the
 * classifier. Numerics follow llama2.c's run.c, so that an f32 cache
 * reproduces its reference figures; the matrix products run through
 * kvq__matmul_* (src/kernels/matmul.c), whose path (AVX-512, AVX2 or the
 * scalar reference that sums in index order like run.c) is chosen once at
 * load from the CPU. A call of n tokens runs each product over all n at once
 * (the SIMD paths block over tokens, so a prefill reads each weight matrix a
 * few times instead of n times); a single token (decode) streams every weight
 * once, bound by memory bandwidth.
 */
#include "model_impl.h"

#include "../kernels/kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct kvq_model {
    kvq_allocator alloc;
    kvq_model_info info;
    float *data; /* all weights, f32 */
    size_t n_data;
    kvq__matmul_fn mm; /* chosen once at load */
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
};

/* Q8_0 tensor of n values in groups of gs: int8[n] then float[n/gs]. */
static size_t kvq__q80_bytes(size_t n, size_t gs) { return n + (n / gs) * 4; }

static void kvq__q80_dequant(const uint8_t *src, size_t n, size_t gs, float *dst) {
    const int8_t *q = (const int8_t *)src;
    const uint8_t *sc = src + n;
    for (size_t i = 0; i < n; i++) {
        float s;
        memcpy(&s, sc + (i / gs) * 4, 4);
        dst[i] = (float)q[i] * s;
    }
}

/* *r = a * b or a + b; 0 when the result does not fit in size_t. */
static int kvq__mul(size_t *r, size_t a, size_t b) { return !__builtin_mul_overflow(a, b, r); }
static int kvq__add(size_t *r, size_t a, size_t b) { return !__builtin_add_overflow(a, b, r); }

/* Element counts of every tensor, in our order (see kvq_model). */
typedef struct {
    size_t emb, rms, wq, wk, wo, w1, cls, total;
} kvq__model_sizes;

/* The tensor sizes of the shape in `in`, and the exact number of bytes the
 * weights take in the file after the header (*file_bytes). Every product and
 * sum is checked: each header field may be up to 2^24, so L * D * D alone
 * can reach 2^72. 0 when some size does not fit in size_t. */
static int kvq__model_sizes_of(const kvq_model_info *in, size_t gs, kvq__model_sizes *z,
                               size_t *file_bytes) {
    size_t D = in->dim, HD = in->hidden_dim, L = in->n_layers, V = in->vocab_size;
    size_t kvd = in->n_kv_heads * in->head_dim; /* <= dim: n_kv_heads divides n_heads */
    size_t t, mats, norms, b;
    if (!kvq__mul(&z->emb, V, D) || !kvq__mul(&z->rms, L, D) || !kvq__mul(&z->wq, z->rms, D) ||
        !kvq__mul(&z->wk, z->rms, kvd) || !kvq__mul(&z->w1, z->rms, HD))
        return 0;
    z->wo = z->wq;
    z->cls = in->shared_classifier ? 0 : z->emb;
    /* the matrices (what v2 stores as Q8_0) and the norms (f32 everywhere) */
    if (!kvq__add(&mats, z->emb, z->wq) || !kvq__add(&mats, mats, z->wk) ||
        !kvq__add(&mats, mats, z->wk) || !kvq__add(&mats, mats, z->wo) ||
        !kvq__add(&mats, mats, z->w1) || !kvq__add(&mats, mats, z->w1) ||
        !kvq__add(&mats, mats, z->w1) || !kvq__add(&mats, mats, z->cls))
        return 0;
    if (!kvq__add(&norms, z->rms, z->rms) || !kvq__add(&norms, norms, D))
        return 0;
    if (!kvq__add(&z->total, mats, norms) || !kvq__mul(&t, z->total, sizeof(float)))
        return 0; /* the f32 weights must be addressable */
    if (in->version == 0) { /* plus the unused freq_cis table, seq_len * head_dim floats */
        size_t freq;
        if (!kvq__mul(&freq, in->seq_len, in->head_dim) || !kvq__add(&b, z->total, freq) ||
            !kvq__mul(&b, b, 4))
            return 0;
    } else if (in->version == 1) {
        b = t;
    } else {
        /* every matrix (per layer or whole) is a multiple of dim values and
         * gs divides dim, so the per-layer Q8_0 tensors add up to the Q8_0
         * size of their sum */
        size_t nb, qb;
        if (!kvq__mul(&qb, mats / gs, 4) || !kvq__add(&qb, qb, mats) ||
            !kvq__mul(&nb, norms, 4) || !kvq__add(&b, nb, qb))
            return 0;
    }
    *file_bytes = b;
    return 1;
}

kvq_status kvq__model_load_mem(kvq_model **out, const uint8_t *buf, size_t size,
                               const kvq_allocator *alloc, kvq_isa isa, char *why,
                               size_t why_size) {
    if (why && why_size)
        why[0] = 0;
    if (!out || (!buf && size))
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    kvq_allocator al;
    kvq__allocator_init(&al, alloc);
    kvq_model_info in;
    memset(&in, 0, sizeof in);
    int32_t h[7];
    size_t off;
    size_t gs = 0;
    if (size >= 8 && kvq__ld32(buf) == 0x616b3432u) {
        uint32_t ver = kvq__ld32(buf + 4);
        if (ver != 1 && ver != 2) {
            if (why && why_size)
                snprintf(why, why_size, "ak42 version %u is not supported (1 or 2)", ver);
            return KVQ_ERR_VERSION;
        }
        in.version = (int)ver;
        if (size < 256)
            return kvq__why_corrupt(why, why_size,
                                    "truncated: the ak42 header is 256 bytes, the file has %zu",
                                    size);
        for (int i = 0; i < 7; i++)
            h[i] = (int32_t)kvq__ld32(buf + 8 + 4 * i);
        in.shared_classifier = buf[36] != 0;
        if (in.version == 2)
            gs = kvq__ld32(buf + 37);
        off = 256;
    } else {
        if (size < 28)
            return kvq__why_corrupt(why, why_size,
                                    "truncated: the header is 28 bytes, the file has %zu", size);
        for (int i = 0; i < 7; i++)
            h[i] = (int32_t)kvq__ld32(buf + 4 * i);
        /* a negative vocab_size means a separate classifier */
        in.shared_classifier = h[5] > 0;
        if (h[5] < 0 && h[5] != INT32_MIN)
            h[5] = -h[5];
        off = 28;
    }
    static const char *const names[7] = {"dim",       "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (h[i] <= 0 || h[i] > (1 << 24))
            return kvq__why_corrupt(why, why_size, "the header's %s %d is outside 1..2^24",
                                    names[i], (int)h[i]);
    in.dim = (size_t)h[0], in.hidden_dim = (size_t)h[1], in.n_layers = (size_t)h[2];
    in.n_heads = (size_t)h[3], in.n_kv_heads = (size_t)h[4], in.vocab_size = (size_t)h[5];
    in.seq_len = (size_t)h[6];
    if (in.dim % in.n_heads || in.n_heads % in.n_kv_heads || (in.dim / in.n_heads) % 2 ||
        in.dim / in.n_heads > KVQ__MAX_HEAD_DIM)
        return kvq__why_corrupt(why, why_size,
                              "shape dim %zu, n_heads %zu, n_kv_heads %zu: need n_heads | dim, "
                              "n_kv_heads | n_heads and an even head_dim <= %d",
                              in.dim, in.n_heads, in.n_kv_heads, KVQ__MAX_HEAD_DIM);
    if (in.version == 2 && (gs == 0 || in.dim % gs))
        return kvq__why_corrupt(why, why_size, "Q8_0 group size %zu does not divide dim %zu", gs,
                              in.dim);
    in.head_dim = in.dim / in.n_heads;
    kvq__model_sizes z;
    size_t need = 0;
    if (!kvq__model_sizes_of(&in, gs, &z, &need))
        return kvq__why_corrupt(why, why_size, "the weight sizes of the header overflow");
    /* checked against the real length before anything is allocated: the
     * f32 weights are then at most 4x the file (Q8_0), 1x otherwise */
    if (size - off < need)
        return kvq__why_corrupt(why, why_size,
                                "truncated: the header's shape needs %zu bytes of weights, the "
                                "file has %zu", need, size - off);
    if (size - off > need)
        return kvq__why_corrupt(why, why_size,
                                "the header's shape needs %zu bytes of weights, the file has %zu "
                                "more", need, size - off - need);
    size_t D = in.dim, L = in.n_layers;
    kvq_model *m = (kvq_model *)kvq__calloc(&al, sizeof *m);
    float *w = m ? (float *)kvq__alloc(&al, z.total * sizeof(float)) : NULL;
    if (!m || !w) {
        kvq__free(&al, m);
        return KVQ_ERR_NOMEM;
    }
    m->alloc = al;
    m->info = in;
    m->data = w;
    m->n_data = z.total;
    m->mm = kvq__matmul_select(isa);
    float *p = w;
    m->emb = p, p += z.emb;
    m->rms_att = p, p += z.rms;
    m->wq = p, p += z.wq;
    m->wk = p, p += z.wk;
    m->wv = p, p += z.wk;
    m->wo = p, p += z.wo;
    m->rms_ffn = p, p += z.rms;
    m->w1 = p, p += z.w1;
    m->w2 = p, p += z.w1;
    m->w3 = p, p += z.w1;
    m->rms_final = p, p += D;
    m->wcls = in.shared_classifier ? m->emb : p;
    const uint8_t *src = buf + off;
    if (in.version == 0) {
        /* legacy: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
         * (freq_cis real/imag, skipped), wcls */
        size_t before_freq = z.total - z.cls;
        size_t freq = in.seq_len * in.head_dim; /* real + imag halves */
        memcpy(w, src, before_freq * 4);
        if (z.cls)
            memcpy(w + before_freq, src + (before_freq + freq) * 4, z.cls * 4);
    } else {
        /* ak42: rms_att, rms_ffn, rms_final, then emb, wq, wk, wv, wo, w1, w2, w3, [wcls];
         * the sizes add up to `need`, checked above */
        float *norms_dst[3] = {(float *)m->rms_att, (float *)m->rms_ffn, (float *)m->rms_final};
        size_t norms_n[3] = {z.rms, z.rms, D};
        float *mats_dst[9] = {(float *)m->emb, (float *)m->wq, (float *)m->wk, (float *)m->wv,
                              (float *)m->wo, (float *)m->w1, (float *)m->w2, (float *)m->w3,
                              z.cls ? (float *)m->wcls : NULL};
        size_t mats_n[9] = {z.emb, z.wq, z.wk, z.wk, z.wo, z.w1, z.w1, z.w1, z.cls};
        size_t pos = 0;
        for (int i = 0; i < 3; i++) {
            memcpy(norms_dst[i], src + pos, norms_n[i] * 4);
            pos += norms_n[i] * 4;
        }
        for (int i = 0; i < 9; i++) {
            if (!mats_n[i])
                continue;
            if (in.version == 1) {
                memcpy(mats_dst[i], src + pos, mats_n[i] * 4);
                pos += mats_n[i] * 4;
            } else {
                /* v2 stores each layer's matrix as its own Q8_0 tensor */
                size_t per = i == 0 || i == 8 ? mats_n[i] : mats_n[i] / L;
                size_t cnt = i == 0 || i == 8 ? 1 : L;
                for (size_t k = 0; k < cnt; k++) {
                    kvq__q80_dequant(src + pos, per, gs, mats_dst[i] + k * per);
                    pos += kvq__q80_bytes(per, gs);
                }
            }
        }
    }
    if (!kvq__all_finite(w, z.total)) {
        kvq_model_free(m);
        return kvq__why_corrupt(why, why_size, "a weight is NaN or infinite");
    }
    *out = m;
    return KVQ_OK;
}

static kvq_status kvq__model_load_why(kvq_model **out, const char *path,
                                      const kvq_allocator *alloc, kvq_isa isa, char *why,
                                      size_t why_size) {
    if (why && why_size)
        why[0] = 0;
    if (!out || !path)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    kvq_allocator al;
    kvq__allocator_init(&al, alloc);
    uint8_t *buf;
    size_t size;
    errno = 0;
    kvq_status st = kvq__read_file(&al, path, 0, SIZE_MAX, &buf, &size);
    if (st != KVQ_OK) {
        if (why && why_size)
            snprintf(why, why_size, "%s", errno ? strerror(errno) : kvq_strerror(st));
        return st;
    }
    st = kvq__model_load_mem(out, buf, size, &al, isa, why, why_size);
    kvq__free(&al, buf);
    return st;
}

kvq_status kvq__model_load_isa(kvq_model **out, const char *path, const kvq_allocator *alloc,
                               kvq_isa isa) {
    return kvq__model_load_why(out, path, alloc, isa, NULL, 0);
}

kvq_status kvq_model_load(kvq_model **out, const char *path, const kvq_allocator *alloc) {
    return kvq__model_load_why(out, path, alloc, KVQ_ISA_AUTO, NULL, 0);
}

kvq_status kvq_model_load_msg(kvq_model **out, const char *path, const kvq_allocator *alloc,
                              char *err_msg, size_t err_msg_size) {
    return kvq__model_load_why(out, path, alloc, KVQ_ISA_AUTO, err_msg, err_msg_size);
}

const char *kvq__model_kernel_name(const kvq_model *m) {
#if defined(__x86_64__)
    if (m->mm == kvq__matmul_avx512)
        return "avx512";
    if (m->mm == kvq__matmul_avx2)
        return "avx2";
#endif
    (void)m;
    return "scalar";
}

const float *kvq__model_weights(const kvq_model *m, size_t *n) {
    *n = m->n_data;
    return m->data;
}

void kvq_model_free(kvq_model *m) {
    if (!m)
        return;
    kvq_allocator a = m->alloc;
    kvq__free(&a, m->data);
    kvq__free(&a, m);
}

kvq_status kvq_model_get_info(const kvq_model *m, kvq_model_info *info) {
    if (!m || !info)
        return KVQ_ERR_INVALID_ARG;
    *info = m->info;
    return KVQ_OK;
}

kvq_status kvq_model_cache_shape(const kvq_model *m, kvq_cache_config *cfg) {
    if (!m || !cfg)
        return KVQ_ERR_INVALID_ARG;
    cfg->n_layers = m->info.n_layers;
    cfg->n_kv_heads = m->info.n_kv_heads;
    cfg->n_q_heads = m->info.n_heads;
    cfg->head_dim = m->info.head_dim;
    cfg->max_tokens = m->info.seq_len;
    cfg->rope_theta = 10000.0;
    cfg->rope_dims = m->info.head_dim;
    return KVQ_OK;
}

static void kvq__rmsnorm(float *o, const float *x, const float *w, size_t n) {
    float ss = 0.0f;
    for (size_t j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (size_t j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* cs[2p], cs[2p + 1] = cos, sin of pos * 10000^(-2p / head_dim) for the
 * head_dim / 2 pairs of one position (llama2.c's expressions, computed once
 * per token instead of once per head and layer). */
static void kvq__rope_table(float *cs, size_t head_dim, int32_t pos) {
    for (size_t i = 0; i < head_dim; i += 2) {
        float freq = 1.0f / powf(10000.0f, (float)i / (float)head_dim);
        float val = (float)pos * freq;
        cs[i] = cosf(val);
        cs[i + 1] = sinf(val);
    }
}

/* Rotates the interleaved pairs of every head of x (len values). */
static void kvq__rope_vec(float *x, size_t len, size_t head_dim, const float *cs) {
    for (size_t h = 0; h < len; h += head_dim)
        for (size_t i = 0; i < head_dim; i += 2) {
            float fcr = cs[i], fci = cs[i + 1];
            float v0 = x[h + i], v1 = x[h + i + 1];
            x[h + i] = v0 * fcr - v1 * fci;
            x[h + i + 1] = v0 * fci + v1 * fcr;
        }
}

kvq_status kvq_model_forward(const kvq_model *m, kvq_cache *cache, const int32_t *tokens, size_t n,
                             int32_t pos0, float *logits, size_t cap, int last_only) {
    if (!m || !cache || !tokens || n == 0 || pos0 < 0)
        return KVQ_ERR_INVALID_ARG;
    const kvq_model_info *in = &m->info;
    size_t D = in->dim, HD = in->hidden_dim, V = in->vocab_size, hs = in->head_dim;
    size_t kvd = in->n_kv_heads * hs;
    if (logits && cap < (last_only ? 1 : n) * V)
        return KVQ_ERR_DST_TOO_SMALL;
    for (size_t t = 0; t < n; t++)
        if (tokens[t] < 0 || (size_t)tokens[t] >= V)
            return KVQ_ERR_RANGE;
    if ((size_t)pos0 + n > in->seq_len)
        return KVQ_ERR_FULL;
    kvq_cache_config cc;
    kvq_status st = kvq_cache_get_config(cache, &cc);
    if (st != KVQ_OK)
        return st;
    if (cc.n_layers != in->n_layers || cc.n_kv_heads != in->n_kv_heads ||
        cc.n_q_heads != in->n_heads || cc.head_dim != hs)
        return KVQ_ERR_MISMATCH;
    size_t fl = n * (3 * D + 2 * kvd + 2 * HD + hs);
    float *buf = (float *)kvq__alloc(&m->alloc, fl * sizeof(float));
    int32_t *pos = (int32_t *)kvq__alloc(&m->alloc, n * sizeof(int32_t));
    if (!buf || !pos) {
        kvq__free(&m->alloc, buf);
        kvq__free(&m->alloc, pos);
        return KVQ_ERR_NOMEM;
    }
    float *x = buf, *xb = x + n * D, *q = xb + n * D, *k = q + n * D, *v = k + n * kvd;
    float *hb = v + n * kvd, *hb2 = hb + n * HD, *rope = hb2 + n * HD;
    for (size_t t = 0; t < n; t++) {
        pos[t] = pos0 + (int32_t)t;
        kvq__rope_table(rope + t * hs, hs, pos[t]);
        memcpy(x + t * D, m->emb + (size_t)tokens[t] * D, D * sizeof(float));
    }
    for (size_t l = 0; l < in->n_layers && st == KVQ_OK; l++) {
        for (size_t t = 0; t < n; t++)
            kvq__rmsnorm(xb + t * D, x + t * D, m->rms_att + l * D, D);
        m->mm(q, xb, m->wq + l * D * D, D, D, n);
        m->mm(k, xb, m->wk + l * D * kvd, D, kvd, n);
        m->mm(v, xb, m->wv + l * D * kvd, D, kvd, n);
        for (size_t t = 0; t < n; t++) {
            kvq__rope_vec(q + t * D, D, hs, rope + t * hs);
            if (!cc.k_prerope)
                kvq__rope_vec(k + t * kvd, kvd, hs, rope + t * hs);
        }
        st = kvq_cache_append(cache, l, k, v, pos, n);
        if (st == KVQ_OK)
            st = kvq_cache_attend(cache, l, q, pos, n, xb, n * D, NULL, 0);
        if (st != KVQ_OK)
            break;
        m->mm(q, xb, m->wo + l * D * D, D, D, n); /* q is free: attention output proj */
        for (size_t i = 0; i < n * D; i++)
            x[i] += q[i];
        for (size_t t = 0; t < n; t++)
            kvq__rmsnorm(xb + t * D, x + t * D, m->rms_ffn + l * D, D);
        m->mm(hb, xb, m->w1 + l * D * HD, D, HD, n);
        m->mm(hb2, xb, m->w3 + l * D * HD, D, HD, n);
        for (size_t i = 0; i < n * HD; i++) {
            float a = hb[i];
            a *= 1.0f / (1.0f + expf(-a));
            hb[i] = a * hb2[i];
        }
        m->mm(q, hb, m->w2 + l * D * HD, HD, D, n);
        for (size_t i = 0; i < n * D; i++)
            x[i] += q[i];
    }
    if (st == KVQ_OK && logits) {
        /* the classifier over all wanted tokens in one product (xb is free) */
        size_t t0 = last_only ? n - 1 : 0;
        for (size_t t = t0; t < n; t++)
            kvq__rmsnorm(xb + t * D, x + t * D, m->rms_final, D);
        m->mm(logits, xb + t0 * D, m->wcls, D, V, n - t0);
    }
    kvq__free(&m->alloc, buf);
    kvq__free(&m->alloc, pos);
    return st;
}
