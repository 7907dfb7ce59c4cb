/* The ring of an instance's runners: direct TCP between runner processes,
 * not through the nodes' event loops.
 *
 * Rank i holds one link to rank i+1 ("next") and one from rank i-1
 * ("prev"); the last rank's next is rank 0, so messages go round. Each
 * link carries frames [u32 type][u32 a][u32 b][u32 length][payload], all
 * little-endian. Sends are queued and written by a thread per ring, so a
 * rank hands a hidden state to the next one and goes on computing (a
 * pipeline needs that: the next rank reads only when it is done with its
 * own chunk); when nothing is queued a small frame is written at once,
 * without waking the thread, so a decode step's latency is one syscall.
 * Receives are on the caller's thread, with a timeout: a peer that is
 * gone shows up as a closed link at once, a link that is down as a
 * timeout, never as a hang.
 *
 * Connecting: every rank listens first (exo_ring_listen, port 0 picks one),
 * publishes its port, then connects to its next rank's address and accepts
 * its prev rank's connection. Both ends prove they hold the instance's ring
 * key (derived by the nodes from the cluster key and the instance id) with a
 * challenge and response (HMAC-SHA-512-256 over both nonces), so a stranger
 * cannot join a ring. Payloads are not encrypted: hidden states are large
 * and the links are the LAN's (docs/DISTRIBUTED.md).
 *
 * The collective: exo_ring_allreduce sums a float vector over every rank,
 * ring reduce-scatter then all-gather (2(n-1) steps of 1/n of the vector),
 * so every rank ends with the same bits.
 *
 * Threading: one thread uses a ring (the runner's main thread); the sender
 * thread is internal. */
#ifndef EXO_RUNNER_RING_H
#define EXO_RUNNER_RING_H

#include "core/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_RING_KEY_BYTES   32
#define EXO_RING_PAYLOAD_MAX ((size_t)256 << 20) /* a frame: a 512-token chunk of a 64k-wide model */

typedef struct exo_ring exo_ring;

typedef struct exo_ring_config {
    int         rank, world;
    int         listen_fd;       /* from exo_ring_listen; taken (closed by the ring) */
    const char *next_host;       /* numeric address of rank+1's node */
    int         next_port;
    uint8_t     key[EXO_RING_KEY_BYTES];
    int         timeout_ms;      /* connect, and every receive; <= 0: 30000 */
} exo_ring_config;

/* A listening socket on every interface (IPv6 with v4-mapped, else IPv4)
 * at `port` (0: the kernel picks); *port_out is the port. */
int exo_ring_listen(int port, int *fd_out, int *port_out, exo_err *err);

/* Connects the ring (see above). world 1 makes a ring with no links.
 * Errors: EXO_ETIMEDOUT, EXO_EIO (refused, closed), EXO_EPERM (a peer
 * without the key). */
int  exo_ring_connect(const exo_ring_config *cfg, exo_ring **out, exo_err *err);
void exo_ring_free(exo_ring *r);
/* A ring over links already connected and trusted (tests, fuzzing): the
 * fds are taken; next_fd -1 makes a ring that only receives. */
exo_ring *exo_ring_wrap(int rank, int world, int prev_fd, int next_fd, int timeout_ms);
int  exo_ring_rank(const exo_ring *r);
int  exo_ring_world(const exo_ring *r);

typedef struct exo_ring_msg {
    uint32_t type, a, b;
    size_t   len;
    void    *payload; /* owned by the ring, valid until the next receive */
} exo_ring_msg;

/* Queues a frame to next: header fields and the concatenation of the
 * parts (copied). EXO_EIO when the link has failed (the error says why). */
int exo_ring_send(exo_ring *r, uint32_t type, uint32_t a, uint32_t b, const void *p1, size_t n1,
                  const void *p2, size_t n2, exo_err *err);
/* The next frame from prev, waiting at most timeout_ms (< 0: the ring's
 * timeout). EXO_ETIMEDOUT, EXO_EIO (closed or broken), EXO_EFORMAT. */
int exo_ring_recv(exo_ring *r, exo_ring_msg *m, int timeout_ms, exo_err *err);
/* For a rank waiting on something else (its node's socket): the fd to poll
 * for the ring (-1: none), and, when it is readable or a while has passed,
 * exo_ring_idle: 1 and *m when a frame came, 0 when only pings did (or
 * nothing, and the link is not yet silent past the timeout), or an error
 * (closed, silent too long). */
int exo_ring_poll_fd(const exo_ring *r);
int exo_ring_idle(exo_ring *r, exo_ring_msg *m, exo_err *err);
/* x (rows x cols, row-major) = sum over ranks of x, the same on every
 * rank; an element's partials are added in an order that depends on its
 * column only (not on rows), so a row gets the same bits in any batch. */
int exo_ring_allreduce(exo_ring *r, float *x, size_t rows, size_t cols, exo_err *err);
/* Rank i holds x[bounds[i] .. bounds[i+1]); afterwards every rank holds
 * all of x (bounds has world + 1 entries, non-decreasing). */
int exo_ring_allgather(exo_ring *r, float *x, const size_t *bounds, exo_err *err);

#endif
