/* AVX-512 helpers shared by the vector GEMV (gemv_avx512.c) and the AMX
 * kernel (gemv_amx.c): 4-bit codes as bytes. Internal; include only from
 * files compiled with the AVX-512 flags (*_avx512.c, *_amx.c). */
#ifndef EXO_ENGINE_CPU_CODES_AVX512_H
#define EXO_ENGINE_CPU_CODES_AVX512_H

#include <immintrin.h>

/* u = 2 * e2m1 + 12 for each MXFP4 code (0..24, what vpdpbusd and TDPBUSD
 * take as unsigned bytes: w = 2^(s-128) * (u - 12)), replicated in the four
 * 128-bit lanes for vpshufb. */
static inline __attribute__((always_inline)) __m512i exo_mx_table(void)
{
    return _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
}

/* 64 bytes of packed 4-bit codes as their low nibbles (the even elements)
 * and high nibbles (the odd ones), one byte each; mx: MXFP4 codes through
 * exo_mx_table. */
static inline __attribute__((always_inline)) void exo_split_nibbles(__m512i v, int mx, __m512i *lo, __m512i *hi)
{
    const __m512i nib = _mm512_set1_epi8(0x0f);
    *lo = _mm512_and_si512(v, nib);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    if (mx) {
        *lo = _mm512_shuffle_epi8(exo_mx_table(), *lo);
        *hi = _mm512_shuffle_epi8(exo_mx_table(), *hi);
    }
}

/* E8M0 bytes (16, zero-extended to lanes) -> 2^(s - 128) = exo_e8m0_to_f32 / 2
 * exactly (s = 0 -> 2^-128 via the subnormal 2^-127). */
static inline __attribute__((always_inline)) __m512 exo_e8m0_half16(__m128i bytes)
{
    __m512i s = _mm512_cvtepu8_epi32(bytes);
    __m512i bits = _mm512_slli_epi32(s, 23);
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512()),
                                 _mm512_set1_epi32(0x00400000));
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0.5f));
}

#endif
