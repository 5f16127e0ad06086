/* CRC-32C (Castagnoli) for vrepl: hardware where the CPU has it, slicing-by-8 otherwise.
 *
 * Owns: the checksum and the run-time choice of implementation. Does no I/O and keeps no
 * state beyond the tables it builds once. The functions work on the raw CRC register (no
 * pre/post inversion); vrepl_crc32c() applies the standard conditioning, so that
 * vrepl_crc32c(0, "123456789", 9) == 0xE3069283.
 */
#ifndef VREPL_CRC32C_IMPL_H
#define VREPL_CRC32C_IMPL_H
#include <stddef.h>
#include <stdint.h>

/* Standard CRC-32C continuing from a previous finished value (0 to start). Thread-safe after
 * vrepl_crc32c_init(); safe to call without the GIL. */
uint32_t vrepl_crc32c(uint32_t crc, const void *data, size_t len);
/* The portable slicing-by-8 implementation, exposed so tests can compare both paths. */
uint32_t vrepl_crc32c_sw(uint32_t crc, const void *data, size_t len);
/* Builds tables and picks the implementation; idempotent. Returns the implementation name. */
const char *vrepl_crc32c_init(void);
/* Forces the software path (for tests and benchmarks); 1 = software only, 0 = best available. */
void vrepl_crc32c_force_software(int on);
const char *vrepl_crc32c_impl_name(void);

#endif
