/* Runner process main loop (see runner.h): load with per-layer progress,
 * warm-up, and a FIFO of generation requests whose token callback
 * detokenizes, parses (think / tool calls / stop sequences) and streams
 * chunks up the socket while polling it for cancels. Prompts are prefilled
 * in chunks of PREFILL_CHUNK tokens; between chunks a PREFILL progress
 * chunk goes up and the socket is polled the same way, so a Cancel also
 * stops a long prefill.
 *
 * A runner of a split model (world > 1) first joins its ring: it listens,
 * reports Connecting{ring_port}, and connects when its node sends where the
 * next rank listens; then it loads only its shard. Rank 0 takes the
 * requests and generates through the ring (dist.h); the other ranks serve
 * the ring's frames. A ring that fails (a rank gone, a link down past the
 * timeout) fails the runner: the open request gets an error, the node
 * replaces the runners. */
#include "runner/runner.h"

#include "runner/output_parser.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/meminfo.h"
#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "runner/dist.h"
#include "runner/protocol.h"
#include "runner/ring.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define DEFAULT_CTX        4096
#define DEFAULT_MAX_TOKENS 32168 /* exo's MAX_TOKENS when the client sets none */
#define WARMUP_PROMPT      "Prompt to warm up the inference engine. Repeat this."
#define PREFILL_CHUNK      512   /* prompt tokens per forward call between progress chunks */
/* a pipeline's chunk: smaller, so the ranks work on different chunks at once */
#define PIPELINE_CHUNK     128
#define IDLE_POLL_MS       250
/* Continuous batching (a whole model in one process, or rank 0 of a
 * tensor-parallel group, whose other ranks run the same steps: dist.h):
 * up to BATCH_MAX requests generate at once, $EXO_BATCH of them (default BATCH_DEFAULT;
 * 1 or 0: one at a time, the sequential path). A step runs the decode rows
 * of every request together, at most BATCH_ROWS a model call, so a row's
 * products take the kernels they take alone and each request gets the
 * tokens it would get alone; a prompt goes in chunks of BATCH_PREFILL
 * tokens, one chunk (or a slice of it: SLICE_MS_DEFAULT) a step in a call
 * of its own, so streams already decoding wait that, not a whole prompt. */
#define BATCH_MAX          64
#define BATCH_DEFAULT      8
#define BATCH_ROWS         16
#define BATCH_PREFILL      128
/* While requests decode, a prompt's chunk on an exact-rows model goes in
 * slices of about what the last prompt calls ran in this many ms
 * ($EXO_PREFILL_SLICE_MS; 0: whole chunks), SLICE_MIN rows or more:
 * the decoding streams wait a slice a step, not a chunk, where a chunk
 * takes longer (a 2-core CPU: 128 rows of llama-3.2-1b q4 ~0.75 s), and
 * the bits stay those of whole chunks (generate.h exo_gen_seq_slice). */
#define SLICE_MS_DEFAULT   500
#define SLICE_MIN          32
/* A pipeline's decoding requests go round as two groups taking turns from
 * this many ($EXO_PIPE_SPLIT; 0: never), as one below it (pipe_round) */
#define PIPE_SPLIT_DEFAULT 2
_Static_assert(BATCH_MAX <= EXO_DIST_MAX_BATCH && BATCH_ROWS <= EXO_DIST_BATCH_ROWS,
               "a tensor group's ranks keep the batch slots and rows rank 0 uses");
/* Prefix reuse: a slot's sequence keeps its last prompt's keys and values
 * after the request; a new prompt that starts with the same tokens takes
 * the slot and computes only the rest. A prompt is cut in chunks at the
 * multiples of BATCH_PREFILL from position 0 (generate.h), and the reused
 * positions must be the bits a prefill of the new prompt from 0 would
 * compute, so that a request gets what it gets without reuse: on a model
 * whose chunks of exact_rows or more rows give the same bits however they
 * are cut (model.h exo_model_exact_rows: on the CPU, all but recurrent
 * and latent-attention families; a pipeline's ranks each, batch_memory),
 * a prefix is taken up to any position where what is left of its chunk,
 * and every chunk it held, has that many rows (reuse_point); elsewhere in
 * whole chunks only. */

typedef struct job {
    char            id[EXO_RUNNER_ID_MAX + 1];
    exo_gen_request req;
    struct job     *next;
} job;

typedef struct runner {
    exo_runner_chan       *ch;
    exo_runner_status_kind state;
    bool                   peer_gone, shutdown;
    /* LoadModel received while Idle, not yet run */
    bool                   load_pending;
    exo_runner_load        load;
    /* the loaded model */
    exo_model             *model;
    exo_seq               *seq;
    exo_gen_stepper       *stepper;   /* local, or the ring's (rank 0) */
    /* a split model */
    int                    ring_listen_fd;
    bool                   connect_pending, connect_refused;
    exo_runner_connect     connect;
    exo_ring              *ring;
    exo_dist              *dist;
    exo_tokenizer         *tok;
    exo_chat_template     *tpl;
    char                  *tpl_source; /* template text, for output-format detection */
    int                    ctx;
    char                  *fail_msg;
    /* requests */
    job                   *head, *tail;
    /* requests being generated (one, or a pipeline's requests in flight) */
    struct gen_ctx        *active[BATCH_MAX];
    int                    n_active;
    /* continuous batching: how many at once, and their sequences (made as
     * the slots are first taken) */
    int                    n_batch;
    int                    pipe_split;        /* decode rows from which a pipeline keeps two groups out (0: never) */
    uint64_t               kv_budget;         /* bytes of caches at most (0: half the free memory) */
    double                 kv_limit;          /* the slots' caches together at most (batch_memory) */
    struct gen_ctx        *waiting;           /* taken from the queue, waiting for cache memory */
    struct gen_ctx        *preempted;         /* gave their caches back, to compute them again (oldest first) */
    exo_seq               *bseqs[BATCH_MAX];  /* [0] is seqs[0], the sequential path's */
    int32_t               *kept[BATCH_MAX];   /* the slot's last prompt, for prefix reuse */
    int                    n_kept[BATCH_MAX]; /* its positions the sequence holds from whole chunks */
    uint64_t               used[BATCH_MAX];   /* when the slot last took a request (LRU) */
    uint64_t               clock;
    /* the prefix cache: prompts kept when their prefill ended, beyond the
     * one each slot keeps (kept_prefix, below) */
    struct kept_prefix    *store;
    uint32_t               prefix_ids; /* the next entry's id */
    int                    exact_rows; /* exo_model_exact_rows (a pipeline: every rank's), 0 in a tensor group */
    int                    slice_ms;   /* $EXO_PREFILL_SLICE_MS (SLICE_MS_DEFAULT) */
    double                 prompt_rate; /* rows a second of the last prompt call of SLICE_MIN rows or more */
    int                    n_store;
    exo_seq               *seqs[EXO_DIST_MAX_SLOTS]; /* seqs[0] == seq; more for a pipeline */
    int                    n_slots;
} runner;

/* ---- where prefixes are taken --------------------------------------------- */

/* The first positions of an n-token prompt whose bits do not depend on
 * how its chunks were cut: its whole chunks, and on an exact-rows model
 * its last chunk too when that has exact_rows or more. */
static int prompt_exact(const runner *r, int n)
{
    int tail = n % BATCH_PREFILL;
    return r->exact_rows && tail >= r->exact_rows ? n : n - tail;
}

/* How much of a prefix sharing its first `common` positions (those
 * prompt_exact of the prefix's own prompt, short of the new prompt's last
 * token) an n-token prompt takes: the positions a prefill of it from 0
 * computes with the same bits once the rest is computed after them. The
 * rest's first call runs to the chunk's end, and must have exact_rows or
 * more rows; a short last chunk is computed whole. */
static int reuse_point(const runner *r, int n, int common)
{
    const int C = BATCH_PREFILL, E = r->exact_rows;
    if (!E)
        return common / C * C;
    if (common > prompt_exact(r, n))
        common = prompt_exact(r, n);
    int start = common / C * C, end = start + C < n ? start + C : n;
    if (common > start && end - common < E)
        common = end - E > start ? end - E : start;
    return common;
}

/* ---- the prefix cache ------------------------------------------------------- */

/* A request's prompt, kept when its prefill ends: its first n tokens'
 * pages held apart from any sequence (model.h exo_kv_prefix), so a later
 * prompt starting with them
 * takes the pages instead of computing them, whichever slot it lands in,
 * after the slot that computed them has gone on to other requests. A
 * model's sliding rings and recurrent states are kept as copies beside the
 * pages (a recurrent state at the entry's length only, so a prompt takes
 * such an entry whole or not at all). Entries are given up least recently
 * used first when memory is short. In a tensor-parallel group every rank
 * keeps, takes and gives up the same entries, named by id (dist.h). */
#define STORE_MAX 64
typedef struct kept_prefix {
    int32_t       *ids;
    int            n;
    exo_kv_prefix *pages;
    uint64_t       used;
    int            id; /* the entry's name on the other ranks of a tensor-parallel group */
} kept_prefix;

/* The entry holding p (one the caller knows is there). */
static kept_prefix *store_entry(runner *r, const exo_kv_prefix *p)
{
    int i = 0;
    while (r->store[i].pages != p)
        i++;
    return &r->store[i];
}

static void store_drop(runner *r, int i)
{
    exo_err err = {0};
    if (r->dist && exo_dist_prefix_drop(r->dist, r->store[i].id, &err))
        EXO_LOG_WARN("runner: the other ranks keep prefix entry %d: %s", r->store[i].id, err.msg);
    exo_kv_prefix_free(r->store[i].pages);
    exo_free(r->store[i].ids);
    r->store[i] = r->store[--r->n_store];
}

/* Bytes of caches the slots' sequences hold or reserve now (the model's
 * sequences are the slots'): a prefix's pages that several of them share
 * count once (model.h exo_model_kv_bytes). */
static double slots_held(const runner *r) { return (double)exo_model_kv_bytes(r->model); }

/* Gives up the least recently used entry but `spare`; false when there is
 * none. */
static bool store_evict(runner *r, const exo_kv_prefix *spare)
{
    int lru = -1;
    for (int i = 0; i < r->n_store; i++)
        if (r->store[i].pages != spare && (lru < 0 || r->store[i].used < r->store[lru].used))
            lru = i;
    if (lru < 0)
        return false;
    store_drop(r, lru);
    return true;
}

/* Keeps the first n of ids, which slot i's sequence holds (on every rank
 * of a tensor-parallel group). */
static void store_put(runner *r, int slot, const int32_t *ids, int n)
{
    exo_seq *s = r->bseqs[slot];
    if (n <= 0)
        return;
    for (int i = 0; i < r->n_store; i++) {
        kept_prefix *e = &r->store[i];
        int m = e->n < n ? e->n : n;
        if (memcmp(e->ids, ids, sizeof(int32_t) * (size_t)m))
            continue;
        if (e->n >= n) { /* held already */
            e->used = ++r->clock;
            return;
        }
        store_drop(r, i); /* the new one extends it */
        break;
    }
    exo_kv_prefix *pages;
    exo_err err = {0};
    if (exo_seq_keep_prefix(s, n, &pages, &err))
        return; /* the sequence cannot go back to n (slot_keepable checked), or no memory */
    if (!r->store)
        r->store = exo_calloc(STORE_MAX, sizeof *r->store);
    if (r->n_store == STORE_MAX)
        store_evict(r, NULL);
    const int id = (int)(r->prefix_ids++ & 0x7fffffff);
    if (r->dist && exo_dist_prefix_keep(r->dist, slot, id, n, &err)) {
        EXO_LOG_WARN("runner: the other ranks cannot keep a prefix: %s", err.msg);
        exo_kv_prefix_free(pages);
        return;
    }
    kept_prefix *e = &r->store[r->n_store++];
    e->ids = exo_malloc(sizeof(int32_t) * (size_t)n);
    memcpy(e->ids, ids, sizeof(int32_t) * (size_t)n);
    e->n = n;
    e->pages = pages;
    e->used = ++r->clock;
    e->id = id;
    /* the copies of rings and states it holds are memory of their own:
     * older entries go first, then this one, to stay within the budget */
    while (slots_held(r) > r->kv_limit && store_evict(r, pages))
        ;
    if (slots_held(r) > r->kv_limit)
        store_drop(r, (int)(store_entry(r, pages) - r->store));
}

