/* A tensor-parallel group's sums among GPUs (group.cu, NCCL loaded at run
 * time): the CUDA backend's group_* ops. Internal to src/engine/cuda/. */
#ifndef EXO_ENGINE_CUDA_GROUP_H
#define EXO_ENGINE_CUDA_GROUP_H

#include "engine/cuda/cuda_internal.h"

int  exo_cuda_group_new_id(uint8_t id[EXO_GROUP_ID_BYTES], exo_err *err);
/* *group: the communicator, for the calls below (the current device's) */
int  exo_cuda_group_join(void **group, const uint8_t id[EXO_GROUP_ID_BYTES], int world, int rank, int timeout_ms,
                         exo_err *err);
int  exo_cuda_group_allreduce(void *group, float *x, size_t n, cudaStream_t s);
void exo_cuda_group_leave(void *group);

#endif
