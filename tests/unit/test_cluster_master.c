/* Placement (layer split, memory, rings over the topology, models on disk,
 * forced single-node Pipeline, tensor divisibility, min_nodes, previews),
 * the master's command -> event rules, and the POST /instance JSON decoder
 * (round trip and rejections). */
#include "cluster/master.h"
#include "cluster/placement.h"
#include "core/alloc.h"

#include <criterion/criterion.h>
#include <string.h>

#define GIB (1024ull * 1024 * 1024)

static void apply(exo_state *st, exo_event *ev)
{
    exo_err err = {0};
    cr_assert_eq(exo_state_apply(st, exo_state_last_event_applied_idx(st) + 1, ev, &err), 0, "%s",
                 err.msg);
}

static exo_model_card model(int layers, uint64_t bytes)
{
    exo_model_card m;
    memset(&m, 0, sizeof m);
    snprintf(m.model_id, sizeof m.model_id, "org/model");
    m.n_layers = layers;
    m.storage_bytes = bytes;
    m.hidden_size = 64;
    m.n_kv_heads = 4;
    m.supports_tensor = true;
    return m;
}

/* A node with `avail` bytes free that has org/model on disk (or not). */
static void add_node_with(exo_state *st, const char *id, uint64_t avail, bool has_model)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_NODE_GATHERED_INFO);
    cr_assert_eq(exo_id_set(&ev.u.node_gathered_info.node_id, id, NULL), 0);
    ev.u.node_gathered_info.when_ms = 1;
    exo_node_info *in = &ev.u.node_gathered_info.info;
    in->memory_total = avail * 2;
    in->memory_available = avail;
    in->cpu_count = 4;
    snprintf(in->friendly_name, sizeof in->friendly_name, "%s", id);
    in->backends = 1u << EXO_BACKEND_CPU;
    if (has_model) {
        in->models.n = 1;
        in->models.v = exo_calloc(1, sizeof *in->models.v);
        in->models.v[0] = model(20, GIB);
    }
    apply(st, &ev);
    exo_event_clear(&ev);
}

static void add_node(exo_state *st, const char *id, uint64_t avail) { add_node_with(st, id, avail, true); }

static void add_edge(exo_state *st, const char *a, const char *b)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_TOPOLOGY_EDGE_CREATED);
    exo_topology_edge *e = &ev.u.topology_edge_created.edge;
    exo_id_set(&e->source, a, NULL);
    exo_id_set(&e->sink, b, NULL);
    snprintf(e->address, sizeof e->address, "10.0.0.1:52414");
    e->latency_us = 100;
    apply(st, &ev);
    exo_event_clear(&ev);
}

/* Edges both ways between every pair of the named nodes. */
static void full_mesh(exo_state *st, const char *const *ids, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j)
                add_edge(st, ids[i], ids[j]);
}

Test(placement, split_layers_proportional_largest_remainder)
{
    int32_t starts[3];
    uint64_t w[3] = {2, 1, 1};
    cr_assert_eq(exo_placement_split_layers(10, w, 3, starts, NULL), 0);
    /* 7 spare layers: 3.5, 1.75, 1.75 -> 3+1+1 = 5, remainders .75 .75 .5 give
     * the two extras to nodes 1 and 2: counts 1+3, 1+2, 1+2 = 4, 3, 3 */
    cr_assert_eq(starts[0], 0);
    cr_assert_eq(starts[1], 4);
    cr_assert_eq(starts[2], 7);
    uint64_t eq[2] = {5, 5};
    cr_assert_eq(exo_placement_split_layers(2, eq, 2, starts, NULL), 0);
    cr_assert_eq(starts[1], 1);
    cr_assert_eq(exo_placement_split_layers(1, eq, 2, starts, NULL), EXO_EINVAL);
}

