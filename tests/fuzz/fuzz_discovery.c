// FUZZ_SOURCES: src/net/discovery.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c
// FUZZ_LIBS: -lsodium -luv
/* libFuzzer target for the discovery packet codec: the bytes anyone on the
 * LAN can send to the discovery port. The first byte picks the mode:
 *   even: the rest is one datagram for the decoder (fixed namespace hash and
 *         key). What decodes must re-encode to exactly the same bytes; every
 *         result must agree with the bytes that caused it.
 *   odd:  the rest describes a packet (kind, namespace, node id, port, then
 *         a bit to flip). Encode must accept exactly the valid ones; what it
 *         writes must decode to the same fields, and with any one bit
 *         flipped must no longer decode. */
#include "net/discovery.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t NS[8] = {'e', 'x', 'o', '-', 'f', 'u', 'z', 'z'};

static void fixed_key(uint8_t key[32])
{
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)i;
}

static void decode_mode(const uint8_t *buf, size_t len, const uint8_t *key)
{
    exo_discovery_packet p;
    exo_discovery_result r = exo_discovery_decode(buf, len, NS, key, &p);
    switch (r) {
    case EXO_DISCOVERY_OK: {
        uint8_t again[EXO_DISCOVERY_PACKET_LEN];
        if (len != EXO_DISCOVERY_PACKET_LEN || p.version != 1 || p.kind > 1 || p.tcp_port == 0 ||
            !exo_discovery_node_id_valid(p.node_id) || memcmp(p.ns_hash, NS, 8) != 0)
            abort();
        if (exo_discovery_encode(&p, key, again) != 0 || memcmp(again, buf, len) != 0)
            abort(); /* what we accept is exactly what we would have sent */
        break;
    }
    case EXO_DISCOVERY_EVERSION:
        if (len < 5 || memcmp(buf, "EXOD", 4) != 0 || buf[4] <= 1 || p.version != buf[4])
            abort();
        break;
    case EXO_DISCOVERY_EOTHER_NS:
        if (len != EXO_DISCOVERY_PACKET_LEN || memcmp(buf + 8, NS, 8) == 0)
            abort();
        break;
    case EXO_DISCOVERY_EBAD_MAC:
        if (len != EXO_DISCOVERY_PACKET_LEN || memcmp(buf + 8, NS, 8) != 0)
            abort();
        break;
    case EXO_DISCOVERY_EFORMAT:
        break;
    default:
        abort();
    }
}

static void encode_mode(const uint8_t *in, size_t len, const uint8_t *key)
{
    /* kind(1) ns(8) id(32) port(2) flip(2) */
    if (len < 45)
        return;
    exo_discovery_packet p;
    memset(&p, 0, sizeof p);
    p.kind = in[0];
    memcpy(p.ns_hash, in + 1, 8);
    memcpy(p.node_id, in + 9, 32);
    p.node_id[32] = 0;
    p.tcp_port = (uint16_t)(in[41] | in[42] << 8);
    bool valid = p.kind <= 1 && p.tcp_port != 0 && exo_discovery_node_id_valid(p.node_id);
    uint8_t pkt[EXO_DISCOVERY_PACKET_LEN];
    int rc = exo_discovery_encode(&p, key, pkt);
    if ((rc == 0) != valid)
        abort();
    if (rc != 0)
        return;
    exo_discovery_packet back;
    exo_discovery_result r = exo_discovery_decode(pkt, sizeof pkt, p.ns_hash, key, &back);
    if (r != EXO_DISCOVERY_OK || back.kind != p.kind || back.tcp_port != p.tcp_port ||
        strcmp(back.node_id, p.node_id) != 0 || memcmp(back.ns_hash, p.ns_hash, 8) != 0)
        abort();
    unsigned bit = (unsigned)(in[43] | in[44] << 8) % (EXO_DISCOVERY_PACKET_LEN * 8);
    pkt[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    if (exo_discovery_decode(pkt, sizeof pkt, p.ns_hash, key, &back) == EXO_DISCOVERY_OK)
        abort(); /* no single bit flip survives */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t key[32];
    fixed_key(key);
    /* Copy so that reads past the end are caught by ASan at the exact size. */
    uint8_t *buf = malloc(size - 1 ? size - 1 : 1);
    memcpy(buf, data + 1, size - 1);
    if (data[0] % 2 == 0)
        decode_mode(buf, size - 1, key);
    else
        encode_mode(buf, size - 1, key);
    free(buf);
    return 0;
}
