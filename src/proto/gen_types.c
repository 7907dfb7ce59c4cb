/* The canonical request / chunk types and their JSON forms (see gen_types.h).
 *
 * The JSON decoders here read data from other processes and other nodes, so
 * they are strict: every key must be known, every value the right type and
 * in range. The adapters fill requests from client bodies with their own
 * (lenient, API-compatible) readers and then call exo_gen_request_validate,
 * so both paths end in the same range checks. */
#include "proto/gen_types.h"

#include "core/json_util.h"
#include "core/alloc.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char *const finish_names[] = {
    [EXO_FR_NONE] = "none",   [EXO_FR_STOP] = "stop",   [EXO_FR_LENGTH] = "length",
    [EXO_FR_TOOL_CALLS] = "tool_calls", [EXO_FR_ERROR] = "error", [EXO_FR_CANCELLED] = "cancelled",
};

const char *exo_finish_reason_name(exo_finish_reason r)
{
    if ((unsigned)r >= sizeof finish_names / sizeof *finish_names)
        return "none";
    return finish_names[r];
}

int exo_finish_reason_parse(const char *s, exo_finish_reason *out)
{
    for (size_t i = 0; i < sizeof finish_names / sizeof *finish_names; i++)
        if (strcmp(s, finish_names[i]) == 0) {
            *out = (exo_finish_reason)i;
            return 0;
        }
    return EXO_EINVAL;
}

static const char *const effort_names[] = {
    [EXO_EFFORT_UNSET] = NULL,    [EXO_EFFORT_NONE] = "none", [EXO_EFFORT_MINIMAL] = "minimal",
    [EXO_EFFORT_LOW] = "low",     [EXO_EFFORT_MEDIUM] = "medium", [EXO_EFFORT_HIGH] = "high",
    [EXO_EFFORT_XHIGH] = "xhigh",
};

const char *exo_reasoning_effort_name(exo_reasoning_effort e)
{
    if ((unsigned)e >= sizeof effort_names / sizeof *effort_names)
        return NULL;
    return effort_names[e];
}

int exo_reasoning_effort_parse(const char *s, exo_reasoning_effort *out)
{
    for (size_t i = 1; i < sizeof effort_names / sizeof *effort_names; i++)
        if (strcmp(s, effort_names[i]) == 0) {
            *out = (exo_reasoning_effort)i;
            return 0;
        }
    return EXO_EINVAL;
}

void exo_gen_request_init(exo_gen_request *r)
{
    memset(r, 0, sizeof *r);
    r->sampling = exo_sampler_defaults();
    r->enable_thinking = -1;
}

void exo_gen_request_free(exo_gen_request *r)
{
    exo_free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    exo_free(r->instructions);
    for (int i = 0; i < r->n_stop; i++)
        exo_free(r->stop[i]);
    exo_free(r->stop);
    exo_gen_request_init(r);
}

void exo_gen_resolve_reasoning(exo_gen_request *r)
{
    bool has_effort = r->reasoning_effort != EXO_EFFORT_UNSET;
    bool has_think = r->enable_thinking >= 0;
    if (has_effort == has_think)
        return;
    if (has_think)
        r->reasoning_effort = r->enable_thinking ? EXO_EFFORT_MEDIUM : EXO_EFFORT_NONE;
    else
        r->enable_thinking = r->reasoning_effort == EXO_EFFORT_NONE ? 0 : 1;
}

int exo_gen_add_stop(exo_gen_request *r, const char *s, exo_err *err)
{
    if (r->n_stop >= EXO_GEN_MAX_STOP)
        return exo_err_set(err, EXO_ERANGE, "at most %d stop sequences are allowed", EXO_GEN_MAX_STOP);
    size_t n = strlen(s);
    if (n == 0)
        return exo_err_set(err, EXO_ERANGE, "stop sequences must not be empty");
    if (n > EXO_GEN_MAX_STOP_LEN)
        return exo_err_set(err, EXO_ERANGE, "stop sequences are limited to %d bytes",
                           EXO_GEN_MAX_STOP_LEN);
    r->stop = exo_realloc(r->stop, sizeof *r->stop * (size_t)(r->n_stop + 1));
    r->stop[r->n_stop++] = exo_strdup(s);
    return 0;
}

