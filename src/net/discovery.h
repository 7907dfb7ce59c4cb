/* Zero-configuration peer discovery: UDP multicast announcements on the LAN.
 *
 * Every exo daemon announces "node <id> of cluster <namespace> listens on TCP
 * port <p>" to a multicast group on every interface, and reports every other
 * node of its cluster it hears to the caller (found()). Discovery only says
 * where a peer may be reached; it proves nothing about who the peer is: the
 * MAC keeps other clusters' and stray traffic out, but a captured packet can
 * be replayed from any source address, so the caller authenticates peers
 * over the connection it opens (the secure channel), never on the strength
 * of a found() call.
 *
 * Packet (EXO_DISCOVERY_PACKET_LEN = 66 bytes, every field checked):
 *    0-3   "EXOD"
 *    4     version (1)
 *    5     kind: 0 announce (multicast), 1 reply (unicast answer to an announce)
 *    6-7   reserved, 0
 *    8-15  namespace hash (which cluster)
 *   16-47  node id, 32 lowercase hex ASCII chars
 *   48-49  the node's cluster TCP port, u16 little endian, non-zero
 *   50-65  BLAKE2b-128 (crypto_generichash, 16 bytes) keyed with the 32-byte
 *          announce key, over bytes 0-49
 * The decoder checks magic and version before the exact length, so that a
 * future version with another length is still recognised as "version N"
 * (worth a log line) rather than as garbage.
 *
 * Sockets: one IPv4 socket bound to 0.0.0.0:udp_port and one IPv6 socket
 * bound to [::]:udp_port (v6-only), both with SO_REUSEADDR so several
 * daemons on one host all receive the group (multicast is delivered to every
 * socket bound to the port; a unicast reply reaches only one of them, which
 * is fine: the others learn the peer from its next announce). The IPv4
 * socket joins the group on every IPv4 interface that is up and multicast
 * capable, loopback included (several daemons on one host); the IPv6 socket
 * on every multicast-capable non-loopback interface. Announces go out on
 * each of those interfaces in turn (IP_MULTICAST_IF / IPV6_MULTICAST_IF, TTL
 * and hop limit 1, multicast loop on). Interfaces are re-scanned every 5 s:
 * new ones are joined and restart the startup burst (a fresh IPv6 link has
 * no usable source address until duplicate address detection is over),
 * vanished ones are dropped; a failure on one interface is logged at DEBUG
 * and never fatal.
 *
 * Timing: announces at start, +100, +200, +400, +800 ms, then every
 * interval_ms. An announce from a node id not heard from for 5 s is answered
 * at once with a unicast reply to its source address and udp_port (both
 * sides learn each other within one round trip); replies never cause
 * replies, and a token bucket (burst EXO_DISCOVERY_REPLY_BURST, then
 * EXO_DISCOVERY_REPLY_PER_S a second) bounds what a flood of valid packets
 * can make us send. found() is called at most once per 500 ms per (node id,
 * address) pair, so a peer that keeps announcing is reported about twice a
 * second: the caller ignores peers it is already connected to.
 *
 * Bounds: at most EXO_DISCOVERY_MAX_IFACES interfaces per family and
 * EXO_DISCOVERY_MAX_PEERS remembered (node id, address) pairs (the least
 * recently heard is forgotten first); nothing else grows from input.
 *
 * Threading: everything runs on the loop thread that started the instance;
 * found() is called on it. found() may call exo_discovery_announce_now,
 * exo_discovery_close and exo_discovery_free.
 *
 * Example usage:
 *   exo_discovery_config cfg;
 *   exo_discovery_config_init(&cfg);
 *   cfg.node_id = my_id;                     // 32 lowercase hex chars
 *   memcpy(cfg.ns_hash, ns, 8);
 *   memcpy(cfg.announce_key, key, 32);
 *   cfg.tcp_port = 52415;
 *   cfg.found = on_peer;                     // (ctx, node_id, addr incl. TCP port)
 *   cfg.ctx = me;
 *   exo_discovery *d;
 *   if (exo_discovery_start(loop, &cfg, &d, &err) < 0) ...
 *   ...
 *   exo_discovery_announce_now(d);           // a peer link dropped: re-find it
 *   ...
 *   exo_discovery_close(d);                  // no found() after this
 *   uv_run(loop, UV_RUN_DEFAULT);            // let the handles close
 *   exo_discovery_free(d); */
