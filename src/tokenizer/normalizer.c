/* Normalizers: the text rewrites HF applies before pre-tokenization.
 *
 * Supported: NFC, NFD, NFKC, NFKD (utf8proc), Prepend, Replace (literal or
 * regex), Lowercase, Strip, Sequence. We only need the normalized text (ids
 * are all we return), so unlike HF no alignment to the original offsets is
 * kept. Each step writes a fresh buffer; Sequence ping-pongs between two. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>
#include <utf8proc.h>

enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE, N_LOWER, N_STRIP, N_SEQ };

struct exo_tok_normalizer {
    int                 type;
    char               *str; /* Prepend text / Replace content */
    size_t              str_len;
    exo_tok_regex      *re;  /* Replace pattern */
    bool                left, right;
    exo_tok_normalizer *items;
    size_t              n_items;
};

static void clear(exo_tok_normalizer *nz)
{
    exo_free(nz->str);
    exo_tok_regex_free(nz->re);
    for (size_t i = 0; i < nz->n_items; i++)
        clear(&nz->items[i]);
    exo_free(nz->items);
}

void exo_tok_normalizer_free(exo_tok_normalizer *nz)
{
    if (!nz)
        return;
    clear(nz);
    exo_free(nz);
}

static int parse_into(json_t *j, exo_tok_normalizer *nz, int depth, exo_err *err)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    memset(nz, 0, sizeof *nz);
    if (!type)
        return exo_err_set(err, EXO_EFORMAT, "normalizer: missing type");
    if (depth > 8)
        return exo_err_set(err, EXO_EFORMAT, "normalizer: nested too deeply");
    if (!strcmp(type, "NFC")) nz->type = N_NFC;
    else if (!strcmp(type, "NFD")) nz->type = N_NFD;
    else if (!strcmp(type, "NFKC")) nz->type = N_NFKC;
    else if (!strcmp(type, "NFKD")) nz->type = N_NFKD;
    else if (!strcmp(type, "Lowercase")) nz->type = N_LOWER;
    else if (!strcmp(type, "Prepend")) {
        json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p))
            return exo_err_set(err, EXO_EFORMAT, "normalizer Prepend: missing prepend");
        nz->type    = N_PREPEND;
        nz->str     = exo_strndup(json_string_value(p), json_string_length(p));
        nz->str_len = json_string_length(p);
    } else if (!strcmp(type, "Replace")) {
        json_t *c = json_object_get(j, "content");
        if (!json_is_string(c))
            return exo_err_set(err, EXO_EFORMAT, "normalizer Replace: missing content");
        nz->type    = N_REPLACE;
        nz->str     = exo_strndup(json_string_value(c), json_string_length(c));
        nz->str_len = json_string_length(c);
        return exo_tok_regex_from_json(json_object_get(j, "pattern"), &nz->re, err);
    } else if (!strcmp(type, "Strip")) {
        nz->type  = N_STRIP;
        nz->left  = json_is_true(json_object_get(j, "strip_left"));
        nz->right = json_is_true(json_object_get(j, "strip_right"));
    } else if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr))
            return exo_err_set(err, EXO_EFORMAT, "normalizer Sequence: missing normalizers");
        nz->type    = N_SEQ;
        nz->n_items = json_array_size(arr);
        nz->items   = exo_calloc(nz->n_items ? nz->n_items : 1, sizeof *nz->items);
        for (size_t i = 0; i < nz->n_items; i++) {
            int rc = parse_into(json_array_get(arr, i), &nz->items[i], depth + 1, err);
            if (rc) {
                nz->n_items = i + 1;
                return rc;
            }
        }
    } else
        return exo_err_set(err, EXO_EUNSUPPORTED, "normalizer type %s is not supported", type);
    return 0;
}

int exo_tok_normalizer_parse(json_t *j, exo_tok_normalizer **out, exo_err *err)
{
    *out = NULL;
    if (!j || json_is_null(j))
        return 0;
    exo_tok_normalizer *nz = exo_calloc(1, sizeof *nz);
    int rc = parse_into(j, nz, 0, err);
    if (rc) {
        exo_tok_normalizer_free(nz);
        return rc;
    }
    *out = nz;
    return 0;
}

static bool all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

