/* Master election state machine and its wire codec (see election.h).
 *
 * State: the current clock; at most one campaign (active, or the last one
 * kept after it ended because the safety net compares late messages with
 * the candidacies it counted); a pending debounce; the session; two bounded
 * ring queues. Every entry point first runs the timers due at its now_ms,
 * so inputs are processed in time order whatever the caller's tick rhythm.
 *
 * The codec is hand-written rather than msgpack-c's unpacker: the message is
 * small and flat, so a reader that checks each length against the bytes
 * left before using it needs no allocation and no pre-scan (the reason
 * events.c runs mp_scan before msgpack-c: hostile counts would size
 * msgpack-c's allocations). Encoding picks the shortest integer forms, as
 * msgpack-c's packer does, so the bytes are a function of the message. */
#include "cluster/election.h"

#include "cluster/codec.h"

#include "core/alloc.h"
#include "core/log.h"

#include <stdio.h>
#include <string.h>

/* ---- candidacies ---------------------------------------------------------------- */

typedef struct cand {
    exo_id   id;
    int64_t  seniority;
    uint64_t commands_seen;
    exo_id   s_master;         /* the session it proposes */
    uint64_t s_clock;
} cand;

/* A (sender, clock) we answered with our status. */
typedef struct answered {
    exo_id   from;
    uint64_t clock;
} answered;

struct exo_election {
    exo_election_config cfg;
    uint64_t now;
    uint64_t clock;
    int64_t  seniority;
    uint64_t commands_seen;
    int64_t  max_peer_seniority;

    /* current session */
    exo_id   master;
    uint64_t master_clock;

    /* campaign at `clock`: running while active, else the last one ended */
    bool     active;
    uint64_t camp_start, camp_deadline;
    uint32_t retry;
    int64_t  snap_seniority;   /* our candidacy key for `clock` */
    uint64_t snap_commands;
    cand    *cands;
    size_t   n_cands;
    cand     winner;           /* valid when !active */
    uint64_t decided_clock;

    bool     debounce;
    uint64_t debounce_deadline;

    exo_election_msg    out[EXO_ELECTION_OUTBOX];
    size_t              out_head, out_n;
    bool                out_warned;    /* since the outbox last emptied */
    exo_election_result res[EXO_ELECTION_RESULTS];
    size_t              res_head, res_n;
    bool                res_warned;
    bool                popped_any;
    exo_id              popped_master;
    uint64_t            popped_clock;

    /* Answers go out once per (sender, clock): without this, two nodes
     * whose full candidate tables cannot count each other would answer each
     * other's answers forever. Ring of 2 * max_candidates + 16 entries, so a
     * whole cluster fits twice. */
    answered *answers;
    size_t    n_answers, answer_next;

    uint64_t campaigns, restarts;
};

/* a < b ? -1 : a > b ? 1 : 0, on (seniority, commands_seen, id). Clocks are
 * equal within a campaign. */
static int cand_cmp(const cand *a, const cand *b)
{
    if (a->seniority != b->seniority)
        return a->seniority < b->seniority ? -1 : 1;
    if (a->commands_seen != b->commands_seen)
        return a->commands_seen < b->commands_seen ? -1 : 1;
    int c = strcmp(a->id.s, b->id.s);
    return c < 0 ? -1 : c > 0;
}

static void cand_from_msg(cand *c, const exo_election_msg *m)
{
    c->id = m->from;
    c->seniority = m->seniority;
    c->commands_seen = m->commands_seen;
    if (exo_id_eq(&m->master, &m->from)) {
        c->s_master = m->master;
        c->s_clock = m->master_clock;
    } else {
        c->s_master = m->from;
        c->s_clock = m->clock;
    }
}

static void cand_self(const exo_election *e, cand *c)
{
    c->id = e->cfg.self;
    c->seniority = e->snap_seniority;
    c->commands_seen = e->snap_commands;
    if (exo_id_eq(&e->master, &e->cfg.self)) {
        c->s_master = e->master;
        c->s_clock = e->master_clock;
    } else {
        c->s_master = e->cfg.self;
        c->s_clock = e->clock;
    }
}

static int cand_find(const exo_election *e, const exo_id *id)
{
    for (size_t i = 0; i < e->n_cands; i++)
        if (exo_id_eq(&e->cands[i].id, id))
            return (int)i;
    return -1;
}

