/* The node loop (see node.h).
 *
 * One thread runs a libuv loop with everything cluster-facing on it: the
 * links (net.c), discovery, the election, the master's sequencer and the
 * worker. Other threads put work in the inbox (under the node mutex) and
 * wake the loop with uv_async_send. On the loop thread, everything that
 * changes the State goes through one queue of actions that settle() drains
 * in order before it lets the worker plan again, so the worker, which
 * iterates the State while it plans, never sees the State change under it.
 *
 * Roles. Every node is its own master until an election says otherwise
 * (a node alone is a cluster of one). The master numbers events (index()),
 * every node applies them in index order (apply_indexed()), and all of a
 * node's own facts (runner statuses, node info, task results) go through
 * emit_local(): indexed at once on the master, queued in the outbox and
 * sent to the master elsewhere. Commands from this node's API go through
 * submit(): handled at once on the master when no election runs, else
 * held and sent to the master, which acknowledges or refuses each.
 *
 * Sessions. A new master starts a new session: it archives its log, turns
 * its State into the events that rebuild it (dropping nodes it cannot
 * reach) and indexes them from 0. A follower of a new session builds the
 * new State aside (next_state) while it catches up, keeps serving the old
 * one, and swaps when it holds every event the master announced. So runners
 * keep running across a failover.
 *
 * Token chunks do not wait for settle(): the worker hands them straight to
 * the generation's sink, or to the link of the node whose API holds the
 * request.
 *
 * Disk work stays off the loop thread: the log's fdatasync, node-info
 * gathering (it scans the models dirs) and catch-up reads of the log run on
 * libuv's thread pool.
 *
 * The mutex guards what API threads read or add to: the State, the inbox,
 * the list of open generations and the cluster view. Sinks are called
 * without it held. */
#include "cluster/node.h"

#include "cluster/election.h"
#include "cluster/event_log.h"
#include "cluster/master.h"
#include "cluster/messages.h"
#include "cluster/node_info.h"
#include "cluster/placement.h"
#include "cluster/replication.h"
#include "cluster/snapshot.h"
#include "cluster/worker.h"
#include "core/json_util.h"
#include "core/alloc.h"
#include "download/catalogue.h"
#include "core/clock.h"
#include "core/log.h"
#include "net/discovery.h"
#include "net/identity.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uv.h>

#define TICK_MS              100
#define INFO_CHECK_MS        10000   /* node info: gathered this often, published when it changed */
#define INFO_REFRESH_MS      300000  /* and at least this often (liveness is the links') */
#define HEAD_MS              1000    /* the master's heartbeat */
#define RESEND_MS            2000    /* unacknowledged local events and commands */
#define NODE_TIMEOUT_MS      10000   /* a node unreachable this long leaves the State */
#define PROBE_MS             10000   /* topology: each peer address measured this often */
#define PROBE_BULK_BYTES     (1u << 20)
#define PROBE_BULK_MS        60000   /* and its bandwidth this often */
#define DIAL_WAIT_MS         2000    /* the smaller id dials only if the greater did not */
#define CATCHUP_BATCH        1000    /* events per EventRequest answer, as exo */
#define FLUSH_DELAY_MS       200     /* group commit of the log (see docs/DAEMON.md) */
#define CHECKPOINT_EVENTS    10000   /* a State snapshot + log compaction every this many events */
#define CHECKPOINT_BYTES     (8u << 20) /* or this many bytes of log, whichever comes first */
#define MAX_PENDING_COMMANDS 4096
#define STALL_TIMEOUT_MS     300000  /* default of exo_node_config.stall_timeout_ms */
#define STALL_CHECK_MS       250     /* open requests checked this often */
#define SEEN_COMMANDS        4096

typedef enum { ACT_EVENT, ACT_COMMAND, ACT_DONE, ACT_CANCEL, ACT_DOWNLOAD } action_kind;

typedef struct action {
    action_kind    kind;
    exo_event      ev;  /* ACT_EVENT */
    exo_command    cmd; /* ACT_COMMAND */
    exo_id         id;  /* ACT_DONE, ACT_CANCEL: the command id */
    exo_id         target;        /* ACT_DOWNLOAD: the node */
    exo_msg_download download;    /* ACT_DOWNLOAD */
    struct action *next;
} action;

typedef struct action_queue {
    action *head, *tail;
} action_queue;

/* A generation whose API is on this node. waiting_since_ms: since when it
 * waits for its next chunk while it should be moving (see check_requests). */
typedef struct gen {
    exo_id       command_id;
    exo_gen_sink sink;
    uint64_t     waiting_since_ms;
    struct gen  *next;
} gen;

/* A command waiting for the master's acknowledgement. */
typedef struct pending_cmd {
    exo_command         cmd;
    uint64_t            sent_ms;  /* 0: not sent to the current master */
    struct pending_cmd *next;
} pending_cmd;

/* A node we heard of (discovery) or were linked to. */
typedef struct peer {
    exo_id                  id;
    struct sockaddr_storage addr;     /* where it listens (discovery, or a peer's Peers message) */
    bool                    has_addr;
    uint64_t                first_heard_ms, last_heard_ms, next_dial_ms;
    bool                    connected;
    uint64_t                down_since_ms; /* when the link went down (0: never up) */
    char                    remote[EXO_NET_ADDR_LEN];
    uint64_t                next_probe_ms, next_bulk_ms;
    unsigned                dial_turn;    /* which reported address to try next */
    struct peer            *next;
} peer;

struct exo_node {
    exo_node_config cfg;
    const char     *namespace_;
    char           *bootstrap_copy[EXO_MAX_BOOTSTRAP_PEERS];
    exo_identity    identity;
    exo_net_keys    keys;
    exo_id          node_id;
    pthread_t       thread;
    bool            thread_started, loop_inited;
    uv_loop_t       loop;
    uv_async_t      wake;
    uv_timer_t      tick_timer, election_timer, flush_timer;

    pthread_mutex_t mu;       /* guards the fields below up to `view` */
    exo_state      *state;    /* the State API threads and the worker see */
    action_queue    inbox;    /* from other threads */
    gen            *gens;
    bool            stopping;
    json_t         *view;     /* exo_node_cluster_json */

    /* loop thread only */
    exo_event_log  *log;
    exo_net        *net;
    exo_discovery  *disc;
    exo_election   *election;
    exo_session     session;
    bool            is_master;
    uint64_t        session_start_ms;
    exo_sequencer  *seq;         /* master */
    exo_replica    *replica;     /* follower */
    exo_state      *next_state;  /* follower catching up with a new session */
    exo_outbox     *outbox;
    pending_cmd    *pending;
    size_t          n_pending;
    exo_id          seen[SEEN_COMMANDS]; /* master: commands already handled */
    size_t          n_seen;
    peer           *peers;
    action_queue    local;
    bool            dirty, unflushed, flushing;
    uv_work_t       flush_work;
    exo_worker     *worker;
    exo_hub_opts    hub;         /* where models come from (immutable) */
    exo_node_info   published;   /* the last node info published */
    bool            has_published;
    uint64_t        published_ms, next_info_ms;
    bool            gathering;
    uint64_t        next_head_ms;
    uint64_t        next_stall_check_ms;
    int             catchups_running;
    bool            checkpointing;        /* a snapshot + compaction runs on the thread pool */
    uint64_t        ckpt_every;           /* CHECKPOINT_EVENTS, or EXO_EVENT_LOG_CHECKPOINT_EVERY (tests) */
    uint64_t        ckpt_count_mark, ckpt_bytes_mark; /* the log at the last checkpoint */
};

static uint64_t now_ms(void) { return exo_clock_ns() / 1000000; }

/* Unix ms, for the times events carry. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Links and dialling (defined with the peer handling below). */
static void send_peers(exo_node *n, const char *to);
static void on_peers(exo_node *n, const char *from, const exo_msg_peers *m);
static int  sockaddr_of(const char *host, int port, bool names, struct sockaddr_storage *ss);
static void try_dial(exo_node *n, peer *p);
static void settle(exo_node *n);

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

/* Looks a generation up for a chunk of it and copies its sink (false if it
 * is not open); the chunk is progress, so the stall clock restarts. */
