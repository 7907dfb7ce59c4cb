/* The secure channel state machine (protocol and rationale: secure_channel.h).
 *
 * Receive side: a phase machine (HELLO -> HEADER -> LEN <-> BODY) that
 * copies input into fixed buffers for the small fixed-size parts and into
 * one frame buffer for the frame being assembled. The frame buffer is
 * allocated only after its length passed the limits; up to SMALL_FRAME it
 * is kept for the next frame, a larger one is freed once delivered, so an
 * idle link holds no large buffer.
 *
 * In-place crypto: secretstream's ciphertext is tag(1) | c | mac(16) with
 * c the same length as the message. Laying the plaintext out at c's offset
 * makes push and pull XOR with identical source and destination (c == m),
 * which every libsodium stream implementation supports; the tag byte is
 * written/read just before it. So a frame is one buffer on either side.
 *
 * Secrets: psk, ephemeral secret, signing key, dh, okm and the direction
 * keys are wiped as soon as they have served; the secretstream states are
 * wiped on failure and on free. */
#include "net/secure_channel.h"

#include "core/alloc.h"
#include "core/bytes.h"

#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_FRAME (64 * 1024)
#define AUTH_PLAIN  (1 + 32 + crypto_sign_BYTES)
#define FRAME_MAX   (EXO_SC_PAYLOAD_MAX + 1 + EXO_SC_ABYTES)

_Static_assert(EXO_SC_HEADER_LEN == crypto_secretstream_xchacha20poly1305_HEADERBYTES, "header size");
_Static_assert(EXO_SC_ABYTES == crypto_secretstream_xchacha20poly1305_ABYTES, "abytes");
_Static_assert(crypto_secretstream_xchacha20poly1305_KEYBYTES == 32, "key size");
_Static_assert(EXO_SC_PREAUTH_FRAME_MAX >= AUTH_PLAIN + EXO_SC_ABYTES, "AUTH fits the pre-auth limit");

static const char AUTH_FAILED[] = "authentication failed: the peer holds another namespace or cluster "
                                  "secret, or the stream was tampered with";

typedef enum { PH_HELLO, PH_HEADER, PH_LEN, PH_BODY } phase;

typedef struct chunk {
    uint8_t *data;
    size_t   len;
} chunk;

struct exo_sc {
    bool     initiator, established, failed, peer_hello_seen;
    uint16_t flags, peer_flags;
    phase    ph;
    int      err_code;
    char     err_msg[256];

    uint8_t psk[32];
    uint8_t sign_pk[32], sign_sk[64];
    uint8_t eph_pk[32], eph_sk[32];
    uint8_t hello[EXO_SC_HELLO_LEN], peer_hello[EXO_SC_HELLO_LEN];
    size_t  peer_hello_have;
    uint8_t h[32];
    bool    have_h;
    uint8_t k_rx[32];                       /* until the peer's header arrives */
    uint8_t tx_header[EXO_SC_HEADER_LEN];   /* ours, queued with our AUTH */
    crypto_secretstream_xchacha20poly1305_state tx, rx;

    uint8_t  peer_header[EXO_SC_HEADER_LEN];
    size_t   peer_header_have;
    uint8_t  len_buf[4];
    size_t   len_have;
    size_t   frame_len, frame_have, frame_cap;
    uint8_t *frame;

    char peer_id[EXO_NODE_ID_LEN + 1];

    chunk *q;          /* ring of output chunks */
    size_t q_head, q_count, q_cap;
    size_t head_off;   /* consumed bytes of the first chunk */
    size_t pending;    /* unconsumed output bytes */
};

static void wipe_secrets(exo_sc *sc)
{
    sodium_memzero(sc->psk, sizeof sc->psk);
    sodium_memzero(sc->sign_sk, sizeof sc->sign_sk);
    sodium_memzero(sc->eph_sk, sizeof sc->eph_sk);
    sodium_memzero(sc->k_rx, sizeof sc->k_rx);
    sodium_memzero(&sc->tx, sizeof sc->tx);
    sodium_memzero(&sc->rx, sizeof sc->rx);
}

static void queue_clear(exo_sc *sc)
{
    for (size_t i = 0; i < sc->q_count; i++)
        exo_free(sc->q[(sc->q_head + i) % sc->q_cap].data);
    sc->q_head = sc->q_count = 0;
    sc->head_off = sc->pending = 0;
}

static void frame_release(exo_sc *sc)
{
    if (sc->frame_cap > SMALL_FRAME) {
        exo_free(sc->frame);
        sc->frame = NULL;
        sc->frame_cap = 0;
    }
}

