/*
 * fuzz_dir.h - for fuzz targets that keep a file store: a private folder
 * base/<stem>-<pid> (base /dev/shm, else /tmp), removed at exit, and a sweep
 * of the folders of processes that are gone (a crashing input skips the
 * atexit cleanup; fork mode crashes many). Static functions only.
 */
#ifndef KVQ_FUZZ_DIR_H
#define KVQ_FUZZ_DIR_H

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Removes the files of dir, then dir. */
__attribute__((unused)) static void kvq_fuzz_rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[700];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Writes base/<stem>-<pid> to dir (n bytes) after removing the folders
 * base/<stem>-<pid2> of processes that are gone. */
__attribute__((unused)) static void kvq_fuzz_dir_make(const char *stem, char *dir, size_t n) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    DIR *d = opendir(base);
    size_t sl = strlen(stem);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        long pid;
        char tail;
        if (strncmp(e->d_name, stem, sl) != 0 || e->d_name[sl] != '-' ||
            sscanf(e->d_name + sl + 1, "%ld%c", &pid, &tail) != 1 || pid <= 0 ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char sub[400];
        snprintf(sub, sizeof sub, "%s/%s", base, e->d_name);
        kvq_fuzz_rm_dir(sub);
    }
    if (d)
        closedir(d);
    snprintf(dir, n, "%s/%s-%ld", base, stem, (long)getpid());
}

#endif
