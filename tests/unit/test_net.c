/* The TCP transport on loopback, all nodes on one libuv loop (a second,
 * unrun loop plays a node that stopped answering): connecting, messages,
 * duplicate links, self and unexpected dials, wrong psk, peer_down causes,
 * back-pressure, handshake timeout and the pending-handshake cap,
 * reconnection of persistent dials, and probes. Ports are ephemeral;
 * waits allow seconds. */
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "net/net.h"

#include <criterion/criterion.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PEERS 8

typedef struct node {
    exo_net     *net;
    exo_identity id;
    uint16_t     port;
    int          ups, downs;
    char         up_ids[MAX_PEERS][EXO_NODE_ID_LEN + 1];
    int          n_up;                  /* peers currently up, per our callbacks */
    char         last_remote[EXO_NET_ADDR_LEN];
    char         last_down_id[EXO_NODE_ID_LEN + 1];
    char         last_down[EXO_NET_REASON_LEN];
    int          msgs;
    uint8_t      last_type;
    size_t       last_len;
    uint8_t     *last_payload;
    char         last_from[EXO_NODE_ID_LEN + 1];
    uint32_t     seq_next;              /* expected next sequence number (in-order check) */
    bool         seq_broken;
} node;

static uv_loop_t loop;
static const uint8_t PSK1[32] = {7, 7, 7};
static const uint8_t PSK2[32] = {7, 7, 8};

static bool is_up(node *x, const char *id)
{
    for (int i = 0; i < x->n_up; i++)
        if (strcmp(x->up_ids[i], id) == 0)
            return true;
    return false;
}

static void on_up(void *ctx, const char *id, const char *remote)
{
    node *x = ctx;
    cr_assert_not(is_up(x, id), "peer_up twice for %s", id);
    cr_assert_lt(x->n_up, MAX_PEERS);
    snprintf(x->up_ids[x->n_up++], EXO_NODE_ID_LEN + 1, "%s", id);
    snprintf(x->last_remote, sizeof x->last_remote, "%s", remote);
    x->ups++;
}

static void on_down(void *ctx, const char *id, const char *reason)
{
    node *x = ctx;
    cr_assert(is_up(x, id), "peer_down for %s which is not up", id);
    for (int i = 0; i < x->n_up; i++)
        if (strcmp(x->up_ids[i], id) == 0) {
            memmove(x->up_ids[i], x->up_ids[x->n_up - 1], EXO_NODE_ID_LEN + 1);
            x->n_up--;
            break;
        }
    snprintf(x->last_down_id, sizeof x->last_down_id, "%s", id);
    snprintf(x->last_down, sizeof x->last_down, "%s", reason);
    x->downs++;
}

static void on_msg(void *ctx, const char *id, uint8_t type, const uint8_t *p, size_t len)
{
    node *x = ctx;
    cr_assert(is_up(x, id), "message from %s before its peer_up", id);
    cr_assert(type >= 1 && type <= EXO_NET_TYPE_APP_MAX);
    x->msgs++;
    x->last_type = type;
    x->last_len = len;
    exo_free(x->last_payload);
    x->last_payload = exo_malloc(len ? len : 1);
    if (len)
        memcpy(x->last_payload, p, len);
    snprintf(x->last_from, sizeof x->last_from, "%s", id);
    if (type == 9 && len >= 4) { /* sequence-numbered stream */
        uint32_t s;
        memcpy(&s, p, 4);
        if (s != x->seq_next)
            x->seq_broken = true;
        x->seq_next = s + 1;
    }
}

static exo_identity identity_from(uint8_t seed_byte)
{
    exo_identity id;
    uint8_t seed[32];
    memset(seed, seed_byte, sizeof seed);
    crypto_sign_seed_keypair(id.pk, id.sk, seed);
    exo_identity_node_id_of(id.pk, id.node_id);
    return id;
}

static exo_net_config base_config(node *x, const uint8_t *psk)
{
    exo_net_config c = {0};
    c.identity = &x->id;
    c.psk = psk;
    c.listen_host = "127.0.0.1";
    c.ping_interval_ms = 100;
    c.peer_timeout_ms = 5000;
    c.handshake_timeout_ms = 4000;
    return c;
}

static void node_start_cfg(node *x, uv_loop_t *lp, const exo_net_config *cfg)
{
    exo_net_callbacks cbs = {on_up, on_down, on_msg, x};
    exo_err err = {0};
    cr_assert_eq(exo_net_new(lp, cfg, &cbs, &x->net, &err), 0, "%s", err.msg);
    x->port = exo_net_port(x->net);
    cr_assert_gt(x->port, 0);
}

