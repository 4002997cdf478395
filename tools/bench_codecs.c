/*
 * bench_codecs.c - `kvq bench codecs` (quality and speed of every codec on
 * one core) and `kvq codecs` (the list of codecs with their sizes).
 *
 * The bench draws --count vectors (or reads them from a .npy file) and
 * splits them in two halves: codecs that need fitting are fitted on the
 * first half; every metric of every codec is measured on the second half.
 * Per codec it reports bits per value, the reconstruction error (nmse), the
 * error of inner products with random Gaussian queries computed through
 * kvq_codec_score (what attention uses), and the speed of encode (in chunks
 * of 1024 vectors, as a cache appends), decode, score (1 and 4 queries) and
 * accumulate, next to a memcpy of the same input and the f32 score measured
 * in the same run. Timing uses benchlib; every output is checked after its
 * timed loop. Uses only the public header.
 *
 * Exit status: 0 all codecs ran; 1 some codec failed at run time (its row
 * says why, the others still run); 2 bad arguments or input.
 */
#include "kvq.h"

#include "benchlib.h"
#include "cliargs.h"
#include "npy.h"
#include "peers.h"
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define BC_DEFAULT_CODECS                                                                          \
    "f32,f16,bf16,int8,int4,int4:g=32,int2,int2:g=32,tq1,tq2,tq3,tq4,tq1:nc=0,tq2:nc=0,tq3:nc=0,"  \
    "tq4:nc=0,tqp2,tqp3,tqp4,nuq2,nuq3,nuq4"
#define BC_DEFAULT_COUNT 65536
#define BC_DEFAULT_HEAD_DIM 128
#define BC_MAX_COUNT ((size_t)1 << 28)
#define BC_CHUNK 1024 /* vectors per encode call */
#define BC_HOT 64      /* vectors of the in-cache ("hot") encode block */
#define BC_NQ_ERR 16  /* queries for the inner-product error */
#define BC_MAX_CODECS 256

/* ---- seeded data (splitmix64 + xoshiro256**, Box-Muller) ---- */
typedef struct {
    uint64_t s[4];
} bc_rng;

static uint64_t bc_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void bc_seed(bc_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = bc_splitmix(&seed);
}
static uint64_t bc_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t bc_next(bc_rng *r) {
    uint64_t *s = r->s, out = bc_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = bc_rotl(s[3], 45);
    return out;
}
static double bc_uniform(bc_rng *r) { return (double)(bc_next(r) >> 11) * 0x1.0p-53; }
/* n N(0,1) values. */
static void bc_gauss(bc_rng *r, float *x, size_t n) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = bc_uniform(r), u2 = bc_uniform(r);
        double m = sqrt(-2.0 * log(u1 > 1e-300 ? u1 : 1e-300));
        x[i] = (float)(m * cos(6.283185307179586 * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(m * sin(6.283185307179586 * u2));
    }
}

/* ---- options ---- */
typedef struct {
    size_t head_dim, count;
    int head_dim_set, count_set;
    const char *data;
    const char *codecs;
    int codecs_set;
    uint64_t seed;
    int reps; /* 0 = default (3..15 within a time budget) */
    int json, csv;
    kvq_isa isa;
} bc_opts;

static int bc_parse_size(const char *s, size_t lo, size_t hi, size_t *out) {
    if (!s || !*s || *s == '-' || *s == '+')
        return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return 0;
    *out = (size_t)v;
    return 1;
}

static void bc_usage(FILE *f) {
    fprintf(
        f,
        "usage: kvq bench codecs [--head-dim N] [--count N] [--data gauss|outlier|FILE.npy]\n"
        "                        [--codec LIST] [--seed N] [--reps N]\n"
        "                        [--isa scalar|avx2|avxvnni|avx512|auto] [--json | --csv]\n"
        "  --head-dim N  values per vector, 1..1024 (default %d; a .npy file sets it)\n"
        "  --count N     vectors (default %d; a .npy file: all of its rows)\n"
        "  --data D      gauss: N(0,1) values; outlier: N(0,1) with 4 fixed channels\n"
        "                (d/8, 3d/8, 5d/8, 7d/8) of standard deviation 20, like real keys;\n"
        "                FILE.npy: float32/float16, C order, last axis = head_dim\n"
        "  --codec LIST  comma-separated codec specs (default: %s)\n"
        "  --seed N      data and query seed (default 1)\n"
        "  --reps N      timed repetitions (default: 3..15, as many as fit in 0.2 s)\n"
        "  --isa P       kernel path: scalar, avx2, avxvnni, avx512 (where kvq has it) or auto\n"
        "                (default)\n"
        "  --json        one JSON object on stdout; --csv: one line per codec\n"
        "Codecs that need fitting are fitted on the first half of the vectors; every metric is\n"
        "measured on the second half. int codecs' encode speed is compared with ggml's q8_0 / q4_0\n"
        "quantizers on the same input (encode_vs_ggml, encode_hot_vs_ggml: the median of 15\n"
        "rounds that time one pass of each back to back, kvq's speed over ggml's; the streaming\n"
        "rounds flush the last-level cache before each pass).\n"
        "Exit status: 0 ok, 1 a --data file that is missing, unreadable or not valid .npy\n"
        "data, or a codec that failed at run time, 2 usage.\n",
        BC_DEFAULT_HEAD_DIM, BC_DEFAULT_COUNT, BC_DEFAULT_CODECS);
}

