/*
 * bench_attend.c - `kvq bench attend`: the time of one decode step of
 * attention (one query per query head over one layer of 8 KV heads, 32
 * query heads, head_dim 128) against context length, for each codec, with
 * f32 and f16 caches measured in the same run as the baselines, the encoded
 * bytes the step reads, and the append time per token at that context.
 */
#include "kvq.h"
#include "benchlib.h"
#include "tool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvq_cache *c;
    const float *q;
    int32_t qpos;
    float *out;
    size_t out_cap;
} ba_ctx;

static int ba_step(void *arg) {
    ba_ctx *x = (ba_ctx *)arg;
    return kvq_cache_attend(x->c, 0, x->q, &x->qpos, 1, x->out, x->out_cap, NULL, 0) == KVQ_OK ? 0 : 1;
}

static uint64_t ba_seed(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float ba_gauss(uint64_t *s) {
    double u = ((double)(ba_seed(s) >> 11) + 0.5) * 0x1.0p-53, v = (double)(ba_seed(s) >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

typedef struct {
    char codec[96];
    size_t context;
    double step_us, ratio, append_ns;
    uint64_t bytes_read;
    int ok;
} ba_row;

/* Builds a cache of `codec` holding `ctx` tokens; times 64 single-token
 * appends at the end and one attention step. */
static int ba_run(const char *codec, size_t ctx, size_t threads, const float *K, const float *V,
                  const float *q, size_t H, size_t QH, size_t d, ba_row *row) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    char msg[256] = "";
    cfg.n_layers = 1, cfg.n_kv_heads = H, cfg.n_q_heads = QH, cfg.head_dim = d;
    cfg.max_tokens = ctx, cfg.k_codec = codec, cfg.v_codec = codec, cfg.n_threads = threads;
    cfg.err_msg = msg, cfg.err_msg_size = sizeof msg;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&c, &cfg);
    snprintf(row->codec, sizeof row->codec, "%s", codec);
    row->context = ctx;
    row->ok = 0;
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq bench attend: %s: %s\n", codec, msg[0] ? msg : kvq_strerror(st));
        return st == KVQ_ERR_NOMEM ? 1 : 2;
    }
    size_t tail = ctx > 128 ? 64 : ctx / 2, pre = ctx - tail, HD = H * d;
    for (size_t t = 0; t < pre && st == KVQ_OK; t += 1024) {
        size_t m = pre - t < 1024 ? pre - t : 1024;
        st = kvq_cache_append(c, 0, K + t * HD, V + t * HD, NULL, m);
    }
    double t0 = kvqb_now();
    for (size_t t = pre; t < ctx && st == KVQ_OK; t++)
        st = kvq_cache_append(c, 0, K + t * HD, V + t * HD, NULL, 1);
    double t1 = kvqb_now();
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq bench attend: %s: %s\n", codec, kvq_strerror(st));
        kvq_cache_free(c);
        return 1;
    }
    row->append_ns = tail ? (t1 - t0) / (double)tail * 1e9 : 0;
    float *out = malloc(QH * d * sizeof(float));
    ba_ctx x = {c, q, (int32_t)ctx, out, QH * d};
    kvq_stats s0, s1;
    kvq_cache_stats(c, 0, &s0);
    ba_step(&x);
    kvq_cache_stats(c, 0, &s1);
    row->bytes_read = s1.bytes_read - s0.bytes_read;
    kvqb_config bc = kvqb_default_config();
    bc.reps = 7;
    bc.budget_s = 1.5;
    kvqb_stats bs;
    int rc = kvqb_measure(ba_step, &x, &bc, &bs);
    /* verify after timing: the output must be finite */
    int finite = 1;
    for (size_t i = 0; i < QH * d; i++)
        finite &= isfinite(out[i]) != 0;
    if (rc || !finite) {
        fprintf(stderr, "kvq bench attend: %s: attention failed or produced non-finite output\n",
                codec);
        free(out);
        kvq_cache_free(c);
        return 1;
    }
    row->step_us = bs.median_s * 1e6;
    row->ok = 1;
    free(out);
    kvq_cache_free(c);
    return 0;
}

