/* The secure channel, in memory: handshakes in both roles, frames both ways
 * (empty, 16 MiB, fed a byte at a time), and the attacks it must stop:
 * wrong psk, every byte of a session flipped, replayed / reordered /
 * dropped frames, reflection, oversize lengths, malformed HELLOs. */
#include "core/alloc.h"
#include "net/secure_channel.h"

#include <criterion/criterion.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

typedef struct rx_frame {
    uint8_t  type;
    uint8_t *data;
    size_t   len;
} rx_frame;

typedef struct side {
    exo_sc  *sc;
    exo_identity id;
    rx_frame frames[64];
    size_t   n_frames;
    int      established_calls;
    int      rc;          /* first error from exo_sc_recv */
    exo_err  err;
    int      stop_after;  /* frame callback returns 1 on this frame number (1-based); 0 never */
} side;

static exo_identity fixed_identity(uint8_t seed_byte)
{
    exo_identity id;
    uint8_t seed[32];
    memset(seed, seed_byte, sizeof seed);
    crypto_sign_seed_keypair(id.pk, id.sk, seed);
    exo_identity_node_id_of(id.pk, id.node_id);
    return id;
}

static const uint8_t PSK_A[32] = {1, 2, 3};
static const uint8_t PSK_B[32] = {1, 2, 4};

static int on_established(void *ctx, exo_sc *sc)
{
    side *s = ctx;
    s->established_calls++;
    cr_assert_not_null(exo_sc_peer_id(sc));
    return 0;
}

static int on_frame(void *ctx, exo_sc *sc, uint8_t type, const uint8_t *payload, size_t len)
{
    side *s = ctx;
    cr_assert_lt(s->n_frames, 64);
    rx_frame *f = &s->frames[s->n_frames++];
    f->type = type;
    f->len = len;
    f->data = exo_malloc(len ? len : 1);
    if (len)
        memcpy(f->data, payload, len);
    return s->stop_after && (int)s->n_frames == s->stop_after;
}

static const exo_sc_handlers HANDLERS = {on_established, on_frame};

static void side_init(side *s, uint8_t seed, const uint8_t psk[32], bool initiator, uint16_t flags)
{
    memset(s, 0, sizeof *s);
    s->id = fixed_identity(seed);
    exo_err err = {0};
    cr_assert_eq(exo_sc_new(&s->id, psk, initiator, flags, &s->sc, &err), 0, "%s", err.msg);
}

static void side_free(side *s)
{
    for (size_t i = 0; i < s->n_frames; i++)
        exo_free(s->frames[i].data);
    exo_sc_free(s->sc);
}

static void feed(side *s, const uint8_t *b, size_t n, size_t chunk)
{
    if (s->rc < 0)
        return;
    for (size_t off = 0; off < n;) {
        size_t take = chunk && chunk < n - off ? chunk : n - off;
        int rc = exo_sc_recv(s->sc, b + off, take, &HANDLERS, s, &s->err);
        if (rc < 0) {
            s->rc = rc;
            cr_assert(s->err.msg[0], "an error names its reason");
            return;
        }
        off += take;
    }
}

/* A tap on one direction: every byte that crosses is counted, and the one at
 * position flip_at (if >= 0) is XORed with flip_mask. */
typedef struct wire {
    long   pos;
    long   flip_at;
    uint8_t flip_mask;
} wire;

/* Moves all queued output from a to b (through w) and back until quiet. */
static void pump(side *a, side *b, wire *wa, wire *wb, size_t chunk)
{
    for (int round = 0; round < 100; round++) {
        bool moved = false;
        side *from[2] = {a, b}, *to[2] = {b, a};
        wire *w[2] = {wa, wb};
        for (int d = 0; d < 2; d++) {
            size_t len;
            uint8_t *p;
            while ((p = exo_sc_out_take(from[d]->sc, &len))) {
                moved = true;
                if (w[d]) {
                    if (w[d]->flip_at >= w[d]->pos && w[d]->flip_at < w[d]->pos + (long)len)
                        p[w[d]->flip_at - w[d]->pos] ^= w[d]->flip_mask;
                    w[d]->pos += (long)len;
                }
                feed(to[d], p, len, chunk);
                exo_free(p);
            }
        }
        if (!moved)
            return;
    }
    cr_assert_fail("pump did not settle");
}

static void handshake(side *i, side *r)
{
    pump(i, r, NULL, NULL, 0);
    cr_assert_eq(i->rc, 0, "%s", i->err.msg);
    cr_assert_eq(r->rc, 0, "%s", r->err.msg);
    cr_assert(exo_sc_established(i->sc));
    cr_assert(exo_sc_established(r->sc));
}

