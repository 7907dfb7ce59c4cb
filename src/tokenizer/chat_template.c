/* Chat template loading and rendering for HF model directories (see
 * chat_template.h). The Jinja work is in jinja_*.c; this file only finds
 * the template text and builds the render context transformers would. */
#include "tokenizer/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/json_util.h"
#include "tokenizer/jinja.h"

struct exo_chat_template {
    exo_jinja_template *main;      /* the string template, or "default" */
    exo_jinja_template *tool_use;  /* list form: "tool_use", may be NULL */
    char *special[4];              /* bos, eos, unk, pad (NULL if unset) */
    int64_t now;
    /* Earlier tool calls' arguments as a JSON string rather than an object:
     * most templates iterate or tojson the object (Qwen3.5, GLM), some
     * concatenate a string (DeepSeek-V3.1). Found by rendering a sample
     * call both ways at load (probe_arguments). */
    bool args_as_string;
};

static const char *const special_names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};

static void probe_arguments(exo_chat_template *t);

int exo_chat_template_parse_now(const char *s, int64_t *epoch)
{
    if (!s || !*s)
        return EXO_EINVAL;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*end) {
        *epoch = v;
        return 0;
    }
    struct tm tm = {0};
    int y, mo, d, h = 0, mi = 0, sec = 0;
    int n = sscanf(s, "%d-%d-%d%*[T ]%d:%d:%d", &y, &mo, &d, &h, &mi, &sec);
    if (n < 3)
        return EXO_EINVAL;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    *epoch = (int64_t)timegm(&tm);
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *p = exo_malloc(cap);
    for (;;) {
        if (n + 4096 > cap) {
            cap *= 2;
            p = exo_realloc(p, cap);
        }
        size_t k = fread(p + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    fclose(f);
    p[n] = 0;
    *len = n;
    return p;
}

static char *token_string(const json_t *v)
{
    if (json_is_string(v))
        return exo_strdup(json_string_value(v));
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return exo_strdup(json_string_value(json_object_get(v, "content")));
    return NULL;
}

static void init_now(exo_chat_template *t)
{
    t->now = -1;
    int64_t e;
    if (!exo_chat_template_parse_now(getenv(EXO_CHAT_TEMPLATE_NOW_ENV), &e))
        t->now = e;
}

int exo_chat_template_from_string(const char *source, const char *bos_token, const char *eos_token,
                                  exo_chat_template **out, exo_err *err)
{
    exo_chat_template *t = exo_calloc(1, sizeof *t);
    init_now(t);
    int rc = exo_jinja_parse(source, strlen(source), &t->main, err);
    if (rc) {
        exo_free(t);
        return rc;
    }
    t->special[0] = bos_token ? exo_strdup(bos_token) : NULL;
    t->special[1] = eos_token ? exo_strdup(eos_token) : NULL;
    probe_arguments(t);
    *out = t;
    return 0;
}

int exo_chat_template_load(const char *model_dir, exo_chat_template **out, exo_err *err)
{
    char path[4096];
    exo_chat_template *t = exo_calloc(1, sizeof *t);
    init_now(t);
    int rc = 0;
    json_t *cfg = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        json_error_t je;
        /* INT_AS_REAL: configs carry model_max_length = 1e30 as an integer */
        cfg = json_load_file(path, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg || !json_is_object(cfg)) {
            rc = exo_err_set(err, EXO_EFORMAT, "%s:%d: %s", path, je.line, cfg ? "not an object" : je.text);
            goto fail;
        }
        for (int i = 0; i < 4; i++)
            t->special[i] = token_string(json_object_get(cfg, special_names[i]));
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir);
    size_t len;
    char *src = read_file(path, &len);
    if (src) {
        rc = exo_jinja_parse(src, len, &t->main, err);
        exo_free(src);
        if (rc) {
            exo_err_wrap(err, "%s", path);
            goto fail;
        }
    } else {
        json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
        if (json_is_string(ct)) {
            rc = exo_jinja_parse(json_string_value(ct), json_string_length(ct), &t->main, err);
        } else if (json_is_array(ct)) {
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) {
                const char *name = json_string_value(json_object_get(e, "name"));
                json_t *src_j = json_object_get(e, "template");
                if (!name || !json_is_string(src_j))
                    continue;
                exo_jinja_template **slot = !strcmp(name, "default") ? &t->main
                                          : !strcmp(name, "tool_use") ? &t->tool_use : NULL;
                if (!slot || *slot)
                    continue;
                rc = exo_jinja_parse(json_string_value(src_j), json_string_length(src_j), slot, err);
                if (rc)
                    break;
            }
            if (!rc && !t->main && !t->tool_use)
                rc = exo_err_set(err, EXO_ENOENT, "%s: chat_template list has no 'default' template", model_dir);
        } else {
            rc = exo_err_set(err, EXO_ENOENT, "%s: no chat template (chat_template.jinja or tokenizer_config.json)",
                             model_dir);
        }
        if (rc) {
            if (rc != EXO_ENOENT)
                exo_err_wrap(err, "%s/tokenizer_config.json", model_dir);
            goto fail;
        }
    }
    json_decref(cfg);
    probe_arguments(t);
    *out = t;
    return 0;