static bool gen_sink(exo_node *n, const exo_id *id, exo_gen_sink *out)
{
    pthread_mutex_lock(&n->mu);
    gen *g = gen_find_locked(n, id);
    if (g) {
        *out = g->sink;
        g->waiting_since_ms = now_ms();
    }
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

static void cancel_command_later(exo_node *n, const exo_id *command_id)
{
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_TASK_CANCELLED);
    cmd.u.task_cancelled.cancelled_command_id = *command_id;
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

static void end_with_error(exo_node *n, const exo_id *command_id, int status, const char *message)
{
    exo_chunk c;
    exo_chunk_error_status(&c, status, message);
    end_generation(n, command_id, &c);
    exo_chunk_free(&c);
}

static peer *peer_find(exo_node *n, const char *id)
{
    for (peer *p = n->peers; p; p = p->next)
        if (!strcmp(p->id.s, id))
            return p;
    return NULL;
}

static peer *peer_get(exo_node *n, const char *id)
{
    peer *p = peer_find(n, id);
    if (p)
        return p;
    p = exo_calloc(1, sizeof *p);
    snprintf(p->id.s, sizeof p->id.s, "%.63s", id);
    p->first_heard_ms = now_ms();
    p->next = n->peers;
    n->peers = p;
    return p;
}

static bool linked(exo_node *n, const exo_id *id)
{
    return exo_id_eq(id, &n->node_id) || (n->net && exo_net_connected(n->net, id->s));
}

/* ---- the cluster view for the API ------------------------------------------------- */

static void update_view(exo_node *n)
{
    json_t *peers = json_array();
    if (n->net) {
        exo_net_peer_info info[64];
        size_t k = exo_net_peers(n->net, info, 64);
        for (size_t i = 0; i < k && i < 64; i++)
            json_array_append_new(peers, json_pack("{s:s, s:s, s:b, s:I}", "nodeId", info[i].id, "remote",
                                                   info[i].remote, "dialed", info[i].dialed, "rttUs",
                                                   (json_int_t)info[i].rtt_us));
    }
    bool election = n->election && exo_election_in_progress(n->election);
    json_t *v = json_pack("{s:s, s:s, s:s, s:I, s:b, s:b, s:b, s:i, s:o}", "nodeId", n->node_id.s, "namespace",
                          n->namespace_, "masterNodeId", n->session.master.s, "sessionClock",
                          (json_int_t)n->session.clock, "isMaster", n->is_master, "electionInProgress", election,
                          "caughtUp", n->next_state == NULL, "clusterPort", n->net ? exo_net_port(n->net) : 0,
                          "peers", peers);
    pthread_mutex_lock(&n->mu);
    json_decref(n->view);
    n->view = v;
    pthread_mutex_unlock(&n->mu);
}

/* ---- sending -------------------------------------------------------------------------- */

static int send_msg(exo_node *n, const char *to, int type, const void *msg)
{
    uint8_t *buf;
    size_t len;
    exo_err err = {0};
    int rc = exo_msg_encode(type, msg, &buf, &len, &err);
    if (rc < 0) {
        EXO_LOG_ERROR("node: cannot encode %s: %s", exo_msg_type_name(type), err.msg);
        return rc;
    }
    if (to)
        rc = exo_net_send(n->net, to, (uint8_t)type, buf, len, &err);
    else
        exo_net_broadcast(n->net, (uint8_t)type, buf, len);
    if (rc < 0)
        EXO_LOG_DEBUG("node: %s to %s: %s", exo_msg_type_name(type), to, err.msg);
    exo_free(buf);
    return rc;
}

/* ---- applying events --------------------------------------------------------------- */

static void flush_work_cb(uv_work_t *w)
{
    exo_node *n = w->data;
    exo_err err;
    if (exo_event_log_flush(n->log, &err))
        EXO_LOG_ERROR("node: event log: %s", err.msg);
}

static void flush_done_cb(uv_work_t *w, int status)
{
    exo_node *n = w->data;
    n->flushing = false;
}

static void on_flush(uv_timer_t *t)
{
    exo_node *n = t->data;
    if (n->flushing) { /* one sync at a time; the next timer catches up */
        n->unflushed = true;
        return;
    }
    n->flushing = true;
    n->flush_work.data = n;
    if (uv_queue_work(&n->loop, &n->flush_work, flush_work_cb, flush_done_cb) < 0)
        n->flushing = false;
}

/* The open requests of an instance that is being deleted (at most max). */
static size_t gens_of_instance_locked(exo_node *n, const exo_state *st, const exo_id *instance_id, exo_id *out,
                                      size_t max)
{
    size_t k = 0;
    for (gen *g = n->gens; g && k < max; g = g->next) {
        const exo_task *t = exo_state_task_for_command(st, &g->command_id);
        if (t && exo_id_eq(&t->instance_id, instance_id))
            out[k++] = g->command_id;
    }
    return k;
}

/* Requests whose instance was deleted end with an error that says why. */
static void end_requests_of_deleted(exo_node *n, const exo_event *ev, const exo_id *ids, size_t k)
{
    const char *model = ev->u.instance_deleted.model_id;
    const char *why = ev->u.instance_deleted.reason ? ev->u.instance_deleted.reason : "deleted";
    for (size_t i = 0; i < k; i++) {
        char msg[EXO_DELETE_REASON_MAX + EXO_MODEL_ID_MAX + 128];
        snprintf(msg, sizeof msg, "the instance serving this request (%.64s%s%s) was deleted: %s",
                 ev->u.instance_deleted.instance_id.s, model[0] ? ", " : "", model, why);
        end_with_error(n, &ids[i], 503, msg);
    }
}

/* What a fold changes for this node's own requests: a pending request the
 * master cancelled never reaches a runner, so it is answered here; a task
 * that vanished while its request was open ends it. */
static void after_apply(exo_node *n, const exo_event *ev, exo_id *answer_cancelled, const exo_id *orphaned)
{
    if (!exo_id_is_empty(orphaned))
        end_with_error(n, orphaned, 500, "the master removed this request's task before it finished");
    if (!exo_id_is_empty(answer_cancelled)) {
        exo_chunk c;
        exo_usage usage = {0};
        exo_chunk_finish(&c, EXO_FR_CANCELLED, &usage, 0, 0);
        end_generation(n, answer_cancelled, &c);
        exo_chunk_free(&c);
    }
}

/* ---- snapshots and compaction of the log ---------------------------------------------- */

typedef struct ckpt_job {
    uv_work_t work;
    exo_node *n;
    uint8_t  *snap;
    size_t    len;
    uint64_t  epoch, count, dropped;
    int       rc;
    exo_err   err;
} ckpt_job;

static void ckpt_work(uv_work_t *w)
{
    ckpt_job *j = w->data;
    j->rc = exo_event_log_checkpoint(j->n->log, j->snap, j->len, false, j->epoch, &j->dropped, &j->err);
}

static void maybe_checkpoint(exo_node *n, const exo_state *session_state);

static void ckpt_done(uv_work_t *w, int status)
{
    ckpt_job *j = w->data;
    exo_node *n = j->n;
    n->checkpointing = false;
    if (j->rc == 0)
        EXO_LOG_DEBUG("node: event log snapshot at %llu (%zu bytes), %llu events compacted away",
                      (unsigned long long)j->count, j->len, (unsigned long long)j->dropped);
    else if (j->rc != EXO_ECANCELED)
        EXO_LOG_WARN("node: event log snapshot: %s", j->err.msg);
    if (j->rc != EXO_ECANCELED) { /* a failure waits for the next interval too, not the next event */
        n->ckpt_count_mark = j->count;
        n->ckpt_bytes_mark = exo_event_log_bytes(n->log);
    }
    exo_free(j->snap);
    exo_free(j);
    /* events that arrived while this one was written were let pass: if they
     * make another interval, it starts now rather than at the next event,
     * which on an idle cluster may not come for a long time */
    maybe_checkpoint(n, n->next_state ? n->next_state : n->state);
}

/* Every CHECKPOINT_EVENTS events or CHECKPOINT_BYTES of log: snapshot the
 * session's State here (the loop owns it) and write it and compact the
 * log on the thread pool (event_log.h: the log keeps about two intervals). */
static void maybe_checkpoint(exo_node *n, const exo_state *session_state)
{
    uint64_t count = exo_event_log_count(n->log), bytes = exo_event_log_bytes(n->log);
    if (n->checkpointing || n->stopping ||
        (count - n->ckpt_count_mark < n->ckpt_every && bytes - n->ckpt_bytes_mark < CHECKPOINT_BYTES))
        return;
    if ((uint64_t)(exo_state_last_event_applied_idx(session_state) + 1) != count)
        return; /* the log missed an event (a failed append): a snapshot would not match it */
    ckpt_job *j = exo_calloc(1, sizeof *j);
    j->n = n;
    j->count = count;
    j->epoch = exo_event_log_epoch(n->log);
    if (exo_snapshot_encode(session_state, true, &j->snap, &j->len, &j->err) < 0) {
        EXO_LOG_WARN("node: event log snapshot: %s", j->err.msg);
        n->ckpt_count_mark = count;
        exo_free(j);
        return;
    }
    j->work.data = j;
    n->checkpointing = true;
    if (uv_queue_work(&n->loop, &j->work, ckpt_work, ckpt_done) < 0) {
        n->checkpointing = false;
        exo_free(j->snap);
        exo_free(j);
    }
}

/* Applies event idx to `target` (the live State or the one being built)
 * and logs it. */
static int apply_to(exo_node *n, exo_state *target, uint64_t idx, const exo_event *ev)
{
    exo_err err = {0};
    exo_id answer = {{0}}, orphaned = {{0}}, of_deleted[64];
    size_t n_of_deleted = 0;
    pthread_mutex_lock(&n->mu);
    if (ev->kind == EXO_EVENT_INSTANCE_DELETED)
        n_of_deleted = gens_of_instance_locked(n, target, &ev->u.instance_deleted.instance_id, of_deleted, 64);
    else if (ev->kind == EXO_EVENT_TASK_STATUS_UPDATED && ev->u.task_status_updated.status == EXO_TASK_CANCELLED) {
        const exo_task *t = exo_state_task(target, &ev->u.task_status_updated.task_id);
        if (t && t->kind == EXO_TASK_KIND_TEXT_GENERATION && t->status == EXO_TASK_PENDING)
            answer = t->command_id;
    } else if (ev->kind == EXO_EVENT_TASK_DELETED) {
        const exo_task *t = exo_state_task(target, &ev->u.task_deleted.task_id);
        if (t && t->kind == EXO_TASK_KIND_TEXT_GENERATION && gen_find_locked(n, &t->command_id))
            orphaned = t->command_id;
    }
    int rc = exo_state_apply(target, (int64_t)idx, ev, &err);
    pthread_mutex_unlock(&n->mu);
    if (rc) {
        /* an event the fold refuses is a bug: the State stays as it was */
        EXO_LOG_ERROR("node: event %llu (%s) not applied: %s", (unsigned long long)idx,
                      exo_event_kind_name(ev->kind), err.msg);
        return rc;
    }
    /* a prompt never reaches the disk: the log holds the task without it
     * (the State in memory keeps it while the task lives) */
    exo_event redacted;
    bool red = exo_event_redact(ev, &redacted);
    uint64_t logged;
    if (exo_event_log_append_event(n->log, red ? &redacted : ev, &logged, &err))
        EXO_LOG_ERROR("node: event log: %s", err.msg);
    if (red)
        exo_event_clear(&redacted);
    n->unflushed = true;
    n->dirty = true;
    maybe_checkpoint(n, target);
    if (n_of_deleted)
        end_requests_of_deleted(n, ev, of_deleted, n_of_deleted);
    after_apply(n, ev, &answer, &orphaned);
    return 0;
}

/* ---- the master's side -------------------------------------------------------------------- */

/* Numbers an event of the session, applies and logs it, and sends it to
 * every follower. system/origin_idx name the LocalEvent it came from. */
static void index_event(exo_node *n, exo_event *ev, const exo_id *system, uint64_t origin_idx)
{
    if (ev->kind == EXO_EVENT_NODE_GATHERED_INFO) /* the master's clock, as exo */
        ev->u.node_gathered_info.when_ms = (int64_t)time(NULL) * 1000;
    if (ev->kind == EXO_EVENT_INSTANCE_DELETED && !ev->u.instance_deleted.when_ms) /* carried ones keep theirs */
        ev->u.instance_deleted.when_ms = wall_ms();
    uint64_t idx = (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1);
    if (apply_to(n, n->state, idx, ev))
        return;
    exo_msg_global_event g;
    memset(&g, 0, sizeof g);
    g.session = n->session;
    g.idx = idx;
    g.count = idx + 1;
    if (system)
        g.system = *system;
    g.origin_idx = origin_idx;
    g.event = *ev; /* borrowed for the encode */
    send_msg(n, NULL, EXO_MSG_GLOBAL_EVENT, &g);
}

static void sequencer_ready(void *ctx, const exo_id *system, uint64_t origin_idx, exo_event *ev)
{
    index_event(ctx, ev, system, origin_idx);
    exo_event_clear(ev);
}

static bool command_seen(exo_node *n, const exo_id *id)
{
    size_t k = n->n_seen < SEEN_COMMANDS ? n->n_seen : SEEN_COMMANDS;
    for (size_t i = 0; i < k; i++)
        if (exo_id_eq(&n->seen[i], id))
            return true;
    n->seen[n->n_seen++ % SEEN_COMMANDS] = *id;
    return false;
}

/* The master's command processor; the error (if any) is the caller's to
 * report. */
static int master_handle(exo_node *n, const exo_command *cmd, exo_err *err)
{
    exo_event_list events = {0};
    pthread_mutex_lock(&n->mu);
    int rc = exo_master_handle(n->state, cmd, &events, err);
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < events.n; i++)
        index_event(n, &events.v[i], NULL, 0);
    exo_event_list_clear(&events);
    exo_election_command_seen(n->election);
    return rc;
}

/* What to do when a command this node submitted was refused (code: the
 * EXO_E* reason, which picks the HTTP status a waiting request gets). */
static void command_refused(exo_node *n, const exo_command *cmd, int code, const char *why)
{
    int status = code == EXO_ENOENT ? 404 : code == EXO_EBUSY ? 503 : 400;
    if (cmd->kind == EXO_COMMAND_TEXT_GENERATION)
        end_with_error(n, &cmd->command_id, status, why);
    else if (cmd->kind != EXO_COMMAND_TASK_CANCELLED && cmd->kind != EXO_COMMAND_TASK_FINISHED)
        EXO_LOG_WARN("node: %s: %s", exo_command_kind_name(cmd->kind), why);
    /* a cancel or finish of a command that already ended is normal */
}

/* ---- local facts and commands ------------------------------------------------------------ */

static void send_local(void *ctx, uint64_t origin_idx, const exo_event *ev)
{
    exo_node *n = ctx;
    exo_msg_local_event m;
    memset(&m, 0, sizeof m);
    m.session = n->session;
    m.origin = n->node_id;
    m.system = *exo_outbox_system(n->outbox);
    m.origin_idx = origin_idx;
    m.event = *ev; /* borrowed */
    send_msg(n, n->session.master.s, EXO_MSG_LOCAL_EVENT, &m);
}

static void emit_local(exo_node *n, exo_event *ev)
{
    if (n->is_master) {
        index_event(n, ev, NULL, 0);
        exo_event_clear(ev);
        return;
    }
    exo_outbox_push(n->outbox, ev);
    if (!exo_election_in_progress(n->election) && linked(n, &n->session.master))
        exo_outbox_send_due(n->outbox, now_ms(), RESEND_MS, send_local, n);
}

static void send_pending(exo_node *n, bool all)
{
    if (n->is_master || exo_election_in_progress(n->election) || !linked(n, &n->session.master))
        return;
    uint64_t now = now_ms();
    for (pending_cmd *p = n->pending; p; p = p->next) {
        if (!all && p->sent_ms && now < p->sent_ms + RESEND_MS)
            continue;
        exo_msg_command m = {n->node_id, p->cmd};
        if (send_msg(n, n->session.master.s, EXO_MSG_COMMAND, &m) == 0)
            p->sent_ms = now;
    }
}

