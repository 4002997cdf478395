/*
 * fuzz_filestore.c - libFuzzer target for the file store as a whole
 * (src/tier/store_file.c): a directory of arbitrary segment files opened,
 * listed and read through the public kvq_store_* calls.
 *
 * Input: one flags byte, then up to 8 files, each a name byte (an index
 * into kvq_fuzz_fs_names: segment files with small, 6-digit, 7-digit and
 * past-2^32 ids, the largest id there is, compaction .tmp leftovers, names
 * the store must refuse or leave alone), a 16-bit little-endian length and
 * that many bytes (cut to what is left). A name given twice keeps the later
 * bytes. Flags bit 0: the checksums of every entry whose lengths fit are
 * recomputed first (walking each file from 0), so mutations get past them.
 *
 * The files go into a fresh directory (under /dev/shm when there is one),
 * which is opened readonly, then read-write (4 KiB segments, compaction
 * whenever dead bytes are the larger half), then readonly again, and
 * removed. Properties:
 * - no crash, no sanitizer report;
 * - the readonly and the read-write open agree (both fail, or both list the
 *   same keys with the same values), and the read-write open's repairs
 *   change nothing that a later open lists;
 * - every listed key can be read, its size is the listed one, and its bytes
 *   are those of a put entry of that key with valid checksums somewhere in
 *   the input; the record count of the statistics is the number listed;
 * - a key that has such an entry in the input but is not listed is absent
 *   (KVQ_ERR_RANGE);
 * - a put and a del on the read-write store either succeed or are refused
 *   with KVQ_ERR_NOSPACE (no segment id left); what succeeded is what the
 *   next open finds, and nothing else changed.
 * tests/test_fuzz_replay.c replays fuzz/corpus/filestore/ through it; the
 * valid-* files there must open readonly with nothing torn or corrupt and
 * every key readable, the bad-* ones must not.
 */
#include "kvq.h"
#include "tier/store_impl.h"
#include "fuzz_seg.h"
#include "fuzz_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVQ_FUZZ_FS_MAX_FILES 8

static const char *const kvq_fuzz_fs_names[16] = {
    "seg-000001.log",
    "seg-000002.log",
    "seg-000003.log",
    "seg-999999.log",
    "seg-1000000.log",
    "seg-4294967295.log",
    "seg-4294967296.log",
    "seg-18446744073709551614.log", /* the largest id: no segment after it */
    "seg-000002.tmp",               /* compaction leftovers: removed by a writer */
    "seg-1000001.tmp",
    "seg-4294967294.log",
    "seg-000000.log",               /* ids no kvq writes: the open fails */
    "seg-18446744073709551615.log",
    "seg-1.log",                    /* not segment files: left alone */
    "seg-0000004.log",
    "notes.txt",
};

typedef struct kvq_fuzz_fs_file {
    int name;
    uint8_t *bytes;
    size_t len;
} kvq_fuzz_fs_file;

typedef struct kvq_fuzz_fs_input {
    kvq_fuzz_fs_file files[KVQ_FUZZ_FS_MAX_FILES];
    int n;
} kvq_fuzz_fs_input;

/* One listed key and what a get returned for it. */
typedef struct kvq_fuzz_fs_kv {
    char *key;
    size_t listed;
    uint8_t *val;
    size_t size;
} kvq_fuzz_fs_kv;

typedef struct kvq_fuzz_fs_list {
    kvq_fuzz_fs_kv *items;
    size_t n, cap;
    int oom;
} kvq_fuzz_fs_list;

static char kvq_fuzz_fs_base[128];

static void kvq_fuzz_fs_cleanup(void) {
    char d[160];
    snprintf(d, sizeof d, "%s/d", kvq_fuzz_fs_base);
    kvq_fuzz_rm_dir(d);
    rmdir(kvq_fuzz_fs_base);
}

/* The per-process folder the store directories go in, or NULL. */
static const char *kvq_fuzz_fs_basedir(void) {
    if (kvq_fuzz_fs_base[0])
        return kvq_fuzz_fs_base;
    struct stat sb;
    const char *root = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(kvq_fuzz_fs_base, sizeof kvq_fuzz_fs_base, "%s/kvq-fuzz-fs.XXXXXX", root);
    if (!mkdtemp(kvq_fuzz_fs_base)) {
        snprintf(kvq_fuzz_fs_base, sizeof kvq_fuzz_fs_base, "/tmp/kvq-fuzz-fs.XXXXXX");
        if (!mkdtemp(kvq_fuzz_fs_base)) {
            kvq_fuzz_fs_base[0] = 0;
            return NULL;
        }
    }
    atexit(kvq_fuzz_fs_cleanup);
    return kvq_fuzz_fs_base;
}

/* Splits the input into files (copies; a later file of the same name
 * replaces the earlier one). */
