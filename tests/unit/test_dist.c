/* A model split over ranks (runner/dist.h) gives what one process gives.
 *
 * Each rank runs on its own thread with its own shard of the model, and the
 * ranks talk over real TCP rings on loopback (runner/ring.h), exactly as
 * runner processes do. Rank 0 generates greedily with the top-5 log
 * probabilities through the ring; the same generation on the whole model in
 * one process is the reference.
 *   pipeline: the same kernels on the same numbers, so the ids and log
 *             probabilities must be bit-identical;
 *   tensor:   the partial sums after attention and after the MLP are added
 *             in another order (and quantized activations are scaled per
 *             rank's slice), so log probabilities may differ by at most
 *             2e-4 (f32/bf16 weights) or 2e-2 (affine q4/q8), and the ids must
 *             agree up to the first near-tie (top-1/top-2 margin below twice
 *             the tolerance).
 * Splits: stories260K (5 layers, 4 KV heads) 2, 3 and 4 ways pipeline and 2
 * and 4 ways tensor; the HF fixtures (2 layers, 2 KV heads: llama f32, qwen2
 * bf16 with q/k/v biases, qwen3 q4 with q/k norms and tied embeddings,
 * mistral f32, llama q8) 2 ways each, and llama at every affine width
 * (2-8 bits) and group size (32-128). A prompt longer than the prefill chunk
 * checks the pipelined prefill; several requests in flight through one
 * pipeline (one per slot) each give what they give alone; batched steps on
 * a tensor group (runner continuous batching) give each row the bits it
 * gets alone, at 2 and 3 ranks, and so do batched steps through a pipeline
 * (ROWS frames, sampled on the last rank); a shard loads
 * from its own files of a multi-file checkpoint; the ring itself is
 * checked for its all-reduce, its key, a closed peer and a silent one. */
#include "core/alloc.h"
#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/safetensors.h"
#include "runner/dist.h"
#include "runner/ring.h"
#include "test_tmpdir.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANKS 4
#define N_GEN     16
#define N_PROMPT  40
#define TOP       5

static const char *exo_bin(void)
{
    const char *b = getenv("EXO_BIN");
    return b ? b : "build/exo";
}

typedef struct rank_ctx {
    const char *dir;
    const char *device; /* NULL: as EXO_DEVICE says */
    int         rank, world;
    bool        tensor;
    int         start, end;
    int         listen_fd, next_port;
    uint8_t     key[EXO_RING_KEY_BYTES];
    exo_ring   *ring;
    exo_model  *m;
    exo_seq    *s[MAX_RANKS];
    int         n_slots;
    exo_dist   *d;
    exo_err     err;
    int         rc;
} rank_ctx;

static int join(rank_ctx *c)
{
    exo_ring_config rc = {.rank = c->rank, .world = c->world, .listen_fd = c->listen_fd,
                          .next_host = "127.0.0.1", .next_port = c->next_port, .timeout_ms = 20000};
    memcpy(rc.key, c->key, sizeof rc.key);
    int r = exo_ring_connect(&rc, &c->ring, &c->err);
    if (r)
        return r;
    exo_model_opts o = {.n_threads = 1, .device = c->device};
    if (c->tensor) {
        o.tp_rank = c->rank;
        o.tp_size = c->world;
        o.tp_allreduce = exo_dist_allreduce;
        o.tp_ctx = c->ring;
        o.tp_allgather = exo_dist_allgather;
    } else {
        o.start_layer = c->start;
        o.end_layer = c->end;
    }
    if ((r = exo_model_load(c->dir, &o, &c->m, &c->err)))
        return r;
    c->n_slots = c->n_slots ? c->n_slots : 1;
    for (int i = 0; i < c->n_slots; i++)
        if ((r = exo_seq_create(c->m, 128, &c->s[i], &c->err)))
            return r;
    c->d = exo_dist_new(c->ring, c->tensor, c->m, c->s, c->n_slots);
    return 0;
}

static void leave(rank_ctx *c)
{
    exo_dist_free(c->d);
    for (int i = 0; i < c->n_slots; i++)
        exo_seq_free(c->s[i]);
    exo_model_free(c->m);
    exo_ring_free(c->ring);
}

/* A rank > 0: serves until rank 0 closes the ring. */
static void *follower(void *arg)
{
    rank_ctx *c = arg;
    if ((c->rc = join(c)))
        return NULL;
    for (;;) {
        exo_ring_msg m;
        exo_err err = {0};
        if (exo_ring_recv(c->ring, &m, -1, &err))
            break; /* closed: done */
        if ((c->rc = exo_dist_serve(c->d, &m, &c->err)))
            break;
    }
    leave(c);
    return NULL;
}

typedef struct rec {
    int     n;
    exo_sample s[N_GEN];
} rec;

static int on_token(void *ctx, const exo_sample *s)
{
    rec *r = ctx;
    if (r->n < N_GEN)
        r->s[r->n++] = *s;
    return 0;
}

static void prompt_ids_k(int V, int k, int32_t *ids)
{
    for (int i = 0; i < N_PROMPT; i++)
        ids[i] = (int32_t)((i * (37 + 2 * k) + 11 + k) % V);
    ids[0] = 1;
}

static void prompt_ids(int V, int32_t *ids) { prompt_ids_k(V, 0, ids); }

static exo_gen_params params(void)
{
    exo_gen_params p = {.sampling = exo_sampler_defaults(), .max_tokens = N_GEN, .prefill_chunk = 8};
    p.sampling.temperature = 0;
    p.sampling.top_logprobs = TOP;
    return p;
}

