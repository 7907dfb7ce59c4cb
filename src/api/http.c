/* libmicrohttpd wrapper: routing, body limits, CORS, and producer-fed
 * streaming responses (see http.h for the contract).
 *
 * Stream life cycle. A stream is shared by three owners, each holding a
 * reference: the request context (dropped when MHD reports the request
 * complete), the MHD response's content reader (dropped by its free
 * callback), and the producer (dropped by exo_http_stream_release). Its
 * state is guarded by its own mutex. The connection is suspended whenever
 * the stream has nothing to send; whoever flips `suspended` from true to
 * false under the mutex, and only they, calls MHD_resume_connection (outside
 * the mutex), so a connection is resumed exactly once per suspension.
 * MHD_suspend_connection is called only on MHD threads (the access handler
 * and the content reader), as MHD requires.
 *
 * Deadlines. MHD's own timeout only measures inactivity, which a client
 * trickling a byte every few seconds never shows. So every connection is
 * tracked (MHD's connection notifications) with the time by which its next
 * step must be done: headers (or, on a kept-alive connection, the next
 * request) within header_timeout_s, then the body within body_timeout_s.
 * The watcher thread shuts down the socket of a connection past its
 * deadline, and MHD closes it as a peer hang-up. A tracker is unlinked,
 * under the server mutex, before MHD closes its socket, so the watcher never
 * shuts down a descriptor that has been reused.
 *
 * Memory. Bodies are charged to the server's budget when their length is
 * known (before a byte of them is read) or as they arrive (chunked), and per
 * client-address bucket, so one address cannot take more than its share;
 * the handler's thread charges its JSON parse to the same budget. A body is
 * freed, and paid back, as soon as its handler returns. */
#include "api/http.h"

#include "core/sbuf.h"
#include "core/alloc.h"
#include "core/budget.h"
#include "core/clock.h"
#include "core/json_util.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_PARAMS 8
#define CLIENT_BUCKETS 1024 /* client addresses hash into these for their memory share */
/* Bodies over this are "large" and may fill only 3/4 of the budget, so a
 * flood of large bodies from many addresses leaves room for ordinary
 * requests (a chat request is a few KiB). */
#define SMALL_BODY ((size_t)64 << 10)
#define RETRY_AFTER_S "2"

/* One per open connection (see "Deadlines" above). */
typedef struct conn_track {
    struct conn_track *prev, *next;
    int      fd;
    unsigned client;   /* bucket of the peer address */
    double   deadline; /* 0: none (a handler or a stream has it) */
} conn_track;

typedef struct route {
    char *method;
    char *pattern;
    exo_http_handler h;
    void *ud;
} route;

struct exo_http_server {
    exo_http_config   cfg;
    struct MHD_Daemon *mhd;
    route            *routes;
    int               n_routes;
    pthread_mutex_t   mtx; /* guards the stream list and `stopping` */
    exo_http_stream  *streams;
    int               n_streams;
    bool              stopping;
    pthread_t         watcher;
    bool              watcher_running;
    pthread_cond_t    wake;
    /* hostile clients (guarded by mtx, but for the budget) */
    exo_budget        memory;
    size_t            client_share;
    size_t            client_bytes[CLIENT_BUCKETS];
    conn_track       *tracked;
    exo_http_stats    stats;
};

struct exo_http_stream {
    exo_http_server       *srv;
    pthread_mutex_t        mtx;
    int                    refs;
    struct MHD_Connection *conn; /* NULL once the request completed */
    exo_http_close_fn      on_close;
    void                  *ud;
    /* response */
    bool     started, sse, fixed, ended, queued;
    int      status;
    char    *ctype;
    exo_sbuf buf;
    size_t   rpos;
    /* connection state */
    bool     suspended, gone, closed, keepalive_due;
    bool     in_cb;        /* on_close is running (on cb_thread) */
    pthread_t cb_thread;
    pthread_cond_t cb_done;
    double   last_out;
    exo_http_stream *prev, *next; /* server list */
};

struct exo_http_request {
    exo_http_server       *srv;
    struct MHD_Connection *conn;
    conn_track            *track;
    const char            *method;
    char                  *path;
    exo_sbuf               body;
    size_t                 charged; /* body bytes charged to the budget */
    bool                   handled;
    bool                   answered_early; /* refused before the body (see admit) */
    int                    refusal;        /* answered once the body is drained */
    char                   refusal_msg[128];
    int                    n_params;
    char                  *pnames[MAX_PARAMS], *pvals[MAX_PARAMS];
    /* immediate response */
    bool     responded;
    int      status;
    char    *ctype;
    char    *resp;
    size_t   resp_len;
    exo_http_stream *stream;
};

/* ---- streams: references and resumption ---------------------------------- */

static void stream_unref(exo_http_stream *s)
{
    pthread_mutex_lock(&s->mtx);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mtx);
    if (left)
        return;
    pthread_mutex_destroy(&s->mtx);
    pthread_cond_destroy(&s->cb_done);
    exo_sbuf_free(&s->buf);
    exo_free(s->ctype);
    exo_free(s);
}

