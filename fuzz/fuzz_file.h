/*
 * fuzz_file.h - for fuzz targets whose reader takes a path: the input bytes
 * as a file, by path. One memfd per process, rewritten for every input and
 * named /proc/self/fd/N (a file under /tmp, removed at exit, where memfd is
 * missing). Included by the targets (static functions, no library code).
 */
#ifndef KVQ_FUZZ_FILE_H
#define KVQ_FUZZ_FILE_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static char kvq_fuzz_tmp_path[64];

static void kvq_fuzz_tmp_remove(void) { unlink(kvq_fuzz_tmp_path); }

/* The path of a file holding exactly buf[0..len), or NULL on failure. */
static const char *kvq_fuzz_as_file(const uint8_t *buf, size_t len) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
#ifdef MFD_CLOEXEC
        fd = memfd_create("kvq-fuzz", MFD_CLOEXEC);
#endif
        if (fd >= 0) {
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        } else {
            snprintf(path, sizeof path, "/tmp/kvq-fuzz-%ld", (long)getpid());
            fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0)
                return NULL;
            snprintf(kvq_fuzz_tmp_path, sizeof kvq_fuzz_tmp_path, "%s", path);
            atexit(kvq_fuzz_tmp_remove);
        }
    }
    if (ftruncate(fd, 0) != 0)
        return NULL;
    size_t off = 0;
    while (off < len) {
        ssize_t w = pwrite(fd, buf + off, len - off, (off_t)off);
        if (w <= 0)
            return NULL;
        off += (size_t)w;
    }
    return path;
}

#endif
