/* The CPU matmul driver (see matmul.h): path selection, scratch memory,
 * thread splitting, the portable reference path and the oneDNN GEMM path.
 *
 * Design:
 *  - One exo_pool_run per call: the rows of all n weights are concatenated,
 *    so a q/k/v or gate/up call costs one fork-join. GEMV/reference threads
 *    take ~256 KiB chunks of rows, own range first, then stealing (dynamic: on
 *    shared cores one thread is often slowed by other processes).
 *  - The GEMV path quantizes each row of X once per (layout, group size)
 *    that the call's affine weights need, before the dispatch.
 *  - The GEMM path runs oneDNN inside the pool: each pool thread owns a
 *    slice of every weight's output columns and multiplies it with its own
 *    single-threaded primitives (OpenMP team of one), so oneDNN's OpenMP
 *    threads never spin against the pool's on the same cores. F32 weights
 *    go to an f32 matmul (exact) and BF16 ones to a bf16 matmul in place;
 *    affine and F16 ones are expanded to bf16 in per-thread panels of about
 *    2 MiB, so a 128256-row LM head never exists in bf16 all at once. The
 *    weight is given to oneDNN as a K x N matrix with strides (1, K), i.e.
 *    the row-major N x K weight itself. Primitives are cached per shape and
 *    thread (creating one costs far more than a small matmul).
 *  - Scratch buffers live in the context and only grow.
 *  - MXFP4 weights (linear.h) run on the affine machinery: GEMV on the
 *    Q4/group-32 activations (one set shared with affine q4 g32 weights of
 *    the same call) through exo_gemv_mxfp4_avx512 or, on AVX2-only CPUs,
 *    exo_gemv_mxfp4_avx2; GEMM panels are expanded to bf16 exactly.
 * Without AVX-512 the GEMV path runs MXFP4, affine (groups of 32, 64, 128,
 * ...) and dense weights on the AVX2 kernels (gemv_mxfp4_avx2.c,
 * gemv_avx2.c), anything else on the reference path, and GEMM panels are
 * f32. */
#include "engine/cpu/matmul.h"
#include "core/alloc.h"
#include "core/cpu_features.h"
#include "core/log.h"
#include "engine/cpu/kernels.h"
#include "engine/quant.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

/* AUTO takes the GEMV path for T <= GEMV_MAX_T rows, whatever the format:
 * a row's product is then the same bits at any row count up to it, so a
 * batch of decode rows gives each sequence what it would get alone
 * (exo_model_step_batch). For weights the GEMM would expand to bf16
 * (affine, F16) it is also the faster path there: expansion costs about as
 * much as 8-16 GEMV passes (2048x2048 q4: GEMV 0.4-0.8 ms at T = 4..16,
 * GEMM > 1.5 ms); for bf16 and f32 weights the GEMM on AMX would be faster
 * from about 5 rows, which batch invariance is worth. */
#define GEMV_MAX_T EXO_CPU_GEMV_MAX_ROWS
#define PANEL_BYTES (2u << 20) /* target size of one thread's expanded weight panel */
#define PRIM_CACHE 32
#define MAX_QACT 6            /* (2 layouts) x (3 group sizes) */
#define MAX_SPANS 64          /* threads with their own row range; more share */

typedef struct buf {
    void *p;
    size_t cap;
} buf;

typedef struct prim_entry {
    int used;
    unsigned long last;
    int bf16, wt;
    int64_t M, K, N, ldc;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
} prim_entry;

/* oneDNN state of one pool thread: each thread runs its own single-threaded
 * primitives on its own slice of the output (see run_gemm). */
typedef struct dnnl_slot {
    dnnl_stream_t strm;
    prim_entry cache[PRIM_CACHE];
    unsigned long tick;
    buf panel, dtmp, codes;
    int rc;
} dnnl_slot;

struct exo_cpu_matmul_ctx {
    exo_pool *pool;
    int nth;
    exo_matmul_path force;
    int amx; /* batched GEMV rows on the tile units (exo_gemv_affine_amx) */
    buf act, thr, xb, tiles, panx;
    int dnnl_state; /* 0 untried, 1 ok, -1 failed */
    dnnl_engine_t eng;
    dnnl_slot *slot; /* nth of them */
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
    ctx->slot = exo_calloc((size_t)ctx->nth, sizeof *ctx->slot);
    ctx->amx = exo_cpu_has_amx() && exo_amx_usable();
    /* EXO_MATMUL_PATH pins a path for a whole process: the parity tests use
     * it to check each path of the real binary against transformers. */
    const char *path = getenv("EXO_MATMUL_PATH");
    if (path && !strcmp(path, "reference"))
        ctx->force = EXO_MATMUL_REFERENCE;
    else if (path && !strcmp(path, "gemv"))
        ctx->force = EXO_MATMUL_GEMV;
    else if (path && !strcmp(path, "gemm"))
        ctx->force = EXO_MATMUL_GEMM;
    return ctx;
}

