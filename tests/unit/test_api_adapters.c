/* Adapters: request parsing and validation per API family (errors in each
 * family's format), and the wire bytes of every encoder, streaming and not:
 * SSE framing, event order, sequence numbers, logprobs, usage, NDJSON. */
#include "api/api.h"
#include "api/gen_response.h"
#include "core/alloc.h"

#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

static int parse(exo_api_family f, const char *body, exo_gen_request *r, exo_err *err)
{
    int status = 0;
    int rc = exo_api_parse_request(f, body, strlen(body), r, &status, err);
    if (rc)
        cr_assert_eq(status, 400);
    return rc;
}

Test(api_adapters, openai_request)
{
    exo_gen_request r;
    exo_err err = {0};
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S1\"},"
        "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"S2\"}]},"
        "{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
        "{\"role\":\"assistant\",\"content\":null}],"
        "\"max_tokens\":100,\"temperature\":0.2,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.1,\"stop\":\"###\","
        "\"seed\":7,\"stream\":true,\"logprobs\":true,\"top_logprobs\":4,\"enable_thinking\":false,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"response_format\":{\"type\":\"text\"},\"stream_options\":{\"include_usage\":true}}";
    cr_assert_eq(parse(EXO_API_OPENAI_CHAT, body, &r, &err), 0, "%s", err.msg);
    cr_assert_str_eq(r.model, "m");
    cr_assert_str_eq(r.instructions, "S1\nS2");
    cr_assert_eq(json_array_size(r.messages), 5); /* the empty assistant message is dropped */
    json_t *sys2 = json_array_get(r.messages, 1);
    cr_assert_str_eq(json_string_value(json_object_get(sys2, "role")), "system");
    json_t *call = json_array_get(json_object_get(json_array_get(r.messages, 3), "tool_calls"), 0);
    cr_assert(json_is_object(json_object_get(json_object_get(call, "function"), "arguments")));
    cr_assert_eq(r.max_tokens, 100);
    cr_assert(r.has & EXO_GEN_HAS_TOP_K);
    cr_assert(!(r.has & EXO_GEN_HAS_REP_PENALTY));
    cr_assert_eq(r.n_stop, 1);
    cr_assert_eq(r.sampling.seed, 7);
    cr_assert_eq(r.sampling.top_logprobs, 4);
    cr_assert(r.stream && r.logprobs);
    cr_assert_eq(r.enable_thinking, 0);
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_NONE);
    cr_assert_eq(json_array_size(r.tools), 1);
    exo_gen_request_free(&r);
}

Test(api_adapters, openai_rejects)
{
    const char *bad[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\"}",
        "{\"model\":\"m\",\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}",
        /* OpenAI's ranges */
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2.5}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":-0.1}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":3}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"frequency_penalty\":-2.5}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":50}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"ultra\"}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]",
        "{\"model\":\"m\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\u0000\"}]}",
        "[1,2]",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        exo_gen_request r;
        exo_err err = {0};
        cr_assert_neq(parse(EXO_API_OPENAI_CHAT, bad[i], &r, &err), 0, "accepted %s", bad[i]);
        cr_assert(err.msg[0]);
    }
    /* the edges of the ranges are accepted */
    exo_gen_request r;
    exo_err err = {0};
    cr_assert_eq(parse(EXO_API_OPENAI_CHAT,
                       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":2,"
                       "\"top_p\":0,\"presence_penalty\":-2,\"frequency_penalty\":2,\"n\":1,\"max_tokens\":1}",
                       &r, &err), 0, "%s", err.msg);
    exo_gen_request_free(&r);
}

