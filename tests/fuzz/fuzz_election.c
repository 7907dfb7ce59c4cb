// FUZZ_SOURCES: src/cluster/election.c src/cluster/codec.c src/proto/types.c src/core/alloc.c src/core/error.c src/core/log.c src/core/clock.c
// FUZZ_LIBS: -ljansson -lmsgpackc
/* libFuzzer target for the master election (cluster/election.c). The first
 * input byte picks the mode:
 *   even: the rest -> exo_election_msg_decode; an accepted message must
 *         validate, re-encode, decode equal, and re-encode to the same bytes
 *   odd:  the rest drives three live state machines (configs from the first
 *         bytes) with a script of ops: time steps, membership changes,
 *         commands, promotes, raw bytes decoded and delivered, structured
 *         messages from real and fake peers, and real broadcasts crossing
 *         between the three. After every op: deadlines lie in the future,
 *         in_progress implies a deadline, broadcasts validate, results name
 *         valid ids. At the end the three are fully connected with instant
 *         delivery and must settle on one master (unless the script pushed a
 *         clock to the saturation point, where exo's clock + 1 cannot grow).
 * Invariants are checked with abort(), which libFuzzer reports as a crash. */
#include "cluster/election.h"
#include "core/log.h"
#include "fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_codec(const uint8_t *data, size_t size)
{
    exo_election_msg m, back;
    if (exo_election_msg_decode(data, size, &m, NULL) < 0)
        return;
    CHECK(exo_election_msg_validate(&m, NULL) == 0);
    uint8_t buf[EXO_ELECTION_MSG_MAX_BYTES], buf2[EXO_ELECTION_MSG_MAX_BYTES];
    size_t n, n2;
    CHECK(exo_election_msg_encode(&m, buf, sizeof buf, &n, NULL) == 0);
    CHECK(exo_election_msg_decode(buf, n, &back, NULL) == 0);
    CHECK(exo_election_msg_equal(&m, &back));
    CHECK(exo_election_msg_encode(&back, buf2, sizeof buf2, &n2, NULL) == 0);
    CHECK(n == n2 && memcmp(buf, buf2, n) == 0);
}

typedef struct in {
    const uint8_t *p;
    size_t         n;
} in;

static uint8_t next(in *s)
{
    if (!s->n)
        return 0;
    s->n--;
    return *s->p++;
}

#define NODES 3
static const char *const names[] = {"a", "b", "c", "d", "zz"};

typedef struct fz {
    exo_election *e[NODES];
    uint64_t      now;
    bool          saturated;
} fz;

static void check_node(fz *f, int i)
{
    exo_election *e = f->e[i];
    uint64_t dl = exo_election_next_deadline_ms(e);
    CHECK(dl == UINT64_MAX || dl > f->now);
    if (exo_election_in_progress(e))
        CHECK(dl != UINT64_MAX);
    exo_election_result r;
    while (exo_election_pop_result(e, &r)) {
        CHECK(exo_id_valid(r.master.s, strlen(r.master.s)));
        CHECK(r.session_clock <= r.won_clock);
        CHECK(r.is_self == (strcmp(r.master.s, names[i]) == 0));
    }
    exo_election_info info;
    exo_election_get_info(e, &info);
    if (info.clock >= EXO_ELECTION_VALUE_MAX - 64)
        f->saturated = true;
}

static void deliver(fz *f, int to, const exo_election_msg *m)
{
    CHECK(exo_election_receive(f->e[to], m, f->now, NULL) == 0);
    check_node(f, to);
}

/* Moves every queued broadcast to the other nodes at once. */
static bool flush(fz *f)
{
    bool any = false;
    for (int i = 0; i < NODES; i++) {
        exo_election_msg m;
        while (exo_election_pop_broadcast(f->e[i], &m)) {
            CHECK(exo_election_msg_validate(&m, NULL) == 0);
            uint8_t buf[EXO_ELECTION_MSG_MAX_BYTES];
            size_t n;
            CHECK(exo_election_msg_encode(&m, buf, sizeof buf, &n, NULL) == 0);
            for (int j = 0; j < NODES; j++)
                if (j != i)
                    deliver(f, j, &m);
            any = true;
        }
    }
    return any;
}

