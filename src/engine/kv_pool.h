/* Pages of KV cache shared by a model's sequences (a paged KV cache).
 *
 * A page is EXO_KV_PAGE positions of every paged layer's K and V: one piece
 * on each backend that holds such layers (a CPU+GPU split has two), of
 * page_bytes[b] bytes there (each backend's caches in its own element
 * type, backend.h exo_attn_shape's cache). Pages are named by an id; a sequence's page
 * table lists the ids of its runs of positions (model.c), and a page a
 * prompt prefix filled can sit in several tables at once: it is counted
 * (refs) and goes back to the free list when the last table drops it.
 * Memory comes from the backends in segments of several pages and stays
 * with the pool until it is freed, so taking and dropping pages allocates
 * nothing once the pool has grown to what the sequences use. Not thread
 * safe: a model serves one call at a time. */
#ifndef EXO_ENGINE_KV_POOL_H
#define EXO_ENGINE_KV_POOL_H

#include "engine/backend.h"

#include <stddef.h>
#include <stdint.h>

/* Positions of a page: a power of two and a multiple of EXO_KV_BLOCK, and
 * a divisor of the runner's 128-token prompt chunks, so a prefix reused in
 * whole chunks is whole pages. */
#define EXO_KV_PAGE 64

typedef struct exo_kv_pool exo_kv_pool;

/* A pool of pages of page_bytes[b] bytes on backend be[b], b < n_be (at
 * most 2). */
exo_kv_pool *exo_kv_pool_new(int n_be, exo_backend *const *be, const size_t *page_bytes);
void exo_kv_pool_free(exo_kv_pool *p);

/* A free page (refs 1) into *id, its memory as the last holder left it;
 * EXO_ENOMEM where a backend has no memory for another segment. */
int  exo_kv_pool_take(exo_kv_pool *p, int32_t *id);
void exo_kv_pool_hold(exo_kv_pool *p, int32_t id);
void exo_kv_pool_drop(exo_kv_pool *p, int32_t id);
int  exo_kv_pool_refs(const exo_kv_pool *p, int32_t id);
/* Page id's memory on backend b. */
void *exo_kv_pool_page(const exo_kv_pool *p, int b, int32_t id);
/* Pages held by some table, and pages the pool has memory for. */
int    exo_kv_pool_in_use(const exo_kv_pool *p);
int    exo_kv_pool_made(const exo_kv_pool *p);
/* Bytes of one page on every backend together. */
size_t exo_kv_pool_page_bytes(const exo_kv_pool *p);

#endif
