/* Placement (see placement.h).
 *
 * Speed: when every candidate reports its memory bandwidth, each size's
 * best set is predicted (exo_placement_predict) and the fastest wins; a
 * larger set must be 2% faster to be worth its extra nodes.
 *
 * Candidates are ranked once (most available memory first, then node id);
 * node sets are bit masks over that ranking and are tried by size, so the
 * first size with a valid set is the smallest. A set is valid when its
 * nodes form a directed ring over the State's edges (searched depth-first
 * from its best-ranked node, which becomes rank 0), hold the weights, pass
 * the sharding's rules and fit their layer shares. At most
 * MAX_CANDIDATES nodes take part (2^16 sets; a home cluster has a handful).
 *
 * A candidate is a place for one rank: a node, or one GPU of a node with
 * several (NCCL wants a GPU per rank; the node's memory is split evenly
 * among its GPUs' ranks for the layers that spill to the CPU). Places on
 * one node are linked by loopback.
 *
 * When nothing fits, the error names the furthest any set got (memory, then
 * ring, then sharding rules, then per-node fit), which is the most useful
 * thing to tell a user. */
#include "cluster/placement.h"

#include "cluster/codec.h"
#include "core/alloc.h"
#include "engine/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)
#define MAX_CANDIDATES 16

int exo_placement_split_layers(int n_layers, const uint64_t *weights, int n, int32_t *starts,
                               exo_err *err)
{
    if (n <= 0 || n_layers < n)
        return exo_err_set(err, EXO_EINVAL, "cannot split %d layers over %d nodes", n_layers, n);
    long double total = 0;
    for (int i = 0; i < n; i++)
        total += weights[i] ? (long double)weights[i] : 1.0L;
    /* Every node gets one layer; the rest goes by largest remainder. */
    int spare = n_layers - n, given = 0;
    int32_t *count = exo_calloc((size_t)n, sizeof *count);
    long double *rem = exo_calloc((size_t)n, sizeof *rem);
    for (int i = 0; i < n; i++) {
        long double share = (weights[i] ? (long double)weights[i] : 1.0L) / total * spare;
        count[i] = (int32_t)share;
        rem[i] = share - count[i];
        given += count[i];
    }
    while (given < spare) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (rem[i] > rem[best])
                best = i;
        count[best]++;
        rem[best] = -1;
        given++;
    }
    int32_t at = 0;
    for (int i = 0; i < n; i++) {
        starts[i] = at;
        at += count[i] + 1;
    }
    exo_free(count);
    exo_free(rem);
    return 0;
}

/* Bytes of the LM head: vocab x hidden at the checkpoint's bits per weight
 * (MLX affine: the bits plus a 16-bit scale and bias per group of 64). */
static double head_bytes(const exo_model_card *c)
{
    if (c->vocab_size <= 0 || c->hidden_size <= 0)
        return 0;
    double bits = 16;
    int qb = atoi(c->quantization);
    if (qb > 0 && qb <= 8 && strstr(c->quantization, "bit"))
        bits = qb + 0.5;
    else if (!strcmp(c->quantization, "fp32"))
        bits = 32;
    return (double)c->vocab_size * c->hidden_size * bits / 8;
}

int exo_placement_pipeline_split(const exo_model_card *card, const uint64_t *weights, int n,
                                 int32_t *starts, exo_err *err)
{
    int L = card->n_layers;
    if (n <= 0 || L < n) /* the plain split says why not */
        return exo_placement_split_layers(L, weights, n, starts, err);
    double head = head_bytes(card), rest = (double)card->storage_bytes - head;
    int extra = 0;
    if (n > 1 && head > 0 && rest > 0)
        extra = (int)(head / (rest / L) + 0.5);
    if (extra > L)
        extra = L;
    int rc = exo_placement_split_layers(L + extra, weights, n, starts, err);
    if (rc)
        return exo_placement_split_layers(L, weights, n, starts, err);
    /* the last rank's share included the head: it ends at L, not L + extra;
     * every rank keeps at least one layer */
    for (int i = n - 1; i >= 0; i--) {
        int32_t limit = i == n - 1 ? L - 1 : starts[i + 1] - 1;
        if (starts[i] > limit)
            starts[i] = limit;
    }
    return 0;
}

