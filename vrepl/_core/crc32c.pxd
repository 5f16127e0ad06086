# Contract of the CRC-32C C implementation (csrc/crc32c_impl.c), for cimport by other _core modules.
from libc.stdint cimport uint32_t

cdef extern from "crc32c_impl.h":
    uint32_t vrepl_crc32c(uint32_t crc, const void *data, size_t length) nogil
    uint32_t vrepl_crc32c_sw(uint32_t crc, const void *data, size_t length) nogil
    const char *vrepl_crc32c_init()
    void vrepl_crc32c_force_software(int on)
    const char *vrepl_crc32c_impl_name()

# Buffers at least this long are checksummed with the GIL released.
cdef enum:
    NOGIL_THRESHOLD_BYTES = 65536
