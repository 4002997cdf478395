/*
 * hpool.c - the default allocator of a cache: blocks of the few sizes the
 * cache registers (its page blocks) come from large anonymous mappings
 * advised for transparent huge pages; every other size goes to
 * posix_memalign.
 *
 * Why: a decode step streams every page block once, and glibc gives each
 * block of 128 KiB or more a mapping of its own and smaller ones 4 KiB
 * pages of its heap. With 4 KiB pages the hardware prefetchers stop at
 * every page boundary and, once the step has flushed the caches, every
 * 4 KiB costs a page walk that misses them too; with 2 MiB pages the same
 * steps take 3-15% less time (docs/attend.md).
 *
 * Regions are 2 MiB aligned, 2 MiB for a size's first one, doubling up to
 * 64 MiB; a region is taken whole by one size, its blocks back to back
 * (stride = size rounded up to 64 bytes, plus a poisoned 64-byte redzone
 * under AddressSanitizer). Memory is committed as it is first touched, so
 * what a region holds beyond the blocks handed out is at most the huge
 * page being filled (plus the region's unusable tail, under one block).
 * Freed blocks go to a free list of their size and are handed out again
 * first. When no block of a size is in use (a layer switched codec, every
 * page evicted), that size's regions are unmapped but the one being
 * carved, which starts over; kvq__hpool_destroy unmaps the rest. The
 * kernel may refuse huge pages (transparent_hugepage=never): the blocks
 * are then still adjacent, in 4 KiB pages. alloc and free take a mutex:
 * read-only calls of a cache (get_kv reading cold pages) may allocate
 * blocks on several threads at once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVQ__HP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVQ__HP_ASAN 1
#endif
#endif
#ifdef KVQ__HP_ASAN
void __asan_poison_memory_region(void const volatile *addr, size_t size);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#define KVQ__HP_POISON(p, n) __asan_poison_memory_region((p), (n))
#define KVQ__HP_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#define KVQ__HP_REDZONE 64
#else
#define KVQ__HP_POISON(p, n) ((void)(p), (void)(n))
#define KVQ__HP_UNPOISON(p, n) ((void)(p), (void)(n))
#define KVQ__HP_REDZONE 0
#endif

#define KVQ__HP_HUGE ((size_t)2 << 20)
#define KVQ__HP_REGION_MAX ((size_t)64 << 20)

typedef struct {
    uint8_t *base;
    size_t len;
    size_t cls; /* the size it serves */
} kvq__hp_region;

typedef struct {
    size_t size, stride;
    void *free_list; /* next pointer in a free block's first bytes */
    uint8_t *bump, *end; /* the region being carved */
    size_t next_len;
    size_t live; /* blocks handed out and not freed */
} kvq__hp_class;

struct kvq__hpool {
    kvq__hp_class cls[KVQ__HPOOL_CLASSES];
    size_t ncls;
    kvq__hp_region *reg; /* sorted by base */
    size_t nreg, capreg;
    size_t mapped; /* bytes of regions */
    int fail_maps;         /* tests: the next n mappings fail */
    /* read-only calls of a cache (get_kv reading cold pages) may allocate
     * blocks on several threads at once */
    pthread_mutex_t mu;
};

kvq_status kvq__hpool_create(kvq__hpool **out) {
    *out = (kvq__hpool *)calloc(1, sizeof **out);
    if (!*out)
        return KVQ_ERR_NOMEM;
    if (pthread_mutex_init(&(*out)->mu, NULL) != 0) {
        free(*out);
        *out = NULL;
        return KVQ_ERR_NOMEM;
    }
    return KVQ_OK;
}

/* Bytes of blocks handed out and not freed. */
static size_t kvq__hp_live_bytes(const kvq__hpool *p) {
    size_t n = 0;
    for (size_t i = 0; i < p->ncls; i++)
        n += p->cls[i].live * p->cls[i].size;
    return n;
}