/* The entry an n-token prompt takes most of (reuse_point), when more
 * than `than`: its index and the count in *common; else -1. */
static int store_find(const runner *r, const int32_t *ids, int n, int than, int *common)
{
    int best = -1;
    *common = than;
    for (int i = 0; i < r->n_store; i++) {
        const kept_prefix *e = &r->store[i];
        int c = 0;
        while (c < e->n && c < n - 1 && e->ids[c] == ids[c])
            c++;
        c = reuse_point(r, n, c);
        if (c > *common && exo_kv_prefix_can_take(e->pages, c)) {
            best = i;
            *common = c;
        }
    }
    return best;
}

/* ---- sending ------------------------------------------------------------ */

static void send_msg(runner *r, const exo_runner_msg *m)
{
    if (r->peer_gone)
        return;
    exo_err err = {0};
    int rc = exo_runner_chan_send(r->ch, m, true, &err);
    if (rc == EXO_EIO) {
        r->peer_gone = true;
    } else if (rc) {
        EXO_LOG_ERROR("runner: cannot send %s: %s", exo_runner_msg_name(m->kind), err.msg);
    }
}

static void send_status(runner *r, exo_runner_status_kind kind, int loaded, int total,
                        const char *message)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_STATUS);
    m.status.kind = kind;
    m.status.layers_loaded = loaded;
    m.status.total_layers = total;
    if (message) {
        /* Keep within the protocol's limit on messages, on a UTF-8 boundary. */
        size_t n = strlen(message);
        if (n > 4096) {
            n = 4096;
            while (n && ((unsigned char)message[n] & 0xC0) == 0x80)
                n--;
        }
        m.status.error_message = exo_strndup(message, n);
    }
    r->state = kind;
    send_msg(r, &m);
    exo_runner_msg_free(&m);
}

static void send_chunk(runner *r, const char *id, const exo_chunk *c)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_CHUNK);
    snprintf(m.command_id, sizeof m.command_id, "%s", id);
    m.chunk = *c; /* borrowed: not freed here */
    send_msg(r, &m);
    memset(&m.chunk, 0, sizeof m.chunk);
    exo_runner_msg_free(&m);
}

static void send_done(runner *r, const char *id)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_DONE);
    snprintf(m.command_id, sizeof m.command_id, "%s", id);
    send_msg(r, &m);
    exo_runner_msg_free(&m);
}

/* ERROR chunk + Done: the end of a request that could not run. */
/* http_status: 400 when the request itself cannot be served (clients do
 * not retry a 4xx; the official SDKs retry a 5xx twice), else 500 */
static void fail_request_status(runner *r, const char *id, int http_status, const char *message)
{
    exo_chunk c;
    exo_chunk_error_status(&c, http_status, message);
    send_chunk(r, id, &c);
    exo_chunk_free(&c);
    send_done(r, id);
}

static void fail_request(runner *r, const char *id, const char *message)
{
    fail_request_status(r, id, 500, message);
}

static void finish_cancelled(runner *r, const char *id, const exo_usage *usage)
{
    exo_chunk c;
    exo_usage zero = {0};
    exo_chunk_finish(&c, EXO_FR_CANCELLED, usage ? usage : &zero, 0, 0);
    send_chunk(r, id, &c);
    exo_chunk_free(&c);
    send_done(r, id);
}

/* ---- receiving ---------------------------------------------------------- */

static void job_free(job *j)
{
    exo_gen_request_free(&j->req);
    exo_free(j);
}

/* Cancels the active request `id` (NULL: all of them); false when none is. */
static bool cancel_active(runner *r, const char *id);

static void handle(runner *r, exo_runner_msg *m)
{
    switch (m->kind) {
    case EXO_RMSG_LOAD_MODEL:
        if (r->state != EXO_RUNNER_IDLE || r->load_pending) {
            EXO_LOG_WARN("runner: LoadModel ignored in state %s", exo_runner_status_name(r->state));
            break;
        }
        r->load = m->load;
        m->load.model_dir = NULL; /* taken */
        r->load_pending = true;
        break;
    case EXO_RMSG_CONNECT:
        r->connect = m->connect;
        r->connect_pending = true;
        break;
    case EXO_RMSG_GENERATE: {
        job *j = exo_calloc(1, sizeof *j);
        memcpy(j->id, m->command_id, sizeof j->id);
        j->req = m->request;
        exo_gen_request_init(&m->request); /* taken */
        if (r->tail)
            r->tail->next = j;
        else
            r->head = j;
        r->tail = j;
        break;
    }
    case EXO_RMSG_CANCEL:
        if (cancel_active(r, m->command_id))
            break;
        for (job **pp = &r->head; *pp; pp = &(*pp)->next) {
            job *j = *pp;
            if (strcmp(j->id, m->command_id))
                continue;
            *pp = j->next;
            if (r->tail == j) {
                r->tail = NULL;
                for (job *t = r->head; t; t = t->next)
                    r->tail = t;
            }
            finish_cancelled(r, j->id, NULL);
            job_free(j);
            break;
        }
        break;
    case EXO_RMSG_SHUTDOWN:
        r->shutdown = true;
        cancel_active(r, NULL);
        break;
    default:
        EXO_LOG_WARN("runner: unexpected %s frame ignored", exo_runner_msg_name(m->kind));
    }
}

/* A Generate frame that did not decode still names its command: answer it
 * with an ERROR chunk, so the node does not wait forever. */
static void reject_frame(runner *r, const exo_runner_msg *m, const exo_err *err)
{
    EXO_LOG_ERROR("runner: bad frame from the node: %s", err->msg);
    if (m->kind == EXO_RMSG_GENERATE && m->command_id[0]) {
        char msg[EXO_ERR_LEN + 64];
        snprintf(msg, sizeof msg, "invalid request: %s", err->msg);
        fail_request(r, m->command_id, msg);
    }
    if (m->kind == EXO_RMSG_CONNECT)
        r->connect_refused = true;
}

/* Reads what the socket holds (waiting for it when `block`) and handles
 * every whole frame. */
static void drain(runner *r, bool block)
{
    int n = exo_runner_chan_read(r->ch, block);
    if (n == 0 || n == EXO_EIO)
        r->peer_gone = true;
    for (;;) {
        exo_runner_msg m;
        exo_err err = {0};
        int rc = exo_runner_chan_next(r->ch, &m, &err);
        if (rc == 0)
            break;
        if (rc < 0) {
            reject_frame(r, &m, &err);
            if (exo_runner_chan_broken(r->ch)) {
                r->peer_gone = true; /* the stream is unusable */
                break;
            }
            continue;
        }
        if (!exo_runner_msg_is_down(m.kind))
            EXO_LOG_WARN("runner: %s frame from the node ignored", exo_runner_msg_name(m.kind));
        else
            handle(r, &m);
        exo_runner_msg_free(&m);
    }
}

/* ---- loading -------------------------------------------------------------- */

static bool has_file(const char *dir, const char *name)
{
    char p[EXO_RUNNER_PATH_MAX + 64];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static char *read_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    exo_sbuf b;
    exo_sbuf_init(&b);
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0 && b.len <= max)
        exo_sbuf_append(&b, tmp, n);
    fclose(f);
    if (b.len > max) {
        exo_sbuf_free(&b);
        return NULL;
    }
    return exo_sbuf_take(&b);
}

/* The template's source text (what exo_chat_template_load renders), for
 * exo_output_parser_detect: chat_template.jinja, else tokenizer_config's
 * chat_template (a string, or a list whose "default" entry or first entry
 * wins). NULL when there is none. */
static char *template_source(const char *dir)
{
    char p[EXO_RUNNER_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    char *s = read_file(p, 64u << 20);
    if (s)
        return s;
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    json_t *t = json_object_get(j, "chat_template");
    const char *src = NULL;
    if (json_is_string(t)) {
        src = json_string_value(t);
    } else if (json_is_array(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            const char *tt = json_string_value(json_object_get(e, "template"));
            const char *name = json_string_value(json_object_get(e, "name"));
            if (tt && (!src || (name && !strcmp(name, "default"))))
                src = tt;
        }
    }
    s = src ? exo_strdup(src) : NULL;
    json_decref(j);
    return s;
}

/* Loading progress from the engine: one status per bound layer, at most
 * ~50 a second, with the node's frames handled between them. */
typedef struct load_progress {
    runner *r;
    double  last;
} load_progress;

static void on_layer(void *ctx, int done, int total)
{
    load_progress *p = ctx;
    double now = exo_clock_seconds();
    if (done == total || now - p->last > 0.02) {
        send_status(p->r, EXO_RUNNER_LOADING, done, total, NULL);
        p->last = now;
    }
    drain(p->r, false);
}

static void unload(runner *r)
{
    if (!r->dist)
        exo_gen_stepper_local_free(r->stepper);
    r->stepper = NULL;
    exo_dist_free(r->dist);
    r->dist = NULL;
    exo_ring_free(r->ring);
    r->ring = NULL;
    while (r->n_store)
        store_drop(r, r->n_store - 1);
    exo_free(r->store);
    r->store = NULL;
    for (int i = 0; i < BATCH_MAX; i++) {
        if (r->bseqs[i] != r->seqs[0])
            exo_seq_free(r->bseqs[i]);
        exo_free(r->kept[i]);
    }
    for (int i = 0; i < r->n_slots; i++)
        exo_seq_free(r->seqs[i]);
    memset(r->seqs, 0, sizeof r->seqs);
    memset(r->bseqs, 0, sizeof r->bseqs);
    memset(r->kept, 0, sizeof r->kept);
    memset(r->n_kept, 0, sizeof r->n_kept);
    r->n_slots = 0;
    exo_model_free(r->model);
    exo_tokenizer_free(r->tok);
    exo_chat_template_free(r->tpl);
    exo_free(r->tpl_source);
    r->seq = NULL;
    r->model = NULL;
    r->tok = NULL;
    r->tpl = NULL;
    r->tpl_source = NULL;
}

static int eos_list(runner *r, int64_t *eos)
{
    const exo_model_config *cfg = exo_model_get_config(r->model);
    int n = 0;
    for (int i = 0; i < cfg->n_eos; i++)
        eos[n++] = cfg->eos_token_ids[i];
    const int32_t *ids;
    size_t nt = r->tok ? exo_tokenizer_eos_ids(r->tok, &ids) : 0;
    for (size_t i = 0; i < nt; i++) {
        bool dup = false;
        for (int k = 0; k < n; k++)
            dup |= eos[k] == ids[i];
        if (!dup)
            eos[n++] = ids[i];
    }
    return n;
}

/* Warm-up tokens also poll the socket, so a Shutdown need not wait. */
static int warm_token(void *ctx, const exo_sample *s)
{
    runner *r = ctx;
    (void)s;
    drain(r, false);
    return r->shutdown || r->peer_gone;
}

static void warm_up(runner *r, int n_tokens)
{
    int32_t *ids = NULL;
    size_t n = 0;
    exo_err err = {0};
    if (r->tok) {
        char *text = NULL;
        bool add_special = true;
        if (r->tpl) {
            json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", WARMUP_PROMPT);
            if (exo_chat_template_render(r->tpl, msgs, NULL, true, NULL, &text, &err) == 0)
                add_special = false;
            json_decref(msgs);
        }
        const char *t = text ? text : WARMUP_PROMPT;
        if (exo_tokenizer_encode(r->tok, t, strlen(t), add_special, &ids, &n, &err))
            n = 0;
        exo_free(text);
    }
    int V = exo_model_vocab(r->model);
    if (!n) { /* no tokenizer: a few ids */
        exo_free(ids);
        n = 8;
        ids = exo_malloc(n * sizeof *ids);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)((i + 1) % (size_t)V);
    }
    if ((int)n > r->ctx / 2)
        n = (size_t)(r->ctx / 2 > 0 ? r->ctx / 2 : 1);
    int max = n_tokens;
    if ((int)n + max > r->ctx)
        max = r->ctx - (int)n;
    if (max > 0) {
        int64_t eos[EXO_CONFIG_MAX_EOS + 8];
        exo_gen_params gp = {.sampling = exo_sampler_defaults(), .max_tokens = max,
                             .eos_ids = eos, .n_eos = eos_list(r, eos)};
        exo_gen_stats st;
        double t0 = exo_clock_seconds();
        exo_seq_truncate(r->seq, 0);
        if (exo_generate_with(r->stepper, ids, (int)n, &gp, warm_token, r, &st, &err))
            EXO_LOG_WARN("runner: warm-up failed: %s", err.msg);
        else
            EXO_LOG_INFO("runner: warmed up (%d prompt + %d tokens in %.2f s)", st.prompt_tokens,
                         st.generated_tokens, exo_clock_seconds() - t0);
        exo_seq_truncate(r->seq, 0);
    }
    exo_free(ids);
}

