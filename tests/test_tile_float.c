/*
 * test_tile_float.c - the tiled page layout of f32/f16/bf16 keys and the
 * kernels that read it: slot round trips, and tscore (tiled keys) and accum
 * (value rows) of every path - AVX2, AVX-512 natively where the CPU has it,
 * and AVX-512 through SIMDe always (the same source, simd_avx512.h) -
 * against the scalar reference (kvq__tile_gather + ref.score / ref.accum).
 *
 * Bound (from the float summation error, not from measured values): both
 * sides compute the same products of exactly representable values and sum
 * them in different orders, so each result is within gamma_n * sum |terms|
 * of exact (n terms, gamma_n = n u / (1 - n u), u = 2^-24) and the two
 * differ by at most 2 gamma_n sum |terms|; accum adds acc's own value, one
 * more rounding: n + 1 terms. The test allows exactly that (no margin).
 * --mutate breaks the AVX-512 score to show the test fails.
 */
#include "testutil.h"
#include "kvq.h"
#include "../src/codec/codec_impl.h"
#include "../src/kernels/kernels.h"

static int mutate;

static double gam(size_t n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

/* tscore and accum of the kernels in k against the reference of c. */
static void check_paths(kvq_codec *c, const kvq__kernels *k, size_t tqp, const char *path,
                        size_t P, tu_rng *r) {
    const size_t d = c->d, nq = 5, B = c->bytes;
    float *x = malloc(P * d * sizeof(float)), *q = malloc(nq * d * sizeof(float));
    uint8_t *rows = malloc(P * B), *page = malloc(P * B), *back = malloc(P * B);
    uint8_t *qp = aligned_alloc(64, kvq__round64(nq * KVQ__MAX(c->qp_bytes, tqp) + 64));
    uint8_t *qt = aligned_alloc(64, kvq__round64(nq * KVQ__MAX(c->qp_bytes, tqp) + 64));
    float *s0 = malloc(nq * P * sizeof(float)), *s1 = malloc(nq * P * sizeof(float));
    float *dec = malloc(P * d * sizeof(float));
    tu_fill_gauss(r, x, P * d, 1.0f);
    for (size_t i = 0; i < P * d; i += 7)
        x[i] *= 30.0f; /* outliers */
    tu_fill_gauss(r, q, nq * d, 1.0f);
    c->k.encode(c, rows, x, P);
    c->ref.decode(c, dec, rows, P);
    memset(page, 0xa5, P * B);
    for (size_t i = 0; i < P; i++) /* slots in a scrambled order */
        c->tput(c, KVQ__ROLE_K, P, page, (i * 7 + 3) % P, rows + ((i * 7 + 3) % P) * B);
    kvq__tile_gather(c, KVQ__ROLE_K, P, page, back);
    TU_REPORT(memcmp(back, rows, P * B) == 0, "%s d=%zu P=%zu: tiled round trip", c->spec, d, P);
    /* scores */
    for (size_t i = 0; i < nq; i++)
        c->ref.prep(c, qp + i * c->qp_bytes, q + i * d);
    c->ref.score(c, s0, P, qp, nq, rows, P);
    if (k->tscore && k->tprep) {
        for (size_t i = 0; i < nq; i++)
            k->tprep(c, qt + i * tqp, q + i * d);
        kvq_codec tmp = *c;
        tmp.tqp_bytes = tqp;
        k->tscore(&tmp, s1, P, qt, nq, page, P);
        float *s2 = malloc(nq * P * sizeof(float));
        kvq__pf_next = back; /* the next page's keys to prefetch: the same bits */
        k->tscore(&tmp, s2, P, qt, nq, page, P);
        kvq__pf_next = NULL;
        TU_REPORT(memcmp(s2, s1, nq * P * sizeof(float)) == 0,
                  "%s %s d=%zu P=%zu: tscore with a prefetch area: same bits", c->spec, path, d, P);
        free(s2);
        if (mutate)
            s1[P / 2] += 1e-3f * (1.0f + fabsf(s1[P / 2]));
        int ok = 1;
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < P; j++) {
                double a = 0;
                for (size_t t = 0; t < d; t++)
                    a += fabs((double)q[i * d + t] * dec[j * d + t]);
                double b = 2 * gam(d) * a;
                if (fabs((double)s1[i * P + j] - s0[i * P + j]) > b) {
                    if (ok)
                        printf("  %s %s d=%zu P=%zu q%zu k%zu: %.9g vs %.9g (bound %.3g)\n",
                               c->spec, path, d, P, i, j, s1[i * P + j], s0[i * P + j], b);
                    ok = 0;
                }
            }
        TU_REPORT(ok, "%s %s d=%zu P=%zu: tscore within 2 gamma_d sum|q k|", c->spec, path, d, P);
    }
    /* score over key rows (staged tokens, untiled pages) */
    if (k->score != c->ref.score) {
        k->score(c, s1, P, qp, nq, rows, P);
        if (mutate)
            s1[P / 3] += 1e-3f * (1.0f + fabsf(s1[P / 3]));
        int ok = 1;
        for (size_t i = 0; i < nq; i++)
            for (size_t j = 0; j < P; j++) {
                double a = 0;
                for (size_t t = 0; t < d; t++)
                    a += fabs((double)q[i * d + t] * dec[j * d + t]);
                ok &= fabs((double)s1[i * P + j] - s0[i * P + j]) <= 2 * gam(d) * a;
            }
        TU_REPORT(ok, "%s %s d=%zu P=%zu: row score within 2 gamma_d sum|q k|", c->spec, path, d, P);
    }
    /* accum over value rows */
    if (k->accum) {
        float *w = malloc(nq * P * sizeof(float)), *a0 = calloc(nq * d, sizeof(float));
        float *a1 = calloc(nq * d, sizeof(float));
        for (size_t i = 0; i < nq * P; i++)
            w[i] = (float)tu_uniform(r);
        float *ai = malloc(nq * d * sizeof(float));
        for (size_t i = 0; i < nq * d; i++)
            ai[i] = a0[i] = a1[i] = (float)tu_gauss(r);
        c->ref.accum(c, a0, d, w, P, nq, rows, P);
        k->accum(c, a1, d, w, P, nq, rows, P);
        int ok = 1;
        for (size_t i = 0; i < nq; i++)
            for (size_t t = 0; t < d; t++) {
                double a = fabs((double)a1[i * d + t] - a0[i * d + t]), s = 0;
                for (size_t j = 0; j < P; j++)
                    s += fabs((double)w[i * P + j] * dec[j * d + t]);
                /* the accumulator's starting value is one more term */
                double b = 2 * gam(P + 1) * (s + fabs((double)a0[i * d + t]) + s);
                if (a > b)
                    ok = 0;
            }
        TU_REPORT(ok, "%s %s d=%zu P=%zu: accum within 2 gamma_(P+1) sum|w v|", c->spec, path, d, P);
        /* with the next page's area to prefetch (kvq__pf_next, as the decode
         * path sets it; the kernels pace its lines over their work): the
         * same bits; and with no row or no value (nq or n 0) acc untouched */
        float *a2 = malloc(nq * d * sizeof(float)), *a3 = malloc(nq * d * sizeof(float));
        memcpy(a2, ai, nq * d * sizeof(float));
        memcpy(a3, ai, nq * d * sizeof(float));
        kvq__pf_next = back;
        k->accum(c, a2, d, w, P, nq, rows, P);
        k->accum(c, a3, d, w, P, 0, rows, P);
        k->accum(c, a3, d, w, P, nq, rows, 0);
        kvq__pf_next = NULL;
        TU_REPORT(memcmp(a2, a1, nq * d * sizeof(float)) == 0 &&
                      memcmp(a3, ai, nq * d * sizeof(float)) == 0,
                  "%s %s d=%zu P=%zu: accum with a prefetch area: same bits; nq, n = 0: no-op",
                  c->spec, path, d, P);
        free(w), free(a0), free(a1), free(a2), free(a3), free(ai);
    }
    free(x), free(q), free(rows), free(page), free(back), free(qp), free(qt), free(s0), free(s1);
    free(dec);
}

