/* Supervisor + real runner processes (EXO_BIN runner --fd 3) on stories260K
 * converted to a HF dir with a small Llama-2 style chat template: load with
 * per-layer progress to Ready, greedy text equal to `exo run --chat`,
 * finish reasons (length, stop at an eos id from generation_config.json,
 * stop sequence), cancel of the running and of a queued request, PREFILL
 * progress chunks of a long prompt and a cancel during its prefill, two
 * requests one after the other (EXO_BATCH=1) and side by side (batching,
 * the default) with the texts each gets alone, SIGKILL mid-request ->
 * error chunks + Failed, bad
 * model dir -> Failed with the reason, clean shutdown, and fake runners
 * (shell scripts) that send malformed frames or die. */
#include "core/alloc.h"
#include "engine/model.h"
#include "runner/supervisor.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TEMPLATE                                                                                   \
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | " \
    "trim }} [/INST]{% else %}{{ m['content'] }}{% endif %}{% endfor %}"

/* A request long enough that it is still running when the test acts on it
 * (the context is sized for it; stories260K is fast). */
#define LONG     8000
#define LONG_CTX 8192

static char tmpdir[PATH_MAX];
static char model[PATH_MAX + 16];
static char log_path[PATH_MAX + 16];

static const char *exo_bin(void)
{
    const char *b = getenv("EXO_BIN");
    return b ? b : "build/exo";
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    test_tmpdir_make(tmpdir, "runner_test");
    snprintf(model, sizeof model, "%s/s", tmpdir);
    snprintf(log_path, sizeof log_path, "%s/runner.log", tmpdir);
    const char *src = "tests/fixtures/stories260K";
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "'%s' convert-llama2c '%s/stories260K.bin' '%s/tok512.bin' '%s' >/dev/null 2>&1",
             exo_bin(), src, src, model);
    cr_assert_eq(system(cmd), 0, "convert failed: %s", cmd);
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/chat_template.jinja", model);
    write_file(p, TEMPLATE);
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

/* `exo run DIR --chat PROMPT --max-tokens N` without its final newline. */
static char *cli_text(const char *dir, const char *prompt, int max_tokens)
{
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "'%s' run '%s' --chat '%s' --max-tokens %d --threads 1", exo_bin(),
             dir, prompt, max_tokens);
    FILE *f = popen(cmd, "r");
    cr_assert(f);
    exo_sbuf b;
    exo_sbuf_init(&b);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        exo_sbuf_append(&b, buf, n);
    cr_assert_eq(pclose(f), 0, "%s", cmd);
    cr_assert(b.len > 0 && b.data[b.len - 1] == '\n');
    b.data[--b.len] = 0;
    return exo_sbuf_take(&b);
}

/* ---- recording callbacks ------------------------------------------------ */

enum { EV_STATUS, EV_CHUNK, EV_DONE };

typedef struct ev {
    int               what;
    char              id[EXO_RUNNER_ID_MAX + 1];
    exo_chunk         chunk;
    exo_runner_status status;
    double            t;
} ev;

typedef struct rec {
    ev  *evs;
    int  n, cap;
    /* wait targets */
    const char *want_done;
    exo_runner_status_kind want_status;
    const char *want_chunk_of;
    /* when set, on_chunk cancels this command at its first PREFILL chunk */
    exo_supervisor *sup;
    const char     *cancel_at_prefill;
    double          cancel_t;
} rec;

static ev *push(rec *r, int what, const char *id)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->evs = exo_realloc(r->evs, sizeof *r->evs * (size_t)r->cap);
    }
    ev *e = &r->evs[r->n++];
    memset(e, 0, sizeof *e);
    e->what = what;
    e->t = now();
    if (id)
        snprintf(e->id, sizeof e->id, "%s", id);
    return e;
}

static void on_status(void *ctx, const exo_runner_status *st)
{
    exo_runner_status_copy(&push(ctx, EV_STATUS, NULL)->status, st);
}

static void on_chunk(void *ctx, const char *id, const exo_chunk *c)
{
    rec *r = ctx;
    exo_chunk_copy(&push(r, EV_CHUNK, id)->chunk, c);
    if (r->cancel_at_prefill && c->kind == EXO_CHUNK_PREFILL && !strcmp(id, r->cancel_at_prefill)) {
        exo_err err = {0};
        cr_assert_eq(exo_supervisor_cancel(r->sup, id, &err), 0, "%s", err.msg);
        r->cancel_at_prefill = NULL;
        r->cancel_t = now();
    }
}

static void on_done(void *ctx, const char *id) { push(ctx, EV_DONE, id); }

static void rec_free(rec *r)
{
    for (int i = 0; i < r->n; i++) {
        exo_chunk_free(&r->evs[i].chunk);
        exo_runner_status_clear(&r->evs[i].status);
    }
    exo_free(r->evs);
}

static bool is_done(const rec *r, const char *id)
{
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == EV_DONE && !strcmp(r->evs[i].id, id))
            return true;
    return false;
}

static bool until_done(void *ctx)
{
    rec *r = ctx;
    return is_done(r, r->want_done);
}

static bool until_status(void *ctx)
{
    rec *r = ctx;
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == EV_STATUS && r->evs[i].status.kind == r->want_status)
            return true;
    return false;
}

static bool until_chunk(void *ctx)
{
    rec *r = ctx;
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == EV_CHUNK && !strcmp(r->evs[i].id, r->want_chunk_of))
            return true;
    return false;
}

/* A TOKEN chunk of want_chunk_of: its prompt is all computed. */
static bool until_token(void *ctx)
{
    rec *r = ctx;
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == EV_CHUNK && !strcmp(r->evs[i].id, r->want_chunk_of) &&
            r->evs[i].chunk.kind == EXO_CHUNK_TOKEN)
            return true;
    return false;
}

/* Concatenated TOKEN text of a command. */
static char *text_of(const rec *r, const char *id)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_sbuf_puts(&b, "");
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == EV_CHUNK && !strcmp(r->evs[i].id, id) &&
            r->evs[i].chunk.kind == EXO_CHUNK_TOKEN)
            exo_sbuf_puts(&b, r->evs[i].chunk.text);
    return exo_sbuf_take(&b);
}

/* The single terminal chunk of a command (asserts there is exactly one and
 * that it is the last chunk, followed by exactly one Done). */