static bool split(const runner *r) { return r->load.world > 1; }
/* Rank 0 of a pipeline (layer ranges; the last rank samples). */
static bool pipelined(const runner *r) { return r->dist && !r->load.tensor; }

static int hex_key(const char *hex, uint8_t *key)
{
    for (int i = 0; i < EXO_RING_KEY_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return EXO_EINVAL;
        key[i] = (uint8_t)v;
    }
    return 0;
}

/* A split model's first step: listen, say where, wait to be told where the
 * next rank is, connect. false when shutting down or failed (err set). */
static bool join_ring(runner *r, exo_err *err)
{
    int port = 0;
    if (exo_ring_listen(0, &r->ring_listen_fd, &port, err))
        return false;
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_STATUS);
    m.status.kind = EXO_RUNNER_CONNECTING;
    m.status.ring_port = port;
    r->state = EXO_RUNNER_CONNECTING;
    send_msg(r, &m);
    exo_runner_msg_free(&m);
    /* the next rank's runner starts about when this one does: wait a few
     * ring timeouts for it, not for ever (its node may never get there) */
    int limit = 3 * (r->load.ring_timeout_ms > 0 ? r->load.ring_timeout_ms : 30000);
    double give_up = exo_clock_seconds() + limit / 1000.0;
    while (!r->connect_pending && !r->shutdown && !r->peer_gone && !r->connect_refused) {
        int left = (int)((give_up - exo_clock_seconds()) * 1000);
        if (left <= 0) {
            exo_err_set(err, EXO_ETIMEDOUT, "ring: not told where rank %d listens within %d ms",
                        (r->load.rank + 1) % r->load.world, limit);
            return false;
        }
        struct pollfd p = {exo_runner_chan_fd(r->ch), POLLIN, 0};
        if (poll(&p, 1, left) > 0)
            drain(r, false);
    }
    if (r->connect_refused) {
        exo_err_set(err, EXO_EINVAL, "ring: the node sent a Connect that did not decode");
        return false;
    }
    if (!r->connect_pending)
        return false;
    exo_ring_config rc = {.rank = r->load.rank, .world = r->load.world,
                          .listen_fd = r->ring_listen_fd, .next_host = r->connect.host,
                          .next_port = r->connect.port, .timeout_ms = r->load.ring_timeout_ms};
    r->ring_listen_fd = -1; /* the ring takes it */
    if (hex_key(r->load.ring_key, rc.key)) {
        exo_err_set(err, EXO_EINVAL, "bad ring key");
        return false;
    }
    double t0 = exo_clock_seconds();
    if (exo_ring_connect(&rc, &r->ring, err))
        return false;
    EXO_LOG_INFO("runner: rank %d of %d connected to %s port %d in %.2f s", r->load.rank,
                 r->load.world, r->connect.host, r->connect.port, exo_clock_seconds() - t0);
    send_status(r, EXO_RUNNER_CONNECTED, 0, 0, NULL);
    return true;
}

/* How much cache memory this rank's batch slots may hold together: at
 * most BATCH_MEMORY_SHARE of what is free once the model is loaded (on the
 * GPU for the layers there), and at most the KV budget (EXO_KV_BUDGET, `exo
 * serve --kv-budget`) where one is set; at least one context's, so a
 * request of any length can run. A request is admitted by what its
 * sequence needs (its prompt and max_tokens, up to the context), so short
 * requests run many at once where long ones would queue. */
#define BATCH_MEMORY_SHARE 0.5
static double cache_room(runner *r, const char **bound)
{
    double per = (double)exo_model_seq_bytes(r->model, r->ctx);
    int layers = exo_model_shard(r->model).n_layers, on_gpu = exo_model_gpu_layers(r->model);
    double gpu_share = layers > 0 ? (double)on_gpu / layers : 0;
    uint64_t total, avail;
    exo_err err = {0};
    double limit = r->kv_budget ? (double)r->kv_budget : INFINITY;
    *bound = r->kv_budget ? "the KV budget" : "no limit";
    if (exo_meminfo(&total, &avail, &err) == 0 && gpu_share < 1 &&
        BATCH_MEMORY_SHARE * (double)avail / (1 - gpu_share) < limit) {
        limit = BATCH_MEMORY_SHARE * (double)avail / (1 - gpu_share);
        *bound = "half the free memory";
    }
    size_t gfree, gtotal;
    if (on_gpu && exo_backend_cuda_memory(exo_model_gpu_device(r->model), &gfree, &gtotal, &err) == 0 &&
        BATCH_MEMORY_SHARE * (double)gfree / gpu_share < limit) {
        limit = BATCH_MEMORY_SHARE * (double)gfree / gpu_share;
        *bound = "half the GPU's free memory";
    }
    if (!(limit >= per)) {
        limit = per;
        *bound = "one context (the least a slot may take)";
    }
    return limit;
}

/* The batch slots' room on rank 0 (r->kv_limit, in rank 0's bytes). The
 * other ranks of a split instance keep a sequence per slot that follows
 * rank 0's (dist.h), each the size of its own share of the caches (its
 * layers, or its heads), in memory of its own (a smaller GPU, a node with
 * less free memory, its own KV budget): every rank says how many contexts
 * of its share its room holds, and rank 0 admits by the least of them.
 * Every rank of a split instance calls this at the same point of its load
 * (an all-gather over the ring, before rank 0's first frame), which also
 * brings every rank's exact rows together (r->exact_rows). */
static int batch_memory(runner *r, bool leads, exo_err *err)
{
    const char *bound;
    double per = (double)exo_model_seq_bytes(r->model, r->ctx), room = cache_room(r, &bound);
    double contexts = per > 0 ? room / per : INFINITY;
    int tightest = r->load.rank;
    if (split(r)) { /* a rank's room in contexts, and its exact rows */
        int W = r->load.world;
        float *each = exo_calloc(2 * (size_t)W, sizeof *each);
        size_t *bounds = exo_calloc((size_t)W + 1, sizeof *bounds);
        for (int i = 0; i <= W; i++)
            bounds[i] = 2 * (size_t)i;
        each[2 * r->load.rank] = contexts < FLT_MAX ? (float)contexts : FLT_MAX;
        each[2 * r->load.rank + 1] = (float)r->exact_rows;
        int rc = exo_ring_allgather(r->ring, each, bounds, err);
        for (int i = 0; !rc && i < W; i++) {
            if (i != r->load.rank && (double)each[2 * i] < contexts) {
                contexts = each[2 * i];
                tightest = i;
            }
            /* prefixes at any position where every rank's products
             * promise it, from the most rows any of them needs */
            int e = (int)each[2 * i + 1];
            r->exact_rows = !e || !r->exact_rows ? 0 : e > r->exact_rows ? e : r->exact_rows;
        }
        exo_free(each);
        exo_free(bounds);
        if (rc)
            return exo_err_wrap(err, "exchanging the ranks' cache room");
    }
    if (!leads)
        return 0;
    r->kv_limit = per > 0 ? contexts * per : room; /* no caches of its own here: its room */
    char why[96];
    if (tightest != r->load.rank)
        snprintf(why, sizeof why, "rank %d's room: its free memory or KV budget", tightest);
    else
        snprintf(why, sizeof why, "%s", bound);
    if (r->n_batch > 1)
        EXO_LOG_INFO("runner: up to %d requests at once, their caches within %.1f MB (%s; a whole context of %d "
                     "tokens takes %.1f MB, a request the share of it its prompt and max_tokens need)",
                     r->n_batch, r->kv_limit / 1e6, why, r->ctx, per / 1e6);
    return 0;
}

/* The KV budget, where one is set, must hold one context's caches: the
 * load fails with what it holds rather than the first request. */
static bool kv_budget_holds_a_context(runner *r, exo_err *err)
{
    const char *b = getenv("EXO_KV_BUDGET");
    r->kv_budget = 0;
    if (!b || !*b)
        return true;
    if (exo_parse_size(b, &r->kv_budget, err)) {
        exo_err_wrap(err, "EXO_KV_BUDGET");
        return false;
    }
    double per = (double)exo_model_seq_bytes(r->model, r->ctx);
    if (per > (double)r->kv_budget) {
        exo_err_set(err, EXO_ENOMEM, "the KV budget of %.1f MB holds no context of %d tokens (%.1f MB of caches); "
                    "raise --kv-budget or lower --ctx", (double)r->kv_budget / 1e6, r->ctx, per / 1e6);
        return false;
    }
    return true;
}

