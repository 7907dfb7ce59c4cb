/* Matrix products of the CUDA backend (matmul.cu): the streaming GEMV of
 * decode and the helpers of the tensor-core path. Internal to
 * src/engine/cuda/ (C++). */
#ifndef EXO_ENGINE_CUDA_MATMUL_H
#define EXO_ENGINE_CUDA_MATMUL_H

#include "engine/cuda/cuda_internal.h"

/* Most weights one GEMV launch takes, and most tokens: a launch takes 1,
 * 2, 3, 4, 8 or 16 rows of x, reading the weight once for all of them, up
 * to what its format allows (exo_cuda_gemv_width); a row's arithmetic is
 * the same at every width. */
#define EXO_CUDA_JOBS 16
#define EXO_CUDA_GEMV_MAX_T 16
/* Most tokens of the slow any-format GEMV. */
#define EXO_CUDA_GEMV_ANY_MAX_T 4

/* What a GEMV that quantizes its input (exo_cuda_gemv_quantizes) applies to
 * x as it does: x / rms(x) * norm when norm is set, act(x) * glu_u
 * (exo_cuda_glu; glu_u read at x's strides) when glu_u is set, not both. */
typedef struct exo_cuda_input_fold {
    const float *norm;
    float        eps;
    const float *glu_u;
    int          glu_kind;
    float        glu_limit;
} exo_cuda_input_fold;

/* y[t][r] = W[r] . x'[t] for t < T (row strides ldx, ldy in floats), x'
 * x through fold (nothing set: x itself); accumulate: y += instead of y =. */
typedef struct exo_cuda_gemv_job {
    exo_linear          lin; /* device pointers */
    const float        *x;
    int                 ldx;
    float              *y;
    int                 ldy;
    exo_cuda_input_fold fold;
    bool                accumulate;
} exo_cuda_gemv_job;

/* Whether the GEMV takes this weight and input (format, widths, alignment);
 * everything else goes through dequantization and cuBLAS. */
bool exo_cuda_gemv_takes(const exo_linear *w, const float *x, int ldx, int T);
/* The widest launch the GEMV takes w at with at most T rows (1 if none). */
int exo_cuda_gemv_width(const exo_linear *w, int T);
/* Whether the GEMV quantizes x for this weight (and so can norm it too). */
bool exo_cuda_gemv_quantizes(const exo_linear *w);
/* Device scratch bytes exo_cuda_gemv needs for these jobs. */
size_t exo_cuda_gemv_scratch(int n, const exo_cuda_gemv_job *jobs, int T);
int exo_cuda_gemv(cudaStream_t stream, int n, const exo_cuda_gemv_job *jobs, int T, void *scratch);

/* The same for any format and width, slowly (T <= EXO_CUDA_GEMV_ANY_MAX_T). */
int exo_cuda_gemv_any(cudaStream_t s, const exo_linear *w, const float *x, int ldx, int T, float *y, int ldy,
                      bool accumulate);
/* w (rows x cols, any format) as bf16 into out (rows * cols). */
int exo_cuda_dequant_bf16(cudaStream_t s, const exo_linear *w, void *out);
/* rows x cols of x (stride ldx) to contiguous bf16 or f16. */
int exo_cuda_to_half(cudaStream_t s, const float *x, int64_t rows, int64_t cols, int64_t ldx, bool bf16,
                     void *out);
/* out[t] = row tokens[t] of the table (tokens: device memory). */
int exo_cuda_embed(cudaStream_t s, const exo_linear *table, const int32_t *tokens, int T, float *out);

#endif
