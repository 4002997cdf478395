/*
 * test_model.c - the llama2.c model runner on the real stories260K model in
 * the data directory: the published greedy sample and the reference mean NLL
 * (1.6438 nats over 9136 tokens) with an f32 cache, the same with pre-RoPE
 * keys, tokenizer round trips, the ak42 v1/v2 layouts (written here from the
 * legacy file) and corrupt files.
 */
#include "testutil.h"

#include <unistd.h>

static char model_path[1024], tok_path[1024], text_path[1024];

static kvq_cache *f32_cache(const kvq_model *m, int prerope) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(m, &cfg);
    cfg.k_codec = cfg.v_codec = "f32";
    cfg.k_prerope = prerope;
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    return c;
}

static void test_greedy(const kvq_model *m, const kvq_tokenizer *t) {
    const char *want = "Once upon a time, there was a little girl named Lily. She loved to play "
                       "outside in the park. One day, she saw a big, red ball. She wanted to play "
                       "with it, but it was too high.";
    kvq_cache *c = f32_cache(m, 0);
    if (!c)
        return;
    char out[2048] = "", buf[8];
    int32_t cur = 1;
    float lg[512];
    for (int32_t pos = 0; pos < 80; pos++) {
        CHECK_OK(kvq_model_forward(m, c, &cur, 1, pos, lg, 512, 1));
        int32_t nx = 0;
        for (int32_t i = 1; i < 512; i++)
            if (lg[i] > lg[nx])
                nx = i;
        strncat(out, kvq_tokenizer_piece(t, cur, nx, buf), sizeof out - strlen(out) - 1);
        cur = nx;
    }
    TU_REPORT(strncmp(out, want, strlen(want)) == 0, "greedy sample differs:\n  got  %s\n  want %s",
              out, want);
    kvq_cache_free(c);
}

static double nll_over_text(const kvq_model *m, const kvq_tokenizer *t, int prerope, size_t *ntok) {
    FILE *f = fopen(text_path, "rb");
    if (!f)
        return NAN;
    static char line[65536];
    double nll = 0;
    *ntok = 0;
    int32_t *tk = malloc(sizeof(int32_t) * 65536);
    float *lg = malloc(sizeof(float) * 512 * 512);
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!len)
            continue;
        size_t n;
        CHECK_OK(kvq_tokenizer_encode(t, line, 1, 0, tk, 65536, &n));
        if (n > 512)
            n = 512;
        kvq_cache *c = f32_cache(m, prerope);
        CHECK_OK(kvq_model_forward(m, c, tk, n, 0, lg, 512 * 512, 0));
        for (size_t i = 0; i + 1 < n; i++) {
            const float *l = lg + i * 512;
            double mx = -1e300, s = 0;
            for (int v = 0; v < 512; v++)
                mx = l[v] > mx ? l[v] : mx;
            for (int v = 0; v < 512; v++)
                s += exp(l[v] - mx);
            nll += -(l[tk[i + 1]] - mx - log(s));
            (*ntok)++;
        }
        kvq_cache_free(c);
    }
    fclose(f);
    free(tk);
    free(lg);
    return *ntok ? nll / (double)*ntok : NAN;
}

static void test_tokenizer(const kvq_tokenizer *t) {
    const char *texts[] = {"Once upon a time, Lily said \"hi!\"", "x", "caf\xc3\xa9 \xe2\x9c\x93 zzz",
                           "  two  spaces"};
    for (size_t i = 0; i < 4; i++) {
        int32_t tk[256];
        size_t n;
        CHECK_OK(kvq_tokenizer_encode(t, texts[i], 1, 0, tk, 256, &n));
        CHECK(tk[0] == 1);
        char out[512] = "", buf[8];
        for (size_t j = 1; j < n; j++)
            strncat(out, kvq_tokenizer_piece(t, tk[j - 1], tk[j], buf), sizeof out - strlen(out) - 1);
        /* the dummy prefix space after BOS is dropped by the decoder */
        TU_REPORT(strcmp(out, texts[i]) == 0, "round trip '%s' -> '%s'", texts[i], out);
    }
    int32_t tk[4];
    size_t n;
    CHECK_STATUS(kvq_tokenizer_encode(t, "abcdef", 1, 0, tk, 4, &n), KVQ_ERR_DST_TOO_SMALL);
    CHECK_OK(kvq_tokenizer_encode(t, "", 1, 1, tk, 4, &n));
    CHECK_EQ(n, 2);
}