/* Takes cmd (left empty). */
static void submit(exo_node *n, exo_command *cmd)
{
    if (n->is_master && !exo_election_in_progress(n->election)) {
        exo_err err = {0};
        command_seen(n, &cmd->command_id);
        int rc = master_handle(n, cmd, &err);
        if (rc < 0)
            command_refused(n, cmd, rc, err.msg);
        exo_command_clear(cmd);
        return;
    }
    if (n->n_pending >= MAX_PENDING_COMMANDS) {
        command_refused(n, cmd, EXO_EBUSY, "too many commands wait for a master");
        exo_command_clear(cmd);
        return;
    }
    pending_cmd *p = exo_calloc(1, sizeof *p), **tail = &n->pending;
    p->cmd = *cmd; /* moved */
    memset(cmd, 0, sizeof *cmd);
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    n->n_pending++;
    send_pending(n, false);
}

/* Held commands, when this node is the master and no election is open:
 * while one is, submit would hold them again, so they wait for its end
 * (drive_election; running them here then looped forever: CI saw a
 * daemon spin in this loop, a new campaign open as it became master). */
static void run_pending_here(exo_node *n)
{
    if (exo_election_in_progress(n->election))
        return;
    while (n->pending) {
        pending_cmd *p = n->pending;
        n->pending = p->next;
        n->n_pending--;
        submit(n, &p->cmd);
        exo_free(p);
    }
}

static void pending_ack(exo_node *n, const exo_msg_command_ack *a)
{
    for (pending_cmd **pp = &n->pending; *pp; pp = &(*pp)->next) {
        pending_cmd *p = *pp;
        if (!exo_id_eq(&p->cmd.command_id, &a->command_id))
            continue;
        *pp = p->next;
        n->n_pending--;
        if (a->code < 0)
            command_refused(n, &p->cmd, a->code, a->error ? a->error : "refused by the master");
        exo_command_clear(&p->cmd);
        exo_free(p);
        return;
    }
}

/* ---- sessions ------------------------------------------------------------------------------ */

static void swap_in_next_state(exo_node *n)
{
    pthread_mutex_lock(&n->mu);
    exo_state_free(n->state);
    n->state = n->next_state;
    n->next_state = NULL;
    pthread_mutex_unlock(&n->mu);
    n->dirty = true;
    EXO_LOG_INFO("node: caught up with master %s (%llu events)", n->session.master.s,
                 (unsigned long long)exo_replica_next(n->replica));
    update_view(n);
}

static void maybe_caught_up(exo_node *n)
{
    if (n->next_state && exo_replica_next(n->replica) >= exo_replica_known_count(n->replica) &&
        exo_replica_known_count(n->replica) > 0)
        swap_in_next_state(n);
}

static void start_info_gather(exo_node *n);

/* Compressing a sealed log is disk work: it runs on the thread pool. */
typedef struct archive_job {
    uv_work_t work;
    char      path[4200];
} archive_job;

static void archive_work(uv_work_t *w)
{
    archive_job *j = w->data;
    exo_err err;
    if (exo_event_log_archive(j->path, &err))
        EXO_LOG_WARN("node: %s", err.msg);
}

static void archive_done(uv_work_t *w, int status) { exo_free(w->data); }

/* A new session: seal the log (a rename), archive the old one off the loop. */
static void rotate_log(exo_node *n)
{
    archive_job *j = exo_calloc(1, sizeof *j);
    exo_err err;
    if (exo_event_log_rotate(n->log, j->path, sizeof j->path, &err))
        EXO_LOG_ERROR("node: event log: %s", err.msg);
    n->ckpt_count_mark = n->ckpt_bytes_mark = 0;
    j->work.data = j;
    if (!j->path[0] || uv_queue_work(&n->loop, &j->work, archive_work, archive_done) < 0)
        exo_free(j); /* nothing sealed (an archive left behind is taken care of at the next start) */
}

static bool node_in_session(exo_node *n, const exo_id *id) { return linked(n, id); }

static void index_own(void *ctx, uint64_t origin_idx, const exo_event *ev)
{
    exo_event copy;
    exo_event_copy(&copy, ev);
    index_event(ctx, &copy, NULL, 0);
    exo_event_clear(&copy);
}

static void become_master(exo_node *n)
{
    n->is_master = true;
    exo_sequencer_free(n->seq);
    n->seq = exo_sequencer_new();
    /* the State to carry over: the live one (a half-built next_state is
     * dropped; the live one is what this node last knew completely) */
    exo_state *from = n->state;
    if (n->next_state) {
        exo_state_free(n->next_state);
        n->next_state = NULL;
    }
    exo_event_list snap = {0};
    exo_state_to_events(from, &snap);
    rotate_log(n);
    pthread_mutex_lock(&n->mu);
    n->state = exo_state_new();
    pthread_mutex_unlock(&n->mu);
    size_t kept = 0;
    for (size_t i = 0; i < snap.n; i++) {
        exo_event *ev = &snap.v[i];
        /* nodes this master cannot reach are not in its session */
        if (ev->kind == EXO_EVENT_NODE_GATHERED_INFO && !node_in_session(n, &ev->u.node_gathered_info.node_id))
            continue;
        if (ev->kind == EXO_EVENT_TOPOLOGY_EDGE_CREATED &&
            (!node_in_session(n, &ev->u.topology_edge_created.edge.source) ||
             !node_in_session(n, &ev->u.topology_edge_created.edge.sink)))
            continue;
        index_event(n, ev, NULL, 0);
        kept++;
    }
    exo_event_list_clear(&snap);
    exo_state_free(from);
    EXO_LOG_INFO("node: master of session %llu (%zu events carried over)", (unsigned long long)n->session.clock,
                 kept);
    /* this node's unacknowledged facts go into the new session directly */
    exo_outbox_send_due(n->outbox, now_ms(), 0, index_own, n);
    exo_outbox_ack(n->outbox, exo_outbox_system(n->outbox), UINT64_MAX);
    exo_outbox_reset(n->outbox);
    n->next_head_ms = 0;
    n->has_published = false; /* publish our info again */
    start_info_gather(n);
    run_pending_here(n);
    n->dirty = true;
}

static void become_follower(exo_node *n)
{
    n->is_master = false;
    exo_sequencer_free(n->seq);
    n->seq = NULL;
    exo_replica_reset(n->replica);
    if (n->next_state)
        exo_state_free(n->next_state);
    n->next_state = exo_state_new();
    rotate_log(n);
    exo_outbox_reset(n->outbox);
    for (pending_cmd *p = n->pending; p; p = p->next)
        p->sent_ms = 0;
    n->has_published = false;
    start_info_gather(n);
    EXO_LOG_INFO("node: following master %s (session %llu)", n->session.master.s,
                 (unsigned long long)n->session.clock);
    if (linked(n, &n->session.master)) {
        exo_msg_event_request r = {n->session, 0};
        send_msg(n, n->session.master.s, EXO_MSG_EVENT_REQUEST, &r);
    }
}

static void drive_election(exo_node *n);

static void on_election_timer(uv_timer_t *t) { drive_election(t->data); }

/* Sends what the election wants sent, acts on its results and sets its
 * timer. */
static void drive_election(exo_node *n)
{
    uint64_t now = now_ms();
    exo_election_tick(n->election, now);
    exo_election_msg m;
    while (exo_election_pop_broadcast(n->election, &m)) {
        uint8_t wire[EXO_ELECTION_MSG_MAX_BYTES];
        size_t len;
        exo_err err = {0};
        if (exo_election_msg_encode(&m, wire, sizeof wire, &len, &err) == 0)
            exo_net_broadcast(n->net, EXO_MSG_ELECTION, wire, len);
        else
            EXO_LOG_ERROR("node: election message: %s", err.msg);
    }
    exo_election_result r;
    bool changed = false;
    while (exo_election_pop_result(n->election, &r)) {
        changed = true;
        if (!r.is_new_master)
            continue;
        n->session.master = r.master;
        n->session.clock = r.session_clock;
        n->session_start_ms = now;
        if (r.is_self)
            become_master(n);
        else
            become_follower(n);
    }
    if (changed || !exo_election_in_progress(n->election)) {
        /* commands held during the campaign go out now */
        if (n->is_master)
            run_pending_here(n);
        else
            send_pending(n, false);
    }
    uint64_t due = exo_election_next_deadline_ms(n->election);
    if (due != UINT64_MAX)
        uv_timer_start(&n->election_timer, on_election_timer, due > now ? due - now : 0, 0);
    else
        uv_timer_stop(&n->election_timer);
    update_view(n);
}

/* ---- catch-up reads (off the loop) -------------------------------------------------------- */

typedef struct catchup {
    uv_work_t   work;
    exo_node   *n;
    exo_id      to;
    exo_session session;
    uint64_t    since, count;
    exo_event  *events;
    size_t      n_events;
    int         rc;
} catchup;

static void catchup_work(uv_work_t *w)
{
    catchup *c = w->data;
    exo_err err = {0};
    c->rc = exo_event_log_read_range(c->n->log, c->since, CATCHUP_BATCH, &c->events, &c->n_events, &err);
    if (c->rc)
        EXO_LOG_WARN("node: reading events from %llu for %s: %s", (unsigned long long)c->since, c->to.s, err.msg);
}

/* The log holds generation tasks without their prompts; a task that is
 * still in the State gets its params back from memory before it goes to a
 * follower (which may be the node that runs it). */
static void restore_params(exo_node *n, exo_event *ev)
{
    if (ev->kind != EXO_EVENT_TASK_CREATED)
        return;
    exo_task *t = &ev->u.task_created.task;
    const exo_task *live = exo_state_task(n->state, &t->task_id);
    if (!live || !live->params_json || (t->params_json && !strcmp(t->params_json, live->params_json)))
        return;
    exo_free(t->params_json);
    t->params_json = exo_strdup(live->params_json);
}

static void catchup_done(uv_work_t *w, int status)
{
    catchup *c = w->data;
    exo_node *n = c->n;
    n->catchups_running--;
    if (c->rc == 0 && n->is_master && exo_session_eq(&c->session, &n->session) && !n->stopping) {
        for (size_t i = 0; i < c->n_events; i++) {
            restore_params(n, &c->events[i]);
            exo_msg_global_event g;
            memset(&g, 0, sizeof g);
            g.session = n->session;
            g.idx = c->since + i;
            g.count = c->count > g.idx ? c->count : g.idx + 1;
            g.event = c->events[i];
            if (send_msg(n, c->to.s, EXO_MSG_GLOBAL_EVENT, &g) < 0)
                break; /* its queue is full: it asks again */
        }
    }
    exo_event_log_free_events(c->events, c->n_events);
    exo_free(c);
}

/* A follower asked for events the log compacted away: it gets the events
 * that rebuild the State instead (from memory, prompts included). */
static void send_snapshot(exo_node *n, const char *to)
{
    exo_event_list evs = {0};
    exo_state_to_events(n->state, &evs);
    exo_msg_snapshot m;
    memset(&m, 0, sizeof m);
    m.session = n->session;
    m.count = (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1);
    m.events.n = evs.n;
    m.events.v = exo_calloc(evs.n ? evs.n : 1, sizeof *m.events.v);
    for (size_t i = 0; i < evs.n; i++)
        m.events.v[i].event = evs.v[i]; /* borrowed for the encode */
    if (send_msg(n, to, EXO_MSG_SNAPSHOT, &m) == 0)
        EXO_LOG_INFO("node: sent %s a snapshot of the State at %llu (%zu events; its log is compacted)", to,
                     (unsigned long long)m.count, evs.n);
    exo_free(m.events.v);
    exo_event_list_clear(&evs);
}

