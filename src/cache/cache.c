/*
 * cache.c - the kvq cache object: configuration, the codec registry (one
 * handle per distinct spec, shared by heads), the page layouts of a layer
 * (hot and warm), the attention workspaces, creation and destruction.
 *
 * The cache's other files: cache_page.c (pages, slots, causal staging),
 * cache_append.c, cache_attend.c, cache_evict.c (policies and budgets),
 * cache_precision.c (run-time codec switching), cache_stats.c (read back
 * and accounting), cache_chan.c (KIVI channel key pages), cache_tier.c
 * (hot/warm/cold residency) and cache_snapshot.c (snapshots and prefixes).
 */
#include "cache_impl.h"
#include "../kernels/kernels.h"
#include "../tier/store_ref.h"

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

/* Checked size arithmetic: 1 and *r = the result, or 0 when it does not fit
 * in size_t. */
static int kvq__mul_ok(size_t *r, size_t a, size_t b) { return !__builtin_mul_overflow(a, b, r); }
static int kvq__add_ok(size_t *r, size_t a, size_t b) { return !__builtin_add_overflow(a, b, r); }

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

void kvq__track_total_peak(kvq_cache *c) {
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

kvq_status kvq__get_codec(kvq_cache *c, const char *spec, kvq_codec **out) {
    return kvq__get_codec_state(c, spec, NULL, 0, out);
}

/* *off += hdr + bytes * P, rounded up to a multiple of 8; 0 when that does
 * not fit in size_t */
static int kvq__layout_add(size_t *off, size_t hdr, size_t bytes, size_t P) {
    size_t area, end;
    if (!kvq__mul_ok(&area, bytes, P) || !kvq__add_ok(&area, area, hdr) ||
        !kvq__add_ok(&end, *off, area) || !kvq__add_ok(&end, end, 7))
        return 0;
    *off = end & ~(size_t)7;
    return 1;
}

/* Lays out a page block for the heads' codecs; returns its size, SIZE_MAX
 * when it does not fit in size_t (no allocator gives that much). */
static size_t kvq__layout_heads(kvq_cache *c, kvq__head *heads) {
    size_t off = 0;
    int ok = 1;
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &heads[h];
        hd->k_off = off;
        if (hd->kchan_bits) {
            hd->k_hdr = kvq__chan_header_bytes(c->d);
            hd->kbytes = kvq__chan_row_bytes(c->d, hd->kchan_bits);
        } else {
            hd->k_hdr = 0;
            hd->kbytes = kvq_codec_vector_bytes(hd->kc);
            hd->ktiled = kvq__tiled(hd->kc, KVQ__ROLE_K, c->P);
        }
        ok = ok && kvq__layout_add(&off, hd->k_hdr, hd->kbytes, c->P);
    }
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &heads[h];
        hd->v_off = off;
        hd->vbytes = kvq_codec_vector_bytes(hd->vc);
        hd->vtiled = kvq__tiled(hd->vc, KVQ__ROLE_V, c->P);
        ok = ok && kvq__layout_add(&off, 0, hd->vbytes, c->P);
    }
    return ok ? off : SIZE_MAX;
}

/* f32 and f16 store a token exactly as staging would: written at once */
static int kvq__lossless(const kvq_codec *k) {
    return k->family == KVQ__FAM_FLOAT && (k->kind == KVQ__F32 || k->kind == KVQ__F16);
}

void kvq__layout_layer(kvq_cache *c, kvq__layer *ly) {
    ly->block_bytes = kvq__layout_heads(c, ly->heads);
    if (ly->wheads)
        ly->wblock_bytes = kvq__layout_heads(c, ly->wheads);
    /* page blocks of these sizes come from the huge-page regions (a plan's
     * layout, computed here before its blocks are allocated, too); once
     * the classes are full, further sizes go to posix_memalign */
    if (c->hpool) {
        if (ly->block_bytes != SIZE_MAX)
            (void)kvq__hpool_add_size(c->hpool, ly->block_bytes);
        if (ly->wheads && ly->wblock_bytes != SIZE_MAX)
            (void)kvq__hpool_add_size(c->hpool, ly->wblock_bytes);
    }
    /* staging: [head][slot][d] rows of the staged keys, then of the staged
     * values; at most 2 H P d halves, which kvq_cache_create checks fit */
    size_t off = 0, row = c->P * c->d;
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        hd->kstage = hd->kchan_bits || !kvq__lossless(hd->kc);
        hd->ks_off = hd->kstage ? off : SIZE_MAX;
        off += hd->kstage ? row : 0;
    }
    for (size_t h = 0; h < c->H; h++) {
        kvq__head *hd = &ly->heads[h];
        hd->vstage = !kvq__lossless(hd->vc);
        hd->vs_off = hd->vstage ? off : SIZE_MAX;
        off += hd->vstage ? row : 0;
    }
    ly->stage_bytes = off * sizeof(uint16_t);
    if (ly->wheads) /* warm pages never hold staged tokens */
        for (size_t h = 0; h < c->H; h++) {
            ly->wheads[h].kstage = ly->wheads[h].vstage = 0;
            ly->wheads[h].ks_off = ly->wheads[h].vs_off = SIZE_MAX;
        }
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

