/* TCP links on libuv (see net.h for the behaviour).
 *
 * Objects: links (one per TCP connection, any state), peers (one per
 * connected node id; points at the link in use), dials (what to connect to
 * and when to retry) and probes (a measurement on its own link). All live
 * in plain lists: a daemon has tens of links, not thousands.
 *
 * Lifetime rule that keeps callbacks safe: a link is never freed except in
 * its uv_close callback. link_close only marks it CLOSED and asks libuv to
 * close it, so any code holding a link pointer (a loop over the list, the
 * secure channel calling us back mid-buffer, a user callback that
 * disconnects someone) stays valid until control returns to the loop. Peers,
 * dials and probes are freed synchronously but are only reached through
 * pointers that the freeing code clears.
 *
 * User callbacks: peer_up, peer_down and probe results are queued (an event
 * list) and delivered at "safe points": the end of every libuv callback of
 * ours, just before a message is delivered (so peer_up comes first), and a
 * zero-delay timer for events caused by API calls. Messages are delivered
 * directly from the read callback. So no user code runs while our own
 * bookkeeping is half done.
 *
 * Time: one periodic tick timer checks every deadline (handshake, peer and
 * drain timeouts, pings, dial retries, probe and linger deadlines) against
 * exo_clock_ns; its period is a quarter of the shortest interval configured,
 * clamped to 5..100 ms.
 *
 * Reads use one 64 KiB buffer per exo_net: libuv calls alloc and read back
 * to back on this thread, and exo_sc_recv consumes everything before
 * returning. */
#include "net/net.h"

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/clock.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define DEF_PING_MS       500
#define DEF_PEER_TO_MS    3000
#define DEF_HS_TO_MS      5000
#define DEF_QUEUE_MAX     ((size_t)64 << 20)
#define DEF_PENDING_MAX   64
#define CTL_SLACK         ((size_t)64 << 10)
#define READ_BUF          ((size_t)64 << 10)
#define BACKOFF_MIN_MS    500
#define BACKOFF_MAX_MS    10000
#define PROBE_PINGS       5
#define PROBE_WINDOW      ((uint64_t)4 << 20)
#define STRANGER_WINDOW_NS (10ull * 1000000000ull)
#define STRANGER_PER_WINDOW 5
#define NS_PER_MS         1000000ull

typedef enum { LS_CONNECTING, LS_HANDSHAKE, LS_UP, LS_DRAINING, LS_CLOSED } link_state;

typedef struct net_link net_link;
typedef struct peer  peer;
typedef struct dial  dial;
typedef struct probe probe;

struct net_link {
    exo_net      *net;
    uv_tcp_t      tcp;
    uv_connect_t  connect_req;
    uv_shutdown_t shutdown_req;
    exo_sc       *sc;
    link_state    state;
    bool          inbound;
    bool          probe_in;        /* inbound probe connection, counted in probes_in */
    bool          counted_pending; /* counted in handshaking_in */
    bool          was_up;
    bool          remote_dup;      /* the peer closed it as "duplicate" */
    bool          reading;
    probe        *probe;           /* outbound probe running on this link */
    dial         *dial;            /* the dial that made it */
    peer         *peer;            /* the peer using it */
    char          remote[EXO_NET_ADDR_LEN];
    char          expected[EXO_NODE_ID_LEN + 1];
    char          peer_id[EXO_NODE_ID_LEN + 1];
    char          reason[EXO_NET_REASON_LEN]; /* why it is draining / closed */
    uint64_t      t_start, t_last_rx, t_last_ping, t_drain;
    int64_t       srtt_ns;         /* 0: no sample yet */
    size_t        inflight;        /* bytes handed to uv_write, not yet completed */
    uint64_t      bulk_rx;         /* probe responder: BULK bytes so far */
    net_link     *prev, *next;
};

struct peer {
    char     id[EXO_NODE_ID_LEN + 1];
    net_link *link;          /* NULL while lingering */
    bool     lingering;
    uint64_t linger_until;
    char     reason[EXO_NET_REASON_LEN];
    peer    *next;
};

struct dial {
    struct sockaddr_storage addr;
    char     addr_text[EXO_NET_ADDR_LEN];
    char     expected[EXO_NODE_ID_LEN + 1];
    char     learned[EXO_NODE_ID_LEN + 1]; /* who answered last time */
    bool     persistent;
    net_link *link;
    uint64_t next_attempt;
    uint32_t backoff_ms;
    char     last_error[EXO_NET_REASON_LEN];
    dial    *next;
};

typedef enum { PP_CONNECT, PP_PING, PP_BULK } probe_phase;

struct probe {
    net_link        *link;
    exo_net_probe_cb cb;
    void            *ctx;
    probe_phase      phase;
    uint64_t         bulk_bytes, sent, acked;
    int              pings;
    uint64_t         ping_sent, rtt_min_ns;
    uint64_t         deadline, bulk_start;
    uint8_t         *chunk;       /* EXO_NET_PROBE_CHUNK zero bytes */
    probe           *next;
};

typedef enum { EV_UP, EV_DOWN, EV_PROBE } ev_kind;

typedef struct event {
    struct event        *next;
    ev_kind              kind;
    char                 id[EXO_NODE_ID_LEN + 1];
    char                 text[EXO_NET_REASON_LEN];
    exo_net_probe_cb     cb;
    void                *ctx;
    exo_net_probe_result res;
} event;

typedef struct listener {
    uv_tcp_t tcp;
    exo_net *net;
} listener;

struct exo_net {
    uv_loop_t        *loop;
    exo_identity      id;
    uint8_t           psk[32];
    uint32_t          ping_ms, peer_to_ms, hs_to_ms, pending_max;
    size_t            queue_max;
    exo_net_callbacks cb;
    listener         *lst;
    uint16_t          port;
    uv_timer_t        tick, defer;
    int               open_handles;
    bool              closing, delivering, free_when_closed;
    net_link         *links;
    peer             *peers;
    dial             *dials;
    probe            *probes;
    event            *ev_head, *ev_tail;
    size_t            handshaking_in, probes_in, probes_out;
    uint8_t          *rbuf;
    bool              rbuf_busy;
    uint64_t          stranger_window;
    unsigned          stranger_logged, stranger_suppressed;
};

static uint64_t now_ns(void) { return exo_clock_ns(); }

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void addr_text(const struct sockaddr *sa, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%u", ip, ntohs(s4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], ip, sizeof ip);
            snprintf(out, cap, "%s:%u", ip, ntohs(s6->sin6_port));
        } else {
            inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof ip);
            snprintf(out, cap, "[%s]:%u", ip, ntohs(s6->sin6_port));
        }
    } else {
        snprintf(out, cap, "(unknown address family %d)", sa->sa_family);
    }
}