#ifndef EXO_NET_DISCOVERY_H
#define EXO_NET_DISCOVERY_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#define EXO_DISCOVERY_PACKET_LEN      66
#define EXO_DISCOVERY_MAC_OFFSET      50
#define EXO_DISCOVERY_VERSION         1
#define EXO_DISCOVERY_NODE_ID_LEN     32
#define EXO_DISCOVERY_NS_HASH_LEN     8
#define EXO_DISCOVERY_KEY_LEN         32
#define EXO_DISCOVERY_DEFAULT_PORT    52413
#define EXO_DISCOVERY_DEFAULT_GROUP4  "239.255.52.13"
#define EXO_DISCOVERY_DEFAULT_GROUP6  "ff12::e0a1:de89"
#define EXO_DISCOVERY_DEFAULT_INTERVAL_MS 1000
#define EXO_DISCOVERY_RESCAN_MS       5000
#define EXO_DISCOVERY_REPLY_AFTER_MS  5000  /* answer a node not heard from this long */
#define EXO_DISCOVERY_FOUND_EVERY_MS  500   /* found() rate limit per (node id, address) */
#define EXO_DISCOVERY_REPLY_BURST     8
#define EXO_DISCOVERY_REPLY_PER_S     4
#define EXO_DISCOVERY_MAX_IFACES      64    /* per address family */
#define EXO_DISCOVERY_MAX_PEERS       256

/* ---- the packet codec (pure; for tests and fuzzing) ---- */

typedef enum exo_discovery_kind {
    EXO_DISCOVERY_ANNOUNCE = 0,
    EXO_DISCOVERY_REPLY    = 1,
} exo_discovery_kind;

typedef struct exo_discovery_packet {
    uint8_t  version;                                 /* set by decode; encode writes 1 */
    uint8_t  kind;                                    /* exo_discovery_kind */
    uint8_t  ns_hash[EXO_DISCOVERY_NS_HASH_LEN];
    char     node_id[EXO_DISCOVERY_NODE_ID_LEN + 1];  /* NUL-terminated */
    uint16_t tcp_port;
} exo_discovery_packet;

typedef enum exo_discovery_result {
    EXO_DISCOVERY_OK = 0,
    EXO_DISCOVERY_EFORMAT,       /* length, magic, version 0, kind, reserved, node id, port 0 */
    EXO_DISCOVERY_EVERSION,      /* magic right, version > 1: out->version says which */
    EXO_DISCOVERY_EOTHER_NS,     /* another cluster's namespace: ignore silently */
    EXO_DISCOVERY_EBAD_MAC,      /* our namespace, another cluster secret (or corruption) */
} exo_discovery_result;

const char *exo_discovery_result_name(exo_discovery_result r);

/* Whether s is exactly 32 lowercase hex chars (then a NUL). */
bool exo_discovery_node_id_valid(const char *s);

/* Writes the 66-byte packet for p (p->version is ignored) into out.
 * EXO_EINVAL (nothing written) if the kind, node id or port is invalid. */
int exo_discovery_encode(const exo_discovery_packet *p, const uint8_t key[EXO_DISCOVERY_KEY_LEN],
                         uint8_t out[EXO_DISCOVERY_PACKET_LEN]);

/* Checks buf[0..len) in this order: length >= 5, magic, version (0 ->
 * EFORMAT, > 1 -> EVERSION), exact length, kind, reserved, namespace hash,
 * node id charset, port, MAC (constant time). out is filled on OK (and
 * out->version on EVERSION); otherwise its contents are unspecified. */
