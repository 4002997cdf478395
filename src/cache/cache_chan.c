/*
 * cache_chan.c - KIVI-style per-channel key pages: for each channel of one
 * KV head, an fp16 scale and minimum over the P tokens of a page, and per
 * token a row of b-bit codes (1..8 bits), bit-packed little-end first
 * (channel c in bits [c*b, c*b+b) of its row). A page is encoded only when
 * it is full, so quantization never looks at future tokens. Scoring folds
 * the scales into the query: <q, k_i> = sum_c q_c m_c + sum_c (q_c s_c) code_ic.
 */
#include "cache_impl.h"

size_t kvq__chan_header_bytes(size_t d) { return 4 * d; }
size_t kvq__chan_row_bytes(size_t d, int bits) { return (d * (size_t)bits + 7) / 8; }

static inline unsigned kvq__getbits(const uint8_t *row, size_t idx, int bits) {
    size_t bit = idx * (size_t)bits;
    size_t byte = bit >> 3;
    unsigned sh = (unsigned)(bit & 7);
    unsigned v = row[byte];
    if (sh + (unsigned)bits > 8)
        v |= (unsigned)row[byte + 1] << 8;
    return (v >> sh) & ((1u << bits) - 1u);
}

static inline void kvq__putbits(uint8_t *row, size_t idx, int bits, unsigned val) {
    size_t bit = idx * (size_t)bits;
    size_t byte = bit >> 3;
    unsigned sh = (unsigned)(bit & 7);
    unsigned v = val << sh;
    row[byte] |= (uint8_t)v;
    if (sh + (unsigned)bits > 8)
        row[byte + 1] |= (uint8_t)(v >> 8);
}

void kvq__chan_encode(uint8_t *area, size_t d, size_t P, int bits, const float *rows,
                      const uint8_t *valid) {
    const float L = (float)((1u << bits) - 1u);
    size_t rb = kvq__chan_row_bytes(d, bits);
    uint8_t *codes = area + kvq__chan_header_bytes(d);
    memset(codes, 0, rb * P);
    for (size_t c = 0; c < d; c++) {
        float mn = INFINITY, mx = -INFINITY;
        for (size_t i = 0; i < P; i++)
            if (valid[i]) {
                float x = rows[i * d + c];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
        if (mn > mx)
            mn = mx = 0.0f;
        uint16_t mh = kvq__f16_from_f32(mn);
        float m = kvq__f16_to_f32(mh);
        float range = mx - m;
        float sraw = range / L;
        if (!(sraw <= 65504.0f))
            sraw = 65504.0f;
        uint16_t sh = kvq__f16_from_f32(sraw);
        float s = kvq__f16_to_f32(sh);
        /* the fp16 scale may round down: step up until the range fits */
        while (s * L < range && s < 65504.0f) {
            sh++;
            s = kvq__f16_to_f32(sh);
        }
        kvq__st16(area + 2 * c, sh);
        kvq__st16(area + 2 * d + 2 * c, mh);
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (size_t i = 0; i < P; i++) {
            if (!valid[i])
                continue;
            float qf = nearbyintf((rows[i * d + c] - m) * inv);
            qf = qf < 0.0f ? 0.0f : (qf > L ? L : qf);
            kvq__putbits(codes + i * rb, c, bits, (unsigned)qf);
        }
    }
}

void kvq__chan_decode_row(const uint8_t *area, size_t d, size_t P, int bits, size_t row,
                          float *out) {
    (void)P;
    size_t rb = kvq__chan_row_bytes(d, bits);
    const uint8_t *codes = area + kvq__chan_header_bytes(d) + row * rb;
    for (size_t c = 0; c < d; c++) {
        float s = kvq__f16_to_f32(kvq__ld16(area + 2 * c));
        float m = kvq__f16_to_f32(kvq__ld16(area + 2 * d + 2 * c));
        out[c] = m + s * (float)kvq__getbits(codes, c, bits);
    }
}

void kvq__chan_score(const uint8_t *area, size_t d, size_t P, int bits, const float *q, size_t G,
                     float *s, size_t sstride) {
    size_t rb = kvq__chan_row_bytes(d, bits);
    const uint8_t *codes = area + kvq__chan_header_bytes(d);
    float qsc[KVQ__MAX_HEAD_DIM];
    for (size_t g = 0; g < G; g++) {
        const float *qg = q + g * d;
        float base = 0.0f;
        for (size_t c = 0; c < d; c++) {
            float sc = kvq__f16_to_f32(kvq__ld16(area + 2 * c));
            float m = kvq__f16_to_f32(kvq__ld16(area + 2 * d + 2 * c));
            qsc[c] = qg[c] * sc;
            base += qg[c] * m;
        }
        for (size_t i = 0; i < P; i++) {
            const uint8_t *row = codes + i * rb;
            float acc = base;
            if (bits == 8) {
                for (size_t c = 0; c < d; c++)
                    acc += qsc[c] * (float)row[c];
            } else if (bits == 4) {
                for (size_t c = 0; c < d; c++)
                    acc += qsc[c] * (float)((row[c >> 1] >> ((c & 1) * 4)) & 15u);
            } else {
                for (size_t c = 0; c < d; c++)
                    acc += qsc[c] * (float)kvq__getbits(row, c, bits);
            }
            s[g * sstride + i] = acc;
        }
    }
}
