/* Fork-join pool (see threadpool.h).
 *
 * Protocol of a run (adaptive policy): the caller publishes (fn, ctx),
 * resets `done` and then `next` to 1 (release), and bumps the wake word of
 * the workers it wants (active - 1 of them). It runs share 0 itself, then
 * takes more with fetch_add(next) until none is left; workers take shares
 * the same way and add what they ran to `done`; the caller returns when
 * done == nth - (shares it ran). A worker woken too late finds nothing to
 * take and goes back to waiting: it never holds the run. (The caller's
 * share 0 and its count kept out of `done` save cache-line round trips
 * between the cores: tiny models make runs of ~1 us, where they show.)
 * A take that succeeds (s < nth) always belongs to the current run, since
 * the run cannot end before that share is done; so fn/ctx are read after
 * the take, and a stale worker can never run a share twice.
 *
 * The fixed policy (the pool as it was, kept for comparison): worker i runs
 * share i, every worker is woken every run, the caller runs share 0 and
 * waits. The mode travels in the wake word's low bit, so a worker always
 * acts on the run it was woken for.
 *
 * Waits spin for a bounded time and then sleep on a futex; the side that
 * signals only issues FUTEX_WAKE when somebody sleeps (Dekker handshake with
 * seq_cst on both sides). The caller's spin at the join is bounded by its
 * own share's time: a worker still busy after that is most likely
 * descheduled, and a sleeping caller leaves its core free for it.
 *
 * Adaptation (caller-only state): for each multi-thread run the caller
 * measures its own work C (start to having nothing left to take) and its
 * wait at the join W. W > C + LATE_SLACK means a worker was slowed by
 * something else (on an idle machine W <= C: the worker started no later
 * than the caller's last take). The excess W - C, plus the time spent
 * waking sleeping workers in runs where they then took no share (a futex
 * wake and its IPI, several us in a VM, is all a slow-to-schedule worker
 * costs a run of tiny shares), is summed over a decaying window of run
 * time; when it exceeds 1/8 of the run time, one thread
 * fewer is woken. While fewer than all are active, one more is tried after
 * each probe interval of run time (doubling after each failed probe, up to
 * 1.6 s); the probe is kept once a window passes without excess. Intervals
 * count time spent in runs, not wall time: a failed probe costs about one
 * late run (a scheduler slice, a few ms), and counted in wall time a pool
 * used now and then (a runner between requests) would probe at the start
 * of nearly every request. */
#include "core/threadpool.h"
#include "core/alloc.h"
#include "core/clock.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Spin budgets, in time. 100 us covers the gaps between the matrix
 * products of a decode step; a longer gap (sampling over a large
 * vocabulary) costs one futex wake, ~10-50 us, mostly hidden by the
 * caller taking the first share. */
#define WORKER_SPIN_NS 100000
#define JOIN_SPIN_MIN_NS 10000
#define JOIN_SPIN_MAX_NS 200000
#define SPIN_CHECK_EVERY 16 /* pauses between clock reads (~0.2-2 us) */

/* Adaptation. */
#define LATE_SLACK_NS 50000          /* futex wake latency and share imbalance */
#define MIN_EXCESS_NS 200000         /* never step down on one small hiccup */
#define WINDOW_NS 20000000           /* run time that decays the window / confirms a probe */
#define PROBE_BASE_NS 50000000ull    /* first retry of one more thread (run time) */
#define PROBE_MAX_NS 1600000000ull   /* a neighbour that stays costs ~1 late run per 1.6 s */

enum { WAKE_FIXED = 1 }; /* low bit of a wake word: run your own share (fixed policy) */

typedef struct worker {
    _Alignas(64) atomic_uint wake; /* bumped (by 2) to call the worker in */
    atomic_int sleeping;
    exo_pool *pool;
    int index;
    pthread_t thread;
} worker;

