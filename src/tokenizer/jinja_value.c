/* Jinja values: construction, reference counting, Python-compatible
 * truthiness, equality, ordering, str()/repr() and json.dumps().
 *
 * Chat templates print Python objects (str(None) is "None", a list prints
 * as its repr) and serialize them with json.dumps, so the text forms here
 * follow CPython exactly: float repr is the shortest round-tripping form,
 * repr picks quotes like Python, json.dumps uses ", " and ": " separators. */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"

jv jv_ref(jv v)
{
    switch (v.type) {
    case JV_STRING: if (v.u.s->rc >= 0) v.u.s->rc++; break;
    case JV_LIST:   v.u.l->rc++; break;
    case JV_DICT:   v.u.d->rc++; break;
    case JV_FUNC:   v.u.fn->rc++; break;
    default: break;
    }
    return v;
}

void jv_unref(jv v)
{
    switch (v.type) {
    case JV_STRING:
        if (v.u.s->rc >= 0 && --v.u.s->rc == 0)
            exo_free(v.u.s);
        break;
    case JV_LIST:
        if (--v.u.l->rc == 0) {
            for (size_t i = 0; i < v.u.l->len; i++)
                jv_unref(v.u.l->items[i]);
            exo_free(v.u.l->items);
            exo_free(v.u.l);
        }
        break;
    case JV_DICT:
        if (--v.u.d->rc == 0) {
            for (size_t i = 0; i < v.u.d->len; i++) {
                jv_unref(v.u.d->keys[i]);
                jv_unref(v.u.d->vals[i]);
            }
            exo_free(v.u.d->keys);
            exo_free(v.u.d->vals);
            exo_free(v.u.d);
        }
        break;
    case JV_FUNC:
        if (--v.u.fn->rc == 0) {
            jv_unref(v.u.fn->self);
            exo_free(v.u.fn);
        }
        break;
    default: break;
    }
}

jv jv_str_new(const char *s, size_t n)
{
    jv_str *p = exo_malloc(sizeof *p + n + 1);
    p->rc = 1;
    p->len = n;
    if (n)
        memcpy(p->data, s, n);
    p->data[n] = 0;
    jv v = {.type = JV_STRING};
    v.u.s = p;
    return v;
}

jv jv_str_cstr(const char *s) { return jv_str_new(s, strlen(s)); }

jv jv_str_immortal(jv v)
{
    if (v.type == JV_STRING)
        v.u.s->rc = -1;
    return v;
}

void jv_free_immortal(jv v)
{
    if (v.type == JV_STRING && v.u.s->rc < 0)
        exo_free(v.u.s);
    else
        jv_unref(v);
}

jv jv_list_new(size_t cap)
{
    jv_list *l = exo_calloc(1, sizeof *l);
    l->rc = 1;
    l->cap = cap ? cap : 4;
    l->items = exo_malloc(l->cap * sizeof(jv));
    jv v = {.type = JV_LIST};
    v.u.l = l;
    return v;
}

void jv_list_push(jv list, jv item)
{
    jv_list *l = list.u.l;
    if (l->len == l->cap) {
        l->cap *= 2;
        l->items = exo_realloc(l->items, l->cap * sizeof(jv));
    }
    l->items[l->len++] = item;
    uint32_t d = jv_depth(item) + 1;
    if (d > l->depth)
        l->depth = d;
}

uint32_t jv_depth(jv v)
{
    if (v.type == JV_LIST) return v.u.l->depth ? v.u.l->depth : 1;
    if (v.type == JV_DICT) return v.u.d->depth ? v.u.d->depth : 1;
    return 0;
}

jv jv_dict_new(void)
{
    jv_dict *d = exo_calloc(1, sizeof *d);
    d->rc = 1;
    jv v = {.type = JV_DICT};
    v.u.d = d;
    return v;
}

static bool dict_find(jv_dict *d, jv key, size_t *idx)
{
    for (size_t i = 0; i < d->len; i++)
        if (jv_equal(d->keys[i], key)) {
            *idx = i;
            return true;
        }
    return false;
}