/* What the real Messages and Responses APIs refuse (each a 400). */
Test(api_adapters, claude_and_responses_reject)
{
    static const char *const claude[] = {
        "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}",
        "{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"temperature\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"top_p\":2,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"top_k\":-1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":\"Z\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"bogus\"}]}]}",
    };
    static const char *const responses[] = {
        "{\"model\":\"m\",\"input\":[]}",
        "{\"model\":\"m\",\"input\":\"x\",\"temperature\":3}",
        "{\"model\":\"m\",\"input\":\"x\",\"top_p\":-1}",
        "{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}",
        "{\"model\":\"m\",\"input\":[{\"type\":\"bogus_item\"}]}",
        "{\"model\":\"m\",\"input\":[{\"content\":\"no role, no type\"}]}",
        "{\"model\":\"m\",\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
    };
    for (size_t i = 0; i < sizeof claude / sizeof *claude; i++) {
        exo_gen_request r;
        exo_err err = {0};
        cr_assert_neq(parse(EXO_API_CLAUDE, claude[i], &r, &err), 0, "accepted %s", claude[i]);
        cr_assert(err.msg[0]);
    }
    for (size_t i = 0; i < sizeof responses / sizeof *responses; i++) {
        exo_gen_request r;
        exo_err err = {0};
        cr_assert_neq(parse(EXO_API_RESPONSES, responses[i], &r, &err), 0, "accepted %s", responses[i]);
        cr_assert(err.msg[0]);
    }
    exo_gen_request r;
    exo_err err = {0};
    cr_assert_eq(parse(EXO_API_CLAUDE, "{\"model\":\"m\",\"max_tokens\":1,\"temperature\":1,\"top_p\":0,\"top_k\":0,"
                       "\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &err), 0, "%s", err.msg);
    exo_gen_request_free(&r);
    cr_assert_eq(parse(EXO_API_RESPONSES, "{\"model\":\"m\",\"temperature\":2,\"top_p\":1,"
                       "\"input\":[{\"role\":\"user\",\"content\":\"x\"},{\"type\":\"mcp_list_tools\"}]}", &r, &err),
                 0, "%s", err.msg);
    exo_gen_request_free(&r);
}

Test(api_adapters, route_table_matches_path_families)
{
    cr_assert_eq(exo_api_n_generation_routes, 11);
    cr_assert_eq(exo_api_family_for_path("/api/chat"), EXO_API_OLLAMA_CHAT);
    cr_assert_eq(exo_api_family_for_path("/api/generate"), EXO_API_OLLAMA_GENERATE);
    cr_assert_eq(exo_api_family_for_path("/api/tags"), EXO_API_OLLAMA_CHAT); /* router errors as Ollama's */
    for (int i = 0; i < exo_api_n_generation_routes; i++)
        cr_assert_eq(exo_api_family_for_path(exo_api_generation_routes[i].path), exo_api_generation_routes[i].family,
                     "%s", exo_api_generation_routes[i].path);
}

Test(api_adapters, error_bodies)
{
    char *o = exo_api_error_body(EXO_API_OPENAI_CHAT, 400, "bad \"x\"");
    json_t *j = json_loads(o, 0, NULL);
    cr_assert(j);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "bad \"x\"");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "invalid_request_error");
    cr_assert(json_object_get(json_object_get(j, "error"), "param"));
    json_decref(j);
    exo_free(o);
    o = exo_api_error_body(EXO_API_CLAUDE, 400, "max_tokens: Field required");
    j = json_loads(o, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "error");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "invalid_request_error");
    json_decref(j);
    exo_free(o);
    o = exo_api_error_body(EXO_API_OLLAMA_CHAT, 404, "model not found");
    j = json_loads(o, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "error")), "model not found");
    json_decref(j);
    exo_free(o);
}

Test(api_adapters, claude_request)
{
    exo_gen_request r;
    exo_err err = {0};
    cr_assert_neq(parse(EXO_API_CLAUDE, "{\"model\":\"m\",\"messages\":[]}", &r, &err), 0);
    cr_assert(strstr(err.msg, "max_tokens"));
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":50,\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: abc;\\nYou are helpful.\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{\"c\":\"P\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]}]}],"
        "\"tools\":[{\"name\":\"get\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}},{\"type\":\"web_search_20250305\",\"name\":\"web_search\"}],"
        "\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1000},\"stop_sequences\":[\"Z\"],\"stream\":true,\"metadata\":{}}";
    cr_assert_eq(parse(EXO_API_CLAUDE, body, &r, &err), 0, "%s", err.msg);
    cr_assert_str_eq(r.instructions, "You are helpful.");
    cr_assert_eq(json_array_size(r.messages), 4, "%zu", json_array_size(r.messages));
    json_t *a = json_array_get(r.messages, 2);
    cr_assert_str_eq(json_string_value(json_object_get(a, "reasoning_content")), "hmm");
    cr_assert_eq(json_array_size(json_object_get(a, "tool_calls")), 1);
    json_t *t = json_array_get(r.messages, 3);
    cr_assert_str_eq(json_string_value(json_object_get(t, "role")), "tool");
    cr_assert_str_eq(json_string_value(json_object_get(t, "content")), "sunny");
    cr_assert_eq(json_array_size(r.tools), 1);
    cr_assert_eq(r.enable_thinking, 1);
    cr_assert_eq(r.max_tokens, 50);
    exo_gen_request_free(&r);
}

