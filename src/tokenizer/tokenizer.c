/* The tokenizer: loading tokenizer.json/tokenizer_config.json and running
 * the HF pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE ->
 * post-processor) and its inverse (decoder).
 *
 * Loading: the file is validated as UTF-8 once, json_scan.c parses the big
 * model.vocab/model.merges sections directly, and jansson parses the rest
 * (see json_scan.c for why). Encoding keeps all scratch state on the
 * caller's stack/heap, so one tokenizer serves many threads. */
#include "tokenizer/tok_internal.h"

#include "core/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- loading ---- */

static int read_file(const char *path, char **out, size_t *len, exo_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return exo_err_set(err, errno == ENOENT ? EXO_ENOENT : EXO_EIO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || ftell(f) < 0) {
        fclose(f);
        return exo_err_set(err, EXO_EIO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    rewind(f);
    if (n > (1L << 31)) {
        fclose(f);
        return exo_err_set(err, EXO_ETOOBIG, "%s: larger than 2 GiB", path);
    }
    char *buf = exo_try_malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return exo_err_set(err, EXO_ENOMEM, "%s: cannot allocate %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        exo_free(buf);
        return exo_err_set(err, EXO_EIO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return 0;
}

/* Grows the id table so that id is valid. */
static void ensure_id(exo_tok_vocab *v, uint32_t id)
{
    if (id < v->n)
        return;
    v->ent = exo_realloc(v->ent, ((size_t)id + 1) * sizeof *v->ent);
    memset(v->ent + v->n, 0, ((size_t)id + 1 - v->n) * sizeof *v->ent);
    v->n = id + 1;
}

static int parse_added(exo_tokenizer *tok, json_t *arr, exo_err *err)
{
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: added_tokens is not an array");
    size_t n = json_array_size(arr);
    tok->added = exo_calloc(n ? n : 1, sizeof *tok->added);
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(arr, i);
        json_t *id = json_object_get(a, "id"), *c = json_object_get(a, "content");
        if (!json_is_integer(id) || !json_is_string(c) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= EXO_TOK_MAX_ID)
            return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: added_tokens[%zu]: bad id or content", i);
        exo_tok_added *t = &tok->added[tok->n_added++];
        t->id          = (int32_t)json_integer_value(id);
        t->len         = json_string_length(c);
        t->content     = exo_strndup(json_string_value(c), t->len);
        t->special     = json_is_true(json_object_get(a, "special"));
        t->lstrip      = json_is_true(json_object_get(a, "lstrip"));
        t->rstrip      = json_is_true(json_object_get(a, "rstrip"));
        t->normalized  = json_is_true(json_object_get(a, "normalized"));
        t->single_word = json_is_true(json_object_get(a, "single_word"));
        exo_tok_vocab *v = &tok->vocab;
        ensure_id(v, (uint32_t)t->id);
        exo_tok_entry *e = &v->ent[t->id];
        if (!(e->flags & EXO_TOK_PRESENT))
            e->model_len = UINT32_MAX;
        if (v->arena.len + t->len > UINT32_MAX - 8)
            return exo_err_set(err, EXO_ETOOBIG, "tokenizer.json: too much text");
        e->text_off = (uint32_t)v->arena.len;
        e->text_len = (uint32_t)t->len;
        exo_tok_buf_put(&v->arena, t->content, t->len);
        e->flags = (uint8_t)(EXO_TOK_PRESENT | EXO_TOK_ADDED | (t->special ? EXO_TOK_SPECIAL : 0));
    }
    /* Matchers: raw-text tokens as written, normalized ones normalized. */
    char **contents = exo_calloc(n ? n : 1, sizeof *contents);
    size_t *lens = exo_calloc(n ? n : 1, sizeof *lens);
    exo_tok_buf nb = {0};
    for (size_t i = 0; i < tok->n_added; i++) {
        exo_tok_added *t = &tok->added[i];
        if (t->normalized && tok->normalizer) {
            exo_tok_normalizer_apply(tok->normalizer, t->content, t->len, &nb);
            contents[i] = exo_strndup(nb.p, nb.len);
            lens[i]     = nb.len;
        } else {
            contents[i] = exo_strndup(t->content, t->len);
            lens[i]     = t->len;
        }
    }
    tok->trie_raw  = exo_tok_trie_build(tok->added, contents, lens, tok->n_added, false);
    tok->trie_norm = exo_tok_trie_build(tok->added, contents, lens, tok->n_added, true);
    for (size_t i = 0; i < tok->n_added; i++)
        exo_free(contents[i]);
    exo_free(contents);
    exo_free(lens);
    exo_tok_buf_free(&nb);
    return 0;
}

static int32_t id_of_json_token(const exo_tokenizer *tok, json_t *j)
{
    if (json_is_object(j))
        j = json_object_get(j, "content");
    if (!json_is_string(j))
        return -1;
    return exo_tokenizer_token_to_id(tok, json_string_value(j), json_string_length(j));
}

static void set_template(exo_tokenizer *tok, const int32_t *pre, size_t npre, const int32_t *post,
                         size_t npost)
{
    exo_free(tok->pp_pre);
    exo_free(tok->pp_post);
    tok->pp_pre  = exo_malloc((npre ? npre : 1) * sizeof *pre);
    tok->pp_post = exo_malloc((npost ? npost : 1) * sizeof *post);
    if (npre)
        memcpy(tok->pp_pre, pre, npre * sizeof *pre);
    if (npost)
        memcpy(tok->pp_post, post, npost * sizeof *post);
    tok->n_pp_pre  = npre;
    tok->n_pp_post = npost;
}

/* Ids the post-processor inserts reach the model's embedding lookup, so
 * they are checked here rather than trusted. */
static bool id_in_vocab(const exo_tokenizer *tok, const json_t *x)
{
    return json_is_integer(x) && json_integer_value(x) >= 0 &&
           (size_t)json_integer_value(x) < tok->vocab.n;
}

static int parse_post(exo_tokenizer *tok, json_t *pp, int depth, exo_err *err)
{
    if (!pp || json_is_null(pp))
        return 0;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type || depth > 8)
        return exo_err_set(err, EXO_EFORMAT, "post_processor: missing type");
    if (!strcmp(type, "ByteLevel"))
        return 0;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = parse_post(tok, json_array_get(arr, i), depth + 1, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(pp, "cls"), *sep = json_object_get(pp, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si))
            return exo_err_set(err, EXO_EFORMAT, "post_processor %s: bad cls/sep", type);
        if (!id_in_vocab(tok, ci) || !id_in_vocab(tok, si))
            return exo_err_set(err, EXO_EFORMAT, "post_processor %s: cls/sep id out of range", type);
        int32_t a = (int32_t)json_integer_value(ci), b = (int32_t)json_integer_value(si);
        set_template(tok, &a, 1, &b, 1);
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(pp, "single");
        json_t *specials = json_object_get(pp, "special_tokens");
        exo_tok_ids pre = {0}, post = {0};
        bool seen_a = false;
        int rc = 0;
        for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
            json_t *item = json_array_get(single, i);
            json_t *st = json_object_get(item, "SpecialToken");
            if (json_object_get(item, "Sequence")) {
                seen_a = true;
                continue;
            }
            json_t *name = json_object_get(st, "id");
            json_t *ids = json_object_get(json_object_get(specials, json_string_value(name) ? json_string_value(name) : ""), "ids");
            if (!json_is_array(ids)) {
                rc = exo_err_set(err, EXO_EFORMAT, "post_processor: special token %s undefined",
                                 json_string_value(name) ? json_string_value(name) : "?");
                break;
            }
            for (size_t k = 0; k < json_array_size(ids); k++) {
                json_t *x = json_array_get(ids, k);
                if (!id_in_vocab(tok, x)) {
                    rc = exo_err_set(err, EXO_EFORMAT, "post_processor: bad or out-of-range id");
                    break;
                }
                exo_tok_ids_push(seen_a ? &post : &pre, (int32_t)json_integer_value(x));
            }
        }
        if (!rc)
            set_template(tok, pre.v, pre.n, post.v, post.n);
        exo_free(pre.v);
        exo_free(post.v);
        return rc;
    }
    return exo_err_set(err, EXO_EUNSUPPORTED, "post_processor type %s is not supported", type);
}

