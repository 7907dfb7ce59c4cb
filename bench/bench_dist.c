/* A model split over runner processes against one process, in the same run.
 *
 *   build/bench_dist [--synthetic PRESET] [--quant q4|q8|bf16] [--gen-tokens N]
 *                    [--prompt-tokens N] [--ranks N]
 *
 * Writes the synthetic model (real shapes, random weights; default
 * llama-3.2-1b q4) to a temporary directory, then measures greedy decode:
 *   one    one process, one thread, pinned to core 0 (the peer);
 *   tensor N processes (one thread each, rank i pinned to core i) joined by
 *          the TCP ring on loopback (runner/ring.h), tensor parallel;
 *   tensor, batched: the same group with 4 and 16 streams decoding side by
 *          side as the runner batches them (each step's rows one BATCH frame,
 *          every rank running them together: the weights read once a step);
 *   pipeline  the same, each holding a layer range; one request, then
 *          2 x N requests at once (rank 0 keeps one in flight per slot)
 *          against one process serving them one after another;
 *   pipeline, batched: 2, 4, 8 and 16 streams decoding side by side as the
 *          runner batches them (each step's rows one ROWS frame through
 *          every rank, sampled on the last: each rank reads its weights
 *          once a step for all of them); then as two groups taking turns,
 *          as the runner sends them from EXO_PIPE_SPLIT rows (rank 0 runs
 *          one group's step while the other ranks run the other's).
 * With --device cuda (a GPU build), only tensor parallel on the GPUs: one
 * process on GPU 0 against N rank processes, rank i on GPU i, their
 * partial sums NCCL all-reduces, each decode step replayed from a
 * recording and then launched op by op (EXO_CUDA_GRAPH=0) in the same run
 * (issue 15's goal: 2 GPUs >= 1.7x one). It needs a GPU per rank: ranks
 * sharing one time-slice it (two ranks of one H100, MPS or not, did not
 * finish 64 tokens of llama-3.2-1b in 30 s: milliseconds an all-reduce,
 * each rank waiting for the other's turn), which says nothing of the
 * split, so there it times only the one GPU.
 * Decode is bound by the bandwidth one core can pull, so N processes on N
 * cores can go up to N times one (tensor) or stay at one (pipeline, one
 * request: the ranks take turns). Prints tokens/s and the ratio to `one`.
 * Then the ring itself: the all-reduce round trip of 4-64 KB vectors (the
 * sizes a layer sends) between two processes on loopback, next to the
 * time to copy the same bytes in memory. */
#include "cluster/placement.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/synthetic.h"
#include "runner/dist.h"
#include "runner/ring.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANKS 8

static int n_prompt = 16, n_gen = 64;
static const char *device; /* --device cuda: the GPU section only */
static int n_gpus;         /* GPUs the rank processes see (>= the ranks when they run) */
static bool eager_steps;   /* the GPU ranks launch every op (no recorded steps) */
static double split_info[3]; /* rank 0 of the last run_split: tokens/s, sums among GPUs, steps replayed */
static int failed_runs;      /* split runs that measured nothing (a rank failed: said above): exit 1 */
static int32_t split_starts[MAX_RANKS + 1]; /* the pipeline's layer ranges, as placement splits them */

static void pin(int core)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
    sched_setaffinity(0, sizeof s, &s);
}

static exo_gen_params params(void)
{
    exo_gen_params p = {.sampling = exo_sampler_defaults(), .max_tokens = n_gen};
    p.sampling.temperature = 0;
    return p;
}

static void prompt(int V, int32_t *ids)
{
    for (int i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)((i * 7919 + 3) % V);
}

static double decode_tps(const exo_gen_stats *st)
{
    return st->generated_tokens > 1 && st->decode_seconds > 0
               ? (st->generated_tokens - 1) / st->decode_seconds : 0;
}

/* One process on one core: returns the decode tokens/s of one request;
 * *wall_tps: tokens/s of n_req requests served one after another
 * (prefill included, wall clock). */
