/*
 * model_cmds.c - `kvq generate` and `kvq eval`: the llama2.c-format model
 * with its attention running through a kvq cache. eval teacher-forces every
 * non-empty line of a text file through the compressed cache and, in the
 * same run, through an f32 cache, and reports NLL, perplexity, KL(f32 ||
 * compressed) of the next-token distributions, top-1 agreement and the
 * cache's bits per value.
 */
#include "kvq.h"
#include "benchlib.h"
#include "cacheopts.h"
#include "tool.h"
#include "model_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvq_cache *kvqt_make_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    kvq_model_cache_shape(m, &cfg);
    if (o->center_values && o->center_count != cfg.n_layers * cfg.n_kv_heads * cfg.head_dim) {
        fprintf(stderr, "kvq %s: the allocation's centre has %zu values, the model needs %zu\n",
                cmd, o->center_count, cfg.n_layers * cfg.n_kv_heads * cfg.head_dim);
        return NULL;
    }
    kvqt_cacheopts_apply(o, &cfg);
    char msg[256] = "";
    cfg.err_msg = msg;
    cfg.err_msg_size = sizeof msg;
    kvq_cache *c = NULL;
    kvq_status st = kvq_cache_create(&c, &cfg);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq %s: cache: %s (%s)\n", cmd, msg[0] ? msg : kvq_strerror(st),
                kvq_strerror(st));
        return NULL;
    }
    return c;
}

static void kvqt_softmax(const float *x, size_t n, double *p) {
    double mx = -1e300;
    for (size_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        p[i] = exp((double)x[i] - mx);
        s += p[i];
    }
    for (size_t i = 0; i < n; i++)
        p[i] /= s;
}

int kvqt_eval_run(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                  const kvqt_cacheopts *o, int progress, kvqt_eval_result *res) {
    kvq_model_info in;
    kvq_model_get_info(m, &in);
    memset(res, 0, sizeof *res);
    kvqt_cacheopts f32o;
    kvqt_cacheopts_init(&f32o);
    size_t V = in.vocab_size, S = in.seq_len;
    float *lg = malloc(S * V * sizeof(float)), *lr = malloc(S * V * sizeof(float));
    double *p = malloc(V * sizeof(double)), *pr = malloc(V * sizeof(double));
    int32_t *tk = NULL;
    size_t tcap = 0;
    double bits_num = 0, vals = 0;
    int rc = 0;
    for (size_t li = 0; li < nlines && rc == 0; li++) {
        size_t len = strlen(lines[li]);
        if (len + 3 > tcap) {
            tcap = len + 3;
            tk = realloc(tk, tcap * sizeof(int32_t));
        }
        size_t n;
        if (kvq_tokenizer_encode(tok, lines[li], 1, 0, tk, tcap, &n) != KVQ_OK) {
            rc = -1;
            break;
        }
        if (n > S)
            n = S;
        if (n < 2)
            continue;
        kvq_cache *c = kvqt_make_cache(m, o, "eval"), *r = kvqt_make_cache(m, &f32o, "eval");
        if (!c || !r) {
            kvq_cache_free(c);
            kvq_cache_free(r);
            rc = -1;
            break;
        }
        /* with a prefix store, the leading pages of an earlier sequence with
         * the same tokens are loaded instead of computed; only the rest runs
         * (and only its predictions are scored) */
        size_t n0 = 0;
        kvq_status st = KVQ_OK;
        if (o->prefix_store) {
            st = kvq_cache_prefix_get(c, o->prefix_store, tk, n, &n0);
            if (st != KVQ_OK)
                fprintf(stderr, "kvq eval: prefix store: %s\n", kvq_strerror(st));
        }
        if (st == KVQ_OK)
            st = kvq_model_forward(m, c, tk + n0, n - n0, (int32_t)n0, lg, S * V, 0);
        if (st == KVQ_OK)
            st = kvq_model_forward(m, r, tk, n, 0, lr, S * V, 0);
        if (st == KVQ_OK && o->prefix_store)
            st = kvq_cache_prefix_put(c, o->prefix_store, tk, n);
        res->prefix_tokens += n0;
        if (st != KVQ_OK) {
            fprintf(stderr, "kvq eval: forward: %s\n", kvq_strerror(st));
            kvq_cache_free(c);
            kvq_cache_free(r);
            rc = -1;
            break;
        }
        for (size_t t = n0; t + 1 < n; t++) {
            kvqt_softmax(lg + (t - n0) * V, V, p);
            kvqt_softmax(lr + t * V, V, pr);
            int32_t next = tk[t + 1];
            res->nll += -log(fmax(p[next], 1e-300));
            res->nll_f32 += -log(fmax(pr[next], 1e-300));
            double kl = 0;
            size_t am = 0, amr = 0;
            for (size_t i = 0; i < V; i++) {
                if (pr[i] > 0)
                    kl += pr[i] * log(pr[i] / fmax(p[i], 1e-300));
                if (p[i] > p[am])
                    am = i;
                if (pr[i] > pr[amr])
                    amr = i;
            }
            res->kl += kl;
            res->top1 += am == amr;
            res->tokens++;
        }
        kvq_stats s;
        kvq_cache_stats(c, -1, &s);
        bits_num += (double)s.payload_bytes * 8.0;
        vals += (double)s.tokens * in.n_kv_heads * in.head_dim * 2.0;
        res->total_bits += (double)s.stored_bytes * 8.0;
        res->sequences++;
        kvq_cache_free(c);
        kvq_cache_free(r);
        if (progress) {
            int w = 30, done = (int)((li + 1) * (size_t)w / nlines);
            fprintf(stderr, "\r[%.*s%*s] %zu/%zu", done, "##############################", w - done,
                    "", li + 1, nlines);
        }
    }
    if (progress)
        fprintf(stderr, "\r%60s\r", "");
    if (res->tokens) {
        res->nll /= (double)res->tokens;
        res->nll_f32 /= (double)res->tokens;
        res->kl /= (double)res->tokens;
        res->top1 /= (double)res->tokens;
    }
    res->bits_per_value = vals > 0 ? bits_num / vals : 0;
    res->total_bits_per_value = vals > 0 ? res->total_bits / vals : 0;
    free(lg), free(lr), free(p), free(pr), free(tk);
    return rc;
}

