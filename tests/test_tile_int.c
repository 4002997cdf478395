/*
 * test_tile_int.c - tiled pages of the int8 / int4 codecs (layouts and
 * bounds: src/codec/int.c; kernels: src/kernels/x86/int_avx2.c,
 * int_avx512.c).
 *
 * - which (role, P) are tiled: int8/int4 with g % 8 == 0 and P % 16 == 0;
 * - tput/tget: every slot round-trips bit for bit, and the bytes sit where
 *   the layout restated in this file (from docs/format.md) puts them;
 * - tscore and taccum of every path against the reference (tget the rows,
 *   then ref.prep + ref.score / ref.accum): AVX2, AVX-VNNI and AVX-512
 *   natively where the CPU has them (VNNI when present, and the BW
 *   variant), and the AVX-VNNI and AVX-512 sources built through SIMDe
 *   (both AVX-512 variants) on every AVX2 machine. The
 *   bounds are the ones int.c documents, computed here in double from the
 *   stored codes:
 *     score  |err| <= sum_b e_b sum_{t in b} s_g(t) |c_t| + (d + 16) eps T,
 *            e_b = (max_b |q| / K) / 2 (1 + 8 K u) (max|q_b| when below
 *            2^-100: the block is dropped), K = 16383 for int8 keys (int16
 *            query codes), 127 for int4 (int8 codes), blocks of qb values
 *            (query_block), T = sum_t |q_t| (s |c_t| + |m|);
 *     accum  (accum_bound) |err| <= sum_runs e_g sum_{j in run} |c'_{j,t}| +
 *            (P + 16) eps T, e_g = (max_j w_j s_{j,g} / W) / 2 (1 + 8 W u)
 *            (the max when below 2^-100; 0 for a run whose weights are not
 *            all >= 0 and finite: computed exactly), W = 32767 for int8
 *            values, 255 for int4, and c' = c or c - 8 (int4) (path_w),
 *            T = |acc_t| + sum_j |w_j| (s (|c| + 8 [c' = c - 8]) + |m|);
 *   eps = FLT_EPSILON covers the float sums of both sides (each within
 *   gamma_n of exact); u = 2^-24, and 1 + 8 K u covers the roundings of
 *   K / max, max / K and of q K / max before rint (together at most 6 K u
 *   of a step, int.c; 8 K u: 0.8% for K = 16383, 1.6% for W = 32767,
 *   1.2e-4 for 255); one row of weights per run config sits 0.49 of a step
 *   of max/127 from the rounding points (half_steps), so that a kernel
 *   rounding with max/127 where the path claims a finer step fails (by
 *   1.96x against 255, far more against 32767);
 * - head_dim 8..256, groups 8..256, P 16/32/64/80 (80: a run of 64 and one
 *   of 16), data with outliers, zero, tiny, huge and saturated vectors,
 *   queries zero / tiny / with outliers, weights one-hot / zero / tiny /
 *   huge / negative; odd page addresses and output strides.
 * - taccum_run over 1..5 pages of P 16..80 against kvq__tile_accum_pages
 *   with the reference kernels (bound at test_run_config), softmax-like
 *   weights, every row count 1..5, pages in separate blocks.
 * `--bench` (off by default) times tscore + taccum over 40 MB of pages
 * against a plain read of the same bytes; `--bench-run` times taccum page
 * by page against taccum_run on runs of 4 hot pages.
 */
#include "testutil.h"

#include "codec/codec_impl.h"
#include "kernels/kernels.h"

#include <float.h>
#include <time.h>

#define RUN 64        /* tokens per weight-rounding run (int.c) */
#define TINY 0x1p-100 /* blocks / runs below this are dropped (int.c) */

static uint64_t seed = 20250611;
static double worst_score, worst_accum, worst_run; /* largest |err| / bound seen */

static kvq_codec *mk(const char *spec, size_t d, kvq_isa isa) {
    kvq_codec_params p = {0};
    char err[128];
    p.isa = isa;
    p.err_msg = err;
    p.err_msg_size = sizeof err;
    kvq_codec *c = NULL;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu: %s (%s)", spec, d, kvq_strerror(st), err);
    return c;
}

/* ---- the layout, restated from docs/format.md ---- */

/* Byte of value t of slot i; *hi: high nibble (int4). */
static size_t lay_pos(int bits, int role, size_t d, size_t P, size_t i, size_t t, int *hi) {
    *hi = 0;
    if (bits == 8)
        return role == 0 ? 4 * P * (t / 4) + 4 * i + t % 4 : 4 * d * (i / 4) + 4 * t + i % 4;
    if (role == 0) {
        *hi = t % 8 >= 4;
        return 4 * P * (t / 8) + 4 * i + t % 4;
    }
    *hi = i % 8 >= 4;
    return 4 * d * (i / 8) + 4 * t + i % 4;
}

