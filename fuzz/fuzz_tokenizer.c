/*
 * fuzz_tokenizer.c - libFuzzer target for the llama2.c tokenizer.bin reader
 * and its BPE encoder (src/model/tokenizer.c). The vocabulary size is not in
 * the file (the model gives it): the target counts the well-formed entries
 * of the input on its own and loads with that count (at least 259, the
 * smallest the format allows) and with one more. Properties: no read
 * outside the input; a file with fewer entries than asked is refused with
 * KVQ_ERR_CORRUPT and a reason, one with enough entries (and finite scores)
 * loads; every text encodes into ids below the vocabulary size, no more
 * than strlen + 3 of them, and every id's piece can be read back.
 * tests/test_fuzz_replay.c replays fuzz/corpus/tokenizer/ through it.
 */
#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

/* Counts the entries of buf that are complete (up to limit), whether all
 * their scores are finite, and where the last of them ends (*end). */
static size_t kvq_fuzz_tok_entries(const uint8_t *buf, size_t len, size_t limit, int *finite,
                                   size_t *end) {
    *finite = 1;
    *end = 0;
    if (len < 4 || kvq__ld32(buf) > len - 4)
        return 0;
    size_t off = 4, n = 0;
    while (n < limit && len - off >= 8) {
        float s;
        memcpy(&s, buf + off, 4);
        uint32_t l = kvq__ld32(buf + off + 4);
        if (l > len - off - 8)
            break;
        if (!isfinite(s))
            *finite = 0;
        off += 8 + (size_t)l;
        n++;
    }
    *end = off;
    return n;
}

static int kvq_fuzz_tok_check(const kvq_tokenizer *t, size_t vocab, const char *text) {
    size_t tl = strlen(text), cap = tl + 3, n = 0;
    int32_t *ids = (int32_t *)malloc(cap * sizeof(int32_t));
    if (!ids)
        return 0;
    int bad = 0;
    for (int mode = 0; mode < 4 && !bad; mode++) {
        kvq_status st = kvq_tokenizer_encode(t, text, mode & 1, mode >> 1, ids, cap, &n);
        if (st == KVQ_ERR_NOMEM)
            continue;
        if (st != KVQ_OK || n > cap) {
            bad = 1;
            break;
        }
        char pb[8];
        for (size_t i = 0; i < n && !bad; i++) {
            if (ids[i] < 0 || (size_t)ids[i] >= vocab) {
                bad = 1;
                break;
            }
            const char *p = kvq_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], pb);
            volatile size_t sink = strlen(p);
            (void)sink;
        }
    }
    /* one short of the documented capacity is refused */
    if (!bad && tl + 2 > 0)
        bad = kvq_tokenizer_encode(t, text, 1, 1, ids, tl + 2, &n) != KVQ_ERR_DST_TOO_SMALL;
    free(ids);
    return bad;
}

static int kvq_fuzz_tokenizer(const uint8_t *data, size_t size) {
    int finite = 1;
    size_t end = 0;
    size_t count = kvq_fuzz_tok_entries(data, size, 1u << 20, &finite, &end);
    size_t vocab = count < 259 ? 259 : count;
    int bad = 0;
    for (int extra = 0; extra < 2 && !bad; extra++) {
        size_t v = vocab + (size_t)extra;
        int fin = 1;
        size_t have = kvq_fuzz_tok_entries(data, size, v, &fin, &end);
        kvq_tokenizer *t = NULL;
        char why[256];
        kvq_status st = kvq__tokenizer_load_mem(&t, data, size, v, NULL, why, sizeof why);
        if (st == KVQ_ERR_NOMEM)
            continue;
        /* refused: too few entries, a score not finite, or bytes after the
         * v-th entry (a tokenizer of a larger vocabulary) */
        if (have < v || !fin || end != size) {
            bad = st != KVQ_ERR_CORRUPT || t != NULL || !why[0];
            kvq_tokenizer_free(t);
            continue;
        }
        if (st != KVQ_OK || !t) {
            bad = 1;
            continue;
        }
        static const char *const texts[] = {"", " ", "Once upon a time", "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z",
                                            "\xff\xfe\x80\x80\x80\x80\x80", "<0x0A>\n\t"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0] && !bad; i++)
            bad = kvq_fuzz_tok_check(t, v, texts[i]);
        /* and the input's own bytes as text (up to 256, NULs dropped) */
        char own[257];
        size_t k = 0;
        for (size_t i = 0; i < size && k < 256; i++)
            if (data[i])
                own[k++] = (char)data[i];
        own[k] = 0;
        if (!bad)
            bad = kvq_fuzz_tok_check(t, v, own);
        char pb[8];
        for (size_t i = 0; i < v && i < 600; i++) {
            volatile size_t sink = strlen(kvq_tokenizer_piece(t, 1, (int32_t)i, pb));
            (void)sink;
        }
        kvq_tokenizer_free(t);
    }
    /* a vocabulary below the format's reserved ids is an argument error */
    kvq_tokenizer *t = NULL;
    if (!bad)
        bad = kvq__tokenizer_load_mem(&t, data, size, 258, NULL, NULL, 0) != KVQ_ERR_INVALID_ARG ||
              t != NULL;
    return bad;
}

/* 1 when the loader accepts the input with as many ids as it holds entries
 * (at least 259). */
static int kvq_fuzz_tokenizer_accepts(const uint8_t *data, size_t size) {
    int finite;
    size_t end = 0;
    size_t count = kvq_fuzz_tok_entries(data, size, 1u << 20, &finite, &end);
    kvq_tokenizer *t = NULL;
    kvq_status st = kvq__tokenizer_load_mem(&t, data, size, count < 259 ? 259 : count, NULL,
                                            NULL, 0);
    kvq_tokenizer_free(t);
    return st == KVQ_OK;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_tokenizer(data, size))
        abort();
    return 0;
}
#endif
