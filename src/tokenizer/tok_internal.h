/* Internal types shared by the tokenizer's modules (not a public header).
 *
 * Text moves through the pipeline as byte buffers plus (offset, length)
 * spans into them, never as individual heap strings: a pre-tokenizer that
 * only splits appends spans, one that rewrites text appends new bytes to the
 * same arena. Byte-level BPE models work on raw bytes rather than on the
 * GPT-2 "Ġ" alphabet: the vocabulary is mapped to raw bytes once at load,
 * which makes the ByteLevel pre-tokenizer a no-op and every initial BPE
 * symbol a single byte. */
#ifndef EXO_TOKENIZER_TOK_INTERNAL_H
#define EXO_TOKENIZER_TOK_INTERNAL_H

#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- growable byte buffer and span lists (utf8.c) ----
 * Capped from outside: what they hold grows by a bounded factor of the text
 * being encoded or decoded, which EXO_TOKENIZER_MAX_INPUT caps. */

typedef struct exo_tok_buf {
    char  *p;
    size_t len, cap;
} exo_tok_buf;

void exo_tok_buf_reserve(exo_tok_buf *b, size_t extra);
void exo_tok_buf_put(exo_tok_buf *b, const void *src, size_t n);
void exo_tok_buf_putc(exo_tok_buf *b, char c);
void exo_tok_buf_free(exo_tok_buf *b);

typedef struct exo_tok_span {
    size_t off, len;
    bool   flag; /* meaning depends on the list: "is a match", "starts text" */
} exo_tok_span;

typedef struct exo_tok_spans {
    exo_tok_span *v;
    size_t        n, cap;
} exo_tok_spans;

void exo_tok_spans_push(exo_tok_spans *s, size_t off, size_t len, bool flag);
void exo_tok_spans_free(exo_tok_spans *s);

typedef struct exo_tok_ids {
    int32_t *v;
    size_t   n, cap;
} exo_tok_ids;

void exo_tok_ids_push(exo_tok_ids *ids, int32_t id);

/* ---- UTF-8 and Unicode helpers (utf8.c) ---- */

/* Decodes one valid UTF-8 character (the input must be valid). */
size_t   exo_tok_utf8_next(const char *s, size_t n, size_t i, uint32_t *cp);
size_t   exo_tok_utf8_encode(uint32_t cp, char out[4]);
bool     exo_tok_utf8_valid(const char *s, size_t n);
/* Appends s to out with every maximal invalid subpart replaced by U+FFFD
 * (Rust's String::from_utf8_lossy). */
void     exo_tok_utf8_lossy(const char *s, size_t n, exo_tok_buf *out);
/* Length of the last (complete or incomplete) character if it is an
 * incomplete but so far valid multi-byte prefix at the end of s, else 0. */
size_t   exo_tok_utf8_incomplete_tail(const char *s, size_t n);
bool     exo_tok_uc_is_whitespace(uint32_t cp); /* Rust char::is_whitespace */
bool     exo_tok_uc_is_alnum(uint32_t cp);      /* Rust char::is_alphanumeric */
bool     exo_tok_uc_is_numeric(uint32_t cp);    /* Rust char::is_numeric */
bool     exo_tok_uc_is_punct(uint32_t cp);      /* HF is_punc: ASCII or Unicode P* */

/* GPT-2 byte-level alphabet: byte <-> code point. */
uint32_t exo_tok_bytelevel_char(uint8_t b);
int      exo_tok_bytelevel_byte(uint32_t cp); /* -1 if not in the alphabet */
/* Maps a byte-level string to raw bytes; false (out untouched beyond its
 * old length) if some character is not in the alphabet. */
bool     exo_tok_bytelevel_to_bytes(const char *s, size_t n, exo_tok_buf *out);

/* ---- regular expressions (regex.c): PCRE2 UTF+UCP, JIT; or a literal ---- */

typedef struct exo_tok_regex exo_tok_regex;
int  exo_tok_regex_compile(const char *pat, size_t len, bool literal, exo_tok_regex **out,
                           exo_err *err);
void exo_tok_regex_free(exo_tok_regex *re);
/* Appends the non-overlapping matches in s[0,n) (offsets relative to s) to
 * out as spans with flag=true. */
