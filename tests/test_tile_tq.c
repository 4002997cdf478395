/*
 * test_tile_tq.c - the tiled pages of the TurboQuant family (tq.c, "Tiled
 * pages"): which (codec, role, P) are tiled, the documented slot layout,
 * put/get round trips, and every tiled kernel path (AVX2, AVX-512 with and
 * without VNNI natively where the CPU has it, and both AVX-512 variants
 * through SIMDe always) against
 *  - an emulation of its integer arithmetic from the prepared query or the
 *    quantized weights: equal up to the float roundings after the integer
 *    sums (a tight bound that any wrong index, code or weight breaks), and
 *  - the scalar reference (tget + ref.score / ref.accum): within the bound
 *    derived in tq.c from the rounding of query, centroids and weights, plus
 *    the float rounding of the reference's own sums.
 * Extreme inputs: zero, NaN, tiny (scaled by 2^100 before rounding),
 * subnormal and huge queries and weights, rows with a negative weight (the
 * exact path), pages longer than one weight segment (P = 272).
 * `--bench [P]` (off by default; P = 64) times one decode step's kernels
 * (4 query rows per KV head, 8 KV heads x 32k tokens) on every path against
 * the row kernels and the f32 codec, in the same run; `--bench-run` times
 * taccum page by page against taccum_run on a run of 4 pages (hot data).
 */
#include "testutil.h"

#include "codec/tq_impl.h"
#include "kernels/kernels.h"
#include "kernels/x86/tq_avx2.h"

#include <time.h>

#define SEED 20251201u

typedef struct path {
    const char *name;
    kvq_isa isa; /* codec created for this path */
    int sel;     /* 0: as created; 1: native AVX-512 selector; 2: SIMDe */
    unsigned feat;
    int qmax, wmax; /* code bounds of the path */
    int c6;         /* 1: the AVX2 kernels' centroid codes c6 (tq_avx2.h), else tq.c's c8 */
} path;

static path paths[8];
static int npaths;

static void add_path(const char *name, kvq_isa isa, int sel, unsigned feat, int vnni) {
    path *p = &paths[npaths++];
    p->name = name;
    p->isa = isa;
    p->sel = sel;
    p->feat = feat;
    p->qmax = vnni ? KVQ__TQ_Q_VNNI : KVQ__TQ_Q_MADD;
    p->wmax = vnni ? KVQ__TQ_W_VNNI : KVQ__TQ_W_MADD;
    p->c6 = isa == KVQ_ISA_AVX2 && sel == 0;
}

/* The centroid codes of a path's tiled kernels, their scale and the bias of
 * the key codes: tq.c's c8 (|c| <= 127, bias 128), or for the AVX2 kernels
 * c6 (tq_avx2.h), computed here from its definition: round(cent[l] * (63 /
 * m)) in float, nearest even, m = |cent[levels-1]|, scale m / 63, bias 64. */
static void path_codes(const path *pa, const kvq__tq *t, int *cb, double *s_c, int *bias) {
    if (!pa->c6) {
        for (int l = 0; l < 16; l++)
            cb[l] = t->c8[l];
        *s_c = t->c8_scale;
        *bias = 128;
        return;
    }
    const float m = fabsf(t->cent[t->levels - 1]), k = 63.0f / m;
    for (int l = 0; l < 16; l++)
        cb[l] = l < t->levels ? (int)nearbyintf(t->cent[l] * k) : 0;
    *s_c = (double)(m / 63.0f);
    *bias = KVQ__TQ_BIAS_AVX2;
}

static kvq_codec *mk(const char *spec, size_t d, kvq_isa isa) {
    kvq_codec *c = NULL;
    kvq_codec_params p;
    memset(&p, 0, sizeof p);
    p.isa = isa;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu isa=%d: %s", spec, d, (int)isa, kvq_strerror(st));
    return c;
}

static kvq_codec *mk_path(const path *pa, const char *spec, size_t d) {
    kvq_codec *c = mk(spec, d, pa->isa);
    if (!c)
        return NULL;
    if (pa->sel == 1)
        kvq__tq_avx512_select(c, pa->feat);
    else if (pa->sel == 2)
        kvq__tq_avx512_select_simde(c, pa->feat);
    return c;
}

static void *xalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? kvq__round64(n) : 64) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* P vectors of d floats with norms spread over 2^-3..2^3 (token 3: zero). */
static void fill_vectors(tu_rng *r, float *x, size_t P, size_t d) {
    for (size_t i = 0; i < P; i++) {
        float s = (float)exp2(6.0 * tu_uniform(r) - 3.0);
        tu_fill_gauss(r, x + i * d, d, s);
        if (i == 3)
            memset(x + i * d, 0, d * sizeof(float));
    }
}

/* Encoded rows and the tiled page of P vectors for role. */
static void make_page(const kvq_codec *c, int role, size_t P, const float *x, uint8_t *rows,
                      uint8_t *page) {
    c->ref.encode(c, rows, x, P);
    memset(page, 0xA5, P * c->bytes);
    for (size_t i = 0; i < P; i++)
        c->tput(c, role, P, page, i, rows + i * c->bytes);
}

/* ---- which pages are tiled ---- */

static void test_tiled_set(void) {
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tq3:norm=8", "tq4:nc=0"};
    static const size_t ds[] = {8, 16, 48, 64, 100, 128, 1024};
    static const size_t Ps[] = {1, 8, 16, 24, 32, 64, 256};
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            kvq_codec *c = mk(specs[si], ds[di], KVQ_ISA_SCALAR);
            if (!c)
                continue;
            for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++)
                for (int role = 0; role < 2; role++) {
                    int want = ds[di] % 16 == 0 && Ps[pi] % 16 == 0;
                    TU_REPORT(kvq__tiled(c, role, Ps[pi]) == want, "%s d=%zu P=%zu role=%d tiled %d", specs[si],
                              ds[di], Ps[pi], role, want);
                }
            /* scalar path: the cache gathers rows */
            CHECK(c->k.tscore == NULL && c->k.taccum == NULL && c->k.taccum_run == NULL);
            kvq_codec_free(c);
        }
    static const char *tqp[] = {"tqp2", "tqp3", "tqp4"};
    for (size_t i = 0; i < 3; i++) {
        kvq_codec *c = mk(tqp[i], 128, KVQ_ISA_AUTO);
        if (!c)
            continue;
        CHECK(!kvq__tiled(c, KVQ__ROLE_K, 64) && !kvq__tiled(c, KVQ__ROLE_V, 64));
        CHECK(c->k.tscore == NULL && c->k.taccum == NULL && c->k.taccum_run == NULL);
        kvq_codec_free(c);
    }
}

/* ---- layout ---- */

/* Index of token i, dimension j in a tiled page, straight from the layout
 * spelled out in tq_impl.h / tq.c. */
static unsigned spec_idx(const kvq_codec *c, int role, size_t P, const uint8_t *page, size_t i,
                         size_t j) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    size_t d = c->d, u, s;
    if (role == KVQ__ROLE_K) {
        u = (i / 16) * (d / 4) + j / 4;
        s = 4 * (i % 16) + j % 4;
    } else {
        u = (i / 4) * (d / 16) + j / 16;
        s = 4 * (j % 16) + i % 4;
    }
    const uint8_t *unit = page + P * t->nb + u * 8 * (size_t)t->kb;
#define FIELD(pl, f) ((unsigned)((pl)[s % (8 * (f))] >> ((f) * (s / (8 * (f))))) & ((1u << (f)) - 1u))
    switch (t->kb) {
    case 4:
        return FIELD(unit, 4);
    case 3:
        return FIELD(unit, 2) | FIELD(unit + 16, 1) << 2;
    case 2:
        return FIELD(unit, 2);
    default:
        return FIELD(unit, 1);
    }
