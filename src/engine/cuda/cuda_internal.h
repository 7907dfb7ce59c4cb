/* What the CUDA plugin's translation units share (internal to
 * src/engine/cuda/, compiled by nvcc as C++). Kernels take device pointers
 * and queue on the backend's stream; each launcher returns 0 or
 * EXO_EINTERNAL (a launch that failed, logged with CUDA's reason). */
#ifndef EXO_ENGINE_CUDA_INTERNAL_H
#define EXO_ENGINE_CUDA_INTERNAL_H

extern "C" {
#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
}

#include <cuda_runtime.h>

/* 0 if the last launch on this thread went through, else logs and
 * returns EXO_EINTERNAL (EXO_ENOMEM for memory). */
int exo_cuda_launched(const char *what);

/* Blocks of `per` threads for a grid-stride loop over n elements: enough
 * to fill the GPU, capped (the loops stride over the rest). */
static inline unsigned exo_cuda_blocks(size_t n, unsigned per)
{
    size_t b = (n + per - 1) / per;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* The backend.h attention op (attention.cu); partial: device scratch of
 * exo_cuda_attention_scratch bytes (the split decode's partial results). */
size_t exo_cuda_attention_scratch(const exo_attn_shape *shape, int T, int pos0);
int exo_cuda_attention(cudaStream_t stream, const exo_attn_shape *shape, float *out, const float *q, const float *k,
                       const float *v, float *k_cache, float *v_cache, int capacity, int T, int pos0,
                       float *partial);

/* Gated DeltaNet (linear_attn.cu): the backend.h ops of the same names,
 * on device memory, queued on `stream`. */
int exo_cuda_conv1d_silu(cudaStream_t stream, float *out, int out_stride, const float *x, int x_stride,
                         const float *w, float *state, int T, int C, int K);
int exo_cuda_gated_delta(cudaStream_t stream, float *out, const float *q, const float *k, int qk_stride,
                         const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                         const float *A_log, const float *dt_bias, float *S, int T, int Hk, int Hv, int Dk,
                         int Dv);
int exo_cuda_rmsnorm_gated(cudaStream_t stream, float *x, const float *z, int z_stride, const float *w, int T,
                           int n_heads, int dim, float eps);

#endif
