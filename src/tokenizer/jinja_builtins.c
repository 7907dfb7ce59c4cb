/* Jinja builtins: filters, tests, Python str/dict/list methods and the
 * global functions that HF chat templates call.
 *
 * Each follows the Python implementation it stands for (jinja2.filters,
 * jinja2.tests, CPython str methods, transformers' tojson/strftime_now/
 * raise_exception), since templates are only correct if they produce the
 * same bytes as transformers does. Text is UTF-8 with code-point semantics;
 * whitespace is Python's str.isspace() set. Mutating list/dict methods are
 * absent, as in transformers' ImmutableSandboxedEnvironment. */
#include "tokenizer/jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "core/alloc.h"

int jinja_iter_list(jinja_ctx *c, jv v, jv *out);

static const char MISSING[] = "<missing>";

typedef struct jargs {
    const jv *args;
    size_t nargs;
    const char *const *kwn;
    const jv *kwv;
    size_t nkw;
} jargs;

/* Parameter `name` at position pos (counting after the filtered value). */
static jv A(const jargs *a, size_t pos, const char *name)
{
    if (pos < a->nargs)
        return a->args[pos];
    for (size_t i = 0; i < a->nkw; i++)
        if (name && !strcmp(a->kwn[i], name))
            return a->kwv[i];
    return jv_undef_named(MISSING);
}

static bool missing(jv v) { return v.type == JV_UNDEFINED && v.u.undef_name == MISSING; }
static bool given(jv v) { return !missing(v); }

static bool as_bool(jv v, bool def) { return missing(v) ? def : jv_truthy(v); }

static int as_int(jinja_ctx *c, jv v, int64_t def, int64_t *out)
{
    if (missing(v) || v.type == JV_NONE) { *out = def; return 0; }
    if (v.type == JV_INT) { *out = v.u.i; return 0; }
    if (v.type == JV_BOOL) { *out = v.u.b; return 0; }
    return jinja_fail(c, EXO_EINVAL, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
}

static jv to_string(jv v)
{
    if (v.type == JV_STRING)
        return jv_ref(v);
    jbuf b = {0};
    jv_to_str(&b, v);
    return jbuf_to_str(&b);
}

/* ---- UTF-8 and Python whitespace --------------------------------------- */

static size_t u8dec(const char *s, size_t n, size_t i, int32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

static void u8enc(jbuf *b, int32_t cp)
{
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    jbuf_put(b, (const char *)tmp, (size_t)k);
}

static bool py_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool py_cased_letter(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static bool py_alpha(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static bool py_digit(int32_t c)
{
    return utf8proc_category(c) == UTF8PROC_CATEGORY_ND;
}

/* strip chars from the ends (which: 1 left, 2 right, 3 both); chars NULL =
 * whitespace */
static jv do_strip(jv s, jv chars, int which)
{
    const char *p = s.u.s->data;
    size_t n = s.u.s->len, a = 0, e = n;
    bool use_chars = chars.type == JV_STRING;
    const char *cs = use_chars ? chars.u.s->data : NULL;
    size_t cn = use_chars ? chars.u.s->len : 0;
    if (which & 1) {
        while (a < e) {
            int32_t cp;
            size_t k = u8dec(p, n, a, &cp);
            bool strip = false;
            if (use_chars) {
                for (size_t j = 0; j < cn;) {
                    int32_t cc;
                    j += u8dec(cs, cn, j, &cc);
                    if (cc == cp) { strip = true; break; }
                }
            } else {
                strip = py_space(cp);
            }
            if (!strip)
                break;
            a += k;
        }
    }
    if (which & 2) {
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            int32_t cp;
            u8dec(p, n, st, &cp);
            bool strip = false;
            if (use_chars) {
                for (size_t j = 0; j < cn;) {
                    int32_t cc;
                    j += u8dec(cs, cn, j, &cc);
                    if (cc == cp) { strip = true; break; }
                }
            } else {
                strip = py_space(cp);
            }
            if (!strip)
                break;
            e = st;
        }
    }
    return jv_str_new(p + a, e - a);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_JTITLE, CASE_SWAP };

static jv do_case(jv s, int mode)
{
    const char *p = s.u.s->data;
    size_t n = s.u.s->len;
    jbuf b = {0};
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += u8dec(p, n, i, &cp);
        int32_t o = cp;
        switch (mode) {
        case CASE_UPPER: o = utf8proc_toupper(cp); break;
        case CASE_LOWER: o = utf8proc_tolower(cp); break;
        case CASE_CAPITALIZE: o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp); break;
        case CASE_TITLE:
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = py_cased_letter(cp);
            break;
        case CASE_JTITLE: /* jinja's title: words begin after [-\s({\[<] */
            o = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            word_start = py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            break;
        default: break;
        }
        first = false;
        u8enc(&b, o);
    }
    return jbuf_to_str(&b);
}

static jv do_replace(jv s, jv old, jv new_, int64_t count)
{
    const char *p = s.u.s->data;
    size_t n = s.u.s->len, on = old.u.s->len;
    jbuf b = {0};
    if (on == 0) {
        /* Python inserts `new` between every character and at both ends */
        int64_t done = 0;
        for (size_t i = 0; i <= n;) {
            if (count < 0 || done < count) {
                jbuf_put(&b, new_.u.s->data, new_.u.s->len);
                done++;
            }
            if (i == n)
                break;
            int32_t cp;
            size_t k = u8dec(p, n, i, &cp);
            jbuf_put(&b, p + i, k);
            i += k;
        }
        return jbuf_to_str(&b);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < n) {
        const char *hit = (count < 0 || done < count) ? memmem(p + i, n - i, old.u.s->data, on) : NULL;
        if (!hit) {
            jbuf_put(&b, p + i, n - i);
            break;
        }
        jbuf_put(&b, p + i, (size_t)(hit - (p + i)));
        jbuf_put(&b, new_.u.s->data, new_.u.s->len);
        i = (size_t)(hit - p) + on;
        done++;
    }
    if (!b.p)
        jbuf_put(&b, "", 0);
    return jbuf_to_str(&b);
}

/* start of the code point that ends at byte e */
static size_t cp_start_before(const char *p, size_t e)
{
    size_t st = e - 1;
    while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
        st--;
    return st;
}

static bool space_before(const char *p, size_t n, size_t e)
{
    int32_t cp;
    u8dec(p, n, cp_start_before(p, e), &cp);
    return py_space(cp);
}

static jv do_split(jv s, jv sep, int64_t maxsplit, bool from_right)
{
    const char *p = s.u.s->data;
    size_t n = s.u.s->len;
    jv out = jv_list_new(4);
    if (sep.type != JV_STRING) {
        /* whitespace split: runs of whitespace, no empty strings */
        if (!from_right) {
            size_t i = 0;
            int64_t splits = 0;
            while (i < n) {
                int32_t cp;
                size_t k;
                while (i < n && (k = u8dec(p, n, i, &cp)) && py_space(cp))
                    i += k;
                if (i >= n)
                    break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = n;
                    jv tmp = jv_str_new(p + i, e - i);
                    jv_list_push(out, do_strip(tmp, jv_undef(), 2));
                    jv_unref(tmp);
                    break;
                }
                size_t st = i;
                while (i < n && (k = u8dec(p, n, i, &cp)) && !py_space(cp))
                    i += k;
                jv_list_push(out, jv_str_new(p + st, i - st));
                splits++;
            }
        } else {
            /* collect from the right then reverse */
            jv rev = jv_list_new(4);
            size_t e = n;
            int64_t splits = 0;
            while (e > 0) {
                while (e > 0 && space_before(p, n, e))
                    e = cp_start_before(p, e);
                if (e == 0)
                    break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    jv_list_push(rev, jv_str_new(p, e));
                    break;
                }
                size_t st = e;
                while (st > 0 && !space_before(p, n, st))
                    st = cp_start_before(p, st);
                jv_list_push(rev, jv_str_new(p + st, e - st));
                e = st;
                splits++;
            }
            for (size_t i = rev.u.l->len; i > 0; i--)
                jv_list_push(out, jv_ref(rev.u.l->items[i - 1]));
            jv_unref(rev);
        }
        return out;
    }
    const char *sp = sep.u.s->data;
    size_t sn = sep.u.s->len;
    if (!from_right) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || splits < maxsplit) ? memmem(p + i, n - i, sp, sn) : NULL;
            if (!hit) {
                jv_list_push(out, jv_str_new(p + i, n - i));
                break;
            }
            jv_list_push(out, jv_str_new(p + i, (size_t)(hit - (p + i))));
            i = (size_t)(hit - p) + sn;
            splits++;
        }
    } else {
        jv rev = jv_list_new(4);
        size_t e = n;
        int64_t splits = 0;
        for (;;) {
            const char *hit = NULL;
            if ((maxsplit < 0 || splits < maxsplit) && e >= sn)
                for (size_t st = e - sn + 1; st-- > 0;)
                    if (!memcmp(p + st, sp, sn)) { hit = p + st; break; }
            if (!hit) {
                jv_list_push(rev, jv_str_new(p, e));
                break;
            }
            size_t hs = (size_t)(hit - p);
            jv_list_push(rev, jv_str_new(p + hs + sn, e - hs - sn));
            e = hs;
            splits++;
        }
        for (size_t i = rev.u.l->len; i > 0; i--)
            jv_list_push(out, jv_ref(rev.u.l->items[i - 1]));
        jv_unref(rev);
    }
    return out;
}

