/*
 * test_cache.c - the cache: fused attention over encoded pages against
 * double-precision references (the cache's own decoded K/V, pre-RoPE keys
 * rotated, within the kernels' rounding; the exact K/V within the codecs'
 * theoretical error, which attention ignoring the keys fails), GQA and
 * MQA, recent window, pre-RoPE and centred keys, channel layout, precision
 * switching, eviction invariants,
 * byte accounting through a counting allocator, bad input and allocation
 * failures leaving the cache unchanged, threads.
 */
#include "testutil.h"

#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#define KVQ__MIN_T(a, b) ((a) < (b) ? (a) : (b))

typedef struct {
    size_t L, H, QH, d, n;
    float *k, *v; /* [L][n][H][d] post-RoPE */
    float *kpre;  /* [L][n][H][d] pre-RoPE */
    int32_t *pos; /* [n] */
} seqdata;

static void rope(float *x, size_t d, int32_t pos, double theta) {
    for (size_t i = 0; i < d / 2; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)d);
        float val = (float)pos * freq, fcr = cosf(val), fci = sinf(val);
        float v0 = x[2 * i], v1 = x[2 * i + 1];
        x[2 * i] = v0 * fcr - v1 * fci;
        x[2 * i + 1] = v0 * fci + v1 * fcr;
    }
}

static void make_seq(seqdata *s, size_t L, size_t H, size_t QH, size_t d, size_t n, tu_rng *r) {
    s->L = L, s->H = H, s->QH = QH, s->d = d, s->n = n;
    size_t m = L * n * H * d;
    s->k = malloc(m * sizeof(float));
    s->kpre = malloc(m * sizeof(float));
    s->v = malloc(m * sizeof(float));
    s->pos = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        s->pos[i] = (int32_t)(i * 2 + 3); /* gaps, to exercise positions */
    for (size_t i = 0; i < m; i++) {
        size_t c = i % d;
        s->kpre[i] = (float)tu_gauss(r) + (c == 1 ? 3.0f : 0.0f);
        s->v[i] = (float)tu_gauss(r);
    }
    memcpy(s->k, s->kpre, m * sizeof(float));
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < n; t++)
            for (size_t h = 0; h < H; h++)
                rope(s->k + ((l * n + t) * H + h) * d, d, s->pos[t], 10000.0);
}

static void free_seq(seqdata *s) {
    free(s->k);
    free(s->kpre);
    free(s->v);
    free(s->pos);
}

static kvq_cache *make_cache(kvq_cache_config *cfg) {
    kvq_cache *c = NULL;
    char msg[200] = "";
    cfg->err_msg = msg;
    cfg->err_msg_size = sizeof msg;
    kvq_status st = kvq_cache_create(&c, cfg);
    TU_REPORT(st == KVQ_OK, "cache create (%s/%s): %s [%s]", cfg->k_codec, cfg->v_codec,
              kvq_strerror(st), msg);
    cfg->err_msg = NULL;
    cfg->err_msg_size = 0;
    return c;
}

static void fill_cache(kvq_cache *c, const seqdata *s, int prerope, size_t chunk) {
    size_t HD = s->H * s->d;
    for (size_t l = 0; l < s->L; l++)
        for (size_t t = 0; t < s->n; t += chunk) {
            size_t m = KVQ__MIN_T(chunk, s->n - t);
            const float *k = (prerope ? s->kpre : s->k) + (l * s->n + t) * HD;
            CHECK_OK(kvq_cache_append(c, l, k, s->v + (l * s->n + t) * HD, s->pos + t, m));
        }
}

/* ---- what attention may differ by, from the codecs' theory ----
 *
 * check_attention compares the cache's attention with two references.
 *
 * (a) Attention in double over the cache's own decoded K/V (get_kv; pre-RoPE
 *     keys rotated here at their positions): the fused kernels must match it
 *     up to their own arithmetic.
 *     - Float rounding: the score of key j may be off by delta_j (logits) =
 *       lambda sqrt(n) u |q||k| (probabilistic bound of Higham & Mary 2019,
 *       lambda = 8, n = 4d roundings on the longest path: the query's
 *       rotation, the key's reconstruction, the dot, a tqp sketch; it fails
 *       with probability < 2n e^-32 per score; |k| counts a minimum term 2x)
 *       plus the float RoPE angle (pos * freq in float: 4u pos). Then every
 *       weight is within exp(+-2 max delta)(1 +- eta) of the reference's
 *       (eta: the exp polynomial's 4e-7 and the float sum of the weights,
 *       gamma_{n+64}), so the output moves by at most eps_p sum_j p_j
 *       |v_j - o| (the weights sum to 1 either way), plus the float
 *       accumulation of the values, 2 lambda u sqrt(n + 4d) sum_j p_j |v_j|.
 *     - The SIMD paths that quantize the query (int codecs: int8 codes per
 *       block of 32 values, step = block absmax / 127; tq4: int16 query,
 *       step max|q| / 8191, and int16 codebook, |error| <= 1/16382 of the
 *       largest centroid) add to each encoded key's score a rounding error
 *       of variance sum_t step^2/12 k_t^2 (independent uniform roundings);
 *       the output error then has E|.|^2 = sum_j p_j^2 var_j |v_j - o|^2,
 *       bounded by 3x its root (>= 8 independent components exceed 3x
 *       their rms with probability < 1e-8).
 * (b) Attention in double over the exact K/V: the codecs' own error. To
 *     first order, with independent errors e_j of the values and d_j =
 *     <q, e_j^k>/sqrt(d) of the scores, E|o' - o|^2 = sum_j p_j^2 (E|e_j^v|^2
 *     + (exp(E d_j^2) - 1) |v_j - o|^2) (the weights move by the lognormal
 *     factor exp(d_j) / E exp(d)). E|e|^2 and E d^2 come from each codec's
 *     theory on the vector at hand (codec_err); tokens still staged are f16.
 *     The bound is 2x the root of that expectation over the query heads
 *     (the realised error of >= 8 independent components exceeds 2x its rms
 *     with probability < 1e-4; the factor also covers second-order terms),
 *     plus bound (a). Attention that ignores the keys (uniform weights over
 *     the visible tokens) must fail it, so a broken key path cannot pass. */
#define ATT_LAMBDA 8.0
#define ATT_U 0x1p-24

typedef struct {
    const char *k[8], *v[8]; /* codec spec of each KV head's keys and values */
    int kchan;               /* channel-layout key bits (0: token layout) */
    size_t page, recent;     /* page_tokens, recent_window */
    size_t staged;           /* newest tokens still in f16 staging at the first attend */
    int prerope;
    double theta;
    const float *center; /* [L][H][d] or NULL */
    int simd;            /* the AVX2 kernels run (query codes on the int and tq4 paths) */
    int keys_matter;     /* the codecs' bound (b) is below the error of uniform weights */
} att_model;

static void model_from_cfg(att_model *m, const kvq_cache_config *cfg) {
    memset(m, 0, sizeof *m);
    for (size_t h = 0; h < 8; h++) {
        m->k[h] = cfg->k_codec;
        m->v[h] = cfg->v_codec;
    }
    if (cfg->k_layout == KVQ_LAYOUT_CHANNEL)
        m->kchan = atoi(cfg->k_codec + 3); /* "int<b>" */
    m->page = cfg->page_tokens ? cfg->page_tokens : 16;
    m->recent = cfg->recent_window;
    m->prerope = cfg->k_prerope;
    m->theta = cfg->rope_theta;
    m->center = cfg->k_center ? cfg->k_center_values : NULL;
    m->simd = cfg->isa != KVQ_ISA_SCALAR && kvq_cpu_supports(KVQ_ISA_AVX2);
    m->keys_matter = 1;
}

/* RoPE in double at position pos (sign -1: the inverse rotation). */
static void rope_d(double *x, size_t d, int32_t pos, double theta, int sign) {
    for (size_t i = 0; i < d / 2; i++) {
        double a = sign * (double)pos * pow(theta, -(double)(2 * i) / (double)d);
        double c = cos(a), sn = sin(a), v0 = x[2 * i], v1 = x[2 * i + 1];
        x[2 * i] = v0 * c - v1 * sn;
        x[2 * i + 1] = v0 * sn + v1 * c;
    }
}

static double norm_d(const double *x, size_t d) {
    double s = 0;
    for (size_t t = 0; t < d; t++)
        s += x[t] * x[t];
    return sqrt(s);
}

/* Gaussian Lloyd-Max distortion per unit variance (Max 1960), b = 1..4. The
 * codebook of one coordinate of a random unit vector in R^d (lighter tails)
 * does better at every d >= 2. */
static const double lloyd_max_gauss[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};

/* nmse of tq<b> with its norm correction (x' = |x| c/|c|): the error
 * 2(1 - cos) = 2 sin^2/(1 + cos), sin^2 <= |u - c|^2 ~ D, cos ~ sqrt(1 - D). */
static double tq_nmse(int b) {
    double D = lloyd_max_gauss[b];
    return D * 2.0 / (1.0 + sqrt(1.0 - D));
}

