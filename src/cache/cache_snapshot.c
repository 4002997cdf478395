/*
 * cache_snapshot.c - saving and restoring caches through a kvq_store: whole-cache
 * (or token-prefix) snapshots, and vLLM-style prefix caching where each full
 * page is keyed by the SHA-256 of the configuration and the token ids up to
 * its end. Pages travel as page records (record.c), so every byte is
 * checksummed; a snapshot's manifest is written last, is itself
 * checksummed and holds the SHA-256 of every page record it names, so a
 * save cut short is never mistaken for a complete one, and records of
 * another save (two writers of one name) or altered ones are refused.
 *
 * Everything read back is untrusted (a store may be shared): besides the
 * checksums and digests, a restored page's slots are checked against what
 * the cache itself could have written (kvq__slots_why,
 * kvq__layer_slots_why): slot states 0..2, pending tokens only with their
 * staged K/V and newer than every encoded one, positions unique and within
 * the layer's counters, and for a prefix page exactly its own positions.
 *
 * A manifest carries the cache's configuration as "name=value" lines
 * (kvq__config_text): shape, page size, key layout, RoPE, centring, the warm
 * codec and every head's key and value codec with the SHA-256 of its fitted
 * state. A load compares them line by line with the target's and refuses
 * the first that differs (KVQ_ERR_MISMATCH, the field named in
 * kvq_cache_last_error), then compares the centre values bit for bit:
 * encoded pages are only meaningful under the configuration that wrote them.
 *
 * A prefix entry wraps a page record with the page's own token ids and the
 * digest of everything before the page; a hit compares both, so a lookup
 * that lands on another prompt's entry (a key collision, a record stored
 * under the wrong key) is a miss, never another prompt's K/V.
 *
 * Restores are all or nothing: the target cache must be empty and is left
 * empty when anything fails. docs/record-format.md has the byte layouts.
 */
#include "cache_impl.h"
#include "../tier/record.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>

#define KVQ__MANIFEST_VERSION 3u
#define KVQ__MANIFEST_HDR 24 /* "KVQM", version, config text length, name length, save id */
#define KVQ__LAYER_HDR 28    /* appended, last, sink_until, sinks seen, pages, has_center */
#define KVQ__PAGE_ENTRY 36   /* page index, SHA-256 of its record */
#define KVQ__PFX_MAGIC "KVQP"
#define KVQ__PFX_VERSION 1u
#define KVQ__PFX_HDR 48 /* magic, version, flags, page index, P, parent digest */

/* The detail of a failure, for kvq_cache_last_error. */
static void kvq__snap_err(kvq_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kvq__snap_err(kvq_cache *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errbuf, sizeof c->errbuf, fmt, ap);
    va_end(ap);
}

/* ---- the configuration as text ---- */
typedef struct {
    const kvq_allocator *a;
    char *s;
    size_t n, cap;
    int oom;
} kvq__sbuf;

static void kvq__sb_add(kvq__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kvq__sb_add(kvq__sbuf *b, const char *fmt, ...) {
    while (!b->oom) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)w < b->cap) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = KVQ__MAX(2 * b->cap, b->n + (size_t)w + 1024);
        char *ns = (char *)kvq__alloc(b->a, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        if (b->n)
            memcpy(ns, b->s, b->n);
        kvq__free(b->a, b->s);
        b->s = ns;
        b->cap = cap;
    }
}

/* "none", or the SHA-256 (hex) of the codec's state blob when it has state
 * (fitted nuq tables, a norm=8 range). */
static kvq_status kvq__state_hex(kvq_cache *c, const kvq_codec *k, char hex[65]) {
    strcpy(hex, "none");
    if (!k || kvq_codec_state_bytes(k) == 0)
        return KVQ_OK;
    size_t n = 0;
    kvq_status st = kvq_codec_save_state(k, NULL, 0, &n);
    if (st != KVQ_OK)
        return st;
    uint8_t *buf = (uint8_t *)kvq__alloc(&c->alloc, n);
    if (!buf)
        return KVQ_ERR_NOMEM;
    st = kvq_codec_save_state(k, buf, n, &n);
    if (st == KVQ_OK) {
        uint8_t d[KVQ__SHA256_BYTES];
        kvq__sha256(buf, n, d);
        for (int i = 0; i < KVQ__SHA256_BYTES; i++)
            snprintf(hex + 2 * i, 3, "%02x", d[i]);
    }
    kvq__free(&c->alloc, buf);
    return st;
}

/* Every setting that decides what the stored bytes mean, one "name=value"
 * line each, in a fixed order (the text is compared line by line, and the
 * first line that differs names the field). Policies, budgets, windows and
 * tier capacities are left out: they decide what is kept, not what the
 * kept bytes mean. The centre values are compared apart, bit for bit. */
static kvq_status kvq__config_text(kvq_cache *c, kvq__sbuf *b) {
    const kvq_cache_config *g = &c->cfg;
    kvq__sb_add(b, "n_layers=%zu\nn_kv_heads=%zu\nn_q_heads=%zu\nhead_dim=%zu\npage_tokens=%zu\n",
                c->L, c->H, c->QH, c->d, c->P);
    char theta[40]; /* %.17g round-trips; a locale's decimal comma is undone */
    snprintf(theta, sizeof theta, "%.17g", g->rope_theta);
    for (char *q = theta; *q; q++)
        *q = *q == ',' ? '.' : *q;
    kvq__sb_add(b, "k_layout=%s\nk_prerope=%d\nrope_theta=%s\nrope_dims=%zu\nk_center=%d\n",
                g->k_layout == KVQ_LAYOUT_CHANNEL ? "channel" : "token", g->k_prerope ? 1 : 0,
                theta, g->rope_dims ? g->rope_dims : (c->d & ~(size_t)1), g->k_center ? 1 : 0);
    kvq__sb_add(b, "warm_codec=%s\n",
                c->warm_distinct ? kvq_codec_spec(c->layers[0].wheads[0].vc) : "none");
    for (size_t l = 0; l < c->L; l++)
        for (size_t h = 0; h < c->H; h++) {
            const kvq__head *hd = &c->layers[l].heads[h];
            char ks[32], kst[65], vst[65];
            kvq_status st = kvq__state_hex(c, hd->kc, kst);
            if (st == KVQ_OK)
                st = kvq__state_hex(c, hd->vc, vst);
            if (st != KVQ_OK)
                return st;
            if (hd->kchan_bits)
                snprintf(ks, sizeof ks, "chan:int%d", hd->kchan_bits);
            kvq__sb_add(b, "l%zu.h%zu.k_codec=%s\nl%zu.h%zu.k_state=%s\n", l, h,
                        hd->kchan_bits ? ks : kvq_codec_spec(hd->kc), l, h, kst);
            kvq__sb_add(b, "l%zu.h%zu.v_codec=%s\nl%zu.h%zu.v_state=%s\n", l, h,
                        kvq_codec_spec(hd->vc), l, h, vst);
        }
    return b->oom ? KVQ_ERR_NOMEM : KVQ_OK;
}