Test(placement, single_node_is_pipeline_ring_with_all_layers)
{
    exo_state *st = exo_state_new();
    add_node(st, "n1", 8 * GIB);
    exo_model_card m = model(16, 1 * GIB);
    exo_placement_request req = {&m, EXO_SHARDING_TENSOR, EXO_INSTANCE_META_MLX_JACCL, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 1);
    cr_assert_eq(inst.sharding, EXO_SHARDING_PIPELINE);
    cr_assert_eq(inst.meta, EXO_INSTANCE_META_MLX_RING);
    cr_assert_eq(inst.shards[0].start_layer, 0);
    cr_assert_eq(inst.shards[0].end_layer, 16);
    cr_assert_str_eq(inst.shards[0].node_id.s, "n1");
    cr_assert_eq(exo_instance_validate(&inst, &err), 0, "%s", err.msg);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(placement, fewest_nodes_that_fit_most_memory_first)
{
    exo_state *st = exo_state_new();
    add_node(st, "small", 2 * GIB);
    add_node(st, "big", 6 * GIB);
    add_node(st, "mid", 4 * GIB);
    static const char *const all[] = {"small", "big", "mid"};
    full_mesh(st, all, 3);
    exo_model_card m = model(20, 9 * GIB);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 2, "big + mid hold 10 GiB >= 9");
    cr_assert_str_eq(inst.shards[0].node_id.s, "big");
    cr_assert_str_eq(inst.shards[1].node_id.s, "mid");
    cr_assert_eq(inst.shards[0].end_layer, inst.shards[1].start_layer);
    cr_assert_eq(inst.shards[1].end_layer, 20);
    cr_assert_eq(inst.shards[0].end_layer, 12, "6:4 split of 20 layers");
    exo_instance_clear(&inst);

    m.storage_bytes = 13 * GIB;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "not enough memory"), "%s", err.msg);

    m.storage_bytes = GIB;
    req.min_nodes = 4;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "min_nodes is 4 but the cluster has 3 nodes with a compute backend"), "%s", err.msg);

    req.min_nodes = 3;
    req.sharding = EXO_SHARDING_TENSOR;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL, "64 %% 3 != 0");
    cr_assert(strstr(err.msg, "divisible"), "%s", err.msg);
    req.min_nodes = 2;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.sharding, EXO_SHARDING_TENSOR);
    for (size_t i = 0; i < inst.n_shards; i++) {
        cr_assert_eq(inst.shards[i].start_layer, 0);
        cr_assert_eq(inst.shards[i].end_layer, 20);
    }
    exo_instance_clear(&inst);
    exo_state_free(st);
}

/* A node with `ram` available at `ram_bps` and n GPUs of `vram` each (1 GiB
 * used) reading at `gpu_bps`, whose CUDA ordinals start at first_ordinal
 * (CUDA_VISIBLE_DEVICES may hide the others). */
static void add_gpus_node(exo_state *st, const char *id, uint64_t ram, uint64_t ram_bps, int n, int first_ordinal,
                          uint64_t vram, uint64_t gpu_bps)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_NODE_GATHERED_INFO);
    cr_assert_eq(exo_id_set(&ev.u.node_gathered_info.node_id, id, NULL), 0);
    ev.u.node_gathered_info.when_ms = 1;
    exo_node_info *in = &ev.u.node_gathered_info.info;
    in->memory_total = 2 * ram;
    in->memory_available = ram;
    in->cpu_count = 8;
    in->mem_read_bps = ram_bps;
    snprintf(in->friendly_name, sizeof in->friendly_name, "%s", id);
    in->backends = (1u << EXO_BACKEND_CPU) | (n ? 1u << EXO_BACKEND_CUDA : 0);
    in->gpus.n = (size_t)n;
    in->gpus.v = n ? exo_calloc((size_t)n, sizeof *in->gpus.v) : NULL;
    for (int i = 0; i < n; i++) {
        in->gpus.v[i].index = first_ordinal + i;
        in->gpus.v[i].memory_total = vram;
        in->gpus.v[i].memory_used = GIB;
        in->gpus.v[i].memory_read_bps = gpu_bps;
    }
    apply(st, &ev);
    exo_event_clear(&ev);
}

/* A node's info with `ram` available at `ram_bps`, and a GPU of `vram`
 * (1 GiB of it used) reading at `gpu_bps` when vram > 0. */
static void add_speed_node(exo_state *st, const char *id, uint64_t ram, uint64_t ram_bps, uint64_t vram,
                           uint64_t gpu_bps)
{
    add_gpus_node(st, id, ram, ram_bps, vram ? 1 : 0, 0, vram, gpu_bps);
}

/* A one-request pipeline placement of card, which must go wholly to node want. */
static void place_whole_on(exo_state *st, exo_model_card *card, const char *want, exo_instance *inst)
{
    exo_placement_request req = {card, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst->n_shards, 1);
    cr_assert_str_eq(inst->shards[0].node_id.s, want);
}

/* A node with little memory but a GPU: a runner puts what fits on the GPU
 * (less the room it keeps back) and the rest on the CPU, so the node holds
 * a model its memory alone could not; so does a tensor-parallel rank, whose
 * share of every layer goes on its GPU the same way. */
Test(placement, a_gpu_node_holds_what_fits_its_gpu_and_memory)
{
    exo_state *st = exo_state_new();
    add_speed_node(st, "gpu", 4 * GIB, 0, 32 * GIB, 0);
    /* 4 GiB + (31 GiB free - 2 GiB kept back - 1 GiB) = 32 GiB */
    exo_model_card m = model(16, 30 * GIB);
    exo_instance inst;
    place_whole_on(st, &m, "gpu", &inst);
    exo_instance_clear(&inst);
    m.storage_bytes = 33 * GIB;
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "not enough memory"), "%s", err.msg);
    exo_state_free(st);

    /* two such nodes hold 2 x 32 GiB tensor parallel, not 2 x 4 GiB */
    st = exo_state_new();
    static const char *const ids[] = {"g0", "g1"};
    add_speed_node(st, "g0", 4 * GIB, 0, 32 * GIB, 0);
    add_speed_node(st, "g1", 4 * GIB, 0, 32 * GIB, 0);
    full_mesh(st, ids, 2);
    m.storage_bytes = 60 * GIB;
    req = (exo_placement_request){&m, EXO_SHARDING_TENSOR, EXO_INSTANCE_META_MLX_RING, 2, 0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 2);
    cr_assert_eq(inst.sharding, EXO_SHARDING_TENSOR);
    exo_instance_clear(&inst);
    m.storage_bytes = 65 * GIB;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    exo_state_free(st);
}

