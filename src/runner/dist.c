/* Split-model generation over the ring (see dist.h).
 *
 * Frames (ring.h header fields a, b):
 *   BEGIN   a = n_prompt, b = max_tokens; payload: sampling parameters, then
 *           the prompt ids (the sampler's history)
 *   HIDDEN  a = T, b = pos0 << 1 | want_sample; payload: T x hidden f32
 *   TOKENS  a = T, b = pos0 << 1 | want_sample; payload: T int32 ids
 *   SAMPLE  a = id; payload: logprob, n_top, then n_top (id, logprob) pairs
 * All little-endian; floats are IEEE-754 bits. */
#include "runner/dist.h"

#include "core/alloc.h"
#include "engine/sampler.h"

#include <string.h>

enum { MSG_BEGIN = 1, MSG_HIDDEN, MSG_TOKENS, MSG_SAMPLE };

#define SAMPLING_BYTES 48

struct exo_dist {
    exo_gen_stepper base;
    exo_ring       *ring;
    bool            tensor;
    exo_model      *m;
    exo_seq        *seq;
    exo_shard_info  shard;
    float          *hidden;  /* a chunk's hidden states (max chunk x dim) */
    size_t          hidden_cap;
    float          *logits;
    /* the sampler, on the rank that has the head */
    exo_sampler    *smp;
    int32_t        *hist;
    int             n_hist, cap_hist;
};

/* ---- little-endian fields ------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void putf(unsigned char *p, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    put32(p, v);
}

static float getf(const unsigned char *p)
{
    uint32_t v = get32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

static void encode_sampling(const exo_sampler_params *sp, unsigned char *p)
{
    putf(p, sp->temperature);
    put32(p + 4, (uint32_t)sp->top_k);
    putf(p + 8, sp->top_p);
    putf(p + 12, sp->min_p);
    putf(p + 16, sp->repetition_penalty);
    put32(p + 20, (uint32_t)sp->repetition_context_size);
    putf(p + 24, sp->presence_penalty);
    putf(p + 28, sp->frequency_penalty);
    put32(p + 32, (uint32_t)sp->seed);
    put32(p + 36, (uint32_t)(sp->seed >> 32));
    put32(p + 40, (uint32_t)sp->top_logprobs);
    put32(p + 44, 0);
}

static int decode_sampling(const unsigned char *p, exo_sampler_params *sp, exo_err *err)
{
    *sp = exo_sampler_defaults();
    sp->temperature = getf(p);
    sp->top_k = (int)get32(p + 4);
    sp->top_p = getf(p + 8);
    sp->min_p = getf(p + 12);
    sp->repetition_penalty = getf(p + 16);
    sp->repetition_context_size = (int)get32(p + 20);
    sp->presence_penalty = getf(p + 24);
    sp->frequency_penalty = getf(p + 28);
    sp->seed = (uint64_t)get32(p + 32) | (uint64_t)get32(p + 36) << 32;
    sp->top_logprobs = (int)get32(p + 40);
    if (sp->top_logprobs < 0 || sp->top_logprobs > EXO_MAX_TOP_LOGPROBS || sp->top_k < 0 ||
        sp->repetition_context_size < 0 || !(sp->temperature >= 0))
        return exo_err_set(err, EXO_EFORMAT, "ring: BEGIN carries invalid sampling parameters");
    return 0;
}

/* ---- the sampler (on the rank with the head) ------------------------------------- */

static void sampler_drop(exo_dist *d)
{
    exo_sampler_free(d->smp);
    exo_free(d->hist);
    d->smp = NULL;
    d->hist = NULL;
    d->n_hist = d->cap_hist = 0;
}

