/* The canonical generation request and the chunks that answer it.
 *
 * Every API family (OpenAI chat, Claude messages, OpenAI responses, Ollama)
 * is parsed into one exo_gen_request (exo's TextGenerationTaskParams), and
 * every generation is answered by a stream of exo_chunks that each family's
 * encoder turns back into its own wire format. Both travel over runner pipes
 * and between nodes, so both have a JSON form, and the decoders treat their
 * input as untrusted: unknown keys, wrong types and out-of-range values are
 * rejected with a message naming the field.
 *
 * Chunk stream contract: zero or more TOKEN / TOOL_CALLS / PREFILL chunks,
 * then exactly one terminal chunk: FINISH (reason, usage, speed) or ERROR.
 * Nothing follows a terminal chunk. */
#ifndef EXO_PROTO_GEN_TYPES_H
#define EXO_PROTO_GEN_TYPES_H

#include "core/error.h"
#include "proto/sampling.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Limits on what a client may ask for (checked by exo_gen_request_validate). */
#define EXO_GEN_MAX_STOP        16      /* stop sequences */
#define EXO_GEN_MAX_STOP_LEN    1024    /* bytes per stop sequence */
#define EXO_GEN_MAX_TOKENS      1048576 /* max_tokens upper bound */
#define EXO_GEN_MAX_MESSAGES    100000
#define EXO_GEN_MAX_TOOLS       1024

typedef enum exo_finish_reason {
    EXO_FR_NONE = 0,
    EXO_FR_STOP,       /* end of sequence or a stop sequence */
    EXO_FR_LENGTH,     /* max_tokens or context full */
    EXO_FR_TOOL_CALLS, /* the turn ended with tool calls */
    EXO_FR_ERROR,
    EXO_FR_CANCELLED,
} exo_finish_reason;

const char *exo_finish_reason_name(exo_finish_reason r); /* "stop", "length", ... */
int         exo_finish_reason_parse(const char *s, exo_finish_reason *out);

typedef enum exo_reasoning_effort {
    EXO_EFFORT_UNSET = 0,
    EXO_EFFORT_NONE,
    EXO_EFFORT_MINIMAL,
    EXO_EFFORT_LOW,
    EXO_EFFORT_MEDIUM,
    EXO_EFFORT_HIGH,
    EXO_EFFORT_XHIGH,
} exo_reasoning_effort;

const char *exo_reasoning_effort_name(exo_reasoning_effort e); /* NULL for UNSET */
int         exo_reasoning_effort_parse(const char *s, exo_reasoning_effort *out);

/* Bits of exo_gen_request.has: which optional fields the client set, so
 * model-card and engine defaults apply to the others. */
enum {
    EXO_GEN_HAS_TEMPERATURE   = 1u << 0,
    EXO_GEN_HAS_TOP_P         = 1u << 1,
    EXO_GEN_HAS_TOP_K         = 1u << 2,
    EXO_GEN_HAS_MIN_P         = 1u << 3,
    EXO_GEN_HAS_REP_PENALTY   = 1u << 4,
    EXO_GEN_HAS_REP_CONTEXT   = 1u << 5,
    EXO_GEN_HAS_PRESENCE      = 1u << 6,
    EXO_GEN_HAS_FREQUENCY     = 1u << 7,
    EXO_GEN_HAS_SEED          = 1u << 8,
    EXO_GEN_HAS_MAX_TOKENS    = 1u << 9,
    EXO_GEN_HAS_TOP_LOGPROBS  = 1u << 10,
};

typedef struct exo_gen_request {
    char   *model;         /* required */
    json_t *messages;      /* owned array of HF chat-template messages: {role, content,
                              reasoning_content?, tool_calls?, tool_call_id?, name?} */
    json_t *tools;         /* owned array of {"type":"function","function":{name,
                              description?, parameters?}}, or NULL */
    char   *instructions;  /* system prompt text (also present in messages), or NULL */
    int     max_tokens;    /* valid when has & EXO_GEN_HAS_MAX_TOKENS */
    exo_sampler_params sampling; /* fields valid per `has`; the rest hold defaults */
    uint32_t has;
    char  **stop;          /* n_stop owned strings */
    int     n_stop;
    bool    logprobs;      /* report logprobs (sampling.top_logprobs alternatives) */
    exo_reasoning_effort reasoning_effort;
    int     enable_thinking; /* -1 unset, 0 off, 1 on */
    bool    stream;
    bool    bench;           /* EOS banned, no output parsing */
    bool    use_prefix_cache;
} exo_gen_request;

void exo_gen_request_init(exo_gen_request *r); /* empty, sampler defaults, thinking unset */
void exo_gen_request_free(exo_gen_request *r);