static int check_range(double v, double lo, double hi, const char *name, exo_err *err)
{
    if (!(v >= lo && v <= hi))
        return exo_err_set(err, EXO_ERANGE, "'%s' must be between %g and %g", name, lo, hi);
    return 0;
}

/* A chat message as the chat templates see it. */
static int validate_message(const json_t *m, size_t i, exo_err *err)
{
    if (!json_is_object(m))
        return exo_err_set(err, EXO_EINVAL, "messages[%zu] must be an object", i);
    json_t *role = json_object_get(m, "role");
    if (!json_is_string(role))
        return exo_err_set(err, EXO_EINVAL, "messages[%zu].role must be a string", i);
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer",
                                        "function", NULL};
    bool ok = false;
    for (const char *const *r = roles; *r && !ok; r++)
        ok = strcmp(*r, json_string_value(role)) == 0;
    if (!ok)
        return exo_err_set(err, EXO_EINVAL, "messages[%zu].role '%.32s' is not supported", i,
                           json_string_value(role));
    json_t *content = json_object_get(m, "content");
    if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content))
        return exo_err_set(err, EXO_EINVAL, "messages[%zu].content must be a string or an array",
                           i);
    json_t *tc = json_object_get(m, "tool_calls");
    if (tc && !json_is_null(tc) && !json_is_array(tc))
        return exo_err_set(err, EXO_EINVAL, "messages[%zu].tool_calls must be an array", i);
    return 0;
}

