/* A batch's tokens picked where its logits are (backend.h pick): up to
 * EXO_PICK_ROWS rows of logits, each by its own rule (proto/sampling.h),
 * so that decoding takes token ids off the device, not a vocabulary of
 * logits a row, and the host's sampler has nothing left to do.
 *
 * A row of logits goes over PICK_BLOCKS blocks (one block a row left an
 * H100 reading 512 KB twice through one SM: ~20 us of a 1B model's 630 us
 * token), and the last of a row's blocks to finish combines their parts.
 * A call uploads the penalties' tokens (where a rule names any) and
 * queues, in order:
 *  - max: each block's slice penalized in place (the originals kept: the
 *    row's last reader, sums or top, puts them back, so x is as it came
 *    whatever the rules), then the row's largest (lowest index on ties,
 *    NaN never);
 *  - sums: the log-softmax's sum; greedy rows answer here, and so do rows
 *    drawn over the whole vocabulary (min-p masks the weights), walking
 *    the CDF in the tokens' order as the host's sampler does;
 *  - top (rows with top-k, top-p or alternatives): each block selects its slice's k
 *    largest by their bits (a radix select, 8 bits a pass), the row's last
 *    block sorts the blocks' candidates in shared memory and cuts top-p
 *    and min-p, then draws over what is left, most likely first, as the
 *    host does. Top-p without top-k looks at the EXO_PICK_TOP_K most
 *    likely; where they do not reach p the row is not picked (id -1) and
 *    its logits go to the host, which sorts the vocabulary. Rows asking
 *    for alternatives select them here too (the sorted candidates' first).
 * The device's sums are grouped otherwise than the host's, so a draw or a
 * top-p cut within a rounding of a boundary may go the other way. A row's
 * answer does not depend on the rows beside it. */
#include "engine/cuda/pick.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PICK_THREADS 512
#define PICK_WARPS   (PICK_THREADS / 32)
#define PICK_BLOCKS  16
#define PICK_SEGS    (PICK_BLOCKS * PICK_WARPS)
#define PICK_MERGE   (PICK_BLOCKS * EXO_PICK_TOP_K) /* a row's candidates, which its last block sorts */
static_assert(PICK_SEGS == 32 * 8, "pick_sums_kernel: warp 0 scans the segments, 8 a lane");
static_assert(EXO_PICK_TOP_K <= PICK_THREADS, "pick_top_kernel: a thread a kept candidate");
static_assert(PICK_WARPS * 256 * sizeof(int) <= PICK_MERGE * sizeof(uint64_t), "the histograms fit the sort's room");

struct pick_result {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_ids[EXO_MAX_TOP_LOGPROBS];
    float top_logprobs[EXO_MAX_TOP_LOGPROBS];
};

/* Each row's rule as the kernels take it, by value in the launch. */
struct pick_rules {
    float inv_t[EXO_PICK_ROWS]; /* 1 / temperature; 0: the largest */
    double u[EXO_PICK_ROWS];
    int k[EXO_PICK_ROWS];         /* candidates pick_top_kernel selects; 0: none */
    bool filtered[EXO_PICK_ROWS]; /* drawn after top-k or top-p: pick_top_kernel draws */
    int top_k[EXO_PICK_ROWS];     /* 0: off */
    int n_top[EXO_PICK_ROWS];     /* alternatives */
    float top_p[EXO_PICK_ROWS];   /* 0: off */
    float min_p[EXO_PICK_ROWS]; /* 0: off */
};

/* A call's penalties, uploaded: row r's tokens are tok[off[r] .. off[r] + n[r]). */
struct pick_penalty {
    int32_t id;
    float count;
};
struct pick_penalties {
    int n[EXO_PICK_ROWS], off[EXO_PICK_ROWS];
    float rep[EXO_PICK_ROWS], pres[EXO_PICK_ROWS], freq[EXO_PICK_ROWS];
    struct pick_penalty tok[EXO_PICK_ROWS * EXO_PICK_PENALIZED];
};

