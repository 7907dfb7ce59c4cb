/* Measures this machine's memory read bandwidth the way decode uses memory:
 * every thread of the pool streams its share of a buffer much larger than
 * the caches. The best of several passes is reported, in bytes/second.
 * It is the physical limit that `exo bench` compares decode against. */
#ifndef EXO_ENGINE_CPU_MEMBW_H
#define EXO_ENGINE_CPU_MEMBW_H

#include "core/threadpool.h"

#include <stddef.h>

/* Returns bytes/s, or 0 if the buffer could not be allocated. */
double exo_membw_read(exo_pool *pool, size_t bytes, int passes);

/* Internal: sums a range with wide loads; returns a value so the loads are
 * not optimised away. */
unsigned long long exo_membw_sum_avx512(const void *p, size_t bytes);

#endif
