/*
 * tokenizer.c - the llama2.c tokenizer.bin format and its BPE: a vocabulary
 * of scored pieces, encoded by UTF-8 code point lookup with byte fallback
 * (<0xXX> pieces are ids 3..258), then merging, again and again, the adjacent
 * pair whose concatenation is the vocabulary piece of highest score (the
 * leftmost on ties). Pieces are looked up through a sorted index.
 */
#include "model_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* ids 0..2 (<unk> <s> </s>) and the 256 byte pieces 3..258 */
#define KVQ__TOK_MIN_VOCAB 259

typedef struct {
    const char *s;
    uint32_t id;
} kvq__tokref;

struct kvq_tokenizer {
    kvq_allocator alloc;
    size_t n;
    char **piece;
    float *score;
    kvq__tokref *sorted; /* pieces in strcmp order, with their ids */
    size_t max_len;
    char *strings;
};

static int kvq__piece_cmp(const void *a, const void *b) {
    const kvq__tokref *x = (const kvq__tokref *)a, *y = (const kvq__tokref *)b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

void kvq_tokenizer_free(kvq_tokenizer *t) {
    if (!t)
        return;
    kvq_allocator a = t->alloc;
    kvq__free(&a, t->piece);
    kvq__free(&a, t->score);
    kvq__free(&a, t->sorted);
    kvq__free(&a, t->strings);
    kvq__free(&a, t);
}

/* Format: u32 max_token_length, then per id: f32 score, u32 length, the
 * piece's bytes. Every length is held against what is left of the file
 * before it is used; the header's max_token_length only has to fit in the
 * file (the encoder sizes its buffer from the longest piece actually read). */
kvq_status kvq__tokenizer_load_mem(kvq_tokenizer **out, const uint8_t *buf, size_t len,
                                   size_t vocab, const kvq_allocator *alloc, char *why,
                                   size_t why_size) {
    if (why && why_size)
        why[0] = 0;
    /* ids 0..2 are <unk> <s> </s> and 3..258 the byte pieces the encoder falls back to */
    if (!out || (!buf && len) || vocab < KVQ__TOK_MIN_VOCAB || vocab > (1u << 24))
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    if (len < 4)
        return kvq__why_corrupt(why, why_size, "truncated: the header is 4 bytes, the file has %zu",
                                len);
    uint32_t hdr_max = kvq__ld32(buf);
    if (hdr_max > len - 4)
        return kvq__why_corrupt(why, why_size, "max_token_length %u exceeds the file (%zu bytes)",
                            hdr_max, len);
    kvq_allocator al;
    kvq__allocator_init(&al, alloc);
    kvq_tokenizer *t = (kvq_tokenizer *)kvq__calloc(&al, sizeof *t);
    if (!t)
        return KVQ_ERR_NOMEM;
    t->alloc = al;
    t->n = vocab;
    t->max_len = 0;
    /* vocab <= 2^24 and len is the size of a buffer in memory: no overflow */
    t->piece = (char **)kvq__calloc(&al, vocab * sizeof(char *));
    t->score = (float *)kvq__calloc(&al, vocab * sizeof(float));
    t->sorted = (kvq__tokref *)kvq__calloc(&al, vocab * sizeof(kvq__tokref));
    t->strings = (char *)kvq__calloc(&al, len + vocab + 1);
    kvq_status st = KVQ_OK;
    if (!t->piece || !t->score || !t->sorted || !t->strings)
        st = KVQ_ERR_NOMEM;
    size_t off = 4, soff = 0;
    for (size_t i = 0; i < vocab && st == KVQ_OK; i++) {
        if (len - off < 8) {
            st = kvq__why_corrupt(why, why_size,
                                  "truncated: the file ends at byte %zu, in token %zu of the %zu "
                                  "the model needs", off, i, vocab);
            break;
        }
        memcpy(&t->score[i], buf + off, 4);
        uint32_t n = kvq__ld32(buf + off + 4);
        off += 8;
        if (n > len - off) {
            st = kvq__why_corrupt(why, why_size, "piece %zu: length %u exceeds the %zu bytes left", i,
                              n, len - off);
            break;
        }
        if (!isfinite(t->score[i])) {
            st = kvq__why_corrupt(why, why_size, "piece %zu: score is not finite", i);
            break;
        }
        t->piece[i] = t->strings + soff;
        memcpy(t->piece[i], buf + off, n);
        t->piece[i][n] = 0;
        soff += n + 1;
        off += n;
        t->sorted[i].s = t->piece[i];
        t->sorted[i].id = (uint32_t)i;
        if (n > t->max_len)
            t->max_len = n;
    }
    /* bytes past the model's last token: a tokenizer of a larger vocabulary
     * (another model's), whose ids would not be this model's */
    if (st == KVQ_OK && off != len)
        st = kvq__why_corrupt(why, why_size,
                              "%zu bytes after the model's %zu tokens: the tokenizer of a "
                              "larger vocabulary, or bytes that are not a whole token",
                              len - off, vocab);
    if (st != KVQ_OK) {
        kvq_tokenizer_free(t);
        return st;
    }
    qsort(t->sorted, vocab, sizeof(kvq__tokref), kvq__piece_cmp);
    *out = t;
    return KVQ_OK;
}

kvq_status kvq_tokenizer_load_msg(kvq_tokenizer **out, const char *path, size_t vocab,
                                  const kvq_allocator *alloc, char *why, size_t why_size) {
    if (why && why_size)
        why[0] = 0;
    if (!out || !path || vocab < KVQ__TOK_MIN_VOCAB || vocab > (1u << 24))
        return KVQ_ERR_INVALID_ARG;
    *out = NULL;
    kvq_allocator al;
    kvq__allocator_init(&al, alloc);
    uint8_t *buf;
    size_t len;
    errno = 0;
    kvq_status st = kvq__read_file(&al, path, 4, SIZE_MAX, &buf, &len);
    if (st != KVQ_OK) {
        if (why && why_size) {
            if (st == KVQ_ERR_CORRUPT)
                snprintf(why, why_size, "truncated: a tokenizer needs at least 4 bytes");
            else
                snprintf(why, why_size, "%s", errno ? strerror(errno) : kvq_strerror(st));
        }
        return st;
    }
    st = kvq__tokenizer_load_mem(out, buf, len, vocab, &al, why, why_size);
    kvq__free(&al, buf);
    return st;
}

kvq_status kvq_tokenizer_load(kvq_tokenizer **out, const char *path, size_t vocab,
                              const kvq_allocator *alloc) {
    return kvq_tokenizer_load_msg(out, path, vocab, alloc, NULL, 0);
}

static int32_t kvq__lookup(const kvq_tokenizer *t, const char *s) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(t->sorted[mid].s, s);
        if (c == 0)
            return (int32_t)t->sorted[mid].id;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* The id of the piece a+b, or -1. sb holds 2 * max_len + 8 bytes; max_len
 * is the longest piece, so a longer concatenation is no piece. */
static int32_t kvq__pair(const kvq_tokenizer *t, int32_t a, int32_t b, char *sb) {
    size_t la = strlen(t->piece[a]), lb = strlen(t->piece[b]);
    if (la + lb > t->max_len)
        return -1;
    memcpy(sb, t->piece[a], la);
    memcpy(sb + la, t->piece[b], lb + 1);
    return kvq__lookup(t, sb);
}

kvq_status kvq_tokenizer_encode(const kvq_tokenizer *t, const char *text, int bos, int eos,
                                int32_t *tok, size_t cap, size_t *n_out) {
    if (!t || !text || !tok || !n_out)
        return KVQ_ERR_INVALID_ARG;
    size_t tl = strlen(text);
    if (cap < tl + 3)
        return KVQ_ERR_DST_TOO_SMALL;
    char *sb = (char *)kvq__alloc(&t->alloc, 2 * t->max_len + 8);
    if (!sb)
        return KVQ_ERR_NOMEM;
    size_t n = 0;
    if (bos)
        tok[n++] = 1;
    if (text[0]) {
        int32_t sp = kvq__lookup(t, " ");
        if (sp >= 0)
            tok[n++] = sp;
    }
    /* one token per UTF-8 code point (up to 4 bytes), else its bytes */
    size_t i = 0;
    while (i < tl) {
        size_t cl = 1;
        while (i + cl < tl && cl < 4 && ((unsigned char)text[i + cl] & 0xC0) == 0x80)
            cl++;
        char cp[8];
        memcpy(cp, text + i, cl);
        cp[cl] = 0;
        int32_t id = kvq__lookup(t, cp);
        if (id >= 0) {
            tok[n++] = id;
        } else {
            for (size_t b = 0; b < cl; b++)
                tok[n++] = (int32_t)(unsigned char)cp[b] + 3;
        }
        i += cl;
    }
    /* merge the best-scoring adjacent pair (leftmost on ties) until no pair
     * is in the vocabulary; each pair's merge is looked up once and only the
     * two pairs next to a merge are looked up again */
    int32_t *pid = n > 1 ? (int32_t *)kvq__alloc(&t->alloc, n * sizeof(int32_t)) : NULL;
    if (n > 1 && !pid) {
        kvq__free(&t->alloc, sb);
        return KVQ_ERR_NOMEM;
    }
    for (size_t j = 0; j + 1 < n; j++)
        pid[j] = kvq__pair(t, tok[j], tok[j + 1], sb);
    while (n > 1) {
        float best = -1e10f;
        size_t best_at = SIZE_MAX;
        for (size_t j = 0; j + 1 < n; j++)
            if (pid[j] >= 0 && t->score[pid[j]] > best) {
                best = t->score[pid[j]];
                best_at = j;
            }
        if (best_at == SIZE_MAX)
            break;
        tok[best_at] = pid[best_at];
        memmove(tok + best_at + 1, tok + best_at + 2, (n - best_at - 2) * sizeof(int32_t));
        memmove(pid + best_at, pid + best_at + 1, (n - best_at - 2) * sizeof(int32_t));
        n--;
        if (best_at > 0)
            pid[best_at - 1] = kvq__pair(t, tok[best_at - 1], tok[best_at], sb);
        if (best_at + 1 < n)
            pid[best_at] = kvq__pair(t, tok[best_at], tok[best_at + 1], sb);
    }
    kvq__free(&t->alloc, pid);
    if (eos)
        tok[n++] = 2;
    kvq__free(&t->alloc, sb);
    *n_out = n;
    return KVQ_OK;
}

const char *kvq_tokenizer_piece(const kvq_tokenizer *t, int32_t prev, int32_t token, char buf[8]) {
    if (!t || token < 0 || (size_t)token >= t->n)
        return "";
    const char *p = t->piece[token];
    if (prev == 1 && p[0] == ' ')
        p++;
    unsigned v;
    if (strlen(p) == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
        sscanf(p, "<0x%2X>", &v) == 1) {
        buf[0] = (char)v;
        buf[1] = 0;
        return buf;
    }
    return p;
}