static void kvq_fuzz_fs_split(const uint8_t *data, size_t size, kvq_fuzz_fs_input *in) {
    memset(in, 0, sizeof *in);
    size_t off = 1;
    while (in->n < KVQ_FUZZ_FS_MAX_FILES && size >= 3 && off <= size - 3) {
        int name = data[off] & 15;
        size_t len = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
        off += 3;
        if (len > size - off)
            len = size - off;
        kvq_fuzz_fs_file *f = NULL;
        for (int i = 0; i < in->n; i++)
            if (in->files[i].name == name)
                f = &in->files[i];
        if (!f)
            f = &in->files[in->n++];
        free(f->bytes);
        f->name = name;
        f->bytes = (uint8_t *)malloc(len ? len : 1);
        f->len = f->bytes ? len : 0;
        if (f->bytes && len)
            memcpy(f->bytes, data + off, len);
        off += len;
    }
}

static void kvq_fuzz_fs_input_free(kvq_fuzz_fs_input *in) {
    for (int i = 0; i < in->n; i++)
        free(in->files[i].bytes);
    in->n = 0;
}

/* Writes the files into a fresh directory; its path, or NULL. */
static const char *kvq_fuzz_fs_write(const kvq_fuzz_fs_input *in, char *dir, size_t dn) {
    const char *base = kvq_fuzz_fs_basedir();
    if (!base)
        return NULL;
    snprintf(dir, dn, "%s/d", base);
    kvq_fuzz_rm_dir(dir);
    if (mkdir(dir, 0755) != 0)
        return NULL;
    for (int i = 0; i < in->n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, kvq_fuzz_fs_names[in->files[i].name]);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return NULL;
        size_t off = 0;
        while (off < in->files[i].len) {
            ssize_t w = write(fd, in->files[i].bytes + off, in->files[i].len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
        if (off != in->files[i].len)
            return NULL;
    }
    return dir;
}

/* 1 when some file of the input holds a put entry of key with exactly
 * these value bytes and valid checksums. */
static int kvq_fuzz_fs_in_input(const kvq_fuzz_fs_input *in, const char *key, size_t klen,
                                const uint8_t *val, size_t vlen) {
    for (int i = 0; i < in->n; i++) {
        const uint8_t *b = in->files[i].bytes;
        size_t len = in->files[i].len;
        uint64_t elen = (uint64_t)KVQ__SEG_HDR + klen + vlen;
        for (size_t off = 0; len >= elen && off <= len - elen; off++) {
            kvq__seg_hdr h;
            if (memcmp(b + off, KVQ__SEG_MAGIC, 4) != 0 || !kvq__seg_hdr_read(b + off, &h) ||
                h.op != KVQ__SEG_PUT || h.klen != klen || h.vlen != vlen ||
                memcmp(b + off + KVQ__SEG_HDR, key, klen) != 0 ||
                (vlen && memcmp(b + off + KVQ__SEG_HDR + klen, val, vlen) != 0))
                continue;
            uint32_t crc = kvq__crc32c(0, b + off, 12);
            crc = kvq__crc32c(crc, b + off + KVQ__SEG_HDR, (size_t)elen - KVQ__SEG_HDR);
            if (crc == h.crc)
                return 1;
        }
    }
    return 0;
}

static int kvq_fuzz_fs_collect(void *ctx, const char *key, size_t size) {
    kvq_fuzz_fs_list *l = (kvq_fuzz_fs_list *)ctx;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        kvq_fuzz_fs_kv *a = (kvq_fuzz_fs_kv *)realloc(l->items, nc * sizeof *a);
        if (!a) {
            l->oom = 1;
            return 1;
        }
        l->items = a;
        l->cap = nc;
    }
    kvq_fuzz_fs_kv *e = &l->items[l->n];
    e->key = strdup(key);
    if (!e->key) {
        l->oom = 1;
        return 1;
    }
    e->listed = size;
    e->val = NULL;
    e->size = 0;
    l->n++;
    return 0;
}

static void kvq_fuzz_fs_list_free(kvq_fuzz_fs_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->items[i].key);
        free(l->items[i].val);
    }
    free(l->items);
    memset(l, 0, sizeof *l);
}

static const kvq_fuzz_fs_kv *kvq_fuzz_fs_find(const kvq_fuzz_fs_list *l, const char *key) {
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->items[i].key, key) == 0)
            return &l->items[i];
    return NULL;
}

/* Lists every key of s and gets each one. 0 when every listed key reads
 * back with its listed size and the record count matches; 2 when memory
 * ran out (no verdict); 1 otherwise. */
