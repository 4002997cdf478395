/*
 * int_avx512_body.h - the tiled int8/int4 kernels of int_avx512.c, included
 * twice: KVQ__VNNI 1 (vpdpbusd, vpdpwssd; target KVQ__T512VNNI) and 0
 * (AVX-512BW maddubs / madd, target KVQ__T512); KVQ__FN names each copy.
 * No include guard on purpose.
 *
 * int8 (int_tile.h, int.c), exact in int32: the keys' stored bytes c + 128
 * widened to int16 times the int16 query codes Q (|Q| <= 16383) by s16 x
 * s16 products (vpdpwssd with VNNI, vpmaddwd + vpaddd on BW), each token in
 * two int32 lanes added at the block's end (kvq__i512_pairsum16), the bias
 * -128 sum Q in the even lanes: a lane below 128 * 256 * 16383 + 64 * 2 *
 * 255 * 16383 < 2^31. The values against weights 0..32767: with VNNI two
 * passes of vpdpbusd (the weights' high bytes 0..127, the sums times 256,
 * then their low bytes; below 256 * 64 * 127 * 127 + 64 * 255 * 127), on
 * BW vpmaddwd of the codes widened to int16 with the u16 weights (a lane
 * below 16 * 2 * 32767 * 127). On Zen 5 (int8, 32k tokens, in-process
 * A/B) the int16 keys measured 3-4% faster than two vpdpbusd passes (qh,
 * ql bytes of Q) and the two-pass values 5-8% faster than vpdpwssd.
 * int4: keys u8 nibbles x s8 query codes (int16 sums over at most 4 lane
 * steps on BW: 4 * 2 * 2 * 15 * 127 = 30480); values u8 weights 0..255 x
 * s8 codes c - 8 in -8..7 (the 8 put back through the minimum term), int32
 * sums of a run of at most KVQ__TILE_RUN = 64 tokens below 64 * 255 * 8 =
 * 130560, the BW int16 steps below 4 * 255 * 8 = 8160.
 */

#if KVQ__VNNI /* acc + the s16 x s16 pairs of a and b in each int32 lane */
#define KVQ__I512_I16ACC(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#else
#define KVQ__I512_I16ACC(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#endif

/* u8 x s8 products of 4 bytes summed into the int32 lanes of acc. */
KVQ__TGT static inline __attribute__((always_inline)) __m512i KVQ__FN(kvq__i512_dp)(__m512i acc,
                                                                                   __m512i a,
                                                                                   __m512i b) {
#if KVQ__VNNI
    return _mm512_dpbusd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), _mm512_set1_epi16(1)));
#endif
}

