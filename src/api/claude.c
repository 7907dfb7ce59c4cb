/* Anthropic Messages adapter: /v1/messages.
 *
 * Request: content blocks become chat-template messages: text joins into
 * content, thinking into reasoning_content, tool_use into assistant
 * tool_calls (arguments = the input object), and each tool_result into its
 * own {"role":"tool"} message placed before the rest of that user turn.
 * `system` goes to instructions and a leading system message, with Claude
 * Code's `x-anthropic-...` header lines removed (as exo: they change per
 * request and would defeat prefix caching). max_tokens is required.
 * Stream: the full event sequence: message_start, one content block per
 * thinking / text run (content_block_start, *_delta..., content_block_stop),
 * one tool_use block per call (a single input_json_delta with the whole
 * arguments), message_delta (stop_reason, usage), message_stop. An error
 * chunk ends the stream with an `error` event, which the official SDKs raise
 * (exo closes the message silently instead). */
#include "api/encoder_impl.h"
#include "core/json_util.h"
#include "core/alloc.h"

#include <string.h>

/* Drops lines starting with "x-anthropic-". */
static void strip_anthropic_headers(exo_sbuf *s)
{
    exo_sbuf out;
    exo_sbuf_init(&out);
    const char *p = s->data ? s->data : "", *end = p + s->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl + 1 : end;
        if (strncmp(p, "x-anthropic-", 12) != 0)
            exo_sbuf_append(&out, p, (size_t)(le - p));
        p = le;
    }
    exo_sbuf_free(s);
    *s = out;
}

static int read_system(const json_t *sys, exo_gen_request *r, exo_err *err)
{
    /* Anthropic's shape: a string or a list of text blocks */
    if (sys && !json_is_null(sys) && !json_is_string(sys) && !json_is_array(sys))
        return exo_err_set(err, EXO_EINVAL, "system: Input should be a valid string or a list of text blocks");
    size_t i;
    json_t *b;
    json_array_foreach(json_is_array(sys) ? sys : NULL, i, b) {
        const char *type = NULL;
        if (!json_is_object(b) || exo_ju_str(b, "type", &type, true, NULL) || strcmp(type, "text"))
            return exo_err_set(err, EXO_EINVAL, "system[%zu]: only text blocks are allowed", i);
    }
    exo_sbuf text;
    exo_sbuf_init(&text);
    int rc = exo_api_content_text(sys, "system", &text, err);
    if (!rc && text.len) {
        strip_anthropic_headers(&text);
        if (text.len) {
            json_array_append_new(r->messages, json_pack("{s:s, s:s%}", "role", "system", "content",
                                                         text.data, text.len));
            r->instructions = exo_sbuf_take(&text);
        }
    }
    exo_sbuf_free(&text);
    return rc;
}

static int tool_result_text(const json_t *c, const char *where, exo_sbuf *out, exo_err *err)
{
    if (!c || json_is_string(c) || json_is_null(c))
        return exo_api_content_text(c, where, out, err);
    if (!json_is_array(c))
        return exo_err_set(err, EXO_EINVAL, "%s: content must be a string or an array", where);
    return exo_api_content_text(c, where, out, err);
}

