/* The machine's memory from /proc/meminfo: what a node reports and what a
 * runner sizes its batch by; and memory sizes as users write them. */
#include "core/meminfo.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MemTotal and MemAvailable in bytes. Kernels before 3.14 have no
 * MemAvailable; MemFree + Buffers + Cached approximates it there. */
int exo_meminfo(uint64_t *total, uint64_t *avail, exo_err *err)
{
    const char *path = "/proc/meminfo";
    FILE *f = fopen(path, "r");
    if (!f)
        return exo_err_set(err, EXO_EIO, "%s: %s", path, strerror(errno));
    unsigned long long mem_total = 0, mem_avail = 0, mem_free = 0, buffers = 0, cached = 0;
    bool have_total = false, have_avail = false;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char key[64];
        unsigned long long kb;
        if (sscanf(line, "%63[^:]: %llu", key, &kb) != 2)
            continue;
        if (!strcmp(key, "MemTotal"))
            mem_total = kb, have_total = true;
        else if (!strcmp(key, "MemAvailable"))
            mem_avail = kb, have_avail = true;
        else if (!strcmp(key, "MemFree"))
            mem_free = kb;
        else if (!strcmp(key, "Buffers"))
            buffers = kb;
        else if (!strcmp(key, "Cached"))
            cached = kb;
    }
    fclose(f);
    if (!have_total || mem_total == 0)
        return exo_err_set(err, EXO_EIO, "%s: no MemTotal line", path);
    if (!have_avail)
        mem_avail = mem_free + buffers + cached;
    if (mem_avail > mem_total)
        mem_avail = mem_total;
    *total = (uint64_t)mem_total * 1024;
    *avail = (uint64_t)mem_avail * 1024;
    return 0;
}

int exo_parse_size(const char *s, uint64_t *bytes, exo_err *err)
{
    const char *p = s;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++)
            ;
    /* digits first: strtod alone would take "inf", "0x10", " 5" or "-1" */
    if (p == s || !isdigit((unsigned char)s[0]))
        return exo_err_set(err, EXO_EINVAL, "'%s' is not a size (as 512M or 4G)", s);
    double v = strtod(s, NULL);
    const char *units = "KMGT", *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
    if (u) {
        v = ldexp(v, 10 * (int)(u - units + 1));
        p++;
        if (*p == 'i' && p[1] == 'B')
            p++;
    }
    if (*p == 'B')
        p++;
    if (*p || !(v >= 1) || v > ldexp(1, 62))
        return exo_err_set(err, EXO_EINVAL, "'%s' is not a size from 1 byte to 4 EiB (as 512M or 4G)", s);
    *bytes = (uint64_t)v;
    return 0;
}
