# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Frame codec: one record, which is both the WAL entry and the wire frame.

Owns: the byte layout of a record (frame.pxd, docs/wal-format.md), its validation
(parse_header, header_invalid, decode_record), the encoders (one record, a batch, packed
payloads), and the scan statuses and their reasons. The same record is the WAL entry and the
wire frame, so a slave can append a forwarded frame to its WAL without re-encoding. Does no
I/O and allocates no more than the configured maximum payload for any single record: a
header is trusted (checksum) before its length is used. Must not: import numpy. A process
that only speaks the protocols (`vrepl ship`, a restore client) loads this module and not
numpy; the index of a scanned buffer of records, numpy arrays, is record.pyx's.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from vrepl._core.crc32c cimport vrepl_crc32c, vrepl_crc32c_init, NOGIL_THRESHOLD_BYTES

from vrepl.errors import FrameError

vrepl_crc32c_init()

HEADER_SIZE_BYTES = HEADER_SIZE
RECORD_SIGNATURE = SIGNATURE
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_LIMIT_BYTES = 0xFFFFFFFF

STATUS_OK = SCAN_OK
STATUS_INCOMPLETE = SCAN_INCOMPLETE
STATUS_ZERO = SCAN_ZERO
STATUS_BAD_SIGNATURE = SCAN_BAD_SIGNATURE
STATUS_BAD_HEADER_CRC = SCAN_BAD_HEADER_CRC
STATUS_BAD_FLAGS = SCAN_BAD_FLAGS
STATUS_TOO_LARGE = SCAN_TOO_LARGE
STATUS_BAD_PAYLOAD_CRC = SCAN_BAD_PAYLOAD_CRC
STATUS_VERSION_GAP = SCAN_VERSION_GAP

REASONS = {
    SCAN_OK: None,
    SCAN_INCOMPLETE: "incomplete record (ends before its header or payload does)",
    SCAN_ZERO: "zero-filled bytes where a record header should be",
    SCAN_BAD_SIGNATURE: "bad signature (not a vrepl record)",
    SCAN_BAD_HEADER_CRC: "header checksum mismatch",
    SCAN_BAD_FLAGS: "unknown header flags",
    SCAN_TOO_LARGE: "payload length above the maximum record size",
    SCAN_BAD_PAYLOAD_CRC: "payload checksum mismatch",
    SCAN_VERSION_GAP: "version does not follow the previous record's version",
}

# Flags defined so far; any other bit makes a header invalid (a newer writer, or corruption).
cdef uint16_t KNOWN_FLAGS = 0


cdef int parse_header(const uint8_t *p, uint32_t max_payload_len, Header *out) noexcept nogil:
    """Validate the HEADER_SIZE bytes at p; fill out and return SCAN_OK, or why not."""
    cdef int i
    cdef uint32_t sig = get_u32(p)
    if sig != SIGNATURE:
        for i in range(HEADER_SIZE):
            if p[i] != 0:
                return SCAN_BAD_SIGNATURE
        return SCAN_ZERO
    if vrepl_crc32c(0, p, 32) != get_u32(p + 32):
        return SCAN_BAD_HEADER_CRC
    out.msg_type = p[4]
    out.schema_version = p[5]
    out.flags = get_u16(p + 6)
    out.version = get_u64(p + 8)
    out.epoch = get_u64(p + 16)
    out.payload_len = get_u32(p + 24)
    out.payload_crc = get_u32(p + 28)
    if out.flags & ~KNOWN_FLAGS:
        return SCAN_BAD_FLAGS
    if out.payload_len > max_payload_len:
        return SCAN_TOO_LARGE
    return SCAN_OK


cdef Py_ssize_t write_record(uint8_t *out, uint8_t msg_type, uint8_t schema_version,
                             uint16_t flags, uint64_t version, uint64_t epoch,
                             const uint8_t *payload, uint32_t payload_len) noexcept nogil:
    put_u32(out, SIGNATURE)
    out[4] = msg_type
    out[5] = schema_version
    put_u16(out + 6, flags)
    put_u64(out + 8, version)
    put_u64(out + 16, epoch)
    put_u32(out + 24, payload_len)
    if payload_len:
        memcpy(out + HEADER_SIZE, payload, payload_len)
    put_u32(out + 28, vrepl_crc32c(0, out + HEADER_SIZE, payload_len))
    put_u32(out + 32, vrepl_crc32c(0, out, 32))
    return HEADER_SIZE + payload_len


cdef class Record:
    """One decoded record (a copy of its payload)."""

    def __init__(self, int msg_type, uint64_t version, uint64_t epoch, bytes payload,
                 int schema_version=1, int flags=0):
        self.msg_type = msg_type
        self.version = version
        self.epoch = epoch
        self.payload = payload
        self.schema_version = schema_version
        self.flags = flags

    def encode(self):
        return encode_record(self.msg_type, self.version, self.epoch, self.payload,
                             self.schema_version)

    def describe(self):
        return (f"record type={self.msg_type} v={self.version} epoch={self.epoch} "
                f"len={len(self.payload)}")

    def __repr__(self):
        return f"<Record {self.describe()}>"

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        cdef Record o = other
        return (self.msg_type == o.msg_type and self.version == o.version
                and self.epoch == o.epoch and self.payload == o.payload
                and self.schema_version == o.schema_version and self.flags == o.flags)

    def __hash__(self):
        return hash((self.msg_type, self.version, self.epoch, self.payload))


