/* Jinja parser: tokens to an AST, recursive descent with Jinja2's operator
 * precedence (condexpr < or < and < not < comparisons < + - < ~ < * / // %
 * < ** < unary, then postfix . [] () and the filter/test chain).
 *
 * Statements: if/elif/else, for (unpacking, inline if, else, loop
 * controls), set (expression, block, namespace attribute), macro, call,
 * filter, with, raw (in the lexer) and HF's generation block. Nesting depth
 * is capped so hostile input cannot overflow the stack. */
#include "tokenizer/jinja_internal.h"

#include <string.h>

#include "core/alloc.h"

#define MAX_NEST 200

typedef struct parser {
    const jtoks *t;
    size_t i;
    int depth;
    exo_err *err;
} parser;

static void nodes_push(jnodes *l, jnode *n)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->v = exo_realloc(l->v, l->cap * sizeof(jnode *));
    }
    l->v[l->n++] = n;
}

static void names_push(jnode *n, const char *s)
{
    n->names = exo_realloc(n->names, (n->nnames + 1) * sizeof(char *));
    n->names[n->nnames++] = exo_strdup(s);
}

static jnode *mk(jnode_kind k, int line)
{
    jnode *n = exo_calloc(1, sizeof *n);
    n->kind = k;
    n->line = line;
    n->value = jv_undef();
    return n;
}

void exo_jinja_nodes_free(jnodes *l)
{
    for (size_t i = 0; i < l->n; i++)
        exo_jinja_node_free(l->v[i]);
    exo_free(l->v);
    memset(l, 0, sizeof *l);
}

void exo_jinja_node_free(jnode *n)
{
    if (!n)
        return;
    exo_jinja_node_free(n->a);
    exo_jinja_node_free(n->b);
    exo_jinja_node_free(n->c);
    exo_jinja_node_free(n->d);
    exo_jinja_nodes_free(&n->list);
    exo_jinja_nodes_free(&n->list2);
    for (size_t i = 0; i < n->nnames; i++)
        exo_free(n->names[i]);
    exo_free(n->names);
    exo_free(n->ops);
    exo_free(n->name);
    jv_free_immortal(n->value);
    exo_free(n);
}

static const jtok *cur(parser *P) { return &P->t->v[P->i]; }
static const jtok *peek(parser *P, size_t k)
{
    size_t j = P->i + k;
    return j < P->t->n ? &P->t->v[j] : &P->t->v[P->t->n - 1];
}
static void adv(parser *P) { if (P->i + 1 < P->t->n) P->i++; }

static bool is_op(const jtok *t, const char *op) { return t->type == TK_OP && !strcmp(t->s, op); }
static bool is_name(const jtok *t, const char *nm) { return t->type == TK_NAME && !strcmp(t->s, nm); }

static const char *tok_desc(const jtok *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: case TK_OP: return t->s;
    case TK_STRING: return "string";
    default: return "number";
    }
}

static int fail(parser *P, const char *what)
{
    const jtok *t = cur(P);
    return exo_err_set(P->err, EXO_EFORMAT, "line %d: expected %s, got %s", t->line, what, tok_desc(t));
}

static int expect_op(parser *P, const char *op)
{
    if (!is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return fail(P, w);
    }
    adv(P);
    return 0;
}

static int parse_expr(parser *P, jnode **out);
static int parse_or(parser *P, jnode **out);
static int parse_unary(parser *P, jnode **out, bool with_filter);
static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode **n);

static int enter(parser *P)
{
    if (++P->depth > MAX_NEST)
        return exo_err_set(P->err, EXO_EFORMAT, "line %d: nesting too deep", cur(P)->line);
    return 0;
}

/* Call arguments after '(' up to and including ')'. */
static int parse_call_args(parser *P, jnode *n)
{
    int rc;
    while (!is_op(cur(P), ")")) {
        if (n->list.n || n->list2.n)
            if ((rc = expect_op(P, ",")))
                return rc;
        if (is_op(cur(P), ")"))
            break;
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), "=")) {
            names_push(n, cur(P)->s);
            adv(P);
            adv(P);
            jnode *v = NULL;
            if ((rc = parse_expr(P, &v)))
                return rc;
            nodes_push(&n->list2, v);
        } else {
            if (n->list2.n)
                return exo_err_set(P->err, EXO_EFORMAT, "line %d: positional argument after keyword argument", cur(P)->line);
            jnode *v = NULL;
            if ((rc = parse_expr(P, &v)))
                return rc;
            nodes_push(&n->list, v);
        }
    }
    adv(P);
    return 0;
}

