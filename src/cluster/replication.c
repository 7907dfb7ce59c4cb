/* The replication buffers (see replication.h). Each keeps its waiting
 * events in a small array sorted by index: sizes are bounded and the common
 * case (in order) never touches it. */
#include "cluster/replication.h"

#include "core/alloc.h"
#include "core/log.h"

#include <string.h>

/* ---- outbox ----------------------------------------------------------------- */

typedef struct out_item {
    uint64_t  origin_idx;
    uint64_t  sent_ms;    /* 0: never sent */
    exo_event ev;
} out_item;

struct exo_outbox {
    exo_id    system;
    uint64_t  next_idx;
    out_item *items;      /* oldest first */
    size_t    n, cap;
};

exo_outbox *exo_outbox_new(void)
{
    exo_outbox *o = exo_calloc(1, sizeof *o);
    exo_id_new(&o->system);
    return o;
}

void exo_outbox_free(exo_outbox *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->n; i++)
        exo_event_clear(&o->items[i].ev);
    exo_free(o->items);
    exo_free(o);
}

void exo_outbox_reset(exo_outbox *o)
{
    exo_id_new(&o->system);
    for (size_t i = 0; i < o->n; i++) {
        o->items[i].origin_idx = i;
        o->items[i].sent_ms = 0;
    }
    o->next_idx = o->n;
}

const exo_id *exo_outbox_system(const exo_outbox *o) { return &o->system; }
size_t exo_outbox_pending(const exo_outbox *o) { return o->n; }

void exo_outbox_push(exo_outbox *o, exo_event *ev)
{
    if (o->n == EXO_OUTBOX_MAX) {
        EXO_LOG_WARN("replication: %d local events wait for a master; dropping the oldest (%s)",
                     EXO_OUTBOX_MAX, exo_event_kind_name(o->items[0].ev.kind));
        exo_event_clear(&o->items[0].ev);
        memmove(o->items, o->items + 1, (o->n - 1) * sizeof *o->items);
        o->n--;
        exo_outbox_reset(o);
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 16;
        o->items = exo_realloc(o->items, o->cap * sizeof *o->items);
    }
    out_item *it = &o->items[o->n++];
    it->origin_idx = o->next_idx++;
    it->sent_ms = 0;
    it->ev = *ev;
    memset(ev, 0, sizeof *ev);
}

void exo_outbox_ack(exo_outbox *o, const exo_id *system, uint64_t origin_idx)
{
    if (!exo_id_eq(system, &o->system))
        return;
    size_t k = 0;
    while (k < o->n && o->items[k].origin_idx <= origin_idx)
        exo_event_clear(&o->items[k++].ev);
    if (k) {
        memmove(o->items, o->items + k, (o->n - k) * sizeof *o->items);
        o->n -= k;
    }
}

void exo_outbox_send_due(exo_outbox *o, uint64_t now_ms, uint64_t resend_ms, exo_outbox_send_fn fn, void *ctx)
{
    for (size_t i = 0; i < o->n; i++) {
        out_item *it = &o->items[i];
        if (it->sent_ms && now_ms < it->sent_ms + resend_ms)
            continue;
        it->sent_ms = now_ms ? now_ms : 1;
        fn(ctx, it->origin_idx, &it->ev);
    }
}

/* ---- sequencer ------------------------------------------------------------------ */

typedef struct early {
    uint64_t  idx;
    exo_event ev;
} early;

typedef struct seq_system {
    exo_id   system;
    uint64_t next;
    uint64_t last_used;  /* for eviction: the sequencer's offer counter */
    early   *waiting;    /* sorted by idx */
    size_t   n, cap;
} seq_system;

struct exo_sequencer {
    seq_system *systems;
    size_t      n, cap;
    uint64_t    tick;
};

exo_sequencer *exo_sequencer_new(void) { return exo_calloc(1, sizeof(exo_sequencer)); }

static void early_clear(early *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        exo_event_clear(&v[i].ev);
}

void exo_sequencer_free(exo_sequencer *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        early_clear(s->systems[i].waiting, s->systems[i].n);
        exo_free(s->systems[i].waiting);
    }
    exo_free(s->systems);
    exo_free(s);
}

/* Inserts into a sorted early list; false if idx is already there. */
static bool early_insert(early **v, size_t *n, size_t *cap, uint64_t idx, exo_event *ev)
{
    size_t at = *n;
    while (at > 0 && (*v)[at - 1].idx > idx)
        at--;
    if (at > 0 && (*v)[at - 1].idx == idx)
        return false;
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        *v = exo_realloc(*v, *cap * sizeof **v);
    }
    memmove(*v + at + 1, *v + at, (*n - at) * sizeof **v);
    (*v)[at].idx = idx;
    (*v)[at].ev = *ev;
    memset(ev, 0, sizeof *ev);
    (*n)++;
    return true;
}

static seq_system *find_system(exo_sequencer *s, const exo_id *system)
{
    for (size_t i = 0; i < s->n; i++)
        if (exo_id_eq(&s->systems[i].system, system))
            return &s->systems[i];
    if (s->n == EXO_SEQUENCER_MAX_SYSTEMS) { /* forget the least recently heard */
        size_t lru = 0;
        for (size_t i = 1; i < s->n; i++)
            if (s->systems[i].last_used < s->systems[lru].last_used)
                lru = i;
        early_clear(s->systems[lru].waiting, s->systems[lru].n);
        exo_free(s->systems[lru].waiting);
        s->systems[lru] = s->systems[--s->n];
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->systems = exo_realloc(s->systems, s->cap * sizeof *s->systems);
    }
    seq_system *sys = &s->systems[s->n++];
    memset(sys, 0, sizeof *sys);
    sys->system = *system;
    return sys;
}

