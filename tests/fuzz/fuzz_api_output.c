/* libFuzzer target for the model-output parser: the first byte picks the
 * tool format (all of them, the XML formats of Qwen3-Coder/Qwen3.5 and GLM
 * and Kimi K2's sections included) and options, the rest is model output cut
 * into tokens at 0x01 bytes. Properties: no crash or leak; all emitted
 * tool-call arguments are JSON objects and name a declared tool; and when
 * no call is emitted (a bad call is text, unchanged) and neither reasoning
 * tags, stop sequences nor harmony's channels are in play, the emitted text
 * equals the input. */
// FUZZ_SOURCES: src/core/sbuf.c src/core/json_util.c src/core/budget.c src/proto/gen_types.c src/runner/output_parser.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/proto/sampling.c
#include "runner/output_parser.h"
#include "core/sbuf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    exo_sbuf text;
    int      calls;
} sink;

static void collect(void *ctx, const exo_chunk *c)
{
    sink *k = ctx;
    if (c->kind == EXO_CHUNK_TOKEN) {
        exo_sbuf_puts(&k->text, c->text);
    } else if (c->kind == EXO_CHUNK_TOOL_CALLS) {
        for (int i = 0; i < c->n_tool_calls; i++) {
            json_t *j = json_loads(c->tool_calls[i].arguments, 0, NULL);
            if (!json_is_object(j))
                abort();
            json_decref(j);
            if (strcmp(c->tool_calls[i].name, "f") && strcmp(c->tool_calls[i].name, "g"))
                abort();
            k->calls++;
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
                               "\"required\":[\"a\"]}}},"
                               "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\","
                               "\"properties\":{\"n\":{\"type\":\"number\"},\"t\":{\"type\":\"boolean\"},"
                               "\"o\":{\"type\":\"object\"},\"l\":{\"type\":\"array\"},\"s\":{\"type\":\"string\"}}}}}]",
                               0, NULL);
    unsigned sel = data[0];
    /* sel: bits 0-2 the format (mod the count), 3 reasoning tags, 4 starting
     * inside them, 5 stop sequences, 6 raw. */
    exo_output_parser_config cfg = {.tool_format = (exo_tool_format)((sel & 7) % EXO_TOOL_FMT_COUNT),
                                    .tools = tools};
    if (sel & 8) {
        cfg.think_start = "<think>";
        cfg.think_end = "</think>";
        cfg.starts_in_thinking = sel & 16;
    }
    if (sel & 32) {
        cfg.stop = stops;
        cfg.n_stop = 2;
    }
    cfg.raw = sel & 64;
    bool exact = !(sel & 32) && (cfg.raw || (!(sel & 8) && cfg.tool_format != EXO_TOOL_FMT_HARMONY));
    exo_output_parser *p = exo_output_parser_create(&cfg);
    sink out = {.calls = 0};
    exo_sbuf in;
    exo_sbuf_init(&out.text);
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
    if (exact && !out.calls && strcmp(out.text.data ? out.text.data : "", in.data ? in.data : ""))
        abort();
    exo_output_parser_free(p);
    exo_sbuf_free(&out.text);
    exo_sbuf_free(&in);
    json_decref(tools);
    return 0;
}
