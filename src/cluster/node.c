/* The node loop (see node.h).
 *
 * One thread runs a libuv loop. Other threads put work in the inbox (under
 * the node mutex) and wake the loop with uv_async_send. On the loop thread,
 * everything that changes the State goes through one queue of actions
 * (events to fold, commands for the master, finished generations) that
 * settle() drains in order before it lets the worker plan again: the
 * worker, which iterates the State while it plans, never sees the State
 * change under it, and a fold never re-enters the worker.
 *
 * Token chunks do not wait for settle(): the worker hands them straight to
 * the generation's sink, so the token path is runner socket -> sink -> HTTP
 * stream with no queue in between.
 *
 * The mutex guards what API threads read or add to: the State and event log
 * (they render JSON), the inbox and the list of open generations. Sinks are
 * called without it held. */
#include "cluster/node.h"

#include "cluster/event_log.h"
#include "cluster/master.h"
#include "cluster/node_info.h"
#include "cluster/placement.h"
#include "cluster/worker.h"
#include "core/alloc.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define INFO_PERIOD_MS 10000
/* Durability of the log is batched: an fdatasync costs milliseconds, and
 * the events of one request (created, running, complete, deleted) would
 * otherwise each pay it on the token path. A crash loses at most this
 * window; the log's torn-tail recovery keeps what is on disk consistent. */
#define FLUSH_DELAY_MS 200

typedef enum { ACT_EVENT, ACT_COMMAND, ACT_DONE, ACT_CANCEL, ACT_STOP } action_kind;

typedef struct action {
    action_kind    kind;
    exo_event      ev;  /* ACT_EVENT */
    exo_command    cmd; /* ACT_COMMAND */
    exo_id         id;  /* ACT_DONE, ACT_CANCEL: the command id */
    struct action *next;
} action;

typedef struct action_queue {
    action *head, *tail;
} action_queue;

typedef struct gen {
    exo_id       command_id;
    exo_gen_sink sink;
    struct gen  *next;
} gen;

struct exo_node {
    exo_node_config cfg;
    exo_id          node_id;
    pthread_t       thread;
    bool            thread_started, loop_inited;
    uv_loop_t       loop;
    uv_async_t      wake;
    uv_timer_t      info_timer;
    uv_timer_t      flush_timer;

    pthread_mutex_t mu;     /* guards the fields below up to `gens` */
    exo_state      *state;
    exo_event_log  *log;
    action_queue    inbox;  /* from other threads */
    gen            *gens;
    bool            stopping;

    action_queue    local;  /* loop thread only */
    bool            dirty;  /* the worker should plan again */
    bool            unflushed; /* events appended since the flush timer was armed */
    exo_worker     *worker;
};

/* ---- small helpers --------------------------------------------------------- */

static void queue_push(action_queue *q, action *a)
{
    a->next = NULL;
    if (q->tail)
        q->tail->next = a;
    else
        q->head = a;
    q->tail = a;
}

static action *queue_pop(action_queue *q)
{
    action *a = q->head;
    if (a && !(q->head = a->next))
        q->tail = NULL;
    return a;
}

static void action_free(action *a)
{
    if (a->kind == ACT_EVENT)
        exo_event_clear(&a->ev);
    if (a->kind == ACT_COMMAND)
        exo_command_clear(&a->cmd);
    exo_free(a);
}

static gen *gen_find_locked(exo_node *n, const exo_id *id)
{
    for (gen *g = n->gens; g; g = g->next)
        if (exo_id_eq(&g->command_id, id))
            return g;
    return NULL;
}

/* Looks a generation up and copies its sink (false if it is not open). */
static bool gen_sink(exo_node *n, const exo_id *id, exo_gen_sink *out)
{
    pthread_mutex_lock(&n->mu);
    gen *g = gen_find_locked(n, id);
    if (g)
        *out = g->sink;
    pthread_mutex_unlock(&n->mu);
    return g != NULL;
}

static bool gen_remove(exo_node *n, const exo_id *id, exo_gen_sink *out)
{
    pthread_mutex_lock(&n->mu);
    gen *found = NULL;
    for (gen **p = &n->gens; *p; p = &(*p)->next)
        if (exo_id_eq(&(*p)->command_id, id)) {
            found = *p;
            *p = found->next;
            break;
        }
    pthread_mutex_unlock(&n->mu);
    if (found) {
        *out = found->sink;
        exo_free(found);
    }
    return found != NULL;
}

