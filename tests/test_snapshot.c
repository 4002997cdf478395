/*
 * test_snapshot.c - snapshots, prefix reuse and the store lifetime (issue 10,
 * items 3, 4, 5 and 9):
 * - SHA-256 against the examples of FIPS 180-4 (and incremental use);
 * - kvq_cache_load refuses a snapshot of another configuration, one test per
 *   field (shape, codecs and fitted state, key layout, RoPE, page size,
 *   centre), with KVQ_ERR_MISMATCH and a message naming the field;
 * - prefix reuse: keys are SHA-256 digests, each entry carries its page's
 *   token ids and the digest of the prefix before it, and a forged entry
 *   under the right key is never installed;
 * - a cache's records are named by a random 128-bit id, and a store closed
 *   while a cache still uses it as its cold store stays open for that cache
 *   until it is freed (run under ASan by make check-san);
 * - kvq_codec_save_file and the file store fsync the directories they
 *   change (fsync is interposed here to watch the calls).
 */
#include "testutil.h"
#include "common/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Removes a directory tree made by this test (two levels). */
static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- SHA-256 ---- */
static void hex32(const uint8_t *d, char *out) {
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_sha256(void) {
    /* FIPS 180-4 examples (NIST "SHA256.pdf", "SHA256_2.pdf" and the long
     * message of FIPS 180-2 appendix B.3), and the empty message */
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
         "nopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hx[65];
    uint8_t d[32];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        kvq__sha256(v[i].msg, strlen(v[i].msg), d);
        hex32(d, hx);
        TU_REPORT(strcmp(hx, v[i].hex) == 0, "sha256(\"%.20s...\") = %s, want %s", v[i].msg, hx,
                  v[i].hex);
        /* the same message fed one byte at a time */
        kvq__sha256_ctx s;
        kvq__sha256_init(&s);
        for (size_t k = 0; k < strlen(v[i].msg); k++)
            kvq__sha256_update(&s, v[i].msg + k, 1);
        kvq__sha256_final(&s, d);
        hex32(d, hx);
        CHECK(strcmp(hx, v[i].hex) == 0);
    }
    /* one million 'a' (FIPS 180-2 B.3), in pieces of 997 bytes */
    static char a[1000];
    memset(a, 'a', sizeof a);
    kvq__sha256_ctx s;
    kvq__sha256_init(&s);
    for (size_t left = 1000000; left;) {
        size_t k = left < 997 ? left : 997;
        kvq__sha256_update(&s, a, k);
        left -= k;
    }
    kvq__sha256_final(&s, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
    /* a copied context finalizes the prefix; the original goes on: every
     * length 0..130 (all padding cases: 55, 56, 63, 64 bytes) against the
     * one-shot digest */
    char m[131];
    for (int i = 0; i < 131; i++)
        m[i] = (char)(i * 7 + 1);
    kvq__sha256_init(&s);
    int bad = 0;
    for (size_t n = 0; n <= 130; n++) {
        kvq__sha256_ctx t = s;
        uint8_t d1[32], d2[32];
        kvq__sha256_final(&t, d1);
        kvq__sha256(m, n, d2);
        bad += memcmp(d1, d2, 32) != 0;
        if (n < 130)
            kvq__sha256_update(&s, m + n, 1);
    }
    CHECK_EQ(bad, 0);
    /* the padding boundary lengths against an independent value
     * (python3 hashlib.sha256(b"a" * 55 / 56 / 64)) */
    kvq__sha256(a, 55, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318") == 0);
    kvq__sha256(a, 56, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a") == 0);
    kvq__sha256(a, 64, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb") == 0);
}

/* ---- item 3: a snapshot restores only into its own configuration ---- */
#define SL 2
#define SH 2
#define SQH 4
#define SD 32
#define SN 40

static float SK[SN * SH * SD], SV[SN * SH * SD];
static float CENTRE[SL * SH * SD], CENTRE2[SL * SH * SD];
static uint8_t *NUQ_A, *NUQ_B; /* two nuq4 states fitted on different samples */
static size_t NUQ_A_N, NUQ_B_N;
static kvq_codec_override OV_NUQ_A, OV_NUQ_B, OV_V_L1H1;

static void base_cfg(kvq_cache_config *c) {
    kvq_cache_config_init(c);
    c->n_layers = SL, c->n_kv_heads = SH, c->n_q_heads = SQH, c->head_dim = SD;
    c->max_tokens = 256, c->k_codec = "int8", c->v_codec = "tq3";
}

/* A fitted nuq4 state blob (the caller frees it). */
static uint8_t *nuq_state(uint64_t seed, size_t *n) {
    kvq_codec *k = NULL;
    CHECK_OK(kvq_codec_create(&k, "nuq4", SD, NULL));
    if (!k)
        return NULL;
    tu_rng r;
    tu_seed(&r, seed);
    float x[256 * SD];
    tu_fill_gauss(&r, x, 256 * SD, 1.0f);
    CHECK_OK(kvq_codec_fit(k, x, 256));
    CHECK_OK(kvq_codec_save_state(k, NULL, 0, n));
    uint8_t *b = malloc(*n);
    CHECK_OK(kvq_codec_save_state(k, b, *n, n));
    kvq_codec_free(k);
    return b;
}

typedef void (*cfg_fn)(kvq_cache_config *);
static void m_none(kvq_cache_config *c) { (void)c; }
static void m_layers(kvq_cache_config *c) { c->n_layers = 3; }
static void m_kvheads(kvq_cache_config *c) { c->n_kv_heads = 1; }
static void m_qheads(kvq_cache_config *c) { c->n_q_heads = 8; }
static void m_headdim(kvq_cache_config *c) { c->head_dim = 16; }
static void m_page(kvq_cache_config *c) { c->page_tokens = 8; }
static void m_kcodec(kvq_cache_config *c) { c->k_codec = "int4"; }
static void m_vcodec(kvq_cache_config *c) { c->v_codec = "tq4"; }
static void m_vseed(kvq_cache_config *c) { c->v_codec = "tq3:seed=5"; }
static void m_vhead(kvq_cache_config *c) { c->overrides = &OV_V_L1H1, c->n_overrides = 1; }
static void m_nuq_a(kvq_cache_config *c) { c->overrides = &OV_NUQ_A, c->n_overrides = 1; }
static void m_nuq_b(kvq_cache_config *c) { c->overrides = &OV_NUQ_B, c->n_overrides = 1; }
static void m_chan(kvq_cache_config *c) { c->k_layout = KVQ_LAYOUT_CHANNEL, c->k_codec = "int4"; }
static void m_tok4(kvq_cache_config *c) { c->k_codec = "int4"; }
static void m_pre(kvq_cache_config *c) { c->k_prerope = 1; }
static void m_theta(kvq_cache_config *c) { c->k_prerope = 1, c->rope_theta = 500000.0; }
static void m_dims(kvq_cache_config *c) { c->k_prerope = 1, c->rope_dims = 16; }
static void m_centre(kvq_cache_config *c) { c->k_center = 1, c->k_center_values = CENTRE; }
static void m_centre2(kvq_cache_config *c) { c->k_center = 1, c->k_center_values = CENTRE2; }
static void m_warm(kvq_cache_config *c) { c->warm_codec = "int4"; }

/* Saves a cache made with base + src and loads it into one made with base +
 * dst: field NULL means it must load (and give the source's K/V), else
 * KVQ_ERR_MISMATCH with field named in kvq_cache_last_error and the target
 * left empty. */
static void load_case(kvq_store *s, const char *what, cfg_fn src, cfg_fn dst, const char *field) {
    kvq_cache_config cs, cd;
    base_cfg(&cs);
    src(&cs);
    base_cfg(&cd);
    dst(&cd);
    kvq_cache *a = NULL, *b = NULL;
    CHECK_OK(kvq_cache_create(&a, &cs));
    CHECK_OK(kvq_cache_create(&b, &cd));
    if (!a || !b) {
        kvq_cache_free(a);
        kvq_cache_free(b);
        return;
    }
    for (size_t l = 0; l < SL; l++)
        CHECK_OK(kvq_cache_append(a, l, SK, SV, NULL, SN));
    char name[64];
    snprintf(name, sizeof name, "cfg-%s", what);
    CHECK_OK(kvq_cache_save(a, s, name, INT32_MAX));
    kvq_status st = kvq_cache_load(b, s, name);
    const char *msg = kvq_cache_last_error(b);
    if (!field) {
        TU_REPORT(st == KVQ_OK, "%s: the same configuration must load: %s (%s)", what,
                  kvq_strerror(st), msg);
        size_t n = 0;
        kvq_cache_tokens(b, SL - 1, &n);
        CHECK_EQ(n, SN);
    } else {
        TU_REPORT(st == KVQ_ERR_MISMATCH, "%s: load gave %s, want KVQ_ERR_MISMATCH", what,
                  kvq_strerror(st));
        TU_REPORT(strstr(msg, field) != NULL, "%s: the message '%s' does not name %s", what, msg,
                  field);
        size_t n = 1;
        if (st != KVQ_OK) {
            kvq_cache_tokens(b, 0, &n);
            CHECK_EQ(n, 0);
        }
        if (st == KVQ_OK && cd.n_q_heads == SQH && cd.head_dim == SD) {
            /* what restoring into the wrong configuration does to attention */
            float q[SQH * SD], o1[SQH * SD], o2[SQH * SD];
            tu_rng r;
            tu_seed(&r, 5);
            tu_fill_gauss(&r, q, SQH * SD, 1.0f);
            int32_t qp = SN - 1;
            if (kvq_cache_attend(a, 0, q, &qp, 1, o1, SQH * SD, NULL, 0) == KVQ_OK &&
                kvq_cache_attend(b, 0, q, &qp, 1, o2, SQH * SD, NULL, 0) == KVQ_OK)
                printf("  %s: loaded with KVQ_OK; attention differs by %.3f (relative)\n", what,
                       tu_rel_err(o2, o1, SQH * SD));
        }
    }
    kvq_cache_free(a);
    kvq_cache_free(b);
}

static void test_load_config(const char *url) {
    kvq_store *s = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (!s)
        return;
    tu_rng r;
    tu_seed(&r, 31);
    /* keys after RoPE the way a model gives them: rotated at their
     * positions (pairs (2i, 2i+1), theta 10000) */
    tu_fill_gauss(&r, SK, SN * SH * SD, 1.0f);
    tu_fill_gauss(&r, SV, SN * SH * SD, 1.0f);
    for (size_t t = 0; t < SN; t++)
        for (size_t h = 0; h < SH; h++)
            for (size_t i = 0; i < SD / 2; i++) {
                float *k = SK + (t * SH + h) * SD + 2 * i;
                double a = (double)t * pow(10000.0, -(double)(2 * i) / SD);
                float x = k[0], y = k[1];
                k[0] = (float)(x * cos(a) - y * sin(a));
                k[1] = (float)(x * sin(a) + y * cos(a));
            }
    tu_fill_gauss(&r, CENTRE, SL * SH * SD, 0.5f);
    memcpy(CENTRE2, CENTRE, sizeof CENTRE);
    CENTRE2[SH * SD + 3] += 1e-3f; /* layer 1, head 0, channel 3 */
    NUQ_A = nuq_state(1, &NUQ_A_N);
    NUQ_B = nuq_state(2, &NUQ_B_N);
    OV_NUQ_A = (kvq_codec_override){-1, -1, 0, "nuq4", NUQ_A, NUQ_A_N};
    OV_NUQ_B = (kvq_codec_override){-1, -1, 0, "nuq4", NUQ_B, NUQ_B_N};
    OV_V_L1H1 = (kvq_codec_override){1, 1, 1, "int4", NULL, 0};

    /* the same configuration loads, with each feature below */
    load_case(s, "same", m_none, m_none, NULL);
    load_case(s, "same-nuq", m_nuq_a, m_nuq_a, NULL);
    load_case(s, "same-chan", m_chan, m_chan, NULL);
    load_case(s, "same-prerope", m_theta, m_theta, NULL);
    load_case(s, "same-centre", m_centre, m_centre, NULL);
    load_case(s, "same-warm", m_warm, m_warm, NULL);
    /* the case: a post-RoPE snapshot into a pre-RoPE cache */
    load_case(s, "post-into-pre", m_none, m_pre, "k_prerope");
    load_case(s, "pre-into-post", m_pre, m_none, "k_prerope");
    /* one field at a time */
    load_case(s, "layers", m_none, m_layers, "n_layers");
    load_case(s, "kvheads", m_none, m_kvheads, "n_kv_heads");
    load_case(s, "qheads", m_none, m_qheads, "n_q_heads");
    load_case(s, "headdim", m_none, m_headdim, "head_dim");
    load_case(s, "page", m_none, m_page, "page_tokens");
    load_case(s, "kcodec", m_none, m_kcodec, "l0.h0.k_codec");
    load_case(s, "vcodec", m_none, m_vcodec, "l0.h0.v_codec");
    load_case(s, "vseed", m_none, m_vseed, "l0.h0.v_codec");
    load_case(s, "vhead", m_none, m_vhead, "l1.h1.v_codec");
    load_case(s, "state", m_nuq_a, m_nuq_b, "l0.h0.k_state");
    load_case(s, "layout", m_chan, m_tok4, "k_layout");
    load_case(s, "theta", m_pre, m_theta, "rope_theta");
    load_case(s, "dims", m_pre, m_dims, "rope_dims");
    load_case(s, "centre", m_none, m_centre, "k_center");
    load_case(s, "centre-values", m_centre, m_centre2, "k_center_values");
    load_case(s, "warm", m_none, m_warm, "warm_codec");
    free(NUQ_A);
    free(NUQ_B);
    kvq_store_close(s);
}

/* ---- item 4: prefix entries carry their ids; a forged entry is a miss ---- */
#define PP 16      /* page_tokens */
#define PT 48      /* tokens published: pages 0..2 */
#define PREC (48 + 4 * PP) /* offset of the page record in an entry */

static float PKA[PT * SH * SD], PVA[PT * SH * SD], PKB[PT * SH * SD], PVB[PT * SH * SD];

/* Publishes the first PT tokens of ids with K/V (k, v) into s. */
static void publish(kvq_store *s, const int32_t *ids, const float *k, const float *v) {
    kvq_cache_config cfg;
    base_cfg(&cfg);
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    if (!c)
        return;
    for (size_t l = 0; l < SL; l++)
        CHECK_OK(kvq_cache_append(c, l, k, v, NULL, PT));
    CHECK_OK(kvq_cache_prefix_put(c, s, ids, PT));
    kvq_cache_free(c);
}

typedef struct {
    kvq_store *s;
    uint32_t j, l;
    char key[200];
    uint8_t *val;
    size_t n;
} find_ctx;

static int find_fn(void *ctx, const char *key, size_t size) {
    find_ctx *f = ctx;
    void *d = NULL;
    size_t n = 0;
    if (kvq_store_get(f->s, key, &d, &n) != KVQ_OK)
        return 0;
    const uint8_t *e = d;
    if (n > PREC + 20 && memcmp(e, "KVQP", 4) == 0 && kvq__ld32(e + 8) == f->j &&
        kvq__ld32(e + PREC + 16) == f->l) {
        snprintf(f->key, sizeof f->key, "%s", key);
        f->val = malloc(n);
        memcpy(f->val, e, n);
        f->n = n;
        (void)size;
    }
    kvq_store_free_buf(f->s, d);
    return f->val != NULL;
}

/* The entry of page j, layer l in s (key and a malloc'd copy), or 0. */
static int find_entry(kvq_store *s, uint32_t j, uint32_t l, find_ctx *f) {
    memset(f, 0, sizeof *f);
    f->s = s, f->j = j, f->l = l;
    CHECK_OK(kvq_store_list(s, "kvqp/", find_fn, f));
    return f->val != NULL;
}

/* What a collision of every hash would give: the entry src (another
 * prompt's page) with the record's prefix_hash of the genuine entry dst
 * (and with parent, also its parent digest), checksums recomputed, stored
 * under dst's key. */
static void forge(kvq_store *s, const find_ctx *src, const find_ctx *dst, int parent) {
    uint8_t *e = malloc(src->n);
    memcpy(e, src->val, src->n);
    memcpy(e + PREC + 48, dst->val + PREC + 48, 8);
    if (parent)
        memcpy(e + 16, dst->val + 16, 32);
    kvq__st32(e + src->n - 8, kvq_crc32c(0, e + PREC, src->n - 8 - PREC));
    kvq__st32(e + src->n - 4, kvq_crc32c(0, e, src->n - 4));
    CHECK_OK(kvq_store_put(s, dst->key, e, src->n));
    free(e);
}

/* Loads ids from s into a fresh cache: the tokens loaded; *kv_ok tells
 * whether the loaded K/V are exactly the first ones of (k, v) as a cache
 * stores them (compared with a cache fed k, v directly). */
static size_t fetch(kvq_store *s, const int32_t *ids, const float *k, const float *v, int *kv_ok,
                    char *msg, size_t msg_cap) {
    kvq_cache_config cfg;
    base_cfg(&cfg);
    kvq_cache *c = NULL, *ref = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    CHECK_OK(kvq_cache_create(&ref, &cfg));
    size_t got = 0;
    *kv_ok = 0;
    if (c && ref) {
        CHECK_OK(kvq_cache_prefix_get(c, s, ids, PT + 1, &got));
        snprintf(msg, msg_cap, "%s", kvq_cache_last_error(c));
        for (size_t l = 0; l < SL; l++) {
            CHECK_OK(kvq_cache_append(ref, l, k, v, NULL, PT));
            size_t n = 0;
            kvq_cache_tokens(c, l, &n);
            CHECK_EQ(n, got);
        }
        float *a = malloc(PT * SH * SD * 4), *b = malloc(PT * SH * SD * 4);
        float *va = malloc(PT * SH * SD * 4), *vb = malloc(PT * SH * SD * 4);
        int q = 0;
        int32_t qp = PT - 1;
        float qq[SQH * SD], oo[SQH * SD];
        memset(qq, 0, sizeof qq);
        for (size_t l = 0; l < SL; l++)
            CHECK_OK(kvq_cache_attend(ref, l, qq, &qp, 1, oo, SQH * SD, NULL, 0)); /* settle */
        for (size_t l = 0; l < SL && got; l++) {
            CHECK_OK(kvq_cache_get_kv(c, l, -1, 0, got, a, va, got * SH * SD));
            CHECK_OK(kvq_cache_get_kv(ref, l, -1, 0, got, b, vb, got * SH * SD));
            q += memcmp(a, b, got * SH * SD * 4) == 0 && memcmp(va, vb, got * SH * SD * 4) == 0;
        }
        *kv_ok = q == SL;
        free(a), free(b), free(va), free(vb);
    }
    kvq_cache_free(c);
    kvq_cache_free(ref);
    return got;
}

static void test_prefix_forgery(const char *url_a, const char *url_b, const char *url_c) {
    kvq_store *sa = NULL, *sb = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&sa, url_a, NULL, err, sizeof err));
    CHECK_OK(kvq_store_open(&sb, url_b, NULL, err, sizeof err));
    if (!sa || !sb) {
        kvq_store_close(sa);
        kvq_store_close(sb);
        return;
    }
    tu_rng r;
    tu_seed(&r, 77);
    tu_fill_gauss(&r, PKA, PT * SH * SD, 1.0f);
    tu_fill_gauss(&r, PVA, PT * SH * SD, 1.0f);
    tu_fill_gauss(&r, PKB, PT * SH * SD, 1.0f);
    tu_fill_gauss(&r, PVB, PT * SH * SD, 1.0f);
    int32_t A[PT + 1], B[PT + 1], C[PT + 1];
    for (int i = 0; i <= PT; i++)
        A[i] = B[i] = C[i] = (i * 37 + 11) % 500;
    B[PP + 5] = 499; /* B: other ids on page 1 */
    C[3] = 498;      /* C: other ids on page 0, the same on page 1 */
    char msg[256];
    int kv_ok = 0;

    /* the genuine entries: ids stored, keys are 64 hex digits, the record's
     * prefix_hash is the key's first 8 bytes */
    publish(sa, A, PKA, PVA);
    find_ctx fa, fb;
    for (uint32_t j = 0; j < PT / PP; j++)
        for (uint32_t l = 0; l < SL; l++) {
            TU_REPORT(find_entry(sa, j, l, &fa), "no prefix entry for page %u layer %u", j, l);
            if (!fa.val)
                continue;
            uint8_t le[4 * PP];
            for (int i = 0; i < PP; i++)
                kvq__st32(le + 4 * i, (uint32_t)A[j * PP + i]);
            CHECK(memcmp(fa.val + 48, le, sizeof le) == 0);
            CHECK(strlen(fa.key) == 5 + 64 + 3 && strncmp(fa.key, "kvqp/", 5) == 0);
            uint8_t h8[8];
            for (int i = 0; i < 8; i++) {
                unsigned x = 0;
                sscanf(fa.key + 5 + 2 * i, "%2x", &x);
                h8[i] = (uint8_t)x;
            }
            CHECK(memcmp(h8, fa.val + PREC + 48, 8) == 0);
            free(fa.val);
        }
    CHECK_EQ(fetch(sa, A, PKA, PVA, &kv_ok, msg, sizeof msg), PT);
    CHECK(kv_ok);

    /* control: the forging procedure on A's own entries changes nothing */
    for (uint32_t l = 0; l < SL; l++) {
        find_entry(sa, 1, l, &fa);
        if (fa.val)
            forge(sa, &fa, &fa, 1);
        free(fa.val);
    }
    CHECK_EQ(fetch(sa, A, PKA, PVA, &kv_ok, msg, sizeof msg), PT);
    CHECK(kv_ok);

    /* B's page 1 (other ids, other K/V) with A's hashes, under A's keys, on
     * every layer or on layer 1 only: a miss, A's page 0 alone is loaded */
    publish(sb, B, PKB, PVB);
    for (int only1 = 0; only1 < 2; only1++) {
        publish(sa, A, PKA, PVA);
        for (uint32_t l = only1 ? 1 : 0; l < SL; l++) {
            int ok = find_entry(sa, 1, l, &fa) & find_entry(sb, 1, l, &fb);
            CHECK(ok);
            if (ok)
                forge(sa, &fb, &fa, 1);
            free(fa.val);
            free(fb.val);
        }
        size_t got = fetch(sa, A, PKA, PVA, &kv_ok, msg, sizeof msg);
        TU_REPORT(got == PP, "forged page 1 (other ids%s): loaded %zu tokens, want %d",
                  only1 ? ", layer 1 only" : "", got, PP);
        CHECK(kv_ok);
        TU_REPORT(strstr(msg, "another prompt") != NULL, "message '%s'", msg);
    }

    /* C's page 1 (the same ids, K/V computed after other ids on page 0) with
     * A's prefix_hash under A's keys: its parent digest differs, a miss */
    kvq_store_close(sb);
    sb = NULL;
    CHECK_OK(kvq_store_open(&sb, url_c, NULL, err, sizeof err));
    if (sb) {
        publish(sb, C, PKB, PVB);
        publish(sa, A, PKA, PVA);
        for (uint32_t l = 0; l < SL; l++) {
            int ok = find_entry(sa, 1, l, &fa) & find_entry(sb, 1, l, &fb);
            CHECK(ok);
            if (ok)
                forge(sa, &fb, &fa, 0);
            free(fa.val);
            free(fb.val);
        }
        size_t got = fetch(sa, A, PKA, PVA, &kv_ok, msg, sizeof msg);
        TU_REPORT(got == PP, "forged page 1 (other prefix): loaded %zu tokens, want %d", got, PP);
        CHECK(kv_ok);
    }
    kvq_store_close(sa);
    kvq_store_close(sb);
}

/* ---- a failed restore leaves the cache as it was ---- */
#define LT 200 /* tokens appended: enough for cold pages in tiered() */

static float LK[LT * SH * SD], LV[LT * SH * SD];

/* Stats that a failed load or prefix_get must leave as they were (all but
 * peak_stored_bytes), as text for one comparison. */
static void stats_text(kvq_cache *c, char *buf, size_t n) {
    kvq_stats t;
    kvq_cache_stats(c, -1, &t);
    snprintf(buf, n, "%llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
             (unsigned long long)t.tokens, (unsigned long long)t.tokens_appended,
             (unsigned long long)t.payload_bytes, (unsigned long long)t.metadata_bytes,
             (unsigned long long)t.codec_meta_bytes, (unsigned long long)t.stored_bytes,
             (unsigned long long)t.bytes_written, (unsigned long long)t.pages,
             (unsigned long long)t.free_slots, (unsigned long long)t.fixed_bytes,
             (unsigned long long)t.tokens_evicted);
}

/* kvq_cache_load (prefix = 0) or kvq_cache_prefix_get (1) with an
 * allocator failing at its k-th allocation inside the call, k = 1, 2, ...
 * until the call succeeds: after each failure the cache holds what it held
 * (stats, live bytes, no token) and then restores for real. Returns the
 * number of failures injected. */
static int restore_sweep(kvq_store *s, int prefix, const int32_t *ids, const char *name) {
    kvq_cache_config cfg;
    base_cfg(&cfg);
    cfg.k_codec = cfg.v_codec = "int8";
    int injected = 0;
    for (long k = 1; k < 10000; k++) {
        tu_failalloc fa;
        kvq_allocator al = tu_failalloc_make(&fa, 0);
        cfg.allocator = &al;
        kvq_cache *c = NULL;
        CHECK_OK(kvq_cache_create(&c, &cfg));
        if (!c)
            return injected;
        char before[512], after[512];
        stats_text(c, before, sizeof before);
        size_t live = fa.live_bytes;
        fa.fail_at = fa.calls + k;
        size_t got = 0;
        kvq_status st = prefix ? kvq_cache_prefix_get(c, s, ids, PT + 1, &got)
                               : kvq_cache_load(c, s, name);
        int failed = st != KVQ_OK;
        fa.fail_at = 0;
        if (failed) {
            injected++;
            TU_REPORT(st == KVQ_ERR_NOMEM, "k=%ld: %s", k, kvq_strerror(st));
            stats_text(c, after, sizeof after);
            TU_REPORT(strcmp(before, after) == 0, "k=%ld: stats '%s' became '%s'", k, before,
                      after);
            TU_REPORT(fa.live_bytes == live, "k=%ld: %zu live bytes became %zu", k, live,
                      fa.live_bytes);
            st = prefix ? kvq_cache_prefix_get(c, s, ids, PT + 1, &got) : kvq_cache_load(c, s, name);
            CHECK_OK(st);
        }
        size_t n = 0;
        kvq_cache_tokens(c, 0, &n);
        CHECK(n == (prefix ? PT : LT));
        kvq_cache_free(c);
        CHECK_EQ(fa.live_bytes, 0);
        if (!failed)
            break;
    }
    return injected;
}

static void test_restore_failures(const char *url) {
    kvq_store *s = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (!s)
        return;
    kvq_cache_config cfg;
    base_cfg(&cfg);
    cfg.k_codec = cfg.v_codec = "int8";
    kvq_cache *a = NULL;
    CHECK_OK(kvq_cache_create(&a, &cfg));
    if (!a) {
        kvq_store_close(s);
        return;
    }
    int32_t ids[LT];
    for (int i = 0; i < LT; i++)
        ids[i] = i * 3 + 1;
    for (size_t l = 0; l < SL; l++)
        CHECK_OK(kvq_cache_append(a, l, LK, LV, NULL, LT));
    CHECK_OK(kvq_cache_save(a, s, "sweep", INT32_MAX));
    CHECK_OK(kvq_cache_prefix_put(a, s, ids, PT));
    kvq_cache_free(a);
    int n1 = restore_sweep(s, 0, ids, "sweep"), n2 = restore_sweep(s, 1, ids, NULL);
    printf("  allocation failures injected: kvq_cache_load %d, kvq_cache_prefix_get %d\n", n1, n2);
    CHECK(n1 > 0 && n2 > 0);
    /* a page record missing from the store: the snapshot is not whole
     * (KVQ_ERR_CORRUPT); the load fails after the first layer is in, and
     * the cache is as it was */
    CHECK_OK(kvq_store_del(s, "sweep/l1/p3"));
    kvq_cache *b = NULL;
    CHECK_OK(kvq_cache_create(&b, &cfg));
    if (b) {
        char before[512], after[512];
        stats_text(b, before, sizeof before);
        CHECK_STATUS(kvq_cache_load(b, s, "sweep"), KVQ_ERR_CORRUPT);
        stats_text(b, after, sizeof after);
        TU_REPORT(strcmp(before, after) == 0, "stats '%s' became '%s'", before, after);
        CHECK(strstr(kvq_cache_last_error(b), "sweep/l1/p3") != NULL);
        /* a snapshot that is not there: said so by name */
        CHECK_STATUS(kvq_cache_load(b, s, "nothing-here"), KVQ_ERR_RANGE);
        CHECK(strstr(kvq_cache_last_error(b), "no snapshot 'nothing-here'") != NULL);
        kvq_cache_free(b);
    }
    kvq_store_close(s);
}

/* ---- item 5: random cache ids; a store closed before its caches ---- */

/* A cache whose pages past 32 hot + 32 warm tokens per layer go to store s
 * (NULL: all hot), with LT tokens appended and attended (so they settle
 * and demote). */
static kvq_cache *tiered(kvq_store *s) {
    kvq_cache_config cfg;
    base_cfg(&cfg);
    cfg.k_codec = cfg.v_codec = "int8";
    cfg.protect_recent = 16;
    if (s)
        cfg.hot_tokens = 32, cfg.warm_tokens = 32, cfg.cold_store = s, cfg.verify_tiers = 1;
    kvq_cache *c = NULL;
    CHECK_OK(kvq_cache_create(&c, &cfg));
    if (!c)
        return NULL;
    float q[SQH * SD], o[SQH * SD];
    memset(q, 0, sizeof q);
    int32_t qp = LT - 1;
    for (size_t l = 0; l < SL; l++) {
        CHECK_OK(kvq_cache_append(c, l, LK, LV, NULL, LT));
        CHECK_OK(kvq_cache_attend(c, l, q, &qp, 1, o, SQH * SD, NULL, 0));
    }
    return c;
}

typedef struct {
    kvq_store *s;
    int n, n_ids;
    char ids[4][33];
    int rec_ok; /* records whose cache_id is the key's first 64 bits */
} ids_ctx;

static int ids_fn(void *ctx, const char *key, size_t size) {
    ids_ctx *x = ctx;
    (void)size;
    x->n++;
    const char *id = key + 4, *sl = strchr(id, '/');
    size_t len = sl ? (size_t)(sl - id) : 0;
    TU_REPORT(len == 32, "cold record key '%s' does not hold a 128-bit id", key);
    if (len == 0 || len > 32)
        return 0;
    int k = 0;
    while (k < x->n_ids && (strlen(x->ids[k]) != len || strncmp(x->ids[k], id, len) != 0))
        k++;
    if (k == x->n_ids && k < 4) {
        memcpy(x->ids[k], id, len);
        x->ids[k][len] = 0;
        x->n_ids++;
    }
    void *d = NULL;
    size_t n = 0;
    kvq_record_info info;
    if (kvq_store_get(x->s, key, &d, &n) == KVQ_OK && kvq_record_inspect(d, n, &info) == KVQ_OK) {
        char lo[17];
        snprintf(lo, sizeof lo, "%016llx", (unsigned long long)info.cache_id);
        x->rec_ok += strncmp(lo, id, 16) == 0;
    }
    kvq_store_free_buf(x->s, d);
    return 0;
}

static ids_ctx list_ids(kvq_store *s) {
    ids_ctx x;
    memset(&x, 0, sizeof x);
    x.s = s;
    CHECK_OK(kvq_store_list(s, "kvq/", ids_fn, &x));
    return x;
}

static void test_cache_ids(const char *url) {
    kvq_store *s = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (!s)
        return;
    kvq_cache *a = tiered(s);
    ids_ctx x = list_ids(s);
    CHECK(x.n > 0);
    CHECK_EQ(x.n_ids, 1);
    CHECK_EQ(x.rec_ok, x.n);
    char id1[33] = "";
    memcpy(id1, x.ids[0], 33);
    void *addr1 = a;
    kvq_cache_free(a);
    x = list_ids(s);
    CHECK_EQ(x.n, 0); /* freeing a cache deletes its records */
    /* the next cache often gets the same address (not under ASan): its id
     * must differ all the same */
    kvq_cache *b = tiered(s), *c = tiered(s);
    printf("  cache address reused: %s\n", (void *)b == addr1 ? "yes" : "no");
    x = list_ids(s);
    CHECK_EQ(x.n_ids, 2);
    CHECK(strcmp(x.ids[0], id1) != 0 && strcmp(x.ids[1], id1) != 0);
    CHECK(strcmp(x.ids[0], x.ids[1]) != 0);
    CHECK_EQ(x.rec_ok, x.n);
    kvq_cache_free(b);
    kvq_cache_free(c);
    kvq_store_close(s);
}

/* kvq_store_close while caches use the store as their cold store: the
 * store stays open (its directory stays locked) until the last of them is
 * freed, they keep working, and their records are deleted. Under ASan
 * (make check-san) a use after free fails here. */
static void test_store_lifetime(const char *url) {
    kvq_store *s = NULL, *s2 = NULL;
    char err[256] = "";
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (!s)
        return;
    kvq_cache *a = tiered(s), *b = tiered(s), *ref = tiered(NULL);
    if (!a || !b || !ref) {
        kvq_cache_free(a);
        kvq_cache_free(b);
        kvq_cache_free(ref);
        kvq_store_close(s);
        return;
    }
    kvq_tier_stats ts;
    kvq_cache_tier_stats(a, &ts);
    CHECK(ts.pages[2] > 0);
    kvq_store_close(s); /* deferred: a and b still use it */
    CHECK(kvq_store_open(&s2, url, NULL, err, sizeof err) != KVQ_OK);
    CHECK(s2 == NULL);
    /* a keeps working: its cold pages come back exactly */
    float q[SQH * SD], o1[SQH * SD], o2[SQH * SD];
    tu_rng r;
    tu_seed(&r, 12);
    tu_fill_gauss(&r, q, SQH * SD, 1.0f);
    int32_t qp = LT - 1;
    for (size_t l = 0; l < SL; l++) {
        CHECK_OK(kvq_cache_attend(a, l, q, &qp, 1, o1, SQH * SD, NULL, 0));
        CHECK_OK(kvq_cache_attend(ref, l, q, &qp, 1, o2, SQH * SD, NULL, 0));
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
    }
    kvq_cache_tier_stats(a, &ts);
    CHECK(ts.promotions > 0);
    CHECK_EQ(ts.lost_pages, 0);
    kvq_cache_free(a);
    CHECK(kvq_store_open(&s2, url, NULL, err, sizeof err) != KVQ_OK); /* b holds it */
    kvq_cache_free(b); /* the last one: deletes its records, closes the store */
    kvq_cache_free(ref);
    CHECK_OK(kvq_store_open(&s2, url, NULL, err, sizeof err));
    if (s2) {
        ids_ctx x = list_ids(s2);
        CHECK_EQ(x.n, 0);
        kvq_store_close(s2);
    }
}

/* ---- item 9: directories are synced after a rename or a creation ---- */
/* fsync is interposed: the library, linked statically into this test,
 * calls this one, which notes the directories synced (and whether a given
 * path existed at that moment) and then syncs for real. */
static int g_watch;
static char g_want_path[800];
static struct {
    char dir[600];
    int present;
} g_sync[16];
static int g_nsync;

int fsync(int fd) {
    struct stat sb;
    if (g_watch && g_nsync < 16 && fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char lp[64];
        snprintf(lp, sizeof lp, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(lp, g_sync[g_nsync].dir, sizeof g_sync[0].dir - 1);
        g_sync[g_nsync].dir[n > 0 ? n : 0] = 0;
        g_sync[g_nsync].present = access(g_want_path, F_OK) == 0;
        g_nsync++;
    }
    return (int)syscall(SYS_fsync, fd);
}

/* 1 when dir was synced while g_want_path existed. */
static int synced_with(const char *dir) {
    char real[600];
    if (!realpath(dir, real))
        return 0;
    for (int i = 0; i < g_nsync; i++)
        if (strcmp(g_sync[i].dir, real) == 0 && g_sync[i].present)
            return 1;
    return 0;
}

static void test_dir_sync(const char *dir) {
    char sub[600], path[700];
    snprintf(sub, sizeof sub, "%s/calib", dir);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(path, sizeof path, "%s/k.state", sub);
    kvq_codec *k = NULL;
    CHECK_OK(kvq_codec_create(&k, "tq3:norm=8", SD, NULL));
    g_nsync = 0, g_watch = 1;
    snprintf(g_want_path, sizeof g_want_path, "%s", path);
    CHECK_OK(kvq_codec_save_file(k, path));
    g_watch = 0;
    TU_REPORT(synced_with(sub), "kvq_codec_save_file did not fsync %s after the rename", sub);
    kvq_codec_free(k);

    char url[800], sdir[700];
    snprintf(sdir, sizeof sdir, "%s/newstore", dir);
    snprintf(url, sizeof url, "file:%s", sdir);
    kvq_store *s = NULL;
    char err[256] = "";
    g_nsync = 0, g_watch = 1;
    snprintf(g_want_path, sizeof g_want_path, "%s", sdir);
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    g_watch = 0;
    TU_REPORT(synced_with(dir), "the file store did not fsync %s after creating %s", dir, sdir);
    kvq_store_close(s);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_sha256();
    char dir[] = "/tmp/kvq_snap_XXXXXX";
    if (!mkdtemp(dir)) {
        tu_fail++;
        return tu_finish();
    }
    char url[300];
    snprintf(url, sizeof url, "file:%s/store", dir);
    test_load_config(url);
    char url_b[300], url_c[300];
    snprintf(url, sizeof url, "file:%s/pa", dir);
    snprintf(url_b, sizeof url_b, "file:%s/pb", dir);
    snprintf(url_c, sizeof url_c, "file:%s/pc", dir);
    test_prefix_forgery(url, url_b, url_c);
    /* the same in a shared Redis (tests/with_redis.sh), where anyone with
     * access could plant an entry */
    const char *why = "";
    const char *redis = tu_redis_env("KVQ_TEST_REDIS", &why);
    const char *ns = redis ? strrchr(redis, '/') : NULL;
    if (ns && ns > redis + 8) {
        int hl = (int)(ns - redis);
        snprintf(url, sizeof url, "%.*s/snap_pa", hl, redis);
        snprintf(url_b, sizeof url_b, "%.*s/snap_pb", hl, redis);
        snprintf(url_c, sizeof url_c, "%.*s/snap_pc", hl, redis);
        test_prefix_forgery(url, url_b, url_c);
    } else {
        printf("SKIP redis prefix entries: %s\n", why);
    }
    tu_rng lr;
    tu_seed(&lr, 8);
    tu_fill_gauss(&lr, LK, LT * SH * SD, 1.0f);
    tu_fill_gauss(&lr, LV, LT * SH * SD, 1.0f);
    snprintf(url, sizeof url, "file:%s/sweep", dir);
    test_restore_failures(url);
    snprintf(url, sizeof url, "file:%s/ids", dir);
    test_cache_ids(url);
    snprintf(url, sizeof url, "file:%s/life", dir);
    test_store_lifetime(url);
    test_dir_sync(dir);
    rm_tree(dir);
    return tu_finish();
}
