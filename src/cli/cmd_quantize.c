/* `exo quantize MODEL_DIR OUT_DIR --bits B --group-size G`: writes an MLX
 * affine-quantized copy of a float checkpoint, in the layout mlx-lm writes
 * and exo's catalogue models use: every linear/embedding weight whose input
 * width divides G becomes <module>.weight (uint32 codes), .scales and
 * .biases (in the source's float type); everything else is copied as is;
 * config.json gains "quantization" (and the "quantization_config" alias).
 * Tokenizer and generation files are copied along. Every output file is
 * written to a temporary name and renamed, so an interrupted run never
 * leaves a file that looks complete. */
#include "cli/args.h"
#include "core/alloc.h"
#include "engine/quant.h"
#include "engine/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int exo_cmd_quantize(int argc, char **argv);

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* 2-D float ".weight" tensors are linear or embedding weights in every
 * architecture exo supports; norms are 1-D. */
static bool quantizable(const exo_st_tensor *t, int group_size)
{
    return ends_with(t->name, ".weight") && t->ndim == 2 &&
           (t->dtype == EXO_DTYPE_F32 || t->dtype == EXO_DTYPE_BF16 || t->dtype == EXO_DTYPE_F16) &&
           t->shape[1] % group_size == 0;
}

static int quantize_tensor(exo_st_writer *w, const exo_st_tensor *t, int bits, int gs, exo_err *err)
{
    int64_t rows = t->shape[0], cols = t->shape[1], groups = cols / gs, words = cols * bits / 32;
    size_t esz = exo_dtype_size(t->dtype);
    uint32_t *codes = exo_try_malloc(sizeof(uint32_t) * (size_t)(rows * words));
    void *scales = exo_try_malloc(esz * (size_t)(rows * groups));
    void *biases = exo_try_malloc(esz * (size_t)(rows * groups));
    float *row = exo_try_malloc(sizeof(float) * (size_t)cols);
    float *s = exo_try_malloc(sizeof(float) * (size_t)groups), *b = exo_try_malloc(sizeof(float) * (size_t)groups);
    int rc = 0;
    if (!codes || !scales || !biases || !row || !s || !b) {
        rc = exo_err_set(err, EXO_ENOMEM, "quantizing %s: out of memory", t->name);
        goto out;
    }
    for (int64_t r = 0; r < rows; r++) {
        /* tensors may be unaligned in the file: convert through a copy */
        const unsigned char *src = (const unsigned char *)t->data + (size_t)r * (size_t)cols * esz;
        if (t->dtype == EXO_DTYPE_F32) {
            memcpy(row, src, sizeof(float) * (size_t)cols);
        } else {
            for (int64_t c = 0; c < cols; c++) {
                uint16_t h;
                memcpy(&h, src + c * 2, 2);
                row[c] = t->dtype == EXO_DTYPE_BF16 ? exo_bf16_to_f32(h) : exo_f16_to_f32(h);
            }
        }
        exo_affine_quantize_row(row, cols, bits, gs, codes + r * words, s, b);
        for (int64_t g = 0; g < groups; g++) {
            size_t i = (size_t)(r * groups + g);
            if (t->dtype == EXO_DTYPE_F32) {
                ((float *)scales)[i] = s[g];
                ((float *)biases)[i] = b[g];
            } else if (t->dtype == EXO_DTYPE_BF16) {
                ((uint16_t *)scales)[i] = exo_f32_to_bf16(s[g]);
                ((uint16_t *)biases)[i] = exo_f32_to_bf16(b[g]);
            } else {
                ((uint16_t *)scales)[i] = exo_f32_to_f16(s[g]);
                ((uint16_t *)biases)[i] = exo_f32_to_f16(b[g]);
            }
        }
    }
    char base[1024], name[1100];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    int64_t ws[2] = {rows, words}, ss[2] = {rows, groups};
    snprintf(name, sizeof name, "%s.weight", base);
    rc = exo_st_writer_add_owned(w, name, EXO_DTYPE_U32, 2, ws, codes, sizeof(uint32_t) * (size_t)(rows * words), err);
    codes = NULL;
    if (rc)
        goto out;
    snprintf(name, sizeof name, "%s.scales", base);
    rc = exo_st_writer_add_owned(w, name, t->dtype, 2, ss, scales, esz * (size_t)(rows * groups), err);
    scales = NULL;
    if (rc)
        goto out;
    snprintf(name, sizeof name, "%s.biases", base);
    rc = exo_st_writer_add_owned(w, name, t->dtype, 2, ss, biases, esz * (size_t)(rows * groups), err);
    biases = NULL;
out:
    exo_free(codes);
    exo_free(scales);
    exo_free(biases);
    exo_free(row);
    exo_free(s);
    exo_free(b);
    return rc;
}

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, exo_err *err)
{
    char src[4096], dst[4096], tmp[4200];
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *in = fopen(src, "rb");
    if (!in)
        return errno == ENOENT ? 0 : exo_err_set(err, EXO_EIO, "cannot read %s", src);
    FILE *o = fopen(tmp, "wb");
    int rc = 0;
    if (!o) {
        fclose(in);
        return exo_err_set(err, EXO_EIO, "cannot write %s", tmp);
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, o) != n)
            rc = EXO_EIO;
    if (ferror(in) || fflush(o) || fsync(fileno(o)))
        rc = EXO_EIO;
    fclose(in);
    fclose(o);
    if (rc || rename(tmp, dst)) {
        unlink(tmp);
        return exo_err_set(err, EXO_EIO, "cannot copy %s to %s", src, dst);
    }
    return 0;
}