/* A tuple of expressions without parentheses (`a, b`) or a single one. */
static int parse_tuple(parser *P, jnode **out, bool names_only, bool allow_empty_end)
{
    int line = cur(P)->line, rc;
    jnode *first = NULL;
    if (names_only) {
        if (cur(P)->type != TK_NAME)
            return fail(P, "name");
        first = mk(N_NAME, line);
        first->name = exo_strdup(cur(P)->s);
        adv(P);
    } else if ((rc = parse_expr(P, &first))) {
        return rc;
    }
    if (!is_op(cur(P), ",")) {
        *out = first;
        return 0;
    }
    jnode *t = mk(N_TUPLE, line);
    nodes_push(&t->list, first);
    while (is_op(cur(P), ",")) {
        adv(P);
        const jtok *c = cur(P);
        if (c->type == TK_BLOCK_END || c->type == TK_VAR_END || is_name(c, "in") || is_op(c, "="))
            break;
        jnode *x = NULL;
        if (names_only) {
            if (c->type != TK_NAME) {
                exo_jinja_node_free(t);
                return fail(P, "name");
            }
            x = mk(N_NAME, c->line);
            x->name = exo_strdup(c->s);
            adv(P);
        } else if ((rc = parse_expr(P, &x))) {
            exo_jinja_node_free(t);
            return rc;
        }
        nodes_push(&t->list, x);
    }
    (void)allow_empty_end;
    *out = t;
    return 0;
}

static int parse_primary(parser *P, jnode **out)
{
    const jtok *t = cur(P);
    int rc;
    if ((rc = enter(P)))
        return rc;
    jnode *n = NULL;
    if (t->type == TK_NAME) {
        const char *s = t->s;
        if (!strcmp(s, "true") || !strcmp(s, "True")) { n = mk(N_LITERAL, t->line); n->value = jv_bool(true); }
        else if (!strcmp(s, "false") || !strcmp(s, "False")) { n = mk(N_LITERAL, t->line); n->value = jv_bool(false); }
        else if (!strcmp(s, "none") || !strcmp(s, "None")) { n = mk(N_LITERAL, t->line); n->value = jv_none(); }
        else { n = mk(N_NAME, t->line); n->name = exo_strdup(s); }
        adv(P);
    } else if (t->type == TK_STRING) {
        /* adjacent string literals concatenate */
        jbuf b = {0};
        int line = t->line;
        while (cur(P)->type == TK_STRING) {
            jbuf_put(&b, cur(P)->s, cur(P)->slen);
            adv(P);
        }
        n = mk(N_LITERAL, line);
        n->value = jv_str_immortal(jbuf_to_str(&b));
    } else if (t->type == TK_INT) {
        n = mk(N_LITERAL, t->line);
        n->value = jv_int(t->i);
        adv(P);
    } else if (t->type == TK_FLOAT) {
        n = mk(N_LITERAL, t->line);
        n->value = jv_float(t->f);
        adv(P);
    } else if (is_op(t, "(")) {
        int line = t->line;
        adv(P);
        if (is_op(cur(P), ")")) {
            adv(P);
            n = mk(N_TUPLE, line);
        } else {
            jnode *e = NULL;
            if ((rc = parse_expr(P, &e)))
                return rc;
            if (is_op(cur(P), ",")) {
                n = mk(N_TUPLE, line);
                nodes_push(&n->list, e);
                while (is_op(cur(P), ",")) {
                    adv(P);
                    if (is_op(cur(P), ")"))
                        break;
                    jnode *x = NULL;
                    if ((rc = parse_expr(P, &x))) {
                        exo_jinja_node_free(n);
                        return rc;
                    }
                    nodes_push(&n->list, x);
                }
            } else {
                n = e;
            }
            if ((rc = expect_op(P, ")"))) {
                exo_jinja_node_free(n);
                return rc;
            }
        }
    } else if (is_op(t, "[")) {
        n = mk(N_LIST, t->line);
        adv(P);
        while (!is_op(cur(P), "]")) {
            if (n->list.n && (rc = expect_op(P, ","))) {
                exo_jinja_node_free(n);
                return rc;
            }
            if (is_op(cur(P), "]"))
                break;
            jnode *x = NULL;
            if ((rc = parse_expr(P, &x))) {
                exo_jinja_node_free(n);
                return rc;
            }
            nodes_push(&n->list, x);
        }
        adv(P);
    } else if (is_op(t, "{")) {
        n = mk(N_DICT, t->line);
        adv(P);
        while (!is_op(cur(P), "}")) {
            if (n->list.n && (rc = expect_op(P, ","))) {
                exo_jinja_node_free(n);
                return rc;
            }
            if (is_op(cur(P), "}"))
                break;
            jnode *k = NULL, *v = NULL;
            if ((rc = parse_expr(P, &k))) {
                exo_jinja_node_free(n);
                return rc;
            }
            nodes_push(&n->list, k);
            if ((rc = expect_op(P, ":")) || (rc = parse_expr(P, &v))) {
                exo_jinja_node_free(n);
                return rc;
            }
            nodes_push(&n->list2, v);
        }
        adv(P);
    } else {
        return fail(P, "expression");
    }
    P->depth--;
    *out = n;
    return 0;
}

