/* The machine's memory (Linux /proc/meminfo). */
#ifndef EXO_CORE_MEMINFO_H
#define EXO_CORE_MEMINFO_H

#include "core/error.h"

#include <stdint.h>

/* MemTotal and MemAvailable in bytes; EXO_EIO when the file cannot be read
 * or has no MemTotal. */
int exo_meminfo(uint64_t *total, uint64_t *avail, exo_err *err);

#endif
