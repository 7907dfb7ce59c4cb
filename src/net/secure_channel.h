/* The authenticated, encrypted node-to-node channel: a pure byte-in /
 * byte-out state machine (no sockets, no clock, no libuv), so the whole
 * protocol can be tested and fuzzed in memory. net.c owns the sockets.
 *
 * Wire protocol (version 1). I = the side that dialed, R = the other.
 *   1. HELLO, sent by both sides at once on creation, 80 bytes in clear:
 *        0-3 "EXOL" | 4-5 version u16 LE | 6-7 flags u16 LE (bit 0 PROBE)
 *        | 8-39 X25519 ephemeral pk | 40-71 random | 72-79 zero
 *      Another version, an unknown flag bit, non-zero reserved bytes, a
 *      low-order ephemeral key or our own HELLO reflected back: rejected.
 *   2. Keys: h   = BLAKE2b-256("exo handshake v1" || hello_I || hello_R)
 *            dh  = X25519(eph_sk, peer_eph_pk)
 *            okm = BLAKE2b-512(key = psk, dh || h); k_I2R = okm[0:32],
 *                  k_R2I = okm[32:64]; dh, okm and eph_sk are wiped.
 *      Each direction is one crypto_secretstream_xchacha20poly1305 stream:
 *      its 24-byte header in clear, then frames.
 *   3. Frames: u32 LE length L | L bytes = secretstream ciphertext (tag
 *      TAG_MESSAGE, additional data = the 4 length bytes) of
 *      u8 type | payload. The first frame of each direction is AUTH (0xF3):
 *      sign_pk (32) | Ed25519 signature (64) over
 *      "exo auth v1" || h || role byte of the signer ('I' or 'R').
 *      The peer id is exo_identity_node_id_of(sign_pk).
 *
 * Ordering: R sends its header and AUTH as soon as it has both HELLOs. I
 * sends its header and AUTH only after R's AUTH verified (deviation from
 * the first sketch, where both sent at once): an initiator that reached the
 * wrong node, or a node that does not hold the psk, learns nothing of who
 * dialed, and a dial to an unexpected id ends before the responder ever
 * accepts it. It costs R half a round trip; I may send application frames
 * right after its AUTH. Consequence: when the psk differs, I fails at once
 * ("authentication failed ...") while R only sees the connection close.
 *
 * Why these properties hold: every HELLO byte is in h, and both the keys
 * and the signatures cover h, so any change to a HELLO makes the AUTH fail.
 * Keys need the psk and the ephemeral secrets: forward secrecy, and nobody
 * without the psk can read or forge a frame. The signature binds the
 * long-term identity to this session's h and role, so a cluster member
 * cannot replay another node's AUTH, nor reflect a side's own. Directional
 * keys make reflected frames fail to decrypt. secretstream's per-message
 * nonce makes replayed, reordered or dropped frames fail. Authenticating the
 * length prefix as additional data is belt and braces (a changed length
 * already breaks the MAC).
 *
 * Limits, checked before any allocation: before the peer is authenticated
 * L <= EXO_SC_PREAUTH_FRAME_MAX (256), after it
 * L <= EXO_SC_PAYLOAD_MAX + 1 + ABYTES; L < 1 + ABYTES is an error. The
 * receiver holds at most one partial frame. The output queue is not bounded
 * here: the caller checks exo_sc_out_pending (net.c's send_queue_max).
 *
 * Types: 1..0xEF application, 0xF0..0xFF transport. The sc itself handles
 * AUTH: an AUTH after the handshake, and type 0, are errors. Every other
 * type (reserved ones included) is delivered as is; net.c decides.
 *
 * Errors are terminal: the sc keeps its first error message and refuses all
 * further input and output (exo_sc_error). exo_sc_send with a bad argument
 * (wrong type, too big, not established yet) is a caller error that leaves
 * the sc as it was.
 *
 * Copies: exo_sc_send copies the payload once into the output buffer and
 * encrypts it in place; exo_sc_recv copies ciphertext once into the frame
 * buffer and decrypts in place; the payload handed to the frame callback
 * points into that buffer.
 *
 * Threading: none; one thread uses an sc.
 *
 * Example usage (net.c does this around a socket):
 *   exo_sc *sc;
 *   exo_sc_new(&identity, keys.psk, true, 0, &sc, &err);
 *   write_out(sc);                          // HELLO
 *   on bytes read: if (exo_sc_recv(sc, buf, n, &handlers, ctx, &err) < 0) close(err.msg);
 *                  write_out(sc);           // header + AUTH, frames
 *   once established: exo_sc_send(sc, 0x01, payload, len, &err); write_out(sc);
 *   write_out(sc): while ((p = exo_sc_out_take(sc, &len))) { write p; exo_free(p); }
 *   exo_sc_free(sc); */