static void prim_release(prim_entry *e)
{
    if (!e->used)
        return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->src);
    dnnl_memory_destroy(e->wei);
    dnnl_memory_destroy(e->dst);
    e->used = 0;
}

void exo_cpu_matmul_ctx_free(exo_cpu_matmul_ctx *ctx)
{
    if (!ctx)
        return;
    for (int t = 0; t < ctx->nth; t++) {
        dnnl_slot *sl = &ctx->slot[t];
        for (int i = 0; i < PRIM_CACHE; i++)
            prim_release(&sl->cache[i]);
        if (sl->strm)
            dnnl_stream_destroy(sl->strm);
        exo_free_aligned(sl->panel.p);
        exo_free_aligned(sl->dtmp.p);
        exo_free_aligned(sl->codes.p);
    }
    exo_free(ctx->slot);
    if (ctx->eng)
        dnnl_engine_destroy(ctx->eng);
    exo_free_aligned(ctx->act.p);
    exo_free_aligned(ctx->thr.p);
    exo_free_aligned(ctx->xb.p);
    exo_free_aligned(ctx->tiles.p);
    exo_free_aligned(ctx->panx.p);
    exo_free(ctx);
}

void exo_cpu_matmul_force_path(exo_cpu_matmul_ctx *ctx, exo_matmul_path path) { ctx->force = path; }

int exo_cpu_matmul_use_amx(exo_cpu_matmul_ctx *ctx, int on)
{
    ctx->amx = on && exo_cpu_has_amx() && exo_amx_usable();
    return ctx->amx;
}

bool exo_cpu_matmul_wants_panels(const exo_cpu_matmul_ctx *ctx)
{
    const char *env = getenv("EXO_CPU_PANELS");
    return exo_cpu_isa() >= EXO_ISA_AVX512 && !ctx->amx && !(env && !strcmp(env, "0"));
}

/* ---------------------------------------------------------------------- */
/* Row splitting over the concatenation of all weights                     */

typedef struct rows_job {
    exo_isa isa;
    int n;
    const exo_linear *const *w;
    float *const *y;
    const float *x;
    const float *const *xs; /* matmul_each: weight i's own input (else NULL: x) */
    int T;
    int64_t total;
    /* GEMV */
    const exo_qact *const *qaw; /* matmul_each: weight i's quantized input (T each) */
    const exo_qact *qa[MAX_QACT]; /* T each */
    const exo_qtile *qt[MAX_QACT]; /* the same as AMX tiles, or NULL */
    const exo_qpanel *qp[MAX_QACT]; /* the same for affine panels weights, or NULL */
    const exo_qpanel *const *qpw;   /* matmul_each: weight i's, for a panels weight */
    int group_sums;                /* exo_gemv_scratch.group_sums: the context's tile units */
    int qa_layout[MAX_QACT], qa_group[MAX_QACT], nqa;
    /* work distribution (rows_for_thread): chunk c of thread i covers rows
     * first[i] + c*chunk ..; span[i] packs (front << 32 | back) chunk
     * indices still to do */
    int64_t chunk;
    int nspan;
    int64_t first[MAX_SPANS], last[MAX_SPANS];
    _Atomic uint64_t span[MAX_SPANS];
    /* per-thread scratch */
    unsigned char *thr;
    size_t thr_stride;
    int64_t cols;
} rows_job;

typedef void (*rows_fn)(const rows_job *job, int wi, int64_t r0, int64_t r1, unsigned char *scratch);

/* Each thread streams its own contiguous range of rows, front to back, in
 * chunks of ~CHUNK_BYTES; a thread that finishes early steals chunks from
 * the back of another's range. Contiguous ranges matter: with the two
 * threads interleaving small chunks of one matrix, decode reached ~58% of
 * the read bandwidth, with contiguous halves ~70% (llama-3.2-1b q4). Stealing
 * matters on shared cores, where one thread is often slowed by another
 * process and a fixed split would leave the other waiting. */
#define CHUNK_BYTES (256u << 10)

static int64_t chunk_rows(const rows_job *job)
{
    int64_t bytes = 0;
    for (int i = 0; i < job->n; i++)
        bytes += (int64_t)exo_linear_bytes(job->w[i]);
    int64_t row_bytes = job->total ? bytes / job->total : 1;
    int64_t c = (int64_t)CHUNK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    c = c / EXO_GEMV_SPAN_ROWS * EXO_GEMV_SPAN_ROWS;
    return c < EXO_GEMV_SPAN_ROWS ? EXO_GEMV_SPAN_ROWS : c;
}

static void setup_spans(rows_job *job, int nth)
{
    job->chunk = chunk_rows(job);
    job->nspan = nth < MAX_SPANS ? nth : MAX_SPANS;
    for (int i = 0; i < job->nspan; i++) {
        long b, e;
        exo_split_range((long)job->total, EXO_GEMV_SPAN_ROWS, i, job->nspan, &b, &e);
        job->first[i] = b;
        job->last[i] = e;
        uint64_t n = (uint64_t)((e - b + job->chunk - 1) / job->chunk);
        atomic_store_explicit(&job->span[i], n, memory_order_relaxed); /* front 0, back n */
    }
}

