/* The order the sampler's filters walk: token ids by their logits, largest
 * first, ties by the smaller id. A comparison sort through an index (qsort_r)
 * took 18-22 ms over a 128k vocabulary, which top-p pays whenever its kept
 * set is long (a flat distribution); this is a radix sort on the values'
 * bits, a few passes over the ids. */
#ifndef EXO_ENGINE_ORDER_H
#define EXO_ENGINE_ORDER_H

#include <stdint.h>

/* Reorders ids[0 .. n), given in ascending order (as a scan of the
 * vocabulary makes them), so that x[ids[i]] never increases, equal values
 * keeping ascending ids; -0 equals +0, NaN comes after every number.
 * scratch holds 2n values. */
void exo_order_desc(const float *x, int32_t *ids, int n, uint64_t *scratch);

#endif
