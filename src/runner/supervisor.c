/* Runner supervisor (see supervisor.h): fork+exec of `exo runner --fd 3`,
 * a non-blocking frame pump, in-flight command bookkeeping so that a dead
 * runner's commands still get exactly one terminal chunk each. */
#include "runner/supervisor.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUNNER_FD 3

typedef struct inflight {
    char id[EXO_RUNNER_ID_MAX + 1];
    bool terminal; /* its FINISH / ERROR chunk was delivered */
} inflight;

struct exo_supervisor {
    exo_supervisor_callbacks cb;
    exo_runner_chan  *ch;
    pid_t             pid;
    bool              gone;          /* death handled; nothing more happens */
    bool              shutdown_sent;
    char             *log_path;
    off_t             log_start;     /* log size at spawn: this runner's output follows */
    char              protocol_error[EXO_ERR_LEN];
    exo_runner_status status;
    inflight         *cmds;
    int               n_cmds, cap_cmds;
};

/* ---- spawning ----------------------------------------------------------- */

static void raise_fd(int *fd)
{
    if (*fd < 0 || *fd > RUNNER_FD)
        return;
    int hi = fcntl(*fd, F_DUPFD_CLOEXEC, 10);
    if (hi >= 0) {
        close(*fd);
        *fd = hi;
    }
}

/* Makes `to` a copy of `from` that survives exec. */
static void child_dup(int from, int to)
{
    if (from == to)
        fcntl(to, F_SETFD, 0);
    else
        dup2(from, to);
}

int exo_supervisor_spawn(const exo_supervisor_opts *opts, const exo_supervisor_callbacks *cb,
                         exo_supervisor **out, exo_err *err)
{
    *out = NULL;
    const char *bin = opts && opts->runner_bin ? opts->runner_bin : "/proc/self/exe";
    const char *log_path = opts ? opts->log_path : NULL;
    int sv[2] = {-1, -1}, ep[2] = {-1, -1}, logfd = -1, nullfd = -1;
    off_t log_start = 0;
    if (log_path) {
        logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (logfd < 0)
            return exo_err_set(err, EXO_EIO, "runner log %s: %s", log_path, strerror(errno));
        struct stat st;
        if (fstat(logfd, &st) == 0)
            log_start = st.st_size;
    }
    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(ep, O_CLOEXEC) < 0) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (sv[i] >= 0) close(sv[i]);
            if (ep[i] >= 0) close(ep[i]);
        }
        if (logfd >= 0) close(logfd);
        if (nullfd >= 0) close(nullfd);
        return exo_err_set(err, EXO_EIO, "runner socketpair: %s", strerror(e));
    }
    char *argv[] = {(char *)bin, "runner", "--fd", "3", opts && opts->verbose ? "-v" : NULL, NULL};
    /* The fds the child needs go above RUNNER_FD, so its dup2s onto 0..3
     * cannot clobber one another (a node started with stdio closed). */
    raise_fd(&sv[1]);
    raise_fd(&ep[1]);
    raise_fd(&logfd);
    raise_fd(&nullfd);
    int rfd = sv[1], efd = ep[1];
    /* Everything the child does between fork and exec is async-signal-safe. */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* a terminal's ^C goes to the node, which shuts runners down */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        if (nullfd >= 0)
            child_dup(nullfd, 0);
        if (logfd >= 0) {
            child_dup(logfd, 1);
            child_dup(logfd, 2);
        }
        child_dup(rfd, RUNNER_FD);
#ifdef SYS_close_range
        /* Close whatever else the node had open without O_CLOEXEC, keeping
         * the exec-error pipe (cloexec) until exec. */
        if (efd > RUNNER_FD + 1)
            syscall(SYS_close_range, RUNNER_FD + 1, (unsigned)efd - 1, 0);
        syscall(SYS_close_range, (unsigned)efd + 1, ~0U, 0);
