/*
 * tq_avx512.c - AVX-512 kernels of the TurboQuant family's tiled pages
 * (layout and error bound: tq.c, "Tiled pages"; simd_avx512.h says how this
 * file is built natively and through SIMDe). tq1..tq4, head_dim % 16 == 0.
 *
 * One unit of 64 index slots (8 kb bytes) decodes into one zmm of 64
 * indices: the fields leave their planes with one shift per 64-bit lane
 * and a mask (the bit plane of tq1/tq3 through vptestmb, tq3 adds 4 under
 * that mask), then vpshufb looks the int8 centroid codes up in the 16-byte
 * codebook held in a register. Every table has at most 16 entries, so
 * vpshufb (AVX512BW) serves and VBMI's vpermb would add nothing.
 *  - tscore: a 32-bit lane is one token's 4 dimensions (16 tokens per zmm);
 *    vpdpbusd multiplies the unsigned codes c8u with the group's 4 int8
 *    query codes broadcast (|code| <= 127) into int32 per token; 4 query
 *    rows share each decoded unit, two accumulators per row.
 *  - taccum: a 32-bit lane is one dimension of 4 tokens; vpdpbusd
 *    multiplies the 4 tokens' weights (u8, <= 255, broadcast) with the
 *    signed codes c8 into int32 per dimension, 4 rows x 64 dimensions in 16
 *    registers over the page, converted and scaled once per page.
 *  - taccum_run: the same over a run of np pages: the weights of a row are
 *    rounded once over the run's np * P tokens (per segment of up to
 *    KVQ__TQ_TSEG512 tokens, page after page) and the strip loop runs over
 *    the pages of the segment into the same int32 registers, converted and
 *    scaled once per run (per segment). taccum is the run of one page.
 * Without VNNI the same kernels use vpmaddubsw + vpmaddwd (query codes
 * <= 63, weights <= 127: the int16 pair sums cannot saturate).
 *
 * The kernel bodies are compiled twice, for VNNI and for AVX512BW: this
 * file includes itself once per variant (KVQ__TQ512_PASS), because a
 * function may only inline intrinsics of its own target.
 */
#ifndef KVQ__TQ512_PASS
#include "../kernels.h"
#include "../../codec/tq_impl.h"
#include "simd_avx512.h"

#include <float.h>

#define KVQ__AI512 static inline __attribute__((always_inline))
#define KVQ__UNROLL _Pragma("GCC unroll 4")

/* vpmaddwd (SIMDe 0.7.4's native alias of it takes 4 arguments) */
#ifdef KVQ_SIMDE
#define KVQ__MADD512(a, b) simde_mm512_madd_epi16((a), (b))
#else
#define KVQ__MADD512(a, b) _mm512_madd_epi16((a), (b))
#endif

/* The 64 indices of the unit at u (kb bits each), slot s in byte s. */
KVQ__T512 KVQ__AI512 __m512i kvq__tq_tidx64(const uint8_t *u, int kb) {
    if (kb == 4) { /* slot s: nibble s / 32 of byte s % 32 */
        __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)u));
        x = _mm512_srlv_epi64(x, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4));
        return _mm512_and_si512(x, _mm512_set1_epi8(15));
    }
    __m512i r = _mm512_setzero_si512();
    if (kb >= 2) { /* slot s: bits 2 (s / 16) of byte s % 16 */
        __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)u));
        x = _mm512_srlv_epi64(x, _mm512_setr_epi64(0, 0, 2, 2, 4, 4, 6, 6));
        r = _mm512_and_si512(x, _mm512_set1_epi8(3));
    }
    if (kb & 1) { /* slot s: bit s / 8 of byte s % 8 */
        uint64_t w;
        memcpy(&w, u + (kb == 3 ? 16 : 0), 8);
        const __m512i pat = _mm512_setr_epi64(0x0101010101010101ll, 0x0202020202020202ll, 0x0404040404040404ll,
                                              0x0808080808080808ll, 0x1010101010101010ll, 0x2020202020202020ll,
                                              0x4040404040404040ll, (long long)0x8080808080808080ull);
        __mmask64 k = _mm512_test_epi8_mask(_mm512_set1_epi64((long long)w), pat);
        r = kb == 3 ? _mm512_mask_add_epi8(r, k, r, _mm512_set1_epi8(4)) : _mm512_maskz_mov_epi8(k, _mm512_set1_epi8(1));
    }
    return r;
}

