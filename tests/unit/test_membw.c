/* Bandwidth probe: one buffer serves repeated reads (exo bench keeps it for
 * the whole run), every size the pool splits unevenly works (ASan catches a
 * read past the end), and the result is a plausible rate. */
#include "core/alloc.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/membw.h"

#include <criterion/criterion.h>
#include <string.h>

/* Read side by side or front to back, every line is read exactly once:
 * the xor of them all is the same for every stream count. */
Test(membw, every_line_is_read_once_whatever_the_streams)
{
    const size_t sizes[] = {64, 256, 4096 + 64, 3 * 4096 + 576, 65536 + 320};
    unsigned char *buf = exo_alloc_aligned(65536 + 4096);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < 65536 + 4096; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        unsigned long long g1 = exo_membw_sum_generic(buf, sizes[k], 1, 0);
        for (int streams = 1; streams <= 7; streams++)
            cr_assert_eq(exo_membw_sum_generic(buf, sizes[k], streams, streams == 1 ? 4096 : 0), g1,
                         "generic, %zu bytes, %d streams", sizes[k], streams);
        if (exo_cpu_isa() < EXO_ISA_AVX512)
            continue;
        unsigned long long a1 = exo_membw_sum_avx512(buf, sizes[k], 1, 0);
        for (int streams = 1; streams <= 7; streams++) /* one stream prefetched too */
            cr_assert_eq(exo_membw_sum_avx512(buf, sizes[k], streams, streams == 1 ? 4096 : 0), a1,
                         "avx512, %zu bytes, %d streams", sizes[k], streams);
    }
    /* and a changed line changes it */
    unsigned long long before = exo_membw_sum_generic(buf, 65536, 4, 0);
    buf[40000] ^= 1;
    cr_assert_neq(exo_membw_sum_generic(buf, 65536, 4, 0), before);
    exo_free_aligned(buf);
}

Test(membw, repeated_reads_of_one_buffer_give_plausible_rates)
{
    const size_t sizes[] = {64, 4096 + 64, 3 * 4096 + 576, (size_t)8 << 20};
    for (int threads = 1; threads <= 3; threads++) {
        exo_pool *pool = exo_pool_create(threads);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            exo_membw *probe = exo_membw_create(sizes[k]);
            cr_assert_not_null(probe);
            for (int rep = 0; rep < 3; rep++) {
                double bw = rep == 2 ? exo_membw_read_streams(probe, pool, 1, 3, rep * 1024)
                                     : exo_membw_read(probe, pool, 2);
                /* small buffers time the dispatch more than the read; 8 MiB
                 * beats any emulator and no memory system reads 100 TB/s */
                double floor = sizes[k] >= ((size_t)8 << 20) ? 1e8 : 0;
                cr_assert(bw > floor && bw < 1e14, "size %zu threads %d: %g B/s", sizes[k],
                          threads, bw);
            }
            exo_membw_free(probe);
        }
        exo_pool_free(pool);
    }
    exo_membw_free(NULL);
}
