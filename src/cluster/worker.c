/* The worker (see worker.h): State -> runner processes, runner frames ->
 * events and chunks.
 *
 * One record per local shard (keyed by runner id) outlives its processes:
 * it carries the failure count and the backoff deadline across respawns,
 * and the list of commands forwarded to the current process, which is what
 * lets the worker emit each task's final status exactly once (on the
 * supervisor's on_done, which it guarantees for every forwarded command,
 * crash or not). */
#include "cluster/worker.h"

#include "cluster/downloads.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "runner/supervisor.h"

#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct forwarded {
    exo_id            task_id, command_id;
    bool              cancel_sent;
    char             *error; /* the ERROR chunk's message, once seen */
    struct forwarded *next;
} forwarded;

typedef struct wrunner {
    exo_worker     *w;
    exo_id          runner_id, instance_id;
    char            model_id[EXO_MODEL_ID_MAX];
    exo_supervisor *sup;
    uv_poll_t      *poll;
    bool            retiring; /* Shutdown sent: exits on purpose */
    bool            deleting; /* too many failures: DeleteInstance sent */
    int             failures; /* in a row: see count_failure */
    uint64_t        ready_ns; /* when this process became Ready (0: not yet) */
    char            last_error[512]; /* the latest failure's message (the deletion's reason) */
    uint64_t        next_spawn_ns;
    exo_runner_status_kind last;
    bool            connect_sent; /* split model: this process was told its next rank */
    forwarded      *fwd;
    struct wrunner *next;
} wrunner;

struct exo_worker {
    uv_loop_t        *loop;
    exo_worker_config cfg;
    exo_worker_host   host;
    uv_timer_t        backoff;
    wrunner          *runners;
    exo_downloads    *downloads;
};

/* ---- events --------------------------------------------------------------- */

static void emit_runner_status(wrunner *r, const exo_runner_status *st)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_RUNNER_STATUS_UPDATED);
    ev.u.runner_status_updated.runner_id = r->runner_id;
    exo_runner_status_clear(&ev.u.runner_status_updated.status);
    exo_runner_status_copy(&ev.u.runner_status_updated.status, st);
    r->w->host.emit(r->w->host.ctx, &ev);
}

static void emit_runner_failed(wrunner *r, const char *why)
{
    exo_runner_status st;
    exo_runner_status_init(&st, EXO_RUNNER_FAILED);
    st.error_message = exo_strdup(why);
    emit_runner_status(r, &st);
    exo_runner_status_clear(&st);
}

static void emit_task_status(exo_worker *w, const exo_id *task_id, exo_task_status status)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_TASK_STATUS_UPDATED);
    ev.u.task_status_updated.task_id = *task_id;
    ev.u.task_status_updated.status = status;
    w->host.emit(w->host.ctx, &ev);
}

static void emit_task_failed(exo_worker *w, const exo_id *task_id, const char *message)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_TASK_FAILED);
    ev.u.task_failed.task_id = *task_id;
    ev.u.task_failed.error_type = exo_strdup("RunnerError");
    ev.u.task_failed.error_message = exo_strndup(message, strnlen(message, EXO_MESSAGE_MAX - 1));
    w->host.emit(w->host.ctx, &ev);
    emit_task_status(w, task_id, EXO_TASK_FAILED);
}

/* ---- forwarded commands ---------------------------------------------------- */

static forwarded *fwd_find(wrunner *r, const char *command_id)
{
    for (forwarded *f = r->fwd; f; f = f->next)
        if (!strcmp(f->command_id.s, command_id))
            return f;
    return NULL;
}

static bool fwd_has_task(const wrunner *r, const exo_id *task_id)
{
    for (const forwarded *f = r->fwd; f; f = f->next)
        if (exo_id_eq(&f->task_id, task_id))
            return true;
    return false;
}

