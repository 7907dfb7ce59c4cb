/* The wire protocol between a node and its runner child processes.
 *
 * Why a protocol of its own: generation runs in a child process so that a
 * crash in the engine (a bad checkpoint, an OOM kill, a bug) costs one
 * instance, not the node. The two ends share one AF_UNIX SOCK_STREAM
 * socketpair; each message is a frame
 *
 *     [u32 little-endian payload length][payload: one JSON object]
 *
 * with the length capped at EXO_RUNNER_FRAME_MAX (a frame announcing more,
 * or zero bytes, is a protocol error: the stream cannot be resynchronised,
 * so the reader gives up on the peer). JSON rather than a binary encoding:
 * the payloads are the canonical request and chunk types, which already
 * have strict JSON codecs (proto/gen_types.h), and a token chunk is a few
 * dozen bytes, far below the cost of the token itself.
 *
 * Messages, tagged by "type":
 *   daemon -> runner
 *     LoadModel {model_dir, n_threads, ctx, warmup_tokens, [shard]}
 *               shard: {rank, world, start_layer, end_layer, tensor,
 *               ring_key (64 hex), ring_timeout_ms}: a runner of a model
 *               split over several (world > 1) first listens for its ring
 *               and reports Connecting{ring_port}, then waits for
 *     Connect   {host, port}                   where its next rank listens
 *     Generate  {command_id, request}          queued FIFO by the runner
 *     Cancel    {command_id}                   running or queued
 *     Shutdown  {}
 *   runner -> daemon
 *     Status    {status: {kind, layers_loaded?, total_layers?, error_message?}}
 *     Chunk     {command_id, chunk}
 *     Done      {command_id}                   after the command's terminal chunk
 *
 * Decoding treats every payload as hostile (a runner that crashed halfway
 * through a write, or one running a broken model, must not take the daemon
 * down): unknown keys, wrong types, out-of-range numbers, ids that are not
 * short printable tokens, and statuses that fail exo_runner_status_validate
 * are rejected with a message naming the field.
 *
 * exo_runner_chan wraps one end of the socket: a read buffer that yields
 * whole frames, and an output queue so the daemon side never blocks on a
 * busy child (it polls the fd for POLLOUT while exo_runner_chan_pending). */
#ifndef EXO_RUNNER_PROTOCOL_H
#define EXO_RUNNER_PROTOCOL_H

#include "proto/gen_types.h"
#include "core/sbuf.h"
#include "proto/types.h"
#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define EXO_RUNNER_FRAME_MAX ((size_t)8 << 20) /* payload bytes */
#define EXO_RUNNER_ID_MAX    128               /* command id bytes */
#define EXO_RUNNER_PATH_MAX  4096              /* model_dir bytes */

typedef enum exo_runner_msg_kind {
    /* daemon -> runner */
    EXO_RMSG_LOAD_MODEL = 1,
    EXO_RMSG_GENERATE,
    EXO_RMSG_CANCEL,
    EXO_RMSG_SHUTDOWN,
    /* runner -> daemon */
    EXO_RMSG_STATUS,
    EXO_RMSG_CHUNK,
    EXO_RMSG_DONE,
    /* daemon -> runner */
    EXO_RMSG_CONNECT,
} exo_runner_msg_kind;

const char *exo_runner_msg_name(exo_runner_msg_kind k); /* "LoadModel", ...; "?" */
/* True for the kinds the daemon sends (LoadModel .. Shutdown, Connect). */
bool exo_runner_msg_is_down(exo_runner_msg_kind k);

typedef struct exo_runner_load {
    char *model_dir;      /* owned */
    int   n_threads;      /* <= 0: every online CPU */
    int   ctx;            /* KV capacity in tokens; 0: max_position_embeddings capped at 4096 */
    int   warmup_tokens;  /* greedy tokens generated to warm up; 0: none */
    char  device[EXO_DEVICE_MAX]; /* proto/types.h device name; "": EXO_DEVICE or auto */
    /* The shard: rank of world; world 1 (or 0) is the whole model. */
    int   rank, world;
    int   start_layer, end_layer; /* pipeline: [start, end) */
    bool  tensor;                 /* tensor parallel: every layer, a share of each */
    char  ring_key[65];           /* hex of the instance's ring key */
    int   ring_timeout_ms;        /* 0: the ring's default */
} exo_runner_load;