static void send_ok(side *s, uint8_t type, const void *p, size_t n)
{
    exo_err err = {0};
    cr_assert_eq(exo_sc_send(s->sc, type, p, n, &err), 0, "%s", err.msg);
}

static void check_frame(const side *s, size_t i, uint8_t type, const void *p, size_t n)
{
    cr_assert_gt(s->n_frames, i, "frame %zu missing", i);
    cr_assert_eq(s->frames[i].type, type);
    cr_assert_eq(s->frames[i].len, n, "frame %zu: %zu bytes, want %zu", i, s->frames[i].len, n);
    if (n)
        cr_assert_eq(memcmp(s->frames[i].data, p, n), 0, "frame %zu content", i);
}

Test(secure_channel, handshake_and_frames_both_ways)
{
    for (int first = 0; first < 2; first++) {
        side i, r;
        side_init(&i, 1, PSK_A, true, 0);
        side_init(&r, 2, PSK_A, false, 0);
        cr_assert_not(exo_sc_established(i.sc));
        cr_assert_null(exo_sc_peer_id(i.sc));
        cr_assert_null(exo_sc_session_id(i.sc));
        cr_assert_eq(exo_sc_out_pending(i.sc), EXO_SC_HELLO_LEN);
        /* either side's bytes may arrive first */
        if (first)
            pump(&r, &i, NULL, NULL, 0);
        else
            pump(&i, &r, NULL, NULL, 0);
        cr_assert(exo_sc_established(i.sc) && exo_sc_established(r.sc), "%s / %s", i.err.msg, r.err.msg);
        cr_assert_eq(i.established_calls, 1);
        cr_assert_eq(r.established_calls, 1);
        cr_assert_str_eq(exo_sc_peer_id(i.sc), r.id.node_id);
        cr_assert_str_eq(exo_sc_peer_id(r.sc), i.id.node_id);
        cr_assert_eq(memcmp(exo_sc_session_id(i.sc), exo_sc_session_id(r.sc), EXO_SC_SESSION_ID_LEN), 0);
        cr_assert(exo_sc_initiator(i.sc) && !exo_sc_initiator(r.sc));
        cr_assert_eq(exo_sc_peer_flags(r.sc), 0);
        cr_assert_eq(exo_sc_out_pending(i.sc), 0);

        send_ok(&i, 1, "hello", 5);
        send_ok(&i, 0xEF, NULL, 0);
        send_ok(&i, 0xF0, "\x01\x02", 2); /* reserved types go to the caller */
        send_ok(&r, 7, "world!", 6);
        cr_assert_eq(exo_sc_out_pending(i.sc), 5 + 0 + 2 + 3 * EXO_SC_FRAME_OVERHEAD);
        pump(&i, &r, NULL, NULL, 0);
        cr_assert_eq(r.n_frames, 3);
        check_frame(&r, 0, 1, "hello", 5);
        check_frame(&r, 1, 0xEF, NULL, 0);
        check_frame(&r, 2, 0xF0, "\x01\x02", 2);
        cr_assert_eq(i.n_frames, 1);
        check_frame(&i, 0, 7, "world!", 6);
        side_free(&i);
        side_free(&r);
    }
}

Test(secure_channel, bytes_fed_one_at_a_time)
{
    side i, r;
    side_init(&i, 1, PSK_A, true, EXO_SC_FLAG_PROBE);
    side_init(&r, 2, PSK_A, false, 0);
    pump(&i, &r, NULL, NULL, 1);
    cr_assert(exo_sc_established(i.sc) && exo_sc_established(r.sc), "%s / %s", i.err.msg, r.err.msg);
    cr_assert_eq(exo_sc_peer_flags(r.sc), EXO_SC_FLAG_PROBE);
    cr_assert(exo_sc_peer_hello_seen(r.sc));
    uint8_t big[70000];
    for (size_t k = 0; k < sizeof big; k++)
        big[k] = (uint8_t)(k * 7);
    for (int k = 0; k < 5; k++) {
        send_ok(&i, (uint8_t)(k + 1), big, (size_t)k * 1000);
        send_ok(&r, (uint8_t)(k + 1), big, sizeof big - (size_t)k);
    }
    pump(&i, &r, NULL, NULL, 1);
    cr_assert_eq(r.n_frames, 5);
    cr_assert_eq(i.n_frames, 5);
    for (int k = 0; k < 5; k++) {
        check_frame(&r, (size_t)k, (uint8_t)(k + 1), big, (size_t)k * 1000);
        check_frame(&i, (size_t)k, (uint8_t)(k + 1), big, sizeof big - (size_t)k);
    }
    side_free(&i);
    side_free(&r);
}

