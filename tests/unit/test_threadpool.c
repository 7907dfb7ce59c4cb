/* Thread pool: every share runs exactly once per dispatch, across many
 * back-to-back dispatches (the decode pattern) and after idle periods long
 * enough for workers to fall asleep; range splitting covers [0, n) exactly. */
#include "core/threadpool.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <unistd.h>

typedef struct job {
    atomic_int hits[8];
    atomic_long sum;
} job;

static void count(void *p, int ith, int nth)
{
    job *j = p;
    atomic_fetch_add(&j->hits[ith], 1);
    atomic_fetch_add(&j->sum, nth);
}

Test(threadpool, every_share_runs_once_per_dispatch)
{
    for (int threads = 1; threads <= 4; threads++) {
        exo_pool *pool = exo_pool_create(threads);
        cr_assert_eq(exo_pool_size(pool), threads);
        job j = {0};
        for (int i = 0; i < 20000; i++)
            exo_pool_run(pool, count, &j);
        usleep(200000); /* workers go to sleep on the futex */
        for (int i = 0; i < 10; i++)
            exo_pool_run(pool, count, &j);
        for (int t = 0; t < threads; t++)
            cr_expect_eq(atomic_load(&j.hits[t]), 20010, "thread %d", t);
        exo_pool_free(pool);
    }
}

Test(threadpool, first_dispatch_right_after_create)
{
    /* regression: a worker scheduled after the first dispatch must not skip it */
    for (int i = 0; i < 200; i++) {
        exo_pool *pool = exo_pool_create(2);
        job j = {0};
        exo_pool_run(pool, count, &j);
        cr_assert_eq(atomic_load(&j.hits[1]), 1);
        exo_pool_free(pool);
    }
}

Test(threadpool, split_range_covers_exactly)
{
    for (long n = 0; n < 300; n += 7)
        for (int nth = 1; nth <= 5; nth++)
            for (long align = 1; align <= 64; align *= 4) {
                long expect = 0;
                for (int i = 0; i < nth; i++) {
                    long b, e;
                    exo_split_range(n, align, i, nth, &b, &e);
                    cr_assert_eq(b, expect, "n=%ld nth=%d align=%ld i=%d", n, nth, align, i);
                    cr_assert(e >= b && e <= n);
                    if (e < n)
                        cr_assert_eq(e % align, 0);
                    expect = e;
                }
                cr_assert_eq(expect, n);
            }
}
