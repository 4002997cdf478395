/*
 * modelopts.c - the command line and the inputs of the model commands: the
 * argv parser (cache options, --model --tokenizer --text, then the
 * command's own table) and the session that loads the model, its tokenizer
 * and the text's lines (see modelopts.h).
 */
#include "modelopts.h"
#include "cliargs.h"

#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvqt_modelopts_init(kvqt_modelopts *o, int with_text) {
    memset(o, 0, sizeof *o);
    o->with_text = with_text;
}

/* 1 when argv[*i] is one of the model options followed by its value (both
 * consumed), 0 when it is not, -1 on a bad or missing value (message
 * printed). */
static int kvqt_modelopts_parse(kvqt_modelopts *o, int argc, char **argv, int *i, const char *cmd) {
    const char *a = argv[*i];
    int is_path = !strcmp(a, "--model") || !strcmp(a, "--tokenizer") ||
                  (o->with_text && !strcmp(a, "--text"));
    int is_count = o->with_text && (!strcmp(a, "--skip") || !strcmp(a, "--max-lines"));
    if (!is_path && !is_count)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvq %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "--skip"))
        return kvqt_arg_size(cmd, a, v, 0, KVQT_MAX_COUNT, &o->skip) ? -1 : 1;
    if (!strcmp(a, "--max-lines"))
        return kvqt_arg_size(cmd, a, v, 1, KVQT_MAX_COUNT, &o->max_lines) ? -1 : 1;
    if (!*v) {
        fprintf(stderr, "kvq %s: %s needs a file name, got ''\n", cmd, a);
        return -1;
    }
    if (!strcmp(a, "--model"))
        o->model = v;
    else if (!strcmp(a, "--tokenizer"))
        o->tokenizer = v;
    else
        o->text = v;
    return 1;
}

/* 1 when argv[*i] is one of opts (its value consumed), 0 when it is not, -1
 * on a bad or missing value (message printed). */
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
        if (*i + 1 >= argc) {
            fprintf(stderr, "kvq %s: %s needs a value\n", cmd, a);
            return -1;
        }
        const char *v = argv[++*i];
        int r = 0;
        switch (op->kind) {
        case KVQT_OPT_STR:
            *(const char **)op->dst = v;
            break;
        case KVQT_OPT_SIZE:
            r = kvqt_arg_size(cmd, a, v, (size_t)op->ilo, (size_t)op->ihi, (size_t *)op->dst);
            break;
        case KVQT_OPT_ULL:
            r = kvqt_arg_ull(cmd, a, v, op->ilo, op->ihi, (unsigned long long *)op->dst);
            break;
        case KVQT_OPT_DOUBLE:
            r = kvqt_arg_double(cmd, a, v, op->dlo, op->dhi, op->lo_open, (double *)op->dst);
            break;
        case KVQT_OPT_FLAG:
            break;
        }
        return r ? -1 : 1;
    }
    return 0;
}

int kvqt_model_args(int argc, char **argv, const char *cmd, kvqt_modelopts *mo, kvqt_cacheopts *co,
                    const kvqt_opt *opts, size_t nopts) {
    for (int i = 1; i < argc; i++) {
        if (kvqt_is_help(argv[i]))
            return KVQT_ARGS_HELP;
        int r = co ? kvqt_cacheopts_parse(co, argc, argv, &i, cmd) : 0;
        if (!r)
            r = mo ? kvqt_modelopts_parse(mo, argc, argv, &i, cmd) : 0;
        if (!r)
            r = kvqt_opt_parse(opts, nopts, argc, argv, &i, cmd);
        if (r > 0)
            continue;
        if (r == 0)
            fprintf(stderr, "kvq %s: %s '%s'\n", cmd,
                    argv[i][0] == '-' && argv[i][1] ? "unknown option" : "unexpected argument",
                    argv[i]);
        fprintf(stderr, "(kvq %s --help prints the usage)\n", cmd);
        return KVQT_ARGS_BAD;
    }
    if (co && kvqt_cacheopts_check(co, cmd) != 0) {
        fprintf(stderr, "(kvq %s --help prints the usage)\n", cmd);
        return KVQT_ARGS_BAD;
    }
    return KVQT_ARGS_OK;
}

