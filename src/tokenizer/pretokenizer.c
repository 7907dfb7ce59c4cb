/* Pre-tokenizers: split normalized text into the words BPE runs on.
 *
 * Supported: Split (regex or literal; Isolated, Removed, MergedWithPrevious,
 * MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space, use_regex
 * with the GPT-2 pattern), Metaspace (replacement, prepend_scheme, split),
 * Digits, Punctuation, Whitespace, WhitespaceSplit, Sequence.
 *
 * Pieces are spans into one arena. Splitting appends new spans; rewriting
 * (a prefix space, Metaspace's ' ' -> '▁') appends new bytes to the arena.
 * ByteLevel's byte -> "Ġ" mapping itself is not done: the vocab was mapped
 * to raw bytes at load instead (see tok_internal.h). The split logic follows
 * HF's NormalizedString::split: the pattern yields (range, is_match) runs
 * covering the piece, the behaviour regroups them, and empty pieces vanish. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

enum { P_SPLIT, P_BYTELEVEL, P_METASPACE, P_DIGITS, P_PUNCT, P_WS, P_WSSPLIT, P_SEQ };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { PS_ALWAYS, PS_FIRST, PS_NEVER };

/* GPT-2's pattern, as used by ByteLevel with use_regex. */
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char WS_RE[] = "\\w+|[^\\w\\s]+";

struct exo_tok_pretok {
    int             type;
    exo_tok_regex  *re;
    int             behavior;
    bool            invert;
    bool            add_prefix_space, use_regex, split, individual;
    char            rep[4];
    size_t          rep_len;
    uint32_t        rep_cp;
    int             scheme;
    exo_tok_pretok *items;
    size_t          n_items;
};

static void clear(exo_tok_pretok *pt)
{
    exo_tok_regex_free(pt->re);
    for (size_t i = 0; i < pt->n_items; i++)
        clear(&pt->items[i]);
    exo_free(pt->items);
}

void exo_tok_pretok_free(exo_tok_pretok *pt)
{
    if (!pt)
        return;
    clear(pt);
    exo_free(pt);
}

static int parse_behavior(json_t *j, int *out, exo_err *err)
{
    const char *b = json_string_value(j);
    if (!b) b = "Isolated";
    if (!strcmp(b, "Removed")) *out = B_REMOVED;
    else if (!strcmp(b, "Isolated")) *out = B_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious")) *out = B_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) *out = B_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous")) *out = B_CONTIGUOUS;
    else return exo_err_set(err, EXO_EFORMAT, "pre-tokenizer: unknown split behavior %s", b);
    return 0;
}

