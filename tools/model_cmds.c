/*
 * model_cmds.c - `kvq generate` and `kvq eval`: the llama2.c-format model
 * with its attention running through a kvq cache. eval teacher-forces the
 * selected lines of a text through the compressed cache as inference runs
 * and compares each prediction with an f32 reference (model_eval.c); this
 * file parses the commands and prints the figures.
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

static void kvqt_model_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "generate"))
        fprintf(f, "usage: kvq generate --model M --tokenizer T [--prompt TEXT] [--steps N]\n"
                   "                    [--temperature F] [--seed N] [cache options]\n");
    else
        fprintf(f, "usage: kvq eval --model M --tokenizer T --text FILE [--skip N] [--max-lines N]\n"
                   "                [--prefill N] [--save-logits FILE | --base-logits FILE] [--json]\n"
                   "                [cache options]\n"
                   "  decodes token by token after an optional prefill of N tokens per line;\n"
                   "  --budget-ratio R keeps ceil(R * N) tokens, N the prefill or line length\n");
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
    return kvqt_model_session_open(ms, &mo, 1, cmd, "") ? 1 : 0;
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

static void kvqt_eval_print_json(const kvqt_eval_result *r, const kvqt_cacheopts *o) {
    printf("{\"nll_f32\": %.6f, \"nll\": %.6f, \"ppl_f32\": %.6f, \"ppl\": %.6f, \"kl\": %.6g, "
           "\"top1_agree\": %.6f, \"bits_per_value\": %.4f, \"tokens\": %zu",
           r->nll_f32, r->nll, exp(r->nll_f32), exp(r->nll), r->kl, r->top1, r->bits_per_value,
           r->tokens);
    printf(", \"delta_nll\": %.6g, \"delta_nll_stderr\": %.6g, \"kl_stderr\": %.6g, "
           "\"kl_median\": %.6g, \"kl_p99\": %.6g, \"kl_max\": %.6g, \"dp_top_mean_abs\": %.6g",
           r->delta_nll, r->delta_nll_stderr, r->kl_stderr, r->kl_median, r->kl_p99, r->kl_max,
           r->dp_top_mean_abs);
    printf(", \"asymptotic_bits_per_value\": %.4f, \"fixed_bytes_per_sequence\": %.1f, "
           "\"tokens_kept_mean\": %.3f, \"sequences\": %zu, \"prefill\": %zu",
           r->asymptotic_bits_per_value, r->fixed_bytes_per_sequence, r->tokens_kept_mean,
           r->sequences, r->prefill);
    if (o->prefix_store)
        printf(", \"prefix_tokens\": %zu", r->prefix_tokens);
    printf("}\n");
}

static void kvqt_eval_print_text(const kvqt_eval_result *r, const kvqt_cacheopts *o) {
    char desc[256];
    kvqt_cacheopts_describe(o, desc, sizeof desc);
    printf("kvq eval: %zu sequences, %zu predicted tokens, ", r->sequences, r->tokens);
    if (r->prefill)
        printf("prefill %zu then decoding; cache %s\n", r->prefill, desc);
    else
        printf("decoding token by token; cache %s\n", desc);
    static const char *policies[] = {"none", "window", "fifo", "utility"};
    if (o->policy != KVQ_POLICY_NONE && (size_t)o->policy < 4) {
        printf("  policy %s, budget ", policies[o->policy]);
        if (o->budget_ratio > 0)
            printf("ceil(%g x the %s length)", o->budget_ratio, r->prefill ? "prefill" : "sequence");
        else
            printf("%zu tokens", o->budget);
        printf(", sinks %zu, protected window %zu\n", o->sinks, o->window);
    }
    const char *row = "  %-30s %12s %12s\n";
    printf(row, "", "f32 cache", "kvq cache");
    printf("  %-30s %12.5f %12.5f\n", "mean NLL (nats)", r->nll_f32, r->nll);
    printf("  %-30s %12.4f %12.4f\n", "perplexity", exp(r->nll_f32), exp(r->nll));
    printf("  %-30s %12s %+12.5f +- %.5f (%+.3f%%)\n", "delta NLL (nats)", "", r->delta_nll,
           r->delta_nll_stderr, r->nll_f32 > 0 ? 100.0 * r->delta_nll / r->nll_f32 : 0.0);
    printf("  %-30s %12s %12.5f +- %.5f\n", "KL(f32 || kvq) mean", "", r->kl, r->kl_stderr);
    printf("  %-30s %12s %12.5f %12.5f %12.5f\n", "KL median, p99, max", "", r->kl_median,
           r->kl_p99, r->kl_max);
    printf("  %-30s %12s %12.4f\n", "top-1 agreement", "", r->top1);
    printf("  %-30s %12s %12.5f\n", "mean |dp| of the f32 top token", "", r->dp_top_mean_abs);
    printf("  %-30s %12.2f %12.3f\n", "bits per value (payload)", 32.0, r->bits_per_value);
    printf("  %-30s %12s %12.3f\n", "bits per value (asymptotic)", "",
           r->asymptotic_bits_per_value);
    printf("  %-30s %12s %12.0f\n", "fixed bytes per sequence", "", r->fixed_bytes_per_sequence);
    printf("  %-30s %12s %12.3f\n", "bits per value (all bytes)", "", r->total_bits_per_value);
    printf("  %-30s %12s %12.1f\n", "tokens kept (layer 0, mean)", "", r->tokens_kept_mean);
    if (o->prefix_store)
        printf("  %-30s %12s %12zu\n", "tokens loaded from the prefix store", "", r->prefix_tokens);
}

int kvq_tool_eval(int argc, char **argv) {
    int json = 0;
    kvqt_evalopts eo;
    kvqt_evalopts_init(&eo);
    const kvqt_opt opts[] = {{"--json", KVQT_OPT_FLAG, &json},
                             {"--prefill", KVQT_OPT_SIZE, &eo.prefill},
                             {"--save-logits", KVQT_OPT_STR, &eo.save_logits},
                             {"--base-logits", KVQT_OPT_STR, &eo.base_logits}};
    kvqt_cacheopts o;
    kvqt_model_session ms;
    int rc = kvqt_model_cmd_start(argc, argv, "eval", opts, KVQT_NOPTS(opts), &o, &ms);
    if (rc)
        return rc;
    if (eo.save_logits && eo.base_logits) {
        fprintf(stderr, "kvq eval: --save-logits and --base-logits exclude each other\n");
        kvqt_model_session_close(&ms);
        kvqt_cacheopts_free(&o);
        return 2;
    }
    eo.model_path = ms.model_path;
    kvqt_eval_result r;
    rc = kvqt_eval_run_opts(ms.model, ms.tok, ms.lines, ms.nlines, &o, &eo, isatty(2), &r);
    if (rc == 0 && json)
        kvqt_eval_print_json(&r, &o);
    else if (rc == 0)
        kvqt_eval_print_text(&r, &o);
    kvqt_model_session_close(&ms);
    kvqt_cacheopts_free(&o);
    return rc ? 1 : 0;
}
