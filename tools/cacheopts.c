/* cacheopts.c - parsing of the cache options shared by the model commands. */
#include "cacheopts.h"
#include "alloc_json.h"

#include <stdlib.h>
#include <string.h>

void kvqt_cacheopts_init(kvqt_cacheopts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->k_codec, sizeof o->k_codec, "f32");
    snprintf(o->v_codec, sizeof o->v_codec, "f32");
    o->policy = KVQ_POLICY_NONE;
    o->window = 128;
    o->sinks = 4;
    o->page = 16;
    o->threads = 1;
}

void kvqt_cacheopts_free(kvqt_cacheopts *o) {
    kvq_store_close(o->prefix_store);
    o->prefix_store = NULL;
    free(o->center_values);
    o->center_values = NULL;
    for (size_t i = 0; i < o->n_ovr; i++) {
        free(o->ovr_state[i]);
        o->ovr_state[i] = NULL;
    }
    o->n_ovr = 0;
}

static int kvqt_count(const char *cmd, const char *opt, const char *v, size_t *out) {
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*v == '-' || end == v || *end) {
        fprintf(stderr, "kvq %s: %s needs a count, got '%s'\n", cmd, opt, v);
        return -1;
    }
    *out = (size_t)x;
    return 1;
}

int kvqt_cacheopts_parse(kvqt_cacheopts *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    static const char *flags[] = {"--k-prerope", "--k-center"};
    if (!strcmp(a, flags[0])) {
        o->k_prerope = 1;
        return 1;
    }
    if (!strcmp(a, flags[1])) {
        o->k_center = 1;
        return 1;
    }
    static const char *valued[] = {"--k-codec", "--v-codec", "--k-layout", "--alloc",  "--policy",
                                   "--budget",  "--budget-ratio", "--window", "--sinks", "--page",
                                   "--threads", "--recent", "--prefix-store"};
    int known = 0;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
        known |= !strcmp(a, valued[k]);
    if (!known)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvq %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--k-codec")) {
        snprintf(o->k_codec, sizeof o->k_codec, "%s", v);
    } else if (!strcmp(a, "--v-codec")) {
        snprintf(o->v_codec, sizeof o->v_codec, "%s", v);
    } else if (!strcmp(a, "--k-layout")) {
        if (strcmp(v, "token") && strcmp(v, "channel")) {
            fprintf(stderr, "kvq %s: --k-layout must be token or channel\n", cmd);
            return -1;
        }
        o->k_layout_channel = !strcmp(v, "channel");
    } else if (!strcmp(a, "--prefix-store")) {
        char err[256] = "";
        kvq_store_close(o->prefix_store);
        o->prefix_store = NULL;
        if (kvq_store_open(&o->prefix_store, v, NULL, err, sizeof err) != KVQ_OK) {
            fprintf(stderr, "kvq %s: --prefix-store %s: %s\n", cmd, v, err);
            return -1;
        }
    } else if (!strcmp(a, "--alloc")) {
        o->alloc_path = v;
        char err[256];
        if (kvqt_alloc_load(v, o, err, sizeof err) != 0) {
            fprintf(stderr, "kvq %s: --alloc %s: %s\n", cmd, v, err);
            return -1;
        }
    } else if (!strcmp(a, "--policy")) {
        if (!strcmp(v, "none"))
            o->policy = KVQ_POLICY_NONE;
        else if (!strcmp(v, "window"))
            o->policy = KVQ_POLICY_WINDOW;
        else if (!strcmp(v, "fifo"))
            o->policy = KVQ_POLICY_FIFO;
        else if (!strcmp(v, "utility"))
            o->policy = KVQ_POLICY_UTILITY;
        else {
            fprintf(stderr, "kvq %s: unknown policy '%s' (none, window, fifo, utility)\n", cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "--budget-ratio")) {
        char *end;
        o->budget_ratio = strtod(v, &end);
        if (*end || !(o->budget_ratio > 0)) {
            fprintf(stderr, "kvq %s: --budget-ratio needs a positive number\n", cmd);
            return -1;
        }
    } else if (!strcmp(a, "--budget")) {
        return kvqt_count(cmd, a, v, &o->budget);
    } else if (!strcmp(a, "--window")) {
        return kvqt_count(cmd, a, v, &o->window);
    } else if (!strcmp(a, "--sinks")) {
        return kvqt_count(cmd, a, v, &o->sinks);
    } else if (!strcmp(a, "--page")) {
        return kvqt_count(cmd, a, v, &o->page);
    } else if (!strcmp(a, "--threads")) {
        return kvqt_count(cmd, a, v, &o->threads);
    } else if (!strcmp(a, "--recent")) {
        return kvqt_count(cmd, a, v, &o->recent);
    }
    return 1;
}

void kvqt_cacheopts_apply(const kvqt_cacheopts *o, kvq_cache_config *cfg) {
    cfg->k_codec = o->k_codec;
    cfg->v_codec = o->v_codec;
    cfg->overrides = o->n_ovr ? o->ovr : NULL;
    cfg->n_overrides = o->n_ovr;
    cfg->k_layout = o->k_layout_channel ? KVQ_LAYOUT_CHANNEL : KVQ_LAYOUT_TOKEN;
    cfg->k_prerope = o->k_prerope;
    cfg->k_center = o->k_center;
    cfg->k_center_values = o->center_values;
    cfg->policy = o->policy;
    cfg->budget_tokens = o->budget;
    cfg->budget_ratio = o->budget_ratio;
    cfg->protect_recent = o->window;
    cfg->sinks = o->sinks;
    cfg->page_tokens = o->page;
    cfg->recent_window = o->recent;
    cfg->n_threads = o->threads;
}

void kvqt_cacheopts_usage(FILE *f) {
    fprintf(f, "cache options: --k-codec C --v-codec C (f32) --k-layout token|channel --k-prerope\n"
               "  --alloc FILE --k-center (the centre of --alloc's calibration data)\n"
               "  --policy none|window|fifo|utility --budget N\n"
               "  --budget-ratio R --window N (protected recent, 128) --sinks N (4) --page N (16)\n"
               "  --recent N (f16 recent window, 0) --threads N (1)\n"
               "  --prefix-store file:DIR|redis://HOST:PORT (reuse pages of shared prompt prefixes)\n");
}

void kvqt_cacheopts_describe(const kvqt_cacheopts *o, char *buf, size_t size) {
    snprintf(buf, size, "K %s%s%s%s, V %s, page %zu%s%s", o->k_codec,
             o->k_layout_channel ? " per-channel" : "", o->k_prerope ? " pre-RoPE" : "",
             o->k_center ? " centred" : "", o->v_codec, o->page, o->alloc_path ? ", alloc " : "",
             o->alloc_path ? o->alloc_path : "");
}
