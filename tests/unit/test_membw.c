/* Bandwidth probe: one buffer serves repeated reads (exo bench keeps it for
 * the whole run), every size the pool splits unevenly works (ASan catches a
 * read past the end), and the result is a plausible rate. */
#include "core/threadpool.h"
#include "engine/cpu/membw.h"

#include <criterion/criterion.h>

Test(membw, repeated_reads_of_one_buffer_give_plausible_rates)
{
    const size_t sizes[] = {64, 4096 + 64, 3 * 4096 + 576, (size_t)8 << 20};
    for (int threads = 1; threads <= 3; threads++) {
        exo_pool *pool = exo_pool_create(threads);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            exo_membw *probe = exo_membw_create(sizes[k]);
            cr_assert_not_null(probe);
            for (int rep = 0; rep < 3; rep++) {
                double bw = exo_membw_read(probe, pool, 2);
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
