/* A purpose-built JSON scanner for the two big sections of tokenizer.json.
 *
 * Why: model.vocab and model.merges are 95% of an 11-33 MB file. Building a
 * jansson DOM for them costs ~250 ms for Qwen3 (one heap node per token and
 * per merge), while the load budget is 150 ms. So we locate the two values
 * with a bracket-counting skip, parse them here directly into the vocab's
 * arena and hash tables, and hand jansson the document with those two spans
 * blanked out ("{}"/"[]" padded with spaces) for everything else.
 *
 * The skip only has to find the end of a value; the two sections themselves
 * are parsed strictly (strings fully unescaped, ids range-checked, merges in
 * both the "a b" and ["a","b"] forms), and the rest is validated by jansson.
 * The whole file is checked to be valid UTF-8 before any of this runs. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

typedef struct scan {
    const char *s;
    size_t      n, i;
} scan;

static void ws(scan *c)
{
    while (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch != ' ' && ch != '\n' && ch != '\r' && ch != '\t')
            break;
        c->i++;
    }
}

static int hex4(const char *p, uint32_t *v)
{
    uint32_t x = 0;
    for (int k = 0; k < 4; k++) {
        char ch = p[k];
        x <<= 4;
        if (ch >= '0' && ch <= '9') x |= (uint32_t)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') x |= (uint32_t)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') x |= (uint32_t)(ch - 'A' + 10);
        else return -1;
    }
    *v = x;
    return 0;
}

/* Parses the string at c->i (which must be '"') and appends its unescaped
 * bytes to out. */
static int string(scan *c, exo_tok_buf *out)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return -1;
    c->i++;
    size_t run = c->i;
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            exo_tok_buf_put(out, c->s + run, c->i - run);
            c->i++;
            return 0;
        }
        if (ch < 0x20)
            return -1;
        if (ch != '\\') {
            c->i++;
            continue;
        }
        exo_tok_buf_put(out, c->s + run, c->i - run);
        if (c->i + 1 >= c->n)
            return -1;
        char e = c->s[c->i + 1];
        c->i += 2;
        char lit;
        switch (e) {
        case '"': lit = '"'; break;
        case '\\': lit = '\\'; break;
        case '/': lit = '/'; break;
        case 'b': lit = '\b'; break;
        case 'f': lit = '\f'; break;
        case 'n': lit = '\n'; break;
        case 'r': lit = '\r'; break;
        case 't': lit = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (c->i + 4 > c->n || hex4(c->s + c->i, &cp))
                return -1;
            c->i += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (c->i + 6 > c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u' ||
                    hex4(c->s + c->i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                c->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            char u[4];
            exo_tok_buf_put(out, u, exo_tok_utf8_encode(cp, u));
            run = c->i;
            continue;
        }
        default: return -1;
        }
        exo_tok_buf_putc(out, lit);
        run = c->i;
    }
    return -1;
}

/* Skips one value of any kind by counting brackets outside strings. */
static int skip_value(scan *c)
{
    ws(c);
    size_t depth = 0;
    while (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch == '"') {
            c->i++;
            for (;;) { /* find the closing quote: not preceded by an odd run of '\\' */
                const char *q = c->i < c->n ? memchr(c->s + c->i, '"', c->n - c->i) : NULL;
                if (!q)
                    return -1;
                size_t k = (size_t)(q - c->s), bs = 0;
                while (k - bs > c->i && c->s[k - bs - 1] == '\\')
                    bs++;
                c->i = k + 1;
                if (!(bs & 1))
                    break;
            }
            if (!depth)
                return 0;
            continue;
        }
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (!depth)
                return 0; /* end of the enclosing container: empty value */
            if (!--depth) {
                c->i++;
                return 0;
            }
        } else if (!depth && (ch == ',' || ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')) {
            return 0; /* end of a scalar */
        }
        c->i++;
    }
    return depth ? -1 : 0;
}

