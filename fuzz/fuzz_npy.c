/*
 * fuzz_npy.c - libFuzzer target for the tool's .npy reader (tools/npy.c).
 * Properties: no read outside the input and no allocation the file's own
 * length does not justify; the reader either refuses with -1, a message and
 * no data, or returns rows x cols floats (both > 0, shape product = rows *
 * cols) whose bytes are exactly what follows the header (float32 or
 * float16), and the path entry (through a memfd) agrees with the stream one.
 * tests/test_fuzz_replay.c replays fuzz/corpus/npy/ through it.
 */
#include "npy.h"

#include "fuzz_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t kvq_fuzz_npy_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int kvq_fuzz_npy(const uint8_t *data, size_t size) {
    /* fmemopen wants a writable buffer of at least one byte */
    uint8_t *buf = (uint8_t *)calloc(size ? size : 1, 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    FILE *f = size ? fmemopen(buf, size, "rb") : NULL;
    int bad = 0;
    float *x = NULL;
    size_t rows = 0, cols = 0, shape[KVQT_NPY_MAX_AXES];
    int ndim = 0, rc = -1;
    char err[512] = "";
    if (f) {
        rc = kvqt_npy_read(f, "input", &x, &rows, &cols, shape, &ndim, err, sizeof err);
        fclose(f);
        if (rc != 0) {
            bad = rc != -1 || x != NULL || !err[0];
        } else {
            size_t prod = 1;
            for (int i = 0; i < ndim; i++)
                prod *= shape[i];
            /* the header is 10 or 12 bytes plus its length: the data is the
             * rest of the file, 4 or 2 bytes per value */
            size_t hdr = data[6] == 1 ? 10 + (size_t)(data[8] | data[9] << 8)
                                      : 12 + (size_t)kvq_fuzz_npy_ld32(data + 8);
            size_t rest = size - hdr, n = rows * cols;
            bad = !x || rows == 0 || cols == 0 || ndim < 1 || ndim > KVQT_NPY_MAX_AXES ||
                  cols != shape[ndim - 1] || prod != n || hdr > size ||
                  (rest != 2 * n && rest != 4 * n);
            volatile float sink = 0.0f;
            for (size_t i = 0; !bad && i < rows * cols; i++)
                sink += x[i];
            (void)sink;
        }
    }
    /* the path entry gives the same answer */
    const char *path = kvq_fuzz_as_file(data, size);
    if (!bad && path) {
        float *y = NULL;
        size_t r2 = 0, c2 = 0;
        char e2[512];
        int rc2 = kvqt_npy_load(path, &y, &r2, &c2, e2, sizeof e2);
        if (size && (rc2 != rc || r2 != (rc ? r2 : rows) || c2 != (rc ? c2 : cols) ||
                     (rc == 0 && memcmp(x, y, rows * cols * sizeof(float)) != 0)))
            bad = 1;
        if (!size && rc2 != -1)
            bad = 1;
        free(y);
    }
    free(x);
    free(buf);
    return bad;
}

/* 1 when the reader accepts the input (as a file). */
static int kvq_fuzz_npy_accepts(const uint8_t *data, size_t size) {
    const char *path = kvq_fuzz_as_file(data, size);
    float *x = NULL;
    size_t r, c;
    char err[512];
    int ok = path && kvqt_npy_load(path, &x, &r, &c, err, sizeof err) == 0;
    free(x);
    return ok;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_npy(data, size))
        abort();
    return 0;
}
#endif
