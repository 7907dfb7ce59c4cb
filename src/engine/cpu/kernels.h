/* Internal interface between the matmul driver (matmul.c) and the ISA
 * specific kernel files (gemv_avx512.c, gemv_avx2.c, gemv_mxfp4_avx2.c, gemm_avx2.c).
 * Not a public API.
 *
 * The driver owns all memory and threading; kernels work on a row range
 * [r0, r1) of one weight and write y[t*ldy + r] for t < T. */
#ifndef EXO_ENGINE_CPU_KERNELS_H
#define EXO_ENGINE_CPU_KERNELS_H

#include "engine/linear.h"

#include <stdint.h>

/* Rows the GEMV kernels process together (activation loads are shared). */
#define EXO_GEMV_ROWS 4

/* Row stride inside a GEMV row block (gemv_avx512.c says why): the
 * smallest power of two S with S rows covering a 4 KiB page, so that the
 * EXO_GEMV_ROWS rows of a block lie in EXO_GEMV_ROWS different runs of S
 * consecutive rows, each run at least a page long and read front to back.
 * 1 for rows of a page or more. */
static inline int64_t exo_gemv_page_stride(int64_t row_bytes)
{
    int64_t s = 1;
    while (row_bytes > 0 && s * row_bytes < 4096)
        s *= 2;
    return s;
}

/* The rows of row block j of the span [sb, end) the GEMV kernels walk:
 * with page-strided spans (strided, stride S) rows sb + j, sb + j + S, ...,
 * so rows sharing a page land in different blocks; else consecutive rows.
 * Returns how many (fewer than EXO_GEMV_ROWS at a span's end). */
static inline int exo_gemv_block_rows(int64_t sb, int64_t j, int64_t S, int strided, int64_t end,
                                      int64_t *rix)
{
    int R = 0;
    for (int i = 0; i < EXO_GEMV_ROWS; i++) {
        int64_t r = strided ? sb + j + i * S : sb + j * EXO_GEMV_ROWS + i;
        if (r < end)
            rix[R++] = r;
    }
    return R;
}
/* Super-block sb of a range ending at r1 (EXO_GEMV_ROWS * S rows, the
 * last one cut short): whether its blocks are page-strided (whole ones
 * only), where it ends, and how many row blocks it has. */
static inline int64_t exo_gemv_superblock(int64_t sb, int64_t r1, int64_t S, int *strided, int64_t *end)
{
    const int64_t SB = EXO_GEMV_ROWS * S;
    *strided = S > 1 && sb + SB <= r1;
    *end = sb + SB < r1 ? sb + SB : r1;
    return *strided ? S : (*end - sb + EXO_GEMV_ROWS - 1) / EXO_GEMV_ROWS;
}
/* Row ranges handed to the kernels start at multiples of this, so that
 * super-blocks (EXO_GEMV_ROWS * stride rows) stay whole for rows of 256
 * bytes and more. */
#define EXO_GEMV_SPAN_ROWS 64

/* One row of X quantized for integer dot products against affine weights of
 * group size G (and MXFP4 weights: 4-bit codes, group 32, i.e. the Q4 layout
 * with G = 32, shared with affine q4 g32 weights of the same call), in two int8 levels so the product keeps ~16 bits of the
 * activation: per group g, with d_g = max|x| / 127,
 *   q[i]  = round(x[i] / d_g)                      (int8)
 *   q2[i] = round((x[i] - d_g*q[i]) * 256 / d_g)   (int8, clamped to +-127)
 *   xhat[i] = dx_g * (256*q[i] + q2[i]),  dx_g = d_g / 256.
 * One level alone (int8 activations) moved the tiny parity models' logits
 * by ~0.2 (2%); two levels cost one more vpdpbusd per code vector and
 * bring the error below the f32 summation noise of the bias terms.
 * Element order per 64-byte block of weight codes:
 *   Q8 layout (8-bit codes, and 2/3/5/6-bit codes unpacked to bytes):
 *     q[64b + i] = x[64b + i]
 *   Q4 layout (4-bit codes: the low nibbles of a 64-byte block are the even
 *     elements of 128, the high nibbles the odd ones):
 *     q[128b + i] = x[128b + 2i], q[128b + 64 + i] = x[128b + 2i + 1]
 * (q2 likewise). sx[g] = sum of xhat over group g, so that the GEMV computes
 * exactly sum w * xhat. All arrays are zero-padded (see the *_len helpers). */