/* Scores of the 16 tokens [tb, tb + 16) of a tiled K page for 4 query rows
 * q[r] (rows past nr repeat the last and are not stored). Per query block:
 * two int32 chains per row (int8: tokens tb..tb+7 and tb+8..tb+15, two
 * lanes each; int4: even and odd lane steps), then G += beta_b * dot; per
 * group F += s_g * G (+ m_g * qsum_g) - the float steps of the AVX2 kernel
 * in the same order. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_tscore16)(const kvq_codec *c, const kvq__tile_plan *tp, float *out,
                            size_t ostride, const uint8_t *const *q, size_t nr,
                            const uint8_t *page, size_t P, size_t tb, const int BITS,
                            const size_t QB, const size_t GB) {
    const size_t ng = c->ngroups, qb = QB ? QB : tp->qb, bpg = (QB && GB ? GB : c->group) / qb;
    const uint8_t *sp = page + (BITS == 8 ? c->d : c->d / 2) * P;
    const __m512i m4 = _mm512_set1_epi8(15);
#if !KVQ__VNNI
    const __m512i ones = _mm512_set1_epi16(1);
#endif
    __m512 F[4];
    KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) F[r] = _mm512_setzero_ps();
    for (size_t gi = 0; gi < ng; gi++) {
        __m512 G[4];
        KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) G[r] = _mm512_setzero_ps();
        for (size_t b = gi * bpg; b < (gi + 1) * bpg; b++) {
            __m512i Ia[4], Jb[4];
            KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                const int32_t bias = ((const int32_t *)(const void *)(q[r] + tp->off_bias))[b];
                /* int8: -128 sum Q in the even lanes (a token's sum is lanes 2i + 2i + 1) */
                Ia[r] = BITS == 8 ? _mm512_set1_epi64((long long)(uint32_t)bias) : _mm512_setzero_si512();
                Jb[r] = Ia[r];
            }
            if (BITS == 8) {
                /* Ia tokens tb..tb+7, Jb tb+8..tb+15, each in two lanes */
                for (size_t k = b * qb / 4; k < (b + 1) * qb / 4; k++) {
                    const uint8_t *kp = page + (k * P + tb) * 4;
                    if (kvq__pf_next) /* the same line of the next page */
                        _mm_prefetch((const char *)(kvq__pf_next + (kp - page)), _MM_HINT_T0);
                    const __m512i A = kvq__i512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)kp));
                    const __m512i B = kvq__i512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(kp + 32)));
                    KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                        const __m512i qv = _mm512_set1_epi64((long long)kvq__i512_ld64(q[r] + 8 * k));
                        Ia[r] = KVQ__I512_I16ACC(Ia[r], A, qv);
                        Jb[r] = KVQ__I512_I16ACC(Jb[r], B, qv);
                    }
                }
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                    Ia[r] = kvq__i512_pairsum16(Ia[r], Jb[r]);
                    Jb[r] = _mm512_setzero_si512();
                }
            } else {
#if !KVQ__VNNI
                __m512i S[4];
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) S[r] = _mm512_setzero_si512();
#endif
                for (size_t k = b * qb / 8; k < (b + 1) * qb / 8; k++) {
                    if (kvq__pf_next) /* the same line of the next page */
                        _mm_prefetch((const char *)(kvq__pf_next + (k * P + tb) * 4), _MM_HINT_T0);
                    const __m512i v = _mm512_loadu_si512((const void *)(page + (k * P + tb) * 4));
                    const __m512i lo = _mm512_and_si512(v, m4);
#if KVQ__VNNI /* the high nibbles in place, 16 times their value (Jb >> 4 below) */
                    const __m512i hi = _mm512_andnot_si512(m4, v);
#else
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#endif
                    KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
#if KVQ__VNNI
                        Ia[r] = kvq__i512_dpb(Ia[r], lo, q[r] + 8 * k);
                        Jb[r] = kvq__i512_dpb(Jb[r], hi, q[r] + 8 * k + 4);
#else
                        const __m512i ql = _mm512_set1_epi32((int)kvq__i512_ld32(q[r] + 8 * k));
                        const __m512i qh = _mm512_set1_epi32((int)kvq__i512_ld32(q[r] + 8 * k + 4));
                        S[r] = _mm512_add_epi16(S[r], _mm512_add_epi16(_mm512_maddubs_epi16(lo, ql),
                                                                       _mm512_maddubs_epi16(hi, qh)));
#endif
                    }
                }
#if !KVQ__VNNI
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) Ia[r] = _mm512_madd_epi16(S[r], ones);
#endif
            }
#if KVQ__VNNI
            if (BITS == 4) {
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) Jb[r] = kvq__i512_sra4(Jb[r]);
            }
#endif
            KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                const float *beta = (const float *)(const void *)(q[r] + tp->off_beta);
                G[r] = _mm512_fmadd_ps(kvq__i512_i2f(_mm512_add_epi32(Ia[r], Jb[r])),
                                       _mm512_set1_ps(beta[b]), G[r]);
            }
        }
        if (kvq__pf_next) { /* the group's scales (and minima) in the next page */
            _mm_prefetch((const char *)(kvq__pf_next + (sp - page) + 2 * (gi * P + tb)), _MM_HINT_T0);
            if (BITS != 8)
                _mm_prefetch((const char *)(kvq__pf_next + (sp - page) + 2 * ((ng + gi) * P + tb)),
                             _MM_HINT_T0);
        }
        const __m512 s = kvq__i512_h2f(sp + 2 * (gi * P + tb));
        KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) F[r] = _mm512_fmadd_ps(G[r], s, F[r]);
        if (BITS != 8) {
            const __m512 m = kvq__i512_h2f(sp + 2 * ((ng + gi) * P + tb));
            KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                const float *qs = (const float *)(const void *)(q[r] + tp->off_qsum);
                F[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(qs[gi]), F[r]);
            }
        }
    }
    for (size_t r = 0; r < nr; r++)
        _mm512_storeu_ps(out + r * ostride + tb, F[r]);
}

KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_tscore_body)(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                               size_t nq, const uint8_t *page, size_t P, const int BITS) {
    kvq__tile_plan tp;
    kvq__tile_plan_make(c, &tp);
    const size_t qs = c->tqp_bytes;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t nr = KVQ__MIN(4, nq - i0);
        const uint8_t *q[4];
        for (size_t r = 0; r < 4; r++)
            q[r] = (const uint8_t *)qp + (i0 + KVQ__MIN(r, nr - 1)) * qs;
        /* query blocks and groups of 32 (int4:g=32, int8:g=32) known at
         * compile time: the lane steps of a block unrolled */
        if (tp.qb == 32 && c->group == 32)
            for (size_t tb = 0; tb < P; tb += 16)
                KVQ__FN(kvq__i512_tscore16)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P,
                                            tb, BITS, 32, 32);
        else if (tp.qb == 32)
            for (size_t tb = 0; tb < P; tb += 16)
                KVQ__FN(kvq__i512_tscore16)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P,
                                            tb, BITS, 32, 0);
        else if (tp.qb == 128 && c->group == 128) /* int8 (d = 128): one block */
            for (size_t tb = 0; tb < P; tb += 16)
                KVQ__FN(kvq__i512_tscore16)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P,
                                            tb, BITS, 128, 128);
        else
            for (size_t tb = 0; tb < P; tb += 16)
                KVQ__FN(kvq__i512_tscore16)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P,
                                            tb, BITS, 0, 0);
    }
}

KVQ__TGT static void KVQ__FN(kvq__i512_tscore8)(const kvq_codec *c, float *out, size_t ostride,
                                                const void *qp, size_t nq, const uint8_t *page,
                                                size_t P) {
    KVQ__FN(kvq__i512_tscore_body)(c, out, ostride, qp, nq, page, P, 8);
}
KVQ__TGT static void KVQ__FN(kvq__i512_tscore4)(const kvq_codec *c, float *out, size_t ostride,
                                                const void *qp, size_t nq, const uint8_t *page,
                                                size_t P) {
    KVQ__FN(kvq__i512_tscore_body)(c, out, ostride, qp, nq, page, P, 4);
}

/* NZ (1..4) strips of 16 dimensions from dc for 4 weight rows over a run of
 * n tokens (n % 16 == 0, n <= KVQ__TILE_RUN) whose blocks of 16 tokens
 * start at cb[j] (each in its own page: taccum_run), then acc += alpha *
 * sum (+ msum for int4) once for the run, for the rows with a[r] set; al
 * and ms are indexed r * ng + group. The group of strip z: GM 16 (g = 16)
 * g0 + z, 32 (g = 32) g0 + z / 2, 64 (g % 64 == 0) g0, 0 (any other g)
 * (dc + 16 z) / g. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_taccum_strip)(const kvq_codec *c, float *const *a, const uint8_t *const *cb,
                                size_t n, size_t dc, size_t g0,
                                const uint8_t (*wq)[KVQ__WQ_ROW],
                                const float *al, const float *ms, const int NZ, const int GM,
                                const int BITS) {
    const size_t d = c->d, ng = c->ngroups;
    const __m512i m4 = _mm512_set1_epi8(15), e8 = _mm512_set1_epi8(8);
    size_t gz[4];
    __m512i Ia[4][4];
    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
        gz[z] = GM == 16 ? g0 + (size_t)z
              : GM == 32 ? g0 + (size_t)z / 2
              : GM == 64 ? g0
                         : (dc + 16 * (size_t)z) / c->group;
        KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) Ia[r][z] = _mm512_setzero_si512();
    }
#if KVQ__VNNI
    /* int8: the weights' high bytes, the sums times 256, then the low bytes */
    for (int pass = 0; pass < (BITS == 8 ? 2 : 1); pass++) {
        if (pass)
            KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++)
                KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) Ia[r][z] = _mm512_slli_epi32(Ia[r][z], 8);
