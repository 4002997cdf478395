/*
 * alloc_json.c - the --alloc cache configuration (written by kvq calibrate):
 *   {"kvq_alloc": 1, "k_codec": "f16", "v_codec": "f16", "k_layout": "token",
 *    "k_prerope": true, "k_center": true, "page": 32, "recent": 0,
 *    "overrides": [{"layer": 0, "head": 1, "kind": "k", "codec": "chan:int3",
 *                   "state": "<hex of kvq_codec_save_state>"}, ...],
 *    "center": [n_layers * n_kv_heads * head_dim numbers], ...}
 * Keys not listed here are ignored: the figures kvq calibrate measured
 * (target_bits, asymptotic_bits_per_value, fixed_bytes_per_sequence,
 * bits_per_value, kl, nll, ... and per override bits, kl_alone, measured).
 */
#include "alloc_json.h"
#include "json.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file, NUL-terminated (*n bytes), or NULL with *why set. */
static char *kvqt_slurp(const char *path, size_t max, size_t *n, const char **why) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    size_t cap = 1 << 16;
    char *b = malloc(cap + 1);
    size_t r;
    *why = b ? NULL : "out of memory";
    while (b && (r = fread(b + *n, 1, cap - *n, f)) > 0) {
        *n += r;
        if (*n == cap) {
            char *b2 = cap < max ? realloc(b, 2 * cap + 1) : NULL;
            if (!b2) {
                *why = cap < max ? "out of memory" : "too large for an allocation file";
                free(b);
                b = NULL;
                break;
            }
            b = b2;
            cap *= 2;
        }
    }
    if (b && ferror(f)) {
        *why = errno == EISDIR ? "is a directory, not a file" : errno ? strerror(errno)
                                                                     : "read error";
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b)
        b[*n] = 0;
    return b;
}

static int kvqt_hexdigit(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
         : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

static int kvqt_hex(const char *s, unsigned char **out, size_t *n) {
    size_t len = strlen(s);
    if (len % 2)
        return -1;
    *out = malloc(len / 2 + 1);
    if (!*out)
        return -1;
    for (size_t i = 0; i < len / 2; i++) {
        int hi = kvqt_hexdigit(s[2 * i]), lo = kvqt_hexdigit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(*out);
            *out = NULL;
            return -1;
        }
        (*out)[i] = (unsigned char)(hi * 16 + lo);
    }
    *n = len / 2;
    return 0;
}

/* A JSON number that must be an integer in lo..hi (1), else 0. */
static int kvqt_int_in(const kj_value *v, double lo, double hi, long long *out) {
    if (!v || v->type != KJ_NUM || !(v->num >= lo && v->num <= hi) || v->num != floor(v->num))
        return 0;
    *out = (long long)v->num;
    return 1;
}

