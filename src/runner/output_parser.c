/* Incremental model-output parser (see output_parser.h for the pipeline and
 * the decisions). Each stage owns a hold buffer: the text it has received but
 * cannot yet classify because it may be the beginning of a marker. A stage
 * processes its buffer left to right, hands classified text to the next
 * stage, and keeps only the longest suffix that is a proper prefix of one of
 * its markers, so nothing is delayed longer than a marker could need. */
#include "runner/output_parser.h"

#include "core/json_util.h"
#include "core/sbuf.h"
#include "core/alloc.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TOOL_BUF_MAX (1u << 20) /* a tool call longer than 1 MiB is left as text */

/* Tool-call markers per family. */
#define HERMES_START "<tool_call>"
#define HERMES_END   "</tool_call>"
#define PY_TAG       "<|python_tag|>"
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END   "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN  "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END    "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP         "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define KIMI_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define KIMI_SECTION_END   "<|tool_calls_section_end|>"
#define KIMI_CALL_BEGIN    "<|tool_call_begin|>"
#define KIMI_ARG_BEGIN     "<|tool_call_argument_begin|>"
#define KIMI_CALL_END      "<|tool_call_end|>"

enum { T_OUT, T_IN, T_L3_START, T_L3_TEXT, T_L3_CAPTURE };
enum { H_HEADER, H_CONTENT };
enum { HC_TEXT, HC_THINK, HC_CALL };

struct exo_output_parser {
    exo_tool_format fmt;
    char  *think_start, *think_end;
    char **stop;
    int    n_stop;
    json_t *tools;
    bool   raw;

    exo_sbuf stop_buf;
    bool     stopped;
    int      stop_hit; /* index of the matched stop sequence */

    exo_sbuf think_buf;
    bool     in_think;

    int      tstate;
    int      tblock; /* T_IN: which of the format's block markups is open */
    exo_sbuf tool_buf;

    int      hstate, hkind;
    exo_sbuf hbuf;
    char    *hname; /* function name of the harmony call being read */

    /* emission */
    const exo_chunk *cur;
    bool         meta_used, thought_this_feed;
    exo_chunk_fn emit;
    void        *ctx;
    int          reasoning_tokens, calls;
};

/* ---- helpers ------------------------------------------------------------ */

static const char *find(const char *s, size_t n, const char *m)
{
    return memmem(s, n, m, strlen(m));
}

/* Longest suffix of s[0..n) that is a proper prefix of m. */
static size_t partial(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    size_t k = n < ml - 1 ? n : ml - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, m, k) == 0)
            return k;
    return 0;
}

static void consume(exo_sbuf *b, size_t n)
{
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

static void deliver(exo_output_parser *p, const char *s, size_t n, bool thinking)
{
    if (!n)
        return;
    exo_chunk c;
    exo_chunk_token(&c, s, n, -1, thinking);
    if (p->cur && !p->meta_used) {
        c.token_id = p->cur->token_id;
        c.has_logprob = p->cur->has_logprob;
        c.logprob = p->cur->logprob;
        exo_chunk_set_token_text(&c, p->cur->token_text);
        for (int i = 0; i < p->cur->n_top; i++)
            exo_chunk_set_top(&c, i, p->cur->top[i].token, p->cur->top[i].logprob);
        p->meta_used = true;
    }
    if (thinking)
        p->thought_this_feed = true;
    p->emit(p->ctx, &c);
    exo_chunk_free(&c);
}

static void deliver_meta_only(exo_output_parser *p, bool thinking)
{
    exo_chunk c;
    exo_chunk_token(&c, "", 0, p->cur->token_id, thinking);
    c.has_logprob = true;
    c.logprob = p->cur->logprob;
    exo_chunk_set_token_text(&c, p->cur->token_text);
    for (int i = 0; i < p->cur->n_top; i++)
        exo_chunk_set_top(&c, i, p->cur->top[i].token, p->cur->top[i].logprob);
    p->meta_used = true;
    p->emit(p->ctx, &c);
    exo_chunk_free(&c);
}

/* ---- tool-call validation ------------------------------------------------ */

static const json_t *find_tool(const json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f)
            f = t; /* flat {name, parameters} */
        json_t *n = json_object_get(f, "name");
        if (json_is_string(n) && strcmp(json_string_value(n), name) == 0)
            return f;
    }
    return NULL;
}

/* The declared type names of property `key` of tool `name` (a "type"
 * string or list): how many, at most `max`, into types[]. */
static size_t prop_types(const json_t *tools, const char *name, const char *key, const char **types,
                         size_t max)
{
    const json_t *f = json_is_array(tools) ? find_tool(tools, name) : NULL;
    json_t *props = f ? json_object_get(json_object_get(f, "parameters"), "properties") : NULL;
    json_t *prop = json_object_get(props, key);
    json_t *type = json_object_get(prop, "type");
    size_t nt = 0;
    if (json_is_string(type) && max)
        types[nt++] = json_string_value(type);
    else if (json_is_array(type))
        for (size_t i = 0; i < json_array_size(type) && nt < max; i++)
            if (json_is_string(json_array_get(type, i)))
                types[nt++] = json_string_value(json_array_get(type, i));
    return nt;
}

