/* Jinja lexer: splits template source into text and tag tokens.
 *
 * Whitespace control follows Jinja2 with HF's settings (trim_blocks and
 * lstrip_blocks on, keep_trailing_newline off), because chat templates rely
 * on it for exact output: `{%-`/`-%}` strip all adjacent whitespace, `+`
 * disables lstrip/trim for that tag, lstrip_blocks removes spaces/tabs
 * before a block or comment tag that starts its line, trim_blocks removes
 * the first newline after a block or comment tag, and one trailing newline
 * at the end of the template is dropped. String literals decode Python
 * escapes (Jinja uses Python's unicode-escape). */
#include "tokenizer/jinja_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

typedef struct lexer {
    const char *src;
    size_t len, pos;
    int line;
    jtoks *out;
    exo_err *err;
} lexer;

static jtok *push(lexer *L, jtok_type t, int line)
{
    jtoks *o = L->out;
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 64;
        o->v = exo_realloc(o->v, o->cap * sizeof(jtok));
    }
    jtok *k = &o->v[o->n++];
    memset(k, 0, sizeof *k);
    k->type = t;
    k->line = line;
    return k;
}

static bool is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static int count_lines(const char *s, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += s[i] == '\n';
    return c;
}

/* Emits a text token, normalizing \r\n and \r to \n like Jinja. */
static void emit_text(lexer *L, const char *s, size_t n, int line)
{
    if (n == 0)
        return;
    char *t = exo_malloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r') {
            t[k++] = '\n';
            if (i + 1 < n && s[i + 1] == '\n')
                i++;
        } else {
            t[k++] = s[i];
        }
    }
    t[k] = 0;
    jtok *tk = push(L, TK_TEXT, line);
    tk->s = t;
    tk->slen = k;
}

static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xC0 | (cp >> 6)); o[(*k)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12)); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18)); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decodes the body of a string literal (between the quotes). */
static int decode_string(lexer *L, const char *s, size_t n, int line, char **out, size_t *olen)
{
    char *o = exo_malloc(n * 2 + 4);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '\r') { /* newline normalization */
            o[k++] = '\n';
            if (i + 1 < n && s[i + 1] == '\n')
                i++;
            continue;
        }
        if (ch != '\\' || i + 1 >= n) {
            o[k++] = ch;
            continue;
        }
        char e = s[++i];
        int nhex = 0;
        switch (e) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"':  o[k++] = '"'; break;
        case 'a':  o[k++] = '\a'; break;
        case 'b':  o[k++] = '\b'; break;
        case 'f':  o[k++] = '\f'; break;
        case 'n':  o[k++] = '\n'; break;
        case 'r':  o[k++] = '\r'; break;
        case 't':  o[k++] = '\t'; break;
        case 'v':  o[k++] = '\v'; break;
        case 'x':  nhex = 2; break;
        case 'u':  nhex = 4; break;
        case 'U':  nhex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; d++)
                    v = v * 8 + (uint32_t)(s[++i] - '0');
                put_utf8(o, &k, v);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (nhex) {
            uint32_t v = 0;
            for (int d = 0; d < nhex; d++) {
                int h = i + 1 < n ? hexval(s[i + 1]) : -1;
                if (h < 0) {
                    exo_free(o);
                    return exo_err_set(L->err, EXO_EFORMAT, "line %d: truncated \\%c escape in string", line, e);
                }
                v = v * 16 + (uint32_t)h;
                i++;
            }
            if (v > 0x10FFFF) {
                exo_free(o);
                return exo_err_set(L->err, EXO_EFORMAT, "line %d: bad unicode escape in string", line);
            }
            put_utf8(o, &k, v);
        }
    }
    o[k] = 0;
    *out = o;
    *olen = k;
    return 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>=()[]{},.:|";

/* Lexes the inside of a {{ }} or {% %} tag. On return L->pos is just past
 * the closing delimiter and *strip_after / *trim says what to do with the
 * whitespace that follows. */
