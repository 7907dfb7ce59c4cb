/* The node's HTTP API (see server.h). Handlers run on libmicrohttpd
 * threads; they read the State through exo_node_read_state and submit work
 * through the node's thread-safe calls, so nothing here keeps state of its
 * own beyond the per-generation glue (struct api_gen). */
#include "api/server.h"

#include "api/events_reader.h"
#include "api/gen_response.h"
#include "cluster/node_info.h"
#include "cluster/events.h"
#include "core/json_util.h"
#include "core/alloc.h"
#include "download/catalogue.h"
#include "download/downloader.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct exo_api_server {
    exo_node        *node;
    exo_http_server *http;
    exo_events_reader *events;     /* builds GET /events pages off the HTTP threads */
    char            *dashboard_dir; /* NULL: no dashboard */
};

/* ---- small helpers ------------------------------------------------------------ */

static void respond_json(exo_http_request *r, int status, json_t *j)
{
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    exo_http_respond(r, status, "application/json", s ? s : "null", s ? strlen(s) : 4);
    exo_free(s);
    json_decref(j);
}

static void respond_error(exo_http_request *r, int status, const char *message)
{
    exo_http_respond_error(r, status, message);
}

static json_t *command_received(const exo_id *command_id)
{
    return json_pack("{s:s, s:s}", "message", "Command received.", "command_id", command_id->s);
}

/* A JSON object body, or NULL after answering 400. */
static json_t *json_body(exo_http_request *r)
{
    size_t len;
    const char *body = exo_http_body(r, &len);
    json_t *j = NULL;
    exo_err err = {0};
    int rc = exo_ju_parse_body(body, len, &j, &err);
    if (rc)
        respond_error(r, exo_api_status_for_parse(rc), err.msg);
    return j;
}

/* Optional enum member: default when absent, -1 (after answering 400) when bad. */
static int enum_member(exo_http_request *r, const char *value, const char *name, int dflt,
                       int (*parse)(const char *, size_t))
{
    if (!value)
        return dflt;
    int v = parse(value, strlen(value));
    if (v < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: unknown value '%.64s'", name, value);
        respond_error(r, 400, msg);
    }
    return v;
}

static int status_for(int code) { return code == EXO_ENOENT ? 404 : code == EXO_ECANCELED ? 503 : 400; }

/* ---- node and state ------------------------------------------------------------ */

static void h_node_id(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    respond_json(r, 200, json_string(exo_node_id(s->node)));
}

static void grab_state(void *ctx, const exo_state *st) { *(json_t **)ctx = exo_state_to_json(st); }

static json_t *state_json(exo_api_server *s)
{
    json_t *j = NULL;
    exo_node_read_state(s->node, grab_state, &j);
    return j;
}

static void h_state(exo_http_request *r, void *ud)
{
    json_t *j = state_json(ud);
    const char *path = exo_http_param(r, "path");
    if (!path || !*path) {
        respond_json(r, 200, j);
        return;
    }
    /* "/"-separated object keys and array indices, as exo's /state/{path} */
    json_t *at = j;
    char *copy = exo_strdup(path), *save = NULL;
    for (char *seg = strtok_r(copy, "/", &save); seg && at; seg = strtok_r(NULL, "/", &save)) {
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at)) {
            char *end;
            long i = strtol(seg, &end, 10);
            at = *end || i < 0 ? NULL : json_array_get(at, (size_t)i);
        } else {
            at = NULL;
        }
    }
    exo_free(copy);
    if (at)
        respond_json(r, 200, json_incref(at));
    else
        respond_error(r, 404, "unable to find path");
    json_decref(j);
}

/* A non-negative integer query parameter; -1 (after answering 400) when bad. */
static long long query_count(exo_http_request *r, const char *name, long long dflt)
{
    const char *v = exo_http_query(r, name);
    char *end = NULL;
    long long x = v ? strtoll(v, &end, 10) : dflt;
    if (v && (!*v || *end || x < 0)) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s must be a non-negative integer", name);
        respond_error(r, 400, msg);
        return -1;
    }
    return x;
}

/* GET /events: a JSON array, as before pagination, of at most `limit`
 * events (default and maximum EXO_EVENTS_PAGE_MAX) from `since` (default:
 * the oldest kept); the next page starts at since + its length.
 * GET /events/page: the same page in an object that says where it stands
 * ({first, since, next, count, more, events}). `since` before the oldest
 * kept event (compacted into a snapshot) is 410 Gone with
 * {"error": {..., "first": <where to start>}}. The page is built on the
 * events reader's thread (api/events_reader.h), not this one. */
