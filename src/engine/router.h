/* Top-k expert choice of a mixture-of-experts router (see exo_moe_router
 * in backend.h), on host memory. */
#ifndef EXO_ENGINE_ROUTER_H
#define EXO_ENGINE_ROUTER_H

#include "engine/backend.h"

#include <stdint.h>

/* For each of T rows of router logits (T, E): the router's k experts, best
 * first, and their weights, into idx and w (T * k each). bias: the sigmoid
 * router's correction bias in host memory (r->bias is ignored), or NULL.
 * EXO_EINVAL when E > 4096 or k > E. */
int exo_moe_route_rows(const exo_moe_router *r, const float *logits, const float *bias, int T, int32_t *idx,
                       float *w);

/* The k (expert, weight) pairs of one token in increasing expert order:
 * the order decode adds the experts' outputs in (model.c), as a prompt's
 * rows take them. */
void exo_moe_by_expert(int32_t *idx, float *w, int k);

#endif
