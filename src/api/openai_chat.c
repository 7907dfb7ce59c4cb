/* OpenAI Chat Completions adapter: /v1/chat/completions,
 * /ollama/v1/chat/completions and /bench/chat/completions.
 *
 * Request: messages become HF chat-template messages (system/developer text
 * also goes to `instructions`; developer is renamed system since templates
 * know only system; assistant tool_calls keep OpenAI's shape with
 * `arguments` parsed to an object when it is JSON, as templates expect).
 * Stream: one `data: {chat.completion.chunk}` event per token (content or
 * reasoning_content delta, logprobs in OpenAI's format), one per tool call,
 * a final chunk with finish_reason and usage, SSE comments for prefill
 * progress and generation stats (as exo), then `data: [DONE]`. Stream chunks
 * say object "chat.completion.chunk" (what the official clients check),
 * where exo says "chat.completion". */
#include "api/encoder_impl.h"
#include "core/json_util.h"
#include "core/alloc.h"

#include <string.h>

static int read_message(const json_t *m, size_t i, json_t *msgs, exo_sbuf *instr, exo_err *err)
{
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", i);
    if (!json_is_object(m))
        return exo_err_set(err, EXO_EINVAL, "%s must be an object", where);
    const char *role = NULL;
    int rc = exo_ju_str(m, "role", &role, true, err);
    if (rc)
        return exo_err_wrap(err, "%s", where);
    static const char *const roles[] = {"system", "user", "assistant", "developer", "tool",
                                        "function", NULL};
    bool ok = false;
    for (const char *const *r = roles; *r && !ok; r++)
        ok = !strcmp(*r, role);
    if (!ok)
        return exo_err_set(err, EXO_EINVAL, "%s.role '%.32s' is not supported", where, role);
    bool is_system = !strcmp(role, "system") || !strcmp(role, "developer");

    json_t *content = exo_ju_get(m, "content");
    exo_sbuf text;
    exo_sbuf_init(&text);
    if ((rc = exo_api_content_text(content, where, &text, err))) {
        exo_sbuf_free(&text);
        return rc;
    }
    const char *reasoning = NULL, *name = NULL, *tool_call_id = NULL;
    json_t *calls = NULL;
    if ((rc = exo_ju_str(m, "reasoning_content", &reasoning, false, err)) ||
        (rc = exo_ju_str(m, "name", &name, false, err)) ||
        (rc = exo_ju_str(m, "tool_call_id", &tool_call_id, false, err)) ||
        (rc = exo_ju_array(m, "tool_calls", &calls, false, err))) {
        exo_sbuf_free(&text);
        return exo_err_wrap(err, "%s", where);
    }
    if (!content && !reasoning && !calls) { /* exo drops empty messages */
        exo_sbuf_free(&text);
        return 0;
    }
    json_t *out = json_object();
    json_object_set_new(out, "role", json_string(is_system ? "system" : role));
    json_object_set_new(out, "content", json_stringn(text.data ? text.data : "", text.len));
    if (is_system && text.len) {
        if (instr->len)
            exo_sbuf_putc(instr, '\n');
        exo_sbuf_append(instr, text.data, text.len);
    }
    exo_sbuf_free(&text);
    if (reasoning)
        json_object_set_new(out, "reasoning_content", json_string(reasoning));
    if (name)
        json_object_set_new(out, "name", json_string(name));
    if (tool_call_id)
        json_object_set_new(out, "tool_call_id", json_string(tool_call_id));
    if (calls) {
        json_t *tc = json_array();
        size_t k;
        json_t *c;
        json_array_foreach(calls, k, c) {
            json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
            const char *fname = NULL, *args = NULL, *id = NULL;
            if (!json_is_object(f) || exo_ju_str(f, "name", &fname, true, err) ||
                exo_ju_str(c, "id", &id, false, err)) {
                json_decref(tc);
                json_decref(out);
                return exo_err_set(err, EXO_EINVAL, "%s.tool_calls[%zu] must have function.name",
                                   where, k);
            }
            json_t *a = exo_ju_get(f, "arguments");
            json_t *argv;
            if (json_is_string(a)) {
                args = json_string_value(a);
                argv = exo_api_args_value(args);
            } else if (json_is_object(a)) {
                argv = json_deep_copy(a);
            } else if (!a) {
                argv = json_object();
            } else {
                json_decref(tc);
                json_decref(out);
                return exo_err_set(err, EXO_EINVAL, "%s.tool_calls[%zu].function.arguments must be a string",
                                   where, k);
            }
            json_t *call = json_pack("{s:s, s:{s:s, s:o}}", "type", "function", "function", "name",
                                     fname, "arguments", argv);
            if (id)
                json_object_set_new(call, "id", json_string(id));
            json_array_append_new(tc, call);
        }
        json_object_set_new(out, "tool_calls", tc);
    }
    json_array_append_new(msgs, out);
    return 0;
}