/* The online softmax of a page (kernels.h) against its scalar reference:
 * maxima and rescale factors exact (the same comparisons and expf), each
 * exp within 2e-7 relative of expf (the polynomial's documented bound, 4
 * ulps of margin: 2.5e-7), each sum within that plus gamma_(n+1); a row
 * with nothing visible gets weights of exactly 0. Rows in groups of 4 of 16,
 * 32, 48 or 64 (runs of pages) take the side-by-side reductions of the
 * AVX-512 and AVX2 paths. */
static void check_softmax(kvq__softmax_fn fn, const char *path, tu_rng *r) {
    const size_t ns[] = {1, 5, 16, 17, 32, 33, 48, 64};
    int ok = 1;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t nri = 0; nri < 5; nri++) {
            static const size_t nrs[] = {1, 3, 4, 5, 8};
            size_t nr = nrs[nri], n = ns[ni], ss = n + 3;
            float s0[8 * 70], s1[8 * 70], m0[8], m1[8], l0[8], l1[8], f0[8], f1[8];
            for (size_t i = 0; i < nr * ss; i++)
                s0[i] = s1[i] = (float)(4 * tu_gauss(r));
            for (size_t q = 0; q < nr; q++) {
                if (q == 1)
                    for (size_t i = 0; i < n; i += 3) /* masked entries */
                        s0[q * ss + i] = s1[q * ss + i] = -INFINITY;
                if (q == 3 || q == 6) /* nothing visible (and, for 3, nothing before) */
                    for (size_t i = 0; i < n; i++)
                        s0[q * ss + i] = s1[q * ss + i] = -INFINITY;
                /* states: empty, below the page, above it */
                m0[q] = m1[q] = q % 3 == 0 ? -INFINITY : (float)(q % 3 == 1 ? -6 : 9);
                l0[q] = l1[q] = q % 3 == 0 ? 0.0f : 2.5f;
            }
            int a0 = kvq__page_softmax_ref(s0, ss, nr, n, m0, l0, f0);
            int a1 = fn(s1, ss, nr, n, m1, l1, f1);
            ok &= a0 == a1;
            for (size_t q = 0; q < nr; q++) {
                ok &= m0[q] == m1[q] && f0[q] == f1[q];
                double g = (n + 1) * 0x1p-24 / (1 - (n + 1) * 0x1p-24);
                ok &= fabs((double)l1[q] - l0[q]) <= (2.5e-7 + g) * fabs((double)l0[q]) + 1e-30;
                for (size_t i = 0; i < n; i++)
                    ok &= fabs((double)s1[q * ss + i] - s0[q * ss + i]) <=
                          2.5e-7 * fabs((double)s0[q * ss + i]);
            }
        }
    TU_REPORT(ok, "page softmax %s against the reference", path);
}

