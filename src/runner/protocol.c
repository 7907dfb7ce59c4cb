/* Runner protocol: frame codec, message JSON codec, and the buffered socket
 * channel both ends use (see protocol.h for the format and the rules). */
#include "runner/protocol.h"

#include "core/json_util.h"
#include "core/alloc.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *const msg_names[] = {
    [EXO_RMSG_LOAD_MODEL] = "LoadModel", [EXO_RMSG_GENERATE] = "Generate",
    [EXO_RMSG_CANCEL] = "Cancel",        [EXO_RMSG_SHUTDOWN] = "Shutdown",
    [EXO_RMSG_STATUS] = "Status",        [EXO_RMSG_CHUNK] = "Chunk",
    [EXO_RMSG_DONE] = "Done",            [EXO_RMSG_CONNECT] = "Connect",
};

const char *exo_runner_msg_name(exo_runner_msg_kind k)
{
    if ((int)k < EXO_RMSG_LOAD_MODEL || (int)k > EXO_RMSG_CONNECT)
        return "?";
    return msg_names[k];
}

bool exo_runner_msg_is_down(exo_runner_msg_kind k)
{
    return (k >= EXO_RMSG_LOAD_MODEL && k <= EXO_RMSG_SHUTDOWN) || k == EXO_RMSG_CONNECT;
}

void exo_runner_msg_init(exo_runner_msg *m, exo_runner_msg_kind kind)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    exo_gen_request_init(&m->request);
    exo_runner_status_init(&m->status, EXO_RUNNER_IDLE);
}

void exo_runner_msg_free(exo_runner_msg *m)
{
    exo_free(m->load.model_dir);
    exo_gen_request_free(&m->request);
    exo_runner_status_clear(&m->status);
    exo_chunk_free(&m->chunk);
    exo_runner_msg_init(m, m->kind);
}

bool exo_runner_id_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.' || c == ':';
        if (!ok || n >= EXO_RUNNER_ID_MAX)
            return false;
    }
    return n > 0;
}

/* ---- encoding ----------------------------------------------------------- */

static json_t *status_to_json(const exo_runner_status *st)
{
    json_t *j = json_object();
    json_object_set_new(j, "kind", json_string(exo_runner_status_name(st->kind)));
    if (st->kind == EXO_RUNNER_LOADING) {
        json_object_set_new(j, "layers_loaded", json_integer(st->layers_loaded));
        json_object_set_new(j, "total_layers", json_integer(st->total_layers));
    }
    if (st->prefill_server_port != -1)
        json_object_set_new(j, "prefill_server_port", json_integer(st->prefill_server_port));
    if (st->ring_port != -1)
        json_object_set_new(j, "ring_port", json_integer(st->ring_port));
    if (st->error_message)
        json_object_set_new(j, "error_message", json_string(st->error_message));
    return j;
}

