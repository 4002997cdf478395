/*
 * cache.c - the kvq cache: paged compressed K/V storage for every layer and
 * KV head, attention straight over the encoded pages through the codecs'
 * fused score/accumulate kernels (online softmax, one page at a time, no
 * decoded copy of the cache), per-layer/per-head codecs, a full-precision
 * recent window, pre-RoPE and centred keys, and byte accounting. Eviction
 * policies live in cache_evict.c, channel-layout key pages in cache_chan.c.
 */
#include "cache_impl.h"
#include "../kernels/kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- small helpers ---- */
static void kvq__cerr(const kvq_cache_config *cfg, const char *fmt, ...) {
    if (!cfg->err_msg || !cfg->err_msg_size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->err_msg, cfg->err_msg_size, fmt, ap);
    va_end(ap);
}

void kvq_cache_config_init(kvq_cache_config *cfg) {
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->k_codec = "f16";
    cfg->v_codec = "f16";
    cfg->page_tokens = 16;
    cfg->sinks = 4;
    cfg->policy = KVQ_POLICY_NONE;
    cfg->protect_recent = 128;
    cfg->k_layout = KVQ_LAYOUT_TOKEN;
    cfg->rope_theta = 10000.0;
    cfg->n_threads = 1;
    cfg->isa = KVQ_ISA_AUTO;
    cfg->link_gbps[0] = cfg->link_gbps[1] = 32.0;
    cfg->link_latency_ms[0] = cfg->link_latency_ms[1] = 0.015;
}

void *kvq__lalloc(kvq_cache *c, kvq__layer *ly, size_t size, int meta) {
    void *p = kvq__calloc(&c->alloc, size);
    if (p)
        kvq__layer_count(ly, size, meta);
    return p;
}

void kvq__lfree(kvq_cache *c, kvq__layer *ly, void *p, size_t size, int meta) {
    if (!p)
        return;
    kvq__free(&c->alloc, p);
    if (meta)
        ly->meta_bytes -= size;
    else
        ly->payload_bytes -= size;
}

static void kvq__track_total_peak(kvq_cache *c) {
    size_t t = 0;
    for (size_t l = 0; l < c->L; l++)
        t += c->layers[l].meta_bytes + c->layers[l].payload_bytes;
    if (t > c->total_peak)
        c->total_peak = t;
}

/* Parses "int<b>" (b = 1..8) for channel-layout keys, with an optional
 * "chan:" prefix; 0 if not of that form. */
static int kvq__chan_bits(const char *spec) {
    if (strncmp(spec, "chan:", 5) == 0)
        spec += 5;
    if (strncmp(spec, "int", 3) != 0)
        return 0;
    const char *p = spec + 3;
    if (*p < '1' || *p > '8' || p[1] != 0)
        return 0;
    return *p - '0';
}

/* The codec registry: one handle per distinct spec, shared by heads; a codec
 * with its own state (fitted tables) is never shared. */
static kvq_status kvq__get_codec_state(kvq_cache *c, const char *spec, const void *state,
                                       size_t state_size, kvq_codec **out) {
    kvq_codec *tmp = NULL;
    kvq_codec_params p = {0};
    p.allocator = &c->alloc;
    p.isa = c->cfg.isa;
    p.err_msg = c->cfg.err_msg;
    p.err_msg_size = c->cfg.err_msg_size;
    kvq_status st = kvq_codec_create(&tmp, spec, c->d, &p);
    if (st != KVQ_OK)
        return st;
    if (state) {
        st = kvq_codec_load_state(tmp, state, state_size);
        if (st != KVQ_OK) {
            kvq__cerr(&c->cfg, "codec %s: its state blob does not load (%s)", spec,
                      kvq_strerror(st));
            kvq_codec_free(tmp);
            return st;
        }
    }
    for (size_t i = 0; i < c->n_codecs && !state; i++)
        if (strcmp(kvq_codec_spec(c->codecs[i]), kvq_codec_spec(tmp)) == 0 &&
            !c->codec_private[i]) {
            kvq_codec_free(tmp);
            *out = c->codecs[i];
            return KVQ_OK;
        }
    if (kvq_codec_needs_fit(tmp)) {
        kvq_codec_free(tmp);
        kvq__cerr(&c->cfg, "codec %s needs fitted tables; load them into a codec first", spec);
        return KVQ_ERR_NOT_FITTED;
    }
    kvq_codec **arr = (kvq_codec **)kvq__alloc(&c->alloc, (c->n_codecs + 1) * sizeof *arr);
    uint8_t *priv = (uint8_t *)kvq__alloc(&c->alloc, c->n_codecs + 1);
    if (!arr || !priv) {
        kvq__free(&c->alloc, arr);
        kvq__free(&c->alloc, priv);
        kvq_codec_free(tmp);
        return KVQ_ERR_NOMEM;
    }
    if (c->n_codecs) {
        memcpy(arr, c->codecs, c->n_codecs * sizeof *arr);
        memcpy(priv, c->codec_private, c->n_codecs);
    }
    kvq__free(&c->alloc, c->codecs);
    kvq__free(&c->alloc, c->codec_private);
    c->codecs = arr;
    c->codec_private = priv;
    c->codec_private[c->n_codecs] = state != NULL;
    c->codecs[c->n_codecs++] = tmp;
    *out = tmp;
    return KVQ_OK;
}

static kvq_status kvq__get_codec(kvq_cache *c, const char *spec, kvq_codec **out) {
    return kvq__get_codec_state(c, spec, NULL, 0, out);
}

/* Lays out a page block for the heads' codecs; returns its size. */
static size_t kvq__layout_heads(kvq_cache *c, kvq__head *heads) {
    size_t off = 0;
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &heads[h];
        hd->k_off = off;
        if (hd->kchan_bits) {
            hd->k_hdr = kvq__chan_header_bytes(c->d);
            hd->kbytes = kvq__chan_row_bytes(c->d, hd->kchan_bits);
            off += hd->k_hdr + hd->kbytes * c->P;
        } else {
            hd->k_hdr = 0;
            hd->kbytes = kvq_codec_vector_bytes(hd->kc);
            off += hd->kbytes * c->P;
        }
        off = (off + 7) & ~(size_t)7;
    }
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &heads[h];
        hd->v_off = off;
        hd->vbytes = kvq_codec_vector_bytes(hd->vc);
        off += hd->vbytes * c->P;
        off = (off + 7) & ~(size_t)7;
    }
    return off;
}

static void kvq__layout_layer(kvq_cache *c, kvq__layer *ly) {
    ly->block_bytes = kvq__layout_heads(c, ly->heads);
    if (ly->wheads)
        ly->wblock_bytes = kvq__layout_heads(c, ly->wheads);
    /* staging holds K and V of pending tokens; with channel keys (chan_mode)
     * only the keys of channel heads wait there, everything else is encoded
     * at once */
    ly->stage_bytes = (ly->chan_mode ? 1 : 2) * c->H * c->P * c->d * sizeof(uint16_t);
}

/* Codec metadata bytes (scales, norms) in one encoded vector, for stats. */
static size_t kvq__codec_meta_per_vec(const kvq_codec *k) {
    switch (k->family) {
    case KVQ__FAM_INT:
        return k->ngroups * (k->bits == 8 ? 2 : 4);
    case KVQ__FAM_TQ:
        return k->norm_bits == 8 ? 1 : 2;
    case KVQ__FAM_TQP:
        return k->norm_bits == 8 ? 2 : 4;
    default:
        return 0;
    }
}

size_t kvq__block_codec_meta(const kvq_cache *c, const kvq__layer *ly) {
    size_t m = 0;
    for (size_t h = 0; h < c->H; h++) {
        const kvq__head *hd = &ly->heads[h];
        m += hd->kchan_bits ? hd->k_hdr : kvq__codec_meta_per_vec(hd->kc) * c->P;
        m += kvq__codec_meta_per_vec(hd->vc) * c->P;
    }
    return m;
}

static void kvq__work_free(kvq_cache *c, kvq__work *w) {
    float **fl[] = {&w->qs, &w->sc, &w->sc2, &w->w, &w->w2, &w->acc, &w->accs, &w->m, &w->l,
                    &w->cdot, &w->scratch, &w->outh};
    kvq__free(&c->alloc, w->cls);
    kvq__free(&c->alloc, w->bpages);
    kvq__free(&c->alloc, w->bne);
    kvq__free(&c->alloc, w->bnp);
    kvq__free(&c->alloc, w->rqp);
    w->rqp = NULL;
    w->cls = NULL;
    w->bpages = NULL;
    w->bne = w->bnp = NULL;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        kvq__free(&c->alloc, *fl[i]);
        *fl[i] = NULL;
    }
    kvq__free(&c->alloc, w->qpk);
    kvq__free(&c->alloc, w->qpf);
    kvq__free(&c->alloc, w->qpw);
    kvq__free(&c->alloc, w->accw);
    w->qpk = w->qpf = w->qpw = NULL;
    w->accw = NULL;
}

static kvq_status kvq__work_alloc(kvq_cache *c, kvq__work *w) {
    size_t R = c->rows_max, d = c->d, P = c->P;
    size_t BW = c->block_pages * P;
    w->qs = kvq__calloc(&c->alloc, R * d * sizeof(float));
    w->sc = kvq__calloc(&c->alloc, R * BW * sizeof(float));
    w->cls = kvq__calloc(&c->alloc, BW);
    w->bpages = kvq__calloc(&c->alloc, c->block_pages * sizeof(size_t));
    w->bne = kvq__calloc(&c->alloc, c->block_pages * sizeof(int));
    w->bnp = kvq__calloc(&c->alloc, c->block_pages * sizeof(int));
    w->rqp = kvq__calloc(&c->alloc, R * sizeof(int32_t));
    if (!w->cls || !w->bpages || !w->bne || !w->bnp || !w->rqp)
        return KVQ_ERR_NOMEM;
    w->sc2 = kvq__calloc(&c->alloc, R * P * sizeof(float));
    w->w = kvq__calloc(&c->alloc, R * P * sizeof(float));
    w->w2 = kvq__calloc(&c->alloc, R * P * sizeof(float));
    w->acc = kvq__calloc(&c->alloc, R * c->max_acc * sizeof(float));
    w->accs = kvq__calloc(&c->alloc, R * d * sizeof(float));
    w->m = kvq__calloc(&c->alloc, R * sizeof(float));
    w->l = kvq__calloc(&c->alloc, R * sizeof(float));
    w->cdot = kvq__calloc(&c->alloc, R * sizeof(float));
    w->scratch = kvq__calloc(&c->alloc, P * d * sizeof(float));
    w->outh = kvq__calloc(&c->alloc, R * d * sizeof(float));
    w->qpk = kvq__calloc(&c->alloc, R * c->max_qp);
    w->qpf = kvq__calloc(&c->alloc, R * c->f16->qp_bytes);
    w->qpw = kvq__calloc(&c->alloc, R * c->max_qp);
    w->accw = kvq__calloc(&c->alloc, R * c->max_acc * sizeof(float));
    if (!w->qpw || !w->accw)
        return KVQ_ERR_NOMEM;
    if (!w->qs || !w->sc || !w->sc2 || !w->w || !w->w2 || !w->acc || !w->accs || !w->m || !w->l ||
        !w->cdot || !w->scratch || !w->outh || !w->qpk || !w->qpf)
        return KVQ_ERR_NOMEM;
    return KVQ_OK;
}

