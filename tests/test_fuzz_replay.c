/*
 * test_fuzz_replay.c - replays the committed fuzz corpora without libFuzzer:
 * every file under fuzz/corpus/record/ goes through the record target's
 * property check (fuzz/fuzz_record.c) and every file under
 * fuzz/corpus/segment/ through the segment scanner's (fuzz/fuzz_segment.c).
 * Record files named valid-* must also decode, bad-* must be rejected.
 * The corpus is found next to this source file (the build runs from the
 * repository root) or with --corpus DIR (the folder holding record/ and
 * segment/).
 */
#include "testutil.h"

#define KVQ_FUZZ_NO_ENTRY 1
#include "../fuzz/fuzz_record.c"
#include "../fuzz/fuzz_segment.c"

#include <dirent.h>

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            uint8_t *nb = (uint8_t *)realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    *n = len;
    return buf;
}

/* Runs every file of dir/sub through check; returns the number of files. */
static int replay(const char *dir, const char *sub, int is_record) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    DIR *d = opendir(path);
    if (!d) {
        TU_REPORT(0, "no corpus directory %s", path);
        return 0;
    }
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char fp[1300];
        snprintf(fp, sizeof fp, "%s/%s", path, de->d_name);
        size_t n = 0;
        uint8_t *data = read_all(fp, &n);
        if (!data) {
            TU_REPORT(0, "cannot read %s", fp);
            continue;
        }
        files++;
        int bad = is_record ? kvq_fuzz_record(data, n) : kvq_fuzz_segment(data, n);
        TU_REPORT(!bad, "%s: property violated", fp);
        if (is_record) {
            uint8_t *al = (uint8_t *)malloc(n ? n : 1);
            memcpy(al, data, n);
            kvq__record r;
            kvq_status st = kvq__record_decode(al, n, &r);
            if (strncmp(de->d_name, "valid-", 6) == 0)
                TU_REPORT(st == KVQ_OK, "%s: want a valid record, got %s", fp, kvq_strerror(st));
            if (strncmp(de->d_name, "bad-", 4) == 0)
                TU_REPORT(st != KVQ_OK, "%s: want a rejected record", fp);
            free(al);
        }
        free(data);
    }
    closedir(d);
    return files;
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    /* default: fuzz/corpus next to tests/ (this file's path as compiled) */
    char def[1024];
    snprintf(def, sizeof def, "%s", __FILE__);
    char *slash = strrchr(def, '/');
    if (slash)
        snprintf(slash, sizeof def - (size_t)(slash - def), "/../fuzz/corpus");
    else
        snprintf(def, sizeof def, "../fuzz/corpus");
    const char *corpus = def;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--corpus") == 0)
            corpus = argv[i + 1];
    int nr = replay(corpus, "record", 1);
    int ns = replay(corpus, "segment", 0);
    printf("replayed %d record and %d segment inputs from %s\n", nr, ns, corpus);
    CHECK(nr >= 10);
    CHECK(ns >= 3);
    return tu_finish();
}
