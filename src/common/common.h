/*
 * common.h - internal helpers shared by every part of libkvq: allocation
 * through the per-handle allocator, fp16/bf16 conversion, a seeded RNG,
 * CRC32C, SHA-256, random bytes from the OS, finiteness checks and CPU
 * feature detection. Depends on nothing but libc and include/kvq.h.
 */
#ifndef KVQ_COMMON_H
#define KVQ_COMMON_H

#include "kvq.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KVQ__MAX_HEAD_DIM KVQ_MAX_HEAD_DIM /* 1024, include/kvq.h */
#define KVQ__ALIGN 64

#define KVQ__MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVQ__MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- allocation ---- */
/* Copies *a into dst, or fills in malloc/free when a is NULL or incomplete. */
void kvq__allocator_init(kvq_allocator *dst, const kvq_allocator *a);
/* 64-byte aligned, zeroed when zero != 0. NULL on failure or size 0. */
void *kvq__alloc(const kvq_allocator *a, size_t size);
void *kvq__calloc(const kvq_allocator *a, size_t size);
void kvq__free(const kvq_allocator *a, void *p);
/* A cache's default allocator (hpool.c): blocks of up to KVQ__HPOOL_CLASSES
 * registered sizes from 2 MiB aligned mappings advised for huge pages, any
 * other size from posix_memalign. alloc and free may run on several
 * threads at once; add_size must not run beside them. kvq__hpool_add_size: 0, or -1 when the classes are full
 * (that size then goes to posix_memalign). fail_maps: tests make the next
 * n mappings fail. mapped: bytes of regions (untouched parts commit no
 * memory); in_use: bytes of registered sizes handed out and not freed. */
#define KVQ__HPOOL_CLASSES 64 /* block sizes: a layer of its own per-head codecs may have one */
typedef struct kvq__hpool kvq__hpool;
kvq_status kvq__hpool_create(kvq__hpool **out);
void kvq__hpool_destroy(kvq__hpool *p);
int kvq__hpool_add_size(kvq__hpool *p, size_t size);
void kvq__hpool_allocator(kvq__hpool *p, kvq_allocator *a);
void kvq__hpool_fail_maps(kvq__hpool *p, int n);
size_t kvq__hpool_mapped(const kvq__hpool *p);
size_t kvq__hpool_in_use(const kvq__hpool *p);
/* The whole file at path in *buf (from a; the caller frees it with a) and
 * its size in *size. A size outside [min, max] gives KVQ_ERR_CORRUPT; a file
 * that cannot be opened, sized or read, KVQ_ERR_IO. On error *buf is NULL. */
kvq_status kvq__read_file(const kvq_allocator *a, const char *path, size_t min, size_t max,
                          uint8_t **buf, size_t *size);
/* fsyncs the directory holding path (its parent; "." for a bare name), so
 * that a rename into it or a creation in it survives a crash. 0, or -1 with
 * errno set; a file system that cannot sync directories (EINVAL) counts as
 * done. */
int kvq__fsync_parent(const char *path);

/* ---- fp16 / bf16 (scalar, exact round-to-nearest-even) ---- */
static inline uint32_t kvq__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float kvq__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; finite values beyond the fp16 range saturate to
 * +-65504; NaN stays NaN, Inf stays Inf (callers reject those first). */
static inline uint16_t kvq__f16_from_f32(float f) {
    uint32_t x = kvq__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: saturate */
        return (uint16_t)(sign | 0x7bffu);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        /* value = ax as float; half subnormal unit is 2^-24 */
        float a = kvq__bits_f32(ax);
        float m = a * 16777216.0f; /* exact: scaling by 2^24 */
        /* round to nearest even integer */
        uint32_t r = (uint32_t)m;
        float frac = m - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t mant = ax & 0x007fffffu;
    uint32_t exp = (ax >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

static inline float kvq__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return kvq__bits_f32(sign | 0x7f800000u | (mant << 13));
    return kvq__bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/* Round to nearest even; NaN kept quiet. */
static inline uint16_t kvq__bf16_from_f32(float f) {
    uint32_t x = kvq__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(r >> 16);
}
static inline float kvq__bf16_to_f32(uint16_t h) { return kvq__bits_f32((uint32_t)h << 16); }

/* Little-endian loads and stores (the library targets little-endian hosts;
 * these keep the intent visible and alignment-safe). */
static inline uint16_t kvq__ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void kvq__st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline uint32_t kvq__ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline void kvq__st32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline uint64_t kvq__ld64(const uint8_t *p) {
    return (uint64_t)kvq__ld32(p) | ((uint64_t)kvq__ld32(p + 4) << 32);
}
static inline void kvq__st64(uint8_t *p, uint64_t v) {
    kvq__st32(p, (uint32_t)v);
    kvq__st32(p + 4, (uint32_t)(v >> 32));
}

/* ---- RNG: splitmix64-seeded xoshiro256**, plus Gaussian (Box-Muller) ---- */
typedef struct kvq__rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} kvq__rng;

void kvq__rng_seed(kvq__rng *r, uint64_t seed);
uint64_t kvq__rng_next(kvq__rng *r);
double kvq__rng_uniform(kvq__rng *r); /* [0, 1) with 53 bits */
double kvq__rng_gauss(kvq__rng *r);   /* N(0, 1) */

/* ---- checks ---- */
/* 1 when all n floats are finite. Uses the best SIMD path the CPU has. */
int kvq__all_finite(const float *x, size_t n);

/* ---- CPU ---- */
int kvq__cpu_has_avx2(void);   /* AVX2 + FMA + F16C, OS-enabled */
int kvq__cpu_has_avx512(void); /* F + BW + VL + DQ, OS-enabled */
int kvq__cpu_has_avxvnni(void); /* AVX2 + AVX-VNNI (CPUID 7.1 EAX bit 4) */
/* AVX-512 extensions beside F/BW/VL/DQ (0 without AVX-512) */
#define KVQ__X512_VNNI 1u /* vpdpbusd */
#define KVQ__X512_VBMI 2u /* vpermb */
unsigned kvq__cpu_avx512_features(void);

/* ---- CRC32C (Castagnoli), slicing-by-8 table built on first use ---- */
uint32_t kvq__crc32c(uint32_t crc, const void *data, size_t size);

/* ---- SHA-256 (FIPS 180-4), sha256.c ---- */
#define KVQ__SHA256_BYTES 32
typedef struct kvq__sha256_ctx {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    uint8_t buf[64];
    size_t fill;
} kvq__sha256_ctx;
void kvq__sha256_init(kvq__sha256_ctx *s);
void kvq__sha256_update(kvq__sha256_ctx *s, const void *data, size_t n);
/* Writes the digest; s is spent (copy the context first to go on). */
void kvq__sha256_final(kvq__sha256_ctx *s, uint8_t out[KVQ__SHA256_BYTES]);
void kvq__sha256(const void *data, size_t n, uint8_t out[KVQ__SHA256_BYTES]);

/* ---- random bytes from the OS (getrandom, else /dev/urandom), osrandom.c ----
 * KVQ_ERR_IO when neither is available. */
kvq_status kvq__os_random(void *buf, size_t n);

/* Writes the reason for refusing a file to why (when why_size > 0) and
 * returns KVQ_ERR_CORRUPT: the loaders' one way to say what is wrong. */
kvq_status kvq__why_corrupt(char *why, size_t why_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