/* Largest lane of x. */
KVQ__T512 KVQ__AI512 float kvq__tq_hmax512(__m512 x) {
    __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

/* kvq__tq_wquant (tq_impl.h) inlined, n a multiple of 16: the same
 * arithmetic (w * nrm, one product by wmax / max, round to nearest even,
 * here as the low byte of x + 1.5 * 2^23, exact for 0 <= x <= 255.5). */
KVQ__T512 KVQ__AI512 int kvq__tq_wquant512(const float *w, const float *nrm, size_t n, int wmax,
                                           uint8_t *code, float *scale) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (size_t k = 0; k < n; k += 16) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(nrm + k));
        bad = (__mmask16)(bad | _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NGE_UQ) |
                          _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ));
        mx = _mm512_max_ps(mx, a);
    }
    if (bad)
        return 0;
    const float m = kvq__tq_hmax512(mx);
    if (m == 0.0f) {
        memset(code, 0, n);
        *scale = 0.0f;
        return 1;
    }
    /* below 2^-100, wmax / m could overflow: scale by 2^100 first (exact) */
    const float ps = m < 0x1p-100f ? 0x1p100f : 1.0f, ms = m * ps;
    const __m512 inv = _mm512_set1_ps((float)wmax / ms), magic = _mm512_set1_ps(12582912.0f), vps = _mm512_set1_ps(ps);
    /* byte 0 of each dword to dword 0 of its 128-bit lane, then those together */
    const __m512i sh = _mm512_set4_epi32(-1, -1, -1, 0x0c080400);
    const __m512i pm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (size_t k = 0; k < n; k += 16) {
        __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(nrm + k)), vps), inv);
        __m512i b = _mm512_shuffle_epi8(_mm512_castps_si512(_mm512_add_ps(a, magic)), sh);
        b = _mm512_permutexvar_epi32(pm, b);
        _mm_storeu_si128((__m128i *)(void *)(code + k), _mm512_castsi512_si128(b));
    }
    *scale = ms / (float)wmax * (1.0f / ps);
    return 1;
}

