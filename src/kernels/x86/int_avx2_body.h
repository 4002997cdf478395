/*
 * int_avx2_body.h - the tiled int8/int4 attention kernels of the AVX2 path
 * (tscore, taccum, taccum_run; layouts and bounds: src/codec/int.c),
 * included twice, as int_avx512_body.h is: by int_avx2.c with KVQ__VNNI 0
 * and by int_avxvnni.c with KVQ__VNNI 1 (int8 only: for int4, maddubs sums
 * up to 4 steps in int16 and takes as many products per op as vpdpbusd,
 * so the VNNI copy has no int4 kernels). int8 keys and values go through
 * s16 x s16 products (vpmaddwd + vpaddd, or AVX-VNNI's vpdpwssd,
 * KVQ__DPW256, which does both): the int16 query codes and the u16
 * weights of int_tile.h against the code bytes widened to int16. On Zen 5
 * the VNNI copy's vpdpwssd measured 7-9% faster than two passes of
 * vpdpbusd (high bytes, then low bytes) for the keys and 4-11% for the
 * values (int8, 32k tokens, in-process A/B). KVQ__TGT is the functions'
 * target, KVQ__FN names each copy. Needs kvq__ldu32, kvq__ldu64,
 * kvq__int_pairsum8 and KVQ__UNROLL4 (simd_avx2.h) and int_tile.h. No
 * include guard on purpose.
 */

#if KVQ__VNNI /* acc + the s16 x s16 pairs of a and b in each int32 lane */
#define KVQ__I16ACC(acc, a, b) KVQ__DPW256(acc, a, b)
#else
#define KVQ__I16ACC(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif

