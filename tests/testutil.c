/* testutil.c - implementation of the test helper (see testutil.h). */
#include "testutil.h"

int tu_pass, tu_fail;
const char *tu_data = "../shared/data";

void tu_init(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            tu_data = argv[++i];
}

int tu_finish(void) {
    printf("%d passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}

const char *tu_data_dir(void) { return tu_data; }

const char *tu_redis_env(const char *name, const char **why) {
    const char *v = getenv(name);
    if (!v || !*v) {
        *why = "no redis-server (tests/with_redis.sh did not start one)";
        return NULL;
    }
    /* nothing listens on port 1: a build with hiredis says so, one without
     * says the store is unsupported before it tries */
    kvq_store *s = NULL;
    if (kvq_store_open(&s, "redis://127.0.0.1:1", NULL, NULL, 0) == KVQ_ERR_UNSUPPORTED) {
        *why = "libkvq was built without hiredis";
        return NULL;
    }
    if (s)
        kvq_store_close(s);
    *why = "";
    return v;
}

void tu_seed(tu_rng *r, uint64_t seed) { r->s = seed * 0x9e3779b97f4a7c15ull + 0x1234567ull; }
uint64_t tu_next(tu_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}
double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1.0p-53; }
double tu_gauss(tu_rng *r) {
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
void tu_fill_gauss(tu_rng *r, float *x, size_t n, float sigma) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(tu_gauss(r) * sigma);
}

double tu_rel_err(const float *a, const float *b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / (s + 1e-30));
}

static void *tu_fa_alloc(void *ctx, size_t size) {
    tu_failalloc *fa = (tu_failalloc *)ctx;
    fa->calls++;
    if (fa->fail_at && fa->calls == fa->fail_at)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, size + 64) != 0)
        return NULL;
    *(size_t *)p = size;
    fa->live_bytes += size;
    fa->live_blocks++;
    if (fa->live_bytes > fa->peak_bytes)
        fa->peak_bytes = fa->live_bytes;
    return (char *)p + 64;
}
static void tu_fa_free(void *ctx, void *ptr) {
    tu_failalloc *fa = (tu_failalloc *)ctx;
    char *p = (char *)ptr - 64;
    fa->live_bytes -= *(size_t *)p;
    fa->live_blocks--;
    free(p);
}
kvq_allocator tu_failalloc_make(tu_failalloc *fa, long fail_at) {
    memset(fa, 0, sizeof *fa);
    fa->fail_at = fail_at;
    kvq_allocator a = {tu_fa_alloc, tu_fa_free, fa};
    return a;
}

float *tu_load_npy(const char *path, size_t *shape, int *ndim) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char pre[10];
    float *out = NULL;
    char *hdr = NULL;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
        goto done;
    size_t hlen;
    if (pre[6] == 1) {
        hlen = pre[8] | (pre[9] << 8);
    } else {
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2)
            goto done;
        hlen = pre[8] | (pre[9] << 8) | ((size_t)b[0] << 16) | ((size_t)b[1] << 24);
    }
    hdr = (char *)malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen)
        goto done;
    hdr[hlen] = 0;
    int is16 = strstr(hdr, "'<f2'") != NULL, is32 = strstr(hdr, "'<f4'") != NULL;
    if ((!is16 && !is32) || strstr(hdr, "'fortran_order': True"))
        goto done;
    char *sp = strstr(hdr, "'shape': (");
    if (!sp)
        goto done;
    sp += 10;
    *ndim = 0;
    size_t total = 1;
    while (*sp && *sp != ')') {
        while (*sp == ' ' || *sp == ',')
            sp++;
        if (*sp == ')')
            break;
        size_t v = strtoull(sp, &sp, 10);
        shape[(*ndim)++] = v;
        total *= v;
    }
    out = (float *)malloc(total * sizeof(float) + 1);
    if (!out)
        goto done;
    if (is32) {
        if (fread(out, 4, total, f) != total) {
            free(out);
            out = NULL;
        }
    } else {
        for (size_t i = 0; i < total; i++) {
            unsigned char b[2];
            if (fread(b, 1, 2, f) != 2) {
                free(out);
                out = NULL;
                break;
            }
            out[i] = kvq_f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
        }
    }
done:
    free(hdr);
    fclose(f);
    return out;
}