/* exo's resolve_reasoning_params: enable_thinking on -> effort medium, off ->
 * none; effort none -> thinking off, any other effort -> on; both given or
 * neither -> unchanged. The adapters call it once after parsing. */
void exo_gen_resolve_reasoning(exo_gen_request *r);

/* Adds a stop sequence (copied). EXO_ERANGE past the limits. */
int exo_gen_add_stop(exo_gen_request *r, const char *s, exo_err *err);

/* Range and shape checks of a filled request (sampling bounds, stops, message
 * shapes). The adapters and exo_gen_request_from_json call it. */
int exo_gen_request_validate(const exo_gen_request *r, exo_err *err);

/* JSON form (for pipes and peers). to_json never fails (aborts on OOM). */
json_t *exo_gen_request_to_json(const exo_gen_request *r);
int     exo_gen_request_from_json(const json_t *j, exo_gen_request *out, exo_err *err);

/* ---- chunks ---------------------------------------------------------- */

typedef enum exo_chunk_kind {
    EXO_CHUNK_TOKEN = 1,
    EXO_CHUNK_TOOL_CALLS,
    EXO_CHUNK_PREFILL,
    EXO_CHUNK_ERROR,  /* terminal */
    EXO_CHUNK_FINISH, /* terminal */
} exo_chunk_kind;

typedef struct exo_top_logprob {
    char *token; /* owned */
    float logprob;
} exo_top_logprob;

typedef struct exo_tool_call {
    char *id, *name, *arguments; /* owned; arguments is a JSON object text */
} exo_tool_call;

typedef struct exo_usage {
    int prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens;
} exo_usage;

typedef struct exo_chunk {
    exo_chunk_kind kind;
    /* TOKEN */
    char   *text;          /* owned */
    int32_t token_id;      /* -1 if the text is not one token's */
    char   *token_text;    /* owned or NULL: with a logprob, the sampled token's own text,
                            * decoded after its predecessor as its top_logprobs
                            * alternatives are (so " upon" with its space, where
                            * text may differ: the first piece of an answer, held-back
                            * text); what a logprobs entry names. NULL: text */
    bool    has_logprob;
    float   logprob;
    int     n_top;
    exo_top_logprob top[EXO_MAX_TOP_LOGPROBS];
    bool    is_thinking;
    /* TOOL_CALLS */
    int            n_tool_calls;
    exo_tool_call *tool_calls; /* owned */
    /* PREFILL */
    int processed, total;
    /* ERROR */
    char *error;           /* owned */
    int   error_status;    /* the HTTP status it maps to: 400-499 when the request
                            * itself cannot be served (too long for the context),
                            * else 500 */
    /* FINISH */
    exo_finish_reason reason;
    exo_usage usage;
    double    prompt_tps, generation_tps;
    int64_t   peak_memory_bytes; /* the runner's peak resident memory; 0 unknown */
    char     *stop_sequence; /* owned; the stop sequence that ended the text, or NULL */
} exo_chunk;

/* Constructors: the chunk owns copies of the strings; free with exo_chunk_free. */
void exo_chunk_token(exo_chunk *c, const char *text, size_t len, int32_t token_id, bool thinking);
void exo_chunk_error(exo_chunk *c, const char *message); /* status 500 */
void exo_chunk_error_status(exo_chunk *c, int http_status, const char *message);
void exo_chunk_finish(exo_chunk *c, exo_finish_reason reason, const exo_usage *usage,
                      double prompt_tps, double generation_tps);
void exo_chunk_prefill(exo_chunk *c, int processed, int total);
/* Starts an empty TOOL_CALLS chunk; add calls with exo_chunk_add_tool_call. */
void exo_chunk_tool_calls(exo_chunk *c);
void exo_chunk_add_tool_call(exo_chunk *c, const char *id, const char *name, const char *arguments);
void exo_chunk_set_top(exo_chunk *c, int i, const char *token, float logprob);
void exo_chunk_set_token_text(exo_chunk *c, const char *token_text); /* copied; NULL clears */
void exo_chunk_set_stop_sequence(exo_chunk *c, const char *stop); /* FINISH; NULL clears */
void exo_chunk_free(exo_chunk *c);
void exo_chunk_copy(exo_chunk *dst, const exo_chunk *src); /* deep copy */

json_t *exo_chunk_to_json(const exo_chunk *c);
int     exo_chunk_from_json(const json_t *j, exo_chunk *out, exo_err *err);

/* A fresh tool call id: prefix + 24 random hex digits ("call_9f..."). */
void exo_gen_random_id(char *out, size_t cap, const char *prefix);

#endif