static void serve_request(exo_node *n, const char *from, const exo_msg_event_request *r)
{
    if (!n->is_master || !exo_session_eq(&r->session, &n->session)) {
        /* a follower of another session: tell it ours */
        exo_msg_head h = {n->session, (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1)};
        if (n->is_master)
            send_msg(n, from, EXO_MSG_HEAD, &h);
        return;
    }
    uint64_t count = (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1);
    if (r->since >= count || n->catchups_running > 16)
        return;
    if (r->since < exo_event_log_first(n->log)) {
        send_snapshot(n, from);
        return;
    }
    catchup *c = exo_calloc(1, sizeof *c);
    c->n = n;
    snprintf(c->to.s, sizeof c->to.s, "%s", from);
    c->session = n->session;
    c->since = r->since;
    c->count = count;
    c->work.data = c;
    n->catchups_running++;
    if (uv_queue_work(&n->loop, &c->work, catchup_work, catchup_done) < 0) {
        n->catchups_running--;
        exo_free(c);
    }
}

/* ---- messages from peers ---------------------------------------------------------------- */

static void replica_apply(void *ctx, uint64_t idx, exo_event *ev)
{
    exo_node *n = ctx;
    apply_to(n, n->next_state ? n->next_state : n->state, idx, ev);
    exo_event_clear(ev);
}

static void on_global_event(exo_node *n, const char *from, exo_msg_global_event *g)
{
    if (n->is_master || !exo_session_eq(&g->session, &n->session) || strcmp(from, n->session.master.s))
        return; /* another session's, or not from our master */
    if (exo_id_eq(&g->system, exo_outbox_system(n->outbox)))
        exo_outbox_ack(n->outbox, &g->system, g->origin_idx);
    exo_replica_offer(n->replica, g->idx, &g->event, replica_apply, n);
    exo_replica_note_count(n->replica, g->count);
    maybe_caught_up(n);
}

/* The master's answer when the events we need were compacted away: the
 * State at m->count - 1, built aside like a new session's and swapped in
 * once we hold every event announced. */
static void on_snapshot(exo_node *n, const char *from, exo_msg_snapshot *m)
{
    if (n->is_master || !exo_session_eq(&m->session, &n->session) || strcmp(from, n->session.master.s))
        return;
    if (exo_replica_next(n->replica) >= m->count)
        return; /* the events got here first */
    exo_event *evs = exo_calloc(m->events.n ? m->events.n : 1, sizeof *evs);
    for (size_t i = 0; i < m->events.n; i++)
        evs[i] = m->events.v[i].event; /* borrowed */
    exo_state *st;
    exo_err err = {0};
    int rc = exo_state_from_events(evs, m->events.n, (int64_t)m->count - 1, &st, &err);
    exo_free(evs);
    if (rc < 0) {
        EXO_LOG_WARN("node: the master's snapshot does not fold: %s", err.msg);
        return;
    }
    /* our log continues at m->count behind a snapshot of its own (written
     * here, on the loop: the log must not take an append before it) */
    uint8_t *snap = NULL;
    size_t len;
    if (exo_snapshot_encode(st, true, &snap, &len, &err) < 0 ||
        exo_event_log_checkpoint(n->log, snap, len, true, exo_event_log_epoch(n->log), NULL, &err) < 0)
        EXO_LOG_ERROR("node: event log: installing the master's snapshot: %s", err.msg);
    exo_free(snap);
    n->ckpt_count_mark = m->count;
    n->ckpt_bytes_mark = exo_event_log_bytes(n->log);
    EXO_LOG_INFO("node: adopted the master's State at event %llu (the events before were compacted away)",
                 (unsigned long long)m->count);
    if (n->next_state)
        exo_state_free(n->next_state);
    n->next_state = st;
    exo_replica_skip_to(n->replica, m->count, replica_apply, n);
    maybe_caught_up(n);
}

static void on_head(exo_node *n, const char *from, const exo_msg_head *h)
{
    if (n->is_master || !exo_session_eq(&h->session, &n->session) || strcmp(from, n->session.master.s))
        return;
    exo_replica_note_count(n->replica, h->count);
    if (h->count == 0 && n->next_state) /* an empty session: nothing to wait for */
        swap_in_next_state(n);
    maybe_caught_up(n);
    uint64_t since;
    if (exo_replica_request_due(n->replica, now_ms(), &since)) {
        exo_msg_event_request r = {n->session, since};
        send_msg(n, from, EXO_MSG_EVENT_REQUEST, &r);
    }
}

static void on_command(exo_node *n, const char *from, exo_msg_command *m)
{
    exo_msg_command_ack ack = {m->command.command_id, 0, NULL};
    if (!n->is_master || exo_election_in_progress(n->election))
        return; /* not ours to handle: the sender resends to the master */
    if (!command_seen(n, &m->command.command_id)) {
        if (m->command.kind == EXO_COMMAND_TEXT_GENERATION)
            m->command.u.text_generation.origin = m->origin;
        exo_err err = {0};
        int rc = master_handle(n, &m->command, &err);
        if (rc < 0) {
            ack.code = rc;
            ack.error = exo_strdup(err.msg[0] ? err.msg : exo_strerror(rc));
        }
    }
    send_msg(n, from, EXO_MSG_COMMAND_ACK, &ack);
    exo_free(ack.error);
}

/* Whether `from` may stream command_id's chunks to us: the node that runs
 * its instance. The first chunks can overtake the TaskCreated the master
 * sends us (they take another link), so a task we do not know yet passes;
 * its command id is a random UUID only the cluster has seen. */
static bool serves_command(exo_node *n, const char *from, const exo_id *command_id)
{
    exo_id node;
    snprintf(node.s, sizeof node.s, "%.63s", from);
    pthread_mutex_lock(&n->mu);
    const exo_task *t = exo_state_task_for_command(n->state, command_id);
    const exo_instance *inst = t ? exo_state_instance(n->state, &t->instance_id) : NULL;
    bool yes = !t || (inst && exo_instance_shard_of_node(inst, &node));
    pthread_mutex_unlock(&n->mu);
    return yes;
}

static void on_chunk_msg(exo_node *n, const char *from, exo_msg_chunk *m)
{
    if (!serves_command(n, from, &m->command_id)) {
        EXO_LOG_DEBUG("node: %s sent a chunk for %s, which it does not run", from, m->command_id.s);
        return;
    }
    json_error_t jerr;
    json_t *j = json_loads(m->chunk_json, 0, &jerr);
    exo_chunk c;
    exo_err err = {0};
    if (!j || exo_chunk_from_json(j, &c, &err)) {
        EXO_LOG_WARN("node: a peer sent a bad chunk for %s: %s", m->command_id.s, j ? err.msg : jerr.text);
        json_decref(j);
        return;
    }
    json_decref(j);
    exo_gen_sink s;
    if (gen_sink(n, &m->command_id, &s))
        s.on_chunk(s.ctx, &c);
    exo_chunk_free(&c);
}

static void gen_done_here(exo_node *n, const exo_id *command_id)
{
    exo_gen_sink s;
    if (gen_remove(n, command_id, &s)) {
        s.on_end(s.ctx);
        finish_command_later(n, command_id);
    }
}

/* A user's download action for this node (from its API or another's). */
static void download_here(exo_node *n, const exo_msg_download *m)
{
    exo_err err = {0};
    if (!n->worker) {
        EXO_LOG_WARN("node: download of %s asked of a node without a worker", m->model_id);
        return;
    }
    if (exo_worker_download(n->worker, (exo_download_action)m->action, m->model_id, &err))
        EXO_LOG_WARN("node: download %s of %s: %s", m->action == EXO_DOWNLOAD_START ? "start"
                     : m->action == EXO_DOWNLOAD_CANCEL ? "cancel" : "delete", m->model_id, err.msg);
}

static void net_message(void *ctx, const char *from, uint8_t type, const uint8_t *payload, size_t len)
{
    exo_node *n = ctx;
    exo_err err = {0};
    if (type == EXO_MSG_ELECTION) {
        exo_election_msg m;
        if (exo_election_msg_decode(payload, len, &m, &err) == 0 && !strcmp(m.from.s, from))
            exo_election_receive(n->election, &m, now_ms(), NULL);
        else
            EXO_LOG_DEBUG("node: bad election message from %s: %s", from, err.msg);
        drive_election(n);
        return;
    }
    size_t size = exo_msg_size(type);
    if (!size) {
        EXO_LOG_DEBUG("node: %s sent an unknown message type %u", from, type);
        return;
    }
    union {
        exo_msg_local_event le;
        exo_msg_global_event ge;
        exo_msg_event_request er;
        exo_msg_head h;
        exo_msg_command c;
        exo_msg_command_ack a;
        exo_msg_chunk ch;
        exo_msg_gen_done d;
        exo_msg_peers p;
        exo_msg_download dl;
        exo_msg_snapshot sn;
    } m;
    if (exo_msg_decode(type, payload, len, &m, &err) < 0) {
        EXO_LOG_WARN("node: dropped a bad %s from %s: %s", exo_msg_type_name(type), from, err.msg);
        return;
    }
    switch (type) {
    case EXO_MSG_LOCAL_EVENT:
        if (n->is_master && exo_session_eq(&m.le.session, &n->session) && !strcmp(m.le.origin.s, from))
            exo_sequencer_offer(n->seq, &m.le.system, m.le.origin_idx, &m.le.event, sequencer_ready, n);
        break;
    case EXO_MSG_GLOBAL_EVENT: on_global_event(n, from, &m.ge); break;
    case EXO_MSG_EVENT_REQUEST: serve_request(n, from, &m.er); break;
    case EXO_MSG_HEAD: on_head(n, from, &m.h); break;
    case EXO_MSG_COMMAND:
        if (!strcmp(m.c.origin.s, from))
            on_command(n, from, &m.c);
        break;
    case EXO_MSG_COMMAND_ACK:
        if (!n->is_master && !strcmp(from, n->session.master.s))
            pending_ack(n, &m.a);
        break;
    case EXO_MSG_CHUNK: on_chunk_msg(n, from, &m.ch); break;
    case EXO_MSG_GEN_DONE:
        if (serves_command(n, from, &m.d.command_id))
            gen_done_here(n, &m.d.command_id);
        break;
    case EXO_MSG_DOWNLOAD: download_here(n, &m.dl); break;
    case EXO_MSG_SNAPSHOT: on_snapshot(n, from, &m.sn); break;
    case EXO_MSG_PEERS: {
        bool knew = peer_find(n, from) && peer_find(n, from)->has_addr;
        on_peers(n, from, &m.p);
        if (!knew && peer_find(n, from) && peer_find(n, from)->has_addr)
            send_peers(n, NULL); /* now we can tell the others where it listens */
        break;
    }
    default: break;
    }
    exo_msg_clear(type, &m);
    settle(n); /* let the worker act on what changed now, not at the next tick */
}

/* ---- links ---------------------------------------------------------------------------------- */

static void emit_edge_deleted(exo_node *n, const exo_topology_edge *e)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_TOPOLOGY_EDGE_DELETED);
    ev.u.topology_edge_deleted.source = e->source;
    ev.u.topology_edge_deleted.sink = e->sink;
    memcpy(ev.u.topology_edge_deleted.address, e->address, sizeof e->address);
    emit_local(n, &ev);
}

/* Requests this node holds that the given node was running, or was to
 * run, end with an error: their chunks cannot arrive any more (a chunk sent
 * while the link is down is lost, and its runner is cancelled then). */
static void fail_requests_served_by(exo_node *n, const exo_id *node)
{
    exo_id orphans[64];
    size_t k = 0;
    pthread_mutex_lock(&n->mu);
    for (gen *g = n->gens; g && k < 64; g = g->next) {
        const exo_task *t = exo_state_task_for_command(n->state, &g->command_id);
        const exo_instance *inst = t ? exo_state_instance(n->state, &t->instance_id) : NULL;
        if (t && (t->status == EXO_TASK_RUNNING || t->status == EXO_TASK_PENDING) && inst &&
            exo_instance_shard_of_node(inst, node))
            orphans[k++] = g->command_id;
    }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++) {
        char msg[256];
        snprintf(msg, sizeof msg, "the node running this request (%s) went away", node->s);
        cancel_command_later(n, &orphans[i]); /* before the end deletes its task */
        end_with_error(n, &orphans[i], 502, msg);
    }
}

