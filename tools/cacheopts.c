/* cacheopts.c - parsing of the cache options shared by the model commands. */
#include "cacheopts.h"
#include "alloc_json.h"
#include "cliargs.h"

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

int kvqt_cacheopts_parse(kvqt_cacheopts *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    if (!strcmp(a, "--k-prerope")) {
        o->k_prerope = 1;
        return 1;
    }
    if (!strcmp(a, "--k-center")) {
        o->k_center = 1;
        o->k_center_set = 1;
        return 1;
    }
    static const char *valued[] = {"--k-codec", "--v-codec", "--k-layout", "--alloc",  "--policy",
                                   "--budget",  "--budget-ratio", "--window", "--sinks", "--page",
                                   "--threads", "--recent", "--prefix-store", "--isa"};
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
    const size_t M = KVQT_MAX_COUNT;
    if (!strcmp(a, "--k-codec") || !strcmp(a, "--v-codec")) {
        char *dst = a[2] == 'k' ? o->k_codec : o->v_codec;
        if (!*v || strlen(v) >= sizeof o->k_codec) {
            fprintf(stderr, "kvq %s: %s needs a codec spec of 1..%zu characters (kvq codecs "
                            "lists them)\n", cmd, a, sizeof o->k_codec - 1);
            return -1;
        }
        snprintf(dst, sizeof o->k_codec, "%s", v);
        o->codec_set = 1;
        if (a[2] == 'k')
            o->k_codec_set = 1;
        else
            o->v_codec_set = 1;
    } else if (!strcmp(a, "--k-layout")) {
        if (strcmp(v, "token") && strcmp(v, "channel")) {
            fprintf(stderr, "kvq %s: --k-layout must be token or channel, got '%s'\n", cmd, v);
            return -1;
        }
        o->k_layout_channel = !strcmp(v, "channel");
        o->k_layout_set = 1;
    } else if (!strcmp(a, "--prefix-store")) {
        if (!*v) {
            fprintf(stderr, "kvq %s: --prefix-store needs a store URL (file:DIR or "
                            "redis://HOST:PORT), got ''\n", cmd);
            return -1;
        }
        if (kvqt_check_store_url(cmd, "--prefix-store", v) != 0)
            return -1;
        o->prefix_url = v;
    } else if (!strcmp(a, "--alloc")) {
        if (!*v) {
            fprintf(stderr, "kvq %s: --alloc needs a file name (kvq calibrate -o FILE writes "
                            "one), got ''\n", cmd);
            return -1;
        }
        o->alloc_path = v; /* read by kvqt_cacheopts_load_alloc, after every check */
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
            fprintf(stderr, "kvq %s: --policy must be none, window, fifo or utility, got '%s'\n",
                    cmd, v);
            return -1;
        }
    } else if (!strcmp(a, "--budget-ratio")) {
        return kvqt_arg_double(cmd, a, v, 0, 1, 1, &o->budget_ratio) ? -1 : 1;
    } else if (!strcmp(a, "--budget")) {
        return kvqt_arg_size(cmd, a, v, 1, M, &o->budget) ? -1 : 1;
    } else if (!strcmp(a, "--window")) {
        o->window_set = 1;
        return kvqt_arg_size(cmd, a, v, 0, M, &o->window) ? -1 : 1;
    } else if (!strcmp(a, "--sinks")) {
        o->sinks_set = 1;
        return kvqt_arg_size(cmd, a, v, 0, M, &o->sinks) ? -1 : 1;
    } else if (!strcmp(a, "--page")) {
        o->page_set = 1;
        return kvqt_arg_size(cmd, a, v, 1, 4096, &o->page) ? -1 : 1;
    } else if (!strcmp(a, "--threads")) {
        return kvqt_arg_size(cmd, a, v, 1, 256, &o->threads) ? -1 : 1;
    } else if (!strcmp(a, "--recent")) {
        o->recent_set = 1;
        return kvqt_arg_size(cmd, a, v, 0, M, &o->recent) ? -1 : 1;
    } else if (!strcmp(a, "--isa")) {
        if (kvqt_parse_isa(v, &o->isa)) {
            if (!kvq_cpu_supports(o->isa)) {
                fprintf(stderr, "kvq %s: --isa %s: this CPU does not have it\n", cmd, v);
                return -1;
            }
            return 1;
        }
        fprintf(stderr, "kvq %s: --isa must be auto, scalar, avx2, avxvnni or avx512, got '%s'\n",
                cmd, v);
        return -1;
    }
    return 1;
}