/* Call with s->mtx held; returns the connection to resume after unlocking. */
static struct MHD_Connection *take_resume(exo_http_stream *s)
{
    if (!s->suspended || !s->conn)
        return NULL;
    s->suspended = false;
    return s->conn;
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* True if the peer has closed its end (EOF on a non-blocking peek). */
static bool peer_closed(struct MHD_Connection *c)
{
    int fd = conn_fd(c);
    if (fd < 0)
        return false;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- helpers -------------------------------------------------------------- */

static void add_cors(struct MHD_Response *r)
{
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
}

static enum MHD_Result queue_buffer(struct MHD_Connection *c, int status, const char *ctype,
                                    const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    if (ctype)
        MHD_add_response_header(r, "Content-Type", ctype);
    add_cors(r);
    if (status == 503) /* every 503 here is a momentary shortage */
        MHD_add_response_header(r, "Retry-After", RETRY_AFTER_S);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static char *default_error(const char *path, int status, const char *msg)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_sbuf_puts(&b, "{\"error\":{\"message\":");
    exo_sbuf_json_str(&b, msg);
    exo_sbuf_printf(&b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                    status >= 500 ? "server_error" : "invalid_request_error", status);
    return exo_sbuf_take(&b);
}

static enum MHD_Result queue_error(exo_http_server *srv, struct MHD_Connection *c, const char *path,
                                   int status, const char *msg)
{
    char *body = srv->cfg.error_body(path, status, msg);
    enum MHD_Result r = queue_buffer(c, status, "application/json", body, strlen(body));
    exo_free(body);
    return r;
}

/* ---- hostile clients: tracking, budgets, framing, access ------------------------ */

static unsigned client_bucket(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const unsigned char *p = NULL;
    size_t n = 0;
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET) {
        p = (const unsigned char *)&((const struct sockaddr_in *)ci->client_addr)->sin_addr;
        n = 4;
    } else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6) {
        p = (const unsigned char *)&((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr;
        n = 16;
    }
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h % CLIENT_BUCKETS;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    exo_http_server *srv = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_track *t = exo_calloc(1, sizeof *t);
        t->fd = conn_fd(c);
        t->client = client_bucket(c);
        t->deadline = exo_clock_seconds() + srv->cfg.header_timeout_s;
        pthread_mutex_lock(&srv->mtx);
        t->next = srv->tracked;
        if (srv->tracked)
            srv->tracked->prev = t;
        srv->tracked = t;
        srv->stats.connections++;
        pthread_mutex_unlock(&srv->mtx);
        *socket_context = t;
        return;
    }
    conn_track *t = *socket_context;
    if (!t)
        return;
    pthread_mutex_lock(&srv->mtx);
    if (t->prev)
        t->prev->next = t->next;
    else
        srv->tracked = t->next;
    if (t->next)
        t->next->prev = t->prev;
    srv->stats.connections--;
    pthread_mutex_unlock(&srv->mtx);
    exo_free(t);
    *socket_context = NULL;
}

static conn_track *track_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection's next step must be done within after_s (0: no deadline). */
static void set_deadline(exo_http_server *srv, conn_track *t, double after_s)
{
    if (!t)
        return;
    pthread_mutex_lock(&srv->mtx);
    t->deadline = after_s > 0 ? exo_clock_seconds() + after_s : 0;
    pthread_mutex_unlock(&srv->mtx);
}

static void count_stat(exo_http_server *srv, unsigned long *counter)
{
    pthread_mutex_lock(&srv->mtx);
    (*counter)++;
    pthread_mutex_unlock(&srv->mtx);
}

/* Charges n more body bytes to the budget and the client's share. */
static bool charge_body(exo_http_server *srv, exo_http_request *req, size_t n)
{
    unsigned b = req->track ? req->track->client : 0;
    size_t ceiling = req->charged + n > SMALL_BODY ? srv->memory.limit / 4 * 3 : srv->memory.limit;
    pthread_mutex_lock(&srv->mtx);
    bool ok = srv->client_bytes[b] + n <= srv->client_share && exo_budget_charge_upto(&srv->memory, n, ceiling);
    if (ok)
        srv->client_bytes[b] += n;
    else
        srv->stats.refused_memory++;
    pthread_mutex_unlock(&srv->mtx);
    if (ok)
        req->charged += n;
    return ok;
}

static void release_body(exo_http_server *srv, exo_http_request *req)
{
    exo_sbuf_free(&req->body);
    if (!req->charged)
        return;
    unsigned b = req->track ? req->track->client : 0;
    pthread_mutex_lock(&srv->mtx);
    srv->client_bytes[b] -= req->charged;
    pthread_mutex_unlock(&srv->mtx);
    exo_budget_release(&srv->memory, req->charged);
    req->charged = 0;
}

/* An answer before the body is read: the connection closes after it, so
 * the unread body can never be taken for the next request. */
static enum MHD_Result refuse(exo_http_server *srv, exo_http_request *req, int status, const char *msg,
                              const char *extra_header, const char *extra_value)
{
    req->answered_early = true;
    char *body = srv->cfg.error_body(req->path, status, msg);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    exo_free(body);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Connection", "close");
    add_cors(r);
    if (status == 503)
        MHD_add_response_header(r, "Retry-After", RETRY_AFTER_S);
    if (extra_header)
        MHD_add_response_header(r, extra_header, extra_value);
    enum MHD_Result ret = MHD_queue_response(req->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

typedef struct framing {
    int         content_lengths, transfer_encodings, hosts, bad_names;
    const char *content_length, *transfer_encoding;
    bool        lengths_differ;
} framing;

static enum MHD_Result note_framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                           const char *value)
{
    framing *f = cls;
    (void)kind;
    if (strpbrk(key, " \t")) /* "Name :" (RFC 9112 5.1): a proxy may read another name */
        f->bad_names++;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->content_lengths++ && strcmp(f->content_length, value ? value : ""))
            f->lengths_differ = true;
        f->content_length = value ? value : "";
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->transfer_encodings++;
        f->transfer_encoding = value ? value : "";
    } else if (!strcasecmp(key, "Host")) {
        f->hosts++;
    }
    return MHD_YES;
}

