/*
 * make_corpus.c - writes the seed corpora of the fuzz targets that read
 * files (`make fuzz-corpus`): fuzz/corpus/{model,tokenizer,codec_state,npy,
 * alloc_json,snapshot}/. The record and segment corpora are older and kept
 * as they are. Files named valid-* must be accepted by the reader and bad-*
 * refused (tests/test_fuzz_replay.c checks both); every seed is small (a few
 * KiB) so that the corpora stay cheap to commit and to replay. Built against
 * the normal library (the snapshot seeds are the manifests the snapshot
 * target's own caches save).
 */
#define KVQ_FUZZ_NO_ENTRY 1
#include "../fuzz/fuzz_snapshot.c"
#include "../fuzz/fuzz_prefix.c"

#include <errno.h>
#include <sys/stat.h>

static const char *out_dir = "fuzz/corpus";
static int n_written;

static void put_file(const char *sub, const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", out_dir, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    n_written++;
}

/* ---- a growable byte buffer ---- */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void b_put(buf_t *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = (uint8_t *)realloc(b->p, b->cap);
        if (!b->p)
            exit(1);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u32(buf_t *b, uint32_t v) {
    uint8_t t[4];
    kvq__st32(t, v);
    b_put(b, t, 4);
}
static void b_f32(buf_t *b, float f) { b_u32(b, kvq__f32_bits(f)); }
static void b_str(buf_t *b, const char *s) { b_put(b, s, strlen(s)); }

/* ---- model checkpoints: dim 8, hidden 16, 2 layers, 2 heads, 1 KV head,
 * vocab 32, seq_len 16 (head_dim 4) ---- */
enum { MD = 8, MHD = 16, ML = 2, MNH = 2, MKV = 1, MV = 32, MS = 16 };

static float wval(size_t i) { return 0.02f * (float)((int)((i * 2654435761u) % 101) - 50) / 50.0f; }

static void model_weights(buf_t *b, size_t n, size_t *ctr) {
    for (size_t i = 0; i < n; i++)
        b_f32(b, wval((*ctr)++));
}

static void make_legacy(buf_t *b, int separate_cls) {
    int32_t h[7] = {MD, MHD, ML, MNH, MKV, separate_cls ? -MV : MV, MS};
    for (int i = 0; i < 7; i++)
        b_u32(b, (uint32_t)h[i]);
    size_t kvd = MKV * (MD / MNH), c = 0;
    size_t n = MV * MD + ML * MD + ML * MD * MD + 2 * ML * MD * kvd + ML * MD * MD + ML * MD +
               3 * ML * MD * MHD + MD;
    model_weights(b, n, &c);
    for (size_t i = 0; i < MS * (MD / MNH); i++) /* freq_cis, unused */
        b_f32(b, 1.0f);
    if (separate_cls)
        model_weights(b, MV * MD, &c);
}

static void q80(buf_t *b, size_t n, size_t gs, size_t *ctr) {
    float *x = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = wval((*ctr)++);
    for (size_t i = 0; i < n; i++) {
        size_t g = i / gs;
        float amax = 0;
        for (size_t j = 0; j < gs; j++)
            amax = fmaxf(amax, fabsf(x[g * gs + j]));
        float s = amax / 127.0f;
        int8_t q = (int8_t)lrintf(s > 0 ? x[i] / s : 0);
        b_put(b, &q, 1);
    }
    for (size_t g = 0; g < n / gs; g++) {
        float amax = 0;
        for (size_t j = 0; j < gs; j++)
            amax = fmaxf(amax, fabsf(x[g * gs + j]));
        b_f32(b, amax / 127.0f);
    }
    free(x);
}

static void make_ak42(buf_t *b, int version, int shared, uint32_t gs) {
    uint8_t hdr[256] = {0};
    kvq__st32(hdr, 0x616b3432u);
    kvq__st32(hdr + 4, (uint32_t)version);
    int32_t h[7] = {MD, MHD, ML, MNH, MKV, MV, MS};
    for (int i = 0; i < 7; i++)
        kvq__st32(hdr + 8 + 4 * i, (uint32_t)h[i]);
    hdr[36] = (uint8_t)shared;
    if (version == 2)
        kvq__st32(hdr + 37, gs);
    b_put(b, hdr, 256);
    size_t c = 0, kvd = MKV * (MD / MNH);
    model_weights(b, 2 * ML * MD + MD, &c);
    size_t per[9] = {MV * MD, MD * MD, MD * kvd, MD * kvd, MD * MD, MD * MHD, MD * MHD, MD * MHD,
                     MV * MD};
    for (int i = 0; i < (shared ? 8 : 9); i++) {
        size_t cnt = i == 0 || i == 8 ? 1 : ML;
        for (size_t k = 0; k < cnt; k++) {
            if (version == 1)
                model_weights(b, per[i], &c);
            else
                q80(b, per[i], gs, &c);
        }
    }
}

static void corpus_model(void) {
    buf_t b = {0};
    make_legacy(&b, 0);
    put_file("model", "valid-legacy-shared", b.p, b.n);
    put_file("model", "bad-legacy-truncated", b.p, b.n - 4);
    b_u32(&b, 0);
    put_file("model", "bad-legacy-trailing", b.p, b.n);
    b.n -= 4;
    kvq__st32(b.p + 28 + 8, 0x7fc00000u); /* a NaN weight */
    put_file("model", "bad-legacy-nan", b.p, b.n);
    kvq__st32(b.p + 20, (uint32_t)INT32_MIN); /* vocab_size INT32_MIN: -x overflows */
    put_file("model", "bad-legacy-vocab-int32min", b.p, b.n);
    b.n = 0;
    make_legacy(&b, 1);
    put_file("model", "valid-legacy-classifier", b.p, b.n);
    b.n = 0;
    make_ak42(&b, 1, 1, 0);
    put_file("model", "valid-ak42-v1", b.p, b.n);
    kvq__st32(b.p + 4, 3);
    put_file("model", "bad-ak42-version3", b.p, b.n);
    put_file("model", "bad-ak42-header-short", b.p, 200);
    b.n = 0;
    make_ak42(&b, 1, 0, 0);
    put_file("model", "valid-ak42-v1-classifier", b.p, b.n);
    b.n = 0;
    make_ak42(&b, 2, 1, 4);
    put_file("model", "valid-ak42-v2", b.p, b.n);
    kvq__st32(b.p + 37, 0);
    put_file("model", "bad-ak42-v2-group0", b.p, b.n);
    kvq__st32(b.p + 37, 3);
    put_file("model", "bad-ak42-v2-group3", b.p, b.n);
    b.n = 0;
    make_ak42(&b, 2, 0, 8);
    put_file("model", "valid-ak42-v2-classifier", b.p, b.n);
    /* the crafted header: L * D * D (and the total) overflow size_t,
     * so a naive size check passes; here with a few weight bytes only */
    b.n = 0;
    int32_t h[7] = {1 << 24, 1 << 24, 1 << 24, 1 << 14, 1 << 14, 1 << 24, 1 << 24};
    for (int i = 0; i < 7; i++)
        b_u32(&b, (uint32_t)h[i]);
    for (int i = 0; i < 64; i++)
        b_f32(&b, 0.5f);
    put_file("model", "bad-legacy-size-overflow", b.p, b.n);
    b.n = 0;
    int32_t h2[7] = {MD, MHD, ML, MNH, MKV, MV, MS};
    h2[3] = 3; /* n_heads does not divide dim */
    for (int i = 0; i < 7; i++)
        b_u32(&b, (uint32_t)h2[i]);
    put_file("model", "bad-legacy-heads", b.p, b.n);
    free(b.p);
}

/* ---- tokenizers: ids 0..2 specials, 3..258 byte pieces, then merges ---- */
static const char *const merges[] = {" ", "e", "t", "a", "o", "n", "h", "th", "he", "the",
                                     " the", " a", "on", "ce", "On", "Onc", "Once", " u", "up",
                                     "upon", " upon", " t", "ti", "tim", "time", " time", "\xc3\xa9",
                                     "\xe2\x82\xac", "in", " in"};

static void make_tok(buf_t *b, uint32_t max_len) {
    b_u32(b, max_len);
    const char *sp[3] = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int i = 0; i < 3; i++) {
        b_f32(b, 0.0f);
        b_u32(b, (uint32_t)strlen(sp[i]));
        b_str(b, sp[i]);
    }
    for (int i = 0; i < 256; i++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", i);
        b_f32(b, 0.0f);
        b_u32(b, 6);
        b_str(b, s);
    }
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        b_f32(b, -(float)i * 0.5f);
        b_u32(b, (uint32_t)strlen(merges[i]));
        b_str(b, merges[i]);
    }
}