/* Returns 0 to go on, or the exit status. */
static int bc_parse(int argc, char **argv, bc_opts *o) {
    memset(o, 0, sizeof *o);
    o->head_dim = BC_DEFAULT_HEAD_DIM;
    o->count = BC_DEFAULT_COUNT;
    o->data = "gauss";
    o->codecs = BC_DEFAULT_CODECS;
    o->seed = 1;
    o->isa = KVQ_ISA_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
            takes = 0;
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = 1;
            takes = 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            bc_usage(stdout);
            return -1;
        } else if (!v) {
            fprintf(stderr, "kvq bench codecs: %s needs a value (or is unknown)\n", a);
            return 2;
        } else if (strcmp(a, "--head-dim") == 0) {
            if (!bc_parse_size(v, 1, 1024, &o->head_dim)) {
                fprintf(stderr,
                        "kvq bench codecs: --head-dim must be an integer in 1..1024, got '%s'\n",
                        v);
                return 2;
            }
            o->head_dim_set = 1;
        } else if (strcmp(a, "--count") == 0) {
            if (!bc_parse_size(v, 2, BC_MAX_COUNT, &o->count)) {
                fprintf(stderr,
                        "kvq bench codecs: --count must be an integer in 2..%zu, got '%s'\n",
                        BC_MAX_COUNT, v);
                return 2;
            }
            o->count_set = 1;
        } else if (strcmp(a, "--data") == 0) {
            o->data = v;
        } else if (strcmp(a, "--codec") == 0 || strcmp(a, "--codecs") == 0) {
            o->codecs = v;
            o->codecs_set = 1;
        } else if (strcmp(a, "--seed") == 0) {
            size_t s;
            if (!bc_parse_size(v, 0, SIZE_MAX, &s)) {
                fprintf(stderr,
                        "kvq bench codecs: --seed must be a non-negative integer, got '%s'\n", v);
                return 2;
            }
            o->seed = s;
        } else if (strcmp(a, "--reps") == 0) {
            size_t r;
            if (!bc_parse_size(v, 1, 1000, &r)) {
                fprintf(stderr,
                        "kvq bench codecs: --reps must be an integer in 1..1000, got '%s'\n", v);
                return 2;
            }
            o->reps = (int)r;
        } else if (strcmp(a, "--isa") == 0) {
            if (!kvqt_parse_isa(v, &o->isa)) {
                fprintf(stderr,
                        "kvq bench codecs: --isa must be scalar, avx2, avxvnni, avx512 or auto, "
                        "got '%s'\n",
                        v);
                return 2;
            }
        } else {
            fprintf(stderr, "kvq bench codecs: unknown option '%s'\n", a);
            bc_usage(stderr);
            return 2;
        }
        i += takes;
    }
    if (o->json && o->csv) {
        fprintf(stderr, "kvq bench codecs: --json and --csv are exclusive\n");
        return 2;
    }
    return 0;
}

/* ---- the run ---- */

/* What every codec is measured on (read-only during the run). */
typedef struct {
    size_t d, nfit, nmeas;
    const float *fit, *meas;
    const float *q;      /* BC_NQ_ERR queries */
    const double *exact; /* BC_NQ_ERR x nmeas: <q_i, x_j> in double */
    double exact_rms;    /* RMS of exact */
    const float *w;      /* nmeas attention-like weights (positive, sum 1) */
    kvq_isa isa;
    kvqb_config cfg;
    const float *flush; /* paired streaming rounds: read before each pass (NULL: none) */
    size_t flush_n;
    kvqb_simd simd;
} bc_env;

typedef enum { BC_ROW_OK, BC_ROW_SKIPPED, BC_ROW_ERROR } bc_row_state;

typedef struct {
    const char *spec; /* as the user gave it */
    bc_row_state state;
    char msg[320];
    double bpv, nmse, ip_rel_rmse, ip_bias, ip_slope;
    double enc_vps, dec_vps, score_kps, score4_kps, acc_kps, enc_gbps, fit_s;
    double hot_vps, hot_gbps; /* encode of one in-cache block, repeated */
    double vs_ggml, vs_ggml_hot; /* paired rounds against ggml's quantizer (0: none) */
    size_t vector_bytes, state_bytes;
} bc_row;

typedef enum {
    BC_OP_ENCODE,
    BC_OP_DECODE,
    BC_OP_SCORE1,
    BC_OP_SCORE4,
    BC_OP_ACC,
    BC_OP_MEMCPY,
    BC_OP_ENCODE_HOT,
    BC_OP_MEMCPY_HOT,
    BC_OP_GGML,    /* ggml's quantizer (peer q8_0 / q4_0) over the same input into dst */
    BC_OP_GGML_HOT /* ... over the hot block, as BC_OP_ENCODE_HOT */
} bc_op;

typedef struct {
    bc_op op;
    const kvq_codec *c;
    const bc_env *e;
    uint8_t *enc;
    float *dec, *scores, *acc;
    void *dst; /* memcpy, ggml blocks */
    int peer;  /* BC_OP_GGML*: 8 (q8_0) or 4 (q4_0) */
} bc_ctx;

/* Vectors of the hot block (BC_HOT, or all when fewer); the hot loops run
 * n / that many blocks, rounded up. */
static size_t bc_hot_count(size_t n) { return n < BC_HOT ? n : BC_HOT; }

/* Vectors one hot loop encodes or copies in all. */
static size_t bc_hot_total(size_t n) {
    size_t m = bc_hot_count(n);
    return m ? (n + m - 1) / m * m : 0;
}

static int bc_run_op(void *p) {
    bc_ctx *x = (bc_ctx *)p;
    const bc_env *e = x->e;
    size_t n = e->nmeas, d = e->d, vb = x->c ? kvq_codec_vector_bytes(x->c) : 0;
    switch (x->op) {
    case BC_OP_ENCODE:
        for (size_t off = 0; off < n; off += BC_CHUNK) {
            size_t m = n - off < BC_CHUNK ? n - off : BC_CHUNK;
            kvq_status st = kvq_codec_encode(x->c, x->enc + off * vb, m * vb, e->meas + off * d, m);
            if (st)
                return st;
        }
        return 0;
    case BC_OP_DECODE:
        return kvq_codec_decode(x->c, x->dec, n * d, x->enc, n * vb);
    case BC_OP_SCORE1:
        return kvq_codec_score(x->c, x->scores, n, e->q, 1, x->enc, n * vb);
    case BC_OP_SCORE4:
        return kvq_codec_score(x->c, x->scores, 4 * n, e->q, 4, x->enc, n * vb);
    case BC_OP_ACC:
        return kvq_codec_accumulate(x->c, x->acc, d, e->w, 1, x->enc, n * vb);
    case BC_OP_MEMCPY:
        memcpy(x->dst, e->meas, n * d * sizeof(float));
        return 0;
    case BC_OP_ENCODE_HOT: /* the same block again and again: input and output stay in cache */
        for (size_t off = 0, m = bc_hot_count(n); off < n; off += m) {
            kvq_status st = kvq_codec_encode(x->c, x->enc, m * vb, e->meas, m);
            if (st)
                return st;
        }
        return 0;
    case BC_OP_MEMCPY_HOT:
        for (size_t off = 0, m = bc_hot_count(n); off < n; off += m)
            memcpy(x->dst, e->meas, m * d * sizeof(float));
        return 0;
    case BC_OP_GGML:
    case BC_OP_GGML_HOT: {
        const int avx2 = e->isa != KVQ_ISA_SCALAR;
        const size_t m = x->op == BC_OP_GGML ? n : bc_hot_count(n);
        for (size_t off = 0; off < n; off += m)
            (x->peer == 8 ? kvqp_quantize_q8_0 : kvqp_quantize_q4_0)((uint8_t *)x->dst, e->meas,
                                                                     m * d / 32, avx2);
        return 0;
    }
    }
    return -1;
}