static double half(const uint8_t *p) { return kvq_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
/* signed code (int8) or 0..15 (int4) of value t of a row */
static int row_code(int bits, size_t ng, const uint8_t *row, size_t t) {
    if (bits == 8)
        return (int8_t)row[2 * ng + t];
    return (row[4 * ng + t / 2] >> (4 * (t % 2))) & 15;
}
static double row_scale(const uint8_t *row, size_t g, size_t t) { return half(row + 2 * (t / g)); }
static double row_min(int bits, size_t ng, const uint8_t *row, size_t g, size_t t) {
    return bits == 8 ? 0.0 : half(row + 2 * ng + 2 * (t / g));
}

/* ---- data ---- */

static void fill_vecs(tu_rng *r, int kind, float *x, size_t n, size_t d) {
    for (size_t j = 0; j < n; j++) {
        float *v = x + j * d;
        tu_fill_gauss(r, v, d, 1.0f);
        if (kind == 1) {
            for (size_t t = 0; t < d; t++)
                if (t % 17 == 3)
                    v[t] *= 40.0f;
            v[0] += 5.0f;
        } else if (kind == 2) {
            switch (j % 8) {
            case 0:
                for (size_t t = 0; t < d; t++)
                    v[t] = 0.0f;
                break;
            case 1: /* saturated scales, in few vectors, so that most
                       batches of the SIMD encoders have none and skip the
                       float clamp (kvq__quant32); otherwise a small range
                       far from zero (the fp16 minimum is off by up to half
                       an ulp of 1000, 0.25, against scales near 1e-4) */
                for (size_t t = 0; t < d; t++)
                    v[t] = j % 32 == 1 ? ((t % 3 == 0) ? -1e30f : 1e30f) : 1000.0f + 1e-3f * v[t];
                break;
            case 2: /* fp16 subnormal or zero scales */
                for (size_t t = 0; t < d; t++)
                    v[t] *= 1e-7f;
                break;
            case 3:
                for (size_t t = 0; t < d; t++)
                    v[t] = 0.1234567f;
                break;
            case 4: /* near the fp16 range */
                for (size_t t = 0; t < d; t++)
                    v[t] *= 70000.0f;
                break;
            case 5:
                for (size_t t = 0; t < d; t++)
                    v[t] = -fabsf(v[t]) - 3.0f;
                break;
            case 6: /* 0 and 1.4 L ulps of the smallest fp16 subnormal (2^-24):
                       the scale rounds down to 2^-24, so rint(x / s) is
                       1.4 L, above the largest code L (int8 L = 127) */
            case 7: /* the same for int4 (L = 15) */
                for (size_t t = 0; t < d; t++)
                    v[t] = t % 2 ? (j % 8 == 6 ? 177.8f : 21.0f) * 0x1p-24f : 0.0f;
                break;
            default:
                break;
            }
        }
    }
}

/* Query i: cycles through gaussian, outliers, zero, tiny, mixed blocks. */
static void fill_query(tu_rng *r, size_t i, float *q, size_t d) {
    tu_fill_gauss(r, q, d, 1.0f);
    switch (i % 6) {
    case 1:
        for (size_t t = 0; t < d; t += 11)
            q[t] *= 100.0f;
        break;
    case 2:
        memset(q, 0, d * sizeof *q);
        break;
    case 3: /* below 2^-100: dropped */
        for (size_t t = 0; t < d; t++)
            q[t] *= 1e-32f;
        break;
    case 4: /* one block huge, the rest small */
        for (size_t t = 0; t < d; t++)
            q[t] *= t < 8 ? 1e4f : 1e-3f;
        break;
    default:
        break;
    }
}

/* Weight row i over P tokens. */
static void fill_weights(tu_rng *r, size_t i, float *w, size_t P) {
    for (size_t j = 0; j < P; j++)
        w[j] = (float)exp(2.0 * tu_gauss(r));
    switch (i % 8) {
    case 1: /* one-hot */
        for (size_t j = 0; j < P; j++)
            w[j] = j == P / 3 ? 1.0f : 0.0f;
        break;
    case 2:
        memset(w, 0, P * sizeof *w);
        break;
    case 3: /* below 2^-100 after the scale: dropped */
        for (size_t j = 0; j < P; j++)
            w[j] *= 1e-35f;
        break;
    case 4: /* a negative weight: that run goes through the float kernels */
        w[P - 1] = -0.5f;
        break;
    case 5:
        for (size_t j = 0; j < P; j++)
            w[j] *= 1e20f;
        break;
    case 6:
        for (size_t j = 0; j < P; j++)
            w[j] = (float)tu_uniform(r);
        break;
    default:
        break;
    }
}

/* ---- paths ---- */

typedef struct {
    char name[32];
    kvq_codec *c;
} tpath;

static size_t make_paths(const char *spec, size_t d, tpath *p) {
    size_t n = 0;
    if (!kvq_cpu_supports(KVQ_ISA_AVX2))
        return 0;
    snprintf(p[n].name, sizeof p[n].name, "avx2");
    p[n++].c = mk(spec, d, KVQ_ISA_AVX2);
    if (kvq_cpu_supports(KVQ_ISA_AVXVNNI)) {
        snprintf(p[n].name, sizeof p[n].name, "avxvnni");
        p[n++].c = mk(spec, d, KVQ_ISA_AVXVNNI);
    }
    snprintf(p[n].name, sizeof p[n].name, "simde-avxvnni");
    p[n].c = mk(spec, d, KVQ_ISA_AVX2);
    if (p[n].c)
        kvq__int_avxvnni_select_simde(p[n].c);
    n++;
    if (kvq_cpu_supports(KVQ_ISA_AVX512)) {
        unsigned f = kvq__cpu_avx512_features();
        snprintf(p[n].name, sizeof p[n].name, "avx512%s", (f & KVQ__X512_VNNI) ? "-vnni" : "");
        p[n++].c = mk(spec, d, KVQ_ISA_AVX512);
        if (f & KVQ__X512_VNNI) {
            snprintf(p[n].name, sizeof p[n].name, "avx512-bw");
            p[n].c = mk(spec, d, KVQ_ISA_AVX2);
            if (p[n].c)
                kvq__int_avx512_select(p[n].c, 0);
            n++;
        }
    }
    static const unsigned feats[2] = {KVQ__X512_VNNI | KVQ__X512_VBMI, 0};
    for (int k = 0; k < 2; k++) {
        snprintf(p[n].name, sizeof p[n].name, "simde-%s", feats[k] ? "vnni" : "bw");
        p[n].c = mk(spec, d, KVQ_ISA_AVX2);
        if (p[n].c)
            kvq__int_avx512_select_simde(p[n].c, feats[k]);
        n++;
    }
    return n;
}

/* ---- tests ---- */

/* The step of a path's rounded weights (int.c, "taccum"): W = 32767 for
 * int8 values on every path (u16 weights for vpmaddwd, split into bytes for
 * vpdpbusd), 255 for int4; *off: the int4 codes taken as c - 8 (every
 * path). */
static double path_w(const char *name, int bits, size_t g, int *off) {
    (void)name;
    (void)g;
    *off = bits == 4;
    return bits == 8 ? 32767.0 : 255.0;
}

/* 1 + 8 K u (u = 2^-24): the margin of a rounding step of max / K (see the
 * header). */
static double step_margin(double K) { return 1.0 + 8.0 * K * 0x1p-24; }

/* The query block of tscore (int_tile.h): for int8 keys the largest of
 * 256..8 dividing g, for int4 of 32, 16, 8; and the codes' range K. */
static size_t query_block(int bits, size_t g, double *K) {
    *K = bits == 8 ? 16383.0 : 127.0;
    if (bits == 8)
        for (size_t qb = 256; qb >= 8; qb /= 2)
            if (g % qb == 0)
                return qb;
    return g % 32 == 0 ? 32 : g % 16 == 0 ? 16 : 8;
}

/* The accumulation bound (int.c) of path `name` per row i < nq and
 * dimension t into ab[i d + t], for weights w (rows wstride apart) over np
 * pages of P tokens (rows: the n = np P value rows in order). The weights
 * are rounded once per run: KVQ__TILE_RUN / P whole pages when P <= 64,
 * runs of up to 64 tokens within each page otherwise:
 *   |err| <= sum_runs e_g sum_{j in run} |c'_{j,t}| + (n + 16) eps T,
 *   e_g = (max_{j in run} w_j s_{j,g} / W) / 2 (1 + 1e-4) (the max when
 *   below 2^-100; 0 for a run with a weight not >= 0 and finite or a
 *   product that overflows: computed in float),
 *   c' = c, or c - 8 where the int4 codes are taken as c - 8 (the rounding
 *   error of each weight multiplies c - 8; m + 8 s is summed in float),
 *   T = |acc_t| + sum_j |w_j| (s (|c| + 8 off) + |m|),
 * W and off from path_w: the rounding error of each weight (at most half a
 * step alpha = max/W, step_margin covering the roundings of W/max, max/W
 * and w s W/max)
 * times the code it multiplies, plus the float sums of both sides (the
 * reference sums n products into acc in turn: gamma_n of T; the kernel one
 * product per run and group in float, the int32 sums being exact, and the
 * minimum terms over a run, 8 s w beside m w where off). */
static void accum_bound(const char *name, int bits, size_t g, size_t vb, const uint8_t *rows,
                        size_t d, size_t P, size_t np, const float *w, size_t wstride, size_t nq,
                        const float *acc0, size_t astride, double *ab) {
    int off;
    const double W = path_w(name, bits, g, &off);
    const size_t ng = d / g, n = np * P, run = P <= RUN ? (RUN / P) * P : RUN;
    for (size_t i = 0; i < nq; i++) {
        const float *wi = w + i * wstride;
        for (size_t t = 0; t < d; t++) {
            double qerr = 0, T = fabs(acc0[i * astride + t]);
            for (size_t j0 = 0; j0 < n;) {
                size_t m = P <= RUN ? KVQ__MIN(run, n - j0) : KVQ__MIN(RUN, P - j0 % P);
                float mx = 0;
                int exact = 0;
                for (size_t j = j0; j < j0 + m; j++) {
                    float p = wi[j] * (float)row_scale(rows + j * vb, g, t);
                    exact |= !(p >= 0.0f && p <= FLT_MAX);
                    mx = p > mx ? p : mx;
                }
                double e = exact ? 0.0 : mx >= TINY ? (double)mx / W * 0.5 * step_margin(W) : mx;
                for (size_t j = j0; j < j0 + m; j++)
                    qerr += e * abs(row_code(bits, ng, rows + j * vb, t) - 8 * off);
                j0 += m;
            }
            for (size_t j = 0; j < n; j++) {
                const uint8_t *row = rows + j * vb;
                T += fabs(wi[j]) * (row_scale(row, g, t) * (abs(row_code(bits, ng, row, t)) + 8 * off) +
                                    fabs(row_min(bits, ng, row, g, t)));
            }
            ab[i * d + t] = qerr + (n + 16) * FLT_EPSILON * T + 1e-37;
        }
    }
}

/* Weights of one row for the first run of n tokens (rows: their value rows)
 * that fall near half a step of W = 127 for dimension 0: w_j s_{j,0} = (k_j
 * + 1/2 + sigma_j / 100) / 127 with token 0 the run's maximum (1), sigma_j
 * the sign of c' (c, or c - 8 for int4) of dimension 0, so that a kernel
 * rounding with step max/127 errs by 0.49 steps per token, all with the
 * sign of c': twice the bound of a path that claims W = 255 (path_w). Zero
 * scales keep their weight. */
static void half_steps(int bits, size_t g, size_t ng, size_t vb, const uint8_t *rows, size_t P,
                       size_t n, float *w) {
    const size_t run = KVQ__MIN(n, P <= RUN ? (RUN / P) * P : RUN);
    for (size_t j = 0; j < run; j++) {
        const uint8_t *row = rows + j * vb;
        const double s = row_scale(row, g, 0);
        const int c = row_code(bits, ng, row, 0) - (bits == 4 ? 8 : 0);
        const double k = 1 + (double)((j * 37) % 120), sg = c < 0 ? -1.0 : 1.0;
        if (s > 0)
            w[j] = (float)((j == 0 ? 1.0 : (k + 0.5 + sg / 100) / 127) / s);
    }
}

static void test_which_tiled(void) {
    static const struct {
        const char *spec;
        size_t d, P;
        int k;
    } t[] = {
        {"int8", 128, 16, 1},     {"int8", 128, 32, 1},      {"int8", 128, 8, 0},
        {"int8", 128, 24, 0},     {"int4:g=32", 128, 16, 1}, {"int4:g=8", 64, 64, 1},
        {"int4:g=4", 64, 16, 0},  {"int8:g=12", 96, 16, 0},  {"int2", 128, 16, 0},
        {"int2:g=32", 128, 16, 0}, {"int8", 12, 16, 0},      {"int4", 8, 16, 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kvq_codec *c = mk(t[i].spec, t[i].d, KVQ_ISA_SCALAR);
        if (!c)
            continue;
        for (int role = 0; role < 2; role++)
            TU_REPORT(kvq__tiled(c, role, t[i].P) == t[i].k, "%s d=%zu P=%zu role %d: tiled %d",
                      t[i].spec, t[i].d, t[i].P, role, kvq__tiled(c, role, t[i].P));
        kvq_codec_free(c);
    }
}

/* One configuration: keys/values of a data kind, every path. */
static void test_config(const char *spec, size_t d, size_t P, int kind) {
    kvq_codec *ref = mk(spec, d, KVQ_ISA_SCALAR);
    if (!ref)
        return;
    const int bits = ref->bits;
    const size_t g = ref->group, ng = ref->ngroups, vb = ref->bytes, nq = 6;
    const size_t ostride = P + 5, astride = d + 3;
    tu_rng r;
    tu_seed(&r, seed ^ (d * 131 + P * 7 + (size_t)kind + (size_t)bits * 1000 + g * 100000));
    float *x = malloc(P * d * sizeof *x), *q = malloc(nq * d * sizeof *q);
    float *w = malloc(nq * P * sizeof *w);
    uint8_t *rows = malloc(P * vb), *back = malloc(vb);
    uint8_t *pbuf[2] = {malloc(P * vb + 1), malloc(P * vb + 1)};
    uint8_t *page[2] = {pbuf[0] + 1, pbuf[1] + 1}; /* odd addresses */
    float *sref = malloc(nq * ostride * sizeof(float)), *sout = malloc(nq * ostride * sizeof(float));
    float *aref = malloc(nq * astride * sizeof(float)), *aout = malloc(nq * astride * sizeof(float));
    float *acc0 = malloc(nq * astride * sizeof(float));
    void *qpr = aligned_alloc(64, nq * ref->qp_bytes);
    fill_vecs(&r, kind, x, P, d);
    for (size_t i = 0; i < nq; i++) {
        fill_query(&r, i + (size_t)kind, q + i * d, d);
        fill_weights(&r, i + (size_t)kind, w + i * P, P);
    }
    tu_fill_gauss(&r, acc0, nq * astride, 1.0f);
    ref->ref.encode(ref, rows, x, P);

    /* tput / tget round trip and the restated layout */
    int ok_rt = 1, ok_lay = 1;
    for (int role = 0; role < 2; role++) {
        memset(page[role], 0xa5, P * vb);
        for (size_t i = 0; i < P; i++)
            ref->tput(ref, role, P, page[role], i, rows + i * vb);
        for (size_t i = 0; i < P; i++) {
            ref->tget(ref, role, P, page[role], i, back);
            ok_rt &= memcmp(back, rows + i * vb, vb) == 0;
            const uint8_t *row = rows + i * vb;
            const size_t cb = bits == 8 ? d * P : d / 2 * P;
            for (size_t t = 0; t < d; t++) {
                int hi;
                size_t at = lay_pos(bits, role, d, P, i, t, &hi);
                int c = row_code(bits, ng, row, t);
                int s = bits == 8 ? (role == 0 ? (int8_t)(page[role][at] ^ 0x80) : (int8_t)page[role][at])
                                  : (page[role][at] >> (hi ? 4 : 0)) & 15;
                ok_lay &= s == c;
            }
            for (size_t k = 0; k < (bits == 8 ? 1u : 2u) * ng; k++)
                ok_lay &= memcmp(page[role] + cb + 2 * (k * P + i), row + 2 * k, 2) == 0;
        }
    }
    TU_REPORT(ok_rt, "%s d=%zu P=%zu kind %d: tput/tget round trip", spec, d, P, kind);
    TU_REPORT(ok_lay, "%s d=%zu P=%zu kind %d: bytes where docs/format.md puts them", spec, d, P,
              kind);

    /* reference scores and accumulation (rows gathered by tget) */
    kvq__tile_gather(ref, KVQ__ROLE_K, P, page[0], rows);
    for (size_t i = 0; i < nq; i++)
        ref->ref.prep(ref, (uint8_t *)qpr + i * ref->qp_bytes, q + i * d);
    ref->ref.score(ref, sref, ostride, qpr, nq, rows, P);
    memcpy(aref, acc0, nq * astride * sizeof(float));
    kvq__tile_gather(ref, KVQ__ROLE_V, P, page[1], rows);
    ref->ref.accum(ref, aref, astride, w, P, nq, rows, P);

    /* the bounds */
    double *sb = malloc(nq * P * sizeof(double)), *ab = malloc(nq * d * sizeof(double));
    for (size_t i = 0; i < nq; i++) {
        const float *qi = q + i * d;
        double K;
        const size_t qb = query_block(bits, g, &K);
        for (size_t j = 0; j < P; j++) {
            const uint8_t *row = rows + j * vb; /* same bytes for K and V */
            double qerr = 0, T = 0;
            for (size_t b = 0; b < d / qb; b++) {
                float mx = 0;
                for (size_t t = b * qb; t < (b + 1) * qb; t++)
                    mx = fabsf(qi[t]) > mx ? fabsf(qi[t]) : mx;
                double e = mx >= TINY ? (double)mx / K * 0.5 * step_margin(K) : mx;
                for (size_t t = b * qb; t < (b + 1) * qb; t++)
                    qerr += e * row_scale(row, g, t) * abs(row_code(bits, ng, row, t));
            }
            for (size_t t = 0; t < d; t++)
                T += fabs(qi[t]) * (row_scale(row, g, t) * abs(row_code(bits, ng, row, t)) +
                                    fabs(row_min(bits, ng, row, g, t)));
            sb[i * P + j] = qerr + (d + 16) * FLT_EPSILON * T + 1e-37;
        }
    }

    tpath paths[8];
    size_t np = make_paths(spec, d, paths);
    for (size_t pi = 0; pi < np; pi++) {
        kvq_codec *c = paths[pi].c;
        if (!c)
            continue;
        TU_REPORT(c->k.tprep && c->k.tscore && c->k.taccum, "%s %s d=%zu: tiled kernels missing",
                  paths[pi].name, spec, d);
        if (!(c->k.tprep && c->k.tscore && c->k.taccum)) {
            kvq_codec_free(c);
            continue;
        }
        void *qp = aligned_alloc(64, nq * c->tqp_bytes);
        accum_bound(paths[pi].name, bits, g, vb, rows, d, P, 1, w, P, nq, acc0, astride, ab);
        /* every row count 1..nq against the same rows; a row's results are
         * the same bits whatever the rows beside it (srow, arow: row i as
         * computed with m = i + 1 rows) */
        double worst_s = 0, worst_a = 0;
        size_t wi_s = 0, wj_s = 0, wi_a = 0, wt_a = 0;
        float got_s = 0, got_a = 0;
        float *srow = malloc(nq * ostride * sizeof(float)), *arow = malloc(nq * astride * sizeof(float));
        int same_rows = 1;
        for (size_t m = 1; m <= nq; m++) {
            for (size_t i = 0; i < m; i++)
                c->k.tprep(c, (uint8_t *)qp + i * c->tqp_bytes, q + i * d);
            for (size_t k = 0; k < nq * ostride; k++)
                sout[k] = -7.0f;
            c->k.tscore(c, sout, ostride, qp, m, page[0], P);
            memcpy(srow + (m - 1) * ostride, sout + (m - 1) * ostride, P * sizeof(float));
            for (size_t i = 0; i + 1 < m; i++)
                same_rows &= memcmp(srow + i * ostride, sout + i * ostride, P * sizeof(float)) == 0;
            for (size_t i = 0; i < nq; i++)
                for (size_t j = 0; j < ostride; j++) {
                    float v = sout[i * ostride + j];
                    if (i >= m || j >= P) { /* untouched */
                        if (v != -7.0f)
                            worst_s = INFINITY;
                        continue;
                    }
                    double e = fabs((double)v - sref[i * ostride + j]) / sb[i * P + j];
                    if (!(e <= worst_s)) {
                        worst_s = isnan(e) ? INFINITY : e;
                        wi_s = i;
                        wj_s = j;
                        got_s = v;
                    }
                }
            memcpy(aout, acc0, nq * astride * sizeof(float));
            c->k.taccum(c, aout, astride, w, P, m, page[1], P);
            memcpy(arow + (m - 1) * astride, aout + (m - 1) * astride, d * sizeof(float));
            for (size_t i = 0; i + 1 < m; i++)
                same_rows &= memcmp(arow + i * astride, aout + i * astride, d * sizeof(float)) == 0;
            for (size_t i = 0; i < nq; i++)
                for (size_t t = 0; t < astride; t++) {
                    float v = aout[i * astride + t];
                    if (i >= m || t >= d) {
                        if (memcmp(&v, acc0 + i * astride + t, sizeof v) != 0)
                            worst_a = INFINITY;
                        continue;
                    }
                    double e = fabs((double)v - aref[i * astride + t]) / ab[i * d + t];
                    if (!(e <= worst_a)) {
                        worst_a = isnan(e) ? INFINITY : e;
                        wi_a = i;
                        wt_a = t;
                        got_a = v;
                    }
                }
        }
        TU_REPORT(same_rows, "%s %s d=%zu P=%zu kind %d: a row's tscore or taccum depends on the rows beside it",
                  paths[pi].name, spec, d, P, kind);
        free(srow);
        free(arow);
        TU_REPORT(worst_s <= 1.0,
                  "%s %s d=%zu P=%zu kind %d: tscore |err|/bound %.3g (row %zu key %zu: %.9g vs "
                  "%.9g, bound %.3g)",
                  paths[pi].name, spec, d, P, kind, worst_s, wi_s, wj_s, got_s,
                  sref[wi_s * ostride + wj_s], sb[wi_s * P + wj_s]);
        TU_REPORT(worst_a <= 1.0,
                  "%s %s d=%zu P=%zu kind %d: taccum |err|/bound %.3g (row %zu dim %zu: %.9g vs "
                  "%.9g, bound %.3g)",
                  paths[pi].name, spec, d, P, kind, worst_a, wi_a, wt_a, got_a,
                  aref[wi_a * astride + wt_a], ab[wi_a * d + wt_a]);
        if (getenv("TILE_VERBOSE") && (worst_s > 0.5 || worst_a > 0.5))
            printf("%s %s d=%zu P=%zu kind %d: score %.3g (row %zu key %zu) accum %.3g (row %zu dim %zu)\n", paths[pi].name, spec, d, P, kind, worst_s, wi_s, wj_s, worst_a, wi_a, wt_a);
        worst_score = worst_s > worst_score ? worst_s : worst_score;
        worst_accum = worst_a > worst_accum ? worst_a : worst_accum;
        free(qp);
        kvq_codec_free(c);
    }
    free(sb);
    free(ab);
    free(qpr);
    free(x);
    free(q);
    free(w);
    free(rows);
    free(back);
    free(pbuf[0]);
    free(pbuf[1]);
    free(sref);
    free(sout);
    free(aref);
    free(aout);
    free(acc0);
    kvq_codec_free(ref);
}

static void test_kernels(void) {
    static const size_t dims[] = {8, 32, 64, 128, 256};
    static const size_t groups[] = {8, 16, 32, 64, 128, 256};
    static const size_t Ps[] = {16, 32, 64, 80};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                size_t d = dims[di], g = groups[gi];
                if (g > d || d % g)
                    continue;
                char spec[48];
                snprintf(spec, sizeof spec, "int%d:g=%zu", bits, g);
                for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++)
                    for (int kind = 0; kind < 3; kind++)
                        test_config(spec, d, Ps[pi], kind);
            }
}

