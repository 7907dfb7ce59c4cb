/* Small helpers the command handlers share for parsing flags and values.
 * Every parse failure prints "exo <cmd>: ..." and returns nonzero, so a
 * handler can `return 2` on it. */
#ifndef EXO_CLI_ARGS_H
#define EXO_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

int exo_arg_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);
int exo_arg_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                  double *out);
/* "1,2,3" -> malloc'd ids; values must be in [0, INT32_MAX]. */
int exo_arg_ids(const char *cmd, const char *s, int32_t **ids, int *n);
/* The value after a flag, or an error when it is missing. */
const char *exo_arg_value(const char *cmd, int argc, char **argv, int *i);

#endif