#undef FIELD
}

static void test_layout(void) {
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tq3:norm=8"};
    static const size_t ds[] = {16, 48, 64, 128};
    static const size_t Ps[] = {16, 32, 64};
    tu_rng r;
    tu_seed(&r, SEED);
    long bad_rt = 0, bad_spec = 0, bad_full = 0, bad_norm = 0, bad_slot = 0, n = 0;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
            for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++)
                for (int role = 0; role < 2; role++) {
                    size_t d = ds[di], P = Ps[pi];
                    kvq_codec *c = mk(specs[si], d, KVQ_ISA_AUTO);
                    if (!c)
                        continue;
                    const kvq__tq *t = (const kvq__tq *)c->state;
                    size_t vb = c->bytes;
                    float *x = (float *)xalloc(P * d * 4), *y = (float *)xalloc(d * 4), *z = (float *)xalloc(d * 4);
                    uint8_t *rows = (uint8_t *)xalloc(P * vb), *page = (uint8_t *)xalloc(P * vb);
                    uint8_t *page2 = (uint8_t *)xalloc(P * vb), *row = (uint8_t *)xalloc(vb);
                    uint8_t *tmp = (uint8_t *)xalloc(vb);
                    fill_vectors(&r, x, P, d);
                    make_page(c, role, P, x, rows, page);
                    /* every bit of the page is written by the puts: same page from other garbage */
                    memset(page2, 0x5A, P * vb);
                    for (size_t i = P; i-- > 0;) /* other order too */
                        c->tput(c, role, P, page2, i, rows + i * vb);
                    bad_full += memcmp(page, page2, P * vb) != 0;
                    for (size_t i = 0; i < P; i++, n++) {
                        c->tget(c, role, P, page, i, row);
                        bad_rt += memcmp(row, rows + i * vb, vb) != 0;
                        bad_norm += memcmp(page + i * t->nb, rows + i * vb, t->nb) != 0;
                        for (size_t j = 0; j < d; j++)
                            bad_spec += spec_idx(c, role, P, page, i, j) !=
                                        kvq__tq_get_idx(rows + i * vb + t->off_idx, j, t->kb);
                        /* tile.c's slot helpers on the tiled area decode as the row does */
                        kvq__slot_encode(c, 1, role, P, page2, i, x + i * d, tmp);
                        kvq__slot_decode(c, 1, role, P, page2, i, y, tmp);
                        c->k.decode(c, z, rows + i * vb, 1);
                        bad_slot += memcmp(y, z, d * 4) != 0;
                    }
                    bad_full += memcmp(page, page2, P * vb) != 0;
                    free(x);
                    free(y);
                    free(z);
                    free(rows);
                    free(page);
                    free(page2);
                    free(row);
                    free(tmp);
                    kvq_codec_free(c);
                }
    TU_REPORT(bad_rt == 0, "tget(tput(row)) != row for %ld of %ld slots", bad_rt, n);
    TU_REPORT(bad_spec == 0, "%ld indices not where the documented layout puts them", bad_spec);
    TU_REPORT(bad_norm == 0, "%ld norms not at page + i * nb", bad_norm);
    TU_REPORT(bad_full == 0, "%ld pages depend on their previous bytes or the put order", bad_full);
    TU_REPORT(bad_slot == 0, "%ld slot encode/decode differ from the row decode", bad_slot);
}

/* ---- kernels ---- */

typedef struct stats {
    long n, bad_emu, bad_bound, bad_code, bad_exact;
    double worst_emu, worst_bound; /* max |err| / allowed */
    char where[160];              /* the case being checked, and the first failure */
    char first[240];
    char worst_ref[160]; /* the case of worst_bound */
} stats;

static void note(stats *s, double err, double allowed, int emu) {
    double q = err / (allowed > 0 ? allowed : 1e-300);
    if (!(err <= allowed) && !s->first[0])
        snprintf(s->first, sizeof s->first, "%s: err %.6g allowed %.6g (%s)", s->where, err, allowed,
                 emu ? "emulation" : "reference");
    if (emu) {
        s->bad_emu += !(err <= allowed);
        if (q > s->worst_emu || q != q)
            s->worst_emu = q;
    } else {
        s->bad_bound += !(err <= allowed);
        if (q > s->worst_bound || q != q) {
            s->worst_bound = q;
            memcpy(s->worst_ref, s->where, sizeof s->worst_ref);
        }
    }
}

#define U24 (1.0 / 16777216.0) /* unit roundoff of float */
#define DEN 0x1p-149               /* the smallest subnormal float: rounding there is absolute */

/* gamma_n = n u / (1 - n u) */
static double gam(double n) { return n * U24 / (1.0 - n * U24); }

/* Scores of nq random queries (times qs) against a page of P keys. */
static void check_score(const path *pa, kvq_codec *c, size_t P, size_t nq, float qs, tu_rng *r, stats *st) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, vb = c->bytes, os = P + 3;
    float *x = (float *)xalloc(P * d * 4), *q = (float *)xalloc(nq * d * 4);
    uint8_t *rows = (uint8_t *)xalloc(P * vb), *page = (uint8_t *)xalloc(P * vb), *g = (uint8_t *)xalloc(P * vb);
    uint8_t *qt = (uint8_t *)xalloc(nq * c->tqp_bytes), *qr = (uint8_t *)xalloc(nq * c->qp_bytes);
    float *ok = (float *)xalloc(nq * os * 4), *orf = (float *)xalloc(nq * os * 4);
    fill_vectors(r, x, P, d);
    tu_fill_gauss(r, q, nq * d, qs);
    if (nq > 1)
        q[d + 5] = 40.0f * qs; /* an outlier coordinate (spread by the rotation) */
    make_page(c, KVQ__ROLE_K, P, x, rows, page);
    for (size_t i = 0; i < nq; i++) {
        c->k.tprep(c, qt + i * c->tqp_bytes, q + i * d);
        c->ref.prep(c, qr + i * c->qp_bytes, q + i * d);
    }
    c->k.tscore(c, ok, os, qt, nq, page, P);
    kvq__tile_score_rows(c, &c->ref, orf, os, qr, nq, page, P, g);
    int cb[16], bias;
    double s_c;
    path_codes(pa, t, cb, &s_c, &bias);
    for (size_t i = 0; i < nq; i++) {
        const float *qv = (const float *)(const void *)(qr + i * c->qp_bytes); /* R q, reference */
        const kvq__tq_tqh *hd = (const kvq__tq_tqh *)(const void *)(qt + i * c->tqp_bytes);
        const int8_t *code = (const int8_t *)(qt + i * c->tqp_bytes + KVQ__TQ_TQ_CODES);
        double m = 0.0, l1 = 0.0;
        for (size_t j = 0; j < d; j++) {
            m = fmax(m, fabs(qv[j]));
            l1 += fabs(qv[j]);
        }
        const double s_q = m / pa->qmax;
        /* the query codes: round(q_j qmax / m), within +-qmax, and their scale */
        long csum = 0;
        for (size_t j = 0; j < d; j++) {
            double want = qv[j] / s_q;
            st->bad_code += fabs(code[j] - want) > 0.5 + 1e-4 || abs(code[j]) > pa->qmax;
            csum += code[j];
        }
        st->bad_code += hd->corr != bias * csum;
        if (pa->c6) { /* the AVX2 header holds the biased codes; the query codes broadcast */
            for (int l = 0; l < 16; l++)
                st->bad_code += ((const kvq__tq_tqh2 *)hd)->tabu[l] != (uint8_t)(cb[l] + bias);
            const int8_t *qx = (const int8_t *)(qt + i * c->tqp_bytes + KVQ__TQ_TQ_QV(d));
            for (size_t j = 0; j < 8 * d; j++)
                st->bad_code += qx[j] != code[(j / 32) * 4 + j % 4];
        }
        st->bad_code += fabs(hd->sc - s_q * s_c) > 4 * U24 * s_q * s_c + DEN;
        for (size_t k = 0; k < P; k++) {
            const uint8_t *p = rows + k * vb;
            double nk = kvq__tq_get_norm(t, &t->ns, p);
            long isum = 0;
            double chat = 0.0, qc = 0.0;
            for (size_t j = 0; j < d; j++) {
                unsigned ix = kvq__tq_get_idx(p + t->off_idx, j, t->kb);
                isum += (long)code[j] * cb[ix];
                chat += fabs(cb[ix] * s_c);
                qc += fabs(qv[j] * t->cent[ix]);
            }
            double kv = ok[i * os + k], rv = orf[i * os + k];
            /* emulation: n * sc * isum; the kernel rounds twice after the exact integer sum */
            double emu = nk * (double)hd->sc * (double)isum;
            note(st, fabs(kv - emu), 2 * 2 * U24 * fabs(emu) + 2 * DEN, 1);
            /* below 2^-126 (queries under ~1e-35) the scale sc is subnormal: its rounding
             * is absolute, DEN / 2 per unit of n |isum| */
            /* tq.c's bound: n (s_q/2 sum|c^_j| + s_c/2 sum|q_j|), (0.5 + 1e-4: the float
             * scales are within a few ulps of the exact ones), plus the reference's float
             * sum gamma_{d+1} n sum|q_j c_j| and the kernel's roundings, both with margin 2 */
            double bound = nk * ((0.5 + 1e-4) * s_q * chat + (0.5 + 1e-4) * s_c * l1) +
                           2 * gam((double)d + 1) * nk * qc + 2 * 2 * U24 * fabs(kv) + 4 * DEN +
                           nk * fabs((double)isum) * DEN;
            note(st, fabs(kv - rv), bound, 0);
            st->n++;
        }
    }
    free(x);
    free(q);
    free(rows);
    free(page);
    free(g);
    free(qt);
    free(qr);
    free(ok);
    free(orf);
}