static void local_command(exo_node *n, exo_command *cmd)
{
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_COMMAND;
    a->cmd = *cmd; /* moved */
    queue_push(&n->local, a);
    uv_async_send(&n->wake);
}

static void finish_command_later(exo_node *n, const exo_id *command_id)
{
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_TASK_FINISHED);
    cmd.u.task_finished.finished_command_id = *command_id;
    local_command(n, &cmd);
}

/* Ends a generation the worker never had (or lost): terminal chunk, end,
 * and the task (if any) is finished. */
static void end_generation(exo_node *n, const exo_id *command_id, const exo_chunk *terminal)
{
    exo_gen_sink s;
    if (!gen_remove(n, command_id, &s))
        return;
    s.on_chunk(s.ctx, terminal);
    s.on_end(s.ctx);
    finish_command_later(n, command_id);
}

static void end_with_error(exo_node *n, const exo_id *command_id, const char *message)
{
    exo_chunk c;
    exo_chunk_error(&c, message);
    end_generation(n, command_id, &c);
    exo_chunk_free(&c);
}

/* ---- folding events ----------------------------------------------------- */

static void apply_event(exo_node *n, exo_event *ev)
{
    exo_err err = {0};
    bool pending_cancelled = false;
    exo_id command_id = {{0}};
    pthread_mutex_lock(&n->mu);
    if (ev->kind == EXO_EVENT_TASK_STATUS_UPDATED &&
        ev->u.task_status_updated.status == EXO_TASK_CANCELLED) {
        const exo_task *t = exo_state_task(n->state, &ev->u.task_status_updated.task_id);
        if (t && t->kind == EXO_TASK_KIND_TEXT_GENERATION && t->status == EXO_TASK_PENDING) {
            pending_cancelled = true;
            command_id = t->command_id;
        }
    }
    uint64_t idx;
    int rc = exo_event_log_append_event(n->log, ev, &idx, &err);
    if (!rc)
        rc = exo_state_apply(n->state, (int64_t)idx, ev, &err);
    pthread_mutex_unlock(&n->mu);
    if (rc) {
        /* A log that cannot be written or an event the fold refuses is a
         * bug or a dead disk; the State stays as it was. */
        EXO_LOG_ERROR("node: event %s not applied: %s", exo_event_kind_name(ev->kind), err.msg);
        return;
    }
    n->dirty = true;
    n->unflushed = true;
    if (pending_cancelled) { /* never reached a runner: answer it here */
        exo_chunk c;
        exo_usage usage = {0};
        exo_chunk_finish(&c, EXO_FR_CANCELLED, &usage, 0, 0);
        end_generation(n, &command_id, &c);
        exo_chunk_free(&c);
    }
}

static void handle_command(exo_node *n, const exo_command *cmd)
{
    exo_model_store *models = cmd->kind == EXO_COMMAND_PLACE_INSTANCE ? exo_node_models(n) : NULL;
    exo_event_list events = {0};
    exo_err err = {0};
    pthread_mutex_lock(&n->mu);
    int rc = exo_master_handle(n->state, cmd, models, &events, &err);
    pthread_mutex_unlock(&n->mu);
    exo_model_store_free(models);
    if (rc) {
        if (cmd->kind == EXO_COMMAND_TEXT_GENERATION)
            end_with_error(n, &cmd->command_id, err.msg);
        else if (cmd->kind != EXO_COMMAND_TASK_CANCELLED) /* cancel after the end: normal */
            EXO_LOG_WARN("node: %s: %s", exo_command_kind_name(cmd->kind), err.msg);
    }
    for (size_t i = 0; i < events.n; i++)
        apply_event(n, &events.v[i]);
    exo_event_list_clear(&events);
}

static void on_flush(uv_timer_t *t)
{
    exo_node *n = t->data;
    exo_err err;
    pthread_mutex_lock(&n->mu);
    int rc = exo_event_log_flush(n->log, &err);
    pthread_mutex_unlock(&n->mu);
    if (rc)
        EXO_LOG_ERROR("node: event log: %s", err.msg);
}

