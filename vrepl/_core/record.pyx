# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Record codec: encode batches of WAL records into one buffer and scan buffers back.

Owns: the byte layout of a record (record.pxd, docs/wal-format.md) and its validation. The same
record is the WAL entry and the wire frame, so a slave can append a forwarded frame to its WAL
without re-encoding. Does no I/O and allocates no more than the configured maximum payload for
any single record: a header is trusted (checksum) before its length is used.
"""
import numpy as np

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
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

cdef uint8_t SIGNATURE_BYTES[4]
SIGNATURE_BYTES[:] = [0x56, 0x52, 0x57, 0x4C]  # b"VRWL"

# Flags defined so far; any other bit makes a header invalid (a newer writer, or corruption).
cdef uint16_t KNOWN_FLAGS = 0


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


cdef class ScanResult:
    """What scan() found: arrays with one entry per whole, valid record, and where it stopped.

    `end` is the offset just past the last good record; `status` is STATUS_OK when the scan
    consumed the whole range, otherwise why the bytes at `end` are not a record.
    """

    @property
    def ok(self):
        return self.status == SCAN_OK

    @property
    def last_version(self):
        return int(self.versions[self.count - 1]) if self.count else 0

    def describe(self):
        tail = "clean" if self.status == SCAN_OK else f"stopped at {self.end}: {self.reason}"
        return f"{self.count} records, end={self.end}, {tail}"

    def __repr__(self):
        return f"<ScanResult {self.describe()}>"


cdef struct Growable:
    uint64_t *versions
    uint64_t *epochs
    uint64_t *offsets
    uint32_t *lengths
    uint8_t *types
    Py_ssize_t count
    Py_ssize_t cap


cdef int grow(Growable *g) noexcept nogil:
    cdef Py_ssize_t cap = g.cap * 2 if g.cap else 1024
    cdef void *p
    p = realloc(g.versions, cap * sizeof(uint64_t))
    if p == NULL: return -1
    g.versions = <uint64_t *>p
    p = realloc(g.epochs, cap * sizeof(uint64_t))
    if p == NULL: return -1
    g.epochs = <uint64_t *>p
    p = realloc(g.offsets, cap * sizeof(uint64_t))
    if p == NULL: return -1
    g.offsets = <uint64_t *>p
    p = realloc(g.lengths, cap * sizeof(uint32_t))
    if p == NULL: return -1
    g.lengths = <uint32_t *>p
    p = realloc(g.types, cap * sizeof(uint8_t))
    if p == NULL: return -1
    g.types = <uint8_t *>p
    g.cap = cap
    return 0


cdef void release(Growable *g) noexcept nogil:
    free(g.versions); free(g.epochs); free(g.offsets); free(g.lengths); free(g.types)


cdef int scan_loop(const uint8_t *base, Py_ssize_t start, Py_ssize_t stop,
                   uint32_t max_payload_len, bint verify_payload, uint64_t expect_version,
                   bint contiguous, Growable *g, Py_ssize_t *end_out) noexcept nogil:
    cdef Py_ssize_t pos = start
    cdef Py_ssize_t i
    cdef Header h
    cdef int status = SCAN_OK
    while pos < stop:
        if stop - pos < HEADER_SIZE:
            status = SCAN_ZERO
            for i in range(pos, stop):
                if base[i] != 0:
                    status = SCAN_INCOMPLETE
                    break
            # A cut-short record still starts with the signature; other bytes are not ours.
            if status == SCAN_INCOMPLETE:
                for i in range(min(stop - pos, 4)):
                    if base[pos + i] != SIGNATURE_BYTES[i]:
                        status = SCAN_BAD_SIGNATURE
                        break
            break
        status = parse_header(base + pos, max_payload_len, &h)
        if status != SCAN_OK:
            break
        if stop - pos - HEADER_SIZE < <Py_ssize_t>h.payload_len:
            status = SCAN_INCOMPLETE
            break
        if verify_payload and vrepl_crc32c(0, base + pos + HEADER_SIZE, h.payload_len) != h.payload_crc:
            status = SCAN_BAD_PAYLOAD_CRC
            break
        if expect_version == 0 and contiguous:
            expect_version = h.version  # the first record sets where the run starts
        if expect_version:
            if h.version != expect_version:
                status = SCAN_VERSION_GAP
                break
            expect_version += 1
        if g.count == g.cap and grow(g) != 0:
            status = -1
            break
        g.versions[g.count] = h.version
        g.epochs[g.count] = h.epoch
        g.offsets[g.count] = <uint64_t>pos
        g.lengths[g.count] = h.payload_len
        g.types[g.count] = h.msg_type
        g.count += 1
        pos += HEADER_SIZE + h.payload_len
    end_out[0] = pos
    return status


cdef object copy_array(const void *src, Py_ssize_t n, object dtype):
    arr = np.empty(n, dtype=dtype)
    cdef unsigned char[::1] view
    if n:
        view = arr.view(np.uint8)
        memcpy(&view[0], src, n * arr.itemsize)
    return arr


cdef ScanResult scan_buffer(const uint8_t *base, Py_ssize_t start, Py_ssize_t stop,
                            uint32_t max_payload_len, bint verify_payload,
                            uint64_t expect_version, bint contiguous=False):
    cdef Growable g
    g.versions = NULL; g.epochs = NULL; g.offsets = NULL; g.lengths = NULL; g.types = NULL
    g.count = 0; g.cap = 0
    cdef Py_ssize_t end = start
    cdef int status
    if stop - start >= NOGIL_THRESHOLD_BYTES:
        with nogil:
            status = scan_loop(base, start, stop, max_payload_len, verify_payload,
                               expect_version, contiguous, &g, &end)
    else:
        status = scan_loop(base, start, stop, max_payload_len, verify_payload,
                           expect_version, contiguous, &g, &end)
    cdef ScanResult r = ScanResult.__new__(ScanResult)
    try:
        if status < 0:
            raise MemoryError("scan: out of memory for the record index")
        r.versions = copy_array(g.versions, g.count, np.uint64)
        r.epochs = copy_array(g.epochs, g.count, np.uint64)
        r.offsets = copy_array(g.offsets, g.count, np.uint64)
        r.lengths = copy_array(g.lengths, g.count, np.uint32)
        r.msg_types = copy_array(g.types, g.count, np.uint8)
    finally:
        release(&g)
    r.count = g.count
    r.end = end
    r.status = status
    r.reason = REASONS[status]
    return r


def scan(data, Py_ssize_t start=0, Py_ssize_t stop=-1,
         uint32_t max_payload_len=DEFAULT_MAX_PAYLOAD_BYTES, bint verify_payload=True,
         uint64_t expect_version=0, bint contiguous=False):
    """Scan data[start:stop] into records; never raises for bad bytes (see ScanResult.status).

    expect_version: if non-zero, the first record must carry it and each next one +1.
    contiguous: with expect_version 0, the first record's version sets the start and each
    next one must be +1 (a gap stops the scan with STATUS_VERSION_GAP).
    """
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if stop < 0 or stop > view.len:
            stop = view.len
        if start < 0 or start > stop:
            raise ValueError(f"scan: start {start} outside 0..{stop}")
        return scan_buffer(<const uint8_t *>view.buf, start, stop, max_payload_len,
                           verify_payload, expect_version, contiguous)
    finally:
        PyBuffer_Release(&view)


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