/* Weights of row i: kinds by i % 6 (softmax-like, sparse, zero, with a
 * negative value: the exact path, softmax-like with a huge range, tiny:
 * normal and subnormal values below 2^-100). */
static void fill_weights(tu_rng *r, float *w, size_t i, size_t n) {
    for (size_t k = 0; k < n; k++) {
        switch (i % 6) {
        case 0:
            w[k] = (float)exp(2.0 * tu_gauss(r));
            break;
        case 1:
            w[k] = tu_uniform(r) < 0.1 ? (float)tu_uniform(r) : 0.0f;
            break;
        case 2:
            w[k] = 0.0f;
            break;
        case 3:
            w[k] = (float)tu_gauss(r);
            break;
        case 4:
            w[k] = (float)exp(8.0 * tu_gauss(r));
            break;
        default:
            w[k] = (float)(1e-39 * exp(2.0 * tu_gauss(r)));
            break;
        }
    }
    if (i % 6 == 3)
        w[n / 2] = -1.0f;
}

/* One dimension j of one weight row (wi, norms nrm) over n tokens (rows:
 * their encoded rows, vb bytes each) taken in segments of 256, nseg of them counted in
 * the bounds: the kernel's output kv against an emulation of its integer
 * arithmetic and the reference's output rv against tq.c's bound (both
 * described at check_accum_run); acc0 is the accumulator's start. */
static void check_dim(const path *pa, const kvq__tq *t, const float *wi, const float *nrm,
                      const uint8_t *rows, size_t vb, size_t n, size_t nseg, size_t j, double acc0,
                      double kv, double rv, stats *st) {
    int cb[16], bias;
    double s_c;
    path_codes(pa, t, cb, &s_c, &bias);
    double emu = acc0, chat = 0.0, asum = 0.0, mag = fabs(acc0), bound = 0.0, den = 0.0;
    for (size_t s0 = 0; s0 < n; s0 += 256) {
        const size_t sn = KVQ__MIN((size_t)256, n - s0);
        float m = 0.0f;
        for (size_t k = s0; k < s0 + sn; k++)
            m = fmaxf(m, wi[k] * nrm[k]);
        if (m == 0.0f)
            continue;
        /* the rule of kvq__tq_wquant (tq_impl.h) */
        const float ps = m < 0x1p-100f ? 0x1p100f : 1.0f, ms = m * ps;
        float inv = (float)pa->wmax / ms, sw = ms / (float)pa->wmax * (1.0f / ps), fs = sw * (float)s_c;
        long isum = 0;
        double segc = 0.0;
        for (size_t k = s0; k < s0 + sn; k++) {
            float a = wi[k] * nrm[k];
            long cw1 = (long)nearbyintf(a * ps * inv);
            unsigned ix = kvq__tq_get_idx(rows + k * vb + t->off_idx, j, t->kb);
            isum += cw1 * cb[ix];
            segc += fabs(cb[ix] * s_c);
            asum += a;
            mag += fabs(a * t->cent[ix]);
        }
        emu += (double)isum * fs;
        chat += segc * sw;
        bound += fabs((double)isum * fs);
        den += fabs((double)isum) * DEN + DEN; /* fs and the fma, subnormal */
    }
    /* emulation: one fused multiply-add per segment after exact integer sums */
    note(st, fabs(kv - emu), 2 * U24 * (double)nseg * (fabs(acc0) + bound) + 2 * DEN * (double)nseg, 1);
    /* tq.c's bound: s_w/2 sum_k |c^_k| + s_c/2 sum_k a_k (0.5 + 1e-4 for the float
     * scales), the reference's float sum gamma_{n+1} (|acc| + sum |a c|) and the
     * kernel's roundings, with margin 2 */
    double b = (0.5 + 1e-4) * chat + (0.5 + 1e-4) * s_c * asum + 2 * gam((double)n + 1) * mag +
               2 * 2 * U24 * (double)nseg * (fabs(acc0) + bound) + 2 * den;
    note(st, fabs(kv - rv), b, 0);
    st->n++;
}

