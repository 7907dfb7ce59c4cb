/* The on-disk model store (see model_store.h).
 *
 * A scan walks every models dir in search order and builds one candidate
 * entry per valid <org>--<name> directory; nothing a model dir contains can
 * fail the scan, it can only make that directory "not a model". Candidates
 * are then sorted by (id, models-dir index) and the first of each id is
 * kept, which gives both the "first models dir wins" rule and the sorted
 * order that find() bisects. A model dir that is broken in an earlier
 * models dir does not hide a good copy in a later one: only readable models
 * take part.
 *
 * Directory names map back to ids by replacing the one "--" with "/"; ids
 * whose parts contain "--" themselves would be ambiguous, so (like the Hugging
 * Face hub) exo_model_dir_name refuses them and the scan skips such names.
 *
 * Reads are bounded: config.json and tokenizer_config.json are not loaded
 * past MAX_JSON_BYTES, chat_template.jinja past MAX_TEMPLATE_BYTES. */
#include "download/model_store.h"

#include "download/downloader.h"

#include "core/alloc.h"
#include "core/log.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_JSON_BYTES     ((off_t)64 << 20)
#define MAX_TEMPLATE_BYTES ((off_t)4 << 20)

struct exo_model_store {
    exo_model_entry *v;
    size_t           n;
};

/* ---- ids -------------------------------------------------------------------- */

static bool id_part_ok(const char *s, size_t n)
{
    if (n == 0 || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
        if (!ok)
            return false;
        if (i + 1 < n && ((c == '.' && s[i + 1] == '.') || (c == '-' && s[i + 1] == '-')))
            return false;
    }
    return true;
}

bool exo_model_dir_name(const char *model_id, char *out, size_t cap)
{
    if (!model_id)
        return false;
    size_t len = strnlen(model_id, sizeof ((exo_model_entry *)0)->id);
    if (len == sizeof ((exo_model_entry *)0)->id)
        return false;
    const char *slash = strchr(model_id, '/');
    if (!slash)
        return false;
    size_t org = (size_t)(slash - model_id), name = len - org - 1;
    if (!id_part_ok(model_id, org) || !id_part_ok(slash + 1, name))
        return false;
    if (len + 2 > cap) /* "/" becomes "--", plus the NUL */
        return false;
    memcpy(out, model_id, org);
    memcpy(out + org, "--", 2);
    memcpy(out + org + 2, slash + 1, name);
    out[len + 1] = 0;
    return true;
}

/* The id a directory name stands for, if it is the canonical name of a
 * valid id. */
static bool id_from_dir_name(const char *dname, char *id, size_t cap)
{
    const char *sep = strstr(dname, "--");
    if (!sep || strlen(dname) - 1 >= cap) /* the id is one byte shorter */
        return false;
    snprintf(id, cap, "%.*s/%s", (int)(sep - dname), dname, sep + 2);
    char back[sizeof ((exo_model_entry *)0)->id + 1];
    return exo_model_dir_name(id, back, sizeof back) && !strcmp(back, dname);
}

/* ---- per-model reads ------------------------------------------------------------ */

