/* libFuzzer target for the tokenizer. The first input byte picks the mode:
 *   even: the rest is a tokenizer.json; if it loads, encode/decode/stream a
 *         fixed text with it (the loader, the JSON scanner and whatever
 *         pipeline the input describes);
 *   odd:  the rest is text for two small fixed tokenizers (byte-level BPE
 *         with added tokens and a Split regex; SentencePiece-style with
 *         byte fallback and unk), arbitrary bytes including invalid UTF-8.
 * Invariants: encode succeeds on any text, every id is < vocab_size, decode
 * and every streamed piece are valid UTF-8, and for the fixed tokenizers
 * the stream's pieces add up to decode(ids) (not for arbitrary decoder
 * chains: e.g. Strip with stop > 0 is not prefix-stable, which no real
 * tokenizer uses). */
// FUZZ_SOURCES: src/tokenizer/utf8.c src/tokenizer/regex.c src/tokenizer/vocab.c src/tokenizer/json_scan.c src/tokenizer/normalizer.c src/tokenizer/pretokenizer.c src/tokenizer/bpe.c src/tokenizer/added_tokens.c src/tokenizer/decoder.c src/tokenizer/tokenizer.c src/tokenizer/detok_stream.c src/core/alloc.c src/core/error.c
#include "core/alloc.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char bl_json[] =
    "{\"added_tokens\":[{\"id\":12,\"content\":\"<|end|>\",\"special\":true},"
    "{\"id\":13,\"content\":\"<t>\",\"special\":false,\"lstrip\":true,\"rstrip\":true},"
    "{\"id\":14,\"content\":\"w\",\"special\":false,\"single_word\":true,\"normalized\":true}],"
    "\"normalizer\":{\"type\":\"NFC\"},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
    "{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s+(?!\\\\S)|\\\\s+\"},"
    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,"
    "\"Ġ\":5,\"Ġa\":6,\"Ã\":7,\"©\":8,\"Ã©\":9,\"Ċ\":10,\"ĊĊ\":11},"
    "\"merges\":[\"a b\",\"ab c\",\"Ġ a\",\"Ã ©\",\"Ċ Ċ\"]}}";

static const char spm_json[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
    "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\",\"split\":true}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"▁\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"▁\":4,\"h\":5,\"i\":6,\"▁h\":7,\"▁hi\":8,\"<0xE2>\":9,\"<0x80>\":10},"
    "\"merges\":[\"▁ h\",\"▁h i\"]}}";

static void check(const exo_tokenizer *tok, const char *text, size_t len, bool stream_exact)
{
    int32_t *ids;
    size_t n;
    exo_err err;
    for (int special = 0; special < 2; special++) {
        if (exo_tokenizer_encode(tok, text, len, special, &ids, &n, &err))
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= exo_tokenizer_vocab_size(tok))
                abort();
        size_t dl;
        char *dec = exo_tokenizer_decode(tok, ids, n, false, &dl);
        if (!exo_tok_utf8_valid(dec, dl))
            abort();
        exo_detok_stream *ds = exo_detok_stream_new(tok, false);
        exo_tok_buf acc = {0};
        for (size_t i = 0; i <= n; i++) {
            size_t pl;
            const char *p = i < n ? exo_detok_stream_push(ds, ids[i], &pl) : exo_detok_stream_flush(ds, &pl);
            if (!exo_tok_utf8_valid(p, pl))
                abort();
            exo_tok_buf_put(&acc, p, pl);
        }
        if (stream_exact && (acc.len != dl || (dl && memcmp(acc.p, dec, dl))))
            abort();
        exo_tok_buf_free(&acc);
        exo_detok_stream_free(ds);
        exo_free(dec);
        exo_free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static exo_tokenizer *bl, *spm;
    if (!bl) {
        exo_err err;
        if (exo_tokenizer_load_mem(bl_json, strlen(bl_json), NULL, 0, &bl, &err) ||
            exo_tokenizer_load_mem(spm_json, strlen(spm_json), NULL, 0, &spm, &err))
            abort();
    }
    if (!size)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        check(bl, rest, n, true);
        check(spm, rest, n, true);
        return 0;
    }
    exo_tokenizer *tok = NULL;
    exo_err err;
    if (exo_tokenizer_load_mem(rest, n, NULL, 0, &tok, &err) == 0) {
        static const char text[] = "Hello wörld 123 <|end|> 😀\n\n  x\xFF";
        check(tok, text, sizeof text - 1, false);
        exo_tokenizer_free(tok);
    }
    return 0;
}