/* ---- printf-style formatting (str % args, |format) ---------------------- */

static int py_format(jinja_ctx *c, jv fmt, const jv *args, size_t nargs, jv *out)
{
    const char *p = fmt.u.s->data;
    size_t n = fmt.u.s->len, ai = 0;
    jbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') {
            jbuf_putc(&b, p[i]);
            continue;
        }
        if (++i >= n)
            goto bad;
        if (p[i] == '%') {
            jbuf_putc(&b, '%');
            continue;
        }
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        while (i < n && strchr("-+ #0", p[i]) && k < 20)
            spec[k++] = p[i++];
        while (i < n && p[i] >= '0' && p[i] <= '9' && k < 24)
            spec[k++] = p[i++];
        if (i < n && p[i] == '.') {
            spec[k++] = p[i++];
            while (i < n && p[i] >= '0' && p[i] <= '9' && k < 28)
                spec[k++] = p[i++];
        }
        if (i >= n)
            goto bad;
        char conv = p[i];
        if (ai >= nargs) {
            exo_free(b.p);
            return jinja_fail(c, EXO_EINVAL, "not enough arguments for format string");
        }
        jv a = args[ai++];
        if (conv == 's' || conv == 'r') {
            jbuf t = {0};
            if (conv == 's')
                jv_to_str(&t, a);
            else
                jv_repr(&t, a);
            spec[k++] = 's';
            spec[k] = 0;
            jbuf_printf(&b, spec, t.p ? t.p : "");
            exo_free(t.p);
        } else if (strchr("dixXoc", conv)) {
            if (!jv_is_number(a)) {
                exo_free(b.p);
                return jinja_fail(c, EXO_EINVAL, "%%%c format: a number is required, not %s", conv, jv_type_name(a));
            }
            long long v = a.type == JV_FLOAT ? (long long)a.u.f : a.type == JV_BOOL ? a.u.b : a.u.i;
            if (conv == 'c') {
                u8enc(&b, (int32_t)v);
                continue;
            }
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            jbuf_printf(&b, spec, v);
        } else if (strchr("eEfFgG", conv)) {
            if (!jv_is_number(a)) {
                exo_free(b.p);
                return jinja_fail(c, EXO_EINVAL, "must be real number, not %s", jv_type_name(a));
            }
            spec[k++] = conv;
            spec[k] = 0;
            jbuf_printf(&b, spec, jv_as_double(a));
        } else {
            goto bad;
        }
    }
    if (ai < nargs) {
        exo_free(b.p);
        return jinja_fail(c, EXO_EINVAL, "not all arguments converted during string formatting");
    }
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
bad:
    exo_free(b.p);
    return jinja_fail(c, EXO_EINVAL, "unsupported format character");
}

/* str.format: {} {0} {name} without format specs */
static int str_format(jinja_ctx *c, jv fmt, const jargs *a, jv *out)
{
    const char *p = fmt.u.s->data;
    size_t n = fmt.u.s->len, auto_i = 0;
    jbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { jbuf_putc(&b, '{'); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { jbuf_putc(&b, '}'); i++; continue; }
        if (p[i] != '{') {
            jbuf_putc(&b, p[i]);
            continue;
        }
        size_t e = i + 1;
        while (e < n && p[e] != '}')
            e++;
        if (e >= n) {
            exo_free(b.p);
            return jinja_fail(c, EXO_EINVAL, "Single '{' encountered in format string");
        }
        char key[64];
        size_t kl = e - i - 1 < sizeof key - 1 ? e - i - 1 : sizeof key - 1;
        memcpy(key, p + i + 1, kl);
        key[kl] = 0;
        char *colon = strchr(key, ':');
        if (colon)
            *colon = 0;
        jv v = jv_undef_named(MISSING);
        if (!key[0]) {
            if (auto_i < a->nargs) v = a->args[auto_i];
            auto_i++;
        } else if (key[0] >= '0' && key[0] <= '9') {
            size_t idx = (size_t)atoi(key);
            if (idx < a->nargs) v = a->args[idx];
        } else {
            for (size_t k = 0; k < a->nkw; k++)
                if (!strcmp(a->kwn[k], key)) v = a->kwv[k];
        }
        if (missing(v)) {
            exo_free(b.p);
            return jinja_fail(c, EXO_EINVAL, "format: missing argument '%s'", key);
        }
        jv_to_str(&b, v);
        i = e;
    }
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

/* ---- methods ----------------------------------------------------------- */

typedef int (*method_fn)(jinja_ctx *c, jv self, const jargs *a, jv *out);

#define METHOD(name) static int m_##name(jinja_ctx *c, jv self, const jargs *a, jv *out)

static int need_str(jinja_ctx *c, jv v, const char *what)
{
    if (v.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "%s: expected a string, got %s", what, jv_type_name(v));
    return 0;
}

static bool str_affix(jv s, jv x, bool suffix)
{
    if (x.type != JV_STRING || x.u.s->len > s.u.s->len)
        return false;
    const char *p = suffix ? s.u.s->data + s.u.s->len - x.u.s->len : s.u.s->data;
    return !memcmp(p, x.u.s->data, x.u.s->len);
}

static int affix(jinja_ctx *c, jv self, const jargs *a, jv *out, bool suffix)
{
    jv x = A(a, 0, NULL);
    if (x.type == JV_LIST && x.u.l->tuple) {
        bool r = false;
        for (size_t i = 0; i < x.u.l->len; i++)
            r = r || str_affix(self, x.u.l->items[i], suffix);
        *out = jv_bool(r);
        return 0;
    }
    if (x.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "%s first arg must be str or a tuple of str, not %s",
                          suffix ? "endswith" : "startswith", jv_type_name(x));
    *out = jv_bool(str_affix(self, x, suffix));
    return 0;
}

METHOD(startswith) { return affix(c, self, a, out, false); }
METHOD(endswith) { return affix(c, self, a, out, true); }

static int strip_m(jinja_ctx *c, jv self, const jargs *a, jv *out, int which)
{
    jv ch = A(a, 0, "chars");
    if (given(ch) && ch.type != JV_STRING && ch.type != JV_NONE)
        return jinja_fail(c, EXO_EINVAL, "strip arg must be None or str");
    *out = do_strip(self, ch, which);
    return 0;
}
METHOD(strip) { return strip_m(c, self, a, out, 3); }
METHOD(lstrip) { return strip_m(c, self, a, out, 1); }
METHOD(rstrip) { return strip_m(c, self, a, out, 2); }

static int split_m(jinja_ctx *c, jv self, const jargs *a, jv *out, bool right)
{
    jv sep = A(a, 0, "sep");
    int64_t mx;
    int rc = as_int(c, A(a, 1, "maxsplit"), -1, &mx);
    if (rc)
        return rc;
    if (sep.type == JV_STRING && sep.u.s->len == 0)
        return jinja_fail(c, EXO_EINVAL, "empty separator");
    if (given(sep) && sep.type != JV_STRING && sep.type != JV_NONE)
        return jinja_fail(c, EXO_EINVAL, "must be str or None, not %s", jv_type_name(sep));
    *out = do_split(self, sep, mx, right);
    return 0;
}
METHOD(split) { return split_m(c, self, a, out, false); }
METHOD(rsplit) { return split_m(c, self, a, out, true); }

METHOD(splitlines)
{
    const char *p = self.u.s->data;
    size_t n = self.u.s->len, st = 0;
    bool keep = as_bool(A(a, 0, "keepends"), false);
    jv l = jv_list_new(4);
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f' || ch == 0x1c || ch == 0x1d || ch == 0x1e) {
            size_t e = i;
            if (ch == '\r' && i + 1 < n && p[i + 1] == '\n')
                i++;
            jv_list_push(l, jv_str_new(p + st, (keep ? i + 1 : e) - st));
            st = i + 1;
        }
    }
    if (st < n)
        jv_list_push(l, jv_str_new(p + st, n - st));
    *out = l;
    return 0;
}

