/* Allocation wrappers: one OOM policy for the whole program (see alloc.h). */
#include "core/alloc.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Buffers at least this big are streamed (weights, KV cache, bandwidth
 * probes): they get 2 MiB alignment and transparent huge pages. On this
 * project's VMs a 4 KiB-paged stream pays a nested page walk per page and
 * the hardware prefetchers stop at every page boundary: 1 GiB read at
 * 13-24 GB/s with 4 KiB pages against a steady ~25 GB/s with huge pages,
 * and the q4 GEMV went from ~21 to ~24 GB/s (docs/PERFORMANCE.md). */
#define HUGE_MIN ((size_t)2 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

void *exo_alloc_aligned(size_t n)
{
    void *p = NULL;
    size_t rounded = (n + 63) & ~(size_t)63;
    size_t align = rounded >= HUGE_MIN ? HUGE_PAGE : 64;
    if (rounded < n || posix_memalign(&p, align, rounded ? rounded : 64) != 0)
        return NULL;
    /* before the first touch, so the faults below take huge pages; a
     * kernel without THP refuses and the buffer just keeps 4 KiB pages */
    if (align == HUGE_PAGE)
        (void)madvise(p, rounded & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
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
