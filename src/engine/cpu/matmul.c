/* The CPU matmul driver (see matmul.h): path selection, scratch memory,
 * thread splitting, the portable reference path and the oneDNN GEMM path.
 *
 * Design:
 *  - One exo_pool_run per call for the GEMV and reference paths: the rows of
 *    all n weights are concatenated and split into contiguous ranges, so a
 *    q/k/v or gate/up call costs one fork-join.
 *  - The GEMV path quantizes each row of X once per (layout, group size)
 *    that the call's affine weights need, before the dispatch.
 *  - The GEMM path hands whole weights to oneDNN when they are already in a
 *    type it multiplies (F32 -> f32 matmul, exact; BF16 -> bf16 matmul) and
 *    otherwise expands panels of rows to bf16 (threaded through the pool)
 *    so a 128256-row LM head never exists in bf16 all at once. oneDNN
 *    primitives are cached per shape (creating one costs far more than a
 *    small matmul). The weight is given to oneDNN as a K x N matrix with
 *    strides (1, K), i.e. the row-major N x K weight itself, no copy.
 *  - Scratch buffers live in the context and only grow.
 * Without AVX-512 the GEMV path falls back to the reference path and GEMM
 * panels are f32. */
#include "engine/cpu/matmul.h"
#include "core/alloc.h"
#include "core/cpu_features.h"
#include "core/log.h"
#include "engine/cpu/kernels.h"
#include "engine/quant.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#define GEMV_MAX_T 4          /* AUTO: T <= this takes the GEMV path */
#define PANEL_BYTES (8u << 20) /* target size of one expanded weight panel */
#define PRIM_CACHE 32
#define MAX_QACT 6            /* (2 layouts) x (3 group sizes) */

typedef struct buf {
    void *p;
    size_t cap;
} buf;

typedef struct prim_entry {
    int used;
    unsigned long last;
    int bf16;
    int64_t M, K, N, ldc;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
} prim_entry;

struct exo_cpu_matmul_ctx {
    exo_pool *pool;
    int nth;
    exo_matmul_path force;
    buf act, thr, panel, xb;
    int dnnl_state; /* 0 untried, 1 ok, -1 failed */
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    prim_entry cache[PRIM_CACHE];
    unsigned long tick;
};

static void *buf_get(buf *b, size_t need)
{
    if (need <= b->cap)
        return b->p;
    exo_free_aligned(b->p);
    size_t cap = need + need / 4 + 4096;
    b->p = exo_alloc_aligned(cap);
    if (!b->p) {
        EXO_LOG_ERROR("matmul: cannot allocate %zu bytes of scratch", cap);
        abort();
    }
    b->cap = cap;
    return b->p;
}

exo_cpu_matmul_ctx *exo_cpu_matmul_ctx_create(exo_pool *pool)
{
    exo_cpu_matmul_ctx *ctx = exo_calloc(1, sizeof *ctx);
    ctx->pool = pool;
    ctx->nth = exo_pool_size(pool);
    return ctx;
}

void exo_cpu_matmul_ctx_free(exo_cpu_matmul_ctx *ctx)
{
    if (!ctx)
        return;
    for (int i = 0; i < PRIM_CACHE; i++) {
        prim_entry *e = &ctx->cache[i];
        if (!e->used)
            continue;
        dnnl_primitive_destroy(e->prim);
        dnnl_memory_destroy(e->src);
        dnnl_memory_destroy(e->wei);
        dnnl_memory_destroy(e->dst);
    }
    if (ctx->strm)
        dnnl_stream_destroy(ctx->strm);
    if (ctx->eng)
        dnnl_engine_destroy(ctx->eng);
    exo_free_aligned(ctx->act.p);
    exo_free_aligned(ctx->thr.p);
    exo_free_aligned(ctx->panel.p);
    exo_free_aligned(ctx->xb.p);
    exo_free(ctx);
}

void exo_cpu_matmul_force_path(exo_cpu_matmul_ctx *ctx, exo_matmul_path path) { ctx->force = path; }

/* ---------------------------------------------------------------------- */
/* Row splitting over the concatenation of all weights                     */

typedef struct rows_job {
    int n;
    const exo_linear *const *w;
    float *const *y;
    const float *x;
    int T;
    int64_t total;
    /* GEMV */
    const exo_qact *qa[MAX_QACT]; /* T each */
    int qa_layout[MAX_QACT], qa_group[MAX_QACT], nqa;
    /* per-thread scratch */
    unsigned char *thr;
    size_t thr_stride;
    int64_t cols;
} rows_job;

