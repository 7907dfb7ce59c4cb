/* Benchmark of the daemon's hot path (driven by bench/bench_api.sh, which
 * starts `exo serve` with stories260K placed on one runner). A plain HTTP/1.1
 * client over sockets + poll; every number is printed next to its peer
 * measured in the same run:
 *
 *   1. 1-token latency: non-streaming POST /bench/chat/completions with
 *      max_tokens 1 on one keep-alive connection. The engine time of each
 *      request is prompt_tokens / prompt_tps from its generation_stats (the
 *      prefill that yields the first token); added = wall - engine, per
 *      request. Peer: the 2 ms target, and GET /node_id on the same
 *      connection (the HTTP floor).
 *   2. Streaming tokens/s (greedy, EOS ignored by the bench family): client
 *      rate between the first and the last content event vs the
 *      generation_tps the runner reports in the `: generation_stats` comment
 *      of the same stream (target >= 0.98), and vs the bare engine
 *      (`exo run --stats`, same prompt, threads and ctx), run interleaved.
 *      Two settings: a short prompt (fast tokens: per-token overhead shows)
 *      and a ~1800-token prompt (each token attends over the long context:
 *      slower, CPU bound). generation_tps is timed around the runner's token
 *      callback (frame encoding, socket write, cancel poll), so the client
 *      keeps up with it by construction; the bare engine is the real peer.
 *      With --runner-pid / --daemon-pid, CPU time per token of each process
 *      (/proc/PID/task/ schedstat) splits the cost between runner and API.
 *   3. Idle SSE: one long stream keeps the single runner busy; N streaming
 *      requests (max_tokens 1) queue behind it and must each get HTTP 200 +
 *      `: keep-alive` within 5 s and nothing else for 2 s; then the long one
 *      is cancelled
 *      (POST /v1/cancel/{id}) and every queued one must end with
 *      `data: [DONE]` and no error event.
 *
 *   bench_api --port P [--host 127.0.0.1] [--model karpathy/stories260K]
 *             [--exo build/exo --model-dir DIR --threads 1 --ctx 8192]
 *             [--latency-n 300] [--warmup 20] [--stream-tokens 2000]
 *             [--deep-tokens 1000] [--deep-reps 200 (0: no deep setting)] [--trials 3]
 *             [--idle-n 1000] [--long-tokens 7000] [--only latency|stream|idle]
 *             [--daemon-pid PID --runner-pid PID]
 *
 * Exit status: 0 when every check passed, 1 when a target or check failed,
 * 2 on a usage or setup error. */
#include "core/clock.h"
#include "core/json_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- options ------------------------------------------------------------------------ */

static const char *g_host = "127.0.0.1";
static int         g_port;
static const char *g_model = "karpathy/stories260K";
static const char *g_exo, *g_model_dir;
static int         g_threads = 1, g_ctx = 8192;
static int         g_lat_n = 300, g_warmup = 20;
static int         g_stream_tokens = 2000, g_deep_tokens = 1000, g_deep_reps = 200, g_trials = 3;
static int         g_idle_n = 1000, g_long_tokens = 7000;
static const char *g_only;
static int         g_daemon_pid, g_runner_pid;
static const char *SHORT_PROMPT = "Once upon a time";

static double now(void) { return exo_clock_seconds(); }

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench_api: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        die("out of memory");
    return p;
}

/* ---- growable byte buffer -------------------------------------------------------------- */

typedef struct buf {
    char  *p;
    size_t len, cap;
} buf;