static double run_one(const char *dir, int n_req, double *wall_tps)
{
    pin(0);
    exo_model *m;
    exo_seq *s;
    exo_err err = {0};
    exo_model_opts o = {.n_threads = 1};
    if (exo_model_load(dir, &o, &m, &err) || exo_seq_create(m, 1024, &s, &err)) {
        fprintf(stderr, "bench_dist: %s\n", err.msg);
        exit(1);
    }
    int32_t ids[256];
    prompt(exo_model_vocab(m), ids);
    exo_gen_params p = params();
    exo_gen_stats st;
    exo_generate(m, s, ids, n_prompt, &p, NULL, NULL, &st, &err); /* warm */
    double decode = 0, t0 = exo_clock_seconds();
    int total = 0;
    for (int k = 0; k < n_req; k++) {
        exo_seq_truncate(s, 0);
        exo_generate(m, s, ids, n_prompt, &p, NULL, NULL, &st, &err);
        total += st.generated_tokens;
        if (!k)
            decode = decode_tps(&st);
    }
    *wall_tps = total / (exo_clock_seconds() - t0);
    exo_seq_free(s);
    exo_model_free(m);
    return decode;
}

static int argmax_of(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

/* Rank 0 of a tensor group: n_req greedy streams decoding side by side as
 * the runner batches them (dist.h BATCH frames, every rank running the
 * batched steps): decode tokens/s of all of them together. */
static double tensor_batched(exo_model *m, exo_dist *d, int n_req)
{
    exo_err err = {0};
    const int V = exo_model_vocab(m);
    exo_seq *s[EXO_DIST_BATCH_ROWS];
    int32_t ids[256], tok[EXO_DIST_BATCH_ROWS];
    int slots[EXO_DIST_BATCH_ROWS], pos0[EXO_DIST_BATCH_ROWS], T[EXO_DIST_BATCH_ROWS];
    const int32_t *rows[EXO_DIST_BATCH_ROWS];
    exo_batch_item items[EXO_DIST_BATCH_ROWS];
    float *logits = exo_malloc(sizeof(float) * (size_t)V * (size_t)n_req);
    prompt(V, ids);
    double t0 = 0;
    int rc = 0;
    for (int k = 0; k < n_req && !rc; k++) {
        int zero = 0;
        const int32_t *p = ids;
        slots[k] = k + 1; /* slot 0 is the stepper's */
        rc = exo_seq_create(m, 1024, &s[k], &err) || exo_dist_seq_resize(d, slots[k], 0, 1024, &err) ||
             exo_dist_send_batch(d, 1, &slots[k], &zero, &n_prompt, &p, true, &err);
        exo_step st = {.T = n_prompt, .tokens = ids, .logits = logits};
        rc = rc || exo_model_step(m, s[k], &st, &err);
        tok[k] = (argmax_of(logits, V) + k) % V; /* the streams part from here */
    }
    for (int step = 0; step < n_gen && !rc; step++) {
        if (step == 1)
            t0 = exo_clock_seconds(); /* after one step: the first builds its scratch */
        for (int k = 0; k < n_req; k++) {
            pos0[k] = exo_seq_len(s[k]);
            T[k] = 1;
            rows[k] = &tok[k];
            items[k] = (exo_batch_item){.seq = s[k], .tokens = &tok[k], .T = 1};
        }
        rc = exo_dist_send_batch(d, n_req, slots, pos0, T, rows, true, &err) ||
             exo_model_step_batch(m, items, n_req, logits, NULL, &err);
        for (int k = 0; k < n_req; k++)
            tok[k] = argmax_of(logits + (size_t)k * (size_t)V, V);
    }
    if (rc)
        fprintf(stderr, "bench_dist: %s\n", err.msg);
    double tps = n_req * (n_gen - 1) / (exo_clock_seconds() - t0);
    for (int k = 0; k < n_req; k++)
        exo_seq_free(s[k]);
    exo_free(logits);
    return rc ? 0 : tps;
}

static bool pipe_halves; /* pipeline_batched: two groups taking turns (runner.c pipe_round) */

/* Rank 0 of a pipeline: n_req greedy streams decoding side by side as the
 * runner batches them (dist.h ROWS frames; the last rank samples each with
 * its batch slot's sampler): decode tokens/s of all of them together. */
static double pipeline_batched(exo_model *m, exo_dist *d, int n_req)
{
    exo_err err = {0};
    exo_seq *s[EXO_DIST_BATCH_ROWS] = {0};
    int32_t ids[256], tok[EXO_DIST_BATCH_ROWS];
    int slots[EXO_DIST_BATCH_ROWS];
    bool want[EXO_DIST_BATCH_ROWS];
    exo_batch_item items[EXO_DIST_BATCH_ROWS];
    exo_sample smp[EXO_DIST_BATCH_ROWS];
    exo_gen_params p = params();
    prompt(exo_model_vocab(m), ids);
    double t0 = 0;
    int rc = 0;
    for (int k = 0; k < n_req && !rc; k++) {
        slots[k] = k + 1; /* slot 0 is the stepper's */
        want[k] = true;
        items[k] = (exo_batch_item){.seq = NULL, .tokens = ids, .T = n_prompt};
        rc = exo_seq_create(m, 1024, &s[k], &err) || exo_dist_seq_resize(d, slots[k], 0, 1024, &err) ||
             exo_dist_begin(d, slots[k], &p.sampling, ids, n_prompt, n_gen + 1, &err);
        items[k].seq = s[k];
        rc = rc || exo_dist_pipe_rows(d, 1, &items[k], &slots[k], &want[k], &smp[k], &err);
        tok[k] = smp[k].id;
    }
    /* two groups take turns, as the runner's pipe_round keeps them: a
     * group is sent again as soon as its samples are back, so rank 0
     * computes one while the ranks after it work on the other */
    int groups = pipe_halves && n_req > 1 ? 2 : 1, h = groups == 2 ? n_req / 2 : n_req;
    int first[2] = {0, h}, size[2] = {h, n_req - h};
    for (int step = 0; step < n_gen && !rc; step++) {
        if (step == 1)
            t0 = exo_clock_seconds(); /* after one step: the first builds its scratch */
        for (int g = 0; g < groups && !rc; g++) {
            int a = first[g], n = size[g];
            if (step > 0 && groups == 2) /* its previous step lands (the other group's is out) */
                rc = exo_dist_pipe_recv(d, n, slots + a, want + a, smp + a, &err);
            for (int k = a; k < a + n; k++) {
                tok[k] = smp[k].id;
                items[k] = (exo_batch_item){.seq = s[k], .tokens = &tok[k], .T = 1};
            }
            rc = rc || exo_dist_pipe_send(d, n, items + a, slots + a, want + a, &err);
            if (groups == 1)
                rc = rc || exo_dist_pipe_recv(d, n, slots + a, want + a, smp + a, &err);
        }
    }
    for (int g = 0; g < groups && groups == 2 && !rc; g++) /* the last steps land */
        rc = exo_dist_pipe_recv(d, size[g], slots + first[g], want + first[g], smp + first[g], &err);
    if (rc)
        fprintf(stderr, "bench_dist: %s\n", err.msg);
    double tps = n_req * (n_gen - 1) / (exo_clock_seconds() - t0);
    for (int k = 0; k < n_req; k++)
        exo_seq_free(s[k]);
    return rc ? 0 : tps;
}

static bool pipe_batched; /* run_split of a pipeline: n_req streams batched, not in flight */

/* One rank of a split run, in its own process; rank 0 writes tokens/s to *out. */
static void rank_main(const char *dir, int rank, int world, bool tensor, int n_req, int listen_fd,
                      int next_port, double *out)
{
    pin(rank);
    exo_err err = {0};
    exo_ring_config rc = {.rank = rank, .world = world, .listen_fd = listen_fd, .next_host = "127.0.0.1",
                          .next_port = next_port, .timeout_ms = 60000};
    memset(rc.key, 1, sizeof rc.key);
    exo_ring *ring;
    if (exo_ring_connect(&rc, &ring, &err)) {
        fprintf(stderr, "bench_dist: rank %d: %s\n", rank, err.msg);
        _exit(1);
    }
    exo_model_config cfg;
    exo_config_load(dir, &cfg, &err);
    int L = (int)cfg.num_hidden_layers;
    exo_config_free(&cfg);
    exo_model_opts o = {.n_threads = 1};
    char dev[32];
    if (device) {
        snprintf(dev, sizeof dev, "cuda:%d", rank);
        o.device = dev;
        if (eager_steps)
            setenv("EXO_CUDA_GRAPH", "0", 1);
    }
    if (tensor) {
        o.tp_rank = rank;
        o.tp_size = world;
        o.tp_allreduce = exo_dist_allreduce;
        o.tp_ctx = ring;
        o.tp_allgather = exo_dist_allgather;
    } else {
        o.start_layer = split_starts[rank];
        o.end_layer = rank + 1 < world ? split_starts[rank + 1] : L;
    }
    exo_model *m;
    exo_seq *seqs[EXO_DIST_MAX_SLOTS] = {0};
    int n_slots = n_req > 1 && !tensor && !pipe_batched ? n_req : 1;
    if (exo_model_load(dir, &o, &m, &err)) {
        fprintf(stderr, "bench_dist: rank %d: %s\n", rank, err.msg);
        _exit(1);
    }
    for (int i = 0; i < n_slots; i++)
        if (exo_seq_create(m, 1024, &seqs[i], &err))
            _exit(1);
    exo_seq *s = seqs[0];
    exo_dist *d = exo_dist_new(ring, tensor, m, seqs, n_slots);
    if (rank == 0 && n_req > 1 && tensor) {
        *out = tensor_batched(m, d, n_req);
    } else if (rank == 0 && n_req > 1 && pipe_batched) {
        *out = pipeline_batched(m, d, n_req);
    } else if (rank == 0 && n_req > 1) {
        int32_t ids[256];
        prompt(exo_model_vocab(m), ids);
        const int32_t *prompts[EXO_DIST_MAX_SLOTS];
        int lens[EXO_DIST_MAX_SLOTS];
        void *ctxs[EXO_DIST_MAX_SLOTS] = {0};
        exo_gen_stats st[EXO_DIST_MAX_SLOTS];
        for (int k = 0; k < n_req; k++) {
            prompts[k] = ids;
            lens[k] = n_prompt;
        }
        exo_gen_params p = params();
        exo_dist_generate_batch(d, n_req, prompts, lens, &p, NULL, ctxs, st, &err); /* warm */
        double t0 = exo_clock_seconds();
        int brc = exo_dist_generate_batch(d, n_req, prompts, lens, &p, NULL, ctxs, st, &err);
        int total = 0;
        for (int k = 0; k < n_req; k++)
            total += st[k].generated_tokens;
        if (brc)
            fprintf(stderr, "bench_dist: %s\n", err.msg);
        *out = total / (exo_clock_seconds() - t0);
    } else if (rank == 0) {
        int32_t ids[256];
        prompt(exo_model_vocab(m), ids);
        exo_gen_params p = params();
        exo_gen_stats st;
        int r1 = exo_generate_with(exo_dist_stepper(d), ids, n_prompt, &p, NULL, NULL, &st, &err);
        exo_seq_truncate(s, 0);
        int r2 = exo_generate_with(exo_dist_stepper(d), ids, n_prompt, &p, NULL, NULL, &st, &err);
        if (r1 || r2)
            fprintf(stderr, "bench_dist: %s\n", err.msg);
        *out = decode_tps(&st);
        out[1] = exo_model_sums_on_gpus(m);
        out[2] = (double)exo_model_replayed_steps(m);
    } else {
        for (;;) {
            exo_ring_msg msg;
            if (exo_ring_recv(ring, &msg, -1, &err) || exo_dist_serve(d, &msg, &err))
                break;
        }
    }
    exo_dist_free(d);
    exo_ring_free(ring);
    for (int i = 0; i < n_slots; i++)
        exo_seq_free(seqs[i]);
    exo_model_free(m);
    _exit(0);
}

static double run_split(const char *dir, int world, bool tensor, int n_req)
{
    int fds[MAX_RANKS], ports[MAX_RANKS];
    exo_err err = {0};
    for (int i = 0; i < world; i++)
        if (exo_ring_listen(0, &fds[i], &ports[i], &err)) {
            fprintf(stderr, "bench_dist: %s\n", err.msg);
            exit(1);
        }
    double *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    out[0] = out[1] = out[2] = 0;
    pid_t pids[MAX_RANKS];
    for (int i = 0; i < world; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            for (int k = 0; k < world; k++)
                if (k != i)
                    close(fds[k]);
            rank_main(dir, i, world, tensor, n_req, fds[i], ports[(i + 1) % world], out);
        }
    }
    for (int i = 0; i < world; i++)
        close(fds[i]);
    for (int i = 0; i < world; i++)
        waitpid(pids[i], NULL, 0);
    double r = *out;
    failed_runs += !(r > 0);
    memcpy(split_info, out, sizeof split_info);
    munmap(out, 4096);
    return r;
}

