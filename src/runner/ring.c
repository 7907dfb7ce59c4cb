/* The runner ring (see ring.h): TCP links, the handshake, a queued sender
 * and the ring all-reduce. */
#include "runner/ring.h"

#include "core/alloc.h"
#include "core/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEADER_BYTES 16
#define MSG_PING     0x7fff0000u /* liveness, from the sender thread; never seen by callers */
#define MAGIC        "EXORING1"
#define DEFAULT_TIMEOUT_MS 30000
#define SOCKET_BUFFER (4 << 20) /* a 512-token hidden-state chunk of a 2k-wide model */

typedef struct qitem {
    struct qitem *next;
    size_t        len, off;
    unsigned char data[];
} qitem;

struct exo_ring {
    int rank, world, timeout_ms;
    int next_fd, prev_fd;
    /* receiving */
    unsigned char hdr[HEADER_BYTES];
    void  *rbuf;
    size_t rcap;
    /* sending */
    pthread_t       sender;
    bool            sender_started, stopping;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    qitem          *head, *tail;
    int             send_errno; /* the sender's failure, sticky */
    float          *stage;      /* an all-reduce chunk of several rows, gathered to send */
    size_t          stage_cap;
    uint64_t        last_rx_ns; /* when prev last said anything (a frame or a ping) */
};

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = exo_clock_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
}

/* ---- plain socket I/O with deadlines ------------------------------------------ */

static int wait_fd(int fd, short events, uint64_t deadline_ns, exo_err *err)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, ms_left(deadline_ns));
        if (rc > 0)
            return 0;
        if (rc == 0)
            return exo_err_set(err, EXO_ETIMEDOUT, "ring: no data from the peer in time");
        if (errno != EINTR)
            return exo_err_set(err, EXO_EIO, "ring: poll: %s", strerror(errno));
    }
}

/* How long a receive spins on the socket before it sleeps in poll: a
 * step's answer from the next rank often comes within tens of microseconds,
 * and waking from poll costs about that much again on these VMs. */
#define SPIN_NS 50000

static int read_full(int fd, void *buf, size_t n, uint64_t deadline_ns, exo_err *err)
{
    unsigned char *p = buf;
    uint64_t spin_until = exo_clock_ns() + SPIN_NS;
    while (n) {
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return exo_err_set(err, EXO_EIO, "ring: the previous rank closed the link");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return exo_err_set(err, EXO_EIO, "ring: receive: %s", strerror(errno));
        if (exo_clock_ns() < spin_until) {
            __builtin_ia32_pause();
            continue;
        }
        int rc = wait_fd(fd, POLLIN, deadline_ns, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n, uint64_t deadline_ns, exo_err *err)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return exo_err_set(err, EXO_EIO, "ring: send: %s", strerror(errno));
        int rc = wait_fd(fd, POLLOUT, deadline_ns, err);
        if (rc)
            return rc;
    }
    return 0;
}

static void tune(int fd)
{
    int one = 1, buf = SOCKET_BUFFER;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int exo_ring_listen(int port, int *fd_out, int *port_out, exo_err *err)
{
    *fd_out = -1;
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (fd >= 0) {
        int off = 0;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)port);
        len = sizeof *a;
    } else { /* no IPv6 in this kernel */
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)port);
        len = sizeof *a;
    }
    if (fd < 0)
        return exo_err_set(err, EXO_EIO, "ring: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 8)) {
        int e = errno;
        close(fd);
        return exo_err_set(err, EXO_EIO, "ring: listen on port %d: %s", port, strerror(e));
    }
    len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

/* ---- handshake -------------------------------------------------------------------
 * connector -> acceptor: MAGIC, u32 rank of the connector, nonce_c
 * acceptor -> connector: nonce_a, HMAC(key, "A" || nonce_c || nonce_a || rank)
 * connector -> acceptor: HMAC(key, "C" || nonce_a || nonce_c || rank)
 * The acceptor also checks that the connector is its prev rank. */

