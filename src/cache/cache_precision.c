/*
 * cache_precision.c - switching the codec of a layer's keys or values (one
 * KV head or all) at run time: the layer's pending tokens are settled
 * first, then every page is re-encoded into a new block, and the layouts
 * follow. All or nothing over every layer the call names: the new layouts,
 * blocks and staging of all of them are allocated before anything is
 * settled or switched, so a failure leaves every layer as it was.
 */
#include "cache_impl.h"

size_t kvq__reencode_slots(const kvq__layer *ly, size_t p, size_t P, int role, const kvq_codec *from,
                           int ftiled, const uint8_t *src, const kvq_codec *to, int ttiled,
                           uint8_t *dst, int pend, double *err, double *ref) {
    const size_t d = from->d;
    float a[KVQ__MAX_HEAD_DIM], b[KVQ__MAX_HEAD_DIM];
    uint8_t tmp[4 * KVQ__MAX_HEAD_DIM];
    size_t m = 0;
    for (size_t i = 0; i < P; i++) {
        int s = KVQ__STATE(ly->state[p * P + i]);
        if (s != KVQ__ENC && !(pend && s == KVQ__PEND))
            continue;
        kvq__slot_decode(from, ftiled, role, P, src, i, a, tmp);
        kvq__slot_encode(to, ttiled, role, P, dst, i, a, tmp);
        m++;
        if (!err)
            continue;
        kvq__slot_decode(to, ttiled, role, P, dst, i, b, tmp);
        for (size_t t = 0; t < d; t++) {
            *err += ((double)a[t] - b[t]) * ((double)a[t] - b[t]);
            *ref += (double)a[t] * a[t];
        }
    }
    return m;
}

/* What switching one layer needs, allocated before anything changes: the
 * new head layouts, a new block for every page that has one, and new
 * staging for every page that has staging when its size changes (settling
 * may free some of it: those are released unused). */
typedef struct {
    kvq__head *nh;
    uint8_t **nb, **ns; /* [n_pages] each; NULL entries where the page needs none */
    size_t n_pages;
    size_t new_block, new_meta, new_stage;
} kvq__prec_plan;

static void kvq__prec_plan_free(kvq_cache *c, kvq__prec_plan *pl) {
    for (size_t p = 0; pl->nb && p < pl->n_pages; p++) {
        kvq__free(&c->alloc, pl->nb[p]);
        kvq__free(&c->alloc, pl->ns[p]);
    }
    kvq__free(&c->alloc, pl->nb);
    kvq__free(&c->alloc, pl->nh);
    memset(pl, 0, sizeof *pl);
}

static kvq_status kvq__prec_plan_make(kvq_cache *c, kvq__layer *ly, int kv_head, int is_value,
                                      kvq_codec *nc, kvq__prec_plan *pl) {
    memset(pl, 0, sizeof *pl);
    pl->nh = (kvq__head *)kvq__alloc(&c->alloc, c->H * sizeof *pl->nh);
    if (!pl->nh)
        return KVQ_ERR_NOMEM;
    memcpy(pl->nh, ly->heads, c->H * sizeof *pl->nh);
    for (size_t h = 0; h < c->H; h++)
        if (kv_head < 0 || (size_t)kv_head == h) {
            if (is_value)
                pl->nh[h].vc = nc;
            else
                pl->nh[h].kc = nc;
        }
    /* the new layout, computed on the layer and put back */
    kvq__head *oh = ly->heads;
    size_t old_stage = ly->stage_bytes;
    ly->heads = pl->nh;
    kvq__layout_layer(c, ly);
    pl->new_block = ly->block_bytes;
    pl->new_meta = kvq__block_codec_meta(c, ly);
    pl->new_stage = ly->stage_bytes;
    ly->heads = oh;
    kvq__layout_layer(c, ly);
    pl->n_pages = ly->n_pages;
    pl->nb = (uint8_t **)kvq__calloc(&c->alloc, 2 * (ly->n_pages + 1) * sizeof *pl->nb);
    if (!pl->nb)
        return KVQ_ERR_NOMEM;
    pl->ns = pl->nb + ly->n_pages + 1;
    for (size_t p = 0; p < ly->n_pages; p++) {
        if (ly->pages[p].block) {
            pl->nb[p] = (uint8_t *)kvq__calloc(&c->alloc, pl->new_block);
            if (!pl->nb[p])
                return KVQ_ERR_NOMEM;
        }
        if (ly->pages[p].stage && pl->new_stage != old_stage) {
            pl->ns[p] = (uint8_t *)kvq__calloc(&c->alloc, pl->new_stage);
            if (!pl->ns[p])
                return KVQ_ERR_NOMEM;
        }
    }
    return KVQ_OK;
}