static inline int32_t kvq__tq_ld32s(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Tokens of a page, or of a run of pages, handled with one weight scale per
 * row (as tq_avx2.c). It bounds the int32 sums of a dimension: |sum_k
 * code_k c8_k| <= 256 * 255 * 127 < 2^23 with vpdpbusd (codes <= 255),
 * 256 * 127 * 127 < 2^22 with vpmaddubsw (codes <= 127; its int16 pair
 * sums stay within 2 * 127 * 127 < 2^15), whatever the run's length: no
 * overflow, and the conversion to float is exact. */
#define KVQ__TQ_TSEG512 256
_Static_assert(KVQ__TQ_TSEG512 <= 16 * KVQ__TQ_TPIECES, "segment pieces");

/* ---- VNNI variant ---- */
#define KVQ__TQ512_PASS 1
#define KVQ__TGT KVQ__T512VNNI
#define KVQ__SFX(name) name##_vnni
#define KVQ__DOT(acc, a, b) _mm512_dpbusd_epi32((acc), (a), (b))
#define KVQ__QMAX KVQ__TQ_Q_VNNI
#define KVQ__WMAX KVQ__TQ_W_VNNI
#include "tq_avx512.c"
#undef KVQ__TQ512_PASS
#undef KVQ__TGT
#undef KVQ__SFX
#undef KVQ__DOT
#undef KVQ__QMAX
#undef KVQ__WMAX

/* ---- AVX512BW variant ---- */
#define KVQ__TQ512_PASS 2
#define KVQ__TGT KVQ__T512
#define KVQ__SFX(name) name##_bw
#define KVQ__DOT(acc, a, b)                                                                        \
    _mm512_add_epi32((acc), KVQ__MADD512(_mm512_maddubs_epi16((a), (b)), _mm512_set1_epi16(1)))
#define KVQ__QMAX KVQ__TQ_Q_MADD
#define KVQ__WMAX KVQ__TQ_W_MADD
#include "tq_avx512.c"
#undef KVQ__TQ512_PASS

void KVQ__SEL512(kvq__tq_avx512_select)(kvq_codec *c, unsigned feat) {
    if (!c->tiled || c->d % 16 != 0)
        return;
    if (feat & KVQ__X512_VNNI) {
        c->k.tprep = kvq__tq_tprep512_vnni;
        c->k.tscore = kvq__tq_tscore512_vnni;
        c->k.taccum = kvq__tq_taccum512_vnni;
        c->k.taccum_run = kvq__tq_taccum_run512_vnni;
    } else {
        c->k.tprep = kvq__tq_tprep512_bw;
        c->k.tscore = kvq__tq_tscore512_bw;
        c->k.taccum = kvq__tq_taccum512_bw;
        c->k.taccum_run = kvq__tq_taccum_run512_bw;
    }
    c->tqp_bytes = KVQ__TQ_TQ_CODES + kvq__round64(c->d);
    c->pf_tscore = 1;
}

#else /* KVQ__TQ512_PASS: the kernels of one variant */

static void KVQ__SFX(kvq__tq_tprep512)(const kvq_codec *c, void *qp, const float *q) {
    kvq__tq_tprep_q(c, qp, q, KVQ__QMAX);
}

/* R (1, 2 or 4) query rows against the 16 keys of one token block: int32
 * sums of code_j c8u[idx_j] per token. Named accumulators (two chains per
 * row: even and odd groups) keep GCC from copying them around the loop. */
KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_tsblk)(const uint8_t *units, size_t ng, const __m512i tab,
                                                 const int8_t *const *q, __m512i *f, int kb, const int R,
                                                 const uint8_t *pf) {
    const size_t ub = 8 * (size_t)kb;
    const int8_t *q0 = q[0], *q1 = q[R > 1 ? 1 : 0], *q2 = q[R > 2 ? 2 : 0], *q3 = q[R > 3 ? 3 : 0];
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t g = 0; g < ng; g += 2) { /* ng = d / 4 is a multiple of 4 */
        const uint8_t *u = units + g * ub;
        if (pf) /* the same bytes of the next page */
            _mm_prefetch((const char *)(pf + g * ub), _MM_HINT_T0);
        const __m512i x = _mm512_shuffle_epi8(tab, kvq__tq_tidx64(u, kb));
        const __m512i y = _mm512_shuffle_epi8(tab, kvq__tq_tidx64(u + ub, kb));
        a0 = KVQ__DOT(a0, x, _mm512_set1_epi32(kvq__tq_ld32s(q0 + 4 * g)));
        b0 = KVQ__DOT(b0, y, _mm512_set1_epi32(kvq__tq_ld32s(q0 + 4 * g + 4)));
        if (R > 1) {
            a1 = KVQ__DOT(a1, x, _mm512_set1_epi32(kvq__tq_ld32s(q1 + 4 * g)));
            b1 = KVQ__DOT(b1, y, _mm512_set1_epi32(kvq__tq_ld32s(q1 + 4 * g + 4)));
        }
        if (R > 2) {
            a2 = KVQ__DOT(a2, x, _mm512_set1_epi32(kvq__tq_ld32s(q2 + 4 * g)));
            b2 = KVQ__DOT(b2, y, _mm512_set1_epi32(kvq__tq_ld32s(q2 + 4 * g + 4)));
            a3 = KVQ__DOT(a3, x, _mm512_set1_epi32(kvq__tq_ld32s(q3 + 4 * g)));
            b3 = KVQ__DOT(b3, y, _mm512_set1_epi32(kvq__tq_ld32s(q3 + 4 * g + 4)));
        }
    }
    f[0] = _mm512_add_epi32(a0, b0);
    f[1] = _mm512_add_epi32(a1, b1);
    f[2] = _mm512_add_epi32(a2, b2);
    f[3] = _mm512_add_epi32(a3, b3);
}

