/* Levelled logging to stderr. The daemon and the CLI share it; the level is
 * set once from -v/-q. Messages are single lines prefixed with a monotonic
 * timestamp and the level. */
#ifndef EXO_CORE_LOG_H
#define EXO_CORE_LOG_H

typedef enum exo_log_level {
    EXO_LOG_ERROR = 0,
    EXO_LOG_WARN  = 1,
    EXO_LOG_INFO  = 2,
    EXO_LOG_DEBUG = 3,
} exo_log_level;

void exo_log_set_level(exo_log_level level);
exo_log_level exo_log_get_level(void);
void exo_log(exo_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define EXO_LOG_ERROR(...) exo_log(EXO_LOG_ERROR, __VA_ARGS__)
#define EXO_LOG_WARN(...)  exo_log(EXO_LOG_WARN, __VA_ARGS__)
#define EXO_LOG_INFO(...)  exo_log(EXO_LOG_INFO, __VA_ARGS__)
#define EXO_LOG_DEBUG(...) exo_log(EXO_LOG_DEBUG, __VA_ARGS__)

#endif