static void events_page(exo_http_request *r, exo_api_server *s, bool wrapped)
{
    long long since = -1, limit;
    if (exo_http_query(r, "since") && (since = query_count(r, "since", 0)) < 0)
        return;
    if ((limit = query_count(r, "limit", 0)) < 0)
        return;
    exo_http_stream *st = exo_http_stream_open(r, NULL, NULL);
    if (!st) {
        respond_error(r, 500, "cannot open a response");
        return;
    }
    if (exo_events_reader_submit(s->events, st, since, limit, wrapped) < 0) {
        const char *msg = "{\"error\": {\"message\": \"too many GET /events requests at once; retry\", "
                          "\"type\": \"unavailable\"}}";
        exo_http_stream_respond(st, 503, "application/json", msg, strlen(msg));
        exo_http_stream_release(st);
    }
}

static void h_events(exo_http_request *r, void *ud) { events_page(r, ud, false); }
static void h_events_page(exo_http_request *r, void *ud) { events_page(r, ud, true); }

/* ---- instances ------------------------------------------------------------------ */

static json_t *model_card(exo_api_server *s, const char *model_id);

typedef struct placement_args {
    const char       *model_id;
    int               sharding, meta, min_nodes;
} placement_args;

/* Reads model_id / sharding / instance_meta / min_nodes from a JSON body or
 * the query; false after answering 400. */
static bool placement_from(exo_http_request *r, json_t *body, placement_args *a)
{
    const char *sharding, *meta;
    json_t *mn = NULL;
    if (body) {
        a->model_id = json_string_value(json_object_get(body, "model_id"));
        sharding = json_string_value(json_object_get(body, "sharding"));
        meta = json_string_value(json_object_get(body, "instance_meta"));
        mn = json_object_get(body, "min_nodes");
        if ((json_object_get(body, "sharding") && !sharding) ||
            (json_object_get(body, "instance_meta") && !meta) || (mn && !json_is_integer(mn))) {
            respond_error(r, 400, "sharding and instance_meta must be strings, min_nodes an integer");
            return false;
        }
        a->min_nodes = mn ? (int)json_integer_value(mn) : 1;
        if (mn && (json_integer_value(mn) < 1 || json_integer_value(mn) > EXO_MAX_SHARDS)) {
            respond_error(r, 400, "min_nodes must be between 1 and 256");
            return false;
        }
    } else {
        a->model_id = exo_http_query(r, "model_id");
        sharding = exo_http_query(r, "sharding");
        meta = exo_http_query(r, "instance_meta");
        const char *q = exo_http_query(r, "min_nodes");
        a->min_nodes = q ? atoi(q) : 1;
        if (a->min_nodes < 1 || a->min_nodes > EXO_MAX_SHARDS) {
            respond_error(r, 400, "min_nodes must be between 1 and 256");
            return false;
        }
    }
    if (!a->model_id || !exo_model_id_valid(a->model_id, strlen(a->model_id))) {
        respond_error(r, 400, "model_id is required");
        return false;
    }
    if ((a->sharding = enum_member(r, sharding, "sharding", EXO_SHARDING_PIPELINE, exo_sharding_parse)) < 0 ||
        (a->meta = enum_member(r, meta, "instance_meta", EXO_INSTANCE_META_MLX_RING,
                               exo_instance_meta_parse)) < 0)
        return false;
    return true;
}

static void h_place_instance(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    json_t *body = json_body(r);
    placement_args a;
    if (!body || !placement_from(r, body, &a)) {
        json_decref(body);
        return;
    }
    exo_id cmd;
    exo_err err = {0};
    int rc = exo_node_place_instance(s->node, a.model_id, (exo_sharding)a.sharding,
                                     (exo_instance_meta)a.meta, a.min_nodes, NULL, &cmd, &err);
    if (rc) {
        respond_error(r, status_for(rc), err.msg);
    } else {
        json_t *j = command_received(&cmd);
        json_object_set_new(j, "model_card", model_card(s, a.model_id));
        respond_json(r, 200, j);
    }
    json_decref(body);
}

static void h_placement(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    placement_args a;
    if (!placement_from(r, NULL, &a))
        return;
    exo_instance inst;
    exo_err err = {0};
    int rc = exo_node_preview_placement(s->node, a.model_id, (exo_sharding)a.sharding,
                                        (exo_instance_meta)a.meta, a.min_nodes, &inst, &err);
    if (rc) {
        respond_error(r, status_for(rc) == 404 ? 404 : 400, err.msg);
        return;
    }
    respond_json(r, 200, exo_instance_to_json(&inst));
    exo_instance_clear(&inst);
}

/* Every sharding x instance meta x node count, as exo's /instance/previews,
 * with the reason each invalid option is invalid. */
static void h_previews(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    const char *model_id = exo_http_query(r, "model_id");
    if (!model_id) {
        respond_error(r, 400, "model_id is required");
        return;
    }
    exo_err err = {0};
    json_t *list = exo_node_previews(s->node, model_id, &err);
    if (!list) {
        respond_error(r, status_for(err.code), err.msg);
        return;
    }
    respond_json(r, 200, json_pack("{s:o}", "previews", list));
}

