/* `exo convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR`: turns a
 * llama2.c model (Karpathy's format) into a Hugging Face Llama directory
 * that the engine, the tokenizer and transformers all load.
 *
 * llama2.c applies RoPE to interleaved pairs (x[2i], x[2i+1]); HF's Llama
 * rotates halves (x[i], x[i+hd/2]). The two agree once the rows of q_proj
 * and k_proj are permuted per head: old row h*hd + 2i + j goes to
 * h*hd + j*hd/2 + i.
 *
 * The tokenizer (llama2.c's tok512.bin: scores and byte pieces) becomes a
 * SentencePiece-style BPE tokenizer.json: pieces with ' ' spelled U+2581,
 * byte-fallback tokens <0x00>..<0xFF>, and merges recovered from the piece
 * list (every split of a merged piece into two known pieces, in id order),
 * which reproduces llama2.c's score-driven merging. */
#include "core/alloc.h"
#include "engine/safetensors.h"

#include <errno.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int exo_cmd_convert_llama2c(int argc, char **argv);

typedef struct l2c_config {
    int32_t dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len;
} l2c_config;

static int read_file(const char *path, unsigned char **data, size_t *len, exo_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return exo_err_set(err, EXO_ENOENT, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || (*len = (size_t)ftell(f), fseek(f, 0, SEEK_SET))) {
        fclose(f);
        return exo_err_set(err, EXO_EIO, "%s: cannot read", path);
    }
    *data = exo_malloc(*len ? *len : 1);
    size_t got = fread(*data, 1, *len, f);
    fclose(f);
    if (got != *len) {
        exo_free(*data);
        return exo_err_set(err, EXO_EIO, "%s: short read", path);
    }
    return 0;
}

static int write_json(const char *dir, const char *name, json_t *j, exo_err *err)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(j, tmp, JSON_INDENT(2));
    if (rc || rename(tmp, path)) {
        unlink(tmp);
        return exo_err_set(err, EXO_EIO, "cannot write %s", path);
    }
    return 0;
}

/* Permutes the rows of a (n_heads*hd, cols) matrix from interleaved to
 * rotate-half RoPE order. */
static float *permute_rope_rows(const float *w, int n_heads, int hd, int cols)
{
    float *out = exo_malloc(sizeof(float) * (size_t)n_heads * (size_t)hd * (size_t)cols);
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(out + ((size_t)h * hd + (size_t)j * half + i) * cols,
                       w + ((size_t)h * hd + 2 * (size_t)i + j) * cols, sizeof(float) * (size_t)cols);
    return out;
}

static int convert_weights(const unsigned char *buf, size_t len, const char *src, const char *out_dir,
                           l2c_config *c, bool *tied, exo_err *err)
{
    if (len < sizeof(l2c_config))
        return exo_err_set(err, EXO_EFORMAT, "%s: too short for a llama2.c header", src);
    memcpy(c, buf, sizeof *c);
    bool shared = c->vocab > 0;
    *tied = shared;
    int32_t V = shared ? c->vocab : -c->vocab;
    if (c->dim <= 0 || c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv <= 0 ||
        V <= 0 || c->seq_len <= 0 || c->dim % c->n_heads || c->n_heads % c->n_kv ||
        (c->dim / c->n_heads) % 2 || c->dim > 65536 || c->hidden > 1 << 20 || c->n_layers > 4096 ||
        V > 1 << 24 || c->seq_len > 1 << 24)
        return exo_err_set(err, EXO_EFORMAT, "%s: implausible llama2.c header", src);
    c->vocab = V;
    size_t D = (size_t)c->dim, H = (size_t)c->hidden, L = (size_t)c->n_layers;
    size_t hd = D / (size_t)c->n_heads, KV = (size_t)c->n_kv * hd;
    size_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D +
                    (size_t)c->seq_len * hd;
    if (!shared)
        floats += V * D;
    if (len != sizeof *c + floats * sizeof(float))
        return exo_err_set(err, EXO_EFORMAT, "%s: %zu bytes, the header implies %zu", src, len,
                           sizeof *c + floats * sizeof(float));
    const float *p = (const float *)(const void *)(buf + sizeof *c);
    const float *emb = p;               p += V * D;
    const float *rms_att = p;           p += L * D;
    const float *wq = p;                p += L * D * D;
    const float *wk = p;                p += L * KV * D;
    const float *wv = p;                p += L * KV * D;
    const float *wo = p;                p += L * D * D;
    const float *rms_ffn = p;           p += L * D;
    const float *w1 = p;                p += L * H * D;
    const float *w2 = p;                p += L * D * H;
    const float *w3 = p;                p += L * H * D;
    const float *rms_final = p;         p += D;
    p += (size_t)c->seq_len * hd; /* freq_cis_real + freq_cis_imag: recomputed by RoPE */
    const float *wcls = shared ? NULL : p;

    exo_st_writer *w = exo_st_writer_new();
    exo_st_writer_set_metadata(w, "format", "pt");
    int rc = 0;
    char name[256];
#define ADD(nm, data, r, cl)                                                                     \
    do {                                                                                          \
        int64_t shape[2] = {(int64_t)(r), (int64_t)(cl)};                                         \
        int nd = (cl) ? 2 : 1;                                                                    \
        if (!(cl))                                                                                \
            shape[0] = (int64_t)(r);                                                              \
        if ((rc = exo_st_writer_add_copy(w, nm, EXO_DTYPE_F32, nd, shape, data,                   \
                                         sizeof(float) * (size_t)(r) * ((cl) ? (size_t)(cl) : 1), \
                                         err)))                                                   \
            goto out;                                                                             \
    } while (0)
    ADD("model.embed_tokens.weight", emb, V, D);
    ADD("model.norm.weight", rms_final, D, 0);
    if (wcls)
        ADD("lm_head.weight", wcls, V, D);
    for (size_t l = 0; l < L; l++) {
#define N(fmt) (snprintf(name, sizeof name, "model.layers.%zu." fmt, l), name)
        ADD(N("input_layernorm.weight"), rms_att + l * D, D, 0);
        ADD(N("post_attention_layernorm.weight"), rms_ffn + l * D, D, 0);
        float *q = permute_rope_rows(wq + l * D * D, c->n_heads, (int)hd, (int)D);
        float *k = permute_rope_rows(wk + l * KV * D, c->n_kv, (int)hd, (int)D);
        int64_t qs[2] = {(int64_t)D, (int64_t)D}, ks[2] = {(int64_t)KV, (int64_t)D};
        if ((rc = exo_st_writer_add_owned(w, N("self_attn.q_proj.weight"), EXO_DTYPE_F32, 2, qs, q,
                                          sizeof(float) * D * D, err))) {
            exo_free(k);
            goto out;
        }
        if ((rc = exo_st_writer_add_owned(w, N("self_attn.k_proj.weight"), EXO_DTYPE_F32, 2, ks, k,
                                          sizeof(float) * KV * D, err)))
            goto out;
        ADD(N("self_attn.v_proj.weight"), wv + l * KV * D, KV, D);
        ADD(N("self_attn.o_proj.weight"), wo + l * D * D, D, D);
        ADD(N("mlp.gate_proj.weight"), w1 + l * H * D, H, D);
        ADD(N("mlp.down_proj.weight"), w2 + l * D * H, D, H);
        ADD(N("mlp.up_proj.weight"), w3 + l * H * D, H, D);
#undef N
    }
#undef ADD
    snprintf(name, sizeof name, "%s/model.safetensors", out_dir);
    rc = exo_st_writer_write(w, name, err);
out:
    exo_st_writer_free(w);
    return rc;
}