/* "ip:port" text of an address, "[ip6]:port" for IPv6 (with the scope). */
static void addr_text(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = "", port[16] = "";
    getnameinfo((const struct sockaddr *)ss, ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                       : sizeof(struct sockaddr_in),
                host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    if (ss->ss_family == AF_INET6)
        snprintf(out, cap, "[%s]:%s", host, port);
    else
        snprintf(out, cap, "%s:%s", host, port);
}

/* Tells peer `to` (or every peer) our cluster port and where our other
 * peers listen. */
static void send_peers(exo_node *n, const char *to)
{
    exo_msg_peers m;
    memset(&m, 0, sizeof m);
    m.port = exo_net_port(n->net);
    exo_peer_addr list[EXO_MSG_MAX_PEERS];
    for (peer *p = n->peers; p && m.peers.n < EXO_MSG_MAX_PEERS; p = p->next) {
        if (!p->connected || !p->has_addr || (to && !strcmp(p->id.s, to)))
            continue;
        exo_peer_addr *a = &list[m.peers.n++];
        a->node_id = p->id;
        addr_text(&p->addr, a->address, sizeof a->address);
    }
    m.peers.v = list;
    if (m.port > 0)
        send_msg(n, to, EXO_MSG_PEERS, &m);
}

/* "host:port" or "[host]:port" -> sockaddr; port >= 0 replaces the
 * text's port. names: as for sockaddr_of. */
static int addr_parse(const char *s, bool names, int port, struct sockaddr_storage *ss)
{
    char host[256];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (!colon[1] && port < 0))
        return -1;
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[') {
        if (hl < 3 || s[hl - 1] != ']')
            return -1;
        s++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return -1;
    memcpy(host, s, hl);
    host[hl] = 0;
    return sockaddr_of(host, port >= 0 ? port : atoi(colon + 1), names, ss);
}

static void on_peers(exo_node *n, const char *from, const exo_msg_peers *m)
{
    /* where the sender listens: the IP its link comes from, its port */
    peer *src = peer_find(n, from);
    struct sockaddr_storage ss;
    if (src) {
        if (addr_parse(src->remote, false, m->port, &ss) == 0) {
            src->addr = ss;
            src->has_addr = true;
            src->last_heard_ms = now_ms();
        }
    }
    for (size_t i = 0; i < m->peers.n; i++) {
        const exo_peer_addr *a = &m->peers.v[i];
        if (exo_id_eq(&a->node_id, &n->node_id) || addr_parse(a->address, false, -1, &ss) < 0)
            continue;
        peer *p = peer_get(n, a->node_id.s);
        if (p->connected)
            continue;
        p->addr = ss;
        p->has_addr = true;
        p->last_heard_ms = now_ms();
        try_dial(n, p);
    }
}

static void peer_up(void *ctx, const char *id, const char *remote)
{
    exo_node *n = ctx;
    peer *p = peer_get(n, id);
    p->connected = true;
    p->down_since_ms = 0;
    snprintf(p->remote, sizeof p->remote, "%s", remote);
    p->next_probe_ms = now_ms() + 500;
    EXO_LOG_INFO("node: linked with %s (%s)", id, remote);
    send_peers(n, id);    /* it learns our peers */
    send_peers(n, NULL);  /* and the others learn it (once we know where it listens) */
    exo_election_membership_changed(n->election, now_ms());
    drive_election(n);
    if (n->is_master) { /* tell it where the session stands */
        exo_msg_head h = {n->session, (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1)};
        send_msg(n, id, EXO_MSG_HEAD, &h);
    } else if (!strcmp(id, n->session.master.s)) {
        send_pending(n, true);
        exo_outbox_send_due(n->outbox, now_ms(), 0, send_local, n);
    }
    update_view(n);
}

static void peer_down(void *ctx, const char *id, const char *reason)
{
    exo_node *n = ctx;
    peer *p = peer_get(n, id);
    p->connected = false;
    p->down_since_ms = p->first_heard_ms = now_ms();
    EXO_LOG_INFO("node: link to %s down (%s)", id, reason);
    exo_election_membership_changed(n->election, now_ms());
    drive_election(n);
    exo_id node;
    snprintf(node.s, sizeof node.s, "%s", id);
    fail_requests_served_by(n, &node);
    /* our edges to it are gone */
    exo_topology_edge mine[64];
    size_t k = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < exo_state_edge_count(n->state) && k < 64; i++) {
        const exo_topology_edge *e = exo_state_edge_at(n->state, i);
        if (exo_id_eq(&e->source, &n->node_id) && exo_id_eq(&e->sink, &node))
            mine[k++] = *e;
    }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++)
        emit_edge_deleted(n, &mine[i]);
    if (n->disc)
        exo_discovery_announce_now(n->disc);
    update_view(n);
    n->dirty = true;
    uv_async_send(&n->wake);
}

/* names: host may be a name to resolve (bootstrap peers); otherwise only
 * a numeric address is accepted (what peers and links report). */
static int sockaddr_of(const char *host, int port, bool names, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = (names ? 0 : AI_NUMERICHOST) | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    if (getaddrinfo(host, portstr, &hints, &res) != 0 || !res)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* Where to dial a node we are not linked with: where discovery last heard
 * it, else (bootstrap-only networks: a node learns the others from the
 * State its bootstrap peer serves) the addresses it reports, in turn. */
static bool dial_address(exo_node *n, peer *p, uint64_t now, struct sockaddr_storage *out)
{
    if (p->has_addr && now <= p->last_heard_ms + 3000) {
        *out = p->addr;
        return true;
    }
    char ip[EXO_ADDR_MAX] = "";
    int port = 0;
    pthread_mutex_lock(&n->mu);
    const exo_state_node *sn = exo_state_node_find(n->state, &p->id);
    if (sn && sn->info.interfaces.n && sn->info.cluster_port > 0) {
        const exo_net_iface *f = &sn->info.interfaces.v[p->dial_turn++ % sn->info.interfaces.n];
        snprintf(ip, sizeof ip, "%s", f->ip);
        port = sn->info.cluster_port;
    }
    pthread_mutex_unlock(&n->mu);
    return port > 0 && sockaddr_of(ip, port, false, out) == 0;
}

/* The greater id dials (as exo); the smaller one too when that has not
 * happened within DIAL_WAIT_MS (one direction may be blocked). Retried
 * every second. */
static void try_dial(exo_node *n, peer *p)
{
    uint64_t now = now_ms();
    if (p->connected || now < p->next_dial_ms)
        return;
    if (strcmp(n->node_id.s, p->id.s) < 0 && now < p->first_heard_ms + DIAL_WAIT_MS)
        return;
    struct sockaddr_storage ss;
    if (!dial_address(n, p, now, &ss))
        return;
    p->next_dial_ms = now + 1000;
    exo_err err = {0};
    if (exo_net_dial(n->net, (struct sockaddr *)&ss, p->id.s, false, &err) < 0)
        EXO_LOG_DEBUG("node: dial %s: %s", p->id.s, err.msg);
}

/* Nodes in the State this node has no link with are dialled too. */
static void dial_known_nodes(exo_node *n)
{
    exo_id ids[64];
    size_t k = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < exo_state_node_count(n->state) && k < 64; i++) {
        const exo_state_node *sn = exo_state_node_at(n->state, i);
        if (!exo_id_eq(&sn->node_id, &n->node_id))
            ids[k++] = sn->node_id;
    }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++)
        peer_get(n, ids[i].s);
    for (peer *p = n->peers; p; p = p->next)
        try_dial(n, p);
}

static void discovery_found(void *ctx, const char *id, const struct sockaddr *addr)
{
    exo_node *n = ctx;
    peer *p = peer_get(n, id);
    size_t len = addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    memcpy(&p->addr, addr, len);
    p->has_addr = true;
    p->last_heard_ms = now_ms();
    try_dial(n, p);
}

/* ---- topology probes -------------------------------------------------------------------------- */

typedef struct probe_ctx {
    exo_node *n;
    exo_id    sink;
    char      address[EXO_ADDR_MAX];
} probe_ctx;

/* Whether a new measurement differs enough from the State's to publish:
 * latency by half and 500 us, bandwidth by a quarter. */
static bool edge_moved(const exo_topology_edge *old, const exo_topology_edge *now)
{
    int64_t dl = now->latency_us - old->latency_us;
    if (dl < 0)
        dl = -dl;
    if (dl > 500 && dl * 2 > old->latency_us)
        return true;
    uint64_t a = old->bandwidth_bps, b = now->bandwidth_bps;
    uint64_t db = a > b ? a - b : b - a;
    return db * 4 > a;
}

static void probe_done(void *ctx, const exo_net_probe_result *res)
{
    probe_ctx *pc = ctx;
    exo_node *n = pc->n;
    if (!n->stopping) {
        exo_topology_edge e, old;
        memset(&e, 0, sizeof e);
        memset(&old, 0, sizeof old);
        e.source = n->node_id;
        e.sink = pc->sink;
        snprintf(e.address, sizeof e.address, "%s", pc->address);
        bool known = false;
        pthread_mutex_lock(&n->mu);
        for (size_t i = 0; i < exo_state_edge_count(n->state) && !known; i++)
            if (exo_topology_edge_same(exo_state_edge_at(n->state, i), &e)) {
                known = true;
                old = *exo_state_edge_at(n->state, i);
            }
        pthread_mutex_unlock(&n->mu);
        if (res->ok) {
            e.latency_us = (int64_t)res->rtt_us;
            e.bandwidth_bps = res->bulk_bytes ? res->bandwidth_bps : known ? old.bandwidth_bps : 0;
        }
        if (res->ok && known && !edge_moved(&old, &e)) {
            /* the same link as before: no event (the log would grow by one
             * per address and peer every probe) */
        } else if (res->ok) {
            exo_event ev;
            exo_event_init(&ev, EXO_EVENT_TOPOLOGY_EDGE_CREATED);
            ev.u.topology_edge_created.edge = e;
            emit_local(n, &ev);
        } else if (known) {
            EXO_LOG_DEBUG("node: probe of %s at %s failed: %s", pc->sink.s, pc->address, res->error);
            emit_edge_deleted(n, &e);
        }
    }
    exo_free(pc);
}

/* Whether the State holds a bandwidth measurement of our edge to sink at
 * address. */
static bool measured(exo_node *n, const exo_id *sink, const char *address)
{
    bool yes = false;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < exo_state_edge_count(n->state) && !yes; i++) {
        const exo_topology_edge *e = exo_state_edge_at(n->state, i);
        yes = exo_id_eq(&e->source, &n->node_id) && exo_id_eq(&e->sink, sink) && !strcmp(e->address, address) &&
              e->bandwidth_bps > 0;
    }
    pthread_mutex_unlock(&n->mu);
    return yes;
}

static void probe_peers(exo_node *n)
{
    uint64_t now = now_ms();
    for (peer *p = n->peers; p; p = p->next) {
        if (!p->connected || now < p->next_probe_ms)
            continue;
        p->next_probe_ms = now + PROBE_MS;
        /* bandwidth (a bulk transfer) now and then and for addresses without
         * a measurement, latency every time */
        bool bulk_round = now >= p->next_bulk_ms;
        /* every address the peer reports, at its cluster port */
        char ips[EXO_NODE_MAX_INTERFACES][EXO_ADDR_MAX];
        int port = 0;
        size_t k = 0;
        pthread_mutex_lock(&n->mu);
        const exo_state_node *sn = exo_state_node_find(n->state, &p->id);
        if (sn) {
            port = sn->info.cluster_port;
            for (size_t i = 0; i < sn->info.interfaces.n && k < EXO_NODE_MAX_INTERFACES; i++)
                snprintf(ips[k++], EXO_ADDR_MAX, "%s", sn->info.interfaces.v[i].ip);
        }
        pthread_mutex_unlock(&n->mu);
        if (bulk_round && k && port > 0)
            p->next_bulk_ms = now + PROBE_BULK_MS;
        for (size_t i = 0; i < k && port > 0; i++) {
            struct sockaddr_storage ss;
            if (sockaddr_of(ips[i], port, false, &ss) < 0)
                continue;
            probe_ctx *pc = exo_calloc(1, sizeof *pc);
            pc->n = n;
            pc->sink = p->id;
            if (strchr(ips[i], ':'))
                snprintf(pc->address, sizeof pc->address, "[%.60s]:%d", ips[i], port);
            else
                snprintf(pc->address, sizeof pc->address, "%.60s:%d", ips[i], port);
            uint64_t bulk = bulk_round || !measured(n, &p->id, pc->address) ? PROBE_BULK_BYTES : 0;
            exo_err err = {0};
            if (exo_net_probe(n->net, (struct sockaddr *)&ss, p->id.s, bulk, probe_done, pc, &err) < 0)
                exo_free(pc); /* too many at once: the next round tries again */
        }
    }
}

