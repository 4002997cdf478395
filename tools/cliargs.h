/*
 * cliargs.h - what every subcommand of the kvq tool does the same way: the
 * exit codes, --help, strict numbers with their accepted range, the
 * messages of a usage error, and the checks of the files a command reads
 * and writes before it starts working.
 *
 * Exit codes (every subcommand):
 *   0  success (and --help / -h, which print the usage on stdout)
 *   1  a failure: a file that cannot be read, is empty, not text or
 *      corrupt, an output that cannot be written, a run that fails
 *   2  a usage error: an unknown option, a missing or malformed value, a
 *      number outside its range, options that exclude each other, a codec
 *      or setting the cache refuses for this model
 * Messages go to stderr as "kvq CMD: what is wrong", one rule per message.
 */
#ifndef KVQ_CLIARGS_H
#define KVQ_CLIARGS_H

#include "kvq.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVQT_EXIT_OK 0
#define KVQT_EXIT_FAIL 1
#define KVQT_EXIT_USAGE 2

/* The largest count a token-sized option takes (2^30, the cache's
 * max_tokens bound). */
#define KVQT_MAX_COUNT ((size_t)1 << 30)

/* 1 when a is --help or -h. */
int kvqt_is_help(const char *a);

/* The kernel path named s, one of kvq_isa_name's names (auto, scalar,
 * avx2, avx512, avxvnni): 1 and *out, or 0. Inline, as kvqt_arg_size, for
 * the objects that take cacheopts.c without this file (fuzz, replay). */
static inline int kvqt_parse_isa(const char *s, kvq_isa *out) {
    for (int k = KVQ_ISA_AUTO; k <= KVQ_ISA_AVXVNNI; k++)
        if (!strcmp(s, kvq_isa_name((kvq_isa)k))) {
            *out = (kvq_isa)k;
            return 1;
        }
    return 0;
}

/* The length of the URL scheme v begins with (a letter, then letters,
 * digits, '+', '-' or '.', then ':'; "file" of "file:DIR"), or 0. A store
 * argument with a scheme kvq has no store for is refused before anything
 * is opened or created (a directory whose name looks so is ./NAME). */
static inline size_t kvqt_url_scheme(const char *v) {
    size_t n = 0;
    if ((*v >= 'a' && *v <= 'z') || (*v >= 'A' && *v <= 'Z'))
        for (n = 1; (v[n] >= 'a' && v[n] <= 'z') || (v[n] >= 'A' && v[n] <= 'Z') ||
                    (v[n] >= '0' && v[n] <= '9') || v[n] == '+' || v[n] == '-' || v[n] == '.';
             n++)
            ;
    return n && v[n] == ':' ? n : 0;
}

/* 0 when the store URL v names a store kvq has (a directory, file:DIR or
 * redis://...); -1 with "kvq CMD: OPT V: unknown store 'S:' (known: ...)"
 * printed. opt may be "" for a positional argument. */
static inline int kvqt_check_store_url(const char *cmd, const char *opt, const char *v) {
    size_t n = kvqt_url_scheme(v);
    if (!n || (n == 4 && !strncmp(v, "file", 4)) || !strncmp(v, "redis://", 8))
        return 0;
    if (n == 5 && !strncmp(v, "redis", 5))
        fprintf(stderr, "kvq %s: %s%s%s: a Redis store is redis://HOST[:PORT][/NAMESPACE]\n", cmd,
                opt, *opt ? " " : "", v);
    else
        fprintf(stderr, "kvq %s: %s%s%s: unknown store '%.*s:' (known: DIR, file:DIR, "
                        "redis://HOST[:PORT][/NAMESPACE]; a directory named so: ./%s)\n",
                cmd, opt, *opt ? " " : "", v, (int)(n < 40 ? n : 40), v, v);
    return -1;
}

/* Prints "kvq CMD: <message>" and the line that points at --help to
 * stderr; returns KVQT_EXIT_USAGE. */