static void node_start(node *x, uint8_t seed, const uint8_t *psk)
{
    memset(x, 0, sizeof *x);
    x->id = identity_from(seed);
    exo_net_config c = base_config(x, psk);
    node_start_cfg(x, &loop, &c);
}

static struct sockaddr_in addr_of(uint16_t port)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    return a;
}

static void dial(node *from, node *to, const char *expected, bool persistent)
{
    struct sockaddr_in a = addr_of(to->port);
    exo_err err = {0};
    int rc = exo_net_dial(from->net, (struct sockaddr *)&a, expected, persistent, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
}

typedef bool (*pred_fn)(void *ctx);

static bool run_until(uv_loop_t *lp, pred_fn pred, void *ctx, double timeout_s)
{
    double end = exo_clock_seconds() + timeout_s;
    while (!pred(ctx)) {
        if (exo_clock_seconds() > end)
            return false;
        uv_run(lp, UV_RUN_ONCE);
    }
    return true;
}

static bool never(void *ctx)
{
    (void)ctx;
    return false;
}

static void run_for(double s) { run_until(&loop, never, NULL, s); }

typedef struct pair {
    node *a, *b;
} pair;

static bool both_up(void *ctx)
{
    pair *p = ctx;
    return exo_net_connected(p->a->net, p->b->id.node_id) && exo_net_connected(p->b->net, p->a->id.node_id) &&
           p->a->ups > 0 && p->b->ups > 0;
}

static void connect_pair(node *a, node *b)
{
    dial(a, b, b->id.node_id, false);
    pair p = {a, b};
    cr_assert(run_until(&loop, both_up, &p, 10), "no connection between %s and %s", a->id.node_id,
              b->id.node_id);
}

static void node_stop(node *x)
{
    if (x->net)
        exo_net_close(x->net);
}

static void node_free(node *x)
{
    exo_net_free(x->net);
    x->net = NULL;
    exo_free(x->last_payload);
    x->last_payload = NULL;
}

/* Closes every node, lets the loop finish their handles, frees them; the
 * loop must then close cleanly (no handle left behind). */
static void finish(node **nodes, int n)
{
    for (int i = 0; i < n; i++)
        node_stop(nodes[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    for (int i = 0; i < n; i++)
        node_free(nodes[i]);
    cr_assert_eq(uv_loop_close(&loop), 0, "handles left open");
}

static void setup(void)
{
    if (getenv("EXO_TEST_NET_DEBUG"))
        exo_log_set_level(EXO_LOG_DEBUG);
    cr_assert_geq(sodium_init(), 0);
    cr_assert_eq(uv_loop_init(&loop), 0);
}

static void send_ok(node *from, node *to, uint8_t type, const void *p, size_t n)
{
    exo_err err = {0};
    cr_assert_eq(exo_net_send(from->net, to->id.node_id, type, p, n, &err), 0, "%s", err.msg);
}

typedef struct want_msgs {
    node *x;
    int   n;
} want_msgs;

static bool got_msgs(void *ctx)
{
    want_msgs *w = ctx;
    return w->x->msgs >= w->n;
}

static void wait_msgs(node *x, int n)
{
    want_msgs w = {x, n};
    cr_assert(run_until(&loop, got_msgs, &w, 10), "only %d of %d messages arrived", x->msgs, n);
}

Test(net, two_nodes_exchange_messages, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    connect_pair(&a, &b);
    cr_assert_eq(a.ups, 1);
    cr_assert_eq(b.ups, 1);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1:%u", b.port);
    cr_assert_str_eq(a.last_remote, want);
    cr_assert_not_null(strstr(b.last_remote, "127.0.0.1:"));

    send_ok(&a, &b, 1, "ping from a", 11);
    wait_msgs(&b, 1);
    cr_assert_eq(b.last_type, 1);
    cr_assert_eq(b.last_len, 11);
    cr_assert_eq(memcmp(b.last_payload, "ping from a", 11), 0);
    cr_assert_str_eq(b.last_from, a.id.node_id);

    send_ok(&b, &a, EXO_NET_TYPE_APP_MAX, NULL, 0);
    wait_msgs(&a, 1);
    cr_assert_eq(a.last_type, EXO_NET_TYPE_APP_MAX);
    cr_assert_eq(a.last_len, 0);

    /* a large message and an ordered stream */
    size_t big = (size_t)3 << 20;
    uint8_t *buf = exo_malloc(big);
    randombytes_buf(buf, big);
    send_ok(&a, &b, 2, buf, big);
    wait_msgs(&b, 2);
    cr_assert_eq(b.last_len, big);
    cr_assert_eq(memcmp(b.last_payload, buf, big), 0);
    exo_free(buf);
    for (uint32_t s = 0; s < 500; s++) {
        uint8_t m[200];
        memset(m, (int)s, sizeof m);
        memcpy(m, &s, 4);
        send_ok(&a, &b, 9, m, sizeof m);
    }
    wait_msgs(&b, 502);
    cr_assert_not(b.seq_broken, "messages arrived out of order");

    /* RTT from the pings */
    run_for(0.5);
    cr_assert_gt(exo_net_peer_rtt_us(a.net, b.id.node_id), 0);
    cr_assert_eq(exo_net_peer_rtt_us(a.net, "00000000000000000000000000000000"), -1);
    exo_net_peer_info info[4];
    cr_assert_eq(exo_net_peers(a.net, info, 4), 1);
    cr_assert_str_eq(info[0].id, b.id.node_id);
    cr_assert(info[0].dialed);
    cr_assert_eq(exo_net_peers(b.net, info, 4), 1);
    cr_assert_not(info[0].dialed);

    exo_err err = {0};
    cr_assert_eq(exo_net_send(a.net, "00000000000000000000000000000000", 1, "x", 1, &err), EXO_ENOENT);
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, 0, "x", 1, &err), EXO_EINVAL);
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, EXO_NET_T_PING, "x", 1, &err), EXO_EINVAL);
    cr_assert_eq(a.downs + b.downs, 0);
    node *all[] = {&a, &b};
    finish(all, 2);
}