static bool type_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) {
        double r = json_is_real(v) ? json_real_value(v) : 0.5;
        return json_is_integer(v) || (r >= -9.2e18 && r <= 9.2e18 && r == (double)(long long)r);
    }
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return true; /* unknown type names are not ours to reject */
}

/* A value of type t from the string s, or NULL. Scalars may carry
 * surrounding whitespace (the XML formats put values on their own lines). */
static json_t *coerce(const char *s, const char *t)
{
    if (!strcmp(t, "object") || !strcmp(t, "array")) {
        json_t *v = json_loads(s, 0, NULL);
        if (v && type_is(v, t))
            return v;
        json_decref(v);
        return NULL;
    }
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    if (n == 0 || n > 64)
        return NULL;
    char buf[65], *end;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        errno = 0;
        long long iv = strtoll(buf, &end, 10);
        if (!*end && !errno)
            return json_integer(iv); /* "3" is 3 for a number too, as the model wrote it */
        errno = 0;
        double v = strtod(buf, &end);
        if (*end || errno || v != v || v - v != 0)
            return NULL;
        if (!strcmp(t, "number"))
            return json_real(v);
        if (v >= -9.2e18 && v <= 9.2e18 && v == (double)(long long)v)
            return json_integer((long long)v); /* "3.0" for an integer */
    } else if (!strcmp(t, "boolean")) {
        if (!strcasecmp(buf, "true")) return json_true();
        if (!strcasecmp(buf, "false")) return json_false();
    } else if (!strcmp(t, "null")) {
        if (!strcasecmp(buf, "null")) return json_null();
    }
    return NULL;
}

int exo_tool_args_check(const json_t *tools, const char *name, json_t *args, exo_err *err)
{
    const json_t *f = json_is_array(tools) ? find_tool(tools, name) : NULL;
    if (!f)
        return exo_err_set(err, EXO_ENOENT, "unknown tool '%.64s'", name);
    if (!json_is_object(args))
        return exo_err_set(err, EXO_EINVAL, "%.64s: arguments must be an object", name);
    json_t *schema = json_object_get(f, "parameters");
    if (!json_is_object(schema))
        return 0;
    for (void *it = json_object_iter(args); it; it = json_object_iter_next(args, it)) {
        const char *key = json_object_iter_key(it);
        json_t *val = json_object_iter_value(it);
        const char *types[8];
        size_t nt = prop_types(tools, name, key, types, 8);
        if (!nt)
            continue;
        bool ok = false;
        for (size_t i = 0; i < nt && !ok; i++)
            ok = type_is(val, types[i]);
        for (size_t i = 0; i < nt && !ok && json_is_string(val); i++) {
            json_t *c = coerce(json_string_value(val), types[i]);
            if (c) {
                json_object_iter_set_new(args, it, c);
                ok = true;
            }
        }
        if (!ok)
            return exo_err_set(err, EXO_EINVAL, "%.64s: argument '%.64s' must be %s", name, key,
                               types[0]);
    }
    json_t *req = json_object_get(schema, "required");
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r) {
        if (json_is_string(r) && !json_object_get(args, json_string_value(r)))
            return exo_err_set(err, EXO_EINVAL, "%.64s: missing required argument '%.64s'", name,
                               json_string_value(r));
    }
    return 0;
}

/* ---- collecting calls -------------------------------------------------------
 * A block of markup may hold several calls. Each is checked (and coerced) as
 * it is parsed into a batch, and the batch is emitted only when the whole
 * block parsed: a block is either all calls or all text. */

/* Adds {name, args} to the batch if the call is acceptable. Takes `args`
 * (a new reference, or NULL for "did not parse"). */
static bool add_call(exo_output_parser *p, json_t *batch, const char *name, json_t *args)
{
    if (!name || !args || exo_tool_args_check(p->tools, name, args, NULL)) {
        json_decref(args);
        return false;
    }
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(name)); /* a declared name: valid UTF-8 */
    json_object_set_new(e, "args", args);
    json_array_append_new(batch, e);
    return true;
}

/* Same, with the name given as text to trim. */
static bool add_call_n(exo_output_parser *p, json_t *batch, const char *name, size_t n, json_t *args)
{
    while (n && isspace((unsigned char)*name))
        name++, n--;
    while (n && isspace((unsigned char)name[n - 1]))
        n--;
    char *s = n ? exo_strndup(name, n) : NULL;
    bool ok = add_call(p, batch, s, args);
    exo_free(s);
    return ok;
}

/* `args` as a call's arguments: an object, a string holding one, or absent
 * ({}); NULL for anything else. A new reference. */
static json_t *args_value(const json_t *args)
{
    if (json_is_string(args))
        return json_loads(json_string_value(args), 0, NULL);
    if (json_is_object(args))
        return json_deep_copy(args);
    return args ? NULL : json_object();
}

/* {"name": ..., "arguments"|"parameters": {...}} */
static bool add_json_call(exo_output_parser *p, json_t *batch, const json_t *obj)
{
    json_t *name = json_object_get(obj, "name");
    if (!json_is_object(obj) || !json_is_string(name))
        return false;
    json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    return add_call(p, batch, json_string_value(name), args_value(args));
}

