/*
 * test_tq.c - tests of the TurboQuant family (tq1..tq4, tqp2..tqp4):
 * codebooks against independent numerics (Simpson integration in x, Monte
 * Carlo over uniform unit vectors, the closed form of E|x| for 1 bit), the
 * quality targets, norm preservation of the rotation, unbiased inner
 * products of tqp, AVX2 against the scalar reference on odd sizes and
 * misaligned buffers, extreme inputs, the 8-bit norm code with fit and
 * state, nc, seeds, the documented byte layout, and allocation failures.
 * Internal headers are used to reach the codebook and the kernels.
 */
#include "testutil.h"

#include "codec/tq_impl.h"

#define SEED 20240611u

static int have_avx2;

static kvq_codec *mk(const char *spec, size_t d, kvq_isa isa) {
    kvq_codec *c = NULL;
    kvq_codec_params p;
    memset(&p, 0, sizeof p);
    p.isa = isa;
    kvq_status st = kvq_codec_create(&c, spec, d, &p);
    TU_REPORT(st == KVQ_OK, "create %s d=%zu isa=%d: %s", spec, d, (int)isa, kvq_strerror(st));
    return c;
}

static const kvq__tq *tqs(const kvq_codec *c) { return (const kvq__tq *)c->state; }

static double norm2(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static double dotf(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* ---- codebooks ---- */

/* Composite Simpson of (1-x^2)^((d-3)/2) * x^k over [a, b] (d >= 3). */
static double simpson(size_t d, double a, double b, int k, double c, int nsub) {
    double h = (b - a) / nsub, s = 0.0;
    for (int i = 0; i <= nsub; i++) {
        double x = a + h * i, f;
        double y = 1.0 - x * x;
        f = y <= 0.0 ? (d == 3 ? 1.0 : 0.0) : exp(0.5 * ((double)d - 3.0) * log(y));
        if (k == 1)
            f *= x;
        else if (k == 2)
            f *= (x - c) * (x - c);
        s += f * (i == 0 || i == nsub ? 1.0 : (i & 1) ? 4.0 : 2.0);
    }
    return s * h / 3.0;
}

static void test_codebook_simpson(void) {
    static const size_t ds[] = {3, 5, 8, 16, 64, 128, 1000};
    /* the quality targets of the brief (d = 128, 64, 8) */
    static const double target[3][4] = {
        {0.3609, 0.1160, 0.0340, 0.00931}, {0.3584, 0.1145, 0.0334, 0.00913}, {0.3224, 0.0948, 0.0261, 0.00687}};
    double worst_c = 0.0, worst_t = 0.0, worst_dd = 0.0;
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        size_t d = ds[di];
        for (int b = 1; b <= 4; b++) {
            double cent[16], thr[16];
            int it = kvq__tq_lloyd_max(d, b, cent, thr);
            TU_REPORT(it >= 0, "lloyd d=%zu b=%d did not converge", d, b);
            int k = 1 << b, h = k / 2;
            double total = simpson(d, 0.0, 1.0, 0, 0, 200000), dist = 0.0;
            for (int i = 0; i < h; i++) {
                double lo = thr[h - 1 + i], hi = i + 1 < h ? thr[h + i] : 1.0;
                double m0 = simpson(d, lo, hi, 0, 0, 20000), m1 = simpson(d, lo, hi, 1, 0, 20000);
                double c = cent[h + i];
                worst_c = fmax(worst_c, fabs(c - m1 / m0) * sqrt((double)d));
                dist += simpson(d, lo, hi, 2, c, 20000) / total;
                TU_REPORT(fabs(cent[h - 1 - i] + c) < 1e-15, "symmetry d=%zu b=%d", d, b);
                if (i + 1 < h)
                    worst_t = fmax(worst_t, fabs(thr[h + i] - 0.5 * (cent[h + i] + cent[h + i + 1])));
            }
            dist *= (double)d; /* per vector: d coordinates */
            double lib = kvq__tq_codebook_distortion(d, b, cent, thr);
            worst_dd = fmax(worst_dd, fabs(dist - lib) / lib);
            int ti = d == 128 ? 0 : d == 64 ? 1 : d == 8 ? 2 : -1;
            if (ti >= 0)
                TU_REPORT(fabs(lib - target[ti][b - 1]) <= 0.005 * target[ti][b - 1],
                          "distortion d=%zu b=%d: %.6f vs target %.5f", d, b, lib, target[ti][b - 1]);
        }
    }
    printf("codebook vs Simpson: max |centroid - cell mean| * sqrt(d) = %.2e, max threshold-"
           "midpoint gap %.2e, max relative distortion gap %.2e\n",
           worst_c, worst_t, worst_dd);
    CHECK_LE(worst_c, 1e-8);
    CHECK_LE(worst_t, 1e-12);
    CHECK_LE(worst_dd, 1e-7);

    /* 1 bit: the centroid is E|x| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) in
     * closed form (the Gaussian approximation sqrt(2/(pi d)) is off by 1% at
     * d = 64 and 3% at d = 8); d = 2 and 3 included */
    for (size_t d = 2; d <= 1024; d = d < 16 ? d + 1 : d * 2) {
        double cent[2], thr[1];
        kvq__tq_lloyd_max(d, 1, cent, thr);
        double e = exp(lgamma(0.5 * d) - lgamma(0.5 * (d + 1))) / sqrt(M_PI);
        TU_REPORT(fabs(cent[1] - e) <= 1e-12, "E|x| d=%zu: %.15f vs %.15f", d, cent[1], e);
    }
    /* d = 1: levels evenly spaced on [-1, 1], including both ends */
    for (int b = 1; b <= 4; b++) {
        double cent[16], thr[16];
        kvq__tq_lloyd_max(1, b, cent, thr);
        CHECK(cent[0] == -1.0 && cent[(1 << b) - 1] == 1.0);
        CHECK(kvq__tq_codebook_distortion(1, b, cent, thr) == 0.0);
    }
}

/* Monte Carlo: coordinates of uniform random unit vectors; each centroid
 * must be the empirical mean of its cell (within 5 standard errors) and the
 * empirical distortion must match. d = 2 (arcsine density) included. */
static void test_codebook_montecarlo(void) {
    static const size_t ds[] = {2, 3, 8, 128};
    tu_rng r;
    tu_seed(&r, SEED);
    printf("codebook Monte Carlo (seed %u):", SEED);
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        size_t d = ds[di], nvec = 1000000 / d + 10000, ns = nvec * d;
        float *smp = (float *)malloc(ns * sizeof(float));
        double v[128];
        for (size_t i = 0; i < nvec; i++) {
            double s = 0.0;
            for (size_t j = 0; j < d; j++) {
                v[j] = tu_gauss(&r);
                s += v[j] * v[j];
            }
            s = 1.0 / sqrt(s);
            for (size_t j = 0; j < d; j++)
                smp[i * d + j] = (float)(v[j] * s);
        }
        for (int b = 1; b <= 4; b++) {
            double cent[16], thr[16], cnt[16] = {0}, sum[16] = {0}, sq[16] = {0}, dist = 0.0;
            int k = 1 << b;
            kvq__tq_lloyd_max(d, b, cent, thr);
            for (size_t i = 0; i < ns; i++) {
                double x = smp[i];
                int c = 0;
                while (c < k - 1 && x >= thr[c])
                    c++;
                cnt[c]++;
                sum[c] += x;
                sq[c] += x * x;
                dist += (x - cent[c]) * (x - cent[c]);
            }
            double worst = 0.0;
            for (int c = 0; c < k; c++) {
                if (cnt[c] < 30)
                    continue;
                double m = sum[c] / cnt[c], var = sq[c] / cnt[c] - m * m;
                double z = fabs(m - cent[c]) / sqrt(fmax(var, 1e-30) / cnt[c]);
                worst = fmax(worst, z);
            }
            dist = dist / (double)nvec;
            double lib = kvq__tq_codebook_distortion(d, b, cent, thr);
            TU_REPORT(worst < 5.0, "MC d=%zu b=%d: a centroid is %.1f standard errors from its cell mean",
                      d, b, worst);
            TU_REPORT(fabs(dist - lib) < 0.02 * lib, "MC distortion d=%zu b=%d: %.5f vs %.5f", d, b,
                      dist, lib);
            if (b == 3)
                printf(" d=%zu: max z %.2f, distortion %.5f (exact %.5f);", d, worst, dist, lib);
        }
        free(smp);
    }
    printf("\n");
}