static const exo_chunk *terminal_of(const rec *r, const char *id)
{
    const exo_chunk *t = NULL;
    int n_done = 0;
    for (int i = 0; i < r->n; i++) {
        const ev *e = &r->evs[i];
        if (strcmp(e->id, id))
            continue;
        if (e->what == EV_DONE) {
            cr_assert(t, "%s: Done before a terminal chunk", id);
            n_done++;
        } else if (e->what == EV_CHUNK) {
            cr_assert_null(t, "%s: chunk after the terminal one", id);
            if (e->chunk.kind == EXO_CHUNK_FINISH || e->chunk.kind == EXO_CHUNK_ERROR)
                t = &e->chunk;
        }
    }
    cr_assert(t, "%s: no terminal chunk", id);
    cr_assert_eq(n_done, 1, "%s: %d Done", id, n_done);
    return t;
}

static exo_supervisor *spawn(rec *r)
{
    exo_supervisor_opts o = {exo_bin(), log_path, false};
    exo_supervisor_callbacks cb = {r, on_status, on_chunk, on_done};
    exo_supervisor *s;
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_spawn(&o, &cb, &s, &err), 0, "%s", err.msg);
    return s;
}

static void load(exo_supervisor *s, rec *r, const char *dir, int ctx)
{
    exo_runner_load l = {.model_dir = (char *)dir, .n_threads = 1, .ctx = ctx, .warmup_tokens = 4};
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_load(s, &l, &err), 0, "%s", err.msg);
    r->want_status = EXO_RUNNER_READY;
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_status, r), 1, "runner never became Ready");
}

static void request(exo_gen_request *q, const char *prompt, int max_tokens)
{
    exo_gen_request_init(q);
    q->model = exo_strdup("stories260K");
    q->messages = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt);
    q->max_tokens = max_tokens;
    q->sampling.temperature = 0;
    q->has = EXO_GEN_HAS_MAX_TOKENS | EXO_GEN_HAS_TEMPERATURE;
}

static void generate(exo_supervisor *s, const char *id, exo_gen_request *q)
{
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_generate(s, id, q, &err), 0, "%s", err.msg);
}

static void wait_done(exo_supervisor *s, rec *r, const char *id)
{
    r->want_done = id;
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_done, r), 1, "%s never finished", id);
}

static bool until_ready_now(void *ctx) { return exo_supervisor_status(ctx)->kind == EXO_RUNNER_READY; }

/* The runner reports Ready right after the Done of its last request. */
static void wait_ready(exo_supervisor *s)
{
    cr_assert_eq(exo_supervisor_wait(s, 10000, until_ready_now, s), 1, "not Ready again");
}

TestSuite(runner_supervisor, .init = setup, .fini = teardown, .timeout = 120);

Test(runner_supervisor, load_reports_progress_then_ready)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    /* Idle, Loading{0,0}, Loading{0,5}, Loading{..,5} ..., Loaded, WarmingUp, Ready */
    exo_runner_status_kind order[] = {EXO_RUNNER_IDLE, EXO_RUNNER_LOADING, EXO_RUNNER_LOADED,
                                      EXO_RUNNER_WARMING_UP, EXO_RUNNER_READY};
    int k = 0, last_loaded = -1, total = 0;
    for (int i = 0; i < r.n; i++) {
        const exo_runner_status *st = &r.evs[i].status;
        cr_assert_eq(r.evs[i].what, EV_STATUS);
        while (k < 5 && order[k] != st->kind)
            k++;
        cr_assert_lt(k, 5, "status %s out of order", exo_runner_status_name(st->kind));
        if (st->kind == EXO_RUNNER_LOADING) {
            cr_assert_geq(st->layers_loaded, last_loaded < 0 ? 0 : last_loaded);
            last_loaded = st->layers_loaded;
            total = st->total_layers;
        }
    }
    cr_assert_eq(total, 5);
    cr_assert_eq(last_loaded, 5);
    cr_assert_eq(exo_supervisor_status(s)->kind, EXO_RUNNER_READY);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, greedy_text_equals_cli)
{
    char *want = cli_text(model, "Once upon a time", 40);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "Once upon a time", 40);
    generate(s, "a", &q);
    cr_assert_eq(exo_supervisor_in_flight(s), 1);
    wait_done(s, &r, "a");
    char *got = text_of(&r, "a");
    cr_assert_str_eq(got, want);
    const exo_chunk *fin = terminal_of(&r, "a");
    cr_assert_eq(fin->kind, EXO_CHUNK_FINISH);
    cr_assert_eq(fin->reason, EXO_FR_LENGTH);
    cr_assert_eq(fin->usage.completion_tokens, 40);
    cr_assert_eq(fin->usage.prompt_tokens, 20); /* <s>[INST] Once upon a time [/INST] */
    cr_assert_gt(fin->generation_tps, 0);
    cr_assert_eq(exo_supervisor_in_flight(s), 0);
    /* Running while generating, Ready after */
    r.want_status = EXO_RUNNER_RUNNING;
    cr_assert(until_status(&r));
    wait_ready(s);
    exo_gen_request_free(&q);
    exo_free(got);
    exo_free(want);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, stops_at_generation_config_eos)
{
    /* Greedy ids from this prompt start 426 410 459 363 328 432: making 432
     * an eos id ends the text after five tokens. */
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/generation_config.json", model);
    write_file(p, "{\"eos_token_id\": 432}");
    char *want = cli_text(model, "Once upon a time", 40);
    char *five = cli_text(model, "Once upon a time", 5);
    cr_assert_str_eq(want, five);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "Once upon a time", 40);
    generate(s, "eos", &q);
    wait_done(s, &r, "eos");
    char *got = text_of(&r, "eos");
    cr_assert_str_eq(got, want);
    const exo_chunk *fin = terminal_of(&r, "eos");
    cr_assert_eq(fin->kind, EXO_CHUNK_FINISH);
    cr_assert_eq(fin->reason, EXO_FR_STOP);
    cr_assert_eq(fin->usage.completion_tokens, 5);
    exo_gen_request_free(&q);
    exo_free(got);
    exo_free(want);
    exo_free(five);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, stop_sequence_and_logprobs)
{
    char *full = cli_text(model, "Once upon a time", 40);
    const char *stop = "special";
    char *at = strstr(full, stop);
    cr_assert(at, "'%s' not in '%s'", stop, full);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "Once upon a time", 40);
    exo_err err;
    cr_assert_eq(exo_gen_add_stop(&q, stop, &err), 0);
    q.logprobs = true;
    q.sampling.top_logprobs = 3;
    generate(s, "stop", &q);
    wait_done(s, &r, "stop");
    char *got = text_of(&r, "stop");
    cr_assert_eq(strlen(got), (size_t)(at - full));
    cr_assert(!strncmp(got, full, strlen(got)));
    const exo_chunk *fin = terminal_of(&r, "stop");
    cr_assert_eq(fin->reason, EXO_FR_STOP);
    cr_assert_str_eq(fin->stop_sequence, stop);
    cr_assert_lt(fin->usage.completion_tokens, 40);
    int with_lp = 0;
    for (int i = 0; i < r.n; i++) {
        const exo_chunk *c = &r.evs[i].chunk;
        if (r.evs[i].what == EV_CHUNK && c->kind == EXO_CHUNK_TOKEN && c->token_id >= 0) {
            cr_assert(c->has_logprob);
            cr_assert_eq(c->n_top, 3);
            cr_assert_leq(c->logprob, 0);
            with_lp++;
        }
    }
    cr_assert_gt(with_lp, 0);
    exo_gen_request_free(&q);
    exo_free(got);
    exo_free(full);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, cancel_running_request_stops_promptly)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request q;
    request(&q, "Once upon a time", LONG);
    generate(s, "long", &q);
    r.want_chunk_of = "long";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    double t0 = now();
    exo_err err;
    cr_assert_eq(exo_supervisor_cancel(s, "long", &err), 0);
    wait_done(s, &r, "long");
    double dt = now() - t0;
    const exo_chunk *fin = terminal_of(&r, "long");
    cr_assert_eq(fin->kind, EXO_CHUNK_FINISH);
    cr_assert_eq(fin->reason, EXO_FR_CANCELLED);
    cr_assert_lt(fin->usage.completion_tokens, LONG);
    cr_assert_lt(dt, 2.0, "cancel took %.3f s", dt);
    /* the runner is ready for more */
    exo_gen_request q2;
    request(&q2, "Once upon a time", 3);
    generate(s, "next", &q2);
    wait_done(s, &r, "next");
    cr_assert_eq(terminal_of(&r, "next")->reason, EXO_FR_LENGTH);
    exo_gen_request_free(&q);
    exo_gen_request_free(&q2);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* A user message of about 1.7 tokens per word with stories260K's
 * 512-token vocabulary (600 words: 1,016 prompt tokens). */