Test(placement, no_nodes)
{
    exo_state *st = exo_state_new();
    exo_model_card m = model(4, 1);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "no nodes"), "%s", err.msg);
    exo_state_free(st);
}

Test(placement, several_nodes_need_a_ring)
{
    exo_state *st = exo_state_new();
    add_node(st, "a", 5 * GIB);
    add_node(st, "b", 5 * GIB);
    add_node(st, "c", 5 * GIB);
    exo_model_card m = model(12, 9 * GIB);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL, "no edges: no ring");
    cr_assert(strstr(err.msg, "not linked in a ring"), "%s", err.msg);
    add_edge(st, "a", "b");
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL, "one direction is not a ring");
    add_edge(st, "b", "a");
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 2);
    cr_assert_str_eq(inst.shards[0].node_id.s, "a");
    cr_assert_str_eq(inst.shards[1].node_id.s, "b");
    exo_instance_clear(&inst);

    /* three nodes: a -> b -> c -> a is a ring, its reverse is not */
    m.storage_bytes = 14 * GIB;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    add_edge(st, "b", "c");
    add_edge(st, "c", "a");
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 3);
    cr_assert_str_eq(inst.shards[0].node_id.s, "a");
    cr_assert_str_eq(inst.shards[1].node_id.s, "b", "ring order follows the edges");
    cr_assert_str_eq(inst.shards[2].node_id.s, "c");
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(placement, nodes_with_the_model_on_disk_first)
{
    exo_state *st = exo_state_new();
    add_node_with(st, "empty", 64 * GIB, false);
    exo_model_card m = model(8, GIB);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "a node without the files downloads them: %s",
                 err.msg);
    cr_assert_str_eq(inst.shards[0].node_id.s, "empty");
    exo_instance_clear(&inst);
    add_node(st, "small", 2 * GIB);
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_str_eq(inst.shards[0].node_id.s, "small", "the node that has the files beats a bigger one");
    exo_instance_clear(&inst);
    m.storage_bytes = 3 * GIB; /* too big for "small": the download is worth it */
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_str_eq(inst.shards[0].node_id.s, "empty");
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(placement, rdma_and_tensor_rules)
{
    exo_state *st = exo_state_new();
    static const char *const ids[] = {"a", "b"};
    add_node(st, "a", 3 * GIB);
    add_node(st, "b", 3 * GIB);
    full_mesh(st, ids, 2);
    exo_model_card m = model(8, 5 * GIB);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_JACCL, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "RDMA"), "%s", err.msg);
    req.meta = EXO_INSTANCE_META_MLX_RING;
    req.sharding = EXO_SHARDING_TENSOR;
    m.supports_tensor = false;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "does not support tensor"), "%s", err.msg);
    m.supports_tensor = true;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.sharding, EXO_SHARDING_TENSOR);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(placement, previews_list_every_option_with_reasons)
{
    exo_state *st = exo_state_new();
    static const char *const ids[] = {"a", "b", "c"};
    add_node(st, "a", 4 * GIB);
    add_node(st, "b", 4 * GIB);
    add_node(st, "c", 4 * GIB);
    full_mesh(st, ids, 3);
    exo_model_card m = model(24, 6 * GIB);
    json_t *list = json_array();
    exo_placement_previews(st, &m, list);
    /* 1 node: too small (one entry: the forced Pipeline/MlxRing repeats are
     * folded); 2 and 3 nodes x Pipeline/Tensor x MlxRing/MlxJaccl */
    size_t ok = 0, bad = 0;
    bool saw_memory = false, saw_rdma = false, saw_tensor_div = false;
    size_t i;
    json_t *p;
    json_array_foreach(list, i, p) {
        json_t *e = json_object_get(p, "error");
        if (json_is_null(e)) {
            ok++;
            cr_assert(json_is_object(json_object_get(p, "instance")));
            cr_assert(json_object_size(json_object_get(p, "memory_delta_by_node")) >= 2);
        } else {
            bad++;
            const char *why = json_string_value(e);
            saw_memory |= strstr(why, "not enough memory") != NULL;
            saw_rdma |= strstr(why, "RDMA") != NULL;
            saw_tensor_div |= strstr(why, "divisible by 3") != NULL;
        }
    }
    cr_assert(saw_memory && saw_rdma && saw_tensor_div, "memory %d rdma %d tensor %d", saw_memory, saw_rdma,
              saw_tensor_div);
    cr_assert_eq(ok, 3, "Pipeline x 2 and 3 nodes, Tensor x 2 nodes");
    cr_assert(bad >= 4);
    json_decref(list);
    exo_state_free(st);
}

