# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Record scanning: the index of a buffer of records (ScanResult, numpy arrays), for the WAL.

Owns: scan() and scan_buffer(), which walk a buffer of records (frame.pxd layout) and return
one array entry per whole, valid record and why the walk stopped. Re-exports the frame codec
(vrepl._core.frame: Record, the encoders and decoders, the statuses) so that the WAL and the
restore code, which scan, find every record function in this one module. Does no I/O.
Must not: be imported by a module that only frames records on a connection (the protocols,
`vrepl ship`): numpy comes with it.
"""
import numpy as np

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport realloc, free
from libc.string cimport memcpy

from vrepl._core.crc32c cimport vrepl_crc32c, vrepl_crc32c_init, NOGIL_THRESHOLD_BYTES
from vrepl._core.frame cimport (Header, parse_header, HEADER_SIZE, SIGNATURE, SCAN_OK, SCAN_INCOMPLETE,
                                 SCAN_ZERO, SCAN_BAD_SIGNATURE, SCAN_BAD_PAYLOAD_CRC,
                                 SCAN_VERSION_GAP)
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE

from vrepl._core.frame import (DEFAULT_MAX_PAYLOAD_BYTES, HEADER_SIZE_BYTES,
                               MAX_PAYLOAD_LIMIT_BYTES, REASONS, RECORD_SIGNATURE,
                               STATUS_BAD_FLAGS, STATUS_BAD_HEADER_CRC, STATUS_BAD_PAYLOAD_CRC,
                               STATUS_BAD_SIGNATURE, STATUS_INCOMPLETE, STATUS_OK,
                               STATUS_TOO_LARGE, STATUS_VERSION_GAP, STATUS_ZERO, Record,
                               decode_record, encode_batch, encode_packed, encode_record,
                               header_invalid)

vrepl_crc32c_init()


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
                    # byte i of the little-endian signature b"VRWL" (frame.pxd)
                    if base[pos + i] != <uint8_t>((SIGNATURE >> (8 * i)) & 0xff):
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
