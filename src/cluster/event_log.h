/* The append-only on-disk event log (<data>/event_log/master/events.bin).
 *
 * Record i is event number i: [u32 LE length][u32 LE crc32c(payload)]
 * [payload], payload = exo_event_encode bytes (the log itself treats it as
 * opaque). No file header: an empty file is an empty log.
 *
 * Crash safety: exo_event_log_open verifies every record in order and keeps
 * exactly the longest intact prefix. The first record that is torn (file
 * ends inside it), has length 0 or over EXO_EVENT_LOG_MAX_RECORD, or fails
 * its checksum ends the log: the file is truncated there (ftruncate +
 * fsync) and the cut is reported and logged, never replayed. Length 0 is
 * rejected because a zero-filled tail, which some filesystems leave after a
 * crash, would otherwise checksum correctly (crc32c of nothing is 0).
 *
 * Durability (group commit): exo_event_log_append writes the record to the
 * file at once (readable immediately) but does not sync; exo_event_log_flush
 * fdatasyncs everything appended so far. The node loop appends all events
 * of one loop iteration, flushes once, and only then acknowledges them. A
 * failed append truncates its partial record away and leaves the log as it
 * was; if even that fails, or an fdatasync fails (the kernel may have
 * dropped the dirty pages, so retrying would lie), the log refuses further
 * appends and flushes (EXO_EIO): reopen it to recover from what is on disk.
 *
 * One writer per file: open takes an exclusive flock (EXO_EBUSY if another
 * exo_event_log, in this process or another, holds it).
 *
 * Archiving: exo_event_log_close(log, true, ...) on a non-empty log
 * compresses it to events.<UTC yyyymmddTHHMMSS.uuuuuu>.bin.zst (zstd) in
 * the same directory, removes events.bin and keeps only the
 * EXO_EVENT_LOG_MAX_ARCHIVES newest archives, as exo's DiskEventLog does.
 *
 * Threading: every call is safe from any thread (one internal mutex, held
 * for one record at a time). exo_event_log_flush does its fdatasync
 * outside the mutex, so the node loop hands it to a worker thread and
 * keeps appending meanwhile; HTTP threads read ranges for GET /events.
 *
 * Example usage:
 *   exo_event_log *log;
 *   exo_event_log_recovery rec;
 *   if (exo_event_log_open(path, &log, &rec, &err) < 0) ...
 *   exo_state *st = exo_state_new();
 *   if (exo_event_log_replay(log, st, &err) < 0) ...            // fold it all
 *   exo_event_log_append_event(log, &ev, &idx, &err);
 *   exo_event_log_flush(log, &err);                              // then ack
 *   exo_event_log_close(log, false, &err); */
#ifndef EXO_CLUSTER_EVENT_LOG_H
#define EXO_CLUSTER_EVENT_LOG_H

#include "cluster/events.h"
#include "cluster/state.h"
#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_EVENT_LOG_MAX_RECORD   EXO_CODEC_MAX_BYTES  /* 16 MiB payload cap */
#define EXO_EVENT_LOG_HEADER       8
#define EXO_EVENT_LOG_MAX_ARCHIVES 5

typedef struct exo_event_log exo_event_log;

/* What open found. */
typedef struct exo_event_log_recovery {
    uint64_t records;          /* intact records kept */
    uint64_t bytes_kept;       /* file size after recovery */
    uint64_t bytes_truncated;  /* torn / corrupt tail cut off (0 if clean) */
    char     reason[128];      /* why the tail was cut ("" if clean) */
} exo_event_log_recovery;

/* Opens (creating if needed) the log file at path; the directory must exist.
 * rec may be NULL. Errors: EXO_EIO (open, read, truncate, sync), EXO_EBUSY
 * (locked by another writer). */
int exo_event_log_open(const char *path, exo_event_log **out, exo_event_log_recovery *rec, exo_err *err);

/* Number of records (= index of the next append). */
uint64_t exo_event_log_count(exo_event_log *log);

/* Appends one record; *idx (may be NULL) receives its index. Errors:
 * EXO_EINVAL (len 0), EXO_ETOOBIG (len > EXO_EVENT_LOG_MAX_RECORD), EXO_EIO. */
int exo_event_log_append(exo_event_log *log, const void *payload, size_t len, uint64_t *idx, exo_err *err);
/* Encodes and appends an event. */
int exo_event_log_append_event(exo_event_log *log, const exo_event *ev, uint64_t *idx, exo_err *err);
/* Makes every appended record durable (fdatasync; no-op if nothing new). */
int exo_event_log_flush(exo_event_log *log, exo_err *err);

/* Reads record idx into a fresh buffer (free with exo_free), re-verifying
 * its checksum. Errors: EXO_ERANGE (idx >= count), EXO_EIO, EXO_EFORMAT
 * (the file changed under us and no longer checks out). */
int exo_event_log_read(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err);
/* Decodes up to max events starting at from_idx into a fresh array
 * (*events, *n; free with exo_event_log_free_events). from_idx == count
 * gives 0 events; beyond it is EXO_ERANGE. A record that does not decode
 * is EXO_EFORMAT (nothing returned). */
int exo_event_log_read_range(exo_event_log *log, uint64_t from_idx, size_t max, exo_event **events,
                             size_t *n, exo_err *err);
void exo_event_log_free_events(exo_event *events, size_t n);

/* Folds every record after the State's last applied index into st (a fresh
 * State replays the whole log). Stops at the first record that does not
 * decode or apply, with the State holding everything before it. */
int exo_event_log_replay(exo_event_log *log, exo_state *st, exo_err *err);

/* Seals a non-empty log and starts an empty one at the same path, keeping
 * the object (readers on other threads stay valid): a new master's session
 * starts so. Sealing is a rename to events.<stamp>.bin (fast, so the node
 * loop can do it); *sealed receives that path ("" when the log was empty)
 * for exo_event_log_archive, which the caller runs off its loop. */
int exo_event_log_rotate(exo_event_log *log, char *sealed, size_t cap, exo_err *err);
/* Compresses a sealed log to <sealed>.zst, removes it and keeps the
 * EXO_EVENT_LOG_MAX_ARCHIVES newest archives. Touches no exo_event_log: safe
 * on any thread. Sealed logs a crash left behind are archived by the next
 * exo_event_log_open of their directory. */
int exo_event_log_archive(const char *sealed, exo_err *err);

/* Flushes and closes; with archive and a non-empty log, rotates it into a
 * .bin.zst archive (see above). The log is freed even on error. */
int exo_event_log_close(exo_event_log *log, bool archive, exo_err *err);

#endif
