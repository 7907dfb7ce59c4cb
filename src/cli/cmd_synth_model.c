/* `exo synth-model PRESET OUT_DIR [--quant bf16|q8|q4|mxfp4] [--seed N]
 *  [--tokenizer DIR] [--verify]`: writes the random-weight model of a
 * synthetic preset (the one `exo bench --synthetic PRESET` builds in memory;
 * both use seed 1234 unless told otherwise) as a Hugging Face model
 * directory that `exo run` and the daemon load: model.safetensors (MLX
 * affine layout for q4/q8), config.json, and with --tokenizer the
 * tokenizer.json, tokenizer_config.json (chat template) and, when present,
 * chat_template.jinja / special_tokens_map.json / generation_config.json of
 * a real model, so API benchmarks can run on a real-size model without
 * downloading one. The tokenizer's ids must fit the preset's vocabulary.
 *
 * Everything is written into a hidden temporary directory next to OUT_DIR
 * which is renamed to OUT_DIR at the end, so OUT_DIR either does not exist
 * or is complete. An existing non-empty OUT_DIR is refused (an empty one is
 * replaced). --verify loads the written directory before the rename and
 * checks that a prefill gives bit-identical logits to the in-memory model.
 *
 * Exit status: 0, 1 when writing or verifying failed, 2 on bad arguments. */
#include "cli/args.h"
#include "core/alloc.h"
#include "engine/model.h"
#include "engine/synthetic.h"
#include "tokenizer/tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int exo_cmd_synth_model(int argc, char **argv);

static void usage(void)
{
    fprintf(stderr, "usage: exo synth-model PRESET OUT_DIR [--quant bf16|q8|q4|mxfp4] [--seed N]\n"
                    "         [--tokenizer DIR] [--verify]\npresets:");
    for (const char *const *p = exo_synth_presets(); *p; p++)
        fprintf(stderr, " %s", *p);
    fprintf(stderr, "\n");
}

static bool known_preset(const char *name)
{
    for (const char *const *p = exo_synth_presets(); *p; p++)
        if (!strcmp(*p, name))
            return true;
    return false;
}

/* 1: a directory with entries, 0: an empty directory, -1: absent,
 * -2: something else (a file, unreadable). */
static int dir_state(const char *path)
{
    struct stat st;
    if (stat(path, &st))
        return errno == ENOENT ? -1 : -2;
    if (!S_ISDIR(st.st_mode))
        return -2;
    DIR *d = opendir(path);
    if (!d)
        return -2;
    int state = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            state = 1;
            break;
        }
    closedir(d);
    return state;
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Copies src_dir/name to dst_dir/name (temp name + fsync + rename); a
 * missing optional source is skipped. */
static int copy_file(const char *src_dir, const char *dst_dir, const char *name, bool required,
                     exo_err *err)
{
    char src[8192], dst[8192], tmp[8300];
    snprintf(src, sizeof src, "%s/%s", src_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dst_dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *in = fopen(src, "rb");
    if (!in)
        return errno == ENOENT && !required ? 0
                                            : exo_err_set(err, EXO_EIO, "cannot read %s: %s", src,
                                                          strerror(errno));
    FILE *o = fopen(tmp, "wb");
    if (!o) {
        fclose(in);
        return exo_err_set(err, EXO_EIO, "cannot write %s: %s", tmp, strerror(errno));
    }
    bool ok = true;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, o) != n)
            ok = false;
    if (ferror(in) || fflush(o) || fsync(fileno(o)))
        ok = false;
    fclose(in);
    if (fclose(o))
        ok = false;
    if (!ok || rename(tmp, dst)) {
        unlink(tmp);
        return exo_err_set(err, EXO_EIO, "cannot copy %s to %s", src, dst);
    }
    return 0;
}

/* Prefill of a few tokens through the in-memory model and the written one:
 * the logits must be bit-identical. */
static int verify(const char *preset, exo_synth_quant q, uint64_t seed, const char *dir,
                  exo_err *err)
{
    exo_synth *syn = NULL;
    exo_model *a = NULL, *b = NULL;
    exo_seq *sa = NULL, *sb = NULL;
    float *la = NULL, *lb = NULL;
    enum { T = 6 };
    int rc;
    if ((rc = exo_synth_create(preset, q, seed, &syn, err)) ||
        (rc = exo_synth_build(syn, NULL, &a, err)) || (rc = exo_model_load(dir, NULL, &b, err)) ||
        (rc = exo_seq_create(a, T, &sa, err)) || (rc = exo_seq_create(b, T, &sb, err)))
        goto out;
    int V = exo_model_vocab(a);
    if (exo_model_vocab(b) != V) {
        rc = exo_err_set(err, EXO_EINTERNAL, "verify: vocab %d written, %d in memory",
                         exo_model_vocab(b), V);
        goto out;
    }
    int32_t tokens[T];
    for (int i = 0; i < T; i++)
        tokens[i] = (int32_t)((1 + 7919 * (uint64_t)i) % (uint64_t)V);
    la = exo_try_malloc(sizeof(float) * (size_t)V * T);
    lb = exo_try_malloc(sizeof(float) * (size_t)V * T);
    if (!la || !lb) {
        rc = exo_err_set(err, EXO_ENOMEM, "verify: cannot allocate %d x %d logits", T, V);
        goto out;
    }
    if ((rc = exo_model_forward(a, sa, tokens, T, la, true, err)) ||
        (rc = exo_model_forward(b, sb, tokens, T, lb, true, err)))
        goto out;
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)V * T; i++)
        diff += memcmp(&la[i], &lb[i], sizeof(float)) != 0;
    if (diff)
        rc = exo_err_set(err, EXO_EINTERNAL,
                         "verify: %zu of %zu logits differ between the written model and the "
                         "in-memory one", diff, (size_t)V * T);
    else
        printf("verified: %d x %d logits of the written model are identical to the in-memory "
               "model's\n", T, V);