void jv_dict_set(jv dict, jv key, jv val)
{
    jv_dict *d = dict.u.d;
    size_t i;
    if (dict_find(d, key, &i)) {
        jv_unref(d->vals[i]);
        d->vals[i] = val;
        uint32_t dep = jv_depth(val) + 1; /* conservative: never lowered */
        if (dep > d->depth)
            d->depth = dep;
        return;
    }
    if (d->len == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        d->keys = exo_realloc(d->keys, d->cap * sizeof(jv));
        d->vals = exo_realloc(d->vals, d->cap * sizeof(jv));
    }
    d->keys[d->len] = jv_ref(key);
    d->vals[d->len] = val;
    d->len++;
    uint32_t dep = jv_depth(val) + 1;
    if (dep > d->depth)
        d->depth = dep;
}

void jv_dict_set_str(jv dict, const char *key, jv val)
{
    jv k = jv_str_cstr(key);
    jv_dict_set(dict, k, val);
    jv_unref(k);
}

bool jv_dict_get(jv dict, jv key, jv *out)
{
    size_t i;
    if (dict.type != JV_DICT || !dict_find(dict.u.d, key, &i))
        return false;
    *out = dict.u.d->vals[i];
    return true;
}

bool jv_dict_get_str(jv dict, const char *key, size_t klen, jv *out)
{
    if (dict.type != JV_DICT)
        return false;
    jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->len; i++) {
        jv k = d->keys[i];
        if (k.type == JV_STRING && k.u.s->len == klen && !memcmp(k.u.s->data, key, klen)) {
            *out = d->vals[i];
            return true;
        }
    }
    return false;
}

jv jv_func_new(int kind, const char *name)
{
    jv_func *f = exo_calloc(1, sizeof *f);
    f->rc = 1;
    f->kind = kind;
    f->name = name;
    f->self = jv_undef();
    jv v = {.type = JV_FUNC};
    v.u.fn = f;
    return v;
}

bool jv_truthy(jv v)
{
    switch (v.type) {
    case JV_UNDEFINED: case JV_NONE: return false;
    case JV_BOOL:   return v.u.b;
    case JV_INT:    return v.u.i != 0;
    case JV_FLOAT:  return v.u.f != 0.0;
    case JV_STRING: return v.u.s->len != 0;
    case JV_LIST:   return v.u.l->gen || v.u.l->len != 0;
    case JV_DICT:   return v.u.d->ns || v.u.d->len != 0;
    default:        return true;
    }
}

bool jv_is_number(jv v)
{
    return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
}

double jv_as_double(jv v)
{
    switch (v.type) {
    case JV_INT:   return (double)v.u.i;
    case JV_FLOAT: return v.u.f;
    case JV_BOOL:  return v.u.b;
    default:       return 0;
    }
}

bool jv_equal(jv a, jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT)
            return (a.type == JV_BOOL ? a.u.b : a.u.i) == (b.type == JV_BOOL ? b.u.b : b.u.i);
        return jv_as_double(a) == jv_as_double(b);
    }
    if (a.type != b.type)
        return false;
    switch (a.type) {
    case JV_UNDEFINED: case JV_NONE: return true;
    case JV_STRING:
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->data, b.u.s->data, a.u.s->len);
    case JV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->len != b.u.l->len)
            return false;
        for (size_t i = 0; i < a.u.l->len; i++)
            if (!jv_equal(a.u.l->items[i], b.u.l->items[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.u.d == b.u.d)
            return true;
        if (a.u.d->ns || b.u.d->ns || a.u.d->len != b.u.d->len)
            return false;
        for (size_t i = 0; i < a.u.d->len; i++) {
            jv o;
            if (!jv_dict_get(b, a.u.d->keys[i], &o) || !jv_equal(a.u.d->vals[i], o))
                return false;
        }
        return true;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

int jv_compare(jv a, jv b, int *res)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_BOOL ? a.u.b : a.u.i, y = b.type == JV_BOOL ? b.u.b : b.u.i;
            *res = (x > y) - (x < y);
        } else {
            double x = jv_as_double(a), y = jv_as_double(b);
            *res = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.type == JV_STRING && b.type == JV_STRING) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->data, b.u.s->data, n);
        if (r == 0)
            r = (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        *res = (r > 0) - (r < 0);
        return 0;
    }
    if (a.type == JV_LIST && b.type == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->len < b.u.l->len ? a.u.l->len : b.u.l->len;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->items[i], b.u.l->items[i]))
                continue;
            return jv_compare(a.u.l->items[i], b.u.l->items[i], res);
        }
        *res = (a.u.l->len > b.u.l->len) - (a.u.l->len < b.u.l->len);
        return 0;
    }
    return EXO_EINVAL;
}

