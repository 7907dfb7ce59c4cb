/* Builders of populated cluster values shared by the test_cluster_*.c
 * suites: one valid instance / task / event / command of every kind, with
 * every optional field exercised somewhere, so round trips cover the whole
 * codec. Header-only (static inline) so each suite stays one file. */
#ifndef EXO_TEST_CLUSTER_FIXTURES_H
#define EXO_TEST_CLUSTER_FIXTURES_H

#include "cluster/events.h"
#include "cluster/types.h"
#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

static inline void fx_id(exo_id *id, const char *prefix, int n)
{
    snprintf(id->s, sizeof id->s, "%s-%d", prefix, n);
}

/* An instance of n shards over nodes node-0..node-(n-1), 24 layers split
 * evenly (pipeline) or all layers on every rank (tensor). */
static inline void fx_instance(exo_instance *inst, int id, const char *model, size_t n, exo_sharding sh)
{
    memset(inst, 0, sizeof *inst);
    fx_id(&inst->instance_id, "inst", id);
    snprintf(inst->model_id, sizeof inst->model_id, "%s", model);
    inst->sharding = sh;
    inst->meta = EXO_INSTANCE_META_MLX_RING;
    inst->n_shards = n;
    inst->shards = exo_calloc(n, sizeof *inst->shards);
    for (size_t i = 0; i < n; i++) {
        exo_shard *s = &inst->shards[i];
        snprintf(s->runner_id.s, sizeof s->runner_id.s, "runner-%d-%zu", id, i);
        snprintf(s->node_id.s, sizeof s->node_id.s, "node-%zu", i);
        if (id % 4 == 3 && n > 1) { /* every rank on one node, a GPU each */
            snprintf(s->node_id.s, sizeof s->node_id.s, "node-0");
            snprintf(s->device, sizeof s->device, "cuda:%d", (int)(i % EXO_DEVICE_GPU_MAX));
        }
        s->device_rank = (int32_t)i;
        s->world_size = (int32_t)n;
        s->n_layers = 24;
        if (sh == EXO_SHARDING_TENSOR) {
            s->start_layer = 0;
            s->end_layer = 24;
        } else {
            s->start_layer = (int32_t)(24 * i / n);
            s->end_layer = (int32_t)(24 * (i + 1) / n);
        }
    }
}

static inline void fx_task(exo_task *t, int id, int inst, exo_task_kind kind)
{
    memset(t, 0, sizeof *t);
    fx_id(&t->task_id, "task", id);
    fx_id(&t->instance_id, "inst", inst);
    t->kind = kind;
    t->status = EXO_TASK_PENDING;
    switch (kind) {
    case EXO_TASK_KIND_TEXT_GENERATION:
        fx_id(&t->command_id, "cmd", id);
        t->params_json = exo_strdup("{\"model\":\"org/m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}]}");
        break;
    case EXO_TASK_KIND_CREATE_RUNNER:
        fx_id(&t->runner_id, "runner", id);
        fx_id(&t->node_id, "node", 0);
        break;
    case EXO_TASK_KIND_CANCEL_TASK:
        fx_id(&t->runner_id, "runner", id);
        fx_id(&t->cancelled_task_id, "task", id + 1000);
        break;
    case EXO_TASK_KIND_SHUTDOWN: fx_id(&t->runner_id, "runner", id); break;
    default: break;
    }
}

/* A populated event of each kind; variant picks among sub-cases (runner
 * status kinds, task kinds). */