static void emit_batch(exo_output_parser *p, const json_t *batch)
{
    size_t i;
    json_t *e;
    json_array_foreach(batch, i, e) {
        char *text = exo_json_dumps(json_object_get(e, "args"), JSON_COMPACT);
        char id[72];
        const char *own = json_string_value(json_object_get(e, "id"));
        if (own) /* the model's own id (Kimi's functions.NAME:IDX): its template writes it back */
            snprintf(id, sizeof id, "%s", own);
        else
            exo_gen_random_id(id, sizeof id, "call_");
        exo_chunk c;
        exo_chunk_tool_calls(&c);
        exo_chunk_add_tool_call(&c, id, json_string_value(json_object_get(e, "name")), text);
        p->emit(p->ctx, &c);
        exo_chunk_free(&c);
        exo_free(text);
        p->calls++;
    }
    p->meta_used = true;
}

/* One call: validates name + arguments (an object or a string holding one;
 * not consumed) and emits it; false if it is not acceptable. */
static bool emit_call(exo_output_parser *p, const char *name, const json_t *args)
{
    json_t *batch = json_array();
    bool ok = add_call(p, batch, name, args_value(args));
    if (ok)
        emit_batch(p, batch);
    json_decref(batch);
    return ok;
}

/* ---- stage 3: tool-call blocks ----------------------------------------------- */

static bool all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i]))
            return false;
    return true;
}

static const char *skip_space(const char *s, const char *end)
{
    while (s < end && isspace((unsigned char)*s))
        s++;
    return s;
}

/* s starts with marker m (within end)? */
static bool at(const char *s, const char *end, const char *m)
{
    size_t ml = strlen(m);
    return (size_t)(end - s) >= ml && memcmp(s, m, ml) == 0;
}

/* Hermes / Qwen 2.5-3: <tool_call>{"name": ..., "arguments": {...}}</tool_call> */
static bool parse_hermes(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    json_t *j = json_loadb(s, n, 0, NULL);
    bool ok = add_json_call(p, batch, j);
    json_decref(j);
    return ok;
}

/* DeepSeek V3: <call_begin>function<sep>NAME\n```json\nARGS\n```<call_end>
 * DeepSeek V3.1: <call_begin>NAME<sep>ARGS<call_end>. Text between the calls
 * of a block is ignored. */
static bool parse_ds(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    const char *end = s + n, *q = s;
    for (;;) {
        const char *cb = find(q, (size_t)(end - q), DS_CALL_BEGIN);
        if (!cb)
            return true;
        cb += strlen(DS_CALL_BEGIN);
        const char *ce = find(cb, (size_t)(end - cb), DS_CALL_END);
        const char *sep = ce ? find(cb, (size_t)(ce - cb), DS_SEP) : NULL;
        if (!sep)
            return false;
        const char *after = sep + strlen(DS_SEP);
        const char *n0 = cb, *n1 = sep, *a0 = after, *a1 = ce;
        if ((size_t)(sep - cb) == 8 && memcmp(cb, "function", 8) == 0) {
            const char *nl = memchr(after, '\n', (size_t)(ce - after));
            if (!nl)
                return false;
            n0 = after;
            n1 = nl;
            a0 = nl + 1;
            const char *fence = find(a0, (size_t)(a1 - a0), "```json");
            if (fence) {
                a0 = fence + 7;
                const char *close = find(a0, (size_t)(a1 - a0), "```");
                if (close)
                    a1 = close;
            }
        }
        if (!add_call_n(p, batch, n0, (size_t)(n1 - n0), json_loadb(a0, (size_t)(a1 - a0), 0, NULL)))
            return false;
        q = ce + strlen(DS_CALL_END);
    }
}

/* Sets args[key] = the string s[0..n); false if it is not valid UTF-8. */
static bool set_string(json_t *args, const char *key, size_t key_len, json_t *val)
{
    while (key_len && isspace((unsigned char)*key))
        key++, key_len--;
    while (key_len && isspace((unsigned char)key[key_len - 1]))
        key_len--;
    if (!val || !key_len) {
        json_decref(val);
        return false;
    }
    char *k = exo_strndup(key, key_len);
    bool ok = json_object_set_new(args, k, val) == 0; /* fails on invalid UTF-8 keys */
    exo_free(k);
    return ok;
}

/* Qwen3-Coder / Qwen3.5: the text after "<function=" up to "</function>":
 *   NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
 * A value is the text between the tags less one leading and one trailing
 * newline, as vLLM's qwen3_coder parser reads it; it stays a string, and
 * the schema check turns it into the declared type ("3" -> 3, "true" ->
 * true, "{...}" -> object, "null" -> null where null is allowed). A value
 * may also end at the next <parameter= or at the end of the function. */
