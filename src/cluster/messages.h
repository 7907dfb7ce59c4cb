/* What nodes say to each other over their links (net/net.h): one frame
 * type per message, its payload a msgpack map described by a field table
 * (codec.h), decoded as strictly as events are.
 *
 * Frame types are part of the wire protocol: pinned, append-only.
 *   ELECTION       election status (cluster/election.h has its codec)
 *   LOCAL_EVENT    a follower's event for the master to index; resent
 *                  until the master's GLOBAL_EVENT echoes (system, origin_idx)
 *   GLOBAL_EVENT   an indexed event of the master's session, with the
 *                  session's event count so far (followers detect gaps)
 *   EVENT_REQUEST  "send me the session's events from `since`" (gap repair,
 *                  catch-up of a new or returning node)
 *   HEAD           the master's heartbeat: session and event count
 *   COMMAND        a command for the master, from the node whose API took it
 *   COMMAND_ACK    the master took (code 0) or refused (code < 0, error) it
 *   CHUNK          a generated chunk, runner node -> the request's origin
 *   GEN_DONE       after the last chunk of a command
 *   PEERS          the sender's cluster port and the nodes it is linked
 *                  with (where they listen), so a node that knows one
 *                  peer (--bootstrap-peers) links with all of them
 *   DOWNLOAD       a user's start / cancel / delete of a model download,
 *                  to the node that should do it (its API is elsewhere)
 *   SNAPSHOT       the master's answer to an EVENT_REQUEST for events its
 *                  log has compacted away: the events that rebuild its
 *                  State (exo_state_to_events) and the session's event
 *                  count they stand for; the follower continues from there
 *
 * Example usage:
 *   exo_msg_head h = {.head = 42};
 *   h.session = session;
 *   uint8_t *buf; size_t len;
 *   exo_msg_encode(EXO_MSG_HEAD, &h, &buf, &len, &err);      // exo_free(buf)
 *   exo_msg_head back;
 *   if (exo_msg_decode(EXO_MSG_HEAD, buf, len, &back, &err) < 0) ...  // drop the frame
 *   exo_msg_clear(EXO_MSG_HEAD, &back); */
#ifndef EXO_CLUSTER_MESSAGES_H
#define EXO_CLUSTER_MESSAGES_H

#include "cluster/events.h"
#include "core/error.h"

#include <stddef.h>
#include <stdint.h>

/* The largest message payload (an event or command plus a little). */
#define EXO_MSG_MAX_BYTES (EXO_CODEC_MAX_BYTES + 4096)

typedef enum exo_msg_type {
    EXO_MSG_ELECTION      = 1,
    EXO_MSG_LOCAL_EVENT   = 2,
    EXO_MSG_GLOBAL_EVENT  = 3,
    EXO_MSG_EVENT_REQUEST = 4,
    EXO_MSG_HEAD          = 5,
    EXO_MSG_COMMAND       = 6,
    EXO_MSG_COMMAND_ACK   = 7,
    EXO_MSG_CHUNK         = 8,
    EXO_MSG_GEN_DONE      = 9,
    EXO_MSG_PEERS         = 10,
    EXO_MSG_DOWNLOAD      = 11,
    EXO_MSG_SNAPSHOT      = 12,
    EXO_MSG__END
} exo_msg_type;

const char *exo_msg_type_name(int type);

/* A master's term: who, and the election clock it won at. */
typedef struct exo_session {
    exo_id   master;
    uint64_t clock;
} exo_session;

bool exo_session_eq(const exo_session *a, const exo_session *b);

typedef struct exo_msg_local_event {
    exo_session session;
    exo_id      origin;      /* the node */
    exo_id      system;      /* its outbox's incarnation (fresh per session) */
    uint64_t    origin_idx;  /* 0, 1, 2... per system */
    exo_event   event;
} exo_msg_local_event;

typedef struct exo_msg_global_event {
    exo_session session;
    uint64_t    idx;
    uint64_t    count;       /* events in the session so far (>= idx + 1) */
    exo_id      system;      /* empty, or the LOCAL_EVENT this indexes */
    uint64_t    origin_idx;
    exo_event   event;
} exo_msg_global_event;

typedef struct exo_msg_event_request {
    exo_session session;
    uint64_t    since;
} exo_msg_event_request;

typedef struct exo_msg_head {
    exo_session session;
    uint64_t    count;
} exo_msg_head;

typedef struct exo_msg_command {
    exo_id      origin;
    exo_command command;
} exo_msg_command;

typedef struct exo_msg_command_ack {
    exo_id  command_id;
    int32_t code;            /* 0 or an EXO_E* code */
    char   *error;           /* heap; NULL when code == 0 */
} exo_msg_command_ack;

typedef struct exo_msg_chunk {
    exo_id command_id;
    char  *chunk_json;       /* heap: exo_chunk_to_json text */
} exo_msg_chunk;

typedef struct exo_msg_gen_done {
    exo_id command_id;
} exo_msg_gen_done;

typedef struct exo_msg_download {
    exo_id  command_id;
    int32_t action;          /* exo_download_action (cluster/downloads.h) */
    char    model_id[EXO_MODEL_ID_MAX];
} exo_msg_download;

#define EXO_MSG_MAX_PEERS 256
typedef struct exo_peer_addr {
    exo_id node_id;
    char   address[EXO_ADDR_MAX];  /* "ip:port", "[ip6%scope]:port" */
} exo_peer_addr;

typedef struct exo_msg_peers {
    int32_t port;                  /* the sender's cluster listener */
    struct { exo_peer_addr *v; size_t n; } peers;
} exo_msg_peers;

#define EXO_MSG_MAX_SNAPSHOT_EVENTS (1 << 20)
typedef struct exo_snapshot_item {
    exo_event event;
} exo_snapshot_item;

typedef struct exo_msg_snapshot {
    exo_session session;
    uint64_t    count;             /* the events stand for events 0..count-1 (count >= 1) */
    struct { exo_snapshot_item *v; size_t n; } events;
} exo_msg_snapshot;

/* Encodes a valid message of that type into a fresh buffer (exo_free). */
int  exo_msg_encode(int type, const void *msg, uint8_t **out, size_t *out_len, exo_err *err);
/* Decodes exactly len bytes; msg is left empty on failure (EXO_EFORMAT,
 * EXO_ETOOBIG, EXO_EINVAL for a type this build does not know). */
int  exo_msg_decode(int type, const uint8_t *buf, size_t len, void *msg, exo_err *err);
void exo_msg_clear(int type, void *msg);
bool exo_msg_equal(int type, const void *a, const void *b);
/* Bytes of the C struct of a type (0 for ELECTION and unknown types). */
size_t exo_msg_size(int type);

#endif