static int read_message(const json_t *m, size_t i, exo_gen_request *r, exo_err *err)
{
    char where[48];
    snprintf(where, sizeof where, "messages[%zu]", i);
    if (!json_is_object(m))
        return exo_err_set(err, EXO_EINVAL, "%s must be an object", where);
    const char *role = NULL;
    int rc = exo_ju_str(m, "role", &role, true, err);
    if (rc)
        return exo_err_wrap(err, "%s", where);
    if (strcmp(role, "user") && strcmp(role, "assistant"))
        return exo_err_set(err, EXO_EINVAL, "%s.role must be user or assistant", where);
    json_t *content = exo_ju_get(m, "content");
    if (!content)
        return exo_err_set(err, EXO_EINVAL, "%s.content is required", where);
    exo_sbuf text, thinking;
    exo_sbuf_init(&text);
    exo_sbuf_init(&thinking);
    json_t *calls = json_array();
    if (json_is_string(content)) {
        exo_sbuf_puts(&text, json_string_value(content));
    } else if (json_is_array(content)) {
        size_t k;
        json_t *b;
        json_array_foreach(content, k, b) {
            const char *type = NULL;
            if (!json_is_object(b) || exo_ju_str(b, "type", &type, true, NULL)) {
                rc = exo_err_set(err, EXO_EINVAL, "%s.content[%zu] must be a block with a type", where, k);
                goto out;
            }
            if (!strcmp(type, "text")) {
                const char *t = NULL;
                if ((rc = exo_ju_str(b, "text", &t, true, err)))
                    goto out;
                if (text.len)
                    exo_sbuf_putc(&text, '\n');
                exo_sbuf_puts(&text, t);
            } else if (!strcmp(type, "thinking")) {
                const char *t = NULL;
                if ((rc = exo_ju_str(b, "thinking", &t, true, err)))
                    goto out;
                exo_sbuf_puts(&thinking, t);
            } else if (!strcmp(type, "redacted_thinking")) {
                continue;
            } else if (!strcmp(type, "tool_use")) {
                const char *id = NULL, *name = NULL;
                json_t *input = exo_ju_get(b, "input");
                if ((rc = exo_ju_str(b, "id", &id, true, err)) ||
                    (rc = exo_ju_str(b, "name", &name, true, err)))
                    goto out;
                if (input && !json_is_object(input)) {
                    rc = exo_err_set(err, EXO_EINVAL, "%s.content[%zu].input must be an object", where, k);
                    goto out;
                }
                json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type",
                                                       "function", "function", "name", name,
                                                       "arguments", input ? json_deep_copy(input) : json_object()));
            } else if (!strcmp(type, "tool_result")) {
                const char *id = NULL;
                exo_sbuf res;
                exo_sbuf_init(&res);
                if ((rc = exo_ju_str(b, "tool_use_id", &id, true, err)) ||
                    (rc = tool_result_text(exo_ju_get(b, "content"), where, &res, err))) {
                    exo_sbuf_free(&res);
                    goto out;
                }
                json_array_append_new(r->messages,
                                      json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id", id,
                                                "content", res.data ? res.data : "", res.len));
                exo_sbuf_free(&res);
            } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
                rc = exo_err_set(err, EXO_EUNSUPPORTED, "%s: %s blocks are not supported", where, type);
                goto out;
            } else {
                rc = exo_err_set(err, EXO_EINVAL, "%s: unknown content block type '%.32s'", where, type);
                goto out;
            }
        }
    } else {
        rc = exo_err_set(err, EXO_EINVAL, "%s.content must be a string or an array of blocks", where);
        goto out;
    }
    /* A user turn made only of tool results adds no user message. */
    if (text.len || thinking.len || json_array_size(calls) || json_is_string(content)) {
        json_t *msg = json_pack("{s:s, s:s%}", "role", role, "content", text.data ? text.data : "",
                                text.len);
        if (thinking.len)
            json_object_set_new(msg, "reasoning_content", json_stringn(thinking.data, thinking.len));
        if (json_array_size(calls))
            json_object_set(msg, "tool_calls", calls);
        json_array_append_new(r->messages, msg);
    }
out:
    exo_sbuf_free(&text);
    exo_sbuf_free(&thinking);
    json_decref(calls);
    return rc;
}

