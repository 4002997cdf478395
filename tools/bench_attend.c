/*
 * bench_attend.c - `kvq bench attend`: the time of one decode step of
 * attention (one query per query head over one layer of 8 KV heads, 32
 * query heads, head_dim 128) against context length, for each codec, next
 * to the memory system and to peers, all measured in the same run:
 *
 * - the streaming read bandwidth of one thread and of two (and of each
 *   --threads count above 2): a vectorized sum over a buffer of at least 4x
 *   the last-level cache and at least 256 MiB, best of several passes;
 * - per codec and context: step_us (median over rounds: each round times
 *   one step of every codec and baseline of the context at every thread
 *   count, one after the other, so that the ratios compare the same moments
 *   of a shared machine; the last-level cache is flushed before every timed
 *   step, so the pages come from memory as they do when a model's other
 *   layers ran in between), bytes_read (kvq_cache_stats),
 *   floor_us = bytes_read / the read bandwidth of the thread count used,
 *   x_floor = step_us / floor_us, ratio_vs_f32 (kvq's own f32 cache) and
 *   ratio_vs_dense (the dense f32 baseline); and, since each round also
 *   reads the bandwidth buffer once per thread count, round_gbps (the
 *   median of those passes) and x_floor_round (the median over rounds of
 *   step / (bytes / that round's bandwidth): the step against the memory
 *   of the same moment, where x_floor sets the median step against the
 *   best pass of a shared machine's bandwidth test);
 * - baselines (peers_attend.c): dense:f32 (a competent f32 attention without
 *   pages) and llama.cpp:q8_0 / llama.cpp:q4_0 (ggml's CPU flash-attention
 *   path over a quantized KV cache), with the same fields;
 * - --prefill N: one append of N tokens and one causal attend of their N
 *   queries per codec (prefill_us) against the f32 cache;
 * - --threads 1,2: every row at each thread count (kvq's cfg.n_threads and
 *   the baselines'), with speedup_vs_1t = the 1-thread step / this step.
 *
 * Uses only the public header. Exit status: 0 ok, 1 a row failed at run
 * time (its row says why, the others still run), 2 usage.
 */
#include "benchlib.h"
#include "cliargs.h"
#include "kvq.h"
#include "peers.h"
#include "tool.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BA_H 8
#define BA_QH 32
#define BA_D 128
#define BA_MAX_CONTEXT ((size_t)1 << 18) /* K, V and a context's caches: ~8 GiB */
#define BA_MAX_PREFILL ((size_t)1 << 16)
#define BA_MAX_CTX 32
#define BA_MAX_CODECS 32
#define BA_MAX_THR 4 /* thread counts in one run */
#define BA_MAX_ISA 4 /* kernel paths in one run */
#define BA_TAIL 64   /* single-token appends timed at the end of a build */
#define BA_BW_MIN ((size_t)256 << 20)
#define BA_BW_ROUNDS_MIN 5  /* bandwidth: rounds of one pass per thread count, */
#define BA_BW_ROUNDS_MAX 60 /* as many as fit in BA_BW_SECONDS */
#define BA_BW_SECONDS 1.0
#define BA_MAX_ROUNDS 1000 /* --reps */
#define BA_DEFAULT_CONTEXTS "1024,4096,16384,32768"
#define BA_DEFAULT_CODECS "int8,int4:g=32,tq3,tq4"

/* ---- options ---- */
typedef struct {
    size_t ctx[BA_MAX_CTX], nctx;
    char *codecs[BA_MAX_CODECS];
    size_t ncod;
    int base[KVQP_ATT_KINDS];
    size_t thr[BA_MAX_THR], nthr, prefill, reps;
    int json, warm;
    int huge_pages; /* the caches' kvq_cache_config.huge_pages: 0 on, -1 off */
    kvq_isa isa;                /* the first of isas */
    int isa_given;              /* --isa named the paths (else: auto) */
    kvq_isa isas[BA_MAX_ISA];   /* --isa, in the order given, AUTO resolved */
    size_t nisa;
    char *codec_buf;
} ba_opts;

static void ba_usage(FILE *f) {
    fprintf(
        f,
        "usage: kvq bench attend [--context LIST|none] [--codec LIST] [--threads N[,N...]]\n"
        "                        [--baselines LIST|all|none] [--prefill N] [--reps N] [--warm]\n"
        "                        [--isa LIST] [--huge-pages on|off] [--json]\n"
        "  --context LIST   context lengths, comma-separated, each 1..%zu\n"
        "                   (default %s); none: no decode rows\n"
        "  --codec LIST     kvq codecs for K and V (default %s);\n"
        "                   f32 and f16 are always measured first\n"
        "  --threads LIST   1..64 attention threads of kvq's cache (cfg.n_threads) and of the\n"
        "                   baselines (default 1); up to %d counts, e.g. 1,2: every row at\n"
        "                   each, with the speedup over 1 thread; the floor uses the read\n"
        "                   bandwidth of the row's thread count\n"
        "  --baselines L    of dense:f32, llama.cpp:q8_0, llama.cpp:q4_0 (default all)\n"
        "  --prefill N      0..%zu: also time one append of N tokens and one causal attend of\n"
        "                   their N queries per codec, against f32 (default 0: none)\n"
        "  --reps N         1..1000 timed steps per row (default 5..9 within 0.5 s)\n"
        "  --warm           do not flush the last-level cache before each timed step\n"
        "  --isa LIST       kvq's kernel paths (cfg.isa) of scalar, avx2, avxvnni, avx512\n"
        "                   and auto (the best one, the default), up to 4: every codec on\n"
        "                   each, in the same rounds (rows int8@avx2 ...; JSON isa), vs f32\n"
        "                   against the same path's f32; the baselines always use the best\n"
        "                   SIMD level of this CPU; the prefill uses the first path\n"
        "  --huge-pages on|off  the caches' page blocks in huge-page regions (cfg.huge_pages\n"
        "                   0, the default) or from posix_memalign (-1); the bandwidth test,\n"
        "                   the flush and the dense baseline always use huge pages where\n"
        "                   the kernel gives them (the floor is the best the memory does)\n"
        "  --json           one JSON object on stdout\n"
        "One layer of %d KV heads, %d query heads, head_dim %d. Exit status: 0 ok, 1 a row\n"
        "failed at run time, 2 usage.\n",
        BA_MAX_CONTEXT, BA_DEFAULT_CONTEXTS, BA_DEFAULT_CODECS, BA_MAX_THR, BA_MAX_PREFILL, BA_H,
        BA_QH, BA_D);
}

static int ba_bad(const char *fmt, const char *a, const char *v) {
    fprintf(stderr, "kvq bench attend: ");
    fprintf(stderr, fmt, a, v);
    fprintf(stderr, "\n  (kvq bench attend --help for usage)\n");
    return 2;
}

static int ba_add_codec(ba_opts *o, char *spec) {
    for (size_t i = 0; i < o->ncod; i++)
        if (strcmp(o->codecs[i], spec) == 0)
            return 0;
    if (o->ncod == BA_MAX_CODECS) {
        fprintf(stderr, "kvq bench attend: --codec: more than %d codecs\n", BA_MAX_CODECS - 2);
        return 2;
    }
    o->codecs[o->ncod++] = spec;
    return 0;
}

