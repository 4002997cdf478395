/*
 * simd_avx512.h - what the AVX-512 kernel files include. Those files are
 * built twice:
 *  - natively, with the AVX2 flags: their functions carry the AVX-512 target
 *    themselves (KVQ__T512, KVQ__T512VNNI, KVQ__T512VBMI) and run only after
 *    run-time detection; their selector is KVQ__SEL512(name) = name;
 *  - with -DKVQ_SIMDE for the tests (Makefile: $(BUILD)/simde/): the
 *    intrinsics come from SIMDe's portable implementation, the target
 *    attributes vanish and the selector is name_simde, so `make check`
 *    compiles and checks the AVX-512 sources on CPUs without AVX-512.
 * Selectors take the AVX-512 extensions to use (KVQ__X512_* bits): the
 * dispatcher passes the CPU's, the tests pass every one.
 * Only the selector of such a file may have external linkage.
 */
#ifndef KVQ_SIMD_AVX512_H
#define KVQ_SIMD_AVX512_H

#ifdef KVQ_SIMDE
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define KVQ__T512
#define KVQ__T512VNNI
#define KVQ__T512VBMI
#define KVQ__SEL512(name) name##_simde
#else
#include <immintrin.h>
#define KVQ__T512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c,bmi2")))
#define KVQ__T512VNNI                                                                              \
    __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512vnni,avx2,fma,f16c,bmi2")))
#define KVQ__T512VBMI                                                                              \
    __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c,bmi2")))
#define KVQ__SEL512(name) name
#endif

#endif
