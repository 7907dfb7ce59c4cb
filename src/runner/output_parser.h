/* Model-output parsing: turns the detokenized text of a generation, fed one
 * token at a time, into the chunks the APIs serve: reasoning text
 * (is_thinking), visible text, and tool calls, and applies stop sequences.
 *
 * Pipeline per fed token (all stages hold back text that may be the start of
 * a marker split across tokens, and release it as soon as it cannot be):
 *   1. stop sequences on the raw text: the text before the first match is
 *      emitted, everything from the match on is dropped, feed() returns true
 *      and the caller ends the generation with EXO_FR_STOP;
 *   2. reasoning tags (<think>...</think>, or any pair given), optionally
 *      starting inside the block when the prompt already opened it;
 *   3. tool calls in the family's syntax, on non-reasoning text only:
 *      Hermes/Qwen `<tool_call>{"name","arguments"}</tool_call>`, Llama 3
 *      JSON (`{"name","parameters"}` as the whole answer, or after
 *      `<|python_tag|>`), DeepSeek-V3 `<｜tool▁calls▁begin｜>` blocks (V3 and
 *      V3.1 layouts), Qwen3-Coder / Qwen3.5 XML (`<tool_call><function=NAME>
 *      <parameter=K>V</parameter></function></tool_call>`, or a bare
 *      `<function=...>`), GLM-4.5/4.6/4.7 (`<tool_call>NAME<arg_key>K</arg_key>
 *      <arg_value>V</arg_value></tool_call>`), Kimi K2
 *      (`<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
 *      <|tool_call_argument_begin|>{json}<|tool_call_end|>...`); GPT-OSS
 *      harmony replaces 2 and 3 with its channel parser (analysis ->
 *      reasoning, final / plain commentary -> text, commentary
 *      to=functions.NAME -> a tool call).
 *      The XML formats write argument values as text: they are typed by the
 *      tool's schema (exo_tool_args_check's coercions; GLM values also read
 *      as JSON where the declared type is not string, as vLLM does).
 * Special tokens must be present in the fed text (decode without skipping
 * special tokens for these families).
 *
 * Decision on bad tool calls: a call whose JSON does not parse, names a tool
 * the request did not declare, or violates the tool's parameter schema
 * (required properties, basic types after exo's string coercions), and a call
 * left unterminated at the end, is emitted as plain text (its raw markup), and
 * the finish reason is left as is. A block holding several calls (one
 * <tool_call>, a DeepSeek or Kimi section) is all calls or all text. Without
 * tools in the request, tool-call syntax is not parsed at all. Well-formed
 * calls are emitted whole, one TOOL_CALLS chunk per call, and turn a
 * stop/length finish into tool_calls.
 *
 * Token metadata: the first chunk emitted while a token is fed carries that
 * token's id and logprobs; text released later (held-back marker prefixes)
 * rides on a later chunk, or on a chunk with token_id -1 at finish. */
#ifndef EXO_RUNNER_OUTPUT_PARSER_H
#define EXO_RUNNER_OUTPUT_PARSER_H

#include "proto/gen_types.h"

#include <stdbool.h>

typedef enum exo_tool_format {
    EXO_TOOL_FMT_NONE = 0,
    EXO_TOOL_FMT_HERMES,      /* Qwen 2.5/3, Hermes, most instruct models */
    EXO_TOOL_FMT_LLAMA3,
    EXO_TOOL_FMT_DEEPSEEK_V3,
    EXO_TOOL_FMT_HARMONY,     /* GPT-OSS */
    EXO_TOOL_FMT_QWEN3_XML,   /* Qwen3-Coder, Qwen3.5: <function=NAME><parameter=K> */
    EXO_TOOL_FMT_GLM4,        /* GLM-4.5/4.6/4.7 (glm4_moe): <arg_key>/<arg_value> */
    EXO_TOOL_FMT_KIMI_K2,     /* Kimi K2: <|tool_calls_section_begin|> */
    EXO_TOOL_FMT_COUNT
} exo_tool_format;

typedef struct exo_output_parser_config {
    exo_tool_format tool_format;
    const char *think_start, *think_end; /* NULL: no reasoning tags */
    bool starts_in_thinking;             /* the prompt ends inside think_start */
    const char *const *stop;
    int n_stop;
    const json_t *tools; /* the request's tools (borrowed for the parser's life) */
    bool raw;            /* bench: stop sequences only, no parsing */
} exo_output_parser_config;

/* Picks the tool format and reasoning tags from a chat template's text, and
 * starts_in_thinking from the end of the rendered prompt (either may be NULL).
 * Templates that write `<think>` get <think>...</think> reasoning (Qwen3,
 * Qwen3.5, DeepSeek-V3.1/R1, GLM-4.5+, Kimi K2 Thinking). */
void exo_output_parser_detect(const char *chat_template, const char *prompt,
                              exo_output_parser_config *cfg);

typedef struct exo_output_parser exo_output_parser;

/* The callback borrows the chunk for the duration of the call. */
typedef void (*exo_chunk_fn)(void *ctx, const exo_chunk *c);

exo_output_parser *exo_output_parser_create(const exo_output_parser_config *cfg);
void               exo_output_parser_free(exo_output_parser *p);

/* Feeds one TOKEN chunk (its text, id and logprobs). Returns true once a stop
 * sequence has matched; later feeds are ignored. */
bool exo_output_parser_feed(exo_output_parser *p, const exo_chunk *tok, exo_chunk_fn emit,
                            void *ctx);
/* Releases everything held back and returns the finish reason to report. */
exo_finish_reason exo_output_parser_finish(exo_output_parser *p, exo_finish_reason reason,
                                           exo_chunk_fn emit, void *ctx);
/* Tokens that were (part of) reasoning, for usage.reasoning_tokens. */
int exo_output_parser_reasoning_tokens(const exo_output_parser *p);
/* The stop sequence that matched, or NULL (for the FINISH chunk). */
const char *exo_output_parser_stop_sequence(const exo_output_parser *p);

/* Checks (and coerces in place, as exo does: "3" -> 3 for an integer or
 * number property, "2.5" -> 2.5, "true" -> true, "{...}" -> object, "null" ->
 * null where the type list allows null; whitespace around a scalar is
 * ignored) a call's arguments against the declared tool: EXO_ENOENT for an
 * undeclared tool, EXO_EINVAL otherwise. */
int exo_tool_args_check(const json_t *tools, const char *name, json_t *args, exo_err *err);

#endif