/* The online softmax over a sequence of pages, as the decode driver runs
 * it (accumulators rescaled by f when the running maximum moves, which it
 * does only past KVQ__SOFTMAX_SLACK once a sum runs): the normalized
 * weighted sum of per-token values must equal the exact softmax in double
 * within the exp polynomial's 2.5e-7 per weight plus the float sums
 * (gamma over the tokens; 1e-5 relative covers 64 pages of 16). Scores
 * rise page after page (slowly: under the slack; fast: past it), fall, or
 * jump once by 50. */
static void check_softmax_sequence(kvq__softmax_fn fn, const char *path, tu_rng *r) {
    enum { NP = 64, PT = 16, NR = 4 };
    int ok = 1;
    for (int kind = 0; kind < 4; kind++) {
        static float s[NP][NR][PT], v[NP][PT];
        for (int p = 0; p < NP; p++)
            for (int i = 0; i < PT; i++) {
                v[p][i] = (float)tu_gauss(r);
                for (int q = 0; q < NR; q++) {
                    double base = kind == 0 ? 0.3 * p : kind == 1 ? 3.0 * p
                                : kind == 2 ? -0.5 * p : (p == 40 ? 50.0 : 0.0);
                    s[p][q][i] = (float)(base + 2 * tu_gauss(r));
                }
            }
        float m[NR], l[NR], f[NR], acc[NR];
        for (int q = 0; q < NR; q++)
            m[q] = -INFINITY, l[q] = 0, acc[q] = 0;
        for (int p = 0; p < NP; p++) {
            float w[NR * PT];
            memcpy(w, s[p], sizeof w);
            if (fn(w, PT, NR, PT, m, l, f))
                for (int q = 0; q < NR; q++)
                    acc[q] *= f[q];
            for (int q = 0; q < NR; q++)
                for (int i = 0; i < PT; i++)
                    acc[q] += w[q * PT + i] * v[p][i];
        }
        for (int q = 0; q < NR; q++) {
            double mx = -INFINITY, num = 0, den = 0, mag = 0;
            for (int p = 0; p < NP; p++)
                for (int i = 0; i < PT; i++)
                    mx = fmax(mx, s[p][q][i]);
            for (int p = 0; p < NP; p++)
                for (int i = 0; i < PT; i++) {
                    double e = exp((double)s[p][q][i] - mx);
                    num += e * v[p][i], den += e, mag += e * fabs(v[p][i]);
                }
            ok &= isfinite(acc[q]) && isfinite(l[q]) &&
                  fabs((double)acc[q] / l[q] - num / den) <= 1e-5 * mag / den;
        }
    }
    TU_REPORT(ok, "page softmax %s over a sequence of pages against the exact softmax", path);
}

