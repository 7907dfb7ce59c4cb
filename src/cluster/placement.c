/* Placement (see placement.h). Nodes are ranked once by available memory;
 * the smallest prefix of that ranking that fits is the placement, which is
 * exo's "smallest cycle that fits" when every node can reach every other. */
#include "cluster/placement.h"

#include "core/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

int exo_placement_split_layers(int n_layers, const uint64_t *weights, int n, int32_t *starts,
                               exo_err *err)
{
    if (n <= 0 || n_layers < n)
        return exo_err_set(err, EXO_EINVAL, "cannot split %d layers over %d nodes", n_layers, n);
    long double total = 0;
    for (int i = 0; i < n; i++)
        total += weights[i] ? (long double)weights[i] : 1.0L;
    /* Every node gets one layer; the rest goes by largest remainder. */
    int spare = n_layers - n, given = 0;
    int32_t *count = exo_calloc((size_t)n, sizeof *count);
    long double *rem = exo_calloc((size_t)n, sizeof *rem);
    for (int i = 0; i < n; i++) {
        long double share = (weights[i] ? (long double)weights[i] : 1.0L) / total * spare;
        count[i] = (int32_t)share;
        rem[i] = share - count[i];
        given += count[i];
    }
    while (given < spare) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (rem[i] > rem[best])
                best = i;
        count[best]++;
        rem[best] = -1;
        given++;
    }
    int32_t at = 0;
    for (int i = 0; i < n; i++) {
        starts[i] = at;
        at += count[i] + 1;
    }
    exo_free(count);
    exo_free(rem);
    return 0;
}

static int by_memory_desc(const void *a, const void *b)
{
    const exo_state_node *x = *(const exo_state_node *const *)a, *y = *(const exo_state_node *const *)b;
    if (x->info.memory_available != y->info.memory_available)
        return x->info.memory_available > y->info.memory_available ? -1 : 1;
    return strcmp(x->node_id.s, y->node_id.s);
}

int exo_placement_place(const exo_state *st, const exo_placement_request *req, exo_instance *out,
                        exo_err *err)
{
    memset(out, 0, sizeof *out);
    const exo_model_entry *m = req->model;
    if (m->n_layers <= 0)
        return exo_err_set(err, EXO_EINVAL, "model %s: config.json gives no num_hidden_layers", m->id);
    size_t n_all = exo_state_node_count(st);
    const exo_state_node **nodes = exo_calloc(n_all ? n_all : 1, sizeof *nodes);
    int n = 0;
    for (size_t i = 0; i < n_all; i++) {
        const exo_state_node *sn = exo_state_node_at(st, i);
        if (sn->info.backends)
            nodes[n++] = sn;
    }
    int rc = 0;
    if (n == 0) {
        rc = exo_err_set(err, EXO_EINVAL, "no nodes with a compute backend (is any worker running?)");
        goto out;
    }
    qsort(nodes, (size_t)n, sizeof *nodes, by_memory_desc);
    int min_nodes = req->min_nodes > 0 ? req->min_nodes : 1;
    if (min_nodes > n) {
        rc = exo_err_set(err, EXO_EINVAL, "min_nodes is %d but the cluster has %d node%s", min_nodes, n,
                         n == 1 ? "" : "s");
        goto out;
    }
    uint64_t need = (uint64_t)m->storage_bytes, have = 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        have += nodes[i]->info.memory_available;
        if (i + 1 >= min_nodes && have >= need) {
            k = i + 1;
            break;
        }
    }
    if (!k) {
        rc = exo_err_set(err, EXO_EINVAL,
                         "not enough memory for %s: it needs %.0f MiB, the cluster has %.0f MiB available",
                         m->id, need / MIB, have / MIB);
        goto out;
    }
    exo_sharding sharding = k == 1 ? EXO_SHARDING_PIPELINE : req->sharding;
    exo_instance_meta meta = k == 1 ? EXO_INSTANCE_META_MLX_RING : req->meta;
    if (sharding == EXO_SHARDING_TENSOR &&
        ((m->hidden_size && m->hidden_size % k) || (m->n_kv_heads && m->n_kv_heads % k))) {
        rc = exo_err_set(err, EXO_EINVAL,
                         "tensor sharding over %d nodes needs hidden_size (%d) and key/value heads (%d) "
                         "divisible by %d", k, m->hidden_size, m->n_kv_heads, k);
        goto out;
    }
    int32_t *starts = exo_calloc((size_t)k, sizeof *starts);
    uint64_t *weights = exo_calloc((size_t)k, sizeof *weights);
    for (int i = 0; i < k; i++)
        weights[i] = nodes[i]->info.memory_available;
    if (sharding == EXO_SHARDING_PIPELINE &&
        (rc = exo_placement_split_layers(m->n_layers, weights, k, starts, err))) {
        exo_free(starts);
        exo_free(weights);
        goto out;
    }
    exo_id_new(&out->instance_id);
    snprintf(out->model_id, sizeof out->model_id, "%s", m->id);
    out->sharding = sharding;
    out->meta = meta;
    out->n_shards = (size_t)k;
    out->shards = exo_calloc((size_t)k, sizeof *out->shards);
    for (int i = 0; i < k && !rc; i++) {
        exo_shard *s = &out->shards[i];
        exo_id_new(&s->runner_id);
        s->node_id = nodes[i]->node_id;
        s->device_rank = i;
        s->world_size = k;
        s->n_layers = m->n_layers;
        s->start_layer = sharding == EXO_SHARDING_PIPELINE ? starts[i] : 0;
        s->end_layer = sharding == EXO_SHARDING_PIPELINE && i + 1 < k ? starts[i + 1] : m->n_layers;
        uint64_t share = (uint64_t)((long double)need * (s->end_layer - s->start_layer) / m->n_layers);
        if (share > nodes[i]->info.memory_available)
            rc = exo_err_set(err, EXO_EINVAL,
                             "node %s cannot hold layers %d-%d of %s: needs %.0f MiB, has %.0f MiB",
                             s->node_id.s, s->start_layer, s->end_layer, m->id, share / MIB,
                             nodes[i]->info.memory_available / MIB);
    }
    exo_free(starts);
    exo_free(weights);
    if (rc)
        exo_instance_clear(out);
out:
    exo_free(nodes);
    return rc;
}
