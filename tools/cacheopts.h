/*
 * cacheopts.h - the cache options shared by the model commands (generate,
 * eval, calibrate, sweep): --k-codec --v-codec --k-layout --k-prerope
 * --k-center --alloc FILE --policy --budget --budget-ratio --window --sinks
 * --page --recent --threads.
 *
 * --alloc FILE (kvq calibrate's output) sets the codecs: every head's K and
 * V codec, the key layout, pre-RoPE keys and the key centre, so --k-codec,
 * --v-codec and --k-layout beside it are a usage error; its page and recent
 * window are defaults that --page and --recent override. The file is read
 * after the whole command line is checked (kvqt_cacheopts_load_alloc).
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
    /* given on the command line */
    int codec_set, window_set, sinks_set, k_codec_set, v_codec_set, k_layout_set, page_set,
        recent_set, k_center_set;
} kvqt_cacheopts;

void kvqt_cacheopts_init(kvqt_cacheopts *o);
/* 1 when argv[*i] was a cache option (consumes its value), 0 when it is not
 * one, -1 on a bad or missing value (message printed). Numbers are strict
 * (cliargs.h): --budget 1..2^30, --budget-ratio (0, 1], --window, --sinks
 * and --recent 0..2^30, --page 1..4096, --threads 1..256. */
int kvqt_cacheopts_parse(kvqt_cacheopts *o, int argc, char **argv, int *i, const char *cmd);
/* The options as a whole, after parsing: --budget and --budget-ratio
 * exclude each other; a budget, --window or --sinks needs a policy, and a
 * policy a budget; --k-center needs an --alloc file; --alloc excludes
 * --k-codec, --v-codec and --k-layout. 0, or -1 with the one rule that is
 * broken printed (a usage error). */
int kvqt_cacheopts_check(const kvqt_cacheopts *o, const char *cmd);
/* Reads --alloc's file, when one was given, after kvqt_cacheopts_check:
 * its settings replace the defaults, then --page and --recent given on the
 * command line apply over it. 0; -1 with "kvq CMD: --alloc FILE: <reason>"
 * printed when the file is missing, unreadable or not a valid allocation
 * (a failure, exit 1); -2 when --k-center was given and the file has no
 * centre (a usage error, message printed). */
int kvqt_cacheopts_load_alloc(kvqt_cacheopts *o, const char *cmd);
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
