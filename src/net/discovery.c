/* UDP multicast peer discovery (see discovery.h for the protocol).
 *
 * Shape: the sockets are created, bound and joined with plain system calls
 * and only then handed to libuv (uv_udp_open), so every way start can fail
 * happens before a libuv handle exists and start never has to return while
 * handles are still closing. Multicast options are set with setsockopt on
 * the socket itself because they are per interface (ifindex), which libuv's
 * string-based helpers do not express.
 *
 * Sending uses uv_udp_try_send, which is synchronous: the per-interface
 * IP_MULTICAST_IF / IPV6_MULTICAST_IF set just before a send applies to that
 * send and no queued datagram can leave on the wrong interface. A send that
 * would block is dropped and counted; the next announce follows in at most
 * interval_ms.
 *
 * Invariants: ifs4/ifs6 hold at most EXO_DISCOVERY_MAX_IFACES distinct
 * ifindexes; peers[] at most EXO_DISCOVERY_MAX_PEERS distinct (node id,
 * address) pairs; once closing is set, no found() call and no send happens. */
#include "net/discovery.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NS_PER_MS 1000000ull
#define RX_BUF 512          /* anything longer than a packet is rejected (UV_UDP_PARTIAL) */
#define MAX_LOGGED 64       /* senders we have written an INFO line about */
#define PEER_FORGET_MS 60000
#define ANNOUNCE_MIN_GAP_MS 100

static const uint8_t magic[4] = {'E', 'X', 'O', 'D'};

/* ---- codec ----------------------------------------------------------------- */

const char *exo_discovery_result_name(exo_discovery_result r)
{
    switch (r) {
    case EXO_DISCOVERY_OK:        return "ok";
    case EXO_DISCOVERY_EFORMAT:   return "malformed";
    case EXO_DISCOVERY_EVERSION:  return "other version";
    case EXO_DISCOVERY_EOTHER_NS: return "other namespace";
    case EXO_DISCOVERY_EBAD_MAC:  return "bad MAC";
    }
    return "?";
}

