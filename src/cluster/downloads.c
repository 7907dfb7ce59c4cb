/* The download coordinator (see downloads.h).
 *
 * One job per model. A job runs one exo_download at a time; when the
 * worker needs a shard the running download does not cover (a later
 * placement of the same model), the job is restarted for the union once
 * the current one ends: files already fetched are skipped, so nothing is
 * downloaded twice. Download threads wake the loop through a uv_async; a
 * one-second timer publishes byte progress. */
#include "cluster/downloads.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "download/downloader.h"

#include <stdio.h>
#include <string.h>

#define PUBLISH_MS 1000

typedef struct job {
    char            model_id[EXO_MODEL_ID_MAX];
    exo_download   *dl;        /* NULL when idle */
    exo_layer_shard shard;     /* what dl fetches (total 0: all) */
    exo_layer_shard want;      /* what was asked for since (union); total 0 with want_any: all */
    bool            want_any;  /* someone waits for more than dl covers */
    bool            cancelled; /* by a user: stays until started again */
    bool            failed;    /* the last download failed: reported once */
    exo_err         err;
    exo_download_progress last; /* as last published */
    uint64_t        published_ms;
    struct job     *next;
} job;

struct exo_downloads {
    uv_loop_t         *loop;
    exo_id             node_id;
    const exo_models_dir *dirs; /* the node config's: outlives us */
    int                n_dirs;
    exo_hub_opts       hub;
    exo_downloads_host host;
    uv_async_t         wake;
    uv_timer_t         timer;
    job               *jobs;
};

static job *job_find(exo_downloads *d, const char *model_id)
{
    for (job *j = d->jobs; j; j = j->next)
        if (!strcmp(j->model_id, model_id))
            return j;
    return NULL;
}

static job *job_get(exo_downloads *d, const char *model_id)
{
    job *j = job_find(d, model_id);
    if (!j) {
        j = exo_calloc(1, sizeof *j);
        snprintf(j->model_id, sizeof j->model_id, "%s", model_id);
        j->next = d->jobs;
        d->jobs = j;
    }
    return j;
}

static bool whole(const exo_layer_shard *s) { return !s || s->total == 0; }

/* Whether shard a covers shard b. */
static bool covers(const exo_layer_shard *a, const exo_layer_shard *b)
{
    if (whole(a))
        return true;
    if (whole(b))
        return false;
    return a->first <= b->first && a->last >= b->last;
}

static void merge(exo_layer_shard *into, const exo_layer_shard *s)
{
    if (whole(into) || whole(s)) {
        memset(into, 0, sizeof *into);
        return;
    }
    if (s->first < into->first)
        into->first = s->first;
    if (s->last > into->last)
        into->last = s->last;
}

/* ---- publishing ---------------------------------------------------------------- */

static exo_download_kind kind_of(exo_download_phase p)
{
    switch (p) {
    case EXO_DOWNLOAD_ONGOING: return EXO_DOWNLOAD_KIND_ONGOING;
    case EXO_DOWNLOAD_COMPLETED: return EXO_DOWNLOAD_KIND_COMPLETED;
    case EXO_DOWNLOAD_FAILED: return EXO_DOWNLOAD_KIND_FAILED;
    default: return EXO_DOWNLOAD_KIND_PENDING;
    }
}