static void kvqt_model_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "generate"))
        fprintf(f, "usage: kvq generate --model M --tokenizer T [--prompt TEXT] [--steps N]\n"
                   "                    [--temperature F] [--seed N] [cache options]\n");
    else
        fprintf(f, "usage: kvq eval --model M --tokenizer T --text FILE [--json] [cache options]\n");
    kvqt_cacheopts_usage(f);
}

/* The start of generate and eval: parses the command line (the model
 * options, the cache options into o, initialised here, and the command's
 * own opts) and opens the model session. 0, or the exit code (2 for a usage
 * error, 1 when the model, tokenizer or text fails) with a message printed;
 * ms is open only on 0. */
static int kvqt_model_cmd_start(int argc, char **argv, const char *cmd, const kvqt_opt *opts,
                                size_t nopts, kvqt_cacheopts *o, kvqt_model_session *ms) {
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, strcmp(cmd, "generate") != 0);
    kvqt_cacheopts_init(o);
    int r = kvqt_model_args(argc, argv, cmd, &mo, o, opts, nopts);
    if (r == KVQT_ARGS_BAD_VALUE)
        return 2;
    if (r || !kvqt_modelopts_complete(&mo)) {
        kvqt_model_usage(stderr, cmd);
        return 2;
    }
    return kvqt_model_session_open(ms, &mo, 0, cmd, "") ? 1 : 0;
}