static int sc_fail(exo_sc *sc, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int sc_fail(exo_sc *sc, int code, const char *fmt, ...)
{
    if (sc->failed)
        return sc->err_code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->err_msg, sizeof sc->err_msg, fmt, ap);
    va_end(ap);
    sc->failed = true;
    sc->err_code = code;
    wipe_secrets(sc);
    queue_clear(sc);
    exo_free(sc->frame);
    sc->frame = NULL;
    sc->frame_cap = sc->frame_len = sc->frame_have = 0;
    return code;
}

static int report(const exo_sc *sc, exo_err *err)
{
    return exo_err_set(err, sc->err_code, "%s", sc->err_msg);
}

static void queue_push(exo_sc *sc, uint8_t *data, size_t len)
{
    if (sc->q_count == sc->q_cap) {
        size_t ncap = sc->q_cap ? sc->q_cap * 2 : 8;
        chunk *nq = exo_malloc(ncap * sizeof *nq);
        for (size_t i = 0; i < sc->q_count; i++)
            nq[i] = sc->q[(sc->q_head + i) % sc->q_cap];
        exo_free(sc->q);
        sc->q = nq;
        sc->q_cap = ncap;
        sc->q_head = 0;
    }
    sc->q[(sc->q_head + sc->q_count) % sc->q_cap] = (chunk){data, len};
    sc->q_count++;
    sc->pending += len;
}

/* Seals type|payload as one frame at out (which has len + EXO_SC_FRAME_OVERHEAD
 * bytes); the payload may already be in place at out + 6. */
