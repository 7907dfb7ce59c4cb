/* libFuzzer target for the secure channel before authentication: the input
 * is what a stranger (who does not hold the psk) sends on a fresh
 * connection. It is fed, as the peer's byte stream, to a fresh responder
 * and to a fresh initiator; byte 0 and 1 choose how the stream is cut into
 * chunks. Whatever happens, neither side may crash, leak, deliver a frame
 * or become established, an error must name its reason, and a failed
 * channel must stay failed and output nothing.
 *
 * libsodium's randomness is replaced by a PRNG reset for every input, so a
 * run is reproducible (the ephemeral keys are the same each time; the
 * fuzzer still cannot forge frames without the psk-derived keys). */
// FUZZ_SOURCES: src/net/secure_channel.c src/net/identity.c src/core/bytes.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c
// FUZZ_LIBS: -lsodium
#include "core/alloc.h"
#include "net/secure_channel.h"
#include "fuzz_sodium_rng.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


static exo_identity ident;
static const uint8_t psk[32] = {0x42};

static int on_established(void *ctx, exo_sc *sc)
{
    (void)ctx;
    (void)sc;
    abort(); /* nobody without the psk gets here */
}

static int on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len)
{
    (void)ctx;
    (void)sc;
    (void)type;
    (void)payload;
    (void)len;
    abort();
}

static const exo_sc_handlers handlers = {on_established, on_frame};

static void run(bool initiator, const uint8_t *data, size_t size, size_t chunk_a, size_t chunk_b)
{
    exo_sc *sc;
    exo_err err = {0};
    if (exo_sc_new(&ident, psk, initiator, initiator ? EXO_SC_FLAG_PROBE : 0, &sc, &err) != 0)
        abort();
    size_t off = 0, k = 0;
    int rc = 0;
    while (off < size) {
        size_t chunk = (k++ & 1) ? chunk_b : chunk_a;
        size_t take = chunk < size - off ? chunk : size - off;
        rc = exo_sc_recv(sc, data + off, take, &handlers, NULL, &err);
        /* drain what a socket would write */
        size_t len;
        uint8_t *p;
        while ((p = exo_sc_out_take(sc, &len)))
            exo_free(p);
        if (rc < 0)
            break;
        off += take;
    }
    if (exo_sc_established(sc) || exo_sc_peer_id(sc))
        abort();
    if (rc < 0) {
        if (!err.msg[0] || !exo_sc_error(sc))
            abort();
        /* terminal: more input gives the same error and no output */
        exo_err again = {0};
        if (exo_sc_recv(sc, data, size, &handlers, NULL, &again) != rc || strcmp(again.msg, err.msg) != 0)
            abort();
        if (exo_sc_out_pending(sc) != 0 || exo_sc_send(sc, 1, "x", 1, &again) == 0)
            abort();
    } else {
        if (exo_sc_error(sc))
            abort();
        if (exo_sc_send(sc, 1, "x", 1, &err) != EXO_EINVAL) /* not established */
            abort();
    }
    exo_sc_free(sc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        fuzz_sodium_start();
        fuzz_identity(1, &ident);
        ready = true;
    }
    if (size < 2)
        return 0;
    size_t chunk_a = (size_t)data[0] + 1, chunk_b = (size_t)data[1] * 7 + 1;
    data += 2;
    size -= 2;
    rng_state = 1;
    run(false, data, size, chunk_a, chunk_b);
    rng_state = 2;
    run(true, data, size, chunk_a, chunk_b);
    return 0;
}