/* Theory of one token-layout codec on one vector x (the codec's input):
 * *e2 = E|x' - x|^2 and *qe2 = E<qs, x' - x>^2 for the query qs. Integer
 * codecs: uniform rounding, step^2/12 per value (step = absmax/127 or
 * range/L of the group); f16 / bf16: rounding to 2^-10 / 2^-7 relative
 * ulps; tq: tq_nmse |x|^2, isotropic (random rotation); tqp: tq(b-1)'s error
 * times the QJL estimator's pi/2 - 1/d (its mean over sketches), times
 * 1 + 2/sqrt(d) for one fixed sketch of d rows. */
static void codec_err(const char *spec, const float *x, size_t d, const double *qs, double *e2,
                      double *qe2) {
    double xx = 0, qq = 0;
    for (size_t t = 0; t < d; t++) {
        xx += (double)x[t] * x[t];
        qq += qs[t] * qs[t];
    }
    *e2 = *qe2 = 0;
    if (!strncmp(spec, "f16", 3) || !strncmp(spec, "bf16", 4)) {
        double rel = spec[0] == 'f' ? 0x1p-10 : 0x1p-7;
        for (size_t t = 0; t < d; t++) {
            double v = rel * rel / 12 * x[t] * x[t];
            *e2 += v;
            *qe2 += qs[t] * qs[t] * v;
        }
    } else if (!strncmp(spec, "int", 3)) {
        int bits = atoi(spec + 3);
        const char *gs = strstr(spec, ":g=");
        size_t g = gs ? (size_t)atoi(gs + 3) : d;
        for (size_t g0 = 0; g0 < d; g0 += g) {
            float mn = x[g0], mx = x[g0], am = 0;
            double q2 = 0;
            for (size_t t = g0; t < g0 + g; t++) {
                mn = fminf(mn, x[t]), mx = fmaxf(mx, x[t]), am = fmaxf(am, fabsf(x[t]));
                q2 += qs[t] * qs[t];
            }
            double step = bits == 8 ? am / 127.0 : (mx - mn) / (double)((1 << bits) - 1);
            *e2 += (double)g * step * step / 12;
            *qe2 += q2 * step * step / 12;
        }
    } else if (!strncmp(spec, "tqp", 3)) {
        *e2 = tq_nmse(spec[3] - '0' - 1) * (M_PI / 2 - 1.0 / (double)d) *
              (1 + 2 / sqrt((double)d)) * xx;
        *qe2 = qq * *e2 / (double)d;
    } else if (!strncmp(spec, "tq", 2)) {
        *e2 = tq_nmse(spec[2] - '0') * xx;
        *qe2 = qq * *e2 / (double)d;
    }
}

/* The SIMD kernels of tiled pages of codec spec (src/codec/tile.c) round the
 * query (keys) or the weights (values) to integers: tq1..tq4 pages with
 * P % 16 == 0 and d % 16 == 0. */
static int tiled_quant(const att_model *m, const char *spec, size_t d) {
    if (!m->simd || m->page % 16 != 0)
        return 0;
    return !strncmp(spec, "tq", 2) && spec[2] != 'p' && d % 16 == 0;
}

/* int8/int4 with g % 8 == 0 on tiled pages (src/codec/int.c): *g gets the
 * group size. */
static int int_tiled(const att_model *m, const char *spec, size_t d, size_t *g) {
    if (!m->simd || m->page % 16 != 0 || strncmp(spec, "int", 3) || atoi(spec + 3) == 2)
        return 0;
    const char *gs = strstr(spec, ":g=");
    *g = gs ? (size_t)atoi(gs + 3) : d;
    return *g % 8 == 0;
}

/* Variance of the score error that the query quantization of the SIMD path
 * adds to key k (as stored: less the centre) for the query qs (see (a)). */
static double quant_var(const att_model *m, const char *kc, const double *qs, const double *k,
                        size_t d) {
    size_t g;
    if (!m->prerope && !m->kchan && int_tiled(m, kc, d, &g)) {
        /* tiled int keys: the query rounded to int8 per block of qb = 32
         * (16, 8: the largest dividing g) values, step max|q_b| / 127,
         * against k less its group minimum (int4) */
        size_t qb = g % 32 == 0 ? 32 : g % 16 == 0 ? 16 : 8;
        double v = 0;
        for (size_t g0 = 0; g0 < d; g0 += g) {
            double mn = 0;
            if (atoi(kc + 3) != 8) {
                mn = k[g0];
                for (size_t t = g0; t < g0 + g; t++)
                    mn = fmin(mn, k[t]);
            }
            for (size_t b0 = g0; b0 < g0 + g; b0 += qb) {
                double bm = 0;
                for (size_t t = b0; t < b0 + qb; t++)
                    bm = fmax(bm, fabs(qs[t]));
                for (size_t t = b0; t < b0 + qb; t++)
                    v += (bm / 127) * (bm / 127) / 12 * (k[t] - mn) * (k[t] - mn);
            }
        }
        return v;
    }
    if (!m->simd || m->prerope || m->kchan || d % 32 != 0)
        return 0; /* float paths: pre-RoPE and channel keys are scored in float */
    double v = 0;
    if (tiled_quant(m, kc, d)) {
        /* tiled tq/int keys (test_tile_tq, test_tile_int): the rotated query
         * rounded to int8 codes (step max|q| / 63 without VNNI, 127 with) and
         * the centroids or codes to int8 (step max|c| / 127, times a scale
         * <= 2|k|/|c|) */
        double qn = norm_d(qs, d), kn = norm_d(k, d);
        return qn * qn * kn * kn * (1.0 / (12.0 * 63.0 * 63.0) + 4.0 / (12.0 * 127.0 * 127.0));
    }
    if (!strncmp(kc, "int", 3)) {
        double mn = 0; /* int4/int2: codes count up from the group minimum (one group here) */
        if (atoi(kc + 3) != 8) {
            mn = k[0];
            for (size_t t = 1; t < d; t++)
                mn = fmin(mn, k[t]);
        }
        for (size_t b0 = 0; b0 < d; b0 += 32) {
            double bm = 0;
            for (size_t t = b0; t < b0 + 32; t++)
                bm = fmax(bm, fabs(qs[t]));
            double step = bm / 127;
            for (size_t t = b0; t < b0 + 32; t++)
                v += step * step / 12 * (k[t] - mn) * (k[t] - mn);
        }
    } else if (!strcmp(kc, "tq4")) {
        /* query: step max|qr| / 8191 <= |q| / 8191 against scale * c
         * (|scale c| = |k|); codebook: |error| <= cmax/16382 with cmax < 1,
         * times scale = |k|/|c| <= 2|k| (|c| >= 1/2: tq4's per-vector error
         * |u - c|^2 is ~0.01 on these keys) */
        double qn = norm_d(qs, d), kn = norm_d(k, d);
        v = qn * qn * kn * kn * (1.0 / (12.0 * 8191.0 * 8191.0) + 4.0 / (16382.0 * 16382.0));
    }
    return v;
}

/* Softmax weights (p[j], 0 when not visible) of scores sc over n tokens and
 * the output o = sum p_j V_j; returns 0 when nothing is visible. */
static int softmax_out(size_t n, size_t d, const double *sc, const int32_t *kpos, int32_t qp,
                       const float *V, size_t vstride, double *p, double *o) {
    double mx = -INFINITY, l = 0;
    for (size_t j = 0; j < n; j++)
        if (kpos[j] <= qp && sc[j] > mx)
            mx = sc[j];
    for (size_t j = 0; j < n; j++) {
        p[j] = kpos[j] <= qp ? exp(sc[j] - mx) : 0;
        l += p[j];
    }
    memset(o, 0, d * sizeof(double));
    if (l == 0)
        return 0;
    for (size_t j = 0; j < n; j++) {
        p[j] /= l;
        for (size_t t = 0; t < d; t++)
            o[t] += p[j] * V[j * vstride + t];
    }
    return 1;
}

/* The tokens [*a, *b) that hold every run of the tiled V kernels that can
 * hold token j (pages of P tokens, n encoded tokens): taccum rounds per run
 * of up to 64 tokens of a page, taccum_run per run of whole consecutive
 * pages of up to 64 tokens. */
static void run_window(size_t j, size_t P, size_t n, size_t *a, size_t *b) {
    if (P <= 64) {
        size_t rp = 64 / P, pg = j / P;
        *a = pg >= rp - 1 ? (pg - (rp - 1)) * P : 0;
        *b = KVQ__MIN_T((pg + rp) * P, n);
    } else {
        size_t p0 = j / P * P;
        *a = j >= p0 + 63 ? j - 63 : p0;
        *b = KVQ__MIN_T(KVQ__MIN_T(j + 64, p0 + P), n);
    }
}

/* Compares cache attention at three query positions with (a) attention over
 * its own decoded K/V and (b) attention over the exact data, with the bounds
 * described above, and checks that uniform weights fail (b). */
