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
/* 1 when every option the command needs was given. */
int kvqt_modelopts_complete(const kvqt_modelopts *o);

/* One option of a command. Every kind but FLAG takes the next argument
 * (an option given last, without it, is unknown or incomplete) and stores
 * it in *dst; numbers must be the whole argument (a value that is not is
 * refused with a message):
 *   FLAG   int = 1            STR    const char * (argv string, not owned)
 *   SIZE   size_t, decimal digits only
 *   ULL    unsigned long long, decimal digits only
 *   DOUBLE double, finite */
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
} kvqt_opt;
#define KVQT_NOPTS(table) (sizeof(table) / sizeof((table)[0]))

#define KVQT_ARGS_BAD_VALUE (-1) /* a value was refused (message printed) */
#define KVQT_ARGS_UNKNOWN 1      /* "kvq CMD: unknown or incomplete option 'X'" printed */

/* Parses argv[1..argc-1]: each argument is tried as a cache option (when
 * co is not NULL), then as a model option, then against opts. Returns 0,
 * KVQT_ARGS_BAD_VALUE or KVQT_ARGS_UNKNOWN, stopping at the first error;
 * the caller adds its usage text where it wants one. With co, --k-center
 * without centre values (an --alloc file's "center") is a bad value: the
 * centre comes from calibration data, never from the text under test. */
int kvqt_model_args(int argc, char **argv, const char *cmd, kvqt_modelopts *mo, kvqt_cacheopts *co,
                    const kvqt_opt *opts, size_t nopts);

typedef struct kvqt_model_session {
    kvq_model *model;
    kvq_tokenizer *tok;
    char **lines; /* the selected non-empty lines of the text, owned; NULL without --text */
    size_t nlines;
    const char *model_path; /* --model (argv string, not owned) */
} kvqt_model_session;

/* Loads the model and the tokenizer, then (with --text) reads the text and
 * keeps the lines --skip and --max-lines select, at least min_lines of them.
 * Returns 0, or -1 with "kvq CMD: cannot load model|tokenizer ...", "kvq
 * CMD: cannot read FILE<text_note>" or "kvq CMD: FILE: N non-empty lines,
 * ..." printed and nothing left open. */
int kvqt_model_session_open(kvqt_model_session *s, const kvqt_modelopts *o, size_t min_lines,
                            const char *cmd, const char *text_note);
/* Frees what open gave; safe on a zeroed or already closed session. */
void kvqt_model_session_close(kvqt_model_session *s);

#endif
