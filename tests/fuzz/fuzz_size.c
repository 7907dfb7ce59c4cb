/* libFuzzer target for memory sizes as users write them (exo serve
 * --kv-budget, EXO_KV_BUDGET): any string is either refused with a
 * message or gives a size from 1 byte to 2^62, which written back as a
 * plain number of bytes parses to itself. */
// FUZZ_SOURCES: src/core/meminfo.c src/core/error.c
#include "core/meminfo.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[64];
    if (size >= sizeof text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    uint64_t bytes = 0, again = 0;
    exo_err err = {0};
    if (exo_parse_size(text, &bytes, &err)) {
        if (!err.msg[0] || bytes != 0)
            abort();
        return 0;
    }
    if (bytes < 1 || bytes > ((uint64_t)1 << 62))
        abort();
    char plain[32];
    snprintf(plain, sizeof plain, "%" PRIu64, bytes);
    if (exo_parse_size(plain, &again, &err) || again != bytes)
        abort();
    return 0;
}