static bool is_lower_hex(uint8_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool exo_discovery_node_id_valid(const char *s)
{
    if (!s)
        return false;
    for (int i = 0; i < EXO_DISCOVERY_NODE_ID_LEN; i++)
        if (!is_lower_hex((uint8_t)s[i])) /* also stops at a NUL */
            return false;
    return s[EXO_DISCOVERY_NODE_ID_LEN] == 0;
}

static void packet_mac(const uint8_t *pkt, const uint8_t *key, uint8_t mac[16])
{
    crypto_generichash(mac, 16, pkt, EXO_DISCOVERY_MAC_OFFSET, key, EXO_DISCOVERY_KEY_LEN);
}

int exo_discovery_encode(const exo_discovery_packet *p, const uint8_t key[EXO_DISCOVERY_KEY_LEN],
                         uint8_t out[EXO_DISCOVERY_PACKET_LEN])
{
    if (p->kind > EXO_DISCOVERY_REPLY || p->tcp_port == 0 || !exo_discovery_node_id_valid(p->node_id))
        return EXO_EINVAL;
    memcpy(out, magic, 4);
    out[4] = EXO_DISCOVERY_VERSION;
    out[5] = p->kind;
    out[6] = out[7] = 0;
    memcpy(out + 8, p->ns_hash, EXO_DISCOVERY_NS_HASH_LEN);
    memcpy(out + 16, p->node_id, EXO_DISCOVERY_NODE_ID_LEN);
    out[48] = (uint8_t)(p->tcp_port & 0xff);
    out[49] = (uint8_t)(p->tcp_port >> 8);
    packet_mac(out, key, out + EXO_DISCOVERY_MAC_OFFSET);
    return 0;
}

exo_discovery_result exo_discovery_decode(const uint8_t *buf, size_t len,
                                          const uint8_t ns_hash[EXO_DISCOVERY_NS_HASH_LEN],
                                          const uint8_t key[EXO_DISCOVERY_KEY_LEN],
                                          exo_discovery_packet *out)
{
    if (len < 5 || memcmp(buf, magic, 4) != 0)
        return EXO_DISCOVERY_EFORMAT;
    out->version = buf[4];
    if (buf[4] == 0)
        return EXO_DISCOVERY_EFORMAT;
    if (buf[4] != EXO_DISCOVERY_VERSION)
        return EXO_DISCOVERY_EVERSION;
    if (len != EXO_DISCOVERY_PACKET_LEN)
        return EXO_DISCOVERY_EFORMAT;
    if (buf[5] > EXO_DISCOVERY_REPLY || buf[6] != 0 || buf[7] != 0)
        return EXO_DISCOVERY_EFORMAT;
    /* The namespace hash is public (it only routes packets to a cluster), so
     * a plain compare leaks nothing. */
    if (memcmp(buf + 8, ns_hash, EXO_DISCOVERY_NS_HASH_LEN) != 0)
        return EXO_DISCOVERY_EOTHER_NS;
    for (int i = 0; i < EXO_DISCOVERY_NODE_ID_LEN; i++)
        if (!is_lower_hex(buf[16 + i]))
            return EXO_DISCOVERY_EFORMAT;
    uint16_t port = (uint16_t)(buf[48] | buf[49] << 8);
    if (port == 0)
        return EXO_DISCOVERY_EFORMAT;
    uint8_t mac[16];
    packet_mac(buf, key, mac);
    if (crypto_verify_16(mac, buf + EXO_DISCOVERY_MAC_OFFSET) != 0)
        return EXO_DISCOVERY_EBAD_MAC;
    out->kind = buf[5];
    memcpy(out->ns_hash, buf + 8, EXO_DISCOVERY_NS_HASH_LEN);
    memcpy(out->node_id, buf + 16, EXO_DISCOVERY_NODE_ID_LEN);
    out->node_id[EXO_DISCOVERY_NODE_ID_LEN] = 0;
    out->tcp_port = port;
    return EXO_DISCOVERY_OK;
}

/* ---- state ------------------------------------------------------------------ */

typedef struct iface {
    unsigned       ifindex;
    char           name[IF_NAMESIZE];
    struct in_addr addr4;          /* IPv4: the address announces leave from */
    bool           joined;
    bool           seen;           /* present in the current scan */
    bool           fresh;          /* added by the current scan */
    bool           join_logged;    /* a join failure was logged (once per interface) */
    bool           send_failing;   /* log send errors on transitions only */
} iface;

typedef struct peer {
    char                    node_id[EXO_DISCOVERY_NODE_ID_LEN + 1];
    struct sockaddr_storage addr;  /* source IP + advertised TCP port */
    uint64_t                last_seen_ns;
    uint64_t                last_found_ns;
} peer;

typedef struct logged_sender {
    struct sockaddr_storage ip;    /* port zeroed */
    unsigned                what;  /* bit per exo_discovery_result already logged */
} logged_sender;

struct exo_discovery {
    uv_loop_t *loop;
    char       node_id[EXO_DISCOVERY_NODE_ID_LEN + 1];
    uint8_t    ns_hash[EXO_DISCOVERY_NS_HASH_LEN];
    uint8_t    key[EXO_DISCOVERY_KEY_LEN];
    uint16_t   udp_port;
    uint32_t   interval_ms;
    exo_discovery_found_fn found;
    void      *ctx;

    uint8_t    announce_pkt[EXO_DISCOVERY_PACKET_LEN];
    uint8_t    reply_pkt[EXO_DISCOVERY_PACKET_LEN];
    struct sockaddr_in  group4;
    struct sockaddr_in6 group6;

    int        fd4, fd6;           /* -1 if that family is off; owned by udp4/udp6 once opened */
    uv_udp_t   udp4, udp6;
    bool       udp4_init, udp6_init;
    uv_timer_t announce_timer, rescan_timer;
    bool       timers_init;
    int        burst_step;
    uint64_t   last_announce_ns;

    iface      ifs4[EXO_DISCOVERY_MAX_IFACES];
    iface      ifs6[EXO_DISCOVERY_MAX_IFACES];
    unsigned   n4, n6;
    bool       overflow_logged;

    peer       peers[EXO_DISCOVERY_MAX_PEERS];
    unsigned   n_peers;

    double     reply_tokens;
    uint64_t   reply_tokens_ns;

    logged_sender logged[MAX_LOGGED];
    unsigned   n_logged;

    uint8_t    rx4[RX_BUF], rx6[RX_BUF];

    int        pending_closes;
    bool       closing;
    bool       free_requested;
    exo_discovery_stats stats;
};

/* ---- small helpers ---------------------------------------------------------- */

static const char *sa_ip(const struct sockaddr *sa, char *buf, size_t len)
{
    buf[0] = 0;
    if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)len);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, buf, (socklen_t)len);
        char name[IF_NAMESIZE];
        size_t n = strlen(buf);
        if (s6->sin6_scope_id && if_indextoname(s6->sin6_scope_id, name) && n + 1 + strlen(name) < len)
            snprintf(buf + n, len - n, "%%%s", name);
    }
    return buf;
}

static bool sa_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const struct sockaddr_in *)a, *y = (const struct sockaddr_in *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)a, *y = (const struct sockaddr_in6 *)b;
    return x->sin6_port == y->sin6_port && x->sin6_scope_id == y->sin6_scope_id &&
           memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

/* Copies an IPv4/IPv6 source address with its port replaced. */
static void sa_with_port(struct sockaddr_storage *out, const struct sockaddr *src, uint16_t port)
{
    memset(out, 0, sizeof *out);
    if (src->sa_family == AF_INET) {
        struct sockaddr_in *o = (struct sockaddr_in *)out;
        o->sin_family = AF_INET;
        o->sin_addr = ((const struct sockaddr_in *)src)->sin_addr;
        o->sin_port = htons(port);
    } else {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)src;
        struct sockaddr_in6 *o = (struct sockaddr_in6 *)out;
        o->sin6_family = AF_INET6;
        o->sin6_addr = s->sin6_addr;
        o->sin6_scope_id = s->sin6_scope_id;
        o->sin6_port = htons(port);
    }
}

