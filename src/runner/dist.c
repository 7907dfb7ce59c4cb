/* Split-model generation over the ring (see dist.h).
 *
 * The frames are dist_frames.h's. Slots let several requests be in flight
 * through a pipeline: each rank keeps a sequence (and the last rank a
 * sampler) per slot, and frames of different slots interleave. A group
 * that batches (rank 0's continuous batching) has batch slots instead,
 * whose sequences SEQ frames make on every rank; in a pipeline the last
 * rank keeps their samplers, indexed as the slots are. */
#include "runner/dist.h"

#include "runner/dist_frames.h"

#include "core/alloc.h"
#include "engine/sampler.h"

#include <string.h>

/* What a rank keeps per pipeline slot: its cache. */
typedef struct slot {
    exo_seq *seq;
} slot;

struct exo_dist {
    exo_gen_stepper base;   /* drives slot 0 */
    exo_ring       *ring;
    bool            tensor;
    exo_model      *m;
    slot            slots[EXO_DIST_MAX_SLOTS];
    int             n_slots;
    exo_shard_info  shard;
    float          *hidden; /* a chunk's hidden states (max chunk x dim) */
    size_t          hidden_cap;
    float          *logits;
    /* on the rank that samples, a sampler per slot (pipeline or batch
     * slot), which keeps the history its penalties look at */
    exo_sampler    *smp[EXO_DIST_MAX_BATCH];
    /* ranks > 0 of a group that batches: the batch slots' sequences ([0]
     * is slot 0's), made by rank 0's SEQ frames, and the logits of a
     * batched step (which rank 0 of a tensor group samples from, the last
     * rank of a pipeline) */
    exo_seq        *bseqs[EXO_DIST_MAX_BATCH];
    float          *blogits;
    /* ranks > 0: the prefix-cache entries rank 0's KEEP frames made */
    struct {
        int            id;
        exo_kv_prefix *p;
    } kept[EXO_DIST_MAX_KEPT];
    int n_kept;
};

/* ---- the sampler (on the rank with the head) ------------------------------------- */

static void sampler_drop(exo_dist *d, int i)
{
    exo_sampler_free(d->smp[i]);
    d->smp[i] = NULL;
}

static int sampler_begin(exo_dist *d, int i, const exo_sampler_params *sp, const int32_t *prompt, int n,
                         int max_tokens, exo_err *err)
{
    sampler_drop(d, i);
    if (!d->logits)
        return exo_err_set(err, EXO_EFORMAT, "ring: a sampler on a rank without the head");
    d->smp[i] = exo_sampler_create(sp, exo_model_vocab(d->m));
    if (exo_sampler_begin(d->smp[i], prompt, n, max_tokens))
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    return 0;
}

/* Slot i's next sample from logits (one row of the vocabulary). */
static int sample_here(exo_dist *d, int i, float *logits, exo_sample *s, exo_err *err)
{
    if (!d->smp[i])
        return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked for before BEGIN");
    exo_sampler_next(d->smp[i], logits, s);
    return 0;
}

/* ---- steps ------------------------------------------------------------------------- */

static int slot_of(exo_dist *d, uint32_t i, slot **out, exo_err *err)
{
    if (i >= (uint32_t)d->n_slots)
        return exo_err_set(err, EXO_EFORMAT, "ring: sequence slot %u of %d", i, d->n_slots);
    *out = &d->slots[i];
    return 0;
}

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

/* Moves a sequence to pos0 (a frame's start): back after a cancel or for
 * a new request; never forward (positions this rank has not seen). */
static int seek(exo_seq *seq, uint32_t pos0, exo_err *err)
{
    int len = exo_seq_len(seq);
    if ((int64_t)pos0 > len)
        return exo_err_set(err, EXO_EFORMAT, "ring: a step at position %u, this rank holds %d",
                           pos0, len);
    exo_seq_truncate(seq, (int)pos0);
    return 0;
}

static exo_dist_shape shape_of(const exo_dist *d)
{
    return (exo_dist_shape){d->n_slots, exo_model_vocab(d->m), d->shard.hidden_size, d->tensor};
}

