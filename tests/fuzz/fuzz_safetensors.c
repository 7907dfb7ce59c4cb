/* libFuzzer target for the safetensors header parser: any byte string is
 * handed to exo_st_open_memory (the same parser exo_st_open uses on a mmapped
 * file). Accepted inputs must describe tensors that lie entirely inside the
 * input, which this target checks by touching every tensor's first and last
 * byte (ASan flags any read outside the buffer); rejected inputs must carry
 * a message naming the input. */
// FUZZ_SOURCES: src/engine/safetensors.c src/engine/dtype.c src/core/alloc.c src/core/error.c src/core/json_util.c src/core/budget.c
#include "engine/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    exo_st *st = NULL;
    exo_err err = {0};
    int rc = exo_st_open_memory(data, size, "fuzz-input", &st, &err);
    if (rc) {
        if (st || !strstr(err.msg, "fuzz-input"))
            abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    size_t n = exo_st_count(st);
    for (size_t i = 0; i < n; i++) {
        const exo_st_tensor *t = exo_st_at(st, i);
        if (!t || exo_st_find(st, t->name) != t)
            abort();
        if (t->ndim < 0 || t->ndim > EXO_ST_MAX_DIMS)
            abort();
        size_t count = exo_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            count *= (size_t)t->shape[d];
        if (count != t->nbytes)
            abort();
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size)
            abort();
        if (t->nbytes)
            sink ^= p[0] ^ p[t->nbytes - 1];
    }
    if (exo_st_at(st, n))
        abort();
    (void)exo_st_metadata(st, "format");
    exo_st_close(st);
    (void)sink;
    return 0;
}
