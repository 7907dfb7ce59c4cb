/* The glue between a generation and its HTTP response: an API encoder
 * feeding an HTTP stream. The node opens one in the request handler, pushes
 * the generation's chunks into it from its own thread, and learns from the
 * close callback (or a push returning EXO_ECANCELED) that the client left.
 *
 *   handler:  r = exo_api_response_open(req, EXO_API_CLAUDE, &greq, id, on_close, node);
 *   node:     exo_api_response_push(r, &chunk) ... (terminal chunk ends it)
 *             exo_api_response_release(r);
 *
 * Streaming requests get their headers (and SSE keep-alives) at once;
 * non-streaming ones are answered in one piece when the terminal chunk
 * arrives, with status 200, or 500 after an error chunk. */
#ifndef EXO_API_GEN_RESPONSE_H
#define EXO_API_GEN_RESPONSE_H

#include "api/api.h"
#include "api/http.h"

typedef struct exo_api_response exo_api_response;

exo_api_response *exo_api_response_open(exo_http_request *req, exo_api_family f,
                                        const exo_gen_request *greq, const char *command_id,
                                        exo_http_close_fn on_close, void *ud);
/* Encodes and sends one chunk (any thread, one producer). EXO_ECANCELED once
 * the client is gone; 1 after the terminal chunk; else 0. */
int  exo_api_response_push(exo_api_response *r, const exo_chunk *c);
/* After it returns the close callback is neither running nor will run. */
void exo_api_response_release(exo_api_response *r);

/* The API family a path belongs to, and an exo_http_error_fn that formats
 * router errors (404/405/413) in that family's format. */
exo_api_family exo_api_family_for_path(const char *path);
char          *exo_api_error_for_path(const char *path, int status, const char *message);

#endif