/* Takes chunk index from the front (own range) or the back (stealing) of
 * span i; -1 when it is empty. */
static int64_t take_chunk(rows_job *job, int i, int from_back)
{
    uint64_t cur = atomic_load_explicit(&job->span[i], memory_order_relaxed);
    for (;;) {
        uint64_t front = cur >> 32, back = cur & 0xffffffffu;
        if (front >= back)
            return -1;
        uint64_t next = from_back ? (front << 32) | (back - 1) : ((front + 1) << 32) | back;
        if (atomic_compare_exchange_weak_explicit(&job->span[i], &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int64_t)(from_back ? back - 1 : front);
    }
}

static void run_rows(rows_job *job, int64_t b, int64_t e, int ith, rows_fn fn)
{
    int64_t off = 0;
    for (int i = 0; i < job->n && off < e; i++) {
        int64_t rows = job->w[i]->rows;
        int64_t lo = b > off ? b - off : 0, hi = e - off < rows ? e - off : rows;
        if (lo < hi)
            fn(job, i, lo, hi, job->thr + (size_t)ith * job->thr_stride);
        off += rows;
    }
}

static void rows_for_thread(rows_job *job, int ith, int nth, rows_fn fn)
{
    (void)nth;
    int own = ith % job->nspan;
    for (int k = 0; k < job->nspan; k++) {
        int i = (own + k) % job->nspan;
        int64_t c;
        while ((c = take_chunk(job, i, k != 0)) >= 0) {
            int64_t b = job->first[i] + c * job->chunk;
            int64_t e = b + job->chunk < job->last[i] ? b + job->chunk : job->last[i];
            run_rows(job, b, e, ith, fn);
        }
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
            const float *xt = (job->xs ? job->xs[wi] : job->x) + (int64_t)t * cols;
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

/* Which quantized activations a weight's GEMV kernel reads. */
static int qact_layout(const exo_linear *w)
{
    return w->format == EXO_WFORMAT_MXFP4 || (w->format == EXO_WFORMAT_AFFINE && w->bits == 4) ? EXO_QLAYOUT_Q4
                                                                                              : EXO_QLAYOUT_Q8;
}
static int qact_group(const exo_linear *w)
{
    return w->format == EXO_WFORMAT_MXFP4 ? 32 : w->group_size;
}

/* Whether this CPU has a GEMV kernel for w (else its rows take ref_rows).
 * The AVX2 one takes groups of 32, 64, 128, ... (a chunk of 32 codes in
 * one group; 64 nibble codes in one or two). */
static int has_gemv_kernel(exo_isa isa, const exo_linear *w)
{
    if (isa >= EXO_ISA_AVX512)
        return 1;
    if (isa < EXO_ISA_AVX2)
        return 0;
    if (w->format == EXO_WFORMAT_AFFINE)
        return w->group_size >= 32 && !(w->group_size & (w->group_size - 1));
    if (w->format == EXO_WFORMAT_DENSE)
        return w->dtype == EXO_DTYPE_F32 || w->dtype == EXO_DTYPE_F16 || w->dtype == EXO_DTYPE_BF16;
    return w->format == EXO_WFORMAT_MXFP4;
}

int exo_cpu_matmul_has_gemv(const exo_linear *w) { return has_gemv_kernel(exo_cpu_isa(), w); }

/* Whether w's kernel reads exo_qact.x16: AVX2's affine one alone. */
static int reads_x16(exo_isa isa, const exo_linear *w)
{
    return isa < EXO_ISA_AVX512 && w->format == EXO_WFORMAT_AFFINE;
}

static void gemv_rows(const rows_job *job, int wi, int64_t r0, int64_t r1, unsigned char *scratch)
{
    const exo_linear *w = job->w[wi];
    if (!has_gemv_kernel(job->isa, w)) {
        ref_rows(job, wi, r0, r1, scratch);
        return;
    }
    if (w->format == EXO_WFORMAT_DENSE) {
        const float *x = job->xs ? job->xs[wi] : job->x;
        if (job->isa >= EXO_ISA_AVX512)
            exo_gemv_dense_avx512(w, r0, r1, job->T, x, job->y[wi], w->rows);
        else
            exo_gemv_dense_avx2(w, r0, r1, job->T, x, job->y[wi], w->rows);
        return;
    }
    const exo_qact *qa = job->qaw ? job->qaw[wi] : NULL;
    const exo_qtile *qt = NULL;
    const exo_qpanel *qp = job->qpw ? job->qpw[wi] : NULL;
    for (int k = 0; k < job->nqa && !qa; k++)
        if (job->qa_layout[k] == qact_layout(w) && job->qa_group[k] == qact_group(w)) {
            qa = job->qa[k];
            qt = job->qt[k];
            qp = job->qp[k];
        }
    int64_t cols = job->cols;
    if (w->format == EXO_WFORMAT_AFFINE_PANELS) {
        exo_gemv_panels_avx512(w, r0, r1, qp, job->y[wi], w->rows);
        return;
    }
    if (qt && exo_qtile_handles(w)) {
        exo_gemv_affine_amx(w, r0, r1, qt, job->y[wi], w->rows, scratch);
        return;
    }
    exo_gemv_scratch s;
    s.sf_stride = exo_gemv_sf_stride(cols);
    s.code_stride = exo_gemv_code_stride(cols);
    s.sd = (float *)scratch;
    s.codes = (uint8_t *)(s.sd + EXO_GEMV_SD_SLOTS * s.sf_stride);
    s.group_sums = job->group_sums;
    if (w->format == EXO_WFORMAT_AFFINE && job->isa >= EXO_ISA_AVX512)
        exo_gemv_affine_avx512(w, r0, r1, job->T, qa, job->y[wi], w->rows, &s);
    else if (w->format == EXO_WFORMAT_AFFINE)
        exo_gemv_affine_avx2(w, r0, r1, job->T, qa, job->y[wi], w->rows, &s);
    else if (job->isa >= EXO_ISA_AVX512)
        exo_gemv_mxfp4_avx512(w, r0, r1, job->T, qa, job->y[wi], w->rows, &s);
    else
        exo_gemv_mxfp4_avx2(w, r0, r1, job->T, qa, job->y[wi], w->rows, &s);
}

static void gemv_thread(void *p, int ith, int nth) { rows_for_thread(p, ith, nth, gemv_rows); }

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t thr_scratch_bytes(int64_t cols, int amx)
{
    size_t ref = round64((size_t)cols * sizeof(float));
    size_t gemv = round64(EXO_GEMV_SD_SLOTS * (size_t)exo_gemv_sf_stride(cols) * sizeof(float)) +
                  round64(EXO_GEMV_ROWS * (size_t)exo_gemv_code_stride(cols));
    size_t tiles = amx ? exo_gemv_amx_scratch_bytes(cols) : 0;
    size_t most = ref > gemv ? ref : gemv;
    return (most > tiles ? most : tiles) + 64;
}

static void setup_thr(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    setup_spans(job, ctx->nth);
    int amx = 0;
    for (int k = 0; k < job->nqa; k++)
        amx |= job->qt[k] != NULL;
    job->thr_stride = thr_scratch_bytes(job->cols, amx);
    job->thr = buf_get(&ctx->thr, job->thr_stride * (size_t)ctx->nth);
}

/* Batched rows of X go to the tile units where the CPU has them: their
 * activations as B tiles, once per call for all threads. The tile kernel's
 * fixed cost per row tile and group is paid back only from a few rows
 * (bench_matmul rows, 2048 x 8192: q4 tiles 0.71 ms at 4 rows, 0.81 at 8,
 * 1.04-1.11 at 16; the vector kernel 0.43 ms at 2 rows, 0.71-0.77 at 4),
 * and in whole decode steps 4-bit codes gained only from 5 rows (4
 * streams of llama-3.2-1b q4: 65.9 tok/s on tiles, 70.6 on the vector
 * kernel), 8-bit ones, which need no unpacking, from 4 (52 against 44). */
static int amx_min_rows(int layout) { return layout == EXO_QLAYOUT_Q4 ? 5 : 4; }

static void build_tiles(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    if (!ctx->amx || job->T > 16 || job->isa < EXO_ISA_AVX512)
        return;
    int want[MAX_QACT] = {0};
    size_t need = 0;
    for (int k = 0; k < job->nqa; k++) {
        for (int i = 0; i < job->n; i++) {
            const exo_linear *w = job->w[i];
            want[k] |= exo_qtile_handles(w) && qact_layout(w) == job->qa_layout[k] &&
                       qact_group(w) == job->qa_group[k];
        }
        want[k] &= job->T >= amx_min_rows(job->qa_layout[k]);
        if (want[k])
            need += 64 + round64(exo_qtile_bytes(job->cols, job->qa_group[k]));
    }
    if (!need)
        return;
    unsigned char *p = buf_get(&ctx->tiles, need);
    for (int k = 0; k < job->nqa; k++) {
        if (!want[k])
            continue;
        exo_qtile *qt = (exo_qtile *)p;
        exo_qtile_build(job->qa[k], job->T, job->cols, job->qa_group[k], job->qa_layout[k], qt, p + 64);
        job->qt[k] = qt;
        p += 64 + round64(exo_qtile_bytes(job->cols, job->qa_group[k]));
    }
}

/* The rows of X of every activation set that a panels weight reads,
 * interleaved for its kernel (exo_qpanel), once per call for all threads. */
static void build_panels(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    int want[MAX_QACT] = {0};
    size_t need = 0;
    for (int k = 0; k < job->nqa; k++) {
        for (int i = 0; i < job->n; i++)
            want[k] |= job->w[i]->format == EXO_WFORMAT_AFFINE_PANELS && job->qa_layout[k] == EXO_QLAYOUT_Q8 &&
                       job->w[i]->group_size == job->qa_group[k];
        if (want[k])
            need += 64 + round64(exo_qpanel_bytes(job->T, job->cols, job->qa_group[k]));
    }
    if (!need)
        return;
    unsigned char *p = buf_get(&ctx->panx, need);
    for (int k = 0; k < job->nqa; k++) {
        if (!want[k])
            continue;
        exo_qpanel *qp = (exo_qpanel *)p;
        exo_qpanel_build(job->qa[k], job->T, job->cols, job->qa_group[k], qp, p + 64);
        job->qp[k] = qp;
        p += 64 + round64(exo_qpanel_bytes(job->T, job->cols, job->qa_group[k]));
    }
}

static void run_gemv(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    int64_t cols = job->cols;
    int T = job->T;
    /* which quantized activations are needed */
    for (int i = 0; i < job->n; i++) {
        const exo_linear *w = job->w[i];
        if (w->format == EXO_WFORMAT_DENSE || !has_gemv_kernel(job->isa, w))
            continue;
        int have = 0;
        for (int k = 0; k < job->nqa; k++)
            have |= job->qa_layout[k] == qact_layout(w) && job->qa_group[k] == qact_group(w);
        if (!have && job->nqa < MAX_QACT) {
            job->qa_layout[job->nqa] = qact_layout(w);
            job->qa_group[job->nqa] = qact_group(w);
            job->nqa++;
        }
    }
    if (job->nqa) {
        size_t qb = round64((size_t)exo_qact_q_len(cols));
        size_t db = round64((size_t)exo_qact_sx_len(cols) * sizeof(float));
        size_t sb = round64((size_t)exo_qact_sx_len(cols) * sizeof(float));
        size_t xb = job->isa >= EXO_ISA_AVX512 ? 0 : 2 * qb; /* room for exo_qact.x16 */
        size_t per = 2 * qb + db + sb + xb;
        size_t hdr = round64(sizeof(exo_qact) * (size_t)T * MAX_QACT);
        unsigned char *mem = buf_get(&ctx->act, hdr + 2 * qb + per * (size_t)T * (size_t)job->nqa);
        exo_qact *hd = (exo_qact *)mem;
        int8_t *tmp = (int8_t *)(mem + hdr);
        unsigned char *p = mem + hdr + 2 * qb;
        for (int k = 0; k < job->nqa; k++) {
            exo_qact *qa = hd + (size_t)k * (size_t)T;
            int x16 = 0; /* built only where an affine weight reads it (not for MXFP4 alone) */
            for (int i = 0; i < job->n; i++)
                x16 |= reads_x16(job->isa, job->w[i]) && qact_layout(job->w[i]) == job->qa_layout[k] &&
                       qact_group(job->w[i]) == job->qa_group[k];
            for (int t = 0; t < T; t++) {
                qa[t].q = (int8_t *)p;
                qa[t].q2 = (int8_t *)(p + qb);
                qa[t].dx = (float *)(p + 2 * qb);
                qa[t].sx = (float *)(p + 2 * qb + db);
                qa[t].x16 = x16 ? (int16_t *)(p + 2 * qb + db + sb) : NULL;
                p += per;
                if (job->isa >= EXO_ISA_AVX512)
                    exo_qact_build_avx512(job->x + (int64_t)t * cols, cols, job->qa_group[k],
                                          job->qa_layout[k], &qa[t], tmp);
                else
                    exo_qact_build_avx2(job->x + (int64_t)t * cols, cols, job->qa_group[k],
                                        job->qa_layout[k], &qa[t], tmp);
            }
            job->qa[k] = qa;
        }
        build_tiles(ctx, job);
        build_panels(ctx, job);
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
        int ok = dnnl_engine_create(&ctx->eng, dnnl_cpu, 0) == dnnl_success;
        for (int t = 0; ok && t < ctx->nth; t++)
            ok = dnnl_stream_create(&ctx->slot[t].strm, ctx->eng, dnnl_stream_default_flags) ==
                 dnnl_success;
        if (ok)
            ctx->dnnl_state = 1;
        else
            EXO_LOG_WARN("matmul: oneDNN unavailable, prefill uses the reference path");
    }
    return ctx->dnnl_state == 1;
}

/* A cached primitive for y (M x N, dense) = x (M x K) * W^T, W given as
 * N x K rows (a K x N matrix with strides (1, K)) or, wt, as W^T itself
 * (K x N rows, strides (N, 1): expanded affine panels). */
static prim_entry *prim_get(dnnl_engine_t eng, dnnl_slot *sl, int bf16, int wt, int64_t M, int64_t K,
                            int64_t N)
{
    prim_entry *victim = NULL;
    for (int i = 0; i < PRIM_CACHE; i++) {
        prim_entry *e = &sl->cache[i];
        if (e->used && e->bf16 == bf16 && e->wt == wt && e->M == M && e->K == K && e->N == N) {
            e->last = ++sl->tick;
            return e;
        }
        if (!victim || (victim->used && (!e->used || e->last < victim->last)))
            victim = e;
    }
    prim_release(victim);
    dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_dims_t sd = {M, K}, ss = {K, 1};
    dnnl_dims_t wd = {K, N}, ws = {wt ? N : 1, wt ? 1 : K};
    dnnl_dims_t dd = {M, N}, ds = {N, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    if (dnnl_memory_desc_init_by_strides(&src_md, 2, sd, in, ss) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&wei_md, 2, wd, in, ws) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&dst_md, 2, dd, dnnl_f32, ds) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success)
        return NULL;
    int ok = dnnl_primitive_create(&prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok)
        return NULL;
    if (dnnl_memory_create(&victim->src, &src_md, eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&victim->wei, &wei_md, eng, DNNL_MEMORY_NONE) != dnnl_success ||
        dnnl_memory_create(&victim->dst, &dst_md, eng, DNNL_MEMORY_NONE) != dnnl_success) {
        EXO_LOG_ERROR("matmul: oneDNN memory creation failed");
        abort();
    }
    victim->prim = prim;
    victim->used = 1;
    victim->last = ++sl->tick;
    victim->bf16 = bf16;
    victim->wt = wt;
    victim->M = M;
    victim->K = K;
    victim->N = N;
    return victim;
}

/* oneDNN here is built on OpenMP. Each pool thread calls it with an OpenMP
 * team of one (omp_set_num_threads is per calling thread), so no OpenMP
 * worker threads exist to spin against the pool on our two shared cores
 * (they did: alternating pool-parallel weight expansion and OpenMP-parallel
 * matmuls made each side's spinning steal the other's core). libgomp is
 * loaded by libdnnl, so its entry point is looked up, not linked. */
static void omp_threads(int n)
{
    static void (*set_fn)(int);
    static atomic_int looked;
    if (!atomic_load(&looked)) {
        *(void **)&set_fn = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
        atomic_store(&looked, 1);
    }
    if (set_fn)
        set_fn(n);
}

static int dnnl_mm(dnnl_engine_t eng, dnnl_slot *sl, int bf16, int wt, int64_t M, int64_t K, int64_t N,
                   const void *x, const void *w, float *y)
{
    prim_entry *e = prim_get(eng, sl, bf16, wt, M, K, N);
    if (!e)
        return EXO_EUNSUPPORTED;
    dnnl_memory_set_data_handle(e->src, (void *)x);
    dnnl_memory_set_data_handle(e->wei, (void *)w);
    dnnl_memory_set_data_handle(e->dst, y);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei}, {DNNL_ARG_DST, e->dst}};
    if (dnnl_primitive_execute(e->prim, sl->strm, 3, args) != dnnl_success)
        return EXO_EINTERNAL;
    dnnl_stream_wait(sl->strm);
    return 0;
}

