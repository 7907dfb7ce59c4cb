/* Tokenizer unit tests on small hand-written tokenizer.json documents: one
 * feature per test (merge order, ignore_merges, byte fallback and unk
 * fusing, each normalizer, each Split behaviour, Metaspace schemes, digits,
 * punctuation, added-token options, post-processor and tokenizer_config
 * rules, each decoder, the streaming detokenizer, lossy UTF-8, and load
 * errors). The expected values follow HF tokenizers' documented semantics;
 * the real-file differential tests are tests/integration/test_tokenizer.sh. */
#include "core/alloc.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <string.h>

static exo_tokenizer *mk2(const char *json, const char *cfg)
{
    exo_tokenizer *tok = NULL;
    exo_err err = {0};
    int rc = exo_tokenizer_load_mem(json, strlen(json), cfg, cfg ? strlen(cfg) : 0, &tok, &err);
    cr_assert_eq(rc, 0, "load failed: %s", err.msg);
    return tok;
}

static exo_tokenizer *mk(const char *json) { return mk2(json, NULL); }

/* expect(tok, text, add_special, n, id...) */
static void expect(const exo_tokenizer *tok, const char *text, bool special, int n, ...)
{
    int32_t *ids;
    size_t got;
    exo_err err;
    cr_assert_eq(exo_tokenizer_encode(tok, text, strlen(text), special, &ids, &got, &err), 0);
    va_list ap;
    va_start(ap, n);
    char want[256] = "", have[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), " %d", va_arg(ap, int));
    va_end(ap);
    for (size_t i = 0; i < got; i++)
        snprintf(have + strlen(have), sizeof have - strlen(have), " %d", ids[i]);
    cr_expect_str_eq(have, want, "encode(\"%s\"): got [%s] want [%s]", text, have, want);
    exo_free(ids);
}

static void expect_dec(const exo_tokenizer *tok, bool skip, const char *want, int n, ...)
{
    int32_t ids[64];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        ids[i] = va_arg(ap, int);
    va_end(ap);
    size_t len;
    char *s = exo_tokenizer_decode(tok, ids, (size_t)n, skip, &len);
    cr_expect_eq(len, strlen(want));
    cr_expect_str_eq(s, want);
    exo_free(s);
}

/* A byte-level BPE over "abc" with merges a b -> ab (rank 0), ab c -> abc. */
#define BL_VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"bc\":5,\"Ġ\":6,\"Ġa\":7,\"d\":8,\"cd\":9}"
static const char bl_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":10,\"content\":\"<|end|>\",\"special\":true,"
    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"single_word\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":" BL_VOCAB ",\"merges\":[\"a b\",\"ab c\",\"b c\",\"Ġ a\",\"c d\"]}}";

Test(tokenizer, bpe_merge_order)
{
    exo_tokenizer *tok = mk(bl_json);
    expect(tok, "abc", false, 1, 4);
    expect(tok, "abcd", false, 2, 4, 8); /* a b (0) first, then ab c (1); c d never */
    expect(tok, "bcd", false, 2, 5, 8);  /* b c (2) before c d (4) */
    expect(tok, " a", false, 1, 7);
    expect(tok, "ab ab", false, 3, 3, 6, 3); /* " ab": a b (rank 0) before Ġ a (3) */
    expect(tok, "abc<|end|>abc", false, 3, 4, 10, 4);
    expect_dec(tok, false, "abc<|end|> ab", 4, 4, 10, 6, 3);
    expect_dec(tok, true, "abc ab", 4, 4, 10, 6, 3);
    cr_expect_eq(exo_tokenizer_vocab_size(tok), 11);
    cr_expect(exo_tokenizer_is_special(tok, 10));
    cr_expect(!exo_tokenizer_is_special(tok, 4));
    cr_expect_eq(exo_tokenizer_token_to_id(tok, "Ġa", strlen("Ġa")), 7);
    cr_expect_eq(exo_tokenizer_token_to_id(tok, "<|end|>", 7), 10);
    cr_expect_eq(exo_tokenizer_token_to_id(tok, "zz", 2), -1);
    size_t len;
    const char *t = exo_tokenizer_id_to_token(tok, 7, &len);
    cr_expect(len == strlen("Ġa") && !memcmp(t, "Ġa", len));
    cr_expect_null(exo_tokenizer_id_to_token(tok, 99, &len));
    exo_tokenizer_free(tok);
}