static void seal_into(exo_sc *sc, uint8_t *out, uint8_t type, const void *payload, size_t len)
{
    size_t clen = len + 1 + EXO_SC_ABYTES;
    exo_put_le32(out, (uint32_t)clen);
    out[5] = type;
    if (len && payload != out + 6)
        memcpy(out + 6, payload, len);
    /* out + 4: tag byte, then c == m at out + 5 (in place), then the MAC */
    crypto_secretstream_xchacha20poly1305_push(&sc->tx, out + 4, NULL, out + 5, 1 + len, out, 4,
                                               crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
}

static void auth_message(uint8_t msg[11 + 32 + 1], const uint8_t h[32], char role)
{
    memcpy(msg, "exo auth v1", 11);
    memcpy(msg + 11, h, 32);
    msg[43] = (uint8_t)role;
}

/* Our header followed by our AUTH frame, as one chunk. */
static void queue_header_and_auth(exo_sc *sc)
{
    size_t n = EXO_SC_HEADER_LEN + AUTH_PLAIN - 1 + EXO_SC_FRAME_OVERHEAD;
    uint8_t *buf = exo_malloc(n);
    memcpy(buf, sc->tx_header, EXO_SC_HEADER_LEN);
    uint8_t plain[AUTH_PLAIN - 1], msg[44];
    memcpy(plain, sc->sign_pk, 32);
    auth_message(msg, sc->h, sc->initiator ? 'I' : 'R');
    crypto_sign_detached(plain + 32, NULL, msg, sizeof msg, sc->sign_sk);
    sodium_memzero(sc->sign_sk, sizeof sc->sign_sk); /* the only signature this sc makes */
    seal_into(sc, buf + EXO_SC_HEADER_LEN, EXO_SC_TYPE_AUTH, plain, sizeof plain);
    queue_push(sc, buf, n);
}

int exo_sc_new(const exo_identity *id, const uint8_t psk[32], bool initiator, uint16_t flags, exo_sc **out,
               exo_err *err)
{
    *out = NULL;
    if (flags & ~EXO_SC_FLAGS_KNOWN)
        return exo_err_set(err, EXO_EINVAL, "secure channel: unknown flags 0x%04x", flags);
    if (sodium_init() < 0)
        return exo_err_set(err, EXO_EINTERNAL, "secure channel: libsodium could not initialise");
    exo_sc *sc = exo_calloc(1, sizeof *sc);
    sc->initiator = initiator;
    sc->flags = flags;
    memcpy(sc->psk, psk, 32);
    memcpy(sc->sign_pk, id->pk, 32);
    memcpy(sc->sign_sk, id->sk, 64);
    crypto_box_keypair(sc->eph_pk, sc->eph_sk); /* X25519, secret from randombytes */
    memcpy(sc->hello, "EXOL", 4);
    exo_put_le16(sc->hello + 4, EXO_SC_VERSION);
    exo_put_le16(sc->hello + 6, flags);
    memcpy(sc->hello + 8, sc->eph_pk, 32);
    randombytes_buf(sc->hello + 40, 32);
    memset(sc->hello + 72, 0, 8);
    uint8_t *h = exo_malloc(EXO_SC_HELLO_LEN);
    memcpy(h, sc->hello, EXO_SC_HELLO_LEN);
    queue_push(sc, h, EXO_SC_HELLO_LEN);
    *out = sc;
    return 0;
}

void exo_sc_free(exo_sc *sc)
{
    if (!sc)
        return;
    wipe_secrets(sc);
    queue_clear(sc);
    exo_free(sc->q);
    exo_free(sc->frame);
    sodium_memzero(sc, sizeof *sc);
    exo_free(sc);
}

static int on_hello(exo_sc *sc)
{
    const uint8_t *p = sc->peer_hello;
    if (memcmp(p, "EXOL", 4) != 0)
        return sc_fail(sc, EXO_EFORMAT, "handshake: the peer is not an exo node (bad HELLO magic)");
    uint16_t version = exo_get_le16(p + 4), flags = exo_get_le16(p + 6);
    if (version != EXO_SC_VERSION)
        return sc_fail(sc, EXO_EUNSUPPORTED,
                       "handshake: the peer speaks exo transport protocol version %u, this node version %u",
                       version, EXO_SC_VERSION);
    if (flags & ~EXO_SC_FLAGS_KNOWN)
        return sc_fail(sc, EXO_EFORMAT, "handshake: unknown HELLO flags 0x%04x", flags);
    for (int i = 72; i < 80; i++)
        if (p[i])
            return sc_fail(sc, EXO_EFORMAT, "handshake: non-zero reserved HELLO bytes");
    if (sodium_memcmp(p + 8, sc->eph_pk, 32) == 0)
        return sc_fail(sc, EXO_EFORMAT, "handshake: our own HELLO was reflected back");

    const uint8_t *hello_i = sc->initiator ? sc->hello : p, *hello_r = sc->initiator ? p : sc->hello;
    static const char label[] = "exo handshake v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
    crypto_generichash_update(&st, hello_i, EXO_SC_HELLO_LEN);
    crypto_generichash_update(&st, hello_r, EXO_SC_HELLO_LEN);
    crypto_generichash_final(&st, sc->h, 32);
    sc->have_h = true;

    uint8_t dh[32], okm[64];
    int low = crypto_scalarmult(dh, sc->eph_sk, p + 8);
    sodium_memzero(sc->eph_sk, sizeof sc->eph_sk);
    if (low != 0) {
        sodium_memzero(dh, sizeof dh);
        return sc_fail(sc, EXO_EFORMAT, "handshake: the peer's ephemeral key is a low-order point");
    }
    crypto_generichash_init(&st, sc->psk, 32, sizeof okm);
    crypto_generichash_update(&st, dh, sizeof dh);
    crypto_generichash_update(&st, sc->h, sizeof sc->h);
    crypto_generichash_final(&st, okm, sizeof okm);
    sodium_memzero(dh, sizeof dh);
    sodium_memzero(sc->psk, sizeof sc->psk);
    sodium_memzero(&st, sizeof st);
    const uint8_t *k_i2r = okm, *k_r2i = okm + 32;
    crypto_secretstream_xchacha20poly1305_init_push(&sc->tx, sc->tx_header, sc->initiator ? k_i2r : k_r2i);
    memcpy(sc->k_rx, sc->initiator ? k_r2i : k_i2r, 32);
    sodium_memzero(okm, sizeof okm);
    sc->peer_flags = flags;
    sc->peer_hello_seen = true;
    if (!sc->initiator)
        queue_header_and_auth(sc);
    return 0;
}

static int on_auth(exo_sc *sc, const uint8_t *plain, size_t plen, const exo_sc_handlers *hd, void *ctx)
{
    if (plen != AUTH_PLAIN || plain[0] != EXO_SC_TYPE_AUTH)
        return sc_fail(sc, EXO_EFORMAT, "handshake: the peer's first frame is not an AUTH frame");
    uint8_t msg[44];
    auth_message(msg, sc->h, sc->initiator ? 'R' : 'I');
    if (crypto_sign_verify_detached(plain + 33, msg, sizeof msg, plain + 1) != 0)
        return sc_fail(sc, EXO_EFORMAT,
                       "authentication failed: the peer's identity signature does not verify");
    exo_identity_node_id_of(plain + 1, sc->peer_id);
    sc->established = true;
    if (sc->initiator)
        queue_header_and_auth(sc);
    if (hd && hd->established && hd->established(ctx, sc) != 0)
        return sc_fail(sc, EXO_ECANCELED, "stopped by the caller");
    return 0;
}

/* Decrypts and dispatches the complete frame in sc->frame. */
static int on_frame(exo_sc *sc, const exo_sc_handlers *hd, void *ctx)
{
    unsigned long long mlen = 0;
    unsigned char tag = 0;
    uint8_t *m = sc->frame + 1;
    if (crypto_secretstream_xchacha20poly1305_pull(&sc->rx, m, &mlen, &tag, sc->frame, sc->frame_len,
                                                   sc->len_buf, 4) != 0) {
        if (!sc->established)
            return sc_fail(sc, EXO_EFORMAT, "%s", AUTH_FAILED);
        return sc_fail(sc, EXO_EFORMAT,
                       "a frame failed to decrypt: it was tampered with, replayed, reordered or one was "
                       "dropped");
    }
    if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE)
        return sc_fail(sc, EXO_EFORMAT, "a frame carries secretstream tag %u, only MESSAGE is used", tag);
    int rc;
    if (!sc->established) {
        rc = on_auth(sc, m, (size_t)mlen, hd, ctx);
    } else if (m[0] == 0 || m[0] == EXO_SC_TYPE_AUTH) {
        rc = sc_fail(sc, EXO_EFORMAT, "a frame has type 0x%02x, which is not allowed after the handshake",
                     m[0]);
    } else {
        rc = 0;
        if (hd && hd->frame && hd->frame(ctx, sc, m[0], m + 1, (size_t)mlen - 1) != 0)
            rc = sc_fail(sc, EXO_ECANCELED, "stopped by the caller");
    }
    if (rc == 0) {
        frame_release(sc);
        sc->ph = PH_LEN;
        sc->len_have = 0;
    }
    return rc;
}

