/*
 * codec.c - the codec table and the public codec API: spec parsing
 * ("int4:g=32", "tq3:nc=0:seed=7"), creation with a per-handle allocator and
 * a chosen CPU path, argument checking for every public call (nothing is
 * written when a check fails), and the self-checking state blob used for
 * calibration files.
 */
#include "codec_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void kvq__errf(char *err, size_t n, const char *fmt, ...) {
    if (!err || n == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

typedef struct {
    const char *prefix;
    kvq__family family;
    int kind;
    int min_bits, max_bits; /* range of the digit suffix; 0,0 = no suffix */
    const kvq__family_ops *ops;
} kvq__codec_entry;

static const kvq__codec_entry kvq__table[] = {
    {"f32", KVQ__FAM_FLOAT, KVQ__F32, 0, 0, &kvq__float_ops},
    {"f16", KVQ__FAM_FLOAT, KVQ__F16, 0, 0, &kvq__float_ops},
    {"bf16", KVQ__FAM_FLOAT, KVQ__BF16, 0, 0, &kvq__float_ops},
    {"int", KVQ__FAM_INT, 0, 2, 8, &kvq__int_ops},
    {"tqp", KVQ__FAM_TQP, 0, 2, 4, &kvq__tq_ops},
    {"tq", KVQ__FAM_TQ, 0, 1, 4, &kvq__tq_ops},
    {"nuq", KVQ__FAM_NUQ, 0, 1, 8, &kvq__nuq_ops},
};

static const kvq__family_ops *kvq__ops_of(const kvq_codec *c) {
    switch (c->family) {
    case KVQ__FAM_FLOAT:
        return &kvq__float_ops;
    case KVQ__FAM_INT:
        return &kvq__int_ops;
    case KVQ__FAM_TQ:
    case KVQ__FAM_TQP:
        return &kvq__tq_ops;
    case KVQ__FAM_NUQ:
        return &kvq__nuq_ops;
    }
    return NULL;
}

/* Parses an option value: an unsigned decimal integer filling all of
 * s[0..len) that fits in 64 bits, digits only and no leading zero (so "010"
 * and "0x10" cannot be read as octal or hex). 0 with *why set otherwise. */
static int kvq__parse_u64(const char *s, size_t len, uint64_t *out, const char **why) {
    if (len == 0) {
        *why = "the value is empty";
        return 0;
    }
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9') {
            *why = "the value must be decimal digits only (no sign, space or 0x)";
            return 0;
        }
    if (s[0] == '0' && len > 1) {
        *why = "the value has a leading zero (decimal only: no octal)";
        return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned dig = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - dig) / 10) {
            *why = "the value is above 2^64 - 1";
            return 0;
        }
        v = v * 10 + dig;
    }
    *out = v;
    return 1;
}