/* ---- quality ---- */

static double nmse_of(kvq_codec *c, const float *x, size_t n) {
    size_t d = kvq_codec_head_dim(c), vb = kvq_codec_vector_bytes(c);
    uint8_t *e = (uint8_t *)malloc(n * vb);
    float *y = (float *)malloc(n * d * sizeof(float));
    CHECK_OK(kvq_codec_encode(c, e, n * vb, x, n));
    CHECK_OK(kvq_codec_decode(c, y, n * d, e, n * vb));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n * d; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)x[i] * x[i];
    }
    free(e);
    free(y);
    return num / den;
}

static void test_quality(void) {
    static const size_t ds[] = {128, 64, 8};
    static const double target[3][4] = {
        {0.3609, 0.1160, 0.0340, 0.00931}, {0.3584, 0.1145, 0.0334, 0.00913}, {0.3224, 0.0948, 0.0261, 0.00687}};
    const size_t n = 20000;
    tu_rng r;
    tu_seed(&r, SEED + 1);
    printf("nmse, gauss, nc=0, %zu vectors (seed %u):\n", n, SEED + 1);
    for (int di = 0; di < 3; di++) {
        size_t d = ds[di];
        float *x = (float *)malloc(n * d * sizeof(float));
        tu_fill_gauss(&r, x, n * d, 1.0f);
        printf("  d=%3zu:", d);
        for (int b = 1; b <= 4; b++) {
            char spec[32];
            snprintf(spec, sizeof spec, "tq%d:nc=0", b);
            kvq_codec *c = mk(spec, d, KVQ_ISA_AUTO);
            double e = nmse_of(c, x, n);
            printf(" tq%d %.5f (target %.5f)", b, e, target[di][b - 1]);
            TU_REPORT(fabs(e - target[di][b - 1]) <= 0.02 * target[di][b - 1],
                      "nmse %s d=%zu: %.5f vs %.5f", spec, d, e, target[di][b - 1]);
            /* and the exact expectation of the codebook */
            TU_REPORT(fabs(e - tqs(c)->distortion) <= 0.02 * tqs(c)->distortion,
                      "nmse %s d=%zu: %.5f vs codebook %.5f", spec, d, e, tqs(c)->distortion);
            kvq_codec_free(c);
        }
        printf("\n");
        free(x);
    }
}

/* ---- rotation ---- */

static void test_rotation(void) {
    static const size_t ds[] = {1, 2, 3, 5, 8, 16, 80, 96, 100, 128, 256, 1000, 1024};
    tu_rng r;
    tu_seed(&r, SEED + 2);
    double worst = 0.0, worst_rt = 0.0;
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        size_t d = ds[di];
        for (int pass = 0; pass < 2; pass++) {
            kvq_isa isa = pass == 0 ? KVQ_ISA_SCALAR : KVQ_ISA_AUTO;
            if (pass == 1 && (!have_avx2 || d % 8 != 0 || d == 1000))
                continue;
            kvq_codec *c = mk("tq2", d, isa);
            if (!c)
                continue;
            float *q = (float *)malloc(d * sizeof(float)), *out = (float *)calloc(d, sizeof(float));
            float *qp = (float *)kvq__alloc(&c->alloc, c->qp_bytes);
            for (int t = 0; t < 8; t++) {
                tu_fill_gauss(&r, q, d, t == 0 ? 1e-3f : t == 1 ? 1e3f : 1.0f);
                c->k.prep(c, qp, q);
                double nq = norm2(q, d), np = norm2(qp, d);
                worst = fmax(worst, fabs(sqrt(np / nq) - 1.0));
                /* finish applies R^T: R^T R q = q */
                memset(out, 0, d * sizeof(float));
                c->k.finish(c, out, qp);
                double err = 0.0;
                for (size_t j = 0; j < d; j++)
                    err += ((double)out[j] - q[j]) * ((double)out[j] - q[j]);
                worst_rt = fmax(worst_rt, sqrt(err / nq));
            }
            kvq__free(&c->alloc, qp);
            free(q);
            free(out);
            kvq_codec_free(c);
        }
    }
    printf("rotation: max | ||Rq||/||q|| - 1 | = %.2e, max ||R^T R q - q||/||q|| = %.2e\n", worst,
           worst_rt);
    CHECK_LE(worst, 1e-5);
    CHECK_LE(worst_rt, 1e-5);
}

