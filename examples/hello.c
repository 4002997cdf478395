/* hello.c - the smallest kvq program: 1000 decode steps through a compressed cache */
#include <kvq.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);  /* defaults; then the shape and the codecs */
    cfg.n_layers = 1, cfg.n_kv_heads = 8, cfg.n_q_heads = 32, cfg.head_dim = 128;
    cfg.k_codec = "int8", cfg.v_codec = "tq3", cfg.max_tokens = 4096;
    kvq_cache *kv;
    if (kvq_cache_create(&kv, &cfg) != KVQ_OK) return 1;
    static float k[8 * 128], v[8 * 128], q[32 * 128], out[32 * 128];
    for (int32_t pos = 0; pos < 1000; pos++) {  /* each step: store K/V, attend */
        for (int i = 0; i < 32 * 128; i++) q[i] = rand() / (float)RAND_MAX - 0.5f;
        for (int i = 0; i < 8 * 128; i++) k[i] = q[i + 128], v[i] = q[i];
        if (kvq_cache_append(kv, 0, k, v, &pos, 1) != KVQ_OK ||
            kvq_cache_attend(kv, 0, q, &pos, 1, out, 32 * 128, NULL, 0) != KVQ_OK) return 1;
    }
    kvq_stats st;
    if (kvq_cache_stats(kv, -1, &st) != KVQ_OK) return 1;  /* layer -1: all layers */
    printf("%llu tokens in %llu bytes: %.2f bits per value\n", (unsigned long long)st.tokens,
           (unsigned long long)st.stored_bytes, st.bits_per_value);
    kvq_cache_free(kv);
    return st.tokens == 1000 ? 0 : 1;
}
