/*
 * tq_rotate.c - the random rotation and the QJL sketch matrix of the
 * TurboQuant family, built from the codec seed, and the scalar transforms
 * that apply them.
 *
 * Rotation R (norm-preserving to float precision for every d in 1..1024):
 * - d a power of two: R = H D / sqrt(d), D = diag of random signs (sign j is
 *   the top bit of the j-th kvq__rng_next draw after seeding with the codec
 *   seed, 1 = negative), H the Walsh-Hadamard matrix; applied with an O(d
 *   log d) fast transform.
 * - other d: a Haar-random orthogonal matrix. A d x d Gaussian matrix A
 *   (row-major, kvq__rng_gauss draws from the codec seed) is factored A = QR
 *   by Householder reflections in double, columns of Q flipped so that
 *   R_ii > 0, and M = Q^T is stored as float; y = M x.
 * Sketch S (tqp): d x d, row-major, N(0, 1) entries drawn with kvq__rng_gauss
 * from KVQ__TQ_SKETCH_SEED(seed).
 */
#include "tq_impl.h"

/* sum a[i] * b[i], i < m, in four interleaved partial sums (a fixed order:
 * the result is deterministic; one chain would be add-latency bound). */
static double kvq__tq_ddot(const double *a, const double *b, size_t m) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= m; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < m; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* col[0..m) -= 2 (v . col) v: one Householder reflection (v unit). */
static void kvq__tq_reflect(const double *v, double *col, size_t m) {
    double s = 2.0 * kvq__tq_ddot(v, col, m);
    for (size_t i = 0; i < m; i++)
        col[i] -= s * v[i];
}

#define KVQ__TQ_QR_BLOCK 16 /* columns per block: a block stays in L2 */

/* Householder QR of the column-major n x n matrix w (destroyed); writes
 * M = Q^T (row i of M = column i of Q, with R_ii > 0) to rot. Each column
 * receives the reflections in the textbook order; the loops run over blocks
 * of columns so that the reflectors stream through cache once per block. */
