/* Family dispatch, chunk aggregation and shared writers for the adapters
 * (see api.h). Each family file provides a vtable; this file owns the
 * encoder's lifecycle so the terminal-chunk rules (nothing after FINISH or
 * ERROR; non-streaming bodies written exactly once) live in one place. */
#include "api/encoder_impl.h"

#include "core/json_util.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

const exo_api_route exo_api_generation_routes[] = {
    {"/v1/chat/completions", EXO_API_OPENAI_CHAT},
    {"/ollama/v1/chat/completions", EXO_API_OPENAI_CHAT},
    {"/bench/chat/completions", EXO_API_BENCH_CHAT},
    {"/v1/messages", EXO_API_CLAUDE},
    {"/v1/responses", EXO_API_RESPONSES},
    {"/ollama/api/chat", EXO_API_OLLAMA_CHAT},
    {"/ollama/api/api/chat", EXO_API_OLLAMA_CHAT},
    {"/ollama/api/v1/chat", EXO_API_OLLAMA_CHAT},
    {"/ollama/api/generate", EXO_API_OLLAMA_GENERATE},
    /* Ollama's own paths, so a client pointed at the daemon as its Ollama
     * host works unmodified */
    {"/api/chat", EXO_API_OLLAMA_CHAT},
    {"/api/generate", EXO_API_OLLAMA_GENERATE},
};
const int exo_api_n_generation_routes =
    (int)(sizeof exo_api_generation_routes / sizeof *exo_api_generation_routes);

static const exo_api_encoder_vt *vt_of(exo_api_family f)
{
    switch (f) {
    case EXO_API_OPENAI_CHAT:
    case EXO_API_BENCH_CHAT: return &exo_openai_chat_vt;
    case EXO_API_CLAUDE: return &exo_claude_vt;
    case EXO_API_RESPONSES: return &exo_responses_vt;
    case EXO_API_OLLAMA_CHAT: return &exo_ollama_chat_vt;
    case EXO_API_OLLAMA_GENERATE: return &exo_ollama_generate_vt;
    }
    return &exo_openai_chat_vt;
}

int exo_api_status_for_parse(int rc)
{
    return rc == EXO_ETOOBIG ? 413 : rc == EXO_EBUSY ? 503 : 400;
}

int exo_api_parse_request(exo_api_family f, const char *body, size_t len, exo_gen_request *out,
                          int *http_status, exo_err *err)
{
    json_t *j = NULL;
    exo_gen_request_init(out);
    *http_status = 400;
    int rc = exo_ju_parse_body(body, len, &j, err);
    if (rc) {
        *http_status = exo_api_status_for_parse(rc);
        return rc;
    }
    switch (f) {
    case EXO_API_OPENAI_CHAT: rc = exo_openai_chat_parse(j, false, out, err); break;
    case EXO_API_BENCH_CHAT: rc = exo_openai_chat_parse(j, true, out, err); break;
    case EXO_API_CLAUDE: rc = exo_claude_parse(j, out, err); break;
    case EXO_API_RESPONSES: rc = exo_responses_parse(j, out, err); break;
    case EXO_API_OLLAMA_CHAT: rc = exo_ollama_chat_parse(j, out, err); break;
    case EXO_API_OLLAMA_GENERATE: rc = exo_ollama_generate_parse(j, out, err); break;
    default: rc = exo_err_set(err, EXO_EINVAL, "unknown API");
    }
    json_decref(j);
    if (!rc) {
        exo_gen_resolve_reasoning(out);
        rc = exo_gen_request_validate(out, err);
    }
    if (rc)
        exo_gen_request_free(out);
    else
        *http_status = 200;
    return rc;
}