#endif
        execv(bin, argv);
        int e = errno;
        ssize_t w = write(efd, &e, sizeof e);
        (void)w;
        _exit(127);
    }
    int fork_errno = errno;
    close(sv[1]);
    close(ep[1]);
    if (logfd >= 0) close(logfd);
    if (nullfd >= 0) close(nullfd);
    if (pid < 0) {
        close(sv[0]);
        close(ep[0]);
        return exo_err_set(err, EXO_EIO, "runner fork: %s", strerror(fork_errno));
    }
    int child_errno = 0;
    ssize_t r;
    do
        r = read(ep[0], &child_errno, sizeof child_errno);
    while (r < 0 && errno == EINTR);
    close(ep[0]);
    if (r == (ssize_t)sizeof child_errno) {
        close(sv[0]);
        waitpid(pid, NULL, 0);
        return exo_err_set(err, child_errno == ENOENT ? EXO_ENOENT : EXO_EIO, "cannot run %s: %s",
                           bin, strerror(child_errno));
    }
    exo_supervisor *s = exo_calloc(1, sizeof *s);
    if (cb)
        s->cb = *cb;
    s->ch = exo_runner_chan_new(sv[0]);
    s->pid = pid;
    s->log_path = log_path ? exo_strdup(log_path) : NULL;
    s->log_start = log_start;
    exo_runner_status_init(&s->status, EXO_RUNNER_IDLE);
    *out = s;
    return 0;
}

/* ---- bookkeeping -------------------------------------------------------- */

static inflight *find_cmd(exo_supervisor *s, const char *id)
{
    for (int i = 0; i < s->n_cmds; i++)
        if (!strcmp(s->cmds[i].id, id))
            return &s->cmds[i];
    return NULL;
}

static void remove_cmd(exo_supervisor *s, inflight *c)
{
    int i = (int)(c - s->cmds);
    memmove(&s->cmds[i], &s->cmds[i + 1], sizeof *s->cmds * (size_t)(s->n_cmds - i - 1));
    s->n_cmds--;
}

static void set_status(exo_supervisor *s, const exo_runner_status *st)
{
    exo_runner_status_clear(&s->status);
    exo_runner_status_copy(&s->status, st);
    if (s->cb.on_status)
        s->cb.on_status(s->cb.ctx, &s->status);
}

static void deliver_chunk(exo_supervisor *s, inflight *c, const exo_chunk *ch)
{
    if (ch->kind == EXO_CHUNK_ERROR || ch->kind == EXO_CHUNK_FINISH)
        c->terminal = true;
    if (s->cb.on_chunk)
        s->cb.on_chunk(s->cb.ctx, c->id, ch);
}

/* Ends a command: a terminal chunk if it had none, then on_done. */
static void end_cmd(exo_supervisor *s, inflight *c, const char *error)
{
    char id[EXO_RUNNER_ID_MAX + 1];
    if (!c->terminal) {
        exo_chunk e;
        exo_chunk_error(&e, error);
        deliver_chunk(s, c, &e);
        exo_chunk_free(&e);
    }
    memcpy(id, c->id, sizeof id);
    remove_cmd(s, c); /* before the callback, which may start new commands */
    if (s->cb.on_done)
        s->cb.on_done(s->cb.ctx, id);
}

/* ---- death ---------------------------------------------------------------- */

