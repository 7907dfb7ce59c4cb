/* `exo tokenize` and `exo detokenize`: the tokenizer from the command line,
 * for debugging prompts and for scripted checks against other tokenizers.
 *
 *   exo tokenize DIR (--text T | --file F) [--no-special] [--json]
 *   exo detokenize DIR --ids 1,2,3 [--skip-special]
 *
 * DIR is a model directory or any directory with a tokenizer.json. */
#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int exo_cmd_tokenize(int argc, char **argv);
int exo_cmd_detokenize(int argc, char **argv);

static char *read_all(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = exo_malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            buf = exo_realloc(buf, cap *= 2);
    }
    bool err = ferror(f);
    if (f != stdin)
        fclose(f);
    if (err) {
        exo_free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int exo_cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL, *file = NULL;
    bool special = true, json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "--no-special"))
            special = false;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "exo tokenize: unexpected argument '%s'\n", argv[i]);
            dir = NULL;
            break;
        }
    }
    if (!dir || !!text == !!file) {
        fprintf(stderr, "usage: exo tokenize DIR (--text T | --file F|-) [--no-special] [--json]\n");
        return 2;
    }
    size_t len = text ? strlen(text) : 0;
    char *owned = NULL;
    if (file && !(owned = read_all(file, &len))) {
        fprintf(stderr, "exo tokenize: %s: %s\n", file, strerror(errno));
        return 1;
    }
    exo_tokenizer *tok;
    exo_err err;
    if (exo_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "exo tokenize: %s\n", err.msg);
        exo_free(owned);
        return 1;
    }
    int32_t *ids;
    size_t n;
    int rc = exo_tokenizer_encode(tok, owned ? owned : text, len, special, &ids, &n, &err);
    if (rc) {
        fprintf(stderr, "exo tokenize: %s\n", err.msg);
    } else {
        fputs(json ? "[" : "", stdout);
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? (json ? "," : " ") : "", ids[i]);
        fputs(json ? "]\n" : "\n", stdout);
        exo_free(ids);
    }
    exo_tokenizer_free(tok);
    exo_free(owned);
    return rc ? 1 : 0;
}

/* "1,2,3" (commas and/or spaces) -> ids; false on a malformed list. */
static bool parse_ids(const char *s, int32_t **out, size_t *n)
{
    size_t cap = 16;
    int32_t *ids = exo_malloc(cap * sizeof *ids);
    *n = 0;
    while (*s) {
        if (*s == ',' || *s == ' ') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            exo_free(ids);
            return false;
        }
        if (*n == cap)
            ids = exo_realloc(ids, (cap *= 2) * sizeof *ids);
        ids[(*n)++] = (int32_t)v;
        s = end;
    }
    *out = ids;
    return true;
}

int exo_cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL, *list = NULL;
    bool skip = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            list = argv[++i];
        else if (!strcmp(argv[i], "--skip-special"))
            skip = true;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "exo detokenize: unexpected argument '%s'\n", argv[i]);
            dir = NULL;
            break;
        }
    }
    int32_t *ids;
    size_t n;
    if (!dir || !list) {
        fprintf(stderr, "usage: exo detokenize DIR --ids 1,2,3 [--skip-special]\n");
        return 2;
    }
    if (!parse_ids(list, &ids, &n)) {
        fprintf(stderr, "exo detokenize: --ids: expected a comma-separated list of ids\n");
        return 2;
    }
    exo_tokenizer *tok;
    exo_err err;
    if (exo_tokenizer_load(dir, &tok, &err)) {
        fprintf(stderr, "exo detokenize: %s\n", err.msg);
        exo_free(ids);
        return 1;
    }
    size_t len;
    char *text = exo_tokenizer_decode(tok, ids, n, skip, &len);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    exo_free(text);
    exo_free(ids);
    exo_tokenizer_free(tok);
    return 0;
}