/* Scores of the R rows for the 16 tokens of block f (int32 sums). */
KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_tsout)(const kvq__tq *t, const uint8_t *page, size_t tb, const __m512i *f,
                                                 const __m512i *corr, const __m512 *sc, float *out, size_t ostride,
                                                 size_t m) {
    float nrm[16];
    kvq__tq_tnorms(t, page, tb, 16, nrm);
    const __m512 nv = _mm512_loadu_ps(nrm);
    for (size_t r = 0; r < m; r++) {
        /* sum - corr = sum_j code_j c8[idx_j], |.| < 127 * 127 d < 2^24: exact */
        __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(f[r], corr[r]));
        _mm512_storeu_ps(out + r * ostride + tb, _mm512_mul_ps(_mm512_mul_ps(v, sc[r]), nv));
    }
}

KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_tscore_kb)(const kvq_codec *c, float *out, size_t ostride,
                                                     const void *qp, size_t nq, const uint8_t *page,
                                                     size_t P, int kb) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t qs = c->tqp_bytes, ng = c->d / 4, ubb = ng * 8 * (size_t)kb;
    const uint8_t *units = page + P * t->nb;
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)t->c8u));
    for (size_t i0 = 0; i0 < nq; i0 += 4) {
        const size_t m = KVQ__MIN(4, nq - i0);
        const int8_t *q[4];
        __m512 sc[4];
        __m512i corr[4];
        for (size_t r = 0; r < 4; r++) {
            const uint8_t *p = (const uint8_t *)qp + (i0 + (r < m ? r : 0)) * qs;
            const kvq__tq_tqh *hd = (const kvq__tq_tqh *)(const void *)p;
            q[r] = (const int8_t *)(p + KVQ__TQ_TQ_CODES);
            sc[r] = _mm512_set1_ps(hd->sc);
            corr[r] = _mm512_set1_epi32(hd->corr);
        }
        /* one block at a time: the page streams in order (two blocks side by side
         * share the query loads but read two streams, slower from memory) */
        for (size_t tb = 0; tb < P; tb += 16) {
            __m512i f[4];
            const uint8_t *u = units + (tb / 16) * ubb;
            const uint8_t *pf = kvq__pf_next && i0 == 0 ? kvq__pf_next + (u - page) : NULL;
            if (pf && tb == 0)
                for (size_t o = 0; o < P * t->nb; o += 64)
                    _mm_prefetch((const char *)(kvq__pf_next + o), _MM_HINT_T0);
            if (m > 2)
                KVQ__SFX(kvq__tq_tsblk)(u, ng, tab, q, f, kb, 4, pf);
            else if (m == 2)
                KVQ__SFX(kvq__tq_tsblk)(u, ng, tab, q, f, kb, 2, pf);
            else
                KVQ__SFX(kvq__tq_tsblk)(u, ng, tab, q, f, kb, 1, pf);
            KVQ__SFX(kvq__tq_tsout)(t, page, tb, f, corr, sc, out + i0 * ostride, ostride, m);
        }
    }
}

KVQ__TGT static void KVQ__SFX(kvq__tq_tscore512)(const kvq_codec *c, float *out, size_t ostride,
                                                 const void *qp, size_t nq, const uint8_t *page, size_t P) {
    switch (((const kvq__tq *)c->state)->kb) {
    case 1:
        KVQ__SFX(kvq__tq_tscore_kb)(c, out, ostride, qp, nq, page, P, 1);
        break;
    case 2:
        KVQ__SFX(kvq__tq_tscore_kb)(c, out, ostride, qp, nq, page, P, 2);
        break;
    case 3:
        KVQ__SFX(kvq__tq_tscore_kb)(c, out, ostride, qp, nq, page, P, 3);
        break;
    default:
        KVQ__SFX(kvq__tq_tscore_kb)(c, out, ostride, qp, nq, page, P, 4);
        break;
    }
}

