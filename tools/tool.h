/* tool.h - subcommands of the kvq tool, one file each. argv[0] is the
 * subcommand name. Each returns the process exit code (0 ok, 1 failure, 2
 * usage error; cliargs.h) and prints its usage on stdout for --help / -h. */
#ifndef KVQ_TOOL_H
#define KVQ_TOOL_H

int kvq_tool_bench_codecs(int argc, char **argv);
int kvq_tool_list_codecs(int argc, char **argv); /* unused: kvq codecs is kvq_tool_codecs */
int kvq_tool_codecs(int argc, char **argv);
int kvq_tool_simulate(int argc, char **argv);
int kvq_tool_bench_attend(int argc, char **argv);
int kvq_tool_generate(int argc, char **argv);
int kvq_tool_eval(int argc, char **argv);
int kvq_tool_calibrate(int argc, char **argv);
int kvq_tool_sweep(int argc, char **argv);
int kvq_tool_inspect(int argc, char **argv);

#endif
