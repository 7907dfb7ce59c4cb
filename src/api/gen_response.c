/* Encoder + HTTP stream glue (see gen_response.h). One producer thread owns
 * the encoder; the HTTP stream is the only shared object and is thread-safe. */
#include "api/gen_response.h"

#include "core/alloc.h"

#include <string.h>
#include <time.h>

struct exo_api_response {
    exo_api_encoder *enc;
    exo_http_stream *stream;
    exo_sbuf         out;
    bool             stream_mode, done;
};

exo_api_response *exo_api_response_open(exo_http_request *req, exo_api_family f,
                                        const exo_gen_request *greq, const char *command_id,
                                        exo_http_close_fn on_close, void *ud)
{
    exo_http_stream *s = exo_http_stream_open(req, on_close, ud);
    if (!s)
        return NULL;
    exo_api_response *r = exo_calloc(1, sizeof *r);
    r->enc = exo_api_encoder_create(f, greq, command_id, (int64_t)time(NULL));
    r->stream = s;
    r->stream_mode = greq->stream;
    exo_sbuf_init(&r->out);
    if (r->stream_mode) {
        exo_http_stream_start(s, 200, exo_api_encoder_content_type(r->enc),
                              exo_api_encoder_keepalive(r->enc));
        exo_api_encoder_begin(r->enc, &r->out);
        if (r->out.len)
            exo_http_stream_write(s, r->out.data, r->out.len);
        exo_sbuf_clear(&r->out);
    }
    return r;
}

int exo_api_response_push(exo_api_response *r, const exo_chunk *c)
{
    if (r->done)
        return 1;
    bool done = exo_api_encoder_feed(r->enc, c, &r->out);
    int rc = 0;
    if (r->stream_mode) {
        if (r->out.len)
            rc = exo_http_stream_write(r->stream, r->out.data, r->out.len);
        if (done)
            exo_http_stream_end(r->stream);
    } else if (done) {
        rc = exo_http_stream_respond(r->stream, exo_api_encoder_status(r->enc),
                                     exo_api_encoder_content_type(r->enc), r->out.data, r->out.len);
    } else if (exo_http_stream_closed(r->stream)) {
        rc = EXO_ECANCELED;
    }
    exo_sbuf_clear(&r->out);
    r->done = done;
    if (rc == EXO_ECANCELED)
        return rc;
    return done ? 1 : 0;
}

void exo_api_response_release(exo_api_response *r)
{
    if (!r)
        return;
    exo_http_stream_release(r->stream);
    exo_api_encoder_free(r->enc);
    exo_sbuf_free(&r->out);
    exo_free(r);
}

exo_api_family exo_api_family_for_path(const char *path)
{
    if (!strncmp(path, "/v1/messages", 12))
        return EXO_API_CLAUDE;
    if (!strncmp(path, "/v1/responses", 13))
        return EXO_API_RESPONSES;
    if (!strncmp(path, "/ollama/api/", 12) || !strcmp(path, "/ollama/api") || !strcmp(path, "/ollama/") ||
        !strncmp(path, "/api/", 5))
        return strstr(path, "generate") ? EXO_API_OLLAMA_GENERATE : EXO_API_OLLAMA_CHAT;
    if (!strncmp(path, "/bench/", 7))
        return EXO_API_BENCH_CHAT;
    return EXO_API_OPENAI_CHAT;
}

char *exo_api_error_for_path(const char *path, int status, const char *message)
{
    return exo_api_error_body(exo_api_family_for_path(path), status, message);
}
