/* The thread pool with a busy neighbour core, against an idle machine, for
 * both pool policies (EXO_POOL_FIXED: the pool as it was; EXO_POOL_ADAPTIVE).
 *
 * A neighbour is a child process spinning on one core (unpinned, or pinned
 * to CPU 0), what another runner or node on the same machine looks like.
 * Measured, each as the median of --rounds rounds:
 *   fork-join  microseconds per exo_pool_run of an empty job (the pool's
 *              own overhead) and of a job of ~40 us of arithmetic in total;
 *   decode     tokens/s of greedy decode, for each --model DIR and each
 *              --synthetic PRESET (q4), one model per policy (the policy is
 *              read from EXO_POOL_POLICY when the model's pool is made).
 * Printed as values and as ratios: busy / idle for each policy, and
 * adaptive / fixed for each condition.
 *
 * A benchmark, not a test: it takes tens of seconds and measures the
 * machine as it is (other processes move it). Not run by CI.
 *
 * Usage: bench_threadpool [--threads N=2] [--rounds N=5] [--gen N=128]
 *                         [--model DIR]... [--synthetic PRESET]... */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "engine/model.h"
#include "engine/synthetic.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ROUNDS 31
#define MAX_MODELS 8

enum { IDLE, BUSY, BUSY_PINNED, N_COND };
static const char *const cond_name[N_COND] = {"idle", "busy neighbour", "busy neighbour on cpu0"};
static const char *const policy_name[2] = {"adaptive", "fixed"};

/* ---- the neighbour ------------------------------------------------------ */

static pid_t neighbour_start(int cond)
{
    if (cond == IDLE)
        return 0;
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        if (cond == BUSY_PINNED) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(0, &set);
            sched_setaffinity(0, sizeof set, &set);
        }
        volatile unsigned long x = 0;
        for (;;)
            x++;
    }
    usleep(100000); /* let the scheduler place it */
    return pid;
}

static void neighbour_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---- fork-join ---------------------------------------------------------- */

typedef struct arith_job {
    long iters; /* in total, split over the shares */
} arith_job;

static volatile double arith_sink; /* keeps the loop alive */

static void arith(void *p, int ith, int nth)
{
    arith_job *j = p;
    long b, e;
    exo_split_range(j->iters, 1, ith, nth, &b, &e);
    double x = 1.0 + ith;
    for (long i = b; i < e; i++)
        x = x * 0.999999 + 1e-7;
    arith_sink = x;
}

static void nothing(void *p, int ith, int nth) { (void)p, (void)ith, (void)nth; }

/* Microseconds per run, over about 0.2 s of runs. */
static double us_per_run(exo_pool *pool, exo_pool_fn fn, void *ctx)
{
    for (int i = 0; i < 100; i++)
        exo_pool_run(pool, fn, ctx);
    long runs = 0;
    double t0 = exo_clock_seconds(), t;
    do {
        for (int i = 0; i < 64; i++)
            exo_pool_run(pool, fn, ctx);
        runs += 64;
    } while ((t = exo_clock_seconds() - t0) < 0.2);
    return t / (double)runs * 1e6;
}

/* Iterations of arith() that take ~40 us on one thread. */
static long calibrate_arith(void)
{
    arith_job j = {.iters = 1 << 20};
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = exo_clock_seconds();
        arith(&j, 0, 1);
        double dt = exo_clock_seconds() - t0;
        best = dt < best ? dt : best;
    }
    return (long)(40e-6 / best * (double)j.iters);
}

/* ---- decode ------------------------------------------------------------- */

typedef struct decoder {
    char name[96];
    exo_model *m[3]; /* per policy, then one thread */
    exo_seq *seq[3];
    exo_synth *syn[3]; /* a synthetic model's weights live here */
    float *logits;
    int V;
} decoder;

#define PROMPT 8

