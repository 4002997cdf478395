/* cliargs.c - exit codes, strict numbers and file checks shared by the
 * subcommands of the kvq tool (see cliargs.h). */
#include "cliargs.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kvqt_is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

int kvqt_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "kvq %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(kvq %s --help prints the usage)\n", cmd);
    return KVQT_EXIT_USAGE;
}

int kvqt_usage_hint(const char *cmd) {
    fprintf(stderr, "(kvq %s --help prints the usage)\n", cmd);
    return KVQT_EXIT_USAGE;
}

static void kvqt_file_err(const char *cmd, const char *opt, const char *path, const char *why) {
    fprintf(stderr, "kvq %s: %s%s%s: %s\n", cmd, opt, *opt ? " " : "", path, why);
}

int kvqt_check_input(const char *cmd, const char *opt, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        kvqt_file_err(cmd, opt, path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        kvqt_file_err(cmd, opt, path, "is a directory, not a file");
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvqt_file_err(cmd, opt, path, strerror(errno));
        return -1;
    }
    int c = fgetc(f);
    fclose(f);
    if (c == EOF) {
        kvqt_file_err(cmd, opt, path, "the file is empty");
        return -1;
    }
    return 0;
}

/* The length of the UTF-8 sequence at p (n bytes left), 0 when invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t kvqt_utf8_len(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

int kvqt_read_text(const char *cmd, const char *opt, const char *path, char **buf, size_t *size) {
    *buf = NULL;
    *size = 0;
    if (kvqt_check_input(cmd, opt, path) != 0)
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvqt_file_err(cmd, opt, path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    int err = b ? 0 : ENOMEM;
    while (!err) {
        if (n == cap) {
            char *nb = cap <= ((size_t)1 << 31) ? realloc(b, 2 * cap + 1) : NULL;
            if (!nb) {
                err = ENOMEM;
                break;
            }
            b = nb, cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f))
                err = errno ? errno : EIO;
            break;
        }
    }
    fclose(f);
    if (err) {
        kvqt_file_err(cmd, opt, path,
                      err == ENOMEM ? "too large to read into memory" : strerror(err));
        free(b);
        return -1;
    }
    b[n] = 0;
    const unsigned char *u = (const unsigned char *)b;
    char why[160] = "";
    for (size_t i = 0; i < n && !why[0];) {
        unsigned c = u[i];
        if (c == 0) {
            snprintf(why, sizeof why, "not a text file (a NUL byte at offset %zu)", i);
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') {
            snprintf(why, sizeof why, "not a text file (control character 0x%02x at offset %zu)", c,
                     i);
        } else if (c == 0x7f) {
            snprintf(why, sizeof why, "not a text file (DEL, 0x7f, at offset %zu)", i);
        } else {
            size_t len = kvqt_utf8_len(u + i, n - i);
            if (!len)
                snprintf(why, sizeof why, "not UTF-8 text (byte 0x%02x at offset %zu)", c, i);
            i += len;
        }
    }
    if (why[0]) {
        kvqt_file_err(cmd, opt, path, why);
        free(b);
        return -1;
    }
    *buf = b;
    *size = n;
    return 0;
}

int kvqt_check_output_file(const char *cmd, const char *opt, const char *path) {
    struct stat sb;
    if (!*path) {
        kvqt_file_err(cmd, opt, "''", "an empty file name");
        return -1;
    }
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            kvqt_file_err(cmd, opt, path, "is a directory, not a file");
            return -1;
        }
        if (!S_ISREG(sb.st_mode)) {
            kvqt_file_err(cmd, opt, path, "exists and is not a regular file");
            return -1;
        }
        int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (fd < 0) {
            kvqt_file_err(cmd, opt, path, strerror(errno));
            return -1;
        }
        close(fd);
        return 0;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        kvqt_file_err(cmd, opt, path, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(path);
    return 0;
}

int kvqt_check_output_dir(const char *cmd, const char *opt, const char *path) {
    struct stat sb;
    if (!*path) {
        kvqt_file_err(cmd, opt, "''", "an empty directory name");
        return -1;
    }
    if (stat(path, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            kvqt_file_err(cmd, opt, path, "exists and is not a directory");
            return -1;
        }
    } else if (mkdir(path, 0777) != 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot create the directory: %s", strerror(errno));
        kvqt_file_err(cmd, opt, path, why);
        return -1;
    }
    size_t n = strlen(path) + 64;
    char *probe = malloc(n);
    if (!probe)
        return -1;
    snprintf(probe, n, "%s/.kvq-write-test.%ld", path, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    if (fd < 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot write in the directory: %s", strerror(e));
        kvqt_file_err(cmd, opt, path, why);
        return -1;
    }
    return 0;
}

int kvqt_write_file(const char *cmd, const char *path, kvqt_writer writer, void *ctx) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) {
        fprintf(stderr, "kvq %s: %s: out of memory\n", cmd, path);
        return -1;
    }
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "kvq %s: cannot write %s: %s\n", cmd, tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int rc = writer(f, ctx);
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) != 0 && !e)
        e = errno ? errno : EIO;
    if (rc == 0 && e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (rc != 0 || e != 0) {
        if (e)
            fprintf(stderr, "kvq %s: writing %s failed: %s\n", cmd, path, strerror(e));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}