/* Returns 0 to go on, -1 after --help, or the exit status. */
static int ba_parse(int argc, char **argv, ba_opts *o) {
    const char *ctx_list = BA_DEFAULT_CONTEXTS, *codec_list = BA_DEFAULT_CODECS, *base_list = "all";
    const char *thr_list = "1", *isa_list = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ba_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--warm"))
            o->warm = 1;
        else if (strcmp(a, "--context") && strcmp(a, "--codec") && strcmp(a, "--threads") &&
                 strcmp(a, "--baselines") && strcmp(a, "--prefill") && strcmp(a, "--reps") &&
                 strcmp(a, "--isa") && strcmp(a, "--huge-pages"))
            return ba_bad("unknown option '%s'%s", a, "");
        else if (!v)
            return ba_bad("%s needs a value%s", a, "");
        else {
            i++;
            if (!strcmp(a, "--context"))
                ctx_list = v;
            else if (!strcmp(a, "--codec"))
                codec_list = v;
            else if (!strcmp(a, "--baselines"))
                base_list = v;
            else if (!strcmp(a, "--isa"))
                isa_list = v, o->isa_given = 1;
            else if (!strcmp(a, "--huge-pages")) {
                if (!strcmp(v, "on"))
                    o->huge_pages = 0;
                else if (!strcmp(v, "off"))
                    o->huge_pages = -1;
                else
                    return ba_bad("%s must be on or off, got '%s'", a, v);
            } else if (!strcmp(a, "--threads"))
                thr_list = v;
            else if (!strcmp(a, "--prefill")) {
                if (!kvqb_parse_size(v, 0, BA_MAX_PREFILL, &o->prefill))
                    return ba_bad("%s must be an integer in 0..65536, got '%s'", a, v);
            } else if (!kvqb_parse_size(v, 1, BA_MAX_ROUNDS, &o->reps))
                return ba_bad("%s must be an integer in 1..1000, got '%s'", a, v);
        }
    }
    /* thread counts: ascending, without repeats */
    {
        size_t n = strlen(thr_list);
        char *buf = strdup(thr_list), *save = NULL;
        if (!buf)
            return 1;
        int bad = !n || thr_list[0] == ',' || thr_list[n - 1] == ',' || strstr(thr_list, ",,");
        for (char *tok = strtok_r(buf, ",", &save); tok && !bad; tok = strtok_r(NULL, ",", &save)) {
            size_t t;
            bad = !kvqb_parse_size(tok, 1, 64, &t);
            size_t i = 0;
            while (!bad && i < o->nthr && o->thr[i] < t)
                i++;
            if (bad || (i < o->nthr && o->thr[i] == t))
                continue;
            if (o->nthr == BA_MAX_THR) {
                fprintf(stderr, "kvq bench attend: --threads: at most %d thread counts, got '%s'\n",
                        BA_MAX_THR, thr_list);
                free(buf);
                return 2;
            }
            memmove(o->thr + i + 1, o->thr + i, (o->nthr - i) * sizeof o->thr[0]);
            o->thr[i] = t;
            o->nthr++;
        }
        free(buf);
        if (bad)
            return ba_bad("%s takes integers in 1..64 separated by commas, got '%s'", "--threads",
                          thr_list);
    }
    /* kernel paths: each of scalar, avx2, avxvnni, avx512, auto (the best),
     * in the order given, without repeats */
    {
        /* auto is one of the others: at most 4 distinct paths, all of which fit */
        _Static_assert(BA_MAX_ISA >= KVQ_ISA_AVXVNNI, "BA_MAX_ISA");
        size_t n = strlen(isa_list);
        int bad = !n || isa_list[0] == ',' || isa_list[n - 1] == ',' || strstr(isa_list, ",,");
        char *buf = bad ? NULL : strdup(isa_list), *save = NULL;
        for (char *tok = buf ? strtok_r(buf, ",", &save) : NULL; tok && !bad;
             tok = strtok_r(NULL, ",", &save)) {
            kvq_isa isa = KVQ_ISA_AUTO;
            bad = !kvqt_parse_isa(tok, &isa);
            if (isa == KVQ_ISA_AUTO)
                isa = kvq_cpu_best_isa();
            size_t i = 0;
            while (!bad && i < o->nisa && o->isas[i] != isa)
                i++;
            if (!bad && i == o->nisa)
                o->isas[o->nisa++] = isa;
        }
        free(buf);
        if (bad)
            return ba_bad("%s takes scalar, avx2, avxvnni, avx512 or auto separated by commas, got "
                          "'%s'",
                          "--isa", isa_list);
        o->isa = o->isas[0];
    }
    /* contexts */
    if (strcmp(ctx_list, "none") != 0) {
        char *buf = strdup(ctx_list);
        if (!buf)
            return 1;
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            size_t c;
            if (!kvqb_parse_size(tok, 1, BA_MAX_CONTEXT, &c)) {
                fprintf(stderr,
                        "kvq bench attend: --context takes integers in 1..%zu separated by commas "
                        "(or none), got '%s'\n",
                        BA_MAX_CONTEXT, ctx_list);
                free(buf);
                return 2;
            }
            if (o->nctx == BA_MAX_CTX) {
                fprintf(stderr, "kvq bench attend: --context: more than %d contexts\n", BA_MAX_CTX);
                free(buf);
                return 2;
            }
            o->ctx[o->nctx++] = c;
        }
        free(buf);
        if (!o->nctx || ctx_list[strlen(ctx_list) - 1] == ',' || ctx_list[0] == ',' ||
            strstr(ctx_list, ",,")) {
            fprintf(stderr, "kvq bench attend: --context: empty entry in '%s'\n", ctx_list);
            return 2;
        }
    }
    if (!o->nctx && !o->prefill) {
        fprintf(stderr, "kvq bench attend: --context none without --prefill N: nothing to do\n");
        return 2;
    }
    /* codecs: f32 and f16 first */
    size_t n = strlen(codec_list);
    if (!n || codec_list[0] == ',' || codec_list[n - 1] == ',' || strstr(codec_list, ",,")) {
        fprintf(stderr, "kvq bench attend: --codec: empty codec name in '%s'\n", codec_list);
        return 2;
    }
    o->codec_buf = malloc(n + 9);
    if (!o->codec_buf)
        return 1;
    snprintf(o->codec_buf, n + 9, "f32,f16,%s", codec_list);
    for (char *p = o->codec_buf;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = 0;
        if (ba_add_codec(o, p))
            return 2;
        if (!comma)
            break;
        p = comma + 1;
    }
    /* baselines */
    if (!strcmp(base_list, "all"))
        for (int k = 0; k < KVQP_ATT_KINDS; k++)
            o->base[k] = 1;
    else if (strcmp(base_list, "none") != 0) {
        char *buf = strdup(base_list), *save = NULL;
        if (!buf)
            return 1;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            int found = 0;
            for (int k = 0; k < KVQP_ATT_KINDS; k++)
                if (!strcmp(tok, kvqp_att_name((kvqp_att_kind)k)))
                    o->base[k] = found = 1;
            if (!found) {
                fprintf(stderr,
                        "kvq bench attend: --baselines: unknown baseline '%s' (known: dense:f32, "
                        "llama.cpp:q8_0, llama.cpp:q4_0, all, none)\n",
                        tok);
                free(buf);
                return 2;
            }
        }
        free(buf);
    }
    return 0;
}

