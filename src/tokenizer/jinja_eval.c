/* Jinja evaluator: walks the AST with Python Jinja2's runtime semantics.
 *
 * Scoping follows Jinja2: each for-loop iteration, macro call, call block
 * and with-block gets a new scope (so `set` inside a loop does not leak
 * out), if-blocks do not; macros resolve free names in the template-level
 * scope at call time; namespace() objects are the only mutable values.
 * Undefined follows jinja2.Undefined: it prints as "", is false, iterates
 * as empty, but attribute/item access, arithmetic and calls on it fail.
 * Every loop iteration and expression costs a step; steps, macro depth and
 * output bytes are capped. */
#include "tokenizer/jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"

enum { EXEC_OK = 0, EXEC_BREAK = 1, EXEC_CONTINUE = 2 };

int jinja_fail(jinja_ctx *c, int code, const char *fmt, ...)
{
    if (!c->err)
        return code;
    char msg[EXO_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return exo_err_set(c->err, code, "line %d: %s", c->line, msg);
}

static int eval(jinja_ctx *c, jscope *s, const jnode *n, jv *out);
static int exec_body(jinja_ctx *c, jscope *s, const jnodes *body, jbuf *out);

static int step(jinja_ctx *c)
{
    if (++c->steps > c->max_steps)
        return jinja_fail(c, EXO_ETOOBIG, "evaluation step limit exceeded");
    return 0;
}

static int emit(jinja_ctx *c, jbuf *b, const char *s, size_t n)
{
    c->out_total += n;
    if (c->out_total > c->max_output)
        return jinja_fail(c, EXO_ETOOBIG, "output size limit exceeded");
    jbuf_put(b, s, n);
    return 0;
}

/* ---- scopes ------------------------------------------------------------ */

static void scope_init(jscope *s, jscope *parent)
{
    s->parent = parent;
    s->vars = jv_dict_new();
}

static void scope_done(jscope *s) { jv_unref(s->vars); }

static bool lookup(jinja_ctx *c, jscope *s, const char *name, jv *out)
{
    size_t n = strlen(name);
    for (; s; s = s->parent)
        if (jv_dict_get_str(s->vars, name, n, out))
            return true;
    return jv_dict_get_str(c->globals, name, n, out);
}

static void scope_set(jscope *s, const char *name, jv val) /* takes val */
{
    jv_dict_set_str(s->vars, name, val);
}

static bool contains_ref(jv hay, jv_dict *needle, int depth)
{
    if (depth > JV_MAX_DEPTH + 2)
        return true;
    if (hay.type == JV_DICT) {
        if (hay.u.d == needle)
            return true;
        for (size_t i = 0; i < hay.u.d->len; i++)
            if (contains_ref(hay.u.d->vals[i], needle, depth + 1))
                return true;
    } else if (hay.type == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->len; i++)
            if (contains_ref(hay.u.l->items[i], needle, depth + 1))
                return true;
    } else if (hay.type == JV_FUNC) {
        return contains_ref(hay.u.fn->self, needle, depth + 1);
    }
    return false;
}

/* Checks a value just produced: nesting depth and the production budget. */
static int check_depth(jinja_ctx *c, jv v)
{
    if (jv_depth(v) > JV_MAX_DEPTH)
        return jinja_fail(c, EXO_ETOOBIG, "value nested too deeply");
    /* charge what was produced: total bytes made bound the live bytes */
    size_t n = v.type == JV_STRING ? v.u.s->len
             : v.type == JV_LIST ? v.u.l->len * sizeof(jv)
             : v.type == JV_DICT ? v.u.d->len * 2 * sizeof(jv) : 0;
    c->made_total += n;
    if (c->made_total > c->max_made)
        return jinja_fail(c, EXO_ETOOBIG, "template produced too much data");
    return 0;
}

/* ---- helpers ----------------------------------------------------------- */

static int undefined_error(jinja_ctx *c, jv v)
{
    if (v.u.undef_name)
        return jinja_fail(c, EXO_EINVAL, "'%s' is undefined", v.u.undef_name);
    return jinja_fail(c, EXO_EINVAL, "undefined value used");
}

/* Python-style slice index normalization. */
static void slice_indices(int64_t len, bool has_start, int64_t start, bool has_stop, int64_t stop,
                          int64_t stepv, int64_t *ostart, int64_t *ostop)
{
    if (!has_start)
        start = stepv < 0 ? len - 1 : 0;
    else if (start < 0) {
        start += len;
        if (start < 0)
            start = stepv < 0 ? -1 : 0;
    } else if (start >= len)
        start = stepv < 0 ? len - 1 : len;
    if (!has_stop)
        stop = stepv < 0 ? -1 : len;
    else if (stop < 0) {
        stop += len;
        if (stop < 0)
            stop = stepv < 0 ? -1 : 0;
    } else if (stop >= len)
        stop = stepv < 0 ? len - 1 : len;
    *ostart = start;
    *ostop = stop;
}

