/* State snapshots: the folded State at one event index, as a file next to
 * the event log (see event_log.h for when they are written and how the log
 * is compacted behind them).
 *
 * Why events: a snapshot is the list of events that rebuild the State
 * (exo_state_to_events) plus the index of the last event it covers, so the
 * one codec of events (strict decoding, versioning) serves snapshots too,
 * and loading is a fold like any other.
 *
 * File format (all integers little-endian):
 *   [8]  magic "EXOSNAP1"
 *   [8]  i64 last event index covered (>= 0)
 *   [8]  u64 payload bytes
 *   [4]  u32 number of events
 *   [4]  u32 crc32c of bytes 0..27 followed by the payload
 *   payload: per event [u32 length][exo_event_encode bytes]
 * A file whose checksum, sizes or events do not check out is refused
 * whole (EXO_EFORMAT): a torn snapshot is never half-loaded.
 *
 * Privacy: with redact, the prompts of generation tasks (TaskCreated's
 * params) are replaced by EXO_REDACTED_PARAMS, so no file holds a prompt
 * (exo_event_redact).
 *
 * Example usage:
 *   uint8_t *buf; size_t len;
 *   exo_snapshot_encode(st, true, &buf, &len, &err);         // loop thread
 *   exo_snapshot_write_file(path, buf, len, &err);           // any thread
 *   exo_state *back;
 *   if (exo_snapshot_load_file(path, &back, &err) < 0) ...  // torn: EXO_EFORMAT */
#ifndef EXO_CLUSTER_SNAPSHOT_H
#define EXO_CLUSTER_SNAPSHOT_H

#include "cluster/events.h"
#include "cluster/state.h"
#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_SNAPSHOT_HEADER    32
#define EXO_SNAPSHOT_MAX_BYTES ((uint64_t)1 << 30)  /* a State larger than this is a bug */
/* What a generation task's params become on disk and in GET /events. */
#define EXO_REDACTED_PARAMS    "{\"redacted\":true}"

/* A copy of ev with a generation task's params replaced by
 * EXO_REDACTED_PARAMS: true and *out filled (exo_event_clear it) when ev
 * holds a prompt, false (out untouched) when it has nothing to redact. */
bool exo_event_redact(const exo_event *ev, exo_event *out);

/* The snapshot of st (at its last applied index, which must be >= 0) in a
 * fresh buffer (exo_free). */
int exo_snapshot_encode(const exo_state *st, bool redact, uint8_t **out, size_t *len, exo_err *err);
/* Checks header and checksum; *last_idx (may be NULL) gets the index. */
int exo_snapshot_check(const uint8_t *buf, size_t len, int64_t *last_idx, exo_err *err);
/* Checks and folds a snapshot into a fresh State at its index. */
int exo_snapshot_decode(const uint8_t *buf, size_t len, exo_state **out, exo_err *err);

/* Atomically replaces path: writes <path>.tmp, fsyncs it, renames it over
 * path and fsyncs the directory. */
int exo_snapshot_write_file(const char *path, const uint8_t *buf, size_t len, exo_err *err);
/* Reads and checks a snapshot file into a fresh buffer (exo_free).
 * EXO_ENOENT when there is none. */
int exo_snapshot_read_file(const char *path, uint8_t **buf, size_t *len, int64_t *last_idx, exo_err *err);
int exo_snapshot_load_file(const char *path, exo_state **out, exo_err *err);

#endif
