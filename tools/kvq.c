/*
 * kvq.c - the kvq command-line tool: dispatches subcommands. Uses only the
 * public header include/kvq.h.
 */
#include "kvq.h"
#include "tool.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "kvq %s - compressed KV cache for LLM inference\n"
            "usage:\n"
            "  kvq bench codecs [--head-dim N] [--count N] [--data gauss|outlier|FILE.npy]\n"
            "                   [--codec LIST] [--json]\n"
            "  kvq simulate     prefill + decode through a kvq cache vs exact f32 (--help)\n"
            "  kvq generate     text from a llama2.c model through a kvq cache (--help)\n"
            "  kvq eval         NLL/KL/top-1 of a compressed cache against f32 (--help)\n"
            "  kvq calibrate    per-head bit allocation for a target bits/value (--help)\n"
            "  kvq sweep        eval over many cache configurations, CSV + SVG plot\n"
            "  kvq inspect      keys, sizes and page records of a store (DIR or redis://)\n"
            "  kvq codecs       list the codecs with their bits per value\n"
            "  kvq version\n",
            kvq_version_string());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "bench") == 0) {
        if (argc >= 3 && strcmp(argv[2], "codecs") == 0)
            return kvq_tool_bench_codecs(argc - 2, argv + 2);
        if (argc >= 3 && strcmp(argv[2], "attend") == 0)
            return kvq_tool_bench_attend(argc - 2, argv + 2);
        fprintf(stderr, "kvq bench: unknown benchmark '%s' (known: codecs, attend)\n",
                argc >= 3 ? argv[2] : "");
        return 2;
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
        return kvq_tool_list_codecs(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvq %s\n", kvq_version_string());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvq: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
