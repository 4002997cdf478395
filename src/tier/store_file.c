/*
 * store_file.c - the file store: one directory of append-only segment files
 * (seg-000001.log, ...) of checksummed entries (store_impl.h has the entry
 * layout, docs/record-format.md draws it), and an in-memory index from key
 * to the newest put.
 *
 * Segment names: "seg-" + the id in decimal, zero-padded to at least six
 * digits, + ".log" (".tmp" while compaction writes it): seg-000001.log,
 * seg-1000000.log, seg-4294967296.log. Ids are 64-bit, from 1 to FS_ID_MAX,
 * ordered by value (not by name), and every new segment takes the next id
 * after the largest there is, so an id never wraps: a put that would need
 * a segment past FS_ID_MAX is refused (KVQ_ERR_NOSPACE) before it writes
 * anything. Other spellings of a number (seg-1.log, seg-0000001.log) are
 * not segment files and are left alone; a name of the canonical form whose
 * id is 0 or past FS_ID_MAX (no kvq writes one: an earlier 32-bit kvq
 * wrapped from seg-4294967295.log to seg-000000.log) makes the open fail
 * with KVQ_ERR_CORRUPT rather than leave that file's entries out unsaid.
 *
 * Two opens of one directory, in one process or in several: at most one
 * writer, or any number of readonly opens (flock, below). A readonly open
 * builds its index when it opens and never sees later changes, and a
 * writer's compaction removes the files it reads, so readers and a writer
 * never share the directory: each is refused (KVQ_ERR_IO, at once, with a
 * message naming the kind of open that holds the lock) while the other
 * holds it.
 *
 * Invariants:
 * - Every segment but the last is closed for appends; the last one (the
 *   active segment) ends at segs[last].size, the end of its last good entry.
 * - A put or delete is appended and fdatasync'ed before the call returns and
 *   before the index changes. When the write or the sync fails, the file is
 *   truncated back to its previous end (if that fails too, appends move to a
 *   new segment) and the index is untouched: the old value stays readable.
 * - The index maps each live key to (segment id, offset, entry length,
 *   value length) of its newest put; the entry was checked when it was
 *   written or scanned, and get() checks it again.
 * - live_entry_bytes is the sum of the entry lengths of the indexed puts;
 *   total_bytes the sum of the segment sizes; the difference is dead.
 * - Compaction copies the live entries into new segments (written as .tmp,
 *   synced, renamed), then removes the old segments oldest first, so a crash
 *   at any point leaves a directory whose scan gives the same live keys.
 * - The directory is flock'ed: exclusive for writers, shared for readonly.
 * - segs is sorted by id, ids are unique and next_id is above all of them.
 * - The store holds what the directory holds: a segment file removed from
 *   it under the running store (its open fd would still read it) is
 *   forgotten when a get or del reaches one of its keys, when list or stats
 *   run, or when a put would append to it; its keys are gone (KVQ_ERR_RANGE) and the epoch
 *   (store_impl.h) moves on. An entry past the end of a truncated file is
 *   KVQ_ERR_CORRUPT, like one that fails its checksum. There is no expiry:
 *   a time to live given with a put is ignored.
 */
#include "store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define FS_DEFAULT_SEGMENT ((uint64_t)64 << 20)
#define FS_DEFAULT_COMPACT_MIN ((uint64_t)16 << 20)
#define FS_SCAN_CHUNK ((size_t)1 << 16)
#define FS_ID_MAX (UINT64_MAX - 1) /* so that next_id = id + 1 cannot wrap */
#define FS_NAME_MAX 32             /* "seg-" + up to 20 digits + ".tmp" + NUL */

typedef struct fs_seg {
    uint64_t id;
    int fd;
    uint64_t size;
    int removed; /* scratch of forget_removed */
} fs_seg;

typedef struct fs_slot {
    char *key; /* NULL = empty slot; owned, NUL-terminated */
    uint64_t hash;
    uint64_t seg;      /* segment id */
    uint64_t off, len; /* entry offset and total length */
    uint32_t klen;
    uint32_t vlen;
} fs_slot;

typedef struct fs_store {
    char *dir;
    int dirfd;
    int readonly;
    uint64_t segment_bytes, compact_min;
    fs_seg *segs; /* ascending ids; the last is the active one */
    size_t n_segs, segs_cap;
    uint64_t next_id; /* the id of the next new segment; FS_ID_MAX + 1: none left */
    int need_roll; /* the active segment cannot take appends (bad tail, failed truncate) */
    fs_slot *tab;
    size_t tab_cap, tab_n; /* tab_cap is a power of two */
    uint64_t live_value_bytes, live_entry_bytes, total_bytes;
    uint64_t compact_retry_at; /* no compaction attempt below this total after a failure */
    /* faults */
    int fault_write; /* 0, ENOSPC or EIO */
    long write_budget;
    int fault_read;
    long read_budget;
    long sync_fail_after; /* -1 = none */
} fs_store;

static fs_store *FS(kvq_store *s) { return (fs_store *)s->impl; }

/* ---- entry header ---- */
void kvq__seg_hdr_write(uint8_t *hdr, int op, uint32_t klen, uint32_t vlen, uint32_t crc) {
    memcpy(hdr, KVQ__SEG_MAGIC, 4);
    hdr[4] = KVQ__SEG_VERSION;
    hdr[5] = (uint8_t)op;
    kvq__st16(hdr + 6, (uint16_t)klen);
    kvq__st32(hdr + 8, vlen);
    kvq__st32(hdr + 12, crc);
    kvq__st32(hdr + 16, kvq__crc32c(0, hdr, 16));
}

int kvq__seg_hdr_read(const uint8_t *hdr, kvq__seg_hdr *h) {
    if (memcmp(hdr, KVQ__SEG_MAGIC, 4) != 0 || hdr[4] != KVQ__SEG_VERSION)
        return 0;
    if (kvq__crc32c(0, hdr, 16) != kvq__ld32(hdr + 16))
        return 0;
    int op = hdr[5];
    uint32_t klen = kvq__ld16(hdr + 6), vlen = kvq__ld32(hdr + 8);
    if ((op != KVQ__SEG_PUT && op != KVQ__SEG_DEL) || klen < 1 || klen > KVQ__STORE_MAX_KEY ||
        vlen > KVQ__STORE_MAX_VALUE || (op == KVQ__SEG_DEL && vlen != 0))
        return 0;
    h->op = op;
    h->klen = klen;
    h->vlen = vlen;
    h->crc = kvq__ld32(hdr + 12);
    return 1;
}

