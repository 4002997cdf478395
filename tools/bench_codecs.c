/* bench_codecs.c - placeholder until `kvq bench codecs` is written. */
#include "kvq.h"
#include "tool.h"

#include <stdio.h>

int kvq_tool_bench_codecs(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kvq bench codecs: not built yet\n");
    return 1;
}

int kvq_tool_list_codecs(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return 1;
}