static int parse_subscript(parser *P, jnode *obj, jnode **out)
{
    int line = cur(P)->line, rc;
    jnode *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool is_slice = false;
    for (;;) {
        if (is_op(cur(P), ":")) {
            is_slice = true;
            if (np >= 2) {
                rc = fail(P, "']'");
                goto err;
            }
            np++;
            adv(P);
            continue;
        }
        if (is_op(cur(P), "]"))
            break;
        if (parts[np]) {
            rc = fail(P, "']'");
            goto err;
        }
        if ((rc = parse_expr(P, &parts[np])))
            goto err;
    }
    adv(P);
    jnode *n;
    if (is_slice) {
        n = mk(N_SLICE, line);
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
    } else {
        if (!parts[0]) {
            rc = fail(P, "subscript");
            goto err;
        }
        n = mk(N_ITEM, line);
        n->b = parts[0];
    }
    n->a = obj;
    *out = n;
    return 0;
err:
    for (int i = 0; i < 3; i++)
        exo_jinja_node_free(parts[i]);
    return rc;
}

static int parse_postfix(parser *P, jnode **n)
{
    int rc;
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            const jtok *a = cur(P);
            if (a->type == TK_NAME) {
                jnode *x = mk(N_ATTR, a->line);
                x->a = *n;
                x->name = exo_strdup(a->s);
                *n = x;
                adv(P);
            } else if (a->type == TK_INT) {
                jnode *x = mk(N_ITEM, a->line);
                x->a = *n;
                x->b = mk(N_LITERAL, a->line);
                x->b->value = jv_int(a->i);
                *n = x;
                adv(P);
            } else {
                return fail(P, "attribute name");
            }
        } else if (is_op(t, "[")) {
            adv(P);
            if ((rc = parse_subscript(P, *n, n)))
                return rc;
        } else if (is_op(t, "(")) {
            jnode *x = mk(N_CALL, t->line);
            x->a = *n;
            *n = x;
            adv(P);
            if ((rc = parse_call_args(P, x)))
                return rc;
        } else {
            return 0;
        }
    }
}

static int parse_filter_name(parser *P, jnode *f)
{
    if (cur(P)->type != TK_NAME)
        return fail(P, "filter name");
    jbuf b = {0};
    jbuf_puts(&b, cur(P)->s);
    adv(P);
    while (is_op(cur(P), ".") && peek(P, 1)->type == TK_NAME) {
        jbuf_putc(&b, '.');
        jbuf_puts(&b, peek(P, 1)->s);
        adv(P);
        adv(P);
    }
    f->name = b.p;
    return 0;
}