static int slice_value(jinja_ctx *c, jv obj, jv a, jv b, jv st, jv *out)
{
    int64_t stepv = 1;
    jv parts[3] = {a, b, st};
    for (int i = 0; i < 3; i++)
        if (parts[i].type != JV_UNDEFINED && parts[i].type != JV_NONE && parts[i].type != JV_INT &&
            parts[i].type != JV_BOOL)
            return jinja_fail(c, EXO_EINVAL, "slice indices must be integers or None");
    if (st.type == JV_INT || st.type == JV_BOOL)
        stepv = st.type == JV_BOOL ? st.u.b : st.u.i;
    if (stepv == 0)
        return jinja_fail(c, EXO_EINVAL, "slice step cannot be zero");
    bool hs = a.type == JV_INT || a.type == JV_BOOL, he = b.type == JV_INT || b.type == JV_BOOL;
    int64_t s0 = hs ? (a.type == JV_BOOL ? a.u.b : a.u.i) : 0;
    int64_t e0 = he ? (b.type == JV_BOOL ? b.u.b : b.u.i) : 0;
    if (obj.type == JV_LIST) {
        jv_list *l = obj.u.l;
        int64_t start, stop;
        slice_indices((int64_t)l->len, hs, s0, he, e0, stepv, &start, &stop);
        jv r = jv_list_new(0);
        r.u.l->tuple = l->tuple;
        for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv)
            jv_list_push(r, jv_ref(l->items[i]));
        *out = r;
        return 0;
    }
    if (obj.type == JV_STRING) {
        const char *p = obj.u.s->data;
        size_t n = obj.u.s->len;
        size_t ncp = jv_utf8_len(p, n);
        /* offsets of each code point */
        size_t *off = exo_malloc((ncp + 1) * sizeof *off);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (((unsigned char)p[i] & 0xC0) != 0x80)
                off[k++] = i;
        off[ncp] = n;
        int64_t start, stop;
        slice_indices((int64_t)ncp, hs, s0, he, e0, stepv, &start, &stop);
        jbuf bb = {0};
        if (stepv == 1) {
            if (stop > start)
                jbuf_put(&bb, p + off[start], off[stop] - off[start]);
        } else {
            for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv)
                jbuf_put(&bb, p + off[i], off[i + 1] - off[i]);
        }
        exo_free(off);
        *out = jbuf_to_str(&bb);
        return 0;
    }
    if (obj.type == JV_UNDEFINED)
        return undefined_error(c, obj);
    return jinja_fail(c, EXO_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* obj.name (Jinja getattr: attribute first, then item). */
static int get_attr(jinja_ctx *c, jv obj, const char *name, jv *out)
{
    if (obj.type == JV_UNDEFINED)
        return undefined_error(c, obj);
    if (obj.type == JV_DICT) {
        jv v;
        if (!obj.u.d->ns && jinja_get_method(obj, name, out))
            return 0;
        if (jv_dict_get_str(obj, name, strlen(name), &v)) {
            *out = jv_ref(v);
            return 0;
        }
        *out = jv_undef();
        return 0;
    }
    if (jinja_get_method(obj, name, out))
        return 0;
    *out = jv_undef();
    return 0;
}

/* obj[key] (Jinja getitem: item first, then attribute). */
static int get_item(jinja_ctx *c, jv obj, jv key, jv *out)
{
    if (obj.type == JV_UNDEFINED)
        return undefined_error(c, obj);
    if (obj.type == JV_DICT) {
        jv v;
        if (jv_dict_get(obj, key, &v)) {
            *out = jv_ref(v);
            return 0;
        }
    } else if ((obj.type == JV_LIST || obj.type == JV_STRING) && (key.type == JV_INT || key.type == JV_BOOL)) {
        int64_t i = key.type == JV_BOOL ? key.u.b : key.u.i;
        if (obj.type == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->len;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n) {
                *out = jv_ref(obj.u.l->items[i]);
                return 0;
            }
        } else {
            const char *p = obj.u.s->data;
            size_t n = obj.u.s->len;
            int64_t ncp = (int64_t)jv_utf8_len(p, n);
            if (i < 0)
                i += ncp;
            if (i >= 0 && i < ncp) {
                size_t a = jv_utf8_offset(p, n, (size_t)i), b = jv_utf8_offset(p, n, (size_t)i + 1);
                *out = jv_str_new(p + a, b - a);
                return 0;
            }
        }
    }
    if (key.type == JV_STRING && obj.type != JV_DICT) {
        if (jinja_get_method(obj, key.u.s->data, out))
            return 0;
    } else if (key.type == JV_STRING && !obj.u.d->ns && jinja_get_method(obj, key.u.s->data, out)) {
        return 0;
    }
    *out = jv_undef();
    return 0;
}

static int to_iter_list(jinja_ctx *c, jv v, jv *out)
{
    switch (v.type) {
    case JV_LIST: *out = jv_ref(v); return 0;
    case JV_UNDEFINED: *out = jv_list_new(0); return 0;
    case JV_DICT: {
        if (v.u.d->ns)
            break;
        jv l = jv_list_new(v.u.d->len);
        for (size_t i = 0; i < v.u.d->len; i++)
            jv_list_push(l, jv_ref(v.u.d->keys[i]));
        *out = l;
        return 0;
    }
    case JV_STRING: {
        jv l = jv_list_new(v.u.s->len);
        const char *p = v.u.s->data;
        size_t n = v.u.s->len;
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)p[j] & 0xC0) == 0x80)
                j++;
            jv_list_push(l, jv_str_new(p + i, j - i));
            i = j;
        }
        *out = l;
        return 0;
    }
    default: break;
    }
    return jinja_fail(c, EXO_EINVAL, "'%s' object is not iterable", jv_type_name(v));
}

int jinja_iter_list(jinja_ctx *c, jv v, jv *out);
int jinja_iter_list(jinja_ctx *c, jv v, jv *out) { return to_iter_list(c, v, out); }