/* Median seconds of one op, or a negative kvq_status. */
static int bc_time(bc_ctx *x, double *sec) {
    kvqb_stats st;
    int rc = kvqb_measure(bc_run_op, x, &x->e->cfg, &st);
    if (rc)
        return rc;
    *sec = st.median_s;
    return 0;
}

/* The ggml block format an int codec is compared with for encode speed:
 * 8 (q8_0) for int8 specs, 4 (q4_0) for int4 specs, 0 otherwise. */
static int bc_ggml_peer(const char *spec) {
    if (!strncmp(spec, "int8", 4) && (spec[4] == 0 || spec[4] == ':'))
        return 8;
    if (!strncmp(spec, "int4", 4) && (spec[4] == 0 || spec[4] == ':'))
        return 4;
    return 0;
}

/* kvq's encode speed over ggml's quantizer (g) from rounds that time one
 * pass of each back to back, in alternating order, so that both see the
 * same moments of a shared machine: the median of the rounds' ratios (0 on
 * a failed encode). With flush, each pass starts with the last-level cache
 * flushed (an untimed read of e->flush), so that both read their input
 * from memory: the measured half (16 MiB by default) fits in a 32 MiB
 * cache, and without the flush each pass found part of it left there by
 * the other (the ratio moved with the order of the passes: 0.83-1.16 for
 * the same AVX-512 int8 build). */
#define BC_PAIR_ROUNDS 15
static volatile float bc_flush_sink;
static double bc_paired(bc_ctx *k, bc_ctx *g, int flush) {
    double ratio[BC_PAIR_ROUNDS];
    const bc_env *e = k->e;
    if (bc_run_op(k) || bc_run_op(g)) /* warm-up */
        return 0;
    for (int i = 0; i < BC_PAIR_ROUNDS; i++) {
        double tk = 0, tg = 0;
        for (int j = 0; j < 2; j++) {
            bc_ctx *x = (i + j) % 2 ? g : k;
            if (flush && e->flush)
                bc_flush_sink += kvqb_sum(e->flush, e->flush_n, e->simd);
            double t0 = kvqb_now();
            if (bc_run_op(x))
                return 0;
            *(x == k ? &tk : &tg) = kvqb_now() - t0;
        }
        ratio[i] = tk > 0 ? tg / tk : 0;
    }
    return kvqb_median(ratio, BC_PAIR_ROUNDS);
}

static kvq_codec *bc_create(const char *spec, size_t d, kvq_isa isa, kvq_status *st, char *msg,
                            size_t msg_size) {
    kvq_codec_params p;
    memset(&p, 0, sizeof p);
    p.isa = isa;
    p.err_msg = msg;
    p.err_msg_size = msg_size;
    kvq_codec *c = NULL;
    *st = kvq_codec_create(&c, spec, d, &p);
    if (*st != KVQ_OK && !msg[0])
        snprintf(msg, msg_size, "%s", kvq_strerror(*st));
    return c;
}

/* Marks the row failed with a printf-style message. */
__attribute__((format(printf, 2, 3))) static void bc_error(bc_row *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    r->state = BC_ROW_ERROR;
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
}

static void bc_fail(bc_row *r, const char *what, int st) {
    bc_error(r, "%s: %s", what, kvq_strerror((kvq_status)st));
}

/* Max |a_i - b_i| over n. */
static double bc_maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double t = fabs((double)a[i] - (double)b[i]);
        if (!(t <= m))
            m = t; /* NaN propagates */
    }
    return m;
}