int kvqt_modelopts_require(const kvqt_modelopts *o, const char *cmd) {
    const char *miss[3];
    size_t n = 0;
    if (!o->model)
        miss[n++] = "--model FILE";
    if (!o->tokenizer)
        miss[n++] = "--tokenizer FILE";
    if (o->with_text && !o->text)
        miss[n++] = "--text FILE";
    if (!n)
        return 0;
    char buf[128] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s",
                 i == 0 ? "" : i + 1 == n ? " and " : ", ", miss[i]);
    return kvqt_usage_error(cmd, "%s %s required", buf, n > 1 ? "are" : "is");
}

/* What is wrong with a file a loader refused: the file's own problems
 * (missing, a directory, unreadable, empty), else the loader's status. */
static void kvqt_load_error(const char *cmd, const char *opt, const char *path, kvq_status st,
                            const char *what, const char *why) {
    if (kvqt_check_input(cmd, opt, path) != 0)
        return;
    struct stat sb;
    long long size = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    if ((st == KVQ_ERR_CORRUPT || st == KVQ_ERR_VERSION) && why && why[0])
        fprintf(stderr, "kvq %s: %s %s: not a valid %s (%lld bytes): %s\n", cmd, opt, path, what,
                size, why);
    else if (st == KVQ_ERR_CORRUPT || st == KVQ_ERR_VERSION)
        fprintf(stderr, "kvq %s: %s %s: not a valid %s (%lld bytes): %s\n", cmd, opt, path, what,
                size, kvq_strerror(st));
    else
        fprintf(stderr, "kvq %s: %s %s: cannot load the %s: %s\n", cmd, opt, path, what,
                kvq_strerror(st));
}

int kvqt_load_model(const char *cmd, const char *path, kvq_model **m) {
    *m = NULL;
    /* the file's own problems first (the loader sizes a directory by
     * ftell, which is not its size) */
    if (kvqt_check_input(cmd, "--model", path) != 0)
        return -1;
    char why[256];
    kvq_status st = kvq_model_load_msg(m, path, NULL, why, sizeof why);
    if (st != KVQ_OK) {
        kvqt_load_error(cmd, "--model", path, st, "llama2.c checkpoint", why);
        return -1;
    }
    return 0;
}

/* The entries of a llama2.c tokenizer file (a u32 max_token_length, then
 * per token a f32 score, a u32 length and the piece), counted as far as
 * they are whole: 0 with *n when the file is exactly n entries, -1 when it
 * cannot be read or does not end at an entry's end. */
static int kvqt_tokenizer_entries(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char b[8];
    long off = 4;
    int rc = size >= 4 && fseek(f, 4, SEEK_SET) == 0 ? 0 : -1;
    while (rc == 0 && off < size) {
        if (size - off < 8 || fread(b, 1, 8, f) != 8) {
            rc = -1;
            break;
        }
        uint32_t len = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 |
                       (uint32_t)b[7] << 24;
        off += 8;
        if ((unsigned long)(size - off) < len || fseek(f, (long)len, SEEK_CUR) != 0) {
            rc = -1;
            break;
        }
        off += (long)len;
        ++*n;
    }
    fclose(f);
    return rc;
}