int exo_runner_msg_encode(const exo_runner_msg *m, exo_sbuf *out, exo_err *err)
{
    json_t *j = json_object();
    int rc = 0;
    json_object_set_new(j, "type", json_string(exo_runner_msg_name(m->kind)));
    switch (m->kind) {
    case EXO_RMSG_LOAD_MODEL:
        if (!m->load.model_dir || !*m->load.model_dir ||
            strlen(m->load.model_dir) > EXO_RUNNER_PATH_MAX) {
            rc = exo_err_set(err, EXO_EINVAL, "LoadModel: bad model_dir");
            break;
        }
        json_object_set_new(j, "model_dir", json_string(m->load.model_dir));
        json_object_set_new(j, "n_threads", json_integer(m->load.n_threads));
        json_object_set_new(j, "ctx", json_integer(m->load.ctx));
        json_object_set_new(j, "warmup_tokens", json_integer(m->load.warmup_tokens));
        if (m->load.device[0]) {
            if (!exo_device_valid(m->load.device)) {
                rc = exo_err_set(err, EXO_EINVAL, "LoadModel: bad device");
                break;
            }
            json_object_set_new(j, "device", json_string(m->load.device));
        }
        if (m->load.world > 1) {
            const exo_runner_load *l = &m->load;
            if (l->rank < 0 || l->rank >= l->world || strlen(l->ring_key) != 64) {
                rc = exo_err_set(err, EXO_EINVAL, "LoadModel: bad shard");
                break;
            }
            json_object_set_new(j, "shard",
                                json_pack("{s:i, s:i, s:i, s:i, s:b, s:s, s:i}", "rank", l->rank, "world",
                                          l->world, "start_layer", l->start_layer, "end_layer",
                                          l->end_layer, "tensor", l->tensor, "ring_key", l->ring_key,
                                          "ring_timeout_ms", l->ring_timeout_ms));
        }
        break;
    case EXO_RMSG_CONNECT:
        if (!m->connect.host[0] || m->connect.port < 1 || m->connect.port > 65535) {
            rc = exo_err_set(err, EXO_EINVAL, "Connect: bad address");
            break;
        }
        json_object_set_new(j, "host", json_string(m->connect.host));
        json_object_set_new(j, "port", json_integer(m->connect.port));
        break;
    case EXO_RMSG_GENERATE:
        json_object_set_new(j, "command_id", json_string(m->command_id));
        json_object_set_new(j, "request", exo_gen_request_to_json(&m->request));
        break;
    case EXO_RMSG_CANCEL:
    case EXO_RMSG_DONE:
        json_object_set_new(j, "command_id", json_string(m->command_id));
        break;
    case EXO_RMSG_SHUTDOWN:
        break;
    case EXO_RMSG_STATUS:
        rc = exo_runner_status_validate(&m->status, err);
        if (!rc)
            json_object_set_new(j, "status", status_to_json(&m->status));
        break;
    case EXO_RMSG_CHUNK:
        json_object_set_new(j, "command_id", json_string(m->command_id));
        json_object_set_new(j, "chunk", exo_chunk_to_json(&m->chunk));
        break;
    default:
        rc = exo_err_set(err, EXO_EINVAL, "runner message: unknown kind %d", (int)m->kind);
    }
    bool has_id = m->kind == EXO_RMSG_GENERATE || m->kind == EXO_RMSG_CANCEL ||
                  m->kind == EXO_RMSG_CHUNK || m->kind == EXO_RMSG_DONE;
    if (!rc && has_id && !exo_runner_id_valid(m->command_id))
        rc = exo_err_set(err, EXO_EINVAL, "%s: bad command id", exo_runner_msg_name(m->kind));
    char *text = NULL;
    if (!rc) {
        text = exo_json_dumps(j, JSON_COMPACT);
        if (!text)
            rc = exo_err_set(err, EXO_EINVAL, "%s: not encodable (invalid UTF-8?)",
                             exo_runner_msg_name(m->kind));
    }
    json_decref(j);
    if (rc)
        return rc;
    size_t n = strlen(text);
    if (n > EXO_RUNNER_FRAME_MAX) {
        exo_free(text);
        return exo_err_set(err, EXO_ETOOBIG, "%s: %zu bytes exceeds the frame limit",
                           exo_runner_msg_name(m->kind), n);
    }
    unsigned char hdr[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                            (unsigned char)(n >> 24)};
    exo_sbuf_append(out, hdr, 4);
    exo_sbuf_append(out, text, n);
    exo_free(text);
    return 0;
}

/* ---- decoding ----------------------------------------------------------- */

#define TRY(x) do { if ((rc = (x)) != 0) goto fail; } while (0)

static int get_int(const json_t *j, const char *key, int64_t lo, int64_t hi, int *out,
                   exo_err *err)
{
    int64_t v = 0;
    bool present = false;
    int rc = exo_ju_int(j, key, &v, &present, err);
    if (rc)
        return rc;
    if (!present)
        return exo_err_set(err, EXO_EINVAL, "'%s' is required", key);
    if (v < lo || v > hi)
        return exo_err_set(err, EXO_ERANGE, "'%s' out of range (%lld)", key, (long long)v);
    *out = (int)v;
    return 0;
}

static int get_id(const json_t *j, char *out, exo_err *err)
{
    const char *s = NULL;
    int rc = exo_ju_str(j, "command_id", &s, true, err);
    if (rc)
        return rc;
    if (strlen(s) != json_string_length(json_object_get(j, "command_id")) ||
        !exo_runner_id_valid(s))
        return exo_err_set(err, EXO_EINVAL, "'command_id' is not a valid id");
    snprintf(out, EXO_RUNNER_ID_MAX + 1, "%s", s);
    return 0;
}