/* ---- scanner ---- */
/* CRC of n bytes at off continued from crc, read in chunks through buf. */
static int crc_range(const kvq__seg_reader *rd, uint64_t off, uint64_t n, uint8_t *buf,
                     uint32_t *crc) {
    while (n) {
        size_t c = n < FS_SCAN_CHUNK ? (size_t)n : FS_SCAN_CHUNK;
        if (rd->read(rd->ctx, off, buf, c) != 0)
            return -1;
        *crc = kvq__crc32c(*crc, buf, c);
        off += c;
        n -= c;
    }
    return 0;
}

/* 1 when every byte in [off, size) is zero (a tail the filesystem grew but
 * never filled), 0 when not, -1 on a read error. */
static int all_zero(const kvq__seg_reader *rd, uint64_t off, uint8_t *buf) {
    while (off < rd->size) {
        uint64_t r = rd->size - off;
        size_t c = r < FS_SCAN_CHUNK ? (size_t)r : FS_SCAN_CHUNK;
        if (rd->read(rd->ctx, off, buf, c) != 0)
            return -1;
        for (size_t i = 0; i < c; i++)
            if (buf[i])
                return 0;
        off += c;
    }
    return 1;
}

kvq_status kvq__seg_scan(const kvq__seg_reader *rd, int is_last, const kvq_allocator *alloc,
                         int (*visit)(void *ctx, const kvq__seg_entry *e), void *vctx,
                         kvq__seg_scan_result *res) {
    memset(res, 0, sizeof *res);
    uint8_t *buf = (uint8_t *)kvq__alloc(alloc, FS_SCAN_CHUNK + KVQ__SEG_HDR + KVQ__STORE_MAX_KEY);
    if (!buf)
        return KVQ_ERR_NOMEM;
    uint8_t *hk = buf + FS_SCAN_CHUNK; /* header + key */
    kvq_status st = KVQ_OK;
    uint64_t off = 0, size = rd->size;
    int torn = 0, stop = 0;
    while (off < size) {
        uint64_t rest = size - off;
        kvq__seg_hdr h;
        if (rest < KVQ__SEG_HDR) {
            torn = 1;
            break;
        }
        if (rd->read(rd->ctx, off, hk, KVQ__SEG_HDR) != 0) {
            st = KVQ_ERR_IO;
            break;
        }
        if (!kvq__seg_hdr_read(hk, &h)) {
            int z = is_last ? all_zero(rd, off, buf) : 0;
            if (z < 0)
                st = KVQ_ERR_IO;
            else if (z)
                torn = 1;
            else
                stop = 1;
            break;
        }
        uint64_t len = (uint64_t)KVQ__SEG_HDR + h.klen + h.vlen;
        if (len > rest) {
            torn = 1;
            break;
        }
        if (rd->read(rd->ctx, off + KVQ__SEG_HDR, hk + KVQ__SEG_HDR, h.klen) != 0) {
            st = KVQ_ERR_IO;
            break;
        }
        uint32_t crc = kvq__crc32c(0, hk, 12);
        crc = kvq__crc32c(crc, hk + KVQ__SEG_HDR, h.klen);
        if (crc_range(rd, off + KVQ__SEG_HDR + h.klen, h.vlen, buf, &crc) != 0) {
            st = KVQ_ERR_IO;
            break;
        }
        if (crc != h.crc) {
            if (is_last && off + len == size) {
                torn = 1;
                break;
            }
            res->corrupt++;
            off += len;
            continue;
        }
        kvq__seg_entry e = {h.op, off, len, (const char *)hk + KVQ__SEG_HDR, h.klen, h.vlen};
        if (visit(vctx, &e) != 0) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        off += len;
    }
    res->end = off;
    res->cut_at = size;
    res->appendable = 0;
    if (st == KVQ_OK) {
        if (torn && is_last) {
            res->torn = 1;
            res->cut_at = off;
            res->appendable = 1;
        } else if (torn || stop) {
            res->corrupt++;
        } else {
            res->appendable = 1;
        }
    }
    kvq__free(alloc, buf);
    return st;
}

