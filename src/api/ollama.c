/* Ollama adapter: /ollama/api/chat (+ exo's /ollama/api/api/chat and
 * /ollama/api/v1/chat aliases), /ollama/api/generate, and formatters for the
 * node-state endpoints (tags, ps, show, version).
 *
 * Requests stream by default (Ollama's rule). Sampling comes from `options`
 * (num_predict, temperature, top_p, top_k, min_p, stop, seed, repeat_penalty,
 * repeat_last_n, presence_penalty, frequency_penalty); `think` is a bool or
 * an effort name. Streams are NDJSON lines: one per token (message.content
 * or message.thinking; `response` / `thinking` for generate), one carrying
 * message.tool_calls per call, and a final done:true line with done_reason
 * and the eval counts and durations Ollama clients show. Errors mid-stream
 * are an {"error": "..."} line, which the official clients raise. */
#include "api/encoder_impl.h"
#include "core/json_util.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

static int read_options(const json_t *j, exo_gen_request *r, exo_err *err)
{
    json_t *o;
    int rc = exo_ju_object(j, "options", &o, false, err);
    if (rc || !o)
        return rc;
    exo_sampler_params *sp = &r->sampling;
    int64_t np = 0;
    bool present = false;
    if ((rc = exo_ju_int(o, "num_predict", &np, &present, err)))
        return rc;
    if (present && np > 0) { /* -1 / -2 mean unlimited / fill context in Ollama */
        if (np > EXO_GEN_MAX_TOKENS)
            return exo_err_set(err, EXO_ERANGE, "num_predict is too large");
        r->max_tokens = (int)np;
        r->has |= EXO_GEN_HAS_MAX_TOKENS;
    }
    if ((rc = exo_api_read_float(o, "temperature", &sp->temperature, EXO_GEN_HAS_TEMPERATURE, r, err)) ||
        (rc = exo_api_read_float(o, "top_p", &sp->top_p, EXO_GEN_HAS_TOP_P, r, err)) ||
        (rc = exo_api_read_intf(o, "top_k", &sp->top_k, EXO_GEN_HAS_TOP_K, r, err)) ||
        (rc = exo_api_read_float(o, "min_p", &sp->min_p, EXO_GEN_HAS_MIN_P, r, err)) ||
        (rc = exo_api_read_float(o, "repeat_penalty", &sp->repetition_penalty, EXO_GEN_HAS_REP_PENALTY, r, err)) ||
        (rc = exo_api_read_intf(o, "repeat_last_n", &sp->repetition_context_size, EXO_GEN_HAS_REP_CONTEXT, r, err)) ||
        (rc = exo_api_read_float(o, "presence_penalty", &sp->presence_penalty, EXO_GEN_HAS_PRESENCE, r, err)) ||
        (rc = exo_api_read_float(o, "frequency_penalty", &sp->frequency_penalty, EXO_GEN_HAS_FREQUENCY, r, err)) ||
        (rc = exo_api_read_seed(o, "seed", r, err)) || (rc = exo_api_read_stop(o, "stop", r, err)))
        return exo_err_wrap(err, "options");
    return 0;
}

static int read_common(const json_t *j, exo_gen_request *r, exo_err *err)
{
    const char *s = NULL;
    int rc = exo_ju_str(j, "model", &s, true, err);
    if (rc)
        return rc;
    r->model = exo_strdup(s);
    r->stream = true;
    if ((rc = exo_ju_bool(j, "stream", &r->stream, NULL, err)) || (rc = read_options(j, r, err)))
        return rc;
    json_t *think = exo_ju_get(j, "think");
    if (json_is_boolean(think))
        r->enable_thinking = json_is_true(think);
    else if (json_is_string(think)) {
        if (exo_reasoning_effort_parse(json_string_value(think), &r->reasoning_effort))
            return exo_err_set(err, EXO_EINVAL, "think must be a boolean or low, medium, high");
    } else if (think)
        return exo_err_set(err, EXO_EINVAL, "think must be a boolean or a string");
    json_t *images = exo_ju_get(j, "images");
    if (json_array_size(images))
        return exo_err_set(err, EXO_EUNSUPPORTED, "image inputs are not supported");
    return 0;
}