/* The last non-empty line this runner wrote to its log, if any. */
static void last_log_line(const exo_supervisor *s, char *out, size_t cap)
{
    out[0] = 0;
    if (!s->log_path)
        return;
    int fd = open(s->log_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    char buf[2048];
    if (fstat(fd, &st) == 0 && st.st_size > s->log_start) {
        off_t from = st.st_size - (off_t)(sizeof buf - 1);
        if (from < s->log_start)
            from = s->log_start;
        ssize_t n = pread(fd, buf, sizeof buf - 1, from);
        if (n > 0) {
            buf[n] = 0;
            while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
                buf[--n] = 0;
            char *line = strrchr(buf, '\n');
            line = line ? line + 1 : buf;
            /* printable ASCII only: the message becomes an event */
            size_t k = 0;
            for (const char *p = line; *p && k + 1 < cap; p++)
                out[k++] = (*p >= 32 && *p < 127) ? *p : '?';
            out[k] = 0;
        }
    }
    close(fd);
}

static void reap(exo_supervisor *s, int *wstatus, bool *known)
{
    *known = false;
    if (!s->pid)
        return;
    double t0 = exo_clock_seconds();
    for (;;) {
        pid_t r = waitpid(s->pid, wstatus, WNOHANG);
        if (r == s->pid) {
            *known = true;
            break;
        }
        if (r < 0 && errno != EINTR)
            break; /* ECHILD: someone else reaped it */
        if (exo_clock_seconds() - t0 > 1.0) {
            kill(s->pid, SIGKILL);
            while ((r = waitpid(s->pid, wstatus, 0)) < 0 && errno == EINTR)
                ;
            *known = r == s->pid;
            break;
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    s->pid = 0;
}

static void handle_death(exo_supervisor *s)
{
    if (s->gone)
        return;
    if (s->protocol_error[0] && s->pid)
        kill(s->pid, SIGKILL);
    int ws = 0;
    bool known;
    reap(s, &ws, &known);
    s->gone = true;
    char how[64];
    if (!known)
        snprintf(how, sizeof how, "status unknown");
    else if (WIFSIGNALED(ws))
        snprintf(how, sizeof how, "signal %d", WTERMSIG(ws));
    else
        snprintf(how, sizeof how, "exit code %d", WEXITSTATUS(ws));
    char error[EXO_ERR_LEN + 128];
    snprintf(error, sizeof error, "runner exited (%s) before completing the request", how);
    while (s->n_cmds)
        end_cmd(s, &s->cmds[0], error);
    bool clean = known && WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && s->shutdown_sent &&
                 !s->protocol_error[0];
    exo_runner_status st;
    if (clean) {
        if (s->status.kind == EXO_RUNNER_SHUTDOWN)
            return;
        exo_runner_status_init(&st, EXO_RUNNER_SHUTDOWN);
    } else {
        char tail[512], msg[EXO_ERR_LEN + 1024];
        last_log_line(s, tail, sizeof tail);
        if (s->protocol_error[0])
            snprintf(msg, sizeof msg, "runner protocol error: %s", s->protocol_error);
        else if (tail[0])
            snprintf(msg, sizeof msg, "runner exited (%s): %s", how, tail);
        else
            snprintf(msg, sizeof msg, "runner exited (%s)", how);
        exo_runner_status_init(&st, EXO_RUNNER_FAILED);
        st.error_message = exo_strdup(msg);
    }
    set_status(s, &st);
    exo_runner_status_clear(&st);
}

/* ---- frames from the runner ---------------------------------------------- */

static void on_frame(exo_supervisor *s, exo_runner_msg *m)
{
    switch (m->kind) {
    case EXO_RMSG_STATUS:
        set_status(s, &m->status);
        break;
    case EXO_RMSG_CHUNK: {
        inflight *c = find_cmd(s, m->command_id);
        if (!c)
            EXO_LOG_WARN("supervisor: chunk for unknown command %s dropped", m->command_id);
        else if (c->terminal)
            EXO_LOG_WARN("supervisor: chunk after the end of command %s dropped", m->command_id);
        else
            deliver_chunk(s, c, &m->chunk);
        break;
    }
    case EXO_RMSG_DONE: {
        inflight *c = find_cmd(s, m->command_id);
        if (c)
            end_cmd(s, c, "the runner ended the request without a result");
        else
            EXO_LOG_WARN("supervisor: Done for unknown command %s", m->command_id);
        break;
    }
    default:
        snprintf(s->protocol_error, sizeof s->protocol_error, "unexpected %s frame",
                 exo_runner_msg_name(m->kind));
        EXO_LOG_ERROR("supervisor: runner %d sent a %s frame", (int)s->pid,
                      exo_runner_msg_name(m->kind));
    }
}

int exo_supervisor_process(exo_supervisor *s)
{
    if (s->gone)
        return 1;
    bool eof = false;
    for (int rounds = 0; rounds < 64 && !s->protocol_error[0]; rounds++) {
        int n = exo_runner_chan_read(s->ch, false);
        if (n == EXO_EBUSY)
            break;
        if (n <= 0) {
            eof = true;
        }
        for (;;) {
            exo_runner_msg m;
            exo_err err = {0};
            int rc = exo_runner_chan_next(s->ch, &m, &err);
            if (rc == 0)
                break;
            if (rc < 0) {
                snprintf(s->protocol_error, sizeof s->protocol_error, "%s", err.msg);
                EXO_LOG_ERROR("supervisor: runner %d sent a bad frame: %s", (int)s->pid, err.msg);
                break;
            }
            on_frame(s, &m);
            exo_runner_msg_free(&m);
            if (s->protocol_error[0] || s->gone)
                break;
        }
        if (eof)
            break;
    }
    if (!eof && !s->protocol_error[0] && exo_runner_chan_pending(s->ch) &&
        exo_runner_chan_flush(s->ch, false))
        eof = true; /* the runner closed its end: it is exiting */
    if (eof || s->protocol_error[0])
        handle_death(s);
    return s->gone ? 1 : 0;
}

int exo_supervisor_wait(exo_supervisor *s, int timeout_ms, bool (*until)(void *ctx), void *ctx)
{
    double end = exo_clock_seconds() + timeout_ms / 1000.0;
    for (;;) {
        if (until && until(ctx))
            return 1;
        if (s->gone)
            return -1;
        int left = -1;
        if (timeout_ms >= 0) {
            double rem = end - exo_clock_seconds();
            if (rem <= 0)
                return 0;
            left = (int)(rem * 1000) + 1;
        }
        struct pollfd p = {exo_runner_chan_fd(s->ch), exo_supervisor_poll_events(s), 0};
        int pr = poll(&p, 1, left > 100 || left < 0 ? 100 : left);
        if (pr < 0 && errno != EINTR)
            return -1;
        exo_supervisor_process(s);
    }
}

/* ---- sending -------------------------------------------------------------- */

static int send_frame(exo_supervisor *s, const exo_runner_msg *m, exo_err *err)
{
    if (s->gone || s->shutdown_sent)
        return exo_err_set(err, EXO_EIO, "the runner is not running");
    int rc = exo_runner_chan_send(s->ch, m, false, err);
    if (rc == EXO_EIO)
        return rc; /* the death shows up in the next exo_supervisor_process */
    return rc;
}

int exo_supervisor_load(exo_supervisor *s, const exo_runner_load *load, exo_err *err)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_LOAD_MODEL);
    m.load = *load; /* borrowed */
    int rc = send_frame(s, &m, err);
    m.load.model_dir = NULL;
    exo_runner_msg_free(&m);
    return rc;
}

int exo_supervisor_connect(exo_supervisor *s, const char *host, int port, exo_err *err)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_CONNECT);
    if (strlen(host) >= sizeof m.connect.host)
        return exo_err_set(err, EXO_EINVAL, "address too long");
    snprintf(m.connect.host, sizeof m.connect.host, "%s", host);
    m.connect.port = port;
    int rc = send_frame(s, &m, err);
    exo_runner_msg_free(&m);
    return rc;
}