/* ---- candidates and rings ------------------------------------------------------ */

/* A place for one rank: a node, or one GPU of a node with several. */
typedef struct place {
    const exo_state_node *sn;
    int                   gpu; /* index into sn->info.gpus, -1: the whole node, its first GPU if any */
} place;

typedef struct candidates {
    place places[MAX_CANDIDATES];
    int   n;
    bool  adj[MAX_CANDIDATES][MAX_CANDIDATES]; /* an edge i -> j */
    int   with_backend, with_model;            /* nodes, before the cap */
} candidates;

/* A node whose runners can each take a GPU of their own. */
static bool gpu_per_rank(const exo_node_info *info)
{
    return (info->backends & (1u << EXO_BACKEND_CUDA)) && info->gpus.n >= 2;
}

/* The GPU a rank of this place uses: its own, or the node's first. */
static const exo_gpu_info *place_gpu(const exo_node_info *info, int gpu)
{
    if (!(info->backends & (1u << EXO_BACKEND_CUDA)) || !info->gpus.n)
        return NULL;
    return &info->gpus.v[gpu >= 0 && (size_t)gpu < info->gpus.n ? (size_t)gpu : 0];
}

/* The GPU's free memory less what the model keeps back there for caches
 * and activations (exo_model_gpu_reserve): a runner puts the layers that
 * fit on the GPU and the rest on the CPU, whether it holds layers
 * (pipeline) or a share of every layer (tensor parallel). */
static uint64_t gpu_room(const exo_node_info *info, int gpu)
{
    const exo_gpu_info *g = place_gpu(info, gpu);
    if (!g)
        return 0;
    uint64_t free_bytes = g->memory_total > g->memory_used ? g->memory_total - g->memory_used : 0;
    uint64_t keep = exo_model_gpu_reserve(g->memory_total);
    return free_bytes > keep ? free_bytes - keep : 0;
}

/* The node's memory for the layers a rank keeps on the CPU: all of it, or
 * a GPU's even share on a node with a rank per GPU. */
static uint64_t ram_room(const exo_node_info *info, int gpu)
{
    return gpu >= 0 && info->gpus.n ? info->memory_available / info->gpus.n : info->memory_available;
}

/* The bytes of weights one rank at this place can hold. */
static uint64_t weight_memory(const place *p)
{
    return ram_room(&p->sn->info, p->gpu) + gpu_room(&p->sn->info, p->gpu);
}

/* Seconds one decode step of a rank spends reading `bytes` of weights:
 * what fits the GPU at the GPU's bandwidth, the rest at the node's memory
 * bandwidth (as the runner splits them); negative when unknown. */
static double read_seconds(const exo_node_info *info, int gpu, double bytes)
{
    const exo_gpu_info *g = place_gpu(info, gpu);
    double room = (double)gpu_room(info, gpu), gpu_bps = room > 0 ? (double)g->memory_read_bps : 0;
    double on_gpu = gpu_bps > 0 ? (bytes < room ? bytes : room) : 0, rest = bytes - on_gpu;
    if (rest > 0 && !info->mem_read_bps)
        return -1;
    return (on_gpu > 0 ? on_gpu / gpu_bps : 0) + (rest > 0 ? rest / (double)info->mem_read_bps : 0);
}

/* Ranking of candidates: nodes that already have the model on disk first
 * (no download before the model runs), then by the weights they can hold,
 * then node id and GPU (deterministic). */
static int by_memory_desc(const void *a, const void *b, void *model_id)
{
    const place *x = a, *y = b;
    bool hx = exo_node_info_model(&x->sn->info, model_id) != NULL,
         hy = exo_node_info_model(&y->sn->info, model_id) != NULL;
    if (hx != hy)
        return hx ? -1 : 1;
    uint64_t mx = weight_memory(x), my = weight_memory(y);
    if (mx != my)
        return mx > my ? -1 : 1;
    int c = strcmp(x->sn->node_id.s, y->sn->node_id.s);
    return c ? c : x->gpu - y->gpu;
}

