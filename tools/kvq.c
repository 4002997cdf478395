/*
 * kvq.c - the kvq command-line tool: dispatches subcommands and prints the
 * overview of all of them (kvq --help). Uses only the public header
 * include/kvq.h.
 *
 * kvq --help lists every subcommand with every option, from the table
 * kvq_commands below: a command that gains an option adds it there too
 * (tests/cli_test.sh checks that every option a command's --help names is
 * in the overview).
 */
#include "kvq.h"
#include "cliargs.h"
#include "tool.h"

#include <stdio.h>
#include <string.h>

typedef struct kvq_command {
    const char *name;     /* as typed after kvq */
    const char *synopsis; /* every option, lines after the first indented */
    const char *what;
} kvq_command;

static const kvq_command kvq_commands[] = {
    {"simulate",
     "kvq simulate [--layers N] [--kv-heads N] [--q-heads N] [--head-dim N] [--prompt N]\n"
     "             [--decode N] [--k-codec C] [--v-codec C] [--k-layout token|channel]\n"
     "             [--k-prerope] [--k-center] [--policy none|window|fifo|utility\n"
     "             --budget N | --budget-ratio R] [--window N] [--sinks N] [--page N]\n"
     "             [--recent N] [--threads N] [--data synthetic|DIR] [--quality-every N]\n"
     "             [--seed N] [--json] [--hot-tokens N] [--warm-tokens N] [--warm-codec C]\n"
     "             [--cold file:DIR|redis://HOST:PORT|none] [--verify] [--strict-tiers]\n"
     "             [--cold-ttl MS] [--progress | --quiet]",
     "prefill + decode through a kvq cache against exact f32 attention, an f32 cache\n"
     "with the same eviction and one without (the main job; make demo runs it)"},
    {"generate",
     "kvq generate --model M --tokenizer T [--prompt TEXT] [-n N | --n-predict N |\n"
     "             --steps N] [--temperature F] [--seed N] [--stats] [--stats-json FILE|-]\n"
     "             [cache options]",
     "text from a llama2.c model whose attention runs through a kvq cache"},
    {"eval",
     "kvq eval --model M --tokenizer T --text FILE [--skip N] [--max-lines N]\n"
     "         [--prefill N] [--save-logits FILE | --base-logits FILE] [--json]\n"
     "         [cache options]",
     "NLL, KL, top-1 of a compressed cache against f32, decoding token by token"},
    {"calibrate",
     "kvq calibrate --model M --tokenizer T --text FILE --target-bits B -o FILE\n"
     "              [--skip N] [--max-lines N] [--max-tokens N] [--stride N] [--jobs N]\n"
     "              [--page N] [--recent N] [--codecs LIST] [--measure-all] [--verbose]\n"
     "              [--json]",
     "a codec per layer, KV head and K/V for a target of bits per value (--alloc FILE)"},
    {"sweep",
     "kvq sweep --model M --tokenizer T --text FILE -o DIR [--skip N] [--max-lines N]\n"
     "          [--configs LIST] [--calib-lines N] [--calib-tokens N] [--jobs N]",
     "eval over many cache configurations: DIR/sweep.csv and DIR/sweep.svg"},
    {"inspect", "kvq inspect DIR|file:DIR|redis://HOST[:PORT][/NAMESPACE] [--prefix P] [--json]",
     "the keys, sizes and page records of a store, every checksum verified"},
    {"codecs", "kvq codecs [--head-dim N] [--page P] [--markdown]",
     "the codecs with their bits per value"},
    {"bench codecs",
     "kvq bench codecs [--head-dim N] [--count N] [--data gauss|outlier|FILE.npy]\n"
     "                 [--codec LIST] [--seed N] [--reps N] [--isa scalar|avx2|avxvnni|avx512|auto]\n"
     "                 [--json | --csv]",
     "encode, decode and score throughput and error of codecs, beside memcpy"},
    {"bench attend",
     "kvq bench attend [--context LIST|none] [--codec LIST] [--threads N[,N...]]\n"
     "                 [--baselines LIST|all|none] [--prefill N] [--reps N] [--warm]\n"
     "                 [--isa LIST] [--huge-pages on|off] [--json]",
     "one decode step (and a prefill) over compressed caches against the memory-bandwidth\n"
     "floor, kvq's f32 cache, a dense f32 attention and llama.cpp's quantized path"},
    {"version", "kvq version", "the library's version"},
    {"help", "kvq help [COMMAND]", "this overview, or a command's usage (kvq COMMAND --help)"},
};