int exo_supervisor_generate(exo_supervisor *s, const char *command_id, const exo_gen_request *req,
                            exo_err *err)
{
    if (!command_id || !exo_runner_id_valid(command_id))
        return exo_err_set(err, EXO_EINVAL, "bad command id");
    if (find_cmd(s, command_id))
        return exo_err_set(err, EXO_EINVAL, "command %s is already running", command_id);
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_GENERATE);
    snprintf(m.command_id, sizeof m.command_id, "%s", command_id);
    m.request = *req; /* borrowed */
    int rc = send_frame(s, &m, err);
    exo_gen_request_init(&m.request);
    exo_runner_msg_free(&m);
    if (rc && rc != EXO_EIO)
        return rc;
    if (rc == EXO_EIO && s->gone)
        return rc;
    /* Queued (or the runner just died: the death path answers it). */
    if (s->n_cmds == s->cap_cmds) {
        s->cap_cmds = s->cap_cmds ? 2 * s->cap_cmds : 8;
        s->cmds = exo_realloc(s->cmds, sizeof *s->cmds * (size_t)s->cap_cmds);
    }
    inflight *c = &s->cmds[s->n_cmds++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", command_id);
    return 0;
}

int exo_supervisor_cancel(exo_supervisor *s, const char *command_id, exo_err *err)
{
    if (!command_id || !exo_runner_id_valid(command_id))
        return exo_err_set(err, EXO_EINVAL, "bad command id");
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_CANCEL);
    snprintf(m.command_id, sizeof m.command_id, "%s", command_id);
    int rc = send_frame(s, &m, err);
    exo_runner_msg_free(&m);
    return rc;
}