Test(tokenizer, text_over_the_input_cap_is_refused)
{
    exo_tokenizer *tok = mk(bl_json);
    size_t n = EXO_TOKENIZER_MAX_INPUT + 1;
    char *text = malloc(n);
    memset(text, 'a', n);
    int32_t *ids = NULL;
    size_t nids = 0;
    exo_err err = {0};
    cr_assert_eq(exo_tokenizer_encode(tok, text, n, false, &ids, &nids, &err), EXO_ETOOBIG);
    cr_assert(strstr(err.msg, "exceeds"), "%s", err.msg);
    cr_assert_null(ids);
    free(text);
    exo_tokenizer_free(tok);
}

Test(tokenizer, merges_as_pairs_and_ignore_merges)
{
    static const char j[] =
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"aab\":3,\"aa\":4},"
        "\"merges\":[[\"a\",\"b\"],[\"a\",\"a\"]]}}";
    exo_tokenizer *tok = mk(j);
    expect(tok, "aab", false, 1, 3); /* whole word is a token: no merging */
    expect(tok, "aabb", false, 3, 0, 2, 1); /* a a|a b: (a,b) rank 0 wins */
    exo_tokenizer_free(tok);
}

/* SentencePiece-style: Prepend + Replace normalizer, byte fallback, unk. */
static const char spm_json[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"▁\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"▁\":4,\"h\":5,\"i\":6,\"▁h\":7,\"▁hi\":8,\"<0xE2>\":9},"
    "\"merges\":[\"▁ h\",\"▁h i\"]}}";

Test(tokenizer, sentencepiece_style)
{
    exo_tokenizer *tok = mk(spm_json);
    expect(tok, "hi", false, 1, 8);
    expect(tok, "hi", true, 2, 1, 8);
    expect(tok, "hi hi", false, 2, 8, 8);
    expect(tok, "é", false, 3, 4, 2, 3);   /* byte fallback: C3 A9 */
    expect(tok, "hxyzi", false, 3, 7, 0, 6); /* x, y, z: one fused unk */
    exo_tokenizer_free(tok);
}

Test(tokenizer, sentencepiece_unk_and_decode)
{
    exo_tokenizer *tok = mk(spm_json);
    /* x, y, z have no token and no full byte fallback: one fused unk */
    expect(tok, "hxyz", false, 2, 7, 0);
    expect(tok, "<s>hi", false, 2, 1, 8); /* the normalizer runs after the split: "hi" -> ▁hi */
    expect_dec(tok, false, "hi é", 4, 8, 4, 2, 3);
    expect_dec(tok, false, "hi<unk>", 2, 8, 0);
    expect_dec(tok, true, "hi hi", 3, 1, 8, 8);
    /* a lone invalid byte run decodes to one U+FFFD per byte */
    expect_dec(tok, false, "hi\xEF\xBF\xBD\xEF\xBF\xBD", 3, 8, 2, 9);
    exo_tokenizer_free(tok);
}

/* Words as tokens (ignore_merges, no merges) make split boundaries visible. */
static exo_tokenizer *split_tok(const char *pretok)
{
    static char j[2048];
    snprintf(j, sizeof j,
             "{\"pre_tokenizer\":%s,\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"unk_token\":\"?\","
             "\"vocab\":{\"?\":0,\"a\":1,\"b\":2,\",\":3,\"a,\":4,\",b\":5,\",,\":6,\"ab\":7,\"1\":8,\"2\":9,"
             "\"12\":10,\"▁a\":11,\"▁b\":12,\"▁\":13,\"a▁\":14,\"!\":15,\"!!\":16,\" \":17,\"a \":18},\"merges\":[]}}",
             pretok);
    return mk(j);
}

static exo_tokenizer *split_with(const char *behavior, bool invert)
{
    char p[512];
    snprintf(p, sizeof p, "{\"type\":\"Split\",\"pattern\":{\"String\":\",\"},\"behavior\":\"%s\",\"invert\":%s}",
             behavior, invert ? "true" : "false");
    return split_tok(p);
}

Test(tokenizer, split_behaviors)
{
    exo_tokenizer *t;
    t = split_with("Isolated", false);
    expect(t, "a,b", false, 3, 1, 3, 2);
    exo_tokenizer_free(t);
    t = split_with("Removed", false);
    expect(t, "a,b", false, 2, 1, 2);
    exo_tokenizer_free(t);
    t = split_with("MergedWithPrevious", false);
    expect(t, "a,b", false, 2, 4, 2);
    exo_tokenizer_free(t);
    t = split_with("MergedWithNext", false);
    expect(t, "a,b", false, 2, 1, 5);
    exo_tokenizer_free(t);
    t = split_with("Contiguous", false);
    expect(t, "a,,b", false, 3, 1, 6, 2);
    exo_tokenizer_free(t);
    t = split_with("Removed", true); /* invert: the non-commas are removed */
    expect(t, "a,,b", false, 2, 3, 3);
    exo_tokenizer_free(t);
}

Test(tokenizer, split_regex_digits_punct)
{
    exo_tokenizer *t = split_tok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+\"},\"behavior\":\"Isolated\"}");
    expect(t, "a12b", false, 3, 1, 10, 2);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Digits\",\"individual_digits\":true}");
    expect(t, "a12", false, 3, 1, 8, 9);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Digits\",\"individual_digits\":false}");
    expect(t, "a12", false, 2, 1, 10);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Punctuation\",\"behavior\":\"Isolated\"}");
    expect(t, "a!!", false, 3, 1, 15, 15);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"}");
    expect(t, "a!!", false, 2, 1, 16);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"WhitespaceSplit\"}");
    expect(t, " a  b ", false, 2, 1, 2);
    exo_tokenizer_free(t);
}