#else
    __m512i Ib[4][4]; /* int8: dimensions 8..15 of strip z (Ia: 0..7), two lanes each */
    if (BITS == 8)
        KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++)
            KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) Ib[r][z] = _mm512_setzero_si512();
    {
        const int pass = 0;
#endif
    for (size_t j = 0; j < n / 16; j++) {
        if (BITS == 8) {
            for (size_t b = 0; b < 4; b++) { /* not unrolled: 16 accumulators plus the steps of 4 would spill */
                const uint8_t *cp = cb[j] + (b * d + dc) * 4;
                if (!pass && kvq__pf_delta) /* the lines in the next head's area */
                    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++)
                        _mm_prefetch((const char *)(cp + kvq__pf_delta + 64 * z), _MM_HINT_T0);
#if KVQ__VNNI
                __m512i v[4];
                KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) v[z] = _mm512_loadu_si512((const void *)(cp + 64 * z));
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
                        const uint8_t *wp = wq[r] + ((size_t)pass * ng + gz[z]) * n + 16 * j + 4 * b;
                        const __m512i wv = _mm512_set1_epi32((int)kvq__i512_ld32(wp));
                        Ia[r][z] = KVQ__FN(kvq__i512_dp)(Ia[r][z], wv, v[z]);
                    }
                }
#else
                __m512i A[4], B[4];
                KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
                    A[z] = kvq__i512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(cp + 64 * z)));
                    B[z] = kvq__i512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(cp + 64 * z + 32)));
                }
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
                        const uint8_t *wp = wq[r] + 2 * (gz[z] * n + 16 * j + 4 * b);
                        const __m512i wv = _mm512_set1_epi64((long long)kvq__i512_ld64(wp));
                        Ia[r][z] = KVQ__I512_I16ACC(Ia[r][z], A[z], wv);
                        Ib[r][z] = KVQ__I512_I16ACC(Ib[r][z], B[z], wv);
                    }
                }
#endif
            }
        } else {
            for (size_t b = 0; b < 2; b++) {
                const uint8_t *cp = cb[j] + (b * d + dc) * 4;
                if (kvq__pf_delta) /* the lines in the next head's area */
                    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++)
                        _mm_prefetch((const char *)(cp + kvq__pf_delta + 64 * z), _MM_HINT_T0);
                __m512i lo[4], hi[4];
                KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) { /* the codes as c - 8 (s8) */
                    const __m512i v = _mm512_loadu_si512((const void *)(cp + 64 * z));
                    lo[z] = _mm512_sub_epi8(_mm512_and_si512(v, m4), e8);
                    hi[z] = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), e8);
                }
                KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
                    KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
                        const uint8_t *wp = wq[r] + gz[z] * n + 16 * j + 8 * b;
                        const __m512i wl = _mm512_set1_epi32((int)kvq__i512_ld32(wp));
                        const __m512i wh = _mm512_set1_epi32((int)kvq__i512_ld32(wp + 4));
#if KVQ__VNNI
                        Ia[r][z] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(Ia[r][z], wl, lo[z]), wh, hi[z]);
#else
                        Ia[r][z] = _mm512_add_epi32(
                            Ia[r][z], _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(wl, lo[z]),
                                                                         _mm512_maddubs_epi16(wh, hi[z])),
                                                        _mm512_set1_epi16(1)));
#endif
                    }
                }
            }
        }
    }
    }
#if !KVQ__VNNI
    if (BITS == 8)
        KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++)
            KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) Ia[r][z] = kvq__i512_pairsum16(Ia[r][z], Ib[r][z]);
