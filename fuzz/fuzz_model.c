/*
 * fuzz_model.c - libFuzzer target for the llama2.c checkpoint loader
 * (kvq__model_load_mem in src/model/model.c: the legacy header and ak42
 * v1/v2). Properties: loading arbitrary bytes never reads outside them, and
 * either fails with KVQ_ERR_CORRUPT / KVQ_ERR_VERSION (with a reason) or
 * KVQ_ERR_NOMEM, or gives a model whose shape is the header's and whose
 * weights are exactly the size an independent 128-bit computation of the
 * header's sizes gives; such a model then runs two tokens through an f32
 * cache (the forward pass reads every weight). A loader must accept exactly
 * the files whose length the header's shape explains: each input is also
 * tried with its weights cut or zero-padded to that length (when it is at
 * most 4 MiB), so that header mutations reach the forward pass.
 * tests/test_fuzz_replay.c includes this file (KVQ_FUZZ_NO_ENTRY) to replay
 * fuzz/corpus/model/ in `make check`.
 */
#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 kvq_fuzz_u128;

/* The weight bytes the header of buf asks for (after the header), computed
 * on its own from the format description (not from model.c), or 0 when the
 * header is malformed; *hdr gets the header length. */
static kvq_fuzz_u128 kvq_fuzz_model_need(const uint8_t *buf, size_t len, size_t *hdr) {
    int64_t h[7];
    int shared, version = 0;
    uint64_t gs = 0;
    if (len >= 8 && kvq__ld32(buf) == 0x616b3432u) {
        version = (int)kvq__ld32(buf + 4);
        if ((version != 1 && version != 2) || len < 256)
            return 0;
        for (int i = 0; i < 7; i++)
            h[i] = (int32_t)kvq__ld32(buf + 8 + 4 * i);
        shared = buf[36] != 0;
        if (version == 2)
            gs = kvq__ld32(buf + 37);
        *hdr = 256;
    } else {
        if (len < 28)
            return 0;
        for (int i = 0; i < 7; i++)
            h[i] = (int32_t)kvq__ld32(buf + 4 * i);
        shared = h[5] > 0;
        h[5] = h[5] < 0 ? -h[5] : h[5];
        *hdr = 28;
    }
    for (int i = 0; i < 7; i++)
        if (h[i] <= 0 || h[i] > (1 << 24))
            return 0;
    kvq_fuzz_u128 D = (kvq_fuzz_u128)h[0], HD = (kvq_fuzz_u128)h[1], L = (kvq_fuzz_u128)h[2];
    kvq_fuzz_u128 NH = (kvq_fuzz_u128)h[3], KV = (kvq_fuzz_u128)h[4], V = (kvq_fuzz_u128)h[5];
    kvq_fuzz_u128 S = (kvq_fuzz_u128)h[6];
    if (D % NH || NH % KV || (D / NH) % 2 || D / NH > 1024)
        return 0;
    if (version == 2 && (gs == 0 || D % gs))
        return 0;
    kvq_fuzz_u128 hs = D / NH, kvd = KV * hs;
    kvq_fuzz_u128 mats = V * D + L * D * D * 2 + L * D * kvd * 2 + L * D * HD * 3 + (shared ? 0 : V * D);
    kvq_fuzz_u128 norms = 2 * L * D + D;
    if (version == 0)
        return (mats + norms + S * hs) * 4;
    if (version == 1)
        return (mats + norms) * 4;
    return norms * 4 + mats + mats / gs * 4;
}

/* 0 when the property holds for these len bytes. */
static int kvq_fuzz_model_once(const uint8_t *buf, size_t len) {
    kvq_model *m = NULL;
    char why[256];
    kvq_status st = kvq__model_load_mem(&m, buf, len, NULL, KVQ_ISA_AUTO, why, sizeof why);
    size_t hdr = 0;
    kvq_fuzz_u128 need = kvq_fuzz_model_need(buf, len, &hdr);
    int fits = need != 0 && need == (kvq_fuzz_u128)(len - hdr);
    if (st == KVQ_ERR_NOMEM)
        return m != NULL;
    if (st != KVQ_OK) {
        /* refused: with a reason, and only files the header does not explain
         * (or whose weights are not all finite) */
        if (m || (st != KVQ_ERR_CORRUPT && st != KVQ_ERR_VERSION) || !why[0])
            return 1;
        return fits && strstr(why, "NaN") == NULL;
    }
    if (!m || !fits)
        return 1;
    kvq_model_info in;
    if (kvq_model_get_info(m, &in) != KVQ_OK || in.head_dim * in.n_heads != in.dim) {
        kvq_model_free(m);
        return 1;
    }
    size_t nw = 0;
    const float *w = kvq__model_weights(m, &nw);
    volatile float sink = 0.0f;
    for (size_t i = 0; i < nw; i++) /* ASan checks the weights are all allocated */
        sink += w[i];
    (void)sink;
    /* The forward pass: its cost is bounded by the weights (<= 4 MiB) plus
     * the cache's per-layer bookkeeping, which is O(layers) per append (the
     * total peak is summed over the layers), so O(layers^2) per pass: models
     * of more than 64 layers are loaded and checked but not run (a 16640-layer
     * model of dim 2 took over 25 s under ASan). */
    if (in.n_layers > 64) {
        kvq_model_free(m);
        return 0;
    }
    int bad = 0;
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(m, &cfg);
    cfg.k_codec = cfg.v_codec = "f32";
    kvq_cache *c = NULL;
    st = kvq_cache_create(&c, &cfg);
    if (st == KVQ_OK) {
        int32_t tok[2] = {0, (int32_t)(in.vocab_size - 1)};
        size_t n = in.seq_len >= 2 ? 2 : 1;
        float *logits = (float *)malloc(n * in.vocab_size * sizeof(float));
        if (logits) {
            st = kvq_model_forward(m, c, tok, n, 0, logits, n * in.vocab_size, 0);
            /* huge finite weights can overflow to Inf inside the pass */
            bad = st != KVQ_OK && st != KVQ_ERR_NONFINITE && st != KVQ_ERR_NOMEM;
            free(logits);
        }
        kvq_cache_free(c);
    } else {
        bad = st != KVQ_ERR_NOMEM && st != KVQ_ERR_INVALID_ARG;
    }
    kvq_model_free(m);
    return bad;
}

static int kvq_fuzz_model(const uint8_t *data, size_t size) {
    uint8_t *buf = (uint8_t *)calloc(size ? size : 1, 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    int bad = kvq_fuzz_model_once(buf, size);
    free(buf);
    size_t hdr = 0;
    kvq_fuzz_u128 need = kvq_fuzz_model_need(data, size, &hdr);
    if (!bad && need != 0 && need <= ((kvq_fuzz_u128)4 << 20) && need != (kvq_fuzz_u128)(size - hdr)) {
        size_t n = hdr + (size_t)need;
        buf = (uint8_t *)calloc(n, 1);
        if (!buf)
            return 0;
        memcpy(buf, data, size < n ? size : n);
        bad = kvq_fuzz_model_once(buf, n);
        free(buf);
    }
    return bad;
}

/* 1 when the loader accepts the input as it is (the replay's valid-/bad-). */
static int kvq_fuzz_model_accepts(const uint8_t *data, size_t size) {
    kvq_model *m = NULL;
    kvq_status st = kvq__model_load_mem(&m, data, size, NULL, KVQ_ISA_AUTO, NULL, 0);
    kvq_model_free(m);
    return st == KVQ_OK;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_model(data, size))
        abort();
    return 0;
}
#endif