/* transformers classes that rebuild the post-processor from
 * add_bos_token/add_eos_token at init (update_post_processor). */
static bool class_uses_flags(const char *cls)
{
    static const char *const names[] = {"LlamaTokenizer", "LlamaTokenizerFast", "GemmaTokenizer",
                                        "GemmaTokenizerFast", "CodeLlamaTokenizer",
                                        "CodeLlamaTokenizerFast"};
    for (size_t i = 0; cls && i < sizeof names / sizeof *names; i++)
        if (!strcmp(cls, names[i]))
            return true;
    return false;
}

static int parse_config(exo_tokenizer *tok, const char *cfg, size_t len, exo_err *err)
{
    json_error_t jerr;
    json_t *c = json_loadb(cfg, len, JSON_DECODE_INT_AS_REAL, &jerr); /* model_max_length can be 1e30 */
    if (!c || !json_is_object(c)) {
        json_decref(c);
        return exo_err_set(err, EXO_EFORMAT, "tokenizer_config.json: line %d: %s", jerr.line, jerr.text);
    }
    tok->bos_id = id_of_json_token(tok, json_object_get(c, "bos_token"));
    int32_t eos = id_of_json_token(tok, json_object_get(c, "eos_token"));
    if (eos >= 0) {
        tok->eos_id[0] = eos;
        tok->n_eos     = 1;
    }
    if (class_uses_flags(json_string_value(json_object_get(c, "tokenizer_class")))) {
        json_t *ab = json_object_get(c, "add_bos_token"), *ae = json_object_get(c, "add_eos_token");
        bool add_bos = ab ? json_is_true(ab) : true; /* the classes' defaults */
        bool add_eos = ae ? json_is_true(ae) : false;
        int32_t bos = tok->bos_id, eosi = eos;
        set_template(tok, &bos, add_bos && bos >= 0, &eosi, add_eos && eos >= 0);
    }
    json_decref(c);
    return 0;
}