typedef struct gemm_job {
    exo_cpu_matmul_ctx *ctx;
    int n;
    const exo_linear *const *w;
    float *const *y;
    const float *x;
    const uint16_t *xb;
    int T;
    int avx512;
    int plain; /* AVX2 without AVX-512: the plain GEMM (gemm_avx2.c), whose rows keep their bits */
} gemm_job;

/* Thread ith computes output columns [r0, r1) of every weight: slices of
 * up to P rows are expanded (affine, F16) or used in place (F32, BF16),
 * multiplied into a dense T x P buffer (oneDNN 2.6 only takes its AMX
 * kernel for a dense destination) and copied out. Without AVX-512 the
 * product is the plain AVX2 GEMM's, not oneDNN's (gemm_avx2.c says why). */
static void gemm_thread(void *p, int ith, int nth)
{
    gemm_job *job = p;
    exo_cpu_matmul_ctx *ctx = job->ctx;
    dnnl_slot *sl = &ctx->slot[ith];
    const int T = job->T;
    sl->rc = 0;
    omp_threads(1);
    for (int i = 0; i < job->n && sl->rc == 0; i++) {
        const exo_linear *w = job->w[i];
        const int64_t K = w->cols, N = w->rows;
        long r0, r1;
        exo_split_range((long)N, 16, ith, nth, &r0, &r1);
        if (r0 >= r1)
            continue;
        const int f32 = w->format == EXO_WFORMAT_DENSE && w->dtype == EXO_DTYPE_F32;
        const int direct = f32 || (w->format == EXO_WFORMAT_DENSE && w->dtype == EXO_DTYPE_BF16 &&
                                   job->avx512);
        const int bf16 = !f32 && job->avx512;
        const size_t esz = bf16 ? 2 : 4;
        int64_t P = (int64_t)(PANEL_BYTES / ((size_t)K * esz));
        P = P < 64 ? 64 : P / 64 * 64;
        if (P > r1 - r0)
            P = r1 - r0;
        float *dt = buf_get(&sl->dtmp, (size_t)T * (size_t)P * sizeof(float));
        void *panel = direct ? NULL : buf_get(&sl->panel, (size_t)P * (size_t)K * esz);
        uint8_t *codes = direct ? NULL : buf_get(&sl->codes, (size_t)exo_gemv_code_stride(K));
        const void *src = bf16 ? (const void *)job->xb : (const void *)job->x;
        for (int64_t p0 = r0; p0 < r1 && sl->rc == 0; p0 += P) {
            int64_t pn = r1 - p0 < P ? r1 - p0 : P;
            const void *wp;
            if (direct) {
                wp = (const unsigned char *)w->w + (size_t)p0 * (size_t)K * esz;
            } else {
                if (bf16 && w->format == EXO_WFORMAT_AFFINE_PANELS) {
                    exo_dequant_panels_bf16t_avx512(w, p0, p0 + pn, panel);
                } else if (bf16) {
                    exo_dequant_rows_bf16_avx512(w, p0, p0 + pn, panel, codes);
                } else {
                    for (int64_t r = 0; r < pn; r++)
                        exo_linear_row_f32(w, p0 + r, (float *)panel + r * K);
                }
                wp = panel;
            }
            const int wt = bf16 && w->format == EXO_WFORMAT_AFFINE_PANELS;
            if (job->plain)
                exo_gemm_f32_avx2_serial(T, (int)pn, (int)K, job->x, wp, dt);
            else
                sl->rc = dnnl_mm(ctx->eng, sl, bf16, wt, T, K, pn, src, wp, dt);
            for (int64_t t = 0; t < T && sl->rc == 0; t++)
                memcpy(job->y[i] + t * N + p0, dt + t * pn, (size_t)pn * sizeof(float));
        }
    }
}

