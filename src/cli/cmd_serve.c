/* `exo` / `exo serve`: the node daemon. Resolves its directories, takes the
 * data dir's pid-file lock, starts the node (master + worker + event log)
 * and the HTTP API, then waits for SIGINT/SIGTERM. The first signal shuts
 * down cleanly (open generations end with an error, runners exit, the
 * event log is archived); a second one exits at once.
 *
 * Signals are blocked in every thread and taken synchronously with
 * sigwait in the main thread, so no handler runs inside library code. */
#include "api/server.h"
#include "cli/args.h"
#include "cluster/node.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/meminfo.h"
#include "core/paths.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/resource.h>
#include <unistd.h>

#define DEFAULT_API_PORT 52415
#define MAX_MODELS_DIRS  64

int exo_cmd_serve(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: exo [serve] [options]\n"
            "  --api-port N        HTTP API port (default 52415; 0: any free port)\n"
            "  --host ADDR         bind address (default all interfaces)\n"
            "  --api-key KEY       every API and dashboard route needs KEY (Bearer or x-api-key;\n"
            "                      the dashboard asks for it); prefer EXO_API_KEY, which ps cannot show\n"
            "  --models-dir DIR    a models directory (repeatable; also EXO_MODELS_DIRS,\n"
            "                      EXO_MODELS_READ_ONLY_DIRS); models live in DIR/<org>--<name>/\n"
            "  --data-dir DIR      event log, node id and pid file (default XDG data dir)\n"
            "  --no-worker         do not run models on this node\n"
            "  --no-api            do not serve the HTTP API\n"
            "  --threads N         threads per runner (default: all CPUs)\n"
            "  --ctx N             KV cache tokens per runner (default: the model's, at most 4096)\n"
            "  --warmup-tokens N   tokens generated to warm a runner up (default 4)\n"
            "  --no-batch          a runner generates one request at a time (default: up to 8 side\n"
            "                      by side, each step one batch; also EXO_BATCH=N, 1 to 64)\n"
            "  --kv-budget SIZE    memory a runner's KV caches may take, as 512M or 4G (default:\n"
            "                      half of what is free once the model is loaded); requests past\n"
            "                      it queue\n"
            "  --kv-cache f32|bf16 the KV caches' values, on the CPU and the GPU (default f32; also\n"
            "                      EXO_KV_CACHE): bf16 takes half the memory, rounding keys and values\n"
            "  --offline           never download: use only models on disk (also HF_HUB_OFFLINE=1)\n"
            "  --place MODEL_ID    place MODEL_ID at start, unless an instance of it runs already\n"
            "                      (scripts/run.sh does, for the model that ships with exo)\n"
            "cluster (nodes of one namespace on a LAN find each other with no flags):\n"
            "  --namespace NAME    cluster namespace (default \"exo\"; also EXO_NAMESPACE): nodes of\n"
            "                      other namespaces are ignored\n"
            "  --cluster-secret S  shared secret that keys the links (also EXO_CLUSTER_SECRET): nodes\n"
            "                      without it cannot join, read or inject anything\n"
            "  --bootstrap-peers H:P,...  peers to dial where multicast is blocked (also\n"
            "                      EXO_BOOTSTRAP_PEERS)\n"
            "  --cluster-port N    TCP port for node links (default 52414, any free port if taken;\n"
            "                      0: any)\n"
            "  --discovery-port N  UDP port of the multicast announcements (default 52413)\n"
            "  --no-discovery      no multicast: bootstrap peers only\n"
            "  -m, --force-master  this node wins every election\n"
            "  -v, -q              more / less logging\n");
}

/* Many SSE clients mean many sockets: raise the soft limit to the hard
 * one (exo asks for at least 65535). */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl))
            EXO_LOG_WARN("cannot raise the open-file limit to %llu", (unsigned long long)rl.rlim_max);
    }
}

/* The built dashboard: EXO_DASHBOARD_DIR (as exo), else dashboard/dist of
 * the source tree the binary was built in (<repo>/build/exo). */