static int send_sample(exo_dist *d, int slot_i, const exo_sample *s, exo_err *err)
{
    unsigned char buf[EXO_DIST_SAMPLE_MAX];
    size_t n = exo_dist_encode_sample(s, buf);
    return exo_ring_send(d->ring, EXO_DIST_SAMPLE, (uint32_t)s->id, (uint32_t)slot_i, buf, n, NULL, 0,
                         err);
}

int exo_dist_recv_sample(exo_dist *d, int *slot_i, exo_sample *s, exo_err *err)
{
    exo_ring_msg m;
    exo_dist_frame f;
    exo_dist_shape sh = shape_of(d);
    int rc = exo_ring_recv(d->ring, &m, -1, err);
    if (rc || (rc = exo_dist_frame_parse(&m, &sh, &f, err)))
        return rc;
    if (f.type != EXO_DIST_SAMPLE)
        return exo_err_set(err, EXO_EFORMAT, "ring: expected a sample, got frame %u", f.type);
    *slot_i = f.slot;
    *s = f.sample;
    return 0;
}

static bool is_last(const exo_dist *d) { return exo_ring_rank(d->ring) == exo_ring_world(d->ring) - 1; }

/* ---- rank 0 ------------------------------------------------------------------------- */

int exo_dist_begin(exo_dist *d, int slot_i, const exo_sampler_params *sp, const int32_t *prompt,
                   int n_prompt, int max_tokens, exo_err *err)
{
    if (slot_i < 0 || slot_i >= EXO_DIST_MAX_BATCH)
        return exo_err_set(err, EXO_EINVAL, "dist: slot %d", slot_i);
    if (d->tensor) /* rank 0 samples */
        return sampler_begin(d, slot_i, sp, prompt, n_prompt, max_tokens, err);
    unsigned char params[EXO_DIST_SAMPLING_BYTES];
    exo_dist_encode_sampling(sp, slot_i, params);
    return exo_ring_send(d->ring, EXO_DIST_BEGIN, (uint32_t)n_prompt, (uint32_t)max_tokens, params,
                         sizeof params, prompt, sizeof(int32_t) * (size_t)n_prompt, err);
}

int exo_dist_send_step(exo_dist *d, int slot_i, const int32_t *tokens, int T, bool want_sample,
                       exo_err *err)
{
    slot *sl = NULL;
    int rc = slot_of(d, (uint32_t)slot_i, &sl, err);
    if (rc)
        return rc;
    if (d->tensor)
        return exo_err_set(err, EXO_EINVAL, "a tensor-parallel step is not sent ahead");
    int pos0 = exo_seq_len(sl->seq);
    if ((rc = ensure_hidden(d, T, err)))
        return rc;
    exo_step st = {.T = T, .tokens = tokens, .hidden_out = d->hidden};
    if ((rc = exo_model_step(d->m, sl->seq, &st, err)))
        return rc;
    return exo_ring_send(d->ring, EXO_DIST_HIDDEN, (uint32_t)T, exo_dist_step_bits(pos0, slot_i, want_sample),
                         d->hidden, sizeof(float) * (size_t)T * (size_t)d->shard.hidden_size, NULL,
                         0, err);
}

int exo_dist_seq_resize(exo_dist *d, int bslot, int keep, int capacity, exo_err *err)
{
    unsigned char p[8];
    if (bslot < 0 || bslot >= EXO_DIST_MAX_BATCH)
        return exo_err_set(err, EXO_EINVAL, "dist: batch slot %d", bslot);
    exo_dist_encode_seq(capacity, keep, p);
    return exo_ring_send(d->ring, EXO_DIST_SEQ, (uint32_t)bslot, EXO_DIST_SEQ_RESIZE, p, sizeof p, NULL, 0, err);
}