static void bc_run_codec(const bc_env *e, bc_row *r) {
    const size_t n = e->nmeas, d = e->d;
    char msg[256] = "";
    kvq_status st;
    kvq_codec *c = bc_create(r->spec, d, e->isa, &st, msg, sizeof msg);
    if (!c) {
        bc_error(r, "create: %s", msg);
        return;
    }
    const size_t vb = kvq_codec_vector_bytes(c);
    r->bpv = kvq_codec_bits_per_value(c);
    r->vector_bytes = vb;
    r->fit_s = 0;
    uint8_t *enc = (uint8_t *)malloc(n * vb);
    float *dec = (float *)malloc(n * d * sizeof(float));
    float *sc = (float *)malloc(BC_NQ_ERR * n * sizeof(float));
    float *s4 = (float *)malloc(4 * n * sizeof(float));
    float *acc = (float *)calloc(d, sizeof(float));
    if (!enc || !dec || !sc || !s4 || !acc) {
        bc_error(r, "out of memory");
        goto out;
    }
    if (kvq_codec_needs_fit(c)) {
        double t0 = kvqb_now();
        st = kvq_codec_fit(c, e->fit, e->nfit);
        r->fit_s = kvqb_now() - t0;
        if (st) {
            bc_fail(r, "fit", st);
            goto out;
        }
    }
    r->state_bytes = kvq_codec_state_bytes(c);

    /* timed scores go to s4; the 16-query scores in sc are the reference */
    bc_ctx x = {BC_OP_ENCODE, c, e, enc, dec, s4, acc, NULL};
    double t;
    int rc;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "encode", rc);
        goto out;
    }
    r->enc_vps = kvqb_rate((double)n, t);
    r->enc_gbps = kvqb_rate((double)n * (double)d * 4.0, t) * 1e-9;
    x.op = BC_OP_ENCODE_HOT;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "encode (hot)", rc);
        goto out;
    }
    r->hot_vps = kvqb_rate((double)bc_hot_total(n), t);
    r->hot_gbps = r->hot_vps * (double)d * 4.0 * 1e-9;
    /* against ggml's quantizer of the same bits, in paired rounds */
    const int peer = bc_ggml_peer(r->spec);
    uint8_t *gblk = peer && d % 32 == 0 ? (uint8_t *)malloc(n * d / 32 * 34) : NULL;
    if (gblk) {
        bc_ctx gx = {BC_OP_GGML, NULL, e, NULL, NULL, NULL, NULL, gblk, peer};
        x.op = BC_OP_ENCODE;
        r->vs_ggml = bc_paired(&x, &gx, 1);
        x.op = BC_OP_ENCODE_HOT;
        gx.op = BC_OP_GGML_HOT;
        r->vs_ggml_hot = bc_paired(&x, &gx, 0);
        free(gblk);
    }
    /* (the hot loop rewrote block 0 of enc with the same bytes) */
    x.op = BC_OP_DECODE;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "decode", rc);
        goto out;
    }
    r->dec_vps = kvqb_rate((double)n, t);
    /* verify encode + decode: the reconstruction error */
    double num = 0, den = 0;
    for (size_t i = 0; i < n * d; i++) {
        double v = e->meas[i], err = v - (double)dec[i];
        num += err * err;
        den += v * v;
    }
    r->nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);

    /* inner products with BC_NQ_ERR queries through the fused score */
    st = kvq_codec_score(c, sc, BC_NQ_ERR * n, e->q, BC_NQ_ERR, enc, n * vb);
    if (st) {
        bc_fail(r, "score", st);
        goto out;
    }
    double se = 0, sb = 0, sxy = 0, sxx = 0;
    for (size_t i = 0; i < BC_NQ_ERR * n; i++) {
        double ex = e->exact[i], err = (double)sc[i] - ex;
        se += err * err;
        sb += err;
        sxy += (double)sc[i] * ex;
        sxx += ex * ex;
    }
    double cnt = (double)BC_NQ_ERR * (double)n;
    r->ip_rel_rmse = e->exact_rms > 0 ? sqrt(se / cnt) / e->exact_rms : 0.0;
    r->ip_bias = e->exact_rms > 0 ? (sb / cnt) / e->exact_rms : 0.0;
    r->ip_slope = sxx > 0 ? sxy / sxx : 1.0;

    x.op = BC_OP_SCORE1;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "score", rc);
        goto out;
    }
    r->score_kps = kvqb_rate((double)n, t);
    /* verify: one query gives what the 16-query call gave for it */
    double tol = 1e-3 * e->exact_rms + 1e-6;
    if (!(bc_maxdiff(s4, sc, n) <= tol)) {
        bc_error(r, "verify: score with 1 query differs from 16 queries");
        goto out;
    }
    x.op = BC_OP_SCORE4;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "score", rc);
        goto out;
    }
    r->score4_kps = kvqb_rate((double)n, t);
    if (!(bc_maxdiff(s4, sc, 4 * n) <= tol)) {
        bc_error(r, "verify: score with 4 queries differs from 16 queries");
        goto out;
    }
    x.op = BC_OP_ACC;
    if ((rc = bc_time(&x, &t))) {
        bc_fail(r, "accumulate", rc);
        goto out;
    }
    r->acc_kps = kvqb_rate((double)n, t);
    /* verify: one fresh accumulate against the decoded values in double */
    memset(acc, 0, d * sizeof(float));
    st = kvq_codec_accumulate(c, acc, d, e->w, 1, enc, n * vb);
    if (st) {
        bc_fail(r, "accumulate", st);
        goto out;
    }
    double worst = 0;
    for (size_t tt = 0; tt < d; tt++) {
        double s = 0, mag = 0;
        for (size_t j = 0; j < n; j++) {
            s += (double)e->w[j] * dec[j * d + tt];
            mag += fabs((double)e->w[j] * dec[j * d + tt]);
        }
        double rel = fabs(acc[tt] - s) / (mag + 1e-30);
        if (!(rel <= worst))
            worst = rel;
    }
    if (!(worst <= 1e-3)) {
        bc_error(r, "verify: accumulate is off by %.3g (relative)", worst);
        goto out;
    }
    r->state = BC_ROW_OK;
out:
    free(acc);
    free(s4);
    free(sc);
    free(dec);
    free(enc);
    kvq_codec_free(c);
}

/* ---- output ---- */

/* kvq's encode speed over the peer's (same input, paired rounds:
 * bc_paired); NAN without one. */
static double bc_vs_ggml(const bc_row *r, const kvqp_result *pr, int hot) {
    double v = hot ? r->vs_ggml_hot : r->vs_ggml;
    if (!pr->ok || !bc_ggml_peer(r->spec) || r->state != BC_ROW_OK || !(v > 0))
        return NAN;
    return v;
}

/* After the table: each int codec's encode speed next to ggml's block
 * quantizer of the same bits (q8_0 / q4_0). */
static void bc_print_vs_ggml(const bc_row *rows, size_t nrows, const kvqp_result *pr) {
    int any = 0;
    for (size_t i = 0; i < nrows; i++) {
        const bc_row *r = &rows[i];
        double v = bc_vs_ggml(r, pr, 0);
        if (!isfinite(v))
            continue;
        if (!any)
            printf("\nencode vs ggml (same input; the ratio is the median of %d rounds that time "
                   "one pass of each back to back, the streaming ones each after a flush of the "
                   "last-level cache; >= 1: kvq encodes at least as fast):\n",
                   BC_PAIR_ROUNDS);
        any = 1;
        int p = bc_ggml_peer(r->spec);
        printf("  %-16s %7.2f GB/s vs %s quantize %7.2f GB/s: %.3fx (hot: %.2f vs %.2f GB/s, "
               "%.3fx)\n",
               r->spec, r->enc_gbps, p == 8 ? "q8_0" : "q4_0",
               p == 8 ? pr->q8_quant_gbps : pr->q4_quant_gbps, v, r->hot_gbps,
               p == 8 ? pr->q8_quant_hot_gbps : pr->q4_quant_hot_gbps, bc_vs_ggml(r, pr, 1));
    }
}