static int sampler_begin(exo_dist *d, const exo_sampler_params *sp, const int32_t *prompt, int n,
                         int max_tokens, exo_err *err)
{
    sampler_drop(d);
    if (!d->logits) {
        d->logits = exo_try_malloc(sizeof(float) * (size_t)exo_model_vocab(d->m));
        if (!d->logits)
            return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    }
    d->cap_hist = n + max_tokens;
    d->hist = exo_try_malloc(sizeof(int32_t) * (size_t)(d->cap_hist ? d->cap_hist : 1));
    if (!d->hist)
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    memcpy(d->hist, prompt, sizeof(int32_t) * (size_t)n);
    d->n_hist = n;
    d->smp = exo_sampler_create(sp, exo_model_vocab(d->m));
    return 0;
}

static int sample_here(exo_dist *d, exo_sample *s, exo_err *err)
{
    if (!d->smp)
        return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked for before BEGIN");
    exo_sampler_sample(d->smp, d->logits, d->hist, d->n_hist, s);
    if (d->n_hist < d->cap_hist)
        d->hist[d->n_hist++] = s->id;
    return 0;
}

/* ---- steps ------------------------------------------------------------------------- */

static int ensure_hidden(exo_dist *d, int T, exo_err *err)
{
    size_t need = (size_t)T * (size_t)d->shard.hidden_size;
    if (need <= d->hidden_cap)
        return 0;
    float *h = exo_try_malloc(need * sizeof(float));
    if (!h)
        return exo_err_set(err, EXO_ENOMEM, "cannot hold hidden states of %d tokens", T);
    exo_free(d->hidden);
    d->hidden = h;
    d->hidden_cap = need;
    return 0;
}

/* Moves the sequence to pos0 (a frame's start): back after a cancel or for
 * a new request; never forward (positions this rank has not seen). */
static int seek(exo_dist *d, uint32_t pos0, exo_err *err)
{
    int len = exo_seq_len(d->seq);
    if ((int64_t)pos0 > len)
        return exo_err_set(err, EXO_EFORMAT, "ring: a step at position %u, this rank holds %d",
                           pos0, len);
    exo_seq_truncate(d->seq, (int)pos0);
    return 0;
}

static int send_sample(exo_dist *d, const exo_sample *s, exo_err *err)
{
    unsigned char buf[8 + 8 * EXO_MAX_TOP_LOGPROBS];
    putf(buf, s->logprob);
    put32(buf + 4, (uint32_t)s->n_top);
    for (int i = 0; i < s->n_top; i++) {
        put32(buf + 8 + 8 * i, (uint32_t)s->top_ids[i]);
        putf(buf + 12 + 8 * i, s->top_logprobs[i]);
    }
    return exo_ring_send(d->ring, MSG_SAMPLE, (uint32_t)s->id, 0, buf, 8 + 8 * (size_t)s->n_top,
                         NULL, 0, err);
}

static int recv_sample(exo_dist *d, exo_sample *s, exo_err *err)
{
    exo_ring_msg m;
    int rc = exo_ring_recv(d->ring, &m, -1, err);
    if (rc)
        return rc;
    const unsigned char *p = m.payload;
    if (m.type != MSG_SAMPLE || m.len < 8)
        return exo_err_set(err, EXO_EFORMAT, "ring: expected a sample, got frame %u", m.type);
    memset(s, 0, sizeof *s);
    s->id = (int32_t)m.a;
    s->logprob = getf(p);
    s->n_top = (int)get32(p + 4);
    if (s->id < 0 || s->id >= exo_model_vocab(d->m) || s->n_top < 0 ||
        s->n_top > EXO_MAX_TOP_LOGPROBS || m.len != 8 + 8 * (size_t)s->n_top)
        return exo_err_set(err, EXO_EFORMAT, "ring: a malformed sample");
    for (int i = 0; i < s->n_top; i++) {
        s->top_ids[i] = (int32_t)get32(p + 8 + 8 * i);
        s->top_logprobs[i] = getf(p + 12 + 8 * i);
    }
    return 0;
}

static bool is_last(const exo_dist *d) { return exo_ring_rank(d->ring) == exo_ring_world(d->ring) - 1; }

/* ---- rank 0: the stepper ------------------------------------------------------------ */