static void check_attention(kvq_cache *c, const seqdata *s, size_t layer, const att_model *m,
                            const char *what, tu_rng *r) {
    size_t QH = s->QH, d = s->d, H = s->H, G = QH / H, n, N = s->n, HD = H * d;
    CHECK_OK(kvq_cache_tokens(c, layer, &n));
    TU_REPORT(n == N, "%s: %zu tokens stored, %zu appended", what, n, N);
    if (n != N)
        return;
    float *q = malloc(QH * d * sizeof(float)), *out = malloc(QH * d * sizeof(float));
    float *K = malloc(N * HD * sizeof(float)), *V = malloc(N * HD * sizeof(float));
    int32_t *kp = malloc(N * sizeof(int32_t));
    double *sc = malloc(N * sizeof(double)), *p = malloc(N * sizeof(double));
    double *qv = malloc(N * sizeof(double)); /* quantization variance per key */
    double *wps = malloc(N * sizeof(double)), *wc2 = malloc(N * sizeof(double));
    double *o = malloc(d * sizeof(double)), *qs = malloc(d * sizeof(double));
    double *qr = malloc(d * sizeof(double)), *kd = malloc(d * sizeof(double));
    double *ks = malloc(d * sizeof(double)), *un = malloc(d * sizeof(double));
    float *xin = malloc(d * sizeof(float));
    CHECK_OK(kvq_cache_positions(c, layer, kp, N));
    const float *Kx = s->k + layer * N * HD, *Kin = (m->prerope ? s->kpre : s->k) + layer * N * HD;
    const float *Vx = s->v + layer * N * HD;
    double worst_dec = 0, worst_exact = 0, min_unif = INFINITY;
    int32_t qps[3] = {s->pos[N - 1], s->pos[N / 2], s->pos[0]};
    size_t nf16 = m->staged < N ? m->staged : N;
    for (int qi = 0; qi < 3; qi++) {
        /* what this attend sees (an attend that reaches the newest token
         * settles staged tokens after it: the next one sees them encoded) */
        CHECK_OK(kvq_cache_get_kv(c, layer, -1, 0, N, K, V, N * HD));
        tu_fill_gauss(r, q, QH * d, 1.0f);
        int32_t qp = qps[qi];
        CHECK_OK(kvq_cache_attend(c, layer, q, &qp, 1, out, QH * d, NULL, 0));
        double e_dec2 = 0, ref2 = 0, dref2 = 0, e_ex2 = 0, pred2 = 0, bflt2 = 0, bq2 = 0;
        double unif2 = 0;
        for (size_t qh = 0; qh < QH; qh++) {
            size_t h = qh / G;
            const float *cen = m->center ? m->center + (layer * H + h) * d : NULL;
            double cn = 0;
            for (size_t t = 0; t < d; t++) {
                qs[t] = q[qh * d + t] / sqrt((double)d);
                cn += cen ? (double)cen[t] * cen[t] : 0;
            }
            cn = sqrt(cn);
            double qn = norm_d(qs, d);
            /* (a) over the decoded K/V */
            double delta = 0;
            for (size_t j = 0; j < N; j++) {
                double kinf = 0;
                for (size_t t = 0; t < d; t++) {
                    kd[t] = K[(j * H + h) * d + t];
                    ks[t] = kd[t] - (cen ? cen[t] : 0); /* what the codec stored */
                    kinf = fmax(kinf, fabs(ks[t]));
                }
                double kn = norm_d(ks, d);
                qv[j] = j < N - nf16 ? quant_var(m, m->k[h], qs, ks, d) : 0;
                if (m->prerope)
                    rope_d(kd, d, kp[j], m->theta, 1);
                double dot = 0;
                for (size_t t = 0; t < d; t++)
                    dot += qs[t] * kd[t];
                sc[j] = dot;
                if (kp[j] > qp)
                    continue;
                /* float rounding: N = 4d roundings (d + 4 on the direct
                 * paths: float, int, channel keys, each of a value of at
                 * most |q|(|k| + |centre|), int4/int2 adding sqrt(d)|q| |m|
                 * (the minimum times the query's sum) */
                const char *kc = m->k[h];
                int direct = m->kchan || strncmp(kc, "tq", 2) != 0;
                int asym = !m->kchan && !strncmp(kc, "int", 3) && atoi(kc + 3) != 8;
                double nr = direct ? d + 4.0 : 4.0 * d;
                double dj = ATT_LAMBDA * ATT_U * sqrt(nr) * qn *
                            (kn + cn + (asym ? 2 * kinf * sqrt((double)d) : 0));
                if (m->prerope)
                    dj += (4 * ATT_U * kp[j] + 8 * ATT_U) * qn * (kn + cn);
                delta = fmax(delta, dj);
            }
            softmax_out(N, d, sc, kp, qp, V + h * d, HD, p, o);
            double eta = (double)(N + 64) * ATT_U / (1 - (N + 64) * ATT_U) + 4e-7;
            double eps_p = exp(2 * delta) * (1 + eta) - 1;
            double spread = 0, mag = 0, qvar = 0;
            for (size_t j = 0; j < N; j++) {
                if (p[j] == 0)
                    continue;
                double dv = 0, vv = 0;
                for (size_t t = 0; t < d; t++) {
                    double x = V[(j * H + h) * d + t];
                    dv += (x - o[t]) * (x - o[t]);
                    vv += x * x;
                }
                spread += p[j] * sqrt(dv);
                mag += p[j] * sqrt(vv);
                qvar += p[j] * p[j] * expm1(qv[j]) * dv;
            }
            size_t vg;
            if (int_tiled(m, m->v[h], d, &vg)) {
                /* tiled int values: per run (taccum: up to 64 tokens of a
                 * page; taccum_run: up to 64 tokens of whole pages) and
                 * group, p_j s_j rounded in steps alpha = max p_j s_j / W
                 * against the codes c = (v - m) / s: variance alpha^2 / 12
                 * sum c^2. W = 127 here, the coarsest path (int8 on AVX2
                 * and AVX-512BW; the others take 255, int4 with codes c - 8,
                 * |c - 8| <= 8 < 15): an upper bound for every path; alpha of
                 * token j's run is at most the maximum over run_window(j),
                 * whatever the runs */
                const int b8 = atoi(m->v[h] + 3) == 8;
                const size_t NE = N - nf16;
                for (size_t g0 = 0; g0 < d; g0 += vg) {
                    for (size_t j = 0; j < NE; j++) {
                        double mn = INFINITY, mx = -INFINITY, am = 0, c2 = 0;
                        for (size_t t = g0; t < g0 + vg; t++) {
                            double x = V[(j * H + h) * d + t];
                            mn = fmin(mn, x), mx = fmax(mx, x), am = fmax(am, fabs(x));
                        }
                        double sj = b8 ? am / 127 : (mx - mn) / 15;
                        if (sj > 0)
                            for (size_t t = g0; t < g0 + vg; t++) {
                                double cj = (V[(j * H + h) * d + t] - (b8 ? 0 : mn)) / sj;
                                c2 += cj * cj;
                            }
                        wps[j] = p[j] * sj;
                        wc2[j] = c2;
                    }
                    for (size_t j = 0; j < NE; j++) {
                        size_t a, b;
                        run_window(j, m->page, NE, &a, &b);
                        double amax = 0;
                        for (size_t i = a; i < b; i++)
                            amax = fmax(amax, wps[i]);
                        qvar += (amax / 127) * (amax / 127) / 12 * wc2[j];
                    }
                }
            }
            if (tiled_quant(m, m->v[h], d)) {
                /* tiled values: per run (a page, or whole pages of up to 64
                 * tokens), the weights p_k (times the norm or scale) rounded
                 * to u8 codes of step max_k p_k n_k / 127 and the centroids
                 * to int8 (step max|c| / 127): the output moves by a variance
                 * of (2 max_k p_k |v_k|)^2 / (12 127^2) per token, the
                 * maximum over its run_window, + sum_k p_k^2 |v_k|^2 36 /
                 * (12 127^2) (staged tokens are f16, summed in float) */
                const size_t NE = N - nf16;
                double s2 = 0;
                for (size_t j = 0; j < NE; j++) {
                    double vv = 0;
                    for (size_t t = 0; t < d; t++)
                        vv += (double)V[(j * H + h) * d + t] * V[(j * H + h) * d + t];
                    wps[j] = p[j] * sqrt(vv);
                    s2 += p[j] * p[j] * vv;
                }
                for (size_t j = 0; j < NE; j++) {
                    size_t a, b;
                    run_window(j, m->page, NE, &a, &b);
                    double mx = 0;
                    for (size_t i = a; i < b; i++)
                        mx = fmax(mx, wps[i]);
                    qvar += (2 * mx) * (2 * mx) / (12.0 * 127 * 127);
                }
                qvar += s2 * 36.0 / (12.0 * 127 * 127);
            }
            double bh = eps_p * spread + 2 * ATT_LAMBDA * ATT_U * sqrt((double)(N + 4 * d)) * mag;
            bflt2 += bh * bh;
            bq2 += qvar;
            for (size_t t = 0; t < d; t++) {
                e_dec2 += (out[qh * d + t] - o[t]) * (out[qh * d + t] - o[t]);
                dref2 += o[t] * o[t];
            }
            /* (b) over the exact data, and the codecs' expected error */
            for (size_t j = 0; j < N; j++) {
                double dot = 0;
                for (size_t t = 0; t < d; t++)
                    dot += qs[t] * Kx[(j * H + h) * d + t];
                sc[j] = dot;
            }
            softmax_out(N, d, sc, s->pos, qp, Vx + h * d, HD, p, o);
            double pe = 0;
            size_t nvis = 0;
            memset(un, 0, d * sizeof(double));
            for (size_t j = 0; j < N; j++) {
                if (s->pos[j] > qp)
                    continue;
                nvis++;
                int f16 = j >= N - nf16; /* staged: f16 until settled */
                const float *vj = Vx + (j * H + h) * d;
                for (size_t t = 0; t < d; t++)
                    un[t] += vj[t];
                /* key error: the codec's input is the key as given less
                 * the centre; a pre-RoPE key's error turns with the key */
                for (size_t t = 0; t < d; t++) {
                    xin[t] = Kin[(j * H + h) * d + t] - (cen ? cen[t] : 0.0f);
                    qr[t] = qs[t];
                }
                if (m->prerope)
                    rope_d(qr, d, s->pos[j], m->theta, -1);
                double ke2 = 0, kq2 = 0, ve2 = 0, vq2 = 0;
                size_t P = m->page, pg = j / P;
                if (m->kchan && !f16 && (pg + 1) * P <= N - nf16) {
                    /* KIVI: each channel's range over the page's P tokens in
                     * 2^b - 1 steps (a page is encoded once full and settled) */
                    for (size_t t = 0; t < d; t++) {
                        float mn = INFINITY, mx = -INFINITY;
                        for (size_t i = pg * P; i < (pg + 1) * P; i++) {
                            float x = Kin[(i * H + h) * d + t] - (cen ? cen[t] : 0.0f);
                            mn = fminf(mn, x), mx = fmaxf(mx, x);
                        }
                        double st = (mx - mn) / (double)((1 << m->kchan) - 1);
                        kq2 += qr[t] * qr[t] * st * st / 12;
                    }
                } else {
                    codec_err(f16 || m->kchan ? "f16" : m->k[h], xin, d, qr, &ke2, &kq2);
                }
                codec_err(f16 ? "f16" : m->v[h], vj, d, qs, &ve2, &vq2);
                double dv = 0;
                for (size_t t = 0; t < d; t++)
                    dv += (vj[t] - o[t]) * (vj[t] - o[t]);
                pe += p[j] * p[j] * (ve2 + expm1(kq2) * dv);
            }
            for (size_t t = 0; t < d; t++) {
                double x = out[qh * d + t] - o[t], y = un[t] / (double)nvis - o[t];
                e_ex2 += x * x;
                unif2 += y * y;
                ref2 += o[t] * o[t];
            }
            pred2 += pe;
        }
        double bound_a = sqrt(bflt2) + 3 * sqrt(bq2); /* absolute, over the query heads */
        double bound_b = (2 * sqrt(pred2) + bound_a) / sqrt(ref2);
        double ex = sqrt(e_ex2 / ref2), unif = sqrt(unif2 / ref2);
        worst_dec = fmax(worst_dec, sqrt(e_dec2) / bound_a);
        worst_exact = fmax(worst_exact, ex / bound_b);
        if (qi < 2) /* at the first position one token is visible: nothing to weigh */
            min_unif = fmin(min_unif, unif / bound_b);
        if (getenv("KVQ_TEST_VERBOSE"))
            printf("  %s q@%d: exact %.3g (bound %.3g, uniform %.3g), decoded %.3g (bound %.3g)\n",
                   what, (int)qp, ex, bound_b, unif, sqrt(e_dec2 / dref2),
                   bound_a / sqrt(dref2));
        /* settled by that attend: the recent window stays in f16 */
        nf16 = m->recent > 0 ? m->recent - 1 : 0;
    }
    TU_REPORT(worst_dec <= 1, "%s: attention vs its own decoded K/V exceeds the bound by %.3gx",
              what, worst_dec);
    TU_REPORT(worst_exact <= 1, "%s: attention vs exact f32 exceeds the codecs' bound by %.3gx",
              what, worst_exact);
    if (m->keys_matter)
        TU_REPORT(min_unif > 1,
                  "%s: uniform weights (keys ignored) pass the codecs' bound (error/bound %.3g)",
                  what, min_unif);
    free(q), free(out), free(K), free(V), free(kp), free(sc), free(p), free(qv), free(o);
    free(wps), free(wc2);
    free(qs), free(qr), free(kd), free(ks), free(un), free(xin);
}