typedef void (*rows_fn)(const rows_job *job, int wi, int64_t r0, int64_t r1, unsigned char *scratch);

static void rows_for_thread(const rows_job *job, int ith, int nth, rows_fn fn)
{
    long b, e;
    exo_split_range((long)job->total, EXO_GEMV_ROWS, ith, nth, &b, &e);
    int64_t off = 0;
    for (int i = 0; i < job->n && b < e; i++) {
        int64_t rows = job->w[i]->rows;
        int64_t lo = b > off ? b - off : 0, hi = e - off < rows ? e - off : rows;
        if (lo < hi)
            fn(job, i, lo, hi, job->thr + (size_t)ith * job->thr_stride);
        off += rows;
    }
}

/* ---------------------------------------------------------------------- */
/* Reference path                                                          */

static void ref_rows(const rows_job *job, int wi, int64_t r0, int64_t r1, unsigned char *scratch)
{
    const exo_linear *w = job->w[wi];
    float *row = (float *)scratch;
    int64_t cols = w->cols;
    for (int64_t r = r0; r < r1; r++) {
        exo_linear_row_f32(w, r, row);
        for (int t = 0; t < job->T; t++) {
            const float *xt = job->x + (int64_t)t * cols;
            double acc = 0.0;
            for (int64_t c = 0; c < cols; c++)
                acc += (double)row[c] * (double)xt[c];
            job->y[wi][(int64_t)t * w->rows + r] = (float)acc;
        }
    }
}

static void ref_thread(void *p, int ith, int nth) { rows_for_thread(p, ith, nth, ref_rows); }

/* ---------------------------------------------------------------------- */
/* GEMV path                                                               */

static int qact_layout(const exo_linear *w) { return w->bits == 4 ? EXO_QLAYOUT_Q4 : EXO_QLAYOUT_Q8; }

static void gemv_rows(const rows_job *job, int wi, int64_t r0, int64_t r1, unsigned char *scratch)
{
    const exo_linear *w = job->w[wi];
    if (w->format == EXO_WFORMAT_DENSE) {
        exo_gemv_dense_avx512(w, r0, r1, job->T, job->x, job->y[wi], w->rows);
        return;
    }
    const exo_qact *qa = NULL;
    for (int k = 0; k < job->nqa; k++)
        if (job->qa_layout[k] == qact_layout(w) && job->qa_group[k] == w->group_size)
            qa = job->qa[k];
    int64_t cols = job->cols;
    exo_gemv_scratch s;
    s.sf_stride = exo_gemv_sf_stride(cols);
    s.code_stride = exo_gemv_code_stride(cols);
    s.sf = (float *)scratch;
    s.bf = s.sf + EXO_GEMV_ROWS * s.sf_stride;
    s.sd = s.bf + EXO_GEMV_ROWS * s.sf_stride;
    s.codes = (uint8_t *)(s.sd + EXO_GEMV_ROWS * s.sf_stride);
    exo_gemv_affine_avx512(w, r0, r1, job->T, qa, job->y[wi], w->rows, &s);
}

static void gemv_thread(void *p, int ith, int nth) { rows_for_thread(p, ith, nth, gemv_rows); }

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t thr_scratch_bytes(int64_t cols)
{
    size_t ref = round64((size_t)cols * sizeof(float));
    size_t gemv = round64(3 * EXO_GEMV_ROWS * (size_t)exo_gemv_sf_stride(cols) * sizeof(float)) +
                  round64(EXO_GEMV_ROWS * (size_t)exo_gemv_code_stride(cols));
    return (ref > gemv ? ref : gemv) + 64;
}

static void setup_thr(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    job->thr_stride = thr_scratch_bytes(job->cols);
    job->thr = buf_get(&ctx->thr, job->thr_stride * (size_t)ctx->nth);
}