static size_t addr_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static bool addr_equal(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET) {
        const struct sockaddr_in *x = (const struct sockaddr_in *)a, *y = (const struct sockaddr_in *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)a, *y = (const struct sockaddr_in6 *)b;
    return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

/* A peer-supplied reason, made safe to log and pass on: printable ASCII. */
static void sanitize(char *dst, size_t cap, const uint8_t *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < cap; i++)
        dst[o++] = (src[i] >= 0x20 && src[i] < 0x7f) ? (char)src[i] : '?';
    dst[o] = 0;
}

/* ---- events ---- */

static void on_defer(uv_timer_t *t);

static event *event_push(exo_net *n, ev_kind kind, const char *id, const char *text)
{
    event *e = exo_calloc(1, sizeof *e);
    e->kind = kind;
    copy_str(e->id, sizeof e->id, id);
    copy_str(e->text, sizeof e->text, text);
    if (n->ev_tail)
        n->ev_tail->next = e;
    else
        n->ev_head = e;
    n->ev_tail = e;
    /* In case no libuv callback of ours is on the stack to deliver it. */
    if (!n->closing)
        uv_timer_start(&n->defer, on_defer, 0, 0);
    return e;
}

static void deliver(exo_net *n)
{
    if (n->delivering)
        return; /* the outer call keeps going */
    n->delivering = true;
    while (!n->closing && n->ev_head) {
        event *e = n->ev_head;
        n->ev_head = e->next;
        if (!n->ev_head)
            n->ev_tail = NULL;
        switch (e->kind) {
        case EV_UP:
            if (n->cb.peer_up)
                n->cb.peer_up(n->cb.ctx, e->id, e->text);
            break;
        case EV_DOWN:
            if (n->cb.peer_down)
                n->cb.peer_down(n->cb.ctx, e->id, e->text);
            break;
        case EV_PROBE:
            e->cb(e->ctx, &e->res);
            break;
        }
        exo_free(e);
    }
    n->delivering = false;
}

static void on_defer(uv_timer_t *t) { deliver(t->data); }

/* ---- logging of unauthenticated failures ---- */

static void log_stranger(exo_net *n, const char *remote, const char *reason)
{
    uint64_t now = now_ns();
    if (now - n->stranger_window >= STRANGER_WINDOW_NS) {
        if (n->stranger_suppressed)
            EXO_LOG_INFO("net: %u more failed handshakes from unauthenticated connections were not logged",
                         n->stranger_suppressed);
        n->stranger_window = now;
        n->stranger_logged = n->stranger_suppressed = 0;
    }
    if (n->stranger_logged < STRANGER_PER_WINDOW) {
        n->stranger_logged++;
        EXO_LOG_INFO("net: connection from %s rejected before authentication: %s", remote, reason);
    } else {
        n->stranger_suppressed++;
    }
}

/* ---- peers ---- */

static peer *peer_find(const exo_net *n, const char *id)
{
    if (!id)
        return NULL;
    for (peer *p = n->peers; p; p = p->next)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

static void peer_remove(exo_net *n, peer *p)
{
    for (peer **pp = &n->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    exo_free(p);
}

/* l stops being the peer's link. */
static void peer_detach(exo_net *n, net_link *l, const char *reason)
{
    peer *p = l->peer;
    if (!p)
        return;
    l->peer = NULL;
    p->link = NULL;
    if (n->closing) {
        peer_remove(n, p);
        return;
    }
    if (l->remote_dup) {
        /* The other end kept another link to us that we have not seen
         * established yet: give it time before reporting the peer gone. */
        p->lingering = true;
        p->linger_until = now_ns() + (uint64_t)n->hs_to_ms * NS_PER_MS;
        copy_str(p->reason, sizeof p->reason, reason);
        EXO_LOG_DEBUG("net: peer %s: link closed as duplicate by the peer, waiting for the other one", p->id);
        return;
    }
    EXO_LOG_INFO("net: peer %s down: %s", p->id, reason);
    event_push(n, EV_DOWN, p->id, reason);
    peer_remove(n, p);
}

/* ---- writing ---- */

typedef struct wreq {
    uv_write_t req;
    net_link  *l;
    uint8_t   *buf;
    size_t     len;
} wreq;

static void link_close(net_link *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void on_write(uv_write_t *req, int status)
{
    wreq *w = (wreq *)req;
    net_link *l = w->l;
    exo_net *n = l->net;
    l->inflight -= w->len;
    exo_free(w->buf);
    exo_free(w);
    if (status < 0 && l->state != LS_CLOSED)
        link_close(l, "write failed: %s", uv_strerror(status));
    deliver(n);
}

/* Hands everything the sc has queued to libuv. < 0 if the link failed. */
static int link_flush(net_link *l)
{
    if (l->state != LS_HANDSHAKE && l->state != LS_UP)
        return l->state == LS_CLOSED ? -1 : 0;
    size_t len;
    uint8_t *p;
    while ((p = exo_sc_out_take(l->sc, &len))) {
        wreq *w = exo_malloc(sizeof *w);
        w->l = l;
        w->buf = p;
        w->len = len;
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)len);
        int rc = uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, on_write);
        if (rc < 0) {
            exo_free(p);
            exo_free(w);
            link_close(l, "write failed: %s", uv_strerror(rc));
            return -1;
        }
        l->inflight += len;
    }
    return 0;
}

static size_t link_queued(const net_link *l) { return l->inflight + exo_sc_out_pending(l->sc); }

/* Transport control frame: allowed CTL_SLACK past send_queue_max. */
static int link_send_ctl(net_link *l, uint8_t type, const void *payload, size_t len)
{
    if (l->state != LS_UP)
        return -1;
    if (link_queued(l) + len + EXO_SC_FRAME_OVERHEAD > l->net->queue_max + CTL_SLACK) {
        link_close(l, "the peer is not reading (send queue over its limit)");
        return -1;
    }
    exo_err err = {0};
    if (exo_sc_send(l->sc, type, payload, len, &err) < 0) {
        link_close(l, "%s", err.msg);
        return -1;
    }
    return link_flush(l);
}

/* ---- closing ---- */