Test(net, three_nodes_and_broadcast, .init = setup, .timeout = 60)
{
    node a, b, c;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    node_start(&c, 3, PSK1);
    connect_pair(&a, &b);
    connect_pair(&c, &b);
    connect_pair(&a, &c);
    cr_assert_eq(a.ups, 2);
    cr_assert_eq(b.ups, 2);
    cr_assert_eq(c.ups, 2);
    cr_assert_eq(exo_net_broadcast(b.net, 5, "all", 3), 2);
    wait_msgs(&a, 1);
    wait_msgs(&c, 1);
    cr_assert_str_eq(a.last_from, b.id.node_id);
    cr_assert_str_eq(c.last_from, b.id.node_id);
    send_ok(&c, &a, 6, "c->a", 4);
    wait_msgs(&a, 2);
    cr_assert_str_eq(a.last_from, c.id.node_id);
    node *all[] = {&a, &b, &c};
    finish(all, 3);
}

typedef struct settled {
    node *a, *b;
} settled;

static bool one_link_each(void *ctx)
{
    settled *s = ctx;
    exo_net_stats sa, sb;
    exo_net_stats_get(s->a->net, &sa);
    exo_net_stats_get(s->b->net, &sb);
    return sa.links == 1 && sb.links == 1 && sa.links_up == 1 && sb.links_up == 1;
}

Test(net, simultaneous_dials_keep_one_link, .init = setup, .timeout = 120)
{
    for (int round = 0; round < 8; round++) {
        node a, b;
        node_start(&a, (uint8_t)(10 + 2 * round), PSK1);
        node_start(&b, (uint8_t)(11 + 2 * round), PSK1);
        /* both at once (a bootstrap dial without id on odd rounds) */
        dial(&a, &b, round % 2 ? NULL : b.id.node_id, false);
        dial(&b, &a, a.id.node_id, false);
        pair p = {&a, &b};
        cr_assert(run_until(&loop, both_up, &p, 10), "round %d: not connected", round);
        settled s = {&a, &b};
        cr_assert(run_until(&loop, one_link_each, &s, 10), "round %d: duplicate links not resolved", round);
        run_for(0.3);
        cr_assert_eq(a.ups, 1, "round %d", round);
        cr_assert_eq(b.ups, 1, "round %d", round);
        cr_assert_eq(a.downs + b.downs, 0, "round %d: flap (%s)", round, a.downs ? a.last_down : b.last_down);
        send_ok(&a, &b, 1, "x", 1);
        send_ok(&b, &a, 1, "y", 1);
        wait_msgs(&a, 1);
        wait_msgs(&b, 1);
        node *all[] = {&a, &b};
        finish(all, 2);
        cr_assert_eq(uv_loop_init(&loop), 0);
    }
}

static bool ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 a;
    uv_ip6_addr("::1", 0, &a);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

