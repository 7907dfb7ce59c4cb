/* stderr logger (see log.h). One fprintf per message keeps lines whole when
 * several threads log at once. */
#include "core/log.h"
#include "core/clock.h"

#include <stdarg.h>
#include <stdio.h>

static exo_log_level current_level = EXO_LOG_WARN;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void exo_log_set_level(exo_log_level level) { current_level = level; }
exo_log_level exo_log_get_level(void) { return current_level; }

void exo_log(exo_log_level level, const char *fmt, ...)
{
    if (level > current_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[%10.3f %-5s] %s\n", exo_clock_seconds(), level_names[level], line);
}