static void h_cluster(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    respond_json(r, 200, exo_node_cluster_json(s->node));
}

static void h_create_instance(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    json_t *body = json_body(r);
    if (!body)
        return;
    exo_instance inst;
    exo_err err = {0};
    int rc = exo_instance_from_json(json_object_get(body, "instance"), &inst, &err);
    exo_id cmd;
    if (!rc) {
        rc = exo_node_create_instance(s->node, &inst, &cmd, &err);
        if (!rc) {
            json_t *j = command_received(&cmd);
            json_object_set_new(j, "model_card", model_card(s, inst.model_id));
            respond_json(r, 200, j);
        }
        exo_instance_clear(&inst);
    }
    if (rc)
        respond_error(r, 400, err.msg);
    json_decref(body);
}

typedef struct find_instance {
    exo_id  id;
    json_t *out;
    json_t *deleted; /* a recently deleted one: why and when */
} find_instance;

static void grab_instance(void *ctx, const exo_state *st)
{
    find_instance *f = ctx;
    const exo_instance *inst = exo_state_instance(st, &f->id);
    const exo_deleted_instance *gone = inst ? NULL : exo_state_deleted_instance(st, &f->id);
    f->out = inst ? exo_instance_to_json(inst) : NULL;
    f->deleted = gone ? exo_deleted_instance_to_json(gone) : NULL;
}

static void h_get_instance(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    find_instance f = {{{0}}, NULL, NULL};
    if (!exo_id_set(&f.id, exo_http_param(r, "id"), NULL))
        exo_node_read_state(s->node, grab_instance, &f);
    if (f.out) {
        respond_json(r, 200, f.out);
    } else if (f.deleted) { /* still 404, saying why it went */
        const char *model = json_string_value(json_object_get(f.deleted, "modelId"));
        const char *why = json_string_value(json_object_get(f.deleted, "reason"));
        const char *when = json_string_value(json_object_get(f.deleted, "deletedAt"));
        char msg[EXO_DELETE_REASON_MAX + EXO_MODEL_ID_MAX + 256];
        snprintf(msg, sizeof msg, "Instance %.64s%s%s%s was deleted%s%.40s: %s", f.id.s, model ? " (" : "",
                 model ? model : "", model ? ")" : "", when ? " at " : "", when ? when : "",
                 why ? why : "no reason recorded");
        respond_error(r, 404, msg);
        json_decref(f.deleted);
    } else {
        respond_error(r, 404, "Instance not found");
    }
}

static void h_delete_instance(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    exo_id id, cmd;
    exo_err err = {0};
    if (exo_id_set(&id, exo_http_param(r, "id"), NULL)) {
        respond_error(r, 404, "Instance not found");
        return;
    }
    int rc = exo_node_delete_instance(s->node, &id, &cmd, &err);
    if (rc) {
        respond_error(r, status_for(rc), rc == EXO_ENOENT ? "Instance not found" : err.msg);
        return;
    }
    json_t *j = command_received(&cmd);
    json_object_set_new(j, "instance_id", json_string(id.s));
    respond_json(r, 200, j);
}

/* ---- models ------------------------------------------------------------------------ */

/* The models of the cluster: this node's models dirs, every model another
 * node reports on its disk (any node's API serves any instance, so any node
 * lists them all), the custom models users added and the built-in
 * catalogue; each with the nodes that have it, whether an instance of it
 * runs and where it stands: "downloaded" (complete on a node's disk),
 * "downloading" (a node is fetching it), "downloadable". */
typedef struct cluster_model {
    exo_model_card card;
    int64_t        created;   /* the files' time where this node has them, else 0 */
    json_t        *nodes;     /* node ids with it on disk */
    bool           running, is_custom, downloading;
} cluster_model;

typedef struct model_list {
    cluster_model *v;
    size_t         n, cap;
    const char    *self;
} model_list;

static cluster_model *model_list_find(model_list *l, const char *id)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].card.model_id, id))
            return &l->v[i];
    return NULL;
}

static cluster_model *model_list_add(model_list *l, const exo_model_card *card)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = exo_realloc(l->v, l->cap * sizeof *l->v);
    }
    cluster_model *m = &l->v[l->n++];
    memset(m, 0, sizeof *m);
    m->card = *card;
    m->nodes = json_array();
    return m;
}

static void add_node_once(json_t *nodes, const char *id)
{
    size_t i;
    json_t *v;
    json_array_foreach(nodes, i, v) if (!strcmp(json_string_value(v), id)) return;
    json_array_append_new(nodes, json_string(id));
}