static int arith(jinja_ctx *c, int op, jv a, jv b, jv *out)
{
    if (op == OP_CONCAT) {
        jbuf bb = {0};
        jv_to_str(&bb, a);
        jv_to_str(&bb, b);
        if (bb.len > c->max_output) {
            exo_free(bb.p);
            return jinja_fail(c, EXO_ETOOBIG, "string too large");
        }
        *out = jbuf_to_str(&bb);
        return 0;
    }
    if (a.type == JV_UNDEFINED)
        return undefined_error(c, a);
    if (b.type == JV_UNDEFINED)
        return undefined_error(c, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        bool fl = a.type == JV_FLOAT || b.type == JV_FLOAT;
        int64_t x = a.type == JV_BOOL ? a.u.b : a.u.i, y = b.type == JV_BOOL ? b.u.b : b.u.i;
        double fx = jv_as_double(a), fy = jv_as_double(b);
        int64_t r;
        switch (op) {
        case OP_ADD:
            if (fl) { *out = jv_float(fx + fy); return 0; }
            if (__builtin_add_overflow(x, y, &r)) goto overflow;
            *out = jv_int(r); return 0;
        case OP_SUB:
            if (fl) { *out = jv_float(fx - fy); return 0; }
            if (__builtin_sub_overflow(x, y, &r)) goto overflow;
            *out = jv_int(r); return 0;
        case OP_MUL:
            if (fl) { *out = jv_float(fx * fy); return 0; }
            if (__builtin_mul_overflow(x, y, &r)) goto overflow;
            *out = jv_int(r); return 0;
        case OP_DIV:
            if (fy == 0) return jinja_fail(c, EXO_EINVAL, "division by zero");
            *out = jv_float(fx / fy); return 0;
        case OP_FLOORDIV:
            if (fl) {
                if (fy == 0) return jinja_fail(c, EXO_EINVAL, "float floor division by zero");
                *out = jv_float(floor(fx / fy)); return 0;
            }
            if (y == 0) return jinja_fail(c, EXO_EINVAL, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto overflow;
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) r--;
            *out = jv_int(r); return 0;
        case OP_MOD:
            if (fl) {
                if (fy == 0) return jinja_fail(c, EXO_EINVAL, "float modulo");
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(m); return 0;
            }
            if (y == 0) return jinja_fail(c, EXO_EINVAL, "integer division or modulo by zero");
            if (y == -1) { *out = jv_int(0); return 0; }
            r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
            *out = jv_int(r); return 0;
        case OP_POW:
            if (!fl && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e > 0) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc)) goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                *out = jv_int(acc); return 0;
            }
            if (fx == 0 && fy < 0) return jinja_fail(c, EXO_EINVAL, "zero to a negative power");
            *out = jv_float(pow(fx, fy)); return 0;
        default: break;
        }
    }
    if (op == OP_ADD && a.type == JV_STRING && b.type == JV_STRING) {
        if (a.u.s->len + b.u.s->len > c->max_output)
            return jinja_fail(c, EXO_ETOOBIG, "string too large");
        jbuf bb = {0};
        jbuf_put(&bb, a.u.s->data, a.u.s->len);
        jbuf_put(&bb, b.u.s->data, b.u.s->len);
        *out = jbuf_to_str(&bb);
        return 0;
    }
    if (op == OP_ADD && a.type == JV_LIST && b.type == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        jv l = jv_list_new(a.u.l->len + b.u.l->len);
        l.u.l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->len; i++)
            jv_list_push(l, jv_ref(a.u.l->items[i]));
        for (size_t i = 0; i < b.u.l->len; i++)
            jv_list_push(l, jv_ref(b.u.l->items[i]));
        *out = l;
        return 0;
    }
    if (op == OP_MUL && ((a.type == JV_STRING || a.type == JV_LIST) && (b.type == JV_INT || b.type == JV_BOOL))) {
        int64_t k = b.type == JV_BOOL ? b.u.b : b.u.i;
        if (k < 0)
            k = 0;
        size_t unit = a.type == JV_STRING ? a.u.s->len : a.u.l->len * sizeof(jv);
        if (unit && (uint64_t)k > c->max_output / unit)
            return jinja_fail(c, EXO_ETOOBIG, "repetition too large");
        if (a.type == JV_STRING) {
            jbuf bb = {0};
            for (int64_t i = 0; i < k; i++)
                jbuf_put(&bb, a.u.s->data, a.u.s->len);
            *out = jbuf_to_str(&bb);
        } else {
            jv l = jv_list_new(a.u.l->len * (size_t)k + 1);
            l.u.l->tuple = a.u.l->tuple;
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < a.u.l->len; j++)
                    jv_list_push(l, jv_ref(a.u.l->items[j]));
            *out = l;
        }
        return 0;
    }
    if (op == OP_MUL && (b.type == JV_STRING || b.type == JV_LIST) && (a.type == JV_INT || a.type == JV_BOOL))
        return arith(c, op, b, a, out);
    if (op == OP_MOD && a.type == JV_STRING) {
        jv args[1] = {b};
        return jinja_apply_filter(c, "format", a, args, 1, NULL, NULL, 0, out);
    }
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return jinja_fail(c, EXO_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'",
                      op <= OP_POW ? names[op] : "?", jv_type_name(a), jv_type_name(b));
overflow:
    return jinja_fail(c, EXO_ERANGE, "integer overflow");
}