static void dial_link_closed(exo_net *n, dial *d, net_link *l);
static void probe_finish(exo_net *n, probe *pr, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void net_handle_gone(exo_net *n);

static void on_link_closed(uv_handle_t *h)
{
    net_link *l = h->data;
    exo_net *n = l->net;
    if (l->prev)
        l->prev->next = l->next;
    else
        n->links = l->next;
    if (l->next)
        l->next->prev = l->prev;
    exo_sc_free(l->sc);
    exo_free(l);
    net_handle_gone(n);
}

/* Common to draining and closing: l no longer serves a peer, probe or dial
 * and stops counting against the caps. */
static void link_release(net_link *l)
{
    exo_net *n = l->net;
    if (l->counted_pending) {
        l->counted_pending = false;
        n->handshaking_in--;
    }
    if (l->probe_in) {
        l->probe_in = false;
        n->probes_in--;
    }
    peer_detach(n, l, l->reason);
    if (l->probe) {
        probe *pr = l->probe;
        l->probe = NULL;
        pr->link = NULL;
        probe_finish(n, pr, false, "%s", l->reason);
    }
    if (l->dial) {
        dial *d = l->dial;
        l->dial = NULL;
        dial_link_closed(n, d, l);
    }
}

static void link_close(net_link *l, const char *fmt, ...)
{
    if (l->state == LS_CLOSED)
        return;
    exo_net *n = l->net;
    link_state was = l->state;
    if (was != LS_DRAINING) { /* a drained link keeps the reason it was drained for */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(l->reason, sizeof l->reason, fmt, ap);
        va_end(ap);
    }
    l->state = LS_CLOSED;
    if (!n->closing) {
        if (l->was_up) {
            if (was != LS_DRAINING)
                EXO_LOG_DEBUG("net: link %s (%s) closed: %s", l->remote, l->peer_id, l->reason);
        } else if (l->inbound) {
            log_stranger(n, l->remote, l->reason);
        } else if (!l->dial && !l->probe) {
            EXO_LOG_DEBUG("net: connection to %s failed: %s", l->remote, l->reason);
        }
    }
    link_release(l);
    if (l->reading)
        uv_read_stop((uv_stream_t *)&l->tcp);
    l->reading = false;
    uv_close((uv_handle_t *)&l->tcp, on_link_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    net_link *l = req->data;
    (void)status;
    /* Wait for the peer's EOF (read_cb) or the drain deadline (tick). */
    if (status < 0 && l->state == LS_DRAINING)
        link_close(l, "shutdown failed");
}

/* Stops using l but lets both directions finish: optional CLOSE(reason),
 * queued writes flushed, then our write side shut down; reads go on until
 * the peer's EOF or handshake_timeout_ms. */
static void link_drain(net_link *l, bool send_close, const char *reason)
{
    if (l->state != LS_UP)
        return;
    copy_str(l->reason, sizeof l->reason, reason);
    if (send_close) {
        exo_err err = {0};
        if (exo_sc_send(l->sc, EXO_NET_T_CLOSE, reason, strlen(reason), &err) == 0 && link_flush(l) < 0)
            return;
    }
    l->state = LS_DRAINING;
    l->t_drain = now_ns();
    link_release(l);
    if (l->state != LS_DRAINING)
        return;
    l->shutdown_req.data = l;
    int rc = uv_shutdown(&l->shutdown_req, (uv_stream_t *)&l->tcp, on_shutdown);
    if (rc < 0)
        link_close(l, "shutdown failed: %s", uv_strerror(rc));
}

/* ---- links ---- */

static net_link *link_new(exo_net *n, bool inbound)
{
    net_link *l = exo_calloc(1, sizeof *l);
    l->net = n;
    l->inbound = inbound;
    l->state = inbound ? LS_HANDSHAKE : LS_CONNECTING;
    l->t_start = now_ns();
    uv_tcp_init(n->loop, &l->tcp);
    l->tcp.data = l;
    n->open_handles++;
    l->next = n->links;
    if (n->links)
        n->links->prev = l;
    n->links = l;
    return l;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    net_link *l = h->data;
    exo_net *n = l->net;
    (void)suggested;
    if (n->rbuf_busy) { /* not expected: reads do not nest */
        buf->base = exo_malloc(READ_BUF);
    } else {
        n->rbuf_busy = true;
        buf->base = (char *)n->rbuf;
    }
    buf->len = READ_BUF;
}

static int on_established(void *ctx, exo_sc *sc);
static int on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len);
static const exo_sc_handlers HANDLERS = {on_established, on_frame};

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    net_link *l = s->data;
    exo_net *n = l->net;
    if (nread > 0 && l->state != LS_CLOSED) {
        l->t_last_rx = now_ns();
        exo_err err = {0};
        int rc = exo_sc_recv(l->sc, (const uint8_t *)buf->base, (size_t)nread, &HANDLERS, l, &err);
        if (rc < 0 && rc != EXO_ECANCELED)
            link_close(l, "%s", err.msg);
        else if (rc == 0)
            link_flush(l);
    } else if (nread < 0 && l->state != LS_CLOSED) {
        if (l->state == LS_DRAINING)
            link_close(l, "drained");
        else if (nread == UV_EOF)
            link_close(l, "%s", l->was_up ? "connection closed by the peer"
                                          : "connection closed by the peer during the handshake (it may hold "
                                            "another namespace or cluster secret)");
        else
            link_close(l, "read failed: %s", uv_strerror((int)nread));
    }
    if (buf->base == (char *)n->rbuf)
        n->rbuf_busy = false;
    else if (buf->base)
        exo_free(buf->base);
    deliver(n);
}

static void link_start(net_link *l)
{
    l->state = LS_HANDSHAKE;
    uv_tcp_nodelay(&l->tcp, 1);
    int rc = uv_read_start((uv_stream_t *)&l->tcp, on_alloc, on_read);
    if (rc < 0) {
        link_close(l, "read start failed: %s", uv_strerror(rc));
        return;
    }
    l->reading = true;
    link_flush(l); /* our HELLO */
}

/* Of two links to one peer, the one both ends keep. */
static net_link *link_better(const exo_net *n, net_link *a, net_link *b)
{
    const char *da = a->inbound ? a->peer_id : n->id.node_id;
    const char *db = b->inbound ? b->peer_id : n->id.node_id;
    int c = strcmp(da, db);
    if (c != 0)
        return c > 0 ? a : b;
    const uint8_t *sa = exo_sc_session_id(a->sc), *sb = exo_sc_session_id(b->sc);
    return memcmp(sa, sb, EXO_SC_SESSION_ID_LEN) < 0 ? a : b;
}

static void peer_attach(exo_net *n, net_link *l)
{
    peer *p = peer_find(n, l->peer_id);
    if (!p) {
        p = exo_calloc(1, sizeof *p);
        copy_str(p->id, sizeof p->id, l->peer_id);
        p->next = n->peers;
        n->peers = p;
        p->link = l;
        l->peer = p;
        EXO_LOG_INFO("net: peer %s up at %s (%s)", p->id, l->remote, l->inbound ? "inbound" : "dialed");
        event_push(n, EV_UP, p->id, l->remote);
        return;
    }
    if (!p->link) { /* lingering after a "duplicate": this is the link it waited for */
        p->lingering = false;
        p->link = l;
        l->peer = p;
        return;
    }
    net_link *old = p->link;
    net_link *win = link_better(n, old, l);
    EXO_LOG_DEBUG("net: peer %s has two links (%s, %s): keeping the one dialed by %s", p->id, old->remote,
                  l->remote, win->inbound ? win->peer_id : "us");
    if (win == l) {
        old->peer = NULL; /* moved, not gone: no peer_down */
        p->link = l;
        l->peer = p;
        link_drain(old, true, "duplicate");
    } else {
        link_drain(l, true, "duplicate");
    }
}

