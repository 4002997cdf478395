/* model_eval.h - shared pieces of the model commands (eval, calibrate, sweep);
 * their options and inputs are in modelopts.h. */
#ifndef KVQ_MODEL_EVAL_H
#define KVQ_MODEL_EVAL_H

#include "kvq.h"
#include "cacheopts.h"
#include "modelopts.h"

/* The figures of an eval: means over predicted tokens unless said otherwise
 * (stderr: the standard error of the mean, tokens taken as independent). */
typedef struct kvqt_eval_result {
    double nll, nll_f32, kl, top1, bits_per_value, total_bits_per_value, total_bits;
    size_t tokens, sequences, prefix_tokens;
    double delta_nll, delta_nll_stderr; /* nll - nll_f32, per token */
    double kl_stderr, kl_median, kl_p99, kl_max;
    double dp_top_mean_abs;           /* |p(f32 top token) - p_f32(it)| */
    double asymptotic_bits_per_value; /* kvq_stats, mean over sequences */
    double fixed_bytes_per_sequence;  /* kvq_stats.fixed_bytes at each sequence's end, mean */
    double tokens_kept_mean;          /* tokens of layer 0 each prediction's query attended to */
    size_t prefill;       /* the longest prefill chunk run: --prefill, or less when every
                             sequence is shorter (each is prefilled at most whole) */
    size_t prefill_whole; /* sequences no longer than --prefill: prefilled whole, not decoded */
} kvqt_eval_result;

/* How eval runs beside the cache options. */
typedef struct kvqt_evalopts {
    size_t prefill;          /* the first N tokens of a sequence in one chunk; 0: none */
    const char *save_logits; /* write the f32 reference here (evalref.h) */
    const char *base_logits; /* read it from here instead of running the f32 cache */
    const char *model_path;  /* the model's file, hashed with either of the two */
    const char *cmd;         /* for messages ("eval") */
} kvqt_evalopts;
void kvqt_evalopts_init(kvqt_evalopts *eo);

/* A cache for the model with options o; NULL with a message on error. */
kvq_cache *kvqt_make_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd);
/* Checks, before a command works, that the cache options make a cache for
 * this model (--budget-ratio at the model's whole context): the exit code,
 * 0, 2 with the option to blame named when the cache refuses them ("--v-codec
 * int4:g=32: group g=32 does not divide head_dim 8", with name_option),
 * or 1 when memory runs out. */
int kvqt_check_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd,
                     int name_option);
/* Teacher-forces every line through a cache with options o, as inference
 * runs: the first eo->prefill tokens of a line in one forward call, then one
 * token per call, each prediction's query seeing the cache as it was when
 * that token was decoded; the reference is one prefill through an f32 cache
 * (or eo->base_logits). With o->budget_ratio R the budget of a line is
 * ceil(R * N) tokens, N its prefill length (or its length without one).
 * 0, or -1 with a message printed. */
int kvqt_eval_run_opts(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                       const kvqt_cacheopts *o, const kvqt_evalopts *eo, int progress,
                       kvqt_eval_result *res);
/* The same with kvqt_evalopts_init's defaults (decode from the first token). */
int kvqt_eval_run(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                  const kvqt_cacheopts *o, int progress, kvqt_eval_result *res);

#endif