static char *long_prompt(int n_words)
{
    static const char *const words[] = {"The", "cat", "sat", "on", "the", "mat."};
    exo_sbuf b;
    exo_sbuf_init(&b);
    for (int i = 0; i < n_words; i++) {
        exo_sbuf_puts(&b, i ? " " : "");
        exo_sbuf_puts(&b, words[i % 6]);
    }
    return exo_sbuf_take(&b);
}

/* A prompt over 1,024 tokens, one request alone: PREFILL chunks every
 * `step` tokens before its first token, and the text of `exo run`. */
static void prefill_progress(int step)
{
    char *prompt = long_prompt(800); /* ~1,350 tokens */
    char *want = cli_text(model, prompt, 10);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request q;
    request(&q, prompt, 10);
    generate(s, "p", &q);
    wait_done(s, &r, "p");
    const exo_chunk *fin = terminal_of(&r, "p");
    cr_assert_eq(fin->kind, EXO_CHUNK_FINISH);
    cr_assert_eq(fin->reason, EXO_FR_LENGTH);
    cr_assert_eq(fin->usage.completion_tokens, 10);
    int total = fin->usage.prompt_tokens;
    cr_assert_gt(total, 1024, "the prompt is only %d tokens", total);
    /* PREFILL 512, 1024, ... (< total) every one before the first TOKEN */
    int n_prefill = 0, n_token = 0;
    for (int i = 0; i < r.n; i++) {
        const exo_chunk *c = &r.evs[i].chunk;
        if (r.evs[i].what != EV_CHUNK || strcmp(r.evs[i].id, "p"))
            continue;
        if (c->kind == EXO_CHUNK_PREFILL) {
            cr_assert_eq(n_token, 0, "PREFILL after a TOKEN");
            n_prefill++;
            cr_assert_eq(c->processed, step * n_prefill);
            cr_assert_lt(c->processed, total);
            cr_assert_eq(c->total, total);
        } else if (c->kind == EXO_CHUNK_TOKEN) {
            n_token++;
        }
    }
    cr_assert_eq(n_prefill, (total + step - 1) / step - 1);
    cr_assert_gt(n_token, 0);
    /* the chunked prefill changes nothing in the text */
    char *got = text_of(&r, "p");
    cr_assert_str_eq(got, want);
    exo_free(got);
    exo_free(want);
    exo_free(prompt);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* What B (A's prompt and a few more words) takes of A's: on the CPU all
 * that they share but the chat template's end and what leaves its chunk a
 * call of 17 rows or more (model.h exo_model_exact_rows), on a GPU the
 * whole 128-token chunks. */
static bool reused_enough(int cached, int total)
{
    return cached > 1000 && cached < total && (cached % 128 == 0 || cached > total - 40);
}

/* Prefix reuse: B's prompt starts with A's (a long user message, then
 * more). After A, B takes A's slot and computes only what follows the
 * prefix they share (reused_enough): its usage counts it as cached, its
 * progress starts past it, and its text is the one `exo run` gives B's
 * prompt from scratch. */
Test(runner_supervisor, a_shared_prefix_is_computed_once)
{
    char *pa = long_prompt(800), *pb = exo_malloc(strlen(pa) + 64);
    sprintf(pb, "%s And then the dog came.", pa);
    char *want_a = cli_text(model, pa, 10), *want_b = cli_text(model, pb, 10);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request qa, qb;
    request(&qa, pa, 10);
    request(&qb, pb, 10);
    generate(s, "A", &qa);
    wait_done(s, &r, "A");
    generate(s, "B", &qb);
    wait_done(s, &r, "B");
    const exo_chunk *fa = terminal_of(&r, "A"), *fb = terminal_of(&r, "B");
    cr_assert_eq(fa->usage.cached_tokens, 0);
    int cached = fb->usage.cached_tokens, total = fb->usage.prompt_tokens;
    cr_assert(reused_enough(cached, total), "B reused %d of %d prompt tokens", cached, total);
    for (int i = 0; i < r.n; i++) /* B's progress starts past what it reused */
        if (r.evs[i].what == EV_CHUNK && !strcmp(r.evs[i].id, "B") && r.evs[i].chunk.kind == EXO_CHUNK_PREFILL)
            cr_assert_gt(r.evs[i].chunk.processed, cached);
    char *ta = text_of(&r, "A"), *tb = text_of(&r, "B");
    cr_assert_str_eq(ta, want_a);
    cr_assert_str_eq(tb, want_b);
    exo_free(ta);
    exo_free(tb);
    exo_free(want_a);
    exo_free(want_b);
    exo_free(pa);
    exo_free(pb);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* B runs to its end while A (a long answer) decodes: B's text is the one
 * `exo run` gives its prompt, and A still runs when B is done; `check`
 * then looks at what was recorded, and A is cancelled. */
static void beside_a_decoding_request(const char *pa, const char *pb, void (*check)(const rec *r))
{
    setenv("EXO_BATCH", "8", 1);
    char *want_b = cli_text(model, pb, 10);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request qa, qb;
    request(&qa, pa, 1500);
    request(&qb, pb, 10);
    generate(s, "A", &qa);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_token, &r), 1);
    generate(s, "B", &qb);
    wait_done(s, &r, "B");
    cr_assert(!is_done(&r, "A"), "A should still run when B is done");
    char *tb = text_of(&r, "B");
    cr_assert_str_eq(tb, want_b);
    check(&r);
    exo_err err;
    cr_assert_eq(exo_supervisor_cancel(s, "A", &err), 0);
    wait_done(s, &r, "A");
    exo_free(tb);
    exo_free(want_b);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
}

static void b_reused_enough(const rec *r)
{
    const exo_chunk *fb = terminal_of(r, "B");
    int cached = fb->usage.cached_tokens, total = fb->usage.prompt_tokens;
    cr_assert(reused_enough(cached, total), "B reused %d of %d prompt tokens", cached, total);
}

/* Prefix reuse from a running request: B arrives while A (whose prompt B
 * extends) still decodes, and takes the prefix A's sequence holds by
 * copy, not by computing them: its usage counts them as cached, it is done
 * while A still runs, and its text is the one `exo run` gives B's prompt. */
Test(runner_supervisor, a_running_requests_prefix_is_copied)
{
    char *pa = long_prompt(800), *pb = exo_malloc(strlen(pa) + 64);
    sprintf(pb, "%s And then the dog came.", pa);
    beside_a_decoding_request(pa, pb, b_reused_enough);
    exo_free(pa);
    exo_free(pb);
}

/* B's progress: after a whole first chunk (no prompt call timed yet), 32
 * tokens at a time. */
static void b_went_in_slices(const rec *r)
{
    int prev = 0, slices = 0, n = 0;
    for (int i = 0; i < r->n; i++) {
        const exo_chunk *c = &r->evs[i].chunk;
        if (r->evs[i].what != EV_CHUNK || strcmp(r->evs[i].id, "B") || c->kind != EXO_CHUNK_PREFILL)
            continue;
        int step = c->processed - prev;
        prev = c->processed;
        cr_assert(n++ ? step == 32 : step <= 128, "B's progress %d: %d tokens", n, step);
        slices += step == 32;
    }
    cr_assert_gt(slices, 20, "B went in %d slices of %d tokens", slices, terminal_of(r, "B")->usage.prompt_tokens);
}

/* A long prompt beside a decoding request goes in slices of its 128-token
 * chunks (EXO_PREFILL_SLICE_MS, 1 ms: the least slice, 32 rows), on the
 * CPU, whose rows keep their bits in calls of 17 rows or more, and
 * answers as `exo run`. */
Test(runner_supervisor, a_prompt_beside_a_decoding_request_goes_in_slices)
{
    setenv("EXO_DEVICE", "cpu", 1);
    setenv("EXO_PREFILL_SLICE_MS", "1", 1);
    char *pb = long_prompt(800);
    beside_a_decoding_request("Once upon a time", pb, b_went_in_slices);
    exo_free(pb);
}

/* One request at a time (EXO_BATCH=1, `exo serve --no-batch`): 512-token
 * chunks; batching: 128-token chunks, so streams already decoding wait
 * for one such chunk a step. */
Test(runner_supervisor, long_prompt_reports_prefill_progress)
{
    setenv("EXO_BATCH", "1", 1);
    prefill_progress(512);
}

Test(runner_supervisor, long_prompt_reports_prefill_progress_batched)
{
    prefill_progress(128);
}

Test(runner_supervisor, cancel_during_prefill_stops_before_any_token)
{
    /* ~6,700 tokens: 52 chunks of 128 (batched), so a loaded machine (ASan,
     * fuzzers beside it) that runs several chunks while the Cancel crosses
     * the pipe still stops far from the end */
    char *prompt = long_prompt(4000);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request q;
    request(&q, prompt, 10);
    r.sup = s;
    r.cancel_at_prefill = "c"; /* the Cancel leaves as the first PREFILL arrives */
    generate(s, "c", &q);
    wait_done(s, &r, "c");
    double dt = now() - r.cancel_t;
    cr_assert_null(r.cancel_at_prefill, "no PREFILL chunk came");
    const exo_chunk *fin = terminal_of(&r, "c");
    cr_assert_eq(fin->kind, EXO_CHUNK_FINISH);
    cr_assert_eq(fin->reason, EXO_FR_CANCELLED);
    cr_assert_eq(fin->usage.completion_tokens, 0);
    int n_prefill = 0;
    for (int i = 0; i < r.n; i++) {
        const exo_chunk *c = &r.evs[i].chunk;
        if (r.evs[i].what != EV_CHUNK || strcmp(r.evs[i].id, "c"))
            continue;
        cr_assert_neq(c->kind, EXO_CHUNK_TOKEN, "a TOKEN chunk after the cancel");
        n_prefill += c->kind == EXO_CHUNK_PREFILL;
    }
    /* stopped at a chunk boundary soon after the Cancel arrived: the chunks
     * run between the first PREFILL and the Cancel's arrival depend on the
     * scheduler (9 of 128 tokens seen under load), so the bound is half the
     * prompt, which a runner that ignored the Cancel until the end fails */
    int n_chunks = (fin->usage.prompt_tokens + 127) / 128;
    cr_assert_gt(n_chunks, 40, "the prompt is only %d tokens", fin->usage.prompt_tokens);
    cr_assert_lt(n_prefill, n_chunks / 2, "%d PREFILL chunks of %d", n_prefill, n_chunks);
    cr_assert_lt(dt, 2.0, "cancel took %.3f s", dt);
    /* the runner is ready for more */
    wait_ready(s);
    exo_gen_request q2;
    request(&q2, "Once upon a time", 3);
    generate(s, "next", &q2);
    wait_done(s, &r, "next");
    cr_assert_eq(terminal_of(&r, "next")->reason, EXO_FR_LENGTH);
    exo_free(prompt);
    exo_gen_request_free(&q);
    exo_gen_request_free(&q2);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* One request at a time (EXO_BATCH=1): B starts when A is done. Batching
 * (the default): both decode side by side, and each gets the text it gets
 * alone. */
static void two_requests(bool batched)
{
    char *want_a = cli_text(model, "Once upon a time", 30);
    char *want_b = cli_text(model, "The dog", 30);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request qa, qb;
    request(&qa, "Once upon a time", 30);
    request(&qb, "The dog", 30);
    generate(s, "A", &qa);
    generate(s, "B", &qb);
    cr_assert_eq(exo_supervisor_in_flight(s), 2);
    wait_done(s, &r, "B");
    int last_a = -1, first_b = -1;
    for (int i = 0; i < r.n; i++) {
        if (r.evs[i].what == EV_STATUS)
            continue;
        if (!strcmp(r.evs[i].id, "A"))
            last_a = i;
        else if (first_b < 0 && !strcmp(r.evs[i].id, "B"))
            first_b = i;
    }
    if (batched)
        cr_assert(last_a >= 0 && first_b >= 0 && first_b < last_a, "A's events end at %d, B's start at %d",
                  last_a, first_b);
    else
        cr_assert(last_a >= 0 && first_b > last_a, "A's events end at %d, B's start at %d", last_a, first_b);
    char *ta = text_of(&r, "A"), *tb = text_of(&r, "B");
    cr_assert_str_eq(ta, want_a);
    cr_assert_str_eq(tb, want_b);
    cr_assert_eq(terminal_of(&r, "A")->reason, EXO_FR_LENGTH);
    cr_assert_eq(terminal_of(&r, "B")->reason, EXO_FR_LENGTH);
    exo_free(ta);
    exo_free(tb);
    exo_free(want_a);
    exo_free(want_b);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, queued_requests_run_in_order_without_interleaving)
{
    setenv("EXO_BATCH", "1", 1);
    two_requests(false);
}

Test(runner_supervisor, queued_requests_decode_side_by_side)
{
    two_requests(true);
}

/* More requests than a model call takes decode rows (16): twenty side by
 * side take two calls a step, and each still gets the text it gets alone.
 * The first asks for 200 tokens, so that a loaded machine descheduling the
 * sender for a few milliseconds cannot let it finish before the last
 * arrives (30 tokens of this model take a few milliseconds). */
Test(runner_supervisor, more_requests_than_a_calls_rows_each_get_their_own_text)
{
    setenv("EXO_BATCH", "24", 1);
    enum { N = 20 };
    static const char *prompts[] = {"Once upon a time", "The dog", "Lily and Ben", "A big red ball"};
    char *want[N], id[N][8];
    exo_gen_request q[N];
    for (int i = 0; i < N; i++)
        want[i] = cli_text(model, prompts[i % 4], i ? 30 + i : 200);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    for (int i = 0; i < N; i++) {
        snprintf(id[i], sizeof id[i], "r%d", i);
        request(&q[i], prompts[i % 4], i ? 30 + i : 200);
        generate(s, id[i], &q[i]);
    }
    cr_assert_eq(exo_supervisor_in_flight(s), N);
    for (int i = 0; i < N; i++)
        wait_done(s, &r, id[i]);
    /* side by side: the last request has its first chunk before the first
     * request is done */
    int first_last = -1, done_first = -1;
    for (int i = 0; i < r.n; i++) {
        if (first_last < 0 && r.evs[i].what == EV_CHUNK && !strcmp(r.evs[i].id, id[N - 1]))
            first_last = i;
        if (done_first < 0 && r.evs[i].what == EV_DONE && !strcmp(r.evs[i].id, id[0]))
            done_first = i;
    }
    cr_assert(first_last >= 0 && done_first >= 0 && first_last < done_first,
              "the last request starts at event %d, the first is done at %d", first_last, done_first);
    for (int i = 0; i < N; i++) {
        char *t = text_of(&r, id[i]);
        cr_assert_str_eq(t, want[i], "%s", id[i]);
        cr_assert_eq(terminal_of(&r, id[i])->reason, EXO_FR_LENGTH);
        exo_free(t);
        exo_free(want[i]);
        exo_gen_request_free(&q[i]);
    }
    exo_supervisor_free(s);
    rec_free(&r);
}

/* Bytes of caches a sequence of `ctx` tokens of the test model keeps. */
static double context_bytes(int ctx)
{
    exo_model *m;
    exo_err err = {0};
    cr_assert_eq(exo_model_load(model, NULL, &m, &err), 0, "%s", err.msg);
    double bytes = (double)exo_model_seq_bytes(m, ctx);
    exo_model_free(m);
    cr_assert_gt(bytes, 0);
    return bytes;
}

/* Index of the first event `what` of request id in r (-1: none). */
static int first_event(const rec *r, int what, const char *id)
{
    for (int i = 0; i < r->n; i++)
        if (r->evs[i].what == what && !strcmp(r->evs[i].id, id))
            return i;
    return -1;
}

/* Three requests under a KV budget (of contexts of 512 tokens): `max`
 * their max_tokens; returns after all are done, each having got the text
 * it gets alone. */
static void three_under_budget(rec *r, double contexts, const int max[3])
{
    char budget[32];
    snprintf(budget, sizeof budget, "%.0f", contexts * context_bytes(512));
    setenv("EXO_KV_BUDGET", budget, 1);
    setenv("EXO_BATCH", "8", 1);
    static const char *prompts[] = {"Once upon a time", "The dog", "Lily and Ben"};
    static const char *ids[] = {"A", "B", "C"};
    char *want[3];
    exo_gen_request q[3];
    for (int i = 0; i < 3; i++)
        want[i] = cli_text(model, prompts[i], max[i]);
    exo_supervisor *s = spawn(r);
    load(s, r, model, 512);
    for (int i = 0; i < 3; i++) {
        request(&q[i], prompts[i], max[i]);
        generate(s, ids[i], &q[i]);
    }
    for (int i = 0; i < 3; i++)
        wait_done(s, r, ids[i]);
    for (int i = 0; i < 3; i++) {
        char *t = text_of(r, ids[i]);
        cr_assert_str_eq(t, want[i], "%s", ids[i]);
        exo_free(t);
        exo_free(want[i]);
        exo_gen_request_free(&q[i]);
    }
    exo_supervisor_free(s);
    unsetenv("EXO_KV_BUDGET");
}

/* Requests are admitted by the caches they need, not a context each:
 * under a budget of one and a half contexts, requests of 200, 40 and 40
 * tokens (a context each would admit one) run side by side. A is the long
 * one so that it is still running when C arrives however late the test's
 * thread gets to send C: with 40 tokens the tiny model could finish A
 * first on a loaded machine (it did once in CI, C's first chunk 3 events
 * after A's end). */
Test(runner_supervisor, a_kv_budget_admits_requests_by_what_they_need)
{
    rec r = {0};
    three_under_budget(&r, 1.5, (const int[3]){200, 40, 40});
    int first_c = first_event(&r, EV_CHUNK, "C"), done_a = first_event(&r, EV_DONE, "A");
    cr_assert(first_c >= 0 && first_c < done_a, "C waited for A (first chunk %d, A done %d)", first_c, done_a);
    rec_free(&r);
}

/* Under the same budget, B and C may need most of a context each (400
 * tokens to generate): all three start side by side, since a request is
 * admitted holding its prompt and 256 positions, not its max_tokens; as
 * they grow past the budget the youngest gives its caches back and
 * computes them again later, and every answer is what it is alone (checked
 * in three_under_budget; batching.test.mjs makes sure of a preemption). */
Test(runner_supervisor, requests_that_outgrow_the_budget_start_together_and_answer_as_alone)
{
    rec r = {0};
    three_under_budget(&r, 1.5, (const int[3]){200, 400, 400});
    int first_b = first_event(&r, EV_CHUNK, "B"), first_c = first_event(&r, EV_CHUNK, "C");
    int done_a = first_event(&r, EV_DONE, "A"), done_b = first_event(&r, EV_DONE, "B");
    cr_assert(first_b >= 0 && first_b < done_a, "B waited for A (first chunk %d, A done %d)", first_b, done_a);
    cr_assert(first_c >= 0 && first_c < done_b, "C waited for B (first chunk %d, B done %d)", first_c, done_b);
    rec_free(&r);
}

/* A budget that holds no context fails the load, saying so; requests are
 * answered with that. */
Test(runner_supervisor, a_kv_budget_below_one_context_fails_the_load)
{
    char budget[32];
    snprintf(budget, sizeof budget, "%.0f", 0.5 * context_bytes(512));
    setenv("EXO_KV_BUDGET", budget, 1);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    exo_runner_load l = {.model_dir = model, .n_threads = 1, .ctx = 512, .warmup_tokens = 4};
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_load(s, &l, &err), 0, "%s", err.msg);
    r.want_status = EXO_RUNNER_FAILED;
    cr_assert_eq(exo_supervisor_wait(s, 30000, until_status, &r), 1);
    const exo_runner_status *st = exo_supervisor_status(s);
    cr_assert(st->error_message && strstr(st->error_message, "KV budget") &&
                  strstr(st->error_message, "512 tokens"), "%s", st->error_message);
    exo_gen_request q;
    request(&q, "hi", 5);
    generate(s, "x", &q);
    wait_done(s, &r, "x");
    cr_assert_eq(terminal_of(&r, "x")->kind, EXO_CHUNK_ERROR);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* EXO_KV_CACHE=bf16 (exo serve --kv-cache bf16): a context's caches take
 * half the bytes, so a budget of 0.6 of an f32 context holds one, the load
 * succeeds and a request gets the text `exo run` gives with the same
 * cache. */
Test(runner_supervisor, a_bf16_kv_cache_holds_a_context_in_half_the_bytes)
{
    double f32 = context_bytes(512);
    setenv("EXO_KV_CACHE", "bf16", 1);
    double bf16 = context_bytes(512);
    cr_assert(bf16 < 0.51 * f32 && bf16 > 0.49 * f32, "a bf16 context %.0f bytes, an f32 one %.0f", bf16, f32);
    char budget[32];
    snprintf(budget, sizeof budget, "%.0f", 0.6 * f32);
    setenv("EXO_KV_BUDGET", budget, 1);
    char *want = cli_text(model, "Once upon a time", 60);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "Once upon a time", 60);
    generate(s, "x", &q);
    wait_done(s, &r, "x");
    char *t = text_of(&r, "x");
    cr_assert_str_eq(t, want);
    exo_free(t);
    exo_free(want);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* One at a time (EXO_BATCH=1): B waits behind A and a cancel answers it
 * at once, with no token. */
Test(runner_supervisor, cancel_queued_request)
{
    setenv("EXO_BATCH", "1", 1);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request qa, qb;
    request(&qa, "Once upon a time", 200);
    request(&qb, "The dog", 30);
    generate(s, "A", &qa);
    generate(s, "B", &qb);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    exo_err err;
    cr_assert_eq(exo_supervisor_cancel(s, "B", &err), 0);
    wait_done(s, &r, "B");
    cr_assert(!is_done(&r, "A"), "B should be answered while A still runs");
    const exo_chunk *fb = terminal_of(&r, "B");
    cr_assert_eq(fb->reason, EXO_FR_CANCELLED);
    cr_assert_eq(fb->usage.completion_tokens, 0);
    wait_done(s, &r, "A");
    cr_assert_eq(terminal_of(&r, "A")->reason, EXO_FR_LENGTH);
    cr_assert_eq(terminal_of(&r, "A")->usage.completion_tokens, 200);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
}

/* Under a budget of 1.2 contexts, B waits for the cache memory A holds
 * (with slots free), and a cancel still answers it at once, with no token,
 * while A runs. */
Test(runner_supervisor, cancel_request_waiting_for_cache_memory)
{
    char budget[32];
    snprintf(budget, sizeof budget, "%.0f", 1.2 * context_bytes(512));
    setenv("EXO_KV_BUDGET", budget, 1);
    setenv("EXO_BATCH", "8", 1);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request qa, qb;
    request(&qa, "Once upon a time", 440);
    request(&qb, "The dog", 440);
    generate(s, "A", &qa);
    generate(s, "B", &qb);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    exo_err err;
    cr_assert_eq(exo_supervisor_cancel(s, "B", &err), 0);
    wait_done(s, &r, "B");
    cr_assert(!is_done(&r, "A"), "B should be answered while A still runs");
    const exo_chunk *fb = terminal_of(&r, "B");
    cr_assert_eq(fb->reason, EXO_FR_CANCELLED);
    cr_assert_eq(fb->usage.completion_tokens, 0);
    wait_done(s, &r, "A");
    cr_assert_eq(terminal_of(&r, "A")->usage.completion_tokens, 440);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
    unsetenv("EXO_KV_BUDGET");
}

/* Batching two at a time (EXO_BATCH=2): A and B run, C waits for a slot,
 * and a cancel answers C at once, with no token, while A still runs. */
Test(runner_supervisor, cancel_request_queued_behind_a_full_batch)
{
    setenv("EXO_BATCH", "2", 1);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request qa, qb, qc;
    request(&qa, "Once upon a time", 200);
    request(&qb, "The cat", 200);
    request(&qc, "The dog", 30);
    generate(s, "A", &qa);
    generate(s, "B", &qb);
    generate(s, "C", &qc);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    exo_err err;
    cr_assert_eq(exo_supervisor_cancel(s, "C", &err), 0);
    wait_done(s, &r, "C");
    cr_assert(!is_done(&r, "A"), "C should be answered while A still runs");
    const exo_chunk *fc = terminal_of(&r, "C");
    cr_assert_eq(fc->reason, EXO_FR_CANCELLED);
    cr_assert_eq(fc->usage.completion_tokens, 0);
    wait_done(s, &r, "A");
    wait_done(s, &r, "B");
    cr_assert_eq(terminal_of(&r, "A")->usage.completion_tokens, 200);
    cr_assert_eq(terminal_of(&r, "B")->usage.completion_tokens, 200);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_gen_request_free(&qc);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, sigkill_mid_request_fails_in_flight_commands)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request qa, qb;
    request(&qa, "Once upon a time", LONG);
    request(&qb, "The dog", 30);
    generate(s, "A", &qa);
    generate(s, "B", &qb);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    cr_assert_eq(kill(exo_supervisor_pid(s), SIGKILL), 0);
    cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1);
    cr_assert(!exo_supervisor_alive(s));
    const char *want = "runner exited (signal 9) before completing the request";
    const exo_chunk *ta = terminal_of(&r, "A"), *tb = terminal_of(&r, "B");
    cr_assert_eq(ta->kind, EXO_CHUNK_ERROR);
    cr_assert_str_eq(ta->error, want);
    cr_assert_eq(tb->kind, EXO_CHUNK_ERROR);
    cr_assert_str_eq(tb->error, want);
    const exo_runner_status *st = exo_supervisor_status(s);
    cr_assert_eq(st->kind, EXO_RUNNER_FAILED);
    cr_assert(st->error_message && strstr(st->error_message, "signal 9"), "%s", st->error_message);
    cr_assert_eq(r.evs[r.n - 1].what, EV_STATUS); /* Failed comes after the error chunks */
    cr_assert_eq(exo_supervisor_in_flight(s), 0);
    cr_assert_eq(exo_supervisor_process(s), 1);
    exo_err err;
    cr_assert_eq(exo_supervisor_generate(s, "C", &qb, &err), EXO_EIO);
    cr_assert_eq(exo_supervisor_fd(s), -1);
    exo_gen_request_free(&qa);
    exo_gen_request_free(&qb);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, bad_model_dir_fails_with_reason)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    exo_runner_load l = {.model_dir = "/nonexistent/exo-model", .n_threads = 1, .ctx = 0, .warmup_tokens = 4};
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_load(s, &l, &err), 0);
    r.want_status = EXO_RUNNER_FAILED;
    cr_assert_eq(exo_supervisor_wait(s, 30000, until_status, &r), 1);
    const exo_runner_status *st = exo_supervisor_status(s);
    cr_assert_eq(st->kind, EXO_RUNNER_FAILED);
    cr_assert(st->error_message && strstr(st->error_message, "/nonexistent/exo-model"), "%s",
              st->error_message);
    /* requests are answered, not left hanging */
    exo_gen_request q;
    request(&q, "hi", 5);
    generate(s, "x", &q);
    wait_done(s, &r, "x");
    const exo_chunk *t = terminal_of(&r, "x");
    cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
    cr_assert(strstr(t->error, "failed to load"), "%s", t->error);
    /* and it still shuts down cleanly */
    cr_assert_eq(exo_supervisor_shutdown(s, &err), 0);
    cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1);
    cr_assert_eq(exo_supervisor_status(s)->kind, EXO_RUNNER_SHUTDOWN);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, no_tokenizer_and_long_prompt_give_error_chunks)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, "tests/fixtures/qwen3-f32", 64); /* warm-up runs on plain ids */
    exo_gen_request q;
    request(&q, "hi", 5);
    generate(s, "x", &q);
    wait_done(s, &r, "x");
    const exo_chunk *t = terminal_of(&r, "x");
    cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
    cr_assert(strstr(t->error, "tokenizer"), "%s", t->error);
    exo_supervisor_free(s);
    rec_free(&r);

    rec r2 = {0};
    s = spawn(&r2);
    load(s, &r2, model, 16);
    exo_gen_request_free(&q);
    request(&q, "Once upon a time there was a little girl named Lily who loved to play", 5);
    generate(s, "long", &q);
    wait_done(s, &r2, "long");
    t = terminal_of(&r2, "long");
    cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
    cr_assert(strstr(t->error, "context"), "%s", t->error);
    wait_ready(s);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r2);
}