static char *find_dashboard(void)
{
    const char *env = getenv("EXO_DASHBOARD_DIR");
    char path[PATH_MAX + 64];
    if (env && *env) {
        snprintf(path, sizeof path, "%s/index.html", env);
        if (access(path, R_OK))
            EXO_LOG_WARN("EXO_DASHBOARD_DIR=%s has no index.html", env);
        return exo_strdup(env);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = 0;
    snprintf(path, sizeof path, "%s/../dashboard/dist/index.html", exe);
    char real[PATH_MAX];
    if (!realpath(path, real))
        return NULL;
    real[strlen(real) - strlen("/index.html")] = 0;
    return exo_strdup(real);
}

/* --place: once the cluster can place it (a master elected, this node's
 * models reported), place the model, unless an instance of it runs: a
 * restarted daemon finds its instance in the State it replays. Gives up
 * after a minute, with the reason. */
typedef struct placer {
    exo_node   *node;
    const char *model_id;
    bool        stop;
} placer;

static void *place_at_start(void *arg)
{
    placer *p = arg;
    exo_err err = {0};
    for (int i = 0; i < 240 && !__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE); i++) {
        if (exo_node_serves_model(p->node, p->model_id))
            return NULL;
        exo_id cmd;
        if (exo_node_place_instance(p->node, p->model_id, EXO_SHARDING_PIPELINE,
                                    EXO_INSTANCE_META_MLX_RING, 1, NULL, &cmd, &err) == 0) {
            EXO_LOG_INFO("--place: placing %s", p->model_id);
            return NULL;
        }
        usleep(250 * 1000);
    }
    if (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
        EXO_LOG_WARN("--place: could not place %s: %s", p->model_id, err.msg);
    return NULL;
}

/* Limits against hostile clients, shortened by the reliability tests
 * (docs/DAEMON.md, "Limits"); unset or invalid: the built-in defaults. */
static void http_limits_from_env(exo_api_server_config *ac)
{
    const char *v;
    if ((v = getenv("EXO_HTTP_HEADER_TIMEOUT_S")) && atof(v) > 0)
        ac->header_timeout_s = atof(v);
    if ((v = getenv("EXO_HTTP_BODY_TIMEOUT_S")) && atof(v) > 0)
        ac->body_timeout_s = atof(v);
    if ((v = getenv("EXO_HTTP_IDLE_TIMEOUT_S")) && atof(v) > 0)
        ac->idle_timeout_s = atof(v);
    if ((v = getenv("EXO_HTTP_MAX_PER_CLIENT")) && atoi(v) > 0)
        ac->max_per_client = (unsigned)atoi(v);
    if ((v = getenv("EXO_HTTP_MEMORY_MB")) && atoi(v) > 0)
        ac->memory_budget = (size_t)atoi(v) << 20;
    if ((v = getenv("EXO_HTTP_STREAM_PENDING_KB")) && atoi(v) > 0)
        ac->stream_max_pending = (size_t)atoi(v) << 10;
}

static void exit_now(int sig)
{
    static const char msg[] = "exo: second signal, exiting now\n";
    if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do: we are leaving */ }
    _exit(1);
}

