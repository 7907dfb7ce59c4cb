/* MLX affine quantization (see quant.h), plus the exo_linear helpers that
 * depend on it (exo_linear_bytes, exo_linear_row_f32, which also read MXFP4
 * weights: see linear.h).
 *
 * What MLX does, established from ml-explore/mlx (commit 846d176, 2026-08):
 *   mlx/ops.cpp            affine_quantize() + pack_and_quantize() (fallback)
 *   mlx/backend/cpu/quantized.cpp  quantize() (the CPU fast::Quantize)
 *   mlx/backend/common/quantized.h get_pack_factor / get_bytes_per_pack
 * Per group of G values, all arithmetic in f32:
 *   n_bins = 2^bits - 1, eps = 1e-7
 *   w_min, w_max over the group
 *   mask  = |w_min| > |w_max|
 *   scale = max((w_max - w_min) / n_bins, eps);  scale = mask ? scale : -scale
 *   edge  = mask ? w_min : w_max
 *   q0    = rint(edge / scale)           (round half to even)
 *   if q0 != 0: scale = edge / q0, bias = edge   else bias = 0
 *   q     = clamp(rint((w - bias) / scale), 0, n_bins)
 * so the edge value of larger magnitude is exactly representable (q = 0 or
 * n_bins), and zero is representable up to rounding of edge/q0; the scale is
 * negative when the group's max has the larger magnitude. Codes are computed
 * from the f32 scale; scales and biases are then cast to w's dtype.
 * Packing: bits 2/4/8 put 32/bits codes in each uint32, code k at bit k*bits.
 * Bits 3 and 5 pack 8 codes into 3 resp. 5 bytes, bits 6 packs 4 codes into
 * 3 bytes, code k at bit k*bits of the little-endian pack, packs stored
 * consecutively and the byte array viewed as uint32. Both are the same thing:
 * one little-endian LSB-first bit stream per row, which is how this file
 * reads and writes every width. Dequantization: w = scale * q + bias. */
#include "engine/quant.h"

#include <math.h>
#include <string.h>

int exo_affine_check(int bits, int group_size, int64_t cols, exo_err *err)
{
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return exo_err_set(err, EXO_EINVAL, "affine: unsupported bits %d (want 2,3,4,5,6,8)", bits);
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return exo_err_set(err, EXO_EINVAL, "affine: unsupported group size %d (want 32,64,128)",
                           group_size);
    if (cols <= 0 || cols % group_size != 0)
        return exo_err_set(err, EXO_EINVAL, "affine: %lld columns not a multiple of group size %d",
                           (long long)cols, group_size);
    if ((cols * bits) % 32 != 0)
        return exo_err_set(err, EXO_EINVAL, "affine: %lld columns x %d bits not whole words",
                           (long long)cols, bits);
    return 0;
}

