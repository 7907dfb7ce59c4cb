/* Fork-join pool (see threadpool.h).
 *
 * Protocol: the caller publishes (fn, ctx), bumps `generation` and wakes the
 * workers; each worker runs its share and increments `done`; the caller runs
 * share 0 and then waits for done == nth-1. Both waits spin for a bounded
 * number of pause instructions before falling back to FUTEX_WAIT, and the
 * matching side only issues FUTEX_WAKE when somebody actually sleeps. */
#include "core/threadpool.h"
#include "core/alloc.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPIN_LIMIT 20000 /* ~50-100 us of pause: longer than a decode GEMV gap */

struct exo_pool {
    int n_threads;
    pthread_t *threads;
    exo_pool_fn fn;
    void *ctx;
    _Alignas(64) atomic_uint generation;
    _Alignas(64) atomic_uint done;
    _Alignas(64) atomic_int sleepers;      /* workers sleeping on generation */
    _Alignas(64) atomic_int caller_sleeps; /* caller sleeping on done */
    atomic_int stop;
};

typedef struct worker_arg {
    exo_pool *pool;
    int ith;
} worker_arg;

static void futex_wait(atomic_uint *addr, unsigned expected)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    exo_pool *pool = arg->pool;
    int ith = arg->ith;
    exo_free(arg);
    /* Generation 0 is the pool's creation; reading the counter here instead
     * would skip a job published before this thread got scheduled. */
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        unsigned g;
        while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_LIMIT) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&pool->sleepers, 1);
            if (atomic_load(&pool->generation) == seen)
                futex_wait(&pool->generation, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&pool->stop))
            return NULL;
        pool->fn(pool->ctx, ith, pool->n_threads);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        if (atomic_load(&pool->caller_sleeps))
            futex_wake_all(&pool->done);
    }
}

exo_pool *exo_pool_create(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    exo_pool *pool = exo_calloc(1, sizeof *pool);
    pool->n_threads = n_threads;
    pool->threads = exo_calloc((size_t)n_threads, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = exo_malloc(sizeof *arg);
        arg->pool = pool;
        arg->ith = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            exo_free(arg);
            pool->n_threads = i; /* run with the threads we got */
            break;
        }
    }
    return pool;
}

void exo_pool_free(exo_pool *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    futex_wake_all(&pool->generation);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    exo_free(pool->threads);
    exo_free(pool);
}

int exo_pool_size(const exo_pool *pool) { return pool ? pool->n_threads : 1; }

void exo_pool_run(exo_pool *pool, exo_pool_fn fn, void *ctx)
{
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    unsigned want = (unsigned)pool->n_threads - 1;
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (atomic_load(&pool->sleepers))
        futex_wake_all(&pool->generation);
    fn(ctx, 0, pool->n_threads);
    int spins = 0;
    unsigned d;
    while ((d = atomic_load_explicit(&pool->done, memory_order_acquire)) != want) {
        if (++spins < SPIN_LIMIT) {
            cpu_relax();
            continue;
        }
        atomic_store(&pool->caller_sleeps, 1);
        d = atomic_load(&pool->done);
        if (d != want)
            futex_wait(&pool->done, d);
        atomic_store(&pool->caller_sleeps, 0);
        spins = 0;
    }
}

void exo_split_range(long n, long align, int ith, int nth, long *begin, long *end)
{
    if (align < 1)
        align = 1;
    long units = (n + align - 1) / align;
    long per = units / nth, extra = units % nth;
    long ub = ith * per + (ith < extra ? ith : extra);
    long ue = ub + per + (ith < extra ? 1 : 0);
    long b = ub * align, e = ue * align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}