typedef struct exo_qact {
    int8_t *q;
    int8_t *q2;
    float  *dx;
    float  *sx;
    /* AVX2's affine kernel multiplies one 16-bit activation, 256 q + q2
     * (exactly the two levels' sum), against codes widened to 16 bits:
     * exo_qact_q_len(cols) of them, built by exo_qact_build_avx2 where
     * not NULL. Q8 layout: in element order; Q4 layout: each 64 elements
     * as four vectors of 16, vector m's lane L element 4L + m (the order
     * a 16-bit lane of nibble codes holds them). */
    int16_t *x16;
} exo_qact;

enum { EXO_QLAYOUT_Q8 = 0, EXO_QLAYOUT_Q4 = 1 };

/* Element counts to allocate for one exo_qact of `cols` columns. */
static inline int64_t exo_qact_q_len(int64_t cols) { return (cols + 127) / 128 * 128 + 128; }
static inline int64_t exo_qact_sx_len(int64_t cols) { return cols / 32 + 32; }

/* Slots of sf_stride floats in exo_gemv_scratch.sd. */
#define EXO_GEMV_SD_SLOTS (4 * EXO_GEMV_ROWS)

/* Per-thread scratch of the GEMV kernels. */
typedef struct exo_gemv_scratch {
    float   *sd;     /* EXO_GEMV_SD_SLOTS x sf_stride: scale * dx of a row block against the
                        (up to two) X rows of a pass, then the f32 scales and biases of the
                        row block */
    uint8_t *codes;  /* EXO_GEMV_ROWS x code_stride: unpacked codes */
    int64_t  sf_stride, code_stride;
    int      group_sums; /* affine/MXFP4 numerics: 1 exact group sums (those of the AMX kernel),
                            0 per-lane sums (cheaper for rows of X sharing a pass on vector
                            units alone); see gemv_avx512.c */
} exo_gemv_scratch;

static inline int64_t exo_gemv_sf_stride(int64_t cols) { return cols / 32 + 48; }
static inline int64_t exo_gemv_code_stride(int64_t cols) { return (cols + 63) / 64 * 64 + 64; }

/* AVX-512 (gemv_avx512.c) */
void exo_qact_build_avx512(const float *x, int64_t cols, int G, int layout, exo_qact *out,
                           int8_t *tmp /* 2 * exo_qact_q_len(cols) */);
void exo_gemv_affine_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T,
                            const exo_qact *qa /* T of them */, float *y, int64_t ldy,
                            exo_gemv_scratch *s);
/* MXFP4 rows (format EXO_WFORMAT_MXFP4), same contract; qa: Q4 layout, G 32. */
void exo_gemv_mxfp4_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T,
                           const exo_qact *qa, float *y, int64_t ldy, exo_gemv_scratch *s);
void exo_gemv_dense_avx512(const exo_linear *w, int64_t r0, int64_t r1, int T, const float *x,
                           float *y, int64_t ldy);
/* Rows [r0, r1) of w as bf16, (r1-r0) x cols. codes: exo_gemv_code_stride(cols) bytes. */
void exo_dequant_rows_bf16_avx512(const exo_linear *w, int64_t r0, int64_t r1, uint16_t *out,
                                  uint8_t *codes);
void exo_f32_to_bf16_avx512(const float *x, int64_t n, uint16_t *out);

/* Affine panels (linear.h; gemv_panels_avx512.c). The rows of X a call
 * multiplies, from their exo_qact (Q8 layout, the weight's group size G):
 * the two levels interleaved word by word, x[(k*T + t)*8 ..] = word k (4
 * columns) of row t's q, then of its q2; dxs[g*2T + t] = dx_g of row t,
 * dxs[g*2T + T + t] = its sx_g. Built once a call, shared by every thread. */