static json_t *obj_get(const json_t *obj, const char *key)
{
    json_t *v = obj && json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

/* First integer among keys, looked up in a then b. */
static int64_t get_int(const json_t *a, const json_t *b, const char *const *keys)
{
    const json_t *objs[2] = {a, b};
    for (int o = 0; o < 2; o++)
        for (const char *const *k = keys; *k; k++) {
            json_t *v = obj_get(objs[o], *k);
            if (v && json_is_integer(v) && json_integer_value(v) > 0)
                return json_integer_value(v);
        }
    return 0;
}

static const char *get_str(const json_t *a, const json_t *b, const char *key)
{
    json_t *v = obj_get(a, key);
    if (!v || !json_is_string(v))
        v = obj_get(b, key);
    return v && json_is_string(v) ? json_string_value(v) : NULL;
}

static int clamp_int(int64_t v) { return v > INT_MAX ? INT_MAX : (int)v; }

/* Loads a JSON file of bounded size; NULL (logged at debug) if absent,
 * too large or malformed. */
static json_t *load_json(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) < 0 || !S_ISREG(sb.st_mode))
        return NULL;
    if (sb.st_size > MAX_JSON_BYTES) {
        EXO_LOG_DEBUG("model store: %s: larger than %lld bytes, ignored", path, (long long)MAX_JSON_BYTES);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        EXO_LOG_DEBUG("model store: %s:%d: %s", path, je.line, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        EXO_LOG_DEBUG("model store: %s: not a JSON object", path);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* "4bit" from a quantization block's bits; else a short quant_method
 * ("fp8", "mxfp4"); else "" (then the dtype decides). */
static void quant_from_block(const json_t *q, char *out, size_t cap)
{
    json_t *bits = obj_get(q, "bits");
    if (bits && json_is_integer(bits) && json_integer_value(bits) > 0 && json_integer_value(bits) <= 64) {
        snprintf(out, cap, "%dbit", (int)json_integer_value(bits));
        return;
    }
    json_t *m = obj_get(q, "quant_method");
    if (m && json_is_string(m) && json_string_length(m) < cap) {
        const char *s = json_string_value(m);
        for (const char *p = s; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
                return;
        snprintf(out, cap, "%s", s);
    }
}

void exo_model_entry_from_config(const json_t *top, exo_model_entry *m)
{
    const json_t *text = obj_get(top, "text_config");
    if (text && !json_is_object(text))
        text = NULL;

    /* The top-level model_type names the architecture a wrapper config
     * (vision-language models) stands for; text_config's is the fallback. */
    const char *mt = get_str(top, text, "model_type");
    if (mt && strlen(mt) < sizeof m->model_type && id_part_ok(mt, strlen(mt)))
        snprintf(m->model_type, sizeof m->model_type, "%s", mt);

    static const char *const layers[] = {"num_hidden_layers", "num_layers", "n_layer", "n_layers",
                                         "num_decoder_layers", "decoder_layers", NULL};
    static const char *const hidden[] = {"hidden_size", "d_model", "n_embd", NULL};
    static const char *const kv[] = {"num_key_value_heads", NULL};
    static const char *const heads[] = {"num_attention_heads", "n_head", "num_heads", NULL};
    static const char *const ctx[] = {"max_position_embeddings", "n_positions", "max_sequence_length", NULL};
    static const char *const vocab[] = {"vocab_size", "n_vocab", NULL};
    m->n_layers = clamp_int(get_int(text, top, layers));
    m->hidden_size = clamp_int(get_int(text, top, hidden));
    m->n_kv_heads = clamp_int(get_int(text, top, kv));
    if (!m->n_kv_heads)
        m->n_kv_heads = clamp_int(get_int(text, top, heads));
    m->context_length = get_int(text, top, ctx);
    m->vocab_size = clamp_int(get_int(text, top, vocab));

    const char *qkeys[] = {"quantization", "quantization_config"};
    for (int i = 0; i < 2 && !m->quantization[0]; i++) {
        const json_t *q = obj_get(top, qkeys[i]);
        if (!q)
            q = obj_get(text, qkeys[i]);
        if (q && json_is_object(q))
            quant_from_block(q, m->quantization, sizeof m->quantization);
    }
    if (!m->quantization[0]) {
        const char *dt = get_str(top, text, "torch_dtype");
        if (!dt)
            dt = get_str(top, text, "dtype");
        static const char *const map[][2] = {{"bfloat16", "bf16"}, {"float16", "fp16"}, {"float32", "fp32"},
                                             {"bf16", "bf16"},     {"fp16", "fp16"},    {"fp32", "fp32"}};
        for (size_t i = 0; dt && i < sizeof map / sizeof *map; i++)
            if (!strcmp(dt, map[i][0]))
                snprintf(m->quantization, sizeof m->quantization, "%s", map[i][1]);
    }
}

/* Reads up to MAX_TEMPLATE_BYTES of a text file; NULL if it cannot. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size > MAX_TEMPLATE_BYTES) {
        fclose(f);
        return NULL;
    }
    char *buf = exo_malloc((size_t)sb.st_size + 1);
    size_t n = fread(buf, 1, (size_t)sb.st_size, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void scan_template(exo_model_entry *m, const char *text)
{
    m->has_chat_template = true;
    if (strstr(text, "tools"))
        m->supports_tools = true;
    if (strstr(text, "enable_thinking") || strstr(text, "<think>"))
        m->supports_thinking = true;
}

/* chat_template.jinja wins over tokenizer_config.json's "chat_template"
 * (a string, or a list of {name, template} of which every one counts). */
static void read_chat_template(exo_model_entry *m, const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *text = read_text(path);
    if (text) {
        scan_template(m, text);
        exo_free(text);
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tc = load_json(path);
    json_t *ct = obj_get(tc, "chat_template");
    if (ct && json_is_string(ct)) {
        scan_template(m, json_string_value(ct));
    } else if (ct && json_is_array(ct)) {
        size_t i;
        json_t *item;
        json_array_foreach(ct, i, item) {
            json_t *t = obj_get(item, "template");
            if (t && json_is_string(t))
                scan_template(m, json_string_value(t));
        }
    }
    json_decref(tc);
}

static bool is_regular(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int64_t safetensors_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int64_t total = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        static const char ext[] = ".safetensors";
        if (n <= sizeof ext - 1 || strcmp(de->d_name + n - (sizeof ext - 1), ext) != 0)
            continue;
        char path[PATH_MAX];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            total += (int64_t)sb.st_size;
    }
    closedir(d);
    return total;
}

/* Fills m from <dir>; false if dir is not a model. */
static bool read_model(exo_model_entry *m, const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return false;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return false;
    json_t *cfg = load_json(path);
    if (!cfg) {
        EXO_LOG_DEBUG("model store: %s: no readable config.json, not a model", dir);
        return false;
    }
    exo_model_entry_from_config(cfg, m);
    json_decref(cfg);
    /* a download in progress, or one that fetched only a shard's files */
    if (snprintf(path, sizeof path, "%s/%s", dir, EXO_DOWNLOAD_META) < (int)sizeof path && !access(path, F_OK)) {
        json_t *meta = load_json(path);
        bool complete = json_is_true(obj_get(meta, "complete"));
        json_decref(meta);
        if (!complete) {
            EXO_LOG_DEBUG("model store: %s: download incomplete, not listed", dir);
            return false;
        }
    }
    m->created = (int64_t)sb.st_mtime;
    m->storage_bytes = safetensors_bytes(dir);
    m->has_tokenizer = is_regular(dir, "tokenizer.json");
    read_chat_template(m, dir);
    return true;
}

/* ---- the store -------------------------------------------------------------- */

typedef struct candidate {
    exo_model_entry e;
    int             dir_index;
} candidate;

static int cmp_candidate(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    int c = strcmp(x->e.id, y->e.id);
    return c ? c : (x->dir_index > y->dir_index) - (x->dir_index < y->dir_index);
}

/* Absolute form of a models dir (relative ones against the working dir). */
static char *models_dir_abs(const char *p)
{
    if (p[0] == '/')
        return exo_strdup(p);
    char real[PATH_MAX];
    if (realpath(p, real))
        return exo_strdup(real);
    return NULL;
}

static void scan_dir(const exo_models_dir *md, int index, candidate **cand, size_t *n, size_t *cap)
{
    char *base = models_dir_abs(md->path);
    DIR *d = base ? opendir(base) : NULL;
    if (!d) {
        EXO_LOG_DEBUG("model store: models dir %s: %s", md->path, strerror(errno));
        exo_free(base);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char id[sizeof (*cand)->e.id];
        if (!id_from_dir_name(de->d_name, id, sizeof id)) {
            EXO_LOG_DEBUG("model store: %s/%s: not an <org>--<name> directory, skipped", base, de->d_name);
            continue;
        }
        char *dir = exo_malloc(strlen(base) + strlen(de->d_name) + 2);
        sprintf(dir, "%s/%s", base, de->d_name);
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 16;
            *cand = exo_realloc(*cand, *cap * sizeof **cand);
        }
        candidate *c = &(*cand)[*n];
        memset(c, 0, sizeof *c);
        if (!read_model(&c->e, dir)) {
            exo_free(dir);
            continue;
        }
        memcpy(c->e.id, id, sizeof id);
        c->e.dir = dir;
        c->e.read_only = md->read_only;
        c->dir_index = index;
        (*n)++;
    }
    closedir(d);
    exo_free(base);
}

exo_model_store *exo_model_store_scan(const exo_models_dir *dirs, int n_dirs)
{
    candidate *cand = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < n_dirs; i++)
        if (dirs[i].path)
            scan_dir(&dirs[i], i, &cand, &n, &cap);
    if (n > 1)
        qsort(cand, n, sizeof *cand, cmp_candidate);

    exo_model_store *s = exo_calloc(1, sizeof *s);
    s->v = exo_calloc(n ? n : 1, sizeof *s->v);
    for (size_t i = 0; i < n; i++) {
        if (s->n > 0 && !strcmp(s->v[s->n - 1].id, cand[i].e.id)) {
            EXO_LOG_DEBUG("model store: %s in %s is shadowed by %s", cand[i].e.id, cand[i].e.dir,
                          s->v[s->n - 1].dir);
            exo_free(cand[i].e.dir);
            continue;
        }
        s->v[s->n++] = cand[i].e;
    }
    exo_free(cand);
    return s;
}

void exo_model_store_free(exo_model_store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        exo_free(s->v[i].dir);
    exo_free(s->v);
    exo_free(s);
}

size_t exo_model_store_count(const exo_model_store *s) { return s ? s->n : 0; }

const exo_model_entry *exo_model_store_at(const exo_model_store *s, size_t i)
{
    return s && i < s->n ? &s->v[i] : NULL;
}

const exo_model_entry *exo_model_store_find(const exo_model_store *s, const char *model_id)
{
    if (!s || !model_id)
        return NULL;
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->v[mid].id, model_id);
        if (c == 0)
            return &s->v[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- /v1/models -------------------------------------------------------------- */

/* exo's tensor-parallel allowlist is by architecture class; these are the
 * model_types of those classes (Kimi K2's config says kimi_k2 for the
 * class DeepseekV3ForCausalLM). */
bool exo_model_type_supports_tensor(const char *model_type)
{
    static const char *const allow[] = {
        "llama",       "qwen3_moe",    "qwen3_next",   "qwen3_5",    "qwen3_5_moe",   "qwen3_vl",
        "deepseek_v3", "kimi_k2",      "deepseek_v32", "deepseek_v4",  "glm4_moe_lite", "glm_moe_dsa",
        "minimax_m2",
        "gpt_oss",     "step3p5",      "nemotron_h",   "gemma4",
    };
    for (size_t i = 0; i < sizeof allow / sizeof *allow; i++)
        if (!strcmp(model_type, allow[i]))
            return true;
    return false;
}

json_t *exo_model_entry_to_json(const exo_model_entry *m)
{
    const char *slash = strchr(m->id, '/');
    const char *name = slash ? slash + 1 : m->id;
    /* family: model_type up to its first '_' ("qwen3_moe" -> "qwen3"). */
    char family[sizeof m->model_type];
    snprintf(family, sizeof family, "%.*s", (int)strcspn(m->model_type, "_"), m->model_type);

    json_t *caps = json_array();
    json_array_append_new(caps, json_string("text"));
    if (m->supports_thinking)
        json_array_append_new(caps, json_string("thinking"));
    if (m->supports_tools)
        json_array_append_new(caps, json_string("tools"));
    json_t *tasks = json_array();
    json_array_append_new(tasks, json_string("TextGeneration"));

    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "object", json_string("model"));
    json_object_set_new(o, "created", json_integer(m->created));
    json_object_set_new(o, "owned_by", json_string("exo"));
    json_object_set_new(o, "hugging_face_id", json_string(m->id));
    json_object_set_new(o, "name", json_string(name));
    json_object_set_new(o, "description", json_string(""));
    json_object_set_new(o, "context_length", json_integer(m->context_length));
    json_object_set_new(o, "tags", json_array());
    /* exo's Memory.in_mb: MiB rounded to nearest */
    json_object_set_new(o, "storage_size_megabytes", json_integer((m->storage_bytes + (1 << 19)) >> 20));
    json_object_set_new(o, "supports_tensor", json_boolean(exo_model_type_supports_tensor(m->model_type)));
    json_object_set_new(o, "tasks", tasks);
    json_object_set_new(o, "is_custom", json_false());
    json_object_set_new(o, "family", json_string(family));
    json_object_set_new(o, "quantization", json_string(m->quantization));
    json_object_set_new(o, "base_model", json_string(name));
    json_object_set_new(o, "capabilities", caps);
    json_object_set_new(o, "reasoning_dialect", json_null());
    return o;
}
