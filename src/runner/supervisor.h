/* The node side of one runner child process: spawn it, send it work, turn
 * its frames into callbacks, and notice when it dies.
 *
 * Why a library with a pollable fd rather than a thread: the node loop owns
 * the State and already multiplexes sockets; a supervisor is one more fd in
 * its poll set. Nothing here blocks except exo_supervisor_free (bounded) and
 * the convenience exo_supervisor_wait.
 *
 * Use:
 *   exo_supervisor *sup;
 *   exo_supervisor_opts o = {.log_path = "/var/log/exo/runner-1.log"};
 *   exo_supervisor_callbacks cb = {ctx, on_status, on_chunk, on_done};
 *   exo_supervisor_spawn(&o, &cb, &sup, &err);
 *   exo_runner_load load = {"/models/Qwen3-0.6B", 0, 8192, 16};
 *   exo_supervisor_load(sup, &load, &err);
 *   exo_supervisor_generate(sup, "cmd-1", &request, &err);
 *   loop: poll exo_supervisor_fd(sup) for exo_supervisor_poll_events(sup),
 *         then exo_supervisor_process(sup)  -> callbacks
 *   exo_supervisor_free(sup);
 *
 * Callbacks run only inside exo_supervisor_process / exo_supervisor_wait.
 * They may call exo_supervisor_generate / _cancel / _shutdown (which only
 * queue frames) but not exo_supervisor_free.
 *
 * Every command passed to exo_supervisor_generate gets, through on_chunk,
 * its chunks and exactly one terminal chunk (FINISH or ERROR), then one
 * on_done: the runner's own, or, when the runner dies first (crash, kill,
 * a protocol violation), an ERROR chunk "runner exited (signal N) before
 * completing the request" (or "exit code N") and on_done, after which the
 * status becomes Failed. A runner that exits after a Shutdown ends in
 * status Shutdown instead.
 *
 * The child gets PR_SET_PDEATHSIG(SIGKILL) so runners never outlive a
 * crashed node. Linux ties that to the *thread* that forked: spawn from a
 * thread that lives as long as the runner (the node loop), not from a
 * short-lived worker thread. The child runs in its own process group, so a
 * terminal's ^C reaches the node, which then shuts its runners down. */
#ifndef EXO_RUNNER_SUPERVISOR_H
#define EXO_RUNNER_SUPERVISOR_H

#include "runner/protocol.h"

#include <stdbool.h>
#include <sys/types.h>

typedef struct exo_supervisor exo_supervisor;

typedef struct exo_supervisor_callbacks {
    void *ctx;
    /* The runner's status changed (a copy is kept: exo_supervisor_status). */
    void (*on_status)(void *ctx, const exo_runner_status *status);
    /* A chunk of a command (borrowed for the call). */
    void (*on_chunk)(void *ctx, const char *command_id, const exo_chunk *chunk);
    /* The command is finished; its terminal chunk came before. */
    void (*on_done)(void *ctx, const char *command_id);
} exo_supervisor_callbacks;

typedef struct exo_supervisor_opts {
    const char *runner_bin; /* executable run as `BIN runner --fd 3`; NULL: /proc/self/exe */
    const char *log_path;   /* runner stdout+stderr appended here; NULL: inherited */
    bool        verbose;    /* runner logs at debug level */
} exo_supervisor_opts;

/* Starts the runner. Fails (EXO_EIO / EXO_ENOENT with the reason) when the
 * log cannot be opened or the binary cannot be executed. */
int  exo_supervisor_spawn(const exo_supervisor_opts *opts, const exo_supervisor_callbacks *cb,
                          exo_supervisor **out, exo_err *err);
/* Asks the runner to shut down, waits up to ~2 s for it, then SIGKILLs it;
 * reaps it. No callbacks run. NULL is a no-op. */
void exo_supervisor_free(exo_supervisor *s);

/* The fd to poll, and the events to poll it for (POLLIN, plus POLLOUT
 * while frames are queued); -1 / 0 once the runner is gone. */
int   exo_supervisor_fd(const exo_supervisor *s);
short exo_supervisor_poll_events(const exo_supervisor *s);

/* Reads and dispatches whatever frames are available, writes queued ones,
 * and handles the runner's death. Never blocks (except to reap a child
 * that closed its socket: at most ~1 s before it is SIGKILLed). Returns 0
 * while the runner runs, 1 once it is gone (every in-flight command has
 * then been answered). */
int exo_supervisor_process(exo_supervisor *s);

/* Polls and processes until `until` returns true, the runner is gone, or
 * timeout_ms passes (< 0: no limit). Returns 1 if `until` held, 0 on timeout,
 * or -1 when the runner is gone. `until` may be NULL (wait for the timeout
 * or the end). For tests and simple callers. */
int exo_supervisor_wait(exo_supervisor *s, int timeout_ms, bool (*until)(void *ctx), void *ctx);

/* Queue frames for the runner. EXO_EIO once the runner is gone (or after a
 * Shutdown), EXO_EINVAL for a bad command id or a duplicate in-flight one,
 * EXO_ETOOBIG for a request over the frame limit. */
int exo_supervisor_load(exo_supervisor *s, const exo_runner_load *load, exo_err *err);
/* A split model's runner: where the next rank listens (see protocol.h). */
int exo_supervisor_connect(exo_supervisor *s, const char *host, int port, exo_err *err);
int exo_supervisor_generate(exo_supervisor *s, const char *command_id, const exo_gen_request *req,
                            exo_err *err);
int exo_supervisor_cancel(exo_supervisor *s, const char *command_id, exo_err *err);
int exo_supervisor_shutdown(exo_supervisor *s, exo_err *err);

const exo_runner_status *exo_supervisor_status(const exo_supervisor *s);
pid_t exo_supervisor_pid(const exo_supervisor *s);  /* 0 once reaped */
bool  exo_supervisor_alive(const exo_supervisor *s);
int   exo_supervisor_in_flight(const exo_supervisor *s); /* commands not yet done */

#endif
