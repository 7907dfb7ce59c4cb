/* GET /events pages on a thread of their own (see events_reader.h). */
#include "api/events_reader.h"

#include "core/alloc.h"
#include "core/json_util.h"
#include "core/log.h"

#include <jansson.h>
#include <pthread.h>
#include <string.h>

typedef struct job {
    exo_http_stream *st;
    int64_t          since, limit;
    bool             wrapped;
    struct job      *next;
} job;

struct exo_events_reader {
    exo_node       *node;
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    job            *head, *tail;
    size_t          n;
    bool            stop;
};

static void answer_json(exo_http_stream *st, int status, json_t *j)
{
    char *s = exo_json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    exo_http_stream_respond(st, status, "application/json", s ? s : "null", s ? strlen(s) : 4);
    exo_free(s);
    json_decref(j);
}

static void answer_error(exo_http_stream *st, int status, const char *type, const char *msg)
{
    answer_json(st, status, json_pack("{s:{s:s, s:s}}", "error", "message", msg, "type", type));
}

/* `since` before the oldest kept event: 410 with where to start. */
static void build_page(exo_events_reader *er, const job *j)
{
    if (exo_http_stream_closed(j->st))
        return; /* the client left while it waited */
    exo_err err = {0};
    exo_events_page pg;
    int rc = exo_node_events_page(er->node, j->since, j->limit, &pg, &err);
    if (rc == EXO_ENOENT)
        answer_json(j->st, 410, json_pack("{s:{s:s, s:s, s:I}}", "error", "message", err.msg, "type", "gone",
                                          "first", (json_int_t)pg.first));
    else if (rc < 0)
        answer_error(j->st, 500, "server_error", err.msg);
    else if (!j->wrapped)
        answer_json(j->st, 200, pg.events);
    else
        answer_json(j->st, 200, json_pack("{s:I, s:I, s:I, s:I, s:b, s:o}", "first", (json_int_t)pg.first, "since",
                                          (json_int_t)pg.since, "next", (json_int_t)pg.next, "count",
                                          (json_int_t)pg.count, "more", pg.next < pg.count, "events", pg.events));
}

static void *reader_main(void *arg)
{
    exo_events_reader *er = arg;
    pthread_mutex_lock(&er->mu);
    for (;;) {
        while (!er->head && !er->stop)
            pthread_cond_wait(&er->cv, &er->mu);
        job *j = er->head;
        if (!j)
            break; /* stopping with nothing queued */
        if (!(er->head = j->next))
            er->tail = NULL;
        er->n--;
        bool stop = er->stop;
        pthread_mutex_unlock(&er->mu);
        if (stop)
            answer_error(j->st, 503, "unavailable", "the server is shutting down");
        else
            build_page(er, j);
        exo_http_stream_release(j->st);
        exo_free(j);
        pthread_mutex_lock(&er->mu);
    }
    pthread_mutex_unlock(&er->mu);
    return NULL;
}

exo_events_reader *exo_events_reader_new(exo_node *node)
{
    exo_events_reader *er = exo_calloc(1, sizeof *er);
    er->node = node;
    pthread_mutex_init(&er->mu, NULL);
    pthread_cond_init(&er->cv, NULL);
    if (pthread_create(&er->thread, NULL, reader_main, er) != 0) {
        EXO_LOG_ERROR("api: cannot start the /events reader thread");
        pthread_mutex_destroy(&er->mu);
        pthread_cond_destroy(&er->cv);
        exo_free(er);
        return NULL;
    }
    return er;
}

int exo_events_reader_submit(exo_events_reader *er, exo_http_stream *st, int64_t since, int64_t limit,
                             bool wrapped)
{
    if (!er)
        return EXO_EBUSY;
    pthread_mutex_lock(&er->mu);
    if (er->stop || er->n >= EXO_EVENTS_READER_QUEUE) {
        pthread_mutex_unlock(&er->mu);
        return EXO_EBUSY;
    }
    job *j = exo_calloc(1, sizeof *j);
    *j = (job){st, since, limit, wrapped, NULL};
    if (er->tail)
        er->tail->next = j;
    else
        er->head = j;
    er->tail = j;
    er->n++;
    pthread_cond_signal(&er->cv);
    pthread_mutex_unlock(&er->mu);
    return 0;
}

void exo_events_reader_stop(exo_events_reader *er)
{
    if (!er)
        return;
    pthread_mutex_lock(&er->mu);
    bool joined = er->stop;
    er->stop = true;
    pthread_cond_signal(&er->cv);
    pthread_mutex_unlock(&er->mu);
    if (!joined)
        pthread_join(er->thread, NULL);
}

void exo_events_reader_free(exo_events_reader *er)
{
    if (!er)
        return;
    exo_events_reader_stop(er);
    pthread_mutex_destroy(&er->mu);
    pthread_cond_destroy(&er->cv);
    exo_free(er);
}
