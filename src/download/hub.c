/* The Hugging Face hub client (see hub.h): libcurl for the transfers,
 * OpenSSL's EVP digests for the hashes, jansson for the listings.
 *
 * One attempt of a fetch is one GET with "Range: bytes=<partial length>-".
 * The server's answer decides what the bytes mean: 206 appends to the
 * partial file; 200 means it ignored the range, so the partial file starts
 * over; anything else is an error whose body is kept (a few KiB, for the
 * message) and never written to the file. Hashing runs in the write path,
 * so a resumed file hashes its old bytes first (one read of the partial). */
#include "download/hub.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ERROR_BODY_MAX 4096
#define RATE_LIMIT_CAP_S 300
#define WRITEBACK_STEP   ((int64_t)32 << 20)
#define WRITE_CHUNK      ((size_t)1 << 20)
#define FLUSH_NS         250000000ull
#define URL_MAX          4096
#define TREE_FILES_MAX   100000 /* of a repository, over all its listing's pages */
#define TREE_PAGES_MAX   1000   /* a hub that keeps naming a next page (empty ones too) stops here */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static int env_int(const char *name, int dflt, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        EXO_LOG_WARN("hub: ignoring %s=%s (expected %d..%d)", name, v, lo, hi);
        return dflt;
    }
    return (int)x;
}

static void read_token_file(exo_hub_opts *o)
{
    char path[1024];
    const char *hf_home = getenv("HF_HOME"), *home = getenv("HOME");
    if (hf_home && *hf_home)
        snprintf(path, sizeof path, "%s/token", hf_home);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/.cache/huggingface/token", home);
    else
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (fgets(o->token, sizeof o->token, f))
        o->token[strcspn(o->token, "\r\n \t")] = 0;
    fclose(f);
}

void exo_hub_opts_from_env(exo_hub_opts *o)
{
    memset(o, 0, sizeof *o);
    const char *ep = getenv("HF_ENDPOINT");
    snprintf(o->endpoint, sizeof o->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    for (size_t n = strlen(o->endpoint); n && o->endpoint[n - 1] == '/'; n--)
        o->endpoint[n - 1] = 0;
    snprintf(o->revision, sizeof o->revision, "main");
    const char *tok = getenv("HF_TOKEN");
    if (tok && *tok)
        snprintf(o->token, sizeof o->token, "%s", tok);
    else
        read_token_file(o);
    const char *off = getenv("HF_HUB_OFFLINE");
    o->offline = off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes"));
    o->attempts = env_int("EXO_DOWNLOAD_ATTEMPTS", 5, 1, 100);
    o->backoff_ms = env_int("EXO_DOWNLOAD_BACKOFF_MS", 1000, 0, 600000);
    o->stall_s = env_int("EXO_DOWNLOAD_STALL_S", 30, 1, 3600);
    o->connect_timeout_s = 10;
    o->api_timeout_s = 30;
}

/* ---- listings ---------------------------------------------------------------- */

void exo_hub_file_list_free(exo_hub_file_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        exo_free(l->v[i].path);
    exo_free(l->v);
    l->v = NULL;
    l->n = 0;
}

bool exo_hub_path_safe(const char *p)
{
    if (!*p || *p == '/' || strlen(p) > 1024)
        return false;
    for (const char *s = p;; s++) {
        const char *seg = s;
        while (*s && *s != '/') {
            if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == '\\')
                return false;
            s++;
        }
        size_t n = (size_t)(s - seg);
        if (!n || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        if (!*s)
            return true;
    }
}

static bool all_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int exo_hub_parse_tree(const char *json, size_t len, exo_hub_file_list *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return exo_err_set(err, EXO_EFORMAT, "file list: %s", je.text);
    int rc = 0;
    if (!json_is_array(root)) {
        rc = exo_err_set(err, EXO_EFORMAT, "file list: not a JSON array");
        goto done;
    }
    size_t n = json_array_size(root);
    if (n > TREE_FILES_MAX) {
        rc = exo_err_set(err, EXO_ETOOBIG, "file list: %zu entries", n);
        goto done;
    }
    out->v = n ? exo_calloc(n, sizeof *out->v) : NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(root, i);
        const char *type = json_string_value(json_object_get(e, "type"));
        if (!json_is_object(e) || !type) {
            rc = exo_err_set(err, EXO_EFORMAT, "file list: entry %zu is not an object with a type", i);
            goto done;
        }
        if (strcmp(type, "file"))
            continue; /* directories */
        const char *path = json_string_value(json_object_get(e, "path"));
        json_t *size = json_object_get(e, "size"), *lfs = json_object_get(e, "lfs");
        if (!path || !exo_hub_path_safe(path)) {
            rc = exo_err_set(err, EXO_EFORMAT, "file list: entry %zu has an unsafe or missing path", i);
            goto done;
        }
        exo_hub_file *f = &out->v[out->n];
        if (lfs && !json_is_null(lfs)) {
            const char *oid = json_string_value(json_object_get(lfs, "oid"));
            json_t *lsize = json_object_get(lfs, "size");
            if (!json_is_object(lfs) || !oid || !all_hex(oid, 64) || !json_is_integer(lsize)) {
                rc = exo_err_set(err, EXO_EFORMAT, "file list: %s: bad lfs metadata", path);
                goto done;
            }
            memcpy(f->sha256, oid, 65);
            size = lsize;
        } else {
            const char *oid = json_string_value(json_object_get(e, "oid"));
            if (oid && all_hex(oid, 40))
                memcpy(f->git_oid, oid, 41);
        }
        if (!json_is_integer(size) || json_integer_value(size) < 0) {
            rc = exo_err_set(err, EXO_EFORMAT, "file list: %s: bad size", path);
            goto done;
        }
        f->size = json_integer_value(size);
        f->path = exo_strdup(path);
        out->n++;
    }
done:
    json_decref(root);
    if (rc)
        exo_hub_file_list_free(out);
    return rc;
}