Test(net, two_links_from_one_dialer_keep_one, .init = setup, .timeout = 120)
{
    if (!ipv6_loopback())
        cr_skip_test("no IPv6 loopback");
    for (int round = 0; round < 6; round++) {
        node a, b;
        node_start(&a, (uint8_t)(40 + round), PSK1);
        memset(&b, 0, sizeof b);
        b.id = identity_from((uint8_t)(60 + round));
        exo_net_config cb = base_config(&b, PSK1);
        cb.listen_host = NULL; /* dual stack */
        node_start_cfg(&b, &loop, &cb);
        struct sockaddr_in v4 = addr_of(b.port);
        struct sockaddr_in6 v6;
        uv_ip6_addr("::1", b.port, &v6);
        exo_err err = {0};
        /* the same node behind two addresses: two links, both dialed by a,
         * so the session id decides; the persistent one must not churn */
        cr_assert_eq(exo_net_dial(a.net, (struct sockaddr *)&v4, NULL, round % 2, &err), 0, "%s", err.msg);
        cr_assert_eq(exo_net_dial(a.net, (struct sockaddr *)&v6, NULL, true, &err), 0, "%s", err.msg);
        pair p = {&a, &b};
        cr_assert(run_until(&loop, both_up, &p, 10), "round %d: not connected", round);
        settled s = {&a, &b};
        cr_assert(run_until(&loop, one_link_each, &s, 10), "round %d: duplicate links not resolved", round);
        run_for(1.5); /* several retry periods of the persistent dial */
        cr_assert(one_link_each(&s), "round %d: links churn", round);
        cr_assert_eq(a.ups, 1, "round %d", round);
        cr_assert_eq(b.ups, 1, "round %d", round);
        cr_assert_eq(a.downs + b.downs, 0, "round %d: flap (%s)", round, a.downs ? a.last_down : b.last_down);
        node *all[] = {&a, &b};
        finish(all, 2);
        cr_assert_eq(uv_loop_init(&loop), 0);
    }
}

static bool dials_gone(void *ctx)
{
    node *x = ctx;
    exo_net_stats s;
    exo_net_stats_get(x->net, &s);
    return s.dials == 0 && s.links == 0;
}

Test(net, self_dial_is_rejected_and_not_retried, .init = setup, .timeout = 60)
{
    node a;
    node_start(&a, 1, PSK1);
    exo_err err = {0};
    struct sockaddr_in self = addr_of(a.port);
    cr_assert_eq(exo_net_dial(a.net, (struct sockaddr *)&self, a.id.node_id, false, &err), EXO_EINVAL);
    dial(&a, &a, NULL, true);
    cr_assert(run_until(&loop, dials_gone, &a, 10), "self dial still retried");
    cr_assert_eq(a.ups, 0);
    node *all[] = {&a};
    finish(all, 1);
}

Test(net, unexpected_peer_is_rejected_on_both_sides, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    exo_identity other = identity_from(3);
    dial(&a, &b, other.node_id, false);
    cr_assert(run_until(&loop, dials_gone, &a, 10));
    run_for(0.3);
    cr_assert_eq(a.ups, 0);
    cr_assert_eq(b.ups, 0, "the responder must not accept a dialer that rejected it");
    node *all[] = {&a, &b};
    finish(all, 2);
}

Test(net, wrong_psk_never_connects, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK2);
    dial(&a, &b, NULL, false);
    dial(&b, &a, NULL, false);
    cr_assert(run_until(&loop, dials_gone, &a, 10));
    cr_assert(run_until(&loop, dials_gone, &b, 10));
    run_for(0.3);
    cr_assert_eq(a.ups + b.ups, 0);
    cr_assert_eq(a.msgs + b.msgs, 0);
    exo_net_stats s;
    exo_net_stats_get(b.net, &s);
    cr_assert_eq(s.handshaking_in, 0);
    node *all[] = {&a, &b};
    finish(all, 2);
}

static bool downs_at_least(void *ctx)
{
    want_msgs *w = ctx; /* reused: x and a count */
    return w->x->downs >= w->n;
}

static void wait_downs(node *x, int n, double s)
{
    want_msgs w = {x, n};
    cr_assert(run_until(&loop, downs_at_least, &w, s), "peer_down not reported");
}

Test(net, peer_down_on_disconnect_and_close, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    connect_pair(&a, &b);
    cr_assert_eq(exo_net_disconnect(b.net, a.id.node_id, "testing"), 0);
    cr_assert_eq(exo_net_disconnect(b.net, a.id.node_id, "again"), EXO_ENOENT);
    wait_downs(&a, 1, 10);
    wait_downs(&b, 1, 10);
    cr_assert_str_eq(a.last_down, "closed by peer: testing");
    cr_assert_str_eq(b.last_down, "testing");
    cr_assert_str_eq(a.last_down_id, b.id.node_id);
    cr_assert_not(exo_net_connected(a.net, b.id.node_id));

    connect_pair(&a, &b);
    cr_assert_eq(a.ups, 2);
    exo_net_close(b.net);
    wait_downs(&a, 2, 10);
    cr_assert_not_null(strstr(a.last_down, "shutting down"), "%s", a.last_down);
    cr_assert_eq(b.downs, 1, "no callbacks after exo_net_close");
    node *all[] = {&a, &b};
    finish(all, 2);
}

