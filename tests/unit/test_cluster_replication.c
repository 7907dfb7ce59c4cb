/* Replication: the outbox (numbering, acknowledgement, resends, renumbering
 * on a new session, overflow), the sequencer (each origin in order, exactly
 * once, whatever the network did), the replica (index order, gaps asked for
 * with back-off), the cluster message codecs (round trips and hostile
 * bytes), and the State snapshot a new master starts its session from. */
#include "core/json_util.h"
#include "cluster/messages.h"
#include "cluster/replication.h"
#include "cluster/state.h"
#include "core/alloc.h"
#include "core/log.h"
#include "test_cluster_fixtures.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

static void quiet(void) { exo_log_set_level(EXO_LOG_ERROR); }
TestSuite(replication, .init = quiet);

/* An event whose task id carries n, to tell events apart. */
static exo_event numbered(int n)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_TASK_DELETED);
    snprintf(ev.u.task_deleted.task_id.s, sizeof ev.u.task_deleted.task_id.s, "t-%d", n);
    return ev;
}

static int number_of(const exo_event *ev) { return atoi(ev->u.task_deleted.task_id.s + 2); }

/* ---- outbox ---- */

typedef struct sent {
    uint64_t idx[64];
    int      num[64];
    int      n;
} sent;

static void record_send(void *ctx, uint64_t origin_idx, const exo_event *ev)
{
    sent *s = ctx;
    s->idx[s->n] = origin_idx;
    s->num[s->n++] = number_of(ev);
}

Test(replication, outbox_numbers_resends_and_acknowledges)
{
    exo_outbox *o = exo_outbox_new();
    for (int i = 0; i < 5; i++) {
        exo_event ev = numbered(i);
        exo_outbox_push(o, &ev);
        cr_assert_eq(ev.kind, 0, "moved: the caller's event is emptied");
    }
    sent s = {0};
    exo_outbox_send_due(o, 1000, 2000, record_send, &s);
    cr_assert_eq(s.n, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(s.idx[i], (uint64_t)i);
        cr_assert_eq(s.num[i], i);
    }
    s.n = 0;
    exo_outbox_send_due(o, 2999, 2000, record_send, &s);
    cr_assert_eq(s.n, 0, "not due before the resend time");
    exo_outbox_ack(o, exo_outbox_system(o), 2);
    cr_assert_eq(exo_outbox_pending(o), 2, "an ack covers everything up to it");
    exo_id other;
    exo_id_new(&other);
    exo_outbox_ack(o, &other, 10);
    cr_assert_eq(exo_outbox_pending(o), 2, "acks of another system are ignored");
    exo_outbox_send_due(o, 3000, 2000, record_send, &s);
    cr_assert_eq(s.n, 2);
    cr_assert_eq(s.idx[0], 3);
    cr_assert_eq(s.num[1], 4);

    /* a new session: what is left is renumbered from 0 under a new system */
    exo_id before = *exo_outbox_system(o);
    exo_outbox_reset(o);
    cr_assert(!exo_id_eq(&before, exo_outbox_system(o)));
    s.n = 0;
    exo_outbox_send_due(o, 3001, 2000, record_send, &s);
    cr_assert_eq(s.n, 2, "due at once after a reset");
    cr_assert_eq(s.idx[0], 0);
    cr_assert_eq(s.num[0], 3);
    cr_assert_eq(s.idx[1], 1);
    exo_outbox_ack(o, &before, 100);
    cr_assert_eq(exo_outbox_pending(o), 2, "the old system's acks no longer count");
    exo_outbox_free(o);
}

Test(replication, outbox_overflow_drops_oldest_and_renumbers)
{
    exo_outbox *o = exo_outbox_new();
    for (int i = 0; i < EXO_OUTBOX_MAX + 3; i++) {
        exo_event ev = numbered(i);
        exo_outbox_push(o, &ev);
    }
    cr_assert_eq(exo_outbox_pending(o), EXO_OUTBOX_MAX);
    sent s = {0};
    /* only look at the first few */
    exo_outbox_ack(o, exo_outbox_system(o), (uint64_t)EXO_OUTBOX_MAX - 60);
    exo_outbox_send_due(o, 1, 1000, record_send, &s);
    cr_assert_eq(s.n, 59);
    cr_assert_eq(s.num[58], EXO_OUTBOX_MAX + 2, "the newest is kept");
    cr_assert_eq(s.idx[0] + 1, s.idx[1], "numbers stay contiguous after the drops");
    exo_outbox_free(o);
}

