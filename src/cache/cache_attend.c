/*
 * cache_attend.c - kvq_cache_attend: attention straight over the encoded
 * pages through the codecs' fused score/accumulate kernels (online softmax
 * over blocks of pages, tiles of query rows = query tokens x the query
 * heads of a GQA group, no decoded copy of the cache), staged tokens scored
 * from their f16 rows, pre-RoPE keys rotated page by page, centred keys
 * corrected by <q, centre>. An attend that reaches the newest token then
 * updates utility scores, fixes a ratio budget, evicts to the budget and
 * settles pending tokens (the next decode step sees them encoded).
 */
#include "cache_impl.h"
#include "../kernels/kernels.h"

#include <stdatomic.h>

/* A decode step splits the pages into chunks (a function of the context
 * only, never of the number of threads), worked by any thread for every
 * head and merged in chunk order: guided, each a quarter of the pages left
 * but at least KVQ__CHUNK_MIN (the last takes what remains at the 64th),
 * so that they get smaller towards the end, where a thread that is done
 * waits for the others' last chunk. Each chunk has a cost (its state,
 * cold at first, and its fold; before its first run was prefetched, see
 * kvq__decode_pages, about 10 us in all), which rules out many small ones.
 * Against 16 equal chunks (in-process A/B, two threads): 4k tokens -7..9%,
 * 16k and 32k -2..5%; one thread even. At least 32 pages
 * (16 at first; in-process A/B: 1k tokens, one thread, -5..6%; 4k -2..7%;
 * 8k -2%; 16k and 32k -0..2%, 2k two threads f16 +4%). A step of at most
 * KVQ__SOLO_CHUNKS chunks runs on the calling thread alone: a worker asleep
 * (it polls 50 us, kvq__pool) wakes about 90 us late on a shared 2-vCPU VM and then
 * holds the caller until its chunk is done; 1k tokens, two threads,
 * int4:g=32 / int8 / f16 -14..21%, f32 -3% (as fast as one thread, where
 * two chunks had made two threads 20-30% slower than one). */
#define KVQ__MAX_CHUNKS 64
#define KVQ__CHUNK_MIN 32
#define KVQ__SOLO_CHUNKS 2
#define KVQ__CHUNK_DIV 4
#define KVQ__MAX_DECODE_HEADS 256
#define KVQ__MAX_G 256 /* query heads per KV head on the decode path; rows of a softmax call */
#define KVQ__ATTN_ROWS 64 /* rows of a kvq__attn_add call in a fold */
/* bytes of a page area prefetched ahead by the driver (the kernels of large
 * areas prefetch the rest ahead of their own reads) */
#define KVQ__PF_AREA 4096
/* A decode step prefetches a head's key area one page ahead into L1 (the
 * int and tq kernels of the AVX2 and AVX-512 paths do it themselves, line
 * by line as they read their own page: pf_tscore) and its
 * value area (read after the run's keys) into L2; when the areas hold
 * at least this many bytes (K + V of a page and head), both areas of the
 * page after go into L2 too: the L1 takes too few misses in flight to
 * stream at the memory's rate alone. Measured on Zen 4 at 32k tokens: the
 * second page int8 -20%, int4:g=32 -11%, tq4 even, tq3 (1.7 KB) +6%, hence
 * the limit; values into L2 instead of L1 int4:g=32 -10%, the others even. */
#define KVQ__PF_L2_MIN 2048

/* RoPE at position pos on one vector (pairs (2i, 2i+1), llama2.c order). */
static void kvq__rope(const kvq_cache *c, float *x, int32_t pos) {
    for (size_t i = 0; i < c->rope_dims / 2; i++) {
        float val = (float)pos * c->rope_freq[i];
        float fcr = cosf(val), fci = sinf(val);
        float v0 = x[2 * i], v1 = x[2 * i + 1];
        x[2 * i] = v0 * fcr - v1 * fci;
        x[2 * i + 1] = v0 * fci + v1 * fcr;
    }
}


/* Asks for the bytes [p, p + n) ahead of their use: the pages of a layer are
 * separate blocks, so the hardware prefetchers lose the stream at every
 * page; attention reads the next page's keys and this page's values while
 * it scores this page's keys. */
static inline void kvq__prefetch(const uint8_t *p, size_t n, int l2) {
    for (size_t o = 0; o < n; o += 64) {
        if (l2)
            __builtin_prefetch(p + o, 0, 2);
        else
            __builtin_prefetch(p + o, 0, 3);
    }
}

/* Values of one page area into acc through the head's layout and kernels. */
static inline void kvq__vaccum(const kvq__head *hd, float *acc, size_t astride, const float *wt,
                               size_t wstride, size_t nr, const uint8_t *area, size_t P,
                               uint8_t *rows) {
    const kvq_codec *vc = hd->vc;
    if (!hd->vtiled)
        vc->k.accum(vc, acc, astride, wt, wstride, nr, area, P);
    else if (vc->k.taccum)
        vc->k.taccum(vc, acc, astride, wt, wstride, nr, area, P);
    else
        kvq__tile_accum_rows(vc, &vc->k, acc, astride, wt, wstride, nr, area, P, rows);
}

/* The online-softmax state of a set of query rows: running maxima m, sums
 * l, accumulators of values in the hot and warm codecs' domains and of
 * staged (f16) values, nr rows each. */
typedef struct {
    float *m, *l, *acc, *accw, *accs;
    int any_pend;
} kvq__pstate;

/* Row r of a state's accumulators times f: the hot codec's (alen floats),
 * the warm codec's (walen, 0 when none) and the staged values' (slen, 0 when
 * none). The online softmax's rescale when a row's maximum grows. */
/* x[0..n) *= f, 8 at a time (a shape the compiler turns into vector
 * multiplies at -O2), then the rest. */
static inline void kvq__scale_floats(float *x, size_t n, float f) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x[i] *= f, x[i + 1] *= f, x[i + 2] *= f, x[i + 3] *= f;
        x[i + 4] *= f, x[i + 5] *= f, x[i + 6] *= f, x[i + 7] *= f;
    }
    for (; i < n; i++)
        x[i] *= f;
}

/* y[0..n) += x[0..n) * f, 8 at a time as kvq__scale_floats. */
static inline void kvq__axpy_floats(float *y, const float *x, size_t n, float f) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        y[i] += x[i] * f, y[i + 1] += x[i + 1] * f, y[i + 2] += x[i + 2] * f;
        y[i + 3] += x[i + 3] * f, y[i + 4] += x[i + 4] * f, y[i + 5] += x[i + 5] * f;
        y[i + 6] += x[i + 6] * f, y[i + 7] += x[i + 7] * f;
    }
    for (; i < n; i++)
        y[i] += x[i] * f;
}

static inline void kvq__pstate_scale(kvq__pstate *ps, size_t r, float f, size_t alen, size_t walen,
                                     size_t slen) {
    kvq__scale_floats(ps->acc + r * alen, alen, f);
    kvq__scale_floats(ps->accw + r * walen, walen, f);
    kvq__scale_floats(ps->accs + r * slen, slen, f);
}

/* The decode chunks of n pages (see KVQ__MAX_CHUNKS) into start (n_chunks
 * + 1 entries, the last n); returns n_chunks. */
static size_t kvq__chunks(size_t n, size_t *start) {
    size_t k = 0, p = 0;
    while (p < n) {
        const size_t left = n - p;
        size_t sz = KVQ__MAX((size_t)KVQ__CHUNK_MIN, (left + KVQ__CHUNK_DIV - 1) / KVQ__CHUNK_DIV);
        if (sz > left || k + 1 == KVQ__MAX_CHUNKS)
            sz = left;
        start[k++] = p;
        p += sz;
    }
    start[k] = n;
    return k;
}