static int d_start(void *ctx, const exo_sampler_params *sp, const int32_t *prompt, int n_prompt,
                   int max_tokens, exo_err *err)
{
    exo_dist *d = ctx;
    if (d->tensor) /* rank 0 has the head and samples */
        return sampler_begin(d, sp, prompt, n_prompt, max_tokens, err);
    unsigned char params[SAMPLING_BYTES];
    encode_sampling(sp, params);
    return exo_ring_send(d->ring, MSG_BEGIN, (uint32_t)n_prompt, (uint32_t)max_tokens, params,
                         sizeof params, prompt, sizeof(int32_t) * (size_t)n_prompt, err);
}

static int d_step(void *ctx, const int32_t *tokens, int T, exo_sample *sample, exo_err *err)
{
    exo_dist *d = ctx;
    int pos0 = exo_seq_len(d->seq);
    uint32_t b = (uint32_t)pos0 << 1 | (sample != NULL);
    int rc;
    if (d->tensor) {
        if ((rc = exo_ring_send(d->ring, MSG_TOKENS, (uint32_t)T, b, tokens,
                                sizeof(int32_t) * (size_t)T, NULL, 0, err)))
            return rc;
        exo_step st = {.T = T, .tokens = tokens, .logits = sample ? d->logits : NULL};
        if ((rc = exo_model_step(d->m, d->seq, &st, err)))
            return rc;
        return sample ? sample_here(d, sample, err) : 0;
    }
    if ((rc = ensure_hidden(d, T, err)))
        return rc;
    exo_step st = {.T = T, .tokens = tokens, .hidden_out = d->hidden};
    if ((rc = exo_model_step(d->m, d->seq, &st, err)) ||
        (rc = exo_ring_send(d->ring, MSG_HIDDEN, (uint32_t)T, b, d->hidden,
                            sizeof(float) * (size_t)T * (size_t)d->shard.hidden_size, NULL, 0, err)))
        return rc;
    return sample ? recv_sample(d, sample, err) : 0;
}

static int d_len(void *ctx) { return exo_seq_len(((exo_dist *)ctx)->seq); }
static int d_capacity(void *ctx) { return exo_seq_capacity(((exo_dist *)ctx)->seq); }
/* the other ranks follow at the next frame's position */
static void d_truncate(void *ctx, int n) { exo_seq_truncate(((exo_dist *)ctx)->seq, n); }
static void d_finish(void *ctx) { sampler_drop(ctx); }

/* ---- ranks > 0 ------------------------------------------------------------------------ */

static int serve_begin(exo_dist *d, const exo_ring_msg *m, exo_err *err)
{
    int rc;
    if (!is_last(d) &&
        (rc = exo_ring_send(d->ring, MSG_BEGIN, m->a, m->b, m->payload, m->len, NULL, 0, err)))
        return rc;
    if (!is_last(d))
        return 0;
    if (m->len < SAMPLING_BYTES || m->a > (1u << 24) || m->b > (1u << 24) ||
        m->len != SAMPLING_BYTES + 4 * (size_t)m->a)
        return exo_err_set(err, EXO_EFORMAT, "ring: a malformed BEGIN");
    exo_sampler_params sp;
    if ((rc = decode_sampling(m->payload, &sp, err)))
        return rc;
    int32_t *prompt = exo_try_malloc(4 * (size_t)(m->a ? m->a : 1));
    if (!prompt)
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    memcpy(prompt, (const unsigned char *)m->payload + SAMPLING_BYTES, 4 * (size_t)m->a);
    rc = sampler_begin(d, &sp, prompt, (int)m->a, (int)m->b, err);
    exo_free(prompt);
    return rc;
}

