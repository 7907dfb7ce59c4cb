/* CPUID-based feature detection (see cpu_features.h). */
#include "core/cpu_features.h"

#include <stdlib.h>
#include <string.h>

static exo_isa detect(void)
{
    __builtin_cpu_init();
    exo_isa isa = EXO_ISA_GENERIC;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isa = EXO_ISA_AVX2;
    if (isa == EXO_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512bf16"))
        isa = EXO_ISA_AVX512;
    const char *cap = getenv("EXO_CPU_ISA");
    if (cap) {
        exo_isa want = !strcmp(cap, "generic") ? EXO_ISA_GENERIC
                     : !strcmp(cap, "avx2")    ? EXO_ISA_AVX2
                                               : EXO_ISA_AVX512;
        if (want < isa)
            isa = want;
    }
    return isa;
}

exo_isa exo_cpu_isa(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = (int)detect();
    return (exo_isa)cached;
}

bool exo_cpu_has_amx(void)
{
#if defined(__x86_64__)
    static int cached = -1;
    if (cached < 0) {
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        bool hw = (d & (1u << 24)) && (d & (1u << 25)) && (d & (1u << 22));
        cached = hw && exo_cpu_isa() == EXO_ISA_AVX512;
    }
    return cached;
#else
    return false;
#endif
}

const char *exo_isa_name(exo_isa isa)
{
    switch (isa) {
    case EXO_ISA_AVX512: return "avx512";
    case EXO_ISA_AVX2:   return "avx2";
    default:             return "generic";
    }
}