#define KVQ_CACHE_OPTIONS                                                                          \
    "cache options (generate, eval): --k-codec C --v-codec C --k-layout token|channel\n"         \
    "  --k-prerope --alloc FILE --k-center --policy none|window|fifo|utility --budget N\n"       \
    "  --budget-ratio R --window N --sinks N --page N --recent N --threads N\n"                  \
    "  --prefix-store file:DIR|redis://HOST:PORT --isa auto|scalar|avx2|avxvnni|avx512\n"

static void usage(FILE *f) {
    fprintf(f, "kvq %s - compressed KV cache for LLM inference\n\n", kvq_version_string());
    for (size_t i = 0; i < sizeof kvq_commands / sizeof kvq_commands[0]; i++) {
        fprintf(f, "%s\n", kvq_commands[i].synopsis);
        const char *w = kvq_commands[i].what;
        while (*w) { /* each line of the description indented */
            const char *nl = strchr(w, '\n');
            size_t len = nl ? (size_t)(nl - w) : strlen(w);
            fprintf(f, "    %.*s\n", (int)len, w);
            w += len + (nl ? 1 : 0);
        }
    }
    fprintf(f, "\n" KVQ_CACHE_OPTIONS
               "\nkvq COMMAND --help (or -h) prints a command's options in detail.\n"
               "exit status (every command): 0 ok, 1 failure (files, model, run), 2 usage error\n");
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kvq bench codecs|attend [options]   (kvq bench BENCHMARK --help)\n");
    for (size_t i = 0; i < sizeof kvq_commands / sizeof kvq_commands[0]; i++)
        if (!strncmp(kvq_commands[i].name, "bench ", 6))
            fprintf(f, "%s\n    %s\n", kvq_commands[i].synopsis, kvq_commands[i].what);
}

static int dispatch(int argc, char **argv);

/* kvq help [COMMAND]: the overview, or COMMAND --help. */
static int help(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return KVQT_EXIT_OK;
    }
    if (!strcmp(argv[1], "help") || kvqt_is_help(argv[1])) {
        usage(stdout);
        return KVQT_EXIT_OK;
    }
    char h[] = "--help";
    char *args[4] = {argv[0], argv[1], h, NULL};
    int n = 3;
    if (!strcmp(argv[1], "bench") && argc >= 3)
        args[2] = argv[2], args[3] = h, n = 4;
    return dispatch(n, args);
}

static int dispatch(int argc, char **argv) {
    const char *cmd = argv[1];
    if (strcmp(cmd, "bench") == 0) {
        if (argc >= 3 && strcmp(argv[2], "codecs") == 0)
            return kvq_tool_bench_codecs(argc - 2, argv + 2);
        if (argc >= 3 && strcmp(argv[2], "attend") == 0)
            return kvq_tool_bench_attend(argc - 2, argv + 2);
        if (argc >= 3 && kvqt_is_help(argv[2])) {
            bench_usage(stdout);
            return KVQT_EXIT_OK;
        }
        if (argc < 3)
            fprintf(stderr, "kvq bench: which benchmark? (codecs, attend)\n");
        else
            fprintf(stderr, "kvq bench: unknown benchmark '%s' (codecs, attend)\n", argv[2]);
        bench_usage(stderr);
        return KVQT_EXIT_USAGE;
    }
    if (strcmp(cmd, "generate") == 0)
        return kvq_tool_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "eval") == 0)
        return kvq_tool_eval(argc - 1, argv + 1);
    if (strcmp(cmd, "calibrate") == 0)
        return kvq_tool_calibrate(argc - 1, argv + 1);
    if (strcmp(cmd, "sweep") == 0)
        return kvq_tool_sweep(argc - 1, argv + 1);
    if (strcmp(cmd, "simulate") == 0)
        return kvq_tool_simulate(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return kvq_tool_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "codecs") == 0)
        return kvq_tool_codecs(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        if (argc > 2 && kvqt_is_help(argv[2])) {
            printf("usage: kvq version\n  prints the library's version\n");
            return KVQT_EXIT_OK;
        }
        if (argc > 2)
            return kvqt_usage_error("version", "unexpected argument '%s'", argv[2]);
        printf("kvq %s\n", kvq_version_string());
        return KVQT_EXIT_OK;
    }
    if (strcmp(cmd, "help") == 0)
        return help(argc - 1, argv + 1);
    if (kvqt_is_help(cmd)) {
        usage(stdout);
        return KVQT_EXIT_OK;
    }
    fprintf(stderr, "kvq: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return KVQT_EXIT_USAGE;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "kvq: which command? (the overview below; kvq help COMMAND for one)\n\n");
        usage(stderr);
        return KVQT_EXIT_USAGE;
    }
    return dispatch(argc, argv);
}