/* Adds c unless its node is already counted (a sender's key is fixed per
 * clock, so the first message stands). When full, c replaces the lowest
 * other candidacy if it outranks it: the maximum stays exact. */
static void cand_add(exo_election *e, const cand *c)
{
    if (cand_find(e, &c->id) >= 0)
        return;
    if (e->n_cands < e->cfg.max_candidates) {
        e->cands[e->n_cands++] = *c;
        return;
    }
    size_t lo = SIZE_MAX;
    for (size_t i = 0; i < e->n_cands; i++) {
        if (exo_id_eq(&e->cands[i].id, &e->cfg.self))
            continue;
        if (lo == SIZE_MAX || cand_cmp(&e->cands[i], &e->cands[lo]) < 0)
            lo = i;
    }
    if (lo != SIZE_MAX && cand_cmp(c, &e->cands[lo]) > 0)
        e->cands[lo] = *c;
}

/* ---- queues ------------------------------------------------------------------------ */

static void status_msg(const exo_election *e, bool decided, exo_election_msg *m)
{
    memset(m, 0, sizeof *m);
    m->from = e->cfg.self;
    m->clock = e->clock;
    m->seniority = e->snap_seniority;
    m->commands_seen = e->snap_commands;
    m->master = e->master;
    m->master_clock = e->master_clock;
    m->decided = decided;
    m->retry = e->retry;
}

static void queue_status(exo_election *e, bool decided)
{
    if (e->out_n == EXO_ELECTION_OUTBOX) {
        if (!e->out_warned)
            EXO_LOG_WARN("election: outbox full (%d), dropping the oldest statuses", EXO_ELECTION_OUTBOX);
        e->out_warned = true;
        e->out_head = (e->out_head + 1) % EXO_ELECTION_OUTBOX;
        e->out_n--;
    }
    status_msg(e, decided, &e->out[(e->out_head + e->out_n) % EXO_ELECTION_OUTBOX]);
    e->out_n++;
}

static void queue_result(exo_election *e)
{
    if (e->res_n == EXO_ELECTION_RESULTS) {
        if (!e->res_warned)
            EXO_LOG_WARN("election: result queue full (%d), dropping the oldest", EXO_ELECTION_RESULTS);
        e->res_warned = true;
        e->res_head = (e->res_head + 1) % EXO_ELECTION_RESULTS;
        e->res_n--;
    }
    exo_election_result *r = &e->res[(e->res_head + e->res_n) % EXO_ELECTION_RESULTS];
    memset(r, 0, sizeof *r);
    r->master = e->master;
    r->session_clock = e->master_clock;
    r->won_clock = e->clock;
    r->is_self = exo_id_eq(&e->master, &e->cfg.self);
    e->res_n++;
}

/* ---- campaigns --------------------------------------------------------------------- */

static uint64_t campaign_timeout(const exo_election *e, uint32_t retry)
{
    uint64_t t = (uint64_t)e->cfg.campaign_ms << retry;   /* <= 2^20 << 16 */
    return t < e->cfg.campaign_max_ms ? t : e->cfg.campaign_max_ms;
}

/* Deadlines saturate below UINT64_MAX, which means "none". */
static uint64_t after(uint64_t now, uint64_t ms)
{
    return now < UINT64_MAX - 1 - ms ? now + ms : UINT64_MAX - 1;
}

static uint64_t bump(uint64_t clock) { return clock < EXO_ELECTION_VALUE_MAX ? clock + 1 : clock; }

static void start_campaign(exo_election *e, uint64_t clock, uint32_t retry, const exo_election_msg *first)
{
    e->campaigns++;
    e->clock = clock;
    e->active = true;
    e->retry = retry > EXO_ELECTION_MAX_RETRY ? EXO_ELECTION_MAX_RETRY : retry;
    e->camp_start = e->now;
    e->camp_deadline = after(e->now, campaign_timeout(e, e->retry));
    e->snap_seniority = e->seniority;
    e->snap_commands = e->commands_seen;
    e->n_cands = 0;
    cand c;
    cand_self(e, &c);
    cand_add(e, &c);
    if (first) {
        cand_from_msg(&c, first);
        cand_add(e, &c);
    }
    EXO_LOG_DEBUG("election %s: campaign at clock %llu (retry %u, %llu ms)", e->cfg.self.s,
                  (unsigned long long)clock, e->retry, (unsigned long long)(e->camp_deadline - e->now));
    queue_status(e, false);
}