/* RFC 9112 section 6: a body's length must be unambiguous, or two parsers
 * (a proxy in front of us, and us) could split the byte stream into
 * different requests. Returns 0, or the status to refuse with (*why set);
 * *body_len is the declared length (0 when none), *chunked for chunked. */
static int check_framing(struct MHD_Connection *c, const char *version, uint64_t *body_len,
                         bool *chunked, const char **why)
{
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, note_framing_header, &f);
    *body_len = 0;
    *chunked = false;
    bool http11 = version && !strcmp(version, "HTTP/1.1");
    if (f.bad_names)
        return *why = "whitespace in a header name", 400;
    if (http11 && f.hosts != 1)
        return *why = f.hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header", 400;
    if (f.transfer_encodings) {
        if (f.content_lengths)
            return *why = "a request may not have both Content-Length and Transfer-Encoding", 400;
        if (!http11)
            return *why = "Transfer-Encoding needs HTTP/1.1", 400;
        if (f.transfer_encodings > 1 || strcasecmp(f.transfer_encoding, "chunked"))
            return *why = "the only transfer coding accepted is 'chunked'", 501;
        *chunked = true;
        return 0;
    }
    if (!f.content_lengths)
        return 0;
    if (f.content_lengths > 1)
        return *why = f.lengths_differ ? "conflicting Content-Length headers" : "duplicate Content-Length headers",
               400;
    const char *v = f.content_length;
    size_t n = strlen(v);
    if (!n || n > 18 || strspn(v, "0123456789") != n)
        return *why = "Content-Length must be a decimal number", 400;
    *body_len = strtoull(v, NULL, 10);
    return 0;
}

/* Length-independent comparison, so response timing says nothing of the key. */
static bool same_secret(const char *given, size_t given_len, const char *key)
{
    size_t n = strlen(key);
    unsigned char d = given_len != n;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)((i < given_len ? given[i] : 0) ^ key[i]);
    return d == 0;
}

static bool authorized(exo_http_server *srv, struct MHD_Connection *c)
{
    const char *key = srv->cfg.api_key;
    if (!key || !*key)
        return true;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (v && !strncasecmp(v, "Bearer ", 7) && same_secret(v + 7, strlen(v + 7), key))
        return true;
    v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (v && same_secret(v, strlen(v), key))
        return true;
    v = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, "exo_api_key");
    if (v) {
        char *plain = exo_strdup(v); /* the dashboard's prompt URI-encodes it */
        size_t n = MHD_http_unescape(plain);
        bool ok = same_secret(plain, n, key);
        exo_free(plain);
        return ok;
    }
    return false;
}

/* What a browser gets instead of the dashboard without the key: a prompt
 * that keeps the key in a same-site cookie, which the dashboard's own
 * requests then carry. */
static const char login_page[] =
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>exo: API key</title>"
    "<style>body{font-family:system-ui,sans-serif;background:#111;color:#eee;display:flex;"
    "justify-content:center;margin-top:20vh}input,button{font-size:1rem;padding:.4rem}</style></head>"
    "<body><form id=\"f\"><p>This exo node needs its API key.</p>"
    "<input id=\"k\" type=\"password\" autocomplete=\"current-password\" autofocus> "
    "<button>Open</button></form><script>"
    "document.getElementById('f').onsubmit=function(e){e.preventDefault();"
    "document.cookie='exo_api_key='+encodeURIComponent(document.getElementById('k').value)"
    "+';path=/;SameSite=Strict';location.reload();};</script></body></html>";

static const char need_key[] = "a valid API key is required (Authorization: Bearer <key> or x-api-key)";
static const char short_of_memory[] = "the server is short of request memory; retry shortly";

static bool expects_continue(struct MHD_Connection *c)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
    return v && !strcasecmp(v, "100-continue");
}

/* A refusal of a request whose framing is sound. A client that is sending
 * its body (without Expect: 100-continue) would see its connection reset,
 * and likely not our answer, if we closed it under the upload: so the body
 * is read and dropped (no memory, within the body deadline) and the answer
 * goes out after it, as nginx's lingering close does. */
static void defer_refusal(exo_http_server *srv, exo_http_request *req, int status, const char *msg)
{
    req->refusal = status;
    snprintf(req->refusal_msg, sizeof req->refusal_msg, "%s", msg);
    release_body(srv, req);
}

static enum MHD_Result refuse_after_body(exo_http_server *srv, exo_http_request *req, bool has_body, int status,
                                         const char *msg)
{
    if (!has_body || expects_continue(req->conn))
        return refuse(srv, req, status, msg, status == 401 ? "WWW-Authenticate" : NULL, "Bearer");
    defer_refusal(srv, req, status, msg);
    set_deadline(srv, req->track, srv->cfg.body_timeout_s);
    return MHD_YES;
}

