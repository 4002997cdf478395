/*
 * evalref.c - the f32 reference of `kvq eval`: rows built from logits, the
 * comparison of a compressed run's logits with them, and the reference file
 * (layout and accuracy in evalref.h).
 */
#include "evalref.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define REF_CODES 65536
#define REF_STEP (KVQT_REF_RANGE / 65535.0)
static const char ref_magic[8] = "KVQREF1";

/* ---- rows and comparison ------------------------------------------------ */

typedef struct {
    double max, lse; /* largest logit, log of the sum of exp(logits) */
    size_t top;      /* lowest index of the largest logit */
} ref_summary;

static ref_summary ref_summarize(const float *x, size_t V) {
    ref_summary s = {x[0], 0, 0};
    for (size_t i = 1; i < V; i++)
        if (x[i] > s.max)
            s.max = x[i], s.top = i;
    double sum = 0;
    for (size_t i = 0; i < V; i++)
        sum += exp((double)x[i] - s.max);
    s.lse = s.max + log(sum);
    return s;
}

static void ref_codes(const float *x, size_t V, double max, uint16_t *codes) {
    const double inv = 1.0 / REF_STEP;
    for (size_t i = 0; i < V; i++) {
        double q = (max - (double)x[i]) * inv + 0.5;
        codes[i] = q < 65535.0 ? (uint16_t)q : 65535; /* NaN counts as the tail */
    }
}

int kvqt_ref_cmp_init(kvqt_ref_cmp *c, size_t vocab) {
    c->vocab = vocab;
    c->e = malloc(REF_CODES * sizeof *c->e);
    c->codes = malloc(vocab * sizeof *c->codes);
    if (!c->e || !c->codes) {
        kvqt_ref_cmp_free(c);
        return -1;
    }
    for (size_t i = 0; i < REF_CODES; i++)
        c->e[i] = exp(-(double)i * REF_STEP);
    return 0;
}

void kvqt_ref_cmp_free(kvqt_ref_cmp *c) {
    free(c->e);
    free(c->codes);
    c->e = NULL;
    c->codes = NULL;
}

void kvqt_ref_make(kvqt_ref_row *r, const float *logits, size_t vocab, int32_t next) {
    ref_summary s = ref_summarize(logits, vocab);
    r->nll = s.lse - logits[next];
    r->top = (uint32_t)s.top;
    r->p_top = exp(s.max - s.lse);
    ref_codes(logits, vocab, s.max, r->codes);
}

/* KL(P || Q) of the distributions p_i ~ exp(-a_i step), q_i ~ exp(-b_i step):
 * with S_a = sum exp(-a_i step), KL = step / S_a * sum exp(-a_i step) (b_i -
 * a_i) + log S_b - log S_a; identical codes give exactly 0. */
static double ref_kl(const double *e, const uint16_t *a, const uint16_t *b, size_t V) {
    double sa = 0, sb = 0, acc = 0;
    for (size_t i = 0; i < V; i++) {
        double w = e[a[i]];
        sa += w;
        sb += e[b[i]];
        acc += w * ((double)b[i] - (double)a[i]);
    }
    return acc * REF_STEP / sa + log(sb) - log(sa);
}

void kvqt_ref_compare(kvqt_ref_cmp *c, const kvqt_ref_row *r, const float *logits, int32_t next,
                      kvqt_token_cmp *out) {
    ref_summary s = ref_summarize(logits, c->vocab);
    out->nll = s.lse - logits[next];
    out->nll_ref = r->nll;
    out->top1 = s.top == r->top;
    out->dp_top = fabs(exp(logits[r->top] - s.lse) - r->p_top);
    ref_codes(logits, c->vocab, s.max, c->codes);
    out->kl = ref_kl(c->e, r->codes, c->codes, c->vocab);
}

/* ---- hashing --------------------------------------------------------------- */

uint64_t kvqt_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int kvqt_file_hash(const char *path, uint64_t *size, uint64_t *hash) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    unsigned char buf[1 << 16];
    uint64_t h = KVQT_FNV_INIT, n = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        h = kvqt_fnv1a(h, buf, got);
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    *size = n;
    *hash = h;
    return bad ? -1 : 0;
}