Test(api_adapters, responses_request)
{
    exo_gen_request r;
    exo_err err = {0};
    cr_assert_eq(parse(EXO_API_RESPONSES, "{\"model\":\"m\",\"input\":\"hello\",\"instructions\":\"be nice\"}", &r, &err), 0);
    cr_assert_eq(json_array_size(r.messages), 2);
    exo_gen_request_free(&r);
    const char *body =
        "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"w?\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"get\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"rain\"},"
        "{\"type\":\"item_reference\",\"id\":\"x\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"get\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
        "\"reasoning\":{\"effort\":\"low\"},\"max_output_tokens\":10,\"stream\":true}";
    cr_assert_eq(parse(EXO_API_RESPONSES, body, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(json_array_size(r.messages), 3);
    json_t *a = json_array_get(r.messages, 1);
    cr_assert_eq(json_array_size(json_object_get(a, "tool_calls")), 2); /* merged */
    cr_assert_str_eq(json_string_value(json_object_get(a, "reasoning_content")), "think");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"), "name")), "get");
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_LOW);
    cr_assert_eq(r.enable_thinking, 1);
    exo_gen_request_free(&r);
    cr_assert_neq(parse(EXO_API_RESPONSES, "{\"model\":\"m\"}", &r, &err), 0);
    cr_assert_neq(parse(EXO_API_RESPONSES, "{\"model\":\"m\",\"input\":5}", &r, &err), 0);
}

Test(api_adapters, ollama_requests)
{
    exo_gen_request r;
    exo_err err = {0};
    cr_assert_eq(parse(EXO_API_OLLAMA_CHAT,
                       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
                       "{\"role\":\"tool\",\"tool_name\":\"f\",\"content\":\"1\"}],"
                       "\"options\":{\"num_predict\":20,\"temperature\":0.1,\"stop\":[\"x\"],\"seed\":3},\"think\":true}",
                       &r, &err), 0, "%s", err.msg);
    cr_assert(r.stream); /* Ollama streams by default */
    cr_assert_eq(r.max_tokens, 20);
    cr_assert_eq(r.enable_thinking, 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(r.messages, 2), "tool_call_id")), "f");
    exo_gen_request_free(&r);
    cr_assert_eq(parse(EXO_API_OLLAMA_GENERATE, "{\"model\":\"m\",\"prompt\":\"p\",\"system\":\"s\",\"stream\":false}", &r, &err), 0);
    cr_assert(!r.stream);
    cr_assert_eq(json_array_size(r.messages), 2);
    exo_gen_request_free(&r);
    cr_assert_neq(parse(EXO_API_OLLAMA_CHAT, "{\"model\":\"m\",\"options\":{\"temperature\":\"x\"}}", &r, &err), 0);
}

/* ---- encoders ------------------------------------------------------------------ */

static exo_gen_request req_for(bool stream, bool logprobs)
{
    exo_gen_request r;
    exo_gen_request_init(&r);
    r.model = strdup("test-model");
    r.messages = json_array();
    r.stream = stream;
    r.logprobs = logprobs;
    return r;
}

/* Feeds: thinking "hm", text "Hel" "lo", one tool call, finish(reason). */
static char *run_encoder(exo_api_family f, bool stream, bool logprobs, exo_finish_reason reason, bool error)
{
    exo_gen_request r = req_for(stream, logprobs);
    exo_api_encoder *e = exo_api_encoder_create(f, &r, "cmd1", 1700000000);
    exo_sbuf out;
    exo_sbuf_init(&out);
    exo_api_encoder_begin(e, &out);
    exo_chunk c;
    exo_chunk_prefill(&c, 5, 10);
    cr_assert(!exo_api_encoder_feed(e, &c, &out));
    exo_chunk_token(&c, "hm", 2, 1, true);
    exo_api_encoder_feed(e, &c, &out);
    exo_chunk_free(&c);
    const char *parts[] = {"Hel", "lo \"\xc3\xa9\"\n"};
    for (int i = 0; i < 2; i++) {
        exo_chunk_token(&c, parts[i], strlen(parts[i]), 2 + i, false);
        c.has_logprob = true;
        c.logprob = -0.5f;
        exo_chunk_set_top(&c, 0, parts[i], -0.5f);
        exo_chunk_set_top(&c, 1, "x", -2.0f);
        cr_assert(!exo_api_encoder_feed(e, &c, &out));
        exo_chunk_free(&c);
    }
    if (reason == EXO_FR_TOOL_CALLS) {
        exo_chunk_tool_calls(&c);
        exo_chunk_add_tool_call(&c, "call_abc", "get_weather", "{\"city\":\"Paris\"}");
        exo_api_encoder_feed(e, &c, &out);
        exo_chunk_free(&c);
    }
    if (error) {
        exo_chunk_error(&c, "runner died");
    } else {
        exo_usage u = {.prompt_tokens = 10, .completion_tokens = 4, .reasoning_tokens = 1};
        exo_chunk_finish(&c, reason, &u, 100, 50);
        c.peak_memory_bytes = 123456789;
    }
    cr_assert(exo_api_encoder_feed(e, &c, &out));
    exo_chunk_free(&c);
    exo_chunk_token(&c, "late", 4, 9, false);
    cr_assert(exo_api_encoder_feed(e, &c, &out)); /* ignored after the end */
    exo_chunk_free(&c);
    if (!stream)
        cr_assert_eq(exo_api_encoder_status(e), error ? 500 : 200);
    exo_api_encoder_free(e);
    exo_gen_request_free(&r);
    return exo_sbuf_take(&out);
}

