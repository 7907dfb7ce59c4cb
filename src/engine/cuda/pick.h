/* A batch's tokens picked where its logits are (pick.cu): the CUDA
 * backend's pick op. Internal to src/engine/cuda/. */
#ifndef EXO_ENGINE_CUDA_PICK_H
#define EXO_ENGINE_CUDA_PICK_H

#include "engine/cuda/cuda_internal.h"

typedef struct exo_cuda_picker exo_cuda_picker;

/* The pinned and device buffers of the calls below; NULL when CUDA has
 * no memory for them. */
exo_cuda_picker *exo_cuda_picker_new(void);
void             exo_cuda_picker_free(exo_cuda_picker *p);

/* backend.h pick on device rows x, queued on `stream`, then waited for. */
int exo_cuda_pick(exo_cuda_picker *p, cudaStream_t stream, float *x, int rows, int n, const exo_pick_rule *rules,
                  exo_pick *out);

#endif