int kvqt_cacheopts_check(const kvqt_cacheopts *o, const char *cmd) {
    static const char *policies[] = {"none", "window", "fifo", "utility"};
    const char *pn = (size_t)o->policy < 4 ? policies[o->policy] : "?";
    if (o->budget && o->budget_ratio > 0) {
        fprintf(stderr, "kvq %s: give --budget or --budget-ratio, not both\n", cmd);
        return -1;
    }
    int budget = o->budget || o->budget_ratio > 0;
    if (o->policy == KVQ_POLICY_NONE && (budget || o->window_set || o->sinks_set)) {
        fprintf(stderr, "kvq %s: %s needs an eviction policy (--policy window, fifo or utility): "
                        "without one nothing is evicted\n", cmd,
                o->budget ? "--budget" : o->budget_ratio > 0 ? "--budget-ratio"
                : o->window_set ? "--window" : "--sinks");
        return -1;
    }
    if (o->policy != KVQ_POLICY_NONE && !budget) {
        fprintf(stderr, "kvq %s: --policy %s needs a budget (--budget N or --budget-ratio R): "
                        "without one it evicts nothing\n", cmd, pn);
        return -1;
    }
    if (o->alloc_path && (o->k_codec_set || o->v_codec_set || o->k_layout_set)) {
        fprintf(stderr,
                "kvq %s: --alloc %s sets the codecs of every layer and head (and the key "
                "layout): give --alloc or %s, not both\n", cmd, o->alloc_path,
                o->k_codec_set && o->v_codec_set ? "--k-codec/--v-codec"
                : o->k_codec_set                 ? "--k-codec"
                : o->v_codec_set                 ? "--v-codec"
                                                 : "--k-layout");
        return -1;
    }
    if (o->k_center && !o->alloc_path && !o->center_values) {
        fprintf(stderr,
                "kvq %s: --k-center needs the centre from calibration data: give --alloc FILE "
                "with a \"center\" (kvq calibrate writes one); the text under evaluation is "
                "never used to estimate it\n",
                cmd);
        return -1;
    }
    return 0;
}

int kvqt_cacheopts_load_alloc(kvqt_cacheopts *o, const char *cmd) {
    if (!o->alloc_path)
        return 0;
    size_t page = o->page, recent = o->recent;
    int prerope = o->k_prerope, center = o->k_center;
    char err[256];
    if (kvqt_alloc_load(o->alloc_path, o, err, sizeof err) != 0) {
        fprintf(stderr, "kvq %s: --alloc %s: %s\n", cmd, o->alloc_path, err);
        return -1;
    }
    if (o->k_center && !o->center_values && !center) {
        fprintf(stderr, "kvq %s: --alloc %s: not a valid allocation: k_center is true but it "
                        "has no \"center\"\n", cmd, o->alloc_path);
        return -1;
    }
    if (o->page_set)
        o->page = page;
    if (o->recent_set)
        o->recent = recent;
    o->k_prerope |= prerope;
    o->k_center |= center;
    if (o->k_center && !o->center_values) {
        fprintf(stderr,
                "kvq %s: --k-center needs the centre from calibration data, and --alloc %s "
                "has no \"center\" (kvq calibrate writes one)\n", cmd, o->alloc_path);
        return -2;
    }
    return 0;
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
    cfg->isa = o->isa;
}

int kvqt_cacheopts_open_store(kvqt_cacheopts *o, const char *cmd) {
    if (!o->prefix_url || o->prefix_store)
        return 0;
    char err[256] = "";
    kvq_status st = kvq_store_open(&o->prefix_store, o->prefix_url, NULL, err, sizeof err);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq %s: --prefix-store %s: %s\n", cmd, o->prefix_url,
                err[0] ? err : kvq_strerror(st));
        o->prefix_store = NULL;
        return -1;
    }
    return 0;
}

