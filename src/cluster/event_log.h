/* The append-only on-disk event log (<data>/event_log/master/events.bin),
 * kept bounded by State snapshots and compaction.
 *
 * Records carry global event indices: record k of a file whose first kept
 * index is `first` is event first + k. Each record is [u32 LE length][u32
 * LE crc32c(payload)][payload], payload = exo_event_encode bytes (the log
 * treats it as opaque). A file that was never compacted has no header
 * (first = 0; an empty file is an empty log); a compacted one starts with
 * a 24-byte header: "EXOLOGB1", u64 LE first, u32 LE crc32c of those 16
 * bytes, u32 0. A header that does not check out is EXO_EFORMAT at open
 * (it is only ever written whole, through a rename).
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
 * Snapshots and compaction (exo_event_log_checkpoint): a snapshot of the
 * State (cluster/snapshot.h) at index S is written atomically to
 * <path>.snap; the one it replaces becomes <path>.snap.prev; then the log
 * is compacted to the events after the *previous* snapshot (written to
 * <path>.compact, fsynced, renamed over the log). Keeping one interval more
 * than the newest snapshot needs is what lets a torn or corrupt newest
 * snapshot fall back to the previous one plus a longer tail; a crash
 * between snapshot and compaction leaves the full log, which loses
 * nothing. exo_event_log_recover loads the newest usable snapshot and
 * replays only the events after it (or the whole log while nothing was
 * compacted). With checkpoints every N events the file holds at most about
 * 2N events, whatever the uptime.
 *
 * One writer per file: open takes an exclusive flock (EXO_EBUSY if another
 * exo_event_log, in this process or another, holds it).
 *
 * Archiving: exo_event_log_close(log, true, ...) on a non-empty log
 * compresses it to events.<UTC yyyymmddTHHMMSS.uuuuuu>.bin.zst (zstd) in
 * the same directory, removes events.bin and its snapshots and keeps only
 * the EXO_EVENT_LOG_MAX_ARCHIVES newest archives, as exo's DiskEventLog does.
 *
 * Threading: every call is safe from any thread. One mutex guards the
 * descriptor and the offset index and is held only for bookkeeping: reads
 * copy the offsets they need and a dup() of the descriptor under it and do
 * their I/O and decoding without it, so readers never hold up appends.
 * exo_event_log_flush does its fdatasync outside the mutex too. A second
 * mutex serialises checkpoints and rotations (a rotation waits for a
 * checkpoint in progress; a checkpoint of a rotated log is refused by its
 * epoch).
 *
 * Example usage:
 *   exo_event_log *log;
 *   exo_event_log_recovery rec;
 *   if (exo_event_log_open(path, &log, &rec, &err) < 0) ...
 *   exo_state *st;
 *   if (exo_event_log_recover(log, &st, NULL, &err) < 0) ...    // snapshot + tail
 *   exo_event_log_append_event(log, &ev, &idx, &err);
 *   exo_event_log_flush(log, &err);                              // then ack
 *   exo_snapshot_encode(st, true, &snap, &len, &err);            // every N events
 *   exo_event_log_checkpoint(log, snap, len, false, exo_event_log_epoch(log), &err);
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
#define EXO_EVENT_LOG_FILE_HEADER  24

typedef struct exo_event_log exo_event_log;

/* What open found. */
typedef struct exo_event_log_recovery {
    uint64_t records;          /* intact records kept */
    uint64_t first;            /* global index of the first of them */
    uint64_t bytes_kept;       /* file size after recovery */
    uint64_t bytes_truncated;  /* torn / corrupt tail cut off (0 if clean) */
    char     reason[128];      /* why the tail was cut ("" if clean) */
} exo_event_log_recovery;

/* Opens (creating if needed) the log file at path; the directory must exist.
 * rec may be NULL. Errors: EXO_EIO (open, read, truncate, sync), EXO_EBUSY
 * (locked by another writer). */
int exo_event_log_open(const char *path, exo_event_log **out, exo_event_log_recovery *rec, exo_err *err);

/* Index of the next append (= events ever appended in this log's life,
 * compacted ones included). */
uint64_t exo_event_log_count(exo_event_log *log);
/* Index of the oldest event still in the file (0 until a compaction). */
uint64_t exo_event_log_first(exo_event_log *log);
/* Bytes of the file. */
uint64_t exo_event_log_bytes(exo_event_log *log);
/* Bumped by every rotation; a checkpoint built for an older epoch is
 * refused (its State belongs to the rotated log). */
