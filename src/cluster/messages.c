/* Cluster messages (see messages.h): one field table per frame type. */
#include "cluster/messages.h"

#include "cluster/codec.h"
#include "core/alloc.h"

#include <string.h>

bool exo_session_eq(const exo_session *a, const exo_session *b)
{
    return a->clock == b->clock && exo_id_eq(&a->master, &b->master);
}

static const exo_field session_fields[] = {
    EXO_FIELD(exo_session, master, "master", "master", exo_ft_id),
    EXO_FIELD(exo_session, clock, "clock", "clock", exo_ft_u64),
};
static const exo_record_desc session_desc = EXO_RECORD("session", exo_session, session_fields);

#define SESSION(T) EXO_FIELD_RECORD(T, session, "session", "session", session_desc)

static const exo_field local_event_fields[] = {
    SESSION(exo_msg_local_event),
    EXO_FIELD(exo_msg_local_event, origin, "origin", "origin", exo_ft_id),
    EXO_FIELD(exo_msg_local_event, system, "system", "system", exo_ft_id),
    EXO_FIELD(exo_msg_local_event, origin_idx, "origin_idx", "originIdx", exo_ft_u64),
    EXO_FIELD(exo_msg_local_event, event, "event", "event", exo_ft_event),
};
static const exo_field global_event_fields[] = {
    SESSION(exo_msg_global_event),
    EXO_FIELD(exo_msg_global_event, idx, "idx", "idx", exo_ft_u64),
    EXO_FIELD(exo_msg_global_event, count, "count", "count", exo_ft_u64),
    EXO_FIELD_OPT(exo_msg_global_event, system, "system", "system", exo_ft_id),
    EXO_FIELD(exo_msg_global_event, origin_idx, "origin_idx", "originIdx", exo_ft_u64),
    EXO_FIELD(exo_msg_global_event, event, "event", "event", exo_ft_event),
};
static const exo_field event_request_fields[] = {
    SESSION(exo_msg_event_request),
    EXO_FIELD(exo_msg_event_request, since, "since", "since", exo_ft_u64),
};
static const exo_field head_fields[] = {
    SESSION(exo_msg_head),
    EXO_FIELD(exo_msg_head, count, "count", "count", exo_ft_u64),
};
static const exo_field command_fields[] = {
    EXO_FIELD(exo_msg_command, origin, "origin", "origin", exo_ft_id),
    EXO_FIELD(exo_msg_command, command, "command", "command", exo_ft_command),
};
static const exo_field command_ack_fields[] = {
    EXO_FIELD(exo_msg_command_ack, command_id, "command_id", "commandId", exo_ft_id),
    EXO_FIELD_RANGE(exo_msg_command_ack, code, "code", "code", exo_ft_i32, -1000, 0),
    EXO_FIELD_OPT(exo_msg_command_ack, error, "error", "error", exo_ft_text),
};
static const exo_field chunk_fields[] = {
    EXO_FIELD(exo_msg_chunk, command_id, "command_id", "commandId", exo_ft_id),
    {"chunk", "chunk", &exo_ft_text, offsetof(exo_msg_chunk, chunk_json), false, 0, 4 << 20, NULL, NULL},
};
static const exo_field gen_done_fields[] = {
    EXO_FIELD(exo_msg_gen_done, command_id, "command_id", "commandId", exo_ft_id),
};

static const exo_field download_fields[] = {
    EXO_FIELD(exo_msg_download, command_id, "command_id", "commandId", exo_ft_id),
    EXO_FIELD_RANGE(exo_msg_download, action, "action", "action", exo_ft_i32, 0, 2),
    EXO_FIELD(exo_msg_download, model_id, "model_id", "modelId", exo_ft_model_id),
};

static const exo_field peer_addr_fields[] = {
    EXO_FIELD(exo_peer_addr, node_id, "node_id", "nodeId", exo_ft_id),
    EXO_FIELD(exo_peer_addr, address, "address", "address", exo_ft_addr),
};
static const exo_record_desc peer_addr_desc = EXO_RECORD("peer", exo_peer_addr, peer_addr_fields);
static const exo_field peers_fields[] = {
    EXO_FIELD_RANGE(exo_msg_peers, port, "port", "port", exo_ft_i32, 1, 65535),
    EXO_FIELD_ARRAY(exo_msg_peers, peers, "peers", "peers", peer_addr_desc, EXO_MSG_MAX_PEERS),
};

static const exo_field snapshot_item_fields[] = {
    EXO_FIELD(exo_snapshot_item, event, "event", "event", exo_ft_event),
};
static const exo_record_desc snapshot_item_desc = EXO_RECORD("snapshot event", exo_snapshot_item,
                                                             snapshot_item_fields);
static const exo_field snapshot_fields[] = {
    SESSION(exo_msg_snapshot),
    EXO_FIELD(exo_msg_snapshot, count, "count", "count", exo_ft_u64),
    EXO_FIELD_ARRAY(exo_msg_snapshot, events, "events", "events", snapshot_item_desc, EXO_MSG_MAX_SNAPSHOT_EVENTS),
};

