/*
 * inspect.c - `kvq inspect STORE`: lists the keys of a store (a file-store
 * directory, opened readonly, or a redis:// URL) with their sizes, reads
 * every value back (the store verifies its checksums) and decodes the ones
 * that are page records (kvq_record_inspect verifies theirs), printing the
 * header of each: layer, tokens, positions, heads, layout, prefix hash.
 * Ends with a summary line; exits 1 when anything is corrupt or unreadable.
 */
#include "kvq.h"
#include "cliargs.h"
#include "tool.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *key;
    size_t size;
} ins_key;

typedef struct {
    ins_key *keys;
    size_t n, cap;
    int oom;
} ins_list;

static int ins_collect(void *ctx, const char *key, size_t size) {
    ins_list *l = (ins_list *)ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        ins_key *k = realloc(l->keys, cap * sizeof *k);
        if (!k) {
            l->oom = 1;
            return 1;
        }
        l->keys = k;
        l->cap = cap;
    }
    l->keys[l->n].key = strdup(key);
    if (!l->keys[l->n].key) {
        l->oom = 1;
        return 1;
    }
    l->keys[l->n].size = size;
    l->n++;
    return 0;
}

static int ins_cmp(const void *a, const void *b) {
    return strcmp(((const ins_key *)a)->key, ((const ins_key *)b)->key);
}

/* Text: non-printable bytes as \xNN. */
static void ins_text(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || c == '\\')
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

static void ins_json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The start of every segment entry (docs/record-format.md): the magic
 * "KVQE" and version 1. */
static const unsigned char ins_seg_start[5] = {'K', 'V', 'Q', 'E', 1};

/* 1 when the segment file dir/name begins as a segment does: empty, the
 * start of an entry header (whole, or cut short by a crash), or zero bytes
 * (a file the filesystem grew but never filled); else 0 with the message
 * printed. The store itself calls a file that begins otherwise a corrupt
 * entry, or, when it is shorter than a header, a torn tail: neither says
 * that the file is no segment at all. */
static int ins_seg_begins(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = malloc(n);
    if (!path)
        return 0;
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    unsigned char b[sizeof ins_seg_start];
    size_t got = f ? fread(b, 1, sizeof b, f) : 0;
    if (f)
        fclose(f);
    int zero = 1, ok = 1;
    for (size_t i = 0; i < got; i++)
        zero &= b[i] == 0;
    if (f && !zero && memcmp(b, ins_seg_start, got) != 0) {
        char hex[3 * sizeof b + 1] = "";
        for (size_t i = 0; i < got; i++)
            snprintf(hex + strlen(hex), sizeof hex - strlen(hex), "%s%02x", i ? " " : "", b[i]);
        fprintf(stderr, "kvq inspect: %s is not a kvq segment: it begins with the bytes %s, not "
                        "an entry (magic \"KVQE\", version 1; docs/record-format.md)\n", path, hex);
        ok = 0;
    }
    free(path);
    return ok;
}

/* A local store (DIR or file:DIR[?options]) must be a directory holding
 * segment files (seg-NNNNNN.log, docs/record-format.md); a missing path is
 * left to the store's own message. 1, or 0 with the message printed.
 * *junk counts the segment files that do not begin as a segment does
 * (each named on stderr): the store can still be listed, but it is not
 * sound. */
static int ins_is_store(const char *where, size_t *junk) {
    const char *p = strncmp(where, "file:", 5) == 0 ? where + 5 : where;
    size_t n = strcspn(p, "?");
    char *dir = malloc(n + 1);
    if (!dir)
        return 0;
    memcpy(dir, p, n);
    dir[n] = 0;
    struct stat sb;
    int ok = 1;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvq inspect: %s is not a directory (a file store is a directory of "
                        "seg-NNNNNN.log files)\n", dir);
        ok = 0;
    } else if (stat(dir, &sb) == 0) {
        DIR *d = opendir(dir);
        int segs = 0;
        size_t other = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            /* seg-<at least six digits>.log or .tmp (ids past 999999 are longer) */
            const char *nm = e->d_name, *q = nm + 4;
            size_t nd = strspn(q, "0123456789");
            if (strncmp(nm, "seg-", 4) == 0 && nd >= 6 && nd <= 20 &&
                (!strcmp(q + nd, ".log") || !strcmp(q + nd, ".tmp"))) {
                segs++;
                *junk += !ins_seg_begins(dir, nm);
            } else {
                other++;
            }
        }
        if (d)
            closedir(d);
        if (!d) {
            fprintf(stderr, "kvq inspect: %s: %s\n", dir, strerror(errno));
            ok = 0;
        } else if (!segs) {
            fprintf(stderr, "kvq inspect: %s is not a kvq store: it holds no segment files "
                            "(seg-NNNNNN.log)%s\n", dir,
                    other ? "" : "; it is empty (a store nothing was written to has none either)");
            ok = 0;
        }
    }
    free(dir);
    return ok;
}