/* Scores of 8 tokens [tb, tb + 8) of a tiled K page for 4 query rows q[r]
 * (rows past nr repeat the last one and are not stored). Integer dots per
 * query block: int8 by s16 x s16 products (KVQ__I16ACC) of the stored
 * bytes c + 128 zero-extended (4 tokens x 4 dimensions a vector, a token
 * in two int32 lanes) with the int16 codes Q, the bias -128 sum Q in the
 * even lanes first, the lane pairs added at the block's end
 * (kvq__int_pairsum8): a lane stays below 128 * 256 * 16383 + 64 * 2 * 255
 * * 16383 < 2^31 (qb <= 256); int4 (not in the VNNI copy) by the two
 * nibble planes, int16 sums of up to 4 lane steps (below
 * 4 * 2 * 2 * 15 * 127 = 30480) before madd. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_tscore_8tok)(const kvq_codec *c, const kvq__tile_plan *tp, float *out, size_t ostride,
                 const uint8_t *const *q, size_t nr, const uint8_t *page, size_t P, size_t tb,
                 const int BITS, const size_t QB, const int BPG1) {
    const size_t ng = c->ngroups, qb = QB ? QB : tp->qb, bpg = BPG1 ? 1 : c->group / qb;
    const uint8_t *sp = page + (BITS == 8 ? c->d : c->d / 2) * P;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    /* the same lines of the next page, once per line (tb % 16 == 0) */
    const uint8_t *pf = kvq__pf_next && tb % 16 == 0 ? kvq__pf_next + tb * 4 : NULL;
    __m256 F[4];
    KVQ__UNROLL4 for (int r = 0; r < 4; r++) F[r] = _mm256_setzero_ps();
    for (size_t gi = 0; gi < ng; gi++) {
        __m256 G[4];
        if (!BPG1)
            KVQ__UNROLL4 for (int r = 0; r < 4; r++) G[r] = _mm256_setzero_ps();
        for (size_t b = gi * bpg; b < (gi + 1) * bpg; b++) {
            __m256i I[4];
            if (BITS == 8) {
                __m256i IA[4], IB[4]; /* tokens tb..tb+3, tb+4..tb+7 */
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                    const int32_t bias = ((const int32_t *)(const void *)(q[r] + tp->off_bias))[b];
                    IA[r] = IB[r] = _mm256_set1_epi64x((long long)(uint32_t)bias);
                }
                for (size_t k = b * qb / 4; k < (b + 1) * qb / 4; k++) {
                    if (pf)
                        _mm_prefetch((const char *)(pf + k * P * 4), _MM_HINT_T0);
                    const uint8_t *kp = page + (k * P + tb) * 4;
                    const __m256i A = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)kp));
                    const __m256i B = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(kp + 16)));
                    KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                        const __m256i qv = _mm256_set1_epi64x((long long)kvq__ldu64(q[r] + 8 * k));
                        IA[r] = KVQ__I16ACC(IA[r], A, qv);
                        IB[r] = KVQ__I16ACC(IB[r], B, qv);
                    }
                }
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) I[r] = kvq__int_pairsum8(IA[r], IB[r]);
            } else {
                __m256i S[4];
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) S[r] = _mm256_setzero_si256();
                for (size_t k = b * qb / 8; k < (b + 1) * qb / 8; k++) {
                    if (pf)
                        _mm_prefetch((const char *)(pf + k * P * 4), _MM_HINT_T0);
                    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(page + (k * P + tb) * 4));
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                        __m256i ql = _mm256_set1_epi32((int)kvq__ldu32(q[r] + 8 * k));
                        __m256i qh = _mm256_set1_epi32((int)kvq__ldu32(q[r] + 8 * k + 4));
                        S[r] = _mm256_add_epi16(S[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, ql),
                                                                       _mm256_maddubs_epi16(hi, qh)));
                    }
                }
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) I[r] = _mm256_madd_epi16(S[r], ones);
            }
            KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                const float *beta = (const float *)(const void *)(q[r] + tp->off_beta);
                G[r] = BPG1 ? _mm256_mul_ps(_mm256_cvtepi32_ps(I[r]), _mm256_broadcast_ss(beta + b))
                            : _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_broadcast_ss(beta + b), G[r]);
            }
        }
        if (pf) { /* the group's scales (and minima) in the next page */
            _mm_prefetch((const char *)(kvq__pf_next + (sp - page) + 2 * (gi * P + tb)), _MM_HINT_T0);
            if (BITS != 8)
                _mm_prefetch((const char *)(kvq__pf_next + (sp - page) + 2 * ((ng + gi) * P + tb)),
                             _MM_HINT_T0);
        }
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sp + 2 * (gi * P + tb))));
        KVQ__UNROLL4 for (int r = 0; r < 4; r++) F[r] = _mm256_fmadd_ps(G[r], s, F[r]);
        if (BITS != 8) {
            const __m256 m = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(const void *)(sp + 2 * ((ng + gi) * P + tb))));
            KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                const float *qs = (const float *)(const void *)(q[r] + tp->off_qsum);
                F[r] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(qs + gi), F[r]);
            }
        }
    }
    for (size_t r = 0; r < nr; r++)
        _mm256_storeu_ps(out + r * ostride + tb, F[r]);
}

KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_tscore_body)(const kvq_codec *c, float *out, size_t ostride, const void *qp, size_t nq,
                     const uint8_t *page, size_t P, const int BITS) {
    kvq__tile_plan tp;
    kvq__tile_plan_make(c, &tp);
    const size_t qs = c->tqp_bytes;
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t nr = KVQ__MIN(4, nq - i0);
        const uint8_t *q[4];
        for (size_t r = 0; r < 4; r++)
            q[r] = (const uint8_t *)qp + (i0 + KVQ__MIN(r, nr - 1)) * qs;
        if (tp.qb == 32 && c->group == 32) /* int4:g=32, int8:g=32 */
            for (size_t tb = 0; tb < P; tb += 8)
                KVQ__FN(kvq__int_tscore_8tok)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P, tb, BITS, 32, 1);
        else if (tp.qb == 32)
            for (size_t tb = 0; tb < P; tb += 8)
                KVQ__FN(kvq__int_tscore_8tok)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P, tb, BITS, 32, 0);
        else if (tp.qb == c->group) /* one block per group (int8, g <= 256) */
            for (size_t tb = 0; tb < P; tb += 8)
                KVQ__FN(kvq__int_tscore_8tok)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P, tb, BITS, 0, 1);
        else
            for (size_t tb = 0; tb < P; tb += 8)
                KVQ__FN(kvq__int_tscore_8tok)(c, &tp, out + i0 * ostride, ostride, q, nr, page, P, tb, BITS, 0, 0);
    }
}

