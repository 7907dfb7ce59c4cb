/* OpenAI Responses adapter: /v1/responses.
 *
 * Request: `input` (a string or a list of items) becomes chat-template
 * messages: message items by role; function_call and other *_call items
 * become assistant tool_calls (consecutive calls merge into one assistant
 * message, as exo); *_call_output items become tool messages; reasoning
 * items attach reasoning_content to the next assistant message; compaction
 * summaries become system messages; item_reference and unknown items are
 * skipped. Flat tools ({type:"function", name, parameters}) are normalised
 * to the chat-completions shape.
 * Stream: `event: <type>` + `data:` with an increasing sequence_number:
 * response.created, response.in_progress, a reasoning item (summary part +
 * summary_text deltas), a message item (content part + output_text deltas,
 * always emitted, empty if no text), one function_call item per tool call,
 * then response.completed (response.incomplete for max_output_tokens,
 * response.failed on error, as the official clients expect). A message cut
 * short (max_output_tokens, or an error while it is open) is done with
 * status "incomplete"; on error the open items are closed before
 * response.failed, whose output then lists whole items only. */
#include "api/encoder_impl.h"
#include "core/json_util.h"
#include "core/alloc.h"

#include <string.h>

/* ---- request ------------------------------------------------------------------ */

typedef struct rs_ctx {
    json_t  *msgs;
    char    *pending_reasoning;
    exo_err *err;
} rs_ctx;

