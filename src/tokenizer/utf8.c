/* UTF-8, Unicode-property and buffer helpers for the tokenizer.
 *
 * The predicates mirror the Rust std functions HF's tokenizers call
 * (char::is_whitespace, is_numeric, is_alphanumeric), using utf8proc's
 * category tables; lossy conversion mirrors String::from_utf8_lossy because
 * that is what HF's byte-level decoder returns, and we must produce the same
 * U+FFFD count for the same broken bytes. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>
#include <utf8proc.h>

void exo_tok_buf_reserve(exo_tok_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra)
        cap *= 2;
    b->p   = exo_realloc(b->p, cap);
    b->cap = cap;
}

void exo_tok_buf_put(exo_tok_buf *b, const void *src, size_t n)
{
    if (!n)
        return;
    exo_tok_buf_reserve(b, n);
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

void exo_tok_buf_putc(exo_tok_buf *b, char c)
{
    exo_tok_buf_reserve(b, 1);
    b->p[b->len++] = c;
}

void exo_tok_buf_free(exo_tok_buf *b)
{
    exo_free(b->p);
    memset(b, 0, sizeof *b);
}

void exo_tok_spans_push(exo_tok_spans *s, size_t off, size_t len, bool flag)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v   = exo_realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (exo_tok_span){off, len, flag};
}

void exo_tok_spans_free(exo_tok_spans *s)
{
    exo_free(s->v);
    memset(s, 0, sizeof *s);
}

void exo_tok_ids_push(exo_tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        ids->cap = ids->cap ? ids->cap * 2 : 64;
        ids->v   = exo_realloc(ids->v, ids->cap * sizeof *ids->v);
    }
    ids->v[ids->n++] = id;
}

size_t exo_tok_utf8_next(const char *str, size_t n, size_t i, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)str;
    uint8_t c = s[i];
    if (c < 0x80 || i + 1 >= n) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F);
        return 2;
    }
    if (c < 0xF0 || i + 3 >= n) {
        if (i + 2 >= n) {
            *cp = c;
            return 1;
        }
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
          ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    return 4;
}

size_t exo_tok_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid sequence at s[i] (1-4), or -k where k >= 1 is the
 * length of the maximal invalid subpart (the Unicode "maximal subpart"
 * rule, which is what Rust's Utf8Chunks reports as error_len), or 0 when the
 * sequence is a valid but truncated prefix at the end of the input. */
static int seq_len(const uint8_t *s, size_t n, size_t i)
{
    uint8_t c = s[i];
    if (c < 0x80)
        return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if (i + (size_t)k >= n)
            return 0;
        uint8_t d = s[i + (size_t)k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF))
            return -k;
    }
    return need + 1;
}

bool exo_tok_utf8_valid(const char *str, size_t n)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = seq_len(s, n, i);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

void exo_tok_utf8_lossy(const char *str, size_t n, exo_tok_buf *out)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, run = 0;
    exo_tok_buf_reserve(out, n);
    while (i < n) {
        int k = seq_len(s, n, i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        exo_tok_buf_put(out, s + run, i - run);
        exo_tok_buf_put(out, "\xEF\xBF\xBD", 3);
        if (k == 0) { /* truncated at the end: the rest is one subpart */
            i = run = n;
            break;
        }
        i += (size_t)(-k);
        run = i;
    }
    exo_tok_buf_put(out, s + run, n - run);
}

size_t exo_tok_utf8_incomplete_tail(const char *str, size_t n)
{
    const uint8_t *s = (const uint8_t *)str;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if ((s[i] & 0xC0) == 0x80)
            continue;
        return seq_len(s, n, i) == 0 ? back : 0;
    }
    return 0;
}

bool exo_tok_uc_is_whitespace(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool exo_tok_uc_is_numeric(uint32_t c)
{
    if (c < 0x80)
        return c >= '0' && c <= '9';
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
           cat == UTF8PROC_CATEGORY_NO;
}

bool exo_tok_uc_is_alnum(uint32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           exo_tok_uc_is_numeric(c);
}

bool exo_tok_uc_is_punct(uint32_t c)
{
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
               (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the
 * other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) to U+0100.. in byte order. */
static bool bytelevel_keeps(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t exo_tok_bytelevel_char(uint8_t b)
{
    if (bytelevel_keeps(b))
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xA0)
        return 256u + 33 + (b - 0x7Fu);
    return 323; /* 0xAD */
}

int exo_tok_bytelevel_byte(uint32_t cp)
{
    if (cp < 256)
        return bytelevel_keeps(cp) ? (int)cp : -1;
    if (cp <= 256 + 32)
        return (int)(cp - 256);
    if (cp <= 256 + 33 + 33)
        return (int)(cp - 256 - 33 + 0x7F);
    return cp == 323 ? 0xAD : -1;
}

bool exo_tok_bytelevel_to_bytes(const char *s, size_t n, exo_tok_buf *out)
{
    size_t start = out->len;
    exo_tok_buf_reserve(out, n);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += exo_tok_utf8_next(s, n, i, &cp);
        int b = exo_tok_bytelevel_byte(cp);
        if (b < 0) {
            out->len = start;
            return false;
        }
        out->p[out->len++] = (char)b;
    }
    return true;
}
