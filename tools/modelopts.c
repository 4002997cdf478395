/*
 * modelopts.c - the command line and the inputs of the model commands: the
 * argv parser (cache options, --model --tokenizer --text, then the
 * command's own table) and the session that loads the model, its tokenizer
 * and the text's lines (see modelopts.h).
 */
#include "modelopts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvqt_modelopts_init(kvqt_modelopts *o, int with_text) {
    memset(o, 0, sizeof *o);
    o->with_text = with_text;
}

/* Strict conversions of an option's value: 0, or -1 with a message. */
static int kvqt_parse_ull(const char *cmd, const char *opt, const char *v,
                          unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!isdigit((unsigned char)v[0]) || *end || errno == ERANGE) {
        fprintf(stderr, "kvq %s: %s needs a count (decimal digits), got '%s'\n", cmd, opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int kvqt_parse_size(const char *cmd, const char *opt, const char *v, size_t *out) {
    unsigned long long x;
    if (kvqt_parse_ull(cmd, opt, v, &x) != 0)
        return -1;
    if (x > SIZE_MAX) {
        fprintf(stderr, "kvq %s: %s %s is too large\n", cmd, opt, v);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

static int kvqt_parse_double(const char *cmd, const char *opt, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x)) {
        fprintf(stderr, "kvq %s: %s needs a number, got '%s'\n", cmd, opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* 1 when argv[*i] is one of the model options followed by its value (both
 * consumed), 0 when it is not, -1 on a bad value (message printed). */
static int kvqt_modelopts_parse(kvqt_modelopts *o, int argc, char **argv, int *i, const char *cmd) {
    if (*i + 1 >= argc)
        return 0;
    const char *a = argv[*i], *v = argv[*i + 1];
    const char **dst = NULL;
    if (!strcmp(a, "--model"))
        dst = &o->model;
    else if (!strcmp(a, "--tokenizer"))
        dst = &o->tokenizer;
    else if (o->with_text && !strcmp(a, "--text"))
        dst = &o->text;
    if (dst) {
        *dst = v;
    } else if (o->with_text && !strcmp(a, "--skip")) {
        if (kvqt_parse_size(cmd, a, v, &o->skip) != 0)
            return -1;
    } else if (o->with_text && !strcmp(a, "--max-lines")) {
        if (kvqt_parse_size(cmd, a, v, &o->max_lines) != 0)
            return -1;
        if (o->max_lines == 0) {
            fprintf(stderr, "kvq %s: --max-lines needs at least 1\n", cmd);
            return -1;
        }
    } else {
        return 0;
    }
    ++*i;
    return 1;
}

/* 1 when argv[*i] is one of opts (its value consumed), 0 when it is not, -1
 * on a bad value (message printed). */
static int kvqt_opt_parse(const kvqt_opt *opts, size_t nopts, int argc, char **argv, int *i,
                          const char *cmd) {
    const char *a = argv[*i];
    for (size_t k = 0; k < nopts; k++) {
        const kvqt_opt *op = &opts[k];
        if (strcmp(a, op->name))
            continue;
        if (op->kind == KVQT_OPT_FLAG) {
            *(int *)op->dst = 1;
            return 1;
        }
        if (*i + 1 >= argc)
            return 0;
        const char *v = argv[++*i];
        int r = 0;
        switch (op->kind) {
        case KVQT_OPT_STR:
            *(const char **)op->dst = v;
            break;
        case KVQT_OPT_SIZE:
            r = kvqt_parse_size(cmd, a, v, (size_t *)op->dst);
            break;
        case KVQT_OPT_ULL:
            r = kvqt_parse_ull(cmd, a, v, (unsigned long long *)op->dst);
            break;
        case KVQT_OPT_DOUBLE:
            r = kvqt_parse_double(cmd, a, v, (double *)op->dst);
            break;
        case KVQT_OPT_FLAG:
            break;
        }
        return r ? -1 : 1;
    }
    return 0;
}

/* The options as a whole: a centre needs its values. */
static int kvqt_cacheopts_consistent(const kvqt_cacheopts *co, const char *cmd) {
    if (co->k_center && !co->center_values) {
        fprintf(stderr,
                "kvq %s: --k-center needs the centre from calibration data: give --alloc FILE "
                "with a \"center\" (kvq calibrate writes one); the text under evaluation is "
                "never used to estimate it\n",
                cmd);
        return -1;
    }
    return 0;
}

int kvqt_model_args(int argc, char **argv, const char *cmd, kvqt_modelopts *mo, kvqt_cacheopts *co,
                    const kvqt_opt *opts, size_t nopts) {
    for (int i = 1; i < argc; i++) {
        int r = co ? kvqt_cacheopts_parse(co, argc, argv, &i, cmd) : 0;
        if (!r)
            r = kvqt_modelopts_parse(mo, argc, argv, &i, cmd);
        if (!r)
            r = kvqt_opt_parse(opts, nopts, argc, argv, &i, cmd);
        if (r < 0)
            return KVQT_ARGS_BAD_VALUE;
        if (r)
            continue;
        fprintf(stderr, "kvq %s: unknown or incomplete option '%s'\n", cmd, argv[i]);
        return KVQT_ARGS_UNKNOWN;
    }
    if (co && kvqt_cacheopts_consistent(co, cmd) != 0)
        return KVQT_ARGS_BAD_VALUE;
    return 0;
}

int kvqt_modelopts_complete(const kvqt_modelopts *o) {
    return o->model && o->tokenizer && (!o->with_text || o->text);
}

static int kvqt_model_open(const char *model_path, const char *tok_path, kvq_model **m,
                           kvq_tokenizer **t, const char *cmd) {
    kvq_status st = kvq_model_load(m, model_path, NULL);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq %s: cannot load model %s: %s\n", cmd, model_path, kvq_strerror(st));
        return -1;
    }
    kvq_model_info in;
    kvq_model_get_info(*m, &in);
    st = kvq_tokenizer_load(t, tok_path, in.vocab_size, NULL);
    if (st != KVQ_OK) {
        fprintf(stderr, "kvq %s: cannot load tokenizer %s: %s\n", cmd, tok_path, kvq_strerror(st));
        kvq_model_free(*m);
        *m = NULL;
        return -1;
    }
    return 0;
}

/* The non-empty lines of a file (newline and a trailing '\r' stripped), or
 * NULL when it cannot be opened. */
static char **kvqt_read_lines(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 16, cnt = 0, len = 0, lcap = 0;
    char **lines = malloc(cap * sizeof *lines), *line = NULL;
    int ch;
    for (;;) {
        ch = fgetc(f);
        if (ch == EOF || ch == '\n') {
            if (len > 0 && line[len - 1] == '\r')
                len--;
            if (len > 0) {
                line[len] = 0;
                if (cnt == cap) {
                    cap *= 2;
                    lines = realloc(lines, cap * sizeof *lines);
                }
                lines[cnt++] = line;
                line = NULL;
                lcap = 0;
            }
            len = 0;
            if (ch == EOF)
                break;
            continue;
        }
        if (len + 2 > lcap) {
            lcap = lcap ? 2 * lcap : 256;
            line = realloc(line, lcap);
        }
        line[len++] = (char)ch;
    }
    free(line);
    fclose(f);
    *n = cnt;
    return lines;
}

/* Keeps lines skip .. skip + max_lines - 1 (max_lines 0: all after skip). */
static void kvqt_select_lines(kvqt_model_session *s, size_t skip, size_t max_lines) {
    size_t first = skip < s->nlines ? skip : s->nlines;
    size_t keep = s->nlines - first;
    if (max_lines && keep > max_lines)
        keep = max_lines;
    for (size_t i = 0; i < s->nlines; i++)
        if (i < first || i >= first + keep)
            free(s->lines[i]);
    memmove(s->lines, s->lines + first, keep * sizeof *s->lines);
    s->nlines = keep;
}

int kvqt_model_session_open(kvqt_model_session *s, const kvqt_modelopts *o, size_t min_lines,
                            const char *cmd, const char *text_note) {
    memset(s, 0, sizeof *s);
    s->model_path = o->model;
    if (kvqt_model_open(o->model, o->tokenizer, &s->model, &s->tok, cmd))
        return -1;
    if (!o->with_text)
        return 0;
    s->lines = kvqt_read_lines(o->text, &s->nlines);
    if (!s->lines) {
        fprintf(stderr, "kvq %s: cannot read %s%s\n", cmd, o->text, text_note);
        kvqt_model_session_close(s);
        return -1;
    }
    size_t all = s->nlines;
    kvqt_select_lines(s, o->skip, o->max_lines);
    if (s->nlines < min_lines) {
        fprintf(stderr, "kvq %s: %s: %zu non-empty lines, %zu selected (--skip %zu, --max-lines "
                        "%zu); at least %zu needed\n",
                cmd, o->text, all, s->nlines, o->skip, o->max_lines, min_lines);
        kvqt_model_session_close(s);
        return -1;
    }
    return 0;
}

void kvqt_model_session_close(kvqt_model_session *s) {
    for (size_t i = 0; i < s->nlines; i++)
        free(s->lines[i]);
    free(s->lines);
    kvq_model_free(s->model);
    kvq_tokenizer_free(s->tok);
    memset(s, 0, sizeof *s);
}