static int parse_into(json_t *j, exo_tok_pretok *pt, int depth, exo_err *err)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    memset(pt, 0, sizeof *pt);
    if (!type)
        return exo_err_set(err, EXO_EFORMAT, "pre_tokenizer: missing type");
    if (depth > 8)
        return exo_err_set(err, EXO_EFORMAT, "pre_tokenizer: nested too deeply");
    if (!strcmp(type, "Split")) {
        pt->type   = P_SPLIT;
        pt->invert = json_is_true(json_object_get(j, "invert"));
        int rc     = parse_behavior(json_object_get(j, "behavior"), &pt->behavior, err);
        return rc ? rc : exo_tok_regex_from_json(json_object_get(j, "pattern"), &pt->re, err);
    }
    if (!strcmp(type, "ByteLevel")) {
        json_t *ur           = json_object_get(j, "use_regex");
        pt->type             = P_BYTELEVEL;
        pt->add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        pt->use_regex        = !ur || json_is_true(ur);
        return pt->use_regex ? exo_tok_regex_compile(GPT2_RE, strlen(GPT2_RE), false, &pt->re, err) : 0;
    }
    if (!strcmp(type, "Metaspace")) {
        json_t *r = json_object_get(j, "replacement");
        json_t *s = json_object_get(j, "split");
        const char *scheme = json_string_value(json_object_get(j, "prepend_scheme"));
        pt->type = P_METASPACE;
        const char *rs = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
        size_t rl = strlen(rs);
        if (!rl || rl > 4 || !exo_tok_utf8_valid(rs, rl))
            return exo_err_set(err, EXO_EFORMAT, "Metaspace: replacement must be one character");
        size_t k = exo_tok_utf8_next(rs, rl, 0, &pt->rep_cp);
        if (k != rl)
            return exo_err_set(err, EXO_EFORMAT, "Metaspace: replacement must be one character");
        memcpy(pt->rep, rs, rl);
        pt->rep_len = rl;
        pt->split   = !s || json_is_true(s);
        if (scheme)
            pt->scheme = !strcmp(scheme, "first") ? PS_FIRST : !strcmp(scheme, "never") ? PS_NEVER : PS_ALWAYS;
        else /* legacy files: add_prefix_space */
            pt->scheme = json_is_false(json_object_get(j, "add_prefix_space")) ? PS_NEVER : PS_ALWAYS;
        return 0;
    }
    if (!strcmp(type, "Digits")) {
        pt->type       = P_DIGITS;
        pt->individual = json_is_true(json_object_get(j, "individual_digits"));
        return 0;
    }
    if (!strcmp(type, "Punctuation")) {
        pt->type = P_PUNCT;
        return parse_behavior(json_object_get(j, "behavior"), &pt->behavior, err);
    }
    if (!strcmp(type, "Whitespace")) {
        pt->type = P_WS;
        return exo_tok_regex_compile(WS_RE, strlen(WS_RE), false, &pt->re, err);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        pt->type = P_WSSPLIT;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr))
            return exo_err_set(err, EXO_EFORMAT, "pre_tokenizer Sequence: missing pretokenizers");
        pt->type    = P_SEQ;
        pt->n_items = json_array_size(arr);
        pt->items   = exo_calloc(pt->n_items ? pt->n_items : 1, sizeof *pt->items);
        for (size_t i = 0; i < pt->n_items; i++) {
            int rc = parse_into(json_array_get(arr, i), &pt->items[i], depth + 1, err);
            if (rc) {
                pt->n_items = i + 1;
                return rc;
            }
        }
        return 0;
    }
    return exo_err_set(err, EXO_EUNSUPPORTED, "pre_tokenizer type %s is not supported", type);
}

int exo_tok_pretok_parse(json_t *j, exo_tok_pretok **out, exo_err *err)
{
    *out = NULL;
    if (!j || json_is_null(j))
        return 0;
    exo_tok_pretok *pt = exo_calloc(1, sizeof *pt);
    int rc = parse_into(j, pt, 0, err);
    if (rc) {
        exo_tok_pretok_free(pt);
        return rc;
    }
    *out = pt;
    return 0;
}

bool exo_tok_pretok_is_byte_level(const exo_tok_pretok *pt)
{
    if (!pt)
        return false;
    if (pt->type == P_BYTELEVEL)
        return true;
    for (size_t i = 0; i < pt->n_items; i++)
        if (exo_tok_pretok_is_byte_level(&pt->items[i]))
            return true;
    return false;
}

/* Turns a list of matches (sorted, non-overlapping, relative to the piece)
 * into HF's (range, is_match) runs that cover [0, n). */
static void cover(const exo_tok_spans *m, size_t n, exo_tok_spans *runs)
{
    runs->n = 0;
    if (!n) {
        exo_tok_spans_push(runs, 0, 0, false);
        return;
    }
    size_t prev = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->v[i].off != prev)
            exo_tok_spans_push(runs, prev, m->v[i].off - prev, false);
        exo_tok_spans_push(runs, m->v[i].off, m->v[i].len, true);
        prev = m->v[i].off + m->v[i].len;
    }
    if (prev != n)
        exo_tok_spans_push(runs, prev, n - prev, false);
}

