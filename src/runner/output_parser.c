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

static bool type_is(const json_t *v, const char *t)
{
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    return true; /* unknown type names are not ours to reject */
}

/* A value of type t from the string s, or NULL. */
static json_t *coerce(const char *s, const char *t)
{
    char *end;
    if (!strcmp(t, "integer")) {
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (*s && !*end && !errno)
            return json_integer(v);
    } else if (!strcmp(t, "number")) {
        errno = 0;
        double v = strtod(s, &end);
        if (*s && !*end && !errno && v == v)
            return json_real(v);
    } else if (!strcmp(t, "boolean")) {
        if (!strcasecmp(s, "true")) return json_true();
        if (!strcasecmp(s, "false")) return json_false();
    } else if (!strcmp(t, "object") || !strcmp(t, "array")) {
        json_t *v = json_loads(s, 0, NULL);
        if (v && type_is(v, t))
            return v;
        json_decref(v);
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
    json_t *props = json_object_get(schema, "properties");
    if (json_is_object(props)) {
        for (void *it = json_object_iter(args); it; it = json_object_iter_next(args, it)) {
            const char *key = json_object_iter_key(it);
            json_t *val = json_object_iter_value(it);
            json_t *prop = json_object_get(props, key);
            json_t *type = prop ? json_object_get(prop, "type") : NULL;
            const char *types[8];
            size_t nt = 0;
            if (json_is_string(type))
                types[nt++] = json_string_value(type);
            else if (json_is_array(type))
                for (size_t i = 0; i < json_array_size(type) && nt < 8; i++)
                    if (json_is_string(json_array_get(type, i)))
                        types[nt++] = json_string_value(json_array_get(type, i));
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
                return exo_err_set(err, EXO_EINVAL, "%.64s: argument '%.64s' must be %s", name,
                                   key, types[0]);
        }
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

/* Validates name + arguments and emits one TOOL_CALLS chunk; false if the
 * call is not acceptable (the caller then emits its text). `args` may be a
 * JSON object or a string holding one; it is not consumed. */
static bool emit_call(exo_output_parser *p, const char *name, const json_t *args_in)
{
    json_t *args = NULL;
    if (json_is_string(args_in))
        args = json_loads(json_string_value(args_in), 0, NULL);
    else if (json_is_object(args_in))
        args = json_deep_copy(args_in);
    else if (!args_in)
        args = json_object();
    if (!name || !args || exo_tool_args_check(p->tools, name, args, NULL)) {
        json_decref(args);
        return false;
    }
    char *text = exo_json_dumps(args, JSON_COMPACT);
    char id[48];
    exo_gen_random_id(id, sizeof id, "call_");
    exo_chunk c;
    exo_chunk_tool_calls(&c);
    exo_chunk_add_tool_call(&c, id, name, text);
    p->emit(p->ctx, &c);
    exo_chunk_free(&c);
    exo_free(text);
    json_decref(args);
    p->calls++;
    p->meta_used = true;
    return true;
}

/* {"name": ..., "arguments"|"parameters": {...}} */
static bool emit_json_call(exo_output_parser *p, const json_t *obj)
{
    if (!json_is_object(obj))
        return false;
    json_t *name = json_object_get(obj, "name");
    json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    return json_is_string(name) && emit_call(p, json_string_value(name), args);
}

/* ---- stage 3: tool calls --------------------------------------------------- */

static bool parse_ds_block(exo_output_parser *p, const char *s, size_t n);

static void tools_hermes(exo_output_parser *p, bool final)
{
    exo_sbuf *b = &p->tool_buf;
    for (;;) {
        const char *d = b->data ? b->data : "";
        if (p->tstate == T_OUT) {
            const char *m = p->fmt == EXO_TOOL_FMT_HERMES ? HERMES_START : DS_CALLS_BEGIN;
            const char *hit = find(d, b->len, m);
            if (hit) {
                deliver(p, d, (size_t)(hit - d), false);
                consume(b, (size_t)(hit - d) + strlen(m));
                p->tstate = T_IN;
                continue;
            }
            size_t hold = final ? 0 : partial(d, b->len, m);
            deliver(p, d, b->len - hold, false);
            consume(b, b->len - hold);
            return;
        }
        /* T_IN: the buffer holds the call text after the start marker. */
        const char *m = p->fmt == EXO_TOOL_FMT_HERMES ? HERMES_END : DS_CALLS_END;
        const char *start = p->fmt == EXO_TOOL_FMT_HERMES ? HERMES_START : DS_CALLS_BEGIN;
        const char *hit = find(d, b->len, m);
        if (!hit && !final && b->len < TOOL_BUF_MAX)
            return;
        size_t body = hit ? (size_t)(hit - d) : b->len;
        bool ok;
        if (p->fmt == EXO_TOOL_FMT_HERMES) {
            json_t *j = json_loadb(d, body, 0, NULL);
            ok = hit && emit_json_call(p, j);
            json_decref(j);
        } else {
            ok = parse_ds_block(p, d, body);
        }
        if (!ok) {
            exo_sbuf raw;
            exo_sbuf_init(&raw);
            exo_sbuf_puts(&raw, start);
            exo_sbuf_append(&raw, d, body);
            if (hit)
                exo_sbuf_puts(&raw, m);
            deliver(p, raw.data, raw.len, false);
            exo_sbuf_free(&raw);
        }
        consume(b, hit ? body + strlen(m) : body);
        p->tstate = T_OUT;
        if (!hit)
            return;
    }
}

/* DeepSeek V3: <call_begin>function<sep>NAME\n```json\nARGS\n```<call_end>
 * DeepSeek V3.1: <call_begin>NAME<sep>ARGS<call_end>. All calls of the block
 * must parse, else the block is text. */
static bool parse_ds_block(exo_output_parser *p, const char *s, size_t n)
{
    const char *end = s + n;
    int found = 0;
    /* Validate everything first so a block is either all calls or all text. */
    for (int pass = 0; pass < 2; pass++) {
        const char *q = s;
        found = 0;
        for (;;) {
            const char *cb = find(q, (size_t)(end - q), DS_CALL_BEGIN);
            if (!cb)
                break;
            cb += strlen(DS_CALL_BEGIN);
            const char *ce = find(cb, (size_t)(end - cb), DS_CALL_END);
            if (!ce)
                return false;
            const char *sep = find(cb, (size_t)(ce - cb), DS_SEP);
            if (!sep)
                return false;
            const char *after = sep + strlen(DS_SEP);
            char *name;
            const char *a0, *a1;
            if ((size_t)(sep - cb) == 8 && memcmp(cb, "function", 8) == 0) {
                const char *nl = memchr(after, '\n', (size_t)(ce - after));
                if (!nl)
                    return false;
                name = exo_strndup(after, (size_t)(nl - after));
                a0 = nl + 1;
                a1 = ce;
                const char *fence = find(a0, (size_t)(a1 - a0), "```json");
                if (fence) {
                    a0 = fence + 7;
                    const char *close = find(a0, (size_t)(a1 - a0), "```");
                    if (close)
                        a1 = close;
                }
            } else {
                name = exo_strndup(cb, (size_t)(sep - cb));
                a0 = after;
                a1 = ce;
            }
            json_t *args = json_loadb(a0, (size_t)(a1 - a0), 0, NULL);
            bool ok = args != NULL;
            if (ok && pass == 0) {
                json_t *copy = json_deep_copy(args);
                ok = exo_tool_args_check(p->tools, name, copy, NULL) == 0;
                json_decref(copy);
            } else if (ok) {
                ok = emit_call(p, name, args);
            }
            json_decref(args);
            exo_free(name);
            if (!ok)
                return false;
            found++;
            q = ce + strlen(DS_CALL_END);
        }
        if (!found)
            return false;
    }
    return true;
}

/* Llama 3: the whole answer is one or more JSON calls ("{...}; {...}"),
 * optionally after <|python_tag|>. Decided at the first non-space byte. */
static bool parse_l3_calls(exo_output_parser *p, const char *s, size_t n)
{
    if (n >= strlen(PY_TAG) && memcmp(s, PY_TAG, strlen(PY_TAG)) == 0)
        s += strlen(PY_TAG), n -= strlen(PY_TAG);
    json_t *calls = json_array();
    size_t pos = 0;
    bool ok = true;
    while (ok) {
        while (pos < n && (isspace((unsigned char)s[pos]) || s[pos] == ';'))
            pos++;
        if (pos == n)
            break;
        json_error_t je;
        json_t *j = json_loadb(s + pos, n - pos, JSON_DISABLE_EOF_CHECK, &je);
        if (!j || !json_is_object(j) || !json_is_string(json_object_get(j, "name"))) {
            json_decref(j);
            ok = false;
            break;
        }
        json_array_append_new(calls, j);
        pos += (size_t)je.position;
    }
    if (ok && json_array_size(calls) == 0)
        ok = false;
    /* Validate all before emitting any. */
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        if (!ok)
            break;
        json_t *a = json_object_get(c, "parameters");
        if (!a)
            a = json_object_get(c, "arguments");
        json_t *copy = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL)
                       : a ? json_deep_copy(a) : json_object();
        ok = copy && exo_tool_args_check(p->tools, json_string_value(json_object_get(c, "name")),
                                         copy, NULL) == 0;
        json_decref(copy);
    }
    if (ok)
        json_array_foreach(calls, i, c) emit_json_call(p, c);
    json_decref(calls);
    return ok;
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
        if (!parse_l3_calls(p, d + i, b->len - i))
            deliver(p, d, b->len, false);
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
        tools_hermes(p, final); /* Hermes and DeepSeek share the block logic */
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
        if (strstr(tpl, "<|channel|>"))
            cfg->tool_format = EXO_TOOL_FMT_HARMONY;
        else if (strstr(tpl, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin"))
            cfg->tool_format = EXO_TOOL_FMT_DEEPSEEK_V3;
        else if (strstr(tpl, "<tool_call>"))
            cfg->tool_format = EXO_TOOL_FMT_HERMES;
        else if (strstr(tpl, "<|python_tag|>") || strstr(tpl, "<|eom_id|>"))
            cfg->tool_format = EXO_TOOL_FMT_LLAMA3;
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