Test(net, peer_down_when_the_peer_stops_answering, .init = setup, .timeout = 60)
{
    uv_loop_t loop2;
    cr_assert_eq(uv_loop_init(&loop2), 0);
    node a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.id = identity_from(1);
    b.id = identity_from(2);
    exo_net_config ca = base_config(&a, PSK1), cb = base_config(&b, PSK1);
    ca.peer_timeout_ms = 800;
    node_start_cfg(&a, &loop, &ca);
    node_start_cfg(&b, &loop2, &cb);
    dial(&a, &b, b.id.node_id, false);
    double end = exo_clock_seconds() + 10;
    while (!(a.ups && b.ups) && exo_clock_seconds() < end) {
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_run(&loop2, UV_RUN_NOWAIT);
    }
    cr_assert(a.ups && b.ups);
    /* b's loop no longer runs: it reads nothing and answers nothing */
    double t0 = exo_clock_seconds();
    wait_downs(&a, 1, 10);
    cr_assert_geq(exo_clock_seconds() - t0, 0.5, "timed out too early");
    cr_assert_not_null(strstr(a.last_down, "timed out"), "%s", a.last_down);
    node_stop(&b);
    uv_run(&loop2, UV_RUN_DEFAULT);
    node_free(&b);
    cr_assert_eq(uv_loop_close(&loop2), 0);
    node *all[] = {&a};
    finish(all, 1);
}

static bool queue_empty(void *ctx)
{
    pair *p = ctx;
    exo_net_peer_info i;
    return exo_net_peers(p->a->net, &i, 1) == 1 && i.queued_bytes == 0;
}

Test(net, send_queue_limit_gives_ebusy, .init = setup, .timeout = 60)
{
    node a, b;
    memset(&a, 0, sizeof a);
    a.id = identity_from(1);
    exo_net_config ca = base_config(&a, PSK1);
    ca.send_queue_max = (size_t)1 << 20;
    node_start_cfg(&a, &loop, &ca);
    node_start(&b, 2, PSK1);
    connect_pair(&a, &b);
    size_t chunk = 600 << 10;
    uint8_t *buf = exo_calloc(1, chunk);
    exo_err err = {0};
    /* The loop does not run between these: the first is still in flight. */
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, 1, buf, chunk, &err), 0, "%s", err.msg);
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, 1, buf, chunk, &err), EXO_EBUSY);
    cr_assert_not_null(strstr(err.msg, "full"));
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, 1, buf, ca.send_queue_max, &err), EXO_EBUSY);
    exo_net_peer_info info;
    cr_assert_eq(exo_net_peers(a.net, &info, 1), 1);
    cr_assert_leq(info.queued_bytes, ca.send_queue_max);
    pair p = {&a, &b};
    cr_assert(run_until(&loop, queue_empty, &p, 10));
    cr_assert_eq(exo_net_send(a.net, b.id.node_id, 1, buf, chunk, &err), 0, "%s", err.msg);
    wait_msgs(&b, 2);
    cr_assert_eq(b.last_len, chunk);
    exo_free(buf);
    node *all[] = {&a, &b};
    finish(all, 2);
}

/* ---- raw TCP clients ---- */

typedef struct raw {
    uv_tcp_t     tcp;
    uv_connect_t req;
    size_t       got;
    bool         connected, eof, closed;
    double       t_start, t_eof;
} raw;

static void raw_alloc(uv_handle_t *h, size_t s, uv_buf_t *b)
{
    static char buf[4096];
    (void)h;
    (void)s;
    *b = uv_buf_init(buf, sizeof buf);
}

static void raw_closed(uv_handle_t *h)
{
    raw *r = h->data;
    r->closed = true;
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    raw *r = s->data;
    (void)b;
    if (n > 0)
        r->got += (size_t)n;
    if (n < 0 && !r->eof) {
        r->eof = true;
        r->t_eof = exo_clock_seconds();
        uv_close((uv_handle_t *)&r->tcp, raw_closed);
    }
}

static void raw_connected(uv_connect_t *req, int status)
{
    raw *r = req->data;
    cr_assert_eq(status, 0);
    r->connected = true;
    uv_read_start((uv_stream_t *)&r->tcp, raw_alloc, raw_read);
}

