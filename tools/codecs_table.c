/*
 * codecs_table.c - `kvq codecs`: the table of codecs the README promises,
 * every figure computed by the library: bits per value (every stored byte
 * of a vector, scales, minimums and norms included, x 8 / head_dim) at
 * head_dim 64 and 128 (or --head-dim N), the codec state (fitted tables,
 * per codec, not per vector) and what each stores. The KIVI-style channel
 * key rows (chan:int1..8, keys in the cache only) are measured on a
 * one-head cache with pages of --page tokens: b bits per value plus an
 * fp16 scale and minimum per channel per page (32 / P bits).
 */
#include "cliargs.h"
#include "kvq.h"
#include "tool.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *spec, *what;
} ct_catalog[] = {
    {"f32", "the values"},
    {"f16", "the values, IEEE half, round to nearest even (saturates at +-65504)"},
    {"bf16", "the values, bfloat16, round to nearest even"},
    {"int8", "symmetric: fp16 scale (absmax/127) per vector, int8 values"},
    {"int8:g=32", "the same with groups of 32 values"},
    {"int4", "asymmetric: fp16 scale and minimum per vector, 4-bit codes"},
    {"int4:g=32", "the same with groups of 32 values"},
    {"int2", "asymmetric: fp16 scale and minimum per vector, 2-bit codes"},
    {"int2:g=32", "the same with groups of 32 values"},
    {"tq1", "TurboQuant-MSE: fp16 scale, 1-bit Lloyd-Max indices of the rotated unit vector"},
    {"tq2", "TurboQuant-MSE, 2-bit indices"},
    {"tq3", "TurboQuant-MSE, 3-bit indices"},
    {"tq4", "TurboQuant-MSE, 4-bit indices"},
    {"tq3:norm=8", "TurboQuant-MSE, 3-bit, the scale as an 8-bit log2 code"},
    {"tq4:norm=8", "TurboQuant-MSE, 4-bit, the scale as an 8-bit log2 code"},
    {"tqp2", "TurboQuant-prod: tq1, a 1-bit QJL sketch of the residual and its norm"},
    {"tqp3", "TurboQuant-prod: tq2 + the 1-bit residual sketch"},
    {"tqp4", "TurboQuant-prod: tq3 + the 1-bit residual sketch"},
    {"nuq1", "per-channel Lloyd-Max levels (state, fitted), 1-bit indices"},
    {"nuq2", "the same, 2-bit indices"},
    {"nuq3", "the same, 3-bit indices"},
    {"nuq4", "the same, 4-bit indices"},
    {"nuq5", "the same, 5-bit indices"},
    {"nuq6", "the same, 6-bit indices"},
    {"nuq7", "the same, 7-bit indices"},
    {"nuq8", "the same, 8-bit indices"},
};

/* Bits per value and state bytes of a vector codec at head_dim d; -1 when
 * the codec does not take d (a group that does not divide it). */
static double ct_codec_bits(const char *spec, size_t d, size_t *state) {
    kvq_codec *c = NULL;
    *state = 0;
    if (kvq_codec_create(&c, spec, d, NULL) != KVQ_OK)
        return -1;
    double b = kvq_codec_bits_per_value(c);
    *state = kvq_codec_state_bytes(c);
    kvq_codec_free(c);
    return b;
}

/* Bits per value of channel-layout keys chan:int<b> at head_dim d with
 * pages of P tokens: a one-layer, one-head cache's asymptotic figure with
 * f16 values, less the values' 16 bits (the figure is the mean of K and V). */
static double ct_chan_bits(int b, size_t d, size_t P) {
    char spec[16];
    snprintf(spec, sizeof spec, "chan:int%d", b);
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1, cfg.n_kv_heads = 1, cfg.n_q_heads = 1, cfg.head_dim = d;
    cfg.max_tokens = P, cfg.page_tokens = P;
    cfg.k_codec = "f16", cfg.v_codec = "f16";
    kvq_codec_override ov = {0, 0, 0, spec, NULL, 0};
    cfg.overrides = &ov;
    cfg.n_overrides = 1;
    kvq_cache *kc = NULL;
    if (kvq_cache_create(&kc, &cfg) != KVQ_OK)
        return -1;
    kvq_stats st;
    kvq_cache_stats(kc, -1, &st);
    kvq_cache_free(kc);
    return 2.0 * st.asymptotic_bits_per_value - 16.0;
}