static int run_gemm(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                    int T, float *const *y)
{
    if (!dnnl_init(ctx))
        return EXO_EUNSUPPORTED;
    int64_t K = w[0]->cols;
    gemm_job job = {.ctx = ctx, .n = n, .w = w, .y = y, .x = x, .T = T,
                    .avx512 = exo_cpu_isa() >= EXO_ISA_AVX512, .plain = exo_cpu_isa() == EXO_ISA_AVX2};
    int need_bf16 = 0;
    for (int i = 0; i < n; i++)
        need_bf16 |= !(w[i]->format == EXO_WFORMAT_DENSE && w[i]->dtype == EXO_DTYPE_F32);
    if (need_bf16 && job.avx512) {
        uint16_t *b = buf_get(&ctx->xb, (size_t)T * (size_t)K * 2);
        exo_f32_to_bf16_avx512(x, (int64_t)T * K, b);
        job.xb = b;
    }
    exo_pool_run(ctx->pool, gemm_thread, &job);
    for (int t = 0; t < ctx->nth; t++)
        if (ctx->slot[t].rc)
            return ctx->slot[t].rc;
    return 0;
}

/* ---------------------------------------------------------------------- */

/* Quantized activations, one set per weight of a matmul_each (weight i
 * reads xs[i]), built into the context's activation buffer. */
