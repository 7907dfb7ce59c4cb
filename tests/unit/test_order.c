/* exo_order_desc against a comparison sort by (value desc, id asc), NaN
 * last, -0 tied with +0: random rows of many lengths, with heavy ties, the
 * infinities and NaN, over contiguous and scattered ids. */
#include "engine/order.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const float *ref_x;
static int by_value_desc(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float xa = ref_x[ia], xb = ref_x[ib];
    int na = isnan(xa), nb = isnan(xb);
    if (na != nb)
        return na ? 1 : -1;
    if (!na && xa != xb)
        return xa > xb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* kind 0: normal-ish spread; 1: eight distinct values (ties everywhere);
 * 2: specials mixed in (+-0, +-inf, NaN, denormals, extremes). */
static float value(int kind)
{
    if (kind == 1)
        return (float)(next_u32() % 8) - 4.0f;
    if (kind == 2 && next_u32() % 4 == 0) {
        static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f};
        return specials[next_u32() % (sizeof specials / sizeof *specials)];
    }
    return ((float)(next_u32() % 2000001) - 1000000.0f) / 300000.0f;
}

Test(order, same_as_a_comparison_sort)
{
    static const int lengths[] = {0, 1, 2, 3, 17, 256, 513, 4096, 20011, 128256};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++)
        for (int kind = 0; kind < 3; kind++)
            for (int stride = 1; stride <= 3; stride += 2) {
                int n = lengths[li], V = n * stride + 1;
                float *x = malloc(sizeof(float) * (size_t)V);
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
                int32_t *want = malloc(sizeof(int32_t) * (size_t)(n + 1));
                uint64_t *scratch = malloc(2 * sizeof(uint64_t) * (size_t)(n + 1));
                for (int i = 0; i < V; i++)
                    x[i] = value(kind);
                for (int i = 0; i < n; i++)
                    ids[i] = want[i] = i * stride; /* ascending, as a scan makes them */
                ref_x = x;
                qsort(want, (size_t)n, sizeof(int32_t), by_value_desc);
                exo_order_desc(x, ids, n, scratch);
                int bad = -1;
                for (int i = 0; i < n && bad < 0; i++)
                    if (ids[i] != want[i])
                        bad = i;
                cr_assert(bad < 0, "n %d kind %d stride %d: position %d holds id %d (%g), a comparison sort %d (%g)",
                          n, kind, stride, bad, ids[bad], (double)x[ids[bad]], want[bad], (double)x[want[bad]]);
                free(x);
                free(ids);
                free(want);
                free(scratch);
            }
}

/* Rows whose keys share their top digits (values of one sign and exponent:
 * the passes that would move nothing are skipped) and rows all one value. */
Test(order, skipped_passes_and_constant_rows)
{
    enum { N = 5000 };
    float *x = malloc(sizeof(float) * N);
    int32_t ids[N], want[N];
    uint64_t *scratch = malloc(2 * sizeof(uint64_t) * N);
    for (int kind = 0; kind < 3; kind++) {
        for (int i = 0; i < N; i++) {
            x[i] = kind == 0 ? 1.0f + (float)(next_u32() % 1024) / 1024.0f /* one exponent */
                   : kind == 1 ? -2.5f                                    /* constant */
                               : 1.0f + (float)(next_u32() % 4) * 0x1p-23f; /* low bits only */
            ids[i] = want[i] = i;
        }
        ref_x = x;
        qsort(want, N, sizeof(int32_t), by_value_desc);
        exo_order_desc(x, ids, N, scratch);
        cr_assert(!memcmp(ids, want, sizeof ids), "kind %d differs from a comparison sort", kind);
    }
    free(x);
    free(scratch);
}
