/* Model store: model dirs built in a mkdtemp tree. config.json variants
 * (plain, text_config nesting, MLX quantization, quantization_config,
 * torch_dtype / dtype, layer-count aliases), what is not a model (no or bad
 * config.json, not org--name, hidden, plain files), first models dir wins,
 * read-only dirs, sorted order and find, safetensors sizes, chat template
 * detection from chat_template.jinja and tokenizer_config.json (string and
 * list forms) with tools / thinking, exo_model_dir_name's accept and reject
 * cases, and the /v1/models JSON shape. */
#include "core/json_util.h"
#include "core/alloc.h"
#include "core/log.h"
#include "download/model_store.h"

#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void setup(void)
{
    test_tmpdir_make(tmpdir, "mstore");
    exo_log_set_level(EXO_LOG_ERROR);
}

static void teardown(void) { test_tmpdir_remove(tmpdir); }

TestSuite(model_store, .init = setup, .fini = teardown);

/* ---- helpers ---- */

static const char *tp(const char *rel)
{
    static char bufs[8][PATH_MAX];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", tmpdir, rel);
    return b;
}

static void mkdirs(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", tp(rel));
    for (char *s = p + strlen(tmpdir) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

static void write_file(const char *rel, const char *text)
{
    FILE *f = fopen(tp(rel), "w");
    cr_assert_not_null(f, "%s", rel);
    fputs(text, f);
    fclose(f);
}

/* A sparse file of exactly n bytes. */
static void sized_file(const char *rel, off_t n)
{
    int fd = open(tp(rel), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0, "%s", rel);
    cr_assert_eq(ftruncate(fd, n), 0);
    close(fd);
}

/* models/<dir>/config.json = config (NULL: the dir without a config). */
static void model(const char *models, const char *dir, const char *config)
{
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "%s/%s", models, dir);
    mkdirs(rel);
    if (config) {
        snprintf(rel, sizeof rel, "%s/%s/config.json", models, dir);
        write_file(rel, config);
    }
}

static exo_model_store *scan1(const char *models)
{
    exo_models_dir d = {.path = (char *)tp(models), .read_only = false};
    return exo_model_store_scan(&d, 1);
}

static const exo_model_entry *must_find(const exo_model_store *s, const char *id)
{
    const exo_model_entry *m = exo_model_store_find(s, id);
    cr_assert_not_null(m, "%s not in the store", id);
    cr_assert_str_eq(m->id, id);
    return m;
}

/* ---- exo_model_dir_name ---- */

Test(model_store, dir_name_accepts)
{
    static const char *const ok[][2] = {
        {"org/name", "org--name"},
        {"Qwen/Qwen3-0.6B", "Qwen--Qwen3-0.6B"},
        {"mlx-community/Llama-3.2-1B-Instruct-4bit", "mlx-community--Llama-3.2-1B-Instruct-4bit"},
        {"a_b/c.d_e-f", "a_b--c.d_e-f"},
        {"a/b", "a--b"},
        {"o/name.", "o--name."},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char out[300];
        memset(out, 'x', sizeof out);
        cr_assert(exo_model_dir_name(ok[i][0], out, sizeof out), "%s rejected", ok[i][0]);
        cr_assert_str_eq(out, ok[i][1]);
    }
    /* exactly enough room: strlen + 1 ("/" -> "--") + NUL */
    char out[16];
    cr_assert(exo_model_dir_name("org/name", out, 10));
    cr_assert_str_eq(out, "org--name");
    cr_assert_not(exo_model_dir_name("org/name", out, 9));
    /* the longest id that fits exo_model_entry.id */
    char id[256], big[300];
    memset(id, 'a', 255);
    id[0] = 'o', id[1] = '/';
    id[255] = 0;
    cr_assert(exo_model_dir_name(id, big, sizeof big));
    cr_assert_eq(strlen(big), 256);
}

Test(model_store, dir_name_rejects)
{
    static const char *const bad[] = {
        "",         "noslash",   "/name",     "org/",      "../x",      "x/..",     "a/../b",   "a/b/c",
        ".hidden/x", "org/.x",   "a..b/c",    "org/x..y",  "org/na me", "org/n\\x", "org//x",   "a--b/c",
        "a/b--c",   "org/n\tx",  "org/ü",     "./x",       "org/.",     "org/-/x",  "a/b\n",    "~/x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char out[300] = "untouched";
        cr_assert_not(exo_model_dir_name(bad[i], out, sizeof out), "\"%s\" accepted as %s", bad[i], out);
    }
    char out[300];
    cr_assert_not(exo_model_dir_name(NULL, out, sizeof out));
    char id[300];
    memset(id, 'a', 256);
    id[1] = '/';
    id[256] = 0;
    cr_assert_not(exo_model_dir_name(id, out, sizeof out), "256-byte id does not fit exo_model_entry.id");
}

/* ---- scanning ---- */

#define LLAMA_CFG                                                                                       \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"num_hidden_layers\":16,"    \
    "\"hidden_size\":2048,\"num_attention_heads\":32,\"num_key_value_heads\":8,"                      \
    "\"max_position_embeddings\":131072,\"torch_dtype\":\"bfloat16\"}"

Test(model_store, plain_model)
{
    model("m", "meta-llama--Llama-3.2-1B", LLAMA_CFG);
    sized_file("m/meta-llama--Llama-3.2-1B/model-00001-of-00002.safetensors", 1000);
    sized_file("m/meta-llama--Llama-3.2-1B/model-00002-of-00002.safetensors", 2345);
    write_file("m/meta-llama--Llama-3.2-1B/model.safetensors.index.json", "{\"metadata\":{}}");
    sized_file("m/meta-llama--Llama-3.2-1B/notes.safetensors.txt", 99999);
    mkdirs("m/meta-llama--Llama-3.2-1B/dir.safetensors");
    write_file("m/meta-llama--Llama-3.2-1B/tokenizer.json", "{}");

    exo_model_store *s = scan1("m");
    cr_assert_eq(exo_model_store_count(s), 1);
    const exo_model_entry *m = exo_model_store_at(s, 0);
    cr_assert_str_eq(m->id, "meta-llama/Llama-3.2-1B");
    cr_assert_str_eq(m->dir, tp("m/meta-llama--Llama-3.2-1B"));
    cr_assert_not(m->read_only);
    cr_assert_str_eq(m->model_type, "llama");
    cr_assert_str_eq(m->quantization, "bf16");
    cr_assert_eq(m->n_layers, 16);
    cr_assert_eq(m->hidden_size, 2048);
    cr_assert_eq(m->n_kv_heads, 8);
    cr_assert_eq(m->context_length, 131072);
    cr_assert_eq(m->storage_bytes, 3345, "only *.safetensors files count");
    cr_assert(m->has_tokenizer);
    cr_assert_not(m->has_chat_template);
    cr_assert_not(m->supports_tools);
    cr_assert_not(m->supports_thinking);
    struct stat sb;
    cr_assert_eq(stat(m->dir, &sb), 0);
    cr_assert_eq(m->created, (int64_t)sb.st_mtime);
    cr_assert_gt(m->created, 1600000000);
    cr_assert_eq(exo_model_store_find(s, "meta-llama/Llama-3.2-1B"), m);
    exo_model_store_free(s);
}

Test(model_store, text_config_nesting)
{
    /* text_config wins for dimensions; the top-level model_type names the
     * wrapper architecture; kv heads default to attention heads */
    model("m", "Qwen--Qwen3-VL-2B",
          "{\"model_type\":\"qwen3_vl\",\"num_hidden_layers\":99,\"vision_config\":{\"depth\":24},"
          "\"text_config\":{\"model_type\":\"qwen3_vl_text\",\"num_hidden_layers\":28,\"hidden_size\":1024,"
          "\"num_attention_heads\":16,\"num_key_value_heads\":null,\"max_position_embeddings\":40960,"
          "\"torch_dtype\":\"float16\"}}");
    /* only text_config has model_type; layer count under an alias */
    model("m", "o--only-text", "{\"text_config\":{\"model_type\":\"gemma3_text\",\"num_layers\":6,\"d_model\":64}}");
    /* text_config that is not an object is ignored */
    model("m", "o--odd", "{\"model_type\":\"llama\",\"n_layer\":3,\"n_embd\":48,\"n_head\":4,"
                         "\"n_positions\":1024,\"text_config\":[1,2]}");

    exo_model_store *s = scan1("m");
    cr_assert_eq(exo_model_store_count(s), 3);
    const exo_model_entry *m = must_find(s, "Qwen/Qwen3-VL-2B");
    cr_assert_str_eq(m->model_type, "qwen3_vl");
    cr_assert_eq(m->n_layers, 28);
    cr_assert_eq(m->hidden_size, 1024);
    cr_assert_eq(m->n_kv_heads, 16);
    cr_assert_eq(m->context_length, 40960);
    cr_assert_str_eq(m->quantization, "fp16");

    m = must_find(s, "o/only-text");
    cr_assert_str_eq(m->model_type, "gemma3_text");
    cr_assert_eq(m->n_layers, 6);
    cr_assert_eq(m->hidden_size, 64);
    cr_assert_eq(m->n_kv_heads, 0);
    cr_assert_eq(m->context_length, 0);
    cr_assert_str_eq(m->quantization, "");

    m = must_find(s, "o/odd");
    cr_assert_eq(m->n_layers, 3);
    cr_assert_eq(m->hidden_size, 48);
    cr_assert_eq(m->n_kv_heads, 4);
    cr_assert_eq(m->context_length, 1024);
    exo_model_store_free(s);
}

Test(model_store, quantization)
{
    static const char *const cases[][2] = {
        {"{\"quantization\":{\"group_size\":64,\"bits\":4},\"torch_dtype\":\"bfloat16\"}", "4bit"},
        {"{\"quantization_config\":{\"group_size\":64,\"bits\":8},\"torch_dtype\":\"bfloat16\"}", "8bit"},
        {"{\"quantization\":{\"bits\":6},\"quantization_config\":{\"bits\":8}}", "6bit"},
        {"{\"text_config\":{\"quantization\":{\"bits\":3}}}", "3bit"},
        {"{\"quantization_config\":{\"quant_method\":\"fp8\"},\"torch_dtype\":\"bfloat16\"}", "fp8"},
        {"{\"quantization_config\":{\"quant_method\":\"a-very-long-method-name\"},\"torch_dtype\":\"float16\"}",
         "fp16"},
        {"{\"quantization\":{\"bits\":\"4\"},\"torch_dtype\":\"float32\"}", "fp32"},
        {"{\"dtype\":\"bfloat16\"}", "bf16"},
        {"{\"torch_dtype\":\"float16\",\"dtype\":\"bfloat16\"}", "fp16"},
        {"{\"text_config\":{\"torch_dtype\":\"bfloat16\"}}", "bf16"},
        {"{\"torch_dtype\":\"int8\"}", ""},
        {"{\"torch_dtype\":7}", ""},
        {"{}", ""},
    };
    size_t n = sizeof cases / sizeof *cases;
    for (size_t i = 0; i < n; i++) {
        char dir[32];
        snprintf(dir, sizeof dir, "q--case%02zu", i);
        model("m", dir, cases[i][0]);
    }
    exo_model_store *s = scan1("m");
    cr_assert_eq(exo_model_store_count(s), n);
    for (size_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "q/case%02zu", i);
        const exo_model_entry *m = must_find(s, id);
        cr_assert_str_eq(m->quantization, cases[i][1], "case %zu: %s", i, cases[i][0]);
    }
    exo_model_store_free(s);
}