static void build_each_qact(exo_cpu_matmul_ctx *ctx, rows_job *job)
{
    int64_t cols = job->cols;
    int T = job->T, n = job->n;
    size_t qb = round64((size_t)exo_qact_q_len(cols));
    size_t db = round64((size_t)exo_qact_sx_len(cols) * sizeof(float));
    size_t xb = job->isa >= EXO_ISA_AVX512 ? 0 : 2 * qb; /* room for exo_qact.x16 */
    size_t per = 2 * qb + 2 * db + xb;
    size_t hdr = round64(sizeof(exo_qact) * (size_t)T * (size_t)n), ptrs = round64(sizeof(void *) * (size_t)n);
    size_t panx = 0; /* a panels weight's interleaved rows (exo_qpanel) */
    for (int i = 0; i < n; i++)
        if (job->w[i]->format == EXO_WFORMAT_AFFINE_PANELS)
            panx += 64 + round64(exo_qpanel_bytes(T, cols, job->w[i]->group_size));
    unsigned char *mem = buf_get(&ctx->act, hdr + 2 * ptrs + 2 * qb + per * (size_t)T * (size_t)n + panx);
    exo_qact *hd = (exo_qact *)mem;
    const exo_qact **qaw = (const exo_qact **)(mem + hdr);
    const exo_qpanel **qpw = (const exo_qpanel **)(mem + hdr + ptrs);
    int8_t *tmp = (int8_t *)(mem + hdr + 2 * ptrs);
    unsigned char *p = mem + hdr + 2 * ptrs + 2 * qb;
    for (int i = 0; i < n; i++) {
        const exo_linear *w = job->w[i];
        exo_qact *qa = hd + (size_t)i * (size_t)T;
        qaw[i] = NULL;
        qpw[i] = NULL;
        if (w->format == EXO_WFORMAT_DENSE || !has_gemv_kernel(job->isa, w))
            continue;
        for (int t = 0; t < T; t++) {
            qa[t].q = (int8_t *)p;
            qa[t].q2 = (int8_t *)(p + qb);
            qa[t].dx = (float *)(p + 2 * qb);
            qa[t].sx = (float *)(p + 2 * qb + db);
            qa[t].x16 = reads_x16(job->isa, w) ? (int16_t *)(p + 2 * qb + 2 * db) : NULL;
            p += per;
            const float *x = job->xs[i] + (int64_t)t * cols;
            if (job->isa >= EXO_ISA_AVX512)
                exo_qact_build_avx512(x, cols, qact_group(w), qact_layout(w), &qa[t], tmp);
            else
                exo_qact_build_avx2(x, cols, qact_group(w), qact_layout(w), &qa[t], tmp);
        }
        qaw[i] = qa;
        if (w->format == EXO_WFORMAT_AFFINE_PANELS) {
            exo_qpanel *qp = (exo_qpanel *)p;
            exo_qpanel_build(qa, T, cols, w->group_size, qp, p + 64);
            qpw[i] = qp;
            p += 64 + round64(exo_qpanel_bytes(T, cols, w->group_size));
        }
    }
    job->qaw = qaw;
    job->qpw = qpw;
}