/* ---- node info (gathered off the loop) ---------------------------------------------------- */

typedef struct info_job {
    uv_work_t     work;
    exo_node     *n;
    exo_node_info info;
    int           rc;
    exo_err       err;
} info_job;

static void info_work(uv_work_t *w)
{
    info_job *j = w->data;
    exo_node *n = j->n;
    exo_node_info_opts o = {n->cfg.paths->models_dirs, n->cfg.worker ? n->cfg.paths->n_models_dirs : 0,
                            __atomic_load_n(&n->cfg.api_port, __ATOMIC_RELAXED), n->net ? exo_net_port(n->net) : 0};
    j->rc = exo_node_info_gather(&o, &j->info, &j->err);
    /* a node without a worker is in the cluster (its API serves requests)
     * but runs nothing: no backends, no models, so placement passes it by */
    if (!n->cfg.worker)
        j->info.backends = 0;
}

static void info_done(uv_work_t *w, int status)
{
    info_job *j = w->data;
    exo_node *n = j->n;
    n->gathering = false;
    uint64_t now = now_ms();
    if (j->rc) {
        EXO_LOG_WARN("node: cannot gather node info: %s", j->err.msg);
    } else if (!n->stopping && (!n->has_published || now >= n->published_ms + INFO_REFRESH_MS ||
                                exo_node_info_changed(&n->published, &j->info))) {
        exo_event ev;
        exo_event_init(&ev, EXO_EVENT_NODE_GATHERED_INFO);
        ev.u.node_gathered_info.node_id = n->node_id;
        ev.u.node_gathered_info.when_ms = (int64_t)time(NULL) * 1000;
        exo_node_info_clear(&ev.u.node_gathered_info.info);
        exo_node_info_copy(&ev.u.node_gathered_info.info, &j->info);
        exo_node_info_clear(&n->published);
        n->published = j->info; /* moved */
        memset(&j->info, 0, sizeof j->info);
        n->has_published = true;
        n->published_ms = now;
        emit_local(n, &ev);
        uv_async_send(&n->wake);
    }
    exo_node_info_clear(&j->info);
    exo_free(j);
}

static void start_info_gather(exo_node *n)
{
    if (n->gathering || n->stopping)
        return;
    info_job *j = exo_calloc(1, sizeof *j);
    j->n = n;
    j->work.data = j;
    n->gathering = true;
    __atomic_store_n(&n->next_info_ms, now_ms() + INFO_CHECK_MS, __ATOMIC_RELAXED);
    if (uv_queue_work(&n->loop, &j->work, info_work, info_done) < 0) {
        n->gathering = false;
        exo_free(j);
    }
}

/* ---- the master's housekeeping ------------------------------------------------------------------ */

/* Nodes unreachable for NODE_TIMEOUT_MS leave the State; instances on nodes
 * that left are deleted and their models placed again on the nodes left (the
 * same sharding; placement picks the nodes); requests whose API node left
 * are dropped. */
static void master_plan(exo_node *n)
{
    uint64_t now = now_ms();
    exo_id gone[64], dead_instances[64], dead_node[64];
    struct {
        char              model_id[EXO_MODEL_ID_MAX];
        exo_sharding      sharding;
        exo_instance_meta meta;
    } dead_what[64];
    size_t n_gone = 0, n_dead = 0;
    exo_id cancel_tasks[64], delete_tasks[64];
    size_t n_cancel = 0, n_delete = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < exo_state_node_count(n->state) && n_gone < 64; i++) {
        const exo_state_node *sn = exo_state_node_at(n->state, i);
        if (linked(n, &sn->node_id))
            continue;
        peer *p = peer_find(n, sn->node_id.s);
        uint64_t since = p && p->down_since_ms > n->session_start_ms ? p->down_since_ms : n->session_start_ms;
        if (now >= since + NODE_TIMEOUT_MS)
            gone[n_gone++] = sn->node_id;
    }
    for (size_t i = 0; i < exo_state_instance_count(n->state) && n_dead < 64; i++) {
        const exo_instance *inst = exo_state_instance_at(n->state, i);
        for (size_t s = 0; s < inst->n_shards; s++)
            if (!exo_state_node_find(n->state, &inst->shards[s].node_id)) {
                dead_node[n_dead] = inst->shards[s].node_id;
                snprintf(dead_what[n_dead].model_id, EXO_MODEL_ID_MAX, "%s", inst->model_id);
                dead_what[n_dead].sharding = inst->sharding;
                dead_what[n_dead].meta = inst->meta;
                dead_instances[n_dead++] = inst->instance_id;
                break;
            }
    }
    for (size_t i = 0; i < exo_state_task_count(n->state); i++) {
        const exo_task *t = exo_state_task_at(n->state, i);
        if (t->kind != EXO_TASK_KIND_TEXT_GENERATION || exo_id_is_empty(&t->node_id) ||
            exo_state_node_find(n->state, &t->node_id))
            continue;
        if ((t->status == EXO_TASK_PENDING || t->status == EXO_TASK_RUNNING) && n_cancel < 64)
            cancel_tasks[n_cancel++] = t->task_id;
        else if (n_delete < 64)
            delete_tasks[n_delete++] = t->task_id;
    }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < n_gone; i++) {
        EXO_LOG_INFO("node: %s has been unreachable for %d s: it leaves the cluster", gone[i].s,
                     NODE_TIMEOUT_MS / 1000);
        exo_event ev;
        exo_event_init(&ev, EXO_EVENT_NODE_TIMED_OUT);
        ev.u.node_timed_out.node_id = gone[i];
        index_event(n, &ev, NULL, 0);
        exo_event_clear(&ev);
    }
    for (size_t i = 0; i < n_dead; i++) {
        EXO_LOG_INFO("node: instance %s lost a node; deleting it", dead_instances[i].s);
        exo_command cmd;
        exo_command_init(&cmd, EXO_COMMAND_DELETE_INSTANCE);
        cmd.u.delete_instance.instance_id = dead_instances[i];
        char why[128];
        snprintf(why, sizeof why, "node %.64s left the cluster", dead_node[i].s);
        cmd.u.delete_instance.reason = exo_strdup(why);
        exo_err err = {0};
        master_handle(n, &cmd, &err);
        exo_command_clear(&cmd);
        /* the model again, on the nodes that are left */
        exo_command_init(&cmd, EXO_COMMAND_PLACE_INSTANCE);
        pthread_mutex_lock(&n->mu);
        const exo_model_card *card = NULL;
        for (size_t k = 0; k < exo_state_node_count(n->state) && !card; k++)
            card = exo_node_info_model(&exo_state_node_at(n->state, k)->info, dead_what[i].model_id);
        if (card)
            cmd.u.place_instance.card = *card;
        pthread_mutex_unlock(&n->mu);
        cmd.u.place_instance.sharding = dead_what[i].sharding;
        cmd.u.place_instance.meta = dead_what[i].meta;
        cmd.u.place_instance.min_nodes = 1;
        if (!card)
            EXO_LOG_WARN("node: no node left has %s on disk: not placed again", dead_what[i].model_id);
        else if (master_handle(n, &cmd, &err) < 0)
            EXO_LOG_WARN("node: %s cannot be placed again: %s", dead_what[i].model_id, err.msg);
        else
            EXO_LOG_INFO("node: %s placed again on the nodes left", dead_what[i].model_id);
        exo_command_clear(&cmd);
    }
    for (size_t i = 0; i < n_cancel + n_delete; i++) {
        exo_event ev;
        bool cancel = i < n_cancel;
        exo_event_init(&ev, cancel ? EXO_EVENT_TASK_STATUS_UPDATED : EXO_EVENT_TASK_DELETED);
        if (cancel) {
            ev.u.task_status_updated.task_id = cancel_tasks[i];
            ev.u.task_status_updated.status = EXO_TASK_CANCELLED;
        } else {
            ev.u.task_deleted.task_id = delete_tasks[i - n_cancel];
        }
        index_event(n, &ev, NULL, 0);
        exo_event_clear(&ev);
    }
}

/* ---- open requests that cannot end -------------------------------------------------------------- */

/* Whether a request's task is first in its instance's queue: no earlier
 * task of the instance is Pending or Running (the runner takes them FIFO,
 * so a request behind another one waits without chunks, rightly). */
static bool first_in_queue(const exo_state *st, const exo_task *task)
{
    for (size_t i = 0; i < exo_state_task_count(st); i++) {
        const exo_task *t = exo_state_task_at(st, i);
        if (t == task)
            return true;
        if (exo_id_eq(&t->instance_id, &task->instance_id) &&
            (t->status == EXO_TASK_PENDING || t->status == EXO_TASK_RUNNING))
            return false;
    }
    return true;
}

/* A shard's node that this node cannot reach, or NULL. A node never linked
 * yet is not counted (it may be joining; once it has been away
 * NODE_TIMEOUT_MS the master deletes the instance, which ends the request). */
static const exo_id *unreachable_node(exo_node *n, const exo_instance *inst)
{
    for (size_t s = 0; s < inst->n_shards; s++) {
        const exo_id *id = &inst->shards[s].node_id;
        if (linked(n, id))
            continue;
        peer *p = peer_find(n, id->s);
        if (p && p->down_since_ms)
            return id;
    }
    return NULL;
}

/* No open request waits for ever (runs on the tick, every STALL_CHECK_MS):
 *  - one whose instance has a node this node lost the link to ends at once
 *    (502): its chunks cannot come (peer_down ends those open then; this
 *    catches the ones routed there after);
 *  - one that should be moving gets no chunk for the stall timeout (504)
 *    and is cancelled. It should be moving unless it waits its turn: its
 *    task is Pending or Running behind another of its instance's tasks, or
 *    the instance's first runner is not Ready or Running (loading,
 *    downloading, respawning after a crash, which the worker bounds: after
 *    EXO_WORKER_MAX_FAILURES the instance is deleted). A request the master
 *    has not placed yet, a finished task whose end has not come, a task
 *    whose instance is gone: all should be moving. */
static void check_requests(exo_node *n, uint64_t now)
{
    uint64_t timeout = n->cfg.stall_timeout_ms > 0 ? (uint64_t)n->cfg.stall_timeout_ms : STALL_TIMEOUT_MS;
    struct { exo_id command_id; int status; char msg[320]; } end[64];
    size_t k = 0;
    pthread_mutex_lock(&n->mu);
    for (gen *g = n->gens; g && k < 64; g = g->next) {
        const exo_task *t = exo_state_task_for_command(n->state, &g->command_id);
        const exo_instance *inst = t ? exo_state_instance(n->state, &t->instance_id) : NULL;
        const exo_id *lost = inst && (t->status == EXO_TASK_PENDING || t->status == EXO_TASK_RUNNING)
                                 ? unreachable_node(n, inst) : NULL;
        if (lost) {
            end[k].command_id = g->command_id;
            end[k].status = 502;
            snprintf(end[k++].msg, sizeof end->msg, "the node that runs this request's instance (%.64s) is "
                     "unreachable", lost->s);
            continue;
        }
        bool waits_its_turn = false;
        if (inst && (t->status == EXO_TASK_PENDING || t->status == EXO_TASK_RUNNING)) {
            const exo_runner_status *rs = exo_state_runner_status(n->state, &inst->shards[0].runner_id);
            waits_its_turn = !first_in_queue(n->state, t) || !rs ||
                             (rs->kind != EXO_RUNNER_READY && rs->kind != EXO_RUNNER_RUNNING);
        }
        if (waits_its_turn || now < g->waiting_since_ms) {
            g->waiting_since_ms = now;
            continue;
        }
        if (now - g->waiting_since_ms < timeout)
            continue;
        end[k].command_id = g->command_id;
        end[k].status = 504;
        if (!t)
            snprintf(end[k++].msg, sizeof end->msg, "the master did not take this request within %llu s",
                     (unsigned long long)(timeout / 1000));
        else
            snprintf(end[k++].msg, sizeof end->msg, "no answer from the runner of instance %.64s%s%.64s for %llu s",
                     t->instance_id.s, inst ? " on node " : "", inst ? inst->shards[0].node_id.s : "",
                     (unsigned long long)(timeout / 1000));
    }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++) {
        EXO_LOG_WARN("node: request %s: %s", end[i].command_id.s, end[i].msg);
        cancel_command_later(n, &end[i].command_id); /* before the end deletes its task */
        end_with_error(n, &end[i].command_id, end[i].status, end[i].msg);
    }
}

