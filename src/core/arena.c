/* Bump allocator over huge-page chunks (see arena.h). */
#include "core/arena.h"
#include "core/alloc.h"

#include <stdint.h>

typedef struct chunk {
    unsigned char *base;
    size_t cap, used;
} chunk;

struct exo_arena {
    size_t chunk_bytes;
    chunk *chunks;
    size_t n, cap;
    size_t open; /* index of the chunk small pieces go to (n: none yet) */
    size_t handed_out;
};

exo_arena *exo_arena_new(size_t chunk_bytes)
{
    exo_arena *a = exo_calloc(1, sizeof *a);
    a->chunk_bytes = chunk_bytes ? chunk_bytes : (size_t)64 << 20;
    a->open = (size_t)-1;
    return a;
}

static chunk *add_chunk(exo_arena *a, size_t cap)
{
    unsigned char *base = exo_alloc_aligned(cap);
    if (!base)
        return NULL;
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        a->chunks = exo_realloc(a->chunks, a->cap * sizeof *a->chunks);
    }
    chunk *c = &a->chunks[a->n++];
    *c = (chunk){base, cap, 0};
    return c;
}

void *exo_arena_alloc(exo_arena *a, size_t n)
{
    size_t need = (n + 63) & ~(size_t)63;
    if (need < n)
        return NULL;
    if (!need)
        need = 64;
    /* a big piece gets a chunk of its own and leaves the current one open */
    if (need > a->chunk_bytes / 4) {
        chunk *own = add_chunk(a, need);
        if (!own)
            return NULL;
        own->used = need;
        a->handed_out += need;
        return own->base;
    }
    chunk *c = a->open < a->n ? &a->chunks[a->open] : NULL;
    if (!c || c->cap - c->used < need) {
        /* at most a quarter of a chunk is left unused at its end */
        c = add_chunk(a, a->chunk_bytes);
        if (!c)
            return NULL;
        a->open = a->n - 1;
    }
    void *p = c->base + c->used;
    c->used += need;
    a->handed_out += need;
    return p;
}

size_t exo_arena_used(const exo_arena *a) { return a ? a->handed_out : 0; }

void exo_arena_free(exo_arena *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        exo_free_aligned(a->chunks[i].base);
    exo_free(a->chunks);
    exo_free(a);
}