void kvq__hpool_destroy(kvq__hpool *p) {
    if (!p)
        return;
#ifdef KVQ__HP_ASAN
    /* LeakSanitizer cannot see blocks inside the regions: report them */
    if (kvq__hp_live_bytes(p)) {
        fprintf(stderr, "kvq: %zu bytes of page blocks were never freed\n", kvq__hp_live_bytes(p));
        abort();
    }
#endif
    for (size_t i = 0; i < p->nreg; i++) {
        KVQ__HP_UNPOISON(p->reg[i].base, p->reg[i].len);
        munmap(p->reg[i].base, p->reg[i].len);
    }
    free(p->reg);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int kvq__hpool_add_size(kvq__hpool *p, size_t size) {
    if (size < sizeof(void *))
        return -1;
    for (size_t i = 0; i < p->ncls; i++)
        if (p->cls[i].size == size)
            return 0;
    if (p->ncls == KVQ__HPOOL_CLASSES)
        return -1;
    kvq__hp_class *c = &p->cls[p->ncls++];
    memset(c, 0, sizeof *c);
    c->size = size;
    c->stride = (size + KVQ__ALIGN - 1) / KVQ__ALIGN * KVQ__ALIGN + KVQ__HP_REDZONE;
    c->next_len = KVQ__HP_HUGE;
    return 0;
}

void kvq__hpool_fail_maps(kvq__hpool *p, int n) { p->fail_maps = n; }

size_t kvq__hpool_mapped(const kvq__hpool *p) { return p ? p->mapped : 0; }
size_t kvq__hpool_in_use(const kvq__hpool *p) { return p ? kvq__hp_live_bytes(p) : 0; }

/* A new region for class c (2 MiB aligned, at least one block), recorded
 * in p->reg; 0, or -1 with the pool unchanged. */
static int kvq__hp_map(kvq__hpool *p, kvq__hp_class *c) {
    size_t whole = (c->stride + KVQ__HP_HUGE - 1) / KVQ__HP_HUGE * KVQ__HP_HUGE;
    size_t len = KVQ__MAX(c->next_len, whole);
    if (p->fail_maps > 0) {
        p->fail_maps--;
        return -1;
    }
    if (p->nreg == p->capreg) {
        size_t cap = p->capreg ? 2 * p->capreg : 16;
        kvq__hp_region *r = (kvq__hp_region *)realloc(p->reg, cap * sizeof *r);
        if (!r)
            return -1;
        p->reg = r;
        p->capreg = cap;
    }
    /* over-map by 2 MiB and trim to an aligned start */
    size_t span = len + KVQ__HP_HUGE;
    uint8_t *m = (uint8_t *)mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                 -1, 0);
    if (m == (uint8_t *)MAP_FAILED)
        return -1;
    uint8_t *base = (uint8_t *)(((uintptr_t)m + KVQ__HP_HUGE - 1) & ~(uintptr_t)(KVQ__HP_HUGE - 1));
    if (base > m)
        munmap(m, (size_t)(base - m));
    if (base + len < m + span)
        munmap(base + len, (size_t)(m + span - (base + len)));
#ifdef MADV_HUGEPAGE
    (void)madvise(base, len, MADV_HUGEPAGE); /* a kernel without THP says EINVAL: 4 KiB pages */
#endif
    KVQ__HP_POISON(base, len);
    size_t i = p->nreg;
    while (i > 0 && p->reg[i - 1].base > base) {
        p->reg[i] = p->reg[i - 1];
        i--;
    }
    p->reg[i].base = base;
    p->reg[i].len = len;
    p->reg[i].cls = (size_t)(c - p->cls);
    p->nreg++;
    p->mapped += len;
    c->bump = base;
    c->end = base + len;
    c->next_len = KVQ__MIN(2 * len, KVQ__HP_REGION_MAX);
    return 0;
}

static void *kvq__hp_alloc(void *ctx, size_t size) {
    kvq__hpool *p = (kvq__hpool *)ctx;
    kvq__hp_class *c = NULL;
    for (size_t i = 0; i < p->ncls && !c; i++)
        if (p->cls[i].size == size)
            c = &p->cls[i];
    if (!c) {
        void *q = NULL;
        return posix_memalign(&q, KVQ__ALIGN, size) == 0 ? q : NULL;
    }
    uint8_t *b;
    pthread_mutex_lock(&p->mu);
    if (c->free_list) {
        b = (uint8_t *)c->free_list;
        KVQ__HP_UNPOISON(b, c->size);
        memcpy(&c->free_list, b, sizeof(void *));
    } else {
        if ((size_t)(c->end - c->bump) < c->stride && kvq__hp_map(p, c) != 0) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        b = c->bump;
        c->bump += c->stride;
        KVQ__HP_UNPOISON(b, c->size);
    }
    c->live++;
    pthread_mutex_unlock(&p->mu);
    return b;
}

/* Class c has no block in use (a layer switched to another codec, or
 * every page was evicted): its regions go back to the OS but the one being
 * carved, which starts over empty (so that a block taken and given back
 * again and again does not map and unmap a region each time). */
static void kvq__hp_release(kvq__hpool *p, kvq__hp_class *c) {
    const size_t ci = (size_t)(c - p->cls);
    size_t k = 0;
    for (size_t i = 0; i < p->nreg; i++) {
        kvq__hp_region r = p->reg[i];
        if (r.cls == ci && !(c->bump > r.base && c->bump <= r.base + r.len)) {
            KVQ__HP_UNPOISON(r.base, r.len);
            munmap(r.base, r.len);
            p->mapped -= r.len;
        } else {
            if (r.cls == ci) { /* the region being carved: empty again */
                c->bump = r.base;
                KVQ__HP_POISON(r.base, r.len);
            }
            p->reg[k++] = r;
        }
    }
    p->nreg = k;
    c->free_list = NULL;
}

/* The region holding q, or NULL. */
static const kvq__hp_region *kvq__hp_find(const kvq__hpool *p, const uint8_t *q) {
    size_t lo = 0, hi = p->nreg;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->reg[mid].base + p->reg[mid].len <= q)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->nreg && p->reg[lo].base <= q ? &p->reg[lo] : NULL;
}

static void kvq__hp_free(void *ctx, void *q) {
    kvq__hpool *p = (kvq__hpool *)ctx;
    pthread_mutex_lock(&p->mu);
    const kvq__hp_region *r = kvq__hp_find(p, (const uint8_t *)q);
    if (!r) {
        pthread_mutex_unlock(&p->mu);
        free(q);
        return;
    }
    kvq__hp_class *c = &p->cls[r->cls];
    memcpy(q, &c->free_list, sizeof(void *));
    c->free_list = q;
    KVQ__HP_POISON(q, c->size);
    if (--c->live == 0)
        kvq__hp_release(p, c);
    pthread_mutex_unlock(&p->mu);
}

void kvq__hpool_allocator(kvq__hpool *p, kvq_allocator *a) {
    a->alloc = kvq__hp_alloc;
    a->free = kvq__hp_free;
    a->ctx = p;
}