const char *exo_api_error_type(exo_api_family f, int status)
{
    if (f == EXO_API_CLAUDE)
        return status == 404 ? "not_found_error"
             : status == 413 ? "request_too_large"
             : status >= 500 ? "api_error" : "invalid_request_error";
    if (status == 404) return "not_found_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

int exo_api_chunk_status(const exo_chunk *c) { return c->error_status ? c->error_status : 500; }

char *exo_api_error_body(exo_api_family f, int status, const char *message)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    switch (f) {
    case EXO_API_CLAUDE: {
        exo_sbuf_puts(&b, "{\"type\":\"error\",\"error\":{\"type\":");
        exo_sbuf_json_str(&b, exo_api_error_type(f, status));
        exo_sbuf_puts(&b, ",\"message\":");
        exo_sbuf_json_str(&b, message);
        exo_sbuf_puts(&b, "}}");
        break;
    }
    case EXO_API_OLLAMA_CHAT:
    case EXO_API_OLLAMA_GENERATE:
        exo_sbuf_puts(&b, "{\"error\":");
        exo_sbuf_json_str(&b, message);
        exo_sbuf_puts(&b, "}");
        break;
    default:
        exo_sbuf_puts(&b, "{\"error\":{\"message\":");
        exo_sbuf_json_str(&b, message);
        exo_sbuf_puts(&b, ",\"type\":");
        exo_sbuf_json_str(&b, exo_api_error_type(f, status));
        exo_sbuf_printf(&b, ",\"param\":null,\"code\":%d}}", status);
        break;
    }
    /* exo_sbuf_take's buffer comes from exo_realloc: callers free with exo_free. */
    return exo_sbuf_take(&b);
}

exo_api_encoder *exo_api_encoder_create(exo_api_family f, const exo_gen_request *req,
                                        const char *command_id, int64_t created)
{
    exo_api_encoder *e = exo_calloc(1, sizeof *e);
    e->vt = vt_of(f);
    e->family = f;
    e->stream = req->stream;
    e->logprobs = req->logprobs;
    e->bench = req->bench || f == EXO_API_BENCH_CHAT;
    e->status = 200;
    e->id = exo_strdup(command_id ? command_id : "");
    e->model = exo_strdup(req->model ? req->model : "");
    e->created = created;
    exo_sbuf_init(&e->text);
    exo_sbuf_init(&e->thinking);
    exo_sbuf_init(&e->lp);
    exo_sbuf_init(&e->scratch);
    e->calls = json_array();
    e->block = -1;
    e->rs_index = e->msg_index = -1;
    e->outputs = json_array();
    return e;
}

void exo_api_encoder_free(exo_api_encoder *e)
{
    if (!e)
        return;
    exo_free(e->id);
    exo_free(e->model);
    exo_sbuf_free(&e->text);
    exo_sbuf_free(&e->thinking);
    exo_sbuf_free(&e->lp);
    exo_sbuf_free(&e->scratch);
    json_decref(e->calls);
    json_decref(e->outputs);
    exo_free(e->stop_seq);
    exo_free(e);
}

const char *exo_api_encoder_content_type(const exo_api_encoder *e)
{
    return e->stream ? e->vt->ctype_stream : e->vt->ctype_body;
}

bool exo_api_encoder_keepalive(const exo_api_encoder *e) { return e->stream && e->vt->sse; }

void exo_api_encoder_begin(exo_api_encoder *e, exo_sbuf *out)
{
    if (e->stream && e->vt->begin)
        e->vt->begin(e, out);
}

int exo_api_encoder_status(const exo_api_encoder *e) { return e->status; }

static void aggregate(exo_api_encoder *e, const exo_chunk *c)
{
    switch (c->kind) {
    case EXO_CHUNK_TOKEN:
        if (c->is_thinking)
            exo_sbuf_append(&e->thinking, c->text, strlen(c->text));
        else
            exo_sbuf_append(&e->text, c->text, strlen(c->text));
        if (e->logprobs && c->has_logprob && !e->stream) {
            if (e->n_lp++)
                exo_sbuf_putc(&e->lp, ',');
            exo_api_write_logprob(&e->lp, c);
        }
        break;
    case EXO_CHUNK_TOOL_CALLS:
        for (int i = 0; i < c->n_tool_calls; i++)
            json_array_append_new(e->calls, json_pack("{s:s, s:s, s:s}", "id", c->tool_calls[i].id,
                                                      "name", c->tool_calls[i].name, "arguments",
                                                      c->tool_calls[i].arguments));
        break;
    case EXO_CHUNK_FINISH:
        e->reason = c->reason;
        e->usage = c->usage;
        e->prompt_tps = c->prompt_tps;
        e->gen_tps = c->generation_tps;
        e->peak_memory = c->peak_memory_bytes;
        exo_free(e->stop_seq);
        e->stop_seq = c->stop_sequence ? exo_strdup(c->stop_sequence) : NULL;
        break;
    case EXO_CHUNK_ERROR:
        e->reason = EXO_FR_ERROR;
        break;
    case EXO_CHUNK_PREFILL:
        break;
    }
}

