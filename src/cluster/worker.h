/* The worker: runs this node's share of the State's instances in runner
 * processes (src/runner/supervisor.h) and reports what they do as events.
 *
 * exo_worker_plan(st) is called by the node loop after every change of the
 * State; it compares the State with the runners it has and acts
 * (exo-reference §2.6, single rank per node):
 *   - an instance with a shard on this node and no runner: make sure the
 *     files the shard loads are on disk (downloads.h: downloaded first,
 *     only the shard's files for a pipeline rank; a failed download
 *     counts as a failed start), then spawn one (after
 *     a failure: backoff 0.5 s doubling to 10 s; after
 *     EXO_WORKER_MAX_FAILURES failures in a row the instance is deleted,
 *     DeleteInstance saying why: "runner for M failed 5 times in a row:
 *     <the last error>")
 *     and send it LoadModel for the model's directory;
 *   - a runner whose instance is gone, or that reports Failed: shut it down;
 *   - a Ready/Running runner: forward its instance's Pending TextGeneration
 *     tasks (oldest first; the runner queues them FIFO) and mark them
 *     Running;
 *   - a forwarded task the State says is Cancelled: cancel it in the runner.
 * Runner statuses become RunnerStatusUpdated events; a runner that is gone
 * for good becomes RunnerStatusUpdated(Shutdown), which drops it from the
 * State. Chunks go to the host's chunk callback; when a forwarded command is
 * done, the worker emits its final task status (Complete, or TaskFailed +
 * Failed after an error chunk; Cancelled tasks stay Cancelled) and calls
 * the host's done callback.
 *
 * Threading: the node loop thread only. Runner sockets are uv_poll handles
 * on the node's libuv loop. */
#ifndef EXO_CLUSTER_WORKER_H
#define EXO_CLUSTER_WORKER_H

#include "proto/gen_types.h"
#include "cluster/events.h"
#include "cluster/downloads.h"
#include "cluster/state.h"
#include "core/paths.h"
#include "download/hub.h"

#include <uv.h>

/* Failures in a row (crashes, failed starts or downloads) after which a
 * runner's instance is deleted, with the last error as the reason. */
#define EXO_WORKER_MAX_FAILURES 5

/* The ring key of an instance: BLAKE2b-256(key = cluster key,
 * "exo ring v1" || 0x00 || instance id), as 64 hex digits + NUL. */
void exo_worker_ring_key(const uint8_t cluster_key[32], const exo_id *instance_id, char out[65]);

typedef struct exo_worker exo_worker;

typedef struct exo_worker_host {
    void *ctx;
    /* Index, log and fold an event (ev is consumed). */
    void (*emit)(void *ctx, exo_event *ev);
    /* Submit a command to the master (cmd is consumed). */
    void (*command)(void *ctx, exo_command *cmd);
    /* A chunk of a forwarded command; done follows its terminal chunk. */
    void (*chunk)(void *ctx, const exo_id *command_id, const exo_chunk *c);
    void (*done)(void *ctx, const exo_id *command_id);
    /* Ask for exo_worker_plan to run soon (a runner changed, a timer fired). */
    void (*replan)(void *ctx);
} exo_worker_host;

typedef struct exo_worker_config {
    exo_id                node_id;
    const exo_models_dir *models_dirs;
    int                   n_models_dirs;
    const char           *runner_log_dir; /* runner-<id>.log files; NULL: inherit stderr */
    const char           *runner_bin;     /* NULL: /proc/self/exe */
    int                   runner_threads; /* <= 0: all CPUs */
    int                   runner_ctx;     /* 0: the runner's default */
    int                   warmup_tokens;
    bool                  verbose;
    /* Split models: the instance's ring key is derived from this (the
     * cluster's psk) and the instance id; receives on the ring time out
     * after ring_timeout_ms (0: the ring's default). */
    uint8_t               cluster_key[32];
    int                   ring_timeout_ms;
    exo_hub_opts          hub; /* where models not on disk come from */
    int                   backoff_ms; /* the first respawn delay; 0: 500 (doubles to 10 s) */
} exo_worker_config;

exo_worker *exo_worker_new(uv_loop_t *loop, const exo_worker_config *cfg, const exo_worker_host *host);
void        exo_worker_plan(exo_worker *w, const exo_state *st);
/* A user's download start / cancel / delete on this node (downloads.h). */
int         exo_worker_download(exo_worker *w, exo_download_action action, const char *model_id, exo_err *err);
/* Shuts every runner down (bounded: ~2 s each, then SIGKILL) without
 * callbacks; commands in flight get no more chunks. Closes the handles;
 * run the loop once more before freeing. */
void        exo_worker_shutdown(exo_worker *w);
void        exo_worker_free(exo_worker *w);
/* Runners alive (tests, logs). */
int         exo_worker_runner_count(const exo_worker *w);

#endif