static void link_ping(net_link *l)
{
    uint8_t t[8];
    l->t_last_ping = now_ns();
    exo_put_le64(t, l->t_last_ping);
    link_send_ctl(l, EXO_NET_T_PING, t, sizeof t);
}

static void probe_start(exo_net *n, probe *pr);
static int probe_on_frame(exo_net *n, net_link *l, uint8_t type, const uint8_t *payload, size_t len);

static int on_established(void *ctx, exo_sc *sc)
{
    net_link *l = ctx;
    exo_net *n = l->net;
    if (n->closing || l->state == LS_CLOSED)
        return 1;
    copy_str(l->peer_id, sizeof l->peer_id, exo_sc_peer_id(sc));
    if (l->counted_pending) {
        l->counted_pending = false;
        n->handshaking_in--;
    }
    if (strcmp(l->peer_id, n->id.node_id) == 0) {
        link_close(l, "connected to itself");
        return 1;
    }
    if (l->expected[0] && strcmp(l->peer_id, l->expected) != 0) {
        link_close(l, "unexpected peer %s at %s (expected %s)", l->peer_id, l->remote, l->expected);
        return 1;
    }
    l->state = LS_UP;
    l->was_up = true;
    l->t_last_rx = l->t_last_ping = now_ns();
    if (l->inbound && (exo_sc_peer_flags(sc) & EXO_SC_FLAG_PROBE)) {
        if (n->probes_in >= EXO_NET_PROBE_MAX) {
            link_close(l, "too many probe connections");
            return 1;
        }
        l->probe_in = true;
        n->probes_in++;
        return 0;
    }
    if (l->probe) {
        probe_start(n, l->probe);
        return l->state == LS_CLOSED;
    }
    if (l->dial) {
        l->dial->backoff_ms = BACKOFF_MIN_MS;
        l->dial->last_error[0] = 0;
        copy_str(l->dial->learned, sizeof l->dial->learned, l->peer_id);
    }
    peer_attach(n, l);
    if (l->state == LS_UP)
        link_ping(l); /* an RTT sample right away */
    return l->state == LS_CLOSED;
}

/* ---- frames ---- */

static int protocol_error(net_link *l, uint8_t type, size_t len)
{
    link_close(l, "protocol error: unexpected frame type 0x%02x (%zu bytes)%s", type, len,
               l->probe || l->probe_in ? " on a probe connection" : "");
    return 1;
}

static void deliver_message(exo_net *n, net_link *l, uint8_t type, const uint8_t *payload, size_t len)
{
    /* A peer_up (or anything else) queued by this very read comes first. */
    deliver(n);
    if (n->closing || l->state == LS_CLOSED || !n->cb.message)
        return;
    n->cb.message(n->cb.ctx, l->peer_id, type, payload, len);
}

static int on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len)
{
    net_link *l = ctx;
    exo_net *n = l->net;
    (void)sc;
    if (n->closing || l->state == LS_CLOSED)
        return 1;
    if (type == EXO_NET_T_CLOSE) {
        char why[128], reason[EXO_NET_REASON_LEN];
        sanitize(why, sizeof why, payload, len);
        snprintf(reason, sizeof reason, "closed by peer: %s", why);
        if (strcmp(why, "duplicate") == 0)
            l->remote_dup = true;
        link_drain(l, false, reason);
        return l->state == LS_CLOSED;
    }
    if (l->probe)
        return probe_on_frame(n, l, type, payload, len);
    if (l->state == LS_DRAINING) {
        /* What the peer sent before it saw our CLOSE: still its messages,
         * as long as it is still a peer (through another link). */
        peer *p = peer_find(n, l->peer_id);
        if (type >= 1 && type <= EXO_NET_TYPE_APP_MAX && p && !l->probe_in)
            deliver_message(n, l, type, payload, len);
        return l->state == LS_CLOSED || n->closing;
    }
    switch (type) {
    case EXO_NET_T_PING:
        if (len != 8)
            return protocol_error(l, type, len);
        link_send_ctl(l, EXO_NET_T_PONG, payload, len);
        break;
    case EXO_NET_T_PONG: {
        if (len != 8)
            return protocol_error(l, type, len);
        uint64_t sent = exo_get_le64(payload), now = now_ns();
        /* An echo from the future or older than a minute is not ours. */
        if (sent <= now && now - sent < 60ull * 1000 * NS_PER_MS) {
            int64_t rtt = (int64_t)(now - sent);
            l->srtt_ns = l->srtt_ns ? (7 * l->srtt_ns + rtt) / 8 : rtt;
        }
        break;
    }
    case EXO_NET_T_BULK: {
        if (!l->probe_in)
            return protocol_error(l, type, len);
        uint8_t total[8];
        l->bulk_rx += len;
        exo_put_le64(total, l->bulk_rx);
        link_send_ctl(l, EXO_NET_T_BULK_ACK, total, sizeof total);
        break;
    }
    default:
        if (type > EXO_NET_TYPE_APP_MAX) {
            if (type == EXO_NET_T_BULK_ACK)
                return protocol_error(l, type, len);
            /* a transport type from a newer version: ignored */
            EXO_LOG_DEBUG("net: %s: ignoring frame type 0x%02x", l->peer_id, type);
            break;
        }
        if (l->probe_in)
            return protocol_error(l, type, len);
        deliver_message(n, l, type, payload, len);
        break;
    }
    return l->state == LS_CLOSED || n->closing;
}

/* ---- probes ---- */

static void probe_ping(probe *pr)
{
    uint8_t t[8];
    pr->ping_sent = now_ns();
    exo_put_le64(t, pr->ping_sent);
    link_send_ctl(pr->link, EXO_NET_T_PING, t, sizeof t);
}

static void probe_pump(exo_net *n, probe *pr)
{
    while (pr->link && pr->sent < pr->bulk_bytes && pr->sent - pr->acked < PROBE_WINDOW) {
        net_link *l = pr->link;
        uint64_t left = pr->bulk_bytes - pr->sent;
        size_t k = left < EXO_NET_PROBE_CHUNK ? (size_t)left : EXO_NET_PROBE_CHUNK;
        exo_err err = {0};
        if (exo_sc_send(l->sc, EXO_NET_T_BULK, pr->chunk, k, &err) < 0) {
            probe_finish(n, pr, false, "%s", err.msg);
            return;
        }
        pr->sent += k;
        if (link_flush(l) < 0)
            return; /* the link closed and finished the probe */
    }
}

