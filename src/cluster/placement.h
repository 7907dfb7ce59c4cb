/* Placement: which nodes run a model, and which layers each one holds.
 *
 * exo's rules (exo-reference §2.5), minus what needs a topology we do not
 * gather yet (cycles, interface priorities):
 *   - candidates are the nodes the State knows with a compute backend;
 *   - use the fewest nodes (at least min_nodes) whose available memory
 *     holds the model's weights, taking the nodes with the most available
 *     memory first (ties: node id order, so placement is deterministic);
 *   - one node is always Pipeline + MlxRing (exo forces this);
 *   - Tensor needs hidden_size and num_key_value_heads divisible by the
 *     node count, and gives every rank all layers;
 *   - Pipeline splits layers in proportion to available memory (largest
 *     remainder, at least one layer per node) and each node's share of the
 *     weights must fit its memory.
 * Pure: reads the State, allocates the result. */
#ifndef EXO_CLUSTER_PLACEMENT_H
#define EXO_CLUSTER_PLACEMENT_H

#include "cluster/state.h"
#include "download/model_store.h"

typedef struct exo_placement_request {
    const exo_model_entry *model;
    exo_sharding           sharding;
    exo_instance_meta      meta;
    int                    min_nodes; /* >= 1 */
} exo_placement_request;

/* Fills *out (fresh ids for the instance and its runners; clear with
 * exo_instance_clear). EXO_EINVAL with the reason when no placement fits
 * ("not enough memory: needs X MiB, the cluster has Y MiB available", "no
 * nodes with a compute backend", tensor divisibility...). */
int exo_placement_place(const exo_state *st, const exo_placement_request *req, exo_instance *out,
                        exo_err *err);

/* Splits n_layers over n nodes in proportion to weights (largest remainder,
 * each node >= 1 layer): writes n start layers (end = next start or
 * n_layers). EXO_EINVAL if n_layers < n. Exposed for tests. */
int exo_placement_split_layers(int n_layers, const uint64_t *weights, int n, int32_t *starts,
                               exo_err *err);

#endif