int exo_gen_request_validate(const exo_gen_request *r, exo_err *err)
{
    if (!r->model || !*r->model)
        return exo_err_set(err, EXO_EINVAL, "'model' is required");
    if (strlen(r->model) > 512)
        return exo_err_set(err, EXO_ERANGE, "'model' is too long");
    if (!json_is_array(r->messages))
        return exo_err_set(err, EXO_EINVAL, "'messages' must be an array");
    size_t n = json_array_size(r->messages);
    if (n > EXO_GEN_MAX_MESSAGES)
        return exo_err_set(err, EXO_ERANGE, "too many messages (%zu)", n);
    for (size_t i = 0; i < n; i++) {
        int rc = validate_message(json_array_get(r->messages, i), i, err);
        if (rc)
            return rc;
    }
    if (r->tools) {
        if (!json_is_array(r->tools))
            return exo_err_set(err, EXO_EINVAL, "'tools' must be an array");
        if (json_array_size(r->tools) > EXO_GEN_MAX_TOOLS)
            return exo_err_set(err, EXO_ERANGE, "too many tools");
        size_t i;
        json_t *t;
        json_array_foreach(r->tools, i, t) {
            json_t *f = json_object_get(t, "function");
            const char *name = NULL;
            if (!json_is_object(f) || exo_ju_str(f, "name", &name, true, NULL) || !*name)
                return exo_err_set(err, EXO_EINVAL, "tools[%zu] must be a function with a name", i);
            json_t *params = json_object_get(f, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                return exo_err_set(err, EXO_EINVAL, "tools[%zu].parameters must be an object", i);
        }
    }
    const exo_sampler_params *s = &r->sampling;
    int rc = 0;
    if ((r->has & EXO_GEN_HAS_MAX_TOKENS) && (r->max_tokens < 1 || r->max_tokens > EXO_GEN_MAX_TOKENS))
        return exo_err_set(err, EXO_ERANGE, "'max_tokens' must be between 1 and %d",
                           EXO_GEN_MAX_TOKENS);
    if ((r->has & EXO_GEN_HAS_TEMPERATURE) && (rc = check_range(s->temperature, 0, 100, "temperature", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_TOP_P) && (rc = check_range(s->top_p, 0, 1, "top_p", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_MIN_P) && (rc = check_range(s->min_p, 0, 1, "min_p", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_TOP_K) && (rc = check_range(s->top_k, 0, 1 << 24, "top_k", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_REP_PENALTY) &&
        (rc = check_range(s->repetition_penalty, 1e-3, 100, "repetition_penalty", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_REP_CONTEXT) &&
        (rc = check_range(s->repetition_context_size, 0, 1 << 20, "repetition_context_size", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_PRESENCE) &&
        (rc = check_range(s->presence_penalty, -100, 100, "presence_penalty", err)))
        return rc;
    if ((r->has & EXO_GEN_HAS_FREQUENCY) &&
        (rc = check_range(s->frequency_penalty, -100, 100, "frequency_penalty", err)))
        return rc;
    if ((rc = check_range(s->top_logprobs, 0, EXO_MAX_TOP_LOGPROBS, "top_logprobs", err)))
        return rc;
    if (r->n_stop > EXO_GEN_MAX_STOP)
        return exo_err_set(err, EXO_ERANGE, "too many stop sequences");
    if (r->enable_thinking < -1 || r->enable_thinking > 1)
        return exo_err_set(err, EXO_EINVAL, "bad enable_thinking");
    return 0;
}

/* ---- request JSON ----------------------------------------------------- */

json_t *exo_gen_request_to_json(const exo_gen_request *r)
{
    json_t *j = json_object();
    const exo_sampler_params *s = &r->sampling;
    json_object_set_new(j, "model", json_string(r->model ? r->model : ""));
    json_object_set_new(j, "messages", r->messages ? json_incref(r->messages) : json_array());
    if (r->tools)
        json_object_set(j, "tools", r->tools);
    if (r->instructions)
        json_object_set_new(j, "instructions", json_string(r->instructions));
    if (r->has & EXO_GEN_HAS_MAX_TOKENS)
        json_object_set_new(j, "max_tokens", json_integer(r->max_tokens));
    if (r->has & EXO_GEN_HAS_TEMPERATURE)
        json_object_set_new(j, "temperature", json_real(s->temperature));
    if (r->has & EXO_GEN_HAS_TOP_P)
        json_object_set_new(j, "top_p", json_real(s->top_p));
    if (r->has & EXO_GEN_HAS_TOP_K)
        json_object_set_new(j, "top_k", json_integer(s->top_k));
    if (r->has & EXO_GEN_HAS_MIN_P)
        json_object_set_new(j, "min_p", json_real(s->min_p));
    if (r->has & EXO_GEN_HAS_REP_PENALTY)
        json_object_set_new(j, "repetition_penalty", json_real(s->repetition_penalty));
    if (r->has & EXO_GEN_HAS_REP_CONTEXT)
        json_object_set_new(j, "repetition_context_size", json_integer(s->repetition_context_size));
    if (r->has & EXO_GEN_HAS_PRESENCE)
        json_object_set_new(j, "presence_penalty", json_real(s->presence_penalty));
    if (r->has & EXO_GEN_HAS_FREQUENCY)
        json_object_set_new(j, "frequency_penalty", json_real(s->frequency_penalty));
    if (r->has & EXO_GEN_HAS_SEED) /* u64 travels as a decimal string: JSON ints are i64 here */
        json_object_set_new(j, "seed", json_sprintf("%llu", (unsigned long long)s->seed));
    if (r->n_stop) {
        json_t *a = json_array();
        for (int i = 0; i < r->n_stop; i++)
            json_array_append_new(a, json_string(r->stop[i]));
        json_object_set_new(j, "stop", a);
    }
    json_object_set_new(j, "logprobs", json_boolean(r->logprobs));
    json_object_set_new(j, "top_logprobs", json_integer(s->top_logprobs));
    if (r->reasoning_effort != EXO_EFFORT_UNSET)
        json_object_set_new(j, "reasoning_effort",
                            json_string(exo_reasoning_effort_name(r->reasoning_effort)));
    if (r->enable_thinking >= 0)
        json_object_set_new(j, "enable_thinking", json_boolean(r->enable_thinking));
    json_object_set_new(j, "stream", json_boolean(r->stream));
    json_object_set_new(j, "bench", json_boolean(r->bench));
    json_object_set_new(j, "use_prefix_cache", json_boolean(r->use_prefix_cache));
    return j;
}

#define TRY(x) do { if ((rc = (x)) != 0) goto fail; } while (0)

int exo_gen_request_from_json(const json_t *j, exo_gen_request *out, exo_err *err)
{
    static const char *const keys[] = {
        "model", "messages", "tools", "instructions", "max_tokens", "temperature", "top_p",
        "top_k", "min_p", "repetition_penalty", "repetition_context_size", "presence_penalty",
        "frequency_penalty", "seed", "stop", "logprobs", "top_logprobs", "reasoning_effort",
        "enable_thinking", "stream", "bench", "use_prefix_cache", NULL};
    int rc;
    exo_gen_request_init(out);
    if (!json_is_object(j))
        return exo_err_set(err, EXO_EFORMAT, "request: not an object");
    TRY(exo_ju_only_keys(j, keys, "request", err));
    const char *s = NULL;
    TRY(exo_ju_str(j, "model", &s, true, err));
    out->model = exo_strdup(s);
    json_t *a;
    TRY(exo_ju_array(j, "messages", &a, true, err));
    out->messages = json_deep_copy(a);
    TRY(exo_ju_array(j, "tools", &a, false, err));
    out->tools = a ? json_deep_copy(a) : NULL;
    s = NULL;
    TRY(exo_ju_str(j, "instructions", &s, false, err));
    out->instructions = s ? exo_strdup(s) : NULL;

    struct { const char *key; uint32_t bit; int kind; void *dst; } nums[] = {
        {"max_tokens", EXO_GEN_HAS_MAX_TOKENS, 1, &out->max_tokens},
        {"temperature", EXO_GEN_HAS_TEMPERATURE, 0, &out->sampling.temperature},
        {"top_p", EXO_GEN_HAS_TOP_P, 0, &out->sampling.top_p},
        {"top_k", EXO_GEN_HAS_TOP_K, 1, &out->sampling.top_k},
        {"min_p", EXO_GEN_HAS_MIN_P, 0, &out->sampling.min_p},
        {"repetition_penalty", EXO_GEN_HAS_REP_PENALTY, 0, &out->sampling.repetition_penalty},
        {"repetition_context_size", EXO_GEN_HAS_REP_CONTEXT, 1, &out->sampling.repetition_context_size},
        {"presence_penalty", EXO_GEN_HAS_PRESENCE, 0, &out->sampling.presence_penalty},
        {"frequency_penalty", EXO_GEN_HAS_FREQUENCY, 0, &out->sampling.frequency_penalty},
        {"top_logprobs", EXO_GEN_HAS_TOP_LOGPROBS, 1, &out->sampling.top_logprobs},
    };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        bool present = false;
        if (nums[i].kind == 0) {
            double d = 0;
            TRY(exo_ju_num(j, nums[i].key, &d, &present, err));
            if (present) {
                if (fabs(d) > 1e9) {
                    rc = exo_err_set(err, EXO_ERANGE, "'%s' out of range", nums[i].key);
                    goto fail;
                }
                *(float *)nums[i].dst = (float)d;
            }
        } else {
            int64_t v = 0;
            TRY(exo_ju_int(j, nums[i].key, &v, &present, err));
            if (present) {
                if (v < -(1LL << 30) || v > (1LL << 30)) {
                    rc = exo_err_set(err, EXO_ERANGE, "'%s' out of range", nums[i].key);
                    goto fail;
                }
                *(int *)nums[i].dst = (int)v;
            }
        }
        if (present)
            out->has |= nums[i].bit;
    }
    json_t *seed = exo_ju_get(j, "seed");
    if (seed) {
        unsigned long long v;
        char tail;
        if (!json_is_string(seed) || sscanf(json_string_value(seed), "%llu%c", &v, &tail) != 1 ||
            json_string_value(seed)[0] == '-') {
            rc = exo_err_set(err, EXO_EINVAL, "'seed' must be a decimal string");
            goto fail;
        }
        out->sampling.seed = v;
        out->has |= EXO_GEN_HAS_SEED;
    }
    TRY(exo_ju_array(j, "stop", &a, false, err));
    if (a) {
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) {
            if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
                rc = exo_err_set(err, EXO_EINVAL, "'stop' must hold strings");
                goto fail;
            }
            TRY(exo_gen_add_stop(out, json_string_value(v), err));
        }
    }
    TRY(exo_ju_bool(j, "logprobs", &out->logprobs, NULL, err));
    s = NULL;
    TRY(exo_ju_str(j, "reasoning_effort", &s, false, err));
    if (s && exo_reasoning_effort_parse(s, &out->reasoning_effort)) {
        rc = exo_err_set(err, EXO_EINVAL, "bad 'reasoning_effort'");
        goto fail;
    }
    bool present = false, b = false;
    TRY(exo_ju_bool(j, "enable_thinking", &b, &present, err));
    if (present)
        out->enable_thinking = b;
    TRY(exo_ju_bool(j, "stream", &out->stream, NULL, err));
    TRY(exo_ju_bool(j, "bench", &out->bench, NULL, err));
    TRY(exo_ju_bool(j, "use_prefix_cache", &out->use_prefix_cache, NULL, err));
    TRY(exo_gen_request_validate(out, err));
    return 0;
fail:
    exo_gen_request_free(out);
    return rc;
}

/* ---- chunks ----------------------------------------------------------- */

void exo_chunk_token(exo_chunk *c, const char *text, size_t len, int32_t token_id, bool thinking)
{
    memset(c, 0, sizeof *c);
    c->kind = EXO_CHUNK_TOKEN;
    c->text = exo_strndup(text ? text : "", text ? len : 0);
    c->token_id = token_id;
    c->is_thinking = thinking;
}

void exo_chunk_error_status(exo_chunk *c, int http_status, const char *message)
{
    memset(c, 0, sizeof *c);
    c->kind = EXO_CHUNK_ERROR;
    c->error = exo_strdup(message ? message : "unknown error");
    c->error_status = http_status >= 400 && http_status <= 599 ? http_status : 500;
    c->reason = EXO_FR_ERROR;
}

void exo_chunk_error(exo_chunk *c, const char *message) { exo_chunk_error_status(c, 500, message); }

void exo_chunk_finish(exo_chunk *c, exo_finish_reason reason, const exo_usage *usage,
                      double prompt_tps, double generation_tps)
{
    memset(c, 0, sizeof *c);
    c->kind = EXO_CHUNK_FINISH;
    c->reason = reason;
    if (usage)
        c->usage = *usage;
    c->prompt_tps = prompt_tps;
    c->generation_tps = generation_tps;
}

void exo_chunk_prefill(exo_chunk *c, int processed, int total)
{
    memset(c, 0, sizeof *c);
    c->kind = EXO_CHUNK_PREFILL;
    c->processed = processed;
    c->total = total;
}

void exo_chunk_tool_calls(exo_chunk *c)
{
    memset(c, 0, sizeof *c);
    c->kind = EXO_CHUNK_TOOL_CALLS;
}

void exo_chunk_add_tool_call(exo_chunk *c, const char *id, const char *name, const char *arguments)
{
    c->tool_calls = exo_realloc(c->tool_calls, sizeof *c->tool_calls * (size_t)(c->n_tool_calls + 1));
    exo_tool_call *t = &c->tool_calls[c->n_tool_calls++];
    t->id = exo_strdup(id ? id : "");
    t->name = exo_strdup(name ? name : "");
    t->arguments = exo_strdup(arguments ? arguments : "{}");
}

void exo_chunk_set_top(exo_chunk *c, int i, const char *token, float logprob)
{
    if (i < 0 || i >= EXO_MAX_TOP_LOGPROBS)
        return;
    exo_free(c->top[i].token);
    c->top[i].token = exo_strdup(token ? token : "");
    c->top[i].logprob = logprob;
    if (c->n_top < i + 1)
        c->n_top = i + 1;
}

void exo_chunk_set_token_text(exo_chunk *c, const char *token_text)
{
    exo_free(c->token_text);
    c->token_text = token_text ? exo_strdup(token_text) : NULL;
}

void exo_chunk_set_stop_sequence(exo_chunk *c, const char *stop)
{
    exo_free(c->stop_sequence);
    c->stop_sequence = stop ? exo_strdup(stop) : NULL;
}

void exo_chunk_free(exo_chunk *c)
{
    exo_free(c->text);
    exo_free(c->token_text);
    for (int i = 0; i < EXO_MAX_TOP_LOGPROBS; i++)
        exo_free(c->top[i].token);
    for (int i = 0; i < c->n_tool_calls; i++) {
        exo_free(c->tool_calls[i].id);
        exo_free(c->tool_calls[i].name);
        exo_free(c->tool_calls[i].arguments);
    }
    exo_free(c->tool_calls);
    exo_free(c->error);
    exo_free(c->stop_sequence);
    memset(c, 0, sizeof *c);
}

static char *dup_or_null(const char *s) { return s ? exo_strdup(s) : NULL; }

void exo_chunk_copy(exo_chunk *dst, const exo_chunk *src)
{
    *dst = *src;
    dst->text = dup_or_null(src->text);
    dst->token_text = dup_or_null(src->token_text);
    for (int i = 0; i < EXO_MAX_TOP_LOGPROBS; i++)
        dst->top[i].token = dup_or_null(src->top[i].token);
    dst->tool_calls = NULL;
    dst->n_tool_calls = 0;
    for (int i = 0; i < src->n_tool_calls; i++)
        exo_chunk_add_tool_call(dst, src->tool_calls[i].id, src->tool_calls[i].name,
                                src->tool_calls[i].arguments);
    dst->error = dup_or_null(src->error);
    dst->stop_sequence = dup_or_null(src->stop_sequence);
}

static const char *const kind_names[] = {
    [EXO_CHUNK_TOKEN] = "token", [EXO_CHUNK_TOOL_CALLS] = "tool_calls",
    [EXO_CHUNK_PREFILL] = "prefill", [EXO_CHUNK_ERROR] = "error", [EXO_CHUNK_FINISH] = "finish",
};

json_t *exo_chunk_to_json(const exo_chunk *c)
{
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(kind_names[c->kind]));
    switch (c->kind) {
    case EXO_CHUNK_TOKEN: {
        json_object_set_new(j, "text", json_string(c->text ? c->text : ""));
        json_object_set_new(j, "token_id", json_integer(c->token_id));
        if (c->token_text)
            json_object_set_new(j, "token_text", json_string(c->token_text));
        if (c->has_logprob)
            json_object_set_new(j, "logprob", json_real(isfinite(c->logprob) ? c->logprob : -9999.0));
        if (c->n_top) {
            json_t *a = json_array();
            for (int i = 0; i < c->n_top; i++)
                json_array_append_new(
                    a, json_pack("{s:s, s:f}", "token", c->top[i].token ? c->top[i].token : "",
                                 "logprob", isfinite(c->top[i].logprob) ? c->top[i].logprob : -9999.0));
            json_object_set_new(j, "top_logprobs", a);
        }
        json_object_set_new(j, "is_thinking", json_boolean(c->is_thinking));
        break;
    }
    case EXO_CHUNK_TOOL_CALLS: {
        json_t *a = json_array();
        for (int i = 0; i < c->n_tool_calls; i++)
            json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "id", c->tool_calls[i].id,
                                               "name", c->tool_calls[i].name, "arguments",
                                               c->tool_calls[i].arguments));
        json_object_set_new(j, "tool_calls", a);
        break;
    }
    case EXO_CHUNK_PREFILL:
        json_object_set_new(j, "processed", json_integer(c->processed));
        json_object_set_new(j, "total", json_integer(c->total));
        break;
    case EXO_CHUNK_ERROR:
        json_object_set_new(j, "message", json_string(c->error ? c->error : ""));
        json_object_set_new(j, "status", json_integer(c->error_status ? c->error_status : 500));
        break;
    case EXO_CHUNK_FINISH:
        json_object_set_new(j, "reason", json_string(exo_finish_reason_name(c->reason)));
        json_object_set_new(j, "usage",
                            json_pack("{s:i, s:i, s:i, s:i}", "prompt_tokens", c->usage.prompt_tokens,
                                      "completion_tokens", c->usage.completion_tokens,
                                      "reasoning_tokens", c->usage.reasoning_tokens,
                                      "cached_tokens", c->usage.cached_tokens));
        json_object_set_new(j, "prompt_tps", json_real(isfinite(c->prompt_tps) ? c->prompt_tps : 0));
        json_object_set_new(j, "generation_tps",
                            json_real(isfinite(c->generation_tps) ? c->generation_tps : 0));
        if (c->stop_sequence)
            json_object_set_new(j, "stop_sequence", json_string(c->stop_sequence));
        if (c->peak_memory_bytes > 0)
            json_object_set_new(j, "peak_memory", json_integer(c->peak_memory_bytes));
        break;
    }
    return j;
}

static int get_count(const json_t *j, const char *key, int *out, exo_err *err)
{
    int64_t v = 0;
    bool present = false;
    int rc = exo_ju_int(j, key, &v, &present, err);
    if (rc)
        return rc;
    if (!present || v < 0 || v > (1LL << 31) - 1)
        return exo_err_set(err, EXO_ERANGE, "chunk: '%s' missing or out of range", key);
    *out = (int)v;
    return 0;
}

static int get_string_dup(const json_t *j, const char *key, char **out, exo_err *err)
{
    const char *s = NULL;
    int rc = exo_ju_str(j, key, &s, true, err);
    if (rc)
        return rc;
    *out = exo_strdup(s);
    return 0;
}

int exo_chunk_from_json(const json_t *j, exo_chunk *out, exo_err *err)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    const char *type = NULL;
    if (!json_is_object(j))
        return exo_err_set(err, EXO_EFORMAT, "chunk: not an object");
    if ((rc = exo_ju_str(j, "type", &type, true, err)))
        return rc;
    if (strcmp(type, "token") == 0) {
        static const char *const k[] = {"type", "text", "token_id", "token_text", "logprob",
                                        "top_logprobs", "is_thinking", NULL};
        TRY(exo_ju_only_keys(j, k, "token chunk", err));
        out->kind = EXO_CHUNK_TOKEN;
        TRY(get_string_dup(j, "text", &out->text, err));
        const char *tt = NULL;
        TRY(exo_ju_str(j, "token_text", &tt, false, err));
        exo_chunk_set_token_text(out, tt);
        int64_t id = -1;
        TRY(exo_ju_int(j, "token_id", &id, NULL, err));
        if (id < -1 || id > INT32_MAX) {
            rc = exo_err_set(err, EXO_ERANGE, "chunk: token_id out of range");
            goto fail;
        }
        out->token_id = (int32_t)id;
        double lp = 0;
        TRY(exo_ju_num(j, "logprob", &lp, &out->has_logprob, err));
        out->logprob = (float)lp;
        json_t *a;
        TRY(exo_ju_array(j, "top_logprobs", &a, false, err));
        if (a) {
            if (json_array_size(a) > EXO_MAX_TOP_LOGPROBS) {
                rc = exo_err_set(err, EXO_ERANGE, "chunk: too many top_logprobs");
                goto fail;
            }
            size_t i;
            json_t *e;
            json_array_foreach(a, i, e) {
                static const char *const ek[] = {"token", "logprob", NULL};
                const char *tok = NULL;
                double v = 0;
                bool present = false;
                if (!json_is_object(e)) {
                    rc = exo_err_set(err, EXO_EINVAL, "chunk: top_logprobs entries must be objects");
                    goto fail;
                }
                TRY(exo_ju_only_keys(e, ek, "top_logprobs entry", err));
                TRY(exo_ju_str(e, "token", &tok, true, err));
                TRY(exo_ju_num(e, "logprob", &v, &present, err));
                exo_chunk_set_top(out, (int)i, tok, (float)v);
            }
        }
        TRY(exo_ju_bool(j, "is_thinking", &out->is_thinking, NULL, err));
    } else if (strcmp(type, "tool_calls") == 0) {
        static const char *const k[] = {"type", "tool_calls", NULL};
        TRY(exo_ju_only_keys(j, k, "tool_calls chunk", err));
        out->kind = EXO_CHUNK_TOOL_CALLS;
        json_t *a;
        TRY(exo_ju_array(j, "tool_calls", &a, true, err));
        if (json_array_size(a) > 256) {
            rc = exo_err_set(err, EXO_ERANGE, "chunk: too many tool calls");
            goto fail;
        }
        size_t i;
        json_t *e;
        json_array_foreach(a, i, e) {
            static const char *const ek[] = {"id", "name", "arguments", NULL};
            const char *id = NULL, *name = NULL, *args = NULL;
            if (!json_is_object(e)) {
                rc = exo_err_set(err, EXO_EINVAL, "chunk: tool call must be an object");
                goto fail;
            }
            TRY(exo_ju_only_keys(e, ek, "tool call", err));
            TRY(exo_ju_str(e, "id", &id, true, err));
            TRY(exo_ju_str(e, "name", &name, true, err));
            TRY(exo_ju_str(e, "arguments", &args, true, err));
            exo_chunk_add_tool_call(out, id, name, args);
        }
    } else if (strcmp(type, "prefill") == 0) {
        static const char *const k[] = {"type", "processed", "total", NULL};
        TRY(exo_ju_only_keys(j, k, "prefill chunk", err));
        out->kind = EXO_CHUNK_PREFILL;
        TRY(get_count(j, "processed", &out->processed, err));
        TRY(get_count(j, "total", &out->total, err));
    } else if (strcmp(type, "error") == 0) {
        static const char *const k[] = {"type", "message", "status", NULL};
        TRY(exo_ju_only_keys(j, k, "error chunk", err));
        out->kind = EXO_CHUNK_ERROR;
        out->reason = EXO_FR_ERROR;
        TRY(get_string_dup(j, "message", &out->error, err));
        int64_t status = 500;
        TRY(exo_ju_int(j, "status", &status, NULL, err));
        if (status < 400 || status > 599) {
            rc = exo_err_set(err, EXO_ERANGE, "chunk: error status %lld is not 400-599",
                             (long long)status);
            goto fail;
        }
        out->error_status = (int)status;
    } else if (strcmp(type, "finish") == 0) {
        static const char *const k[] = {"type", "reason", "usage", "prompt_tps", "generation_tps",
                                        "stop_sequence", "peak_memory", NULL};
        static const char *const uk[] = {"prompt_tokens", "completion_tokens", "reasoning_tokens",
                                         "cached_tokens", NULL};
        TRY(exo_ju_only_keys(j, k, "finish chunk", err));
        out->kind = EXO_CHUNK_FINISH;
        const char *reason = NULL;
        TRY(exo_ju_str(j, "reason", &reason, true, err));
        if (exo_finish_reason_parse(reason, &out->reason) || out->reason == EXO_FR_NONE) {
            rc = exo_err_set(err, EXO_EINVAL, "chunk: bad finish reason");
            goto fail;
        }
        json_t *u;
        TRY(exo_ju_object(j, "usage", &u, true, err));
        TRY(exo_ju_only_keys(u, uk, "usage", err));
        TRY(get_count(u, "prompt_tokens", &out->usage.prompt_tokens, err));
        TRY(get_count(u, "completion_tokens", &out->usage.completion_tokens, err));
        TRY(get_count(u, "reasoning_tokens", &out->usage.reasoning_tokens, err));
        TRY(get_count(u, "cached_tokens", &out->usage.cached_tokens, err));
        TRY(exo_ju_num(j, "prompt_tps", &out->prompt_tps, NULL, err));
        TRY(exo_ju_num(j, "generation_tps", &out->generation_tps, NULL, err));
        json_t *peak = json_object_get(j, "peak_memory");
        if (peak && (!json_is_integer(peak) || json_integer_value(peak) < 0)) {
            rc = exo_err_set(err, EXO_EINVAL, "chunk: peak_memory must be a non-negative integer");
            goto fail;
        }
        out->peak_memory_bytes = peak ? json_integer_value(peak) : 0;
        const char *stop = NULL;
        TRY(exo_ju_str(j, "stop_sequence", &stop, false, err));
        if (stop)
            out->stop_sequence = exo_strdup(stop);
    } else {
        return exo_err_set(err, EXO_EINVAL, "chunk: unknown type '%.32s'", type);
    }
    return 0;
fail:
    exo_chunk_free(out);
    return rc;
}

void exo_gen_random_id(char *out, size_t cap, const char *prefix)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[12];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        /* No entropy source: a counter mixed with the clock still gives unique ids. */
        static _Atomic unsigned long long ctr;
        unsigned long long v = ++ctr ^ (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < sizeof raw; i++)
            raw[i] = (unsigned char)(v >> (8 * (i % 8))) ^ (unsigned char)i;
    }
    if (!cap)
        return;
    int w = snprintf(out, cap, "%s", prefix ? prefix : "");
    size_t p = w < 0 ? 0 : (size_t)w;
    if (p >= cap)
        return;
    for (size_t i = 0; i < sizeof raw && p + 2 < cap; i++) {
        out[p++] = hex[raw[i] >> 4];
        out[p++] = hex[raw[i] & 15];
    }
    if (p < cap)
        out[p] = 0;
}