/* Drains the action queues, lets the worker plan, repeats until quiet, then
 * schedules the appended events' fdatasync (see FLUSH_DELAY_MS). */
static void settle(exo_node *n)
{
    for (;;) {
        action *a = queue_pop(&n->local);
        if (!a) {
            pthread_mutex_lock(&n->mu);
            a = queue_pop(&n->inbox);
            pthread_mutex_unlock(&n->mu);
        }
        if (a) {
            switch (a->kind) {
            case ACT_EVENT:
                apply_event(n, &a->ev);
                break;
            case ACT_COMMAND:
                handle_command(n, &a->cmd);
                break;
            case ACT_DONE: {
                exo_gen_sink s;
                if (gen_remove(n, &a->id, &s)) {
                    s.on_end(s.ctx);
                    finish_command_later(n, &a->id);
                }
                break;
            }
            case ACT_CANCEL: {
                exo_command cmd;
                exo_command_init(&cmd, EXO_COMMAND_TASK_CANCELLED);
                cmd.u.task_cancelled.cancelled_command_id = a->id;
                handle_command(n, &cmd);
                exo_command_clear(&cmd);
                break;
            }
            case ACT_STOP:
                break; /* handled by on_wake */
            }
            action_free(a);
            continue;
        }
        if (!n->dirty || !n->worker)
            break;
        n->dirty = false;
        exo_worker_plan(n->worker, n->state);
    }
    if (n->unflushed && !uv_is_active((uv_handle_t *)&n->flush_timer) &&
        !uv_is_closing((uv_handle_t *)&n->flush_timer))
        uv_timer_start(&n->flush_timer, on_flush, FLUSH_DELAY_MS, 0);
    n->unflushed = false;
}

/* ---- worker host callbacks ----------------------------------------------- */

static void host_emit(void *ctx, exo_event *ev)
{
    exo_node *n = ctx;
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_EVENT;
    a->ev = *ev; /* moved */
    queue_push(&n->local, a);
    uv_async_send(&n->wake);
}

static void host_command(void *ctx, exo_command *cmd) { local_command(ctx, cmd); }

static void host_chunk(void *ctx, const exo_id *command_id, const exo_chunk *c)
{
    exo_gen_sink s;
    if (gen_sink(ctx, command_id, &s))
        s.on_chunk(s.ctx, c);
}

static void host_done(void *ctx, const exo_id *command_id)
{
    exo_node *n = ctx;
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_DONE;
    a->id = *command_id;
    queue_push(&n->local, a);
    uv_async_send(&n->wake);
}

static void host_replan(void *ctx)
{
    exo_node *n = ctx;
    n->dirty = true;
    uv_async_send(&n->wake);
}

/* ---- node info ---------------------------------------------------------------- */

static void publish_info(exo_node *n)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_NODE_GATHERED_INFO);
    exo_err err;
    if (exo_node_info_gather(&ev.u.node_gathered_info.info, &err)) {
        EXO_LOG_WARN("node: cannot gather node info: %s", err.msg);
        exo_event_clear(&ev);
        return;
    }
    ev.u.node_gathered_info.node_id = n->node_id;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev.u.node_gathered_info.when_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    apply_event(n, &ev);
    exo_event_clear(&ev);
}

static void on_info_timer(uv_timer_t *t)
{
    exo_node *n = t->data;
    publish_info(n);
    settle(n);
}

/* ---- the loop ------------------------------------------------------------- */

