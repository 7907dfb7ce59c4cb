/* Flag value parsing for the command handlers (see args.h). */
#include "cli/args.h"
#include "core/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int exo_arg_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "exo %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo,
                hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int exo_arg_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                  double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "exo %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int exo_arg_ids(const char *cmd, const char *s, int32_t **ids, int *n)
{
    size_t cap = 16, len = 0;
    int32_t *v = exo_malloc(cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "exo %s: bad token id list '%s' (expected e.g. 1,2,3)\n", cmd, s);
            exo_free(v);
            return -1;
        }
        if (len == cap)
            v = exo_realloc(v, (cap *= 2) * sizeof *v);
        v[len++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!len) {
        fprintf(stderr, "exo %s: empty token id list\n", cmd);
        exo_free(v);
        return -1;
    }
    *ids = v;
    *n = (int)len;
    return 0;
}

const char *exo_arg_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "exo %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}