/* A printable copy of at most 60 bytes of s, for messages. */
static void kvq__printable(char *dst, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < 60; i++)
        dst[k++] = s[i] >= 0x20 && s[i] <= 0x7e ? s[i] : '?';
    if (n > 60 && k + 4 < cap)
        dst[k++] = '.', dst[k++] = '.', dst[k++] = '.';
    dst[k] = 0;
}

/* 0 when the snapshot's configuration text (snap, sn bytes) equals ours;
 * otherwise sets the message naming the first field that differs. */
static int kvq__config_differs(kvq_cache *c, const char *name, const char *snap, size_t sn,
                               const char *ours, size_t on) {
    size_t i = 0, j = 0;
    while (i < sn || j < on) {
        const char *a = snap + i, *b = ours + j;
        const char *ae = i < sn ? memchr(a, '\n', sn - i) : NULL;
        const char *be = j < on ? memchr(b, '\n', on - j) : NULL;
        size_t al = i < sn ? (ae ? (size_t)(ae - a) : sn - i) : 0;
        size_t bl = j < on ? (be ? (size_t)(be - b) : on - j) : 0;
        if (i < sn && j < on && al == bl && memcmp(a, b, al) == 0) {
            i += al + 1;
            j += bl + 1;
            continue;
        }
        const char *aq = i < sn ? memchr(a, '=', al) : NULL;
        const char *bq = j < on ? memchr(b, '=', bl) : NULL;
        char f[72], va[72], vb[72];
        if (aq && bq && aq - a == bq - b && memcmp(a, b, (size_t)(aq - a)) == 0) {
            kvq__printable(f, sizeof f, b, (size_t)(bq - b));
            kvq__printable(va, sizeof va, aq + 1, al - (size_t)(aq - a) - 1);
            kvq__printable(vb, sizeof vb, bq + 1, bl - (size_t)(bq - b) - 1);
            kvq__snap_err(c, "snapshot '%.60s' does not match this cache: %s is %s in the snapshot, "
                             "%s here", name, f, va, vb);
        } else {
            kvq__printable(va, sizeof va, a, al);
            kvq__printable(vb, sizeof vb, b, bl);
            kvq__snap_err(c, "snapshot '%.60s' does not match this cache: the snapshot has '%s' "
                             "where this cache has '%s'", name, i < sn ? va : "(nothing)",
                          j < on ? vb : "(nothing)");
        }
        return 1;
    }
    return 0;
}

/* The digest that prefix keys start from: the configuration text and the
 * centre values. */
static kvq_status kvq__config_digest(kvq_cache *c, uint8_t out[KVQ__SHA256_BYTES]) {
    kvq__sbuf b = {&c->alloc, NULL, 0, 0, 0};
    kvq_status st = kvq__config_text(c, &b);
    if (st == KVQ_OK) {
        kvq__sha256_ctx s;
        kvq__sha256_init(&s);
        kvq__sha256_update(&s, "kvq prefix 1\n", 13);
        kvq__sha256_update(&s, b.s, b.n);
        for (size_t l = 0; l < c->L; l++)
            if (c->layers[l].center)
                for (size_t i = 0; i < c->H * c->d; i++) {
                    uint8_t le[4];
                    kvq__st32(le, kvq__f32_bits(c->layers[l].center[i]));
                    kvq__sha256_update(&s, le, 4);
                }
        kvq__sha256_final(&s, out);
    }
    kvq__free(&c->alloc, b.s);
    return st;
}

/* Layout text of a page's heads, with a tier prefix and a staging flag. */
static size_t kvq__snap_layout(const kvq_cache *c, const kvq__head *hs, int warm, int stage, char *buf,
                               size_t n) {
    size_t at = (size_t)snprintf(buf, n, "%s%s|", warm ? "warm" : "hot", stage ? "+stage" : "");
    if (at >= n)
        return n - 1;
    return at + kvq__heads_layout(c, hs, buf + at, n - at);
}

/* The block bytes of page p (a copy of a cold page's record block, or the
 * arena block) plus its staging; *warm tells the layout. Caller frees. */
static kvq_status kvq__page_bytes(kvq_cache *c, kvq__layer *ly, size_t p, uint8_t **out, size_t *len,
                                  int *warm, int *stage) {
    kvq__page *pg = &ly->pages[p];
    *warm = pg->tier == KVQ__TIER_WARM || (pg->tier == KVQ__TIER_COLD && pg->cold_warm);
    size_t bb = *warm ? ly->wblock_bytes : ly->block_bytes;
    *stage = pg->stage != NULL;
    size_t sb = *stage ? ly->stage_bytes : 0;
    uint8_t *buf = (uint8_t *)kvq__alloc(&c->alloc, bb + sb);
    if (!buf)
        return KVQ_ERR_NOMEM;
    if (pg->tier == KVQ__TIER_COLD) {
        uint8_t *blk = NULL;
        kvq_status st = kvq__tier_peek(c, ly, p, &blk);
        if (st != KVQ_OK) {
            kvq__free(&c->alloc, buf);
            return st;
        }
        memcpy(buf, blk, bb);
        kvq__free(&c->alloc, blk);
    } else {
        memcpy(buf, pg->block, bb);
    }
    if (sb)
        memcpy(buf + bb, pg->stage, sb);
    *out = buf;
    *len = bb + sb;
    return KVQ_OK;
}

/* Page p of layer l as a record (positions >= prefix_end masked out), in a
 * buffer of pre + record + post bytes (the record at offset pre) from the
 * cache's allocator. */
