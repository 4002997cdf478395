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
#include "cliargs.h"
#include "tool.h"
#include "model_eval.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void kvqt_model_usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "generate"))
        fprintf(f,
                "usage: kvq generate --model M --tokenizer T [--prompt TEXT] [-n N | --steps N]\n"
                "                    [--temperature F] [--seed N] [--stats]\n"
                "                    [--stats-json FILE|-] [cache options]\n"
                "  text from a llama2.c model whose attention runs through a kvq cache; the\n"
                "  text on stdout, a summary (and with --stats the cache's statistics as\n"
                "  JSON) on stderr\n"
                "  --prompt TEXT         the start of the text (\"\": from the BOS token alone)\n"
                "  -n, --n-predict N     generate N tokens after the prompt, 0..2^30 (256)\n"
                "  --steps N             llama2.c's run -n: N positions in all, the prompt's\n"
                "                        tokens (BOS included) counted, 1..2^30\n"
                "                        generation stops early at the end-of-text token, or\n"
                "                        when the model's context (seq_len) is full\n"
                "  --temperature F       0..100, 0 = greedy (1)\n"
                "  --seed N              the sampling seed, 0..2^64-1 (0: a fixed default)\n"
                "  --stats               the cache's statistics as JSON on stderr at the end,\n"
                "                        behind \"cache stats: \"\n"
                "  --stats-json FILE     the same JSON alone in FILE (written whole, checked\n"
                "                        writable before the run); - : on stdout, as its last\n"
                "                        line, after the text\n");
    else
        fprintf(f,
                "usage: kvq eval --model M --tokenizer T --text FILE [--skip N] [--max-lines N]\n"
                "                [--prefill N] [--save-logits FILE | --base-logits FILE] [--json]\n"
                "                [cache options]\n"
                "  decodes each non-empty line of FILE (UTF-8 text) token by token through the\n"
                "  cache and compares every prediction with an f32 reference: NLL, KL, top-1\n"
                "  --skip N              leave out the first N non-empty lines (0)\n"
                "  --max-lines N         use at most N lines after them, 1..2^30 (all)\n"
                "  --prefill N           the first N tokens of a line in one chunk, then\n"
                "                        decoding (0: decode from the first token)\n"
                "  --save-logits FILE    store the f32 reference; --base-logits FILE reuses it\n"
                "                        (checked against the model and the text)\n"
                "  --json                one JSON object on stdout instead of the table\n"
                "  --budget-ratio R keeps ceil(R * N) tokens, N the prefill or line length\n");
    kvqt_cacheopts_usage(f);
    fprintf(f, "exit status: 0 ok, 1 failure (files, model, run), 2 usage error\n");
}

/* The start of generate and eval: parses the command line (the model
 * options, the cache options into o, initialised here, and the command's
 * own opts), opens the model session and checks the cache options against
 * the model. 0 with ms open, or -1 with *exit_code set (0 after --help, 2
 * for a usage error, 1 when the model, tokenizer or text fails) and the
 * message printed. check, when not NULL, runs after parsing, before any
 * file is read: a usage error of the command's own options. */
static int kvqt_model_cmd_start(int argc, char **argv, const char *cmd, const kvqt_opt *opts,
                                size_t nopts, int (*check)(void *ctx), void *ctx,
                                kvqt_cacheopts *o, kvqt_model_session *ms, int *exit_code) {
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, strcmp(cmd, "generate") != 0);
    kvqt_cacheopts_init(o);
    int r = kvqt_model_args(argc, argv, cmd, &mo, o, opts, nopts);
    *exit_code = KVQT_EXIT_USAGE;
    if (r == KVQT_ARGS_HELP) {
        kvqt_model_usage(stdout, cmd);
        *exit_code = KVQT_EXIT_OK;
    }
    if (r != KVQT_ARGS_OK || kvqt_modelopts_require(&mo, cmd) != 0 || (check && check(ctx))) {
        kvqt_cacheopts_free(o);
        return -1;
    }
    int al = kvqt_cacheopts_load_alloc(o, cmd);
    if (al == -2)
        kvqt_usage_hint(cmd);
    *exit_code = al == -2 ? KVQT_EXIT_USAGE : KVQT_EXIT_FAIL;
    if (al != 0 || kvqt_model_session_open(ms, &mo, 1, cmd) != 0) {
        kvqt_cacheopts_free(o);
        return -1;
    }
    int rc = kvqt_check_cache(ms->model, o, cmd, 1);
    if (rc == 0 && kvqt_cacheopts_open_store(o, cmd) != 0)
        rc = KVQT_EXIT_FAIL;
    if (rc) {
        *exit_code = rc;
        kvqt_model_session_close(ms);
        kvqt_cacheopts_free(o);
        return -1;
    }
    return 0;
}