static void close_handle(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void shut_down(exo_node *n)
{
    if (n->worker)
        exo_worker_shutdown(n->worker); /* no more chunks from runners */
    for (;;) {
        pthread_mutex_lock(&n->mu);
        gen *g = n->gens;
        exo_id id = g ? g->command_id : (exo_id){{0}};
        pthread_mutex_unlock(&n->mu);
        if (!g)
            break;
        exo_chunk c;
        exo_chunk_error(&c, "the node is shutting down");
        exo_gen_sink s;
        if (gen_remove(n, &id, &s)) {
            s.on_chunk(s.ctx, &c);
            s.on_end(s.ctx);
        }
        exo_chunk_free(&c);
    }
    action *a;
    while ((a = queue_pop(&n->local)))
        action_free(a);
    pthread_mutex_lock(&n->mu);
    while ((a = queue_pop(&n->inbox)))
        action_free(a);
    pthread_mutex_unlock(&n->mu);
    uv_walk(&n->loop, close_handle, NULL);
}

static void on_wake(uv_async_t *h)
{
    exo_node *n = h->data;
    pthread_mutex_lock(&n->mu);
    bool stop = n->stopping;
    pthread_mutex_unlock(&n->mu);
    if (stop) {
        shut_down(n);
        return;
    }
    settle(n);
}

static void *node_thread(void *arg)
{
    exo_node *n = arg;
    settle(n);
    uv_run(&n->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- start / stop ----------------------------------------------------------- */

/* The node id survives restarts (<data>/node_id), so logs and peers can
 * tell a restarted node from a new one. */
static void load_node_id(exo_node *n, const char *data_dir)
{
    char path[4096], buf[EXO_ID_MAX + 2] = "";
    snprintf(path, sizeof path, "%s/node_id", data_dir);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(buf, sizeof buf, f))
            buf[strcspn(buf, "\r\n")] = 0;
        fclose(f);
        if (!exo_id_set(&n->node_id, buf, NULL))
            return;
    }
    exo_id_new(&n->node_id);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    f = fopen(tmp, "w");
    if (f && fprintf(f, "%s\n", n->node_id.s) > 0 && fclose(f) == 0)
        rename(tmp, path);
    else if (f)
        fclose(f);
}

static int open_log(exo_node *n, exo_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/events.bin", n->cfg.paths->event_log_dir);
    exo_event_log_recovery rec;
    int rc = exo_event_log_open(path, &n->log, &rec, err);
    if (rc)
        return rc;
    if (rec.bytes_truncated)
        EXO_LOG_WARN("node: event log %s: cut a damaged tail of %llu bytes (%s)", path,
                     (unsigned long long)rec.bytes_truncated, rec.reason);
    if (exo_event_log_count(n->log)) { /* a previous run's log: archive it, start afresh */
        EXO_LOG_INFO("node: archiving the previous event log (%llu events)",
                     (unsigned long long)exo_event_log_count(n->log));
        if ((rc = exo_event_log_close(n->log, true, err)))
            return rc;
        if ((rc = exo_event_log_open(path, &n->log, NULL, err)))
            return rc;
    }
    return 0;
}

int exo_node_start(const exo_node_config *cfg, exo_node **out, exo_err *err)
{
    *out = NULL;
    exo_node *n = exo_calloc(1, sizeof *n);
    n->cfg = *cfg;
    pthread_mutex_init(&n->mu, NULL);
    n->state = exo_state_new();
    load_node_id(n, cfg->paths->data_dir);
    int rc = open_log(n, err);
    if (rc) {
        exo_node_free(n);
        return rc;
    }
    uv_loop_init(&n->loop);
    n->loop_inited = true;
    uv_async_init(&n->loop, &n->wake, on_wake);
    n->wake.data = n;
    uv_timer_init(&n->loop, &n->flush_timer);
    n->flush_timer.data = n;
    if (cfg->worker) {
        exo_worker_config wc = {
            .node_id = n->node_id,
            .models_dirs = cfg->paths->models_dirs,
            .n_models_dirs = cfg->paths->n_models_dirs,
            .runner_log_dir = cfg->paths->runner_log_dir,
            .runner_bin = cfg->runner_bin,
            .runner_threads = cfg->runner_threads,
            .runner_ctx = cfg->runner_ctx,
            .warmup_tokens = cfg->warmup_tokens,
            .verbose = cfg->verbose,
        };
        exo_worker_host host = {n, host_emit, host_command, host_chunk, host_done, host_replan};
        n->worker = exo_worker_new(&n->loop, &wc, &host);
        publish_info(n);
        uv_timer_init(&n->loop, &n->info_timer);
        n->info_timer.data = n;
        uv_timer_start(&n->info_timer, on_info_timer, INFO_PERIOD_MS, INFO_PERIOD_MS);
    }
    if (pthread_create(&n->thread, NULL, node_thread, n)) {
        exo_node_free(n);
        return exo_err_set(err, EXO_EIO, "cannot start the node thread");
    }
    n->thread_started = true;
    EXO_LOG_INFO("node %s started%s", n->node_id.s, cfg->worker ? "" : " (no worker)");
    *out = n;
    return 0;
}

void exo_node_stop(exo_node *n)
{
    if (!n || !n->thread_started)
        return;
    pthread_mutex_lock(&n->mu);
    n->stopping = true;
    uv_async_send(&n->wake);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->thread, NULL);
    n->thread_started = false;
}

