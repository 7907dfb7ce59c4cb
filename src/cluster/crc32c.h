/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * event log records. Software slicing-by-8 (~2 GB/s), tables built once on
 * first use; portable, so logs written on one machine verify on any other.
 * Check value: crc32c("123456789") == 0xE3069283.
 *
 * Example usage:
 *   uint32_t c = exo_crc32c(0, buf, len);          // one shot
 *   c = exo_crc32c(exo_crc32c(0, a, na), b, nb);   // same as over a||b */
#ifndef EXO_CLUSTER_CRC32C_H
#define EXO_CLUSTER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC: pass 0 to start, the previous result to extend. */
uint32_t exo_crc32c(uint32_t crc, const void *data, size_t len);

#endif
