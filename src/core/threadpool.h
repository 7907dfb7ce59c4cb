/* A persistent fork-join thread pool for compute kernels.
 *
 * exo_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) once for every share
 * ith in [0, nth), nth = exo_pool_size(pool), and returns when all are done.
 * Kernels split their work by ith/nth, ggml style, so there is no task queue
 * and no allocation per call.
 *
 * Shares, not threads: which thread runs a share is decided per run, and
 * one thread may run several shares one after the other. So
 *   - a kernel may index per-thread scratch by ith (a share runs on one
 *     thread at a time), but must not wait for another share inside fn;
 *   - nth never changes with load, so a kernel's result does not depend on
 *     how busy the machine is (the split is always the same).
 *
 * Why: the two cores of our machines are shared with other processes (other
 * runners, nodes, builds). A worker descheduled by a busy neighbour used to
 * hold the whole run at the join for a scheduler slice (milliseconds, against
 * microseconds of work). Now the caller runs every share nobody has started,
 * and the pool adapts how many threads it wakes: when workers keep arriving
 * late it wakes fewer, and it periodically tries one more to grow back when
 * the neighbour has gone (threadpool.c, docs/PERFORMANCE.md).
 *
 * Waiting threads spin briefly (bounded in time, not in pause instructions,
 * whose cost differs ~10x between CPUs) and then sleep on a futex.
 *
 * Example:
 *   exo_pool *pool = exo_pool_create(2);
 *   exo_pool_run(pool, scale_rows, &job);
 *   exo_pool_free(pool);
 */
#ifndef EXO_CORE_THREADPOOL_H
#define EXO_CORE_THREADPOOL_H

#include <stdint.h>

typedef struct exo_pool exo_pool;
typedef void (*exo_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means one per online CPU. The policy starts as adaptive,
 * or fixed when the environment has EXO_POOL_POLICY=fixed. */
exo_pool *exo_pool_create(int n_threads);
void      exo_pool_free(exo_pool *pool);
int       exo_pool_size(const exo_pool *pool);
void      exo_pool_run(exo_pool *pool, exo_pool_fn fn, void *ctx);

typedef enum exo_pool_policy {
    EXO_POOL_ADAPTIVE, /* shares claimed by whoever is free; wakes as many threads as pay off */
    EXO_POOL_FIXED,    /* the policy before: share i on thread i, every thread, every run */
} exo_pool_policy;

/* Call between runs, from the thread that calls exo_pool_run. */
void exo_pool_set_policy(exo_pool *pool, exo_pool_policy policy);

typedef struct exo_pool_stats {
    int active;             /* threads the next run wakes (caller included) */
    uint64_t runs;          /* exo_pool_run calls with more than one share */
    uint64_t late_runs;     /* runs whose join waited on a late worker */
    uint64_t caller_shares; /* shares the calling thread ran */
    uint64_t steps_down;    /* times the active count dropped */
    uint64_t probes;        /* times it tried one more thread */
    uint64_t wait_ns;       /* total time the caller waited at the join */
} exo_pool_stats;

void exo_pool_get_stats(const exo_pool *pool, exo_pool_stats *out);

/* Splits [0, n) into nth contiguous ranges, aligned to `align` items. */
void exo_split_range(long n, long align, int ith, int nth, long *begin, long *end);

#endif