int exo_openai_chat_parse(const json_t *j, bool bench, exo_gen_request *r, exo_err *err)
{
    int rc;
    const char *s = NULL;
    if ((rc = exo_ju_str(j, "model", &s, true, err)))
        return rc;
    r->model = exo_strdup(s);
    json_t *msgs;
    if ((rc = exo_ju_array(j, "messages", &msgs, true, err)))
        return rc;
    if (json_array_size(msgs) == 0)
        return exo_err_set(err, EXO_EINVAL, "'messages' must not be empty");
    if (json_array_size(msgs) > EXO_GEN_MAX_MESSAGES)
        return exo_err_set(err, EXO_ERANGE, "too many messages");
    r->messages = json_array();
    exo_sbuf instr;
    exo_sbuf_init(&instr);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if ((rc = read_message(m, i, r->messages, &instr, err))) {
            exo_sbuf_free(&instr);
            return rc;
        }
    }
    if (instr.len)
        r->instructions = exo_sbuf_take(&instr);
    exo_sbuf_free(&instr);

    int64_t mt = 0;
    bool present = false;
    if ((rc = exo_ju_int(j, "max_completion_tokens", &mt, &present, err)))
        return rc;
    if (!present && (rc = exo_ju_int(j, "max_tokens", &mt, &present, err)))
        return rc;
    if (present) {
        if (mt < 1 || mt > EXO_GEN_MAX_TOKENS)
            return exo_err_set(err, EXO_ERANGE, "'max_tokens' must be between 1 and %d", EXO_GEN_MAX_TOKENS);
        r->max_tokens = (int)mt;
        r->has |= EXO_GEN_HAS_MAX_TOKENS;
    }
    exo_sampler_params *sp = &r->sampling;
    /* OpenAI's ranges: temperature 0..2, top_p 0..1, penalties -2..2 */
    if ((rc = exo_api_read_float_in(j, "temperature", 0, 2, &sp->temperature, EXO_GEN_HAS_TEMPERATURE, r, err)) ||
        (rc = exo_api_read_float_in(j, "top_p", 0, 1, &sp->top_p, EXO_GEN_HAS_TOP_P, r, err)) ||
        (rc = exo_api_read_intf(j, "top_k", &sp->top_k, EXO_GEN_HAS_TOP_K, r, err)) ||
        (rc = exo_api_read_float(j, "min_p", &sp->min_p, EXO_GEN_HAS_MIN_P, r, err)) ||
        (rc = exo_api_read_float(j, "repetition_penalty", &sp->repetition_penalty, EXO_GEN_HAS_REP_PENALTY, r, err)) ||
        (rc = exo_api_read_intf(j, "repetition_context_size", &sp->repetition_context_size, EXO_GEN_HAS_REP_CONTEXT, r, err)) ||
        (rc = exo_api_read_float_in(j, "presence_penalty", -2, 2, &sp->presence_penalty, EXO_GEN_HAS_PRESENCE, r, err)) ||
        (rc = exo_api_read_float_in(j, "frequency_penalty", -2, 2, &sp->frequency_penalty, EXO_GEN_HAS_FREQUENCY, r, err)) ||
        (rc = exo_api_read_seed(j, "seed", r, err)) ||
        (rc = exo_api_read_stop(j, "stop", r, err)) ||
        (rc = exo_ju_bool(j, "stream", &r->stream, NULL, err)) ||
        (rc = exo_ju_bool(j, "logprobs", &r->logprobs, NULL, err)))
        return rc;
    int64_t tl = 0;
    if ((rc = exo_ju_int(j, "top_logprobs", &tl, &present, err)))
        return rc;
    if (present) {
        if (tl < 0 || tl > EXO_MAX_TOP_LOGPROBS)
            return exo_err_set(err, EXO_ERANGE, "'top_logprobs' must be between 0 and %d", EXO_MAX_TOP_LOGPROBS);
        sp->top_logprobs = (int)tl;
        r->has |= EXO_GEN_HAS_TOP_LOGPROBS;
    }
    int64_t n = 1;
    if ((rc = exo_ju_int(j, "n", &n, NULL, err)))
        return rc;
    if (n < 1 || n > 128)
        return exo_err_set(err, EXO_ERANGE, "Invalid 'n': expected a value between 1 and 128, got %lld",
                           (long long)n);
    if (n != 1)
        return exo_err_set(err, EXO_EUNSUPPORTED, "only n=1 is supported");
    if ((rc = exo_api_read_openai_tools(exo_ju_get(j, "tools"), r, err)))
        return rc;
    const char *effort = NULL;
    if ((rc = exo_ju_str(j, "reasoning_effort", &effort, false, err)))
        return rc;
    if (effort && exo_reasoning_effort_parse(effort, &r->reasoning_effort))
        return exo_err_set(err, EXO_EINVAL, "'reasoning_effort' must be none, minimal, low, medium, high or xhigh");
    bool think = false;
    if ((rc = exo_ju_bool(j, "enable_thinking", &think, &present, err)))
        return rc;
    if (present)
        r->enable_thinking = think;
    if (bench) {
        r->bench = true;
        if ((rc = exo_ju_bool(j, "use_prefix_cache", &r->use_prefix_cache, NULL, err)))
            return rc;
    }
    return 0;
}