static void raw_open(raw *r, uint16_t port)
{
    memset(r, 0, sizeof *r);
    uv_tcp_init(&loop, &r->tcp);
    r->tcp.data = r;
    r->req.data = r;
    r->t_start = exo_clock_seconds();
    struct sockaddr_in a = addr_of(port);
    cr_assert_eq(uv_tcp_connect(&r->req, &r->tcp, (struct sockaddr *)&a, raw_connected), 0);
}

static bool raws_done(void *ctx)
{
    raw *r = ctx;
    return r[0].eof && r[1].eof && r[2].eof;
}

static bool one_raw_closed(void *ctx)
{
    raw *r = ctx;
    return r[0].eof || r[1].eof || r[2].eof;
}

Test(net, silent_clients_time_out_and_pending_cap_holds, .init = setup, .timeout = 60)
{
    node b;
    memset(&b, 0, sizeof b);
    b.id = identity_from(2);
    exo_net_config cb = base_config(&b, PSK1);
    cb.handshake_timeout_ms = 1500;
    cb.max_pending_handshakes = 2;
    node_start_cfg(&b, &loop, &cb);
    raw r[3];
    for (int i = 0; i < 3; i++)
        raw_open(&r[i], b.port);
    /* One of the three is over the cap: closed at once, before any HELLO. */
    cr_assert(run_until(&loop, one_raw_closed, r, 10));
    int early = r[0].eof ? 0 : r[1].eof ? 1 : 2;
    cr_assert_eq(r[early].got, 0, "the refused connection got %zu bytes", r[early].got);
    exo_net_stats s;
    exo_net_stats_get(b.net, &s);
    cr_assert_eq(s.handshaking_in, 2);
    cr_assert(run_until(&loop, raws_done, r, 15));
    for (int i = 0; i < 3; i++) {
        if (i == early)
            continue;
        cr_assert_eq(r[i].got, EXO_SC_HELLO_LEN, "client %d got %zu bytes", i, r[i].got);
        cr_assert_geq(r[i].t_eof - r[i].t_start, 1.4, "client %d closed after %.3f s", i,
                      r[i].t_eof - r[i].t_start);
        cr_assert_lt(r[early].t_eof, r[i].t_eof);
    }
    exo_net_stats_get(b.net, &s);
    cr_assert_eq(s.handshaking_in, 0);
    /* and a real node still gets in afterwards */
    node a;
    node_start(&a, 1, PSK1);
    connect_pair(&a, &b);
    node *all[] = {&a, &b};
    for (int i = 0; i < 3; i++)
        cr_assert(r[i].closed || r[i].eof);
    finish(all, 2);
}

Test(net, persistent_dial_reconnects_after_restart, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    dial(&a, &b, NULL, true);
    pair p = {&a, &b};
    cr_assert(run_until(&loop, both_up, &p, 10));
    uint16_t port = b.port;
    exo_net_close(b.net);
    wait_downs(&a, 1, 10);
    run_for(0.2);
    exo_net_free(b.net);
    /* b comes back on the same port with the same identity, a little later */
    run_for(1.0);
    exo_identity bid = b.id;
    memset(&b, 0, sizeof b);
    b.id = bid;
    exo_net_config cb = base_config(&b, PSK1);
    cb.listen_port = port;
    node_start_cfg(&b, &loop, &cb);
    cr_assert(run_until(&loop, both_up, &p, 15), "persistent dial did not reconnect");
    cr_assert_eq(a.ups, 2);
    exo_net_stats s;
    exo_net_stats_get(a.net, &s);
    cr_assert_eq(s.dials, 1, "the persistent dial stays");
    node *all[] = {&a, &b};
    finish(all, 2);
}

typedef struct probe_out {
    int                  calls;
    exo_net_probe_result res;
} probe_out;

static void on_probe(void *ctx, const exo_net_probe_result *r)
{
    probe_out *o = ctx;
    o->calls++;
    o->res = *r;
}

static bool probe_done(void *ctx) { return ((probe_out *)ctx)->calls > 0; }