static bool parse_xml_function(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    const char *end = s + n;
    const char *gt = memchr(s, '>', n);
    if (!gt)
        return false;
    json_t *args = json_object();
    const char *q = gt + 1;
    for (;;) {
        const char *pp = find(q, (size_t)(end - q), "<parameter=");
        if (!pp)
            break;
        if (!all_space(q, (size_t)(pp - q)))
            goto fail;
        pp += strlen("<parameter=");
        const char *pgt = memchr(pp, '>', (size_t)(end - pp));
        if (!pgt)
            goto fail;
        const char *v0 = pgt + 1;
        const char *ve = find(v0, (size_t)(end - v0), "</parameter>");
        const char *np = find(v0, (size_t)(end - v0), "<parameter=");
        if (ve && (!np || ve < np)) {
            q = ve + strlen("</parameter>");
        } else {
            ve = np ? np : end;
            q = ve;
        }
        if (v0 < ve && *v0 == '\n')
            v0++;
        if (ve > v0 && ve[-1] == '\n')
            ve--;
        if (!set_string(args, pp, (size_t)(pgt - pp), json_stringn(v0, (size_t)(ve - v0))))
            goto fail;
    }
    if (!all_space(q, (size_t)(end - q)))
        goto fail;
    return add_call_n(p, batch, s, (size_t)(gt - s), args);
fail:
    json_decref(args);
    return false;
}

/* A <tool_call> block of <function=...>...</function> (the last one may
 * lack its </function>); only whitespace around them. */
static bool parse_xml_block(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    const char *end = s + n, *q = s;
    int found = 0;
    for (;;) {
        const char *f = find(q, (size_t)(end - q), "<function=");
        if (!f)
            break;
        if (!all_space(q, (size_t)(f - q)))
            return false;
        f += strlen("<function=");
        const char *fe = find(f, (size_t)(end - f), "</function>");
        q = fe ? fe + strlen("</function>") : end;
        if (!parse_xml_function(p, f, (size_t)((fe ? fe : end) - f), batch))
            return false;
        found++;
    }
    return found > 0 && all_space(q, (size_t)(end - q));
}

/* GLM-4.5/4.6: NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...
 * GLM-4.7: the same without the newlines. As vLLM's glm4_moe parser does, a
 * value whose declared type is not string is read as JSON when it is JSON
 * ("3" -> 3, "[1]" -> [1]); otherwise it stays a string for the schema
 * check to coerce or reject. */
static bool parse_glm(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    const char *end = s + n;
    const char *q = find(s, n, "<arg_key>");
    if (!q)
        q = end;
    const char *name_end = q;
    char *name = NULL;
    {
        const char *a = s, *b = name_end;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (a == b)
            return false;
        name = exo_strndup(a, (size_t)(b - a));
    }
    json_t *args = json_object();
    for (;;) {
        q = skip_space(q, end);
        if (q == end)
            break;
        if (!at(q, end, "<arg_key>"))
            goto fail;
        const char *k0 = q + strlen("<arg_key>");
        const char *k1 = find(k0, (size_t)(end - k0), "</arg_key>");
        if (!k1)
            goto fail;
        q = skip_space(k1 + strlen("</arg_key>"), end);
        if (!at(q, end, "<arg_value>"))
            goto fail;
        const char *v0 = q + strlen("<arg_value>");
        const char *v1 = find(v0, (size_t)(end - v0), "</arg_value>");
        if (!v1)
            goto fail;
        q = v1 + strlen("</arg_value>");
        k0 = skip_space(k0, k1);
        while (k1 > k0 && isspace((unsigned char)k1[-1]))
            k1--;
        char *key = exo_strndup(k0, (size_t)(k1 - k0));
        const char *types[8];
        size_t nt = prop_types(p->tools, name, key, types, 8);
        exo_free(key);
        bool is_string = false;
        for (size_t i = 0; i < nt; i++)
            is_string |= !strcmp(types[i], "string");
        json_t *val = is_string ? NULL : json_loadb(v0, (size_t)(v1 - v0), JSON_DECODE_ANY, NULL);
        if (!val)
            val = json_stringn(v0, (size_t)(v1 - v0));
        if (!set_string(args, k0, (size_t)(k1 - k0), val))
            goto fail;
    }
    bool ok = add_call(p, batch, name, args);
    exo_free(name);
    return ok;
fail:
    exo_free(name);
    json_decref(args);
    return false;
}

/* Kimi K2: <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>...
 * The name is the id less its "functions." prefix and ":IDX" suffix. */
static bool parse_kimi(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    const char *end = s + n, *q = s;
    int found = 0;
    for (;;) {
        q = skip_space(q, end);
        if (q == end)
            return found > 0;
        if (!at(q, end, KIMI_CALL_BEGIN))
            return false;
        const char *id = q + strlen(KIMI_CALL_BEGIN);
        const char *ab = find(id, (size_t)(end - id), KIMI_ARG_BEGIN);
        const char *a0 = ab ? ab + strlen(KIMI_ARG_BEGIN) : NULL;
        const char *ce = a0 ? find(a0, (size_t)(end - a0), KIMI_CALL_END) : NULL;
        if (!ce)
            return false;
        const char *n0 = skip_space(id, ab), *n1 = ab;
        while (n1 > n0 && isspace((unsigned char)n1[-1]))
            n1--;
        const char *id0 = n0, *id1 = n1;
        if (at(n0, n1, "functions."))
            n0 += strlen("functions.");
        const char *colon = n1;
        while (colon > n0 && isdigit((unsigned char)colon[-1]))
            colon--;
        if (colon < n1 && colon > n0 && colon[-1] == ':')
            n1 = colon - 1;
        if (!add_call_n(p, batch, n0, (size_t)(n1 - n0), json_loadb(a0, (size_t)(ce - a0), 0, NULL)))
            return false;
        bool plain = id1 - id0 <= 64; /* keep it as the call's id if it is short printable ASCII */
        for (const char *c = id0; plain && c < id1; c++)
            plain = *c > 32 && *c < 127 && *c != '"' && *c != '\\';
        if (plain)
            json_object_set_new(json_array_get(batch, json_array_size(batch) - 1), "id",
                                json_stringn(id0, (size_t)(id1 - id0)));
        found++;
        q = ce + strlen(KIMI_CALL_END);
    }
}