/* ---- requests ---------------------------------------------------------------- */

/* What one HTTP exchange gave: the status, the headers a retry needs, and
 * for an error its body (for the message). */
typedef struct exchange {
    long   status;
    char   retry_after[64], ratelimit[128];
    char   link[URL_MAX + 64]; /* a listing's next page; link_cut: longer than that */
    bool   link_cut;
    char   error_body[ERROR_BODY_MAX];
    size_t error_len;
} exchange;

static void trim_copy(char *dst, size_t cap, const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static size_t on_header(char *line, size_t size, size_t n, void *ud)
{
    exchange *x = ud;
    size_t len = size * n;
    if (len >= 5 && !strncmp(line, "HTTP/", 5)) { /* a new response (after a redirect) */
        x->retry_after[0] = x->ratelimit[0] = x->link[0] = 0;
        x->link_cut = false;
        x->status = 0;
        return len;
    }
    const char *colon = memchr(line, ':', len);
    if (!colon)
        return len;
    size_t name = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - name - 1;
    if (name == 11 && !strncasecmp(line, "retry-after", 11))
        trim_copy(x->retry_after, sizeof x->retry_after, v, vlen);
    else if (name == 9 && !strncasecmp(line, "ratelimit", 9))
        trim_copy(x->ratelimit, sizeof x->ratelimit, v, vlen);
    else if (name == 4 && !strncasecmp(line, "link", 4)) {
        trim_copy(x->link, sizeof x->link, v, vlen);
        x->link_cut = strlen(x->link) + 1 == sizeof x->link;
    }
    return len;
}

/* Whether a space-separated list of relation types holds "next". */
static bool rel_has_next(const char *v, size_t n)
{
    for (size_t i = 0; i < n;) {
        while (i < n && v[i] == ' ')
            i++;
        size_t w = 0;
        while (i + w < n && v[i + w] != ' ')
            w++;
        if (w == 4 && !strncasecmp(v + i, "next", 4))
            return true;
        i += w;
    }
    return false;
}

int exo_hub_next_link(const char *link, char *url, size_t cap)
{
    /* link-value *( "," link-value ), each "<" URI ">" *( ";" name [ "=" token / quoted-string ] ) */
    const char *p = link;
    while (p && *p) {
        const char *lt = strchr(p, '<');
        if (!lt)
            return 0;
        const char *gt = strchr(lt + 1, '>');
        if (!gt)
            return -1; /* a link cut short: it may have been the next one */
        bool next = false;
        p = gt + 1;
        while (*p == ' ' || *p == ';') {
            while (*p == ' ' || *p == ';')
                p++;
            const char *name = p;
            while (*p && *p != '=' && *p != ';' && *p != ',' && *p != ' ')
                p++;
            size_t name_len = (size_t)(p - name);
            while (*p == ' ')
                p++;
            const char *v = p;
            size_t v_len = 0;
            if (*p == '=') {
                p++;
                while (*p == ' ')
                    p++;
                if (*p == '"') { /* a quoted string may hold ',' and ';' */
                    v = ++p;
                    while (*p && *p != '"')
                        p++;
                    v_len = (size_t)(p - v);
                    if (*p)
                        p++;
                } else {
                    v = p;
                    while (*p && *p != ';' && *p != ',')
                        p++;
                    v_len = (size_t)(p - v);
                }
            }
            if (name_len == 3 && !strncasecmp(name, "rel", 3) && rel_has_next(v, v_len))
                next = true;
        }
        size_t n = (size_t)(gt - lt - 1);
        if (next) {
            if (!n || n >= cap)
                return -1;
            memcpy(url, lt + 1, n);
            url[n] = 0;
            return 1;
        }
        while (*p && *p != ',') /* whatever does not parse, up to the next link-value */
            p++;
    }
    return 0;
}

int exo_hub_retry_after(const char *retry_after, const char *ratelimit)
{
    if (retry_after && *retry_after) {
        char *end;
        long s = strtol(retry_after, &end, 10);
        if (end != retry_after && !*end && s >= 0)
            return s > RATE_LIMIT_CAP_S ? RATE_LIMIT_CAP_S : (int)s;
    }
    if (ratelimit) { /* "api";r=0;t=55 */
        for (const char *p = strstr(ratelimit, "t="); p; p = strstr(p + 1, "t=")) {
            if (p != ratelimit && p[-1] != ';' && p[-1] != ' ')
                continue;
            char *end;
            long s = strtol(p + 2, &end, 10);
            if (end != p + 2 && s >= 0)
                return s > RATE_LIMIT_CAP_S ? RATE_LIMIT_CAP_S : (int)s;
        }
    }
    return -1;
}

static CURL *new_handle(const exo_hub_opts *o, struct curl_slist **headers, exchange *x)
{
    pthread_once(&curl_once, curl_init_once);
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    *headers = NULL;
    if (o->token[0]) {
        char h[600];
        snprintf(h, sizeof h, "Authorization: Bearer %s", o->token);
        /* curl drops it when a redirect leaves the host (the CDN needs none) */
        *headers = curl_slist_append(*headers, h);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *headers);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "exo-c/0.1 (libcurl)");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)o->connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)o->stall_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, ""); /* listings compress well; files are sent as is */
    return c;
}

