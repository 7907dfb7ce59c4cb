/* The runner: the child process (`exo runner --fd N`) that owns one loaded
 * model and turns generation requests into chunk streams.
 *
 * Why a separate process: the engine mmaps checkpoints, runs hand-written
 * kernels and can be killed by the OOM killer; isolating it means a crash
 * costs one instance and the node reports it (runner/supervisor.h), instead
 * of the whole node going down.
 *
 * State machine (statuses are proto/types.h's, reported up as Status
 * frames on every change):
 *   Idle -LoadModel-> Loading{layers_loaded,total_layers} -> Loaded
 *        -> WarmingUp -> Ready <-> Running
 *   Shutdown frame -> ShuttingDown -> Shutdown (process exits 0);
 *   a load error -> Failed{message} (the process stays up, answering every
 *   request with an ERROR chunk, until the node shuts it down).
 *
 * Requests run one at a time in arrival order. While one generates, the
 * token callback drains the socket without blocking, so a Cancel stops the
 * running request within one token, a Cancel of a queued request answers it
 * at once (FINISH, reason "cancelled"), and new requests queue behind.
 * Every request gets TOKEN / TOOL_CALLS chunks as tokens are produced, then
 * exactly one terminal chunk (FINISH or ERROR), then a Done frame; Ready
 * follows the Done of the last queued request.
 *
 * Per request: the chat template renders messages + tools with
 * add_generation_prompt and the request's enable_thinking /
 * reasoning_effort; the text is tokenized without adding special tokens
 * again; sampling takes the request's fields where set (`has`), else
 * generation_config.json's (do_sample false means greedy), else the
 * sampler defaults (greedy), with a random seed unless one was given;
 * max_tokens defaults to exo's 32168 and the context bounds it (finish
 * "length"); eos ids are config + generation_config + tokenizer_config
 * (none for bench requests). Special tokens stay in the text when the
 * output parser needs them (a tool-call format or think tags detected in
 * the template), and are skipped otherwise, as `exo run` does.
 * Prompts prefill in chunks of 512 tokens; after each chunk the runner
 * sends a PREFILL progress chunk and checks for a Cancel, so a cancel is
 * honoured within one chunk or one token. Not yet: prefix caching,
 * continuous batching (requests run one at a time, FIFO). */
#ifndef EXO_RUNNER_RUNNER_H
#define EXO_RUNNER_RUNNER_H

/* Runs the runner on the connected socket fd (taken over and closed) until
 * a Shutdown frame or the end of the stream. Returns the exit status. */
int exo_runner_main(int fd);

#endif