static int serve_step(exo_dist *d, const exo_ring_msg *m, exo_err *err)
{
    int T = (int)m->a, rc;
    bool want = m->b & 1;
    size_t D = (size_t)d->shard.hidden_size;
    if (T <= 0 || T > (1 << 20))
        return exo_err_set(err, EXO_EFORMAT, "ring: a step of %d tokens", T);
    if ((rc = seek(d, m->b >> 1, err)))
        return rc;
    if (m->type == MSG_TOKENS) {
        if (!d->tensor || m->len != 4 * (size_t)T)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed TOKENS frame");
        if (!is_last(d) &&
            (rc = exo_ring_send(d->ring, MSG_TOKENS, m->a, m->b, m->payload, m->len, NULL, 0, err)))
            return rc;
        /* the payload is the ring's receive buffer, which the all-reduces
         * inside the step reuse: copy the ids out first */
        int32_t *ids = exo_try_malloc(4 * (size_t)T);
        if (!ids)
            return exo_err_set(err, EXO_ENOMEM, "out of memory");
        memcpy(ids, m->payload, 4 * (size_t)T);
        /* a sample: rank 0 needs the logits, which every rank's share of the
         * head makes together (rank 0 samples; these are dropped) */
        exo_step st = {.T = T, .tokens = ids, .logits = want ? d->logits : NULL};
        rc = exo_model_step(d->m, d->seq, &st, err);
        exo_free(ids);
        return rc;
    }
    if (d->tensor || m->len != sizeof(float) * (size_t)T * D)
        return exo_err_set(err, EXO_EFORMAT, "ring: a malformed HIDDEN frame");
    if ((rc = ensure_hidden(d, T, err)))
        return rc;
    memcpy(d->hidden, m->payload, m->len);
    if (!is_last(d)) {
        exo_step st = {.T = T, .hidden_in = d->hidden, .hidden_out = d->hidden};
        if ((rc = exo_model_step(d->m, d->seq, &st, err)))
            return rc;
        return exo_ring_send(d->ring, MSG_HIDDEN, m->a, m->b, d->hidden, m->len, NULL, 0, err);
    }
    exo_step st = {.T = T, .hidden_in = d->hidden, .logits = want ? d->logits : NULL};
    if (want && !d->logits)
        return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked for before BEGIN");
    if ((rc = exo_model_step(d->m, d->seq, &st, err)))
        return rc;
    if (!want)
        return 0;
    exo_sample s;
    if ((rc = sample_here(d, &s, err)))
        return rc;
    return send_sample(d, &s, err);
}

int exo_dist_serve(exo_dist *d, const exo_ring_msg *m, exo_err *err)
{
    switch (m->type) {
    case MSG_BEGIN:
        return serve_begin(d, m, err);
    case MSG_HIDDEN:
    case MSG_TOKENS:
        return serve_step(d, m, err);
    default:
        return exo_err_set(err, EXO_EFORMAT, "ring: unexpected frame %u at rank %d", m->type,
                           exo_ring_rank(d->ring));
    }
}

/* ---- life cycle ----------------------------------------------------------------------- */

exo_dist *exo_dist_new(exo_ring *ring, bool tensor, exo_model *m, exo_seq *seq)
{
    exo_dist *d = exo_calloc(1, sizeof *d);
    d->ring = ring;
    d->tensor = tensor;
    d->m = m;
    d->seq = seq;
    d->shard = exo_model_shard(m);
    d->base = (exo_gen_stepper){d, d_start, d_step, d_len, d_capacity, d_truncate, d_finish};
    if (d->shard.has_head)
        d->logits = exo_try_malloc(sizeof(float) * (size_t)exo_model_vocab(m));
    return d;
}

void exo_dist_free(exo_dist *d)
{
    if (!d)
        return;
    sampler_drop(d);
    exo_free(d->hidden);
    exo_free(d->logits);
    exo_free(d);
}

exo_gen_stepper *exo_dist_stepper(exo_dist *d) { return &d->base; }

int exo_dist_allreduce(void *ring, float *x, size_t n, exo_err *err)
{
    return exo_ring_allreduce(ring, x, n, err);
}

int exo_dist_allgather(void *ring, float *x, const size_t *bounds, exo_err *err)
{
    return exo_ring_allgather(ring, x, bounds, err);
}