int exo_tokenizer_load_mem(const char *json, size_t json_len, const char *config,
                           size_t config_len, exo_tokenizer **out, exo_err *err)
{
    *out = NULL;
    if (!exo_tok_utf8_valid(json, json_len))
        return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: not valid UTF-8");
    size_t vs[2], ms[2];
    int rc = exo_tok_json_locate(json, json_len, vs, ms, err);
    if (rc)
        return rc;
    if (vs[1] <= vs[0])
        return exo_err_set(err, EXO_EUNSUPPORTED, "tokenizer.json: no model.vocab");
    /* jansson gets the file with the two big sections cut out */
    char *rest = exo_malloc(json_len + 5);
    size_t rl = 0;
    {
        size_t cut[2][2] = {{vs[0], vs[1]}, {ms[0], ms[1]}};
        const char *fill[2] = {"{}", "[]"};
        int order[2] = {0, 1};
        if (ms[1] > ms[0] && ms[0] < vs[0])
            order[0] = 1, order[1] = 0;
        size_t at = 0;
        for (int k = 0; k < 2; k++) {
            int w = order[k];
            if (cut[w][1] <= cut[w][0])
                continue;
            memcpy(rest + rl, json + at, cut[w][0] - at);
            rl += cut[w][0] - at;
            memcpy(rest + rl, fill[w], 2);
            rl += 2;
            at = cut[w][1];
        }
        memcpy(rest + rl, json + at, json_len - at);
        rl += json_len - at;
    }
    json_error_t jerr;
    json_t *root = json_loadb(rest, rl, 0, &jerr);
    exo_free(rest);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return exo_err_set(err, EXO_EFORMAT, "tokenizer.json: line %d: %s", jerr.line, jerr.text);
    }

    exo_tokenizer *tok = exo_calloc(1, sizeof *tok);
    tok->bos_id = -1;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE")) {
        rc = exo_err_set(err, EXO_EUNSUPPORTED, "tokenizer.json: model type %s is not supported", mtype);
        goto fail;
    }
    if ((rc = exo_tok_normalizer_parse(json_object_get(root, "normalizer"), &tok->normalizer, err)) ||
        (rc = exo_tok_pretok_parse(json_object_get(root, "pre_tokenizer"), &tok->pretok, err)) ||
        (rc = exo_tok_decoder_parse(json_object_get(root, "decoder"), &tok->decoder, err)))
        goto fail;
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0) {
        rc = exo_err_set(err, EXO_EUNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
        goto fail;
    }

    exo_tok_bpe *bpe   = &tok->bpe;
    bpe->byte_level    = exo_tok_pretok_is_byte_level(tok->pretok);
    bpe->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    bpe->fuse_unk      = json_is_true(json_object_get(model, "fuse_unk"));
    bpe->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    const char *pfx    = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *sfx    = json_string_value(json_object_get(model, "end_of_word_suffix"));
    bpe->prefix        = pfx && *pfx ? exo_strdup(pfx) : NULL;
    bpe->suffix        = sfx && *sfx ? exo_strdup(sfx) : NULL;

    if ((rc = exo_tok_vocab_parse(&tok->vocab, json + vs[0], vs[1] - vs[0], bpe->byte_level, err)))
        goto fail;
    exo__tok_vocab_build_map(&tok->vocab);
    if (ms[1] > ms[0] &&
        (rc = exo_tok_merges_parse(&tok->vocab, json + ms[0], ms[1] - ms[0], bpe->byte_level,
                                   bpe->prefix, err)))
        goto fail;

    json_t *unk = json_object_get(model, "unk_token");
    bpe->unk_id = -1;
    if (json_is_string(unk)) {
        bpe->unk_id = exo_tok_vocab_find(&tok->vocab, json_string_value(unk), json_string_length(unk));
        if (bpe->unk_id < 0) {
            rc = exo_err_set(err, EXO_EFORMAT, "tokenizer.json: unk_token %s is not in the vocabulary",
                             json_string_value(unk));
            goto fail;
        }
    }
    for (int b = 0; b < 128; b++) {
        char c = (char)b;
        bpe->unit_ids[b] = exo_tok_vocab_find(&tok->vocab, &c, 1);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        bpe->byte_ids[b] = exo_tok_vocab_find(&tok->vocab, name, 6);
    }

    if ((rc = parse_added(tok, json_object_get(root, "added_tokens"), err)) ||
        (rc = parse_post(tok, json_object_get(root, "post_processor"), 0, err)))
        goto fail;
    if (config && (rc = parse_config(tok, config, config_len, err)))
        goto fail;
    json_decref(root);
    *out = tok;
    return 0;
fail:
    json_decref(root);
    exo_tokenizer_free(tok);
    return rc;
}