/* INFO once per sender IP and kind of trouble; DEBUG after that, and once
 * the table is full (a flood of spoofed sources must not flood the log). */
static bool first_complaint(exo_discovery *d, const struct sockaddr *src, exo_discovery_result r)
{
    struct sockaddr_storage ip;
    sa_with_port(&ip, src, 0);
    unsigned bit = 1u << r;
    for (unsigned i = 0; i < d->n_logged; i++) {
        if (sa_equal(&d->logged[i].ip, &ip)) {
            if (d->logged[i].what & bit)
                return false;
            d->logged[i].what |= bit;
            return true;
        }
    }
    if (d->n_logged == MAX_LOGGED)
        return false;
    d->logged[d->n_logged].ip = ip;
    d->logged[d->n_logged].what = bit;
    d->n_logged++;
    return true;
}

/* ---- sending ---------------------------------------------------------------- */

static void note_send(exo_discovery *d, iface *ifc, const char *fam, int rc)
{
    if (rc >= 0) {
        d->stats.sent++;
        if (ifc->send_failing)
            EXO_LOG_DEBUG("discovery: %s announces on %s work again", fam, ifc->name);
        ifc->send_failing = false;
        return;
    }
    d->stats.send_errors++;
    if (!ifc->send_failing)
        EXO_LOG_DEBUG("discovery: %s announce on %s failed: %s", fam, ifc->name, uv_strerror(rc));
    ifc->send_failing = true;
}

static void send4(exo_discovery *d, iface *ifc)
{
    struct ip_mreqn mr = {.imr_address = ifc->addr4, .imr_ifindex = (int)ifc->ifindex};
    int rc;
    if (setsockopt(d->fd4, IPPROTO_IP, IP_MULTICAST_IF, &mr, sizeof mr) < 0) {
        rc = uv_translate_sys_error(errno);
    } else {
        uv_buf_t b = uv_buf_init((char *)d->announce_pkt, EXO_DISCOVERY_PACKET_LEN);
        rc = uv_udp_try_send(&d->udp4, &b, 1, (const struct sockaddr *)&d->group4);
    }
    note_send(d, ifc, "IPv4", rc);
}

static void send6(exo_discovery *d, iface *ifc)
{
    unsigned idx = ifc->ifindex;
    int rc;
    if (setsockopt(d->fd6, IPPROTO_IPV6, IPV6_MULTICAST_IF, &idx, sizeof idx) < 0) {
        rc = uv_translate_sys_error(errno);
    } else {
        struct sockaddr_in6 to = d->group6;
        to.sin6_scope_id = idx; /* a link-scope group means nothing without its link */
        uv_buf_t b = uv_buf_init((char *)d->announce_pkt, EXO_DISCOVERY_PACKET_LEN);
        rc = uv_udp_try_send(&d->udp6, &b, 1, (const struct sockaddr *)&to);
    }
    note_send(d, ifc, "IPv6", rc);
}

static void announce_all(exo_discovery *d)
{
    if (d->closing)
        return;
    for (unsigned i = 0; i < d->n4; i++)
        send4(d, &d->ifs4[i]);
    for (unsigned i = 0; i < d->n6; i++)
        send6(d, &d->ifs6[i]);
    d->last_announce_ns = exo_clock_ns();
}

static bool take_reply_token(exo_discovery *d, uint64_t now)
{
    double dt = (double)(now - d->reply_tokens_ns) / 1e9;
    d->reply_tokens_ns = now;
    d->reply_tokens += dt * EXO_DISCOVERY_REPLY_PER_S;
    if (d->reply_tokens > EXO_DISCOVERY_REPLY_BURST)
        d->reply_tokens = EXO_DISCOVERY_REPLY_BURST;
    if (d->reply_tokens < 1.0)
        return false;
    d->reply_tokens -= 1.0;
    return true;
}