/* ---- data ---- */
static uint64_t ba_rand(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* n N(0,1) values (Box-Muller, both outputs). */
static void ba_gauss(uint64_t *s, float *x, size_t n) {
    for (size_t i = 0; i < n; i += 2) {
        double u = ((double)(ba_rand(s) >> 11) + 0.5) * 0x1.0p-53,
               v = (double)(ba_rand(s) >> 11) * 0x1.0p-53;
        double m = sqrt(-2 * log(u));
        x[i] = (float)(m * cos(6.283185307179586 * v));
        if (i + 1 < n)
            x[i + 1] = (float)(m * sin(6.283185307179586 * v));
    }
}

/* tokens t0..t0+m-1 of src [H][ld][d] -> dst [m][H][d] (kvq's append order) */
static void ba_gather(float *dst, const float *src, size_t ld, size_t t0, size_t m) {
    for (size_t t = 0; t < m; t++)
        for (size_t h = 0; h < BA_H; h++)
            memcpy(dst + (t * BA_H + h) * BA_D, src + (h * ld + t0 + t) * BA_D,
                   BA_D * sizeof(float));
}

/* Buffers of 2 MiB and more are 2 MiB aligned and advised for huge pages,
 * as kvq's page blocks are by default: the floor is what the memory
 * delivers at its best, and the dense baseline gets the same pages. */
static void *ba_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) {
        size_t n = (bytes + 4095) / 4096 * 4096;
        return aligned_alloc(4096, n ? n : 4096);
    }
    size_t n = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, n);
#ifdef MADV_HUGEPAGE
    if (p)
        (void)madvise(p, n, MADV_HUGEPAGE); /* no THP in the kernel: 4 KiB pages */
#endif
    return p;
}

/* ---- the cache flush: an untimed read of 3x the last-level cache ---- */
typedef struct {
    const float *buf;
    size_t n;
    kvqb_simd simd;
    volatile float sink;
} ba_flush;

static void ba_flush_run(void *arg) {
    ba_flush *f = (ba_flush *)arg;
    f->sink += kvqb_sum(f->buf, f->n, f->simd);
}

/* ---- rows ---- */
typedef struct {
    char codec[96];
    int baseline; /* 0: a kvq codec */
    int kind;     /* a baseline's kvqp_att_kind; a codec's index in o.codecs */
    kvq_isa isa;  /* a kvq codec's kernel path */
    size_t context, threads;
    double step_us, step_min_us, append_ns, floor_us, x_floor, ratio_f32, ratio_dense, check;
    double round_gbps, x_floor_round; /* the rounds' own bandwidth passes (ba_context) */
    double speedup_1t; /* the same row at 1 thread over this one (0: none) */
    uint64_t bytes_read;
    int ok, rounds; /* rounds: the samples of step_us */
    char msg[200];
} ba_row;

typedef struct {
    const float *K, *V, *q; /* [H][ld][d], [QH][d] */
    size_t ld, threads;
    kvq_isa isa;
    int huge_pages; /* the caches' cfg.huge_pages (--huge-pages) */
    float *chunk_k, *chunk_v; /* [1024][H][d] */
    float *out;               /* [QH][d] */
    kvqb_config cfg;
    kvqb_pool *pool;
    kvqb_simd simd;
    const float *bw; /* the bandwidth buffer: one pass per thread count in every round */
    size_t bw_bytes;
} ba_env;

static kvq_status ba_cache(kvq_cache **c, const char *codec, size_t max_tokens, size_t threads,
                           kvq_isa isa, int huge_pages, char *msg, size_t msg_size) {
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1, cfg.n_kv_heads = BA_H, cfg.n_q_heads = BA_QH, cfg.head_dim = BA_D;
    cfg.max_tokens = max_tokens, cfg.k_codec = codec, cfg.v_codec = codec, cfg.n_threads = threads;
    cfg.isa = isa;
    cfg.huge_pages = huge_pages;
    cfg.err_msg = msg, cfg.err_msg_size = msg_size;
    msg[0] = 0;
    return kvq_cache_create(c, &cfg);
}

/* ---- decode rows: subjects built once per context, timed in rounds ----
 *
 * A subject is one kvq cache (of one codec) or one baseline, made once per
 * context with the largest thread count; each row is a subject at one
 * thread count (kvq_cache_set_threads, kvqp_att_set_threads). A round
 * times one step of every subject at every thread count, one after the
 * other, so that the ratios between rows (x floor, vs f32, vs dense, vs 1t)
 * compare steps taken at the same moments of a shared machine; a row's
 * step_us is the median of its rounds. */
typedef struct {
    kvq_cache *c;  /* a kvq codec, or */
    kvqp_att *a;   /* a baseline */
    ba_row *row0;  /* its row at the first thread count (the others follow, one group apart) */
    double one_s;  /* one step's time in the build (sizes the warm samples) */
    double *samp;  /* [thread count][round] seconds per step */
} ba_subj;

/* The median over rounds of step / (bytes / that round's bandwidth): each
 * step against the memory of the same moment (a shared machine's
 * bandwidth moves between rounds; x_floor sets the median step against the
 * best pass of the bandwidth test). */
static double ba_x_round(const double *step_s, const double *gbps, int rounds, uint64_t bytes) {
    double x[BA_MAX_ROUNDS];
    int n = 0;
    for (int i = 0; i < rounds; i++)
        if (gbps[i] > 0 && bytes > 0)
            x[n++] = step_s[i] / ((double)bytes / (gbps[i] * 1e9));
    return n ? kvqb_median(x, (size_t)n) : NAN;
}

/* A kvq cache of `codec` holding ctx tokens (built in chunks of 1024, the
 * last BA_TAIL tokens one at a time, timed), with threads threads, and its
 * first step (the bytes it reads). NULL with r->msg on failure. */