static void check_accum(const path *pa, kvq_codec *c, size_t P, size_t nq, tu_rng *r, stats *st) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, vb = c->bytes, as = c->acc_len + 5, ws = P + 7;
    float *x = (float *)xalloc(P * d * 4), *w = (float *)xalloc(nq * ws * 4);
    float *a0 = (float *)xalloc(nq * as * 4), *ak = (float *)xalloc(nq * as * 4), *ar = (float *)xalloc(nq * as * 4);
    uint8_t *rows = (uint8_t *)xalloc(P * vb), *page = (uint8_t *)xalloc(P * vb), *g = (uint8_t *)xalloc(P * vb);
    fill_vectors(r, x, P, d);
    make_page(c, KVQ__ROLE_V, P, x, rows, page);
    for (size_t i = 0; i < nq; i++)
        fill_weights(r, w + i * ws, i, P);
    tu_fill_gauss(r, a0, nq * as, 0.3f);
    memcpy(ak, a0, nq * as * 4);
    memcpy(ar, a0, nq * as * 4);
    c->k.taccum(c, ak, as, w, ws, nq, page, P);
    kvq__tile_accum_rows(c, &c->ref, ar, as, w, ws, nq, page, P, g);
    float *nrm = (float *)xalloc(P * 4);
    for (size_t k = 0; k < P; k++)
        nrm[k] = kvq__tq_get_norm(t, &t->ns, rows + k * vb);
    for (size_t i = 0; i < nq; i++) {
        /* padding columns past acc_len are never touched */
        for (size_t j = c->acc_len; j < as; j++)
            st->bad_exact += ak[i * as + j] != a0[i * as + j];
        if (i % 6 == 3) { /* negative weight: the exact path, the reference's own arithmetic */
            for (size_t j = 0; j < d; j++)
                st->bad_exact += ak[i * as + j] != ar[i * as + j];
            continue;
        }
    }
    /* per segment and dimension: emulation and bound; the kernel's float
     * additions of several segments are bounded by the same terms */
    for (size_t i = 0; i < nq; i++) {
        if (i % 6 == 3)
            continue;
        const float *wi = w + i * ws;
        for (size_t j = 0; j < d; j++)
            check_dim(pa, t, wi, nrm, rows, vb, P, P / 256 + 1, j, a0[i * as + j], ak[i * as + j],
                      ar[i * as + j], st);
    }
    free(nrm);
    free(x);
    free(w);
    free(a0);
    free(ak);
    free(ar);
    free(rows);
    free(page);
    free(g);
}

static void test_kernels(void) {
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tq3:norm=8", "tq4:nc=0"};
    static const size_t ds[] = {16, 48, 64, 128};
    static const size_t Ps[] = {16, 32, 64};
    static const size_t nqs[] = {1, 2, 3, 6};
    tu_rng r;
    tu_seed(&r, SEED + 1);
    printf("kernel seed %u\n", SEED + 1);
    for (int pi = 0; pi < npaths; pi++) {
        const path *pa = &paths[pi];
        stats ss, sa;
        memset(&ss, 0, sizeof ss);
        memset(&sa, 0, sizeof sa);
        for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
            for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
                kvq_codec *c = mk_path(pa, specs[si], ds[di]);
                if (!c)
                    continue;
                TU_REPORT(c->k.tprep && c->k.tscore && c->k.taccum && c->k.taccum_run, "%s %s d=%zu: no tiled kernels",
                          pa->name, specs[si], ds[di]);
                if (!c->k.tscore) {
                    kvq_codec_free(c);
                    continue;
                }
                for (size_t pj = 0; pj < sizeof Ps / sizeof Ps[0]; pj++)
                    for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
                        snprintf(ss.where, sizeof ss.where, "%s d=%zu P=%zu nq=%zu", specs[si], ds[di], Ps[pj],
                                 nqs[qi]);
                        memcpy(sa.where, ss.where, sizeof sa.where);
                        check_score(pa, c, Ps[pj], nqs[qi], 1.0f, &r, &ss);
                        check_accum(pa, c, Ps[pj], nqs[qi], &r, &sa);
                    }
                if (ds[di] == 64 && si == 2) { /* a page longer than one weight segment */
                    snprintf(ss.where, sizeof ss.where, "%s d=64 P=272", specs[si]);
                    memcpy(sa.where, ss.where, sizeof sa.where);
                    check_score(pa, c, 272, 4, 1.0f, &r, &ss);
                    check_accum(pa, c, 272, 6, &r, &sa);
                    /* tiny queries (scaled by 2^100 before rounding) and huge ones */
                    check_score(pa, c, 32, 3, 1e-33f, &r, &ss);
                    check_score(pa, c, 32, 3, 1e-40f, &r, &ss);
                    check_score(pa, c, 32, 3, 1e30f, &r, &ss);
                }
                kvq_codec_free(c);
            }
        printf("  %-22s score: %ld checked, worst err/bound %.3g (emulation) %.3g (reference, %s)\n", pa->name,
               ss.n, ss.worst_emu, ss.worst_bound, ss.worst_ref);
        printf("  %-22s accum: %ld checked, worst err/bound %.3g (emulation) %.3g (reference, %s)\n", pa->name,
               sa.n, sa.worst_emu, sa.worst_bound, sa.worst_ref);
        if (ss.first[0])
            printf("  first score failure: %s\n", ss.first);
        if (sa.first[0])
            printf("  first accum failure: %s\n", sa.first);
        TU_REPORT(ss.bad_code == 0, "%s: %ld query codes/headers wrong", pa->name, ss.bad_code);
        TU_REPORT(ss.bad_emu == 0, "%s: %ld scores off the integer emulation (worst %.3g x bound)", pa->name,
                  ss.bad_emu, ss.worst_emu);
        TU_REPORT(ss.bad_bound == 0, "%s: %ld scores outside the bound of the reference (worst %.3g x)", pa->name,
                  ss.bad_bound, ss.worst_bound);
        TU_REPORT(sa.bad_emu == 0, "%s: %ld accumulations off the integer emulation (worst %.3g x bound)",
                  pa->name, sa.bad_emu, sa.worst_emu);
        TU_REPORT(sa.bad_bound == 0, "%s: %ld accumulations outside the bound of the reference (worst %.3g x)",
                  pa->name, sa.bad_bound, sa.worst_bound);
        TU_REPORT(sa.bad_exact == 0, "%s: %ld values of the exact path / padding differ", pa->name, sa.bad_exact);
    }
}

/* ---- taccum_run: runs of np pages ---- */

typedef void (*run_fn)(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride,
                       size_t nq, const uint8_t *const *pages, size_t np, size_t P);

/* Weights of row `kind` over a run of n tokens (pages of P), as a softmax
 * over the run gives them: 0 softmax of Gaussian scores, 1 all zero (a
 * masked row), 2 one dominant weight (the others ~1e-6 of it), 3 tiny and
 * large mixed (40 decades, half of them exact zeros), 4 softmax-like with a
 * negative value in every segment of 256 tokens (the exact path), 5 tiny
 * (below 2^-100, partly subnormal), 6 softmax with page 1 all zero; and
 * RUN_FLAT (not in the rotation): softmax of flat scores, where every page
 * carries its share of the weight. */
#define RUN_KINDS 7
#define RUN_FLAT 7
static void fill_run_weights(tu_rng *r, float *w, int kind, size_t n, size_t P) {
    double sum = 0.0;
    const size_t dom = (size_t)(tu_uniform(r) * (double)n) % n;
    for (size_t k = 0; k < n; k++) {
        double v;
        switch (kind) {
        case 0:
        case 4:
        case 6:
            v = exp(3.0 * tu_gauss(r));
            break;
        case 1:
            v = 0.0;
            break;
        case RUN_FLAT:
            v = exp(0.5 * tu_gauss(r));
            break;
        case 2:
            v = k == dom ? 1.0 : 1e-6 * exp(tu_gauss(r));
            break;
        case 3:
            v = tu_uniform(r) < 0.5 ? 0.0 : exp(-46.0 * tu_uniform(r));
            break;
        default:
            v = 1e-39 * exp(2.0 * tu_gauss(r));
            break;
        }
        if (kind == 6 && k / P == 1)
            v = 0.0;
        w[k] = (float)v;
        sum += v;
    }
    if (kind != 3 && kind != 5 && sum > 0.0)
        for (size_t k = 0; k < n; k++)
            w[k] = (float)(w[k] / sum);
    if (kind == 4)
        for (size_t k = 5; k < n; k += 128) /* every segment of 256 (starting at 256 s) holds one */
            w[k] = -0.25f;
}