/* Splits SSE text into events: returns a JSON array of {event?, data (parsed or string)}. */
static json_t *sse_events(const char *s)
{
    json_t *events = json_array();
    const char *p = s;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        cr_assert(end, "unterminated SSE event: %s", p);
        char *ev = strndup(p, (size_t)(end - p));
        json_t *o = json_object();
        char *save = NULL;
        for (char *line = strtok_r(ev, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, "event: ", 7))
                json_object_set_new(o, "event", json_string(line + 7));
            else if (!strncmp(line, "data: ", 6)) {
                json_error_t je;
                json_t *d = json_loads(line + 6, 0, &je);
                if (!d) {
                    cr_assert_str_eq(line + 6, "[DONE]", "bad data line: %s (%s)", line, je.text);
                    d = json_string("[DONE]");
                }
                json_object_set_new(o, "data", d);
            } else {
                cr_assert(line[0] == ':', "bad SSE line %s", line);
                json_object_set_new(o, "comment", json_string(line));
            }
        }
        free(ev);
        json_array_append_new(events, o);
        p = end + 2;
    }
    return events;
}

Test(api_adapters, openai_stream)
{
    char *s = run_encoder(EXO_API_OPENAI_CHAT, true, true, EXO_FR_TOOL_CALLS, false);
    json_t *ev = sse_events(s);
    size_t n = json_array_size(ev);
    cr_assert(strstr(json_string_value(json_object_get(json_array_get(ev, 0), "comment")), "prefill_progress"));
    json_t *think = json_object_get(json_array_get(ev, 1), "data");
    cr_assert_str_eq(json_string_value(json_object_get(think, "object")), "chat.completion.chunk");
    json_t *delta = json_object_get(json_array_get(json_object_get(think, "choices"), 0), "delta");
    cr_assert_str_eq(json_string_value(json_object_get(delta, "reasoning_content")), "hm");
    json_t *tok = json_object_get(json_array_get(ev, 3), "data");
    json_t *ch = json_array_get(json_object_get(tok, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")), "lo \"\xc3\xa9\"\n");
    json_t *lp = json_array_get(json_object_get(json_object_get(ch, "logprobs"), "content"), 0);
    cr_assert_float_eq(json_real_value(json_object_get(lp, "logprob")), -0.5, 1e-6);
    cr_assert_eq(json_array_size(json_object_get(lp, "bytes")), strlen("lo \"\xc3\xa9\"\n"));
    cr_assert_eq(json_array_size(json_object_get(lp, "top_logprobs")), 2);
    json_t *tc = json_object_get(json_array_get(ev, 4), "data");
    json_t *call = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(tc, "choices"), 0), "delta"), "tool_calls"), 0);
    cr_assert_eq(json_integer_value(json_object_get(call, "index")), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), "{\"city\":\"Paris\"}");
    json_t *fin = json_object_get(json_array_get(ev, 5), "data");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(fin, "choices"), 0), "finish_reason")), "tool_calls");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(fin, "usage"), "total_tokens")), 14);
    cr_assert(strstr(json_string_value(json_object_get(json_array_get(ev, n - 2), "comment")), "generation_stats"));
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, n - 1), "data")), "[DONE]");
    json_decref(ev);
    free(s);
}

Test(api_adapters, openai_body_and_error)
{
    char *s = run_encoder(EXO_API_OPENAI_CHAT, false, true, EXO_FR_TOOL_CALLS, false);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "content")), "Hello \"\xc3\xa9\"\n");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "reasoning_content")), "hm");
    cr_assert_eq(json_array_size(json_object_get(msg, "tool_calls")), 1);
    cr_assert_eq(json_array_size(json_object_get(json_object_get(ch, "logprobs"), "content")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
    json_decref(j);
    free(s);
    s = run_encoder(EXO_API_OPENAI_CHAT, true, false, EXO_FR_STOP, true);
    json_t *ev = sse_events(s);
    size_t n = json_array_size(ev);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(json_array_get(ev, n - 2), "data"), "error"), "message")), "runner died");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, n - 1), "data")), "[DONE]");
    json_decref(ev);
    free(s);
    s = run_encoder(EXO_API_BENCH_CHAT, false, false, EXO_FR_LENGTH, false);
    j = json_loads(s, 0, NULL);
    json_t *gs = json_object_get(j, "generation_stats");
    cr_assert(gs, "%s", s);
    cr_assert_float_eq(json_number_value(json_object_get(gs, "prompt_tps")), 100, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(gs, "generation_tps")), 50, 1e-9);
    cr_assert_eq(json_integer_value(json_object_get(gs, "generation_tokens")), 4);
    cr_assert_eq(json_integer_value(json_object_get(gs, "peak_memory_usage")), 123456789,
                 "the runner's peak memory is passed through");
    json_decref(j);
    free(s);
}