static bool key_is(const exo_tok_buf *k, const char *lit)
{
    size_t n = strlen(lit);
    return k->len == n && !memcmp(k->p, lit, n);
}

int exo_tok_json_locate(const char *s, size_t n, size_t vocab_span[2], size_t merges_span[2],
                        exo_err *err)
{
    scan c = {s, n, 0};
    exo_tok_buf key = {0};
    int depth = 0; /* 0: top level object, 1: inside "model" */
    vocab_span[0] = vocab_span[1] = merges_span[0] = merges_span[1] = 0;
    ws(&c);
    if (c.i >= n || s[c.i] != '{')
        goto bad;
    c.i++;
    for (;;) {
        ws(&c);
        if (c.i < n && s[c.i] == '}') {
            c.i++;
            if (depth == 0)
                break;
            depth = 0;
            goto next;
        }
        key.len = 0;
        if (string(&c, &key))
            goto bad;
        ws(&c);
        if (c.i >= n || s[c.i] != ':')
            goto bad;
        c.i++;
        ws(&c);
        if (depth == 0 && key_is(&key, "model") && c.i < n && s[c.i] == '{') {
            c.i++;
            depth = 1;
            continue;
        }
        size_t start = c.i;
        if (skip_value(&c) || c.i == start)
            goto bad;
        if (depth == 1 && key_is(&key, "vocab")) {
            vocab_span[0] = start;
            vocab_span[1] = c.i;
        } else if (depth == 1 && key_is(&key, "merges")) {
            merges_span[0] = start;
            merges_span[1] = c.i;
        }
    next:
        ws(&c);
        if (c.i < n && s[c.i] == ',') {
            c.i++;
            continue;
        }
        if (c.i < n && s[c.i] == '}')
            continue;
        goto bad;
    }
    exo_tok_buf_free(&key);
    return 0;
bad:
    exo_tok_buf_free(&key);
    return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: malformed JSON near byte %zu", c.i);
}

/* An id: a non-negative JSON integer below EXO_TOK_MAX_ID. */
static int number(scan *c, uint32_t *out)
{
    uint64_t v = 0;
    size_t start = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
        v = v * 10 + (uint64_t)(c->s[c->i] - '0');
        if (v >= EXO_TOK_MAX_ID)
            return -1;
        c->i++;
    }
    if (c->i == start || (c->i - start > 1 && c->s[start] == '0'))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int exo_tok_vocab_parse(exo_tok_vocab *v, const char *s, size_t n, bool byte_level, exo_err *err)
{
    scan c = {s, n, 0};
    typedef struct { uint32_t id, off, len, moff, mlen; } tmp_ent;
    tmp_ent *tmp = NULL;
    size_t nt = 0, capt = 0;
    uint32_t max_id = 0;
    exo_tok_buf_reserve(&v->arena, byte_level ? 2 * n : n);
    ws(&c);
    if (c.i >= n || s[c.i] != '{')
        goto bad;
    c.i++;
    ws(&c);
    if (c.i < n && s[c.i] == '}')
        c.i++;
    else
        for (;;) {
            ws(&c);
            size_t off = v->arena.len;
            if (string(&c, &v->arena))
                goto bad;
            size_t len = v->arena.len - off;
            ws(&c);
            if (c.i >= n || s[c.i] != ':')
                goto bad;
            c.i++;
            ws(&c);
            uint32_t id;
            if (number(&c, &id))
                goto bad;
            size_t moff = off, mlen = len;
            if (byte_level) {
                moff = v->arena.len;
                if (exo_tok_bytelevel_to_bytes(v->arena.p + off, len, &v->arena))
                    mlen = v->arena.len - moff;
                else
                    mlen = UINT32_MAX;
            }
            if (v->arena.len > UINT32_MAX - 8)
                goto bad;
            if (nt == capt) {
                capt = capt ? capt * 2 : 1024;
                tmp  = exo_realloc(tmp, capt * sizeof *tmp);
            }
            tmp[nt++] = (tmp_ent){id, (uint32_t)off, (uint32_t)len, (uint32_t)moff, (uint32_t)mlen};
            if (id > max_id)
                max_id = id;
            ws(&c);
            if (c.i < n && s[c.i] == ',') {
                c.i++;
                continue;
            }
            if (c.i < n && s[c.i] == '}') {
                c.i++;
                break;
            }
            goto bad;
        }
    ws(&c);
    if (c.i != n)
        goto bad;
    v->n   = nt ? max_id + 1 : 0;
    v->ent = exo_calloc(v->n ? v->n : 1, sizeof *v->ent);
    for (size_t k = 0; k < nt; k++) {
        exo_tok_entry *e = &v->ent[tmp[k].id];
        *e = (exo_tok_entry){tmp[k].off, tmp[k].len, tmp[k].moff, tmp[k].mlen, EXO_TOK_PRESENT};
    }
    exo_free(tmp);
    return 0;
bad:
    exo_free(tmp);
    return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: model.vocab: malformed near byte %zu of the section", c.i);
}

