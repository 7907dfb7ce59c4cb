/* libFuzzer target for the Jinja interpreter: the input is template text,
 * parsed and rendered with a fixed small chat context and tight limits
 * (output, steps, macro depth). Any template must either render or fail
 * with an error message; crashes, leaks, hangs and unbounded memory are
 * bugs. */
// FUZZ_SOURCES: src/tokenizer/jinja*.c src/core/*.c
#include "tokenizer/jinja.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char ctx_json[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi \\u00e9\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>r</think>ok\",\"tool_calls\":[{\"function\":"
    "{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[1.5,null,true]}}}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"n\":3,\"x\":2.5}";

static json_t *ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx)
        ctx = json_loads(ctx_json, 0, NULL);
    if (size > 1 << 16)
        return 0;
    exo_err err = {0};
    exo_jinja_template *t = NULL;
    if (exo_jinja_parse((const char *)data, size, &t, &err) != 0) {
        if (err.code >= 0 || !err.msg[0])
            abort();
        return 0;
    }
    exo_jinja_opts o = {.now = 1721952000, .max_output = 1 << 20, .max_depth = 16, .max_steps = 200000};
    char *out = NULL;
    size_t n = 0;
    int rc = exo_jinja_render(t, ctx, &o, &out, &n, &err);
    if (rc == 0) {
        if (!out || strlen(out) > n)
            abort();
        exo_free(out);
    } else if (rc > 0 || !err.msg[0]) {
        abort();
    }
    exo_jinja_free(t);
    return 0;
}