bool exo_api_encoder_feed(exo_api_encoder *e, const exo_chunk *c, exo_sbuf *out)
{
    if (e->done)
        return true;
    aggregate(e, c);
    bool terminal = c->kind == EXO_CHUNK_FINISH || c->kind == EXO_CHUNK_ERROR;
    if (e->stream) {
        e->vt->feed(e, c, out);
    } else if (c->kind == EXO_CHUNK_ERROR) {
        e->status = exo_api_chunk_status(c);
        char *body = exo_api_error_body(e->family, e->status, c->error ? c->error : "error");
        exo_sbuf_puts(out, body);
        exo_free(body);
    } else if (c->kind == EXO_CHUNK_FINISH) {
        e->vt->body(e, out);
    }
    if (terminal)
        e->done = true;
    return e->done;
}

/* ---- shared writers ------------------------------------------------------ */

void exo_api_write_usage(exo_sbuf *b, const exo_usage *u)
{
    exo_sbuf_printf(b,
                    "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":%d},"
                    "\"completion_tokens_details\":{\"reasoning_tokens\":%d}}",
                    u->prompt_tokens, u->completion_tokens, u->prompt_tokens + u->completion_tokens,
                    u->cached_tokens, u->reasoning_tokens);
}

void exo_api_write_logprob(exo_sbuf *b, const exo_chunk *c)
{
    /* the token's own text, as its top_logprobs alternatives are written */
    const char *tok = c->token_text ? c->token_text : c->text;
    size_t n = strlen(tok);
    exo_sbuf_puts(b, "{\"token\":");
    exo_sbuf_json_strn(b, tok, n);
    exo_sbuf_puts(b, ",\"logprob\":");
    exo_sbuf_json_num(b, c->logprob);
    exo_sbuf_puts(b, ",\"bytes\":");
    exo_sbuf_json_bytes(b, tok, n);
    exo_sbuf_puts(b, ",\"top_logprobs\":[");
    for (int i = 0; i < c->n_top; i++) {
        const char *t = c->top[i].token ? c->top[i].token : "";
        size_t tn = strlen(t);
        exo_sbuf_puts(b, i ? ",{\"token\":" : "{\"token\":");
        exo_sbuf_json_strn(b, t, tn);
        exo_sbuf_puts(b, ",\"logprob\":");
        exo_sbuf_json_num(b, c->top[i].logprob);
        exo_sbuf_puts(b, ",\"bytes\":");
        exo_sbuf_json_bytes(b, t, tn);
        exo_sbuf_putc(b, '}');
    }
    exo_sbuf_puts(b, "]}");
}

void exo_api_write_now(exo_sbuf *b)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    exo_sbuf_printf(b, "\"%04d-%02d-%02dT%02d:%02d:%02d.%09ldZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                    tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec);
}

json_t *exo_api_args_value(const char *arguments)
{
    json_t *v = json_loads(arguments ? arguments : "", 0, NULL);
    if (v && json_is_object(v))
        return v;
    json_decref(v);
    return json_string(arguments ? arguments : "");
}

void exo_api_write_json(exo_sbuf *b, const json_t *j)
{
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s) {
        exo_sbuf_puts(b, s);
        exo_free(s);
    } else {
        exo_sbuf_puts(b, "null");
    }
}

/* ---- shared parser helpers -------------------------------------------------- */

int exo_api_content_text(const json_t *content, const char *where, exo_sbuf *out, exo_err *err)
{
    if (!content || json_is_null(content))
        return 0;
    if (json_is_string(content)) {
        exo_sbuf_append(out, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content))
        return exo_err_set(err, EXO_EINVAL, "%s: content must be a string or an array", where);
    size_t i;
    json_t *part;
    bool first = true;
    json_array_foreach(content, i, part) {
        const char *type = NULL, *text = NULL;
        if (json_is_string(part)) {
            text = json_string_value(part);
        } else {
            if (!json_is_object(part))
                return exo_err_set(err, EXO_EINVAL, "%s: content[%zu] must be an object", where, i);
            int rc = exo_ju_str(part, "type", &type, true, err);
            if (rc)
                return rc;
            if (!strcmp(type, "text") || !strcmp(type, "input_text") || !strcmp(type, "output_text")) {
                if ((rc = exo_ju_str(part, "text", &text, true, err)))
                    return rc;
            } else if (strstr(type, "image")) {
                return exo_err_set(err, EXO_EUNSUPPORTED, "%s: image inputs are not supported", where);
            } else {
                return exo_err_set(err, EXO_EINVAL, "%s: unsupported content part type '%.32s'",
                                   where, type);
            }
        }
        if (!first)
            exo_sbuf_putc(out, '\n');
        exo_sbuf_puts(out, text);
        first = false;
    }
    return 0;
}

