/* Patterns for Split pre-tokenizers and Replace normalizers/decoders.
 *
 * HF's tokenizers uses Oniguruma; we use PCRE2 (8-bit, UTF + UCP so that
 * \s \w \d and \p{..} are Unicode-aware, JIT for speed). HF patterns come in
 * two kinds: {"Regex": ...} and {"String": ...}; a String is a literal and is
 * matched with memmem, which is both faster and free of escaping issues.
 * Match data is created per call so a compiled tokenizer stays immutable and
 * thread-safe. Text handed to find_all is always valid UTF-8 (the tokenizer
 * validates input once), so matching skips PCRE2's own UTF check. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <pcre2.h>
#include <string.h>

struct exo_tok_regex {
    pcre2_code *code; /* NULL for a literal */
    char       *lit;
    size_t      lit_len;
    bool        jit;
};

int exo_tok_regex_compile(const char *pat, size_t len, bool literal, exo_tok_regex **out,
                          exo_err *err)
{
    exo_tok_regex *re = exo_calloc(1, sizeof *re);
    if (literal) {
        re->lit     = exo_strndup(pat, len);
        re->lit_len = len;
        *out        = re;
        return 0;
    }
    int ec;
    PCRE2_SIZE eo;
    re->code = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        exo_free(re);
        return exo_err_set(err, EXO_EFORMAT, "regex /%.*s/ at %zu: %s", (int)(len > 80 ? 80 : len),
                           pat, (size_t)eo, (char *)msg);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    *out    = re;
    return 0;
}

void exo_tok_regex_free(exo_tok_regex *re)
{
    if (!re)
        return;
    pcre2_code_free(re->code);
    exo_free(re->lit);
    exo_free(re);
}

int exo_tok_regex_find_all(const exo_tok_regex *re, const char *s, size_t n, exo_tok_spans *out)
{
    if (!re->code) {
        if (!re->lit_len)
            return 0;
        const char *p = s, *end = s + n;
        while ((size_t)(end - p) >= re->lit_len) {
            const char *m = memmem(p, (size_t)(end - p), re->lit, re->lit_len);
            if (!m)
                break;
            exo_tok_spans_push(out, (size_t)(m - s), re->lit_len, true);
            p = m + re->lit_len;
        }
        return 0;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!md)
        return EXO_ENOMEM;
    size_t start = 0;
    int rc = 0;
    while (start <= n) {
        uint32_t opts = PCRE2_NO_UTF_CHECK;
        int m = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, start, opts, md, NULL)
                        : pcre2_match(re->code, (PCRE2_SPTR)s, n, start, opts, md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT)
            m = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, opts | PCRE2_NO_JIT, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            rc = EXO_EINTERNAL;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me > ms) {
            exo_tok_spans_push(out, ms, me - ms, true);
            start = me;
        } else {
            /* Empty match: Rust's find_iter reports it, and so do we; it
             * never contributes text. Step over one character. */
            exo_tok_spans_push(out, ms, 0, true);
            if (ms >= n)
                break;
            uint32_t cp;
            start = ms + exo_tok_utf8_next(s, n, ms, &cp);
        }
    }
    pcre2_match_data_free(md);
    return rc;
}

int exo_tok_regex_from_json(json_t *pattern, exo_tok_regex **out, exo_err *err)
{
    json_t *r = json_object_get(pattern, "Regex");
    json_t *s = json_object_get(pattern, "String");
    if (json_is_string(r))
        return exo_tok_regex_compile(json_string_value(r), json_string_length(r), false, out, err);
    if (json_is_string(s))
        return exo_tok_regex_compile(json_string_value(s), json_string_length(s), true, out, err);
    return exo_err_set(err, EXO_EFORMAT, "pattern: expected {\"Regex\":...} or {\"String\":...}");
}