static int on_len(exo_sc *sc)
{
    uint32_t l = exo_get_le32(sc->len_buf);
    size_t max = sc->established ? FRAME_MAX : EXO_SC_PREAUTH_FRAME_MAX;
    if (l < 1 + EXO_SC_ABYTES)
        return sc_fail(sc, EXO_EFORMAT, "a frame length of %u bytes is shorter than the minimum %d", l,
                       1 + EXO_SC_ABYTES);
    if (l > max)
        return sc_fail(sc, EXO_ETOOBIG, "a frame length of %u bytes exceeds the limit of %zu%s", l, max,
                       sc->established ? "" : " before authentication");
    if (l > sc->frame_cap) {
        if (l <= SMALL_FRAME) {
            size_t cap = sc->frame_cap ? sc->frame_cap : 512;
            while (cap < l)
                cap *= 2;
            sc->frame = exo_realloc(sc->frame, cap);
            sc->frame_cap = cap;
        } else {
            exo_free(sc->frame);
            sc->frame = exo_try_malloc(l);
            sc->frame_cap = sc->frame ? l : 0;
            if (!sc->frame)
                return sc_fail(sc, EXO_ENOMEM, "no memory for a frame of %u bytes", l);
        }
    }
    sc->frame_len = l;
    sc->frame_have = 0;
    sc->ph = PH_BODY;
    return 0;
}

int exo_sc_recv(exo_sc *sc, const uint8_t *bytes, size_t len, const exo_sc_handlers *hd, void *ctx,
                exo_err *err)
{
    if (sc->failed)
        return report(sc, err);
    while (len > 0) {
        size_t take;
        int rc = 0;
        switch (sc->ph) {
        case PH_HELLO:
            take = EXO_SC_HELLO_LEN - sc->peer_hello_have;
            take = take < len ? take : len;
            memcpy(sc->peer_hello + sc->peer_hello_have, bytes, take);
            sc->peer_hello_have += take;
            if (sc->peer_hello_have == EXO_SC_HELLO_LEN) {
                rc = on_hello(sc);
                sc->ph = PH_HEADER;
            }
            break;
        case PH_HEADER:
            take = EXO_SC_HEADER_LEN - sc->peer_header_have;
            take = take < len ? take : len;
            memcpy(sc->peer_header + sc->peer_header_have, bytes, take);
            sc->peer_header_have += take;
            if (sc->peer_header_have == EXO_SC_HEADER_LEN) {
                if (crypto_secretstream_xchacha20poly1305_init_pull(&sc->rx, sc->peer_header, sc->k_rx) != 0)
                    rc = sc_fail(sc, EXO_EFORMAT, "handshake: unusable stream header");
                sodium_memzero(sc->k_rx, sizeof sc->k_rx);
                sc->ph = PH_LEN;
                sc->len_have = 0;
            }
            break;
        case PH_LEN:
            take = 4 - sc->len_have;
            take = take < len ? take : len;
            memcpy(sc->len_buf + sc->len_have, bytes, take);
            sc->len_have += take;
            if (sc->len_have == 4)
                rc = on_len(sc);
            break;
        case PH_BODY:
        default:
            take = sc->frame_len - sc->frame_have;
            take = take < len ? take : len;
            memcpy(sc->frame + sc->frame_have, bytes, take);
            sc->frame_have += take;
            if (sc->frame_have == sc->frame_len)
                rc = on_frame(sc, hd, ctx);
            break;
        }
        if (rc < 0)
            return report(sc, err);
        bytes += take;
        len -= take;
    }
    return 0;
}