exo_discovery_result exo_discovery_decode(const uint8_t *buf, size_t len,
                                          const uint8_t ns_hash[EXO_DISCOVERY_NS_HASH_LEN],
                                          const uint8_t key[EXO_DISCOVERY_KEY_LEN],
                                          exo_discovery_packet *out);

/* ---- the service ---- */

typedef struct exo_discovery exo_discovery;

/* A peer of our cluster was heard. addr: the packet's source IP (with the
 * scope id for an IPv6 link-local source) and the peer's ADVERTISED TCP
 * port; a sockaddr_in or sockaddr_in6, valid during the call only. */
typedef void (*exo_discovery_found_fn)(void *ctx, const char *node_id, const struct sockaddr *addr);

typedef struct exo_discovery_config {
    const char *node_id;                             /* ours: 32 lowercase hex chars (copied) */
    uint8_t     ns_hash[EXO_DISCOVERY_NS_HASH_LEN];
    uint8_t     announce_key[EXO_DISCOVERY_KEY_LEN];
    uint16_t    tcp_port;                            /* advertised; non-zero */
    uint16_t    udp_port;                            /* 0: EXO_DISCOVERY_DEFAULT_PORT */
    const char *group4;                              /* NULL: EXO_DISCOVERY_DEFAULT_GROUP4 */
    const char *group6;                              /* NULL: EXO_DISCOVERY_DEFAULT_GROUP6 */
    uint32_t    interval_ms;                         /* 0: default; else 10 ms .. 1 hour */
    bool        disable_ipv6;                        /* IPv6 is on by default */
    exo_discovery_found_fn found;
    void       *ctx;
} exo_discovery_config;

/* Zeroes cfg and fills the defaults (the zero values mean the same). */
void exo_discovery_config_init(exo_discovery_config *cfg);

/* Opens the sockets, joins the groups, sends the first announce and starts
 * the timers on loop (the calling thread must be the loop's thread).
 * Errors: EXO_EINVAL (bad node id, tcp port 0, group not a multicast
 * address of its family, no found callback, interval out of range), EXO_EIO
 * (no socket could be bound: port in use by a socket without address reuse,
 * or no multicast-capable interface at all). A family that fails alone is
 * logged at WARN and the other carries on. */
int exo_discovery_start(uv_loop_t *loop, const exo_discovery_config *cfg, exo_discovery **out,
                        exo_err *err);

/* Announces on every interface now (at most once per 100 ms; calls closer
 * together are absorbed by the last announce). For when a peer link drops. */
void exo_discovery_announce_now(exo_discovery *d);

/* Stops the timers and closes every handle; found() is never called after
 * this returns. Idempotent. */
void exo_discovery_close(exo_discovery *d);

/* Frees d (closing it first if needed). Call it after the loop has run the
 * handles' close callbacks; if it has not yet, the memory is released by
 * the last close callback instead, so never free d's loop before running it. */
void exo_discovery_free(exo_discovery *d);

/* Counters, for tests and the daemon's status page. */
typedef struct exo_discovery_stats {
    uint64_t sent;               /* multicast announces sent (one per interface) */
    uint64_t send_errors;
    uint64_t received;           /* datagrams read */
    uint64_t own;                /* valid packets carrying our own node id */
    uint64_t bad_format;
    uint64_t bad_version;
    uint64_t other_ns;
    uint64_t bad_mac;
    uint64_t valid;              /* valid packets from other nodes */
    uint64_t found;              /* found() calls */
    uint64_t found_limited;      /* found() calls suppressed by the 500 ms rate limit */
    uint64_t replies_sent;
    uint64_t replies_limited;    /* replies dropped by the token bucket */
    uint32_t ifaces4;            /* interfaces in use now */
    uint32_t ifaces6;
    bool     ipv4;               /* sockets open */
    bool     ipv6;
} exo_discovery_stats;

void exo_discovery_get_stats(const exo_discovery *d, exo_discovery_stats *out);

#endif
