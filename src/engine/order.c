/* Radix ordering of ids by value (see order.h). Each id travels with its
 * value's key in one 64-bit word, the key in the high half: the bits of the
 * float turned so that unsigned order is descending value order. Three
 * least-significant-digit passes of 11 bits over the key are a stable sort,
 * so ids that came ascending stay ascending among equal keys, which is the
 * tie order a comparison sort by (value desc, id asc) gives. A pass whose
 * digit is the same for every key moves nothing and is skipped (the top
 * bits of a row's logits often are). */
#include "engine/order.h"

#include <string.h>

#define DIGIT_BITS 11
#define PASSES     3 /* 33 bits cover the 32 of a key */
#define BUCKETS    (1 << DIGIT_BITS)

/* Unsigned order of the result = descending order of the values. */
static uint32_t desc_key(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if (v != v)
        return UINT32_MAX; /* NaN: after everything */
    if (u == 0x80000000u)
        u = 0; /* -0 == +0, so they tie and go by id */
    uint32_t asc = u & 0x80000000u ? ~u : u | 0x80000000u;
    return ~asc;
}

void exo_order_desc(const float *x, int32_t *ids, int n, uint64_t *scratch)
{
    if (n < 2)
        return;
    uint64_t *a = scratch, *b = scratch + n;
    uint32_t count[PASSES][BUCKETS] = {{0}}; /* 24 KB of stack */
    for (int i = 0; i < n; i++) {
        uint32_t key = desc_key(x[ids[i]]);
        a[i] = (uint64_t)key << 32 | (uint32_t)ids[i];
        for (int p = 0; p < PASSES; p++)
            count[p][(key >> (p * DIGIT_BITS)) & (BUCKETS - 1)]++;
    }
    for (int p = 0; p < PASSES; p++) {
        int shift = 32 + p * DIGIT_BITS;
        uint32_t first = (uint32_t)(a[0] >> shift) & (BUCKETS - 1);
        if (count[p][first] == (uint32_t)n)
            continue; /* one digit for all: already in order */
        uint32_t at = 0;
        for (int d = 0; d < BUCKETS; d++) {
            uint32_t c = count[p][d];
            count[p][d] = at;
            at += c;
        }
        for (int i = 0; i < n; i++)
            b[count[p][(uint32_t)(a[i] >> shift) & (BUCKETS - 1)]++] = a[i];
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)(uint32_t)a[i];
}
