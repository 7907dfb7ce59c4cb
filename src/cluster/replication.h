/* Replicating the master's event log: the three buffers between a node's
 * local facts and every node's State (exo's EventRouter, OrderedBuffer and
 * MultiSourceBuffer). Pure: no I/O, no clocks of their own (now_ms comes in).
 *
 *   follower worker --LocalEvent--> master --GlobalEvent--> every node
 *        exo_outbox        exo_sequencer          exo_replica
 *
 * exo_outbox (every node): numbers this node's events 0, 1, 2... under a
 *   "system" id (fresh per session), keeps each until the master's echo
 *   (a GlobalEvent naming the same system and index) acknowledges it, and
 *   says which are due for a (re)send. A new session (new master) renumbers
 *   what is still unacknowledged under a new system id.
 * exo_sequencer (the master): per system, releases events in origin order
 *   exactly once: duplicates are dropped, early ones wait (a bounded
 *   number), so every origin's events are indexed in the order it made
 *   them whatever the network did.
 * exo_replica (every node): releases indexed events in index order exactly
 *   once, buffers early ones (bounded), and when it sees a gap (an index
 *   beyond the next, or a session count beyond what it has) says when to
 *   ask the master for the missing range: at once, then backing off from
 *   EXO_REPLICA_RETRY_MIN_MS to EXO_REPLICA_RETRY_MAX_MS until progress.
 *
 * Ownership: events offered are moved in (the caller's struct is zeroed);
 * released events are handed to the callback, which takes them.
 *
 * Example usage (a follower):
 *   exo_replica *r = exo_replica_new();
 *   on GlobalEvent g of the current session:
 *       exo_replica_offer(r, g.idx, &g.event, apply_cb, node);
 *       exo_replica_note_count(r, g.count);
 *   on a timer:
 *       uint64_t since;
 *       if (exo_replica_request_due(r, now_ms, &since)) send EventRequest(since); */
#ifndef EXO_CLUSTER_REPLICATION_H
#define EXO_CLUSTER_REPLICATION_H

#include "cluster/events.h"

#include <stdbool.h>
#include <stdint.h>

#define EXO_OUTBOX_MAX              4096
#define EXO_SEQUENCER_MAX_EARLY     1024   /* per system */
#define EXO_SEQUENCER_MAX_SYSTEMS   1024
#define EXO_REPLICA_MAX_EARLY       8192
#define EXO_REPLICA_RETRY_MIN_MS    200
#define EXO_REPLICA_RETRY_MAX_MS    5000

/* ---- outbox ---- */
typedef struct exo_outbox exo_outbox;

exo_outbox   *exo_outbox_new(void);
void          exo_outbox_free(exo_outbox *o);
/* A new system id; unacknowledged events are renumbered from 0 and due at once. */
void          exo_outbox_reset(exo_outbox *o);
const exo_id *exo_outbox_system(const exo_outbox *o);
/* Queues ev (moved). A full outbox drops its oldest event and resets (the
 * master would wait forever for a dropped index otherwise). */
void          exo_outbox_push(exo_outbox *o, exo_event *ev);
/* The master indexed (system, origin_idx): it and everything before it are
 * delivered (the sequencer releases each system in order). */
void          exo_outbox_ack(exo_outbox *o, const exo_id *system, uint64_t origin_idx);
size_t        exo_outbox_pending(const exo_outbox *o);
typedef void (*exo_outbox_send_fn)(void *ctx, uint64_t origin_idx, const exo_event *ev);
/* Calls fn for every event never sent or last sent resend_ms or more ago,
 * oldest first, and marks them sent at now_ms. */
void          exo_outbox_send_due(exo_outbox *o, uint64_t now_ms, uint64_t resend_ms, exo_outbox_send_fn fn,
                                  void *ctx);

/* ---- sequencer ---- */
typedef struct exo_sequencer exo_sequencer;
typedef void (*exo_sequencer_ready_fn)(void *ctx, const exo_id *system, uint64_t origin_idx, exo_event *ev);

exo_sequencer *exo_sequencer_new(void);
void           exo_sequencer_free(exo_sequencer *s);
/* Returns 0 (released now, with any that waited behind it, or held as
 * early), 1 (a duplicate: dropped), EXO_EBUSY (too far ahead: dropped, the
 * origin resends). ev is moved in every case. */
int            exo_sequencer_offer(exo_sequencer *s, const exo_id *system, uint64_t origin_idx, exo_event *ev,
                                   exo_sequencer_ready_fn fn, void *ctx);

/* ---- replica ---- */
typedef struct exo_replica exo_replica;
typedef void (*exo_replica_apply_fn)(void *ctx, uint64_t idx, exo_event *ev);

exo_replica *exo_replica_new(void);
void         exo_replica_free(exo_replica *r);
/* A new session: expect index 0, forget buffered events and counts. */
void         exo_replica_reset(exo_replica *r);
/* The next index to apply (= events applied so far). */
uint64_t     exo_replica_next(const exo_replica *r);
/* The session's event count as last reported by the master. */
uint64_t     exo_replica_known_count(const exo_replica *r);
/* 0 (applied now or buffered), 1 (already applied: dropped), EXO_EBUSY
 * (beyond the buffer: dropped, a request will fetch it). ev is moved. */
int          exo_replica_offer(exo_replica *r, uint64_t idx, exo_event *ev, exo_replica_apply_fn fn, void *ctx);
void         exo_replica_note_count(exo_replica *r, uint64_t count);
/* The events before next were installed another way (a snapshot): expect
 * next, drop what waits below it and release what waits from it on. */
void         exo_replica_skip_to(exo_replica *r, uint64_t next, exo_replica_apply_fn fn, void *ctx);
/* Whether events are known to exist that are not applied. */
bool         exo_replica_behind(const exo_replica *r);
/* When behind and the back-off allows it now: true with the index to ask
 * from; the next request is then due after the doubled back-off (reset by
 * progress). */
bool         exo_replica_request_due(exo_replica *r, uint64_t now_ms, uint64_t *since);

#endif
