/* `exo logits MODEL_DIR --tokens 1,2,3 --out FILE [--threads N]`: one
 * prefill, every position's logits written as float32 little-endian
 * [T, vocab]. This is the engine's parity probe against transformers. */
#include "cli/args.h"
#include "core/alloc.h"
#include "engine/model.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int exo_cmd_logits(int argc, char **argv);

int exo_cmd_logits(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *toks = NULL, *v;
    long threads = 0, chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens")) {
            if (!(toks = exo_arg_value("logits", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--out")) {
            if (!(out = exo_arg_value("logits", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(v = exo_arg_value("logits", argc, argv, &i)) ||
                exo_arg_int("logits", "--threads", v, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(argv[i], "--chunk")) {
            if (!(v = exo_arg_value("logits", argc, argv, &i)) ||
                exo_arg_int("logits", "--chunk", v, 1, 1 << 20, &chunk))
                return 2;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "exo logits: unexpected argument '%s'\n", argv[i]);
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!dir || !toks || !out) {
        fprintf(stderr, "usage: exo logits MODEL_DIR --tokens 1,2,3 --out FILE [--threads N]\n");
        return 2;
    }
    int32_t *ids;
    int n;
    if (exo_arg_ids("logits", toks, &ids, &n))
        return 2;
    exo_err err = {0};
    exo_model *m = NULL;
    exo_seq *s = NULL;
    float *logits = NULL;
    int status = 1;
    exo_model_opts opts = {.n_threads = (int)threads, .max_chunk = (int)chunk};
    if (exo_model_load(dir, &opts, &m, &err) || exo_seq_create(m, n, &s, &err))
        goto fail;
    size_t V = (size_t)exo_model_vocab(m);
    logits = exo_try_malloc(sizeof(float) * V * (size_t)n);
    if (!logits) {
        exo_err_set(&err, EXO_ENOMEM, "cannot allocate %d x %zu logits", n, V);
        goto fail;
    }
    if (exo_model_forward(m, s, ids, n, logits, true, &err))
        goto fail;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(logits, sizeof(float), V * (size_t)n, f) != V * (size_t)n || fflush(f) ||
        fsync(fileno(f))) {
        if (f)
            fclose(f);
        unlink(tmp);
        exo_err_set(&err, EXO_EIO, "cannot write %s", out);
        goto fail;
    }
    fclose(f);
    if (rename(tmp, out)) {
        unlink(tmp);
        exo_err_set(&err, EXO_EIO, "cannot rename %s to %s", tmp, out);
        goto fail;
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "exo logits: %s\n", err.msg[0] ? err.msg : exo_strerror(err.code));
done:
    exo_free(logits);
    exo_seq_free(s);
    exo_model_free(m);
    exo_free(ids);
    return status;
}