static void models_from_state(void *ctx, const exo_state *st)
{
    model_list *l = ctx;
    for (size_t i = 0; i < exo_state_node_count(st); i++) {
        const exo_state_node *sn = exo_state_node_at(st, i);
        for (size_t k = 0; k < sn->info.models.n; k++) {
            const exo_model_card *c = &sn->info.models.v[k];
            cluster_model *m = model_list_find(l, c->model_id);
            if (!m)
                m = model_list_add(l, c);
            add_node_once(m->nodes, sn->node_id.s);
        }
    }
    for (size_t i = 0; i < exo_state_custom_card_count(st); i++) {
        const exo_model_card *c = exo_state_custom_card_at(st, i);
        cluster_model *m = model_list_find(l, c->model_id);
        (m ? m : model_list_add(l, c))->is_custom = true;
    }
    for (size_t i = 0; i < exo_state_download_count(st); i++) {
        const exo_download_status *d = exo_state_download_at(st, i);
        cluster_model *m = model_list_find(l, d->model_id);
        if (m && (d->kind == EXO_DOWNLOAD_KIND_ONGOING || d->kind == EXO_DOWNLOAD_KIND_PENDING))
            m->downloading = true;
    }
    for (size_t i = 0; i < l->n; i++)
        l->v[i].running = exo_state_instances_for_model(st, l->v[i].card.model_id, NULL, 0) > 0;
}

static const char *model_status(const cluster_model *m)
{
    return json_array_size(m->nodes) ? "downloaded" : m->downloading ? "downloading" : "downloadable";
}

/* on_disk_only: the models some node has (Ollama's tags, ?status=downloaded) */
static void model_list_load(exo_api_server *s, model_list *l, bool on_disk_only)
{
    memset(l, 0, sizeof *l);
    exo_model_store *store = exo_node_models(s->node);
    for (size_t i = 0; i < exo_model_store_count(store); i++) {
        const exo_model_entry *e = exo_model_store_at(store, i);
        exo_model_card card;
        exo_model_card_from_entry(e, &card);
        cluster_model *m = model_list_add(l, &card);
        m->created = e->created;
        add_node_once(m->nodes, exo_node_id(s->node));
    }
    exo_model_store_free(store);
    for (size_t i = 0; i < exo_catalogue_count(); i++) {
        const exo_catalogue_card *c = exo_catalogue_at(i);
        if (!model_list_find(l, c->model_id)) {
            exo_model_card card;
            exo_model_card_from_catalogue(c, &card);
            model_list_add(l, &card);
        }
    }
    exo_node_read_state(s->node, models_from_state, l);
    if (on_disk_only) {
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            if (json_array_size(l->v[i].nodes))
                l->v[k++] = l->v[i];
            else
                json_decref(l->v[i].nodes);
        }
        l->n = k;
    }
}

static void model_list_free(model_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        json_decref(l->v[i].nodes);
    exo_free(l->v);
}

/* exo's model card JSON for any node's model: the same fields as a local
 * entry's, plus the nodes that have it and whether an instance runs. */
static json_t *cluster_model_json(const cluster_model *m)
{
    const exo_model_card *c = &m->card;
    exo_model_entry e = {.storage_bytes = (int64_t)c->storage_bytes, .context_length = c->context_length,
                         .supports_tools = c->supports_tools, .supports_thinking = c->supports_thinking,
                         .created = m->created};
    snprintf(e.id, sizeof e.id, "%s", c->model_id);
    /* a card's names come from another node's entry of these same sizes */
    snprintf(e.model_type, sizeof e.model_type, "%.*s", (int)sizeof e.model_type - 1, c->model_type);
    snprintf(e.quantization, sizeof e.quantization, "%.*s", (int)sizeof e.quantization - 1, c->quantization);
    json_t *j = exo_model_entry_to_json(&e);
    json_object_set(j, "nodes", m->nodes);
    json_object_set_new(j, "running", json_boolean(m->running));
    json_object_set_new(j, "is_custom", json_boolean(m->is_custom));
    json_object_set_new(j, "status", json_string(model_status(m)));
    return j;
}