/* Work of one attend. A decode step (one query token, QH <= rows_max):
 * item i is chunk i of the pages, worked for every head page after page
 * (kvq__decode_pages), its state in parts; fold jobs then merge the chunks
 * of each head in chunk order. Otherwise item i is KV head i (every tile and
 * page, finished in place). The items and chunks depend only on the cache,
 * the layer and the call, never on the number of threads, so the output is
 * the same with any number of threads. */
typedef struct {
    kvq_cache *c;
    kvq__layer *ly;
    const float *q;
    const int32_t *qpos;
    size_t T;
    float *out;
    float *attn;  /* [H][slots] sums of attention weights, or NULL */
    float *rawsc; /* raw scores for attn: decode: [QH][slots]; else [job][rows_max][slots] */
    size_t n_chunks, n_items, n_jobs;
    size_t cstart[KVQ__MAX_CHUNKS + 1]; /* decode: chunk i is pages [cstart[i], cstart[i + 1]) */
    atomic_size_t *next; /* the next item a job takes (jobs take items as they finish) */
    float *parts; /* decode: [n_chunks] states of part_floats each (QH rows) */
    size_t part_floats;
    int decode; /* one query token, every head's rows in one tile: items are chunks of pages
                   worked page-major for every head (kvq__decode_pages) */
    int shared_rows; /* decode with several jobs: the query rows prepared once, in work[0]
                        (kvq__attn_setup), and read by every job */
} kvq__attn_call;

/* Scores of the keys of page p for head h into sc (stride ss) for the nr
 * scaled query rows of the tile: encoded slots through the fused kernel,
 * pending slots from the f16 staging; slots that are free, or in the future
 * of a row's query (causal mask), get -inf. */
static void kvq__page_scores(kvq_cache *c, kvq__layer *ly, size_t h, size_t p, const uint8_t *cls,
                             int ne, int npd, size_t nr, kvq__work *w, float *sc, size_t ss) {
    const kvq__page *pg = &ly->pages[p];
    const kvq__head *hd = kvq__page_heads(ly, pg) + h;
    /* staging is freed once nothing waits in it: no offset from NULL */
    const uint16_t *stk = hd->kstage && pg->stage ? kvq__stage_k(pg, hd) : NULL;
    const int pw = pg->tier == KVQ__TIER_WARM && c->warm_distinct;
    const uint8_t *qpk = pw ? w->qpw : w->qpk;
    const int32_t *pos = ly->pos + p * c->P;
    size_t P = c->P, d = c->d;
    if (c->cfg.k_prerope) {
        /* decode the page's keys (one page, never the cache), add the centre
         * back, rotate each at its position, then score in float */
        for (size_t i = 0; i < P; i++) {
            float *row = w->scratch + i * d;
            if (cls[i] == KVQ__ENC) {
                if (hd->kchan_bits)
                    kvq__chan_decode_row(pg->block + hd->k_off, d, P, hd->kchan_bits, i, row);
                else
                    kvq__slot_decode(hd->kc, hd->ktiled, KVQ__ROLE_K, P, pg->block + hd->k_off, i,
                                     row, w->rows);
                if (ly->center)
                    for (size_t t = 0; t < d; t++)
                        row[t] += ly->center[h * d + t];
            } else if (cls[i] == KVQ__PEND) {
                c->f16->k.decode(c->f16, row, (const uint8_t *)(stk + i * d), 1);
            } else {
                continue;
            }
            kvq__rope(c, row, pos[i]);
        }
        for (size_t r = 0; r < nr; r++)
            for (size_t i = 0; i < P; i++) {
                float s = -INFINITY;
                if (cls[i] && pos[i] <= w->rqp[r]) {
                    const float *row = w->scratch + i * d, *qg = w->qs + r * d;
                    s = 0.0f;
                    for (size_t t = 0; t < d; t++)
                        s += qg[t] * row[t];
                }
                sc[r * ss + i] = s;
            }
        if (ne)
            w->bytes_read += hd->k_hdr + P * hd->kbytes;
        return;
    }
    if (ne) {
        if (hd->kchan_bits)
            kvq__chan_score(pg->block + hd->k_off, d, P, hd->kchan_bits, w->qs, nr, sc, ss);
        else if (!hd->ktiled)
            hd->kc->k.score(hd->kc, sc, ss, qpk, nr, pg->block + hd->k_off, P);
        else if (hd->kc->k.tscore)
            hd->kc->k.tscore(hd->kc, sc, ss, pw ? w->qtw : w->qtk, nr, pg->block + hd->k_off, P);
        else
            kvq__tile_score_rows(hd->kc, &hd->kc->k, sc, ss, qpk, nr, pg->block + hd->k_off, P,
                                 w->rows);
        for (size_t r = 0; r < nr; r++)
            if (w->cdot[r] != 0.0f)
                for (size_t i = 0; i < P; i++)
                    sc[r * ss + i] += w->cdot[r];
        w->bytes_read += hd->k_hdr + P * hd->kbytes;
    }
    /* the staged keys: their tiled copy through the f16 codec's tscore
     * when the call made one (several query tokens), else the rows */
    const uint8_t *ktt = npd && w->ktt && w->kidx[p] >= 0
                             ? (const uint8_t *)(w->ktt + (size_t)w->kidx[p] * P * d)
                             : NULL;
    if (npd == (int)P) {
        /* every slot staged (a prefill chunk): scored in place */
        if (ktt)
            c->f16->k.tscore(c->f16, sc, ss, w->qtf, nr, ktt, P);
        else
            c->f16->k.score(c->f16, sc, ss, w->qpf, nr, (const uint8_t *)stk, P);
    } else {
        if (npd && ktt)
            c->f16->k.tscore(c->f16, w->sc2, P, w->qtf, nr, ktt, P);
        else if (npd)
            c->f16->k.score(c->f16, w->sc2, P, w->qpf, nr, (const uint8_t *)stk, P);
        for (size_t i = 0; i < P; i++) {
            if (cls[i] == KVQ__PEND)
                for (size_t r = 0; r < nr; r++)
                    sc[r * ss + i] = w->sc2[r * P + i];
            else if (cls[i] != KVQ__ENC)
                for (size_t r = 0; r < nr; r++)
                    sc[r * ss + i] = -INFINITY;
        }
    }
    /* causal mask: only pages that reach past a row's query position (every
     * page through the slot-by-row compares made a 2048-token prefill 7-8%
     * slower, in-process A/B) */
    int32_t pmax = INT32_MIN, rmin = INT32_MAX;
    for (size_t i = 0; i < P; i++)
        pmax = KVQ__MAX(pmax, pos[i]);
    for (size_t r = 0; r < nr; r++)
        rmin = KVQ__MIN(rmin, w->rqp[r]);
    if (pmax > rmin)
        for (size_t r = 0; r < nr; r++)
            for (size_t i = 0; i < P; i++)
                if (pos[i] > w->rqp[r])
                    sc[r * ss + i] = -INFINITY;
}

/* Prepares the query rows of tile [t0, t0 + nt) of head h in w (scaled
 * queries, positions, centre dots, prepared queries); returns qmax. */