static bool build_url(const exo_hub_opts *o, CURL *c, const char *model_id, const char *path, bool tree,
                      char *url, size_t cap)
{
    size_t n = (size_t)snprintf(url, cap, "%s/", o->endpoint);
    if (tree)
        n += (size_t)snprintf(url + n, n < cap ? cap - n : 0, "api/models/");
    n += (size_t)snprintf(url + n, n < cap ? cap - n : 0, "%s/%s/%s", model_id, tree ? "tree" : "resolve",
                          o->revision);
    if (tree) {
        n += (size_t)snprintf(url + n, n < cap ? cap - n : 0, "?recursive=true");
        return n < cap;
    }
    /* each segment percent-encoded: names may hold spaces, '#', '?' */
    for (const char *s = path; *s;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char *enc = curl_easy_escape(c, s, (int)len);
        if (!enc)
            return false;
        n += (size_t)snprintf(url + n, n < cap ? cap - n : 0, "/%s", enc);
        curl_free(enc);
        s += len + (e != NULL);
    }
    return n < cap;
}

/* The message for a failed exchange, and whether to try again. */
static int classify(const exo_hub_opts *o, CURLcode cc, const exchange *x, const char *what, const char *model_id,
                    bool *retry, int *wait_s, exo_err *err)
{
    *retry = false;
    *wait_s = -1;
    if (cc == CURLE_ABORTED_BY_CALLBACK)
        return exo_err_set(err, EXO_ECANCELED, "%s: cancelled", what);
    if (cc != CURLE_OK && cc != CURLE_WRITE_ERROR) {
        *retry = true;
        int code = cc == CURLE_OPERATION_TIMEDOUT ? EXO_ETIMEDOUT : EXO_EIO;
        return exo_err_set(err, code, "%s: %s%s", what, curl_easy_strerror(cc),
                           cc == CURLE_OPERATION_TIMEDOUT ? " (the transfer stalled)" : "");
    }
    long s = x->status;
    if (s == 401)
        return exo_err_set(err, EXO_EPERM,
                           "%s: 401 unauthorized: %s needs a Hugging Face token (set HF_TOKEN) or the token is invalid",
                           what, model_id);
    if (s == 403)
        return exo_err_set(err, EXO_EPERM,
                           "%s: 403 forbidden: the token has no access to %s (a gated model: accept its licence on the hub)",
                           what, model_id);
    if (s == 404)
        return exo_err_set(err, EXO_ENOENT, "%s: 404 not found on %s (is the model id right?)", what,
                           o->endpoint);
    if (s == 429) {
        *retry = true;
        *wait_s = exo_hub_retry_after(x->retry_after, x->ratelimit);
        return exo_err_set(err, EXO_EBUSY, "%s: 429 rate limited by %s", what, o->endpoint);
    }
    *retry = s >= 500 || s == 408 || s == 416;
    return exo_err_set(err, EXO_EIO, "%s: HTTP %ld%s%.*s", what, s, x->error_len ? ": " : "",
                       (int)(x->error_len > 200 ? 200 : x->error_len), x->error_body);
}