static kvq_status kvq__page_record(kvq_cache *c, size_t l, size_t p, int32_t prefix_end,
                                   uint64_t prefix_hash, size_t pre, size_t post, uint8_t **out,
                                   size_t *out_len) {
    kvq__layer *ly = &c->layers[l];
    size_t P = c->P;
    uint8_t *blk = NULL;
    size_t blen = 0;
    int warm, stage;
    kvq_status st = kvq__page_bytes(c, ly, p, &blk, &blen, &warm, &stage);
    if (st != KVQ_OK)
        return st;
    int32_t pos[4096];
    uint8_t states[4096];
    kvq__record r;
    memset(&r, 0, sizeof r);
    r.pos_min = INT32_MAX, r.pos_max = INT32_MIN;
    for (size_t i = 0; i < P; i++) {
        int32_t q = ly->pos[p * P + i];
        int keep = q >= 0 && q < prefix_end;
        pos[i] = keep ? q : -1;
        states[i] = keep ? KVQ__STATE(ly->state[p * P + i]) : 0;
        if (keep) {
            r.n_tokens++;
            r.pos_min = q < r.pos_min ? q : r.pos_min;
            r.pos_max = q > r.pos_max ? q : r.pos_max;
        }
    }
    if (!r.n_tokens)
        r.pos_min = r.pos_max = -1;
    char layout[4096];
    r.cache_id = c->cache_id;
    r.layer = (uint32_t)l;
    r.page_tokens = (uint32_t)P;
    r.n_kv_heads = (uint32_t)c->H;
    r.head_dim = (uint32_t)c->d;
    r.prefix_hash = prefix_hash;
    r.layout = layout;
    r.layout_len = kvq__snap_layout(c, warm ? ly->wheads : ly->heads, warm, stage, layout, sizeof layout);
    r.positions = pos;
    r.states = states;
    r.block = blk;
    r.block_len = blen;
    size_t sz = kvq__record_size(&r), wr = 0;
    uint8_t *buf = sz && sz <= SIZE_MAX - pre - post ? (uint8_t *)kvq__alloc(&c->alloc, pre + sz + post)
                                                     : NULL;
    if (!buf)
        st = KVQ_ERR_NOMEM;
    else
        st = kvq__record_encode(&r, buf + pre, sz, &wr);
    kvq__free(&c->alloc, blk);
    if (st != KVQ_OK) {
        kvq__free(&c->alloc, buf);
        return st;
    }
    *out = buf;
    *out_len = pre + wr + post;
    return KVQ_OK;
}

kvq_status kvq_cache_save(kvq_cache *c, kvq_store *s, const char *name, int32_t prefix_end) {
    if (!c || !s || !name || !*name || strlen(name) > 200)
        return KVQ_ERR_INVALID_ARG;
    c->errbuf[0] = 0;
    /* manifest (docs/record-format.md): "KVQM" version T N save_id, the
     * name (N bytes), the configuration text (T bytes), per layer: appended
     * last_pos sink_until n_sinks_seen n_pages has_center [centre values]
     * then each saved page's index and the SHA-256 of its record; CRC32C at
     * the end. The save id, random for every save, is also each record's
     * prefix_hash: with the digests it ties the records to this manifest,
     * so records of two saves of one name (two writers, a save cut short)
     * never load as one snapshot. */
    uint64_t save_id = 0;
    if (kvq__os_random(&save_id, sizeof save_id) != KVQ_OK) {
        kvq__snap_err(c, "no random bytes from the OS for the snapshot's id");
        return KVQ_ERR_IO;
    }
    kvq__sbuf txt = {&c->alloc, NULL, 0, 0, 0};
    kvq_status st = kvq__config_text(c, &txt);
    if (st != KVQ_OK) {
        kvq__free(&c->alloc, txt.s);
        return st;
    }
    size_t nlen = strlen(name);
    size_t cap = KVQ__MANIFEST_HDR + nlen + txt.n + 4;
    for (size_t l = 0; l < c->L; l++)
        cap += KVQ__LAYER_HDR + c->H * c->d * 4 + c->layers[l].n_pages * KVQ__PAGE_ENTRY;
    uint8_t *m = (uint8_t *)kvq__alloc(&c->alloc, cap);
    if (!m) {
        kvq__free(&c->alloc, txt.s);
        return KVQ_ERR_NOMEM;
    }
    memcpy(m, "KVQM", 4);
    kvq__st32(m + 4, KVQ__MANIFEST_VERSION);
    kvq__st32(m + 8, (uint32_t)txt.n);
    kvq__st32(m + 12, (uint32_t)nlen);
    kvq__st64(m + 16, save_id);
    memcpy(m + KVQ__MANIFEST_HDR, name, nlen);
    memcpy(m + KVQ__MANIFEST_HDR + nlen, txt.s, txt.n);
    size_t at = KVQ__MANIFEST_HDR + nlen + txt.n;
    kvq__free(&c->alloc, txt.s);
    char key[300];
    /* an earlier snapshot of this name loses its manifest before any of its
     * page records is replaced: a save cut short leaves no snapshot, never
     * the old manifest over a mix of old and new pages */
    snprintf(key, sizeof key, "%s/manifest", name);
    st = kvq_store_del(s, key);
    if (st == KVQ_ERR_RANGE)
        st = KVQ_OK;
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        size_t hdr = at;
        at += KVQ__LAYER_HDR;
        if (ly->center) {
            for (size_t i = 0; i < c->H * c->d; i++)
                kvq__st32(m + at + 4 * i, kvq__f32_bits(ly->center[i]));
            at += c->H * c->d * 4;
        }
        uint32_t saved = 0;
        int32_t last = -1;
        uint64_t appended = 0;
        for (size_t p = 0; p < ly->n_pages && st == KVQ_OK; p++) {
            if (!kvq__page_live(&ly->pages[p]))
                continue;
            int any = 0;
            for (size_t i = 0; i < c->P; i++) {
                int32_t q = ly->pos[p * c->P + i];
                if (q >= 0 && q < prefix_end) {
                    any = 1;
                    last = q > last ? q : last;
                    appended++;
                }
            }
            if (!any)
                continue;
            snprintf(key, sizeof key, "%s/l%zu/p%zu", name, l, p);
            uint8_t *rec = NULL;
            size_t rlen = 0;
            st = kvq__page_record(c, l, p, prefix_end, save_id, 0, 0, &rec, &rlen);
            if (st == KVQ_OK) {
                st = kvq_store_put(s, key, rec, rlen);
                kvq__sha256(rec, rlen, m + at + 4);
            }
            kvq__free(&c->alloc, rec);
            kvq__st32(m + at, (uint32_t)p);
            at += KVQ__PAGE_ENTRY;
            saved++;
        }
        if (prefix_end == INT32_MAX) {
            last = ly->appended ? ly->last_pos : -1;
            appended = ly->appended;
        }
        kvq__st64(m + hdr, appended);
        kvq__st32(m + hdr + 8, (uint32_t)last);
        kvq__st32(m + hdr + 12, (uint32_t)ly->sink_until);
        kvq__st32(m + hdr + 16, (uint32_t)KVQ__MIN(ly->n_sinks_seen, appended));
        kvq__st32(m + hdr + 20, saved);
        kvq__st32(m + hdr + 24, ly->center ? 1u : 0u);
    }
    if (st == KVQ_OK) {
        kvq__st32(m + at, kvq__crc32c(0, m, at));
        at += 4;
        snprintf(key, sizeof key, "%s/manifest", name);
        st = kvq_store_put(s, key, m, at);
    }
    kvq__free(&c->alloc, m);
    return st;
}

/* What a restored page may hold. A snapshot's page: positions in
 * [0, last] (the layer's last position in the manifest), no position twice
 * in the layer (kvq__positions_unique, once the layer's pages are in), in
 * slot order on a channel-key page (filled in order, never reused); token
 * pages reuse the slots eviction frees, so their slot order is free. Prefix
 * page j: exactly positions jP..jP+P-1, every slot encoded (what
 * kvq__clean_page published). */
