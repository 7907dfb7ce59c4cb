/* Measures this machine's memory read bandwidth the way decode uses memory:
 * every thread of the pool streams its share of a buffer much larger than
 * the caches. The best of several passes is reported, in bytes/second.
 * It is the physical limit that `exo bench` compares decode against.
 *
 * The buffer is a separate object that the caller keeps for as long as it
 * measures anything: freeing a gigabyte hands it back to the hypervisor on
 * virtual machines with free page reporting (virtio-balloon), which reclaims
 * it in rounds two seconds apart that stall the guest for 20-70 ms each; a
 * probe freed just before decode is timed slowed decode by 3-7%. */
#ifndef EXO_ENGINE_CPU_MEMBW_H
#define EXO_ENGINE_CPU_MEMBW_H

#include "core/threadpool.h"

#include <stddef.h>

typedef struct exo_membw exo_membw;

/* Allocates and faults in a buffer of `bytes`; NULL if out of memory. */
exo_membw *exo_membw_create(size_t bytes);
void exo_membw_free(exo_membw *probe);

/* Returns the best of `passes` reads of the whole buffer, in bytes/s. */
double exo_membw_read(exo_membw *probe, exo_pool *pool, int passes);

/* Internal: sums a range with wide loads; returns a value so the loads are
 * not optimised away. */
unsigned long long exo_membw_sum_avx512(const void *p, size_t bytes);

#endif
