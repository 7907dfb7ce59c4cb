/* A bump allocator for data that lives as long as its owner and is streamed
 * by the CPU: model weights. Memory comes in big chunks from
 * exo_alloc_aligned, so it is backed by transparent huge pages even when
 * the pieces are small (a 512 KiB k_proj between two 2 MiB weights), and
 * pieces are packed back to back, so consecutive weights are consecutive
 * memory. Everything is released at once by exo_arena_free. */
#ifndef EXO_CORE_ARENA_H
#define EXO_CORE_ARENA_H

#include <stddef.h>

typedef struct exo_arena exo_arena;

/* chunk_bytes: size of each chunk (0: 64 MiB); a piece bigger than a
 * quarter of that gets a chunk of its own. */
exo_arena *exo_arena_new(size_t chunk_bytes);
/* Zeroed, 64-byte aligned; NULL when memory runs out (the arena stays
 * usable). */
void *exo_arena_alloc(exo_arena *a, size_t n);
/* Bytes handed out so far. */
size_t exo_arena_used(const exo_arena *a);
void exo_arena_free(exo_arena *a);

#endif
