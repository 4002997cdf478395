/*
 * osrandom.c - random bytes from the operating system, for identities that
 * must not collide between processes (a cache's namespace in a shared
 * store). getrandom(2) when the kernel has it, else /dev/urandom. Never a
 * seeded generator: two processes started at the same moment, or the same
 * heap address in two processes, must not give the same id.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

static int kvq__urandom(uint8_t *p, size_t n) {
    int fd;
    do
        fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -1;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            close(fd);
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    close(fd);
    return 0;
}

kvq_status kvq__os_random(void *buf, size_t n) {
    uint8_t *p = (uint8_t *)buf;
#if defined(__linux__)
    while (n) {
        ssize_t r = getrandom(p, n, 0); /* blocks only until the pool is first seeded */
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break; /* ENOSYS (old kernel) or seccomp: try the device */
        p += r;
        n -= (size_t)r;
    }
    if (!n)
        return KVQ_OK;
#endif
    return kvq__urandom(p, n) == 0 ? KVQ_OK : KVQ_ERR_IO;
}