typedef struct {
    int prefix;
    size_t page;  /* prefix: j */
    int32_t last; /* snapshot */
} kvq__restore_rule;

/* Why the slots of record r cannot be page p of layer ly (NULL: they can).
 * States are taken raw: 0 free, 1 encoded, 2 pending; the cache's own
 * free-stack flag never comes from a record. A pending token needs its
 * staged K/V in the record (a hot page with staging), or the next append
 * would encode it from a staging block that does not exist. */
static const char *kvq__slots_why(const kvq_cache *c, const kvq__layer *ly, const kvq__record *r,
                                  int warm, int stage, const kvq__restore_rule *rule,
                                  size_t *n_pending) {
    size_t P = c->P, npend = 0;
    int32_t prev = -1;
    for (size_t i = 0; i < P; i++) {
        int32_t q = r->positions[i];
        uint8_t st = r->states[i];
        if (st > KVQ__PEND)
            return "a slot state other than free, encoded or pending";
        if (rule->prefix) {
            if ((int64_t)q != (int64_t)(rule->page * P + i) || st != KVQ__ENC)
                return "a prefix page whose slots are not its positions, encoded, in order";
            continue;
        }
        if (q < 0)
            continue;
        if (q > rule->last)
            return "a position past the layer's last position";
        if (ly->chan_mode && q <= prev)
            return "positions of a channel-key page out of slot order";
        prev = q;
        npend += st == KVQ__PEND;
    }
    if (warm && stage)
        return "a warm page with staged tokens";
    if (npend && (!stage || ly->stage_bytes == 0))
        return "pending tokens without their staged K/V";
    *n_pending = npend;
    return NULL;
}

/* Installs a decoded record as page p of layer l of an empty cache.
 * KVQ_ERR_MISMATCH when the record is of another layer, shape or layout;
 * KVQ_ERR_CORRUPT (why set) when its slots break rule. */
static kvq_status kvq__install_page(kvq_cache *c, size_t l, size_t p, const kvq__record *r,
                                    const kvq__restore_rule *rule, const char **why) {
    kvq__layer *ly = &c->layers[l];
    size_t P = c->P;
    char want[4096];
    *why = NULL;
    int warm = r->layout_len >= 4 && memcmp(r->layout, "warm", 4) == 0;
    int stage = memchr(r->layout, '+', r->layout_len) != NULL;
    size_t wl = kvq__snap_layout(c, warm ? ly->wheads : ly->heads, warm, stage, want, sizeof want);
    size_t bb = warm ? ly->wblock_bytes : ly->block_bytes, sb = stage ? ly->stage_bytes : 0;
    if (r->layer != l || r->page_tokens != P || r->n_kv_heads != c->H || r->head_dim != c->d ||
        r->layout_len != wl || memcmp(r->layout, want, wl) != 0 || r->block_len != bb + sb)
        return KVQ_ERR_MISMATCH;
    size_t pend = 0;
    if ((*why = kvq__slots_why(c, ly, r, warm, stage, rule, &pend)) != NULL)
        return KVQ_ERR_CORRUPT;
    /* staging holds pending tokens, and a channel page's unencoded keys:
     * with neither it holds nothing (and is not kept) */
    size_t keep_sb = pend || ly->chan_mode ? sb : 0;
    /* staged K/V were finite floats rounded to f16 (saturating): an Inf
     * or NaN in the staging bytes was not written by a cache, and the
     * encoders that settle it take finite input only */
    for (size_t i = 0; i < keep_sb / 2; i++)
        if ((kvq__ld16(r->block + bb + 2 * i) & 0x7c00u) == 0x7c00u) {
            *why = "a staged value that is not a finite number";
            return KVQ_ERR_CORRUPT;
        }
    kvq_status st = kvq__grow_pages(c, ly, p + 1);
    if (st != KVQ_OK)
        return st;
    kvq__page *pg = &ly->pages[p];
    if (kvq__page_live(pg)) {
        *why = "the same page twice";
        return KVQ_ERR_CORRUPT;
    }
    uint8_t *blk = (uint8_t *)kvq__lalloc_tier(c, ly, bb, warm);
    uint16_t *stg = keep_sb ? (uint16_t *)kvq__lalloc(c, ly, keep_sb, 0) : NULL;
    if (!blk || (keep_sb && !stg)) {
        kvq__lfree_tier(c, ly, blk, bb, warm);
        kvq__lfree(c, ly, stg, keep_sb, 0);
        return KVQ_ERR_NOMEM;
    }
    memcpy(blk, r->block, bb);
    if (keep_sb)
        memcpy(stg, r->block + bb, keep_sb);
    if (p >= ly->n_pages)
        ly->n_pages = p + 1;
    memset(pg, 0, sizeof *pg);
    pg->block = blk;
    pg->stage = stg;
    pg->tier = warm ? KVQ__TIER_WARM : KVQ__TIER_HOT;
    ly->tier_pages[pg->tier]++;
    ly->pages_alloc++;
    ly->codec_meta_bytes += kvq__block_codec_meta(c, ly);
    pg->min_pos = INT32_MAX;
    for (size_t i = 0; i < P; i++) {
        size_t s = p * P + i;
        ly->pos[s] = r->positions[i];
        ly->state[s] = r->positions[i] >= 0 ? r->states[i] : KVQ__FREE;
        if (ly->score)
            ly->score[s] = 1.0f;
        if (r->positions[i] < 0)
            continue;
        pg->n_valid++;
        pg->filled = (uint32_t)(i + 1);
        pg->n_pending += r->states[i] == KVQ__PEND;
        pg->min_pos = r->positions[i] < pg->min_pos ? r->positions[i] : pg->min_pos;
        ly->n_tokens++;
    }
    pg->encoded = stg == NULL; /* what still waits for encoding travels staged */
    return KVQ_OK;
}

static int kvq__cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Why the restored layer's slots cannot be a layer's (NULL: they can): a
 * position twice, or a pending token older than an encoded one (tokens are
 * encoded in arrival order, which is position order, so the pending ones
 * are always the newest). The free stack, which kvq__finish_restore fills
 * afterwards, holds the sorted copy of the positions: it has a place for
 * every slot, so the check allocates nothing. */