/* ---- taccum_run: runs of pages ---- */

/* Softmax-like weights of row i over the n tokens of a run of pages: a
 * softmax of random logits (max weight 1), or zero, a single dominant
 * weight (the others e^-30), tiny and large weights mixed (half the tokens
 * near e^-80, below 2^-100 after a small scale), a flat row, or a
 * negative weight (the float fallback). */
static void fill_softmax(tu_rng *r, size_t i, float *w, size_t n) {
    double mx = -1e300, lg[5 * 128 + 64];
    for (size_t j = 0; j < n; j++) {
        lg[j] = 3.0 * tu_gauss(r);
        mx = lg[j] > mx ? lg[j] : mx;
    }
    for (size_t j = 0; j < n; j++)
        w[j] = (float)exp(lg[j] - mx);
    switch (i % 7) {
    case 1:
        memset(w, 0, n * sizeof *w);
        break;
    case 2: /* one dominant weight */
        for (size_t j = 0; j < n; j++)
            w[j] = j == (n * 5) / 7 ? 1.0f : (float)exp(-30.0 + tu_gauss(r));
        break;
    case 3: /* tiny and large: odd tokens near e^-80 */
        for (size_t j = 1; j < n; j += 2)
            w[j] = (float)exp(-80.0 + tu_gauss(r));
        break;
    case 4:
        for (size_t j = 0; j < n; j++)
            w[j] = 1.0f / (float)n;
        break;
    case 5: /* a negative weight in the last page */
        w[n - 1] = -0.25f;
        break;
    default:
        break;
    }
}