/* ---- encoder ---------------------------------------------------------------- */

static const char *finish_name(exo_finish_reason r)
{
    switch (r) {
    case EXO_FR_LENGTH: return "length";
    case EXO_FR_TOOL_CALLS: return "tool_calls";
    case EXO_FR_ERROR: return "error";
    default: return "stop";
    }
}

static void chunk_head(exo_api_encoder *e, exo_sbuf *out)
{
    exo_sbuf_puts(out, "data: {\"id\":");
    exo_sbuf_json_str(out, e->id);
    exo_sbuf_printf(out, ",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":",
                    (long long)e->created);
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_puts(out, ",\"choices\":[{\"index\":0,");
}

static void stats_comment(exo_api_encoder *e, exo_sbuf *out)
{
    exo_sbuf_puts(out, ": generation_stats {\"prompt_tps\":");
    exo_sbuf_json_num(out, e->prompt_tps);
    exo_sbuf_puts(out, ",\"generation_tps\":");
    exo_sbuf_json_num(out, e->gen_tps);
    exo_sbuf_printf(out, ",\"prompt_tokens\":%d,\"generation_tokens\":%d,\"peak_memory_usage\":%lld}\n\n",
                    e->usage.prompt_tokens, e->usage.completion_tokens, (long long)e->peak_memory);
}

