/* Downloads of models (or of one pipeline shard's part of a model) from the
 * Hugging Face hub into a models directory, as exo's download coordinator
 * does (exo-reference §2.7), in a background thread per download.
 *
 * Layout: <models dir>/<org>--<name>/ holds the repository's files at their
 * repository paths, beside one metadata file, ".exo-download.json": the
 * hub's file list (sizes and hashes) and whether every file is there
 * ("complete"). The model store (model_store.h) does not list a directory
 * whose metadata says incomplete, so a model half downloaded, or holding
 * only a shard's files, is never taken for a whole one; files in flight are
 * "<path>.partial" (hub.h), so a file under its own name is complete.
 *
 * A download:
 *   1. looks for the model in every models dir: if one holds the files the
 *      shard needs, it is done (read_only says whether that dir is);
 *   2. offline: fails "Model files not found locally in offline mode";
 *   3. lists the repository's files (minus original/ and metal/, which
 *      exo skips too) and fetches the small ones (configs, tokenizer, the
 *      safetensors index) first;
 *   4. picks the weight files: all of them for a whole model, those holding
 *      a tensor the shard needs (proto/shard.h, through the index) for a
 *      layer range;
 *   5. checks the free space for the bytes still missing (a dir already
 *      holding the model first, else the first writable dir with room);
 *   6. fetches up to `parallel` files at a time, resuming partial files;
 *   7. marks the metadata complete when every file of the list is there.
 * Progress (bytes, files, speed, ETA) can be read at any time; a cancelled
 * download stops within ~100 ms and keeps its partial files. */
#ifndef EXO_DOWNLOAD_DOWNLOADER_H
#define EXO_DOWNLOAD_DOWNLOADER_H

#include "core/error.h"
#include "core/paths.h"
#include "download/hub.h"
#include "download/model_store.h"
#include "proto/shard.h"

#include <stdbool.h>
#include <stdint.h>

#define EXO_DOWNLOAD_META ".exo-download.json"

typedef enum exo_download_phase {
    EXO_DOWNLOAD_PENDING,   /* not started, or listing */
    EXO_DOWNLOAD_ONGOING,
    EXO_DOWNLOAD_COMPLETED,
    EXO_DOWNLOAD_FAILED,    /* err says why; cancelled is EXO_ECANCELED */
} exo_download_phase;

typedef struct exo_download_progress {
    exo_download_phase phase;
    int64_t total, downloaded, downloaded_this_session; /* bytes */
    int32_t completed_files, total_files;
    double  speed;    /* bytes/s over this session */
    int64_t eta_ms;   /* 0 when unknown */
    bool    read_only;
    char    dir[4096]; /* the model directory, once chosen */
    exo_err err;
} exo_download_progress;

typedef struct exo_download_opts {
    const exo_models_dir *dirs;
    int                   n_dirs;
    exo_hub_opts          hub;
    int                   parallel; /* files at a time (<= 0: 8) */
    /* Called from the download's thread when its phase changes (may be NULL). */
    void (*on_change)(void *ctx);
    void *ctx;
} exo_download_opts;

typedef struct exo_download exo_download;

/* Starts a download of model_id (shard NULL or total 0: the whole model). */
exo_download *exo_download_start(const exo_download_opts *o, const char *model_id, const exo_layer_shard *shard);
void          exo_download_get(exo_download *d, exo_download_progress *out);
void          exo_download_cancel(exo_download *d);
/* Cancels if running, waits for the thread, frees. */
void          exo_download_free(exo_download *d);

/* Where the files a shard needs (shard NULL: the whole model) are all on
 * disk: 0 with the model dir (and whether it is read-only), else
 * EXO_ENOENT. Reads no network. */
int exo_download_locate(const exo_models_dir *dirs, int n_dirs, const char *model_id, const exo_layer_shard *shard,
                        char *dir, size_t cap, bool *read_only);

/* Deletes a model's directory from every writable models dir. EXO_EPERM if
 * it is only in read-only dirs, EXO_ENOENT if nowhere. */
int exo_download_delete(const exo_models_dir *dirs, int n_dirs, const char *model_id, exo_err *err);

/* A model's card from the hub, for a model added by id (POST /models/add):
 * its config.json (as the model store reads one) and its file list (the
 * size of its *.safetensors). id and dimensions are filled; EXO_EINVAL when
 * the config names no layer count. */
int exo_download_card(const exo_hub_opts *hub, const char *model_id, exo_model_entry *out, exo_err *err);

/* The weight files of a checkpoint that a shard needs, from the safetensors
 * index's weight_map (index_json: the index file's text): files[i] is set
 * for each name in `names` that holds a needed tensor. EXO_EFORMAT for a
 * malformed index. Exposed for tests. */
int exo_download_shard_files(const char *index_json, size_t len, const exo_layer_shard *shard,
                             const char *const *names, size_t n_names, bool *needed, exo_err *err);

#endif