int exo_sequencer_offer(exo_sequencer *s, const exo_id *system, uint64_t origin_idx, exo_event *ev,
                        exo_sequencer_ready_fn fn, void *ctx)
{
    seq_system *sys = find_system(s, system);
    sys->last_used = ++s->tick;
    if (origin_idx < sys->next) {
        exo_event_clear(ev);
        return 1;
    }
    if (origin_idx > sys->next) {
        if (sys->n >= EXO_SEQUENCER_MAX_EARLY) {
            exo_event_clear(ev);
            return EXO_EBUSY;
        }
        if (!early_insert(&sys->waiting, &sys->n, &sys->cap, origin_idx, ev)) {
            exo_event_clear(ev);
            return 1;
        }
        return 0;
    }
    /* In order: release it and whatever waited behind it. The system record
     * may move if the callback re-enters (it does not), so keep indices. */
    exo_id sid = sys->system;
    exo_event cur = *ev;
    memset(ev, 0, sizeof *ev);
    uint64_t idx = origin_idx;
    for (;;) {
        sys->next = idx + 1;
        fn(ctx, &sid, idx, &cur);
        if (!sys->n || sys->waiting[0].idx != sys->next)
            break;
        idx = sys->waiting[0].idx;
        cur = sys->waiting[0].ev;
        memmove(sys->waiting, sys->waiting + 1, (sys->n - 1) * sizeof *sys->waiting);
        sys->n--;
    }
    return 0;
}

/* ---- replica --------------------------------------------------------------------- */

struct exo_replica {
    uint64_t next;
    uint64_t known;        /* highest count the master reported */
    early   *waiting;
    size_t   n, cap;
    uint64_t retry_ms;     /* current back-off, 0 = ask at once */
    uint64_t next_request_ms;
};

exo_replica *exo_replica_new(void) { return exo_calloc(1, sizeof(exo_replica)); }

void exo_replica_reset(exo_replica *r)
{
    early_clear(r->waiting, r->n);
    r->n = 0;
    r->next = r->known = 0;
    r->retry_ms = 0;
    r->next_request_ms = 0;
}

void exo_replica_free(exo_replica *r)
{
    if (!r)
        return;
    exo_replica_reset(r);
    exo_free(r->waiting);
    exo_free(r);
}

uint64_t exo_replica_next(const exo_replica *r) { return r->next; }
uint64_t exo_replica_known_count(const exo_replica *r) { return r->known; }

static void progressed(exo_replica *r)
{
    r->retry_ms = 0;
    r->next_request_ms = 0;
}

int exo_replica_offer(exo_replica *r, uint64_t idx, exo_event *ev, exo_replica_apply_fn fn, void *ctx)
{
    if (idx + 1 > r->known)
        r->known = idx + 1;
    if (idx < r->next) {
        exo_event_clear(ev);
        return 1;
    }
    if (idx > r->next) {
        if (r->n >= EXO_REPLICA_MAX_EARLY) {
            exo_event_clear(ev);
            return EXO_EBUSY;
        }
        if (!early_insert(&r->waiting, &r->n, &r->cap, idx, ev))
            exo_event_clear(ev);
        return 0;
    }
    exo_event cur = *ev;
    memset(ev, 0, sizeof *ev);
    for (;;) {
        r->next = idx + 1;
        fn(ctx, idx, &cur);
        /* drop waiting events the callback's progress made stale */
        while (r->n && r->waiting[0].idx < r->next) {
            exo_event_clear(&r->waiting[0].ev);
            memmove(r->waiting, r->waiting + 1, (r->n - 1) * sizeof *r->waiting);
            r->n--;
        }
        if (!r->n || r->waiting[0].idx != r->next)
            break;
        idx = r->waiting[0].idx;
        cur = r->waiting[0].ev;
        memmove(r->waiting, r->waiting + 1, (r->n - 1) * sizeof *r->waiting);
        r->n--;
    }
    progressed(r);
    return 0;
}

void exo_replica_note_count(exo_replica *r, uint64_t count)
{
    if (count > r->known)
        r->known = count;
}

void exo_replica_skip_to(exo_replica *r, uint64_t next, exo_replica_apply_fn fn, void *ctx)
{
    if (next <= r->next)
        return;
    r->next = next;
    exo_replica_note_count(r, next);
    while (r->n && r->waiting[0].idx < next) {
        exo_event_clear(&r->waiting[0].ev);
        memmove(r->waiting, r->waiting + 1, (r->n - 1) * sizeof *r->waiting);
        r->n--;
    }
    progressed(r);
    if (r->n && r->waiting[0].idx == next) {
        exo_event ev = r->waiting[0].ev;
        memmove(r->waiting, r->waiting + 1, (r->n - 1) * sizeof *r->waiting);
        r->n--;
        exo_replica_offer(r, next, &ev, fn, ctx);
    }
}

bool exo_replica_behind(const exo_replica *r) { return r->next < r->known; }

bool exo_replica_request_due(exo_replica *r, uint64_t now_ms, uint64_t *since)
{
    if (!exo_replica_behind(r) || now_ms < r->next_request_ms)
        return false;
    *since = r->next;
    r->retry_ms = r->retry_ms ? r->retry_ms * 2 : EXO_REPLICA_RETRY_MIN_MS;
    if (r->retry_ms > EXO_REPLICA_RETRY_MAX_MS)
        r->retry_ms = EXO_REPLICA_RETRY_MAX_MS;
    r->next_request_ms = now_ms + r->retry_ms;
    return true;
}