/* Filters and tests applied to n: `| f(args)`, `is [not] t args`. */
static int parse_filter_chain(parser *P, jnode **n)
{
    int rc;
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(t, "|")) {
            adv(P);
            jnode *f = mk(N_FILTER, t->line);
            f->a = *n;
            *n = f;
            if ((rc = parse_filter_name(P, f)))
                return rc;
            if (is_op(cur(P), "(")) {
                adv(P);
                if ((rc = parse_call_args(P, f)))
                    return rc;
            }
        } else if (is_name(t, "is")) {
            adv(P);
            jnode *x = mk(N_TEST, t->line);
            x->a = *n;
            *n = x;
            if (is_name(cur(P), "not")) {
                x->op = 1;
                adv(P);
            }
            if (cur(P)->type != TK_NAME)
                return fail(P, "test name");
            /* `is none`/`is true` lex as names */
            if ((rc = parse_filter_name(P, x)))
                return rc;
            const jtok *c = cur(P);
            if (is_op(c, "(")) {
                adv(P);
                if ((rc = parse_call_args(P, x)))
                    return rc;
            } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
                        c->type == TK_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") &&
                       !is_name(c, "is") && !is_name(c, "if") && !is_name(c, "in") && !is_name(c, "not")) {
                jnode *arg = NULL;
                if ((rc = parse_primary(P, &arg)))
                    return rc;
                nodes_push(&x->list, arg);
                if ((rc = parse_postfix(P, &x->list.v[x->list.n - 1])))
                    return rc;
            }
        } else if (is_op(t, "(")) {
            jnode *x = mk(N_CALL, t->line);
            x->a = *n;
            *n = x;
            adv(P);
            if ((rc = parse_call_args(P, x)))
                return rc;
        } else {
            return 0;
        }
    }
}

static int parse_unary(parser *P, jnode **out, bool with_filter)
{
    const jtok *t = cur(P);
    int rc;
    if ((rc = enter(P)))
        return rc;
    jnode *n = NULL;
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        n = mk(t->s[0] == '-' ? N_NEG : N_POS, t->line);
        if ((rc = parse_unary(P, &n->a, false))) {
            exo_jinja_node_free(n);
            return rc;
        }
    } else if ((rc = parse_primary(P, &n))) {
        return rc;
    }
    if ((rc = parse_postfix(P, &n)) || (with_filter && (rc = parse_filter_chain(P, &n)))) {
        exo_jinja_node_free(n);
        return rc;
    }
    P->depth--;
    *out = n;
    return 0;
}

static int binop(parser *P, jnode **out, int (*sub)(parser *, jnode **), const char *const *ops, const int *codes)
{
    int rc;
    jnode *l = NULL;
    if ((rc = sub(P, &l)))
        return rc;
    for (;;) {
        const jtok *t = cur(P);
        int code = 0;
        for (int i = 0; ops[i]; i++)
            if (is_op(t, ops[i]))
                code = codes[i];
        if (!code)
            break;
        adv(P);
        jnode *n = mk(N_BINOP, t->line);
        n->op = code;
        n->a = l;
        l = n;
        if ((rc = sub(P, &n->b))) {
            exo_jinja_node_free(l);
            return rc;
        }
    }
    *out = l;
    return 0;
}

static int parse_unary_f(parser *P, jnode **out) { return parse_unary(P, out, true); }

static int parse_pow(parser *P, jnode **out)
{
    static const char *const ops[] = {"**", NULL};
    static const int codes[] = {OP_POW};
    return binop(P, out, parse_unary_f, ops, codes);
}

