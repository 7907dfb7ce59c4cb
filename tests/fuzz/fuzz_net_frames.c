/* libFuzzer target for the secure channel after a genuine handshake. Two
 * channels (initiator I, responder R) complete a real in-memory handshake,
 * then byte 0 picks the mode (bit 0) and how streams are cut into chunks:
 *   raw (bit 0 = 0): the rest is fed to R as if I had sent it, then to I as
 *     if R had: garbage after authentication must never crash or leak, and
 *     a channel that failed stays failed;
 *   frames (bit 0 = 1): the rest is a list of records
 *     [flags u8][type u8][len u16 LE][payload], flags bit 0 = direction,
 *     bit 1 = tamper: each record is sealed by its sender and fed to the
 *     other side, which must deliver exactly that type and payload, in
 *     order; a tampered frame must be refused (error, nothing delivered).
 * Randomness is a PRNG reset per input, so the keys repeat and seeds may
 * hold genuine sealed frames for the raw mode. */
// FUZZ_SOURCES: src/net/secure_channel.c src/net/identity.c src/core/bytes.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c
// FUZZ_LIBS: -lsodium
#include "core/alloc.h"
#include "net/secure_channel.h"
#include "fuzz_sodium_rng.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


static exo_identity id_i, id_r;
static const uint8_t psk[32] = {0x42};

/* What a receiver expects next (frames mode) or has seen (raw mode). */
typedef struct expect {
    uint8_t        type;
    const uint8_t *payload;
    size_t         len;
    bool           armed;
    size_t         delivered;
} expect;

static int on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len)
{
    expect *e = ctx;
    (void)sc;
    if (type == 0 || type == EXO_SC_TYPE_AUTH)
        abort(); /* the sc filters these */
    e->delivered++;
    if (e->armed) {
        if (type != e->type || len != e->len || (len && memcmp(payload, e->payload, len) != 0))
            abort();
        e->armed = false;
    }
    return 0;
}

static const exo_sc_handlers handlers = {NULL, on_frame};

static int feed(exo_sc *to, const uint8_t *p, size_t n, size_t chunk, expect *e, exo_err *err)
{
    for (size_t off = 0; off < n;) {
        size_t take = chunk < n - off ? chunk : n - off;
        int rc = exo_sc_recv(to, p + off, take, &handlers, e, err);
        if (rc < 0)
            return rc;
        off += take;
    }
    return 0;
}

/* Moves all of from's output into to. */
static int pump(exo_sc *from, exo_sc *to, size_t chunk, expect *e, exo_err *err)
{
    size_t len;
    uint8_t *p;
    int rc = 0;
    while ((p = exo_sc_out_take(from, &len))) {
        if (rc == 0)
            rc = feed(to, p, len, chunk, e, err);
        exo_free(p);
    }
    return rc;
}

static void handshake(exo_sc **i, exo_sc **r)
{
    exo_err err = {0};
    rng_state = 7;
    if (exo_sc_new(&id_i, psk, true, 0, i, &err) || exo_sc_new(&id_r, psk, false, 0, r, &err))
        abort();
    expect none = {0};
    for (int round = 0; round < 4; round++) {
        if (pump(*i, *r, 4096, &none, &err) || pump(*r, *i, 4096, &none, &err))
            abort();
    }
    if (!exo_sc_established(*i) || !exo_sc_established(*r))
        abort();
}

static void raw_mode(exo_sc *i, exo_sc *r, const uint8_t *data, size_t size, size_t chunk)
{
    exo_err err = {0};
    expect e = {0};
    int rc = feed(r, data, size, chunk, &e, &err);
    if (rc < 0 && (!err.msg[0] || exo_sc_established(r) || !exo_sc_error(r)))
        abort();
    e = (expect){0};
    rc = feed(i, data, size, chunk, &e, &err);
    if (rc < 0) {
        exo_err again = {0};
        if (exo_sc_recv(i, data, size, &handlers, &e, &again) != rc)
            abort();
        if (exo_sc_out_pending(i) != 0)
            abort();
    }
}

static void frames_mode(exo_sc *i, exo_sc *r, const uint8_t *data, size_t size, size_t chunk)
{
    size_t off = 0;
    while (size - off >= 4) {
        uint8_t flags = data[off], type = data[off + 1];
        size_t len = (size_t)data[off + 2] | (size_t)data[off + 3] << 8;
        off += 4;
        if (len > size - off)
            len = size - off;
        const uint8_t *payload = data + off;
        off += len;
        exo_sc *from = (flags & 1) ? r : i, *to = (flags & 1) ? i : r;
        exo_err err = {0};
        int rc = exo_sc_send(from, type, payload, len, &err);
        if (type == 0 || type == EXO_SC_TYPE_AUTH) {
            if (rc != EXO_EINVAL || exo_sc_out_pending(from) != 0)
                abort();
            continue;
        }
        if (rc != 0 || exo_sc_out_pending(from) != len + EXO_SC_FRAME_OVERHEAD)
            abort();
        expect e = {.type = type, .payload = payload, .len = len, .armed = true};
        if (flags & 2) {
            size_t n;
            uint8_t *p = exo_sc_out_take(from, &n);
            size_t at = (len ? payload[0] * 131u + (size_t)flags : flags) % n;
            p[at] ^= (uint8_t)(1u << (flags >> 5));
            rc = feed(to, p, n, chunk, &e, &err);
            exo_free(p);
            /* refused, or (length prefix grown) still waiting: never delivered */
            if (e.delivered != 0)
                abort();
            return;
        }
        if (pump(from, to, chunk, &e, &err) != 0 || e.armed || e.delivered != 1)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        fuzz_sodium_start();
        fuzz_identity(1, &id_i);
        fuzz_identity(2, &id_r);
        ready = true;
    }
    if (size < 1)
        return 0;
    exo_sc *i, *r;
    handshake(&i, &r);
    size_t chunk = (size_t)(data[0] >> 1) * 3 + 1;
    if (data[0] & 1)
        frames_mode(i, r, data + 1, size - 1, chunk);
    else
        raw_mode(i, r, data + 1, size - 1, chunk);
    exo_sc_free(i);
    exo_sc_free(r);
    return 0;
}
