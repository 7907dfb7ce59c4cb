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
#include "runner/ring.h"

typedef struct exo_dist exo_dist;

/* The ring and model stay the caller's; seq is this rank's sequence. */
exo_dist *exo_dist_new(exo_ring *ring, bool tensor, exo_model *m, exo_seq *seq);
void      exo_dist_free(exo_dist *d);

/* Rank 0: the stepper that drives the group (owned by d). */
exo_gen_stepper *exo_dist_stepper(exo_dist *d);

/* Ranks > 0: handles one frame from the ring. Errors: the model's, the
 * ring's, EXO_EFORMAT for a frame that makes no sense here. */
int exo_dist_serve(exo_dist *d, const exo_ring_msg *msg, exo_err *err);

/* exo_model_opts.tp_allreduce / tp_allgather over a ring (ctx: the exo_ring). */
int exo_dist_allreduce(void *ring, float *x, size_t n, exo_err *err);
int exo_dist_allgather(void *ring, float *x, const size_t *bounds, exo_err *err);

#endif
