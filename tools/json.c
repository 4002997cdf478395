/* json.c - the small JSON reader (see json.h). */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t i;
    char *err;
    size_t err_size;
    int failed;
} kj_ctx;

static void kj_fail(kj_ctx *c, const char *what) {
    if (!c->failed)
        snprintf(c->err, c->err_size, "JSON error at byte %zu: %s", c->i, what);
    c->failed = 1;
}

static void kj_ws(kj_ctx *c) {
    while (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')
        c->i++;
}

static void kj_clear(kj_value *v) {
    if (v->type == KJ_STR)
        free(v->str);
    if (v->type == KJ_ARR || v->type == KJ_OBJ) {
        for (size_t k = 0; k < v->n; k++) {
            kj_clear(&v->items[k]);
            if (v->keys)
                free(v->keys[k]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof *v);
}

static char *kj_string(kj_ctx *c) {
    if (c->s[c->i] != '"') {
        kj_fail(c, "expected a string");
        return NULL;
    }
    c->i++;
    size_t cap = 32, n = 0;
    char *out = malloc(cap);
    while (out && c->s[c->i] && c->s[c->i] != '"') {
        char ch = c->s[c->i++];
        if ((unsigned char)ch < 0x20) {
            kj_fail(c, "control character in a string");
            free(out);
            return NULL;
        }
        if (ch == '\\') {
            char e = c->s[c->i];
            if (!e)
                break; /* unterminated: reported below, never read past the end */
            c->i++;
            switch (e) {
            case 'n': ch = '\n'; break;
            case 't': ch = '\t'; break;
            case 'r': ch = '\r'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case '"': case '\\': case '/': ch = e; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 0; k < 4; k++) {
                    char h = c->s[c->i]; /* NUL ends the loop as a bad digit */
                    int x = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (x < 0) {
                        kj_fail(c, "\\u needs four hex digits");
                        free(out);
                        return NULL;
                    }
                    c->i++;
                    v = v * 16 + (unsigned)x;
                }
                if (v > 0x7f || v == 0) {
                    kj_fail(c, "\\u escapes other than U+0001..U+007F are not supported");
                    free(out);
                    return NULL;
                }
                ch = (char)v;
                break;
            }
            default:
                kj_fail(c, "bad escape");
                free(out);
                return NULL;
            }
        }
        if (n + 2 > cap) {
            cap *= 2;
            char *o2 = realloc(out, cap);
            if (!o2) {
                free(out);
                out = NULL;
                break;
            }
            out = o2;
        }
        out[n++] = ch;
    }
    if (!out) {
        kj_fail(c, "out of memory");
        return NULL;
    }
    if (c->s[c->i] != '"') {
        kj_fail(c, "unterminated string");
        free(out);
        return NULL;
    }
    c->i++;
    out[n] = 0;
    return out;
}

static int kj_value_parse(kj_ctx *c, kj_value *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > 64) {
        kj_fail(c, "nesting too deep");
        return -1;
    }
    kj_ws(c);
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') {
        int obj = ch == '{';
        v->type = obj ? KJ_OBJ : KJ_ARR;
        c->i++;
        size_t cap = 0;
        kj_ws(c);
        if (c->s[c->i] == (obj ? '}' : ']')) {
            c->i++;
            return 0;
        }
        for (;;) {
            if (v->n == cap) {
                cap = cap ? cap * 2 : 8;
                kj_value *it = realloc(v->items, cap * sizeof *it);
                if (!it) {
                    kj_fail(c, "out of memory");
                    return -1;
                }
                v->items = it;
                if (obj) {
                    char **ks = realloc(v->keys, cap * sizeof *ks);
                    if (!ks) {
                        kj_fail(c, "out of memory");
                        return -1;
                    }
                    v->keys = ks;
                }
            }
            if (obj) {
                kj_ws(c);
                char *k = kj_string(c);
                if (!k)
                    return -1;
                v->keys[v->n] = k;
                kj_ws(c);
                if (c->s[c->i] != ':') {
                    v->items[v->n].type = KJ_NULL;
                    v->n++;
                    kj_fail(c, "expected ':'");
                    return -1;
                }
                c->i++;
            }
            if (kj_value_parse(c, &v->items[v->n], depth + 1) != 0) {
                v->n++;
                return -1;
            }
            v->n++;
            kj_ws(c);
            if (c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->s[c->i] == (obj ? '}' : ']')) {
                c->i++;
                return 0;
            }
            kj_fail(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            return -1;
        }
    }
    if (ch == '"') {
        v->str = kj_string(c);
        if (!v->str)
            return -1;
        v->type = KJ_STR;
        return 0;
    }
    if (!strncmp(c->s + c->i, "true", 4) || !strncmp(c->s + c->i, "false", 5)) {
        v->type = KJ_BOOL;
        v->boolean = c->s[c->i] == 't';
        c->i += v->boolean ? 4 : 5;
        return 0;
    }
    if (!strncmp(c->s + c->i, "null", 4)) {
        c->i += 4;
        return 0;
    }
    /* RFC 8259 numbers only: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
     * (strtod alone would take nan, inf, hex and leading '+') */
    const char *p = c->s + c->i, *q = p;
    if (*q == '-')
        q++;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (*q >= '0' && *q <= '9')
            q++;
    else {
        kj_fail(c, "unexpected character");
        return -1;
    }
    if (*q == '.') {
        q++;
        if (!(*q >= '0' && *q <= '9')) {
            kj_fail(c, "a digit must follow the decimal point");
            return -1;
        }
        while (*q >= '0' && *q <= '9')
            q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-')
            q++;
        if (!(*q >= '0' && *q <= '9')) {
            kj_fail(c, "a digit must follow the exponent");
            return -1;
        }
        while (*q >= '0' && *q <= '9')
            q++;
    }
    char *end;
    v->num = strtod(p, &end);
    if (end != q || !isfinite(v->num)) {
        kj_fail(c, "number out of range");
        return -1;
    }
    v->type = KJ_NUM;
    c->i = (size_t)(q - c->s);
    return 0;
}

kj_value *kj_parse(const char *text, char *err, size_t err_size) {
    kj_ctx c = {text, 0, err, err_size, 0};
    kj_value *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    if (kj_value_parse(&c, v, 0) == 0) {
        kj_ws(&c);
        if (text[c.i])
            kj_fail(&c, "trailing characters");
    }
    if (c.failed) {
        kj_free(v);
        return NULL;
    }
    return v;
}

void kj_free(kj_value *v) {
    if (!v)
        return;
    kj_clear(v);
    free(v);
}

const kj_value *kj_get(const kj_value *o, const char *key) {
    if (!o || o->type != KJ_OBJ)
        return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key))
            return &o->items[k];
    return NULL;
}
