/* Decoders: token strings back to text.
 *
 * HF decoders work on a list of token strings ("decode_chain"), each step
 * producing a new list, and the result is the concatenation. Supported:
 * ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence. We
 * keep HF's list shape because several steps depend on token boundaries
 * (ByteFallback groups runs of <0xXX> tokens, Metaspace treats the first
 * token differently, Strip works per token). Lists are spans into an arena
 * to which each step appends its output. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

enum { D_BYTELEVEL, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_SEQ };

struct exo_tok_decoder {
    int              type;
    exo_tok_regex   *re;      /* Replace */
    char            *content; /* Replace content / Strip char */
    size_t           content_len;
    uint32_t         cp;      /* Metaspace replacement, Strip content */
    bool             prepend; /* Metaspace: prepend_scheme != never */
    size_t           start, stop;
    exo_tok_decoder *items;
    size_t           n_items;
};

static void clear(exo_tok_decoder *d)
{
    exo_tok_regex_free(d->re);
    exo_free(d->content);
    for (size_t i = 0; i < d->n_items; i++)
        clear(&d->items[i]);
    exo_free(d->items);
}

void exo_tok_decoder_free(exo_tok_decoder *d)
{
    if (!d)
        return;
    clear(d);
    exo_free(d);
}

static int one_char(json_t *j, const char *def, uint32_t *cp, exo_err *err)
{
    const char *s = json_is_string(j) ? json_string_value(j) : def;
    size_t n = strlen(s);
    if (!n || !exo_tok_utf8_valid(s, n) || exo_tok_utf8_next(s, n, 0, cp) != n)
        return exo_err_set(err, EXO_EFORMAT, "decoder: expected a single character, got \"%s\"", s);
    return 0;
}

static int parse_into(json_t *j, exo_tok_decoder *d, int depth, exo_err *err)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    memset(d, 0, sizeof *d);
    if (!type)
        return exo_err_set(err, EXO_EFORMAT, "decoder: missing type");
    if (depth > 8)
        return exo_err_set(err, EXO_EFORMAT, "decoder: nested too deeply");
    if (!strcmp(type, "ByteLevel")) d->type = D_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = D_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = D_FUSE;
    else if (!strcmp(type, "Metaspace")) {
        d->type = D_METASPACE;
        const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
        if (scheme)
            d->prepend = strcmp(scheme, "never") != 0;
        else
            d->prepend = !json_is_false(json_object_get(j, "add_prefix_space"));
        return one_char(json_object_get(j, "replacement"), "\xE2\x96\x81", &d->cp, err);
    } else if (!strcmp(type, "Replace")) {
        json_t *c = json_object_get(j, "content");
        if (!json_is_string(c))
            return exo_err_set(err, EXO_EFORMAT, "decoder Replace: missing content");
        d->type        = D_REPLACE;
        d->content     = exo_strndup(json_string_value(c), json_string_length(c));
        d->content_len = json_string_length(c);
        return exo_tok_regex_from_json(json_object_get(j, "pattern"), &d->re, err);
    } else if (!strcmp(type, "Strip")) {
        json_t *st = json_object_get(j, "start"), *sp = json_object_get(j, "stop");
        d->type  = D_STRIP;
        d->start = json_is_integer(st) && json_integer_value(st) > 0 ? (size_t)json_integer_value(st) : 0;
        d->stop  = json_is_integer(sp) && json_integer_value(sp) > 0 ? (size_t)json_integer_value(sp) : 0;
        return one_char(json_object_get(j, "content"), " ", &d->cp, err);
    } else if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr))
            return exo_err_set(err, EXO_EFORMAT, "decoder Sequence: missing decoders");
        d->type    = D_SEQ;
        d->n_items = json_array_size(arr);
        d->items   = exo_calloc(d->n_items ? d->n_items : 1, sizeof *d->items);
        for (size_t i = 0; i < d->n_items; i++) {
            int rc = parse_into(json_array_get(arr, i), &d->items[i], depth + 1, err);
            if (rc) {
                d->n_items = i + 1;
                return rc;
            }
        }
    } else
        return exo_err_set(err, EXO_EUNSUPPORTED, "decoder type %s is not supported", type);
    return 0;
}

