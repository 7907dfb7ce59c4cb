/* The vocabulary: token strings by id, a hash from model-form bytes to id,
 * and the BPE merge table (pair of ids -> rank, merged id).
 *
 * Both tables are open-addressing arrays of plain integers rather than
 * chained nodes: ~150-260k entries are inserted once at load and then only
 * read, so a flat power-of-two table at <= 50% load gives one or two cache
 * misses per lookup and costs no allocation per entry. The string table keeps
 * only ids; keys are compared against the id's bytes in the arena. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <string.h>

uint64_t exo_tok_hash(const char *s, size_t n)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = 0xcbf29ce484222325ull ^ (n * k);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * k;
        h ^= h >> 29;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, s + i, n - i);
        h = (h ^ w) * k;
    }
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

static inline uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static inline size_t pair_hash(uint64_t k)
{
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull;
    k ^= k >> 29;
    return (size_t)k;
}

static inline uint64_t head8(const char *s, size_t n)
{
    uint64_t h = 0;
    memcpy(&h, s, n < 8 ? n : 8);
    return h;
}

static inline bool slot_is(const exo_tok_vocab *v, const struct exo_tok_slot *sl, const char *s,
                           size_t n, uint64_t head)
{
    if (sl->head != head || sl->len != n)
        return false;
    return n <= 8 || !memcmp(v->arena.p + v->ent[sl->id].model_off + 8, s + 8, n - 8);
}

int32_t exo_tok_vocab_find(const exo_tok_vocab *v, const char *s, size_t n)
{
    return exo__tok_vocab_find_hashed(v, s, n, exo_tok_hash(s, n));
}

void exo__tok_vocab_prefetch(const exo_tok_vocab *v, uint64_t hash)
{
    if (v->slots)
        __builtin_prefetch(&v->slots[hash & v->mask]);
}

void exo__tok_merges_prefetch(const exo_tok_vocab *v, int32_t a, int32_t b)
{
    __builtin_prefetch(&v->merges[pair_hash(pair_key(a, b)) & v->mmask], 1);
}

int32_t exo__tok_vocab_find_hashed(const exo_tok_vocab *v, const char *s, size_t n, uint64_t hash)
{
    if (!v->slots)
        return -1;
    uint64_t head = head8(s, n);
    for (size_t i = hash & v->mask;; i = (i + 1) & v->mask) {
        const struct exo_tok_slot *sl = &v->slots[i];
        if (sl->id < 0)
            return -1;
        if (slot_is(v, sl, s, n, head))
            return sl->id;
    }
}

bool exo_tok_vocab_merge(const exo_tok_vocab *v, int32_t a, int32_t b, uint32_t *rank,
                         int32_t *merged)
{
    if (!v->merges)
        return false;
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_hash(k) & v->mmask;; i = (i + 1) & v->mmask) {
        const struct exo_tok_merge *m = &v->merges[i];
        if (m->key == k) {
            *rank   = m->rank;
            *merged = m->merged;
            return true;
        }
        if (m->key == UINT64_MAX)
            return false;
    }
}

/* Builds the string table over all entries that have a model form. When two
 * tokens share bytes (possible only in odd files), the higher id wins, as in
 * HF where the later JSON entry overwrites the earlier in its HashMap. */
void exo__tok_vocab_build_map(exo_tok_vocab *v)
{
    size_t cap = 16;
    while (cap < (size_t)v->n * 2)
        cap *= 2;
    v->slots = exo_malloc(cap * sizeof *v->slots);
    for (size_t i = 0; i < cap; i++)
        v->slots[i].id = -1;
    v->mask = cap - 1;
    /* Hash everything first, then insert with the slot of the entry 8 ahead
     * prefetched: the table is larger than the cache and the inserts are
     * random, so overlapping the misses is most of the cost. */
    size_t *hs = exo_malloc(((size_t)v->n + 1) * sizeof *hs);
    for (uint32_t id = 0; id < v->n; id++) {
        const exo_tok_entry *e = &v->ent[id];
        hs[id] = (e->flags & EXO_TOK_PRESENT) && e->model_len != UINT32_MAX
                     ? exo_tok_hash(v->arena.p + e->model_off, e->model_len) & v->mask
                     : SIZE_MAX;
    }
    for (uint32_t id = 0; id < v->n; id++) {
        if (id + 8 < v->n && hs[id + 8] != SIZE_MAX)
            __builtin_prefetch(&v->slots[hs[id + 8]], 1);
        if (hs[id] == SIZE_MAX)
            continue;
        const exo_tok_entry *e = &v->ent[id];
        const char *s = v->arena.p + e->model_off;
        uint64_t head = head8(s, e->model_len);
        for (size_t i = hs[id];; i = (i + 1) & v->mask) {
            struct exo_tok_slot *sl = &v->slots[i];
            if (sl->id < 0 || slot_is(v, sl, s, e->model_len, head)) {
                *sl = (struct exo_tok_slot){head, e->model_len, (int32_t)id};
                break;
            }
        }
    }
    exo_free(hs);
}

void exo__tok_vocab_merges_init(exo_tok_vocab *v, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    v->merges = exo_malloc(cap * sizeof *v->merges);
    for (size_t i = 0; i < cap; i++)
        v->merges[i].key = UINT64_MAX;
    v->mmask = cap - 1;
}

static void merges_insert(exo_tok_vocab *v, uint64_t k, uint32_t rank, int32_t m)
{
    size_t i = pair_hash(k) & v->mmask;
    while (v->merges[i].key != UINT64_MAX && v->merges[i].key != k)
        i = (i + 1) & v->mmask;
    if (v->merges[i].key == UINT64_MAX)
        v->n_merges++;
    v->merges[i] = (struct exo_tok_merge){k, rank, m};
}

/* Later duplicates overwrite earlier ones (HF collects into a HashMap). The
 * table doubles when it passes half full. */
void exo__tok_vocab_merges_put(exo_tok_vocab *v, int32_t a, int32_t b, uint32_t rank, int32_t m)
{
    if ((v->n_merges + 1) * 2 > v->mmask + 1) {
        struct exo_tok_merge *old = v->merges;
        size_t ocap = v->mmask + 1;
        exo__tok_vocab_merges_init(v, ocap);
        v->n_merges = 0;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].key != UINT64_MAX)
                merges_insert(v, old[i].key, old[i].rank, old[i].merged);
        exo_free(old);
    }
    merges_insert(v, pair_key(a, b), rank, m);
}

void exo_tok_vocab_free(exo_tok_vocab *v)
{
    exo_tok_buf_free(&v->arena);
    exo_free(v->ent);
    exo_free(v->slots);
    exo_free(v->merges);
    memset(v, 0, sizeof *v);
}