int exo_ollama_chat_parse(const json_t *j, exo_gen_request *r, exo_err *err)
{
    int rc = read_common(j, r, err);
    if (rc)
        return rc;
    json_t *msgs;
    if ((rc = exo_ju_array(j, "messages", &msgs, false, err)))
        return rc;
    if (json_array_size(msgs) > EXO_GEN_MAX_MESSAGES)
        return exo_err_set(err, EXO_ERANGE, "too many messages");
    r->messages = json_array();
    exo_sbuf instr;
    exo_sbuf_init(&instr);
    size_t i, n_tool = 0;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = NULL, *content = NULL, *thinking = NULL, *tool_name = NULL, *name = NULL;
        json_t *calls = NULL;
        if (!json_is_object(m) || (rc = exo_ju_str(m, "role", &role, true, err)) ||
            (rc = exo_ju_str(m, "content", &content, false, err)) ||
            (rc = exo_ju_str(m, "thinking", &thinking, false, err)) ||
            (rc = exo_ju_str(m, "tool_name", &tool_name, false, err)) ||
            (rc = exo_ju_str(m, "name", &name, false, err)) ||
            (rc = exo_ju_array(m, "tool_calls", &calls, false, err))) {
            exo_sbuf_free(&instr);
            return rc ? exo_err_wrap(err, "messages[%zu]", i)
                      : exo_err_set(err, EXO_EINVAL, "messages[%zu] must be an object", i);
        }
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool")) {
            exo_sbuf_free(&instr);
            return exo_err_set(err, EXO_EINVAL, "messages[%zu].role '%.32s' is not supported", i, role);
        }
        if (json_array_size(exo_ju_get(m, "images"))) {
            exo_sbuf_free(&instr);
            return exo_err_set(err, EXO_EUNSUPPORTED, "image inputs are not supported");
        }
        json_t *out = json_pack("{s:s, s:s}", "role", role, "content", content ? content : "");
        if (!strcmp(role, "system") && content) {
            if (instr.len)
                exo_sbuf_putc(&instr, '\n');
            exo_sbuf_puts(&instr, content);
        }
        if (thinking)
            json_object_set_new(out, "reasoning_content", json_string(thinking));
        if (!strcmp(role, "tool")) {
            char id[32];
            snprintf(id, sizeof id, "tool_%zu", n_tool++);
            json_object_set_new(out, "tool_call_id", json_string(tool_name ? tool_name : name ? name : id));
            if (tool_name || name)
                json_object_set_new(out, "name", json_string(tool_name ? tool_name : name));
        }
        if (calls) {
            json_t *tc = json_array();
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
                const char *fname = NULL, *cid = NULL;
                if (!json_is_object(f) || exo_ju_str(f, "name", &fname, true, NULL) ||
                    exo_ju_str(c, "id", &cid, false, NULL)) {
                    json_decref(tc);
                    json_decref(out);
                    exo_sbuf_free(&instr);
                    return exo_err_set(err, EXO_EINVAL, "messages[%zu].tool_calls[%zu] needs function.name", i, k);
                }
                json_t *a = exo_ju_get(f, "arguments");
                json_t *args = json_is_string(a) ? exo_api_args_value(json_string_value(a))
                             : json_is_object(a) ? json_deep_copy(a) : json_object();
                char idbuf[64];
                snprintf(idbuf, sizeof idbuf, "call_%zu_%zu", i, k);
                json_array_append_new(tc, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", cid ? cid : idbuf,
                                                    "type", "function", "function", "name", fname,
                                                    "arguments", args));
            }
            json_object_set_new(out, "tool_calls", tc);
        }
        json_array_append_new(r->messages, out);
    }
    if (instr.len)
        r->instructions = exo_sbuf_take(&instr);
    exo_sbuf_free(&instr);
    return exo_api_read_openai_tools(exo_ju_get(j, "tools"), r, err);
}

