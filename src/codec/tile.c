/*
 * tile.c - slots of page areas in the row or the tiled layout (see
 * codec_impl.h), and the gather-based reference of the tiled kernels.
 */
#include "codec_impl.h"

_Thread_local const uint8_t *kvq__pf_next KVQ__TLS_IE;
_Thread_local ptrdiff_t kvq__pf_delta KVQ__TLS_IE;

void kvq__slot_encode(const kvq_codec *c, int tiled, int role, size_t P, uint8_t *area, size_t i,
                      const float *x, uint8_t *tmp) {
    if (!tiled) {
        c->k.encode(c, area + i * c->bytes, x, 1);
        return;
    }
    c->k.encode(c, tmp, x, 1);
    c->tput(c, role, P, area, i, tmp);
}

void kvq__slot_decode(const kvq_codec *c, int tiled, int role, size_t P, const uint8_t *area,
                      size_t i, float *x, uint8_t *tmp) {
    if (!tiled) {
        c->k.decode(c, x, area + i * c->bytes, 1);
        return;
    }
    c->tget(c, role, P, area, i, tmp);
    c->k.decode(c, x, tmp, 1);
}

void kvq__tile_gather(const kvq_codec *c, int role, size_t P, const uint8_t *page, uint8_t *rows) {
    for (size_t i = 0; i < P; i++)
        c->tget(c, role, P, page, i, rows + i * c->bytes);
}

void kvq__tile_score_rows(const kvq_codec *c, const kvq__kernels *k, float *out, size_t ostride,
                          const void *qp, size_t nq, const uint8_t *page, size_t P, uint8_t *rows) {
    kvq__tile_gather(c, KVQ__ROLE_K, P, page, rows);
    k->score(c, out, ostride, qp, nq, rows, P);
}

void kvq__tile_accum_rows(const kvq_codec *c, const kvq__kernels *k, float *acc, size_t astride,
                          const float *w, size_t wstride, size_t nq, const uint8_t *page, size_t P,
                          uint8_t *rows) {
    kvq__tile_gather(c, KVQ__ROLE_V, P, page, rows);
    k->accum(c, acc, astride, w, wstride, nq, rows, P);
}

void kvq__tile_accum_pages(const kvq_codec *c, const kvq__kernels *k, float *acc, size_t astride,
                           const float *w, size_t wstride, size_t nq, const uint8_t *const *pages,
                           size_t np, size_t P, uint8_t *rows) {
    for (size_t i = 0; i < np; i++) {
        if (k->taccum)
            k->taccum(c, acc, astride, w + i * P, wstride, nq, pages[i], P);
        else
            kvq__tile_accum_rows(c, k, acc, astride, w + i * P, wstride, nq, pages[i], P, rows);
    }
}