static void expect_event_order(json_t *ev, const char *const *want, size_t n_want, bool seq)
{
    size_t k = 0;
    int last_seq = -1;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        const char *name = json_string_value(json_object_get(e, "event"));
        if (!name)
            continue;
        json_t *data = json_object_get(e, "data");
        cr_assert_str_eq(json_string_value(json_object_get(data, "type")), name);
        if (seq) {
            int sn = (int)json_integer_value(json_object_get(data, "sequence_number"));
            cr_assert_eq(sn, last_seq + 1, "sequence_number %d after %d", sn, last_seq);
            last_seq = sn;
        }
        cr_assert(k < n_want, "extra event %s", name);
        cr_assert_str_eq(name, want[k], "event %zu", k);
        k++;
    }
    cr_assert_eq(k, n_want);
}

Test(api_adapters, claude_stream_sequence)
{
    char *s = run_encoder(EXO_API_CLAUDE, true, false, EXO_FR_TOOL_CALLS, false);
    json_t *ev = sse_events(s);
    static const char *const want[] = {
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"};
    expect_event_order(ev, want, sizeof want / sizeof *want, false);
    json_t *start = json_object_get(json_array_get(ev, 0), "data");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(start, "message"), "id")), "msg_cmd1");
    json_t *tool = json_object_get(json_object_get(json_array_get(ev, 8), "data"), "content_block");
    cr_assert_str_eq(json_string_value(json_object_get(tool, "type")), "tool_use");
    cr_assert_str_eq(json_string_value(json_object_get(tool, "id")), "toolu_abc");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(json_array_get(ev, 8), "data"), "index")), 2);
    json_t *md = json_object_get(json_array_get(ev, 11), "data");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(md, "delta"), "stop_reason")), "tool_use");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(md, "usage"), "output_tokens")), 4);
    json_decref(ev);
    free(s);
    /* empty generation: one empty text block */
    exo_gen_request r = req_for(true, false);
    exo_api_encoder *e = exo_api_encoder_create(EXO_API_CLAUDE, &r, "x", 0);
    exo_sbuf out;
    exo_sbuf_init(&out);
    exo_api_encoder_begin(e, &out);
    exo_chunk c;
    exo_chunk_finish(&c, EXO_FR_LENGTH, NULL, 0, 0);
    exo_api_encoder_feed(e, &c, &out);
    ev = sse_events(out.data);
    static const char *const want2[] = {"message_start", "content_block_start", "content_block_stop",
                                        "message_delta", "message_stop"};
    expect_event_order(ev, want2, 5, false);
    cr_assert(strstr(out.data, "\"max_tokens\""));
    json_decref(ev);
    exo_sbuf_free(&out);
    exo_api_encoder_free(e);
    /* a stop sequence is reported as Anthropic does */
    e = exo_api_encoder_create(EXO_API_CLAUDE, &r, "x", 0);
    exo_sbuf_init(&out);
    exo_chunk_finish(&c, EXO_FR_STOP, NULL, 0, 0);
    exo_chunk_set_stop_sequence(&c, "###");
    exo_api_encoder_feed(e, &c, &out);
    exo_chunk_free(&c);
    cr_assert(strstr(out.data, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"###\""), "%s", out.data);
    exo_sbuf_free(&out);
    exo_api_encoder_free(e);
    exo_gen_request_free(&r);
}

Test(api_adapters, claude_body)
{
    char *s = run_encoder(EXO_API_CLAUDE, false, false, EXO_FR_TOOL_CALLS, false);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    json_t *content = json_object_get(j, "content");
    cr_assert_eq(json_array_size(content), 3);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(content, 0), "type")), "thinking");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(content, 1), "text")), "Hello \"\xc3\xa9\"\n");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(content, 2), "input"), "city")), "Paris");
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "tool_use");
    json_decref(j);
    free(s);
    s = run_encoder(EXO_API_CLAUDE, false, false, EXO_FR_STOP, true);
    j = json_loads(s, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "error");
    json_decref(j);
    free(s);
}