static int contains(jinja_ctx *c, jv needle, jv hay, bool *out)
{
    switch (hay.type) {
    case JV_STRING:
        if (needle.type != JV_STRING)
            return jinja_fail(c, EXO_EINVAL, "'in <string>' requires string as left operand, not %s",
                              jv_type_name(needle));
        *out = needle.u.s->len == 0 ||
               memmem(hay.u.s->data, hay.u.s->len, needle.u.s->data, needle.u.s->len) != NULL;
        return 0;
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.l->len; i++)
            if (jv_equal(hay.u.l->items[i], needle)) {
                *out = true;
                break;
            }
        return 0;
    case JV_DICT: {
        jv tmp;
        *out = !hay.u.d->ns && jv_dict_get(hay, needle, &tmp);
        if (hay.u.d->ns)
            return jinja_fail(c, EXO_EINVAL, "argument of type 'Namespace' is not iterable");
        return 0;
    }
    case JV_UNDEFINED:
        *out = false;
        return 0;
    default:
        return jinja_fail(c, EXO_EINVAL, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare_op(jinja_ctx *c, int op, jv a, jv b, bool *res)
{
    int rc, r = 0;
    switch (op) {
    case OP_EQ: *res = jv_equal(a, b); return 0;
    case OP_NE: *res = !jv_equal(a, b); return 0;
    case OP_IN: return contains(c, a, b, res);
    case OP_NOTIN:
        rc = contains(c, a, b, res);
        *res = !*res;
        return rc;
    default: break;
    }
    if (a.type == JV_UNDEFINED)
        return undefined_error(c, a);
    if (b.type == JV_UNDEFINED)
        return undefined_error(c, b);
    if (jv_compare(a, b, &r)) {
        static const char *const sym[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
        return jinja_fail(c, EXO_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                          sym[op], jv_type_name(a), jv_type_name(b));
    }
    switch (op) {
    case OP_LT: *res = r < 0; break;
    case OP_LE: *res = r <= 0; break;
    case OP_GT: *res = r > 0; break;
    default:    *res = r >= 0; break;
    }
    return 0;
}

/* Evaluates positional and keyword arguments of a call/filter/test node. */
static int eval_args(jinja_ctx *c, jscope *s, const jnode *n, jv **args, jv **kwvals, size_t extra_kw)
{
    *args = exo_calloc(n->list.n + 1, sizeof(jv));
    *kwvals = exo_calloc(n->list2.n + extra_kw + 1, sizeof(jv));
    for (size_t i = 0; i < n->list.n; i++)
        (*args)[i] = jv_undef();
    for (size_t i = 0; i < n->list2.n + extra_kw; i++)
        (*kwvals)[i] = jv_undef();
    for (size_t i = 0; i < n->list.n; i++) {
        int rc = eval(c, s, n->list.v[i], &(*args)[i]);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < n->list2.n; i++) {
        int rc = eval(c, s, n->list2.v[i], &(*kwvals)[i]);
        if (rc)
            return rc;
    }
    return 0;
}

static void free_args(const jnode *n, jv *args, jv *kwvals, size_t extra_kw)
{
    if (args)
        for (size_t i = 0; i < n->list.n; i++)
            jv_unref(args[i]);
    if (kwvals)
        for (size_t i = 0; i < n->list2.n + extra_kw; i++)
            jv_unref(kwvals[i]);
    exo_free(args);
    exo_free(kwvals);
}

/* Applies the filter chain `chain` (innermost operand NULL) to v. */
static int apply_chain(jinja_ctx *c, jscope *s, const jnode *chain, jv v, jv *out)
{
    if (!chain) {
        *out = jv_ref(v);
        return 0;
    }
    jv inner;
    int rc = apply_chain(c, s, chain->a, v, &inner);
    if (rc)
        return rc;
    jv *args = NULL, *kw = NULL;
    rc = eval_args(c, s, chain, &args, &kw, 0);
    if (!rc) {
        c->line = chain->line;
        rc = jinja_apply_filter(c, chain->name, inner, args, chain->list.n, (const char *const *)chain->names,
                                kw, chain->list2.n, out);
    }
    free_args(chain, args, kw, 0);
    jv_unref(inner);
    return rc;
}

static int eval(jinja_ctx *c, jscope *s, const jnode *n, jv *out)
{
    int rc;
    if ((rc = step(c)))
        return rc;
    c->line = n->line;
    switch (n->kind) {
    case N_LITERAL:
        *out = jv_ref(n->value);
        return 0;
    case N_NAME: {
        jv v;
        if (lookup(c, s, n->name, &v))
            *out = jv_ref(v);
        else
            *out = jv_undef_named(n->name);
        return 0;
    }
    case N_ATTR: {
        jv obj;
        if ((rc = eval(c, s, n->a, &obj)))
            return rc;
        c->line = n->line;
        rc = get_attr(c, obj, n->name, out);
        jv_unref(obj);
        return rc;
    }
    case N_ITEM: {
        jv obj, key;
        if ((rc = eval(c, s, n->a, &obj)))
            return rc;
        if ((rc = eval(c, s, n->b, &key))) {
            jv_unref(obj);
            return rc;
        }
        c->line = n->line;
        rc = get_item(c, obj, key, out);
        jv_unref(obj);
        jv_unref(key);
        return rc;
    }
    case N_SLICE: {
        jv obj, p[3] = {jv_undef(), jv_undef(), jv_undef()};
        const jnode *pn[3] = {n->b, n->c, n->d};
        if ((rc = eval(c, s, n->a, &obj)))
            return rc;
        for (int i = 0; i < 3 && !rc; i++)
            if (pn[i])
                rc = eval(c, s, pn[i], &p[i]);
        c->line = n->line;
        if (!rc && !(rc = slice_value(c, obj, p[0], p[1], p[2], out)) && (rc = check_depth(c, *out)))
            jv_unref(*out);
        jv_unref(obj);
        for (int i = 0; i < 3; i++)
            jv_unref(p[i]);
        return rc;
    }
    case N_CALL: {
        jv fn;
        if ((rc = eval(c, s, n->a, &fn)))
            return rc;
        jv *args = NULL, *kw = NULL;
        rc = eval_args(c, s, n, &args, &kw, 0);
        c->line = n->line;
        if (!rc) {
            if (fn.type == JV_UNDEFINED)
                rc = undefined_error(c, fn);
            else
                rc = jinja_call(c, fn, args, n->list.n, (const char *const *)n->names, kw, n->list2.n, out);
        }
        if (!rc && (rc = check_depth(c, *out)))
            jv_unref(*out);
        free_args(n, args, kw, 0);
        jv_unref(fn);
        return rc;
    }
    case N_FILTER: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        jv *args = NULL, *kw = NULL;
        rc = eval_args(c, s, n, &args, &kw, 0);
        c->line = n->line;
        if (!rc)
            rc = jinja_apply_filter(c, n->name, v, args, n->list.n, (const char *const *)n->names, kw,
                                    n->list2.n, out);
        if (!rc && (rc = check_depth(c, *out)))
            jv_unref(*out);
        free_args(n, args, kw, 0);
        jv_unref(v);
        return rc;
    }
    case N_TEST: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        jv *args = NULL, *kw = NULL;
        rc = eval_args(c, s, n, &args, &kw, 0);
        c->line = n->line;
        bool r = false;
        if (!rc)
            rc = jinja_apply_test(c, n->name, v, args, n->list.n, &r);
        free_args(n, args, kw, 0);
        jv_unref(v);
        if (!rc)
            *out = jv_bool(n->op ? !r : r);
        return rc;
    }
    case N_NEG: case N_POS: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        c->line = n->line;
        if (!jv_is_number(v)) {
            rc = v.type == JV_UNDEFINED ? undefined_error(c, v)
                 : jinja_fail(c, EXO_EINVAL, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+',
                              jv_type_name(v));
            jv_unref(v);
            return rc;
        }
        if (n->kind == N_POS)
            *out = v.type == JV_BOOL ? jv_int(v.u.b) : v;
        else if (v.type == JV_FLOAT)
            *out = jv_float(-v.u.f);
        else if (v.type == JV_INT && v.u.i == INT64_MIN)
            return jinja_fail(c, EXO_ERANGE, "integer overflow");
        else
            *out = jv_int(-(v.type == JV_BOOL ? v.u.b : v.u.i));
        return 0;
    }
    case N_NOT: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        *out = jv_bool(!jv_truthy(v));
        jv_unref(v);
        return 0;
    }
    case N_AND: case N_OR: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        bool t = jv_truthy(v);
        if ((n->kind == N_AND) != t) {
            *out = v;
            return 0;
        }
        jv_unref(v);
        return eval(c, s, n->b, out);
    }
    case N_BINOP: {
        jv a, b;
        if ((rc = eval(c, s, n->a, &a)))
            return rc;
        if ((rc = eval(c, s, n->b, &b))) {
            jv_unref(a);
            return rc;
        }
        c->line = n->line;
        rc = arith(c, n->op, a, b, out);
        jv_unref(a);
        jv_unref(b);
        if (!rc && (rc = check_depth(c, *out)))
            jv_unref(*out);
        return rc;
    }
    case N_COMPARE: {
        jv left;
        if ((rc = eval(c, s, n->a, &left)))
            return rc;
        bool res = true;
        for (size_t i = 0; i < n->list.n; i++) {
            jv right;
            if ((rc = eval(c, s, n->list.v[i], &right))) {
                jv_unref(left);
                return rc;
            }
            c->line = n->line;
            rc = compare_op(c, n->ops[i], left, right, &res);
            jv_unref(left);
            left = right;
            if (rc) {
                jv_unref(left);
                return rc;
            }
            if (!res)
                break;
        }
        jv_unref(left);
        *out = jv_bool(res);
        return 0;
    }
    case N_COND: {
        jv cond;
        if ((rc = eval(c, s, n->b, &cond)))
            return rc;
        bool t = jv_truthy(cond);
        jv_unref(cond);
        if (t)
            return eval(c, s, n->a, out);
        if (n->c)
            return eval(c, s, n->c, out);
        *out = jv_undef();
        return 0;
    }
    case N_LIST: case N_TUPLE: {
        jv l = jv_list_new(n->list.n);
        l.u.l->tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->list.n; i++) {
            jv v;
            if ((rc = eval(c, s, n->list.v[i], &v))) {
                jv_unref(l);
                return rc;
            }
            jv_list_push(l, v);
        }
        if ((rc = check_depth(c, l))) {
            jv_unref(l);
            return rc;
        }
        *out = l;
        return 0;
    }
    case N_DICT: {
        jv d = jv_dict_new();
        for (size_t i = 0; i < n->list.n; i++) {
            jv k, v;
            if ((rc = eval(c, s, n->list.v[i], &k))) {
                jv_unref(d);
                return rc;
            }
            if (k.type == JV_LIST && !k.u.l->tuple) {
                jv_unref(k);
                jv_unref(d);
                return jinja_fail(c, EXO_EINVAL, "unhashable type: 'list'");
            }
            if (k.type == JV_DICT) {
                jv_unref(k);
                jv_unref(d);
                return jinja_fail(c, EXO_EINVAL, "unhashable type: 'dict'");
            }
            if ((rc = eval(c, s, n->list2.v[i], &v))) {
                jv_unref(k);
                jv_unref(d);
                return rc;
            }
            jv_dict_set(d, k, v);
            jv_unref(k);
        }
        if ((rc = check_depth(c, d))) {
            jv_unref(d);
            return rc;
        }
        *out = d;
        return 0;
    }
    default:
        return jinja_fail(c, EXO_EINTERNAL, "bad expression node %d", (int)n->kind);
    }
}