static bool cancelled(const exo_hub_opts *o) { return o->cancel && *o->cancel; }

/* Sleeps ms, waking every 100 ms to ask whether to go on. */
static bool wait_ms(const exo_hub_opts *o, int64_t ms, exo_hub_progress_fn progress, void *ctx)
{
    while (ms > 0) {
        int64_t step = ms < 100 ? ms : 100;
        struct timespec ts = {0, (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
        if ((progress && !progress(ctx, 0)) || cancelled(o))
            return false;
    }
    return true;
}

static int on_small_xfer(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    return cancelled(ud);
}

static int64_t backoff_for(const exo_hub_opts *o, int attempt, int wait_s)
{
    if (wait_s >= 0)
        return (int64_t)wait_s * 1000;
    int64_t ms = (int64_t)o->backoff_ms << (attempt < 10 ? attempt : 10);
    return ms + (o->backoff_ms ? rand() % (o->backoff_ms + 1) : 0);
}

/* ---- small files --------------------------------------------------------------- */

typedef struct membuf {
    exchange *x;
    CURL     *c;
    char     *data;
    size_t    len, cap, max;
    bool      too_big;
} membuf;

static size_t on_mem(char *p, size_t size, size_t n, void *ud)
{
    membuf *m = ud;
    size_t len = size * n;
    if (!m->x->status)
        curl_easy_getinfo(m->c, CURLINFO_RESPONSE_CODE, &m->x->status);
    if (m->x->status != 200) {
        size_t room = sizeof m->x->error_body - 1 - m->x->error_len;
        size_t k = len < room ? len : room;
        memcpy(m->x->error_body + m->x->error_len, p, k);
        m->x->error_len += k;
        return len;
    }
    if (m->len + len > m->max) {
        m->too_big = true;
        return 0;
    }
    if (m->len + len + 1 > m->cap) {
        m->cap = (m->len + len + 1) * 2;
        m->data = exo_realloc(m->data, m->cap);
    }
    memcpy(m->data + m->len, p, len);
    m->len += len;
    return len;
}

/* One small GET into memory, retried: of page_url where given (a
 * listing's next page, a search), else of what build_url makes. With next,
 * the URL of the page after it, as its Link header names it ("": none). */
static int get_small(const exo_hub_opts *o, const char *model_id, const char *path, bool tree, const char *page_url,
                     size_t max, char **body, size_t *len, char next[URL_MAX], exo_err *err)
{
    *body = NULL;
    *len = 0;
    char what[1200];
    snprintf(what, sizeof what, "%s %s", model_id, tree ? "file list" : path);
    if (o->offline)
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s: offline mode (HF_HUB_OFFLINE): not fetched", what);
    int rc = 0;
    for (int attempt = 0; attempt < o->attempts; attempt++) {
        exchange x = {0};
        struct curl_slist *h;
        CURL *c = new_handle(o, &h, &x);
        if (!c)
            return exo_err_set(err, EXO_ENOMEM, "%s: curl_easy_init failed", what);
        char url[URL_MAX];
        if (page_url)
            snprintf(url, sizeof url, "%s", page_url);
        else if (!build_url(o, c, model_id, path, tree, url, sizeof url)) {
            curl_easy_cleanup(c);
            curl_slist_free_all(h);
            return exo_err_set(err, EXO_EINVAL, "%s: URL too long", what);
        }
        membuf m = {&x, c, NULL, 0, 0, max, false};
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_mem);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &m);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)o->api_timeout_s);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_small_xfer);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)o);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        CURLcode cc = curl_easy_perform(c);
        if (!x.status)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x.status);
        curl_easy_cleanup(c);
        curl_slist_free_all(h);
        if (m.too_big) {
            exo_free(m.data);
            return exo_err_set(err, EXO_ETOOBIG, "%s: larger than %zu bytes", what, max);
        }
        if (cc == CURLE_OK && x.status == 200) {
            if (next) {
                next[0] = 0;
                if (x.link_cut || exo_hub_next_link(x.link, next, URL_MAX) < 0) {
                    exo_free(m.data);
                    return exo_err_set(err, EXO_EFORMAT, "%s: a Link header that names no usable next page", what);
                }
            }
            if (!m.data)
                m.data = exo_malloc(1);
            m.data[m.len] = 0;
            *body = m.data;
            *len = m.len;
            return 0;
        }
        exo_free(m.data);
        bool retry;
        int wait_s;
        rc = classify(o, cc, &x, what, model_id, &retry, &wait_s, err);
        if (!retry || attempt + 1 == o->attempts)
            break;
        EXO_LOG_WARN("hub: %s (retrying)", err->msg);
        if (!wait_ms(o, backoff_for(o, attempt, wait_s), NULL, NULL))
            return exo_err_set(err, EXO_ECANCELED, "%s: cancelled", what);
    }
    return rc;
}