int exo_tok_decoder_parse(json_t *j, exo_tok_decoder **out, exo_err *err)
{
    *out = NULL;
    if (!j || json_is_null(j))
        return 0;
    exo_tok_decoder *d = exo_calloc(1, sizeof *d);
    int rc = parse_into(j, d, 0, err);
    if (rc) {
        exo_tok_decoder_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* A token <0xXX> -> its byte, as Rust's u8::from_str_radix(&t[3..5], 16). */
static int byte_token(const char *t, size_t n)
{
    if (n != 6 || memcmp(t, "<0x", 3) || t[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d;
        if (i == 3 && c == '+') /* from_str_radix accepts a leading '+' */
            continue;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

static void flush_bytes(exo_tok_buf *arena, exo_tok_spans *out, const char *bytes, size_t nb)
{
    if (!nb)
        return;
    if (exo_tok_utf8_valid(bytes, nb)) {
        size_t off = arena->len;
        exo_tok_buf_put(arena, bytes, nb);
        exo_tok_spans_push(out, off, nb, false);
        return;
    }
    for (size_t i = 0; i < nb; i++) {
        size_t off = arena->len;
        exo_tok_buf_put(arena, "\xEF\xBF\xBD", 3);
        exo_tok_spans_push(out, off, 3, false);
    }
}

static void run(const exo_tok_decoder *d, exo_tok_buf *arena, exo_tok_spans *toks)
{
    exo_tok_spans out = {0};
    switch (d->type) {
    case D_SEQ:
        for (size_t i = 0; i < d->n_items; i++)
            run(&d->items[i], arena, toks);
        return;
    case D_BYTELEVEL: {
        /* Each token maps char -> byte if all its chars are in the alphabet,
         * else stays as its UTF-8; the whole is then made valid lossily. */
        exo_tok_buf raw = {0};
        for (size_t i = 0; i < toks->n; i++) {
            const char *t = arena->p + toks->v[i].off;
            if (!exo_tok_bytelevel_to_bytes(t, toks->v[i].len, &raw))
                exo_tok_buf_put(&raw, t, toks->v[i].len);
        }
        size_t off = arena->len;
        exo_tok_utf8_lossy(raw.p ? raw.p : "", raw.len, arena);
        exo_tok_spans_push(&out, off, arena->len - off, false);
        exo_tok_buf_free(&raw);
        break;
    }
    case D_FUSE: {
        size_t off = arena->len;
        for (size_t i = 0; i < toks->n; i++) {
            exo_tok_buf_reserve(arena, toks->v[i].len);
            memcpy(arena->p + arena->len, arena->p + toks->v[i].off, toks->v[i].len);
            arena->len += toks->v[i].len;
        }
        exo_tok_spans_push(&out, off, arena->len - off, false);
        break;
    }
    case D_BYTEFALLBACK: {
        char *bytes = exo_malloc(toks->n + 1);
        size_t nb = 0;
        for (size_t i = 0; i < toks->n; i++) {
            int b = byte_token(arena->p + toks->v[i].off, toks->v[i].len);
            if (b >= 0) {
                bytes[nb++] = (char)b;
                continue;
            }
            flush_bytes(arena, &out, bytes, nb);
            nb = 0;
            exo_tok_spans_push(&out, toks->v[i].off, toks->v[i].len, false);
        }
        flush_bytes(arena, &out, bytes, nb);
        exo_free(bytes);
        break;
    }
    case D_METASPACE:
        for (size_t i = 0; i < toks->n; i++) {
            size_t off = arena->len, n = toks->v[i].len;
            exo_tok_buf_reserve(arena, n);
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                const char *t = arena->p + toks->v[i].off;
                size_t len = exo_tok_utf8_next(t, n, k, &cp);
                if (cp == d->cp) {
                    if (!(i == 0 && d->prepend))
                        arena->p[arena->len++] = ' ';
                } else {
                    memcpy(arena->p + arena->len, t + k, len);
                    arena->len += len;
                }
                k += len;
            }
            exo_tok_spans_push(&out, off, arena->len - off, false);
        }
        break;
    case D_REPLACE: {
        exo_tok_spans m = {0};
        for (size_t i = 0; i < toks->n; i++) {
            m.n = 0;
            size_t toff = toks->v[i].off, n = toks->v[i].len;
            exo_tok_buf_reserve(arena, 1);
            exo_tok_regex_find_all(d->re, arena->p + toff, n, &m);
            size_t off = arena->len, at = 0;
            for (size_t k = 0; k < m.n; k++) {
                exo_tok_buf_reserve(arena, m.v[k].off - at + d->content_len);
                memcpy(arena->p + arena->len, arena->p + toff + at, m.v[k].off - at);
                arena->len += m.v[k].off - at;
                exo_tok_buf_put(arena, d->content, d->content_len);
                at = m.v[k].off + m.v[k].len;
            }
            exo_tok_buf_reserve(arena, n - at);
            memcpy(arena->p + arena->len, arena->p + toff + at, n - at);
            arena->len += n - at;
            exo_tok_spans_push(&out, off, arena->len - off, false);
        }
        exo_tok_spans_free(&m);
        break;
    }
    case D_STRIP:
        for (size_t i = 0; i < toks->n; i++) {
            const char *t = arena->p + toks->v[i].off;
            size_t n = toks->v[i].len, b = 0, e = n;
            for (size_t k = 0; k < d->start && b < e; k++) {
                uint32_t cp;
                size_t len = exo_tok_utf8_next(t, n, b, &cp);
                if (cp != d->cp)
                    break;
                b += len;
            }
            for (size_t k = 0; k < d->stop && e > b; k++) {
                size_t st = e - 1;
                while (st > b && ((unsigned char)t[st] & 0xC0) == 0x80)
                    st--;
                uint32_t cp;
                exo_tok_utf8_next(t, e, st, &cp);
                if (cp != d->cp)
                    break;
                e = st;
            }
            exo_tok_spans_push(&out, toks->v[i].off + b, e - b, false);
        }
        break;
    }
    exo_tok_spans_free(toks);
    *toks = out;
}

void exo_tok_decoder_run(const exo_tok_decoder *d, exo_tok_buf *arena, exo_tok_spans *tokens,
                         exo_tok_buf *out)
{
    if (d)
        run(d, arena, tokens);
    for (size_t i = 0; i < tokens->n; i++) {
        if (!d && i)
            exo_tok_buf_putc(out, ' ');
        exo_tok_buf_put(out, arena->p + tokens->v[i].off, tokens->v[i].len);
    }
}
