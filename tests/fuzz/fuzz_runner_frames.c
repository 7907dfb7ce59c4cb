/* libFuzzer target for the runner protocol decoder: the bytes a crashed or
 * hostile runner (or node) could put on the socket. The first byte picks
 * the mode: even -> the rest is a byte stream split into frames (as
 * exo_runner_chan does), odd -> the rest is one frame payload. Whatever
 * decodes must re-encode and decode again to the same message, and a
 * framing error must stop the stream. */
// FUZZ_SOURCES: src/runner/protocol.c src/proto/gen_types.c src/core/json_util.c src/core/budget.c src/core/sbuf.c src/proto/types.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/proto/sampling.c
#include "core/alloc.h"
#include "runner/protocol.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *payload, size_t len)
{
    exo_runner_msg m, again;
    exo_err err = {0};
    if (exo_runner_msg_decode(payload, len, &m, &err)) {
        if (!err.msg[0])
            abort(); /* every rejection names its reason */
        exo_runner_msg_free(&m);
        return;
    }
    exo_sbuf b;
    exo_sbuf_init(&b);
    int rc = exo_runner_msg_encode(&m, &b, &err);
    if (rc == 0) {
        const char *p;
        size_t plen, used;
        if (exo_runner_frame_next(b.data, b.len, &p, &plen, &used, &err) != 1 || used != b.len)
            abort();
        if (exo_runner_msg_decode(p, plen, &again, &err))
            abort(); /* what we encode, we decode */
        if (again.kind != m.kind || strcmp(again.command_id, m.command_id))
            abort();
        if (m.kind == EXO_RMSG_STATUS && !exo_runner_status_equal(&m.status, &again.status))
            abort();
        if (m.kind == EXO_RMSG_LOAD_MODEL &&
            (strcmp(m.load.model_dir, again.load.model_dir) || m.load.ctx != again.load.ctx ||
             m.load.n_threads != again.load.n_threads ||
             m.load.warmup_tokens != again.load.warmup_tokens || m.load.world != again.load.world ||
             m.load.rank != again.load.rank || m.load.tensor != again.load.tensor ||
             m.load.start_layer != again.load.start_layer || m.load.end_layer != again.load.end_layer ||
             strcmp(m.load.ring_key, again.load.ring_key)))
            abort();
        if (m.kind == EXO_RMSG_CONNECT &&
            (strcmp(m.connect.host, again.connect.host) || m.connect.port != again.connect.port))
            abort();
        if (m.kind == EXO_RMSG_CHUNK && m.chunk.kind != again.chunk.kind)
            abort();
        exo_runner_msg_free(&again);
    } else if (rc != EXO_ETOOBIG) {
        abort(); /* a decoded message is always encodable */
    }
    exo_sbuf_free(&b);
    exo_runner_msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *buf = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] & 1) {
        check(buf, len);
        return 0;
    }
    size_t off = 0;
    for (;;) {
        const char *payload;
        size_t plen, used;
        exo_err err = {0};
        int rc = exo_runner_frame_next(buf + off, len - off, &payload, &plen, &used, &err);
        if (rc <= 0)
            break;
        if (used > len - off || plen + 4 != used)
            abort();
        check(payload, plen);
        off += used;
    }
    return 0;
}