static const char *kvq__layer_slots_why(const kvq_cache *c, kvq__layer *ly) {
    uint32_t *v = ly->free_stack;
    size_t n = 0;
    int32_t max_enc = -1, min_pend = INT32_MAX;
    for (size_t s = 0; s < ly->n_pages * c->P; s++) {
        int32_t q = ly->pos[s];
        if (q < 0)
            continue;
        v[n++] = (uint32_t)q;
        if (KVQ__STATE(ly->state[s]) == KVQ__PEND)
            min_pend = q < min_pend ? q : min_pend;
        else
            max_enc = q > max_enc ? q : max_enc;
    }
    ly->n_free = 0;
    if (max_enc > min_pend)
        return "a pending token older than an encoded one";
    if (n < 2)
        return NULL;
    qsort(v, n, sizeof *v, kvq__cmp_u32);
    for (size_t i = 1; i < n; i++)
        if (v[i] == v[i - 1])
            return "a position twice";
    return NULL;
}

/* After pages are installed: free slots, the pending ring and the open
 * page. The ring comes first (the one allocation): on failure nothing else
 * changed, and the restore fails (a pending token in no ring would never
 * be encoded). */
static kvq_status kvq__finish_restore(kvq_cache *c, kvq__layer *ly) {
    size_t P = c->P;
    size_t npend = 0;
    for (size_t p = 0; p < ly->n_pages; p++)
        npend += ly->pages[p].block ? ly->pages[p].n_pending : 0;
    if (npend && npend > ly->pend_cap &&
        kvq__ring_resize(c, ly, 2 * npend + c->cfg.recent_window + 2) != KVQ_OK)
        return KVQ_ERR_NOMEM;
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        if (!pg->block)
            continue;
        if (ly->chan_mode) {
            if (!pg->encoded && pg->filled < P)
                ly->open_page = p;
            continue;
        }
        kvq__push_page_free(c, ly, p);
    }
    /* pending tokens, in position order */
    if (ly->pend_slot && ly->pend_pos && ly->pend_cap) {
        ly->pend_head = ly->pend_count = 0;
        for (int32_t last = -1;;) {
            size_t best = SIZE_MAX;
            for (size_t s = 0; s < ly->n_pages * P; s++)
                if (ly->pos[s] > last && KVQ__STATE(ly->state[s]) == KVQ__PEND &&
                    (best == SIZE_MAX || ly->pos[s] < ly->pos[best]))
                    best = s;
            if (best == SIZE_MAX || ly->pend_count >= ly->pend_cap)
                break;
            ly->pend_slot[ly->pend_count] = (uint32_t)best;
            ly->pend_pos[ly->pend_count] = ly->pos[best];
            ly->pend_count++;
            last = ly->pos[best];
        }
    }
    return KVQ_OK;
}

static void kvq__reset_layer(kvq_cache *c, kvq__layer *ly) {
    for (size_t p = 0; p < ly->n_pages; p++) {
        kvq__page *pg = &ly->pages[p];
        if (!pg->block)
            continue;
        int warm = pg->tier == KVQ__TIER_WARM;
        kvq__lfree_tier(c, ly, pg->block, warm ? ly->wblock_bytes : ly->block_bytes, warm);
        kvq__lfree(c, ly, pg->stage, ly->stage_bytes, 0);
        ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
        ly->tier_pages[pg->tier]--;
        memset(pg, 0, sizeof *pg);
    }
    for (size_t s = 0; s < ly->n_pages * c->P; s++) {
        ly->pos[s] = -1;
        ly->state[s] = KVQ__FREE;
    }
    ly->n_pages = 0;
    ly->n_free = 0;
    ly->n_tokens = 0;
    ly->pages_alloc = 0;
    ly->appended = 0;
    ly->open_page = SIZE_MAX;
    ly->pend_count = ly->pend_head = 0;
}

/* What an empty layer was before a restore, to undo a failed one. */
typedef struct {
    size_t pages_cap, pend_cap, n_sinks_seen;
    int32_t last_pos, sink_until;
    int center_ready;
} kvq__layer_mark;

static kvq__layer_mark *kvq__mark_layers(kvq_cache *c) {
    kvq__layer_mark *m = (kvq__layer_mark *)kvq__alloc(&c->alloc, c->L * sizeof *m);
    for (size_t l = 0; m && l < c->L; l++) {
        const kvq__layer *ly = &c->layers[l];
        m[l] = (kvq__layer_mark){ly->pages_cap, ly->pend_cap, ly->n_sinks_seen,
                                 ly->last_pos,  ly->sink_until, ly->center_ready};
    }
    return m;
}

/* Undoes a failed restore: frees what was installed, and the page table
 * and pending ring when the layer had none before, so the cache is as it
 * was but for peak_stored_bytes. */
static void kvq__undo_layers(kvq_cache *c, const kvq__layer_mark *m) {
    for (size_t l = 0; l < c->L; l++) {
        kvq__layer *ly = &c->layers[l];
        kvq__reset_layer(c, ly);
        if (m[l].pages_cap == 0 && ly->pages_cap)
            kvq__free_tables(c, ly);
        if (m[l].pend_cap == 0 && ly->pend_cap) {
            kvq__lfree(c, ly, ly->pend_slot, ly->pend_cap * sizeof(uint32_t), 1);
            kvq__lfree(c, ly, ly->pend_pos, ly->pend_cap * sizeof(int32_t), 1);
            ly->pend_slot = NULL;
            ly->pend_pos = NULL;
            ly->pend_cap = 0;
        }
        ly->n_sinks_seen = m[l].n_sinks_seen;
        ly->last_pos = m[l].last_pos;
        ly->sink_until = m[l].sink_until;
        ly->center_ready = m[l].center_ready;
    }
}

static int kvq__cache_empty(const kvq_cache *c) {
    for (size_t l = 0; l < c->L; l++)
        if (c->layers[l].n_tokens || c->layers[l].appended)
            return 0;
    return 1;
}