static void kvq__layer_release(kvq_cache *c, kvq__layer *ly);

void kvq_cache_free(kvq_cache *c) {
    if (!c)
        return;
    if (c->layers) {
        for (size_t l = 0; l < c->L; l++) {
            kvq__layer_release(c, &c->layers[l]);
            kvq__free(&c->alloc, c->layers[l].heads);
            kvq__free(&c->alloc, c->layers[l].wheads);
        }
        kvq__free(&c->alloc, c->layers);
    }
    if (c->work) {
        for (size_t t = 0; t < c->n_threads; t++)
            kvq__work_free(c, &c->work[t]);
        kvq__free(&c->alloc, c->work);
    }
    for (size_t i = 0; i < c->n_codecs; i++)
        kvq_codec_free(c->codecs[i]);
    kvq__free(&c->alloc, c->codecs);
    kvq__free(&c->alloc, c->codec_private);
    kvq_codec_free(c->f16);
    kvq__free(&c->alloc, c->rope_freq);
    kvq_allocator a = c->alloc;
    kvq__free(&a, c);
}

kvq_status kvq_cache_create(kvq_cache **out, const kvq_cache_config *cfg) {
    if (!out || !cfg)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (cfg->err_msg && cfg->err_msg_size)
        cfg->err_msg[0] = 0;
    if (cfg->n_layers == 0 || cfg->n_kv_heads == 0 || cfg->n_q_heads == 0 ||
        cfg->n_q_heads % cfg->n_kv_heads != 0 || cfg->max_tokens == 0 ||
        cfg->max_tokens > (1u << 30)) {
        kvq__cerr(cfg, "bad shape: layers, kv heads, q heads (a multiple of kv heads) and "
                       "max_tokens (<= 2^30) must be positive");
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->head_dim < 1 || cfg->head_dim > KVQ__MAX_HEAD_DIM) {
        kvq__cerr(cfg, "head_dim %zu is outside 1..%d", cfg->head_dim, KVQ__MAX_HEAD_DIM);
        return KVQ_ERR_HEAD_DIM;
    }
    if (cfg->page_tokens < 1 || cfg->page_tokens > 4096 || cfg->n_threads > 256 ||
        (int)cfg->policy < 0 || cfg->policy > KVQ_POLICY_UTILITY || !(cfg->budget_ratio >= 0) ||
        (cfg->k_layout != KVQ_LAYOUT_TOKEN && cfg->k_layout != KVQ_LAYOUT_CHANNEL) ||
        (cfg->k_prerope && (!(cfg->rope_theta > 0) || cfg->rope_dims > cfg->head_dim ||
                            cfg->rope_dims % 2 != 0))) {
        kvq__cerr(cfg, "bad option: page_tokens 1..4096, n_threads <= 256, a known policy and "
                       "layout, budget_ratio >= 0, rope_theta > 0, even rope_dims <= head_dim");
        return KVQ_ERR_INVALID_ARG;
    }
    kvq_allocator al;
    kvq__allocator_init(&al, cfg->allocator);
    kvq_cache *c = (kvq_cache *)kvq__calloc(&al, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->alloc = al;
    c->cfg = *cfg;
    c->cfg.overrides = NULL;
    c->cfg.n_overrides = 0;
    c->cfg.warm_codec = NULL;
    c->cfg.warm_allocator = NULL;
    c->tiers = cfg->hot_tokens || cfg->hot_bytes || cfg->warm_tokens || cfg->warm_bytes;
    kvq__allocator_init(&c->warm_alloc, cfg->warm_allocator ? cfg->warm_allocator : cfg->allocator);
    c->cold = cfg->cold_store;
    c->warm_distinct = cfg->warm_codec != NULL;
    c->cache_id = ((uint64_t)(uintptr_t)c * 0x9e3779b97f4a7c15ull) ^ 0x6b7671;
    c->cfg.k_center_values = NULL;
    c->cfg.allocator = NULL;
    c->cfg.k_codec = c->cfg.v_codec = NULL;
    c->L = cfg->n_layers;
    c->H = cfg->n_kv_heads;
    c->QH = cfg->n_q_heads;
    c->G = c->QH / c->H;
    c->d = cfg->head_dim;
    c->P = cfg->page_tokens;
    c->n_threads = cfg->n_threads ? cfg->n_threads : 1;
    if (c->n_threads > c->H)
        c->n_threads = c->H;
    kvq_status st = KVQ_OK;
    kvq_codec_params fp = {0};
    fp.allocator = &c->alloc;
    fp.isa = cfg->isa;
    st = kvq_codec_create(&c->f16, "f16", c->d, &fp);
    if (st == KVQ_OK) {
        c->layers = (kvq__layer *)kvq__calloc(&al, c->L * sizeof *c->layers);
        if (!c->layers)
            st = KVQ_ERR_NOMEM;
    }
    const char *kdef = cfg->k_codec ? cfg->k_codec : "f16";
    const char *vdef = cfg->v_codec ? cfg->v_codec : "f16";
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        ly->open_page = SIZE_MAX;
        ly->heads = (kvq__head *)kvq__calloc(&al, c->H * sizeof *ly->heads);
        if (!ly->heads) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        for (size_t h = 0; h < c->H && st == KVQ_OK; h++) {
            const char *ks = kdef, *vs = vdef;
            const kvq_codec_override *ko = NULL, *vo = NULL;
            for (size_t i = 0; i < cfg->n_overrides; i++) {
                const kvq_codec_override *o = &cfg->overrides[i];
                if ((o->layer < 0 || (size_t)o->layer == l) &&
                    (o->kv_head < 0 || (size_t)o->kv_head == h) && o->codec) {
                    if (o->is_value) {
                        vs = o->codec;
                        vo = o;
                    } else {
                        ks = o->codec;
                        ko = o;
                    }
                }
            }
            kvq__head *hd = &ly->heads[h];
            if (cfg->k_layout == KVQ_LAYOUT_CHANNEL || strncmp(ks, "chan:", 5) == 0) {
                hd->kchan_bits = kvq__chan_bits(ks);
                if (!hd->kchan_bits) {
                    kvq__cerr(cfg, "channel key layout needs an int<b> key codec (b = 1..8), "
                                   "got '%s'", ks);
                    st = KVQ_ERR_BAD_OPTION;
                    break;
                }
            } else {
                st = kvq__get_codec_state(c, ks, ko ? ko->state : NULL, ko ? ko->state_size : 0,
                                          &hd->kc);
                if (st != KVQ_OK)
                    break;
            }
            st = kvq__get_codec_state(c, vs, vo ? vo->state : NULL, vo ? vo->state_size : 0,
                                      &hd->vc);
        }
        for (size_t h = 0; h < c->H && st == KVQ_OK; h++)
            ly->chan_mode |= ly->heads[h].kchan_bits != 0;
        if (st == KVQ_OK) {
            /* warm layout: the warm codec for K (not for channel keys) and V */
            ly->wheads = (kvq__head *)kvq__calloc(&al, c->H * sizeof *ly->wheads);
            if (!ly->wheads)
                st = KVQ_ERR_NOMEM;
            else
                memcpy(ly->wheads, ly->heads, c->H * sizeof *ly->wheads);
            for (size_t h = 0; h < c->H && st == KVQ_OK && cfg->warm_codec; h++) {
                if (!ly->wheads[h].kchan_bits)
                    st = kvq__get_codec(c, cfg->warm_codec, &ly->wheads[h].kc);
                if (st == KVQ_OK)
                    st = kvq__get_codec(c, cfg->warm_codec, &ly->wheads[h].vc);
            }
        }
        if (st == KVQ_OK)
            kvq__layout_layer(c, ly);
    }
    /* workspace sizes */
    c->max_qp = c->f16->qp_bytes;
    c->max_acc = c->d;
    for (size_t i = 0; i < c->n_codecs; i++) {
        c->max_qp = KVQ__MAX(c->max_qp, c->codecs[i]->qp_bytes);
        c->max_acc = KVQ__MAX(c->max_acc, c->codecs[i]->acc_len);
    }
    if (st == KVQ_OK && cfg->k_prerope) {
        c->rope_dims = cfg->rope_dims ? cfg->rope_dims : (c->d & ~(size_t)1);
        c->rope_freq = (float *)kvq__calloc(&al, (c->rope_dims / 2 + 1) * sizeof(float));
        if (!c->rope_freq)
            st = KVQ_ERR_NOMEM;
        else
            for (size_t i = 0; i < c->rope_dims / 2; i++)
                c->rope_freq[i] =
                    1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)c->rope_dims);
    }
    if (st == KVQ_OK && cfg->k_center && cfg->k_center_values) {
        for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
            const float *src = cfg->k_center_values + l * c->H * c->d;
            if (!kvq__all_finite(src, c->H * c->d)) {
                kvq__cerr(cfg, "k_center_values contain NaN or Inf");
                st = KVQ_ERR_NONFINITE;
                break;
            }
            kvq__layer *ly = &c->layers[l];
            ly->center = (float *)kvq__alloc(&al, c->H * c->d * sizeof(float));
            if (!ly->center) {
                st = KVQ_ERR_NOMEM;
                break;
            }
            memcpy(ly->center, src, c->H * c->d * sizeof(float));
            ly->center_ready = 1;
        }
    }
    c->block_pages = c->P >= 256 ? 1 : 256 / c->P;
    c->rows_max = c->G >= 32 ? c->G : (32 / c->G) * c->G; /* query tokens x group per tile */
    c->exp_block = kvq__exp_block_select(c->f16->isa);
    if (st == KVQ_OK) {
        c->work = (kvq__work *)kvq__calloc(&al, c->n_threads * sizeof *c->work);
        if (!c->work)
            st = KVQ_ERR_NOMEM;
        for (size_t t = 0; t < c->n_threads && st == KVQ_OK; t++)
            st = kvq__work_alloc(c, &c->work[t]);
    }
    if (st == KVQ_OK) {
        size_t floor_budget = cfg->sinks + cfg->protect_recent;
        if (cfg->policy != KVQ_POLICY_NONE) {
            if (cfg->budget_tokens) {
                c->budget = KVQ__MAX(cfg->budget_tokens, floor_budget);
            } else if (cfg->budget_ratio > 0) {
                c->budget_pending_ratio = 1;
            } else {
                c->budget = cfg->max_tokens;
            }
            if (c->budget > cfg->max_tokens)
                c->budget = cfg->max_tokens;
        }
    }
    if (st != KVQ_OK) {
        if (st == KVQ_ERR_NOMEM)
            kvq__cerr(cfg, "out of memory");
        kvq_cache_free(c);
        return st;
    }
    /* the caller's buffer is only valid during this call; later detail goes
     * to the cache's own (kvq_cache_last_error) */
    c->errbuf[0] = 0;
    c->cfg.err_msg = c->errbuf;
    c->cfg.err_msg_size = sizeof c->errbuf;
    *out = c;
    return KVQ_OK;
}

