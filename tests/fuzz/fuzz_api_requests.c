/* libFuzzer target for the API request side: the first byte picks a parser
 * (the five client adapters, the pipe decoders for exo_gen_request and
 * exo_chunk), the rest is the body. Whatever parses must validate, survive a
 * JSON round trip unchanged, and drive every encoder to valid output. */
// FUZZ_SOURCES: src/core/sbuf.c src/core/json_util.c src/core/budget.c src/proto/gen_types.c src/api/encoder.c src/api/openai_chat.c src/api/claude.c src/api/responses.c src/api/ollama.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/proto/sampling.c
#include "api/api.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void drive_encoders(const exo_gen_request *r)
{
    for (int f = EXO_API_OPENAI_CHAT; f <= EXO_API_OLLAMA_GENERATE; f++) {
        for (int stream = 0; stream < 2; stream++) {
            exo_gen_request copy = *r;
            copy.stream = stream;
            exo_api_encoder *e = exo_api_encoder_create((exo_api_family)f, &copy, "fz", 1);
            exo_sbuf out;
            exo_sbuf_init(&out);
            exo_api_encoder_begin(e, &out);
            exo_chunk c;
            exo_chunk_token(&c, r->model, strlen(r->model), 1, false);
            exo_api_encoder_feed(e, &c, &out);
            exo_chunk_free(&c);
            exo_chunk_finish(&c, EXO_FR_STOP, NULL, 1, 1);
            if (!exo_api_encoder_feed(e, &c, &out))
                abort();
            if (!stream) {
                json_t *body = json_loadb(out.data, out.len, 0, NULL);
                if (!body)
                    abort();
                json_decref(body);
            }
            exo_sbuf_free(&out);
            exo_api_encoder_free(e);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int which = data[0] % 8;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    exo_err err = {0};
    if (which < 6) {
        exo_gen_request r;
        int status = 0;
        if (exo_api_parse_request((exo_api_family)which, body, len, &r, &status, &err) == 0) {
            if (status != 200 || exo_gen_request_validate(&r, NULL))
                abort();
            json_t *j = exo_gen_request_to_json(&r);
            exo_gen_request b;
            if (exo_gen_request_from_json(j, &b, &err))
                abort();
            json_t *j2 = exo_gen_request_to_json(&b);
            if (!json_equal(j, j2))
                abort();
            json_decref(j);
            json_decref(j2);
            drive_encoders(&b);
            exo_gen_request_free(&b);
            exo_gen_request_free(&r);
        } else if (status != 400 || !err.msg[0]) {
            abort();
        }
        return 0;
    }
    json_t *j = json_loadb(body, len, 0, NULL);
    if (!j)
        return 0;
    if (which == 6) {
        exo_gen_request r;
        if (exo_gen_request_from_json(j, &r, &err) == 0) {
            drive_encoders(&r);
            exo_gen_request_free(&r);
        }
    } else {
        exo_chunk c;
        if (exo_chunk_from_json(j, &c, &err) == 0) {
            json_t *back = exo_chunk_to_json(&c);
            exo_chunk d;
            if (exo_chunk_from_json(back, &d, &err))
                abort();
            exo_chunk_free(&d);
            json_decref(back);
            exo_chunk_free(&c);
        }
    }
    json_decref(j);
    return 0;
}