def header_invalid(data, Py_ssize_t offset=0,
                   uint32_t max_payload_len=DEFAULT_MAX_PAYLOAD_BYTES):
    """Why the header at data[offset:] is not a valid record header, or None if it is."""
    cdef Py_buffer view
    cdef Header h
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if offset < 0 or view.len - offset < HEADER_SIZE:
            return REASONS[SCAN_INCOMPLETE]
        return REASONS[parse_header(<const uint8_t *>view.buf + offset, max_payload_len, &h)]
    finally:
        PyBuffer_Release(&view)


def decode_record(data, Py_ssize_t offset=0,
                  uint32_t max_payload_len=DEFAULT_MAX_PAYLOAD_BYTES):
    """Decode and verify the one record at data[offset:]; FrameError says why it is not one."""
    cdef Py_buffer view
    cdef Header h
    cdef int status
    cdef const uint8_t *p
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if offset < 0 or view.len - offset < HEADER_SIZE:
            raise FrameError(REASONS[SCAN_INCOMPLETE], offset=offset)
        p = <const uint8_t *>view.buf + offset
        status = parse_header(p, max_payload_len, &h)
        if status == SCAN_OK and view.len - offset - HEADER_SIZE < <Py_ssize_t>h.payload_len:
            status = SCAN_INCOMPLETE
        if status == SCAN_OK and vrepl_crc32c(0, p + HEADER_SIZE, h.payload_len) != h.payload_crc:
            status = SCAN_BAD_PAYLOAD_CRC
        if status != SCAN_OK:
            raise FrameError(REASONS[status], offset=offset)
        return Record(h.msg_type, h.version, h.epoch,
                      PyBytes_FromStringAndSize(<const char *>p + HEADER_SIZE, h.payload_len),
                      h.schema_version, h.flags)
    finally:
        PyBuffer_Release(&view)


def encode_record(int msg_type, uint64_t version, uint64_t epoch, payload,
                  int schema_version=1):
    """One record as bytes."""
    cdef Py_buffer view
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        if view.len > MAX_PAYLOAD_LIMIT_BYTES:
            raise ValueError("payload longer than 4 GiB - 1")
        out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + view.len)
        write_record(<uint8_t *>PyBytes_AS_STRING(out), <uint8_t>msg_type,
                     <uint8_t>schema_version, 0, version, epoch,
                     <const uint8_t *>view.buf, <uint32_t>view.len)
        return out
    finally:
        PyBuffer_Release(&view)


def encode_batch(int msg_type, uint64_t first_version, uint64_t epoch, payloads,
                 int schema_version=1):
    """Records for a sequence of payloads, versions first_version, first_version+1, ..."""
    cdef Py_ssize_t n = len(payloads)
    cdef Py_ssize_t total = 0, i, pos = 0
    cdef Py_buffer *views = <Py_buffer *>malloc(max(n, 1) * sizeof(Py_buffer))
    cdef Py_ssize_t acquired = 0
    cdef uint8_t *out_p
    if views == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            PyObject_GetBuffer(payloads[i], &views[i], PyBUF_SIMPLE)
            acquired += 1
            if views[i].len > MAX_PAYLOAD_LIMIT_BYTES:
                raise ValueError(f"payload {i} longer than 4 GiB - 1")
            total += HEADER_SIZE + views[i].len
        out = PyBytes_FromStringAndSize(NULL, total)
        out_p = <uint8_t *>PyBytes_AS_STRING(out)
        if total >= NOGIL_THRESHOLD_BYTES:
            with nogil:
                for i in range(n):
                    pos += write_record(out_p + pos, <uint8_t>msg_type, <uint8_t>schema_version,
                                        0, first_version + i, epoch,
                                        <const uint8_t *>views[i].buf, <uint32_t>views[i].len)
        else:
            for i in range(n):
                pos += write_record(out_p + pos, <uint8_t>msg_type, <uint8_t>schema_version, 0,
                                    first_version + i, epoch, <const uint8_t *>views[i].buf,
                                    <uint32_t>views[i].len)
        return out
    finally:
        for i in range(acquired):
            PyBuffer_Release(&views[i])
        free(views)


def encode_packed(int msg_type, uint64_t first_version, uint64_t epoch, data,
                  const uint32_t[::1] lengths, int schema_version=1):
    """Records for payloads laid end to end in `data`, split by `lengths` (a uint32 array).

    The path with no Python object per record: the caller packs payloads once.
    """
    cdef Py_buffer view
    cdef Py_ssize_t n = lengths.shape[0]
    cdef Py_ssize_t i, pos = 0, src = 0, total_payload = 0
    cdef uint8_t *out_p
    for i in range(n):
        total_payload += lengths[i]
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if total_payload != view.len:
            raise ValueError(f"lengths add up to {total_payload} bytes, data has {view.len}")
        out = PyBytes_FromStringAndSize(NULL, n * HEADER_SIZE + total_payload)
        out_p = <uint8_t *>PyBytes_AS_STRING(out)
        with nogil:
            for i in range(n):
                pos += write_record(out_p + pos, <uint8_t>msg_type, <uint8_t>schema_version, 0,
                                    first_version + i, epoch,
                                    <const uint8_t *>view.buf + src, lengths[i])
                src += lengths[i]
        return out
    finally:
        PyBuffer_Release(&view)