/* ---- the file ----------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_f64(unsigned char *p, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(p, v);
}
static double get_f64(const unsigned char *p) {
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static size_t ref_record_bytes(size_t vocab) {
    return 24 + 2 * vocab;
}

/* The header's bytes; the hash of bytes 0..55 starts the file's hash. */
static void ref_header_encode(unsigned char *b, const kvqt_ref_header *h, uint64_t hash) {
    memset(b, 0, KVQT_REF_HEADER);
    memcpy(b, ref_magic, 8);
    put_u32(b + 8, KVQT_REF_HEADER);
    put_u32(b + 12, h->vocab);
    put_u64(b + 16, h->model_size);
    put_u64(b + 24, h->model_hash);
    put_u64(b + 32, h->text_hash);
    put_u64(b + 40, h->sequences);
    put_u64(b + 48, h->tokens);
    put_u64(b + 56, hash);
}

static void ref_header_decode(const unsigned char *b, kvqt_ref_header *h) {
    h->vocab = get_u32(b + 12);
    h->model_size = get_u64(b + 16);
    h->model_hash = get_u64(b + 24);
    h->text_hash = get_u64(b + 32);
    h->sequences = get_u64(b + 40);
    h->tokens = get_u64(b + 48);
}

static int ref_fail(char *err, size_t err_size, const char *msg) {
    snprintf(err, err_size, "%s", msg);
    return -1;
}

static int ref_init(kvqt_ref_file *rf, const char *path, size_t vocab) {
    memset(rf, 0, sizeof *rf);
    rf->vocab = vocab;
    rf->path = strdup(path);
    rf->rec = malloc(ref_record_bytes(vocab));
    return rf->path && rf->rec ? 0 : -1;
}

int kvqt_ref_create(kvqt_ref_file *rf, const char *path, const kvqt_ref_header *h, char *err,
                    size_t err_size) {
    if (ref_init(rf, path, h->vocab) != 0)
        return ref_fail(err, err_size, "out of memory");
    size_t tl = strlen(path) + 32;
    rf->tmp = malloc(tl);
    if (!rf->tmp)
        return ref_fail(err, err_size, "out of memory");
    snprintf(rf->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    rf->f = fopen(rf->tmp, "wb");
    if (!rf->f) {
        snprintf(err, err_size, "cannot create %s: %s", rf->tmp, strerror(errno));
        return -1;
    }
    unsigned char hb[KVQT_REF_HEADER];
    ref_header_encode(hb, h, 0);
    rf->hash = kvqt_fnv1a(KVQT_FNV_INIT, hb, 56);
    rf->header = *h;
    if (fwrite(hb, 1, sizeof hb, rf->f) != sizeof hb)
        return ref_fail(err, err_size, "write failed");
    return 0;
}

int kvqt_ref_write(kvqt_ref_file *rf, const kvqt_ref_row *r) {
    unsigned char *b = rf->rec;
    put_f64(b, r->nll);
    put_f64(b + 8, r->p_top);
    put_u32(b + 16, r->top);
    put_u32(b + 20, 0);
    for (size_t i = 0; i < rf->vocab; i++) {
        b[24 + 2 * i] = (unsigned char)r->codes[i];
        b[25 + 2 * i] = (unsigned char)(r->codes[i] >> 8);
    }
    size_t n = ref_record_bytes(rf->vocab);
    rf->hash = kvqt_fnv1a(rf->hash, b, n);
    rf->records++;
    return fwrite(b, 1, n, rf->f) == n ? 0 : -1;
}

int kvqt_ref_commit(kvqt_ref_file *rf, char *err, size_t err_size) {
    if (rf->records != rf->header.tokens) {
        snprintf(err, err_size, "%llu records written, %llu announced",
                 (unsigned long long)rf->records, (unsigned long long)rf->header.tokens);
        return -1;
    }
    unsigned char hb[KVQT_REF_HEADER];
    ref_header_encode(hb, &rf->header, rf->hash);
    int bad = fseek(rf->f, 0, SEEK_SET) != 0 || fwrite(hb, 1, sizeof hb, rf->f) != sizeof hb ||
              fflush(rf->f) != 0 || fsync(fileno(rf->f)) != 0;
    bad |= fclose(rf->f) != 0;
    rf->f = NULL;
    if (bad || rename(rf->tmp, rf->path) != 0) {
        snprintf(err, err_size, "cannot write %s: %s", rf->path, strerror(errno));
        return -1;
    }
    free(rf->tmp);
    rf->tmp = NULL;
    return 0;
}

/* The identity fields of got against want: 0, or -1 naming the first that differs. */
static int ref_identity(const kvqt_ref_header *got, const kvqt_ref_header *want, char *err,
                        size_t err_size) {
    if (got->model_size != want->model_size || got->model_hash != want->model_hash) {
        snprintf(err, err_size,
                 "made with another model (file of %llu bytes, hash %016llx; this model: %llu "
                 "bytes, hash %016llx)",
                 (unsigned long long)got->model_size, (unsigned long long)got->model_hash,
                 (unsigned long long)want->model_size, (unsigned long long)want->model_hash);
        return -1;
    }
    if (got->vocab != want->vocab) {
        snprintf(err, err_size, "vocab %u, the model has %u", got->vocab, want->vocab);
        return -1;
    }
    if (got->sequences != want->sequences || got->tokens != want->tokens ||
        got->text_hash != want->text_hash) {
        snprintf(err, err_size,
                 "made from another text (%llu sequences, %llu predicted tokens, token hash "
                 "%016llx; this text: %llu, %llu, %016llx): use the same --text, --skip and "
                 "--max-lines",
                 (unsigned long long)got->sequences, (unsigned long long)got->tokens,
                 (unsigned long long)got->text_hash, (unsigned long long)want->sequences,
                 (unsigned long long)want->tokens, (unsigned long long)want->text_hash);
        return -1;
    }
    return 0;
}

/* The file's length against its header, then the hash of every record. */
static int ref_integrity(kvqt_ref_file *rf, const unsigned char *hb, const kvqt_ref_header *got,
                         char *err, size_t err_size) {
    uint64_t rb = ref_record_bytes(got->vocab);
    if (got->vocab == 0 || got->tokens > (UINT64_MAX - KVQT_REF_HEADER) / rb)
        return ref_fail(err, err_size, "corrupt header");
    uint64_t want = KVQT_REF_HEADER + got->tokens * rb, size = KVQT_REF_HEADER;
    uint64_t h = kvqt_fnv1a(KVQT_FNV_INIT, hb, 56);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, rf->f)) > 0) {
        h = kvqt_fnv1a(h, buf, n);
        size += n;
    }
    if (size != want) {
        snprintf(err, err_size, "%s: %llu bytes, its header announces %llu",
                 size < want ? "truncated" : "too long", (unsigned long long)size,
                 (unsigned long long)want);
        return -1;
    }
    if (h != get_u64(hb + 56))
        return ref_fail(err, err_size, "corrupt: the hash of its records differs from its header's");
    return fseek(rf->f, KVQT_REF_HEADER, SEEK_SET) == 0 ? 0 : ref_fail(err, err_size, "seek failed");
}

