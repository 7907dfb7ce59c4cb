/* Master election: which node of the connected cluster is the single writer
 * of the replicated event log.
 *
 * A pure, deterministic state machine after exo's shared/election.py: no
 * sockets, timers or threads. Time comes in as now_ms arguments (any
 * monotonic millisecond clock; a value smaller than one seen before counts
 * as the one seen before), messages to send and results come out of queues,
 * so the same code runs in the node loop and in a simulated network.
 *
 * The algorithm (exo's, plus a safety net and a back-off exo lacks):
 *  - A candidacy is ordered by (clock, seniority, commands_seen, node id as
 *    a byte string); the winner of a campaign is the largest. Every message
 *    a node sends at clock c carries the (seniority, commands_seen) it had
 *    when it entered campaign c, so every receiver orders it the same way.
 *  - A node starts as its own master, session (self, 0), after an instant
 *    campaign: exo_election_new queues that first result.
 *  - A peer joined or left: exo_election_membership_changed. After
 *    debounce_ms (further changes in that window are absorbed) the clock
 *    goes up by one and a campaign starts.
 *  - A campaign broadcasts the node's status, collects the candidacies of
 *    its clock for the campaign time, then picks the largest (itself
 *    included), adopts the winner's session and broadcasts its final status
 *    (decided, naming that master). A message with a higher clock makes the
 *    node adopt the clock and join that campaign with the sender as first
 *    candidate; a lower clock is stale (answered with our status when idle,
 *    once per sender and clock, so a node that missed a membership change
 *    catches up); an equal clock during a campaign adds a candidate.
 *  - At the end of a campaign the winner's seniority becomes the number of
 *    distinct candidates (the size of the cluster it leads) and every other
 *    node's becomes 0: a sitting master keeps winning against joiners, and
 *    when a partition heals the master of the larger side wins, so the work
 *    that side did survives (exo keeps max(seniority, candidates): a master
 *    cut off alone would win again and its side's State would replace the
 *    majority's). --force-master and promotions stay above.
 *    A master proposes its existing session, so re-electing it changes
 *    nothing (is_new_master false); any other winner w proposes (w, clock).
 *  - Safety net: after campaign c ended, a message of clock c that is
 *    decided and names another session, or that comes from a node we did
 *    not count and outranks our winner, means the views differ: start a new
 *    campaign at c + 1. A message of clock c from an uncounted node that does
 *    not outrank our winner is answered with our final status instead, so a
 *    late joiner of campaign c learns every candidacy before it decides.
 *  - Back-off: a campaign started by the safety net runs at retry r+1 of
 *    the failed one, for min(campaign_ms << retry, campaign_max_ms); the
 *    retry travels in the messages so every participant waits as long.
 *    With every delay below campaign_ms / 2 each campaign counts everyone,
 *    so the net fires only when two groups that evolved apart share a clock
 *    number (a joiner whose clock equals the cluster's: one restart, which
 *    merges with the join's own campaign). Longer delays, up to
 *    campaign_max_ms / 2, converge after a few doublings; without the
 *    back-off, delays above campaign_ms could restart forever.
 *
 * The transport must deliver every broadcast to every node of the sender's
 * connected component (a full mesh or a relaying gossip layer) and report
 * membership changes at both ends of a link (one end suffices, a little
 * slower: stale clocks are answered). Order per link is not required.
 *
 * Invariants: a campaign's clock is larger than every clock completed
 * before; in_progress() is true exactly while a campaign runs (during the
 * debounce it is not); exo_election_master() changes only when a campaign
 * ends, and each end queues exactly one result.
 *
 * Bounds (fixed at init): max_candidates candidacies per campaign (the
 * lowest are dropped first, self never, so the winner stays exact), a ring
 * of 2 * max_candidates + 16 (sender, clock) pairs already answered (each
 * is answered once), EXO_ELECTION_OUTBOX messages and EXO_ELECTION_RESULTS
 * results queued (oldest dropped first, with a warning; is_new_master is
 * computed against the last result popped, so it stays right when results
 * are dropped). Clocks saturate at EXO_ELECTION_VALUE_MAX, far beyond any
 * honest cluster (only a peer sending such clocks gets there, and then
 * new campaigns reuse that clock).
 *
 * Threading: none inside; one thread uses an instance.
 *
 * Example usage:
 *   exo_election_config cfg;
 *   exo_election_config_init(&cfg, &my_id);
 *   exo_election *el;
 *   if (exo_election_new(&cfg, now_ms(), &el, &err) < 0) ...
 *   for (;;) {                                   // the node loop
 *       ... a peer connected or disconnected:
 *       exo_election_membership_changed(el, now_ms());
 *       ... bytes from a peer:
 *       exo_election_msg m;
 *       if (exo_election_msg_decode(buf, len, &m, &err) == 0)
 *           exo_election_receive(el, &m, now_ms(), NULL);
 *       ... a command forwarded:
 *       exo_election_command_seen(el);
 *       exo_election_tick(el, now_ms());
 *       while (exo_election_pop_broadcast(el, &m)) {
 *           uint8_t wire[EXO_ELECTION_MSG_MAX_BYTES];
 *           size_t n;
 *           exo_election_msg_encode(&m, wire, sizeof wire, &n, NULL);
 *           ... send wire[0..n) to every connected peer
 *       }
 *       exo_election_result r;
 *       while (exo_election_pop_result(el, &r))
 *           ... r.is_new_master: restart master / worker for session r.master, r.session_clock
 *       ... hold API commands while exo_election_in_progress(el)
 *       ... sleep until exo_election_next_deadline_ms(el) or the next input
 *   }
 *   exo_election_free(el); */