struct exo_pool {
    int n_threads;
    worker *workers; /* [0] is the caller's slot, unused */
    exo_pool_fn fn;
    void *ctx;
    _Alignas(64) atomic_uint next; /* next share to take */
    _Alignas(64) atomic_uint done; /* shares finished in this run */
    atomic_int caller_sleeps;
    _Alignas(64) atomic_int active; /* read by workers to decide whether to spin */
    atomic_int stop;
    /* caller-only */
    exo_pool_policy policy;
    uint64_t excess_ns, run_ns;
    uint64_t reduced_ns, probe_interval_ns; /* run time with fewer active / before a probe */
    bool probing;
    exo_pool_stats stats;
};

static void futex_wait(atomic_uint *addr, unsigned expected)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *addr, int n)
{
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Nanoseconds from the TSC where there is one (~10 ns a read, against
 * ~30-50 for clock_gettime in our VMs; a run reads it two or three
 * times), scaled by a ratio measured once against the monotonic clock.
 * Only differences are used. */
#if defined(__x86_64__)
#include <x86intrin.h>
static double ns_per_tick;
static pthread_once_t tick_once = PTHREAD_ONCE_INIT;

static void calibrate_ticks(void)
{
    uint64_t t0 = exo_clock_ns(), c0 = __rdtsc(), t1;
    while ((t1 = exo_clock_ns()) - t0 < 1000000)
        ;
    uint64_t c1 = __rdtsc();
    ns_per_tick = c1 > c0 ? (double)(t1 - t0) / (double)(c1 - c0) : 0;
}

static inline uint64_t now_ns(void)
{
    if (ns_per_tick == 0) /* no usable TSC */
        return exo_clock_ns();
    return (uint64_t)((double)__rdtsc() * ns_per_tick);
}
#else
static void calibrate_ticks(void) {}
static inline uint64_t now_ns(void) { return exo_clock_ns(); }
#endif

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until *addr != value or budget_ns passes; returns the last value. */
static unsigned spin_while_equal(atomic_uint *addr, unsigned value, uint64_t budget_ns)
{
    unsigned v = atomic_load_explicit(addr, memory_order_acquire);
    if (v != value || budget_ns == 0)
        return v;
    uint64_t deadline = now_ns() + budget_ns;
    for (;;) {
        for (int i = 0; i < SPIN_CHECK_EVERY; i++) {
            cpu_relax();
            if ((v = atomic_load_explicit(addr, memory_order_acquire)) != value)
                return v;
        }
        if (now_ns() >= deadline)
            return v;
    }
}

static void shares_done(exo_pool *pool, unsigned k)
{
    atomic_fetch_add(&pool->done, k);
    if (atomic_load(&pool->caller_sleeps))
        futex_wake(&pool->done, INT_MAX);
}

/* Takes and runs shares until none is left; returns how many it ran.
 * Whoever takes the last share knows there is nothing more to take. */
static unsigned take_shares(exo_pool *pool)
{
    unsigned n = (unsigned)pool->n_threads, ran = 0, s;
    while ((s = atomic_fetch_add_explicit(&pool->next, 1, memory_order_acquire)) < n) {
        pool->fn(pool->ctx, (int)s, (int)n);
        ran++;
        if (s == n - 1)
            break;
    }
    return ran;
}

static void *worker_main(void *p)
{
    worker *w = p;
    exo_pool *pool = w->pool;
    /* Wake word 0 is the pool's creation: a run published before this
     * thread got scheduled has already bumped it. */
    unsigned seen = 0;
    for (;;) {
        /* a worker the caller does not currently wake has nothing to spin for */
        uint64_t budget = atomic_load_explicit(&pool->active, memory_order_relaxed) > w->index
                              ? WORKER_SPIN_NS
                              : 0;
        unsigned v = spin_while_equal(&w->wake, seen, budget);
        while (v == seen) {
            atomic_store(&w->sleeping, 1);
            if ((v = atomic_load(&w->wake)) == seen)
                futex_wait(&w->wake, seen);
            atomic_store(&w->sleeping, 0);
            v = atomic_load_explicit(&w->wake, memory_order_acquire);
        }
        seen = v;
        if (atomic_load(&pool->stop))
            return NULL;
        if (v & WAKE_FIXED) {
            pool->fn(pool->ctx, w->index, pool->n_threads);
            shares_done(pool, 1);
        } else {
            unsigned ran = take_shares(pool);
            if (ran)
                shares_done(pool, ran);
        }
    }
}

/* Each call moves the worker's own word on (by 2, the low bit carrying the
 * mode), so a worker left asleep for any number of runs still sees a change. */
static bool wake_worker(worker *w, unsigned mode)
{
    unsigned v = ((atomic_load_explicit(&w->wake, memory_order_relaxed) >> 1) + 1) << 1 | mode;
    atomic_store(&w->wake, v);
    if (!atomic_load(&w->sleeping))
        return false;
    futex_wake(&w->wake, 1);
    return true;
}

exo_pool *exo_pool_create(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    exo_pool *pool = exo_calloc(1, sizeof *pool);
    pthread_once(&tick_once, calibrate_ticks);
    pool->n_threads = n_threads;
    pool->workers = exo_alloc_aligned(sizeof(worker) * (size_t)n_threads); /* zeroed */
    if (!pool->workers)
        n_threads = pool->n_threads = 1;
    atomic_store(&pool->next, (unsigned)n_threads); /* nothing to take */
    atomic_store(&pool->active, n_threads);
    pool->probe_interval_ns = PROBE_BASE_NS;
    const char *env = getenv("EXO_POOL_POLICY");
    pool->policy = env && !strcmp(env, "fixed") ? EXO_POOL_FIXED : EXO_POOL_ADAPTIVE;
    for (int i = 1; i < n_threads; i++) {
        worker *w = &pool->workers[i];
        w->pool = pool;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pool->n_threads = i; /* run with the threads we got */
            atomic_store(&pool->next, (unsigned)i);
            atomic_store(&pool->active, i);
            break;
        }
    }
    pool->stats.active = pool->n_threads;
    return pool;
}