#endif
    KVQ__I512_UNROLL4 for (int r = 0; r < 4; r++) {
        if (!a[r])
            continue;
        KVQ__I512_UNROLL4 for (int z = 0; z < NZ; z++) {
            float *ap = a[r] + dc + 16 * (size_t)z;
            const size_t k = (size_t)r * ng + gz[z];
            __m512 x = _mm512_fmadd_ps(kvq__i512_i2f(Ia[r][z]), _mm512_set1_ps(al[k]), _mm512_loadu_ps(ap));
            if (BITS != 8)
                x = _mm512_add_ps(x, _mm512_set1_ps(ms[k]));
            _mm512_storeu_ps(ap, x);
        }
    }
}

/* The strips of one run: GM as in kvq__i512_taccum_strip. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_taccum_strips)(const kvq_codec *c, float *const *a, const uint8_t *const *cb,
                                 size_t n, const uint8_t (*wq)[KVQ__WQ_ROW],
                                 const float *al, const float *ms, const int GM, const int BITS) {
    const size_t d = c->d, g = c->group;
    size_t dc = 0, g0 = 0, left = g;
    if (BITS == 8 && !KVQ__VNNI) { /* two accumulators a strip: 2 strips at a time */
        for (; dc + 32 <= d; dc += 32)
            KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, 0, wq, al, ms, 2, 0, BITS);
        if (dc < d)
            KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, 0, wq, al, ms, 1, 0, BITS);
        (void)GM, (void)g0, (void)left;
        return;
    }
    for (; dc + 64 <= d; dc += 64) {
        KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, GM == 64 ? g0 : dc / (GM ? (size_t)GM : 64),
                                        wq, al, ms, 4, GM, BITS);
        if (GM == 64 && (left -= 64) == 0) {
            g0++;
            left = g;
        }
    }
    /* the last 16, 32 or 48 dimensions (then g is 16, 32 or not a multiple of 64) */
    const size_t g1 = GM ? dc / (GM == 64 ? 64 : (size_t)GM) : 0;
    switch ((d - dc) / 16) {
    case 3:
        KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, g1, wq, al, ms, 3, GM == 64 ? 0 : GM, BITS);
        break;
    case 2:
        KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, g1, wq, al, ms, 2, GM == 64 ? 0 : GM, BITS);
        break;
    case 1:
        KVQ__FN(kvq__i512_taccum_strip)(c, a, cb, n, dc, g1, wq, al, ms, 1, GM == 64 ? 0 : GM, BITS);
        break;
    default:
        break;
    }
}

/* One run of n tokens (n % 16 == 0, n <= KVQ__TILE_RUN) for every row:
 * the run starts at token t0 of pages[0] and goes on at token 0 of the next
 * pages (P tokens each); the weights of row i are w + i * wstride (the
 * run's n, contiguous). Rows by 4: one rounding of the weights, one integer
 * sum over the whole run, one conversion into acc. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_taccum_run1)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                               size_t wstride, size_t nq, const uint8_t *const *pages, size_t P,
                               size_t t0, size_t n, const int BITS) {
    _Alignas(64) uint8_t wq[4][KVQ__WQ_ROW];
    _Alignas(64) float al[4 * KVQ__MAX_HEAD_DIM / 8 + 16], ms[4 * KVQ__MAX_HEAD_DIM / 8 + 16];
    const uint8_t *sb[KVQ__TILE_RUN / 16], *cb[KVQ__TILE_RUN / 16];
    const size_t g = c->group;
    kvq__int_run_blocks(c, pages, P, t0, n, sb, cb);
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t nr = KVQ__MIN(4, nq - i0);
        float *a[4] = {NULL, NULL, NULL, NULL};
        const float *wr[4];
        for (size_t r = 0; r < 4; r++)
            wr[r] = r < nr ? w + (i0 + r) * wstride : kvq__i512_zeros;
        /* int8: weights 0..32767, split in bytes for vpdpbusd, u16 for vpmaddwd;
         * int4: 0..255, the codes taken as c - 8, 8 s added to m */
        const unsigned ok = kvq__i512_wquant4(c, sb, P, n, wr, wq, al, ms,
                                              BITS != 8 ? KVQ__WQ_U8 : KVQ__VNNI ? KVQ__WQ_SPLIT : KVQ__WQ_U16);
        kvq__tile_run_rows(c, ok, nr, acc + i0 * astride, astride, wr, wq, pages, P, t0, n, a);
        const uint8_t(*cwq)[KVQ__WQ_ROW] = (const uint8_t(*)[KVQ__WQ_ROW])wq;
        if (g == 16)
            KVQ__FN(kvq__i512_taccum_strips)(c, a, cb, n, cwq, al, ms, 16, BITS);
        else if (g == 32)
            KVQ__FN(kvq__i512_taccum_strips)(c, a, cb, n, cwq, al, ms, 32, BITS);
        else if (g % 64 == 0)
            KVQ__FN(kvq__i512_taccum_strips)(c, a, cb, n, cwq, al, ms, 64, BITS);
        else
            KVQ__FN(kvq__i512_taccum_strips)(c, a, cb, n, cwq, al, ms, 0, BITS);
    }
}