static void base_cfg(kvq_cache_config *cfg, const seqdata *s, const char *kc, const char *vc) {
    kvq_cache_config_init(cfg);
    cfg->n_layers = s->L;
    cfg->n_kv_heads = s->H;
    cfg->n_q_heads = s->QH;
    cfg->head_dim = s->d;
    cfg->max_tokens = 4096;
    cfg->k_codec = kc;
    cfg->v_codec = vc;
}

/* A cache made with cfg, filled with s in chunks of `chunk` tokens (pre-RoPE
 * keys when prerope), its attention on `layer` checked as check_attention
 * does, then freed; nothing more when creation fails (make_cache reports
 * it). */
static void check_filled(kvq_cache_config *cfg, const seqdata *s, int prerope, size_t chunk,
                         size_t layer, const char *what, tu_rng *r) {
    kvq_cache *c = make_cache(cfg);
    if (!c)
        return;
    fill_cache(c, s, prerope, chunk);
    att_model m;
    model_from_cfg(&m, cfg);
    /* the last chunk and the recent window before it wait in f16 */
    m.staged = (s->n % chunk ? s->n % chunk : chunk) + (m.recent ? m.recent - 1 : 0);
    check_attention(c, s, layer, &m, what, r);
    kvq_cache_free(c);
}

/* The start of most tests: a random sequence s (L layers, H KV heads, QH
 * query heads, head_dim d, n tokens; free it with free_seq) and cfg set to
 * its shape with codecs kc and vc. */
static void seq_and_cfg(seqdata *s, kvq_cache_config *cfg, size_t L, size_t H, size_t QH, size_t d,
                        size_t n, const char *kc, const char *vc, tu_rng *r) {
    make_seq(s, L, H, QH, d, n, r);
    base_cfg(cfg, s, kc, vc);
}

static void test_exact_and_codecs(tu_rng *r) {
    const size_t shapes[][3] = {{2, 8, 16}, {1, 4, 32}, {4, 4, 8}, {2, 6, 64}}; /* H, QH, d */
    for (size_t si = 0; si < 4; si++) {
        seqdata s;
        make_seq(&s, 2, shapes[si][0], shapes[si][1], shapes[si][2], 75, r);
        kvq_cache_config cfg;
        base_cfg(&cfg, &s, "f32", "f32");
        char what[96];
        snprintf(what, sizeof what, "f32 H=%zu QH=%zu d=%zu", s.H, s.QH, s.d);
        check_filled(&cfg, &s, 0, 7, 1, what, r);
        /* every codec: close to exact, and matching its own decoded K/V */
        const char *codecs[][2] = {{"f16", "f16"}, {"bf16", "bf16"}, {"int8", "int8"},
                                   {"int4", "int4"}, {"tq4", "tq4"},   {"tq3", "tq3"},
                                   {"int8", "tq3"},  {"tqp3", "int4"}};
        for (size_t ci = 0; ci < 8; ci++) {
            base_cfg(&cfg, &s, codecs[ci][0], codecs[ci][1]);
            cfg.page_tokens = 8;
            snprintf(what, sizeof what, "%s/%s H=%zu QH=%zu d=%zu", codecs[ci][0], codecs[ci][1],
                     s.H, s.QH, s.d);
            kvq_cache *c = make_cache(&cfg);
            if (!c)
                continue;
            fill_cache(c, &s, 0, 75);
            att_model m;
            model_from_cfg(&m, &cfg);
            m.staged = s.n;
            /* tqp3 keys: by the codec's theory (nmse ~0.2 of |k|^2, with
             * the offset channel |k|^2 ~ d + 9) the scores move by ~0.5 to
             * 0.8 logits, so attention over them may legitimately be as far
             * from exact as attention that ignores the keys; bound (b)
             * cannot tell them apart here, and the key path is held by
             * bound (a) instead */
            m.keys_matter = strcmp(codecs[ci][0], "tqp3") != 0;
            check_attention(c, &s, 0, &m, what, r);
            kvq_cache_free(c);
        }
        free_seq(&s);
    }
}