void exo_pool_free(exo_pool *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stop, 1);
    for (int i = 1; i < pool->n_threads; i++)
        wake_worker(&pool->workers[i], 0);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->workers[i].thread, NULL);
    exo_free_aligned(pool->workers);
    exo_free(pool);
}

int exo_pool_size(const exo_pool *pool) { return pool ? pool->n_threads : 1; }

void exo_pool_set_policy(exo_pool *pool, exo_pool_policy policy)
{
    if (!pool)
        return;
    pool->policy = policy;
    pool->excess_ns = pool->run_ns = pool->reduced_ns = 0;
    pool->probing = false;
    pool->probe_interval_ns = PROBE_BASE_NS;
    atomic_store(&pool->active, pool->n_threads);
}

void exo_pool_get_stats(const exo_pool *pool, exo_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!pool) {
        out->active = 1;
        return;
    }
    *out = pool->stats;
    out->active = atomic_load(&pool->active);
}

/* Waits for done == want: spins up to budget_ns, then sleeps. */
static void join(exo_pool *pool, unsigned want, uint64_t budget_ns)
{
    uint64_t deadline = now_ns() + budget_ns;
    unsigned d;
    for (int i = 1; (d = atomic_load_explicit(&pool->done, memory_order_acquire)) != want; i++) {
        if (i % SPIN_CHECK_EVERY || now_ns() < deadline) {
            cpu_relax();
            continue;
        }
        atomic_store(&pool->caller_sleeps, 1);
        if ((d = atomic_load(&pool->done)) != want)
            futex_wait(&pool->done, d);
        atomic_store(&pool->caller_sleeps, 0);
    }
}

static void run_fixed(exo_pool *pool, exo_pool_fn fn, void *ctx)
{
    unsigned n = (unsigned)pool->n_threads;
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    for (unsigned i = 1; i < n; i++)
        wake_worker(&pool->workers[i], WAKE_FIXED);
    fn(ctx, 0, (int)n);
    uint64_t tc = now_ns();
    join(pool, n - 1, JOIN_SPIN_MAX_NS);
    pool->stats.runs++;
    pool->stats.caller_shares++;
    pool->stats.wait_ns += now_ns() - tc;
}

