/* MLX affine quantization: validation, MLX's scale/bias rules on known
 * values, bit packing against words computed from MLX's pack-of-bytes
 * layout (mlx/backend/cpu/quantized.cpp), and round-trip error bounds for
 * every bits x group size. */
#include <criterion/criterion.h>

#include "core/alloc.h"
#include "engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform01(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float gauss(void)
{
    double s = 0;
    for (int i = 0; i < 12; i++)
        s += uniform01();
    return (float)(s - 6.0);
}

static const int all_bits[] = {2, 3, 4, 5, 6, 8};
static const int all_groups[] = {32, 64, 128};

Test(quant, check_validates_layouts)
{
    exo_err err = {0};
    cr_expect_eq(exo_affine_check(4, 64, 2048, &err), 0);
    cr_expect_eq(exo_affine_check(3, 32, 96, &err), 0);
    cr_expect_eq(exo_affine_check(7, 64, 2048, &err), EXO_EINVAL);
    cr_expect(strstr(err.msg, "bits") != NULL);
    cr_expect_eq(exo_affine_check(1, 64, 2048, &err), EXO_EINVAL);
    cr_expect_eq(exo_affine_check(4, 16, 2048, &err), EXO_EINVAL);
    cr_expect_eq(exo_affine_check(4, 64, 96, &err), EXO_EINVAL);
    cr_expect_eq(exo_affine_check(4, 64, 0, &err), EXO_EINVAL);
    uint32_t w[4];
    float s[1], b[1];
    float x[32] = {0};
    cr_expect_eq(exo_affine_quantize_row(x, 32, 7, 32, w, s, b), EXO_EINVAL);
}

/* codes[i] = (5i + 3) mod 2^bits, 32 codes; expected words computed from
 * MLX's layout: 2/4/8 bits pack 32/bits codes per uint32, 3 and 5 bits pack
 * 8 codes into 3 / 5 bytes, 6 bits 4 codes into 3 bytes, code k at bit
 * k*bits of the little-endian pack. */
Test(quant, pack_matches_mlx_layout)
{
    static const uint32_t want2[] = {0x93939393u, 0x93939393u};
    static const uint32_t want3[] = {0x43c67543u, 0x7543c675u, 0xc67543c6u};
    static const uint32_t want4[] = {0x61c72d83u, 0xe94fa50bu, 0x61c72d83u, 0xe94fa50bu};
    static const uint32_t want5[] = {0x79793503u, 0xfd560b30u, 0x77137249u, 0x1bb45871u,
                                     0xf668f514u};
    static const uint32_t want6[] = {0x1748d203u, 0x5c2b9a17u, 0x38913febu,
                                     0x2789d613u, 0x503bdb1bu, 0x79950f28u};
    static const uint32_t want8[] = {0x120d0803u, 0x26211c17u, 0x3a35302bu, 0x4e49443fu,
                                     0x625d5853u, 0x76716c67u, 0x8a85807bu, 0x9e99948fu};
    const uint32_t *want[9] = {0};
    want[2] = want2;
    want[3] = want3;
    want[4] = want4;
    want[5] = want5;
    want[6] = want6;
    want[8] = want8;
    for (size_t k = 0; k < sizeof all_bits / sizeof all_bits[0]; k++) {
        int bits = all_bits[k];
        uint8_t codes[32], back[32];
        uint32_t words[8];
        for (int i = 0; i < 32; i++)
            codes[i] = (uint8_t)((5 * i + 3) % (1 << bits));
        exo_affine_pack(codes, 32, bits, words);
        for (int i = 0; i < bits; i++)
            cr_expect_eq(words[i], want[bits][i], "bits %d word %d: %08x want %08x", bits, i,
                         words[i], want[bits][i]);
        exo_affine_unpack_row(want[bits], 32, bits, back);
        cr_expect_arr_eq(back, codes, 32, "unpack bits %d", bits);
    }
}

/* 0..31 in one 4-bit group: max has the larger magnitude, so the scale is
 * negative and the max is the bias (code 0). */