float exo_affine_param_f32(exo_dtype t, const void *p, int64_t i)
{
    const unsigned char *b = p;
    if (t == EXO_DTYPE_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    return t == EXO_DTYPE_BF16 ? exo_bf16_to_f32(h) : exo_f16_to_f32(h);
}

void exo_affine_pack(const uint8_t *codes, int64_t cols, int bits, uint32_t *words_out)
{
    uint64_t acc = 0;
    int have = 0;
    int64_t w = 0;
    for (int64_t c = 0; c < cols; c++) {
        acc |= (uint64_t)(codes[c] & ((1u << bits) - 1)) << have;
        have += bits;
        if (have >= 32) {
            words_out[w++] = (uint32_t)acc;
            acc >>= 32;
            have -= 32;
        }
    }
}

/* Unpacks whole packs (MLX's 3/5-byte packs; 1 byte of four 2-bit codes
 * and 3 bytes of four 6-bit codes) with constant shifts: the bit stream is
 * the same, this is only faster than a generic bit reader. */
static inline __attribute__((always_inline)) void unpack_packs(const unsigned char *src,
                                                               int64_t cols, int bits,
                                                               int per, uint8_t *out)
{
    const int bpp = per * bits / 8;
    const uint64_t mask = (1u << bits) - 1;
    for (int64_t p = 0; p < cols / per; p++) {
        const unsigned char *b = src + p * bpp;
        uint64_t v = 0;
#pragma GCC unroll 8
        for (int i = 0; i < bpp; i++) /* bytes, not memcpy: no store-forwarding stall */
            v |= (uint64_t)b[i] << (8 * i);
#pragma GCC unroll 32
        for (int k = 0; k < per; k++)
            out[p * per + k] = (uint8_t)((v >> (k * bits)) & mask);
    }
}

void exo_affine_unpack_row(const uint32_t *words, int64_t cols, int bits, uint8_t *codes_out)
{
    const unsigned char *src = (const unsigned char *)words;
    int64_t nwords = cols * bits / 32;
    uint32_t mask = (1u << bits) - 1;
    if (bits == 8) {
        memcpy(codes_out, src, (size_t)cols);
        return;
    }
    if (bits == 4) {
        for (int64_t i = 0; i < cols / 2; i++) {
            codes_out[2 * i] = src[i] & 15;
            codes_out[2 * i + 1] = src[i] >> 4;
        }
        return;
    }
    if (cols % 32 == 0) {
        switch (bits) {
        case 2: unpack_packs(src, cols, 2, 32, codes_out); return; /* 8 bytes at a time */
        case 3: unpack_packs(src, cols, 3, 8, codes_out); return;
        case 5: unpack_packs(src, cols, 5, 8, codes_out); return;
        case 6: unpack_packs(src, cols, 6, 4, codes_out); return;
        default: break;
        }
    }
    uint64_t acc = 0;
    int have = 0;
    int64_t w = 0;
    for (int64_t c = 0; c < cols; c++) {
        if (have < bits) {
            uint32_t word = 0;
            if (w < nwords)
                memcpy(&word, src + 4 * w, 4);
            w++;
            acc |= (uint64_t)word << have;
            have += 32;
        }
        codes_out[c] = (uint8_t)(acc & mask);
        acc >>= bits;
        have -= bits;
    }
}

int exo_affine_quantize_row(const float *w, int64_t cols, int bits, int group_size,
                            uint32_t *codes_out, float *scales_out, float *biases_out)
{
    if (exo_affine_check(bits, group_size, cols, NULL))
        return EXO_EINVAL;
    const float n_bins = (float)((1 << bits) - 1);
    const float eps = 1e-7f;
    uint8_t q[128];
    int64_t words_per_group = (int64_t)group_size * bits / 32;
    for (int64_t g = 0; g < cols / group_size; g++) {
        const float *x = w + g * group_size;
        float w_min = INFINITY, w_max = -INFINITY;
        for (int j = 0; j < group_size; j++) {
            w_max = (w_max < x[j]) ? x[j] : w_max; /* std::max */
            w_min = (x[j] < w_min) ? x[j] : w_min; /* std::min */
        }
        int mask = fabsf(w_min) > fabsf(w_max);
        float scale = fmaxf((w_max - w_min) / n_bins, eps);
        scale = mask ? scale : -scale;
        float edge = mask ? w_min : w_max;
        float q0 = rintf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int j = 0; j < group_size; j++) {
            float v = rintf((x[j] - bias) / scale);
            v = fminf(fmaxf(v, 0.0f), n_bins);
            q[j] = (uint8_t)v;
        }
        exo_affine_pack(q, group_size, bits, codes_out + g * words_per_group);
        scales_out[g] = scale;
        biases_out[g] = bias;
    }
    return 0;
}

void exo_affine_dequantize_row(const uint32_t *words, const float *scales, const float *biases,
                               int64_t cols, int bits, int group_size, float *out)
{
    uint8_t q[128];
    int64_t words_per_group = (int64_t)group_size * bits / 32;
    for (int64_t g = 0; g < cols / group_size; g++) {
        exo_affine_unpack_row(words + g * words_per_group, group_size, bits, q);
        float s = scales[g], b = biases[g];
        for (int j = 0; j < group_size; j++)
            out[g * group_size + j] = s * (float)q[j] + b;
    }
}

const float exo_fp4_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void exo_linear_part_bytes(const exo_linear *w, size_t *w_bytes, size_t *scales_bytes,
                           size_t *biases_bytes)
{
    size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    size_t wb, sb = 0, bb = 0;
    if (w->format == EXO_WFORMAT_DENSE) {
        wb = rows * cols * exo_dtype_size(w->dtype);
    } else if (w->format == EXO_WFORMAT_MXFP4) {
        wb = rows * (cols / 2); /* two codes a byte */
        sb = rows * (cols / 32);  /* one E8M0 byte per 32 */
    } else if (w->format == EXO_WFORMAT_AFFINE_PANELS) {
        wb = rows / 16 * (cols / (size_t)w->group_size) * exo_panel_block_bytes(w);
    } else {
        wb = rows * (cols * (size_t)w->bits / 32) * 4;
        sb = bb = rows * (cols / (size_t)w->group_size) * exo_dtype_size(w->dtype);
    }
    *w_bytes = wb;
    *scales_bytes = sb;
    *biases_bytes = bb;
}