static kvq_cache *ba_build_kvq(ba_env *e, const char *codec, size_t ctx, size_t threads,
                               ba_row *r, double *one_s) {
    kvq_cache *c = NULL;
    kvq_status st = ba_cache(&c, codec, ctx, threads, r->isa, e->huge_pages, r->msg,
                              sizeof r->msg);
    if (st != KVQ_OK) {
        if (!r->msg[0])
            snprintf(r->msg, sizeof r->msg, "%s", kvq_strerror(st));
        return NULL;
    }
    size_t tail = ctx > 2 * BA_TAIL ? BA_TAIL : ctx / 2, pre = ctx - tail;
    for (size_t t = 0; t < pre && st == KVQ_OK; t += 1024) {
        size_t m = pre - t < 1024 ? pre - t : 1024;
        ba_gather(e->chunk_k, e->K, e->ld, t, m);
        ba_gather(e->chunk_v, e->V, e->ld, t, m);
        st = kvq_cache_append(c, 0, e->chunk_k, e->chunk_v, NULL, m);
    }
    /* the first single append also encodes the last chunk's staged tokens:
     * untimed; append_ns is the median of the others (a decode step's
     * append; a new page block's first touch lands on a few of them) */
    double ta[BA_TAIL];
    size_t nta = 0;
    for (size_t t = pre; t < ctx && st == KVQ_OK; t++) {
        ba_gather(e->chunk_k, e->K, e->ld, t, 1);
        ba_gather(e->chunk_v, e->V, e->ld, t, 1);
        double t0 = kvqb_now();
        st = kvq_cache_append(c, 0, e->chunk_k, e->chunk_v, NULL, 1);
        if (t > pre)
            ta[nta++] = kvqb_now() - t0;
    }
    const double ta_med = kvqb_median(ta, nta);
    kvq_stats s0, s1;
    kvq_cache_stats(c, 0, &s0);
    int32_t qpos = (int32_t)ctx;
    double t0 = kvqb_now();
    if (st == KVQ_OK)
        st = kvq_cache_attend(c, 0, e->q, &qpos, 1, e->out, BA_QH * BA_D, NULL, 0);
    *one_s = kvqb_now() - t0;
    kvq_cache_stats(c, 0, &s1);
    if (st != KVQ_OK) {
        snprintf(r->msg, sizeof r->msg, "%s: %s", s1.tokens < ctx ? "append" : "attention",
                 kvq_strerror(st));
        kvq_cache_free(c);
        return NULL;
    }
    r->append_ns = ta_med * 1e9;
    r->bytes_read = s1.bytes_read - s0.bytes_read;
    return c;
}

static kvqp_att *ba_build_base(ba_env *e, kvqp_att_kind kind, size_t ctx, size_t threads,
                               ba_row *r, double *one_s) {
    kvqp_att *a = NULL;
    int rc = kvqp_att_create(&a, kind, e->K, e->V, e->ld, ctx, BA_H, BA_QH, BA_D, e->simd, e->pool,
                             (int)threads);
    if (rc) {
        snprintf(r->msg, sizeof r->msg, "%s", rc == -1 ? "out of memory" : "unsupported shape");
        return NULL;
    }
    r->bytes_read = kvqp_att_bytes(a);
    double t0 = kvqb_now();
    kvqp_att_step(a, e->q, e->out);
    *one_s = kvqb_now() - t0;
    return a;
}

/* The relative L2 error a baseline's output may have against its double
 * reference over the same stored values: f32 sums of up to 1M terms with
 * rounding ~ 6e-8 each give ~1e-4 at worst (random-walk growth is far less);
 * the vectorized exp is within 2e-7. 1e-3 leaves a 10x margin and still
 * catches any indexing error (those give O(1) errors). */
#define BA_CHECK_TOL 1e-3

/* One sample of subject s at thr threads: the cache flushed (or, warm, one
 * untimed step), then calls steps timed; seconds per step, or -1 when kvq's
 * attention failed or gave a non-finite output. */
static double ba_sample(ba_env *e, ba_subj *s, size_t ctx, size_t thr, long calls) {
    if (s->c)
        (void)kvq_cache_set_threads(s->c, thr < BA_H ? thr : BA_H); /* the cache's own cap */
    else
        (void)kvqp_att_set_threads(s->a, (int)thr);
    int32_t qpos = (int32_t)ctx;
    if (e->cfg.prep)
        e->cfg.prep(e->cfg.prep_ctx);
    else if (s->c && kvq_cache_attend(s->c, 0, e->q, &qpos, 1, e->out, BA_QH * BA_D, NULL, 0))
        return -1;
    else if (s->a)
        kvqp_att_step(s->a, e->q, e->out);
    double t0 = kvqb_now();
    for (long k = 0; k < calls; k++) {
        if (s->a)
            kvqp_att_step(s->a, e->q, e->out);
        else if (kvq_cache_attend(s->c, 0, e->q, &qpos, 1, e->out, BA_QH * BA_D, NULL, 0))
            return -1;
    }
    double dt = (kvqb_now() - t0) / (double)calls;
    if (s->c)
        for (size_t i = 0; i < BA_QH * BA_D; i++)
            if (!isfinite(e->out[i]))
                return -1;
    return dt;
}

/* The rows of one context at every thread count (nthr groups of ns rows
 * from sb[0].row0, in subject order): build, rounds, statistics. */
static void ba_context(ba_env *e, const ba_opts *o, size_t ctx, size_t ns, ba_subj *sb,
                       size_t nthr) {
    const size_t max_thr = o->thr[nthr - 1];
    double gb[BA_MAX_THR][BA_MAX_ROUNDS]; /* the rounds' bandwidth passes */
    for (size_t i = 0; i < ns; i++) {
        ba_subj *s = &sb[i];
        ba_row *r = s->row0;
        if (r->baseline)
            s->a = ba_build_base(e, (kvqp_att_kind)r->kind, ctx, max_thr, r, &s->one_s);
        else
            s->c = ba_build_kvq(e, r->codec, ctx, max_thr, r, &s->one_s);
        for (size_t t = 1; t < nthr; t++) { /* the same build at the other counts */
            ba_row *rt = r + t * ns;
            rt->bytes_read = r->bytes_read, rt->append_ns = r->append_ns;
            memcpy(rt->msg, r->msg, sizeof rt->msg);
        }
    }
    /* rounds: reps of them (--reps), else 5..9 within budget_s per row */
    const int rmax = e->cfg.reps, rmin = e->cfg.min_reps;
    int rounds = 0;
    const double t_start = kvqb_now(), budget = e->cfg.budget_s * (double)(ns * nthr);
    while (rounds < rmax && (rounds < rmin || budget <= 0 || kvqb_now() - t_start < budget)) {
        for (size_t t = 0; t < nthr; t++) {
            const size_t n = o->thr[t];
            gb[t][rounds] = kvqb_read_gbps(n == 1 ? NULL : e->pool, (int)n, e->bw, e->bw_bytes, 1,
                                           e->simd);
        }
        for (size_t t = 0; t < nthr; t++)
            for (size_t i = 0; i < ns; i++) {
                ba_subj *s = &sb[i];
                if (!s->c && !s->a)
                    continue;
                long calls = 1;
                if (e->cfg.min_sample_s > 0 && s->one_s < e->cfg.min_sample_s)
                    calls = (long)ceil(e->cfg.min_sample_s / (s->one_s > 1e-9 ? s->one_s : 1e-9));
                double dt = ba_sample(e, s, ctx, o->thr[t], calls > 1000000 ? 1000000 : calls);
                if (dt < 0) {
                    for (size_t u = 0; u < nthr; u++)
                        snprintf(s->row0[u * ns].msg, sizeof s->row0->msg,
                                 "attention failed or produced non-finite output (%zu threads)",
                                 o->thr[t]);
                    kvq_cache_free(s->c);
                    s->c = NULL;
                    continue;
                }
                s->samp[t * rmax + rounds] = dt;
            }
        rounds++;
    }
    for (size_t i = 0; i < ns; i++) {
        ba_subj *s = &sb[i];
        double check = 0;
        if (s->a) { /* the baseline's output against its double reference */
            kvqp_att_step(s->a, e->q, e->out);
            check = kvqp_att_check(s->a, e->q, e->out);
        }
        for (size_t t = 0; t < nthr; t++) {
            ba_row *r = s->row0 + t * ns;
            r->threads = o->thr[t];
            if (!s->c && !s->a)
                continue; /* r->msg says why */
            double *x = s->samp + t * rmax;
            r->x_floor_round = ba_x_round(x, gb[t], rounds, r->bytes_read);
            r->round_gbps = kvqb_median(gb[t], (size_t)rounds); /* sorts; the last use */
            const double med = kvqb_median(x, (size_t)rounds); /* sorts x */
            r->check = check;
            if (s->a && !(check <= BA_CHECK_TOL)) {
                snprintf(r->msg, sizeof r->msg,
                         "output off its double reference by %.3g (relative L2)", check);
                continue;
            }
            r->step_us = med * 1e6;
            r->step_min_us = x[0] * 1e6;
            r->rounds = rounds;
            r->ok = 1;
        }
        kvq_cache_free(s->c);
        kvqp_att_free(s->a);
        s->c = NULL, s->a = NULL;
    }
}