/* taccum_run over np pages of P tokens against kvq__tile_accum_pages with
 * c->ref, every path that has one and every row count 1..5, within
 * accum_bound (int.c, "taccum_run": the weights rounded once per run of
 * KVQ__TILE_RUN / P whole pages when P <= 64, runs of up to 64 tokens
 * within each page otherwise); with kind 0 the last row has half_steps
 * weights in its first run. */
static void test_run_config(const char *spec, size_t d, size_t P, size_t np, int kind) {
    kvq_codec *ref = mk(spec, d, KVQ_ISA_SCALAR);
    if (!ref)
        return;
    const int bits = ref->bits;
    const size_t g = ref->group, ng = ref->ngroups, vb = ref->bytes, nq = 5, n = np * P;
    const size_t astride = d + 3, wstride = n + 7;
    tu_rng r;
    tu_seed(&r, seed ^ (d * 131 + P * 7 + np * 77777 + (size_t)kind + (size_t)bits * 1000 + g * 100000));
    float *x = malloc(n * d * sizeof *x), *w = malloc(nq * wstride * sizeof *w);
    uint8_t *rows = malloc(n * vb), *scratch = malloc(P * vb);
    uint8_t *pbuf[5], *pages[5];
    float *aref = malloc(nq * astride * sizeof(float)), *aout = malloc(nq * astride * sizeof(float));
    float *acc0 = malloc(nq * astride * sizeof(float));
    double *ab = malloc(nq * d * sizeof(double));
    fill_vecs(&r, kind, x, n, d);
    for (size_t i = 0; i < nq; i++) {
        for (size_t j = 0; j < wstride; j++)
            w[i * wstride + j] = 1e30f; /* past the run: must not be read */
        fill_softmax(&r, i + (size_t)kind * 3 + np, w + i * wstride, n);
    }
    tu_fill_gauss(&r, acc0, nq * astride, 1.0f);
    ref->ref.encode(ref, rows, x, n);
    if (kind == 0)
        half_steps(bits, g, ng, vb, rows, P, n, w + (nq - 1) * wstride);
    for (size_t k = 0; k < np; k++) { /* separate blocks, odd addresses */
        pbuf[k] = malloc(P * vb + 1 + 64 * k);
        pages[k] = pbuf[k] + 1 + 64 * k;
        for (size_t i = 0; i < P; i++)
            ref->tput(ref, KVQ__ROLE_V, P, pages[k], i, rows + (k * P + i) * vb);
    }
    memcpy(aref, acc0, nq * astride * sizeof(float));
    kvq__tile_accum_pages(ref, &ref->ref, aref, astride, w, wstride, nq,
                          (const uint8_t *const *)pages, np, P, scratch);
    tpath paths[8];
    size_t npath = make_paths(spec, d, paths);
    for (size_t pi = 0; pi < npath; pi++) {
        kvq_codec *c = paths[pi].c;
        if (!c)
            continue;
        /* every path has one (AVX-512 for g % 16 == 0, else AVX2's) */
        TU_REPORT(c->k.taccum_run != NULL, "%s %s d=%zu: taccum_run missing", paths[pi].name, spec, d);
        if (!c->k.taccum_run) {
            kvq_codec_free(c);
            continue;
        }
        accum_bound(paths[pi].name, bits, g, vb, rows, d, P, np, w, wstride, nq, acc0, astride, ab);
        double worst = 0;
        size_t wi = 0, wt = 0;
        float got = 0;
        float *arow = malloc(nq * astride * sizeof(float));
        int same_rows = 1;
        for (size_t mrows = 1; mrows <= nq; mrows++) {
            memcpy(aout, acc0, nq * astride * sizeof(float));
            c->k.taccum_run(c, aout, astride, w, wstride, mrows, (const uint8_t *const *)pages, np, P);
            /* a row's sums are the same bits whatever the rows beside it */
            memcpy(arow + (mrows - 1) * astride, aout + (mrows - 1) * astride, d * sizeof(float));
            for (size_t i = 0; i + 1 < mrows; i++)
                same_rows &= memcmp(arow + i * astride, aout + i * astride, d * sizeof(float)) == 0;
            for (size_t i = 0; i < nq; i++)
                for (size_t t = 0; t < astride; t++) {
                    float v = aout[i * astride + t];
                    if (i >= mrows || t >= d) { /* untouched */
                        if (memcmp(&v, acc0 + i * astride + t, sizeof v) != 0)
                            worst = INFINITY;
                        continue;
                    }
                    double e = fabs((double)v - aref[i * astride + t]) / ab[i * d + t];
                    if (!(e <= worst)) {
                        worst = isnan(e) ? INFINITY : e;
                        wi = i;
                        wt = t;
                        got = v;
                    }
                }
        }
        TU_REPORT(same_rows, "%s %s d=%zu P=%zu np=%zu kind %d: a row's taccum_run depends on the rows beside it",
                  paths[pi].name, spec, d, P, np, kind);
        free(arow);
        TU_REPORT(worst <= 1.0,
                  "%s %s d=%zu P=%zu np=%zu kind %d: taccum_run |err|/bound %.3g (row %zu dim %zu: "
                  "%.9g vs %.9g, bound %.3g)",
                  paths[pi].name, spec, d, P, np, kind, worst, wi, wt, got, aref[wi * astride + wt],
                  ab[wi * d + wt]);
        worst_run = worst > worst_run ? worst : worst_run;
        kvq_codec_free(c);
    }
    for (size_t k = 0; k < np; k++)
        free(pbuf[k]);
    free(x);
    free(w);
    free(rows);
    free(scratch);
    free(aref);
    free(aout);
    free(acc0);
    free(ab);
    kvq_codec_free(ref);
}