static void test_window_prerope_center_chan(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    /* recent window: the newest R tokens in f16, the rest int8 */
    seq_and_cfg(&s, &cfg, 2, 2, 4, 16, 90, "int8", "int8", r);
    cfg.recent_window = 20;
    check_filled(&cfg, &s, 0, 9, 1, "int8 + recent window 20", r);
    /* pre-RoPE keys in f32: exactly the post-RoPE result */
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_prerope = 1;
    check_filled(&cfg, &s, 1, 13, 0, "f32 pre-RoPE", r);
    /* centring (given channel means: the pre-RoPE means of the keys, what
     * calibration would supply) is exact in f32 */
    float *cen = calloc(s.L * s.H * s.d, sizeof(float));
    for (size_t l = 0; l < s.L; l++)
        for (size_t t = 0; t < s.n; t++)
            for (size_t i = 0; i < s.H * s.d; i++)
                cen[l * s.H * s.d + i] += s.kpre[(l * s.n + t) * s.H * s.d + i] / (float)s.n;
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_center = 1;
    cfg.k_center_values = cen;
    check_filled(&cfg, &s, 0, 30, 1, "f32 centred", r);
    /* centring + pre-RoPE + tq keys */
    base_cfg(&cfg, &s, "tq4", "tq4");
    cfg.k_center = 1;
    cfg.k_center_values = cen;
    cfg.k_prerope = 1;
    check_filled(&cfg, &s, 1, 30, 1, "tq4 centred pre-RoPE", r);
    /* a recent window above max_tokens is refused (its ring would be sized
     * for it: a fuzzed 6.7e10 asked for ~530 GB) */
    base_cfg(&cfg, &s, "int8", "int8");
    cfg.recent_window = cfg.max_tokens + 1;
    {
        kvq_cache *bad = NULL;
        CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_INVALID_ARG);
    }
    /* a centre without values is refused (it would come from the sequence) */
    base_cfg(&cfg, &s, "f32", "f32");
    cfg.k_center = 1;
    {
        kvq_cache *bad = NULL;
        CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_INVALID_ARG);
        CHECK(bad == NULL);
    }
    free(cen);
    /* channel layout int8 keys, pages of 16: partial page stays f16 */
    const char *ck[] = {"int8", "int4", "int3", "int2"};
    for (int i = 0; i < 4; i++) {
        base_cfg(&cfg, &s, ck[i], "int8");
        cfg.k_layout = KVQ_LAYOUT_CHANNEL;
        cfg.k_prerope = i >= 2;
        char what[64];
        snprintf(what, sizeof what, "channel %s%s", ck[i], cfg.k_prerope ? " pre-RoPE" : "");
        check_filled(&cfg, &s, cfg.k_prerope, 11, 1, what, r);
    }
    base_cfg(&cfg, &s, "tq3", "int8");
    cfg.k_layout = KVQ_LAYOUT_CHANNEL;
    kvq_cache *bad = NULL;
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_BAD_OPTION);
    free_seq(&s);
}

static void test_precision_switch(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 2, 2, 4, 32, 50, "f16", "f16", r);
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    fill_cache(c, &s, 0, 50);
    double e = -1;
    CHECK_OK(kvq_cache_set_precision(c, 1, -1, 0, "int4", &e));
    CHECK(e > 1e-4 && e < 0.05);
    CHECK_OK(kvq_cache_set_precision(c, 1, 0, 1, "int8", &e));
    CHECK(e > 0 && e < 1e-3);
    att_model m;
    model_from_cfg(&m, &cfg);
    m.k[0] = m.k[1] = "int4";
    m.v[0] = "int8";
    check_attention(c, &s, 1, &m, "after set_precision", r);
    CHECK_STATUS(kvq_cache_set_precision(c, 1, 0, 1, "int5", &e), KVQ_ERR_UNKNOWN_CODEC);
    CHECK_STATUS(kvq_cache_set_precision(c, 7, 0, 1, "int8", &e), KVQ_ERR_RANGE);
    /* new tokens use the new codec */
    int32_t p = 1000;
    float *k = calloc(s.H * s.d, sizeof(float)), *v = calloc(s.H * s.d, sizeof(float));
    CHECK_OK(kvq_cache_append(c, 1, k, v, &p, 1));
    kvq_stats st;
    CHECK_OK(kvq_cache_stats(c, 1, &st));
    CHECK(st.reencodes == 50 * 2 + 50);
    free(k), free(v);
    kvq_cache_free(c);
    free_seq(&s);
}

static void test_threads(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 1, 4, 8, 64, 70, "tq3", "int4", r);
    kvq_cache *a = make_cache(&cfg);
    cfg.n_threads = 3;
    kvq_cache *b = make_cache(&cfg);
    if (a && b) {
        fill_cache(a, &s, 0, 70);
        fill_cache(b, &s, 0, 70);
        float q[8 * 64], oa[8 * 64], ob[8 * 64];
        tu_fill_gauss(r, q, 8 * 64, 1.0f);
        int32_t qp = 1000;
        float ta[4 * 70], tb[4 * 70];
        CHECK_OK(kvq_cache_attend(a, 0, q, &qp, 1, oa, 8 * 64, ta, 4 * 70));
        CHECK_OK(kvq_cache_attend(b, 0, q, &qp, 1, ob, 8 * 64, tb, 4 * 70));
        CHECK(memcmp(oa, ob, sizeof oa) == 0);
        CHECK(memcmp(ta, tb, sizeof ta) == 0);
        /* token attention sums to the number of query heads per group */
        for (size_t h = 0; h < 4; h++) {
            double sum = 0;
            for (size_t t = 0; t < 70; t++)
                sum += ta[h * 70 + t];
            CHECK_NEAR(sum, 2.0, 1e-4);
        }
    }
    kvq_cache_free(a);
    kvq_cache_free(b);
    /* the allocator is only called from the thread calling the API (this
     * counting allocator is not thread-safe: make tsan reports a race if a
     * worker thread calls it) */
    tu_failalloc fa;
    kvq_allocator al = tu_failalloc_make(&fa, 0);
    cfg.allocator = &al;
    kvq_cache *t = make_cache(&cfg);
    if (t) {
        fill_cache(t, &s, 0, 10);
        float q[8 * 64], o[8 * 64], ta[4 * 70];
        for (int i = 0; i < 3; i++) {
            tu_fill_gauss(r, q, 8 * 64, 1.0f);
            int32_t qp = 1000 + i;
            CHECK_OK(kvq_cache_attend(t, 0, q, &qp, 1, o, 8 * 64, ta, 4 * 70));
        }
    }
    kvq_cache_free(t);
    TU_REPORT(fa.live_bytes == 0, "%zu bytes leaked", fa.live_bytes);
    free_seq(&s);
}

/* A long context splits each head's pages into chunks worked by any thread
 * and merged in chunk order: the output and token attention must be the
 * same bytes with 1, 2 and 3 threads, and (f32 K and V) equal a float64
 * softmax attention over the decoded cache within the float rounding bound:
 * every score is within gamma_d * sum_t |q_t k_t| of exact (dot products of
 * d terms, gamma_n = n u / (1 - n u), u = 2^-24) and exp within 2e-7
 * (vmath.c), so each normalised weight is within a relative 2 (delta + 2e-7)
 * (+ merge rescaling: 3 more exp and product roundings, 1e-6) and the
 * weighted sum adds gamma_n; the bound uses 2x those as its margin. */
