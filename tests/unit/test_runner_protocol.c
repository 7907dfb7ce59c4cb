/* Runner protocol: every message kind survives encode -> frame -> decode,
 * the frame splitter handles partial input and rejects bad lengths, the
 * decoder rejects malformed payloads with a message naming the problem, and
 * a channel over a real socketpair moves frames (also big ones) intact. */
#include "core/alloc.h"
#include "runner/protocol.h"

#include <criterion/criterion.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void roundtrip(const exo_runner_msg *in, exo_runner_msg *out)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_err err = {0};
    cr_assert_eq(exo_runner_msg_encode(in, &b, &err), 0, "%s", err.msg);
    const char *payload;
    size_t plen, used;
    cr_assert_eq(exo_runner_frame_next(b.data, b.len, &payload, &plen, &used, &err), 1);
    cr_assert_eq(used, b.len);
    cr_assert_eq(plen + 4, b.len);
    /* every strict prefix is incomplete */
    for (size_t i = 0; i < b.len; i++)
        cr_assert_eq(exo_runner_frame_next(b.data, i, &payload, &plen, &used, &err), 0);
    cr_assert_eq(exo_runner_msg_decode(payload, plen, out, &err), 0, "%s: %s", payload, err.msg);
    cr_assert_eq(out->kind, in->kind);
    exo_sbuf_free(&b);
}

static int decode_str(const char *json, exo_runner_msg *m, exo_err *err)
{
    return exo_runner_msg_decode(json, strlen(json), m, err);
}

Test(runner_protocol, load_model_roundtrip)
{
    exo_runner_msg m, o;
    exo_runner_msg_init(&m, EXO_RMSG_LOAD_MODEL);
    m.load.model_dir = exo_strdup("/models/Qwen3-0.6B");
    m.load.n_threads = 2;
    m.load.ctx = 8192;
    m.load.warmup_tokens = 16;
    roundtrip(&m, &o);
    cr_assert_str_eq(o.load.model_dir, "/models/Qwen3-0.6B");
    cr_assert_eq(o.load.n_threads, 2);
    cr_assert_eq(o.load.ctx, 8192);
    cr_assert_eq(o.load.warmup_tokens, 16);
    cr_assert_str_eq(o.load.device, "");
    exo_runner_msg_free(&o);
    snprintf(m.load.device, sizeof m.load.device, "cuda:3");
    roundtrip(&m, &o);
    cr_assert_str_eq(o.load.device, "cuda:3");
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);
}

Test(runner_protocol, generate_roundtrip)
{
    exo_runner_msg m, o;
    exo_runner_msg_init(&m, EXO_RMSG_GENERATE);
    strcpy(m.command_id, "3f1c2a9e-0000-4000-8000-000000000001");
    m.request.model = exo_strdup("m");
    m.request.messages = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi \xc3\xa9");
    m.request.max_tokens = 7;
    m.request.sampling.temperature = 0.5f;
    m.request.sampling.seed = 123456789012345ULL;
    m.request.has = EXO_GEN_HAS_MAX_TOKENS | EXO_GEN_HAS_TEMPERATURE | EXO_GEN_HAS_SEED;
    exo_err err;
    cr_assert_eq(exo_gen_add_stop(&m.request, "\n\n", &err), 0);
    m.request.enable_thinking = 0;
    roundtrip(&m, &o);
    cr_assert_str_eq(o.command_id, m.command_id);
    cr_assert_str_eq(o.request.model, "m");
    cr_assert(json_equal(o.request.messages, m.request.messages));
    cr_assert_eq(o.request.max_tokens, 7);
    cr_assert_eq(o.request.has & ~(uint32_t)EXO_GEN_HAS_TOP_LOGPROBS, m.request.has);
    cr_assert_eq(o.request.sampling.seed, 123456789012345ULL);
    cr_assert_eq(o.request.n_stop, 1);
    cr_assert_str_eq(o.request.stop[0], "\n\n");
    cr_assert_eq(o.request.enable_thinking, 0);
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);
}