Test(quant, scale_bias_rules_known_values)
{
    float x[32];
    uint32_t w[8];
    float s, b;
    for (int i = 0; i < 32; i++)
        x[i] = (float)i;
    cr_assert_eq(exo_affine_quantize_row(x, 32, 4, 32, w, &s, &b), 0);
    cr_expect_eq(s, 31.0f / -15.0f);
    cr_expect_eq(b, 31.0f);
    uint8_t q[32];
    exo_affine_unpack_row(w, 32, 4, q);
    cr_expect_eq(q[31], 0);
    cr_expect_eq(q[0], 15);
    for (int i = 0; i < 32; i++)
        cr_expect_eq(q[i], (uint8_t)rintf(((float)i - 31.0f) / (31.0f / -15.0f)));

    /* min has the larger magnitude: positive scale, bias = min, min -> 0 */
    for (int i = 0; i < 32; i++)
        x[i] = -1.0f + 1.5f * (float)i / 31.0f;
    cr_assert_eq(exo_affine_quantize_row(x, 32, 4, 32, w, &s, &b), 0);
    float scale = 1.5f / 15.0f;
    float q0 = rintf(-1.0f / scale);
    cr_expect_eq(q0, -10.0f);
    cr_expect_eq(s, -1.0f / q0);
    cr_expect_eq(b, -1.0f);
    exo_affine_unpack_row(w, 32, 4, q);
    cr_expect_eq(q[0], 0);
    cr_expect_eq(q[31], 15);

    /* all zeros: q0 = 0 -> bias 0, scale -eps, codes 0, exact zeros back */
    memset(x, 0, sizeof x);
    cr_assert_eq(exo_affine_quantize_row(x, 32, 4, 32, w, &s, &b), 0);
    cr_expect_eq(b, 0.0f);
    cr_expect_eq(s, -1e-7f);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(w[i], 0u);

    /* rint: ties go to even. 8-bit group [-0.5 .. 127]: scale (127.5/255)=0.5,
     * edge = 127 -> q0 = rint(127 / -0.5) = -254 exactly; x = 1.25 gives
     * (1.25-127)/-0.5 = 251.5 -> 252 (even) */
    for (int i = 0; i < 32; i++)
        x[i] = 0.0f;
    x[0] = -0.5f;
    x[1] = 127.0f;
    x[2] = 1.25f;
    x[3] = 2.25f; /* 249.5 -> 250 */
    cr_assert_eq(exo_affine_quantize_row(x, 32, 8, 32, w, &s, &b), 0);
    cr_expect_eq(s, 127.0f / -254.0f);
    cr_expect_eq(b, 127.0f);
    exo_affine_unpack_row(w, 32, 8, q);
    cr_expect_eq(q[1], 0);
    cr_expect_eq(q[2], 252);
    cr_expect_eq(q[3], 250);
    cr_expect_eq(q[0], 255);
}

/* Round trip: |w - deq| <= |s|/2 (+ f32 slack) for every element that was
 * not clamped, <= |s| for clamped ones, and the NMSE is that of uniform
 * quantization noise. */
