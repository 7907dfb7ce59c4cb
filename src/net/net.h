/* Node-to-node transport: authenticated, encrypted TCP links on libuv.
 *
 * One exo_net per daemon. It listens, dials, runs one secure channel
 * (secure_channel.h) per TCP connection and turns links into peers: the
 * user sees peer_up when the first link to a node id is established,
 * peer_down when its last link is gone, and messages (type 1..0xEF) from it.
 * Nobody without the cluster psk gets past the handshake; the node id of a
 * peer is proven by its Ed25519 key.
 *
 * Links and peers:
 *   - A peer id with two links (both nodes dialed each other at once, or
 *     dialed twice) keeps one: the link whose DIALER has the greater node id,
 *     ties (same dialer) broken by the smaller session id, which both ends
 *     share, so both ends pick the same link without talking. The other link
 *     is drained, not cut: we send CLOSE("duplicate"), flush what was queued
 *     on it, shut down writing and keep delivering what still arrives. A
 *     node whose only link is closed as "duplicate" by the other end waits
 *     up to handshake_timeout_ms for the winning link before reporting
 *     peer_down, so the race does not flap peer_down/peer_up.
 *   - Delivery is at most once and in order per link; frames queued on a
 *     link that dies are lost, and order is not kept across a switch from
 *     one link to another. The layers above must tolerate both.
 *   - Liveness: every ping_interval_ms a PING(0xF0){u64 sender ns}, answered
 *     with PONG(0xF1) echoing it (smoothed into the peer's RTT). Any bytes
 *     received refresh the link (bytes, not frames: a 16 MiB frame on a slow
 *     link must not time it out); nothing for peer_timeout_ms closes it
 *     ("timed out").
 *   - A link closed on purpose announces why with CLOSE(0xF2){reason}; the
 *     other end's peer_down says "closed by peer: <reason>".
 *   - Self-connections ("connected to itself"; a persistent dial that reaches
 *     this node stops retrying) and dials that reach another id than expected
 *     ("unexpected peer X at ADDR") are closed. Thanks to the handshake
 *     order, the unexpected node never sees our identity nor a peer_up.
 *
 * Defences: at most max_pending_handshakes unauthenticated inbound
 * connections (more are closed at once), each closed after
 * handshake_timeout_ms; pre-auth failures are logged at INFO at most 5
 * times per 10 s (then counted). Per link, at most send_queue_max bytes of
 * application frames queued or in flight (exo_net_send returns EXO_EBUSY
 * beyond; the caller decides what back-pressure means); transport control
 * frames may exceed it by 64 KiB, after which the link is closed as not
 * reading. The receive side holds one read buffer per exo_net and one
 * partial frame per link.
 *
 * Probes: exo_net_probe opens a separate connection (HELLO flag PROBE),
 * checks the peer id, takes the minimum RTT of 5 PING/PONGs and, if asked,
 * sends bulk_bytes as BULK(0xF4) frames of <= 1 MiB (at most 4 MiB
 * unacknowledged); the other end answers each with BULK_ACK(0xF5){u64 bytes
 * received so far}. Bandwidth = bytes / (last ack - first send). The result
 * callback runs exactly once (on success, failure, the 5 s timeout, or
 * inside exo_net_close); exo_net_probe itself failing (EXO_EBUSY: 8 probes
 * already running) means no callback. The listening side serves at most 8
 * probe connections at once and never reports them as peers.
 *
 * Callbacks run on the loop thread, from libuv callbacks (never from inside
 * an exo_net_* call, and never from a uv_close callback): peer_up/peer_down
 * and probe results are queued and delivered at the end of the libuv
 * callback that caused them (or on the next loop iteration for ones caused
 * by an API call), a peer's peer_up always before its first message. A
 * callback may call any exo_net_* function except exo_net_free.
 *
 * Threading: an exo_net and everything it calls belongs to the thread that
 * runs its loop.
 *
 * Example usage:
 *   exo_net_config cfg = {.identity = &id, .psk = keys.psk, .listen_port = 52415};
 *   exo_net_callbacks cbs = {on_up, on_down, on_message, node};
 *   exo_net *net;
 *   if (exo_net_new(loop, &cfg, &cbs, &net, &err) < 0) ...
 *   exo_net_dial(net, (struct sockaddr *)&bootstrap, NULL, true, &err);
 *   ... in on_message: exo_net_send(net, peer_id, MY_TYPE, buf, len, &err);
 *   exo_net_close(net);             // from any callback, or before uv_run returns
 *   ... uv_run(loop) returns ...
 *   exo_net_free(net); */