void exo_node_free(exo_node *n)
{
    if (!n)
        return;
    exo_node_stop(n);
    if (n->loop_inited) {
        uv_walk(&n->loop, close_handle, NULL); /* only if the thread never ran */
        uv_run(&n->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&n->loop))
            EXO_LOG_WARN("node: the event loop still had handles at exit");
    }
    exo_worker_free(n->worker);
    if (n->log) {
        exo_err err;
        if (exo_event_log_close(n->log, true, &err))
            EXO_LOG_WARN("node: closing the event log: %s", err.msg);
    }
    action *a;
    while ((a = queue_pop(&n->inbox)))
        action_free(a);
    while ((a = queue_pop(&n->local)))
        action_free(a);
    while (n->gens) {
        gen *g = n->gens;
        n->gens = g->next;
        exo_free(g);
    }
    exo_state_free(n->state);
    pthread_mutex_destroy(&n->mu);
    exo_free(n);
}

const char *exo_node_id(const exo_node *n) { return n->node_id.s; }

/* ---- API-thread calls ------------------------------------------------------ */

/* Queues an action from another thread and wakes the loop; EXO_ECANCELED
 * once stopping. The wake-up is sent with the mutex held: the loop closes
 * its async handle only after it saw `stopping` under the same mutex, so
 * no thread can send to a closed handle. */
static int post_locked(exo_node *n, action *a)
{
    if (n->stopping) {
        action_free(a);
        return EXO_ECANCELED;
    }
    queue_push(&n->inbox, a);
    uv_async_send(&n->wake);
    return 0;
}

bool exo_node_serves_model(exo_node *n, const char *model_id)
{
    pthread_mutex_lock(&n->mu);
    bool yes = exo_state_instances_for_model(n->state, model_id, NULL, 0) > 0;
    pthread_mutex_unlock(&n->mu);
    return yes;
}

int exo_node_generate(exo_node *n, const exo_gen_request *req, const exo_gen_sink *sink,
                      const exo_id *command_id, exo_err *err)
{
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_COMMAND;
    exo_command_init(&a->cmd, EXO_COMMAND_TEXT_GENERATION);
    a->cmd.command_id = *command_id;
    snprintf(a->cmd.u.text_generation.model_id, EXO_MODEL_ID_MAX, "%s", req->model);
    json_t *params = exo_gen_request_to_json(req);
    a->cmd.u.text_generation.params_json = json_dumps(params, JSON_COMPACT);
    json_decref(params);

    pthread_mutex_lock(&n->mu);
    if (!exo_state_instances_for_model(n->state, req->model, NULL, 0)) {
        pthread_mutex_unlock(&n->mu);
        action_free(a);
        return exo_err_set(err, EXO_ENOENT, "No instance found for model %s", req->model);
    }
    gen *g = exo_calloc(1, sizeof *g);
    g->command_id = *command_id;
    g->sink = *sink;
    int rc = post_locked(n, a);
    if (!rc) {
        g->next = n->gens;
        n->gens = g;
    } else {
        exo_free(g);
        exo_err_set(err, rc, "the node is shutting down");
    }
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int exo_node_cancel(exo_node *n, const char *command_id)
{
    exo_id id;
    if (exo_id_set(&id, command_id, NULL))
        return EXO_ENOENT;
    pthread_mutex_lock(&n->mu);
    int rc = EXO_ENOENT;
    if (gen_find_locked(n, &id)) {
        action *a = exo_calloc(1, sizeof *a);
        a->kind = ACT_CANCEL;
        a->id = id;
        rc = post_locked(n, a);
    }
    pthread_mutex_unlock(&n->mu);
    return rc;
}

static int submit(exo_node *n, exo_command *cmd, exo_id *command_id, exo_err *err)
{
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_COMMAND;
    a->cmd = *cmd; /* moved */
    if (command_id)
        *command_id = a->cmd.command_id;
    pthread_mutex_lock(&n->mu);
    int rc = post_locked(n, a);
    pthread_mutex_unlock(&n->mu);
    if (rc)
        return exo_err_set(err, rc, "the node is shutting down");
    return 0;
}

int exo_node_preview_placement(exo_node *n, const char *model_id, exo_sharding sharding,
                               exo_instance_meta meta, int min_nodes, exo_instance *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    exo_model_store *models = exo_node_models(n);
    const exo_model_entry *m = exo_model_store_find(models, model_id);
    int rc;
    if (!m) {
        rc = exo_err_set(err, EXO_ENOENT, "model %s is not in any models directory", model_id);
    } else {
        exo_placement_request req = {m, sharding, meta, min_nodes};
        pthread_mutex_lock(&n->mu);
        rc = exo_placement_place(n->state, &req, out, err);
        pthread_mutex_unlock(&n->mu);
    }
    exo_model_store_free(models);
    return rc;
}

int exo_node_place_instance(exo_node *n, const char *model_id, exo_sharding sharding,
                            exo_instance_meta meta, int min_nodes, exo_instance *preview,
                            exo_id *command_id, exo_err *err)
{
    exo_instance inst;
    int rc = exo_node_preview_placement(n, model_id, sharding, meta, min_nodes, &inst, err);
    if (rc)
        return rc;
    if (preview)
        *preview = inst;
    else
        exo_instance_clear(&inst);
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_PLACE_INSTANCE);
    snprintf(cmd.u.place_instance.model_id, EXO_MODEL_ID_MAX, "%s", model_id);
    cmd.u.place_instance.sharding = sharding;
    cmd.u.place_instance.meta = meta;
    cmd.u.place_instance.min_nodes = min_nodes;
    return submit(n, &cmd, command_id, err);
}