/* Device scratch of a call, a row each: the blocks' maxima, the segments'
 * sums, the blocks' candidates, the penalized logits' originals, and the
 * arrival counters of the last-block combines (zero between calls). */
struct pick_scratch {
    float block_v[EXO_PICK_ROWS][PICK_BLOCKS];
    int block_i[EXO_PICK_ROWS][PICK_BLOCKS];
    float best_v[EXO_PICK_ROWS];
    int best_i[EXO_PICK_ROWS];
    float seg_e[EXO_PICK_ROWS][PICK_SEGS];  /* sum exp(x - max): the log-softmax */
    double seg_w[EXO_PICK_ROWS][PICK_SEGS]; /* sum exp((x - max) / T): a draw's weights */
    float sum[EXO_PICK_ROWS];               /* the row's sum exp(x - max) */
    uint64_t cand[EXO_PICK_ROWS][PICK_BLOCKS][EXO_PICK_TOP_K]; /* pick_sort_key */
    int n_cand[EXO_PICK_ROWS][PICK_BLOCKS];
    int n_valid[EXO_PICK_ROWS][PICK_BLOCKS]; /* the slice's values that are not NaN */
    float orig[EXO_PICK_ROWS * EXO_PICK_PENALIZED];
    int arrived[3][EXO_PICK_ROWS];
};

struct exo_cuda_picker {
    struct pick_result *host, *dev; /* answers: pinned, device */
    struct pick_penalties *pen_host, *pen_dev;
    struct pick_scratch *scratch;
};

/* The better of two (value, index): the larger, the lower index on ties;
 * index -1 (nothing but NaN seen) never wins. */
__device__ __forceinline__ void pick_better(float *bv, int *bi, float ov, int oi)
{
    if (oi >= 0 && (*bi < 0 || ov > *bv || (ov == *bv && oi < *bi))) {
        *bv = ov;
        *bi = oi;
    }
}

/* Whether this block is the last of its row's PICK_BLOCKS to finish (its
 * writes before are then seen by the caller); the counter goes back to 0. */
__device__ bool pick_last_block(int *arrived)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(arrived, 1) == PICK_BLOCKS - 1;
        if (last)
            *arrived = 0;
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

/* Row x's named tokens (pen: NULL, none) within [lo, hi) penalized as the
 * host's sampler does (rounded op by op, never fused), their values kept
 * in orig; each thread from `first` takes every `stride`-th. */
__device__ void pick_penalize(float *x, int row, int lo, int hi, const struct pick_penalties *pen, float *orig,
                              int first, int stride)
{
    if (!pen)
        return;
    const int off = pen->off[row];
    const float rep = pen->rep[row], pres = pen->pres[row], freq = pen->freq[row];
    for (int j = first; j < pen->n[row]; j += stride) {
        const struct pick_penalty t = pen->tok[off + j];
        if (t.id < lo || t.id >= hi)
            continue;
        float l = x[t.id];
        orig[off + j] = l;
        if (rep != 1.0f)
            l = l < 0 ? __fmul_rn(l, rep) : __fdiv_rn(l, rep);
        if (pres != 0.0f || freq != 0.0f)
            l = __fsub_rn(l, __fadd_rn(pres, __fmul_rn(freq, t.count)));
        x[t.id] = l;
    }
}

/* Row x's penalized tokens back as they came, by the row's last reader. */
__device__ void pick_restore(float *x, int row, int n, const struct pick_penalties *pen, const float *orig,
                             int first, int stride)
{
    if (!pen)
        return;
    const int off = pen->off[row];
    for (int j = first; j < pen->n[row]; j += stride) {
        const int32_t id = pen->tok[off + j].id;
        if (id >= 0 && id < n)
            x[id] = orig[off + j];
    }
}

/* Block (b, row): its slice of the row penalized, then the largest value
 * there (lowest index on ties, NaN never wins); the row's last block
 * combines the slices in order. */