static int decoder_make(decoder *d, const char *dir, const char *preset, int threads, int gen,
                        int rounds)
{
    exo_err err = {0};
    snprintf(d->name, sizeof d->name, "%s", dir ? dir : preset);
    for (int p = 0; p < 3; p++) {
        exo_model_opts opts = {.n_threads = p < 2 ? threads : 1};
        setenv("EXO_POOL_POLICY", policy_name[p % 2], 1);
        int rc;
        if (dir) {
            rc = exo_model_load(dir, &opts, &d->m[p], &err);
        } else {
            rc = exo_synth_create(preset, EXO_SYNTH_Q4, 1234, &d->syn[p], &err) ||
                 exo_synth_build(d->syn[p], &opts, &d->m[p], &err);
        }
        if (rc || exo_seq_create(d->m[p], PROMPT + gen + 8, &d->seq[p], &err)) {
            fprintf(stderr, "bench_threadpool: %s: %s\n", d->name, err.msg);
            return -1;
        }
    }
    unsetenv("EXO_POOL_POLICY");
    d->V = exo_model_vocab(d->m[0]);
    d->logits = exo_malloc(sizeof(float) * (size_t)d->V);
    (void)rounds;
    return 0;
}

static void decoder_free(decoder *d)
{
    for (int p = 0; p < 3; p++) {
        exo_seq_free(d->seq[p]);
        exo_model_free(d->m[p]);
        exo_synth_free(d->syn[p]);
    }
    exo_free(d->logits);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Tokens/s of `gen` greedy tokens after a PROMPT-token prefill; policy 2
 * is the one-thread model. */
static double decode_tps(decoder *d, int policy, int gen)
{
    exo_err err = {0};
    exo_model *m = d->m[policy];
    exo_seq *seq = d->seq[policy];
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % d->V);
    exo_seq_truncate(seq, 0);
    if (exo_model_forward(m, seq, prompt, PROMPT, d->logits, false, &err))
        goto fail;
    int32_t tok = argmax(d->logits, d->V);
    double t0 = exo_clock_seconds();
    for (int i = 0; i < gen; i++) {
        if (exo_model_forward(m, seq, &tok, 1, d->logits, false, &err))
            goto fail;
        tok = argmax(d->logits, d->V);
    }
    return gen / (exo_clock_seconds() - t0);
fail:
    fprintf(stderr, "bench_threadpool: decode %s: %s\n", d->name, err.msg);
    exit(1);
}

/* ---- report ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One workload: value[policy][cond], `higher` tells whether more is better. */
static void report(const char *what, const char *unit, double v[2][N_COND], int higher)
{
    printf("%-34s %-9s", what, unit);
    for (int c = 0; c < N_COND; c++)
        printf(" | %9.2f %9.2f", v[1][c], v[0][c]);
    printf("\n");
    printf("%-34s %-9s", "", higher ? "ratios" : "ratios(t)");
    for (int c = 0; c < N_COND; c++) {
        /* busy/idle per policy; for times the inverse, so < 1 is always a loss */
        double f = higher ? v[1][c] / v[1][IDLE] : v[1][IDLE] / v[1][c];
        double a = higher ? v[0][c] / v[0][IDLE] : v[0][IDLE] / v[0][c];
        printf(" | %9.3f %9.3f", f, a);
    }
    printf("\n%-34s %-9s", "", "adapt/fix");
    for (int c = 0; c < N_COND; c++)
        printf(" | %19.2fx", higher ? v[0][c] / v[1][c] : v[1][c] / v[0][c]);
    printf("\n");
}

