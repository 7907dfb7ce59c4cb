/* `exo bench MODEL_DIR | --synthetic PRESET [--quant bf16|q8|q4|mxfp4] [--layers N]
 *  [--threads N] [--device D] [--gpu-layers N] [--prompt-tokens N] [--gen-tokens N]
 *  [--streams N,N,...] [--json]`
 *
 * A benchmark, not a test: it prints speed next to the physical limit it
 * is bounded by, both measured in this run.
 *   decode  is memory bound: every token streams all weights once, so it is
 *           reported as bytes per token, achieved GB/s and the fraction of
 *           the machine's read bandwidth (measured here with the same
 *           threads, best pass before or after decode), both for the mean
 *           over all tokens and for the median token (on a shared host a
 *           few tokens slowed by other guests move the mean, not the
 *           median), and for tokens paired each with a read right after
 *           it (a guest's bandwidth drifts with its host's load); on a GPU
 *           the limit is its device-to-device copy
 *           (bytes read + written), measured here too, and the llama.cpp
 *           figures of the same shapes on an H200 are printed beside;
 *   prefill is compute bound: reported as tokens/s and GFLOP/s next to a
 *           plain AVX2 f32 GEMM of the same shape (the peer that matrix
 *           units must beat);
 *   streams N sequences decoding side by side, each step one batch
 *           (exo_model_step_batch): aggregate tokens/s against one stream
 *           measured the same way in this run (the weights are read once a
 *           step however many streams there are). */
#include "cli/args.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/dotpeak.h"
#include "engine/cpu/membw.h"
#include "engine/backend.h"
#include "engine/cpu/ops.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/synthetic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int exo_cmd_bench(int argc, char **argv);

static void usage(void)
{
    fprintf(stderr, "usage: exo bench MODEL_DIR | --synthetic PRESET [--quant bf16|q8|q4|mxfp4]\n"
                    "  [--layers N] [--threads N] [--device auto|cpu|cuda|cuda:N] [--gpu-layers N]\n"
                    "  [--prompt-tokens N] [--gen-tokens N] [--streams N,N,...] [--json]\n"
                    "presets:");
    for (const char *const *p = exo_synth_presets(); *p; p++)
        fprintf(stderr, " %s", *p);
    fprintf(stderr, "\n");
}

/* llama.cpp's batch-1 decode on an H200 (llama-bench -ngl 99 -n 128,
 * Q4_0 / Q8_0 / F16), as issue 15 records it: the peer a GPU run is read
 * against. 0: not measured for that shape. */
static double llama_cpp_h200(const char *preset, const char *quant)
{
    static const struct {
        const char *preset, *quant;
        double tok_s;
    } figures[] = {
        {"llama-3.2-1b", "q4", 974}, {"llama-3.1-8b", "q4", 329}, {"llama-3.1-8b", "q8", 253},
        {"llama-3.1-8b", "bf16", 207},
    };
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++)
        if (!strcmp(figures[i].preset, preset) && !strcmp(figures[i].quant, quant))
            return figures[i].tok_s;
    return 0;
}

#define MAX_STREAM_RUNS 8
#define MAX_STREAM_STEPS 32
/* Each stream's own prompt before it decodes: short enough that the
 * positions of the untimed step and the timed ones stay in each sequence's
 * first KV page. A page first taken inside the timed steps is memory first
 * touched there, which on a VM guest the host backs at that moment: 16
 * streams of qwen3-0.6b q4 crossing into their second page in the last of
 * 32 steps measured 222 tok/s together, 31 steps 479; a server's steady
 * state reuses its pool's pages and pays no such touch. */
#define STREAM_PROMPT (EXO_KV_PAGE - 1 - MAX_STREAM_STEPS)
_Static_assert(STREAM_PROMPT >= 16, "stream prompts of at least 16 tokens");

enum { PAIRS = 16 };       /* decode tokens paired with reads (see exo_cmd_bench) */
enum { HOST_LOGITS = 32 }; /* GPU decode tokens with every logit to the host */

/* One greedy decode token as the runner serves it: the step asks for the
 * largest logit, which a GPU finds in place and hands over with only its
 * id (backend.h pick); elsewhere the logits come back and the host picks.
 * *tok is the token in and the next token out; *in_place is set when the
 * id came alone. */