static int32_t kvq__tile_setup(const kvq__attn_call *jb, kvq__work *w, size_t h, size_t t0,
                               size_t nt) {
    kvq_cache *c = jb->c;
    kvq__layer *ly = jb->ly;
    const kvq__head *hd = &ly->heads[h], *wd = &ly->wheads[h];
    const size_t d = c->d, G = c->G, QH = c->QH, nr = nt * G;
    const int warm = ly->tier_pages[KVQ__TIER_WARM] > 0 && c->warm_distinct;
    const float scale = 1.0f / sqrtf((float)d);
    int32_t qmax = INT32_MIN;
    for (size_t tt = 0; tt < nt; tt++)
        for (size_t g = 0; g < G; g++) {
            size_t r = tt * G + g;
            const float *src = jb->q + ((t0 + tt) * QH + h * G + g) * d;
            for (size_t i = 0; i < d; i++)
                w->qs[r * d + i] = src[i] * scale;
            w->rqp[r] = jb->qpos[t0 + tt];
            float cd = 0.0f;
            if (ly->center && !c->cfg.k_prerope)
                for (size_t i = 0; i < d; i++)
                    cd += w->qs[r * d + i] * ly->center[h * d + i];
            w->cdot[r] = cd;
            qmax = KVQ__MAX(qmax, w->rqp[r]);
        }
    if (!c->cfg.k_prerope) {
        /* the row kernels' query only where a page is scored by them: a
         * tiled head whose codec has tscore never is (in-process A/B,
         * decode, one thread: 1k tokens int4:g=32 -6%, int8 -3%, tq3 -16%;
         * 4k -2%, -3%, -6%) */
        if (hd->kc && (!hd->ktiled || !hd->kc->k.tscore))
            kvq__codec_prep(hd->kc, w->qpk, w->qs, nr);
        if (warm && wd->kc && (!wd->ktiled || !wd->kc->k.tscore))
            kvq__codec_prep(wd->kc, w->qpw, w->qs, nr);
        if (hd->kc && hd->ktiled && hd->kc->k.tprep)
            for (size_t r = 0; r < nr; r++)
                hd->kc->k.tprep(hd->kc, w->qtk + r * hd->kc->tqp_bytes, w->qs + r * d);
        if (warm && wd->kc && wd->ktiled && wd->kc->k.tprep)
            for (size_t r = 0; r < nr; r++)
                wd->kc->k.tprep(wd->kc, w->qtw + r * wd->kc->tqp_bytes, w->qs + r * d);
        kvq__codec_prep(c->f16, w->qpf, w->qs, nr);
        if (w->ktt)
            for (size_t r = 0; r < nr; r++)
                c->f16->k.tprep(c->f16, w->qtf + r * c->f16->tqp_bytes, w->qs + r * d);
    }
    return qmax;
}

/* Attention of KV head h for the rows set up in w over pages [p0, p1),
 * flash-style: blocks of pages are scored for all rows at once, folded into
 * per-row running maxima and sums (online softmax), and their values
 * accumulated with the exponentiated weights, into the state ps. rawsc
 * (rows of slots_cap, or NULL) receives the raw scores. */
static void kvq__attend_pages(const kvq__attn_call *jb, kvq__work *w, size_t h, size_t nr,
                              int32_t qmax, size_t p0, size_t p1, kvq__pstate *ps, float *rawsc,
                              int init) {
    kvq_cache *c = jb->c;
    kvq__layer *ly = jb->ly;
    const kvq__head *hd = &ly->heads[h], *wd = &ly->wheads[h];
    size_t P = c->P, d = c->d, BW = c->block_pages * P;
    size_t alen = hd->vc->acc_len, walen = wd->vc->acc_len;
    /* warm pages need their own prepared query and accumulator only when the
     * warm codecs differ; otherwise they share the hot ones (same sums) */
    const int warm = ly->tier_pages[KVQ__TIER_WARM] > 0 && c->warm_distinct;
    uint8_t *cls = w->cls, *vcls = w->vcls;
    size_t *bp = w->bpages;
    int *bne = w->bne, *bnp = w->bnp;
    if (init) {
        for (size_t r = 0; r < nr; r++) {
            ps->m[r] = -INFINITY;
            ps->l[r] = 0.0f;
        }
        if (warm)
            memset(ps->accw, 0, nr * walen * sizeof(float));
        memset(ps->acc, 0, nr * alen * sizeof(float));
        memset(ps->accs, 0, nr * d * sizeof(float));
        ps->any_pend = 0;
    }
    int any_pend = ps->any_pend;
    size_t p = p0;
    while (p < p1) {
        /* gather a block of pages with tokens visible to the tile */
        size_t nb = 0;
        for (; p < p1 && nb < c->block_pages; p++) {
            const kvq__page *pg = &ly->pages[p];
            if (!pg->block || pg->min_pos > qmax)
                continue; /* cold pages were promoted before attention when visible */
            /* where each visible token's key and value are read from:
             * encoded (ENC) or staged in f16 (PEND); channel keys are
             * staged until their page is encoded */
            const kvq__head *ph = kvq__page_heads(ly, pg) + h;
            uint8_t *cl = cls + nb * P, *vcl = vcls + nb * P;
            int ne = 0, npd = 0, vne = 0, vnp = 0;
            const int32_t *pos = ly->pos + p * P;
            const uint8_t *stt = ly->state + p * P;
            const uint8_t kpage = ph->kchan_bits && !pg->encoded ? KVQ__PEND : KVQ__ENC;
            for (size_t i = 0; i < P; i++) {
                uint8_t st = KVQ__STATE(stt[i]), kc, vc;
                if (pos[i] < 0 || pos[i] > qmax)
                    st = KVQ__FREE;
                kc = vc = st;
                if (st != KVQ__FREE) {
                    kc = ph->kchan_bits ? kpage : (st == KVQ__PEND && ph->kstage ? KVQ__PEND : KVQ__ENC);
                    vc = st == KVQ__PEND && ph->vstage ? KVQ__PEND : KVQ__ENC;
                }
                cl[i] = kc;
                vcl[i] = vc;
                ne += kc == KVQ__ENC;
                npd += kc == KVQ__PEND;
                vne += vc == KVQ__ENC;
                vnp += vc == KVQ__PEND;
            }
            if (!ne && !npd)
                continue;
            if (p + 1 < p1 && ly->pages[p + 1].block) {
                const kvq__page *nx = &ly->pages[p + 1];
                const kvq__head *nh = kvq__page_heads(ly, nx) + h;
                kvq__prefetch(nx->block + nh->k_off, KVQ__MIN(KVQ__PF_AREA, nh->k_hdr + P * nh->kbytes), 0);
            }
            if (vne)
                kvq__prefetch(pg->block + ph->v_off, KVQ__MIN(KVQ__PF_AREA, P * ph->vbytes), 1);
            bp[nb] = p;
            bne[nb] = vne;
            bnp[nb] = vnp;
            kvq__page_scores(c, ly, h, p, cl, ne, npd, nr, w, w->sc + nb * P, BW);
            any_pend |= vnp;
            nb++;
        }
        if (!nb)
            break;
        size_t width = nb * P;
        if (rawsc)
            for (size_t r = 0; r < nr; r++)
                for (size_t b = 0; b < nb; b++)
                    memcpy(rawsc + r * ly->slots_cap + bp[b] * P, w->sc + r * BW + b * P,
                           P * sizeof(float));
        /* the online softmax of the decode path, KVQ__MAX_G rows a call */
        float fr[KVQ__MAX_G];
        for (size_t r0 = 0; r0 < nr; r0 += KVQ__MAX_G) {
            const size_t k = KVQ__MIN((size_t)KVQ__MAX_G, nr - r0);
            if (c->page_softmax(w->sc + r0 * BW, BW, k, width, ps->m + r0, ps->l + r0, fr))
                for (size_t i = 0; i < k; i++)
                    if (fr[i] != 1.0f)
                        kvq__pstate_scale(ps, r0 + i, fr[i], alen, warm ? walen : 0,
                                          any_pend ? d : 0);
        }
        for (size_t b = 0; b < nb; b++) {
            const kvq__page *pg = &ly->pages[bp[b]];
            const float *wb = w->sc + b * P;
            const int pw = pg->tier == KVQ__TIER_WARM && c->warm_distinct;
            const kvq__head *ph = pw ? wd : hd;
            float *acc = pw ? ps->accw : ps->acc;
            size_t al = pw ? walen : alen;
            if (bnp[b] == (int)P) {
                /* every value staged: the weights as they are */
                c->f16->k.accum(c->f16, ps->accs, d, wb, BW, nr,
                                (const uint8_t *)kvq__stage_v(pg, ph), P);
            } else if (bnp[b]) {
                /* split the weights: encoded slots vs staged slots */
                const uint8_t *cl = vcls + b * P;
                for (size_t r = 0; r < nr; r++)
                    for (size_t i = 0; i < P; i++) {
                        float x = wb[r * BW + i];
                        w->w[r * P + i] = cl[i] == KVQ__ENC ? x : 0.0f;
                        w->w2[r * P + i] = cl[i] == KVQ__PEND ? x : 0.0f;
                    }
                c->f16->k.accum(c->f16, ps->accs, d, w->w2, P, nr,
                                (const uint8_t *)kvq__stage_v(pg, ph), P);
                if (bne[b])
                    kvq__vaccum(ph, acc, al, w->w, P, nr, pg->block + ph->v_off, P, w->rows);
            } else {
                kvq__vaccum(ph, acc, al, wb, BW, nr, pg->block + ph->v_off, P, w->rows);
            }
            if (bne[b])
                w->bytes_read += P * ph->vbytes;
        }
    }
    ps->any_pend = any_pend;
}