/* Writes the legacy model as ak42 v1 (fp32) or v2 (Q8_0, group 32). */
static int write_ak42(const char *src, const char *dst, int version) {
    FILE *f = fopen(src, "rb");
    if (!f)
        return -1;
    int32_t h[7];
    if (fread(h, 4, 7, f) != 7)
        return -1;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 28, SEEK_SET);
    float *w = malloc((size_t)sz);
    size_t nw = fread(w, 4, (size_t)(sz - 28) / 4, f);
    fclose(f);
    size_t D = (size_t)h[0], HD = (size_t)h[1], L = (size_t)h[2], NH = (size_t)h[3], KV = (size_t)h[4];
    size_t V = (size_t)(h[5] < 0 ? -h[5] : h[5]), hs = D / NH, kvd = KV * hs;
    (void)nw;
    float *p = w;
    float *emb = p; p += V * D;
    float *rms_att = p; p += L * D;
    float *wq = p; p += L * D * D;
    float *wk = p; p += L * D * kvd;
    float *wv = p; p += L * D * kvd;
    float *wo = p; p += L * D * D;
    float *rms_ffn = p; p += L * D;
    float *w1 = p; p += L * D * HD;
    float *w2 = p; p += L * D * HD;
    float *w3 = p; p += L * D * HD;
    float *rms_final = p;
    FILE *o = fopen(dst, "wb");
    unsigned char hdr[256] = {0};
    uint32_t magic = 0x616b3432;
    int32_t ver = version;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &ver, 4);
    int32_t h2[7] = {h[0], h[1], h[2], h[3], h[4], (int32_t)V, h[6]};
    memcpy(hdr + 8, h2, 28);
    hdr[36] = 1;
    int32_t gs = 32;
    if (version == 2)
        memcpy(hdr + 37, &gs, 4);
    fwrite(hdr, 1, 256, o);
    fwrite(rms_att, 4, L * D, o);
    fwrite(rms_ffn, 4, L * D, o);
    fwrite(rms_final, 4, D, o);
    struct {
        float *p;
        size_t per, cnt;
    } mats[] = {{emb, V * D, 1},   {wq, D * D, L},  {wk, D * kvd, L}, {wv, D * kvd, L},
                {wo, D * D, L},    {w1, D * HD, L}, {w2, D * HD, L},  {w3, D * HD, L}};
    for (size_t i = 0; i < 8; i++)
        for (size_t k = 0; k < mats[i].cnt; k++) {
            float *x = mats[i].p + k * mats[i].per;
            size_t n = mats[i].per;
            if (version == 1) {
                fwrite(x, 4, n, o);
                continue;
            }
            int8_t *q = malloc(n);
            float *s = malloc(n / 32 * 4);
            for (size_t g = 0; g < n / 32; g++) {
                float amax = 0;
                for (size_t j = 0; j < 32; j++)
                    amax = fmaxf(amax, fabsf(x[g * 32 + j]));
                s[g] = amax / 127.0f;
                for (size_t j = 0; j < 32; j++)
                    q[g * 32 + j] = (int8_t)lrintf(s[g] > 0 ? x[g * 32 + j] / s[g] : 0);
            }
            fwrite(q, 1, n, o);
            fwrite(s, 4, n / 32, o);
            free(q);
            free(s);
        }
    fclose(o);
    free(w);
    return 0;
}