Test(net, probe_measures_and_checks_identity, .init = setup, .timeout = 60)
{
    node a, b;
    node_start(&a, 1, PSK1);
    node_start(&b, 2, PSK1);
    struct sockaddr_in addr = addr_of(b.port);
    exo_err err = {0};
    probe_out ok = {0};
    int rc = exo_net_probe(a.net, (struct sockaddr *)&addr, b.id.node_id, (uint64_t)10 << 20, on_probe, &ok,
                           &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert(run_until(&loop, probe_done, &ok, 15));
    cr_assert(ok.res.ok, "%s", ok.res.error);
    cr_assert_str_eq(ok.res.peer_id, b.id.node_id);
    cr_assert_gt(ok.res.rtt_us, 0);
    cr_assert_gt(ok.res.bandwidth_bps, 0);
    cr_assert_eq(ok.res.bulk_bytes, (uint64_t)10 << 20);
    cr_assert_eq(a.ups + b.ups, 0, "a probe is not a peer");

    probe_out none = {0};
    cr_assert_eq(exo_net_probe(a.net, (struct sockaddr *)&addr, b.id.node_id, 0, on_probe, &none, &err), 0);
    cr_assert(run_until(&loop, probe_done, &none, 15));
    cr_assert(none.res.ok, "%s", none.res.error);
    cr_assert_eq(none.res.bandwidth_bps, 0);

    probe_out wrong = {0};
    exo_identity other = identity_from(3);
    rc = exo_net_probe(a.net, (struct sockaddr *)&addr, other.node_id, 1 << 20, on_probe, &wrong, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert(run_until(&loop, probe_done, &wrong, 15));
    cr_assert_not(wrong.res.ok);
    cr_assert_not_null(strstr(wrong.res.error, "unexpected peer"), "%s", wrong.res.error);

    /* nobody listening */
    node c;
    node_start(&c, 3, PSK1);
    struct sockaddr_in gone = addr_of(c.port);
    node *cc[] = {&c};
    node_stop(&c);
    run_for(0.2);
    probe_out refused = {0};
    cr_assert_eq(exo_net_probe(a.net, (struct sockaddr *)&gone, NULL, 0, on_probe, &refused, &err), 0);
    cr_assert(run_until(&loop, probe_done, &refused, 15));
    cr_assert_not(refused.res.ok);
    cr_assert(refused.res.error[0]);
    (void)cc;
    node_free(&c);

    run_for(0.3);
    cr_assert_eq(ok.calls + none.calls + wrong.calls + refused.calls, 4, "exactly one callback each");
    exo_net_stats s;
    exo_net_stats_get(b.net, &s);
    cr_assert_eq(s.probes_in, 0);
    exo_net_stats_get(a.net, &s);
    cr_assert_eq(s.probes_out, 0);

    /* a probe still running at close gets its callback inside exo_net_close */
    probe_out cut = {0};
    cr_assert_eq(exo_net_probe(a.net, (struct sockaddr *)&addr, NULL, 0, on_probe, &cut, &err), 0);
    exo_net_close(a.net);
    cr_assert_eq(cut.calls, 1);
    cr_assert_not(cut.res.ok);
    node *all[] = {&a, &b};
    finish(all, 2);
}

/* ---- a hand-driven peer: an exo_sc over a raw libuv TCP connection ---- */

typedef struct fake {
    uv_tcp_t     tcp;
    uv_connect_t req;
    exo_sc      *sc;
    exo_identity id;
    bool         established, eof, closed;
    int          frames;
} fake;

typedef struct fake_write {
    uv_write_t req;
    uint8_t   *buf;
} fake_write;

static void fake_written(uv_write_t *req, int status)
{
    fake_write *w = (fake_write *)req;
    (void)status;
    exo_free(w->buf);
    exo_free(w);
}

static void fake_flush(fake *f)
{
    size_t len;
    uint8_t *p;
    while ((p = exo_sc_out_take(f->sc, &len))) {
        fake_write *w = exo_malloc(sizeof *w);
        w->buf = p;
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)len);
        cr_assert_eq(uv_write(&w->req, (uv_stream_t *)&f->tcp, &b, 1, fake_written), 0);
    }
}

static int fake_on_est(void *ctx, exo_sc *sc)
{
    (void)sc;
    ((fake *)ctx)->established = true;
    return 0;
}

static int fake_on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *p, size_t len)
{
    fake *f = ctx;
    f->frames++;
    if (type == EXO_NET_T_PING) /* answer like a node, to stay alive */
        exo_sc_send(sc, EXO_NET_T_PONG, p, len, NULL);
    return 0;
}

static void fake_closed(uv_handle_t *h) { ((fake *)h->data)->closed = true; }

static void fake_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    fake *f = s->data;
    static const exo_sc_handlers hd = {fake_on_est, fake_on_frame};
    if (n > 0) {
        exo_err err = {0};
        if (exo_sc_recv(f->sc, (const uint8_t *)b->base, (size_t)n, &hd, f, &err) == 0)
            fake_flush(f);
    } else if (n < 0 && !f->eof) {
        f->eof = true;
        uv_close((uv_handle_t *)&f->tcp, fake_closed);
    }
}

