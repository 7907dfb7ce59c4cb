/* dtype names and 16-bit float conversions (see dtype.h). */
#include "engine/dtype.h"
#include "core/error.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[EXO_DTYPE_COUNT] = {
    [EXO_DTYPE_F32] = {"F32", 4},  [EXO_DTYPE_F16] = {"F16", 2},  [EXO_DTYPE_BF16] = {"BF16", 2},
    [EXO_DTYPE_F64] = {"F64", 8},  [EXO_DTYPE_I8] = {"I8", 1},    [EXO_DTYPE_U8] = {"U8", 1},
    [EXO_DTYPE_I16] = {"I16", 2},  [EXO_DTYPE_U16] = {"U16", 2},  [EXO_DTYPE_I32] = {"I32", 4},
    [EXO_DTYPE_U32] = {"U32", 4},  [EXO_DTYPE_I64] = {"I64", 8},  [EXO_DTYPE_U64] = {"U64", 8},
    [EXO_DTYPE_BOOL] = {"BOOL", 1},
};

size_t exo_dtype_size(exo_dtype t) { return (unsigned)t < EXO_DTYPE_COUNT ? dtype_info[t].size : 0; }

const char *exo_dtype_name(exo_dtype t)
{
    return (unsigned)t < EXO_DTYPE_COUNT ? dtype_info[t].name : "?";
}

int exo_dtype_parse(const char *s, exo_dtype *out)
{
    for (int i = 0; i < EXO_DTYPE_COUNT; i++) {
        if (!strcmp(s, dtype_info[i].name)) {
            *out = (exo_dtype)i;
            return 0;
        }
    }
    return EXO_EFORMAT;
}

float exo_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t exo_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t man = u & 0x7fffff;
    if (exp == 255)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is the correct rounding */
    return (uint16_t)h;
}

void exo_convert_to_f32(exo_dtype t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case EXO_DTYPE_F32:
        memcpy(dst, src, n * 4);
        break;
    case EXO_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = exo_bf16_to_f32(s[i]);
        break;
    }
    case EXO_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = exo_f16_to_f32(s[i]);
        break;
    }
    default:
        memset(dst, 0, n * 4);
        break;
    }
}