/* Appends a merge half in model form (raw bytes for byte-level models);
 * false if it cannot be a model token. */
static bool put_form(exo_tok_buf *out, const char *s, size_t n, bool byte_level)
{
    if (!byte_level) {
        exo_tok_buf_put(out, s, n);
        return true;
    }
    return exo_tok_bytelevel_to_bytes(s, n, out);
}

/* One parsed merge: a, b and the merged token a+b, stored back to back in
 * model form. */
typedef struct mrec {
    size_t   off;
    uint32_t alen, blen, ablen;
    bool     ok; /* all three have a model form */
} mrec;

enum { AHEAD = 16 }; /* prefetch distance, in merges */

int exo_tok_merges_parse(exo_tok_vocab *v, const char *s, size_t n, bool byte_level,
                         const char *prefix, exo_err *err)
{
    scan c = {s, n, 0};
    exo_tok_buf a = {0}, b = {0}, keys = {0};
    mrec *recs = NULL;
    size_t nrec = 0, cap = 0;
    size_t plen = prefix ? strlen(prefix) : 0;
    int rc = 0;

    /* Pass 1: parse every merge into keys/recs. */
    ws(&c);
    if (c.i >= n || s[c.i] != '[')
        goto bad;
    c.i++;
    ws(&c);
    if (c.i < n && s[c.i] == ']')
        c.i++;
    else
        for (;;) {
            ws(&c);
            a.len = b.len = 0;
            if (c.i < n && s[c.i] == '"') {
                if (string(&c, &a))
                    goto bad;
                if (a.len >= 8 && !memcmp(a.p, "#version", 8))
                    goto sep;
                char *sp = a.len ? memchr(a.p, ' ', a.len) : NULL; /* "" has no buffer */
                if (!sp || memchr(sp + 1, ' ', a.len - (size_t)(sp + 1 - a.p)))
                    goto bad;
                size_t la = (size_t)(sp - a.p);
                exo_tok_buf_put(&b, sp + 1, a.len - la - 1);
                a.len = la;
            } else if (c.i < n && s[c.i] == '[') {
                c.i++;
                ws(&c);
                if (string(&c, &a))
                    goto bad;
                ws(&c);
                if (c.i >= n || s[c.i] != ',')
                    goto bad;
                c.i++;
                ws(&c);
                if (string(&c, &b))
                    goto bad;
                ws(&c);
                if (c.i >= n || s[c.i] != ']')
                    goto bad;
                c.i++;
            } else
                goto bad;
            if (nrec == cap) {
                cap  = cap ? cap * 2 : 4096;
                recs = exo_realloc(recs, cap * sizeof *recs);
            }
            {
                mrec *r = &recs[nrec++];
                r->off  = keys.len;
                r->ok   = put_form(&keys, a.p, a.len, byte_level);
                r->alen = (uint32_t)(keys.len - r->off);
                size_t at = keys.len;
                r->ok   = put_form(&keys, b.p, b.len, byte_level) && r->ok;
                r->blen = (uint32_t)(keys.len - at);
                at = keys.len;
                /* merged token = a + b without b's continuing-subword prefix */
                size_t skip = plen && b.len >= plen && !memcmp(b.p, prefix, plen) ? plen : 0;
                if (b.len > skip) /* b.p is NULL when b is empty */
                    exo_tok_buf_put(&a, b.p + skip, b.len - skip);
                r->ok    = put_form(&keys, a.p, a.len, byte_level) && r->ok;
                r->ablen = (uint32_t)(keys.len - at);
                if (!r->ok) { /* keep the text for the error message */
                    keys.len = r->off;
                    exo_tok_buf_put(&keys, a.p, a.len);
                    r->alen = (uint32_t)a.len;
                    r->blen = r->ablen = 0;
                }
            }
        sep:
            ws(&c);
            if (c.i < n && s[c.i] == ',') {
                c.i++;
                continue;
            }
            if (c.i < n && s[c.i] == ']') {
                c.i++;
                break;
            }
            goto bad;
        }
    ws(&c);
    if (c.i != n)
        goto bad;

    /* Pass 2: look the three strings up with the slots of the merge AHEAD
     * positions later prefetched (the vocab table is larger than the cache,
     * so overlapping the misses is most of the cost), then insert the pairs
     * the same way. */
    {
        uint64_t *h = exo_malloc((3 * nrec + 1) * sizeof *h);
        int32_t *ids = exo_malloc((3 * nrec + 1) * sizeof *ids);
        for (size_t i = 0; i < nrec; i++) {
            const mrec *r = &recs[i];
            const char *k = keys.p + r->off;
            h[3 * i]     = exo_tok_hash(k, r->alen);
            h[3 * i + 1] = exo_tok_hash(k + r->alen, r->blen);
            h[3 * i + 2] = exo_tok_hash(k + r->alen + r->blen, r->ablen);
        }
        for (size_t i = 0; i < nrec; i++) {
            if (i + AHEAD < nrec)
                for (int k = 0; k < 3; k++)
                    exo__tok_vocab_prefetch(v, h[3 * (i + AHEAD) + (size_t)k]);
            const mrec *r = &recs[i];
            const char *k = keys.p + r->off;
            ids[3 * i]     = r->ok ? exo__tok_vocab_find_hashed(v, k, r->alen, h[3 * i]) : -1;
            ids[3 * i + 1] = r->ok ? exo__tok_vocab_find_hashed(v, k + r->alen, r->blen, h[3 * i + 1]) : -1;
            ids[3 * i + 2] = r->ok ? exo__tok_vocab_find_hashed(v, k + r->alen + r->blen, r->ablen, h[3 * i + 2]) : -1;
            if (ids[3 * i] < 0 || ids[3 * i + 1] < 0 || ids[3 * i + 2] < 0) {
                size_t shown = r->alen + r->blen + r->ablen;
                rc = exo_err_set(err, EXO_EFORMAT,
                                 "tokenizer.json: merge %zu (\"%.*s\") uses a token that is not in "
                                 "the vocabulary", i, (int)(shown > 80 ? 80 : shown), k);
                break;
            }
        }
        if (!rc) {
            exo__tok_vocab_merges_init(v, nrec);
            for (size_t i = 0; i < nrec; i++) {
                if (i + AHEAD < nrec)
                    exo__tok_merges_prefetch(v, ids[3 * (i + AHEAD)], ids[3 * (i + AHEAD) + 1]);
                exo__tok_vocab_merges_put(v, ids[3 * i], ids[3 * i + 1], (uint32_t)i, ids[3 * i + 2]);
            }
        }
        exo_free(h);
        exo_free(ids);
    }
    goto out;
bad:
    rc = exo_err_set(err, EXO_EFORMAT, "tokenizer.json: model.merges: malformed near byte %zu of the section", c.i);
out:
    exo_free(recs);
    exo_tok_buf_free(&a);
    exo_tok_buf_free(&b);
    exo_tok_buf_free(&keys);
    return rc;
}