/* ---- calls ------------------------------------------------------------- */

static int call_macro(jinja_ctx *c, jv_func *f, const jv *args, size_t nargs,
                      const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    const jnode *m = f->node;
    bool is_caller = f->kind == JF_CALLER;
    if (is_caller && !f->scope)
        return jinja_fail(c, EXO_EINVAL, "caller() used outside its call block");
    if (c->depth >= c->max_depth)
        return jinja_fail(c, EXO_ERANGE, "maximum recursion depth exceeded in macro '%s'",
                          f->name ? f->name : "caller");
    if (nargs > m->nnames)
        return jinja_fail(c, EXO_EINVAL, "macro '%s' takes not more than %zu argument(s)",
                          f->name ? f->name : "caller", m->nnames);
    jscope sc;
    scope_init(&sc, is_caller ? f->scope : c->root);
    int rc = 0;
    bool *bound = exo_calloc(m->nnames + 1, sizeof(bool));
    for (size_t i = 0; i < nargs; i++) {
        scope_set(&sc, m->names[i], jv_ref(args[i]));
        bound[i] = true;
    }
    for (size_t k = 0; k < nkw && !rc; k++) {
        size_t i;
        for (i = 0; i < m->nnames; i++)
            if (!strcmp(m->names[i], kwnames[k]))
                break;
        if (i < m->nnames) {
            if (bound[i])
                rc = jinja_fail(c, EXO_EINVAL, "macro '%s' got multiple values for argument '%s'",
                                f->name ? f->name : "caller", kwnames[k]);
            bound[i] = true;
            scope_set(&sc, m->names[i], jv_ref(kwvals[k]));
        } else if (!strcmp(kwnames[k], "caller")) {
            scope_set(&sc, "caller", jv_ref(kwvals[k]));
        } else {
            rc = jinja_fail(c, EXO_EINVAL, "macro '%s' takes no keyword argument '%s'",
                            f->name ? f->name : "caller", kwnames[k]);
        }
    }
    for (size_t i = 0; i < m->nnames && !rc; i++) {
        if (bound[i])
            continue;
        const jnode *def = i < m->list2.n ? m->list2.v[i] : NULL;
        jv v = jv_undef_named(m->names[i]);
        if (def && (rc = eval(c, &sc, def, &v)))
            break;
        scope_set(&sc, m->names[i], v);
    }
    exo_free(bound);
    if (!rc) {
        /* varargs/kwargs are always empty here: extra arguments are errors */
        jbuf b = {0};
        c->depth++;
        rc = exec_body(c, &sc, &m->list, &b);
        c->depth--;
        if (rc > 0)
            rc = jinja_fail(c, EXO_EFORMAT, "'break'/'continue' outside of a loop");
        if (!rc)
            *out = jbuf_to_str(&b);
        else
            exo_free(b.p);
    }
    scope_done(&sc);
    return rc;
}