static int read_tools(const json_t *tools, exo_gen_request *r, exo_err *err)
{
    if (!tools)
        return 0;
    if (!json_is_array(tools))
        return exo_err_set(err, EXO_EINVAL, "'tools' must be an array");
    if (json_array_size(tools) > EXO_GEN_MAX_TOOLS)
        return exo_err_set(err, EXO_ERANGE, "too many tools");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *name = NULL, *type = NULL, *desc = NULL;
        if (!json_is_object(t) || exo_ju_str(t, "name", &name, true, NULL) ||
            exo_ju_str(t, "type", &type, false, NULL) || exo_ju_str(t, "description", &desc, false, NULL)) {
            json_decref(out);
            return exo_err_set(err, EXO_EINVAL, "tools[%zu] must have a name", i);
        }
        if (type && strcmp(type, "custom"))
            continue; /* Anthropic server tools (web_search_..., bash_...) run on their side */
        json_t *schema = exo_ju_get(t, "input_schema");
        if (schema && !json_is_object(schema)) {
            json_decref(out);
            return exo_err_set(err, EXO_EINVAL, "tools[%zu].input_schema must be an object", i);
        }
        json_t *fn = json_pack("{s:s}", "name", name);
        if (desc)
            json_object_set_new(fn, "description", json_string(desc));
        if (schema)
            json_object_set_new(fn, "parameters", json_deep_copy(schema));
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    if (json_array_size(out)) {
        r->tools = out;
    } else {
        json_decref(out);
    }
    return 0;
}

int exo_claude_parse(const json_t *j, exo_gen_request *r, exo_err *err)
{
    int rc;
    const char *s = NULL;
    if ((rc = exo_ju_str(j, "model", &s, true, err)))
        return rc;
    r->model = exo_strdup(s);
    int64_t mt = 0;
    bool present = false;
    if ((rc = exo_ju_int(j, "max_tokens", &mt, &present, err)))
        return rc;
    if (!present)
        return exo_err_set(err, EXO_EINVAL, "max_tokens: Field required");
    if (mt < 1 || mt > EXO_GEN_MAX_TOKENS)
        return exo_err_set(err, EXO_ERANGE, "max_tokens must be between 1 and %d", EXO_GEN_MAX_TOKENS);
    r->max_tokens = (int)mt;
    r->has |= EXO_GEN_HAS_MAX_TOKENS;
    json_t *msgs;
    if ((rc = exo_ju_array(j, "messages", &msgs, true, err)))
        return rc;
    if (json_array_size(msgs) == 0)
        return exo_err_set(err, EXO_EINVAL, "messages: at least one message is required");
    if (json_array_size(msgs) > EXO_GEN_MAX_MESSAGES)
        return exo_err_set(err, EXO_ERANGE, "too many messages");
    r->messages = json_array();
    if ((rc = read_system(exo_ju_get(j, "system"), r, err)))
        return rc;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if ((rc = read_message(m, i, r, err)))
            return rc;
    }
    exo_sampler_params *sp = &r->sampling;
    /* Anthropic's ranges: temperature and top_p 0..1, top_k >= 0 */
    json_t *stops = exo_ju_get(j, "stop_sequences");
    if (stops && !json_is_array(stops))
        return exo_err_set(err, EXO_EINVAL, "stop_sequences: Input should be a valid list");
    if ((rc = exo_api_read_float_in(j, "temperature", 0, 1, &sp->temperature, EXO_GEN_HAS_TEMPERATURE, r, err)) ||
        (rc = exo_api_read_float_in(j, "top_p", 0, 1, &sp->top_p, EXO_GEN_HAS_TOP_P, r, err)) ||
        (rc = exo_api_read_intf(j, "top_k", &sp->top_k, EXO_GEN_HAS_TOP_K, r, err)) ||
        (rc = exo_api_read_stop(j, "stop_sequences", r, err)) ||
        (rc = exo_ju_bool(j, "stream", &r->stream, NULL, err)) ||
        (rc = read_tools(exo_ju_get(j, "tools"), r, err)))
        return rc;
    json_t *thinking;
    if ((rc = exo_ju_object(j, "thinking", &thinking, false, err)))
        return rc;
    if (thinking) {
        const char *type = NULL;
        if ((rc = exo_ju_str(thinking, "type", &type, true, err)))
            return exo_err_wrap(err, "thinking");
        if (!strcmp(type, "enabled") || !strcmp(type, "adaptive"))
            r->enable_thinking = 1;
        else if (!strcmp(type, "disabled"))
            r->enable_thinking = 0;
        else
            return exo_err_set(err, EXO_EINVAL, "thinking.type must be enabled, disabled or adaptive");
    }
    return 0;
}

