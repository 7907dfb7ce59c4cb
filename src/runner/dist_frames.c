/* Ring frames of a split model: encoders and the checking parser (see
 * dist_frames.h). */
#include "runner/dist_frames.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

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

void exo_dist_encode_sampling(const exo_sampler_params *sp, int slot,
                              unsigned char p[EXO_DIST_SAMPLING_BYTES])
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
    put32(p + 44, (uint32_t)slot);
}

uint32_t exo_dist_step_bits(int pos0, int slot, bool want_sample)
{
    return (uint32_t)pos0 << 4 | (uint32_t)slot << 1 | (want_sample ? 1u : 0u);
}

size_t exo_dist_encode_sample(const exo_sample *s, unsigned char out[EXO_DIST_SAMPLE_MAX])
{
    putf(out, s->logprob);
    put32(out + 4, (uint32_t)s->n_top);
    for (int i = 0; i < s->n_top; i++) {
        put32(out + 8 + 8 * i, (uint32_t)s->top_ids[i]);
        putf(out + 12 + 8 * i, s->top_logprobs[i]);
    }
    return 8 + 8 * (size_t)s->n_top;
}

static bool is_finite(float v) { return isfinite(v); }

static int parse_sampling(const unsigned char *p, exo_sampler_params *sp, exo_err *err)
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
        sp->repetition_context_size < 0 || !(sp->temperature >= 0) || !is_finite(sp->temperature) ||
        !(sp->top_p >= 0 && sp->top_p <= 1) || !(sp->min_p >= 0 && sp->min_p <= 1) ||
        !(sp->repetition_penalty > 0) || !is_finite(sp->repetition_penalty) ||
        !is_finite(sp->presence_penalty) || !is_finite(sp->frequency_penalty))
        return exo_err_set(err, EXO_EFORMAT, "ring: BEGIN carries invalid sampling parameters");
    return 0;
}