/* Regroups runs by behaviour and appends the resulting non-empty pieces
 * (offset by base) to out. The first output piece inherits `first`. */
static void regroup(exo_tok_spans *runs, int behavior, bool invert, size_t base, bool first,
                    exo_tok_spans *out)
{
    if (invert)
        for (size_t i = 0; i < runs->n; i++)
            runs->v[i].flag = !runs->v[i].flag;
    /* After this, flag means "remove". */
    size_t w = 0;
    switch (behavior) {
    case B_ISOLATED:
        for (size_t i = 0; i < runs->n; i++)
            runs->v[i].flag = false;
        w = runs->n;
        break;
    case B_REMOVED: w = runs->n; break;
    case B_CONTIGUOUS:
    case B_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < runs->n; i++) {
            exo_tok_span r = runs->v[i];
            bool join = behavior == B_CONTIGUOUS ? r.flag == prev_match : (r.flag && !prev_match);
            if (join && w) {
                runs->v[w - 1].len = r.off + r.len - runs->v[w - 1].off;
            } else {
                runs->v[w++] = (exo_tok_span){r.off, r.len, false};
            }
            prev_match = r.flag;
        }
        break;
    }
    case B_MERGED_NEXT: {
        /* Walk backwards, extending the piece that follows a match. */
        bool prev_match = false;
        size_t nr = runs->n;
        exo_tok_span *tmp = exo_malloc((nr ? nr : 1) * sizeof *tmp);
        for (size_t k = nr; k-- > 0;) {
            exo_tok_span r = runs->v[k];
            if (r.flag && !prev_match && w) {
                size_t end = tmp[w - 1].off + tmp[w - 1].len;
                tmp[w - 1].off = r.off;
                tmp[w - 1].len = end - r.off;
            } else {
                tmp[w++] = (exo_tok_span){r.off, r.len, false};
            }
            prev_match = r.flag;
        }
        for (size_t k = 0; k < w; k++)
            runs->v[k] = tmp[w - 1 - k];
        exo_free(tmp);
        break;
    }
    }
    for (size_t i = 0; i < w; i++) {
        if (runs->v[i].flag || !runs->v[i].len)
            continue;
        exo_tok_spans_push(out, base + runs->v[i].off, runs->v[i].len, first && runs->v[i].off == 0);
    }
}

typedef struct ctx {
    exo_tok_spans m, runs;
} ctx;

/* Character-predicate matches (each matching char is its own match). */
static void char_matches(const char *s, size_t n, bool (*pred)(uint32_t), exo_tok_spans *m)
{
    m->n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = exo_tok_utf8_next(s, n, i, &cp);
        if (pred(cp))
            exo_tok_spans_push(m, i, k, true);
        i += k;
    }
}

static bool is_rep_cp(uint32_t cp, uint32_t rep) { return cp == rep; }