static void buf_add(buf *b, const void *d, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 512;
        while (c < b->len + n + 1)
            c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_free(buf *b)
{
    free(b->p);
    *b = (buf){0};
}

/* ---- HTTP/1.1 response parser (Content-Length, chunked, or close-delimited) ------------ */

enum { CH_SIZE = -1, CH_CRLF = -2, CH_TRAILER = -3 };

typedef struct resp {
    buf    raw;       /* unparsed input */
    size_t rpos;
    bool   have_head, chunked, conn_close, complete, bad;
    int    status;
    long   clen;      /* -1: none */
    long   chunk;     /* >0 bytes left in the chunk, or CH_* */
    buf    body;      /* decoded body */
    size_t sse_pos;   /* SSE events consumed up to here */
} resp;

static void resp_reset(resp *r)
{
    buf_free(&r->raw);
    buf_free(&r->body);
    memset(r, 0, sizeof *r);
}

static void resp_parse(resp *r)
{
    if (!r->have_head) {
        char *end = r->raw.p ? strstr(r->raw.p, "\r\n\r\n") : NULL;
        if (!end)
            return;
        *end = 0;
        int minor;
        if (sscanf(r->raw.p, "HTTP/1.%d %d", &minor, &r->status) != 2) {
            r->bad = r->complete = true;
            return;
        }
        r->clen = -1;
        for (char *line = strstr(r->raw.p, "\r\n"); line; line = strstr(line, "\r\n")) {
            line += 2;
            if (!strncasecmp(line, "Content-Length:", 15))
                r->clen = strtol(line + 15, NULL, 10);
            else if (!strncasecmp(line, "Transfer-Encoding:", 18) && strstr(line, "chunked"))
                r->chunked = true;
            else if (!strncasecmp(line, "Connection:", 11) && strcasestr(line, "close"))
                r->conn_close = true;
        }
        r->have_head = true;
        r->rpos = (size_t)(end + 4 - r->raw.p);
        r->chunk = CH_SIZE;
        if (!r->chunked && r->clen < 0)
            r->conn_close = true;
    }
    while (!r->complete && r->rpos < r->raw.len) {
        char  *p = r->raw.p + r->rpos;
        size_t avail = r->raw.len - r->rpos;
        if (!r->chunked) {
            size_t take = avail;
            if (r->clen >= 0 && take > (size_t)r->clen - r->body.len)
                take = (size_t)r->clen - r->body.len;
            buf_add(&r->body, p, take);
            r->rpos += take;
            if (r->clen >= 0 && r->body.len == (size_t)r->clen)
                r->complete = true;
            break;
        }
        if (r->chunk > 0) {
            size_t take = avail < (size_t)r->chunk ? avail : (size_t)r->chunk;
            buf_add(&r->body, p, take);
            r->rpos += take;
            r->chunk -= (long)take;
            if (!r->chunk)
                r->chunk = CH_CRLF;
            continue;
        }
        if (r->chunk == CH_CRLF) {
            if (avail < 2)
                break;
            r->rpos += 2;
            r->chunk = CH_SIZE;
            continue;
        }
        char *eol = memmem(p, avail, "\r\n", 2);
        if (!eol)
            break;
        r->rpos += (size_t)(eol + 2 - p);
        if (r->chunk == CH_TRAILER) {
            if (eol == p)
                r->complete = true;
            continue;
        }
        long n = strtol(p, NULL, 16);
        r->chunk = n > 0 ? n : CH_TRAILER;
    }
    if (r->rpos == r->raw.len) {
        r->raw.len = r->rpos = 0;
        if (r->raw.p)
            r->raw.p[0] = 0;
    }
}

static void resp_feed(resp *r, const char *d, size_t n)
{
    buf_add(&r->raw, d, n);
    resp_parse(r);
}

/* End of input: a close-delimited body is complete; anything else is cut. */
static void resp_eof(resp *r)
{
    if (r->have_head && !r->chunked && r->clen < 0)
        r->complete = true;
}

/* Next complete SSE event (text up to a blank line), NUL-terminated in place. */
static char *sse_next(resp *r)
{
    if (r->sse_pos >= r->body.len)
        return NULL;
    char *s = r->body.p + r->sse_pos;
    char *e = strstr(s, "\n\n");
    if (!e)
        return NULL;
    *e = 0;
    r->sse_pos = (size_t)(e + 2 - r->body.p);
    return s;
}

/* ---- sockets -------------------------------------------------------------------------- */

/* Blocking connect, at most timeout_s (0: the kernel's) when the server's
 * accept queue is full; TCP_NODELAY. */
static int tcp_connect_timeout(double timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (timeout_s > 0) {
        struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect() on Linux */
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, g_host, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int tcp_connect(void) { return tcp_connect_timeout(0); }

static int send_all(int fd, const char *d, size_t n)
{
    while (n) {
        ssize_t k = send(fd, d, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        d += k;
        n -= (size_t)k;
    }
    return 0;
}

static void build_request(buf *out, const char *method, const char *path, const char *body)
{
    char head[512];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: */*\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, g_host, g_port, blen);
    out->len = 0;
    buf_add(out, head, (size_t)n);
    if (blen)
        buf_add(out, body, blen);
}

/* A keep-alive connection for sequential requests. */
typedef struct client {
    int fd;
    int reconnects;
} client;

typedef void (*event_fn)(void *ctx, char *ev, double t);

/* Sends one request and reads its whole response; SSE events are handed to
 * on_event as they arrive (with the time of the read that completed them).
 * Returns 0 when a complete response arrived. */
static int client_do(client *c, const char *method, const char *path, const char *body, resp *r,
                     event_fn on_event, void *ctx)
{
    buf req = {0};
    build_request(&req, method, path, body);
    resp_reset(r);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->fd < 0) {
            if ((c->fd = tcp_connect()) < 0) {
                buf_free(&req);
                return -1;
            }
            c->reconnects++;
        }
        if (send_all(c->fd, req.p, req.len) == 0)
            break;
        close(c->fd); /* the server closed the kept-alive connection: once more */
        c->fd = -1;
        if (attempt) {
            buf_free(&req);
            return -1;
        }
    }
    buf_free(&req);
    char tmp[65536];
    while (!r->complete) {
        ssize_t k = recv(c->fd, tmp, sizeof tmp, 0);
        if (k < 0 && errno == EINTR)
            continue;
        double t = now();
        if (k <= 0) {
            resp_eof(r);
            close(c->fd);
            c->fd = -1;
            break;
        }
        resp_feed(r, tmp, (size_t)k);
        if (on_event)
            for (char *ev; (ev = sse_next(r));)
                on_event(ctx, ev, t);
    }
    if (r->complete && r->conn_close && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    return r->complete && !r->bad ? 0 : -1;
}

/* ---- statistics ----------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* q-quantile (nearest rank) of v[0..n); sorts v. */
static double quantile(double *v, int n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * n + 0.5) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static char *chat_body(const char *prompt, int max_tokens, bool stream)
{
    json_t *j = json_pack("{s:s, s:[{s:s, s:s}], s:i, s:f, s:b}", "model", g_model, "messages",
                          "role", "user", "content", prompt, "max_tokens", max_tokens,
                          "temperature", 0.0, "stream", stream);
    char *s = exo_json_dumps(j, JSON_COMPACT); /* jansson allocates through json_util.c's blocks */
    json_decref(j);
    return s;
}

/* ---- 1. latency ----------------------------------------------------------------------- */

static int bench_latency(void)
{
    client c = {-1, 0};
    resp r = {0};
    char *body = chat_body(SHORT_PROMPT, 1, false);
    int n = g_lat_n;
    double *wall = calloc((size_t)n, sizeof *wall), *eng = calloc((size_t)n, sizeof *eng),
           *add = calloc((size_t)n, sizeof *add);
    int ok = 0, failed = 0, prompt_tokens = 0;
    for (int i = 0; i < g_warmup + n; i++) {
        double t0 = now();
        int rc = client_do(&c, "POST", "/bench/chat/completions", body, &r, NULL, NULL);
        double t = now() - t0;
        json_t *j = rc == 0 && r.status == 200 ? json_loadb(r.body.p, r.body.len, 0, NULL) : NULL;
        json_t *st = json_object_get(j, "generation_stats");
        double ptps = json_number_value(json_object_get(st, "prompt_tps"));
        int pt = (int)json_integer_value(json_object_get(st, "prompt_tokens"));
        int ct = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        if (!j || ptps <= 0 || pt <= 0 || ct != 1) {
            if (failed++ < 3)
                fprintf(stderr, "latency: request %d failed (rc %d, HTTP %d): %.300s\n", i, rc,
                        r.status, r.body.p ? r.body.p : "");
        } else if (i >= g_warmup) {
            wall[ok] = t;
            eng[ok] = pt / ptps;
            add[ok] = t - eng[ok];
            ok++;
            prompt_tokens = pt;
        }
        json_decref(j);
    }
    /* HTTP floor: the cheapest route on the same connection */
    double *fl = calloc((size_t)n, sizeof *fl);
    int nf = 0;
    for (int i = 0; i < g_warmup + n; i++) {
        double t0 = now();
        int rc = client_do(&c, "GET", "/node_id", NULL, &r, NULL, NULL);
        double t = now() - t0;
        if (rc == 0 && r.status == 200 && i >= g_warmup)
            fl[nf++] = t;
    }
    int reconnects = c.reconnects - 1;
    if (c.fd >= 0)
        close(c.fd);
    resp_reset(&r);
    free(body);

    double w50 = quantile(wall, ok, 0.5), w90 = quantile(wall, ok, 0.9), w99 = quantile(wall, ok, 0.99);
    double e50 = quantile(eng, ok, 0.5), e90 = quantile(eng, ok, 0.9);
    double a50 = quantile(add, ok, 0.5), a90 = quantile(add, ok, 0.9), a99 = quantile(add, ok, 0.99);
    double f50 = quantile(fl, nf, 0.5);
    bool pass = ok == n && a50 < 2e-3;
    printf("\n1. 1-token latency: %d x POST /bench/chat/completions (max_tokens 1, %d prompt tokens), "
           "one keep-alive connection (%d reconnects), after %d warm-up\n",
           ok, prompt_tokens, reconnects, g_warmup);
    printf("   client wall       median %7.3f ms   p90 %7.3f ms   p99 %7.3f ms\n", w50 * 1e3, w90 * 1e3, w99 * 1e3);
    printf("   engine (prefill)  median %7.3f ms   p90 %7.3f ms   (prompt_tokens / prompt_tps)\n", e50 * 1e3, e90 * 1e3);
    printf("   added = wall - engine, per request:\n");
    printf("                     median %7.3f ms   p90 %7.3f ms   p99 %7.3f ms\n", a50 * 1e3, a90 * 1e3, a99 * 1e3);
    printf("   HTTP floor        median %7.3f ms   (GET /node_id, same connection; %d requests)\n", f50 * 1e3, nf);
    printf("   ratio added/2ms target = %.3f   (median; p90 %.3f)   %s%s\n", a50 / 2e-3, a90 / 2e-3,
           pass ? "PASS" : "FAIL", failed ? "  (some requests failed)" : "");
    free(wall);
    free(eng);
    free(add);
    free(fl);
    return pass ? 0 : 1;
}

/* ---- 2. streaming throughput ------------------------------------------------------------ */

/* CPU time of every thread of a process, in seconds (sum of
 * /proc/PID/task/TID/schedstat run times); negative when unavailable. */
static double proc_cpu_seconds(int pid)
{
    if (pid <= 0)
        return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    unsigned long long ns = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char p2[320];
        snprintf(p2, sizeof p2, "/proc/%d/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(p2, "r");
        unsigned long long run = 0;
        if (f) {
            if (fscanf(f, "%llu", &run) == 1)
                ns += run;
            fclose(f);
        }
    }
    closedir(d);
    return (double)ns * 1e-9;
}

typedef struct stream_obs {
    int    content, data_events, errors, keepalives;
    double t_first, t_last, t_start;
    bool   done;
    double gen_tps, prompt_tps;
    int    prompt_tokens, gen_tokens;
    char   id[128];
    char   finish[32];
    char   last_error[256];
    bool   sample_cpu;            /* read the daemon's and runner's CPU at the first content event */
    double cpu_d_first, cpu_r_first;
} stream_obs;

static double proc_cpu_seconds(int pid);

static void parse_stats_comment(stream_obs *o, const char *ev)
{
    const char *js = strchr(ev, '{');
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    o->gen_tps = json_number_value(json_object_get(j, "generation_tps"));
    o->prompt_tps = json_number_value(json_object_get(j, "prompt_tps"));
    o->prompt_tokens = (int)json_integer_value(json_object_get(j, "prompt_tokens"));
    o->gen_tokens = (int)json_integer_value(json_object_get(j, "generation_tokens"));
    json_decref(j);
}

/* Classifies one SSE event of an OpenAI chat stream. */
static void stream_event(void *ctx, char *ev, double t)
{
    stream_obs *o = ctx;
    if (!strncmp(ev, ": keep-alive", 12)) {
        o->keepalives++;
    } else if (!strncmp(ev, ": generation_stats", 18)) {
        parse_stats_comment(o, ev);
    } else if (ev[0] == ':') {
        /* prefill progress */
    } else if (!strncmp(ev, "data: [DONE]", 12)) {
        o->done = true;
    } else if (!strncmp(ev, "data: {\"error\"", 14)) {
        o->errors++;
        snprintf(o->last_error, sizeof o->last_error, "%s", ev);
    } else if (!strncmp(ev, "data: ", 6)) {
        o->data_events++;
        if (!o->id[0]) {
            const char *p = strstr(ev, "\"id\":\"");
            if (p) {
                p += 6;
                size_t k = strcspn(p, "\"");
                if (k < sizeof o->id) {
                    memcpy(o->id, p, k);
                    o->id[k] = 0;
                }
            }
        }
        const char *fr = strstr(ev, "\"finish_reason\":\"");
        if (fr) {
            fr += 17;
            size_t k = strcspn(fr, "\"");
            snprintf(o->finish, sizeof o->finish, "%.*s", (int)k, fr);
        }
        if (strstr(ev, "\"delta\":{\"role\":\"assistant\",\"content\":")) {
            if (!o->content++) {
                o->t_first = t;
                if (o->sample_cpu) {
                    o->cpu_d_first = proc_cpu_seconds(g_daemon_pid);
                    o->cpu_r_first = proc_cpu_seconds(g_runner_pid);
                }
            }
            o->t_last = t;
        }
    } else {
        o->errors++;
        snprintf(o->last_error, sizeof o->last_error, "unexpected event: %.200s", ev);
    }
}

static double stream_client_tps(const stream_obs *o)
{
    return o->content > 1 && o->t_last > o->t_first ? (o->content - 1) / (o->t_last - o->t_first) : 0;
}

/* Bare engine: `exo run --stats` with the same prompt, settings and token
 * count; returns its decode tok/s (0 when unavailable). */
static double bare_engine_tps(const char *prompt, int max_tokens, int *prompt_tokens)
{
    if (!g_exo || !g_model_dir)
        return 0;
    int pfd[2];
    if (pipe(pfd))
        return 0;
    char mt[16], th[16], cx[16];
    snprintf(mt, sizeof mt, "%d", max_tokens);
    snprintf(th, sizeof th, "%d", g_threads);
    snprintf(cx, sizeof cx, "%d", g_ctx);
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        dup2(dn, 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        char *argv[] = {(char *)g_exo, "run", (char *)g_model_dir, "--chat", (char *)prompt,
                        "--max-tokens", mt, "--ignore-eos", "--stats", "--temperature", "0",
                        "--threads", th, "--ctx", cx, NULL};
        execv(g_exo, argv);
        _exit(127);
    }
    close(pfd[1]);
    buf out = {0};
    char tmp[4096];
    ssize_t k;
    while ((k = read(pfd[0], tmp, sizeof tmp)) > 0)
        buf_add(&out, tmp, (size_t)k);
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    double tps = 0, ptps, ps, gs;
    int pt = 0, gt = 0;
    const char *line = out.p ? strstr(out.p, "prompt ") : NULL;
    if (!line || sscanf(line, "prompt %d tokens in %lf s (%lf tok/s), generated %d tokens in %lf s (%lf tok/s)",
                        &pt, &ps, &ptps, &gt, &gs, &tps) != 6 || gt != max_tokens) {
        fprintf(stderr, "stream: bare engine run failed (status %d): %.300s\n", st, out.p ? out.p : "");
        tps = 0;
    }
    *prompt_tokens = pt;
    buf_free(&out);
    return tps;
}

static int stream_setting(const char *name, const char *prompt, int max_tokens)
{
    char *body = chat_body(prompt, max_tokens, true);
    double ratio[16] = {0}, best_client = 0, best_engine = 0, best_bare = 0;
    int nr = 0, bare_pt = 0, prompt_tokens = 0, fails = 0, min_events = 1 << 30;
    int trials = g_trials < 16 ? g_trials : 16;
    double cpu_runner = 1e9, cpu_daemon = 1e9; /* per generated token, best trial */
    for (int t = 0; t < trials; t++) {
        client c = {-1, 0};
        resp r = {0};
        stream_obs o = {.sample_cpu = true};
        int rc = client_do(&c, "POST", "/bench/chat/completions", body, &r, stream_event, &o);
        /* CPU from the first content event to the end: the decode of content - 1 tokens */
        double d0 = o.cpu_d_first, r0 = o.cpu_r_first;
        double d1 = proc_cpu_seconds(g_daemon_pid), r1 = proc_cpu_seconds(g_runner_pid);
        if (c.fd >= 0)
            close(c.fd);
        double ct = stream_client_tps(&o);
        if (rc || r.status != 200 || !o.done || o.errors || o.gen_tokens != max_tokens || ct <= 0 ||
            o.gen_tps <= 0) {
            fprintf(stderr, "stream %s: trial %d failed (rc %d, HTTP %d, done %d, errors %d, tokens %d): %s\n",
                    name, t, rc, r.status, o.done, o.errors, o.gen_tokens, o.last_error);
            fails++;
        } else {
            ratio[nr++] = ct / o.gen_tps;
            prompt_tokens = o.prompt_tokens;
            if (ct > best_client)
                best_client = ct;
            if (o.gen_tps > best_engine)
                best_engine = o.gen_tps;
            if (o.content < min_events)
                min_events = o.content;
            int nt = o.content - 1;
            if (g_daemon_pid && d0 >= 0 && d1 >= d0 && (d1 - d0) / nt < cpu_daemon)
                cpu_daemon = (d1 - d0) / nt;
            if (g_runner_pid && r0 >= 0 && r1 >= r0 && (r1 - r0) / nt < cpu_runner)
                cpu_runner = (r1 - r0) / nt;
        }
        resp_reset(&r);
        double b = bare_engine_tps(prompt, max_tokens, &bare_pt);
        if (b > best_bare)
            best_bare = b;
    }
    free(body);
    double rmed = quantile(ratio, nr, 0.5), rmin = nr ? ratio[0] : 0, rmax = nr ? ratio[nr - 1] : 0;
    bool pass = !fails && nr && rmed >= 0.98;
    bool bare_pass = best_bare <= 0 || best_client / best_bare >= 0.98;
    printf("   %-6s %4d prompt + %4d generated tokens (>= %d content events), best of %d:\n", name,
           prompt_tokens, max_tokens, nr ? min_events : 0, trials);
    printf("          client %8.1f tok/s   engine in daemon (generation_tps) %8.1f tok/s", best_client,
           best_engine);
    if (best_bare > 0)
        printf("   bare engine (exo run) %8.1f tok/s%s", best_bare,
               bare_pt && bare_pt != prompt_tokens ? " (PROMPT TOKENS DIFFER)" : "");
    printf("\n          client/generation_tps %.3f (median of trials, range %.3f-%.3f)  target >= 0.98 %s\n",
           rmed, rmin, rmax, pass ? "PASS" : "FAIL");
    if (best_bare > 0 && best_client > 0)
        printf("          client/bare engine    %.3f (best/best; generation_tps/bare %.3f)  target >= 0.98 %s"
               "   cost per token over bare: %.1f us\n",
               best_client / best_bare, best_engine / best_bare, bare_pass ? "PASS" : "FAIL",
               (1 / best_client - 1 / best_bare) * 1e6);
    if (nr && min_events < max_tokens) /* e.g. byte tokens of one UTF-8 character */
        printf("          note: %d content events for %d tokens (the detokenizer sends incomplete "
               "UTF-8 along with the next token), so the client rate, (events - 1) / time, reads "
               "up to %.1f%% low\n",
               min_events, max_tokens, 100 * (1 - (min_events - 1.0) / (max_tokens - 1.0)));
    if (cpu_runner < 1e9 || cpu_daemon < 1e9) {
        printf("          CPU per token:");
        if (cpu_runner < 1e9)
            printf(" runner %.1f us", cpu_runner * 1e6);
        if (cpu_runner < 1e9 && best_bare > 0)
            printf(" vs bare engine decode %.1f us -> runner overhead %.1f us;", 1e6 / best_bare,
                   cpu_runner * 1e6 - 1e6 / best_bare);
        if (cpu_daemon < 1e9)
            printf(" daemon (API + node) %.1f us", cpu_daemon * 1e6);
        printf("  (first to last token, best trial)\n");
    }
    return pass && bare_pass ? 0 : 1;
}

static int bench_stream(void)
{
    printf("\n2. Streaming tokens/s: POST /bench/chat/completions stream=true, greedy; client rate between "
           "the first and the last content event vs generation_tps of the same stream%s\n",
           g_exo ? ", and vs the bare engine run interleaved" : "");
    int rc = stream_setting("short", SHORT_PROMPT, g_stream_tokens);
    if (!g_deep_reps || !g_deep_tokens) /* --deep-reps 0: the short setting only */
        return rc;
    buf deep = {0};
    for (int i = 0; i < g_deep_reps; i++)
        buf_add(&deep, "Lily had a big red ball. ", 25);
    rc |= stream_setting("deep", deep.p, g_deep_tokens);
    buf_free(&deep);
    return rc;
}

/* ---- 3. idle SSE connections ----------------------------------------------------------- */

typedef struct idle_conn {
    int        fd;
    resp       r;
    stream_obs o;
    double     t_head, t_ka, t_done;
    bool       early;  /* something other than keep-alive before the cancel */
    bool       closed; /* EOF or error seen */
    int        sys_errno;
} idle_conn;

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* Reads whatever is there; returns false when the connection is finished. */
static bool idle_read(idle_conn *c, bool cancelled)
{
    char tmp[16384];
    for (;;) {
        ssize_t k = recv(c->fd, tmp, sizeof tmp, 0);
        double t = now();
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (k <= 0) {
            if (k < 0)
                c->sys_errno = errno;
            resp_eof(&c->r);
            c->closed = true;
            return false;
        }
        bool had_head = c->r.have_head;
        resp_feed(&c->r, tmp, (size_t)k);
        if (!had_head && c->r.have_head)
            c->t_head = t;
        for (char *ev; (ev = sse_next(&c->r));) {
            int before = c->o.keepalives;
            stream_event(&c->o, ev, t);
            if (c->o.keepalives > before) {
                if (!c->t_ka)
                    c->t_ka = t;
            } else if (!cancelled) {
                c->early = true;
            }
        }
        if (c->o.done && !c->t_done)
            c->t_done = t;
        if (c->r.complete)
            return false;
    }
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int bench_idle(void)
{
    int n = g_idle_n;
    raise_nofile();
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)n + 64)
        die("RLIMIT_NOFILE %llu is too small for %d connections", (unsigned long long)rl.rlim_cur, n);

    /* the long stream that keeps the runner busy */
    idle_conn *lc = calloc(1, sizeof *lc);
    char *lbody = chat_body(SHORT_PROMPT, g_long_tokens, true);
    buf req = {0};
    build_request(&req, "POST", "/bench/chat/completions", lbody);
    free(lbody);
    lc->fd = tcp_connect();
    if (lc->fd < 0 || send_all(lc->fd, req.p, req.len))
        die("idle: cannot start the long stream");
    double t_long = now();
    set_nonblock(lc->fd);
    while (!lc->o.id[0] || lc->o.content < 1) {
        struct pollfd p = {lc->fd, POLLIN, 0};
        if (poll(&p, 1, 10000) <= 0 || !idle_read(lc, true) || now() - t_long > 20)
            die("idle: the long stream did not start (HTTP %d): %s", lc->r.status, lc->o.last_error);
    }

    /* N idle streams queued behind it */
    char *sbody = chat_body(SHORT_PROMPT, 1, true);
    build_request(&req, "POST", "/bench/chat/completions", sbody);
    free(sbody);
    idle_conn *cs = calloc((size_t)n, sizeof *cs);
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *slot = calloc((size_t)n + 1, sizeof *slot);
    const double open_timeout = 5, hold = 2.0, drain_timeout = 60;
    int connect_fail = 0;
    double t0 = now();
    for (int i = 0; i < n; i++) {
        idle_conn *c = &cs[i];
        /* past the open timeout (server not accepting) the rest count as failures */
        c->fd = now() - t0 < open_timeout ? tcp_connect_timeout(2) : -1;
        if (c->fd < 0 || send_all(c->fd, req.p, req.len)) {
            c->sys_errno = errno;
            if (c->fd >= 0)
                close(c->fd);
            c->fd = -1;
            c->closed = true;
            connect_fail++;
            continue;
        }
        set_nonblock(c->fd);
    }
    double t_sent = now() - t0;

    /* poll loop: phase 0 until every stream has its headers + keep-alive,
     * phase 1 a quiet hold, phase 2 after the cancel until all are done */
    double t_open_all = -1, t_cancel = 0, t_hold_end = 0;
    int phase = 0, cancel_status = 0;
    for (;;) {
        double t = now();
        int opened = 0, finished = 0, nfd = 0;
        for (int i = 0; i < n; i++) {
            idle_conn *c = &cs[i];
            opened += c->t_head > 0 && c->t_ka > 0;
            if (c->closed || c->r.complete) {
                finished++;
                continue;
            }
            slot[nfd] = i;
            pf[nfd++] = (struct pollfd){c->fd, POLLIN, 0};
        }
        bool long_live = !lc->closed && !lc->r.complete;
        if (phase == 0 && (opened + connect_fail == n || t - t0 > open_timeout)) {
            t_open_all = opened + connect_fail == n ? t - t0 : -1;
            phase = 1;
            t_hold_end = t + hold;
        }
        if (phase == 1 && t >= t_hold_end) {
            if (!long_live)
                fprintf(stderr, "idle: the long stream ended before the cancel: the queued streams did not "
                                "stay idle (raise --long-tokens)\n");
            /* cancel the long request */
            client cc = {-1, 0};
            resp cr = {0};
            char path[192];
            snprintf(path, sizeof path, "/v1/cancel/%s", lc->o.id);
            t_cancel = now();
            client_do(&cc, "POST", path, "", &cr, NULL, NULL);
            cancel_status = cr.status;
            if (cr.status != 200)
                fprintf(stderr, "idle: cancel answered HTTP %d: %.300s\n", cr.status, cr.body.p ? cr.body.p : "");
            if (cc.fd >= 0)
                close(cc.fd);
            resp_reset(&cr);
            phase = 2;
        }
        if (phase == 2 && finished == n && !long_live)
            break;
        if (phase == 2 && t - t_cancel > drain_timeout)
            break;
        if (long_live)
            {
            slot[nfd] = -1;
            pf[nfd++] = (struct pollfd){lc->fd, POLLIN, 0};
        }
        int k = poll(pf, (nfds_t)nfd, 50);
        if (k < 0 && errno != EINTR)
            die("poll: %s", strerror(errno));
        for (int i = 0; i < nfd && k > 0; i++) {
            if (!pf[i].revents)
                continue;
            idle_conn *c = slot[i] < 0 ? lc : &cs[slot[i]];
            idle_read(c, phase == 2);
        }
    }
    double t_end = now();

    /* verdict per connection */
    int n_ok = 0, n_head = 0, n_ka = 0, n_early = 0, n_status = 0, n_err_ev = 0, n_no_done = 0,
        n_cut = 0, n_content = 0;
    double last_open = 0, last_done = 0;
    for (int i = 0; i < n; i++) {
        idle_conn *c = &cs[i];
        n_head += c->t_head > 0;
        n_ka += c->t_ka > 0;
        if (c->t_ka > 0 && c->t_ka - t0 > last_open)
            last_open = c->t_ka - t0;
        if (c->t_done > 0 && c->t_done - t_cancel > last_done)
            last_done = c->t_done - t_cancel;
        n_early += c->early;
        n_status += c->r.have_head && c->r.status != 200;
        n_err_ev += c->o.errors > 0;
        n_no_done += !c->o.done;
        n_cut += !c->r.complete;
        n_content += c->o.content == 1;
        if (c->t_head > 0 && c->t_ka > 0 && !c->early && c->r.status == 200 && !c->o.errors && c->o.done &&
            c->r.complete && c->o.gen_tokens == 1)
            n_ok++;
        if (i < 3 && (c->o.errors || !c->o.done))
            fprintf(stderr, "idle: stream %d: HTTP %d, done %d, errno %d, %s\n", i, c->r.status, c->o.done,
                    c->sys_errno, c->o.last_error);
        if (c->fd >= 0)
            close(c->fd);
        resp_reset(&c->r);
    }
    bool long_ok = lc->o.done && !lc->o.errors;
    int long_tokens = lc->o.content;
    char long_finish[32];
    snprintf(long_finish, sizeof long_finish, "%s", lc->o.finish);
    if (lc->fd >= 0)
        close(lc->fd);
    resp_reset(&lc->r);
    int errors = n - n_ok + !long_ok + (cancel_status != 200);
    printf("\n3. Idle SSE: %d streaming requests (max_tokens 1) queued behind one %d-token stream, "
           "held %.1f s, then the long one cancelled\n", n, g_long_tokens, hold);
    printf("   opened    %d/%d got HTTP 200 + ': keep-alive' (headers %d), %d connect/send failures; "
           "requests sent in %.3f s, all open after %.3f s (last keep-alive at %.3f s)\n",
           n_ka, n, n_head, connect_fail, t_sent, t_open_all, last_open);
    printf("   idle      %d received anything but keep-alive before the cancel\n", n_early);
    printf("   cancel    HTTP %d; the long stream sent %d tokens in all and ended %s (finish_reason \"%s\")\n",
           cancel_status, long_tokens, long_ok ? "with [DONE]" : "WITHOUT [DONE] or with an error",
           long_finish);
    printf("   drained   %d/%d ended with one token + [DONE], last %.3f s after the cancel "
           "(%.0f requests/s); non-200 %d, error events %d, no [DONE] %d, cut %d\n",
           n_ok, n, last_done, last_done > 0 ? n_ok / last_done : 0, n_status, n_err_ev, n_no_done, n_cut);
    printf("   errors    %d   %s   (total %.1f s)\n", errors, errors ? "FAIL" : "PASS", t_end - t0);
    (void)n_content;
    buf_free(&req);
    free(cs);
    free(pf);
    free(slot);
    free(lc);
    return errors ? 1 : 0;
}

/* ---- main ----------------------------------------------------------------------------- */

static int int_arg(const char *name, const char *v)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1 << 24)
        die("%s: bad number '%s'", name, v);
    return (int)x;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            die("usage: see bench/bench_api.c (missing value after %s)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--port")) g_port = int_arg(a, v);
        else if (!strcmp(a, "--host")) g_host = v;
        else if (!strcmp(a, "--model")) g_model = v;
        else if (!strcmp(a, "--exo")) g_exo = v;
        else if (!strcmp(a, "--model-dir")) g_model_dir = v;
        else if (!strcmp(a, "--threads")) g_threads = int_arg(a, v);
        else if (!strcmp(a, "--ctx")) g_ctx = int_arg(a, v);
        else if (!strcmp(a, "--latency-n")) g_lat_n = int_arg(a, v);
        else if (!strcmp(a, "--warmup")) g_warmup = int_arg(a, v);
        else if (!strcmp(a, "--stream-tokens")) g_stream_tokens = int_arg(a, v);
        else if (!strcmp(a, "--deep-tokens")) g_deep_tokens = int_arg(a, v);
        else if (!strcmp(a, "--deep-reps")) g_deep_reps = int_arg(a, v);
        else if (!strcmp(a, "--trials")) g_trials = int_arg(a, v);
        else if (!strcmp(a, "--idle-n")) g_idle_n = int_arg(a, v);
        else if (!strcmp(a, "--long-tokens")) g_long_tokens = int_arg(a, v);
        else if (!strcmp(a, "--only")) g_only = v;
        else if (!strcmp(a, "--daemon-pid")) g_daemon_pid = int_arg(a, v);
        else if (!strcmp(a, "--runner-pid")) g_runner_pid = int_arg(a, v);
        else die("unknown option %s", a);
    }
    if (!g_port)
        die("usage: bench_api --port P [options] (see bench/bench_api.c)");
    signal(SIGPIPE, SIG_IGN);
    double la[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3)
            la[0] = la[1] = la[2] = 0;
        fclose(f);
    }
    printf("exo API bench: %s on http://%s:%d, runner --threads %d --ctx %d; %ld CPUs, load %.2f %.2f %.2f\n",
           g_model, g_host, g_port, g_threads, g_ctx, sysconf(_SC_NPROCESSORS_ONLN), la[0], la[1], la[2]);
    int rc = 0;
    double t0 = now();
    if (!g_only || !strcmp(g_only, "latency"))
        rc |= bench_latency();
    if (!g_only || !strcmp(g_only, "stream"))
        rc |= bench_stream();
    if (!g_only || !strcmp(g_only, "idle"))
        rc |= bench_idle();
    printf("\n%s (%.1f s)\n", rc ? "SOME TARGETS OR CHECKS FAILED" : "all targets met", now() - t0);
    return rc;
}