static void do_load(runner *r)
{
    r->load_pending = false;
    const char *dir = r->load.model_dir;
    exo_err err = {0};
    exo_model_config cfg;
    if (split(r) && !join_ring(r, &err)) {
        if (r->shutdown || r->peer_gone)
            return;
        goto fail;
    }
    if (exo_config_load(dir, &cfg, &err))
        goto fail;
    int max_pos = (int)(cfg.max_position_embeddings > 0 && cfg.max_position_embeddings < (1 << 24)
                            ? cfg.max_position_embeddings : 0);
    exo_config_free(&cfg);
    double t0 = exo_clock_seconds();
    load_progress lp = {r, 0};
    exo_model_opts opts = {.n_threads = r->load.n_threads, .on_layer = on_layer, .on_layer_ctx = &lp,
                           .device = r->load.device[0] ? r->load.device : NULL};
    bool tensor = split(r) && r->load.tensor;
    if (split(r) && !tensor) {
        opts.start_layer = r->load.start_layer;
        opts.end_layer = r->load.end_layer;
    }
    if (tensor) {
        opts.tp_rank = r->load.rank;
        opts.tp_size = r->load.world;
        opts.tp_allreduce = exo_dist_allreduce;
        opts.tp_ctx = r->ring;
        opts.tp_allgather = exo_dist_allgather;
    }
    send_status(r, EXO_RUNNER_LOADING, 0, 0, NULL);
    if (exo_model_load(dir, &opts, &r->model, &err))
        goto fail;
    if (r->shutdown || r->peer_gone) {
        unload(r); /* shutting down: the main loop takes it from here */
        return;
    }
    bool leads = !split(r) || r->load.rank == 0;
    if (leads && has_file(dir, "tokenizer.json") && exo_tokenizer_load(dir, &r->tok, &err))
        goto fail;
    if (leads) {
        int rc = exo_chat_template_load(dir, &r->tpl, &err);
        if (rc && rc != EXO_ENOENT)
            goto fail;
        r->tpl_source = r->tpl ? template_source(dir) : NULL;
    }
    r->ctx = r->load.ctx > 0 ? r->load.ctx : (max_pos && max_pos < DEFAULT_CTX ? max_pos : DEFAULT_CTX);
    if (!kv_budget_holds_a_context(r, &err))
        goto fail;
    /* continuous batching: a whole model, or rank 0 of a tensor-parallel
     * group or a pipeline (the other ranks' batch slots follow its, dist.h) */
    if (leads) {
        const char *b = getenv("EXO_BATCH");
        long n = b && *b ? strtol(b, NULL, 10) : BATCH_DEFAULT;
        r->n_batch = n < 1 ? 1 : n > BATCH_MAX ? BATCH_MAX : (int)n;
        const char *p = getenv("EXO_PIPE_SPLIT");
        n = p && *p ? strtol(p, NULL, 10) : PIPE_SPLIT_DEFAULT;
        r->pipe_split = n < 0 ? 0 : n > BATCH_MAX ? BATCH_MAX : (int)n;
        const char *ms = getenv("EXO_PREFILL_SLICE_MS");
        n = ms && *ms ? strtol(ms, NULL, 10) : SLICE_MS_DEFAULT;
        r->slice_ms = n < 0 ? 0 : n > 60000 ? 60000 : (int)n;
    }
    /* a pipeline that does not batch keeps one sequence per request in
     * flight, so every rank can work on a different one: as many as there
     * are ranks (the other ranks keep them whether rank 0 batches or not) */
    r->n_slots = split(r) && !tensor && !(leads && r->n_batch > 1)
                     ? (r->load.world < EXO_DIST_MAX_SLOTS ? r->load.world : EXO_DIST_MAX_SLOTS) : 1;
    for (int i = 0; i < r->n_slots; i++)
        if (exo_seq_create(r->model, r->ctx, &r->seqs[i], &err))
            goto fail;
    r->seq = r->seqs[0];
    if (split(r)) {
        r->dist = exo_dist_new(r->ring, tensor, r->model, r->seqs, r->n_slots);
        r->stepper = exo_dist_stepper(r->dist);
    } else {
        r->stepper = exo_gen_stepper_local(r->model, r->seq);
    }
    /* a tensor group's partial sums are not probed: whole chunks there */
    r->exact_rows = tensor ? 0 : exo_model_exact_rows(r->model);
    if (batch_memory(r, leads, &err))
        goto fail;
    if (leads)
        r->bseqs[0] = r->seqs[0]; /* one context's caches fewer; warm-up is done before a batch */
    exo_shard_info sh = exo_model_shard(r->model);
    EXO_LOG_INFO("runner: loaded %s (layers %d-%d of %d%s, ctx %d) in %.2f s", dir, sh.start_layer,
                 sh.end_layer, sh.n_layers, tensor ? ", a tensor-parallel share" : "", r->ctx,
                 exo_clock_seconds() - t0);
    send_status(r, EXO_RUNNER_LOADED, 0, 0, NULL);
    send_status(r, EXO_RUNNER_WARMING_UP, 0, 0, NULL);
    /* rank 0 warms the whole ring up; the others serve it from their loop */
    if (leads && r->load.warmup_tokens > 0)
        warm_up(r, r->load.warmup_tokens);
    if (r->shutdown || r->peer_gone)
        return;
    send_status(r, EXO_RUNNER_READY, 0, 0, NULL);
    return;
fail:
    unload(r);
    if (!err.msg[0])
        snprintf(err.msg, sizeof err.msg, "%s", exo_strerror(err.code));
    EXO_LOG_ERROR("runner: loading %s failed: %s", dir, err.msg);
    char why[EXO_ERR_LEN + 64];
    snprintf(why, sizeof why, "the model failed to load: %s", err.msg);
    r->fail_msg = exo_strdup(why);
    send_status(r, EXO_RUNNER_FAILED, 0, 0, err.msg);
}

/* The ring broke: this runner can serve nothing more; the node replaces it.
 * Requests still queued are told so (fail_msg), not that the model failed
 * to load: it had loaded and served. */
static void ring_failed(runner *r, const char *why)
{
    EXO_LOG_ERROR("runner: rank %d of %d: %s", r->load.rank, r->load.world, why);
    char msg[EXO_ERR_LEN + 64];
    snprintf(msg, sizeof msg, "the model's ranks lost each other: %s", why);
    exo_free(r->fail_msg);
    r->fail_msg = exo_strdup(msg);
    unload(r);
    send_status(r, EXO_RUNNER_FAILED, 0, 0, why);
}

static bool ring_error(int code)
{
    return code == EXO_EIO || code == EXO_ETIMEDOUT || code == EXO_EFORMAT || code == EXO_EPERM;
}

/* ---- generation ----------------------------------------------------------- */

typedef struct gen_ctx {
    runner            *r;
    job               *j;
    exo_output_parser *parser;
    exo_detok_stream  *ds;
    bool               stopped; /* a stop sequence matched */
    bool               cancel;  /* a Cancel (or Shutdown) for this request */
    int32_t            prev_id; /* the token before the one being reported */
    char              *prompt;  /* the rendered template */
    int32_t           *ids;     /* its tokens */
    size_t             n_ids;
    exo_gen_params     gp;
    int64_t            eos[EXO_CONFIG_MAX_EOS + 8];
    /* a pipeline's or a batch's request in flight: its slot and generation */
    int                slot;
    int                reused;  /* prompt tokens whose cache came from an earlier request */
    exo_gen_seq       *seq;
    bool               waiting; /* a step that wants a sample is out */
    bool               stepped; /* a batch's request: its first step has run */
    bool               prompt_kept; /* its prompt went into the prefix cache when its prefill ended */
    /* a batch's request that gave its caches back (slot_preempt): its
     * sampler kept for when it computes them again, and its place in
     * r->preempted, which is in order of first admission */
    exo_sampler       *smp;
    uint64_t           admitted;
    struct gen_ctx    *next;
} gen_ctx;

/* The text an alternative token would have added after prev: decoding it
 * alone would apply start-of-text rules (SentencePiece strips the leading
 * space of the first piece), so it is decoded after its real predecessor
 * and the predecessor's own text is cut off. */
static char *alt_text(const exo_tokenizer *tok, int32_t prev, int32_t alt)
{
    size_t pl, bl;
    int32_t pair[2] = {prev, alt};
    char *p = exo_tokenizer_decode(tok, &prev, 1, false, &pl);
    char *both = exo_tokenizer_decode(tok, pair, 2, false, &bl);
    char *out;
    if (prev >= 0 && bl >= pl && !memcmp(both, p, pl))
        out = exo_strndup(both + pl, bl - pl);
    else
        out = exo_tokenizer_decode(tok, &alt, 1, false, &bl);
    exo_free(p);
    exo_free(both);
    return out;
}

static void emit(void *ctx, const exo_chunk *c)
{
    gen_ctx *g = ctx;
    send_chunk(g->r, g->j->id, c);
}

static int on_token(void *ctx, const exo_sample *s)
{
    gen_ctx *g = ctx;
    runner *r = g->r;
    size_t len;
    const char *piece = exo_detok_stream_push(g->ds, s->id, &len);
    exo_chunk c;
    exo_chunk_token(&c, piece, len, s->id, false);
    if (g->j->req.logprobs) {
        c.has_logprob = true;
        c.logprob = s->logprob;
        /* the entry names the token as its alternatives are named (after
         * its predecessor), not the piece the detokenizer let out now */
        char *own = alt_text(r->tok, g->prev_id, s->id);
        exo_chunk_set_token_text(&c, own);
        exo_free(own);
        for (int i = 0; i < s->n_top; i++) {
            char *t = alt_text(r->tok, g->prev_id, s->top_ids[i]);
            exo_chunk_set_top(&c, i, t, s->top_logprobs[i]);
            exo_free(t);
        }
    }
    g->prev_id = s->id;
    if (exo_output_parser_feed(g->parser, &c, emit, g))
        g->stopped = true;
    exo_chunk_free(&c);
    drain(r, false);
    return g->stopped || g->cancel || r->peer_gone;
}

/* Between prefill chunks: progress up, cancels in. */
static int on_prefill(void *ctx, int processed, int total)
{
    gen_ctx *g = ctx;
    runner *r = g->r;
    exo_chunk c;
    exo_chunk_prefill(&c, g->reused + processed, g->reused + total);
    send_chunk(r, g->j->id, &c);
    exo_chunk_free(&c);
    drain(r, false);
    return g->cancel || r->peer_gone;
}

static void sampling_for(const runner *r, const exo_gen_request *q, exo_sampler_params *sp)
{
    const exo_generation_defaults *g = &exo_model_get_config(r->model)->generation;
    *sp = exo_sampler_defaults();
    bool sample = !(g->set & EXO_GEN_DO_SAMPLE) || g->do_sample;
    if (sample) {
        if (g->set & EXO_GEN_TEMPERATURE)
            sp->temperature = (float)g->temperature;
        if (g->set & EXO_GEN_TOP_P)
            sp->top_p = (float)g->top_p;
        if (g->set & EXO_GEN_TOP_K)
            sp->top_k = (int)g->top_k;
        if (g->set & EXO_GEN_MIN_P)
            sp->min_p = (float)g->min_p;
    }
    if (g->set & EXO_GEN_REPETITION_PENALTY)
        sp->repetition_penalty = (float)g->repetition_penalty;
    const exo_sampler_params *c = &q->sampling;
    if (q->has & EXO_GEN_HAS_TEMPERATURE) sp->temperature = c->temperature;
    if (q->has & EXO_GEN_HAS_TOP_P) sp->top_p = c->top_p;
    if (q->has & EXO_GEN_HAS_TOP_K) sp->top_k = c->top_k;
    if (q->has & EXO_GEN_HAS_MIN_P) sp->min_p = c->min_p;
    if (q->has & EXO_GEN_HAS_REP_PENALTY) sp->repetition_penalty = c->repetition_penalty;
    if (q->has & EXO_GEN_HAS_REP_CONTEXT) sp->repetition_context_size = c->repetition_context_size;
    if (q->has & EXO_GEN_HAS_PRESENCE) sp->presence_penalty = c->presence_penalty;
    if (q->has & EXO_GEN_HAS_FREQUENCY) sp->frequency_penalty = c->frequency_penalty;
    if (q->has & EXO_GEN_HAS_SEED) {
        sp->seed = c->seed;
    } else {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
            seed = exo_clock_ns();
        sp->seed = seed;
    }
    sp->top_logprobs = q->logprobs ? c->top_logprobs : 0;
}

static bool cancel_active(runner *r, const char *id)
{
    bool found = false;
    for (int i = 0; i < r->n_active; i++)
        if (!id || !strcmp(r->active[i]->j->id, id)) {
            r->active[i]->cancel = true;
            found = true;
        }
    return found;
}

static void activate(runner *r, gen_ctx *g)
{
    r->active[r->n_active++] = g;
}

static void deactivate(runner *r, gen_ctx *g)
{
    for (int i = 0; i < r->n_active; i++)
        if (r->active[i] == g) {
            r->active[i] = r->active[--r->n_active];
            break;
        }
}

/* Template, tokens, parser and parameters of a request; false (after
 * answering it with an error) when it cannot run. */