/* ---- sequencer ---- */

typedef struct released {
    int      num[2048];
    uint64_t idx[2048];
    int      n;
} released;

static void on_ready(void *ctx, const exo_id *system, uint64_t origin_idx, exo_event *ev)
{
    released *r = ctx;
    r->idx[r->n] = origin_idx;
    r->num[r->n++] = number_of(ev);
    exo_event_clear(ev);
}

static int offer(exo_sequencer *q, const exo_id *sys, uint64_t idx, released *r)
{
    exo_event ev = numbered((int)idx);
    return exo_sequencer_offer(q, sys, idx, &ev, on_ready, r);
}

Test(replication, sequencer_releases_each_origin_in_order_exactly_once)
{
    exo_sequencer *q = exo_sequencer_new();
    exo_id a, b;
    exo_id_new(&a);
    exo_id_new(&b);
    released r = {0};
    /* a's events arrive out of order with duplicates; b's interleaved */
    uint64_t a_order[] = {2, 0, 0, 1, 4, 3, 2, 5};
    for (size_t i = 0; i < sizeof a_order / sizeof *a_order; i++) {
        int rc = offer(q, &a, a_order[i], &r);
        cr_assert(rc == 0 || rc == 1);
        if (i % 2)
            offer(q, &b, i / 2, &r);
    }
    int next_a = 0, next_b = 0;
    for (int i = 0; i < r.n; i++) {
        /* both origins' numbers come out in order; a's are 0..5, b's 0..3 */
        if (r.num[i] == next_a && r.idx[i] == (uint64_t)next_a)
            next_a++;
        else if (r.num[i] == next_b)
            next_b++;
        else
            cr_assert_fail("out of order: %d", r.num[i]);
    }
    cr_assert_eq(next_a, 6);
    cr_assert_eq(next_b, 4);
    cr_assert_eq(r.n, 10, "every event once");
    cr_assert_eq(offer(q, &a, 3, &r), 1, "a late duplicate is dropped");
    exo_sequencer_free(q);
}

Test(replication, sequencer_bounds_what_it_holds)
{
    exo_sequencer *q = exo_sequencer_new();
    exo_id a;
    exo_id_new(&a);
    released r = {0};
    for (uint64_t i = 1; i <= EXO_SEQUENCER_MAX_EARLY; i++)
        cr_assert_eq(offer(q, &a, i, &r), 0);
    cr_assert_eq(offer(q, &a, EXO_SEQUENCER_MAX_EARLY + 1, &r), EXO_EBUSY, "too far ahead: dropped");
    cr_assert_eq(r.n, 0);
    cr_assert_eq(offer(q, &a, 0, &r), 0);
    cr_assert_eq(r.n, EXO_SEQUENCER_MAX_EARLY + 1, "0 releases everything that waited behind it");
    for (int i = 0; i < r.n; i++)
        cr_assert_eq(r.idx[i], (uint64_t)i);
    exo_sequencer_free(q);
}

/* ---- replica ---- */

typedef struct applied {
    uint64_t idx[512];
    int      n;
} applied;

static void on_apply(void *ctx, uint64_t idx, exo_event *ev)
{
    applied *a = ctx;
    a->idx[a->n++] = idx;
    exo_event_clear(ev);
}

static int give(exo_replica *r, uint64_t idx, applied *a)
{
    exo_event ev = numbered((int)idx);
    return exo_replica_offer(r, idx, &ev, on_apply, a);
}

