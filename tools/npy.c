/*
 * npy.c - the .npy loader (see npy.h). Format: magic "\x93NUMPY", major and
 * minor version bytes, header length (u16 for version 1, u32 for 2 and 3),
 * then an ASCII Python dict literal with 'descr', 'fortran_order' and
 * 'shape', padded with spaces and a newline; the raw array follows.
 */
#include "npy.h"

#include "kvq.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static void npy_err(char *err, size_t n, const char *path, const char *msg) {
    if (err && n)
        snprintf(err, n, "%s: %s", path, msg);
}

/* Points at the value of key in the dict text, or NULL. */
static const char *npy_value(const char *hdr, const char *key) {
    char q1[40], q2[40];
    snprintf(q1, sizeof q1, "'%s'", key);
    snprintf(q2, sizeof q2, "\"%s\"", key);
    const char *p = strstr(hdr, q1);
    if (!p)
        p = strstr(hdr, q2);
    if (!p)
        return NULL;
    p += strlen(q1);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

int kvqt_npy_read(FILE *f, const char *path, float **data, size_t *rows, size_t *cols,
                  size_t *shape_out, int *ndim_out, char *err, size_t err_size) {
    *data = NULL;
    char msg[256];
    int rc = -1;
    char *hdr = NULL;
    float *out = NULL;
    unsigned char pre[12];
    size_t hlen = 0, pre_len = 10;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        npy_err(err, err_size, path, "not a .npy file (bad magic)");
        goto done;
    }
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            npy_err(err, err_size, path, "truncated header");
            goto done;
        }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) |
               ((size_t)pre[11] << 24);
        pre_len = 12;
    } else {
        snprintf(msg, sizeof msg, "unsupported .npy version %d.%d", pre[6], pre[7]);
        npy_err(err, err_size, path, msg);
        goto done;
    }
    if (hlen == 0 || hlen > (1u << 20)) {
        npy_err(err, err_size, path, "bad header length");
        goto done;
    }
    hdr = (char *)malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        npy_err(err, err_size, path, "truncated header");
        goto done;
    }
    hdr[hlen] = 0;

    const char *v = npy_value(hdr, "descr");
    char descr[16] = "";
    if (v && (*v == '\'' || *v == '"')) {
        char qc = *v++;
        size_t n = 0;
        while (v[n] && v[n] != qc && n + 1 < sizeof descr) {
            descr[n] = v[n];
            n++;
        }
        descr[n] = 0;
    }
    if (!descr[0]) {
        npy_err(err, err_size, path, "header has no 'descr' (dtype)");
        goto done;
    }
    size_t item;
    if (strcmp(descr, "<f4") == 0 || strcmp(descr, "=f4") == 0) {
        item = 4;
    } else if (strcmp(descr, "<f2") == 0 || strcmp(descr, "=f2") == 0) {
        item = 2;
    } else {
        snprintf(msg, sizeof msg,
                 "dtype '%s' is not supported (need little-endian float32 '<f4' or float16 '<f2')",
                 descr);
        npy_err(err, err_size, path, msg);
        goto done;
    }
    v = npy_value(hdr, "fortran_order");
    if (!v || (strncmp(v, "False", 5) != 0 && strncmp(v, "True", 4) != 0)) {
        npy_err(err, err_size, path, "header has no 'fortran_order'");
        goto done;
    }
    if (strncmp(v, "True", 4) == 0) {
        npy_err(err, err_size, path, "Fortran-order arrays are not supported (save in C order)");
        goto done;
    }
    v = npy_value(hdr, "shape");
    if (!v || *v != '(') {
        npy_err(err, err_size, path, "header has no 'shape'");
        goto done;
    }
    size_t shape[KVQT_NPY_MAX_AXES];
    int ndim = 0;
    const char *p = v + 1;
    for (;;) {
        while (*p == ' ')
            p++;
        if (*p == ')')
            break;
        if (!isdigit((unsigned char)*p) || ndim == KVQT_NPY_MAX_AXES) {
            npy_err(err, err_size, path, "cannot parse 'shape'");
            goto done;
        }
        errno = 0;
        char *end;
        unsigned long long s = strtoull(p, &end, 10);
        if (errno || s > SIZE_MAX) {
            npy_err(err, err_size, path, "shape value out of range");
            goto done;
        }
        shape[ndim++] = (size_t)s;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == ',')
            p++;
        else if (*p != ')') {
            npy_err(err, err_size, path, "cannot parse 'shape'");
            goto done;
        }
    }
    if (ndim == 0) {
        npy_err(err, err_size, path,
                "0-dimensional array (need at least one axis, the last being head_dim)");
        goto done;
    }
    if (shape_out)
        for (int i = 0; i < ndim; i++)
            shape_out[i] = shape[i];
    if (ndim_out)
        *ndim_out = ndim;
    size_t c = shape[ndim - 1], r = 1;
    for (int i = 0; i + 1 < ndim; i++) {
        if (shape[i] && r > SIZE_MAX / shape[i]) {
            npy_err(err, err_size, path, "array too large");
            goto done;
        }
        r *= shape[i];
    }
    if (r == 0 || c == 0) {
        npy_err(err, err_size, path, "empty array");
        goto done;
    }
    if (r > SIZE_MAX / c || r * c > SIZE_MAX / 4) {
        npy_err(err, err_size, path, "array too large");
        goto done;
    }
    size_t total = r * c;
    long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) {
        npy_err(err, err_size, path, "cannot seek");
        goto done;
    }
    long fsize = ftell(f);
    if (fsize < 0 || fseek(f, here, SEEK_SET) != 0) {
        npy_err(err, err_size, path, "cannot seek");
        goto done;
    }
    size_t have = (size_t)(fsize - here), need = total * item;
    if ((size_t)here != pre_len + hlen || have != need) {
        snprintf(msg, sizeof msg, "%s: the shape needs %zu data bytes, the file has %zu",
                 have < need ? "truncated" : "trailing bytes", need, have);
        npy_err(err, err_size, path, msg);
        goto done;
    }
    out = (float *)malloc(total * sizeof(float));
    if (!out) {
        npy_err(err, err_size, path, "out of memory");
        goto done;
    }
    if (item == 4) {
        unsigned char *b = (unsigned char *)out;
        if (fread(b, 4, total, f) != total) {
            npy_err(err, err_size, path, "read error");
            goto done;
        }
        for (size_t i = 0; i < total; i++) { /* little-endian file to host order */
            uint32_t u = (uint32_t)b[4 * i] | ((uint32_t)b[4 * i + 1] << 8) |
                         ((uint32_t)b[4 * i + 2] << 16) | ((uint32_t)b[4 * i + 3] << 24);
            memcpy(out + i, &u, 4);
        }
    } else {
        unsigned char buf[4096];
        size_t i = 0;
        while (i < total) {
            size_t m = total - i < sizeof buf / 2 ? total - i : sizeof buf / 2;
            if (fread(buf, 2, m, f) != m) {
                npy_err(err, err_size, path, "read error");
                goto done;
            }
            for (size_t k = 0; k < m; k++)
                out[i + k] = kvq_f16_to_f32((uint16_t)(buf[2 * k] | (buf[2 * k + 1] << 8)));
            i += m;
        }
    }
    *data = out;
    out = NULL;
    *rows = r;
    *cols = c;
    rc = 0;
done:
    free(out);
    free(hdr);
    return rc;
}

static int npy_load_impl(const char *path, float **data, size_t *rows, size_t *cols,
                         size_t *shape_out, int *ndim_out, char *err, size_t err_size) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        char msg[256];
        snprintf(msg, sizeof msg, "cannot open: %s", strerror(errno));
        npy_err(err, err_size, path, msg);
        return -1;
    }
    int rc = kvqt_npy_read(f, path, data, rows, cols, shape_out, ndim_out, err, err_size);
    fclose(f);
    return rc;
}

int kvqt_npy_load(const char *path, float **data, size_t *rows, size_t *cols, char *err,
                  size_t err_size) {
    return npy_load_impl(path, data, rows, cols, NULL, NULL, err, err_size);
}

int kvqt_npy_load_shape(const char *path, float **data, size_t *shape, int *ndim, char *err,
                        size_t err_size) {
    size_t r, c;
    return npy_load_impl(path, data, &r, &c, shape, ndim, err, err_size);
}