int exo_dist_seq_copy(exo_dist *d, int bslot, int from, int n, exo_err *err)
{
    unsigned char p[8];
    if (bslot < 0 || bslot >= EXO_DIST_MAX_BATCH || from < 0 || from >= EXO_DIST_MAX_BATCH)
        return exo_err_set(err, EXO_EINVAL, "dist: batch slots %d, %d", bslot, from);
    exo_dist_encode_seq(from, n, p);
    return exo_ring_send(d->ring, EXO_DIST_SEQ, (uint32_t)bslot, EXO_DIST_SEQ_COPY, p, sizeof p, NULL, 0, err);
}

static int send_prefix_op(exo_dist *d, int op, int bslot, int id, int n, exo_err *err)
{
    unsigned char p[8];
    if (bslot < 0 || bslot >= EXO_DIST_MAX_BATCH || id < 0)
        return exo_err_set(err, EXO_EINVAL, "dist: prefix entry %d of batch slot %d", id, bslot);
    exo_dist_encode_seq(id, n, p);
    return exo_ring_send(d->ring, EXO_DIST_SEQ, (uint32_t)bslot, (uint32_t)op, p, sizeof p, NULL, 0, err);
}

int exo_dist_prefix_keep(exo_dist *d, int bslot, int id, int n, exo_err *err)
{
    return send_prefix_op(d, EXO_DIST_SEQ_KEEP, bslot, id, n, err);
}

int exo_dist_prefix_take(exo_dist *d, int bslot, int id, int n, exo_err *err)
{
    return send_prefix_op(d, EXO_DIST_SEQ_TAKE, bslot, id, n, err);
}

int exo_dist_prefix_drop(exo_dist *d, int id, exo_err *err)
{
    return send_prefix_op(d, EXO_DIST_SEQ_DROP, 0, id, 0, err);
}

int exo_dist_send_batch(exo_dist *d, int n, const int *slots, const int *pos0, const int *T,
                        const int32_t *const *tokens, bool logits, exo_err *err)
{
    if (!d->tensor || n < 1 || n > EXO_DIST_BATCH_ROWS)
        return exo_err_set(err, EXO_EINVAL, "dist: a batch of %d rows", n);
    size_t len = exo_dist_batch_bytes(n, T);
    unsigned char *p = exo_try_malloc(len);
    if (!p)
        return exo_err_set(err, EXO_ENOMEM, "dist: out of memory");
    exo_dist_encode_batch(n, slots, pos0, T, tokens, p);
    int rc = exo_ring_send(d->ring, EXO_DIST_BATCH, (uint32_t)n, logits ? 1 : 0, p, len, NULL, 0, err);
    exo_free(p);
    return rc;
}

int exo_dist_pipe_send(exo_dist *d, int n, const exo_batch_item *items, const int *bslot, const bool *want,
                       exo_err *err)
{
    if (d->tensor || n < 1 || n > EXO_DIST_BATCH_ROWS)
        return exo_err_set(err, EXO_EINVAL, "dist: a pipeline's batch of %d rows", n);
    int pos0[EXO_DIST_BATCH_ROWS], T[EXO_DIST_BATCH_ROWS], rows = 0;
    for (int k = 0; k < n; k++) {
        if (bslot[k] < 0 || bslot[k] >= EXO_DIST_MAX_BATCH)
            return exo_err_set(err, EXO_EINVAL, "dist: batch slot %d", bslot[k]);
        pos0[k] = exo_seq_len(items[k].seq);
        T[k] = items[k].T;
        rows += T[k];
    }
    int rc = ensure_hidden(d, rows, err);
    if (rc || (rc = exo_model_step_batch_shard(d->m, items, n, NULL, d->hidden, NULL, NULL, err)))
        return rc;
    unsigned char head[16 * EXO_DIST_BATCH_ROWS];
    exo_dist_encode_rows(n, bslot, pos0, T, want, head);
    return exo_ring_send(d->ring, EXO_DIST_ROWS, (uint32_t)n, 0, head, 16 * (size_t)n, d->hidden,
                         sizeof(float) * (size_t)rows * (size_t)d->shard.hidden_size, err);
}