/* ---- tqp: unbiased inner products ---- */

/* The mean error of <q, x_hat> (the score kernel) against <q, x>, as a
 * fraction of rms <q, x>, for two queries per vector: q = x + g/2 (g
 * Gaussian: correlated with x, where a biased estimator shows) and an
 * independent Gaussian q. tqp is unbiased over the draw of its sketch
 * matrix S, which the seed fixes: the vectors encoded with one seed share
 * S's deviation, so the iid standard error of the per-vector errors misses
 * that part (at d = 16 it is 1.6x too small). The standard error is
 * therefore that of the mean over `nseeds` seeds of the per-seed mean
 * errors (batch means: the seeds are independent draws of S and of x). */
typedef struct {
    double bias, se;
} ip_stat;

static void ip_bias(const char *spec, size_t d, size_t n, int nseeds, ip_stat *corr,
                    ip_stat *indep) {
    tu_rng r;
    tu_seed(&r, SEED + 3);
    float *x = (float *)malloc(n * d * sizeof(float));
    float *q1 = (float *)malloc(n * d * sizeof(float)), *q2 = (float *)malloc(n * d * sizeof(float));
    float *s = (float *)malloc(n * sizeof(float));
    double sq[2] = {0, 0}, bm[2] = {0, 0}, bq[2] = {0, 0};
    for (int sd = 0; sd < nseeds; sd++) {
        char full[64];
        snprintf(full, sizeof full, "%s:seed=%d", spec, 100 + sd);
        kvq_codec *c = mk(full, d, KVQ_ISA_AUTO);
        if (!c)
            break;
        size_t vb = kvq_codec_vector_bytes(c);
        uint8_t *e = (uint8_t *)malloc(n * vb);
        tu_fill_gauss(&r, x, n * d, 1.0f);
        tu_fill_gauss(&r, q1, n * d, 1.0f);
        tu_fill_gauss(&r, q2, n * d, 1.0f);
        for (size_t i = 0; i < n * d; i++)
            q1[i] = x[i] + 0.5f * q1[i];
        CHECK_OK(kvq_codec_encode(c, e, n * vb, x, n));
        for (int k = 0; k < 2; k++) {
            const float *q = k ? q2 : q1;
            double sum = 0.0;
            for (size_t i = 0; i < n; i++) {
                CHECK_OK(kvq_codec_score(c, s + i, 1, q + i * d, 1, e + i * vb, vb));
                double t = dotf(q + i * d, x + i * d, d);
                sum += s[i] - t;
                sq[k] += t * t;
            }
            bm[k] += sum / (double)n;
            bq[k] += (sum / (double)n) * (sum / (double)n);
        }
        free(e);
        kvq_codec_free(c);
    }
    free(x);
    free(q1);
    free(q2);
    free(s);
    ip_stat *out[2] = {corr, indep};
    for (int k = 0; k < 2; k++) {
        double K = nseeds, rms = sqrt(sq[k] / (K * (double)n)), mean = bm[k] / K;
        out[k]->bias = mean / rms;
        out[k]->se = sqrt(fmax(bq[k] / K - mean * mean, 0.0) * K / (K - 1.0) / K) / rms;
    }
}

static void test_tqp_unbiased(void) {
    static const char *specs[] = {"tqp2", "tqp3", "tqp4", "tqp3:nc=0", "tqp2:norm=8"};
    /* Every check below: |mean error| <= 4 standard errors. The mean of 32
     * per-seed means is close to normal, and with its standard error
     * estimated from the same 32 values a Student t with 31 degrees of
     * freedom exceeds 4 with probability 3.6e-4: an unbiased codec passes
     * all 21 checks with probability > 0.99, while a bias of 8 standard
     * errors fails with probability > 0.99. */
    const double Z = 4.0;
    const int nseeds = 32;
    const size_t n = 500;
    printf("ip bias (mean error / rms <q,x> +- standard error over %d seeds x %zu vectors):\n",
           nseeds, n);
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        for (int di = 0; di < 2; di++) {
            size_t d = di ? 96 : 128;
            ip_stat c1, c2;
            ip_bias(specs[si], d, n, nseeds, &c1, &c2);
            printf("  %-12s d=%3zu: q = x + g/2: %+.5f +- %.5f, q independent: %+.5f +- %.5f\n",
                   specs[si], d, c1.bias, c1.se, c2.bias, c2.se);
            TU_REPORT(fabs(c1.bias) <= Z * c1.se, "%s d=%zu correlated bias %.5f (se %.5f)",
                      specs[si], d, c1.bias, c1.se);
            TU_REPORT(fabs(c2.bias) <= Z * c2.se, "%s d=%zu independent bias %.5f (se %.5f)",
                      specs[si], d, c2.bias, c2.se);
        }
    }
    /* Enough samples to see a wrong sketch scale: sqrt(pi/2)/(d-1) instead
     * of sqrt(pi/2)/d multiplies the sketch term by d/(d-1), which moves the
     * mean error by E<q, r>/(d-1), r = x - x_mse. With nc=1, <x, r> =
     * ||x||^2 (1 - cos(x, x_mse)) and cos ~ sqrt(2/pi) for 1 index bit
     * (tqp2), so the shift is ~(1 - sqrt(2/pi))/(d-1) of rms <q, x>: 0.0065
     * at d = 32 (0.006 measured), where a seed's S leaves a visible bias of
     * its own, hence many seeds: 256 seeds x 500 vectors give se ~0.0005,
     * the shift ~12 standard errors, 8 beyond the 4-se bound. The check
     * also requires the resolution: 2 x 4 se below the shift. */
    {
        ip_stat c1, c2;
        ip_bias("tqp2", 32, 500, 256, &c1, &c2);
        printf("  tqp2         d= 32: q = x + g/2: %+.5f +- %.5f (256 seeds; a 1/(d-1) scale: "
               "~+0.0065)\n", c1.bias, c1.se);
        TU_REPORT(fabs(c1.bias) <= Z * c1.se && 2 * Z * c1.se <= 0.0065,
                  "tqp2 d=32 correlated bias %.5f (se %.5f)", c1.bias, c1.se);
    }
    /* the test can see bias: TurboQuant-MSE shrinks inner products */
    ip_stat bm, bi;
    ip_bias("tq2:nc=0", 128, 500, 8, &bm, &bi);
    printf("  tq2:nc=0 (biased by design): %+.4f +- %.4f\n", bm.bias, bm.se);
    CHECK_LE(bm.bias, -0.05);
}

