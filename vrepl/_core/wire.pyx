# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Wire helpers for the hot frames: Forward / ForwardBatch bodies (docs/embedding.md §wire).

Owns: building a forward frame (outer record header + u64 prev_epoch + WAL records) in one
allocation, encoding records with per-record epochs, and splitting a received forward body
back into record epochs and payloads while validating everything a peer could get wrong.
The records inside the frame are byte-for-byte WAL records, so a slave appends them to its
WAL as they came. Does no I/O; raises FrameError (naming the reason) for bytes that are not
a valid forward body, never for anything else.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

from vrepl._core.crc32c cimport vrepl_crc32c, vrepl_crc32c_init
from vrepl._core.frame cimport (Header, parse_header, write_record, HEADER_SIZE, SIGNATURE,
                                 SCAN_OK, put_u32, put_u64, get_u64)
from vrepl._core.frame import REASONS

from vrepl.errors import FrameError

vrepl_crc32c_init()

FORWARD_PREFIX_BYTES = FORWARD_PREFIX_SIZE


def encode_forward_frame(int msg_type, uint64_t first_version, uint64_t epoch,
                         uint64_t prev_epoch, block):
    """A whole frame: header(msg_type, first_version, epoch) + u64 prev_epoch + `block`
    (encoded WAL records), built with one allocation and one copy of the block."""
    cdef Py_buffer view
    cdef uint8_t *out_p
    cdef Py_ssize_t body
    PyObject_GetBuffer(block, &view, PyBUF_SIMPLE)
    try:
        body = FORWARD_PREFIX_SIZE + view.len
        if body > 0xFFFFFFFF:
            raise ValueError("forward frame body longer than 4 GiB - 1")
        out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + body)
        out_p = <uint8_t *>PyBytes_AS_STRING(out)
        put_u64(out_p + HEADER_SIZE, prev_epoch)
        if view.len:
            memcpy(out_p + HEADER_SIZE + FORWARD_PREFIX_SIZE, view.buf, view.len)
        # Header fields; write_record would copy the payload again, so fill them here.
        put_u32(out_p, SIGNATURE)
        out_p[4] = <uint8_t>msg_type
        out_p[5] = 1
        out_p[6] = 0
        out_p[7] = 0
        put_u64(out_p + 8, first_version)
        put_u64(out_p + 16, epoch)
        put_u32(out_p + 24, <uint32_t>body)
        put_u32(out_p + 28, vrepl_crc32c(0, out_p + HEADER_SIZE, body))
        put_u32(out_p + 32, vrepl_crc32c(0, out_p, 32))
        return out
    finally:
        PyBuffer_Release(&view)


def encode_records(uint64_t first_version, record_epochs, payloads, int data_type=1):
    """WAL records for `payloads` at versions first_version.. with per-record epochs."""
    cdef Py_ssize_t n = len(payloads)
    cdef Py_ssize_t i, total = 0, pos = 0, acquired = 0
    cdef Py_buffer *views
    cdef uint8_t *out_p
    if len(record_epochs) != n:
        raise ValueError(f"{len(record_epochs)} epochs for {n} payloads")
    views = <Py_buffer *>malloc(max(n, 1) * sizeof(Py_buffer))
    if views == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            PyObject_GetBuffer(payloads[i], &views[i], PyBUF_SIMPLE)
            acquired += 1
            if views[i].len > 0xFFFFFFFF:
                raise ValueError(f"payload {i} longer than 4 GiB - 1")
            total += HEADER_SIZE + views[i].len
        out = PyBytes_FromStringAndSize(NULL, total)
        out_p = <uint8_t *>PyBytes_AS_STRING(out)
        for i in range(n):
            pos += write_record(out_p + pos, <uint8_t>data_type, 1, 0, first_version + i,
                                <uint64_t>record_epochs[i], <const uint8_t *>views[i].buf,
                                <uint32_t>views[i].len)
        return out
    finally:
        for i in range(acquired):
            PyBuffer_Release(&views[i])
        free(views)


def decode_forward_body(body, uint64_t first_version, uint32_t max_record_len):
    """Split a forward frame body into (prev_epoch, record_epochs, payloads, block).

    Checks: the u64 prefix is there; the rest is one or more whole, checksummed records of
    data types 1..15; versions run first_version, first_version + 1, ... without a gap;
    record epochs never go down. `block` is the records' bytes, ready for the WAL.
    FrameError names what is wrong.
    """
    cdef Py_buffer view
    cdef const uint8_t *base
    cdef const uint8_t *p
    cdef Py_ssize_t pos, n = 0, i, length
    cdef Header h
    cdef int status
    cdef uint64_t prev_epoch, expect, last_epoch = 0
    cdef object e = None, pl  # Python objects: the tuples take a reference to each
    cdef uint64_t e_val = 0
    if first_version == 0:
        raise FrameError("forward: version 0 (versions start at 1)")
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        base = <const uint8_t *>view.buf
        length = view.len
        if length < FORWARD_PREFIX_SIZE + HEADER_SIZE:
            raise FrameError(f"forward: body of {length} bytes holds no record")
        prev_epoch = get_u64(base)
        # Pass 1: validate and count.
        pos = FORWARD_PREFIX_SIZE
        expect = first_version
        while pos < length:
            if length - pos < HEADER_SIZE:
                raise FrameError("forward: trailing bytes after the last record", pos)
            p = base + pos
            status = parse_header(p, max_record_len, &h)
            if status != SCAN_OK:
                raise FrameError(f"forward: record {n}: {REASONS[status]}", pos)
            if length - pos - HEADER_SIZE < <Py_ssize_t>h.payload_len:
                raise FrameError(f"forward: record {n} is cut short", pos)
            if vrepl_crc32c(0, p + HEADER_SIZE, h.payload_len) != h.payload_crc:
                raise FrameError(f"forward: record {n}: {REASONS[7]}", pos)
            if h.msg_type < DATA_TYPE_MIN or h.msg_type > DATA_TYPE_MAX:
                raise FrameError(f"forward: record {n} has type {h.msg_type}, not a data type 1..15", pos)
            if h.version != expect:
                raise FrameError(f"forward: record {n} has version {h.version}, expected {expect}", pos)
            if h.epoch < last_epoch or h.epoch == 0:
                raise FrameError(f"forward: record {n} epoch {h.epoch} after epoch {last_epoch}", pos)
            last_epoch = h.epoch
            expect += 1
            n += 1
            pos += HEADER_SIZE + h.payload_len
        # Pass 2: build the tuples (the bytes were verified above).
        epochs = PyTuple_New(n)
        payloads = PyTuple_New(n)
        pos = FORWARD_PREFIX_SIZE
        for i in range(n):
            p = base + pos
            parse_header(p, max_record_len, &h)
            if e is None or h.epoch != e_val:
                # One int object per run of equal epochs (usually one per frame): cheaper,
                # and tuple.count() on the epochs then compares by identity.
                e = h.epoch
                e_val = h.epoch
            Py_INCREF(e)
            PyTuple_SET_ITEM(epochs, i, e)
            pl = PyBytes_FromStringAndSize(<const char *>p + HEADER_SIZE, h.payload_len)
            Py_INCREF(pl)
            PyTuple_SET_ITEM(payloads, i, pl)
            pos += HEADER_SIZE + h.payload_len
        block = PyBytes_FromStringAndSize(<const char *>base + FORWARD_PREFIX_SIZE,
                                          length - FORWARD_PREFIX_SIZE)
        return prev_epoch, epochs, payloads, block
    finally:
        PyBuffer_Release(&view)
