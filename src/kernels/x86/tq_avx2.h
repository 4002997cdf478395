/*
 * tq_avx2.h - the code tables of the AVX2 tiled kernels of the TurboQuant
 * family (tq_avx2.c), shared with their tests (tests/test_tile_tq.c).
 *
 * AVX2 has no vpdpbusd: a product of 4 bytes is vpmaddubsw (u8 x s8, int16
 * pair sums that saturate) then vpmaddwd with ones (int32). The AVX2
 * kernels sum two vpmaddubsw results in int16 before the vpmaddwd (three
 * multiplies per two byte products instead of four; the multiply pipes
 * bound these kernels), so every int16 sum of two pairs must stay below
 * 2^15: they take the centroids as codes of at most KVQ__TQ_C_AVX2 in
 * magnitude (t->c8 holds 127) instead of tq.c's c8:
 *   c6[l] = round(cent[l] * (63 / m)) (nearest even, in float), m = |cent[levels-1]|
 *   (the largest magnitude), scale s6 = m / 63; |c6| <= 63, the extremes
 *   are +-63; entries l >= levels are 0.
 *  - tscore: unsigned codes c6 + 64 (1..127) times the query codes (|a_j|
 *    <= KVQ__TQ_Q_MADD = 63): 2 groups x 2 pairs x 127 x 63 = 32004 < 2^15;
 *    the bias 64 sum_j a_j is removed (kvq__tq_tqh.corr);
 *  - taccum: weight codes (<= KVQ__TQ_W_MADD = 127) times the signed codes
 *    c6: 2 quads x 2 pairs x 127 x 63 = 32004 < 2^15.
 * The error bounds of tq.c ("Tiled pages") hold with s_c = s6.
 */
#ifndef KVQ_TQ_AVX2_H
#define KVQ_TQ_AVX2_H

#include "../../codec/tq_impl.h"

#define KVQ__TQ_C_AVX2 63
#define KVQ__TQ_BIAS_AVX2 64

/* Prepared query of the AVX2 tscore (c->tqp_bytes): kvq__tq_tqh's fields
 * (sc = s_q s6, corr = 64 sum_j a_j), then the biased code table; the query
 * codes at KVQ__TQ_TQ_CODES as for every tiled path, and at
 * KVQ__TQ_TQ_QV(d) the 4 codes of each group of 4 dimensions repeated over
 * 32 bytes (the operands of vpmaddubsw, loaded without a broadcast). */
#define KVQ__TQ_TQ_QV(d) (KVQ__TQ_TQ_CODES + kvq__round64(d))
typedef struct kvq__tq_tqh2 {
    float sc;
    int32_t corr;
    int32_t pad[2];
    uint8_t tabu[16]; /* c6[l] + 64 */
} kvq__tq_tqh2;

/* c6[16] and s6 of codec t (the rule above). */
void kvq__tq_avx2_codes(const kvq__tq *t, int8_t *c6, float *s6);

#endif
