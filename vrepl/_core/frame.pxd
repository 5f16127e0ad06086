# Contract of the frame codec (frame.pyx): the WAL record, which is also vrepl's wire frame.
# Layout (little-endian, HEADER_SIZE = 36 bytes), see docs/wal-format.md:
#   0 u32 signature 'VRWL' | 4 u8 msg_type | 5 u8 schema_version | 6 u16 flags
#   8 u64 version | 16 u64 epoch | 24 u32 payload_len | 28 u32 payload_crc
#   32 u32 header_crc (CRC-32C of bytes 0..31)
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    HEADER_SIZE = 36
    SIGNATURE = 0x4C575256          # b"VRWL" read as a little-endian u32

# Why a header is not a record (0 = it is one). Kept in step with REASONS in frame.pyx.
cdef enum ScanStatus:
    SCAN_OK = 0
    SCAN_INCOMPLETE = 1       # the buffer ends inside a record: need more bytes / torn tail
    SCAN_ZERO = 2             # an all-zero header: preallocated or zero-filled tail
    SCAN_BAD_SIGNATURE = 3
    SCAN_BAD_HEADER_CRC = 4
    SCAN_BAD_FLAGS = 5
    SCAN_TOO_LARGE = 6        # payload length above the configured maximum
    SCAN_BAD_PAYLOAD_CRC = 7
    SCAN_VERSION_GAP = 8      # versions not strictly increasing by one

cdef struct Header:
    uint8_t msg_type
    uint8_t schema_version
    uint16_t flags
    uint64_t version
    uint64_t epoch
    uint32_t payload_len
    uint32_t payload_crc

# Little-endian field access, shared by every codec that lays out frames (frame.pyx,
# wire.pyx): inline, so each caller compiles them in.
cdef inline void put_u16(uint8_t *p, uint16_t v) noexcept nogil:
    p[0] = v & 0xff
    p[1] = v >> 8

cdef inline void put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = v & 0xff
    p[1] = (v >> 8) & 0xff
    p[2] = (v >> 16) & 0xff
    p[3] = v >> 24

cdef inline void put_u64(uint8_t *p, uint64_t v) noexcept nogil:
    put_u32(p, <uint32_t>(v & 0xffffffffu))
    put_u32(p + 4, <uint32_t>(v >> 32))

cdef inline uint16_t get_u16(const uint8_t *p) noexcept nogil:
    return p[0] | (<uint16_t>p[1] << 8)

cdef inline uint32_t get_u32(const uint8_t *p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)

cdef inline uint64_t get_u64(const uint8_t *p) noexcept nogil:
    return get_u32(p) | (<uint64_t>get_u32(p + 4) << 32)

cdef int parse_header(const uint8_t *p, uint32_t max_payload_len, Header *out) noexcept nogil
cdef Py_ssize_t write_record(uint8_t *out, uint8_t msg_type, uint8_t schema_version,
                             uint16_t flags, uint64_t version, uint64_t epoch,
                             const uint8_t *payload, uint32_t payload_len) noexcept nogil

cdef class Record:
    cdef readonly int msg_type
    cdef readonly int schema_version
    cdef readonly int flags
    cdef readonly uint64_t version
    cdef readonly uint64_t epoch
    cdef readonly bytes payload