typedef struct exo_qpanel {
    int           T;
    const int8_t *x;
    const float  *dxs;
} exo_qpanel;
size_t exo_qpanel_bytes(int T, int64_t cols, int G);
void   exo_qpanel_build(const exo_qact *qa, int T, int64_t cols, int G, exo_qpanel *out,
                        void *mem /* exo_qpanel_bytes, 64-byte aligned */);
/* Rows [r0, r1) of w, any range (a panel a range cuts is computed and only
 * its rows written), against every row of xp. The expansion writes W^T of
 * rows [r0, r1) (multiples of 16), out[c * (r1 - r0) + r - r0], each value
 * the bf16 that exo_dequant_rows_bf16_avx512 gives the row format. */
void exo_gemv_panels_avx512(const exo_linear *w, int64_t r0, int64_t r1, const exo_qpanel *xp, float *y,
                            int64_t ldy);
void exo_dequant_panels_bf16t_avx512(const exo_linear *w, int64_t r0, int64_t r1, uint16_t *out);

/* The f32 scales (MXFP4: 2^(s-128)) and biases of groups [g0, g0 + n) of row
 * r (of ng), zero-padded to a multiple of 16 (gemv_avx512.c). */
void exo_gemv_row_params(const exo_linear *w, int mx, int64_t r, int64_t ng, int64_t g0, int64_t n, float *sc,
                         float *bi);

/* AMX-INT8 (gemv_amx.c): up to 16 rows of X at once, the same bits as
 * exo_gemv_affine_avx512 / exo_gemv_mxfp4_avx512 give row by row in their
 * group-sum family (exo_gemv_scratch.group_sums = 1). */
typedef struct exo_qtile {
    int      T;   /* X rows, <= 16 */
    int8_t  *b;   /* per group, per tile product: the B tiles of the two levels, 1 KiB each */
    float   *dx;  /* [group][16 X rows], zero past T and ng */
    float   *sx;  /* likewise */
} exo_qtile;

/* Whether this process may use the tile units (asks Linux once). */
int    exo_amx_usable(void);
/* Whether exo_gemv_affine_amx takes w: affine 4/8-bit of groups 32, 64 or
 * 128, or MXFP4, with a multiple of 256 columns. */
int    exo_qtile_handles(const exo_linear *w);
size_t exo_qtile_bytes(int64_t cols, int G);
void   exo_qtile_build(const exo_qact *qa, int T, int64_t cols, int G, int layout, exo_qtile *out,
                       void *mem /* exo_qtile_bytes */);
size_t exo_gemv_amx_scratch_bytes(int64_t cols);
void   exo_gemv_affine_amx(const exo_linear *w, int64_t r0, int64_t r1, const exo_qtile *qt, float *y,
                           int64_t ldy, void *scratch /* exo_gemv_amx_scratch_bytes */);

/* AVX2 + FMA (gemv_mxfp4_avx2.c): the same activation quantization (any
 * layout and G, same contract as exo_qact_build_avx512) and the MXFP4 GEMV. */
void exo_qact_build_avx2(const float *x, int64_t cols, int G, int layout, exo_qact *out,
                         int8_t *tmp /* 2 * exo_qact_q_len(cols) */);
void exo_gemv_mxfp4_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const exo_qact *qa,
                         float *y, int64_t ldy, exo_gemv_scratch *s);
/* AVX2 + FMA (gemv_avx2.c): affine rows of groups of 32, 64, 128, ... on
 * their exo_qact (the weight's layout and group size), and dense f32/f16/bf16 rows on X itself; the contracts
 * of the AVX-512 kernels. */
void exo_gemv_affine_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const exo_qact *qa, float *y,
                          int64_t ldy, exo_gemv_scratch *s);
void exo_gemv_dense_avx2(const exo_linear *w, int64_t r0, int64_t r1, int T, const float *x, float *y, int64_t ldy);

#endif