static bool job_open(runner *r, job *j, gen_ctx *g)
{
    exo_gen_request *q = &j->req;
    exo_err err = {0};
    char msg[EXO_ERR_LEN + 64];
    memset(g, 0, sizeof *g);
    g->r = r;
    g->j = j;
    g->prev_id = -1;
    g->cancel = r->shutdown;
    if (split(r) && r->load.rank != 0) {
        fail_request(r, j->id, "this runner is not rank 0 of its model: it takes no requests");
        return false;
    }
    if (!r->tok || !r->tpl) {
        fail_request(r, j->id, r->tok ? "the model has no chat template"
                                      : "the model has no tokenizer.json");
        return false;
    }
    json_t *extra = json_object();
    if (q->enable_thinking >= 0) { /* DeepSeek-V3.1's template reads "thinking" */
        json_object_set_new(extra, "enable_thinking", json_boolean(q->enable_thinking));
        json_object_set_new(extra, "thinking", json_boolean(q->enable_thinking));
    }
    if (q->reasoning_effort != EXO_EFFORT_UNSET)
        json_object_set_new(extra, "reasoning_effort",
                            json_string(exo_reasoning_effort_name(q->reasoning_effort)));
    const json_t *tools = q->tools && json_array_size(q->tools) ? q->tools : NULL;
    int rc = exo_chat_template_render(r->tpl, q->messages, tools, true, extra, &g->prompt, &err);
    json_decref(extra);
    if (rc) {
        snprintf(msg, sizeof msg, "chat template: %s", err.msg);
        fail_request(r, j->id, msg);
        return false;
    }
    if (exo_tokenizer_encode(r->tok, g->prompt, strlen(g->prompt), false, &g->ids, &g->n_ids, &err)) {
        snprintf(msg, sizeof msg, "tokenizer: %s", err.msg);
        fail_request(r, j->id, msg);
        return false;
    }
    if (g->n_ids == 0) {
        fail_request_status(r, j->id, 400, "the prompt encodes to no tokens");
        return false;
    }
    if (g->n_ids >= (size_t)r->ctx) {
        snprintf(msg, sizeof msg, "the prompt is %zu tokens, more than the context of %d tokens allows",
                 g->n_ids, r->ctx);
        fail_request_status(r, j->id, 400, msg);
        return false;
    }
    g->prev_id = g->ids[g->n_ids - 1];
    exo_output_parser_config pc = {0};
    exo_output_parser_detect(r->tpl_source, g->prompt, &pc);
    pc.stop = (const char *const *)q->stop;
    pc.n_stop = q->n_stop;
    pc.tools = tools;
    pc.raw = q->bench;
    g->parser = exo_output_parser_create(&pc);
    /* Markup the parser needs may be special tokens: keep them when it parses. */
    bool keep_special = !q->bench && (pc.tool_format != EXO_TOOL_FMT_NONE || pc.think_start);
    g->ds = exo_detok_stream_new(r->tok, !keep_special);

    sampling_for(r, q, &g->gp.sampling);
    g->gp.max_tokens = q->has & EXO_GEN_HAS_MAX_TOKENS ? q->max_tokens : DEFAULT_MAX_TOKENS;
    g->gp.eos_ids = g->eos;
    g->gp.n_eos = q->bench ? 0 : eos_list(r, g->eos);
    g->gp.prefill_chunk = split(r) && !r->load.tensor ? PIPELINE_CHUNK : PREFILL_CHUNK;
    g->gp.on_prefill = on_prefill;
    return true;
}

static void job_free_ctx(gen_ctx *g)
{
    exo_output_parser_free(g->parser);
    exo_detok_stream_free(g->ds);
    exo_gen_seq_free(g->seq);
    exo_free(g->ids);
    exo_free(g->prompt);
    g->parser = NULL;
    g->ds = NULL;
    g->seq = NULL;
    g->ids = NULL;
    g->prompt = NULL;
}

