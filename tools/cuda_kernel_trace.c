/* A kernel timeline for machines without Nsight Systems (the H200 image
 * has ncu, which times kernels one by one, but no nsys). Preloaded into
 * any CUDA program, it records every kernel the GPU ran, including those
 * inside CUDA graphs and those overlapping their predecessor through
 * programmatic dependent launch, and writes one line per kernel when the
 * program exits:
 *
 *     start_ns end_ns stream graph_node mangled_name
 *
 * to $EXO_CUDA_TRACE (default cuda_trace.txt). Built with the CUDA plugin
 * where CUDA (12 or later) has CUPTI's headers; use:
 * LD_PRELOAD=build/libexo_cuda_trace.so exo bench ... --device cuda.
 * The timestamps are the GPU's, so gaps between kernels are real; CUPTI's
 * own cost is in the buffers' handling on the host, not between kernels
 * (on an H200 it made a llama-3.1-8b q4 token 2.60 ms instead of 2.33).
 * tools/cuda_trace_summary.py reads the file. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACE_BUFFER (16u << 20)

/* The kernel record of the CUPTI compiled against (CUPTI fills in its own
 * latest version): CUDA 13's, else CUDA 12's. */
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 kernel_record;
#else
typedef CUpti_ActivityKernel9 kernel_record;
#endif

static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUFFER);
    *size = *buffer ? TRACE_BUFFER : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const kernel_record *k = (const kernel_record *)record;
        fprintf(trace_out, "%llu %llu %u %llu %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->streamId, (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
    }
    free(buffer);
}

static void trace_flush(void)
{
    cuptiActivityFlushAll(1);
    if (trace_out)
        fclose(trace_out);
    trace_out = NULL;
}

__attribute__((constructor)) static void trace_start(void)
{
    const char *path = getenv("EXO_CUDA_TRACE");
    trace_out = fopen(path && *path ? path : "cuda_trace.txt", "w");
    if (!trace_out) {
        perror("cuda_kernel_trace");
        return;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cuda_kernel_trace: CUPTI refused to trace kernels\n");
        fclose(trace_out);
        trace_out = NULL;
        return;
    }
    atexit(trace_flush);
}