Test(model_store, what_is_not_a_model)
{
    model("m", "good--one", LLAMA_CFG);
    model("m", "no--config", NULL);
    sized_file("m/no--config/model.safetensors", 10);
    model("m", "bad--json", "{\"model_type\": \"llama\",");
    model("m", "array--config", "[1, 2, 3]");
    model("m", "empty--config", "");
    model("m", "plain", LLAMA_CFG);              /* not org--name */
    model("m", ".hidden--x", LLAMA_CFG);         /* hidden */
    model("m", "a b--c", LLAMA_CFG);             /* unsafe characters */
    model("m", "a--b--c", LLAMA_CFG);            /* ambiguous */
    model("m", "--name", LLAMA_CFG);             /* empty org */
    model("m", "org--", LLAMA_CFG);              /* empty name */
    write_file("m/file--model", LLAMA_CFG);      /* a file, not a dir */
    mkdirs("m/cfgdir--x/config.json");           /* config.json is a directory */

    exo_model_store *s = scan1("m");
    cr_assert_eq(exo_model_store_count(s), 1, "got %zu", exo_model_store_count(s));
    cr_assert_str_eq(exo_model_store_at(s, 0)->id, "good/one");
    cr_assert_null(exo_model_store_at(s, 1));
    cr_assert_null(exo_model_store_find(s, "no/config"));
    cr_assert_null(exo_model_store_find(s, "bad/json"));
    exo_model_store_free(s);
}