const char *jv_type_name(jv v)
{
    switch (v.type) {
    case JV_UNDEFINED: return "Undefined";
    case JV_NONE:   return "NoneType";
    case JV_BOOL:   return "bool";
    case JV_INT:    return "int";
    case JV_FLOAT:  return "float";
    case JV_STRING: return "str";
    case JV_LIST:   return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT:   return v.u.d->ns ? "Namespace" : "dict";
    default:        return "function";
    }
}

size_t jv_utf8_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

size_t jv_utf8_offset(const char *s, size_t n, size_t cp)
{
    size_t c = 0, i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp)
                return i;
            c++;
        }
    }
    return n;
}

/* ---- buffers ----------------------------------------------------------- */

void jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n + 1)
            nc *= 2;
        b->p = exo_realloc(b->p, nc);
        b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void jbuf_puts(jbuf *b, const char *s) { jbuf_put(b, s, strlen(s)); }
void jbuf_putc(jbuf *b, char ch) { jbuf_put(b, &ch, 1); }

void jbuf_printf(jbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        jbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = exo_malloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jbuf_put(b, big, (size_t)n);
    exo_free(big);
}

jv jbuf_to_str(jbuf *b)
{
    jv v = jv_str_new(b->p ? b->p : "", b->len);
    exo_free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    return v;
}

/* ---- text forms -------------------------------------------------------- */

void jv_float_repr(jbuf *b, double f)
{
    if (isnan(f)) { jbuf_puts(b, "nan"); return; }
    if (isinf(f)) { jbuf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp is d.ddde[+-]XX: digits and decimal exponent, reformat like repr */
    char digits[32];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    if (neg)
        jbuf_putc(b, '-');
    if (exp >= 16 || exp < -4) {
        jbuf_putc(b, digits[0]);
        if (nd > 1) {
            jbuf_putc(b, '.');
            jbuf_put(b, digits + 1, nd - 1);
        }
        jbuf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        jbuf_puts(b, "0.");
        for (int i = 0; i < -exp - 1; i++)
            jbuf_putc(b, '0');
        jbuf_put(b, digits, nd);
    } else {
        size_t ip = (size_t)exp + 1;
        for (size_t i = 0; i < ip; i++)
            jbuf_putc(b, i < nd ? digits[i] : '0');
        jbuf_putc(b, '.');
        if (nd > ip)
            jbuf_put(b, digits + ip, nd - ip);
        else
            jbuf_putc(b, '0');
    }
}

static void str_repr(jbuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jbuf_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == (unsigned char)q || ch == '\\') { jbuf_putc(b, '\\'); jbuf_putc(b, (char)ch); }
        else if (ch == '\n') jbuf_puts(b, "\\n");
        else if (ch == '\r') jbuf_puts(b, "\\r");
        else if (ch == '\t') jbuf_puts(b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) jbuf_printf(b, "\\x%02x", ch);
        else if (ch < 0x80) jbuf_putc(b, (char)ch);
        else {
            /* non-ASCII: Python escapes what str.isprintable() rejects */
            utf8proc_int32_t cp;
            utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
            if (k <= 0) {
                jbuf_printf(b, "\\x%02x", ch);
                continue;
            }
            utf8proc_category_t cat = utf8proc_category(cp);
            bool printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                               cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                               cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                               cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (printable)
                jbuf_put(b, s + i, (size_t)k);
            else if (cp < 0x100)
                jbuf_printf(b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                jbuf_printf(b, "\\u%04x", (unsigned)cp);
            else
                jbuf_printf(b, "\\U%08x", (unsigned)cp);
            i += (size_t)k - 1;
        }
    }
    jbuf_putc(b, q);
}

