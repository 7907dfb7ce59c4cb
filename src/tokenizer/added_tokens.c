/* Added tokens: find "<|im_start|>" and friends in the text before the model
 * sees it.
 *
 * HF matches all added tokens at once with an Aho-Corasick automaton in
 * leftmost-longest mode, then applies each token's options: single_word
 * drops a match glued to a word character, lstrip/rstrip widen the match
 * over neighbouring whitespace. We do the same with a byte trie: at each
 * position, walk the trie and keep the longest token that ends there. A
 * 256-entry root table makes the common "no token starts here" case one
 * load. Two tries exist: one over the raw input (normalized=false tokens) and
 * one over normalized text (normalized=true tokens, stored normalized). */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

typedef struct tnode {
    int32_t child;   /* first child or -1 */
    int32_t sibling; /* next sibling or -1 */
    int32_t tok;     /* index into the added-token array, or -1 */
    uint8_t byte;
} tnode;

struct exo_tok_trie {
    int32_t root[256];
    tnode  *nodes;
    size_t  n, cap;
};

static int32_t new_node(exo_tok_trie *t, uint8_t b)
{
    if (t->n == t->cap) {
        t->cap   = t->cap ? t->cap * 2 : 256;
        t->nodes = exo_realloc(t->nodes, t->cap * sizeof *t->nodes);
    }
    t->nodes[t->n] = (tnode){-1, -1, -1, b};
    return (int32_t)t->n++;
}

exo_tok_trie *exo_tok_trie_build(const exo_tok_added *toks, char *const *contents,
                                 const size_t *lens, size_t n, bool normalized)
{
    exo_tok_trie *t = exo_calloc(1, sizeof *t);
    memset(t->root, 0xFF, sizeof t->root);
    for (size_t k = 0; k < n; k++) {
        if (toks[k].normalized != normalized || !lens[k])
            continue;
        const uint8_t *s = (const uint8_t *)contents[k];
        int32_t cur = t->root[s[0]];
        if (cur < 0)
            cur = t->root[s[0]] = new_node(t, s[0]);
        for (size_t i = 1; i < lens[k]; i++) {
            int32_t c = t->nodes[cur].child, found = -1;
            for (; c >= 0; c = t->nodes[c].sibling)
                if (t->nodes[c].byte == s[i]) {
                    found = c;
                    break;
                }
            if (found < 0) {
                found = new_node(t, s[i]);
                t->nodes[found].sibling = t->nodes[cur].child;
                t->nodes[cur].child     = found;
            }
            cur = found;
        }
        t->nodes[cur].tok = (int32_t)k; /* a later duplicate wins */
    }
    return t;
}

void exo_tok_trie_free(exo_tok_trie *t)
{
    if (!t)
        return;
    exo_free(t->nodes);
    exo_free(t);
}

bool exo_tok_trie_empty(const exo_tok_trie *t) { return !t || t->n == 0; }

/* Longest token starting at s[i]: returns its index and sets *end. */
static int32_t longest_at(const exo_tok_trie *t, const uint8_t *s, size_t n, size_t i, size_t *end)
{
    int32_t cur = t->root[s[i]], best = -1;
    size_t j = i + 1;
    while (cur >= 0) {
        if (t->nodes[cur].tok >= 0) {
            best = t->nodes[cur].tok;
            *end = j;
        }
        if (j >= n)
            break;
        int32_t c = t->nodes[cur].child;
        while (c >= 0 && t->nodes[c].byte != s[j])
            c = t->nodes[c].sibling;
        cur = c;
        j++;
    }
    return best;
}

static uint32_t last_char(const char *s, size_t end)
{
    size_t st = end - 1;
    while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80)
        st--;
    uint32_t cp;
    exo_tok_utf8_next(s, end, st, &cp);
    return cp;
}

static bool word_char(uint32_t cp) { return cp == '_' || exo_tok_uc_is_alnum(cp); }

void exo_tok_trie_split(const exo_tok_trie *t, const exo_tok_added *toks, const char *str,
                        size_t n, exo_tok_spans *out, exo_tok_ids *ids)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t start_offset = 0;
    if (t && t->n)
        for (size_t i = 0; i < n;) {
            size_t end = 0;
            int32_t k = t->root[s[i]] >= 0 ? longest_at(t, s, n, i, &end) : -1;
            if (k < 0) {
                i++;
                continue;
            }
            const exo_tok_added *a = &toks[k];
            size_t start = i, stop = end;
            i = end; /* the automaton resumes after the match, kept or not */
            if (a->single_word) {
                bool ok_l = start == 0 || !word_char(last_char(str, start));
                uint32_t cp = 0;
                if (stop < n)
                    exo_tok_utf8_next(str, n, stop, &cp);
                bool ok_r = stop == n || !word_char(cp);
                if (!ok_l || !ok_r)
                    continue;
            }
            if (a->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t st = ns - 1;
                    while (st > 0 && (s[st] & 0xC0) == 0x80)
                        st--;
                    uint32_t cp;
                    exo_tok_utf8_next(str, ns, st, &cp);
                    if (!exo_tok_uc_is_whitespace(cp))
                        break;
                    ns = st;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip)
                while (stop < n) {
                    uint32_t cp;
                    size_t k2 = exo_tok_utf8_next(str, n, stop, &cp);
                    if (!exo_tok_uc_is_whitespace(cp))
                        break;
                    stop += k2;
                }
            if (start_offset < start) {
                exo_tok_spans_push(out, start_offset, start - start_offset, false);
                exo_tok_ids_push(ids, -1);
            }
            exo_tok_spans_push(out, start, stop - start, true);
            exo_tok_ids_push(ids, a->id);
            start_offset = stop;
            if (i < stop)
                i = stop;
        }
    if (start_offset < n || n == 0) {
        exo_tok_spans_push(out, start_offset, n - start_offset, false);
        exo_tok_ids_push(ids, -1);
    }
}