METHOD(replace)
{
    jv o = A(a, 0, "old"), nw = A(a, 1, "new");
    int64_t cnt;
    int rc = as_int(c, A(a, 2, "count"), -1, &cnt);
    if (rc)
        return rc;
    if (o.type != JV_STRING || nw.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "replace() arguments must be str");
    if (o.u.s->len == 0 && (self.u.s->len + 1) * nw.u.s->len > c->max_output)
        return jinja_fail(c, EXO_ETOOBIG, "string too large");
    if (o.u.s->len && nw.u.s->len > o.u.s->len &&
        self.u.s->len / o.u.s->len * nw.u.s->len + self.u.s->len > c->max_output)
        return jinja_fail(c, EXO_ETOOBIG, "string too large");
    *out = do_replace(self, o, nw, cnt);
    return 0;
}

METHOD(upper) { *out = do_case(self, CASE_UPPER); return 0; }
METHOD(lower) { *out = do_case(self, CASE_LOWER); return 0; }
METHOD(title) { *out = do_case(self, CASE_TITLE); return 0; }
METHOD(capitalize) { *out = do_case(self, CASE_CAPITALIZE); return 0; }

static int find_m(jinja_ctx *c, jv self, const jargs *a, jv *out, bool right, bool raise)
{
    jv x = A(a, 0, "sub");
    if (need_str(c, x, "find"))
        return EXO_EINVAL;
    const char *p = self.u.s->data;
    size_t n = self.u.s->len, xn = x.u.s->len;
    int64_t pos = -1;
    if (xn <= n) {
        if (!right) {
            const char *h = memmem(p, n, x.u.s->data, xn);
            if (h) pos = (int64_t)jv_utf8_len(p, (size_t)(h - p));
        } else {
            for (size_t st = n - xn + 1; st-- > 0;)
                if (!memcmp(p + st, x.u.s->data, xn)) { pos = (int64_t)jv_utf8_len(p, st); break; }
        }
    }
    if (pos < 0 && raise)
        return jinja_fail(c, EXO_EINVAL, "substring not found");
    *out = jv_int(pos);
    return 0;
}
METHOD(find) { return find_m(c, self, a, out, false, false); }
METHOD(rfind) { return find_m(c, self, a, out, true, false); }
METHOD(sindex) { return find_m(c, self, a, out, false, true); }

METHOD(scount)
{
    jv x = A(a, 0, "sub");
    if (need_str(c, x, "count"))
        return EXO_EINVAL;
    const char *p = self.u.s->data;
    size_t n = self.u.s->len, xn = x.u.s->len;
    if (xn == 0) { *out = jv_int((int64_t)jv_utf8_len(p, n) + 1); return 0; }
    int64_t k = 0;
    for (size_t i = 0; i + xn <= n;) {
        const char *h = memmem(p + i, n - i, x.u.s->data, xn);
        if (!h) break;
        k++;
        i = (size_t)(h - p) + xn;
    }
    *out = jv_int(k);
    return 0;
}

METHOD(sjoin)
{
    jv items;
    int rc = jinja_iter_list(c, A(a, 0, "iterable"), &items);
    if (rc)
        return rc;
    jbuf b = {0};
    for (size_t i = 0; i < items.u.l->len; i++) {
        if (items.u.l->items[i].type != JV_STRING) {
            exo_free(b.p);
            jv_unref(items);
            return jinja_fail(c, EXO_EINVAL, "sequence item %zu: expected str instance", i);
        }
        if (i)
            jbuf_put(&b, self.u.s->data, self.u.s->len);
        jbuf_put(&b, items.u.l->items[i].u.s->data, items.u.l->items[i].u.s->len);
    }
    jv_unref(items);
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

METHOD(sformat) { return str_format(c, self, a, out); }

static int str_pred(jv self, jv *out, int kind)
{
    const char *p = self.u.s->data;
    size_t n = self.u.s->len;
    bool r = n > 0, any_cased = false;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += u8dec(p, n, i, &cp);
        switch (kind) {
        case 0: r = r && py_digit(cp); break;
        case 1: r = r && py_alpha(cp); break;
        case 2: r = r && (py_alpha(cp) || py_digit(cp)); break;
        case 3: r = r && py_space(cp); break;
        case 4:
        case 5:
            if (utf8proc_category(cp) == (kind == 4 ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL))
                r = false;
            if (py_cased_letter(cp))
                any_cased = true;
            break;
        default: break;
        }
    }
    if (kind >= 4)
        r = r && any_cased;
    *out = jv_bool(r);
    return 0;
}
METHOD(isdigit) { return str_pred(self, out, 0); }
METHOD(isalpha) { return str_pred(self, out, 1); }
METHOD(isalnum) { return str_pred(self, out, 2); }
METHOD(isspace) { return str_pred(self, out, 3); }
METHOD(islower) { return str_pred(self, out, 4); }
METHOD(isupper) { return str_pred(self, out, 5); }

METHOD(removeprefix)
{
    jv x = A(a, 0, NULL);
    if (need_str(c, x, "removeprefix"))
        return EXO_EINVAL;
    if (str_affix(self, x, false))
        *out = jv_str_new(self.u.s->data + x.u.s->len, self.u.s->len - x.u.s->len);
    else
        *out = jv_ref(self);
    return 0;
}

METHOD(removesuffix)
{
    jv x = A(a, 0, NULL);
    if (need_str(c, x, "removesuffix"))
        return EXO_EINVAL;
    if (str_affix(self, x, true) && x.u.s->len)
        *out = jv_str_new(self.u.s->data, self.u.s->len - x.u.s->len);
    else
        *out = jv_ref(self);
    return 0;
}

METHOD(items)
{
    jv l = jv_list_new(self.u.d->len);
    for (size_t i = 0; i < self.u.d->len; i++) {
        jv t = jv_list_new(2);
        t.u.l->tuple = true;
        jv_list_push(t, jv_ref(self.u.d->keys[i]));
        jv_list_push(t, jv_ref(self.u.d->vals[i]));
        jv_list_push(l, t);
    }
    *out = l;
    return 0;
}