static void fuzz_machine(const uint8_t *data, size_t size)
{
    in s = {data, size};
    fz f;
    memset(&f, 0, sizeof f);
    f.now = next(&s);
    for (int i = 0; i < NODES; i++) {
        exo_election_config cfg;
        exo_id id;
        exo_id_set(&id, names[i], NULL);
        exo_election_config_init(&cfg, &id);
        uint8_t b = next(&s);
        cfg.debounce_ms = next(&s);
        cfg.campaign_ms = 1u + next(&s);
        cfg.campaign_max_ms = cfg.campaign_ms * (1u + (b & 15));
        cfg.force_master = (b & 0x30) == 0x30;
        cfg.non_candidate = (b & 0xc0) == 0xc0;
        cfg.max_candidates = 2 + (b & 3);
        CHECK(exo_election_new(&cfg, f.now, &f.e[i], NULL) == 0);
        check_node(&f, i);
    }
    int ops = 0;
    while (s.n && ops++ < 400) {
        uint8_t op = next(&s);
        int k = (op >> 4) % NODES;
        switch (op & 7) {
        case 0:
            f.now += 10u * next(&s);
            for (int i = 0; i < NODES; i++) {
                exo_election_tick(f.e[i], f.now);
                check_node(&f, i);
            }
            break;
        case 1:
            exo_election_membership_changed(f.e[k], f.now);
            check_node(&f, k);
            break;
        case 2:
            exo_election_command_seen(f.e[k]);
            break;
        case 3:
            if ((op & 0x80) && (op & 8)) {
                exo_election_promote(f.e[k], f.now);
                check_node(&f, k);
            }
            break;
        case 4: {
            size_t len = next(&s) % 96;
            if (len > s.n)
                len = s.n;
            exo_election_msg m;
            if (exo_election_msg_decode(s.p, len, &m, NULL) == 0)
                deliver(&f, k, &m);
            s.p += len;
            s.n -= len;
            break;
        }
        case 5: { /* a node's real broadcast reaches one other node */
            exo_election_msg m;
            if (exo_election_pop_broadcast(f.e[k], &m))
                deliver(&f, (k + 1 + (op >> 3 & 1)) % NODES, &m);
            break;
        }
        case 6: { /* a structured message from a real or fake peer */
            exo_election_msg m;
            memset(&m, 0, sizeof m);
            exo_election_info info;
            exo_election_get_info(f.e[k], &info);
            uint8_t a = next(&s), b = next(&s), c = next(&s);
            exo_id_set(&m.from, names[a % 5], NULL);
            exo_id_set(&m.master, names[(a >> 3) % 5], NULL);
            m.clock = info.clock + (b & 3) - ((b & 4) && info.clock ? 1 : 0);
            m.master_clock = (b & 8) ? m.clock : 0;
            m.seniority = (int64_t)(c & 7) - 1;
            m.commands_seen = c >> 3;
            m.decided = b & 16;
            m.retry = (b >> 5) & 3;
            deliver(&f, k, &m);
            break;
        }
        default:
            flush(&f);
            break;
        }
    }

    /* Settle: a full mesh with instant delivery from here on. */
    for (int i = 0; i < NODES; i++)
        exo_election_membership_changed(f.e[i], f.now);
    int steps = 0;
    for (; steps < 20000; steps++) {
        if (flush(&f))
            continue;
        uint64_t t = UINT64_MAX;
        for (int i = 0; i < NODES; i++) {
            uint64_t d = exo_election_next_deadline_ms(f.e[i]);
            if (d < t)
                t = d;
        }
        if (t == UINT64_MAX)
            break;
        f.now = t;
        for (int i = 0; i < NODES; i++) {
            exo_election_tick(f.e[i], f.now);
            check_node(&f, i);
        }
    }
    if (!f.saturated) {
        CHECK(steps < 20000);
        exo_id m0, mi;
        uint64_t c0, ci;
        exo_election_master(f.e[0], &m0, &c0);
        for (int i = 0; i < NODES; i++) {
            CHECK(!exo_election_in_progress(f.e[i]));
            exo_election_master(f.e[i], &mi, &ci);
            if (!exo_id_eq(&m0, &mi) || c0 != ci) {
                fprintf(stderr, "node 0: %s/%llu, node %d: %s/%llu\n", m0.s, (unsigned long long)c0, i, mi.s,
                        (unsigned long long)ci);
                abort();
            }
        }
        /* The master is one of the three: fake peers are gone. */
        CHECK(strcmp(m0.s, "a") == 0 || strcmp(m0.s, "b") == 0 || strcmp(m0.s, "c") == 0);
    }
    for (int i = 0; i < NODES; i++)
        exo_election_free(f.e[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        exo_log_set_level(EXO_LOG_ERROR);
        quiet = true;
    }
    if (size == 0)
        return 0;
    if (data[0] % 2 == 0)
        fuzz_codec(data + 1, size - 1);
    else
        fuzz_machine(data + 1, size - 1);
    return 0;
}