static void probe_start(exo_net *n, probe *pr)
{
    (void)n;
    pr->phase = PP_PING;
    probe_ping(pr);
}

static int probe_on_frame(exo_net *n, net_link *l, uint8_t type, const uint8_t *payload, size_t len)
{
    probe *pr = l->probe;
    uint64_t now = now_ns();
    if (type == EXO_NET_T_PONG && len == 8 && pr->phase == PP_PING && exo_get_le64(payload) == pr->ping_sent) {
        uint64_t rtt = now - pr->ping_sent;
        if (pr->pings == 0 || rtt < pr->rtt_min_ns)
            pr->rtt_min_ns = rtt;
        if (++pr->pings < PROBE_PINGS) {
            probe_ping(pr);
        } else if (pr->bulk_bytes == 0) {
            probe_finish(n, pr, true, "ok");
        } else {
            pr->phase = PP_BULK;
            pr->bulk_start = now;
            probe_pump(n, pr);
        }
    } else if (type == EXO_NET_T_BULK_ACK && len == 8 && pr->phase == PP_BULK) {
        uint64_t total = exo_get_le64(payload);
        if (total < pr->acked || total > pr->sent) {
            probe_finish(n, pr, false, "protocol error: BULK_ACK for %llu bytes, %llu sent",
                         (unsigned long long)total, (unsigned long long)pr->sent);
        } else {
            pr->acked = total;
            if (pr->acked == pr->bulk_bytes)
                probe_finish(n, pr, true, "ok");
            else
                probe_pump(n, pr);
        }
    } else if (type == EXO_NET_T_PING && len == 8) {
        link_send_ctl(l, EXO_NET_T_PONG, payload, len);
    } else {
        return protocol_error(l, type, len);
    }
    return l->state == LS_CLOSED || n->closing;
}

static void probe_finish(exo_net *n, probe *pr, bool ok, const char *fmt, ...)
{
    event e = {.kind = EV_PROBE, .cb = pr->cb, .ctx = pr->ctx};
    exo_net_probe_result *r = &e.res;
    r->ok = ok;
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->error, sizeof r->error, fmt, ap);
        va_end(ap);
    }
    if (pr->link)
        copy_str(r->peer_id, sizeof r->peer_id, pr->link->peer_id);
    if (ok) {
        r->rtt_us = (pr->rtt_min_ns + 999) / 1000;
        if (r->rtt_us == 0)
            r->rtt_us = 1;
        r->bulk_bytes = pr->acked;
        if (pr->bulk_bytes) {
            r->bulk_ns = now_ns() - pr->bulk_start;
            if (r->bulk_ns == 0)
                r->bulk_ns = 1;
            r->bandwidth_bps = (uint64_t)((double)pr->acked * 8.0 * 1e9 / (double)r->bulk_ns);
        }
    }
    for (probe **pp = &n->probes; *pp; pp = &(*pp)->next)
        if (*pp == pr) {
            *pp = pr->next;
            break;
        }
    n->probes_out--;
    if (pr->link) {
        net_link *l = pr->link;
        l->probe = NULL;
        pr->link = NULL;
        if (ok)
            link_drain(l, true, "probe finished");
        else
            link_close(l, "probe failed: %s", r->error);
    }
    if (!ok)
        EXO_LOG_DEBUG("net: probe failed: %s", r->error);
    exo_free(pr->chunk);
    exo_free(pr);
    if (n->closing) {
        e.cb(e.ctx, r); /* exo_net_close promised exactly one callback */
        return;
    }
    event *q = event_push(n, EV_PROBE, r->peer_id, NULL);
    q->cb = e.cb;
    q->ctx = e.ctx;
    q->res = e.res;
}

/* ---- connecting and dials ---- */

static void on_connect(uv_connect_t *req, int status)
{
    net_link *l = req->data;
    exo_net *n = l->net;
    if (l->state == LS_CLOSED)
        return; /* closed while connecting (status is UV_ECANCELED) */
    if (status < 0)
        link_close(l, "connect failed: %s", uv_strerror(status));
    else
        link_start(l);
    deliver(n);
}

static net_link *link_connect(exo_net *n, const struct sockaddr *addr, const char *expected, dial *d,
                              probe *pr)
{
    net_link *l = link_new(n, false);
    l->dial = d;
    l->probe = pr;
    if (d)
        d->link = l;
    if (pr)
        pr->link = l;
    copy_str(l->expected, sizeof l->expected, expected);
    addr_text(addr, l->remote, sizeof l->remote);
    exo_err err = {0};
    if (exo_sc_new(&n->id, n->psk, true, pr ? EXO_SC_FLAG_PROBE : 0, &l->sc, &err) < 0) {
        link_close(l, "%s", err.msg);
        return l;
    }
    l->connect_req.data = l;
    int rc = uv_tcp_connect(&l->connect_req, &l->tcp, addr, on_connect);
    if (rc < 0)
        link_close(l, "connect failed: %s", uv_strerror(rc));
    return l;
}

static void dial_remove(exo_net *n, dial *d)
{
    for (dial **pp = &n->dials; *pp; pp = &(*pp)->next)
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    if (d->link)
        d->link->dial = NULL;
    exo_free(d);
}

static void dial_link_closed(exo_net *n, dial *d, net_link *l)
{
    d->link = NULL;
    if (n->closing)
        return;
    uint64_t now = now_ns();
    if (strcmp(l->reason, "connected to itself") == 0) {
        EXO_LOG_WARN("net: %s is this node itself; not dialing it again", d->addr_text);
        dial_remove(n, d);
        return;
    }
    if (!d->persistent) {
        if (!l->was_up)
            EXO_LOG_INFO("net: dial to %s failed: %s", d->addr_text, l->reason);
        dial_remove(n, d);
        return;
    }
    if (l->was_up) {
        d->backoff_ms = BACKOFF_MIN_MS;
        d->next_attempt = now + (uint64_t)BACKOFF_MIN_MS * NS_PER_MS;
        return;
    }
    if (strcmp(d->last_error, l->reason) != 0) {
        EXO_LOG_WARN("net: cannot connect to %s: %s (retrying)", d->addr_text, l->reason);
        copy_str(d->last_error, sizeof d->last_error, l->reason);
    } else {
        EXO_LOG_DEBUG("net: cannot connect to %s: %s (retry in %u ms)", d->addr_text, l->reason,
                      d->backoff_ms);
    }
    d->next_attempt = now + (uint64_t)d->backoff_ms * NS_PER_MS;
    d->backoff_ms = d->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d->backoff_ms * 2;
}

