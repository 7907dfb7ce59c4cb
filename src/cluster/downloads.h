/* The node's download coordinator (exo's DownloadCoordinator, exo-reference
 * §2.7): the downloads this node runs (download/downloader.h), one per
 * model, and their progress as NodeDownloadProgress events.
 *
 *   - the worker asks for a shard's files with exo_downloads_ensure: on
 *     disk -> the model dir; else a download starts (or is already
 *     running: the same model asked for twice downloads once) and the
 *     worker is asked to replan when it ends;
 *   - users start, cancel and delete downloads (the API; on another node
 *     through a Download message) with exo_downloads_act;
 *   - progress is published at most once a second per model while bytes
 *     move, and at once when a download starts, completes or fails.
 * A cancelled download stays cancelled (ensure reports it) until started
 * again, so cancelling the download of a placed model fails its runner and,
 * after the worker's retries, its instance.
 *
 * Threading: the node loop thread; download threads only signal it. */
#ifndef EXO_CLUSTER_DOWNLOADS_H
#define EXO_CLUSTER_DOWNLOADS_H

#include "cluster/events.h"
#include "core/paths.h"
#include "download/hub.h"
#include "proto/shard.h"

#include <uv.h>

typedef struct exo_downloads exo_downloads;

typedef struct exo_downloads_host {
    void *ctx;
    void (*emit)(void *ctx, exo_event *ev); /* consumes ev */
    void (*replan)(void *ctx);              /* a download ended */
} exo_downloads_host;

typedef enum exo_download_action {
    EXO_DOWNLOAD_START,
    EXO_DOWNLOAD_CANCEL,
    EXO_DOWNLOAD_DELETE,
} exo_download_action;

exo_downloads *exo_downloads_new(uv_loop_t *loop, const exo_id *node_id, const exo_models_dir *dirs, int n_dirs,
                                 const exo_hub_opts *hub, const exo_downloads_host *host);

/* 0 and the model dir when the files of shard (NULL: all) are on disk;
 * EXO_EBUSY while they download; the failure otherwise (once: the next
 * call starts over, unless the user cancelled). */
int exo_downloads_ensure(exo_downloads *d, const char *model_id, const exo_layer_shard *shard, char *dir, size_t cap,
                         exo_err *err);

/* A user's start / cancel / delete. Delete refuses (EXO_EBUSY) while
 * `in_use` (a runner of this node has the model) and models only in
 * read-only dirs (EXO_EPERM). */
int exo_downloads_act(exo_downloads *d, exo_download_action action, const char *model_id, bool in_use, exo_err *err);

/* Cancels and joins every download (bounded: ~100 ms each), closes the
 * timer; run the loop once more before exo_downloads_free. */
void exo_downloads_shutdown(exo_downloads *d);
void exo_downloads_free(exo_downloads *d);

#endif