int exo_sc_send(exo_sc *sc, uint8_t type, const void *payload, size_t len, exo_err *err)
{
    if (sc->failed)
        return report(sc, err);
    if (!sc->established)
        return exo_err_set(err, EXO_EINVAL, "secure channel: cannot send before the handshake completed");
    if (type == 0 || type == EXO_SC_TYPE_AUTH)
        return exo_err_set(err, EXO_EINVAL, "secure channel: frame type 0x%02x is not sendable", type);
    if (len > EXO_SC_PAYLOAD_MAX)
        return exo_err_set(err, EXO_ETOOBIG,
                           "secure channel: a payload of %zu bytes exceeds the limit of %zu", len,
                           EXO_SC_PAYLOAD_MAX);
    size_t n = len + EXO_SC_FRAME_OVERHEAD;
    uint8_t *buf = n <= SMALL_FRAME ? exo_malloc(n) : exo_try_malloc(n);
    if (!buf)
        return exo_err_set(err, EXO_ENOMEM, "secure channel: no memory for a frame of %zu bytes", n);
    seal_into(sc, buf, type, payload, len);
    queue_push(sc, buf, n);
    return 0;
}

const uint8_t *exo_sc_out(exo_sc *sc, size_t *len)
{
    if (sc->q_count == 0) {
        *len = 0;
        return NULL;
    }
    chunk *c = &sc->q[sc->q_head];
    *len = c->len - sc->head_off;
    return c->data + sc->head_off;
}

void exo_sc_out_consume(exo_sc *sc, size_t n)
{
    while (n > 0 && sc->q_count > 0) {
        chunk *c = &sc->q[sc->q_head];
        size_t left = c->len - sc->head_off;
        size_t take = n < left ? n : left;
        sc->head_off += take;
        sc->pending -= take;
        n -= take;
        if (sc->head_off == c->len) {
            exo_free(c->data);
            sc->q_head = (sc->q_head + 1) % sc->q_cap;
            sc->q_count--;
            sc->head_off = 0;
        }
    }
}

uint8_t *exo_sc_out_take(exo_sc *sc, size_t *len)
{
    if (sc->q_count == 0) {
        *len = 0;
        return NULL;
    }
    chunk c = sc->q[sc->q_head];
    if (sc->head_off) { /* a caller that mixed consume and take */
        memmove(c.data, c.data + sc->head_off, c.len - sc->head_off);
        c.len -= sc->head_off;
    }
    sc->pending -= c.len;
    sc->q_head = (sc->q_head + 1) % sc->q_cap;
    sc->q_count--;
    sc->head_off = 0;
    *len = c.len;
    return c.data;
}

size_t exo_sc_out_pending(const exo_sc *sc) { return sc->pending; }
bool exo_sc_established(const exo_sc *sc) { return sc->established && !sc->failed; }
bool exo_sc_initiator(const exo_sc *sc) { return sc->initiator; }
const char *exo_sc_peer_id(const exo_sc *sc) { return sc->established ? sc->peer_id : NULL; }
uint16_t exo_sc_peer_flags(const exo_sc *sc) { return sc->peer_flags; }
bool exo_sc_peer_hello_seen(const exo_sc *sc) { return sc->peer_hello_seen; }
const uint8_t *exo_sc_session_id(const exo_sc *sc) { return sc->have_h ? sc->h : NULL; }
const char *exo_sc_error(const exo_sc *sc) { return sc->failed ? sc->err_msg : NULL; }