Test(master, places_a_model_too_big_for_one_node_across_two)
{
    exo_state *st = exo_state_new();
    static const char *const ids[] = {"a", "b"};
    add_node(st, "a", 3 * GIB);
    add_node(st, "b", 3 * GIB);
    full_mesh(st, ids, 2);
    exo_command place;
    exo_command_init(&place, EXO_COMMAND_PLACE_INSTANCE);
    place.u.place_instance.card = model(8, 5 * GIB);
    exo_event_list out = {0};
    exo_err err = {0};
    cr_assert_eq(exo_master_handle(st, &place, &out, &err), 0, "%s", err.msg);
    cr_assert_eq(out.n, 1);
    const exo_instance *inst = &out.v[0].u.instance_created.instance;
    cr_assert_eq(inst->n_shards, 2);
    cr_assert_eq(inst->shards[0].start_layer, 0);
    cr_assert_eq(inst->shards[0].end_layer, inst->shards[1].start_layer);
    cr_assert_eq(inst->shards[1].end_layer, 8);
    exo_event_list_clear(&out);
    place.u.place_instance.card.storage_bytes = 7 * GIB; /* more than both hold */
    cr_assert_eq(exo_master_handle(st, &place, &out, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "not enough memory"), "%s", err.msg);
    cr_assert_eq(out.n, 0);
    exo_command_clear(&place);
    exo_state_free(st);
}

Test(master, text_generation_task_names_its_origin)
{
    exo_state *st = exo_state_new();
    add_node(st, "n1", 8 * GIB);
    exo_command place;
    exo_command_init(&place, EXO_COMMAND_PLACE_INSTANCE);
    place.u.place_instance.card = model(4, GIB);
    exo_event_list out = {0};
    exo_err err = {0};
    cr_assert_eq(exo_master_handle(st, &place, &out, &err), 0, "%s", err.msg);
    apply(st, &out.v[0]);
    exo_command gen;
    exo_command_init(&gen, EXO_COMMAND_TEXT_GENERATION);
    snprintf(gen.u.text_generation.model_id, EXO_MODEL_ID_MAX, "org/model");
    gen.u.text_generation.params_json = exo_strdup("{}");
    exo_id_set(&gen.u.text_generation.origin, "api-node", NULL);
    cr_assert_eq(exo_master_handle(st, &gen, &out, &err), 0, "%s", err.msg);
    cr_assert_str_eq(out.v[1].u.task_created.task.node_id.s, "api-node");
    exo_event_list_clear(&out);
    exo_command_clear(&gen);
    exo_command_clear(&place);
    exo_state_free(st);
}

/* A state with one node and one instance of org/model on it. */
static exo_state *with_instance(exo_instance *inst_out)
{
    exo_state *st = exo_state_new();
    add_node(st, "n1", 8 * GIB);
    exo_model_card m = model(4, GIB);
    exo_placement_request req = {&m, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_INSTANCE_CREATED);
    cr_assert_eq(exo_placement_place(st, &req, &ev.u.instance_created.instance, NULL), 0);
    exo_instance_copy(inst_out, &ev.u.instance_created.instance);
    apply(st, &ev);
    exo_event_clear(&ev);
    return st;
}

static void handle_apply(exo_state *st, const exo_command *cmd, exo_event_list *out)
{
    exo_err err = {0};
    size_t from = out->n;
    cr_assert_eq(exo_master_handle(st, cmd, out, &err), 0, "%s", err.msg);
    for (size_t i = from; i < out->n; i++)
        apply(st, &out->v[i]);
}

static exo_command text_gen(void)
{
    exo_command c;
    exo_command_init(&c, EXO_COMMAND_TEXT_GENERATION);
    snprintf(c.u.text_generation.model_id, EXO_MODEL_ID_MAX, "org/model");
    c.u.text_generation.params_json = exo_strdup("{\"model\":\"org/model\"}");
    return c;
}