static void send_reply(exo_discovery *d, const struct sockaddr *src, uint64_t now)
{
    if (!take_reply_token(d, now)) {
        d->stats.replies_limited++;
        return;
    }
    struct sockaddr_storage to;
    sa_with_port(&to, src, d->udp_port);
    uv_udp_t *h = src->sa_family == AF_INET ? &d->udp4 : &d->udp6;
    uv_buf_t b = uv_buf_init((char *)d->reply_pkt, EXO_DISCOVERY_PACKET_LEN);
    int rc = uv_udp_try_send(h, &b, 1, (const struct sockaddr *)&to);
    if (rc < 0) {
        char ip[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
        EXO_LOG_DEBUG("discovery: reply to %s failed: %s", sa_ip(src, ip, sizeof ip), uv_strerror(rc));
        d->stats.send_errors++;
        return;
    }
    d->stats.replies_sent++;
}

/* ---- peers ------------------------------------------------------------------ */

static bool node_heard_since(const exo_discovery *d, const char *node_id, uint64_t since_ns)
{
    for (unsigned i = 0; i < d->n_peers; i++)
        if (d->peers[i].last_seen_ns >= since_ns && strcmp(d->peers[i].node_id, node_id) == 0)
            return true;
    return false;
}

/* The entry for (node id, addr), created if new (then *fresh is set),
 * evicting the least recently heard pair when the table is full. */
static peer *peer_touch(exo_discovery *d, const char *node_id, const struct sockaddr_storage *addr,
                        uint64_t now, bool *fresh)
{
    *fresh = false;
    for (unsigned i = 0; i < d->n_peers; i++) {
        peer *p = &d->peers[i];
        if (strcmp(p->node_id, node_id) == 0 && sa_equal(&p->addr, addr)) {
            p->last_seen_ns = now;
            return p;
        }
    }
    unsigned slot = d->n_peers;
    if (slot == EXO_DISCOVERY_MAX_PEERS) {
        slot = 0;
        for (unsigned i = 1; i < d->n_peers; i++)
            if (d->peers[i].last_seen_ns < d->peers[slot].last_seen_ns)
                slot = i;
    } else {
        d->n_peers++;
    }
    peer *p = &d->peers[slot];
    memcpy(p->node_id, node_id, sizeof p->node_id);
    p->addr = *addr;
    p->last_seen_ns = now;
    p->last_found_ns = 0;
    *fresh = true;
    return p;
}

static void peers_forget_old(exo_discovery *d, uint64_t now)
{
    uint64_t horizon = (uint64_t)PEER_FORGET_MS * NS_PER_MS;
    for (unsigned i = 0; i < d->n_peers;) {
        if (now - d->peers[i].last_seen_ns > horizon)
            d->peers[i] = d->peers[--d->n_peers];
        else
            i++;
    }
}

/* ---- receiving -------------------------------------------------------------- */

static void handle_packet(exo_discovery *d, const uint8_t *buf, size_t len, const struct sockaddr *src)
{
    char ip[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    exo_discovery_packet pkt;
    exo_discovery_result r = exo_discovery_decode(buf, len, d->ns_hash, d->key, &pkt);
    switch (r) {
    case EXO_DISCOVERY_OK:
        break;
    case EXO_DISCOVERY_EFORMAT:
        d->stats.bad_format++;
        if (first_complaint(d, src, r))
            EXO_LOG_DEBUG("discovery: malformed %zu-byte datagram from %s", len, sa_ip(src, ip, sizeof ip));
        return;
    case EXO_DISCOVERY_EVERSION:
        d->stats.bad_version++;
        if (first_complaint(d, src, r))
            EXO_LOG_INFO("discovery: %s speaks discovery v%u (we speak v%d); ignoring it",
                         sa_ip(src, ip, sizeof ip), pkt.version, EXO_DISCOVERY_VERSION);
        return;
    case EXO_DISCOVERY_EOTHER_NS:
        d->stats.other_ns++; /* another cluster on the same LAN: normal */
        return;
    case EXO_DISCOVERY_EBAD_MAC:
        d->stats.bad_mac++;
        if (first_complaint(d, src, r))
            EXO_LOG_INFO("discovery: %s announces our namespace but its MAC does not verify "
                         "(another cluster secret?); ignoring it", sa_ip(src, ip, sizeof ip));
        return;
    }
    if (strcmp(pkt.node_id, d->node_id) == 0) {
        d->stats.own++;
        return;
    }
    d->stats.valid++;
    uint64_t now = exo_clock_ns();
    uint64_t window = (uint64_t)EXO_DISCOVERY_REPLY_AFTER_MS * NS_PER_MS;
    bool recent = node_heard_since(d, pkt.node_id, now > window ? now - window : 0);
    struct sockaddr_storage at;
    sa_with_port(&at, src, pkt.tcp_port);
    bool fresh;
    peer *p = peer_touch(d, pkt.node_id, &at, now, &fresh);
    /* Replies never answer replies, or two nodes could bounce them forever. */
    if (pkt.kind == EXO_DISCOVERY_ANNOUNCE && !recent)
        send_reply(d, src, now);
    if (!fresh && now - p->last_found_ns < (uint64_t)EXO_DISCOVERY_FOUND_EVERY_MS * NS_PER_MS) {
        d->stats.found_limited++;
        return;
    }
    p->last_found_ns = now;
    d->stats.found++;
    if (fresh)
        EXO_LOG_DEBUG("discovery: node %s at %s tcp port %u", pkt.node_id, sa_ip(src, ip, sizeof ip),
                      pkt.tcp_port);
    d->found(d->ctx, pkt.node_id, (const struct sockaddr *)&at);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    exo_discovery *d = h->data;
    uint8_t *mem = (uv_udp_t *)h == &d->udp4 ? d->rx4 : d->rx6;
    *buf = uv_buf_init((char *)mem, RX_BUF);
}

static void on_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *src,
                    unsigned flags)
{
    exo_discovery *d = h->data;
    if (d->closing)
        return;
    if (nread < 0) {
        EXO_LOG_DEBUG("discovery: receive: %s", uv_strerror((int)nread));
        return;
    }
    if (!src) /* nothing more to read now */
        return;
    d->stats.received++;
    if (flags & UV_UDP_PARTIAL) {
        d->stats.bad_format++;
        return;
    }
    if (src->sa_family != AF_INET && src->sa_family != AF_INET6)
        return;
    handle_packet(d, (const uint8_t *)buf->base, (size_t)nread, src);
}

/* ---- interfaces ------------------------------------------------------------- */

typedef struct cand {
    unsigned       ifindex;
    char           name[IF_NAMESIZE];
    struct in_addr addr4;
} cand;

/* The interface index of a getifaddrs name; IPv4 alias labels ("eth0:1")
 * are not device names, so fall back to the part before the colon. */
static unsigned name_index(const char *name, char base[IF_NAMESIZE])
{
    snprintf(base, IF_NAMESIZE, "%s", name);
    unsigned idx = if_nametoindex(base);
    if (idx)
        return idx;
    char *colon = strchr(base, ':');
    if (!colon)
        return 0;
    *colon = 0;
    return if_nametoindex(base);
}

static void cand_add(cand *list, unsigned *n, bool *overflow, unsigned ifindex, const char *name,
                     struct in_addr a4)
{
    for (unsigned i = 0; i < *n; i++)
        if (list[i].ifindex == ifindex)
            return; /* first address of an interface wins */
    if (*n == EXO_DISCOVERY_MAX_IFACES) {
        *overflow = true;
        return;
    }
    list[*n].ifindex = ifindex;
    snprintf(list[*n].name, sizeof list[*n].name, "%s", name);
    list[*n].addr4 = a4;
    (*n)++;
}

static int join_leave(exo_discovery *d, int family, unsigned ifindex, bool join)
{
    int rc;
    if (family == AF_INET) {
        struct ip_mreqn mr = {.imr_multiaddr = d->group4.sin_addr, .imr_ifindex = (int)ifindex};
        rc = setsockopt(d->fd4, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &mr, sizeof mr);
    } else {
        struct ipv6_mreq mr = {.ipv6mr_multiaddr = d->group6.sin6_addr, .ipv6mr_interface = ifindex};
        rc = setsockopt(d->fd6, IPPROTO_IPV6, join ? IPV6_ADD_MEMBERSHIP : IPV6_DROP_MEMBERSHIP, &mr,
                        sizeof mr);
    }
    if (rc < 0 && join && errno == EADDRINUSE)
        return 0; /* already a member */
    return rc < 0 ? -errno : 0;
}

static void reconcile(exo_discovery *d, int family, const cand *c, unsigned nc)
{
    iface *ifs = family == AF_INET ? d->ifs4 : d->ifs6;
    unsigned *n = family == AF_INET ? &d->n4 : &d->n6;
    const char *fam = family == AF_INET ? "IPv4" : "IPv6";
    for (unsigned i = 0; i < *n; i++)
        ifs[i].seen = ifs[i].fresh = false;
    for (unsigned k = 0; k < nc; k++) {
        iface *f = NULL;
        for (unsigned i = 0; i < *n; i++)
            if (ifs[i].ifindex == c[k].ifindex)
                f = &ifs[i];
        if (!f) {
            if (*n == EXO_DISCOVERY_MAX_IFACES)
                continue; /* cand lists are capped at the same size: unreachable */
            f = &ifs[(*n)++];
            memset(f, 0, sizeof *f);
            f->ifindex = c[k].ifindex;
            f->fresh = true;
            EXO_LOG_DEBUG("discovery: %s interface %s (index %u) up", fam, c[k].name, c[k].ifindex);
        }
        snprintf(f->name, sizeof f->name, "%s", c[k].name);
        f->addr4 = c[k].addr4;
        f->seen = true;
    }
    for (unsigned i = 0; i < *n;) {
        if (ifs[i].seen) {
            i++;
            continue;
        }
        /* The kernel drops memberships of a device that is gone; this only
         * matters for one that lost its addresses or its multicast flag. */
        if (ifs[i].joined)
            join_leave(d, family, ifs[i].ifindex, false);
        EXO_LOG_DEBUG("discovery: %s interface %s (index %u) gone", fam, ifs[i].name, ifs[i].ifindex);
        ifs[i] = ifs[--*n];
    }
    for (unsigned i = 0; i < *n; i++) {
        iface *f = &ifs[i];
        if (!f->joined) {
            int rc = join_leave(d, family, f->ifindex, true);
            if (rc == 0) {
                f->joined = true;
            } else if (!f->join_logged) {
                f->join_logged = true;
                EXO_LOG_DEBUG("discovery: joining the %s group on %s failed: %s (still announcing there)",
                              fam, f->name, strerror(-rc));
            }
        }
    }
}

static void restart_burst(exo_discovery *d);

/* Re-reads the interfaces, joins new ones, drops vanished ones and, unless
 * initial, restarts the announce burst when one is new. */
static void rescan(exo_discovery *d, bool initial)
{
    struct ifaddrs *all;
    if (getifaddrs(&all) < 0) {
        /* Keep the interfaces we have; the next scan tries again. */
        EXO_LOG_DEBUG("discovery: getifaddrs: %s", strerror(errno));
        return;
    }
    static const struct in_addr none;
    cand *c4 = exo_calloc(EXO_DISCOVERY_MAX_IFACES, sizeof *c4);
    cand *c6 = exo_calloc(EXO_DISCOVERY_MAX_IFACES, sizeof *c6);
    unsigned n4 = 0, n6 = 0;
    bool overflow = false;
    for (struct ifaddrs *a = all; a; a = a->ifa_next) {
        if (!a->ifa_addr || !a->ifa_name || !(a->ifa_flags & IFF_UP))
            continue;
        char base[IF_NAMESIZE];
        int fam = a->ifa_addr->sa_family;
        if (fam == AF_INET && d->fd4 >= 0 && (a->ifa_flags & (IFF_MULTICAST | IFF_LOOPBACK))) {
            unsigned idx = name_index(a->ifa_name, base);
            if (idx)
                cand_add(c4, &n4, &overflow, idx, base, ((struct sockaddr_in *)a->ifa_addr)->sin_addr);
        } else if (fam == AF_INET6 && d->fd6 >= 0 && (a->ifa_flags & IFF_MULTICAST) &&
                   !(a->ifa_flags & IFF_LOOPBACK)) {
            /* IPv6 multicast does not work on loopback; hosts hear each other on real links. */
            unsigned idx = name_index(a->ifa_name, base);
            if (idx)
                cand_add(c6, &n6, &overflow, idx, base, none);
        }
    }
    freeifaddrs(all);
    if (overflow && !d->overflow_logged) {
        d->overflow_logged = true;
        EXO_LOG_WARN("discovery: more than %d interfaces of one family; using the first %d",
                     EXO_DISCOVERY_MAX_IFACES, EXO_DISCOVERY_MAX_IFACES);
    }
    reconcile(d, AF_INET, c4, n4);
    reconcile(d, AF_INET6, c6, n6);
    exo_free(c4);
    exo_free(c6);
    d->stats.ifaces4 = d->n4;
    d->stats.ifaces6 = d->n6;
    bool fresh = false;
    for (unsigned i = 0; i < d->n4; i++)
        fresh |= d->ifs4[i].fresh;
    for (unsigned i = 0; i < d->n6; i++)
        fresh |= d->ifs6[i].fresh;
    /* A link that just came up may not have a usable source address yet
     * (IPv6 duplicate address detection takes about a second), so it gets
     * the whole startup burst, not one announce that is likely to fail. */
    if (fresh && !initial && !d->closing)
        restart_burst(d);
}

/* ---- timers ----------------------------------------------------------------- */

/* Gaps between the startup announces (at 0, 100, 200, 400, 800 ms). */
static const uint32_t burst_gap_ms[] = {100, 100, 200, 400};
#define BURST_STEPS ((int)(sizeof burst_gap_ms / sizeof burst_gap_ms[0]))

static void on_announce_timer(uv_timer_t *t);

static void arm_announce(exo_discovery *d)
{
    uint64_t gap = d->burst_step < BURST_STEPS ? burst_gap_ms[d->burst_step] : d->interval_ms;
    uv_timer_start(&d->announce_timer, on_announce_timer, gap, 0);
}

static void on_announce_timer(uv_timer_t *t)
{
    exo_discovery *d = t->data;
    announce_all(d);
    if (d->burst_step < BURST_STEPS)
        d->burst_step++;
    arm_announce(d);
}

static void restart_burst(exo_discovery *d)
{
    d->burst_step = 0;
    announce_all(d);
    arm_announce(d);
}

static void on_rescan_timer(uv_timer_t *t)
{
    exo_discovery *d = t->data;
    rescan(d, false);
    peers_forget_old(d, exo_clock_ns());
}

/* ---- sockets ---------------------------------------------------------------- */

static int set_int(int fd, int level, int opt, int v)
{
    return setsockopt(fd, level, opt, &v, sizeof v);
}

/* A bound, configured datagram socket, or -1 with err set. */
static int open_socket(int family, uint16_t port, exo_err *err)
{
    const char *what = family == AF_INET ? "0.0.0.0" : "[::]";
    int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        exo_err_set(err, EXO_EIO, "discovery: IPv%d socket: %s", family == AF_INET ? 4 : 6, strerror(errno));
        return -1;
    }
    int rc = set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    if (rc == 0 && family == AF_INET6)
        rc = set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
    if (rc < 0) {
        exo_err_set(err, EXO_EIO, "discovery: %s:%u: setsockopt: %s", what, port, strerror(errno));
        close(fd);
        return -1;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    if (family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)&ss;
        s->sin_family = AF_INET;
        s->sin_port = htons(port);
        sl = sizeof *s;
    } else {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
        s->sin6_family = AF_INET6;
        s->sin6_port = htons(port);
        sl = sizeof *s;
    }
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0) {
        int e = errno;
        exo_err_set(err, EXO_EIO, "discovery: bind %s:%u: %s%s", what, port, strerror(e),
                    e == EADDRINUSE ? " (another program holds the port without address reuse)" : "");
        close(fd);
        return -1;
    }
    /* Hop limit 1: announces stay on the link. Loop on: other daemons on this
     * host must hear us. MULTICAST_ALL off: only the groups this socket
     * joined, not every group any socket on the host joined on this port. */
    if (family == AF_INET) {
        rc = set_int(fd, IPPROTO_IP, IP_MULTICAST_TTL, 1);
        if (rc == 0)
            rc = set_int(fd, IPPROTO_IP, IP_MULTICAST_LOOP, 1);
        (void)set_int(fd, IPPROTO_IP, IP_MULTICAST_ALL, 0);
    } else {
        rc = set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, 1);
        if (rc == 0)
            rc = set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 1);
