/*
 * modelopts.h - the command line and the inputs shared by the model commands
 * (generate, eval, calibrate, sweep): the options --model M --tokenizer T
 * and, for the commands that read a text, --text FILE with the line
 * selection --skip N (leave out the first N non-empty lines) and
 * --max-lines N (use at most N of the rest); one argv parser that
 * takes those, the cache options (cacheopts.h) where the command has them,
 * and the command's own options from a small table; and the session that
 * loads the model, its tokenizer and the text's non-empty lines. Each
 * command keeps its own usage text.
 */
#ifndef KVQ_MODELOPTS_H
#define KVQ_MODELOPTS_H

#include "kvq.h"
#include "cacheopts.h"

#include <stddef.h>

typedef struct kvqt_modelopts {
    /* argv strings (not owned), NULL until given */
    const char *model, *tokenizer, *text;
    int with_text;    /* --text, --skip and --max-lines are accepted, --text required */
    size_t skip;      /* --skip N (0) */
    size_t max_lines; /* --max-lines N, 0 = all */
} kvqt_modelopts;

void kvqt_modelopts_init(kvqt_modelopts *o, int with_text);

/* One option of a command. Every kind but FLAG takes the next argument
 * and stores it in *dst; numbers must be the whole argument and inside
 * their range (cliargs.h), or they are refused with a message naming the
 * option and the range:
 *   FLAG   int = 1            STR    const char * (argv string, not owned)
 *   SIZE   size_t, decimal digits, ilo..ihi
 *   ULL    unsigned long long, decimal digits, ilo..ihi
 *   DOUBLE double, finite, [dlo, dhi] ((dlo, dhi] with lo_open)
 * Write tables with the macros below. */
typedef enum kvqt_opt_kind {
    KVQT_OPT_FLAG,
    KVQT_OPT_STR,
    KVQT_OPT_SIZE,
    KVQT_OPT_ULL,
    KVQT_OPT_DOUBLE
} kvqt_opt_kind;

typedef struct kvqt_opt {
    const char *name;
    kvqt_opt_kind kind;
    void *dst;
    unsigned long long ilo, ihi;
    double dlo, dhi;
    int lo_open;
} kvqt_opt;
#define KVQT_NOPTS(table) (sizeof(table) / sizeof((table)[0]))
#define KVQT_FLAG(name, p) {name, KVQT_OPT_FLAG, p, 0, 0, 0, 0, 0}
#define KVQT_STR(name, p) {name, KVQT_OPT_STR, p, 0, 0, 0, 0, 0}
#define KVQT_SIZE(name, p, lo, hi) {name, KVQT_OPT_SIZE, p, lo, hi, 0, 0, 0}
#define KVQT_ULL(name, p, lo, hi) {name, KVQT_OPT_ULL, p, lo, hi, 0, 0, 0}
#define KVQT_DOUBLE(name, p, lo, hi, lo_open) {name, KVQT_OPT_DOUBLE, p, 0, 0, lo, hi, lo_open}

#define KVQT_ARGS_OK 0
#define KVQT_ARGS_BAD (-1) /* a usage error, its message and the --help hint printed */
#define KVQT_ARGS_HELP 1   /* --help or -h was given: print the usage on stdout, exit 0 */

/* Parses argv[1..argc-1] in order: --help / -h, then each argument is tried
 * as a cache option (when co is not NULL), then as a model option (when
 * mo is not NULL), then against opts. Returns KVQT_ARGS_OK, KVQT_ARGS_HELP or KVQT_ARGS_BAD,
 * stopping at the first error (unknown option, missing value, bad value,
 * an argument that is no option). With co, the cache options must also be
 * consistent as a whole (cacheopts.h); --alloc's file is not read here
 * (kvqt_cacheopts_load_alloc, once every usage error is ruled out). */
int kvqt_model_args(int argc, char **argv, const char *cmd, kvqt_modelopts *mo, kvqt_cacheopts *co,
                    const kvqt_opt *opts, size_t nopts);
/* 0 when --model, --tokenizer (and --text, with_text) were given; else a
 * usage error naming the missing ones is printed and KVQT_EXIT_USAGE
 * returned. */
int kvqt_modelopts_require(const kvqt_modelopts *o, const char *cmd);

typedef struct kvqt_model_session {
    kvq_model *model;
    kvq_tokenizer *tok;
    char **lines; /* the selected non-empty lines of the text, owned; NULL without --text */
    size_t nlines;
    const char *model_path; /* --model (argv string, not owned) */
} kvqt_model_session;

/* Loads the model and the tokenizer, then (with --text) reads the text
 * (kvqt_read_text: a missing, unreadable, empty or binary file, or a
 * directory, is refused) and keeps the lines --skip and --max-lines
 * select, at least min_lines of them. Returns 0, or -1 with "kvq CMD:
 * --model M: <what is wrong>", "kvq CMD: --text FILE: <what is wrong>" or
 * "kvq CMD: FILE: N non-empty lines, ..." printed and nothing left open
 * (each a failure, exit code 1). */
int kvqt_model_session_open(kvqt_model_session *s, const kvqt_modelopts *o, size_t min_lines,
                            const char *cmd);
/* Loads a model file: 0, or -1 with "kvq CMD: --model PATH: <reason>"
 * printed (the file's own problems first: missing, a directory,
 * unreadable, empty; then what the loader says). */
int kvqt_load_model(const char *cmd, const char *path, kvq_model **m);
int kvqt_load_tokenizer(const char *cmd, const char *path, size_t vocab, kvq_tokenizer **t);
/* Frees what open gave; safe on a zeroed or already closed session. */
void kvqt_model_session_close(kvqt_model_session *s);

#endif