kvq_status kvq_cache_load(kvq_cache *c, kvq_store *s, const char *name) {
    if (!c || !s || !name || !*name || strlen(name) > 200)
        return KVQ_ERR_INVALID_ARG;
    c->errbuf[0] = 0;
    if (!kvq__cache_empty(c)) {
        kvq__snap_err(c, "kvq_cache_load needs an empty cache");
        return KVQ_ERR_MISMATCH;
    }
    kvq__layer_mark *mark = kvq__mark_layers(c);
    if (!mark)
        return KVQ_ERR_NOMEM;
    char key[300];
    snprintf(key, sizeof key, "%s/manifest", name);
    void *md = NULL;
    size_t ms = 0;
    kvq_status st = kvq_store_get(s, key, &md, &ms);
    if (st != KVQ_OK) {
        if (st == KVQ_ERR_RANGE)
            kvq__snap_err(c, "no snapshot '%.60s' in the store (no key %.60s/manifest)", name, name);
        else
            kvq__snap_err(c, "snapshot '%.60s': reading the manifest: %s", name, kvq_strerror(st));
        kvq__free(&c->alloc, mark);
        return st;
    }
    const uint8_t *m = (const uint8_t *)md;
    size_t T = 0, N = 0, nlen = strlen(name);
    uint64_t save_id = 0;
    if (ms < 16 || memcmp(m, "KVQM", 4) != 0 || kvq__ld32(m + ms - 4) != kvq__crc32c(0, m, ms - 4)) {
        st = KVQ_ERR_CORRUPT;
        kvq__snap_err(c, "snapshot '%.60s': the manifest is not a valid manifest", name);
    } else if (kvq__ld32(m + 4) != KVQ__MANIFEST_VERSION) {
        st = KVQ_ERR_VERSION;
        kvq__snap_err(c, "snapshot '%.60s': manifest version %u (this library reads %u)", name,
                      kvq__ld32(m + 4), KVQ__MANIFEST_VERSION);
    } else if (ms < KVQ__MANIFEST_HDR + 4 || (T = kvq__ld32(m + 8)) > ms - KVQ__MANIFEST_HDR - 4 ||
               (N = kvq__ld32(m + 12)) > ms - KVQ__MANIFEST_HDR - 4 - T) {
        st = KVQ_ERR_CORRUPT;
        kvq__snap_err(c, "snapshot '%.60s': the manifest is shorter than its header says", name);
    } else if (N != nlen || memcmp(m + KVQ__MANIFEST_HDR, name, nlen) != 0) {
        st = KVQ_ERR_CORRUPT;
        char other[72];
        kvq__printable(other, sizeof other, (const char *)m + KVQ__MANIFEST_HDR, N);
        kvq__snap_err(c, "snapshot '%.60s': the manifest was written for snapshot '%s'", name, other);
    }
    if (st == KVQ_OK) {
        save_id = kvq__ld64(m + 16);
        kvq__sbuf txt = {&c->alloc, NULL, 0, 0, 0};
        st = kvq__config_text(c, &txt);
        if (st == KVQ_OK &&
            kvq__config_differs(c, name, (const char *)m + KVQ__MANIFEST_HDR + N, T, txt.s, txt.n))
            st = KVQ_ERR_MISMATCH;
        kvq__free(&c->alloc, txt.s);
    }
    /* pass 1: the layer sections fit exactly, the centres are ours, each
     * layer's pages come in ascending order (none twice) */
    size_t first = KVQ__MANIFEST_HDR + N + T, end = ms - 4, at = first, cb = c->H * c->d * 4;
    size_t max_page = c->cfg.max_tokens; /* every live page holds a token */
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        const float *ctr = c->layers[l].center;
        uint32_t saved, has_center;
        if (end - at < KVQ__LAYER_HDR || ((has_center = kvq__ld32(m + at + 24)) != 0) != (ctr != NULL) ||
            has_center > 1 || (size_t)(end - at - KVQ__LAYER_HDR) < (has_center ? cb : 0)) {
            st = KVQ_ERR_CORRUPT;
            break;
        }
        saved = kvq__ld32(m + at + 20);
        at += KVQ__LAYER_HDR;
        for (size_t i = 0; has_center && i < c->H * c->d; i++) {
            uint32_t want = kvq__f32_bits(ctr[i]), got = kvq__ld32(m + at + 4 * i);
            if (got != want) {
                kvq__snap_err(c, "snapshot '%.60s' does not match this cache: k_center_values "
                                 "differ (layer %zu, kv head %zu, channel %zu: %.9g in the "
                                 "snapshot, %.9g here)", name, l, i / c->d, i % c->d,
                              (double)kvq__bits_f32(got), (double)ctr[i]);
                st = KVQ_ERR_MISMATCH;
                break;
            }
        }
        at += has_center ? cb : 0;
        if (st == KVQ_OK && (end - at) / KVQ__PAGE_ENTRY < saved)
            st = KVQ_ERR_CORRUPT;
        for (uint32_t k = 0; k < saved && st == KVQ_OK; k++) {
            uint32_t pk = kvq__ld32(m + at + KVQ__PAGE_ENTRY * (size_t)k);
            if (pk > max_page || (k && pk <= kvq__ld32(m + at + KVQ__PAGE_ENTRY * (size_t)(k - 1))))
                st = KVQ_ERR_CORRUPT;
        }
        at += st == KVQ_OK ? (size_t)saved * KVQ__PAGE_ENTRY : 0;
    }
    if (st == KVQ_OK && at != end)
        st = KVQ_ERR_CORRUPT;
    if (st == KVQ_ERR_CORRUPT && !c->errbuf[0])
        kvq__snap_err(c, "snapshot '%.60s': the manifest's layer sections are malformed", name);
    /* pass 2: the pages */
    at = first;
    for (size_t l = 0; l < c->L && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        uint64_t appended = kvq__ld64(m + at);
        int32_t last = (int32_t)kvq__ld32(m + at + 8);
        int32_t sink_until = (int32_t)kvq__ld32(m + at + 12);
        uint32_t sinks_seen = kvq__ld32(m + at + 16), saved = kvq__ld32(m + at + 20);
        at += KVQ__LAYER_HDR + (kvq__ld32(m + at + 24) ? cb : 0);
        kvq__restore_rule rule = {0, 0, last};
        for (uint32_t k = 0; k < saved && st == KVQ_OK; k++) {
            const uint8_t *ent = m + at + KVQ__PAGE_ENTRY * (size_t)k;
            size_t p = kvq__ld32(ent);
            snprintf(key, sizeof key, "%s/l%zu/p%zu", name, l, p);
            void *rd = NULL;
            size_t rs = 0;
            const char *why = NULL;
            st = kvq_store_get(s, key, &rd, &rs);
            if (st == KVQ_OK) {
                kvq__record r;
                uint8_t dg[KVQ__SHA256_BYTES];
                kvq__sha256(rd, rs, dg);
                /* store buffers are 64-byte aligned, as decode needs */
                if (memcmp(dg, ent + 4, sizeof dg) != 0) {
                    st = KVQ_ERR_CORRUPT;
                    why = "its SHA-256 differs from the manifest's (altered, or written by another "
                          "save of this name)";
                } else if ((st = kvq__record_decode(rd, rs, &r)) != KVQ_OK) {
                    why = "not a valid page record";
                } else if (r.prefix_hash != save_id) {
                    st = KVQ_ERR_CORRUPT;
                    why = "written by another save of this name";
                } else {
                    st = kvq__install_page(c, l, p, &r, &rule, &why);
                    if (st == KVQ_ERR_MISMATCH) { /* the manifest's configuration matched */
                        st = KVQ_ERR_CORRUPT;
                        why = "of another layer, shape or layout than the manifest's";
                    }
                }
                kvq_store_free_buf(s, rd);
            }
            if (st != KVQ_OK) {
                if (st == KVQ_ERR_RANGE) /* the manifest names it: the snapshot is not whole */
                    st = KVQ_ERR_CORRUPT, why = "missing from the store";
                kvq__snap_err(c, "snapshot '%.60s': page record %s: %s", name, key,
                              why ? why : kvq_strerror(st));
            }
        }
        at += (size_t)saved * KVQ__PAGE_ENTRY;
        const char *lwhy = st == KVQ_OK ? kvq__layer_slots_why(c, ly) : NULL;
        if (lwhy) {
            kvq__snap_err(c, "snapshot '%.60s': layer %zu holds %s", name, l, lwhy);
            st = KVQ_ERR_CORRUPT;
        }
        if (st == KVQ_OK && ly->n_tokens > c->cfg.max_tokens) {
            kvq__snap_err(c, "snapshot '%.60s': layer %zu holds %zu tokens, more than max_tokens",
                          name, l, ly->n_tokens);
            st = KVQ_ERR_FULL;
        }
        if (st == KVQ_OK) {
            /* the counters must agree with the pages: positions continue
             * after last_pos (a smaller one would repeat a position; INT32_MAX
             * leaves none), every stored token was appended */
            int32_t maxpos = -1;
            for (size_t sl = 0; sl < ly->n_pages * c->P; sl++)
                maxpos = ly->pos[sl] > maxpos ? ly->pos[sl] : maxpos;
            if (last < maxpos || last == INT32_MAX || last < -1 || appended < ly->n_tokens ||
                (appended == 0) != (last < 0) || appended > (uint64_t)last + 1 ||
                sinks_seen > appended || sinks_seen > c->cfg.sinks ||
                (sinks_seen ? sink_until < 0 || sink_until > last : sink_until < -1 || sink_until > 0)) {
                kvq__snap_err(c, "snapshot '%.60s': layer %zu's counters (appended %llu, last "
                                 "position %d) contradict its pages (%zu tokens up to position %d)",
                              name, l, (unsigned long long)appended, (int)last, ly->n_tokens,
                              (int)maxpos);
                st = KVQ_ERR_CORRUPT;
            }
        }
        if (st == KVQ_OK) {
            ly->appended = appended;
            ly->last_pos = last;
            ly->sink_until = sink_until;
            ly->n_sinks_seen = sinks_seen;
            st = kvq__finish_restore(c, ly);
        }
    }
    kvq_store_free_buf(s, md);
    if (st != KVQ_OK)
        kvq__undo_layers(c, mark);
    kvq__free(&c->alloc, mark);
    return st;
}