static void decide(exo_election *e)
{
    size_t w = 0;
    for (size_t i = 1; i < e->n_cands; i++)
        if (cand_cmp(&e->cands[i], &e->cands[w]) > 0)
            w = i;
    e->winner = e->cands[w];
    bool self_won = exo_id_eq(&e->winner.id, &e->cfg.self);
    /* Seniority is the size of the cluster a node leads now, and nothing for
     * a node that does not lead: when a partition heals, the master of the
     * larger side wins and its State (the work its side did) is the one the
     * cluster keeps. (exo keeps max(seniority, candidates) for ever, so a
     * master cut off alone takes over again when it returns and the
     * majority's work is lost.) A sitting master still beats any joiner,
     * whose seniority is 0. --force-master and promotions stay above. */
    if (e->seniority >= 0 && e->seniority < EXO_ELECTION_FORCE_SENIORITY)
        e->seniority = self_won ? (int64_t)e->n_cands : 0;
    e->master = e->winner.s_master;
    e->master_clock = e->winner.s_clock;
    e->active = false;
    e->decided_clock = e->clock;
    EXO_LOG_DEBUG("election %s: clock %llu decided: %s (session %llu) among %zu", e->cfg.self.s,
                  (unsigned long long)e->clock, e->master.s, (unsigned long long)e->master_clock, e->n_cands);
    queue_result(e);
    queue_status(e, true);
}

static void restart(exo_election *e, const char *why, const exo_election_msg *m)
{
    e->restarts++;
    EXO_LOG_INFO("election %s: clock %llu: %s %s; new campaign", e->cfg.self.s, (unsigned long long)e->clock,
                 why, m->from.s);
    start_campaign(e, bump(e->clock), e->retry + 1, NULL);
}

/* Runs the timers due by now_ms in deadline order, each at its own deadline
 * (a campaign started by an overdue debounce starts when the debounce
 * expired), so the outcome does not depend on how often the caller ticks. */
static void advance(exo_election *e, uint64_t now_ms)
{
    for (;;) {
        uint64_t tc = e->active ? e->camp_deadline : UINT64_MAX;
        uint64_t td = e->debounce ? e->debounce_deadline : UINT64_MAX;
        uint64_t t = tc <= td ? tc : td;
        if (t > now_ms)
            break;
        if (t > e->now)
            e->now = t;
        if (tc <= td) {
            decide(e);
        } else {
            e->debounce = false;
            start_campaign(e, bump(e->clock), 0, NULL);
        }
    }
    if (now_ms > e->now)
        e->now = now_ms;
}

/* ---- public API ---------------------------------------------------------------------- */

void exo_election_config_init(exo_election_config *cfg, const exo_id *self)
{
    memset(cfg, 0, sizeof *cfg);
    if (self)
        cfg->self = *self;
    cfg->debounce_ms = 200;
    cfg->campaign_ms = 500;
    cfg->campaign_max_ms = 16 * 500;
    cfg->max_candidates = 64;
}