/* The hub lists a tree in pages (1000 entries on huggingface.co), each
 * naming the next in a Link header, which is followed only within the
 * endpoint: the token goes with every page, and a listing that sent it
 * elsewhere would hand it to whoever is there. */
int exo_hub_list_files(const exo_hub_opts *o, const char *model_id, exo_hub_file_list *out, exo_err *err)
{
    memset(out, 0, sizeof *out);
    char next[URL_MAX] = "";
    const size_t origin = strlen(o->endpoint);
    int rc = 0;
    for (int page = 0;; page++) {
        char *body;
        size_t len;
        char *page_url = page ? exo_strdup(next) : NULL;
        rc = get_small(o, model_id, NULL, true, page_url, 64u << 20, &body, &len, next, err);
        exo_free(page_url);
        if (rc)
            break;
        exo_hub_file_list l;
        rc = exo_hub_parse_tree(body, len, &l, err);
        exo_free(body);
        if (rc) {
            exo_err_wrap(err, "%s", model_id);
            break;
        }
        if (out->n + l.n > TREE_FILES_MAX) {
            exo_hub_file_list_free(&l);
            rc = exo_err_set(err, EXO_ETOOBIG, "%s: file list: more than %d files", model_id, TREE_FILES_MAX);
            break;
        }
        if (l.n) {
            out->v = exo_realloc(out->v, (out->n + l.n) * sizeof *out->v);
            memcpy(out->v + out->n, l.v, l.n * sizeof *l.v);
            out->n += l.n;
        }
        exo_free(l.v); /* its paths now belong to out */
        if (!next[0])
            break;
        if (strncmp(next, o->endpoint, origin) || next[origin] != '/') {
            rc = exo_err_set(err, EXO_EFORMAT, "%s: file list: the next page is outside %s (%.200s): not followed",
                             model_id, o->endpoint, next);
            break;
        }
        if (page + 1 == TREE_PAGES_MAX) {
            rc = exo_err_set(err, EXO_ETOOBIG, "%s: file list: more than %d pages", model_id, TREE_PAGES_MAX);
            break;
        }
    }
    if (rc)
        exo_hub_file_list_free(out);
    return rc;
}

/* One model of a search answer, in the fields exo's /models/search gives;
 * NULL for an entry without an id (skipped, as the hub never sends one). */
static json_t *search_entry(json_t *e)
{
    const char *id = json_string_value(json_object_get(e, "id"));
    if (!id || !*id)
        return NULL;
    const char *author = json_string_value(json_object_get(e, "author"));
    const char *slash = strchr(id, '/');
    json_t *out = json_object();
    json_object_set_new(out, "id", json_string(id));
    if (author)
        json_object_set_new(out, "author", json_string(author));
    else if (slash)
        json_object_set_new(out, "author", json_stringn(id, (size_t)(slash - id)));
    else
        json_object_set_new(out, "author", json_null());
    json_t *n = json_object_get(e, "downloads");
    json_object_set_new(out, "downloads", json_integer(json_is_integer(n) ? json_integer_value(n) : 0));
    n = json_object_get(e, "likes");
    json_object_set_new(out, "likes", json_integer(json_is_integer(n) ? json_integer_value(n) : 0));
    const char *when = json_string_value(json_object_get(e, "lastModified"));
    json_object_set_new(out, "last_modified", when ? json_string(when) : json_null());
    json_t *tags = json_array(), *t = json_object_get(e, "tags");
    for (size_t i = 0; json_is_array(t) && i < json_array_size(t) && i < 64; i++) {
        const char *tag = json_string_value(json_array_get(t, i));
        if (tag)
            json_array_append_new(tags, json_string(tag));
    }
    json_object_set_new(out, "tags", tags);
    return out;
}

int exo_hub_parse_search(const char *json, size_t len, int limit, json_t **out, exo_err *err)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return exo_err_set(err, EXO_EFORMAT, "model search: %s", je.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return exo_err_set(err, EXO_EFORMAT, "model search: not a JSON array");
    }
    json_t *models = json_array();
    for (size_t i = 0; i < json_array_size(root) && json_array_size(models) < (size_t)limit; i++) {
        json_t *m = search_entry(json_array_get(root, i));
        if (m)
            json_array_append_new(models, m);
    }
    json_decref(root);
    *out = models;
    return 0;
}