/* ---- prefix caching ---- */
static int kvq__prefix_ok(const kvq_cache *c) {
    if (c->cfg.k_center && !c->cfg.k_center_values)
        return 0;
    for (size_t l = 0; l < c->L; l++)
        if (c->layers[l].chan_mode)
            return 0;
    return 1;
}

/* Is page j of layer l exactly positions jP..jP+P-1, encoded, in memory? */
static int kvq__clean_page(const kvq_cache *c, const kvq__layer *ly, size_t j) {
    if (j >= ly->n_pages || !kvq__page_live(&ly->pages[j]) || ly->pages[j].n_pending)
        return 0;
    for (size_t i = 0; i < c->P; i++)
        if (ly->pos[j * c->P + i] != (int32_t)(j * c->P + i) ||
            KVQ__STATE(ly->state[j * c->P + i]) != KVQ__ENC)
            return 0;
    return 1;
}

/* "kvqp/<SHA-256 of the configuration and the ids up to the end of the
 * page, hex>/l<layer>" */
static void kvq__prefix_key(const uint8_t d[KVQ__SHA256_BYTES], size_t l, char *key, size_t n) {
    char hex[2 * KVQ__SHA256_BYTES + 1];
    for (int i = 0; i < KVQ__SHA256_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    snprintf(key, n, "kvqp/%s/l%zu", hex, l);
}

/* The page's ids as little-endian bytes (what is hashed and stored). */
static void kvq__ids_le(const int32_t *ids, size_t P, uint8_t *out) {
    for (size_t i = 0; i < P; i++)
        kvq__st32(out + 4 * i, (uint32_t)ids[i]);
}

/* The running digest: it has hashed the configuration digest and the ids of
 * every page before the current one; out gets the digest of that prefix. */
static void kvq__digest_now(const kvq__sha256_ctx *run, uint8_t out[KVQ__SHA256_BYTES]) {
    kvq__sha256_ctx t = *run;
    kvq__sha256_final(&t, out);
}

kvq_status kvq_cache_prefix_put(kvq_cache *c, kvq_store *s, const int32_t *ids, size_t n) {
    if (!c || !s || (!ids && n))
        return KVQ_ERR_INVALID_ARG;
    c->errbuf[0] = 0;
    if (!kvq__prefix_ok(c))
        return KVQ_ERR_UNSUPPORTED;
    for (size_t l = 0; l < c->L; l++) /* what the next call would encode is owed now */
        kvq__settle(c, &c->layers[l], 0);
    uint8_t cfgd[KVQ__SHA256_BYTES], prev[KVQ__SHA256_BYTES], cur[KVQ__SHA256_BYTES];
    kvq_status st = kvq__config_digest(c, cfgd);
    if (st != KVQ_OK)
        return st;
    kvq__sha256_ctx run;
    kvq__sha256_init(&run);
    kvq__sha256_update(&run, cfgd, sizeof cfgd);
    kvq__digest_now(&run, prev);
    size_t P = c->P, pre = KVQ__PFX_HDR + 4 * P;
    uint8_t le[4 * 4096];
    char key[128];
    for (size_t j = 0; (j + 1) * P <= n; j++) {
        kvq__ids_le(ids + j * P, P, le);
        kvq__sha256_update(&run, le, 4 * P);
        kvq__digest_now(&run, cur);
        for (size_t l = 0; l < c->L; l++) {
            if (!kvq__clean_page(c, &c->layers[l], j))
                return KVQ_OK; /* the run of clean pages ends here */
        }
        for (size_t l = 0; l < c->L; l++) {
            uint8_t *e = NULL;
            size_t len = 0;
            st = kvq__page_record(c, l, j, INT32_MAX, kvq__ld64(cur), pre, 4, &e, &len);
            if (st != KVQ_OK)
                return st;
            memcpy(e, KVQ__PFX_MAGIC, 4);
            kvq__st16(e + 4, KVQ__PFX_VERSION);
            kvq__st16(e + 6, 0);
            kvq__st32(e + 8, (uint32_t)j);
            kvq__st32(e + 12, (uint32_t)P);
            memcpy(e + 16, prev, KVQ__SHA256_BYTES);
            memcpy(e + KVQ__PFX_HDR, le, 4 * P);
            kvq__st32(e + len - 4, kvq__crc32c(0, e, len - 4));
            kvq__prefix_key(cur, l, key, sizeof key);
            st = kvq_store_put(s, key, e, len);
            kvq__free(&c->alloc, e);
            if (st != KVQ_OK)
                return st;
        }
        memcpy(prev, cur, sizeof cur);
    }
    return KVQ_OK;
}

/* Checks a prefix entry found under the key of page j: KVQ_ERR_CORRUPT for
 * bytes that are not an entry, KVQ_ERR_MISMATCH for an entry of another
 * page, page size or prompt (other ids on the page, or another prefix
 * before it), else KVQ_OK with the record's span. */
static kvq_status kvq__prefix_check(const kvq_cache *c, const uint8_t *e, size_t len, size_t j,
                                    const uint8_t prev[KVQ__SHA256_BYTES], const uint8_t *le,
                                    size_t *rec_off) {
    size_t P = c->P, pre = KVQ__PFX_HDR + 4 * P;
    if (len < 8 || memcmp(e, KVQ__PFX_MAGIC, 4) != 0 || kvq__ld16(e + 6) != 0)
        return KVQ_ERR_CORRUPT;
    if (kvq__ld16(e + 4) != KVQ__PFX_VERSION)
        return KVQ_ERR_VERSION;
    if (len < KVQ__PFX_HDR)
        return KVQ_ERR_CORRUPT;
    if (kvq__ld32(e + 12) != P)
        return KVQ_ERR_MISMATCH;
    if (len < pre + KVQ__RECORD_HEADER + 4 + 4 || kvq__ld32(e + len - 4) != kvq__crc32c(0, e, len - 4))
        return KVQ_ERR_CORRUPT;
    if (kvq__ld32(e + 8) != j || memcmp(e + 16, prev, KVQ__SHA256_BYTES) != 0 ||
        memcmp(e + KVQ__PFX_HDR, le, 4 * P) != 0)
        return KVQ_ERR_MISMATCH;
    *rec_off = pre;
    return KVQ_OK;
}

/* Drops page j from layers 0..nl-1 (a prefix page that not every layer had). */
static void kvq__prefix_drop_page(kvq_cache *c, size_t nl, size_t j) {
    for (size_t k = 0; k < nl; k++) {
        kvq__layer *ly = &c->layers[k];
        kvq__page *pg = &ly->pages[j];
        if (!pg->block)
            continue;
        int warm = pg->tier == KVQ__TIER_WARM;
        kvq__lfree_tier(c, ly, pg->block, warm ? ly->wblock_bytes : ly->block_bytes, warm);
        ly->codec_meta_bytes -= kvq__block_codec_meta(c, ly);
        ly->tier_pages[pg->tier]--;
        ly->pages_alloc--;
        ly->n_tokens -= pg->n_valid;
        for (size_t i = 0; i < c->P; i++) {
            ly->pos[j * c->P + i] = -1;
            ly->state[j * c->P + i] = KVQ__FREE;
        }
        memset(pg, 0, sizeof *pg);
        ly->n_pages = j;
    }
}

kvq_status kvq_cache_prefix_get(kvq_cache *c, kvq_store *s, const int32_t *ids, size_t n,
                                size_t *n_loaded) {
    if (!c || !s || !n_loaded || (!ids && n))
        return KVQ_ERR_INVALID_ARG;
    *n_loaded = 0;
    c->errbuf[0] = 0;
    if (!kvq__prefix_ok(c))
        return KVQ_ERR_UNSUPPORTED;
    if (!kvq__cache_empty(c))
        return KVQ_ERR_MISMATCH;
    uint8_t cfgd[KVQ__SHA256_BYTES], prev[KVQ__SHA256_BYTES], cur[KVQ__SHA256_BYTES];
    kvq_status st = kvq__config_digest(c, cfgd);
    if (st != KVQ_OK)
        return st;
    kvq__layer_mark *mark = kvq__mark_layers(c);
    if (!mark)
        return KVQ_ERR_NOMEM;
    kvq__sha256_ctx run;
    kvq__sha256_init(&run);
    kvq__sha256_update(&run, cfgd, sizeof cfgd);
    kvq__digest_now(&run, prev);
    size_t P = c->P;
    uint8_t le[4 * 4096];
    char key[128];
    size_t j = 0;
    for (; (j + 1) * P < n && st == KVQ_OK; j++) { /* leave at least one token to run */
        kvq__ids_le(ids + j * P, P, le);
        kvq__sha256_update(&run, le, 4 * P);
        kvq__digest_now(&run, cur);
        size_t l = 0;
        for (; l < c->L; l++) {
            kvq__prefix_key(cur, l, key, sizeof key);
            void *rd = NULL;
            size_t rs = 0, off = 0;
            kvq_status gs = kvq_store_get(s, key, &rd, &rs);
            if (gs == KVQ_ERR_RANGE)
                break;
            if (gs != KVQ_OK) {
                st = gs;
                break;
            }
            kvq__record r;
            const char *why = NULL;
            kvq__restore_rule rule = {1, j, 0};
            gs = kvq__prefix_check(c, (const uint8_t *)rd, rs, j, prev, le, &off);
            if (gs == KVQ_OK) {
                gs = kvq__record_decode((const uint8_t *)rd + off, rs - off - 4, &r);
                if (gs == KVQ_OK && r.prefix_hash != kvq__ld64(cur))
                    gs = KVQ_ERR_MISMATCH;
            }
            if (gs == KVQ_OK)
                gs = kvq__install_page(c, l, j, &r, &rule, &why);
            kvq_store_free_buf(s, rd);
            if (gs == KVQ_ERR_MISMATCH) {
                /* another prompt's page under this key: a miss */
                kvq__snap_err(c, "prefix entry %.100s holds another prompt's page: not loaded", key);
                break;
            }
            if (gs != KVQ_OK) {
                kvq__snap_err(c, "prefix entry %.100s: %s", key, why ? why : kvq_strerror(gs));
                st = gs;
                break;
            }
        }
        if (st == KVQ_OK && l < c->L) {
            kvq__prefix_drop_page(c, l, j); /* a layer misses this page */
            break;
        }
        memcpy(prev, cur, sizeof cur);
    }
    size_t loaded = j * P;
    for (size_t l = 0; l < c->L && loaded && st == KVQ_OK; l++) {
        kvq__layer *ly = &c->layers[l];
        ly->appended = loaded;
        ly->last_pos = (int32_t)loaded - 1;
        ly->n_sinks_seen = KVQ__MIN(c->cfg.sinks, loaded);
        ly->sink_until = (int32_t)ly->n_sinks_seen - 1;
        if (c->cfg.k_center && !ly->center_ready)
            ly->center_ready = 1; /* centre values were given at create */
        st = kvq__finish_restore(c, ly);
    }
    if (st != KVQ_OK || loaded == 0)
        kvq__undo_layers(c, mark); /* a failure, or nothing loaded: as it was */
    kvq__free(&c->alloc, mark);
    if (st != KVQ_OK)
        return st;
    *n_loaded = loaded;
    return KVQ_OK;
}