int exo_dist_pipe_recv(exo_dist *d, int n, const int *bslot, const bool *want, exo_sample *samples, exo_err *err)
{
    for (int k = 0; k < n; k++) { /* they come back in row order */
        if (!want[k])
            continue;
        int got, rc = exo_dist_recv_sample(d, &got, &samples[k], err);
        if (rc)
            return rc;
        if (got != bslot[k])
            return exo_err_set(err, EXO_EFORMAT, "ring: a sample for slot %d, row %d is slot %d's", got, k, bslot[k]);
    }
    return 0;
}

int exo_dist_pipe_rows(exo_dist *d, int n, const exo_batch_item *items, const int *bslot, const bool *want,
                       exo_sample *samples, exo_err *err)
{
    int rc = exo_dist_pipe_send(d, n, items, bslot, want, err);
    return rc ? rc : exo_dist_pipe_recv(d, n, bslot, want, samples, err);
}

int exo_dist_generate_batch(exo_dist *d, int n, const int32_t *const *prompts, const int *n_prompts,
                            const exo_gen_params *p, exo_gen_token_fn on_token, void *const *ctx,
                            exo_gen_stats *stats, exo_err *err)
{
    if (n < 1 || n > d->n_slots || d->tensor)
        return exo_err_set(err, EXO_EINVAL, "a batch of %d on %d pipeline slots", n, d->n_slots);
    exo_gen_seq *g[EXO_DIST_MAX_SLOTS] = {0};
    bool waiting[EXO_DIST_MAX_SLOTS] = {0};
    int rc = 0, live = n;
    for (int i = 0; i < n && !rc; i++) {
        exo_seq_truncate(d->slots[i].seq, 0);
        g[i] = exo_gen_seq_new(prompts[i], n_prompts[i], 0, exo_seq_capacity(d->slots[i].seq), p,
                               on_token, ctx[i]);
        rc = exo_dist_begin(d, i, &p->sampling, prompts[i], n_prompts[i], p->max_tokens, err);
    }
    while (!rc && live) {
        for (int i = 0; i < n && !rc; i++) {
            const int32_t *tokens;
            int T;
            bool want;
            if (waiting[i] || !exo_gen_seq_next(g[i], &tokens, &T, &want))
                continue;
            if (!(rc = exo_dist_send_step(d, i, tokens, T, want, err))) {
                exo_gen_seq_stepped(g[i]);
                waiting[i] = want;
                live -= exo_gen_seq_done(g[i]); /* cancelled in its prefill */
            }
        }
        bool any = false;
        for (int i = 0; i < n; i++)
            any |= waiting[i];
        if (rc || !any)
            continue;
        int i;
        exo_sample s;
        if ((rc = exo_dist_recv_sample(d, &i, &s, err)))
            break;
        if (i >= n || !waiting[i]) {
            rc = exo_err_set(err, EXO_EFORMAT, "ring: a sample for slot %d, which waits for none", i);
            break;
        }
        waiting[i] = false;
        if (!exo_gen_seq_sampled(g[i], &s))
            live--;
    }
    for (int i = 0; i < n; i++) {
        if (g[i])
            exo_gen_seq_stats(g[i], &stats[i]);
        exo_gen_seq_free(g[i]);
    }
    return rc;
}

static int d_start(void *ctx, const exo_sampler_params *sp, const int32_t *prompt, int n_prompt,
                   int max_tokens, exo_err *err)
{
    return exo_dist_begin(ctx, 0, sp, prompt, n_prompt, max_tokens, err);
}