/* c->k.taccum_run over np random pages of P tokens and nq weight rows
 * (kinds of fill_run_weights in turn from salt; salt < 0: all RUN_FLAT)
 * against kvq__tile_accum_pages with the reference kernels, and against
 * an emulation of the kernel's integer arithmetic. The run's tokens are
 * taken page after page in segments of 256 (KVQ__TQ_TSEG512 / the AVX2
 * KVQ__TQ_TSEG); per row and segment the kernel rounds a_k = w_k n_k to
 * codes round(a_k / s_w), s_w = max a / W, and adds s_w s_c sum_k code_k
 * c8[idx_kj] with one float conversion (exact: |sum| < 2^23) and one FMA.
 * Bounds:
 *  - emulation: the FMAs only, one per segment: u (|acc0| + sum_seg
 *    |s_w s_c isum|) each, margin 2 (plus subnormal terms as check_accum);
 *  - reference: tq.c's bound per segment, s_w/2 sum_k |c^_kj| + s_c/2
 *    sum_k a_k (0.5 + 1e-4: the float scales are within a few ulps of the
 *    exact ones), plus the reference's own float sums over the run,
 *    gamma_{np P + 1} (|acc0| + sum_k |a_k c_kj|), and the kernel's FMAs,
 *    with margin 2.
 * Rows with a negative weight take the exact path: equal to the reference. */
static void check_accum_run(const path *pa, kvq_codec *c, run_fn fn, size_t P, size_t np, size_t nq, int salt,
                            tu_rng *r, stats *st) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t d = c->d, vb = c->bytes, as = c->acc_len + 5, N = np * P, ws = N + 7;
    float *x = (float *)xalloc(P * d * 4), *w = (float *)xalloc(nq * ws * 4), *nrm = (float *)xalloc(N * 4);
    float *a0 = (float *)xalloc(nq * as * 4), *ak = (float *)xalloc(nq * as * 4), *ar = (float *)xalloc(nq * as * 4);
    uint8_t *rows = (uint8_t *)xalloc(N * vb), *g = (uint8_t *)xalloc(P * vb);
    uint8_t **pg = (uint8_t **)malloc(np * sizeof *pg);
    for (size_t i = 0; i < np; i++) {
        pg[i] = (uint8_t *)xalloc(P * vb);
        fill_vectors(r, x, P, d);
        make_page(c, KVQ__ROLE_V, P, x, rows + i * P * vb, pg[i]);
    }
    for (size_t i = 0; i < nq; i++)
        fill_run_weights(r, w + i * ws, salt < 0 ? RUN_FLAT : (int)((i + (size_t)salt) % RUN_KINDS), N, P);
    tu_fill_gauss(r, a0, nq * as, 0.3f);
    memcpy(ak, a0, nq * as * 4);
    memcpy(ar, a0, nq * as * 4);
    fn(c, ak, as, w, ws, nq, (const uint8_t *const *)pg, np, P);
    kvq__tile_accum_pages(c, &c->ref, ar, as, w, ws, nq, (const uint8_t *const *)pg, np, P, g);
    const size_t nseg = (N + 255) / 256;
    for (size_t k = 0; k < N; k++)
        nrm[k] = kvq__tq_get_norm(t, &t->ns, rows + k * vb);
    for (size_t i = 0; i < nq; i++) {
        const float *wi = w + i * ws;
        int exact = 0;
        for (size_t k = 0; k < N; k++)
            exact |= wi[k] < 0.0f;
        for (size_t j = c->acc_len; j < as; j++) /* padding columns past acc_len are never touched */
            st->bad_exact += ak[i * as + j] != a0[i * as + j];
        if (exact) { /* the exact path: the reference's own arithmetic */
            for (size_t j = 0; j < d; j++)
                st->bad_exact += ak[i * as + j] != ar[i * as + j];
            continue;
        }
        for (size_t j = 0; j < d; j++)
            check_dim(pa, t, wi, nrm, rows, vb, N, nseg, j, a0[i * as + j], ak[i * as + j],
                      ar[i * as + j], st);
    }
    for (size_t i = 0; i < np; i++)
        free(pg[i]);
    free(pg);
    free(x);
    free(w);
    free(nrm);
    free(a0);
    free(ak);
    free(ar);
    free(rows);
    free(g);
}

/* Deliberately broken runs (the checker must reject them): page 2 read as
 * page 1; page 2 with the norms of page 1; the run cut after np - 1 pages. */
static run_fn real_run;
static void broken_page(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride, size_t nq,
                        const uint8_t *const *pages, size_t np, size_t P) {
    const uint8_t *p[64];
    memcpy(p, pages, np * sizeof *p);
    p[2] = p[1];
    real_run(c, acc, astride, w, wstride, nq, p, np, P);
}
static void broken_norms(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride,
                         size_t nq, const uint8_t *const *pages, size_t np, size_t P) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const uint8_t *p[64];
    uint8_t *cp = (uint8_t *)xalloc(P * c->bytes);
    memcpy(p, pages, np * sizeof *p);
    memcpy(cp, pages[2], P * c->bytes);
    memcpy(cp, pages[1], P * t->nb);
    p[2] = cp;
    real_run(c, acc, astride, w, wstride, nq, p, np, P);
    free(cp);
}
static void broken_short(const kvq_codec *c, float *acc, size_t astride, const float *w, size_t wstride,
                         size_t nq, const uint8_t *const *pages, size_t np, size_t P) {
    real_run(c, acc, astride, w, wstride, nq, pages, np - 1, P);
}