Test(runner_supervisor, shutdown_is_clean)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request q;
    request(&q, "Once upon a time", LONG);
    generate(s, "A", &q);
    r.want_chunk_of = "A";
    cr_assert_eq(exo_supervisor_wait(s, 60000, until_chunk, &r), 1);
    exo_err err;
    cr_assert_eq(exo_supervisor_shutdown(s, &err), 0);
    cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1);
    cr_assert_eq(terminal_of(&r, "A")->reason, EXO_FR_CANCELLED);
    r.want_status = EXO_RUNNER_SHUTTING_DOWN;
    cr_assert(until_status(&r));
    cr_assert_eq(exo_supervisor_status(s)->kind, EXO_RUNNER_SHUTDOWN);
    cr_assert_eq(exo_supervisor_generate(s, "B", &q, &err), EXO_EIO);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, free_stops_a_busy_runner)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, LONG_CTX);
    exo_gen_request q;
    request(&q, "Once upon a time", LONG);
    generate(s, "A", &q);
    pid_t pid = exo_supervisor_pid(s);
    double t0 = now();
    exo_supervisor_free(s); /* no callbacks; the child is gone afterwards */
    cr_assert_lt(now() - t0, 5.0);
    cr_assert_eq(kill(pid, 0), -1);
    cr_assert_eq(errno, ESRCH);
    exo_gen_request_free(&q);
    rec_free(&r);
}