/* Fills family/kind/bits and options of c from spec. */
static kvq_status kvq__parse_spec(kvq_codec *c, const char *spec, size_t d, char *err,
                                  size_t err_size) {
    size_t nlen = strcspn(spec, ":");
    const kvq__codec_entry *e = NULL;
    int bits = 0;
    for (size_t i = 0; i < sizeof kvq__table / sizeof kvq__table[0]; i++) {
        const kvq__codec_entry *t = &kvq__table[i];
        size_t plen = strlen(t->prefix);
        if (nlen < plen || memcmp(spec, t->prefix, plen) != 0)
            continue;
        if (t->max_bits == 0) {
            if (nlen == plen) {
                e = t;
                break;
            }
            continue;
        }
        /* one or more digits after the prefix */
        if (nlen == plen)
            continue;
        int ok = 1, v = 0;
        for (size_t k = plen; k < nlen; k++) {
            if (spec[k] < '0' || spec[k] > '9' || v > 100) {
                ok = 0;
                break;
            }
            v = v * 10 + (spec[k] - '0');
        }
        if (!ok)
            continue;
        if (t->family == KVQ__FAM_INT && v != 8 && v != 4 && v != 2)
            continue;
        if (v < t->min_bits || v > t->max_bits)
            continue;
        e = t;
        bits = v;
        break;
    }
    if (!e) {
        kvq__errf(err, err_size,
                  "unknown codec '%.*s' (known: f32 f16 bf16 int8 int4 int2 tq1..tq4 tqp2..tqp4 "
                  "nuq1..nuq8)",
                  (int)KVQ__MIN(nlen, 40), spec);
        return KVQ_ERR_UNKNOWN_CODEC;
    }
    c->family = e->family;
    c->kind = e->kind;
    c->bits = bits;
    c->group = d;
    c->nc = 1;
    c->norm_bits = 16;
    c->seed = KVQ__SEED_DEFAULT;

    const char *p = spec + nlen;
    while (*p == ':') {
        p++;
        size_t olen = strcspn(p, ":");
        const char *eq = memchr(p, '=', olen);
        if (!eq) {
            kvq__errf(err, err_size, "option '%.*s' is not of the form key=value",
                      (int)KVQ__MIN(olen, 40), p);
            return KVQ_ERR_BAD_OPTION;
        }
        size_t klen = (size_t)(eq - p);
        uint64_t v = 0;
        const char *why = "";
        if (!kvq__parse_u64(eq + 1, olen - klen - 1, &v, &why)) {
            kvq__errf(err, err_size, "option '%.*s': %s", (int)KVQ__MIN(olen, 40), p, why);
            return KVQ_ERR_BAD_OPTION;
        }
        int is_tq = c->family == KVQ__FAM_TQ || c->family == KVQ__FAM_TQP;
        if (klen == 1 && p[0] == 'g' && c->family == KVQ__FAM_INT) {
            if (v == 0 || v > d || d % v != 0) {
                kvq__errf(err, err_size, "%.*s: group g=%llu does not divide head_dim %zu",
                          (int)nlen, spec, (unsigned long long)v, d);
                return KVQ_ERR_GROUP;
            }
            c->group = (size_t)v;
        } else if (klen == 2 && memcmp(p, "nc", 2) == 0 && is_tq) {
            if (v > 1) {
                kvq__errf(err, err_size, "nc must be 0 or 1");
                return KVQ_ERR_BAD_OPTION;
            }
            c->nc = (int)v;
        } else if (klen == 4 && memcmp(p, "norm", 4) == 0 && is_tq) {
            if (v != 16 && v != 8) {
                kvq__errf(err, err_size, "norm must be 16 or 8");
                return KVQ_ERR_BAD_OPTION;
            }
            c->norm_bits = (int)v;
        } else if (klen == 4 && memcmp(p, "seed", 4) == 0 && is_tq) {
            c->seed = v;
        } else {
            kvq__errf(err, err_size, "codec %.*s has no option '%.*s'", (int)nlen, spec, (int)klen,
                      p);
            return KVQ_ERR_BAD_OPTION;
        }
        p += olen;
    }
    if (*p) {
        kvq__errf(err, err_size, "trailing characters in codec spec");
        return KVQ_ERR_BAD_OPTION;
    }
    c->ngroups = d / c->group;

    /* canonical spec: the name and every non-default option */
    int n = e->max_bits ? snprintf(c->spec, sizeof c->spec, "%s%d", e->prefix, bits)
                        : snprintf(c->spec, sizeof c->spec, "%s", e->prefix);
    if (c->family == KVQ__FAM_INT && c->group != d)
        n += snprintf(c->spec + n, sizeof c->spec - (size_t)n, ":g=%zu", c->group);
    if (c->family == KVQ__FAM_TQ || c->family == KVQ__FAM_TQP) {
        if (!c->nc)
            n += snprintf(c->spec + n, sizeof c->spec - (size_t)n, ":nc=0");
        if (c->norm_bits != 16)
            n += snprintf(c->spec + n, sizeof c->spec - (size_t)n, ":norm=%d", c->norm_bits);
        if (c->seed != KVQ__SEED_DEFAULT)
            snprintf(c->spec + n, sizeof c->spec - (size_t)n, ":seed=%llu",
                     (unsigned long long)c->seed);
    }
    return KVQ_OK;
}