static void run_gemv(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    int64_t cols = job->cols;
    int T = job->T;
    /* which quantized activations are needed */
    for (int i = 0; i < job->n; i++) {
        const exo_linear *w = job->w[i];
        if (w->format != EXO_WFORMAT_AFFINE)
            continue;
        int have = 0;
        for (int k = 0; k < job->nqa; k++)
            have |= job->qa_layout[k] == qact_layout(w) && job->qa_group[k] == w->group_size;
        if (!have && job->nqa < MAX_QACT) {
            job->qa_layout[job->nqa] = qact_layout(w);
            job->qa_group[job->nqa] = w->group_size;
            job->nqa++;
        }
    }
    if (job->nqa) {
        size_t qb = round64((size_t)exo_qact_q_len(cols));
        size_t db = round64((size_t)exo_qact_sx_len(cols) * sizeof(float));
        size_t sb = round64((size_t)exo_qact_sx_len(cols) * sizeof(float));
        size_t per = qb + db + sb;
        size_t hdr = round64(sizeof(exo_qact) * (size_t)T * MAX_QACT);
        unsigned char *mem = buf_get(&ctx->act, hdr + qb + per * (size_t)T * (size_t)job->nqa);
        exo_qact *hd = (exo_qact *)mem;
        int8_t *tmp = (int8_t *)(mem + hdr);
        unsigned char *p = mem + hdr + qb;
        for (int k = 0; k < job->nqa; k++) {
            exo_qact *qa = hd + (size_t)k * (size_t)T;
            for (int t = 0; t < T; t++) {
                qa[t].q = (int8_t *)p;
                qa[t].dx = (float *)(p + qb);
                qa[t].sx = (float *)(p + qb + db);
                p += per;
                exo_qact_build_avx512(job->x + (int64_t)t * cols, cols, job->qa_group[k],
                                      job->qa_layout[k], &qa[t], tmp);
            }
            job->qa[k] = qa;
        }
    }
    setup_thr(ctx, job);
    exo_pool_run(ctx->pool, gemv_thread, job);
}

/* ---------------------------------------------------------------------- */
/* GEMM path (oneDNN)                                                      */

static int dnnl_init(exo_cpu_matmul_ctx *ctx)
{
    if (ctx->dnnl_state == 0) {
        ctx->dnnl_state = -1;
        if (dnnl_engine_create(&ctx->eng, dnnl_cpu, 0) == dnnl_success &&
            dnnl_stream_create(&ctx->strm, ctx->eng, dnnl_stream_default_flags) == dnnl_success)
            ctx->dnnl_state = 1;
        else
            EXO_LOG_WARN("matmul: oneDNN unavailable, prefill uses the reference path");
    }
    return ctx->dnnl_state == 1;
}

/* y (M x N, row stride ldc) = x (M x K) * W^T, W given as N x K rows. */
static prim_entry *prim_get(exo_cpu_matmul_ctx *ctx, int bf16, int64_t M, int64_t K, int64_t N,
                            int64_t ldc)
{
    prim_entry *victim = NULL;
    for (int i = 0; i < PRIM_CACHE; i++) {
        prim_entry *e = &ctx->cache[i];
        if (e->used && e->bf16 == bf16 && e->M == M && e->K == K && e->N == N && e->ldc == ldc) {
            e->last = ++ctx->tick;
            return e;
        }
        if (!victim || (victim->used && (!e->used || e->last < victim->last)))
            victim = e;
    }
    if (victim->used) {
        dnnl_primitive_destroy(victim->prim);
        dnnl_memory_destroy(victim->src);
        dnnl_memory_destroy(victim->wei);
        dnnl_memory_destroy(victim->dst);
        victim->used = 0;
    }
    dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_dims_t sd = {M, K}, ss = {K, 1};
    dnnl_dims_t wd = {K, N}, ws = {1, K};
    dnnl_dims_t dd = {M, N}, ds = {ldc, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    if (dnnl_memory_desc_init_by_strides(&src_md, 2, sd, in, ss) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&wei_md, 2, wd, in, ws) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&dst_md, 2, dd, dnnl_f32, ds) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, ctx->eng, NULL) != dnnl_success)
        return NULL;
    int ok = dnnl_primitive_create(&prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok)
        return NULL;
    victim->prim = prim;
    if (dnnl_memory_create(&victim->src, &src_md, ctx->eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&victim->wei, &wei_md, ctx->eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&victim->dst, &dst_md, ctx->eng, DNNL_MEMORY_NONE) != dnnl_success) {
        EXO_LOG_ERROR("matmul: oneDNN memory creation failed");
        abort();
    }
    victim->used = 1;
    victim->last = ++ctx->tick;
    victim->bf16 = bf16;
    victim->M = M;
    victim->K = K;
    victim->N = N;
    victim->ldc = ldc;
    return victim;
}

static int dnnl_mm(exo_cpu_matmul_ctx *ctx, int bf16, int64_t M, int64_t K, int64_t N,
                   const void *x, const void *w, float *y, int64_t ldc)
{
    prim_entry *e = prim_get(ctx, bf16, M, K, N, ldc);
    if (!e)
        return EXO_EUNSUPPORTED;
    dnnl_memory_set_data_handle(e->src, (void *)x);
    dnnl_memory_set_data_handle(e->wei, (void *)w);
    dnnl_memory_set_data_handle(e->dst, y);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei}, {DNNL_ARG_DST, e->dst}};
    if (dnnl_primitive_execute(e->prim, ctx->strm, 3, args) != dnnl_success)
        return EXO_EINTERNAL;
    dnnl_stream_wait(ctx->strm);
    return 0;
}