/* Switches one layer to the plan (never fails; takes the plan's memory). */
static void kvq__prec_apply(kvq_cache *c, kvq__layer *ly, int kv_head, int is_value,
                            kvq__prec_plan *pl, double *err, double *ref) {
    size_t P = c->P;
    kvq__head *oh = ly->heads, *nh = pl->nh;
    /* staged tokens are encoded with the codec they were staged for; after
     * this only channel keys remain in staging */
    kvq__settle(c, ly, 1);
    size_t old_block = ly->block_bytes, old_meta = kvq__block_codec_meta(c, ly);
    size_t old_stage = ly->stage_bytes;
    /* the staged channel keys come first in both layouts (a layer with
     * channel keys switches only its values) */
    size_t kpart = 0;
    for (size_t h = 0; h < c->H; h++)
        kpart += oh[h].kchan_bits ? c->P * c->d * sizeof(uint16_t) : 0;
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        uint8_t *nb = pl->nb[p], *ns = pl->ns[p];
        pl->nb[p] = pl->ns[p] = NULL;
        if (!pg->block)
            continue;
        for (size_t h = 0; h < c->H; h++) {
            kvq__head *o = &oh[h], *n = &nh[h];
            int target = kv_head < 0 || (size_t)kv_head == h;
            /* keys */
            int rekey = !is_value && target && !o->kchan_bits;
            if (!rekey) {
                memcpy(nb + n->k_off, pg->block + o->k_off, o->k_hdr + o->kbytes * P);
            } else {
                size_t m = kvq__reencode_slots(ly, p, P, KVQ__ROLE_K, o->kc, o->ktiled,
                                               pg->block + o->k_off, n->kc, n->ktiled,
                                               nb + n->k_off, 0, err, ref);
                ly->reencodes += m;
                ly->bytes_written += m * n->kbytes;
            }
            /* values */
            if (!(is_value && target)) {
                memcpy(nb + n->v_off, pg->block + o->v_off, o->vbytes * P);
            } else {
                size_t m = kvq__reencode_slots(ly, p, P, KVQ__ROLE_V, o->vc, o->vtiled,
                                               pg->block + o->v_off, n->vc, n->vtiled,
                                               nb + n->v_off, 0, err, ref);
                ly->reencodes += m;
                ly->bytes_written += m * n->vbytes;
            }
        }
        kvq__lfree(c, ly, pg->block, old_block, 0);
        pg->block = nb;
        ly->payload_bytes += pl->new_block;
        ly->codec_meta_bytes += pl->new_meta - old_meta;
        if (ns && pg->stage) {
            memcpy(ns, pg->stage, KVQ__MIN(kpart, pl->new_stage));
            kvq__lfree(c, ly, pg->stage, old_stage, 0);
            pg->stage = (uint16_t *)ns;
            ly->payload_bytes += pl->new_stage;
        } else {
            kvq__free(&c->alloc, ns); /* settling freed the page's staging */
        }
    }
    memcpy(ly->heads, nh, c->H * sizeof *nh);
    kvq__layout_layer(c, ly);
    if (ly->payload_bytes + ly->meta_bytes > ly->peak_bytes)
        ly->peak_bytes = ly->payload_bytes + ly->meta_bytes;
    kvq__prec_plan_free(c, pl);
}