static void gather(const exo_state *st, const char *model_id, candidates *c)
{
    memset(c, 0, sizeof *c);
    size_t n_all = exo_state_node_count(st), cap = 0;
    for (size_t i = 0; i < n_all; i++) {
        const exo_node_info *info = &exo_state_node_at(st, i)->info;
        cap += gpu_per_rank(info) ? info->gpus.n : 1;
    }
    place *all = exo_calloc(cap ? cap : 1, sizeof *all);
    int n = 0;
    for (size_t i = 0; i < n_all; i++) {
        const exo_state_node *sn = exo_state_node_at(st, i);
        if (!sn->info.backends)
            continue;
        c->with_backend++;
        c->with_model += exo_node_info_model(&sn->info, model_id) != NULL;
        /* nodes without the files download them */
        if (!gpu_per_rank(&sn->info))
            all[n++] = (place){sn, -1};
        else
            for (size_t g = 0; g < sn->info.gpus.n; g++)
                all[n++] = (place){sn, (int)g};
    }
    qsort_r(all, (size_t)n, sizeof *all, by_memory_desc, (void *)model_id);
    c->n = n < MAX_CANDIDATES ? n : MAX_CANDIDATES;
    memcpy(c->places, all, (size_t)c->n * sizeof *all);
    exo_free(all);
    for (int a = 0; a < c->n; a++)
        for (int b = 0; b < c->n; b++)
            if (a != b && c->places[a].sn == c->places[b].sn)
                c->adj[a][b] = true; /* loopback */
    for (size_t e = 0; e < exo_state_edge_count(st); e++) {
        const exo_topology_edge *edge = exo_state_edge_at(st, e);
        for (int a = 0; a < c->n; a++)
            for (int b = 0; b < c->n; b++)
                if (exo_id_eq(&c->places[a].sn->node_id, &edge->source) &&
                    exo_id_eq(&c->places[b].sn->node_id, &edge->sink))
                    c->adj[a][b] = true;
    }
}

/* Depth-first search for a directed cycle through every node of mask,
 * starting at `first`; writes the ring order. */
static bool ring_dfs(const candidates *c, uint32_t mask, int k, int *order, int depth, uint32_t used)
{
    if (depth == k)
        return k == 1 || c->adj[order[k - 1]][order[0]];
    int last = order[depth - 1];
    for (int j = 0; j < c->n; j++) {
        if (!(mask & (1u << j)) || (used & (1u << j)) || !c->adj[last][j])
            continue;
        order[depth] = j;
        if (ring_dfs(c, mask, k, order, depth + 1, used | (1u << j)))
            return true;
    }
    return false;
}

static bool find_ring(const candidates *c, uint32_t mask, int k, int *order)
{
    order[0] = __builtin_ctz(mask); /* the best-ranked node is rank 0 */
    return ring_dfs(c, mask, k, order, 1, 1u << order[0]);
}

/* ---- evaluating one node set ------------------------------------------------------ */

enum { STAGE_NONE, STAGE_MEMORY, STAGE_RING, STAGE_RULES, STAGE_FIT, STAGE_OK };

typedef struct attempt {
    int     stage;         /* furthest stage any set reached */
    exo_err why;           /* the reason at that stage */
    uint64_t best_memory;  /* most memory of any set tried */
} attempt;

static void note(attempt *a, int stage, const exo_err *why)
{
    if (stage > a->stage) {
        a->stage = stage;
        a->why = *why;
    }
}

static void node_list(const candidates *c, uint32_t mask, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < c->n && at + 1 < cap; i++)
        if (mask & (1u << i)) {
            const place *p = &c->places[i];
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? ", " : "", p->sn->node_id.s);
            if (p->gpu >= 0 && at + 1 < cap)
                at += (size_t)snprintf(buf + at, cap - at, " (GPU %d)", (int)p->sn->info.gpus.v[p->gpu].index);
        }
}