Test(quant, round_trip_error_bounds)
{
    const int64_t cols = 512;
    float *x = exo_malloc(cols * sizeof(float)), *y = exo_malloc(cols * sizeof(float));
    uint32_t *w = exo_malloc(cols * sizeof(uint32_t));
    float s[16], b[16];
    for (size_t kb = 0; kb < 6; kb++) {
        for (size_t kg = 0; kg < 3; kg++) {
            int bits = all_bits[kb], G = all_groups[kg];
            for (int trial = 0; trial < 3; trial++) {
                float shift = trial == 2 ? 3.0f : 0.0f; /* trial 2: all positive */
                for (int64_t i = 0; i < cols; i++)
                    x[i] = gauss() * (trial == 1 ? 0.02f : 1.0f) + shift;
                cr_assert_eq(exo_affine_quantize_row(x, cols, bits, G, w, s, b), 0);
                exo_affine_dequantize_row(w, s, b, cols, bits, G, y);
                double err2 = 0, sig2 = 0;
                uint8_t *q = exo_malloc((size_t)cols);
                exo_affine_unpack_row(w, cols, bits, q);
                for (int64_t i = 0; i < cols; i++) {
                    float step = fabsf(s[i / G]);
                    float err = fabsf(x[i] - y[i]), slack = 1e-6f * fabsf(x[i]);
                    /* rounding: half a step; an element clamped to code 0 or
                     * 2^bits-1 (the far edge, when rint(edge/scale) rounded
                     * away from zero) may be off by up to one step */
                    int clamped = q[i] == 0 || q[i] == (1 << bits) - 1;
                    float bound = (clamped ? 1.0f : 0.5f) * step * 1.0001f + slack;
                    cr_expect(err <= bound, "bits %d G %d i %lld: %g vs %g (s %g, q %d)", bits, G,
                              (long long)i, x[i], y[i], s[i / G], q[i]);
                    err2 += (double)(x[i] - y[i]) * (x[i] - y[i]);
                    sig2 += (double)(x[i] - shift) * (x[i] - shift);
                }
                exo_free(q);
                /* uniform quantization noise: step^2/12, step ~ range/(2^bits-1) */
                double nmse = err2 / sig2;
                double levels = (double)((1 << bits) - 1);
                cr_expect(nmse < 4.0 * 50.0 / (12.0 * levels * levels), "bits %d G %d nmse %g", bits,
                          G, nmse);
                /* the edge of larger magnitude is exact */
                for (int64_t g = 0; g < cols / G; g++) {
                    float mn = x[g * G], mx = x[g * G];
                    for (int j = 0; j < G; j++) {
                        mn = fminf(mn, x[g * G + j]);
                        mx = fmaxf(mx, x[g * G + j]);
                    }
                    float edge = fabsf(mn) > fabsf(mx) ? mn : mx;
                    cr_expect_eq(b[g], edge);
                }
            }
        }
    }
    exo_free(x);
    exo_free(y);
    exo_free(w);
}

Test(quant, linear_row_and_bytes)
{
    const int64_t rows = 3, cols = 128;
    float x[3 * 128], back[128];
    uint32_t codes[3 * 64];
    float sf[3 * 4], bf[3 * 4];
    uint16_t s16[12], b16[12];
    for (int i = 0; i < rows * cols; i++)
        x[i] = gauss();
    for (int r = 0; r < rows; r++)
        exo_affine_quantize_row(x + r * cols, cols, 3, 32, codes + r * 12, sf + r * 4, bf + r * 4);
    for (int i = 0; i < 12; i++) {
        s16[i] = exo_f32_to_bf16(sf[i]);
        b16[i] = exo_f32_to_bf16(bf[i]);
    }
    exo_linear l = {.format = EXO_WFORMAT_AFFINE, .dtype = EXO_DTYPE_BF16, .rows = rows,
                    .cols = cols, .w = codes, .scales = s16, .biases = b16, .bits = 3,
                    .group_size = 32};
    cr_expect_eq(exo_linear_bytes(&l), (size_t)(3 * 12 * 4 + 2 * 3 * 4 * 2));
    for (int r = 0; r < rows; r++) {
        exo_linear_row_f32(&l, r, back);
        uint8_t q[128];
        exo_affine_unpack_row(codes + r * 12, cols, 3, q);
        for (int c = 0; c < cols; c++) {
            float want = exo_bf16_to_f32(s16[r * 4 + c / 32]) * (float)q[c] +
                         exo_bf16_to_f32(b16[r * 4 + c / 32]);
            cr_expect_eq(back[c], want);
        }
    }
    exo_linear d = {.format = EXO_WFORMAT_DENSE, .dtype = EXO_DTYPE_F32, .rows = 3, .cols = 128,
                    .w = x};
    cr_expect_eq(exo_linear_bytes(&d), (size_t)(3 * 128 * 4));
    exo_linear_row_f32(&d, 2, back);
    cr_expect_arr_eq(back, x + 256, 128 * sizeof(float));
}