kvq_status kvq_codec_create(kvq_codec **out, const char *spec, size_t head_dim,
                            const kvq_codec_params *params) {
    char *err = params ? params->err_msg : NULL;
    size_t err_size = params ? params->err_msg_size : 0;
    if (err && err_size)
        err[0] = 0;
    if (!out || !spec) {
        kvq__errf(err, err_size, "NULL argument");
        return KVQ_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (head_dim < 1 || head_dim > KVQ__MAX_HEAD_DIM) {
        kvq__errf(err, err_size, "head_dim %zu is outside 1..%d", head_dim, KVQ__MAX_HEAD_DIM);
        return KVQ_ERR_HEAD_DIM;
    }
    kvq_isa isa = params ? params->isa : KVQ_ISA_AUTO;
    if (isa == KVQ_ISA_AUTO)
        isa = kvq_cpu_best_isa();
    if ((int)isa < KVQ_ISA_AUTO || isa > KVQ_ISA_AVXVNNI) {
        kvq__errf(err, err_size, "unknown isa %d", (int)isa);
        return KVQ_ERR_INVALID_ARG;
    }
    if (!kvq_cpu_supports(isa)) {
        kvq__errf(err, err_size, "the %s path is not available on this CPU/build",
                  kvq_isa_name(isa));
        return KVQ_ERR_ISA;
    }
    kvq_allocator al;
    kvq__allocator_init(&al, params ? params->allocator : NULL);
    kvq_codec *c = (kvq_codec *)kvq__calloc(&al, sizeof *c);
    if (!c) {
        kvq__errf(err, err_size, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    c->alloc = al;
    c->d = head_dim;
    c->isa = isa;
    kvq_status st = kvq__parse_spec(c, spec, head_dim, err, err_size);
    if (st == KVQ_OK) {
        st = kvq__ops_of(c)->init(c, err, err_size);
        if (st != KVQ_OK)
            kvq__ops_of(c)->destroy(c);
    }
    if (st != KVQ_OK) {
        kvq__free(&al, c);
        return st;
    }
    c->k = c->ref;
    if (isa != KVQ_ISA_SCALAR)
        kvq__kernels_select(c);
    *out = c;
    return KVQ_OK;
}

void kvq_codec_free(kvq_codec *c) {
    if (!c)
        return;
    kvq_allocator al = c->alloc;
    kvq__ops_of(c)->destroy(c);
    kvq__free(&al, c);
}

const char *kvq_codec_spec(const kvq_codec *c) { return c ? c->spec : ""; }
size_t kvq_codec_head_dim(const kvq_codec *c) { return c ? c->d : 0; }
size_t kvq_codec_vector_bytes(const kvq_codec *c) { return c ? c->bytes : 0; }
double kvq_codec_bits_per_value(const kvq_codec *c) {
    return c ? (double)c->bytes * 8.0 / (double)c->d : 0.0;
}
size_t kvq_codec_state_bytes(const kvq_codec *c) {
    const kvq__family_ops *ops = c ? kvq__ops_of(c) : NULL;
    return ops && ops->state_size ? ops->state_size(c) : 0;
}
kvq_isa kvq_codec_isa(const kvq_codec *c) { return c ? c->isa : KVQ_ISA_SCALAR; }
int kvq_codec_needs_fit(const kvq_codec *c) { return c && c->family == KVQ__FAM_NUQ && !c->fitted; }

size_t kvq_codec_encode_bound(const kvq_codec *c, size_t n) {
    if (!c || (c->bytes && n > SIZE_MAX / c->bytes))
        return 0;
    return n * c->bytes;
}

kvq_status kvq_codec_encode(const kvq_codec *c, void *dst, size_t dst_capacity, const float *src,
                            size_t n) {
    if (!c || (n && (!dst || !src)))
        return KVQ_ERR_INVALID_ARG;
    if (n > SIZE_MAX / c->bytes / 2 || n > SIZE_MAX / sizeof(float) / c->d)
        return KVQ_ERR_INVALID_ARG;
    if (dst_capacity < n * c->bytes)
        return KVQ_ERR_DST_TOO_SMALL;
    if (kvq_codec_needs_fit(c))
        return KVQ_ERR_NOT_FITTED;
    int ok = c->k.encode_chk ? c->k.encode_chk(c, (uint8_t *)dst, src, n) : -1;
    if (ok < 0) { /* no fused check (or no scratch for it): check first */
        if (!kvq__all_finite(src, n * c->d))
            return KVQ_ERR_NONFINITE;
        c->k.encode(c, (uint8_t *)dst, src, n);
        ok = 1;
    }
    return ok ? KVQ_OK : KVQ_ERR_NONFINITE;
}

kvq_status kvq_codec_decode(const kvq_codec *c, float *dst, size_t dst_capacity, const void *src,
                            size_t src_size) {
    if (!c || (src_size && (!dst || !src)))
        return KVQ_ERR_INVALID_ARG;
    if (src_size % c->bytes)
        return KVQ_ERR_SRC_SIZE;
    size_t n = src_size / c->bytes;
    if (n > SIZE_MAX / c->d || dst_capacity < n * c->d)
        return KVQ_ERR_DST_TOO_SMALL;
    if (kvq_codec_needs_fit(c))
        return KVQ_ERR_NOT_FITTED;
    c->k.decode(c, dst, (const uint8_t *)src, n);
    return KVQ_OK;
}

#define KVQ__STACK_QP 16384

kvq_status kvq_codec_score(const kvq_codec *c, float *scores, size_t scores_capacity, const float *q,
                           size_t n_q, const void *keys, size_t keys_size) {
    if (!c || !q || n_q == 0 || (keys_size && (!keys || !scores)))
        return KVQ_ERR_INVALID_ARG;
    if (keys_size % c->bytes)
        return KVQ_ERR_SRC_SIZE;
    size_t n = keys_size / c->bytes;
    if (n && n_q > SIZE_MAX / n)
        return KVQ_ERR_INVALID_ARG;
    if (scores_capacity < n_q * n)
        return KVQ_ERR_DST_TOO_SMALL;
    if (kvq_codec_needs_fit(c))
        return KVQ_ERR_NOT_FITTED;
    if (n_q > SIZE_MAX / c->d || !kvq__all_finite(q, n_q * c->d))
        return KVQ_ERR_NONFINITE;
    if (n == 0)
        return KVQ_OK;
    _Alignas(64) uint8_t stackbuf[KVQ__STACK_QP];
    uint8_t *qp = stackbuf;
    if (n_q > SIZE_MAX / c->qp_bytes)
        return KVQ_ERR_INVALID_ARG;
    size_t need = n_q * c->qp_bytes;
    if (need > sizeof stackbuf) {
        qp = (uint8_t *)kvq__alloc(&c->alloc, need);
        if (!qp)
            return KVQ_ERR_NOMEM;
    }
    kvq__codec_prep(c, qp, q, n_q);
    c->k.score(c, scores, n, qp, n_q, (const uint8_t *)keys, n);
    if (qp != stackbuf)
        kvq__free(&c->alloc, qp);
    return KVQ_OK;
}

kvq_status kvq_codec_accumulate(const kvq_codec *c, float *out, size_t out_capacity, const float *w,
                                size_t n_q, const void *vals, size_t vals_size) {
    if (!c || !out || n_q == 0 || (vals_size && (!vals || !w)))
        return KVQ_ERR_INVALID_ARG;
    if (vals_size % c->bytes)
        return KVQ_ERR_SRC_SIZE;
    size_t n = vals_size / c->bytes;
    if (n_q > SIZE_MAX / c->d / sizeof(float) || out_capacity < n_q * c->d)
        return KVQ_ERR_DST_TOO_SMALL;
    if (kvq_codec_needs_fit(c))
        return KVQ_ERR_NOT_FITTED;
    if (n && n_q > SIZE_MAX / n)
        return KVQ_ERR_INVALID_ARG;
    if (n == 0)
        return KVQ_OK;
    if (!kvq__all_finite(w, n_q * n))
        return KVQ_ERR_NONFINITE;
    if (!c->k.finish) {
        c->k.accum(c, out, c->d, w, n, n_q, (const uint8_t *)vals, n);
        return KVQ_OK;
    }
    float *acc = (float *)kvq__calloc(&c->alloc, n_q * c->acc_len * sizeof(float));
    if (!acc)
        return KVQ_ERR_NOMEM;
    c->k.accum(c, acc, c->acc_len, w, n, n_q, (const uint8_t *)vals, n);
    for (size_t i = 0; i < n_q; i++)
        c->k.finish(c, out + i * c->d, acc + i * c->acc_len);
    kvq__free(&c->alloc, acc);
    return KVQ_OK;
}

kvq_status kvq_codec_fit(kvq_codec *c, const float *x, size_t n) {
    if (!c || !x || n == 0)
        return KVQ_ERR_INVALID_ARG;
    if (n > SIZE_MAX / sizeof(float) / c->d)
        return KVQ_ERR_INVALID_ARG;
    if (!kvq__all_finite(x, n * c->d))
        return KVQ_ERR_NONFINITE;
    const kvq__family_ops *ops = kvq__ops_of(c);
    if (!ops->fit)
        return KVQ_OK;
    return ops->fit(c, x, n);
}

/* ---- state blob ----
 * "KVQS" u32 version(1) u32 head_dim u32 spec_len spec[spec_len] u64 payload_len
 * payload[payload_len] u32 crc32c(all preceding bytes). Little-endian. */
#define KVQ__STATE_VERSION 1u

kvq_status kvq_codec_save_state(const kvq_codec *c, void *dst, size_t cap, size_t *written) {
    if (!c || !written)
        return KVQ_ERR_INVALID_ARG;
    const kvq__family_ops *ops = kvq__ops_of(c);
    if (ops->state_size && !c->fitted && c->family == KVQ__FAM_NUQ)
        return KVQ_ERR_NOT_FITTED;
    size_t payload = ops->state_size ? ops->state_size(c) : 0;
    size_t slen = strlen(c->spec);
    size_t total = 4 + 4 + 4 + 4 + slen + 8 + payload + 4;
    if (!dst) {
        *written = total;
        return KVQ_OK;
    }
    if (cap < total)
        return KVQ_ERR_DST_TOO_SMALL;
    uint8_t *p = (uint8_t *)dst;
    memcpy(p, "KVQS", 4);
    kvq__st32(p + 4, KVQ__STATE_VERSION);
    kvq__st32(p + 8, (uint32_t)c->d);
    kvq__st32(p + 12, (uint32_t)slen);
    memcpy(p + 16, c->spec, slen);
    kvq__st64(p + 16 + slen, (uint64_t)payload);
    if (payload)
        ops->state_save(c, p + 24 + slen);
    kvq__st32(p + total - 4, kvq__crc32c(0, p, total - 4));
    *written = total;
    return KVQ_OK;
}

kvq_status kvq_codec_load_state(kvq_codec *c, const void *src, size_t size) {
    if (!c || !src)
        return KVQ_ERR_INVALID_ARG;
    const uint8_t *p = (const uint8_t *)src;
    if (size < 28 || memcmp(p, "KVQS", 4) != 0)
        return KVQ_ERR_CORRUPT;
    if (kvq__ld32(p + size - 4) != kvq__crc32c(0, p, size - 4))
        return KVQ_ERR_CORRUPT;
    if (kvq__ld32(p + 4) != KVQ__STATE_VERSION)
        return KVQ_ERR_VERSION;
    size_t slen = kvq__ld32(p + 12);
    if (slen > size - 28)
        return KVQ_ERR_CORRUPT;
    uint64_t payload = kvq__ld64(p + 16 + slen);
    if (payload != size - 28 - slen)
        return KVQ_ERR_CORRUPT;
    if (kvq__ld32(p + 8) != c->d || slen != strlen(c->spec) || memcmp(p + 16, c->spec, slen) != 0)
        return KVQ_ERR_MISMATCH;
    const kvq__family_ops *ops = kvq__ops_of(c);
    if (!ops->state_load)
        return payload == 0 ? KVQ_OK : KVQ_ERR_MISMATCH;
    return ops->state_load(c, p + 24 + slen, (size_t)payload);
}

kvq_status kvq_codec_save_file(const kvq_codec *c, const char *path) {
    if (!c || !path)
        return KVQ_ERR_INVALID_ARG;
    size_t size;
    kvq_status st = kvq_codec_save_state(c, NULL, 0, &size);
    if (st != KVQ_OK)
        return st;
    uint8_t *buf = (uint8_t *)kvq__alloc(&c->alloc, size);
    if (!buf)
        return KVQ_ERR_NOMEM;
    st = kvq_codec_save_state(c, buf, size, &size);
    size_t plen = strlen(path);
    char *tmp = (char *)kvq__alloc(&c->alloc, plen + 16);
    if (!tmp) {
        kvq__free(&c->alloc, buf);
        return KVQ_ERR_NOMEM;
    }
    snprintf(tmp, plen + 16, "%s.tmpXXXXXX", path);
    int fd = st == KVQ_OK ? mkstemp(tmp) : -1;
    if (st == KVQ_OK && fd < 0)
        st = KVQ_ERR_IO;
    if (fd >= 0) {
        size_t off = 0;
        while (off < size) {
            ssize_t w = write(fd, buf + off, size - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                st = KVQ_ERR_IO;
                break;
            }
            off += (size_t)w;
        }
        if (st == KVQ_OK && fsync(fd) != 0)
            st = KVQ_ERR_IO;
        if (close(fd) != 0 && st == KVQ_OK)
            st = KVQ_ERR_IO;
        if (st == KVQ_OK && rename(tmp, path) != 0)
            st = KVQ_ERR_IO;
        if (st != KVQ_OK)
            unlink(tmp);
        else if (kvq__fsync_parent(path) != 0)
            st = KVQ_ERR_IO; /* the new file is in place, but may not be after a crash */
    }
    kvq__free(&c->alloc, tmp);
    kvq__free(&c->alloc, buf);
    return st;
}

kvq_status kvq_codec_load_file(kvq_codec *c, const char *path) {
    if (!c || !path)
        return KVQ_ERR_INVALID_ARG;
    uint8_t *buf;
    size_t len;
    kvq_status st = kvq__read_file(&c->alloc, path, 28, (size_t)1 << 30, &buf, &len);
    if (st == KVQ_OK)
        st = kvq_codec_load_state(c, buf, len);
    kvq__free(&c->alloc, buf);
    return st;
}