static enum MHD_Result refuse_unauthorized(exo_http_server *srv, exo_http_request *req, bool has_body)
{
    count_stat(srv, &srv->stats.unauthorized);
    bool page = !strcmp(req->method, "GET") && (!strcmp(req->path, "/") || !strncmp(req->path, "/dashboard/", 11));
    if (!page)
        return refuse_after_body(srv, req, has_body, 401, need_key);
    req->answered_early = true;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof login_page - 1, (void *)login_page, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Connection", "close");
    MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(req->conn, 401, r);
    MHD_destroy_response(r);
    return ret;
}

/* The first call for a request (its headers are in): everything that can be
 * refused is refused here, before a byte of the body is read or held. */
static enum MHD_Result admit(exo_http_server *srv, exo_http_request *req, const char *version)
{
    uint64_t len;
    bool chunked;
    const char *why = NULL;
    int status = check_framing(req->conn, version, &len, &chunked, &why);
    if (status) {
        count_stat(srv, &srv->stats.rejected_framing);
        return refuse(srv, req, status, why, NULL, NULL);
    }
    bool has_body = len || chunked;
    if (strcmp(req->method, "OPTIONS") && !authorized(srv, req->conn))
        return refuse_unauthorized(srv, req, has_body);
    if (len > srv->cfg.max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "request body exceeds %zu bytes", srv->cfg.max_body);
        return refuse_after_body(srv, req, true, 413, msg);
    }
    if (len) {
        if (!charge_body(srv, req, (size_t)len + 1))
            return refuse_after_body(srv, req, true, 503, short_of_memory);
        exo_sbuf_reserve(&req->body, (size_t)len);
    }
    set_deadline(srv, req->track, len || chunked ? srv->cfg.body_timeout_s : 0);
    return MHD_YES;
}

/* Appends upload bytes, charging a chunked body as it grows (doubling, so
 * the charges stay few). */
static void take_upload(exo_http_server *srv, exo_http_request *req, const char *data, size_t n)
{
    if (req->answered_early || req->refusal)
        return; /* drained */
    if (req->body.len + n > srv->cfg.max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "request body exceeds %zu bytes", srv->cfg.max_body);
        defer_refusal(srv, req, 413, msg);
        return;
    }
    size_t need = req->body.len + n + 1;
    if (need > req->charged) {
        size_t want = req->charged * 2 > need ? req->charged * 2 : need;
        if (want > srv->cfg.max_body + 1)
            want = srv->cfg.max_body + 1;
        if (!charge_body(srv, req, want - req->charged)) {
            defer_refusal(srv, req, 503, short_of_memory);
            return;
        }
        exo_sbuf_reserve(&req->body, req->charged - 1);
    }
    exo_sbuf_append(&req->body, data, n);
}

/* ---- content reader ----------------------------------------------------------- */