__global__ void __launch_bounds__(PICK_THREADS) pick_max_kernel(float *rows, int n, const struct pick_penalties *pen,
                                                                struct pick_scratch *ps)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int row = blockIdx.y, b = blockIdx.x, slice = (n + PICK_BLOCKS - 1) / PICK_BLOCKS;
    float *x = rows + (size_t)row * (size_t)n;
    const int lo = b * slice, hi = lo + slice < n ? lo + slice : n;
    pick_penalize(x, row, lo, hi, pen, ps->orig, threadIdx.x, PICK_THREADS);
    __syncthreads();
    __shared__ float wv[PICK_WARPS];
    __shared__ int wi[PICK_WARPS];
    float bv = -INFINITY;
    int bi = -1;
    for (int i = lo + threadIdx.x; i < hi; i += PICK_THREADS)
        if (x[i] > bv) { /* false for NaN; strided order keeps the lowest index per thread */
            bv = x[i];
            bi = i;
        }
    for (int o = 16; o; o >>= 1)
        pick_better(&bv, &bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bv = -INFINITY;
        bi = -1;
        for (int w = 0; w < PICK_WARPS; w++)
            pick_better(&bv, &bi, wv[w], wi[w]);
        ps->block_v[row][b] = bv;
        ps->block_i[row][b] = bi;
    }
    if (!pick_last_block(&ps->arrived[0][row]) || threadIdx.x != 0)
        return;
    bv = -INFINITY;
    bi = -1;
    for (int k = 0; k < PICK_BLOCKS; k++)
        pick_better(&bv, &bi, ps->block_v[row][k], ps->block_i[row][k]);
    ps->best_v[row] = bv;
    ps->best_i[row] = bi;
}

/* pick_sums_kernel's answer for its row, by its last block's first warp:
 * the log-softmax's sum, and a greedy row's or a whole-vocabulary draw's
 * token. */
__device__ void pick_sums_answer(const float *x, int n, int row, int seg, const struct pick_rules &rules,
                                 struct pick_scratch *ps, struct pick_result *out)
{
    const int lane = threadIdx.x & 31, bi = ps->best_i[row];
    const float bv = ps->best_v[row], inv_t = rules.inv_t[row];
    const bool draws = inv_t != 0.0f && !rules.filtered[row];
    const float cut = rules.min_p[row] > 0 ? bv + logf(rules.min_p[row]) : -INFINITY;
    float sum = 0;
    for (int j = 0; j < PICK_SEGS / 32; j++)
        sum += ps->seg_e[row][lane * (PICK_SEGS / 32) + j];
    for (int o = 16; o; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
        ps->sum[row] = sum;
        out->n_top = 0; /* pick_top_kernel's, where the rule asks */
    }
    if (inv_t == 0.0f || bi < 0) {
        if (lane == 0) { /* and of a filtered row with nothing but NaN */
            out->id = bi < 0 ? 0 : bi;
            out->logprob = bi < 0 ? -INFINITY : -logf(sum);
        }
        return;
    }
    if (!draws)
        return;
    const double *sw = ps->seg_w[row];
    double mine = 0;
    for (int j = 0; j < PICK_SEGS / 32; j++)
        mine += sw[lane * (PICK_SEGS / 32) + j];
    double incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
        double v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
            incl += v;
    }
    double before = __shfl_up_sync(0xffffffffu, incl, 1);
    const double r = rules.u[row] * __shfl_sync(0xffffffffu, incl, 31);
    unsigned falls = __ballot_sync(0xffffffffu, r < incl);
    const int in = falls ? __ffs(falls) - 1 : 31;
    double acc = in ? __shfl_sync(0xffffffffu, before, in) : 0;
    int t = in * (PICK_SEGS / 32); /* the segment where r falls: the lanes walk it alike */
    while (t < in * (PICK_SEGS / 32) + PICK_SEGS / 32 - 1 && !(r < acc + sw[t]))
        acc += sw[t++];
    int chosen = -1, last = -1;
    for (int base = t * seg, end = base + seg < n ? base + seg : n; base < end && chosen < 0; base += 32) {
        int i = base + lane;
        double wi = i < end && !isnan(x[i]) && x[i] >= cut ? (double)__expf((x[i] - bv) * inv_t) : 0.0;
        double upto = wi;
        for (int o = 1; o < 32; o <<= 1) {
            double v = __shfl_up_sync(0xffffffffu, upto, o);
            if (lane >= o)
                upto += v;
        }
        unsigned hit = __ballot_sync(0xffffffffu, wi > 0 && r < acc + upto);
        unsigned valid = __ballot_sync(0xffffffffu, wi > 0);
        if (valid)
            last = base + 31 - __clz(valid);
        if (hit)
            chosen = base + __ffs(hit) - 1;
        acc += __shfl_sync(0xffffffffu, upto, 31);
    }
    if (chosen < 0) /* a sum that rounds short of r ends on the segment's last token */
        chosen = last >= 0 ? last : bi;
    if (lane == 0) {
        out->id = chosen;
        out->logprob = (x[chosen] - bv) - logf(sum);
    }
}