Test(runner_protocol, small_messages_roundtrip)
{
    exo_runner_msg m, o;
    exo_runner_msg_kind kinds[] = {EXO_RMSG_CANCEL, EXO_RMSG_DONE, EXO_RMSG_SHUTDOWN};
    for (int i = 0; i < 3; i++) {
        exo_runner_msg_init(&m, kinds[i]);
        if (kinds[i] != EXO_RMSG_SHUTDOWN)
            strcpy(m.command_id, "cmd-1");
        roundtrip(&m, &o);
        cr_assert_str_eq(o.command_id, m.command_id);
        cr_assert_eq(exo_runner_msg_is_down(kinds[i]), kinds[i] != EXO_RMSG_DONE);
        exo_runner_msg_free(&m);
        exo_runner_msg_free(&o);
    }
}

Test(runner_protocol, status_roundtrip)
{
    exo_runner_msg m, o;
    exo_runner_msg_init(&m, EXO_RMSG_STATUS);
    m.status.kind = EXO_RUNNER_LOADING;
    m.status.layers_loaded = 3;
    m.status.total_layers = 28;
    roundtrip(&m, &o);
    cr_assert(exo_runner_status_equal(&o.status, &m.status));
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);

    exo_runner_msg_init(&m, EXO_RMSG_STATUS);
    m.status.kind = EXO_RUNNER_FAILED;
    m.status.error_message = exo_strdup("config.json: no such file");
    roundtrip(&m, &o);
    cr_assert(exo_runner_status_equal(&o.status, &m.status));
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);

    for (int k = 0; k < EXO_RUNNER__COUNT; k++) {
        if (k == EXO_RUNNER_LOADING || k == EXO_RUNNER_FAILED)
            continue;
        exo_runner_msg_init(&m, EXO_RMSG_STATUS);
        m.status.kind = (exo_runner_status_kind)k;
        roundtrip(&m, &o);
        cr_assert(exo_runner_status_equal(&o.status, &m.status), "%d", k);
        exo_runner_msg_free(&m);
        exo_runner_msg_free(&o);
    }
}

Test(runner_protocol, chunk_roundtrip)
{
    exo_runner_msg m, o;
    exo_runner_msg_init(&m, EXO_RMSG_CHUNK);
    strcpy(m.command_id, "c");
    exo_chunk_token(&m.chunk, "h\xc3\xa9llo", 6, 42, true);
    m.chunk.has_logprob = true;
    m.chunk.logprob = -0.5f;
    exo_chunk_set_top(&m.chunk, 0, "x", -0.25f);
    roundtrip(&m, &o);
    cr_assert_eq(o.chunk.kind, EXO_CHUNK_TOKEN);
    cr_assert_str_eq(o.chunk.text, "h\xc3\xa9llo");
    cr_assert_eq(o.chunk.token_id, 42);
    cr_assert(o.chunk.is_thinking);
    cr_assert_eq(o.chunk.n_top, 1);
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);

    exo_runner_msg_init(&m, EXO_RMSG_CHUNK);
    strcpy(m.command_id, "c");
    exo_usage u = {10, 5, 2, 0};
    exo_chunk_finish(&m.chunk, EXO_FR_LENGTH, &u, 100.0, 20.0);
    roundtrip(&m, &o);
    cr_assert_eq(o.chunk.kind, EXO_CHUNK_FINISH);
    cr_assert_eq(o.chunk.reason, EXO_FR_LENGTH);
    cr_assert_eq(o.chunk.usage.completion_tokens, 5);
    exo_runner_msg_free(&m);
    exo_runner_msg_free(&o);
}