static void bc_print_header(const bc_opts *o, const bc_env *e, const char *cpu, double memcpy_gbps,
                            double memcpy_hot_gbps, double f32_kps, const kvqp_result *pr) {
    printf("kvq bench codecs: %zu vectors of head_dim %zu, data %s, seed %llu\n",
           e->nfit + e->nmeas, e->d, o->data, (unsigned long long)o->seed);
    printf(
        "  codecs that need fitting are fitted on the first %zu vectors; every metric is measured "
        "on the other %zu\n",
        e->nfit, e->nmeas);
    printf("  cpu %s | path %s | threads 1 | median of %d..%d timed reps | memcpy %.2f GB/s "
           "(hot %.2f) | f32 score %.2f Mkeys/s\n",
           cpu, kvq_isa_name(e->isa), e->cfg.min_reps, e->cfg.reps, memcpy_gbps, memcpy_hot_gbps,
           f32_kps * 1e-6);
    if (pr->ok)
        printf("  ggml block formats, kernels written here (%s): q8_0 quantize %.2f GB/s (hot %.2f), "
               "q4_0 quantize %.2f GB/s (hot %.2f), q4_0.q8_0 dot %.1f M rows/s, q4_0 nmse %.4f\n",
               pr->avx2 ? "avx2" : "scalar", pr->q8_quant_gbps, pr->q8_quant_hot_gbps,
               pr->q4_quant_gbps, pr->q4_quant_hot_gbps, pr->q4_dot_rows_per_s * 1e-6, pr->q4_nmse);
    printf("  nmse = sum|x-x'|^2/sum|x|^2; ip_rmse, ip_bias = RMS and mean of <q,x'>-<q,x> over "
           "RMS <q,x> (%d Gaussian queries, via score); ip_slope = regression of <q,x'> on <q,x>\n",
           BC_NQ_ERR);
    printf("  speeds on one core: encode in chunks of %d vectors (hot: one block of %d vectors "
           "that stays in cache, encoded again and again); score/acc over all %zu vectors; "
           "x f32 = score speed relative to f32\n\n",
           BC_CHUNK, BC_HOT, e->nmeas);
    printf("%-16s %6s %10s %9s %10s %8s %9s %9s %10s %7s %10s %9s %8s %8s\n", "codec", "bits",
           "nmse", "ip_rmse", "ip_bias", "ip_slope", "enc Mv/s", "dec Mv/s", "score Mk/s", "x f32",
           "score4 Mk/s", "acc Mk/s", "enc GB/s", "hot GB/s");
}

static void bc_print_row(const bc_row *r, double f32_kps) {
    if (r->state == BC_ROW_SKIPPED) {
        printf("%-16s skipped: %s\n", r->spec, r->msg);
        return;
    }
    if (r->state == BC_ROW_ERROR) {
        printf("%-16s error: %s\n", r->spec, r->msg);
        return;
    }
    printf("%-16s %6.3f %10.3e %9.4f %10.2e %8.4f %9.3f %9.3f %10.3f %7.3f %10.3f %9.3f %8.2f "
           "%8.2f\n",
           r->spec, r->bpv, r->nmse, r->ip_rel_rmse, r->ip_bias, r->ip_slope, r->enc_vps * 1e-6,
           r->dec_vps * 1e-6, r->score_kps * 1e-6, f32_kps > 0 ? r->score_kps / f32_kps : 0.0,
           r->score4_kps * 1e-6, r->acc_kps * 1e-6, r->enc_gbps, r->hot_gbps);
    fflush(stdout);
}

static void bc_print_json(const bc_opts *o, const bc_env *e, const char *cpu, double memcpy_gbps,
                          double memcpy_hot_gbps, double f32_kps, const kvqp_result *pr,
                          const bc_row *rows, size_t nrows) {
    printf("{\"memcpy_gbps\": ");
    kvqb_json_num(stdout, memcpy_gbps);
    printf(", \"memcpy_hot_gbps\": ");
    kvqb_json_num(stdout, memcpy_hot_gbps);
    printf(", \"hot_block\": %d", BC_HOT);
    printf(", \"head_dim\": %zu, \"count\": %zu, \"data\": ", e->d, e->nfit + e->nmeas);
    kvqb_json_str(stdout, o->data);
    printf(", \"threads\": 1, \"isa\": ");
    kvqb_json_str(stdout, kvq_isa_name(e->isa));
    printf(", \"cpu\": ");
    kvqb_json_str(stdout, cpu);
    printf(", \"seed\": %llu, \"fit_count\": %zu, \"measure_count\": %zu, \"min_reps\": %d, "
           "\"max_reps\": %d, \"f32_score_kps\": ",
           (unsigned long long)o->seed, e->nfit, e->nmeas, e->cfg.min_reps, e->cfg.reps);
    kvqb_json_num(stdout, f32_kps);
    if (pr->ok) {
        const struct {
            const char *k;
            double v;
        } pf[] = {
            {"q8_0_quantize_gbps", pr->q8_quant_gbps},
            {"q8_0_quantize_hot_gbps", pr->q8_quant_hot_gbps},
            {"q4_0_quantize_gbps", pr->q4_quant_gbps},
            {"q4_0_quantize_hot_gbps", pr->q4_quant_hot_gbps},
            {"q4_0_dot_rows_per_s", pr->q4_dot_rows_per_s},
            {"q4_0_nmse", pr->q4_nmse},
        };
        printf(", \"peers\": {\"isa\": ");
        kvqb_json_str(stdout, pr->avx2 ? "avx2" : "scalar");
        for (size_t k = 0; k < sizeof pf / sizeof pf[0]; k++) {
            printf(", \"%s\": ", pf[k].k);
            kvqb_json_num(stdout, pf[k].v);
        }
        printf(", \"note\": \"ggml q8_0/q4_0 block formats with kernels written in kvq (not "
               "llama.cpp's code), measured in this run\"}");
    }
    printf(", \"note\": \"codecs that need fitting are fitted on the first fit_count vectors; all "
           "metrics are measured on the other measure_count vectors\", \"results\": [");
    for (size_t i = 0; i < nrows; i++) {
        const bc_row *r = &rows[i];
        printf("%s\n  {\"codec\": ", i ? "," : "");
        kvqb_json_str(stdout, r->spec);
        printf(", \"head_dim\": %zu", e->d);
        if (r->state != BC_ROW_OK) {
            printf(", \"%s\": ", r->state == BC_ROW_SKIPPED ? "skipped" : "error");
            kvqb_json_str(stdout, r->msg);
            printf("}");
            continue;
        }
        const struct {
            const char *k;
            double v;
        } f[] = {
            {"bits_per_value", r->bpv},
            {"nmse", r->nmse},
            {"ip_rel_rmse", r->ip_rel_rmse},
            {"ip_bias", r->ip_bias},
            {"encode_vps", r->enc_vps},
            {"decode_vps", r->dec_vps},
            {"score_kps", r->score_kps},
            {"ip_slope", r->ip_slope},
            {"score4_kps", r->score4_kps},
            {"acc_kps", r->acc_kps},
            {"encode_gbps", r->enc_gbps},
            {"score_vs_f32", f32_kps > 0 ? r->score_kps / f32_kps : NAN},
            {"vector_bytes", (double)r->vector_bytes},
            {"state_bytes", (double)r->state_bytes},
            {"fit_s", r->fit_s},
            {"encode_hot_vps", r->hot_vps},
            {"encode_hot_gbps", r->hot_gbps},
        };
        for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
            printf(", \"%s\": ", f[k].k);
            kvqb_json_num(stdout, f[k].v);
        }
        if (isfinite(bc_vs_ggml(r, pr, 0))) {
            printf(", \"ggml_peer\": \"%s\", \"encode_vs_ggml\": ", bc_ggml_peer(r->spec) == 8 ? "q8_0" : "q4_0");
            kvqb_json_num(stdout, bc_vs_ggml(r, pr, 0));
            printf(", \"encode_hot_vs_ggml\": ");
            kvqb_json_num(stdout, bc_vs_ggml(r, pr, 1));
            printf(", \"ggml_pair_rounds\": %d", BC_PAIR_ROUNDS);
        }
        printf("}");
    }
    printf("\n]}\n");
}