static void dial_attempt(exo_net *n, dial *d)
{
    link_connect(n, (const struct sockaddr *)&d->addr, d->expected[0] ? d->expected : NULL, d, NULL);
}

/* ---- accepting ---- */

static void on_connection(uv_stream_t *server, int status)
{
    listener *ls = server->data;
    exo_net *n = ls->net;
    if (n->closing)
        return;
    if (status < 0) {
        EXO_LOG_WARN("net: accept failed: %s", uv_strerror(status));
        return;
    }
    net_link *l = link_new(n, true);
    copy_str(l->remote, sizeof l->remote, "?");
    int rc = uv_accept(server, (uv_stream_t *)&l->tcp);
    if (rc < 0) {
        link_close(l, "accept failed: %s", uv_strerror(rc));
        deliver(n);
        return;
    }
    struct sockaddr_storage ss;
    int sl = (int)sizeof ss;
    if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&ss, &sl) == 0)
        addr_text((struct sockaddr *)&ss, l->remote, sizeof l->remote);
    if (n->handshaking_in >= n->pending_max) {
        link_close(l, "too many pending handshakes (%u)", n->pending_max);
        deliver(n);
        return;
    }
    l->counted_pending = true;
    n->handshaking_in++;
    exo_err err = {0};
    if (exo_sc_new(&n->id, n->psk, false, 0, &l->sc, &err) < 0)
        link_close(l, "%s", err.msg);
    else
        link_start(l);
    deliver(n);
}

/* ---- the tick ---- */

static void on_tick(uv_timer_t *t)
{
    exo_net *n = t->data;
    uint64_t now = now_ns();
    uint64_t hs = (uint64_t)n->hs_to_ms * NS_PER_MS, peer_to = (uint64_t)n->peer_to_ms * NS_PER_MS;
    uint64_t ping = (uint64_t)n->ping_ms * NS_PER_MS;
    for (net_link *l = n->links; l; l = l->next) {
        switch (l->state) {
        case LS_CONNECTING:
        case LS_HANDSHAKE:
            if (now - l->t_start > hs)
                link_close(l, "handshake timed out after %u ms", n->hs_to_ms);
            break;
        case LS_UP:
            if (now - l->t_last_rx > peer_to)
                link_close(l, "timed out: nothing received for %u ms", n->peer_to_ms);
            else if (!l->probe && !l->probe_in && now - l->t_last_ping >= ping)
                link_ping(l);
            break;
        case LS_DRAINING:
            if (now - l->t_drain > hs)
                link_close(l, "drain timed out");
            break;
        case LS_CLOSED:
            break;
        }
    }
    for (dial *d = n->dials, *next; d; d = next) {
        next = d->next;
        if (d->link || !d->persistent || now < d->next_attempt)
            continue;
        const char *who = d->expected[0] ? d->expected : d->learned;
        peer *p = who[0] ? peer_find(n, who) : NULL;
        if (p && p->link) { /* reached through another link: nothing to do */
            d->next_attempt = now + (uint64_t)BACKOFF_MIN_MS * NS_PER_MS;
            continue;
        }
        dial_attempt(n, d);
    }
    for (peer *p = n->peers, *next; p; p = next) {
        next = p->next;
        if (p->lingering && now >= p->linger_until) {
            EXO_LOG_INFO("net: peer %s down: %s", p->id, p->reason);
            event_push(n, EV_DOWN, p->id, p->reason);
            peer_remove(n, p);
        }
    }
    for (probe *pr = n->probes, *next; pr; pr = next) {
        next = pr->next;
        if (now < pr->deadline)
            continue;
        const char *what = pr->phase == PP_CONNECT ? "connecting"
                           : pr->phase == PP_PING  ? "measuring RTT"
                                                   : "measuring bandwidth";
        probe_finish(n, pr, false, "probe timed out after %d ms (%s)", EXO_NET_PROBE_TIMEOUT_MS, what);
    }
    deliver(n);
}

/* ---- lifecycle ---- */

static void net_destroy(exo_net *n)
{
    while (n->ev_head) {
        event *e = n->ev_head;
        n->ev_head = e->next;
        exo_free(e);
    }
    exo_identity_wipe(&n->id);
    sodium_memzero(n->psk, sizeof n->psk);
    exo_free(n->rbuf);
    exo_free(n);
}

static void net_handle_gone(exo_net *n)
{
    if (--n->open_handles == 0 && n->free_when_closed)
        net_destroy(n);
}

static void on_timer_closed(uv_handle_t *h) { net_handle_gone(h->data); }

static void on_listener_closed(uv_handle_t *h)
{
    listener *ls = h->data;
    exo_net *n = ls->net;
    exo_free(ls);
    net_handle_gone(n);
}

/* The listening socket, made with plain system calls so that every way it
 * can fail happens before a libuv handle exists (a handle, once
 * initialised, can only be released through the loop). */
