/*
 * calibrate.h - per-head mixed precision chosen from measurements on a
 * calibration text (calibrate.c): the sensitivities are measured once,
 * then an allocation can be solved for any number of targets (kvq
 * calibrate solves one, kvq sweep several).
 */
#ifndef KVQ_CALIBRATE_H
#define KVQ_CALIBRATE_H

#include "kvq.h"

#include <stddef.h>

typedef struct kvqt_calib kvqt_calib;

typedef struct kvqt_calib_opts {
    size_t page;        /* cache page of the allocation (32) */
    size_t recent;      /* f16 recent window of the allocation (0) */
    size_t sens_tokens; /* predicted tokens of the sensitivity runs (640) */
    size_t stride;      /* score every stride-th of them (3) */
    size_t jobs;        /* measuring threads (1) */
    const char *only;   /* comma-separated candidate list, or NULL for all */
    int measure_all;    /* measure every candidate of 4 bits and below, not one per family */
    int progress;       /* a progress line on stderr */
    int verbose;        /* every unit's candidates and their KL on stderr */
    const char *cmd;    /* for messages ("calibrate" when NULL) */
} kvqt_calib_opts;
void kvqt_calib_opts_init(kvqt_calib_opts *o);

/* What an allocation measured on the whole calibration text (decoding
 * token by token, as kvq eval does). */
typedef struct kvqt_calib_report {
    double target;
    double asymptotic_bits;  /* kvq_stats.asymptotic_bits_per_value of the allocation */
    double fixed_bytes;      /* kvq_stats.fixed_bytes at the end of a sequence, mean */
    double bits;             /* payload bits per stored value, mean over the text */
    double kl, nll, nll_f32, top1;
    double kl_estimate;      /* the sum of the chosen units' KL alone */
    size_t tokens, sens_tokens;
    double seconds_measure;  /* the sensitivity runs (once per kvqt_calib) */
} kvqt_calib_report;

/* Checks a --codecs list before any work: every name is a candidate and
 * keys and values keep one each. 0, or -1 with the message printed. */
int kvqt_calib_check_codecs(const char *only, const char *cmd);
/* The asymptotic bits per value of the cheapest allocation o allows for
 * m (each unit's cheapest candidate at o's page; sizes do not depend on
 * the data, so nothing is measured); -1 when no candidate works. */
double kvqt_calib_cheapest(const kvq_model *m, const kvqt_calib_opts *o);

/* Encodes the lines, runs the f32 reference, estimates the key centres,
 * fits the candidates and measures every unit's sensitivities. NULL with a
 * message printed on error. */
kvqt_calib *kvqt_calib_new(const kvq_model *m, const kvq_tokenizer *tok, char **lines,
                           size_t nlines, const kvqt_calib_opts *o);
/* Allocates for an asymptotic target (bits per value), verifies it on the
 * calibration text and writes the allocation file to out. 0; 2 when the
 * target is below the cheapest allocation; 1 on other errors (messages
 * printed). */
int kvqt_calib_solve(kvqt_calib *cb, double target, const char *out, kvqt_calib_report *r);
/* The key centre estimated on the calibration text, [layers][kv heads]
 * [head_dim] (*n values), owned by cb. */
const float *kvqt_calib_center(const kvqt_calib *cb, size_t *n);
/* Prints the chosen allocation as a table (after a solve). */
void kvqt_calib_print(const kvqt_calib *cb);
void kvqt_calib_free(kvqt_calib *cb);

#endif