Test(secure_channel, sixteen_mib_frame_and_limit, .timeout = 120)
{
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    handshake(&i, &r);
    size_t n = EXO_SC_PAYLOAD_MAX;
    uint8_t *big = exo_malloc(n + 1);
    randombytes_buf(big, n + 1);
    exo_err err = {0};
    cr_assert_eq(exo_sc_send(i.sc, 3, big, n + 1, &err), EXO_ETOOBIG);
    cr_assert_eq(exo_sc_out_pending(i.sc), 0);
    send_ok(&i, 3, big, n);
    send_ok(&i, 4, "after", 5);
    /* odd chunk sizes across the frame boundary */
    size_t len;
    uint8_t *p;
    while ((p = exo_sc_out_take(i.sc, &len))) {
        size_t off = 0, step = 1;
        while (off < len) {
            size_t take = step < len - off ? step : len - off;
            feed(&r, p + off, take, 0);
            off += take;
            step = step * 3 + 1;
            if (step > 3000000)
                step = 1;
        }
        exo_free(p);
    }
    cr_assert_eq(r.rc, 0, "%s", r.err.msg);
    cr_assert_eq(r.n_frames, 2);
    check_frame(&r, 0, 3, big, n);
    check_frame(&r, 1, 4, "after", 5);
    exo_free(big);
    side_free(&i);
    side_free(&r);
}

Test(secure_channel, wrong_psk_fails_and_delivers_nothing)
{
    for (int which = 0; which < 2; which++) {
        side i, r;
        side_init(&i, 1, which ? PSK_A : PSK_B, true, 0);
        side_init(&r, 2, which ? PSK_B : PSK_A, false, 0);
        pump(&i, &r, NULL, NULL, 0);
        /* The initiator fails on the responder's AUTH and so never sends its
         * own: the responder is left waiting (net.c times it out). */
        cr_assert_eq(i.rc, EXO_EFORMAT);
        cr_assert_not_null(strstr(i.err.msg, "authentication failed"), "%s", i.err.msg);
        cr_assert_not(exo_sc_established(i.sc));
        cr_assert_not(exo_sc_established(r.sc));
        cr_assert_eq(i.established_calls + r.established_calls, 0);
        cr_assert_eq(i.n_frames + r.n_frames, 0);
        cr_assert_eq(exo_sc_out_pending(i.sc), 0);
        exo_err err = {0};
        cr_assert_neq(exo_sc_send(r.sc, 1, "x", 1, &err), 0);
        side_free(&i);
        side_free(&r);
    }
}

/* One full session (handshake + two frames each way) with one byte of the
 * i->r (dir 0) or r->i (dir 1) stream XORed with mask. Returns the total
 * stream length of that direction. */
static long tampered_session(int dir, long at, uint8_t mask)
{
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    wire wi = {0, dir == 0 ? at : -1, mask}, wr = {0, dir == 1 ? at : -1, mask};
    pump(&i, &r, &wi, &wr, 0);
    if (exo_sc_established(i.sc))
        send_ok(&i, 1, "from i 1", 8);
    if (exo_sc_established(r.sc))
        send_ok(&r, 2, "from r 1", 8);
    pump(&i, &r, &wi, &wr, 0);
    if (exo_sc_established(i.sc))
        send_ok(&i, 3, "from i 2", 8);
    if (exo_sc_established(r.sc))
        send_ok(&r, 4, "from r 2", 8);
    pump(&i, &r, &wi, &wr, 0);
    side *victim = dir == 0 ? &r : &i;
    uint8_t t0 = dir == 0 ? 1 : 2, t1 = dir == 0 ? 3 : 4;
    const char *m0 = dir == 0 ? "from i 1" : "from r 1", *m1 = dir == 0 ? "from i 2" : "from r 2";
    if (at >= 0) {
        /* whatever was delivered is a prefix of what was sent ... */
        if (victim->n_frames > 0)
            check_frame(victim, 0, t0, m0, 8);
        if (victim->n_frames > 1)
            check_frame(victim, 1, t1, m1, 8);
        cr_assert_leq(victim->n_frames, 2);
        /* ... and the flip did not go unnoticed */
        bool noticed = i.rc < 0 || r.rc < 0 || victim->n_frames < 2 || !exo_sc_established(i.sc) ||
                       !exo_sc_established(r.sc);
        cr_assert(noticed, "flipping byte %ld (mask %02x) of direction %d went unnoticed", at, mask, dir);
        cr_assert_eq(i.established_calls + r.established_calls <= 2, 1);
    } else {
        cr_assert_eq(victim->n_frames, 2);
    }
    long total = dir == 0 ? wi.pos : wr.pos;
    side_free(&i);
    side_free(&r);
    return total;
}