/* Block (b, row), warp w: segment b * 16 + w of the row, its sum of
 * exp(x - max) and, for a row drawn over the whole vocabulary, of the
 * draw's weights exp((x - max) / T) in double (coalesced: a lane every
 * 32nd token), tokens below min-p's cut weighing nothing. The row's last
 * block: the log-softmax's sum over the segments in order, and for a draw
 * the segment where u times the weights' total falls (a scan over the
 * segments, 8 a lane), then its tokens 32 at a time, each 32 scanned in
 * order: the order of the tokens, as the host's sampler draws. Rows with
 * top-k or top-p leave their draw to pick_top_kernel. The row's last
 * reader puts its penalized tokens back: here, unless pick_top_kernel
 * reads it after. */
__global__ void __launch_bounds__(PICK_THREADS) pick_sums_kernel(float *rows, int n, struct pick_rules rules,
                                                                 const struct pick_penalties *pen,
                                                                 struct pick_scratch *ps, struct pick_result *picks)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int row = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = blockIdx.x * PICK_WARPS + warp, seg = (n + PICK_SEGS - 1) / PICK_SEGS;
    float *x = rows + (size_t)row * (size_t)n;
    const float bv = ps->best_v[row], inv_t = rules.inv_t[row];
    const int bi = ps->best_i[row];
    const bool draws = inv_t != 0.0f && !rules.filtered[row];
    const float cut = rules.min_p[row] > 0 ? bv + logf(rules.min_p[row]) : -INFINITY; /* as the host's */
    const int s_lo = g * seg, s_hi = s_lo + seg < n ? s_lo + seg : n;
    float e = 0;
    double w = 0;
    for (int i = s_lo + lane; bi >= 0 && i < s_hi; i += 32)
        if (!isnan(x[i])) {
            e += __expf(x[i] - bv);
            if (draws && x[i] >= cut)
                w += (double)__expf((x[i] - bv) * inv_t);
        }
    for (int o = 16; o; o >>= 1) {
        e += __shfl_xor_sync(0xffffffffu, e, o);
        w += __shfl_xor_sync(0xffffffffu, w, o);
    }
    if (lane == 0) {
        ps->seg_e[row][g] = e;
        ps->seg_w[row][g] = w;
    }
    if (!pick_last_block(&ps->arrived[1][row]) || warp != 0)
        return;
    pick_sums_answer(x, n, row, seg, rules, ps, picks + row);
    __syncwarp(); /* lane 0 read its answer's logit */
    if (!(rules.k[row] > 0 && bi >= 0))
        pick_restore(x, row, n, pen, ps->orig, lane, 32);
}

/* A value's bits as an unsigned that orders as the values do; NaN 0,
 * below every other. */
