/* Error names, messages and the formatted error context (see error.h). */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *exo_err_name(int code)
{
    switch (code) {
    case EXO_OK: return "EXO_OK";
#define XX(name, c, msg) case EXO_E##name: return "EXO_E" #name;
    EXO_ERRNO_MAP(XX)
#undef XX
    }
    return "EXO_EUNKNOWN";
}

const char *exo_strerror(int code)
{
    switch (code) {
    case EXO_OK: return "success";
#define XX(name, c, msg) case EXO_E##name: return msg;
    EXO_ERRNO_MAP(XX)
#undef XX
    }
    return "unknown error";
}

int exo_err_set(exo_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int exo_err_wrap(exo_err *err, const char *fmt, ...)
{
    if (!err)
        return EXO_EINTERNAL;
    char old[EXO_ERR_LEN];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %.*s",
                 (int)(sizeof err->msg - (size_t)n), old);
    return err->code;
}
