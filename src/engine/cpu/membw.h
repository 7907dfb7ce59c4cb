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

/* Returns the best of `passes` reads of the whole buffer, in bytes/s, each
 * pass reading it four times: every thread its share front to back as
 * one stream, as 2 and as EXO_MEMBW_STREAMS parts side by side, and as one
 * stream software-prefetched EXO_MEMBW_PREFETCH bytes ahead (the hardware
 * prefetchers stop at 4 KiB pages; the GEMV kernels prefetch, and a
 * panels GEMV's one stream a thread read 121% of the other three ways at
 * a low moment of a Zen 5 guest, PERFORMANCE.md). The limit is what any
 * of them gets. On a Zen 5 guest, rounds of 1, 2, 4 and 8
 * streams a thread in turn (2 threads, 1 GiB) had their best at 49.5,
 * 63.6, 72.3 and 72.1 GB/s in one run and 53.4, 58.4, 52.7 and 54.0 in
 * the next: which way reads fastest changes with the host's load, and the
 * GEMV reads its row block's rows, a page apart, side by side
 * (PERFORMANCE.md). */
#define EXO_MEMBW_STREAMS 4
#define EXO_MEMBW_PREFETCH 4096
double exo_membw_read(exo_membw *probe, exo_pool *pool, int passes);

/* The best of `passes` reads with `streams` parts a thread side by side,
 * each line prefetched `prefetch` bytes ahead in its part (0: none). */
double exo_membw_read_streams(exo_membw *probe, exo_pool *pool, int passes, int streams, size_t prefetch);

/* Internal: xor every whole 64-byte line of a range, `streams` equal parts
 * side by side, then the rest; the value keeps the loads from being
 * optimised away and does not depend on `streams`. */
unsigned long long exo_membw_sum_avx512(const void *p, size_t bytes, int streams, size_t prefetch);
unsigned long long exo_membw_sum_generic(const void *p, size_t bytes, int streams, size_t prefetch);

#endif
