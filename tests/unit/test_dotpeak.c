/* Integer dot product peak probe: the loop does the products it counts
 * (its value matches the same arithmetic done in scalar code), and the
 * rate is plausible. */
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/dotpeak.h"

#include <criterion/criterion.h>
#include <stdint.h>

/* What exo_dot_peak_avx512(iters, seed) returns, lane by lane in scalar
 * int32 arithmetic (wrapping, as vpdpbusd's adds do). */
static unsigned long long model(long iters, int seed)
{
    uint32_t a = (uint32_t)(seed | 0x01010101), b = (uint32_t)(seed ^ 0x02030405);
    int32_t dot = 0;
    for (int k = 0; k < 4; k++)
        dot += (int32_t)(uint8_t)(a >> (8 * k)) * (int32_t)(int8_t)(b >> (8 * k));
    uint32_t lane = 0;
    for (int i = 0; i < 12; i++)
        lane += (uint32_t)(i + seed) + (uint32_t)iters * (uint32_t)dot;
    return (unsigned long long)(int32_t)(16u * lane);
}

Test(dotpeak, the_loop_does_the_products_it_counts)
{
    if (exo_cpu_isa() < EXO_ISA_AVX512)
        cr_skip_test("no AVX-512 VNNI");
    const long iters[] = {0, 1, 7, 1000};
    const int seeds[] = {1, 2, 0x7f, 0x35};
    for (int i = 0; i < 4; i++)
        for (int s = 0; s < 4; s++)
            cr_assert_eq(exo_dot_peak_avx512(iters[i], seeds[s]), model(iters[i], seeds[s]), "iters %ld seed %d",
                         iters[i], seeds[s]);
}

Test(dotpeak, the_rate_is_plausible)
{
    for (int threads = 1; threads <= 2; threads++) {
        exo_pool *pool = exo_pool_create(threads);
        double peak = exo_dot_peak(pool);
        if (exo_cpu_isa() < EXO_ISA_AVX512)
            cr_assert_eq(peak, 0);
        else /* a 512-bit VNNI unit at any clock; no CPU core does 10^13 a second */
            cr_assert(peak > 1e9 && peak < 1e13 * threads, "%d threads: %g products/s", threads, peak);
        exo_pool_free(pool);
    }
}