static int kvq_fuzz_fs_read_all(kvq_store *s, kvq_fuzz_fs_list *l) {
    memset(l, 0, sizeof *l);
    kvq_status st = kvq_store_list(s, "", kvq_fuzz_fs_collect, l);
    if (l->oom || st == KVQ_ERR_NOMEM)
        return 2;
    if (st != KVQ_OK)
        return 1;
    for (size_t i = 0; i < l->n; i++) {
        void *d = NULL;
        size_t n = 0;
        st = kvq_store_get(s, l->items[i].key, &d, &n);
        if (st == KVQ_ERR_NOMEM)
            return 2;
        if (st != KVQ_OK || !d || n != l->items[i].listed) {
            kvq_store_free_buf(s, d);
            return 1;
        }
        l->items[i].val = (uint8_t *)malloc(n ? n : 1);
        if (!l->items[i].val) {
            kvq_store_free_buf(s, d);
            return 2;
        }
        memcpy(l->items[i].val, d, n);
        l->items[i].size = n;
        kvq_store_free_buf(s, d);
    }
    kvq_store_metrics m;
    if (kvq_store_stats(s, &m) != KVQ_OK || m.records != l->n)
        return 1;
    return 0;
}

/* 1 when a and b hold the same keys with the same values. */
static int kvq_fuzz_fs_same(const kvq_fuzz_fs_list *a, const kvq_fuzz_fs_list *b) {
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        const kvq_fuzz_fs_kv *e = kvq_fuzz_fs_find(b, a->items[i].key);
        if (!e || e->size != a->items[i].size ||
            (e->size && memcmp(e->val, a->items[i].val, e->size) != 0))
            return 0;
    }
    return 1;
}

/* Opens dir with the given query ("" or "readonly=1"). */
static kvq_status kvq_fuzz_fs_open(kvq_store **s, const char *dir, const char *query) {
    char url[300];
    snprintf(url, sizeof url, "file:%s%s%s", dir, *query ? "?" : "", query);
    *s = NULL;
    return kvq_store_open(s, url, NULL, NULL, 0);
}

/* 1 when every listed value is a checksummed put of its key in the input,
 * and every key with such a put (and no NUL) that is not listed is absent. */
static int kvq_fuzz_fs_provenance(kvq_store *s, const kvq_fuzz_fs_input *in,
                                  const kvq_fuzz_fs_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        const kvq_fuzz_fs_kv *e = &l->items[i];
        if (!kvq_fuzz_fs_in_input(in, e->key, strlen(e->key), e->val, e->size))
            return 0;
    }
    char key[KVQ__STORE_MAX_KEY + 1];
    for (int i = 0; i < in->n; i++) {
        const uint8_t *b = in->files[i].bytes;
        size_t len = in->files[i].len;
        for (size_t off = 0; len >= KVQ__SEG_HDR && off <= len - KVQ__SEG_HDR; off++) {
            kvq__seg_hdr h;
            if (memcmp(b + off, KVQ__SEG_MAGIC, 4) != 0 || !kvq__seg_hdr_read(b + off, &h) ||
                h.op != KVQ__SEG_PUT || (uint64_t)KVQ__SEG_HDR + h.klen + h.vlen > len - off)
                continue;
            memcpy(key, b + off + KVQ__SEG_HDR, h.klen);
            key[h.klen] = 0;
            if (strlen(key) != h.klen || kvq_fuzz_fs_find(l, key))
                continue;
            void *d = NULL;
            size_t n = 0;
            kvq_status st = kvq_store_get(s, key, &d, &n);
            kvq_store_free_buf(s, d);
            if (st != KVQ_ERR_RANGE)
                return 0;
        }
    }
    return 1;
}