int exo_dist_frame_parse(const exo_ring_msg *m, const exo_dist_shape *sh, exo_dist_frame *f,
                         exo_err *err)
{
    memset(f, 0, sizeof *f);
    f->type = m->type;
    const unsigned char *p = m->payload;
    int rc;
    switch (m->type) {
    case EXO_DIST_BEGIN:
        if (sh->tensor)
            return exo_err_set(err, EXO_EFORMAT, "ring: BEGIN in a tensor-parallel group");
        if (m->len < EXO_DIST_SAMPLING_BYTES || m->a > (1u << 24) || m->b > (1u << 24) ||
            m->len != EXO_DIST_SAMPLING_BYTES + 4 * (size_t)m->a)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed BEGIN");
        if ((rc = parse_sampling(p, &f->sampling, err)))
            return rc;
        f->slot = (int)get32(p + 44);
        if (get32(p + 44) >= EXO_DIST_MAX_BATCH) /* a batch slot at most (the pipeline's slots are fewer) */
            return exo_err_set(err, EXO_EFORMAT, "ring: BEGIN of slot %u", get32(p + 44));
        f->n_prompt = (int)m->a;
        f->max_tokens = (int)m->b;
        f->prompt = p + EXO_DIST_SAMPLING_BYTES;
        for (int i = 0; i < f->n_prompt; i++) {
            uint32_t id = get32(f->prompt + 4 * i);
            if (id >= (uint32_t)sh->vocab)
                return exo_err_set(err, EXO_EFORMAT, "ring: BEGIN: token id %u out of range", id);
        }
        return 0;
    case EXO_DIST_HIDDEN:
    case EXO_DIST_TOKENS:
        f->T = (int)(m->a <= EXO_DIST_MAX_STEP ? m->a : 0);
        f->want_sample = m->b & 1;
        f->slot = (int)(m->b >> 1 & 7);
        f->pos0 = (int)(m->b >> 4);
        f->data = m->payload;
        if (f->T <= 0 || f->pos0 > EXO_DIST_MAX_POS)
            return exo_err_set(err, EXO_EFORMAT, "ring: a step of %u tokens at %u", m->a, m->b >> 4);
        if (m->type == EXO_DIST_TOKENS && (!sh->tensor || m->len != 4 * (size_t)f->T))
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed TOKENS frame");
        if (m->type == EXO_DIST_HIDDEN &&
            (sh->tensor || m->len != sizeof(float) * (size_t)f->T * (size_t)sh->hidden_size))
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed HIDDEN frame");
        break;
    case EXO_DIST_SAMPLE: {
        exo_sample *s = &f->sample;
        if (m->len < 8)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed sample");
        if (m->b >= EXO_DIST_MAX_BATCH)
            return exo_err_set(err, EXO_EFORMAT, "ring: a sample for slot %u", m->b);
        f->slot = (int)m->b;
        s->id = (int32_t)m->a;
        s->logprob = getf(p);
        uint32_t n_top = get32(p + 4);
        if (m->a >= (uint32_t)sh->vocab || n_top > EXO_MAX_TOP_LOGPROBS ||
            m->len != 8 + 8 * (size_t)n_top)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed sample");
        s->n_top = (int)n_top;
        for (int i = 0; i < s->n_top; i++) {
            uint32_t id = get32(p + 8 + 8 * i);
            if (id >= (uint32_t)sh->vocab)
                return exo_err_set(err, EXO_EFORMAT, "ring: a sample's alternative %u out of range", id);
            s->top_ids[i] = (int32_t)id;
            s->top_logprobs[i] = getf(p + 12 + 8 * i);
        }
        return 0; /* a pipeline's slot or a batch slot: the receiver checks it is one it waits for */
    }
    case EXO_DIST_SEQ:
        if (m->len != 8 || m->a >= EXO_DIST_MAX_BATCH || m->b < EXO_DIST_SEQ_RESIZE ||
            m->b > EXO_DIST_SEQ_DROP)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed SEQ frame");
        f->seq_op = (int)m->b;
        uint32_t x = get32(p), y = get32(p + 4);
        bool bad;
        switch (m->b) {
        case EXO_DIST_SEQ_RESIZE: bad = x < 1 || x > EXO_DIST_MAX_POS || y > x; break;
        case EXO_DIST_SEQ_COPY: bad = x >= EXO_DIST_MAX_BATCH || x == m->a || y > EXO_DIST_MAX_POS; break;
        case EXO_DIST_SEQ_DROP: bad = x > INT32_MAX || y != 0; break;
        default: bad = x > INT32_MAX || y < 1 || y > EXO_DIST_MAX_POS; break; /* KEEP, TAKE: an entry id */
        }
        if (bad)
            return exo_err_set(err, EXO_EFORMAT, "ring: SEQ %u of slot %u with %u, %u", m->b, m->a, x, y);
        f->slot = (int)m->a;
        f->x = (int)x;
        f->y = (int)y;
        return 0; /* a batch slot, checked above */
    case EXO_DIST_BATCH: {
        if (!sh->tensor || m->a < 1 || m->a > EXO_DIST_BATCH_ROWS || m->b > 1 || m->len < 12 * (size_t)m->a)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed BATCH frame");
        f->n_rows = (int)m->a;
        f->want_logits = m->b;
        f->items = p;
        size_t tokens = 0;
        bool taken[EXO_DIST_MAX_BATCH] = {0};
        for (int i = 0; i < f->n_rows; i++) {
            uint32_t slot = get32(p + 12 * i), pos0 = get32(p + 12 * i + 4), T = get32(p + 12 * i + 8);
            if (slot >= EXO_DIST_MAX_BATCH || taken[slot] || pos0 > EXO_DIST_MAX_POS || T < 1 ||
                T > EXO_DIST_MAX_STEP)
                return exo_err_set(err, EXO_EFORMAT, "ring: BATCH row %d: slot %u, %u tokens at %u", i, slot, T,
                                   pos0);
            taken[slot] = true;
            tokens += T;
        }
        if (tokens > EXO_DIST_MAX_STEP || m->len != 12 * (size_t)f->n_rows + 4 * tokens)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed BATCH frame");
        for (size_t k = 0; k < tokens; k++) {
            uint32_t id = get32(p + 12 * (size_t)f->n_rows + 4 * k);
            if (id >= (uint32_t)sh->vocab)
                return exo_err_set(err, EXO_EFORMAT, "ring: BATCH: token id %u out of range", id);
        }
        return 0;
    }
    case EXO_DIST_ROWS: {
        if (sh->tensor || m->a < 1 || m->a > EXO_DIST_BATCH_ROWS || m->b != 0 || m->len < 16 * (size_t)m->a)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed ROWS frame");
        f->n_rows = (int)m->a;
        f->items = p;
        size_t rows = 0;
        bool taken[EXO_DIST_MAX_BATCH] = {0};
        for (int i = 0; i < f->n_rows; i++) {
            uint32_t slot = get32(p + 16 * i), pos0 = get32(p + 16 * i + 4), T = get32(p + 16 * i + 8),
                     want = get32(p + 16 * i + 12);
            if (slot >= EXO_DIST_MAX_BATCH || taken[slot] || pos0 > EXO_DIST_MAX_POS || T < 1 ||
                T > EXO_DIST_MAX_STEP || want > 1)
                return exo_err_set(err, EXO_EFORMAT, "ring: ROWS row %d: slot %u, %u rows at %u", i, slot, T, pos0);
            taken[slot] = true;
            rows += T;
        }
        if (rows > EXO_DIST_MAX_STEP ||
            m->len != 16 * (size_t)f->n_rows + sizeof(float) * rows * (size_t)sh->hidden_size)
            return exo_err_set(err, EXO_EFORMAT, "ring: a malformed ROWS frame");
        f->T_total = (int)rows;
        f->data = p + 16 * (size_t)f->n_rows;
        return 0;
    }
    default:
        return exo_err_set(err, EXO_EFORMAT, "ring: unknown frame %u", m->type);
    }
    if (f->slot < 0 || f->slot >= sh->n_slots)
        return exo_err_set(err, EXO_EFORMAT, "ring: sequence slot %d of %d", f->slot, sh->n_slots);
    return 0;
}