static void corpus_tokenizer(void) {
    buf_t b = {0};
    make_tok(&b, 6);
    put_file("tokenizer", "valid-289", b.p, b.n);
    {
        buf_t t = {0};
        b_put(&t, b.p, b.n);
        b_str(&t, "tail");
        put_file("tokenizer", "bad-289-trailing", t.p, t.n); /* bytes after the last token */
        free(t.p);
    }
    /* the header's max_token_length is only a hint, but it must fit in the file */
    kvq__st32(b.p, (uint32_t)b.n);
    put_file("tokenizer", "bad-maxlen-huge", b.p, b.n);
    kvq__st32(b.p, 6);
    /* the first byte piece's length made huge (the "huge length") */
    size_t off = 4;
    for (int i = 0; i < 3; i++)
        off += 8 + kvq__ld32(b.p + off + 4);
    kvq__st32(b.p + off + 4, 0xfffffff0u);
    put_file("tokenizer", "bad-length-huge", b.p, b.n);
    kvq__st32(b.p + off + 4, 6);
    kvq__st32(b.p + off, 0x7f800000u); /* an infinite score */
    put_file("tokenizer", "bad-score-inf", b.p, b.n);
    kvq__st32(b.p + off, 0);
    put_file("tokenizer", "bad-truncated", b.p, b.n / 2);
    put_file("tokenizer", "bad-empty", b.p, 0);
    free(b.p);
}