static json_t *make_config(const l2c_config *c, bool tied)
{
    return json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:s,s:b,s:i,s:i,s:s}",
                     "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
                     c->dim, "intermediate_size", c->hidden, "num_hidden_layers", c->n_layers,
                     "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv,
                     "vocab_size", c->vocab, "max_position_embeddings", c->seq_len, "rms_norm_eps",
                     1e-5, "rope_theta", 10000.0, "hidden_act", "silu", "tie_word_embeddings", tied,
                     "bos_token_id", 1, "eos_token_id", 2, "torch_dtype", "float32");
}

/* Piece i of the llama2.c vocabulary as a tokenizer.json token. */
static char *piece_token(int id, const unsigned char *s, int32_t n)
{
    if (id == 0)
        return exo_strdup("<unk>");
    if (id == 1)
        return exo_strdup("<s>");
    if (id == 2)
        return exo_strdup("</s>");
    size_t cap = (size_t)n * 3 + 1, k = 0;
    char *o = exo_malloc(cap);
    for (int32_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(o + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            o[k++] = (char)s[i];
        }
    }
    o[k] = 0;
    return o;
}

static int convert_tokenizer(const unsigned char *buf, size_t len, const char *src, const char *out_dir,
                             int vocab, exo_err *err)
{
    char **tok = exo_calloc((size_t)vocab, sizeof(char *));
    json_t *vocab_obj = json_object(), *merges = json_array();
    int rc = 0;
    size_t off = 4;
    for (int i = 0; i < vocab; i++) {
        int32_t n;
        if (off + 8 > len)
            goto short_file;
        memcpy(&n, buf + off + 4, 4);
        off += 8;
        if (n < 0 || n > 1024 || off + (size_t)n > len)
            goto short_file;
        tok[i] = piece_token(i, buf + off, n);
        off += (size_t)n;
        if (json_object_get(vocab_obj, tok[i])) {
            rc = exo_err_set(err, EXO_EFORMAT, "%s: duplicate piece '%s' (id %d)", src, tok[i], i);
            goto out;
        }
        json_object_set_new(vocab_obj, tok[i], json_integer(i));
    }
    if (off != len) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: %zu trailing bytes after %d pieces", src, len - off, vocab);
        goto out;
    }
    /* Merges: for every piece from id 259 up, each split into two known
     * pieces, ordered by (id(left), id(right)). */
    for (int i = 259; i < vocab; i++) {
        size_t n = strlen(tok[i]);
        json_t *splits = json_array();
        for (size_t cut = 1; cut < n; cut++) {
            char left[2048], right[2048];
            if (cut >= sizeof left || n - cut >= sizeof right)
                break;
            memcpy(left, tok[i], cut);
            left[cut] = 0;
            strcpy(right, tok[i] + cut);
            json_t *a = json_object_get(vocab_obj, left), *b = json_object_get(vocab_obj, right);
            if (!a || !b)
                continue;
            json_array_append_new(splits, json_pack("[I,I,s,s]", json_integer_value(a),
                                                    json_integer_value(b), left, right));
        }
        /* insertion sort by (id(a), id(b)) */
        size_t ns = json_array_size(splits);
        for (size_t x = 1; x < ns; x++)
            for (size_t y = x; y > 0; y--) {
                json_t *p = json_array_get(splits, y - 1), *q = json_array_get(splits, y);
                json_int_t pa = json_integer_value(json_array_get(p, 0));
                json_int_t qa = json_integer_value(json_array_get(q, 0));
                json_int_t pb = json_integer_value(json_array_get(p, 1));
                json_int_t qb = json_integer_value(json_array_get(q, 1));
                if (pa < qa || (pa == qa && pb <= qb))
                    break;
                json_incref(p);
                json_array_set(splits, y - 1, q);
                json_array_set_new(splits, y, p);
            }
        for (size_t x = 0; x < ns; x++) {
            json_t *sp = json_array_get(splits, x);
            json_array_append_new(merges, json_pack("[O,O]", json_array_get(sp, 2), json_array_get(sp, 3)));
        }
        json_decref(splits);
    }
    json_t *added = json_array();
    static const char *const specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content",
                                               specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    json_t *t = json_pack(
        "{s:s,s:n,s:n,s:o,"
        "s:{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]},"
        "s:n,"
        "s:{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],"
        "   s:[{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}},{s:{s:s,s:i}}],"
        "   s:{s:{s:s,s:[i],s:[s]}}},"
        "s:{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]},"
        "s:{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b,s:o,s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added,
        "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend", "\xe2\x96\x81",
        "type", "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81",
        "pre_tokenizer",
        "post_processor", "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
        "type_id", 0, "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", "<s>",
        "type_id", 0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "<s>", "type_id", 1,
        "Sequence", "id", "B", "type_id", 1, "special_tokens", "<s>", "id", "<s>", "ids", 1, "tokens",
        "<s>",
        "decoder", "type", "Sequence", "decoders", "type", "Replace", "pattern", "String",
        "\xe2\x96\x81", "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip",
        "content", " ", "start", 1, "stop", 0,
        "model", "type", "BPE", "dropout", "unk_token", "<unk>", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1, "ignore_merges", 0, "vocab",
        vocab_obj, "merges", merges);
    vocab_obj = merges = NULL;
    if (!t) {
        rc = exo_err_set(err, EXO_EINTERNAL, "building tokenizer.json failed");
        goto out;
    }
    rc = write_json(out_dir, "tokenizer.json", t, err);
    json_decref(t);
    if (rc)
        goto out;
    json_t *tc = json_pack("{s:b,s:b,s:s,s:s,s:s,s:n,s:s,s:i,s:b,s:b}", "add_bos_token", 1,
                           "add_eos_token", 0, "bos_token", "<s>", "eos_token", "</s>", "unk_token",
                           "<unk>", "pad_token", "tokenizer_class", "LlamaTokenizer",
                           "model_max_length", 512, "clean_up_tokenization_spaces", 0, "legacy", 1);
    rc = write_json(out_dir, "tokenizer_config.json", tc, err);
    json_decref(tc);
    goto out;