int kvq_tool_generate(int argc, char **argv) {
    const char *prompt = "";
    size_t steps = 256;
    double temp = 1.0;
    unsigned long long seed = 0;
    const kvqt_opt opts[] = {{"--prompt", KVQT_OPT_STR, &prompt},
                             {"--steps", KVQT_OPT_SIZE, &steps},
                             {"--temperature", KVQT_OPT_DOUBLE, &temp},
                             {"--seed", KVQT_OPT_ULL, &seed}};
    kvqt_cacheopts o;
    kvqt_model_session ms;
    int rc = kvqt_model_cmd_start(argc, argv, "generate", opts, KVQT_NOPTS(opts), &o, &ms);
    if (rc)
        return rc;
    kvq_model_info in;
    kvq_model_get_info(ms.model, &in);
    kvq_cache *c = kvqt_make_cache(ms.model, &o, "generate");
    if (!c) {
        kvqt_model_session_close(&ms);
        return 2;
    }
    size_t plen = strlen(prompt), n;
    int32_t *tk = malloc((plen + 3 + in.seq_len) * sizeof(int32_t));
    kvq_tokenizer_encode(ms.tok, prompt, 1, 0, tk, plen + 3, &n);
    if (steps > in.seq_len)
        steps = in.seq_len;
    float *lg = malloc(in.vocab_size * sizeof(float));
    double *p = malloc(in.vocab_size * sizeof(double));
    uint64_t rs = seed ? seed : 0x2545f4914f6cdd1dull;
    double t0 = kvqb_now();
    size_t produced = 0;
    int32_t prev = tk[0];
    /* feed the prompt (all but its last token) in one prefill; leading pages
     * found in the prefix store are loaded instead of computed */
    kvq_status st = KVQ_OK;
    size_t n0 = 0;
    if (o.prefix_store && n > 1) {
        st = kvq_cache_prefix_get(c, o.prefix_store, tk, n - 1, &n0);
        if (st != KVQ_OK)
            fprintf(stderr, "kvq generate: prefix store: %s\n", kvq_strerror(st));
    }
    if (st == KVQ_OK && n - 1 > n0)
        st = kvq_model_forward(ms.model, c, tk + n0, n - 1 - n0, (int32_t)n0, NULL, 0, 0);
    if (st == KVQ_OK && o.prefix_store && n > 1)
        st = kvq_cache_prefix_put(c, o.prefix_store, tk, n - 1);
    if (o.prefix_store)
        fprintf(stderr, "prefix store: %zu of %zu prompt tokens loaded\n", n0, n ? n - 1 : 0);
    size_t pos = n - 1;
    int32_t cur = tk[n - 1];
    char buf[8];
    for (size_t i = 1; i < n; i++) {
        fputs(kvq_tokenizer_piece(ms.tok, tk[i - 1], tk[i], buf), stdout);
        prev = tk[i];
    }
    while (st == KVQ_OK && pos < steps) {
        st = kvq_model_forward(ms.model, c, &cur, 1, (int32_t)pos, lg, in.vocab_size, 1);
        if (st != KVQ_OK)
            break;
        int32_t next;
        if (temp <= 0) {
            next = 0;
            for (size_t i = 1; i < in.vocab_size; i++)
                if (lg[i] > lg[next])
                    next = (int32_t)i;
        } else {
            double mx = -1e300, s = 0;
            for (size_t i = 0; i < in.vocab_size; i++)
                mx = lg[i] > mx ? lg[i] : mx;
            for (size_t i = 0; i < in.vocab_size; i++) {
                p[i] = exp((lg[i] - mx) / temp);
                s += p[i];
            }
            rs ^= rs >> 12, rs ^= rs << 25, rs ^= rs >> 27;
            double u = (double)((rs * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53 * s, acc = 0;
            next = (int32_t)in.vocab_size - 1;
            for (size_t i = 0; i < in.vocab_size; i++) {
                acc += p[i];
                if (u < acc) {
                    next = (int32_t)i;
                    break;
                }
            }
        }
        pos++;
        produced++;
        if (next == 1)
            break;
        fputs(kvq_tokenizer_piece(ms.tok, cur, next, buf), stdout);
        fflush(stdout);
        prev = cur;
        cur = next;
    }
    (void)prev;
    printf("\n");
    double el = kvqb_now() - t0;
    if (st != KVQ_OK)
        fprintf(stderr, "kvq generate: %s\n", kvq_strerror(st));
    kvq_stats s;
    kvq_cache_stats(c, -1, &s);
    fprintf(stderr, "achieved tok/s: %.1f (%zu tokens)\n", el > 0 ? produced / el : 0.0, produced);
    size_t jl;
    kvq_cache_stats_json(c, NULL, 0, &jl);
    char *js = malloc(jl + 1);
    kvq_cache_stats_json(c, js, jl + 1, &jl);
    fprintf(stderr, "cache stats: %s\n", js);
    free(js), free(tk), free(lg), free(p);
    kvq_cache_free(c);
    kvqt_model_session_close(&ms);
    kvqt_cacheopts_free(&o);
    return st == KVQ_OK ? 0 : 1;
}

int kvq_tool_eval(int argc, char **argv) {
    int json = 0;
    const kvqt_opt opts[] = {{"--json", KVQT_OPT_FLAG, &json}};
    kvqt_cacheopts o;
    kvqt_model_session ms;
    int rc = kvqt_model_cmd_start(argc, argv, "eval", opts, KVQT_NOPTS(opts), &o, &ms);
    if (rc)
        return rc;
    kvqt_eval_result r;
    rc = kvqt_eval_run(ms.model, ms.tok, ms.lines, ms.nlines, &o, isatty(2), &r);
    if (rc == 0) {
        if (json) {
            printf("{\"nll_f32\": %.6f, \"nll\": %.6f, \"ppl_f32\": %.6f, \"ppl\": %.6f, \"kl\": %.6g, "
                   "\"top1_agree\": %.6f, \"bits_per_value\": %.4f, \"tokens\": %zu",
                   r.nll_f32, r.nll, exp(r.nll_f32), exp(r.nll), r.kl, r.top1, r.bits_per_value,
                   r.tokens);
            if (o.prefix_store)
                printf(", \"prefix_tokens\": %zu", r.prefix_tokens);
            printf("}\n");
        } else {
            char desc[256];
            kvqt_cacheopts_describe(&o, desc, sizeof desc);
            printf("kvq eval: %zu sequences, %zu predicted tokens; cache %s\n", r.sequences,
                   r.tokens, desc);
            printf("  %-28s %12s %12s\n", "", "f32 cache", "kvq cache");
            printf("  %-28s %12.5f %12.5f\n", "mean NLL (nats)", r.nll_f32, r.nll);
            printf("  %-28s %12.4f %12.4f\n", "perplexity", exp(r.nll_f32), exp(r.nll));
            printf("  %-28s %12s %+11.3f%%\n", "delta NLL", "", 100.0 * (r.nll - r.nll_f32) / r.nll_f32);
            printf("  %-28s %12s %12.5f\n", "KL(f32 || kvq)", "", r.kl);
            printf("  %-28s %12s %12.4f\n", "top-1 agreement", "", r.top1);
            printf("  %-28s %12.2f %12.3f\n", "bits per value (payload)", 32.0, r.bits_per_value);
            printf("  %-28s %12s %12.3f\n", "bits per value (all bytes)", "", r.total_bits_per_value);
        }
    }
    kvqt_model_session_close(&ms);
    kvqt_cacheopts_free(&o);
    return rc ? 1 : 0;
}