Test(api_adapters, responses_stream_sequence)
{
    char *s = run_encoder(EXO_API_RESPONSES, true, false, EXO_FR_TOOL_CALLS, false);
    json_t *ev = sse_events(s);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"};
    expect_event_order(ev, want, sizeof want / sizeof *want, true);
    json_t *done = json_object_get(json_object_get(json_array_get(ev, json_array_size(ev) - 1), "data"), "response");
    cr_assert_str_eq(json_string_value(json_object_get(done, "status")), "completed");
    json_t *output = json_object_get(done, "output");
    cr_assert_eq(json_array_size(output), 3);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(output, 0), "type")), "reasoning");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(output, 1), "type")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(output, 2), "type")), "function_call");
    cr_assert_str_eq(json_string_value(json_object_get(done, "output_text")), "Hello \"\xc3\xa9\"\n");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(done, "usage"), "total_tokens")), 14);
    json_decref(ev);
    free(s);
    s = run_encoder(EXO_API_RESPONSES, true, false, EXO_FR_LENGTH, false);
    cr_assert(strstr(s, "event: response.incomplete\n"));
    free(s);
    s = run_encoder(EXO_API_RESPONSES, true, false, EXO_FR_STOP, true);
    cr_assert(strstr(s, "event: response.failed\n"));
    free(s);
    s = run_encoder(EXO_API_RESPONSES, false, false, EXO_FR_STOP, false);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    cr_assert_eq(json_array_size(json_object_get(j, "output")), 2);
    json_decref(j);
    free(s);
}

Test(api_adapters, ollama_ndjson)
{
    char *s = run_encoder(EXO_API_OLLAMA_CHAT, true, false, EXO_FR_TOOL_CALLS, false);
    int lines = 0;
    json_t *last = NULL;
    bool saw_thinking = false, saw_call = false;
    for (char *p = s, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        json_decref(last);
        last = json_loadb(p, (size_t)(nl - p), 0, NULL);
        cr_assert(last, "bad line");
        json_t *m = json_object_get(last, "message");
        if (json_object_get(m, "thinking"))
            saw_thinking = true;
        if (json_object_get(m, "tool_calls")) {
            saw_call = true;
            cr_assert(json_is_object(json_object_get(json_object_get(json_array_get(json_object_get(m, "tool_calls"), 0), "function"), "arguments")));
        }
        lines++;
    }
    cr_assert_eq(lines, 5);
    cr_assert(saw_thinking && saw_call);
    cr_assert(json_is_true(json_object_get(last, "done")));
    cr_assert_str_eq(json_string_value(json_object_get(last, "done_reason")), "tool_call");
    cr_assert_eq(json_integer_value(json_object_get(last, "eval_count")), 4);
    json_decref(last);
    free(s);
    s = run_encoder(EXO_API_OLLAMA_GENERATE, false, false, EXO_FR_STOP, false);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    cr_assert_str_eq(json_string_value(json_object_get(j, "response")), "Hello \"\xc3\xa9\"\n");
    json_decref(j);
    free(s);
    s = run_encoder(EXO_API_OLLAMA_CHAT, true, false, EXO_FR_STOP, true);
    cr_assert(strstr(s, "{\"error\":\"runner died\"}\n"));
    free(s);
}

Test(api_adapters, ollama_state_endpoints)
{
    exo_api_model_info m[2] = {
        {.id = "org/a", .family = "qwen3", .quantization = "4bit", .size_bytes = 100, .context_length = 4096,
         .downloaded = true, .running = true},
        {.id = "org/b", .family = "llama", .downloaded = false},
    };
    char *t = exo_ollama_tags_json(m, 2);
    json_t *j = json_loads(t, 0, NULL);
    cr_assert_eq(json_array_size(json_object_get(j, "models")), 1);
    json_decref(j);
    exo_free(t);
    t = exo_ollama_ps_json(m, 2);
    cr_assert(strstr(t, "org/a"));
    exo_free(t);
    char *out = NULL;
    int st = 0;
    cr_assert_eq(exo_ollama_show_json("{\"model\":\"org/a\"}", 17, m, 2, &out, &st), 0);
    cr_assert_eq(st, 200);
    j = json_loads(out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "model_info"), "qwen3.context_length")), 4096);
    json_decref(j);
    exo_free(out);
    cr_assert_neq(exo_ollama_show_json("{}", 2, m, 2, &out, &st), 0);
    cr_assert_eq(st, 400);
    exo_free(out);
    cr_assert_neq(exo_ollama_show_json("{\"name\":\"zz\"}", 13, m, 2, &out, &st), 0);
    cr_assert_eq(st, 404);
    exo_free(out);
}