Test(model_store, first_models_dir_wins)
{
    model("a", "org--shared", "{\"num_hidden_layers\":1}");
    model("b", "org--shared", "{\"num_hidden_layers\":2}");
    model("a", "org--broken-in-a", "{not json");
    model("b", "org--broken-in-a", "{\"num_hidden_layers\":3}");
    model("b", "org--only-b", "{\"num_hidden_layers\":4}");
    model("c", "org--shared", "{\"num_hidden_layers\":5}");
    model("c", "org--only-c", "{\"num_hidden_layers\":6}");

    exo_models_dir dirs[] = {
        {.path = (char *)tp("a"), .read_only = false},
        {.path = (char *)tp("missing"), .read_only = false},
        {.path = (char *)tp("b"), .read_only = true},
        {.path = (char *)tp("c"), .read_only = false},
    };
    exo_model_store *s = exo_model_store_scan(dirs, 4);
    cr_assert_eq(exo_model_store_count(s), 4);
    const exo_model_entry *m = must_find(s, "org/shared");
    cr_assert_eq(m->n_layers, 1);
    cr_assert_str_eq(m->dir, tp("a/org--shared"));
    cr_assert_not(m->read_only);
    m = must_find(s, "org/broken-in-a");
    cr_assert_eq(m->n_layers, 3, "a broken copy does not hide a good one");
    cr_assert(m->read_only);
    m = must_find(s, "org/only-b");
    cr_assert_eq(m->n_layers, 4);
    cr_assert(m->read_only);
    m = must_find(s, "org/only-c");
    cr_assert_not(m->read_only);
    exo_model_store_free(s);

    /* the other order flips the winner */
    exo_models_dir rev[] = {dirs[3], dirs[0]};
    s = exo_model_store_scan(rev, 2);
    cr_assert_eq(must_find(s, "org/shared")->n_layers, 5);
    exo_model_store_free(s);
}

