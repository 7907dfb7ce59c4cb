/* Placement: which nodes run a model, in which ring order, and which
 * layers each one holds (exo-reference §2.5, exo's place_instance).
 *
 *   - candidates are the nodes the State knows that have a compute backend,
 *     a node with several GPUs once per GPU (a rank each, named by the
 *     shard's device; its places share the node's memory evenly and link
 *     over loopback); "nodes" below means such places;
 *     among sets of one size, those with more nodes that already have the
 *     model on disk win (the others download their shard first), then
 *     the one with the most available memory;
 *   - a set of nodes can host an instance when its ranks form a ring in the
 *     topology: one node always does; several need a directed cycle through
 *     all of them over the State's edges (exo's "cycles of the topology");
 *   - the set must have at least min_nodes nodes and hold the weights in
 *     its available memory. When no node count is asked for (min_nodes 1)
 *     and every candidate reports its memory bandwidth, the set with the
 *     highest predicted decode speed wins (exo_placement_predict; fewer
 *     nodes unless more are 2% faster); otherwise the smallest such sets
 *     win, ranked as above, then by node ids (deterministic);
 *   - one node is always Pipeline + MlxRing (exo forces this); MlxJaccl
 *     (RDMA) needs RDMA links, which no node reports yet;
 *   - Tensor needs the card to allow it and hidden_size and
 *     num_key_value_heads divisible by the node count; every rank holds all
 *     layers;
 *   - Pipeline splits layers in proportion to available memory (largest
 *     remainder, at least one layer per node) and each node's share of the
 *     weights must fit its memory.
 * Pure: reads the State, allocates the result. */
#ifndef EXO_CLUSTER_PLACEMENT_H
#define EXO_CLUSTER_PLACEMENT_H

#include "cluster/state.h"

typedef struct exo_placement_request {
    const exo_model_card *card;
    exo_sharding          sharding;
    exo_instance_meta     meta;
    int                   min_nodes; /* >= 1 */
    int                   exact_nodes; /* > 0: only sets of exactly this size (previews) */
} exo_placement_request;

/* Fills *out (fresh ids for the instance and its runners; clear with
 * exo_instance_clear). EXO_EINVAL with the reason when no placement fits:
 * "not enough memory for X: it needs A MiB, the largest ring of N nodes
 * has B MiB available", "nodes a and b have no link between them", tensor
 * divisibility... */
int exo_placement_place(const exo_state *st, const exo_placement_request *req, exo_instance *out,
                        exo_err *err);

/* Predicted decode speed of one request on an instance, tokens/s, from
 * what the State measured: each node's memory read bandwidth (decode
 * streams its share of the weights once per token) and the ring's links
 * (round-trip latency, bandwidth). Pipeline: the ranks' times add up, plus
 * one hop of hidden states per link; tensor: the slowest rank's share, plus
 * two all-reduces of the hidden state per layer. 0 when a node's bandwidth
 * or a link is not known. */
double exo_placement_predict(const exo_state *st, const exo_instance *inst, const exo_model_card *card);

/* Every option for a model, as exo's /instance/previews: for each sharding
 * x instance meta x node count 1..N, the placement or why there is none.
 * Appended to a JSON array of {model_id, sharding, instance_meta,
 * node_count, instance|null, memory_delta_by_node, error|null,
 * predicted_tokens_per_second|null}. */
void exo_placement_previews(const exo_state *st, const exo_model_card *card, json_t *out);

/* A pipeline's layers over n nodes in proportion to weights, counting the
 * LM head (read every token by the last rank, vocab x hidden at the
 * checkpoint's width) as the layers its bytes make, so the last rank gets
 * fewer layers and every rank reads about its share of the bytes each
 * token. Each node keeps at least one layer. */
int exo_placement_pipeline_split(const exo_model_card *card, const uint64_t *weights, int n,
                                 int32_t *starts, exo_err *err);

/* Splits n_layers over n nodes in proportion to weights (largest remainder,
 * each node >= 1 layer): writes n start layers (end = next start or
 * n_layers). EXO_EINVAL if n_layers < n. Exposed for tests. */
int exo_placement_split_layers(int n_layers, const uint64_t *weights, int n, int32_t *starts,
                               exo_err *err);

#endif