/* ---- encoder ------------------------------------------------------------------ */

static const char *stop_reason(exo_finish_reason r, const char *stop_seq)
{
    if (r == EXO_FR_STOP && stop_seq)
        return "stop_sequence";
    switch (r) {
    case EXO_FR_LENGTH: return "max_tokens";
    case EXO_FR_TOOL_CALLS: return "tool_use";
    default: return "end_turn";
    }
}

static void event(exo_sbuf *out, const char *type)
{
    exo_sbuf_printf(out, "event: %s\ndata: {\"type\":\"%s\"", type, type);
}

static void close_block(exo_api_encoder *e, exo_sbuf *out)
{
    if (e->block < 0)
        return;
    event(out, "content_block_stop");
    exo_sbuf_printf(out, ",\"index\":%d}\n\n", e->block);
    e->block = -1;
    e->block_kind = 0;
}

static void open_block(exo_api_encoder *e, exo_sbuf *out, int kind)
{
    close_block(e, out);
    e->block = e->n_blocks++;
    e->block_kind = kind;
    event(out, "content_block_start");
    exo_sbuf_printf(out, ",\"index\":%d,\"content_block\":%s}\n\n", e->block,
                    kind == 1 ? "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"
                              : "{\"type\":\"text\",\"text\":\"\"}");
}