static void fake_connected(uv_connect_t *req, int status)
{
    fake *f = req->data;
    cr_assert_eq(status, 0);
    uv_read_start((uv_stream_t *)&f->tcp, raw_alloc, fake_read);
    fake_flush(f);
}

static void fake_open(fake *f, uint8_t seed, const uint8_t *psk, uint16_t port)
{
    memset(f, 0, sizeof *f);
    f->id = identity_from(seed);
    exo_err err = {0};
    cr_assert_eq(exo_sc_new(&f->id, psk, true, 0, &f->sc, &err), 0);
    uv_tcp_init(&loop, &f->tcp);
    f->tcp.data = f;
    f->req.data = f;
    struct sockaddr_in a = addr_of(port);
    cr_assert_eq(uv_tcp_connect(&f->req, &f->tcp, (struct sockaddr *)&a, fake_connected), 0);
}

static void fake_send(fake *f, uint8_t type, const void *p, size_t len)
{
    exo_err err = {0};
    cr_assert_eq(exo_sc_send(f->sc, type, p, len, &err), 0, "%s", err.msg);
    fake_flush(f);
}

static void fake_shut(fake *f)
{
    if (!f->eof) {
        f->eof = true;
        uv_close((uv_handle_t *)&f->tcp, fake_closed);
    }
}

static bool fake_done(void *ctx)
{
    return ((fake *)ctx)->closed;
}

static void fake_free(fake *f)
{
    fake_shut(f);
    cr_assert(run_until(&loop, fake_done, f, 10));
    exo_sc_free(f->sc);
}

static bool both_up_one(void *ctx)
{
    return ((node *)ctx)->n_up == 1;
}

static bool fake_up(void *ctx)
{
    fake *f = ctx;
    return f->established;
}

Test(net, duplicate_close_waits_for_the_other_link, .init = setup, .timeout = 60)
{
    node b;
    memset(&b, 0, sizeof b);
    b.id = identity_from(2);
    exo_net_config cb = base_config(&b, PSK1);
    cb.handshake_timeout_ms = 1500; /* how long a "duplicate" close waits for the other link */
    node_start_cfg(&b, &loop, &cb);

    fake f1, f2;
    fake_open(&f1, 9, PSK1, b.port);
    cr_assert(run_until(&loop, fake_up, &f1, 10));
    cr_assert(run_until(&loop, both_up_one, &b, 10));
    cr_assert_eq(b.ups, 1);

    /* f1's node says this link lost a duplicate race: b waits */
    fake_send(&f1, EXO_NET_T_CLOSE, "duplicate", 9);
    run_for(0.5);
    cr_assert_eq(b.downs, 0, "peer_down before the linger ran out: %s", b.last_down);
    cr_assert_not(exo_net_connected(b.net, f1.id.node_id));

    /* the winning link arrives: no flap */
    fake_open(&f2, 9, PSK1, b.port);
    cr_assert(run_until(&loop, fake_up, &f2, 10));
    run_for(0.3);
    cr_assert(exo_net_connected(b.net, f2.id.node_id));
    fake_send(&f2, 3, "after", 5);
    wait_msgs(&b, 1);
    cr_assert_str_eq(b.last_from, f2.id.node_id);
    run_for(1.5);
    cr_assert_eq(b.ups, 1);
    cr_assert_eq(b.downs, 0);

    /* a transport type this version does not know is ignored; BULK outside
     * a probe connection is a protocol error */
    fake_send(&f2, 0xFE, "future", 6);
    run_for(0.2);
    cr_assert(exo_net_connected(b.net, f2.id.node_id));
    cr_assert_eq(b.msgs, 1);
    fake_send(&f2, EXO_NET_T_BULK, "x", 1);
    wait_downs(&b, 1, 10);
    cr_assert_not_null(strstr(b.last_down, "protocol error"), "%s", b.last_down);

    /* and with nobody coming back, a "duplicate" close ends in peer_down */
    fake f3;
    fake_open(&f3, 9, PSK1, b.port);
    cr_assert(run_until(&loop, fake_up, &f3, 10));
    cr_assert(run_until(&loop, both_up_one, &b, 10));
    fake_send(&f3, EXO_NET_T_CLOSE, "duplicate", 9);
    double t0 = exo_clock_seconds();
    wait_downs(&b, 2, 10);
    cr_assert_geq(exo_clock_seconds() - t0, 1.0);
    cr_assert_str_eq(b.last_down, "closed by peer: duplicate");
    cr_assert_eq(b.ups, 2);
    fake_free(&f1);
    fake_free(&f2);
    fake_free(&f3);
    node *all[] = {&b};
    finish(all, 1);
}