static void set_active(exo_pool *pool, int active)
{
    atomic_store_explicit(&pool->active, active, memory_order_relaxed);
    pool->excess_ns = pool->run_ns = pool->reduced_ns = 0;
}

/* Books one multi-thread run: C = caller's work, W = its wait at the join,
 * wasted = time spent waking workers that then took no share. */
static void adapt(exo_pool *pool, uint64_t c_ns, uint64_t w_ns, uint64_t wasted_ns)
{
    int active = atomic_load_explicit(&pool->active, memory_order_relaxed);
    if (w_ns > c_ns + LATE_SLACK_NS) {
        pool->excess_ns += w_ns - c_ns;
        pool->stats.late_runs++;
    }
    pool->excess_ns += wasted_ns;
    pool->run_ns += c_ns + w_ns;
    if (pool->excess_ns >= MIN_EXCESS_NS && pool->excess_ns * 8 > pool->run_ns) {
        if (pool->probing) { /* still busy: wait longer before the next try */
            pool->probing = false;
            pool->probe_interval_ns *= 2;
            if (pool->probe_interval_ns > PROBE_MAX_NS)
                pool->probe_interval_ns = PROBE_MAX_NS;
        }
        pool->stats.steps_down++;
        set_active(pool, active - 1);
    } else if (pool->run_ns >= WINDOW_NS) {
        if (pool->probing) { /* a window without excess: keep the thread */
            pool->probing = false;
            pool->probe_interval_ns = PROBE_BASE_NS;
            pool->reduced_ns = 0;
        }
        pool->excess_ns /= 2;
        pool->run_ns /= 2;
    }
}

static void run_adaptive(exo_pool *pool, exo_pool_fn fn, void *ctx)
{
    unsigned n = (unsigned)pool->n_threads;
    uint64_t t0 = now_ns();
    int active = atomic_load_explicit(&pool->active, memory_order_relaxed);
    if (active < (int)n && !pool->probing && pool->reduced_ns >= pool->probe_interval_ns) {
        pool->stats.probes++;
        set_active(pool, ++active);
        pool->probing = true;
    }
    pool->stats.runs++;
    if (active == 1) { /* nobody to wait for: the shares in order, on this thread */
        for (unsigned s = 0; s < n; s++)
            fn(ctx, (int)s, (int)n);
        pool->stats.caller_shares += n;
        pool->reduced_ns += now_ns() - t0;
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->next, 1, memory_order_release);
    int syscalls = 0;
    for (int i = 1; i < active; i++)
        syscalls += wake_worker(&pool->workers[i], 0);
    /* a wake that finds workers asleep costs a syscall (and an IPI, slow in
     * a VM); when they then take nothing, as on a busy machine where they
     * are slow to be scheduled, that is a cost for nothing */
    uint64_t tw = syscalls ? now_ns() : t0;
    fn(ctx, 0, (int)n);
    unsigned ran = 1 + take_shares(pool);
    uint64_t tc = now_ns(), te = tc;
    pool->stats.caller_shares += ran;
    if (atomic_load_explicit(&pool->done, memory_order_acquire) != n - ran) {
        uint64_t budget = tc - t0;
        budget = budget < JOIN_SPIN_MIN_NS ? JOIN_SPIN_MIN_NS : budget;
        budget = budget > JOIN_SPIN_MAX_NS ? JOIN_SPIN_MAX_NS : budget;
        join(pool, n - ran, budget);
        te = now_ns();
    }
    uint64_t c_ns = tc - t0;
    pool->stats.wait_ns += te - tc;
    if (active < (int)n && !pool->probing)
        pool->reduced_ns += te - t0;
    adapt(pool, c_ns, te - tc, ran == n ? tw - t0 : 0);
}

void exo_pool_run(exo_pool *pool, exo_pool_fn fn, void *ctx)
{
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (pool->policy == EXO_POOL_FIXED)
        run_fixed(pool, fn, ctx);
    else
        run_adaptive(pool, fn, ctx);
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