int kvqt_alloc_load(const char *path, kvqt_cacheopts *o, char *err, size_t err_size) {
    size_t len;
    const char *why = NULL;
    errno = 0;
    char *text = kvqt_slurp(path, (size_t)1 << 28, &len, &why);
    if (!text || !len) {
        snprintf(err, err_size, "%s", text ? "the file is empty" : why ? why : "cannot read it");
        free(text);
        return -1;
    }
    kj_value *root = kj_parse(text, err, err_size);
    free(text);
    if (!root)
        return -1;
    int rc = -1;
    const kj_value *v;
    if (root->type != KJ_OBJ || !(v = kj_get(root, "kvq_alloc")) || v->type != KJ_NUM || v->num != 1) {
        snprintf(err, err_size, "not a kvq allocation file (version 1)");
        goto done;
    }
    if ((v = kj_get(root, "k_codec")) && v->type == KJ_STR)
        snprintf(o->k_codec, sizeof o->k_codec, "%s", v->str);
    if ((v = kj_get(root, "v_codec")) && v->type == KJ_STR)
        snprintf(o->v_codec, sizeof o->v_codec, "%s", v->str);
    if ((v = kj_get(root, "k_layout")) && v->type == KJ_STR)
        o->k_layout_channel = !strcmp(v->str, "channel");
    if ((v = kj_get(root, "k_prerope")) && v->type == KJ_BOOL)
        o->k_prerope = v->boolean;
    if ((v = kj_get(root, "k_center")) && v->type == KJ_BOOL)
        o->k_center = v->boolean;
    long long iv;
    if ((v = kj_get(root, "page"))) {
        if (!kvqt_int_in(v, 1, 4096, &iv)) {
            snprintf(err, err_size, "page must be an integer in 1..4096");
            goto done;
        }
        o->page = (size_t)iv;
    }
    if ((v = kj_get(root, "recent"))) {
        if (!kvqt_int_in(v, 0, 1 << 20, &iv)) {
            snprintf(err, err_size, "recent must be an integer in 0..1048576");
            goto done;
        }
        o->recent = (size_t)iv;
    }
    for (size_t i = 0; i < o->n_ovr; i++)
        free(o->ovr_state[i]);
    o->n_ovr = 0;
    if ((v = kj_get(root, "overrides")) && v->type == KJ_ARR) {
        if (v->n > KVQT_MAX_OVR) {
            snprintf(err, err_size, "more than %d overrides", KVQT_MAX_OVR);
            goto done;
        }
        for (size_t i = 0; i < v->n; i++) {
            const kj_value *e = &v->items[i], *l = kj_get(e, "layer"), *h = kj_get(e, "head"),
                           *k = kj_get(e, "kind"), *c = kj_get(e, "codec"), *s = kj_get(e, "state");
            if (!l || l->type != KJ_NUM || !h || h->type != KJ_NUM || !k || k->type != KJ_STR ||
                !c || c->type != KJ_STR || (strcmp(k->str, "k") && strcmp(k->str, "v"))) {
                snprintf(err, err_size, "override %zu needs layer, head, kind (k|v) and codec", i);
                goto done;
            }
            long long li, hi;
            if (!kvqt_int_in(l, -1, 65535, &li) || !kvqt_int_in(h, -1, 65535, &hi)) {
                snprintf(err, err_size, "override %zu: layer and head must be integers in "
                                        "-1..65535 (-1: all)", i);
                goto done;
            }
            kvq_codec_override *ov = &o->ovr[o->n_ovr];
            memset(ov, 0, sizeof *ov);
            ov->layer = (int)li;
            ov->kv_head = (int)hi;
            ov->is_value = k->str[0] == 'v';
            snprintf(o->ovr_codec[o->n_ovr], sizeof o->ovr_codec[0], "%s", c->str);
            ov->codec = o->ovr_codec[o->n_ovr];
            o->ovr_state[o->n_ovr] = NULL;
            if (s && s->type == KJ_STR) {
                size_t n;
                if (kvqt_hex(s->str, &o->ovr_state[o->n_ovr], &n) != 0) {
                    snprintf(err, err_size, "override %zu: state is not hex", i);
                    goto done;
                }
                ov->state = o->ovr_state[o->n_ovr];
                ov->state_size = n;
            }
            o->n_ovr++;
        }
    }
    free(o->center_values);
    o->center_values = NULL;
    if ((v = kj_get(root, "center")) && v->type == KJ_ARR && v->n) {
        o->center_values = malloc(v->n * sizeof(float));
        if (!o->center_values) {
            snprintf(err, err_size, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < v->n; i++) {
            if (v->items[i].type != KJ_NUM || !(fabs(v->items[i].num) <= FLT_MAX)) {
                snprintf(err, err_size, "center must be finite float numbers");
                goto done;
            }
            o->center_values[i] = (float)v->items[i].num;
        }
        o->center_count = v->n;
    }
    rc = 0;
done:
    kj_free(root);
    return rc;
}