static int greedy_token(exo_model *m, exo_seq *seq, int32_t *tok, float *logits, int64_t V, bool *in_place,
                        exo_err *err)
{
    static const exo_pick_rule greedy = {0};
    exo_step st = {.T = 1, .tokens = tok, .logits = logits, .pick = &greedy};
    int rc = exo_model_step(m, seq, &st, err);
    if (!rc)
        *tok = st.token.picked ? st.token.id : exo_cpu_argmax_f32(logits, V);
    *in_place = !rc && st.token.picked;
    return rc;
}

/* How a streams run picks its tokens: greedy; sampled, drawn where the
 * logits are when the model can (the server's path) or every row on the
 * host by its own sampler, the rows side by side on the model's CPU
 * threads. Sampled by SAMPLINGS: the OpenAI APIs' default, and Ollama's
 * (filters and a repetition penalty over the prompt's last tokens). */
typedef enum { STREAM_GREEDY, STREAM_DRAWN, STREAM_HOST } stream_picks;
typedef struct sampling {
    const char *name, *json;
    float temperature, top_p, repetition_penalty;
    int top_k, window;
} sampling;
static const sampling SAMPLINGS[] = {
    {"temperature 1", "sampled", 1.0f, 1.0f, 1.0f, 0, 0},
    {"Ollama's: temperature 0.8, top-k 40, top-p 0.9, repeat penalty 1.1/64", "ollama",
     0.8f, 0.9f, 1.1f, 40, 64},
};
#define N_SAMPLINGS ((int)(sizeof SAMPLINGS / sizeof *SAMPLINGS))

/* Aggregate decode tokens/s of n sequences stepping together for `steps`
 * batched steps (after one untimed step), each from its own prompt;
 * *in_place: some rows were picked where the logits are. */
static int streams_tok_s(exo_model *m, int n, int steps, stream_picks how, const sampling *how_sampled,
                         double *tok_s, bool *in_place, exo_err *err)
{
    int V = exo_model_vocab(m), rc = 0;
    exo_seq **seqs = exo_calloc((size_t)n, sizeof *seqs);
    exo_batch_item *items = exo_calloc((size_t)n, sizeof *items);
    int32_t *next = exo_calloc((size_t)n, sizeof *next), prompt[STREAM_PROMPT];
    float *logits = exo_model_logits_alloc(m, n); /* as the runner's: a GPU copies into it directly */
    for (int i = 0; i < n && !rc; i++) {
        for (int t = 0; t < STREAM_PROMPT; t++)
            prompt[t] = (int32_t)(((uint64_t)t * 7919u + (uint64_t)i * 104729u + 17u) % (uint64_t)V);
        rc = exo_seq_create(m, STREAM_PROMPT + steps + 8, &seqs[i], err);
        if (!rc)
            rc = exo_model_forward(m, seqs[i], prompt, STREAM_PROMPT, logits, false, err);
        next[i] = exo_cpu_argmax_f32(logits, V);
        items[i] = (exo_batch_item){.seq = seqs[i], .tokens = &next[i], .T = 1};
    }
    exo_pick *pick = exo_calloc((size_t)n, sizeof *pick);
    exo_pick_rule *rules = exo_calloc((size_t)n, sizeof *rules);
    exo_sampler **smp = exo_calloc((size_t)n, sizeof *smp);
    exo_sample *out = exo_calloc((size_t)n, sizeof *out);
    for (int i = 0; i < n && how != STREAM_GREEDY; i++) {
        exo_sampler_params sp = exo_sampler_defaults();
        sp.temperature = how_sampled->temperature;
        sp.top_k = how_sampled->top_k;
        sp.top_p = how_sampled->top_p;
        sp.repetition_penalty = how_sampled->repetition_penalty;
        sp.repetition_context_size = how_sampled->window;
        sp.seed = (uint64_t)i;
        smp[i] = exo_sampler_create(&sp, V);
        for (int t = 0; t < STREAM_PROMPT; t++) /* the prompt again: the penalties' window */
            prompt[t] = (int32_t)(((uint64_t)t * 7919u + (uint64_t)i * 104729u + 17u) % (uint64_t)V);
        rc = rc ? rc : exo_sampler_begin(smp[i], prompt, STREAM_PROMPT, steps + 1);
    }
    double t0 = 0;
    *in_place = false;
    for (int s = 0; s <= steps && !rc; s++) {
        if (s == 1) /* the first step warms the batch's buffers up */
            t0 = exo_clock_seconds();
        for (int i = 0; i < n; i++)
            items[i].pick = how == STREAM_GREEDY || (how == STREAM_DRAWN && exo_sampler_pick_rule(smp[i], &rules[i]))
                                ? &rules[i]
                                : NULL;
        rc = exo_model_step_batch(m, items, n, logits, pick, err);
        if (!rc && how != STREAM_GREEDY)
            exo_sampler_rows(exo_model_host_pool(m), smp, pick, logits, out, n);
        for (int i = 0; i < n && !rc; i++) {
            *in_place |= pick[i].picked;
            next[i] = how != STREAM_GREEDY ? out[i].id
                      : pick[i].picked     ? pick[i].id
                                           : exo_cpu_argmax_f32(logits + (size_t)i * (size_t)V, V);
        }
    }
    for (int i = 0; i < n; i++)
        exo_sampler_free(smp[i]);
    exo_free(smp);
    exo_free(rules);
    exo_free(out);
    exo_free(pick);
    *tok_s = rc ? 0 : (double)n * steps / (exo_clock_seconds() - t0);
    for (int i = 0; i < n; i++)
        exo_seq_free(seqs[i]);
    exo_free(seqs);
    exo_free(items);
    exo_free(next);
    exo_model_logits_free(m, logits);
    return rc;
}

