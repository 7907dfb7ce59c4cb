/* libFuzzer target for what a ring neighbour can send a split model's
 * rank: the byte stream on the link (exo_ring_recv's framing) and each
 * frame's fields (exo_dist_frame_parse against a rank's shape). The first
 * byte picks the shape (tensor or pipeline, slots); the rest is the stream.
 * A frame that parses must satisfy the shape (slot, sizes, ids in the
 * vocabulary), and a sample must re-encode to the bytes it came from. */
// FUZZ_SOURCES: src/runner/ring.c src/runner/dist_frames.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c src/proto/sampling.c
// FUZZ_LIBS: -lsodium -lm
#include "runner/dist_frames.h"
#include "runner/ring.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const exo_ring_msg *m, const exo_dist_shape *sh)
{
    exo_dist_frame f;
    exo_err err = {0};
    if (exo_dist_frame_parse(m, sh, &f, &err)) {
        if (!err.msg[0])
            abort(); /* every rejection names its reason */
        return;
    }
    /* a step names a pipeline slot; BEGIN, SAMPLE and SEQ a batch slot */
    bool pipeline_slot = f.type == EXO_DIST_HIDDEN || f.type == EXO_DIST_TOKENS;
    if (f.slot < 0 || f.slot >= (pipeline_slot ? sh->n_slots : EXO_DIST_MAX_BATCH))
        abort();
    switch (f.type) {
    case EXO_DIST_BEGIN: {
        int32_t *ids = malloc(4 * (size_t)(f.n_prompt + 1));
        exo_dist_frame_prompt(&f, ids);
        for (int i = 0; i < f.n_prompt; i++)
            if (ids[i] < 0 || ids[i] >= sh->vocab)
                abort();
        free(ids);
        if (f.sampling.top_logprobs < 0 || f.sampling.top_logprobs > EXO_MAX_TOP_LOGPROBS)
            abort();
        break;
    }
    case EXO_DIST_HIDDEN:
    case EXO_DIST_TOKENS:
        if (f.T <= 0 || m->len != (size_t)f.T * (f.type == EXO_DIST_HIDDEN ? 4u * (size_t)sh->hidden_size : 4u))
            abort();
        break;
    case EXO_DIST_SAMPLE: {
        unsigned char buf[EXO_DIST_SAMPLE_MAX];
        if (f.sample.id < 0 || f.sample.id >= sh->vocab || f.sample.n_top > EXO_MAX_TOP_LOGPROBS)
            abort();
        size_t n = exo_dist_encode_sample(&f.sample, buf);
        if (n != m->len || memcmp(buf, m->payload, n))
            abort();
        break;
    }
    case EXO_DIST_SEQ: {
        bool ok = f.x >= 0 && f.y >= 0 && f.y <= EXO_DIST_MAX_POS;
        switch (f.seq_op) {
        case EXO_DIST_SEQ_RESIZE: ok = ok && f.x >= 1 && f.x <= EXO_DIST_MAX_POS && f.y <= f.x; break;
        case EXO_DIST_SEQ_COPY: ok = ok && f.x < EXO_DIST_MAX_BATCH && f.x != f.slot; break;
        case EXO_DIST_SEQ_KEEP:
        case EXO_DIST_SEQ_TAKE: ok = ok && f.y >= 1; break; /* x: an entry's id */
        case EXO_DIST_SEQ_DROP: ok = ok && f.y == 0; break;
        default: ok = false;
        }
        if (!ok)
            abort();
        break;
    }
    case EXO_DIST_BATCH: {
        /* every row in range, and the rows re-encode to the bytes they came from */
        if (!sh->tensor || f.n_rows < 1 || f.n_rows > EXO_DIST_BATCH_ROWS)
            abort();
        int slots[EXO_DIST_BATCH_ROWS], pos0[EXO_DIST_BATCH_ROWS], T[EXO_DIST_BATCH_ROWS];
        int32_t *all = malloc(m->len + 4), *ids[EXO_DIST_BATCH_ROWS];
        for (int i = 0, at = 0; i < f.n_rows; at += T[i++]) {
            ids[i] = all + at; /* the rows' ids together are fewer than len / 4 */
            exo_dist_frame_batch_row(&f, i, &slots[i], &pos0[i], &T[i], ids[i]);
            if (slots[i] < 0 || slots[i] >= EXO_DIST_MAX_BATCH || T[i] < 1 || pos0[i] < 0 ||
                pos0[i] > EXO_DIST_MAX_POS)
                abort();
            for (int t = 0; t < T[i]; t++)
                if (ids[i][t] < 0 || ids[i][t] >= sh->vocab)
                    abort();
        }
        size_t n = exo_dist_batch_bytes(f.n_rows, T);
        unsigned char *buf = malloc(n);
        exo_dist_encode_batch(f.n_rows, slots, pos0, T, (const int32_t *const *)ids, buf);
        if (n != m->len || memcmp(buf, m->payload, n))
            abort();
        free(buf);
        free(all);
        break;
    }
    case EXO_DIST_ROWS: {
        /* every row in range, the hidden states exactly the rows' worth, and
         * the row headers re-encode to the bytes they came from */
        if (sh->tensor || f.n_rows < 1 || f.n_rows > EXO_DIST_BATCH_ROWS)
            abort();
        int slots[EXO_DIST_BATCH_ROWS], pos0[EXO_DIST_BATCH_ROWS], T[EXO_DIST_BATCH_ROWS];
        bool want[EXO_DIST_BATCH_ROWS];
        int64_t rows = 0;
        for (int i = 0; i < f.n_rows; i++) {
            exo_dist_frame_rows_row(&f, i, &slots[i], &pos0[i], &T[i], &want[i]);
            if (slots[i] < 0 || slots[i] >= EXO_DIST_MAX_BATCH || T[i] < 1 || pos0[i] < 0 ||
                pos0[i] > EXO_DIST_MAX_POS)
                abort();
            for (int k = 0; k < i; k++)
                if (slots[k] == slots[i])
                    abort();
            rows += T[i];
        }
        if (rows != f.T_total || m->len != 16 * (size_t)f.n_rows + 4 * (size_t)rows * (size_t)sh->hidden_size ||
            (const unsigned char *)f.data != (const unsigned char *)m->payload + 16 * (size_t)f.n_rows)
            abort();
        unsigned char head[16 * EXO_DIST_BATCH_ROWS];
        exo_dist_encode_rows(f.n_rows, slots, pos0, T, want, head);
        if (memcmp(head, m->payload, 16 * (size_t)f.n_rows))
            abort();
        break;
    }
    default:
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 20))
        return 0;
    exo_dist_shape sh = {1 + (data[0] >> 1) % EXO_DIST_MAX_SLOTS, 512, 8, data[0] & 1};
    int link[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, link))
        return 0;
    /* the whole stream is written, then the writer closes: the reader meets
     * end of stream where the bytes run out, never a timeout */
    size_t left = size - 1;
    const uint8_t *p = data + 1;
    int buf = 4 << 20;
    setsockopt(link[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    while (left) {
        ssize_t k = write(link[0], p, left);
        if (k <= 0)
            break;
        p += k;
        left -= (size_t)k;
    }
    close(link[0]);
    exo_ring *r = exo_ring_wrap(1, 2, link[1], -1, 1000);
    for (int i = 0; i < 64; i++) {
        exo_ring_msg m;
        exo_err err = {0};
        if (exo_ring_recv(r, &m, 1000, &err))
            break;
        check(&m, &sh);
    }
    exo_ring_free(r);
    return 0;
}
