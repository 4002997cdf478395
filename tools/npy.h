/*
 * npy.h - a loader for NumPy .npy files of K/V/Q activations: float32 or
 * float16, little-endian, C order, any number of axes. The last axis is
 * head_dim (cols); all others are flattened into rows. Anything else is
 * refused with a message that says what was found.
 */
#ifndef KVQ_NPY_H
#define KVQ_NPY_H

#include <stddef.h>
#include <stdio.h>

#define KVQT_NPY_MAX_AXES 16

/* On success returns 0 and sets *data (malloc'd, rows * cols floats; the
 * caller frees it), *rows and *cols. On failure returns -1, sets *data to
 * NULL and writes a message into err. */
int kvqt_npy_load(const char *path, float **data, size_t *rows, size_t *cols, char *err,
                  size_t err_size);

/* The same, also returning the shape (at most KVQT_NPY_MAX_AXES axes). */
int kvqt_npy_load_shape(const char *path, float **data, size_t *shape, int *ndim, char *err,
                        size_t err_size);

/* The same from an open stream at offset 0 (seekable: the data
 * size is held against the stream's length); path only names it in messages.
 * shape and ndim may be NULL. The stream is left open. */
int kvqt_npy_read(FILE *f, const char *path, float **data, size_t *rows, size_t *cols,
                  size_t *shape, int *ndim, char *err, size_t err_size);

#endif