static json_t *last_assistant_with_calls(rs_ctx *c)
{
    size_t n = json_array_size(c->msgs);
    json_t *m = n ? json_array_get(c->msgs, n - 1) : NULL;
    if (m && !strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
        return m;
    return NULL;
}

static void add_call(rs_ctx *c, const char *id, const char *name, json_t *args /* stolen */)
{
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", args);
    json_t *m = last_assistant_with_calls(c);
    if (!m) {
        m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        if (c->pending_reasoning) {
            json_object_set_new(m, "reasoning_content", json_string(c->pending_reasoning));
            exo_free(c->pending_reasoning);
            c->pending_reasoning = NULL;
        }
        json_array_append_new(c->msgs, m);
    }
    json_t *tc = json_object_get(m, "tool_calls");
    if (!tc) {
        tc = json_array();
        json_object_set_new(m, "tool_calls", tc);
    }
    json_array_append_new(tc, call);
}

static int read_item(rs_ctx *c, const json_t *it, size_t i)
{
    exo_err *err = c->err;
    char where[40];
    snprintf(where, sizeof where, "input[%zu]", i);
    if (!json_is_object(it))
        return exo_err_set(err, EXO_EINVAL, "%s must be an object", where);
    const char *type = NULL, *role = NULL;
    int rc;
    if ((rc = exo_ju_str(it, "type", &type, false, err)) || (rc = exo_ju_str(it, "role", &role, false, err)))
        return exo_err_wrap(err, "%s", where);
    if (!type)
        type = role ? "message" : "";
    size_t tl = strlen(type);
    if (!strcmp(type, "message")) {
        if (!role)
            return exo_err_set(err, EXO_EINVAL, "%s.role is required", where);
        static const char *const roles[] = {"user", "assistant", "system", "developer", NULL};
        bool ok = false;
        for (const char *const *r = roles; *r && !ok; r++)
            ok = !strcmp(*r, role);
        if (!ok)
            return exo_err_set(err, EXO_EINVAL, "%s.role '%.32s' is not supported", where, role);
        exo_sbuf text;
        exo_sbuf_init(&text);
        if ((rc = exo_api_content_text(exo_ju_get(it, "content"), where, &text, err))) {
            exo_sbuf_free(&text);
            return rc;
        }
        bool sys = !strcmp(role, "system") || !strcmp(role, "developer");
        json_t *m = json_pack("{s:s, s:s%}", "role", sys ? "system" : role, "content",
                              text.data ? text.data : "", text.len);
        exo_sbuf_free(&text);
        if (!strcmp(role, "assistant") && c->pending_reasoning) {
            json_object_set_new(m, "reasoning_content", json_string(c->pending_reasoning));
            exo_free(c->pending_reasoning);
            c->pending_reasoning = NULL;
        }
        json_array_append_new(c->msgs, m);
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const char *id = NULL, *name = NULL, *args = NULL;
        if ((rc = exo_ju_str(it, "call_id", &id, true, err)) ||
            (rc = exo_ju_str(it, "name", &name, true, err)) ||
            (rc = exo_ju_str(it, "arguments", &args, false, err)))
            return exo_err_wrap(err, "%s", where);
        add_call(c, id, name, exo_api_args_value(args ? args : "{}"));
        return 0;
    }
    if (!strcmp(type, "reasoning")) {
        exo_sbuf t;
        exo_sbuf_init(&t);
        json_t *summary = exo_ju_get(it, "summary");
        json_t *content = exo_ju_get(it, "content");
        size_t k;
        json_t *p;
        json_array_foreach(json_is_array(content) ? content : summary, k, p) {
            json_t *tx = json_object_get(p, "text");
            if (json_is_string(tx))
                exo_sbuf_puts(&t, json_string_value(tx));
        }
        exo_free(c->pending_reasoning);
        c->pending_reasoning = t.len ? exo_sbuf_take(&t) : NULL;
        exo_sbuf_free(&t);
        return 0;
    }
    if (!strcmp(type, "compaction")) {
        const char *summary = NULL;
        if (!exo_ju_str(it, "summary", &summary, false, NULL) && summary)
            json_array_append_new(c->msgs, json_pack("{s:s, s:s}", "role", "system", "content", summary));
        return 0;
    }
    if (tl > 12 && !strcmp(type + tl - 12, "_call_output")) {
        const char *id = NULL;
        json_t *out = exo_ju_get(it, "output");
        if (exo_ju_str(it, "call_id", &id, false, NULL) || !id)
            if (exo_ju_str(it, "id", &id, false, NULL) || !id)
                return exo_err_set(err, EXO_EINVAL, "%s.call_id is required", where);
        exo_sbuf text;
        exo_sbuf_init(&text);
        if (json_is_string(out) || json_is_array(out)) {
            if ((rc = exo_api_content_text(out, where, &text, NULL))) {
                exo_sbuf_clear(&text);
                exo_api_write_json(&text, out);
            }
        } else if (out) {
            exo_api_write_json(&text, out);
        }
        json_array_append_new(c->msgs, json_pack("{s:s, s:s, s:s%}", "role", "tool", "tool_call_id",
                                                 id, "content", text.data ? text.data : "", text.len));
        exo_sbuf_free(&text);
        return 0;
    }
    if (tl > 5 && !strcmp(type + tl - 5, "_call")) {
        const char *id = NULL, *name = NULL;
        if (exo_ju_str(it, "call_id", &id, false, NULL) || !id)
            if (exo_ju_str(it, "id", &id, false, NULL) || !id)
                id = "call";
        if (exo_ju_str(it, "name", &name, false, NULL) || !name)
            name = type;
        json_t *args = exo_ju_get(it, "arguments");
        json_t *v;
        if (json_is_string(args))
            v = exo_api_args_value(json_string_value(args));
        else {
            v = json_deep_copy(it);
            json_object_del(v, "type");
            json_object_del(v, "id");
            json_object_del(v, "call_id");
            json_object_del(v, "status");
        }
        add_call(c, id, name, v);
        return 0;
    }
    /* item_reference, mcp_list_tools, mcp_approval_*: nothing for the template;
     * any other type is not an input item (the API answers 400 too) */
    if (!strcmp(type, "item_reference") || !strncmp(type, "mcp_", 4))
        return 0;
    return exo_err_set(err, EXO_EINVAL, "%s.type: invalid value '%.32s'", where, type);
}

static int read_tools(const json_t *tools, exo_gen_request *r, exo_err *err)
{
    if (!tools)
        return 0;
    if (!json_is_array(tools))
        return exo_err_set(err, EXO_EINVAL, "'tools' must be an array");
    json_t *norm = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = NULL;
        if (!json_is_object(t) || exo_ju_str(t, "type", &type, false, NULL)) {
            json_decref(norm);
            return exo_err_set(err, EXO_EINVAL, "tools[%zu] must be an object", i);
        }
        if (type && strcmp(type, "function"))
            continue; /* hosted tools (web_search, file_search, ...) are not ours */
        if (json_is_object(json_object_get(t, "function"))) {
            json_array_append(norm, t);
            continue;
        }
        json_t *fn = json_deep_copy(t);
        json_object_del(fn, "type");
        json_object_del(fn, "strict");
        json_array_append_new(norm, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    int rc = json_array_size(norm) ? exo_api_read_openai_tools(norm, r, err) : 0;
    json_decref(norm);
    return rc;
}

int exo_responses_parse(const json_t *j, exo_gen_request *r, exo_err *err)
{
    int rc;
    const char *s = NULL;
    if ((rc = exo_ju_str(j, "model", &s, true, err)))
        return rc;
    r->model = exo_strdup(s);
    r->messages = json_array();
    const char *instr = NULL;
    if ((rc = exo_ju_str(j, "instructions", &instr, false, err)))
        return rc;
    if (instr) {
        r->instructions = exo_strdup(instr);
        json_array_append_new(r->messages, json_pack("{s:s, s:s}", "role", "system", "content", instr));
    }
    json_t *input = exo_ju_get(j, "input");
    if (!input)
        return exo_err_set(err, EXO_EINVAL, "'input' is required");
    if (json_is_string(input)) {
        json_array_append_new(r->messages, json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (json_is_array(input)) {
        if (json_array_size(input) == 0)
            return exo_err_set(err, EXO_EINVAL, "'input' must not be empty");
        if (json_array_size(input) > EXO_GEN_MAX_MESSAGES)
            return exo_err_set(err, EXO_ERANGE, "too many input items");
        rs_ctx c = {.msgs = r->messages, .err = err};
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) {
            if ((rc = read_item(&c, it, i))) {
                exo_free(c.pending_reasoning);
                return rc;
            }
        }
        exo_free(c.pending_reasoning);
    } else {
        return exo_err_set(err, EXO_EINVAL, "'input' must be a string or an array of items");
    }
    int64_t mt = 0;
    bool present = false;
    if ((rc = exo_ju_int(j, "max_output_tokens", &mt, &present, err)))
        return rc;
    if (present) {
        if (mt < 1 || mt > EXO_GEN_MAX_TOKENS)
            return exo_err_set(err, EXO_ERANGE, "'max_output_tokens' must be between 1 and %d", EXO_GEN_MAX_TOKENS);
        r->max_tokens = (int)mt;
        r->has |= EXO_GEN_HAS_MAX_TOKENS;
    }
    exo_sampler_params *sp = &r->sampling;
    if ((rc = exo_api_read_float_in(j, "temperature", 0, 2, &sp->temperature, EXO_GEN_HAS_TEMPERATURE, r, err)) ||
        (rc = exo_api_read_float_in(j, "top_p", 0, 1, &sp->top_p, EXO_GEN_HAS_TOP_P, r, err)) ||
        (rc = exo_api_read_intf(j, "top_k", &sp->top_k, EXO_GEN_HAS_TOP_K, r, err)) ||
        (rc = exo_api_read_seed(j, "seed", r, err)) ||
        (rc = exo_api_read_stop(j, "stop", r, err)) ||
        (rc = exo_ju_bool(j, "stream", &r->stream, NULL, err)) ||
        (rc = read_tools(exo_ju_get(j, "tools"), r, err)))
        return rc;
    json_t *reasoning;
    if ((rc = exo_ju_object(j, "reasoning", &reasoning, false, err)))
        return rc;
    const char *effort = NULL;
    if (reasoning && (rc = exo_ju_str(reasoning, "effort", &effort, false, err)))
        return exo_err_wrap(err, "reasoning");
    if (effort && exo_reasoning_effort_parse(effort, &r->reasoning_effort))
        return exo_err_set(err, EXO_EINVAL, "reasoning.effort must be none, minimal, low, medium, high or xhigh");
    bool think = false;
    if ((rc = exo_ju_bool(j, "enable_thinking", &think, &present, err)))
        return rc;
    if (present)
        r->enable_thinking = think;
    return 0;
}

/* ---- encoder ------------------------------------------------------------------- */

static void ev(exo_api_encoder *e, exo_sbuf *out, const char *type)
{
    exo_sbuf_printf(out, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d", type, type, e->seq++);
}

static void item_id(exo_api_encoder *e, exo_sbuf *out, const char *prefix)
{
    exo_sbuf_clear(&e->scratch);
    exo_sbuf_printf(&e->scratch, "%s_%s", prefix, e->id);
    exo_sbuf_json_str(out, e->scratch.data);
}

static json_t *reasoning_item(exo_api_encoder *e)
{
    char *id = NULL;
    if (asprintf(&id, "rs_%s", e->id) < 0)
        abort();
    json_t *it = json_pack("{s:s, s:s, s:[{s:s, s:s%}]}", "type", "reasoning", "id", id, "summary",
                           "type", "summary_text", "text", e->thinking.data ? e->thinking.data : "",
                           e->thinking.len);
    free(id);
    return it;
}

static json_t *message_item(exo_api_encoder *e, const char *status)
{
    char *id = NULL;
    if (asprintf(&id, "msg_%s", e->id) < 0)
        abort();
    json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[]}]}", "type", "message", "id", id,
                           "status", status, "role", "assistant", "content", "type", "output_text",
                           "text", e->text.data ? e->text.data : "", e->text.len, "annotations");
    free(id);
    return it;
}