/* Merges the n states of head h's rows of tile [t0, t0 + nt) (chunk order;
 * with n == 1 the state is taken as it is), writes the output rows and, with
 * rawsc, adds each visible token's attention to jb->attn. */
static void kvq__attend_fold(const kvq__attn_call *jb, kvq__work *w, size_t h, size_t t0, size_t nt,
                             kvq__pstate *st, size_t n, float *rawsc) {
    kvq_cache *c = jb->c;
    kvq__layer *ly = jb->ly;
    const kvq__head *hd = &ly->heads[h], *wd = &ly->wheads[h];
    const size_t d = c->d, G = c->G, QH = c->QH, nr = nt * G, P = c->P;
    const size_t alen = hd->vc->acc_len, walen = wd->vc->acc_len;
    const int warm = ly->tier_pages[KVQ__TIER_WARM] > 0 && c->warm_distinct;
    kvq__pstate f = st[0];
    int any_pend = 0;
    for (size_t i = 0; i < n; i++)
        any_pend |= st[i].any_pend;
    if (n > 1) {
        /* the merged state lives in the worker's buffers */
        f = (kvq__pstate){w->m, w->l, w->acc, w->accw, w->accs, any_pend};
        for (size_t r = 0; r < nr; r++) {
            float M = -INFINITY;
            for (size_t i = 0; i < n; i++)
                if (st[i].l[r] > 0.0f && st[i].m[r] > M)
                    M = st[i].m[r];
            f.m[r] = M;
            f.l[r] = 0.0f;
            memset(f.acc + r * alen, 0, alen * sizeof(float));
            if (warm)
                memset(f.accw + r * walen, 0, walen * sizeof(float));
            if (any_pend)
                memset(f.accs + r * d, 0, d * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                if (!(st[i].l[r] > 0.0f))
                    continue;
                float e = expf(st[i].m[r] - M);
                f.l[r] += st[i].l[r] * e;
                kvq__axpy_floats(f.acc + r * alen, st[i].acc + r * alen, alen, e);
                if (warm)
                    kvq__axpy_floats(f.accw + r * walen, st[i].accw + r * walen, walen, e);
                if (st[i].any_pend)
                    kvq__axpy_floats(f.accs + r * d, st[i].accs + r * d, d, e);
            }
        }
    }
    int32_t qmax = INT32_MIN;
    for (size_t tt = 0; tt < nt; tt++)
        qmax = KVQ__MAX(qmax, jb->qpos[t0 + tt]);
    for (size_t tt = 0; tt < nt; tt++)
        for (size_t g = 0; g < G; g++) {
            size_t r = tt * G + g;
            float *o = jb->out + ((t0 + tt) * QH + h * G + g) * d;
            memset(o, 0, d * sizeof(float));
            if (hd->vc->k.finish)
                hd->vc->k.finish(hd->vc, o, f.acc + r * alen);
            else
                for (size_t i = 0; i < d; i++)
                    o[i] += f.acc[r * alen + i];
            if (warm) {
                if (wd->vc->k.finish)
                    wd->vc->k.finish(wd->vc, o, f.accw + r * walen);
                else
                    for (size_t i = 0; i < d; i++)
                        o[i] += f.accw[r * walen + i];
            }
            float inv = f.l[r] > 0.0f ? 1.0f / f.l[r] : 0.0f;
            for (size_t i = 0; i < d; i++)
                o[i] = (o[i] + (any_pend ? f.accs[r * d + i] : 0.0f)) * inv;
        }
    if (rawsc && jb->attn) {
        /* page by page (rawsc holds the scores of the pages attended), rows
         * in groups of KVQ__ATTN_ROWS: 1 / l and the query position of each */
        float *a = jb->attn + h * ly->slots_cap;
        float inv[KVQ__ATTN_ROWS];
        int32_t rqp[KVQ__ATTN_ROWS];
        for (size_t r0 = 0; r0 < nr; r0 += KVQ__ATTN_ROWS) {
            const size_t k = KVQ__MIN((size_t)KVQ__ATTN_ROWS, nr - r0);
            for (size_t i = 0; i < k; i++) {
                inv[i] = f.l[r0 + i] > 0.0f ? 1.0f / f.l[r0 + i] : 0.0f;
                rqp[i] = jb->qpos[t0 + (r0 + i) / G];
            }
            for (size_t p = 0; p < ly->n_pages; p++)
                if (ly->pages[p].block && ly->pages[p].min_pos <= qmax)
                    c->attn_add(a + p * P, rawsc + r0 * ly->slots_cap + p * P, ly->slots_cap, k,
                                f.m + r0, inv, ly->pos + p * P, rqp, P);
        }
    }
}

/* A part's state inside jb->parts. */
static kvq__pstate kvq__part_state(const kvq__attn_call *jb, size_t item, size_t nr) {
    const kvq_cache *c = jb->c;
    float *p = jb->parts + item * jb->part_floats;
    kvq__pstate s;
    s.m = p;
    s.l = p + nr;
    s.acc = p + 2 * nr;
    s.accw = s.acc + nr * c->max_acc;
    s.accs = s.accw + nr * c->max_acc;
    s.any_pend = 0;
    return s;
}

/* The view of w in which head h's G query rows of a decode step are rows
 * 0..G-1: query blocks of G rows per head (prepared queries in blocks of G
 * * max_qp bytes, rows at the codec's own stride). */
static kvq__work kvq__head_rows(const kvq_cache *c, const kvq__work *w, size_t h) {
    const size_t G = c->G;
    kvq__work wh = *w;
    wh.qs += h * G * c->d;
    wh.qpk += h * G * c->max_qp;
    wh.qpw += h * G * c->max_qp;
    wh.qtk += h * G * c->max_qp;
    wh.qtw += h * G * c->max_qp;
    wh.qpf += h * G * c->f16->qp_bytes;
    wh.cdot += h * G;
    wh.rqp += h * G;
    wh.bytes_read = 0;
    return wh;
}

/* Whether page p takes the decode fast path: fully encoded, hot (or warm
 * with the hot codecs), keys not pre-RoPE, every token visible to qmax. */
static int kvq__page_fast(const kvq_cache *c, const kvq__layer *ly, size_t p, int32_t qmax,
                          int all_visible, int warm_distinct) {
    const kvq__page *pg = &ly->pages[p];
    const size_t P = c->P;
    if (!pg->block || pg->min_pos > qmax || c->cfg.k_prerope || pg->n_pending != 0 ||
        pg->n_valid != P || (pg->tier != KVQ__TIER_HOT && warm_distinct))
        return 0;
    if (!all_visible)
        for (size_t i = 0; i < P; i++)
            if (ly->pos[p * P + i] > qmax)
                return 0;
    return 1;
}