static void ct_usage(FILE *f) {
    fprintf(f, "usage: kvq codecs [--head-dim N] [--page P] [--markdown]\n"
               "  every codec with its bits per value (all stored bytes of a vector, scales,\n"
               "  minimums and norms included, x 8 / head_dim) at head_dim 64 and 128, or at N\n"
               "  (1..1024); the codec state in bytes (fitted tables: per codec, not per\n"
               "  vector); chan:int1..8, the KIVI-style channel keys of the cache, with pages\n"
               "  of P tokens (1..4096, 16); --markdown prints the table for docs\n");
}

int kvq_tool_codecs(int argc, char **argv) {
    size_t dims[2] = {64, 128}, ndims = 2, page = 16;
    int markdown = 0;
    const char *cmd = "codecs";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (kvqt_is_help(a)) {
            ct_usage(stdout);
            return KVQT_EXIT_OK;
        } else if (!strcmp(a, "--markdown")) {
            markdown = 1;
        } else if (!strcmp(a, "--head-dim") || !strcmp(a, "--page")) {
            if (i + 1 >= argc)
                return kvqt_usage_error(cmd, "%s needs a value", a);
            int head = !strcmp(a, "--head-dim");
            if (kvqt_arg_size(cmd, a, argv[++i], 1, head ? 1024 : 4096, head ? &dims[0] : &page))
                return kvqt_usage_hint(cmd);
            if (head)
                ndims = 1;
        } else {
            return kvqt_usage_error(cmd, "%s '%s'",
                                    a[0] == '-' ? "unknown option" : "unexpected argument", a);
        }
    }
    size_t sdim = dims[ndims - 1];
    if (markdown) {
        printf("| codec |");
        for (size_t k = 0; k < ndims; k++)
            printf(" bits/value at d=%zu |", dims[k]);
        printf(" state bytes (d=%zu) | what is stored per vector |\n|---|", sdim);
        for (size_t k = 0; k < ndims; k++)
            printf("---:|");
        printf("---:|---|\n");
    } else {
        printf("bits/value: stored bits per value, every byte of a vector counted (scales,\n"
               "minimums, norms) x 8 / head_dim d; state: bytes per codec (fitted tables),\n"
               "not per vector; n/a: the codec does not take this head_dim\n\n");
        printf("%-12s", "codec");
        for (size_t k = 0; k < ndims; k++) {
            char h[32];
            snprintf(h, sizeof h, "bits/value d=%zu", dims[k]);
            printf(" %16s", h);
        }
        char h[32];
        snprintf(h, sizeof h, "state bytes d=%zu", sdim);
        printf(" %17s  %s\n", h, "what is stored per vector");
    }
    size_t n = sizeof ct_catalog / sizeof ct_catalog[0];
    for (size_t i = 0; i < n + 8; i++) {
        char name[32], what[160], bits[2][32];
        size_t state = 0;
        if (i < n) {
            snprintf(name, sizeof name, "%s", ct_catalog[i].spec);
            snprintf(what, sizeof what, "%s", ct_catalog[i].what);
        } else {
            int b = (int)(i - n) + 1;
            snprintf(name, sizeof name, "chan:int%d", b);
            snprintf(what, sizeof what,
                     "cache keys only: %d-bit codes, fp16 scale and minimum "
                     "per channel per page of %zu",
                     b, page);
        }
        for (size_t k = 0; k < ndims; k++) {
            double v = i < n ? ct_codec_bits(name, dims[k], &state)
                             : ct_chan_bits((int)(i - n) + 1, dims[k], page);
            if (v < 0)
                snprintf(bits[k], sizeof bits[k], "n/a");
            else
                snprintf(bits[k], sizeof bits[k], "%.3f", v);
        }
        if (markdown) {
            printf("| `%s` |", name);
            for (size_t k = 0; k < ndims; k++)
                printf(" %s |", bits[k]);
            printf(" %zu | %s |\n", state, what);
        } else {
            printf("%-12s", name);
            for (size_t k = 0; k < ndims; k++)
                printf(" %16s", bits[k]);
            printf(" %17zu  %s\n", state, what);
        }
    }
    if (!markdown)
        printf("\noptions: g=N group size of the int codecs (must divide head_dim); nc=0|1\n"
               "TurboQuant norm correction (1); norm=16|8 the TurboQuant scale as fp16 or an\n"
               "8-bit log2 code; seed=N the rotation and sketch seed. e.g. int4:g=64, "
               "tq3:norm=8\n");
    return KVQT_EXIT_OK;
}