void exo_linear_pick_slots(exo_linear *picked, int k, const exo_linear *experts, const void *table, int n_experts,
                           const int32_t *idx, int stride)
{
    for (int j = 0; j < k; j++)
        for (int p = 0; p < 3; p++) {
            exo_linear *l = &picked[3 * j + p];
            *l = experts[p];
            l->w = l->scales = l->biases = NULL;
            l->pick_table = (const void *const *)table + (size_t)3 * (size_t)n_experts * (size_t)p;
            l->pick = idx + j;
            l->pick_stride = stride;
        }
}

size_t exo_linear_bytes(const exo_linear *w)
{
    size_t wb, sb, bb;
    exo_linear_part_bytes(w, &wb, &sb, &bb);
    return wb + sb + bb;
}

void exo_linear_row_f32(const exo_linear *w, int64_t r, float *out)
{
    int64_t cols = w->cols;
    if (w->format == EXO_WFORMAT_DENSE) {
        const unsigned char *base = w->w;
        exo_convert_to_f32(w->dtype, base + (size_t)r * (size_t)cols * exo_dtype_size(w->dtype),
                           out, (size_t)cols);
        return;
    }
    if (w->format == EXO_WFORMAT_MXFP4) {
        const uint8_t *src = (const uint8_t *)w->w + (size_t)r * (size_t)(cols / 2);
        const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * (size_t)(cols / 32);
        for (int64_t c = 0; c < cols; c += 2) {
            float s = exo_e8m0_to_f32(sc[c / 32]);
            out[c] = exo_fp4_e2m1[src[c / 2] & 15] * s;
            out[c + 1] = exo_fp4_e2m1[src[c / 2] >> 4] * s;
        }
        return;
    }
    int bits = w->bits, G = w->group_size;
    int64_t ng = cols / G;
    if (w->format == EXO_WFORMAT_AFFINE_PANELS) {
        const size_t block = exo_panel_block_bytes(w), codes = (size_t)(G * 16 * bits / 8);
        const int64_t lane = r % 16, per_word = 32 / bits;
        const int mx = exo_panels_mx(w);
        const unsigned char *panel = (const unsigned char *)w->w + (size_t)(r / 16) * (size_t)ng * block;
        for (int64_t g = 0; g < ng; g++) {
            const unsigned char *b = panel + (size_t)g * block;
            float s = mx ? exo_e8m0_to_f32(b[codes + (size_t)lane]) : exo_affine_param_f32(w->dtype, b + codes, lane);
            float bi = mx ? 0 : exo_affine_param_f32(w->dtype, b + codes, 16 + lane);
            for (int j = 0; j < G; j++) {
                int64_t o = j / per_word, k = j % per_word;
                unsigned byte = b[o * 64 + lane * 4 + (bits == 8 ? k : k % 4)];
                unsigned q = bits == 8 ? byte : k < 4 ? byte & 15u : byte >> 4;
                out[g * G + j] = mx ? exo_fp4_e2m1[q] * s : s * (float)q + bi;
            }
        }
        return;
    }
    int64_t wpr = cols * bits / 32;
    const uint32_t *words = (const uint32_t *)((const unsigned char *)w->w + (size_t)r * (size_t)wpr * 4);
    uint8_t q[128];
    for (int64_t g = 0; g < ng; g++) {
        /* words may be unaligned only if the caller's buffer is; unpack reads bytes */
        exo_affine_unpack_row((const uint32_t *)((const unsigned char *)words + (size_t)(g * G * bits / 8)),
                              G, bits, q);
        float s = exo_affine_param_f32(w->dtype, w->scales, r * ng + g);
        float b = exo_affine_param_f32(w->dtype, w->biases, r * ng + g);
        for (int j = 0; j < G; j++)
            out[g * G + j] = s * (float)q[j] + b;
    }
}