static kvq_status kvq__tq_haar(const kvq_allocator *al, double *w, size_t n, float *rot) {
    double *q = (double *)kvq__alloc(al, n * n * sizeof(double));
    double *rsign = (double *)kvq__alloc(al, n * sizeof(double));
    if (!q || !rsign) {
        kvq__free(al, q);
        kvq__free(al, rsign);
        return KVQ_ERR_NOMEM;
    }
    /* factor (left-looking): column k of w below the diagonal becomes the
     * unit reflector v_k */
    for (size_t j0 = 0; j0 < n; j0 += KVQ__TQ_QR_BLOCK) {
        size_t j1 = KVQ__MIN(j0 + KVQ__TQ_QR_BLOCK, n);
        for (size_t k = 0; k < j0; k++)
            for (size_t j = j0; j < j1; j++)
                kvq__tq_reflect(w + k * n + k, w + j * n + k, n - k);
        for (size_t k = j0; k < j1; k++) {
            double *x = w + k * n + k;
            size_t m = n - k;
            double nrm = sqrt(kvq__tq_ddot(x, x, m));
            double alpha = x[0] >= 0.0 ? -nrm : nrm; /* R_kk */
            x[0] -= alpha;
            double vn = kvq__tq_ddot(x, x, m);
            if (vn > 0.0) {
                vn = 1.0 / sqrt(vn);
                for (size_t i = 0; i < m; i++)
                    x[i] *= vn;
            }
            rsign[k] = alpha < 0.0 ? -1.0 : 1.0; /* alpha == 0 only for a zero column */
            for (size_t j = k + 1; j < j1; j++)
                kvq__tq_reflect(x, w + j * n + k, m);
        }
    }
    /* Q = H_0 H_1 ... H_{n-1} I: column j gets H_k for k = j, j-1, ..., 0 */
    memset(q, 0, n * n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        q[i * n + i] = 1.0;
    for (size_t j0 = 0; j0 < n; j0 += KVQ__TQ_QR_BLOCK) {
        size_t j1 = KVQ__MIN(j0 + KVQ__TQ_QR_BLOCK, n);
        for (size_t k = j1; k-- > 0;)
            for (size_t j = KVQ__MAX(j0, k); j < j1; j++)
                kvq__tq_reflect(w + k * n + k, q + j * n + k, n - k);
    }
    for (size_t i = 0; i < n; i++) /* column i of Q (contiguous) times sign(R_ii) */
        for (size_t j = 0; j < n; j++)
            rot[i * n + j] = (float)(q[i * n + j] * rsign[i]);
    kvq__free(al, q);
    kvq__free(al, rsign);
    return KVQ_OK;
}

kvq_status kvq__tq_rotation_init(const kvq_allocator *al, kvq__tq *t, size_t d, uint64_t seed) {
    kvq__rng r;
    kvq__rng_seed(&r, seed);
    if (t->pow2) {
        t->sflip = (uint32_t *)kvq__alloc(al, d * sizeof(uint32_t));
        if (!t->sflip)
            return KVQ_ERR_NOMEM;
        for (size_t j = 0; j < d; j++)
            t->sflip[j] = (kvq__rng_next(&r) >> 63) ? 0x80000000u : 0u;
    } else {
        t->rot = (float *)kvq__alloc(al, d * d * sizeof(float));
        double *w = (double *)kvq__alloc(al, d * d * sizeof(double));
        if (!t->rot || !w) {
            kvq__free(al, w);
            return KVQ_ERR_NOMEM;
        }
        for (size_t i = 0; i < d; i++) /* A[i][j] row-major draws, w column-major */
            for (size_t j = 0; j < d; j++)
                w[j * d + i] = kvq__rng_gauss(&r);
        kvq_status st = kvq__tq_haar(al, w, d, t->rot);
        kvq__free(al, w);
        if (st != KVQ_OK)
            return st;
    }
    if (t->sketch) {
        t->skm = (float *)kvq__alloc(al, d * d * sizeof(float));
        if (!t->skm)
            return KVQ_ERR_NOMEM;
        kvq__rng_seed(&r, KVQ__TQ_SKETCH_SEED(seed));
        for (size_t i = 0; i < d * d; i++)
            t->skm[i] = (float)kvq__rng_gauss(&r);
    }
    return KVQ_OK;
}

void kvq__tq_fwht(float *x, size_t d) {
    for (size_t h = 1; h < d; h *= 2)
        for (size_t i = 0; i < d; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

void kvq__tq_matvec(const float *m, size_t d, float *y, const float *x) {
    for (size_t i = 0; i < d; i++) {
        const float *row = m + i * d;
        float s[8] = {0};
        for (size_t j = 0; j < d; j++) /* fused: the SIMD path's FMA, bit for bit */
            s[j & 7] = fmaf(row[j], x[j], s[j & 7]);
        y[i] = kvq__tq_reduce8(s);
    }
}

void kvq__tq_matvec_t(const float *m, size_t d, float *y, const float *z) {
    for (size_t j = 0; j < d; j++)
        y[j] = 0.0f;
    for (size_t i = 0; i < d; i++) {
        const float *row = m + i * d;
        float zi = z[i];
        for (size_t j = 0; j < d; j++)
            y[j] += zi * row[j];
    }
}

static inline float kvq__tq_flip(float v, uint32_t f) { return kvq__bits_f32(kvq__f32_bits(v) ^ f); }

void kvq__tq_rotate(const kvq__tq *t, size_t d, float *y, const float *x) {
    if (!t->pow2) {
        kvq__tq_matvec(t->rot, d, y, x);
        return;
    }
    for (size_t j = 0; j < d; j++)
        y[j] = kvq__tq_flip(x[j], t->sflip[j]);
    kvq__tq_fwht(y, d);
    for (size_t j = 0; j < d; j++)
        y[j] *= t->rs;
}

void kvq__tq_unrotate_add(const kvq__tq *t, size_t d, float *out, float *z) {
    if (!t->pow2) {
        float tmp[KVQ__MAX_HEAD_DIM];
        kvq__tq_matvec_t(t->rot, d, tmp, z);
        for (size_t j = 0; j < d; j++)
            out[j] += tmp[j];
        return;
    }
    kvq__tq_fwht(z, d);
    for (size_t j = 0; j < d; j++)
        out[j] += kvq__tq_flip(z[j] * t->rs, t->sflip[j]);
}