Test(replication, replica_applies_in_index_order_and_asks_for_gaps)
{
    exo_replica *r = exo_replica_new();
    applied a = {0};
    uint64_t since;
    cr_assert_not(exo_replica_request_due(r, 0, &since), "nothing known: nothing to ask");
    cr_assert_eq(give(r, 0, &a), 0);
    cr_assert_eq(give(r, 3, &a), 0);
    cr_assert_eq(a.n, 1, "3 waits for 1 and 2");
    cr_assert(exo_replica_behind(r));
    cr_assert(exo_replica_request_due(r, 1000, &since));
    cr_assert_eq(since, 1);
    cr_assert_not(exo_replica_request_due(r, 1100, &since), "backing off");
    cr_assert(exo_replica_request_due(r, 1000 + EXO_REPLICA_RETRY_MIN_MS, &since));
    cr_assert_not(exo_replica_request_due(r, 1000 + 2 * EXO_REPLICA_RETRY_MIN_MS, &since), "doubled");
    cr_assert_eq(give(r, 2, &a), 0);
    cr_assert_eq(give(r, 1, &a), 0);
    cr_assert_eq(a.n, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(a.idx[i], (uint64_t)i);
    cr_assert_eq(give(r, 2, &a), 1, "already applied");
    cr_assert_not(exo_replica_behind(r));
    exo_replica_note_count(r, 10);
    cr_assert(exo_replica_behind(r), "the master says there are 10");
    cr_assert(exo_replica_request_due(r, 5000, &since), "progress reset the back-off");
    cr_assert_eq(since, 4);
    exo_replica_reset(r);
    cr_assert_eq(exo_replica_next(r), 0);
    cr_assert_not(exo_replica_behind(r));
    exo_replica_free(r);
}

/* ---- messages ---- */

static void roundtrip(int type, const void *msg)
{
    exo_err err = {0};
    uint8_t *buf;
    size_t len;
    cr_assert_eq(exo_msg_encode(type, msg, &buf, &len, &err), 0, "%s: %s", exo_msg_type_name(type), err.msg);
    void *back = exo_calloc(1, exo_msg_size(type));
    cr_assert_eq(exo_msg_decode(type, buf, len, back, &err), 0, "%s: %s", exo_msg_type_name(type), err.msg);
    cr_assert(exo_msg_equal(type, msg, back), "%s differs after a round trip", exo_msg_type_name(type));
    /* every truncation is refused, and refusing leaves nothing allocated */
    for (size_t cut = 0; cut < len; cut++) {
        void *t = exo_calloc(1, exo_msg_size(type));
        cr_assert_neq(exo_msg_decode(type, buf, cut, t, NULL), 0, "%s: a %zu-byte prefix decoded",
                      exo_msg_type_name(type), cut);
        exo_free(t);
    }
    exo_msg_clear(type, back);
    exo_free(back);
    exo_free(buf);
}

Test(replication, every_message_round_trips)
{
    exo_session session;
    exo_id_new(&session.master);
    session.clock = 7;
    exo_msg_local_event le = {.session = session, .origin_idx = 3};
    exo_id_new(&le.origin);
    exo_id_new(&le.system);
    fx_event(&le.event, EXO_EVENT_NODE_GATHERED_INFO, 1);
    roundtrip(EXO_MSG_LOCAL_EVENT, &le);
    exo_msg_global_event ge = {.session = session, .idx = 41, .count = 42, .origin_idx = 3};
    ge.system = le.system;
    fx_event(&ge.event, EXO_EVENT_INSTANCE_CREATED, 3);
    roundtrip(EXO_MSG_GLOBAL_EVENT, &ge);
    ge.count = 41;
    cr_assert_eq(exo_msg_encode(EXO_MSG_GLOBAL_EVENT, &ge, &(uint8_t *){0}, &(size_t){0}, NULL), EXO_EINVAL,
                 "count must exceed idx");
    exo_msg_event_request er = {session, 12};
    roundtrip(EXO_MSG_EVENT_REQUEST, &er);
    exo_msg_head h = {session, 99};
    roundtrip(EXO_MSG_HEAD, &h);
    exo_msg_command c = {0};
    exo_id_new(&c.origin);
    fx_command(&c.command, EXO_COMMAND_TEXT_GENERATION, 1);
    roundtrip(EXO_MSG_COMMAND, &c);
    exo_msg_command_ack ok = {c.command.command_id, 0, NULL};
    roundtrip(EXO_MSG_COMMAND_ACK, &ok);
    exo_msg_command_ack no = {c.command.command_id, EXO_ENOENT, exo_strdup("No instance found for model x")};
    roundtrip(EXO_MSG_COMMAND_ACK, &no);
    no.code = 0;
    cr_assert_eq(exo_msg_encode(EXO_MSG_COMMAND_ACK, &no, &(uint8_t *){0}, &(size_t){0}, NULL), EXO_EINVAL);
    exo_msg_chunk ch = {c.command.command_id, exo_strdup("{\"kind\":\"token\",\"text\":\"hi\"}")};
    roundtrip(EXO_MSG_CHUNK, &ch);
    exo_msg_gen_done d = {c.command.command_id};
    roundtrip(EXO_MSG_GEN_DONE, &d);
    exo_peer_addr peers[2] = {0};
    exo_id_new(&peers[0].node_id);
    snprintf(peers[0].address, sizeof peers[0].address, "10.0.0.2:52414");
    exo_id_new(&peers[1].node_id);
    snprintf(peers[1].address, sizeof peers[1].address, "[fe80::1%%eth0]:40000");
    exo_msg_peers p = {52414, {peers, 2}};
    roundtrip(EXO_MSG_PEERS, &p);
    exo_event_clear(&le.event);
    exo_event_clear(&ge.event);
    exo_command_clear(&c.command);
    exo_free(no.error);
    exo_free(ch.chunk_json);
}

Test(replication, hostile_message_bytes_are_refused)
{
    exo_err err = {0};
    exo_msg_head h;
    cr_assert_eq(exo_msg_decode(EXO_MSG_HEAD, NULL, 0, &h, &err), EXO_EFORMAT);
    cr_assert_eq(exo_msg_decode(77, (const uint8_t *)"\x80", 1, &h, &err), EXO_EINVAL, "unknown type");
    /* a map announcing 4 billion entries in 5 bytes */
    const uint8_t huge[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    cr_assert_eq(exo_msg_decode(EXO_MSG_HEAD, huge, sizeof huge, &h, &err), EXO_EFORMAT);
    /* wrong types, trailing bytes, a missing field */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str(&pk, 7);
    msgpack_pack_str_body(&pk, "session", 7);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str(&pk, 6);
    msgpack_pack_str_body(&pk, "master", 6);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "a b", 3); /* not an id */
    msgpack_pack_str(&pk, 5);
    msgpack_pack_str_body(&pk, "clock", 5);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_str(&pk, 5);
    msgpack_pack_str_body(&pk, "count", 5);
    msgpack_pack_int64(&pk, -1); /* negative */
    cr_assert_eq(exo_msg_decode(EXO_MSG_HEAD, (uint8_t *)sb.data, sb.size, &h, &err), EXO_EFORMAT);
    cr_assert(strstr(err.msg, "master") || strstr(err.msg, "count"), "%s", err.msg);
    msgpack_sbuffer_destroy(&sb);
    /* too many peers */
    exo_msg_peers p = {1, {exo_calloc(EXO_MSG_MAX_PEERS + 1, sizeof(exo_peer_addr)), EXO_MSG_MAX_PEERS + 1}};
    for (size_t i = 0; i < p.peers.n; i++) {
        exo_id_new(&p.peers.v[i].node_id);
        snprintf(p.peers.v[i].address, EXO_ADDR_MAX, "1.2.3.4:5");
    }
    cr_assert_eq(exo_msg_encode(EXO_MSG_PEERS, &p, &(uint8_t *){0}, &(size_t){0}, &err), EXO_EINVAL);
    exo_free(p.peers.v);
}

/* ---- the snapshot a new session starts from ---- */

static void apply_all(exo_state *st, const exo_event_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        exo_err err = {0};
        cr_assert_eq(exo_state_apply(st, exo_state_last_event_applied_idx(st) + 1, &l->v[i], &err), 0, "%s",
                     err.msg);
    }
}

