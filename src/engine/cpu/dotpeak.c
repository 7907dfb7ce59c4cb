/* Measures the integer dot product rate (dotpeak.h): every thread of the
 * pool runs the same fixed number of vpdpbusd rounds, and the rate is what
 * they all did over the time the slowest took. */
#include "engine/cpu/dotpeak.h"

#include "core/clock.h"
#include "core/cpu_features.h"

enum { ROUNDS = 1 << 21 }; /* 12 instructions each: ~3 ms a round at 2 a cycle and 4 GHz */

typedef struct {
    volatile unsigned long long sink;
} peak_job;

static void peak_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    peak_job *j = ctx;
    unsigned long long s = exo_dot_peak_avx512(ROUNDS, ith + 1);
    if (s == 42)
        j->sink = s;
}

double exo_dot_peak(exo_pool *pool)
{
    if (exo_cpu_isa() < EXO_ISA_AVX512)
        return 0;
    peak_job j = {0};
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = exo_clock_seconds();
        exo_pool_run(pool, peak_worker, &j);
        double dt = exo_clock_seconds() - t0;
        double rate = (double)exo_pool_size(pool) * ROUNDS * 12 * 64 / dt;
        best = dt > 0 && rate > best ? rate : best;
    }
    return best;
}
