/* `exo download MODEL [--models-dir DIR]... [--layers FIRST:LAST] [--offline]
 *  [--parallel N] [--delete]`: fetches a model (or the files a pipeline
 * shard of layers [FIRST, LAST) needs) from the Hugging Face hub into the
 * models directory, exactly as the daemon's workers do (download/
 * downloader.h), printing one progress line per second. The hub is
 * HF_ENDPOINT (default huggingface.co), with HF_TOKEN when set; offline
 * (--offline or HF_HUB_OFFLINE=1) it only checks the disk. --delete removes
 * the model from the writable models dirs instead.
 *
 * Exit status: 0 done, 1 the download failed (the message says why: auth,
 * not found, disk full, checksum...), 2 bad arguments, 130 interrupted
 * (partial files are kept; running it again resumes). */
#include "cli/args.h"
#include "core/alloc.h"
#include "core/paths.h"
#include "download/downloader.h"
#include "download/model_store.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int exo_cmd_download(int argc, char **argv);

#define MAX_DIRS 16

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = 1; }

static void usage(void)
{
    fprintf(stderr, "usage: exo download ORG/NAME [--models-dir DIR]... [--layers FIRST:LAST]\n"
                    "         [--offline] [--parallel N] [--delete] [--quiet]\n");
}

static const char *phase_name(exo_download_phase p)
{
    static const char *const names[] = {"pending", "downloading", "complete", "failed"};
    return names[p];
}

int exo_cmd_download(int argc, char **argv)
{
    const char *model = NULL, *dirs_flag[MAX_DIRS];
    int n_dirs = 0, first = -1, last = -1;
    long parallel = 0;
    bool offline = false, del = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--models-dir")) {
            if (!(v = exo_arg_value("download", argc, argv, &i)))
                return 2;
            if (n_dirs == MAX_DIRS) {
                fprintf(stderr, "exo download: at most %d --models-dir\n", MAX_DIRS);
                return 2;
            }
            dirs_flag[n_dirs++] = v;
        } else if (!strcmp(a, "--layers")) {
            if (!(v = exo_arg_value("download", argc, argv, &i)))
                return 2;
            if (sscanf(v, "%d:%d", &first, &last) != 2 || first < 0 || last <= first) {
                fprintf(stderr, "exo download: --layers wants FIRST:LAST with 0 <= FIRST < LAST\n");
                return 2;
            }
        } else if (!strcmp(a, "--parallel")) {
            if (!(v = exo_arg_value("download", argc, argv, &i)) ||
                exo_arg_int("download", "--parallel", v, 1, 64, &parallel))
                return 2;
        } else if (!strcmp(a, "--offline")) {
            offline = true;
        } else if (!strcmp(a, "--delete")) {
            del = true;
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' || model) {
            usage();
            return 2;
        } else {
            model = a;
        }
    }
    char dname[300];
    if (!model || !exo_model_dir_name(model, dname, sizeof dname)) {
        if (model)
            fprintf(stderr, "exo download: '%s' is not a model id (org/name)\n", model);
        usage();
        return 2;
    }
    exo_paths paths;
    exo_err err = {0};
    if (exo_paths_resolve(NULL, dirs_flag, n_dirs, &paths, &err)) {
        fprintf(stderr, "exo download: %s\n", err.msg);
        return 1;
    }
    if (del) {
        int rc = exo_download_delete(paths.models_dirs, paths.n_models_dirs, model, &err);
        if (rc)
            fprintf(stderr, "exo download: %s\n", err.msg);
        exo_paths_free(&paths);
        return rc ? 1 : 0;
    }
    exo_download_opts o = {.dirs = paths.models_dirs, .n_dirs = paths.n_models_dirs, .parallel = (int)parallel};
    exo_hub_opts_from_env(&o.hub);
    o.hub.offline |= offline;
    exo_layer_shard shard = {0};
    if (first >= 0) {
        shard.first = first;
        shard.last = last;
        shard.total = -1; /* config.json's */
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    exo_download *d = exo_download_start(&o, model, first >= 0 ? &shard : NULL);
    exo_download_progress p;
    for (;;) {
        struct timespec ts = {0, 100 * 1000000L};
        for (int k = 0; k < 10; k++) {
            nanosleep(&ts, NULL);
            exo_download_get(d, &p);
            if (p.phase >= EXO_DOWNLOAD_COMPLETED || interrupted)
                break;
        }
        if (interrupted)
            exo_download_cancel(d);
        exo_download_get(d, &p);
        if (!quiet || p.phase >= EXO_DOWNLOAD_COMPLETED)
            fprintf(stderr, "%s %s: %.1f/%.1f MiB, files %d/%d, %.1f MiB/s, eta %llds\n", model,
                    phase_name(p.phase), p.downloaded / 1048576.0, p.total / 1048576.0, p.completed_files,
                    p.total_files, p.speed / 1048576.0, (long long)(p.eta_ms / 1000));
        if (p.phase >= EXO_DOWNLOAD_COMPLETED)
            break;
    }
    exo_download_free(d);
    int status = 0;
    if (p.phase == EXO_DOWNLOAD_FAILED) {
        fprintf(stderr, "exo download: %s\n", p.err.msg);
        status = p.err.code == EXO_ECANCELED ? 130 : 1;
    } else {
        printf("%s\n", p.dir);
    }
    exo_paths_free(&paths);
    return status;
}