Test(tokenizer, metaspace_schemes)
{
    exo_tokenizer *t = split_tok("{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\",\"split\":true}");
    expect(t, "a b", false, 2, 11, 12);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"never\",\"split\":true}");
    expect(t, "a b", false, 2, 1, 12);
    exo_tokenizer_free(t);
    t = split_tok("{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\",\"split\":false}");
    expect(t, "a", false, 1, 11);
    exo_tokenizer_free(t);
}

Test(tokenizer, metaspace_first_only_at_text_start)
{
    static const char j[] =
        "{\"added_tokens\":[{\"id\":20,\"content\":\"<x>\",\"special\":true}],"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\",\"split\":true},"
        "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":1,\"▁a\":11,\"b\":2,\"▁b\":12},\"merges\":[]}}";
    exo_tokenizer *t = mk(j);
    expect(t, "a<x>a", false, 3, 11, 20, 1);
    expect_dec(t, false, "a b", 2, 11, 12);
    exo_tokenizer_free(t);
}

Test(tokenizer, normalizers)
{
    exo_tokenizer *t;
    static const char j[] =
        "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},"
        "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}]},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"f\":0,\"i\":1,\"a\":2,\"fi\":3},\"merges\":[\"f i\"]}}";
    t = mk(j);
    expect(t, "  \xEF\xAC\x81 ", false, 1, 3); /* U+FB01 ligature -> "fi" */
    expect(t, "FIA", false, 2, 3, 2);
    exo_tokenizer_free(t);
    static const char nfc[] =
        "{\"normalizer\":{\"type\":\"NFC\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"é\":0,\"e\":1},\"merges\":[]}}";
    t = mk(nfc);
    expect(t, "e\xCC\x81", false, 1, 0);
    exo_tokenizer_free(t);
}