METHOD(keys)
{
    jv l = jv_list_new(self.u.d->len);
    for (size_t i = 0; i < self.u.d->len; i++)
        jv_list_push(l, jv_ref(self.u.d->keys[i]));
    *out = l;
    return 0;
}

METHOD(values)
{
    jv l = jv_list_new(self.u.d->len);
    for (size_t i = 0; i < self.u.d->len; i++)
        jv_list_push(l, jv_ref(self.u.d->vals[i]));
    *out = l;
    return 0;
}

METHOD(get)
{
    jv v, def = A(a, 1, "default");
    if (jv_dict_get(self, A(a, 0, "key"), &v))
        *out = jv_ref(v);
    else
        *out = missing(def) ? jv_none() : jv_ref(def);
    return 0;
}

METHOD(lindex)
{
    jv x = A(a, 0, NULL);
    for (size_t i = 0; i < self.u.l->len; i++)
        if (jv_equal(self.u.l->items[i], x)) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return jinja_fail(c, EXO_EINVAL, "value is not in list");
}

METHOD(lcount)
{
    jv x = A(a, 0, NULL);
    int64_t k = 0;
    for (size_t i = 0; i < self.u.l->len; i++)
        k += jv_equal(self.u.l->items[i], x);
    *out = jv_int(k);
    return 0;
}

typedef struct method_def { const char *name; method_fn fn; } method_def;

static const method_def str_methods[] = {
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"strip", m_strip}, {"lstrip", m_lstrip},
    {"rstrip", m_rstrip}, {"split", m_split}, {"rsplit", m_rsplit}, {"splitlines", m_splitlines},
    {"replace", m_replace}, {"upper", m_upper}, {"lower", m_lower}, {"title", m_title},
    {"capitalize", m_capitalize}, {"find", m_find}, {"rfind", m_rfind}, {"index", m_sindex},
    {"count", m_scount}, {"join", m_sjoin}, {"format", m_sformat}, {"isdigit", m_isdigit},
    {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace}, {"islower", m_islower},
    {"isupper", m_isupper}, {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix},
    {NULL, NULL},
};
static const method_def dict_methods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"get", m_get}, {NULL, NULL},
};
static const method_def list_methods[] = {
    {"index", m_lindex}, {"count", m_lcount}, {NULL, NULL},
};

/* Bound methods carry their implementation in a tiny table index. */
static int call_method(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                       const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out);

typedef struct bound { jv_builtin_fn fn; method_fn m; } bound;

static const method_def *find_method(jv obj, const char *name)
{
    const method_def *t = obj.type == JV_STRING ? str_methods
                        : (obj.type == JV_DICT && !obj.u.d->ns) ? dict_methods
                        : obj.type == JV_LIST ? list_methods : NULL;
    if (!t)
        return NULL;
    for (; t->name; t++)
        if (!strcmp(t->name, name))
            return t;
    return NULL;
}

bool jinja_get_method(jv obj, const char *name, jv *out)
{
    const method_def *m = find_method(obj, name);
    if (!m)
        return false;
    jv f = jv_func_new(JF_BUILTIN, m->name);
    f.u.fn->fn = call_method;
    /* self holds (receiver, method index) as a 2-tuple */
    jv pair = jv_list_new(2);
    pair.u.l->tuple = true;
    jv_list_push(pair, jv_ref(obj));
    jv_list_push(pair, jv_int((int64_t)(uintptr_t)m));
    f.u.fn->self = pair;
    *out = f;
    return true;
}

static int call_method(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                       const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    jv recv = self.u.l->items[0];
    const method_def *m = (const method_def *)(uintptr_t)self.u.l->items[1].u.i;
    jargs a = {args, nargs, kwnames, kwvals, nkw};
    return m->fn(c, recv, &a, out);
}

/* ---- filters ----------------------------------------------------------- */

typedef int (*filter_fn)(jinja_ctx *c, jv v, const jargs *a, jv *out);
#define FILTER(name) static int f_##name(jinja_ctx *c, jv v, const jargs *a, jv *out)

static int str_arg(jinja_ctx *c, jv v, jv *out) /* filters that coerce to str */
{
    if (v.type == JV_UNDEFINED) {
        *out = jv_str_new("", 0);
        return 0;
    }
    *out = to_string(v);
    return 0;
}

FILTER(trim)
{
    jv s;
    str_arg(c, v, &s);
    jv ch = A(a, 0, "chars");
    *out = do_strip(s, ch, 3);
    jv_unref(s);
    return 0;
}

#define STR_FILTER(name, expr)                     \
    FILTER(name)                                   \
    {                                              \
        jv s;                                      \
        str_arg(c, v, &s);                         \
        *out = expr;                               \
        jv_unref(s);                               \
        return 0;                                  \
    }
STR_FILTER(upper, do_case(s, CASE_UPPER))
STR_FILTER(lower, do_case(s, CASE_LOWER))
STR_FILTER(title, do_case(s, CASE_JTITLE))
STR_FILTER(capitalize, do_case(s, CASE_CAPITALIZE))
STR_FILTER(string, jv_ref(s))

FILTER(safe) { *out = jv_ref(v); return 0; }