static void reference_k(const char *dir, const char *device, int k, rec *out)
{
    exo_model *m;
    exo_seq *s;
    exo_err err = {0};
    exo_model_opts o = {.n_threads = 1, .device = device};
    cr_assert_eq(exo_model_load(dir, &o, &m, &err), 0, "%s: %s", dir, err.msg);
    cr_assert_eq(exo_seq_create(m, 128, &s, &err), 0);
    int32_t ids[N_PROMPT];
    prompt_ids_k(exo_model_vocab(m), k, ids);
    exo_gen_params p = params();
    exo_gen_stats st;
    memset(out, 0, sizeof *out);
    cr_assert_eq(exo_generate(m, s, ids, N_PROMPT, &p, on_token, out, &st, &err), 0, "%s", err.msg);
    exo_seq_free(s);
    exo_model_free(m);
}

static void reference(const char *dir, const char *device, rec *out) { reference_k(dir, device, 0, out); }

/* A split of dir over `world` ranks on threads of this process, joined by
 * a ring on loopback: ranks > 0 serve (follower), rank 0 (ctx[0]) is
 * joined and left to the caller; pipeline ranks get even layer ranges. */
typedef struct group {
    rank_ctx  ctx[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    int       world;
} group;

static rank_ctx *group_start(group *gr, const char *dir, const char *device, int world, bool tensor, int n_slots)
{
    int ports[MAX_RANKS];
    exo_err err = {0};
    exo_model_config cfg;
    cr_assert_eq(exo_config_load(dir, &cfg, &err), 0, "%s", err.msg);
    const int n_layers = (int)cfg.num_hidden_layers;
    exo_config_free(&cfg);
    memset(gr, 0, sizeof *gr);
    gr->world = world;
    for (int i = 0; i < world; i++)
        cr_assert_eq(exo_ring_listen(0, &gr->ctx[i].listen_fd, &ports[i], &err), 0, "%s", err.msg);
    for (int i = 0; i < world; i++) {
        gr->ctx[i] = (rank_ctx){.dir = dir, .device = device, .rank = i, .world = world, .tensor = tensor,
                                .start = n_layers * i / world, .end = n_layers * (i + 1) / world,
                                .listen_fd = gr->ctx[i].listen_fd, .next_port = ports[(i + 1) % world],
                                .n_slots = n_slots};
        memset(gr->ctx[i].key, 0x5a, sizeof gr->ctx[i].key);
    }
    for (int i = 1; i < world; i++)
        pthread_create(&gr->th[i], NULL, follower, &gr->ctx[i]);
    cr_assert_eq(join(&gr->ctx[0]), 0, "rank 0: %s", gr->ctx[0].err.msg);
    return &gr->ctx[0];
}

/* Rank 0 leaves (closing the ring), the followers finish, without error. */
static void group_end(group *gr)
{
    leave(&gr->ctx[0]);
    for (int i = 1; i < gr->world; i++) {
        pthread_join(gr->th[i], NULL);
        cr_assert_eq(gr->ctx[i].rc, 0, "rank %d: %s", i, gr->ctx[i].err.msg);
    }
}

/* Splits dir `world` ways and generates through the ring: one request
 * (n_req 0) on the stepper, or n_req requests in flight at once, one per
 * slot, with prompts 0..n_req-1. */
static void split_run_n(const char *dir, const char *device, int world, bool tensor, int n_req, rec *out)
{
    group gr;
    rank_ctx *c0 = group_start(&gr, dir, device, world, tensor, n_req > 1 ? n_req : 1);
    exo_err err = {0};
    exo_gen_params p = params();
    int rc;
    if (n_req <= 1) {
        int32_t ids[N_PROMPT];
        prompt_ids(exo_model_vocab(c0->m), ids);
        exo_gen_stats st;
        memset(out, 0, sizeof *out);
        rc = exo_generate_with(exo_dist_stepper(c0->d), ids, N_PROMPT, &p, on_token, out, &st, &err);
    } else {
        int32_t ids[MAX_RANKS][N_PROMPT];
        const int32_t *prompts[MAX_RANKS];
        int lens[MAX_RANKS];
        void *ctxs[MAX_RANKS];
        exo_gen_stats st[MAX_RANKS];
        for (int k = 0; k < n_req; k++) {
            prompt_ids_k(exo_model_vocab(c0->m), k, ids[k]);
            prompts[k] = ids[k];
            lens[k] = N_PROMPT;
            memset(&out[k], 0, sizeof out[k]);
            ctxs[k] = &out[k];
        }
        rc = exo_dist_generate_batch(c0->d, n_req, prompts, lens, &p, on_token, ctxs, st, &err);
    }
    group_end(&gr);
    cr_assert_eq(rc, 0, "%s split %d ways (%s): %s", dir, world, tensor ? "tensor" : "pipeline", err.msg);
}

/* split_run_n (one request, tensor parallel) with every rank a process of
 * its own (this one only waits: a process that has touched the GPU cannot
 * fork ranks that use it), and every rank with a host name of its own for
 * NCCL (NCCL_HOSTID): NCCL takes two ranks of one host on one GPU for a
 * mistake, so ranks on one GPU join as if each were on its own machine,
 * summing over sockets on loopback. Rank 0 sends its samples back through
 * a pipe. A rank whose sums did not run among the GPUs fails, and so does
 * one that replayed no recorded decode step, but rank `eager`, which
 * records none (EXO_CUDA_GRAPH=0): its launches meet the others' replays
 * in every sum. */
enum { RANK_OK, RANK_FAILED, RANK_ON_HOST, RANK_UNRECORDED };

static int run_rank(rank_ctx *c, int out_fd, bool eager)
{
    char host[32];
    snprintf(host, sizeof host, "exo-test-rank-%d", c->rank);
    setenv("NCCL_HOSTID", host, 1);
    if (eager)
        setenv("EXO_CUDA_GRAPH", "0", 1);
    if ((c->rc = join(c))) {
        fprintf(stderr, "rank %d: %s\n", c->rank, c->err.msg);
        return RANK_FAILED;
    }
    int rc = 0;
    if (c->rank == 0) {
        rec out;
        int32_t ids[N_PROMPT];
        prompt_ids(exo_model_vocab(c->m), ids);
        exo_gen_params p = params();
        exo_gen_stats st;
        memset(&out, 0, sizeof out);
        rc = exo_generate_with(exo_dist_stepper(c->d), ids, N_PROMPT, &p, on_token, &out, &st, &c->err);
        if (rc)
            fprintf(stderr, "rank 0: %s\n", c->err.msg);
        else if (write(out_fd, &out, sizeof out) != (ssize_t)sizeof out)
            rc = 1;
    } else {
        for (;;) {
            exo_ring_msg m;
            exo_err e = {0};
            if (exo_ring_recv(c->ring, &m, -1, &e))
                break; /* closed: done */
            if ((rc = exo_dist_serve(c->d, &m, &c->err)))
                break;
        }
    }
    bool on_gpus = exo_model_sums_on_gpus(c->m);
    long replayed = exo_model_replayed_steps(c->m);
    leave(c);
    return rc ? RANK_FAILED : !on_gpus ? RANK_ON_HOST : !eager && replayed < 1 ? RANK_UNRECORDED : RANK_OK;
}

static void split_run_procs(const char *dir, int world, int eager, rec *out)
{
    rank_ctx ctx[MAX_RANKS];
    int ports[MAX_RANKS], pipe_fd[2];
    memset(ctx, 0, sizeof ctx);
    exo_err err = {0};
    for (int i = 0; i < world; i++)
        cr_assert_eq(exo_ring_listen(0, &ctx[i].listen_fd, &ports[i], &err), 0, "%s", err.msg);
    cr_assert_eq(pipe(pipe_fd), 0);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    pid_t pid[MAX_RANKS];
    for (int i = 0; i < world; i++) {
        rank_ctx *c = &ctx[i];
        c->dir = dir;
        c->device = "cuda";
        c->rank = i;
        c->world = world;
        c->tensor = true;
        c->next_port = ports[(i + 1) % world];
        memset(c->key, 0x5a, sizeof c->key);
        fflush(NULL);
        pid[i] = fork();
        cr_assert(pid[i] >= 0, "fork failed");
        if (pid[i] == 0) {
            close(pipe_fd[0]);
            _exit(run_rank(c, pipe_fd[1], i == eager));
        }
    }
    close(pipe_fd[1]);
    for (int i = 0; i < world; i++)
        close(ctx[i].listen_fd);
    memset(out, 0, sizeof *out);
    ssize_t got = read(pipe_fd[0], out, sizeof *out);
    close(pipe_fd[0]);
    for (int i = 0; i < world; i++) {
        int status = 0;
        cr_assert_eq(waitpid(pid[i], &status, 0), pid[i]);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : RANK_FAILED;
        cr_assert(code != RANK_ON_HOST, "%s rank %d: summed on the host, the GPUs' group did not form", dir, i);
        cr_assert(code != RANK_UNRECORDED, "%s rank %d: no decode step was replayed from a recording", dir, i);
        cr_assert(code == RANK_OK, "%s rank %d failed", dir, i);
    }
    cr_assert_eq(got, (ssize_t)sizeof *out, "%s: rank 0 sent no samples", dir);
}

/* Generates through the split and alone, both on `device`, and compares. */
static void compare(const char *dir, int world, bool tensor, float tol, const rec *want_, const rec *got_);

static void check_on(const char *dir, const char *device, int world, bool tensor, float tol)
{
    rec want, got;
    reference(dir, device, &want);
    split_run_n(dir, device, world, tensor, 0, &got);
    compare(dir, world, tensor, tol, &want, &got);
}

static void compare(const char *dir, int world, bool tensor, float tol, const rec *want_, const rec *got_)
{
    const rec want = *want_, got = *got_;
    cr_assert_eq(got.n, want.n, "%s: %d tokens, want %d", dir, got.n, want.n);
    for (int t = 0; t < want.n; t++) {
        const exo_sample *a = &want.s[t], *b = &got.s[t];
        if (tol == 0) {
            cr_assert_eq(b->id, a->id, "%s %s/%d step %d: id %d, want %d", dir,
                         tensor ? "tensor" : "pipeline", world, t, b->id, a->id);
            cr_assert(b->logprob == a->logprob && b->n_top == a->n_top &&
                          !memcmp(b->top_logprobs, a->top_logprobs, sizeof(float) * (size_t)a->n_top) &&
                          !memcmp(b->top_ids, a->top_ids, sizeof(int32_t) * (size_t)a->n_top),
                      "%s pipeline/%d step %d: log probabilities differ", dir, world, t);
            continue;
        }
        for (int k = 0; k < TOP; k++)
            if (b->top_ids[k] == a->top_ids[k])
                cr_assert_leq(fabsf(b->top_logprobs[k] - a->top_logprobs[k]), tol,
                              "%s tensor/%d step %d alt %d: %g vs %g", dir, world, t, k,
                              b->top_logprobs[k], a->top_logprobs[k]);
        if (a->top_logprobs[0] - a->top_logprobs[1] < 2 * tol)
            return; /* a near-tie: the greedy paths may part here */
        cr_assert_eq(b->id, a->id, "%s tensor/%d step %d: id %d, want %d", dir, world, t, b->id, a->id);
    }
}

static void check(const char *dir, int world, bool tensor, float tol) { check_on(dir, NULL, world, tensor, tol); }

static char stories[PATH_MAX + 8];
static char stories_tmp[PATH_MAX];

static void stories_setup(void)
{
    char *tmp = stories_tmp;
    test_tmpdir_make(tmp, "dist_test");
    snprintf(stories, sizeof stories, "%s/s", tmp);
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "'%s' convert-llama2c tests/fixtures/stories260K/stories260K.bin "
             "tests/fixtures/stories260K/tok512.bin '%s' >/dev/null 2>&1", exo_bin(), stories);
    cr_assert_eq(system(cmd), 0, "convert failed: %s", cmd);
}