static int d_step(void *ctx, const int32_t *tokens, int T, exo_sample *sample, exo_err *err)
{
    exo_dist *d = ctx;
    slot *sl = &d->slots[0];
    int rc;
    if (!d->tensor) {
        int got = -1;
        if ((rc = exo_dist_send_step(d, 0, tokens, T, sample != NULL, err)) || !sample ||
            (rc = exo_dist_recv_sample(d, &got, sample, err)))
            return rc;
        return got == 0 ? 0 : exo_err_set(err, EXO_EFORMAT, "ring: a sample for slot %d", got);
    }
    int pos0 = exo_seq_len(sl->seq);
    if ((rc = exo_ring_send(d->ring, EXO_DIST_TOKENS, (uint32_t)T, exo_dist_step_bits(pos0, 0, sample != NULL),
                            tokens, sizeof(int32_t) * (size_t)T, NULL, 0, err)))
        return rc;
    exo_step st = {.T = T, .tokens = tokens, .logits = sample ? d->logits : NULL};
    if ((rc = exo_model_step(d->m, sl->seq, &st, err)))
        return rc;
    return sample ? sample_here(d, 0, d->logits, sample, err) : 0;
}

static int d_len(void *ctx) { return exo_seq_len(((exo_dist *)ctx)->slots[0].seq); }
static int d_capacity(void *ctx) { return exo_seq_capacity(((exo_dist *)ctx)->slots[0].seq); }
/* the other ranks follow at the next frame's position */
static void d_truncate(void *ctx, int n) { exo_seq_truncate(((exo_dist *)ctx)->slots[0].seq, n); }
static void d_finish(void *ctx) { sampler_drop(ctx, 0); }

/* ---- ranks > 0 ------------------------------------------------------------------------ */

static int serve_begin(exo_dist *d, const exo_ring_msg *m, const exo_dist_frame *f, exo_err *err)
{
    if (!is_last(d))
        return exo_ring_send(d->ring, EXO_DIST_BEGIN, m->a, m->b, m->payload, m->len, NULL, 0, err);
    int32_t *prompt = exo_try_malloc(4 * (size_t)(f->n_prompt ? f->n_prompt : 1));
    if (!prompt)
        return exo_err_set(err, EXO_ENOMEM, "generate: out of memory");
    exo_dist_frame_prompt(f, prompt);
    int rc = sampler_begin(d, f->slot, &f->sampling, prompt, f->n_prompt, f->max_tokens, err);
    exo_free(prompt);
    return rc;
}

static int serve_step(exo_dist *d, const exo_ring_msg *m, const exo_dist_frame *f, exo_err *err)
{
    slot *sl = &d->slots[f->slot];
    int T = f->T, rc;
    if ((rc = seek(sl->seq, (uint32_t)f->pos0, err)))
        return rc;
    if (f->type == EXO_DIST_TOKENS) {
        if (!is_last(d) &&
            (rc = exo_ring_send(d->ring, EXO_DIST_TOKENS, m->a, m->b, m->payload, m->len, NULL, 0, err)))
            return rc;
        /* the payload is the ring's receive buffer, which the collectives
         * inside the step reuse: copy the ids out first */
        int32_t *ids = exo_try_malloc(4 * (size_t)T);
        if (!ids)
            return exo_err_set(err, EXO_ENOMEM, "out of memory");
        memcpy(ids, f->data, 4 * (size_t)T);
        /* a sample: rank 0 needs the logits, which every rank's share of the
         * head makes together (rank 0 samples; these are dropped) */
        exo_step st = {.T = T, .tokens = ids, .logits = f->want_sample ? d->logits : NULL};
        rc = exo_model_step(d->m, sl->seq, &st, err);
        exo_free(ids);
        return rc;
    }
    /* a pipeline step has no collective inside: the frame's payload stays
     * valid through it and is the input as it is */
    const float *in = f->data;
    if (!is_last(d)) {
        if ((rc = ensure_hidden(d, T, err)))
            return rc;
        exo_step st = {.T = T, .hidden_in = in, .hidden_out = d->hidden};
        if ((rc = exo_model_step(d->m, sl->seq, &st, err)))
            return rc;
        return exo_ring_send(d->ring, EXO_DIST_HIDDEN, m->a, m->b, d->hidden, m->len, NULL, 0, err);
    }
    if (f->want_sample && !d->logits)
        return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked of a rank without the head");
    exo_pick_rule rule; /* the token picked where the logits are, where its rule lets it */
    bool ruled = f->want_sample && d->smp[f->slot] && exo_sampler_pick_rule(d->smp[f->slot], &rule);
    exo_step st = {.T = T, .hidden_in = in, .logits = f->want_sample ? d->logits : NULL, .pick = ruled ? &rule : NULL};
    if ((rc = exo_model_step(d->m, sl->seq, &st, err)))
        return rc;
    if (!f->want_sample)
        return 0;
    exo_sample s;
    if (st.token.picked)
        exo_sampler_take(d->smp[f->slot], &st.token, &s);
    else if ((rc = sample_here(d, f->slot, d->logits, &s, err)))
        return rc;
    return send_sample(d, f->slot, &s, err);
}

