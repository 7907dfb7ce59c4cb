/* All allocation goes through these wrappers.
 *
 * Policy: allocation failure of ordinary (small, bounded) objects is not
 * recoverable in any useful way, so exo_malloc/exo_calloc/exo_realloc abort
 * with the requested size. Large, input-driven allocations (weights, KV
 * cache, request bodies) use exo_try_* and report EXO_ENOMEM to the caller
 * instead. Aligned allocations are for SIMD buffers. */
#ifndef EXO_CORE_ALLOC_H
#define EXO_CORE_ALLOC_H

#include <stddef.h>

void *exo_malloc(size_t n);
void *exo_calloc(size_t count, size_t size);
void *exo_realloc(void *p, size_t n);
char *exo_strdup(const char *s);
/* Copies exactly n bytes of s (which need not be NUL-terminated within
 * them) and adds a NUL: unlike strndup it does not stop at a NUL. */
char *exo_strndup(const char *s, size_t n);
void  exo_free(void *p);

/* Return NULL on failure instead of aborting. */
void *exo_try_malloc(size_t n);
void *exo_try_calloc(size_t count, size_t size);

/* 64-byte aligned, zeroed; free with exo_free_aligned. NULL on failure.
 * Buffers of 4 MiB and more are 2 MiB aligned and asked to be backed by
 * transparent huge pages (streamed data: weights, KV cache). */
void *exo_alloc_aligned(size_t n);
void  exo_free_aligned(void *p);

/* Overflow-checked size arithmetic: returns 0 and stores the result, or
 * returns EXO_ERANGE. */
int exo_size_mul(size_t a, size_t b, size_t *out);
int exo_size_add(size_t a, size_t b, size_t *out);

#endif