uint64_t exo_event_log_epoch(exo_event_log *log);

/* Appends one record; *idx (may be NULL) receives its index. Errors:
 * EXO_EINVAL (len 0), EXO_ETOOBIG (len > EXO_EVENT_LOG_MAX_RECORD), EXO_EIO. */
int exo_event_log_append(exo_event_log *log, const void *payload, size_t len, uint64_t *idx, exo_err *err);
/* Encodes and appends an event. */
int exo_event_log_append_event(exo_event_log *log, const exo_event *ev, uint64_t *idx, exo_err *err);
/* Makes every appended record durable (fdatasync; no-op if nothing new). */
int exo_event_log_flush(exo_event_log *log, exo_err *err);

/* Reads record idx into a fresh buffer (free with exo_free), re-verifying
 * its checksum. Errors: EXO_ENOENT (idx < first: compacted away),
 * EXO_ERANGE (idx >= count), EXO_EIO, EXO_EFORMAT (the file changed under
 * us and no longer checks out). */
int exo_event_log_read(exo_event_log *log, uint64_t idx, uint8_t **payload, size_t *len, exo_err *err);
/* Decodes up to max events starting at from_idx into a fresh array
 * (*events, *n; free with exo_event_log_free_events). from_idx == count
 * gives 0 events; beyond it is EXO_ERANGE; before first, EXO_ENOENT. A
 * record that does not decode is EXO_EFORMAT (nothing returned). Only the
 * records asked for are read (one pread for the range when it is small). */
int exo_event_log_read_range(exo_event_log *log, uint64_t from_idx, size_t max, exo_event **events,
                             size_t *n, exo_err *err);
void exo_event_log_free_events(exo_event *events, size_t n);

/* Folds every record after the State's last applied index into st (a fresh
 * State replays the whole log). Stops at the first record that does not
 * decode or apply, with the State holding everything before it. A State
 * older than the oldest kept event is EXO_ENOENT (load a snapshot). */
int exo_event_log_replay(exo_event_log *log, exo_state *st, exo_err *err);

/* What exo_event_log_recover used. */
typedef struct exo_event_log_snapshot_info {
    int64_t  snapshot_idx;   /* last event the snapshot covered; -1: none used */
    bool     used_previous;  /* the newest snapshot was unusable (reason) */
    uint64_t replayed;       /* events folded after the snapshot */
    char     reason[256];    /* why a snapshot was skipped ("" if none was) */
} exo_event_log_snapshot_info;

/* The State the log stands for: the newest usable snapshot (its index
 * within [first - 1, count - 1]; checksum good) then the events after it;
 * with no usable snapshot, a full replay if nothing was compacted, else
 * EXO_EFORMAT (events before `first` are gone and nothing covers them).
 * info may be NULL. */
int exo_event_log_recover(exo_event_log *log, exo_state **out, exo_event_log_snapshot_info *info, exo_err *err);

/* Writes a snapshot (exo_snapshot_encode bytes) and compacts the log.
 * Normally (install false) the snapshot must cover an index < count; the
 * newest snapshot becomes the previous one and the log keeps the events
 * after that previous one (nothing is dropped the first time). With install
 * (a follower that adopts the master's snapshot instead of events it can no
 * longer get) the log keeps only events after the snapshot, or becomes
 * empty and continues at its index + 1. epoch: exo_event_log_epoch when the
 * State was taken; a rotation since makes this EXO_ECANCELED. Errors also
 * EXO_EFORMAT (bad snapshot), EXO_EINVAL, EXO_EIO. Runs the disk work
 * without the append mutex except for the last few records and the swap:
 * call it off the node loop. *dropped (may be NULL): events compacted away. */
int exo_event_log_checkpoint(exo_event_log *log, const uint8_t *snapshot, size_t len, bool install, uint64_t epoch,
                             uint64_t *dropped, exo_err *err);

/* Seals a non-empty log and starts an empty one at the same path (first =
 * 0, snapshots deleted, epoch bumped), keeping the object (readers on other
 * threads stay valid): a new master's session starts so. Sealing is a rename to events.<stamp>.bin (fast, so the node
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