void kvq__work_free(kvq_cache *c, kvq__work *w) {
    float **fl[] = {&w->qs, &w->sc, &w->sc2, &w->w, &w->w2, &w->acc, &w->accs, &w->m, &w->l,
                    &w->cdot, &w->scratch, &w->outh};
    kvq__free(&c->alloc, w->cls);
    kvq__free(&c->alloc, w->vcls);
    w->vcls = NULL;
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
    kvq__free(&c->alloc, w->qtk);
    kvq__free(&c->alloc, w->qtw);
    kvq__free(&c->alloc, w->qtf);
    kvq__free(&c->alloc, w->rows);
    w->qpk = w->qpf = w->qpw = w->qtk = w->qtw = w->qtf = w->rows = NULL;
    w->ktt = NULL;
    w->kidx = NULL;
    w->accw = NULL;
}

kvq_status kvq__work_alloc(kvq_cache *c, kvq__work *w) {
    size_t R = c->rows_max, d = c->d, P = c->P;
    size_t BW = c->block_pages * P;
    w->qs = kvq__calloc(&c->alloc, R * d * sizeof(float));
    w->sc = kvq__calloc(&c->alloc, R * BW * sizeof(float));
    w->cls = kvq__calloc(&c->alloc, BW);
    w->vcls = kvq__calloc(&c->alloc, BW);
    w->bpages = kvq__calloc(&c->alloc, c->block_pages * sizeof(size_t));
    w->bne = kvq__calloc(&c->alloc, c->block_pages * sizeof(int));
    w->bnp = kvq__calloc(&c->alloc, c->block_pages * sizeof(int));
    w->rqp = kvq__calloc(&c->alloc, R * sizeof(int32_t));
    if (!w->cls || !w->vcls || !w->bpages || !w->bne || !w->bnp || !w->rqp)
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
    w->qtk = kvq__calloc(&c->alloc, R * c->max_qp);
    w->qtw = kvq__calloc(&c->alloc, R * c->max_qp);
    w->rows = kvq__calloc(&c->alloc, P * 4 * d);
    if (!w->qpw || !w->accw || !w->qtk || !w->qtw || !w->rows)
        return KVQ_ERR_NOMEM;
    if (c->f16->k.tprep && c->f16->tqp_bytes &&
        !(w->qtf = kvq__calloc(&c->alloc, R * c->f16->tqp_bytes)))
        return KVQ_ERR_NOMEM;
    if (!w->qs || !w->sc || !w->sc2 || !w->w || !w->w2 || !w->acc || !w->accs || !w->m || !w->l ||
        !w->cdot || !w->scratch || !w->outh || !w->qpk || !w->qpf)
        return KVQ_ERR_NOMEM;
    return KVQ_OK;
}

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
    kvq__pool_free(c->pool, &c->alloc);
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
    kvq__store_release(c->cold); /* after the records were deleted through it */
    kvq_allocator a = c->alloc;
    kvq__hpool *hp = c->hpool;
    kvq__free(&a, c); /* not a block: freed by posix_memalign's free */
    kvq__hpool_destroy(hp);
}