#ifndef EXO_CLUSTER_ELECTION_H
#define EXO_CLUSTER_ELECTION_H

#include "core/error.h"
#include "proto/types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --force-master and exo_election_promote: beyond anything a re-election
 * can reach (seniority grows to at most the cluster size). */
#define EXO_ELECTION_FORCE_SENIORITY 1000000
/* Clocks, session clocks and seniorities stay at or below 2^53 (exact in a
 * double, far beyond anything reachable); the decoder rejects more. */
#define EXO_ELECTION_VALUE_MAX   (UINT64_C(1) << 53)
/* Highest back-off level carried in a message. */
#define EXO_ELECTION_MAX_RETRY   16
/* A message encodes to at most ~270 bytes; the decoder refuses more than
 * this (room for a few unknown keys from newer versions). */
#define EXO_ELECTION_MSG_MAX_BYTES 512
#define EXO_ELECTION_WIRE_VERSION  1
#define EXO_ELECTION_OUTBOX  64
#define EXO_ELECTION_RESULTS 16

typedef struct exo_election exo_election;

typedef struct exo_election_config {
    exo_id   self;
    bool     force_master;      /* start with EXO_ELECTION_FORCE_SENIORITY */
    bool     non_candidate;     /* seniority -1: wins only among non-candidates */
    uint32_t debounce_ms;       /* default 200; 0..60000 */
    uint32_t campaign_ms;       /* default 500 (exo: 3000); 1..600000 */
    uint32_t campaign_max_ms;   /* back-off ceiling, default 16 * campaign_ms; >= campaign_ms */
    uint32_t max_candidates;    /* default 64; 2..4096 */
} exo_election_config;

/* Wire message: the sender's status. `master`/`master_clock` are the
 * sender's current session; with `decided` they are its choice for `clock`
 * (its campaign at `clock` has ended), without it the session it had before.
 * The candidacy this message stands for is the sender with its session if
 * it is the master of it, else (from, clock). */
typedef struct exo_election_msg {
    exo_id   from;
    uint64_t clock;
    int64_t  seniority;        /* -1 (non-candidate) .. EXO_ELECTION_VALUE_MAX */
    uint64_t commands_seen;
    exo_id   master;
    uint64_t master_clock;     /* <= clock */
    bool     decided;
    uint32_t retry;            /* 0 .. EXO_ELECTION_MAX_RETRY */
} exo_election_msg;

typedef struct exo_election_result {
    exo_id   master;
    uint64_t session_clock;    /* the clock at which this master's session began */
    uint64_t won_clock;        /* the campaign that produced this result */
    bool     is_new_master;    /* session differs from the last result popped (the first: true) */
    bool     is_self;          /* master == this node */
} exo_election_result;

