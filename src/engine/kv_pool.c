/* The page pool (kv_pool.h). Ids index flat arrays (refs, per-backend
 * addresses); free ids stack up so that the page dropped last, whose
 * memory is likeliest still in cache, is taken first. */
#include "engine/kv_pool.h"

#include "core/alloc.h"

#include <string.h>

/* A segment is at least this much memory (huge pages on the CPU, fewer
 * allocations on a GPU), and at least one page. */
#define SEGMENT_BYTES ((size_t)8 << 20)

struct exo_kv_pool {
    int n_be;
    exo_backend *be[2];
    size_t page_bytes[2];
    int per_segment;
    int n_seg, seg_cap;
    char **seg[2];      /* per backend, per segment: its memory */
    int made, in_use;
    int *refs;          /* per id */
    int32_t *free_ids;  /* a stack */
    int n_free;
};

exo_kv_pool *exo_kv_pool_new(int n_be, exo_backend *const *be, const size_t *page_bytes)
{
    if (n_be < 1 || n_be > 2)
        return NULL;
    exo_kv_pool *p = exo_calloc(1, sizeof *p);
    p->n_be = n_be;
    size_t bytes = 0;
    for (int b = 0; b < n_be; b++) {
        p->be[b] = be[b];
        p->page_bytes[b] = page_bytes[b];
        bytes += page_bytes[b];
    }
    p->per_segment = bytes && bytes < SEGMENT_BYTES ? (int)(SEGMENT_BYTES / bytes) : 1;
    return p;
}

void exo_kv_pool_free(exo_kv_pool *p)
{
    if (!p)
        return;
    for (int b = 0; b < p->n_be; b++) {
        for (int s = 0; s < p->n_seg; s++)
            p->be[b]->ops->release(p->be[b], p->seg[b][s]);
        exo_free(p->seg[b]);
    }
    exo_free(p->refs);
    exo_free(p->free_ids);
    exo_free(p);
}

/* One more segment's pages onto the free stack. */
static int grow(exo_kv_pool *p)
{
    char *mem[2] = {NULL, NULL};
    for (int b = 0; b < p->n_be; b++) {
        size_t bytes = p->page_bytes[b] * (size_t)p->per_segment;
        mem[b] = p->be[b]->ops->alloc(p->be[b], bytes ? bytes : 1);
        if (!mem[b]) {
            for (int i = 0; i < b; i++)
                p->be[i]->ops->release(p->be[i], mem[i]);
            return EXO_ENOMEM;
        }
    }
    if (p->n_seg == p->seg_cap) {
        p->seg_cap = p->seg_cap ? 2 * p->seg_cap : 8;
        for (int b = 0; b < p->n_be; b++)
            p->seg[b] = exo_realloc(p->seg[b], sizeof(char *) * (size_t)p->seg_cap);
        p->refs = exo_realloc(p->refs, sizeof(int) * (size_t)p->seg_cap * (size_t)p->per_segment);
        p->free_ids = exo_realloc(p->free_ids, sizeof(int32_t) * (size_t)p->seg_cap * (size_t)p->per_segment);
    }
    for (int b = 0; b < p->n_be; b++)
        p->seg[b][p->n_seg] = mem[b];
    p->n_seg++;
    /* pushed last id first, so the segment's first page is taken first */
    for (int i = p->per_segment - 1; i >= 0; i--) {
        int32_t id = p->made + i;
        p->refs[id] = 0;
        p->free_ids[p->n_free++] = id;
    }
    p->made += p->per_segment;
    return 0;
}

int exo_kv_pool_take(exo_kv_pool *p, int32_t *id)
{
    if (!p->n_free) {
        int rc = grow(p);
        if (rc)
            return rc;
    }
    *id = p->free_ids[--p->n_free];
    p->refs[*id] = 1;
    p->in_use++;
    return 0;
}

void exo_kv_pool_hold(exo_kv_pool *p, int32_t id) { p->refs[id]++; }

void exo_kv_pool_drop(exo_kv_pool *p, int32_t id)
{
    if (--p->refs[id] == 0) {
        p->free_ids[p->n_free++] = id;
        p->in_use--;
    }
}

int exo_kv_pool_refs(const exo_kv_pool *p, int32_t id) { return p->refs[id]; }

void *exo_kv_pool_page(const exo_kv_pool *p, int b, int32_t id)
{
    return p->seg[b][id / p->per_segment] + (size_t)(id % p->per_segment) * p->page_bytes[b];
}

int exo_kv_pool_in_use(const exo_kv_pool *p) { return p->in_use; }
int exo_kv_pool_made(const exo_kv_pool *p) { return p->made; }

size_t exo_kv_pool_page_bytes(const exo_kv_pool *p)
{
    size_t bytes = 0;
    for (int b = 0; b < p->n_be; b++)
        bytes += p->page_bytes[b];
    return bytes;
}