static void test_threads_long(tu_rng *r) {
    const char *pairs[][2] = {{"f32", "f32"}, {"int8", "int4:g=16"}, {"tq3", "f16"}};
    const size_t H = 2, QH = 4, d = 32, n = 4500, G = QH / H;
    for (size_t pi = 0; pi < 3; pi++) {
        seqdata s;
        kvq_cache_config cfg;
        seq_and_cfg(&s, &cfg, 1, H, QH, d, n, pairs[pi][0], pairs[pi][1], r);
        cfg.max_tokens = 8192;
        float q[4 * 32], out[3][4 * 32];
        float *ta[3];
        tu_fill_gauss(r, q, QH * d, 1.0f);
        int32_t qp = 100000;
        int ok = 1;
        for (size_t t = 0; t < 3; t++) {
            cfg.n_threads = t + 1;
            ta[t] = calloc(H * n, sizeof(float));
            kvq_cache *c = make_cache(&cfg);
            if (!c) {
                ok = 0;
                continue;
            }
            fill_cache(c, &s, 0, 1000);
            CHECK_OK(kvq_cache_attend(c, 0, q, &qp, 1, out[t], QH * d, ta[t], H * n));
            if (t == 2) {
                /* kvq_cache_set_threads: the same bytes at every count the
                 * cache has threads for (min(3, H) = 2 here); 0 and 3 are
                 * refused with a message and change nothing. (The first
                 * attend encoded the staged tokens: the reference is a
                 * second one.) */
                float o1[4 * 32], o2[4 * 32];
                CHECK_OK(kvq_cache_attend(c, 0, q, &qp, 1, o1, QH * d, NULL, 0));
                for (size_t k = 1; k <= 2; k++) {
                    CHECK_OK(kvq_cache_set_threads(c, k));
                    CHECK_OK(kvq_cache_attend(c, 0, q, &qp, 1, o2, QH * d, NULL, 0));
                    TU_REPORT(memcmp(o2, o1, sizeof o2) == 0,
                              "%s/%s: output differs after set_threads(%zu)", pairs[pi][0],
                              pairs[pi][1], k);
                }
                CHECK(kvq_cache_set_threads(c, 0) == KVQ_ERR_INVALID_ARG);
                CHECK(kvq_cache_set_threads(c, 3) == KVQ_ERR_INVALID_ARG);
                CHECK(strstr(kvq_cache_last_error(c), "outside 1..2") != NULL);
                CHECK(kvq_cache_set_threads(NULL, 1) == KVQ_ERR_INVALID_ARG);
                kvq_cache_config got;
                CHECK_OK(kvq_cache_get_config(c, &got));
                CHECK(got.n_threads == 3); /* as created */
                CHECK_OK(kvq_cache_attend(c, 0, q, &qp, 1, o2, QH * d, NULL, 0));
                CHECK(memcmp(o2, o1, sizeof o2) == 0);
            }
            if (t == 0 && pi == 0) {
                /* float64 reference over the decoded cache */
                float *K = malloc(n * H * d * sizeof(float)), *V = malloc(n * H * d * sizeof(float));
                CHECK_OK(kvq_cache_get_kv(c, 0, -1, 0, n, K, V, n * H * d));
                double worst = 0, bound = 0;
                for (size_t qh = 0; qh < QH; qh++) {
                    size_t h = qh / G;
                    const float *qq = q + qh * d;
                    double *sc = malloc(n * sizeof(double)), mx = -1e300, den = 0, delta = 0;
                    double vmax = 0;
                    for (size_t j = 0; j < n; j++) {
                        double a = 0, aa = 0;
                        for (size_t t2 = 0; t2 < d; t2++) {
                            double x = (double)qq[t2] / sqrt((double)d) * K[(j * H + h) * d + t2];
                            a += x;
                            aa += fabs(x);
                        }
                        sc[j] = a;
                        mx = a > mx ? a : mx;
                        double g = d * 0x1p-24 / (1 - d * 0x1p-24);
                        delta = g * aa > delta ? g * aa : delta;
                        for (size_t t2 = 0; t2 < d; t2++)
                            vmax = fabs(V[(j * H + h) * d + t2]) > vmax ? fabs(V[(j * H + h) * d + t2]) : vmax;
                    }
                    for (size_t j = 0; j < n; j++)
                        den += exp(sc[j] - mx);
                    double gn = n * 0x1p-24 / (1 - n * 0x1p-24);
                    double b = 2 * ((2 * (delta + 2e-7) + 1e-6 + gn) * vmax);
                    bound = b > bound ? b : bound;
                    for (size_t t2 = 0; t2 < d; t2++) {
                        double o = 0;
                        for (size_t j = 0; j < n; j++)
                            o += exp(sc[j] - mx) / den * V[(j * H + h) * d + t2];
                        double e = fabs(o - out[0][qh * d + t2]);
                        worst = e > worst ? e : worst;
                        if (e > b)
                            ok = 0;
                    }
                    free(sc);
                }
                TU_REPORT(ok, "long context f32: worst %.3g > bound %.3g", worst, bound);
                free(K), free(V);
            }
            kvq_cache_free(c);
        }
        for (size_t t = 1; t < 3 && ok; t++) {
            TU_REPORT(memcmp(out[0], out[t], sizeof out[0]) == 0, "%s/%s: output differs with %zu threads",
                      pairs[pi][0], pairs[pi][1], t + 1);
            TU_REPORT(memcmp(ta[0], ta[t], H * n * sizeof(float)) == 0,
                      "%s/%s: token attention differs with %zu threads", pairs[pi][0], pairs[pi][1], t + 1);
        }
        for (size_t h = 0; h < H && ok; h++) {
            double sum = 0;
            for (size_t j = 0; j < n; j++)
                sum += ta[0][h * n + j];
            CHECK_NEAR(sum, (double)G, 1e-3);
        }
        for (size_t t = 0; t < 3; t++)
            free(ta[t]);
        free_seq(&s);
    }
}

/* Eviction: budget never exceeded after an append, sinks and the protected
 * window always present, deterministic. */
static void run_eviction(kvq_policy pol, size_t budget, size_t sinks, size_t protect, int32_t *final,
                         size_t *nfinal, tu_rng *r) {
    size_t H = 2, QH = 4, d = 16, n = 300;
    kvq_cache_config cfg;
    kvq_cache_config_init(&cfg);
    cfg.n_layers = 1;
    cfg.n_kv_heads = H;
    cfg.n_q_heads = QH;
    cfg.head_dim = d;
    cfg.max_tokens = 1000;
    cfg.k_codec = "int8";
    cfg.v_codec = "int4";
    cfg.policy = pol;
    cfg.budget_tokens = budget;
    cfg.sinks = sinks;
    cfg.protect_recent = protect;
    cfg.page_tokens = 8;
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    float k[2 * 16], v[2 * 16], q[4 * 16], o[4 * 16];
    int ok_budget = 1, ok_sinks = 1, ok_recent = 1;
    int32_t *pos = malloc(1000 * sizeof(int32_t));
    for (size_t t = 0; t < n; t++) {
        tu_fill_gauss(r, k, H * d, 1.0f);
        tu_fill_gauss(r, v, H * d, 1.0f);
        int32_t p = (int32_t)t;
        CHECK_OK(kvq_cache_append(c, 0, k, v, &p, 1));
        tu_fill_gauss(r, q, QH * d, 2.0f);
        CHECK_OK(kvq_cache_attend(c, 0, q, &p, 1, o, QH * d, NULL, 0));
        size_t nt;
        kvq_cache_tokens(c, 0, &nt);
        ok_budget &= nt <= budget;
        kvq_cache_positions(c, 0, pos, 1000);
        for (size_t i = 0; i < sinks && i <= t; i++)
            ok_sinks &= pos[i] == (int32_t)i;
        size_t want = KVQ__MIN_T(protect, t + 1);
        for (size_t i = 0; i < want; i++)
            ok_recent &= pos[nt - 1 - i] == (int32_t)(t - i);
    }
    TU_REPORT(ok_budget, "policy %d: budget %zu exceeded", (int)pol, budget);
    TU_REPORT(ok_sinks, "policy %d: a sink token was evicted", (int)pol);
    TU_REPORT(ok_recent, "policy %d: a protected recent token was evicted", (int)pol);
    kvq_cache_tokens(c, 0, nfinal);
    kvq_cache_positions(c, 0, final, 1000);
    kvq_stats st;
    kvq_cache_stats(c, 0, &st);
    CHECK_EQ(st.tokens_evicted, n - *nfinal);
    CHECK(st.fragmentation >= 0 && st.fragmentation < 1);
    free(pos);
    kvq_cache_free(c);
}

static void test_eviction(void) {
    kvq_policy pols[] = {KVQ_POLICY_WINDOW, KVQ_POLICY_FIFO, KVQ_POLICY_UTILITY};
    for (int i = 0; i < 3; i++) {
        int32_t a[1000], b[1000];
        size_t na = 0, nb = 0;
        tu_rng r1, r2;
        tu_seed(&r1, 77);
        tu_seed(&r2, 77);
        run_eviction(pols[i], 64, 4, 16, a, &na, &r1);
        run_eviction(pols[i], 64, 4, 16, b, &nb, &r2);
        CHECK_EQ(na, 64);
        TU_REPORT(na == nb && memcmp(a, b, na * sizeof(int32_t)) == 0,
                  "policy %d not deterministic", (int)pols[i]);
        if (pols[i] == KVQ_POLICY_WINDOW) {
            /* StreamingLLM: sinks 0..3 and the newest 60 */
            int ok = 1;
            for (size_t t = 0; t < 4; t++)
                ok &= a[t] == (int32_t)t;
            for (size_t t = 4; t < 64; t++)
                ok &= a[t] == (int32_t)(300 - 64 + t);
            CHECK(ok);
        }
        if (pols[i] == KVQ_POLICY_UTILITY) {
            /* heavy hitters: not simply the newest */
            int differs = 0;
            for (size_t t = 4; t < 64; t++)
                differs |= a[t] != (int32_t)(300 - 64 + t);
            CHECK(differs);
        }
    }
}

/* Stored bytes equal what the allocator holds for the layers; failures at
 * every allocation leave the cache unchanged. */