static void h_models(exo_http_request *r, void *ud)
{
    const char *status = exo_http_query(r, "status");
    if (status && *status && strcmp(status, "downloaded")) {
        respond_error(r, 400, "status: only \"downloaded\" filters the list");
        return;
    }
    model_list l;
    model_list_load(ud, &l, status && *status);
    json_t *data = json_array();
    for (size_t i = 0; i < l.n; i++)
        json_array_append_new(data, cluster_model_json(&l.v[i]));
    model_list_free(&l);
    respond_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

/* GET /v1/models/{id}: one model as /v1/models lists it (the openai SDK's
 * models.retrieve); an unknown id is OpenAI's 404, code model_not_found. */
static void h_model_get(exo_http_request *r, void *ud)
{
    const char *id = exo_http_param(r, "id");
    model_list l;
    model_list_load(ud, &l, false);
    cluster_model *m = id ? model_list_find(&l, id) : NULL;
    if (m) {
        respond_json(r, 200, cluster_model_json(m));
    } else {
        char msg[EXO_MODEL_ID_MAX + 64];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", id ? id : "");
        respond_json(r, 404, json_pack("{s:{s:s, s:s, s:s, s:s}}", "error", "message", msg, "type",
                                       "invalid_request_error", "param", "model", "code", "model_not_found"));
    }
    model_list_free(&l);
}

/* The card of a model on any node's disk, as /models lists it. */
static json_t *model_card(exo_api_server *s, const char *model_id)
{
    model_list l;
    model_list_load(s, &l, false);
    cluster_model *m = model_list_find(&l, model_id);
    json_t *j = m ? cluster_model_json(m) : json_pack("{s:s}", "model_id", model_id);
    model_list_free(&l);
    return j;
}

typedef struct custom_probe {
    const char *model_id;
    bool       *known;
} custom_probe;

static void has_custom_card(void *ctx, const exo_state *st)
{
    custom_probe *p = ctx;
    *p->known = exo_state_custom_card(st, p->model_id) != NULL;
}

/* The hub as a request a person waits on asks it: fewer tries, shorter. */
static exo_hub_opts hub_for_a_person(exo_api_server *s)
{
    exo_hub_opts hub = *exo_node_hub(s->node);
    hub.attempts = hub.attempts < 2 ? hub.attempts : 2;
    hub.api_timeout_s = 15;
    return hub;
}

/* GET /models/search?query=&limit=20: models on the hub to add, as exo
 * finds them: mlx-community's (the format exo's catalogue uses) most
 * downloaded first, and where it has none, anyone's. */
static void h_models_search(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    const char *query = exo_http_query(r, "query"), *lim = exo_http_query(r, "limit");
    long limit = 20;
    if (lim) {
        char *end;
        limit = strtol(lim, &end, 10);
        if (!*lim || *end || limit < 1 || limit > EXO_HUB_SEARCH_MAX) {
            respond_error(r, 400, "limit: an integer from 1 to 100");
            return;
        }
    }
    exo_hub_opts hub = hub_for_a_person(s);
    json_t *found;
    exo_err err = {0};
    int rc = exo_hub_search(&hub, query ? query : "", "mlx-community", (int)limit, &found, &err);
    if (!rc && !json_array_size(found)) {
        json_decref(found);
        rc = exo_hub_search(&hub, query ? query : "", NULL, (int)limit, &found, &err);
    }
    if (rc) {
        respond_error(r, rc == EXO_EUNSUPPORTED ? 503 : rc == EXO_EPERM ? 403 : 502, err.msg);
        return;
    }
    respond_json(r, 200, found);
}

/* POST /models/add {model_id}: the model's card from the hub (config.json
 * and file list), added for every node as a custom model. */
static void h_models_add(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    json_t *body = json_body(r);
    if (!body)
        return;
    const char *id = json_string_value(json_object_get(body, "model_id"));
    char dname[300];
    if (!id || !exo_model_dir_name(id, dname, sizeof dname)) {
        json_decref(body);
        respond_error(r, 400, "model_id: a Hugging Face model id (org/name) is required");
        return;
    }
    exo_hub_opts hub = hub_for_a_person(s);
    exo_model_entry e;
    exo_err err = {0};
    int rc = exo_download_card(&hub, id, &e, &err);
    json_decref(body);
    if (rc) {
        respond_error(r, rc == EXO_EPERM ? 403 : 400, err.msg);
        return;
    }
    exo_model_card card;
    exo_model_card_from_entry(&e, &card);
    exo_id cmd;
    if ((rc = exo_node_custom_model(s->node, &card, NULL, &cmd, &err))) {
        respond_error(r, status_for(rc), err.msg);
        return;
    }
    /* answer once this node's State has the card, so a place_instance sent
     * here next finds it (other nodes get it a replication later) */
    for (int i = 0; i < 150; i++) {
        bool known = false;
        exo_node_read_state(s->node, has_custom_card, &(custom_probe){card.model_id, &known});
        if (known)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    e.dir = NULL;
    json_t *j = exo_model_entry_to_json(&e);
    json_object_set_new(j, "is_custom", json_true());
    json_object_set_new(j, "status", json_string("downloadable"));
    json_object_set_new(j, "command_id", json_string(cmd.s));
    respond_json(r, 200, j);
}

static void h_models_custom_delete(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    const char *id = exo_http_param(r, "model_id");
    exo_id cmd;
    exo_err err = {0};
    int rc = exo_node_custom_model(s->node, NULL, id, &cmd, &err);
    if (rc) {
        respond_error(r, status_for(rc), err.msg);
        return;
    }
    json_t *j = command_received(&cmd);
    json_object_set_new(j, "model_id", json_string(id));
    respond_json(r, 200, j);
}

static void download_action(exo_http_request *r, exo_api_server *s, exo_download_action what, const char *target,
                            const char *model_id)
{
    exo_id cmd;
    exo_err err = {0};
    if (!model_id) {
        respond_error(r, 400, "model_id is required");
        return;
    }
    int rc = exo_node_download(s->node, what, target, model_id, &cmd, &err);
    if (rc) {
        respond_error(r, rc == EXO_EPERM ? 400 : status_for(rc), err.msg);
        return;
    }
    json_t *j = command_received(&cmd);
    json_object_set_new(j, "model_id", json_string(model_id));
    respond_json(r, 200, j);
}

/* POST /download/start and /download/cancel {model_id, target_node_id?} */
static void h_download_post(exo_http_request *r, void *ud, exo_download_action what)
{
    json_t *body = json_body(r);
    if (!body)
        return;
    json_t *target = json_object_get(body, "target_node_id");
    if (target && !json_is_string(target) && !json_is_null(target)) {
        json_decref(body);
        respond_error(r, 400, "target_node_id must be a node id");
        return;
    }
    download_action(r, ud, what, json_string_value(target), json_string_value(json_object_get(body, "model_id")));
    json_decref(body);
}

static void h_download_start(exo_http_request *r, void *ud) { h_download_post(r, ud, EXO_DOWNLOAD_START); }
static void h_download_cancel(exo_http_request *r, void *ud) { h_download_post(r, ud, EXO_DOWNLOAD_CANCEL); }

static void h_download_delete(exo_http_request *r, void *ud)
{
    download_action(r, ud, EXO_DOWNLOAD_DELETE, exo_http_param(r, "node_id"), exo_http_param(r, "model_id"));
}

/* The Ollama formatters take a flat list with running flags. */
typedef struct model_infos {
    model_list          list;
    exo_api_model_info *v;
    int                 n;
} model_infos;

static void model_infos_load(exo_api_server *s, model_infos *mi)
{
    model_list_load(s, &mi->list, true);
    mi->n = (int)mi->list.n;
    mi->v = exo_calloc((size_t)mi->n + 1, sizeof *mi->v);
    for (int i = 0; i < mi->n; i++) {
        const cluster_model *m = &mi->list.v[i];
        mi->v[i] = (exo_api_model_info){m->card.model_id, m->card.model_type, m->card.quantization,
                                        (int64_t)m->card.storage_bytes, m->card.context_length,
                                        m->card.supports_tools, false, true, m->running};
    }
}

static void model_infos_free(model_infos *mi)
{
    exo_free(mi->v);
    model_list_free(&mi->list);
}

static void respond_owned(exo_http_request *r, int status, char *body)
{
    exo_http_respond(r, status, "application/json", body, strlen(body));
    exo_free(body);
}

static void h_ollama_tags(exo_http_request *r, void *ud)
{
    model_infos mi;
    model_infos_load(ud, &mi);
    respond_owned(r, 200, exo_ollama_tags_json(mi.v, mi.n));
    model_infos_free(&mi);
}

static void h_ollama_ps(exo_http_request *r, void *ud)
{
    model_infos mi;
    model_infos_load(ud, &mi);
    respond_owned(r, 200, exo_ollama_ps_json(mi.v, mi.n));
    model_infos_free(&mi);
}

static void h_ollama_version(exo_http_request *r, void *ud)
{
    respond_owned(r, 200, exo_ollama_version_json());
}

static void h_ollama_show(exo_http_request *r, void *ud)
{
    model_infos mi;
    model_infos_load(ud, &mi);
    size_t len;
    const char *body = exo_http_body(r, &len);
    char *out = NULL;
    int status = 200;
    if (exo_ollama_show_json(body, len, mi.v, mi.n, &out, &status) == 0)
        respond_owned(r, 200, out);
    else if (out) /* already an Ollama error body */
        respond_owned(r, status, out);
    else
        respond_error(r, status, status == 404 ? "model not found" : "model name is required");
    model_infos_free(&mi);
}

/* ---- generation ---------------------------------------------------------------------- */

typedef struct api_gen {
    exo_api_server   *srv;
    exo_api_response *resp;
    exo_id            command_id;
} api_gen;

static void gen_on_close(void *ud, bool client_gone)
{
    api_gen *g = ud;
    if (client_gone)
        exo_node_cancel(g->srv->node, g->command_id.s); /* ENOENT if it already ended */
}

static void gen_on_chunk(void *ctx, const exo_chunk *c)
{
    api_gen *g = ctx;
    exo_api_response_push(g->resp, c);
}

static void gen_on_end(void *ctx)
{
    api_gen *g = ctx;
    exo_api_response_release(g->resp);
    exo_free(g);
}

static bool ollama_preload(exo_api_family f, const exo_gen_request *req);
static void respond_preload(exo_http_request *r, exo_api_family f, const char *model);

static void h_generate(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    const char *path = exo_http_path(r);
    exo_api_family f = exo_api_family_for_path(path);
    for (int i = 0; i < exo_api_n_generation_routes; i++)
        if (!strcmp(exo_api_generation_routes[i].path, path))
            f = exo_api_generation_routes[i].family;
    size_t len;
    const char *body = exo_http_body(r, &len);
    exo_gen_request req;
    exo_gen_request_init(&req);
    exo_err err = {0};
    int status = 400;
    if (exo_api_parse_request(f, body, len, &req, &status, &err)) {
        respond_error(r, status, err.msg);
        exo_gen_request_free(&req);
        return;
    }
    if (!exo_node_serves_model(s->node, req.model)) {
        char msg[EXO_MODEL_ID_MAX + 64];
        snprintf(msg, sizeof msg, "No instance found for model %s", req.model);
        respond_error(r, 404, msg);
        exo_gen_request_free(&req);
        return;
    }
    if (ollama_preload(f, &req)) {
        respond_preload(r, f, req.model);
        exo_gen_request_free(&req);
        return;
    }
    api_gen *g = exo_calloc(1, sizeof *g);
    g->srv = s;
    exo_id_new(&g->command_id);
    g->resp = exo_api_response_open(r, f, &req, g->command_id.s, gen_on_close, g);
    if (!g->resp) {
        exo_free(g);
        respond_error(r, 500, "cannot open the response stream");
        exo_gen_request_free(&req);
        return;
    }
    exo_gen_sink sink = {g, gen_on_chunk, gen_on_end};
    if (exo_node_generate(s->node, &req, &sink, &g->command_id, &err)) {
        /* lost a race with an instance deletion, or the node is stopping */
        exo_chunk c;
        exo_chunk_error(&c, err.msg);
        exo_api_response_push(g->resp, &c);
        exo_chunk_free(&c);
        gen_on_end(g);
    }
    exo_gen_request_free(&req);
}

/* Ollama clients load a model by sending a chat with no messages (or a
 * generate with an empty prompt) and expect done_reason "load" at once. */
static bool ollama_preload(exo_api_family f, const exo_gen_request *req)
{
    if (f != EXO_API_OLLAMA_CHAT && f != EXO_API_OLLAMA_GENERATE)
        return false;
    size_t i;
    json_t *m;
    json_array_foreach(req->messages, i, m) {
        json_t *c = json_object_get(m, "content");
        if (!json_is_string(c) || json_string_length(c))
            return false;
    }
    return true;
}

static void respond_preload(exo_http_request *r, exo_api_family f, const char *model)
{
    char now[64];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(now + k, sizeof now - k, ".%09ldZ", ts.tv_nsec);
    json_t *j = json_pack("{s:s, s:s, s:b, s:s}", "model", model, "created_at", now, "done", 1,
                          "done_reason", "load");
    if (f == EXO_API_OLLAMA_CHAT)
        json_object_set_new(j, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
    else
        json_object_set_new(j, "response", json_string(""));
    respond_json(r, 200, j);
}

static void h_cancel(exo_http_request *r, void *ud)
{
    exo_api_server *s = ud;
    const char *id = exo_http_param(r, "command_id");
    if (exo_node_cancel(s->node, id)) {
        respond_error(r, 404, "Command not found or already completed");
        return;
    }
    respond_json(r, 200, json_pack("{s:s, s:s}", "message", "Command cancelled.", "command_id", id));
}

/* ---- dashboard ---------------------------------------------------------------------- */

#define DASHBOARD_MAX_FILE ((size_t)16 << 20)

static const char *content_type_of(const char *name)
{
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".css", "text/css; charset=utf-8"},
        {".json", "application/json"}, {".svg", "image/svg+xml"}, {".png", "image/png"},
        {".ico", "image/x-icon"}, {".woff2", "font/woff2"}, {".txt", "text/plain; charset=utf-8"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof *types; i++)
        if (!strcmp(dot, types[i][0]))
            return types[i][1];
    return "application/octet-stream";
}

/* A file name under the dashboard dir: [A-Za-z0-9._-] segments separated by
 * single slashes, none starting with a dot (so no "..", no hidden files). */
static bool safe_asset_name(const char *name)
{
    if (!*name || strlen(name) > 256)
        return false;
    bool seg_start = true;
    for (const char *c = name; *c; c++) {
        if (*c == '/') {
            if (seg_start)
                return false;
            seg_start = true;
            continue;
        }
        if (seg_start && *c == '.')
            return false;
        seg_start = false;
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '.' || *c == '_' || *c == '-'))
            return false;
    }
    return !seg_start;
}