static int lex_tag(lexer *L, bool block, bool *strip_after, bool *no_trim)
{
    int depth = 0;
    char c2 = block ? '%' : '}';
    for (;;) {
        while (L->pos < L->len && is_ws(L->src[L->pos])) {
            if (L->src[L->pos] == '\n')
                L->line++;
            L->pos++;
        }
        if (L->pos >= L->len)
            return exo_err_set(L->err, EXO_EFORMAT, "line %d: unexpected end of template, expected '%s'",
                               L->line, block ? "%}" : "}}");
        const char *p = L->src + L->pos;
        size_t rem = L->len - L->pos;
        if (depth == 0) {
            if (rem >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == c2 && p[2] == '}') {
                if (p[0] == '-')
                    *strip_after = true;
                else if (block)
                    *no_trim = true;
                else
                    return exo_err_set(L->err, EXO_EFORMAT, "line %d: unexpected '+'", L->line);
                L->pos += 3;
                return 0;
            }
            if (rem >= 2 && p[0] == c2 && p[1] == '}') {
                L->pos += 2;
                return 0;
            }
        }
        char ch = p[0];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t n = 1;
            while (n < rem && ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z') ||
                               (p[n] >= '0' && p[n] <= '9') || p[n] == '_'))
                n++;
            jtok *t = push(L, TK_NAME, L->line);
            t->s = exo_strndup(p, n);
            t->slen = n;
            L->pos += n;
            continue;
        }
        if (ch >= '0' && ch <= '9') {
            size_t n = 0;
            char num[128];
            size_t k = 0;
            bool is_float = false;
            while (n < rem && ((p[n] >= '0' && p[n] <= '9') || (p[n] == '_' && n + 1 < rem && p[n + 1] >= '0' && p[n + 1] <= '9'))) {
                if (p[n] != '_' && k < sizeof num - 1)
                    num[k++] = p[n];
                n++;
            }
            if (n + 1 < rem && p[n] == '.' && p[n + 1] >= '0' && p[n + 1] <= '9') {
                is_float = true;
                if (k < sizeof num - 1)
                    num[k++] = p[n];
                n++;
                while (n < rem && ((p[n] >= '0' && p[n] <= '9') || p[n] == '_')) {
                    if (p[n] != '_' && k < sizeof num - 1)
                        num[k++] = p[n];
                    n++;
                }
            }
            if (n < rem && (p[n] == 'e' || p[n] == 'E')) {
                size_t m = n + 1;
                if (m < rem && (p[m] == '+' || p[m] == '-'))
                    m++;
                if (m < rem && p[m] >= '0' && p[m] <= '9') {
                    is_float = true;
                    while (n < m && k < sizeof num - 1)
                        num[k++] = p[n++];
                    while (n < rem && p[n] >= '0' && p[n] <= '9') {
                        if (k < sizeof num - 1)
                            num[k++] = p[n];
                        n++;
                    }
                }
            }
            num[k] = 0;
            if (k >= sizeof num - 1)
                return exo_err_set(L->err, EXO_EFORMAT, "line %d: number literal too long", L->line);
            jtok *t = push(L, is_float ? TK_FLOAT : TK_INT, L->line);
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(num, &end, 10);
                if (k > 18 && (v > (unsigned long long)INT64_MAX || k > 19))
                    return exo_err_set(L->err, EXO_EFORMAT, "line %d: integer literal too large", L->line);
                t->i = (int64_t)v;
            }
            L->pos += n;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t n = 1;
            int start_line = L->line;
            while (n < rem && p[n] != ch) {
                if (p[n] == '\\' && n + 1 < rem)
                    n++;
                n++;
            }
            if (n >= rem)
                return exo_err_set(L->err, EXO_EFORMAT, "line %d: unterminated string", start_line);
            jtok *t = push(L, TK_STRING, start_line);
            int rc = decode_string(L, p + 1, n - 1, start_line, &t->s, &t->slen);
            if (rc)
                return rc;
            L->line += count_lines(p, n);
            L->pos += n + 1;
            continue;
        }
        const char *op = NULL;
        for (int i = 0; ops2[i]; i++)
            if (rem >= 2 && p[0] == ops2[i][0] && p[1] == ops2[i][1])
                op = ops2[i];
        size_t oplen = 2;
        if (!op && strchr(ops1, ch) && ch) {
            oplen = 1;
            op = p;
        }
        if (!op)
            return exo_err_set(L->err, EXO_EFORMAT, "line %d: unexpected character '%c'", L->line, ch);
        if (ch == '(' || ch == '[' || ch == '{')
            depth++;
        else if ((ch == ')' || ch == ']' || ch == '}') && depth > 0)
            depth--;
        jtok *t = push(L, TK_OP, L->line);
        t->s = exo_strndup(p, oplen);
        t->slen = oplen;
        L->pos += oplen;
    }
}