/* ---- AVX2 against the scalar reference ---- */

static int idx_at(const kvq__tq *t, const uint8_t *v, size_t j) {
    return (int)kvq__tq_get_idx(v + t->off_idx, j, t->kb);
}

static void compare_paths(const char *spec, size_t d, tu_rng *r, size_t *idx_mis, size_t *idx_all) {
    kvq_codec *a = mk(spec, d, KVQ_ISA_SCALAR), *b = mk(spec, d, KVQ_ISA_AVX2);
    if (!a || !b) {
        kvq_codec_free(a);
        kvq_codec_free(b);
        return;
    }
    const kvq__tq *t = tqs(a);
    const size_t n = 127, vb = kvq_codec_vector_bytes(a);
    float *xbuf = (float *)malloc((n * d + 1) * sizeof(float)), *x = xbuf + 1; /* misaligned */
    uint8_t *ea = (uint8_t *)malloc(n * vb + 1), *ebuf = (uint8_t *)malloc(n * vb + 1), *eb = ebuf + 1;
    tu_fill_gauss(r, x, n * d, 1.0f);
    for (size_t j = 0; j < d; j++) /* a zero vector and a huge one among them */
        x[5 * d + j] = 0.0f;
    x[9 * d + 3] = 1e30f;
    CHECK_OK(kvq_codec_encode(a, ea, n * vb, x, n));
    CHECK_OK(kvq_codec_encode(b, eb, n * vb, x, n));
    size_t sign_mis = 0, norm_far = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *pa = ea + i * vb, *pb = eb + i * vb;
        for (size_t j = 0; j < d; j++)
            *idx_mis += idx_at(t, pa, j) != idx_at(t, pb, j);
        *idx_all += d;
        long na = t->nb == 2 ? kvq__ld16(pa) : pa[0], nbv = t->nb == 2 ? kvq__ld16(pb) : pb[0];
        norm_far += labs(na - nbv) > 1;
        if (t->sketch) {
            long ra = t->nb == 2 ? kvq__ld16(pa + t->off_rnorm) : pa[t->off_rnorm];
            long rb = t->nb == 2 ? kvq__ld16(pb + t->off_rnorm) : pb[t->off_rnorm];
            norm_far += labs(ra - rb) > 1;
            for (size_t j = 0; j < d; j++)
                sign_mis += ((pa[t->off_sign + j / 8] ^ pb[t->off_sign + j / 8]) >> (j % 8)) & 1;
        }
    }
    TU_REPORT(norm_far == 0, "%s d=%zu: %zu stored norms differ by more than 1 unit", spec, d, norm_far);
    TU_REPORT(sign_mis * 1000 <= n * d, "%s d=%zu: %zu sign bits differ", spec, d, sign_mis);

    /* decode the same bytes (misaligned source and destination) */
    memcpy(eb, ea, n * vb);
    float *ya = (float *)malloc(n * d * sizeof(float)), *ybuf = (float *)malloc((n * d + 1) * sizeof(float));
    float *yb = ybuf + 1;
    CHECK_OK(kvq_codec_decode(a, ya, n * d, ea, n * vb));
    CHECK_OK(kvq_codec_decode(b, yb, n * d, eb, n * vb));
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double nr = sqrt(norm2(ya + i * d, d)) + 1e-30, e = 0.0;
        for (size_t j = 0; j < d; j++)
            e = fmax(e, fabs((double)ya[i * d + j] - yb[i * d + j]));
        worst = fmax(worst, e / nr);
    }
    TU_REPORT(worst <= 1e-6, "%s d=%zu decode: max |avx2 - scalar| / ||x_hat|| = %.3g", spec, d, worst);

    /* score and accumulate on odd key counts, 1 to 5 queries */
    static const size_t ns[] = {1, 3, 7, 31, 33, 127};
    static const size_t nqs[] = {1, 2, 3, 4, 5};
    float *q = (float *)malloc((5 * d + 1) * sizeof(float)) + 1;
    float *w = (float *)malloc((5 * n + 1) * sizeof(float)) + 1;
    float *sa = (float *)malloc(5 * n * sizeof(float)), *sb = (float *)malloc((5 * n + 1) * sizeof(float)) + 1;
    float *oa = (float *)malloc(5 * d * sizeof(float)), *ob = (float *)malloc((5 * d + 1) * sizeof(float)) + 1;
    tu_fill_gauss(r, q, 5 * d, 1.0f);
    tu_fill_gauss(r, w, 5 * n, 0.1f);
    double wsc = 0.0, wac = 0.0;
    /* the AVX2 tq4 score runs on an int16 codebook and query (d % 32 == 0):
     * a relative error of about 1e-5 of |q||k|, bounded at 1e-4 */
    const double sc_rel = t->kb == 4 && d % 32 == 0 ? 1e-4 : 1e-5;
    for (size_t ki = 0; ki < sizeof ns / sizeof ns[0]; ki++) {
        size_t nk = ns[ki], off = n - nk; /* the last nk vectors: the buffer end is exact */
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
            const size_t nq = nqs[qi];
            CHECK_OK(kvq_codec_score(a, sa, nq * nk, q, nq, ea + off * vb, nk * vb));
            CHECK_OK(kvq_codec_score(b, sb, nq * nk, q, nq, eb + off * vb, nk * vb));
            for (size_t i = 0; i < nq; i++)
                for (size_t k = 0; k < nk; k++) {
                    double bound = sc_rel * sqrt(norm2(q + i * d, d)) *
                                       (sqrt(norm2(ya + (off + k) * d, d)) + sqrt(norm2(x + (off + k) * d, d)));
                    double e = fabs((double)sa[i * nk + k] - sb[i * nk + k]);
                    wsc = fmax(wsc, e / (bound + 1e-30));
                    /* the score is <q, x_hat> of the decoded vector */
                    double ip = dotf(q + i * d, ya + (off + k) * d, d);
                    TU_REPORT(fabs(ip - sa[i * nk + k]) <= 2.0 * bound + 1e-30,
                              "%s d=%zu score %g vs <q, decode> %g", spec, d, sa[i * nk + k], ip);
                }
            for (size_t i = 0; i < nq * d; i++)
                oa[i] = ob[i] = 0.25f;
            for (size_t i = 0; i < nq; i++)
                for (size_t k = 0; k < nk; k++) /* weights, with the huge vector zeroed */
                    if (off + k == 9)
                        w[i * nk + k] = 0.0f;
            CHECK_OK(kvq_codec_accumulate(a, oa, nq * d, w, nq, ea + off * vb, nk * vb));
            CHECK_OK(kvq_codec_accumulate(b, ob, nq * d, w, nq, eb + off * vb, nk * vb));
            for (size_t i = 0; i < nq; i++) {
                double bound = 0.0;
                for (size_t k = 0; k < nk; k++)
                    bound += fabs(w[i * nk + k]) * sqrt(norm2(ya + (off + k) * d, d));
                bound = 1e-5 * bound + 1e-6;
                for (size_t j = 0; j < d; j++) {
                    double e = fabs((double)oa[i * d + j] - ob[i * d + j]);
                    wac = fmax(wac, e / bound);
                    /* the reference against the decoded vectors */
                    double want = 0.25;
                    for (size_t k = 0; k < nk; k++)
                        want += (double)w[i * nk + k] * ya[(off + k) * d + j];
                    TU_REPORT(fabs(want - oa[i * d + j]) <= 2.0 * bound, "%s d=%zu accum %g vs %g", spec,
                              d, oa[i * d + j], want);
                }
            }
        }
    }
    TU_REPORT(wsc <= 1.0, "%s d=%zu score: error %.3g of the bound", spec, d, wsc);
    TU_REPORT(wac <= 1.0, "%s d=%zu accumulate: error %.3g of the bound", spec, d, wac);
    free(xbuf);
    free(ea);
    free(ebuf);
    free(ya);
    free(ybuf);
    free(q - 1);
    free(w - 1);
    free(sa);
    free(sb - 1);
    free(oa);
    free(ob - 1);
    kvq_codec_free(a);
    kvq_codec_free(b);
}