int exo_hub_search(const exo_hub_opts *o, const char *query, const char *author, int limit, json_t **out,
                   exo_err *err)
{
    *out = NULL;
    if (limit < 1 || limit > EXO_HUB_SEARCH_MAX)
        return exo_err_set(err, EXO_EINVAL, "model search: limit must be 1..%d", EXO_HUB_SEARCH_MAX);
    pthread_once(&curl_once, curl_init_once);
    CURL *c = curl_easy_init();
    if (!c)
        return exo_err_set(err, EXO_ENOMEM, "model search: curl_easy_init failed");
    char *q = curl_easy_escape(c, query, 0), *a = curl_easy_escape(c, author ? author : "", 0);
    char url[URL_MAX];
    int n = q && a ? snprintf(url, sizeof url, "%s/api/models?search=%s%s%s&sort=downloads&direction=-1&limit=%d",
                              o->endpoint, q, *a ? "&author=" : "", a, limit)
                   : -1;
    curl_free(q);
    curl_free(a);
    curl_easy_cleanup(c);
    if (n < 0 || (size_t)n >= sizeof url)
        return exo_err_set(err, EXO_EINVAL, "model search: query too long");
    char *body;
    size_t len;
    int rc = get_small(o, "model search", query, false, url, 8u << 20, &body, &len, NULL, err);
    if (rc)
        return rc;
    rc = exo_hub_parse_search(body, len, limit, out, err);
    exo_free(body);
    return rc;
}

int exo_hub_get_file(const exo_hub_opts *o, const char *model_id, const char *path, size_t max_bytes,
                     char **body, size_t *len, exo_err *err)
{
    if (!exo_hub_path_safe(path))
        return exo_err_set(err, EXO_EINVAL, "unsafe path '%s'", path);
    return get_small(o, model_id, path, false, NULL, max_bytes, body, len, NULL, err);
}

/* ---- big files ------------------------------------------------------------------ */

typedef struct fetch {
    exchange           *x;
    CURL               *c;
    int                 fd;
    EVP_MD_CTX         *md;
    const exo_hub_file *f;
    int64_t             have;       /* bytes in the partial file (and hashed) */
    int64_t             flushed;    /* writeback started up to here */
    char               *wbuf;       /* curl hands over 16 KiB at a time: */
    size_t              wlen;       /* written in WRITE_CHUNK pieces, */
    uint64_t            flushed_ns; /* or after FLUSH_NS (slow transfers) */
    bool                decided;    /* the response's meaning is known */
    bool                writing;    /* 200/206: the body goes to the file */
    int                 write_errno;
    exo_hub_progress_fn progress;
    void               *ctx;
    bool                cancelled;
    const exo_hub_opts *o;
} fetch;

static void md_restart(fetch *t)
{
    EVP_DigestInit_ex(t->md, t->f->sha256[0] ? EVP_sha256() : EVP_sha1(), NULL);
    if (!t->f->sha256[0]) { /* git hashes the blob header first */
        char hdr[40];
        int n = snprintf(hdr, sizeof hdr, "blob %lld", (long long)t->f->size);
        EVP_DigestUpdate(t->md, hdr, (size_t)n + 1);
    }
}

static bool write_all(fetch *t, const char *p, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t w = write(t->fd, p + off, len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            t->write_errno = errno;
            return false;
        }
        off += (size_t)w;
    }
    return true;
}

static bool flush_buf(fetch *t)
{
    bool ok = write_all(t, t->wbuf, t->wlen);
    t->wlen = 0;
    t->flushed_ns = exo_clock_ns();
    return ok;
}

static size_t on_file(char *p, size_t size, size_t n, void *ud)
{
    fetch *t = ud;
    size_t len = size * n;
    if (!t->decided) {
        t->decided = true;
        curl_easy_getinfo(t->c, CURLINFO_RESPONSE_CODE, &t->x->status);
        if (t->x->status == 200 && t->have > 0) { /* the range was ignored: start over */
            t->wlen = 0;
            if (ftruncate(t->fd, 0) || lseek(t->fd, 0, SEEK_SET)) {
                t->write_errno = errno;
                return 0;
            }
            if (t->progress)
                t->progress(t->ctx, -t->have);
            t->have = t->flushed = 0;
            md_restart(t);
        }
        t->writing = t->x->status == 200 || t->x->status == 206;
    }
    if (!t->writing) {
        exchange *x = t->x;
        size_t room = sizeof x->error_body - 1 - x->error_len;
        size_t k = len < room ? len : room;
        memcpy(x->error_body + x->error_len, p, k);
        x->error_len += k;
        return len;
    }
    if (t->have + (int64_t)len > t->f->size) /* more than the listing said: not this file */
        return 0;
    if (t->wlen + len > WRITE_CHUNK && !flush_buf(t))
        return 0;
    if (len >= WRITE_CHUNK) {
        if (!write_all(t, p, len))
            return 0;
    } else {
        memcpy(t->wbuf + t->wlen, p, len);
        t->wlen += len;
        /* a slow transfer still reaches the disk often: a crash loses little */
        if (exo_clock_ns() - t->flushed_ns >= FLUSH_NS && !flush_buf(t))
            return 0;
    }
    EVP_DigestUpdate(t->md, p, len);
    t->have += (int64_t)len;
    /* start the disk writes as the bytes come, so the fsync before the
     * rename waits for the tail only, not for the whole file */
    if (t->have - t->flushed >= WRITEBACK_STEP) {
        sync_file_range(t->fd, t->flushed, t->have - t->flushed, SYNC_FILE_RANGE_WRITE);
        t->flushed = t->have;
    }
    if (t->progress && !t->progress(t->ctx, (int64_t)len)) {
        t->cancelled = true;
        return 0;
    }
    return len;
}

