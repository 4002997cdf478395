/*
 * common.c - allocator plumbing, RNG, CRC32C, finiteness checks, CPU
 * detection and the error strings. The only process-wide data are the CPU
 * feature flags and the CRC table, both written once under pthread_once and
 * read-only afterwards.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVQ__X86 1
#endif

const char *kvq_version_string(void) { return "0.1.0"; }

const char *kvq_strerror(kvq_status status) {
    switch (status) {
#define KVQ__STR(name, value, msg)                                                                 \
    case name:                                                                                     \
        return msg;
        KVQ_ERROR_LIST(KVQ__STR)
#undef KVQ__STR
    }
    return "unknown error";
}

/* ---- allocation ---- */
static void *kvq__default_alloc(void *ctx, size_t size) {
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, KVQ__ALIGN, size) != 0)
        return NULL;
    return p;
}
static void kvq__default_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}

void kvq__allocator_init(kvq_allocator *dst, const kvq_allocator *a) {
    if (a && a->alloc && a->free) {
        *dst = *a;
    } else {
        dst->alloc = kvq__default_alloc;
        dst->free = kvq__default_free;
        dst->ctx = NULL;
    }
}

void *kvq__alloc(const kvq_allocator *a, size_t size) {
    if (size == 0)
        return NULL;
    return a->alloc(a->ctx, size);
}

void *kvq__calloc(const kvq_allocator *a, size_t size) {
    void *p = kvq__alloc(a, size);
    if (p)
        memset(p, 0, size);
    return p;
}

void kvq__free(const kvq_allocator *a, void *p) {
    if (p)
        a->free(a->ctx, p);
}

kvq_status kvq__read_file(const kvq_allocator *a, const char *path, size_t min, size_t max,
                          uint8_t **buf, size_t *size) {
    *buf = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return KVQ_ERR_IO;
    kvq_status st = KVQ_OK;
    long len = -1;
    struct stat sb;
    int fs = fstat(fileno(f), &sb);
    if (fs != 0 || !S_ISREG(sb.st_mode)) {
        /* a directory opens, and its "size" would be a huge allocation */
        int e = fs != 0 ? errno : S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
        fclose(f);
        errno = e;
        return KVQ_ERR_IO;
    }
    if (fseek(f, 0, SEEK_END) == 0)
        len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = KVQ_ERR_IO;
    else if ((unsigned long)len < min || (unsigned long)len > max)
        st = KVQ_ERR_CORRUPT;
    else if (!(*buf = (uint8_t *)kvq__alloc(a, len ? (size_t)len : 1)))
        st = KVQ_ERR_NOMEM;
    else if (fread(*buf, 1, (size_t)len, f) != (size_t)len)
        st = KVQ_ERR_IO;
    fclose(f);
    if (st != KVQ_OK) {
        kvq__free(a, *buf);
        *buf = NULL;
        return st;
    }
    *size = (size_t)len;
    return KVQ_OK;
}

int kvq__fsync_parent(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t cut = n; /* just after the last '/' of the name */
    while (cut > 0 && path[cut - 1] != '/')
        cut--;
    char buf[4096];
    const char *dir = ".";
    if (cut > 0) {
        size_t m = cut;
        while (m > 1 && path[m - 1] == '/')
            m--;
        if (m >= sizeof buf) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(buf, path, m);
        buf[m] = 0;
        dir = buf;
    }
    int fd;
    do
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -1;
    int r;
    do
        r = fsync(fd);
    while (r != 0 && errno == EINTR);
    if (r != 0 && errno == EINVAL)
        r = 0; /* a file system that cannot sync directories: nothing more to do */
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

/* ---- RNG ---- */
static uint64_t kvq__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvq__rng_seed(kvq__rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = kvq__splitmix64(&x);
    r->has_spare = 0;
    r->spare = 0.0;
}

static inline uint64_t kvq__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvq__rng_next(kvq__rng *r) {
    uint64_t *s = r->s;
    uint64_t result = kvq__rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = kvq__rotl(s[3], 45);
    return result;
}

double kvq__rng_uniform(kvq__rng *r) { return (double)(kvq__rng_next(r) >> 11) * 0x1.0p-53; }

double kvq__rng_gauss(kvq__rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1, u2;
    do {
        u1 = kvq__rng_uniform(r);
    } while (u1 <= 0.0);
    u2 = kvq__rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586476925 * u2;
    r->spare = rad * sin(th);
    r->has_spare = 1;
    return rad * cos(th);
}

/* ---- CPU detection ---- */
static pthread_once_t kvq__cpu_once = PTHREAD_ONCE_INIT;
static int kvq__avx2_ok, kvq__avx512_ok, kvq__sse42_ok, kvq__avxvnni_ok;
static unsigned kvq__x512_feat;

#ifdef KVQ__X86
static uint64_t kvq__xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

static void kvq__cpu_detect(void) {
#ifdef KVQ__X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    kvq__sse42_ok = (c >> 20) & 1;
    if (!osxsave || !avx)
        return;
    uint64_t xcr0 = kvq__xgetbv0();
    if ((xcr0 & 6) != 6)
        return;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    int avx2 = (b >> 5) & 1;
    kvq__avx2_ok = avx2 && fma && f16c;
    unsigned a1, b1, c1, d1; /* leaf 7 subleaf 1: EAX bit 4 is AVX-VNNI (VEX vpdpbusd) */
    kvq__avxvnni_ok = kvq__avx2_ok && a >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) &&
                      ((a1 >> 4) & 1);
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    kvq__avx512_ok = kvq__avx2_ok && f && dq && bw && vl && (xcr0 & 0xe6) == 0xe6;
    if (kvq__avx512_ok)
        kvq__x512_feat = (((c >> 11) & 1) ? KVQ__X512_VNNI : 0u) | (((c >> 1) & 1) ? KVQ__X512_VBMI : 0u);
#endif
}

