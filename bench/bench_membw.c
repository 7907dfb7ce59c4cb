/* Ways of measuring the read bandwidth, side by side: rounds that read one
 * 1 GiB buffer with 1, 2, 4 and 8 streams a thread, with one stream a
 * thread software-prefetched 4 and 16 KiB ahead (membw.c), and copy it
 * with memcpy (bytes read + written), in turn, so drift in the host's load
 * hits every way alike. Prints each way's best and mean and the ratio of
 * each best to one stream's. What `exo bench` and node info take as the
 * limit is the best of 1, 2 and 4 streams and one prefetched 4 KiB ahead
 * (membw.h says why).
 *
 * Usage: bench_membw [threads=2] [rounds=15] */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/threadpool.h"
#include "engine/cpu/membw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *src, *dst;
    size_t bytes;
} copy_job;

static void copy_worker(void *p, int ith, int nth)
{
    copy_job *j = p;
    long b, e;
    exo_split_range((long)j->bytes, 4096, ith, nth, &b, &e);
    memcpy(j->dst + b, j->src + b, (size_t)(e - b));
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 15;
    const size_t bytes = (size_t)1 << 30;
    exo_pool *pool = exo_pool_create(threads);
    exo_membw *probe = exo_membw_create(bytes);
    copy_job cj = {exo_alloc_aligned(bytes), exo_alloc_aligned(bytes), bytes};
    if (!pool || !probe || !cj.src || !cj.dst) {
        fprintf(stderr, "bench_membw: out of memory\n");
        return 1;
    }
    memset(cj.src, 0x5a, bytes);
    memset(cj.dst, 0xa5, bytes);
    enum { WAYS = 7 };
    const char *name[WAYS] = {"read, 1 stream a thread", "read, 2 streams a thread", "read, 4 streams a thread",
                              "read, 8 streams a thread", "read, 1 prefetched 4 KiB", "read, 1 prefetched 16 KiB",
                              "memcpy (read + write)"};
    double best[WAYS] = {0}, sum[WAYS] = {0};
    exo_membw_read(probe, pool, 1); /* the first pass after the fill is slow */
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < WAYS; k++) {
            double bw;
            if (k < 4) {
                bw = exo_membw_read_streams(probe, pool, 1, 1 << k, 0);
            } else if (k < 6) { /* software prefetch ahead, as the GEMV kernels do */
                bw = exo_membw_read_streams(probe, pool, 1, 1, k == 4 ? 4096 : 16384);
            } else {
                double t0 = exo_clock_seconds();
                exo_pool_run(pool, copy_worker, &cj);
                bw = 2.0 * (double)bytes / (exo_clock_seconds() - t0);
            }
            sum[k] += bw;
            best[k] = bw > best[k] ? bw : best[k];
        }
    printf("%d threads, 1 GiB, %d rounds of every way in turn\n", exo_pool_size(pool), rounds);
    for (int k = 0; k < WAYS; k++)
        printf("%-27s best %6.1f GB/s  mean %6.1f GB/s  best x%.2f one stream's\n", name[k], best[k] / 1e9,
               sum[k] / rounds / 1e9, best[k] / best[0]);
    exo_free_aligned(cj.src);
    exo_free_aligned(cj.dst);
    exo_membw_free(probe);
    exo_pool_free(pool);
    return 0;
}
