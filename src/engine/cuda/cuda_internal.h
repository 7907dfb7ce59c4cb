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

/* Programmatic dependent launch (Hopper and later). A kernel queued by
 * exo_cuda_launch may start while the kernel before it on the stream still
 * runs, so its prologue (a GEMV's first weight loads, which no kernel
 * writes) and its launch latency overlap that kernel's tail. Such a kernel
 * calls exo_cuda_wait_inputs() before it touches memory that earlier work
 * on the stream reads or writes, in every block: a grid whose blocks all
 * left before waiting would count as finished while its predecessor still
 * runs, and the next kernel's wait would no longer cover the predecessor.
 * exo_cuda_start_next() lets the next such kernel start now rather than
 * when this one's blocks exit. The short kernels between a decode step's
 * products (quantizing an input, a norm, attention) call it before their
 * wait, so the product after them launches while the kernel before them
 * still runs and its blocks load their first weights meanwhile. That cannot
 * starve a grid: the next one launches only once every block of this one
 * has started. Before Hopper both are no-ops and the launch is an ordinary
 * one. */
__device__ __forceinline__ void exo_cuda_wait_inputs(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void exo_cuda_start_next(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* Threads of a block that norms a row (the rmsnorm op, the GEMV's
 * norm-and-quantize kernel): both sum the squares in the same order, so
 * a row normed by either is the same bits. 512 rather than 1024: a
 * smaller block reaches its barrier sooner (llama-3.2-1b q4 decode on an
 * H200 +1.4%, qwen3-0.6b +1.8%, 256 in between; docs/PERFORMANCE.md). */
#define EXO_CUDA_NORM_THREADS 512

/* Whether launches overlap as above: every GPU of the process is Hopper or
 * later (set when a backend is created; EXO_CUDA_PDL=0 turns it off). */
extern bool exo_cuda_overlap;

template <typename... Params, typename... Args>
static inline void exo_cuda_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                   Args... args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = exo_cuda_overlap ? 1 : 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Sums of COUNT values over a warp's lanes, the values going down one
 * butterfly together: at the level of lanes O apart a lane keeps half of
 * its values and sends its partner the other half, so COUNT values take
 * COUNT - 1 shuffles (while COUNT > 1), not 5 COUNT. Called with O = 16;
 * afterwards v[0 .. COUNT/32) (one value where COUNT <= 32) are the sums of
 * values idx .. (idx is added to: start it at 0), which lanes that differ
 * only in the bits below log2(32 / COUNT) share: lane / (32 / COUNT) for
 * COUNT <= 32. Every sum pairs the same two operands as a butterfly of each
 * value alone would, so the bits are the same. */
template <int COUNT, int O> __device__ __forceinline__ void exo_cuda_butterfly(float *v, int lane, int &idx)
{
    if constexpr (O > 0) {
        if constexpr (COUNT > 1) {
            const bool hi = lane & O;
#pragma unroll
            for (int i = 0; i < COUNT / 2; i++) {
                const float keep = hi ? v[COUNT / 2 + i] : v[i], send = hi ? v[i] : v[COUNT / 2 + i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            idx += hi ? COUNT / 2 : 0;
            exo_cuda_butterfly<COUNT / 2, O / 2>(v, lane, idx);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            exo_cuda_butterfly<1, O / 2>(v, lane, idx);
        }
    }
}

/* act(a) * b of a gated MLP (backend.h exo_glu_kind; lim: EXO_GLU_OAI's
 * clamp): the glu op's arithmetic, shared with the GEMV that folds it into
 * quantizing its input, so both give the same bits. */
__device__ __forceinline__ float exo_cuda_glu(int kind, float a, float b, float lim)
{
    if (kind == EXO_GLU_SILU)
        return a / (1.0f + expf(-a)) * b;
    if (kind == EXO_GLU_GELU_TANH) {
        float z = 0.7978845608028654f * (a + 0.044715f * a * a * a);
        return a / (1.0f + expf(-2.0f * z)) * b;
    }
    float gg = fminf(a, lim), uu = fminf(fmaxf(b, -lim), lim);
    return (uu + 1.0f) * (gg / (1.0f + expf(-1.702f * gg)));
}

/* RoPE's cosine and sine (times mscale) at a position for one frequency:
 * the angle in f32 as the CPU forms it, reduced to [-pi, pi] in double
 * (exact enough: 2 pi's rounding times the turns is below 1e-11 at the
 * longest contexts), then the hardware's sine and cosine (absolute error
 * below 4e-7 there, a few f32 ulps; the CPU rounds double ones): a few
 * instructions where double sin and cos are ~100 each, which the decode
 * attention kernel, bound by the length of its warps' instruction
 * streams, would pay before its first round. Every rotation on the GPU
 * takes its angles from here. */
__device__ __forceinline__ float2 exo_cuda_rope_cs(int pos, float inv_freq, float mscale)
{
    const double two_pi = 6.283185307179586;
    const double ang = (double)((float)pos * inv_freq);
    float s, c;
    __sincosf((float)(ang - rint(ang * (1.0 / two_pi)) * two_pi), &s, &c);
    return make_float2(c * mscale, s * mscale);
}

/* Counters the decode kernel's splits arrive on (one per KV head of each
 * sequence of a launch; zeroes between calls): device memory of this many
 * ints, one block per backend, zeroed when made. */
#define EXO_CUDA_ATT_ARRIVALS 4096

/* The backend.h attention op (attention.cu); partial: device scratch of
 * exo_cuda_attention_scratch bytes (the split decode's partial results);
 * arrivals: the backend's EXO_CUDA_ATT_ARRIVALS counters.
 * pos_dev: a recorded step's position in device memory (pos0 is then the
 * recording's), or NULL. A recorded step and any one-token step are split
 * as planned for the whole capacity: pass the same capacity to
 * exo_cuda_attention_scratch for them (0 for prompts). */
size_t exo_cuda_attention_scratch(const exo_attn_shape *shape, int T, int pos0, int capacity);
/* backend.h attention_rotates: the one-token decode kernel rotates q and
 * the new key itself (shape->rope) */
bool exo_cuda_attention_rotates(const exo_attn_shape *shape, int T);
int exo_cuda_attention(cudaStream_t stream, const exo_attn_shape *shape, float *out, const float *q, const float *k,
                       const float *v, const exo_kv_view *cache, int T, int pos0, const int *pos_dev,
                       float *partial, int *arrivals);

/* Decode attention of n sequences, one token each (backend.h
 * attention_rows): the same bits as exo_cuda_attention of each with T = 1
 * and no recorded position, in one launch of up to 16 sequences where the
 * decode kernel takes the shape; partial: exo_cuda_attention_rows_scratch
 * bytes. */
size_t exo_cuda_attention_rows_scratch(const exo_attn_shape *shape, int n, const exo_kv_view *caches,
                                       const int *pos);
int exo_cuda_attention_rows(cudaStream_t stream, const exo_attn_shape *shape, int n, float *out, const float *q,
                            const float *k, const float *v, const exo_kv_view *caches, const int *rings,
                            const int *pos, float *partial, int *arrivals);

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