/* R rows, H (4 or 1) blocks of 16 dimensions from h0: a[r] += fs[r] *
 * sum over the quads of the pieces pc[0..npc) (nquad quads each, their
 * units nh apart) weighted by wq[r] (4 u8 per quad, the pieces' quads one
 * after the other): the int32 sums run over every piece (the pages of a
 * run) in the same registers and are converted and scaled once. */
KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_tablk)(const kvq__tq_tpiece *pc, size_t npc, size_t nh, size_t h0,
                                                 const __m512i tab, const uint8_t (*wq)[KVQ__TQ_TSEG512],
                                                 float *const *a, const float *fs, int kb, const int R,
                                                 const int H) {
    const size_t ub = 8 * (size_t)kb, qb = nh * ub;
    __m512i x[4][4];
    KVQ__UNROLL for (int r = 0; r < R; r++)
        KVQ__UNROLL for (int hh = 0; hh < H; hh++)
            x[r][hh] = _mm512_setzero_si512();
    size_t wo = 0; /* offset of the quad's 4 codes in wq[r] */
    for (size_t pi = 0; pi < npc; pi++) {
        const uint8_t *u = pc[pi].units + h0 * ub;
        const size_t nquad = pc[pi].nquad;
        for (size_t qd = 0; qd < nquad; qd++, u += qb, wo += 4) {
            if (kvq__pf_delta && h0 == 0) /* the quad in the next head's area */
                for (size_t o = 0; o < qb; o += 64)
                    _mm_prefetch((const char *)(u + kvq__pf_delta + o), _MM_HINT_T0);
            __m512i wb[4];
            KVQ__UNROLL for (int r = 0; r < R; r++)
                wb[r] = _mm512_set1_epi32(kvq__tq_ld32s(wq[r] + wo));
            KVQ__UNROLL for (int hh = 0; hh < H; hh++) {
                __m512i cv = _mm512_shuffle_epi8(tab, kvq__tq_tidx64(u + (size_t)hh * ub, kb));
                KVQ__UNROLL for (int r = 0; r < R; r++)
                    x[r][hh] = KVQ__DOT(x[r][hh], wb[r], cv);
            }
        }
    }
    KVQ__UNROLL for (int r = 0; r < R; r++) {
        if (!a[r])
            continue;
        const __m512 s = _mm512_set1_ps(fs[r]);
        KVQ__UNROLL for (int hh = 0; hh < H; hh++) {
            float *o = a[r] + 16 * (h0 + (size_t)hh);
            /* |x| < 2^23 (KVQ__TQ_TSEG512 above): the conversion is exact */
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(x[r][hh]), s, _mm512_loadu_ps(o)));
        }
    }
}

KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_taccum_rows)(const kvq__tq_tpiece *pc, size_t npc, size_t nh,
                                                       const __m512i tab, const uint8_t (*wq)[KVQ__TQ_TSEG512],
                                                       float *const *a, const float *fs, int kb, const int R) {
    size_t h = 0;
    for (; h + 4 <= nh; h += 4)
        KVQ__SFX(kvq__tq_tablk)(pc, npc, nh, h, tab, wq, a, fs, kb, R, 4);
    for (; h < nh; h++)
        KVQ__SFX(kvq__tq_tablk)(pc, npc, nh, h, tab, wq, a, fs, kb, R, 1);
}

/* taccum over the run of np pages (np = 1: one page), in segments of the
 * run's np * P tokens (page after page) of up to KVQ__TQ_TSEG512: one
 * weight scale per row and segment, one conversion per segment. */