Test(secure_channel, every_byte_flipped_is_detected, .timeout = 120)
{
    for (int dir = 0; dir < 2; dir++) {
        long total = tampered_session(dir, -1, 0);
        cr_assert_gt(total, EXO_SC_HELLO_LEN + EXO_SC_HEADER_LEN + 100);
        for (long at = 0; at < total; at++) {
            tampered_session(dir, at, 0x01);
            tampered_session(dir, at, 0x80);
        }
    }
}

/* An established pair with three frames from i captured separately. */
typedef struct captured {
    side     i, r;
    uint8_t *f[3];
    size_t   n[3];
} captured;

static void capture(captured *c)
{
    side_init(&c->i, 1, PSK_A, true, 0);
    side_init(&c->r, 2, PSK_A, false, 0);
    handshake(&c->i, &c->r);
    for (int k = 0; k < 3; k++) {
        char msg[16];
        snprintf(msg, sizeof msg, "frame %d", k);
        send_ok(&c->i, 1, msg, strlen(msg));
        c->f[k] = exo_sc_out_take(c->i.sc, &c->n[k]);
        cr_assert_not_null(c->f[k]);
    }
}

static void captured_free(captured *c)
{
    for (int k = 0; k < 3; k++)
        exo_free(c->f[k]);
    side_free(&c->i);
    side_free(&c->r);
}

Test(secure_channel, replay_reorder_drop_are_errors)
{
    captured c;
    capture(&c); /* replay */
    feed(&c.r, c.f[0], c.n[0], 0);
    cr_assert_eq(c.r.rc, 0);
    feed(&c.r, c.f[0], c.n[0], 0);
    cr_assert_eq(c.r.rc, EXO_EFORMAT);
    cr_assert_eq(c.r.n_frames, 1);
    captured_free(&c);

    capture(&c); /* reorder */
    feed(&c.r, c.f[1], c.n[1], 0);
    feed(&c.r, c.f[0], c.n[0], 0);
    cr_assert_eq(c.r.rc, EXO_EFORMAT);
    cr_assert_eq(c.r.n_frames, 0);
    captured_free(&c);

    capture(&c); /* drop */
    feed(&c.r, c.f[0], c.n[0], 0);
    feed(&c.r, c.f[2], c.n[2], 0);
    cr_assert_eq(c.r.rc, EXO_EFORMAT);
    cr_assert_eq(c.r.n_frames, 1);
    captured_free(&c);

    capture(&c); /* all in order still works */
    for (int k = 0; k < 3; k++)
        feed(&c.r, c.f[k], c.n[k], 0);
    cr_assert_eq(c.r.rc, 0, "%s", c.r.err.msg);
    cr_assert_eq(c.r.n_frames, 3);
    check_frame(&c.r, 2, 1, "frame 2", 7);
    captured_free(&c);
}