/* ---- index: open addressing, linear probing, backward-shift deletion ---- */
static uint64_t key_hash(const char *k, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static fs_slot *tab_find(fs_store *f, const char *key, size_t klen, uint64_t h) {
    size_t m = f->tab_cap - 1;
    for (size_t i = (size_t)h & m;; i = (i + 1) & m) {
        fs_slot *e = &f->tab[i];
        if (!e->key)
            return NULL;
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    }
}

static kvq_status tab_grow(kvq_store *s, fs_store *f) {
    size_t cap = f->tab_cap ? f->tab_cap * 2 : 64;
    fs_slot *t = (fs_slot *)kvq__calloc(&s->alloc, cap * sizeof *t);
    if (!t)
        return KVQ_ERR_NOMEM;
    for (size_t j = 0; j < f->tab_cap; j++) {
        if (!f->tab[j].key)
            continue;
        size_t i = (size_t)f->tab[j].hash & (cap - 1);
        while (t[i].key)
            i = (i + 1) & (cap - 1);
        t[i] = f->tab[j];
    }
    kvq__free(&s->alloc, f->tab);
    f->tab = t;
    f->tab_cap = cap;
    return KVQ_OK;
}

/* Points key at a new entry (inserting it if needed, with kcopy as the
 * key's copy when given: taken, or freed when the key is there already). */
static kvq_status tab_set(kvq_store *s, fs_store *f, const char *key, size_t klen, char *kcopy,
                          uint64_t seg, uint64_t off, uint64_t len, uint32_t vlen) {
    uint64_t h = key_hash(key, klen);
    fs_slot *e = f->tab_cap ? tab_find(f, key, klen, h) : NULL;
    if (e) {
        kvq__free(&s->alloc, kcopy);
        f->live_entry_bytes -= e->len;
        f->live_value_bytes -= e->vlen;
    } else {
        if ((f->tab_n + 1) * 10 > f->tab_cap * 7) {
            kvq_status st = tab_grow(s, f);
            if (st != KVQ_OK) {
                kvq__free(&s->alloc, kcopy);
                return st;
            }
        }
        char *k = kcopy ? kcopy : (char *)kvq__alloc(&s->alloc, klen + 1);
        if (!k)
            return KVQ_ERR_NOMEM;
        memcpy(k, key, klen);
        k[klen] = 0;
        size_t m = f->tab_cap - 1, i = (size_t)h & m;
        while (f->tab[i].key)
            i = (i + 1) & m;
        e = &f->tab[i];
        e->key = k;
        e->klen = (uint32_t)klen;
        e->hash = h;
        f->tab_n++;
    }
    e->seg = seg;
    e->off = off;
    e->len = len;
    e->vlen = vlen;
    f->live_entry_bytes += len;
    f->live_value_bytes += vlen;
    return KVQ_OK;
}

static void tab_remove(kvq_store *s, fs_store *f, fs_slot *e) {
    size_t m = f->tab_cap - 1;
    size_t i = (size_t)(e - f->tab);
    f->live_entry_bytes -= e->len;
    f->live_value_bytes -= e->vlen;
    kvq__free(&s->alloc, e->key);
    f->tab_n--;
    /* backward shift: move later members of the probe run into the hole */
    size_t j = i;
    for (;;) {
        f->tab[i].key = NULL;
        for (;;) {
            j = (j + 1) & m;
            if (!f->tab[j].key)
                return;
            size_t home = (size_t)f->tab[j].hash & m;
            /* j may fill i when its home is not cyclically in (i, j] */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
                break;
        }
        f->tab[i] = f->tab[j];
        i = j;
    }
}

/* ---- file helpers with fault injection ---- */
static int fs_pread(fs_store *f, int fd, void *buf, size_t n, uint64_t off) {
    uint8_t *p = (uint8_t *)buf;
    while (n) {
        size_t c = n;
        if (f->fault_read) {
            if (f->read_budget <= 0) {
                errno = EIO;
                return -1;
            }
            if ((long)c > f->read_budget)
                c = (size_t)f->read_budget;
        }
        ssize_t r = pread(fd, p, c, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0) {
            errno = EIO; /* the file is shorter than the index says */
            return -1;
        }
        if (f->fault_read)
            f->read_budget -= r;
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

static int fs_pwrite(fs_store *f, int fd, const void *buf, size_t n, uint64_t off) {
    const uint8_t *p = (const uint8_t *)buf;
    while (n) {
        size_t c = n;
        if (f->fault_write) {
            if (f->write_budget <= 0) {
                errno = f->fault_write;
                return -1;
            }
            if ((long)c > f->write_budget)
                c = (size_t)f->write_budget;
        }
        ssize_t r = pwrite(fd, p, c, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0) {
            errno = EIO;
            return -1;
        }
        if (f->fault_write)
            f->write_budget -= r;
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

static int fs_sync(fs_store *f, int fd) {
    if (f->sync_fail_after == 0) {
        f->sync_fail_after = -1;
        errno = EIO;
        return -1;
    }
    int r;
    do {
        r = fdatasync(fd);
    } while (r != 0 && errno == EINTR);
    if (r == 0 && f->sync_fail_after > 0)
        f->sync_fail_after--;
    return r;
}

static kvq_status io_status(int err) { return err == ENOSPC ? KVQ_ERR_NOSPACE : KVQ_ERR_IO; }

static void seg_name(char *buf, size_t n, uint64_t id, const char *ext) {
    snprintf(buf, n, "seg-%06" PRIu64 ".%s", id, ext);
}

enum { FS_NAME_OTHER, FS_NAME_SEG, FS_NAME_BAD_ID };

/* What a directory entry is: FS_NAME_SEG when name is the name seg_name
 * gives some id in 1..FS_ID_MAX with this ext (*id gets it), FS_NAME_BAD_ID
 * when it has that form (at least six digits, no leading zero past the
 * padding) but its number is 0 or past FS_ID_MAX, FS_NAME_OTHER else. */
static int parse_seg_name(const char *name, const char *ext, uint64_t *id) {
    if (strncmp(name, "seg-", 4) != 0)
        return FS_NAME_OTHER;
    const char *p = name + 4;
    uint64_t v = 0;
    int nd = 0, over = 0;
    for (; *p >= '0' && *p <= '9'; p++, nd++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            over = 1;
        else
            v = v * 10 + d;
    }
    if (nd < 6 || (nd > 6 && name[4] == '0') || *p != '.' || strcmp(p + 1, ext) != 0)
        return FS_NAME_OTHER;
    if (over || v == 0 || v > FS_ID_MAX)
        return FS_NAME_BAD_ID;
    *id = v;
    return FS_NAME_SEG;
}

static int sync_dir(fs_store *f) {
    int r;
    do {
        r = fsync(f->dirfd);
    } while (r != 0 && errno == EINTR);
    return r;
}

static kvq_status segs_reserve(kvq_store *s, fs_store *f, size_t n) {
    if (n <= f->segs_cap)
        return KVQ_OK;
    size_t cap = f->segs_cap ? f->segs_cap : 8;
    while (cap < n)
        cap *= 2;
    fs_seg *a = (fs_seg *)kvq__alloc(&s->alloc, cap * sizeof *a);
    if (!a)
        return KVQ_ERR_NOMEM;
    if (f->n_segs)
        memcpy(a, f->segs, f->n_segs * sizeof *a);
    kvq__free(&s->alloc, f->segs);
    f->segs = a;
    f->segs_cap = cap;
    return KVQ_OK;
}

static fs_seg *seg_by_id(fs_store *f, uint64_t id) {
    size_t lo = 0, hi = f->n_segs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->segs[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < f->n_segs && f->segs[lo].id == id ? &f->segs[lo] : NULL;
}

/* 1 when the segment's file is no longer in the directory (someone removed
 * it under the running store: the open fd still reads it, but the entries
 * are gone for anyone who opens the directory, this store after a restart
 * included, and appends to it would never be found again). */
static int seg_removed(const fs_seg *g) {
    struct stat sb;
    return fstat(g->fd, &sb) == 0 && sb.st_nlink == 0;
}

/* Forgets the segments whose file was removed: their keys leave the index
 * (the store then says what a reopen would say; a reopen may still find
 * older values of those keys in the segments that remain), their fds are
 * closed, and a removed active segment makes the next append roll over.
 * Bumps the epoch; returns the number of keys forgotten (*n_segs_out: the
 * segments). */
static size_t forget_removed(kvq_store *s, fs_store *f, size_t *n_segs_out) {
    size_t n_gone = 0, keys = 0;
    for (size_t i = 0; i < f->n_segs; i++) {
        f->segs[i].removed = seg_removed(&f->segs[i]);
        n_gone += (size_t)f->segs[i].removed;
    }
    if (n_segs_out)
        *n_segs_out = n_gone;
    if (n_gone == 0)
        return 0;
    size_t removed;
    do { /* backward-shift deletion moves entries (across the wrap too): sweep until none is left */
        removed = 0;
        for (size_t i = 0; i < f->tab_cap; i++) {
            fs_slot *e = &f->tab[i];
            while (e->key) {
                const fs_seg *g = seg_by_id(f, e->seg);
                if (g && !g->removed)
                    break;
                tab_remove(s, f, e); /* e now holds the next entry of its run, or nothing */
                removed++;
            }
        }
        keys += removed;
    } while (removed);
    if (f->segs[f->n_segs - 1].removed)
        f->need_roll = 1;
    size_t j = 0;
    for (size_t i = 0; i < f->n_segs; i++) {
        if (f->segs[i].removed) {
            close(f->segs[i].fd);
            f->total_bytes -= f->segs[i].size;
            continue;
        }
        f->segs[j++] = f->segs[i];
    }
    f->n_segs = j;
    s->epoch++;
    return keys;
}

static void fs_check_lost(kvq_store *s) { (void)forget_removed(s, FS(s), NULL); }

/* Creates the file of a new segment (ext "log" or "tmp"); returns its fd. */
static int create_seg_file(kvq_store *s, fs_store *f, uint64_t id, const char *ext) {
    char name[FS_NAME_MAX];
    seg_name(name, sizeof name, id, ext);
    int fd = openat(f->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        kvq__store_err(s, "%s/%s: cannot create: %s", f->dir, name, strerror(errno));
    return fd;
}

/* Refuses a new segment when no id is left for it (ids never wrap: a
 * smaller id would sort before the newest entries). */
static kvq_status id_left(kvq_store *s, fs_store *f, uint64_t id) {
    if (id <= FS_ID_MAX)
        return KVQ_OK;
    kvq__store_err(s,
                   "%s: no segment id left after seg-%" PRIu64
                   ".log: the store takes no new segment (copy its keys to a new directory)",
                   f->dir, (uint64_t)FS_ID_MAX);
    return KVQ_ERR_NOSPACE;
}

/* Starts a new active segment. */
static kvq_status roll(kvq_store *s, fs_store *f) {
    uint64_t id = f->next_id;
    kvq_status st = id_left(s, f, id);
    if (st != KVQ_OK)
        return st;
    st = segs_reserve(s, f, f->n_segs + 1);
    if (st != KVQ_OK)
        return st;
    int fd = create_seg_file(s, f, id, "log");
    if (fd < 0)
        return io_status(errno);
    if (sync_dir(f) != 0) {
        int e = errno;
        char name[FS_NAME_MAX];
        seg_name(name, sizeof name, id, "log");
        unlinkat(f->dirfd, name, 0);
        close(fd);
        kvq__store_err(s, "%s: fsync of the directory failed: %s", f->dir, strerror(e));
        return io_status(e);
    }
    f->segs[f->n_segs].id = id;
    f->segs[f->n_segs].fd = fd;
    f->segs[f->n_segs].size = 0;
    f->n_segs++;
    f->next_id = id + 1;
    f->need_roll = 0;
    return KVQ_OK;
}

/* Appends one entry to the active segment (rolling over first when needed)
 * and syncs it. On failure the segment is cut back to its previous end.
 * *seg_id and *off get where it went. */
static kvq_status append_entry(kvq_store *s, fs_store *f, int op, const char *key, size_t klen,
                               const void *val, size_t vlen, uint64_t *seg_id, uint64_t *off) {
    uint64_t len = (uint64_t)KVQ__SEG_HDR + klen + vlen;
    fs_seg *a = f->n_segs ? &f->segs[f->n_segs - 1] : NULL;
    if (a && seg_removed(a)) { /* appends there would never be found again */
        (void)forget_removed(s, f, NULL);
        a = f->n_segs ? &f->segs[f->n_segs - 1] : NULL;
    }
    if (!a || f->need_roll || (a->size > 0 && a->size + len > f->segment_bytes)) {
        kvq_status st = roll(s, f);
        if (st != KVQ_OK)
            return st;
        a = &f->segs[f->n_segs - 1];
    }
    uint8_t hk[KVQ__SEG_HDR + KVQ__STORE_MAX_KEY];
    kvq__seg_hdr_write(hk, op, (uint32_t)klen, (uint32_t)vlen, 0);
    uint32_t crc = kvq__crc32c(0, hk, 12);
    crc = kvq__crc32c(crc, key, klen);
    if (vlen)
        crc = kvq__crc32c(crc, val, vlen);
    kvq__seg_hdr_write(hk, op, (uint32_t)klen, (uint32_t)vlen, crc);
    memcpy(hk + KVQ__SEG_HDR, key, klen);
    uint64_t end = a->size;
    const char *what = "write";
    int ok = fs_pwrite(f, a->fd, hk, KVQ__SEG_HDR + klen, end) == 0 &&
             (vlen == 0 || fs_pwrite(f, a->fd, val, vlen, end + KVQ__SEG_HDR + klen) == 0);
    if (ok) {
        what = "fdatasync";
        ok = fs_sync(f, a->fd) == 0;
    }
    if (!ok) {
        int e = errno;
        int r;
        do {
            r = ftruncate(a->fd, (off_t)end);
        } while (r != 0 && errno == EINTR);
        if (r != 0)
            f->need_roll = 1; /* garbage may follow `end`: never append after it */
        else
            (void)fdatasync(a->fd);
        char name[FS_NAME_MAX];
        seg_name(name, sizeof name, a->id, "log");
        kvq__store_err(s, "%s/%s: %s of %llu bytes at %llu failed: %s", f->dir, name, what,
                       (unsigned long long)len, (unsigned long long)end, strerror(e));
        return io_status(e);
    }
    a->size = end + len;
    f->total_bytes += len;
    s->st.bytes_written += len;
    *seg_id = a->id;
    *off = end;
    return KVQ_OK;
}

/* ---- compaction ---- */
typedef struct fs_newpos {
    uint64_t seg;
    uint64_t off;
} fs_newpos;

static void drop_new_segs(fs_store *f, fs_seg *ns, size_t n, const char *ext) {
    for (size_t i = 0; i < n; i++) {
        char name[FS_NAME_MAX];
        seg_name(name, sizeof name, ns[i].id, ext);
        close(ns[i].fd);
        unlinkat(f->dirfd, name, 0);
    }
}

/* Rewrites every live entry into new segments and drops the old ones.
 * KVQ_OK also when it gave up early without changing anything (*done 0). */
static kvq_status compact(kvq_store *s, fs_store *f, int *did) {
    *did = 0;
    (void)forget_removed(s, f, NULL); /* never copy what the directory lost back into it */
    fs_newpos *np = NULL;
    fs_seg *ns = NULL;
    uint8_t *buf = NULL;
    size_t n_ns = 0, ns_cap = 4;
    kvq_status st = KVQ_OK;
    np = (fs_newpos *)kvq__alloc(&s->alloc, (f->tab_cap ? f->tab_cap : 1) * sizeof *np);
    ns = (fs_seg *)kvq__alloc(&s->alloc, ns_cap * sizeof *ns);
    size_t buf_cap = 0;
    if (!np || !ns) {
        st = KVQ_ERR_NOMEM;
        goto fail;
    }
    uint64_t id = f->next_id;
    for (size_t i = 0; i < f->tab_cap; i++) {
        fs_slot *e = &f->tab[i];
        if (!e->key)
            continue;
        fs_seg *src = seg_by_id(f, e->seg);
        if (e->len > buf_cap) {
            kvq__free(&s->alloc, buf);
            buf_cap = (size_t)e->len;
            buf = (uint8_t *)kvq__alloc(&s->alloc, buf_cap);
            if (!buf) {
                st = KVQ_ERR_NOMEM;
                goto fail;
            }
        }
        kvq__seg_hdr h;
        if (!src || fs_pread(f, src->fd, buf, (size_t)e->len, e->off) != 0) {
            st = KVQ_ERR_IO;
            goto fail;
        }
        uint32_t crc = kvq__crc32c(0, buf, 12);
        crc = kvq__crc32c(crc, buf + KVQ__SEG_HDR, (size_t)e->len - KVQ__SEG_HDR);
        if (!kvq__seg_hdr_read(buf, &h) || h.crc != crc || h.klen != e->klen ||
            memcmp(buf + KVQ__SEG_HDR, e->key, e->klen) != 0) {
            s->st.corrupt_skipped++;
            st = KVQ_ERR_CORRUPT;
            goto fail;
        }
        fs_seg *d = n_ns ? &ns[n_ns - 1] : NULL;
        if (!d || (d->size > 0 && d->size + e->len > f->segment_bytes)) {
            if (n_ns == ns_cap) {
                fs_seg *g = (fs_seg *)kvq__alloc(&s->alloc, 2 * ns_cap * sizeof *g);
                if (!g) {
                    st = KVQ_ERR_NOMEM;
                    goto fail;
                }
                memcpy(g, ns, n_ns * sizeof *g);
                kvq__free(&s->alloc, ns);
                ns = g;
                ns_cap *= 2;
            }
            st = id_left(s, f, id);
            if (st != KVQ_OK)
                goto fail;
            int fd = create_seg_file(s, f, id, "tmp");
            if (fd < 0) {
                st = io_status(errno);
                goto fail;
            }
            d = &ns[n_ns++];
            d->id = id++;
            d->fd = fd;
            d->size = 0;
        }
        if (fs_pwrite(f, d->fd, buf, (size_t)e->len, d->size) != 0) {
            st = io_status(errno);
            goto fail;
        }
        np[i].seg = d->id;
        np[i].off = d->size;
        d->size += e->len;
        s->st.bytes_written += e->len;
    }
    for (size_t i = 0; i < n_ns; i++) {
        if (fs_sync(f, ns[i].fd) != 0) {
            st = io_status(errno);
            goto fail;
        }
    }
    /* room to adopt the new segments next to the old ones, before anything changes */
    st = segs_reserve(s, f, f->n_segs + n_ns);
    if (st != KVQ_OK)
        goto fail;
    /* Rename in id order; a crash leaves old segments + a prefix of the new ones: same keys. */
    for (size_t i = 0; i < n_ns; i++) {
        char from[FS_NAME_MAX], to[FS_NAME_MAX];
        seg_name(from, sizeof from, ns[i].id, "tmp");
        seg_name(to, sizeof to, ns[i].id, "log");
        if (renameat(f->dirfd, from, f->dirfd, to) != 0) {
            /* the renamed ones hold copies of live entries: harmless duplicates */
            st = io_status(errno);
            for (size_t j = 0; j < i; j++) {
                seg_name(to, sizeof to, ns[j].id, "log");
                unlinkat(f->dirfd, to, 0);
            }
            drop_new_segs(f, ns + i, n_ns - i, "tmp");
            for (size_t j = 0; j < i; j++)
                close(ns[j].fd);
            n_ns = 0;
            goto fail;
        }
    }
    if (sync_dir(f) != 0) {
        /* The renames may not be durable yet; the old segments still are.
         * Keep both: the new ones are the newest copies. */
        st = io_status(errno);
    }
    if (st == KVQ_OK) {
        for (size_t i = 0; i < f->n_segs; i++) {
            char name[FS_NAME_MAX];
            seg_name(name, sizeof name, f->segs[i].id, "log");
            unlinkat(f->dirfd, name, 0);
            close(f->segs[i].fd);
        }
        (void)sync_dir(f);
        f->n_segs = 0;
    }
    /* adopt the new segments (after the old ones when those were kept; room reserved above) */
    f->total_bytes = 0;
    for (size_t i = 0; i < f->n_segs; i++)
        f->total_bytes += f->segs[i].size;
    for (size_t i = 0; i < n_ns; i++) {
        f->segs[f->n_segs++] = ns[i];
        f->total_bytes += ns[i].size;
    }
    if (st == KVQ_OK) {
        for (size_t i = 0; i < f->tab_cap; i++) {
            if (f->tab[i].key) {
                f->tab[i].seg = np[i].seg;
                f->tab[i].off = np[i].off;
            }
        }
    }
    f->next_id = id;
    f->need_roll = 0;
    if (n_ns == 0)
        f->need_roll = 1; /* no active segment left: the next put makes one */
    if (st == KVQ_OK) {
        s->st.compactions++;
        *did = 1;
    }
    goto out;
fail:
    drop_new_segs(f, ns, n_ns, "tmp");
out:
    kvq__free(&s->alloc, buf);
    kvq__free(&s->alloc, ns);
    kvq__free(&s->alloc, np);
    return st;
}

static void maybe_compact(kvq_store *s, fs_store *f) {
    if (f->compact_min == 0 || f->total_bytes < f->compact_min ||
        f->total_bytes < f->compact_retry_at)
        return;
    uint64_t dead = f->total_bytes - f->live_entry_bytes;
    if (dead * 2 <= f->total_bytes)
        return;
    char keep[KVQ__STORE_ERR_SIZE];
    memcpy(keep, s->err, sizeof keep);
    int did = 0;
    if (compact(s, f, &did) != KVQ_OK || !did)
        f->compact_retry_at = f->total_bytes + f->compact_min;
    memcpy(s->err, keep, sizeof keep); /* the put itself succeeded */
}

/* ---- operations ---- */
static kvq_status fs_put(kvq_store *s, const char *key, size_t klen, const void *data,
                         size_t size, uint64_t ttl_ms) {
    fs_store *f = FS(s);
    (void)ttl_ms; /* no expiry here: a record stays until it is deleted */
    if (f->readonly) {
        kvq__store_err(s, "%s: the store is open readonly", f->dir);
        return KVQ_ERR_UNSUPPORTED;
    }
    /* reserve the index slot and the key's copy first, so that no memory
     * failure can follow the write (a failed put leaves the store as it
     * was, after a reopen too) */
    if (f->tab_cap == 0 || (f->tab_n + 1) * 10 > f->tab_cap * 7) {
        kvq_status st = tab_grow(s, f);
        if (st != KVQ_OK)
            return st;
    }
    char *kcopy = NULL;
    if (!tab_find(f, key, klen, key_hash(key, klen))) {
        kcopy = (char *)kvq__alloc(&s->alloc, klen + 1);
        if (!kcopy)
            return KVQ_ERR_NOMEM;
        memcpy(kcopy, key, klen);
        kcopy[klen] = 0;
    }
    uint64_t seg;
    uint64_t off;
    kvq_status st = append_entry(s, f, KVQ__SEG_PUT, key, klen, data, size, &seg, &off);
    if (st != KVQ_OK) {
        kvq__free(&s->alloc, kcopy);
        return st;
    }
    /* cannot fail now: the slot is there and the key copied */
    (void)tab_set(s, f, key, klen, kcopy, seg, off, KVQ__SEG_HDR + klen + size, (uint32_t)size);
    maybe_compact(s, f);
    return KVQ_OK;
}

static kvq_status fs_get(kvq_store *s, const char *key, size_t klen, void **data, size_t *size) {
    fs_store *f = FS(s);
    fs_slot *e = f->tab_cap ? tab_find(f, key, klen, key_hash(key, klen)) : NULL;
    if (!e)
        return KVQ_ERR_RANGE;
    fs_seg *sg = seg_by_id(f, e->seg);
    if (sg && seg_removed(sg)) {
        uint64_t id = sg->id;
        size_t n_segs = 0, keys = forget_removed(s, f, &n_segs);
        kvq__store_err(s,
                       "%s: no key '%.200s': its segment seg-%06" PRIu64
                       ".log was removed from the directory (%zu segment(s), %zu key(s) lost)",
                       f->dir, key, id, n_segs, keys);
        return KVQ_ERR_RANGE;
    }
    uint8_t hk[KVQ__SEG_HDR + KVQ__STORE_MAX_KEY];
    uint8_t *v = (uint8_t *)kvq__alloc(&s->alloc, e->vlen ? e->vlen : 1);
    if (!v)
        return KVQ_ERR_NOMEM;
    if (!sg || fs_pread(f, sg->fd, hk, KVQ__SEG_HDR + klen, e->off) != 0 ||
        (e->vlen && fs_pread(f, sg->fd, v, e->vlen, e->off + KVQ__SEG_HDR + klen) != 0)) {
        int er = errno;
        kvq__free(&s->alloc, v);
        struct stat sb;
        if (sg && !f->fault_read && fstat(sg->fd, &sb) == 0 &&
            (uint64_t)sb.st_size < e->off + e->len) {
            /* cut short under the store: the entry is gone for good */
            s->st.corrupt_skipped++;
            kvq__store_err(s,
                           "%s: the entry of '%.200s' (segment %" PRIu64
                           ", offset %llu) lies past the end of its file (%llu bytes): the "
                           "segment was truncated",
                           f->dir, key, e->seg, (unsigned long long)e->off,
                           (unsigned long long)sb.st_size);
            return KVQ_ERR_CORRUPT;
        }
        kvq__store_err(s, "%s: reading '%.200s' (segment %" PRIu64 ", offset %llu) failed: %s",
                       f->dir, key, e->seg, (unsigned long long)e->off, strerror(er));
        return KVQ_ERR_IO;
    }
    s->st.bytes_read += KVQ__SEG_HDR + klen + e->vlen;
    kvq__seg_hdr h;
    uint32_t crc = kvq__crc32c(0, hk, 12);
    crc = kvq__crc32c(crc, hk + KVQ__SEG_HDR, klen);
    crc = kvq__crc32c(crc, v, e->vlen);
    if (!kvq__seg_hdr_read(hk, &h) || h.op != KVQ__SEG_PUT || h.klen != klen || h.vlen != e->vlen ||
        h.crc != crc || memcmp(hk + KVQ__SEG_HDR, key, klen) != 0) {
        kvq__free(&s->alloc, v);
        s->st.corrupt_skipped++;
        kvq__store_err(s,
                       "%s: the entry of '%.200s' (segment %" PRIu64
                       ", offset %llu) fails its checksum",
                       f->dir, key, e->seg, (unsigned long long)e->off);
        return KVQ_ERR_CORRUPT;
    }
    *data = v;
    *size = e->vlen;
    return KVQ_OK;
}

static kvq_status fs_del(kvq_store *s, const char *key, size_t klen) {
    fs_store *f = FS(s);
    if (f->readonly) {
        kvq__store_err(s, "%s: the store is open readonly", f->dir);
        return KVQ_ERR_UNSUPPORTED;
    }
    fs_slot *e = f->tab_cap ? tab_find(f, key, klen, key_hash(key, klen)) : NULL;
    const fs_seg *sg = e ? seg_by_id(f, e->seg) : NULL;
    if (sg && seg_removed(sg)) {
        (void)forget_removed(s, f, NULL); /* the key went with its segment */
        e = NULL;
    }
    if (!e)
        return KVQ_ERR_RANGE;
    uint64_t seg;
    uint64_t off;
    kvq_status st = append_entry(s, f, KVQ__SEG_DEL, key, klen, NULL, 0, &seg, &off);
    if (st != KVQ_OK)
        return st;
    tab_remove(s, f, e);
    maybe_compact(s, f);
    return KVQ_OK;
}

static kvq_status fs_scan(kvq_store *s, const char *prefix, size_t plen, uint64_t *cursor,
                          kvq__keylist *out) {
    fs_store *f = FS(s);
    *cursor = 0;
    (void)forget_removed(s, f, NULL);
    for (size_t i = 0; i < f->tab_cap; i++) {
        fs_slot *e = &f->tab[i];
        if (!e->key || e->klen < plen || memcmp(e->key, prefix, plen) != 0)
            continue;
        kvq_status st = kvq__keylist_add(out, e->key, e->klen, e->vlen);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

static kvq_status fs_stats(kvq_store *s, kvq_store_metrics *st) {
    fs_store *f = FS(s);
    (void)forget_removed(s, f, NULL);
    st->records = f->tab_n;
    st->live_bytes = f->live_value_bytes;
    st->stored_bytes = f->total_bytes;
    st->segments = f->n_segs;
    return KVQ_OK;
}

static kvq_status fs_fault(kvq_store *s, int kind, long after) {
    fs_store *f = FS(s);
    switch (kind) {
    case KVQ_FAULT_NONE:
        f->fault_write = 0;
        f->fault_read = 0;
        f->sync_fail_after = -1;
        return KVQ_OK;
    case KVQ_FAULT_NOSPACE:
    case KVQ_FAULT_WRITE_IO:
        f->fault_write = kind == KVQ_FAULT_NOSPACE ? ENOSPC : EIO;
        f->write_budget = after;
        return KVQ_OK;
    case KVQ_FAULT_SYNC:
        f->sync_fail_after = after;
        return KVQ_OK;
    case KVQ_FAULT_READ:
        f->fault_read = EIO;
        f->read_budget = after;
        return KVQ_OK;
    default:
        kvq__store_err(s, "the file store has no fault of kind %d", kind);
        return KVQ_ERR_UNSUPPORTED;
    }
}

static void fs_free(kvq_store *s, fs_store *f) {
    for (size_t i = 0; i < f->n_segs; i++)
        close(f->segs[i].fd);
    for (size_t i = 0; i < f->tab_cap; i++)
        kvq__free(&s->alloc, f->tab[i].key);
    kvq__free(&s->alloc, f->tab);
    kvq__free(&s->alloc, f->segs);
    if (f->dirfd >= 0)
        close(f->dirfd); /* releases the flock */
    kvq__free(&s->alloc, f->dir);
    kvq__free(&s->alloc, f);
}

static void fs_close(kvq_store *s) { fs_free(s, FS(s)); }

static const kvq__store_ops fs_ops = {fs_close, fs_put,   fs_get,   fs_del,
                                      fs_scan,  fs_stats, fs_fault, fs_check_lost};

/* ---- open ---- */
typedef struct fs_fdreader {
    fs_store *f;
    int fd;
} fs_fdreader;

static int fd_read(void *ctx, uint64_t off, void *buf, size_t n) {
    fs_fdreader *r = (fs_fdreader *)ctx;
    return fs_pread(r->f, r->fd, buf, n, off);
}

typedef struct fs_visit_ctx {
    kvq_store *s;
    fs_store *f;
    uint64_t seg;
    uint64_t bad_keys;
} fs_visit_ctx;

static int scan_visit(void *ctx, const kvq__seg_entry *e) {
    fs_visit_ctx *v = (fs_visit_ctx *)ctx;
    if (memchr(e->key, 0, e->klen)) { /* not a key this store writes */
        v->bad_keys++;
        return 0;
    }
    if (e->op == KVQ__SEG_PUT)
        return tab_set(v->s, v->f, e->key, e->klen, NULL, v->seg, e->off, e->len, e->vlen) !=
               KVQ_OK;
    fs_slot *t = v->f->tab_cap ? tab_find(v->f, e->key, e->klen, key_hash(e->key, e->klen)) : NULL;
    if (t)
        tab_remove(v->s, v->f, t);
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Parses "k=v&k=v" options into f. */
static kvq_status parse_options(kvq_store *s, fs_store *f, const char *opt) {
    while (opt && *opt) {
        const char *amp = strchr(opt, '&');
        size_t n = amp ? (size_t)(amp - opt) : strlen(opt);
        const char *eq = memchr(opt, '=', n);
        char *end = NULL;
        unsigned long long v = 0;
        int ok = eq != NULL && eq + 1 < opt + n;
        if (ok) {
            errno = 0;
            v = strtoull(eq + 1, &end, 10);
            ok = errno == 0 && end == opt + n && eq[1] != '-';
        }
        size_t kl = eq ? (size_t)(eq - opt) : n;
        if (ok && kl == 8 && memcmp(opt, "readonly", 8) == 0 && v <= 1)
            f->readonly = (int)v;
        else if (ok && kl == 13 && memcmp(opt, "segment_bytes", 13) == 0 && v >= 4096 &&
                 v <= ((uint64_t)1 << 40))
            f->segment_bytes = v;
        else if (ok && kl == 11 && memcmp(opt, "compact_min", 11) == 0)
            f->compact_min = v;
        else {
            kvq__store_err(s,
                           "bad store option '%.*s' (known: readonly=0|1, segment_bytes=N >= 4096, "
                           "compact_min=N)",
                           (int)n, opt);
            return KVQ_ERR_INVALID_ARG;
        }
        opt = amp ? amp + 1 : NULL;
    }
    return KVQ_OK;
}

/* Lists the segment ids of the directory (sorted) and removes leftover .tmp
 * files of an interrupted compaction (writers only). A .log name with an
 * id this store never writes fails it (KVQ_ERR_CORRUPT), before anything is
 * removed. */
static kvq_status list_segments(kvq_store *s, fs_store *f, uint64_t **ids_out, size_t *n_out) {
    int dfd = dup(f->dirfd);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        kvq__store_err(s, "%s: cannot list: %s", f->dir, strerror(errno));
        return KVQ_ERR_IO;
    }
    rewinddir(d);
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    kvq_status st = KVQ_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        uint64_t id = 0;
        int kind = parse_seg_name(de->d_name, "log", &id);
        if (kind == FS_NAME_BAD_ID) {
            kvq__store_err(s,
                           "%s/%.40s: segment id out of range (1..%" PRIu64
                           "): the store is not opened rather than leave this file out",
                           f->dir, de->d_name, (uint64_t)FS_ID_MAX);
            st = KVQ_ERR_CORRUPT;
            break;
        }
        if (kind != FS_NAME_SEG)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *a = (uint64_t *)kvq__alloc(&s->alloc, nc * sizeof *a);
            if (!a) {
                st = KVQ_ERR_NOMEM;
                break;
            }
            if (n)
                memcpy(a, ids, n * sizeof *a);
            kvq__free(&s->alloc, ids);
            ids = a;
            cap = nc;
        }
        ids[n++] = id;
    }
    if (st == KVQ_OK && !f->readonly) {
        int removed = 0;
        rewinddir(d);
        while ((de = readdir(d)) != NULL) {
            uint64_t id;
            if (parse_seg_name(de->d_name, "tmp", &id) == FS_NAME_SEG) {
                unlinkat(f->dirfd, de->d_name, 0);
                removed = 1;
            }
        }
        if (removed)
            (void)sync_dir(f);
    }
    closedir(d);
    if (st != KVQ_OK) {
        kvq__free(&s->alloc, ids);
        return st;
    }
    if (n)
        qsort(ids, n, sizeof *ids, cmp_u64);
    *ids_out = ids;
    *n_out = n;
    return KVQ_OK;
}

/* The message of an open that the directory lock refused. Only a writer's
 * exclusive lock keeps a reader out; a writer finds out which kind of open
 * holds it by asking for a shared lock (given back at once). */
static void lock_refused(kvq_store *s, fs_store *f) {
    int readers = 0;
    if (!f->readonly && flock(f->dirfd, LOCK_SH | LOCK_NB) == 0) {
        readers = 1;
        (void)flock(f->dirfd, LOCK_UN);
    }
    if (readers)
        kvq__store_err(s,
                       "%s: the store is locked: it is open readonly (in this or another "
                       "process), and a writer needs it to itself",
                       f->dir);
    else
        kvq__store_err(s,
                       "%s: the store is locked: a writer has it open (in this or another "
                       "process); one writer at a time, and no readonly open beside it",
                       f->dir);
}

kvq_status kvq__store_open_file(kvq_store *s, const char *dir, const char *options) {
    fs_store *f = (fs_store *)kvq__calloc(&s->alloc, sizeof *f);
    if (!f) {
        kvq__store_err(s, "out of memory");
        return KVQ_ERR_NOMEM;
    }
    f->dirfd = -1;
    f->segment_bytes = FS_DEFAULT_SEGMENT;
    f->compact_min = FS_DEFAULT_COMPACT_MIN;
    f->sync_fail_after = -1;
    f->next_id = 1;
    size_t dl = strlen(dir);
    f->dir = (char *)kvq__alloc(&s->alloc, dl + 1);
    kvq_status st = KVQ_OK;
    uint64_t *ids = NULL;
    size_t n_ids = 0;
    if (!f->dir) {
        kvq__store_err(s, "out of memory");
        st = KVQ_ERR_NOMEM;
        goto fail;
    }
    memcpy(f->dir, dir, dl + 1);
    st = parse_options(s, f, options);
    if (st != KVQ_OK)
        goto fail;
    if (!f->readonly && mkdir(dir, 0755) == 0) {
        /* the new directory's entry is durable only once its parent is synced */
        if (kvq__fsync_parent(dir) != 0) {
            kvq__store_err(s, "%s: cannot sync the parent of the new directory: %s", dir,
                           strerror(errno));
            st = io_status(errno);
            goto fail;
        }
    } else if (!f->readonly && errno != EEXIST) {
        kvq__store_err(s, "%s: cannot create the directory: %s", dir, strerror(errno));
        st = io_status(errno);
        goto fail;
    }
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dirfd < 0) {
        kvq__store_err(s, "%s: cannot open the store directory: %s", dir, strerror(errno));
        st = KVQ_ERR_IO;
        goto fail;
    }
    if (flock(f->dirfd, (f->readonly ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            lock_refused(s, f);
        else
            kvq__store_err(s, "%s: cannot lock the directory: %s", dir, strerror(errno));
        st = KVQ_ERR_IO;
        goto fail;
    }
    st = list_segments(s, f, &ids, &n_ids);
    if (st != KVQ_OK)
        goto fail;
    st = segs_reserve(s, f, n_ids);
    if (st != KVQ_OK)
        goto fail;
    for (size_t i = 0; i < n_ids; i++) {
        char name[FS_NAME_MAX];
        seg_name(name, sizeof name, ids[i], "log");
        int fd = openat(f->dirfd, name, (f->readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            kvq__store_err(s, "%s/%s: cannot open: %s", dir, name, strerror(errno));
            if (fd >= 0)
                close(fd);
            st = KVQ_ERR_IO;
            goto fail;
        }
        fs_seg *g = &f->segs[f->n_segs++];
        g->id = ids[i];
        g->fd = fd;
        g->size = (uint64_t)sb.st_size;
        f->next_id = ids[i] + 1;
        int is_last = i + 1 == n_ids;
        fs_fdreader rdctx = {f, fd};
        kvq__seg_reader rd = {fd_read, &rdctx, g->size};
        fs_visit_ctx vc = {s, f, g->id, 0};
        kvq__seg_scan_result res;
        st = kvq__seg_scan(&rd, is_last, &s->alloc, scan_visit, &vc, &res);
        if (st != KVQ_OK) {
            kvq__store_err(s, "%s/%s: %s while scanning", dir, name,
                           st == KVQ_ERR_NOMEM ? "out of memory" : strerror(errno));
            goto fail;
        }
        s->st.torn_tails += res.torn;
        s->st.corrupt_skipped += res.corrupt + vc.bad_keys;
        if (is_last) {
            if (res.torn && !f->readonly) {
                int r;
                do {
                    r = ftruncate(fd, (off_t)res.cut_at);
                } while (r != 0 && errno == EINTR);
                if (r != 0 || fdatasync(fd) != 0)
                    f->need_roll = 1;
                else
                    g->size = res.cut_at;
            }
            if (!res.appendable)
                f->need_roll = 1;
        }
        f->total_bytes += g->size;
    }
    kvq__free(&s->alloc, ids);
    s->impl = f;
    s->ops = &fs_ops;
    return KVQ_OK;
fail:
    kvq__free(&s->alloc, ids);
    fs_free(s, f);
    return st;
}