short_file:
    rc = exo_err_set(err, EXO_EFORMAT, "%s: truncated or malformed llama2.c tokenizer", src);
out:
    json_decref(vocab_obj);
    json_decref(merges);
    for (int i = 0; i < vocab; i++)
        exo_free(tok[i]);
    exo_free(tok);
    return rc;
}

int exo_cmd_convert_llama2c(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: exo convert-llama2c CHECKPOINT.bin TOKENIZER.bin OUT_DIR\n");
        return 2;
    }
    const char *ckpt = argv[1], *tokf = argv[2], *out = argv[3];
    exo_err err = {0};
    unsigned char *w = NULL, *t = NULL;
    size_t wl, tl;
    l2c_config c;
    bool tied = true;
    int rc = read_file(ckpt, &w, &wl, &err);
    if (!rc)
        rc = read_file(tokf, &t, &tl, &err);
    if (!rc && mkdir(out, 0755) && errno != EEXIST)
        rc = exo_err_set(&err, EXO_EIO, "cannot create %s: %s", out, strerror(errno));
    if (!rc)
        rc = convert_weights(w, wl, ckpt, out, &c, &tied, &err);
    if (!rc)
        rc = convert_tokenizer(t, tl, tokf, out, c.vocab, &err);
    if (!rc) {
        json_t *cfg = make_config(&c, tied);
        rc = write_json(out, "config.json", cfg, &err);
        json_decref(cfg);
    }
    exo_free(w);
    exo_free(t);
    if (rc) {
        fprintf(stderr, "exo convert-llama2c: %s\n", err.msg);
        return 1;
    }
    return 0;
}