Test(model_store, sorted_and_find)
{
    const char *names[] = {"zeta--m", "alpha--m2", "Beta--m", "alpha--m1", "alpha--m10", "mid--x"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        model("m", names[i], "{}");
    exo_model_store *s = scan1("m");
    const char *want[] = {"Beta/m", "alpha/m1", "alpha/m10", "alpha/m2", "mid/x", "zeta/m"};
    cr_assert_eq(exo_model_store_count(s), 6);
    for (size_t i = 0; i < 6; i++) {
        cr_assert_str_eq(exo_model_store_at(s, i)->id, want[i]);
        cr_assert_eq(exo_model_store_find(s, want[i]), exo_model_store_at(s, i));
    }
    cr_assert_null(exo_model_store_find(s, "alpha/m"));
    cr_assert_null(exo_model_store_find(s, "beta/m"));
    cr_assert_null(exo_model_store_find(s, "zzz/z"));
    cr_assert_null(exo_model_store_find(s, ""));
    cr_assert_null(exo_model_store_find(s, NULL));
    exo_model_store_free(s);
}

Test(model_store, empty_and_missing)
{
    exo_model_store *s = exo_model_store_scan(NULL, 0);
    cr_assert_not_null(s);
    cr_assert_eq(exo_model_store_count(s), 0);
    cr_assert_null(exo_model_store_at(s, 0));
    cr_assert_null(exo_model_store_find(s, "a/b"));
    exo_model_store_free(s);
    s = scan1("does-not-exist");
    cr_assert_eq(exo_model_store_count(s), 0);
    exo_model_store_free(s);
    exo_model_store_free(NULL);

    /* a relative models dir gives absolute model dirs */
    model("rel", "org--m", "{}");
    cr_assert_eq(chdir(tmpdir), 0);
    exo_models_dir d = {.path = "rel", .read_only = false};
    s = exo_model_store_scan(&d, 1);
    cr_assert_eq(exo_model_store_count(s), 1);
    char real[PATH_MAX];
    cr_assert_not_null(realpath(tp("rel/org--m"), real));
    cr_assert_str_eq(exo_model_store_at(s, 0)->dir, real);
    exo_model_store_free(s);
}

Test(model_store, chat_templates)
{
    /* chat_template.jinja with tools and <think> */
    model("m", "t--jinja", "{}");
    write_file("m/t--jinja/chat_template.jinja",
               "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<think>{% endfor %}");
    /* tokenizer_config.json string: thinking via enable_thinking, no tools */
    model("m", "t--tokcfg", "{}");
    write_file("m/t--tokcfg/tokenizer_config.json",
               "{\"bos_token\":\"<s>\",\"chat_template\":\"{% if enable_thinking %}x{% endif %}\"}");
    /* list form: any template counts */
    model("m", "t--list", "{}");
    write_file("m/t--list/tokenizer_config.json",
               "{\"chat_template\":[{\"name\":\"default\",\"template\":\"{{ messages }}\"},"
               "{\"name\":\"tool_use\",\"template\":\"{{ tools }}\"}]}");
    /* the .jinja file wins over tokenizer_config.json */
    model("m", "t--both", "{}");
    write_file("m/t--both/chat_template.jinja", "{{ messages }}");
    write_file("m/t--both/tokenizer_config.json", "{\"chat_template\":\"{{ tools }} <think>\"}");
    /* no template: tokenizer_config without one, a non-string one, bad JSON */
    model("m", "t--none", "{}");
    write_file("m/t--none/tokenizer_config.json", "{\"bos_token\":\"<s>\"}");
    model("m", "t--nonstring", "{}");
    write_file("m/t--nonstring/tokenizer_config.json", "{\"chat_template\":42}");
    model("m", "t--badjson", "{}");
    write_file("m/t--badjson/tokenizer_config.json", "{\"chat_template\":\"{{ tools }}\"");

    exo_model_store *s = scan1("m");
    cr_assert_eq(exo_model_store_count(s), 7);
    struct {
        const char *id;
        bool tmpl, tools, think;
    } want[] = {
        {"t/jinja", true, true, true},   {"t/tokcfg", true, false, true}, {"t/list", true, true, false},
        {"t/both", true, false, false},  {"t/none", false, false, false}, {"t/nonstring", false, false, false},
        {"t/badjson", false, false, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const exo_model_entry *m = must_find(s, want[i].id);
        cr_assert_eq(m->has_chat_template, want[i].tmpl, "%s", want[i].id);
        cr_assert_eq(m->supports_tools, want[i].tools, "%s", want[i].id);
        cr_assert_eq(m->supports_thinking, want[i].think, "%s", want[i].id);
        cr_assert_not(m->has_tokenizer);
    }
    exo_model_store_free(s);
}

/* ---- JSON ---- */

Test(model_store, to_json_shape)
{
    model("m", "Qwen--Qwen3-30B-A3B-4bit",
          "{\"model_type\":\"qwen3_moe\",\"num_hidden_layers\":48,\"hidden_size\":2048,"
          "\"num_key_value_heads\":4,\"max_position_embeddings\":40960,"
          "\"quantization\":{\"group_size\":64,\"bits\":4}}");
    /* 3 MiB + 600 KiB rounds to 4 MiB */
    sized_file("m/Qwen--Qwen3-30B-A3B-4bit/model.safetensors", (3 << 20) + 600 * 1024);
    write_file("m/Qwen--Qwen3-30B-A3B-4bit/chat_template.jinja", "{{ tools }}{% if enable_thinking %}{% endif %}");
    model("m", "o--plain", "{\"model_type\":\"qwen3\"}");
    sized_file("m/o--plain/model.safetensors", (1 << 20) + 400 * 1024);

    exo_model_store *s = scan1("m");
    const exo_model_entry *m = must_find(s, "Qwen/Qwen3-30B-A3B-4bit");
    json_t *j = exo_model_entry_to_json(m);
    cr_assert_not_null(j);
    char *text = exo_json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    char want[1024];
    snprintf(want, sizeof want,
             "{\"base_model\":\"Qwen3-30B-A3B-4bit\",\"capabilities\":[\"text\",\"thinking\",\"tools\"],"
             "\"context_length\":40960,\"created\":%lld,\"description\":\"\",\"family\":\"qwen3\","
             "\"hugging_face_id\":\"Qwen/Qwen3-30B-A3B-4bit\",\"id\":\"Qwen/Qwen3-30B-A3B-4bit\","
             "\"is_custom\":false,\"name\":\"Qwen3-30B-A3B-4bit\",\"object\":\"model\",\"owned_by\":\"exo\","
             "\"quantization\":\"4bit\",\"reasoning_dialect\":null,\"storage_size_megabytes\":4,"
             "\"supports_tensor\":true,\"tags\":[],\"tasks\":[\"TextGeneration\"]}",
             (long long)m->created);
    cr_assert_str_eq(text, want);
    free(text);
    json_decref(j);

    j = exo_model_entry_to_json(must_find(s, "o/plain"));
    cr_assert_eq(json_object_size(j), 18);
    cr_assert_eq(json_integer_value(json_object_get(j, "storage_size_megabytes")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "family")), "qwen3");
    cr_assert(json_is_false(json_object_get(j, "supports_tensor")), "dense qwen3 is not on exo's TP list");
    json_t *caps = json_object_get(j, "capabilities");
    cr_assert_eq(json_array_size(caps), 1);
    cr_assert_str_eq(json_string_value(json_array_get(caps, 0)), "text");
    cr_assert(json_is_integer(json_object_get(j, "context_length")));
    json_decref(j);
    exo_model_store_free(s);
}