/* "1,4,16" into up to MAX_STREAM_RUNS counts, one first (the peer). */
static int parse_streams(const char *v, long *out, int *n)
{
    *n = 0;
    out[(*n)++] = 1;
    for (const char *p = v; *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > 4096 || (*end && *end != ','))
            return -1;
        if (k != 1) {
            if (*n == MAX_STREAM_RUNS)
                return -1;
            out[(*n)++] = k;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GFLOP/s of the AVX2 peer on an (M x K) x (K x N) f32 product. */
static double avx2_gemm_gflops(exo_pool *pool, int M, int N, int K)
{
    float *A = exo_alloc_aligned(sizeof(float) * (size_t)M * K);
    float *B = exo_alloc_aligned(sizeof(float) * (size_t)N * K);
    float *C = exo_alloc_aligned(sizeof(float) * (size_t)M * N);
    if (!A || !B || !C) {
        exo_free_aligned(A);
        exo_free_aligned(B);
        exo_free_aligned(C);
        return 0;
    }
    for (size_t i = 0; i < (size_t)M * K; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * K; i++)
        B[i] = (float)(i % 5) * 0.1f;
    exo_gemm_f32_avx2(M, N, K, A, B, C, pool); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < 2; r++) {
        double t0 = exo_clock_seconds();
        exo_gemm_f32_avx2(M, N, K, A, B, C, pool);
        double dt = exo_clock_seconds() - t0;
        if (dt < best)
            best = dt;
    }
    exo_free_aligned(A);
    exo_free_aligned(B);
    exo_free_aligned(C);
    return 2.0 * M * N * K / best / 1e9;
}

int exo_cmd_bench(int argc, char **argv)
{
    const char *dir = NULL, *preset = NULL, *quant = "q4", *v;
    /* 128 generated tokens as llama-bench: long enough that one stall of
     * the host (membw.h) moves the mean by ~1%, not 2-4% */
    long threads = 0, n_prompt = 512, n_gen = 128, n_layers = 0, gpu_layers = 0;
    const char *device = NULL;
    bool json = false;
    long streams[MAX_STREAM_RUNS];
    int n_streams = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--synthetic")) {
            if (!(preset = exo_arg_value("bench", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--quant")) {
            if (!(quant = exo_arg_value("bench", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--layers")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)) ||
                exo_arg_int("bench", "--layers", v, 1, 1024, &n_layers))
                return 2;
        } else if (!strcmp(argv[i], "--threads")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)) ||
                exo_arg_int("bench", "--threads", v, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(device = exo_arg_value("bench", argc, argv, &i)))
                return 2;
        } else if (!strcmp(argv[i], "--gpu-layers")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)) ||
                exo_arg_int("bench", "--gpu-layers", v, -1, 1 << 20, &gpu_layers))
                return 2;
        } else if (!strcmp(argv[i], "--prompt-tokens")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)) ||
                exo_arg_int("bench", "--prompt-tokens", v, 1, 1 << 20, &n_prompt))
                return 2;
        } else if (!strcmp(argv[i], "--gen-tokens")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)) ||
                exo_arg_int("bench", "--gen-tokens", v, 1, 1 << 20, &n_gen))
                return 2;
        } else if (!strcmp(argv[i], "--streams")) {
            if (!(v = exo_arg_value("bench", argc, argv, &i)))
                return 2;
            if (parse_streams(v, streams, &n_streams)) {
                fprintf(stderr, "exo bench: --streams takes up to %d counts from 1 to 4096, as 1,4,16\n",
                        MAX_STREAM_RUNS - 1);
                return 2;
            }
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "exo bench: unexpected argument '%s'\n", argv[i]);
            usage();
            return 2;
        } else {
            dir = argv[i];
        }
    }
    if (!!dir == !!preset) {
        usage();
        return 2;
    }
    if (dir && n_layers) {
        fprintf(stderr, "exo bench: --layers is for --synthetic presets\n");
        return 2;
    }
    exo_synth_quant sq;
    if (exo_synth_quant_parse(quant, &sq)) {
        fprintf(stderr, "exo bench: --quant must be bf16, q8 or q4\n");
        return 2;
    }

    exo_err err = {0};
    exo_synth *syn = NULL;
    exo_model *m = NULL;
    exo_seq *seq = NULL;
    float *logits = NULL;
    int32_t *tokens = NULL;
    double *token_s = NULL;
    int status = 1;
    long max_streams = 1;
    for (int i = 0; i < n_streams; i++)
        max_streams = streams[i] > max_streams ? streams[i] : max_streams;
    /* a batch of streams is one step's rows: the chunk must hold them */
    exo_model_opts opts = {.n_threads = (int)threads,
                           .max_chunk = (int)(n_prompt > max_streams ? n_prompt : max_streams),
                           .device = device, .gpu_layers = (int)gpu_layers};
    double t_load = exo_clock_seconds();
    if (preset) {
        if (exo_synth_create(preset, sq, 1234, &syn, &err) ||
            (n_layers && exo_synth_set_layers(syn, (int)n_layers, &err)) || exo_synth_build(syn, &opts, &m, &err))
            goto fail;
    } else if (exo_model_load(dir, &opts, &m, &err)) {
        goto fail;
    }
    t_load = exo_clock_seconds() - t_load;
    int V = exo_model_vocab(m);
    const exo_model_config *cfg = exo_model_get_config(m);
    if (exo_seq_create(m, (int)(n_prompt + n_gen + 8 + PAIRS + HOST_LOGITS), &seq, &err))
        goto fail;
    logits = exo_malloc(sizeof(float) * (size_t)V);
    tokens = exo_malloc(sizeof(int32_t) * (size_t)n_prompt);
    uint64_t r = 88172645463325252ull;
    for (long i = 0; i < n_prompt; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        tokens[i] = (int32_t)(r % (uint64_t)V);
    }

    /* Memory bandwidth with the same number of threads decode uses. The
     * probe's buffer lives until the end: freed before decode, it would be
     * reclaimed by the hypervisor while decode is timed (membw.h). */
    exo_pool *pool = exo_pool_create((int)threads);
    int nthreads = exo_pool_size(pool);
    exo_membw *probe = exo_membw_create((size_t)1 << 30);
    if (!probe) {
        exo_err_set(&err, EXO_ENOMEM, "no memory for the 1 GiB bandwidth probe");
        goto fail_pool;
    }
    double read_bw = exo_membw_read(probe, pool, 5);

    /* Prefill: one warm-up pass (page faults, kernel set-up), then timed. */
    if (exo_model_forward(m, seq, tokens, (int)n_prompt, logits, false, &err))
        goto fail_pool;
    exo_seq_truncate(seq, 0);
    double t0 = exo_clock_seconds();
    if (exo_model_forward(m, seq, tokens, (int)n_prompt, logits, false, &err))
        goto fail_pool;
    double prefill_s = exo_clock_seconds() - t0;

    /* Decode: greedy, one token at a time, after two warm-up steps. */
    int32_t tok = exo_cpu_argmax_f32(logits, V);
    bool in_place = false;
    for (int i = 0; i < 2; i++)
        if (greedy_token(m, seq, &tok, logits, V, &in_place, &err))
            goto fail_pool;
    token_s = exo_malloc(sizeof(double) * (size_t)n_gen);
    t0 = exo_clock_seconds();
    for (long i = 0; i < n_gen; i++) {
        double ts = exo_clock_seconds();
        if (greedy_token(m, seq, &tok, logits, V, &in_place, &err))
            goto fail_pool;
        token_s[i] = exo_clock_seconds() - ts;
    }
    double decode_s = exo_clock_seconds() - t0;
    /* Where the greedy step left the logits on the GPU, a sampler would
     * need all of them on the host: that path's tokens too. */
    long n_host = in_place ? (n_gen < HOST_LOGITS ? n_gen : HOST_LOGITS) : 0;
    double host_logits_s = 0;
    for (long i = 0; i < n_host; i++) {
        double ts = exo_clock_seconds();
        if (exo_model_forward(m, seq, &tok, 1, logits, false, &err))
            goto fail_pool;
        tok = exo_cpu_argmax_f32(logits, V);
        host_logits_s += exo_clock_seconds() - ts;
    }
    /* Mixture of experts: the fused decode against the per-expert one, a
     * token of each in turn over the same positions (drift in what else
     * runs on the machine hits both alike); medians. */
    double fused_ms = 0, unfused_ms = 0;
    if (cfg->n_experts > 0 && n_gen >= 4) {
        /* from the prompt again (a linear-attention state cannot step back) */
        exo_seq_truncate(seq, 0);
        if (exo_model_forward(m, seq, tokens, (int)n_prompt, logits, false, &err))
            goto fail_pool;
        tok = exo_cpu_argmax_f32(logits, V);
        long half = n_gen / 2;
        double *tf = exo_malloc(sizeof(double) * (size_t)half), *tu = exo_malloc(sizeof(double) * (size_t)half);
        for (long i = 0; i < 2 * half; i++) {
            exo_model_set_moe_fused(m, i % 2 == 0);
            double ts = exo_clock_seconds();
            if (greedy_token(m, seq, &tok, logits, V, &in_place, &err)) {
                exo_free(tf);
                exo_free(tu);
                goto fail_pool;
            }
            (i % 2 ? tu : tf)[i / 2] = exo_clock_seconds() - ts;
        }
        exo_model_set_moe_fused(m, true);
        qsort(tf, (size_t)half, sizeof(double), cmp_double);
        qsort(tu, (size_t)half, sizeof(double), cmp_double);
        fused_ms = tf[half / 2] * 1e3;
        unfused_ms = tu[half / 2] * 1e3;
        exo_free(tf);
        exo_free(tu);
    }
    /* Streams side by side: decode tokens of all of them a second; sampled
     * each way, drawn where the logits are and (where that is not the
     * host) on the host. */
    double stream_tok_s[MAX_STREAM_RUNS] = {0}, sampled_tok_s[MAX_STREAM_RUNS][N_SAMPLINGS] = {{0}};
    double host_tok_s[MAX_STREAM_RUNS][N_SAMPLINGS] = {{0}}; /* 0: the same as sampled_tok_s */
    int stream_steps = n_gen < MAX_STREAM_STEPS ? (int)n_gen : MAX_STREAM_STEPS;
    for (int i = 0; i < n_streams; i++) {
        bool unused;
        if (streams_tok_s(m, (int)streams[i], stream_steps, STREAM_GREEDY, NULL, &stream_tok_s[i], &unused, &err))
            goto fail_pool;
        for (int k = 0; k < N_SAMPLINGS; k++) {
            bool drawn = false;
            if (streams_tok_s(m, (int)streams[i], stream_steps, STREAM_DRAWN, &SAMPLINGS[k], &sampled_tok_s[i][k],
                              &drawn, &err) ||
                (drawn && streams_tok_s(m, (int)streams[i], stream_steps, STREAM_HOST, &SAMPLINGS[k],
                                        &host_tok_s[i][k], &unused, &err)))
                goto fail_pool;
        }
    }
    /* Paired: decode tokens alternating with reads of the probe, each
     * token against the read right after it. The read bandwidth a guest
     * gets drifts with its host's other tenants (a Zen 5 guest read 25 GB/s
     * for minutes and 65 GB/s a few minutes later), so a limit measured
     * before or after decode can be another moment's; a pair shares one.
     * Not on a GPU: there the limit is the device's copy bandwidth. */
    double pair_tok_s[PAIRS], pair_read[PAIRS];
    int n_pairs = exo_model_gpu_layers(m) > 0 ? 0 : PAIRS;
    for (int i = 0; i < n_pairs; i++) {
        double ts = exo_clock_seconds();
        if (greedy_token(m, seq, &tok, logits, V, &in_place, &err))
            goto fail_pool;
        pair_tok_s[i] = exo_clock_seconds() - ts;
        pair_read[i] = exo_membw_read(probe, pool, 1);
    }
    /* the limit is the best read seen, before or after decode */
    double read_after = exo_membw_read(probe, pool, 5);
    if (read_after > read_bw)
        read_bw = read_after;
    /* a model wholly on a GPU is bounded by the GPU's memory instead */
    bool on_gpu = exo_model_gpu_layers(m) > 0 && exo_model_gpu_layers(m) == exo_model_shard(m).end_layer -
                                                                            exo_model_shard(m).start_layer;
    if (on_gpu)
        read_bw = exo_backend_cuda_copy_bandwidth(exo_model_gpu_device(m));
    qsort(token_s, (size_t)n_gen, sizeof(double), cmp_double);
    double median_s = n_gen % 2 ? token_s[n_gen / 2]
                                : 0.5 * (token_s[n_gen / 2 - 1] + token_s[n_gen / 2]);

    exo_decode_cost cost;
    exo_model_decode_cost(m, (int)((double)n_prompt + 2 + (double)n_gen / 2), &cost);
    double weight_bytes = cost.weight_bytes, kv_bytes = cost.cache_bytes;
    double bytes_per_token = weight_bytes + kv_bytes;
    double prefill_tps = (double)n_prompt / prefill_s, decode_tps = (double)n_gen / decode_s;
    double achieved = bytes_per_token * decode_tps;
    double achieved_median = bytes_per_token / median_s;
    double pair_ratio[PAIRS], paired = 0;
    for (int i = 0; i < n_pairs; i++)
        pair_ratio[i] = bytes_per_token / pair_tok_s[i] / pair_read[i];
    if (n_pairs) {
        qsort(pair_ratio, (size_t)n_pairs, sizeof(double), cmp_double);
        paired = 0.5 * (pair_ratio[n_pairs / 2 - 1] + pair_ratio[n_pairs / 2]);
    }
    /* prefill FLOPs: every layer's matrix products over all prompt tokens
     * (a sparse layer: its k experts' share) plus causal attention; the LM
     * head runs for the last token only. */
    double P = (double)n_prompt;
    double flops = 2 * P * (cost.params - cost.head_params) + 2 * cost.head_params +
                   2.0 * cost.prompt_attn_dims * P * P;
    double prefill_gflops = flops / prefill_s / 1e9;
    int64_t peer_n = cfg->intermediate_size > 0 ? cfg->intermediate_size : cfg->moe_intermediate_size;
    double avx2 = avx2_gemm_gflops(pool, (int)(n_prompt < 512 ? n_prompt : 512), (int)peer_n,
                                   (int)cfg->hidden_size);
    const char *name = preset ? preset : dir;
    /* Batched steps read each weight once for every stream, so past a few
     * streams the integer GEMV's products bind, not memory: two activation
     * levels of int8 products a parameter a token (q4/q8 on the CPU). */
    bool integer = !on_gpu && preset && (!strcmp(quant, "q4") || !strcmp(quant, "q8"));
    double dot_peak = integer && n_streams ? exo_dot_peak(pool) : 0, dot_share[MAX_STREAM_RUNS];
    for (int i = 0; i < n_streams; i++)
        dot_share[i] = dot_peak > 0 ? stream_tok_s[i] * 2 * cost.params / dot_peak : 0;
    if (json) {
        printf("{\"model\":\"%s\",\"quant\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"amx\":%s,"
               "\"prompt_tokens\":%ld,\"gen_tokens\":%ld,\"prefill_tok_s\":%.3f,"
               "\"decode_tok_s\":%.3f,\"bytes_per_token\":%.0f,\"achieved_gbs\":%.3f,"
               "\"read_bw_gbs\":%.3f,\"bw_fraction\":%.4f,\"median_token_ms\":%.3f,"
               "\"bw_fraction_median\":%.4f,\"prefill_gflops\":%.1f,"
               "\"avx2_gemm_gflops\":%.1f,\"prefill_vs_avx2\":%.2f,\"load_s\":%.2f,"
               "\"moe_fused_ms\":%.3f,\"moe_per_expert_ms\":%.3f,\"bw_fraction_paired\":%.4f,"
               "\"dot_peak_gps\":%.1f,\"decode_host_logits_tok_s\":%.3f,\"streams\":[",
               name, preset ? quant : "checkpoint", nthreads, exo_isa_name(exo_cpu_isa()),
               exo_cpu_has_amx() ? "true" : "false", n_prompt, n_gen, prefill_tps, decode_tps,
               bytes_per_token, achieved / 1e9, read_bw / 1e9, achieved / read_bw, median_s * 1e3,
               achieved_median / read_bw, prefill_gflops,
               avx2, avx2 > 0 ? prefill_gflops / avx2 : 0, t_load, fused_ms, unfused_ms, paired, dot_peak / 1e9,
               n_host ? (double)n_host / host_logits_s : 0);
        for (int i = 0; i < n_streams; i++) {
            printf("%s{\"n\":%ld,\"tok_s\":%.3f", i ? "," : "", streams[i], stream_tok_s[i]);
            for (int k = 0; k < N_SAMPLINGS; k++)
                printf(",\"%s_tok_s\":%.3f,\"%s_host_tok_s\":%.3f", SAMPLINGS[k].json, sampled_tok_s[i][k],
                       SAMPLINGS[k].json, host_tok_s[i][k] > 0 ? host_tok_s[i][k] : sampled_tok_s[i][k]);
            printf(",\"dot_fraction\":%.4f}", dot_share[i]);
        }
        printf("]}\n");
    } else {
        printf("model            %s (%s), %d threads, isa %s%s\n", name,
               preset ? quant : "checkpoint", nthreads, exo_isa_name(exo_cpu_isa()),
               exo_cpu_has_amx() ? " + amx" : "");
        printf("prefill          %ld tokens: %.1f tok/s, %.1f GFLOP/s (plain AVX2 f32 GEMM: "
               "%.1f GFLOP/s, x%.2f)\n",
               n_prompt, prefill_tps, prefill_gflops, avx2, avx2 > 0 ? prefill_gflops / avx2 : 0);
        printf("decode           %ld tokens: %.2f tok/s\n", n_gen, decode_tps);
        if (n_host)
            printf("                 %.2f tok/s with every logit copied to the host (%ld tokens; a "
                   "sampler's path, greedy takes the id alone)\n", (double)n_host / host_logits_s, n_host);
        char kv_type[64] = ""; /* the caches' values where some are bf16 (EXO_KV_CACHE) */
        if (cost.kv_bf16_layers == cost.kv_layers && cost.kv_layers)
            snprintf(kv_type, sizeof kv_type, ", bf16");
        else if (cost.kv_bf16_layers)
            snprintf(kv_type, sizeof kv_type, ", bf16 in %d of %d layers", cost.kv_bf16_layers, cost.kv_layers);
        printf("bytes/token      %.1f MB (weights %.1f MB + caches %.1f MB%s)\n", bytes_per_token / 1e6,
               weight_bytes / 1e6, kv_bytes / 1e6, kv_type);
        printf("per layer        %.1f MB of weights, %.1f M parameters a token (%d layers; LM head "
               "%.1f MB)\n", (weight_bytes - cost.head_bytes) / cost.layers / 1e6,
               (cost.params - cost.head_params) / cost.layers / 1e6, cost.layers, cost.head_bytes / 1e6);
        printf("bandwidth        %.2f GB/s achieved of %.2f GB/s measured %s = %.1f%%\n",
               achieved / 1e9, read_bw / 1e9, on_gpu ? "GPU copy (read + write)" : "read",
               100 * achieved / read_bw);
        if (exo_model_gpu_layers(m) && !on_gpu)
            printf("layers           %d on the GPU, the rest on the CPU\n", exo_model_gpu_layers(m));
        if (on_gpu)
            printf("recorded steps   %ld decode steps replayed from a CUDA graph (EXO_CUDA_GRAPH=0: none)\n",
                   exo_model_replayed_steps(m));
        double peer = on_gpu && preset ? llama_cpp_h200(preset, quant) : 0;
        if (peer > 0)
            printf("llama.cpp        %.0f tok/s on an H200 at this shape (llama-bench tg128, issue 15): x%.2f\n",
                   peer, decode_tps / peer);
        if (fused_ms > 0)
            printf("experts          fused decode %.2f ms a token, per-expert %.2f ms: x%.2f (medians, "
                   "alternating tokens)\n", fused_ms, unfused_ms, unfused_ms / fused_ms);
        for (int i = 0; i < n_streams; i++) {
            printf("streams %-8ld %.2f tok/s together (%d batched steps): x%.2f one stream's %.2f tok/s",
                   streams[i], stream_tok_s[i], stream_steps,
                   stream_tok_s[0] > 0 ? stream_tok_s[i] / stream_tok_s[0] : 0, stream_tok_s[0]);
            if (dot_peak > 0)
                printf(", %.0f%% of the int8 dot peak", 100.0 * dot_share[i]);
            printf("\n");
            for (int k = 0; k < N_SAMPLINGS; k++)
                if (host_tok_s[i][k] > 0)
                    printf("                 %.2f tok/s sampled (%s), drawn where the logits are; %.2f on the host "
                           "(%d threads)\n", sampled_tok_s[i][k], SAMPLINGS[k].name, host_tok_s[i][k],
                           exo_pool_size(exo_model_host_pool(m)));
                else
                    printf("                 %.2f tok/s sampled (%s), on the host (%d threads)\n",
                           sampled_tok_s[i][k], SAMPLINGS[k].name, exo_pool_size(exo_model_host_pool(m)));
        }
        if (dot_peak > 0)
            printf("int8 dot peak    %.0f G products/s on %d threads (vpdpbusd; the compute limit of batched\n"
                   "                 q4/q8 steps on the vector units, 2 products a parameter a token%s)\n",
                   dot_peak / 1e9, nthreads, exo_cpu_has_amx() ? "; AMX tiles go past it" : "");
        printf("median token     %.2f ms: %.2f GB/s = %.1f%% (the mean above includes tokens\n"
               "                 slowed by whatever else shares the machine)\n",
               median_s * 1e3, achieved_median / 1e9, 100 * achieved_median / read_bw);
        if (n_pairs)
            printf("paired           %.1f%%: median of %d tokens each against a read right after it (a\n"
                   "                 host's bandwidth drifts; a pair sees one moment)\n",
                   100 * paired, n_pairs);
    }
    status = 0;
fail_pool:
    exo_membw_free(probe);
    exo_pool_free(pool);
    if (status)
        fprintf(stderr, "exo bench: %s\n", err.msg);
    goto done;
fail:
    fprintf(stderr, "exo bench: %s\n", err.msg[0] ? err.msg : exo_strerror(err.code));
done:
    exo_free(token_s);
    exo_free(tokens);
    exo_free(logits);
    exo_seq_free(seq);
    exo_model_free(m);
    exo_synth_free(syn);
    return status;
}