Test(runner_protocol, encode_rejects_bad_messages)
{
    exo_runner_msg m;
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_err err = {0};
    exo_runner_msg_init(&m, EXO_RMSG_CANCEL);
    strcpy(m.command_id, "has space");
    cr_assert_eq(exo_runner_msg_encode(&m, &b, &err), EXO_EINVAL);
    m.command_id[0] = 0;
    cr_assert_eq(exo_runner_msg_encode(&m, &b, &err), EXO_EINVAL);
    exo_runner_msg_init(&m, EXO_RMSG_STATUS);
    m.status.kind = EXO_RUNNER_LOADING;
    m.status.layers_loaded = 5;
    m.status.total_layers = 3;
    cr_assert_eq(exo_runner_msg_encode(&m, &b, &err), EXO_EINVAL);
    exo_runner_msg_init(&m, EXO_RMSG_LOAD_MODEL);
    cr_assert_eq(exo_runner_msg_encode(&m, &b, &err), EXO_EINVAL); /* no model_dir */
    cr_assert_eq(b.len, 0);
    /* over the frame limit */
    exo_runner_msg_init(&m, EXO_RMSG_CHUNK);
    strcpy(m.command_id, "c");
    size_t big = EXO_RUNNER_FRAME_MAX + 10;
    char *text = exo_malloc(big + 1);
    memset(text, 'a', big);
    text[big] = 0;
    exo_chunk_token(&m.chunk, text, big, 1, false);
    exo_free(text);
    cr_assert_eq(exo_runner_msg_encode(&m, &b, &err), EXO_ETOOBIG);
    cr_assert_eq(b.len, 0);
    exo_runner_msg_free(&m);
    exo_sbuf_free(&b);
}

Test(runner_protocol, frame_lengths)
{
    const char *payload;
    size_t plen, used;
    exo_err err = {0};
    const char zero[8] = {0, 0, 0, 0, 'x'};
    cr_assert_eq(exo_runner_frame_next(zero, 5, &payload, &plen, &used, &err), EXO_EFORMAT);
    const char huge[4] = {(char)0xff, (char)0xff, (char)0xff, (char)0xff};
    cr_assert_eq(exo_runner_frame_next(huge, 4, &payload, &plen, &used, &err), EXO_EFORMAT);
    unsigned n = (unsigned)EXO_RUNNER_FRAME_MAX + 1;
    char over[4] = {(char)n, (char)(n >> 8), (char)(n >> 16), (char)(n >> 24)};
    cr_assert_eq(exo_runner_frame_next(over, 4, &payload, &plen, &used, &err), EXO_EFORMAT);
    char two[] = "\x02\x00\x00\x00{}\x01\x00\x00\x00x";
    cr_assert_eq(exo_runner_frame_next(two, sizeof two - 1, &payload, &plen, &used, &err), 1);
    cr_assert_eq(plen, 2);
    cr_assert_eq(used, 6);
}

Test(runner_protocol, decode_rejects_malformed)
{
    static const char *const bad[] = {
        "",
        "not json",
        "[1,2]",
        "{}",
        "{\"type\":\"Nope\"}",
        "{\"type\":7}",
        "{\"type\":\"Shutdown\",\"extra\":1}",
        "{\"type\":\"Cancel\"}",
        "{\"type\":\"Cancel\",\"command_id\":\"\"}",
        "{\"type\":\"Cancel\",\"command_id\":\"a b\"}",
        "{\"type\":\"Cancel\",\"command_id\":\"a\\u0000b\"}",
        "{\"type\":\"Cancel\",\"command_id\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
        "{\"type\":\"Cancel\",\"command_id\":\"a\",\"command_id\":\"b\"}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1,\"ctx\":-5,\"warmup_tokens\":0}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"\",\"n_threads\":1,\"ctx\":0,\"warmup_tokens\":0}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1,\"ctx\":0}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1.5,\"ctx\":0,\"warmup_tokens\":0}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1,\"ctx\":0,\"warmup_tokens\":0,\"device\":\"gpu\"}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1,\"ctx\":0,\"warmup_tokens\":0,\"device\":\"cuda:1\\u0000\"}",
        "{\"type\":\"LoadModel\",\"model_dir\":\"/m\",\"n_threads\":1,\"ctx\":0,\"warmup_tokens\":0,\"device\":7}",
        "{\"type\":\"Generate\",\"command_id\":\"c\"}",
        "{\"type\":\"Generate\",\"command_id\":\"c\",\"request\":{\"model\":\"m\"}}",
        "{\"type\":\"Generate\",\"command_id\":\"c\",\"request\":{\"model\":\"m\",\"messages\":[],\"temperature\":-1}}",
        "{\"type\":\"Status\"}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Sleeping\"}}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Loading\",\"layers_loaded\":5,\"total_layers\":3}}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Loading\"}}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Ready\",\"error_message\":\"x\"}}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Ready\",\"prefill_server_port\":70000}}",
        "{\"type\":\"Status\",\"status\":{\"kind\":\"Ready\",\"bogus\":1}}",
        "{\"type\":\"Chunk\",\"command_id\":\"c\"}",
        "{\"type\":\"Chunk\",\"command_id\":\"c\",\"chunk\":{\"type\":\"token\"}}",
        "{\"type\":\"Chunk\",\"command_id\":\"c\",\"chunk\":{\"type\":\"finish\",\"reason\":\"bogus\"}}",
        "{\"type\":\"Done\",\"command_id\":[1]}",
        "\"Shutdown\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        exo_runner_msg m;
        exo_err err = {0};
        cr_assert_lt(decode_str(bad[i], &m, &err), 0, "accepted: %s", bad[i]);
        cr_assert(err.msg[0], "no message for %s", bad[i]);
        exo_runner_msg_free(&m);
    }
    /* a Generate that fails keeps its id, so the runner can answer it */
    exo_runner_msg m;
    exo_err err = {0};
    cr_assert_lt(decode_str("{\"type\":\"Generate\",\"command_id\":\"c-9\",\"request\":{}}", &m, &err), 0);
    cr_assert_eq(m.kind, EXO_RMSG_GENERATE);
    cr_assert_str_eq(m.command_id, "c-9");
    exo_runner_msg_free(&m);
    cr_assert_eq(decode_str("{\"type\":\"Status\",\"status\":{\"kind\":\"Ready\",\"prefill_server_port\":-1}}",
                            &m, &err), 0, "%s", err.msg);
    exo_runner_msg_free(&m);
}