bool exo_linear_panels_ok(const exo_linear *w)
{
    if (w->rows <= 0 || w->rows % 16 || w->cols <= 0 || w->pick_table)
        return false;
    if (w->format == EXO_WFORMAT_MXFP4)
        return w->cols % 32 == 0;
    return w->format == EXO_WFORMAT_AFFINE && (w->bits == 4 || w->bits == 8) &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) && w->cols % w->group_size == 0 &&
           (w->dtype == EXO_DTYPE_F32 || w->dtype == EXO_DTYPE_F16 || w->dtype == EXO_DTYPE_BF16);
}

/* The panels form of w (linear.h): MXFP4 keeps its U8 dtype, 4 bits, G 32. */
static exo_linear panels_of(const exo_linear *w)
{
    exo_linear p = *w;
    p.format = EXO_WFORMAT_AFFINE_PANELS;
    if (w->format == EXO_WFORMAT_MXFP4) {
        p.dtype = EXO_DTYPE_U8;
        p.bits = 4;
        p.group_size = 32;
    }
    return p;
}

size_t exo_linear_panels_bytes(const exo_linear *w)
{
    exo_linear p = panels_of(w);
    return exo_linear_bytes(&p);
}

/* 4-bit codes: the 32-bit word of columns 8o .. 8o+7 of a row (code c at
 * bits 4c) becomes the panel's lane word: byte j = code j | code j+4 << 4. */
static uint32_t q4_lane_word(uint32_t x)
{
    uint32_t lo = x & 0xffffu, hi = x >> 16;
    lo = (lo | lo << 8) & 0x00ff00ffu;
    lo = (lo | lo << 4) & 0x0f0f0f0fu;
    hi = (hi | hi << 8) & 0x00ff00ffu;
    hi = (hi | hi << 4) & 0x0f0f0f0fu;
    return lo | hi << 4;
}

typedef struct panels_job {
    const exo_linear *w;
    unsigned char *dst;
} panels_job;

/* Share ith of nth of the panels. */
static void panels_share(void *ctx, int ith, int nth)
{
    const panels_job *job = ctx;
    const exo_linear *w = job->w;
    const exo_linear pw = panels_of(w);
    const int mx = exo_panels_mx(&pw);
    const int64_t ng = pw.cols / pw.group_size, G = pw.group_size;
    const size_t esz = exo_dtype_size(pw.dtype);
    const size_t row_bytes = (size_t)(pw.cols * pw.bits / 8);
    const size_t block = exo_panel_block_bytes(&pw), codes = (size_t)(G * 16 * pw.bits / 8);
    const int64_t words = G * pw.bits / 32; /* 32-bit code words of a row's group: one lane word each */
    long p0, p1;
    exo_split_range((long)(w->rows / 16), 1, ith, nth, &p0, &p1);
    unsigned char *d = job->dst + (size_t)p0 * (size_t)ng * block;
    for (int64_t p = p0; p < p1; p++)
        for (int64_t g = 0; g < ng; g++, d += block)
            for (int64_t i = 0; i < 16; i++) {
                const int64_t r = 16 * p + i;
                const unsigned char *src = (const unsigned char *)w->w + (size_t)r * row_bytes +
                                           (size_t)(g * G * w->bits / 8);
                for (int64_t o = 0; o < words; o++) {
                    uint32_t x;
                    memcpy(&x, src + 4 * o, 4); /* MXFP4's bytes pack two codes as 4-bit words do */
                    if (pw.bits == 4)
                        x = q4_lane_word(x);
                    memcpy(d + o * 64 + i * 4, &x, 4);
                }
                if (mx) {
                    d[codes + (size_t)i] = ((const uint8_t *)w->scales)[r * ng + g];
                    continue;
                }
                const size_t at = (size_t)(r * ng + g) * esz;
                memcpy(d + codes + (size_t)i * esz, (const unsigned char *)w->scales + at, esz);
                memcpy(d + codes + (size_t)(16 + i) * esz, (const unsigned char *)w->biases + at, esz);
            }
}

void exo_linear_to_panels(const exo_linear *w, void *dst, exo_linear *out, exo_pool *pool)
{
    panels_job job = {w, dst};
    if (pool)
        exo_pool_run(pool, panels_share, &job);
    else
        panels_share(&job, 0, 1);
    *out = panels_of(w);
    out->w = dst;
    out->scales = out->biases = NULL;
}