int exo_ollama_generate_parse(const json_t *j, exo_gen_request *r, exo_err *err)
{
    int rc = read_common(j, r, err);
    if (rc)
        return rc;
    const char *prompt = NULL, *system = NULL;
    if ((rc = exo_ju_str(j, "prompt", &prompt, false, err)) ||
        (rc = exo_ju_str(j, "system", &system, false, err)))
        return rc;
    r->messages = json_array();
    if (system) {
        r->instructions = exo_strdup(system);
        json_array_append_new(r->messages, json_pack("{s:s, s:s}", "role", "system", "content", system));
    }
    json_array_append_new(r->messages, json_pack("{s:s, s:s}", "role", "user", "content", prompt ? prompt : ""));
    return 0;
}

/* ---- encoders ------------------------------------------------------------------- */

static const char *done_reason(exo_finish_reason r)
{
    switch (r) {
    case EXO_FR_LENGTH: return "length";
    case EXO_FR_TOOL_CALLS: return "tool_call";
    case EXO_FR_ERROR: return "error";
    default: return "stop";
    }
}

static void line_head(exo_api_encoder *e, exo_sbuf *out)
{
    exo_sbuf_puts(out, "{\"model\":");
    exo_sbuf_json_str(out, e->model);
    exo_sbuf_puts(out, ",\"created_at\":");
    exo_api_write_now(out);
}

static void write_counts(exo_api_encoder *e, exo_sbuf *out)
{
    const exo_usage *u = &e->usage;
    double pd = e->prompt_tps > 0 ? u->prompt_tokens / e->prompt_tps : 0;
    double gd = e->gen_tps > 0 ? u->completion_tokens / e->gen_tps : 0;
    long long pns = (long long)(pd * 1e9), gns = (long long)(gd * 1e9);
    exo_sbuf_printf(out, ",\"done\":true,\"done_reason\":\"%s\",\"total_duration\":%lld,"
                         "\"load_duration\":0,\"prompt_eval_count\":%d,\"prompt_eval_duration\":%lld,"
                         "\"eval_count\":%d,\"eval_duration\":%lld}",
                    done_reason(e->reason), pns + gns, u->prompt_tokens, pns, u->completion_tokens, gns);
}

static void write_calls(exo_api_encoder *e, exo_sbuf *out, const json_t *calls, int first_index)
{
    exo_sbuf_puts(out, ",\"tool_calls\":[");
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        exo_sbuf_puts(out, i ? ",{\"id\":" : "{\"id\":");
        exo_sbuf_json_str(out, json_string_value(json_object_get(c, "id")));
        exo_sbuf_puts(out, ",\"type\":\"function\",\"function\":{\"name\":");
        exo_sbuf_json_str(out, json_string_value(json_object_get(c, "name")));
        exo_sbuf_puts(out, ",\"arguments\":");
        json_t *v = exo_api_args_value(json_string_value(json_object_get(c, "arguments")));
        exo_api_write_json(out, v);
        json_decref(v);
        exo_sbuf_printf(out, ",\"index\":%d}}", first_index + (int)i);
    }
    exo_sbuf_putc(out, ']');
}