int exo_tokenizer_load(const char *dir, exo_tokenizer **out, exo_err *err)
{
    char path[4096];
    char *json = NULL, *cfg = NULL;
    size_t jl = 0, cl = 0;
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = read_file(path, &json, &jl, err);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    exo_err ignore;
    if (read_file(path, &cfg, &cl, &ignore))
        cfg = NULL;
    rc = exo_tokenizer_load_mem(json, jl, cfg, cl, out, err);
    if (rc)
        exo_err_wrap(err, "%s", dir);
    exo_free(json);
    exo_free(cfg);
    return rc;
}

void exo_tokenizer_free(exo_tokenizer *tok)
{
    if (!tok)
        return;
    exo_tok_vocab_free(&tok->vocab);
    exo_tok_normalizer_free(tok->normalizer);
    exo_tok_pretok_free(tok->pretok);
    exo_tok_decoder_free(tok->decoder);
    for (size_t i = 0; i < tok->n_added; i++)
        exo_free(tok->added[i].content);
    exo_free(tok->added);
    exo_tok_trie_free(tok->trie_raw);
    exo_tok_trie_free(tok->trie_norm);
    exo_free(tok->pp_pre);
    exo_free(tok->pp_post);
    exo_free(tok->bpe.prefix);
    exo_free(tok->bpe.suffix);
    exo_free(tok);
}

