/*
 * tq_codebook.c - Lloyd-Max codebooks for TurboQuant: the optimal scalar
 * quantizer with 2^b levels for one coordinate x of a uniform random unit
 * vector in R^d, whose density is f(x) ~ (1 - x^2)^((d-3)/2) on [-1, 1]
 * (exact, not the Gaussian approximation).
 *
 * With x = sin(t) the mass of [a, b] is the integral of cos^(d-2)(t) over
 * [asin a, asin b], computed with I_n = cos^(n-1) sin / n + (n-1)/n I_(n-2)
 * (the recurrence only shrinks earlier rounding errors); the first moment
 * has the closed form [(1-a^2)^((d-1)/2) - (1-b^2)^((d-1)/2)] / (d-1).
 * The density is symmetric, so only the positive half is iterated: cells
 * [0, tau_1], ..., [tau_{H-1}, 1] with H = 2^(b-1); 0 is always a threshold.
 * Everything is double and deterministic; each codec computes its own
 * codebook at creation (no shared cache: the library keeps no global state).
 */
#include "tq_impl.h"

#define KVQ__TQ_PI_2 1.57079632679489661923

/* int_0^th cos^n(t) dt for th in [0, pi/2]. */
static double kvq__tq_cos_int(int n, double th) {
    double s = sin(th), co = cos(th), c2 = co * co;
    double acc, cp; /* cp = cos^(k-1) at step k */
    int k;
    if (n % 2 == 0) {
        acc = th;
        k = 2;
        cp = co;
    } else {
        acc = s;
        k = 3;
        cp = c2;
    }
    for (; k <= n; k += 2) {
        acc = cp * s / k + (double)(k - 1) / k * acc;
        cp *= c2;
    }
    return acc;
}

/* Unnormalized mass of [0, x], 0 <= x <= 1. */
static double kvq__tq_mass0(int n, double x) {
    return kvq__tq_cos_int(n, x >= 1.0 ? KVQ__TQ_PI_2 : asin(x));
}

/* log(1 - x^2), -inf at x = 1. */
static double kvq__tq_log1mx2(double x) { return x >= 1.0 ? -INFINITY : log1p(-x * x); }

/* Unnormalized first moment of [a, b], 0 <= a <= b <= 1 (d >= 2). */
static double kvq__tq_moment(size_t d, double a, double b) {
    double p = 0.5 * (double)(d - 1);
    double la = kvq__tq_log1mx2(a), lb = kvq__tq_log1mx2(b);
    /* (1-a^2)^p - (1-b^2)^p, written to avoid cancellation */
    return exp(p * la) * -expm1(p * (lb - la)) / (double)(d - 1);
}

/* Fills the positive-half thresholds tau[0..H] (tau[0] = 0, tau[H] = 1)
 * with equal-mass cells: the starting point of Lloyd's iteration. */
static void kvq__tq_equal_mass(int n, int h, double *tau) {
    double total = kvq__tq_cos_int(n, KVQ__TQ_PI_2);
    tau[0] = 0.0;
    tau[h] = 1.0;
    for (int i = 1; i < h; i++) {
        double want = total * i / h, lo = 0.0, hi = KVQ__TQ_PI_2;
        for (int it = 0; it < 64; it++) {
            double mid = 0.5 * (lo + hi);
            if (kvq__tq_cos_int(n, mid) < want)
                lo = mid;
            else
                hi = mid;
        }
        tau[i] = sin(0.5 * (lo + hi));
    }
}

int kvq__tq_lloyd_max(size_t d, int bits, double *cent, double *thr) {
    const int k = 1 << bits, h = k / 2;
    if (d == 1) { /* u = +-1 exactly: evenly spaced levels that include both */
        for (int i = 0; i < k; i++)
            cent[i] = -1.0 + 2.0 * i / (k - 1);
        for (int i = 0; i + 1 < k; i++)
            thr[i] = 0.5 * (cent[i] + cent[i + 1]);
        thr[h - 1] = 0.0;
        return 0;
    }
    const int n = (int)d - 2;
    double tau[9], jv[9], m[8];
    kvq__tq_equal_mass(n, h, tau);
    jv[0] = 0.0;
    jv[h] = kvq__tq_cos_int(n, KVQ__TQ_PI_2);
    int iters = -1;
    for (int it = 1; it <= 100000; it++) {
        for (int i = 1; i < h; i++)
            jv[i] = kvq__tq_mass0(n, tau[i]);
        double change = 0.0;
        for (int i = 0; i < h; i++) {
            double mass = jv[i + 1] - jv[i];
            double mi = mass > 0.0 ? kvq__tq_moment(d, tau[i], tau[i + 1]) / mass
                                   : 0.5 * (tau[i] + tau[i + 1]);
            if (it > 1)
                change = fmax(change, fabs(mi - m[i]));
            m[i] = mi;
        }
        for (int i = 1; i < h; i++)
            tau[i] = 0.5 * (m[i - 1] + m[i]);
        if (it > 1 && change < 1e-14) {
            iters = it;
            break;
        }
    }
    for (int i = 0; i < h; i++) {
        cent[h + i] = m[i];
        cent[h - 1 - i] = -m[i];
    }
    thr[h - 1] = 0.0;
    for (int i = 1; i < h; i++) {
        thr[h - 1 + i] = tau[i];
        thr[h - 1 - i] = -tau[i];
    }
    return iters;
}

double kvq__tq_codebook_distortion(size_t d, int bits, const double *cent, const double *thr) {
    const int k = 1 << bits, h = k / 2;
    if (d == 1)
        return (1.0 - cent[k - 1]) * (1.0 - cent[k - 1]);
    const int n = (int)d - 2;
    double total = kvq__tq_cos_int(n, KVQ__TQ_PI_2);
    /* positive half, cells [thr[h-1+i], thr[h+i]] with centroid cent[h+i] */
    double sum = 0.0;
    for (int i = 0; i < h; i++) {
        double a = thr[h - 1 + i], b = i + 1 < h ? thr[h + i] : 1.0, c = cent[h + i];
        double m0 = (kvq__tq_mass0(n, b) - kvq__tq_mass0(n, a)) / total;
        double m1 = kvq__tq_moment(d, a, b) / total;
        sum += c * c * m0 - 2.0 * c * m1;
    }
    /* E[x^2] = 1/d; both halves contribute equally */
    return (double)d * (1.0 / d + sum);
}