static void ol_feed_common(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out, bool chat)
{
    switch (c->kind) {
    case EXO_CHUNK_TOKEN:
        if (!*c->text)
            return;
        line_head(e, out);
        if (chat) {
            exo_sbuf_puts(out, c->is_thinking ? ",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":"
                                              : ",\"message\":{\"role\":\"assistant\",\"content\":");
            exo_sbuf_json_str(out, c->text);
            exo_sbuf_puts(out, "},\"done\":false}\n");
        } else {
            exo_sbuf_puts(out, c->is_thinking ? ",\"response\":\"\",\"thinking\":" : ",\"response\":");
            exo_sbuf_json_str(out, c->text);
            exo_sbuf_puts(out, ",\"done\":false}\n");
        }
        return;
    case EXO_CHUNK_TOOL_CALLS: {
        if (!chat)
            return; /* /api/generate has no tool calls */
        json_t *calls = json_array();
        for (int i = 0; i < c->n_tool_calls; i++)
            json_array_append_new(calls, json_pack("{s:s, s:s, s:s}", "id", c->tool_calls[i].id, "name",
                                                   c->tool_calls[i].name, "arguments",
                                                   c->tool_calls[i].arguments));
        line_head(e, out);
        exo_sbuf_puts(out, ",\"message\":{\"role\":\"assistant\",\"content\":\"\"");
        write_calls(e, out, calls, e->tool_index);
        e->tool_index += c->n_tool_calls;
        exo_sbuf_puts(out, "},\"done\":false}\n");
        json_decref(calls);
        return;
    }
    case EXO_CHUNK_PREFILL:
        return;
    case EXO_CHUNK_FINISH:
        line_head(e, out);
        exo_sbuf_puts(out, chat ? ",\"message\":{\"role\":\"assistant\",\"content\":\"\"}" : ",\"response\":\"\"");
        if (!chat && e->reason == EXO_FR_TOOL_CALLS)
            e->reason = EXO_FR_STOP;
        write_counts(e, out);
        exo_sbuf_putc(out, '\n');
        return;
    case EXO_CHUNK_ERROR:
        exo_sbuf_puts(out, "{\"error\":");
        exo_sbuf_json_str(out, c->error);
        exo_sbuf_puts(out, "}\n");
        return;
    }
}

static void olc_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out) { ol_feed_common(e, c, out, true); }
static void olg_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out) { ol_feed_common(e, c, out, false); }

static void olc_body(exo_api_encoder *e, exo_sbuf *out)
{
    line_head(e, out);
    exo_sbuf_puts(out, ",\"message\":{\"role\":\"assistant\",\"content\":");
    exo_sbuf_json_strn(out, e->text.data ? e->text.data : "", e->text.len);
    if (e->thinking.len) {
        exo_sbuf_puts(out, ",\"thinking\":");
        exo_sbuf_json_strn(out, e->thinking.data, e->thinking.len);
    }
    if (json_array_size(e->calls))
        write_calls(e, out, e->calls, 0);
    exo_sbuf_putc(out, '}');
    write_counts(e, out);
}

static void olg_body(exo_api_encoder *e, exo_sbuf *out)
{
    line_head(e, out);
    exo_sbuf_puts(out, ",\"response\":");
    exo_sbuf_json_strn(out, e->text.data ? e->text.data : "", e->text.len);
    if (e->thinking.len) {
        exo_sbuf_puts(out, ",\"thinking\":");
        exo_sbuf_json_strn(out, e->thinking.data, e->thinking.len);
    }
    if (e->reason == EXO_FR_TOOL_CALLS)
        e->reason = EXO_FR_STOP;
    write_counts(e, out);
}

const exo_api_encoder_vt exo_ollama_chat_vt = {
    .ctype_stream = "application/x-ndjson",
    .ctype_body = "application/json",
    .sse = false,
    .feed = olc_feed,
    .body = olc_body,
};

const exo_api_encoder_vt exo_ollama_generate_vt = {
    .ctype_stream = "application/x-ndjson",
    .ctype_body = "application/json",
    .sse = false,
    .feed = olg_feed,
    .body = olg_body,
};

/* ---- node-state endpoints --------------------------------------------------------- */

static json_t *details(const exo_api_model_info *m)
{
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "safetensors",
                     "family", m->family ? m->family : "", "families", m->family ? m->family : "",
                     "parameter_size", "", "quantization_level", m->quantization ? m->quantization : "");
}