#ifndef EXO_NET_NET_H
#define EXO_NET_NET_H

#include "core/error.h"
#include "net/identity.h"
#include "net/secure_channel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#define EXO_NET_T_PING           0xF0
#define EXO_NET_T_PONG           0xF1
#define EXO_NET_T_CLOSE          0xF2
#define EXO_NET_T_BULK           0xF4
#define EXO_NET_T_BULK_ACK       0xF5
#define EXO_NET_TYPE_APP_MAX     EXO_SC_TYPE_APP_MAX   /* application types: 1..0xEF */
#define EXO_NET_PROBE_CHUNK      ((size_t)1 << 20)
#define EXO_NET_PROBE_MAX        8                     /* concurrent probes, each direction */
#define EXO_NET_PROBE_TIMEOUT_MS 5000
#define EXO_NET_PROBE_BULK_MAX   ((uint64_t)1 << 30)
#define EXO_NET_ADDR_LEN         64                    /* "ip:port" / "[ip6]:port" + NUL */
#define EXO_NET_REASON_LEN       192

typedef struct exo_net exo_net;

typedef struct exo_net_config {
    const exo_identity *identity; /* copied */
    const uint8_t      *psk;      /* 32 bytes (exo_net_keys.psk), copied */
    const char *listen_host;      /* NULL: "::" (dual stack), falling back to 0.0.0.0 */
    uint16_t    listen_port;      /* 0: ephemeral (see exo_net_port) */
    bool        no_listen;        /* dial only */
    /* 0 picks the default. */
    uint32_t ping_interval_ms;       /* 500 */
    uint32_t peer_timeout_ms;        /* 3000 */
    uint32_t handshake_timeout_ms;   /* 5000 */
    size_t   send_queue_max;         /* 64 MiB per link */
    uint32_t max_pending_handshakes; /* 64 */
} exo_net_config;

typedef struct exo_net_callbacks {
    /* remote: "ip:port" of the link. */
    void (*peer_up)(void *ctx, const char *peer_id, const char *remote);
    void (*peer_down)(void *ctx, const char *peer_id, const char *reason);
    /* An application frame (type 1..0xEF); payload valid during the call. */
    void (*message)(void *ctx, const char *peer_id, uint8_t type, const uint8_t *payload, size_t len);
    void *ctx;
} exo_net_callbacks;

/* Starts listening (unless no_listen). Errors: EXO_EINVAL (missing identity
 * or psk, bad listen_host), EXO_EIO (cannot bind or listen; the message
 * names the address). */
int exo_net_new(uv_loop_t *loop, const exo_net_config *cfg, const exo_net_callbacks *cbs, exo_net **out,
                exo_err *err);

/* The port we listen on (the real one when listen_port was 0); 0 if none. */
uint16_t    exo_net_port(const exo_net *n);
const char *exo_net_node_id(const exo_net *n);

/* Connects to addr (IPv4 or IPv6). expected_id: the node we mean to reach,
 * or NULL (bootstrap: whoever answers). A no-op if that peer is connected
 * (a persistent dial is then remembered for when it drops) or a dial to
 * that id / address exists (a persistent request makes it persistent).
 * Persistent dials retry while the peer they reached is not connected:
 * 0.5 s, doubling to 10 s, back to 0.5 s after a link was up; they stop
 * after reaching this node itself. Failures are logged, not returned.
 * Errors: EXO_EINVAL (address family, malformed or own expected_id),
 * EXO_ECANCELED (closed). */
int exo_net_dial(exo_net *n, const struct sockaddr *addr, const char *expected_id, bool persistent,
                 exo_err *err);