/* taccum: one page, runs of up to KVQ__TILE_RUN tokens within it. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_taccum_body)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                               size_t wstride, size_t nq, const uint8_t *page, size_t P,
                               const int BITS) {
    for (size_t t0 = 0; t0 < P; t0 += KVQ__TILE_RUN)
        KVQ__FN(kvq__i512_taccum_run1)(c, acc, astride, w + t0, wstride, nq, &page, P, t0,
                                       KVQ__MIN(KVQ__TILE_RUN, P - t0), BITS);
}

KVQ__TGT static void KVQ__FN(kvq__i512_taccum8)(const kvq_codec *c, float *acc, size_t astride,
                                                const float *w, size_t wstride, size_t nq,
                                                const uint8_t *page, size_t P) {
    KVQ__FN(kvq__i512_taccum_body)(c, acc, astride, w, wstride, nq, page, P, 8);
}
KVQ__TGT static void KVQ__FN(kvq__i512_taccum4)(const kvq_codec *c, float *acc, size_t astride,
                                                const float *w, size_t wstride, size_t nq,
                                                const uint8_t *page, size_t P) {
    KVQ__FN(kvq__i512_taccum_body)(c, acc, astride, w, wstride, nq, page, P, 4);
}
/* taccum_run: runs of whole pages, KVQ__TILE_RUN / P of them (P <= 64),
 * else page by page as taccum. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__i512_taccum_pages)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                size_t wstride, size_t nq, const uint8_t *const *pages, size_t np,
                                size_t P, const int BITS) {
    if (P > KVQ__TILE_RUN) {
        for (size_t i = 0; i < np; i++)
            (BITS == 8 ? KVQ__FN(kvq__i512_taccum8) : KVQ__FN(kvq__i512_taccum4))(
                c, acc, astride, w + i * P, wstride, nq, pages[i], P);
        return;
    }
    const size_t R = KVQ__TILE_RUN / P;
    for (size_t i = 0; i < np; i += R)
        KVQ__FN(kvq__i512_taccum_run1)(c, acc, astride, w + i * P, wstride, nq, pages + i, P, 0,
                                       KVQ__MIN(R, np - i) * P, BITS);
}

KVQ__TGT static void KVQ__FN(kvq__i512_taccum_run8)(const kvq_codec *c, float *acc, size_t astride,
                                                    const float *w, size_t wstride, size_t nq,
                                                    const uint8_t *const *pages, size_t np,
                                                    size_t P) {
    KVQ__FN(kvq__i512_taccum_pages)(c, acc, astride, w, wstride, nq, pages, np, P, 8);
}
KVQ__TGT static void KVQ__FN(kvq__i512_taccum_run4)(const kvq_codec *c, float *acc, size_t astride,
                                                    const float *w, size_t wstride, size_t nq,
                                                    const uint8_t *const *pages, size_t np,
                                                    size_t P) {
    KVQ__FN(kvq__i512_taccum_pages)(c, acc, astride, w, wstride, nq, pages, np, P, 4);
}

#undef KVQ__I512_I16ACC