static json_t *call_item(const exo_tool_call *t, const char *status)
{
    char *id = NULL;
    if (asprintf(&id, "fc_%s", strncmp(t->id, "call_", 5) == 0 ? t->id + 5 : t->id) < 0)
        abort();
    json_t *it = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id,
                           "call_id", t->id, "name", t->name, "arguments", t->arguments, "status", status);
    free(id);
    return it;
}

static void set_output(exo_api_encoder *e, int index, json_t *item /* stolen */)
{
    while ((int)json_array_size(e->outputs) <= index)
        json_array_append_new(e->outputs, json_null());
    json_array_set_new(e->outputs, (size_t)index, item);
}

/* failed: the error chunk that ended the response, or NULL */
static void write_response(exo_api_encoder *e, exo_sbuf *out, const char *status,
                           const exo_chunk *failed)
{
    const char *error = failed ? (failed->error ? failed->error : "error") : NULL;
    exo_sbuf_puts(out, "{\"id\":");
    item_id(e, out, "resp");
    exo_sbuf_printf(out, ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"model\":",
                    (long long)e->created, status);
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_puts(out, ",\"output\":");
    bool final = strcmp(status, "in_progress") != 0;
    if (final)
        exo_api_write_json(out, e->outputs);
    else
        exo_sbuf_puts(out, "[]");
    exo_sbuf_puts(out, ",\"output_text\":");
    exo_sbuf_json_strn(out, final && e->text.data ? e->text.data : "", final ? e->text.len : 0);
    exo_sbuf_puts(out, ",\"parallel_tool_calls\":true,\"tool_choice\":\"auto\",\"tools\":[]");
    if (!strcmp(status, "incomplete"))
        exo_sbuf_puts(out, ",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}");
    else
        exo_sbuf_puts(out, ",\"incomplete_details\":null");
    exo_sbuf_puts(out, ",\"error\":");
    if (error) {
        /* the Responses API's codes: a prompt the model cannot take is
         * "invalid_prompt", anything else "server_error" */
        exo_sbuf_puts(out, exo_api_chunk_status(failed) < 500 ? "{\"code\":\"invalid_prompt\",\"message\":"
                                                             : "{\"code\":\"server_error\",\"message\":");
        exo_sbuf_json_str(out, error);
        exo_sbuf_putc(out, '}');
    } else {
        exo_sbuf_puts(out, "null");
    }
    if (final && !error) {
        const exo_usage *u = &e->usage;
        exo_sbuf_printf(out,
                        ",\"usage\":{\"input_tokens\":%d,\"input_tokens_details\":{\"cached_tokens\":%d},"
                        "\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":%d},"
                        "\"total_tokens\":%d}",
                        u->prompt_tokens, u->cached_tokens, u->completion_tokens, u->reasoning_tokens,
                        u->prompt_tokens + u->completion_tokens);
    }
    exo_sbuf_putc(out, '}');
}

