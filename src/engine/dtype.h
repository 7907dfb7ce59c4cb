/* Element types of tensors as they appear in checkpoints, and the scalar
 * conversions between the 16-bit float formats and f32.
 *
 * Conversions round to nearest even, as torch's .to(bfloat16/float16) does,
 * so a checkpoint written by exo is bit-identical to one written by torch
 * from the same f32 values. */
#ifndef EXO_ENGINE_DTYPE_H
#define EXO_ENGINE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum exo_dtype {
    EXO_DTYPE_F32 = 0,
    EXO_DTYPE_F16,
    EXO_DTYPE_BF16,
    EXO_DTYPE_F64,
    EXO_DTYPE_I8,
    EXO_DTYPE_U8,
    EXO_DTYPE_I16,
    EXO_DTYPE_U16,
    EXO_DTYPE_I32,
    EXO_DTYPE_U32,
    EXO_DTYPE_I64,
    EXO_DTYPE_U64,
    EXO_DTYPE_BOOL,
    EXO_DTYPE_COUNT /* keep last; append new types above it */
} exo_dtype;

size_t      exo_dtype_size(exo_dtype t);
const char *exo_dtype_name(exo_dtype t); /* safetensors spelling: "F32", "BF16", ... */
/* Parses the safetensors spelling; returns 0 or EXO_EFORMAT. */
int         exo_dtype_parse(const char *s, exo_dtype *out);

static inline float exo_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t exo_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float    exo_f16_to_f32(uint16_t h);
uint16_t exo_f32_to_f16(float f);

/* Converts n elements of type t at src to f32. t must be F32, F16 or BF16. */
void exo_convert_to_f32(exo_dtype t, const void *src, float *dst, size_t n);

#endif