/* Checks one set; on success fills starts (ring order) and returns true. */
static bool try_set(const candidates *c, const exo_placement_request *req, uint32_t mask, int k,
                    exo_sharding sharding, int *order, int32_t *starts, attempt *a)
{
    const exo_model_card *card = req->card;
    exo_err why = {0};
    uint64_t mem = 0;
    for (int i = 0; i < c->n; i++)
        if (mask & (1u << i))
            mem += weight_memory(&c->places[i]);
    if (mem > a->best_memory)
        a->best_memory = mem;
    if (mem < card->storage_bytes) {
        exo_err_set(&why, EXO_EINVAL,
                    "not enough memory for %s: it needs %.0f MiB, the most %d node%s %s available is %.0f MiB",
                    card->model_id, card->storage_bytes / MIB, k, k == 1 ? "" : "s", k == 1 ? "has" : "have",
                    a->best_memory / MIB);
        note(a, STAGE_MEMORY, &why);
        return false;
    }
    if (!find_ring(c, mask, k, order)) {
        char nodes[512];
        node_list(c, mask, nodes, sizeof nodes);
        exo_err_set(&why, EXO_EINVAL, "nodes %s could hold %s but are not linked in a ring", nodes,
                    card->model_id);
        note(a, STAGE_RING, &why);
        return false;
    }
    if (k > 1 && req->meta == EXO_INSTANCE_META_MLX_JACCL) {
        exo_err_set(&why, EXO_EINVAL, "MlxJaccl needs RDMA links between the nodes, and none of them "
                                      "reports any (use MlxRing)");
        note(a, STAGE_RULES, &why);
        return false;
    }
    if (sharding == EXO_SHARDING_TENSOR && k > 1) {
        if (!card->supports_tensor) {
            exo_err_set(&why, EXO_EINVAL, "%s does not support tensor sharding", card->model_id);
            note(a, STAGE_RULES, &why);
            return false;
        }
        if ((card->hidden_size && card->hidden_size % k) || (card->n_kv_heads && card->n_kv_heads % k)) {
            exo_err_set(&why, EXO_EINVAL,
                        "tensor sharding over %d nodes needs hidden_size (%d) and key/value heads (%d) "
                        "divisible by %d", k, card->hidden_size, card->n_kv_heads, k);
            note(a, STAGE_RULES, &why);
            return false;
        }
    }
    uint64_t weights[MAX_CANDIDATES];
    for (int i = 0; i < k; i++)
        weights[i] = weight_memory(&c->places[order[i]]);
    if (sharding == EXO_SHARDING_PIPELINE) {
        if (exo_placement_pipeline_split(card, weights, k, starts, &why) < 0) {
            note(a, STAGE_RULES, &why);
            return false;
        }
    } else {
        memset(starts, 0, (size_t)k * sizeof *starts);
    }
    for (int i = 0; i < k; i++) {
        int32_t lo = sharding == EXO_SHARDING_PIPELINE ? starts[i] : 0;
        int32_t hi = sharding == EXO_SHARDING_PIPELINE && i + 1 < k ? starts[i + 1] : card->n_layers;
        uint64_t share = sharding == EXO_SHARDING_PIPELINE
                             ? (uint64_t)((long double)card->storage_bytes * (hi - lo) / card->n_layers)
                             : card->storage_bytes / (uint64_t)k;
        const place *p = &c->places[order[i]];
        uint64_t room = weight_memory(p);
        if (share > room) {
            char where[32] = "";
            if (p->gpu >= 0)
                snprintf(where, sizeof where, " (GPU %d)", (int)p->sn->info.gpus.v[p->gpu].index);
            exo_err_set(&why, EXO_EINVAL, "node %s%s cannot hold layers %d-%d of %s: needs %.0f MiB, has %.0f MiB",
                        p->sn->node_id.s, where, lo, hi, card->model_id, share / MIB, room / MIB);
            note(a, STAGE_FIT, &why);
            return false;
        }
    }
    return true;
}

/* ---- speed --------------------------------------------------------------------------- */

/* What a ring link between two ranks of one node is taken to be: the
 * host ring's loopback (NCCL between GPUs is faster still). */
#define LOOPBACK_RTT_S 20e-6
#define LOOPBACK_BPS   10e9

