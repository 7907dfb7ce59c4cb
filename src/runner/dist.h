/* A model split over the runners of one instance: what rank 0 drives and
 * the other ranks serve, over the ring (ring.h).
 *
 * Rank 0 takes the requests (chat template, tokens, detokenizer, chunks);
 * its generation loop runs on exo_dist_stepper, and the other ranks answer
 * the frames it sends round:
 *
 * Pipeline (each rank holds a layer range): rank 0 embeds and runs its
 * layers, and sends the hidden states on; each rank runs its layers and
 * sends on; the last rank runs the head, samples, and sends only the
 * sample (id, logprob, alternatives) back to rank 0. The sampler lives on
 * the last rank: BEGIN carries the sampling parameters and the prompt (the
 * penalties' history) to it. A prompt chunk that wants no sample is sent
 * and rank 0 goes straight on to the next chunk, so during a long prefill
 * every rank works at once on a different chunk.
 *
 * Tensor (each rank holds a share of every layer): rank 0 sends the step's
 * token ids round, every rank runs the forward pass, all-reducing after
 * attention and after the MLP (the model's collective is exo_dist_allreduce),
 * and rank 0, the only rank with the head, samples.
 *
 * Every frame names the position it starts at, so a rank whose sequence is
 * elsewhere (a cancelled request, a new one) moves its cache there first. */
#ifndef EXO_RUNNER_DIST_H
#define EXO_RUNNER_DIST_H

#include "engine/generate.h"
#include "engine/model.h"
#include "runner/dist_frames.h"
#include "runner/ring.h"

typedef struct exo_dist exo_dist;

/* The ring and model stay the caller's; seqs are this rank's sequences,
 * one per slot (slot 0 is the stepper's). */
exo_dist *exo_dist_new(exo_ring *ring, bool tensor, exo_model *m, exo_seq *const *seqs, int n_seqs);
void      exo_dist_free(exo_dist *d);

/* Rank 0: the stepper that drives the group on slot 0 (owned by d). */
exo_gen_stepper *exo_dist_stepper(exo_dist *d);

/* Rank 0 of a pipeline, several requests in flight: a new generation in a
 * slot (its sampling and prompt go to the last rank; a batch slot, up to
 * EXO_DIST_MAX_BATCH, where rank 0 batches: exo_dist_pipe_rows); a step of
 * a slot's sequence, run through this rank's layers and sent on (returns
 * at once; with want_sample the last rank's sample comes back later); the
 * next sample that came back, of whichever slot (the caller checks it is
 * one it waits for). */
int exo_dist_begin(exo_dist *d, int slot, const exo_sampler_params *sp, const int32_t *prompt,
                   int n_prompt, int max_tokens, exo_err *err);
int exo_dist_send_step(exo_dist *d, int slot, const int32_t *tokens, int T, bool want_sample,
                       exo_err *err);
int exo_dist_recv_sample(exo_dist *d, int *slot, exo_sample *s, exo_err *err);

/* Rank 0 of a pipeline: n generations at once, one per slot (n <= the
 * slots), each with its prompt, ctx for on_token and stats; the way the
 * runner keeps a pipeline busy, for a fixed set of requests (tests,
 * benchmarks). */
int exo_dist_generate_batch(exo_dist *d, int n, const int32_t *const *prompts, const int *n_prompts,
                            const exo_gen_params *p, exo_gen_token_fn on_token, void *const *ctx,
                            exo_gen_stats *stats, exo_err *err);

/* Rank 0 of a group that batches, tensor-parallel or pipeline (the
 * runner's batch slots, slot 0 being the stepper's): every rank keeps a
 * sequence per batch slot, which follows rank 0's. seq_resize: slot's sequence keeps
 * its first `keep` positions and holds `capacity` (made where the slot has
 * none); seq_copy: the first n positions of slot `from`'s sequence into
 * slot's; send_batch: a batched step of n rows (slot, pos0, T, tokens), as
 * rank 0 then runs on its share with exo_model_step (n = 1) or
 * exo_model_step_batch, with logits where `logits` (the other ranks'
 * shares of the head join the gather). Send each right after doing the
 * same on rank 0's own sequences. */
int exo_dist_seq_resize(exo_dist *d, int slot, int keep, int capacity, exo_err *err);
int exo_dist_seq_copy(exo_dist *d, int slot, int from, int n, exo_err *err);
int exo_dist_send_batch(exo_dist *d, int n, const int *slots, const int *pos0, const int *T,
                        const int32_t *const *tokens, bool logits, exo_err *err);
/* Rank 0 of a pipeline that batches (the runner's continuous batching;
 * the batch slots' sequences made on every rank with seq_resize, their
 * samplers with exo_dist_begin on the batch slot): a batched step of n
 * rows, row k being items[k] (rank 0's own sequence of batch slot
 * bslot[k] and its tokens) run through this rank's layers and sent round
 * (ROWS); the last rank samples the rows that want it, and their samples
 * come back into samples[k] before this returns. A row gets the bits it
 * gets stepped alone. */
int exo_dist_pipe_rows(exo_dist *d, int n, const exo_batch_item *items, const int *bslot, const bool *want,
                       exo_sample *samples, exo_err *err);
/* exo_dist_pipe_rows in two halves: the step sent (returns once this rank
 * has run it), then its samples taken; steps sent one after another come
 * back in the order they were sent, so the next one can be computed here
 * while the ranks after this one work on the last. */
int exo_dist_pipe_send(exo_dist *d, int n, const exo_batch_item *items, const int *bslot, const bool *want,
                       exo_err *err);
int exo_dist_pipe_recv(exo_dist *d, int n, const int *bslot, const bool *want, exo_sample *samples, exo_err *err);
/* The runner's prefix cache on every rank: keep the first n positions of
 * slot's sequence apart as entry `id` (0 .. INT32_MAX, unique while kept;
 * at most EXO_DIST_MAX_KEPT at once), take n positions of entry id into
 * slot's sequence, give entry id up. Send each right after doing the same
 * on rank 0 (exo_seq_keep_prefix, exo_seq_take_prefix, exo_kv_prefix_free). */
int exo_dist_prefix_keep(exo_dist *d, int slot, int id, int n, exo_err *err);
int exo_dist_prefix_take(exo_dist *d, int slot, int id, int n, exo_err *err);
int exo_dist_prefix_drop(exo_dist *d, int id, exo_err *err);

/* Ranks > 0: handles one frame from the ring. Errors: the model's, the
 * ring's, EXO_EFORMAT for a frame that makes no sense here. */
int exo_dist_serve(exo_dist *d, const exo_ring_msg *msg, exo_err *err);

/* exo_model_opts.tp_allreduce / tp_allgather over a ring (ctx: the exo_ring). */
int exo_dist_allreduce(void *ring, float *x, size_t rows, size_t cols, exo_err *err);
int exo_dist_allgather(void *ring, float *x, const size_t *bounds, exo_err *err);

#endif
