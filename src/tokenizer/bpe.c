/* The BPE model: one pre-tokenized word in, token ids out.
 *
 * The word starts as one symbol per character (per byte for byte-level
 * models), kept as a doubly linked list in an array. Every adjacent pair
 * that has a merge goes into a binary min-heap keyed by (rank, position);
 * popping the best pair, merging it and pushing the two new neighbour pairs
 * gives O(n log n) per word instead of rescanning all pairs after each merge.
 * Stale heap entries (a symbol that was merged away, or a pair whose merge
 * result no longer matches) are skipped when popped. This is the algorithm of
 * HF's Word::merge_all, so ties break the same way (lowest rank, then
 * leftmost).
 *
 * Before merging, characters missing from the vocab become <0xXX> byte
 * tokens (byte_fallback) or the unk token (consecutive ones fused when
 * fuse_unk), or are dropped when the model has no unk token, as in HF. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

typedef struct sym {
    int32_t  id;
    int32_t  prev, next;
    uint32_t len; /* 0: merged into its left neighbour */
} sym;

typedef struct cand {
    uint32_t rank;
    int32_t  pos; /* left symbol */
    int32_t  merged;
} cand;

/* Per-encode-call word cache: natural text repeats its words, and a hit
 * skips the whole merge loop. It lives in the scratch (one per call), so the
 * tokenizer itself stays immutable and shareable between threads. */
#define CACHE_MAX_WORD  48
#define CACHE_MIN_SLOTS 256u       /* grows by doubling at half full ... */
#define CACHE_MAX_SLOTS (1u << 16) /* ... up to this, then stops inserting */

typedef struct centry {
    uint32_t key_off, key_len; /* in cache_keys */
    uint32_t ids_off, ids_n;   /* in cache_ids */
    uint64_t hash;
} centry;

struct exo_tok_bpe_scratch {
    sym        *syms;
    size_t      syms_cap;
    cand       *heap;
    size_t      heap_n, heap_cap;
    exo_tok_buf tmp;
    centry     *cache;        /* cache_cap entries, key_len 0 = empty */
    size_t      cache_n, cache_cap;
    exo_tok_buf cache_keys;
    exo_tok_ids cache_ids;
};

exo_tok_bpe_scratch *exo_tok_bpe_scratch_new(void)
{
    return exo_calloc(1, sizeof(exo_tok_bpe_scratch));
}

void exo_tok_bpe_scratch_free(exo_tok_bpe_scratch *sc)
{
    if (!sc)
        return;
    exo_free(sc->syms);
    exo_free(sc->heap);
    exo_tok_buf_free(&sc->tmp);
    exo_free(sc->cache);
    exo_tok_buf_free(&sc->cache_keys);
    exo_free(sc->cache_ids.v);
    exo_free(sc);
}

static inline bool cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(exo_tok_bpe_scratch *sc, cand c)
{
    if (sc->heap_n == sc->heap_cap) {
        sc->heap_cap = sc->heap_cap ? sc->heap_cap * 2 : 64;
        sc->heap     = exo_realloc(sc->heap, sc->heap_cap * sizeof *sc->heap);
    }
    size_t i = sc->heap_n++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &sc->heap[p]))
            break;
        sc->heap[i] = sc->heap[p];
        i = p;
    }
    sc->heap[i] = c;
}

static cand heap_pop(exo_tok_bpe_scratch *sc)
{
    cand top = sc->heap[0];
    cand last = sc->heap[--sc->heap_n];
    size_t i = 0, n = sc->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        size_t m = l + 1 < n && cand_less(&sc->heap[l + 1], &sc->heap[l]) ? l + 1 : l;
        if (!cand_less(&sc->heap[m], &last))
            break;
        sc->heap[i] = sc->heap[m];
        i = m;
    }
    if (n)
        sc->heap[i] = last;
    return top;
}

static void push_pair(const exo_tok_vocab *v, exo_tok_bpe_scratch *sc, int32_t pos)
{
    int32_t nx = sc->syms[pos].next;
    if (nx < 0)
        return;
    uint32_t rank;
    int32_t merged;
    if (exo_tok_vocab_merge(v, sc->syms[pos].id, sc->syms[nx].id, &rank, &merged))
        heap_push(sc, (cand){rank, pos, merged});
}

static void add_sym(exo_tok_bpe_scratch *sc, size_t *ns, int32_t id, uint32_t len)
{
    if (*ns == sc->syms_cap) {
        sc->syms_cap = sc->syms_cap ? sc->syms_cap * 2 : 64;
        sc->syms     = exo_realloc(sc->syms, sc->syms_cap * sizeof *sc->syms);
    }
    sc->syms[*ns] = (sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1, len};
    (*ns)++;
}

/* Looks up one character, adding the subword prefix/suffix when the model
 * has them. */
static int32_t find_unit(const exo_tok_bpe *bpe, const exo_tok_vocab *v, exo_tok_bpe_scratch *sc,
                         const char *s, size_t k, bool is_first, bool is_last)
{
    bool pre = bpe->prefix && !is_first, suf = bpe->suffix && is_last;
    if (!pre && !suf)
        return k == 1 && (unsigned char)s[0] < 128 ? bpe->unit_ids[(unsigned char)s[0]]
                                                   : exo_tok_vocab_find(v, s, k);
    sc->tmp.len = 0;
    if (pre)
        exo_tok_buf_put(&sc->tmp, bpe->prefix, strlen(bpe->prefix));
    exo_tok_buf_put(&sc->tmp, s, k);
    if (suf)
        exo_tok_buf_put(&sc->tmp, bpe->suffix, strlen(bpe->suffix));
    return exo_tok_vocab_find(v, sc->tmp.p, sc->tmp.len);
}