/* The best measured link from a to b: round trip (s) and bandwidth (bytes/s). */
static bool link_of(const exo_state *st, const exo_id *a, const exo_id *b, double *rtt, double *bps)
{
    if (exo_id_eq(a, b)) {
        *rtt = LOOPBACK_RTT_S;
        *bps = LOOPBACK_BPS;
        return true;
    }
    bool found = false;
    for (size_t i = 0; i < exo_state_edge_count(st); i++) {
        const exo_topology_edge *e = exo_state_edge_at(st, i);
        if (!exo_id_eq(&e->source, a) || !exo_id_eq(&e->sink, b) || e->latency_us <= 0)
            continue;
        double r = (double)e->latency_us / 1e6;
        /* a link whose bandwidth was not measured yet: assume 1 Gbit/s */
        double w = e->bandwidth_bps ? (double)e->bandwidth_bps / 8 : 125e6;
        if (!found || r < *rtt) {
            *rtt = r;
            *bps = w;
            found = true;
        }
    }
    return found;
}

/* The place of a shard: the node's GPU its device names on a node with a
 * rank per GPU, else the whole node. */
static int shard_gpu(const exo_node_info *info, const exo_shard *s)
{
    int ordinal = exo_device_gpu(s->device);
    if (!gpu_per_rank(info) || ordinal < 0)
        return -1;
    for (size_t g = 0; g < info->gpus.n; g++)
        if (info->gpus.v[g].index == ordinal)
            return (int)g;
    return -1;
}

double exo_placement_predict(const exo_state *st, const exo_instance *inst, const exo_model_card *card)
{
    size_t k = inst->n_shards;
    if (!k || card->n_layers <= 0)
        return 0;
    double bytes = (double)card->storage_bytes, hidden = 4.0 * (card->hidden_size > 0 ? card->hidden_size : 4096);
    double compute = 0, comm = 0, worst_rtt = 0, worst_bps = 0;
    for (size_t i = 0; i < k; i++) {
        const exo_shard *s = &inst->shards[i];
        const exo_state_node *sn = exo_state_node_find(st, &s->node_id);
        if (!sn)
            return 0;
        double share = bytes; /* what this rank reads a token */
        if (inst->sharding == EXO_SHARDING_TENSOR && k > 1) {
            share = bytes / (double)k;
        } else if (k > 1) { /* the last rank also reads the head */
            double head = head_bytes(card), rest = bytes > head ? bytes - head : bytes;
            share = rest * (s->end_layer - s->start_layer) / card->n_layers + (i + 1 == k ? head : 0);
        }
        double t = read_seconds(&sn->info, shard_gpu(&sn->info, s), share);
        if (t < 0)
            return 0;
        if (inst->sharding == EXO_SHARDING_TENSOR && k > 1)
            compute = t > compute ? t : compute;
        else
            compute += t;
        if (k < 2)
            continue;
        double rtt = 0, bps = 0;
        if (!link_of(st, &s->node_id, &inst->shards[(i + 1) % k].node_id, &rtt, &bps))
            return 0;
        if (inst->sharding == EXO_SHARDING_PIPELINE) /* the last hop carries only the sample */
            comm += rtt / 2 + (i + 1 < k ? hidden / bps : 0);
        worst_rtt = rtt > worst_rtt ? rtt : worst_rtt;
        worst_bps = !worst_bps || bps < worst_bps ? bps : worst_bps;
    }
    if (inst->sharding == EXO_SHARDING_TENSOR && k > 1) {
        /* ring all-reduce: 2(k-1) steps of hidden/k each, twice per layer */
        double allreduce = 2.0 * (double)(k - 1) * (worst_rtt / 2 + hidden / (double)k / worst_bps);
        comm = 2.0 * card->n_layers * allreduce;
    }
    double t = compute + comm;
    return t > 0 ? 1.0 / t : 0;
}

static void build(const candidates *c, const exo_placement_request *req, int k, exo_sharding sharding,
                  exo_instance_meta meta, const int *order, const int32_t *starts, exo_instance *out)
{
    const exo_model_card *card = req->card;
    exo_id_new(&out->instance_id);
    snprintf(out->model_id, sizeof out->model_id, "%s", card->model_id);
    out->sharding = sharding;
    out->meta = meta;
    out->n_shards = (size_t)k;
    out->shards = exo_calloc((size_t)k, sizeof *out->shards);
    for (int i = 0; i < k; i++) {
        exo_shard *s = &out->shards[i];
        const place *p = &c->places[order[i]];
        exo_id_new(&s->runner_id);
        s->node_id = p->sn->node_id;
        if (p->gpu >= 0)
            snprintf(s->device, sizeof s->device, "cuda:%d", (int)p->sn->info.gpus.v[p->gpu].index);
        s->device_rank = i;
        s->world_size = k;
        s->n_layers = card->n_layers;
        s->start_layer = sharding == EXO_SHARDING_PIPELINE ? starts[i] : 0;
        s->end_layer = sharding == EXO_SHARDING_PIPELINE && i + 1 < k ? starts[i + 1] : card->n_layers;
    }
}

