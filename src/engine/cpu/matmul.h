/* CPU matrix products against exo_linear weights: the hot path of the engine.
 *
 * One call multiplies one activation matrix X (T rows of `cols` f32 values)
 * by n weights that share that input (q/k/v, or gate/up), so one thread-pool
 * dispatch covers them all:  Y_i[t][r] = sum_c W_i[r][c] * X[t][c].
 *
 * Paths, chosen per call (AUTO: GEMV for T <= 4, or T <= 16 when a weight
 * would need expanding to bf16 for the GEMM, i.e. affine, MXFP4 or F16 weights):
 *   - T small (decode): matrix-vector kernels that stream the weight once
 *     (for T > 1 each block of rows stays in L1 while the rows of X pass).
 *     Affine weights use integer dot products (AVX-512 VNNI vpdpbusd) on
 *     int8-quantized activations (per weight group, scale max|x|/127),
 *     using dot(w,x) = s*dot(q,x) + b*sum(x) per group; dense weights use
 *     f32 FMA. Where the backend loads 4- and 8-bit weights as affine
 *     panels (exo_cpu_matmul_wants_panels), those run on the panels kernel
 *     (16 rows in the vector lanes). Affine results carry the activation rounding:
 *     NMSE ~1e-5..1e-4 against f32 (what llama.cpp's Q8 activations do).
 *     MXFP4 weights take the same integer path (each E2M1 code looked up
 *     as 2*value + 12, an affine code with bias -12 * scale/2). On CPUs with
 *     AVX2 and no AVX-512 the affine, MXFP4 and dense kernels are AVX2 ones
 *     (vpmaddubsw instead of VNNI).
 *   - T large (prefill): weights are expanded to bf16 (or kept f32 for f32
 *     checkpoints, for exactness) panel by panel and multiplied with oneDNN,
 *     which uses AMX on CPUs that have it; without AVX-512, expanded to f32
 *     and multiplied by the plain AVX2 GEMM (gemm_avx2.c), whose rows keep
 *     their bits in any call.
 *   - a portable C reference for everything, used where no kernel takes a
 *     weight (CPUs without AVX2, odd group sizes) and by the tests as the
 *     oracle for the SIMD paths.
 *
 * The context owns the thread pool and scratch buffers, sized on first use
 * and grown only when a bigger shape arrives, so steady-state decode does
 * not allocate. A context is used by one thread at a time. */
#ifndef EXO_ENGINE_CPU_MATMUL_H
#define EXO_ENGINE_CPU_MATMUL_H

#include "core/threadpool.h"
#include "engine/linear.h"

#include <stdbool.h>

typedef struct exo_cpu_matmul_ctx exo_cpu_matmul_ctx;

exo_cpu_matmul_ctx *exo_cpu_matmul_ctx_create(exo_pool *pool);
void exo_cpu_matmul_ctx_free(exo_cpu_matmul_ctx *ctx);

/* All w[i] must have the same cols. y[i] is (T, w[i]->rows) f32, row-major. */
void exo_cpu_matmul(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w,
                    const float *x, int T, float *const *y);

/* The same through the GEMV at any T (unless a path is forced, or a
 * weight has no GEMV kernel on this CPU): each row of X gets the bits it
 * gets alone. */
void exo_cpu_matmul_rows(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                         int T, float *const *y);

/* The same with weight i reading its own input xs[i] (T rows of cols each):
 * the down projections of a token's experts in one dispatch, every thread
 * on every expert's rows. */
void exo_cpu_matmul_each(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w,
                         const float *const *xs, int T, float *const *y);

/* AUTO's GEMV takes calls of up to this many rows of X, the GEMM more. */
#define EXO_CPU_GEMV_MAX_ROWS 16

/* Forces a path, for tests and benchmarks. */
typedef enum exo_matmul_path {
    EXO_MATMUL_AUTO = 0,
    EXO_MATMUL_REFERENCE, /* portable C, f32 accumulation of dequantized weights */
    EXO_MATMUL_GEMV,      /* best matrix-vector kernel for this CPU, per row of X */
    EXO_MATMUL_GEMM,      /* oneDNN */
} exo_matmul_path;
void exo_cpu_matmul_force_path(exo_cpu_matmul_ctx *ctx, exo_matmul_path path);
/* Whether this CPU's GEMV has a kernel for w (else its rows take the
 * reference path's arithmetic, far slower). */
int exo_cpu_matmul_has_gemv(const exo_linear *w);

/* Whether GEMV calls of 4 or 5 to 16 rows of X may use the tile units (on
 * by default where there are any). With them on, every affine/MXFP4 GEMV
 * of the context sums each group exactly (the tile kernel's numerics);
 * off, it sums per vector lane (gemv_avx512.c). Either way a row of X gets
 * the same bits at any row count; tests and benchmarks switch it to
 * compare. Returns whether it is on now. */
int exo_cpu_matmul_use_amx(exo_cpu_matmul_ctx *ctx, int on);

/* Whether this context runs affine 4- and 8-bit weights fastest laid out as
 * affine panels (linear.h; the backend repacks them at load): CPUs with
 * AVX-512 VNNI whose batched rows do not go to tile units. EXO_CPU_PANELS=0
 * says no, to compare the two layouts. */
bool exo_cpu_matmul_wants_panels(const exo_cpu_matmul_ctx *ctx);

/* Plain AVX2/FMA f32 GEMM (gemm_avx2.c), the benchmark's peer for the
 * oneDNN path: C (M x N) = A (M x K) * B^T, B given as N x K weight rows,
 * all row-major and dense. The CPU must support AVX2 and FMA. */
void exo_gemm_f32_avx2(int M, int N, int K, const float *A, const float *B, float *C,
                       exo_pool *pool);
/* The same on the calling thread alone; a row of A gets the same bits in
 * any call, whatever M is and wherever the row sits. */
void exo_gemm_f32_avx2_serial(int M, int N, int K, const float *A, const float *B, float *C);

#endif