/* An IPv4 or IPv6 literal, with a scope ("fe80::1%eth0") allowed. */
static bool numeric_host(const char *h)
{
    size_t n = strspn(h, "0123456789abcdefABCDEF.:");
    if (!h[n])
        return n > 0;
    if (h[n] != '%' || !n || !h[n + 1])
        return false;
    for (const char *p = h + n + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return false;
    return true;
}

static int decode_shard(const json_t *j, exo_runner_load *l, exo_err *err)
{
    static const char *const keys[] = {"rank", "world", "start_layer", "end_layer", "tensor",
                                       "ring_key", "ring_timeout_ms", NULL};
    int rc;
    const char *key = NULL;
    bool tensor = false;
    if ((rc = exo_ju_only_keys(j, keys, "shard", err)) ||
        /* one runner has no shard: the encoder leaves it out (world 1) */
        (rc = get_int(j, "world", 2, 256, &l->world, err)) ||
        (rc = get_int(j, "rank", 0, l->world - 1, &l->rank, err)) ||
        (rc = get_int(j, "start_layer", 0, 1 << 20, &l->start_layer, err)) ||
        (rc = get_int(j, "end_layer", 0, 1 << 20, &l->end_layer, err)) ||
        (rc = get_int(j, "ring_timeout_ms", 0, 3600 * 1000, &l->ring_timeout_ms, err)) ||
        (rc = exo_ju_bool(j, "tensor", &tensor, NULL, err)) ||
        (rc = exo_ju_str(j, "ring_key", &key, true, err)))
        return rc;
    l->tensor = tensor;
    if (strlen(key) != 64 || strspn(key, "0123456789abcdef") != 64)
        return exo_err_set(err, EXO_EINVAL, "shard: 'ring_key' must be 64 hex digits");
    memcpy(l->ring_key, key, 65);
    if (l->end_layer && l->start_layer >= l->end_layer)
        return exo_err_set(err, EXO_EINVAL, "shard: empty layer range");
    return 0;
}

static int decode_status(const json_t *j, exo_runner_status *st, exo_err *err)
{
    static const char *const keys[] = {"kind", "layers_loaded", "total_layers",
                                       "prefill_server_port", "ring_port", "error_message", NULL};
    int rc;
    if (!json_is_object(j))
        return exo_err_set(err, EXO_EINVAL, "'status' must be an object");
    if ((rc = exo_ju_only_keys(j, keys, "status", err)))
        return rc;
    const char *kind = NULL;
    if ((rc = exo_ju_str(j, "kind", &kind, true, err)))
        return rc;
    int k = exo_runner_status_parse(kind, strlen(kind));
    if (k < 0)
        return exo_err_set(err, EXO_EINVAL, "status: unknown kind '%.32s'", kind);
    exo_runner_status_init(st, (exo_runner_status_kind)k);
    if (k == EXO_RUNNER_LOADING) {
        int a = 0, b = 0;
        if ((rc = get_int(j, "layers_loaded", 0, 1 << 20, &a, err)) ||
            (rc = get_int(j, "total_layers", 0, 1 << 20, &b, err)))
            return rc;
        st->layers_loaded = a;
        st->total_layers = b;
    }
    if (exo_ju_get(j, "prefill_server_port")) {
        int port = 0;
        if ((rc = get_int(j, "prefill_server_port", -1, 65535, &port, err)))
            return rc;
        st->prefill_server_port = port;
    }
    if (exo_ju_get(j, "ring_port")) {
        int port = 0;
        if ((rc = get_int(j, "ring_port", -1, 65535, &port, err)))
            return rc;
        st->ring_port = port;
    }
    const char *msg = NULL;
    if ((rc = exo_ju_str(j, "error_message", &msg, false, err)))
        return rc;
    if (msg) {
        if (strlen(msg) != json_string_length(json_object_get(j, "error_message")))
            return exo_err_set(err, EXO_EINVAL, "status: error_message holds a NUL");
        st->error_message = exo_strdup(msg);
    }
    return exo_runner_status_validate(st, err);
}

int exo_runner_msg_decode(const char *payload, size_t len, exo_runner_msg *out, exo_err *err)
{
    exo_runner_msg_init(out, 0);
    json_error_t je;
    json_t *j = json_loadb(payload, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return exo_err_set(err, EXO_EFORMAT, "runner frame: invalid JSON: %s", je.text);
    int rc = 0;
    const char *type = NULL;
    if (!json_is_object(j)) {
        rc = exo_err_set(err, EXO_EFORMAT, "runner frame: not a JSON object");
        goto fail;
    }
    TRY(exo_ju_str(j, "type", &type, true, err));
    int kind = 0;
    for (int k = EXO_RMSG_LOAD_MODEL; k <= EXO_RMSG_CONNECT; k++)
        if (!strcmp(type, msg_names[k]))
            kind = k;
    if (!kind) {
        rc = exo_err_set(err, EXO_EINVAL, "runner frame: unknown type '%.32s'", type);
        goto fail;
    }
    out->kind = (exo_runner_msg_kind)kind;
    switch (out->kind) {
    case EXO_RMSG_LOAD_MODEL: {
        static const char *const k[] = {"type", "model_dir", "n_threads", "ctx", "warmup_tokens",
                                        "device", "shard", NULL};
        TRY(exo_ju_only_keys(j, k, "LoadModel", err));
        const char *dir = NULL;
        TRY(exo_ju_str(j, "model_dir", &dir, true, err));
        size_t n = strlen(dir);
        if (!n || n > EXO_RUNNER_PATH_MAX || n != json_string_length(json_object_get(j, "model_dir"))) {
            rc = exo_err_set(err, EXO_EINVAL, "LoadModel: bad 'model_dir'");
            goto fail;
        }
        out->load.model_dir = exo_strdup(dir);
        TRY(get_int(j, "n_threads", -1, 4096, &out->load.n_threads, err));
        TRY(get_int(j, "ctx", 0, 1 << 24, &out->load.ctx, err));
        TRY(get_int(j, "warmup_tokens", 0, 4096, &out->load.warmup_tokens, err));
        const char *device = NULL;
        TRY(exo_ju_str(j, "device", &device, false, err));
        if (device) {
            if (strlen(device) >= sizeof out->load.device || !exo_device_valid(device) ||
                strlen(device) != json_string_length(json_object_get(j, "device"))) {
                rc = exo_err_set(err, EXO_EINVAL, "LoadModel: 'device' is not one of auto, cpu, cuda, cuda:N");
                goto fail;
            }
            snprintf(out->load.device, sizeof out->load.device, "%s", device);
        }
        json_t *sh = NULL;
        TRY(exo_ju_object(j, "shard", &sh, false, err));
        out->load.world = 1;
        if (sh)
            TRY(decode_shard(sh, &out->load, err));
        break;
    }
    case EXO_RMSG_CONNECT: {
        static const char *const k[] = {"type", "host", "port", NULL};
        TRY(exo_ju_only_keys(j, k, "Connect", err));
        const char *host = NULL;
        TRY(exo_ju_str(j, "host", &host, true, err));
        if (!*host || strlen(host) >= sizeof out->connect.host ||
            strlen(host) != json_string_length(json_object_get(j, "host")) ||
            !numeric_host(host)) {
            rc = exo_err_set(err, EXO_EINVAL, "Connect: 'host' must be a numeric address");
            goto fail;
        }
        snprintf(out->connect.host, sizeof out->connect.host, "%s", host);
        TRY(get_int(j, "port", 1, 65535, &out->connect.port, err));
        break;
    }
    case EXO_RMSG_GENERATE: {
        static const char *const k[] = {"type", "command_id", "request", NULL};
        TRY(exo_ju_only_keys(j, k, "Generate", err));
        TRY(get_id(j, out->command_id, err));
        json_t *r = NULL;
        TRY(exo_ju_object(j, "request", &r, true, err));
        TRY(exo_gen_request_from_json(r, &out->request, err));
        break;
    }
    case EXO_RMSG_CANCEL:
    case EXO_RMSG_DONE: {
        static const char *const k[] = {"type", "command_id", NULL};
        TRY(exo_ju_only_keys(j, k, exo_runner_msg_name(out->kind), err));
        TRY(get_id(j, out->command_id, err));
        break;
    }
    case EXO_RMSG_SHUTDOWN: {
        static const char *const k[] = {"type", NULL};
        TRY(exo_ju_only_keys(j, k, "Shutdown", err));
        break;
    }
    case EXO_RMSG_STATUS: {
        static const char *const k[] = {"type", "status", NULL};
        TRY(exo_ju_only_keys(j, k, "Status", err));
        TRY(decode_status(json_object_get(j, "status"), &out->status, err));
        break;
    }
    case EXO_RMSG_CHUNK: {
        static const char *const k[] = {"type", "command_id", "chunk", NULL};
        TRY(exo_ju_only_keys(j, k, "Chunk", err));
        TRY(get_id(j, out->command_id, err));
        json_t *c = json_object_get(j, "chunk");
        if (!c) {
            rc = exo_err_set(err, EXO_EINVAL, "Chunk: 'chunk' is required");
            goto fail;
        }
        TRY(exo_chunk_from_json(c, &out->chunk, err));
        break;
    }
    }
    json_decref(j);
    return 0;
fail:
    json_decref(j);
    {
        /* Keep what identifies the message, so the receiver can answer it. */
        char id[EXO_RUNNER_ID_MAX + 1];
        memcpy(id, out->command_id, sizeof id);
        exo_runner_msg_free(out);
        memcpy(out->command_id, id, sizeof id);
    }
    return rc;
}

int exo_runner_frame_next(const char *buf, size_t len, const char **payload, size_t *plen,
                          size_t *consumed, exo_err *err)
{
    if (len < 4)
        return 0;
    const unsigned char *b = (const unsigned char *)buf;
    size_t n = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (n == 0 || n > EXO_RUNNER_FRAME_MAX)
        return exo_err_set(err, EXO_EFORMAT, "runner frame: bad length %zu", n);
    if (len - 4 < n)
        return 0;
    *payload = buf + 4;
    *plen = n;
    *consumed = 4 + n;
    return 1;
}

/* ---- channel ------------------------------------------------------------ */

struct exo_runner_chan {
    int      fd;
    exo_sbuf in;      /* received bytes; in_off of them already consumed */
    size_t   in_off;
    exo_sbuf out;     /* queued bytes; out_off of them already written */
    size_t   out_off;
    bool     broken;  /* framing error: the stream cannot be trusted any more */
};

exo_runner_chan *exo_runner_chan_new(int fd)
{
    exo_runner_chan *ch = exo_calloc(1, sizeof *ch);
    ch->fd = fd;
    exo_sbuf_init(&ch->in);
    exo_sbuf_init(&ch->out);
    return ch;
}

void exo_runner_chan_free(exo_runner_chan *ch)
{
    if (!ch)
        return;
    if (ch->fd >= 0)
        close(ch->fd);
    exo_sbuf_free(&ch->in);
    exo_sbuf_free(&ch->out);
    exo_free(ch);
}

int exo_runner_chan_fd(const exo_runner_chan *ch) { return ch->fd; }

int exo_runner_chan_read(exo_runner_chan *ch, bool block)
{
    /* Drop consumed bytes before growing. */
    if (ch->in_off && ch->in_off == ch->in.len) {
        exo_sbuf_clear(&ch->in);
        ch->in_off = 0;
    } else if (ch->in_off > (1u << 16) && ch->in_off * 2 > ch->in.len) {
        memmove(ch->in.data, ch->in.data + ch->in_off, ch->in.len - ch->in_off);
        ch->in.len -= ch->in_off;
        ch->in_off = 0;
    }
    char tmp[65536];
    for (;;) {
        ssize_t r = recv(ch->fd, tmp, sizeof tmp, block ? 0 : MSG_DONTWAIT);
        if (r > 0) {
            exo_sbuf_append(&ch->in, tmp, (size_t)r);
            return (int)r;
        }
        if (r == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return EXO_EBUSY;
        return EXO_EIO;
    }
}

int exo_runner_chan_next(exo_runner_chan *ch, exo_runner_msg *m, exo_err *err)
{
    exo_runner_msg_init(m, 0);
    if (ch->broken)
        return exo_err_set(err, EXO_EFORMAT, "runner channel: broken by an earlier bad frame");
    const char *payload = NULL;
    size_t plen = 0, used = 0;
    int rc = exo_runner_frame_next(ch->in.data ? ch->in.data + ch->in_off : "",
                                   ch->in.len - ch->in_off, &payload, &plen, &used, err);
    if (rc <= 0) {
        if (rc < 0)
            ch->broken = true;
        return rc;
    }
    ch->in_off += used;
    rc = exo_runner_msg_decode(payload, plen, m, err);
    return rc ? rc : 1;
}

int exo_runner_chan_flush(exo_runner_chan *ch, bool block)
{
    while (ch->out_off < ch->out.len) {
        ssize_t w = send(ch->fd, ch->out.data + ch->out_off, ch->out.len - ch->out_off,
                         MSG_NOSIGNAL | (block ? 0 : MSG_DONTWAIT));
        if (w > 0) {
            ch->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!block)
                return 0;
            struct pollfd p = {ch->fd, POLLOUT, 0};
            poll(&p, 1, -1);
            continue;
        }
        return EXO_EIO;
    }
    exo_sbuf_clear(&ch->out);
    ch->out_off = 0;
    return 0;
}

int exo_runner_chan_send(exo_runner_chan *ch, const exo_runner_msg *m, bool block, exo_err *err)
{
    int rc = exo_runner_msg_encode(m, &ch->out, err);
    if (rc)
        return rc;
    rc = exo_runner_chan_flush(ch, block);
    if (rc)
        return exo_err_set(err, rc, "runner channel: peer gone");
    return 0;
}

size_t exo_runner_chan_pending(const exo_runner_chan *ch) { return ch->out.len - ch->out_off; }

bool exo_runner_chan_broken(const exo_runner_chan *ch) { return ch->broken; }