static void test_accounting_and_failures(tu_rng *r) {
    seqdata s;
    make_seq(&s, 2, 2, 4, 16, 120, r);
    const char *kcs[] = {"int4:g=8", "tq3", "f16"};
    for (int ci = 0; ci < 3; ci++)
        for (int win = 0; win < 2; win++) {
            tu_failalloc fa;
            kvq_allocator al = tu_failalloc_make(&fa, 0);
            kvq_cache_config cfg;
            base_cfg(&cfg, &s, kcs[ci], "int8");
            cfg.allocator = &al;
            cfg.recent_window = win ? 10 : 0;
            cfg.policy = KVQ_POLICY_UTILITY;
            cfg.budget_tokens = 70;
            cfg.protect_recent = 16;
            cfg.page_tokens = 8;
            kvq_cache *c = make_cache(&cfg);
            if (!c)
                continue;
            size_t base = fa.live_bytes;
            int ok = 1;
            for (size_t t = 0; t < s.n; t += 5) {
                for (size_t l = 0; l < 2; l++)
                    CHECK_OK(kvq_cache_append(c, l, s.k + (l * s.n + t) * 32, s.v + (l * s.n + t) * 32,
                                              s.pos + t, 5));
                kvq_stats st;
                kvq_cache_stats(c, -1, &st);
                ok &= st.stored_bytes == fa.live_bytes - base;
                ok &= st.peak_stored_bytes >= st.stored_bytes;
                ok &= st.payload_bytes + st.metadata_bytes == st.stored_bytes;
            }
            TU_REPORT(ok, "%s window %d: stored bytes differ from allocated bytes", kcs[ci], win);
            /* failure injection on one more append: unchanged on NOMEM */
            size_t n0;
            kvq_cache_tokens(c, 0, &n0);
            int32_t *p0 = malloc(n0 * sizeof(int32_t)), *p1 = malloc((n0 + 40) * sizeof(int32_t));
            kvq_cache_positions(c, 0, p0, n0);
            float *kk = malloc(40 * 32 * sizeof(float)), *vv = malloc(40 * 32 * sizeof(float));
            tu_fill_gauss(r, kk, 40 * 32, 1.0f);
            tu_fill_gauss(r, vv, 40 * 32, 1.0f);
            int32_t pp[40];
            for (int i = 0; i < 40; i++)
                pp[i] = 1000 + i;
            int clean = 1, succeeded = 0;
            for (long f = 1; f < 60 && !succeeded; f++) {
                fa.fail_at = fa.calls + f;
                kvq_status st = kvq_cache_append(c, 0, kk, vv, pp, 40);
                if (st == KVQ_OK) {
                    succeeded = 1;
                } else {
                    size_t n1;
                    kvq_cache_tokens(c, 0, &n1);
                    kvq_cache_positions(c, 0, p1, n0 + 40);
                    clean &= st == KVQ_ERR_NOMEM && n1 == n0 && memcmp(p0, p1, n0 * 4) == 0;
                    kvq_stats sst;
                    kvq_cache_stats(c, -1, &sst);
                    clean &= sst.stored_bytes == fa.live_bytes - base;
                }
            }
            fa.fail_at = 0;
            TU_REPORT(clean, "%s window %d: a failed append changed the cache", kcs[ci], win);
            CHECK(succeeded);
            free(p0), free(p1), free(kk), free(vv);
            kvq_cache_free(c);
            TU_REPORT(fa.live_bytes == 0, "%zu bytes leaked", fa.live_bytes);
        }
    free_seq(&s);
}

static void test_bad_input(tu_rng *r) {
    seqdata s;
    kvq_cache_config cfg;
    seq_and_cfg(&s, &cfg, 1, 2, 4, 8, 10, "int8", "int8", r);
    cfg.max_tokens = 10;
    kvq_cache *c = make_cache(&cfg);
    if (!c)
        return;
    fill_cache(c, &s, 0, 10);
    int32_t p = 100;
    float k[16] = {0}, v[16] = {0}, q[32] = {0}, o[32];
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_FULL);
    CHECK_STATUS(kvq_cache_append(c, 1, k, v, &p, 1), KVQ_ERR_RANGE);
    kvq_cache_free(c);
    cfg.max_tokens = 100;
    c = make_cache(&cfg);
    fill_cache(c, &s, 0, 10);
    p = 5;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_ORDER);
    p = 100;
    k[3] = NAN;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_NONFINITE);
    k[3] = 0;
    v[5] = INFINITY;
    CHECK_STATUS(kvq_cache_append(c, 0, k, v, &p, 1), KVQ_ERR_NONFINITE);
    q[0] = NAN;
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &p, 1, o, 32, NULL, 0), KVQ_ERR_NONFINITE);
    q[0] = 0;
    CHECK_STATUS(kvq_cache_attend(c, 0, q, &p, 1, o, 31, NULL, 0), KVQ_ERR_DST_TOO_SMALL);
    size_t n;
    kvq_cache_tokens(c, 0, &n);
    CHECK_EQ(n, 10);
    att_model m;
    model_from_cfg(&m, &cfg);
    check_attention(c, &s, 0, &m, "after bad input", r);
    kvq_cache_free(c);
    /* configuration errors */
    kvq_cache *bad = NULL;
    base_cfg(&cfg, &s, "int4:g=3", "int8");
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_GROUP);
    base_cfg(&cfg, &s, "int8", "int8");
    cfg.n_q_heads = 5;
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_INVALID_ARG);
    base_cfg(&cfg, &s, "int8", "nope");
    CHECK_STATUS(kvq_cache_create(&bad, &cfg), KVQ_ERR_UNKNOWN_CODEC);
    CHECK(bad == NULL);
    free_seq(&s);
}

/* kvq_cache_create must refuse cfg with `want` and a message containing
 * `msg`, leave the handle NULL and hold no memory (a counting allocator).
 * It runs in a child process, so a create that writes out of bounds (as an
 * unchecked size product once did) ends the child and fails the check
 * instead of ending the test. */
static void expect_refused(const kvq_cache_config *cfg0, kvq_status want, const char *msg,
                           const char *what) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        tu_failalloc fa;
        kvq_allocator al = tu_failalloc_make(&fa, 0);
        kvq_cache_config cfg = *cfg0;
        char err[256] = "";
        cfg.err_msg = err;
        cfg.err_msg_size = sizeof err;
        cfg.allocator = &al;
        kvq_cache *c = (kvq_cache *)&cfg; /* not NULL: a refusal must clear it */
        kvq_status st = kvq_cache_create(&c, &cfg);
        int ok = st == want && c == NULL && strstr(err, msg) != NULL && fa.live_bytes == 0;
        if (!ok)
            fprintf(stderr, "  %s: status %d (%s), want %d; handle %s; message '%s', want '%s'; "
                            "%zu bytes held\n",
                    what, (int)st, kvq_strerror(st), (int)want, c ? "set" : "NULL", err, msg,
                    fa.live_bytes);
        if (st == KVQ_OK)
            kvq_cache_free(c);
        fflush(stderr);
        _exit(ok ? 0 : 1);
    }
    int ws = 0;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) {
        TU_REPORT(0, "%s: no child process", what);
        return;
    }
    TU_REPORT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: %s", what,
              WIFSIGNALED(ws) ? "kvq_cache_create crashed" : "not refused as it should be");
}

/* The limits of kvq.h: every count just past its limit and at absurd values
 * (the one of the report: n_layers * sizeof(layer) wrapped to 160 bytes),
 * overrides NULL or out of range: KVQ_ERR_INVALID_ARG (head_dim:
 * KVQ_ERR_HEAD_DIM) with a message naming the field; the limits themselves
 * are accepted. */