/* ---- settle and the periodic tick ------------------------------------------------------------- */

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
                emit_local(n, &a->ev);
                break;
            case ACT_COMMAND:
                submit(n, &a->cmd);
                break;
            case ACT_DONE:
                gen_done_here(n, &a->id);
                break;
            case ACT_DOWNLOAD:
                if (exo_id_eq(&a->target, &n->node_id))
                    download_here(n, &a->download);
                else if (send_msg(n, a->target.s, EXO_MSG_DOWNLOAD, &a->download))
                    EXO_LOG_WARN("node: cannot reach %s for the download of %s", a->target.s,
                                 a->download.model_id);
                break;
            case ACT_CANCEL: {
                exo_command cmd;
                exo_command_init(&cmd, EXO_COMMAND_TASK_CANCELLED);
                cmd.u.task_cancelled.cancelled_command_id = a->id;
                submit(n, &cmd);
                break;
            }
            }
            action_free(a);
            continue;
        }
        if (!n->dirty || !n->worker || n->next_state)
            break;
        n->dirty = false;
        exo_worker_plan(n->worker, n->state);
    }
    if (n->unflushed && !uv_is_active((uv_handle_t *)&n->flush_timer) &&
        !uv_is_closing((uv_handle_t *)&n->flush_timer))
        uv_timer_start(&n->flush_timer, on_flush, FLUSH_DELAY_MS, 0);
    n->unflushed = false;
}

static void on_tick(uv_timer_t *t)
{
    exo_node *n = t->data;
    uint64_t now = now_ms();
    if (n->is_master) {
        if (now >= n->next_head_ms) {
            n->next_head_ms = now + HEAD_MS;
            exo_msg_head h = {n->session, (uint64_t)(exo_state_last_event_applied_idx(n->state) + 1)};
            send_msg(n, NULL, EXO_MSG_HEAD, &h);
            master_plan(n);
        }
    } else if (!exo_election_in_progress(n->election) && linked(n, &n->session.master)) {
        exo_outbox_send_due(n->outbox, now, RESEND_MS, send_local, n);
        send_pending(n, false);
        uint64_t since;
        if (exo_replica_request_due(n->replica, now, &since)) {
            exo_msg_event_request r = {n->session, since};
            send_msg(n, n->session.master.s, EXO_MSG_EVENT_REQUEST, &r);
        }
    }
    dial_known_nodes(n);
    if (now >= n->next_stall_check_ms) {
        n->next_stall_check_ms = now + STALL_CHECK_MS;
        check_requests(n, now);
    }
    if (now >= __atomic_load_n(&n->next_info_ms, __ATOMIC_RELAXED))
        start_info_gather(n);
    probe_peers(n);
    if (now / 1000 != (now - TICK_MS) / 1000)
        update_view(n); /* round trips move */
    settle(n);
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

/* Where a command's chunks go: NULL for this node, else the origin's id. */
static bool origin_of(exo_node *n, const exo_id *command_id, exo_id *origin)
{
    pthread_mutex_lock(&n->mu);
    const exo_task *t = exo_state_task_for_command(n->state, command_id);
    bool remote = t && !exo_id_is_empty(&t->node_id) && !exo_id_eq(&t->node_id, &n->node_id);
    if (remote)
        *origin = t->node_id;
    pthread_mutex_unlock(&n->mu);
    return remote;
}

static void host_chunk(void *ctx, const exo_id *command_id, const exo_chunk *c)
{
    exo_node *n = ctx;
    exo_gen_sink s;
    exo_id origin;
    if (gen_sink(n, command_id, &s)) { /* the request is on this node: most tokens */
        s.on_chunk(s.ctx, c);
        return;
    }
    if (!origin_of(n, command_id, &origin))
        return; /* its request has ended */
    json_t *j = exo_chunk_to_json(c);
    exo_msg_chunk m = {*command_id, exo_json_dumps(j, JSON_COMPACT)};
    json_decref(j);
    if (send_msg(n, origin.s, EXO_MSG_CHUNK, &m) < 0 && c->kind != EXO_CHUNK_ERROR && c->kind != EXO_CHUNK_FINISH)
        cancel_command_later(n, command_id); /* its API node is gone or drowning: stop the runner */
    exo_free(m.chunk_json);
}

static void host_done(void *ctx, const exo_id *command_id)
{
    exo_node *n = ctx;
    exo_id origin;
    if (origin_of(n, command_id, &origin)) {
        exo_msg_gen_done d = {*command_id};
        send_msg(n, origin.s, EXO_MSG_GEN_DONE, &d);
        return;
    }
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
    if (n->disc)
        exo_discovery_close(n->disc);
    if (n->net)
        exo_net_close(n->net);
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
    drive_election(n);
    start_info_gather(n);
    settle(n);
    uv_run(&n->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- start / stop ----------------------------------------------------------- */

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
        char sealed[4200];
        if ((rc = exo_event_log_rotate(n->log, sealed, sizeof sealed, err)) ||
            (sealed[0] && (rc = exo_event_log_archive(sealed, err)))) /* not on the loop yet */
            return rc;
    }
    return 0;
}

static int start_net(exo_node *n, exo_err *err)
{
    exo_net_config nc = {0};
    nc.identity = &n->identity;
    nc.psk = n->keys.psk;
    nc.listen_host = n->cfg.listen_host;
    int port = n->cfg.cluster_port;
    nc.listen_port = (uint16_t)(port < 0 ? EXO_DEFAULT_CLUSTER_PORT : port);
    exo_net_callbacks cb = {peer_up, peer_down, net_message, n};
    int rc = exo_net_new(&n->loop, &nc, &cb, &n->net, err);
    if (rc < 0 && port < 0) {
        /* the default port is taken (another exo on this machine): any port
         * will do, discovery tells the peers which */
        EXO_LOG_INFO("node: cluster port %d is taken (%s); using any free port", EXO_DEFAULT_CLUSTER_PORT, err->msg);
        nc.listen_port = 0;
        rc = exo_net_new(&n->loop, &nc, &cb, &n->net, err);
    }
    if (rc < 0)
        return rc;
    for (int i = 0; i < n->cfg.n_bootstrap; i++) {
        struct sockaddr_storage ss;
        if (addr_parse(n->cfg.bootstrap[i], true, -1, &ss) < 0)
            return exo_err_set(err, EXO_EINVAL, "bootstrap peer %s: expected host:port of a reachable name "
                               "or address", n->cfg.bootstrap[i]);
        if ((rc = exo_net_dial(n->net, (struct sockaddr *)&ss, NULL, true, err)) < 0)
            return exo_err_wrap(err, "bootstrap peer %s", n->cfg.bootstrap[i]);
    }
    if (!n->cfg.no_discovery) {
        exo_discovery_config dc;
        exo_discovery_config_init(&dc);
        dc.node_id = n->node_id.s;
        memcpy(dc.ns_hash, n->keys.ns_hash, sizeof dc.ns_hash);
        memcpy(dc.announce_key, n->keys.announce_key, sizeof dc.announce_key);
        dc.tcp_port = exo_net_port(n->net);
        dc.udp_port = (uint16_t)(n->cfg.discovery_port > 0 ? n->cfg.discovery_port : EXO_DEFAULT_DISCOVERY_PORT);
        dc.found = discovery_found;
        dc.ctx = n;
        if ((rc = exo_discovery_start(&n->loop, &dc, &n->disc, err)) < 0)
            return exo_err_wrap(err, "discovery (use --bootstrap-peers where multicast is blocked)");
    }
    return 0;
}

int exo_node_start(const exo_node_config *cfg, exo_node **out, exo_err *err)
{
    *out = NULL;
    exo_node *n = exo_calloc(1, sizeof *n);
    n->cfg = *cfg;
    for (int i = 0; i < cfg->n_bootstrap && i < EXO_MAX_BOOTSTRAP_PEERS; i++)
        n->cfg.bootstrap[i] = n->bootstrap_copy[i] = exo_strdup(cfg->bootstrap[i]);
    n->namespace_ = exo_strdup(cfg->namespace_ && *cfg->namespace_ ? cfg->namespace_ : EXO_DEFAULT_NAMESPACE);
    pthread_mutex_init(&n->mu, NULL);
    n->state = exo_state_new();
    n->replica = exo_replica_new();
    const char *every = getenv("EXO_EVENT_LOG_CHECKPOINT_EVERY"); /* tests: compaction without 10k events */
    n->ckpt_every = every && atoll(every) > 0 ? (uint64_t)atoll(every) : CHECKPOINT_EVENTS;
    n->outbox = exo_outbox_new();
    int rc = exo_identity_load_or_create(cfg->paths->data_dir, &n->identity, err);
    if (rc) {
        exo_node_free(n);
        return rc;
    }
    snprintf(n->node_id.s, sizeof n->node_id.s, "%s", n->identity.node_id);
    exo_net_keys_derive(n->namespace_, cfg->secret, &n->keys);
    if ((rc = open_log(n, err))) {
        exo_node_free(n);
        return rc;
    }
    uv_loop_init(&n->loop);
    n->loop_inited = true;
    uv_async_init(&n->loop, &n->wake, on_wake);
    n->wake.data = n;
    uv_timer_init(&n->loop, &n->flush_timer);
    n->flush_timer.data = n;
    uv_timer_init(&n->loop, &n->election_timer);
    n->election_timer.data = n;
    uv_timer_init(&n->loop, &n->tick_timer);
    n->tick_timer.data = n;
    if ((rc = start_net(n, err)) < 0) {
        exo_node_free(n);
        return rc;
    }
    exo_election_config ec;
    exo_election_config_init(&ec, &n->node_id);
    ec.force_master = cfg->force_master;
    if ((rc = exo_election_new(&ec, now_ms(), &n->election, err)) < 0) {
        exo_node_free(n);
        return rc;
    }
    if (cfg->hub)
        n->hub = *cfg->hub;
    else
        exo_hub_opts_from_env(&n->hub);
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
            .ring_timeout_ms = cfg->ring_timeout_ms,
            .backoff_ms = cfg->runner_backoff_ms,
        };
        memcpy(wc.cluster_key, n->keys.psk, sizeof wc.cluster_key);
        wc.hub = n->hub;
        exo_worker_host host = {n, host_emit, host_command, host_chunk, host_done, host_replan};
        n->worker = exo_worker_new(&n->loop, &wc, &host);
    }
    uv_timer_start(&n->tick_timer, on_tick, TICK_MS, TICK_MS);
    update_view(n);
    if (pthread_create(&n->thread, NULL, node_thread, n)) {
        exo_node_free(n);
        return exo_err_set(err, EXO_EIO, "cannot start the node thread");
    }
    n->thread_started = true;
    EXO_LOG_INFO("node %s started (namespace %s, cluster port %u%s)%s", n->node_id.s, n->namespace_,
                 exo_net_port(n->net), cfg->secret ? ", with a cluster secret" : "",
                 cfg->worker ? "" : " (no worker)");
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
        if (n->disc)
            exo_discovery_close(n->disc);
        if (n->net)
            exo_net_close(n->net);
        uv_walk(&n->loop, close_handle, NULL); /* only if the thread never ran */
        uv_run(&n->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&n->loop))
            EXO_LOG_WARN("node: the event loop still had handles at exit");
    }
    exo_discovery_free(n->disc);
    exo_net_free(n->net);
    exo_worker_free(n->worker);
    exo_election_free(n->election);
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
    while (n->pending) {
        pending_cmd *p = n->pending;
        n->pending = p->next;
        exo_command_clear(&p->cmd);
        exo_free(p);
    }
    while (n->peers) {
        peer *p = n->peers;
        n->peers = p->next;
        exo_free(p);
    }
    exo_sequencer_free(n->seq);
    exo_replica_free(n->replica);
    exo_outbox_free(n->outbox);
    exo_state_free(n->next_state);
    exo_state_free(n->state);
    exo_node_info_clear(&n->published);
    json_decref(n->view);
    exo_identity_wipe(&n->identity);
    exo_net_keys_wipe(&n->keys);
    for (int i = 0; i < EXO_MAX_BOOTSTRAP_PEERS; i++)
        exo_free(n->bootstrap_copy[i]);
    exo_free((char *)n->namespace_);
    pthread_mutex_destroy(&n->mu);
    exo_free(n);
}