int main(int argc, char **argv)
{
    int threads = 2, rounds = 5, gen = 128, n_models = 0;
    const char *dirs[MAX_MODELS] = {0}, *presets[MAX_MODELS] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_threadpool: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--gen"))
            gen = atoi(v);
        else if (!strcmp(a, "--model") && n_models < MAX_MODELS)
            dirs[n_models++] = v;
        else if (!strcmp(a, "--synthetic") && n_models < MAX_MODELS)
            presets[n_models++] = v;
        else {
            fprintf(stderr, "usage: bench_threadpool [--threads N] [--rounds N] [--gen N] "
                            "[--model DIR]... [--synthetic PRESET]...\n");
            return 2;
        }
    }
    if (threads < 2 || rounds < 1 || rounds > MAX_ROUNDS || gen < 1) {
        fprintf(stderr, "bench_threadpool: --threads >= 2, --rounds 1..%d, --gen >= 1\n",
                MAX_ROUNDS);
        return 2;
    }

    decoder dec[MAX_MODELS];
    memset(dec, 0, sizeof dec);
    for (int k = 0; k < n_models; k++)
        if (decoder_make(&dec[k], dirs[k], presets[k], threads, gen, rounds))
            return 1;

    exo_pool *pool[2] = {exo_pool_create(threads), exo_pool_create(threads)};
    exo_pool_set_policy(pool[0], EXO_POOL_ADAPTIVE);
    exo_pool_set_policy(pool[1], EXO_POOL_FIXED);
    arith_job aj = {.iters = calibrate_arith()};

    /* samples[workload][policy][cond][round]; workloads: empty, arith, models */
    enum { W_EMPTY, W_ARITH, W_MODEL0 };
    static double samples[W_MODEL0 + MAX_MODELS][2][N_COND][MAX_ROUNDS];
    static double one_thread[MAX_MODELS][N_COND][MAX_ROUNDS];
    exo_pool_stats st[N_COND], fst[N_COND];
    for (int c = 0; c < N_COND; c++) {
        pid_t nb = neighbour_start(c);
        exo_pool_stats before, fbefore;
        exo_pool_get_stats(pool[0], &before);
        exo_pool_get_stats(pool[1], &fbefore);
        for (int r = 0; r < rounds; r++)
            for (int p = 0; p < 2; p++) { /* interleaved: drift hits both alike */
                samples[W_EMPTY][p][c][r] = us_per_run(pool[p], nothing, NULL);
                samples[W_ARITH][p][c][r] = us_per_run(pool[p], arith, &aj);
                for (int k = 0; k < n_models; k++)
                    samples[W_MODEL0 + k][p][c][r] = decode_tps(&dec[k], p, gen);
                if (p == 1)
                    for (int k = 0; k < n_models; k++)
                        one_thread[k][c][r] = decode_tps(&dec[k], 2, gen);
            }
        exo_pool_get_stats(pool[0], &st[c]);
        st[c].runs -= before.runs;
        st[c].late_runs -= before.late_runs;
        st[c].steps_down -= before.steps_down;
        st[c].probes -= before.probes;
        st[c].wait_ns -= before.wait_ns;
        exo_pool_get_stats(pool[1], &fst[c]);
        fst[c].runs -= fbefore.runs;
        fst[c].wait_ns -= fbefore.wait_ns;
        neighbour_stop(nb);
    }

    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("thread pool, %d threads on %ld CPUs, median of %d rounds; each cell: fixed adaptive\n",
           threads, cpus, rounds);
    printf("%-34s %-9s", "", "");
    for (int c = 0; c < N_COND; c++)
        printf(" | %19s", cond_name[c]);
    printf("\n");
    double v[2][N_COND];
    for (int w = 0; w < W_MODEL0 + n_models; w++) {
        for (int p = 0; p < 2; p++)
            for (int c = 0; c < N_COND; c++)
                v[p][c] = median(samples[w][p][c], rounds);
        if (w == W_EMPTY) {
            report("fork-join, empty job", "us/run", v, 0);
        } else if (w == W_ARITH) {
            report("fork-join, 40 us of work", "us/run", v, 0);
        } else {
            char what[160];
            snprintf(what, sizeof what, "decode %.26s", dec[w - W_MODEL0].name);
            report(what, "tok/s", v, 1);
            printf("%-34s %-9s", "", "1 thread");
            for (int c = 0; c < N_COND; c++)
                printf(" | %19.2f", median(one_thread[w - W_MODEL0][c], rounds));
            printf("\n");
        }
    }
    printf("fork-join pools (both jobs), join wait per run, fixed / adaptive:\n");
    for (int c = 0; c < N_COND; c++)
        printf("  %-24s %8.2f / %6.2f us; adaptive: active %d at the end, %llu of %llu runs "
               "late, %llu steps down, %llu probes\n",
               cond_name[c], (double)fst[c].wait_ns / 1e3 / (double)(fst[c].runs ? fst[c].runs : 1),
               (double)st[c].wait_ns / 1e3 / (double)(st[c].runs ? st[c].runs : 1), st[c].active,
               (unsigned long long)st[c].late_runs, (unsigned long long)st[c].runs,
               (unsigned long long)st[c].steps_down, (unsigned long long)st[c].probes);
    for (int k = 0; k < n_models; k++)
        decoder_free(&dec[k]);
    exo_pool_free(pool[0]);
    exo_pool_free(pool[1]);
    return 0;
}