out:
    exo_free(la);
    exo_free(lb);
    exo_seq_free(sa);
    exo_seq_free(sb);
    exo_model_free(a);
    exo_model_free(b);
    exo_synth_free(syn);
    return rc;
}

int exo_cmd_synth_model(int argc, char **argv)
{
    const char *preset = NULL, *out = NULL, *quant = "q4", *tok_dir = NULL, *v;
    uint64_t seed = 1234;
    bool do_verify = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quant")) {
            if (!(quant = exo_arg_value("synth-model", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--seed")) {
            if (!(v = exo_arg_value("synth-model", argc, argv, &i)))
                return 2;
            char *end;
            errno = 0;
            unsigned long long x = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') {
                fprintf(stderr, "exo synth-model: --seed expects an unsigned integer, got '%s'\n", v);
                return 2;
            }
            seed = x;
        } else if (!strcmp(argv[i], "--tokenizer")) {
            if (!(tok_dir = exo_arg_value("synth-model", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--verify")) {
            do_verify = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "exo synth-model: unknown flag '%s'\n", argv[i]);
            usage();
            return 2;
        } else if (!preset) {
            preset = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "exo synth-model: unexpected argument '%s'\n", argv[i]);
            usage();
            return 2;
        }
    }
    if (!preset || !out) {
        usage();
        return 2;
    }
    if (!known_preset(preset)) {
        fprintf(stderr, "exo synth-model: unknown preset '%s'\n", preset);
        usage();
        return 2;
    }
    exo_synth_quant sq;
    if (exo_synth_quant_parse(quant, &sq)) {
        fprintf(stderr, "exo synth-model: --quant must be bf16, q8 or q4, got '%s'\n", quant);
        return 2;
    }
    if (strlen(out) > 3000) {
        fprintf(stderr, "exo synth-model: OUT_DIR path too long\n");
        return 2;
    }
    int state = dir_state(out);
    if (state == 1 || state == -2) {
        fprintf(stderr, "exo synth-model: %s %s; remove it or choose another OUT_DIR\n", out,
                state == 1 ? "exists and is not empty" : "exists and is not a directory");
        return 2;
    }

    exo_err err = {0};
    exo_synth *syn = NULL;
    int rc = exo_synth_create(preset, sq, seed, &syn, &err);
    if (rc) {
        fprintf(stderr, "exo synth-model: %s\n", err.msg);
        return 2;
    }
    const exo_model_config *cfg = exo_synth_config(syn);
    if (tok_dir) {
        exo_tokenizer *tok = NULL;
        if (exo_tokenizer_load(tok_dir, &tok, &err)) {
            fprintf(stderr, "exo synth-model: --tokenizer %s: %s\n", tok_dir, err.msg);
            exo_synth_free(syn);
            return 2;
        }
        size_t n = exo_tokenizer_vocab_size(tok);
        exo_tokenizer_free(tok);
        if ((int64_t)n > cfg->vocab_size) {
            fprintf(stderr, "exo synth-model: the tokenizer in %s has %zu ids, more than %s's "
                            "vocabulary of %lld\n", tok_dir, n, preset, (long long)cfg->vocab_size);
            exo_synth_free(syn);
            return 2;
        }
    }

    /* the temporary directory: hidden, next to OUT_DIR (same filesystem) */
    char parent_buf[4096], base_buf[4096], parent[4096], tmp[4200];
    snprintf(parent_buf, sizeof parent_buf, "%s", out);
    snprintf(base_buf, sizeof base_buf, "%s", out);
    snprintf(parent, sizeof parent, "%s", dirname(parent_buf));
    const char *base = basename(base_buf);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-XXXXXX", parent, base);
    if (make_dirs(parent)) {
        fprintf(stderr, "exo synth-model: cannot create %s: %s\n", parent, strerror(errno));
        exo_synth_free(syn);
        return 1;
    }
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "exo synth-model: cannot create a directory in %s: %s\n", parent,
                strerror(errno));
        exo_synth_free(syn);
        return 1;
    }
    chmod(tmp, 0755);
    size_t bytes = 0;
    if ((rc = exo_synth_write(syn, tmp, &bytes, &err)))
        goto fail;
    if (tok_dir) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                            "chat_template.jinja", "special_tokens_map.json",
                                            "generation_config.json"};
        for (size_t i = 0; i < sizeof files / sizeof *files; i++)
            if ((rc = copy_file(tok_dir, tmp, files[i], i == 0, &err)))
                goto fail;
    }
    if (do_verify && (rc = verify(preset, sq, seed, tmp, &err)))
        goto fail;
    /* rename replaces an empty OUT_DIR; a non-empty one appearing meanwhile fails */
    if (rename(tmp, out)) {
        rc = exo_err_set(&err, EXO_EIO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
        goto fail;
    }
    fsync_dir(parent);
    printf("wrote %s: %s %s seed %llu, %lld layers, vocab %lld, %.1f MB of weights%s\n", out,
           preset, quant, (unsigned long long)seed, (long long)cfg->num_hidden_layers,
           (long long)cfg->vocab_size, (double)bytes / 1e6, tok_dir ? ", tokenizer copied" : "");
    exo_synth_free(syn);
    return 0;
fail:
    fprintf(stderr, "exo synth-model: %s\n", err.msg[0] ? err.msg : exo_strerror(rc));
    remove_tree(tmp);
    exo_synth_free(syn);
    return 1;
}
