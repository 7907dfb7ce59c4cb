/* A persistent fork-join thread pool for compute kernels.
 *
 * exo_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once on each of the
 * pool's nth threads (the caller is thread 0) and returns when all are done.
 * Kernels split their work by ith/nth, ggml style, so there is no task queue
 * and no allocation per call.
 *
 * Waiting threads spin briefly and then sleep on a futex: on the two shared
 * cores of our machines a pool that spins forever steals the cycles its own
 * workers need (see TOOLCHAIN.md), while sleeping right away adds tens of
 * microseconds to every matrix-vector product of a decode step.
 *
 * Example:
 *   exo_pool *pool = exo_pool_create(2);
 *   exo_pool_run(pool, scale_rows, &job);
 *   exo_pool_free(pool);
 */
#ifndef EXO_CORE_THREADPOOL_H
#define EXO_CORE_THREADPOOL_H

typedef struct exo_pool exo_pool;
typedef void (*exo_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means one per online CPU. */
exo_pool *exo_pool_create(int n_threads);
void      exo_pool_free(exo_pool *pool);
int       exo_pool_size(const exo_pool *pool);
void      exo_pool_run(exo_pool *pool, exo_pool_fn fn, void *ctx);

/* Splits [0, n) into nth contiguous ranges, aligned to `align` items. */
void exo_split_range(long n, long align, int ith, int nth, long *begin, long *end);

#endif