static void stories_teardown(void) { test_tmpdir_remove(stories_tmp); }

Test(dist, stories_pipeline, .init = stories_setup, .fini = stories_teardown, .timeout = 60)
{
    for (int w = 2; w <= 4; w++)
        check(stories, w, false, 0);
}

/* Several requests in flight through one pipeline, each in its own slot
 * (the ranks work on different ones at once): each gives exactly what it
 * gives alone on one process. */
Test(dist, stories_pipeline_requests_in_flight, .init = stories_setup, .fini = stories_teardown, .timeout = 60)
{
    for (int w = 2; w <= 3; w++) {
        rec got[MAX_RANKS];
        int n = w + 1 <= MAX_RANKS ? w + 1 : MAX_RANKS;
        split_run_n(stories, NULL, w, false, n, got);
        for (int k = 0; k < n; k++) {
            rec want;
            reference_k(stories, NULL, k, &want);
            cr_assert_eq(got[k].n, want.n, "request %d: %d tokens, want %d", k, got[k].n, want.n);
            for (int t = 0; t < want.n; t++) {
                const exo_sample *a = &want.s[t], *b = &got[k].s[t];
                cr_assert_eq(b->id, a->id, "pipeline/%d request %d step %d", w, k, t);
                cr_assert(b->logprob == a->logprob && b->n_top == a->n_top &&
                              !memcmp(b->top_logprobs, a->top_logprobs, sizeof(float) * (size_t)a->n_top) &&
                              !memcmp(b->top_ids, a->top_ids, sizeof(int32_t) * (size_t)a->n_top),
                          "pipeline/%d request %d step %d: log probabilities differ", w, k, t);
            }
        }
    }
}