static void test_avx2(void) {
    if (!have_avx2) {
        printf("AVX2 not available: AVX2 comparisons skipped\n");
        return;
    }
    static const size_t ds[] = {8, 16, 24, 64, 80, 96, 128, 256};
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tqp2", "tqp3", "tqp4",
                                  "tq3:nc=0:norm=8", "tqp4:norm=8", "tq4:seed=9"};
    tu_rng r;
    tu_seed(&r, SEED + 4);
    size_t mis = 0, all = 0;
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
            compare_paths(specs[si], ds[di], &r, &mis, &all);
    printf("AVX2 vs scalar: %zu of %zu indices differ\n", mis, all);
    CHECK(mis * 1000 <= all);
}

/* ---- extremes ---- */

static void test_extremes(void) {
    static const char *specs[] = {"tq1", "tq3", "tq4", "tqp2", "tqp4", "tq3:norm=8", "tqp3:nc=0"};
    static const size_t ds[] = {1, 5, 8, 96, 128};
    tu_rng r;
    tu_seed(&r, SEED + 5);
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
            for (int pass = 0; pass < 2; pass++) {
                size_t d = ds[di];
                if (pass == 1 && !have_avx2)
                    continue;
                kvq_codec *c = mk(specs[si], d, pass ? KVQ_ISA_AUTO : KVQ_ISA_SCALAR);
                if (!c)
                    continue;
                const size_t n = 6, vb = kvq_codec_vector_bytes(c);
                float x[6 * 128], y[6 * 128], q[128], s[6], o[128];
                tu_fill_gauss(&r, x, n * d, 1.0f);
                for (size_t j = 0; j < d; j++) {
                    x[j] = 0.0f;                    /* zero */
                    x[d + j] *= 1e30f;              /* huge */
                    x[2 * d + j] *= 1e-30f;         /* tiny */
                    x[3 * d + j] = j ? 0.0f : 3e38f; /* one component near FLT_MAX */
                    x[4 * d + j] = -3e38f;          /* all near FLT_MAX */
                }
                uint8_t e[6 * 1024];
                CHECK_OK(kvq_codec_encode(c, e, sizeof e, x, n));
                CHECK_OK(kvq_codec_decode(c, y, n * d, e, n * vb));
                int fin = 1;
                for (size_t i = 0; i < n * d; i++)
                    fin &= isfinite(y[i]);
                TU_REPORT(fin, "%s d=%zu: non-finite decode", specs[si], d);
                int zero = 1;
                for (size_t j = 0; j < d; j++)
                    zero &= y[j] == 0.0f;
                TU_REPORT(zero, "%s d=%zu: zero vector does not decode to zero", specs[si], d);
                /* the huge vector keeps its direction (the stored norm saturates) */
                if (d > 1 && !tqs(c)->sketch) {
                    double cs = dotf(x + d, y + d, d) / sqrt(norm2(x + d, d) * norm2(y + d, d));
                    TU_REPORT(cs > 0.5, "%s d=%zu: huge vector direction lost (cos %.3f)", specs[si], d, cs);
                }
                tu_fill_gauss(&r, q, d, 1.0f);
                CHECK_OK(kvq_codec_score(c, s, n, q, 1, e, n * vb));
                for (size_t i = 0; i < n; i++)
                    fin &= isfinite(s[i]);
                CHECK(s[0] == 0.0f);
                float wt[6] = {1, 1e-3f, 1, 1e-3f, 1e-3f, 1};
                memset(o, 0, sizeof o);
                CHECK_OK(kvq_codec_accumulate(c, o, d, wt, 1, e, n * vb));
                for (size_t j = 0; j < d; j++)
                    fin &= isfinite(o[j]);
                TU_REPORT(fin, "%s d=%zu: non-finite score or accumulate", specs[si], d);
                kvq_codec_free(c);
            }
}

