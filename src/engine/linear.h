/* A linear layer's weight as the kernels see it: y = W x, W is rows x cols
 * (out_features x in_features, the PyTorch nn.Linear layout).
 *
 * Dense weights are F32/F16/BF16 row-major. Quantized weights are MLX's
 * affine format: per row, `cols` codes of `bits` bits packed into a
 * little-endian bit stream stored as uint32 words (cols*bits/32 words a row),
 * plus one scale and one bias per group of `group_size` consecutive columns,
 * and w[r][c] = scale[r][c/G] * q[r][c] + bias[r][c/G].
 *
 * MXFP4 weights (OCP microscaling FP4, gpt-oss experts) are 4.25 bits a
 * weight: per row, `cols` FP4 E2M1 codes, two per byte, element 2i in the
 * low nibble of byte i and 2i+1 in the high nibble (cols/2 bytes a row),
 * plus one E8M0 scale byte s per 32 consecutive columns, and
 *   w[r][c] = exo_fp4_e2m1[code] * 2^(s[r][c/32] - 127)
 * (exo_e8m0_to_f32). This one byte stream is both Hugging Face's
 * `*_blocks` [rows, cols/32, 16] uint8 with `*_scales` [rows, cols/32]
 * uint8, and MLX's mode="mxfp4" `weight` [rows, cols/8] uint32 (code k of a
 * little-endian word at bits 4k..4k+3, i.e. the same bytes) with its uint8
 * `scales`: either checkpoint's tensors are used as they are.
 *
 * An exo_linear never owns its memory: it points into a mmapped checkpoint,
 * or into a buffer owned by whoever built it. */
#ifndef EXO_ENGINE_LINEAR_H
#define EXO_ENGINE_LINEAR_H

#include "engine/dtype.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum exo_wformat {
    EXO_WFORMAT_DENSE = 0,  /* w is `dtype` [rows][cols] */
    EXO_WFORMAT_AFFINE = 1, /* w is uint32 codes, scales/biases are `dtype` */
    EXO_WFORMAT_MXFP4 = 2,  /* w is packed E2M1 nibbles, scales are E8M0 bytes */
    EXO_WFORMAT_AFFINE_PANELS = 3, /* affine codes and parameters in panels of 16 rows (below) */
} exo_wformat;

/* Affine panels: an affine weight of 4 or 8 bits whose rows are a multiple
 * of 16, laid out for integer dot products with the output rows in vector
 * lanes (the CPU backend's layout on CPUs whose GEMV runs on the vector
 * units: cpu/gemv_panels_avx512.c says why). Rows 16p .. 16p+15 form panel
 * p; w holds the panels in order, each `cols / G` blocks, one per group g
 * in order (exo_panel_block_bytes each):
 *   codes: G*bits/32 vectors of 64 bytes; 32-bit lane i of vector o holds
 *     row 16p+i's codes of columns gG + oL .. gG + oL + L-1 (L = 32/bits):
 *     8 bits: byte j = column oL + j; 4 bits: byte j = column oL + j in its
 *     low nibble and column oL + 4 + j in its high nibble;
 *   then the 16 rows' scales of group g (`dtype`), then their 16 biases.
 * MXFP4 weights take the same layout with `dtype` EXO_DTYPE_U8 (G 32): the
 * 4-bit codes are E2M1 values and the parameters are the 16 rows' E8M0
 * scale bytes, no biases (exo_panels_mx).
 * scales and biases are NULL. A backend makes it at load time (quant.h,
 * exo_linear_to_panels) and never slices it: rows are not equal slices. */

/* Field use per format:
 *           dtype              w                          scales             biases  bits  group_size
 *   DENSE   element type       (rows, cols) of dtype      -                  -       -     -
 *   AFFINE  scales/biases type (rows, cols*bits/32) u32   (rows, cols/G)     same    2-8   32/64/128
 *   MXFP4   EXO_DTYPE_U8       (rows, cols/2) bytes       (rows, cols/32) u8 NULL    4     32
 *   AFFINE_PANELS  as AFFINE   panels (above)             NULL               NULL    4, 8  32/64/128
 *          (from MXFP4: U8)                                                      4     32
 * MXFP4 needs cols % 32 == 0; w and scales may have any alignment. */