/* ---- pages and slots ---- */
static void kvq__layer_release(kvq_cache *c, kvq__layer *ly) {
    for (size_t p = 0; p < ly->n_pages; p++) {
        if (ly->pages[p].tier != KVQ__TIER_HOT)
            kvq__tier_page_free(c, ly, p);
        else
            kvq__lfree(c, ly, ly->pages[p].block, ly->block_bytes, 0);
        kvq__lfree(c, ly, ly->pages[p].stage, ly->stage_bytes, 0);
    }
    kvq__lfree(c, ly, ly->pages, ly->pages_cap * sizeof *ly->pages, 1);
    kvq__lfree(c, ly, ly->pos, ly->slots_cap * sizeof(int32_t), 1);
    kvq__lfree(c, ly, ly->state, ly->slots_cap, 1);
    kvq__lfree(c, ly, ly->score, ly->slots_cap * sizeof(float), 1);
    kvq__lfree(c, ly, ly->free_stack, ly->slots_cap * sizeof(uint32_t), 1);
    kvq__lfree(c, ly, ly->pend_slot, ly->pend_cap * sizeof(uint32_t), 1);
    kvq__lfree(c, ly, ly->pend_pos, ly->pend_cap * sizeof(int32_t), 1);
    kvq__free(&c->alloc, ly->center);
    ly->center = NULL;
}

/* Grows the page table and per-slot arrays to hold at least n_pages pages.
 * All-or-nothing. */
kvq_status kvq__grow_pages(kvq_cache *c, kvq__layer *ly, size_t n_pages) {
    if (n_pages <= ly->pages_cap)
        return KVQ_OK;
    size_t cap = KVQ__MAX(n_pages, ly->pages_cap * 2);
    if (cap < 4)
        cap = 4;
    size_t slots = cap * c->P;
    int util = c->cfg.policy == KVQ_POLICY_UTILITY;
    kvq__page *pages = kvq__lalloc(c, ly, cap * sizeof *pages, 1);
    int32_t *pos = kvq__lalloc(c, ly, slots * sizeof(int32_t), 1);
    uint8_t *state = kvq__lalloc(c, ly, slots, 1);
    float *score = util ? kvq__lalloc(c, ly, slots * sizeof(float), 1) : NULL;
    uint32_t *fs = kvq__lalloc(c, ly, slots * sizeof(uint32_t), 1);
    if (!pages || !pos || !state || (util && !score) || !fs) {
        kvq__lfree(c, ly, pages, cap * sizeof *pages, 1);
        kvq__lfree(c, ly, pos, slots * sizeof(int32_t), 1);
        kvq__lfree(c, ly, state, slots, 1);
        kvq__lfree(c, ly, score, slots * sizeof(float), 1);
        kvq__lfree(c, ly, fs, slots * sizeof(uint32_t), 1);
        return KVQ_ERR_NOMEM;
    }
    size_t old = ly->slots_cap;
    if (ly->pages_cap) {
        memcpy(pages, ly->pages, ly->pages_cap * sizeof *pages);
        memcpy(pos, ly->pos, old * sizeof(int32_t));
        memcpy(state, ly->state, old);
        if (util)
            memcpy(score, ly->score, old * sizeof(float));
        memcpy(fs, ly->free_stack, ly->n_free * sizeof(uint32_t));
    }
    for (size_t i = old; i < slots; i++)
        pos[i] = -1;
    kvq__lfree(c, ly, ly->pages, ly->pages_cap * sizeof *ly->pages, 1);
    kvq__lfree(c, ly, ly->pos, old * sizeof(int32_t), 1);
    kvq__lfree(c, ly, ly->state, old, 1);
    kvq__lfree(c, ly, ly->score, old * sizeof(float), 1);
    kvq__lfree(c, ly, ly->free_stack, old * sizeof(uint32_t), 1);
    ly->pages = pages;
    ly->pos = pos;
    ly->state = state;
    ly->score = score;
    ly->free_stack = fs;
    ly->pages_cap = cap;
    ly->slots_cap = slots;
    return KVQ_OK;
}

/* The free slots of hot page p go on the free stack (token layout), in
 * reverse so that they are handed out in ascending order. */
void kvq__push_page_free(kvq_cache *c, kvq__layer *ly, size_t p) {
    if (ly->chan_mode || ly->pages[p].tier != KVQ__TIER_HOT)
        return;
    for (size_t i = c->P; i-- > 0;)
        if (ly->pos[p * c->P + i] < 0)
            kvq__push_free_slot(ly, (uint32_t)(p * c->P + i));
}

void kvq__push_free_slot(kvq__layer *ly, uint32_t slot) {
    if (ly->state[slot] & KVQ__INSTACK)
        return;
    ly->state[slot] |= KVQ__INSTACK;
    ly->free_stack[ly->n_free++] = slot;
}

/* Frees page p when it holds nothing (and is not the open channel page). */
static void kvq__maybe_free_page(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if ((!pg->block && pg->tier != KVQ__TIER_COLD) || pg->n_valid || p == ly->open_page)
        return;
    if (pg->tier != KVQ__TIER_HOT) {
        kvq__tier_page_free(c, ly, p);
        memset(pg, 0, sizeof *pg);
        ly->pages_alloc--;
        return;
    }
    ly->tier_pages[KVQ__TIER_HOT]--;
    kvq__lfree(c, ly, pg->block, ly->block_bytes, 0);
    kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
    ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
    memset(pg, 0, sizeof *pg);
    ly->pages_alloc--;
}

/* Allocates the block of page p (and staging when needed). */
static kvq_status kvq__page_alloc(kvq_cache *c, kvq__layer *ly, size_t p, int stage) {
    kvq__page *pg = &ly->pages[p];
    pg->block = kvq__lalloc(c, ly, ly->block_bytes, 0);
    if (!pg->block)
        return KVQ_ERR_NOMEM;
    if (stage) {
        pg->stage = kvq__lalloc(c, ly, ly->stage_bytes, 0);
        if (!pg->stage) {
            kvq__lfree(c, ly, pg->block, ly->block_bytes, 0);
            pg->block = NULL;
            return KVQ_ERR_NOMEM;
        }
    }
    pg->n_valid = pg->n_pending = pg->filled = 0;
    pg->encoded = 0;
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    ly->pages_alloc++;
    ly->tier_pages[KVQ__TIER_HOT]++;
    pg->tier = KVQ__TIER_HOT;
    for (size_t i = 0; i < c->P; i++) {
        ly->pos[p * c->P + i] = -1;
        ly->state[p * c->P + i] = KVQ__FREE;
    }
    return KVQ_OK;
}

static inline uint16_t *kvq__stage_k(const kvq_cache *c, const kvq__page *pg, size_t h) {
    return pg->stage + (h * c->P) * c->d;
}
static inline uint16_t *kvq__stage_v(const kvq_cache *c, const kvq__page *pg, size_t h) {
    return pg->stage + ((c->H + h) * c->P) * c->d;
}

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


/* Frees page p's staging block when it holds no pending token. */
static void kvq__maybe_free_stage(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    if (pg->stage && pg->n_pending == 0 && p != ly->open_page) {
        kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
        pg->stage = NULL;
    }
}

/* Removes the free-stack entries of page p (before the page is freed). */
void kvq__purge_free(kvq_cache *c, kvq__layer *ly, size_t p) {
    size_t j = 0;
    for (size_t i = 0; i < ly->n_free; i++) {
        uint32_t s = ly->free_stack[i];
        if (s / c->P == p)
            ly->state[s] &= (uint8_t)~KVQ__INSTACK;
        else
            ly->free_stack[j++] = s;
    }
    ly->n_free = j;
}

/* Encodes one token's K (minus the centre) and V for every head into its
 * slot, except the keys of channel heads (encoded a page at a time). k and
 * v are [H][d] floats. */
static void kvq__encode_token(kvq_cache *c, kvq__layer *ly, size_t slot, const float *k,
                              const float *v) {
    size_t p = slot / c->P, i = slot % c->P;
    uint8_t *blk = ly->pages[p].block;
    float kb[KVQ__MAX_HEAD_DIM];
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        hd->vc->k.encode(hd->vc, blk + hd->v_off + i * hd->vbytes, v + h * c->d, 1);
        ly->bytes_written += hd->vbytes;
        if (hd->kchan_bits)
            continue;
        const float *kh = k + h * c->d;
        if (ly->center) {
            for (size_t t = 0; t < c->d; t++)
                kb[t] = kh[t] - ly->center[h * c->d + t];
            kh = kb;
        }
        hd->kc->k.encode(hd->kc, blk + hd->k_off + i * hd->kbytes, kh, 1);
        ly->bytes_written += hd->kbytes;
    }
}

/* Stages a pending token: K and V of every head, or in chan_mode only the
 * keys of the channel heads. */
static void kvq__stage_write(kvq_cache *c, const kvq__layer *ly, kvq__page *pg, size_t i,
                             const float *k, const float *v) {
    for (size_t h = 0; h < c->H; h++) {
        if (ly->chan_mode && !ly->heads[h].kchan_bits)
            continue;
        c->f16->k.encode(c->f16, (uint8_t *)(kvq__stage_k(c, pg, h) + i * c->d), k + h * c->d, 1);
        if (!ly->chan_mode)
            c->f16->k.encode(c->f16, (uint8_t *)(kvq__stage_v(c, pg, h) + i * c->d), v + h * c->d, 1);
    }
}

static void kvq__stage_read(const kvq_cache *c, const kvq__page *pg, size_t i, float *k, float *v) {
    for (size_t h = 0; h < c->H; h++) {
        if (k)
            c->f16->k.decode(c->f16, k + h * c->d, (const uint8_t *)(kvq__stage_k(c, pg, h) + i * c->d), 1);
        if (v)
            c->f16->k.decode(c->f16, v + h * c->d, (const uint8_t *)(kvq__stage_v(c, pg, h) + i * c->d), 1);
    }
}

