/* CLOCK_MONOTONIC wrappers (see clock.h). */
#include "core/clock.h"

#include <time.h>

uint64_t exo_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double exo_clock_seconds(void) { return (double)exo_clock_ns() * 1e-9; }