/* A batch slot's sequence on a rank > 0 (slot 0's is the stepper's). */
static exo_seq **bseq_at(exo_dist *d, int bslot)
{
    if (!d->bseqs[0])
        d->bseqs[0] = d->slots[0].seq;
    return &d->bseqs[bslot];
}

/* KEEP, TAKE and DROP of the prefix cache's entries, on slot s. */
static int serve_prefix(exo_dist *d, const exo_dist_frame *f, exo_seq *s, exo_err *err)
{
    int at = 0;
    while (at < d->n_kept && d->kept[at].id != f->x)
        at++;
    if (f->seq_op == EXO_DIST_SEQ_KEEP) {
        if (at < d->n_kept || d->n_kept == EXO_DIST_MAX_KEPT || !s)
            return exo_err_set(err, EXO_EFORMAT, "ring: KEEP of entry %d (held %d of %d) from slot %d", f->x,
                               d->n_kept, EXO_DIST_MAX_KEPT, f->slot);
        int rc = exo_seq_keep_prefix(s, f->y, &d->kept[at].p, err);
        if (rc)
            return rc;
        d->kept[at].id = f->x;
        d->n_kept++;
        return 0;
    }
    if (at == d->n_kept)
        return exo_err_set(err, EXO_EFORMAT, "ring: SEQ %d of entry %d, which this rank does not hold", f->seq_op,
                           f->x);
    if (f->seq_op == EXO_DIST_SEQ_TAKE) {
        if (!s)
            return exo_err_set(err, EXO_EFORMAT, "ring: TAKE into slot %d, which has no sequence", f->slot);
        return exo_seq_take_prefix(s, d->kept[at].p, f->y, err);
    }
    exo_kv_prefix_free(d->kept[at].p);
    d->kept[at] = d->kept[--d->n_kept];
    return 0;
}

static int serve_seq(exo_dist *d, const exo_ring_msg *m, const exo_dist_frame *f, exo_err *err)
{
    int rc;
    if (!is_last(d) && (rc = exo_ring_send(d->ring, EXO_DIST_SEQ, m->a, m->b, m->payload, m->len, NULL, 0, err)))
        return rc;
    exo_seq **s = bseq_at(d, f->slot);
    if (f->seq_op == EXO_DIST_SEQ_RESIZE) {
        if (!*s)
            return exo_seq_create(d->m, f->x, s, err);
        exo_seq_truncate(*s, f->y); /* as rank 0's: a no-op past the length */
        return exo_seq_resize(*s, f->x, err);
    }
    if (f->seq_op != EXO_DIST_SEQ_COPY)
        return serve_prefix(d, f, *s, err);
    exo_seq *from = *bseq_at(d, f->x);
    if (!*s || !from)
        return exo_err_set(err, EXO_EFORMAT, "ring: SEQ copies between slots %d and %d, one of them empty", f->x,
                           f->slot);
    return exo_seq_copy_prefix(*s, from, f->y, err);
}

/* A batched step: each row's sequence moves to the row's position, then
 * the step runs as rank 0 runs it (the collectives inside pair up). */