/* Queues one frame to a connected peer. Errors: EXO_ENOENT (no link),
 * EXO_EBUSY (queued + in-flight bytes of that link would exceed
 * send_queue_max: nothing queued), EXO_EINVAL (type not in 1..0xEF),
 * EXO_ETOOBIG (len > EXO_SC_PAYLOAD_MAX), EXO_EIO (the link just failed),
 * EXO_ECANCELED (closed). */
int exo_net_send(exo_net *n, const char *peer_id, uint8_t type, const void *payload, size_t len,
                 exo_err *err);
/* Sends to every connected peer; returns how many it was queued to. */
size_t exo_net_broadcast(exo_net *n, uint8_t type, const void *payload, size_t len);

bool    exo_net_connected(const exo_net *n, const char *peer_id);
/* Smoothed PING/PONG round trip in microseconds; -1 if unknown or not connected. */
int64_t exo_net_peer_rtt_us(const exo_net *n, const char *peer_id);

typedef struct exo_net_peer_info {
    char    id[EXO_NODE_ID_LEN + 1];
    char    remote[EXO_NET_ADDR_LEN];
    bool    dialed;        /* we dialed the link in use */
    int64_t rtt_us;        /* -1 unknown */
    size_t  queued_bytes;  /* queued + in flight on its link */
} exo_net_peer_info;

/* Fills up to max entries; returns the number of connected peers. */
size_t exo_net_peers(const exo_net *n, exo_net_peer_info *out, size_t max);

/* Closes the link(s) to a peer (CLOSE(reason) is sent first); peer_down
 * follows. EXO_ENOENT if not connected. */
int exo_net_disconnect(exo_net *n, const char *peer_id, const char *reason);

typedef struct exo_net_probe_result {
    bool     ok;
    char     peer_id[EXO_NODE_ID_LEN + 1];
    uint64_t rtt_us;         /* min of 5 PING/PONG round trips, >= 1 */
    uint64_t bandwidth_bps;  /* BITS per second; 0 if bulk_bytes was 0 */
    uint64_t bulk_bytes;     /* bytes acknowledged */
    uint64_t bulk_ns;        /* first send to last ack */
    char     error[EXO_NET_REASON_LEN];
} exo_net_probe_result;

typedef void (*exo_net_probe_cb)(void *ctx, const exo_net_probe_result *res);

/* Measures the link to addr (see above). expected_id may be NULL (any node
 * that holds the psk). Errors: EXO_EBUSY (EXO_NET_PROBE_MAX running),
 * EXO_EINVAL, EXO_ERANGE (bulk_bytes > EXO_NET_PROBE_BULK_MAX),
 * EXO_ECANCELED (closed); the callback then never runs. */
int exo_net_probe(exo_net *n, const struct sockaddr *addr, const char *expected_id, uint64_t bulk_bytes,
                  exo_net_probe_cb cb, void *ctx, exo_err *err);

/* Internal counts, for tests and diagnostics. */
typedef struct exo_net_stats {
    size_t links;          /* TCP connections open or closing (any state) */
    size_t links_up;       /* established, non-probe, in use by a peer */
    size_t handshaking_in; /* unauthenticated inbound */
    size_t probes_in, probes_out;
    size_t dials;          /* dial records (persistent ones stay) */
    size_t peers;          /* connected peers */
} exo_net_stats;
void exo_net_stats_get(const exo_net *n, exo_net_stats *out);

/* Closes every link, the listener and the timers. Running probes get their
 * callback (error "network closed") inside this call; no callback of any
 * kind runs after it returns, and no peer_down is reported for the links it
 * closes. Idempotent. */
void exo_net_close(exo_net *n);
/* Frees n (closing it first if needed). libuv finishes closing handles on
 * the loop's next iteration: if that has not happened yet, the memory is
 * released from the last close callback instead, so run the loop once more
 * (uv_run until it returns) before uv_loop_close. Never call it from inside
 * one of n's callbacks. */
void exo_net_free(exo_net *n);

#endif