typedef struct panel_job {
    const exo_linear *w;
    int64_t r0, r1;
    int bf16;
    void *out;
    unsigned char *thr;
    size_t thr_stride;
} panel_job;

static void panel_thread(void *p, int ith, int nth)
{
    const panel_job *job = p;
    long b, e;
    exo_split_range((long)(job->r1 - job->r0), 1, ith, nth, &b, &e);
    if (b >= e)
        return;
    int64_t cols = job->w->cols;
    if (job->bf16) {
        exo_dequant_rows_bf16_avx512(job->w, job->r0 + b, job->r0 + e,
                                     (uint16_t *)job->out + b * cols,
                                     job->thr + (size_t)ith * job->thr_stride);
    } else {
        for (long r = b; r < e; r++)
            exo_linear_row_f32(job->w, job->r0 + r, (float *)job->out + r * cols);
    }
}

static int run_gemm(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                    int T, float *const *y)
{
    if (!dnnl_init(ctx))
        return EXO_EUNSUPPORTED;
    int64_t K = w[0]->cols;
    int avx512 = exo_cpu_isa() >= EXO_ISA_AVX512;
    const uint16_t *xb = NULL;
    for (int i = 0; i < n; i++) {
        int is_f32 = w[i]->format == EXO_WFORMAT_DENSE && w[i]->dtype == EXO_DTYPE_F32;
        if (!is_f32 && avx512 && !xb) {
            uint16_t *b = buf_get(&ctx->xb, (size_t)T * (size_t)K * 2);
            exo_f32_to_bf16_avx512(x, (int64_t)T * K, b);
            xb = b;
        }
    }
    for (int i = 0; i < n; i++) {
        const exo_linear *wi = w[i];
        int64_t N = wi->rows;
        int rc;
        if (wi->format == EXO_WFORMAT_DENSE && wi->dtype == EXO_DTYPE_F32) {
            rc = dnnl_mm(ctx, 0, T, K, N, x, wi->w, y[i], N);
        } else if (wi->format == EXO_WFORMAT_DENSE && wi->dtype == EXO_DTYPE_BF16 && avx512) {
            rc = dnnl_mm(ctx, 1, T, K, N, xb, wi->w, y[i], N);
        } else {
            size_t esz = avx512 ? 2 : 4;
            int64_t P = (int64_t)(PANEL_BYTES / ((size_t)K * esz));
            P = P < 64 ? 64 : P / 64 * 64;
            if (P > N)
                P = N;
            void *panel = buf_get(&ctx->panel, (size_t)P * (size_t)K * esz);
            panel_job pj = {.w = wi, .bf16 = avx512, .out = panel};
            pj.thr_stride = round64((size_t)exo_gemv_code_stride(K));
            pj.thr = buf_get(&ctx->thr, pj.thr_stride * (size_t)ctx->nth);
            rc = 0;
            for (int64_t p0 = 0; p0 < N && rc == 0; p0 += P) {
                int64_t pn = N - p0 < P ? N - p0 : P;
                pj.r0 = p0;
                pj.r1 = p0 + pn;
                exo_pool_run(ctx->pool, panel_thread, &pj);
                rc = dnnl_mm(ctx, avx512, T, K, pn, avx512 ? (const void *)xb : (const void *)x,
                             panel, y[i] + p0, N);
            }
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */

void exo_cpu_matmul(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                    int T, float *const *y)
{
    if (n <= 0 || T <= 0)
        return;
    rows_job job = {.n = n, .w = w, .y = y, .x = x, .T = T, .cols = w[0]->cols};
    for (int i = 0; i < n; i++)
        job.total += w[i]->rows;
    exo_matmul_path path = ctx->force;
    int avx512 = exo_cpu_isa() >= EXO_ISA_AVX512;
    if (path == EXO_MATMUL_AUTO)
        path = T <= GEMV_MAX_T ? EXO_MATMUL_GEMV : EXO_MATMUL_GEMM;
    if (path == EXO_MATMUL_GEMM && run_gemm(ctx, n, w, x, T, y) == 0)
        return;
    if (path == EXO_MATMUL_GEMV && avx512) {
        run_gemv(ctx, &job);
        return;
    }
    setup_thr(ctx, &job);
    exo_pool_run(ctx->pool, ref_thread, &job);
}