static int serve_batch(exo_dist *d, const exo_ring_msg *m, const exo_dist_frame *f, exo_err *err)
{
    int rc;
    if (!is_last(d) && (rc = exo_ring_send(d->ring, EXO_DIST_BATCH, m->a, m->b, m->payload, m->len, NULL, 0, err)))
        return rc;
    if (f->want_logits && !d->blogits)
        d->blogits = exo_model_logits_alloc(d->m, EXO_DIST_BATCH_ROWS);
    /* the payload is the ring's receive buffer, which the collectives
     * inside the step reuse: the ids are copied out first */
    int32_t *ids = exo_try_malloc(m->len);
    if (!ids)
        return exo_err_set(err, EXO_ENOMEM, "out of memory");
    exo_batch_item items[EXO_DIST_BATCH_ROWS];
    size_t at = 0;
    rc = 0;
    for (int i = 0; i < f->n_rows; i++) {
        int bslot, pos0, T;
        exo_dist_frame_batch_row(f, i, &bslot, &pos0, &T, ids + at);
        exo_seq *s = *bseq_at(d, bslot);
        if (!s) {
            rc = exo_err_set(err, EXO_EFORMAT, "ring: BATCH row %d on slot %d, which has no sequence", i, bslot);
            break;
        }
        if ((rc = seek(s, (uint32_t)pos0, err)))
            break;
        items[i] = (exo_batch_item){.seq = s, .tokens = ids + at, .T = T};
        at += (size_t)T;
    }
    if (!rc) {
        float *logits = f->want_logits ? d->blogits : NULL;
        if (f->n_rows == 1) {
            exo_step st = {.T = items[0].T, .tokens = items[0].tokens, .logits = logits};
            rc = exo_model_step(d->m, items[0].seq, &st, err);
        } else {
            rc = exo_model_step_batch(d->m, items, f->n_rows, logits, NULL, err);
        }
    }
    exo_free(ids);
    return rc;
}

/* A pipeline's batched step: each row's sequence moves to the row's
 * position, the rows run through this rank's layers together, and go on
 * to the next rank, or, on the last, are sampled (a pipeline step has no
 * collective inside: the frame's payload stays valid through it). */
static int serve_rows(exo_dist *d, const exo_ring_msg *m, const exo_dist_frame *f, exo_err *err)
{
    exo_batch_item items[EXO_DIST_BATCH_ROWS];
    int bslot[EXO_DIST_BATCH_ROWS];
    bool want[EXO_DIST_BATCH_ROWS], any = false;
    int rc;
    for (int i = 0; i < f->n_rows; i++) {
        int pos0, T;
        exo_dist_frame_rows_row(f, i, &bslot[i], &pos0, &T, &want[i]);
        exo_seq *s = *bseq_at(d, bslot[i]);
        if (!s)
            return exo_err_set(err, EXO_EFORMAT, "ring: ROWS row %d on slot %d, which has no sequence", i, bslot[i]);
        if ((rc = seek(s, (uint32_t)pos0, err)))
            return rc;
        items[i] = (exo_batch_item){.seq = s, .tokens = NULL, .T = T};
        any |= want[i];
    }
    if (!is_last(d)) {
        if ((rc = ensure_hidden(d, f->T_total, err)) ||
            (rc = exo_model_step_batch_shard(d->m, items, f->n_rows, f->data, d->hidden, NULL, NULL, err)))
            return rc;
        return exo_ring_send(d->ring, EXO_DIST_ROWS, m->a, m->b, m->payload, 16 * (size_t)f->n_rows, d->hidden,
                             sizeof(float) * (size_t)f->T_total * (size_t)d->shard.hidden_size, err);
    }
    if (any && !d->logits)
        return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked of a rank without the head");
    if (any && !d->blogits)
        d->blogits = exo_model_logits_alloc(d->m, EXO_DIST_BATCH_ROWS);
    float *logits = any ? d->blogits : NULL;
    exo_pick picks[EXO_DIST_BATCH_ROWS];
    exo_pick_rule rules[EXO_DIST_BATCH_ROWS];
    for (int i = 0; i < f->n_rows; i++) /* a row's token picked where the logits are, where its rule lets it */
        if (want[i] && d->smp[bslot[i]] && exo_sampler_pick_rule(d->smp[bslot[i]], &rules[i]))
            items[i].pick = &rules[i];
    if ((rc = exo_model_step_batch_shard(d->m, items, f->n_rows, f->data, NULL, logits, picks, err)))
        return rc;
    exo_sample out[EXO_DIST_BATCH_ROWS];
    exo_sampler *smp[EXO_DIST_BATCH_ROWS]; /* NULL: the row wants no sample */
    for (int i = 0; i < f->n_rows; i++) {
        if (want[i] && !d->smp[bslot[i]])
            return exo_err_set(err, EXO_EFORMAT, "ring: a sample asked for before BEGIN");
        smp[i] = want[i] ? d->smp[bslot[i]] : NULL;
    }
    if (any) /* the rows not picked side by side on the model's CPU threads */
        exo_sampler_rows(exo_model_host_pool(d->m), smp, picks, logits, out, f->n_rows);
    for (int i = 0; i < f->n_rows && any; i++)
        if (want[i] && (rc = send_sample(d, bslot[i], &out[i], err)))
            return rc;
    return 0;
}