static void ins_usage(FILE *f) {
    fprintf(f, "usage: kvq inspect DIR|file:DIR|redis://HOST[:PORT][/NAMESPACE] [--prefix P] "
               "[--json]\n"
               "  Lists the keys of a store with their sizes, verifies every value and\n"
               "  decodes page records (layer, tokens, positions, layout, prefix hash).\n"
               "  A directory is opened readonly. Exit status 1 when anything is corrupt.\n");
}

int kvq_tool_inspect(int argc, char **argv) {
    const char *where = NULL, *prefix = "";
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--prefix") == 0) {
            if (i + 1 >= argc)
                return kvqt_usage_error("inspect", "--prefix needs a value");
            prefix = argv[++i];
        } else if (kvqt_is_help(argv[i])) {
            ins_usage(stdout);
            return KVQT_EXIT_OK;
        } else if (argv[i][0] == '-') {
            return kvqt_usage_error("inspect", "unknown option '%s'", argv[i]);
        } else if (where) {
            return kvqt_usage_error("inspect", "one store at a time: '%s' after '%s'", argv[i],
                                    where);
        } else {
            where = argv[i];
        }
    }
    if (!where || !*where)
        return kvqt_usage_error("inspect", "which store? give DIR, file:DIR or redis://HOST:PORT");
    if (kvqt_check_store_url("inspect", "", where) != 0)
        return KVQT_EXIT_FAIL; /* a store kvq cannot open, as a missing directory */
    size_t junk = 0;
    if (strncmp(where, "redis://", 8) != 0 && !ins_is_store(where, &junk))
        return KVQT_EXIT_FAIL;
    /* directories are opened readonly: no repair, and a shared lock */
    size_t wl = strlen(where);
    char *url = malloc(wl + 32);
    if (!url)
        return 1;
    if (strncmp(where, "redis://", 8) == 0)
        snprintf(url, wl + 32, "%s", where);
    else if (strncmp(where, "file:", 5) == 0)
        snprintf(url, wl + 32, "%s%sreadonly=1", where, strchr(where, '?') ? "&" : "?");
    else
        snprintf(url, wl + 32, "file:%s?readonly=1", where);
    kvq_store *s = NULL;
    char err[512];
    kvq_status st = kvq_store_open(&s, url, NULL, err, sizeof err);
    free(url);
    if (st != KVQ_OK) {
        const char *d = strncmp(where, "file:", 5) == 0 ? where + 5 : where;
        if (!strncmp(err, d, strcspn(d, "?"))) /* the message names the directory */
            fprintf(stderr, "kvq inspect: %s\n", err);
        else
            fprintf(stderr, "kvq inspect: %s: %s\n", where, err);
        return 1;
    }
    ins_list l = {NULL, 0, 0, 0};
    st = kvq_store_list(s, prefix, ins_collect, &l);
    if (st != KVQ_OK || l.oom) {
        fprintf(stderr, "kvq inspect: listing %s failed: %s\n", where,
                l.oom ? "out of memory" : kvq_store_last_error(s));
        for (size_t i = 0; i < l.n; i++)
            free(l.keys[i].key);
        free(l.keys);
        kvq_store_close(s);
        return 1;
    }
    if (l.n)
        qsort(l.keys, l.n, sizeof *l.keys, ins_cmp);
    /* Redis SCAN may list a key twice */
    size_t w = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (w > 0 && strcmp(l.keys[w - 1].key, l.keys[i].key) == 0) {
            free(l.keys[i].key);
            continue;
        }
        l.keys[w++] = l.keys[i];
    }
    l.n = w;

    /* what the store found when it opened, before our reads add to it */
    kvq_store_metrics m0;
    memset(&m0, 0, sizeof m0);
    if (kvq_store_stats(s, &m0) != KVQ_OK)
        fprintf(stderr, "kvq inspect: %s: no statistics: %s\n", where, kvq_store_last_error(s));
    size_t n_ok = 0, n_corrupt = 0, n_unsupported = 0, n_other = 0, n_errors = 0, n_gone = 0;
    if (json) {
        printf("{\"store\": ");
        ins_json_str(stdout, where, strlen(where));
        printf(", \"keys\": [");
    }
    for (size_t i = 0; i < l.n; i++) {
        const char *key = l.keys[i].key;
        void *data = NULL;
        size_t size = 0;
        st = kvq_store_get(s, key, &data, &size);
        const char *kind, *status;
        char msg[300] = "";
        kvq_record_info info;
        int have_info = 0;
        if (st == KVQ_ERR_RANGE) { /* deleted since the listing */
            n_gone++;
            continue;
        }
        if (st != KVQ_OK) {
            kind = "value";
            status = st == KVQ_ERR_CORRUPT ? "corrupt" : "error";
            snprintf(msg, sizeof msg, "%s", kvq_store_last_error(s));
            if (st == KVQ_ERR_CORRUPT)
                n_corrupt++;
            else
                n_errors++;
            size = l.keys[i].size;
        } else if (size >= 4 && memcmp(data, "KVQR", 4) == 0) {
            kind = "record";
            kvq_status rs = kvq_record_inspect(data, size, &info);
            if (rs == KVQ_OK) {
                status = "ok";
                have_info = 1;
                n_ok++;
            } else if (rs == KVQ_ERR_VERSION) {
                status = "unsupported";
                snprintf(msg, sizeof msg, "record format version %u is not supported",
                         size >= 6 ? (unsigned)((const unsigned char *)data)[4] |
                                         ((unsigned)((const unsigned char *)data)[5] << 8)
                                   : 0u);
                n_unsupported++;
            } else {
                status = "corrupt";
                snprintf(msg, sizeof msg, "not a valid page record (%s)", kvq_strerror(rs));
                n_corrupt++;
            }
        } else {
            kind = "value";
            status = "ok";
            n_other++;
        }
        if (json) {
            printf("%s\n  {\"key\": ", i ? "," : "");
            ins_json_str(stdout, key, strlen(key));
            printf(", \"size\": %zu, \"kind\": \"%s\", \"status\": \"%s\"", size, kind, status);
            if (msg[0]) {
                printf(", \"error\": ");
                ins_json_str(stdout, msg, strlen(msg));
            }
            if (have_info) {
                printf(
                    ", \"record\": {\"version\": %u, \"cache_id\": \"0x%016llx\", \"layer\": %u, "
                    "\"page_tokens\": %u, \"n_tokens\": %u, \"pos_min\": %d, \"pos_max\": %d, "
                    "\"n_kv_heads\": %u, \"head_dim\": %u, \"block_bytes\": %zu, "
                    "\"prefix_hash\": \"0x%016llx\", \"layout\": ",
                    info.version, (unsigned long long)info.cache_id, info.layer, info.page_tokens,
                    info.n_tokens, info.pos_min, info.pos_max, info.n_kv_heads, info.head_dim,
                    info.block_len, (unsigned long long)info.prefix_hash);
                ins_json_str(stdout, info.layout, info.layout_len);
                printf("}");
            }
            printf("}");
        } else {
            ins_text(stdout, key, strlen(key));
            printf("  %zu bytes  %s %s", size, kind, status);
            if (have_info) {
                printf(": layer %u, %u/%u tokens, positions ", info.layer, info.n_tokens,
                       info.page_tokens);
                if (info.n_tokens)
                    printf("%d..%d", info.pos_min, info.pos_max);
                else
                    printf("none");
                printf(", %u heads x %u, block %zu B, cache 0x%016llx, prefix 0x%016llx, layout \"",
                       info.n_kv_heads, info.head_dim, info.block_len,
                       (unsigned long long)info.cache_id, (unsigned long long)info.prefix_hash);
                ins_text(stdout, info.layout, info.layout_len);
                printf("\"");
            }
            if (msg[0])
                printf(": %s", msg);
            printf("\n");
        }
        kvq_store_free_buf(s, data);
    }
    size_t n_keys = l.n - n_gone;
    int bad = n_corrupt > 0 || n_errors > 0 || m0.corrupt_skipped > 0 || junk > 0;
    if (json) {
        printf("%s],\n \"summary\": {\"keys\": %zu, \"records_ok\": %zu, \"corrupt\": %zu, "
               "\"unsupported\": %zu, \"other_values\": %zu, \"errors\": %zu, "
               "\"torn_tails\": %llu, \"corrupt_skipped_at_open\": %llu, \"live_bytes\": %llu, "
               "\"stored_bytes\": %llu, \"files_not_segments\": %zu, \"ok\": %s}}\n",
               l.n ? "\n" : "", n_keys, n_ok, n_corrupt, n_unsupported, n_other, n_errors,
               (unsigned long long)m0.torn_tails, (unsigned long long)m0.corrupt_skipped,
               (unsigned long long)m0.live_bytes, (unsigned long long)m0.stored_bytes, junk,
               bad ? "false" : "true");
    } else {
        printf("%zu keys: %zu records ok, %zu corrupt, %zu unsupported, %zu other values, "
               "%zu read errors; store: %llu torn tails, %llu corrupt entries skipped at open\n",
               n_keys, n_ok, n_corrupt, n_unsupported, n_other, n_errors,
               (unsigned long long)m0.torn_tails, (unsigned long long)m0.corrupt_skipped);
    }
    fflush(stdout);
    if (bad) /* stdout has the detail; stderr says why the status is 1 */
        fprintf(stderr, "kvq inspect: %s is not sound: %zu corrupt values, %zu read errors, %llu "
                        "corrupt entries skipped at open, %zu files that are not segments\n",
                where, n_corrupt, n_errors, (unsigned long long)m0.corrupt_skipped, junk);
    for (size_t i = 0; i < l.n; i++)
        free(l.keys[i].key);
    free(l.keys);
    kvq_store_close(s);
    return bad ? 1 : 0;
}
