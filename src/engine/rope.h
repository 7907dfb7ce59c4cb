/* Rotary position embedding frequencies, with the scaling variants of
 * Hugging Face's modeling_rope_utils: default, linear, llama3 and yarn.
 * The result feeds the backend's rope op: head_dim/2 inverse frequencies and
 * an attention factor that multiplies cos and sin. */
#ifndef EXO_ENGINE_ROPE_H
#define EXO_ENGINE_ROPE_H

#include "core/error.h"
#include "engine/config.h"

/* Fills inv_freq[0 .. rot_dim/2) and *mscale for base frequency `theta`.
 * rot_dim is the rotated width (head_dim for every model here).
 * EXO_EUNSUPPORTED for "dynamic" (NTK scaling that depends on the running
 * sequence length; not implemented). */
int exo_rope_init(const exo_rope_scaling *p, double theta, int rot_dim, float *inv_freq,
                  float *mscale, exo_err *err);

#endif