/* Encoding speed: a streamed token must cost microseconds, not milliseconds. */
Test(api_adapters, stream_encoding_speed)
{
    exo_gen_request r = req_for(true, true);
    exo_api_family fams[] = {EXO_API_OPENAI_CHAT, EXO_API_CLAUDE, EXO_API_RESPONSES, EXO_API_OLLAMA_CHAT};
    for (size_t f = 0; f < 4; f++) {
        exo_api_encoder *e = exo_api_encoder_create(fams[f], &r, "id", 0);
        exo_sbuf out;
        exo_sbuf_init(&out);
        exo_chunk c;
        exo_chunk_token(&c, " token", 6, 5, false);
        c.has_logprob = true;
        for (int i = 0; i < 5; i++)
            exo_chunk_set_top(&c, i, " tok", -1.0f);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int N = 20000;
        for (int i = 0; i < N; i++) {
            exo_api_encoder_feed(e, &c, &out);
            exo_sbuf_clear(&out);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / N;
        cr_log_info("family %zu: %.2f us per token", f, us);
        cr_expect_lt(us, 50.0, "family %zu: %.2f us per token", f, us);
        exo_chunk_free(&c);
        exo_sbuf_free(&out);
        exo_api_encoder_free(e);
    }
    exo_gen_request_free(&r);
}

/* An error chunk with a 4xx status (a prompt over the context) gives that
 * status and each family's client-error type, streaming or not. */
Test(api_adapters, client_error_chunks_keep_their_status)
{
    static const struct {
        exo_api_family f;
        const char *body_has, *stream_has;
    } fam[] = {
        {EXO_API_OPENAI_CHAT, "\"type\":\"invalid_request_error\"", "\"type\":\"invalid_request_error\",\"code\":400"},
        {EXO_API_CLAUDE, "\"type\":\"invalid_request_error\"", "\"type\":\"invalid_request_error\""},
        {EXO_API_RESPONSES, "\"code\":400", "\"code\":\"invalid_prompt\""},
        {EXO_API_OLLAMA_CHAT, "{\"error\":\"too long\"}", "{\"error\":\"too long\"}"},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
        for (int stream = 0; stream < 2; stream++) {
            exo_gen_request r = req_for(stream, false);
            exo_api_encoder *e = exo_api_encoder_create(fam[i].f, &r, "cmd1", 1700000000);
            exo_sbuf out;
            exo_sbuf_init(&out);
            exo_api_encoder_begin(e, &out);
            exo_chunk c;
            exo_chunk_error_status(&c, 400, "too long");
            cr_assert(exo_api_encoder_feed(e, &c, &out));
            exo_chunk_free(&c);
            if (!stream)
                cr_assert_eq(exo_api_encoder_status(e), 400);
            char *s = exo_sbuf_take(&out);
            const char *want = stream ? fam[i].stream_has : fam[i].body_has;
            cr_assert(strstr(s, want), "family %zu stream %d: no %s in %s", i, stream, want, s);
            cr_assert(!strstr(s, "server_error") && !strstr(s, "InternalServerError") &&
                          !strstr(s, "api_error"),
                      "family %zu stream %d: %s", i, stream, s);
            exo_free(s);
            exo_api_encoder_free(e);
            exo_gen_request_free(&r);
        }
}

/* The data object of the last SSE event of a type, or NULL. */
static json_t *last_event(json_t *ev, const char *type)
{
    json_t *found = NULL;
    size_t i;
    json_t *x;
    json_array_foreach(ev, i, x) {
        json_t *d = json_object_get(x, "data");
        const char *t = json_string_value(json_object_get(d, "type"));
        if (t && !strcmp(t, type))
            found = d;
    }
    return found;
}

/* An error while the message is open: the message is closed as incomplete
 * (text done, part done, item done) before response.failed, whose output
 * holds whole items only: the openai SDK's accumulator reads each item's
 * type and threw a TypeError on the null an open item left. */
Test(api_adapters, responses_failed_closes_open_items)
{
    char *s = run_encoder(EXO_API_RESPONSES, true, false, EXO_FR_STOP, true);
    json_t *ev = sse_events(s);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.failed"};
    expect_event_order(ev, want, sizeof want / sizeof *want, true);
    json_t *msg_done = json_object_get(last_event(ev, "response.output_item.done"), "item");
    cr_assert_str_eq(json_string_value(json_object_get(msg_done, "status")), "incomplete");
    json_t *resp = json_object_get(last_event(ev, "response.failed"), "response");
    cr_assert_str_eq(json_string_value(json_object_get(resp, "status")), "failed");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(resp, "error"), "message")), "runner died");
    json_t *output = json_object_get(resp, "output");
    cr_assert_eq(json_array_size(output), 2, "%s", s);
    size_t i;
    json_t *it;
    json_array_foreach(output, i, it) cr_assert(json_is_object(it), "output[%zu] is %s", i, s);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(output, 1), "status")), "incomplete");
    json_decref(ev);
    free(s);

    /* an error before any item: response.failed with an empty output */
    exo_gen_request r = req_for(true, false);
    exo_api_encoder *e = exo_api_encoder_create(EXO_API_RESPONSES, &r, "cmd2", 1700000000);
    exo_sbuf out;
    exo_sbuf_init(&out);
    exo_api_encoder_begin(e, &out);
    exo_chunk c;
    exo_chunk_error(&c, "no runner");
    cr_assert(exo_api_encoder_feed(e, &c, &out));
    exo_chunk_free(&c);
    ev = sse_events(out.data);
    resp = json_object_get(last_event(ev, "response.failed"), "response");
    cr_assert(json_is_array(json_object_get(resp, "output")) && json_array_size(json_object_get(resp, "output")) == 0,
              "%s", out.data);
    cr_assert_null(last_event(ev, "response.output_item.done"));
    json_decref(ev);
    exo_sbuf_free(&out);
    exo_api_encoder_free(e);
    exo_gen_request_free(&r);
}