/* Is the block tag at src[pos] (just after "{%" and its modifier) the
 * given keyword alone? Returns the position after "%}" or 0. */
static size_t match_simple_tag(const char *s, size_t len, size_t pos, const char *kw, bool *strip_after)
{
    while (pos < len && is_ws(s[pos]))
        pos++;
    size_t kl = strlen(kw);
    if (pos + kl > len || memcmp(s + pos, kw, kl))
        return 0;
    pos += kl;
    while (pos < len && is_ws(s[pos]))
        pos++;
    *strip_after = false;
    if (pos + 3 <= len && (s[pos] == '-' || s[pos] == '+') && s[pos + 1] == '%' && s[pos + 2] == '}') {
        *strip_after = s[pos] == '-';
        return pos + 3;
    }
    if (pos + 2 <= len && s[pos] == '%' && s[pos + 1] == '}')
        return pos + 2;
    return 0;
}

static int lex_normalized(const char *src, size_t len, jtoks *out, exo_err *err);

/* Jinja first turns \r\n and \r into \n everywhere, then lexes. */
int exo_jinja_lex(const char *src, size_t len, jtoks *out, exo_err *err)
{
    if (!memchr(src, '\r', len))
        return lex_normalized(src, len, out, err);
    char *norm = exo_malloc(len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            norm[k++] = src[i];
        }
    }
    int rc = lex_normalized(norm, k, out, err);
    exo_free(norm);
    return rc;
}