__device__ __forceinline__ uint32_t pick_key(float v)
{
    const uint32_t u = __float_as_uint(v);
    return isnan(v) ? 0u : u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* A candidate: the larger value first, the lower index on ties. */
__device__ __forceinline__ uint64_t pick_sort_key(uint32_t key, int i)
{
    return (uint64_t)key << 32 | (uint32_t)~(uint32_t)i;
}

/* Inclusive sums of v over the block's threads in their order (lanes,
 * then warps); *total: over all. Every thread calls it. */
__device__ double pick_block_scan(double v, double *total)
{
    __shared__ double warp_sum[PICK_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += t;
    }
    if (lane == 31)
        warp_sum[warp] = v;
    __syncthreads();
    double before = 0, all = 0;
    for (int w = 0; w < PICK_WARPS; w++) {
        before += w < warp ? warp_sum[w] : 0.0;
        all += warp_sum[w];
    }
    __syncthreads(); /* warp_sum is the next call's */
    *total = all;
    return before + v;
}

/* The lowest thread for which cond holds; PICK_THREADS where none does.
 * Every thread calls it. */
__device__ int pick_block_first(bool cond)
{
    __shared__ int first;
    if (threadIdx.x == 0)
        first = PICK_THREADS;
    __syncthreads();
    if (cond)
        atomicMin(&first, (int)threadIdx.x);
    __syncthreads();
    const int f = first;
    __syncthreads();
    return f;
}

/* pick_top_kernel's answer for its row, by the row's last block, a thread
 * a candidate of the kc most likely (sorted): the alternatives; then, for
 * a drawn row with filters, top-k, top-p (the first whose cumulative
 * probability at temperature 1 reaches p), min-p (those within its ratio
 * of the largest) and the draw by the weights exp((x - max) / T), summed
 * as the host sums them. */
__device__ void pick_top_answer(const float *x, int row, int kc, const uint64_t *sorted, const struct pick_rules &rules,
                                struct pick_scratch *ps, struct pick_result *out)
{
    const int i = threadIdx.x;
    const bool in = i < kc;
    const int id = in ? (int)~(uint32_t)sorted[i] : 0;
    const float xi = in ? x[id] : 0.0f, bv = ps->best_v[row], sum = ps->sum[row], lse = bv + logf(sum);
    const int n_top = rules.n_top[row] < kc ? rules.n_top[row] : kc;
    if (i < n_top) {
        out->top_ids[i] = id;
        out->top_logprobs[i] = (xi - bv) - logf(sum);
    }
    if (i == 0)
        out->n_top = n_top;
    if (!rules.filtered[row])
        return;
    int keep = rules.top_k[row] && rules.top_k[row] < kc ? rules.top_k[row] : kc;
    double total;
    if (rules.top_p[row] > 0) {
        const double cum = pick_block_scan(in && i < keep ? exp((double)(xi - lse)) : 0.0, &total);
        const int cut = pick_block_first(in && i < keep && cum >= (double)rules.top_p[row]);
        int valid = 0;
        for (int k = 0; k < PICK_BLOCKS; k++)
            valid += ps->n_valid[row][k];
        if (cut < keep) {
            keep = cut + 1;
        } else if (!rules.top_k[row] && kc < valid) { /* p lies past the candidates: the host's to sort */
            if (i == 0)
                out->id = -1;
            return;
        }
    }
    if (rules.min_p[row] > 0) { /* sorted: what min-p keeps is a prefix */
        const float cut = bv + logf(rules.min_p[row]);
        const int m = pick_block_first(!(in && i < keep && xi >= cut));
        keep = m > 0 ? m : 1;
    }
    const double w = in && i < keep ? exp((double)((xi - bv) * rules.inv_t[row])) : 0.0;
    double weights, rounded;
    pick_block_scan(w, &weights);
    const double acc = pick_block_scan((double)(float)w, &rounded), r = rules.u[row] * weights;
    const int hit = pick_block_first(i < keep && r < acc);
    if (i == (hit < keep ? hit : keep - 1)) { /* a sum that rounds short of r ends on the last kept */
        out->id = id;
        out->logprob = (xi - bv) - logf(sum);
    }
}

/* Block (b, row) of a row with top-k, top-p or alternatives (rules.k[row]
 * candidates): the k largest of its slice, found by their keys' bits 8 at
 * a time (a histogram a warp, so that a peaked row's many values of one
 * exponent do not queue on one counter), then gathered: every key above
 * the k-th's, and of the keys equal to it the lowest indices. The row's
 * last block sorts the blocks' candidates (bitonic, descending) and
 * answers (pick_top_answer). */
__global__ void __launch_bounds__(PICK_THREADS) pick_top_kernel(float *rows, int n, struct pick_rules rules,
                                                                const struct pick_penalties *pen,
                                                                struct pick_scratch *ps, struct pick_result *picks)
{
    exo_cuda_wait_inputs();
    exo_cuda_start_next();
    const int row = blockIdx.y, b = blockIdx.x, K = rules.k[row];
    if (!K || ps->best_i[row] < 0) /* nothing to select, or nothing but NaN: pick_sums_kernel answered */
        return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = (n + PICK_BLOCKS - 1) / PICK_BLOCKS;
    const int lo = b * slice < n ? b * slice : n, hi = lo + slice < n ? lo + slice : n;
    float *x = rows + (size_t)row * (size_t)n;
    __shared__ uint64_t sorted[PICK_MERGE]; /* the histograms first, then the row's candidates */
    __shared__ int tot[256], eq_warp[PICK_WARPS], off[PICK_BLOCKS + 1];
    __shared__ int need_s, left_s, n_gt, eq_base;
    __shared__ unsigned digit_s;
    int(*hist)[256] = reinterpret_cast<int(*)[256]>(sorted);

    uint32_t prefix = 0, mask = 0;
    int need = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < PICK_WARPS * 256; i += PICK_THREADS)
            hist[i / 256][i % 256] = 0;
        __syncthreads();
        for (int i = lo + threadIdx.x; i < hi; i += PICK_THREADS) {
            const uint32_t key = pick_key(x[i]);
            if (key && (key & mask) == prefix)
                atomicAdd(&hist[warp][(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x < 256) {
            int t = 0;
            for (int w = 0; w < PICK_WARPS; w++)
                t += hist[w][threadIdx.x];
            tot[threadIdx.x] = t;
        }
        __syncthreads();
        if (warp == 0) { /* the digit of the wanted key: lane l sums bins 8l .. 8l + 7, then from the top down */
            int mine = 0;
            for (int j = 0; j < 8; j++)
                mine += tot[lane * 8 + j];
            int suf = mine;
            for (int o = 1; o < 32; o <<= 1) {
                int v = __shfl_down_sync(0xffffffffu, suf, o);
                if (lane + o < 32)
                    suf += v;
            }
            const int all = __shfl_sync(0xffffffffu, suf, 0);
            const int want = shift == 24 ? (K < all ? K : all) : left_s;
            const unsigned has = __ballot_sync(0xffffffffu, suf >= want);
            const int L = 31 - __clz(has); /* suf is 0 past the last bin, so want > 0 has a lane */
            int acc = __shfl_sync(0xffffffffu, suf, L) - __shfl_sync(0xffffffffu, mine, L);
            if (lane == 0) {
                int d = L * 8 + 7;
                for (; d > L * 8 && acc + tot[d] < want; d--)
                    acc += tot[d];
                if (shift == 24) {
                    need_s = want;
                    ps->n_valid[row][b] = all;
                }
                digit_s = (unsigned)d;
                left_s = want - acc;
            }
        }
        __syncthreads();
        need = need_s;
        if (!need) /* an empty slice, or all NaN */
            break;
        prefix |= digit_s << shift;
        mask |= 0xffu << shift;
        __syncthreads(); /* left_s and the histograms are the next pass's */
    }
    if (threadIdx.x == 0) {
        n_gt = 0;
        eq_base = 0;
        ps->n_cand[row][b] = need;
    }
    __syncthreads();
    const int left = need ? left_s : 0, gt_total = need - left;
    uint64_t *cand = ps->cand[row][b];
    for (int base = lo; need && base < hi; base += PICK_THREADS) {
        const int i = base + threadIdx.x;
        const uint32_t key = i < hi ? pick_key(x[i]) : 0u;
        if (key > prefix)
            cand[atomicAdd(&n_gt, 1)] = pick_sort_key(key, i);
        const bool eq = key && key == prefix;
        const unsigned bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0)
            eq_warp[warp] = __popc(bal);
        __syncthreads();
        int before = eq_base + __popc(bal & ((1u << lane) - 1));
        for (int w = 0; w < warp; w++)
            before += eq_warp[w];
        if (eq && before < left)
            cand[gt_total + before] = pick_sort_key(key, i);
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < PICK_WARPS; w++)
                eq_base += eq_warp[w];
        __syncthreads();
    }
    if (!pick_last_block(&ps->arrived[2][row]))
        return;

    if (threadIdx.x == 0) {
        off[0] = 0;
        for (int k = 0; k < PICK_BLOCKS; k++)
            off[k + 1] = off[k] + ps->n_cand[row][k];
    }
    __syncthreads();
    const int M = off[PICK_BLOCKS], kc = K < M ? K : M;
    int P = 2;
    while (P < M)
        P <<= 1;
    for (int j = threadIdx.x; j < P; j += PICK_THREADS) {
        uint64_t v = 0;
        if (j < M) {
            int k = 0;
            while (j >= off[k + 1])
                k++;
            v = ps->cand[row][k][j - off[k]];
        }
        sorted[j] = v;
    }
    __syncthreads();
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < P / 2; t += PICK_THREADS) {
                const int a = t / j * 2 * j + t % j, c = a + j;
                const uint64_t va = sorted[a], vc = sorted[c];
                if ((va < vc) == !(a & k)) { /* descending where bit k is 0: the whole ends descending */
                    sorted[a] = vc;
                    sorted[c] = va;
                }
            }
            __syncthreads();
        }

    pick_top_answer(x, row, kc, sorted, rules, ps, picks + row);
    __syncthreads(); /* every candidate's logit read */
    pick_restore(x, row, n, pen, ps->orig, threadIdx.x, PICK_THREADS);
}

