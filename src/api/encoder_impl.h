/* Internals shared by the adapter files: the encoder object (one struct for
 * every family, each using its part), the chunk aggregation all families
 * need for non-streaming bodies, and small writers for shared JSON shapes. */
#ifndef EXO_API_ENCODER_IMPL_H
#define EXO_API_ENCODER_IMPL_H

#include "api/api.h"

typedef struct exo_api_encoder_vt {
    const char *ctype_stream, *ctype_body;
    bool sse;
    void (*begin)(exo_api_encoder *e, exo_sbuf *out);          /* streaming only; may be NULL */
    void (*feed)(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out); /* streaming */
    void (*body)(exo_api_encoder *e, exo_sbuf *out);           /* non-streaming success body */
} exo_api_encoder_vt;

struct exo_api_encoder {
    const exo_api_encoder_vt *vt;
    exo_api_family family;
    bool    stream, logprobs, done, bench;
    int     status;
    char   *id, *model;
    int64_t created;
    /* aggregate of everything fed */
    exo_sbuf text, thinking, lp; /* lp: comma-separated OpenAI logprob entries */
    int      n_lp;
    json_t  *calls;              /* [{id, name, arguments}] */
    exo_finish_reason reason;
    exo_usage usage;
    double   prompt_tps, gen_tps;
    int64_t  peak_memory;
    char    *stop_seq;
    /* streaming state */
    int  seq;           /* Responses sequence_number */
    int  block;         /* Claude: index of the open block, -1 none */
    int  block_kind;    /* Claude: 0 none, 1 thinking, 2 text */
    int  n_blocks;
    int  tool_index;    /* OpenAI: next tool call index */
    bool said_role;     /* OpenAI: a delta with the role went out */
    int  out_index;     /* Responses: next output_index */
    int  rs_index, msg_index; /* Responses: output_index of the reasoning / message item, -1 */
    bool rs_closed;
    json_t *outputs;    /* Responses: finished output items, in order */
    exo_sbuf scratch;
};

extern const exo_api_encoder_vt exo_openai_chat_vt, exo_claude_vt, exo_responses_vt,
    exo_ollama_chat_vt, exo_ollama_generate_vt;

/* The error "type" an API family gives an HTTP status ("invalid_request_error",
 * Claude's "api_error", ...), and the status an error chunk maps to. */
const char *exo_api_error_type(exo_api_family f, int status);
int exo_api_chunk_status(const exo_chunk *c);

/* OpenAI usage object. */
void exo_api_write_usage(exo_sbuf *b, const exo_usage *u);
/* One OpenAI logprobs "content" entry for a token chunk. */
void exo_api_write_logprob(exo_sbuf *b, const exo_chunk *c);
/* Current UTC time as RFC 3339 with nanoseconds ("2024-01-01T00:00:00.000000000Z"). */
void exo_api_write_now(exo_sbuf *b);
/* The arguments text of a tool call as a JSON value (object when it parses). */
json_t *exo_api_args_value(const char *arguments);
/* Appends s as a JSON value to b through jansson (for once-per-request bodies). */
void exo_api_write_json(exo_sbuf *b, const json_t *j);

/* Helpers for the parsers: message content as text ("text" parts joined);
 * images are refused (no vision model is served yet). */
int exo_api_content_text(const json_t *content, const char *where, exo_sbuf *out, exo_err *err);
/* Common sampling fields: reads a number into a float field and sets the bit. */
int exo_api_read_float(const json_t *obj, const char *key, float *dst, uint32_t bit,
                       exo_gen_request *r, exo_err *err);
/* The same within [lo, hi], the range the real API accepts (OpenAI's
 * temperature 0..2, Claude's 0..1, ...): outside it a 400 naming both. */
int exo_api_read_float_in(const json_t *obj, const char *key, double lo, double hi, float *dst,
                          uint32_t bit, exo_gen_request *r, exo_err *err);
int exo_api_read_intf(const json_t *obj, const char *key, int *dst, uint32_t bit,
                      exo_gen_request *r, exo_err *err);
/* "stop": string or array of strings. */
int exo_api_read_stop(const json_t *obj, const char *key, exo_gen_request *r, exo_err *err);
int exo_api_read_seed(const json_t *obj, const char *key, exo_gen_request *r, exo_err *err);
/* OpenAI-format tools array (validated shape), copied into r->tools. */
int exo_api_read_openai_tools(const json_t *tools, exo_gen_request *r, exo_err *err);

#endif