static void publish(exo_downloads *d, job *j, const exo_download_progress *p)
{
    exo_event ev;
    exo_event_init(&ev, EXO_EVENT_NODE_DOWNLOAD_PROGRESS);
    exo_download_status *s = &ev.u.node_download_progress.status;
    s->node_id = d->node_id;
    snprintf(s->model_id, sizeof s->model_id, "%s", j->model_id);
    s->kind = kind_of(p->phase);
    if (!whole(&j->shard) && j->shard.total > 0) {
        s->start_layer = j->shard.first;
        s->end_layer = j->shard.last;
        s->n_layers = j->shard.total;
    }
    s->model_directory = p->dir[0] ? exo_strndup(p->dir, strnlen(p->dir, sizeof p->dir - 1)) : NULL;
    s->total = p->total > 0 ? (uint64_t)p->total : 0;
    s->downloaded = p->downloaded > 0 ? (uint64_t)p->downloaded : 0;
    s->downloaded_this_session = p->downloaded_this_session > 0 ? (uint64_t)p->downloaded_this_session : 0;
    s->completed_files = p->completed_files;
    s->total_files = p->total_files;
    s->speed = p->speed > 0 ? (uint64_t)p->speed : 0;
    s->eta_ms = p->eta_ms > 0 ? p->eta_ms : 0;
    s->read_only = p->read_only;
    if (p->phase == EXO_DOWNLOAD_FAILED)
        s->error_message = exo_strndup(p->err.msg, strnlen(p->err.msg, sizeof p->err.msg - 1));
    j->last = *p;
    j->published_ms = exo_clock_ns() / 1000000;
    d->host.emit(d->host.ctx, &ev);
}

static void wake_loop(void *async) { uv_async_send(async); }

static void start_download(exo_downloads *d, job *j, const exo_layer_shard *shard)
{
    exo_download_opts o = {d->dirs, d->n_dirs, d->hub, 0, wake_loop, &d->wake};
    j->shard = shard ? *shard : (exo_layer_shard){0};
    j->want_any = false;
    j->failed = false;
    j->dl = exo_download_start(&o, j->model_id, whole(&j->shard) ? NULL : &j->shard);
    EXO_LOG_INFO("downloads: %s: started (%s)", j->model_id, whole(&j->shard) ? "all files" : "a shard's files");
    exo_download_progress p = {0};
    p.phase = EXO_DOWNLOAD_PENDING;
    publish(d, j, &p);
}

/* Looks at every download: publishes what changed, reaps what ended. */
static void poll_jobs(exo_downloads *d, bool timer)
{
    bool ended = false;
    uint64_t now = exo_clock_ns() / 1000000;
    for (job *j = d->jobs; j; j = j->next) {
        if (!j->dl)
            continue;
        exo_download_progress p;
        exo_download_get(j->dl, &p);
        bool phase_changed = p.phase != j->last.phase;
        if (p.phase >= EXO_DOWNLOAD_COMPLETED) {
            exo_download_free(j->dl);
            j->dl = NULL;
            ended = true;
            if (p.phase == EXO_DOWNLOAD_FAILED) {
                j->failed = true;
                j->err = p.err;
                j->cancelled |= p.err.code == EXO_ECANCELED;
            }
            publish(d, j, &p);
            if (j->want_any && p.phase == EXO_DOWNLOAD_COMPLETED && !j->cancelled)
                start_download(d, j, &j->want);
            continue;
        }
        bool moved = p.downloaded != j->last.downloaded || p.total != j->last.total;
        if (phase_changed || (timer && moved && now - j->published_ms >= PUBLISH_MS))
            publish(d, j, &p);
    }
    if (ended)
        d->host.replan(d->host.ctx);
}

static void on_wake(uv_async_t *h) { poll_jobs(h->data, false); }
static void on_timer(uv_timer_t *t) { poll_jobs(t->data, true); }

/* ---- API ---------------------------------------------------------------------- */

exo_downloads *exo_downloads_new(uv_loop_t *loop, const exo_id *node_id, const exo_models_dir *dirs, int n_dirs,
                                 const exo_hub_opts *hub, const exo_downloads_host *host)
{
    exo_downloads *d = exo_calloc(1, sizeof *d);
    d->loop = loop;
    d->node_id = *node_id;
    d->dirs = dirs;
    d->n_dirs = n_dirs;
    d->hub = *hub;
    d->host = *host;
    uv_async_init(loop, &d->wake, on_wake);
    d->wake.data = d;
    uv_timer_init(loop, &d->timer);
    d->timer.data = d;
    uv_timer_start(&d->timer, on_timer, PUBLISH_MS, PUBLISH_MS);
    uv_unref((uv_handle_t *)&d->timer);
    return d;
}