/* The end of a request that ran: the rest of the text, the finish chunk, Done. */
static void job_close(runner *r, gen_ctx *g, const exo_gen_stats *st)
{
    job *j = g->j;
    if (!g->stopped) {
        size_t len;
        const char *rest = exo_detok_stream_flush(g->ds, &len);
        if (len) {
            exo_chunk c;
            exo_chunk_token(&c, rest, len, -1, false);
            if (exo_output_parser_feed(g->parser, &c, emit, g))
                g->stopped = true;
            exo_chunk_free(&c);
        }
    }
    exo_finish_reason fr;
    if (g->stopped || st->finish == EXO_FINISH_STOP)
        fr = EXO_FR_STOP;
    else if (st->finish == EXO_FINISH_CANCEL)
        fr = EXO_FR_CANCELLED;
    else
        fr = EXO_FR_LENGTH;
    fr = exo_output_parser_finish(g->parser, fr, emit, g);
    exo_usage usage = {(int)g->n_ids, st->generated_tokens,
                       exo_output_parser_reasoning_tokens(g->parser), g->reused};
    /* a prefill cancelled part way has no meaningful prompt speed */
    bool prefilled = st->finish != EXO_FINISH_CANCEL || st->generated_tokens > 0;
    double ptps = prefilled && st->prefill_seconds > 0 ? ((double)g->n_ids - g->reused) / st->prefill_seconds : 0;
    double gtps = st->decode_seconds > 0 && st->generated_tokens > 1
                      ? (st->generated_tokens - 1) / st->decode_seconds : 0;
    exo_chunk fin;
    exo_chunk_finish(&fin, fr, &usage, ptps, gtps);
    exo_chunk_set_stop_sequence(&fin, exo_output_parser_stop_sequence(g->parser));
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        fin.peak_memory_bytes = (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
    send_chunk(r, j->id, &fin);
    exo_chunk_free(&fin);
    send_done(r, j->id);
}

/* A request that failed while generating: the error, and for a broken ring
 * the runner itself. */
static void job_error(runner *r, gen_ctx *g, int rc, const exo_err *err)
{
    char msg[EXO_ERR_LEN + 64];
    snprintf(msg, sizeof msg, "generation failed: %s", err->msg[0] ? err->msg : exo_strerror(rc));
    fail_request(r, g->j->id, msg);
}

static job *pop(runner *r);

/* The next queued request, opened (template, tokens, parser); NULL when
 * it could not run (it was answered). */
static gen_ctx *job_take(runner *r)
{
    job *j = pop(r);
    gen_ctx *g = exo_calloc(1, sizeof *g);
    if (job_open(r, j, g))
        return g;
    job_free_ctx(g);
    exo_free(g);
    job_free(j);
    return NULL;
}

static void run_job(runner *r, job *j)
{
    gen_ctx g;
    if (!job_open(r, j, &g)) {
        job_free_ctx(&g);
        return;
    }
    activate(r, &g);
    exo_gen_stats st;
    exo_err err = {0};
    exo_seq_truncate(r->seq, 0);
    int rc = exo_generate_with(r->stepper, g.ids, (int)g.n_ids, &g.gp, on_token, &g, &st, &err);
    deactivate(r, &g);
    if (rc) {
        job_error(r, &g, rc, &err);
        if (split(r) && ring_error(rc))
            ring_failed(r, err.msg[0] ? err.msg : exo_strerror(rc));
    } else {
        job_close(r, &g, &st);
    }
    job_free_ctx(&g);
}

/* ---- a pipeline's requests in flight ---------------------------------------- */

/* Rank 0 of a pipeline: up to one request per slot at once. Each request's
 * generation (exo_gen_seq) says what its next step is; rank 0 runs it
 * through its layers and sends it on, then goes on to another request's
 * step instead of waiting, so the ranks work on different requests at
 * the same time; samples come back from the last rank in any order. */
static void run_pipeline(runner *r)
{
    gen_ctx *slots[EXO_DIST_MAX_SLOTS] = {0};
    int n = r->n_slots;
    exo_err err = {0};
    int rc = 0;
    for (;;) {
        /* new requests into free slots (a slot whose sample is still out
         * stays taken until it comes back) */
        for (int i = 0; i < n && r->head && !rc; i++) {
            if (slots[i])
                continue;
            gen_ctx *g = job_take(r);
            if (!g)
                continue;
            g->slot = i;
            exo_seq_truncate(r->seqs[i], 0);
            g->seq = exo_gen_seq_new(g->ids, (int)g->n_ids, 0, exo_seq_capacity(r->seqs[i]), &g->gp,
                                     on_token, g);
            if ((rc = exo_dist_begin(r->dist, i, &g->gp.sampling, g->ids, (int)g->n_ids,
                                     g->gp.max_tokens, &err))) {
                job_error(r, g, rc, &err);
                job_free_ctx(g);
                job_free(g->j);
                exo_free(g);
                break;
            }
            slots[i] = g;
            activate(r, g);
        }
        /* one step of every request that has one to take */
        bool any = false;
        for (int i = 0; i < n && !rc; i++) {
            gen_ctx *g = slots[i];
            if (!g || g->waiting)
                continue;
            const int32_t *tokens;
            int T;
            bool want;
            bool cancelled = g->cancel && !exo_gen_seq_done(g->seq); /* between steps */
            if (!cancelled && exo_gen_seq_next(g->seq, &tokens, &T, &want)) {
                if ((rc = exo_dist_send_step(r->dist, i, tokens, T, want, &err)))
                    break;
                exo_gen_seq_stepped(g->seq);
                g->waiting = want;
                any = true;
                continue;
            }
            /* done (or cancelled): answer it and free the slot */
            exo_gen_stats st;
            exo_gen_seq_stats(g->seq, &st);
            if (cancelled)
                st.finish = EXO_FINISH_CANCEL;
            deactivate(r, g);
            job_close(r, g, &st);
            job_free_ctx(g);
            job_free(g->j);
            exo_free(g);
            slots[i] = NULL;
        }
        if (rc)
            break;
        bool waiting = false;
        for (int i = 0; i < n; i++)
            waiting |= slots[i] && slots[i]->waiting;
        if (!waiting && !any) {
            bool left = false;
            for (int i = 0; i < n; i++)
                left |= slots[i] != NULL;
            if (!left && !r->head)
                break;
            continue;
        }
        if (any && !waiting)
            continue;
        /* a sample back (the step just sent computes meanwhile) */
        int i;
        exo_sample s;
        if ((rc = exo_dist_recv_sample(r->dist, &i, &s, &err)))
            break;
        if (i >= n || !slots[i] || !slots[i]->waiting) {
            rc = exo_err_set(&err, EXO_EFORMAT, "ring: a sample for slot %d, which waits for none", i);
            break;
        }
        slots[i]->waiting = false;
        exo_gen_seq_sampled(slots[i]->seq, &s);
        drain(r, false);
        if (r->peer_gone)
            cancel_active(r, NULL);
    }
    if (!rc)
        return;
    /* the ring broke: every request in flight gets the error */
    for (int i = 0; i < n; i++) {
        gen_ctx *g = slots[i];
        if (!g)
            continue;
        deactivate(r, g);
        job_error(r, g, rc, &err);
        job_free_ctx(g);
        job_free(g->j);
        exo_free(g);
    }
    if (ring_error(rc))
        ring_failed(r, err.msg[0] ? err.msg : exo_strerror(rc));
}

/* ---- continuous batching ------------------------------------------------------ */

/* A request of the batch: its generation (g->seq) and its own sampler
 * (parameters, seed, history), on the slot's sequence. */
typedef struct batch_slot {
    gen_ctx     *g;
    exo_sampler *smp;
    /* a pipeline's preempted request, whose sampler the last rank keeps in
     * this slot: the slot is its, for when it runs again */
    gen_ctx     *parked;
} batch_slot;

/* The positions of g's prompt that slot i's sequence holds, computed as
 * from 0 (prompt_exact), and can go back to: a recurrent state only to
 * where its last prompt chunk began, a ring only within its window. */
static int slot_keepable(runner *r, int i, const gen_ctx *g)
{
    int whole = prompt_exact(r, (int)g->n_ids);
    int held = prompt_exact(r, exo_seq_len(r->bseqs[i])); /* a prefill cut short: at a chunk's or slice's end */
    int keep = whole < held ? whole : held;
    while (keep > 0 && !exo_seq_can_return(r->bseqs[i], keep))
        keep -= BATCH_PREFILL;
    return keep;
}

/* Right after slot i's last prompt chunk: the prompt into the prefix cache
 * now, while a sliding ring still holds the window its end reads (an
 * answer longer than the ring's spare slots moves it past that before the
 * request ends). */
static void slot_prompt_done(runner *r, int i, gen_ctx *g)
{
    if (g->prompt_kept)
        return;
    g->prompt_kept = true;
    int keep = slot_keepable(r, i, g);
    if (keep > 0)
        store_put(r, i, g->ids, keep);
}

/* What slot i's sequence keeps for prefix reuse once g is done with it:
 * g's prompt, and the positions of it slot_keepable (after an error,
 * none). */
static void slot_keep(runner *r, int i, const gen_ctx *g, bool failed)
{
    exo_free(r->kept[i]);
    r->kept[i] = NULL;
    r->n_kept[i] = 0;
    int keep = slot_keepable(r, i, g);
    if (failed || keep <= 0)
        return;
    r->kept[i] = exo_malloc(sizeof(int32_t) * (size_t)keep);
    memcpy(r->kept[i], g->ids, sizeof(int32_t) * (size_t)keep);
    r->n_kept[i] = keep;
    store_put(r, i, g->ids, keep);
}

/* The end of slot b's request: its last text, finish chunk and Done, or
 * the error rc. */
static void slot_close(runner *r, batch_slot *b, int rc, const exo_err *err)
{
    gen_ctx *g = b->g;
    deactivate(r, g);
    if (rc) {
        job_error(r, g, rc, err);
    } else {
        exo_gen_stats st;
        exo_gen_seq_stats(g->seq, &st);
        if (g->cancel && !exo_gen_seq_done(g->seq))
            st.finish = EXO_FINISH_CANCEL;
        job_close(r, g, &st);
    }
    if (r->bseqs[g->slot])
        slot_keep(r, g->slot, g, rc != 0);
    job_free_ctx(g);
    job_free(g->j);
    exo_sampler_free(g->smp);
    exo_free(g);
    exo_sampler_free(b->smp);
    b->g = NULL;
    b->smp = NULL;
}

/* A preempted request's end before it ran again (a cancel): its finish
 * chunk (CANCEL) and Done. */
static void preempted_close(runner *r, batch_slot *slots, gen_ctx *g)
{
    if (slots[g->slot].parked == g)
        slots[g->slot].parked = NULL;
    deactivate(r, g);
    exo_gen_stats st;
    exo_gen_seq_stats(g->seq, &st);
    st.finish = EXO_FINISH_CANCEL;
    job_close(r, g, &st);
    job_free_ctx(g);
    job_free(g->j);
    exo_sampler_free(g->smp);
    exo_free(g);
}

/* Prompt positions slot i's sequence can give a request for ids (n
 * tokens): of those both start with, short of the last token (whose logits
 * the request needs), its reuse_point, where the sequence can go back to
 * it. */
static int slot_reuse(const runner *r, int i, const int32_t *ids, int n)
{
    int common = 0;
    while (common < r->n_kept[i] && common < n - 1 && r->kept[i][common] == ids[common])
        common++;
    common = reuse_point(r, n, common);
    return common && exo_seq_can_return(r->bseqs[i], common) ? common : 0;
}

/* The running request whose prompt g's takes most of (reuse_point; its
 * sequence holds them: past its prefill's progress they are not yet there),
 * when that is more than `than`: its slot, the count in *n; else -1. */
static int busy_prefix(const runner *r, const batch_slot *slots, const gen_ctx *g, int than, int *n)
{
    int best = -1;
    *n = than;
    for (int j = 0; j < r->n_batch; j++) {
        const gen_ctx *o = slots[j].g;
        if (!o || o == g || !r->bseqs[j])
            continue;
        int held = exo_seq_len(r->bseqs[j]) < (int)o->n_ids ? exo_seq_len(r->bseqs[j]) : (int)o->n_ids;
        held = prompt_exact(r, held);
        int common = 0;
        while (common < held && common < (int)g->n_ids - 1 && o->ids[common] == g->ids[common])
            common++;
        common = reuse_point(r, (int)g->n_ids, common);
        if (common > *n && exo_seq_can_return(r->bseqs[j], common)) {
            best = j;
            *n = common;
        }
    }
    return best;
}

/* The free slot for g: the one that reuses the most of its prompt; else
 * one never used, else the least recently used (its cache goes). -1: none
 * is free. */
static int slot_for(const runner *r, const batch_slot *slots, const gen_ctx *g, int *reuse)
{
    int best = -1, best_reuse = 0;
    for (int i = 0; i < r->n_batch; i++) {
        if (slots[i].g || slots[i].parked)
            continue;
        int k = r->bseqs[i] ? slot_reuse(r, i, g->ids, (int)g->n_ids) : 0;
        bool better = best < 0 || k > best_reuse ||
                      (k == best_reuse && (!r->bseqs[i] ? r->bseqs[best] != NULL
                                                        : r->bseqs[best] && r->used[i] < r->used[best]));
        if (better) {
            best = i;
            best_reuse = k;
        }
    }
    *reuse = best_reuse;
    return best;
}

/* Positions request g's sequence needs: its prompt and max_tokens, up to
 * the context. */
static int slot_need(const runner *r, const gen_ctx *g)
{
    int64_t need = (int64_t)g->n_ids + g->gp.max_tokens;
    return need < r->ctx ? (int)need : r->ctx;
}

/* Positions request g's sequence holds when it is admitted: its prompt,
 * the tokens a preempted request runs again, and RESERVE_AHEAD more (up to
 * what it needs), not its whole max_tokens, which most answers never
 * reach; slots_grow adds more as it decodes. */
#define RESERVE_AHEAD 256
static int slot_reserve(const runner *r, const gen_ctx *g)
{
    int need = slot_need(r, g);
    int64_t hold = (int64_t)g->n_ids + (g->seq ? exo_gen_seq_decoded(g->seq) : 0) + RESERVE_AHEAD;
    return hold < need ? (int)hold : need;
}

/* Batch slot i's sequence keeps its first `keep` positions and holds
 * `capacity` (made where the slot has none); bseq_copy: the first n
 * positions of slot from's into slot i's. In a tensor-parallel group the
 * other ranks' sequences of the slot follow (dist.h). */
static int bseq_resize(runner *r, int i, int keep, int capacity, exo_err *err)
{
    int rc;
    if (r->bseqs[i]) {
        exo_seq_truncate(r->bseqs[i], keep);
        rc = exo_seq_resize(r->bseqs[i], capacity, err);
    } else {
        rc = exo_seq_create(r->model, capacity, &r->bseqs[i], err);
    }
    return rc || !r->dist ? rc : exo_dist_seq_resize(r->dist, i, keep, capacity, err);
}

static int bseq_copy(runner *r, int i, int from, int n, exo_err *err)
{
    int rc = exo_seq_copy_prefix(r->bseqs[i], r->bseqs[from], n, err);
    return rc || !r->dist ? rc : exo_dist_seq_copy(r->dist, i, from, n, err);
}

/* Makes room for `bytes` more by giving up the prefix cache's entries (not
 * `spare`), then idle slots' caches (not slot `keep`'s), least recently used first:
 * each slot first shrinks to the prefix it keeps for reuse, then lets it
 * go. True when the room is there. */
static bool slot_make_room(runner *r, const batch_slot *slots, int keep, const exo_kv_prefix *spare, double bytes)
{
    while (slots_held(r) + bytes > r->kv_limit && store_evict(r, spare))
        ;
    for (int pass = 0; pass < 2; pass++)
        for (;;) {
            if (slots_held(r) + bytes <= r->kv_limit)
                return true;
            int lru = -1;
            for (int i = 0; i < r->n_batch; i++) {
                exo_seq *q = r->bseqs[i];
                int floor = pass == 0 ? r->n_kept[i] : 0;
                if (i == keep || slots[i].g || !q || exo_seq_bytes(q) <= exo_model_seq_bytes(r->model, floor))
                    continue;
                if (lru < 0 || r->used[i] < r->used[lru])
                    lru = i;
            }
            if (lru < 0)
                break;
            exo_err err = {0};
            if (pass == 1) {
                exo_free(r->kept[lru]);
                r->kept[lru] = NULL;
                r->n_kept[lru] = 0;
            }
            if (bseq_resize(r, lru, r->n_kept[lru], r->n_kept[lru] > 0 ? r->n_kept[lru] : 1, &err)) {
                EXO_LOG_WARN("runner: cannot shrink slot %d's caches: %s", lru, err.msg);
                return false;
            }
        }
    return slots_held(r) + bytes <= r->kv_limit;
}

/* The next queued request into a free slot, with caches of what it needs
 * (the slot's sequence made, grown or shrunk to that); false when none is
 * free, or the memory is held by running requests (the request waits in
 * r->waiting, where a cancel still reaches it), or it could not start (it
 * was answered). */
static bool slot_open(runner *r, batch_slot *slots)
{
    int free_slots = 0, running = 0, reuse = 0;
    for (int k = 0; k < r->n_batch; k++) {
        free_slots += !slots[k].g && !slots[k].parked;
        running += slots[k].g != NULL;
    }
    gen_ctx *g = r->preempted; /* they were admitted before any other waiting */
    bool resumed = g != NULL;
    bool own_slot = resumed && slots[g->slot].parked == g; /* a pipeline's: its sampler is there */
    if (!free_slots && !own_slot)
        return false;
    if (resumed) {
        r->preempted = g->next;
        g->next = NULL;
    } else {
        g = r->waiting;
        r->waiting = NULL;
    }
    if (g && g->cancel && resumed) {
        preempted_close(r, slots, g);
        return true;
    }
    if (g && g->cancel) {
        deactivate(r, g);
        finish_cancelled(r, g->j->id, NULL);
        job_free_ctx(g);
        job_free(g->j);
        exo_free(g);
        return true;
    }
    if (!g) {
        g = job_take(r);
        if (!g)
            return true; /* answered; the slot stays free for the next */
        activate(r, g);
    }
    int i = own_slot ? g->slot : slot_for(r, slots, g, &reuse);
    if (own_slot && r->bseqs[i])
        reuse = slot_reuse(r, i, g->ids, (int)g->n_ids);
    batch_slot *b = &slots[i];
    exo_err err = {0};
    int need = slot_reserve(r, g);
    /* a longer prefix a running request or the prefix cache holds is
     * shared, not held twice */
    int copy, from = busy_prefix(r, slots, g, reuse, &copy);
    int stored, kept = store_find(r, g->ids, (int)g->n_ids, from >= 0 ? copy : reuse, &stored);
    int shared = kept >= 0 ? stored : from >= 0 ? copy : 0;
    double grow = (double)exo_model_seq_bytes(r->model, need) - (r->bseqs[i] ? (double)exo_seq_bytes(r->bseqs[i]) : 0) -
                  (double)exo_model_shared_prefix_bytes(r->model, shared);
    exo_kv_prefix *take = kept >= 0 ? r->store[kept].pages : NULL;
    if (!slot_make_room(r, slots, i, take, grow)) {
        if (running) { /* until a running request gives its caches back */
            if (resumed) {
                g->next = r->preempted;
                r->preempted = g;
            } else {
                r->waiting = g;
            }
            return false;
        }
        EXO_LOG_WARN("runner: request %s needs %d positions, more than the cache memory holds", g->j->id, need);
    }
    b->g = g;
    b->parked = NULL;
    g->slot = i;
    int rc = bseq_resize(r, i, reuse, need, &err); /* need > reuse: the prompt's last token is computed */
    if (rc) {
        slot_close(r, b, rc, &err);
        return true;
    }
    /* a longer prefix the prefix cache or a running request holds: its
     * pages shared, not computed again */
    if (take && (rc = exo_seq_take_prefix(r->bseqs[i], take, stored, &err)) == EXO_EUNSUPPORTED)
        take = NULL; /* a ring that does not fit this slot's: as if not found */
    /* slot_make_room may have given entries up, and moved the rest: by pages */
    if (take && !rc && r->dist)
        rc = exo_dist_prefix_take(r->dist, i, store_entry(r, take)->id, stored, &err);
    if (take) {
        if (rc) {
            slot_close(r, b, rc, &err);
            return true;
        }
        store_entry(r, take)->used = ++r->clock;
        reuse = stored;
    } else if (from >= 0 && (rc = bseq_copy(r, i, from, copy, &err)) == 0)
        reuse = copy;
    else if (from >= 0 && rc != EXO_EUNSUPPORTED) {
        slot_close(r, b, rc, &err);
        return true;
    }
    r->used[i] = ++r->clock;
    if (resumed) { /* its caches again, then on from where it was */
        exo_gen_seq_restart(g->seq, g->ids + reuse, (int)g->n_ids - reuse, reuse);
        b->smp = g->smp;
        g->smp = NULL;
        return true;
    }
    g->admitted = r->clock;
    g->reused = reuse;
    g->gp.prefill_chunk = BATCH_PREFILL;
    if (pipelined(r)) { /* the last rank samples: its sampler for the slot */
        if ((rc = exo_dist_begin(r->dist, i, &g->gp.sampling, g->ids, (int)g->n_ids, g->gp.max_tokens, &err))) {
            slot_close(r, b, rc, &err);
            return true;
        }
    } else {
        b->smp = exo_sampler_create(&g->gp.sampling, exo_model_vocab(r->model));
        if (exo_sampler_begin(b->smp, g->ids, (int)g->n_ids, g->gp.max_tokens)) {
            exo_err_set(&err, EXO_ENOMEM, "out of memory for the sampler's history");
            slot_close(r, b, EXO_ENOMEM, &err);
            return true;
        }
    }
    g->seq = exo_gen_seq_new(g->ids + reuse, (int)g->n_ids - reuse, reuse, slot_need(r, g), &g->gp, on_token, g);
    return true;
}

/* Before the first chunk of slot i's prompt: a running request admitted
 * before it may hold more of its prefix now than when it was admitted (it
 * was still prefilling then, and prompts prefill in order of admission):
 * that prefix is taken over, its whole pages shared, not computed again.
 * False when the slot was closed (the copy failed). */
static bool slot_share_late(runner *r, batch_slot *slots, int i)
{
    gen_ctx *g = slots[i].g;
    int copy, from = busy_prefix(r, slots, g, g->reused, &copy);
    if (from < 0)
        return true;
    exo_err err = {0};
    int rc = bseq_copy(r, i, from, copy, &err);
    if (rc == EXO_EUNSUPPORTED)
        return true;
    if (rc) {
        slot_close(r, &slots[i], rc, &err);
        return false;
    }
    exo_gen_seq_free(g->seq);
    g->reused = copy;
    g->seq = exo_gen_seq_new(g->ids + copy, (int)g->n_ids - copy, copy, slot_need(r, g), &g->gp, on_token, g);
    return true;
}

/* Slot v's request gives its caches back: it waits in r->preempted, its
 * sampler and generation kept, to compute them again when memory allows
 * (exo_gen_seq_restart: the same bits, so the same tokens); its prompt's
 * whole chunks stay in the slot and the prefix cache, for its return,
 * while nothing else needs that memory. A pipeline's sampler is the last
 * rank's, in the slot: the request keeps the slot (parked), and its
 * restart's steps want no sample until it decodes again. */
static void slot_preempt(runner *r, batch_slot *slots, int v)
{
    batch_slot *b = &slots[v];
    gen_ctx *g = b->g;
    EXO_LOG_INFO("runner: request %s preempted after %d decoded tokens: its caches go back until memory frees",
                 g->j->id, exo_gen_seq_decoded(g->seq));
    slot_keep(r, v, g, false);
    exo_err err = {0};
    if (bseq_resize(r, v, r->n_kept[v], r->n_kept[v] > 0 ? r->n_kept[v] : 1, &err))
        EXO_LOG_WARN("runner: cannot shrink slot %d's caches: %s", v, err.msg);
    g->smp = b->smp;
    b->smp = NULL;
    b->g = NULL;
    if (pipelined(r))
        b->parked = g;
    gen_ctx **at = &r->preempted;
    while (*at && (*at)->admitted < g->admitted)
        at = &(*at)->next;
    g->next = *at;
    *at = g;
}

/* Positions slot k's sequence must hold, with RESERVE_AHEAD to come, for
 * its request's next step, where it holds too few now (else 0; 0 for a
 * request whose sample is still out round a pipeline, whose next step is
 * not known yet). */
static int slot_short(runner *r, const batch_slot *slots, int k)
{
    gen_ctx *g = slots[k].g;
    const int32_t *tokens;
    int T;
    bool want;
    if (!g || !exo_gen_seq_next(g->seq, &tokens, &T, &want))
        return 0;
    int len = exo_seq_len(r->bseqs[k]), cap = exo_seq_capacity(r->bseqs[k]);
    return len + T <= cap || cap >= slot_need(r, g) ? 0 : len + T + RESERVE_AHEAD;
}

/* Before a round: each request's sequence holds the positions its next
 * step writes, grown RESERVE_AHEAD at a time up to what it needs, oldest
 * request first. Where memory is short (after the prefix cache and idle
 * slots gave theirs up) the youngest running request is preempted, which
 * may be the one growing; the oldest always goes on, and a request alone
 * always fits (the memory holds a whole context: batch_memory). */
static void slots_grow(runner *r, batch_slot *slots)
{
    for (;;) {
        int i = -1, youngest = -1, running = 0, target = 0;
        for (int k = 0; k < r->n_batch; k++) {
            gen_ctx *g = slots[k].g;
            if (!g)
                continue;
            running++;
            if (youngest < 0 || g->admitted > slots[youngest].g->admitted)
                youngest = k;
            int more = slot_short(r, slots, k);
            if (more && (i < 0 || g->admitted < slots[i].g->admitted)) {
                i = k;
                int need = slot_need(r, g);
                target = more < need ? more : need;
            }
        }
        if (i < 0)
            return;
        double bytes = (double)exo_model_seq_bytes(r->model, target) - (double)exo_seq_bytes(r->bseqs[i]);
        if (!slot_make_room(r, slots, i, NULL, bytes) && running > 1) {
            slot_preempt(r, slots, youngest);
            continue;
        }
        exo_err err = {0};
        int rc = bseq_resize(r, i, exo_seq_len(r->bseqs[i]), target, &err);
        if (rc)
            slot_close(r, &slots[i], rc, &err);
    }
}

/* Slot b's step ran (rc 0: its request moves past it, and its prompt
 * goes into the prefix cache once its prefill is over) or failed (its
 * request ends with the error); true while the request goes on. */
static bool slot_stepped(runner *r, batch_slot *b, int rc, const exo_err *err)
{
    if (rc) {
        slot_close(r, b, rc, err);
        return false;
    }
    b->g->stepped = true;
    exo_gen_seq_stepped(b->g->seq);
    if (!exo_gen_seq_in_prefill(b->g->seq))
        slot_prompt_done(r, b->g->slot, b->g);
    return true;
}

/* One model call of the n slots at[]: their steps (tokens, T) run, and
 * those that want a sample are sampled with their own sampler. A single
 * slot takes the single-sequence step (recorded on a GPU); a greedy or
 * plain temperature request's pick is made where the logits are (a GPU:
 * only its token id comes back), the others' on the model's CPU threads
 * side by side. A failed call ends its requests with the error. */
static void step_slots(runner *r, batch_slot *slots, const int *at, int n, const int32_t *const *tokens,
                       const int *T, const bool *want, float *logits)
{
    exo_batch_item items[BATCH_ROWS];
    exo_pick picks[BATCH_ROWS] = {{0}};
    exo_pick_rule rules[BATCH_ROWS];
    for (int k = 0; k < n; k++) { /* in a group every rank's share of the head joins the logits' gather */
        bool rule = want[at[k]] && !r->dist && exo_sampler_pick_rule(slots[at[k]].smp, &rules[k]);
        items[k] = (exo_batch_item){.seq = r->bseqs[at[k]], .tokens = tokens[at[k]], .T = T[at[k]],
                                    .pick = rule ? &rules[k] : NULL};
    }
    exo_err err = {0};
    int rc = 0;
    bool with_logits = n > 1 || want[at[0]];
    if (r->dist) { /* the other ranks of a tensor-parallel group run the same step */
        int bslot[BATCH_ROWS], pos0[BATCH_ROWS], rows[BATCH_ROWS];
        const int32_t *ids[BATCH_ROWS];
        for (int k = 0; k < n; k++) {
            bslot[k] = at[k];
            pos0[k] = exo_seq_len(items[k].seq);
            rows[k] = items[k].T;
            ids[k] = items[k].tokens;
        }
        rc = exo_dist_send_batch(r->dist, n, bslot, pos0, rows, ids, with_logits, &err);
    }
    if (!rc)
        rc = exo_model_step_batch(r->model, items, n, with_logits ? logits : NULL, picks, &err);
    exo_sampler *smp[BATCH_ROWS]; /* NULL: the row wants no sample */
    exo_sample out[BATCH_ROWS];
    for (int k = 0; k < n; k++)
        smp[k] = slot_stepped(r, &slots[at[k]], rc, &err) && want[at[k]] ? slots[at[k]].smp : NULL;
    exo_sampler_rows(exo_model_host_pool(r->model), smp, picks, logits, out, n);
    for (int k = 0; k < n; k++)
        if (smp[k])
            exo_gen_seq_sampled(slots[at[k]].g->seq, &out[k]);
}

/* ---- a pipeline's steps in flight (rank 0) -------------------------------
 *
 * Rank 0 runs a step through its layers and sends it on
 * (exo_dist_pipe_send) without waiting for its samples: while the ranks
 * after it work on one step, it computes the next. A flight is a sent
 * step's rows that want a sample, whose requests wait (g->waiting) until
 * it lands; rows that want none (a prompt's chunks but its last) step
 * again at once, so a long prompt's chunks follow each other round the
 * ring, every rank on a different one. Decoding requests go as one group
 * (BATCH_ROWS rows a step at most), or from r->pipe_split rows as two
 * groups taking turns, so that every rank has a step to work on while the
 * other group's is elsewhere in the ring; a group landing while both are
 * out waits for the other and joins it, so groups do not multiply as
 * requests come and go. Two groups read each weight twice a round, but
 * where one group's ranks would take turns, idle while the others work,
 * here each works all the time: where weight reads set a step's time a
 * round takes about what one group's step did, and where arithmetic does,
 * about half (bench_dist, 2 CPU ranks: 1.09x at 2 streams, 1.8-1.9x at 16;
 * docs/DISTRIBUTED.md). Frames of one kind or another reach every rank in
 * the order rank 0 sends them, so the sequence operations between steps
 * (resize, prefix keep and take) need no waiting either. */
typedef struct flight {
    int  n;  /* its rows that want a sample, in row order */
    int  at[BATCH_ROWS];
    bool decode; /* decoding rows, not a prompt's last chunk */
} flight;

typedef struct flights {
    flight f[BATCH_MAX]; /* a waiting request is in one flight */
    int    head, count;
} flights;

static void pipe_send(runner *r, batch_slot *slots, flights *fl, const int *at, int n, const int32_t *const *tokens,
                      const int *T, const bool *want, bool decode)
{
    exo_batch_item items[BATCH_ROWS] = {{0}}; /* set to n, which gcc cannot tell is >= 1 */
    bool w[BATCH_ROWS] = {0};
    for (int k = 0; k < n; k++) {
        items[k] = (exo_batch_item){.seq = r->bseqs[at[k]], .tokens = tokens[at[k]], .T = T[at[k]]};
        w[k] = want[at[k]];
    }
    exo_err err = {0};
    int rc = exo_dist_pipe_send(r->dist, n, items, at, w, &err);
    flight *f = &fl->f[(fl->head + fl->count) % BATCH_MAX];
    f->n = 0;
    f->decode = decode;
    for (int k = 0; k < n; k++) {
        batch_slot *b = &slots[at[k]];
        if (!slot_stepped(r, b, rc, &err))
            continue;
        if (w[k]) {
            b->g->waiting = true;
            f->at[f->n++] = at[k];
        }
    }
    if (f->n)
        fl->count++;
}

/* The oldest flight's samples, which come back in the order sent. Where
 * they do not (a link closed or silent), every flight fails at once: the
 * later ones would only wait out the ring's timeout again each. */
static void pipe_land(runner *r, batch_slot *slots, flights *fl)
{
    bool want[BATCH_ROWS];
    exo_sample smp[BATCH_ROWS];
    for (int k = 0; k < BATCH_ROWS; k++)
        want[k] = true;
    exo_err err = {0};
    int rc = 0;
    do {
        flight *f = &fl->f[fl->head];
        fl->head = (fl->head + 1) % BATCH_MAX;
        fl->count--;
        if (!rc)
            rc = exo_dist_pipe_recv(r->dist, f->n, f->at, want, smp, &err);
        for (int k = 0; k < f->n; k++) {
            batch_slot *b = &slots[f->at[k]];
            b->g->waiting = false;
            if (rc)
                slot_close(r, b, rc, &err);
            else
                exo_gen_seq_sampled(b->g->seq, &smp[k]);
        }
    } while (rc && fl->count);
}

/* A pipeline's round: the n_dec decoding requests that are not waiting
 * (decoding[]) and a chunk of prompt `prompt` (or -1) are sent, and then
 * the oldest flight lands; or, where the decoding ones would make one
 * group too many, the oldest flight lands first, for its rows to join
 * them next round. */
static void pipe_round(runner *r, batch_slot *slots, flights *fl, const int *decoding, int n_dec, int prompt,
                       const int32_t *const *tokens, const int *T, const bool *want)
{
    int groups = 0, out = 0;
    for (int k = 0; k < fl->count; k++) {
        const flight *f = &fl->f[(fl->head + k) % BATCH_MAX];
        groups += f->decode;
        out += f->decode ? f->n : 0;
    }
    if (n_dec) {
        int total = n_dec + out;
        int target = (total + BATCH_ROWS - 1) / BATCH_ROWS;
        if (r->pipe_split && total >= r->pipe_split && target < 2)
            target = 2;
        if (groups && groups + 1 > target) {
            pipe_land(r, slots, fl);
            return;
        }
        int sends = target - groups, least = (n_dec + BATCH_ROWS - 1) / BATCH_ROWS;
        sends = sends < least ? least : sends > n_dec ? n_dec : sends;
        for (int s = 0, d0 = 0; s < sends; s++) {
            int n = (n_dec - d0) / (sends - s);
            pipe_send(r, slots, fl, decoding + d0, n, tokens, T, want, true);
            d0 += n;
        }
    }
    if (prompt >= 0)
        pipe_send(r, slots, fl, &prompt, 1, tokens, T, want, false);
    if (fl->count)
        pipe_land(r, slots, fl);
}

/* The rows of a prompt's next call while n_dec requests decode, 0 for the
 * rest of its chunk: what the last prompt call's speed runs in slice_ms. */
static int prompt_slice(const runner *r, int n_dec)
{
    if (!n_dec || !r->exact_rows || !r->slice_ms || r->prompt_rate <= 0 || pipelined(r))
        return 0;
    double rows = r->prompt_rate * r->slice_ms / 1000.0;
    int least = r->exact_rows > SLICE_MIN ? r->exact_rows : SLICE_MIN;
    return rows >= BATCH_PREFILL ? 0 : rows < least ? least : (int)rows;
}

/* Requests generate side by side until none is left: each round admits
 * queued requests into free slots, retires the finished and cancelled
 * ones, runs every decoding request's next token (BATCH_ROWS rows a
 * call) and then one prompt chunk, of the prompt admitted first. */
static void run_batch(runner *r)
{
    batch_slot slots[BATCH_MAX] = {{0}};
    flights fl = {0};
    /* a pipeline's rank 0 has no head: its last rank samples */
    float *logits = pipelined(r) ? NULL : exo_model_logits_alloc(r->model, BATCH_ROWS);
    for (;;) {
        /* the finished and cancelled go first, their caches free for the rest */
        for (int i = 0; i < r->n_batch; i++) {
            batch_slot *b = &slots[i];
            const int32_t *ids;
            int n;
            bool w;
            if (b->g && !b->g->waiting &&
                ((b->g->cancel && !exo_gen_seq_done(b->g->seq)) || !exo_gen_seq_next(b->g->seq, &ids, &n, &w)))
                slot_close(r, b, 0, NULL);
        }
        while ((r->head || r->waiting || r->preempted) && slot_open(r, slots))
            ;
        /* a pipeline's requests grow (or give way) with none of their
         * samples out, so that one preempted is between steps */
        bool short_of_room = false;
        for (int i = 0; i < r->n_batch && pipelined(r) && fl.count && !short_of_room; i++)
            short_of_room = slot_short(r, slots, i) > 0;
        while (short_of_room && fl.count)
            pipe_land(r, slots, &fl);
        slots_grow(r, slots);
        int decoding[BATCH_MAX], n_dec = 0, prompt = -1;
        const int32_t *tokens[BATCH_MAX];
        int T[BATCH_MAX];
        bool want[BATCH_MAX];
        for (int i = 0; i < r->n_batch; i++) {
            batch_slot *b = &slots[i];
            if (!b->g || b->g->waiting) /* none, or its sample is still out round a pipeline */
                continue;
            if ((b->g->cancel && !exo_gen_seq_done(b->g->seq)) ||
                !exo_gen_seq_next(b->g->seq, &tokens[i], &T[i], &want[i])) {
                slot_close(r, b, 0, NULL);
                continue;
            }
            if (!exo_gen_seq_in_prefill(b->g->seq))
                decoding[n_dec++] = i;
            else if (prompt < 0 || r->used[i] < r->used[prompt])
                prompt = i;
        }
        if (prompt >= 0) {
            if (!slots[prompt].g->stepped && !slot_share_late(r, slots, prompt))
                continue;
            exo_gen_seq_slice(slots[prompt].g->seq, prompt_slice(r, n_dec), r->exact_rows);
            if (!exo_gen_seq_next(slots[prompt].g->seq, &tokens[prompt], &T[prompt], &want[prompt])) {
                slot_close(r, &slots[prompt], 0, NULL);
                continue;
            }
        }
        if (!n_dec && prompt < 0 && !fl.count) {
            if (!r->head && !r->waiting && !r->preempted)
                break;
            continue;
        }
        if (pipelined(r)) {
            pipe_round(r, slots, &fl, decoding, n_dec, prompt, tokens, T, want);
        } else {
            for (int d0 = 0; d0 < n_dec; d0 += BATCH_ROWS)
                step_slots(r, slots, decoding + d0, n_dec - d0 < BATCH_ROWS ? n_dec - d0 : BATCH_ROWS, tokens, T,
                           want, logits);
            if (prompt >= 0) {
                double t0 = exo_clock_seconds();
                step_slots(r, slots, &prompt, 1, tokens, T, want, logits);
                double dt = exo_clock_seconds() - t0;
                if (T[prompt] >= SLICE_MIN && dt > 0)
                    r->prompt_rate = T[prompt] / dt;
            }
        }
        drain(r, false);
        if (r->peer_gone)
            cancel_active(r, NULL);
    }
    if (logits)
        exo_model_logits_free(r->model, logits);
}

/* ---- main loop ------------------------------------------------------------ */

/* Waits for the node's socket or, in a ring, for the ring: ranks > 0 serve
 * its frames; every rank watches it for a closed or silent link. */
static void wait_io(runner *r)
{
    int ring_fd = r->ring ? exo_ring_poll_fd(r->ring) : -1;
    if (ring_fd < 0) {
        drain(r, true);
        return;
    }
    struct pollfd p[2] = {{exo_runner_chan_fd(r->ch), POLLIN, 0}, {ring_fd, POLLIN, 0}};
    int n = poll(p, 2, IDLE_POLL_MS);
    if (n > 0 && p[0].revents)
        drain(r, false);
    exo_ring_msg m;
    exo_err err = {0};
    int rc;
    while ((rc = exo_ring_idle(r->ring, &m, &err)) == 1) {
        if (!r->dist || r->load.rank == 0) {
            rc = exo_err_set(&err, EXO_EFORMAT, "ring: frame %u while idle", m.type);
            break;
        }
        if ((rc = exo_dist_serve(r->dist, &m, &err)))
            break;
    }
    if (rc < 0)
        ring_failed(r, err.msg);
}

static job *pop(runner *r)
{
    job *j = r->head;
    r->head = j->next;
    if (!r->head)
        r->tail = NULL;
    j->next = NULL;
    return j;
}

int exo_runner_main(int fd)
{
    signal(SIGPIPE, SIG_IGN);
    runner R = {0};
    runner *r = &R;
    r->ch = exo_runner_chan_new(fd);
    send_status(r, EXO_RUNNER_IDLE, 0, 0, NULL);
    while (!r->peer_gone && !r->shutdown) {
        if (r->load_pending) {
            do_load(r);
            drain(r, false);
            continue;
        }
        if (r->head && (r->state == EXO_RUNNER_READY || r->state == EXO_RUNNER_RUNNING)) {
            if (r->state != EXO_RUNNER_RUNNING)
                send_status(r, EXO_RUNNER_RUNNING, 0, 0, NULL);
            if (r->dist && r->n_slots > 1) { /* a pipeline: its requests in flight at once */
                run_pipeline(r);
            } else if (r->n_batch > 1) {
                run_batch(r);
            } else {
                job *j = pop(r);
                run_job(r, j);
                job_free(j);
            }
            drain(r, false);
            if (!r->head && !r->shutdown && r->state == EXO_RUNNER_RUNNING)
                send_status(r, EXO_RUNNER_READY, 0, 0, NULL);
            continue;
        }
        if (r->head && r->state == EXO_RUNNER_FAILED) {
            job *j = pop(r);
            fail_request(r, j->id, r->fail_msg);
            job_free(j);
            continue;
        }
        wait_io(r);
    }
    if (r->shutdown && !r->peer_gone) {
        send_status(r, EXO_RUNNER_SHUTTING_DOWN, 0, 0, NULL);
        while (r->head) {
            job *j = pop(r);
            fail_request(r, j->id, "the runner shut down before the request started");
            job_free(j);
        }
    }
    while (r->head)
        job_free(pop(r));
    unload(r);
    if (r->shutdown)
        send_status(r, EXO_RUNNER_SHUTDOWN, 0, 0, NULL);
    exo_free(r->fail_msg);
    exo_free(r->load.model_dir);
    exo_runner_chan_free(r->ch);
    return 0;
}