/* ---- codec state blobs and calibration files ---- */
static void corpus_codec_state(void) {
    static const char *const specs[] = {"nuq1", "nuq3", "nuq8", "tq3:norm=8", "tqp3:norm=8",
                                        "int8", "f16"};
    static const char *const names[] = {"valid-nuq1-d8", "valid-nuq3-d8", "valid-nuq8-d8",
                                        "valid-tq3-norm8-d8", "valid-tqp3-norm8-d8",
                                        "valid-int8-d8", "valid-f16-d8"};
    float x[64 * 8];
    for (size_t i = 0; i < 64 * 8; i++)
        x[i] = sinf(0.7f * (float)i) * (1.0f + (float)(i % 8));
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        kvq_codec *c = NULL;
        size_t n = 0;
        if (kvq_codec_create(&c, specs[s], 8, NULL) != KVQ_OK || kvq_codec_fit(c, x, 64) != KVQ_OK ||
            kvq_codec_save_state(c, NULL, 0, &n) != KVQ_OK) {
            fprintf(stderr, "make_corpus: codec %s\n", specs[s]);
            exit(1);
        }
        uint8_t *p = (uint8_t *)malloc(n);
        kvq_codec_save_state(c, p, n, &n);
        put_file("codec_state", names[s], p, n);
        if (s == 1) { /* nuq3: corrupt variants, checksums made to match */
            size_t slen = kvq__ld32(p + 12), pay = 24 + slen;
            uint8_t *q = (uint8_t *)malloc(n);
            memcpy(q, p, n);
            q[n - 1] ^= 1;
            put_file("codec_state", "bad-nuq3-crc", q, n);
            memcpy(q, p, n);
            kvq__st32(q + 4, 2);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-nuq3-version2", q, n);
            memcpy(q, p, n);
            kvq__st32(q + pay, kvq__f32_bits(1e30f)); /* levels no longer ascending */
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-nuq3-order", q, n);
            memcpy(q, p, n);
            kvq__st32(q + pay + 4, 0x7fc00000u);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-nuq3-nan", q, n);
            memcpy(q, p, n);
            kvq__st64(q + 16 + slen, (uint64_t)1 << 62); /* payload length past the end */
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-nuq3-payload-huge", q, n);
            memcpy(q, p, n);
            kvq__st32(q + 12, 0xffffffe0u); /* spec length past the end */
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-nuq3-speclen-huge", q, n);
            put_file("codec_state", "bad-truncated", p, 20);
            free(q);
        }
        if (s == 3) {
            uint8_t *q = (uint8_t *)malloc(n);
            memcpy(q, p, n);
            size_t pay = 24 + kvq__ld32(p + 12);
            kvq__st32(q + pay, kvq__f32_bits(-1e9f)); /* log2 range out of bounds */
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("codec_state", "bad-tq3-range", q, n);
            free(q);
        }
        free(p);
        kvq_codec_free(c);
    }
}