static void logits_first(const kvq_model *m, float *lg) {
    kvq_cache *c = f32_cache(m, 0);
    int32_t tk[5] = {1, 403, 407, 261, 378};
    float all[5 * 512];
    CHECK_OK(kvq_model_forward(m, c, tk, 5, 0, all, 5 * 512, 0));
    memcpy(lg, all + 4 * 512, 512 * sizeof(float));
    kvq_cache_free(c);
}

static void test_ak42(const kvq_model *m) {
    char p1[] = "/tmp/kvq_ak42_v1_XXXXXX", p2[] = "/tmp/kvq_ak42_v2_XXXXXX";
    int f1 = mkstemp(p1), f2 = mkstemp(p2);
    close(f1);
    close(f2);
    CHECK(write_ak42(model_path, p1, 1) == 0);
    CHECK(write_ak42(model_path, p2, 2) == 0);
    float ref[512], a[512], b[512];
    logits_first(m, ref);
    kvq_model *m1 = NULL, *m2 = NULL;
    CHECK_OK(kvq_model_load(&m1, p1, NULL));
    CHECK_OK(kvq_model_load(&m2, p2, NULL));
    if (m1 && m2) {
        kvq_model_info i1, i2;
        kvq_model_get_info(m1, &i1);
        kvq_model_get_info(m2, &i2);
        CHECK_EQ(i1.version, 1);
        CHECK_EQ(i2.version, 2);
        logits_first(m1, a);
        logits_first(m2, b);
        CHECK(memcmp(a, ref, sizeof a) == 0);
        double e = 0;
        for (int i = 0; i < 512; i++)
            e = fmax(e, fabs(b[i] - ref[i]));
        TU_REPORT(e < 0.5, "ak42 v2 logits differ by %.3g", e);
    }
    kvq_model_free(m1);
    kvq_model_free(m2);
    /* truncated file */
    FILE *f = fopen(p1, "r+b");
    if (f) {
        fclose(f);
        CHECK(truncate(p1, 1000) == 0);
        kvq_model *bad = NULL;
        CHECK_STATUS(kvq_model_load(&bad, p1, NULL), KVQ_ERR_CORRUPT);
        CHECK(bad == NULL);
    }
    unlink(p1);
    unlink(p2);
    kvq_model *none = NULL;
    CHECK_STATUS(kvq_model_load(&none, "/nonexistent/model.bin", NULL), KVQ_ERR_IO);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    snprintf(model_path, sizeof model_path, "%s/stories260K/stories260K.bin", tu_data_dir());
    snprintf(tok_path, sizeof tok_path, "%s/stories260K/tok512.bin", tu_data_dir());
    snprintf(text_path, sizeof text_path, "%s/text/tinystories-valid-sample.txt", tu_data_dir());
    if (access(model_path, R_OK) != 0 || access(tok_path, R_OK) != 0 || access(text_path, R_OK) != 0) {
        fprintf(stderr, "FAIL: the model data is missing under %s (pass --data DIR)\n", tu_data_dir());
        tu_fail++;
        return tu_finish();
    }
    kvq_model *m = NULL;
    kvq_tokenizer *t = NULL;
    CHECK_OK(kvq_model_load(&m, model_path, NULL));
    if (m)
        CHECK_OK(kvq_tokenizer_load(&t, tok_path, 512, NULL));
    if (m && t) {
        test_greedy(m, t);
        test_tokenizer(t);
        size_t n;
        double nll = nll_over_text(m, t, 0, &n);
        printf("f32 cache: mean NLL %.6f over %zu tokens (reference 1.6438, 9136)\n", nll, n);
        CHECK_EQ(n, 9136);
        CHECK_NEAR(nll, 1.6438, 0.0005);
        double nll2 = nll_over_text(m, t, 1, &n);
        printf("f32 cache, pre-RoPE keys: mean NLL %.6f\n", nll2);
        CHECK_NEAR(nll2, nll, 1e-4);
        test_ak42(m);
    }
    kvq_tokenizer_free(t);
    kvq_model_free(m);
    return tu_finish();
}