static ssize_t reader(void *cls, uint64_t pos, char *out, size_t max)
{
    exo_http_stream *s = cls;
    (void)pos;
    pthread_mutex_lock(&s->mtx);
    if (s->gone || (s->conn && peer_closed(s->conn))) {
        s->gone = true;
        pthread_mutex_unlock(&s->mtx);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t avail = s->buf.len - s->rpos;
    if (!avail && s->keepalive_due && s->sse && !s->ended) {
        exo_sbuf_puts(&s->buf, ": keep-alive\n\n");
        avail = s->buf.len - s->rpos;
    }
    s->keepalive_due = false;
    if (avail) {
        size_t n = avail < max ? avail : max;
        memcpy(out, s->buf.data + s->rpos, n);
        s->rpos += n;
        if (s->rpos == s->buf.len) {
            exo_sbuf_clear(&s->buf);
            s->rpos = 0;
        } else if (s->rpos > 65536 && s->rpos * 2 > s->buf.len) {
            memmove(s->buf.data, s->buf.data + s->rpos, s->buf.len - s->rpos);
            s->buf.len -= s->rpos;
            s->rpos = 0;
        }
        s->last_out = exo_clock_seconds();
        pthread_mutex_unlock(&s->mtx);
        return (ssize_t)n;
    }
    if (s->ended) {
        pthread_mutex_unlock(&s->mtx);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    /* Nothing to send: park the connection until the producer or the watcher
     * resumes it. */
    s->suspended = true;
    MHD_suspend_connection(s->conn);
    pthread_mutex_unlock(&s->mtx);
    return 0;
}

static void reader_free(void *cls) { stream_unref(cls); }

/* Queues the stream's response on its connection. Called on the
 * connection's MHD thread WITHOUT s->mtx held (MHD takes its response lock
 * around the content reader, which takes s->mtx: holding s->mtx across MHD
 * response calls would invert that order); the caller set s->queued under
 * the mutex, so nothing else queues or touches a fixed body meanwhile. */
static enum MHD_Result queue_stream(exo_http_stream *s, struct MHD_Connection *conn)
{
    pthread_mutex_lock(&s->mtx);
    bool fixed = s->fixed, sse = s->sse;
    int status = s->status;
    char *ctype = exo_strdup(s->ctype ? s->ctype : "application/octet-stream");
    exo_sbuf body;
    exo_sbuf_init(&body);
    if (fixed) {
        body = s->buf; /* a fixed answer is complete: move it out */
        exo_sbuf_init(&s->buf);
    } else {
        s->refs++; /* the reader's reference */
    }
    s->last_out = exo_clock_seconds();
    pthread_mutex_unlock(&s->mtx);

    struct MHD_Response *r;
    if (fixed)
        r = MHD_create_response_from_buffer(body.len, body.data ? body.data : (void *)"",
                                            MHD_RESPMEM_MUST_COPY);
    else
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, reader, s, reader_free);
    exo_sbuf_free(&body);
    if (!r) {
        if (!fixed)
            stream_unref(s);
        exo_free(ctype);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    exo_free(ctype);
    add_cors(r);
    if (status == 503)
        MHD_add_response_header(r, "Retry-After", RETRY_AFTER_S);
    if (sse) {
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
    }
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- routing ------------------------------------------------------------------- */

/* Matches path against pattern, filling params. */
static bool match(const char *pattern, const char *path, exo_http_request *req)
{
    const char *p = pattern, *u = path;
    int np = 0;
    while (*p && *u) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            if (!close)
                return false;
            const char *colon = memchr(p, ':', (size_t)(close - p));
            bool rest = colon && strncmp(colon, ":path}", 6) == 0;
            size_t nlen = (size_t)((colon ? colon : close) - p - 1);
            const char *end = rest ? u + strlen(u) : u + strcspn(u, "/");
            if (end == u || np >= MAX_PARAMS)
                return false;
            if (req) {
                req->pnames[np] = exo_strndup(p + 1, nlen);
                req->pvals[np] = exo_strndup(u, (size_t)(end - u));
            }
            np++;
            p = close + 1;
            u = end;
            continue;
        }
        if (*p != *u)
            return false;
        p++, u++;
    }
    if (*p || *u)
        return false;
    if (req)
        req->n_params = np;
    return true;
}

static void free_params(exo_http_request *r)
{
    for (int i = 0; i < r->n_params; i++) {
        exo_free(r->pnames[i]);
        exo_free(r->pvals[i]);
    }
    r->n_params = 0;
}

/* ---- MHD callbacks ----------------------------------------------------------------- */

static enum MHD_Result handle_final(exo_http_server *srv, exo_http_request *req)
{
    struct MHD_Connection *c = req->conn;
    const char *m = req->method;
    if (!strcmp(m, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_cors(r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS, HEAD");
        const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", rh ? rh : "*");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    route *found = NULL;
    bool path_known = false;
    for (int pass = 0; pass < 2 && !found; pass++) {
        for (int i = 0; i < srv->n_routes && !found; i++) {
            route *rt = &srv->routes[i];
            if (!match(rt->pattern, req->path, NULL))
                continue;
            path_known = true;
            bool ok = pass == 0 ? !strcmp(rt->method, m) : (!strcmp(m, "HEAD") && !strcmp(rt->method, "GET"));
            if (ok)
                found = rt;
        }
    }
    if (!found) {
        if (path_known)
            return queue_error(srv, c, req->path, 405, "Method Not Allowed");
        return queue_error(srv, c, req->path, 404, "Not Found");
    }
    match(found->pattern, req->path, req);
    req->handled = true;
    found->h(req, found->ud);
    if (req->responded)
        return queue_buffer(c, req->status, req->ctype, req->resp, req->resp_len);
    exo_http_stream *s = req->stream;
    if (!s)
        return queue_error(srv, c, req->path, 500, "handler did not respond");
    pthread_mutex_lock(&s->mtx);
    bool now = s->started;
    if (now) {
        s->queued = true;
    } else {
        s->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&s->mtx);
    return now ? queue_stream(s, c) : MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    exo_http_server *srv = cls;
    exo_http_request *req = *con_cls;
    if (!req) {
        req = exo_calloc(1, sizeof *req);
        req->srv = srv;
        req->conn = conn;
        req->track = track_of(conn);
        req->method = method;
        req->path = exo_strdup(url);
        exo_sbuf_init(&req->body);
        *con_cls = req;
        return admit(srv, req, version);
    }
    if (*upload_size) {
        take_upload(srv, req, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (req->stream) {
        /* Resumed before the response was queued: started, or the client left. */
        exo_http_stream *s = req->stream;
        pthread_mutex_lock(&s->mtx);
        enum MHD_Result ret = MHD_YES;
        bool queue = false;
        if (s->gone || srv->stopping) {
            ret = MHD_NO;
        } else if (s->started && !s->queued) {
            s->queued = queue = true;
        } else if (!s->started) {
            s->suspended = true;
            MHD_suspend_connection(conn);
        }
        pthread_mutex_unlock(&s->mtx);
        return queue ? queue_stream(s, conn) : ret;
    }
    if (req->handled)
        return MHD_YES;
    set_deadline(srv, req->track, 0); /* the handler or its stream has it now */
    if (req->answered_early)
        return MHD_YES;
    if (req->refusal)
        return refuse(srv, req, req->refusal, req->refusal_msg, req->refusal == 401 ? "WWW-Authenticate" : NULL,
                       "Bearer");
    if (!req->body.data)
        exo_sbuf_append(&req->body, "", 0);
    /* A tree may cost up to 8x its text (+4 MiB, ample for any ordinary
     * request); jansson needs ~18x for a body of tiny values. */
    size_t tree_cap = req->body.len < (SIZE_MAX - (4u << 20)) / 8 ? req->body.len * 8 + (4u << 20) : SIZE_MAX;
    exo_ju_set_parse_budget(&srv->memory, tree_cap < srv->client_share ? tree_cap : srv->client_share);
    enum MHD_Result ret = handle_final(srv, req);
    exo_ju_set_parse_budget(NULL, 0);
    release_body(srv, req); /* handlers copy what they keep */
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    exo_http_server *srv = cls;
    exo_http_request *req = *con_cls;
    if (!req)
        return;
    *con_cls = NULL;
    exo_http_stream *s = req->stream;
    if (s) {
        pthread_mutex_lock(&srv->mtx);
        if (s->prev)
            s->prev->next = s->next;
        else if (srv->streams == s)
            srv->streams = s->next;
        if (s->next)
            s->next->prev = s->prev;
        s->prev = s->next = NULL;
        srv->n_streams--;
        pthread_mutex_unlock(&srv->mtx);
        pthread_mutex_lock(&s->mtx);
        bool gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
        if (gone)
            s->gone = true;
        s->closed = true;
        s->conn = NULL;
        s->suspended = false;
        exo_http_close_fn cb = s->on_close;
        void *ud = s->ud;
        s->on_close = NULL;
        if (cb) {
            s->in_cb = true;
            s->cb_thread = pthread_self();
        }
        pthread_mutex_unlock(&s->mtx);
        if (cb) {
            cb(ud, gone);
            pthread_mutex_lock(&s->mtx);
            s->in_cb = false;
            pthread_cond_broadcast(&s->cb_done);
            pthread_mutex_unlock(&s->mtx);
        }
        stream_unref(s);
    }
    /* kept alive: the next request's headers are due within the header timeout */
    set_deadline(srv, req->track, srv->cfg.header_timeout_s);
    free_params(req);
    exo_free(req->path);
    release_body(srv, req);
    exo_free(req->ctype);
    exo_free(req->resp);
    exo_free(req);
}

/* ---- watcher: keep-alives and hang-ups of suspended connections ------------------------- */

static void *watcher_main(void *arg)
{
    exo_http_server *srv = arg;
    exo_http_stream **batch = NULL;
    struct pollfd *pfd = NULL;
    bool *ka = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&srv->mtx);
    while (!srv->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&srv->wake, &srv->mtx, &ts);
        if (srv->stopping)
            break;
        double now = exo_clock_seconds();
        for (conn_track *t = srv->tracked; t; t = t->next) {
            if (t->deadline && now > t->deadline && t->fd >= 0) {
                shutdown(t->fd, SHUT_RDWR); /* MHD sees a hang-up and closes it */
                t->deadline = 0;
                srv->stats.timed_out++;
            }
        }
        if ((size_t)srv->n_streams > cap) {
            cap = (size_t)srv->n_streams * 2;
            batch = exo_realloc(batch, sizeof *batch * cap);
            pfd = exo_realloc(pfd, sizeof *pfd * cap);
            ka = exo_realloc(ka, sizeof *ka * cap);
        }
        size_t n = 0;
        for (exo_http_stream *s = srv->streams; s && n < cap; s = s->next) {
            pthread_mutex_lock(&s->mtx);
            if (s->suspended && s->conn) {
                ka[n] = s->sse && s->started && now - s->last_out >= srv->cfg.keepalive_s;
                if (ka[n])
                    s->keepalive_due = true;
                s->refs++;
                batch[n] = s;
                pfd[n].fd = ka[n] ? -1 : conn_fd(s->conn); /* poll ignores -1 */
                pfd[n].events = POLLRDHUP;
                pfd[n].revents = 0;
                n++;
            }
            pthread_mutex_unlock(&s->mtx);
        }
        pthread_mutex_unlock(&srv->mtx);
        if (n)
            poll(pfd, n, 0);
        for (size_t i = 0; i < n; i++) {
            exo_http_stream *s = batch[i];
            bool hup = pfd[i].fd >= 0 && (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
            struct MHD_Connection *c = NULL;
            if (ka[i] || hup) {
                pthread_mutex_lock(&s->mtx);
                if (hup)
                    s->gone = true;
                c = take_resume(s);
                pthread_mutex_unlock(&s->mtx);
            }
            if (c)
                MHD_resume_connection(c);
            stream_unref(s);
        }
        pthread_mutex_lock(&srv->mtx);
    }
    pthread_mutex_unlock(&srv->mtx);
    exo_free(batch);
    exo_free(pfd);
    exo_free(ka);
    return NULL;
}

/* ---- public: server -------------------------------------------------------------------- */

exo_http_server *exo_http_create(const exo_http_config *cfg)
{
    exo_http_server *s = exo_calloc(1, sizeof *s);
    if (cfg)
        s->cfg = *cfg;
    if (!s->cfg.max_body)
        s->cfg.max_body = 16u << 20;
    if (s->cfg.threads <= 0)
        s->cfg.threads = 4;
    if (!s->cfg.max_connections)
        s->cfg.max_connections = 8192;
    if (s->cfg.keepalive_s <= 0)
        s->cfg.keepalive_s = 10;
    if (!s->cfg.error_body)
        s->cfg.error_body = default_error;
    if (s->cfg.header_timeout_s <= 0)
        s->cfg.header_timeout_s = 20;
    if (s->cfg.body_timeout_s <= 0)
        s->cfg.body_timeout_s = 60;
    if (s->cfg.idle_timeout_s <= 0)
        s->cfg.idle_timeout_s = 120;
    if (!s->cfg.max_per_client)
        s->cfg.max_per_client = 128;
    if (!s->cfg.memory_budget)
        s->cfg.memory_budget = (size_t)256 << 20;
    if (!s->cfg.stream_max_pending)
        s->cfg.stream_max_pending = (size_t)4 << 20;
    s->cfg.api_key = s->cfg.api_key && *s->cfg.api_key ? exo_strdup(s->cfg.api_key) : NULL;
    s->cfg.bind_addr = s->cfg.bind_addr ? exo_strdup(s->cfg.bind_addr) : NULL;
    exo_budget_init(&s->memory, s->cfg.memory_budget);
    s->client_share = s->cfg.memory_budget / 4;
    s->stats.memory_budget = s->cfg.memory_budget;
    pthread_mutex_init(&s->mtx, NULL);
    pthread_cond_init(&s->wake, NULL);
    return s;
}

int exo_http_route(exo_http_server *s, const char *method, const char *pattern, exo_http_handler h,
                   void *ud)
{
    if (s->mhd || !method || !pattern || pattern[0] != '/' || !h)
        return EXO_EINVAL;
    s->routes = exo_realloc(s->routes, sizeof *s->routes * (size_t)(s->n_routes + 1));
    route *r = &s->routes[s->n_routes++];
    r->method = exo_strdup(method);
    r->pattern = exo_strdup(pattern);
    r->h = h;
    r->ud = ud;
    return 0;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    EXO_LOG_DEBUG("http: %s", msg);
}

int exo_http_start(exo_http_server *s, exo_err *err)
{
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->cfg.port);
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (s->cfg.bind_addr && inet_pton(AF_INET, s->cfg.bind_addr, &addr.sin_addr) != 1)
        return exo_err_set(err, EXO_EINVAL, "http: bad bind address '%s'", s->cfg.bind_addr);
    /* poll(), not epoll: with MHD_USE_EPOLL (edge-triggered) MHD misses a
     * peer's end of stream that comes with its last bytes, and a client that
     * sent "garbage" or a whole request and then shut its side kept a
     * connection open until the header timeout (20 s); with poll() it is
     * closed at once. bench_api: latency and 1000 idle streams alike. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->cfg.threads,
                              MHD_OPTION_CONNECTION_LIMIT, s->cfg.max_connections,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, s->cfg.max_per_client,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(s->cfg.idle_timeout_s + 0.5),
                              MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                              MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                              MHD_OPTION_END);
    if (!s->mhd)
        return exo_err_set(err, EXO_EIO, "http: cannot listen on %s:%d", s->cfg.bind_addr ? s->cfg.bind_addr : "*",
                           s->cfg.port);
    if (pthread_create(&s->watcher, NULL, watcher_main, s) == 0)
        s->watcher_running = true;
    return 0;
}

int exo_http_port(const exo_http_server *s)
{
    if (!s->mhd)
        return s->cfg.port;
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    return i ? i->port : s->cfg.port;
}

int exo_http_open_streams(exo_http_server *s)
{
    pthread_mutex_lock(&s->mtx);
    int n = s->n_streams;
    pthread_mutex_unlock(&s->mtx);
    return n;
}

void exo_http_get_stats(exo_http_server *s, exo_http_stats *out)
{
    pthread_mutex_lock(&s->mtx);
    *out = s->stats;
    pthread_mutex_unlock(&s->mtx);
    out->memory_used = exo_budget_used(&s->memory);
    out->memory_peak = exo_budget_peak(&s->memory);
}

void exo_http_destroy(exo_http_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mtx);
    s->stopping = true;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->mtx);
    if (s->watcher_running)
        pthread_join(s->watcher, NULL);
    if (s->mhd) {
        /* MHD must not be stopped with suspended connections: mark every
         * stream gone and resume it, then wait for MHD to finish them. */
        for (int tries = 0; tries < 500; tries++) {
            int left = 0;
            pthread_mutex_lock(&s->mtx);
            for (exo_http_stream *st = s->streams; st; st = st->next) {
                pthread_mutex_lock(&st->mtx);
                st->gone = true;
                struct MHD_Connection *c = take_resume(st);
                pthread_mutex_unlock(&st->mtx);
                if (c)
                    MHD_resume_connection(c);
                left++;
            }
            pthread_mutex_unlock(&s->mtx);
            if (!left)
                break;
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        MHD_stop_daemon(s->mhd);
    }
    for (int i = 0; i < s->n_routes; i++) {
        exo_free(s->routes[i].method);
        exo_free(s->routes[i].pattern);
    }
    exo_free(s->routes);
    exo_free((char *)s->cfg.api_key);
    exo_free((char *)s->cfg.bind_addr);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mtx);
    exo_free(s);
}

/* ---- public: requests ------------------------------------------------------------------ */

const char *exo_http_method(const exo_http_request *r) { return r->method; }
const char *exo_http_path(const exo_http_request *r) { return r->path; }

const char *exo_http_param(const exo_http_request *r, const char *name)
{
    for (int i = 0; i < r->n_params; i++)
        if (!strcmp(r->pnames[i], name))
            return r->pvals[i];
    return NULL;
}

const char *exo_http_query(const exo_http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *exo_http_header(const exo_http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *exo_http_body(const exo_http_request *r, size_t *len)
{
    if (len)
        *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

void exo_http_respond(exo_http_request *r, int status, const char *content_type, const char *body,
                      size_t len)
{
    if (r->responded || r->stream)
        return;
    r->responded = true;
    r->status = status;
    r->ctype = content_type ? exo_strdup(content_type) : NULL;
    r->resp = exo_strndup(body ? body : "", body ? len : 0);
    r->resp_len = body ? len : 0;
}

void exo_http_respond_error(exo_http_request *r, int status, const char *message)
{
    char *body = r->srv->cfg.error_body(r->path, status, message);
    exo_http_respond(r, status, "application/json", body, strlen(body));
    exo_free(body);
}

/* ---- public: streams ---------------------------------------------------------------------- */

exo_http_stream *exo_http_stream_open(exo_http_request *r, exo_http_close_fn on_close, void *ud)
{
    if (r->responded || r->stream)
        return NULL;
    exo_http_stream *s = exo_calloc(1, sizeof *s);
    pthread_mutex_init(&s->mtx, NULL);
    pthread_cond_init(&s->cb_done, NULL);
    s->srv = r->srv;
    s->refs = 2; /* the request context and the caller */
    s->conn = r->conn;
    s->on_close = on_close;
    s->ud = ud;
    s->status = 200;
    s->last_out = exo_clock_seconds();
    exo_sbuf_init(&s->buf);
    r->stream = s;
    exo_http_server *srv = r->srv;
    pthread_mutex_lock(&srv->mtx);
    s->next = srv->streams;
    if (srv->streams)
        srv->streams->prev = s;
    srv->streams = s;
    srv->n_streams++;
    pthread_mutex_unlock(&srv->mtx);
    return s;
}

int exo_http_stream_start(exo_http_stream *s, int status, const char *content_type, bool sse)
{
    pthread_mutex_lock(&s->mtx);
    if (s->started || s->closed || s->gone) {
        int rc = s->started ? EXO_EINVAL : EXO_ECANCELED;
        pthread_mutex_unlock(&s->mtx);
        return rc;
    }
    s->started = true;
    s->status = status;
    s->ctype = exo_strdup(content_type ? content_type : "application/octet-stream");
    s->sse = sse;
    if (sse)
        exo_sbuf_puts(&s->buf, ": keep-alive\n\n");
    struct MHD_Connection *c = take_resume(s);
    pthread_mutex_unlock(&s->mtx);
    if (c)
        MHD_resume_connection(c);
    return 0;
}

int exo_http_stream_write(exo_http_stream *s, const void *data, size_t len)
{
    pthread_mutex_lock(&s->mtx);
    if (s->gone || s->closed || s->ended) {
        pthread_mutex_unlock(&s->mtx);
        return EXO_ECANCELED;
    }
    if (s->buf.len - s->rpos + len > s->srv->cfg.stream_max_pending) {
        /* The client stopped reading: drop the stream rather than hold an
         * answer that grows without end. */
        s->gone = true;
        struct MHD_Connection *c = take_resume(s); /* the reader ends it */
        pthread_mutex_unlock(&s->mtx);
        if (c)
            MHD_resume_connection(c);
        count_stat(s->srv, &s->srv->stats.dropped_streams);
        return EXO_ECANCELED;
    }
    exo_sbuf_append(&s->buf, data, len);
    struct MHD_Connection *c = s->started ? take_resume(s) : NULL;
    pthread_mutex_unlock(&s->mtx);
    if (c)
        MHD_resume_connection(c);
    return 0;
}

void exo_http_stream_end(exo_http_stream *s)
{
    pthread_mutex_lock(&s->mtx);
    s->ended = true;
    struct MHD_Connection *c = s->started ? take_resume(s) : NULL;
    pthread_mutex_unlock(&s->mtx);
    if (c)
        MHD_resume_connection(c);
}

int exo_http_stream_respond(exo_http_stream *s, int status, const char *content_type,
                            const char *body, size_t len)
{
    pthread_mutex_lock(&s->mtx);
    if (s->started || s->closed || s->gone) {
        int rc = s->started ? EXO_EINVAL : EXO_ECANCELED;
        pthread_mutex_unlock(&s->mtx);
        return rc;
    }
    s->started = s->fixed = s->ended = true;
    s->status = status;
    s->ctype = exo_strdup(content_type ? content_type : "application/json");
    exo_sbuf_append(&s->buf, body ? body : "", body ? len : 0);
    struct MHD_Connection *c = take_resume(s);
    pthread_mutex_unlock(&s->mtx);
    if (c)
        MHD_resume_connection(c);
    return 0;
}

bool exo_http_stream_closed(exo_http_stream *s)
{
    pthread_mutex_lock(&s->mtx);
    bool r = s->closed || s->gone;
    pthread_mutex_unlock(&s->mtx);
    return r;
}

void exo_http_stream_release(exo_http_stream *s)
{
    if (!s)
        return;
    /* After release the close callback neither runs nor is running, so the
     * producer may free its user data (unless it releases from inside it). */
    pthread_mutex_lock(&s->mtx);
    s->on_close = NULL;
    while (s->in_cb && !pthread_equal(s->cb_thread, pthread_self()))
        pthread_cond_wait(&s->cb_done, &s->mtx);
    pthread_mutex_unlock(&s->mtx);
    stream_unref(s);
}