exo_cuda_picker *exo_cuda_picker_new(void)
{
    exo_cuda_picker *p = (exo_cuda_picker *)calloc(1, sizeof *p);
    if (!p)
        return NULL;
    if (cudaMallocHost((void **)&p->host, sizeof *p->host * EXO_PICK_ROWS) != cudaSuccess ||
        cudaMalloc((void **)&p->dev, sizeof *p->dev * EXO_PICK_ROWS) != cudaSuccess ||
        cudaMallocHost((void **)&p->pen_host, sizeof *p->pen_host) != cudaSuccess ||
        cudaMalloc((void **)&p->pen_dev, sizeof *p->pen_dev) != cudaSuccess ||
        cudaMalloc((void **)&p->scratch, sizeof *p->scratch) != cudaSuccess ||
        cudaMemset(p->scratch, 0, sizeof *p->scratch) != cudaSuccess) {
        cudaGetLastError();
        exo_cuda_picker_free(p);
        return NULL;
    }
    return p;
}

void exo_cuda_picker_free(exo_cuda_picker *p)
{
    if (!p)
        return;
    cudaFreeHost(p->host);
    cudaFree(p->dev);
    cudaFreeHost(p->pen_host);
    cudaFree(p->pen_dev);
    cudaFree(p->scratch);
    free(p);
}