static const exo_record_desc kinds[EXO_MSG__END] = {
    [EXO_MSG_LOCAL_EVENT] = EXO_RECORD("LocalEvent", exo_msg_local_event, local_event_fields),
    [EXO_MSG_GLOBAL_EVENT] = EXO_RECORD("GlobalEvent", exo_msg_global_event, global_event_fields),
    [EXO_MSG_EVENT_REQUEST] = EXO_RECORD("EventRequest", exo_msg_event_request, event_request_fields),
    [EXO_MSG_HEAD] = EXO_RECORD("Head", exo_msg_head, head_fields),
    [EXO_MSG_COMMAND] = EXO_RECORD("Command", exo_msg_command, command_fields),
    [EXO_MSG_COMMAND_ACK] = EXO_RECORD("CommandAck", exo_msg_command_ack, command_ack_fields),
    [EXO_MSG_CHUNK] = EXO_RECORD("Chunk", exo_msg_chunk, chunk_fields),
    [EXO_MSG_GEN_DONE] = EXO_RECORD("GenDone", exo_msg_gen_done, gen_done_fields),
    [EXO_MSG_PEERS] = EXO_RECORD("Peers", exo_msg_peers, peers_fields),
    [EXO_MSG_DOWNLOAD] = EXO_RECORD("Download", exo_msg_download, download_fields),
    [EXO_MSG_SNAPSHOT] = EXO_RECORD("Snapshot", exo_msg_snapshot, snapshot_fields),
};

static const exo_record_desc *desc_of(int type)
{
    return type > 0 && type < EXO_MSG__END && kinds[type].fields ? &kinds[type] : NULL;
}

const char *exo_msg_type_name(int type)
{
    if (type == EXO_MSG_ELECTION)
        return "Election";
    const exo_record_desc *d = desc_of(type);
    return d ? d->name : "?";
}

size_t exo_msg_size(int type)
{
    const exo_record_desc *d = desc_of(type);
    return d ? d->size : 0;
}

/* Cross-field rules the tables cannot say. */
static int check(int type, const void *msg, exo_err *err)
{
    if (type == EXO_MSG_GLOBAL_EVENT) {
        const exo_msg_global_event *g = msg;
        if (g->count <= g->idx)
            return exo_err_set(err, EXO_EINVAL, "GlobalEvent: count %llu <= idx %llu",
                               (unsigned long long)g->count, (unsigned long long)g->idx);
    } else if (type == EXO_MSG_SNAPSHOT) {
        if (((const exo_msg_snapshot *)msg)->count == 0)
            return exo_err_set(err, EXO_EINVAL, "Snapshot: count 0");
    } else if (type == EXO_MSG_COMMAND_ACK) {
        const exo_msg_command_ack *a = msg;
        if ((a->code == 0) != (a->error == NULL))
            return exo_err_set(err, EXO_EINVAL, "CommandAck: an error message goes with a non-zero code");
    }
    return 0;
}

int exo_msg_encode(int type, const void *msg, uint8_t **out, size_t *out_len, exo_err *err)
{
    *out = NULL;
    *out_len = 0;
    const exo_record_desc *d = desc_of(type);
    if (!d)
        return exo_err_set(err, EXO_EINVAL, "message type %d has no codec", type);
    int rc = exo_record_validate(d, msg, err);
    if (rc == 0)
        rc = check(type, msg, err);
    if (rc < 0) {
        exo_err_wrap(err, "%s", d->name);
        return rc;
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    exo_record_pack(&pk, d, msg);
    return exo_mp_finish(&sb, EXO_MSG_MAX_BYTES, out, out_len, d->name, err);
}

int exo_msg_decode(int type, const uint8_t *buf, size_t len, void *msg, exo_err *err)
{
    const exo_record_desc *d = desc_of(type);
    if (!d)
        return exo_err_set(err, EXO_EINVAL, "unknown message type %d", type);
    memset(msg, 0, d->size);
    if (!buf || !len)
        return exo_err_set(err, EXO_EFORMAT, "%s: empty", d->name);
    if (len > EXO_MSG_MAX_BYTES)
        return exo_err_set(err, EXO_ETOOBIG, "%s: %zu bytes (max %zu)", d->name, len, (size_t)EXO_MSG_MAX_BYTES);
    size_t pos = 0;
    if (exo_mp_scan(buf, len, &pos, 0) < 0 || pos != len)
        return exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", d->name);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    int rc;
    if (msgpack_unpack_next(&up, (const char *)buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        rc = exo_err_set(err, EXO_EFORMAT, "%s: malformed msgpack", d->name);
    } else {
        rc = exo_record_unpack(&up.data, d, msg, err);
        if (rc == 0)
            rc = exo_record_validate(d, msg, err);
        if (rc == 0)
            rc = check(type, msg, err);
        if (rc < 0) {
            exo_err_wrap(err, "%s", d->name);
            rc = EXO_EFORMAT;
            if (err)
                err->code = rc;
        }
    }
    msgpack_unpacked_destroy(&up);
    if (rc < 0)
        exo_msg_clear(type, msg);
    return rc;
}

void exo_msg_clear(int type, void *msg)
{
    const exo_record_desc *d = desc_of(type);
    if (d)
        exo_record_clear(d, msg);
}

bool exo_msg_equal(int type, const void *a, const void *b)
{
    const exo_record_desc *d = desc_of(type);
    return d && exo_record_equal(d, a, b);
}