static void unicode_form(int type, const char *s, size_t n, exo_tok_buf *out)
{
    /* ASCII is invariant under all four forms: the common case is a copy. */
    if (all_ascii(s, n)) {
        exo_tok_buf_put(out, s, n);
        return;
    }
    utf8proc_option_t opt = UTF8PROC_STABLE;
    if (type == N_NFC || type == N_NFKC)
        opt |= UTF8PROC_COMPOSE;
    else
        opt |= UTF8PROC_DECOMPOSE;
    if (type == N_NFKC || type == N_NFKD)
        opt |= UTF8PROC_COMPAT;
    utf8proc_ssize_t need =
        utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, NULL, 0, opt);
    if (need < 0) { /* cannot happen for valid UTF-8; keep the text as is */
        exo_tok_buf_put(out, s, n);
        return;
    }
    utf8proc_int32_t *cps = exo_malloc(((size_t)need + 1) * sizeof *cps);
    need = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, cps, need, opt);
    utf8proc_ssize_t m = need >= 0 ? utf8proc_normalize_utf32(cps, need, opt) : -1;
    if (m < 0) {
        exo_tok_buf_put(out, s, n);
    } else {
        exo_tok_buf_reserve(out, (size_t)m * 4);
        for (utf8proc_ssize_t i = 0; i < m; i++)
            out->len += exo_tok_utf8_encode((uint32_t)cps[i], out->p + out->len);
    }
    exo_free(cps);
}

static void lowercase(const char *s, size_t n, exo_tok_buf *out)
{
    exo_tok_buf_reserve(out, n);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = exo_tok_utf8_next(s, n, i, &cp);
        if (cp < 0x80) {
            exo_tok_buf_putc(out, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        } else if (cp == 0x130) { /* Rust: 'İ'.to_lowercase() == "i\u{307}" */
            exo_tok_buf_put(out, "i\xCC\x87", 3);
        } else {
            char u[4];
            uint32_t lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            exo_tok_buf_put(out, u, exo_tok_utf8_encode(lc, u));
        }
        i += k;
    }
}

static void strip(const exo_tok_normalizer *nz, const char *s, size_t n, exo_tok_buf *out)
{
    size_t b = 0, e = n;
    if (nz->left)
        while (b < e) {
            uint32_t cp;
            size_t k = exo_tok_utf8_next(s, e, b, &cp);
            if (!exo_tok_uc_is_whitespace(cp))
                break;
            b += k;
        }
    if (nz->right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s[st] & 0xC0) == 0x80)
                st--;
            uint32_t cp;
            exo_tok_utf8_next(s, e, st, &cp);
            if (!exo_tok_uc_is_whitespace(cp))
                break;
            e = st;
        }
    exo_tok_buf_put(out, s + b, e - b);
}

static void replace(const exo_tok_normalizer *nz, const char *s, size_t n, exo_tok_buf *out)
{
    exo_tok_spans m = {0};
    exo_tok_regex_find_all(nz->re, s, n, &m);
    size_t at = 0;
    for (size_t i = 0; i < m.n; i++) {
        exo_tok_buf_put(out, s + at, m.v[i].off - at);
        exo_tok_buf_put(out, nz->str, nz->str_len);
        at = m.v[i].off + m.v[i].len;
    }
    exo_tok_buf_put(out, s + at, n - at);
    exo_tok_spans_free(&m);
}

void exo_tok_normalizer_apply(const exo_tok_normalizer *nz, const char *s, size_t n,
                              exo_tok_buf *out)
{
    out->len = 0;
    switch (nz->type) {
    case N_NFC:
    case N_NFD:
    case N_NFKC:
    case N_NFKD: unicode_form(nz->type, s, n, out); break;
    case N_PREPEND:
        if (n)
            exo_tok_buf_put(out, nz->str, nz->str_len);
        exo_tok_buf_put(out, s, n);
        break;
    case N_REPLACE: replace(nz, s, n, out); break;
    case N_LOWER: lowercase(s, n, out); break;
    case N_STRIP: strip(nz, s, n, out); break;
    case N_SEQ: {
        exo_tok_buf tmp = {0};
        exo_tok_buf_put(out, s, n);
        for (size_t i = 0; i < nz->n_items; i++) {
            exo_tok_normalizer_apply(&nz->items[i], out->p ? out->p : "", out->len, &tmp);
            exo_tok_buf swap = *out;
            *out = tmp;
            tmp  = swap;
        }
        exo_tok_buf_free(&tmp);
        break;
    }
    }
    exo_tok_buf_reserve(out, 1); /* out->p is never NULL afterwards */
}