Test(master, text_generation_lifecycle)
{
    exo_instance inst;
    exo_state *st = with_instance(&inst);
    exo_event_list out = {0};
    exo_command gen = text_gen();
    handle_apply(st, &gen, &out);
    cr_assert_eq(out.n, 1);
    cr_assert_eq(out.v[0].kind, EXO_EVENT_TASK_CREATED);
    const exo_task *t = exo_state_task_for_command(st, &gen.command_id);
    cr_assert(t);
    cr_assert_eq(t->status, EXO_TASK_PENDING);
    cr_assert(exo_id_eq(&t->instance_id, &inst.instance_id));
    cr_assert_str_eq(t->params_json, "{\"model\":\"org/model\"}");

    exo_command cancel;
    exo_command_init(&cancel, EXO_COMMAND_TASK_CANCELLED);
    cancel.u.task_cancelled.cancelled_command_id = gen.command_id;
    handle_apply(st, &cancel, &out);
    cr_assert_eq(out.n, 2);
    cr_assert_eq(exo_state_task_for_command(st, &gen.command_id)->status, EXO_TASK_CANCELLED);
    handle_apply(st, &cancel, &out);
    cr_assert_eq(out.n, 2, "cancelling a cancelled task emits nothing");

    exo_command fin;
    exo_command_init(&fin, EXO_COMMAND_TASK_FINISHED);
    fin.u.task_finished.finished_command_id = gen.command_id;
    handle_apply(st, &fin, &out);
    cr_assert_eq(out.v[2].kind, EXO_EVENT_TASK_DELETED);
    cr_assert_null(exo_state_task_for_command(st, &gen.command_id));

    exo_err err = {0};
    cr_assert_eq(exo_master_handle(st, &fin, &out, &err), EXO_ENOENT);
    cr_assert_eq(out.n, 3, "errors emit nothing");

    exo_command other = text_gen();
    snprintf(other.u.text_generation.model_id, EXO_MODEL_ID_MAX, "org/absent");
    cr_assert_eq(exo_master_handle(st, &other, &out, &err), EXO_ENOENT);
    cr_assert(strstr(err.msg, "No instance found for model org/absent"), "%s", err.msg);
    exo_command place;
    exo_command_init(&place, EXO_COMMAND_PLACE_INSTANCE);
    place.u.place_instance.card = model(4, GIB);
    snprintf(place.u.place_instance.card.model_id, EXO_MODEL_ID_MAX, "org/absent");
    place.u.place_instance.card.storage_bytes = 1ull << 50;
    cr_assert_eq(exo_master_handle(st, &place, &out, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "not enough memory for org/absent"), "%s", err.msg);

    exo_command_clear(&gen);
    exo_command_clear(&other);
    exo_event_list_clear(&out);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(master, least_loaded_instance_and_delete_cancels)
{
    exo_instance a, b;
    exo_state *st = with_instance(&a);
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_INSTANCE_CREATED);
    exo_instance_copy(&ev.u.instance_created.instance, &a);
    exo_id_new(&ev.u.instance_created.instance.instance_id);
    exo_id_new(&ev.u.instance_created.instance.shards[0].runner_id);
    exo_instance_copy(&b, &ev.u.instance_created.instance);
    apply(st, &ev);
    exo_event_clear(&ev);

    exo_event_list out = {0};
    exo_command g[3];
    for (int i = 0; i < 3; i++) {
        g[i] = text_gen();
        handle_apply(st, &g[i], &out);
    }
    const exo_task *t0 = exo_state_task_for_command(st, &g[0].command_id);
    const exo_task *t1 = exo_state_task_for_command(st, &g[1].command_id);
    cr_assert(!exo_id_eq(&t0->instance_id, &t1->instance_id), "second request goes to the idle instance");
    cr_assert_eq(exo_state_active_task_count(st, &a.instance_id), 2);

    exo_command del;
    exo_command_init(&del, EXO_COMMAND_DELETE_INSTANCE);
    del.u.delete_instance.instance_id = a.instance_id;
    del.u.delete_instance.reason = exo_strdup("node n1 left");
    size_t from = out.n;
    handle_apply(st, &del, &out);
    cr_assert_eq(out.n - from, 3, "the deletion, then two cancels");
    cr_assert_eq(out.v[from].kind, EXO_EVENT_INSTANCE_DELETED);
    cr_assert_str_eq(out.v[from].u.instance_deleted.reason, "node n1 left");
    cr_assert_str_eq(out.v[from].u.instance_deleted.model_id, a.model_id);
    cr_assert_eq(out.v[from + 1].kind, EXO_EVENT_TASK_STATUS_UPDATED);
    cr_assert_eq(out.v[from + 2].kind, EXO_EVENT_TASK_STATUS_UPDATED);
    cr_assert_eq(exo_state_active_task_count(st, &a.instance_id), 0, "its requests are cancelled");
    cr_assert_null(exo_state_instance(st, &a.instance_id));
    const exo_deleted_instance *gone = exo_state_deleted_instance(st, &a.instance_id);
    cr_assert_not_null(gone, "the State remembers why it went");
    cr_assert_str_eq(gone->reason, "node n1 left");
    cr_assert_eq(exo_state_active_task_count(st, &b.instance_id), 1);
    exo_err err = {0};
    cr_assert_eq(exo_master_handle(st, &del, &out, &err), EXO_ENOENT);

    exo_command_clear(&del);
    for (int i = 0; i < 3; i++)
        exo_command_clear(&g[i]);
    exo_event_list_clear(&out);
    exo_instance_clear(&a);
    exo_instance_clear(&b);
    exo_state_free(st);
}