static int lex_normalized(const char *src, size_t len, jtoks *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    /* keep_trailing_newline=False: drop one trailing newline */
    if (len >= 2 && src[len - 2] == '\r' && src[len - 1] == '\n')
        len -= 2;
    else if (len >= 1 && (src[len - 1] == '\n' || src[len - 1] == '\r'))
        len -= 1;
    lexer L = {.src = src, .len = len, .pos = 0, .line = 1, .out = out, .err = err};
    bool line_starting = true;
    bool strip_next = false;  /* the tag just lexed ended with '-' */
    int rc = 0;
    while (L.pos <= len) {
        /* find the next tag opener */
        size_t t = L.pos;
        int kind = 0; /* 1 var, 2 block, 3 comment */
        for (; t + 1 < len; t++) {
            if (src[t] == '{' && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#')) {
                kind = src[t + 1] == '{' ? 1 : src[t + 1] == '%' ? 2 : 3;
                break;
            }
        }
        if (!kind)
            t = len;
        const char *text = src + L.pos;
        size_t tlen = t - L.pos;
        int text_line = L.line;
        char mod = (kind && t + 2 < len) ? src[t + 2] : 0;
        if (kind && mod == '-') {
            while (tlen && is_ws(text[tlen - 1]))
                tlen--;
        } else if (kind && mod != '+' && kind != 1) {
            /* lstrip_blocks: only spaces/tabs between line start and tag */
            size_t lpos = tlen;
            while (lpos > 0 && text[lpos - 1] != '\n')
                lpos--;
            if (lpos > 0 || line_starting) {
                bool only = true;
                for (size_t i = lpos; i < tlen; i++)
                    if (!is_ws(text[i]))
                        only = false;
                if (only)
                    tlen = lpos;
            }
        }
        emit_text(&L, text, tlen, text_line);
        L.line += count_lines(src + L.pos, t - L.pos);
        if (!kind)
            break;
        strip_next = false;
        size_t body = t + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
        int tag_line = L.line;
        if (kind == 3) {
            size_t e = body;
            while (e + 1 < len && !(src[e] == '#' && src[e + 1] == '}'))
                e++;
            if (e + 1 >= len) {
                rc = exo_err_set(err, EXO_EFORMAT, "line %d: unterminated comment", tag_line);
                goto fail;
            }
            bool strip = e > body && src[e - 1] == '-';
            bool plus = e > body && src[e - 1] == '+';
            L.line += count_lines(src + t, e + 2 - t);
            L.pos = e + 2;
            if (strip)
                strip_next = true;
            else if (!plus && L.pos < len && src[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
        } else {
            L.pos = body;
            bool is_block = kind == 2;
            /* {% raw %} ... {% endraw %} */
            bool sa = false;
            size_t after = is_block ? match_simple_tag(src, len, body, "raw", &sa) : 0;
            if (after) {
                size_t s = after, e = after;
                bool found = false;
                for (; e + 1 < len; e++) {
                    if (src[e] == '{' && src[e + 1] == '%') {
                        size_t b2 = e + 2 + ((e + 2 < len && (src[e + 2] == '-' || src[e + 2] == '+')) ? 1 : 0);
                        bool sa2;
                        size_t end2 = match_simple_tag(src, len, b2, "endraw", &sa2);
                        if (end2) {
                            size_t rs = s, re = e;
                            if (sa)
                                while (rs < re && is_ws(src[rs])) rs++;
                            if (e + 2 < len && src[e + 2] == '-')
                                while (re > rs && is_ws(src[re - 1])) re--;
                            emit_text(&L, src + rs, re - rs, L.line);
                            L.line += count_lines(src + t, end2 - t);
                            L.pos = end2;
                            strip_next = sa2;
                            if (!sa2 && L.pos < len && src[L.pos] == '\n') {
                                L.pos++;
                                L.line++;
                            }
                            found = true;
                            break;
                        }
                    }
                }
                if (!found) {
                    rc = exo_err_set(err, EXO_EFORMAT, "line %d: missing endraw", tag_line);
                    goto fail;
                }
                goto tag_done;
            }
            push(&L, is_block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, tag_line);
            bool strip_after = false, no_trim = false;
            rc = lex_tag(&L, is_block, &strip_after, &no_trim);
            if (rc)
                goto fail;
            push(&L, is_block ? TK_BLOCK_END : TK_VAR_END, L.line);
            if (strip_after)
                strip_next = true;
            else if (is_block && !no_trim && L.pos < len && src[L.pos] == '\n') {
                L.pos++;
                L.line++;
            }
        }
    tag_done:
        line_starting = L.pos > 0 && src[L.pos - 1] == '\n';
        if (strip_next) {
            /* `-%}\s*` consumes whitespace as part of the tag */
            while (L.pos < len && is_ws(src[L.pos])) {
                if (src[L.pos] == '\n')
                    L.line++;
                L.pos++;
            }
            line_starting = L.pos > 0 && src[L.pos - 1] == '\n';
            strip_next = false;
        }
        if (L.pos >= len)
            break;
    }
    push(&L, TK_EOF, L.line);
    return 0;
fail:
    exo_jinja_toks_free(out);
    return rc;
}

void exo_jinja_toks_free(jtoks *t)
{
    for (size_t i = 0; i < t->n; i++)
        exo_free(t->v[i].s);
    exo_free(t->v);
    memset(t, 0, sizeof *t);
}