/* ---- 8-bit norm code, fit, state ---- */

static void test_norm8(void) {
    static const char *base[] = {"tq4", "tq2", "tqp3"};
    const size_t d = 128, n = 4000;
    tu_rng r;
    tu_seed(&r, SEED + 6);
    float *x = (float *)malloc(n * d * sizeof(float));
    tu_fill_gauss(&r, x, n * d, 1.0f);
    for (size_t i = 0; i < n; i++) /* norms spread over a factor of ~8 */
        for (size_t j = 0; j < d; j++)
            x[i * d + j] *= (float)(0.5 + 3.5 * (double)(i % 97) / 96.0);
    for (size_t bi = 0; bi < 3; bi++) {
        char s8[32];
        snprintf(s8, sizeof s8, "%s:norm=8", base[bi]);
        kvq_codec *c16 = mk(base[bi], d, KVQ_ISA_AUTO), *c8 = mk(s8, d, KVQ_ISA_AUTO);
        CHECK_EQ(kvq_codec_needs_fit(c8), 0);
        CHECK_EQ(kvq_codec_vector_bytes(c8) + (tqs(c8)->sketch ? 2 : 1), kvq_codec_vector_bytes(c16));
        double e16 = nmse_of(c16, x, n), e8 = nmse_of(c8, x, n);
        CHECK_OK(kvq_codec_fit(c8, x, n / 2));
        double e8f = nmse_of(c8, x, n);
        printf("norm=8 %s: nmse %.5f (default range), %.5f (fitted) vs fp16 %.5f\n", base[bi], e8,
               e8f, e16);
        CHECK_LE(e8, 1.05 * e16 + 5e-4);
        CHECK_LE(e8f, 1.01 * e16 + 1e-5);
        CHECK(kvq_codec_state_bytes(c8) > 0);
        CHECK_EQ(kvq_codec_state_bytes(c16), 0);

        /* state round trip: a fresh codec loading it encodes identically */
        size_t sz = 0;
        CHECK_OK(kvq_codec_save_state(c8, NULL, 0, &sz));
        uint8_t *blob = (uint8_t *)malloc(sz);
        CHECK_OK(kvq_codec_save_state(c8, blob, sz, &sz));
        kvq_codec *c8b = mk(s8, d, KVQ_ISA_SCALAR);
        size_t vb = kvq_codec_vector_bytes(c8);
        uint8_t *e1 = (uint8_t *)malloc(64 * vb), *e2 = (uint8_t *)malloc(64 * vb), *e3 = (uint8_t *)malloc(64 * vb);
        CHECK_OK(kvq_codec_encode(c8b, e3, 64 * vb, x, 64));
        /* bad blobs leave the handle unchanged */
        blob[sz - 5] ^= 1;
        CHECK_STATUS(kvq_codec_load_state(c8b, blob, sz), KVQ_ERR_CORRUPT);
        blob[sz - 5] ^= 1;
        uint8_t *bad = (uint8_t *)malloc(sz);
        memcpy(bad, blob, sz);
        size_t po = sz - 4 - kvq_codec_state_bytes(c8); /* payload offset */
        kvq__st32(bad + po, kvq__f32_bits(50.0f));       /* lo above hi */
        kvq__st32(bad + sz - 4, kvq_crc32c(0, bad, sz - 4));
        CHECK_STATUS(kvq_codec_load_state(c8b, bad, sz), KVQ_ERR_CORRUPT);
        kvq__st32(bad + po, kvq__f32_bits(NAN));
        kvq__st32(bad + sz - 4, kvq_crc32c(0, bad, sz - 4));
        CHECK_STATUS(kvq_codec_load_state(c8b, bad, sz), KVQ_ERR_CORRUPT);
        CHECK_STATUS(kvq_codec_load_state(c16, blob, sz), KVQ_ERR_MISMATCH);
        CHECK_OK(kvq_codec_encode(c8b, e2, 64 * vb, x, 64));
        CHECK(memcmp(e2, e3, 64 * vb) == 0);
        CHECK_OK(kvq_codec_load_state(c8b, blob, sz));
        CHECK_OK(kvq_codec_encode(c8, e1, 64 * vb, x, 64));
        CHECK_OK(kvq_codec_encode(c8b, e2, 64 * vb, x, 64));
        CHECK(memcmp(e1, e2, 64 * vb) == 0);
        /* fp16 codecs: an empty state saves and loads */
        CHECK_OK(kvq_codec_save_state(c16, NULL, 0, &sz));
        uint8_t blob16[256];
        CHECK_OK(kvq_codec_save_state(c16, blob16, sizeof blob16, &sz));
        CHECK_OK(kvq_codec_load_state(c16, blob16, sz));
        free(blob);
        free(bad);
        free(e1);
        free(e2);
        free(e3);
        kvq_codec_free(c8b);
        kvq_codec_free(c16);
        kvq_codec_free(c8);
    }
    /* out-of-range norms clamp: huge to the top code, tiny to 0 */
    kvq_codec *c = mk("tq2:norm=8", 8, KVQ_ISA_AUTO);
    float v[16] = {1e20f, 0, 0, 0, 0, 0, 0, 0, 1e-20f, 0, 0, 0, 0, 0, 0, 0};
    uint8_t e[8];
    CHECK_OK(kvq_codec_encode(c, e, sizeof e, v, 2));
    CHECK_EQ(e[0], 255);
    CHECK_EQ(e[kvq_codec_vector_bytes(c)], 0);
    kvq_codec_free(c);
    free(x);
}

