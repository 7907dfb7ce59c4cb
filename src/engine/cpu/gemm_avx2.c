/* A plain AVX2/FMA f32 GEMM, C = A * B^T with B given as weight rows (N x K).
 *
 * It is the "plain SIMD GEMM" peer the benchmark compares the oneDNN/AMX
 * prefill path against, and a fallback that needs nothing but AVX2. Classic
 * Goto structure, kept small: for each 256-column x 256-deep block of B (a
 * slice of weight rows) the thread packs B transposed into 16-wide strips
 * (K x 16, L2 resident), then a 6x16 register-blocked micro-kernel (12 ymm
 * accumulators, 2 B loads + 6 A broadcasts per k step) sweeps all rows of A.
 * A is read in place (broadcasts from 6 row pointers), ragged edges go
 * through zero-padded tiles. Threads split the N dimension.
 *
 * Every element of C is one FMA chain over its k in order, a KC block at a
 * time, whichever tile holds its row and however many rows A has: a row of
 * A gets the same bits in any call. oneDNN's f32 GEMM does not give that
 * on CPUs without AVX-512 (a Zen 3 guest: rows 23.. of a 128-row call
 * differ from the same rows in a call of 152), so there the prefill
 * products take this one (matmul.c), as exact rows need (model.h
 * exo_model_exact_rows). */
#include "engine/cpu/matmul.h"
#include "core/alloc.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define MR 6
#define NR 16
#define KC 256
#define NC 256

typedef struct gemm_job {
    int M, N, K;
    const float *A, *B;
    float *C;
} gemm_job;

/* acc(6x16) = sum_k A[i][k] * Bp[k][0..15]; C = acc (+ C when accumulate) */
static void micro_6x16(int kc, const float *const *arow, const float *bp, float *c, int ldc,
                       int accumulate)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
    const float *a0 = arow[0], *a1 = arow[1], *a2 = arow[2], *a3 = arow[3], *a4 = arow[4],
                *a5 = arow[5];
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp + k * NR), b1 = _mm256_load_ps(bp + k * NR + 8);
        __m256 a;
        a = _mm256_broadcast_ss(a0 + k);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a1 + k);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a2 + k);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a3 + k);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(a4 + k);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(a5 + k);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int i = 0; i < MR; i++) {
        float *ci = c + (size_t)i * (size_t)ldc;
        if (accumulate) {
            acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(ci));
            acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(ci + 8));
        }
        _mm256_storeu_ps(ci, acc[i][0]);
        _mm256_storeu_ps(ci + 8, acc[i][1]);
    }
}

/* The strips of 16 columns [nb0, nb1). */
static void gemm_strips(const gemm_job *job, long nb0, long nb1)
{
    const int M = job->M, N = job->N, K = job->K;
    float *bp = exo_alloc_aligned((size_t)KC * NC * sizeof(float));
    float *zero_row = exo_alloc_aligned(KC * sizeof(float));
    float *ctile = exo_alloc_aligned((size_t)MR * NR * sizeof(float));
    if (!bp || !zero_row || !ctile)
        abort();
    for (long jc = nb0 * NR; jc < nb1 * NR && jc < N; jc += NC) {
        int nc = (int)((nb1 * NR < N ? nb1 * NR : N) - jc);
        if (nc > NC)
            nc = NC;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC;
            /* pack B[jc..jc+nc][pc..pc+kc] as strips of 16 columns, k-major */
            for (int s = 0; s < nc; s += NR) {
                float *dst = bp + (size_t)s * KC;
                for (int j = 0; j < NR; j++) {
                    if (s + j < nc) {
                        const float *src = job->B + (size_t)(jc + s + j) * (size_t)K + pc;
                        for (int k = 0; k < kc; k++)
                            dst[k * NR + j] = src[k];
                    } else {
                        for (int k = 0; k < kc; k++)
                            dst[k * NR + j] = 0.0f;
                    }
                }
            }
            for (int i = 0; i < M; i += MR) {
                int mr = M - i < MR ? M - i : MR;
                const float *arow[MR];
                for (int r = 0; r < MR; r++)
                    arow[r] = r < mr ? job->A + (size_t)(i + r) * (size_t)K + pc : zero_row;
                for (int s = 0; s < nc; s += NR) {
                    int nr = nc - s < NR ? nc - s : NR;
                    float *c = job->C + (size_t)i * (size_t)N + jc + s;
                    if (mr == MR && nr == NR) {
                        micro_6x16(kc, arow, bp + (size_t)s * KC, c, N, pc > 0);
                    } else {
                        for (int r = 0; r < mr; r++)
                            for (int j = 0; j < nr; j++)
                                ctile[r * NR + j] = pc > 0 ? c[(size_t)r * N + j] : 0.0f;
                        micro_6x16(kc, arow, bp + (size_t)s * KC, ctile, NR, 1);
                        for (int r = 0; r < mr; r++)
                            for (int j = 0; j < nr; j++)
                                c[(size_t)r * N + j] = ctile[r * NR + j];
                    }
                }
            }
        }
    }
    exo_free_aligned(ctile);
    exo_free_aligned(zero_row);
    exo_free_aligned(bp);
}

static void gemm_thread(void *p, int ith, int nth)
{
    const gemm_job *job = p;
    long nb0, nb1;
    exo_split_range((job->N + NR - 1) / NR, 1, ith, nth, &nb0, &nb1);
    if (nb0 < nb1)
        gemm_strips(job, nb0, nb1);
}

/* Whether C (M x N) has nothing to multiply: empty, or K = 0 (C zeroed). */
static int gemm_trivial(int M, int N, int K, float *C)
{
    if (M <= 0 || N <= 0)
        return 1;
    if (K > 0)
        return 0;
    for (int i = 0; i < M; i++)
        memset(C + (size_t)i * (size_t)N, 0, (size_t)N * sizeof(float));
    return 1;
}

void exo_gemm_f32_avx2(int M, int N, int K, const float *A, const float *B, float *C,
                       exo_pool *pool)
{
    if (gemm_trivial(M, N, K, C))
        return;
    gemm_job job = {M, N, K, A, B, C};
    exo_pool_run(pool, gemm_thread, &job);
}

void exo_gemm_f32_avx2_serial(int M, int N, int K, const float *A, const float *B, float *C)
{
    if (gemm_trivial(M, N, K, C))
        return;
    gemm_job job = {M, N, K, A, B, C};
    gemm_strips(&job, 0, (N + NR - 1) / NR);
}
