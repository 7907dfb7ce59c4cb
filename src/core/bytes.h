/* Little-endian integers in byte buffers, and whole reads and writes on
 * file descriptors: the pieces every wire and file format of exo needs (the
 * event log, the node key, link frames, probes). The integer helpers are
 * inline: they sit on per-frame paths. */
#ifndef EXO_CORE_BYTES_H
#define EXO_CORE_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

static inline void exo_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void exo_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void exo_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t exo_get_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static inline uint32_t exo_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t exo_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Reads up to n bytes (fewer only at end of file), retrying on EINTR:
 * the count, or -1 with errno set. */
ssize_t exo_read_full(int fd, void *buf, size_t n);
ssize_t exo_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* Writes all n bytes, retrying on EINTR and short writes: 0, or -1 with
 * errno set. */
int exo_write_full(int fd, const void *buf, size_t n);
int exo_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
/* fsyncs the directory holding path, so a rename or create in it survives a
 * crash; best effort (a directory that cannot be opened is left alone). */
void exo_fsync_dir_of(const char *path);

#endif
