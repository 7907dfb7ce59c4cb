/* Allocation wrappers: one OOM policy for the whole program (see alloc.h). */
#include "core/alloc.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "exo: out of memory allocating %zu bytes\n", n);
    abort();
}

void *exo_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *exo_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        oom(count * size);
    return p;
}

void *exo_realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *exo_strdup(const char *s)
{
    return exo_strndup(s, strlen(s));
}

char *exo_strndup(const char *s, size_t n)
{
    char *d = exo_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

void exo_free(void *p) { free(p); }

void *exo_try_malloc(size_t n) { return malloc(n ? n : 1); }

void *exo_try_calloc(size_t count, size_t size)
{
    return calloc(count ? count : 1, size ? size : 1);
}

void *exo_alloc_aligned(size_t n)
{
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n || posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

void exo_free_aligned(void *p) { free(p); }

int exo_size_mul(size_t a, size_t b, size_t *out)
{
    if (__builtin_mul_overflow(a, b, out))
        return EXO_ERANGE;
    return 0;
}

int exo_size_add(size_t a, size_t b, size_t *out)
{
    if (__builtin_add_overflow(a, b, out))
        return EXO_ERANGE;
    return 0;
}
