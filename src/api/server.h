/* The node's HTTP API: exo's routes (exo-reference §3.2) on the HTTP server
 * (http.h), answered from the node (cluster/node.h).
 *
 *   node & state   GET /node_id, /state, /state/{path}, /events[?since=N]
 *   instances      POST /instance, POST /place_instance,
 *                  GET /instance/placement, GET /instance/previews,
 *                  GET|DELETE /instance/{id}
 *   models         GET /models, /v1/models
 *   generation     POST every route of exo_api_generation_routes (OpenAI chat,
 *                  bench, Claude, Responses, Ollama chat/generate + aliases),
 *                  POST /v1/cancel/{command_id}
 *   ollama state   GET /ollama/api/tags (+ aliases), /ps, /version, /ollama/,
 *                  POST /ollama/api/show
 *   dashboard      GET / (index.html) and GET /dashboard/{file} from the built
 *                  dashboard directory (dashboard/dist), when there is one
 *
 * A generation request is parsed by its family's adapter, checked against
 * the State (no instance: 404 in the family's error format), then its
 * response is opened and the node gets a sink that pushes chunks into it.
 * The connection's close callback cancels the command when the client goes
 * away first. */
#ifndef EXO_API_SERVER_H
#define EXO_API_SERVER_H

#include "cluster/node.h"
#include "core/error.h"

typedef struct exo_api_server exo_api_server;

typedef struct exo_api_server_config {
    const char *bind_addr;   /* NULL: all interfaces */
    int         port;        /* 0: ephemeral */
    double      keepalive_s; /* 0: 10 s */
    const char *dashboard_dir; /* built dashboard (index.html, ...); NULL: none */
    const char *api_key;     /* NULL: open; see exo_http_config */
    /* limits against hostile clients, 0: exo_http_config's defaults */
    double      header_timeout_s, body_timeout_s, idle_timeout_s;
    unsigned    max_per_client;
    size_t      memory_budget, stream_max_pending;
} exo_api_server_config;

int  exo_api_server_start(exo_node *node, const exo_api_server_config *cfg, exo_api_server **out,
                          exo_err *err);
int  exo_api_server_port(const exo_api_server *s);
/* Closes every connection (open streams see client_gone) and frees. */
void exo_api_server_free(exo_api_server *s);

#endif
