/* The vpdpbusd loop of dotpeak.c: twelve accumulators, more than the
 * instruction's latency times its issue rate, so that it runs at its
 * throughput. */
#include "engine/cpu/dotpeak.h"

#include <immintrin.h>

unsigned long long exo_dot_peak_avx512(long iters, int seed)
{
    const __m512i a = _mm512_set1_epi32(seed | 0x01010101), b = _mm512_set1_epi32(seed ^ 0x02030405);
    __m512i acc[12];
    for (int i = 0; i < 12; i++)
        acc[i] = _mm512_set1_epi32(i + seed);
    for (long n = 0; n < iters; n++)
        #pragma GCC unroll 12 /* the accumulators stay in registers */
        for (int i = 0; i < 12; i++)
            acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    for (int i = 1; i < 12; i++)
        acc[0] = _mm512_add_epi32(acc[0], acc[i]);
    return (unsigned long long)_mm512_reduce_add_epi32(acc[0]);
}