int kvqt_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints only the line that points at --help (the message is out
 * already); returns KVQT_EXIT_USAGE. */
int kvqt_usage_hint(const char *cmd);

/* Strict numbers: the whole argument, decimal digits only for integers (no
 * sign, no space, no suffix), no overflow, inside [lo, hi]; a double is a
 * finite number in [lo, hi], or (lo, hi] with lo_open. 0, or -1 with "kvq
 * CMD: OPT must be an integer in LO..HI, got 'V'" printed. Inline, so that
 * the tool sources the tests link alone (cacheopts.c: FUZZ_TOOLS in the
 * Makefile) need no other object. */
static inline int kvqt_digits(const char *v) {
    if (!*v)
        return 0;
    for (const char *p = v; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static inline int kvqt_arg_ull(const char *cmd, const char *opt, const char *v,
                               unsigned long long lo, unsigned long long hi,
                               unsigned long long *out) {
    errno = 0;
    unsigned long long x = kvqt_digits(v) ? strtoull(v, NULL, 10) : 0;
    if (!kvqt_digits(v) || errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "kvq %s: %s must be an integer in %llu..%llu, got '%s'\n", cmd, opt, lo, hi,
                v);
        return -1;
    }
    *out = x;
    return 0;
}

static inline int kvqt_arg_size(const char *cmd, const char *opt, const char *v, size_t lo,
                                size_t hi, size_t *out) {
    unsigned long long x;
    if (kvqt_arg_ull(cmd, opt, v, lo, hi, &x) != 0)
        return -1;
    *out = (size_t)x;
    return 0;
}

static inline int kvqt_arg_double(const char *cmd, const char *opt, const char *v, double lo,
                                  double hi, int lo_open, double *out) {
    char *end = NULL;
    /* strtod skips leading space; a value is the whole argument */
    double x = *v && *v != ' ' && *v != '\t' ? strtod(v, &end) : NAN;
    int ok = end && end != v && !*end && isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
    if (!ok) {
        fprintf(stderr, "kvq %s: %s must be a number in %c%g, %g], got '%s'\n", cmd, opt,
                lo_open ? '(' : '[', lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* Input files. 0 when path names a regular file that can be opened for
 * reading and is not empty; -1 with "kvq CMD: OPT PATH: <reason>" printed
 * (No such file or directory, is a directory, Permission denied, the file
 * is empty). opt may be "" for a positional argument. */
int kvqt_check_input(const char *cmd, const char *opt, const char *path);

/* Reads a text file whole: *buf (NUL-terminated, owned by the caller),
 * *size its length. Refuses, with a message naming the option and the
 * offset: what kvqt_check_input refuses, a NUL byte, bytes that are not
 * UTF-8, and control characters other than tab, newline, CR, FF and VT.
 * 0 or -1. */
int kvqt_read_text(const char *cmd, const char *opt, const char *path, char **buf, size_t *size);

/* Output files, checked before a command works: 0 when path can be
 * written (an existing regular file that is writable, or a new file in an
 * existing, writable directory: created and removed again to be sure); -1
 * with "kvq CMD: OPT PATH: <reason>" printed (is a directory, No such file
 * or directory, Permission denied, ...). */
int kvqt_check_output_file(const char *cmd, const char *opt, const char *path);

/* Output directories: 0 when path is a directory that can be written, or
 * was created (its parent must exist); -1 with a message (exists and is
 * not a directory, cannot be created, not writable). */
int kvqt_check_output_dir(const char *cmd, const char *opt, const char *path);

/* Writes f's contents to path through path.tmp.PID and a rename, so that
 * path holds either its old contents or the whole new file. Returns 0 or -1
 * with a message; the temporary file is removed on failure. */
typedef int (*kvqt_writer)(FILE *f, void *ctx);
int kvqt_write_file(const char *cmd, const char *path, kvqt_writer writer, void *ctx);

#endif