kvq_status kvq_cache_set_precision(kvq_cache *c, int layer, int kv_head, int is_value,
                                   const char *spec, double *added_nmse) {
    if (!c || !spec)
        return KVQ_ERR_INVALID_ARG;
    c->errbuf[0] = 0;
    if (layer >= (int)c->L || layer < -1 || kv_head >= (int)c->H || kv_head < -1)
        return KVQ_ERR_RANGE;
    if (!is_value && strncmp(spec, "chan:", 5) == 0)
        return KVQ_ERR_UNSUPPORTED; /* channel key pages are re-encoded only as whole pages */
    for (size_t l = 0; l < c->L && !is_value; l++)
        if (c->layers[l].chan_mode && (layer < 0 || (size_t)layer == l))
            return KVQ_ERR_UNSUPPORTED;
    for (size_t l = 0; l < c->L; l++)
        if (c->layers[l].tier_pages[KVQ__TIER_WARM] || c->layers[l].tier_pages[KVQ__TIER_COLD])
            return KVQ_ERR_UNSUPPORTED; /* warm and cold pages keep the layout they left with */
    /* the codec joins the registry and the workspaces grow for it; neither
     * is visible (a codec unused stays until the cache is freed) */
    kvq_codec *nc = NULL;
    kvq_status st = kvq__get_codec(c, spec, &nc);
    if (st != KVQ_OK)
        return st;
    size_t nqp = KVQ__MAX(nc->qp_bytes, nc->tqp_bytes);
    if (nqp > c->max_qp || nc->acc_len > c->max_acc) {
        /* the attention workspaces grow for the new codec, all or nothing */
        size_t oq = c->max_qp, oa = c->max_acc;
        c->max_qp = KVQ__MAX(oq, nqp);
        c->max_acc = KVQ__MAX(oa, nc->acc_len);
        kvq__work *nw = (kvq__work *)kvq__calloc(&c->alloc, c->n_threads * sizeof *nw);
        st = nw ? KVQ_OK : KVQ_ERR_NOMEM;
        for (size_t t = 0; t < c->n_threads && st == KVQ_OK; t++)
            st = kvq__work_alloc(c, &nw[t]);
        if (st != KVQ_OK) {
            for (size_t t = 0; nw && t < c->n_threads; t++)
                kvq__work_free(c, &nw[t]);
            kvq__free(&c->alloc, nw);
            c->max_qp = oq;
            c->max_acc = oa;
            return st;
        }
        for (size_t t = 0; t < c->n_threads; t++)
            kvq__work_free(c, &c->work[t]);
        kvq__free(&c->alloc, c->work);
        c->work = nw;
    }
    size_t l0 = layer < 0 ? 0 : (size_t)layer, l1 = layer < 0 ? c->L : (size_t)layer + 1;
    /* every layer's new blocks first: all or nothing */
    kvq__prec_plan *plans = (kvq__prec_plan *)kvq__calloc(&c->alloc, (l1 - l0) * sizeof *plans);
    if (!plans)
        return KVQ_ERR_NOMEM;
    for (size_t l = l0; l < l1 && st == KVQ_OK; l++)
        st = kvq__prec_plan_make(c, &c->layers[l], kv_head, is_value, nc, &plans[l - l0]);
    if (st != KVQ_OK) {
        for (size_t l = l0; l < l1; l++)
            kvq__prec_plan_free(c, &plans[l - l0]);
        kvq__free(&c->alloc, plans);
        return st;
    }
    double err = 0.0, ref = 0.0;
    for (size_t l = l0; l < l1; l++)
        kvq__prec_apply(c, &c->layers[l], kv_head, is_value, &plans[l - l0], &err, &ref);
    kvq__free(&c->alloc, plans);
    kvq__track_total_peak(c);
    if (added_nmse)
        *added_nmse = ref > 0 ? err / ref : 0.0;
    return KVQ_OK;
}