int  exo_tok_regex_find_all(const exo_tok_regex *re, const char *s, size_t n,
                            exo_tok_spans *out);
/* Parses an HF {"String": "..."} / {"Regex": "..."} pattern object. */
int  exo_tok_regex_from_json(json_t *pattern, exo_tok_regex **out, exo_err *err);

/* ---- the vocabulary (vocab.c) ---- */

enum {
    EXO_TOK_PRESENT = 1,
    EXO_TOK_ADDED   = 2,
    EXO_TOK_SPECIAL = 4,
};

typedef struct exo_tok_entry {
    uint32_t text_off, text_len;   /* string as in tokenizer.json */
    uint32_t model_off, model_len; /* what the model matches (raw bytes if byte-level) */
    uint8_t  flags;
} exo_tok_entry;

typedef struct exo_tok_vocab {
    exo_tok_buf    arena;
    exo_tok_entry *ent;
    uint32_t       n; /* ids are 0..n-1; holes have flags == 0 */
    /* model-form bytes -> id, model vocab only (open addressing); each slot
     * holds the key's first 8 bytes, so most lookups (tokens are short) are
     * settled by one cache miss */
    struct exo_tok_slot {
        uint64_t head; /* first min(len, 8) bytes, zero padded */
        uint32_t len;
        int32_t  id;   /* -1: empty */
    }             *slots;
    size_t         mask;
    /* (left id, right id) -> rank, merged id; key UINT64_MAX: empty */
    struct exo_tok_merge {
        uint64_t key;
        uint32_t rank;
        int32_t  merged;
    }             *merges;
    size_t         mmask;
    size_t         n_merges;
} exo_tok_vocab;

uint64_t exo_tok_hash(const char *s, size_t n);
int32_t  exo_tok_vocab_find(const exo_tok_vocab *v, const char *s, size_t n);
bool     exo_tok_vocab_merge(const exo_tok_vocab *v, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *merged);
void     exo_tok_vocab_free(exo_tok_vocab *v);
/* Load-time construction (vocab.c). model_len == UINT32_MAX: no model form. */
void     exo__tok_vocab_build_map(exo_tok_vocab *v);
void     exo__tok_vocab_merges_init(exo_tok_vocab *v, size_t n);
void     exo__tok_vocab_merges_put(exo_tok_vocab *v, int32_t a, int32_t b, uint32_t rank,
                                   int32_t m);
int32_t  exo__tok_vocab_find_hashed(const exo_tok_vocab *v, const char *s, size_t n, uint64_t hash);
void     exo__tok_vocab_prefetch(const exo_tok_vocab *v, uint64_t hash);
void     exo__tok_merges_prefetch(const exo_tok_vocab *v, int32_t a, int32_t b);
#define EXO_TOK_MAX_ID (1 << 22) /* 4M ids: bounds what a hostile file can make us allocate */

/* Parses model.vocab and model.merges from their JSON text (json_scan.c). */
int exo_tok_json_locate(const char *s, size_t n, size_t vocab_span[2], size_t merges_span[2],
                        exo_err *err);
int exo_tok_vocab_parse(exo_tok_vocab *v, const char *s, size_t n, bool byte_level,
                        exo_err *err);
int exo_tok_merges_parse(exo_tok_vocab *v, const char *s, size_t n, bool byte_level,
                         const char *prefix, exo_err *err);

/* ---- normalizers (normalizer.c) ---- */

typedef struct exo_tok_normalizer exo_tok_normalizer;
int  exo_tok_normalizer_parse(json_t *j, exo_tok_normalizer **out, exo_err *err);
void exo_tok_normalizer_free(exo_tok_normalizer *nz);
/* out is cleared and receives the normalized text. */
void exo_tok_normalizer_apply(const exo_tok_normalizer *nz, const char *s, size_t n,
                              exo_tok_buf *out);

/* ---- pre-tokenizers (pretokenizer.c) ---- */