/* ---- nc ---- */

static void test_nc(void) {
    const size_t d = 128, n = 2000;
    tu_rng r;
    tu_seed(&r, SEED + 7);
    float *x = (float *)malloc(n * d * sizeof(float)), *y = (float *)malloc(n * d * sizeof(float));
    tu_fill_gauss(&r, x, n * d, 1.0f);
    for (int b = 1; b <= 4; b++) {
        char s1[16], s0[16];
        snprintf(s1, sizeof s1, "tq%d", b);
        snprintf(s0, sizeof s0, "tq%d:nc=0", b);
        kvq_codec *c1 = mk(s1, d, KVQ_ISA_AUTO), *c0 = mk(s0, d, KVQ_ISA_AUTO);
        size_t vb = kvq_codec_vector_bytes(c1);
        uint8_t *e = (uint8_t *)malloc(n * vb);
        /* nc=1: the decoded vector has the input's norm (up to fp16) */
        CHECK_OK(kvq_codec_encode(c1, e, n * vb, x, n));
        CHECK_OK(kvq_codec_decode(c1, y, n * d, e, n * vb));
        double worst = 0.0, ratio0 = 0.0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs(sqrt(norm2(y + i * d, d) / norm2(x + i * d, d)) - 1.0));
        TU_REPORT(worst <= 1e-3, "%s: decoded norm off by %.2e", s1, worst);
        /* nc=0: E||x_hat||^2 / ||x||^2 = 1 - distortion (the centroid condition) */
        CHECK_OK(kvq_codec_encode(c0, e, n * vb, x, n));
        CHECK_OK(kvq_codec_decode(c0, y, n * d, e, n * vb));
        for (size_t i = 0; i < n; i++)
            ratio0 += norm2(y + i * d, d) / norm2(x + i * d, d) / (double)n;
        double want = 1.0 - tqs(c0)->distortion;
        TU_REPORT(fabs(ratio0 - want) <= 0.01, "%s: ||x_hat||^2/||x||^2 = %.4f, want %.4f", s0, ratio0, want);
        /* restoring the norm is not the MSE-optimal rescale: nc=1 costs MSE
         * at 1 bit (~2 - 2 sqrt(1 - D) vs D) and gains a little from 3 bits */
        double e1 = nmse_of(c1, x, n), e0 = nmse_of(c0, x, n);
        printf("nc: tq%d nmse nc=1 %.5f, nc=0 %.5f\n", b, e1, e0);
        if (b == 1)
            CHECK(e1 > e0);
        if (b >= 3)
            CHECK_LE(e1, 1.01 * e0);
        free(e);
        kvq_codec_free(c1);
        kvq_codec_free(c0);
    }
    free(x);
    free(y);
}

/* ---- seeds and specs ---- */

static void test_seed(void) {
    static const size_t ds[] = {128, 96};
    tu_rng r;
    tu_seed(&r, SEED + 8);
    for (int di = 0; di < 2; di++) {
        size_t d = ds[di], n = 64;
        float *x = (float *)malloc(n * d * sizeof(float));
        tu_fill_gauss(&r, x, n * d, 1.0f);
        kvq_codec *a = mk("tqp3:seed=1", d, KVQ_ISA_AUTO), *b = mk("tqp3:seed=2", d, KVQ_ISA_AUTO);
        kvq_codec *a2 = mk("tqp3:seed=1", d, KVQ_ISA_SCALAR);
        size_t vb = kvq_codec_vector_bytes(a);
        uint8_t *ea = (uint8_t *)malloc(n * vb), *eb = (uint8_t *)malloc(n * vb), *ec = (uint8_t *)malloc(n * vb);
        CHECK_OK(kvq_codec_encode(a, ea, n * vb, x, n));
        CHECK_OK(kvq_codec_encode(b, eb, n * vb, x, n));
        CHECK_OK(kvq_codec_encode(a2, ec, n * vb, x, n));
        size_t diff = 0;
        for (size_t i = 0; i < n; i++)
            diff += memcmp(ea + i * vb, eb + i * vb, vb) != 0;
        CHECK_EQ(diff, n);
        CHECK(memcmp(ea, ec, n * vb) == 0);
        /* the rotation itself differs */
        float *qa = (float *)kvq__alloc(&a->alloc, a->qp_bytes), *qb = (float *)kvq__alloc(&b->alloc, b->qp_bytes);
        a->k.prep(a, qa, x);
        b->k.prep(b, qb, x);
        CHECK(memcmp(qa, qb, d * sizeof(float)) != 0);
        kvq__free(&a->alloc, qa);
        kvq__free(&b->alloc, qb);
        free(ea);
        free(eb);
        free(ec);
        free(x);
        kvq_codec_free(a);
        kvq_codec_free(b);
        kvq_codec_free(a2);
    }
    kvq_codec *c = mk("tq3:seed=7042673:nc=1:norm=16", 64, KVQ_ISA_AUTO);
    CHECK(strcmp(kvq_codec_spec(c), "tq3") == 0);
    kvq_codec_free(c);
    c = mk("tqp4:nc=0:norm=8:seed=5", 64, KVQ_ISA_AUTO);
    CHECK(strcmp(kvq_codec_spec(c), "tqp4:nc=0:norm=8:seed=5") == 0);
    kvq_codec_free(c);
}

/* ---- byte layout ---- */