/* Row r's rule as the kernels take it, its penalties appended to pen's
 * (*n_pen so far); EXO_EINVAL for a rule out of its bounds. */
static int take_rule(const exo_pick_rule *rule, int r, int n, struct pick_rules *rules, struct pick_penalties *pen,
                     int *n_pen)
{
    const bool drawn = rule->temperature > 0;
    rules->inv_t[r] = drawn ? 1.0f / rule->temperature : 0.0f; /* as the host's sampler */
    rules->u[r] = rule->u;
    const bool by_p = drawn && rule->top_p > 0 && rule->top_p < 1;
    const int top_k = drawn && rule->top_k > 0 && rule->top_k < n ? rule->top_k : 0;
    if (top_k > EXO_PICK_TOP_K || rule->top_logprobs < 0 || rule->top_logprobs > EXO_MAX_TOP_LOGPROBS)
        return EXO_EINVAL;
    const int n_top = rule->top_logprobs < n ? rule->top_logprobs : n;
    const int filter_k = top_k ? top_k : by_p ? (n < EXO_PICK_TOP_K ? n : EXO_PICK_TOP_K) : 0;
    rules->filtered[r] = filter_k > 0;
    rules->top_k[r] = top_k;
    rules->n_top[r] = n_top;
    rules->k[r] = filter_k > n_top ? filter_k : n_top;
    rules->top_p[r] = by_p ? rule->top_p : 0.0f;
    rules->min_p[r] = drawn && rule->min_p > 0 ? rule->min_p : 0.0f;
    const bool rep = rule->repetition_penalty > 0 && rule->repetition_penalty != 1.0f;
    const bool pres = rule->presence_penalty != 0 || rule->frequency_penalty != 0;
    const int np = rep || pres ? rule->n_penalized : 0;
    if (np < 0 || np > EXO_PICK_PENALIZED || (np && (!rule->penalized || !rule->penalized_count)))
        return EXO_EINVAL;
    pen->n[r] = np;
    pen->off[r] = *n_pen;
    pen->rep[r] = rep ? rule->repetition_penalty : 1.0f;
    pen->pres[r] = pres ? rule->presence_penalty : 0.0f;
    pen->freq[r] = pres ? rule->frequency_penalty : 0.0f;
    for (int j = 0; j < np; j++)
        pen->tok[*n_pen + j] = (struct pick_penalty){rule->penalized[j], (float)rule->penalized_count[j]};
    *n_pen += np;
    return 0;
}

