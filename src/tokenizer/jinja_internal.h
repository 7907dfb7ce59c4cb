/* Types shared by the Jinja modules (lexer, parser, values, evaluator,
 * builtins). Not part of the public API: see jinja.h.
 *
 * Values (jv) are small tagged structs passed by value; strings, lists,
 * dicts and functions live on the heap with a reference count. Rule: a
 * function returning jv returns an owned reference; jv arguments are
 * borrowed. jv_ref/jv_unref are no-ops for immediate types. */
#ifndef EXO_TOKENIZER_JINJA_INTERNAL_H
#define EXO_TOKENIZER_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

/* ---- values ------------------------------------------------------------ */

typedef enum {
    JV_UNDEFINED, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT,
    JV_STRING, JV_LIST, JV_DICT, JV_FUNC,
} jv_type;

typedef struct jv_str  jv_str;
typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
typedef struct jv_func jv_func;

typedef struct jv {
    uint8_t type;
    union {
        bool     b;
        int64_t  i;
        double   f;
        jv_str  *s;
        jv_list *l;
        jv_dict *d;
        jv_func *fn;
        const char *undef_name;  /* static or template-owned; may be NULL */
    } u;
} jv;

struct jv_str  { int rc; size_t len; char data[]; };
/* depth: nesting depth (1 + deepest child), bounded by the evaluator so
 * that recursive printing and freeing cannot exhaust the stack. */
/* gen: the result of select/map/... which Jinja returns as a generator,
 * so it is always true in a boolean context. */
struct jv_list { int rc; bool tuple; bool gen; uint32_t depth; size_t len, cap; jv *items; };
struct jv_dict { int rc; bool ns; uint32_t depth; size_t len, cap; jv *keys; jv *vals; };
#define JV_MAX_DEPTH 500
uint32_t jv_depth(jv v);

struct jinja_ctx;
struct jnode;
typedef int (*jv_builtin_fn)(struct jinja_ctx *c, jv self, const jv *args, size_t nargs,
                             const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out);

enum { JF_BUILTIN, JF_MACRO, JF_CALLER };
struct jv_func {
    int rc;
    int kind;
    const char *name;
    jv self;                       /* bound receiver for methods (owned) */
    jv_builtin_fn fn;
    const struct jnode *node;      /* macro definition or call-block */
    struct jscope *scope;          /* caller: the scope of the call block; NULL once it ends */
};

static inline jv jv_undef(void) { jv v = {.type = JV_UNDEFINED}; v.u.undef_name = NULL; return v; }
static inline jv jv_undef_named(const char *n) { jv v = {.type = JV_UNDEFINED}; v.u.undef_name = n; return v; }
static inline jv jv_none(void) { jv v = {.type = JV_NONE}; v.u.i = 0; return v; }
static inline jv jv_bool(bool b) { jv v = {.type = JV_BOOL}; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.type = JV_INT}; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.type = JV_FLOAT}; v.u.f = f; return v; }

jv   jv_ref(jv v);
void jv_unref(jv v);
jv   jv_str_new(const char *s, size_t n);
jv   jv_str_cstr(const char *s);
/* Template literals are shared by concurrent renders, so their reference
 * count is never touched: immortal strings (rc < 0) are freed only with
 * the template, by jv_free_immortal. */
jv   jv_str_immortal(jv v);
void jv_free_immortal(jv v);
jv   jv_list_new(size_t cap);
void jv_list_push(jv list, jv item);           /* takes ownership of item */
jv   jv_dict_new(void);
void jv_dict_set(jv dict, jv key, jv val);     /* borrows key, takes val */
void jv_dict_set_str(jv dict, const char *key, jv val); /* takes val */
bool jv_dict_get(jv dict, jv key, jv *out);    /* borrowed out */
bool jv_dict_get_str(jv dict, const char *key, size_t klen, jv *out);
jv   jv_func_new(int kind, const char *name);

bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* Python ordering; returns 0 and sets *res (<0, 0, >0), or EXO_EINVAL. */
int  jv_compare(jv a, jv b, int *res);
const char *jv_type_name(jv v);
bool jv_is_number(jv v);
double jv_as_double(jv v);

/* UTF-8 helpers (code-point semantics like Python str). */
size_t jv_utf8_len(const char *s, size_t n);
size_t jv_utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp */

/* A growable byte buffer. */
/* Capped from outside: every byte a template makes counts against the
 * render's max_values budget, and its output against max_output (jinja.h). */
typedef struct jbuf { char *p; size_t len, cap; } jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_putc(jbuf *b, char ch);
void jbuf_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv   jbuf_to_str(jbuf *b);  /* frees the buffer */

/* str() and repr() as Python prints them. */
void jv_to_str(jbuf *b, jv v);
void jv_repr(jbuf *b, jv v);
void jv_float_repr(jbuf *b, double f);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys).
 * indent: NULL = none. Returns 0 or EXO_EINVAL for unserializable values. */
int  jv_to_json(jbuf *b, jv v, bool ensure_ascii, const char *indent, const char *item_sep,
                const char *key_sep, bool sort_keys, int depth);

jv   jv_from_json(const json_t *j);

/* ---- lexer ------------------------------------------------------------- */

typedef enum {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    int line;
    char *s;        /* TEXT, NAME, STRING, OP: owned, NUL-terminated */
    size_t slen;
    int64_t i;
    double f;
} jtok;

typedef struct jtoks { jtok *v; size_t n, cap; } jtoks;

int  exo_jinja_lex(const char *src, size_t len, jtoks *out, exo_err *err);
void exo_jinja_toks_free(jtoks *t);

/* ---- AST --------------------------------------------------------------- */

typedef enum {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK,
    N_FILTER_BLOCK, N_BREAK, N_CONTINUE, N_WITH, N_SCOPE,
    /* expressions */
    N_LITERAL, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NEG, N_POS, N_NOT, N_BINOP, N_AND, N_OR, N_COMPARE, N_COND, N_LIST, N_TUPLE,
    N_DICT, N_NS_REF,
} jnode_kind;

typedef struct jnode jnode;
typedef struct jnodes { jnode **v; size_t n, cap; } jnodes;

struct jnode {
    jnode_kind kind;
    int line;
    int op;              /* BINOP/COMPARE operator, TEST negation */
    char *name;          /* NAME, ATTR, FILTER, TEST, MACRO, SET target, NS_REF attr */
    jv value;            /* LITERAL */
    jnode *a, *b, *c, *d;/* children: meaning per kind (see parser) */
    jnodes list;         /* body / args / items / targets */
    jnodes list2;        /* else body / kwarg values / dict values / defaults */
    char **names;        /* kwarg names / macro param names */
    size_t nnames;
    int *ops;            /* COMPARE: one operator per operand in list */
};

struct exo_jinja_template {
    jtoks toks;
    jnodes body;
};

int  exo_jinja_parse_toks(const jtoks *toks, jnodes *out, exo_err *err);
void exo_jinja_node_free(jnode *n);
void exo_jinja_nodes_free(jnodes *l);

/* binary operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

/* ---- evaluation -------------------------------------------------------- */

typedef struct jscope {
    struct jscope *parent;
    jv vars;   /* dict */
} jscope;

typedef struct jinja_ctx {
    exo_err *err;
    jscope *root;       /* template-level scope; macros resolve free names here */
    jv globals;         /* dict: context + builtin globals */
    int depth, max_depth;
    uint64_t steps, max_steps;
    size_t max_output;
    int64_t now;
    int line;           /* line of the node being evaluated, for errors */
    size_t out_total;   /* bytes rendered so far (all buffers) */
    size_t made_total;  /* bytes of strings/lists produced so far: bounds memory */
    size_t max_made;
} jinja_ctx;

/* Errors: set err with "line N: ..." and return a negative code. */
int jinja_fail(jinja_ctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Calls a callable value. */
int jinja_call(jinja_ctx *c, jv fn, const jv *args, size_t nargs,
               const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out);

/* Builtins (jinja_builtins.c). */
int  jinja_apply_filter(jinja_ctx *c, const char *name, jv val, const jv *args, size_t nargs,
                        const char *const *kwnames, const jv *kwvals, size_t nkw, jv *out);
int  jinja_apply_test(jinja_ctx *c, const char *name, jv val, const jv *args, size_t nargs, bool *out);
bool jinja_has_test(const char *name);
bool jinja_has_filter(const char *name);
/* Attribute of a value that is a method (str.split, dict.items...): a bound
 * function in *out, true; false if the type has no such method. */
bool jinja_get_method(jv obj, const char *name, jv *out);
void jinja_add_globals(jv globals);

#endif
