/* The API families exo serves and the two halves of each adapter:
 *
 *   request side   exo_api_parse_request: a client's JSON body -> exo_gen_request,
 *                  or a 4xx status + message that exo_api_error_body renders
 *                  in that API's own error format;
 *   response side  exo_api_encoder: a per-request state machine fed the
 *                  generation's exo_chunks that writes the exact wire bytes:
 *                  SSE events (OpenAI chat, Claude, Responses), NDJSON lines
 *                  (Ollama), or, for non-streaming requests, one JSON body
 *                  when the terminal chunk arrives.
 *
 * Encoders are single-threaded objects: the producer (node) thread feeds
 * them and hands the bytes to the HTTP stream (http.h). */
#ifndef EXO_API_API_H
#define EXO_API_API_H

#include "proto/gen_types.h"
#include "core/sbuf.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum exo_api_family {
    EXO_API_OPENAI_CHAT = 0, /* /v1/chat/completions, /ollama/v1/chat/completions */
    EXO_API_BENCH_CHAT,      /* /bench/chat/completions */
    EXO_API_CLAUDE,          /* /v1/messages */
    EXO_API_RESPONSES,       /* /v1/responses */
    EXO_API_OLLAMA_CHAT,     /* /ollama/api/chat (+ aliases), /api/chat */
    EXO_API_OLLAMA_GENERATE, /* /ollama/api/generate, /api/generate */
} exo_api_family;

/* The generation endpoints (POST) and their families, exo's aliases
 * included, for the node's routing table. */
typedef struct exo_api_route {
    const char    *path;
    exo_api_family family;
} exo_api_route;

extern const exo_api_route exo_api_generation_routes[];
extern const int           exo_api_n_generation_routes;

/* Parses and validates a request body. On failure returns a negative EXO_E*
 * code, sets err, and stores the HTTP status to answer with (400, 413). */
/* The HTTP status for a body that exo_ju_parse_body refused: 413 for a tree
 * over the per-request cap, 503 when request memory is short, else 400. */
int exo_api_status_for_parse(int rc);
int exo_api_parse_request(exo_api_family f, const char *body, size_t len, exo_gen_request *out,
                          int *http_status, exo_err *err);

/* Per-family parsers (what exo_api_parse_request dispatches to). */
int exo_openai_chat_parse(const json_t *body, bool bench, exo_gen_request *out, exo_err *err);
int exo_claude_parse(const json_t *body, exo_gen_request *out, exo_err *err);
int exo_responses_parse(const json_t *body, exo_gen_request *out, exo_err *err);
int exo_ollama_chat_parse(const json_t *body, exo_gen_request *out, exo_err *err);
int exo_ollama_generate_parse(const json_t *body, exo_gen_request *out, exo_err *err);

/* An error body in the family's format (malloc'd, free with exo_free):
 * OpenAI/Responses {"error":{"message","type","param","code"}},
 * Claude {"type":"error","error":{"type","message"}}, Ollama {"error":"..."}. */
char *exo_api_error_body(exo_api_family f, int http_status, const char *message);

typedef struct exo_api_encoder exo_api_encoder;

/* command_id names the response ("chatcmpl-<id>", "msg_<id>", "resp_<id>"),
 * created is unix seconds. The request's stream / logprobs / model are read. */
exo_api_encoder *exo_api_encoder_create(exo_api_family f, const exo_gen_request *req,
                                        const char *command_id, int64_t created);
void exo_api_encoder_free(exo_api_encoder *e);

/* The response's Content-Type, and whether SSE keep-alive comments may be
 * interleaved (streaming SSE families only). */
const char *exo_api_encoder_content_type(const exo_api_encoder *e);
bool        exo_api_encoder_keepalive(const exo_api_encoder *e);
/* Bytes to send before any chunk (Claude message_start, Responses
 * response.created / in_progress); nothing for the others. */
void exo_api_encoder_begin(exo_api_encoder *e, exo_sbuf *out);
/* Appends the bytes for one chunk to out. Returns true once the response is
 * complete (after a terminal chunk); later chunks are ignored. */
bool exo_api_encoder_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out);
/* HTTP status for a non-streaming response: 200, or 500 after an error chunk. */
int exo_api_encoder_status(const exo_api_encoder *e);

/* ---- Ollama node-state endpoints (formatters over the node's model list) ---- */

typedef struct exo_api_model_info {
    const char *id;           /* "mlx-community/Qwen3-0.6B-4bit" */
    const char *family;       /* "qwen3" */
    const char *quantization; /* "4bit" */
    int64_t     size_bytes;
    int64_t     context_length;
    bool        supports_tools, supports_vision;
    bool        downloaded, running;
} exo_api_model_info;

char *exo_ollama_tags_json(const exo_api_model_info *models, int n);   /* downloaded only */
char *exo_ollama_ps_json(const exo_api_model_info *models, int n);     /* running only */
char *exo_ollama_version_json(void);                                   /* {"version":"1.0.0"} */
/* /api/show for body {"name"|"model"}: 0 and *out, or 400 (no name) / 404. */
int exo_ollama_show_json(const char *body, size_t len, const exo_api_model_info *models, int n,
                         char **out, int *http_status);

#endif