/* ---- prefill ---- */
typedef struct {
    char codec[96];
    size_t tokens, threads;
    double prefill_us, append_us, attend_us, ratio_f32;
    int ok, reps;
    char msg[200];
} ba_prow;

static void ba_run_prefill(ba_env *e, const char *codec, size_t N, const float *Kc, const float *Vc,
                           const float *Q, const int32_t *qpos, float *out, size_t reps_max,
                           ba_prow *r) {
    snprintf(r->codec, sizeof r->codec, "%s", codec);
    r->tokens = N;
    r->threads = e->threads;
    double tot[8], app[8], att[8], spent = 0;
    int reps = 0;
    if (reps_max > 8)
        reps_max = 8;
    while ((size_t)reps < reps_max && (reps < 1 || spent < 2.0)) {
        kvq_cache *c = NULL;
        kvq_status st = ba_cache(&c, codec, N, e->threads, e->isa, e->huge_pages, r->msg,
                                  sizeof r->msg);
        if (st != KVQ_OK) {
            if (!r->msg[0])
                snprintf(r->msg, sizeof r->msg, "%s", kvq_strerror(st));
            return;
        }
        double t0 = kvqb_now();
        st = kvq_cache_append(c, 0, Kc, Vc, NULL, N);
        double t1 = kvqb_now();
        if (st == KVQ_OK)
            st = kvq_cache_attend(c, 0, Q, qpos, N, out, N * BA_QH * BA_D, NULL, 0);
        double t2 = kvqb_now();
        kvq_cache_free(c);
        if (st != KVQ_OK) {
            snprintf(r->msg, sizeof r->msg, "%s", kvq_strerror(st));
            return;
        }
        app[reps] = t1 - t0, att[reps] = t2 - t1, tot[reps] = t2 - t0;
        spent += t2 - t0;
        reps++;
    }
    for (size_t i = 0; i < N * BA_QH * BA_D; i++)
        if (!isfinite(out[i])) {
            snprintf(r->msg, sizeof r->msg, "attention produced non-finite output");
            return;
        }
    /* the median repetition by total time (two middle ones averaged), with
     * its own append and attend times, so that they add up */
    int idx[8];
    for (int i = 0; i < reps; i++)
        idx[i] = i;
    for (int i = 1; i < reps; i++) /* insertion sort by total */
        for (int j = i; j > 0 && tot[idx[j]] < tot[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
    int lo = idx[(reps - 1) / 2], hi = idx[reps / 2];
    r->prefill_us = 0.5 * (tot[lo] + tot[hi]) * 1e6;
    r->append_us = 0.5 * (app[lo] + app[hi]) * 1e6;
    r->attend_us = 0.5 * (att[lo] + att[hi]) * 1e6;
    r->reps = reps;
    r->ok = 1;
}

/* ---- output ---- */
/* One row of the table; with several paths, kvq's rows say theirs (int8@avx2). */
static void ba_print_row(const ba_row *r, int show_isa) {
    char name[128];
    snprintf(name, sizeof name, "%s%s%s", r->codec, show_isa && !r->baseline ? "@" : "",
             show_isa && !r->baseline ? kvq_isa_name(r->isa) : "");
    if (!r->ok) {
        printf("  %-20s %8zu %3zu  error: %s\n", name, r->context, r->threads, r->msg);
        return;
    }
    char app[32] = "-", dense[32] = "-", sp[32] = "-";
    if (!r->baseline)
        snprintf(app, sizeof app, "%.1f", r->append_ns);
    if (r->ratio_dense > 0)
        snprintf(dense, sizeof dense, "%.3fx", r->ratio_dense);
    if (r->speedup_1t > 0)
        snprintf(sp, sizeof sp, "%.2fx", r->speedup_1t);
    printf("  %-20s %8zu %3zu %11.1f %11.1f %9.2f %10.1f %7.2fx %7.2fx %7.3fx %9s %7s %11s\n",
           name, r->context, r->threads, r->step_us, r->step_min_us, r->bytes_read / 1048576.0,
           r->floor_us, r->x_floor, r->x_floor_round, r->ratio_f32, dense, sp, app);
}

static void ba_jnum(const char *key, double v) {
    printf(", \"%s\": ", key);
    kvqb_json_num(stdout, v);
}

int kvq_tool_bench_attend(int argc, char **argv) {
    ba_opts o;
    memset(&o, 0, sizeof o);
    int rc = ba_parse(argc, argv, &o);
    if (rc) {
        free(o.codec_buf);
        return rc < 0 ? 0 : rc;
    }
    /* every codec must make a cache on every path: checked before any work */
    for (size_t ii = 0; ii < o.nisa; ii++)
        for (size_t k = 0; k < o.ncod; k++) {
            char msg[256];
            kvq_cache *c = NULL;
            kvq_status st = ba_cache(&c, o.codecs[k], 64, 1, o.isas[ii], o.huge_pages, msg, sizeof msg);
            kvq_cache_free(c);
            if (st != KVQ_OK) {
                fprintf(stderr, "kvq bench attend: --codec '%s' with --isa %s: %s\n", o.codecs[k],
                        kvq_isa_name(o.isas[ii]), msg[0] ? msg : kvq_strerror(st));
                free(o.codec_buf);
                return st == KVQ_ERR_NOMEM ? 1 : 2;
            }
        }
    const size_t max_thr = o.thr[o.nthr - 1];
    char thr_str[64] = "";
    for (size_t i = 0; i < o.nthr; i++)
        snprintf(thr_str + strlen(thr_str), sizeof thr_str - strlen(thr_str), "%s%zu", i ? "," : "",
                 o.thr[i]);
    ba_env e;
    memset(&e, 0, sizeof e);
    e.threads = o.thr[0];
    e.isa = o.isa;
    e.huge_pages = o.huge_pages;
    e.simd = kvqb_simd_best();
    e.pool = kvqb_pool_create(max_thr > 2 ? (int)max_thr : 2);
    char cpu[128], cpu_detail[256];
    kvqb_cpu_name(cpu, sizeof cpu);
    kvqb_cpu_detail(cpu_detail, sizeof cpu_detail);
    /* the kernel's THP setting, e.g. "always [madvise] never" */
    char thp[64] = "unknown";
    FILE *tf = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (tf) {
        if (!fgets(thp, sizeof thp, tf))
            snprintf(thp, sizeof thp, "unknown");
        thp[strcspn(thp, "\n")] = 0;
        fclose(tf);
    }
    const char *kvq_path = kvq_isa_name(o.isa);
    char paths[64] = "";
    for (size_t i = 0; i < o.nisa; i++)
        snprintf(paths + strlen(paths), sizeof paths - strlen(paths), "%s%s", i ? "," : "",
                 kvq_isa_name(o.isas[i]));

    /* 1. read bandwidth */
    size_t llc = kvqb_llc_bytes(), llc_eff = llc ? llc : (size_t)32 << 20;
    size_t bw_bytes = 4 * llc_eff > BA_BW_MIN ? 4 * llc_eff : BA_BW_MIN;
    float *bw = ba_alloc(bw_bytes);
    if (!e.pool || !bw) {
        fprintf(stderr, "kvq bench attend: out of memory (or threads) for the bandwidth test\n");
        free(bw);
        kvqb_pool_free(e.pool);
        free(o.codec_buf);
        return 1;
    }
    for (size_t i = 0; i < bw_bytes / sizeof(float); i++)
        bw[i] = (float)(i & 7);
    /* rounds of one pass per thread count, alternating, so that both see
     * the same moments of a shared machine; the best pass of each */
    /* bwt[n]: n threads; 1 and 2 always, and every count of --threads */
    double bwt[65] = {0};
    int bw_rounds = 0;
    kvqb_read_gbps(e.pool, 2, bw, bw_bytes, 1, e.simd); /* warm-up */
    for (double t0 = kvqb_now(); bw_rounds < BA_BW_ROUNDS_MIN ||
                                 (bw_rounds < BA_BW_ROUNDS_MAX && kvqb_now() - t0 < BA_BW_SECONDS);
         bw_rounds++)
        for (size_t n = 1; n <= max_thr || n <= 2; n++) {
            int want = n <= 2;
            for (size_t i = 0; i < o.nthr; i++)
                want |= o.thr[i] == n;
            if (!want)
                continue;
            double g = kvqb_read_gbps(n == 1 ? NULL : e.pool, (int)n, bw, bw_bytes, 1, e.simd);
            bwt[n] = g > bwt[n] ? g : bwt[n];
        }
    const double bw1 = bwt[1], bw2 = bwt[2];
    e.bw = bw, e.bw_bytes = bw_bytes; /* and one pass per thread count in each round */

    /* 2. data: K, V [H][maxT][d] (contiguous per KV head: the dense
     * baseline reads them as they are), queries */
    size_t maxT = o.prefill;
    for (size_t i = 0; i < o.nctx; i++)
        maxT = o.ctx[i] > maxT ? o.ctx[i] : maxT;
    const size_t HD = BA_H * BA_D;
    float *K = ba_alloc(maxT * HD * sizeof(float)), *V = ba_alloc(maxT * HD * sizeof(float));
    float *q = ba_alloc(BA_QH * BA_D * sizeof(float)),
          *out = ba_alloc(BA_QH * BA_D * sizeof(float));
    float *ck = ba_alloc(1024 * HD * sizeof(float)), *cv = ba_alloc(1024 * HD * sizeof(float));
    size_t flush_bytes = kvqb_flush_bytes();
    ba_flush fl = {o.warm ? NULL : ba_alloc(flush_bytes), flush_bytes / sizeof(float), e.simd, 0};
    ba_row *rows = calloc(o.nctx * o.nthr * (o.nisa * o.ncod + KVQP_ATT_KINDS) + 1, sizeof *rows);
    ba_prow *prows = calloc(o.nthr * o.ncod + 1, sizeof *prows);
    if (!K || !V || !q || !out || !ck || !cv || (!o.warm && !fl.buf) || !rows || !prows) {
        fprintf(stderr, "kvq bench attend: out of memory for %zu tokens\n", maxT);
        rc = 1;
        goto done;
    }
    {
        uint64_t s = 42;
        for (size_t h = 0; h < BA_H; h++) {
            ba_gauss(&s, K + h * maxT * BA_D, maxT * BA_D);
            ba_gauss(&s, V + h * maxT * BA_D, maxT * BA_D);
            /* keys like real ones: two outlier channels and one offset channel */
            for (size_t t = 0; t < maxT; t++) {
                float *k = K + (h * maxT + t) * BA_D;
                k[5] *= 8.0f, k[77] *= 8.0f, k[6] += 4.0f;
            }
        }
        ba_gauss(&s, q, BA_QH * BA_D);
    }
    if (fl.buf)
        for (size_t i = 0; i < fl.n; i++)
            ((float *)fl.buf)[i] = (float)(i & 3);
    e.K = K, e.V = V, e.q = q, e.ld = maxT, e.out = out, e.chunk_k = ck, e.chunk_v = cv;
    e.cfg = kvqb_default_config();
    e.cfg.warmup = 1;
    e.cfg.min_reps = 5;
    e.cfg.reps = 9;
    e.cfg.budget_s = 0.5;
    e.cfg.min_sample_s = o.warm ? 2e-3 : 0;
    if (o.reps) {
        e.cfg.min_reps = e.cfg.reps = (int)o.reps;
        e.cfg.budget_s = 0;
    }
    if (!o.warm) {
        e.cfg.prep = ba_flush_run;
        e.cfg.prep_ctx = &fl;
    }

    /* the baselines' kernel paths, from small instances */
    char bpath[KVQP_ATT_KINDS][48];
    for (int k = 0; k < KVQP_ATT_KINDS; k++) {
        kvqp_att *a = NULL;
        snprintf(bpath[k], sizeof bpath[k], "?");
        if (kvqp_att_create(&a, (kvqp_att_kind)k, K, V, maxT, 1, BA_H, BA_QH, BA_D, e.simd, NULL,
                            1) == 0)
            snprintf(bpath[k], sizeof bpath[k], "%s", kvqp_att_path(a));
        kvqp_att_free(a);
    }

    if (!o.json) {
        printf("kvq bench attend: one decode step (one query per query head) over 1 layer of %d KV "
               "heads, %d query heads, head_dim %d\n",
               BA_H, BA_QH, BA_D);
        printf("  cpu %s (%s)\n  kvq path %s%s | threads %s (kvq cache n_threads; baselines too: "
               "dense:f32 split over KV heads, llama.cpp over query heads)\n",
               cpu, cpu_detail, paths, o.isa_given ? " (--isa)" : " (auto)", thr_str);
        printf("  page blocks: %s | transparent huge pages: %s\n",
               o.huge_pages == 0 ? "huge-page regions (--huge-pages on)"
                                 : "posix_memalign (--huge-pages off)",
               thp);
        printf(
            "  read bandwidth (%s sum over %zu MiB, >= 4x the %zu MiB last-level cache%s, best of "
            "%d passes each): 1 thread %.1f GB/s, 2 threads %.1f GB/s",
            kvqb_simd_name(e.simd), bw_bytes >> 20, llc_eff >> 20, llc ? "" : " (assumed)",
            bw_rounds, bw1, bw2);
        for (size_t i = 0; i < o.nthr; i++)
            if (o.thr[i] > 2)
                printf(", %zu threads %.1f GB/s", o.thr[i], bwt[o.thr[i]]);
        printf(
            "\n  floor = bytes read / the read bandwidth of the row's thread count (thr); x floor "
            "= step / floor; step = median over %d..%d rounds, each timing one step of every "
            "row of a context\n  (every codec and baseline at every thread count, one after the "
            "other: ratios compare the same moments)%s\n  x round: each round also reads the "
            "bandwidth buffer once per thread count; the median over rounds of step / (bytes / "
            "that round's bandwidth)\n",
            e.cfg.min_reps, e.cfg.reps,
            o.warm ? "; warm: the cache is not flushed (an untimed step first)"
                   : "; the last-level cache flushed before each step (untimed)");
        if (o.nctx)
            printf("  baselines (same run, written here from public descriptions): dense:f32 [%s], "
                   "llama.cpp:q8_0 [%s], llama.cpp:q4_0 [%s]\n"
                   "  vs f32, vs dense: step over kvq's f32 cache / the dense:f32 baseline at the "
                   "same thread count; vs 1t: the 1-thread step over this one; append ns/t: the median "
                   "single-token append at the end of the build\n",
                   bpath[0], bpath[1], bpath[2]);
        if (o.nctx)
            printf("\n  %-20s %8s %3s %11s %11s %9s %10s %8s %8s %8s %9s %7s %11s\n", "codec",
                   "context", "thr", "step_us", "min_us", "MiB read", "floor_us", "x floor",
                   "x round", "vs f32", "vs dense", "vs 1t", "append ns/t");
        fflush(stdout);
    }

    /* 3. decode rows, per context (ba_context): kvq f32, the dense baseline,
     * the other codecs, the llama.cpp baselines, each at every thread
     * count, timed in the same rounds; printed when the context is done */
    size_t nrows = 0;
    const size_t ns = o.nisa * o.ncod + KVQP_ATT_KINDS;
    ba_subj sb[BA_MAX_ISA * BA_MAX_CODECS + KVQP_ATT_KINDS];
    double *samp = calloc(ns * o.nthr * (size_t)e.cfg.reps, sizeof(double));
    if (!samp) {
        fprintf(stderr, "kvq bench attend: out of memory\n");
        rc = 1;
        goto done;
    }
    for (size_t ci = 0; ci < o.nctx; ci++) {
        const size_t ctx = o.ctx[ci];
        ba_row *first = rows + nrows;
        size_t nsub = 0;
        /* subject order: per path f32 (then, after the first, dense) and the
         * other codecs; then llama.cpp */
        int order[BA_MAX_ISA * BA_MAX_CODECS + KVQP_ATT_KINDS][3]; /* {baseline, index, path} */
        for (size_t ii = 0; ii < o.nisa; ii++)
            for (size_t k = 0; k < o.ncod; k++) {
                order[nsub][0] = 0, order[nsub][1] = (int)k, order[nsub++][2] = (int)ii;
                if (ii == 0 && k == 0 && o.base[KVQP_DENSE_F32])
                    order[nsub][0] = 1, order[nsub][1] = KVQP_DENSE_F32, order[nsub++][2] = 0;
            }
        for (int k = 1; k < KVQP_ATT_KINDS; k++)
            if (o.base[k])
                order[nsub][0] = 1, order[nsub][1] = k, order[nsub++][2] = 0;
        for (size_t t = 0; t < o.nthr; t++)
            for (size_t i = 0; i < nsub; i++) {
                ba_row *r = &first[t * nsub + i];
                r->baseline = order[i][0];
                r->kind = order[i][1];
                r->isa = o.isas[order[i][2]];
                snprintf(r->codec, sizeof r->codec, "%s",
                         r->baseline ? kvqp_att_name((kvqp_att_kind)r->kind) : o.codecs[r->kind]);
                r->context = ctx;
                r->threads = o.thr[t];
            }
        for (size_t i = 0; i < nsub; i++) {
            memset(&sb[i], 0, sizeof sb[i]);
            sb[i].row0 = &first[i];
            sb[i].samp = samp + i * o.nthr * (size_t)e.cfg.reps;
        }
        ba_context(&e, &o, ctx, nsub, sb, o.nthr);
        for (size_t t = 0; t < o.nthr; t++) {
            ba_row *g = first + t * nsub;
            const double bwn = bwt[o.thr[t]];
            double dense_us = 0;
            for (size_t i = 0; i < nsub; i++)
                if (g[i].ok && g[i].baseline && g[i].kind == KVQP_DENSE_F32)
                    dense_us = g[i].step_us;
            for (size_t i = 0; i < nsub; i++) {
                ba_row *r = &g[i];
                if (!r->ok) {
                    rc = 1;
                    continue;
                }
                r->floor_us = (double)r->bytes_read / (bwn * 1e9) * 1e6;
                r->x_floor = r->floor_us > 0 ? r->step_us / r->floor_us : NAN;
                /* against kvq's f32 cache on the same path (baselines: the first) */
                double f32_us = 0;
                for (size_t j = 0; j < nsub; j++)
                    if (!g[j].baseline && g[j].kind == 0 && g[j].ok &&
                        (r->baseline ? g[j].isa == o.isas[0] : g[j].isa == r->isa))
                        f32_us = g[j].step_us;
                r->ratio_f32 = f32_us > 0 ? r->step_us / f32_us : NAN;
                r->ratio_dense = dense_us > 0 ? r->step_us / dense_us : NAN;
                /* the same subject at 1 thread (the first group) */
                if (t > 0 && o.thr[0] == 1 && first[i].ok)
                    r->speedup_1t = first[i].step_us / r->step_us;
            }
        }
        /* each group: kvq rows first, then the baselines (table and JSON) */
        for (size_t t = 0; t < o.nthr; t++) {
            ba_row *g = first + t * nsub, tmp[BA_MAX_ISA * BA_MAX_CODECS + KVQP_ATT_KINDS];
            size_t nt = 0;
            for (int b = 0; b < 2; b++)
                for (size_t i = 0; i < nsub; i++)
                    if (g[i].baseline == b)
                        tmp[nt++] = g[i];
            memcpy(g, tmp, nsub * sizeof *g);
            if (!o.json) {
                for (size_t i = 0; i < nsub; i++)
                    ba_print_row(&g[i], o.nisa > 1);
                printf("\n");
                fflush(stdout);
            }
        }
        nrows += o.nthr * nsub;
    }
    free(samp);

    /* 4. prefill */
    size_t nprow = 0;
    if (o.prefill) {
        const size_t N = o.prefill;
        float *Kc = ba_alloc(N * HD * sizeof(float)), *Vc = ba_alloc(N * HD * sizeof(float));
        float *Q = ba_alloc(N * BA_QH * BA_D * sizeof(float));
        float *O = ba_alloc(N * BA_QH * BA_D * sizeof(float));
        int32_t *qp = malloc(N * sizeof(int32_t));
        if (!Kc || !Vc || !Q || !O || !qp) {
            fprintf(stderr, "kvq bench attend: out of memory for a prefill of %zu tokens\n", N);
            rc = 1;
        } else {
            ba_gather(Kc, K, maxT, 0, N);
            ba_gather(Vc, V, maxT, 0, N);
            uint64_t s = 7;
            ba_gauss(&s, Q, N * BA_QH * BA_D);
            for (size_t i = 0; i < N; i++)
                qp[i] = (int32_t)i;
            if (!o.json)
                printf("  prefill: one append of %zu tokens and one causal attend of their %zu "
                       "queries, median of 1..3\n  %-16s %8s %3s %12s %12s %12s %9s\n",
                       N, N, "codec", "tokens", "thr", "prefill_us", "append_us", "attend_us",
                       "vs f32");
            for (size_t ti = 0; ti < o.nthr; ti++) {
                e.threads = o.thr[ti];
                const ba_prow *f32 = &prows[nprow];
                for (size_t k = 0; k < o.ncod; k++) {
                    ba_prow *r = &prows[nprow++];
                    ba_run_prefill(&e, o.codecs[k], N, Kc, Vc, Q, qp, O, o.reps ? o.reps : 3, r);
                    r->ratio_f32 = f32->ok && r->ok ? r->prefill_us / f32->prefill_us : NAN;
                    if (!r->ok)
                        rc = 1;
                    if (o.json)
                        continue;
                    if (r->ok)
                        printf("  %-16s %8zu %3zu %12.0f %12.0f %12.0f %8.3fx\n", r->codec, N,
                               e.threads, r->prefill_us, r->append_us, r->attend_us, r->ratio_f32);
                    else
                        printf("  %-16s %8zu %3zu  error: %s\n", r->codec, N, e.threads, r->msg);
                    fflush(stdout);
                }
            }
        }
        free(Kc), free(Vc), free(Q), free(O), free(qp);
    }

    /* 5. JSON */
    if (o.json) {
        printf("{\"cpu\": ");
        kvqb_json_str(stdout, cpu);
        printf(", \"cpu_detail\": ");
        kvqb_json_str(stdout, cpu_detail);
        printf(", \"isa\": ");
        kvqb_json_str(stdout, kvq_path);
        printf(", \"isa_forced\": %s, \"isas\": [", o.isa_given ? "true" : "false");
        for (size_t i = 0; i < o.nisa; i++)
            printf("%s\"%s\"", i ? ", " : "", kvq_isa_name(o.isas[i]));
        printf("]");
        printf(", \"huge_pages\": %s, \"thp\": ", o.huge_pages == 0 ? "true" : "false");
        kvqb_json_str(stdout, thp);
        printf(", \"bench_simd\": ");
        kvqb_json_str(stdout, kvqb_simd_name(e.simd));
        printf(", \"threads\": %zu, \"baseline_threads\": %zu, \"thread_counts\": [%s], "
               "\"kv_heads\": %d, \"q_heads\": %d, \"head_dim\": %d, \"llc_bytes\": %zu, "
               "\"bandwidth_buffer_bytes\": %zu",
               max_thr, max_thr, thr_str, BA_H, BA_QH, BA_D, llc, bw_bytes);
        printf(", \"bandwidth_passes\": %d", bw_rounds);
        ba_jnum("read_gbps_1t", bw1);
        ba_jnum("read_gbps_2t", bw2);
        for (size_t i = 0; i < o.nthr; i++)
            if (o.thr[i] > 2) {
                char key[32];
                snprintf(key, sizeof key, "read_gbps_%zut", o.thr[i]);
                ba_jnum(key, bwt[o.thr[i]]);
            }
        ba_jnum("floor_gbps", bwt[max_thr]); /* of "threads"; each row has its own floor */
        printf(", \"cold_cache\": %s, \"baseline_paths\": {", o.warm ? "false" : "true");
        for (int k = 0; k < KVQP_ATT_KINDS; k++) {
            printf("%s\"%s\": ", k ? ", " : "", kvqp_att_name((kvqp_att_kind)k));
            kvqb_json_str(stdout, bpath[k]);
        }
        printf("}, \"results\": [");
        for (size_t i = 0; i < nrows; i++) {
            const ba_row *r = &rows[i];
            printf("%s\n  {\"codec\": ", i ? "," : "");
            kvqb_json_str(stdout, r->codec);
            printf(", \"kind\": \"%s\", \"context\": %zu, \"threads\": %zu",
                   r->baseline ? "baseline" : "kvq", r->context, r->threads);
            if (!r->baseline)
                printf(", \"isa\": \"%s\"", kvq_isa_name(r->isa));
            if (!r->ok) {
                printf(", \"error\": ");
                kvqb_json_str(stdout, r->msg);
                printf("}");
                continue;
            }
            ba_jnum("step_us", r->step_us);
            ba_jnum("step_min_us", r->step_min_us);
            printf(", \"rounds\": %d", r->rounds);
            printf(", \"bytes_read\": %llu", (unsigned long long)r->bytes_read);
            ba_jnum("floor_us", r->floor_us);
            ba_jnum("x_floor", r->x_floor);
            ba_jnum("x_floor_min", r->floor_us > 0 ? r->step_min_us / r->floor_us : NAN);
            ba_jnum("round_gbps", r->round_gbps);
            ba_jnum("x_floor_round", r->x_floor_round);
            ba_jnum("ratio_vs_f32", r->ratio_f32);
            ba_jnum("ratio_vs_dense", r->ratio_dense);
            if (r->speedup_1t > 0)
                ba_jnum("speedup_vs_1t", r->speedup_1t);
            if (r->baseline)
                ba_jnum("check_rel_err", r->check);
            else
                ba_jnum("append_ns_per_token", r->append_ns);
            printf("}");
        }
        printf("\n], \"prefill\": [");
        for (size_t i = 0; i < nprow; i++) {
            const ba_prow *r = &prows[i];
            printf("%s\n  {\"codec\": ", i ? "," : "");
            kvqb_json_str(stdout, r->codec);
            printf(", \"tokens\": %zu, \"threads\": %zu", r->tokens, r->threads);
            if (!r->ok) {
                printf(", \"error\": ");
                kvqb_json_str(stdout, r->msg);
                printf("}");
                continue;
            }
            ba_jnum("prefill_us", r->prefill_us);
            ba_jnum("append_us", r->append_us);
            ba_jnum("attend_us", r->attend_us);
            ba_jnum("ratio_vs_f32", r->ratio_f32);
            printf(", \"reps\": %d}", r->reps);
        }
        printf("%s]}\n", nprow ? "\n" : "");
    }
    if (rc && !o.json)
        printf("some rows failed (see their error)\n");
done:
    free(K), free(V), free(q), free(out), free(ck), free(cv), free((void *)fl.buf);
    free(bw);
    free(rows), free(prows);
    kvqb_pool_free(e.pool);
    free(o.codec_buf);
    return rc;
}