Test(runner_supervisor, missing_binary_fails_to_spawn)
{
    rec r = {0};
    exo_supervisor_opts o = {"/nonexistent/exo", NULL, false};
    exo_supervisor_callbacks cb = {&r, on_status, on_chunk, on_done};
    exo_supervisor *s;
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_spawn(&o, &cb, &s, &err), EXO_ENOENT);
    cr_assert(strstr(err.msg, "/nonexistent/exo"), "%s", err.msg);
    cr_assert_null(s);
}

/* A fake runner: a bash script run as `SCRIPT runner --fd 3`. */
static exo_supervisor *spawn_fake(rec *r, const char *body)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/fake-runner.sh", tmpdir);
    char script[4096];
    snprintf(script, sizeof script, "#!/bin/bash\n%s\n", body);
    write_file(p, script);
    chmod(p, 0755);
    exo_supervisor_opts o = {p, log_path, false};
    exo_supervisor_callbacks cb = {r, on_status, on_chunk, on_done};
    exo_supervisor *s;
    exo_err err = {0};
    cr_assert_eq(exo_supervisor_spawn(&o, &cb, &s, &err), 0, "%s", err.msg);
    return s;
}

Test(runner_supervisor, malformed_frames_fail_the_runner)
{
    static const char *const bodies[] = {
        "printf '\\xff\\xff\\xff\\xff' >&3; sleep 30",              /* length over the cap */
        "printf '\\x00\\x00\\x00\\x00' >&3; sleep 30",              /* zero length */
        "printf '\\x05\\x00\\x00\\x00hello' >&3; sleep 30",         /* not JSON */
        "printf '\\x13\\x00\\x00\\x00{\"type\":\"Shutdown\"}' >&3; sleep 30", /* wrong direction */
        "printf '\\x27\\x00\\x00\\x00{\"type\":\"Status\",\"status\":{\"kind\":\"?\"}}' >&3; sleep 30",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        rec r = {0};
        exo_supervisor *s = spawn_fake(&r, bodies[i]);
        exo_gen_request q;
        request(&q, "hi", 5);
        generate(s, "x", &q);
        double t0 = now();
        cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1, "case %zu", i);
        cr_assert_lt(now() - t0, 5.0);
        const exo_runner_status *st = exo_supervisor_status(s);
        cr_assert_eq(st->kind, EXO_RUNNER_FAILED, "case %zu", i);
        cr_assert(strstr(st->error_message, "protocol error"), "case %zu: %s", i, st->error_message);
        const exo_chunk *t = terminal_of(&r, "x");
        cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
        cr_assert(strstr(t->error, "before completing the request"), "%s", t->error);
        exo_gen_request_free(&q);
        exo_supervisor_free(s);
        rec_free(&r);
    }
}