#define NONCE 32

static void mac(const uint8_t *key, char who, const uint8_t *n1, const uint8_t *n2, uint32_t rank,
                uint8_t out[crypto_auth_BYTES])
{
    uint8_t msg[1 + 2 * NONCE + 4];
    msg[0] = (uint8_t)who;
    memcpy(msg + 1, n1, NONCE);
    memcpy(msg + 1 + NONCE, n2, NONCE);
    put_u32(msg + 1 + 2 * NONCE, rank);
    crypto_auth(out, msg, sizeof msg, key);
}

static int hello_connector(int fd, const exo_ring_config *c, uint64_t deadline, exo_err *err)
{
    uint8_t out[8 + 4 + NONCE], in[NONCE + crypto_auth_BYTES], want[crypto_auth_BYTES];
    memcpy(out, MAGIC, 8);
    put_u32(out + 8, (uint32_t)c->rank);
    uint8_t *nc = out + 12;
    randombytes_buf(nc, NONCE);
    int rc;
    if ((rc = write_full(fd, out, sizeof out, deadline, err)) ||
        (rc = read_full(fd, in, sizeof in, deadline, err)))
        return rc;
    mac(c->key, 'A', nc, in, (uint32_t)c->rank, want);
    if (sodium_memcmp(want, in + NONCE, sizeof want))
        return exo_err_set(err, EXO_EPERM, "ring: the next rank does not hold this instance's key");
    mac(c->key, 'C', in, nc, (uint32_t)c->rank, want);
    return write_full(fd, want, sizeof want, deadline, err);
}

static int hello_acceptor(int fd, const exo_ring_config *c, uint64_t deadline, exo_err *err)
{
    uint8_t in[8 + 4 + NONCE], out[NONCE + crypto_auth_BYTES], got[crypto_auth_BYTES],
        want[crypto_auth_BYTES];
    int rc = read_full(fd, in, sizeof in, deadline, err);
    if (rc)
        return rc;
    uint32_t rank = get_u32(in + 8), prev = (uint32_t)((c->rank + c->world - 1) % c->world);
    if (memcmp(in, MAGIC, 8) || rank != prev)
        return exo_err_set(err, EXO_EPERM, "ring: a connection that is not rank %u of this ring", prev);
    uint8_t *nc = in + 12, *na = out;
    randombytes_buf(na, NONCE);
    mac(c->key, 'A', nc, na, rank, out + NONCE);
    if ((rc = write_full(fd, out, sizeof out, deadline, err)) ||
        (rc = read_full(fd, got, sizeof got, deadline, err)))
        return rc;
    mac(c->key, 'C', na, nc, rank, want);
    if (sodium_memcmp(want, got, sizeof want))
        return exo_err_set(err, EXO_EPERM, "ring: the previous rank does not hold this instance's key");
    return 0;
}

static int connect_next(const exo_ring_config *c, uint64_t deadline, int *fd_out, exo_err *err)
{
    char port[16];
    snprintf(port, sizeof port, "%d", c->next_port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(c->next_host, port, &hints, &ai);
    if (g)
        return exo_err_set(err, EXO_EINVAL, "ring: next rank's address '%s': %s", c->next_host,
                           gai_strerror(g));
    int rc = EXO_ETIMEDOUT;
    /* The next rank may still be starting to accept: retry until the deadline. */
    while (ms_left(deadline) > 0) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = exo_err_set(err, EXO_EIO, "ring: socket: %s", strerror(errno));
            break;
        }
        int e = connect(fd, ai->ai_addr, ai->ai_addrlen) ? errno : 0;
        if (e == EINPROGRESS && wait_fd(fd, POLLOUT, deadline, err) == 0) {
            socklen_t sl = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl);
        } else if (e == EINPROGRESS) {
            e = ETIMEDOUT;
        }
        if (!e) {
            tune(fd);
            rc = hello_connector(fd, c, deadline, err);
            if (!rc) {
                *fd_out = fd;
                break;
            }
            close(fd);
            if (rc == EXO_EPERM)
                break;
        } else {
            close(fd);
            exo_err_set(err, EXO_EIO, "ring: connect to %s port %d: %s", c->next_host, c->next_port,
                        strerror(e));
            rc = EXO_EIO;
        }
        usleep(50 * 1000);
    }
    if (rc == EXO_ETIMEDOUT && (!err || err->code != EXO_EIO))
        exo_err_set(err, EXO_ETIMEDOUT, "ring: could not reach rank %d at %s port %d in time",
                    (c->rank + 1) % c->world, c->next_host, c->next_port);
    else if (rc == EXO_EIO && ms_left(deadline) == 0)
        rc = EXO_ETIMEDOUT;
    freeaddrinfo(ai);
    return rc;
}