void jv_repr(jbuf *b, jv v)
{
    switch (v.type) {
    case JV_STRING: str_repr(b, v.u.s->data, v.u.s->len); return;
    case JV_LIST: {
        jv_list *l = v.u.l;
        jbuf_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->len; i++) {
            if (i)
                jbuf_puts(b, ", ");
            jv_repr(b, l->items[i]);
        }
        if (l->tuple && l->len == 1)
            jbuf_putc(b, ',');
        jbuf_putc(b, l->tuple ? ')' : ']');
        return;
    }
    case JV_DICT: {
        jv_dict *d = v.u.d;
        if (d->ns)
            jbuf_puts(b, "<Namespace ");
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->len; i++) {
            if (i)
                jbuf_puts(b, ", ");
            jv_repr(b, d->keys[i]);
            jbuf_puts(b, ": ");
            jv_repr(b, d->vals[i]);
        }
        jbuf_putc(b, '}');
        if (d->ns)
            jbuf_putc(b, '>');
        return;
    }
    case JV_UNDEFINED: jbuf_puts(b, "Undefined"); return;
    default: jv_to_str(b, v); return;
    }
}

void jv_to_str(jbuf *b, jv v)
{
    switch (v.type) {
    case JV_UNDEFINED: return;
    case JV_NONE:   jbuf_puts(b, "None"); return;
    case JV_BOOL:   jbuf_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT:    jbuf_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT:  jv_float_repr(b, v.u.f); return;
    case JV_STRING: jbuf_put(b, v.u.s->data, v.u.s->len); return;
    case JV_FUNC:   jbuf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?"); return;
    default:        jv_repr(b, v); return;
    }
}

static void json_str(jbuf *b, const char *s, size_t n, bool ensure_ascii)
{
    jbuf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        switch (ch) {
        case '"':  jbuf_puts(b, "\\\""); continue;
        case '\\': jbuf_puts(b, "\\\\"); continue;
        case '\n': jbuf_puts(b, "\\n"); continue;
        case '\r': jbuf_puts(b, "\\r"); continue;
        case '\t': jbuf_puts(b, "\\t"); continue;
        case '\b': jbuf_puts(b, "\\b"); continue;
        case '\f': jbuf_puts(b, "\\f"); continue;
        default: break;
        }
        if (ch < 0x20 || (ensure_ascii && ch == 0x7f)) {
            jbuf_printf(b, "\\u%04x", ch);
        } else if (ch >= 0x80 && ensure_ascii) {
            /* decode one UTF-8 sequence */
            uint32_t cp = 0;
            int extra = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : ch >= 0xC0 ? 1 : 0;
            cp = ch & (0x3F >> extra);
            for (int k = 0; k < extra && i + 1 < n; k++)
                cp = (cp << 6) | ((unsigned char)s[++i] & 0x3F);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                jbuf_printf(b, "\\u%04x", cp);
            }
        } else {
            jbuf_putc(b, (char)ch);
        }
    }
    jbuf_putc(b, '"');
}

static void json_newline(jbuf *b, const char *indent, int depth)
{
    jbuf_putc(b, '\n');
    for (int i = 0; i < depth; i++)
        jbuf_puts(b, indent);
}