/* ---- encoding ---- */

typedef struct enc {
    const exo_tokenizer *tok;
    exo_tok_ids         *out;
    exo_tok_bpe_scratch *sc;
    exo_tok_buf          arena;
    exo_tok_spans        pieces;
} enc;

/* Pre-tokenizes and runs the model on one stretch of normalized text. */
static int encode_text(enc *e, const char *s, size_t n, bool first)
{
    if (!n)
        return 0;
    e->arena.len = 0;
    exo_tok_buf_put(&e->arena, s, n);
    e->pieces.n = 0;
    exo_tok_spans_push(&e->pieces, 0, n, first);
    if (e->tok->pretok) {
        int rc = exo_tok_pretok_apply(e->tok->pretok, &e->arena, &e->pieces);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < e->pieces.n; i++)
        exo_tok_bpe_encode_word(&e->tok->bpe, &e->tok->vocab, e->arena.p + e->pieces.v[i].off,
                                e->pieces.v[i].len, e->sc, e->out);
    return 0;
}

int exo_tokenizer_encode(const exo_tokenizer *tok, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n, exo_err *err)
{
    exo_tok_ids out = {0};
    exo_tok_buf fixed = {0}, norm = {0};
    exo_tok_spans segs = {0}, sub = {0};
    exo_tok_ids seg_ids = {0}, sub_ids = {0};
    enc e = {tok, &out, exo_tok_bpe_scratch_new(), {0}, {0}};
    int rc = 0;
    *ids = NULL;
    *n   = 0;
    if (!text)
        len = 0;
    if (len > EXO_TOKENIZER_MAX_INPUT) {
        exo_tok_bpe_scratch_free(e.sc);
        return exo_err_set(err, EXO_ETOOBIG, "text of %zu bytes exceeds the tokenizer's %zu MiB", len,
                           EXO_TOKENIZER_MAX_INPUT >> 20);
    }
    if (len && !exo_tok_utf8_valid(text, len)) {
        exo_tok_utf8_lossy(text, len, &fixed);
        text = fixed.p;
        len  = fixed.len;
    }
    for (size_t i = 0; i < tok->n_pp_pre && add_special; i++)
        exo_tok_ids_push(&out, tok->pp_pre[i]);
    exo_tok_trie_split(tok->trie_raw, tok->added, text ? text : "", len, &segs, &seg_ids);
    for (size_t i = 0; i < segs.n && !rc; i++) {
        if (segs.v[i].flag) {
            exo_tok_ids_push(&out, seg_ids.v[i]);
            continue;
        }
        const char *s = text + segs.v[i].off;
        size_t sl = segs.v[i].len;
        if (!sl)
            continue;
        if (tok->normalizer) {
            exo_tok_normalizer_apply(tok->normalizer, s, sl, &norm);
            s  = norm.p;
            sl = norm.len;
        }
        bool first = segs.v[i].off == 0;
        if (exo_tok_trie_empty(tok->trie_norm)) {
            rc = encode_text(&e, s, sl, first);
            continue;
        }
        sub.n = sub_ids.n = 0;
        exo_tok_trie_split(tok->trie_norm, tok->added, s, sl, &sub, &sub_ids);
        for (size_t k = 0; k < sub.n && !rc; k++) {
            if (sub.v[k].flag)
                exo_tok_ids_push(&out, sub_ids.v[k]);
            else
                rc = encode_text(&e, s + sub.v[k].off, sub.v[k].len, first && sub.v[k].off == 0);
        }
    }
    for (size_t i = 0; i < tok->n_pp_post && add_special && !rc; i++)
        exo_tok_ids_push(&out, tok->pp_post[i]);
    exo_tok_bpe_scratch_free(e.sc);
    exo_tok_buf_free(&e.arena);
    exo_tok_spans_free(&e.pieces);
    exo_tok_buf_free(&fixed);
    exo_tok_buf_free(&norm);
    exo_tok_spans_free(&segs);
    exo_tok_spans_free(&sub);
    exo_free(seg_ids.v);
    exo_free(sub_ids.v);
    if (rc) {
        exo_free(out.v);
        return exo_err_set(err, rc, "tokenizer: regex matching failed");
    }
    *ids = out.v ? out.v : exo_malloc(sizeof(int32_t));
    *n   = out.n;
    return 0;
}