void exo_cpu_matmul_each(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w,
                         const float *const *xs, int T, float *const *y)
{
    if (n <= 0 || T <= 0)
        return;
    rows_job job = {.isa = exo_cpu_isa(), .n = n, .w = w, .y = y, .xs = xs, .T = T, .cols = w[0]->cols,
                    .group_sums = ctx->amx};
    int gemv = 0;
    for (int i = 0; i < n; i++) {
        job.total += w[i]->rows;
        gemv |= has_gemv_kernel(job.isa, w[i]);
    }
    exo_matmul_path path = ctx->force;
    if (path == EXO_MATMUL_AUTO)
        path = T <= GEMV_MAX_T ? EXO_MATMUL_GEMV : EXO_MATMUL_GEMM;
    if (path == EXO_MATMUL_GEMM || (path == EXO_MATMUL_GEMV && !gemv)) { /* one call per weight */
        for (int i = 0; i < n; i++)
            exo_cpu_matmul(ctx, 1, &w[i], xs[i], T, &y[i]);
        return;
    }
    if (path == EXO_MATMUL_GEMV)
        build_each_qact(ctx, &job);
    setup_thr(ctx, &job);
    exo_pool_run(ctx->pool, path == EXO_MATMUL_GEMV ? gemv_thread : ref_thread, &job);
}