KVQ__TGT static void KVQ__FN(kvq__int_tscore8)(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                  size_t nq, const uint8_t *page, size_t P) {
    KVQ__FN(kvq__int_tscore_body)(c, out, ostride, qp, nq, page, P, 8);
}
#if !KVQ__VNNI /* int4: maddubs sums 4 steps in int16, as many products per op as vpdpbusd */
KVQ__TGT static void KVQ__FN(kvq__int_tscore4)(const kvq_codec *c, float *out, size_t ostride, const void *qp,
                                  size_t nq, const uint8_t *page, size_t P) {
    KVQ__FN(kvq__int_tscore_body)(c, out, ostride, qp, nq, page, P, 4);
}
#endif

static const float KVQ__FN(kvq__int_zeros)[KVQ__TILE_RUN];

/* One run of n tokens (n % 16 == 0, n <= KVQ__TILE_RUN) whose blocks of 16
 * tokens start at cb[j] (each in its own page: taccum_run) for 4 weight
 * rows, 8 dimensions at a time, then acc += alpha * sum (+ msum for int4)
 * once for the run, for the rows with a[r] set. int8: s16 x s16 products
 * (KVQ__I16ACC) of the codes sign-extended (4 dimensions x 4 tokens a
 * vector, a dimension in two int32 lanes) with the u16 weights 0..32767
 * (U16, int_tile.h), the lane pairs added at the run's end
 * (kvq__int_pairsum8); int32 sums below 64 * 32767 * 127 < 2^31. int4
 * (not in the VNNI copy): maddubs(wq u8, code s8),
 * wq 0..255 times c - 8 (-8..7); an int16
 * lane of S sums, per block j of 16 tokens, 2 halves b (8 tokens) x 2
 * maddubs (lo, hi nibbles) x 2 tokens (one pair), and S takes 2 blocks
 * (j0, j0 + 1) before madd to int32: 16 products, |S| <= 16 * 255 * 8 =
 * 32640 < 32767 (no maddubs saturation: 2 * 255 * 8); int32 sums of the
 * run below 64 * 255 * 8. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_taccum_run)(const kvq_codec *c, float *const *a, const uint8_t *const *cb, size_t nrt,
                    const uint8_t (*wq)[KVQ__WQ_ROW], const float *al,
                    const float *ms, const int BITS, const size_t NN, const size_t GG) {
    const size_t d = c->d, g = GG ? GG : c->group, ng = c->ngroups, n = NN ? NN : nrt;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    for (size_t dc = 0, gi = 0, left = g; dc < d; dc += 8) {
        __m256i I[4];
        KVQ__UNROLL4 for (int r = 0; r < 4; r++) I[r] = _mm256_setzero_si256();
        if (BITS == 8) {
            __m256i IA[4], IB[4]; /* dimensions dc..dc+3, dc+4..dc+7 */
            KVQ__UNROLL4 for (int r = 0; r < 4; r++) IA[r] = IB[r] = _mm256_setzero_si256();
            for (size_t j = 0; j < n / 16; j++) {
                const uint8_t *cp = cb[j] + dc * 4;
                const uint8_t *wj = wq[0] + 2 * (gi * n + 16 * j);
                KVQ__UNROLL4 for (size_t b = 0; b < 4; b++) {
                    if (kvq__pf_delta && dc % 16 == 0) /* the line in the next head's area */
                        _mm_prefetch((const char *)(cp + b * d * 4 + kvq__pf_delta), _MM_HINT_T0);
                    const uint8_t *vp = cp + b * d * 4;
                    const __m256i A = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)vp));
                    const __m256i B = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(vp + 16)));
                    KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                        const __m256i wv = _mm256_set1_epi64x((long long)kvq__ldu64(wj + (size_t)r * sizeof wq[0] + 8 * b));
                        IA[r] = KVQ__I16ACC(IA[r], A, wv);
                        IB[r] = KVQ__I16ACC(IB[r], B, wv);
                    }
                }
            }
            KVQ__UNROLL4 for (int r = 0; r < 4; r++) I[r] = kvq__int_pairsum8(IA[r], IB[r]);
        } else {
            const __m256i e8 = _mm256_set1_epi8(8);
            for (size_t j0 = 0; j0 < n / 16; j0 += 2) { /* 16 tokens per int16 lane of S */
                __m256i S[4];
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) S[r] = _mm256_setzero_si256();
                for (size_t j = j0; j < j0 + 2 && j < n / 16; j++) {
                    const uint8_t *cp = cb[j] + dc * 4;
                    const uint8_t *wj = wq[0] + gi * n + 16 * j;
                    KVQ__UNROLL4 for (size_t b = 0; b < 2; b++) {
                        if (kvq__pf_delta && dc % 16 == 0) /* the line in the next head's area */
                            _mm_prefetch((const char *)(cp + b * d * 4 + kvq__pf_delta), _MM_HINT_T0);
                        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(cp + b * d * 4));
                        /* the codes as c - 8 (s8) */
                        __m256i lo = _mm256_sub_epi8(_mm256_and_si256(v, m4), e8);
                        __m256i hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), e8);
                        KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
                            const uint8_t *wp = wj + (size_t)r * sizeof wq[0] + 8 * b;
                            __m256i wl = _mm256_set1_epi32((int)kvq__ldu32(wp));
                            __m256i wh = _mm256_set1_epi32((int)kvq__ldu32(wp + 4));
                            S[r] = _mm256_add_epi16(S[r], _mm256_add_epi16(_mm256_maddubs_epi16(wl, lo),
                                                                           _mm256_maddubs_epi16(wh, hi)));
                        }
                    }
                }
                KVQ__UNROLL4 for (int r = 0; r < 4; r++) I[r] =
                    _mm256_add_epi32(I[r], _mm256_madd_epi16(S[r], ones));
            }
        }
        KVQ__UNROLL4 for (int r = 0; r < 4; r++) {
            if (!a[r])
                continue;
            const size_t k = (size_t)r * ng + gi;
            __m256 x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]), _mm256_broadcast_ss(al + k),
                                       _mm256_loadu_ps(a[r] + dc));
            if (BITS != 8)
                x = _mm256_add_ps(x, _mm256_broadcast_ss(ms + k));
            _mm256_storeu_ps(a[r] + dc, x);
        }
        if ((left -= 8) == 0) {
            gi++;
            left = g;
        }
    }
}