static void test_accum_run(void) {
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tq3:norm=8"};
    static const size_t ds[] = {64, 128};
    static const size_t Ps[] = {16, 32, 64};
    tu_rng r;
    tu_seed(&r, SEED + 3);
    printf("taccum_run seed %u\n", SEED + 3);
    for (int pi = 0; pi < npaths; pi++) {
        const path *pa = &paths[pi];
        stats sa;
        memset(&sa, 0, sizeof sa);
        int salt = 0, have = 0;
        for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
            for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
                kvq_codec *c = mk_path(pa, specs[si], ds[di]);
                if (!c)
                    continue;
                if (!c->k.taccum_run) {
                    kvq_codec_free(c);
                    continue;
                }
                have = 1;
                for (size_t pj = 0; pj < sizeof Ps / sizeof Ps[0]; pj++)
                    for (size_t np = 1; np <= 5; np++)
                        for (size_t nq = 1; nq <= 5; nq++) {
                            snprintf(sa.where, sizeof sa.where, "%s d=%zu P=%zu np=%zu nq=%zu", specs[si], ds[di],
                                     Ps[pj], np, nq);
                            check_accum_run(pa, c, c->k.taccum_run, Ps[pj], np, nq, salt++, &r, &sa);
                        }
                if (si == 2) { /* segments of 256 across and inside pages: 17 pages of 16 (16 + 1
                                * pieces), 2 pages of 272 (a page in three segments' pieces) */
                    snprintf(sa.where, sizeof sa.where, "%s d=%zu P=16 np=17", specs[si], ds[di]);
                    check_accum_run(pa, c, c->k.taccum_run, 16, 17, 5, salt++, &r, &sa);
                    snprintf(sa.where, sizeof sa.where, "%s d=%zu P=272 np=2", specs[si], ds[di]);
                    check_accum_run(pa, c, c->k.taccum_run, 272, 2, 6, salt++, &r, &sa);
                }
                kvq_codec_free(c);
            }
        if (!have) {
            TU_REPORT(0, "%s: no taccum_run", pa->name);
            continue;
        }
        printf("  %-22s taccum_run: %ld checked, worst err/bound %.3g (emulation) %.3g (reference, %s)\n",
               pa->name, sa.n, sa.worst_emu, sa.worst_bound, sa.worst_ref);
        if (sa.first[0])
            printf("  first taccum_run failure: %s\n", sa.first);
        TU_REPORT(sa.bad_emu == 0, "%s: %ld run accumulations off the integer emulation (worst %.3g x bound)",
                  pa->name, sa.bad_emu, sa.worst_emu);
        TU_REPORT(sa.bad_bound == 0, "%s: %ld run accumulations outside the bound of the reference (worst %.3g x)",
                  pa->name, sa.bad_bound, sa.worst_bound);
        TU_REPORT(sa.bad_exact == 0, "%s: %ld run values of the exact path / padding differ", pa->name,
                  sa.bad_exact);

        /* the checker rejects broken runs (tq3 and tq4, d 128, 4 pages of 16, 4 rows of
         * flat softmax weights: the decode step's shape), by both of its checks (the
         * reference's bound, ~ max a np P / 2W, cannot see a broken page whose weights
         * are far below the largest: hence flat weights) */
        static const struct {
            run_fn fn;
            const char *what;
        } broken[] = {{broken_page, "page 2 read as page 1"},
                      {broken_norms, "page 2 with page 1's norms"},
                      {broken_short, "last page left out"}};
        for (size_t bi = 0; bi < sizeof broken / sizeof broken[0]; bi++)
            for (int si = 2; si <= 3; si++) {
                kvq_codec *c = mk_path(pa, specs[si], 128);
                if (!c)
                    continue;
                stats sb;
                memset(&sb, 0, sizeof sb);
                real_run = c->k.taccum_run;
                snprintf(sb.where, sizeof sb.where, "broken");
                check_accum_run(pa, c, broken[bi].fn, 16, 4, 4, -1, &r, &sb);
                printf("    broken run %s %-26s: %4ld emulation, %4ld bound failures of %ld\n", specs[si],
                       broken[bi].what, sb.bad_emu, sb.bad_bound, sb.n);
                TU_REPORT(sb.bad_emu > 0 && sb.bad_bound > 0,
                          "%s %s: a broken run (%s) passes the checks (%ld emulation, %ld bound failures)",
                          pa->name, specs[si], broken[bi].what, sb.bad_emu, sb.bad_bound);
                kvq_codec_free(c);
            }
    }
}

/* The AVX2 kernels' codes c6 (tq_avx2.h): kvq__tq_avx2_codes gives the
 * definition (path_codes), |c6| <= 63 with the extremes +-63; and their
 * int16 sums at the bound: keys and values whose indices are all the
 * largest level (code 63: biased key code 127, the largest product with a
 * weight code 127) against a prepared query whose codes are all +63 or all
 * -63, and weight rows whose codes are all 127. Two pairs of two groups
 * (quads) then sum to +-32004 in int16: any third term in the same int16
 * sum saturates, and the results must equal the exact integer sums
 * (n_k sc 63 * 63 * d per key, s_w s6 127 * 63 * n per dimension: exact in
 * float up to the final roundings). */
static void test_avx2_extremes(void) {
    const path *pa = NULL;
    for (int i = 0; i < npaths; i++)
        if (paths[i].c6)
            pa = &paths[i];
    if (!pa)
        return;
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tq3:norm=8"};
    long bad_tab = 0, bad_k = 0, bad_v = 0, n = 0;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        const size_t d = 128, P = 64, nq = 4;
        kvq_codec *c = mk_path(pa, specs[si], d);
        if (!c)
            continue;
        const kvq__tq *t = (const kvq__tq *)c->state;
        int cb[16], bias;
        double s_c;
        path_codes(pa, t, cb, &s_c, &bias);
        int8_t c6[16];
        float s6;
        kvq__tq_avx2_codes(t, c6, &s6);
        for (int l = 0; l < 16; l++)
            bad_tab += c6[l] != cb[l] || abs(c6[l]) > KVQ__TQ_C_AVX2;
        bad_tab += c6[t->levels - 1] != KVQ__TQ_C_AVX2 || c6[0] != -KVQ__TQ_C_AVX2 || (double)s6 != s_c;
        /* rows with every index at the largest level and the norm of row 0 */
        tu_rng r;
        tu_seed(&r, SEED + 4);
        float *x = (float *)xalloc(P * d * 4), *o = (float *)xalloc(nq * P * 4), *w = (float *)xalloc(nq * P * 4);
        float *acc = (float *)xalloc(nq * c->acc_len * 4);
        uint8_t *rows = (uint8_t *)xalloc(P * c->bytes), *page = (uint8_t *)xalloc(P * c->bytes);
        uint8_t *qt = (uint8_t *)xalloc(nq * c->tqp_bytes);
        fill_vectors(&r, x, P, d);
        c->ref.encode(c, rows, x, P);
        for (size_t i = 0; i < P; i++) {
            memcpy(rows + i * c->bytes, rows, t->nb);
            memset(rows + i * c->bytes + t->off_idx, 0xFF, t->idx_bytes);
        }
        const double nk = kvq__tq_get_norm(t, &t->ns, rows);
        for (int role = 0; role < 2; role++) {
            memset(page, 0, P * c->bytes);
            for (size_t i = 0; i < P; i++)
                c->tput(c, role, P, page, i, rows + i * c->bytes);
            if (role == KVQ__ROLE_K) {
                /* rows 0, 2: codes +63; rows 1, 3: -63; sc = 1 */
                for (size_t i = 0; i < nq; i++) {
                    c->k.tprep(c, qt + i * c->tqp_bytes, x); /* the header's table */
                    kvq__tq_tqh2 *hd = (kvq__tq_tqh2 *)(void *)(qt + i * c->tqp_bytes);
                    const int a = i % 2 ? -KVQ__TQ_Q_MADD : KVQ__TQ_Q_MADD;
                    memset(qt + i * c->tqp_bytes + KVQ__TQ_TQ_CODES, (uint8_t)(int8_t)a, d);
                    memset(qt + i * c->tqp_bytes + KVQ__TQ_TQ_QV(d), (uint8_t)(int8_t)a, 8 * d);
                    hd->sc = 1.0f;
                    hd->corr = bias * a * (int32_t)d;
                }
                c->k.tscore(c, o, P, qt, nq, page, P);
                for (size_t i = 0; i < nq; i++)
                    for (size_t k = 0; k < P; k++, n++) {
                        const double want = nk * (i % 2 ? -1.0 : 1.0) * KVQ__TQ_Q_MADD * KVQ__TQ_C_AVX2 * (double)d;
                        bad_k += fabs(o[i * P + k] - want) > 4 * U24 * fabs(want);
                    }
            } else {
                for (size_t k = 0; k < nq * P; k++)
                    w[k] = 0.5f;
                memset(acc, 0, nq * c->acc_len * 4);
                c->k.taccum(c, acc, c->acc_len, w, P, nq, page, P);
                /* a_k = 0.5 n: codes 127, s_w = 0.5 n / 127; sum 127 c6 P per dimension */
                const double want = 0.5 * nk / KVQ__TQ_W_MADD * s_c * KVQ__TQ_W_MADD * KVQ__TQ_C_AVX2 * (double)P;
                for (size_t i = 0; i < nq; i++)
                    for (size_t j = 0; j < d; j++, n++)
                        bad_v += fabs(acc[i * c->acc_len + j] - want) > 8 * U24 * fabs(want);
            }
        }
        free(x);
        free(o);
        free(w);
        free(acc);
        free(rows);
        free(page);
        free(qt);
        kvq_codec_free(c);
    }
    TU_REPORT(bad_tab == 0, "%s: %ld centroid codes c6 off their definition", pa->name, bad_tab);
    TU_REPORT(bad_k == 0, "%s: %ld scores of %ld wrong at the int16 bound (+-63 x 127)", pa->name, bad_k, n);
    TU_REPORT(bad_v == 0, "%s: %ld accumulations of %ld wrong at the int16 bound (127 x 63)", pa->name, bad_v, n);
}