static void test_run(void) {
    static const size_t dims[] = {64, 128};
    static const size_t groups[] = {8, 16, 32, 64, 128};
    static const size_t Ps[] = {16, 32, 48, 64, 80};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                size_t d = dims[di], g = groups[gi];
                if (g > d)
                    continue;
                char spec[48];
                snprintf(spec, sizeof spec, "int%d:g=%zu", bits, g);
                for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++)
                    for (size_t np = 1; np <= 5; np++)
                        test_run_config(spec, d, Ps[pi], np, (int)((np + pi) % 3));
            }
}

/* Encode of every path bit for bit against the reference (the AVX-512
 * encoder needs d % 64 == 0 and g % 16 == 0; other shapes test the AVX2
 * one again), batches of 1..33 vectors, misaligned buffers; the checked
 * encode (encode_chk) too, and with one NaN or -Inf it writes nothing. */
static void test_encode(void) {
    static const size_t dims[] = {64, 128, 192, 256, 512, 1024};
    static const size_t groups[] = {16, 32, 48, 64, 128, 0};
    static const size_t counts[] = {1, 3, 7, 17, 33};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
                size_t d = dims[di], g = groups[gi] ? groups[gi] : d;
                if (g > d || d % g)
                    continue;
                char spec[48];
                snprintf(spec, sizeof spec, "int%d:g=%zu", bits, g);
                kvq_codec *ref = mk(spec, d, KVQ_ISA_SCALAR);
                tpath paths[8];
                size_t np = make_paths(spec, d, paths);
                const size_t nmax = 33, vb = ref->bytes;
                float *xb = malloc(nmax * d * sizeof(float) + 4);
                float *x = (float *)(void *)((char *)xb + 4); /* misaligned */
                uint8_t *want = malloc(nmax * vb), *got = malloc(nmax * vb + 1);
                tu_rng r;
                tu_seed(&r, seed ^ (d * 31 + g + (size_t)bits));
                for (size_t pi = 0; pi < np; pi++) {
                    int ok = 1;
                    for (int kind = 0; kind < 4 && paths[pi].c; kind++)
                        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                            size_t n = counts[ci];
                            fill_vecs(&r, kind == 3 ? 2 : kind, x, n, d);
                            if (kind == 3) /* ties and signed zeros */
                                for (size_t t = 0; t < n * d; t++)
                                    x[t] = (t % 5 == 0) ? -0.0f : (float)((int)(x[t] * 8)) * 0.125f;
                            ref->ref.encode(ref, want, x, n);
                            memset(got, 0x5a, n * vb + 1);
                            paths[pi].c->k.encode(paths[pi].c, got + 1, x, n);
                            ok &= memcmp(got + 1, want, n * vb) == 0 && got[0] == 0x5a;
                            kvq_codec *pc = paths[pi].c;
                            if (!pc->k.encode_chk)
                                continue;
                            /* the checked encode: the same bytes, and with
                             * one NaN/Inf none at all */
                            memset(got, 0x5a, n * vb + 1);
                            ok &= pc->k.encode_chk(pc, got + 1, x, n) == 1 &&
                                  memcmp(got + 1, want, n * vb) == 0 && got[0] == 0x5a;
                            const size_t at = (ci * 7919 + (size_t)kind * 131) % (n * d);
                            const float keep = x[at];
                            x[at] = kind % 2 ? NAN : -INFINITY;
                            memset(got, 0x5a, n * vb + 1);
                            ok &= pc->k.encode_chk(pc, got + 1, x, n) == 0;
                            for (size_t i = 0; i < n * vb + 1; i++)
                                ok &= got[i] == 0x5a;
                            x[at] = keep;
                        }
                    TU_REPORT(ok, "%s %s d=%zu: encode differs from the reference", paths[pi].name,
                              spec, d);
                    kvq_codec_free(paths[pi].c);
                }
                free(xb);
                free(want);
                free(got);
                kvq_codec_free(ref);
            }
}