static int parse_math2(parser *P, jnode **out)
{
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    static const int codes[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return binop(P, out, parse_pow, ops, codes);
}

static int parse_concat(parser *P, jnode **out)
{
    static const char *const ops[] = {"~", NULL};
    static const int codes[] = {OP_CONCAT};
    return binop(P, out, parse_math2, ops, codes);
}

static int parse_math1(parser *P, jnode **out)
{
    static const char *const ops[] = {"+", "-", NULL};
    static const int codes[] = {OP_ADD, OP_SUB};
    return binop(P, out, parse_concat, ops, codes);
}

static int parse_compare(parser *P, jnode **out)
{
    int rc;
    jnode *first = NULL;
    if ((rc = parse_math1(P, &first)))
        return rc;
    jnode *cmp = NULL;
    for (;;) {
        const jtok *t = cur(P);
        int op = 0;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) { op = OP_NOTIN; adv(P); }
        if (!op)
            break;
        adv(P);
        if (!cmp) {
            cmp = mk(N_COMPARE, t->line);
            cmp->a = first;
        }
        jnode *x = NULL;
        if ((rc = parse_math1(P, &x))) {
            exo_jinja_node_free(cmp);
            return rc;
        }
        nodes_push(&cmp->list, x);
        cmp->ops = exo_realloc(cmp->ops, cmp->list.n * sizeof(int));
        cmp->ops[cmp->list.n - 1] = op;
    }
    *out = cmp ? cmp : first;
    return 0;
}