int kvq__cpu_has_avx2(void) {
    pthread_once(&kvq__cpu_once, kvq__cpu_detect);
    return kvq__avx2_ok;
}
int kvq__cpu_has_avxvnni(void) {
    pthread_once(&kvq__cpu_once, kvq__cpu_detect);
    return kvq__avxvnni_ok;
}
int kvq__cpu_has_avx512(void) {
    pthread_once(&kvq__cpu_once, kvq__cpu_detect);
    return kvq__avx512_ok;
}

unsigned kvq__cpu_avx512_features(void) {
    pthread_once(&kvq__cpu_once, kvq__cpu_detect);
    return kvq__x512_feat;
}

int kvq_cpu_supports(kvq_isa isa) {
    switch (isa) {
    case KVQ_ISA_AUTO:
    case KVQ_ISA_SCALAR:
        return 1;
    case KVQ_ISA_AVX2:
        return kvq__cpu_has_avx2();
    case KVQ_ISA_AVX512:
        return kvq__cpu_has_avx512();
    case KVQ_ISA_AVXVNNI:
        return kvq__cpu_has_avxvnni();
    }
    return 0;
}

kvq_isa kvq_cpu_best_isa(void) {
    return kvq__cpu_has_avx512()    ? KVQ_ISA_AVX512
           : kvq__cpu_has_avxvnni() ? KVQ_ISA_AVXVNNI
           : kvq__cpu_has_avx2()    ? KVQ_ISA_AVX2
                                    : KVQ_ISA_SCALAR;
}

const char *kvq_isa_name(kvq_isa isa) {
    switch (isa) {
    case KVQ_ISA_AUTO:
        return "auto";
    case KVQ_ISA_SCALAR:
        return "scalar";
    case KVQ_ISA_AVX2:
        return "avx2";
    case KVQ_ISA_AVX512:
        return "avx512";
    case KVQ_ISA_AVXVNNI:
        return "avxvnni";
    }
    return "unknown";
}

/* ---- finiteness ---- */
static int kvq__all_finite_scalar(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        bad |= ((u & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

#ifdef KVQ__X86
/* x * 0 is NaN exactly when x is NaN or infinite, and adding +-0 leaves a
 * sum unchanged: one FMA per 8 values, four chains; NaN propagates. */
__attribute__((target("avx2,fma"))) static int kvq__all_finite_avx2(const float *x, size_t n) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a = z, b = z, c = z, d = z;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), z, a);
        b = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), z, b);
        c = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), z, c);
        d = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), z, d);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
    if (_mm256_movemask_ps(_mm256_cmp_ps(s, s, _CMP_UNORD_Q)))
        return 0;
    return kvq__all_finite_scalar(x + i, n - i);
}
#endif

int kvq__all_finite(const float *x, size_t n) {
#ifdef KVQ__X86
    if (kvq__cpu_has_avx2())
        return kvq__all_finite_avx2(x, n);
#endif
    return kvq__all_finite_scalar(x, n);
}

/* ---- CRC32C ---- */
static pthread_once_t kvq__crc_once = PTHREAD_ONCE_INIT;
static uint32_t kvq__crc_table[8][256];

static void kvq__crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        kvq__crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            kvq__crc_table[t][i] =
                (kvq__crc_table[t - 1][i] >> 8) ^ kvq__crc_table[0][kvq__crc_table[t - 1][i] & 0xff];
    (void)kvq__sse42_ok;
}

uint32_t kvq__crc32c(uint32_t crc, const void *data, size_t size) {
    pthread_once(&kvq__crc_once, kvq__crc_init);
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    while (size >= 8) {
        uint64_t v = kvq__ld64(p) ^ crc;
        crc = kvq__crc_table[7][v & 0xff] ^ kvq__crc_table[6][(v >> 8) & 0xff] ^
              kvq__crc_table[5][(v >> 16) & 0xff] ^ kvq__crc_table[4][(v >> 24) & 0xff] ^
              kvq__crc_table[3][(v >> 32) & 0xff] ^ kvq__crc_table[2][(v >> 40) & 0xff] ^
              kvq__crc_table[1][(v >> 48) & 0xff] ^ kvq__crc_table[0][v >> 56];
        p += 8;
        size -= 8;
    }
    while (size--)
        crc = (crc >> 8) ^ kvq__crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

uint32_t kvq_crc32c(uint32_t crc, const void *data, size_t size) {
    return kvq__crc32c(crc, data, size);
}

uint16_t kvq_f32_to_f16(float x) { return kvq__f16_from_f32(x); }
float kvq_f16_to_f32(uint16_t h) { return kvq__f16_to_f32(h); }
uint16_t kvq_f32_to_bf16(float x) { return kvq__bf16_from_f32(x); }
float kvq_bf16_to_f32(uint16_t h) { return kvq__bf16_to_f32(h); }

kvq_status kvq__why_corrupt(char *why, size_t why_size, const char *fmt, ...) {
    if (why && why_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_size, fmt, ap);
        va_end(ap);
    }
    return KVQ_ERR_CORRUPT;
}