kvq_status kvq_cache_create(kvq_cache **out, const kvq_cache_config *cfg) {
    if (!out || !cfg)
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (cfg->err_msg && cfg->err_msg_size)
        cfg->err_msg[0] = 0;
    /* each refusal names the one rule it breaks; the limits are kvq.h's */
    if (cfg->n_layers == 0 || cfg->n_kv_heads == 0 || cfg->n_q_heads == 0) {
        kvq__cerr(cfg, "bad shape: n_layers %zu, n_kv_heads %zu, n_q_heads %zu: each must be >= 1",
                  cfg->n_layers, cfg->n_kv_heads, cfg->n_q_heads);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->n_layers > KVQ_MAX_LAYERS || cfg->n_kv_heads > KVQ_MAX_KV_HEADS ||
        cfg->n_q_heads > KVQ_MAX_Q_HEADS) {
        kvq__cerr(cfg, "bad shape: n_layers %zu, n_kv_heads %zu, n_q_heads %zu: the limits are "
                       "%d, %d and %d",
                  cfg->n_layers, cfg->n_kv_heads, cfg->n_q_heads, KVQ_MAX_LAYERS, KVQ_MAX_KV_HEADS,
                  KVQ_MAX_Q_HEADS);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->n_q_heads % cfg->n_kv_heads != 0) {
        kvq__cerr(cfg, "bad shape: n_q_heads %zu is not a multiple of n_kv_heads %zu",
                  cfg->n_q_heads, cfg->n_kv_heads);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->max_tokens == 0 || cfg->max_tokens > KVQ_MAX_TOKENS) {
        kvq__cerr(cfg, "bad shape: max_tokens %zu is outside 1..2^30", cfg->max_tokens);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->head_dim < 1 || cfg->head_dim > KVQ_MAX_HEAD_DIM) {
        kvq__cerr(cfg, "head_dim %zu is outside 1..%d", cfg->head_dim, KVQ_MAX_HEAD_DIM);
        return KVQ_ERR_HEAD_DIM;
    }
    if (cfg->page_tokens < 1 || cfg->page_tokens > KVQ_MAX_PAGE_TOKENS) {
        kvq__cerr(cfg, "page_tokens %zu is outside 1..%d", cfg->page_tokens,
                  KVQ_MAX_PAGE_TOKENS);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->n_threads > KVQ_MAX_THREADS) {
        kvq__cerr(cfg, "n_threads %zu is above %d", cfg->n_threads, KVQ_MAX_THREADS);
        return KVQ_ERR_INVALID_ARG;
    }
    {
        const char *name[4] = {"sinks", "protect_recent", "hot_tokens", "warm_tokens"};
        size_t v[4] = {cfg->sinks, cfg->protect_recent, cfg->hot_tokens, cfg->warm_tokens};
        for (int i = 0; i < 4; i++)
            if (v[i] > KVQ_MAX_TOKENS) {
                kvq__cerr(cfg, "%s %zu is above 2^30", name[i], v[i]);
                return KVQ_ERR_INVALID_ARG;
            }
    }
    if (cfg->n_overrides > KVQ_MAX_OVERRIDES || (cfg->n_overrides && !cfg->overrides)) {
        kvq__cerr(cfg, cfg->overrides ? "n_overrides %zu is above 2^20"
                                      : "n_overrides is %zu but overrides is NULL",
                  cfg->n_overrides);
        return KVQ_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < cfg->n_overrides; i++) {
        const kvq_codec_override *o = &cfg->overrides[i];
        if (!o->codec) {
            kvq__cerr(cfg, "override %zu (layer %d, kv_head %d) has no codec", i, o->layer,
                      o->kv_head);
            return KVQ_ERR_INVALID_ARG;
        }
        if ((o->layer >= 0 && (size_t)o->layer >= cfg->n_layers) ||
            (o->kv_head >= 0 && (size_t)o->kv_head >= cfg->n_kv_heads)) {
            kvq__cerr(cfg, "override %zu (%s): layer %d, kv_head %d: the cache has %zu layers "
                           "and %zu kv heads (< 0: all)",
                      i, o->codec, o->layer, o->kv_head, cfg->n_layers, cfg->n_kv_heads);
            return KVQ_ERR_INVALID_ARG;
        }
    }
    if ((int)cfg->policy < 0 || cfg->policy > KVQ_POLICY_UTILITY) {
        kvq__cerr(cfg, "policy %d is not a kvq_policy", (int)cfg->policy);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->budget_tokens > KVQ_MAX_TOKENS) {
        kvq__cerr(cfg, "budget_tokens %zu is above 2^30", cfg->budget_tokens);
        return KVQ_ERR_INVALID_ARG;
    }
    if (!(cfg->budget_ratio >= 0 && isfinite(cfg->budget_ratio))) {
        kvq__cerr(cfg, "budget_ratio %g must be a finite number >= 0", cfg->budget_ratio);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->cold_ttl_ms > KVQ_MAX_COLD_TTL_MS) {
        kvq__cerr(cfg, "cold_ttl_ms %llu is above 2^40", (unsigned long long)cfg->cold_ttl_ms);
        return KVQ_ERR_INVALID_ARG;
    }
    for (int i = 0; i < 2; i++)
        if (!(isfinite(cfg->link_gbps[i]) && cfg->link_gbps[i] >= 0 &&
              isfinite(cfg->link_latency_ms[i]) && cfg->link_latency_ms[i] >= 0)) {
            kvq__cerr(cfg, "link %d: link_gbps %g and link_latency_ms %g must be finite and >= 0",
                      i, cfg->link_gbps[i], cfg->link_latency_ms[i]);
            return KVQ_ERR_INVALID_ARG;
        }
    if (cfg->k_layout != KVQ_LAYOUT_TOKEN && cfg->k_layout != KVQ_LAYOUT_CHANNEL) {
        kvq__cerr(cfg, "k_layout %d is not a kvq_layout", (int)cfg->k_layout);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->k_prerope && !(cfg->rope_theta > 0 && isfinite(cfg->rope_theta))) {
        kvq__cerr(cfg, "k_prerope needs a finite rope_theta > 0, got %g", cfg->rope_theta);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->k_prerope && (cfg->rope_dims > cfg->head_dim || cfg->rope_dims % 2 != 0)) {
        kvq__cerr(cfg, "rope_dims %zu must be even and at most head_dim %zu", cfg->rope_dims,
                  cfg->head_dim);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->recent_window > cfg->max_tokens) {
        kvq__cerr(cfg, "recent_window %zu is above max_tokens %zu", cfg->recent_window,
                  cfg->max_tokens);
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->k_center && !cfg->k_center_values) {
        /* a centre estimated from the sequence itself would depend on how it
         * is chunked and on the text under evaluation */
        kvq__cerr(cfg, "k_center needs k_center_values (channel means from calibration data)");
        return KVQ_ERR_INVALID_ARG;
    }
    if (cfg->huge_pages != 0 && cfg->huge_pages != -1) {
        kvq__cerr(cfg, "huge_pages is %d: 0 (huge-page regions) or -1 (posix_memalign)",
                  cfg->huge_pages);
        return KVQ_ERR_INVALID_ARG;
    }
    {
        /* the sizes create and a page allocate: the layer and head tables,
         * the centre values, a layer's f16 staging (keys and values of
         * every head); page blocks are checked as they are laid out */
        size_t t;
        size_t hd = cfg->n_kv_heads * cfg->head_dim; /* <= 2^22 by the limits */
        if (!kvq__mul_ok(&t, cfg->n_layers, sizeof(kvq__layer)) ||
            !kvq__mul_ok(&t, cfg->n_kv_heads, sizeof(kvq__head)) ||
            !kvq__mul_ok(&t, cfg->n_layers, hd) || !kvq__mul_ok(&t, t, sizeof(float)) ||
            !kvq__mul_ok(&t, hd, cfg->page_tokens) || !kvq__mul_ok(&t, t, 2 * sizeof(uint16_t))) {
            kvq__cerr(cfg, "n_layers %zu x n_kv_heads %zu x head_dim %zu x page_tokens %zu: its "
                           "tables do not fit in memory",
                      cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, cfg->page_tokens);
            return KVQ_ERR_INVALID_ARG;
        }
    }
    kvq_allocator al;
    kvq__allocator_init(&al, cfg->allocator);
    kvq_cache *c = (kvq_cache *)kvq__calloc(&al, sizeof *c);
    if (!c)
        return KVQ_ERR_NOMEM;
    c->alloc = al;
    c->cfg = *cfg;
    if (!(cfg->allocator && cfg->allocator->alloc && cfg->allocator->free) &&
        !cfg->warm_allocator && cfg->huge_pages == 0) {
        if (kvq__hpool_create(&c->hpool) != KVQ_OK) {
            kvq__free(&al, c);
            return KVQ_ERR_NOMEM;
        }
        kvq__hpool_allocator(c->hpool, &c->alloc);
    }
    c->cfg.overrides = NULL;
    c->cfg.n_overrides = 0;
    c->cfg.warm_codec = NULL;
    c->cfg.warm_allocator = NULL;
    c->tiers = cfg->hot_tokens || cfg->hot_bytes || cfg->warm_tokens || cfg->warm_bytes;
    if (c->hpool)
        c->warm_alloc = c->alloc;
    else
        kvq__allocator_init(&c->warm_alloc,
                            cfg->warm_allocator ? cfg->warm_allocator : cfg->allocator);
    c->cold = cfg->cold_store;
    if (c->cold) /* released by kvq_cache_free: the store outlives the cache */
        kvq__store_retain(c->cold);
    c->warm_distinct = cfg->warm_codec != NULL;
    uint64_t id[2];
    if (kvq__os_random(id, sizeof id) != KVQ_OK) {
        kvq__cerr(cfg, "no random bytes from the OS for the cache's id");
        kvq_cache_free(c);
        return KVQ_ERR_IO;
    }
    c->cache_id = id[0];
    c->cache_id_hi = id[1];
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
    c->n_active = c->n_threads;
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
                    (o->kv_head < 0 || (size_t)o->kv_head == h)) {
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
        if (st == KVQ_OK) {
            kvq__layout_layer(c, ly);
            if (ly->block_bytes == SIZE_MAX || ly->wblock_bytes == SIZE_MAX) {
                kvq__cerr(cfg, "a page of layer %zu (%zu kv heads x %zu tokens) does not fit in "
                               "memory", l, c->H, c->P);
                st = KVQ_ERR_INVALID_ARG;
            }
        }
    }
    /* workspace sizes (no f16 codec when its creation failed) */
    c->max_qp = c->f16 ? c->f16->qp_bytes : 0;
    c->max_acc = c->d;
    for (size_t i = 0; i < c->n_codecs; i++) {
        c->max_qp = KVQ__MAX(c->max_qp, KVQ__MAX(c->codecs[i]->qp_bytes, c->codecs[i]->tqp_bytes));
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
    c->page_softmax = kvq__page_softmax_select(c->f16 ? c->f16->isa : KVQ_ISA_SCALAR);
    c->attn_add = kvq__attn_add_select(c->f16 ? c->f16->isa : KVQ_ISA_SCALAR);
    if (st == KVQ_OK) {
        c->work = (kvq__work *)kvq__calloc(&al, c->n_threads * sizeof *c->work);
        if (!c->work)
            st = KVQ_ERR_NOMEM;
        for (size_t t = 0; t < c->n_threads && st == KVQ_OK; t++)
            st = kvq__work_alloc(c, &c->work[t]);
    }
    if (st == KVQ_OK)
        st = kvq__pool_create(&c->pool, &c->alloc, c->n_threads - 1);
    if (st == KVQ_OK && cfg->policy != KVQ_POLICY_NONE) {
        /* sinks and the protected window shrink to fit a smaller budget
         * (cache_evict.c); max_tokens bounds every budget */
        if (cfg->budget_tokens)
            c->budget = cfg->budget_tokens;
        else if (cfg->budget_ratio > 0)
            c->budget_pending_ratio = 1; /* fixed at the end of the prefill's attend */
        else
            c->budget = cfg->max_tokens;
        c->budget = KVQ__MIN(c->budget, cfg->max_tokens);
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


const char *kvq_cache_last_error(const kvq_cache *c) { return c ? c->errbuf : ""; }

kvq_status kvq_cache_set_threads(kvq_cache *c, size_t n) {
    if (!c)
        return KVQ_ERR_INVALID_ARG;
    if (n < 1 || n > c->n_threads) {
        snprintf(c->errbuf, sizeof c->errbuf,
                 "n_threads %zu is outside 1..%zu (the threads this cache was created with)", n,
                 c->n_threads);
        return KVQ_ERR_INVALID_ARG;
    }
    c->errbuf[0] = 0;
    c->n_active = n;
    return KVQ_OK;
}

kvq_status kvq_cache_get_config(const kvq_cache *c, kvq_cache_config *cfg) {
    if (!c || !cfg)
        return KVQ_ERR_INVALID_ARG;
    *cfg = c->cfg;
    cfg->err_msg = NULL;
    cfg->err_msg_size = 0;
    return KVQ_OK;
}