static void merge_word(const exo_tok_bpe *bpe, const exo_tok_vocab *v, const char *w, size_t n,
                       exo_tok_bpe_scratch *sc, exo_tok_ids *out);

void exo_tok_bpe_encode_word(const exo_tok_bpe *bpe, const exo_tok_vocab *v, const char *w,
                             size_t n, exo_tok_bpe_scratch *sc, exo_tok_ids *out)
{
    if (!n)
        return;
    if (n > CACHE_MAX_WORD) {
        merge_word(bpe, v, w, n, sc, out);
        return;
    }
    if (!sc->cache) {
        sc->cache_cap = CACHE_MIN_SLOTS;
        sc->cache     = exo_calloc(sc->cache_cap, sizeof *sc->cache);
    }
    uint64_t h = exo_tok_hash(w, n);
    size_t mask = sc->cache_cap - 1, i = h & mask;
    for (; sc->cache[i].key_len; i = (i + 1) & mask) {
        const centry *c = &sc->cache[i];
        if (c->hash == h && c->key_len == n && !memcmp(sc->cache_keys.p + c->key_off, w, n)) {
            for (uint32_t k = 0; k < c->ids_n; k++)
                exo_tok_ids_push(out, sc->cache_ids.v[c->ids_off + k]);
            return;
        }
    }
    size_t first = out->n;
    merge_word(bpe, v, w, n, sc, out);
    if ((sc->cache_n + 1) * 2 > sc->cache_cap) {
        if (sc->cache_cap >= CACHE_MAX_SLOTS)
            return; /* full: stop caching */
        size_t ncap = sc->cache_cap * 2;
        centry *nc = exo_calloc(ncap, sizeof *nc);
        for (size_t k = 0; k < sc->cache_cap; k++) {
            if (!sc->cache[k].key_len)
                continue;
            size_t j = sc->cache[k].hash & (ncap - 1);
            while (nc[j].key_len)
                j = (j + 1) & (ncap - 1);
            nc[j] = sc->cache[k];
        }
        exo_free(sc->cache);
        sc->cache     = nc;
        sc->cache_cap = ncap;
        for (i = h & (ncap - 1); nc[i].key_len; i = (i + 1) & (ncap - 1))
            ;
    }
    centry c = {(uint32_t)sc->cache_keys.len, (uint32_t)n, (uint32_t)sc->cache_ids.n,
                (uint32_t)(out->n - first), h};
    exo_tok_buf_put(&sc->cache_keys, w, n);
    for (size_t k = first; k < out->n; k++)
        exo_tok_ids_push(&sc->cache_ids, out->v[k]);
    sc->cache[i] = c;
    sc->cache_n++;
}

static void merge_word(const exo_tok_bpe *bpe, const exo_tok_vocab *v, const char *w, size_t n,
                       exo_tok_bpe_scratch *sc, exo_tok_ids *out)
{
    if (bpe->ignore_merges) {
        int32_t id = exo_tok_vocab_find(v, w, n);
        if (id >= 0) {
            exo_tok_ids_push(out, id);
            return;
        }
    }
    size_t ns = 0;
    int32_t unk_len = 0; /* pending unk run, bytes */
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        if (!bpe->byte_level) {
            uint32_t cp;
            k = exo_tok_utf8_next(w, n, i, &cp);
        }
        int32_t id = find_unit(bpe, v, sc, w + i, k, i == 0, i + k == n);
        if (id >= 0) {
            if (unk_len) {
                add_sym(sc, &ns, bpe->unk_id, (uint32_t)unk_len);
                unk_len = 0;
            }
            add_sym(sc, &ns, id, (uint32_t)k);
            i += k;
            continue;
        }
        if (bpe->byte_fallback) {
            bool all = true;
            for (size_t b = 0; b < k; b++)
                all = all && bpe->byte_ids[(uint8_t)w[i + b]] >= 0;
            if (all) {
                if (unk_len) {
                    add_sym(sc, &ns, bpe->unk_id, (uint32_t)unk_len);
                    unk_len = 0;
                }
                for (size_t b = 0; b < k; b++)
                    add_sym(sc, &ns, bpe->byte_ids[(uint8_t)w[i + b]], 1);
                i += k;
                continue;
            }
        }
        if (bpe->unk_id >= 0) {
            if (unk_len && !bpe->fuse_unk) {
                add_sym(sc, &ns, bpe->unk_id, (uint32_t)unk_len);
                unk_len = 0;
            }
            unk_len += (int32_t)k;
        }
        i += k;
    }
    if (unk_len)
        add_sym(sc, &ns, bpe->unk_id, (uint32_t)unk_len);
    if (!ns)
        return;
    sc->syms[ns - 1].next = -1;

    sc->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        push_pair(v, sc, (int32_t)i);
    while (sc->heap_n) {
        cand c = heap_pop(sc);
        sym *l = &sc->syms[c.pos];
        if (!l->len || l->next < 0)
            continue;
        sym *r = &sc->syms[l->next];
        uint32_t rank;
        int32_t merged;
        if (!exo_tok_vocab_merge(v, l->id, r->id, &rank, &merged) || merged != c.merged)
            continue;
        l->id   = merged;
        l->len += r->len;
        l->next = r->next;
        r->len  = 0;
        if (l->next >= 0)
            sc->syms[l->next].prev = c.pos;
        if (l->prev >= 0)
            push_pair(v, sc, l->prev);
        push_pair(v, sc, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = sc->syms[i].next)
        exo_tok_ids_push(out, sc->syms[i].id);
}