/* ---- the ring alone ------------------------------------------------------------ */

static void ring_peer(int rank, int fd, int next_port, size_t bytes, int iters, double *out)
{
    pin(rank);
    exo_err err = {0};
    exo_ring_config rc = {.rank = rank, .world = 2, .listen_fd = fd, .next_host = "127.0.0.1",
                          .next_port = next_port, .timeout_ms = 20000};
    memset(rc.key, 2, sizeof rc.key);
    exo_ring *ring;
    if (exo_ring_connect(&rc, &ring, &err))
        _exit(1);
    size_t n = bytes / 4;
    float *x = exo_calloc(n, 4);
    for (int i = 0; i < 50; i++)
        exo_ring_allreduce(ring, x, 1, n, &err);
    double t0 = exo_clock_seconds();
    for (int i = 0; i < iters; i++)
        exo_ring_allreduce(ring, x, 1, n, &err);
    if (rank == 0)
        out[0] = (exo_clock_seconds() - t0) / iters;
    /* ping-pong: half a round trip is one message's latency (what
     * ucx_perftest -t tag_lat reports) */
    t0 = exo_clock_seconds();
    for (int i = 0; i < iters; i++) {
        exo_ring_msg m;
        if (rank == 0) {
            exo_ring_send(ring, 9, 0, 0, x, bytes, NULL, 0, &err);
            exo_ring_recv(ring, &m, -1, &err);
        } else {
            exo_ring_recv(ring, &m, -1, &err);
            exo_ring_send(ring, 9, 0, 0, m.payload, m.len, NULL, 0, &err);
        }
    }
    if (rank == 0)
        out[1] = (exo_clock_seconds() - t0) / iters / 2;
    exo_free(x);
    exo_ring_free(ring);
    _exit(0);
}