Test(master, instance_json_round_trip_and_rejections)
{
    exo_instance inst, back;
    exo_state *st = with_instance(&inst);
    json_t *j = exo_instance_to_json(&inst);
    exo_err err = {0};
    cr_assert_eq(exo_instance_from_json(j, &back, &err), 0, "%s", err.msg);
    cr_assert(exo_instance_equal(&inst, &back));
    exo_instance_clear(&back);
    json_decref(j);

    const char *bad[] = {
        "null", "{}", "{\"Bogus\":{}}", "{\"MlxRingInstance\":{}}",
        "{\"MlxRingInstance\":{\"instanceId\":\"i\",\"shardAssignments\":{\"modelId\":\"o/m\","
        "\"runnerToShard\":{},\"nodeToRunner\":{}}}}",
        "{\"MlxRingInstance\":{\"instanceId\":\"i\",\"shardAssignments\":{\"modelId\":\"o/m\","
        "\"runnerToShard\":{\"r\":{\"PipelineShardMetadata\":{\"deviceRank\":0,\"worldSize\":1,"
        "\"startLayer\":0,\"endLayer\":9,\"nLayers\":4}}},\"nodeToRunner\":{\"n\":\"r\"}}}}",
        "{\"MlxRingInstance\":{\"instanceId\":\"i\",\"shardAssignments\":{\"modelId\":\"o/m\","
        "\"runnerToShard\":{\"r\":{\"PipelineShardMetadata\":{\"deviceRank\":-1,\"worldSize\":1,"
        "\"startLayer\":0,\"endLayer\":4,\"nLayers\":4}}},\"nodeToRunner\":{\"n\":\"r\"}}}}",
        "{\"MlxRingInstance\":{\"instanceId\":\"i\",\"shardAssignments\":{\"modelId\":\"o/m\","
        "\"runnerToShard\":{\"r\":{\"PipelineShardMetadata\":{\"deviceRank\":0,\"worldSize\":1,"
        "\"startLayer\":0,\"endLayer\":4,\"nLayers\":4}}},\"nodeToRunner\":{\"n\":\"other\"}}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *b = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        cr_assert_eq(exo_instance_from_json(b, &back, &err), EXO_EINVAL, "case %zu accepted", i);
        json_decref(b);
    }
    const char *good = "{\"MlxRingInstance\":{\"instance_id\":\"i\",\"shard_assignments\":{\"model_id\":\"o/m\","
                       "\"runner_to_shard\":{\"r\":{\"PipelineShardMetadata\":{\"device_rank\":0,\"world_size\":1,"
                       "\"start_layer\":0,\"end_layer\":4,\"n_layers\":4}}},\"node_to_runner\":{\"n\":\"r\"}}}}";
    json_t *g = json_loads(good, 0, NULL);
    cr_assert_eq(exo_instance_from_json(g, &back, &err), 0, "snake_case: %s", err.msg);
    cr_assert_str_eq(back.shards[0].node_id.s, "n");
    exo_instance_clear(&back);
    json_decref(g);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

/* ---- speed predictions ------------------------------------------------------------- */

/* Nodes with a measured bandwidth (bytes/s) and links of a given round trip
 * and bandwidth (bits/s) both ways between all of them. */
static exo_state *speed_cluster(int n, uint64_t mem_bps, int64_t rtt_us, uint64_t link_bps)
{
    static const char *const ids[] = {"a", "b", "c", "d"};
    exo_state *st = exo_state_new();
    for (int i = 0; i < n; i++) {
        exo_event ev;
        exo_event_init(&ev, EXO_EVENT_NODE_GATHERED_INFO);
        exo_id_set(&ev.u.node_gathered_info.node_id, ids[i], NULL);
        ev.u.node_gathered_info.when_ms = 1;
        exo_node_info *in = &ev.u.node_gathered_info.info;
        in->memory_total = 16 * GIB;
        in->memory_available = 8 * GIB - (uint64_t)i; /* a fixed rank order */
        in->cpu_count = 2;
        in->mem_read_bps = mem_bps;
        snprintf(in->friendly_name, sizeof in->friendly_name, "%s", ids[i]);
        in->backends = 1u << EXO_BACKEND_CPU;
        in->models.n = 1;
        in->models.v = exo_calloc(1, sizeof *in->models.v);
        in->models.v[0] = model(16, GIB);
        apply(st, &ev);
        exo_event_clear(&ev);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j)
                continue;
            exo_event ev;
            exo_event_init(&ev, EXO_EVENT_TOPOLOGY_EDGE_CREATED);
            exo_topology_edge *e = &ev.u.topology_edge_created.edge;
            exo_id_set(&e->source, ids[i], NULL);
            exo_id_set(&e->sink, ids[j], NULL);
            snprintf(e->address, sizeof e->address, "10.0.0.%d:52414", j + 1);
            e->latency_us = rtt_us;
            e->bandwidth_bps = link_bps;
            apply(st, &ev);
            exo_event_clear(&ev);
        }
    return st;
}

static exo_instance place_as(exo_state *st, exo_sharding sh, int min_nodes, int exact)
{
    exo_model_card card = model(16, GIB);
    exo_placement_request req = {&card, sh, EXO_INSTANCE_META_MLX_RING, min_nodes, exact};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    return inst;
}