/* Score of a NaN query is NaN, of a zero query 0 (as the reference). */
static void test_special_queries(void) {
    for (int pi = 0; pi < npaths; pi++) {
        kvq_codec *c = mk_path(&paths[pi], "tq4", 64);
        if (!c || !c->k.tscore) {
            kvq_codec_free(c);
            continue;
        }
        const size_t d = 64, P = 16;
        tu_rng r;
        tu_seed(&r, SEED + 2);
        float *x = (float *)xalloc(P * d * 4), *q = (float *)xalloc(2 * d * 4), *o = (float *)xalloc(2 * P * 4);
        uint8_t *rows = (uint8_t *)xalloc(P * c->bytes), *page = (uint8_t *)xalloc(P * c->bytes);
        uint8_t *qt = (uint8_t *)xalloc(2 * c->tqp_bytes);
        fill_vectors(&r, x, P, d);
        make_page(c, KVQ__ROLE_K, P, x, rows, page);
        memset(q, 0, 2 * d * 4);
        q[d + 7] = NAN;
        c->k.tprep(c, qt, q);
        c->k.tprep(c, qt + c->tqp_bytes, q + d);
        c->k.tscore(c, o, P, qt, 2, page, P);
        int zero = 1, nan = 1;
        for (size_t k = 0; k < P; k++) {
            zero &= o[k] == 0.0f;
            nan &= o[P + k] != o[P + k] || k == 3; /* token 3 is the zero vector: 0 * NaN */
        }
        TU_REPORT(zero, "%s: zero query gives nonzero scores", paths[pi].name);
        TU_REPORT(nan, "%s: NaN query gives non-NaN scores", paths[pi].name);
        free(x);
        free(q);
        free(o);
        free(rows);
        free(page);
        free(qt);
        kvq_codec_free(c);
    }
}

/* ---- benchmark (--bench) ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One decode step's kernels over H heads x T tokens in pages of P, 4 query
 * rows per head: with tiled (pages in the tiled layout where the codec has
 * one) tprep + tscore / taccum where the codec has them, else the row
 * kernels on row pages. Returns the best total of reps runs (K and V parts
 * in *tk, *tv). */
static double bench_run(kvq_codec *c, int tiled, uint8_t *kp, uint8_t *vp, size_t H, size_t T, size_t P,
                        const float *q, float *sc, const float *wt, float *acc, int reps, double *tk,
                        double *tv) {
    const size_t d = c->d, pb = P * c->bytes, npg = T / P, nq = 4;
    const int ks = tiled && kvq__tiled(c, KVQ__ROLE_K, P) && c->k.tscore;
    const int va = tiled && kvq__tiled(c, KVQ__ROLE_V, P) && c->k.taccum;
    size_t qb = ks ? c->tqp_bytes : c->qp_bytes;
    uint8_t *qp = (uint8_t *)xalloc(nq * qb);
    double best = 1e9, bk = 1e9, bv = 1e9;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now_s(), tks = 0.0;
        for (size_t h = 0; h < H; h++) {
            double t1 = now_s();
            for (size_t i = 0; i < nq; i++) {
                if (ks)
                    c->k.tprep(c, qp + i * qb, q + i * d);
                else
                    c->k.prep(c, qp + i * qb, q + i * d);
            }
            const uint8_t *kh = kp + h * npg * pb, *vh = vp + h * npg * pb;
            for (size_t pg = 0; pg < npg; pg++) {
                if (ks)
                    c->k.tscore(c, sc + pg * P, T, qp, nq, kh + pg * pb, P);
                else
                    c->k.score(c, sc + pg * P, T, qp, nq, kh + pg * pb, P);
            }
            double t2 = now_s();
            tks += t2 - t1;
            for (size_t pg = 0; pg < npg; pg++) {
                if (va)
                    c->k.taccum(c, acc, c->acc_len, wt + pg * P, T, nq, vh + pg * pb, P);
                else
                    c->k.accum(c, acc, c->acc_len, wt + pg * P, T, nq, vh + pg * pb, P);
            }
        }
        double t = now_s() - t0;
        if (t < best) {
            best = t;
            bk = tks;
            bv = t - tks;
        }
    }
    *tk = bk;
    *tv = bv;
    free(qp);
    return best;
}

static void bench(size_t P) {
    const size_t H = 8, T = 32768, d = 128;
    printf("bench: %zu KV heads x %zu tokens, pages of %zu, head_dim %zu, 4 query rows per head, one thread\n", H,
           T, P, d);
    printf("best isa %s, AVX-512 features %s%s\n", kvq_isa_name(kvq_cpu_best_isa()),
           (kvq__cpu_avx512_features() & KVQ__X512_VNNI) ? "VNNI " : "",
           (kvq__cpu_avx512_features() & KVQ__X512_VBMI) ? "VBMI" : "");
    tu_rng r;
    tu_seed(&r, 7);
    float *x = (float *)xalloc(P * d * 4), *q = (float *)xalloc(4 * d * 4);
    float *sc = (float *)xalloc(4 * T * 4), *wt = (float *)xalloc(4 * T * 4), *acc = (float *)xalloc(4 * 2 * d * 4);
    tu_fill_gauss(&r, q, 4 * d, 1.0f);
    for (size_t i = 0; i < 4 * T; i++) /* softmax-like weights */
        wt[i] = (float)exp(2.0 * tu_gauss(&r)) / (float)T;
    memset(acc, 0, 4 * 2 * d * 4);
    struct {
        const char *spec;
        kvq_isa isa;
        int sel;
        unsigned feat;
        int tiled;
        const char *name;
    } runs[] = {
        {"f32", KVQ_ISA_AVX2, 0, 0, 0, "f32 avx2 rows"},
        {"f32", KVQ_ISA_AVX2, 0, 0, 1, "f32 avx2 (tiled K)"},
        {"f32", KVQ_ISA_AVX512, 0, 0, 1, "f32 avx512 (tiled K)"},
        {"tq4", KVQ_ISA_AVX2, 0, 0, 0, "tq4 avx2 rows"},
        {"tq4", KVQ_ISA_AVX2, 0, 0, 1, "tq4 avx2 tiled"},
        {"tq4", KVQ_ISA_AVX2, 1, 0, 1, "tq4 avx512bw tiled"},
        {"tq4", KVQ_ISA_AVX512, 0, 0, 1, "tq4 avx512 tiled"},
        {"tq3", KVQ_ISA_AVX2, 0, 0, 0, "tq3 avx2 rows"},
        {"tq3", KVQ_ISA_AVX2, 0, 0, 1, "tq3 avx2 tiled"},
        {"tq3", KVQ_ISA_AVX2, 1, 0, 1, "tq3 avx512bw tiled"},
        {"tq3", KVQ_ISA_AVX512, 0, 0, 1, "tq3 avx512 tiled"},
    };
    double f32_ms = 0.0;
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        if (!kvq_cpu_supports(runs[ri].isa) || (runs[ri].sel && !kvq_cpu_supports(KVQ_ISA_AVX512)))
            continue;
        kvq_codec *c = mk(runs[ri].spec, d, runs[ri].isa);
        if (!c)
            continue;
        if (runs[ri].sel)
            kvq__tq_avx512_select(c, runs[ri].feat);
        if (runs[ri].tiled && !c->k.tscore) {
            kvq_codec_free(c);
            continue;
        }
        const size_t pb = P * c->bytes, npg = H * T / P;
        uint8_t *kp = (uint8_t *)xalloc(npg * pb), *vp = (uint8_t *)xalloc(npg * pb);
        uint8_t *rows = (uint8_t *)xalloc(pb);
        for (size_t pg = 0; pg < npg; pg++) {
            if (pg < 16) { /* 16 distinct pages, copied (encoding 262k vectors would dominate) */
                fill_vectors(&r, x, P, d);
                c->k.encode(c, rows, x, P);
                for (int role = 0; role < 2; role++) {
                    uint8_t *dst = (role ? vp : kp) + pg * pb;
                    if (runs[ri].tiled && kvq__tiled(c, role, P))
                        for (size_t i = 0; i < P; i++)
                            c->tput(c, role, P, dst, i, rows + i * c->bytes);
                    else
                        memcpy(dst, rows, pb);
                }
            } else {
                memcpy(kp + pg * pb, kp + (pg % 16) * pb, pb);
                memcpy(vp + pg * pb, vp + (pg % 16) * pb, pb);
            }
        }
        double tk, tv;
        double t = bench_run(c, runs[ri].tiled, kp, vp, H, T, P, q, sc, wt, acc, 5, &tk, &tv);
        double mb = 2.0 * (double)(npg * pb) / 1e6;
        if (c->family == KVQ__FAM_FLOAT && f32_ms == 0.0)
            f32_ms = t * 1e3;
        printf("  %-22s step %7.3f ms (K %6.3f, V %6.3f)  %6.1f MB  %5.1f GB/s  %5.2f ns/token-head  %.3fx f32\n",
               runs[ri].name, t * 1e3, tk * 1e3, tv * 1e3, mb, mb / 1e3 / t, t * 1e9 / (double)(H * T),
               f32_ms > 0 ? t * 1e3 / f32_ms : 0.0);
        free(kp);
        free(vp);
        free(rows);
        kvq_codec_free(c);
    }
    free(x);
    free(q);
    free(sc);
    free(wt);
    free(acc);
}