static double allreduce_us(size_t bytes, double *oneway_us)
{
    int fds[2], ports[2];
    exo_err err = {0};
    for (int i = 0; i < 2; i++)
        exo_ring_listen(0, &fds[i], &ports[i], &err);
    double *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[2];
    for (int i = 0; i < 2; i++)
        if ((pids[i] = fork()) == 0) {
            close(fds[1 - i]);
            ring_peer(i, fds[i], ports[1 - i], bytes, 2000, out);
        }
    close(fds[0]);
    close(fds[1]);
    waitpid(pids[0], NULL, 0);
    waitpid(pids[1], NULL, 0);
    double r = out[0] * 1e6;
    *oneway_us = out[1] * 1e6;
    munmap(out, 4096);
    return r;
}

/* ---- tensor parallel on the GPUs ------------------------------------------------ */

/* Runs fn(arg, out) in a child process (this one never touches the GPU: a
 * process that has cannot fork ranks that use it); returns out[0..2]. */
static void in_child(void (*fn)(const char *, double *), const char *arg, double res[3])
{
    double *out = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    out[0] = out[1] = out[2] = -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn(arg, out);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    memcpy(res, out, 3 * sizeof *res);
    munmap(out, 4096);
}

static void count_gpus(const char *unused, double *out)
{
    (void)unused;
    out[0] = exo_backend_cuda_devices();
}

