/* quickstart.c - kvq in one page: a codec, a decode loop through a cache that
 * evicts under a budget, and a snapshot in a file store (DIR, default
 * ./kvq-quickstart). Build: cc -std=c11 quickstart.c $(pkg-config --cflags --libs kvq) */
#include <kvq.h>
#include <stdint.h>
#include <stdio.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        kvq_status st_ = (call);                                                         \
        if (st_ != KVQ_OK) {                                                             \
            fprintf(stderr, "%s: %s\n", #call, kvq_strerror(st_));                       \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

enum { DIM = 128, KV_HEADS = 2, Q_HEADS = 8, STEPS = 256, BUDGET = 64 };

static float rnd(void) { /* a small LCG: uniform in [-1, 1) */
    static uint32_t s = 12345;
    s = s * 1664525u + 1013904223u;
    return (float)(s >> 8) / 8388608.0f - 1.0f;
}

int main(int argc, char **argv) {
    static float k[KV_HEADS * DIM], v[KV_HEADS * DIM], q[Q_HEADS * DIM], out[Q_HEADS * DIM];
    static unsigned char bytes[KV_HEADS * 4 * DIM];
    float scores[KV_HEADS], exact = 0;

    /* codecs: encode, then score queries directly on the encoded bytes */
    kvq_codec *c;
    CHECK(kvq_codec_create(&c, "tq3", DIM, NULL));  /* spec: name[:opt=val...] */
    for (int i = 0; i < KV_HEADS * DIM; i++)  /* two vectors, [KV_HEADS][DIM] */
        k[i] = rnd(), q[i] = rnd();
    size_t size = KV_HEADS * kvq_codec_vector_bytes(c);
    CHECK(kvq_codec_encode(c, bytes, sizeof bytes, k, KV_HEADS));
    CHECK(kvq_codec_score(c, scores, KV_HEADS, q, 1, bytes, size));
    for (int i = 0; i < DIM; i++)
        exact += q[i] * k[i];
    printf("%s: %zu bytes for %d floats (%.3f bits/value); <q, k0> %.3f encoded, %.3f exact\n",
           kvq_codec_spec(c), size, KV_HEADS * DIM, kvq_codec_bits_per_value(c), scores[0], exact);
    kvq_codec_free(c);

    /* the cache: int8 keys, tq3 values, utility (H2O-style) eviction to BUDGET tokens */
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1; cfg.n_kv_heads = KV_HEADS; cfg.n_q_heads = Q_HEADS; cfg.head_dim = DIM;
    cfg.max_tokens = 4096; cfg.k_codec = "int8"; cfg.v_codec = "tq3";
    cfg.policy = KVQ_POLICY_UTILITY; cfg.budget_tokens = BUDGET; cfg.protect_recent = 16;
    kvq_cache *kv;
    CHECK(kvq_cache_create(&kv, &cfg));
    for (int32_t pos = 0; pos < STEPS; pos++) {  /* decode: one token per step, layer 0 */
        for (int i = 0; i < KV_HEADS * DIM; i++)
            k[i] = rnd(), v[i] = rnd();
        for (int i = 0; i < Q_HEADS * DIM; i++)
            q[i] = rnd();
        CHECK(kvq_cache_append(kv, 0, k, v, &pos, 1));
        CHECK(kvq_cache_attend(kv, 0, q, &pos, 1, out, Q_HEADS * DIM, NULL, 0));
    }
    kvq_stats st;
    CHECK(kvq_cache_stats(kv, -1, &st));  /* layer -1: all layers */
    printf("cache: %llu tokens stored, %llu evicted, %.2f bits/value, %llu bytes\n",
           (unsigned long long)st.tokens, (unsigned long long)st.tokens_evicted,
           st.bits_per_value, (unsigned long long)st.stored_bytes);

    /* stores: the cold tier, snapshots and prefix reuse ("redis://host:6379/ns" too) */
    char url[4096], err[256] = "";
    snprintf(url, sizeof url, "file:%s", argc > 1 ? argv[1] : "kvq-quickstart");
    kvq_store *s;
    kvq_status rc = kvq_store_open(&s, url, NULL, err, sizeof err);
    if (rc != KVQ_OK) {
        fprintf(stderr, "%s: %s (%s)\n", url, kvq_strerror(rc), err);
        return 1;
    }
    CHECK(kvq_cache_save(kv, s, "quickstart", INT32_MAX));  /* kvq_cache_load restores it */
    printf("saved snapshot 'quickstart' to %s\n", url);
    kvq_store_close(s);
    kvq_cache_free(kv);
    return st.tokens == BUDGET && st.tokens + st.tokens_evicted == STEPS ? 0 : 1;
}