KVQ__TGT KVQ__AI512 void KVQ__SFX(kvq__tq_taccum_kb)(const kvq_codec *c, float *acc, size_t astride,
                                                     const float *w, size_t wstride, size_t nq,
                                                     const uint8_t *const *pages, size_t np, size_t P,
                                                     int kb, const int one) {
    const kvq__tq *t = (const kvq__tq *)c->state;
    const size_t nh = c->d / 16, qb = nh * 8 * (size_t)kb; /* bytes of a quad's units */
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)t->c8));
    float nrm[KVQ__TQ_TSEG512];
    uint8_t wq[4][KVQ__TQ_TSEG512];
    kvq__tq_tpiece pc[KVQ__TQ_TPIECES];
    const size_t N = np * P;
    for (size_t s0 = 0; s0 < N; s0 += KVQ__TQ_TSEG512) {
        const size_t sn = KVQ__MIN((size_t)KVQ__TQ_TSEG512, N - s0);
        size_t npc = 1;
        if (one) /* taccum (np = 1): npc a constant in the loops */
            kvq__tq_tpiece_set(t, pages[0], 0, P, qb, s0, sn, pc, nrm);
        else
            npc = kvq__tq_tpieces(t, pages, P, qb, s0, sn, pc, nrm);
        for (size_t i0 = 0; i0 < nq; i0 += 4) {
            const size_t m = KVQ__MIN(4, nq - i0);
            float *a[4] = {NULL, NULL, NULL, NULL};
            float fs[4] = {0, 0, 0, 0};
            int any = 0;
            for (size_t r = 0; r < 4; r++) {
                float sw;
                const float *wr = w + (i0 + r) * wstride;
                if (r >= m) {
                    memset(wq[r], 0, sn);
                } else if (kvq__tq_wquant512(wr + s0, nrm, sn, KVQ__WMAX, wq[r], &sw)) {
                    a[r] = acc + (i0 + r) * astride;
                    fs[r] = sw * t->c8_scale;
                    any = 1;
                } else {
                    memset(wq[r], 0, sn);
                    kvq__tq_tpieces_exact(c, acc + (i0 + r) * astride, wr, pc, npc, P);
                }
            }
            if (!any)
                continue;
            if (m > 2)
                KVQ__SFX(kvq__tq_taccum_rows)(pc, npc, nh, tab, wq, a, fs, kb, 4);
            else if (m == 2)
                KVQ__SFX(kvq__tq_taccum_rows)(pc, npc, nh, tab, wq, a, fs, kb, 2);
            else
                KVQ__SFX(kvq__tq_taccum_rows)(pc, npc, nh, tab, wq, a, fs, kb, 1);
        }
    }
}

KVQ__TGT static void KVQ__SFX(kvq__tq_taccum_run512)(const kvq_codec *c, float *acc, size_t astride,
                                                     const float *w, size_t wstride, size_t nq,
                                                     const uint8_t *const *pages, size_t np, size_t P) {
    switch (((const kvq__tq *)c->state)->kb) {
    case 1:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, np, P, 1, 0);
        break;
    case 2:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, np, P, 2, 0);
        break;
    case 3:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, np, P, 3, 0);
        break;
    default:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, np, P, 4, 0);
        break;
    }
}

KVQ__TGT static void KVQ__SFX(kvq__tq_taccum512)(const kvq_codec *c, float *acc, size_t astride,
                                                 const float *w, size_t wstride, size_t nq,
                                                 const uint8_t *page, size_t P) {
    const uint8_t *const pages[1] = {page};
    switch (((const kvq__tq *)c->state)->kb) {
    case 1:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, 1, P, 1, 1);
        break;
    case 2:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, 1, P, 2, 1);
        break;
    case 3:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, 1, P, 3, 1);
        break;
    default:
        KVQ__SFX(kvq__tq_taccum_kb)(c, acc, astride, w, wstride, nq, pages, 1, P, 4, 1);
        break;
    }
}

#endif