int exo_api_read_float(const json_t *obj, const char *key, float *dst, uint32_t bit,
                       exo_gen_request *r, exo_err *err)
{
    double d;
    bool present = false;
    int rc = exo_ju_num(obj, key, &d, &present, err);
    if (rc || !present)
        return rc;
    if (d > 1e9 || d < -1e9)
        return exo_err_set(err, EXO_ERANGE, "'%s' is out of range", key);
    *dst = (float)d;
    r->has |= bit;
    return 0;
}

int exo_api_read_float_in(const json_t *obj, const char *key, double lo, double hi, float *dst,
                          uint32_t bit, exo_gen_request *r, exo_err *err)
{
    double d;
    bool present = false;
    int rc = exo_ju_num(obj, key, &d, &present, err);
    if (rc || !present)
        return rc;
    if (!(d >= lo && d <= hi))
        return exo_err_set(err, EXO_ERANGE, "Invalid '%s': expected a value between %g and %g, got %g", key,
                           lo, hi, d);
    *dst = (float)d;
    r->has |= bit;
    return 0;
}

int exo_api_read_intf(const json_t *obj, const char *key, int *dst, uint32_t bit,
                      exo_gen_request *r, exo_err *err)
{
    int64_t v;
    bool present = false;
    int rc = exo_ju_int(obj, key, &v, &present, err);
    if (rc || !present)
        return rc;
    if (v < -(1LL << 30) || v > (1LL << 30))
        return exo_err_set(err, EXO_ERANGE, "'%s' is out of range", key);
    *dst = (int)v;
    r->has |= bit;
    return 0;
}

int exo_api_read_stop(const json_t *obj, const char *key, exo_gen_request *r, exo_err *err)
{
    json_t *v = exo_ju_get(obj, key);
    if (!v)
        return 0;
    if (json_is_string(v))
        return exo_gen_add_stop(r, json_string_value(v), err);
    if (!json_is_array(v))
        return exo_err_set(err, EXO_EINVAL, "'%s' must be a string or an array of strings", key);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return exo_err_set(err, EXO_EINVAL, "'%s' must hold only strings", key);
        int rc = exo_gen_add_stop(r, json_string_value(s), err);
        if (rc)
            return rc;
    }
    return 0;
}

int exo_api_read_seed(const json_t *obj, const char *key, exo_gen_request *r, exo_err *err)
{
    int64_t v;
    bool present = false;
    int rc = exo_ju_int(obj, key, &v, &present, err);
    if (rc || !present)
        return rc;
    r->sampling.seed = (uint64_t)v;
    r->has |= EXO_GEN_HAS_SEED;
    return 0;
}

int exo_api_read_openai_tools(const json_t *tools, exo_gen_request *r, exo_err *err)
{
    if (!tools || json_is_null(tools))
        return 0;
    if (!json_is_array(tools))
        return exo_err_set(err, EXO_EINVAL, "'tools' must be an array");
    if (json_array_size(tools) > EXO_GEN_MAX_TOOLS)
        return exo_err_set(err, EXO_ERANGE, "too many tools");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_is_object(t) ? json_object_get(t, "function") : NULL;
        const char *name = NULL;
        if (!json_is_object(f) || exo_ju_str(f, "name", &name, true, NULL) || !*name) {
            json_decref(out);
            return exo_err_set(err, EXO_EINVAL, "tools[%zu] must be {\"type\":\"function\",\"function\":{\"name\":...}}", i);
        }
        json_t *params = json_object_get(f, "parameters");
        if (params && !json_is_null(params) && !json_is_object(params)) {
            json_decref(out);
            return exo_err_set(err, EXO_EINVAL, "tools[%zu].function.parameters must be an object", i);
        }
        json_t *fn = json_pack("{s:s}", "name", name);
        json_t *desc = json_object_get(f, "description");
        if (json_is_string(desc))
            json_object_set(fn, "description", desc);
        if (json_is_object(params))
            json_object_set_new(fn, "parameters", json_deep_copy(params));
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    json_decref(r->tools);
    r->tools = out;
    return 0;
}