static void rs_begin(exo_api_encoder *e, exo_sbuf *out)
{
    ev(e, out, "response.created");
    exo_sbuf_puts(out, ",\"response\":");
    write_response(e, out, "in_progress", NULL);
    exo_sbuf_puts(out, "}\n\n");
    ev(e, out, "response.in_progress");
    exo_sbuf_puts(out, ",\"response\":");
    write_response(e, out, "in_progress", NULL);
    exo_sbuf_puts(out, "}\n\n");
}

static void close_reasoning(exo_api_encoder *e, exo_sbuf *out)
{
    if (e->rs_index < 0 || e->rs_closed)
        return;
    e->rs_closed = true;
    const char *t = e->thinking.data ? e->thinking.data : "";
    ev(e, out, "response.reasoning_summary_text.done");
    exo_sbuf_puts(out, ",\"item_id\":");
    item_id(e, out, "rs");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"summary_index\":0,\"text\":", e->rs_index);
    exo_sbuf_json_strn(out, t, e->thinking.len);
    exo_sbuf_puts(out, "}\n\n");
    ev(e, out, "response.reasoning_summary_part.done");
    exo_sbuf_puts(out, ",\"item_id\":");
    item_id(e, out, "rs");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":",
                    e->rs_index);
    exo_sbuf_json_strn(out, t, e->thinking.len);
    exo_sbuf_puts(out, "}}\n\n");
    json_t *item = reasoning_item(e);
    ev(e, out, "response.output_item.done");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":", e->rs_index);
    exo_api_write_json(out, item);
    exo_sbuf_puts(out, "}\n\n");
    set_output(e, e->rs_index, item);
}