/* Encodes the channel-head keys of a full page from staging (everything
 * else of its tokens was encoded when they arrived). */
static kvq_status kvq__chan_flush_page(kvq_cache *c, kvq__layer *ly, size_t p) {
    kvq__page *pg = &ly->pages[p];
    size_t P = c->P, d = c->d;
    float *rows = (float *)kvq__alloc(&c->alloc, P * d * sizeof(float));
    uint8_t *valid = (uint8_t *)kvq__alloc(&c->alloc, P);
    if (!rows || !valid) {
        kvq__free(&c->alloc, rows);
        kvq__free(&c->alloc, valid);
        return KVQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < P; i++)
        valid[i] = KVQ__STATE(ly->state[p * P + i]) == KVQ__PEND;
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        if (!hd->kchan_bits)
            continue;
        c->f16->k.decode(c->f16, rows, (const uint8_t *)kvq__stage_k(c, pg, h), P);
        if (ly->center)
            for (size_t i = 0; i < P; i++)
                for (size_t t = 0; t < d; t++)
                    rows[i * d + t] -= ly->center[h * d + t];
        kvq__chan_encode(pg->block + hd->k_off, d, P, hd->kchan_bits, rows, valid);
        ly->bytes_written += hd->k_hdr + hd->kbytes * P;
    }
    for (size_t i = 0; i < P; i++)
        if (valid[i])
            ly->state[p * P + i] = KVQ__ENC;
    pg->n_pending = 0;
    pg->encoded = 1;
    kvq__free(&c->alloc, rows);
    kvq__free(&c->alloc, valid);
    kvq__maybe_free_stage(c, ly, p);
    return KVQ_OK;
}

/* Token layout: encodes pending tokens that left the recent window. */
static void kvq__flush_window(kvq_cache *c, kvq__layer *ly) {
    size_t R = c->cfg.recent_window;
    float k[KVQ__MAX_HEAD_DIM * 8], v[KVQ__MAX_HEAD_DIM * 8];
    float *kb = k, *vb = v;
    int heap = 0;
    if (c->H * c->d > KVQ__MAX_HEAD_DIM * 8) {
        kb = (float *)kvq__alloc(&c->alloc, 2 * c->H * c->d * sizeof(float));
        if (!kb)
            return; /* stays pending: still correct, only larger */
        vb = kb + c->H * c->d;
        heap = 1;
    }
    while (ly->pend_count > R) {
        size_t at = ly->pend_head;
        uint32_t slot = ly->pend_slot[at];
        int32_t pos = ly->pend_pos[at];
        ly->pend_head = (ly->pend_head + 1) % ly->pend_cap;
        ly->pend_count--;
        if (ly->pos[slot] != pos || KVQ__STATE(ly->state[slot]) != KVQ__PEND)
            continue; /* evicted while pending */
        size_t p = slot / c->P;
        kvq__page *pg = &ly->pages[p];
        kvq__stage_read(c, pg, slot % c->P, kb, vb);
        kvq__encode_token(c, ly, slot, kb, vb);
        ly->state[slot] = KVQ__ENC;
        pg->n_pending--;
        kvq__maybe_free_stage(c, ly, p);
    }
    if (heap)
        kvq__free(&c->alloc, kb);
}


/* ---- eviction ---- */