int kvqt_load_tokenizer(const char *cmd, const char *path, size_t vocab, kvq_tokenizer **t) {
    *t = NULL;
    if (kvqt_check_input(cmd, "--tokenizer", path) != 0)
        return -1;
    char why[256];
    kvq_status st = kvq_tokenizer_load_msg(t, path, vocab, NULL, why, sizeof why);
    /* the loader reads the model's vocab_size entries: a tokenizer of another
     * size is refused here, whether it is shorter or longer */
    size_t have = 0;
    if ((st == KVQ_OK || st == KVQ_ERR_CORRUPT) && kvqt_tokenizer_entries(path, &have) == 0 &&
        have != vocab) {
        kvq_tokenizer_free(*t);
        *t = NULL;
        fprintf(stderr,
                "kvq %s: --tokenizer %s: a tokenizer of %zu tokens, but the model's vocabulary "
                "is %zu tokens: give the tokenizer the model was trained with\n",
                cmd, path, have, vocab);
        return -1;
    }
    if (st == KVQ_OK && kvqt_tokenizer_entries(path, &have) != 0) {
        kvq_tokenizer_free(*t);
        *t = NULL;
        fprintf(stderr,
                "kvq %s: --tokenizer %s: not a valid llama2.c tokenizer: bytes after the "
                "model's %zu tokens that are not a whole token\n", cmd, path, vocab);
        return -1;
    }
    if (st != KVQ_OK) {
        char what[96];
        snprintf(what, sizeof what, "llama2.c tokenizer for the model's %zu tokens", vocab);
        kvqt_load_error(cmd, "--tokenizer", path, st, what, why);
        return -1;
    }
    return 0;
}

/* The non-empty lines of a text (newline and a trailing '\r' cut), copied
 * into separately owned strings; NULL when out of memory. */
static char **kvqt_split_lines(const char *buf, size_t size, size_t *n) {
    size_t cap = 16, cnt = 0;
    char **lines = malloc(cap * sizeof *lines);
    int oom = !lines;
    for (size_t i = 0; !oom && i < size;) {
        const char *nl = memchr(buf + i, '\n', size - i);
        size_t end = nl ? (size_t)(nl - buf) : size, len = end - i;
        if (len > 0 && buf[i + len - 1] == '\r')
            len--;
        if (len > 0 && cnt == cap) {
            char **nv = realloc(lines, 2 * cap * sizeof *lines);
            if (nv)
                lines = nv, cap *= 2;
            oom = !nv;
        }
        if (len > 0 && !oom) {
            char *l = malloc(len + 1);
            if (l) {
                memcpy(l, buf + i, len);
                l[len] = 0;
                lines[cnt++] = l;
            }
            oom = !l;
        }
        i = end + 1;
    }
    if (oom) {
        for (size_t i = 0; lines && i < cnt; i++)
            free(lines[i]);
        free(lines);
        lines = NULL;
        cnt = 0;
    }
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
                            const char *cmd) {
    memset(s, 0, sizeof *s);
    s->model_path = o->model;
    char *text = NULL;
    size_t size = 0;
    /* the text first: it is cheap to check */
    if (o->with_text && kvqt_read_text(cmd, "--text", o->text, &text, &size) != 0)
        return -1;
    if (kvqt_load_model(cmd, o->model, &s->model) != 0) {
        free(text);
        return -1;
    }
    kvq_model_info in;
    kvq_model_get_info(s->model, &in);
    if (kvqt_load_tokenizer(cmd, o->tokenizer, in.vocab_size, &s->tok) != 0) {
        free(text);
        kvqt_model_session_close(s);
        return -1;
    }
    if (!o->with_text)
        return 0;
    s->lines = kvqt_split_lines(text, size, &s->nlines);
    free(text);
    if (!s->lines) {
        fprintf(stderr, "kvq %s: --text %s: out of memory\n", cmd, o->text);
        kvqt_model_session_close(s);
        return -1;
    }
    size_t all = s->nlines;
    kvqt_select_lines(s, o->skip, o->max_lines);
    if (s->nlines < min_lines) {
        if (all == 0)
            fprintf(stderr, "kvq %s: --text %s: no line holds any text\n", cmd, o->text);
        else
            fprintf(stderr,
                    "kvq %s: --text %s: %zu non-empty lines, %zu selected (--skip %zu, "
                    "--max-lines %zu); at least %zu needed\n",
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