typedef struct exo_linear {
    exo_wformat format;
    exo_dtype   dtype;      /* DENSE: element type; AFFINE: type of scales and biases; MXFP4: U8 */
    int64_t     rows;       /* out features */
    int64_t     cols;       /* in features */
    const void *w;          /* (rows, cols) dense, (rows, cols*bits/32) uint32, or MXFP4 bytes */
    const void *scales;     /* AFFINE: (rows, cols/group_size); MXFP4: (rows, cols/32) E8M0 */
    const void *biases;     /* AFFINE: (rows, cols/group_size); MXFP4: unused (NULL) */
    int         bits;       /* AFFINE: 2, 3, 4, 5, 6 or 8; MXFP4: 4 */
    int         group_size; /* AFFINE: 32, 64 or 128; MXFP4: 32 */
    /* A weight chosen on a device at run time (a mixture's expert, see
     * backend.h moe_pick): this struct gives the shape and format every
     * choice shares, and choice c's w, scales and biases are entries 3c,
     * 3c + 1 and 3c + 2 of pick_table, c = *pick (both backend memory,
     * read when the product runs), and row t of x takes choice
     * pick[t * pick_stride] (0: every row *pick). NULL in every weight a
     * host reads. */
    const void *const *pick_table;
    const int32_t     *pick;
    int                pick_stride;
    /* Added to every output row (rows floats, memory of the weight's
     * backend), as a layer's bias: every product of the weight adds it,
     * so a backend can do so in its last write. NULL: none. */
    const float       *out_bias;
} exo_linear;

/* FP4 E2M1 code -> value: bit 3 sign, bits 2..1 exponent (bias 1), bit 0
 * mantissa; code 1 is the subnormal 0.5, code 8 is -0. */
extern const float exo_fp4_e2m1[16];

/* E8M0 scale byte -> 2^(s - 127), exactly: s = 0 is 2^-127 (a subnormal f32,
 * as MLX decodes it), s = 255 gives +inf (NaN in the OCP spec; never in a
 * checkpoint). */
static inline float exo_e8m0_to_f32(uint8_t s)
{
    uint32_t u = s ? (uint32_t)s << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Bytes a full pass over the weight reads (codes + scales + biases). */
size_t exo_linear_bytes(const exo_linear *w);

/* Sizes of the three arrays of a weight, in bytes: w, scales, biases (0 for
 * an array the format has not). Each is rows equal slices, so row r of an
 * array starts at r * (bytes / rows): code that copies or slices weights by
 * rows needs nothing format-specific (affine panels excepted, which are
 * never sliced). */
void exo_linear_part_bytes(const exo_linear *w, size_t *w_bytes, size_t *scales_bytes,
                           size_t *biases_bytes);

/* Dequantizes/converts row r to f32 (cols values). */
void exo_linear_row_f32(const exo_linear *w, int64_t r, float *out);

/* Weights standing for slot j of a choice of k experts (backend.h
 * moe_pick), as decode builds them: picked[3j + p] has the shape and format
 * of experts[p] (every expert's part p shares them: 0 gate, 1 up, 2 down)
 * and reads the entry of table (moe_pick_table of n_experts) that
 * idx[t * stride + j] names for row t of x (stride 0: every row idx[j]). */
void exo_linear_pick_slots(exo_linear *picked, int k, const exo_linear *experts, const void *table, int n_experts,
                           const int32_t *idx, int stride);

/* Whether a panels weight holds MXFP4 codes and E8M0 scales (linear.h). */
static inline bool exo_panels_mx(const exo_linear *w) { return w->dtype == EXO_DTYPE_U8; }

/* Bytes of one group's block of a panels weight (codes of 16 rows, then
 * their scales and biases, or their E8M0 scale bytes). */
static inline size_t exo_panel_block_bytes(const exo_linear *w)
{
    return (size_t)w->group_size * 16u * (size_t)w->bits / 8u +
           (exo_panels_mx(w) ? 16u : 32u * exo_dtype_size(w->dtype));
}

#endif
