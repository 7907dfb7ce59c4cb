/* Memory read bandwidth measurement (see membw.h). */
#include "engine/cpu/membw.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu_features.h"

#include <stdint.h>
#include <string.h>

typedef struct bw_job {
    const unsigned char *buf;
    size_t bytes;
    int streams;
    size_t prefetch;
    volatile unsigned long long sink;
} bw_job;

/* `streams` equal parts of the range side by side, a line of each a step,
 * then what the parts (multiples of 256 bytes) leave as one stream */
unsigned long long exo_membw_sum_generic(const void *p, size_t bytes, int streams, size_t prefetch)
{
    const size_t part = bytes / (size_t)streams / 256 * 256;
    unsigned long long a[8] = {0};
    for (size_t off = 0; off < part; off += 64)
        for (int s = 0; s < streams; s++) {
            const unsigned long long *v = (const void *)((const char *)p + (size_t)s * part + off);
            if (prefetch)
                __builtin_prefetch((const char *)v + prefetch);
            for (int j = 0; j < 8; j++)
                a[j] ^= v[j];
        }
    for (size_t off = (size_t)streams * part; off + 64 <= bytes; off += 64) {
        const unsigned long long *v = (const void *)((const char *)p + off);
        for (int j = 0; j < 8; j++)
            a[j] ^= v[j];
    }
    return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

static void bw_worker(void *p, int ith, int nth)
{
    bw_job *j = p;
    long b, e;
    exo_split_range((long)j->bytes, 4096, ith, nth, &b, &e);
    unsigned long long s = exo_cpu_isa() >= EXO_ISA_AVX512
                               ? exo_membw_sum_avx512(j->buf + b, (size_t)(e - b), j->streams, j->prefetch)
                               : exo_membw_sum_generic(j->buf + b, (size_t)(e - b), j->streams, j->prefetch);
    if (s == 42)
        j->sink = s;
}

struct exo_membw {
    unsigned char *buf;
    size_t bytes;
};

exo_membw *exo_membw_create(size_t bytes)
{
    exo_membw *probe = exo_calloc(1, sizeof *probe);
    unsigned char *buf = exo_alloc_aligned(bytes);
    if (!probe || !buf) {
        exo_free(probe);
        exo_free_aligned(buf);
        return NULL;
    }
    /* Every byte written, with data no two pages share: pages of zeros (a
     * byte per page written with (unsigned char)(i), which is 0 at every
     * multiple of 4096, left exactly that) can be backed by one shared page
     * or merged by the host, and reading them measured more than twice
     * what a streaming read of real data gets on an EPYC guest (issue 16). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    probe->buf = buf;
    probe->bytes = bytes;
    return probe;
}

void exo_membw_free(exo_membw *probe)
{
    if (!probe)
        return;
    exo_free_aligned(probe->buf);
    exo_free(probe);
}

double exo_membw_read_streams(exo_membw *probe, exo_pool *pool, int passes, int streams, size_t prefetch)
{
    bw_job j = {probe->buf, probe->bytes, streams < 1 ? 1 : streams, prefetch, 0};
    double best = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = exo_clock_seconds();
        exo_pool_run(pool, bw_worker, &j);
        double dt = exo_clock_seconds() - t0;
        if (dt > 0 && (double)probe->bytes / dt > best)
            best = (double)probe->bytes / dt;
    }
    return best;
}

double exo_membw_read(exo_membw *probe, exo_pool *pool, int passes)
{
    double best = 0;
    for (int p = 0; p < passes; p++)
        for (int way = 0; way <= 3; way++) { /* 1, 2, EXO_MEMBW_STREAMS streams; 1 prefetched */
            double bw = way < 3 ? exo_membw_read_streams(probe, pool, 1, 1 << (way == 2 ? 2 : way), 0)
                                : exo_membw_read_streams(probe, pool, 1, 1, EXO_MEMBW_PREFETCH);
            best = bw > best ? bw : best;
        }
    return best;
}