static void test_layout(void) {
    struct {
        const char *spec;
        size_t d, bytes;
        double bpv;
    } cases[] = {
        {"tq3", 128, 2 + 48, 3.125},         {"tq4", 128, 2 + 64, 4.125},
        {"tq1", 128, 2 + 16, 1.125},         {"tq2", 128, 2 + 32, 2.125},
        {"tqp3", 128, 2 + 32 + 2 + 16, 3.25}, {"tqp4", 128, 2 + 48 + 2 + 16, 4.25},
        {"tqp2", 128, 2 + 16 + 2 + 16, 2.25}, {"tq3:norm=8", 128, 1 + 48, 3.0625},
        {"tq3", 5, 2 + 2, 6.4},              {"tq1", 1, 3, 24.0},
        {"tqp4:norm=8", 100, 1 + 38 + 1 + 13, 4.24},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvq_codec *c = mk(cases[i].spec, cases[i].d, KVQ_ISA_AUTO);
        CHECK_EQ(kvq_codec_vector_bytes(c), cases[i].bytes);
        CHECK_NEAR(kvq_codec_bits_per_value(c), cases[i].bpv, 1e-12);
        kvq_codec_free(c);
    }
    /* decode by hand from the documented layout and compare */
    static const char *specs[] = {"tq1", "tq2", "tq3", "tq4", "tqp2", "tqp3", "tqp4", "tq3:norm=8",
                                  "tqp3:norm=8"};
    static const size_t ds[] = {5, 8, 96, 128};
    tu_rng r;
    tu_seed(&r, SEED + 9);
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++)
        for (size_t di = 0; di < 4; di++) {
            size_t d = ds[di];
            kvq_codec *c = mk(specs[si], d, KVQ_ISA_SCALAR);
            const kvq__tq *t = tqs(c);
            int kb = t->sketch ? c->bits - 1 : c->bits, n8 = c->norm_bits == 8;
            size_t nb = n8 ? 1 : 2, ib = (d * (size_t)kb + 7) / 8;
            float x[128], y[128], acc[256], out[128];
            uint8_t e[256];
            tu_fill_gauss(&r, x, d, 1.0f);
            CHECK_OK(kvq_codec_encode(c, e, sizeof e, x, 1));
            CHECK_OK(kvq_codec_decode(c, y, d, e, kvq_codec_vector_bytes(c)));
            float scale = n8 ? t->ns.tab[e[0]] : kvq_f16_to_f32((uint16_t)(e[0] | e[1] << 8));
            for (size_t j = 0; j < d; j++) {
                unsigned bit = (unsigned)(j * (size_t)kb), v = 0;
                for (int k = 0; k < kb; k++, bit++)
                    v |= (unsigned)((e[nb + bit / 8] >> (bit % 8)) & 1) << k;
                acc[j] = scale * t->cent[v];
            }
            /* unused high bits of the last index byte are zero */
            if ((d * (size_t)kb) % 8)
                CHECK_EQ(e[nb + ib - 1] >> ((d * (size_t)kb) % 8), 0);
            if (t->sketch) {
                const uint8_t *p = e + nb + ib;
                float rn = n8 ? t->nr.tab[p[0]] : kvq_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
                for (size_t j = 0; j < d; j++)
                    acc[d + j] = ((p[nb + j / 8] >> (j % 8)) & 1) ? rn : -rn;
                CHECK_EQ(kvq_codec_vector_bytes(c), nb + ib + nb + (d + 7) / 8);
            } else {
                CHECK_EQ(kvq_codec_vector_bytes(c), nb + ib);
            }
            memset(out, 0, sizeof out);
            c->ref.finish(c, out, acc); /* R^T (acc_rot + sqrt(pi/2)/d S^T acc_sketch) */
            double err = 0.0;
            for (size_t j = 0; j < d; j++)
                err = fmax(err, fabs((double)out[j] - y[j]));
            TU_REPORT(err <= 1e-5 * sqrt(norm2(y, d)), "%s d=%zu: layout decode differs by %.3g",
                      specs[si], d, err);
            kvq_codec_free(c);
        }
}

/* ---- options and allocation failures ---- */

static void test_errors(void) {
    static const char *bad[] = {"tq5", "tq0", "tqp1", "tqp5", "tq3:nc=2", "tq3:norm=12", "tq3:g=4",
                                "tq3:seed=-1", "tqp3:x=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvq_codec *c = (kvq_codec *)1;
        kvq_status st = kvq_codec_create(&c, bad[i], 64, NULL);
        TU_REPORT(st != KVQ_OK && c == NULL, "spec %s accepted", bad[i]);
    }
    static const char *specs[] = {"tq3", "tqp3:norm=8"};
    static const size_t ds[] = {96, 128};
    for (int si = 0; si < 2; si++)
        for (int di = 0; di < 2; di++) {
            int ok = 0;
            for (long at = 1; at < 64 && !ok; at++) {
                tu_failalloc fa;
                kvq_allocator al = tu_failalloc_make(&fa, at);
                kvq_codec_params p;
                memset(&p, 0, sizeof p);
                p.allocator = &al;
                kvq_codec *c = NULL;
                kvq_status st = kvq_codec_create(&c, specs[si], ds[di], &p);
                if (st == KVQ_OK) {
                    ok = 1;
                    kvq_codec_free(c);
                } else {
                    TU_REPORT(st == KVQ_ERR_NOMEM && c == NULL, "%s: failure %ld gave %s", specs[si], at,
                              kvq_strerror(st));
                }
                TU_REPORT(fa.live_blocks == 0, "%s: %ld blocks leaked (fail at %ld)", specs[si],
                          fa.live_blocks, at);
            }
            CHECK(ok);
        }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    have_avx2 = kvq_cpu_supports(KVQ_ISA_AVX2);
    test_codebook_simpson();
    test_codebook_montecarlo();
    test_quality();
    test_rotation();
    test_tqp_unbiased();
    test_avx2();
    test_extremes();
    test_norm8();
    test_nc();
    test_seed();
    test_layout();
    test_errors();
    return tu_finish();
}