static void serve_asset(exo_http_request *r, exo_api_server *s, const char *name)
{
    if (!s->dashboard_dir) {
        respond_error(r, 404, "the dashboard is not built (cd dashboard && npm run build)");
        return;
    }
    if (!safe_asset_name(name)) {
        respond_error(r, 404, "Not Found");
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->dashboard_dir, name);
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || (size_t)st.st_size > DASHBOARD_MAX_FILE) {
        if (f)
            fclose(f);
        respond_error(r, 404, "Not Found");
        return;
    }
    char *buf = exo_malloc((size_t)st.st_size + 1);
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    exo_http_respond(r, 200, content_type_of(name), buf, got);
    exo_free(buf);
}

static void h_dashboard_index(exo_http_request *r, void *ud) { serve_asset(r, ud, "index.html"); }

static void h_dashboard_file(exo_http_request *r, void *ud)
{
    serve_asset(r, ud, exo_http_param(r, "file"));
}

/* ---- start / stop ------------------------------------------------------------------ */

typedef struct route {
    const char      *method, *pattern;
    exo_http_handler handler;
} route;

static const route routes[] = {
    {"GET", "/node_id", h_node_id},
    {"GET", "/state", h_state},
    {"GET", "/state/{path:path}", h_state},
    {"GET", "/events", h_events},
    {"GET", "/events/page", h_events_page},
    {"GET", "/cluster", h_cluster},
    {"POST", "/instance", h_create_instance},
    {"POST", "/place_instance", h_place_instance},
    {"GET", "/instance/placement", h_placement},
    {"GET", "/instance/previews", h_previews},
    {"GET", "/instance/{id}", h_get_instance},
    {"DELETE", "/instance/{id}", h_delete_instance},
    {"GET", "/models", h_models},
    {"GET", "/v1/models", h_models},
    {"GET", "/v1/models/{id:path}", h_model_get},
    {"GET", "/models/search", h_models_search},
    {"POST", "/models/add", h_models_add},
    {"DELETE", "/models/custom/{model_id:path}", h_models_custom_delete},
    {"POST", "/download/start", h_download_start},
    {"POST", "/download/cancel", h_download_cancel},
    {"DELETE", "/download/{node_id}/{model_id:path}", h_download_delete},
    {"POST", "/v1/cancel/{command_id}", h_cancel},
    {"GET", "/ollama/api/tags", h_ollama_tags},
    {"GET", "/ollama/api/api/tags", h_ollama_tags},
    {"GET", "/ollama/api/v1/tags", h_ollama_tags},
    {"GET", "/ollama/api/ps", h_ollama_ps},
    {"GET", "/ollama/api/version", h_ollama_version},
    {"GET", "/ollama/", h_ollama_version},
    {"POST", "/ollama/api/show", h_ollama_show},
    /* the same at Ollama's own paths (an Ollama client with the daemon as host) */
    {"GET", "/api/tags", h_ollama_tags},
    {"GET", "/api/ps", h_ollama_ps},
    {"GET", "/api/version", h_ollama_version},
    {"POST", "/api/show", h_ollama_show},
    {"GET", "/", h_dashboard_index},
    {"GET", "/dashboard/{file:path}", h_dashboard_file},
};