static void open_message(exo_api_encoder *e, exo_sbuf *out)
{
    if (e->msg_index >= 0)
        return;
    e->msg_index = e->out_index++;
    set_output(e, e->msg_index, json_null());
    ev(e, out, "response.output_item.added");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":{\"type\":\"message\",\"id\":", e->msg_index);
    item_id(e, out, "msg");
    exo_sbuf_puts(out, ",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n");
    ev(e, out, "response.content_part.added");
    exo_sbuf_puts(out, ",\"item_id\":");
    item_id(e, out, "msg");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"content_index\":0,"
                         "\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
                    e->msg_index);
}

/* status: "completed", or "incomplete" when the response stopped early
 * (max_output_tokens, or an error while the message was open) */
static void close_message(exo_api_encoder *e, exo_sbuf *out, const char *status)
{
    const char *t = e->text.data ? e->text.data : "";
    ev(e, out, "response.output_text.done");
    exo_sbuf_puts(out, ",\"item_id\":");
    item_id(e, out, "msg");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"content_index\":0,\"text\":", e->msg_index);
    exo_sbuf_json_strn(out, t, e->text.len);
    exo_sbuf_puts(out, ",\"logprobs\":[]}\n\n");
    ev(e, out, "response.content_part.done");
    exo_sbuf_puts(out, ",\"item_id\":");
    item_id(e, out, "msg");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":",
                    e->msg_index);
    exo_sbuf_json_strn(out, t, e->text.len);
    exo_sbuf_puts(out, ",\"annotations\":[]}}\n\n");
    json_t *item = message_item(e, status);
    ev(e, out, "response.output_item.done");
    exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":", e->msg_index);
    exo_api_write_json(out, item);
    exo_sbuf_puts(out, "}\n\n");
    set_output(e, e->msg_index, item);
}

