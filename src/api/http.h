/* The HTTP server: libmicrohttpd (epoll, internal thread pool) behind a
 * routing table, with streaming responses that another thread produces.
 *
 * Handlers run on MHD threads with the whole request body read (bodies over
 * max_body are answered 413 before the handler). A handler either answers at
 * once (exo_http_respond) or opens a stream (exo_http_stream_open) and hands
 * it to the node, which later calls, from any thread:
 *   exo_http_stream_start(status, content type, sse)  -> headers go out
 *   exo_http_stream_write(bytes)...                   -> chunked body
 *   exo_http_stream_end()                             -> last chunk
 * or exo_http_stream_respond() for a one-piece answer with its own status
 * (non-streaming generations: 200 or 500 decided at the end), and finally
 * exo_http_stream_release() to drop its reference.
 *
 * While a stream has nothing to send its connection is suspended (no busy
 * polling, no thread held), and a watcher thread (a) resumes SSE streams idle
 * for keepalive_s with a `: keep-alive` comment, and (b) polls suspended
 * sockets for a peer hang-up. Every write also checks the socket, so a client
 * that disconnects is noticed at the next token at the latest: the stream's
 * close callback reports client_gone = true and the node cancels the
 * generation. CORS is open (`*`) on every response, preflights included.
 *
 * Hostile clients. Every connection has a deadline for its headers and then
 * its body (slowloris), connections per client address are capped, request
 * framing that two parsers could read differently (Content-Length with
 * Transfer-Encoding, two lengths, an unknown coding) is refused before any
 * body is read, and the bytes of request bodies and of their JSON parse
 * trees (exo_ju_parse_body on the handler's thread) are charged to one
 * memory budget: a request that does not fit is answered 503 with
 * Retry-After, and nothing grows past it. */
#ifndef EXO_API_HTTP_H
#define EXO_API_HTTP_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct exo_http_server  exo_http_server;
typedef struct exo_http_request exo_http_request;
typedef struct exo_http_stream  exo_http_stream;

typedef void (*exo_http_handler)(exo_http_request *req, void *ud);
/* Once per stream, on an MHD thread, when its connection ends. client_gone:
 * the connection ended before the response was complete (client disconnect
 * or server shutdown). Must not block; must not call back into the stream
 * except exo_http_stream_release. */
typedef void (*exo_http_close_fn)(void *ud, bool client_gone);
/* Error bodies for the router's own answers (404, 405, 413) in the format of
 * the API the path belongs to; returns a malloc'd (exo_malloc) JSON string. */
typedef char *(*exo_http_error_fn)(const char *path, int status, const char *message);

typedef struct exo_http_config {
    const char *bind_addr;       /* NULL: all interfaces */
    int         port;            /* 0: ephemeral (see exo_http_port) */
    size_t      max_body;        /* 0: 16 MiB */
    int         threads;         /* 0: 4 */
    unsigned    max_connections; /* 0: 8192 */
    double      keepalive_s;     /* SSE idle keep-alive period; 0: 10 s */
    exo_http_error_fn error_body; /* NULL: {"error":{"message":...}} */
    /* Budgets against slow or hostile clients (docs/DAEMON.md, "Limits"). */
    double      header_timeout_s; /* a request's headers, and a keep-alive connection's next
                                     request, must arrive within this; 0: 20 s */
    double      body_timeout_s;   /* its body within this once the headers are in; 0: 60 s */
    double      idle_timeout_s;   /* a connection with no progress at all (a client that stops
                                     reading its answer) is closed; 0: 120 s */
    unsigned    max_per_client;   /* connections per client address; 0: 128 */
    size_t      memory_budget;    /* request bodies + their parse trees held at once, all
                                     clients together; 0: 256 MiB. One client address may hold
                                     a quarter of it, bodies over 64 KiB together three
                                     quarters. Over budget: 503 + Retry-After. */
    size_t      stream_max_pending; /* bytes a stream may queue for a client that is not
                                       reading them; over it the stream is dropped; 0: 4 MiB */
    const char *api_key;          /* NULL or "": every route is open; otherwise every route but
                                     CORS preflights needs it (Bearer, x-api-key or the cookie
                                     the dashboard's key prompt sets) */
} exo_http_config;

/* Counters for /state and the reliability tests. */
typedef struct exo_http_stats {
    unsigned connections;        /* open now */
    size_t   memory_used, memory_peak, memory_budget;
    unsigned long refused_memory; /* 503s for want of request memory */
    unsigned long timed_out;      /* connections closed for slow headers or bodies */
    unsigned long rejected_framing; /* ambiguous or malformed requests refused (400/501) */
    unsigned long unauthorized;   /* 401s */
    unsigned long dropped_streams; /* streams dropped for a client not reading */
} exo_http_stats;

exo_http_server *exo_http_create(const exo_http_config *cfg);
/* Routes: method "GET", "POST", ... ; pattern "/v1/models/{id}" where {name}
 * matches one segment and {name:path} the rest of the path. A GET route also
 * answers HEAD. Add all routes before exo_http_start. */
int  exo_http_route(exo_http_server *s, const char *method, const char *pattern,
                    exo_http_handler h, void *ud);
int  exo_http_start(exo_http_server *s, exo_err *err);
int  exo_http_port(const exo_http_server *s);
/* Disconnects every client (streams see client_gone), stops, frees. */
void exo_http_destroy(exo_http_server *s);
/* Streams currently open (tests, /state). */
int  exo_http_open_streams(exo_http_server *s);
void exo_http_get_stats(exo_http_server *s, exo_http_stats *out);

/* Request accessors, valid during the handler. */
const char *exo_http_method(const exo_http_request *r);
const char *exo_http_path(const exo_http_request *r);
const char *exo_http_param(const exo_http_request *r, const char *name); /* route {param} */
const char *exo_http_query(const exo_http_request *r, const char *name);
const char *exo_http_header(const exo_http_request *r, const char *name);
const char *exo_http_body(const exo_http_request *r, size_t *len); /* NUL-terminated */

/* Immediate answer (copied). */
void exo_http_respond(exo_http_request *r, int status, const char *content_type, const char *body,
                      size_t len);
/* An error in the format of the path's API (the configured error_body). */
void exo_http_respond_error(exo_http_request *r, int status, const char *message);

/* Streams. open: only inside a handler; the handler must not respond too.
 * The returned stream holds one reference for the caller. */
exo_http_stream *exo_http_stream_open(exo_http_request *r, exo_http_close_fn on_close, void *ud);
/* Sends the headers. sse adds Cache-Control: no-cache, X-Accel-Buffering: no,
 * an immediate keep-alive comment and the idle keep-alives. */
int  exo_http_stream_start(exo_http_stream *s, int status, const char *content_type, bool sse);
/* Queues bytes. EXO_ECANCELED once the client is gone (stop generating), or
 * when it has stopped reading and stream_max_pending bytes wait for it. */
int  exo_http_stream_write(exo_http_stream *s, const void *data, size_t len);
void exo_http_stream_end(exo_http_stream *s);
/* start + write + end with a Content-Length body (for non-streaming answers). */
int  exo_http_stream_respond(exo_http_stream *s, int status, const char *content_type,
                             const char *body, size_t len);
bool exo_http_stream_closed(exo_http_stream *s);
/* Drops the producer's reference. Once it returns, on_close is neither
 * running nor will be called, so its user data may be freed. */
void exo_http_stream_release(exo_http_stream *s);

#endif