Test(placement, predicts_decode_speed_from_bandwidth_and_links)
{
    /* 1 GiB of weights at 10 GB/s: ~9.3 tok/s on one node */
    exo_state *st = speed_cluster(2, 10000000000ull, 100, 10000000000ull);
    exo_model_card card = model(16, GIB);
    exo_instance one = place_as(st, EXO_SHARDING_PIPELINE, 1, 1);
    double t1 = exo_placement_predict(st, &one, &card);
    cr_assert_float_eq(t1, 1e10 / (double)GIB, 1e-6);
    /* pipeline over 2: the same bytes, plus the hops: a little slower */
    exo_instance pp = place_as(st, EXO_SHARDING_PIPELINE, 2, 2);
    double t2 = exo_placement_predict(st, &pp, &card);
    cr_assert(t2 < t1 && t2 > 0.98 * t1, "%g vs %g", t2, t1);
    /* tensor over 2 on a fast link: close to twice one node */
    exo_instance tp = place_as(st, EXO_SHARDING_TENSOR, 2, 2);
    double t3 = exo_placement_predict(st, &tp, &card);
    cr_assert(t3 > 1.8 * t1 && t3 < 2 * t1, "%g vs %g", t3, t1);
    exo_instance_clear(&one);
    exo_instance_clear(&pp);
    exo_instance_clear(&tp);
    exo_state_free(st);
    /* on a 5 ms link, 64 all-reduces a token cost more than they save */
    st = speed_cluster(2, 10000000000ull, 5000, 1000000000ull);
    tp = place_as(st, EXO_SHARDING_TENSOR, 2, 2);
    one = place_as(st, EXO_SHARDING_PIPELINE, 1, 1);
    cr_assert_lt(exo_placement_predict(st, &tp, &card), exo_placement_predict(st, &one, &card));
    exo_instance_clear(&one);
    exo_instance_clear(&tp);
    exo_state_free(st);
}

