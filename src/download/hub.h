/* The Hugging Face hub, as much of it as downloads need: a repository's file
 * list, small files (config.json, the safetensors index), and big files
 * fetched to disk with resume and verification.
 *
 * Endpoints (huggingface.co, or HF_ENDPOINT):
 *   GET  {endpoint}/api/models/{id}/tree/{rev}?recursive=true   file list
 *        (in pages: each names the next in a Link header, followed
 *        within the endpoint only)
 *   GET  {endpoint}/api/models?search={query}&sort=downloads   model search
 *   GET  {endpoint}/{id}/resolve/{rev}/{path}                   file bytes
 *        (LFS files answer 302 to a CDN; followed, with Range)
 *
 * A file is fetched into "<dest>.partial", resumed from its length with a
 * Range request, hashed while it is written (SHA-256 for LFS files, the git
 * blob SHA-1 otherwise, the hub's own ids), checked for size and hash,
 * fsynced, and only then renamed to <dest>: a file under its final name is
 * always complete and verified. A wrong hash deletes the partial file.
 *
 * Failures are told apart, each with its own code and a message that says
 * what to do: 401/403 EXO_EPERM (a token is needed or lacks access; never
 * retried), 404 EXO_ENOENT (never retried), a full disk EXO_ENOSPC (never
 * retried; the partial file stays for a resume), cancel EXO_ECANCELED;
 * 429 (waits as long as Retry-After / RateLimit say, at most 300 s), 5xx,
 * dropped or stalled connections and hash mismatches are retried with
 * exponential backoff and jitter, `attempts` times in all, then reported
 * (EXO_EBUSY for rate limits, EXO_EIO otherwise).
 *
 * Offline (HF_HUB_OFFLINE=1 or --offline): every call fails at once with
 * EXO_EUNSUPPORTED and never opens a connection.
 *
 * Threading: the calls are blocking and reentrant; one handle per thread. */
#ifndef EXO_DOWNLOAD_HUB_H
#define EXO_DOWNLOAD_HUB_H

#include "core/error.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct exo_hub_opts {
    char endpoint[512];     /* no trailing '/'; default https://huggingface.co */
    char revision[64];      /* "main" */
    char token[512];        /* "" : none. HF_TOKEN, else $HF_HOME/token */
    bool offline;
    int  attempts;          /* tries per file / request, >= 1 (5) */
    int  backoff_ms;        /* first retry delay; doubles, plus jitter (1000) */
    int  stall_s;           /* abort a transfer that moved < 1 KiB/s for this long (30) */
    int  connect_timeout_s; /* (10) */
    int  api_timeout_s;     /* whole small request (30) */
    /* When set and nonzero, every call stops within ~100 ms (EXO_ECANCELED),
     * retry waits included. */
    const volatile int *cancel;
} exo_hub_opts;

/* Defaults, then the environment: HF_ENDPOINT, HF_TOKEN (else the file
 * $HF_HOME/token, HF_HOME defaulting to ~/.cache/huggingface),
 * HF_HUB_OFFLINE=1, and EXO_DOWNLOAD_ATTEMPTS / _BACKOFF_MS / _STALL_S. */
void exo_hub_opts_from_env(exo_hub_opts *o);

typedef struct exo_hub_file {
    char   *path;        /* repo-relative, '/'-separated, checked safe */
    int64_t size;
    char    sha256[65];  /* LFS files: the content's SHA-256; "" otherwise */
    char    git_oid[41]; /* non-LFS files: git blob SHA-1; "" if unknown */
} exo_hub_file;

typedef struct exo_hub_file_list {
    exo_hub_file *v;
    size_t        n;
} exo_hub_file_list;

void exo_hub_file_list_free(exo_hub_file_list *l);

/* Parses a tree listing (the JSON array the tree endpoint returns). Files
 * only; a path that is absolute, has an empty, "." or ".." segment, a
 * backslash or a control character makes the whole listing EXO_EFORMAT
 * (a hub that sends one is not trusted with the others). */
int exo_hub_parse_tree(const char *json, size_t len, exo_hub_file_list *out, exo_err *err);

/* A path that is safe to join under a model directory (the rule above). */
bool exo_hub_path_safe(const char *path);

/* The file list of a model repository. */
int exo_hub_list_files(const exo_hub_opts *o, const char *model_id, exo_hub_file_list *out,
                       exo_err *err);

/* A small file of a repository into memory (*body NUL-terminated, exo_free);
 * EXO_ETOOBIG past max_bytes. */
int exo_hub_get_file(const exo_hub_opts *o, const char *model_id, const char *path, size_t max_bytes,
                     char **body, size_t *len, exo_err *err);

/* Called as bytes arrive (delta may be negative when a partial file is found
 * bad and restarted) and while waiting to retry (delta 0); returning false
 * cancels. */
typedef bool (*exo_hub_progress_fn)(void *ctx, int64_t delta);

/* Fetches f into dest (see the top of this file). If dest exists with f's
 * size it is taken as is. */
int exo_hub_fetch(const exo_hub_opts *o, const char *model_id, const exo_hub_file *f, const char *dest,
                  exo_hub_progress_fn progress, void *ctx, exo_err *err);

/* Models of the hub whose names match query (its /api/models?search=),
 * most downloaded first, at most limit (1..EXO_HUB_SEARCH_MAX), of author
 * (an organisation) unless it is NULL or "": *out a JSON array of {id,
 * author, downloads, likes, last_modified, tags} (json_decref). */
#define EXO_HUB_SEARCH_MAX 100
int exo_hub_search(const exo_hub_opts *o, const char *query, const char *author, int limit, json_t **out,
                   exo_err *err);

/* The answer of the search endpoint into that array; entries without an
 * id are skipped, missing counts are 0. Exposed for tests and fuzzing. */
int exo_hub_parse_search(const char *json, size_t len, int limit, json_t **out, exo_err *err);

/* The seconds a 429 asks to wait: Retry-After (seconds) or the hub's
 * RateLimit header ("...;t=<seconds>"); -1 if neither parses. Exposed for
 * tests. */
int exo_hub_retry_after(const char *retry_after, const char *ratelimit);

/* The URL of the link whose relation types include "next" in a Link header
 * (RFC 8288: `<url>; rel="next", <url2>; rel="last"`) into url: 1; 0 if
 * there is none; -1 if it is empty or does not fit in cap, or a link is
 * cut short (so a listing is never taken as ended when it may go on).
 * Exposed for tests. */
int exo_hub_next_link(const char *link, char *url, size_t cap);

#endif