static void test_config_limits(void) {
    kvq_cache_config base;
    kvq_cache_config_init(&base);
    base.n_layers = 2, base.n_kv_heads = 2, base.n_q_heads = 4, base.head_dim = 16;
    base.max_tokens = 64;
    base.k_codec = "int8", base.v_codec = "int8";
    const size_t huge = 52405522936674863ull, T1 = (size_t)KVQ_MAX_TOKENS + 1;
    kvq_cache_config c;
    kvq_codec_override ov[2];
#define REFUSE(field_set, want, msg)                                                               \
    do {                                                                                           \
        c = base;                                                                                  \
        field_set;                                                                                 \
        expect_refused(&c, want, msg, #field_set);                                                 \
    } while (0)
    REFUSE(c.n_layers = huge, KVQ_ERR_INVALID_ARG, "n_layers");
    REFUSE(c.n_layers = KVQ_MAX_LAYERS + 1, KVQ_ERR_INVALID_ARG, "n_layers 4097");
    REFUSE(c.n_layers = SIZE_MAX, KVQ_ERR_INVALID_ARG, "n_layers");
    REFUSE((c.n_kv_heads = huge, c.n_q_heads = huge), KVQ_ERR_INVALID_ARG, "n_kv_heads");
    REFUSE((c.n_kv_heads = KVQ_MAX_KV_HEADS + 1, c.n_q_heads = KVQ_MAX_KV_HEADS + 1),
           KVQ_ERR_INVALID_ARG, "n_kv_heads 4097");
    REFUSE((c.n_kv_heads = 1, c.n_q_heads = KVQ_MAX_Q_HEADS + 1), KVQ_ERR_INVALID_ARG,
           "n_q_heads 16385");
    REFUSE(c.n_q_heads = SIZE_MAX, KVQ_ERR_INVALID_ARG, "n_q_heads");
    REFUSE(c.head_dim = KVQ_MAX_HEAD_DIM + 1, KVQ_ERR_HEAD_DIM, "head_dim 1025");
    REFUSE(c.head_dim = SIZE_MAX, KVQ_ERR_HEAD_DIM, "head_dim");
    REFUSE(c.max_tokens = T1, KVQ_ERR_INVALID_ARG, "max_tokens");
    REFUSE(c.max_tokens = SIZE_MAX, KVQ_ERR_INVALID_ARG, "max_tokens");
    REFUSE(c.page_tokens = KVQ_MAX_PAGE_TOKENS + 1, KVQ_ERR_INVALID_ARG, "page_tokens 4097");
    REFUSE(c.page_tokens = SIZE_MAX, KVQ_ERR_INVALID_ARG, "page_tokens");
    REFUSE(c.n_threads = KVQ_MAX_THREADS + 1, KVQ_ERR_INVALID_ARG, "n_threads 257");
    REFUSE(c.sinks = T1, KVQ_ERR_INVALID_ARG, "sinks");
    REFUSE(c.protect_recent = SIZE_MAX, KVQ_ERR_INVALID_ARG, "protect_recent");
    REFUSE(c.hot_tokens = T1, KVQ_ERR_INVALID_ARG, "hot_tokens");
    REFUSE(c.warm_tokens = SIZE_MAX, KVQ_ERR_INVALID_ARG, "warm_tokens");
    REFUSE(c.recent_window = 65, KVQ_ERR_INVALID_ARG, "recent_window 65");
    /* budgets: above max_tokens a configured one acts as max_tokens (kvq.h;
     * test_causal), but a count past 2^30 and a ratio that is not a finite
     * number >= 0 (an infinite ratio times 0 tokens is NaN) are refused */
    REFUSE((c.policy = KVQ_POLICY_UTILITY, c.budget_tokens = T1), KVQ_ERR_INVALID_ARG,
           "budget_tokens 1073741825 is above 2^30");
    REFUSE((c.policy = KVQ_POLICY_WINDOW, c.budget_tokens = SIZE_MAX), KVQ_ERR_INVALID_ARG,
           "budget_tokens");
    REFUSE((c.policy = KVQ_POLICY_UTILITY, c.budget_ratio = NAN), KVQ_ERR_INVALID_ARG,
           "budget_ratio");
    REFUSE((c.policy = KVQ_POLICY_UTILITY, c.budget_ratio = INFINITY), KVQ_ERR_INVALID_ARG,
           "budget_ratio");
    REFUSE(c.budget_ratio = -0.5, KVQ_ERR_INVALID_ARG, "budget_ratio");
    REFUSE(c.cold_ttl_ms = KVQ_MAX_COLD_TTL_MS + 1, KVQ_ERR_INVALID_ARG, "cold_ttl_ms");
    REFUSE(c.link_gbps[1] = NAN, KVQ_ERR_INVALID_ARG, "link_gbps");
    REFUSE(c.link_latency_ms[0] = -1, KVQ_ERR_INVALID_ARG, "link_latency_ms");
    REFUSE((c.k_prerope = 1, c.rope_theta = INFINITY), KVQ_ERR_INVALID_ARG, "rope_theta");
    /* overrides: NULL with a count, too many, out of range, without a codec */
    REFUSE(c.n_overrides = 3, KVQ_ERR_INVALID_ARG, "overrides is NULL");
    memset(ov, 0, sizeof ov);
    ov[0].layer = -1, ov[0].kv_head = -1, ov[0].codec = "int4";
    ov[1] = ov[0];
    base.overrides = ov;
    base.n_overrides = 2;
    REFUSE(c.n_overrides = (size_t)KVQ_MAX_OVERRIDES + 1, KVQ_ERR_INVALID_ARG, "n_overrides");
    REFUSE(ov[1].layer = 2, KVQ_ERR_INVALID_ARG, "override 1 (int4): layer 2");
    REFUSE(ov[1].layer = INT_MAX, KVQ_ERR_INVALID_ARG, "override 1");
    REFUSE(ov[1].kv_head = 2, KVQ_ERR_INVALID_ARG, "kv_head 2");
    ov[1] = ov[0];
    REFUSE(ov[0].codec = NULL, KVQ_ERR_INVALID_ARG, "override 0 (layer -1, kv_head -1) has no codec");
    ov[0] = ov[1];
#undef REFUSE

    /* the limits themselves, and overrides at the last layer and head */
    kvq_cache *h = NULL;
    c = base;
    ov[0].layer = 1, ov[0].kv_head = 1, ov[0].is_value = 1;
    c.policy = KVQ_POLICY_UTILITY, c.budget_tokens = KVQ_MAX_TOKENS, c.budget_ratio = 1.5;
    c.n_threads = 2;
    h = make_cache(&c);
    kvq_cache_free(h);
    struct {
        size_t L, H, QH, d, P;
    } edge[] = {{KVQ_MAX_LAYERS, 1, 1, 1, 1},
                {1, KVQ_MAX_KV_HEADS, KVQ_MAX_KV_HEADS, 1, 1},
                {1, 1, KVQ_MAX_Q_HEADS, 1, 1},
                {1, 1, 1, KVQ_MAX_HEAD_DIM, KVQ_MAX_PAGE_TOKENS}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        kvq_cache_config_init(&c);
        c.n_layers = edge[i].L, c.n_kv_heads = edge[i].H, c.n_q_heads = edge[i].QH;
        c.head_dim = edge[i].d, c.page_tokens = edge[i].P;
        c.max_tokens = KVQ_MAX_TOKENS;
        c.sinks = c.protect_recent = c.hot_tokens = c.warm_tokens = KVQ_MAX_TOKENS;
        c.cold_ttl_ms = KVQ_MAX_COLD_TTL_MS;
        c.huge_pages = -1; /* no huge-page regions for these one-off shapes */
        h = make_cache(&c);
        kvq_cache_free(h);
    }
}

/* kvq_cache_set_budget: a budget outside 1..max_tokens is KVQ_ERR_INVALID_ARG
 * under every policy, with a message, and changes nothing (the next append
 * still evicts to the budget the cache had); policy none is otherwise
 * KVQ_ERR_UNSUPPORTED. */
static void test_set_budget(tu_rng *r) {
    const size_t H = 2, d = 8, M = 64, B = 48;
    float k[62 * 2 * 8], v[62 * 2 * 8];
    tu_fill_gauss(r, k, sizeof k / sizeof k[0], 1.0f);
    tu_fill_gauss(r, v, sizeof v / sizeof v[0], 1.0f);
    kvq_policy pols[] = {KVQ_POLICY_NONE, KVQ_POLICY_WINDOW, KVQ_POLICY_FIFO, KVQ_POLICY_UTILITY};
    for (int pi = 0; pi < 4; pi++) {
        kvq_cache_config cfg;
        kvq_cache_config_init(&cfg);
        cfg.n_layers = 1, cfg.n_kv_heads = H, cfg.n_q_heads = H, cfg.head_dim = d;
        cfg.max_tokens = M, cfg.k_codec = "int8", cfg.v_codec = "int8";
        cfg.policy = pols[pi];
        cfg.budget_tokens = pols[pi] == KVQ_POLICY_NONE ? 0 : B;
        kvq_cache *c = make_cache(&cfg);
        if (!c)
            continue;
        CHECK_OK(kvq_cache_append(c, 0, k, v, NULL, 60));
        kvq_stats s0, s1;
        CHECK_OK(kvq_cache_stats(c, -1, &s0));
        size_t bad[] = {M + 1, 2 * M, SIZE_MAX, 0};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            kvq_status st = kvq_cache_set_budget(c, bad[i]);
            TU_REPORT(st == KVQ_ERR_INVALID_ARG, "policy %d: set_budget(%zu) = %d (%s)", pi,
                      bad[i], (int)st, kvq_strerror(st));
            TU_REPORT(strstr(kvq_cache_last_error(c), "outside 1..max_tokens") != NULL,
                      "policy %d: set_budget(%zu): message '%s'", pi, bad[i],
                      kvq_cache_last_error(c));
        }
        CHECK_OK(kvq_cache_stats(c, -1, &s1));
        CHECK(memcmp(&s0, &s1, sizeof s0) == 0);
        /* 2 more tokens: the 60 before them are over the budget B with no
         * attend since, so the append keeps B of them (cache_append.c),
         * whatever the refused calls asked (a budget of 64 would keep 60) */
        CHECK_OK(kvq_cache_append(c, 0, k + 60 * H * d, v + 60 * H * d, NULL, 2));
        size_t n = 0;
        CHECK_OK(kvq_cache_tokens(c, 0, &n));
        CHECK_EQ(n, pols[pi] == KVQ_POLICY_NONE ? 62 : B + 2);
        if (pols[pi] == KVQ_POLICY_NONE) {
            CHECK_STATUS(kvq_cache_set_budget(c, 20), KVQ_ERR_UNSUPPORTED);
        } else {
            CHECK_OK(kvq_cache_set_budget(c, M)); /* the limit itself */
            CHECK_OK(kvq_cache_set_budget(c, 20));
            CHECK_EQ(kvq_cache_last_error(c)[0], 0);
            CHECK_OK(kvq_cache_tokens(c, 0, &n));
            CHECK_EQ(n, 20);
        }
        kvq_cache_free(c);
    }
    CHECK_STATUS(kvq_cache_set_budget(NULL, 10), KVQ_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    uint64_t seed = 4242;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng r;
    tu_seed(&r, seed);
    test_exact_and_codecs(&r);
    test_window_prerope_center_chan(&r);
    test_precision_switch(&r);
    test_threads(&r);
    test_threads_long(&r);
    test_eviction();
    test_accounting_and_failures(&r);
    test_bad_input(&r);
    test_config_limits();
    test_set_budget(&r);
    return tu_finish();
}