int exo_cmd_serve(int argc, char **argv)
{
    long port = DEFAULT_API_PORT, threads = 0, ctx = 0, warmup = 4, cluster_port = -1, discovery_port = 0;
    const char *host = NULL, *data_dir = NULL, *place_model = NULL;
    const char *models_dirs[MAX_MODELS_DIRS];
    int n_models_dirs = 0, verbosity = 0;
    bool worker = true, api = true, discovery = true, force_master = false, offline = false;
    const char *namespace_ = getenv("EXO_NAMESPACE"), *secret = getenv("EXO_CLUSTER_SECRET");
    const char *bootstrap = getenv("EXO_BOOTSTRAP_PEERS");
    const char *api_key = getenv("EXO_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--api-port")) {
            if (!(v = exo_arg_value("serve", argc, argv, &i)) ||
                exo_arg_int("serve", a, v, 0, 65535, &port))
                return 2;
        } else if (!strcmp(a, "--host")) {
            if (!(host = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--models-dir")) {
            if (!(v = exo_arg_value("serve", argc, argv, &i)))
                return 2;
            if (n_models_dirs == MAX_MODELS_DIRS) {
                fprintf(stderr, "exo serve: at most %d --models-dir\n", MAX_MODELS_DIRS);
                return 2;
            }
            models_dirs[n_models_dirs++] = v;
        } else if (!strcmp(a, "--data-dir")) {
            if (!(data_dir = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "--ctx") || !strcmp(a, "--warmup-tokens")) {
            long *dst = a[2] == 't' ? &threads : a[2] == 'c' ? &ctx : &warmup;
            if (!(v = exo_arg_value("serve", argc, argv, &i)) ||
                exo_arg_int("serve", a, v, 0, 1 << 24, dst))
                return 2;
        } else if (!strcmp(a, "--api-key")) {
            if (!(api_key = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--namespace")) {
            if (!(namespace_ = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--cluster-secret")) {
            if (!(secret = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--bootstrap-peers")) {
            if (!(bootstrap = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--cluster-port") || !strcmp(a, "--discovery-port")) {
            long *dst = a[2] == 'c' ? &cluster_port : &discovery_port;
            if (!(v = exo_arg_value("serve", argc, argv, &i)) || exo_arg_int("serve", a, v, 0, 65535, dst))
                return 2;
        } else if (!strcmp(a, "--no-discovery")) {
            discovery = false;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--force-master")) {
            force_master = true;
        } else if (!strcmp(a, "--place")) {
            if (!(place_model = exo_arg_value("serve", argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--offline")) {
            offline = true;
        } else if (!strcmp(a, "--no-batch")) {
            setenv("EXO_BATCH", "1", 1); /* read by the runner processes this one spawns */
        } else if (!strcmp(a, "--kv-budget")) {
            const char *size = exo_arg_value("serve", argc, argv, &i);
            uint64_t bytes;
            exo_err err = {0};
            if (!size)
                return 2;
            if (exo_parse_size(size, &bytes, &err)) {
                fprintf(stderr, "exo serve: --kv-budget: %s\n", err.msg);
                return 2;
            }
            setenv("EXO_KV_BUDGET", size, 1); /* read by the runners, as EXO_BATCH */
        } else if (!strcmp(a, "--kv-cache")) {
            const char *type = exo_arg_value("serve", argc, argv, &i);
            if (!type)
                return 2;
            if (strcmp(type, "f32") && strcmp(type, "bf16")) {
                fprintf(stderr, "exo serve: --kv-cache: '%s' is not f32 or bf16\n", type);
                return 2;
            }
            setenv("EXO_KV_CACHE", type, 1); /* read where the runners load their models */
        } else if (!strcmp(a, "--no-worker")) {
            worker = false;
        } else if (!strcmp(a, "--no-api")) {
            api = false;
        } else if (a[0] == '-' && a[1] != '-' && a[1] && strspn(a + 1, "vq") == strlen(a + 1)) {
            for (const char *c = a + 1; *c; c++)
                verbosity += *c == 'v' ? 1 : -1;
        } else if (!strcmp(a, "--verbose")) {
            verbosity++;
        } else if (!strcmp(a, "--quiet")) {
            verbosity--;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "exo serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    int level = EXO_LOG_INFO + verbosity;
    exo_log_set_level(level < EXO_LOG_ERROR ? EXO_LOG_ERROR : level > EXO_LOG_DEBUG ? EXO_LOG_DEBUG
                                                                                 : (exo_log_level)level);
    raise_fd_limit();

    exo_err err = {0};
    exo_paths paths;
    if (exo_paths_resolve(data_dir, models_dirs, n_models_dirs, &paths, &err)) {
        fprintf(stderr, "exo: %s\n", err.msg);
        return 1;
    }
    int pid_fd = -1;
    if (exo_pidfile_acquire(paths.pid_file, &pid_fd, &err)) {
        fprintf(stderr, "exo: %s\n", err.msg);
        exo_paths_free(&paths);
        return 1;
    }
    for (int i = 0; i < paths.n_models_dirs; i++)
        EXO_LOG_INFO("models dir %s%s", paths.models_dirs[i].path,
                     paths.models_dirs[i].read_only ? " (read-only)" : "");

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* inherited by every thread we start */
    signal(SIGPIPE, SIG_IGN);

    int status = 1;
    exo_node *node = NULL;
    exo_api_server *server = NULL;
    char *dashboard = NULL;
    exo_node_config nc = {.paths = &paths, .worker = worker, .runner_threads = (int)threads,
                          .runner_ctx = (int)ctx, .warmup_tokens = (int)warmup, .verbose = verbosity > 0,
                          .namespace_ = namespace_, .secret = secret && *secret ? secret : NULL,
                          .cluster_port = (int)cluster_port, .discovery_port = (int)discovery_port,
                          .no_discovery = !discovery, .force_master = force_master,
                          .api_port = api ? (int)port : 0};
    exo_hub_opts hub;
    exo_hub_opts_from_env(&hub);
    hub.offline |= offline;
    nc.hub = &hub;
    if (hub.offline)
        EXO_LOG_INFO("offline: models are never downloaded");
    const char *ring_timeout = getenv("EXO_RING_TIMEOUT_MS");
    if (ring_timeout)
        nc.ring_timeout_ms = atoi(ring_timeout) > 0 ? atoi(ring_timeout) : 0;
    /* failure handling, shortened by tests (docs/DAEMON.md) */
    const char *backoff = getenv("EXO_RUNNER_BACKOFF_MS"), *stall = getenv("EXO_STALL_TIMEOUT_MS");
    nc.runner_backoff_ms = backoff && atoi(backoff) > 0 ? atoi(backoff) : 0;
    nc.stall_timeout_ms = stall && atoi(stall) > 0 ? atoi(stall) : 0;
    char *peers = bootstrap ? exo_strdup(bootstrap) : NULL, *save = NULL;
    for (char *p = peers ? strtok_r(peers, ", ", &save) : NULL; p; p = strtok_r(NULL, ", ", &save)) {
        if (nc.n_bootstrap == EXO_MAX_BOOTSTRAP_PEERS) {
            fprintf(stderr, "exo: at most %d bootstrap peers\n", EXO_MAX_BOOTSTRAP_PEERS);
            exo_free(peers);
            exo_pidfile_release(pid_fd, paths.pid_file);
            exo_paths_free(&paths);
            return 2;
        }
        nc.bootstrap[nc.n_bootstrap++] = p;
    }
    int node_rc = exo_node_start(&nc, &node, &err);
    exo_free(peers); /* the node keeps copies */
    if (node_rc) {
        fprintf(stderr, "exo: %s\n", err.msg);
        goto out;
    }
    if (api) {
        dashboard = find_dashboard();
        exo_api_server_config ac = {.bind_addr = host, .port = (int)port, .dashboard_dir = dashboard,
                                    .api_key = api_key && *api_key ? api_key : NULL};
        http_limits_from_env(&ac);
        if (exo_api_server_start(node, &ac, &server, &err)) {
            fprintf(stderr, "exo: API on port %ld: %s\n", port, err.msg);
            goto out;
        }
        EXO_LOG_INFO("API listening on http://%s:%d", host ? host : "0.0.0.0",
                     exo_api_server_port(server));
        exo_node_set_api_port(node, exo_api_server_port(server));
        if (dashboard)
            EXO_LOG_INFO("dashboard at http://%s:%d/ (from %s)", host ? host : "localhost",
                         exo_api_server_port(server), dashboard);
        else
            EXO_LOG_INFO("no dashboard: build it with `cd dashboard && npm run build`");
    }
    placer pl = {node, place_model, false};
    pthread_t place_thread;
    bool placing = place_model && pthread_create(&place_thread, NULL, place_at_start, &pl) == 0;
    int sig = 0;
    sigwait(&sigs, &sig);
    if (placing) {
        __atomic_store_n(&pl.stop, true, __ATOMIC_RELEASE);
        pthread_join(place_thread, NULL);
    }
    EXO_LOG_INFO("%s: shutting down (again to exit at once)", sig == SIGINT ? "SIGINT" : "SIGTERM");
    signal(SIGINT, exit_now);
    signal(SIGTERM, exit_now);
    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    status = 0;
out:
    exo_node_stop(node);          /* generations end, runners exit */
    exo_api_server_free(server);  /* then the connections close */
    exo_node_free(node);          /* and the log is archived */
    exo_pidfile_release(pid_fd, paths.pid_file);
    exo_free(dashboard);
    exo_paths_free(&paths);
    return status;
}