static void cl_begin(exo_api_encoder *e, exo_sbuf *out)
{
    event(out, "message_start");
    exo_sbuf_puts(out, ",\"message\":{\"id\":");
    exo_sbuf_printf(&e->scratch, "msg_%s", e->id);
    exo_sbuf_json_str(out, e->scratch.data);
    exo_sbuf_clear(&e->scratch);
    exo_sbuf_puts(out, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_puts(out, ",\"stop_reason\":null,\"stop_sequence\":null,"
                       "\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n");
}

static void write_tool_id(exo_sbuf *out, const char *id)
{
    /* Anthropic ids look like toolu_...; ours are call_... */
    exo_sbuf tmp;
    exo_sbuf_init(&tmp);
    exo_sbuf_printf(&tmp, "toolu_%s", strncmp(id, "call_", 5) == 0 ? id + 5 : id);
    exo_sbuf_json_str(out, tmp.data);
    exo_sbuf_free(&tmp);
}

static void cl_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out)
{
    switch (c->kind) {
    case EXO_CHUNK_TOKEN: {
        if (!*c->text)
            return;
        int kind = c->is_thinking ? 1 : 2;
        if (e->block_kind != kind)
            open_block(e, out, kind);
        event(out, "content_block_delta");
        exo_sbuf_printf(out, ",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", e->block,
                        kind == 1 ? "thinking_delta" : "text_delta", kind == 1 ? "thinking" : "text");
        exo_sbuf_json_str(out, c->text);
        exo_sbuf_puts(out, "}}\n\n");
        return;
    }
    case EXO_CHUNK_TOOL_CALLS:
        for (int i = 0; i < c->n_tool_calls; i++) {
            const exo_tool_call *t = &c->tool_calls[i];
            close_block(e, out);
            int idx = e->n_blocks++;
            event(out, "content_block_start");
            exo_sbuf_printf(out, ",\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":", idx);
            write_tool_id(out, t->id);
            exo_sbuf_puts(out, ",\"name\":");
            exo_sbuf_json_str(out, t->name);
            exo_sbuf_puts(out, ",\"input\":{}}}\n\n");
            event(out, "content_block_delta");
            exo_sbuf_printf(out, ",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":", idx);
            exo_sbuf_json_str(out, t->arguments);
            exo_sbuf_puts(out, "}}\n\n");
            event(out, "content_block_stop");
            exo_sbuf_printf(out, ",\"index\":%d}\n\n", idx);
        }
        return;
    case EXO_CHUNK_PREFILL:
        return;
    case EXO_CHUNK_FINISH:
        close_block(e, out);
        if (e->n_blocks == 0) { /* an empty text block, as Anthropic sends */
            open_block(e, out, 2);
            close_block(e, out);
        }
        event(out, "message_delta");
        exo_sbuf_printf(out, ",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":",
                        stop_reason(c->reason, c->stop_sequence));
        exo_sbuf_json_str(out, c->reason == EXO_FR_STOP ? c->stop_sequence : NULL);
        exo_sbuf_printf(out, "},\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d}}\n\n",
                        c->usage.prompt_tokens, c->usage.completion_tokens);
        event(out, "message_stop");
        exo_sbuf_puts(out, "}\n\n");
        return;
    case EXO_CHUNK_ERROR:
        close_block(e, out);
        event(out, "error");
        exo_sbuf_puts(out, ",\"error\":{\"type\":");
        exo_sbuf_json_str(out, exo_api_error_type(e->family, exo_api_chunk_status(c)));
        exo_sbuf_puts(out, ",\"message\":");
        exo_sbuf_json_str(out, c->error);
        exo_sbuf_puts(out, "}}\n\n");
        return;
    }
}

static void cl_body(exo_api_encoder *e, exo_sbuf *out)
{
    exo_sbuf_puts(out, "{\"id\":");
    exo_sbuf_printf(&e->scratch, "msg_%s", e->id);
    exo_sbuf_json_str(out, e->scratch.data);
    exo_sbuf_clear(&e->scratch);
    exo_sbuf_puts(out, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
    int n = 0;
    if (e->thinking.len) {
        exo_sbuf_puts(out, "{\"type\":\"thinking\",\"thinking\":");
        exo_sbuf_json_strn(out, e->thinking.data, e->thinking.len);
        exo_sbuf_puts(out, ",\"signature\":\"\"}");
        n++;
    }
    if (e->text.len || (!n && !json_array_size(e->calls))) {
        exo_sbuf_puts(out, n++ ? ",{\"type\":\"text\",\"text\":" : "{\"type\":\"text\",\"text\":");
        exo_sbuf_json_strn(out, e->text.data ? e->text.data : "", e->text.len);
        exo_sbuf_putc(out, '}');
    }
    size_t i;
    json_t *c;
    json_array_foreach(e->calls, i, c) {
        exo_sbuf_puts(out, n++ ? ",{\"type\":\"tool_use\",\"id\":" : "{\"type\":\"tool_use\",\"id\":");
        write_tool_id(out, json_string_value(json_object_get(c, "id")));
        exo_sbuf_puts(out, ",\"name\":");
        exo_sbuf_json_str(out, json_string_value(json_object_get(c, "name")));
        exo_sbuf_puts(out, ",\"input\":");
        json_t *v = exo_api_args_value(json_string_value(json_object_get(c, "arguments")));
        if (!json_is_object(v)) {
            json_decref(v);
            v = json_object();
        }
        exo_api_write_json(out, v);
        json_decref(v);
        exo_sbuf_putc(out, '}');
    }
    exo_sbuf_puts(out, "],\"model\":");
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_printf(out, ",\"stop_reason\":\"%s\",\"stop_sequence\":", stop_reason(e->reason, e->stop_seq));
    exo_sbuf_json_str(out, e->reason == EXO_FR_STOP ? e->stop_seq : NULL);
    exo_sbuf_printf(out, ",\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d}}",
                    e->usage.prompt_tokens, e->usage.completion_tokens);
}

const exo_api_encoder_vt exo_claude_vt = {
    .ctype_stream = "text/event-stream",
    .ctype_body = "application/json",
    .sse = true,
    .begin = cl_begin,
    .feed = cl_feed,
    .body = cl_body,
};