static int on_xfer(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    fetch *t = ud;
    if ((t->progress && !t->progress(t->ctx, 0)) || cancelled(t->o)) {
        t->cancelled = true;
        return 1;
    }
    return 0;
}

/* Hashes the bytes already in the partial file. */
static int hash_existing(fetch *t, const char *partial, exo_err *err)
{
    char *buf = exo_malloc(1 << 20);
    int64_t left = t->have;
    lseek(t->fd, 0, SEEK_SET);
    while (left > 0) {
        ssize_t r = read(t->fd, buf, left < (1 << 20) ? (size_t)left : (1 << 20));
        if (r <= 0) {
            exo_free(buf);
            return exo_err_set(err, EXO_EIO, "%s: read: %s", partial, r ? strerror(errno) : "short");
        }
        EVP_DigestUpdate(t->md, buf, (size_t)r);
        left -= r;
    }
    exo_free(buf);
    return 0;
}

static void fsync_dir_of(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return;
    *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Opens and locks the partial file: two downloads of one model into one
 * dir (two CLIs, or the CLI beside the daemon) take turns per file instead
 * of writing one file together. The winner publishes the file by renaming
 * the partial (under the lock); a waiter then finds the file in place
 * (*fd = -1, done), or holds an inode that is no longer the partial and
 * opens it again. */
static int lock_partial(const exo_hub_opts *o, const exo_hub_file *f, const char *dest, const char *partial,
                        exo_hub_progress_fn progress, void *ctx, int *fd_out, exo_err *err)
{
    *fd_out = -1;
    for (;;) {
        int fd = open(partial, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "%s: %s", partial, strerror(errno));
        while (flock(fd, LOCK_EX | LOCK_NB)) {
            if (errno != EWOULDBLOCK && errno != EINTR) {
                close(fd);
                return exo_err_set(err, EXO_EIO, "%s: lock: %s", partial, strerror(errno));
            }
            if (!wait_ms(o, 100, progress, ctx)) {
                close(fd);
                return exo_err_set(err, EXO_ECANCELED, "%s: cancelled", f->path);
            }
        }
        struct stat held, named;
        if (!stat(dest, &named) && S_ISREG(named.st_mode) && named.st_size == f->size) {
            close(fd);
            return 0;
        }
        if (!fstat(fd, &held) && !stat(partial, &named) && held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
            *fd_out = fd;
            return 0;
        }
        close(fd);
    }
}

/* One attempt. *retry says whether another may help. */
static int fetch_once(const exo_hub_opts *o, const char *model_id, const exo_hub_file *f, const char *dest,
                      const char *partial, exo_hub_progress_fn progress, void *ctx, bool *retry, int *wait_s,
                      exo_err *err)
{
    *retry = false;
    *wait_s = -1;
    int fd;
    int rc = lock_partial(o, f, dest, partial, progress, ctx, &fd, err);
    if (rc || fd < 0)
        return rc; /* fd < 0: another process published the file meanwhile */
    struct stat sb;
    fstat(fd, &sb);
    exchange x = {0};
    fetch t = {.x = &x, .fd = fd, .f = f, .have = sb.st_size, .progress = progress, .ctx = ctx, .o = o};
    t.md = EVP_MD_CTX_new();
    t.wbuf = exo_malloc(WRITE_CHUNK);
    t.flushed_ns = exo_clock_ns();
    md_restart(&t);
    if (t.have > f->size) { /* not a prefix of this file */
        if (ftruncate(fd, 0))
            rc = exo_err_set(err, EXO_EIO, "%s: truncate: %s", partial, strerror(errno));
        if (progress)
            progress(ctx, -t.have);
        t.have = 0;
    } else if (t.have > 0) {
        rc = hash_existing(&t, partial, err);
    }
    lseek(fd, t.have, SEEK_SET);
    t.flushed = t.have;
    if (!rc && t.have < f->size) {
        struct curl_slist *h = NULL;
        CURL *c = new_handle(o, &h, &x);
        char url[4096];
        if (!c || !build_url(o, c, model_id, f->path, false, url, sizeof url)) {
            rc = exo_err_set(err, EXO_EINVAL, "%s: cannot build the URL", f->path);
        } else {
            t.c = c;
            char range[64];
            snprintf(range, sizeof range, "%lld-", (long long)t.have);
            curl_easy_setopt(c, CURLOPT_URL, url);
            if (t.have > 0)
                curl_easy_setopt(c, CURLOPT_RANGE, range);
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_file);
            curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
            curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xfer);
            curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
            curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
            curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
            char what[1200];
            snprintf(what, sizeof what, "%s: %s", model_id, f->path);
            CURLcode cc = curl_easy_perform(c);
            if (!x.status)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x.status);
            /* what arrived stays in the partial file, for a resume */
            if (t.wlen && !flush_buf(&t))
                t.have = (int64_t)lseek(fd, 0, SEEK_END); /* hashed more than written: not this attempt's */
            if (t.cancelled) {
                rc = exo_err_set(err, EXO_ECANCELED, "%s: cancelled", what);
            } else if (t.write_errno) {
                rc = exo_err_set(err, t.write_errno == ENOSPC ? EXO_ENOSPC : EXO_EIO,
                                 "%s: writing %s: %s%s", what, partial, strerror(t.write_errno),
                                 t.write_errno == ENOSPC ? " (free some space; the download resumes from here)" : "");
            } else if (cc != CURLE_OK || !t.writing) {
                rc = classify(o, cc, &x, what, model_id, retry, wait_s, err);
            } else if (t.have != f->size) {
                *retry = true;
                rc = exo_err_set(err, EXO_EIO, "%s: the server sent %lld of %lld bytes", what, (long long)t.have,
                                 (long long)f->size);
            }
        }
        if (c)
            curl_easy_cleanup(c);
        curl_slist_free_all(h);
    }
    if (!rc) { /* complete: verify, persist, publish */
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        EVP_DigestFinal_ex(t.md, md, &mdlen);
        char hex[2 * EVP_MAX_MD_SIZE + 1];
        for (unsigned i = 0; i < mdlen; i++)
            snprintf(hex + 2 * i, 3, "%02x", md[i]);
        const char *want = f->sha256[0] ? f->sha256 : f->git_oid;
        if (want[0] && strcmp(hex, want)) {
            unlink(partial);
            if (progress)
                progress(ctx, -t.have);
            *retry = true;
            rc = exo_err_set(err, EXO_EIO, "%s: %s: checksum mismatch (%s %s, expected %s); the file was deleted",
                             model_id, f->path, f->sha256[0] ? "sha256" : "git sha1", hex, want);
        } else if (fsync(fd)) {
            rc = exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "%s: fsync: %s", partial, strerror(errno));
        } else if (rename(partial, dest)) {
            rc = exo_err_set(err, EXO_EIO, "rename %s: %s", partial, strerror(errno));
        } else {
            fsync_dir_of(dest);
        }
    }
    EVP_MD_CTX_free(t.md);
    exo_free(t.wbuf);
    close(fd);
    return rc;
}