static void fwd_remove(wrunner *r, forwarded *f)
{
    for (forwarded **p = &r->fwd; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    exo_free(f->error);
    exo_free(f);
}

/* A command's end, whoever noticed it: its final status, then done. */
static void finish_forwarded(wrunner *r, forwarded *f)
{
    exo_worker *w = r->w;
    exo_id cmd = f->command_id;
    if (f->error) {
        emit_task_failed(w, &f->task_id, f->error);
    } else if (!f->cancel_sent) {
        emit_task_status(w, &f->task_id, EXO_TASK_COMPLETE);
        r->failures = 0; /* it works */
    }
    fwd_remove(r, f);
    w->host.done(w->host.ctx, &cmd);
}

/* ---- supervisor callbacks ------------------------------------------------- */

/* Counts a failure in a row and keeps its message for the deletion's reason.
 * A runner that was Ready for STABLE_NS, or completed a request, broke the
 * row; being Ready alone does not (a small model loads in milliseconds, so a
 * runner killed at every start, or one that crashes on every request, would
 * otherwise respawn for ever). */
#define STABLE_NS (60ull * 1000000000ull)
static void count_failure(wrunner *r, const char *why)
{
    if (r->ready_ns && exo_clock_ns() - r->ready_ns >= STABLE_NS)
        r->failures = 0;
    r->ready_ns = 0;
    r->failures++;
    snprintf(r->last_error, sizeof r->last_error, "%s", why ? why : "unknown error");
    /* a cut may split a UTF-8 sequence: drop its lead bytes */
    size_t n = strlen(r->last_error);
    if (n == sizeof r->last_error - 1) {
        while (n && ((unsigned char)r->last_error[n - 1] & 0xC0) == 0x80)
            n--;
        if (n && (unsigned char)r->last_error[n - 1] >= 0xC0)
            n--;
        r->last_error[n] = 0;
    }
}

static void on_status(void *ctx, const exo_runner_status *st)
{
    wrunner *r = ctx;
    if (st->kind == EXO_RUNNER_FAILED && !r->retiring)
        count_failure(r, st->error_message);
    if (st->kind == EXO_RUNNER_READY && !r->ready_ns)
        r->ready_ns = exo_clock_ns();
    if (st->kind == EXO_RUNNER_FAILED)
        EXO_LOG_WARN("worker: runner %s (%s) failed: %s", r->runner_id.s, r->model_id,
                     st->error_message ? st->error_message : "?");
    else
        EXO_LOG_DEBUG("worker: runner %s is %s", r->runner_id.s, exo_runner_status_name(st->kind));
    r->last = st->kind;
    emit_runner_status(r, st);
    r->w->host.replan(r->w->host.ctx);
}

static void on_chunk(void *ctx, const char *command_id, const exo_chunk *c)
{
    wrunner *r = ctx;
    forwarded *f = fwd_find(r, command_id);
    if (!f)
        return;
    if (c->kind == EXO_CHUNK_ERROR && !f->error)
        f->error = exo_strdup(c->error ? c->error : "error");
    r->w->host.chunk(r->w->host.ctx, &f->command_id, c);
}

static void on_done(void *ctx, const char *command_id)
{
    wrunner *r = ctx;
    forwarded *f = fwd_find(r, command_id);
    if (f)
        finish_forwarded(r, f);
}

/* ---- processes -------------------------------------------------------------- */

static void arm(wrunner *r);

static void free_handle(uv_handle_t *h) { exo_free(h); }

static void close_poll(wrunner *r)
{
    if (!r->poll)
        return;
    uv_poll_stop(r->poll);
    uv_close((uv_handle_t *)r->poll, free_handle);
    r->poll = NULL;
}

static uint64_t backoff_ns(int failures, int first_ms)
{
    uint64_t ms = first_ms > 0 ? (uint64_t)first_ms : 500;
    for (int i = 1; i < failures && ms < 10000; i++)
        ms *= 2;
    return (ms > 10000 ? 10000 : ms) * 1000000ull;
}

static void on_backoff(uv_timer_t *t);

/* One timer serves every runner: it is set to the earliest deadline. */
static void wake_at(exo_worker *w, uint64_t deadline_ns)
{
    uint64_t now = exo_clock_ns();
    uint64_t ms = deadline_ns > now ? (deadline_ns - now + 999999) / 1000000 : 0;
    if (!uv_is_active((uv_handle_t *)&w->backoff) || uv_timer_get_due_in(&w->backoff) > ms)
        uv_timer_start(&w->backoff, on_backoff, ms, 0);
}

static void schedule_respawn(wrunner *r)
{
    uint64_t delay = r->failures ? backoff_ns(r->failures, r->w->cfg.backoff_ms) : 0;
    r->next_spawn_ns = exo_clock_ns() + delay;
    if (delay)
        wake_at(r->w, r->next_spawn_ns);
}

/* The process is gone (crash, or the exit we asked for). */
static void reap(wrunner *r)
{
    exo_worker *w = r->w;
    close_poll(r);
    while (r->fwd) { /* the supervisor answers every command; this is a safety net */
        exo_chunk c;
        exo_chunk_error(&c, "runner exited before completing the request");
        if (!r->fwd->error)
            r->fwd->error = exo_strdup(c.error);
        w->host.chunk(w->host.ctx, &r->fwd->command_id, &c);
        exo_chunk_free(&c);
        finish_forwarded(r, r->fwd);
    }
    exo_supervisor_free(r->sup);
    r->sup = NULL;
    r->retiring = false;
    if (r->last != EXO_RUNNER_FAILED && r->last != EXO_RUNNER_SHUTDOWN) {
        exo_runner_status st;
        exo_runner_status_init(&st, EXO_RUNNER_SHUTDOWN);
        emit_runner_status(r, &st);
        r->last = EXO_RUNNER_SHUTDOWN;
    }
    schedule_respawn(r);
    w->host.replan(w->host.ctx);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    wrunner *r = h->data;
    if (exo_supervisor_process(r->sup) == 1)
        reap(r);
    else
        arm(r);
}

static void arm(wrunner *r)
{
    if (!r->sup || !r->poll)
        return;
    short ev = exo_supervisor_poll_events(r->sup);
    int uv_ev = (ev & POLLIN ? UV_READABLE : 0) | (ev & POLLOUT ? UV_WRITABLE : 0);
    if (uv_ev)
        uv_poll_start(r->poll, uv_ev, on_poll);
    else
        uv_poll_stop(r->poll);
}

static void retire(wrunner *r)
{
    if (!r->sup || r->retiring)
        return;
    r->retiring = true;
    exo_err err;
    if (exo_supervisor_shutdown(r->sup, &err))
        EXO_LOG_DEBUG("worker: runner %s: %s", r->runner_id.s, err.msg);
    arm(r);
}

void exo_worker_ring_key(const uint8_t cluster_key[32], const exo_id *instance_id, char out[65])
{
    static const char label[] = "exo ring v1";
    uint8_t key[32];
    crypto_generichash_state h;
    crypto_generichash_init(&h, cluster_key, 32, sizeof key);
    crypto_generichash_update(&h, (const uint8_t *)label, sizeof label); /* with its NUL */
    crypto_generichash_update(&h, (const uint8_t *)instance_id->s, strlen(instance_id->s));
    crypto_generichash_final(&h, key, sizeof key);
    sodium_bin2hex(out, 65, key, sizeof key);
    sodium_memzero(key, sizeof key);
}

static int ranks_on_node(const exo_instance *inst, const exo_id *node_id)
{
    int n = 0;
    for (size_t i = 0; i < inst->n_shards; i++)
        n += exo_id_eq(&inst->shards[i].node_id, node_id);
    return n;
}

static void spawn(wrunner *r, const exo_instance *inst)
{
    exo_worker *w = r->w;
    const exo_worker_config *cfg = &w->cfg;
    char why[EXO_ERR_LEN + EXO_MODEL_ID_MAX + 64];
    exo_err err = {0};
    /* the files this shard loads: on disk, or downloaded first */
    const exo_shard *sh = inst ? exo_instance_shard_of_runner(inst, &r->runner_id) : NULL;
    exo_layer_shard need = {0};
    if (sh && inst->n_shards > 1 && inst->sharding == EXO_SHARDING_PIPELINE)
        need = (exo_layer_shard){sh->start_layer, sh->end_layer, sh->n_layers, false};
    char model_dir[4096];
    int drc = exo_downloads_ensure(w->downloads, r->model_id, &need, model_dir, sizeof model_dir, &err);
    if (drc == EXO_EBUSY)
        return; /* the download's end replans */
    if (drc) {
        snprintf(why, sizeof why, "model %s: %s", r->model_id, err.msg);
        count_failure(r, why);
        EXO_LOG_WARN("worker: %s", why);
        emit_runner_failed(r, why);
        r->last = EXO_RUNNER_FAILED;
        schedule_respawn(r);
        return;
    }
    char log_path[4096];
    if (cfg->runner_log_dir)
        snprintf(log_path, sizeof log_path, "%s/runner-%s.log", cfg->runner_log_dir, r->runner_id.s);
    exo_supervisor_opts o = {cfg->runner_bin, cfg->runner_log_dir ? log_path : NULL, cfg->verbose};
    exo_supervisor_callbacks cb = {r, on_status, on_chunk, on_done};
    exo_runner_load load = {.model_dir = model_dir, .n_threads = cfg->runner_threads,
                            .ctx = cfg->runner_ctx, .warmup_tokens = cfg->warmup_tokens, .world = 1};
    if (sh)
        snprintf(load.device, sizeof load.device, "%s", sh->device);
    int here = sh ? ranks_on_node(inst, &cfg->node_id) : 1;
    if (here > 1 && load.n_threads <= 0) { /* ranks of one node share its cores */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        load.n_threads = cpus >= 2 * here ? (int)(cpus / here) : 1;
    }
    if (sh && inst->n_shards > 1) {
        load.rank = sh->device_rank;
        load.world = sh->world_size;
        load.tensor = inst->sharding == EXO_SHARDING_TENSOR;
        load.start_layer = sh->start_layer;
        load.end_layer = sh->end_layer;
        load.ring_timeout_ms = cfg->ring_timeout_ms;
        exo_worker_ring_key(cfg->cluster_key, &inst->instance_id, load.ring_key);
    }
    r->connect_sent = false;
    r->ready_ns = 0;
    if (exo_supervisor_spawn(&o, &cb, &r->sup, &err) || exo_supervisor_load(r->sup, &load, &err)) {
        snprintf(why, sizeof why, "cannot start a runner: %s", err.msg);
        count_failure(r, why);
        EXO_LOG_ERROR("worker: %s", why);
        exo_supervisor_free(r->sup);
        r->sup = NULL;
        emit_runner_failed(r, why);
        r->last = EXO_RUNNER_FAILED;
        schedule_respawn(r);
        return;
    }
    EXO_LOG_INFO("worker: runner %s (pid %d) loading %s from %s", r->runner_id.s,
                 (int)exo_supervisor_pid(r->sup), r->model_id, model_dir);
    r->poll = exo_calloc(1, sizeof *r->poll);
    uv_poll_init(w->loop, r->poll, exo_supervisor_fd(r->sup));
    r->poll->data = r;
    arm(r);
}

/* ---- planning ------------------------------------------------------------- */

static wrunner *find_runner(exo_worker *w, const exo_id *runner_id)
{
    for (wrunner *r = w->runners; r; r = r->next)
        if (exo_id_eq(&r->runner_id, runner_id))
            return r;
    return NULL;
}

static void forward(wrunner *r, const exo_task *t)
{
    exo_worker *w = r->w;
    forwarded *f = exo_calloc(1, sizeof *f);
    f->task_id = t->task_id;
    f->command_id = t->command_id;
    f->next = r->fwd;
    r->fwd = f;
    emit_task_status(w, &t->task_id, EXO_TASK_RUNNING);

    exo_err err = {0};
    exo_gen_request req;
    exo_gen_request_init(&req);
    json_error_t jerr;
    json_t *j = json_loads(t->params_json, 0, &jerr);
    int rc = j ? exo_gen_request_from_json(j, &req, &err)
               : exo_err_set(&err, EXO_EFORMAT, "task parameters: %s", jerr.text);
    json_decref(j);
    if (!rc)
        rc = exo_supervisor_generate(r->sup, t->command_id.s, &req, &err);
    exo_gen_request_free(&req);
    if (rc) {
        exo_chunk c;
        exo_chunk_error(&c, err.msg);
        f->error = exo_strdup(err.msg);
        w->host.chunk(w->host.ctx, &f->command_id, &c);
        exo_chunk_free(&c);
        finish_forwarded(r, f);
    }
}

/* The numeric host part of "ip:port" / "[ip]:port". */
static bool host_of(const char *address, char *host, size_t cap)
{
    const char *colon = strrchr(address, ':');
    if (!colon)
        return false;
    const char *a = address, *b = colon;
    if (*a == '[' && b > a && b[-1] == ']') {
        a++;
        b--;
    }
    size_t n = (size_t)(b - a);
    if (!n || n >= cap)
        return false;
    memcpy(host, a, n);
    host[n] = 0;
    return true;
}

/* A runner waiting to join its ring: tell it where the next rank listens
 * once that rank has said so (its Connecting status carries the port), at
 * the address this node reached the next node's at (a topology edge). */
static void connect_ring(wrunner *r, const exo_state *st, const exo_instance *inst, const exo_shard *me)
{
    if (!me || inst->n_shards < 2)
        return;
    const exo_shard *next = &inst->shards[(me->device_rank + 1) % inst->n_shards];
    const exo_runner_status *ns = exo_state_runner_status(st, &next->runner_id);
    if (!ns || ns->kind != EXO_RUNNER_CONNECTING || ns->ring_port <= 0)
        return;
    char host[64] = "";
    int64_t best = -1;
    if (exo_id_eq(&next->node_id, &r->w->cfg.node_id)) /* another rank of this node (a GPU each) */
        snprintf(host, sizeof host, "127.0.0.1");
    for (size_t i = 0; i < exo_state_edge_count(st) && !host[0]; i++) {
        const exo_topology_edge *e = exo_state_edge_at(st, i);
        char h[64];
        if (!exo_id_eq(&e->source, &r->w->cfg.node_id) || !exo_id_eq(&e->sink, &next->node_id) ||
            !host_of(e->address, h, sizeof h))
            continue;
        /* the fastest measured address: a direct cable over Wi-Fi */
        if (best < 0 || (e->latency_us > 0 && e->latency_us < best)) {
            best = e->latency_us > 0 ? e->latency_us : INT64_MAX;
            snprintf(host, sizeof host, "%s", h);
        }
    }
    if (!host[0])
        return; /* no edge yet: the next State change tries again */
    exo_err err = {0};
    if (exo_supervisor_connect(r->sup, host, ns->ring_port, &err)) {
        EXO_LOG_WARN("worker: runner %s: %s", r->runner_id.s, err.msg);
        return;
    }
    r->connect_sent = true;
    EXO_LOG_INFO("worker: runner %s (rank %d of %zu) connects to rank %d at %s port %d", r->runner_id.s,
                 me->device_rank, inst->n_shards, next->device_rank, host, ns->ring_port);
}

static void plan_runner(wrunner *r, const exo_state *st)
{
    exo_worker *w = r->w;
    const exo_instance *inst = exo_state_instance(st, &r->instance_id);
    if (!inst) {
        retire(r);
        return;
    }
    if (!r->sup) {
        if (r->failures >= EXO_WORKER_MAX_FAILURES) {
            if (!r->deleting) {
                r->deleting = true;
                char why[EXO_MODEL_ID_MAX + sizeof r->last_error + 64];
                snprintf(why, sizeof why, "runner for %s failed %d times in a row: %s", r->model_id,
                         r->failures, r->last_error);
                EXO_LOG_ERROR("worker: %s; deleting instance %s", why, r->instance_id.s);
                exo_command cmd;
                exo_command_init(&cmd, EXO_COMMAND_DELETE_INSTANCE);
                cmd.u.delete_instance.instance_id = r->instance_id;
                cmd.u.delete_instance.reason = exo_strdup(why);
                w->host.command(w->host.ctx, &cmd);
            }
            return;
        }
        uint64_t now = exo_clock_ns();
        if (now >= r->next_spawn_ns)
            spawn(r, inst);
        else
            wake_at(w, r->next_spawn_ns);
        return;
    }
    if (r->retiring)
        return;
    exo_runner_status_kind k = exo_supervisor_status(r->sup)->kind;
    if (k == EXO_RUNNER_FAILED) {
        retire(r);
        return;
    }
    const exo_shard *me = exo_instance_shard_of_runner(inst, &r->runner_id);
    if (k == EXO_RUNNER_CONNECTING && !r->connect_sent)
        connect_ring(r, st, inst, me);
    /* a split model takes its requests at rank 0 */
    if ((k == EXO_RUNNER_READY || k == EXO_RUNNER_RUNNING) && me && me->device_rank == 0) {
        for (size_t i = 0; i < exo_state_task_count(st); i++) {
            const exo_task *t = exo_state_task_at(st, i);
            if (t->kind == EXO_TASK_KIND_TEXT_GENERATION && t->status == EXO_TASK_PENDING &&
                exo_id_eq(&t->instance_id, &r->instance_id) && !fwd_has_task(r, &t->task_id))
                forward(r, t);
        }
    }
    for (forwarded *f = r->fwd; f; f = f->next) {
        const exo_task *t = exo_state_task(st, &f->task_id);
        /* cancelled, or deleted: its request ended elsewhere (its API node
         * gave up on it); either way the runner stops */
        if ((!t || t->status == EXO_TASK_CANCELLED) && !f->cancel_sent) {
            f->cancel_sent = true;
            exo_err err;
            if (exo_supervisor_cancel(r->sup, f->command_id.s, &err))
                EXO_LOG_DEBUG("worker: cancel %s: %s", f->command_id.s, err.msg);
        }
    }
    arm(r);
}

void exo_worker_plan(exo_worker *w, const exo_state *st)
{
    /* records for this node's shards that are new */
    for (size_t i = 0; i < exo_state_instance_count(st); i++) {
        const exo_instance *inst = exo_state_instance_at(st, i);
        for (size_t k = 0; k < inst->n_shards; k++) { /* a node may hold several ranks, a GPU each */
            const exo_shard *sh = &inst->shards[k];
            if (!exo_id_eq(&sh->node_id, &w->cfg.node_id) || find_runner(w, &sh->runner_id))
                continue;
            wrunner *r = exo_calloc(1, sizeof *r);
            r->w = w;
            r->runner_id = sh->runner_id;
            r->instance_id = inst->instance_id;
            snprintf(r->model_id, sizeof r->model_id, "%s", inst->model_id);
            r->last = EXO_RUNNER__COUNT;
            r->next = w->runners;
            w->runners = r;
        }
    }
    for (wrunner **p = &w->runners; *p;) {
        wrunner *r = *p;
        plan_runner(r, st);
        if (!r->sup && !exo_state_instance(st, &r->instance_id)) {
            *p = r->next; /* instance gone and process gone: forget it */
            exo_free(r);
            continue;
        }
        p = &r->next;
    }
}

/* ---- life cycle ------------------------------------------------------------ */

static void on_backoff(uv_timer_t *t)
{
    exo_worker *w = t->data;
    w->host.replan(w->host.ctx);
}

exo_worker *exo_worker_new(uv_loop_t *loop, const exo_worker_config *cfg, const exo_worker_host *host)
{
    exo_worker *w = exo_calloc(1, sizeof *w);
    w->loop = loop;
    w->cfg = *cfg;
    w->host = *host;
    uv_timer_init(loop, &w->backoff);
    w->backoff.data = w;
    exo_downloads_host dh = {host->ctx, host->emit, host->replan};
    w->downloads = exo_downloads_new(loop, &cfg->node_id, cfg->models_dirs, cfg->n_models_dirs, &cfg->hub, &dh);
    return w;
}

int exo_worker_download(exo_worker *w, exo_download_action action, const char *model_id, exo_err *err)
{
    bool in_use = false;
    for (const wrunner *r = w->runners; r; r = r->next)
        in_use |= !strcmp(r->model_id, model_id);
    return exo_downloads_act(w->downloads, action, model_id, in_use, err);
}

void exo_worker_shutdown(exo_worker *w)
{
    for (wrunner *r = w->runners; r; r = r->next) {
        close_poll(r);
        exo_supervisor_free(r->sup); /* bounded; no callbacks */
        r->sup = NULL;
        while (r->fwd)
            fwd_remove(r, r->fwd);
    }
    uv_timer_stop(&w->backoff);
    uv_close((uv_handle_t *)&w->backoff, NULL);
    exo_downloads_shutdown(w->downloads);
}

void exo_worker_free(exo_worker *w)
{
    if (!w)
        return;
    while (w->runners) {
        wrunner *r = w->runners;
        w->runners = r->next;
        exo_free(r);
    }
    exo_downloads_free(w->downloads);
    exo_free(w);
}

int exo_worker_runner_count(const exo_worker *w)
{
    int n = 0;
    for (const wrunner *r = w->runners; r; r = r->next)
        n += r->sup != NULL;
    return n;
}
