/*
 * fuzz_alloc_json.c - libFuzzer target for the --alloc cache configuration
 * file (tools/alloc_json.c over the JSON reader of tools/json.c). The input
 * is the file (through a memfd, read by path as the tool does). Properties:
 * no read outside the input, no undefined conversion of out-of-range
 * numbers; the loader either refuses with -1 and a message or fills the
 * options, and the options then go to kvq_cache_create on a small shape
 * (2 layers, 2 KV heads, head_dim 8) the way the model commands use them
 * (a centre of the wrong length refused first, as tools/model_eval.c does);
 * a cache that is created takes an append and an attend. The JSON reader is
 * also run on its own on the input as text.
 * tests/test_fuzz_replay.c replays fuzz/corpus/alloc_json/ through it.
 */
#include "alloc_json.h"
#include "cacheopts.h"
#include "json.h"

#include "fuzz_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kvq_fuzz_alloc_cache(const kvqt_cacheopts *o) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 2;
    cfg.n_kv_heads = 2;
    cfg.n_q_heads = 4;
    cfg.head_dim = 8;
    cfg.max_tokens = 64;
    kvqt_cacheopts_apply(o, &cfg);
    if (o->center_values && o->center_count != cfg.n_layers * cfg.n_kv_heads * cfg.head_dim)
        return 0; /* the tool refuses these before creating a cache */
    char msg[256] = "";
    cfg.err_msg = msg;
    cfg.err_msg_size = sizeof msg;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&c, &cfg);
    if (st != KVQ_OK)
        return c != NULL || st >= 0;
    float k[2 * 2 * 8], v[2 * 2 * 8], q[2 * 4 * 8], out[2 * 4 * 8];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        k[i] = (float)((int)(i % 7) - 3) * 0.25f;
        v[i] = (float)((int)(i % 5) - 2) * 0.5f;
    }
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = (float)((int)(i % 3) - 1);
    int bad = 0;
    for (size_t l = 0; l < 2 && !bad; l++) {
        int32_t pos[2] = {0, 1};
        st = kvq_cache_append(c, l, k, v, pos, 2);
        if (st == KVQ_OK)
            st = kvq_cache_attend(c, l, q, pos, 2, out, sizeof out / sizeof out[0], NULL, 0);
        bad = st != KVQ_OK && st != KVQ_ERR_NOMEM && st != KVQ_ERR_NOT_FITTED;
    }
    kvq_cache_free(c);
    return bad;
}

static int kvq_fuzz_alloc_json(const uint8_t *data, size_t size) {
    /* the JSON reader alone, on the input up to its first NUL */
    char *text = (char *)malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char err[512] = "";
    kj_value *root = kj_parse(text, err, sizeof err);
    int bad = !root && !err[0];
    kj_free(root);
    free(text);
    if (bad)
        return 1;
    const char *path = kvq_fuzz_as_file(data, size);
    if (!path)
        return 0;
    kvqt_cacheopts o;
    kvqt_cacheopts_init(&o);
    err[0] = 0;
    if (kvqt_alloc_load(path, &o, err, sizeof err) != 0)
        bad = !err[0];
    else
        bad = kvq_fuzz_alloc_cache(&o);
    kvqt_cacheopts_free(&o);
    return bad;
}

/* 1 when the loader accepts the file. */
static int kvq_fuzz_alloc_json_accepts(const uint8_t *data, size_t size) {
    const char *path = kvq_fuzz_as_file(data, size);
    if (!path)
        return 0;
    kvqt_cacheopts o;
    kvqt_cacheopts_init(&o);
    char err[512];
    int ok = kvqt_alloc_load(path, &o, err, sizeof err) == 0;
    kvqt_cacheopts_free(&o);
    return ok;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_alloc_json(data, size))
        abort();
    return 0;
}
#endif