Test(runner_supervisor, runner_exit_code_and_log_line_reported)
{
    rec r = {0};
    exo_supervisor *s = spawn_fake(&r, "sleep 0.3; echo 'fatal: out of cheese' >&2; exit 3");
    exo_gen_request q;
    request(&q, "hi", 5);
    generate(s, "x", &q);
    cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1);
    const exo_chunk *t = terminal_of(&r, "x");
    cr_assert_str_eq(t->error, "runner exited (exit code 3) before completing the request");
    const exo_runner_status *st = exo_supervisor_status(s);
    cr_assert_eq(st->kind, EXO_RUNNER_FAILED);
    cr_assert_str_eq(st->error_message, "runner exited (exit code 3): fatal: out of cheese");
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, done_without_result_gets_an_error_chunk)
{
    rec r = {0};
    exo_supervisor *s =
        spawn_fake(&r, "sleep 0.2; printf '\\x20\\x00\\x00\\x00{\"type\":\"Done\",\"command_id\":\"x\"}' >&3; sleep 30");
    exo_gen_request q;
    request(&q, "hi", 5);
    generate(s, "x", &q);
    wait_done(s, &r, "x");
    const exo_chunk *t = terminal_of(&r, "x");
    cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
    cr_assert(strstr(t->error, "without a result"), "%s", t->error);
    cr_assert(exo_supervisor_alive(s));
    exo_gen_request_free(&q);
    exo_supervisor_free(s); /* the script ignores Shutdown: killed after the grace period */
    rec_free(&r);
}