static void bc_print_csv_header(void) {
    printf("codec,head_dim,bits_per_value,nmse,ip_rel_rmse,ip_bias,ip_slope,encode_vps,decode_vps,"
           "score_kps,score4_kps,acc_kps,encode_gbps,score_vs_f32,vector_bytes,state_bytes,fit_s,"
           "memcpy_gbps,status,encode_hot_vps,encode_hot_gbps,memcpy_hot_gbps\n");
}

static void bc_print_csv_row(const bc_row *r, size_t d, double f32_kps, double memcpy_gbps,
                             double memcpy_hot_gbps) {
    if (r->state != BC_ROW_OK) {
        /* the message may hold commas: quote it */
        printf("%s,%zu,,,,,,,,,,,,,,,,%.6g,\"%s: ", r->spec, d, memcpy_gbps,
               r->state == BC_ROW_SKIPPED ? "skipped" : "error");
        for (const char *p = r->msg; *p; p++)
            if (*p != '"')
                putchar(*p);
        printf("\",,,%.6g\n", memcpy_hot_gbps);
        return;
    }
    printf(
        "%s,%zu,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%zu,%zu,%.6g,%.6g,ok,"
        "%.6g,%.6g,%.6g\n",
        r->spec, d, r->bpv, r->nmse, r->ip_rel_rmse, r->ip_bias, r->ip_slope, r->enc_vps,
        r->dec_vps, r->score_kps, r->score4_kps, r->acc_kps, r->enc_gbps,
        f32_kps > 0 ? r->score_kps / f32_kps : 0.0, r->vector_bytes, r->state_bytes, r->fit_s,
        memcpy_gbps, r->hot_vps, r->hot_gbps, memcpy_hot_gbps);
    fflush(stdout);
}

/* ---- data ---- */

/* Loads or draws the vectors; returns 0 or the exit status. */
static int bc_data(bc_opts *o, float **out) {
    *out = NULL;
    size_t d = o->head_dim, n = o->count;
    int is_gauss = strcmp(o->data, "gauss") == 0, is_outlier = strcmp(o->data, "outlier") == 0;
    if (!is_gauss && !is_outlier) {
        char err[512];
        float *x = NULL;
        size_t rows = 0, cols = 0;
        struct stat sb;
        /* a name that is neither a data set nor a file is a usage error; a
         * file that is missing, unreadable or not valid .npy data a failure */
        if (stat(o->data, &sb) != 0 && errno == ENOENT && !strchr(o->data, '/') &&
            !strchr(o->data, '.')) {
            fprintf(stderr, "kvq bench codecs: --data must be gauss, outlier or a .npy file, got "
                            "'%s'\n", o->data);
            return 2;
        }
        if (kvqt_check_input("bench codecs", "--data", o->data) != 0)
            return 1;
        if (kvqt_npy_load(o->data, &x, &rows, &cols, err, sizeof err) != 0) {
            fprintf(stderr, "kvq bench codecs: --data: %s\n", err);
            return 1;
        }
        if (cols > 1024) {
            fprintf(stderr, "kvq bench codecs: %s: last axis %zu is not a head_dim in 1..1024\n",
                    o->data, cols);
            free(x);
            return 1;
        }
        if (o->head_dim_set && o->head_dim != cols) {
            fprintf(stderr, "kvq bench codecs: --head-dim %zu but %s has a last axis of %zu\n",
                    o->head_dim, o->data, cols);
            free(x);
            return 2;
        }
        if (o->count_set && o->count > rows) {
            fprintf(stderr, "kvq bench codecs: --count %zu but %s holds only %zu vectors\n",
                    o->count, o->data, rows);
            free(x);
            return 2;
        }
        if (!o->count_set)
            o->count = rows;
        if (o->count < 2) {
            fprintf(stderr, "kvq bench codecs: %s holds %zu vector(s); need at least 2\n", o->data,
                    rows);
            free(x);
            return 1;
        }
        o->head_dim = cols;
        for (size_t i = 0; i < o->count * cols; i++)
            if (!isfinite(x[i])) {
                fprintf(stderr, "kvq bench codecs: %s: value %zu is NaN or Inf\n", o->data, i);
                free(x);
                return 1;
            }
        *out = x;
        return 0;
    }
    float *x = (float *)malloc(n * d * sizeof(float));
    if (!x) {
        fprintf(stderr, "kvq bench codecs: out of memory for %zu x %zu floats\n", n, d);
        return 1;
    }
    bc_rng r;
    bc_seed(&r, o->seed);
    bc_gauss(&r, x, n * d);
    if (is_outlier) {
        size_t nout = d < 4 ? d : 4;
        for (size_t k = 0; k < nout; k++) {
            size_t ch = d < 4 ? k : (2 * k + 1) * d / 8;
            for (size_t i = 0; i < n; i++)
                x[i * d + ch] *= 20.0f;
        }
    }
    *out = x;
    return 0;
}

/* ---- kvq bench codecs ---- */

static int bc_is_usage_error(kvq_status st) {
    return st == KVQ_ERR_UNKNOWN_CODEC || st == KVQ_ERR_BAD_OPTION || st == KVQ_ERR_GROUP ||
           st == KVQ_ERR_HEAD_DIM || st == KVQ_ERR_ISA || st == KVQ_ERR_INVALID_ARG;
}