static char *dump(json_t *j)
{
    char *s = exo_json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s ? s : exo_strdup("{}");
}

static json_t *now_json(void)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_api_write_now(&b);
    json_t *j = json_loads(b.data, JSON_DECODE_ANY, NULL);
    exo_sbuf_free(&b);
    return j ? j : json_string("");
}

char *exo_ollama_tags_json(const exo_api_model_info *models, int n)
{
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        const exo_api_model_info *m = &models[i];
        if (!m->downloaded)
            continue;
        json_array_append_new(list, json_pack("{s:s, s:s, s:o, s:I, s:s, s:o}", "name", m->id, "model",
                                              m->id, "modified_at", now_json(), "size", (json_int_t)m->size_bytes,
                                              "digest", "sha256:000000000000", "details", details(m)));
    }
    return dump(json_pack("{s:o}", "models", list));
}

char *exo_ollama_ps_json(const exo_api_model_info *models, int n)
{
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        const exo_api_model_info *m = &models[i];
        if (!m->running)
            continue;
        json_array_append_new(list, json_pack("{s:s, s:s, s:i, s:s, s:o, s:s, s:i}", "name", m->id,
                                              "model", m->id, "size", 0, "digest", "sha256:000000000000",
                                              "details", details(m), "expires_at",
                                              "0001-01-01T00:00:00Z", "size_vram", 0));
    }
    return dump(json_pack("{s:o}", "models", list));
}

char *exo_ollama_version_json(void) { return exo_strdup("{\"version\":\"1.0.0\"}"); }

int exo_ollama_show_json(const char *body, size_t len, const exo_api_model_info *models, int n,
                         char **out, int *http_status)
{
    json_t *j = NULL;
    exo_err err = {0};
    *out = NULL;
    if (exo_ju_parse_body(body, len, &j, &err)) {
        *http_status = 400;
        *out = exo_api_error_body(EXO_API_OLLAMA_CHAT, 400, err.msg);
        return EXO_EFORMAT;
    }
    const char *name = NULL;
    if (exo_ju_str(j, "model", &name, false, NULL) || !name)
        if (exo_ju_str(j, "name", &name, false, NULL))
            name = NULL;
    if (!name || !*name) {
        json_decref(j);
        *http_status = 400;
        *out = exo_api_error_body(EXO_API_OLLAMA_CHAT, 400, "model name is required");
        return EXO_EINVAL;
    }
    const exo_api_model_info *m = NULL;
    for (int i = 0; i < n && !m; i++)
        if (!strcmp(models[i].id, name))
            m = &models[i];
    if (!m) {
        char msg[600];
        snprintf(msg, sizeof msg, "model '%.500s' not found", name);
        json_decref(j);
        *http_status = 404;
        *out = exo_api_error_body(EXO_API_OLLAMA_CHAT, 404, msg);
        return EXO_ENOENT;
    }
    const char *arch = m->family ? m->family : "";
    const char *base = strrchr(m->id, '/') ? strrchr(m->id, '/') + 1 : m->id;
    json_t *info = json_pack("{s:s, s:s}", "general.architecture", arch, "general.basename", base);
    char key[160];
    snprintf(key, sizeof key, "%.120s.context_length", arch);
    json_object_set_new(info, key, json_integer(m->context_length));
    json_t *caps = json_pack("[s, s]", "completion", "tools");
    if (m->supports_vision)
        json_array_append_new(caps, json_string("vision"));
    char modelfile[600];
    snprintf(modelfile, sizeof modelfile, "FROM %.500s", m->id);
    *out = dump(json_pack("{s:s, s:s, s:o, s:o, s:o}", "modelfile", modelfile, "template",
                          "{{ .Prompt }}", "details", details(m), "model_info", info, "capabilities", caps));
    json_decref(j);
    *http_status = 200;
    return 0;
}