/* ---- .npy files ---- */
static void npy(buf_t *b, int major, const char *dict, size_t data_bytes, int f16) {
    b_put(b, "\x93NUMPY", 6);
    uint8_t v[2] = {(uint8_t)major, 0};
    b_put(b, v, 2);
    size_t pre = major == 1 ? 10 : 12, len = strlen(dict) + 1;
    size_t pad = (64 - (pre + len) % 64) % 64;
    if (major == 1) {
        uint8_t l[2] = {(uint8_t)(len + pad), (uint8_t)((len + pad) >> 8)};
        b_put(b, l, 2);
    } else {
        b_u32(b, (uint32_t)(len + pad));
    }
    b_str(b, dict);
    for (size_t i = 0; i < pad; i++)
        b_put(b, " ", 1);
    b_put(b, "\n", 1);
    for (size_t i = 0; i < data_bytes / (f16 ? 2 : 4); i++) {
        if (f16) {
            uint16_t h = kvq_f32_to_f16(0.25f * (float)i - 1.0f);
            uint8_t t[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
            b_put(b, t, 2);
        } else {
            b_f32(b, 0.5f * (float)i - 3.0f);
        }
    }
}

static void corpus_npy(void) {
    struct {
        const char *name, *dict;
        int major;
        size_t bytes;
        int f16;
    } s[] = {
        {"valid-f4-3x8", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", 1, 96, 0},
        {"valid-f2-2x2x4", "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2, 4), }", 1, 32, 1},
        {"valid-f4-v2-5", "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 2, 20, 0},
        {"valid-f4-v3-1x1x1x2", "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1, 1, 1, 2)}", 3, 8, 0},
        {"bad-fortran", "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 8), }", 1, 96, 0},
        {"bad-bigendian", "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 8), }", 1, 96, 0},
        {"bad-float64", "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 8), }", 1, 192, 0},
        {"bad-truncated", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", 1, 92, 0},
        {"bad-trailing", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", 1, 100, 0},
        {"bad-shape-overflow",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }", 1, 16, 0},
        {"bad-shape-huge-axis",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 2), }", 1, 16, 0},
        {"bad-shape-empty", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 8), }", 1, 0, 0},
        {"bad-scalar", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, 4, 0},
        {"bad-no-shape", "{'descr': '<f4', 'fortran_order': False}", 1, 4, 0},
        {"bad-axes17",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1), }", 1, 4, 0},
    };
    buf_t b = {0};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        b.n = 0;
        npy(&b, s[i].major, s[i].dict, s[i].bytes, s[i].f16);
        put_file("npy", s[i].name, b.p, b.n);
    }
    b.n = 0;
    npy(&b, 1, s[0].dict, 96, 0);
    b.p[6] = 4;
    put_file("npy", "bad-version4", b.p, b.n);
    b.p[6] = 2; /* version 2 reads a 4-byte length: now past the file */
    put_file("npy", "bad-v2-hlen-huge", b.p, b.n);
    b.p[6] = 1;
    b.p[0] = 'x';
    put_file("npy", "bad-magic", b.p, b.n);
    put_file("npy", "bad-short", b.p, 7);
    free(b.p);
}

/* ---- --alloc JSON files (the target's cache: 2 layers, 2 KV heads, d 8) ---- */
static void corpus_alloc_json(void) {
    put_file("alloc_json", "valid-minimal", "{\"kvq_alloc\": 1}", 16);
    const char *full =
        "{\"kvq_alloc\": 1, \"k_codec\": \"int8\", \"v_codec\": \"int4:g=4\", \"k_layout\": \"token\",\n"
        " \"k_prerope\": true, \"k_center\": false, \"page\": 8, \"recent\": 2,\n"
        " \"overrides\": [{\"layer\": 0, \"head\": 1, \"kind\": \"k\", \"codec\": \"chan:int3\"},\n"
        "               {\"layer\": -1, \"head\": 0, \"kind\": \"v\", \"codec\": \"tq3\"}],\n"
        " \"measured\": {\"nll\": 1.25e0, \"list\": [null, false, \"a\\u0041\\n\"]}}\n";
    put_file("alloc_json", "valid-overrides", full, strlen(full));
    /* a fitted nuq3 table as an override's state, and a centre */
    kvq_codec *c = NULL;
    float x[32 * 8];
    for (size_t i = 0; i < 32 * 8; i++)
        x[i] = cosf(0.3f * (float)i);
    size_t n = 0;
    if (kvq_codec_create(&c, "nuq3", 8, NULL) != KVQ_OK || kvq_codec_fit(c, x, 32) != KVQ_OK ||
        kvq_codec_save_state(c, NULL, 0, &n) != KVQ_OK)
        exit(1);
    uint8_t *st = (uint8_t *)malloc(n);
    kvq_codec_save_state(c, st, n, &n);
    kvq_codec_free(c);
    buf_t b = {0};
    b_str(&b, "{\"kvq_alloc\": 1, \"k_codec\": \"f16\", \"v_codec\": \"f16\", \"k_center\": true,\n"
              " \"overrides\": [{\"layer\": 1, \"head\": -1, \"kind\": \"v\", \"codec\": \"nuq3\", "
              "\"state\": \"");
    for (size_t i = 0; i < n; i++) {
        char h[3];
        snprintf(h, sizeof h, "%02x", st[i]);
        b_str(&b, h);
    }
    b_str(&b, "\"}],\n \"center\": [");
    for (int i = 0; i < 32; i++) {
        char v[32];
        snprintf(v, sizeof v, "%s%.3f", i ? ", " : "", 0.01 * (i - 16));
        b_str(&b, v);
    }
    b_str(&b, "]}\n");
    put_file("alloc_json", "valid-nuq-state-center", b.p, b.n);
    free(st);
    free(b.p);
    static const struct {
        const char *name, *text;
    } bad[] = {
        {"bad-empty", ""},
        {"bad-version2", "{\"kvq_alloc\": 2}"},
        {"bad-not-object", "[1, 2, 3]"},
        {"bad-unterminated", "{\"kvq_alloc\": 1, \"k_codec\": \"int8"},
        {"bad-trailing-u-escape", "{\"kvq_alloc\": 1, \"k_codec\": \"\\u"},
        {"bad-override-kind", "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 0, \"head\": 0, "
                              "\"kind\": \"q\", \"codec\": \"int8\"}]}"},
        {"bad-state-hex", "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 0, \"head\": 0, "
                          "\"kind\": \"k\", \"codec\": \"nuq3\", \"state\": \"zz\"}]}"},
        {"bad-center-string", "{\"kvq_alloc\": 1, \"center\": [\"a\"]}"},
        {"bad-deep", "{\"kvq_alloc\": 1, \"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        put_file("alloc_json", bad[i].name, bad[i].text, strlen(bad[i].text));
    /* numbers the loader must not cast blindly (out of range, not RFC 8259) */
    static const struct {
        const char *name, *text;
    } num[] = {
        {"bad-page-huge", "{\"kvq_alloc\": 1, \"page\": 1e300, \"recent\": 1e20}"},
        {"bad-layer-huge", "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 1e30, \"head\": -1e30, "
                           "\"kind\": \"k\", \"codec\": \"int8\"}]}"},
        {"bad-nan", "{\"kvq_alloc\": nan, \"page\": inf}"},
        {"bad-hex-number", "{\"kvq_alloc\": 0x1, \"page\": 0x10}"},
    };
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++)
        put_file("alloc_json", num[i].name, num[i].text, strlen(num[i].text));
}

/* ---- snapshot manifests: the first byte picks the target's configuration ---- */
static void corpus_snapshot(void) {
    for (int i = 0; i < KVQ_FUZZ_SNAP_CONFIGS; i++) {
        size_t n = 0;
        uint8_t *m = kvq_fuzz_snapshot_manifest(i, &n);
        if (!m || n < KVQ_FORGE_HDR + 4) {
            fprintf(stderr, "make_corpus: no snapshot manifest for configuration %d\n", i);
            exit(1);
        }
        uint8_t *b = (uint8_t *)malloc(n + 1);
        b[0] = (uint8_t)i;
        memcpy(b + 1, m, n);
        char name[64];
        snprintf(name, sizeof name, "valid-config%d", i);
        put_file("snapshot", name, b, n + 1);
        if (i == 0) {
            uint8_t *q = b + 1;
            size_t lay = KVQ_FORGE_HDR + kvq__ld32(q + 8) + kvq__ld32(q + 12); /* layer 0 */
            b[n] ^= 0x55; /* checksum */
            put_file("snapshot", "bad-crc", b, n + 1);
            b[n] ^= 0x55;
            kvq__st32(q + 4, 7);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-version", b, n + 1);
            kvq__st32(q + 4, 3);
            q[KVQ_FORGE_HDR] ^= 0x01; /* the name: "b0" for "c0" */
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-name", b, n + 1);
            q[KVQ_FORGE_HDR] ^= 0x01;
            /* layer 0: saved page count huge, then its first page index huge,
             * then its first two pages in descending order */
            uint32_t saved = kvq__ld32(q + lay + 20);
            kvq__st32(q + lay + 20, 0x40000000u);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-saved-huge", b, n + 1);
            kvq__st32(q + lay + 20, saved);
            size_t e0 = lay + KVQ_FORGE_LAYER; /* config 0: no centre */
            uint32_t p0 = kvq__ld32(q + e0), p1 = kvq__ld32(q + e0 + KVQ_FORGE_ENTRY);
            kvq__st32(q + e0, 0xfffffff0u);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-page-index-huge", b, n + 1);
            kvq__st32(q + e0, p1);
            kvq__st32(q + e0 + KVQ_FORGE_ENTRY, p0);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-page-order", b, n + 1);
            kvq__st32(q + e0, p0);
            kvq__st32(q + e0 + KVQ_FORGE_ENTRY, p1);
            kvq__st32(q + n - 4, kvq__crc32c(0, q, n - 4));
            put_file("snapshot", "bad-truncated", b, n - 8);
        }
        free(b);
        free(m);
        /* page records (input mode 1): the first and the last as saved, and
         * edits of the last one that only its slots give away (the record's
         * CRC32C recomputed; the target re-signs the manifest) */
        size_t rn = 0;
        const uint8_t *r0 = kvq_fuzz_snapshot_record(i, 0, &rn);
        int nr = kvq_fuzz_snap_saved[i].n_rec;
        if (!r0 || nr < 2)
            continue;
        for (int k = 0; k < nr; k += nr - 1) {
            const uint8_t *r = kvq_fuzz_snapshot_record(i, k, &rn);
            uint8_t *e = (uint8_t *)malloc(rn + 2);
            e[0] = (uint8_t)(0x80 | i);
            e[1] = (uint8_t)k;
            memcpy(e + 2, r, rn);
            snprintf(name, sizeof name, "valid-config%d-record%d", i, k);
            put_file("snapshot", name, e, rn + 2);
            uint8_t *x = e + 2;
            uint32_t P = kvq__ld32(x + 20);
            uint8_t *pos = x + 64, *stt = x + 64 + 4 * (size_t)P;
            int first = -1, second = -1; /* the first two occupied slots */
            for (uint32_t s = 0; s < P; s++)
                if ((int32_t)kvq__ld32(pos + 4 * s) >= 0) {
                    if (first < 0)
                        first = (int)s;
                    else if (second < 0)
                        second = (int)s;
                }
            if (k == 0 && i == 0 && first >= 0 && second >= 0) {
                uint8_t old = stt[first];
                static const struct {
                    uint8_t state;
                    const char *name;
                } sts[] = {{0x81, "bad-record-state-flag"}, {3, "bad-record-state3"},
                           {2, "bad-record-pending-unstaged"}};
                for (size_t t = 0; t < sizeof sts / sizeof sts[0]; t++) {
                    stt[first] = sts[t].state;
                    kvq__st32(x + rn - 4, kvq__crc32c(0, x, rn - 4));
                    put_file("snapshot", sts[t].name, e, rn + 2);
                }
                stt[first] = old;
                uint32_t a = kvq__ld32(pos + 4 * first), c = kvq__ld32(pos + 4 * second);
                kvq__st32(pos + 4 * second, a); /* a position twice */
                int32_t hi = -1;
                for (uint32_t s = 0; s < P; s++)
                    hi = (int32_t)kvq__ld32(pos + 4 * s) > hi ? (int32_t)kvq__ld32(pos + 4 * s) : hi;
                kvq__st32(x + 40, (uint32_t)hi);
                kvq__st32(x + rn - 4, kvq__crc32c(0, x, rn - 4));
                put_file("snapshot", "bad-record-position-twice", e, rn + 2);
                kvq__st32(pos + 4 * second, c);
                kvq__st32(x + 16, 1); /* another layer */
                kvq__st32(x + rn - 4, kvq__crc32c(0, x, rn - 4));
                put_file("snapshot", "bad-record-layer", e, rn + 2);
            }
            free(e);
            if (nr == 1)
                break;
        }
    }
}

/* ---- prefix entries: page, layer, forge flag, then the entry ---- */
static void corpus_prefix(void) {
    static const struct {
        int j, l, forge;
        const char *name;
    } seeds[] = {{0, 0, 0, "valid-page0-layer0"}, {3, 1, 0, "valid-page3-layer1"},
                 {1, 0, 1, "valid-page1-forged"}, {1, 0, 1, "bad-pending-slot"},
                 {1, 1, 1, "bad-positions-shifted"}, {2, 0, 1, "bad-state-flag"},
                 {2, 1, 1, "bad-other-layer"}, {0, 1, 0, "bad-version"},
                 {3, 0, 0, "bad-truncated"}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        size_t n = 0;
        const uint8_t *g = kvq_fuzz_prefix_entry(seeds[i].j, seeds[i].l, &n);
        if (!g) {
            fprintf(stderr, "make_corpus: no prefix entry\n");
            exit(1);
        }
        uint8_t *b = (uint8_t *)malloc(n + 3);
        b[0] = (uint8_t)seeds[i].j, b[1] = (uint8_t)seeds[i].l, b[2] = (uint8_t)seeds[i].forge;
        memcpy(b + 3, g, n);
        uint8_t *rec = b + 3 + KVQ_FUZZ_PFX_REC, *pos = rec + 64, *stt = pos + 4 * KVQ_FUZZ_PFX_P;
        size_t m = n;
        if (strcmp(seeds[i].name, "bad-pending-slot") == 0)
            stt[KVQ_FUZZ_PFX_P - 1] = 2;
        if (strcmp(seeds[i].name, "bad-state-flag") == 0)
            stt[0] |= 0x80;
        if (strcmp(seeds[i].name, "bad-other-layer") == 0)
            kvq__st32(rec + 16, (uint32_t)(seeds[i].l + 1) % KVQ_FUZZ_PFX_L);
        if (strcmp(seeds[i].name, "bad-version") == 0)
            kvq__st16(b + 3 + 4, 9);
        if (strcmp(seeds[i].name, "bad-truncated") == 0)
            m = n - 9;
        if (strcmp(seeds[i].name, "bad-positions-shifted") == 0) {
            for (int s = 0; s < KVQ_FUZZ_PFX_P; s++)
                kvq__st32(pos + 4 * s, kvq__ld32(pos + 4 * s) + 1000);
            kvq__st32(rec + 36, kvq__ld32(rec + 36) + 1000); /* pos_min, pos_max */
            kvq__st32(rec + 40, kvq__ld32(rec + 40) + 1000);
        }
        put_file("prefix", seeds[i].name, b, m + 3);
        free(b);
    }
}

int main(int argc, char **argv) {
    if (argc > 1)
        out_dir = argv[1];
    mkdir(out_dir, 0755);
    (void)kvq_fuzz_snapshot; /* the target's entries, unused here */
    (void)kvq_fuzz_snapshot_accepts;
    (void)kvq_fuzz_prefix;
    (void)kvq_fuzz_prefix_accepts;
    corpus_model();
    corpus_tokenizer();
    corpus_codec_state();
    corpus_npy();
    corpus_alloc_json();
    corpus_snapshot();
    corpus_prefix();
    printf("make_corpus: %d files under %s\n", n_written, out_dir);
    return 0;
}