int jv_to_json(jbuf *b, jv v, bool ensure_ascii, const char *indent, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth)
{
    if (depth > 200)
        return EXO_ERANGE;
    switch (v.type) {
    case JV_NONE:   jbuf_puts(b, "null"); return 0;
    case JV_BOOL:   jbuf_puts(b, v.u.b ? "true" : "false"); return 0;
    case JV_INT:    jbuf_printf(b, "%lld", (long long)v.u.i); return 0;
    case JV_FLOAT:
        if (isnan(v.u.f)) jbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) jbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else jv_float_repr(b, v.u.f);
        return 0;
    case JV_STRING: json_str(b, v.u.s->data, v.u.s->len, ensure_ascii); return 0;
    case JV_LIST: {
        jv_list *l = v.u.l;
        if (l->len == 0) { jbuf_puts(b, "[]"); return 0; }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < l->len; i++) {
            if (i)
                jbuf_puts(b, item_sep);
            if (indent)
                json_newline(b, indent, depth + 1);
            int rc = jv_to_json(b, l->items[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1);
            if (rc)
                return rc;
        }
        if (indent)
            json_newline(b, indent, depth);
        jbuf_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        jv_dict *d = v.u.d;
        if (d->ns)
            return EXO_EINVAL;
        if (d->len == 0) { jbuf_puts(b, "{}"); return 0; }
        size_t *ord = exo_malloc(d->len * sizeof *ord);
        for (size_t i = 0; i < d->len; i++)
            ord[i] = i;
        if (sort_keys) { /* insertion sort: dicts here are small */
            for (size_t i = 1; i < d->len; i++) {
                size_t x = ord[i], j = i;
                while (j > 0) {
                    int r = 0;
                    if (jv_compare(d->keys[ord[j - 1]], d->keys[x], &r) || r <= 0)
                        break;
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
        }
        jbuf_putc(b, '{');
        int rc = 0;
        for (size_t k = 0; k < d->len && !rc; k++) {
            size_t i = ord[k];
            if (k)
                jbuf_puts(b, item_sep);
            if (indent)
                json_newline(b, indent, depth + 1);
            jv key = d->keys[i];
            if (key.type == JV_STRING) {
                json_str(b, key.u.s->data, key.u.s->len, ensure_ascii);
            } else if (key.type == JV_INT || key.type == JV_FLOAT || key.type == JV_BOOL || key.type == JV_NONE) {
                jbuf_putc(b, '"');
                jv_to_json(b, key, ensure_ascii, NULL, item_sep, key_sep, false, depth + 1);
                jbuf_putc(b, '"');
            } else {
                rc = EXO_EINVAL;
                break;
            }
            jbuf_puts(b, key_sep);
            rc = jv_to_json(b, d->vals[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, depth + 1);
        }
        exo_free(ord);
        if (rc)
            return rc;
        if (indent)
            json_newline(b, indent, depth);
        jbuf_putc(b, '}');
        return 0;
    }
    default:
        return EXO_EINVAL;
    }
}

jv jv_from_json(const json_t *j)
{
    if (!j)
        return jv_none();
    switch (json_typeof(j)) {
    case JSON_NULL:    return jv_none();
    case JSON_TRUE:    return jv_bool(true);
    case JSON_FALSE:   return jv_bool(false);
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL:    return jv_float(json_real_value(j));
    case JSON_STRING:  return jv_str_new(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jv l = jv_list_new(n);
        for (size_t i = 0; i < n; i++)
            jv_list_push(l, jv_from_json(json_array_get(j, i)));
        return l;
    }
    case JSON_OBJECT: {
        jv d = jv_dict_new();
        const char *k;
        size_t klen;
        json_t *val;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)j, tmp, k, klen, val) {
            jv key = jv_str_new(k, klen);
            jv_dict *dd = d.u.d; /* keys are unique: append without lookup */
            if (dd->len == dd->cap) {
                dd->cap = dd->cap ? dd->cap * 2 : 4;
                dd->keys = exo_realloc(dd->keys, dd->cap * sizeof(jv));
                dd->vals = exo_realloc(dd->vals, dd->cap * sizeof(jv));
            }
            dd->keys[dd->len] = key;
            dd->vals[dd->len] = jv_from_json(val);
            uint32_t dep = jv_depth(dd->vals[dd->len]) + 1;
            if (dep > dd->depth)
                dd->depth = dep;
            dd->len++;
        }
        return d;
    }
    }
    return jv_none();
}