static void rs_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out)
{
    switch (c->kind) {
    case EXO_CHUNK_TOKEN:
        if (!*c->text)
            return;
        if (c->is_thinking) {
            if (e->rs_closed)
                return; /* reasoning after the answer began: kept in the aggregate only */
            if (e->rs_index < 0) {
                e->rs_index = e->out_index++;
                set_output(e, e->rs_index, json_null());
                ev(e, out, "response.output_item.added");
                exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":{\"type\":\"reasoning\",\"id\":", e->rs_index);
                item_id(e, out, "rs");
                exo_sbuf_puts(out, ",\"summary\":[]}}\n\n");
                ev(e, out, "response.reasoning_summary_part.added");
                exo_sbuf_puts(out, ",\"item_id\":");
                item_id(e, out, "rs");
                exo_sbuf_printf(out, ",\"output_index\":%d,\"summary_index\":0,"
                                     "\"part\":{\"type\":\"summary_text\",\"text\":\"\"}}\n\n", e->rs_index);
            }
            ev(e, out, "response.reasoning_summary_text.delta");
            exo_sbuf_puts(out, ",\"item_id\":");
            item_id(e, out, "rs");
            exo_sbuf_printf(out, ",\"output_index\":%d,\"summary_index\":0,\"delta\":", e->rs_index);
            exo_sbuf_json_str(out, c->text);
            exo_sbuf_puts(out, "}\n\n");
            return;
        }
        close_reasoning(e, out);
        open_message(e, out);
        ev(e, out, "response.output_text.delta");
        exo_sbuf_puts(out, ",\"item_id\":");
        item_id(e, out, "msg");
        exo_sbuf_printf(out, ",\"output_index\":%d,\"content_index\":0,\"delta\":", e->msg_index);
        exo_sbuf_json_str(out, c->text);
        exo_sbuf_puts(out, ",\"logprobs\":[]}\n\n");
        return;
    case EXO_CHUNK_TOOL_CALLS:
        close_reasoning(e, out);
        for (int i = 0; i < c->n_tool_calls; i++) {
            const exo_tool_call *t = &c->tool_calls[i];
            int idx = e->out_index++;
            json_t *item = call_item(t, "in_progress");
            json_object_set_new(item, "arguments", json_string(""));
            ev(e, out, "response.output_item.added");
            exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":", idx);
            exo_api_write_json(out, item);
            exo_sbuf_puts(out, "}\n\n");
            json_t *fid = json_object_get(item, "id");
            ev(e, out, "response.function_call_arguments.delta");
            exo_sbuf_puts(out, ",\"item_id\":");
            exo_sbuf_json_str(out, json_string_value(fid));
            exo_sbuf_printf(out, ",\"output_index\":%d,\"delta\":", idx);
            exo_sbuf_json_str(out, t->arguments);
            exo_sbuf_puts(out, "}\n\n");
            ev(e, out, "response.function_call_arguments.done");
            exo_sbuf_puts(out, ",\"item_id\":");
            exo_sbuf_json_str(out, json_string_value(fid));
            exo_sbuf_printf(out, ",\"output_index\":%d,\"name\":", idx);
            exo_sbuf_json_str(out, t->name);
            exo_sbuf_puts(out, ",\"arguments\":");
            exo_sbuf_json_str(out, t->arguments);
            exo_sbuf_puts(out, "}\n\n");
            json_decref(item);
            item = call_item(t, "completed");
            ev(e, out, "response.output_item.done");
            exo_sbuf_printf(out, ",\"output_index\":%d,\"item\":", idx);
            exo_api_write_json(out, item);
            exo_sbuf_puts(out, "}\n\n");
            set_output(e, idx, item);
        }
        return;
    case EXO_CHUNK_PREFILL:
        return;
    case EXO_CHUNK_FINISH: {
        bool incomplete = c->reason == EXO_FR_LENGTH;
        close_reasoning(e, out);
        open_message(e, out);
        close_message(e, out, incomplete ? "incomplete" : "completed");
        ev(e, out, incomplete ? "response.incomplete" : "response.completed");
        exo_sbuf_puts(out, ",\"response\":");
        write_response(e, out, incomplete ? "incomplete" : "completed", NULL);
        exo_sbuf_puts(out, "}\n\n");
        return;
    }
    case EXO_CHUNK_ERROR:
        /* items still open are closed as incomplete first, so the failed
         * response's output holds only whole items (never a null the
         * clients' accumulators would trip over) */
        close_reasoning(e, out);
        if (e->msg_index >= 0)
            close_message(e, out, "incomplete");
        ev(e, out, "response.failed");
        exo_sbuf_puts(out, ",\"response\":");
        write_response(e, out, "failed", c);
        exo_sbuf_puts(out, "}\n\n");
        return;
    }
}

static void rs_body(exo_api_encoder *e, exo_sbuf *out)
{
    json_array_clear(e->outputs);
    if (e->thinking.len)
        json_array_append_new(e->outputs, reasoning_item(e));
    json_array_append_new(e->outputs, message_item(e, e->reason == EXO_FR_LENGTH ? "incomplete" : "completed"));
    size_t i;
    json_t *c;
    json_array_foreach(e->calls, i, c) {
        exo_tool_call t = {(char *)json_string_value(json_object_get(c, "id")),
                           (char *)json_string_value(json_object_get(c, "name")),
                           (char *)json_string_value(json_object_get(c, "arguments"))};
        json_array_append_new(e->outputs, call_item(&t, "completed"));
    }
    write_response(e, out, e->reason == EXO_FR_LENGTH ? "incomplete" : "completed", NULL);
}

const exo_api_encoder_vt exo_responses_vt = {
    .ctype_stream = "text/event-stream",
    .ctype_body = "application/json",
    .sse = true,
    .begin = rs_begin,
    .feed = rs_feed,
    .body = rs_body,
};