static int parse_not(parser *P, jnode **out)
{
    const jtok *t = cur(P);
    int rc;
    if (is_name(t, "not")) {
        if ((rc = enter(P)))
            return rc;
        adv(P);
        jnode *n = mk(N_NOT, t->line);
        if ((rc = parse_not(P, &n->a))) {
            exo_jinja_node_free(n);
            return rc;
        }
        P->depth--;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(parser *P, jnode **out)
{
    int rc;
    jnode *l = NULL;
    if ((rc = parse_not(P, &l)))
        return rc;
    while (is_name(cur(P), "and")) {
        jnode *n = mk(N_AND, cur(P)->line);
        adv(P);
        n->a = l;
        l = n;
        if ((rc = parse_not(P, &n->b))) {
            exo_jinja_node_free(l);
            return rc;
        }
    }
    *out = l;
    return 0;
}

static int parse_or(parser *P, jnode **out)
{
    int rc;
    jnode *l = NULL;
    if ((rc = parse_and(P, &l)))
        return rc;
    while (is_name(cur(P), "or")) {
        jnode *n = mk(N_OR, cur(P)->line);
        adv(P);
        n->a = l;
        l = n;
        if ((rc = parse_and(P, &n->b))) {
            exo_jinja_node_free(l);
            return rc;
        }
    }
    *out = l;
    return 0;
}

/* expression with `a if cond else b` */
static int parse_expr(parser *P, jnode **out)
{
    int rc;
    if ((rc = enter(P)))
        return rc;
    jnode *e = NULL;
    if ((rc = parse_or(P, &e)))
        return rc;
    while (is_name(cur(P), "if")) {
        jnode *n = mk(N_COND, cur(P)->line);
        adv(P);
        n->a = e;
        e = n;
        if ((rc = parse_or(P, &n->b))) {
            exo_jinja_node_free(e);
            return rc;
        }
        if (is_name(cur(P), "else")) {
            adv(P);
            if ((rc = parse_expr(P, &n->c))) {
                exo_jinja_node_free(e);
                return rc;
            }
        }
    }
    P->depth--;
    *out = e;
    return 0;
}

/* ---- statements -------------------------------------------------------- */

static int parse_body(parser *P, jnodes *out, const char *const *ends, const char **found);

static int expect_block_end(parser *P)
{
    if (cur(P)->type != TK_BLOCK_END)
        return fail(P, "'%}'");
    adv(P);
    return 0;
}

/* Parses `macro name(params)` / `call(params)` parameter lists. */
static int parse_params(parser *P, jnode *n)
{
    int rc;
    if ((rc = expect_op(P, "(")))
        return rc;
    while (!is_op(cur(P), ")")) {
        if (n->nnames && (rc = expect_op(P, ",")))
            return rc;
        if (is_op(cur(P), ")"))
            break;
        if (cur(P)->type != TK_NAME)
            return fail(P, "parameter name");
        names_push(n, cur(P)->s);
        adv(P);
        jnode *def = NULL;
        if (is_op(cur(P), "=")) {
            adv(P);
            if ((rc = parse_expr(P, &def)))
                return rc;
        }
        nodes_push(&n->list2, def);
    }
    adv(P);
    return 0;
}

static int parse_stmt(parser *P, jnode **out, const char *kw, int line)
{
    int rc;
    const char *found = NULL;
    jnode *n = NULL;
    if (!strcmp(kw, "if")) {
        n = mk(N_IF, line);
        if ((rc = parse_expr(P, &n->a)) || (rc = expect_block_end(P)))
            goto err;
        jnode *ifn = n;
        for (;;) {
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            if ((rc = parse_body(P, &ifn->list, ends, &found)))
                goto err;
            if (!strcmp(found, "elif")) {
                jnode *e = mk(N_IF, cur(P)->line);
                nodes_push(&ifn->list2, e);
                ifn = e;
                if ((rc = parse_expr(P, &e->a)) || (rc = expect_block_end(P)))
                    goto err;
                continue;
            }
            if (!strcmp(found, "else")) {
                static const char *const ends2[] = {"endif", NULL};
                if ((rc = expect_block_end(P)) || (rc = parse_body(P, &ifn->list2, ends2, &found)))
                    goto err;
            }
            break;
        }
        rc = expect_block_end(P);
        if (rc)
            goto err;
    } else if (!strcmp(kw, "for")) {
        n = mk(N_FOR, line);
        if ((rc = parse_tuple(P, &n->a, true, false)))
            goto err;
        if (!is_name(cur(P), "in")) {
            rc = fail(P, "'in'");
            goto err;
        }
        adv(P);
        /* the iterable must not swallow the inline `if` */
        if ((rc = parse_or(P, &n->b)))
            goto err;
        if (is_name(cur(P), "if")) {
            adv(P);
            if ((rc = parse_expr(P, &n->c)))
                goto err;
        }
        if (is_name(cur(P), "recursive")) {
            rc = exo_err_set(P->err, EXO_EUNSUPPORTED, "line %d: recursive loops are not supported", line);
            goto err;
        }
        if ((rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"else", "endfor", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)))
            goto err;
        if (!strcmp(found, "else")) {
            static const char *const ends2[] = {"endfor", NULL};
            if ((rc = expect_block_end(P)) || (rc = parse_body(P, &n->list2, ends2, &found)))
                goto err;
        }
        if ((rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "set")) {
        jnode *target = NULL;
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->type == TK_NAME) {
            target = mk(N_NS_REF, line);
            target->name = exo_strdup(cur(P)->s);
            target->a = mk(N_LITERAL, line);
            target->a->value = jv_str_immortal(jv_str_cstr(peek(P, 2)->s));
            adv(P); adv(P); adv(P);
        } else if ((rc = parse_tuple(P, &target, true, false))) {
            goto err;
        }
        if (is_op(cur(P), "=")) {
            adv(P);
            n = mk(N_SET, line);
            n->a = target;
            jnode *v = NULL;
            if ((rc = parse_tuple(P, &v, false, false)))
                goto err;
            n->b = v;
            if ((rc = expect_block_end(P)))
                goto err;
        } else {
            n = mk(N_SET_BLOCK, line);
            n->a = target;
            if (is_op(cur(P), "|")) {
                /* `{% set x | filter %}`: filters applied to the block */
                jnode *ph = NULL;
                rc = parse_filter_chain(P, &ph);
                n->b = ph; /* partial chains are freed with n */
                if (rc)
                    goto err;
            }
            if ((rc = expect_block_end(P)))
                goto err;
            static const char *const ends[] = {"endset", NULL};
            if ((rc = parse_body(P, &n->list, ends, &found)) || (rc = expect_block_end(P)))
                goto err;
        }
    } else if (!strcmp(kw, "macro")) {
        n = mk(N_MACRO, line);
        if (cur(P)->type != TK_NAME) {
            rc = fail(P, "macro name");
            goto err;
        }
        n->name = exo_strdup(cur(P)->s);
        adv(P);
        if ((rc = parse_params(P, n)) || (rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"endmacro", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)))
            goto err;
        if (cur(P)->type == TK_NAME)
            adv(P); /* {% endmacro name %} */
        if ((rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "call")) {
        n = mk(N_CALL_BLOCK, line);
        if (is_op(cur(P), "(") && (rc = parse_params(P, n)))
            goto err;
        if ((rc = parse_expr(P, &n->a)))
            goto err;
        if (n->a->kind != N_CALL) {
            rc = exo_err_set(P->err, EXO_EFORMAT, "line %d: expected call", line);
            goto err;
        }
        if ((rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"endcall", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)) || (rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "filter")) {
        n = mk(N_FILTER_BLOCK, line);
        jnode *chain = mk(N_FILTER, line);
        n->a = chain;
        if ((rc = parse_filter_name(P, chain)))
            goto err;

        if (is_op(cur(P), "(")) {
            adv(P);
            if ((rc = parse_call_args(P, chain)))
                goto err;
        }
        if ((rc = parse_filter_chain(P, &n->a)) || (rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"endfilter", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)) || (rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "with")) {
        n = mk(N_WITH, line);
        while (cur(P)->type == TK_NAME) {
            names_push(n, cur(P)->s);
            adv(P);
            jnode *v = NULL;
            if ((rc = expect_op(P, "=")) || (rc = parse_expr(P, &v)))
                goto err;
            nodes_push(&n->list2, v);
            if (!is_op(cur(P), ","))
                break;
            adv(P);
        }
        if ((rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"endwith", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)) || (rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "generation")) {
        n = mk(N_SCOPE, line);
        if ((rc = expect_block_end(P)))
            goto err;
        static const char *const ends[] = {"endgeneration", NULL};
        if ((rc = parse_body(P, &n->list, ends, &found)) || (rc = expect_block_end(P)))
            goto err;
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = mk(kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        if ((rc = expect_block_end(P)))
            goto err;
    } else {
        return exo_err_set(P->err, EXO_EFORMAT, "line %d: unknown tag '%s'", line, kw);
    }
    *out = n;
    return 0;
err:
    exo_jinja_node_free(n);
    return rc;
}

static int parse_body(parser *P, jnodes *out, const char *const *ends, const char **found)
{
    int rc;
    if ((rc = enter(P)))
        return rc;
    for (;;) {
        const jtok *t = cur(P);
        if (t->type == TK_EOF) {
            if (ends)
                return exo_err_set(P->err, EXO_EFORMAT, "line %d: unexpected end of template, expected '%s'",
                                   t->line, ends[0] && ends[1] && !ends[2] ? ends[1] : ends[0]);
            break;
        }
        if (t->type == TK_TEXT) {
            jnode *n = mk(N_TEXT, t->line);
            n->value = jv_str_immortal(jv_str_new(t->s, t->slen));
            nodes_push(out, n);
            adv(P);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(P);
            jnode *n = mk(N_OUTPUT, t->line);
            nodes_push(out, n);
            if ((rc = parse_tuple(P, &n->a, false, false)))
                return rc;
            if (cur(P)->type != TK_VAR_END)
                return fail(P, "'}}'");
            adv(P);
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(P);
            const jtok *kw = cur(P);
            if (kw->type != TK_NAME)
                return fail(P, "statement name");
            if (ends)
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(kw->s, ends[i])) {
                        *found = ends[i];
                        adv(P);
                        P->depth--;
                        return 0;
                    }
            if (!strncmp(kw->s, "end", 3) || !strcmp(kw->s, "elif") || !strcmp(kw->s, "else"))
                return exo_err_set(P->err, EXO_EFORMAT, "line %d: unexpected '%s'", kw->line, kw->s);
            adv(P);
            jnode *n = NULL;
            if ((rc = parse_stmt(P, &n, kw->s, kw->line)))
                return rc;
            nodes_push(out, n);
        } else {
            return exo_err_set(P->err, EXO_EFORMAT, "line %d: unexpected %s", t->line, tok_desc(t));
        }
    }
    P->depth--;
    return 0;
}

int exo_jinja_parse_toks(const jtoks *toks, jnodes *out, exo_err *err)
{
    parser P = {.t = toks, .i = 0, .depth = 0, .err = err};
    memset(out, 0, sizeof *out);
    int rc = parse_body(&P, out, NULL, NULL);
    if (rc)
        exo_jinja_nodes_free(out);
    return rc;
}