static int accept_prev(const exo_ring_config *c, uint64_t deadline, int *fd_out, exo_err *err)
{
    fcntl(c->listen_fd, F_SETFL, fcntl(c->listen_fd, F_GETFL) | O_NONBLOCK);
    for (;;) {
        int rc = wait_fd(c->listen_fd, POLLIN, deadline, err);
        if (rc)
            return exo_err_set(err, rc, "ring: rank %d did not connect in time",
                               (c->rank + c->world - 1) % c->world);
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        tune(fd);
        rc = hello_acceptor(fd, c, deadline, err);
        if (!rc) {
            *fd_out = fd;
            return 0;
        }
        close(fd); /* a stranger, or a stale attempt: keep listening */
        if (ms_left(deadline) == 0)
            return rc;
    }
}

/* ---- the sender ------------------------------------------------------------------- */

static int ping_interval_ms(const exo_ring *r)
{
    int ms = r->timeout_ms / 5;
    return ms < 100 ? 100 : ms > 2000 ? 2000 : ms;
}

/* Queues a frame; the caller holds mu. */
static bool enqueue_locked(exo_ring *r, const unsigned char *data, size_t n)
{
    qitem *q = exo_try_malloc(sizeof *q + n);
    if (!q)
        return false;
    q->next = NULL;
    q->len = n;
    q->off = 0;
    memcpy(q->data, data, n);
    if (r->tail)
        r->tail->next = q;
    else
        r->head = q;
    r->tail = q;
    return true;
}

/* The sender thread also says "alive" to the next rank whenever the link
 * has been quiet for a ping interval: a rank busy computing for minutes is
 * still heard from, so a receive timeout means a dead process or link,
 * never a slow one. */