void exo_dist_frame_prompt(const exo_dist_frame *f, int32_t *ids)
{
    for (int i = 0; i < f->n_prompt; i++)
        ids[i] = (int32_t)get32(f->prompt + 4 * i);
}

void exo_dist_frame_batch_row(const exo_dist_frame *f, int i, int *slot, int *pos0, int *T, int32_t *ids)
{
    size_t before = 0; /* ids of the rows ahead of row i */
    for (int k = 0; k < i; k++)
        before += get32(f->items + 12 * k + 8);
    *slot = (int)get32(f->items + 12 * i);
    *pos0 = (int)get32(f->items + 12 * i + 4);
    *T = (int)get32(f->items + 12 * i + 8);
    const unsigned char *p = f->items + 12 * (size_t)f->n_rows + 4 * before;
    for (int t = 0; t < *T; t++)
        ids[t] = (int32_t)get32(p + 4 * t);
}

void exo_dist_frame_rows_row(const exo_dist_frame *f, int i, int *slot, int *pos0, int *T, bool *want)
{
    *slot = (int)get32(f->items + 16 * i);
    *pos0 = (int)get32(f->items + 16 * i + 4);
    *T = (int)get32(f->items + 16 * i + 8);
    *want = get32(f->items + 16 * i + 12) != 0;
}

void exo_dist_encode_rows(int n, const int *slots, const int *pos0, const int *T, const bool *want,
                          unsigned char *out)
{
    for (int i = 0; i < n; i++) {
        put32(out + 16 * i, (uint32_t)slots[i]);
        put32(out + 16 * i + 4, (uint32_t)pos0[i]);
        put32(out + 16 * i + 8, (uint32_t)T[i]);
        put32(out + 16 * i + 12, want[i] ? 1u : 0u);
    }
}

void exo_dist_encode_seq(int x, int y, unsigned char out[8])
{
    put32(out, (uint32_t)x);
    put32(out + 4, (uint32_t)y);
}

size_t exo_dist_batch_bytes(int n, const int *T)
{
    size_t len = 12 * (size_t)n;
    for (int i = 0; i < n; i++)
        len += 4 * (size_t)T[i];
    return len;
}

void exo_dist_encode_batch(int n, const int *slots, const int *pos0, const int *T,
                           const int32_t *const *tokens, unsigned char *out)
{
    unsigned char *q = out + 12 * (size_t)n;
    for (int i = 0; i < n; i++) {
        put32(out + 12 * i, (uint32_t)slots[i]);
        put32(out + 12 * i + 4, (uint32_t)pos0[i]);
        put32(out + 12 * i + 8, (uint32_t)T[i]);
        for (int t = 0; t < T[i]; t++, q += 4)
            put32(q, (uint32_t)tokens[i][t]);
    }
}