/* The attention tokens received (kvq__attn_add) against its reference:
 * both sum a slot's rows in row order, so they differ only by the exp
 * polynomial (2e-7 relative per term, 2.5e-7 with 4 ulps of margin) and one
 * rounding of the final add (2^-23 relative of the result: margin for a
 * term that rounds across a binade). Slots free (pos -1) or past a row's
 * query hold scores 3 above the row's maximum (a term of e^3 inv where the
 * real ones are below 1 on average), or NaN for every third of them; a row
 * with inv 0 has m = -inf. Any use of them shows. Widths cover the 8- and
 * 16-slot blocks and their tails. */
static void check_attn_add(kvq__attn_add_fn fn, const char *path, tu_rng *r) {
    const size_t ns[] = {1, 7, 8, 9, 15, 16, 17, 33, 64};
    int ok = 1;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t nr = 1; nr <= 9; nr += 4) {
            const size_t n = ns[ni], ss = n + 5;
            float s[9 * 69], m[9], inv[9], a0[64], a1[64], terms[64];
            int32_t pos[64], rqp[9];
            for (size_t q = 0; q < nr; q++) {
                rqp[q] = (int32_t)(100 + 10 * q);
                m[q] = (float)(3 * tu_gauss(r));
                inv[q] = (float)(0.5 + tu_uniform(r));
            }
            inv[nr / 2] = 0.0f; /* a row that saw nothing */
            m[nr / 2] = -INFINITY;
            for (size_t i = 0; i < n; i++) {
                const double u = tu_uniform(r);
                pos[i] = u < 0.2 ? -1 : (int32_t)(u * 140); /* free, or 28..139 */
                a0[i] = a1[i] = (float)tu_uniform(r);
                terms[i] = fabsf(a0[i]);
                for (size_t q = 0; q < nr; q++) {
                    const int use = inv[q] > 0.0f && pos[i] >= 0 && pos[i] <= rqp[q];
                    s[q * ss + i] = use ? (float)(m[q] + 2 * tu_gauss(r))
                                    : i % 3 == 0 ? NAN : (float)(inv[q] > 0.0f ? m[q] + 3 : 3);
                    if (use)
                        terms[i] += expf(s[q * ss + i] - m[q]) * inv[q];
                }
            }
            kvq__attn_add_ref(a0, s, ss, nr, m, inv, pos, rqp, n);
            fn(a1, s, ss, nr, m, inv, pos, rqp, n);
            for (size_t i = 0; i < n; i++)
                ok &= isfinite(a1[i]) &&
                      fabs((double)a1[i] - a0[i]) <= 2.5e-7 * terms[i] + 0x1p-23 * fabs((double)a0[i]);
        }
    TU_REPORT(ok, "attention received %s against the reference", path);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    for (int i = 1; i < argc; i++)
        mutate |= strcmp(argv[i], "--mutate") == 0;
    tu_rng r;
    tu_seed(&r, 20261201);
    const char *specs[] = {"f32", "f16", "bf16"};
    const size_t dims[] = {8, 16, 48, 64, 128, 80};
    const size_t Ps[] = {16, 32, 64};
    printf("CPU paths: avx2 %s, avx512 %s (SIMDe always)\n",
           kvq_cpu_supports(KVQ_ISA_AVX2) ? "native" : "absent",
           kvq_cpu_supports(KVQ_ISA_AVX512) ? "native" : "absent");
    check_softmax(kvq__page_softmax_avx512_simde, "avx512-simde", &r);
    check_attn_add(kvq__attn_add_avx512_simde, "avx512-simde", &r);
    check_softmax_sequence(kvq__page_softmax_ref, "scalar", &r);
    check_softmax_sequence(kvq__page_softmax_avx512_simde, "avx512-simde", &r);
    if (kvq_cpu_supports(KVQ_ISA_AVX2)) {
        check_softmax(kvq__page_softmax_avx2, "avx2", &r);
        check_attn_add(kvq__attn_add_avx2, "avx2", &r);
        check_softmax_sequence(kvq__page_softmax_avx2, "avx2", &r);
    }
    if (kvq_cpu_supports(KVQ_ISA_AVX512)) {
        check_softmax(kvq__page_softmax_avx512, "avx512", &r);
        check_attn_add(kvq__attn_add_avx512, "avx512", &r);
        check_softmax_sequence(kvq__page_softmax_avx512, "avx512", &r);
    }
    for (size_t si = 0; si < 3; si++)
        for (size_t di = 0; di < 6; di++) {
            kvq_codec_params pr = {0};
            pr.isa = KVQ_ISA_SCALAR;
            kvq_codec *c = NULL;
            if (kvq_codec_create(&c, specs[si], dims[di], &pr) != KVQ_OK) {
                TU_REPORT(0, "create %s d=%zu", specs[si], dims[di]);
                continue;
            }
            TU_REPORT(c->tiled && c->tiled(c, KVQ__ROLE_K, 16) && !c->tiled(c, KVQ__ROLE_K, 8) &&
                          !c->tiled(c, KVQ__ROLE_V, 16),
                      "%s: keys tiled for P %% 16 == 0 only, values in rows", specs[si]);
            for (size_t pi = 0; pi < 3; pi++) {
                /* AVX-512 through SIMDe: the codec's kernels as that selector sets them */
                kvq_codec s = *c;
                s.k = c->ref;
                s.k.accum = NULL;
                kvq__float_avx512_select_simde(&s, ~0u);
                check_paths(&s, &s.k, s.tqp_bytes, "avx512-simde", Ps[pi], &r);
                if (kvq_cpu_supports(KVQ_ISA_AVX2)) {
                    kvq_codec a = *c;
                    a.k = c->ref;
                    a.k.accum = NULL;
                    kvq__float_avx2_select(&a);
                    check_paths(&a, &a.k, a.tqp_bytes, "avx2", Ps[pi], &r);
                }
                if (kvq_cpu_supports(KVQ_ISA_AVX512)) {
                    kvq_codec n = *c;
                    n.k = c->ref;
                    n.k.accum = NULL;
                    kvq__float_avx2_select(&n);
                    n.k.accum = NULL;
                    kvq__float_avx512_select(&n, ~0u);
                    check_paths(&n, &n.k, n.tqp_bytes, "avx512", Ps[pi], &r);
                }
            }
            kvq_codec_free(c);
        }
    return tu_finish();
}