int exo_api_server_start(exo_node *node, const exo_api_server_config *cfg, exo_api_server **out,
                         exo_err *err)
{
    *out = NULL;
    exo_api_server *s = exo_calloc(1, sizeof *s);
    s->node = node;
    s->dashboard_dir = cfg->dashboard_dir ? exo_strdup(cfg->dashboard_dir) : NULL;
    exo_http_config hc = {
        .bind_addr = cfg->bind_addr,
        .port = cfg->port,
        .keepalive_s = cfg->keepalive_s,
        .error_body = exo_api_error_for_path,
        .header_timeout_s = cfg->header_timeout_s,
        .body_timeout_s = cfg->body_timeout_s,
        .idle_timeout_s = cfg->idle_timeout_s,
        .max_per_client = cfg->max_per_client,
        .memory_budget = cfg->memory_budget,
        .stream_max_pending = cfg->stream_max_pending,
        .api_key = cfg->api_key,
    };
    s->http = exo_http_create(&hc);
    s->events = exo_events_reader_new(node);
    int rc = 0;
    for (size_t i = 0; i < sizeof routes / sizeof *routes && !rc; i++)
        rc = exo_http_route(s->http, routes[i].method, routes[i].pattern, routes[i].handler, s);
    for (int i = 0; i < exo_api_n_generation_routes && !rc; i++)
        rc = exo_http_route(s->http, "POST", exo_api_generation_routes[i].path, h_generate, s);
    if (rc) {
        exo_err_set(err, rc, "cannot register the API routes");
    } else {
        rc = exo_http_start(s->http, err);
    }
    if (rc) {
        exo_api_server_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int exo_api_server_port(const exo_api_server *s) { return exo_http_port(s->http); }

void exo_api_server_free(exo_api_server *s)
{
    if (!s)
        return;
    exo_events_reader_stop(s->events); /* its streams belong to the HTTP server */
    exo_http_destroy(s->http);
    exo_events_reader_free(s->events);
    exo_free(s->dashboard_dir);
    exo_free(s);
}