/* The block markups of a format. An unterminated block is text at the end,
 * except where end_optional says its content may still be complete calls. */
typedef bool (*block_parse_fn)(exo_output_parser *p, const char *s, size_t n, json_t *batch);
typedef struct block_fmt {
    const char    *start, *end;
    block_parse_fn parse;
    bool           end_optional;
} block_fmt;

static const block_fmt blocks_hermes[] = {{HERMES_START, HERMES_END, parse_hermes, false}};
static const block_fmt blocks_ds[] = {{DS_CALLS_BEGIN, DS_CALLS_END, parse_ds, true}};
/* Qwen3-Coder sometimes leaves out the <tool_call> wrapper (vLLM accepts a
 * bare <function=...> too). */
static const block_fmt blocks_qwen_xml[] = {{HERMES_START, HERMES_END, parse_xml_block, false},
                                            {"<function=", "</function>", parse_xml_function, false}};
static const block_fmt blocks_glm[] = {{HERMES_START, HERMES_END, parse_glm, false}};
static const block_fmt blocks_kimi[] = {{KIMI_SECTION_BEGIN, KIMI_SECTION_END, parse_kimi, false}};

static const block_fmt *block_formats(exo_tool_format f, size_t *n)
{
#define BLOCKS(a) (*n = sizeof a / sizeof *a, a)
    switch (f) {
    case EXO_TOOL_FMT_HERMES: return BLOCKS(blocks_hermes);
    case EXO_TOOL_FMT_DEEPSEEK_V3: return BLOCKS(blocks_ds);
    case EXO_TOOL_FMT_QWEN3_XML: return BLOCKS(blocks_qwen_xml);
    case EXO_TOOL_FMT_GLM4: return BLOCKS(blocks_glm);
    case EXO_TOOL_FMT_KIMI_K2: return BLOCKS(blocks_kimi);
    default: *n = 0; return NULL;
    }
#undef BLOCKS
}

/* Text passes through until a start marker; the block up to its end marker
 * is then parsed as a whole. */
static void tools_blocks(exo_output_parser *p, bool final)
{
    exo_sbuf *b = &p->tool_buf;
    size_t nf;
    const block_fmt *fm = block_formats(p->fmt, &nf);
    for (;;) {
        const char *d = b->data ? b->data : "";
        if (p->tstate == T_OUT) {
            const char *best = NULL;
            for (size_t i = 0; i < nf; i++) {
                const char *hit = find(d, b->len, fm[i].start);
                if (hit && (!best || hit < best)) {
                    best = hit;
                    p->tblock = (int)i;
                }
            }
            if (best) {
                deliver(p, d, (size_t)(best - d), false);
                consume(b, (size_t)(best - d) + strlen(fm[p->tblock].start));
                p->tstate = T_IN;
                continue;
            }
            size_t hold = 0;
            for (size_t i = 0; i < nf && !final; i++) {
                size_t h = partial(d, b->len, fm[i].start);
                if (h > hold)
                    hold = h;
            }
            deliver(p, d, b->len - hold, false);
            consume(b, b->len - hold);
            return;
        }
        /* T_IN: the buffer holds the block's text after its start marker. */
        const block_fmt *f = &fm[p->tblock];
        const char *hit = find(d, b->len, f->end);
        if (!hit && !final && b->len < TOOL_BUF_MAX)
            return;
        size_t body = hit ? (size_t)(hit - d) : b->len;
        bool ok = false;
        if (hit || (final && f->end_optional)) {
            json_t *batch = json_array();
            ok = f->parse(p, d, body, batch) && json_array_size(batch) > 0;
            if (ok)
                emit_batch(p, batch);
            json_decref(batch);
        }
        if (!ok) {
            /* Not a usable block: its markup goes out as text, unchanged. */
            exo_sbuf raw;
            exo_sbuf_init(&raw);
            exo_sbuf_puts(&raw, f->start);
            exo_sbuf_append(&raw, d, body);
            if (hit)
                exo_sbuf_puts(&raw, f->end);
            deliver(p, raw.data, raw.len, false);
            exo_sbuf_free(&raw);
        }
        consume(b, hit ? body + strlen(f->end) : body);
        p->tstate = T_OUT;
        if (!hit)
            return;
    }
}

/* Llama 3: the whole answer is one or more JSON calls ("{...}; {...}"),
 * optionally after <|python_tag|>. Decided at the first non-space byte. */