const char *exo_node_id(const exo_node *n) { return n->node_id.s; }

void exo_node_set_api_port(exo_node *n, int port)
{
    __atomic_store_n(&n->cfg.api_port, port, __ATOMIC_RELAXED);
    __atomic_store_n(&n->next_info_ms, 0, __ATOMIC_RELAXED); /* report it at the next tick */
}

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
    a->cmd.u.text_generation.origin = n->node_id;
    snprintf(a->cmd.u.text_generation.model_id, EXO_MODEL_ID_MAX, "%s", req->model);
    json_t *params = exo_gen_request_to_json(req);
    a->cmd.u.text_generation.params_json = exo_json_dumps(params, JSON_COMPACT);
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
    g->waiting_since_ms = now_ms();
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

static int post_command(exo_node *n, exo_command *cmd, exo_id *command_id, exo_err *err)
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

int exo_node_model_card(exo_node *n, const char *model_id, exo_model_card *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    exo_model_store *models = exo_node_models(n);
    const exo_model_entry *m = exo_model_store_find(models, model_id);
    if (m)
        exo_model_card_from_entry(m, out);
    exo_model_store_free(models);
    if (m)
        return 0;
    pthread_mutex_lock(&n->mu);
    const exo_model_card *found = NULL;
    for (size_t i = 0; i < exo_state_node_count(n->state) && !found; i++)
        found = exo_node_info_model(&exo_state_node_at(n->state, i)->info, model_id);
    if (!found)
        found = exo_state_custom_card(n->state, model_id);
    if (found)
        *out = *found;
    pthread_mutex_unlock(&n->mu);
    if (found)
        return 0;
    const exo_catalogue_card *c = exo_catalogue_find(model_id);
    if (c) {
        exo_model_card_from_catalogue(c, out);
        return 0;
    }
    return exo_err_set(err, EXO_ENOENT,
                       "model %s is not on disk on any node, not in the catalogue and not a custom model "
                       "(add it with POST /models/add)", model_id);
}

int exo_node_download(exo_node *n, exo_download_action what, const char *target, const char *model_id,
                      exo_id *command_id, exo_err *err)
{
    char dname[300];
    if (!exo_model_dir_name(model_id, dname, sizeof dname))
        return exo_err_set(err, EXO_EINVAL, "'%s' is not a model id (org/name)", model_id);
    exo_id node = n->node_id;
    if (target && *target && exo_id_set(&node, target, err))
        return EXO_EINVAL;
    pthread_mutex_lock(&n->mu);
    bool known = exo_id_eq(&node, &n->node_id) || exo_state_node_find(n->state, &node);
    pthread_mutex_unlock(&n->mu);
    if (!known)
        return exo_err_set(err, EXO_ENOENT, "node %s is not in the cluster", node.s);
    if (exo_id_eq(&node, &n->node_id) && !n->cfg.worker)
        return exo_err_set(err, EXO_EINVAL, "this node runs no worker (--no-worker): it keeps no models");
    if (what == EXO_DOWNLOAD_DELETE && exo_id_eq(&node, &n->node_id)) {
        /* answered here: the files and their dirs are this process's to see */
        bool writable = false, read_only = false;
        for (int i = 0; i < n->cfg.paths->n_models_dirs; i++) {
            char p[4400];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", n->cfg.paths->models_dirs[i].path, dname);
            if (!stat(p, &sb) && S_ISDIR(sb.st_mode))
                *(n->cfg.paths->models_dirs[i].read_only ? &read_only : &writable) = true;
        }
        if (!writable && read_only)
            return exo_err_set(err, EXO_EPERM, "%s is in a read-only models directory: not deleted", model_id);
    }
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_DOWNLOAD;
    a->target = node;
    exo_id_new(&a->download.command_id);
    a->download.action = (int32_t)what;
    snprintf(a->download.model_id, sizeof a->download.model_id, "%s", model_id);
    if (command_id)
        *command_id = a->download.command_id;
    pthread_mutex_lock(&n->mu);
    int rc = post_locked(n, a);
    pthread_mutex_unlock(&n->mu);
    return rc ? exo_err_set(err, rc, "the node is shutting down") : 0;
}

int exo_node_custom_model(exo_node *n, const exo_model_card *card, const char *delete_id, exo_id *command_id,
                          exo_err *err)
{
    exo_command cmd;
    if (card) {
        int rc = exo_model_card_validate(card, err);
        if (rc)
            return rc;
        exo_command_init(&cmd, EXO_COMMAND_ADD_CUSTOM_MODEL_CARD);
        cmd.u.add_custom_model_card.card = *card;
    } else {
        pthread_mutex_lock(&n->mu);
        bool known = exo_state_custom_card(n->state, delete_id) != NULL;
        pthread_mutex_unlock(&n->mu);
        if (!known)
            return exo_err_set(err, EXO_ENOENT, "%s is not a custom model", delete_id);
        exo_command_init(&cmd, EXO_COMMAND_DELETE_CUSTOM_MODEL_CARD);
        snprintf(cmd.u.delete_custom_model_card.model_id, EXO_MODEL_ID_MAX, "%s", delete_id);
    }
    return post_command(n, &cmd, command_id, err);
}

/* A model just put on this node's disk is not in the State until the next
 * node-info report. When asked to place one, report now (the event goes to
 * the master ahead of the command) and judge placement on a copy of the
 * State that already holds the report. NULL: the State is up to date. */
static exo_state *state_knowing_local_model(exo_node *n, const char *model_id)
{
    pthread_mutex_lock(&n->mu);
    const exo_state_node *self = exo_state_node_find(n->state, &n->node_id);
    bool known = self && exo_node_info_model(&self->info, model_id);
    pthread_mutex_unlock(&n->mu);
    if (known || !n->cfg.worker)
        return NULL;
    exo_model_store *models = exo_node_models(n);
    bool here = exo_model_store_find(models, model_id) != NULL;
    exo_model_store_free(models);
    if (!here)
        return NULL;
    exo_node_info_opts o = {n->cfg.paths->models_dirs, n->cfg.paths->n_models_dirs,
                            __atomic_load_n(&n->cfg.api_port, __ATOMIC_RELAXED), n->net ? exo_net_port(n->net) : 0};
    action *a = exo_calloc(1, sizeof *a);
    a->kind = ACT_EVENT;
    exo_event_init(&a->ev, EXO_EVENT_NODE_GATHERED_INFO);
    a->ev.u.node_gathered_info.node_id = n->node_id;
    a->ev.u.node_gathered_info.when_ms = (int64_t)time(NULL) * 1000;
    exo_node_info_clear(&a->ev.u.node_gathered_info.info);
    if (exo_node_info_gather(&o, &a->ev.u.node_gathered_info.info, NULL)) {
        action_free(a);
        return NULL;
    }
    pthread_mutex_lock(&n->mu);
    exo_state *copy = exo_state_clone(n->state);
    exo_state_apply(copy, exo_state_last_event_applied_idx(copy) + 1, &a->ev, NULL);
    post_locked(n, a);
    pthread_mutex_unlock(&n->mu);
    return copy;
}

int exo_node_preview_placement(exo_node *n, const char *model_id, exo_sharding sharding,
                               exo_instance_meta meta, int min_nodes, exo_instance *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    exo_model_card card;
    int rc = exo_node_model_card(n, model_id, &card, err);
    if (rc)
        return rc;
    exo_placement_request req = {&card, sharding, meta, min_nodes, 0};
    exo_state *fresh = state_knowing_local_model(n, model_id);
    pthread_mutex_lock(&n->mu);
    rc = exo_placement_place(fresh ? fresh : n->state, &req, out, err);
    pthread_mutex_unlock(&n->mu);
    exo_state_free(fresh);
    return rc;
}

json_t *exo_node_previews(exo_node *n, const char *model_id, exo_err *err)
{
    exo_model_card card;
    if (exo_node_model_card(n, model_id, &card, err))
        return NULL;
    json_t *list = json_array();
    exo_state *fresh = state_knowing_local_model(n, model_id);
    pthread_mutex_lock(&n->mu);
    exo_placement_previews(fresh ? fresh : n->state, &card, list);
    pthread_mutex_unlock(&n->mu);
    exo_state_free(fresh);
    return list;
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
    if ((rc = exo_node_model_card(n, model_id, &cmd.u.place_instance.card, err))) {
        exo_command_clear(&cmd);
        return rc;
    }
    cmd.u.place_instance.sharding = sharding;
    cmd.u.place_instance.meta = meta;
    cmd.u.place_instance.min_nodes = min_nodes;
    return post_command(n, &cmd, command_id, err);
}

int exo_node_create_instance(exo_node *n, const exo_instance *inst, exo_id *command_id, exo_err *err)
{
    int rc = exo_instance_validate(inst, err);
    if (rc)
        return rc;
    exo_command cmd;
    exo_command_init(&cmd, EXO_COMMAND_CREATE_INSTANCE);
    exo_instance_copy(&cmd.u.create_instance.instance, inst);
    return post_command(n, &cmd, command_id, err);
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
    cmd.u.delete_instance.reason = exo_strdup("deleted by user");
    return post_command(n, &cmd, command_id, err);
}

void exo_node_read_state(exo_node *n, void (*fn)(void *ctx, const exo_state *st), void *ctx)
{
    pthread_mutex_lock(&n->mu);
    fn(ctx, n->state);
    pthread_mutex_unlock(&n->mu);
}

int exo_node_events_page(exo_node *n, int64_t since, int64_t limit, exo_events_page *page, exo_err *err)
{
    memset(page, 0, sizeof *page);
    size_t max = limit <= 0 || limit > EXO_EVENTS_PAGE_MAX ? EXO_EVENTS_PAGE_MAX : (size_t)limit;
    exo_event *events = NULL;
    size_t got = 0;
    int rc;
    /* a compaction or a rotation can move the log between the look at its
     * bounds and the read: look again (a rotation restarts at 0) */
    for (int attempt = 0;; attempt++) {
        page->first = exo_event_log_first(n->log);
        page->count = exo_event_log_count(n->log);
        if (since >= 0 && (uint64_t)since < page->first)
            return exo_err_set(err, EXO_ENOENT,
                               "events before %llu were compacted into a snapshot: ask from since=%llu (GET /state "
                               "has the State)",
                               (unsigned long long)page->first, (unsigned long long)page->first);
        page->since = since < 0 ? page->first : (uint64_t)since > page->count ? page->count : (uint64_t)since;
        rc = exo_event_log_read_range(n->log, page->since, max, &events, &got, err);
        if (rc == 0 || attempt == 2 || (rc != EXO_ENOENT && rc != EXO_ERANGE))
            break;
    }
    if (rc < 0)
        return rc;
    page->events = json_array();
    for (size_t i = 0; i < got; i++) {
        exo_event red; /* logs written before redaction existed may still hold prompts */
        bool r = exo_event_redact(&events[i], &red);
        json_array_append_new(page->events, exo_event_to_json(r ? &red : &events[i]));
        if (r)
            exo_event_clear(&red);
    }
    exo_event_log_free_events(events, got);
    page->next = page->since + got;
    return 0;
}

json_t *exo_node_cluster_json(exo_node *n)
{
    pthread_mutex_lock(&n->mu);
    json_t *v = json_deep_copy(n->view);
    pthread_mutex_unlock(&n->mu);
    return v ? v : json_object();
}

const exo_hub_opts *exo_node_hub(exo_node *n) { return &n->hub; }

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
