/*
 * fuzz_codec_state.c - libFuzzer target for the codec state blob
 * (kvq_codec_load_state, src/codec/codec.c, and the family hooks in nuq.c
 * and tq.c) and the calibration file that holds one (kvq_codec_load_file).
 * The codec is created from the spec and head_dim written in the blob (head
 * dims up to 128, so that a TurboQuant rotation stays cheap); otherwise a
 * fixed nuq3 codec takes the blob. Properties: no read outside the blob;
 * loading fails with KVQ_ERR_CORRUPT / VERSION / MISMATCH and leaves the
 * codec's state as it was (its saved blob unchanged), or succeeds and the
 * codec saves exactly the blob it loaded, then encodes, decodes, scores and
 * accumulates; the file path gives the same status as the blob (files are
 * written to a memfd and read through /proc/self/fd). Each input is also
 * tried with its trailing CRC32C recomputed, so mutations reach the checks
 * behind it. tests/test_fuzz_replay.c replays fuzz/corpus/codec_state/.
 */
#include "common/common.h"

#include "fuzz_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The codec's saved state in a malloc'd buffer (*n bytes), or NULL with
 * *st the status. */
static uint8_t *kvq_fuzz_saved(const kvq_codec *c, size_t *n, kvq_status *st) {
    *st = kvq_codec_save_state(c, NULL, 0, n);
    if (*st != KVQ_OK)
        return NULL;
    uint8_t *b = (uint8_t *)malloc(*n);
    if (b && (*st = kvq_codec_save_state(c, b, *n, n)) != KVQ_OK) {
        free(b);
        b = NULL;
    }
    return b;
}

/* Runs every operation of a loaded codec on a few vectors. */
static int kvq_fuzz_use(const kvq_codec *c) {
    size_t d = kvq_codec_head_dim(c), vb = kvq_codec_vector_bytes(c);
    float *x = (float *)malloc(3 * d * sizeof(float)), *y = (float *)calloc(3 * d, sizeof(float));
    uint8_t *e = (uint8_t *)malloc(3 * vb);
    float sc[9];
    int bad = 0;
    if (x && y && e) {
        for (size_t i = 0; i < 3 * d; i++)
            x[i] = (float)((int)(i * 37 % 23) - 11) * (i < d ? 1e-3f : i < 2 * d ? 1.0f : 1e4f);
        kvq_status st = kvq_codec_encode(c, e, 3 * vb, x, 3);
        if (st == KVQ_OK) {
            bad |= kvq_codec_decode(c, y, 3 * d, e, 3 * vb) != KVQ_OK;
            bad |= kvq_codec_score(c, sc, 9, x, 3, e, 3 * vb) != KVQ_OK;
            float w[9] = {1, 0.5f, 0.25f, 0, 1, 0, 0.1f, 0.2f, 0.3f};
            bad |= kvq_codec_accumulate(c, y, 3 * d, w, 3, e, 3 * vb) != KVQ_OK;
        } else {
            bad = st != KVQ_ERR_NOMEM;
        }
    }
    free(x);
    free(y);
    free(e);
    return bad;
}

static int kvq_fuzz_state_once(const uint8_t *buf, size_t len) {
    char spec[128] = "nuq3";
    size_t d = 8;
    if (len >= 16 && memcmp(buf, "KVQS", 4) == 0) {
        uint32_t hd = kvq__ld32(buf + 8), sl = kvq__ld32(buf + 12);
        if (hd >= 1 && hd <= 128 && sl < sizeof spec && sl <= len - 16 &&
            memchr(buf + 16, 0, sl) == NULL) {
            memcpy(spec, buf + 16, sl);
            spec[sl] = 0;
            d = hd;
        }
    }
    kvq_codec *c = NULL, *c2 = NULL;
    if (kvq_codec_create(&c, spec, d, NULL) != KVQ_OK &&
        kvq_codec_create(&c, "nuq3", 8, NULL) != KVQ_OK)
        return 0; /* out of memory */
    int bad = 0;
    size_t n0 = 0;
    kvq_status st0;
    uint8_t *before = kvq_fuzz_saved(c, &n0, &st0);
    kvq_status st = kvq_codec_load_state(c, buf, len);
    if (st != KVQ_OK) {
        bad = st != KVQ_ERR_CORRUPT && st != KVQ_ERR_VERSION && st != KVQ_ERR_MISMATCH;
        size_t n1 = 0;
        kvq_status st1;
        uint8_t *after = kvq_fuzz_saved(c, &n1, &st1);
        /* nothing changed: the same saved state, or still not fitted */
        if (st1 != st0 || n1 != n0 || (before && (!after || memcmp(before, after, n0) != 0)))
            bad = 1;
        free(after);
    } else {
        size_t n1 = 0;
        kvq_status st1;
        uint8_t *after = kvq_fuzz_saved(c, &n1, &st1);
        if (st1 != KVQ_OK || n1 != len || memcmp(after, buf, len) != 0)
            bad = 1;
        free(after);
        if (!bad)
            bad = kvq_fuzz_use(c);
    }
    free(before);
    /* the calibration file: the same status through a path */
    const char *path = kvq_fuzz_as_file(buf, len);
    if (!bad && path && kvq_codec_create(&c2, kvq_codec_spec(c), kvq_codec_head_dim(c), NULL) == KVQ_OK) {
        kvq_status sf = kvq_codec_load_file(c2, path);
        if (sf != st && !(len < 28 && sf == KVQ_ERR_CORRUPT))
            bad = 1;
        kvq_codec_free(c2);
    }
    kvq_codec_free(c);
    return bad;
}

static int kvq_fuzz_codec_state(const uint8_t *data, size_t size) {
    uint8_t *buf = (uint8_t *)calloc(size ? size : 1, 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    int bad = kvq_fuzz_state_once(buf, size);
    if (!bad && size >= 28) {
        kvq__st32(buf + size - 4, kvq__crc32c(0, buf, size - 4));
        bad = kvq_fuzz_state_once(buf, size);
    }
    free(buf);
    return bad;
}

/* 1 when a codec of the blob's own spec and head_dim loads it as it is. */
static int kvq_fuzz_codec_state_accepts(const uint8_t *data, size_t size) {
    char spec[128];
    if (size < 16 || memcmp(data, "KVQS", 4) != 0)
        return 0;
    uint32_t hd = kvq__ld32(data + 8), sl = kvq__ld32(data + 12);
    if (hd < 1 || hd > 1024 || sl >= sizeof spec || sl > size - 16)
        return 0;
    memcpy(spec, data + 16, sl);
    spec[sl] = 0;
    kvq_codec *c = NULL;
    if (kvq_codec_create(&c, spec, hd, NULL) != KVQ_OK)
        return 0;
    kvq_status st = kvq_codec_load_state(c, data, size);
    kvq_codec_free(c);
    return st == KVQ_OK;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_codec_state(data, size))
        abort();
    return 0;
}
#endif