int kvq_tool_bench_attend(int argc, char **argv) {
    const char *ctx_list = "1024,4096,16384,32768";
    const char *codec_list = "int8,int4:g=32,tq3,tq4";
    size_t threads = 1, H = 8, QH = 32, d = 128;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--context") && i + 1 < argc)
            ctx_list = argv[++i];
        else if (!strcmp(argv[i], "--codec") && i + 1 < argc)
            codec_list = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: kvq bench attend [--context 1024,4096,16384,32768] "
                            "[--codec LIST] [--threads N] [--json]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "kvq bench attend: --threads must be 1..64\n");
        return 2;
    }
    size_t ctxs[32], nctx = 0;
    for (const char *p = ctx_list; *p && nctx < 32;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v < 1 || v > (1u << 22)) {
            fprintf(stderr, "kvq bench attend: bad --context list '%s'\n", ctx_list);
            return 2;
        }
        ctxs[nctx++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    /* codecs: f32 and f16 first (the baselines), then the list */
    char *list = malloc(strlen(codec_list) + 16);
    sprintf(list, "f32,f16,%s", codec_list);
    char *codecs[64];
    size_t ncod = 0;
    for (char *tok = strtok(list, ","); tok && ncod < 64; tok = strtok(NULL, ","))
        codecs[ncod++] = tok;
    size_t maxctx = 0;
    for (size_t i = 0; i < nctx; i++)
        maxctx = ctxs[i] > maxctx ? ctxs[i] : maxctx;
    size_t HD = H * d;
    float *K = malloc(maxctx * HD * sizeof(float)), *V = malloc(maxctx * HD * sizeof(float));
    float *q = malloc(QH * d * sizeof(float));
    ba_row *rows = calloc(nctx * ncod, sizeof *rows);
    if (!K || !V || !q || !rows) {
        fprintf(stderr, "kvq bench attend: out of memory\n");
        return 1;
    }
    uint64_t s = 42;
    for (size_t i = 0; i < maxctx * HD; i++) {
        size_t c = i % d;
        K[i] = ba_gauss(&s) * (c == 5 || c == 77 ? 8.0f : 1.0f) + (c == 6 ? 4.0f : 0.0f);
        V[i] = ba_gauss(&s);
    }
    for (size_t i = 0; i < QH * d; i++)
        q[i] = ba_gauss(&s);
    char cpu[128];
    kvqb_cpu_name(cpu, sizeof cpu);
    if (!json)
        printf("kvq bench attend: one decode step, 1 layer, %zu KV heads, %zu query heads, "
               "head_dim %zu, %zu thread(s), CPU %s, path %s\n\n  %-14s %8s %12s %10s %12s %14s\n",
               H, QH, d, threads, cpu, kvq_isa_name(kvq_cpu_best_isa()), "codec", "context",
               "step_us", "vs f32", "MiB read", "append ns/tok");
    int rc = 0;
    for (size_t ci = 0; ci < nctx; ci++) {
        double f32_us = 0;
        for (size_t k = 0; k < ncod; k++) {
            ba_row *r = &rows[ci * ncod + k];
            int e = ba_run(codecs[k], ctxs[ci], threads, K, V, q, H, QH, d, r);
            if (e == 2) {
                rc = 2;
                goto done;
            }
            if (e)
                rc = 1;
            if (k == 0)
                f32_us = r->step_us;
            r->ratio = f32_us > 0 ? r->step_us / f32_us : 0;
            if (!json && r->ok)
                printf("  %-14s %8zu %12.1f %9.3fx %12.2f %14.1f\n", r->codec, r->context,
                       r->step_us, r->ratio, r->bytes_read / 1048576.0, r->append_ns);
        }
        if (!json)
            printf("\n");
    }
    if (json) {
        printf("{\"threads\": %zu, \"kv_heads\": %zu, \"q_heads\": %zu, \"head_dim\": %zu, "
               "\"isa\": \"%s\", \"results\": [",
               threads, H, QH, d, kvq_isa_name(kvq_cpu_best_isa()));
        int first = 1;
        for (size_t i = 0; i < nctx * ncod; i++) {
            ba_row *r = &rows[i];
            if (!r->ok)
                continue;
            printf("%s{\"codec\": ", first ? "" : ", ");
            kvqb_json_str(stdout, r->codec);
            printf(", \"context\": %zu, \"step_us\": %.2f, \"ratio_vs_f32\": %.4f, \"bytes_read\": "
                   "%llu, \"append_ns_per_token\": %.1f}",
                   r->context, r->step_us, r->ratio, (unsigned long long)r->bytes_read, r->append_ns);
            first = 0;
        }
        printf("]}\n");
    }
done:
    free(K), free(V), free(q), free(rows), free(list);
    return rc;
}
