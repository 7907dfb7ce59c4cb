/* A growable byte buffer and a JSON writer on top of it.
 *
 * The streaming encoders write one SSE event per generated token; building a
 * jansson tree and dumping it for each of them costs several allocations per
 * token, so hot paths append JSON text directly here. The escaper also
 * repairs invalid UTF-8 (U+FFFD per bad byte): a token's text is untrusted
 * model output, and the wire must stay valid JSON whatever it holds.
 *
 * A buffer never grows past its cap (exo_sbuf_set_max; 1 GiB by default):
 * an append that would is dropped whole and the buffer remembers it
 * (exo_sbuf_overflowed), as a stdio stream remembers an error, so writers
 * need not check every call and the reader checks once. */
#ifndef EXO_CORE_SBUF_H
#define EXO_CORE_SBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_SBUF_DEFAULT_MAX ((size_t)1 << 30)

typedef struct exo_sbuf {
    char  *data; /* NUL-terminated when non-NULL */
    size_t len, cap;
    size_t max;      /* 0: EXO_SBUF_DEFAULT_MAX */
    bool   overflow; /* an append was dropped for the cap */
} exo_sbuf;

void  exo_sbuf_init(exo_sbuf *b);
void  exo_sbuf_free(exo_sbuf *b);
void  exo_sbuf_clear(exo_sbuf *b); /* len = 0, keeps the memory; forgets an overflow */
void  exo_sbuf_set_max(exo_sbuf *b, size_t max);
bool  exo_sbuf_overflowed(const exo_sbuf *b);
/* Makes room for `total` bytes (+ the NUL) at once, exactly; false over the cap. */
bool  exo_sbuf_reserve(exo_sbuf *b, size_t total);
void  exo_sbuf_append(exo_sbuf *b, const void *s, size_t n);
void  exo_sbuf_puts(exo_sbuf *b, const char *s);
void  exo_sbuf_putc(exo_sbuf *b, char c);
void  exo_sbuf_printf(exo_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void  exo_sbuf_vprintf(exo_sbuf *b, const char *fmt, va_list ap);
/* Hands the buffer (NUL-terminated, never NULL) to the caller; b is empty after. */
char *exo_sbuf_take(exo_sbuf *b);

/* JSON values. */
void exo_sbuf_json_strn(exo_sbuf *b, const char *s, size_t n); /* "..." escaped */
void exo_sbuf_json_str(exo_sbuf *b, const char *s);            /* NULL -> null */
void exo_sbuf_json_num(exo_sbuf *b, double v);                 /* non-finite -> -9999.0 / 0 */
void exo_sbuf_json_int(exo_sbuf *b, int64_t v);
/* The UTF-8 bytes of s as a JSON array of integers ([104,105]). */
void exo_sbuf_json_bytes(exo_sbuf *b, const char *s, size_t n);

/* True if s[0..n) is well-formed UTF-8 (no surrogates, no overlongs). */
bool exo_sbuf_utf8_valid(const char *s, size_t n);

#endif