Test(runner_supervisor, invalid_request_is_answered_by_the_runner)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "hi", 5);
    q.sampling.temperature = 500; /* the runner's decoder validates what the node sends */
    generate(s, "bad", &q);
    wait_done(s, &r, "bad");
    const exo_chunk *t = terminal_of(&r, "bad");
    cr_assert_eq(t->kind, EXO_CHUNK_ERROR);
    cr_assert(strstr(t->error, "invalid request") && strstr(t->error, "temperature"), "%s", t->error);
    cr_assert(exo_supervisor_alive(s));
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, template_that_opens_think_streams_reasoning)
{
    /* The prompt ends inside <think>: every token is reasoning (the model
     * never closes it), and usage counts them as reasoning tokens. */
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/chat_template.jinja", model);
    write_file(p, TEMPLATE "{% if add_generation_prompt %}<think>\n{% endif %}");
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    load(s, &r, model, 512);
    exo_gen_request q;
    request(&q, "Once upon a time", 12);
    generate(s, "t", &q);
    wait_done(s, &r, "t");
    const exo_chunk *fin = terminal_of(&r, "t");
    cr_assert_eq(fin->reason, EXO_FR_LENGTH);
    cr_assert_eq(fin->usage.reasoning_tokens, 12);
    int n_tok = 0;
    for (int i = 0; i < r.n; i++)
        if (r.evs[i].what == EV_CHUNK && r.evs[i].chunk.kind == EXO_CHUNK_TOKEN) {
            cr_assert(r.evs[i].chunk.is_thinking);
            n_tok++;
        }
    cr_assert_gt(n_tok, 0);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, requests_sent_before_ready_wait_for_the_model)
{
    char *want = cli_text(model, "Once upon a time", 10);
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    exo_runner_load l = {.model_dir = model, .n_threads = 1, .ctx = 512, .warmup_tokens = 4};
    exo_err err = {0};
    exo_gen_request q;
    request(&q, "Once upon a time", 10);
    generate(s, "early", &q); /* queued in Idle, before the model is even named */
    cr_assert_eq(exo_supervisor_load(s, &l, &err), 0, "%s", err.msg);
    wait_done(s, &r, "early");
    char *got = text_of(&r, "early");
    cr_assert_str_eq(got, want);
    cr_assert_eq(terminal_of(&r, "early")->reason, EXO_FR_LENGTH);
    /* it ran only once the runner was Ready */
    int ready_at = -1, first_chunk = -1;
    for (int i = 0; i < r.n; i++) {
        if (ready_at < 0 && r.evs[i].what == EV_STATUS && r.evs[i].status.kind == EXO_RUNNER_READY)
            ready_at = i;
        if (first_chunk < 0 && r.evs[i].what == EV_CHUNK)
            first_chunk = i;
    }
    cr_assert(ready_at >= 0 && first_chunk > ready_at);
    exo_free(got);
    exo_free(want);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}

Test(runner_supervisor, shutdown_during_load_answers_queued_requests)
{
    rec r = {0};
    exo_supervisor *s = spawn(&r);
    exo_runner_load l = {.model_dir = model, .n_threads = 1, .ctx = 512, .warmup_tokens = 64};
    exo_err err = {0};
    exo_gen_request q;
    request(&q, "Once upon a time", 10);
    cr_assert_eq(exo_supervisor_load(s, &l, &err), 0, "%s", err.msg);
    generate(s, "q", &q);
    cr_assert_eq(exo_supervisor_shutdown(s, &err), 0);
    cr_assert_eq(exo_supervisor_wait(s, 10000, NULL, NULL), -1);
    cr_assert_eq(exo_supervisor_status(s)->kind, EXO_RUNNER_SHUTDOWN);
    /* answered: normally before it started; were the Shutdown late, cancelled */
    const exo_chunk *t = terminal_of(&r, "q");
    if (t->kind == EXO_CHUNK_ERROR)
        cr_assert(strstr(t->error, "shut down"), "%s", t->error);
    else
        cr_assert_eq(t->reason, EXO_FR_CANCELLED);
    exo_gen_request_free(&q);
    exo_supervisor_free(s);
    rec_free(&r);
}