int exo_supervisor_shutdown(exo_supervisor *s, exo_err *err)
{
    exo_runner_msg m;
    exo_runner_msg_init(&m, EXO_RMSG_SHUTDOWN);
    int rc = send_frame(s, &m, err);
    exo_runner_msg_free(&m);
    if (!s->gone)
        s->shutdown_sent = true;
    return rc == EXO_EIO ? 0 : rc;
}

/* ---- accessors / teardown -------------------------------------------------- */

int exo_supervisor_fd(const exo_supervisor *s) { return s->gone ? -1 : exo_runner_chan_fd(s->ch); }

short exo_supervisor_poll_events(const exo_supervisor *s)
{
    if (s->gone)
        return 0;
    return (short)(POLLIN | (exo_runner_chan_pending(s->ch) ? POLLOUT : 0));
}

const exo_runner_status *exo_supervisor_status(const exo_supervisor *s) { return &s->status; }
pid_t exo_supervisor_pid(const exo_supervisor *s) { return s->pid; }
bool  exo_supervisor_alive(const exo_supervisor *s) { return !s->gone; }
int   exo_supervisor_in_flight(const exo_supervisor *s) { return s->n_cmds; }

void exo_supervisor_free(exo_supervisor *s)
{
    if (!s)
        return;
    if (s->pid) {
        if (!s->shutdown_sent && !s->gone) {
            exo_runner_msg m;
            exo_runner_msg_init(&m, EXO_RMSG_SHUTDOWN);
            exo_err err;
            exo_runner_chan_send(s->ch, &m, false, &err);
            exo_runner_msg_free(&m);
        }
        /* Wait up to 2 s for the runner to close its end, discarding what it sends. */
        double end = exo_clock_seconds() + 2.0;
        int fd = exo_runner_chan_fd(s->ch);
        for (;;) {
            exo_runner_chan_flush(s->ch, false);
            double rem = end - exo_clock_seconds();
            if (rem <= 0)
                break;
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, (int)(rem * 1000) + 1) < 0 && errno != EINTR)
                break;
            char buf[65536];
            ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                break;
        }
        int ws;
        if (waitpid(s->pid, &ws, WNOHANG) == 0) {
            /* closed its socket but still exiting: give it a moment */
            double e2 = exo_clock_seconds() + 0.5;
            pid_t r;
            while ((r = waitpid(s->pid, &ws, WNOHANG)) == 0 && exo_clock_seconds() < e2) {
                struct timespec ts = {0, 2 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
            if (r == 0) {
                kill(s->pid, SIGKILL);
                while (waitpid(s->pid, &ws, 0) < 0 && errno == EINTR)
                    ;
            }
        }
    }
    exo_runner_chan_free(s->ch);
    exo_runner_status_clear(&s->status);
    exo_free(s->cmds);
    exo_free(s->log_path);
    exo_free(s);
}
