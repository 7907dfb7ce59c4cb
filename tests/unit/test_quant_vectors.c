/* exo's MLX affine quantizer and dequantizer against vectors made by an
 * independent PyTorch implementation (tests/fixtures/quant_vectors, made by
 * tools/make_fixtures.py): codes, packed words, scales and biases must be
 * bit-identical, dequantized values too (scale*q + bias, two roundings). */
#include "core/alloc.h"
#include "engine/dtype.h"
#include "engine/quant.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#ifndef FIXTURES
#define FIXTURES "tests/fixtures"
#endif

static void *slurp(const char *dir, const char *name, size_t want)
{
    char path[512];
    snprintf(path, sizeof path, "%s/quant_vectors/%s/%s", FIXTURES, dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    void *p = exo_malloc(want);
    size_t got = fread(p, 1, want, f);
    fclose(f);
    cr_assert_eq(got, want, "%s: %zu bytes, expected %zu", path, got, want);
    return p;
}

static float param(const void *p, bool bf16, size_t i)
{
    if (bf16)
        return exo_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

Test(quant_vectors, match_torch_bit_for_bit)
{
    char path[512];
    snprintf(path, sizeof path, "%s/quant_vectors/manifest.json", FIXTURES);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    cr_assert(m, "%s: %s", path, je.text);
    json_t *cases = json_object_get(m, "cases");
    cr_assert(json_array_size(cases) >= 6);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *dir = json_string_value(json_object_get(c, "dir"));
        int bits = (int)json_integer_value(json_object_get(c, "bits"));
        int gs = (int)json_integer_value(json_object_get(c, "group_size"));
        int rows = (int)json_integer_value(json_object_get(c, "rows"));
        int cols = (int)json_integer_value(json_object_get(c, "cols"));
        bool bf16 = !strcmp(json_string_value(json_object_get(c, "input_dtype")), "bf16");
        int words = cols * bits / 32, groups = cols / gs;
        size_t esz = bf16 ? 2 : 4;
        const char *sfx = bf16 ? "bf16" : "f32";
        char in_name[32], sc_name[32], bi_name[32];
        snprintf(in_name, sizeof in_name, "input.%s", sfx);
        snprintf(sc_name, sizeof sc_name, "scales.%s", sfx);
        snprintf(bi_name, sizeof bi_name, "biases.%s", sfx);
        void *input = slurp(dir, in_name, esz * (size_t)rows * (size_t)cols);
        uint32_t *codes = slurp(dir, "codes.u32", 4 * (size_t)rows * (size_t)words);
        uint8_t *unpacked = slurp(dir, "codes_unpacked.u8", (size_t)rows * (size_t)cols);
        void *scales = slurp(dir, sc_name, esz * (size_t)rows * (size_t)groups);
        void *biases = slurp(dir, bi_name, esz * (size_t)rows * (size_t)groups);
        float *deq = slurp(dir, "dequant.f32", 4 * (size_t)rows * (size_t)cols);
        float row[1024], s[64], b[64], sf[64], bf[64], out[1024];
        uint32_t w[1024];
        uint8_t q[1024];
        for (int r = 0; r < rows; r++) {
            for (int k = 0; k < cols; k++)
                row[k] = param(input, bf16, (size_t)r * cols + k);
            cr_assert_eq(exo_affine_quantize_row(row, cols, bits, gs, w, s, b), 0);
            cr_expect(memcmp(w, codes + (size_t)r * words, 4 * (size_t)words) == 0,
                      "%s row %d: packed codes differ", dir, r);
            exo_affine_unpack_row(codes + (size_t)r * words, cols, bits, q);
            cr_expect(memcmp(q, unpacked + (size_t)r * cols, (size_t)cols) == 0,
                      "%s row %d: unpacked codes differ", dir, r);
            for (int g = 0; g < groups; g++) {
                float ws = bf16 ? exo_bf16_to_f32(exo_f32_to_bf16(s[g])) : s[g];
                float wb = bf16 ? exo_bf16_to_f32(exo_f32_to_bf16(b[g])) : b[g];
                sf[g] = param(scales, bf16, (size_t)r * groups + g);
                bf[g] = param(biases, bf16, (size_t)r * groups + g);
                cr_expect(memcmp(&ws, &sf[g], 4) == 0, "%s row %d group %d: scale %a vs %a", dir,
                          r, g, ws, sf[g]);
                cr_expect(memcmp(&wb, &bf[g], 4) == 0, "%s row %d group %d: bias %a vs %a", dir,
                          r, g, wb, bf[g]);
            }
            exo_affine_dequantize_row(codes + (size_t)r * words, sf, bf, cols, bits, gs, out);
            cr_expect(memcmp(out, deq + (size_t)r * cols, 4 * (size_t)cols) == 0,
                      "%s row %d: dequantized values differ", dir, r);
        }
        exo_free(input);
        exo_free(codes);
        exo_free(unpacked);
        exo_free(scales);
        exo_free(biases);
        exo_free(deq);
    }
    json_decref(m);
}