typedef struct exo_runner_connect {
    char host[64];                /* numeric address of the next rank's node */
    int  port;
} exo_runner_connect;

typedef struct exo_runner_msg {
    exo_runner_msg_kind kind;
    char              command_id[EXO_RUNNER_ID_MAX + 1]; /* GENERATE, CANCEL, CHUNK, DONE */
    exo_runner_load   load;    /* LOAD_MODEL */
    exo_runner_connect connect; /* CONNECT */
    exo_gen_request   request; /* GENERATE */
    exo_runner_status status;  /* STATUS */
    exo_chunk         chunk;   /* CHUNK */
} exo_runner_msg;

/* Zeroes m and sets its kind (status: Idle, request: empty). */
void exo_runner_msg_init(exo_runner_msg *m, exo_runner_msg_kind kind);
void exo_runner_msg_free(exo_runner_msg *m);

/* Whether s is an acceptable command id: 1..EXO_RUNNER_ID_MAX bytes of
 * [A-Za-z0-9._:-]. */
bool exo_runner_id_valid(const char *s);

/* Appends one whole frame for m to out. EXO_ETOOBIG when the payload would
 * exceed EXO_RUNNER_FRAME_MAX, EXO_EINVAL for a message that would not
 * decode (bad id, invalid status); out is unchanged on error. */
int exo_runner_msg_encode(const exo_runner_msg *m, exo_sbuf *out, exo_err *err);

/* Decodes one frame's payload. On error *out is freed, but keeps its kind
 * and command_id when those decoded (so a runner can answer a Generate it
 * could not parse with an ERROR chunk); both are 0 / "" otherwise. */
int exo_runner_msg_decode(const char *payload, size_t len, exo_runner_msg *out, exo_err *err);

/* Splits a byte stream into frames: 1 (and payload, plen, consumed set) for a
 * complete frame at buf, 0 when more bytes are needed, EXO_EFORMAT for a
 * zero or oversized length (the stream is then unusable). */
int exo_runner_frame_next(const char *buf, size_t len, const char **payload, size_t *plen,
                          size_t *consumed, exo_err *err);

/* ---- a channel: one end of the socket ---------------------------------- */

typedef struct exo_runner_chan exo_runner_chan;

/* Takes ownership of fd (closed by exo_runner_chan_free). */
exo_runner_chan *exo_runner_chan_new(int fd);
void             exo_runner_chan_free(exo_runner_chan *ch);
int              exo_runner_chan_fd(const exo_runner_chan *ch);

/* Reads whatever is available without blocking (or, when `block`, waits
 * for at least one byte). Returns the bytes read (> 0), 0 on end of
 * stream, -EAGAIN-like EXO_EBUSY when nothing was there, EXO_EIO on a
 * socket error. */
int exo_runner_chan_read(exo_runner_chan *ch, bool block);

/* The next whole buffered message: 1 (*m filled; free it), 0 (none
 * buffered), or a negative code for a malformed frame (*m is always left
 * initialised; see exo_runner_msg_decode for what it keeps on error). After EXO_EFORMAT
 * from framing the channel is broken and every later call fails. */
int exo_runner_chan_next(exo_runner_chan *ch, exo_runner_msg *m, exo_err *err);

/* Queues a frame for m and writes as much as the socket takes without
 * blocking (`block`: until everything queued is written). EXO_EIO when
 * the peer is gone. */
int exo_runner_chan_send(exo_runner_chan *ch, const exo_runner_msg *m, bool block, exo_err *err);
/* Writes queued bytes (non-blocking unless `block`); 0, or EXO_EIO. */
int exo_runner_chan_flush(exo_runner_chan *ch, bool block);
/* Bytes queued and not yet written. */
size_t exo_runner_chan_pending(const exo_runner_chan *ch);
/* True after a framing error: nothing more can be read from the stream. */
bool   exo_runner_chan_broken(const exo_runner_chan *ch);

#endif