FILTER(escape)
{
    jv s;
    str_arg(c, v, &s);
    jbuf b = {0};
    for (size_t i = 0; i < s.u.s->len; i++) {
        char ch = s.u.s->data[i];
        switch (ch) {
        case '&': jbuf_puts(&b, "&amp;"); break;
        case '<': jbuf_puts(&b, "&lt;"); break;
        case '>': jbuf_puts(&b, "&gt;"); break;
        case '"': jbuf_puts(&b, "&#34;"); break;
        case '\'': jbuf_puts(&b, "&#39;"); break;
        default: jbuf_putc(&b, ch);
        }
    }
    jv_unref(s);
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

FILTER(length)
{
    switch (v.type) {
    case JV_STRING: *out = jv_int((int64_t)jv_utf8_len(v.u.s->data, v.u.s->len)); return 0;
    case JV_LIST: *out = jv_int((int64_t)v.u.l->len); return 0;
    case JV_DICT: if (!v.u.d->ns) { *out = jv_int((int64_t)v.u.d->len); return 0; } break;
    case JV_UNDEFINED: *out = jv_int(0); return 0;
    default: break;
    }
    return jinja_fail(c, EXO_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}

FILTER(default)
{
    jv d = A(a, 0, "default_value");
    bool boolean = as_bool(A(a, 1, "boolean"), false);
    if (v.type == JV_UNDEFINED || (boolean && !jv_truthy(v)))
        *out = missing(d) ? jv_str_new("", 0) : jv_ref(d);
    else
        *out = jv_ref(v);
    return 0;
}

FILTER(tojson)
{
    bool ensure_ascii = as_bool(A(a, 0, "ensure_ascii"), false);
    jv ind = A(a, 1, "indent"), seps = A(a, 2, "separators");
    bool sort_keys = as_bool(A(a, 3, "sort_keys"), false);
    char indent_buf[64];
    const char *indent = NULL;
    if (ind.type == JV_INT || ind.type == JV_BOOL) {
        int64_t k = ind.type == JV_BOOL ? ind.u.b : ind.u.i;
        if (k < 0) k = 0;
        if (k > 32) k = 32;
        memset(indent_buf, ' ', (size_t)k);
        indent_buf[k] = 0;
        indent = indent_buf;
    } else if (ind.type == JV_STRING) {
        indent = ind.u.s->data;
    } else if (given(ind) && ind.type != JV_NONE) {
        return jinja_fail(c, EXO_EINVAL, "tojson: bad indent");
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (seps.type == JV_LIST && seps.u.l->len == 2 && seps.u.l->items[0].type == JV_STRING &&
        seps.u.l->items[1].type == JV_STRING) {
        item_sep = seps.u.l->items[0].u.s->data;
        key_sep = seps.u.l->items[1].u.s->data;
    }
    jbuf b = {0};
    int rc = jv_to_json(&b, v, ensure_ascii, indent, item_sep, key_sep, sort_keys, 0);
    if (rc) {
        exo_free(b.p);
        return jinja_fail(c, EXO_EINVAL, "Object of type %s is not JSON serializable",
                          v.type == JV_UNDEFINED ? "Undefined" : "(nested value)");
    }
    *out = jbuf_to_str(&b);
    return 0;
}

static int attr_path(jinja_ctx *c, jv item, jv attr, jv *out) /* borrowed out */
{
    /* jinja's make_attrgetter: dotted paths, integer parts index lists */
    if (attr.type == JV_INT) {
        if (item.type == JV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < item.u.l->len) {
            *out = item.u.l->items[attr.u.i];
            return 0;
        }
        *out = jv_undef();
        return 0;
    }
    if (attr.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "attribute must be a string");
    const char *p = attr.u.s->data;
    jv cur = item;
    while (1) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        jv nx = jv_undef();
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++)
            if (p[i] < '0' || p[i] > '9')
                digits = false;
        if (cur.type == JV_DICT) {
            if (!jv_dict_get_str(cur, p, n, &nx))
                nx = jv_undef();
        } else if (cur.type == JV_LIST && digits) {
            size_t idx = (size_t)atol(p);
            if (idx < cur.u.l->len)
                nx = cur.u.l->items[idx];
        }
        cur = nx;
        if (!dot || cur.type == JV_UNDEFINED)
            break;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

FILTER(join)
{
    jv sep = A(a, 0, "d"), attr = A(a, 1, "attribute");
    jv items;
    int rc = jinja_iter_list(c, v, &items);
    if (rc)
        return rc;
    jbuf b = {0};
    for (size_t i = 0; i < items.u.l->len; i++) {
        if (i && sep.type == JV_STRING)
            jbuf_put(&b, sep.u.s->data, sep.u.s->len);
        else if (i && given(sep))
            jv_to_str(&b, sep);
        jv it = items.u.l->items[i];
        if (given(attr) && (rc = attr_path(c, it, attr, &it)))
            break;
        jv_to_str(&b, it);
        if (b.len > c->max_output) {
            rc = jinja_fail(c, EXO_ETOOBIG, "string too large");
            break;
        }
    }
    jv_unref(items);
    if (rc) {
        exo_free(b.p);
        return rc;
    }
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

FILTER(items)
{
    if (v.type == JV_UNDEFINED) {
        *out = jv_list_new(0);
        return 0;
    }
    if (v.type != JV_DICT || v.u.d->ns)
        return jinja_fail(c, EXO_EINVAL, "Can only get item pairs from a mapping.");
    return m_items(c, v, a, out);
}

FILTER(list)
{
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv r = jv_list_new(l.u.l->len);
    for (size_t i = 0; i < l.u.l->len; i++)
        jv_list_push(r, jv_ref(l.u.l->items[i]));
    jv_unref(l);
    *out = r;
    return 0;
}

FILTER(first)
{
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    *out = l.u.l->len ? jv_ref(l.u.l->items[0]) : jv_undef();
    jv_unref(l);
    return 0;
}

FILTER(last)
{
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    *out = l.u.l->len ? jv_ref(l.u.l->items[l.u.l->len - 1]) : jv_undef();
    jv_unref(l);
    return 0;
}

FILTER(reverse)
{
    if (v.type == JV_STRING) {
        const char *p = v.u.s->data;
        size_t n = v.u.s->len;
        jbuf b = {0};
        size_t e = n;
        while (e > 0) {
            size_t st = e - 1;
            while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            jbuf_put(&b, p + st, e - st);
            e = st;
        }
        if (!b.p)
            jbuf_put(&b, "", 0);
        *out = jbuf_to_str(&b);
        return 0;
    }
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv r = jv_list_new(l.u.l->len);
    for (size_t i = l.u.l->len; i > 0; i--)
        jv_list_push(r, jv_ref(l.u.l->items[i - 1]));
    jv_unref(l);
    *out = r;
    return 0;
}

FILTER(abs)
{
    if (v.type == JV_INT) {
        if (v.u.i == INT64_MIN)
            return jinja_fail(c, EXO_ERANGE, "integer overflow");
        *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    } else if (v.type == JV_FLOAT) {
        *out = jv_float(fabs(v.u.f));
    } else if (v.type == JV_BOOL) {
        *out = jv_int(v.u.b);
    } else {
        return jinja_fail(c, EXO_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    return 0;
}

FILTER(int)
{
    jv def = A(a, 0, "default");
    int64_t base;
    int rc = as_int(c, A(a, 1, "base"), 10, &base);
    if (rc)
        return rc;
    jv d = missing(def) ? jv_int(0) : def;
    if (v.type == JV_INT) { *out = v; return 0; }
    if (v.type == JV_BOOL) { *out = jv_int(v.u.b); return 0; }
    if (v.type == JV_FLOAT) {
        if (isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) { *out = jv_int((int64_t)v.u.f); return 0; }
        *out = jv_ref(d);
        return 0;
    }
    if (v.type == JV_STRING) {
        jv t = do_strip(v, jv_undef(), 3);
        char *end;
        const char *s = t.u.s->data;
        if (base < 2 || base > 36) base = 10;
        errno = 0;
        long long x = strtoll(s, &end, (int)base);
        if (*s && !*end && errno == 0) {
            jv_unref(t);
            *out = jv_int(x);
            return 0;
        }
        double f = strtod(s, &end);
        bool ok = *s && !*end && isfinite(f) && fabs(f) < 9.2e18;
        jv_unref(t);
        *out = ok ? jv_int((int64_t)f) : jv_ref(d);
        return 0;
    }
    *out = jv_ref(d);
    return 0;
}

FILTER(float)
{
    jv def = A(a, 0, "default");
    jv d = missing(def) ? jv_float(0.0) : def;
    if (v.type == JV_INT || v.type == JV_BOOL || v.type == JV_FLOAT) {
        *out = jv_float(jv_as_double(v));
        return 0;
    }
    if (v.type == JV_STRING) {
        jv t = do_strip(v, jv_undef(), 3);
        char *end;
        double f = strtod(t.u.s->data, &end);
        bool ok = t.u.s->len && !*end;
        jv_unref(t);
        *out = ok ? jv_float(f) : jv_ref(d);
        return 0;
    }
    *out = jv_ref(d);
    return 0;
}

FILTER(round)
{
    int64_t prec;
    int rc = as_int(c, A(a, 0, "precision"), 0, &prec);
    if (rc)
        return rc;
    jv method = A(a, 1, "method");
    const char *m = method.type == JV_STRING ? method.u.s->data : "common";
    if (!jv_is_number(v))
        return jinja_fail(c, EXO_EINVAL, "round: expected a number");
    double x = jv_as_double(v), p = pow(10.0, (double)prec), r;
    if (!strcmp(m, "common"))
        r = nearbyint(x * p) / p;
    else if (!strcmp(m, "ceil"))
        r = ceil(x * p) / p;
    else if (!strcmp(m, "floor"))
        r = floor(x * p) / p;
    else
        return jinja_fail(c, EXO_EINVAL, "method must be common, ceil or floor");
    if (v.type != JV_FLOAT && !strcmp(m, "common"))
        *out = jv_int((int64_t)r);
    else
        *out = jv_float(r);
    return 0;
}

FILTER(indent)
{
    jv w = A(a, 0, "width");
    bool first = as_bool(A(a, 1, "first"), false), blank = as_bool(A(a, 2, "blank"), false);
    jbuf ind = {0};
    if (w.type == JV_STRING) {
        jbuf_put(&ind, w.u.s->data, w.u.s->len);
    } else {
        int64_t k;
        int rc = as_int(c, w, 4, &k);
        if (rc)
            return rc;
        if (k > 1024) k = 1024;
        for (int64_t i = 0; i < k; i++)
            jbuf_putc(&ind, ' ');
    }
    if (!ind.p)
        jbuf_put(&ind, "", 0);
    jv s;
    str_arg(c, v, &s);
    jbuf tmp = {0};
    jbuf_put(&tmp, s.u.s->data, s.u.s->len);
    jbuf_putc(&tmp, '\n');
    jv_unref(s);
    jv full = jbuf_to_str(&tmp), lines;
    jargs none = {0};
    m_splitlines(c, full, &none, &lines);
    jv_unref(full);
    jbuf b = {0};
    if (first)
        jbuf_put(&b, ind.p, ind.len);
    for (size_t i = 0; i < lines.u.l->len; i++) {
        jv ln = lines.u.l->items[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if (blank || ln.u.s->len)
                jbuf_put(&b, ind.p, ind.len);
        }
        jbuf_put(&b, ln.u.s->data, ln.u.s->len);
        if (b.len > c->max_output)
            break;
    }
    jv_unref(lines);
    exo_free(ind.p);
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

FILTER(replace)
{
    jv s;
    str_arg(c, v, &s);
    int rc = m_replace(c, s, a, out);
    jv_unref(s);
    return rc;
}

FILTER(format)
{
    if (v.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "format: expected a string");
    if (a->nargs == 1 && a->args[0].type == JV_LIST && a->args[0].u.l->tuple)
        return py_format(c, v, a->args[0].u.l->items, a->args[0].u.l->len, out);
    return py_format(c, v, a->args, a->nargs, out);
}

FILTER(wordcount)
{
    jv s, l;
    str_arg(c, v, &s);
    l = do_split(s, jv_undef(), -1, false);
    *out = jv_int((int64_t)l.u.l->len);
    jv_unref(l);
    jv_unref(s);
    return 0;
}

FILTER(center)
{
    int64_t w;
    int rc = as_int(c, A(a, 0, "width"), 80, &w);
    if (rc)
        return rc;
    jv s;
    str_arg(c, v, &s);
    int64_t n = (int64_t)jv_utf8_len(s.u.s->data, s.u.s->len);
    if (w > 100000) w = 100000;
    jbuf b = {0};
    if (w <= n) {
        jbuf_put(&b, s.u.s->data, s.u.s->len);
    } else {
        int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
        for (int64_t i = 0; i < left; i++) jbuf_putc(&b, ' ');
        jbuf_put(&b, s.u.s->data, s.u.s->len);
        for (int64_t i = 0; i < pad - left; i++) jbuf_putc(&b, ' ');
    }
    jv_unref(s);
    if (!b.p) jbuf_put(&b, "", 0);
    *out = jbuf_to_str(&b);
    return 0;
}

/* sort key comparison: case-insensitive unless asked */
static int cmp_key(jinja_ctx *c, jv x, jv y, bool cs, int *r)
{
    if (!cs && x.type == JV_STRING && y.type == JV_STRING) {
        jv lx = do_case(x, CASE_LOWER), ly = do_case(y, CASE_LOWER);
        int rc = jv_compare(lx, ly, r);
        jv_unref(lx);
        jv_unref(ly);
        return rc;
    }
    if (jv_compare(x, y, r))
        return jinja_fail(c, EXO_EINVAL, "'<' not supported between instances of '%s' and '%s'",
                          jv_type_name(x), jv_type_name(y));
    return 0;
}

/* stable merge-free insertion sort of items by keys (small lists) */
static int sort_by(jinja_ctx *c, jv items, jv keys, bool cs, bool reverse)
{
    size_t n = items.u.l->len;
    for (size_t i = 1; i < n; i++) {
        jv it = items.u.l->items[i], k = keys.u.l->items[i];
        size_t j = i;
        while (j > 0) {
            int r;
            int rc = cmp_key(c, keys.u.l->items[j - 1], k, cs, &r);
            if (!rc && (c->steps += 1) > c->max_steps)
                rc = jinja_fail(c, EXO_ETOOBIG, "evaluation step limit exceeded");
            if (rc) { /* slot j is the hole: refill it so the list stays a permutation */
                items.u.l->items[j] = it;
                keys.u.l->items[j] = k;
                return rc;
            }
            if (reverse ? r >= 0 : r <= 0)
                break;
            items.u.l->items[j] = items.u.l->items[j - 1];
            keys.u.l->items[j] = keys.u.l->items[j - 1];
            j--;
        }
        items.u.l->items[j] = it;
        keys.u.l->items[j] = k;
    }
    return 0;
}

FILTER(sort)
{
    bool reverse = as_bool(A(a, 0, "reverse"), false), cs = as_bool(A(a, 1, "case_sensitive"), false);
    jv attr = A(a, 2, "attribute");
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv items = jv_list_new(l.u.l->len), keys = jv_list_new(l.u.l->len);
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i], k = it;
        if (given(attr))
            rc = attr_path(c, it, attr, &k);
        jv_list_push(items, jv_ref(it));
        jv_list_push(keys, jv_ref(k));
    }
    jv_unref(l);
    if (!rc)
        rc = sort_by(c, items, keys, cs, reverse);
    jv_unref(keys);
    if (rc) {
        jv_unref(items);
        return rc;
    }
    *out = items;
    return 0;
}

FILTER(dictsort)
{
    bool cs = as_bool(A(a, 0, "case_sensitive"), false);
    jv by = A(a, 1, "by");
    bool reverse = as_bool(A(a, 2, "reverse"), false);
    if (v.type != JV_DICT || v.u.d->ns)
        return jinja_fail(c, EXO_EINVAL, "dictsort: expected a mapping");
    bool by_value = by.type == JV_STRING && !strcmp(by.u.s->data, "value");
    jv items, keys = jv_list_new(v.u.d->len);
    m_items(c, v, a, &items);
    for (size_t i = 0; i < v.u.d->len; i++)
        jv_list_push(keys, jv_ref(by_value ? v.u.d->vals[i] : v.u.d->keys[i]));
    int rc = sort_by(c, items, keys, cs, reverse);
    jv_unref(keys);
    if (rc) {
        jv_unref(items);
        return rc;
    }
    *out = items;
    return 0;
}

FILTER(unique)
{
    bool cs = as_bool(A(a, 0, "case_sensitive"), false);
    jv attr = A(a, 1, "attribute");
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv r = jv_list_new(l.u.l->len), seen = jv_list_new(l.u.l->len);
    r.u.l->gen = true;
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i], k = it;
        if (given(attr) && (rc = attr_path(c, it, attr, &k)))
            break;
        jv key = (!cs && k.type == JV_STRING) ? do_case(k, CASE_LOWER) : jv_ref(k);
        bool dup = false;
        for (size_t j = 0; j < seen.u.l->len && !dup; j++)
            dup = jv_equal(seen.u.l->items[j], key);
        if (!dup) {
            jv_list_push(seen, key);
            jv_list_push(r, jv_ref(it));
        } else {
            jv_unref(key);
        }
    }
    jv_unref(seen);
    jv_unref(l);
    if (rc) {
        jv_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

static int minmax(jinja_ctx *c, jv v, const jargs *a, jv *out, bool want_max)
{
    bool cs = as_bool(A(a, 0, "case_sensitive"), false);
    jv attr = A(a, 1, "attribute");
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv best = jv_undef(), bestk = jv_undef();
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i], k = it;
        if (given(attr) && (rc = attr_path(c, it, attr, &k)))
            break;
        int r = 0;
        if (i == 0 || (!(rc = cmp_key(c, k, bestk, cs, &r)) && (want_max ? r > 0 : r < 0))) {
            best = it;
            bestk = k;
        }
    }
    if (!rc)
        *out = jv_ref(best);
    jv_unref(l);
    return rc;
}
FILTER(max) { return minmax(c, v, a, out, true); }
FILTER(min) { return minmax(c, v, a, out, false); }

FILTER(sum)
{
    jv attr = A(a, 0, "attribute"), start = A(a, 1, "start");
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv acc = missing(start) ? jv_int(0) : jv_ref(start);
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i];
        if (given(attr) && (rc = attr_path(c, it, attr, &it)))
            break;
        if (!jv_is_number(it) || !jv_is_number(acc)) {
            rc = jinja_fail(c, EXO_EINVAL, "sum: unsupported operand types");
            break;
        }
        if (acc.type == JV_FLOAT || it.type == JV_FLOAT)
            acc = jv_float(jv_as_double(acc) + jv_as_double(it));
        else {
            int64_t r;
            if (__builtin_add_overflow(acc.type == JV_BOOL ? acc.u.b : acc.u.i,
                                       it.type == JV_BOOL ? it.u.b : it.u.i, &r))
                rc = jinja_fail(c, EXO_ERANGE, "integer overflow");
            acc = jv_int(r);
        }
    }
    jv_unref(l);
    if (rc) {
        jv_unref(acc);
        return rc;
    }
    *out = acc;
    return 0;
}

FILTER(attr)
{
    jv name = A(a, 0, "name");
    if (name.type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "attr: name must be a string");
    if (jinja_get_method(v, name.u.s->data, out))
        return 0;
    jv r;
    if (v.type == JV_DICT && v.u.d->ns && jv_dict_get(v, name, &r)) {
        *out = jv_ref(r);
        return 0;
    }
    *out = jv_undef();
    return 0;
}

/* select/reject(test, args...), selectattr/rejectattr(attr, test, args...) */
static int select_impl(jinja_ctx *c, jv v, const jargs *a, jv *out, bool by_attr, bool want)
{
    size_t off = by_attr ? 1 : 0;
    jv attr = by_attr ? A(a, 0, NULL) : jv_undef();
    jv test = A(a, off, NULL);
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv r = jv_list_new(l.u.l->len);
    r.u.l->gen = true;
    const jv *targs = a->nargs > off + 1 ? a->args + off + 1 : NULL;
    size_t ntargs = a->nargs > off + 1 ? a->nargs - off - 1 : 0;
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i], k = it;
        if (by_attr && (rc = attr_path(c, it, attr, &k)))
            break;
        bool t;
        if (missing(test))
            t = jv_truthy(k);
        else if (test.type != JV_STRING)
            rc = jinja_fail(c, EXO_EINVAL, "test name must be a string");
        else
            rc = jinja_apply_test(c, test.u.s->data, k, targs, ntargs, &t);
        if (!rc && t == want)
            jv_list_push(r, jv_ref(it));
    }
    jv_unref(l);
    if (rc) {
        jv_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}