int jinja_call(jinja_ctx *c, jv fn, const jv *args, size_t nargs,
               const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    if (fn.type != JV_FUNC)
        return jinja_fail(c, EXO_EINVAL, "'%s' object is not callable", jv_type_name(fn));
    jv_func *f = fn.u.fn;
    if (f->kind == JF_BUILTIN)
        return f->fn(c, f->self, args, nargs, kwnames, kwvals, nkw, out);
    return call_macro(c, f, args, nargs, kwnames, kwvals, nkw, out);
}

/* ---- statements -------------------------------------------------------- */

static int assign(jinja_ctx *c, jscope *s, const jnode *target, jv val) /* borrows val */
{
    if (target->kind == N_NAME) {
        scope_set(s, target->name, jv_ref(val));
        return 0;
    }
    if (target->kind == N_NS_REF) {
        jv ns;
        if (!lookup(c, s, target->name, &ns) || ns.type != JV_DICT || !ns.u.d->ns)
            return jinja_fail(c, EXO_EINVAL, "cannot assign attribute on non-namespace object");
        if (contains_ref(val, ns.u.d, 0))
            return jinja_fail(c, EXO_EINVAL, "cannot store a namespace inside itself");
        jv_dict_set(ns, target->a->value, jv_ref(val));
        return check_depth(c, ns);
    }
    /* tuple unpacking */
    jv items;
    int rc;
    if (val.type == JV_DICT || val.type == JV_STRING || val.type == JV_LIST) {
        if ((rc = to_iter_list(c, val, &items)))
            return rc;
    } else {
        return jinja_fail(c, EXO_EINVAL, "cannot unpack non-iterable %s object", jv_type_name(val));
    }
    if (items.u.l->len != target->list.n) {
        size_t have = items.u.l->len;
        jv_unref(items);
        return jinja_fail(c, EXO_EINVAL, "%s values to unpack (expected %zu, got %zu)",
                          have > target->list.n ? "too many" : "not enough", target->list.n, have);
    }
    for (size_t i = 0; i < target->list.n; i++)
        scope_set(s, target->list.v[i]->name, jv_ref(items.u.l->items[i]));
    jv_unref(items);
    return 0;
}