#ifdef IPV6_MULTICAST_ALL
        (void)set_int(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
#endif
    }
    if (rc < 0) {
        exo_err_set(err, EXO_EIO, "discovery: %s:%u: multicast options: %s", what, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- lifecycle -------------------------------------------------------------- */

void exo_discovery_config_init(exo_discovery_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->udp_port = EXO_DISCOVERY_DEFAULT_PORT;
    cfg->group4 = EXO_DISCOVERY_DEFAULT_GROUP4;
    cfg->group6 = EXO_DISCOVERY_DEFAULT_GROUP6;
    cfg->interval_ms = EXO_DISCOVERY_DEFAULT_INTERVAL_MS;
}

static void release(exo_discovery *d)
{
    sodium_memzero(d->key, sizeof d->key);
    exo_free(d);
}

static void on_closed(uv_handle_t *h)
{
    exo_discovery *d = h->data;
    if (--d->pending_closes == 0 && d->free_requested)
        release(d);
}

static void close_handle(exo_discovery *d, uv_handle_t *h)
{
    d->pending_closes++;
    uv_close(h, on_closed);
}

void exo_discovery_close(exo_discovery *d)
{
    if (!d || d->closing)
        return;
    d->closing = true;
    if (d->timers_init) {
        uv_timer_stop(&d->announce_timer);
        uv_timer_stop(&d->rescan_timer);
        close_handle(d, (uv_handle_t *)&d->announce_timer);
        close_handle(d, (uv_handle_t *)&d->rescan_timer);
    }
    /* Closing the handle closes the socket, which leaves the groups. */
    if (d->udp4_init)
        close_handle(d, (uv_handle_t *)&d->udp4);
    else if (d->fd4 >= 0)
        close(d->fd4);
    if (d->udp6_init)
        close_handle(d, (uv_handle_t *)&d->udp6);
    else if (d->fd6 >= 0)
        close(d->fd6);
    d->fd4 = d->fd6 = -1;
}

void exo_discovery_free(exo_discovery *d)
{
    if (!d)
        return;
    exo_discovery_close(d);
    if (d->pending_closes > 0) {
        d->free_requested = true; /* the last close callback frees */
        return;
    }
    release(d);
}

void exo_discovery_announce_now(exo_discovery *d)
{
    if (!d || d->closing)
        return;
    if (exo_clock_ns() - d->last_announce_ns < (uint64_t)ANNOUNCE_MIN_GAP_MS * NS_PER_MS)
        return;
    announce_all(d);
}

void exo_discovery_get_stats(const exo_discovery *d, exo_discovery_stats *out)
{
    *out = d->stats;
    out->ipv4 = d->udp4_init;
    out->ipv6 = d->udp6_init;
}

/* Hands fd to a libuv handle. On failure the handle (if initialised) is
 * left for exo_discovery_close, and fd is closed here unless libuv owns it. */
static int open_handle(exo_discovery *d, uv_udp_t *h, bool *inited, int *fd, exo_err *err)
{
    int rc = uv_udp_init(d->loop, h);
    if (rc < 0) {
        close(*fd);
        *fd = -1;
        return exo_err_set(err, EXO_EIO, "discovery: uv_udp_init: %s", uv_strerror(rc));
    }
    h->data = d;
    *inited = true;
    rc = uv_udp_open(h, *fd);
    if (rc < 0) {
        close(*fd);
        *fd = -1;
        return exo_err_set(err, EXO_EIO, "discovery: uv_udp_open: %s", uv_strerror(rc));
    }
    rc = uv_udp_recv_start(h, on_alloc, on_recv);
    if (rc < 0)
        return exo_err_set(err, EXO_EIO, "discovery: uv_udp_recv_start: %s", uv_strerror(rc));
    return 0;
}

int exo_discovery_start(uv_loop_t *loop, const exo_discovery_config *cfg, exo_discovery **out,
                        exo_err *err)
{
    *out = NULL;
    if (!exo_discovery_node_id_valid(cfg->node_id))
        return exo_err_set(err, EXO_EINVAL, "discovery: node id must be %d lowercase hex chars",
                           EXO_DISCOVERY_NODE_ID_LEN);
    if (cfg->tcp_port == 0)
        return exo_err_set(err, EXO_EINVAL, "discovery: advertised tcp port is 0");
    if (!cfg->found)
        return exo_err_set(err, EXO_EINVAL, "discovery: no found callback");
    if ((cfg->interval_ms && cfg->interval_ms < 10) || cfg->interval_ms > 3600u * 1000u)
        return exo_err_set(err, EXO_EINVAL, "discovery: interval %u ms is not within 10 ms .. 1 hour",
                           cfg->interval_ms);
    const char *g4 = cfg->group4 ? cfg->group4 : EXO_DISCOVERY_DEFAULT_GROUP4;
    const char *g6 = cfg->group6 ? cfg->group6 : EXO_DISCOVERY_DEFAULT_GROUP6;
    uint16_t port = cfg->udp_port ? cfg->udp_port : EXO_DISCOVERY_DEFAULT_PORT;
    struct sockaddr_in group4;
    struct sockaddr_in6 group6;
    if (uv_ip4_addr(g4, port, &group4) != 0 || !IN_MULTICAST(ntohl(group4.sin_addr.s_addr)))
        return exo_err_set(err, EXO_EINVAL, "discovery: %s is not an IPv4 multicast group", g4);
    if (uv_ip6_addr(g6, port, &group6) != 0 || !IN6_IS_ADDR_MULTICAST(&group6.sin6_addr))
        return exo_err_set(err, EXO_EINVAL, "discovery: %s is not an IPv6 multicast group", g6);
    if (sodium_init() < 0)
        return exo_err_set(err, EXO_EINTERNAL, "discovery: libsodium failed to initialise");

    exo_discovery *d = exo_calloc(1, sizeof *d);
    d->loop = loop;
    memcpy(d->node_id, cfg->node_id, EXO_DISCOVERY_NODE_ID_LEN);
    memcpy(d->ns_hash, cfg->ns_hash, sizeof d->ns_hash);
    memcpy(d->key, cfg->announce_key, sizeof d->key);
    d->udp_port = port;
    d->interval_ms = cfg->interval_ms ? cfg->interval_ms : EXO_DISCOVERY_DEFAULT_INTERVAL_MS;
    d->found = cfg->found;
    d->ctx = cfg->ctx;
    d->group4 = group4;
    d->group6 = group6;
    d->reply_tokens = EXO_DISCOVERY_REPLY_BURST;
    d->reply_tokens_ns = exo_clock_ns();
    exo_discovery_packet p = {.kind = EXO_DISCOVERY_ANNOUNCE, .tcp_port = cfg->tcp_port};
    memcpy(p.ns_hash, d->ns_hash, sizeof p.ns_hash);
    memcpy(p.node_id, d->node_id, sizeof p.node_id);
    exo_discovery_encode(&p, d->key, d->announce_pkt); /* inputs validated above */
    p.kind = EXO_DISCOVERY_REPLY;
    exo_discovery_encode(&p, d->key, d->reply_pkt);

    exo_err e4 = {0}, e6 = {0};
    d->fd4 = open_socket(AF_INET, port, &e4);
    d->fd6 = cfg->disable_ipv6 ? -1 : open_socket(AF_INET6, port, &e6);
    if (d->fd4 < 0 && d->fd6 < 0) {
        if (cfg->disable_ipv6)
            exo_err_set(err, EXO_EIO, "%s", e4.msg);
        else
            exo_err_set(err, EXO_EIO, "%s; %s", e4.msg, e6.msg);
        release(d);
        return EXO_EIO;
    }
    rescan(d, true);
    if (d->n4 == 0 && d->n6 == 0) { /* could also be getifaddrs failing: logged at DEBUG */
        exo_discovery_close(d);
        release(d);
        return exo_err_set(err, EXO_EIO, "discovery: no multicast-capable network interface");
    }
    if (d->fd4 < 0)
        EXO_LOG_WARN("discovery: IPv4 off: %s", e4.msg);
    if (d->fd6 < 0 && !cfg->disable_ipv6)
        EXO_LOG_WARN("discovery: IPv6 off: %s", e6.msg);

    int rc = 0;
    if (d->fd4 >= 0)
        rc = open_handle(d, &d->udp4, &d->udp4_init, &d->fd4, err);
    if (rc == 0 && d->fd6 >= 0)
        rc = open_handle(d, &d->udp6, &d->udp6_init, &d->fd6, err);
    if (rc < 0) {
        exo_discovery_free(d); /* handles close on the loop; the last one frees d */
        return rc;
    }
    uv_timer_init(loop, &d->announce_timer);
    uv_timer_init(loop, &d->rescan_timer);
    d->announce_timer.data = d->rescan_timer.data = d;
    d->timers_init = true;
    restart_burst(d);
    uv_timer_start(&d->rescan_timer, on_rescan_timer, EXO_DISCOVERY_RESCAN_MS, EXO_DISCOVERY_RESCAN_MS);
    d->stats.ifaces4 = d->n4;
    d->stats.ifaces6 = d->n6;
    EXO_LOG_INFO("discovery: udp port %u, %u IPv4 and %u IPv6 interfaces, announcing every %u ms", port,
                 d->n4, d->n6, d->interval_ms);
    *out = d;
    return 0;
}