int exo_node_create_instance(exo_node *n, const exo_instance *inst, exo_id *command_id, exo_err *err)
{
    int rc = exo_instance_validate(inst, err);
    if (rc)
        return rc;
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_CREATE_INSTANCE);
    exo_instance_copy(&cmd.u.create_instance.instance, inst);
    return submit(n, &cmd, command_id, err);
}

int exo_node_delete_instance(exo_node *n, const exo_id *instance_id, exo_id *command_id, exo_err *err)
{
    pthread_mutex_lock(&n->mu);
    bool known = exo_state_instance(n->state, instance_id) != NULL;
    pthread_mutex_unlock(&n->mu);
    if (!known)
        return exo_err_set(err, EXO_ENOENT, "instance %s not found", instance_id->s);
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_DELETE_INSTANCE);
    cmd.u.delete_instance.instance_id = *instance_id;
    return submit(n, &cmd, command_id, err);
}

void exo_node_read_state(exo_node *n, void (*fn)(void *ctx, const exo_state *st), void *ctx)
{
    pthread_mutex_lock(&n->mu);
    fn(ctx, n->state);
    pthread_mutex_unlock(&n->mu);
}

json_t *exo_node_events_json(exo_node *n, int64_t since, exo_err *err)
{
    pthread_mutex_lock(&n->mu);
    uint64_t count = exo_event_log_count(n->log);
    uint64_t from = since < 0 ? 0 : (uint64_t)since > count ? count : (uint64_t)since;
    exo_event *events = NULL;
    size_t got = 0;
    int rc = exo_event_log_read_range(n->log, from, (size_t)(count - from), &events, &got, err);
    pthread_mutex_unlock(&n->mu);
    if (rc)
        return NULL;
    json_t *arr = json_array();
    for (size_t i = 0; i < got; i++)
        json_array_append_new(arr, exo_event_to_json(&events[i]));
    exo_event_log_free_events(events, got);
    return arr;
}

exo_model_store *exo_node_models(exo_node *n)
{
    return exo_model_store_scan(n->cfg.paths->models_dirs, n->cfg.paths->n_models_dirs);
}

int exo_node_open_generations(exo_node *n)
{
    pthread_mutex_lock(&n->mu);
    int k = 0;
    for (gen *g = n->gens; g; g = g->next)
        k++;
    pthread_mutex_unlock(&n->mu);
    return k;
}
