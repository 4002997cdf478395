/*
 * test_fuzz_replay.c - replays the committed fuzz corpora without libFuzzer:
 * every file under fuzz/corpus/<target>/ goes through that target's property
 * check (fuzz/fuzz_<target>.c, included here with KVQ_FUZZ_NO_ENTRY):
 * page records, store segments, model checkpoints, tokenizers, codec state
 * blobs / calibration files, .npy files, --alloc JSON files, snapshot
 * manifests, file-store directories and Redis replies. Files named valid-* must also be
 * accepted by the reader as they are, and bad-* refused (other names, e.g.
 * edge-*, only need the property). The corpus is found next to this source
 * file (the build runs from the repository root) or with --corpus DIR (the
 * folder holding the target folders).
 */
#include "testutil.h"

#define KVQ_FUZZ_NO_ENTRY 1
#include "../fuzz/fuzz_record.c"
#include "../fuzz/fuzz_segment.c"
#include "../fuzz/fuzz_model.c"
#include "../fuzz/fuzz_tokenizer.c"
#include "../fuzz/fuzz_codec_state.c"
#include "../fuzz/fuzz_npy.c"
#include "../fuzz/fuzz_alloc_json.c"
#include "../fuzz/fuzz_snapshot.c"
#include "../fuzz/fuzz_redis_reply.c"
#include "../fuzz/fuzz_prefix.c"
#include "../fuzz/fuzz_filestore.c"

#include <dirent.h>

/* 1 when the record decoder accepts the bytes (from an aligned copy). */
static int kvq_fuzz_record_accepts(const uint8_t *data, size_t n) {
    uint8_t *al = (uint8_t *)malloc(n ? n : 1);
    if (!al)
        return 0;
    memcpy(al, data, n);
    kvq__record r;
    kvq_status st = kvq__record_decode(al, n, &r);
    free(al);
    return st == KVQ_OK;
}

typedef struct {
    const char *dir;
    int (*check)(const uint8_t *data, size_t size); /* 0: the property holds */
    int (*accepts)(const uint8_t *data, size_t size); /* NULL: no valid-/bad- names */
    int min_files;
} replay_target;

static const replay_target targets[] = {
    {"record", kvq_fuzz_record, kvq_fuzz_record_accepts, 10},
    {"segment", kvq_fuzz_segment, NULL, 3},
    {"model", kvq_fuzz_model, kvq_fuzz_model_accepts, 10},
    {"tokenizer", kvq_fuzz_tokenizer, kvq_fuzz_tokenizer_accepts, 5},
    {"codec_state", kvq_fuzz_codec_state, kvq_fuzz_codec_state_accepts, 10},
    {"npy", kvq_fuzz_npy, kvq_fuzz_npy_accepts, 10},
    {"alloc_json", kvq_fuzz_alloc_json, kvq_fuzz_alloc_json_accepts, 10},
    {"snapshot", kvq_fuzz_snapshot, kvq_fuzz_snapshot_accepts, 5},
    {"redis_reply", kvq_fuzz_redis_reply, NULL, 10}, /* a no-op without hiredis */
    {"prefix", kvq_fuzz_prefix, kvq_fuzz_prefix_accepts, 5},
    {"filestore", kvq_fuzz_filestore, kvq_fuzz_filestore_accepts, 10},
};

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

/* Runs every file of dir/t->dir through t; returns the number of files. */
static int replay(const char *dir, const replay_target *t) {
    char path[1100];
    snprintf(path, sizeof path, "%.1024s/%s", dir, t->dir);
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
        char fp[1400];
        snprintf(fp, sizeof fp, "%s/%s", path, de->d_name);
        size_t n = 0;
        uint8_t *data = read_all(fp, &n);
        if (!data) {
            TU_REPORT(0, "cannot read %s", fp);
            continue;
        }
        files++;
        TU_REPORT(!t->check(data, n), "%s: property violated", fp);
        if (t->accepts) {
            int ok = t->accepts(data, n);
            if (strncmp(de->d_name, "valid-", 6) == 0)
                TU_REPORT(ok, "%s: want it accepted, it was refused", fp);
            if (strncmp(de->d_name, "bad-", 4) == 0)
                TU_REPORT(!ok, "%s: want it refused, it was accepted", fp);
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
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        int n = replay(corpus, &targets[i]);
        printf("replayed %d %s inputs from %s\n", n, targets[i].dir, corpus);
        TU_REPORT(n >= targets[i].min_files, "%s: %d files, want at least %d", targets[i].dir, n,
                  targets[i].min_files);
    }
    return tu_finish();
}