int exo_cuda_pick(exo_cuda_picker *p, cudaStream_t stream, float *x, int rows, int n, const exo_pick_rule *rule,
                  exo_pick *out)
{
    if (rows < 1 || rows > EXO_PICK_ROWS || n < 1)
        return EXO_EINVAL;
    struct pick_rules rules = {};
    int n_pen = 0;
    bool selects = false;
    for (int r = 0; r < rows; r++) {
        int rc = take_rule(&rule[r], r, n, &rules, p->pen_host, &n_pen);
        if (rc)
            return rc;
        selects |= rules.k[r] > 0;
    }
    const dim3 grid(PICK_BLOCKS, rows);
    if (n_pen) {
        size_t bytes = offsetof(struct pick_penalties, tok) + sizeof(struct pick_penalty) * (size_t)n_pen;
        if (cudaMemcpyAsync(p->pen_dev, p->pen_host, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess)
            return exo_cuda_launched("pick: penalties");
    }
    const struct pick_penalties *pen = n_pen ? p->pen_dev : NULL;
    exo_cuda_launch(pick_max_kernel, grid, dim3(PICK_THREADS), 0, stream, x, n, pen, p->scratch);
    exo_cuda_launch(pick_sums_kernel, grid, dim3(PICK_THREADS), 0, stream, x, n, rules, pen, p->scratch, p->dev);
    if (selects)
        exo_cuda_launch(pick_top_kernel, grid, dim3(PICK_THREADS), 0, stream, x, n, rules, pen, p->scratch, p->dev);
    int rc = exo_cuda_launched("pick");
    if (rc)
        return rc;
    if (cudaMemcpyAsync(p->host, p->dev, sizeof *p->host * (size_t)rows, cudaMemcpyDeviceToHost, stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess)
        return exo_cuda_launched("pick: answers");
    for (int r = 0; r < rows; r++) {
        const struct pick_result *h = &p->host[r];
        out[r].picked = h->id >= 0;
        out[r].id = h->id;
        out[r].logprob = h->logprob;
        out[r].n_top = h->n_top;
        memcpy(out[r].top_ids, h->top_ids, sizeof(int32_t) * (size_t)h->n_top);
        memcpy(out[r].top_logprobs, h->top_logprobs, sizeof(float) * (size_t)h->n_top);
    }
    return 0;
}