static int kvq__cand_cmp(const void *a, const void *b) {
    const kvq__cand *x = (const kvq__cand *)a, *y = (const kvq__cand *)b;
    if (x->key < y->key)
        return -1;
    if (x->key > y->key)
        return 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int kvq__pos_cmp(const void *a, const void *b) {
    const kvq__cand *x = (const kvq__cand *)a, *y = (const kvq__cand *)b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

void kvq__evict_slot(kvq_cache *c, kvq__layer *ly, uint32_t slot) {
    size_t p = slot / c->P;
    kvq__page *pg = &ly->pages[p];
    if (KVQ__STATE(ly->state[slot]) == KVQ__PEND)
        pg->n_pending--;
    ly->state[slot] = (uint8_t)(ly->state[slot] & KVQ__INSTACK);
    ly->pos[slot] = -1;
    pg->n_valid--;
    ly->n_tokens--;
    ly->evicted++;
    if (!ly->chan_mode && pg->n_valid > 0 && pg->tier == KVQ__TIER_HOT)
        kvq__push_free_slot(ly, slot);
    if (pg->n_valid == 0 && p != ly->open_page) {
        kvq__purge_free(c, ly, p);
        kvq__maybe_free_page(c, ly, p);
    } else {
        kvq__maybe_free_stage(c, ly, p);
    }
}

/* Valid slots sorted by position (caller frees). NULL on OOM. */
kvq__cand *kvq__sorted_tokens(const kvq_cache *c, const kvq__layer *ly, size_t *n) {
    size_t cnt = 0;
    kvq__cand *v = (kvq__cand *)kvq__alloc(&c->alloc, (ly->n_tokens + 1) * sizeof *v);
    if (!v)
        return NULL;
    for (size_t s = 0; s < ly->n_pages * c->P; s++)
        if (ly->pos[s] >= 0) {
            v[cnt].pos = ly->pos[s];
            v[cnt].slot = (uint32_t)s;
            v[cnt].key = 0;
            cnt++;
        }
    qsort(v, cnt, sizeof *v, kvq__pos_cmp);
    *n = cnt;
    return v;
}

/* Evicts down to target tokens by the policy, never touching sinks or the
 * protected recent window. Returns KVQ_ERR_NOMEM only before changing
 * anything. */
/* The k-th smallest of a[0..n) (k < n); reorders a. Deterministic
 * quickselect (middle pivot, three-way partition). */
static int32_t kvq__select(int32_t *a, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    for (;;) {
        int32_t piv = a[lo + (hi - lo) / 2];
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (a[i] < piv) {
                int32_t x = a[lt];
                a[lt++] = a[i];
                a[i++] = x;
            } else if (a[i] > piv) {
                int32_t x = a[--gt];
                a[gt] = a[i];
                a[i] = x;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return piv;
    }
}

/* Decode-time eviction of a few tokens in O(n): the protected window's
 * threshold by selection, then linear scans for the lowest (key, position)
 * among the evictable tokens; the same choice as the sorting path. */
static kvq_status kvq__evict_few(kvq_cache *c, kvq__layer *ly, size_t m) {
    size_t slots = ly->n_pages * c->P, n = 0;
    int32_t *a = (int32_t *)kvq__alloc(&c->alloc, (ly->n_tokens + 1) * sizeof(int32_t));
    if (!a)
        return KVQ_ERR_NOMEM;
    for (size_t s = 0; s < slots; s++)
        if (ly->pos[s] >= 0)
            a[n++] = ly->pos[s];
    size_t protect = c->cfg.protect_recent;
    int32_t thr = INT32_MAX; /* positions >= thr are in the protected window */
    if (protect >= n)
        thr = INT32_MIN;
    else if (protect > 0)
        thr = kvq__select(a, n, n - protect);
    kvq__free(&c->alloc, a);
    int util = c->cfg.policy == KVQ_POLICY_UTILITY;
    for (size_t e = 0; e < m; e++) {
        size_t best = SIZE_MAX;
        for (size_t s = 0; s < slots; s++) {
            int32_t q = ly->pos[s];
            if (q < 0 || q >= thr || (ly->n_sinks_seen && q <= ly->sink_until))
                continue;
            if (best == SIZE_MAX)
                best = s;
            else {
                float ks = util ? ly->score[s] : 0.0f, kb = util ? ly->score[best] : 0.0f;
                if (ks < kb || (ks == kb && q < ly->pos[best]))
                    best = s;
            }
        }
        if (best == SIZE_MAX)
            break;
        kvq__evict_slot(c, ly, (uint32_t)best);
    }
    return KVQ_OK;
}

static kvq_status kvq__evict_to(kvq_cache *c, kvq__layer *ly, size_t target) {
    if (ly->n_tokens <= target || c->cfg.policy == KVQ_POLICY_NONE)
        return KVQ_OK;
    if (ly->n_tokens - target <= 4)
        return kvq__evict_few(c, ly, ly->n_tokens - target);
    size_t n;
    kvq__cand *v = kvq__sorted_tokens(c, ly, &n);
    if (!v)
        return KVQ_ERR_NOMEM;
    size_t protect = c->cfg.protect_recent;
    size_t end = n > protect ? n - protect : 0; /* v[0..end) are not in the recent window */
    size_t nc = 0;
    for (size_t i = 0; i < end; i++) {
        if (ly->n_sinks_seen && v[i].pos <= ly->sink_until)
            continue;
        kvq__cand cd = v[i];
        cd.key = c->cfg.policy == KVQ_POLICY_UTILITY ? ly->score[cd.slot] : 0.0f;
        v[nc++] = cd;
    }
    if (c->cfg.policy == KVQ_POLICY_UTILITY)
        qsort(v, nc, sizeof *v, kvq__cand_cmp);
    size_t m = ly->n_tokens - target;
    if (m > nc)
        m = nc;
    for (size_t i = 0; i < m; i++)
        kvq__evict_slot(c, ly, v[i].slot);
    kvq__free(&c->alloc, v);
    return KVQ_OK;
}

kvq_status kvq_cache_set_budget(kvq_cache *c, size_t budget) {
    if (!c || budget == 0)
        return KVQ_ERR_INVALID_ARG;
    if (c->cfg.policy == KVQ_POLICY_NONE)
        return KVQ_ERR_UNSUPPORTED;
    budget = KVQ__MAX(budget, c->cfg.sinks + c->cfg.protect_recent);
    c->budget = KVQ__MIN(budget, c->cfg.max_tokens);
    c->budget_pending_ratio = 0;
    for (size_t l = 0; l < c->L; l++) {
        kvq_status st = kvq__evict_to(c, &c->layers[l], c->budget);
        if (st != KVQ_OK)
            return st;
    }
    return KVQ_OK;
}

/* ---- append ---- */
kvq_status kvq_cache_append(kvq_cache *c, size_t layer, const float *k, const float *v,
                            const int32_t *positions, size_t T) {
    if (!c || !k || !v || T == 0)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    kvq__layer *ly = &c->layers[layer];
    size_t H = c->H, d = c->d, P = c->P;
    if (T > c->cfg.max_tokens || T > ((size_t)1 << 30))
        return KVQ_ERR_FULL;
    if (!kvq__all_finite(k, T * H * d) || !kvq__all_finite(v, T * H * d))
        return KVQ_ERR_NONFINITE;
    int32_t prev = ly->appended ? ly->last_pos : -1;
    for (size_t t = 0; t < T; t++) {
        int32_t p = positions ? positions[t] : prev + 1;
        if (p <= prev || p < 0 || p == INT32_MAX)
            return KVQ_ERR_ORDER;
        prev = p;
    }
    if (c->cfg.policy == KVQ_POLICY_NONE && ly->n_tokens + T > c->cfg.max_tokens)
        return KVQ_ERR_FULL;

    /* plan: which tokens stay pending (recent window / channel staging) */
    int chan = ly->chan_mode;
    size_t R = c->cfg.recent_window;
    size_t first_pending = chan ? 0 : (T > R ? T - R : 0);

    /* reservation: page table and the pages the new tokens need */
    size_t avail = chan ? (ly->open_page != SIZE_MAX ? P - ly->pages[ly->open_page].filled : 0)
                        : ly->n_free;
    size_t need_new = T > avail ? (T - avail + P - 1) / P : 0;
    size_t n_unalloc = 0;
    for (size_t p = 0; p < ly->n_pages; p++)
        n_unalloc += !kvq__page_live(&ly->pages[p]);
    size_t reuse = KVQ__MIN(n_unalloc, need_new);
    kvq_status st = kvq__grow_pages(c, ly, ly->n_pages + need_new - reuse);
    if (st != KVQ_OK)
        return st;
    size_t newp[64], *newpages = newp;
    if (need_new > 64) {
        newpages = (size_t *)kvq__alloc(&c->alloc, need_new * sizeof(size_t));
        if (!newpages)
            return KVQ_ERR_NOMEM;
    }
    size_t got = 0, scan = 0, n_pages_before = ly->n_pages;
    float *newcenter = NULL;
    int stage_new = chan || R > 0;
    while (got < need_new && st == KVQ_OK) {
        while (scan < ly->n_pages && kvq__page_live(&ly->pages[scan]))
            scan++;
        size_t p = scan < ly->n_pages ? scan : ly->n_pages++;
        st = kvq__page_alloc(c, ly, p, stage_new);
        if (st == KVQ_OK)
            newpages[got++] = p;
        scan = p + 1;
    }
    /* staging for reused free slots of existing pages (token layout) */
    size_t staged_extra[64], n_staged_extra = 0;
    if (st == KVQ_OK && !chan && R > 0) {
        size_t from_stack = KVQ__MIN(ly->n_free, T);
        for (size_t j = 0; j < from_stack && st == KVQ_OK; j++) {
            size_t t = j;
            if (t < first_pending)
                continue;
            uint32_t slot = ly->free_stack[ly->n_free - 1 - j];
            size_t p = slot / P;
            if (ly->pages[p].stage)
                continue;
            if (n_staged_extra == 64) {
                st = KVQ_ERR_NOMEM; /* more than needed for any sane window; fail cleanly */
                break;
            }
            ly->pages[p].stage = kvq__lalloc(c, ly, ly->stage_bytes, 0);
            if (!ly->pages[p].stage)
                st = KVQ_ERR_NOMEM;
            else
                staged_extra[n_staged_extra++] = p;
        }
    }
    if (st == KVQ_OK && c->cfg.k_center && !ly->center_ready) {
        newcenter = (float *)kvq__calloc(&c->alloc, H * d * sizeof(float));
        if (!newcenter)
            st = KVQ_ERR_NOMEM;
    }
    if (st == KVQ_OK && !chan && R > 0 && !ly->pend_slot) {
        size_t cap = 2 * R + 2;
        ly->pend_slot = kvq__lalloc(c, ly, cap * sizeof(uint32_t), 1);
        ly->pend_pos = kvq__lalloc(c, ly, cap * sizeof(int32_t), 1);
        if (!ly->pend_slot || !ly->pend_pos) {
            kvq__lfree(c, ly, ly->pend_slot, cap * sizeof(uint32_t), 1);
            kvq__lfree(c, ly, ly->pend_pos, cap * sizeof(int32_t), 1);
            ly->pend_slot = NULL;
            ly->pend_pos = NULL;
            st = KVQ_ERR_NOMEM;
        } else {
            ly->pend_cap = cap;
        }
    }
    if (st != KVQ_OK) { /* roll back: the cache is as it was */
        for (size_t j = 0; j < got; j++) {
            kvq__page *pg = &ly->pages[newpages[j]];
            kvq__lfree(c, ly, pg->block, ly->block_bytes, 0);
            kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
            ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
            ly->pages_alloc--;
            ly->tier_pages[KVQ__TIER_HOT]--;
            memset(pg, 0, sizeof *pg);
        }
        for (size_t j = 0; j < n_staged_extra; j++) {
            kvq__lfree(c, ly, ly->pages[staged_extra[j]].stage, ly->stage_bytes, 0);
            ly->pages[staged_extra[j]].stage = NULL;
        }
        ly->n_pages = n_pages_before;
        kvq__free(&c->alloc, newcenter);
        if (newpages != newp)
            kvq__free(&c->alloc, newpages);
        return st;
    }
    /* the new pages go onto the free stack (token layout) in reverse so
     * that slots fill in ascending order */
    if (!chan && got) {
        /* below the existing entries, which serve the first tokens */
        size_t add = got * P;
        memmove(ly->free_stack + add, ly->free_stack, ly->n_free * sizeof(uint32_t));
        size_t at = 0;
        for (size_t j = got; j-- > 0;)
            for (size_t i = P; i-- > 0;) {
                uint32_t s = (uint32_t)(newpages[j] * P + i);
                ly->state[s] |= KVQ__INSTACK;
                ly->free_stack[at++] = s;
            }
        ly->n_free += add;
    }

    /* commit */
    if (c->budget_pending_ratio) {
        size_t b = (size_t)ceil(c->cfg.budget_ratio * (double)T);
        b = KVQ__MAX(b, c->cfg.sinks + c->cfg.protect_recent);
        c->budget = KVQ__MIN(b, c->cfg.max_tokens);
        c->budget_pending_ratio = 0;
    }
    if (newcenter) {
        for (size_t t = 0; t < T; t++)
            for (size_t i = 0; i < H * d; i++)
                newcenter[i] += k[t * H * d + i];
        for (size_t i = 0; i < H * d; i++)
            newcenter[i] /= (float)T;
        ly->center = newcenter;
        ly->center_ready = 1;
    }
    for (size_t t = 0; t < T; t++) {
        int32_t pos = positions ? positions[t] : (ly->appended ? ly->last_pos + 1 : 0);
        size_t slot;
        if (chan) {
            if (ly->open_page == SIZE_MAX || ly->pages[ly->open_page].filled == P) {
                size_t np = SIZE_MAX;
                /* the next allocated page that has not been filled yet */
                for (size_t p = 0; p < ly->n_pages; p++)
                    if (ly->pages[p].block && ly->pages[p].filled == 0 && !ly->pages[p].encoded &&
                        ly->pages[p].n_valid == 0 && p != ly->open_page) {
                        np = p;
                        break;
                    }
                size_t old = ly->open_page;
                ly->open_page = np;
                if (old != SIZE_MAX && ly->pages[old].n_valid == 0 && ly->pages[old].encoded)
                    kvq__maybe_free_page(c, ly, old);
            }
            kvq__page *pg = &ly->pages[ly->open_page];
            slot = ly->open_page * P + pg->filled++;
        } else {
            uint32_t s;
            do {
                s = ly->free_stack[--ly->n_free];
                ly->state[s] &= (uint8_t)~KVQ__INSTACK;
            } while (KVQ__STATE(ly->state[s]) != KVQ__FREE);
            slot = s;
        }
        size_t p = slot / P;
        kvq__page *pg = &ly->pages[p];
        ly->pos[slot] = pos;
        pg->last_seq = ly->appended;
        if (pg->n_valid == 0 || pos < pg->min_pos)
            pg->min_pos = pos;
        if (ly->score)
            ly->score[slot] = 1.0f;
        pg->n_valid++;
        ly->n_tokens++;
        if (ly->n_sinks_seen < c->cfg.sinks) {
            ly->n_sinks_seen++;
            ly->sink_until = pos;
        }
        const float *kt = k + t * H * d, *vt = v + t * H * d;
        if (chan || t >= first_pending) {
            if (chan)
                kvq__encode_token(c, ly, slot, kt, vt); /* all but the channel keys */
            kvq__stage_write(c, ly, pg, slot % P, kt, vt);
            ly->state[slot] = KVQ__PEND;
            pg->n_pending++;
            if (!chan) {
                size_t at = (ly->pend_head + ly->pend_count) % ly->pend_cap;
                ly->pend_slot[at] = (uint32_t)slot;
                ly->pend_pos[at] = pos;
                ly->pend_count++;
                if (ly->pend_count >= ly->pend_cap)
                    kvq__flush_window(c, ly);
            }
        } else {
            kvq__encode_token(c, ly, slot, kt, vt);
            ly->state[slot] = KVQ__ENC;
        }
        ly->last_pos = pos;
        ly->appended++;
    }
    if (chan) {
        /* encode full pages whose newest token left the recent window */
        for (size_t p = 0; p < ly->n_pages; p++) {
            kvq__page *pg = &ly->pages[p];
            if (!pg->block || pg->encoded || pg->filled < P)
                continue;
            uint64_t younger = ly->appended - 1 - pg->last_seq; /* appended after its newest */
            if (younger >= R) {
                if (kvq__chan_flush_page(c, ly, p) != KVQ_OK)
                    break; /* stays in f16 staging: correct, only larger */
            }
        }
    } else if (R > 0) {
        kvq__flush_window(c, ly);
        for (size_t j = 0; j < got; j++)
            kvq__maybe_free_stage(c, ly, newpages[j]);
    }
    if (newpages != newp)
        kvq__free(&c->alloc, newpages);
    if (c->cfg.policy != KVQ_POLICY_NONE && c->budget)
        (void)kvq__evict_to(c, ly, c->budget);
    if (c->tiers)
        (void)kvq__tier_enforce(c, layer); /* failures stay hot and are counted */
    kvq__track_total_peak(c);
    return KVQ_OK;
}

/* ---- attention ---- */
typedef struct {
    kvq_cache *c;
    kvq__layer *ly;
    const float *q;
    const int32_t *qpos;
    size_t T;
    float *out;
    float *attn; /* [H][slots] sums of attention weights, or NULL */
    kvq__work *w;
    size_t h0, hstep;
    kvq_status st;
} kvq__attn_job;

/* Scores of the keys of page p for head h into sc (stride ss) for the nr
 * scaled query rows of the tile: encoded slots through the fused kernel,
 * pending slots from the f16 staging; slots that are free, or in the future
 * of a row's query (causal mask), get -inf. */
static void kvq__page_scores(kvq_cache *c, kvq__layer *ly, size_t h, size_t p, const uint8_t *cls,
                             int ne, int npd, size_t nr, kvq__work *w, float *sc, size_t ss) {
    const kvq__page *pg = &ly->pages[p];
    const kvq__head *hd = kvq__page_heads(ly, pg) + h;
    const uint8_t *qpk = pg->tier == KVQ__TIER_WARM && c->warm_distinct ? w->qpw : w->qpk;
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
                    hd->kc->k.decode(hd->kc, row, pg->block + hd->k_off + i * hd->kbytes, 1);
                if (ly->center)
                    for (size_t t = 0; t < d; t++)
                        row[t] += ly->center[h * d + t];
            } else if (cls[i] == KVQ__PEND) {
                c->f16->k.decode(c->f16, row, (const uint8_t *)(kvq__stage_k(c, pg, h) + i * d), 1);
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
        else
            hd->kc->k.score(hd->kc, sc, ss, qpk, nr, pg->block + hd->k_off, P);
        for (size_t r = 0; r < nr; r++)
            if (w->cdot[r] != 0.0f)
                for (size_t i = 0; i < P; i++)
                    sc[r * ss + i] += w->cdot[r];
        w->bytes_read += hd->k_hdr + P * hd->kbytes;
    }
    if (npd)
        c->f16->k.score(c->f16, w->sc2, P, w->qpf, nr, (const uint8_t *)kvq__stage_k(c, pg, h), P);
    for (size_t i = 0; i < P; i++) {
        if (cls[i] == KVQ__PEND)
            for (size_t r = 0; r < nr; r++)
                sc[r * ss + i] = w->sc2[r * P + i];
        else if (cls[i] != KVQ__ENC)
            for (size_t r = 0; r < nr; r++)
                sc[r * ss + i] = -INFINITY;
    }
    /* causal mask: only pages that reach past a row's query position */
    for (size_t r = 0; r < nr; r++)
        for (size_t i = 0; i < P; i++)
            if (pos[i] > w->rqp[r])
                sc[r * ss + i] = -INFINITY;
}

/* Attention of KV head h, flash-style over tiles of query rows (several
 * query tokens x the query heads of the group): blocks of pages are scored
 * for all rows at once, folded into per-row running maxima and sums (online
 * softmax), and their values accumulated with the exponentiated weights. */
static void kvq__attend_head(kvq__attn_job *jb, size_t h, float *rawsc) {
    kvq_cache *c = jb->c;
    kvq__layer *ly = jb->ly;
    kvq__work *w = jb->w;
    const kvq__head *hd = &ly->heads[h], *wd = &ly->wheads[h];
    size_t P = c->P, d = c->d, G = c->G, QH = c->QH, BW = c->block_pages * P;
    size_t alen = hd->vc->acc_len, walen = wd->vc->acc_len, tile = c->rows_max / G;
    /* warm pages need their own prepared query and accumulator only when the
     * warm codecs differ; otherwise they share the hot ones (same sums) */
    const int warm = ly->tier_pages[KVQ__TIER_WARM] > 0 && c->warm_distinct;
    const float scale = 1.0f / sqrtf((float)d);
    uint8_t *cls = w->cls;
    size_t *bp = w->bpages;
    int *bne = w->bne, *bnp = w->bnp;
    /* where pending tokens keep their keys / values: staged in f16, or
     * (chan_mode, except channel keys) already encoded */
    const int kstaged = !ly->chan_mode || hd->kchan_bits, vstaged = !ly->chan_mode;
    for (size_t t0 = 0; t0 < jb->T; t0 += tile) {
        size_t nt = KVQ__MIN(tile, jb->T - t0), nr = nt * G;
        int32_t qmax = INT32_MIN;
        for (size_t tt = 0; tt < nt; tt++)
            for (size_t g = 0; g < G; g++) {
                size_t r = tt * G + g;
                const float *src = jb->q + ((t0 + tt) * QH + h * G + g) * d;
                for (size_t i = 0; i < d; i++)
                    w->qs[r * d + i] = src[i] * scale;
                w->m[r] = -INFINITY;
                w->l[r] = 0.0f;
                w->rqp[r] = jb->qpos[t0 + tt];
                float cd = 0.0f;
                if (ly->center && !c->cfg.k_prerope)
                    for (size_t i = 0; i < d; i++)
                        cd += w->qs[r * d + i] * ly->center[h * d + i];
                w->cdot[r] = cd;
                qmax = KVQ__MAX(qmax, w->rqp[r]);
            }
        if (!c->cfg.k_prerope) {
            if (hd->kc)
                kvq__codec_prep(hd->kc, w->qpk, w->qs, nr);
            if (warm && wd->kc)
                kvq__codec_prep(wd->kc, w->qpw, w->qs, nr);
            kvq__codec_prep(c->f16, w->qpf, w->qs, nr);
        }
        if (warm)
            memset(w->accw, 0, nr * walen * sizeof(float));
        memset(w->acc, 0, nr * alen * sizeof(float));
        memset(w->accs, 0, nr * d * sizeof(float));
        int any_pend = 0;
        size_t p = 0;
        while (p < ly->n_pages) {
            /* gather a block of pages with tokens visible to the tile */
            size_t nb = 0;
            for (; p < ly->n_pages && nb < c->block_pages; p++) {
                const kvq__page *pg = &ly->pages[p];
                if (!pg->block || pg->min_pos > qmax)
                    continue; /* cold pages were promoted before attention when visible */
                uint8_t *cl = cls + nb * P;
                int ne = 0, npd = 0;
                const int32_t *pos = ly->pos + p * P;
                const uint8_t *stt = ly->state + p * P;
                for (size_t i = 0; i < P; i++) {
                    uint8_t st = KVQ__STATE(stt[i]);
                    if (pos[i] < 0 || pos[i] > qmax)
                        st = KVQ__FREE;
                    else if (st == KVQ__PEND && !kstaged)
                        st = KVQ__ENC;
                    cl[i] = st;
                    ne += st == KVQ__ENC;
                    npd += st == KVQ__PEND;
                }
                if (!ne && !npd)
                    continue;
                bp[nb] = p;
                bne[nb] = ne;
                bnp[nb] = npd;
                kvq__page_scores(c, ly, h, p, cl, ne, npd, nr, w, w->sc + nb * P, BW);
                any_pend |= npd;
                nb++;
            }
            if (!nb)
                break;
            size_t width = nb * P;
            for (size_t r = 0; r < nr; r++) {
                float *sc = w->sc + r * BW;
                if (rawsc)
                    for (size_t b = 0; b < nb; b++)
                        memcpy(rawsc + r * ly->slots_cap + bp[b] * P, sc + b * P, P * sizeof(float));
                float bm = -INFINITY;
                for (size_t i = 0; i < width; i++)
                    bm = sc[i] > bm ? sc[i] : bm;
                float mnew = bm > w->m[r] ? bm : w->m[r];
                if (mnew == -INFINITY) {
                    for (size_t i = 0; i < width; i++)
                        sc[i] = 0.0f;
                    continue;
                }
                if (mnew > w->m[r] && w->l[r] > 0.0f) {
                    float f = expf(w->m[r] - mnew);
                    for (size_t i = 0; i < alen; i++)
                        w->acc[r * alen + i] *= f;
                    if (warm)
                        for (size_t i = 0; i < walen; i++)
                            w->accw[r * walen + i] *= f;
                    if (any_pend)
                        for (size_t i = 0; i < d; i++)
                            w->accs[r * d + i] *= f;
                    w->l[r] *= f;
                }
                w->m[r] = mnew;
                w->l[r] += c->exp_block(sc, width, mnew);
            }
            for (size_t b = 0; b < nb; b++) {
                const kvq__page *pg = &ly->pages[bp[b]];
                const float *wb = w->sc + b * P;
                const int pw = pg->tier == KVQ__TIER_WARM && c->warm_distinct;
                const kvq__head *ph = pw ? wd : hd;
                float *acc = pw ? w->accw : w->acc;
                size_t al = pw ? walen : alen;
                if (bnp[b] && vstaged) {
                    /* split the weights: encoded slots vs staged slots */
                    const uint8_t *cl = cls + b * P;
                    for (size_t r = 0; r < nr; r++)
                        for (size_t i = 0; i < P; i++) {
                            float x = wb[r * BW + i];
                            w->w[r * P + i] = cl[i] == KVQ__ENC ? x : 0.0f;
                            w->w2[r * P + i] = cl[i] == KVQ__PEND ? x : 0.0f;
                        }
                    c->f16->k.accum(c->f16, w->accs, d, w->w2, P, nr,
                                    (const uint8_t *)kvq__stage_v(c, pg, h), P);
                    if (bne[b])
                        ph->vc->k.accum(ph->vc, acc, al, w->w, P, nr, pg->block + ph->v_off, P);
                } else {
                    ph->vc->k.accum(ph->vc, acc, al, wb, BW, nr, pg->block + ph->v_off, P);
                }
                if (bne[b] || !vstaged)
                    w->bytes_read += P * ph->vbytes;
            }
        }
        for (size_t tt = 0; tt < nt; tt++)
            for (size_t g = 0; g < G; g++) {
                size_t r = tt * G + g;
                float *o = jb->out + ((t0 + tt) * QH + h * G + g) * d;
                memset(o, 0, d * sizeof(float));
                if (hd->vc->k.finish)
                    hd->vc->k.finish(hd->vc, o, w->acc + r * alen);
                else
                    for (size_t i = 0; i < d; i++)
                        o[i] += w->acc[r * alen + i];
                if (warm) {
                    if (wd->vc->k.finish)
                        wd->vc->k.finish(wd->vc, o, w->accw + r * walen);
                    else
                        for (size_t i = 0; i < d; i++)
                            o[i] += w->accw[r * walen + i];
                }
                float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
                for (size_t i = 0; i < d; i++)
                    o[i] = (o[i] + (any_pend ? w->accs[r * d + i] : 0.0f)) * inv;
            }
        if (rawsc && jb->attn) {
            float *a = jb->attn + h * ly->slots_cap;
            for (size_t s = 0; s < ly->n_pages * P; s++) {
                if (ly->pos[s] < 0 || !ly->pages[s / P].block || ly->pages[s / P].min_pos > qmax)
                    continue;
                float sum = 0.0f;
                for (size_t r = 0; r < nr; r++)
                    if (w->l[r] > 0.0f && ly->pos[s] <= w->rqp[r])
                        sum += expf(rawsc[r * ly->slots_cap + s] - w->m[r]) / w->l[r];
                a[s] += sum;
            }
        }
    }
}

static void *kvq__attn_thread(void *arg) {
    kvq__attn_job *jb = (kvq__attn_job *)arg;
    kvq_cache *c = jb->c;
    float *rawsc = NULL;
    if (jb->attn) {
        rawsc = (float *)kvq__alloc(&c->alloc, c->rows_max * jb->ly->slots_cap * sizeof(float) + 64);
        if (!rawsc) {
            jb->st = KVQ_ERR_NOMEM;
            return NULL;
        }
    }
    for (size_t h = jb->h0; h < c->H; h += jb->hstep)
        kvq__attend_head(jb, h, rawsc);
    kvq__free(&c->alloc, rawsc);
    return NULL;
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
    if (c->tiers) {
        int32_t qmax = INT32_MIN;
        for (size_t t = 0; t < T; t++)
            qmax = qpos[t] > qmax ? qpos[t] : qmax;
        kvq_status tst = kvq__tier_before_attend(c, layer, qmax);
        if (tst != KVQ_OK)
            return tst;
    }
    int want_attn = token_attn != NULL || c->cfg.policy == KVQ_POLICY_UTILITY;
    float *attn = NULL;
    kvq__cand *sorted = NULL;
    size_t n_sorted = 0;
    if (want_attn && ly->slots_cap) {
        attn = (float *)kvq__calloc(&c->alloc, H * ly->slots_cap * sizeof(float));
        if (!attn)
            return KVQ_ERR_NOMEM;
        if (token_attn) {
            sorted = kvq__sorted_tokens(c, ly, &n_sorted);
            if (!sorted) {
                kvq__free(&c->alloc, attn);
                return KVQ_ERR_NOMEM;
            }
        }
    }
    kvq__attn_job jobs[256];
    pthread_t th[256];
    size_t nt = c->n_threads;
    for (size_t i = 0; i < nt; i++) {
        jobs[i] = (kvq__attn_job){c, ly, q, qpos, T, out, attn, &c->work[i], i, nt, KVQ_OK};
        c->work[i].bytes_read = 0;
    }
    int running[256] = {0};
    for (size_t i = 1; i < nt; i++)
        running[i] = pthread_create(&th[i], NULL, kvq__attn_thread, &jobs[i]) == 0;
    kvq__attn_thread(&jobs[0]);
    for (size_t i = 1; i < nt; i++) /* a thread that could not start runs here */
        if (!running[i])
            kvq__attn_thread(&jobs[i]);
    kvq_status st = KVQ_OK;
    for (size_t i = 0; i < nt; i++) {
        if (running[i])
            pthread_join(th[i], NULL);
        if (jobs[i].st != KVQ_OK)
            st = jobs[i].st;
    }
    for (size_t i = 0; i < nt; i++) {
        ly->bytes_read += c->work[i].bytes_read;
        for (int k = 0; k < 3; k++) {
            c->ts.reads[k] += c->work[i].tier_reads[k];
            c->work[i].tier_reads[k] = 0;
        }
    }
    if (st == KVQ_OK && attn) {
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
    kvq__free(&c->alloc, attn);
    kvq__free(&c->alloc, sorted);
    if (st == KVQ_OK && c->tiers)
        (void)kvq__tier_enforce(c, layer);
    return st;
}

/* ---- read back ---- */
kvq_status kvq_cache_tokens(const kvq_cache *c, size_t layer, size_t *n) {
    if (!c || !n)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    *n = c->layers[layer].n_tokens;
    return KVQ_OK;
}

kvq_status kvq_cache_positions(const kvq_cache *c, size_t layer, int32_t *positions,
                               size_t capacity) {
    if (!c || (!positions && capacity))
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L)
        return KVQ_ERR_RANGE;
    const kvq__layer *ly = &c->layers[layer];
    if (capacity < ly->n_tokens)
        return KVQ_ERR_DST_TOO_SMALL;
    size_t n;
    kvq__cand *v = kvq__sorted_tokens(c, ly, &n);
    if (!v)
        return KVQ_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        positions[i] = v[i].pos;
    kvq__free(&c->alloc, v);
    return KVQ_OK;
}

/* Decodes one stored token of head h: key (centre added back) and value. */
static void kvq__read_token(const kvq_cache *c, const kvq__layer *ly, size_t slot, size_t h,
                            const uint8_t *blk, float *k, float *v) {
    size_t p = slot / c->P, i = slot % c->P, d = c->d;
    const kvq__page *pg = &ly->pages[p];
    const kvq__head *hd = kvq__page_heads(ly, pg) + h;
    int pend = KVQ__STATE(ly->state[slot]) == KVQ__PEND;
    if (pend && k && (!ly->chan_mode || hd->kchan_bits)) {
        c->f16->k.decode(c->f16, k, (const uint8_t *)(kvq__stage_k(c, pg, h) + i * d), 1);
        k = NULL;
    }
    if (pend && v && !ly->chan_mode) {
        c->f16->k.decode(c->f16, v, (const uint8_t *)(kvq__stage_v(c, pg, h) + i * d), 1);
        v = NULL;
    }
    if (k) {
        if (hd->kchan_bits)
            kvq__chan_decode_row(blk + hd->k_off, d, c->P, hd->kchan_bits, i, k);
        else
            hd->kc->k.decode(hd->kc, k, blk + hd->k_off + i * hd->kbytes, 1);
        if (ly->center)
            for (size_t t = 0; t < d; t++)
                k[t] += ly->center[h * d + t];
    }
    if (v)
        hd->vc->k.decode(hd->vc, v, blk + hd->v_off + i * hd->vbytes, 1);
}

kvq_status kvq_cache_get_kv(const kvq_cache *c, size_t layer, int kv_head, size_t first,
                            size_t count, float *k, float *v, size_t capacity) {
    if (!c || (!k && !v))
        return KVQ_ERR_INVALID_ARG;
    if (layer >= c->L || kv_head >= (int)c->H || kv_head < -1)
        return KVQ_ERR_RANGE;
    const kvq__layer *ly = &c->layers[layer];
    if (first > ly->n_tokens || count > ly->n_tokens - first)
        return KVQ_ERR_RANGE;
    size_t nh = kv_head < 0 ? c->H : 1;
    if (count && capacity < count * nh * c->d)
        return KVQ_ERR_DST_TOO_SMALL;
    size_t n;
    kvq__cand *sorted = kvq__sorted_tokens(c, ly, &n);
    if (!sorted)
        return KVQ_ERR_NOMEM;
    kvq_status st = KVQ_OK;
    uint8_t *tmp = NULL;
    size_t tmp_page = SIZE_MAX;
    for (size_t r = 0; r < count && st == KVQ_OK; r++) {
        uint32_t slot = sorted[first + r].slot;
        size_t p = slot / c->P;
        const uint8_t *blk = ly->pages[p].block;
        if (ly->pages[p].tier == KVQ__TIER_COLD) { /* read the record, leave the page cold */
            if (tmp_page != p) {
                kvq__free(&c->alloc, tmp);
                tmp = NULL;
                st = kvq__tier_peek(c, ly, p, &tmp);
                tmp_page = p;
            }
            blk = tmp;
        }
        for (size_t j = 0; j < nh && st == KVQ_OK; j++) {
            size_t h = kv_head < 0 ? j : (size_t)kv_head;
            size_t off = (r * nh + j) * c->d;
            kvq__read_token(c, ly, slot, h, blk, k ? k + off : NULL, v ? v + off : NULL);
        }
    }
    kvq__free(&c->alloc, tmp);
    kvq__free(&c->alloc, sorted);
    return st;
}

size_t kvq__reencode_slots(const kvq__layer *ly, size_t p, size_t P, const kvq_codec *from,
                           const uint8_t *src, size_t fb, const kvq_codec *to, uint8_t *dst,
                           size_t tb, int pend, double *err, double *ref) {
    const size_t d = from->d;
    float a[KVQ__MAX_HEAD_DIM], b[KVQ__MAX_HEAD_DIM];
    size_t m = 0;
    for (size_t i = 0; i < P; i++) {
        int s = KVQ__STATE(ly->state[p * P + i]);
        if (s != KVQ__ENC && !(pend && s == KVQ__PEND))
            continue;
        from->k.decode(from, a, src + i * fb, 1);
        to->k.encode(to, dst + i * tb, a, 1);
        m++;
        if (!err)
            continue;
        to->k.decode(to, b, dst + i * tb, 1);
        for (size_t t = 0; t < d; t++) {
            *err += ((double)a[t] - b[t]) * ((double)a[t] - b[t]);
            *ref += (double)a[t] * a[t];
        }
    }
    return m;
}

/* ---- precision switching ---- */
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
    kvq_codec *nc = NULL;
    kvq_status st = kvq__get_codec(c, spec, &nc);
    if (st != KVQ_OK)
        return st;
    if (nc->qp_bytes > c->max_qp || nc->acc_len > c->max_acc) {
        /* the attention workspaces grow for the new codec, all or nothing */
        size_t oq = c->max_qp, oa = c->max_acc;
        c->max_qp = KVQ__MAX(oq, nc->qp_bytes);
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
    size_t P = c->P;
    double err = 0.0, ref = 0.0;
    size_t l0 = layer < 0 ? 0 : (size_t)layer, l1 = layer < 0 ? c->L : (size_t)layer + 1;
    for (size_t l = l0; l < l1; l++) {
        kvq__layer *ly = &c->layers[l];
        /* new layout for this layer */
        kvq__head *nh = (kvq__head *)kvq__alloc(&c->alloc, c->H * sizeof *nh);
        if (!nh) {
            st = KVQ_ERR_NOMEM;
            break;
        }
        memcpy(nh, ly->heads, c->H * sizeof *nh);
        for (size_t h = 0; h < c->H; h++)
            if (kv_head < 0 || (size_t)kv_head == h) {
                if (is_value)
                    nh[h].vc = nc;
                else
                    nh[h].kc = nc;
            }
        kvq__head *oh = ly->heads;
        size_t old_block = ly->block_bytes, old_meta = kvq__block_codec_meta(c, ly);
        ly->heads = nh;
        kvq__layout_layer(c, ly);
        size_t new_block = ly->block_bytes, new_meta = kvq__block_codec_meta(c, ly);
        ly->heads = oh;
        ly->block_bytes = old_block;
        /* allocate every new block first: all or nothing */
        uint8_t **nb = (uint8_t **)kvq__calloc(&c->alloc, (ly->n_pages + 1) * sizeof *nb);
        int ok = nb != NULL;
        for (size_t p = 0; ok && p < ly->n_pages; p++)
            if (ly->pages[p].block) {
                nb[p] = (uint8_t *)kvq__calloc(&c->alloc, new_block);
                ok = nb[p] != NULL;
            }
        if (!ok) {
            for (size_t p = 0; nb && p < ly->n_pages; p++)
                kvq__free(&c->alloc, nb[p]);
            kvq__free(&c->alloc, nb);
            kvq__free(&c->alloc, nh);
            st = KVQ_ERR_NOMEM;
            break;
        }
        for (size_t p = 0; p < ly->n_pages; p++) {
            kvq__page *pg = &ly->pages[p];
            if (!pg->block)
                continue;
            for (size_t h = 0; h < c->H; h++) {
                kvq__head *o = &oh[h], *n = &nh[h];
                int target = kv_head < 0 || (size_t)kv_head == h;
                /* keys */
                int rekey = !is_value && target && !o->kchan_bits;
                if (!rekey) {
                    memcpy(nb[p] + n->k_off, pg->block + o->k_off, o->k_hdr + o->kbytes * P);
                } else {
                    size_t m = kvq__reencode_slots(ly, p, P, o->kc, pg->block + o->k_off, o->kbytes,
                                                   n->kc, nb[p] + n->k_off, n->kbytes, 0, &err, &ref);
                    ly->reencodes += m;
                    ly->bytes_written += m * n->kbytes;
                }
                /* values (in channel mode, a pending token's value is already encoded) */
                if (!(is_value && target)) {
                    memcpy(nb[p] + n->v_off, pg->block + o->v_off, o->vbytes * P);
                } else {
                    size_t m = kvq__reencode_slots(ly, p, P, o->vc, pg->block + o->v_off, o->vbytes,
                                                   n->vc, nb[p] + n->v_off, n->vbytes,
                                                   ly->chan_mode, &err, &ref);
                    ly->reencodes += m;
                    ly->bytes_written += m * n->vbytes;
                }
            }
            kvq__lfree(c, ly, pg->block, old_block, 0);
            pg->block = nb[p];
            ly->payload_bytes += new_block;
            ly->codec_meta_bytes += new_meta - old_meta;
        }
        kvq__free(&c->alloc, nb);
        memcpy(ly->heads, nh, c->H * sizeof *nh);
        kvq__free(&c->alloc, nh);
        kvq__layout_layer(c, ly);
        if (ly->payload_bytes + ly->meta_bytes > ly->peak_bytes)
            ly->peak_bytes = ly->payload_bytes + ly->meta_bytes;
    }
    kvq__track_total_peak(c);
    if (added_nmse)
        *added_nmse = ref > 0 ? err / ref : 0.0;
    return st;
}

/* ---- accounting ---- */
static void kvq__layer_stats(const kvq_cache *c, const kvq__layer *ly, kvq_stats *st) {
    memset(st, 0, sizeof *st);
    st->tokens = ly->n_tokens;
    st->tokens_appended = ly->appended;
    st->tokens_evicted = ly->evicted;
    st->payload_bytes = ly->payload_bytes;
    st->metadata_bytes = ly->meta_bytes;
    st->codec_meta_bytes = ly->codec_meta_bytes;
    st->stored_bytes = ly->payload_bytes + ly->meta_bytes;
    st->peak_stored_bytes = ly->peak_bytes;
    st->bytes_written = ly->bytes_written;
    st->bytes_read = ly->bytes_read;
    st->reencodes = ly->reencodes;
    st->pages = ly->pages_alloc;
    st->free_slots = ly->pages_alloc * c->P - ly->n_tokens;
    /* asymptotic: a full encoded page costs block_bytes for P tokens */
    double per_tok = (double)ly->block_bytes / (double)c->P;
    double vals = (double)c->H * (double)c->d * 2.0;
    st->asymptotic_bits_per_value = per_tok * 8.0 / vals;
    double fixed = (double)ly->payload_bytes - per_tok * (double)ly->n_tokens;
    st->fixed_bytes = fixed > 0 ? (uint64_t)(fixed + 0.5) : 0;
}

static void kvq__finish_stats(const kvq_cache *c, kvq_stats *st) {
    double vals = (double)st->tokens * (double)c->H * (double)c->d * 2.0;
    st->bits_per_value = vals > 0 ? (double)st->payload_bytes * 8.0 / vals : 0.0;
    st->total_bits_per_value = vals > 0 ? (double)st->stored_bytes * 8.0 / vals : 0.0;
    double slots = (double)st->pages * (double)c->P;
    st->fragmentation = slots > 0 ? (double)st->free_slots / slots : 0.0;
}

kvq_status kvq_cache_stats(const kvq_cache *c, int layer, kvq_stats *st) {
    if (!c || !st)
        return KVQ_ERR_INVALID_ARG;
    if (layer >= (int)c->L || layer < -1)
        return KVQ_ERR_RANGE;
    if (layer >= 0) {
        kvq__layer_stats(c, &c->layers[layer], st);
    } else {
        memset(st, 0, sizeof *st);
        for (size_t l = 0; l < c->L; l++) {
            kvq_stats s;
            kvq__layer_stats(c, &c->layers[l], &s);
            st->tokens += s.tokens;
            st->tokens_appended += s.tokens_appended;
            st->tokens_evicted += s.tokens_evicted;
            st->payload_bytes += s.payload_bytes;
            st->metadata_bytes += s.metadata_bytes;
            st->codec_meta_bytes += s.codec_meta_bytes;
            st->stored_bytes += s.stored_bytes;
            st->bytes_written += s.bytes_written;
            st->bytes_read += s.bytes_read;
            st->reencodes += s.reencodes;
            st->pages += s.pages;
            st->free_slots += s.free_slots;
            st->fixed_bytes += s.fixed_bytes;
            st->asymptotic_bits_per_value += s.asymptotic_bits_per_value / (double)c->L;
        }
        st->peak_stored_bytes = c->total_peak;
    }
    kvq__finish_stats(c, st);
    return KVQ_OK;
}

static size_t kvq__stats_obj(char *dst, size_t cap, const kvq_stats *s) {
    int n = snprintf(dst, cap,
                     "{\"tokens\": %llu, \"tokens_appended\": %llu, \"tokens_evicted\": %llu, "
                     "\"payload_bytes\": %llu, \"metadata_bytes\": %llu, \"codec_meta_bytes\": %llu, "
                     "\"stored_bytes\": %llu, \"peak_stored_bytes\": %llu, \"bytes_written\": %llu, "
                     "\"bytes_read\": %llu, \"reencodes\": %llu, \"pages\": %llu, "
                     "\"free_slots\": %llu, \"bits_per_value\": %.6g, \"total_bits_per_value\": "
                     "%.6g, \"fragmentation\": %.6g, \"asymptotic_bits_per_value\": %.6g, "
                     "\"fixed_bytes\": %llu}",
                     (unsigned long long)s->tokens, (unsigned long long)s->tokens_appended,
                     (unsigned long long)s->tokens_evicted, (unsigned long long)s->payload_bytes,
                     (unsigned long long)s->metadata_bytes,
                     (unsigned long long)s->codec_meta_bytes, (unsigned long long)s->stored_bytes,
                     (unsigned long long)s->peak_stored_bytes,
                     (unsigned long long)s->bytes_written, (unsigned long long)s->bytes_read,
                     (unsigned long long)s->reencodes, (unsigned long long)s->pages,
                     (unsigned long long)s->free_slots, s->bits_per_value, s->total_bits_per_value,
                     s->fragmentation, s->asymptotic_bits_per_value,
                     (unsigned long long)s->fixed_bytes);
    return n < 0 ? 0 : (size_t)n;
}

kvq_status kvq_cache_stats_json(const kvq_cache *c, char *dst, size_t cap, size_t *written) {
    if (!c || !written)
        return KVQ_ERR_INVALID_ARG;
    /* render into a scratch buffer large enough for any layer count */
    size_t need = 600 * (c->L + 1) + 1200;
    char *buf = (char *)kvq__alloc(&c->alloc, need);
    if (!buf)
        return KVQ_ERR_NOMEM;
    size_t n = 0;
    kvq_stats s;
    kvq_cache_stats(c, -1, &s);
    n += (size_t)snprintf(buf + n, need - n, "{\"total\": ");
    n += kvq__stats_obj(buf + n, need - n, &s);
    n += (size_t)snprintf(buf + n, need - n, ", \"layers\": [");
    for (size_t l = 0; l < c->L; l++) {
        kvq_cache_stats(c, (int)l, &s);
        if (l)
            n += (size_t)snprintf(buf + n, need - n, ", ");
        n += kvq__stats_obj(buf + n, need - n, &s);
    }
    n += (size_t)snprintf(buf + n, need - n, "]");
    if (c->tiers) {
        kvq_tier_stats t;
        kvq_cache_tier_stats(c, &t);
        static const char *names[3] = {"hot", "warm", "cold"};
        uint64_t reads = t.reads[0] + t.reads[1] + t.reads[2];
        n += (size_t)snprintf(buf + n, need - n, ", \"tiers\": {");
        for (int k = 0; k < 3; k++)
            n += (size_t)snprintf(buf + n, need - n,
                                  "\"%s\": {\"pages\": %llu, \"tokens\": %llu, \"bytes\": %llu, "
                                  "\"reads\": %llu, \"hit_rate\": %.6g}, ",
                                  names[k], (unsigned long long)t.pages[k],
                                  (unsigned long long)t.tokens[k], (unsigned long long)t.bytes[k],
                                  (unsigned long long)t.reads[k],
                                  reads ? (double)t.reads[k] / (double)reads : 0.0);
        n += (size_t)snprintf(
            buf + n, need - n,
            "\"demotions\": %llu, \"promotions\": %llu, \"demotion_failures\": %llu, "
            "\"dropped_pages\": %llu, \"bytes_moved\": {\"hot_to_warm\": %llu, \"warm_to_hot\": "
            "%llu, \"to_cold\": %llu, \"from_cold\": %llu}, \"modeled_transfer_ms\": %.6g, "
            "\"measured_transfer_ms\": %.6g, \"lost_pages\": %llu, \"verify_mismatches\": %llu}",
            (unsigned long long)t.demotions, (unsigned long long)t.promotions,
            (unsigned long long)t.demotion_failures, (unsigned long long)t.dropped_pages,
            (unsigned long long)t.bytes_hot_to_warm, (unsigned long long)t.bytes_warm_to_hot,
            (unsigned long long)t.bytes_to_cold, (unsigned long long)t.bytes_from_cold,
            t.modeled_transfer_ms, t.measured_transfer_ms, (unsigned long long)t.lost_pages,
            (unsigned long long)t.verify_mismatches);
    }
    n += (size_t)snprintf(buf + n, need - n, "}");
    kvq_status st = KVQ_OK;
    if (dst) {
        if (cap < n + 1)
            st = KVQ_ERR_DST_TOO_SMALL;
        else
            memcpy(dst, buf, n + 1);
    }
    *written = n;
    kvq__free(&c->alloc, buf);
    return st;
}

const char *kvq_cache_last_error(const kvq_cache *c) { return c ? c->errbuf : ""; }

kvq_status kvq_cache_get_config(const kvq_cache *c, kvq_cache_config *cfg) {
    if (!c || !cfg)
        return KVQ_ERR_INVALID_ARG;
    *cfg = c->cfg;
    cfg->err_msg = NULL;
    cfg->err_msg_size = 0;
    return KVQ_OK;
}