static void oa_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out)
{
    switch (c->kind) {
    case EXO_CHUNK_TOKEN: {
        bool lp = e->logprobs && c->has_logprob;
        if (!*c->text && !lp)
            return;
        chunk_head(e, out);
        e->said_role = true;
        exo_sbuf_puts(out, c->is_thinking ? "\"delta\":{\"role\":\"assistant\",\"reasoning_content\":"
                                          : "\"delta\":{\"role\":\"assistant\",\"content\":");
        exo_sbuf_json_str(out, c->text);
        exo_sbuf_puts(out, "},\"logprobs\":");
        if (lp) {
            exo_sbuf_puts(out, "{\"content\":[");
            exo_api_write_logprob(out, c);
            exo_sbuf_puts(out, "]}");
        } else {
            exo_sbuf_puts(out, "null");
        }
        exo_sbuf_puts(out, ",\"finish_reason\":null}]}\n\n");
        return;
    }
    case EXO_CHUNK_TOOL_CALLS:
        chunk_head(e, out);
        e->said_role = true;
        exo_sbuf_puts(out, "\"delta\":{\"role\":\"assistant\",\"tool_calls\":[");
        for (int i = 0; i < c->n_tool_calls; i++) {
            const exo_tool_call *t = &c->tool_calls[i];
            exo_sbuf_puts(out, i ? ",{\"id\":" : "{\"id\":");
            exo_sbuf_json_str(out, t->id);
            exo_sbuf_printf(out, ",\"index\":%d,\"type\":\"function\",\"function\":{\"name\":",
                            e->tool_index++);
            exo_sbuf_json_str(out, t->name);
            exo_sbuf_puts(out, ",\"arguments\":");
            exo_sbuf_json_str(out, t->arguments);
            exo_sbuf_puts(out, "}}");
        }
        exo_sbuf_puts(out, "]},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        return;
    case EXO_CHUNK_PREFILL:
        exo_sbuf_puts(out, ": prefill_progress {\"model\":");
        exo_sbuf_json_str(out, e->model);
        exo_sbuf_printf(out, ",\"processed_tokens\":%d,\"total_tokens\":%d}\n\n", c->processed,
                        c->total);
        return;
    case EXO_CHUNK_FINISH:
        chunk_head(e, out);
        /* a stream with nothing visible still says whose message it is (clients
         * that accumulate deltas need the role: openai-node's stream helper) */
        exo_sbuf_printf(out, "\"delta\":%s,\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":",
                        e->said_role ? "{}" : "{\"role\":\"assistant\",\"content\":\"\"}",
                        finish_name(c->reason));
        exo_api_write_usage(out, &c->usage);
        exo_sbuf_puts(out, "}\n\n");
        stats_comment(e, out);
        exo_sbuf_puts(out, "data: [DONE]\n\n");
        return;
    case EXO_CHUNK_ERROR:
    {
        /* exo's own stream error for a server fault; a request the model
         * cannot serve gets the type its non-streaming 4xx body has */
        int status = exo_api_chunk_status(c);
        exo_sbuf_puts(out, "data: {\"error\":{\"message\":");
        exo_sbuf_json_str(out, c->error);
        exo_sbuf_puts(out, ",\"type\":");
        exo_sbuf_json_str(out, status >= 500 ? "InternalServerError"
                                             : exo_api_error_type(e->family, status));
        exo_sbuf_printf(out, ",\"code\":%d}}\n\n", status);
        exo_sbuf_puts(out, "data: [DONE]\n\n");
        return;
    }
    }
}

static void oa_body(exo_api_encoder *e, exo_sbuf *out)
{
    exo_sbuf_puts(out, "{\"id\":");
    exo_sbuf_json_str(out, e->id);
    exo_sbuf_printf(out, ",\"object\":\"chat.completion\",\"created\":%lld,\"model\":",
                    (long long)e->created);
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_puts(out, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    size_t nc = json_array_size(e->calls);
    if (nc && !e->text.len)
        exo_sbuf_puts(out, "null");
    else
        exo_sbuf_json_strn(out, e->text.data ? e->text.data : "", e->text.len);
    if (e->thinking.len) {
        exo_sbuf_puts(out, ",\"reasoning_content\":");
        exo_sbuf_json_strn(out, e->thinking.data, e->thinking.len);
    }
    if (nc) {
        exo_sbuf_puts(out, ",\"tool_calls\":[");
        for (size_t i = 0; i < nc; i++) {
            json_t *c = json_array_get(e->calls, i);
            exo_sbuf_puts(out, i ? ",{\"id\":" : "{\"id\":");
            exo_sbuf_json_str(out, json_string_value(json_object_get(c, "id")));
            exo_sbuf_puts(out, ",\"type\":\"function\",\"function\":{\"name\":");
            exo_sbuf_json_str(out, json_string_value(json_object_get(c, "name")));
            exo_sbuf_puts(out, ",\"arguments\":");
            exo_sbuf_json_str(out, json_string_value(json_object_get(c, "arguments")));
            exo_sbuf_puts(out, "}}");
        }
        exo_sbuf_putc(out, ']');
    }
    exo_sbuf_puts(out, "},\"logprobs\":");
    if (e->logprobs) {
        exo_sbuf_puts(out, "{\"content\":[");
        if (e->lp.len)
            exo_sbuf_append(out, e->lp.data, e->lp.len);
        exo_sbuf_puts(out, "]}");
    } else {
        exo_sbuf_puts(out, "null");
    }
    exo_sbuf_printf(out, ",\"finish_reason\":\"%s\"}],\"usage\":", finish_name(e->reason));
    exo_api_write_usage(out, &e->usage);
    if (e->bench) {
        exo_sbuf_puts(out, ",\"generation_stats\":{\"prompt_tps\":");
        exo_sbuf_json_num(out, e->prompt_tps);
        exo_sbuf_puts(out, ",\"generation_tps\":");
        exo_sbuf_json_num(out, e->gen_tps);
        exo_sbuf_printf(out, ",\"prompt_tokens\":%d,\"generation_tokens\":%d,\"peak_memory_usage\":%lld}",
                        e->usage.prompt_tokens, e->usage.completion_tokens, (long long)e->peak_memory);
    }
    exo_sbuf_putc(out, '}');
}

const exo_api_encoder_vt exo_openai_chat_vt = {
    .ctype_stream = "text/event-stream",
    .ctype_body = "application/json",
    .sse = true,
    .begin = NULL,
    .feed = oa_feed,
    .body = oa_body,
};