int kvq_tool_bench_codecs(int argc, char **argv) {
    bc_opts o;
    int rc = bc_parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;

    /* the codec list: split, then check every spec before any work */
    static bc_row rows[BC_MAX_CODECS];
    char *list = strdup(o.codecs);
    size_t nrows = 0;
    if (!list) {
        fprintf(stderr, "kvq bench codecs: out of memory\n");
        return 1;
    }
    for (char *p = list;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = 0;
        if (!*p) {
            fprintf(stderr, "kvq bench codecs: empty codec name in --codec '%s'\n", o.codecs);
            free(list);
            return 2;
        }
        if (nrows == BC_MAX_CODECS) {
            fprintf(stderr, "kvq bench codecs: more than %d codecs\n", BC_MAX_CODECS);
            free(list);
            return 2;
        }
        memset(&rows[nrows], 0, sizeof rows[nrows]);
        rows[nrows++].spec = p;
        if (!comma)
            break;
        p = comma + 1;
    }

    float *data = NULL;
    rc = bc_data(&o, &data);
    if (rc) {
        free(list);
        return rc;
    }
    const size_t d = o.head_dim;
    for (size_t i = 0; i < nrows; i++) {
        char msg[256] = "";
        kvq_status st;
        kvq_codec *c = bc_create(rows[i].spec, d, o.isa, &st, msg, sizeof msg);
        kvq_codec_free(c);
        if (st == KVQ_OK || !bc_is_usage_error(st))
            continue; /* run-time failures are reported per codec */
        if (!o.codecs_set && st == KVQ_ERR_GROUP) {
            rows[i].state = BC_ROW_SKIPPED;
            snprintf(rows[i].msg, sizeof rows[i].msg, "%s", msg);
            continue;
        }
        fprintf(stderr, "kvq bench codecs: codec '%s': %s\n", rows[i].spec, msg);
        free(data);
        free(list);
        return 2;
    }

    bc_env e;
    memset(&e, 0, sizeof e);
    e.d = d;
    e.nfit = o.count / 2;
    e.nmeas = o.count - e.nfit;
    e.fit = data;
    e.meas = data + e.nfit * d;
    e.isa = o.isa == KVQ_ISA_AUTO ? kvq_cpu_best_isa() : o.isa;
    e.cfg = kvqb_default_config();
    if (o.reps) {
        e.cfg.min_reps = e.cfg.reps = o.reps;
        e.cfg.budget_s = 0;
    }
    /* the flush of the paired streaming rounds (only when a codec has a
     * ggml peer), written once so that its pages exist */
    int paired = 0;
    for (size_t i = 0; i < nrows; i++)
        paired |= rows[i].state != BC_ROW_SKIPPED && bc_ggml_peer(rows[i].spec) != 0;
    e.flush_n = paired ? kvqb_flush_bytes() / sizeof(float) : 0;
    float *flush = paired ? (float *)malloc(e.flush_n * sizeof(float)) : NULL;
    if (flush)
        for (size_t i = 0; i < e.flush_n; i++)
            flush[i] = (float)(i & 7);
    e.flush = flush;
    e.simd = kvqb_simd_best();
    const size_t n = e.nmeas;
    float *q = (float *)malloc(BC_NQ_ERR * d * sizeof(float));
    double *exact = (double *)malloc(BC_NQ_ERR * n * sizeof(double));
    float *w = (float *)malloc(n * sizeof(float));
    void *mdst = malloc(n * d * sizeof(float));
    if (!q || !exact || !w || !mdst || (paired && !flush)) {
        fprintf(stderr, "kvq bench codecs: out of memory\n");
        free(q);
        free(exact);
        free(w);
        free(mdst);
        free(flush);
        free(data);
        free(list);
        return 1;
    }
    bc_rng r;
    bc_seed(&r, o.seed ^ 0x71756572796b7671ull);
    bc_gauss(&r, q, BC_NQ_ERR * d);
    double wsum = 0, ss = 0;
    for (size_t j = 0; j < n; j++) {
        w[j] = (float)(0.5 + bc_uniform(&r));
        wsum += w[j];
    }
    for (size_t j = 0; j < n; j++)
        w[j] = (float)(w[j] / wsum);
    for (size_t i = 0; i < BC_NQ_ERR; i++)
        for (size_t j = 0; j < n; j++) {
            double s = 0;
            for (size_t t = 0; t < d; t++)
                s += (double)q[i * d + t] * e.meas[j * d + t];
            exact[i * n + j] = s;
            ss += s * s;
        }
    e.q = q;
    e.exact = exact;
    e.exact_rms = sqrt(ss / ((double)BC_NQ_ERR * (double)n));
    e.w = w;

    /* baselines of this run: memcpy of the same input, f32 score */
    bc_ctx mx = {BC_OP_MEMCPY, NULL, &e, NULL, NULL, NULL, NULL, mdst};
    double tm = 0, memcpy_gbps = 0, memcpy_hot_gbps = 0, f32_kps = 0;
    if (bc_time(&mx, &tm) == 0 && memcmp(mdst, e.meas, n * d * sizeof(float)) == 0)
        memcpy_gbps = kvqb_rate((double)n * (double)d * 4.0, tm) * 1e-9;
    mx.op = BC_OP_MEMCPY_HOT;
    if (bc_time(&mx, &tm) == 0)
        memcpy_hot_gbps = kvqb_rate((double)bc_hot_total(n) * (double)d * 4.0, tm) * 1e-9;
    kvqp_result peers;
    if (kvqp_measure(e.meas, n, d, e.q, &e.cfg, e.isa != KVQ_ISA_SCALAR, &peers) != 0)
        memset(&peers, 0, sizeof peers);
    {
        char msg[256] = "";
        kvq_status st;
        kvq_codec *c = bc_create("f32", d, o.isa, &st, msg, sizeof msg);
        uint8_t *enc = c ? (uint8_t *)malloc(n * kvq_codec_vector_bytes(c)) : NULL;
        float *sc = (float *)malloc(n * sizeof(float));
        if (c && enc && sc &&
            kvq_codec_encode(c, enc, n * kvq_codec_vector_bytes(c), e.meas, n) == KVQ_OK) {
            bc_ctx fx = {BC_OP_SCORE1, c, &e, enc, NULL, sc, NULL, NULL};
            double tf;
            if (bc_time(&fx, &tf) == 0)
                f32_kps = kvqb_rate((double)n, tf);
        }
        free(sc);
        free(enc);
        kvq_codec_free(c);
    }

    char cpu[128];
    kvqb_cpu_name(cpu, sizeof cpu);
    if (!o.json && !o.csv)
        bc_print_header(&o, &e, cpu, memcpy_gbps, memcpy_hot_gbps, f32_kps, &peers);
    if (o.csv)
        bc_print_csv_header();
    int failed = 0;
    for (size_t i = 0; i < nrows; i++) {
        if (rows[i].state != BC_ROW_SKIPPED)
            bc_run_codec(&e, &rows[i]);
        failed |= rows[i].state == BC_ROW_ERROR;
        if (o.csv)
            bc_print_csv_row(&rows[i], d, f32_kps, memcpy_gbps, memcpy_hot_gbps);
        else if (!o.json)
            bc_print_row(&rows[i], f32_kps);
    }
    if (o.json)
        bc_print_json(&o, &e, cpu, memcpy_gbps, memcpy_hot_gbps, f32_kps, &peers, rows, nrows);
    else if (!o.csv)
        bc_print_vs_ggml(rows, nrows, &peers);
    if (failed && !o.json && !o.csv)
        printf("\nsome codecs failed (see their rows)\n");
    if (failed)
        fprintf(stderr, "kvq bench codecs: some codecs failed at run time\n");
    free(q);
    free(exact);
    free(w);
    free(mdst);
    free(flush);
    free(data);
    free(list);
    return failed ? 1 : 0;
}