/* A decode step (one query token) over pages [p0, p1) for every KV head at
 * once. Pages go in runs of up to KVQ__RUN_TOKENS tokens of consecutive
 * fast pages (kvq__page_fast) with the same layout: the keys of the run page
 * after page, every head's area of a page in block order, the scores of a
 * head's G rows side by side in rows of n * P; one page softmax over all the
 * rows of the run; then the values, head after head through taccum_run
 * where every head's codec has one, else page after page. While a page's
 * keys are read, the same head's areas one and two pages ahead are
 * prefetched (KVQ__PF_L2_MIN). Kernels that prefetch the next page
 * themselves (pf_self: the float codecs) get, on a run's last page, the
 * area read next instead: the run's first values while they read its last
 * keys, the next run's first keys while they read its last values (before,
 * the same area of the next run, read a whole phase later and evicted from
 * L1 by then: f16 32k flushed 3-6% faster, f32 1-3%, in-process A/B).
 * Key kernels that prefetch the next page's keys as they read (pf_tscore:
 * int and tq on AVX2 and AVX-512) get no burst of those lines from here;
 * the burst (up to KVQ__PF_AREA bytes of L1 prefetches at once) held the
 * core while the L1's misses were in flight. In-process A/B at 32k, one
 * thread: AVX-512 int4:g=32 -3..8%, int8 -1..5%, tq3/tq4 -1..4%; AVX2
 * int8 -12..24%, AVX-VNNI int8 -15..19%, AVX2 int4:g=32 -1..9%, tq even to
 * -2%. Moving the L2 prefetches (values, the page after) into the kernel
 * as well was 20-36% slower: those must go out early, in a burst. Now
 * the page after's keys are no longer asked for into L2 where
 * the key kernel streams its own (pf_tscore; the page after's values still
 * are): in-process A/B, one thread 32k AVX-512 int8 -4%, int4:g=32 -3%,
 * tq4 -2%, 16k -3..5%; two threads int8 and tq4 even, int4:g=32 -4%; AVX2
 * int8 -4%, int4:g=32 -1%, tq4 +1%; AVX-VNNI int8 -4%. Dropping the page
 * after's values too was better for int8 (-8%) and tq4 (-6%) but not for
 * int4:g=32 (+3%). The
 * value kernels of a run (taccum_run, int and tq) prefetch the next head's
 * value areas of the same pages into L1 as they read theirs (they are in
 * L2 by then; kvq__pf_delta): in-process A/B, one thread, AVX-512 32k
 * int4:g=32 -9..13%, int8 -4..9%, tq3 -11%, tq4 -1..3%; 16k int4:g=32 -14%,
 * int8 -16%, tq3 -9%, tq4 even; AVX2 32k int4:g=32 -9%, int8 -2..6%, tq3
 * and tq4 even to -11%, AVX-VNNI int8 -11..21%; two threads -0..5%. The
 * next head's scales prefetched the same way by the weight rounding: even.
 * ps[h] holds the state of head h's G rows (ps[h].m = ps[0].m + h * G, and
 * l alike); the rows of every head were prepared in w (kvq__decode_setup,
 * or kvq__attn_setup's rows of work[0]). Any other page, and heads with
 * keys in the channel layout, go through kvq__attend_pages. The pages one
 * run ahead of the chunk's last run are those of the next chunk this job
 * will work: it claims it then (*claim, SIZE_MAX until then; the caller
 * claims one when the chunk ended without), so that a chunk does not start
 * from cold memory. Without it, each chunk's first run was read
 * unprefetched: int4:g=32 at 32k, its keys took 14.3k TSC ticks against
 * 9.1k in the other runs, its values 13.8k against 5.8k; in-process A/B of
 * the change: one thread 4k -1..6%, 16k -1..7%, 32k -0.5..1%; two threads
 * 32k -1..2%. */
#define KVQ__RUN_TOKENS 64
#define KVQ__RUN_MAX 64 /* pages of a run (P = 1) */

/* The block one page after page i of a run of n (blk) followed by nn pages
 * (nblk), plus off; NULL past them. */
static inline const uint8_t *kvq__run_next(const uint8_t *const *blk, size_t n,
                                           const uint8_t *const *nblk, size_t nn, size_t i,
                                           size_t off) {
    return i + 1 < n ? blk[i + 1] + off : i + 1 - n < nn ? nblk[i + 1 - n] + off : NULL;
}

