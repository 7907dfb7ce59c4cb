/* AVX-512 streaming read kernel for membw.c: eight independent 64-byte
 * accumulators keep enough loads in flight to saturate a core's share of
 * DRAM bandwidth; `streams` equal parts of the range are read side by side,
 * as a GEMV reads its row block's rows, then what the parts leave; with
 * `prefetch`, every line is also software-prefetched that many bytes ahead
 * in its part, as the GEMV kernels do. Every whole 64-byte line is read
 * once, so the result (the xor of them all) does not depend on `streams`. */
#include "engine/cpu/membw.h"

#include <immintrin.h>

unsigned long long exo_membw_sum_avx512(const void *p, size_t bytes, int streams, size_t prefetch)
{
    const size_t part = bytes / (size_t)streams / 256 * 256; /* 4 lines a step */
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0;
    for (size_t off = 0; off < part; off += 256)
        for (int s = 0; s < streams; s++) {
            const __m512i *v = (const __m512i *)((const char *)p + (size_t)s * part + off);
            if (prefetch) /* never faults, so past the end is harmless */
                for (int l = 0; l < 4; l++)
                    _mm_prefetch((const char *)(v + l) + prefetch, _MM_HINT_T0);
            if (s & 1) {
                a4 = _mm512_xor_si512(a4, _mm512_load_si512(v));
                a5 = _mm512_xor_si512(a5, _mm512_load_si512(v + 1));
                a6 = _mm512_xor_si512(a6, _mm512_load_si512(v + 2));
                a7 = _mm512_xor_si512(a7, _mm512_load_si512(v + 3));
            } else {
                a0 = _mm512_xor_si512(a0, _mm512_load_si512(v));
                a1 = _mm512_xor_si512(a1, _mm512_load_si512(v + 1));
                a2 = _mm512_xor_si512(a2, _mm512_load_si512(v + 2));
                a3 = _mm512_xor_si512(a3, _mm512_load_si512(v + 3));
            }
        }
    for (size_t off = (size_t)streams * part; off + 64 <= bytes; off += 64) /* the rest, one stream */
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const char *)p + off));
    a0 = _mm512_xor_si512(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)),
                          _mm512_xor_si512(_mm512_xor_si512(a4, a5), _mm512_xor_si512(a6, a7)));
    return (unsigned long long)_mm512_reduce_add_epi64(a0);
}