int exo_downloads_ensure(exo_downloads *d, const char *model_id, const exo_layer_shard *shard, char *dir, size_t cap,
                         exo_err *err)
{
    /* asked on every plan while it downloads: no disk scan then */
    job *j = job_find(d, model_id);
    if (j && j->dl && covers(&j->shard, shard))
        return exo_err_set(err, EXO_EBUSY, "%s is downloading", model_id);
    if (!exo_download_locate(d->dirs, d->n_dirs, model_id, shard, dir, cap, NULL))
        return 0;
    j = job_get(d, model_id);
    if (j->cancelled)
        return exo_err_set(err, EXO_ECANCELED, "the download of %s was cancelled (start it again to run the model)",
                           model_id);
    if (j->dl) {
        if (!covers(&j->shard, shard)) { /* fetch the rest once this one ends */
            if (!j->want_any)
                j->want = j->shard;
            merge(&j->want, shard ? shard : &(exo_layer_shard){0});
            j->want_any = true;
        }
        return exo_err_set(err, EXO_EBUSY, "%s is downloading", model_id);
    }
    if (j->failed) {
        j->failed = false;
        *err = j->err;
        return err->code ? err->code : EXO_EIO;
    }
    start_download(d, j, shard);
    return exo_err_set(err, EXO_EBUSY, "%s is downloading", model_id);
}

int exo_downloads_act(exo_downloads *d, exo_download_action action, const char *model_id, bool in_use, exo_err *err)
{
    job *j = job_find(d, model_id);
    switch (action) {
    case EXO_DOWNLOAD_START:
        j = job_get(d, model_id);
        j->cancelled = false;
        if (!j->dl)
            start_download(d, j, NULL);
        else if (!whole(&j->shard)) {
            memset(&j->want, 0, sizeof j->want);
            j->want_any = true;
        }
        return 0;
    case EXO_DOWNLOAD_CANCEL:
        if (!j || !j->dl)
            return exo_err_set(err, EXO_ENOENT, "%s is not downloading on this node", model_id);
        j->cancelled = true;
        j->want_any = false;
        exo_download_cancel(j->dl); /* the thread ends within ~100 ms; poll_jobs publishes it */
        return 0;
    case EXO_DOWNLOAD_DELETE: {
        if (in_use)
            return exo_err_set(err, EXO_EBUSY, "%s is in use by an instance on this node: delete the instance first",
                               model_id);
        if (j && j->dl) {
            j->cancelled = true;
            exo_download_free(j->dl); /* cancels and joins */
            j->dl = NULL;
        }
        int rc = exo_download_delete(d->dirs, d->n_dirs, model_id, err);
        if (rc && rc != EXO_ENOENT)
            return rc;
        if (j)
            j->failed = false;
        exo_event ev;
        exo_event_init(&ev, EXO_EVENT_NODE_DOWNLOAD_DELETED);
        ev.u.node_download_deleted.node_id = d->node_id;
        snprintf(ev.u.node_download_deleted.model_id, EXO_MODEL_ID_MAX, "%s", model_id);
        d->host.emit(d->host.ctx, &ev);
        return rc;
    }
    }
    return exo_err_set(err, EXO_EINVAL, "unknown download action %d", (int)action);
}

void exo_downloads_shutdown(exo_downloads *d)
{
    for (job *j = d->jobs; j; j = j->next) {
        exo_download_free(j->dl);
        j->dl = NULL;
    }
    uv_timer_stop(&d->timer);
    uv_close((uv_handle_t *)&d->timer, NULL);
    uv_close((uv_handle_t *)&d->wake, NULL);
}

void exo_downloads_free(exo_downloads *d)
{
    if (!d)
        return;
    while (d->jobs) {
        job *j = d->jobs;
        d->jobs = j->next;
        exo_download_free(j->dl);
        exo_free(j);
    }
    exo_free(d);
}