static void kvq__decode_pages(const kvq__attn_call *jb, kvq__work *w, int32_t qmax, size_t p0,
                              size_t p1, kvq__pstate *ps, float *rawsc, size_t *claim) {
    kvq_cache *c = jb->c;
    kvq__layer *ly = jb->ly;
    const size_t P = c->P, d = c->d, G = c->G, H = c->H, slots = ly->slots_cap;
    const int warm = ly->tier_pages[KVQ__TIER_WARM] > 0 && c->warm_distinct;
    const size_t rmax = KVQ__MAX(1, KVQ__MIN(KVQ__RUN_MAX, KVQ__RUN_TOKENS / P));
    for (size_t h = 0; h < H; h++) {
        for (size_t r = 0; r < G; r++) {
            ps[h].m[r] = -INFINITY;
            ps[h].l[r] = 0.0f;
        }
        memset(ps[h].acc, 0, G * ly->heads[h].vc->acc_len * sizeof(float));
        if (warm) /* read only when warm pages have codecs of their own */
            memset(ps[h].accw, 0, G * ly->wheads[h].vc->acc_len * sizeof(float));
        ps[h].any_pend = 0;
    }
    /* the staged values' accumulators are zeroed before a head's first
     * slow page (only those can hold staged tokens) */
    uint8_t accs_zero[KVQ__MAX_DECODE_HEADS] = {0};
    float *sc = w->sc;
    /* a query at the newest position sees every token (positions increase) */
    const int all_visible = ly->appended && qmax >= ly->last_pos;
    for (size_t p = p0; p < p1;) {
        const kvq__page *pg = &ly->pages[p];
        if (!pg->block || pg->min_pos > qmax) {
            p++;
            continue;
        }
        if (!kvq__page_fast(c, ly, p, qmax, all_visible, c->warm_distinct)) {
            for (size_t h = 0; h < H; h++) {
                if (!accs_zero[h]) {
                    memset(ps[h].accs, 0, G * d * sizeof(float));
                    accs_zero[h] = 1;
                }
                kvq__work wh = kvq__head_rows(c, w, h);
                kvq__attend_pages(jb, &wh, h, G, qmax, p, p + 1, &ps[h],
                                  rawsc ? rawsc + h * G * slots : NULL, 0);
                w->bytes_read += wh.bytes_read;
            }
            p++;
            continue;
        }
        const kvq__head *heads = kvq__page_heads(ly, pg);
        const uint8_t *blk[KVQ__RUN_MAX], *nblk[KVQ__RUN_MAX];
        size_t n = 1, nn = 0;
        blk[0] = pg->block;
        /* (without a warm codec of its own, warm pages have the hot layout) */
        while (n < rmax && p + n < p1 &&
               (!c->warm_distinct || kvq__page_heads(ly, &ly->pages[p + n]) == heads) &&
               kvq__page_fast(c, ly, p + n, qmax, all_visible, c->warm_distinct)) {
            blk[n] = ly->pages[p + n].block;
            n++;
        }
        /* the pages one run ahead, prefetched as this run's are read: past
         * the chunk's end, the next chunk's (claimed now) */
        while (nn < n) {
            size_t q = p + n + nn;
            if (q >= p1) {
                if (*claim == SIZE_MAX)
                    *claim = atomic_fetch_add(jb->next, 1);
                if (*claim >= jb->n_items)
                    break;
                q = jb->cstart[*claim] + (q - p1);
                if (q >= jb->cstart[*claim + 1])
                    break;
            }
            if (!ly->pages[q].block ||
                (c->warm_distinct && kvq__page_heads(ly, &ly->pages[q]) != heads))
                break;
            nblk[nn++] = ly->pages[q].block;
        }
        const size_t ss = n * P;
        for (size_t i = 0; i < n; i++)
            for (size_t h = 0; h < H; h++) {
                const kvq__head *ph = heads + h;
                if (ph->kchan_bits)
                    continue;
                const kvq_codec *kc = ph->kc;
                /* the same head's areas one page ahead */
                const uint8_t *nb = kvq__run_next(blk, n, nblk, nn, i, 0);
                const uint8_t *ka = blk[i] + ph->k_off, *nk = nb ? nb + ph->k_off : NULL;
                const size_t ak = ph->k_hdr + P * ph->kbytes, av = P * ph->vbytes;
                /* the next page's keys: by the kernel as it reads this
                 * page's (pf_self, pf_tscore), else here */
                if (nk && !kc->pf_self && !(ph->ktiled && kc->pf_tscore))
                    kvq__prefetch(nk, KVQ__MIN(ak, KVQ__PF_AREA), 0);
                if (nk && !ph->vc->pf_self)
                    kvq__prefetch(nb + ph->v_off, KVQ__MIN(av, KVQ__PF_AREA), 1);
                if (!kc->pf_self && !ph->vc->pf_self && ak + av >= KVQ__PF_L2_MIN) {
                    /* and into L2 the page after: more requests in flight than
                     * the L1 alone takes (see KVQ__PF_L2_MIN) */
                    const uint8_t *b2 = kvq__run_next(blk, n, nblk, nn, i + 1, 0);
                    if (b2) {
                        /* (its keys only for key kernels that do not
                         * stream their own, see above) */
                        if (!(ph->ktiled && kc->pf_tscore))
                            kvq__prefetch(b2 + ph->k_off, ak, 1);
                        kvq__prefetch(b2 + ph->v_off, av, 1);
                    }
                }
                kvq__pf_next = nk;
                if (i + 1 == n && kc->pf_self && ph->vc->pf_self && ak == av)
                    kvq__pf_next = blk[0] + ph->v_off; /* the run's first values: read next */
                float *s0 = sc + h * G * ss + i * P;
                const size_t qo = h * G * c->max_qp;
                if (!ph->ktiled)
                    kc->k.score(kc, s0, ss, w->qpk + qo, G, ka, P);
                else if (kc->k.tscore)
                    kc->k.tscore(kc, s0, ss, w->qtk + qo, G, ka, P);
                else
                    kvq__tile_score_rows(kc, &kc->k, s0, ss, w->qpk + qo, G, ka, P, w->rows);
            }
        kvq__pf_next = NULL;
        for (size_t h = 0; h < H; h++) {
            if (heads[h].kchan_bits)
                continue;
            for (size_t r = 0; r < G; r++) {
                float *s = sc + (h * G + r) * ss, cd = w->cdot[h * G + r];
                if (cd != 0.0f)
                    for (size_t i = 0; i < ss; i++)
                        s[i] += cd;
                if (rawsc)
                    memcpy(rawsc + (h * G + r) * slots + p * P, s, ss * sizeof(float));
            }
        }
        /* the softmax of every row at once, or head by head around the
         * heads in the channel layout */
        float fr[KVQ__MAX_G];
        for (size_t h0 = 0; h0 < H;) {
            size_t h1 = h0 + 1;
            if (heads[h0].kchan_bits) {
                h0 = h1;
                continue;
            }
            while (h1 < H && !heads[h1].kchan_bits && (h1 + 1 - h0) * G <= KVQ__MAX_G)
                h1++;
            if (c->page_softmax(sc + h0 * G * ss, ss, (h1 - h0) * G, ss, ps[h0].m, ps[h0].l, fr))
                for (size_t h = h0; h < h1; h++)
                    for (size_t r = 0; r < G; r++) {
                        /* every accumulator of the row: warm and staged ones too */
                        float f = fr[(h - h0) * G + r];
                        if (f != 1.0f)
                            kvq__pstate_scale(&ps[h], r, f, heads[h].vc->acc_len,
                                              warm ? ly->wheads[h].vc->acc_len : 0,
                                              ps[h].any_pend ? d : 0);
                    }
            h0 = h1;
        }
        /* values head after head when the codecs sum a run of pages at
         * once (taccum_run: one weight rounding and one conversion per
         * run), otherwise page after page, every head's area of a page in
         * block order */
        int vrun = n > 1;
        for (size_t h = 0; h < H && vrun; h++)
            vrun = heads[h].kchan_bits || (heads[h].vtiled && heads[h].vc->k.taccum_run);
        if (vrun) {
            for (size_t h = 0; h < H; h++) {
                const kvq__head *ph = heads + h;
                if (ph->kchan_bits)
                    continue;
                const uint8_t *va[KVQ__RUN_MAX];
                for (size_t i = 0; i < n; i++)
                    va[i] = blk[i] + ph->v_off;
                /* the next head's values, prefetched by the kernel as it
                 * reads these (the same page blocks, one area on; only
                 * where that area has this one's codec, so its layout) */
                kvq__pf_delta = h + 1 < H && !heads[h + 1].kchan_bits && heads[h + 1].vc == ph->vc
                                    ? (ptrdiff_t)heads[h + 1].v_off - (ptrdiff_t)ph->v_off
                                    : 0;
                ph->vc->k.taccum_run(ph->vc, ps[h].acc, ph->vc->acc_len, sc + h * G * ss, ss, G,
                                     va, n, P);
            }
            kvq__pf_delta = 0;
        } else {
            for (size_t i = 0; i < n; i++)
                for (size_t h = 0; h < H; h++) {
                    const kvq__head *ph = heads + h;
                    if (ph->kchan_bits)
                        continue;
                    kvq__pf_next = kvq__run_next(blk, n, nblk, nn, i, ph->v_off);
                    if (i + 1 == n && ph->kc->pf_self && ph->vc->pf_self &&
                        ph->k_hdr + P * ph->kbytes == P * ph->vbytes) /* the next run's keys */
                        kvq__pf_next = nn ? nblk[0] + ph->k_off : NULL;
                    kvq__vaccum(ph, ps[h].acc, ph->vc->acc_len, sc + h * G * ss + i * P, ss, G,
                                blk[i] + ph->v_off, P, w->rows);
                }
            kvq__pf_next = NULL;
        }
        for (size_t h = 0; h < H; h++) {
            const kvq__head *ph = heads + h;
            if (ph->kchan_bits) {
                if (!accs_zero[h]) {
                    memset(ps[h].accs, 0, G * d * sizeof(float));
                    accs_zero[h] = 1;
                }
                kvq__work wh = kvq__head_rows(c, w, h);
                kvq__attend_pages(jb, &wh, h, G, qmax, p, p + n, &ps[h],
                                  rawsc ? rawsc + h * G * slots : NULL, 0);
                w->bytes_read += wh.bytes_read;
            } else
                w->bytes_read += n * (ph->k_hdr + P * ph->kbytes + P * ph->vbytes);
        }
        p += n;
    }
}

/* Prepares the query rows of KV heads h0, h0 + step, ... of a decode step
 * in w, head h's in its kvq__head_rows view, with its own codecs. */