fail:
    json_decref(cfg);
    exo_chat_template_free(t);
    return rc;
}

/* messages with every assistant tool call's arguments object turned into
 * its JSON text (a new reference). */
static json_t *args_to_strings(const json_t *messages)
{
    json_t *m = json_deep_copy(messages);
    size_t i, k;
    json_t *msg, *call;
    json_array_foreach(m, i, msg) {
        json_array_foreach(json_object_get(msg, "tool_calls"), k, call) {
            json_t *f = json_object_get(call, "function");
            json_t *a = json_object_get(f, "arguments");
            if (!json_is_object(a) && !json_is_array(a))
                continue;
            char *text = exo_json_dumps(a, JSON_COMPACT);
            if (text)
                json_object_set_new(f, "arguments", json_string(text));
            exo_free(text);
        }
    }
    return m;
}

static int render(const exo_chat_template *t, const json_t *messages, const json_t *tools,
                  bool add_generation_prompt, const json_t *extra_kwargs, bool args_as_string, char **out,
                  exo_err *err);

/* Which form of earlier calls' arguments the template takes: the object,
 * unless a sample conversation with one call fails to render with it, or
 * renders it as Python prints a dict ({'a': 'b'}: the template writes the
 * arguments out as they come, e.g. Kimi K2's), and renders with the JSON
 * string instead. */
static void probe_arguments(exo_chat_template *t)
{
    static const char sample[] =
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":{\"a\":\"b\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_0\",\"content\":\"r\"}]";
    static const char tools_json[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}]";
    json_t *msgs = json_loads(sample, 0, NULL), *tools = json_loads(tools_json, 0, NULL);
    char *out = NULL;
    exo_err err = {0};
    if (msgs && tools && (render(t, msgs, tools, true, NULL, false, &out, &err) || strstr(out, "{'a': 'b'}"))) {
        exo_free(out);
        out = NULL;
        t->args_as_string = render(t, msgs, tools, true, NULL, true, &out, &err) == 0;
    }
    exo_free(out);
    json_decref(msgs);
    json_decref(tools);
}

int exo_chat_template_render(const exo_chat_template *t, const json_t *messages, const json_t *tools,
                             bool add_generation_prompt, const json_t *extra_kwargs, char **out,
                             exo_err *err)
{
    return render(t, messages, tools, add_generation_prompt, extra_kwargs, t->args_as_string, out, err);
}

static int render(const exo_chat_template *t, const json_t *messages, const json_t *tools,
                  bool add_generation_prompt, const json_t *extra_kwargs, bool args_as_string, char **out,
                  exo_err *err)
{
    const exo_jinja_template *tpl = t->main;
    if (tools && !json_is_null(tools) && t->tool_use)
        tpl = t->tool_use;
    if (!tpl)
        tpl = t->tool_use;
    if (!tpl)
        return exo_err_set(err, EXO_ENOENT, "no chat template");
    json_t *ctx = json_object();
    json_object_set_new(ctx, "messages", !messages       ? json_array()
                                         : args_as_string ? args_to_strings(messages)
                                                          : json_incref((json_t *)messages));
    json_object_set_new(ctx, "tools", tools ? json_incref((json_t *)tools) : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    for (int i = 0; i < 4; i++)
        if (t->special[i])
            json_object_set_new(ctx, special_names[i], json_string(t->special[i]));
    if (extra_kwargs && json_is_object(extra_kwargs))
        json_object_update(ctx, (json_t *)extra_kwargs);
    exo_jinja_opts opts = {.now = t->now};
    int rc = exo_jinja_render(tpl, ctx, &opts, out, NULL, err);
    json_decref(ctx);
    return rc;
}

void exo_chat_template_set_now(exo_chat_template *t, int64_t epoch) { t->now = epoch < 0 ? -1 : epoch; }
void exo_chat_template_keep_arguments(exo_chat_template *t) { t->args_as_string = false; }
const char *exo_chat_template_bos(const exo_chat_template *t) { return t->special[0]; }
const char *exo_chat_template_eos(const exo_chat_template *t) { return t->special[1]; }

void exo_chat_template_free(exo_chat_template *t)
{
    if (!t)
        return;
    exo_jinja_free(t->main);
    exo_jinja_free(t->tool_use);
    for (int i = 0; i < 4; i++)
        exo_free(t->special[i]);
    exo_free(t);
}
