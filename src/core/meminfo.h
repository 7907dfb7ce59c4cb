/* The machine's memory (Linux /proc/meminfo). */
#ifndef EXO_CORE_MEMINFO_H
#define EXO_CORE_MEMINFO_H

#include "core/error.h"

#include <stdint.h>

/* MemTotal and MemAvailable in bytes; EXO_EIO when the file cannot be read
 * or has no MemTotal. */
int exo_meminfo(uint64_t *total, uint64_t *avail, exo_err *err);

/* A memory size as a user writes it: a number of bytes, or a decimal with
 * K, M, G or T (powers of 1024; a trailing B or iB is allowed: 4G, 4GiB,
 * 1.5G, 512M). Returns EXO_EINVAL for anything else, zero, or more than
 * 2^62 bytes. */
int exo_parse_size(const char *s, uint64_t *bytes, exo_err *err);

#endif