static int mkdirs_for(const char *path, exo_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return exo_err_set(err, errno == ENOSPC ? EXO_ENOSPC : EXO_EIO, "mkdir %s: %s", buf, strerror(errno));
        *s = '/';
    }
    return 0;
}

int exo_hub_fetch(const exo_hub_opts *o, const char *model_id, const exo_hub_file *f, const char *dest,
                  exo_hub_progress_fn progress, void *ctx, exo_err *err)
{
    struct stat sb;
    if (!stat(dest, &sb) && S_ISREG(sb.st_mode) && sb.st_size == f->size)
        return 0; /* published files were verified before their rename */
    if (o->offline)
        return exo_err_set(err, EXO_EUNSUPPORTED, "%s: %s is not on disk and offline mode forbids fetching it",
                           model_id, f->path);
    char partial[4200];
    if ((size_t)snprintf(partial, sizeof partial, "%s.partial", dest) >= sizeof partial)
        return exo_err_set(err, EXO_EINVAL, "%s: path too long", dest);
    int rc = mkdirs_for(dest, err);
    if (rc)
        return rc;
    if (!stat(dest, &sb)) /* a file of another size: an older revision */
        unlink(dest);
    for (int attempt = 0;; attempt++) {
        bool retry;
        int wait_s;
        rc = fetch_once(o, model_id, f, dest, partial, progress, ctx, &retry, &wait_s, err);
        if (!rc || !retry || attempt + 1 >= o->attempts)
            return rc;
        int64_t ms = backoff_for(o, attempt, wait_s);
        EXO_LOG_WARN("hub: %s (attempt %d of %d; retrying in %lld ms)", err->msg, attempt + 1, o->attempts,
                     (long long)ms);
        if (!wait_ms(o, ms, progress, ctx))
            return exo_err_set(err, EXO_ECANCELED, "%s: %s: cancelled", model_id, f->path);
    }
}