static void kvq__decode_setup(const kvq__attn_call *jb, kvq__work *w, size_t h0, size_t step) {
    for (size_t h = h0; h < jb->c->H; h += step) {
        kvq__work wh = kvq__head_rows(jb->c, w, h);
        kvq__tile_setup(jb, &wh, h, 0, 1);
    }
}

/* Phase 0 (decode with several jobs): job j prepares the rows of heads j,
 * j + n_jobs, ... into work[0], which every job then reads (the rows are
 * read-only during the step): the query rounding or rotation is paid once,
 * not once a thread (in-process A/B at 4k, two threads, in cache: tq3
 * 3-4% faster, int8 1-2%). */
static void kvq__attn_setup(void *arg, size_t j) {
    const kvq__attn_call *jb = (const kvq__attn_call *)arg;
    kvq__decode_setup(jb, &jb->c->work[0], j, jb->n_jobs);
}

/* Before the tiles of head h (an attend of several query tokens, w->ktt
 * set): every staged page's keys of h into its tiled copy (see
 * kvq__work.ktt), slots without a token as zeros, so that the f16 codec's
 * tscore scores them for every tile of queries instead of the row kernel
 * (4096-token prefill, AVX-512: int8 1.45 -> 1.0 s; each page is copied
 * once, and read by every tile). */
static void kvq__stage_tile_keys(const kvq__attn_call *jb, kvq__work *w, size_t h) {
    const kvq_cache *c = jb->c;
    const kvq__layer *ly = jb->ly;
    const size_t P = c->P, d = c->d;
    for (size_t p = 0; p < ly->n_pages; p++) {
        const kvq__page *pg = &ly->pages[p];
        const kvq__head *hd = kvq__page_heads(ly, pg) + h;
        if (w->kidx[p] < 0 || !hd->kstage) /* kidx[p] >= 0: pg->stage is set */
            continue; /* (a head without staged keys scores none here) */
        const uint16_t *src = kvq__stage_k(pg, hd);
        const int32_t *pos = ly->pos + p * P;
        uint16_t *dst = w->ktt + (size_t)w->kidx[p] * P * d;
        for (size_t i = 0; i < P; i++)
            if (pos[i] >= 0)
                for (size_t t = 0; t < d; t++)
                    dst[t * P + i] = src[i * d + t];
            else
                for (size_t t = 0; t < d; t++)
                    dst[t * P + i] = 0;
    }
}

/* Phase 1: each job takes the next item until none is left (a job that
 * starts late, or whose thread is descheduled, does fewer); what an item
 * computes does not depend on the job that takes it, so the output is the
 * same whichever thread runs what. */
static void kvq__attn_items(void *arg, size_t j) {
    const kvq__attn_call *jb = (const kvq__attn_call *)arg;
    kvq_cache *c = jb->c;
    kvq__work *w = &c->work[j];
    const size_t G = c->G, tile = c->rows_max / G, slots = jb->ly->slots_cap;
    if (jb->decode) {
        /* item = chunk of pages, every head; parts hold QH rows */
        kvq__work wv = *w; /* this job's scratch, the rows of work[0] when shared */
        const kvq__work *w0 = &c->work[0];
        const int32_t qmax = jb->qpos[0]; /* one query token */
        if (jb->shared_rows) {
            wv.qs = w0->qs, wv.cdot = w0->cdot, wv.rqp = w0->rqp;
            wv.qpk = w0->qpk, wv.qpf = w0->qpf, wv.qpw = w0->qpw, wv.qtk = w0->qtk, wv.qtw = w0->qtw;
        } else
            kvq__decode_setup(jb, &wv, 0, 1);
        const size_t QH = c->QH;
        for (size_t it = atomic_fetch_add(jb->next, 1), nit; it < jb->n_items; it = nit) {
            const size_t p0 = jb->cstart[it], p1 = jb->cstart[it + 1];
            nit = SIZE_MAX; /* the next chunk: kvq__decode_pages may claim it */
            kvq__pstate all = kvq__part_state(jb, it, QH), ps[KVQ__MAX_DECODE_HEADS];
            for (size_t h = 0; h < c->H; h++) {
                ps[h].m = all.m + h * G;
                ps[h].l = all.l + h * G;
                ps[h].acc = all.acc + h * G * c->max_acc;
                ps[h].accw = all.accw + h * G * c->max_acc;
                ps[h].accs = all.accs + h * G * c->d;
            }
            kvq__decode_pages(jb, &wv, qmax, p0, p1, ps, jb->rawsc, &nit);
            if (nit == SIZE_MAX)
                nit = atomic_fetch_add(jb->next, 1);
            int any = 0;
            for (size_t h = 0; h < c->H; h++)
                any |= ps[h].any_pend;
            jb->parts[it * jb->part_floats + jb->part_floats - 1] = (float)any;
        }
        w->bytes_read = wv.bytes_read;
        return;
    }
    for (size_t it; (it = atomic_fetch_add(jb->next, 1)) < jb->n_items;) {
        size_t h = it;
        float *rawsc = jb->rawsc ? jb->rawsc + j * c->rows_max * slots : NULL;
        if (w->ktt)
            kvq__stage_tile_keys(jb, w, h);
        for (size_t t0 = 0; t0 < jb->T; t0 += tile) {
            size_t nt = KVQ__MIN(tile, jb->T - t0);
            int32_t qmax = kvq__tile_setup(jb, w, h, t0, nt);
            kvq__pstate ps = {w->m, w->l, w->acc, w->accw, w->accs, 0};
            kvq__attend_pages(jb, w, h, nt * G, qmax, 0, jb->ly->n_pages, &ps, rawsc, 1);
            kvq__attend_fold(jb, w, h, t0, nt, &ps, 1, rawsc);
        }
    }
}

/* Phase 2 (decode): job j folds heads j, j + n_jobs, ... */
static void kvq__attn_folds(void *arg, size_t j) {
    const kvq__attn_call *jb = (const kvq__attn_call *)arg;
    kvq_cache *c = jb->c;
    kvq__work *w = &c->work[j];
    const size_t nr = jb->T * c->G, slots = jb->ly->slots_cap;
    kvq__pstate st[KVQ__MAX_CHUNKS];
    for (size_t h = j; h < c->H; h += jb->n_jobs) {
        for (size_t ch = 0; ch < jb->n_chunks; ch++) {
            kvq__pstate all = kvq__part_state(jb, ch, c->QH);
            st[ch].m = all.m + h * nr;
            st[ch].l = all.l + h * nr;
            st[ch].acc = all.acc + h * nr * c->max_acc;
            st[ch].accw = all.accw + h * nr * c->max_acc;
            st[ch].accs = all.accs + h * nr * c->d;
            st[ch].any_pend = jb->parts[ch * jb->part_floats + jb->part_floats - 1] != 0.0f;
        }
        kvq__attend_fold(jb, w, h, 0, jb->T, st, jb->n_chunks,
                         jb->rawsc ? jb->rawsc + h * nr * slots : NULL);
    }
}

void kvq__newest_attended(kvq_cache *c, kvq__layer *ly) {
    if (c->budget_pending_ratio) {
        double b = ceil(c->cfg.budget_ratio * (double)ly->appended);
        c->budget = b < 1 ? 1 : b > (double)c->cfg.max_tokens ? c->cfg.max_tokens : (size_t)b;
        c->budget_pending_ratio = 0;
    }
    if (c->cfg.policy != KVQ_POLICY_NONE && c->budget)
        kvq__evict_to(c, ly, c->budget, 0);
    kvq__settle(c, ly, 0);
    kvq__track_total_peak(c);
}

