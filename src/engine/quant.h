/* MLX affine quantization: quantize, pack, unpack and dequantize rows.
 *
 * The format (see linear.h): per row, `cols` unsigned codes of `bits` bits in
 * a little-endian, least-significant-bit-first bit stream stored as uint32
 * words (cols*bits/32 words), and per group of `group_size` columns one scale
 * s and one bias b, with w = s*q + b. exo_affine_quantize_row reproduces
 * mx.quantize(w, group_size, bits, mode="affine") bit for bit on f32 input:
 * the same codes and the same f32 scales/biases before MLX casts them to the
 * weight's dtype (round them with exo_f32_to_bf16 / exo_f32_to_f16 to get the
 * stored values of a bf16/f16 checkpoint). */
#ifndef EXO_ENGINE_QUANT_H
#define EXO_ENGINE_QUANT_H

#include "core/error.h"
#include "core/threadpool.h"
#include "engine/linear.h"

#include <stdbool.h>
#include <stdint.h>

/* 0 if (bits, group_size, cols) is a valid MLX affine layout: bits in
 * {2,3,4,5,6,8}, group_size in {32,64,128}, cols > 0, cols % group_size == 0
 * (which implies cols*bits % 32 == 0). Otherwise EXO_EINVAL with a message. */
int exo_affine_check(int bits, int group_size, int64_t cols, exo_err *err);

/* Quantizes one row of `cols` f32 values. codes_out gets cols*bits/32 packed
 * words; scales_out/biases_out get cols/group_size f32 values each.
 * Returns 0 or EXO_EINVAL (bad layout; nothing written). */
int exo_affine_quantize_row(const float *w, int64_t cols, int bits, int group_size,
                            uint32_t *codes_out, float *scales_out, float *biases_out);

/* Packs cols codes (each < 2^bits) into cols*bits/32 words; cols*bits must be
 * a multiple of 32. */
void exo_affine_pack(const uint8_t *codes, int64_t cols, int bits, uint32_t *words_out);

/* Unpacks cols codes from a packed row. Reads exactly cols*bits/32 words. */
void exo_affine_unpack_row(const uint32_t *words, int64_t cols, int bits, uint8_t *codes_out);

/* Dequantizes one packed row with f32 scales/biases: out[c] = s*q + b. */
void exo_affine_dequantize_row(const uint32_t *words, const float *scales, const float *biases,
                               int64_t cols, int bits, int group_size, float *out);

/* Reads scale/bias number i of type t (F32, F16 or BF16) as f32. */
float exo_affine_param_f32(exo_dtype t, const void *p, int64_t i);

/* Affine panels (linear.h): whether w (an AFFINE weight) can be laid out so
 * (4 or 8 bits, rows a multiple of 16, F32/F16/BF16 parameters), the bytes
 * it then takes, and the repacking itself: `out` becomes the panels weight
 * in dst (exo_linear_panels_bytes, any alignment), the same values; the
 * panels are shared among the threads of `pool` (NULL: this thread). */
bool   exo_linear_panels_ok(const exo_linear *w);
size_t exo_linear_panels_bytes(const exo_linear *w);
void   exo_linear_to_panels(const exo_linear *w, void *dst, exo_linear *out, exo_pool *pool);

#endif