/* One run of n tokens (see kvq__int_run_blocks) for every row, by 4: one
 * rounding of the weights (row i's at w + i * wstride, contiguous), one
 * integer sum over the run, one conversion into acc. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_taccum_run1)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                     size_t wstride, size_t nq, const uint8_t *const *pages, size_t P, size_t t0,
                     size_t n, const int BITS) {
    _Alignas(32) uint8_t wq[4][KVQ__WQ_ROW];
    _Alignas(32) float al[4 * KVQ__MAX_HEAD_DIM / 8 + 8], ms[4 * KVQ__MAX_HEAD_DIM / 8 + 8];
    const uint8_t *sb[KVQ__TILE_RUN / 16], *cb[KVQ__TILE_RUN / 16];
    kvq__int_run_blocks(c, pages, P, t0, n, sb, cb);
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t nr = KVQ__MIN(4, nq - i0);
        float *a[4] = {NULL, NULL, NULL, NULL};
        const float *wr[4];
        for (size_t r = 0; r < 4; r++)
            wr[r] = r < nr ? w + (i0 + r) * wstride : KVQ__FN(kvq__int_zeros);
        const unsigned ok = kvq__int_wquant4_avx2(c, sb, P, n, wr, wq, al, ms,
                                                  BITS != 8 ? KVQ__WQ_U8 : KVQ__WQ_U16);
        kvq__tile_run_rows(c, ok, nr, acc + i0 * astride, astride, wr, wq, pages, P, t0, n, a);
        const uint8_t(*wc)[KVQ__WQ_ROW] = (const uint8_t(*)[KVQ__WQ_ROW])wq;
        if (n == KVQ__TILE_RUN && c->group == 32) /* runs of 4 pages of 16, int4:g=32 */
            KVQ__FN(kvq__int_taccum_run)(c, a, cb, n, wc, al, ms, BITS, KVQ__TILE_RUN, 32);
        else if (n == KVQ__TILE_RUN)
            KVQ__FN(kvq__int_taccum_run)(c, a, cb, n, wc, al, ms, BITS, KVQ__TILE_RUN, 0);
        else
            KVQ__FN(kvq__int_taccum_run)(c, a, cb, n, wc, al, ms, BITS, 0, 0);
    }
}