/* ---- --bench ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t pfd = 1; /* --bench: pages prefetched ahead (--prefetch N) */

static void bench(size_t total) {
    static const char *specs[] = {"int8", "int4:g=32"};
    const size_t d = 128, P = 16, nq = 4;
    char cpu[64] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p) {
                    snprintf(cpu, sizeof cpu, "%s", p + 2);
                    cpu[strcspn(cpu, "\n")] = 0;
                }
                break;
            }
        fclose(f);
    }
    printf("bench: cpu %s, head_dim %zu, P %zu, %zu query rows, %zu kB of K+V pages, prefetch %zu "
           "pages ahead\n", cpu, d, P, nq, total >> 10, pfd);
    for (size_t si = 0; si < 2; si++) {
        tpath paths[8];
        size_t np = make_paths(specs[si], d, paths);
        const size_t vb = paths[0].c->bytes, pb = P * vb, npages = total / (2 * pb);
        uint8_t *mem = malloc(npages * 2 * pb);
        float *x = malloc(P * d * sizeof(float)), q[4 * 128], w[4 * 16], out[4 * 16], acc[4 * 128];
        tu_rng r;
        tu_seed(&r, 7);
        uint8_t *rows = malloc(pb);
        for (size_t k = 0; k < npages * 2; k++) {
            fill_vecs(&r, 0, x, P, d);
            paths[0].c->k.encode(paths[0].c, rows, x, P);
            for (size_t i = 0; i < P; i++)
                paths[0].c->tput(paths[0].c, (int)(k & 1), P, mem + k * pb, i, rows + i * vb);
        }
        tu_fill_gauss(&r, q, nq * d, 1.0f);
        for (size_t j = 0; j < nq * P; j++)
            w[j] = (float)tu_uniform(&r);
        /* plain read of the same bytes: a sum of 16-byte words (SSE2 here:
         * the test is built without AVX flags) in 8 accumulators */
        typedef uint64_t u64x2 __attribute__((vector_size(16)));
        double best_sum = 1e30;
        /* hot: the minimum of many short passes (other work on the core
         * only ever adds time); cold: of 5 passes over 40 MB */
        const int reps = 1, outer = total < (1u << 20) ? 3000 : 5;
        volatile uint64_t sink = 0;
        for (int rep = 0; rep < outer; rep++) {
            double t0 = now_s();
            u64x2 a[8];
            memset(a, 0, sizeof a);
            const size_t nw = npages * 2 * pb / 16;
            for (size_t k = 0; k + 8 <= nw; k += 8)
                for (int u = 0; u < 8; u++) {
                    u64x2 w16;
                    memcpy(&w16, mem + 16 * (k + (size_t)u), 16);
                    a[u] += w16;
                }
            for (int u = 1; u < 8; u++)
                a[0] += a[u];
            sink += a[0][0] + a[0][1];
            double t = now_s() - t0;
            best_sum = t < best_sum ? t : best_sum;
        }
        (void)sink;
        printf("  %-10s plain read %.2f GB/s\n", specs[si], (double)(npages * 2 * pb) / best_sum * 1e-9);
        for (size_t pi = 0; pi < np; pi++) {
            kvq_codec *c = paths[pi].c;
            if (!c || strncmp(paths[pi].name, "simde", 5) == 0) {
                kvq_codec_free(c);
                continue;
            }
            void *qp = aligned_alloc(64, nq * c->tqp_bytes);
            for (size_t i = 0; i < nq; i++)
                c->k.tprep(c, (uint8_t *)qp + i * c->tqp_bytes, q + i * d);
            double best[3] = {1e30, 1e30, 1e30};
            for (int rep = 0; rep < outer; rep++)
                for (int which = 0; which < 3; which++) {
                    memset(acc, 0, sizeof acc);
                    double t0 = now_s();
                    for (int rr = 0; rr < reps; rr++)
                    for (size_t k = 0; k < npages; k++) {
                        const uint8_t *pk = mem + 2 * k * pb;
                        if (k + pfd < npages) /* as the cache's attend: pages ahead */
                            for (size_t o = 0; o < 2 * pb; o += 64)
                                __builtin_prefetch(pk + 2 * pb * pfd + o);
                        if (which != 1)
                            c->k.tscore(c, out, P, qp, nq, pk, P);
                        if (which != 0)
                            c->k.taccum(c, acc, d, w, P, nq, pk + pb, P);
                    }
                    double t = (now_s() - t0) / reps;
                    best[which] = t < best[which] ? t : best[which];
                }
            double bytes = (double)(npages * 2 * pb);
            printf("  %-10s %-10s tscore %.1f ns/page, taccum %.1f ns/page, both %.1f ns per K+V page "
                   "(%zu B): %.2f GB/s = %.2fx the plain read\n",
                   specs[si], paths[pi].name, best[0] / (double)npages * 1e9,
                   best[1] / (double)npages * 1e9, best[2] / (double)npages * 1e9, 2 * pb,
                   bytes / best[2] * 1e-9, best[2] / best_sum);
            free(qp);
            kvq_codec_free(c);
        }
        free(mem);
        free(x);
        free(rows);
    }
}