Test(placement, picks_the_fastest_predicted_set)
{
    /* fast links: tensor parallel over all 4 nodes beats fewer */
    exo_state *st = speed_cluster(4, 10000000000ull, 50, 40000000000ull);
    exo_instance inst = place_as(st, EXO_SHARDING_TENSOR, 1, 0);
    cr_assert_eq(inst.n_shards, 4);
    exo_instance_clear(&inst);
    /* pipeline: one node is fastest for one request, so it stays on one */
    inst = place_as(st, EXO_SHARDING_PIPELINE, 1, 0);
    cr_assert_eq(inst.n_shards, 1);
    exo_instance_clear(&inst);
    exo_state_free(st);
    /* slow links: tensor parallel is not worth it */
    st = speed_cluster(4, 10000000000ull, 5000, 1000000000ull);
    inst = place_as(st, EXO_SHARDING_TENSOR, 1, 0);
    cr_assert_eq(inst.n_shards, 1);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

/* The GPU's bandwidth for what fits on it, the node's for the rest: a node
 * with a GPU is predicted (and picked) as the faster one, and a model
 * larger than its GPU pays for the spilled layers at memory speed. */
Test(placement, predicts_gpu_nodes_from_the_gpu_bandwidth)
{
    exo_state *st = exo_state_new();
    add_speed_node(st, "cpu", 64 * GIB, 100000000000ull, 0, 0);
    add_speed_node(st, "gpu", 8 * GIB, 50000000000ull, 32 * GIB, 4000000000000ull);
    exo_model_card card = model(16, 16 * GIB);
    exo_instance inst;
    place_whole_on(st, &card, "gpu", &inst);
    cr_assert_float_eq(exo_placement_predict(st, &inst, &card), 4e12 / (16.0 * GIB), 1e-3);
    exo_instance_clear(&inst);
    /* 36 GiB: 28 GiB on the GPU (32 - 1 used - 2 - 1 kept back) and 8 in memory
     * still beat 36 at the other node's 100 GB/s */
    card.storage_bytes = 36 * GIB;
    place_whole_on(st, &card, "gpu", &inst);
    double want = 1.0 / (28.0 * GIB / 4e12 + 8.0 * GIB / 5e10);
    cr_assert_float_eq(exo_placement_predict(st, &inst, &card), want, want * 1e-6);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

/* A node with several GPUs is a place for a rank per GPU (NCCL wants one
 * GPU a rank): its ranks need no edges between them (loopback), name their
 * GPU by its CUDA ordinal, and share the node's memory evenly. A node with
 * one GPU keeps the node's default device. */
Test(placement, a_node_with_several_gpus_takes_a_rank_per_gpu)
{
    exo_state *st = exo_state_new();
    /* 8 GiB of memory, two GPUs of 32 GiB at CUDA ordinals 2 and 3: a rank
     * holds 28 GiB on its GPU (32 - 1 used - 2 kept back - 1) + 4 GiB */
    add_gpus_node(st, "box", 8 * GIB, 50000000000ull, 2, 2, 32 * GIB, 4000000000000ull);
    exo_model_card card = model(16, 40 * GIB); /* more than one GPU and all the memory hold */
    exo_placement_request req = {&card, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    exo_instance inst;
    exo_err err = {0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 2);
    cr_assert_str_eq(inst.shards[0].node_id.s, "box");
    cr_assert_str_eq(inst.shards[1].node_id.s, "box");
    cr_assert(!strcmp(inst.shards[0].device, "cuda:2") || !strcmp(inst.shards[0].device, "cuda:3"),
              "%s", inst.shards[0].device);
    cr_assert_str_neq(inst.shards[0].device, inst.shards[1].device);
    cr_assert_eq(exo_instance_validate(&inst, &err), 0, "%s", err.msg);
    cr_assert_gt(exo_placement_predict(st, &inst, &card), 0, "loopback counts as a link");
    exo_instance_clear(&inst);
    /* 2 x 32 GiB is all it holds */
    card.storage_bytes = 65 * GIB;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);

    /* a model one GPU holds: a pipeline stays on one GPU; tensor parallel
     * over both reads half each and is predicted faster, so it takes both */
    card.storage_bytes = 16 * GIB;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 1);
    cr_assert_str_eq(inst.shards[0].device, "cuda:2");
    double one = exo_placement_predict(st, &inst, &card);
    cr_assert_float_eq(one, 4e12 / (16.0 * GIB), 1e-3);
    exo_instance_clear(&inst);
    req.sharding = EXO_SHARDING_TENSOR;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 2);
    cr_assert_eq(inst.sharding, EXO_SHARDING_TENSOR);
    cr_assert_str_eq(inst.shards[0].device, "cuda:2");
    cr_assert_str_eq(inst.shards[1].device, "cuda:3");
    double two = exo_placement_predict(st, &inst, &card);
    cr_assert(two > 1.2 * one && two < 2 * one, "%g vs %g", two, one);
    exo_instance_clear(&inst);

    /* min_nodes counts places: the two GPUs of one node are two */
    req.min_nodes = 3;
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), EXO_EINVAL);
    cr_assert(strstr(err.msg, "counting each GPU"), "%s", err.msg);
    exo_state_free(st);

    /* one GPU: the node's default device, as before */
    st = exo_state_new();
    add_gpus_node(st, "one", 8 * GIB, 50000000000ull, 1, 0, 32 * GIB, 4000000000000ull);
    req = (exo_placement_request){&card, EXO_SHARDING_PIPELINE, EXO_INSTANCE_META_MLX_RING, 1, 0};
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 1);
    cr_assert_str_eq(inst.shards[0].device, "");
    exo_instance_clear(&inst);

    /* with another node: a ring through both GPUs of one node and the other
     * node needs edges only between the nodes */
    add_gpus_node(st, "duo", 8 * GIB, 50000000000ull, 2, 0, 32 * GIB, 4000000000000ull);
    static const char *const ids[] = {"one", "duo"};
    full_mesh(st, ids, 2);
    card.storage_bytes = 80 * GIB; /* needs all three GPUs */
    cr_assert_eq(exo_placement_place(st, &req, &inst, &err), 0, "%s", err.msg);
    cr_assert_eq(inst.n_shards, 3);
    int on_duo = 0;
    for (size_t i = 0; i < inst.n_shards; i++) {
        bool duo = !strcmp(inst.shards[i].node_id.s, "duo");
        on_duo += duo;
        cr_assert_str_eq(inst.shards[i].device, duo ? (strcmp(inst.shards[i].device, "cuda:0") ? "cuda:1" : "cuda:0") : "");
    }
    cr_assert_eq(on_duo, 2);
    cr_assert_eq(exo_instance_validate(&inst, &err), 0, "%s", err.msg);
    exo_instance_clear(&inst);
    exo_state_free(st);
}

Test(placement, pipeline_split_counts_the_head_on_the_last_rank)
{
    /* llama-3.2-1b q4: 16 layers, a 128256 x 2048 head (~148 MB of 695 MB,
     * about 4.4 layers' worth): two equal nodes split 10 + 6, not 8 + 8 */
    exo_model_card c = model(16, 695000000ull);
    c.hidden_size = 2048;
    c.vocab_size = 128256;
    snprintf(c.quantization, sizeof c.quantization, "4bit");
    uint64_t w[2] = {1, 1};
    int32_t starts[4];
    cr_assert_eq(exo_placement_pipeline_split(&c, w, 2, starts, NULL), 0);
    cr_assert_eq(starts[0], 0);
    cr_assert_eq(starts[1], 10, "%d", starts[1]);
    /* no vocabulary known: the plain split */
    c.vocab_size = 0;
    cr_assert_eq(exo_placement_pipeline_split(&c, w, 2, starts, NULL), 0);
    cr_assert_eq(starts[1], 8);
    /* a head bigger than the layers: every rank still keeps a layer */
    c.vocab_size = 10000000;
    uint64_t w4[4] = {1, 1, 1, 1};
    cr_assert_eq(exo_placement_pipeline_split(&c, w4, 4, starts, NULL), 0);
    for (int i = 1; i < 4; i++)
        cr_assert_gt(starts[i], starts[i - 1]);
    cr_assert_leq(starts[3], 15);
}