int kvqt_ref_open(kvqt_ref_file *rf, const char *path, const kvqt_ref_header *want, char *err,
                  size_t err_size) {
    if (ref_init(rf, path, want->vocab) != 0)
        return ref_fail(err, err_size, "out of memory");
    rf->f = fopen(path, "rb");
    if (!rf->f) {
        snprintf(err, err_size, "cannot open: %s", strerror(errno));
        return -1;
    }
    unsigned char hb[KVQT_REF_HEADER];
    if (fread(hb, 1, sizeof hb, rf->f) != sizeof hb || memcmp(hb, ref_magic, 8) != 0)
        return ref_fail(err, err_size, "not a kvq reference file (no KVQREF1 header)");
    if (get_u32(hb + 8) != KVQT_REF_HEADER)
        return ref_fail(err, err_size, "unsupported header size");
    kvqt_ref_header got;
    ref_header_decode(hb, &got);
    if (ref_integrity(rf, hb, &got, err, err_size) != 0)
        return -1;
    rf->header = got;
    return ref_identity(&got, want, err, err_size);
}

int kvqt_ref_read(kvqt_ref_file *rf, kvqt_ref_row *r, char *err, size_t err_size) {
    size_t n = ref_record_bytes(rf->vocab);
    if (fread(rf->rec, 1, n, rf->f) != n)
        return ref_fail(err, err_size, "read failed");
    const unsigned char *b = rf->rec;
    r->nll = get_f64(b);
    r->p_top = get_f64(b + 8);
    r->top = get_u32(b + 16);
    if (!(r->nll >= 0 && r->nll < INFINITY) || !(r->p_top >= 0 && r->p_top <= 1) ||
        r->top >= rf->vocab) {
        snprintf(err, err_size, "record %llu is invalid", (unsigned long long)rf->records);
        return -1;
    }
    for (size_t i = 0; i < rf->vocab; i++)
        r->codes[i] = (uint16_t)(b[24 + 2 * i] | b[25 + 2 * i] << 8);
    rf->records++;
    return 0;
}

void kvqt_ref_close(kvqt_ref_file *rf) {
    if (rf->f)
        fclose(rf->f);
    if (rf->tmp)
        remove(rf->tmp);
    free(rf->tmp);
    free(rf->path);
    free(rf->rec);
    memset(rf, 0, sizeof *rf);
}