FILTER(select) { return select_impl(c, v, a, out, false, true); }
FILTER(reject) { return select_impl(c, v, a, out, false, false); }
FILTER(selectattr) { return select_impl(c, v, a, out, true, true); }
FILTER(rejectattr) { return select_impl(c, v, a, out, true, false); }

FILTER(map)
{
    jv l;
    int rc = jinja_iter_list(c, v, &l);
    if (rc)
        return rc;
    jv attr = A(a, 99, "attribute"), def = A(a, 99, "default");
    jv r = jv_list_new(l.u.l->len);
    r.u.l->gen = true;
    for (size_t i = 0; i < l.u.l->len && !rc; i++) {
        jv it = l.u.l->items[i], res;
        if (given(attr)) {
            jv k;
            rc = attr_path(c, it, attr, &k);
            if (!rc)
                res = (k.type == JV_UNDEFINED && given(def)) ? jv_ref(def) : jv_ref(k);
        } else {
            jv fname = A(a, 0, NULL);
            if (fname.type != JV_STRING) {
                rc = jinja_fail(c, EXO_EINVAL, "map: expected a filter name or attribute=");
                break;
            }
            size_t nkw = 0;
            rc = jinja_apply_filter(c, fname.u.s->data, it, a->args + 1, a->nargs ? a->nargs - 1 : 0,
                                    a->kwn, a->kwv, nkw, &res);
        }
        if (!rc)
            jv_list_push(r, res);
    }
    jv_unref(l);
    if (rc) {
        jv_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

FILTER(batch)
{
    int64_t n;
    int rc = as_int(c, A(a, 0, "linecount"), 1, &n);
    if (rc)
        return rc;
    if (n <= 0)
        return jinja_fail(c, EXO_EINVAL, "batch: size must be positive");
    jv fill = A(a, 1, "fill_with");
    jv l;
    if ((rc = jinja_iter_list(c, v, &l)))
        return rc;
    jv r = jv_list_new(4), cur = jv_list_new((size_t)(n < 64 ? n : 64));
    for (size_t i = 0; i < l.u.l->len; i++) {
        jv_list_push(cur, jv_ref(l.u.l->items[i]));
        if ((int64_t)cur.u.l->len == n) {
            jv_list_push(r, cur);
            cur = jv_list_new((size_t)(n < 64 ? n : 64));
        }
    }
    if (cur.u.l->len) {
        if (given(fill))
            while ((int64_t)cur.u.l->len < n)
                jv_list_push(cur, jv_ref(fill));
        jv_list_push(r, cur);
    } else {
        jv_unref(cur);
    }
    jv_unref(l);
    *out = r;
    return 0;
}

typedef struct filter_def { const char *name; filter_fn fn; } filter_def;
static const filter_def filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
    {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr},
    {"sort", f_sort}, {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson},
    {"trim", f_trim}, {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
    {NULL, NULL},
};

bool jinja_has_filter(const char *name)
{
    for (const filter_def *f = filters; f->name; f++)
        if (!strcmp(f->name, name))
            return true;
    return false;
}

int jinja_apply_filter(jinja_ctx *c, const char *name, jv val, const jv *args, size_t nargs,
                       const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    for (const filter_def *f = filters; f->name; f++)
        if (!strcmp(f->name, name)) {
            jargs a = {args, nargs, kwnames, kwvals, nkw};
            /* filters other than default/length/first... see through
             * Undefined as jinja does (str(Undefined) is ""); those that
             * need a real value report it */
            return f->fn(c, val, &a, out);
        }
    return jinja_fail(c, EXO_EINVAL, "no filter named '%s'", name);
}

/* ---- tests ------------------------------------------------------------- */

int jinja_apply_test(jinja_ctx *c, const char *name, jv v, const jv *args, size_t nargs, bool *out)
{
    jv x = nargs ? args[0] : jv_undef();
#define IS(s) (!strcmp(name, s))
    if (IS("defined")) *out = v.type != JV_UNDEFINED;
    else if (IS("undefined")) *out = v.type == JV_UNDEFINED;
    else if (IS("none")) *out = v.type == JV_NONE;
    else if (IS("boolean")) *out = v.type == JV_BOOL;
    else if (IS("true")) *out = v.type == JV_BOOL && v.u.b;
    else if (IS("false")) *out = v.type == JV_BOOL && !v.u.b;
    else if (IS("integer")) *out = v.type == JV_INT;
    else if (IS("float")) *out = v.type == JV_FLOAT;
    else if (IS("number")) *out = jv_is_number(v);
    else if (IS("string")) *out = v.type == JV_STRING;
    else if (IS("mapping")) *out = v.type == JV_DICT && !v.u.d->ns;
    else if (IS("iterable")) *out = v.type == JV_STRING || v.type == JV_LIST || (v.type == JV_DICT && !v.u.d->ns) ||
                                    v.type == JV_UNDEFINED;
    else if (IS("sequence")) *out = v.type == JV_STRING || v.type == JV_LIST || (v.type == JV_DICT && !v.u.d->ns) ||
                                    v.type == JV_UNDEFINED;
    else if (IS("callable")) *out = v.type == JV_FUNC;
    else if (IS("sameas")) {
        if (v.type != x.type) *out = false;
        else if (v.type == JV_STRING) *out = v.u.s == x.u.s;
        else if (v.type == JV_LIST) *out = v.u.l == x.u.l;
        else if (v.type == JV_DICT) *out = v.u.d == x.u.d;
        else *out = jv_equal(v, x);
    }
    else if (IS("eq") || IS("equalto") || IS("==")) *out = jv_equal(v, x);
    else if (IS("ne") || IS("!=")) *out = !jv_equal(v, x);
    else if (IS("lt") || IS("lessthan") || IS("<") || IS("le") || IS("<=") || IS("gt") || IS("greaterthan") ||
             IS(">") || IS("ge") || IS(">=")) {
        int r;
        if (v.type == JV_UNDEFINED || x.type == JV_UNDEFINED || jv_compare(v, x, &r))
            return jinja_fail(c, EXO_EINVAL, "comparison not supported between '%s' and '%s'", jv_type_name(v),
                              jv_type_name(x));
        if (IS("lt") || IS("lessthan") || IS("<")) *out = r < 0;
        else if (IS("le") || IS("<=")) *out = r <= 0;
        else if (IS("gt") || IS("greaterthan") || IS(">")) *out = r > 0;
        else *out = r >= 0;
    }
    else if (IS("in")) {
        if (x.type == JV_STRING) {
            if (v.type != JV_STRING)
                return jinja_fail(c, EXO_EINVAL, "'in <string>' requires string as left operand");
            *out = memmem(x.u.s->data, x.u.s->len, v.u.s->data, v.u.s->len) != NULL;
        } else if (x.type == JV_LIST) {
            *out = false;
            for (size_t i = 0; i < x.u.l->len; i++)
                if (jv_equal(x.u.l->items[i], v)) { *out = true; break; }
        } else if (x.type == JV_DICT) {
            jv t;
            *out = jv_dict_get(x, v, &t);
        } else {
            return jinja_fail(c, EXO_EINVAL, "argument of type '%s' is not iterable", jv_type_name(x));
        }
    }
    else if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (!jv_is_number(v) || (IS("divisibleby") && !jv_is_number(x)))
            return jinja_fail(c, EXO_EINVAL, "test '%s' needs a number", name);
        if (v.type == JV_FLOAT || x.type == JV_FLOAT) {
            double d = IS("divisibleby") ? jv_as_double(x) : 2;
            if (d == 0) return jinja_fail(c, EXO_EINVAL, "float modulo");
            double m = fmod(jv_as_double(v), d);
            *out = IS("odd") ? m != 0 : m == 0;
        } else {
            int64_t a = v.type == JV_BOOL ? v.u.b : v.u.i;
            int64_t d = IS("divisibleby") ? (x.type == JV_BOOL ? x.u.b : x.u.i) : 2;
            if (d == 0) return jinja_fail(c, EXO_EINVAL, "integer division or modulo by zero");
            int64_t m = d == -1 ? 0 : a % d;
            *out = IS("odd") ? m != 0 : m == 0;
        }
    }
    else if (IS("lower") || IS("upper")) {
        jv s = to_string(v), r;
        str_pred(s, &r, IS("lower") ? 4 : 5);
        jv_unref(s);
        *out = r.u.b;
    }
    else if (IS("escaped")) *out = false;
    else if (IS("filter")) {
        *out = false;
        if (v.type == JV_STRING)
            for (const filter_def *f = filters; f->name; f++)
                if (!strcmp(f->name, v.u.s->data)) *out = true;
    }
    else if (IS("test")) *out = v.type == JV_STRING && jinja_has_test(v.u.s->data);
    else return jinja_fail(c, EXO_EINVAL, "no test named '%s'", name);
#undef IS
    return 0;
}

bool jinja_has_test(const char *name)
{
    static const char *const tests[] = {
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string",
        "mapping", "iterable", "sequence", "callable", "sameas", "eq", "equalto", "==", "ne", "!=", "lt",
        "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in", "odd", "even",
        "divisibleby", "lower", "upper", "escaped", "filter", "test", NULL,
    };
    for (int i = 0; tests[i]; i++)
        if (!strcmp(tests[i], name))
            return true;
    return false;
}

/* ---- globals ----------------------------------------------------------- */

static int g_range(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                   const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (nargs < 1 || nargs > 3)
        return jinja_fail(c, EXO_EINVAL, "range expected 1 to 3 arguments, got %zu", nargs);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].type != JV_INT && args[i].type != JV_BOOL)
            return jinja_fail(c, EXO_EINVAL, "'%s' object cannot be interpreted as an integer",
                              jv_type_name(args[i]));
        int64_t x = args[i].type == JV_BOOL ? args[i].u.b : args[i].u.i;
        if (nargs == 1) v[1] = x;
        else v[i] = x;
    }
    if (v[2] == 0)
        return jinja_fail(c, EXO_EINVAL, "range() arg 3 must not be zero");
    double cnt = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2])
                          : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (cnt > 1e6)
        return jinja_fail(c, EXO_ETOOBIG, "range too large (sandbox limit)");
    jv l = jv_list_new(cnt > 0 ? (size_t)cnt : 1);
    for (int64_t x = v[0]; v[2] > 0 ? x < v[1] : x > v[1]; x += v[2])
        jv_list_push(l, jv_int(x));
    *out = l;
    return 0;
}