#ifndef EXO_NET_SECURE_CHANNEL_H
#define EXO_NET_SECURE_CHANNEL_H

#include "core/error.h"
#include "net/identity.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EXO_SC_VERSION            1
#define EXO_SC_HELLO_LEN          80
#define EXO_SC_HEADER_LEN         24  /* crypto_secretstream_xchacha20poly1305_HEADERBYTES */
#define EXO_SC_ABYTES             17  /* crypto_secretstream_xchacha20poly1305_ABYTES */
#define EXO_SC_FLAG_PROBE         0x0001u
#define EXO_SC_FLAGS_KNOWN        EXO_SC_FLAG_PROBE
#define EXO_SC_PAYLOAD_MAX        ((size_t)16 << 20)
#define EXO_SC_PREAUTH_FRAME_MAX  256
/* Bytes a frame of n payload bytes takes on the wire. */
#define EXO_SC_FRAME_OVERHEAD     (4 + 1 + EXO_SC_ABYTES)
#define EXO_SC_TYPE_AUTH          0xF3
#define EXO_SC_TYPE_APP_MAX       0xEF
#define EXO_SC_SESSION_ID_LEN     32

typedef struct exo_sc exo_sc;

typedef struct exo_sc_handlers {
    /* The peer's AUTH verified; exo_sc_peer_id is set. Called once, before
     * any frame. May be NULL. */
    int (*established)(void *ctx, exo_sc *sc);
    /* One complete frame after establishment; payload is valid during the
     * call only. May be NULL (frames are then dropped). */
    int (*frame)(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len);
    /* Either returning non-zero stops exo_sc_recv: the rest of the input is
     * dropped and the sc fails ("stopped by the caller", EXO_ECANCELED), for
     * a caller that is closing the connection from inside a callback. */
} exo_sc_handlers;

/* A channel for one connection. initiator: we dialed. flags: our HELLO
 * flags (only EXO_SC_FLAG_PROBE is defined; others are EXO_EINVAL). The
 * identity and psk are copied (and wiped once no longer needed). Our HELLO
 * is queued at once. */
int  exo_sc_new(const exo_identity *id, const uint8_t psk[32], bool initiator, uint16_t flags, exo_sc **out,
                exo_err *err);
void exo_sc_free(exo_sc *sc);

/* Feeds bytes read from the peer. Complete frames go to handlers->frame in
 * order. Returns 0, or a negative code with err set; after an error the sc
 * has failed for good (EXO_EFORMAT bad bytes or failed authentication,
 * EXO_EUNSUPPORTED other protocol version, EXO_ETOOBIG length over the
 * limit, EXO_ENOMEM no memory for a large frame, EXO_ECANCELED a callback
 * stopped it). Output may have been queued (header, AUTH): drain it. */
int  exo_sc_recv(exo_sc *sc, const uint8_t *bytes, size_t len, const exo_sc_handlers *handlers, void *ctx,
                 exo_err *err);

/* Seals one frame into the output. type 1..0xFF except 0xF3; len <=
 * EXO_SC_PAYLOAD_MAX. EXO_EINVAL before establishment or with a bad type,
 * EXO_ETOOBIG over the limit, the sc's error once it has failed. */
int  exo_sc_send(exo_sc *sc, uint8_t type, const void *payload, size_t len, exo_err *err);

/* Output, in order, as a queue of chunks. exo_sc_out: the unconsumed rest
 * of the first chunk (NULL and 0 if none); the pointer stays valid until it
 * is consumed or the sc freed, whatever is sent meanwhile.
 * exo_sc_out_consume(n): n <= that length. exo_sc_out_take: hands the whole
 * next chunk to the caller (free with exo_free). Nothing is output after a
 * failure. */
const uint8_t *exo_sc_out(exo_sc *sc, size_t *len);
void           exo_sc_out_consume(exo_sc *sc, size_t n);
uint8_t       *exo_sc_out_take(exo_sc *sc, size_t *len);
size_t         exo_sc_out_pending(const exo_sc *sc);

bool        exo_sc_established(const exo_sc *sc);
bool        exo_sc_initiator(const exo_sc *sc);
/* NULL until established. */
const char *exo_sc_peer_id(const exo_sc *sc);
/* The peer's HELLO flags; 0 until its HELLO arrived (exo_sc_peer_hello_seen). */
uint16_t    exo_sc_peer_flags(const exo_sc *sc);
bool        exo_sc_peer_hello_seen(const exo_sc *sc);
/* h, identical on both ends of one connection and unpredictable to anyone
 * else; NULL until both HELLOs are known. net.c breaks ties between
 * duplicate links with it. */
const uint8_t *exo_sc_session_id(const exo_sc *sc);
/* The first error's message, or NULL while healthy. */
const char *exo_sc_error(const exo_sc *sc);

#endif