Test(runner_protocol, channel_over_socketpair)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    exo_runner_chan *a = exo_runner_chan_new(sv[0]), *b = exo_runner_chan_new(sv[1]);
    exo_err err = {0};
    exo_runner_msg m, o;
    /* a 1 MiB request: more than the socket buffer, so it goes out in pieces */
    exo_runner_msg_init(&m, EXO_RMSG_GENERATE);
    strcpy(m.command_id, "big");
    m.request.model = exo_strdup("m");
    size_t n = 1 << 20;
    char *text = exo_malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        text[i] = (char)('a' + i % 26);
    text[n] = 0;
    m.request.messages = json_pack("[{s:s,s:s}]", "role", "user", "content", text);
    cr_assert_eq(exo_runner_chan_send(a, &m, false, &err), 0, "%s", err.msg);
    exo_runner_msg_free(&m);
    exo_runner_msg_init(&m, EXO_RMSG_SHUTDOWN);
    cr_assert_eq(exo_runner_chan_send(a, &m, false, &err), 0);
    cr_assert_gt(exo_runner_chan_pending(a), 0);
    int got = 0;
    while (got < 2) {
        exo_runner_chan_flush(a, false);
        int r = exo_runner_chan_read(b, false);
        cr_assert(r > 0 || r == EXO_EBUSY);
        int rc;
        while ((rc = exo_runner_chan_next(b, &o, &err)) == 1) {
            if (got == 0) {
                cr_assert_eq(o.kind, EXO_RMSG_GENERATE);
                const char *c = json_string_value(
                    json_object_get(json_array_get(o.request.messages, 0), "content"));
                cr_assert_str_eq(c, text);
            } else {
                cr_assert_eq(o.kind, EXO_RMSG_SHUTDOWN);
            }
            got++;
            exo_runner_msg_free(&o);
        }
        cr_assert_eq(rc, 0, "%s", err.msg);
    }
    cr_assert_eq(exo_runner_chan_pending(a), 0);
    exo_free(text);
    /* garbage breaks the channel for good */
    cr_assert_eq(write(sv[0], "\xff\xff\xff\xff", 4), 4);
    cr_assert_gt(exo_runner_chan_read(b, true), 0);
    cr_assert_eq(exo_runner_chan_next(b, &o, &err), EXO_EFORMAT);
    cr_assert(exo_runner_chan_broken(b));
    cr_assert_lt(exo_runner_chan_next(b, &o, &err), 0);
    /* end of stream */
    exo_runner_chan_free(a);
    cr_assert_eq(exo_runner_chan_read(b, true), 0);
    exo_runner_chan_free(b);
}