/* taccum: one page, runs of up to KVQ__TILE_RUN tokens within it. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_taccum_body)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                     size_t wstride, size_t nq, const uint8_t *page, size_t P, const int BITS) {
    for (size_t t0 = 0; t0 < P; t0 += KVQ__TILE_RUN)
        KVQ__FN(kvq__int_taccum_run1)(c, acc, astride, w + t0, wstride, nq, &page, P, t0,
                             KVQ__MIN(KVQ__TILE_RUN, P - t0), BITS);
}

KVQ__TGT static void KVQ__FN(kvq__int_taccum8)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                  size_t wstride, size_t nq, const uint8_t *page, size_t P) {
    KVQ__FN(kvq__int_taccum_body)(c, acc, astride, w, wstride, nq, page, P, 8);
}
#if !KVQ__VNNI
KVQ__TGT static void KVQ__FN(kvq__int_taccum4)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                                  size_t wstride, size_t nq, const uint8_t *page, size_t P) {
    KVQ__FN(kvq__int_taccum_body)(c, acc, astride, w, wstride, nq, page, P, 4);
}
#endif

/* taccum_run: runs of whole pages, KVQ__TILE_RUN / P of them (P <= 64),
 * else page by page as taccum. */
KVQ__TGT static inline __attribute__((always_inline)) void
KVQ__FN(kvq__int_taccum_pages)(const kvq_codec *c, float *acc, size_t astride, const float *w,
                      size_t wstride, size_t nq, const uint8_t *const *pages, size_t np, size_t P,
                      const int BITS) {
    if (P > KVQ__TILE_RUN) {
        for (size_t i = 0; i < np; i++)
#if KVQ__VNNI
            KVQ__FN(kvq__int_taccum8)(c, acc, astride, w + i * P, wstride, nq, pages[i], P);
#else
            (BITS == 8 ? KVQ__FN(kvq__int_taccum8) : KVQ__FN(kvq__int_taccum4))(c, acc, astride, w + i * P,
                                                                         wstride, nq, pages[i], P);
#endif
        return;
    }
    const size_t R = KVQ__TILE_RUN / P;
    for (size_t i = 0; i < np; i += R)
        KVQ__FN(kvq__int_taccum_run1)(c, acc, astride, w + i * P, wstride, nq, pages + i, P, 0,
                             KVQ__MIN(R, np - i) * P, BITS);
}
KVQ__TGT static void KVQ__FN(kvq__int_taccum_run8)(const kvq_codec *c, float *acc, size_t astride,
                                      const float *w, size_t wstride, size_t nq,
                                      const uint8_t *const *pages, size_t np, size_t P) {
    KVQ__FN(kvq__int_taccum_pages)(c, acc, astride, w, wstride, nq, pages, np, P, 8);
}
#if !KVQ__VNNI
KVQ__TGT static void KVQ__FN(kvq__int_taccum_run4)(const kvq_codec *c, float *acc, size_t astride,
                                      const float *w, size_t wstride, size_t nq,
                                      const uint8_t *const *pages, size_t np, size_t P) {
    KVQ__FN(kvq__int_taccum_pages)(c, acc, astride, w, wstride, nq, pages, np, P, 4);
}
#endif

#undef KVQ__I16ACC