/* ---- decoding and lookups ---- */

void exo_tok_decode_into(const exo_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                         exo_tok_buf *out)
{
    exo_tok_buf arena = {0};
    exo_tok_spans toks = {0};
    const exo_tok_vocab *v = &tok->vocab;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || (uint32_t)id >= v->n || !(v->ent[id].flags & EXO_TOK_PRESENT))
            continue;
        if (skip_special && (v->ent[id].flags & EXO_TOK_SPECIAL))
            continue;
        size_t off = arena.len;
        exo_tok_buf_put(&arena, v->arena.p + v->ent[id].text_off, v->ent[id].text_len);
        exo_tok_spans_push(&toks, off, v->ent[id].text_len, false);
    }
    exo_tok_buf_reserve(&arena, 1);
    exo_tok_decoder_run(tok->decoder, &arena, &toks, out);
    exo_tok_buf_free(&arena);
    exo_tok_spans_free(&toks);
}

char *exo_tokenizer_decode(const exo_tokenizer *tok, const int32_t *ids, size_t n,
                           bool skip_special, size_t *out_len)
{
    exo_tok_buf out = {0};
    exo_tok_decode_into(tok, ids, n, skip_special, &out);
    exo_tok_buf_putc(&out, 0);
    if (out_len)
        *out_len = out.len - 1;
    return out.p;
}

int32_t exo_tokenizer_token_to_id(const exo_tokenizer *tok, const char *token, size_t len)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && !memcmp(tok->added[i].content, token, len))
            return tok->added[i].id;
    const exo_tok_vocab *v = &tok->vocab;
    if (!tok->bpe.byte_level)
        return exo_tok_vocab_find(v, token, len);
    exo_tok_buf b = {0};
    int32_t id = -1;
    if (exo_tok_bytelevel_to_bytes(token, len, &b))
        id = exo_tok_vocab_find(v, b.p ? b.p : "", b.len);
    exo_tok_buf_free(&b);
    if (id >= 0)
        return id;
    for (uint32_t i = 0; i < v->n; i++) /* tokens outside the byte alphabet */
        if (v->ent[i].model_len == UINT32_MAX && (v->ent[i].flags & EXO_TOK_PRESENT) &&
            v->ent[i].text_len == len && !memcmp(v->arena.p + v->ent[i].text_off, token, len))
            return (int32_t)i;
    return -1;
}

const char *exo_tokenizer_id_to_token(const exo_tokenizer *tok, int32_t id, size_t *len)
{
    const exo_tok_vocab *v = &tok->vocab;
    if (id < 0 || (uint32_t)id >= v->n || !(v->ent[id].flags & EXO_TOK_PRESENT))
        return NULL;
    if (len)
        *len = v->ent[id].text_len;
    return v->arena.p + v->ent[id].text_off;
}

size_t exo_tokenizer_vocab_size(const exo_tokenizer *tok) { return tok->vocab.n; }

int32_t exo_tokenizer_bos_id(const exo_tokenizer *tok) { return tok->bos_id; }

size_t exo_tokenizer_eos_ids(const exo_tokenizer *tok, const int32_t **ids)
{
    *ids = tok->eos_id;
    return tok->n_eos;
}

bool exo_tokenizer_is_special(const exo_tokenizer *tok, int32_t id)
{
    return id >= 0 && (uint32_t)id < tok->vocab.n && (tok->vocab.ent[id].flags & EXO_TOK_SPECIAL);
}
