/* Growable buffer and direct JSON writer (see sbuf.h). */
#include "core/sbuf.h"

#include "core/alloc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void exo_sbuf_init(exo_sbuf *b)
{
    b->data = NULL;
    b->len = b->cap = b->max = 0;
    b->overflow = false;
}

/* Empties b, keeping its cap. */
static void reset(exo_sbuf *b)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->overflow = false;
}

void exo_sbuf_free(exo_sbuf *b)
{
    exo_free(b->data);
    reset(b);
}

void exo_sbuf_clear(exo_sbuf *b)
{
    b->len = 0;
    b->overflow = false;
    if (b->data)
        b->data[0] = 0;
}

static size_t max_of(const exo_sbuf *b) { return b->max ? b->max : EXO_SBUF_DEFAULT_MAX; }

/* Room for extra more bytes and the NUL; false (and overflow set) over the cap. */
static bool reserve(exo_sbuf *b, size_t extra)
{
    size_t need;
    if (exo_size_add(b->len, extra, &need) || exo_size_add(need, 1, &need) || need - 1 > max_of(b)) {
        b->overflow = true;
        return false;
    }
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    if (cap - 1 > max_of(b))
        cap = max_of(b) + 1;
    b->data = exo_realloc(b->data, cap);
    b->cap = cap;
    return true;
}

void exo_sbuf_set_max(exo_sbuf *b, size_t max) { b->max = max; }
bool exo_sbuf_overflowed(const exo_sbuf *b) { return b->overflow; }

bool exo_sbuf_reserve(exo_sbuf *b, size_t total)
{
    if (total > max_of(b)) {
        b->overflow = true;
        return false;
    }
    if (total + 1 > b->cap) {
        b->data = exo_realloc(b->data, total + 1);
        if (!b->cap)
            b->data[0] = 0;
        b->cap = total + 1;
    }
    return true;
}

void exo_sbuf_append(exo_sbuf *b, const void *s, size_t n)
{
    if (!reserve(b, n))
        return;
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void exo_sbuf_puts(exo_sbuf *b, const char *s) { exo_sbuf_append(b, s, strlen(s)); }

void exo_sbuf_putc(exo_sbuf *b, char c) { exo_sbuf_append(b, &c, 1); }

void exo_sbuf_vprintf(exo_sbuf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    if ((size_t)n < sizeof small) {
        exo_sbuf_append(b, small, (size_t)n);
    } else {
        if (!reserve(b, (size_t)n)) {
            va_end(ap2);
            return;
        }
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
}

void exo_sbuf_printf(exo_sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    exo_sbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

char *exo_sbuf_take(exo_sbuf *b)
{
    if (!b->data) {
        b->data = exo_malloc(1);
        b->data[0] = 0;
    }
    char *d = b->data;
    reset(b);
    return d;
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0 if malformed. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

bool exo_sbuf_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_seq(u + i, n - i);
        if (!l)
            return false;
        i += l;
    }
    return true;
}

void exo_sbuf_json_strn(exo_sbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    (void)reserve(b, n + 2); /* a hint: each append below checks the cap itself */
    exo_sbuf_putc(b, '"');
    size_t run = 0; /* start of the pending run of bytes copied verbatim */
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        const char *esc = NULL;
        char ubuf[7];
        size_t adv = 1;
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t l = utf8_seq(u + i, n - i);
            if (l) {
                i += l;
                continue;
            }
            esc = "\xEF\xBF\xBD"; /* U+FFFD for a malformed byte */
        } else if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else {
            ubuf[0] = '\\', ubuf[1] = 'u', ubuf[2] = '0', ubuf[3] = '0';
            ubuf[4] = hex[c >> 4], ubuf[5] = hex[c & 15], ubuf[6] = 0;
            esc = ubuf;
        }
        exo_sbuf_append(b, s + run, i - run);
        exo_sbuf_puts(b, esc);
        i += adv;
        run = i;
    }
    exo_sbuf_append(b, s + run, i - run);
    exo_sbuf_putc(b, '"');
}

void exo_sbuf_json_str(exo_sbuf *b, const char *s)
{
    if (!s)
        exo_sbuf_puts(b, "null");
    else
        exo_sbuf_json_strn(b, s, strlen(s));
}

void exo_sbuf_json_num(exo_sbuf *b, double v)
{
    if (isnan(v))
        v = 0;
    else if (isinf(v))
        v = v < 0 ? -9999.0 : 9999.0;
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%.9g", v);
    exo_sbuf_append(b, tmp, (size_t)n);
    /* "%g" can print 1e+20 or 5: both are valid JSON numbers. */
}

void exo_sbuf_json_int(exo_sbuf *b, int64_t v) { exo_sbuf_printf(b, "%lld", (long long)v); }

void exo_sbuf_json_bytes(exo_sbuf *b, const char *s, size_t n)
{
    /* Per-token hot path (logprobs): digits by hand, no printf. */
    if (!reserve(b, n * 4 + 2))
        return;
    char *o = b->data + b->len;
    *o++ = '[';
    for (size_t i = 0; i < n; i++) {
        unsigned v = (unsigned char)s[i];
        if (i)
            *o++ = ',';
        if (v >= 100)
            *o++ = (char)('0' + v / 100);
        if (v >= 10)
            *o++ = (char)('0' + v / 10 % 10);
        *o++ = (char)('0' + v % 10);
    }
    *o++ = ']';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = 0;
}
