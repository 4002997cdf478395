/*
 * cacheopts.h - the cache options shared by the model commands (generate,
 * eval, calibrate, sweep): --k-codec --v-codec --k-layout --k-prerope
 * --k-center --alloc FILE --policy --budget --budget-ratio --window --sinks
 * --page --recent --threads.
 */
#ifndef KVQ_CACHEOPTS_H
#define KVQ_CACHEOPTS_H

#include "kvq.h"

#include <stdio.h>

#define KVQT_MAX_OVR 256

typedef struct kvqt_cacheopts {
    char k_codec[96], v_codec[96];
    int k_layout_channel, k_prerope, k_center;
    kvq_policy policy;
    size_t budget, window, sinks, page, recent, threads;
    kvq_isa isa; /* --isa: the cache's kernel path (KVQ_ISA_AUTO) */
    double budget_ratio;
    const char *alloc_path;
    /* per-(layer, head) overrides, from --alloc */
    kvq_codec_override ovr[KVQT_MAX_OVR];
    char ovr_codec[KVQT_MAX_OVR][96];
    unsigned char *ovr_state[KVQT_MAX_OVR]; /* owned state blobs (nuq tables) */
    size_t n_ovr;
    float *center_values; /* from --alloc, or NULL */
    const char *prefix_url;   /* --prefix-store URL (argv string), or NULL */
    kvq_store *prefix_store;  /* opened by kvqt_cacheopts_open_store, or NULL */
    size_t center_count;
    int codec_set, window_set, sinks_set; /* given on the command line */
} kvqt_cacheopts;

void kvqt_cacheopts_init(kvqt_cacheopts *o);
/* 1 when argv[*i] was a cache option (consumes its value), 0 when it is not
 * one, -1 on a bad or missing value (message printed). Numbers are strict
 * (cliargs.h): --budget 1..2^30, --budget-ratio (0, 1], --window, --sinks
 * and --recent 0..2^30, --page 1..4096, --threads 1..256. */
int kvqt_cacheopts_parse(kvqt_cacheopts *o, int argc, char **argv, int *i, const char *cmd);
/* The options as a whole, after parsing: --budget and --budget-ratio
 * exclude each other; a budget, --window or --sinks needs a policy, and a
 * policy a budget; --k-center needs the centre of an --alloc file. 0, or
 * -1 with the one rule that is broken printed. */
int kvqt_cacheopts_check(const kvqt_cacheopts *o, const char *cmd);
/* Opens --prefix-store (after every argument was checked, so that a usage
 * error creates nothing): 0, or -1 with a message (a failure, exit 1). */
int kvqt_cacheopts_open_store(kvqt_cacheopts *o, const char *cmd);
/* Fills the codec/policy fields of cfg (shape set by the caller). */
void kvqt_cacheopts_apply(const kvqt_cacheopts *o, kvq_cache_config *cfg);
void kvqt_cacheopts_usage(FILE *f);
void kvqt_cacheopts_free(kvqt_cacheopts *o);
/* A one-line description of the cache options, e.g. "K int8, V tq3 ...". */
void kvqt_cacheopts_describe(const kvqt_cacheopts *o, char *buf, size_t size);

#endif