static char *dump_without_idx(const exo_state *st)
{
    json_t *j = exo_state_to_json(st);
    json_object_del(j, "lastEventAppliedIdx");
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

Test(replication, state_snapshot_rebuilds_the_state)
{
    exo_state *st = exo_state_new();
    exo_event_list l = {0};
    /* a State with every kind of thing in it */
    for (int k = 0; k < EXO_EVENT__COUNT; k++) {
        if (k == EXO_EVENT_NODE_TIMED_OUT || k == EXO_EVENT_TASK_DELETED || k == EXO_EVENT_INSTANCE_DELETED ||
            k == EXO_EVENT_RUNNER_DELETED || k == EXO_EVENT_TOPOLOGY_EDGE_DELETED)
            continue;
        for (int v = 0; v < 4; v++) {
            exo_event *ev = exo_event_list_add(&l, (exo_event_kind)k);
            exo_event_clear(ev);
            fx_event(ev, (exo_event_kind)k, v + 1);
        }
    }
    apply_all(st, &l);
    exo_event_list_clear(&l);
    cr_assert_gt(exo_state_edge_count(st), 0);

    exo_event_list snap = {0};
    exo_state_to_events(st, &snap);
    exo_state *again = exo_state_new();
    apply_all(again, &snap);
    char *a = dump_without_idx(st), *b = dump_without_idx(again);
    cr_assert_str_eq(a, b, "the fold of the snapshot is the State");
    /* and the snapshot survives the wire */
    for (size_t i = 0; i < snap.n; i++) {
        uint8_t *buf;
        size_t len;
        exo_event back;
        cr_assert_eq(exo_event_encode(&snap.v[i], &buf, &len, NULL), 0);
        cr_assert_eq(exo_event_decode(buf, len, &back, NULL), 0);
        cr_assert(exo_event_equal(&back, &snap.v[i]));
        exo_event_clear(&back);
        exo_free(buf);
    }
    free(a);
    free(b);
    exo_event_list_clear(&snap);
    exo_state_free(again);
    exo_state_free(st);
}

Test(replication, topology_edges_fold)
{
    exo_state *st = exo_state_new();
    exo_event ev;
    fx_event(&ev, EXO_EVENT_TOPOLOGY_EDGE_CREATED, 1);
    cr_assert_eq(exo_state_apply(st, 0, &ev, NULL), 0);
    ev.u.topology_edge_created.edge.latency_us = 999;
    cr_assert_eq(exo_state_apply(st, 1, &ev, NULL), 0);
    cr_assert_eq(exo_state_edge_count(st), 1, "same source, sink, address: replaced");
    cr_assert_eq(exo_state_edge_at(st, 0)->latency_us, 999);
    exo_event_clear(&ev);
    fx_event(&ev, EXO_EVENT_TOPOLOGY_EDGE_CREATED, 1);
    ev.u.topology_edge_created.edge.sink = ev.u.topology_edge_created.edge.source;
    cr_assert_eq(exo_state_apply(st, 2, &ev, NULL), EXO_EINVAL, "no edge from a node to itself");
    exo_event_clear(&ev);
    fx_event(&ev, EXO_EVENT_NODE_GATHERED_INFO, 2); /* node-2, the edge's sink */
    cr_assert_eq(exo_state_apply(st, 2, &ev, NULL), 0);
    exo_event_clear(&ev);
    exo_event_init(&ev, EXO_EVENT_NODE_TIMED_OUT);
    exo_id_set(&ev.u.node_timed_out.node_id, "node-2", NULL);
    cr_assert_eq(exo_state_apply(st, 3, &ev, NULL), 0);
    cr_assert_eq(exo_state_edge_count(st), 0, "a node that timed out takes its edges along");
    cr_assert_eq(exo_state_node_count(st), 0);
    exo_event_clear(&ev);
    exo_state_free(st);
}