static bool parse_l3_calls(exo_output_parser *p, const char *s, size_t n, json_t *batch)
{
    if (n >= strlen(PY_TAG) && memcmp(s, PY_TAG, strlen(PY_TAG)) == 0)
        s += strlen(PY_TAG), n -= strlen(PY_TAG);
    size_t pos = 0;
    for (;;) {
        while (pos < n && (isspace((unsigned char)s[pos]) || s[pos] == ';'))
            pos++;
        if (pos == n)
            return json_array_size(batch) > 0;
        json_error_t je;
        json_t *j = json_loadb(s + pos, n - pos, JSON_DISABLE_EOF_CHECK, &je);
        bool ok = add_json_call(p, batch, j);
        json_decref(j);
        if (!ok)
            return false;
        pos += (size_t)je.position;
    }
}

static void tools_llama3(exo_output_parser *p, bool final)
{
    exo_sbuf *b = &p->tool_buf;
    const char *d = b->data ? b->data : "";
    if (p->tstate == T_L3_START) {
        size_t i = 0;
        while (i < b->len && isspace((unsigned char)d[i]))
            i++;
        if (i < b->len) {
            size_t rest = b->len - i;
            size_t pl = strlen(PY_TAG);
            if (d[i] == '{' || (rest >= pl && memcmp(d + i, PY_TAG, pl) == 0))
                p->tstate = T_L3_CAPTURE;
            else if (rest < pl && memcmp(d + i, PY_TAG, rest) == 0 && !final)
                return; /* maybe the python tag */
            else
                p->tstate = T_L3_TEXT;
        } else if (!final) {
            return;
        }
    }
    if (p->tstate == T_L3_CAPTURE) {
        if (!final && b->len < TOOL_BUF_MAX)
            return;
        size_t i = 0;
        while (i < b->len && isspace((unsigned char)d[i]))
            i++;
        json_t *batch = json_array();
        if (parse_l3_calls(p, d + i, b->len - i, batch))
            emit_batch(p, batch);
        else
            deliver(p, d, b->len, false);
        json_decref(batch);
        consume(b, b->len);
        p->tstate = T_L3_TEXT;
        return;
    }
    /* T_L3_TEXT (or T_L3_START at final): a python tag later in the text starts a call. */
    const char *hit = find(d, b->len, PY_TAG);
    if (hit) {
        deliver(p, d, (size_t)(hit - d), false);
        consume(b, (size_t)(hit - d));
        p->tstate = T_L3_CAPTURE;
        tools_llama3(p, final);
        return;
    }
    size_t hold = final ? 0 : partial(d, b->len, PY_TAG);
    deliver(p, d, b->len - hold, false);
    consume(b, b->len - hold);
}

static void stage_tools(exo_output_parser *p, const char *s, size_t n, bool final)
{
    bool parse = !p->raw && p->fmt != EXO_TOOL_FMT_NONE && json_array_size(p->tools) > 0;
    if (!parse) {
        deliver(p, s, n, false);
        return;
    }
    exo_sbuf_append(&p->tool_buf, s, n);
    if (p->fmt == EXO_TOOL_FMT_LLAMA3)
        tools_llama3(p, final);
    else
        tools_blocks(p, final);
}

/* ---- stage 2: reasoning ------------------------------------------------------ */

static void stage_think(exo_output_parser *p, const char *s, size_t n, bool final)
{
    if (p->raw || !p->think_start) {
        stage_tools(p, s, n, final);
        return;
    }
    exo_sbuf *b = &p->think_buf;
    exo_sbuf_append(b, s, n);
    for (;;) {
        const char *d = b->data;
        const char *m = p->in_think ? p->think_end : p->think_start;
        const char *hit = find(d, b->len, m);
        if (hit) {
            size_t k = (size_t)(hit - d);
            if (p->in_think)
                deliver(p, d, k, true);
            else
                stage_tools(p, d, k, false);
            consume(b, k + strlen(m));
            p->in_think = !p->in_think;
            if (p->in_think)
                p->thought_this_feed = true;
            continue;
        }
        size_t hold = final ? 0 : partial(d, b->len, m);
        if (p->in_think)
            deliver(p, d, b->len - hold, true);
        else
            stage_tools(p, d, b->len - hold, false);
        consume(b, b->len - hold);
        break;
    }
    if (final)
        stage_tools(p, "", 0, true);
}

/* ---- GPT-OSS harmony ------------------------------------------------------------ */

static const char *const harmony_ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>",
                                           "<|channel|>"};

static void harmony_header(exo_output_parser *p, const char *h, size_t n)
{
    char buf[512];
    size_t l = n < sizeof buf - 1 ? n : sizeof buf - 1;
    memcpy(buf, h, l);
    buf[l] = 0;
    char channel[64] = "", recipient[256] = "";
    const char *c = strstr(buf, "<|channel|>");
    if (c) {
        c += strlen("<|channel|>");
        size_t k = 0;
        while (c[k] && !isspace((unsigned char)c[k]) && c[k] != '<' && k < sizeof channel - 1)
            k++;
        memcpy(channel, c, k);
        channel[k] = 0;
    }
    const char *t = strstr(buf, "to=");
    if (t) {
        t += 3;
        size_t k = 0;
        while (t[k] && !isspace((unsigned char)t[k]) && t[k] != '<' && k < sizeof recipient - 1)
            k++;
        memcpy(recipient, t, k);
        recipient[k] = 0;
    }
    exo_free(p->hname);
    p->hname = NULL;
    if (strncmp(recipient, "functions.", 10) == 0 && recipient[10]) {
        p->hkind = HC_CALL;
        p->hname = exo_strdup(recipient + 10);
    } else if (strcmp(channel, "analysis") == 0) {
        p->hkind = HC_THINK;
    } else {
        p->hkind = HC_TEXT;
    }
}