static int argmax_of(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

/* Rank 0 of a tensor group: one step of batch slot k's sequence alone (a
 * BATCH frame of one row, then the same step here), into logits. */
static void tensor_step_alone(rank_ctx *c0, exo_seq *s, int k, const int32_t *ids, int T, float *logits)
{
    exo_err err = {0};
    int pos0 = exo_seq_len(s);
    cr_assert_eq(exo_dist_send_batch(c0->d, 1, &k, &pos0, &T, &ids, true, &err), 0, "%s", err.msg);
    exo_step st = {.T = T, .tokens = ids, .logits = logits};
    cr_assert_eq(exo_model_step(c0->m, s, &st, &err), 0, "%s", err.msg);
}

/* Continuous batching on a tensor-parallel group (dist.h: seq_resize,
 * seq_copy, send_batch), as the runner drives it: three batch slots with
 * their own prompts decode side by side, and at every step each row is
 * stepped again alone from the same position: the same logits, bit for
 * bit, at 2 and 3 ranks (the all-reduce adds a row's partials in an order
 * set by the column only). A fourth slot takes slot 0's first 32
 * positions by copy on every rank, then the prompt's last 8 tokens: the
 * logits slot 0 gets for the same 8 tokens from position 32; then 64 of
 * slot 0's positions through the prefix cache (keep, take, drop). */
static void tensor_batch_check(const char *dir, int world)
{
    group gr;
    rank_ctx *c0 = group_start(&gr, dir, NULL, world, true, 1);
    exo_err err = {0};
    enum { NB = 3, STEPS = 6 };
    const int V = exo_model_vocab(c0->m);
    float *lb = exo_malloc(sizeof(float) * (size_t)V * NB), *la = exo_malloc(sizeof(float) * (size_t)V);
    float *lc = exo_malloc(sizeof(float) * (size_t)V);
    exo_seq *bs[NB + 1] = {c0->s[0]};
    int32_t ids[NB][N_PROMPT], tok[NB];
    for (int k = 0; k < NB + 1; k++) {
        if (k) /* slot 0 is the stepper's sequence */
            cr_assert_eq(exo_seq_create(c0->m, 128, &bs[k], &err), 0, "%s", err.msg);
        cr_assert_eq(exo_dist_seq_resize(c0->d, k, 0, 128, &err), 0, "%s", err.msg);
    }
    for (int k = 0; k < NB; k++) {
        prompt_ids_k(V, k, ids[k]);
        tensor_step_alone(c0, bs[k], k, ids[k], N_PROMPT, la);
        tok[k] = argmax_of(la, V);
    }
    for (int step = 0; step < STEPS; step++) {
        int slots[NB], pos[NB], T[NB];
        const int32_t *rows[NB];
        exo_batch_item items[NB];
        for (int k = 0; k < NB; k++) {
            slots[k] = k;
            pos[k] = exo_seq_len(bs[k]);
            T[k] = 1;
            rows[k] = &tok[k];
            items[k] = (exo_batch_item){.seq = bs[k], .tokens = &tok[k], .T = 1};
        }
        cr_assert_eq(exo_dist_send_batch(c0->d, NB, slots, pos, T, rows, true, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_model_step_batch(c0->m, items, NB, lb, NULL, &err), 0, "%s", err.msg);
        for (int k = 0; k < NB; k++) {
            exo_seq_truncate(bs[k], pos[k]);
            tensor_step_alone(c0, bs[k], k, &tok[k], 1, la);
            cr_assert(!memcmp(la, lb + (size_t)k * (size_t)V, sizeof(float) * (size_t)V),
                      "%s tensor/%d step %d: slot %d's logits batched differ from alone", dir, world, step, k);
            tok[k] = argmax_of(la, V);
        }
    }
    /* slot 3 from slot 0's first 32 positions, copied on every rank */
    cr_assert_eq(exo_seq_copy_prefix(bs[NB], bs[0], 32, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_dist_seq_copy(c0->d, NB, 0, 32, &err), 0, "%s", err.msg);
    tensor_step_alone(c0, bs[NB], NB, ids[0] + 32, N_PROMPT - 32, lc);
    exo_seq_truncate(bs[0], 32);
    tensor_step_alone(c0, bs[0], 0, ids[0] + 32, N_PROMPT - 32, la);
    cr_assert(!memcmp(la, lc, sizeof(float) * (size_t)V), "%s tensor/%d: a copied prefix gives other logits", dir,
              world);
    /* the prefix cache on every rank: slot 0's first 64 positions kept as
     * entry 5, slot 3 emptied and given them; both go on with the same
     * tokens to the same logits; the entry is given up everywhere */
    int32_t more[24];
    for (int i = 0; i < 24; i++)
        more[i] = (int32_t)((i * 7 + 3) % V);
    tensor_step_alone(c0, bs[0], 0, more, 24, la);
    cr_assert_eq(exo_seq_len(bs[0]), 64);
    exo_kv_prefix *kept = NULL;
    cr_assert_eq(exo_seq_keep_prefix(bs[0], 64, &kept, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_dist_prefix_keep(c0->d, 0, 5, 64, &err), 0, "%s", err.msg);
    exo_seq_truncate(bs[NB], 0);
    cr_assert_eq(exo_dist_seq_resize(c0->d, NB, 0, 128, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_seq_take_prefix(bs[NB], kept, 64, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_dist_prefix_take(c0->d, NB, 5, 64, &err), 0, "%s", err.msg);
    tensor_step_alone(c0, bs[NB], NB, more, 8, lc);
    tensor_step_alone(c0, bs[0], 0, more, 8, la);
    cr_assert(!memcmp(la, lc, sizeof(float) * (size_t)V), "%s tensor/%d: a kept prefix gives other logits", dir,
              world);
    exo_kv_prefix_free(kept);
    cr_assert_eq(exo_dist_prefix_drop(c0->d, 5, &err), 0, "%s", err.msg);
    for (int k = 1; k < NB + 1; k++)
        exo_seq_free(bs[k]);
    exo_free(lb);
    exo_free(la);
    exo_free(lc);
    group_end(&gr);
}

/* Continuous batching on a pipeline (dist.h: seq_resize, begin on a batch
 * slot, pipe_rows), as the runner drives it: NB requests in batch slots,
 * each prompt in chunks of its own, then every decoding request's next
 * token in one batched step through all the ranks (every other step as two
 * halves in flight), sampled on the last rank with the slot's sampler. Each
 * request gets exactly what it gets alone on one process (ids and log
 * probabilities, bit for bit). */
static void pipeline_batch_check(const char *dir, int world)
{
    group gr;
    rank_ctx *c0 = group_start(&gr, dir, NULL, world, false, 1);
    exo_err err = {0};
    enum { NB = 3 };
    const int V = exo_model_vocab(c0->m);
    exo_gen_params p = params();
    exo_seq *bs[NB] = {c0->s[0]};
    int32_t ids[NB][N_PROMPT];
    exo_gen_seq *g[NB];
    rec got[NB];
    memset(got, 0, sizeof got);
    for (int k = 0; k < NB; k++) {
        if (k) /* slot 0 is the stepper's sequence */
            cr_assert_eq(exo_seq_create(c0->m, 128, &bs[k], &err), 0, "%s", err.msg);
        cr_assert_eq(exo_dist_seq_resize(c0->d, k, 0, 128, &err), 0, "%s", err.msg);
        prompt_ids_k(V, k, ids[k]);
        cr_assert_eq(exo_dist_begin(c0->d, k, &p.sampling, ids[k], N_PROMPT, p.max_tokens, &err), 0, "%s",
                     err.msg);
        g[k] = exo_gen_seq_new(ids[k], N_PROMPT, 0, 128, &p, on_token, &got[k]);
    }
    int batched = 0;
    for (bool live = true; live;) {
        live = false;
        exo_batch_item dec[NB];
        int at[NB], n = 0;
        bool want[NB];
        exo_sample smp[NB];
        for (int k = 0; k < NB; k++) {
            const int32_t *tokens;
            int T;
            bool w;
            if (!exo_gen_seq_next(g[k], &tokens, &T, &w))
                continue;
            live = true;
            exo_batch_item it = {.seq = bs[k], .tokens = tokens, .T = T};
            if (exo_gen_seq_in_prefill(g[k])) { /* a prompt chunk goes alone */
                cr_assert_eq(exo_dist_pipe_rows(c0->d, 1, &it, &k, &w, smp, &err), 0, "%s", err.msg);
                exo_gen_seq_stepped(g[k]);
                if (w)
                    exo_gen_seq_sampled(g[k], &smp[0]);
                continue;
            }
            dec[n] = it;
            at[n] = k;
            want[n++] = w;
        }
        if (!n)
            continue;
        if (n > 1 && batched % 2) { /* every other step as two halves in flight (pipe_send twice, then recv) */
            int h = n / 2;
            cr_assert_eq(exo_dist_pipe_send(c0->d, h, dec, at, want, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_dist_pipe_send(c0->d, n - h, dec + h, at + h, want + h, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_dist_pipe_recv(c0->d, h, at, want, smp, &err), 0, "%s", err.msg);
            cr_assert_eq(exo_dist_pipe_recv(c0->d, n - h, at + h, want + h, smp + h, &err), 0, "%s", err.msg);
        } else {
            cr_assert_eq(exo_dist_pipe_rows(c0->d, n, dec, at, want, smp, &err), 0, "%s", err.msg);
        }
        batched += n > 1;
        for (int j = 0; j < n; j++) {
            exo_gen_seq_stepped(g[at[j]]);
            if (want[j])
                exo_gen_seq_sampled(g[at[j]], &smp[j]);
        }
    }
    cr_assert_gt(batched, 0, "no step ran more than one row");
    for (int k = 0; k < NB; k++) {
        exo_gen_seq_free(g[k]);
        if (k)
            exo_seq_free(bs[k]);
    }
    group_end(&gr);
    for (int k = 0; k < NB; k++) {
        rec want;
        reference_k(dir, NULL, k, &want);
        compare(dir, world, false, 0, &want, &got[k]); /* tolerance 0: bit for bit */
    }
}

Test(dist, stories_pipeline_batch, .init = stories_setup, .fini = stories_teardown, .timeout = 60)
{
    pipeline_batch_check(stories, 2);
    pipeline_batch_check(stories, 3);
}

/* Every kind of layer through a batched pipeline: sliding windows and their
 * rings, Gated DeltaNet states, latent attention, experts, sinks. */
Test(dist, fixtures_pipeline_batch, .timeout = 120)
{
    static const char *const dirs[] = {"qwen3-q4g64", "gemma3-bf16", "qwen3_5-bf16", "qwen3_5_moe-q4g64",
                                       "deepseek_v3-q4g64", "gpt_oss-mxfp4", "qwen3_moe-q4g64"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char d[256];
        snprintf(d, sizeof d, "tests/fixtures/%s", dirs[i]);
        pipeline_batch_check(d, 2);
    }
}

Test(dist, stories_tensor_batch, .init = stories_setup, .fini = stories_teardown, .timeout = 60)
{
    tensor_batch_check(stories, 2);
    tensor_batch_check(stories, 3);
}

Test(dist, stories_tensor, .init = stories_setup, .fini = stories_teardown, .timeout = 60)
{
    check(stories, 2, true, 2e-4f);
    check(stories, 4, true, 2e-4f);
}

Test(dist, fixtures_pipeline, .timeout = 60)
{
    static const char *const dirs[] = {"llama-f32", "qwen2-bf16", "qwen3-q4g64", "mistral-f32", "llama-q8g32",
                                       "qwen3_moe-bf16", "qwen3_moe-q4g64", "qwen3_next-bf16", "qwen3_5_moe-q4g64",
                                       "qwen3_5-bf16", "gemma3-bf16", "gpt_oss-mxfp4", "gpt_oss-mlx-mxfp4q8",
                                       "glm4_moe-q8g64", "deepseek_v3-bf16", "deepseek_v3-q4g64"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char d[256];
        snprintf(d, sizeof d, "tests/fixtures/%s", dirs[i]);
        check(d, 2, false, 0);
    }
}

/* Every affine width and group size of the fixtures, split both ways
 * (tensor parallel needs its split on a group edge: with 128-column groups
 * a 2-way split of o_proj's 128 inputs cannot be, and loading says so). */
Test(dist, every_quantization, .timeout = 120)
{
    static const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    for (size_t i = 0; i < sizeof bits / sizeof *bits; i++)
        for (size_t k = 0; k < sizeof groups / sizeof *groups; k++) {
            char d[256];
            snprintf(d, sizeof d, "tests/fixtures/llama-q%dg%d", bits[i], groups[k]);
            check(d, 2, false, 0);
            if (groups[k] < 128) {
                check(d, 2, true, 2e-2f);
                continue;
            }
            exo_model *m = NULL;
            exo_err err = {0};
            exo_model_opts o = {.n_threads = 1, .tp_rank = 0, .tp_size = 2,
                                .tp_allreduce = exo_dist_allreduce, .tp_allgather = exo_dist_allgather};
            cr_assert_eq(exo_model_load(d, &o, &m, &err), EXO_EUNSUPPORTED, "%s", d);
            cr_assert(strstr(err.msg, "group edge"), "%s", err.msg);
        }
}

Test(dist, fixtures_tensor, .timeout = 60)
{
    static const struct { const char *dir; float tol; } cases[] = {
        {"llama-f32", 2e-4f}, {"qwen2-bf16", 2e-4f}, {"qwen3-q4g64", 2e-2f}, {"mistral-f32", 2e-4f},
        {"llama-q8g32", 2e-2f}, {"qwen3_moe-f32", 2e-4f},
        /* its routers' wide logits amplify the split's reordered sums: 8e-4 seen */
        {"qwen3_moe-bf16", 2e-3f},
        /* each rank holds its share of the linear-attention heads, the latent
         * attention's heads, the experts' and shared experts' columns, the
         * sinks; the routers' close choices take the reordered sums as above */
        {"qwen3_next-f32", 2e-3f}, {"qwen3_5_moe-f32", 2e-3f}, {"qwen3_5-f32", 2e-3f}, {"gemma3-f32", 2e-4f},
        {"gpt_oss-f32", 2e-3f}, {"gpt_oss-mxfp4", 2e-2f}, {"glm4_moe-f32", 2e-3f}, {"deepseek_v3-f32", 2e-3f}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char d[256];
        snprintf(d, sizeof d, "tests/fixtures/%s", cases[i].dir);
        check(d, 2, true, cases[i].tol);
    }
}

/* Tensor parallel on the GPU: each rank's share of every layer on the
 * device, its partial sums copied to the host for the ring and back, the
 * LM head's rows gathered on the host. The ranks share the one GPU a test
 * machine has; the reference is the whole model on that GPU. Tolerances as
 * on the CPU (the split reorders the same sums). */
Test(dist, tensor_on_the_gpu, .fini = stories_teardown, .timeout = 240)
{
    if (exo_backend_cuda_devices() <= 0)
        cr_skip_test("needs a GPU"); /* before the scratch model: a skipped test's .fini does not run */
    /* ranks on threads of one process share one GPU: no NCCL group (see
     * tensor_on_gpus_through_nccl); their sums go through the host */
    setenv("EXO_TP_SUMS", "host", 1);
    stories_setup();
    check_on(stories, "cuda", 2, true, 2e-4f);
    check_on(stories, "cuda", 4, true, 2e-4f);
    static const struct { const char *dir; float tol; } cases[] = {
        {"llama-bf16", 2e-4f}, {"llama-q8g64", 2e-2f}, {"qwen3-q4g64", 2e-2f}, {"gemma3-q4g64", 2e-2f},
        {"qwen3_5-q4g64", 2e-2f}, {"qwen3_moe-bf16", 2e-3f}, {"gpt_oss-mxfp4", 2e-2f},
        {"deepseek_v3-bf16", 2e-3f}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char d[256];
        snprintf(d, sizeof d, "tests/fixtures/%s", cases[i].dir);
        check_on(d, "cuda", 2, true, cases[i].tol);
        check_on(d, "cuda", 2, false, 0);
    }
}

/* Whether this machine has a GPU, asked in a child process: a process
 * that has touched the GPU cannot fork ranks that use it. */
static bool gpu_in_child(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(exo_backend_cuda_devices() > 0 ? 0 : 1);
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Tensor parallel with the ranks' sums among their GPUs (NCCL): two
 * processes, as two machines would be (split_run_procs), against the
 * whole model on the GPU. Both ranks replay recorded decode steps, sums
 * and all; then again with rank 1 launching every op (its sums meet rank
 * 0's recorded ones), which must give the same bits. */
Test(dist, tensor_on_gpus_through_nccl, .timeout = 300)
{
    if (!gpu_in_child())
        cr_skip_test("needs a GPU");
    static const struct { const char *dir; float tol; } cases[] = {{"tests/fixtures/llama-bf16", 2e-4f},
                                                                   {"tests/fixtures/qwen3-q4g64", 2e-2f}};
    enum { N = sizeof cases / sizeof *cases };
    rec got[N], mixed[N], want;
    for (size_t i = 0; i < N; i++) { /* every split first: forks must come before this process uses the GPU */
        split_run_procs(cases[i].dir, 2, -1, &got[i]);
        split_run_procs(cases[i].dir, 2, 1, &mixed[i]);
    }
    for (size_t i = 0; i < N; i++) {
        reference(cases[i].dir, "cuda", &want);
        compare(cases[i].dir, 2, true, cases[i].tol, &want, &got[i]);
        compare(cases[i].dir, 2, true, 0, &got[i], &mixed[i]);
    }
}

/* ---- the ring ------------------------------------------------------------------- */

typedef struct ring_peer {
    int      rank, world, listen_fd, next_port, timeout_ms;
    uint8_t  key[EXO_RING_KEY_BYTES];
    exo_ring *ring;
    int      rc;
    exo_err  err;
    float    x[1000];
} ring_peer;

static void *peer_connect(void *arg)
{
    ring_peer *p = arg;
    exo_ring_config c = {.rank = p->rank, .world = p->world, .listen_fd = p->listen_fd,
                         .next_host = "127.0.0.1", .next_port = p->next_port,
                         .timeout_ms = p->timeout_ms};
    memcpy(c.key, p->key, sizeof c.key);
    p->rc = exo_ring_connect(&c, &p->ring, &p->err);
    return NULL;
}

static void *peer_reduce(void *arg)
{
    ring_peer *p = arg;
    p->rc = exo_ring_allreduce(p->ring, p->x, 1, 1000, &p->err);
    return NULL;
}

static void make_ring(ring_peer *p, int world, int timeout_ms)
{
    int ports[MAX_RANKS];
    exo_err err = {0};
    for (int i = 0; i < world; i++) {
        memset(&p[i], 0, sizeof p[i]);
        cr_assert_eq(exo_ring_listen(0, &p[i].listen_fd, &ports[i], &err), 0, "%s", err.msg);
    }
    pthread_t th[MAX_RANKS];
    for (int i = 0; i < world; i++) {
        p[i].rank = i;
        p[i].world = world;
        p[i].next_port = ports[(i + 1) % world];
        p[i].timeout_ms = timeout_ms;
        memset(p[i].key, 7, sizeof p[i].key);
        pthread_create(&th[i], NULL, peer_connect, &p[i]);
    }
    for (int i = 0; i < world; i++)
        pthread_join(th[i], NULL);
}

Test(ring, allreduce_sums_the_same_bits_everywhere, .timeout = 30)
{
    for (int world = 2; world <= 4; world++) {
        ring_peer p[MAX_RANKS];
        make_ring(p, world, 5000);
        for (int i = 0; i < world; i++) {
            cr_assert_eq(p[i].rc, 0, "rank %d: %s", i, p[i].err.msg);
            for (int k = 0; k < 1000; k++)
                p[i].x[k] = (float)(k % 17) * 0.25f + (float)i * 1.5f;
        }
        pthread_t th[MAX_RANKS];
        for (int i = 0; i < world; i++)
            pthread_create(&th[i], NULL, peer_reduce, &p[i]);
        for (int i = 0; i < world; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < world; i++) {
            cr_assert_eq(p[i].rc, 0, "%s", p[i].err.msg);
            for (int k = 0; k < 1000; k++) {
                float want = 0;
                for (int j = 0; j < world; j++)
                    want += (float)(k % 17) * 0.25f + (float)j * 1.5f;
                cr_assert_float_eq(p[i].x[k], want, 1e-4, "world %d rank %d [%d]", world, i, k);
                cr_assert_eq(memcmp(&p[i].x[k], &p[0].x[k], 4), 0, "ranks differ");
            }
        }
        for (int i = 0; i < world; i++)
            exo_ring_free(p[i].ring);
    }
}

Test(ring, a_peer_without_the_key_is_refused, .timeout = 30)
{
    int ports[2];
    ring_peer p[2];
    exo_err err = {0};
    for (int i = 0; i < 2; i++) {
        memset(&p[i], 0, sizeof p[i]);
        cr_assert_eq(exo_ring_listen(0, &p[i].listen_fd, &ports[i], &err), 0);
        p[i].rank = i;
        p[i].world = 2;
        p[i].next_port = ports[1 - i];
        p[i].timeout_ms = 1500;
        memset(p[i].key, i ? 2 : 1, sizeof p[i].key); /* different keys */
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, peer_connect, &p[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_neq(p[i].rc, 0, "rank %d joined a ring with the wrong key", i);
        cr_assert(p[i].rc == EXO_EPERM || p[i].rc == EXO_ETIMEDOUT || p[i].rc == EXO_EIO, "%d %s",
                  p[i].rc, p[i].err.msg);
    }
}

Test(ring, a_closed_peer_fails_the_receive_at_once, .timeout = 30)
{
    ring_peer p[2];
    make_ring(p, 2, 10000);
    cr_assert_eq(p[0].rc, 0, "%s", p[0].err.msg);
    cr_assert_eq(p[1].rc, 0, "%s", p[1].err.msg);
    exo_ring_free(p[1].ring);
    exo_ring_msg m;
    exo_err err = {0};
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    cr_assert_eq(exo_ring_recv(p[0].ring, &m, -1, &err), EXO_EIO, "%s", err.msg);
    cr_assert_lt((double)clock() / CLOCKS_PER_SEC - t0, 1.0);
    exo_ring_free(p[0].ring);
}

Test(ring, pings_keep_a_quiet_link_alive, .timeout = 30)
{
    ring_peer p[2];
    make_ring(p, 2, 600);
    cr_assert_eq(p[0].rc, 0, "%s", p[0].err.msg);
    /* nobody sends anything for 3 timeouts: the pings keep it alive */
    exo_ring_msg m;
    exo_err err = {0};
    for (int i = 0; i < 18; i++) {
        usleep(100 * 1000);
        cr_assert_eq(exo_ring_idle(p[0].ring, &m, &err), 0, "%s", err.msg);
    }
    /* a frame after the quiet time arrives whole */
    float v[3] = {1, 2, 3};
    cr_assert_eq(exo_ring_send(p[1].ring, 42, 1, 2, v, sizeof v, NULL, 0, &err), 0);
    cr_assert_eq(exo_ring_recv(p[0].ring, &m, -1, &err), 0, "%s", err.msg);
    cr_assert_eq(m.type, 42);
    cr_assert_eq(m.len, sizeof v);
    cr_assert_eq(memcmp(m.payload, v, sizeof v), 0);
    exo_ring_free(p[0].ring);
    exo_ring_free(p[1].ring);
}

/* A next rank that accepts and then says nothing (a frozen process, a link
 * that went down): connecting fails with a timeout, it does not hang. */
Test(ring, a_silent_peer_times_out, .timeout = 30)
{
    int silent_fd, silent_port, my_fd, my_port;
    exo_err err = {0};
    cr_assert_eq(exo_ring_listen(0, &silent_fd, &silent_port, &err), 0);
    cr_assert_eq(exo_ring_listen(0, &my_fd, &my_port, &err), 0);
    exo_ring_config c = {.rank = 0, .world = 2, .listen_fd = my_fd, .next_host = "127.0.0.1",
                         .next_port = silent_port, .timeout_ms = 800};
    exo_ring *r = NULL;
    cr_assert_eq(exo_ring_connect(&c, &r, &err), EXO_ETIMEDOUT, "%s", err.msg);
    cr_assert_null(r);
    close(silent_fd);
}

/* ---- a shard's files -------------------------------------------------------------- */

/* llama-f32 rewritten as two files with an index: layer 0 and the embedding
 * in one, layer 1, the norm and the head in the other. The second shard
 * loads with the first file gone (a node has only its shard's files); the
 * whole model then cannot. */
static char shard_tmp[PATH_MAX];
static void shard_teardown(void) { test_tmpdir_remove(shard_tmp); }

Test(dist, a_shard_needs_only_its_files, .fini = shard_teardown)
{
    char *tmp = shard_tmp, a[PATH_MAX + 64], b[PATH_MAX + 64], idx[PATH_MAX + 64], cfg[PATH_MAX + 64];
    test_tmpdir_make(tmp, "shard_files");
    exo_st *st;
    exo_err err = {0};
    cr_assert_eq(exo_st_open("tests/fixtures/llama-f32", &st, &err), 0, "%s", err.msg);
    exo_st_writer *wa = exo_st_writer_new(), *wb = exo_st_writer_new();
    json_t *map = json_object();
    for (size_t i = 0; i < exo_st_count(st); i++) {
        const exo_st_tensor *t = exo_st_at(st, i);
        bool first = strstr(t->name, "layers.0.") || strstr(t->name, "embed_tokens");
        cr_assert_eq(exo_st_writer_add(first ? wa : wb, t->name, t->dtype, t->ndim, t->shape, t->data,
                                       t->nbytes, &err), 0, "%s", err.msg);
        json_object_set_new(map, t->name, json_string(first ? "model-1.safetensors" : "model-2.safetensors"));
    }
    snprintf(a, sizeof a, "%s/model-1.safetensors", tmp);
    snprintf(b, sizeof b, "%s/model-2.safetensors", tmp);
    cr_assert_eq(exo_st_writer_write(wa, a, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_st_writer_write(wb, b, &err), 0, "%s", err.msg);
    exo_st_writer_free(wa);
    exo_st_writer_free(wb);
    exo_st_close(st);
    json_t *index = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", tmp);
    cr_assert_eq(json_dump_file(index, idx, 0), 0);
    json_decref(index);
    snprintf(cfg, sizeof cfg, "cp tests/fixtures/llama-f32/config.json '%s/'", tmp);
    cr_assert_eq(system(cfg), 0);

    cr_assert_eq(unlink(a), 0);
    exo_model *m = NULL;
    exo_model_opts o = {.n_threads = 1, .start_layer = 1, .end_layer = 2};
    cr_assert_eq(exo_model_load(tmp, &o, &m, &err), 0, "the last shard: %s", err.msg);
    exo_shard_info sh = exo_model_shard(m);
    cr_assert(sh.has_head && !sh.embeds && sh.start_layer == 1 && sh.end_layer == 2);
    exo_model_free(m);
    exo_model_opts whole = {.n_threads = 1};
    cr_assert_eq(exo_model_load(tmp, &whole, &m, &err), EXO_ENOENT, "the whole model loaded without its first file");
}
