/* Error codes shared by every subsystem.
 *
 * Functions return 0 on success or a negative EXO_E* code. One X-macro
 * generates the enum and the name/message tables so they cannot drift apart.
 * Where a human needs context ("tensor model.layers.3.q_proj.weight: offset
 * past end of file"), the caller passes an exo_err buffer that the callee
 * fills with exo_err_set(); the code stays machine-checkable, the text stays
 * specific. */
#ifndef EXO_CORE_ERROR_H
#define EXO_CORE_ERROR_H

#include <stddef.h>

#define EXO_ERRNO_MAP(XX)                                                   \
    XX(NOMEM,     -1, "out of memory")                                      \
    XX(IO,        -2, "input/output error")                                 \
    XX(NOENT,     -3, "no such file or directory")                          \
    XX(FORMAT,    -4, "malformed input")                                    \
    XX(UNSUPPORTED, -5, "not supported")                                    \
    XX(INVAL,     -6, "invalid argument")                                   \
    XX(RANGE,     -7, "value out of range")                                 \
    XX(TOOBIG,    -8, "input too large")                                    \
    XX(CANCELED,  -9, "operation canceled")                                  \
    XX(BUSY,     -10, "resource busy")                                      \
    XX(INTERNAL, -11, "internal error")                                     \
    XX(TIMEDOUT, -12, "timed out")                                          \
    XX(PERM,     -13, "not permitted")                                     \
    XX(NOSPC,    -14, "no space left on device")

enum {
    EXO_OK = 0,
#define XX(name, code, msg) EXO_E##name = (code),
    EXO_ERRNO_MAP(XX)
#undef XX
};

const char *exo_err_name(int code);
const char *exo_strerror(int code);

/* A caller-owned error context: a code plus a message that names the thing
 * that failed. */
#define EXO_ERR_LEN 512
typedef struct exo_err {
    int  code;
    char msg[EXO_ERR_LEN];
} exo_err;

/* Sets err (if non-NULL) and returns code, so call sites read
 *   return exo_err_set(err, EXO_EFORMAT, "%s: bad header", path); */
int exo_err_set(exo_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an already-set message with more context ("loading X: ..."). */
int exo_err_wrap(exo_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