Test(tokenizer, added_token_options)
{
    static const char j[] =
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"<L>\",\"special\":false,\"lstrip\":true},"
        "{\"id\":11,\"content\":\"<R>\",\"special\":false,\"rstrip\":true},"
        "{\"id\":12,\"content\":\"w\",\"special\":false,\"single_word\":true},"
        "{\"id\":13,\"content\":\"<R><R>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\" \":1,\"w\":2,\"a \":3},\"merges\":[]}}";
    exo_tokenizer *t = mk(j);
    expect(t, "a  <L>a", false, 3, 0, 10, 0);      /* lstrip eats the spaces */
    expect(t, "a<R>  a", false, 3, 0, 11, 0);      /* rstrip too */
    expect(t, "a w a", false, 4, 3, 12, 1, 0);     /* standalone word: the added token */
    expect(t, "aw", false, 2, 0, 2);               /* glued to a word: not matched */
    expect(t, "<R><R>a", false, 2, 13, 0);         /* longest match wins */
    exo_tokenizer_free(t);
}

Test(tokenizer, config_bos_eos_rules)
{
    static const char cfg_llama[] =
        "{\"tokenizer_class\":\"LlamaTokenizerFast\",\"bos_token\":{\"content\":\"<s>\"},\"eos_token\":\"</s>\","
        "\"add_bos_token\":true,\"add_eos_token\":true}";
    static const char j[] =
        "{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true},{\"id\":2,\"content\":\"</s>\",\"special\":true}],"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    exo_tokenizer *t = mk2(j, cfg_llama);
    expect(t, "a", true, 3, 1, 0, 2);
    expect(t, "a", false, 1, 0);
    cr_expect_eq(exo_tokenizer_bos_id(t), 1);
    const int32_t *eos;
    cr_expect_eq(exo_tokenizer_eos_ids(t, &eos), 1);
    cr_expect_eq(eos[0], 2);
    exo_tokenizer_free(t);
    /* other classes: tokenizer.json's (absent) post-processor decides */
    t = mk2(j, "{\"tokenizer_class\":\"PreTrainedTokenizerFast\",\"bos_token\":null,\"eos_token\":\"</s>\"}");
    expect(t, "a", true, 1, 0);
    cr_expect_eq(exo_tokenizer_bos_id(t), -1);
    exo_tokenizer_free(t);
}

Test(tokenizer, stream_holds_partial_utf8)
{
    /* byte-level: "€" is E2 82 AC, one byte token each */
    static const char j[] =
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"â\":0,\"Ĥ\":1,\"¬\":2,\"a\":3},\"merges\":[]}}";
    exo_tokenizer *t = mk(j);
    expect(t, "\xE2\x82\xAC", false, 3, 0, 1, 2);
    exo_detok_stream *ds = exo_detok_stream_new(t, false);
    size_t len;
    const char *p = exo_detok_stream_push(ds, 3, &len);
    cr_expect(len == 1 && p[0] == 'a');
    exo_detok_stream_push(ds, 0, &len);
    cr_expect_eq(len, 0);
    exo_detok_stream_push(ds, 1, &len);
    cr_expect_eq(len, 0);
    p = exo_detok_stream_push(ds, 2, &len);
    cr_expect(len == 3 && !memcmp(p, "\xE2\x82\xAC", 3));
    /* an unfinished character is flushed as U+FFFD at the end */
    exo_detok_stream_push(ds, 0, &len);
    cr_expect_eq(len, 0);
    p = exo_detok_stream_flush(ds, &len);
    cr_expect(len == 3 && !memcmp(p, "\xEF\xBF\xBD", 3));
    exo_detok_stream_free(ds);
    exo_tokenizer_free(t);
}

