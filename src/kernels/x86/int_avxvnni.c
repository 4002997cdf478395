/*
 * int_avxvnni.c - the tiled int8 attention kernels of the AVX-VNNI path
 * (KVQ_ISA_AVXVNNI: AVX2 + the VEX forms of the VNNI instructions on 256
 * bits, the CPUs with AVX-VNNI and without AVX-512, such as Intel's Alder
 * Lake and later): int_avx2_body.h built with KVQ__VNNI 1, for int8 (int4
 * keeps AVX2's: maddubs sums its nibble products in int16 over up to 4
 * steps, as many products per op as vpdpbusd, measured even). The int8
 * keys and values are s16 x s16 products (int_tile.h: int16 query codes,
 * u16 weights), where one vpdpwssd does plain AVX2's vpmaddwd + vpaddd.
 * Everything else of the AVX2 path (encode, decode, row kernels, the
 * prepared query, the weight rounding) stays int_avx2.c's.
 *
 * Built natively with the AVX2 flags, the kernels carry the avxvnni target
 * and run only after run-time detection; built with -DKVQ_SIMDE for the
 * tests (Makefile: $(BUILD)/simde/), vpdpwssd comes from SIMDe's portable
 * version and the selector is kvq__int_avxvnni_select_simde, so that
 * `make check` checks these kernels on CPUs without AVX-VNNI too.
 */
#include "../kernels.h"
#include "simd_avx2.h"
#include "int_tile.h"

#ifdef KVQ_SIMDE
#include <simde/x86/avx512/dpwssd.h>
#define KVQ__DPW256(acc, a, b) simde_mm256_dpwssd_epi32(acc, a, b)
#define KVQ__TVNNI
#define KVQ__SELVNNI(name) name##_simde
#else
#define KVQ__DPW256(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#define KVQ__TVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define KVQ__SELVNNI(name) name
#endif

#define KVQ__VNNI 1
#define KVQ__TGT KVQ__TVNNI
#define KVQ__FN(name) name##_avxvnni
#include "int_avx2_body.h"
#undef KVQ__VNNI
#undef KVQ__TGT
#undef KVQ__FN

/* Over int_avx2.c's choice (kvq__int_avx2_select ran first): the tiled
 * int8 kernels, on the same condition; int4 keeps AVX2's. */
void KVQ__SELVNNI(kvq__int_avxvnni_select)(kvq_codec *c) {
    if (!kvq__tile_ok(c) || c->bits != 8)
        return;
    c->k.tscore = kvq__int_tscore8_avxvnni;
    c->k.taccum = kvq__int_taccum8_avxvnni;
    c->k.taccum_run = kvq__int_taccum_run8_avxvnni;
}