static void harmony_end_call(exo_output_parser *p, const char *args, size_t n, bool complete)
{
    json_t *j = json_loadb(args, n, 0, NULL);
    bool ok = complete && j && p->tools && emit_call(p, p->hname, j);
    json_decref(j);
    if (!ok) {
        /* Not a usable call: its arguments become text. */
        deliver(p, args, n, false);
    }
}

static void stage_harmony(exo_output_parser *p, const char *s, size_t n, bool final)
{
    exo_sbuf *b = &p->hbuf;
    exo_sbuf_append(b, s, n);
    for (;;) {
        const char *d = b->data;
        if (p->hstate == H_HEADER) {
            const char *hit = find(d, b->len, "<|message|>");
            if (hit) {
                harmony_header(p, d, (size_t)(hit - d));
                consume(b, (size_t)(hit - d) + strlen("<|message|>"));
                p->hstate = H_CONTENT;
                continue;
            }
            if (final || b->len > 4096) {
                /* Text outside any message: keep it unless it is only markup. */
                if (!find(d, b->len, "<|"))
                    deliver(p, d, b->len, false);
                consume(b, b->len);
            }
            return;
        }
        /* H_CONTENT */
        const char *best = NULL;
        size_t best_len = 0;
        for (size_t i = 0; i < sizeof harmony_ends / sizeof *harmony_ends; i++) {
            const char *hit = find(d, b->len, harmony_ends[i]);
            if (hit && (!best || hit < best))
                best = hit, best_len = strlen(harmony_ends[i]);
        }
        if (best) {
            size_t k = (size_t)(best - d);
            bool is_header_marker = best[2] == 's' || (best[2] == 'c' && best[3] == 'h');
            if (p->hkind == HC_CALL)
                harmony_end_call(p, d, k, true);
            else
                deliver(p, d, k, p->hkind == HC_THINK);
            /* <|start|> / <|channel|> begin the next header: keep them in it. */
            consume(b, is_header_marker ? k : k + best_len);
            p->hstate = H_HEADER;
            continue;
        }
        if (p->hkind == HC_CALL) {
            if (final || b->len > TOOL_BUF_MAX) {
                /* The engine does not feed end-of-sequence tokens (<|call|>),
                 * so at the end the arguments decide: complete JSON is a call. */
                harmony_end_call(p, d, b->len, final);
                consume(b, b->len);
            }
            return;
        }
        size_t hold = 0;
        if (!final)
            for (size_t i = 0; i < sizeof harmony_ends / sizeof *harmony_ends; i++) {
                size_t h = partial(d, b->len, harmony_ends[i]);
                if (h > hold)
                    hold = h;
            }
        deliver(p, d, b->len - hold, p->hkind == HC_THINK);
        consume(b, b->len - hold);
        return;
    }
}

/* ---- stage 1: stop sequences ---------------------------------------------------- */

static void stage_next(exo_output_parser *p, const char *s, size_t n, bool final)
{
    if (!p->raw && p->fmt == EXO_TOOL_FMT_HARMONY)
        stage_harmony(p, s, n, final);
    else
        stage_think(p, s, n, final);
}

static void stage_stop(exo_output_parser *p, const char *s, size_t n)
{
    exo_sbuf *b = &p->stop_buf;
    if (!p->n_stop) {
        stage_next(p, s, n, false);
        return;
    }
    exo_sbuf_append(b, s, n);
    const char *first = NULL;
    for (int i = 0; i < p->n_stop; i++) {
        const char *hit = find(b->data, b->len, p->stop[i]);
        if (hit && (!first || hit < first)) {
            first = hit;
            p->stop_hit = i;
        }
    }
    if (first) {
        stage_next(p, b->data, (size_t)(first - b->data), false);
        exo_sbuf_clear(b);
        p->stopped = true;
        return;
    }
    size_t hold = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t h = partial(b->data, b->len, p->stop[i]);
        if (h > hold)
            hold = h;
    }
    stage_next(p, b->data, b->len - hold, false);
    consume(b, b->len - hold);
}

/* ---- public ----------------------------------------------------------------------- */

exo_output_parser *exo_output_parser_create(const exo_output_parser_config *cfg)
{
    exo_output_parser *p = exo_calloc(1, sizeof *p);
    p->fmt = cfg->tool_format;
    p->raw = cfg->raw;
    if (cfg->think_start && cfg->think_end && *cfg->think_start && *cfg->think_end) {
        p->think_start = exo_strdup(cfg->think_start);
        p->think_end = exo_strdup(cfg->think_end);
        p->in_think = cfg->starts_in_thinking;
    }
    for (int i = 0; i < cfg->n_stop; i++) {
        if (!cfg->stop[i] || !*cfg->stop[i])
            continue;
        p->stop = exo_realloc(p->stop, sizeof *p->stop * (size_t)(p->n_stop + 1));
        p->stop[p->n_stop++] = exo_strdup(cfg->stop[i]);
    }
    p->tools = cfg->tools ? json_incref((json_t *)cfg->tools) : NULL;
    p->tstate = p->fmt == EXO_TOOL_FMT_LLAMA3 ? T_L3_START : T_OUT;
    p->hstate = H_HEADER;
    exo_sbuf_init(&p->stop_buf);
    exo_sbuf_init(&p->think_buf);
    exo_sbuf_init(&p->tool_buf);
    exo_sbuf_init(&p->hbuf);
    return p;
}