/* The checks on one directory; 0 when every property holds. */
static int kvq_fuzz_fs_check(const kvq_fuzz_fs_input *in, const char *dir) {
    int bad = 0;
    kvq_store *s = NULL;
    kvq_fuzz_fs_list ro, rw, again;
    memset(&ro, 0, sizeof ro);
    memset(&rw, 0, sizeof rw);
    memset(&again, 0, sizeof again);
    kvq_status st_ro = kvq_fuzz_fs_open(&s, dir, "readonly=1");
    if (st_ro == KVQ_OK) {
        int r = kvq_fuzz_fs_read_all(s, &ro);
        if (r == 0 && !kvq_fuzz_fs_provenance(s, in, &ro))
            r = 1;
        kvq_store_close(s);
        if (r) {
            bad = r == 1;
            goto out;
        }
    }
    /* small segments and compaction at any size: puts roll over and compact */
    kvq_status st_rw = kvq_fuzz_fs_open(&s, dir, "segment_bytes=4096&compact_min=1");
    if ((st_ro == KVQ_OK) != (st_rw == KVQ_OK)) {
        bad = st_ro != KVQ_ERR_NOMEM && st_rw != KVQ_ERR_NOMEM;
        kvq_store_close(s);
        goto out;
    }
    if (st_rw != KVQ_OK)
        goto out;
    int r = kvq_fuzz_fs_read_all(s, &rw);
    if (r == 0 && !kvq_fuzz_fs_same(&ro, &rw))
        r = 1;
    /* a put of a key not in the input and a del of the first listed key */
    static const char newkey[] = "\x7f" "fuzz-new";
    const uint8_t newval[3] = {0xa5, 0x00, 0x5a};
    int put_ok = 0, del_ok = 0;
    if (r == 0) {
        kvq_status st = kvq_store_put(s, newkey, newval, sizeof newval);
        put_ok = st == KVQ_OK;
        if (st != KVQ_OK && st != KVQ_ERR_NOSPACE)
            r = st == KVQ_ERR_NOMEM ? 2 : 1;
    }
    if (r == 0 && rw.n > 0 && strcmp(rw.items[0].key, newkey) != 0) {
        kvq_status st = kvq_store_del(s, rw.items[0].key);
        del_ok = st == KVQ_OK;
        if (st != KVQ_OK && st != KVQ_ERR_NOSPACE)
            r = st == KVQ_ERR_NOMEM ? 2 : 1;
    }
    kvq_store_close(s);
    if (r) {
        bad = r == 1;
        goto out;
    }
    /* what the next open must find */
    if (kvq_fuzz_fs_open(&s, dir, "readonly=1") != KVQ_OK) {
        bad = 1;
        goto out;
    }
    r = kvq_fuzz_fs_read_all(s, &again);
    kvq_store_close(s);
    if (r) {
        bad = r == 1;
        goto out;
    }
    const kvq_fuzz_fs_kv *e = kvq_fuzz_fs_find(&again, newkey);
    const kvq_fuzz_fs_kv *was = kvq_fuzz_fs_find(&rw, newkey);
    if (put_ok && (!e || e->size != sizeof newval || memcmp(e->val, newval, sizeof newval) != 0))
        bad = 1;
    if (!put_ok && (e ? !was || was->size != e->size || memcmp(was->val, e->val, e->size) : !!was))
        bad = 1;
    size_t want = rw.n + (size_t)(put_ok && !was) - (size_t)del_ok;
    if (again.n != want)
        bad = 1;
    for (size_t i = 0; i < rw.n && !bad; i++) {
        const kvq_fuzz_fs_kv *a = &rw.items[i];
        if (strcmp(a->key, newkey) == 0)
            continue;
        const kvq_fuzz_fs_kv *b = kvq_fuzz_fs_find(&again, a->key);
        if (i == 0 && del_ok)
            bad = b != NULL;
        else
            bad = !b || b->size != a->size || (a->size && memcmp(a->val, b->val, a->size) != 0);
    }
out:
    kvq_fuzz_fs_list_free(&ro);
    kvq_fuzz_fs_list_free(&rw);
    kvq_fuzz_fs_list_free(&again);
    return bad;
}

static int kvq_fuzz_filestore(const uint8_t *data, size_t size) {
    kvq_fuzz_fs_input in;
    kvq_fuzz_fs_split(data, size, &in);
    if (size && (data[0] & 1))
        for (int i = 0; i < in.n; i++)
            kvq_fuzz_seg_fix(in.files[i].bytes, in.files[i].len);
    char dir[200] = "";
    int bad = 0;
    if (kvq_fuzz_fs_write(&in, dir, sizeof dir))
        bad = kvq_fuzz_fs_check(&in, dir);
    if (dir[0])
        kvq_fuzz_rm_dir(dir);
    kvq_fuzz_fs_input_free(&in);
    return bad;
}

/* 1 when the input opens readonly with nothing torn or corrupt and every
 * listed key reads back (the replay's valid-* / bad-* check). */
static int kvq_fuzz_filestore_accepts(const uint8_t *data, size_t size) {
    kvq_fuzz_fs_input in;
    kvq_fuzz_fs_split(data, size, &in);
    char dir[200] = "";
    int ok = 0;
    kvq_store *s = NULL;
    if (kvq_fuzz_fs_write(&in, dir, sizeof dir) &&
        kvq_fuzz_fs_open(&s, dir, "readonly=1") == KVQ_OK) {
        kvq_fuzz_fs_list l;
        kvq_store_metrics m;
        ok = kvq_fuzz_fs_read_all(s, &l) == 0 && kvq_store_stats(s, &m) == KVQ_OK &&
             m.torn_tails == 0 && m.corrupt_skipped == 0;
        kvq_fuzz_fs_list_free(&l);
        kvq_store_close(s);
    }
    if (dir[0])
        kvq_fuzz_rm_dir(dir);
    kvq_fuzz_fs_input_free(&in);
    return ok;
}

#ifndef KVQ_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (kvq_fuzz_filestore(data, size))
        abort();
    return 0;
}
#endif