static int loop_cycle(jinja_ctx *c, jv self, const jv *args, size_t nargs,
                      const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out)
{
    if (nargs == 0)
        return jinja_fail(c, EXO_EINVAL, "no items for cycling given");
    *out = jv_ref(args[(size_t)self.u.i % nargs]);
    return 0;
}

static int exec_for(jinja_ctx *c, jscope *s, const jnode *n, jbuf *out)
{
    jv iterable, items;
    int rc;
    if ((rc = eval(c, s, n->b, &iterable)))
        return rc;
    c->line = n->line;
    if (iterable.type == JV_NONE || iterable.type == JV_INT || iterable.type == JV_FLOAT ||
        iterable.type == JV_BOOL || iterable.type == JV_FUNC || (iterable.type == JV_DICT && iterable.u.d->ns)) {
        rc = jinja_fail(c, EXO_EINVAL, "'%s' object is not iterable", jv_type_name(iterable));
        jv_unref(iterable);
        return rc;
    }
    rc = to_iter_list(c, iterable, &items);
    jv_unref(iterable);
    if (rc)
        return rc;
    if (n->c) { /* inline filter: `for x in y if cond` */
        jv kept = jv_list_new(items.u.l->len);
        for (size_t i = 0; i < items.u.l->len && !rc; i++) {
            jscope fs;
            scope_init(&fs, s);
            rc = assign(c, &fs, n->a, items.u.l->items[i]);
            jv cond = jv_undef();
            if (!rc)
                rc = eval(c, &fs, n->c, &cond);
            if (!rc && jv_truthy(cond))
                jv_list_push(kept, jv_ref(items.u.l->items[i]));
            jv_unref(cond);
            scope_done(&fs);
        }
        jv_unref(items);
        items = kept;
        if (rc) {
            jv_unref(items);
            return rc;
        }
    }
    size_t len = items.u.l->len;
    for (size_t i = 0; i < len; i++) {
        if ((rc = step(c)))
            break;
        jscope ls;
        scope_init(&ls, s);
        jv item = items.u.l->items[i];
        rc = assign(c, &ls, n->a, item);
        if (!rc) {
            jv loop = jv_dict_new();
            jv_dict_set_str(loop, "index", jv_int((int64_t)i + 1));
            jv_dict_set_str(loop, "index0", jv_int((int64_t)i));
            jv_dict_set_str(loop, "revindex", jv_int((int64_t)(len - i)));
            jv_dict_set_str(loop, "revindex0", jv_int((int64_t)(len - i - 1)));
            jv_dict_set_str(loop, "first", jv_bool(i == 0));
            jv_dict_set_str(loop, "last", jv_bool(i + 1 == len));
            jv_dict_set_str(loop, "length", jv_int((int64_t)len));
            jv_dict_set_str(loop, "depth", jv_int(1));
            jv_dict_set_str(loop, "depth0", jv_int(0));
            if (i > 0)
                jv_dict_set_str(loop, "previtem", jv_ref(items.u.l->items[i - 1]));
            if (i + 1 < len)
                jv_dict_set_str(loop, "nextitem", jv_ref(items.u.l->items[i + 1]));
            jv cyc = jv_func_new(JF_BUILTIN, "cycle");
            cyc.u.fn->fn = loop_cycle;
            cyc.u.fn->self = jv_int((int64_t)i);
            jv_dict_set_str(loop, "cycle", cyc);
            loop.u.d->ns = false;
            scope_set(&ls, "loop", loop);
            rc = exec_body(c, &ls, &n->list, out);
        }
        scope_done(&ls);
        if (rc == EXEC_CONTINUE)
            rc = 0;
        if (rc == EXEC_BREAK) {
            rc = 0;
            break;
        }
        if (rc)
            break;
    }
    if (!rc && len == 0 && n->list2.n)
        rc = exec_body(c, s, &n->list2, out);
    jv_unref(items);
    return rc;
}