/* max_output_tokens reached: the message item is done as "incomplete", in
 * the stream and in the non-streaming body, as OpenAI's. */
Test(api_adapters, responses_incomplete_item_status)
{
    char *s = run_encoder(EXO_API_RESPONSES, true, false, EXO_FR_LENGTH, false);
    json_t *ev = sse_events(s);
    json_t *msg_done = json_object_get(last_event(ev, "response.output_item.done"), "item");
    cr_assert_str_eq(json_string_value(json_object_get(msg_done, "type")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg_done, "status")), "incomplete");
    json_t *resp = json_object_get(last_event(ev, "response.incomplete"), "response");
    cr_assert_str_eq(json_string_value(json_object_get(resp, "status")), "incomplete");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(resp, "incomplete_details"), "reason")),
                     "max_output_tokens");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(resp, "output"), 1), "status")),
                     "incomplete");
    json_decref(ev);
    free(s);
    s = run_encoder(EXO_API_RESPONSES, false, false, EXO_FR_LENGTH, false);
    json_t *j = json_loads(s, 0, NULL);
    cr_assert(j, "%s", s);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "incomplete");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "output"), 1), "status")),
                     "incomplete");
    json_decref(j);
    free(s);
    s = run_encoder(EXO_API_RESPONSES, false, false, EXO_FR_STOP, false);
    j = json_loads(s, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(j, "output"), 1), "status")),
                     "completed");
    json_decref(j);
    free(s);
}

/* A logprobs entry names its token as its top_logprobs alternatives do
 * (token_text: decoded after its predecessor, with its leading space), not
 * the piece of content the chunk carries ("upon" at the start of an answer). */
Test(api_adapters, logprob_entry_names_the_token_text)
{
    for (int stream = 0; stream < 2; stream++) {
        exo_gen_request r = req_for(stream, true);
        exo_api_encoder *e = exo_api_encoder_create(EXO_API_OPENAI_CHAT, &r, "cmd3", 1700000000);
        exo_sbuf out;
        exo_sbuf_init(&out);
        exo_chunk c;
        exo_chunk_token(&c, "upon", 4, 7, false);
        exo_chunk_set_token_text(&c, " upon");
        c.has_logprob = true;
        c.logprob = -0.1f;
        exo_chunk_set_top(&c, 0, " upon", -0.1f);
        exo_api_encoder_feed(e, &c, &out);
        exo_chunk_free(&c);
        exo_usage u = {.prompt_tokens = 1, .completion_tokens = 1};
        exo_chunk_finish(&c, EXO_FR_STOP, &u, 1, 1);
        exo_api_encoder_feed(e, &c, &out);
        exo_chunk_free(&c);
        json_t *choice;
        json_t *ev = NULL, *body = NULL;
        if (stream) {
            ev = sse_events(out.data);
            choice = json_array_get(json_object_get(json_object_get(json_array_get(ev, 0), "data"), "choices"), 0);
            cr_assert_str_eq(json_string_value(json_object_get(json_object_get(choice, "delta"), "content")), "upon");
        } else {
            body = json_loads(out.data, 0, NULL);
            choice = json_array_get(json_object_get(body, "choices"), 0);
            cr_assert_str_eq(json_string_value(json_object_get(json_object_get(choice, "message"), "content")), "upon");
        }
        json_t *lp = json_array_get(json_object_get(json_object_get(choice, "logprobs"), "content"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(lp, "token")), " upon", "%s", out.data);
        cr_assert_eq(json_array_size(json_object_get(lp, "bytes")), 5);
        cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(lp, "top_logprobs"), 0), "token")),
                         " upon");
        json_decref(ev);
        json_decref(body);
        exo_sbuf_free(&out);
        exo_api_encoder_free(e);
        exo_gen_request_free(&r);
    }
}