int exo_placement_place(const exo_state *st, const exo_placement_request *req, exo_instance *out,
                        exo_err *err)
{
    memset(out, 0, sizeof *out);
    const exo_model_card *card = req->card;
    if (card->n_layers <= 0)
        return exo_err_set(err, EXO_EINVAL, "model %s: config.json gives no num_hidden_layers", card->model_id);
    candidates c;
    gather(st, card->model_id, &c);
    if (!c.with_backend)
        return exo_err_set(err, EXO_EINVAL, "no nodes with a compute backend (is any worker running?)");
    int min_nodes = req->min_nodes > 0 ? req->min_nodes : 1;
    int lo = req->exact_nodes > 0 ? req->exact_nodes : min_nodes;
    int hi = req->exact_nodes > 0 ? req->exact_nodes : c.n;
    if (lo > c.n)
        return exo_err_set(err, EXO_EINVAL, "%s %d but the cluster has %d node%s with a compute backend%s",
                           req->exact_nodes > 0 ? "the node count asked for is" : "min_nodes is", lo, c.n,
                           c.n == 1 ? "" : "s", c.n > c.with_backend ? " (counting each GPU of a node with several)" : "");
    attempt a = {0};
    /* with every node's speed known and no node count asked for, the
     * fastest predicted set of any size wins; otherwise the smallest set
     * that fits (min_nodes is then what exo makes of it: that many nodes,
     * more only when fewer cannot hold the model) */
    bool predictable = min_nodes <= 1 && req->exact_nodes <= 0;
    for (int i = 0; i < c.n; i++)
        predictable &= c.places[i].sn->info.mem_read_bps > 0;
    exo_instance fastest = {0};
    double fastest_tps = 0;
    for (int k = lo; k <= hi; k++) {
        exo_sharding sharding = k == 1 ? EXO_SHARDING_PIPELINE : req->sharding;
        exo_instance_meta meta = k == 1 ? EXO_INSTANCE_META_MLX_RING : req->meta;
        uint32_t best = 0;
        uint64_t best_mem = 0;
        int best_have = -1;
        double best_tps = 0;
        int order[MAX_CANDIDATES], best_order[MAX_CANDIDATES];
        int32_t starts[MAX_CANDIDATES], best_starts[MAX_CANDIDATES];
        for (uint32_t mask = 1; mask < (1u << c.n); mask++) {
            if (__builtin_popcount(mask) != k || !try_set(&c, req, mask, k, sharding, order, starts, &a))
                continue;
            uint64_t mem = 0;
            int have = 0; /* nodes that need no download */
            for (int i = 0; i < c.n; i++)
                if (mask & (1u << i)) {
                    mem += weight_memory(&c.places[i]);
                    have += exo_node_info_model(&c.places[i].sn->info, card->model_id) != NULL;
                }
            /* among sets of one size: those with the model on disk, then the
             * fastest predicted (a node with a GPU over one without), then
             * the most memory */
            double tps = 0;
            if (predictable) {
                exo_instance cand;
                build(&c, req, k, sharding, meta, order, starts, &cand);
                tps = exo_placement_predict(st, &cand, card);
                exo_instance_clear(&cand);
            }
            if (!best || have > best_have ||
                (have == best_have && (tps > best_tps || (tps == best_tps && mem > best_mem)))) {
                best = mask;
                best_mem = mem;
                best_have = have;
                best_tps = tps;
                memcpy(best_order, order, sizeof order);
                memcpy(best_starts, starts, sizeof starts);
            }
        }
        if (!best)
            continue;
        exo_instance inst;
        build(&c, req, k, sharding, meta, best_order, best_starts, &inst);
        double tps = predictable ? exo_placement_predict(st, &inst, card) : 0;
        if (tps <= 0) { /* not predictable: the smallest set, as before */
            if (fastest.n_shards) {
                exo_instance_clear(&inst);
                break;
            }
            *out = inst;
            return 0;
        }
        if (tps > fastest_tps * 1.02) { /* a clear gain, else fewer nodes */
            exo_instance_clear(&fastest);
            fastest = inst;
            fastest_tps = tps;
        } else {
            exo_instance_clear(&inst);
        }
    }
    if (fastest.n_shards) {
        *out = fastest;
        return 0;
    }
    if (a.stage == STAGE_MEMORY) /* say the best any set of the sizes tried had */
        return exo_err_set(err, EXO_EINVAL,
                           "not enough memory for %s: it needs %.0f MiB, the nodes offer at most "
                           "%.0f MiB available", card->model_id, card->storage_bytes / MIB, a.best_memory / MIB);
    if (err)
        *err = a.why;
    return EXO_EINVAL;
}