static int exec_stmt(jinja_ctx *c, jscope *s, const jnode *n, jbuf *out)
{
    int rc;
    c->line = n->line;
    switch (n->kind) {
    case N_TEXT:
        return emit(c, out, n->value.u.s->data, n->value.u.s->len);
    case N_OUTPUT: {
        jv v;
        if ((rc = eval(c, s, n->a, &v)))
            return rc;
        if (v.type == JV_STRING) {
            rc = emit(c, out, v.u.s->data, v.u.s->len);
        } else {
            jbuf b = {0};
            jv_to_str(&b, v);
            rc = emit(c, out, b.p ? b.p : "", b.len);
            exo_free(b.p);
        }
        jv_unref(v);
        return rc;
    }
    case N_IF: {
        jv cond;
        if ((rc = eval(c, s, n->a, &cond)))
            return rc;
        bool t = jv_truthy(cond);
        jv_unref(cond);
        return exec_body(c, s, t ? &n->list : &n->list2, out);
    }
    case N_FOR:
        return exec_for(c, s, n, out);
    case N_SET: {
        jv v;
        if ((rc = eval(c, s, n->b, &v)))
            return rc;
        c->line = n->line;
        rc = assign(c, s, n->a, v);
        jv_unref(v);
        return rc;
    }
    case N_SET_BLOCK: {
        jbuf b = {0};
        rc = exec_body(c, s, &n->list, &b);
        if (rc) {
            exo_free(b.p);
            return rc < 0 ? rc : jinja_fail(c, EXO_EFORMAT, "'break'/'continue' inside set block");
        }
        jv v = jbuf_to_str(&b), f;
        rc = apply_chain(c, s, n->b, v, &f);
        jv_unref(v);
        if (rc)
            return rc;
        c->line = n->line;
        rc = assign(c, s, n->a, f);
        jv_unref(f);
        return rc;
    }
    case N_MACRO: {
        jv m = jv_func_new(JF_MACRO, n->name);
        m.u.fn->node = n;
        scope_set(s, n->name, m);
        return 0;
    }
    case N_CALL_BLOCK: {
        const jnode *call = n->a;
        jv fn;
        if ((rc = eval(c, s, call->a, &fn)))
            return rc;
        jv *args = NULL, *kw = NULL;
        rc = eval_args(c, s, call, &args, &kw, 1);
        jv caller = jv_func_new(JF_CALLER, "caller");
        caller.u.fn->node = n;
        caller.u.fn->scope = s;
        const char **names = exo_calloc(call->list2.n + 1, sizeof(char *));
        for (size_t i = 0; i < call->list2.n; i++)
            names[i] = call->names[i];
        names[call->list2.n] = "caller";
        kw[call->list2.n] = jv_ref(caller);
        jv res = jv_undef();
        c->line = n->line;
        if (!rc)
            rc = jinja_call(c, fn, args, call->list.n, names, kw, call->list2.n + 1, &res);
        caller.u.fn->scope = NULL;
        jv_unref(caller);
        exo_free(names);
        free_args(call, args, kw, 1);
        jv_unref(fn);
        if (!rc) {
            jbuf b = {0};
            jv_to_str(&b, res);
            rc = emit(c, out, b.p ? b.p : "", b.len);
            exo_free(b.p);
        }
        jv_unref(res);
        return rc;
    }
    case N_FILTER_BLOCK: {
        jbuf b = {0};
        rc = exec_body(c, s, &n->list, &b);
        if (rc) {
            exo_free(b.p);
            return rc;
        }
        jv v = jbuf_to_str(&b), f;
        rc = apply_chain(c, s, n->a, v, &f);
        jv_unref(v);
        if (rc)
            return rc;
        jbuf o = {0};
        jv_to_str(&o, f);
        rc = emit(c, out, o.p ? o.p : "", o.len);
        exo_free(o.p);
        jv_unref(f);
        return rc;
    }
    case N_WITH: case N_SCOPE: {
        jscope ws;
        scope_init(&ws, s);
        rc = 0;
        for (size_t i = 0; i < n->list2.n && !rc; i++) {
            jv v;
            if ((rc = eval(c, s, n->list2.v[i], &v)))
                break;
            scope_set(&ws, n->names[i], v);
        }
        if (!rc)
            rc = exec_body(c, &ws, &n->list, out);
        scope_done(&ws);
        return rc;
    }
    case N_BREAK: return EXEC_BREAK;
    case N_CONTINUE: return EXEC_CONTINUE;
    default:
        return jinja_fail(c, EXO_EINTERNAL, "bad statement node %d", (int)n->kind);
    }
}

static int exec_body(jinja_ctx *c, jscope *s, const jnodes *body, jbuf *out)
{
    for (size_t i = 0; i < body->n; i++) {
        int rc = exec_stmt(c, s, body->v[i], out);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- entry points ------------------------------------------------------ */

int exo_jinja_parse(const char *src, size_t len, exo_jinja_template **out, exo_err *err)
{
    exo_jinja_template *t = exo_calloc(1, sizeof *t);
    int rc = exo_jinja_lex(src, len, &t->toks, err);
    if (!rc)
        rc = exo_jinja_parse_toks(&t->toks, &t->body, err);
    if (rc) {
        exo_jinja_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void exo_jinja_free(exo_jinja_template *t)
{
    if (!t)
        return;
    exo_jinja_nodes_free(&t->body);
    exo_jinja_toks_free(&t->toks);
    exo_free(t);
}

int exo_jinja_render(const exo_jinja_template *tpl, const json_t *context,
                     const exo_jinja_opts *opts, char **out, size_t *out_len, exo_err *err)
{
    jinja_ctx c = {0};
    c.err = err;
    c.max_depth = opts && opts->max_depth > 0 ? opts->max_depth : 64;
    c.max_steps = opts && opts->max_steps ? opts->max_steps : 50u * 1000 * 1000;
    c.max_output = opts && opts->max_output ? opts->max_output : (size_t)32 << 20;
    c.max_made = opts && opts->max_values ? opts->max_values : c.max_output * 8;
    c.now = opts ? opts->now : -1;
    c.line = 1;
    c.globals = jv_dict_new();
    jinja_add_globals(c.globals);
    if (context && json_is_object(context)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)context, k, v)
            jv_dict_set_str(c.globals, k, jv_from_json(v));
    } else if (context && !json_is_null(context)) {
        jv_unref(c.globals);
        return exo_err_set(err, EXO_EINVAL, "template context must be a JSON object");
    }
    jscope root;
    scope_init(&root, NULL);
    c.root = &root;
    jbuf b = {0};
    int rc = exec_body(&c, &root, &tpl->body, &b);
    if (rc > 0)
        rc = jinja_fail(&c, EXO_EFORMAT, "'break'/'continue' outside of a loop");
    scope_done(&root);
    jv_unref(c.globals);
    if (rc) {
        exo_free(b.p);
        return rc;
    }
    if (!b.p)
        jbuf_put(&b, "", 0);
    *out = b.p;
    if (out_len)
        *out_len = b.len;
    return 0;
}