/* --bench-run: the V side of a decode step on hot pages, int4:g=32 and
 * int8, d 128, 4 rows, P 16: taccum page by page (4 calls) against one
 * taccum_run over the 4 pages, side by side; ns per page (one KV head). */
static void bench_run(void) {
    static const char *specs[] = {"int4:g=32", "int8"};
    const size_t d = 128, nq = 4, P = 16, np = 4, NB = 64; /* NB runs of np pages */
    printf("bench-run: head_dim %zu, %zu rows, P %zu, runs of %zu pages, %zu runs (hot)\n", d, nq, P,
           np, NB);
    for (size_t si = 0; si < 2; si++) {
        tpath paths[8];
        size_t npath = make_paths(specs[si], d, paths);
        for (size_t pi = 0; pi < npath; pi++) {
            kvq_codec *c = paths[pi].c;
            if (!c || strncmp(paths[pi].name, "simde", 5) == 0 || !c->k.taccum_run) {
                kvq_codec_free(c);
                continue;
            }
            const size_t vb = c->bytes, pb = P * vb;
            uint8_t *mem = malloc(NB * np * pb), *rows = malloc(pb);
            float *x = malloc(P * d * sizeof(float)), w[4 * 64], acc[4 * 128];
            tu_rng r;
            tu_seed(&r, 11);
            for (size_t k = 0; k < NB * np; k++) {
                fill_vecs(&r, 0, x, P, d);
                c->k.encode(c, rows, x, P);
                for (size_t i = 0; i < P; i++)
                    c->tput(c, KVQ__ROLE_V, P, mem + k * pb, i, rows + i * vb);
            }
            for (size_t i = 0; i < nq; i++)
                fill_softmax(&r, 0, w + i * np * P, np * P);
            memset(acc, 0, sizeof acc);
            double best[2] = {1e30, 1e30};
            for (int rep = 0; rep < 2000; rep++)
                for (int which = 0; which < 2; which++) {
                    double t0 = now_s();
                    for (size_t b = 0; b < NB; b++) {
                        const uint8_t *pg[4];
                        for (size_t i = 0; i < np; i++)
                            pg[i] = mem + (b * np + i) * pb;
                        if (which == 0)
                            for (size_t i = 0; i < np; i++)
                                c->k.taccum(c, acc, d, w + i * P, np * P, nq, pg[i], P);
                        else
                            c->k.taccum_run(c, acc, d, w, np * P, nq, pg, np, P);
                    }
                    double t = now_s() - t0;
                    best[which] = t < best[which] ? t : best[which];
                }
            const double a = best[0] / (double)(NB * np) * 1e9, b = best[1] / (double)(NB * np) * 1e9;
            printf("  %-10s %-12s taccum %.1f ns/page, taccum_run %.1f ns/page: %.3f (%.0f%% cheaper)\n",
                   specs[si], paths[pi].name, a, b, b / a, 100.0 * (1.0 - b / a));
            free(mem);
            free(rows);
            free(x);
            kvq_codec_free(c);
        }
    }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    int do_bench = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0)
            do_bench = 1;
        else if (strcmp(argv[i], "--bench-run") == 0)
            do_bench = 2;
        else if (strcmp(argv[i], "--prefetch") == 0 && i + 1 < argc)
            pfd = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
    }
    if (do_bench == 2) {
        bench_run();
        return 0;
    }
    if (do_bench) {
        bench(40u << 20);
        bench(64u << 10);
        return 0;
    }
    printf("test_tile_int: seed %llu, avx2 %d, avxvnni %d, avx512 %d (features %u)\n",
           (unsigned long long)seed, kvq_cpu_supports(KVQ_ISA_AVX2), kvq_cpu_supports(KVQ_ISA_AVXVNNI),
           kvq_cpu_supports(KVQ_ISA_AVX512), kvq__cpu_avx512_features());
    test_which_tiled();
    test_encode();
    test_kernels();
    test_run();
    printf("largest |err| / bound: tscore %.3g, taccum %.3g, taccum_run %.3g\n", worst_score,
           worst_accum, worst_run);
    return tu_finish();
}