static int g_dict(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                  const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    jv d = jv_dict_new();
    d.u.d->ns = self.type == JV_BOOL && self.u.b;
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].type != JV_DICT) {
            bool ns = d.u.d->ns;
            jv_unref(d);
            return jinja_fail(c, EXO_EINVAL, "%s() positional argument must be a mapping",
                              ns ? "namespace" : "dict");
        }
        for (size_t k = 0; k < args[i].u.d->len; k++)
            jv_dict_set(d, args[i].u.d->keys[k], jv_ref(args[i].u.d->vals[k]));
    }
    for (size_t i = 0; i < nkw; i++)
        jv_dict_set_str(d, kwnames[i], jv_ref(kwvals[i]));
    *out = d;
    return 0;
}

static int g_raise(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                   const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    jbuf b = {0};
    if (nargs)
        jv_to_str(&b, args[0]);
    int rc = jinja_fail(c, EXO_EINVAL, "%s", b.p ? b.p : "");
    exo_free(b.p);
    return rc;
}

static int g_strftime_now(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                          const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    if (nargs < 1 || args[0].type != JV_STRING)
        return jinja_fail(c, EXO_EINVAL, "strftime_now() expects a format string");
    struct tm tm;
    if (c->now >= 0) {
        time_t t = (time_t)c->now;
        gmtime_r(&t, &tm);
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &tm);
    }
    if (args[0].u.s->len > 256)
        return jinja_fail(c, EXO_ETOOBIG, "strftime format too long");
    char buf[2048];
    size_t n = args[0].u.s->len ? strftime(buf, sizeof buf, args[0].u.s->data, &tm) : 0;
    *out = jv_str_new(buf, n);
    return 0;
}

static void add_fn(jv globals, const char *name, jv_builtin_fn fn, jv self)
{
    jv f = jv_func_new(JF_BUILTIN, name);
    f.u.fn->fn = fn;
    f.u.fn->self = self;
    jv_dict_set_str(globals, name, f);
}

void jinja_add_globals(jv globals)
{
    add_fn(globals, "range", g_range, jv_undef());
    add_fn(globals, "dict", g_dict, jv_bool(false));
    add_fn(globals, "namespace", g_dict, jv_bool(true));
    add_fn(globals, "raise_exception", g_raise, jv_undef());
    add_fn(globals, "strftime_now", g_strftime_now, jv_undef());
}
