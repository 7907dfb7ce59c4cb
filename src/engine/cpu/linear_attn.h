/* CPU kernels of Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the
 * short causal conv over the fused q|k|v channels, the gated delta rule with
 * its per-head matrix state, and the gated RMSNorm on its output. Internal
 * to the CPU backend. The math follows transformers' modeling_qwen3_next
 * (Qwen3NextGatedDeltaNet, torch_recurrent/chunk_gated_delta_rule,
 * Qwen3NextRMSNormGated) and mlx-lm's gated_delta.py.
 *
 * Why separate from ops.c: these layers carry state between calls (a conv
 * window and a Dk x Dv matrix per value head, 2 MiB a layer at Qwen3.5
 * shapes), and the delta rule has two prefill algorithms, so the file is
 * its own design. State follows mlx-lm's continuation semantics: a call
 * with T tokens on top of a state continues it (chunked prefill, decode),
 * never restarts it.
 *
 * All f32, row-major. Strides are in floats, so the caller can pass views
 * into one packed buffer (q, k and v are slices of the conv output row). */
#ifndef EXO_ENGINE_CPU_LINEAR_ATTN_H
#define EXO_ENGINE_CPU_LINEAR_ATTN_H

#include "core/threadpool.h"

/* Largest conv kernel width (Qwen3-Next/3.5 use 4). */
#define EXO_CONV_MAX_K 16

/* Causal depthwise conv1d over T tokens with SiLU, continuing from a state.
 * x: T rows of C channels (row stride x_stride); w: (C, K) taps, w[c*K + K-1] multiplies the current token;
 * state: (K-1, C) the previous K-1 inputs, oldest first (zeros for a new sequence); on return it holds the last
 * K-1 inputs (of state+x). out: T rows of C (row stride out_stride), out = silu(sum_j w[c][j] * u[t-(K-1)+j][c]).
 * out must not alias x. 1 <= K <= EXO_CONV_MAX_K. */
void exo_cpu_conv1d_silu(exo_pool *pool, float *out, int out_stride, const float *x, int x_stride,
                         const float *w, float *state, int T, int C, int K);

/* Gated delta rule over T tokens for Hv value heads, continuing from state S (Hv, Dk, Dv), updated in place.
 * q, k: T rows of Hk heads x Dk (row strides qk_stride; q and k are raw: the kernel applies
 *   q^ = q * rsqrt(sum q^2 + 1e-6) * Dk^-0.5 and k^ = k * rsqrt(sum k^2 + 1e-6) itself);
 * v: T rows of Hv x Dv (stride v_stride); value head h uses key head h / (Hv/Hk);
 * a, b: T rows of Hv raw gate inputs (strides ab_stride): beta = sigmoid(b), g = -exp(A_log[h]) * softplus(a + dt_bias[h])
 *   (softplus(x) = log1p(exp(x)), = x for x > 20), decay = exp(g);
 * per token: S = decay*S; kv = S^T k^; delta = (v - kv)*beta; S += k^ (outer) delta; o = S^T q^ (after the update).
 * out: T rows of Hv x Dv (contiguous, Hv*Dv per row).
 *
 * Two algorithms, the same result up to f32 rounding: token by token
 * (recurrent) and the chunked form of transformers'
 * torch_chunk_gated_delta_rule (chunks of EXO_GDN_CHUNK tokens). The kernel
 * picks by T (EXO_GDN_CHUNKED_MIN_T); the environment variable
 * EXO_GDN_PATH=recurrent|chunked forces one (tests, benchmarks). The
 * chunked form allocates its scratch per call (~260 KiB a thread at
 * Dk = Dv = 128) and falls back to the recurrent form if that fails.
 * Hv must be a multiple of Hk; nothing is done otherwise. Denormal results
 * are flushed to zero. */
void exo_cpu_gated_delta(exo_pool *pool, float *out, const float *q, const float *k, int qk_stride,
                         const float *v, int v_stride, const float *a, const float *b, int ab_stride,
                         const float *A_log, const float *dt_bias, float *S,
                         int T, int Hk, int Hv, int Dk, int Dv);

#define EXO_GDN_CHUNK 64
/* Smallest T for which exo_cpu_gated_delta takes the chunked form by
 * default; 0: never. bench/bench_linear_attn.c measured the recurrent form
 * 5-15% faster at every T from 16 to 4096 at Qwen3.5 shapes on AVX-512
 * (linear_attn.c, DESIGN). */
#define EXO_GDN_CHUNKED_MIN_T 0

/* Gated RMSNorm per value head: x (rows of n_heads*dim, contiguous) becomes rmsnorm(x over dim, eps) * w * silu(z);
 * z rows have stride z_stride (head h of row t at z + t*z_stride + h*dim); w: dim weights shared by all heads. */
void exo_cpu_rmsnorm_gated(exo_pool *pool, float *x, const float *z, int z_stride, const float *w,
                           int T, int n_heads, int dim, float eps);

#endif