int exo_election_new(const exo_election_config *cfg, uint64_t now_ms, exo_election **out, exo_err *err)
{
    *out = NULL;
    if (!exo_id_valid(cfg->self.s, strnlen(cfg->self.s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "election: invalid node id");
    if (cfg->debounce_ms > 60000)
        return exo_err_set(err, EXO_EINVAL, "election: debounce_ms %u (max 60000)", cfg->debounce_ms);
    if (cfg->campaign_ms < 1 || cfg->campaign_ms > 600000)
        return exo_err_set(err, EXO_EINVAL, "election: campaign_ms %u (1..600000)", cfg->campaign_ms);
    if (cfg->campaign_max_ms < cfg->campaign_ms)
        return exo_err_set(err, EXO_EINVAL, "election: campaign_max_ms %u below campaign_ms %u",
                           cfg->campaign_max_ms, cfg->campaign_ms);
    if (cfg->max_candidates < 2 || cfg->max_candidates > 4096)
        return exo_err_set(err, EXO_EINVAL, "election: max_candidates %u (2..4096)", cfg->max_candidates);
    exo_election *e = exo_calloc(1, sizeof *e);
    e->cfg = *cfg;
    e->now = now_ms;
    e->cands = exo_calloc(cfg->max_candidates, sizeof *e->cands);
    e->n_answers = 2 * (size_t)cfg->max_candidates + 16;
    e->answers = exo_calloc(e->n_answers, sizeof *e->answers);
    e->seniority = cfg->force_master ? EXO_ELECTION_FORCE_SENIORITY : cfg->non_candidate ? -1 : 0;
    e->master = cfg->self;
    e->master_clock = 0;
    /* exo's initial campaign with timeout 0: nobody can answer, so it is
     * decided at once (and we count as one candidate). */
    e->campaigns = 1;
    e->snap_seniority = e->seniority;
    e->snap_commands = 0;
    cand c;
    cand_self(e, &c);
    cand_add(e, &c);
    decide(e);
    *out = e;
    return 0;
}

void exo_election_free(exo_election *e)
{
    if (!e)
        return;
    exo_free(e->cands);
    exo_free(e->answers);
    exo_free(e);
}

void exo_election_membership_changed(exo_election *e, uint64_t now_ms)
{
    advance(e, now_ms);
    if (!e->debounce) {
        e->debounce = true;
        e->debounce_deadline = after(e->now, e->cfg.debounce_ms);
        advance(e, now_ms);   /* debounce_ms 0: no overdue timer is left behind */
    }
}

/* Queues our status for m's sender unless it was answered for that clock. */
static void answer(exo_election *e, const exo_election_msg *m)
{
    for (size_t i = 0; i < e->n_answers; i++)
        if (e->answers[i].clock == m->clock && exo_id_eq(&e->answers[i].from, &m->from))
            return;
    e->answers[e->answer_next].from = m->from;
    e->answers[e->answer_next].clock = m->clock;
    e->answer_next = (e->answer_next + 1) % e->n_answers;
    queue_status(e, true);
}

/* A message at our clock after our campaign for it ended. */
static void safety_net(exo_election *e, const exo_election_msg *m)
{
    if (m->decided && (!exo_id_eq(&m->master, &e->master) || m->master_clock != e->master_clock)) {
        restart(e, "decided another session than us:", m);
        return;
    }
    if (cand_find(e, &m->from) >= 0)
        return;
    /* Not counted: a late joiner, or one a full table could not keep. */
    cand c;
    cand_from_msg(&c, m);
    cand_add(e, &c);
    if (cand_cmp(&c, &e->winner) > 0) {
        restart(e, "missed the candidacy of", m);
        return;
    }
    /* A late joiner of this campaign: tell it what we counted. */
    answer(e, m);
}

/* A stale message: answer once per (sender, clock) while idle, so a node
 * that missed a membership change adopts our clock. While a campaign runs,
 * its final status will reach the sender anyway. */
static void nudge_laggard(exo_election *e, const exo_election_msg *m)
{
    if (!e->active)
        answer(e, m);
}

int exo_election_receive(exo_election *e, const exo_election_msg *m, uint64_t now_ms, exo_err *err)
{
    int rc = exo_election_msg_validate(m, err);
    if (rc < 0)
        return rc;
    advance(e, now_ms);
    if (exo_id_eq(&m->from, &e->cfg.self))
        return 0;
    if (m->seniority > e->max_peer_seniority)
        e->max_peer_seniority = m->seniority;
    if (m->clock > e->clock) {
        start_campaign(e, m->clock, m->retry, m);
    } else if (m->clock < e->clock) {
        nudge_laggard(e, m);
    } else if (e->active) {
        cand c;
        cand_from_msg(&c, m);
        cand_add(e, &c);
        if (m->retry > e->retry) {
            /* The sender backs off further: wait as long as it does. */
            e->retry = m->retry;
            e->camp_deadline = after(e->camp_start, campaign_timeout(e, e->retry));
        }
    } else {
        safety_net(e, m);
    }
    return 0;
}

void exo_election_command_seen(exo_election *e)
{
    if (e->commands_seen < UINT64_MAX)
        e->commands_seen++;
}

void exo_election_promote(exo_election *e, uint64_t now_ms)
{
    advance(e, now_ms);
    int64_t s = e->seniority;
    if (e->max_peer_seniority > s)
        s = e->max_peer_seniority;
    if (s < EXO_ELECTION_FORCE_SENIORITY - 1)
        s = EXO_ELECTION_FORCE_SENIORITY - 1;
    if (s < (int64_t)EXO_ELECTION_VALUE_MAX)
        s++;
    e->seniority = s;
    EXO_LOG_INFO("election %s: promoted (seniority %lld)", e->cfg.self.s, (long long)s);
    start_campaign(e, bump(e->clock), 0, NULL);
}

void exo_election_tick(exo_election *e, uint64_t now_ms) { advance(e, now_ms); }

uint64_t exo_election_next_deadline_ms(const exo_election *e)
{
    uint64_t t = UINT64_MAX;
    if (e->active)
        t = e->camp_deadline;
    if (e->debounce && e->debounce_deadline < t)
        t = e->debounce_deadline;
    return t;
}

bool exo_election_pop_broadcast(exo_election *e, exo_election_msg *out)
{
    if (e->out_n == 0)
        return false;
    *out = e->out[e->out_head];
    e->out_head = (e->out_head + 1) % EXO_ELECTION_OUTBOX;
    if (--e->out_n == 0)
        e->out_warned = false;
    return true;
}

bool exo_election_pop_result(exo_election *e, exo_election_result *out)
{
    if (e->res_n == 0)
        return false;
    *out = e->res[e->res_head];
    e->res_head = (e->res_head + 1) % EXO_ELECTION_RESULTS;
    if (--e->res_n == 0)
        e->res_warned = false;
    out->is_new_master = !e->popped_any || !exo_id_eq(&out->master, &e->popped_master) ||
                         out->session_clock != e->popped_clock;
    e->popped_any = true;
    e->popped_master = out->master;
    e->popped_clock = out->session_clock;
    return true;
}

bool exo_election_in_progress(const exo_election *e) { return e->active; }

void exo_election_master(const exo_election *e, exo_id *master, uint64_t *session_clock)
{
    if (master)
        *master = e->master;
    if (session_clock)
        *session_clock = e->master_clock;
}

void exo_election_get_info(const exo_election *e, exo_election_info *out)
{
    memset(out, 0, sizeof *out);
    out->clock = e->clock;
    out->decided_clock = e->decided_clock;
    out->seniority = e->seniority;
    out->commands_seen = e->commands_seen;
    out->retry = e->retry;
    out->campaigns = e->campaigns;
    out->restarts = e->restarts;
    out->n_candidates = e->n_cands;
}

/* ---- wire codec -------------------------------------------------------------------------- */

#define WIRE_MAX_KEYS  32
#define WIRE_MAX_DEPTH 8

int exo_election_msg_validate(const exo_election_msg *m, exo_err *err)
{
    if (!exo_id_valid(m->from.s, strnlen(m->from.s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "election message: invalid sender id");
    if (!exo_id_valid(m->master.s, strnlen(m->master.s, EXO_ID_MAX)))
        return exo_err_set(err, EXO_EINVAL, "election message from %s: invalid master id", m->from.s);
    if (m->clock > EXO_ELECTION_VALUE_MAX)
        return exo_err_set(err, EXO_EINVAL, "election message from %s: clock %llu out of range", m->from.s,
                           (unsigned long long)m->clock);
    if (m->master_clock > m->clock)
        return exo_err_set(err, EXO_EINVAL, "election message from %s: session clock %llu above clock %llu",
                           m->from.s, (unsigned long long)m->master_clock, (unsigned long long)m->clock);
    if (m->seniority < -1 || m->seniority > (int64_t)EXO_ELECTION_VALUE_MAX)
        return exo_err_set(err, EXO_EINVAL, "election message from %s: seniority %lld out of range",
                           m->from.s, (long long)m->seniority);
    if (m->retry > EXO_ELECTION_MAX_RETRY)
        return exo_err_set(err, EXO_EINVAL, "election message from %s: retry %u (max %d)", m->from.s,
                           m->retry, EXO_ELECTION_MAX_RETRY);
    return 0;
}

bool exo_election_msg_equal(const exo_election_msg *a, const exo_election_msg *b)
{
    return exo_id_eq(&a->from, &b->from) && a->clock == b->clock && a->seniority == b->seniority &&
           a->commands_seen == b->commands_seen && exo_id_eq(&a->master, &b->master) &&
           a->master_clock == b->master_clock && a->decided == b->decided && a->retry == b->retry;
}

typedef struct wr {
    uint8_t *buf;
    size_t   cap, n;
    bool     short_buf;
} wr;

static void w_bytes(wr *w, const void *p, size_t n)
{
    if (w->cap - w->n < n) {
        w->short_buf = true;
        return;
    }
    memcpy(w->buf + w->n, p, n);
    w->n += n;
}

static void w_be(wr *w, uint8_t tag, uint64_t v, int n)
{
    uint8_t b[9];
    b[0] = tag;
    for (int i = 0; i < n; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    w_bytes(w, b, (size_t)n + 1);
}

static void w_uint(wr *w, uint64_t v)
{
    if (v <= 0x7f) {
        uint8_t b = (uint8_t)v;
        w_bytes(w, &b, 1);
    } else if (v <= 0xff) {
        w_be(w, 0xcc, v, 1);
    } else if (v <= 0xffff) {
        w_be(w, 0xcd, v, 2);
    } else if (v <= 0xffffffffu) {
        w_be(w, 0xce, v, 4);
    } else {
        w_be(w, 0xcf, v, 8);
    }
}

static void w_int(wr *w, int64_t v)
{
    if (v >= 0) {
        w_uint(w, (uint64_t)v);
    } else if (v >= -32) {
        uint8_t b = (uint8_t)(0xe0 | (v & 0x1f));
        w_bytes(w, &b, 1);
    } else if (v >= INT8_MIN) {
        w_be(w, 0xd0, (uint64_t)v, 1);
    } else if (v >= INT16_MIN) {
        w_be(w, 0xd1, (uint64_t)v, 2);
    } else if (v >= INT32_MIN) {
        w_be(w, 0xd2, (uint64_t)v, 4);
    } else {
        w_be(w, 0xd3, (uint64_t)v, 8);
    }
}

static void w_str(wr *w, const char *s)
{
    size_t n = strlen(s);   /* keys and ids: < 64 */
    if (n <= 31) {
        uint8_t b = (uint8_t)(0xa0 | n);
        w_bytes(w, &b, 1);
    } else {
        w_be(w, 0xd9, n, 1);
    }
    w_bytes(w, s, n);
}

int exo_election_msg_encode(const exo_election_msg *m, uint8_t *buf, size_t cap, size_t *out_len,
                            exo_err *err)
{
    int rc = exo_election_msg_validate(m, err);
    if (rc < 0)
        return rc;
    wr w = {.buf = buf, .cap = cap};
    uint8_t map = 0x80 | 9;
    w_bytes(&w, &map, 1);
    w_str(&w, "v");
    w_uint(&w, EXO_ELECTION_WIRE_VERSION);
    w_str(&w, "from");
    w_str(&w, m->from.s);
    w_str(&w, "clock");
    w_uint(&w, m->clock);
    w_str(&w, "seniority");
    w_int(&w, m->seniority);
    w_str(&w, "commands_seen");
    w_uint(&w, m->commands_seen);
    w_str(&w, "master");
    w_str(&w, m->master.s);
    w_str(&w, "master_clock");
    w_uint(&w, m->master_clock);
    w_str(&w, "decided");
    uint8_t b = m->decided ? 0xc3 : 0xc2;
    w_bytes(&w, &b, 1);
    w_str(&w, "retry");
    w_uint(&w, m->retry);
    if (w.short_buf)
        return exo_err_set(err, EXO_ETOOBIG, "election message: buffer of %zu bytes too small", cap);
    *out_len = w.n;
    return 0;
}

/* -- decoding: every read checks the bytes left first -- */

typedef struct rd {
    const uint8_t *b;
    size_t         len, pos;
} rd;

static bool r_take(rd *r, size_t n, const uint8_t **p)
{
    if (r->len - r->pos < n)
        return false;
    *p = r->b + r->pos;
    r->pos += n;
    return true;
}

static bool r_be(rd *r, int n, uint64_t *v)
{
    const uint8_t *p;
    if (!r_take(r, (size_t)n, &p))
        return false;
    *v = 0;
    for (int i = 0; i < n; i++)
        *v = (*v << 8) | p[i];
    return true;
}

/* An integer of any msgpack width: *neg and *u (value >= 0) or *i. */
static bool r_integer(rd *r, bool *neg, uint64_t *u, int64_t *i)
{
    const uint8_t *p;
    if (!r_take(r, 1, &p))
        return false;
    uint8_t c = *p;
    uint64_t v;
    *neg = false;
    if (c <= 0x7f) {
        *u = c;
        return true;
    }
    if (c >= 0xe0) {
        *neg = true;
        *i = (int8_t)c;
        return true;
    }
    if (c >= 0xcc && c <= 0xcf) {
        if (!r_be(r, 1 << (c - 0xcc), &v))
            return false;
        *u = v;
        return true;
    }
    if (c >= 0xd0 && c <= 0xd3) {
        int n = 1 << (c - 0xd0);
        if (!r_be(r, n, &v))
            return false;
        /* Sign-extend n bytes: flip the sign bit, subtract its weight. */
        uint64_t sign = UINT64_C(1) << (8 * n - 1);
        int64_t s = n == 8 ? (int64_t)v : (int64_t)(v ^ sign) - (int64_t)sign;
        if (s < 0) {
            *neg = true;
            *i = s;
        } else {
            *u = (uint64_t)s;
        }
        return true;
    }
    return false;
}

static bool r_str(rd *r, const char **s, size_t *n)
{
    const uint8_t *p;
    if (!r_take(r, 1, &p))
        return false;
    uint8_t c = *p;
    uint64_t len;
    if (c >= 0xa0 && c <= 0xbf)
        len = c & 0x1fu;
    else if (c == 0xd9 || c == 0xda || c == 0xdb) {
        if (!r_be(r, 1 << (c - 0xd9), &len))
            return false;
    } else {
        return false;
    }
    if (!r_take(r, (size_t)len, &p))
        return false;
    *s = (const char *)p;
    *n = (size_t)len;
    return true;
}

/* Skips one value (of an unknown key): codec.c's structural scan, which
 * never trusts a count beyond the bytes left, held to this codec's depth. */
static bool r_skip(rd *r, int depth)
{
    return exo_mp_scan(r->b, r->len, &r->pos, depth + EXO_MP_MAX_DEPTH - WIRE_MAX_DEPTH) == 0;
}

enum { K_V, K_FROM, K_CLOCK, K_SENIORITY, K_COMMANDS, K_MASTER, K_MASTER_CLOCK, K_DECIDED, K_RETRY, K__N };
static const char *const key_names[K__N] = {"v",      "from",         "clock",   "seniority", "commands_seen",
                                            "master", "master_clock", "decided", "retry"};

static int bad(exo_err *err, const char *key, const char *what)
{
    return exo_err_set(err, EXO_EFORMAT, "election message: \"%s\": %s", key, what);
}

static int dec_uint(rd *r, const char *key, uint64_t max, uint64_t *out, exo_err *err)
{
    bool neg;
    uint64_t u = 0;
    int64_t i = 0;
    if (!r_integer(r, &neg, &u, &i))
        return bad(err, key, "not an integer");
    if (neg || u > max)
        return bad(err, key, "out of range");
    *out = u;
    return 0;
}

static int dec_id(rd *r, const char *key, exo_id *out, exo_err *err)
{
    const char *s;
    size_t n;
    if (!r_str(r, &s, &n))
        return bad(err, key, "not a string");
    if (!exo_id_valid(s, n))
        return bad(err, key, "not a valid id");
    memcpy(out->s, s, n);
    out->s[n] = 0;
    return 0;
}

static int dec_value(rd *r, int k, exo_election_msg *m, exo_err *err)
{
    const char *key = key_names[k];
    uint64_t u = 0;
    int rc = 0;
    switch (k) {
    case K_V:
        if ((rc = dec_uint(r, key, UINT64_MAX, &u, err)) < 0)
            return rc;
        if (u == 0)
            return bad(err, key, "version 0");
        if (u > EXO_ELECTION_WIRE_VERSION)
            return exo_err_set(err, EXO_EUNSUPPORTED, "election message: version %llu (this build reads %d)",
                               (unsigned long long)u, EXO_ELECTION_WIRE_VERSION);
        return 0;
    case K_FROM: return dec_id(r, key, &m->from, err);
    case K_MASTER: return dec_id(r, key, &m->master, err);
    case K_CLOCK: return dec_uint(r, key, EXO_ELECTION_VALUE_MAX, &m->clock, err);
    case K_MASTER_CLOCK: return dec_uint(r, key, EXO_ELECTION_VALUE_MAX, &m->master_clock, err);
    case K_COMMANDS: return dec_uint(r, key, UINT64_MAX, &m->commands_seen, err);
    case K_RETRY:
        if ((rc = dec_uint(r, key, EXO_ELECTION_MAX_RETRY, &u, err)) < 0)
            return rc;
        m->retry = (uint32_t)u;
        return 0;
    case K_SENIORITY: {
        bool neg;
        int64_t i = 0;
        if (!r_integer(r, &neg, &u, &i))
            return bad(err, key, "not an integer");
        if (neg ? i != -1 : u > EXO_ELECTION_VALUE_MAX)
            return bad(err, key, "out of range");
        m->seniority = neg ? -1 : (int64_t)u;
        return 0;
    }
    case K_DECIDED: {
        const uint8_t *p;
        if (!r_take(r, 1, &p) || (*p != 0xc2 && *p != 0xc3))
            return bad(err, key, "not a boolean");
        m->decided = *p == 0xc3;
        return 0;
    }
    default: return exo_err_set(err, EXO_EINTERNAL, "election message: key %d", k);
    }
}

int exo_election_msg_decode(const uint8_t *buf, size_t len, exo_election_msg *out, exo_err *err)
{
    if (!buf || len == 0)
        return exo_err_set(err, EXO_EFORMAT, "election message: empty");
    if (len > EXO_ELECTION_MSG_MAX_BYTES)
        return exo_err_set(err, EXO_ETOOBIG, "election message: %zu bytes (max %d)", len,
                           EXO_ELECTION_MSG_MAX_BYTES);
    rd r = {.b = buf, .len = len};
    const uint8_t *p;
    uint64_t n;
    r_take(&r, 1, &p);
    if (*p >= 0x80 && *p <= 0x8f) {
        n = *p & 0x0fu;
    } else if (*p == 0xde || *p == 0xdf) {
        if (!r_be(&r, *p == 0xde ? 2 : 4, &n))
            return exo_err_set(err, EXO_EFORMAT, "election message: truncated map header");
    } else {
        return exo_err_set(err, EXO_EFORMAT, "election message: not a map");
    }
    if (n > WIRE_MAX_KEYS || 2 * n > len - r.pos)
        return exo_err_set(err, EXO_EFORMAT, "election message: %llu keys", (unsigned long long)n);
    exo_election_msg m;
    memset(&m, 0, sizeof m);
    const char *keys[WIRE_MAX_KEYS];
    size_t key_lens[WIRE_MAX_KEYS];
    unsigned seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!r_str(&r, &keys[i], &key_lens[i]))
            return exo_err_set(err, EXO_EFORMAT, "election message: key %zu is not a string", i);
        for (size_t j = 0; j < i; j++)
            if (key_lens[j] == key_lens[i] && memcmp(keys[j], keys[i], key_lens[i]) == 0)
                return exo_err_set(err, EXO_EFORMAT, "election message: duplicate key \"%.*s\"",
                                   (int)(key_lens[i] > 64 ? 64 : key_lens[i]), keys[i]);
        int k = -1;
        for (int j = 0; j < K__N; j++)
            if (strlen(key_names[j]) == key_lens[i] && memcmp(key_names[j], keys[i], key_lens[i]) == 0)
                k = j;
        int rc;
        if (k < 0) {
            if (!r_skip(&r, 1))
                return exo_err_set(err, EXO_EFORMAT, "election message: malformed value of key \"%.*s\"",
                                   (int)(key_lens[i] > 64 ? 64 : key_lens[i]), keys[i]);
        } else if ((rc = dec_value(&r, k, &m, err)) < 0) {
            return rc;
        } else {
            seen |= 1u << k;
        }
    }
    if (r.pos != len)
        return exo_err_set(err, EXO_EFORMAT, "election message: %zu trailing bytes", len - r.pos);
    for (int k = 0; k < K__N; k++)
        if (!(seen & (1u << k)))
            return exo_err_set(err, EXO_EFORMAT, "election message: missing \"%s\"", key_names[k]);
    int rc = exo_election_msg_validate(&m, err);
    if (rc < 0) {
        if (err)
            err->code = EXO_EFORMAT;
        return EXO_EFORMAT;
    }
    *out = m;
    return 0;
}