/* The whole model on GPU 0: decode tokens/s of a greedy request (its
 * second, after one that warms up and records). */
static void one_gpu(const char *dir, double *out)
{
    exo_model *m;
    exo_seq *s;
    exo_err err = {0};
    exo_model_opts o = {.n_threads = 1, .device = "cuda:0"};
    if (exo_model_load(dir, &o, &m, &err) || exo_seq_create(m, 1024, &s, &err)) {
        fprintf(stderr, "bench_dist: %s\n", err.msg);
        return;
    }
    int32_t ids[256];
    prompt(exo_model_vocab(m), ids);
    exo_gen_params p = params();
    exo_gen_stats st;
    exo_generate(m, s, ids, n_prompt, &p, NULL, NULL, &st, &err);
    exo_seq_truncate(s, 0);
    if (exo_generate(m, s, ids, n_prompt, &p, NULL, NULL, &st, &err))
        fprintf(stderr, "bench_dist: %s\n", err.msg);
    else
        out[0] = decode_tps(&st);
    exo_seq_free(s);
    exo_model_free(m);
}

static int gpu_section(const char *dir, int world)
{
    double r[3];
    in_child(count_gpus, NULL, r);
    n_gpus = (int)r[0];
    if (n_gpus < 1) {
        printf("  --device cuda: no GPU here (or no CUDA plugin): nothing to measure\n");
        return 0;
    }
    in_child(one_gpu, dir, r);
    double one = r[0];
    printf("  one process on GPU 0:        %8.2f tok/s\n", one);
    if (n_gpus < world) {
        printf("  tensor, %d ranks: not timed, this machine has %d GPU%s (ranks sharing one time-slice it)\n", world,
               n_gpus, n_gpus == 1 ? "" : "s");
        return 0;
    }
    const char *names[2] = {"steps replayed from recordings", "every op launched (EXO_CUDA_GRAPH=0)"};
    for (int eager = 0; eager < 2; eager++) {
        eager_steps = eager;
        double tp = run_split(dir, world, true, 1);
        if (tp <= 0) {
            printf("  tensor, %d GPUs, %s: failed (above)\n", world, names[eager]);
            continue;
        }
        printf("  tensor, %d GPUs, %s: %8.2f tok/s = %.2fx one (goal >= 1.7x at 2; sums %s, %.0f steps replayed on "
               "rank 0)\n", world, names[eager], tp, one > 0 ? tp / one : 0,
               split_info[1] > 0 ? "among the GPUs (NCCL)" : "through the host", split_info[2]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *preset = "llama-3.2-1b", *quant = "q4";
    int world = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--synthetic"))
            preset = argv[i + 1];
        else if (!strcmp(argv[i], "--quant"))
            quant = argv[i + 1];
        else if (!strcmp(argv[i], "--gen-tokens"))
            n_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt-tokens"))
            n_prompt = atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 256 ? atoi(argv[i + 1]) : 16;
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--ranks"))
            world = atoi(argv[i + 1]) >= 2 && atoi(argv[i + 1]) <= MAX_RANKS ? atoi(argv[i + 1]) : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each figure as it comes, also into a file */
    if (device && strncmp(device, "cuda", 4)) {
        fprintf(stderr, "bench_dist: --device takes cuda (the CPU is the default)\n");
        return 2;
    }
    if (!device)
        printf("ring all-reduce, 2 processes on loopback (the sizes a layer sends):\n");
    for (size_t kb = 4; kb <= 64 && !device; kb *= 2) {
        size_t bytes = kb * 1024;
        char *a = exo_malloc(bytes), *b = exo_malloc(bytes);
        memset(a, 1, bytes);
        double t0 = exo_clock_seconds();
        for (int i = 0; i < 10000; i++) {
            memcpy(b, a, bytes);
            __asm__ volatile("" ::: "memory");
        }
        double copy_us = (exo_clock_seconds() - t0) / 10000 * 1e6;
        exo_free(a);
        exo_free(b);
        double oneway;
        double us = allreduce_us(bytes, &oneway);
        printf("  %3zu KB: all-reduce %6.1f us (%.2f GB/s of payload), one message %5.1f us, "
               "memcpy of the same %5.2f us\n", kb, us, bytes / us / 1e3, oneway, copy_us);
    }
    exo_synth_quant q;
    exo_err err = {0};
    exo_synth *syn;
    if (exo_synth_quant_parse(quant, &q) || exo_synth_create(preset, q, 1, &syn, &err)) {
        fprintf(stderr, "bench_dist: %s %s: %s\n", preset, quant, err.msg);
        return 2;
    }
    char dir[] = "/tmp/exo-bench-dist-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    size_t bytes = 0;
    double t0 = exo_clock_seconds();
    if (exo_synth_write(syn, dir, &bytes, &err)) {
        fprintf(stderr, "bench_dist: %s\n", err.msg);
        return 1;
    }
    /* the pipeline's layers as placement would split them over equal nodes */
    const exo_model_config *cfg = exo_synth_config(syn);
    exo_model_card card = {.n_layers = (int32_t)cfg->num_hidden_layers,
                           .hidden_size = (int32_t)cfg->hidden_size,
                           .vocab_size = (int32_t)cfg->vocab_size, .storage_bytes = bytes};
    snprintf(card.quantization, sizeof card.quantization, "%s",
             q == EXO_SYNTH_Q4 ? "4bit" : q == EXO_SYNTH_Q8 ? "8bit" : "bf16");
    uint64_t weights[MAX_RANKS];
    for (int i = 0; i < world; i++)
        weights[i] = 1;
    exo_placement_pipeline_split(&card, weights, world, split_starts, &err);
    exo_synth_free(syn);
    printf("%s %s: %.0f MB of weights written in %.1f s; greedy decode of %d tokens after %d:\n", preset,
           quant, bytes / 1e6, exo_clock_seconds() - t0, n_gen, n_prompt);
    if (device) {
        gpu_section(dir, world);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        return system(cmd) || failed_runs ? 1 : 0;
    }
    int n_req = 2 * world <= EXO_DIST_MAX_SLOTS ? 2 * world : EXO_DIST_MAX_SLOTS;
    double one_n;
    double one = run_one(dir, n_req, &one_n);
    printf("  one process, 1 core:      %6.2f tok/s\n", one);
    double tp = run_split(dir, world, true, 1);
    printf("  tensor,   %d processes:    %6.2f tok/s  = %.2fx one (goal >= %.1fx)\n", world, tp, tp / one,
           0.9 * world);
    for (int streams = 4; streams <= EXO_DIST_BATCH_ROWS; streams *= 4) {
        double tb = run_split(dir, world, true, streams);
        printf("  tensor,   %d processes, %d streams batched: %6.2f tok/s together = %.2fx tensor's one stream\n",
               world, streams, tb, tb / tp);
    }
    double pp = run_split(dir, world, false, 1);
    printf("  pipeline, %d processes:    %6.2f tok/s  = %.2fx one (goal >= 0.95x); layers from", world, pp,
           pp / one);
    for (int i = 0; i < world; i++)
        printf(" %d", split_starts[i]);
    printf(" (the last rank also reads the head)\n");
    double pp_n = run_split(dir, world, false, n_req);
    printf("%d requests (prefill included, wall clock):\n", n_req);
    printf("  one process, one after another: %6.2f tok/s\n", one_n);
    printf("  pipeline, %d processes, all in flight: %6.2f tok/s = %.2fx (goal >= 1.8x)\n", world, pp_n,
           pp_n / one_n);
    pipe_batched = true;
    for (int streams = 2; streams <= EXO_DIST_BATCH_ROWS; streams *= 2) {
        pipe_halves = false;
        double pb = run_split(dir, world, false, streams);
        printf("  pipeline, %d processes, %d streams batched: %6.2f tok/s together = %.2fx pipeline's one stream, "
               "%.2fx %d in flight\n", world, streams, pb, pb / pp, pb / pp_n, n_req);
        pipe_halves = true;
        double ph = run_split(dir, world, false, streams);
        printf("  pipeline, %d processes, %d streams batched as two groups taking turns: %6.2f tok/s = "
               "%.2fx one batch\n", world, streams, ph, ph / pb);
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd))
        fprintf(stderr, "bench_dist: could not remove %s\n", dir);
    if (failed_runs)
        fprintf(stderr, "bench_dist: %d split run%s measured nothing\n", failed_runs, failed_runs == 1 ? "" : "s");
    return failed_runs ? 1 : 0;
}
