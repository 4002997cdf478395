/* model_eval.h - shared pieces of the model commands (eval, calibrate, sweep);
 * their options and inputs are in modelopts.h. */
#ifndef KVQ_MODEL_EVAL_H
#define KVQ_MODEL_EVAL_H

#include "kvq.h"
#include "cacheopts.h"
#include "modelopts.h"

typedef struct kvqt_eval_result {
    double nll, nll_f32, kl, top1, bits_per_value, total_bits_per_value, total_bits;
    size_t tokens, sequences, prefix_tokens;
} kvqt_eval_result;

kvq_cache *kvqt_make_cache(const kvq_model *m, const kvqt_cacheopts *o, const char *cmd);
/* Teacher-forces every line through a cache with options o and an f32 cache. */
int kvqt_eval_run(const kvq_model *m, const kvq_tokenizer *tok, char **lines, size_t nlines,
                  const kvqt_cacheopts *o, int progress, kvqt_eval_result *res);

/* Calibration (calibrate.c): sensitivities once, allocations per target. */
typedef struct kvqt_calib kvqt_calib;
typedef struct kvqt_calib_result {
    double target, bits, nominal_bits, kl, nll, nll_f32;
    size_t tokens;
} kvqt_calib_result;
kvqt_calib *kvqt_calib_prepare(const kvq_model *m, const kvq_tokenizer *tk, char **lines, size_t nl,
                               size_t max_tokens, size_t page, int progress, const char *only);
int kvqt_calib_allocate(kvqt_calib *cb, double target, const char *outp, kvqt_calib_result *res);
void kvqt_calib_free(kvqt_calib *cb);

#endif