int exo_dist_serve(exo_dist *d, const exo_ring_msg *m, exo_err *err)
{
    exo_dist_frame f;
    exo_dist_shape sh = shape_of(d);
    int rc = exo_dist_frame_parse(m, &sh, &f, err);
    if (rc)
        return rc;
    switch (f.type) {
    case EXO_DIST_BEGIN:
        return serve_begin(d, m, &f, err);
    case EXO_DIST_HIDDEN:
    case EXO_DIST_TOKENS:
        return serve_step(d, m, &f, err);
    case EXO_DIST_SEQ:
        return serve_seq(d, m, &f, err);
    case EXO_DIST_BATCH:
        return serve_batch(d, m, &f, err);
    case EXO_DIST_ROWS:
        return serve_rows(d, m, &f, err);
    default:
        return exo_err_set(err, EXO_EFORMAT, "ring: unexpected frame %u at rank %d", m->type,
                           exo_ring_rank(d->ring));
    }
}

/* ---- life cycle ----------------------------------------------------------------------- */

exo_dist *exo_dist_new(exo_ring *ring, bool tensor, exo_model *m, exo_seq *const *seqs, int n_seqs)
{
    exo_dist *d = exo_calloc(1, sizeof *d);
    d->ring = ring;
    d->tensor = tensor;
    d->m = m;
    d->n_slots = n_seqs < EXO_DIST_MAX_SLOTS ? n_seqs : EXO_DIST_MAX_SLOTS;
    for (int i = 0; i < d->n_slots; i++)
        d->slots[i].seq = seqs[i];
    d->shard = exo_model_shard(m);
    d->base = (exo_gen_stepper){d, d_start, d_step, d_len, d_capacity, d_truncate, d_finish};
    if (d->shard.has_head)
        d->logits = exo_model_logits_alloc(m, 1);
    return d;
}

void exo_dist_free(exo_dist *d)
{
    if (!d)
        return;
    for (int i = 0; i < EXO_DIST_MAX_BATCH; i++)
        sampler_drop(d, i);
    for (int i = 0; i < d->n_kept; i++)
        exo_kv_prefix_free(d->kept[i].p);
    for (int i = 1; i < EXO_DIST_MAX_BATCH; i++)
        exo_seq_free(d->bseqs[i]);
    if (d->blogits)
        exo_model_logits_free(d->m, d->blogits);
    exo_free(d->hidden);
    if (d->logits)
        exo_model_logits_free(d->m, d->logits);
    exo_free(d);
}

exo_gen_stepper *exo_dist_stepper(exo_dist *d) { return &d->base; }

int exo_dist_allreduce(void *ring, float *x, size_t rows, size_t cols, exo_err *err)
{
    return exo_ring_allreduce(ring, x, rows, cols, err);
}

int exo_dist_allgather(void *ring, float *x, const size_t *bounds, exo_err *err)
{
    return exo_ring_allgather(ring, x, bounds, err);
}