/* Introspection for logs and tests. */
typedef struct exo_election_info {
    uint64_t clock;            /* current (campaign or last decided) clock */
    uint64_t decided_clock;    /* clock of the last completed campaign */
    int64_t  seniority;
    uint64_t commands_seen;
    uint32_t retry;            /* back-off level of the current / last campaign */
    uint64_t campaigns;        /* campaigns started, the initial instant one included */
    uint64_t restarts;         /* of which started by the safety net */
    size_t   n_candidates;     /* candidacies of the current / last campaign, self included */
} exo_election_info;

/* Defaults above for node self. */
void exo_election_config_init(exo_election_config *cfg, const exo_id *self);

/* Starts as own master after an instant campaign: the result (self, 0) and
 * a decided status are queued. EXO_EINVAL for an invalid config. */
int exo_election_new(const exo_election_config *cfg, uint64_t now_ms, exo_election **out, exo_err *err);
void exo_election_free(exo_election *e);

/* A peer connected or disconnected (call at both ends of the link). */
void exo_election_membership_changed(exo_election *e, uint64_t now_ms);
/* A status from a peer. Messages from self are ignored. EXO_EINVAL if m
 * does not validate (decoded messages always do). */
int exo_election_receive(exo_election *e, const exo_election_msg *m, uint64_t now_ms, exo_err *err);
/* This node observed one more command (counts towards commands_seen of the
 * next campaign it enters). */
void exo_election_command_seen(exo_election *e);
/* exo's PromoteMaster: seniority goes above anything seen, and a new
 * campaign starts at once (no debounce). A non-candidate becomes one. */
void exo_election_promote(exo_election *e, uint64_t now_ms);

/* Runs what is due at now_ms (every entry point above does this first). */
void exo_election_tick(exo_election *e, uint64_t now_ms);
/* When tick next has work to do; UINT64_MAX when idle. */
uint64_t exo_election_next_deadline_ms(const exo_election *e);

/* Pops the next status to send to every connected peer; false if none. */
bool exo_election_pop_broadcast(exo_election *e, exo_election_msg *out);
/* Pops the next result; false if none. */
bool exo_election_pop_result(exo_election *e, exo_election_result *out);

/* True while a campaign runs: the API holds its commands. */
bool exo_election_in_progress(const exo_election *e);
/* The current session (changes only when a campaign ends). Either pointer
 * may be NULL. */
void exo_election_master(const exo_election *e, exo_id *master, uint64_t *session_clock);
void exo_election_get_info(const exo_election *e, exo_election_info *out);

/* ---- wire codec --------------------------------------------------------------
 * A msgpack map with string keys, in this order, integers in their shortest
 * encoding (the bytes msgpack-c's packer gives, deterministic):
 *   {"v": 1, "from": str, "clock": uint, "seniority": int, "commands_seen":
 *    uint, "master": str, "master_clock": uint, "decided": bool, "retry": uint}
 * The decoder is strict: every key above required, exact types (any integer
 * encoding whose value fits), ranges and ids checked, unknown keys (string
 * keys only) skipped, duplicate keys, trailing bytes, ext types, nesting
 * deeper than 8 and more than EXO_ELECTION_MSG_MAX_BYTES rejected; counts
 * in the input are checked against the bytes left before anything is
 * read, and nothing is allocated. */
int exo_election_msg_validate(const exo_election_msg *m, exo_err *err);
/* Writes at most cap bytes (EXO_ELECTION_MSG_MAX_BYTES always suffices).
 * EXO_EINVAL if m does not validate, EXO_ETOOBIG if cap is short. */
int exo_election_msg_encode(const exo_election_msg *m, uint8_t *buf, size_t cap, size_t *out_len,
                            exo_err *err);
/* EXO_EFORMAT (malformed, wrong type, out of range, missing or duplicate
 * key), EXO_ETOOBIG (over EXO_ELECTION_MSG_MAX_BYTES), EXO_EUNSUPPORTED
 * (newer version). *out is written only on success. */
int exo_election_msg_decode(const uint8_t *buf, size_t len, exo_election_msg *out, exo_err *err);
bool exo_election_msg_equal(const exo_election_msg *a, const exo_election_msg *b);

#endif