static inline void fx_event(exo_event *ev, exo_event_kind kind, int variant)
{
    exo_event_init(ev, kind);
    switch (kind) {
    case EXO_EVENT_INSTANCE_CREATED:
        fx_instance(&ev->u.instance_created.instance, variant, "mlx-community/Llama-3.2-1B-Instruct-4bit",
                    (size_t)(1 + variant % 4), variant % 2 ? EXO_SHARDING_TENSOR : EXO_SHARDING_PIPELINE);
        break;
    case EXO_EVENT_INSTANCE_DELETED: fx_id(&ev->u.instance_deleted.instance_id, "inst", variant); break;
    case EXO_EVENT_RUNNER_STATUS_UPDATED: {
        exo_runner_status *st = &ev->u.runner_status_updated.status;
        fx_id(&ev->u.runner_status_updated.runner_id, "runner", variant);
        exo_runner_status_init(st, (exo_runner_status_kind)(variant % EXO_RUNNER__COUNT));
        if (st->kind == EXO_RUNNER_LOADING) {
            st->layers_loaded = 3;
            st->total_layers = 24;
        } else if (st->kind == EXO_RUNNER_READY && variant >= EXO_RUNNER__COUNT) {
            st->prefill_server_port = 50123;
        } else if (st->kind == EXO_RUNNER_FAILED) {
            st->error_message = exo_strdup("runner died: signal 9 \xe2\x9c\x97");
        }
        break;
    }
    case EXO_EVENT_RUNNER_DELETED: fx_id(&ev->u.runner_deleted.runner_id, "runner", variant); break;
    case EXO_EVENT_TASK_CREATED:
        fx_task(&ev->u.task_created.task, variant, 0, (exo_task_kind)(variant % EXO_TASK_KIND__COUNT));
        break;
    case EXO_EVENT_TASK_STATUS_UPDATED:
        fx_id(&ev->u.task_status_updated.task_id, "task", variant);
        ev->u.task_status_updated.status = (exo_task_status)(variant % EXO_TASK_STATUS__COUNT);
        break;
    case EXO_EVENT_TASK_FAILED:
        fx_id(&ev->u.task_failed.task_id, "task", variant);
        ev->u.task_failed.error_type = exo_strdup("RunnerError");
        ev->u.task_failed.error_message = exo_strdup("out of memory \"quoted\"\n");
        break;
    case EXO_EVENT_TASK_DELETED: fx_id(&ev->u.task_deleted.task_id, "task", variant); break;
    case EXO_EVENT_NODE_GATHERED_INFO:
        fx_id(&ev->u.node_gathered_info.node_id, "node", variant);
        ev->u.node_gathered_info.when_ms = 1767225600123LL + variant;
        ev->u.node_gathered_info.info.memory_total = 512ull << 30;
        ev->u.node_gathered_info.info.memory_available = (300ull << 30) + (uint64_t)variant;
        ev->u.node_gathered_info.info.cpu_count = 96;
        snprintf(ev->u.node_gathered_info.info.friendly_name, EXO_NAME_MAX, "box-%d \xc3\xa9", variant);
        ev->u.node_gathered_info.info.backends = variant % 2 ? (1u << EXO_BACKEND_CPU) | (1u << EXO_BACKEND_CUDA)
                                                             : (1u << EXO_BACKEND_CPU);
        if (variant % 2) { /* every optional part of a node's report */
            exo_node_info *in = &ev->u.node_gathered_info.info;
            snprintf(in->cpu_model, sizeof in->cpu_model, "Xeon %d", variant);
            snprintf(in->os, sizeof in->os, "Linux 6.1 x86_64");
            in->disk_total = 1ull << 40;
            in->disk_available = 1ull << 39;
            in->api_port = 52415;
            in->cluster_port = 52414;
            in->gpus.n = 2;
            in->gpus.v = exo_calloc(2, sizeof *in->gpus.v);
            for (int g = 0; g < 2; g++) {
                in->gpus.v[g].index = g;
                snprintf(in->gpus.v[g].name, EXO_NAME_MAX, "NVIDIA H200");
                in->gpus.v[g].memory_total = 141ull << 30;
                in->gpus.v[g].memory_used = (uint64_t)g << 30;
            }
            in->interfaces.n = 2;
            in->interfaces.v = exo_calloc(2, sizeof *in->interfaces.v);
            snprintf(in->interfaces.v[0].name, EXO_NAME_MAX, "eth0");
            snprintf(in->interfaces.v[0].ip, EXO_ADDR_MAX, "192.168.1.%d", variant % 250);
            in->interfaces.v[0].kind = EXO_IFACE_ETHERNET;
            snprintf(in->interfaces.v[1].name, EXO_NAME_MAX, "eth0");
            snprintf(in->interfaces.v[1].ip, EXO_ADDR_MAX, "fe80::1%%eth0");
            in->interfaces.v[1].kind = EXO_IFACE_ETHERNET;
            in->models.n = 1;
            in->models.v = exo_calloc(1, sizeof *in->models.v);
            snprintf(in->models.v[0].model_id, EXO_MODEL_ID_MAX, "org/model-%d", variant);
            in->models.v[0].n_layers = 24;
            in->models.v[0].hidden_size = 2048;
            in->models.v[0].n_kv_heads = 8;
            in->models.v[0].storage_bytes = 700ull << 20;
            in->models.v[0].supports_tensor = true;
        }
        break;
    case EXO_EVENT_NODE_TIMED_OUT: fx_id(&ev->u.node_timed_out.node_id, "node", variant); break;
    case EXO_EVENT_TOPOLOGY_EDGE_CREATED: {
        exo_topology_edge *e = &ev->u.topology_edge_created.edge;
        fx_id(&e->source, "node", variant);
        fx_id(&e->sink, "node", variant + 1);
        snprintf(e->address, sizeof e->address, "10.0.0.%d:52414", variant % 250);
        e->latency_us = 180 + variant;
        e->bandwidth_bps = 9400000000ull;
        break;
    }
    case EXO_EVENT_TOPOLOGY_EDGE_DELETED:
        fx_id(&ev->u.topology_edge_deleted.source, "node", variant);
        fx_id(&ev->u.topology_edge_deleted.sink, "node", variant + 1);
        snprintf(ev->u.topology_edge_deleted.address, EXO_ADDR_MAX, "[fe80::2%%eth0]:52414");
        break;
    case EXO_EVENT_NODE_DOWNLOAD_PROGRESS: {
        exo_download_status *d = &ev->u.node_download_progress.status;
        fx_id(&d->node_id, "node", variant);
        snprintf(d->model_id, EXO_MODEL_ID_MAX, "org/model-%d", variant % 3);
        d->kind = (exo_download_kind)(variant % EXO_DOWNLOAD_KIND__COUNT);
        if (variant % 2) {
            d->start_layer = 4;
            d->end_layer = 12;
            d->n_layers = 16;
        }
        d->model_directory = exo_strdup("/models/org--model");
        d->total = 1ull << 33;
        d->downloaded = (uint64_t)variant << 20;
        d->downloaded_this_session = (uint64_t)variant << 19;
        d->completed_files = variant % 4;
        d->total_files = 4;
        d->speed = 123456789;
        d->eta_ms = 4200;
        d->read_only = variant % 5 == 0;
        if (d->kind == EXO_DOWNLOAD_KIND_FAILED)
            d->error_message = exo_strdup("429 rate limited");
        break;
    }
    case EXO_EVENT_NODE_DOWNLOAD_DELETED:
        fx_id(&ev->u.node_download_deleted.node_id, "node", variant);
        snprintf(ev->u.node_download_deleted.model_id, EXO_MODEL_ID_MAX, "org/model-%d", variant % 3);
        break;
    case EXO_EVENT_CUSTOM_MODEL_CARD_ADDED: {
        exo_model_card *c = &ev->u.custom_model_card_added.card;
        snprintf(c->model_id, EXO_MODEL_ID_MAX, "user/custom-%d", variant % 3);
        c->n_layers = 28;
        c->hidden_size = 1024;
        c->n_kv_heads = 8;
        c->storage_bytes = 600u << 20;
        snprintf(c->model_type, sizeof c->model_type, "qwen3");
        break;
    }
    case EXO_EVENT_CUSTOM_MODEL_CARD_DELETED:
        snprintf(ev->u.custom_model_card_deleted.model_id, EXO_MODEL_ID_MAX, "user/custom-%d", variant % 3);
        break;
    default: break;
    }
}