/* ---- previews --------------------------------------------------------------------- */

void exo_placement_previews(const exo_state *st, const exo_model_card *card, json_t *out)
{
    candidates c;
    gather(st, card->model_id, &c);
    int n = c.n ? c.n : 1;
    json_t *seen = json_object();
    for (int sh = 0; sh < EXO_SHARDING__COUNT; sh++)
        for (int me = 0; me < EXO_INSTANCE_META__COUNT; me++)
            for (int k = 1; k <= n; k++) {
                exo_placement_request req = {card, (exo_sharding)sh, (exo_instance_meta)me, 1, k};
                exo_instance inst;
                exo_err err = {0};
                int rc = exo_placement_place(st, &req, &inst, &err);
                /* one node is always Pipeline/MlxRing: the other combinations
                 * of k = 1 repeat it */
                char key[EXO_ERR_LEN + 64];
                if (rc)
                    snprintf(key, sizeof key, "%d/%d/%d/%s", sh, me, k, err.msg);
                else
                    snprintf(key, sizeof key, "%d/%d/%zu", inst.sharding, inst.meta, inst.n_shards);
                if (json_object_get(seen, key)) {
                    if (!rc)
                        exo_instance_clear(&inst);
                    continue;
                }
                json_object_set_new(seen, key, json_true());
                json_t *p = json_pack("{s:s, s:s, s:s, s:i}", "model_id", card->model_id, "sharding",
                                      exo_sharding_name(rc ? (exo_sharding)sh : inst.sharding), "instance_meta",
                                      exo_instance_meta_name(rc ? (exo_instance_meta)me : inst.meta),
                                      "node_count", k);
                json_t *delta = json_object();
                if (!rc) {
                    for (size_t i = 0; i < inst.n_shards; i++) {
                        const exo_shard *s = &inst.shards[i];
                        uint64_t bytes = (uint64_t)((long double)card->storage_bytes *
                                                    (s->end_layer - s->start_layer) / card->n_layers);
                        if (inst.sharding == EXO_SHARDING_TENSOR)
                            bytes = card->storage_bytes / inst.n_shards;
                        json_t *had = json_object_get(delta, s->node_id.s); /* a rank per GPU */
                        bytes += had ? (uint64_t)json_integer_value(had) : 0;
                        json_object_set_new(delta, s->node_id.s, json_integer((json_int_t)bytes));
                    }
                    json_object_set_new(p, "instance", exo_instance_to_json(&inst));
                    json_object_set_new(p, "error", json_null());
                    double tps = exo_placement_predict(st, &inst, card);
                    json_object_set_new(p, "predicted_tokens_per_second", tps > 0 ? json_real(tps) : json_null());
                    exo_instance_clear(&inst);
                } else {
                    json_object_set_new(p, "instance", json_null());
                    json_object_set_new(p, "error", json_string(err.msg));
                    json_object_set_new(p, "predicted_tokens_per_second", json_null());
                }
                json_object_set_new(p, "memory_delta_by_node", delta);
                json_array_append_new(out, p);
            }
    json_decref(seen);
}