static void matmul_on(exo_cpu_matmul_ctx *ctx, exo_matmul_path path, int n, const exo_linear *const *w,
                      const float *x, int T, float *const *y)
{
    if (n <= 0 || T <= 0)
        return;
    rows_job job = {.isa = exo_cpu_isa(), .n = n, .w = w, .y = y, .x = x, .T = T,
                    .cols = w[0]->cols, .group_sums = ctx->amx};
    for (int i = 0; i < n; i++)
        job.total += w[i]->rows;
    int gemv = 0; /* any weight with a GEMV kernel on this CPU */
    for (int i = 0; i < n; i++)
        gemv |= has_gemv_kernel(job.isa, w[i]);
    if (path == EXO_MATMUL_AUTO)
        path = T <= GEMV_MAX_T ? EXO_MATMUL_GEMV : EXO_MATMUL_GEMM;
    if (path == EXO_MATMUL_GEMM && run_gemm(ctx, n, w, x, T, y) == 0)
        return;
    if (path == EXO_MATMUL_GEMV && gemv) {
        run_gemv(ctx, &job);
        return;
    }
    setup_thr(ctx, &job);
    exo_pool_run(ctx->pool, ref_thread, &job);
}

void exo_cpu_matmul(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                    int T, float *const *y)
{
    matmul_on(ctx, ctx->force, n, w, x, T, y);
}

void exo_cpu_matmul_rows(exo_cpu_matmul_ctx *ctx, int n, const exo_linear *const *w, const float *x,
                         int T, float *const *y)
{
    /* where a weight has no GEMV kernel on this CPU (no AVX2, an odd
     * group) the portable path would be far slower than the GEMM: AUTO, and the
     * model's exactness check finds the rows' bits differ */
    exo_matmul_path path = ctx->force != EXO_MATMUL_AUTO ? ctx->force : EXO_MATMUL_GEMV;
    for (int i = 0; i < n && path == EXO_MATMUL_GEMV && ctx->force == EXO_MATMUL_AUTO; i++)
        if (!has_gemv_kernel(exo_cpu_isa(), w[i]))
            path = EXO_MATMUL_AUTO;
    matmul_on(ctx, path, n, w, x, T, y);
}