static int open_listen_socket(const struct sockaddr *sa, int *fd_out, int *sys_err, exo_err *err)
{
    char text[EXO_NET_ADDR_LEN];
    addr_text(sa, text, sizeof text);
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *sys_err = errno;
        return exo_err_set(err, EXO_EIO, "listen on %s: socket: %s", text, strerror(*sys_err));
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (sa->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* dual stack */
    if (bind(fd, sa, (socklen_t)addr_len(sa)) < 0 || listen(fd, 128) < 0) {
        *sys_err = errno;
        close(fd);
        return exo_err_set(err, EXO_EIO, "listen on %s: %s", text, strerror(*sys_err));
    }
    *fd_out = fd;
    return 0;
}

static int open_listener(const exo_net_config *cfg, int *fd_out, exo_err *err)
{
    struct sockaddr_storage ss;
    int sys_err = 0;
    memset(&ss, 0, sizeof ss);
    if (cfg->listen_host) {
        int rc = strchr(cfg->listen_host, ':')
                     ? uv_ip6_addr(cfg->listen_host, cfg->listen_port, (struct sockaddr_in6 *)&ss)
                     : uv_ip4_addr(cfg->listen_host, cfg->listen_port, (struct sockaddr_in *)&ss);
        if (rc < 0)
            return exo_err_set(err, EXO_EINVAL, "listen address '%s' is not a numeric IPv4 or IPv6 address",
                               cfg->listen_host);
        return open_listen_socket((struct sockaddr *)&ss, fd_out, &sys_err, err);
    }
    uv_ip6_addr("::", cfg->listen_port, (struct sockaddr_in6 *)&ss);
    int rc = open_listen_socket((struct sockaddr *)&ss, fd_out, &sys_err, err);
    if (rc == 0 || (sys_err != EAFNOSUPPORT && sys_err != EADDRNOTAVAIL && sys_err != EPROTONOSUPPORT))
        return rc;
    EXO_LOG_INFO("net: no IPv6 here (%s), listening on IPv4 only", strerror(sys_err));
    memset(&ss, 0, sizeof ss);
    uv_ip4_addr("0.0.0.0", cfg->listen_port, (struct sockaddr_in *)&ss);
    return open_listen_socket((struct sockaddr *)&ss, fd_out, &sys_err, err);
}

int exo_net_new(uv_loop_t *loop, const exo_net_config *cfg, const exo_net_callbacks *cbs, exo_net **out,
                exo_err *err)
{
    *out = NULL;
    if (!loop || !cfg || !cfg->identity || !cfg->psk)
        return exo_err_set(err, EXO_EINVAL, "net: a loop, an identity and a psk are required");
    if (!exo_identity_id_valid(cfg->identity->node_id))
        return exo_err_set(err, EXO_EINVAL, "net: the identity has no valid node id");
    if (sodium_init() < 0)
        return exo_err_set(err, EXO_EINTERNAL, "net: libsodium could not initialise");
    int fd = -1;
    if (!cfg->no_listen) {
        int rc = open_listener(cfg, &fd, err);
        if (rc < 0)
            return rc;
    }
    exo_net *n = exo_calloc(1, sizeof *n);
    n->loop = loop;
    n->id = *cfg->identity;
    memcpy(n->psk, cfg->psk, sizeof n->psk);
    n->ping_ms = cfg->ping_interval_ms ? cfg->ping_interval_ms : DEF_PING_MS;
    n->peer_to_ms = cfg->peer_timeout_ms ? cfg->peer_timeout_ms : DEF_PEER_TO_MS;
    n->hs_to_ms = cfg->handshake_timeout_ms ? cfg->handshake_timeout_ms : DEF_HS_TO_MS;
    n->queue_max = cfg->send_queue_max ? cfg->send_queue_max : DEF_QUEUE_MAX;
    n->pending_max = cfg->max_pending_handshakes ? cfg->max_pending_handshakes : DEF_PENDING_MAX;
    if (cbs)
        n->cb = *cbs;
    n->rbuf = exo_malloc(READ_BUF);
    uv_timer_init(loop, &n->tick);
    n->tick.data = n;
    uv_timer_init(loop, &n->defer);
    n->defer.data = n;
    n->open_handles = 2;
    if (fd >= 0) {
        listener *ls = exo_calloc(1, sizeof *ls);
        ls->net = n;
        uv_tcp_init(loop, &ls->tcp);
        ls->tcp.data = ls;
        n->open_handles++;
        n->lst = ls;
        int rc = uv_tcp_open(&ls->tcp, fd);
        if (rc < 0)
            close(fd); /* not adopted by the handle */
        else
            rc = uv_listen((uv_stream_t *)&ls->tcp, 128, on_connection);
        if (rc < 0) {
            exo_err_set(err, EXO_EIO, "net: listen: %s", uv_strerror(rc));
            exo_net_free(n); /* freed once the loop has closed the handles */
            return EXO_EIO;
        }
        struct sockaddr_storage ss;
        int sl = (int)sizeof ss;
        if (uv_tcp_getsockname(&ls->tcp, (struct sockaddr *)&ss, &sl) == 0)
            n->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                    : ((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    uint32_t shortest = n->ping_ms;
    if (n->peer_to_ms / 2 < shortest)
        shortest = n->peer_to_ms / 2;
    if (n->hs_to_ms < shortest)
        shortest = n->hs_to_ms;
    uint64_t tick = shortest / 4;
    tick = tick < 5 ? 5 : tick > 100 ? 100 : tick;
    uv_timer_start(&n->tick, on_tick, tick, tick);
    EXO_LOG_INFO("net: node %s %s%u", n->id.node_id, n->lst ? "listening on port " : "not listening",
                 n->lst ? n->port : 0);
    *out = n;
    return 0;
}

uint16_t exo_net_port(const exo_net *n) { return n->port; }
const char *exo_net_node_id(const exo_net *n) { return n->id.node_id; }

static bool family_ok(const struct sockaddr *addr)
{
    return addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6);
}

int exo_net_dial(exo_net *n, const struct sockaddr *addr, const char *expected_id, bool persistent,
                 exo_err *err)
{
    if (n->closing)
        return exo_err_set(err, EXO_ECANCELED, "net: closed");
    if (!family_ok(addr))
        return exo_err_set(err, EXO_EINVAL, "net: dial: not an IPv4 or IPv6 address");
    if (expected_id && !exo_identity_id_valid(expected_id))
        return exo_err_set(err, EXO_EINVAL, "net: dial: '%s' is not a node id", expected_id);
    if (expected_id && strcmp(expected_id, n->id.node_id) == 0)
        return exo_err_set(err, EXO_EINVAL, "net: dial: %s is this node's own id", expected_id);
    peer *p = peer_find(n, expected_id);
    bool connected = p && p->link;
    for (dial *d = n->dials; d; d = d->next) {
        if (addr_equal(&d->addr, addr) || (expected_id && strcmp(d->expected, expected_id) == 0)) {
            d->persistent |= persistent;
            return 0;
        }
    }
    if (connected && !persistent)
        return 0;
    dial *d = exo_calloc(1, sizeof *d);
    memcpy(&d->addr, addr, addr_len(addr));
    addr_text(addr, d->addr_text, sizeof d->addr_text);
    copy_str(d->expected, sizeof d->expected, expected_id);
    d->persistent = persistent;
    d->backoff_ms = BACKOFF_MIN_MS;
    d->next = n->dials;
    n->dials = d;
    if (connected) { /* persistent, for when that link drops */
        d->next_attempt = now_ns() + (uint64_t)BACKOFF_MIN_MS * NS_PER_MS;
        return 0;
    }
    dial_attempt(n, d);
    return 0;
}

int exo_net_send(exo_net *n, const char *peer_id, uint8_t type, const void *payload, size_t len, exo_err *err)
{
    if (n->closing)
        return exo_err_set(err, EXO_ECANCELED, "net: closed");
    if (type == 0 || type > EXO_NET_TYPE_APP_MAX)
        return exo_err_set(err, EXO_EINVAL, "net: message type 0x%02x is not an application type (1..0x%02x)",
                           type, EXO_NET_TYPE_APP_MAX);
    if (len > EXO_SC_PAYLOAD_MAX)
        return exo_err_set(err, EXO_ETOOBIG, "net: a message of %zu bytes exceeds the limit of %zu", len,
                           EXO_SC_PAYLOAD_MAX);
    peer *p = peer_find(n, peer_id);
    if (!p || !p->link)
        return exo_err_set(err, EXO_ENOENT, "net: no link to peer %s", peer_id ? peer_id : "(null)");
    net_link *l = p->link;
    size_t queued = link_queued(l);
    if (queued + len + EXO_SC_FRAME_OVERHEAD > n->queue_max)
        return exo_err_set(err, EXO_EBUSY, "net: send queue to %s full (%zu bytes queued, limit %zu)",
                           peer_id, queued, n->queue_max);
    int rc = exo_sc_send(l->sc, type, payload, len, err);
    if (rc < 0)
        return rc;
    if (link_flush(l) < 0)
        return exo_err_set(err, EXO_EIO, "net: link to %s failed: %s", peer_id, l->reason);
    return 0;
}

size_t exo_net_broadcast(exo_net *n, uint8_t type, const void *payload, size_t len)
{
    size_t count = 0;
    for (peer *p = n->peers, *next; p; p = next) {
        next = p->next;
        if (p->link && exo_net_send(n, p->id, type, payload, len, NULL) == 0)
            count++;
    }
    return count;
}

bool exo_net_connected(const exo_net *n, const char *peer_id)
{
    const peer *p = peer_find(n, peer_id);
    return p && p->link;
}

int64_t exo_net_peer_rtt_us(const exo_net *n, const char *peer_id)
{
    const peer *p = peer_find(n, peer_id);
    if (!p || !p->link || !p->link->srtt_ns)
        return -1;
    int64_t us = (p->link->srtt_ns + 999) / 1000;
    return us > 0 ? us : 1;
}

size_t exo_net_peers(const exo_net *n, exo_net_peer_info *out, size_t max)
{
    size_t count = 0;
    for (const peer *p = n->peers; p; p = p->next) {
        if (!p->link)
            continue;
        if (out && count < max) {
            exo_net_peer_info *i = &out[count];
            copy_str(i->id, sizeof i->id, p->id);
            copy_str(i->remote, sizeof i->remote, p->link->remote);
            i->dialed = !p->link->inbound;
            i->rtt_us = exo_net_peer_rtt_us(n, p->id);
            i->queued_bytes = link_queued(p->link);
        }
        count++;
    }
    return count;
}

int exo_net_disconnect(exo_net *n, const char *peer_id, const char *reason)
{
    if (n->closing)
        return EXO_ECANCELED;
    peer *p = peer_find(n, peer_id);
    if (!p)
        return EXO_ENOENT;
    const char *why = reason && reason[0] ? reason : "disconnected";
    if (!p->link) { /* lingering: just stop waiting */
        EXO_LOG_INFO("net: peer %s down: %s", p->id, why);
        event_push(n, EV_DOWN, p->id, why);
        peer_remove(n, p);
        return 0;
    }
    link_drain(p->link, true, why);
    return 0;
}

int exo_net_probe(exo_net *n, const struct sockaddr *addr, const char *expected_id, uint64_t bulk_bytes,
                  exo_net_probe_cb cb, void *ctx, exo_err *err)
{
    if (n->closing)
        return exo_err_set(err, EXO_ECANCELED, "net: closed");
    if (!cb || !family_ok(addr))
        return exo_err_set(err, EXO_EINVAL, "net: probe needs a callback and an IPv4 or IPv6 address");
    if (expected_id && !exo_identity_id_valid(expected_id))
        return exo_err_set(err, EXO_EINVAL, "net: probe: '%s' is not a node id", expected_id);
    if (bulk_bytes > EXO_NET_PROBE_BULK_MAX)
        return exo_err_set(err, EXO_ERANGE, "net: probe: %llu bulk bytes exceed the limit of %llu",
                           (unsigned long long)bulk_bytes, (unsigned long long)EXO_NET_PROBE_BULK_MAX);
    if (n->probes_out >= EXO_NET_PROBE_MAX)
        return exo_err_set(err, EXO_EBUSY, "net: %d probes already running", EXO_NET_PROBE_MAX);
    probe *pr = exo_calloc(1, sizeof *pr);
    pr->cb = cb;
    pr->ctx = ctx;
    pr->bulk_bytes = bulk_bytes;
    pr->deadline = now_ns() + (uint64_t)EXO_NET_PROBE_TIMEOUT_MS * NS_PER_MS;
    if (bulk_bytes)
        pr->chunk = exo_calloc(1, EXO_NET_PROBE_CHUNK);
    pr->next = n->probes;
    n->probes = pr;
    n->probes_out++;
    link_connect(n, addr, expected_id, NULL, pr);
    return 0;
}

void exo_net_stats_get(const exo_net *n, exo_net_stats *out)
{
    memset(out, 0, sizeof *out);
    for (const net_link *l = n->links; l; l = l->next) {
        out->links++;
        if (l->state == LS_UP && l->peer)
            out->links_up++;
    }
    out->handshaking_in = n->handshaking_in;
    out->probes_in = n->probes_in;
    out->probes_out = n->probes_out;
    for (const dial *d = n->dials; d; d = d->next)
        out->dials++;
    out->peers = exo_net_peers(n, NULL, 0);
}

/* Best effort: tell an established peer why, without waiting. */
static void say_goodbye(net_link *l)
{
    if (l->state != LS_UP || l->inflight || exo_sc_out_pending(l->sc))
        return; /* anything still queued would be cut mid-frame */
    if (exo_sc_send(l->sc, EXO_NET_T_CLOSE, "shutting down", 13, NULL) < 0)
        return;
    size_t len;
    uint8_t *p;
    while ((p = exo_sc_out_take(l->sc, &len))) {
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)len);
        uv_try_write((uv_stream_t *)&l->tcp, &b, 1);
        exo_free(p);
    }
}

void exo_net_close(exo_net *n)
{
    if (!n || n->closing)
        return;
    n->closing = true;
    /* Probe results already queued still owe their callback; the rest of
     * the queue is dropped (no callbacks after close). */
    event *e = n->ev_head;
    n->ev_head = n->ev_tail = NULL;
    while (e) {
        event *next = e->next;
        if (e->kind == EV_PROBE)
            e->cb(e->ctx, &e->res);
        exo_free(e);
        e = next;
    }
    while (n->probes)
        probe_finish(n, n->probes, false, "network closed");
    for (net_link *l = n->links; l; l = l->next) {
        say_goodbye(l);
        link_close(l, "network closed");
    }
    while (n->dials)
        dial_remove(n, n->dials);
    while (n->peers)
        peer_remove(n, n->peers);
    uv_timer_stop(&n->tick);
    uv_timer_stop(&n->defer);
    uv_close((uv_handle_t *)&n->tick, on_timer_closed);
    uv_close((uv_handle_t *)&n->defer, on_timer_closed);
    if (n->lst) {
        uv_close((uv_handle_t *)&n->lst->tcp, on_listener_closed);
        n->lst = NULL;
    }
}

void exo_net_free(exo_net *n)
{
    if (!n)
        return;
    exo_net_close(n);
    n->free_when_closed = true;
    if (n->open_handles == 0)
        net_destroy(n);
}