static int write_config(const char *src_dir, const char *dst_dir, int bits, int gs, exo_err *err)
{
    char src[4096], dst[4096], tmp[4200];
    snprintf(src, sizeof src, "%s/config.json", src_dir);
    snprintf(dst, sizeof dst, "%s/config.json", dst_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je);
    if (!cfg || !json_is_object(cfg)) {
        json_decref(cfg);
        return exo_err_set(err, EXO_EFORMAT, "%s: %s", src, je.text);
    }
    json_t *q = json_pack("{s:i,s:i,s:s}", "group_size", gs, "bits", bits, "mode", "affine");
    json_object_set(cfg, "quantization", q);
    json_object_set_new(cfg, "quantization_config", q);
    int rc = json_dump_file(cfg, tmp, JSON_INDENT(4));
    json_decref(cfg);
    if (rc || rename(tmp, dst)) {
        unlink(tmp);
        return exo_err_set(err, EXO_EIO, "cannot write %s", dst);
    }
    return 0;
}

int exo_cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *v;
    long bits = 4, gs = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bits")) {
            if (!(v = exo_arg_value("quantize", argc, argv, &i)) ||
                exo_arg_int("quantize", "--bits", v, 2, 8, &bits))
                return 2;
        } else if (!strcmp(argv[i], "--group-size")) {
            if (!(v = exo_arg_value("quantize", argc, argv, &i)) ||
                exo_arg_int("quantize", "--group-size", v, 32, 128, &gs))
                return 2;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "exo quantize: unknown flag '%s'\n", argv[i]);
            return 2;
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "exo quantize: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "usage: exo quantize MODEL_DIR OUT_DIR --bits B --group-size G\n");
        return 2;
    }
    exo_err err = {0};
    int rc = exo_affine_check((int)bits, (int)gs, gs, &err);
    exo_st *st = NULL;
    exo_st_writer *w = NULL;
    if (rc)
        goto fail;
    if ((rc = exo_st_open(in, &st, &err)))
        goto fail;
    for (size_t i = 0; i < exo_st_count(st); i++) {
        const exo_st_tensor *t = exo_st_at(st, i);
        if (ends_with(t->name, ".scales") || t->dtype == EXO_DTYPE_U32) {
            rc = exo_err_set(&err, EXO_EINVAL, "%s is already quantized (%s)", in, t->name);
            goto fail;
        }
    }
    if (mkdir(out, 0755) && errno != EEXIST) {
        rc = exo_err_set(&err, EXO_EIO, "cannot create %s: %s", out, strerror(errno));
        goto fail;
    }
    w = exo_st_writer_new();
    exo_st_writer_set_metadata(w, "format", "mlx");
    for (size_t i = 0; i < exo_st_count(st); i++) {
        const exo_st_tensor *t = exo_st_at(st, i);
        if (quantizable(t, (int)gs))
            rc = quantize_tensor(w, t, (int)bits, (int)gs, &err);
        else
            rc = exo_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, &err);
        if (rc)
            goto fail;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if ((rc = exo_st_writer_write(w, path, &err)))
        goto fail;
    static const char *const extra[] = {"tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "chat_template.jinja",
                                        "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof extra / sizeof *extra; i++)
        if ((rc = copy_file(in, out, extra[i], &err)))
            goto fail;
    /* config.json last: a directory without it is not a loadable model */
    if ((rc = write_config(in, out, (int)bits, (int)gs, &err)))
        goto fail;
    exo_st_writer_free(w);
    exo_st_close(st);
    return 0;
fail:
    fprintf(stderr, "exo quantize: %s\n", err.msg[0] ? err.msg : exo_strerror(rc));
    exo_st_writer_free(w);
    exo_st_close(st);
    return 1;
}