Test(secure_channel, reflection_fails)
{
    /* A side's own HELLO fed back to it. */
    for (int role = 0; role < 2; role++) {
        side s;
        side_init(&s, 1, PSK_A, role, 0);
        size_t len;
        uint8_t *hello = exo_sc_out_take(s.sc, &len);
        feed(&s, hello, len, 0);
        cr_assert_eq(s.rc, EXO_EFORMAT);
        cr_assert_not_null(strstr(s.err.msg, "reflected"), "%s", s.err.msg);
        exo_free(hello);
        side_free(&s);
    }
    /* The responder's own header and AUTH fed back to it after a genuine
     * HELLO from the initiator. */
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    size_t len;
    uint8_t *hello_i = exo_sc_out_take(i.sc, &len);
    feed(&r, hello_i, len, 0);
    exo_free(hello_i);
    exo_free(exo_sc_out_take(r.sc, &len)); /* r's HELLO */
    uint8_t *auth_r = exo_sc_out_take(r.sc, &len);
    cr_assert_not_null(auth_r);
    feed(&r, auth_r, len, 0);
    cr_assert_eq(r.rc, EXO_EFORMAT);
    cr_assert_not(exo_sc_established(r.sc));
    exo_free(auth_r);
    side_free(&i);
    side_free(&r);

    /* After the handshake: a side's own frame fed back to it. */
    captured c;
    capture(&c);
    feed(&c.i, c.f[0], c.n[0], 0);
    cr_assert_eq(c.i.rc, EXO_EFORMAT);
    cr_assert_eq(c.i.n_frames, 0);
    captured_free(&c);

    /* Two initiators (or two responders) never agree. */
    for (int role = 0; role < 2; role++) {
        side a, b;
        side_init(&a, 1, PSK_A, role, 0);
        side_init(&b, 2, PSK_A, role, 0);
        pump(&a, &b, NULL, NULL, 0);
        cr_assert_not(exo_sc_established(a.sc) || exo_sc_established(b.sc));
        side_free(&a);
        side_free(&b);
    }
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

Test(secure_channel, length_limits_checked_before_allocation)
{
    static const uint32_t post[] = {0xFFFFFFFFu, (uint32_t)(EXO_SC_PAYLOAD_MAX + 1 + EXO_SC_ABYTES + 1)};
    for (size_t k = 0; k < 2; k++) {
        captured c;
        capture(&c);
        uint8_t l[4];
        put32(l, post[k]);
        feed(&c.r, l, 4, 0); /* no body follows: the error must come from the prefix alone */
        cr_assert_eq(c.r.rc, EXO_ETOOBIG, "length %u: %s", post[k], c.r.err.msg);
        captured_free(&c);
    }
    /* Too short to hold a type byte. */
    captured c;
    capture(&c);
    uint8_t l[4];
    put32(l, EXO_SC_ABYTES);
    feed(&c.r, l, 4, 0);
    cr_assert_eq(c.r.rc, EXO_EFORMAT, "%s", c.r.err.msg);
    captured_free(&c);

    /* Before authentication the limit is 256. */
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    size_t len;
    uint8_t *hello_r = exo_sc_out_take(r.sc, &len);
    feed(&i, hello_r, len, 0);
    exo_free(hello_r);
    uint8_t hdr[EXO_SC_HEADER_LEN + 4] = {0};
    put32(hdr + EXO_SC_HEADER_LEN, EXO_SC_PREAUTH_FRAME_MAX + 1);
    feed(&i, hdr, sizeof hdr, 0);
    cr_assert_eq(i.rc, EXO_ETOOBIG, "%s", i.err.msg);
    cr_assert_not_null(strstr(i.err.msg, "before authentication"));
    side_free(&i);
    side_free(&r);
}

/* Feeds a modified copy of a genuine HELLO to a fresh responder. */
static side hello_variant(void (*edit)(uint8_t *h))
{
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    size_t len;
    uint8_t *h = exo_sc_out_take(i.sc, &len);
    cr_assert_eq(len, EXO_SC_HELLO_LEN);
    edit(h);
    feed(&r, h, len, 0);
    exo_free(h);
    side_free(&i);
    return r;
}

static void edit_reserved(uint8_t *h) { h[79] = 1; }
static void edit_flags(uint8_t *h) { h[6] |= 2; }
static void edit_high_flag(uint8_t *h) { h[7] = 0x80; }
static void edit_version(uint8_t *h) { h[4] = 2; }
static void edit_magic(uint8_t *h) { h[0] = 'X'; }
static void edit_low_order(uint8_t *h) { memset(h + 8, 0, 32); }
static void edit_none(uint8_t *h) { (void)h; }

Test(secure_channel, malformed_hellos_are_rejected)
{
    static const struct {
        void (*edit)(uint8_t *);
        int rc;
        const char *text;
    } cases[] = {
        {edit_reserved, EXO_EFORMAT, "reserved"},
        {edit_flags, EXO_EFORMAT, "flags 0x0002"},
        {edit_high_flag, EXO_EFORMAT, "flags 0x8000"},
        {edit_version, EXO_EUNSUPPORTED, "version 2, this node version 1"},
        {edit_magic, EXO_EFORMAT, "not an exo node"},
        {edit_low_order, EXO_EFORMAT, "low-order"},
        {edit_none, 0, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        side r = hello_variant(cases[k].edit);
        cr_assert_eq(r.rc, cases[k].rc, "case %zu: %s", k, r.err.msg);
        if (cases[k].text)
            cr_assert_not_null(strstr(r.err.msg, cases[k].text), "case %zu: %s", k, r.err.msg);
        if (cases[k].rc) {
            cr_assert_eq(exo_sc_out_pending(r.sc), 0, "a failed sc outputs nothing");
            cr_assert_not(exo_sc_peer_hello_seen(r.sc));
        } else {
            /* the responder answered with header + AUTH */
            cr_assert_gt(exo_sc_out_pending(r.sc), EXO_SC_HELLO_LEN);
        }
        side_free(&r);
    }
}

Test(secure_channel, errors_are_terminal)
{
    side r = hello_variant(edit_reserved);
    cr_assert_eq(r.rc, EXO_EFORMAT);
    const char *first = exo_sc_error(r.sc);
    cr_assert_not_null(first);
    char saved[256];
    snprintf(saved, sizeof saved, "%s", first);
    exo_err err = {0};
    uint8_t junk[100] = {0};
    cr_assert_eq(exo_sc_recv(r.sc, junk, sizeof junk, &HANDLERS, &r, &err), EXO_EFORMAT);
    cr_assert_str_eq(err.msg, saved);
    cr_assert_eq(exo_sc_send(r.sc, 1, "x", 1, &err), EXO_EFORMAT);
    size_t len;
    cr_assert_null(exo_sc_out(r.sc, &len));
    cr_assert_eq(len, 0);
    cr_assert_str_eq(exo_sc_error(r.sc), saved);
    side_free(&r);

    /* A handler that stops the sc ends it too. */
    captured c;
    capture(&c);
    c.r.stop_after = 1;
    for (int k = 0; k < 3; k++)
        feed(&c.r, c.f[k], c.n[k], 0);
    cr_assert_eq(c.r.rc, EXO_ECANCELED);
    cr_assert_eq(c.r.n_frames, 1);
    cr_assert_eq(exo_sc_recv(c.r.sc, c.f[1], c.n[1], &HANDLERS, &c.r, &err), EXO_ECANCELED);
    cr_assert_eq(c.r.n_frames, 1);
    captured_free(&c);
}

Test(secure_channel, caller_errors_leave_the_channel_usable)
{
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    exo_err err = {0};
    cr_assert_eq(exo_sc_send(i.sc, 1, "x", 1, &err), EXO_EINVAL, "not yet established");
    exo_sc *bad;
    cr_assert_eq(exo_sc_new(&i.id, PSK_A, true, 0x0004, &bad, &err), EXO_EINVAL);
    handshake(&i, &r);
    cr_assert_eq(exo_sc_send(i.sc, 0, "x", 1, &err), EXO_EINVAL);
    cr_assert_eq(exo_sc_send(i.sc, EXO_SC_TYPE_AUTH, "x", 1, &err), EXO_EINVAL);
    send_ok(&i, 9, "ok", 2);
    /* exo_sc_out / consume in small steps gives the same bytes */
    size_t len;
    const uint8_t *p = exo_sc_out(i.sc, &len);
    cr_assert_eq(len, 2 + EXO_SC_FRAME_OVERHEAD);
    cr_assert_eq(exo_sc_out_pending(i.sc), len);
    while ((p = exo_sc_out(i.sc, &len))) {
        feed(&r, p, 3 < len ? 3 : len, 0);
        exo_sc_out_consume(i.sc, 3 < len ? 3 : len);
    }
    cr_assert_eq(exo_sc_out_pending(i.sc), 0);
    cr_assert_eq(r.n_frames, 1);
    check_frame(&r, 0, 9, "ok", 2);
    side_free(&i);
    side_free(&r);
}

Test(secure_channel, impersonation_without_the_secret_key_fails)
{
    /* A cluster member (it holds the psk) claims another node's public key
     * but can only sign with its own secret key. */
    side i, r;
    side_init(&i, 1, PSK_A, true, 0);
    side_init(&r, 2, PSK_A, false, 0);
    exo_identity victim = fixed_identity(3), forged = r.id;
    memcpy(forged.pk, victim.pk, 32); /* the AUTH frame carries sign_pk from here */
    exo_sc_free(r.sc);
    exo_err err = {0};
    cr_assert_eq(exo_sc_new(&forged, PSK_A, false, 0, &r.sc, &err), 0);
    pump(&i, &r, NULL, NULL, 0);
    cr_assert_eq(i.rc, EXO_EFORMAT);
    cr_assert_not_null(strstr(i.err.msg, "signature"), "%s", i.err.msg);
    cr_assert_eq(i.established_calls + r.established_calls, 0);
    side_free(&i);
    side_free(&r);
}