Test(tokenizer, invalid_utf8_input_is_replaced)
{
    static const char j[] =
        "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"ï\":1,\"¿\":2,\"½\":3},\"merges\":[]}}";
    exo_tokenizer *t = mk(j);
    expect(t, "a\xFF" "a", false, 5, 0, 1, 2, 3, 0);
    exo_tokenizer_free(t);
}

Test(tokenizer, utf8_lossy_maximal_subparts)
{
    struct { const char *in; int fffd; } cases[] = {
        {"\xF0\x9F\x98", 1},      /* truncated 4-byte: one */
        {"\xE0\x80\x8F", 3},      /* overlong: each byte */
        {"\xED\xA0\x80", 3},      /* surrogate: each byte */
        {"\xC3\x28", 1},          /* bad continuation: one, '(' kept */
        {"a\x80\x80" "b", 2},
        {"\xF4\x90\x80\x80", 4},  /* above U+10FFFF */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        exo_tok_buf b = {0};
        exo_tok_utf8_lossy(cases[i].in, strlen(cases[i].in), &b);
        int n = 0;
        for (size_t k = 0; k + 3 <= b.len; k++)
            n += !memcmp(b.p + k, "\xEF\xBF\xBD", 3);
        cr_expect_eq(n, cases[i].fffd, "case %zu: %d replacements", i, n);
        cr_expect(exo_tok_utf8_valid(b.p, b.len));
        exo_tok_buf_free(&b);
    }
    cr_expect_eq(exo_tok_utf8_incomplete_tail("a\xE2\x82", 3), 2);
    cr_expect_eq(exo_tok_utf8_incomplete_tail("a\xE2\x82\xAC", 4), 0);
}

Test(tokenizer, json_escapes_in_vocab)
{
    static const char j[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\u00e9\":0,\"\\ud83d\\ude00\":1,\"\\\"\\\\\\n\":2},\"merges\":[]}}";
    exo_tokenizer *t = mk(j);
    expect(t, "é😀", false, 2, 0, 1);
    cr_expect_eq(exo_tokenizer_token_to_id(t, "\"\\\n", 3), 2);
    exo_tokenizer_free(t);
}

Test(tokenizer, load_errors)
{
    struct { const char *json; int code; } cases[] = {
        {"", EXO_EFORMAT},
        {"{", EXO_EFORMAT},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", EXO_EUNSUPPORTED},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", EXO_EFORMAT},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", EXO_EFORMAT},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a  a\"]}}", EXO_EFORMAT},
        /* a merge whose second part is empty (found by fuzzing: UB on a NULL buffer) */
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a \"]}}", EXO_EFORMAT},
        {"{\"normalizer\":{\"type\":\"Bogus\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", EXO_EUNSUPPORTED},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"}},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", EXO_EFORMAT},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\\ud800\":0},\"merges\":[]}}", EXO_EFORMAT},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}} trailing", EXO_EFORMAT},
        /* post-processor ids must name vocabulary entries (found by fuzzing) */
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],"
         "\"special_tokens\":{\"<s>\":{\"ids\":[6]}}},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", EXO_EFORMAT},
        {"{\"post_processor\":{\"type\":\"BertProcessing\",\"cls\":[\"a\",0],\"sep\":[\"b\",-1]},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", EXO_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        exo_tokenizer *t = NULL;
        exo_err err = {0};
        int rc = exo_tokenizer_load_mem(cases[i].json, strlen(cases[i].json), NULL, 0, &t, &err);
        cr_expect_eq(rc, cases[i].code, "case %zu: rc %d (%s)", i, rc, err.msg);
        cr_expect_null(t);
        exo_tokenizer_free(t);
    }
    exo_tokenizer *t;
    exo_err err;
    cr_expect_eq(exo_tokenizer_load("/nonexistent-dir", &t, &err), EXO_ENOENT);
}
