/* A linear layer's weight as the kernels see it: y = W x, W is rows x cols
 * (out_features x in_features, the PyTorch nn.Linear layout).
 *
 * Dense weights are F32/F16/BF16 row-major. Quantized weights are MLX's
 * affine format: per row, `cols` codes of `bits` bits packed into a
 * little-endian bit stream stored as uint32 words (cols*bits/32 words a row),
 * plus one scale and one bias per group of `group_size` consecutive columns,
 * and w[r][c] = scale[r][c/G] * q[r][c] + bias[r][c/G].
 *
 * An exo_linear never owns its memory: it points into a mmapped checkpoint,
 * or into a buffer owned by whoever built it. */
#ifndef EXO_ENGINE_LINEAR_H
#define EXO_ENGINE_LINEAR_H

#include "engine/dtype.h"

#include <stdint.h>

typedef enum exo_wformat {
    EXO_WFORMAT_DENSE = 0,  /* w is `dtype` [rows][cols] */
    EXO_WFORMAT_AFFINE = 1, /* w is uint32 codes, scales/biases are `dtype` */
} exo_wformat;

typedef struct exo_linear {
    exo_wformat format;
    exo_dtype   dtype;      /* DENSE: element type; AFFINE: type of scales and biases */
    int64_t     rows;       /* out features */
    int64_t     cols;       /* in features */
    const void *w;          /* (rows, cols) dense, or (rows, cols*bits/32) uint32 */
    const void *scales;     /* AFFINE: (rows, cols/group_size) */
    const void *biases;     /* AFFINE: (rows, cols/group_size) */
    int         bits;       /* AFFINE: 2, 3, 4, 5, 6 or 8 */
    int         group_size; /* AFFINE: 32, 64 or 128 */
} exo_linear;

/* Bytes a full pass over the weight reads (codes + scales + biases). */
size_t exo_linear_bytes(const exo_linear *w);

/* Dequantizes/converts row r to f32 (cols values). */
void exo_linear_row_f32(const exo_linear *w, int64_t r, float *out);

#endif
