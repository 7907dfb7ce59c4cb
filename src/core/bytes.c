/* Whole reads and writes (see bytes.h): one loop each, positioned or not. */
#include "core/bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* off < 0: read(); else pread() at off. */
static ssize_t read_loop(int fd, void *buf, size_t n, int64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = off < 0 ? read(fd, (char *)buf + got, n - got)
                            : pread(fd, (char *)buf + got, n - got, (off_t)((uint64_t)off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int write_loop(int fd, const void *buf, size_t n, int64_t off)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = off < 0 ? write(fd, (const char *)buf + put, n - put)
                            : pwrite(fd, (const char *)buf + put, n - put, (off_t)((uint64_t)off + put));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        put += (size_t)r;
    }
    return 0;
}

ssize_t exo_read_full(int fd, void *buf, size_t n) { return read_loop(fd, buf, n, -1); }
ssize_t exo_pread_full(int fd, void *buf, size_t n, uint64_t off) { return read_loop(fd, buf, n, (int64_t)off); }
int exo_write_full(int fd, const void *buf, size_t n) { return write_loop(fd, buf, n, -1); }
int exo_pwrite_full(int fd, const void *buf, size_t n, uint64_t off) { return write_loop(fd, buf, n, (int64_t)off); }

void exo_fsync_dir_of(const char *path)
{
    char *copy = strdup(path); /* dirname may write into its argument */
    if (!copy)
        return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}
