/* The frames the ranks of a split model send round their ring (dist.h),
 * encoded and checked. Pure functions: no I/O, no model.
 *
 * Every frame is one ring frame (ring.h: type, a, b, payload), for the
 * sequence in one slot:
 *   BEGIN   a = n_prompt, b = max_tokens; payload: 48 bytes of sampling
 *           parameters (the slot in the last word), then the prompt's
 *           n_prompt int32 ids (the sampler's history for its penalties)
 *   HIDDEN  a = T, b = pos0 << 4 | slot << 1 | want_sample; payload:
 *           T x hidden_size f32 hidden states
 *   TOKENS  a = T, b as HIDDEN; payload: T int32 token ids
 *   SAMPLE  a = token id, b = slot; payload: f32 logprob, u32 n_top, then
 *           n_top (u32 id, f32 logprob) alternatives
 * and, in a group that batches (continuous batching on rank 0: the other
 * ranks' batch slots follow rank 0's; BEGIN and SAMPLE then name batch
 * slots, up to EXO_DIST_MAX_BATCH), for batch slots:
 *   SEQ     a = batch slot, b = EXO_DIST_SEQ_RESIZE, _COPY, _KEEP, _TAKE or
 *           _DROP; payload u32 x, u32 y: RESIZE keeps the first y positions
 *           and gives the slot's sequence x (made if the slot has none);
 *           COPY copies the first y positions of batch slot x's sequence
 *           into the slot's; KEEP keeps the first y positions of the slot's
 *           sequence apart as prefix-cache entry x (model.h
 *           exo_seq_keep_prefix); TAKE gives the slot's sequence the first
 *           y positions of entry x; DROP (y 0) gives entry x up
 *   BATCH   (tensor) a = n rows, b = 1 when rank 0 makes logits (every
 *           rank's share of the head joins); payload: n x (u32 slot, u32
 *           pos0, u32 T), then the rows' token ids (the sum of their T, int32)
 *   ROWS    (pipeline) a = n rows, b = 0; payload: n x (u32 slot, u32 pos0,
 *           u32 T, u32 want_sample), then the rows' hidden states (the sum
 *           of their T, x hidden_size f32); the last rank samples each row
 *           that wants it with its slot's sampler and sends the SAMPLEs
 *           back in row order
 * All little-endian; floats are IEEE-754 bits.
 *
 * A peer that passed the ring's handshake is trusted to be a rank of this
 * instance, not to be bug-free: exo_dist_frame_parse checks every field
 * against this rank's shape (slots, vocabulary, width) before anything
 * indexes with it. */
#ifndef EXO_RUNNER_DIST_FRAMES_H
#define EXO_RUNNER_DIST_FRAMES_H

#include "core/error.h"
#include "engine/sampler.h"
#include "runner/ring.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Sequences a group can have in flight at once (a pipeline's requests). */
#define EXO_DIST_MAX_SLOTS      8
#define EXO_DIST_SAMPLING_BYTES 48
#define EXO_DIST_SAMPLE_MAX     (8 + 8 * EXO_MAX_TOP_LOGPROBS)
#define EXO_DIST_MAX_STEP       (1 << 20) /* tokens in one step */
#define EXO_DIST_MAX_POS        (1 << 27) /* positions a frame can name */

#define EXO_DIST_MAX_BATCH      64 /* batch slots of a tensor-parallel group */
#define EXO_DIST_MAX_KEPT       64 /* prefix-cache entries a rank holds (the runner's STORE_MAX) */
#define EXO_DIST_BATCH_ROWS     16 /* sequences in one batched step */

enum { EXO_DIST_BEGIN = 1, EXO_DIST_HIDDEN, EXO_DIST_TOKENS, EXO_DIST_SAMPLE, EXO_DIST_SEQ, EXO_DIST_BATCH,
       EXO_DIST_ROWS };
enum { EXO_DIST_SEQ_RESIZE = 1, EXO_DIST_SEQ_COPY, EXO_DIST_SEQ_KEEP, EXO_DIST_SEQ_TAKE, EXO_DIST_SEQ_DROP };

/* What a rank checks frames against. */
typedef struct exo_dist_shape {
    int  n_slots, vocab, hidden_size;
    bool tensor;
} exo_dist_shape;

typedef struct exo_dist_frame {
    uint32_t type;
    int      slot;
    /* BEGIN */
    exo_sampler_params sampling;
    int                n_prompt, max_tokens;
    const unsigned char *prompt; /* n_prompt little-endian int32 (in the frame) */
    /* HIDDEN, TOKENS */
    int         T, pos0;
    bool        want_sample;
    const void *data;            /* the payload */
    /* SAMPLE */
    exo_sample  sample;
    /* SEQ (slot: the batch slot) */
    int         seq_op, x, y;
    /* BATCH: n rows; row i is (slot, pos0, T) at items + 12 i, and the ids
     * follow the n rows (exo_dist_frame_batch_row reads them) */
    int         n_rows;
    bool        want_logits;
    const unsigned char *items;
    /* ROWS: n_rows rows at items (exo_dist_frame_rows_row), their hidden
     * states at data, T_total rows of them */
    int         T_total;
} exo_dist_frame;

/* Parses and checks m. EXO_EFORMAT naming the problem otherwise. */
int exo_dist_frame_parse(const exo_ring_msg *m, const exo_dist_shape *sh, exo_dist_frame *f,
                         exo_err *err);
/* BEGIN's prompt ids, copied out of the frame (n_prompt of them). */
void exo_dist_frame_prompt(const exo_dist_frame *f, int32_t *ids);
/* BATCH: row i's slot, pos0 and T; its ids (T of them) copied to ids. */
void exo_dist_frame_batch_row(const exo_dist_frame *f, int i, int *slot, int *pos0, int *T, int32_t *ids);
/* ROWS: row i's slot, pos0, T and whether it wants a sample. */
void exo_dist_frame_rows_row(const exo_dist_frame *f, int i, int *slot, int *pos0, int *T, bool *want);

/* Encoders: BEGIN's parameter block, the b field of a step, a SAMPLE's
 * payload (returns its length). */
void     exo_dist_encode_sampling(const exo_sampler_params *sp, int slot,
                                  unsigned char out[EXO_DIST_SAMPLING_BYTES]);
uint32_t exo_dist_step_bits(int pos0, int slot, bool want_sample);
size_t   exo_dist_encode_sample(const exo_sample *s, unsigned char out[EXO_DIST_SAMPLE_MAX]);
/* SEQ's payload (x, y); BATCH's payload of n rows and its length. */
void     exo_dist_encode_seq(int x, int y, unsigned char out[8]);
size_t   exo_dist_batch_bytes(int n, const int *T);
void     exo_dist_encode_batch(int n, const int *slots, const int *pos0, const int *T,
                               const int32_t *const *tokens, unsigned char *out);
/* ROWS's row headers (16 n bytes; the hidden states follow them). */
void     exo_dist_encode_rows(int n, const int *slots, const int *pos0, const int *T, const bool *want,
                              unsigned char *out);

#endif