typedef struct gen_args {
    size_t n_predict, steps; /* SIZE_MAX: not given */
    const char *stats_json;  /* --stats-json FILE, "-" for stdout, or NULL */
} gen_args;

static int gen_check(void *ctx) {
    const gen_args *g = (const gen_args *)ctx;
    if (g->n_predict != SIZE_MAX && g->steps != SIZE_MAX)
        return kvqt_usage_error("generate", "give -n/--n-predict (tokens generated) or --steps "
                                            "(positions, the prompt's included), not both");
    if (g->stats_json && !*g->stats_json)
        return kvqt_usage_error("generate", "--stats-json needs a file name, or - for stdout");
    return 0;
}

static int gen_write_json(FILE *f, void *ctx) {
    return fprintf(f, "%s\n", (const char *)ctx) < 0 ? -1 : 0;
}

/* The next token: argmax at temperature 0, else a sample of softmax(lg / temp). */
static int32_t gen_sample(const float *lg, size_t V, double temp, double *p, uint64_t *rs) {
    int32_t next = 0;
    if (temp <= 0) {
        for (size_t i = 1; i < V; i++)
            if (lg[i] > lg[next])
                next = (int32_t)i;
        return next;
    }
    double mx = -1e300, s = 0;
    for (size_t i = 0; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    for (size_t i = 0; i < V; i++) {
        p[i] = exp((lg[i] - mx) / temp);
        s += p[i];
    }
    *rs ^= *rs >> 12, *rs ^= *rs << 25, *rs ^= *rs >> 27;
    double u = (double)((*rs * 0x2545f4914f6cdd1dull) >> 11) * 0x1.0p-53 * s, acc = 0;
    next = (int32_t)V - 1;
    for (size_t i = 0; i < V; i++) {
        acc += p[i];
        if (u < acc) {
            next = (int32_t)i;
            break;
        }
    }
    return next;
}

int kvq_tool_generate(int argc, char **argv) {
    const char *prompt = "";
    gen_args g = {SIZE_MAX, SIZE_MAX, NULL};
    double temp = 1.0;
    unsigned long long seed = 0;
    int stats = 0;
    const kvqt_opt opts[] = {KVQT_STR("--prompt", &prompt),
                             KVQT_SIZE("-n", &g.n_predict, 0, KVQT_MAX_COUNT),
                             KVQT_SIZE("--n-predict", &g.n_predict, 0, KVQT_MAX_COUNT),
                             KVQT_SIZE("--steps", &g.steps, 1, KVQT_MAX_COUNT),
                             KVQT_DOUBLE("--temperature", &temp, 0, 100, 0),
                             KVQT_ULL("--seed", &seed, 0, ULLONG_MAX),
                             KVQT_FLAG("--stats", &stats),
                             KVQT_STR("--stats-json", &g.stats_json)};
    kvqt_cacheopts o;
    kvqt_model_session ms;
    int rc;
    if (kvqt_model_cmd_start(argc, argv, "generate", opts, KVQT_NOPTS(opts), gen_check, &g, &o,
                             &ms, &rc) != 0)
        return rc;
    int to_file = g.stats_json && strcmp(g.stats_json, "-") != 0;
    if (to_file && kvqt_check_output_file("generate", "--stats-json", g.stats_json) != 0) {
        kvqt_model_session_close(&ms);
        kvqt_cacheopts_free(&o);
        return KVQT_EXIT_FAIL;
    }
    kvq_model_info in;
    kvq_model_get_info(ms.model, &in);
    size_t plen = strlen(prompt), n = 0;
    int32_t *tk = malloc((plen + 3) * sizeof(int32_t));
    float *lg = malloc(in.vocab_size * sizeof(float));
    double *p = malloc(in.vocab_size * sizeof(double));
    kvq_cache *c = NULL;
    kvq_status st = tk && lg && p ? kvq_tokenizer_encode(ms.tok, prompt, 1, 0, tk, plen + 3, &n)
                                  : KVQ_ERR_NOMEM;
    rc = KVQT_EXIT_FAIL;
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq generate: --prompt: %s\n", kvq_strerror(st));
        goto done;
    }
    /* the prompt's last token is the first decode step's input: n positions
     * leave seq_len - (n - 1) tokens to generate */
    if (n > in.seq_len) {
        rc = kvqt_usage_error("generate", "the prompt is %zu tokens (BOS included), longer than "
                                          "the model's context of %zu tokens", n, in.seq_len);
        goto done;
    }
    size_t want = 256;
    if (g.steps != SIZE_MAX) {
        if (g.steps < n) {
            rc = kvqt_usage_error("generate", "--steps %zu counts positions, the prompt's %zu "
                                              "tokens (BOS included) among them: nothing would be "
                                              "generated (-n N counts generated tokens)",
                                  g.steps, n);
            goto done;
        }
        want = g.steps - (n - 1);
    } else if (g.n_predict != SIZE_MAX) {
        want = g.n_predict;
    }
    if (!(c = kvqt_make_cache(ms.model, &o, "generate")))
        goto done;
    uint64_t rs = seed ? seed : 0x2545f4914f6cdd1dull;
    double t0 = kvqb_now();
    size_t produced = 0, n0 = 0;
    /* feed the prompt (all but its last token) in one prefill; leading pages
     * found in the prefix store are loaded instead of computed */
    if (o.prefix_store && n > 1) {
        st = kvq_cache_prefix_get(c, o.prefix_store, tk, n - 1, &n0);
        if (st != KVQ_OK)
            fprintf(stderr, "kvq generate: --prefix-store: %s\n", kvq_strerror(st));
    }
    if (st == KVQ_OK && n - 1 > n0)
        st = kvq_model_forward(ms.model, c, tk + n0, n - 1 - n0, (int32_t)n0, NULL, 0, 0);
    if (st == KVQ_OK && o.prefix_store && n > 1)
        st = kvq_cache_prefix_put(c, o.prefix_store, tk, n - 1);
    if (o.prefix_store)
        fprintf(stderr, "prefix store: %zu of %zu prompt tokens loaded\n", n0, n - 1);
    char buf[8];
    for (size_t i = 1; i < n; i++)
        fputs(kvq_tokenizer_piece(ms.tok, tk[i - 1], tk[i], buf), stdout);
    size_t pos = n - 1;
    int32_t cur = tk[n - 1];
    int eos = 0;
    while (st == KVQ_OK && produced < want && pos < in.seq_len) {
        st = kvq_model_forward(ms.model, c, &cur, 1, (int32_t)pos, lg, in.vocab_size, 1);
        if (st != KVQ_OK)
            break;
        int32_t next = gen_sample(lg, in.vocab_size, temp, p, &rs);
        pos++;
        produced++;
        if (next == 1) { /* BOS: llama2.c's end of a story */
            eos = 1;
            break;
        }
        fputs(kvq_tokenizer_piece(ms.tok, cur, next, buf), stdout);
        fflush(stdout);
        cur = next;
    }
    printf("\n");
    /* the cache's statistics as one JSON object, read before stdout is
     * flushed so that --stats-json - is the text's next line */
    char *js = NULL;
    if (stats || g.stats_json) {
        size_t jl = 0;
        kvq_cache_stats_json(c, NULL, 0, &jl);
        js = malloc(jl + 1);
        if (js && kvq_cache_stats_json(c, js, jl + 1, &jl) != KVQ_OK) {
            free(js);
            js = NULL;
        }
    }
    if (js && g.stats_json && !to_file)
        printf("%s\n", js);
    fflush(stdout); /* the text is out before anything on stderr */
    double el = kvqb_now() - t0;
    if (st != KVQ_OK)
        fprintf(stderr, "kvq generate: %s\n", kvq_strerror(st));
    fprintf(stderr, "achieved tok/s: %.1f (%zu tokens generated after a prompt of %zu token%s, BOS "
                    "included)%s\n",
            el > 0 ? (double)produced / el : 0.0, produced, n, n == 1 ? "" : "s",
            eos                                  ? "; stopped at the end-of-text token"
            : produced < want && st == KVQ_OK ? "; stopped: the model's context is full"
                                                 : "");
    if (js && stats)
        fprintf(stderr, "cache stats: %s\n", js);
    rc = st == KVQ_OK ? KVQT_EXIT_OK : KVQT_EXIT_FAIL;
    if ((stats || g.stats_json) && !js) {
        fprintf(stderr, "kvq generate: the cache's statistics: out of memory\n");
        rc = KVQT_EXIT_FAIL;
    } else if (to_file && kvqt_write_file("generate", g.stats_json, gen_write_json, js) != 0) {
        rc = KVQT_EXIT_FAIL;
    }
    free(js);
done:
    free(tk), free(lg), free(p);
    kvq_cache_free(c);
    kvqt_model_session_close(&ms);
    kvqt_cacheopts_free(&o);
    return rc;
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
    char desc[512];
    kvqt_cacheopts_describe(o, desc, sizeof desc);
    printf("kvq eval: %zu sequences, %zu predicted tokens, ", r->sequences, r->tokens);
    if (r->prefill && r->prefill_whole == r->sequences)
        printf("prefill %zu: every sequence whole in one chunk, nothing decoded; cache %s\n",
               r->prefill, desc);
    else if (r->prefill && r->prefill_whole)
        printf("prefill %zu then decoding (%zu of the sequences no longer than that: prefilled "
               "whole); cache %s\n", r->prefill, r->prefill_whole, desc);
    else if (r->prefill)
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

static int eval_check(void *ctx) {
    const kvqt_evalopts *eo = (const kvqt_evalopts *)ctx;
    if (eo->save_logits && eo->base_logits)
        return kvqt_usage_error("eval", "--save-logits and --base-logits exclude each other");
    return 0;
}

int kvq_tool_eval(int argc, char **argv) {
    int json = 0;
    kvqt_evalopts eo;
    kvqt_evalopts_init(&eo);
    const kvqt_opt opts[] = {KVQT_FLAG("--json", &json),
                             KVQT_SIZE("--prefill", &eo.prefill, 0, KVQT_MAX_COUNT),
                             KVQT_STR("--save-logits", &eo.save_logits),
                             KVQT_STR("--base-logits", &eo.base_logits)};
    kvqt_cacheopts o;
    kvqt_model_session ms;
    int rc;
    if (kvqt_model_cmd_start(argc, argv, "eval", opts, KVQT_NOPTS(opts), eval_check, &eo, &o, &ms,
                             &rc) != 0)
        return rc;
    if ((eo.save_logits && kvqt_check_output_file("eval", "--save-logits", eo.save_logits) != 0) ||
        (eo.base_logits && kvqt_check_input("eval", "--base-logits", eo.base_logits) != 0)) {
        kvqt_model_session_close(&ms);
        kvqt_cacheopts_free(&o);
        return KVQT_EXIT_FAIL;
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
    return rc ? KVQT_EXIT_FAIL : KVQT_EXIT_OK;
}