/* `--bench-run`: the V side of a decode run on hot data (tq3, tq4, d 128,
 * 4 query rows, 4 pages of 16 tokens: what the decode driver hands one
 * taccum_run call): taccum page by page (4 calls) against one taccum_run,
 * side by side in the same run, best of 31 alternating rounds. */
static void bench_run_pages(void) {
    const size_t d = 128, P = 16, np = 4, nq = 4, N = np * P, iters = 4000;
    printf("bench-run: taccum x %zu pages vs taccum_run (np %zu), P %zu, head_dim %zu, %zu rows, hot data, one thread\n",
           np, np, P, d, nq);
    printf("best isa %s, AVX-512 features %s%s\n", kvq_isa_name(kvq_cpu_best_isa()),
           (kvq__cpu_avx512_features() & KVQ__X512_VNNI) ? "VNNI " : "",
           (kvq__cpu_avx512_features() & KVQ__X512_VBMI) ? "VBMI" : "");
    static const char *specs[] = {"tq3", "tq4"};
    for (int pi = 0; pi < npaths; pi++) {
        if (paths[pi].sel == 2) /* SIMDe: not a speed */
            continue;
        for (int si = 0; si < 2; si++) {
            kvq_codec *c = mk_path(&paths[pi], specs[si], d);
            if (!c)
                continue;
            tu_rng r;
            tu_seed(&r, 11);
            float *x = (float *)xalloc(P * d * 4), *w = (float *)xalloc(nq * N * 4);
            float *acc = (float *)xalloc(nq * c->acc_len * 4);
            uint8_t *rows = (uint8_t *)xalloc(P * c->bytes), *pages[4];
            for (size_t i = 0; i < np; i++) {
                pages[i] = (uint8_t *)xalloc(P * c->bytes);
                fill_vectors(&r, x, P, d);
                make_page(c, KVQ__ROLE_V, P, x, rows, pages[i]);
            }
            for (size_t i = 0; i < nq; i++)
                fill_run_weights(&r, w + i * N, 0, N, P);
            memset(acc, 0, nq * c->acc_len * 4);
            double best1 = 1e9, best2 = 1e9;
            for (int rep = 0; rep < 31; rep++) {
                double t0 = now_s();
                for (size_t it = 0; it < iters; it++)
                    for (size_t i = 0; i < np; i++)
                        c->k.taccum(c, acc, c->acc_len, w + i * P, N, nq, pages[i], P);
                double t1 = now_s();
                if (c->k.taccum_run)
                    for (size_t it = 0; it < iters; it++)
                        c->k.taccum_run(c, acc, c->acc_len, w, N, nq, (const uint8_t *const *)pages, np, P);
                double t2 = now_s();
                best1 = fmin(best1, t1 - t0);
                best2 = fmin(best2, t2 - t1);
            }
            const double n1 = best1 * 1e9 / (double)(iters * np), n2 = best2 * 1e9 / (double)(iters * np);
            if (c->k.taccum_run)
                printf("  %-22s %s  taccum %6.1f ns/page-head  taccum_run %6.1f ns/page-head  (%.0f%% cheaper)\n",
                       paths[pi].name, specs[si], n1, n2, 100.0 * (1.0 - n2 / n1));
            else
                printf("  %-22s %s  taccum %6.1f ns/page-head  (no taccum_run)\n", paths[pi].name, specs[si], n1);
            for (size_t i = 0; i < np; i++)
                free(pages[i]);
            free(x);
            free(w);
            free(acc);
            free(rows);
            kvq_codec_free(c);
        }
    }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--bench") == 0) { /* --bench [P] */
            bench(i + 1 < argc ? (size_t)atoi(argv[i + 1]) : 64);
            return 0;
        }
    int brun = 0;
    for (int i = 1; i < argc; i++)
        brun |= strcmp(argv[i], "--bench-run") == 0;
    const int avx2 = kvq_cpu_supports(KVQ_ISA_AVX2), avx512 = kvq_cpu_supports(KVQ_ISA_AVX512);
    const unsigned feat = kvq__cpu_avx512_features();
    if (avx2) {
        add_path("avx2", KVQ_ISA_AVX2, 0, 0, 0);
        if (avx512) {
            add_path((feat & KVQ__X512_VNNI) ? "avx512 (vnni, native)" : "avx512 (native)", KVQ_ISA_AVX512, 0, 0,
                     (feat & KVQ__X512_VNNI) != 0);
            add_path("avx512bw (native)", KVQ_ISA_AVX2, 1, 0, 0);
        }
        /* the SIMDe builds call the AVX2 query preparation: they need AVX2 */
        add_path("avx512 vnni (simde)", KVQ_ISA_AVX2, 2, KVQ__X512_VNNI | KVQ__X512_VBMI, 1);
        add_path("avx512bw (simde)", KVQ_ISA_AVX2, 2, 0, 0);
    }
    printf("cpu: avx2 %d, avx512 %d (vnni %d, vbmi %d); paths:", avx2, avx512, (feat & KVQ__X512_VNNI) != 0,
           (feat & KVQ__X512_VBMI) != 0);
    for (int i = 0; i < npaths; i++)
        printf(" [%s]", paths[i].name);
    printf("\n");
    if (brun) {
        bench_run_pages();
        return 0;
    }
    test_tiled_set();
    test_layout();
    test_kernels();
    test_accum_run();
    test_special_queries();
    test_avx2_extremes();
    return tu_finish();
}