static int apply_one(const exo_tok_pretok *pt, exo_tok_buf *arena, const exo_tok_span *in,
                     exo_tok_spans *out, ctx *c)
{
    size_t off = in->off, n = in->len;
    bool first = in->flag;
    switch (pt->type) {
    case P_SPLIT:
    case P_WS:
        c->m.n = 0;
        if (exo_tok_regex_find_all(pt->re, arena->p + off, n, &c->m))
            return EXO_EINTERNAL;
        cover(&c->m, n, &c->runs);
        regroup(&c->runs, pt->type == P_WS ? B_REMOVED : pt->behavior,
                pt->type == P_WS ? true : pt->invert, off, first, out);
        return 0;
    case P_WSSPLIT:
        char_matches(arena->p + off, n, exo_tok_uc_is_whitespace, &c->m);
        cover(&c->m, n, &c->runs);
        regroup(&c->runs, B_REMOVED, false, off, first, out);
        return 0;
    case P_DIGITS:
        char_matches(arena->p + off, n, exo_tok_uc_is_numeric, &c->m);
        cover(&c->m, n, &c->runs);
        regroup(&c->runs, pt->individual ? B_ISOLATED : B_CONTIGUOUS, false, off, first, out);
        return 0;
    case P_PUNCT:
        char_matches(arena->p + off, n, exo_tok_uc_is_punct, &c->m);
        cover(&c->m, n, &c->runs);
        regroup(&c->runs, pt->behavior, false, off, first, out);
        return 0;
    case P_BYTELEVEL:
        if (pt->add_prefix_space && (n == 0 || arena->p[off] != ' ')) {
            size_t noff = arena->len;
            exo_tok_buf_reserve(arena, n + 1);
            arena->p[arena->len++] = ' ';
            exo_tok_buf_put(arena, arena->p + off, n);
            off = noff;
            n++;
        }
        if (!pt->use_regex) {
            if (n)
                exo_tok_spans_push(out, off, n, first);
            return 0;
        }
        c->m.n = 0;
        if (exo_tok_regex_find_all(pt->re, arena->p + off, n, &c->m))
            return EXO_EINTERNAL;
        cover(&c->m, n, &c->runs);
        regroup(&c->runs, B_ISOLATED, false, off, first, out);
        return 0;
    case P_METASPACE: {
        /* Rewrite ' ' -> replacement, maybe prepend one, then split so that
         * each replacement starts a piece (MergedWithNext). */
        size_t noff = arena->len;
        exo_tok_buf_reserve(arena, n * pt->rep_len + pt->rep_len);
        bool starts = n >= pt->rep_len && !memcmp(arena->p + off, pt->rep, pt->rep_len);
        /* A leading space becomes the replacement too, so check for it. */
        bool starts_space = n && arena->p[off] == ' ';
        if (!starts && !starts_space &&
            (pt->scheme == PS_ALWAYS || (pt->scheme == PS_FIRST && first)))
            exo_tok_buf_put(arena, pt->rep, pt->rep_len);
        for (size_t i = 0; i < n; i++) {
            char ch = arena->p[off + i];
            if (ch == ' ')
                exo_tok_buf_put(arena, pt->rep, pt->rep_len);
            else
                exo_tok_buf_putc(arena, ch);
        }
        size_t nn = arena->len - noff;
        if (!pt->split) {
            if (nn)
                exo_tok_spans_push(out, noff, nn, first);
            return 0;
        }
        c->m.n = 0;
        const char *s = arena->p + noff;
        for (size_t i = 0; i < nn;) {
            uint32_t cp;
            size_t k = exo_tok_utf8_next(s, nn, i, &cp);
            if (is_rep_cp(cp, pt->rep_cp))
                exo_tok_spans_push(&c->m, i, k, true);
            i += k;
        }
        cover(&c->m, nn, &c->runs);
        regroup(&c->runs, B_MERGED_NEXT, false, noff, first, out);
        return 0;
    }
    }
    return 0;
}

static int apply(const exo_tok_pretok *pt, exo_tok_buf *arena, exo_tok_spans *pieces, ctx *c)
{
    if (pt->type == P_SEQ) {
        for (size_t i = 0; i < pt->n_items; i++) {
            int rc = apply(&pt->items[i], arena, pieces, c);
            if (rc)
                return rc;
        }
        return 0;
    }
    exo_tok_spans out = {0};
    int rc = 0;
    for (size_t i = 0; i < pieces->n && !rc; i++)
        rc = apply_one(pt, arena, &pieces->v[i], &out, c);
    exo_tok_spans_free(pieces);
    *pieces = out;
    return rc;
}

int exo_tok_pretok_apply(const exo_tok_pretok *pt, exo_tok_buf *arena, exo_tok_spans *pieces)
{
    ctx c = {0};
    int rc = apply(pt, arena, pieces, &c);
    exo_tok_spans_free(&c.m);
    exo_tok_spans_free(&c.runs);
    return rc;
}