kvq_status kvq_cache_attend(kvq_cache *c, size_t layer, const float *q, const int32_t *qpos,
                            size_t T, float *out, size_t out_capacity, float *token_attn,
                            size_t token_attn_capacity) {
    if (!c || !q || !qpos || !out || T == 0)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    kvq__layer *ly = &c->layers[layer];
    size_t QH = c->QH, d = c->d, H = c->H;
    if (T > SIZE_MAX / (QH * d) || out_capacity < T * QH * d)
        return KVQ_ERR_DST_TOO_SMALL;
    if (token_attn && token_attn_capacity < H * ly->n_tokens)
        return KVQ_ERR_DST_TOO_SMALL;
    if (!kvq__all_finite(q, T * QH * d))
        return KVQ_ERR_NONFINITE;
    /* every allocation comes before the first change (the tier moves), so
     * that a failure leaves the cache as it was */
    int want_attn = token_attn != NULL || c->cfg.policy == KVQ_POLICY_UTILITY;
    /* this call's scratch (freed at `done`: the cache holds no more than it
     * stores between calls) */
    float *attn = NULL, *parts = NULL, *rawsc = NULL;
    kvq__cand *sorted = NULL;
    int32_t *kidx = NULL;
    uint16_t *ktt = NULL;
    kvq_status st = KVQ_OK;
    size_t n_sorted = 0;
    if (want_attn && ly->slots_cap) {
        attn = (float *)kvq__calloc(&c->alloc, H * ly->slots_cap * sizeof(float));
        if (attn && token_attn)
            sorted = kvq__sorted_tokens(c, ly, &n_sorted);
        if (!attn || (token_attn && !sorted)) {
            st = KVQ_ERR_NOMEM;
            goto done;
        }
    }
    /* the plan (kvq__attn_call) and its scratch, reserved here: workers never
     * call the allocator (scratch grown before a failure stays) */
    kvq__attn_call jb = {.c = c, .ly = ly, .q = q, .qpos = qpos, .T = T, .out = out, .attn = attn};
    const size_t nr1 = T * c->G, slots = ly->slots_cap;
    if (T == 1 && QH <= c->rows_max && H <= KVQ__MAX_DECODE_HEADS && c->G <= KVQ__MAX_G &&
        ly->n_pages) {
        jb.decode = 1;
        jb.n_chunks = kvq__chunks(ly->n_pages, jb.cstart);
        jb.n_items = jb.n_chunks;
        jb.part_floats = 2 * QH + QH * (2 * c->max_acc + d) + 1;
    } else {
        jb.n_items = H;
    }
    jb.n_jobs = KVQ__MIN(c->n_active, jb.n_items);
    if (jb.decode && jb.n_chunks <= KVQ__SOLO_CHUNKS)
        jb.n_jobs = 1; /* see KVQ__SOLO_CHUNKS */
    if (jb.n_chunks)
        parts = (float *)kvq__alloc(&c->alloc, jb.n_items * jb.part_floats * sizeof(float));
    if (attn)
        rawsc = (float *)kvq__alloc(
            &c->alloc, ((jb.n_chunks ? H * nr1 : jb.n_jobs * c->rows_max) * slots + 16) * sizeof(float));
    if ((jb.n_chunks && !parts) || (attn && !rawsc)) {
        st = KVQ_ERR_NOMEM;
        goto done;
    }
    /* several query tokens over staged keys (a prefill): their tiled
     * copies, one region per job (kvq__stage_tile_keys) */
    size_t nst = 0;
    int anyks = 0;
    for (size_t h = 0; h < H; h++)
        anyks |= ly->heads[h].kstage;
    if (!jb.decode && anyks && !c->cfg.k_prerope && c->f16->k.tscore && c->work[0].qtf &&
        kvq__tiled(c->f16, KVQ__ROLE_K, c->P)) {
        for (size_t p = 0; p < ly->n_pages; p++)
            nst += ly->pages[p].stage != NULL;
        if (nst) {
            kidx = (int32_t *)kvq__alloc(&c->alloc, ly->n_pages * sizeof(int32_t));
            if (nst <= SIZE_MAX / sizeof(uint16_t) / c->P / d / jb.n_jobs)
                ktt = (uint16_t *)kvq__alloc(&c->alloc,
                                             jb.n_jobs * nst * c->P * d * sizeof(uint16_t));
            if (!kidx || !ktt) {
                st = KVQ_ERR_NOMEM;
                goto done;
            }
            /* (the tier step below moves no staged page: pages with
             * staging stay hot) */
            for (size_t p = 0, k = 0; p < ly->n_pages; p++)
                kidx[p] = ly->pages[p].stage ? (int32_t)k++ : -1;
        }
    }
    jb.parts = parts;
    jb.rawsc = rawsc;
    if (c->tiers) {
        int32_t qmax = INT32_MIN;
        for (size_t t = 0; t < T; t++)
            qmax = qpos[t] > qmax ? qpos[t] : qmax;
        st = kvq__tier_before_attend(c, layer, qmax);
        if (st != KVQ_OK)
            goto done;
        /* tokens of lost cold pages were dropped: they leave the list */
        size_t k = 0;
        for (size_t i = 0; i < n_sorted; i++)
            if (ly->pos[sorted[i].slot] == sorted[i].pos)
                sorted[k++] = sorted[i];
        n_sorted = k;
    }
    size_t nt = c->n_threads;
    for (size_t i = 0; i < nt; i++)
        c->work[i].bytes_read = 0;
    atomic_size_t next_item;
    atomic_init(&next_item, 0);
    jb.next = &next_item;
    jb.shared_rows = jb.decode && jb.n_jobs > 1;
    if (jb.shared_rows)
        kvq__pool_run(c->pool, kvq__attn_setup, &jb, jb.n_jobs);
    for (size_t i = 0; ktt && i < jb.n_jobs; i++) {
        c->work[i].ktt = ktt + i * nst * c->P * d;
        c->work[i].kidx = kidx;
    }
    kvq__pool_run(c->pool, kvq__attn_items, &jb, jb.n_jobs);
    for (size_t i = 0; ktt && i < jb.n_jobs; i++) {
        c->work[i].ktt = NULL;
        c->work[i].kidx = NULL;
    }
    if (jb.n_chunks)
        kvq__pool_run(c->pool, kvq__attn_folds, &jb, KVQ__MIN(jb.n_jobs, H));
    for (size_t i = 0; i < nt; i++) {
        ly->bytes_read += c->work[i].bytes_read;
        for (int k = 0; k < 3; k++) {
            c->ts.reads[k] += c->work[i].tier_reads[k];
            c->work[i].tier_reads[k] = 0;
        }
    }
    if (attn) {
        if (token_attn)
            for (size_t h = 0; h < H; h++)
                for (size_t r = 0; r < n_sorted; r++)
                    token_attn[h * n_sorted + r] = attn[h * ly->slots_cap + sorted[r].slot];
        if (c->cfg.policy == KVQ_POLICY_UTILITY) {
            float norm = 1.0f / (float)(QH * T);
            for (size_t s = 0; s < ly->n_pages * c->P; s++) {
                if (ly->pos[s] < 0)
                    continue;
                float a = 0.0f;
                for (size_t h = 0; h < H; h++)
                    a += attn[h * ly->slots_cap + s];
                ly->score[s] = 0.9f * ly->score[s] + 0.1f * a * norm;
            }
        }
    }
done:
    kvq__free(&c->alloc, attn);
    kvq__free(&c->alloc, sorted);
    kvq__free(&c->alloc, parts);
    kvq__free(&c->alloc, rawsc);
    kvq__free(&c->alloc, kidx);
    kvq__free(&c->alloc, ktt);
    if (st != KVQ_OK)
        return st;
    int32_t qmax = INT32_MIN;
    for (size_t t = 0; t < T; t++)
        qmax = qpos[t] > qmax ? qpos[t] : qmax;
    if (ly->appended && qmax >= ly->last_pos)
        kvq__newest_attended(c, ly);
    if (c->tiers)
        (void)kvq__tier_enforce(c, layer);
    return st;
}