static inline void fx_command(exo_command *cmd, exo_command_kind kind, int variant)
{
    exo_command_init(cmd, kind);
    switch (kind) {
    case EXO_COMMAND_PLACE_INSTANCE:
        snprintf(cmd->u.place_instance.card.model_id, EXO_MODEL_ID_MAX, "org/model-%d", variant);
        cmd->u.place_instance.card.n_layers = 24;
        cmd->u.place_instance.card.hidden_size = 2048;
        cmd->u.place_instance.card.n_kv_heads = 8;
        cmd->u.place_instance.card.storage_bytes = 1ull << 30;
        cmd->u.place_instance.card.supports_tensor = variant % 2;
        cmd->u.place_instance.sharding = EXO_SHARDING_TENSOR;
        cmd->u.place_instance.meta = EXO_INSTANCE_META_MLX_JACCL;
        cmd->u.place_instance.min_nodes = 2;
        break;
    case EXO_COMMAND_CREATE_INSTANCE:
        fx_instance(&cmd->u.create_instance.instance, variant, "org/m", 2, EXO_SHARDING_PIPELINE);
        break;
    case EXO_COMMAND_DELETE_INSTANCE: fx_id(&cmd->u.delete_instance.instance_id, "inst", variant); break;
    case EXO_COMMAND_TEXT_GENERATION:
        snprintf(cmd->u.text_generation.model_id, EXO_MODEL_ID_MAX, "org/m");
        cmd->u.text_generation.params_json = exo_strdup("{\"max_tokens\":16,\"stream\":true}");
        if (variant % 2)
            fx_id(&cmd->u.text_generation.origin, "node", variant);
        break;
    case EXO_COMMAND_TASK_CANCELLED: fx_id(&cmd->u.task_cancelled.cancelled_command_id, "cmd", variant); break;
    case EXO_COMMAND_TASK_FINISHED: fx_id(&cmd->u.task_finished.finished_command_id, "cmd", variant); break;
    case EXO_COMMAND_ADD_CUSTOM_MODEL_CARD:
        snprintf(cmd->u.add_custom_model_card.card.model_id, EXO_MODEL_ID_MAX, "user/custom-%d", variant);
        cmd->u.add_custom_model_card.card.n_layers = 28;
        cmd->u.add_custom_model_card.card.storage_bytes = 1u << 30;
        break;
    case EXO_COMMAND_DELETE_CUSTOM_MODEL_CARD:
        snprintf(cmd->u.delete_custom_model_card.model_id, EXO_MODEL_ID_MAX, "user/custom-%d", variant);
        break;
    default: break;
    }
}

#endif