void exo_output_parser_free(exo_output_parser *p)
{
    if (!p)
        return;
    exo_free(p->think_start);
    exo_free(p->think_end);
    for (int i = 0; i < p->n_stop; i++)
        exo_free(p->stop[i]);
    exo_free(p->stop);
    json_decref(p->tools);
    exo_sbuf_free(&p->stop_buf);
    exo_sbuf_free(&p->think_buf);
    exo_sbuf_free(&p->tool_buf);
    exo_sbuf_free(&p->hbuf);
    exo_free(p->hname);
    exo_free(p);
}

bool exo_output_parser_feed(exo_output_parser *p, const exo_chunk *tok, exo_chunk_fn emit,
                            void *ctx)
{
    if (p->stopped)
        return true;
    p->emit = emit;
    p->ctx = ctx;
    p->cur = tok;
    p->meta_used = false;
    p->thought_this_feed = false;
    const char *text = tok->text ? tok->text : "";
    stage_stop(p, text, strlen(text));
    bool in_reasoning = p->fmt == EXO_TOOL_FMT_HARMONY ? (p->hstate == H_CONTENT && p->hkind == HC_THINK)
                                                       : p->in_think;
    if (p->thought_this_feed || (!p->raw && in_reasoning))
        p->reasoning_tokens++;
    if (!p->meta_used && tok->has_logprob && !p->stopped) {
        /* The token's text is held back (an incomplete UTF-8 character, a
         * possible stop sequence or markup): its logprob entry still goes
         * out now, with empty text, so a client gets one entry per token
         * and the entries' texts still add up to the content. */
        deliver_meta_only(p, in_reasoning);
    }
    p->cur = NULL;
    return p->stopped;
}

exo_finish_reason exo_output_parser_finish(exo_output_parser *p, exo_finish_reason reason,
                                           exo_chunk_fn emit, void *ctx)
{
    p->emit = emit;
    p->ctx = ctx;
    p->cur = NULL;
    if (!p->stopped && p->stop_buf.len) {
        stage_next(p, p->stop_buf.data, p->stop_buf.len, false);
        exo_sbuf_clear(&p->stop_buf);
    }
    stage_next(p, "", 0, true);
    if (p->calls && (reason == EXO_FR_STOP || reason == EXO_FR_LENGTH))
        reason = EXO_FR_TOOL_CALLS;
    return reason;
}

int exo_output_parser_reasoning_tokens(const exo_output_parser *p) { return p->reasoning_tokens; }

const char *exo_output_parser_stop_sequence(const exo_output_parser *p)
{
    return p->stopped ? p->stop[p->stop_hit] : NULL;
}

void exo_output_parser_detect(const char *tpl, const char *prompt, exo_output_parser_config *cfg)
{
    cfg->tool_format = EXO_TOOL_FMT_NONE;
    cfg->think_start = cfg->think_end = NULL;
    cfg->starts_in_thinking = false;
    if (tpl) {
        /* Most specific first: the XML formats' templates also name <tool_call>. */
        if (strstr(tpl, "<|channel|>"))
            cfg->tool_format = EXO_TOOL_FMT_HARMONY;
        else if (strstr(tpl, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin"))
            cfg->tool_format = EXO_TOOL_FMT_DEEPSEEK_V3;
        else if (strstr(tpl, KIMI_SECTION_BEGIN))
            cfg->tool_format = EXO_TOOL_FMT_KIMI_K2;
        else if (strstr(tpl, "<function=") && strstr(tpl, "<parameter="))
            cfg->tool_format = EXO_TOOL_FMT_QWEN3_XML;
        else if (strstr(tpl, "<arg_key>"))
            cfg->tool_format = EXO_TOOL_FMT_GLM4;
        else if (strstr(tpl, "<tool_call>"))
            cfg->tool_format = EXO_TOOL_FMT_HERMES;
        else if (strstr(tpl, "<|python_tag|>") || strstr(tpl, "<|eom_id|>") ||
                 strstr(tpl, "\"parameters\": dictionary of argument name"))
            cfg->tool_format = EXO_TOOL_FMT_LLAMA3; /* the last: Llama 3.2's template has no tag */
        if (strstr(tpl, "<think>") || strstr(tpl, "</think>")) {
            cfg->think_start = "<think>";
            cfg->think_end = "</think>";
        }
    }
    if (prompt && cfg->think_start) {
        /* The template opened the block: the output starts inside it. */
        size_t n = strlen(prompt);
        while (n && isspace((unsigned char)prompt[n - 1]))
            n--;
        size_t tl = strlen(cfg->think_start);
        cfg->starts_in_thinking = n >= tl && memcmp(prompt + n - tl, cfg->think_start, tl) == 0;
    }
}