/* ---- kvq codecs ---- */

static const struct {
    const char *spec, *what;
} bc_catalog[] = {
    {"f32", "float32 as is"},
    {"f16", "IEEE half, round to nearest even, saturating"},
    {"bf16", "bfloat16, round to nearest even"},
    {"int8", "symmetric, fp16 scale per vector"},
    {"int8:g=32", "symmetric, fp16 scale per 32 values"},
    {"int4", "asymmetric, fp16 scale and min per vector"},
    {"int4:g=32", "asymmetric, fp16 scale and min per 32 values"},
    {"int2", "asymmetric, fp16 scale and min per vector"},
    {"int2:g=32", "asymmetric, fp16 scale and min per 32 values"},
    {"tq1", "TurboQuant-MSE: rotation + 1-bit Lloyd-Max codebook, fp16 norm"},
    {"tq2", "TurboQuant-MSE, 2-bit codebook, fp16 norm"},
    {"tq3", "TurboQuant-MSE, 3-bit codebook, fp16 norm"},
    {"tq4", "TurboQuant-MSE, 4-bit codebook, fp16 norm"},
    {"tq3:norm=8", "TurboQuant-MSE, 3-bit, 8-bit log2 norm code"},
    {"tq4:norm=8", "TurboQuant-MSE, 4-bit, 8-bit log2 norm code"},
    {"tqp2", "TurboQuant-prod: tq1 + 1-bit QJL residual sketch (unbiased <q,k>)"},
    {"tqp3", "TurboQuant-prod: tq2 + 1-bit QJL residual sketch"},
    {"tqp4", "TurboQuant-prod: tq3 + 1-bit QJL residual sketch"},
    {"nuq1", "per-channel non-uniform 2 levels (Lloyd-Max fit)"},
    {"nuq2", "per-channel non-uniform 4 levels (Lloyd-Max fit)"},
    {"nuq3", "per-channel non-uniform 8 levels (Lloyd-Max fit)"},
    {"nuq4", "per-channel non-uniform 16 levels (Lloyd-Max fit)"},
    {"nuq5", "per-channel non-uniform 32 levels (Lloyd-Max fit)"},
    {"nuq6", "per-channel non-uniform 64 levels (Lloyd-Max fit)"},
    {"nuq7", "per-channel non-uniform 128 levels (Lloyd-Max fit)"},
    {"nuq8", "per-channel non-uniform 256 levels (Lloyd-Max fit)"},
};

/* Bits per value of spec at head_dim d into buf ("n/a" when unavailable). */
static void bc_bits(const char *spec, size_t d, char *buf, size_t size, size_t *state) {
    kvq_codec *c = NULL;
    *state = 0;
    if (kvq_codec_create(&c, spec, d, NULL) != KVQ_OK) {
        snprintf(buf, size, "n/a");
        return;
    }
    snprintf(buf, size, "%.3f", kvq_codec_bits_per_value(c));
    *state = kvq_codec_state_bytes(c);
    kvq_codec_free(c);
}

int kvq_tool_list_codecs(int argc, char **argv) {
    size_t dims[2] = {64, 128}, ndims = 2;
    int markdown = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--head-dim") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvq codecs: --head-dim needs a value\n");
                return 2;
            }
            if (!bc_parse_size(argv[++i], 1, 1024, &dims[0])) {
                fprintf(stderr, "kvq codecs: --head-dim must be an integer in 1..1024, got '%s'\n",
                        argv[i]);
                return 2;
            }
            ndims = 1;
        } else if (strcmp(argv[i], "--markdown") == 0) {
            markdown = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(
                "usage: kvq codecs [--head-dim N] [--markdown]\n"
                "  lists every codec with its bits per value (all stored bytes per vector x 8 /\n"
                "  head_dim) at head_dim 64 and 128, or at N; --markdown prints a table for "
                "docs\n");
            return 0;
        } else {
            fprintf(stderr,
                    "kvq codecs: unknown option '%s' (usage: kvq codecs [--head-dim N] "
                    "[--markdown])\n",
                    argv[i]);
            return 2;
        }
    }
    size_t sdim = dims[ndims - 1];
    if (markdown) {
        printf("| codec |");
        for (size_t k = 0; k < ndims; k++)
            printf(" bits/value (d=%zu) |", dims[k]);
        printf(" state bytes (d=%zu) | what |\n|---|", sdim);
        for (size_t k = 0; k < ndims; k++)
            printf("---:|");
        printf("---:|---|\n");
    } else {
        printf("%-12s", "codec");
        for (size_t k = 0; k < ndims; k++) {
            char h[32];
            snprintf(h, sizeof h, "bits@%zu", dims[k]);
            printf(" %9s", h);
        }
        char h[32];
        snprintf(h, sizeof h, "state@%zu", sdim);
        printf(" %10s  %s\n", h, "what");
    }
    for (size_t i = 0; i < sizeof bc_catalog / sizeof bc_catalog[0]; i++) {
        char bits[2][32];
        size_t state = 0;
        for (size_t k = 0; k < ndims; k++)
            bc_bits(bc_catalog[i].spec, dims[k], bits[k], sizeof bits[k], &state);
        if (markdown) {
            printf("| `%s` |", bc_catalog[i].spec);
            for (size_t k = 0; k < ndims; k++)
                printf(" %s |", bits[k]);
            printf(" %zu | %s |\n", state, bc_catalog[i].what);
        } else {
            printf("%-12s", bc_catalog[i].spec);
            for (size_t k = 0; k < ndims; k++)
                printf(" %9s", bits[k]);
            printf(" %10zu  %s\n", state, bc_catalog[i].what);
        }
    }
    if (!markdown)
        printf("tq/tqp also take :nc=0 (no norm correction, same size) and :seed=N; "
               "nuq state is per codec, not per vector\n");
    return 0;
}
