/* libFuzzer target for the model-output parser: the first byte picks the
 * tool format and options, the rest is model output cut into tokens at 0x01
 * bytes. Properties: no crash or leak; with no markers configured the
 * emitted text equals the input; all emitted tool-call arguments are JSON. */
// FUZZ_SOURCES: src/core/sbuf.c src/core/json_util.c src/core/budget.c src/proto/gen_types.c src/runner/output_parser.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/proto/sampling.c
#include "runner/output_parser.h"
#include "core/sbuf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void collect(void *ctx, const exo_chunk *c)
{
    exo_sbuf *b = ctx;
    if (c->kind == EXO_CHUNK_TOKEN) {
        exo_sbuf_puts(b, c->text);
    } else if (c->kind == EXO_CHUNK_TOOL_CALLS) {
        for (int i = 0; i < c->n_tool_calls; i++) {
            json_t *j = json_loads(c->tool_calls[i].arguments, 0, NULL);
            if (!json_is_object(j))
                abort();
            json_decref(j);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *stops[] = {"END", "\n\n\n"};
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":[\"string\",\"null\"]}},"
                               "\"required\":[\"a\"]}}}]", 0, NULL);
    unsigned sel = data[0];
    exo_output_parser_config cfg = {.tool_format = (exo_tool_format)(sel % 5), .tools = tools};
    bool plain = cfg.tool_format == EXO_TOOL_FMT_NONE;
    if (sel & 8) {
        cfg.think_start = "<think>";
        cfg.think_end = "</think>";
        cfg.starts_in_thinking = sel & 16;
        plain = false;
    }
    if (sel & 32) {
        cfg.stop = stops;
        cfg.n_stop = 2;
        plain = false;
    }
    cfg.raw = sel & 64;
    exo_output_parser *p = exo_output_parser_create(&cfg);
    exo_sbuf out, in;
    exo_sbuf_init(&out);
    exo_sbuf_init(&in);
    size_t start = 1;
    bool stopped = false;
    for (size_t i = 1; i <= size && !stopped; i++) {
        if (i == size || data[i] == 1) {
            exo_chunk t;
            exo_chunk_token(&t, (const char *)data + start, i - start, 0, false);
            exo_sbuf_puts(&in, t.text); /* strndup stops at NUL, as the parser sees it */
            stopped = exo_output_parser_feed(p, &t, collect, &out);
            exo_chunk_free(&t);
            start = i + 1;
        }
    }
    exo_output_parser_finish(p, EXO_FR_STOP, collect, &out);
    if (plain && strcmp(out.data ? out.data : "", in.data ? in.data : ""))
        abort();
    exo_output_parser_free(p);
    exo_sbuf_free(&out);
    exo_sbuf_free(&in);
    json_decref(tools);
    return 0;
}