static void *sender_main(void *arg)
{
    exo_ring *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->head && !r->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int ms = ping_interval_ms(r);
            ts.tv_sec += ms / 1000;
            ts.tv_nsec += (long)(ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT && !r->head &&
                !r->stopping && !r->send_errno) {
                unsigned char ping[HEADER_BYTES] = {0};
                put_u32(ping, MSG_PING);
                enqueue_locked(r, ping, sizeof ping);
            }
        }
        if (!r->head)
            break;
        qitem *q = r->head;
        pthread_mutex_unlock(&r->mu);
        /* blocking write of this item; the socket is non-blocking, so wait
         * for room with a generous deadline per stall */
        exo_err err = {0};
        int rc = 0;
        while (q->off < q->len && !rc) {
            ssize_t k = send(r->next_fd, q->data + q->off, q->len - q->off, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0)
                q->off += (size_t)k;
            else if (k < 0 && errno == EINTR)
                continue;
            else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                rc = wait_fd(r->next_fd, POLLOUT,
                             exo_clock_ns() + (uint64_t)r->timeout_ms * 1000000ull, &err);
            else
                rc = EXO_EIO;
        }
        pthread_mutex_lock(&r->mu);
        if (rc) {
            r->send_errno = rc == EXO_ETIMEDOUT ? ETIMEDOUT : EPIPE;
            while (r->head) {
                qitem *d = r->head;
                r->head = d->next;
                exo_free(d);
            }
            r->tail = NULL;
            pthread_cond_broadcast(&r->cv);
            continue;
        }
        r->head = q->next;
        if (!r->head)
            r->tail = NULL;
        exo_free(q);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int exo_ring_send(exo_ring *r, uint32_t type, uint32_t a, uint32_t b, const void *p1, size_t n1,
                  const void *p2, size_t n2, exo_err *err)
{
    if (r->world < 2)
        return exo_err_set(err, EXO_EINVAL, "ring: a ring of one has no link");
    size_t len = n1 + n2;
    if (len > EXO_RING_PAYLOAD_MAX)
        return exo_err_set(err, EXO_ETOOBIG, "ring: a frame of %zu bytes", len);
    unsigned char hdr[HEADER_BYTES];
    put_u32(hdr, type);
    put_u32(hdr + 4, a);
    put_u32(hdr + 8, b);
    put_u32(hdr + 12, (uint32_t)len);
    pthread_mutex_lock(&r->mu);
    if (r->send_errno) {
        int e = r->send_errno;
        pthread_mutex_unlock(&r->mu);
        return exo_err_set(err, e == ETIMEDOUT ? EXO_ETIMEDOUT : EXO_EIO,
                           "ring: the link to rank %d failed (%s)", (r->rank + 1) % r->world,
                           e == ETIMEDOUT ? "the next rank stopped reading" : "closed");
    }
    size_t done = 0;
    const size_t total = HEADER_BYTES + len;
    if (!r->head) { /* nothing queued: try to write it now, on this thread */
        struct iovec iov[3] = {{hdr, HEADER_BYTES}, {(void *)p1, n1}, {(void *)p2, n2}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 3};
        ssize_t k = sendmsg(r->next_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0)
            done = (size_t)k;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            r->send_errno = EPIPE;
            pthread_mutex_unlock(&r->mu);
            return exo_err_set(err, EXO_EIO, "ring: send to rank %d: %s", (r->rank + 1) % r->world,
                               strerror(errno));
        }
    }
    if (done < total) {
        qitem *q = exo_try_malloc(sizeof *q + total - done);
        if (!q) {
            pthread_mutex_unlock(&r->mu);
            return exo_err_set(err, EXO_ENOMEM, "ring: cannot queue %zu bytes", total);
        }
        q->next = NULL;
        q->len = total - done;
        q->off = 0;
        /* copy the unsent tail of hdr || p1 || p2 */
        const unsigned char *parts[3] = {hdr, p1, p2};
        size_t lens[3] = {HEADER_BYTES, n1, n2}, at = 0, skip = done;
        for (int i = 0; i < 3; i++) {
            if (skip >= lens[i]) {
                skip -= lens[i];
                continue;
            }
            memcpy(q->data + at, parts[i] + skip, lens[i] - skip);
            at += lens[i] - skip;
            skip = 0;
        }
        if (r->tail)
            r->tail->next = q;
        else
            r->head = q;
        r->tail = q;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int exo_ring_recv(exo_ring *r, exo_ring_msg *m, int timeout_ms, exo_err *err)
{
    memset(m, 0, sizeof *m);
    if (r->world < 2)
        return exo_err_set(err, EXO_EINVAL, "ring: a ring of one has no link");
    int t = timeout_ms < 0 ? r->timeout_ms : timeout_ms;
    int rc;
    for (;;) { /* pings only prove the link alive: wait on for a frame */
        uint64_t deadline = exo_clock_ns() + (uint64_t)t * 1000000ull;
        if ((rc = read_full(r->prev_fd, r->hdr, HEADER_BYTES, deadline, err)))
            return rc == EXO_ETIMEDOUT
                       ? exo_err_set(err, rc, "ring: nothing from rank %d for %d ms (link down?)",
                                     (r->rank + r->world - 1) % r->world, t)
                       : rc;
        r->last_rx_ns = exo_clock_ns();
        if (get_u32(r->hdr) != MSG_PING || get_u32(r->hdr + 12) != 0)
            break;
    }
    m->type = get_u32(r->hdr);
    m->a = get_u32(r->hdr + 4);
    m->b = get_u32(r->hdr + 8);
    m->len = get_u32(r->hdr + 12);
    if (m->len > EXO_RING_PAYLOAD_MAX)
        return exo_err_set(err, EXO_EFORMAT, "ring: a frame announces %zu bytes", m->len);
    /* the rest of a frame that has begun arrives at link speed: the same
     * deadline again, not what is left of the wait for its start. The
     * buffer grows with what arrives, not with what the header announces. */
    uint64_t deadline = exo_clock_ns() + (uint64_t)r->timeout_ms * 1000000ull;
    for (size_t got = 0; got < m->len;) {
        if (got == r->rcap) {
            size_t cap = r->rcap ? 2 * r->rcap : 65536;
            cap = cap < m->len ? cap : m->len;
            void *p = exo_try_malloc(cap);
            if (!p)
                return exo_err_set(err, EXO_ENOMEM, "ring: cannot receive %zu bytes", m->len);
            if (got)
                memcpy(p, r->rbuf, got);
            exo_free(r->rbuf);
            r->rbuf = p;
            r->rcap = cap;
        }
        size_t want = (m->len < r->rcap ? m->len : r->rcap) - got;
        if ((rc = read_full(r->prev_fd, (char *)r->rbuf + got, want, deadline, err)))
            return rc;
        got += want;
    }
    m->payload = r->rbuf;
    return 0;
}

int exo_ring_poll_fd(const exo_ring *r) { return r->world > 1 ? r->prev_fd : -1; }

int exo_ring_idle(exo_ring *r, exo_ring_msg *m, exo_err *err)
{
    memset(m, 0, sizeof *m);
    if (r->world < 2)
        return 0;
    for (;;) {
        struct pollfd p = {r->prev_fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) {
            uint64_t quiet = exo_clock_ns() - r->last_rx_ns;
            if (quiet > (uint64_t)r->timeout_ms * 1000000ull)
                return exo_err_set(err, EXO_ETIMEDOUT, "ring: nothing from rank %d for %d ms (link down?)",
                                   (r->rank + r->world - 1) % r->world, r->timeout_ms);
            return 0;
        }
        /* bytes arrived: a ping (consumed, look again) or a frame */
        unsigned char peek[HEADER_BYTES];
        ssize_t k = recv(r->prev_fd, peek, sizeof peek, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0)
            return exo_err_set(err, EXO_EIO, "ring: the previous rank closed the link");
        if (k == HEADER_BYTES && get_u32(peek) == MSG_PING && get_u32(peek + 12) == 0) {
            recv(r->prev_fd, peek, sizeof peek, MSG_DONTWAIT);
            r->last_rx_ns = exo_clock_ns();
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return exo_err_set(err, EXO_EIO, "ring: receive: %s", strerror(errno));
        int rc = exo_ring_recv(r, m, r->timeout_ms, err);
        return rc ? rc : 1;
    }
}

/* ---- all-reduce ------------------------------------------------------------------- */

#define MSG_REDUCE 0x7fff0001u
#define MSG_GATHER 0x7fff0002u

static void chunk_of(size_t n, int world, int c, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)c / (size_t)world;
    *hi = n * (size_t)(c + 1) / (size_t)world;
}

/* Chunk c of a rows x cols matrix is columns chunk_of(cols, c) of every
 * row, so where an element's sum starts round the ring, and so the order
 * its partials are added in, depends on its column only: a row reduced
 * with others (a batched step) gets the bits it gets alone. A chunk of
 * several rows travels staged in one buffer. */
static const float *chunk_out(exo_ring *r, const float *x, size_t rows, size_t cols, size_t lo, size_t hi,
                              exo_err *err)
{
    if (rows == 1)
        return x + lo;
    size_t w = hi - lo, need = rows * w;
    if (need > r->stage_cap) {
        float *b = exo_try_malloc(need * sizeof(float));
        if (!b)
            return exo_err_set(err, EXO_ENOMEM, "ring: no memory to stage %zu floats", need), NULL;
        exo_free(r->stage);
        r->stage = b;
        r->stage_cap = need;
    }
    for (size_t t = 0; t < rows; t++)
        memcpy(r->stage + t * w, x + t * cols + lo, w * sizeof(float));
    return r->stage;
}

int exo_ring_allreduce(exo_ring *r, float *x, size_t rows, size_t cols, exo_err *err)
{
    int W = r->world, me = r->rank;
    if (W < 2)
        return 0;
    /* step s of reduce-scatter: send chunk (me - s), receive chunk (me - s - 1)
     * and add it in; after W-1 steps chunk (me + 1) is complete here. Then
     * all-gather: send the complete chunk round, W-1 steps. */
    for (int phase = 0; phase < 2; phase++) {
        for (int s = 0; s < W - 1; s++) {
            int send_c = ((me - s + (phase ? 1 : 0)) % W + W) % W;
            int recv_c = ((me - s - 1 + (phase ? 1 : 0)) % W + W) % W;
            size_t lo, hi;
            chunk_of(cols, W, send_c, &lo, &hi);
            const float *out = chunk_out(r, x, rows, cols, lo, hi, err);
            if (!out)
                return EXO_ENOMEM;
            int rc = exo_ring_send(r, MSG_REDUCE, (uint32_t)phase, (uint32_t)s, out,
                                   rows * (hi - lo) * sizeof(float), NULL, 0, err);
            if (rc)
                return rc;
            exo_ring_msg m;
            if ((rc = exo_ring_recv(r, &m, -1, err)))
                return rc;
            chunk_of(cols, W, recv_c, &lo, &hi);
            size_t w = hi - lo;
            if (m.type != MSG_REDUCE || m.a != (uint32_t)phase || m.b != (uint32_t)s ||
                m.len != rows * w * sizeof(float))
                return exo_err_set(err, EXO_EFORMAT, "ring: all-reduce out of step (frame %u)", m.type);
            for (size_t t = 0; t < rows; t++) {
                const float *in = (const float *)m.payload + t * w;
                float *y = x + t * cols + lo;
                if (phase == 0)
                    for (size_t i = 0; i < w; i++)
                        y[i] += in[i];
                else
                    memcpy(y, in, w * sizeof(float));
            }
        }
    }
    return 0;
}

int exo_ring_allgather(exo_ring *r, float *x, const size_t *bounds, exo_err *err)
{
    int W = r->world, me = r->rank;
    /* step s: send the chunk received last step (at first our own), receive
     * the chunk of rank (me - s - 1) */
    for (int s = 0; s < W - 1; s++) {
        int send_c = ((me - s) % W + W) % W, recv_c = ((me - s - 1) % W + W) % W;
        size_t lo = bounds[send_c], hi = bounds[send_c + 1];
        int rc = exo_ring_send(r, MSG_GATHER, (uint32_t)s, 0, x + lo, (hi - lo) * sizeof(float), NULL,
                               0, err);
        if (rc)
            return rc;
        exo_ring_msg m;
        if ((rc = exo_ring_recv(r, &m, -1, err)))
            return rc;
        lo = bounds[recv_c];
        hi = bounds[recv_c + 1];
        if (m.type != MSG_GATHER || m.a != (uint32_t)s || m.len != (hi - lo) * sizeof(float))
            return exo_err_set(err, EXO_EFORMAT, "ring: all-gather out of step (frame %u)", m.type);
        memcpy(x + lo, m.payload, m.len);
    }
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------- */

int exo_ring_connect(const exo_ring_config *c, exo_ring **out, exo_err *err)
{
    *out = NULL;
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world) {
        if (c->listen_fd >= 0)
            close(c->listen_fd);
        return exo_err_set(err, EXO_EINVAL, "ring: rank %d of %d", c->rank, c->world);
    }
    if (sodium_init() < 0) {
        if (c->listen_fd >= 0)
            close(c->listen_fd);
        return exo_err_set(err, EXO_EINTERNAL, "ring: libsodium failed to initialise");
    }
    exo_ring *r = exo_calloc(1, sizeof *r);
    r->rank = c->rank;
    r->world = c->world;
    r->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : DEFAULT_TIMEOUT_MS;
    r->next_fd = r->prev_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    int rc = 0;
    if (c->world > 1) {
        uint64_t deadline = exo_clock_ns() + (uint64_t)r->timeout_ms * 1000000ull;
        /* Even ranks connect first, odd ranks accept first: every accept
         * then has its connector running (rank 0 of a ring of one other
         * connects while rank 1 accepts, and so on round). Connecting is
         * asynchronous up to the handshake anyway; the order only keeps
         * the two handshakes of a rank from waiting on each other. */
        if (c->rank % 2 == 0) {
            rc = connect_next(c, deadline, &r->next_fd, err);
            if (!rc)
                rc = accept_prev(c, deadline, &r->prev_fd, err);
        } else {
            rc = accept_prev(c, deadline, &r->prev_fd, err);
            if (!rc)
                rc = connect_next(c, deadline, &r->next_fd, err);
        }
        if (!rc) {
            r->last_rx_ns = exo_clock_ns();
            if (pthread_create(&r->sender, NULL, sender_main, r))
                rc = exo_err_set(err, EXO_EINTERNAL, "ring: cannot start the sender thread");
            else
                r->sender_started = true;
        }
    }
    if (c->listen_fd >= 0)
        close(c->listen_fd);
    if (rc) {
        exo_ring_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

exo_ring *exo_ring_wrap(int rank, int world, int prev_fd, int next_fd, int timeout_ms)
{
    exo_ring *r = exo_calloc(1, sizeof *r);
    r->rank = rank;
    r->world = world;
    r->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    r->prev_fd = prev_fd;
    r->next_fd = next_fd;
    r->last_rx_ns = exo_clock_ns();
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    fcntl(prev_fd, F_SETFL, fcntl(prev_fd, F_GETFL) | O_NONBLOCK);
    if (next_fd >= 0) {
        fcntl(next_fd, F_SETFL, fcntl(next_fd, F_GETFL) | O_NONBLOCK);
        if (world > 1 && pthread_create(&r->sender, NULL, sender_main, r) == 0)
            r->sender_started = true;
    } else {
        r->send_errno = EPIPE; /* a ring that only receives */
    }
    return r;
}

void exo_ring_free(exo_ring *r)
{
    if (!r)
        return;
    if (r->sender_started) {
        pthread_mutex_lock(&r->mu);
        r->stopping = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        /* a sender stuck on a peer that stopped reading fails at once */
        shutdown(r->next_fd, SHUT_RDWR);
        pthread_join(r->sender, NULL);
    }
    while (r->head) {
        qitem *q = r->head;
        r->head = q->next;
        exo_free(q);
    }
    if (r->next_fd >= 0)
        close(r->next_fd);
    if (r->prev_fd >= 0)
        close(r->prev_fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    exo_free(r->rbuf);
    exo_free(r->stage);
    exo_free(r);
}

int exo_ring_rank(const exo_ring *r) { return r->rank; }
int exo_ring_world(const exo_ring *r) { return r->world; }