void kvqt_cacheopts_usage(FILE *f) {
    fprintf(f,
            "cache options:\n"
            "  --k-codec C, --v-codec C  codecs of keys and values (f32; kvq codecs lists them)\n"
            "  --k-layout token|channel  keys per token (token), or per channel in pages (KIVI)\n"
            "  --k-prerope               store keys before RoPE; attention applies it\n"
            "  --alloc FILE              a per-head allocation written by kvq calibrate\n"
            "  --k-center                subtract the key centre of --alloc's calibration data\n"
            "  --policy none|window|fifo|utility  eviction (none); a policy needs a budget:\n"
            "  --budget N                tokens kept per layer, 1..2^30, or\n"
            "  --budget-ratio R          ceil(R x the prefill or sequence length), 0 < R <= 1\n"
            "  --window N                newest tokens a policy never evicts, 0..2^30 (128)\n"
            "  --sinks N                 first tokens a policy never evicts, 0..2^30 (4)\n"
            "  --page N                  tokens per page, 1..4096 (16)\n"
            "  --recent N                newest tokens kept in f16, 0..2^30 (0)\n"
            "  --threads N               attention threads, 1..256 (1)\n"
            "  --isa P                   the cache's kernels: auto (the best this CPU has),\n"
            "                            scalar (the reference), avx2, avxvnni or avx512\n"
            "  --prefix-store URL        file:DIR or redis://HOST:PORT: reuse the pages of\n"
            "                            prompt prefixes stored by an earlier run\n");
}

/* The codecs of one kind (K or V) among the overrides, each with its
 * count ("chan:int3 x12, nuq4 x8"), appended to buf; 0 when none. */
static size_t kvqt_describe_ovr(const kvqt_cacheopts *o, int is_value, char *buf, size_t size) {
    size_t kinds = 0;
    for (size_t i = 0; i < o->n_ovr; i++) {
        if (o->ovr[i].is_value != is_value)
            continue;
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = o->ovr[j].is_value == is_value && !strcmp(o->ovr_codec[j], o->ovr_codec[i]);
        if (seen)
            continue;
        size_t cnt = 0;
        for (size_t j = i; j < o->n_ovr; j++)
            cnt += o->ovr[j].is_value == is_value && !strcmp(o->ovr_codec[j], o->ovr_codec[i]);
        size_t at = strlen(buf);
        if (at < size)
            snprintf(buf + at, size - at, "%s%s x%zu", kinds ? ", " : "", o->ovr_codec[i], cnt);
        kinds++;
    }
    return kinds;
}

void kvqt_cacheopts_describe(const kvqt_cacheopts *o, char *buf, size_t size) {
    const char *keys = o->k_layout_channel ? " per-channel" : "";
    char kh[64];
    snprintf(kh, sizeof kh, "%s%s", o->k_prerope ? " pre-RoPE" : "", o->k_center ? " centred" : "");
    if (!o->n_ovr) {
        snprintf(buf, size, "K %s%s%s, V %s, page %zu", o->k_codec, keys, kh, o->v_codec,
                 o->page);
    } else {
        /* an allocation: the codecs per head, the file's K and V codecs
         * where no override names one */
        char k[160] = "", v[160] = "";
        if (!kvqt_describe_ovr(o, 0, k, sizeof k))
            snprintf(k, sizeof k, "%s", o->k_codec);
        if (!kvqt_describe_ovr(o, 1, v, sizeof v))
            snprintf(v, sizeof v, "%s", o->v_codec);
        int kk = *keys || *kh; /* the key handling, when there is any */
        snprintf(buf, size, "K per head %s; V per head %s;%s%s%s%s where no head is named K %s, "
                 "V %s; page %zu", k, v, kk ? " keys" : "", keys, kh, kk ? ";" : "", o->k_codec,
                 o->v_codec, o->page);
    }
    size_t at = strlen(buf);
    if (o->recent && at < size)
        snprintf(buf + at, size - at, ", recent %zu in f16", o->recent), at = strlen(buf);
    if (o->alloc_path && at < size)
        snprintf(buf + at, size - at, ", alloc %s", o->alloc_path);
}
