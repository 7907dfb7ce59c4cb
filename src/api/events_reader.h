/* GET /events pages, built off the HTTP threads.
 *
 * Why: a page is up to 1000 events read from the log, decoded and encoded
 * as JSON (milliseconds). Built on the HTTP server's few threads, 16 clients
 * polling /events keep every one of them busy and a chat request waits its
 * turn behind them (measured: a 4-token chat went from 2 ms to hundreds of
 * ms). So the handler only opens a stream and queues the page; one reader
 * thread builds pages one at a time and answers each stream. /events then
 * costs at most that one thread, and the HTTP threads stay free for
 * generation. The queue is bounded (EXO_EVENTS_READER_QUEUE): beyond it a
 * caller gets EXO_EBUSY and answers 503. Neither the node's lock nor its
 * loop is involved (exo_node_events_page reads the log directly).
 *
 * Example usage:
 *   exo_events_reader *er = exo_events_reader_new(node);
 *   in a handler: st = exo_http_stream_open(r, NULL, NULL);
 *                 if (exo_events_reader_submit(er, st, since, limit, true) < 0) ...  // busy
 *   exo_events_reader_stop(er); exo_http_destroy(http); exo_events_reader_free(er); */
#ifndef EXO_API_EVENTS_READER_H
#define EXO_API_EVENTS_READER_H

#include "api/http.h"
#include "cluster/node.h"

#include <stdbool.h>
#include <stdint.h>

#define EXO_EVENTS_READER_QUEUE 256

typedef struct exo_events_reader exo_events_reader;

exo_events_reader *exo_events_reader_new(exo_node *node);
/* Queues one page for the stream (taken: the reader answers and releases
 * it). since -1: the oldest kept event. wrapped: the {first, since, next,
 * count, more, events} form, else the bare array. EXO_EBUSY when the queue
 * is full (the stream is still the caller's then). */
int exo_events_reader_submit(exo_events_reader *er, exo_http_stream *st, int64_t since, int64_t limit,
                             bool wrapped);
/* Answers what is queued with 503 and stops the thread; later submits are
 * EXO_EBUSY. Call it while the HTTP server still runs (the streams are its),
 * then destroy the server, then free. */
void exo_events_reader_stop(exo_events_reader *er);
void exo_events_reader_free(exo_events_reader *er);

#endif
