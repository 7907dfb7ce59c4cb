/* AVX-512 streaming read kernel for membw.c: eight independent 64-byte
 * accumulators keep enough loads in flight to saturate a core's share of
 * DRAM bandwidth. */
#include "engine/cpu/membw.h"

#include <immintrin.h>

unsigned long long exo_membw_sum_avx512(const void *p, size_t bytes)
{
    const __m512i *v = p;
    size_t n = bytes / 64;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(v + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(v + i + 1));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(v + i + 2));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(v + i + 3));
        a4 = _mm512_xor_si512(a4, _mm512_load_si512(v + i + 4));
        a5 = _mm512_xor_si512(a5, _mm512_load_si512(v + i + 5));
        a6 = _mm512_xor_si512(a6, _mm512_load_si512(v + i + 6));
        a7 = _mm512_xor_si512(a7, _mm512_load_si512(v + i + 7));
    }
    for (; i < n; i++)
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(v + i));
    a0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)),
                          _mm512_xor_si512(_mm512_xor_si512(a4, a5), _mm512_xor_si512(a6, a7)));
    return (unsigned long long)_mm512_reduce_add_epi64(a0);
}