typedef struct exo_tok_pretok exo_tok_pretok;
int  exo_tok_pretok_parse(json_t *j, exo_tok_pretok **out, exo_err *err);
void exo_tok_pretok_free(exo_tok_pretok *pt);
bool exo_tok_pretok_is_byte_level(const exo_tok_pretok *pt);
/* Splits the pieces in *pieces (spans into arena; flag = starts at original
 * offset 0) in place; may append bytes to arena. */
int  exo_tok_pretok_apply(const exo_tok_pretok *pt, exo_tok_buf *arena, exo_tok_spans *pieces);

/* ---- BPE model (bpe.c) ---- */

typedef struct exo_tok_bpe {
    bool    byte_level;    /* symbols start as single bytes */
    bool    byte_fallback; /* unknown chars become <0xXX> tokens */
    bool    fuse_unk;
    bool    ignore_merges; /* a word that is a token is emitted whole */
    int32_t unk_id;        /* -1: unknown chars are dropped */
    int32_t byte_ids[256]; /* <0xXX> ids or -1 */
    int32_t unit_ids[128]; /* id of each one-byte unit (ASCII char), -1 */
    char   *prefix;        /* continuing_subword_prefix or NULL */
    char   *suffix;        /* end_of_word_suffix or NULL */
} exo_tok_bpe;

typedef struct exo_tok_bpe_scratch exo_tok_bpe_scratch;
exo_tok_bpe_scratch *exo_tok_bpe_scratch_new(void);
void exo_tok_bpe_scratch_free(exo_tok_bpe_scratch *sc);
void exo_tok_bpe_encode_word(const exo_tok_bpe *bpe, const exo_tok_vocab *v, const char *w,
                             size_t n, exo_tok_bpe_scratch *sc, exo_tok_ids *out);

/* ---- added tokens (added_tokens.c) ---- */

typedef struct exo_tok_added {
    int32_t id;
    char   *content;
    size_t  len;
    bool    special, lstrip, rstrip, normalized, single_word;
} exo_tok_added;

typedef struct exo_tok_trie exo_tok_trie;
/* Builds a matcher over the tokens for which select(tok) holds; contents
 * are the given strings (normalized ones are passed in normalized form). */
exo_tok_trie *exo_tok_trie_build(const exo_tok_added *toks, char *const *contents,
                                 const size_t *lens, size_t n, bool normalized);
void exo_tok_trie_free(exo_tok_trie *t);
bool exo_tok_trie_empty(const exo_tok_trie *t);
/* Splits s into spans: flag=true spans are added tokens (id in *ids at the
 * same index), others are text. Follows HF AddedVocabulary::find_matches
 * (leftmost-longest, single_word, lstrip, rstrip). */
void exo_tok_trie_split(const exo_tok_trie *t, const exo_tok_added *toks, const char *s,
                        size_t n, exo_tok_spans *out, exo_tok_ids *ids);

/* ---- decoders (decoder.c) ---- */

typedef struct exo_tok_decoder exo_tok_decoder;
int  exo_tok_decoder_parse(json_t *j, exo_tok_decoder **out, exo_err *err);
void exo_tok_decoder_free(exo_tok_decoder *d);
/* tokens: spans into arena (arena may be appended to). Result appended to out. */
void exo_tok_decoder_run(const exo_tok_decoder *d, exo_tok_buf *arena, exo_tok_spans *tokens,
                         exo_tok_buf *out);

/* ---- the tokenizer ---- */

struct exo_tokenizer {
    exo_tok_vocab       vocab;
    exo_tok_bpe         bpe;
    exo_tok_normalizer *normalizer;
    exo_tok_pretok     *pretok;
    exo_tok_decoder    *decoder;
    exo_tok_added      *added;
    size_t              n_added;
    exo_tok_trie       *trie_raw;  /* added tokens with normalized=false */
    exo_tok_trie       *trie_norm; /* normalized=true, matched after normalizing */
    int32_t            *pp_pre, *pp_post; /* post-processor ids around $A */
    size_t              n_pp_pre, n_pp_post;
    int32_t             bos_id;
    int32_t             eos_id[1];
    size_t              n_eos;
};

/* Decodes into out (appends); used by decode and the stream. */
void exo_tok_decode_into(const exo_tokenizer *tok, const int32_t *ids, size_t n,
                         bool skip_special, exo_tok_buf *out);

#endif
